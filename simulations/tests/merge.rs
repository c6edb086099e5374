//! `gridlease-sim merge` through the real binary: a complete shard set merges; incomplete,
//! duplicated, mixed-split, other-scenario, other-binary and truncated shard sets are refused
//! with a non-zero exit and one clear error line; `--allow-partial` merges and lists exactly
//! what is missing. A shard whose table is truncated, has a flipped byte, is missing, or is
//! not in its manifest (each table's BLAKE3 is there) is refused too. Also: `--reps 0` and
//! empty sweeps are refused.

// Helpers outside #[test] fns: a panic here is still a test failure with a location.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod common;

use common::{bin, run};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TINY: &str = r#"
name = "tiny"
days = 0.05
[[provider]]
count = 4
[[renter]]
count = 8
jobs_per_day = 4.0
"#;

struct Study {
    tmp: tempfile::TempDir,
    scenario: PathBuf,
}

impl Study {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let scenario = tmp.path().join("tiny.toml");
        std::fs::write(&scenario, TINY).unwrap();
        Self { tmp, scenario }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// Runs shard `shard` (e.g. "1/3"; "" for no `--shard`) of a 2-point sweep x 3
    /// replications into `name`.
    fn shard(&self, name: &str, shard: &str, scenario: &Path) -> PathBuf {
        let dir = self.path(name);
        let mut args = vec![
            "-q",
            "sweep",
            scenario.to_str().unwrap(),
            "--param",
            "renter_rate=2,4",
            "--reps",
            "3",
            "--seed",
            "5",
            "--no-plots",
            "--out",
            dir.to_str().unwrap(),
        ];
        if !shard.is_empty() {
            args.extend(["--shard", shard]);
        }
        assert!(run(&args).status.success());
        dir
    }

