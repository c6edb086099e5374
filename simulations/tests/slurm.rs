//! `sweep --slurm` on a real Slurm: the sweep submitted as an array job (one task per shard),
//! waited for and merged, gives tables byte-identical to the same sweep run here; without
//! `sbatch`, or with a shard count the study cannot fill, one clear error and nothing
//! submitted.
//!
//! The Slurm test needs a running Slurm whose client finds it (`sbatch` on PATH, `SLURM_CONF`
//! set): `.ci/run` starts a single-node one (`scripts/slurm-local.sh`) and sets
//! `GRIDLEASE_REQUIRE_SLURM=1`, which makes its absence a failure, not a skip.

// Helpers outside #[test] fns: a panic here is still a test failure with a location.
#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("gridlease-sim-slurm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    Dir(d)
}

fn scenario() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios/baseline.toml")
        .display()
        .to_string()
}

/// Whether a Slurm is there to submit to; without one the test fails when CI requires it.
fn slurm() -> bool {
    let sbatch = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join("sbatch").is_file()));
    let ok = sbatch && std::env::var_os("SLURM_CONF").is_some();
    if !ok {
        if std::env::var("GRIDLEASE_REQUIRE_SLURM").is_ok_and(|v| v == "1") {
            panic!(
                "GRIDLEASE_REQUIRE_SLURM=1 but no sbatch on PATH or no SLURM_CONF: start one with scripts/slurm-local.sh"
            );
        }
        println!("skipped: no Slurm (sbatch on PATH and SLURM_CONF); .ci/run starts one");
    }
    ok
}

#[test]
fn a_sweep_on_slurm_merges_to_the_same_tables_as_here() {
    if !slurm() {
        return;
    }
    let d = dir("same");
    let (remote, local) = (d.0.join("slurm"), d.0.join("local"));
    let sc = scenario();
    let args = [
        "sweep",
        sc.as_str(),
        "--param",
        "renter_rate=0.5,1.0",
        "--param",
        "days=1.0",
        "--reps",
        "3",
        "--no-plots",
    ];
    let mut on_slurm = args.to_vec();
    on_slurm.extend([
        "--out",
        remote.to_str().unwrap(),
        "--slurm",
        "--shards",
        "4",
        "--wait",
    ]);
    let out = common::run(&on_slurm);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ended: 4 tasks"), "{stdout}");
    let mut here = args.to_vec();
    here.extend(["--out", local.to_str().unwrap(), "-q"]);
    let out = common::run(&here);
    assert!(out.status.success());
    let merged = remote.join("merged");
    for t in [
        "runs.csv",
        "buckets.csv",
        "waits.csv",
        "summary.csv",
        "providers.csv",
        "renters.csv",
    ] {
        assert_eq!(
            std::fs::read(merged.join(t)).unwrap(),
            std::fs::read(local.join(t)).unwrap(),
            "{t} differs between Slurm and here"
        );
    }
    for i in 0..4 {
        assert!(remote.join(format!("shard-{i}/manifest.json")).is_file());
        assert!(remote.join(format!("slurm/task-{i}.log")).is_file());
    }
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(merged.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(m["merged_from"].as_array().unwrap().len(), 4);
    assert_eq!(m["coverage"]["partial"], false);
    assert_eq!(m["runs"], 6);
}

#[test]
fn without_sbatch_or_with_too_many_shards_nothing_is_submitted() {
    let d = dir("refused");
    let o = d.0.join("o");
    let sc = scenario();
    let base = [
        "sweep",
        sc.as_str(),
        "--param",
        "renter_rate=0.5,1.0",
        "--reps",
        "2",
        "--out",
        o.to_str().unwrap(),
        "--slurm",
    ];
    let out = common::bin()
        .args(base)
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no `sbatch` on PATH"), "{err}");
    assert!(!o.exists());
    let mut many = base.to_vec();
    many.extend(["--shards", "5"]);
    let out = common::run(&many);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--shards 5: need 1..=4"), "{err}");
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert!(!o.exists());
    let mut sharded = base.to_vec();
    sharded.extend(["--shard", "0/2"]);
    let out = common::run(&sharded);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--slurm shards the sweep itself"));
}
