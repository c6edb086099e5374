//! Scenarios from data, through the real binary: a renter group's durations, valuations and
//! inter-arrival times come from CSV columns; the manifest records each file's BLAKE3 and the
//! scenario hash covers them (a changed file is another study: merge refuses to mix shards of
//! the two); a data file cannot be swept; a bad file is refused with its line before anything
//! runs.

// Helpers outside #[test] fns: a panic here is still a test failure with a location.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod common;

use std::path::{Path, PathBuf};

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("gridlease-sim-data-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("data")).unwrap();
    Dir(d)
}

/// One day, one provider group of 64 GPUs at a fixed 0.40 with a cost floor of 0.10; one renter
/// group whose durations, valuations and gaps come from `data/`.
const SCENARIO: &str = r#"
name = "from-data"
days = 1.0
[[gpu_class]]
name = "rtx4090"
vram_gib = 24
[[provider]]
name = "p"
count = 4
gpus = 16
cost_floor = "0.10"
pricing = { strategy = "fixed", price = "0.40" }
[[renter]]
name = "traced"
count = 50
duration_data = { file = "data/jobs.csv", column = "minutes" }
valuation_data = { file = "data/jobs.csv", column = "glu_per_gpu_hour" }
interarrival_data = { file = "data/gaps.csv", column = "seconds" }
"#;

/// Writes the scenario and its data: every job 30 minutes; valuations `values`; a job every
/// 600 s.
fn setup(d: &Path, values: &[&str]) -> String {
    let mut jobs = String::from("job,minutes,glu_per_gpu_hour\n");
    for (i, v) in values.iter().enumerate() {
        jobs.push_str(&format!("{i},30,{v}\n"));
    }
    std::fs::write(d.join("data/jobs.csv"), jobs).unwrap();
    std::fs::write(d.join("data/gaps.csv"), "seconds\n600\n600\n").unwrap();
    let path = d.join("s.toml");
    std::fs::write(&path, SCENARIO).unwrap();
    path.display().to_string()
}