    fn merge(&self, dirs: &[&Path], extra: &[&str]) -> (Output, PathBuf) {
        let out_dir = self.path("merged");
        let mut args = vec!["merge", "--no-plots", "--out", out_dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        args.extend(dirs.iter().map(|d| d.to_str().unwrap()));
        (run(&args), out_dir)
    }
}

/// Refused: non-zero exit, nothing on stdout, exactly one `error:` line on stderr containing
/// `needle`, and no merged manifest written.
fn assert_refused(out: &Output, merged: &Path, needle: &str) {
    assert!(!out.status.success(), "merge should fail");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("error:").count(), 1, "one error line: {err}");
    assert!(err.contains(needle), "{needle:?} not in {err}");
    assert!(!merged.join("manifest.json").exists());
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

#[test]
fn complete_set_merges_and_says_so() {
    let s = Study::new();
    let d: Vec<PathBuf> = (0..3)
        .map(|i| s.shard(&format!("s{i}"), &format!("{i}/3"), &s.scenario))
        .collect();
    let refs: Vec<&Path> = d.iter().map(PathBuf::as_path).collect();
    let (out, merged) = s.merge(&refs, &[]);
    assert!(out.status.success());
    let m = manifest(&merged);
    assert_eq!(m["runs"], 6);
    assert_eq!(m["coverage"]["partial"], false);
    assert_eq!(m["coverage"]["missing_replications"], serde_json::json!([]));
}

#[test]
fn incomplete_set_is_refused_and_allow_partial_lists_the_gaps() {
    let s = Study::new();
    let a = s.shard("s0", "0/3", &s.scenario);
    let b = s.shard("s1", "1/3", &s.scenario);
    let (out, merged) = s.merge(&[&a, &b], &[]);
    assert_refused(&out, &merged, "missing shard(s) [2] of 3");
    let (out, merged) = s.merge(&[&a, &b], &["--allow-partial"]);
    assert!(out.status.success());
    let m = manifest(&merged);
    assert_eq!(m["runs"], 4);
    assert_eq!(m["coverage"]["partial"], true);
    assert_eq!(m["coverage"]["missing_shards"], serde_json::json!([2]));
    // Tasks in order (0,0) (0,1) (0,2) (1,0) (1,1) (1,2); shard 2 of 3 holds tasks 2 and 5.
    assert_eq!(
        m["coverage"]["missing_replications"],
        serde_json::json!([
            { "point": 0, "replication": 2 },
            { "point": 1, "replication": 2 }
        ])
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("PARTIAL"));
}

#[test]
fn duplicate_shard_is_refused() {
    let s = Study::new();
    let a = s.shard("s0", "0/2", &s.scenario);
    let b = s.shard("s1", "1/2", &s.scenario);
    let (out, merged) = s.merge(&[&a, &b, &a], &[]);
    assert_refused(&out, &merged, "shard 0/2 given twice");
}

#[test]
fn mixed_splits_are_refused() {
    let s = Study::new();
    let a = s.shard("s0", "0/2", &s.scenario);
    let b = s.shard("t1", "1/3", &s.scenario);
    let c = s.shard("t2", "2/3", &s.scenario);
    let (out, merged) = s.merge(&[&a, &b, &c], &[]);
    assert_refused(&out, &merged, "mixed splits");
    // An unsharded output counts as 0/1: mixing it with shards is a mixed split too.
    let full = s.shard("full", "", &s.scenario);
    let (out, merged) = s.merge(&[&full, &b], &[]);
    assert_refused(&out, &merged, "mixed splits");
}

#[test]
fn other_scenario_is_refused() {
    let s = Study::new();
    let other = s.path("other.toml");
    std::fs::write(&other, TINY.replace("days = 0.05", "days = 0.04")).unwrap();
    let a = s.shard("s0", "0/2", &s.scenario);
    let b = s.shard("s1", "1/2", &other);
    let (out, merged) = s.merge(&[&a, &b], &[]);
    assert_refused(&out, &merged, "scenario_hash is");
}

#[test]
fn other_binary_version_or_revision_is_refused() {
    let s = Study::new();
    let a = s.shard("s0", "0/2", &s.scenario);
    let b = s.shard("s1", "1/2", &s.scenario);
    let original = std::fs::read_to_string(b.join("manifest.json")).unwrap();
    for (field, value) in [("version", "\"9.9.9\""), ("git_revision", "\"0123abcd\"")] {
        let mut m: serde_json::Value = serde_json::from_str(&original).unwrap();
        m[field] = serde_json::from_str(value).unwrap();
        std::fs::write(b.join("manifest.json"), m.to_string()).unwrap();
        let (out, merged) = s.merge(&[&a, &b], &[]);
        assert_refused(&out, &merged, &format!("{field} is {value}"));
    }
}

#[test]
fn truncated_shard_is_refused() {
    let s = Study::new();
    let a = s.shard("s0", "0/2", &s.scenario);
    let b = s.shard("s1", "1/2", &s.scenario);
    // Drop the last replication row of shard 1's runs.csv (a task killed mid-write).
    let runs = std::fs::read_to_string(b.join("runs.csv")).unwrap();
    let mut lines: Vec<&str> = runs.lines().collect();
    lines.pop();
    std::fs::write(b.join("runs.csv"), lines.join("\n") + "\n").unwrap();
    let (out, merged) = s.merge(&[&a, &b], &[]);
    assert_refused(
        &out,
        &merged,
        "runs.csv holds 2 of the 3 replications shard 1/2",
    );
}

/// Shard 1 of a complete 2-shard set, damaged by `damage`, is refused with `needle`.
fn damaged_shard_is_refused(damage: impl FnOnce(&Path), needle: &str) {
    let s = Study::new();
    let a = s.shard("s0", "0/2", &s.scenario);
    let b = s.shard("s1", "1/2", &s.scenario);
    damage(&b);
    let (out, merged) = s.merge(&[&a, &b], &[]);
    assert_refused(&out, &merged, needle);
}

#[test]
fn a_truncated_table_is_refused() {
    // The issue's case (`head -20 s1/buckets.csv > x/buckets.csv` merged with exit 0): the
    // head of a table, here its first half.
    damaged_shard_is_refused(
        |d| {
            let t = std::fs::read_to_string(d.join("buckets.csv")).unwrap();
            let n = t.lines().count();
            assert!(n > 2, "{t}");
            let head: Vec<&str> = t.lines().take(n / 2).collect();
            std::fs::write(d.join("buckets.csv"), head.join("\n") + "\n").unwrap();
        },
        "buckets.csv is damaged",
    );
}

#[test]
fn a_flipped_byte_is_refused() {
    damaged_shard_is_refused(
        |d| {
            let path = d.join("waits.csv");
            let mut b = std::fs::read(&path).unwrap();
            let i = b.len() / 2;
            b[i] ^= 0x01;
            std::fs::write(&path, b).unwrap();
        },
        "waits.csv is damaged",
    );
}

#[test]
fn a_missing_table_is_refused() {
    damaged_shard_is_refused(
        |d| std::fs::remove_file(d.join("renters.csv")).unwrap(),
        "renters.csv is missing",
    );
}

#[test]
fn an_extra_table_is_refused() {
    damaged_shard_is_refused(
        |d| std::fs::write(d.join("other.csv"), "point,x\n0,1\n").unwrap(),
        "other.csv is not in the manifest",
    );
}

#[test]
fn every_table_is_checksummed_and_the_merged_ones_too() {
    let s = Study::new();
    let a = s.shard("s0", "0/2", &s.scenario);
    let b = s.shard("s1", "1/2", &s.scenario);
    let tables = manifest(&a)["tables"].clone();
    for t in [
        "runs.csv",
        "buckets.csv",
        "waits.csv",
        "providers.csv",
        "renters.csv",
        "summary.csv",
    ] {
        let want = tables[t].as_str().unwrap_or_default().to_string();
        assert_eq!(want.len(), 64, "{t}: {tables}");
        let got = blake3::hash(&std::fs::read(a.join(t)).unwrap())
            .to_hex()
            .to_string();
        assert_eq!(got, want, "{t}");
    }
    let (out, merged) = s.merge(&[&a, &b], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = manifest(&merged);
    let got = blake3::hash(&std::fs::read(merged.join("buckets.csv")).unwrap())
        .to_hex()
        .to_string();
    assert_eq!(m["tables"]["buckets.csv"], got.as_str(), "{m}");
}

#[test]
fn zero_replications_and_empty_sweeps_are_refused() {
    let s = Study::new();
    let sc = s.scenario.to_str().unwrap();
    let out_dir = s.path("x");
    let o = out_dir.to_str().unwrap();
    let gs = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/gs-market1.toml");
    let gs = gs.to_str().unwrap();
    for args in [
        vec!["run", sc, "--reps", "0", "--out", o],
        vec!["sweep", sc, "--param", "renter_rate=", "--out", o],
        vec!["sweep", sc, "--param", "renter_rate=1,,2", "--out", o],
        vec!["zi", "--scenario", gs, "--reps", "0"],
    ] {
        let out = run(&args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.matches("error:").count(), 1, "{err}");
        assert!(!out_dir.join("manifest.json").exists());
    }
}

/// `git_revision` is the binary's own (recorded at build time), not the repository of the
/// directory the run starts in: run from a temporary directory, it still names this checkout's
/// HEAD.
#[test]
fn manifest_names_the_binarys_own_revision() {
    let head = Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let Some(head) = head else {
        println!("not a git checkout: nothing to compare");
        return;
    };
    let s = Study::new();
    let out = bin()
        .current_dir(s.tmp.path())
        .args([
            "-q",
            "run",
            "tiny.toml",
            "--reps",
            "1",
            "--no-plots",
            "--out",
            "o",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let m = manifest(&s.path("o"));
    let rev = m["git_revision"].as_str().unwrap();
    assert!(
        rev == head || rev == format!("{head}-dirty"),
        "{rev} vs {head}"
    );
}

/// An invalid scenario's parser message is printed once (it used to be repeated, once in the
/// error's message and once as its source).
#[test]
fn errors_are_printed_once() {
    let s = Study::new();
    let bad = s.path("bad.toml");
    std::fs::write(&bad, "name = \"x\"\ndays = \"a\"\n").unwrap();
    let out = run(&[
        "run",
        bad.to_str().unwrap(),
        "--out",
        s.path("o").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert_eq!(err.matches("expected f64").count(), 1, "{err}");
}
