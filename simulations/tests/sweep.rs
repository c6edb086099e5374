//! `gridlease-sim sweep` through the real binary: one provider group addressed by name,
//! fields inside inline tables and whole inline tables as values, refusals of empty and
//! malformed sweeps, and byte-identical outputs across thread counts.

// Helpers outside #[test] fns: a panic here is still a test failure with a location.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod common;

use common::run;

use std::path::{Path, PathBuf};

/// Two provider groups: honest (4) and usage-inflating attackers (2, no whitewashing).
const TWO_GROUPS: &str = r#"
name = "two-groups"
days = 0.1
[[provider]]
name = "honest"
count = 4
pricing = { strategy = "fixed", price = "0.40" }
[[provider]]
name = "inflaters"
count = 2
cost_floor = "0.01"
pricing = { strategy = "fixed", price = "0.30" }
attack = "usage_inflation"
[[renter]]
name = "renters"
count = 40
jobs_per_day = 6.0
"#;

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Self {
        Self(tempfile::tempdir().unwrap())
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
    fn file(&self, name: &str, text: &str) -> String {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    }
}

/// Runs and returns `runs.csv` as rows of cells (header first).
fn sweep(scenario: &str, params: &[&str], out: &Path, extra: &[&str]) -> Vec<Vec<String>> {
    let mut args = vec!["-q", "sweep", scenario];
    for p in params {
        args.extend(["--param", p]);
    }
    args.extend([
        "--reps",
        "2",
        "--seed",
        "4",
        "--no-plots",
        "--out",
        out.to_str().unwrap(),
    ]);
    args.extend(extra);
    let o = run(&args);
    assert!(o.status.success());
    rows(out)
}

fn rows(out: &Path) -> Vec<Vec<String>> {
    let mut r = csv::Reader::from_path(out.join("runs.csv")).unwrap();
    let mut v = vec![r.headers().unwrap().iter().map(str::to_string).collect()];
    for rec in r.records() {
        v.push(rec.unwrap().iter().map(str::to_string).collect());
    }
    v
}

fn cell(rows: &[Vec<String>], row: usize, col: &str) -> String {
    let c = rows[0].iter().position(|h| h == col).unwrap();
    rows[row + 1][c].clone()
}

/// A row's metrics: every cell after `seed`.
fn metrics(rows: &[Vec<String>], row: usize) -> Vec<String> {
    let c = rows[0].iter().position(|h| h == "seed").unwrap();
    rows[row + 1][c + 1..].to_vec()
}

