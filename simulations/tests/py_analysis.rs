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
    let required = std::env::var("GRIDLEASE_REQUIRE_PY_ANALYSIS").is_ok_and(|v| v == "1");
    let py = match interpreter() {
        Ok(py) => py,
        Err(why) if required => {
            panic!("GRIDLEASE_REQUIRE_PY_ANALYSIS=1 but no usable interpreter: {why}")
        }
        Err(why) => {
            eprintln!("skipped (set GRIDLEASE_REQUIRE_PY_ANALYSIS=1 to fail instead): {why}");
            return;
        }
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
