//! Running replications and sweeps, and writing what they produce: `runs.csv` (one row per
//! replication), `buckets.csv` (one row per replication and time bucket), `waits.csv`
//! (wait-time histograms), `summary.csv` (mean, quartiles and 95/99 % intervals per sweep point and
//! metric), `manifest.json`, and plots.
//!
//! Tables are kept as text cells so that shards written on different machines can be merged
//! byte-for-byte: `merge` concatenates, sorts by (point, replication, bucket) and recomputes
//! the summary and plots from the merged tables.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};
use gridlease_contracts::Money;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::market::{Market, RunResult, revenue_gini};
use crate::metrics::WAIT_BINS_S;
use crate::scenario::Scenario;
use crate::stats::{self, Summary};

/// One sweep point: the parameter settings and the scenario they produce.
#[derive(Clone, Debug)]
pub struct Point {
    /// `(key, value)` pairs applied to the base scenario.
    pub params: Vec<(String, String)>,
    /// The resulting scenario.
    pub scenario: Scenario,
}

/// A table of text cells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// Column names.
    pub header: Vec<String>,
    /// Rows.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// Index of a column.
    pub fn col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    /// Writes as CSV.
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut w =
            csv::Writer::from_path(path).with_context(|| format!("create {}", path.display()))?;
        w.write_record(&self.header)?;
        for r in &self.rows {
            w.write_record(r)?;
        }
        w.flush()?;
        Ok(())
    }

    /// Reads a CSV written by [`Table::write`].
    pub fn read(path: &Path) -> Result<Self> {
        let mut r =
            csv::Reader::from_path(path).with_context(|| format!("open {}", path.display()))?;
        let header = r.headers()?.iter().map(str::to_string).collect();
        let mut rows = Vec::new();
        for rec in r.records() {
            rows.push(rec?.iter().map(str::to_string).collect());
        }
        Ok(Self { header, rows })
    }
}

/// One finished replication.
pub struct Record {
    /// Sweep point index.
    pub point: usize,
    /// Replication index.
    pub replication: u64,
    /// Result.
    pub result: RunResult,
}

/// All (point, replication) tasks in canonical order; a shard `i/n` keeps every n-th from i.
pub fn tasks(points: usize, reps: u64, shard: Option<(u64, u64)>) -> Vec<(usize, u64)> {
    let all = (0..points).flat_map(|p| (0..reps).map(move |r| (p, r)));
    match shard {
        Some((i, n)) => all
            .enumerate()
            .filter(|(k, _)| *k as u64 % n == i)
            .map(|(_, t)| t)
            .collect(),
        None => all.collect(),
    }
}

/// Simulated minutes all `tasks` will cover (the length of a progress bar).
pub fn total_minutes(points: &[Point], tasks: &[(usize, u64)]) -> u64 {
    tasks
        .iter()
        .map(|&(p, _)| (points[p].scenario.days * 24.0 * 60.0) as u64)
        .sum()
}

/// Runs the tasks in parallel (rayon); results come back in task order. `tick` receives
/// simulated milliseconds as runs advance (progress bars).
pub fn execute(
    points: &[Point],
    tasks: &[(usize, u64)],
    seed: u64,
    tick: &(dyn Fn(u64) + Sync),
) -> Vec<Record> {
    tasks
        .par_iter()
        .map(|&(point, replication)| {
            let result = Market::new(&points[point].scenario, seed, replication).run_observed(tick);
            Record {
                point,
                replication,
                result,
            }
        })
        .collect()
}

fn money(m: u64) -> String {
    Money::from_micros(m).to_string()
}

fn signed_money(m: i128) -> String {
    let s = money(m.unsigned_abs().min(u128::from(u64::MAX)) as u64);
    if m < 0 { format!("-{s}") } else { s }
}

fn f(x: f64) -> String {
    format!("{x:.6}")
}

