//! The Python analysis example (`simulations/analysis/example.py`, pandas + matplotlib) on a
//! small output this test generates with the real binary. The interpreter comes from
//! `GRIDLEASE_PY_ANALYSIS` (a python with the pinned packages of
//! `simulations/analysis/requirements.txt`; CI builds one, see `.ci/run`). Without one the test
//! is skipped -- unless `GRIDLEASE_REQUIRE_PY_ANALYSIS=1`, when it fails.

#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::print_stderr)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use gridlease_sim::output::Table;

/// The interpreter to use, or why there is none.
fn interpreter() -> Result<PathBuf, String> {
    let Some(py) = std::env::var_os("GRIDLEASE_PY_ANALYSIS") else {
        return Err("GRIDLEASE_PY_ANALYSIS is not set".into());
    };
    let py = PathBuf::from(py);
    let check = Command::new(&py)
        .args(["-c", "import pandas, matplotlib"])
        .output();
    match check {
        Ok(o) if o.status.success() => Ok(py),
        Ok(o) => Err(format!(
            "{} cannot import pandas and matplotlib: {}",
            py.display(),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Err(format!("cannot run {}: {e}", py.display())),
    }
}

/// The interpreter, or `None` (the test skips) when there is none and
/// `GRIDLEASE_REQUIRE_PY_ANALYSIS=1` is not set (then it fails).
fn interpreter_or_skip() -> Option<PathBuf> {
    let required = std::env::var("GRIDLEASE_REQUIRE_PY_ANALYSIS").is_ok_and(|v| v == "1");
    match interpreter() {
        Ok(py) => Some(py),
        Err(why) if required => {
            panic!("GRIDLEASE_REQUIRE_PY_ANALYSIS=1 but no usable interpreter: {why}")
        }
        Err(why) => {
            eprintln!("skipped (set GRIDLEASE_REQUIRE_PY_ANALYSIS=1 to fail instead): {why}");
            None
        }
    }
}

/// The value in column `col` (0-based, after the row label) of the row labelled `label` in
/// one of the script's printed tables.
fn printed(stdout: &str, label: &str, col: usize) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(label))
        .unwrap_or_else(|| panic!("no row {label:?} in:\n{stdout}"));
    line.split_whitespace()
        .nth(col + 1)
        .unwrap()
        .parse()
        .unwrap()
}

fn sum(t: &Table, col: &str) -> f64 {
    let c = t.col(col).unwrap();
    t.rows.iter().map(|r| r[c].parse::<f64>().unwrap()).sum()
}

