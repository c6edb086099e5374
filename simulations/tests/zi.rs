//! `gridlease-sim zi` through the real binary: timed periods beside periods in shouts, price
//! convergence (RMSD, Smith's alpha) in every table, the transaction-index table, the two Gode &
//! Sunder figures (price paths with the equilibrium band; efficiency per market with
//! intervals), several markets in one run, results independent of `--threads`, and one clear
//! error for bad input.
//!
//! Needs a TrueType font, as `tests/plots.rs` does.

// Helpers outside #[test] fns: a panic here is still a test failure with a location.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod common;

use std::path::{Path, PathBuf};

fn scenario(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"))
        .display()
        .to_string()
}

fn ok(args: &[&str]) -> String {
    let out = common::run(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !stderr.contains("plots skipped"),
        "no TrueType font found: install fonts-dejavu-core or set GRIDLEASE_SIM_FONT"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text elements of an SVG.
fn texts(svg: &Path) -> Vec<String> {
    let svg = std::fs::read_to_string(svg).unwrap();
    let mut out = Vec::new();
    let mut rest = svg.as_str();
    while let Some(start) = rest.find("<text") {
        let after = &rest[start..];
        let open_end = after.find('>').unwrap();
        let close = after.find("</text>").unwrap();
        out.push(after[open_end + 1..close].trim().replace("&amp;", "&"));
        rest = &after[close..];
    }
    out
}

fn csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
    let mut r = csv::Reader::from_path(path).unwrap();
    let header = r.headers().unwrap().iter().map(String::from).collect();
    let rows = r
        .records()
        .map(|x| x.unwrap().iter().map(String::from).collect())
        .collect();
    (header, rows)
}

struct Dir(PathBuf);

impl Dir {
    fn new() -> Self {
        let d = std::env::temp_dir().join(format!(
            "gridlease-sim-zi-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        Self(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn two_markets_with_timed_periods_give_convergence_tables_and_both_figures() {
    let d = Dir::new();
    let out = d.0.join("o");
    let (m1, m3) = (scenario("gs-market1"), scenario("gs-market3"));
    let o = out.display().to_string();
    let common_args = [
        "zi",
        "--scenario",
        &m1,
        "--scenario",
        &m3,
        "--reps",
        "6",
        "--periods",
        "3",
        "--shouts",
        "300",
        "--seconds",
        "20",
        "--shout-rate",
        "2",
    ];
    let mut args = common_args.to_vec();
    args.extend(["--out", &o, "--threads", "1"]);
    let stdout = ok(&args);
    // Every cell's line carries the convergence metrics, timed cells named by their seconds.
    for line in [
        "gs-market1 ZI-C 300 shouts:",
        "gs-market1 ZI-C 20 s:",
        "gs-market3 ZI-U 20 s:",
    ] {
        let l = stdout.lines().find(|l| l.starts_with(line)).unwrap();
        assert!(l.contains("price RMSD") && l.contains("alpha"), "{l}");
    }
    // One directory per market, and the comparison at the top.
    for m in ["gs-market1", "gs-market3"] {
        let dir = out.join(m);
        for f in [
            "periods.csv",
            "replications.csv",
            "summary.csv",
            "transactions.csv",
            "prices.png",
            "prices.svg",
            "efficiency.png",
            "manifest.json",
        ] {
            assert!(dir.join(f).is_file(), "{m}/{f} missing");
        }
        let (h, rows) = csv(&dir.join("periods.csv"));
        for c in ["length", "unit", "price_rmsd", "alpha", "shouts"] {
            assert!(h.iter().any(|x| x == c), "periods.csv lacks {c}: {h:?}");
        }
        let unit = h.iter().position(|x| x == "unit").unwrap();
        let shouts = h.iter().position(|x| x == "shouts").unwrap();
        // 2 treatments x 2 lengths x 6 replications x 3 periods; no period in shouts makes more.
        assert_eq!(rows.len(), 2 * 2 * 6 * 3);
        assert!(rows.iter().any(|r| r[unit] == "seconds"));
        assert!(
            rows.iter()
                .filter(|r| r[unit] == "shouts")
                .all(|r| r[shouts].parse::<u32>().unwrap() <= 300)
        );
        // alpha = 100 x RMSD / the equilibrium price, and never below 0.
        let (h, rows) = csv(&dir.join("summary.csv"));
        let (metric, mean) = (
            h.iter().position(|x| x == "metric").unwrap(),
            h.iter().position(|x| x == "mean").unwrap(),
        );
        let alphas: Vec<f64> = rows
            .iter()
            .filter(|r| r[metric] == "alpha")
            .map(|r| r[mean].parse().unwrap())
            .collect();
        assert!(!alphas.is_empty() && alphas.iter().all(|&a| a >= 0.0));
        let (h, rows) = csv(&dir.join("transactions.csv"));
        let first = h.iter().position(|x| x == "transaction").unwrap();
        let eff = h.iter().position(|x| x == "efficiency_after").unwrap();
        assert!(rows.iter().any(|r| r[first] == "1"));
        assert!(rows.iter().all(|r| r[eff].parse::<f64>().unwrap() <= 1.0));
        // The price figure: a panel per (treatment, length), the equilibrium in the title.
        let t = texts(&dir.join("prices.svg"));
        assert!(
            t.iter().any(|x| x.contains("grey: equilibrium price")),
            "{t:?}"
        );
        for caption in ["ZI-C, periods of 300 shouts", "ZI-U, periods of 20 s"] {
            assert!(
                t.iter().any(|x| x.starts_with(caption)),
                "{caption} not in {t:?}"
            );
        }
    }
    let t = texts(&out.join("efficiency.svg"));
    for x in [
        "gs-market1",
        "gs-market3",
        "ZI-C, 300 shouts",
        "ZI-C, 20 s",
        "ZI-U, 300 shouts",
        "ZI-U, 20 s",
        "market",
    ] {
        assert!(t.iter().any(|s| s == x), "{x} not in {t:?}");
    }
    let (_, rows) = csv(&out.join("markets.csv"));
    // 2 markets x 2 treatments x 2 lengths x 5 metrics.
    assert_eq!(rows.len(), 2 * 2 * 2 * 5);

    // The tables do not depend on the thread count.
    let out2 = d.0.join("o2");
    let o2 = out2.display().to_string();
    let mut args = common_args.to_vec();
    args.extend(["--out", &o2, "--threads", "2", "--no-plots"]);
    ok(&args);
    for f in ["periods.csv", "summary.csv", "transactions.csv"] {
        assert_eq!(
            std::fs::read(out.join("gs-market3").join(f)).unwrap(),
            std::fs::read(out2.join("gs-market3").join(f)).unwrap(),
            "{f} differs between --threads 1 and 2"
        );
    }
    assert!(!out2.join("efficiency.png").exists());
}

#[test]
fn bad_input_gets_one_clear_error_and_writes_nothing() {
    let d = Dir::new();
    let m1 = scenario("gs-market1");
    let o = d.0.join("o").display().to_string();
    for (args, needle) in [
        (
            vec!["zi", "--scenario", &m1, "--scenario", &m1, "--out", &o],
            "two experiments are named \"gs-market1\"",
        ),
        (
            vec![
                "zi",
                "--scenario",
                &m1,
                "--shouts",
                "0",
                "--seconds",
                "0",
                "--out",
                &o,
            ],
            "at least one period length",
        ),
        (
            vec!["zi", "--scenario", &m1, "--shout-rate=-1", "--out", &o],
            "shout_rate must be a positive number",
        ),
        (
            vec![
                "zi",
                "--scenario",
                &m1,
                "--seconds",
                "100000000",
                "--out",
                &o,
            ],
            "expected shouts a period",
        ),
    ] {
        let out = common::run(&args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{needle} not in {err}");
        assert_eq!(err.matches("error:").count(), 1, "{err}");
        assert!(!d.0.join("o").exists());
    }
}

/// Your own trader type runs through the whole pipeline from the public API: registered by
/// name, it is run, tabled, summarised and drawn like the built-in ones; without it the
/// experiment is refused before anything runs, and the binary (built-in types only) says which
/// type is missing.
#[test]
fn a_custom_trader_type_runs_through_the_pipeline() {
    use gridlease_sim::zi::experiment::{self, Experiment, ExperimentError, Strategies};
    use gridlease_sim::zi::{Length, Side, Strategy};

    /// Shouts its own limit: a buyer its value, a seller its cost.
    struct Truthful;
    impl Strategy for Truthful {
        fn shout(&self, _: Side, limit: u64, _: u64, _: u64, _: &mut dyn rand::RngCore) -> u64 {
            limit
        }
    }
    let mut text = std::fs::read_to_string(scenario("gs-market1")).unwrap();
    text.push_str(
        "\n[[treatment]]\nname = \"truthful\"\nbuyers = \"truthful\"\nsellers = \"truthful\"\n",
    );
    let mut e = Experiment::from_toml(&text).unwrap();
    e.replications = 6;
    match experiment::run(&e, 1) {
        Err(ExperimentError::UnknownTrader { name, .. }) => assert_eq!(name, "truthful"),
        other => panic!("not refused: {:?}", other.map(|r| r.len())),
    }
    let types = Strategies::builtin().with("truthful", Truthful);
    assert_eq!(types.names(), ["truthful", "zi-c", "zi-u"]);
    let reps = experiment::run_with(&e, 1, &types).unwrap();
    let cells = experiment::summaries(&e, &reps, 1);
    let eff = |t: &str| {
        experiment::find(&cells, t, Length::Shouts(500), "efficiency")
            .unwrap()
            .mean
    };
    // Truthful shouts never lose surplus; the table has its rows like any treatment's.
    assert!(
        eff("truthful") > 0.5 && eff("truthful") <= 1.0,
        "{}",
        eff("truthful")
    );
    let rows = experiment::periods_table(&e, &reps).rows;
    assert!(rows.iter().filter(|r| r[0] == "truthful").count() == 3 * 6 * 6);
    let d = Dir::new();
    std::fs::create_dir_all(&d.0).unwrap();
    let files = gridlease_sim::plot::zi::prices(&d.0, &e, &reps).unwrap();
    assert_eq!(files, ["prices.png", "prices.svg"]);
    let t = texts(&d.0.join("prices.svg"));
    assert!(
        t.iter()
            .any(|x| x.starts_with("truthful, periods of 500 shouts")),
        "{t:?}"
    );

    // The binary knows only the built-in types: one error naming the missing one.
    let file = d.0.join("custom.toml");
    std::fs::write(&file, &text).unwrap();
    let out = common::run(&["zi", "--scenario", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no trader type \"truthful\" (known: zi-c, zi-u"),
        "{err}"
    );
}