fn ratio(a: u128, b: u128) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Builds the three per-run tables from records.
pub fn tables(points: &[Point], records: &[Record], seed: u64) -> (Table, Table, Table) {
    let param_names: Vec<String> = points
        .first()
        .map(|p| p.params.iter().map(|(k, _)| k.clone()).collect())
        .unwrap_or_default();
    let classes = records
        .first()
        .map(|r| r.result.classes.clone())
        .unwrap_or_default();
    let mut runs = Table {
        header: vec!["point".to_string()],
        rows: Vec::new(),
    };
    runs.header.extend(param_names.iter().cloned());
    for h in [
        "replication",
        "seed",
        "jobs",
        "matched",
        "abandoned",
        "abandonment_rate",
        "mean_wait_s",
        "p50_wait_s",
        "p90_wait_s",
        "p99_wait_s",
        "utilization",
    ] {
        runs.header.push(h.into());
    }
    for c in &classes {
        runs.header.push(format!("price_{c}"));
    }
    for h in [
        "provider_revenue",
        "renter_surplus",
        "leases",
        "failed_leases",
        "money_at_risk",
        "max_at_risk",
        "bound_violations",
        "attacker_leases",
        "attacker_revenue",
        "attacker_profit",
        "attacker_identities",
        "inflation_caught",
        "rejected_requests",
        "resubmitted",
        "revenue_gini",
        "events",
        "channel_reports",
    ] {
        runs.header.push(h.into());
    }
    let mut buckets = Table {
        header: vec!["point".to_string()],
        rows: Vec::new(),
    };
    buckets.header.extend(param_names.iter().cloned());
    for h in [
        "replication",
        "bucket",
        "t_start_h",
        "arrivals",
        "matched",
        "abandoned",
        "mean_wait_s",
        "queue_len",
        "utilization",
    ] {
        buckets.header.push(h.into());
    }
    for c in &classes {
        buckets.header.push(format!("price_{c}"));
        buckets.header.push(format!("leases_{c}"));
    }
    for h in [
        "provider_revenue",
        "renter_surplus",
        "ended_leases",
        "failed_leases",
        "money_at_risk",
        "attacker_profit",
        "inflation_caught",
    ] {
        buckets.header.push(h.into());
    }
    let mut waits = Table {
        header: vec![
            "point".into(),
            "replication".into(),
            "bin_upper_s".into(),
            "count".into(),
        ],
        rows: Vec::new(),
    };
    for rec in records {
        let r = &rec.result;
        let pv: Vec<String> = points[rec.point]
            .params
            .iter()
            .map(|(_, v)| v.clone())
            .collect();
        let mut row = vec![rec.point.to_string()];
        row.extend(pv.iter().cloned());
        let jobs: u64 = r.buckets.iter().map(|b| b.arrivals).sum();
        let matched: u64 = r.buckets.iter().map(|b| b.matched).sum();
        let abandoned: u64 = r.buckets.iter().map(|b| b.abandoned).sum();
        let wait_sum: u64 = r.buckets.iter().map(|b| b.wait_sum_ms).sum();
        let busy: u128 = r.buckets.iter().map(|b| b.busy_gpu_ms).sum();
        let online: u128 = r.buckets.iter().map(|b| b.online_gpu_ms).sum();
        let revenue: u64 = r.buckets.iter().map(|b| b.revenue).sum();
        let surplus: i128 = r.buckets.iter().map(|b| b.surplus).sum();
        let failed: u64 = r.buckets.iter().map(|b| b.failed).sum();
        let at_risk: u64 = r.buckets.iter().map(|b| b.at_risk).sum();
        let profit: i128 = r.buckets.iter().map(|b| b.attacker_profit).sum();
        let caught: u64 = r.buckets.iter().map(|b| b.caught).sum();
        row.extend([
            rec.replication.to_string(),
            seed.to_string(),
            jobs.to_string(),
            matched.to_string(),
            abandoned.to_string(),
            f(ratio(u128::from(abandoned), u128::from(jobs))),
            f(ratio(u128::from(wait_sum), u128::from(matched)) / 1000.0),
            f(r.waits.quantile_s(0.5)),
            f(r.waits.quantile_s(0.9)),
            f(r.waits.quantile_s(0.99)),
            f(ratio(busy, online)),
        ]);
        for c in 0..classes.len() {
            let s: u128 = r.buckets.iter().map(|b| b.price_gpu_sum[c]).sum();
            let n: u64 = r.buckets.iter().map(|b| b.price_gpus[c]).sum();
            row.push(f(ratio(s, u128::from(n)) / 1e6));
        }
        row.extend([
            money(revenue),
            signed_money(surplus),
            r.leases.to_string(),
            failed.to_string(),
            money(at_risk),
            money(r.max_at_risk),
            r.bound_violations.to_string(),
            r.attacker_leases.to_string(),
            money(r.attacker_revenue),
            signed_money(profit),
            r.attacker_identities.to_string(),
            caught.to_string(),
            r.rejected_requests.to_string(),
            r.resubmitted.to_string(),
            f(revenue_gini(r)),
            r.events.to_string(),
            r.channel_reports.to_string(),
        ]);
        runs.rows.push(row);
        for (i, b) in r.buckets.iter().enumerate() {
            let mut row = vec![rec.point.to_string()];
            row.extend(pv.iter().cloned());
            row.extend([
                rec.replication.to_string(),
                i.to_string(),
                f((i as u64 * r.bucket_ms) as f64 / 3_600_000.0),
                b.arrivals.to_string(),
                b.matched.to_string(),
                b.abandoned.to_string(),
                f(ratio(u128::from(b.wait_sum_ms), u128::from(b.matched)) / 1000.0),
                b.queue_len.to_string(),
                f(ratio(b.busy_gpu_ms, b.online_gpu_ms)),
            ]);
            for c in 0..classes.len() {
                row.push(f(
                    ratio(b.price_gpu_sum[c], u128::from(b.price_gpus[c])) / 1e6
                ));
                row.push(b.price_gpus[c].to_string());
            }
            row.extend([
                money(b.revenue),
                signed_money(b.surplus),
                b.ended.to_string(),
                b.failed.to_string(),
                money(b.at_risk),
                signed_money(b.attacker_profit),
                b.caught.to_string(),
            ]);
            buckets.rows.push(row);
        }
        for (i, c) in r.waits.counts.iter().enumerate() {
            let edge = WAIT_BINS_S
                .get(i)
                .map_or("inf".to_string(), |e| e.to_string());
            waits.rows.push(vec![
                rec.point.to_string(),
                rec.replication.to_string(),
                edge,
                c.to_string(),
            ]);
        }
    }
    (runs, buckets, waits)
}