/// Runs the example on `out` with `extra` arguments; its stdout (asserted to succeed).
fn analyse(py: &Path, out: &Path, extra: &[&str]) -> String {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let plot = out.join("check.png");
    let o = Command::new(py)
        .arg(manifest_dir.join("analysis/example.py"))
        .arg(out)
        .arg("--plot")
        .arg(&plot)
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "example.py {extra:?} failed: {stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

#[test]
fn the_analysis_example_reads_a_small_output_and_writes_a_plot_and_a_table() {
    let Some(py) = interpreter_or_skip() else {
        return;
    };
    // A small run: the no-show market for 6 hours, 2 replications, with a trace.
    let tmp = tempfile::tempdir().unwrap();
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(manifest_dir.join("scenarios/no-show.toml")).unwrap();
    assert!(text.contains("\ndays = 2.0\n"));
    let scenario = tmp.path().join("small.toml");
    std::fs::write(&scenario, text.replace("\ndays = 2.0\n", "\ndays = 0.25\n")).unwrap();
    let out = tmp.path().join("out");
    let o = common::run(&[
        "-q",
        "run",
        scenario.to_str().unwrap(),
        "--reps",
        "2",
        "--seed",
        "1",
        "--no-plots",
        "--trace",
        "--parquet",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    // The same analysis from the Parquet copies (pyarrow) prints the same tables.
    let from_csv = analyse(&py, &out, &[]);
    let from_parquet = analyse(&py, &out, &["--parquet"]);
    assert!(
        from_parquet.contains("read Parquet (pyarrow) tables"),
        "{from_parquet}"
    );
    let tables = |s: &str| s.lines().skip(1).collect::<Vec<_>>().join("\n");
    assert_eq!(tables(&from_csv), tables(&from_parquet));
    let plot = out.join("figure.png");
    let o = Command::new(&py)
        .arg(manifest_dir.join("analysis/example.py"))
        .arg(&out)
        .arg("--plot")
        .arg(&plot)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "example.py failed");
    // The printed tables hold the run's numbers.
    let runs = Table::read(&out.join("runs.csv")).unwrap();
    for pop in ["honest", "attacker"] {
        assert_eq!(
            printed(&stdout, pop, 0),
            sum(&runs, &format!("{pop}_leases"))
        );
        assert_eq!(
            printed(&stdout, pop, 1),
            sum(&runs, &format!("{pop}_failed_leases"))
        );
    }
    assert_eq!(printed(&stdout, "no_shows", 0), sum(&runs, "no_shows"));
    assert_eq!(printed(&stdout, "lease_start", 0), sum(&runs, "leases"));
    assert!(printed(&stdout, "no_shows", 0) > 0.0);
    // The figure is a real PNG with something drawn in it.
    let png = std::fs::read(&plot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(png.len() > 20_000, "{} bytes", png.len());
}

/// A Sobol design (`gridlease-sim design sobol`) swept in two shards and merged is
/// byte-identical to the unsharded sweep, and `analysis/sensitivity.py` computes SALib's Sobol
/// indices from it: the renter arrival rate, which drives utilization, carries most of its
/// variance. A Morris design of the same keys ranks them the same way.
#[test]
fn a_sobol_design_swept_in_shards_gives_salib_indices() {
    let Some(py) = interpreter_or_skip() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scenario = manifest_dir.join("scenarios/baseline.toml");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let mut indices = Vec::new();
    for (method, n) in [("sobol", "16"), ("morris", "10")] {
        let points = dir.join(format!("{method}.csv"));
        let o = common::run(&[
            "-q",
            "design",
            method,
            "--param",
            "renter_rate=0.3..3.0",
            "--param",
            "providers.home-4090.count=5..60",
            "--n",
            n,
            "--out",
            &s(&points),
        ]);
        assert!(o.status.success());
        let sweep = |out: &Path, shard: Option<&str>| {
            let mut args = vec![
                "-q".to_string(),
                "sweep".into(),
                s(&scenario),
                "--points".into(),
                s(&points),
                "--reps".into(),
                "1".into(),
                "--no-plots".into(),
                "--out".into(),
                s(out),
            ];
            if let Some(sh) = shard {
                args.extend(["--shard".into(), sh.into()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            assert!(common::run(&args).status.success());
        };
        let whole = dir.join(format!("{method}-whole"));
        sweep(&whole, None);
        if method == "sobol" {
            // Sharded and merged like a grid: the same tables, byte for byte.
            let (s0, s1, merged) = (dir.join("s0"), dir.join("s1"), dir.join("merged"));
            sweep(&s0, Some("0/2"));
            sweep(&s1, Some("1/2"));
            let o = common::run(&[
                "-q",
                "merge",
                "--no-plots",
                "--out",
                &s(&merged),
                &s(&s0),
                &s(&s1),
            ]);
            assert!(o.status.success());
            for t in ["runs.csv", "summary.csv", "buckets.csv"] {
                assert_eq!(
                    std::fs::read(whole.join(t)).unwrap(),
                    std::fs::read(merged.join(t)).unwrap(),
                    "{t}"
                );
            }
        }
        let o = Command::new(&py)
            .arg(manifest_dir.join("analysis/sensitivity.py"))
            .arg(&points)
            .arg(&whole)
            .arg("--json")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        println!("{stdout}{}", String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "sensitivity.py {method} failed");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["method"], method);
        indices.push(v);
    }
    let (sob, mor) = (&indices[0]["indices"], &indices[1]["indices"]);
    let st = |k: &str| sob[k]["ST"].as_f64().unwrap();
    assert_eq!(indices[0]["points"], 16 * 4);
    assert!(st("renter_rate") > 0.5, "{sob}");
    assert!(st("renter_rate") > st("providers.home-4090.count"), "{sob}");
    assert!(
        sob["renter_rate"]["S1"].as_f64().unwrap().is_finite(),
        "{sob}"
    );
    let mu = |k: &str| mor[k]["mu_star"].as_f64().unwrap();
    assert!(mu("renter_rate") > mu("providers.home-4090.count"), "{mor}");
    assert!(mu("providers.home-4090.count") >= 0.0, "{mor}");
}
