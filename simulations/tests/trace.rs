//! `run --trace` through the real binary: one row per market event, consistent with the
//! run's tables, byte-identical across thread counts, capped with a warning, and refused
//! beyond its limit.

#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::run as sim;
use gridlease_sim::output::Table;

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("scenarios/{name}.toml"))
}

fn traced(name: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    let file = scenario(name);
    let mut args = vec![
        "run",
        file.to_str().unwrap(),
        "--reps",
        "2",
        "--seed",
        "3",
        "--out",
        out.to_str().unwrap(),
        "--no-plots",
    ];
    args.extend_from_slice(extra);
    sim(&args)
}

fn count(t: &Table, kind: &str) -> usize {
    let k = t.col("kind").unwrap();
    t.rows.iter().filter(|r| r[k] == kind).count()
}

fn total(runs: &Table, cols: &[&str]) -> usize {
    cols.iter()
        .map(|c| {
            let i = runs.col(c).unwrap();
            runs.rows
                .iter()
                .map(|r| r[i].parse::<usize>().unwrap())
                .sum::<usize>()
        })
        .sum()
}

/// The trace of the no-show market (arrivals, resubmissions, abandons, failed leases) holds
/// exactly the events its tables count, and is the same bytes at 1 and 3 threads.
#[test]
fn the_trace_counts_what_the_tables_count_and_is_deterministic() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("t1"), tmp.path().join("t3"));
    assert!(
        traced("no-show", &a, &["--trace", "--threads", "1"])
            .status
            .success()
    );
    assert!(
        traced("no-show", &b, &["--trace", "--threads", "3"])
            .status
            .success()
    );
    let bytes = std::fs::read(a.join("trace.csv")).unwrap();
    assert_eq!(bytes, std::fs::read(b.join("trace.csv")).unwrap());
    let trace = Table::read(&a.join("trace.csv")).unwrap();
    let runs = Table::read(&a.join("runs.csv")).unwrap();
    println!("{} trace rows", trace.rows.len());
    assert_eq!(count(&trace, "arrival"), total(&runs, &["jobs"]));
    assert_eq!(
        count(&trace, "resubmission"),
        total(&runs, &["resubmissions"])
    );
    assert_eq!(
        count(&trace, "abandon"),
        total(&runs, &["jobs_abandoned", "resubmissions_abandoned"])
    );
    assert_eq!(count(&trace, "lease_start"), total(&runs, &["leases"]));
    assert_eq!(
        count(&trace, "lease_end"),
        total(&runs, &["honest_ended_leases", "attacker_ended_leases"])
    );
    assert_eq!(
        count(&trace, "online"),
        2 * 90,
        "every provider comes online once"
    );
    // Every lease that ended started before, with the same renter and provider; no-show
    // leases end as provider-unreachable, paid nothing, 420 s after their start.
    let col = |n: &str| trace.col(n).unwrap();
    let (rep, kind, lease, t) = (col("replication"), col("kind"), col("lease"), col("t_s"));
    let mut starts = BTreeMap::new();
    let mut no_shows = 0;
    for r in &trace.rows {
        let key = (r[rep].clone(), r[lease].clone());
        match r[kind].as_str() {
            "lease_start" => {
                starts.insert(key, r.clone());
            }
            "lease_end" => {
                let s = &starts[&key];
                assert_eq!(s[col("renter")], r[col("renter")]);
                assert_eq!(s[col("provider")], r[col("provider")]);
                if r[col("reason")] == "ProviderUnreachable" {
                    no_shows += 1;
                    assert_eq!(r[col("amount")], "0.00");
                    let dt = r[t].parse::<f64>().unwrap() - s[t].parse::<f64>().unwrap();
                    assert!((dt - 420.0).abs() < 1e-9, "{dt}");
                }
            }
            _ => {}
        }
    }
    assert_eq!(no_shows, total(&runs, &["no_shows"]));
    assert!(no_shows > 0);
    // Without --trace there is no trace.
    let c = tmp.path().join("plain");
    assert!(traced("no-show", &c, &[]).status.success());
    assert!(!c.join("trace.csv").exists());
}

/// In a call market every lease starts at a call (a multiple of the period) and all leases
/// of one call pay the same price.
#[test]
fn the_call_markets_trace_shows_one_price_per_call() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o");
    assert!(traced("call-market", &out, &["--trace"]).status.success());
    let trace = Table::read(&out.join("trace.csv")).unwrap();
    let col = |n: &str| trace.col(n).unwrap();
    let mut calls: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for r in trace
        .rows
        .iter()
        .filter(|r| r[col("kind")] == "lease_start")
    {
        let t: f64 = r[col("t_s")].parse().unwrap();
        assert_eq!(t % 60.0, 0.0, "lease started between calls at {t}");
        calls
            .entry((r[col("replication")].clone(), r[col("t_s")].clone()))
            .or_default()
            .push(r[col("amount")].clone());
    }
    let multi = calls.values().filter(|p| p.len() > 1).count();
    println!("{} calls with leases, {multi} with several", calls.len());
    assert!(multi > 10);
    for (call, prices) in &calls {
        assert!(
            prices.iter().all(|p| *p == prices[0]),
            "{call:?}: {prices:?}"
        );
    }
}

#[test]
fn the_trace_is_capped_with_a_warning_and_refused_beyond_its_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o");
    let o = traced("no-show", &out, &["--trace", "--trace-max-rows", "100"]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("warning: trace.csv capped").count(), 1, "{err}");
    let trace = Table::read(&out.join("trace.csv")).unwrap();
    assert_eq!(trace.rows.len(), 100, "2 runs x 50 rows");
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["trace"]["rows_per_run"], 50);
    assert!(m["trace"]["dropped"].as_u64().unwrap() > 1000);
    for bad in ["0", "20000001"] {
        let o = traced(
            "no-show",
            &tmp.path().join(bad),
            &["--trace", "--trace-max-rows", bad],
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1));
        assert!(
            err.contains("--trace-max-rows") && err.contains("20000000"),
            "{err}"
        );
        assert!(!tmp.path().join(bad).join("manifest.json").exists());
    }
}