/// Columns of `runs.csv` that are identifiers, not metrics.
fn is_id(name: &str, params: usize, idx: usize) -> bool {
    idx <= params || name == "replication" || name == "seed"
}

/// Per point and numeric metric of `runs`: the [`Summary`] columns (mean, sd, quartiles,
/// Student-t 95/99 % and percentile-bootstrap 95/99 % intervals of the mean over
/// replications). The bootstrap stream is keyed by the base seed (the `seed` column), the point
/// and the metric's name, so a merged output's summary equals the unsharded one's.
pub fn summary(runs: &Table) -> Table {
    let params = runs.col("replication").unwrap_or(1).saturating_sub(1);
    let mut header: Vec<String> = runs.header[..=params].to_vec();
    header.push("metric".into());
    header.extend(Summary::COLUMNS.iter().map(|c| c.to_string()));
    let mut out = Table {
        header,
        rows: Vec::new(),
    };
    let seed = runs
        .col("seed")
        .and_then(|c| runs.rows.first().map(|r| r[c].parse::<u64>().unwrap_or(0)))
        .unwrap_or(0);
    let mut points: Vec<String> = runs.rows.iter().map(|r| r[0].clone()).collect();
    points.sort_by_key(|p| p.parse::<u64>().unwrap_or(u64::MAX));
    points.dedup();
    for point in points {
        let rows: Vec<&Vec<String>> = runs.rows.iter().filter(|r| r[0] == point).collect();
        for (ci, name) in runs.header.iter().enumerate() {
            if is_id(name, params, ci) {
                continue;
            }
            let xs: Vec<f64> = rows
                .iter()
                .filter_map(|r| r[ci].parse::<f64>().ok())
                .collect();
            if xs.is_empty() {
                continue;
            }
            let s = Summary::of(&xs, seed, stats::key(&format!("{point}/{name}")));
            let mut row: Vec<String> = rows[0][..=params].to_vec();
            row.push(name.clone());
            row.extend(s.cells());
            out.rows.push(row);
        }
    }
    out
}