#[test]
fn a_group_addressed_by_name_changes_only_that_group() {
    let d = Dir::new();
    let base = d.file("base.toml", TWO_GROUPS);
    let s = sweep(
        &base,
        &["providers.inflaters.count=1,3"],
        &d.path("named"),
        &[],
    );
    // Rows: (point 0, rep 0), (0, 1), (1, 0), (1, 1). The attackers are the named group.
    assert_eq!(cell(&s, 0, "providers.inflaters.count"), "1");
    assert_eq!(cell(&s, 0, "attacker_identities"), "1");
    assert_eq!(cell(&s, 2, "attacker_identities"), "3");
    // Point 1 is exactly the file with that one group edited: same metrics as `run` of it.
    let edited = d.file(
        "edited.toml",
        &TWO_GROUPS.replace("count = 2\ncost_floor", "count = 3\ncost_floor"),
    );
    let o = run(&[
        "-q",
        "run",
        &edited,
        "--reps",
        "2",
        "--seed",
        "4",
        "--no-plots",
        "--out",
        d.path("edited").to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let e = rows(&d.path("edited"));
    assert_eq!(metrics(&s, 2), metrics(&e, 0));
    assert_eq!(metrics(&s, 3), metrics(&e, 1));
    // `providers=3` sets every group (the honest one too): not the same market.
    let all = sweep(&base, &["providers=3"], &d.path("all"), &[]);
    assert_eq!(cell(&all, 0, "attacker_identities"), "3");
    assert_ne!(metrics(&all, 0), metrics(&e, 0));
    // `-` and `_` in group names are interchangeable, and `provider.` = `providers.`.
    let dashed = d.file(
        "dashed.toml",
        &TWO_GROUPS.replace("name = \"inflaters\"", "name = \"in-flaters\""),
    );
    let s2 = sweep(
        &dashed,
        &["provider.in_flaters.count=1,3"],
        &d.path("dashed"),
        &[],
    );
    assert_eq!(metrics(&s2, 2), metrics(&s, 2));
}

#[test]
fn fields_inside_inline_tables_and_whole_tables_are_swept() {
    let d = Dir::new();
    let base = d.file("base.toml", TWO_GROUPS);
    let field = sweep(
        &base,
        &[r#"provider.honest.pricing.price="0.25","0.35""#],
        &d.path("field"),
        &[],
    );
    let table = sweep(
        &base,
        &[
            r#"provider.honest.pricing={ strategy = "fixed", price = "0.25" },{ strategy = "fixed", price = "0.35" }"#,
        ],
        &d.path("table"),
        &[],
    );
    for (s, row, price) in [
        (&field, 0, "0.250000"),
        (&field, 2, "0.350000"),
        (&table, 0, "0.250000"),
        (&table, 2, "0.350000"),
    ] {
        assert_eq!(cell(s, row, "honest_price_rtx4090"), price);
        // The other group keeps its own price.
        assert_eq!(cell(s, row, "attacker_price_rtx4090"), "0.300000");
    }
    for row in 0..4 {
        assert_eq!(metrics(&field, row), metrics(&table, row));
    }
    // The whole table is one value (one column cell), not split at its commas.
    assert_eq!(
        cell(&table, 0, "provider.honest.pricing"),
        r#"{ strategy = "fixed", price = "0.25" }"#
    );
    // A strategy change through a whole table.
    let zi = sweep(
        &base,
        &[r#"provider.honest.pricing={ strategy = "zero_intelligence", ceiling = "1.00" }"#],
        &d.path("zi"),
        &[],
    );
    let p: f64 = cell(&zi, 0, "honest_price_rtx4090").parse().unwrap();
    assert!(p > 0.10 && p < 1.00, "zero-intelligence price {p}");
}

#[test]
fn empty_and_malformed_sweeps_are_refused_with_one_clear_error() {
    let d = Dir::new();
    let base = d.file("base.toml", TWO_GROUPS);
    let out = d.path("x");
    for (param, needle) in [
        ("providers=", "empty value"),
        ("providers=1,,2", "empty value"),
        ("providers= , ", "empty value"),
        ("=1", "needs key=v1,v2"),
        ("providers=2,3,2", "value 2 given twice"),
        (
            "providers.nosuch.count=3",
            "no group named \"nosuch\" and no field \"nosuch\" (groups: honest, inflaters)",
        ),
        ("provider.7.count=3", "no element 7"),
        (
            "provider.honest.pricing.ceiling=1",
            "provider.honest.pricing has no field \"ceiling\"",
        ),
        (
            "provider.honest.pricing={ strategy = \"fixed\"",
            "unbalanced",
        ),
        (
            "provider.honest.pricing.strategy=\"undercut\"",
            "sweep the whole table",
        ),
        ("provider.honest.gpus=0", "gpus > 0"),
    ] {
        let o = run(&[
            "sweep",
            &base,
            "--param",
            param,
            "--out",
            out.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{param}");
        assert_eq!(err.matches("error:").count(), 1, "{param}: {err}");
        assert!(err.contains(needle), "{param}: {err}");
        assert!(!out.join("manifest.json").exists(), "{param}");
    }
}

#[test]
fn outputs_are_byte_identical_across_thread_counts() {
    let d = Dir::new();
    let base = d.file("base.toml", TWO_GROUPS);
    let params = ["renter_rate=3,6", "providers.honest.count=2,4"];
    sweep(&base, &params, &d.path("t1"), &["--threads", "1"]);
    sweep(&base, &params, &d.path("t3"), &["--threads", "3"]);
    for f in ["runs.csv", "buckets.csv", "waits.csv", "summary.csv"] {
        let a = std::fs::read(d.path("t1").join(f)).unwrap();
        let b = std::fs::read(d.path("t3").join(f)).unwrap();
        assert!(!a.is_empty());
        assert_eq!(a, b, "{f} differs between --threads 1 and 3");
    }
}

/// The network reputation's sweep (both modes, self-dealing keys) is byte-identical at any
/// thread count too, and every point carries the network columns.
#[test]
fn network_reputation_outputs_are_byte_identical_across_thread_counts() {
    let d = Dir::new();
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/sybil.toml");
    let base = base.to_str().unwrap();
    let params = [
        "days=0.3",
        "provider.sybils.self_dealing_keys=0,50",
        "reputation.mode=local,network",
    ];
    let rows = sweep(base, &params, &d.path("t1"), &["--threads", "1"]);
    sweep(base, &params, &d.path("t2"), &["--threads", "2"]);
    assert_eq!(rows.len(), 1 + 4 * 2);
    assert!(rows[0].iter().any(|c| c == "attacker_score"));
    for f in [
        "runs.csv",
        "buckets.csv",
        "waits.csv",
        "summary.csv",
        "providers.csv",
    ] {
        let a = std::fs::read(d.path("t1").join(f)).unwrap();
        let b = std::fs::read(d.path("t2").join(f)).unwrap();
        assert!(!a.is_empty());
        assert_eq!(a, b, "{f} differs between --threads 1 and 2");
    }
}

/// `sweep --points FILE` runs a points file's rows in order, each row's values applied like a
/// grid point's (the same runs as the matching `--param` sweep), and refuses a file with a key
/// that addresses nothing, a row without a value, or `--param` beside it.
#[test]
fn a_points_file_runs_its_rows_in_order_and_a_bad_one_is_refused() {
    let d = Dir::new();
    let sc = d.file("two.toml", TWO_GROUPS);
    let pts = d.file(
        "points.csv",
        "providers.honest.count,renter_rate\n6,1.5\n2,0.5\n",
    );
    let out = d.path("pts");
    let r = sweep(&sc, &[], &out, &["--points", &pts]);
    assert_eq!(cell(&r, 0, "point"), "0");
    assert_eq!(cell(&r, 0, "providers.honest.count"), "6");
    assert_eq!(cell(&r, 2, "providers.honest.count"), "2");
    assert_eq!(cell(&r, 2, "renter_rate"), "0.5");
    // The same point as a one-value grid gives the same runs.
    let grid = sweep(
        &sc,
        &["providers.honest.count=2", "renter_rate=0.5"],
        &d.path("grid"),
        &[],
    );
    assert_eq!(metrics(&r, 2), metrics(&grid, 0));
    assert_eq!(metrics(&r, 3), metrics(&grid, 1));
    for (text, says) in [
        ("providers.nobody.count\n3\n", "nobody"),
        (
            "providers.honest.count,renter_rate\n6,\n",
            "line 2: no value for renter_rate",
        ),
        ("providers.honest.count\n", "no points"),
    ] {
        let bad = d.file("bad.csv", text);
        let o = run(&[
            "-q",
            "sweep",
            &sc,
            "--points",
            &bad,
            "--out",
            d.path("bad").to_str().unwrap(),
        ]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{says:?} in {err}");
    }
    let o = run(&[
        "-q",
        "sweep",
        &sc,
        "--points",
        &pts,
        "--param",
        "renter_rate=1",
    ]);
    assert!(!o.status.success());
}