fn ok(args: &[&str]) -> String {
    let out = common::run(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

fn cell(dir: &Path, table: &str, col: &str) -> Vec<String> {
    let mut r = csv::Reader::from_path(dir.join(table)).unwrap();
    let i = r.headers().unwrap().iter().position(|h| h == col).unwrap();
    r.records().map(|x| x.unwrap()[i].to_string()).collect()
}

#[test]
fn a_group_from_data_runs_and_the_manifest_names_its_files() {
    let d = dir("run");
    let s = setup(&d.0, &["0.80", "1.20"]);
    let o = d.0.join("o");
    ok(&[
        "run",
        &s,
        "--reps",
        "2",
        "--no-plots",
        "--out",
        o.to_str().unwrap(),
        "-q",
    ]);
    // A job every 600 s for a day: 143 or 144 arrivals, and all of them lease (they value 0.80
    // or 1.20, the ask is 0.40, 64 GPUs are plenty).
    for (jobs, leases) in cell(&o, "runs.csv", "jobs")
        .iter()
        .zip(cell(&o, "runs.csv", "leases"))
    {
        let jobs: u32 = jobs.parse().unwrap();
        assert!((143..=144).contains(&jobs), "{jobs} jobs");
        assert_eq!(leases.parse::<u32>().unwrap(), jobs);
    }
    // Every lease ran the data's 30 minutes, 0.5 GPU-hours, but the last three, which the end
    // of the day cuts short (the default lognormal would give a median of an hour).
    let hours: f64 = cell(&o, "runs.csv", "honest_gpu_hours")[0].parse().unwrap();
    let leases: f64 = cell(&o, "runs.csv", "leases")[0].parse().unwrap();
    assert!(
        hours <= 0.5 * leases + 1e-6 && hours >= 0.5 * (leases - 3.0),
        "{hours} h over {leases} leases"
    );
    let m = manifest(&o);
    let data = m["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let jobs_hash = blake3::hash(&std::fs::read(d.0.join("data/jobs.csv")).unwrap())
        .to_hex()
        .to_string();
    assert_eq!(data[0]["field"], "duration_data");
    assert_eq!(data[0]["blake3"], jobs_hash.as_str());
    assert_eq!(data[0]["rows"], 2);
    assert_eq!(data[2]["file"], "data/gaps.csv");

    // Valuations below every ask: nobody leases.
    let d2 = dir("poor");
    let s2 = setup(&d2.0, &["0.05"]);
    let o2 = d2.0.join("o");
    ok(&[
        "run",
        &s2,
        "--reps",
        "1",
        "--no-plots",
        "--out",
        o2.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(cell(&o2, "runs.csv", "leases"), ["0"]);
}

#[test]
fn changed_data_is_another_study_and_merge_refuses_to_mix_them() {
    let d = dir("merge");
    let s = setup(&d.0, &["0.80", "1.20"]);
    let (a, b) = (d.0.join("a"), d.0.join("b"));
    ok(&[
        "run",
        &s,
        "--reps",
        "2",
        "--shard",
        "0/2",
        "--no-plots",
        "--out",
        a.to_str().unwrap(),
        "-q",
    ]);
    let hash_a = manifest(&a)["scenario_hash"].as_str().unwrap().to_string();
    // The same scenario file, other valuations: shard 1 of a different study.
    setup(&d.0, &["0.80", "1.30"]);
    ok(&[
        "run",
        &s,
        "--reps",
        "2",
        "--shard",
        "1/2",
        "--no-plots",
        "--out",
        b.to_str().unwrap(),
        "-q",
    ]);
    assert_ne!(manifest(&b)["scenario_hash"].as_str().unwrap(), hash_a);
    let m = d.0.join("m");
    let out = common::run(&[
        "merge",
        "--out",
        m.to_str().unwrap(),
        a.to_str().unwrap(),
        b.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("scenario_hash"));
}

#[test]
fn other_fields_sweep_with_data_and_data_files_do_not() {
    let d = dir("sweep");
    let s = setup(&d.0, &["0.80", "1.20"]);
    let o = d.0.join("o");
    ok(&[
        "sweep",
        &s,
        "--param",
        "providers=2,4",
        "--reps",
        "1",
        "--no-plots",
        "--out",
        o.to_str().unwrap(),
        "-q",
    ]);
    assert_eq!(cell(&o, "runs.csv", "leases").len(), 2);
    let out = common::run(&[
        "sweep",
        &s,
        "--param",
        r#"renter.0.duration_data={ file = "data/gaps.csv", column = "seconds" }"#,
        "--reps",
        "1",
        "--out",
        d.0.join("x").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("duration_data cannot be swept"), "{err}");
}

#[test]
fn a_bad_data_file_is_refused_with_its_line_before_anything_runs() {
    let d = dir("bad");
    let s = setup(&d.0, &["0.80", "lots"]);
    let o = d.0.join("o");
    let out = common::run(&["run", &s, "--reps", "1", "--out", o.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("renter group \"traced\" valuation_data: ")
            && err.contains("line 3: \"lots\" is not a number"),
        "{err}"
    );
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert!(!o.exists());
    // A pinned hash that the file does not match.
    let s = setup(&d.0, &["0.80"]);
    let pinned = SCENARIO.replace(
        r#"column = "seconds" }"#,
        &format!(r#"column = "seconds", blake3 = "{}" }}"#, "0".repeat(64)),
    );
    std::fs::write(&s, pinned).unwrap();
    let out = common::run(&["run", &s, "--reps", "1", "--out", o.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("but the scenario pins"));
}

/// A provider group priced from data: every ask is a value of the column, never below the
/// group's cost floor.
#[test]
fn a_provider_group_prices_from_data() {
    let d = dir("prices");
    setup(&d.0, &["0.80"]);
    let with_prices = |prices: &str| {
        std::fs::write(d.0.join("data/prices.csv"), format!("price\n{prices}\n")).unwrap();
        let text = SCENARIO.replace(
            r#"pricing = { strategy = "fixed", price = "0.40" }"#,
            r#"pricing = { strategy = "empirical", file = "data/prices.csv", column = "price" }"#,
        );
        let path = d.0.join("p.toml");
        std::fs::write(&path, text).unwrap();
        let o = d.0.join("o");
        let _ = std::fs::remove_dir_all(&o);
        ok(&[
            "run",
            path.to_str().unwrap(),
            "--reps",
            "1",
            "--no-plots",
            "--out",
            o.to_str().unwrap(),
            "-q",
        ]);
        let m = manifest(&o);
        assert_eq!(m["data"][3]["field"], "pricing");
        assert_eq!(m["data"][3]["group"], "provider group \"p\"");
        cell(&o, "runs.csv", "honest_price_rtx4090")[0]
            .parse::<f64>()
            .unwrap()
    };
    assert!((with_prices("0.25\n0.25") - 0.25).abs() < 1e-9);
    // Below the cost floor (0.10): the floor is asked.
    assert!((with_prices("0.05") - 0.10).abs() < 1e-9);
    // Two prices drawn at each re-pricing: the mean lease price lies between them.
    let mixed = with_prices("0.20\n0.60");
    assert!(mixed > 0.2 && mixed < 0.6, "{mixed}");
}