/// The manifest (`manifest.json`), written by `run`/`sweep` and read back by `merge`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// `gridlease-sim` version.
    pub version: String,
    /// The git revision the binary was built from ([`git_revision`]).
    pub git_revision: Option<String>,
    /// Scenario name.
    pub scenario: String,
    /// SHA-256 of the base scenario's canonical TOML.
    pub scenario_hash: String,
    /// Base seed.
    pub seed: u64,
    /// Replications per point.
    pub replications: u64,
    /// Swept parameters and their values.
    pub sweep: Vec<(String, Vec<String>)>,
    /// Number of sweep points.
    pub points: usize,
    /// Shard `i/n`, if any.
    pub shard: Option<String>,
    /// Replications in this output.
    pub runs: usize,
    /// Files written.
    pub files: Vec<String>,
    /// Events processed (all runs).
    pub events: u64,
    /// Wall-clock seconds (not reproducible, informational only).
    pub wall_seconds: f64,
    /// Events per wall-clock second.
    pub events_per_second: f64,
    /// `merge` only: the shard directories merged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_from: Vec<String>,
    /// `merge` only: which shards and replications the merged output covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<crate::shards::Coverage>,
}

/// SHA-256 hex of a scenario's canonical TOML.
pub fn scenario_hash(s: &Scenario) -> String {
    hex::encode(Sha256::digest(s.to_toml().as_bytes()))
}

/// The git revision this binary was built from (`-dirty` when the simulator's sources differed
/// from it at build time; recorded by `build.rs`), or `None` when it was not built from a git
/// checkout. Never read from the directory a run starts in.
pub fn git_revision() -> Option<String> {
    option_env!("GRIDLEASE_SIM_GIT_REVISION").map(str::to_string)
}

/// Writes the tables, summary and plots into `dir`; returns the file names.
pub fn write_all(
    dir: &Path,
    runs: &Table,
    buckets: &Table,
    waits: &Table,
    plots: bool,
) -> Result<Vec<String>> {
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut files = Vec::new();
    for (name, t) in [
        ("runs.csv", runs),
        ("buckets.csv", buckets),
        ("waits.csv", waits),
    ] {
        t.write(&dir.join(name))?;
        files.push(name.to_string());
    }
    summary(runs).write(&dir.join("summary.csv"))?;
    files.push("summary.csv".into());
    if plots {
        files.extend(crate::plot::all(dir, runs, buckets, waits)?);
    }
    Ok(files)
}

/// Merges shard directories into `out`: tables concatenated and sorted by point, replication
/// and bucket; summary and plots recomputed.
pub fn merge(shards: &[&Path], out: &Path, plots: bool) -> Result<Vec<String>> {
    let mut merged: [Table; 3] = Default::default();
    for (k, name) in ["runs.csv", "buckets.csv", "waits.csv"].iter().enumerate() {
        for dir in shards {
            let t = Table::read(&dir.join(name))?;
            if merged[k].header.is_empty() {
                merged[k].header = t.header.clone();
            } else if merged[k].header != t.header {
                bail!("{} in {} has different columns", name, dir.display());
            }
            merged[k].rows.extend(t.rows);
        }
        let t = &mut merged[k];
        let rep = t.col("replication").unwrap_or(1);
        let sub = t.col("bucket").or_else(|| t.col("bin_upper_s"));
        let num = |s: &str| s.parse::<f64>().unwrap_or(f64::INFINITY);
        t.rows.sort_by(|a, b| {
            num(&a[0])
                .total_cmp(&num(&b[0]))
                .then(num(&a[rep]).total_cmp(&num(&b[rep])))
                .then(sub.map_or(std::cmp::Ordering::Equal, |s| {
                    num(&a[s]).total_cmp(&num(&b[s]))
                }))
        });
        t.rows.dedup();
    }
    let [runs, buckets, waits] = merged;
    write_all(out, &runs, &buckets, &waits, plots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_tasks() {
        let all = tasks(3, 4, None);
        let mut union: Vec<_> = (0..5).flat_map(|i| tasks(3, 4, Some((i, 5)))).collect();
        union.sort_unstable();
        assert_eq!(union, all);
        assert_eq!(all.len(), 12);
    }
}
