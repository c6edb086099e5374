//! Running replications and sweeps, and writing what they produce: `runs.csv` (one row per
//! replication), `buckets.csv` (one row per replication and time bucket), `waits.csv`
//! (wait-time histograms), `providers.csv` and `renters.csv` (one row per agent and
//! replication), `summary.csv` (mean, quartiles and 95/99 % intervals per sweep point and
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
use sha2::{Digest, Sha256};

pub use crate::manifest::{Manifest, TraceInfo};
use crate::market::{Market, Mechanism, PricingHook, RunResult, no_pricing, revenue_gini};
use crate::metrics::{Bucket, Population, WAIT_BINS_S};
use crate::scenario::{Attack, Scenario};
use crate::stats::{self, Summary};
pub use crate::table::Table;

/// One sweep point: the parameter settings and the scenario they produce.
#[derive(Clone, Debug)]
pub struct Point {
    /// `(key, value)` pairs applied to the base scenario.
    pub params: Vec<(String, String)>,
    /// The resulting scenario.
    pub scenario: Scenario,
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
    execute_with(points, tasks, seed, tick, &crate::market::builtin)
}

/// [`execute`] with a mechanism of the caller's instead of the scenario's `matching`:
/// `mechanism` builds a fresh one for each (point, replication).
pub fn execute_with(
    points: &[Point],
    tasks: &[(usize, u64)],
    seed: u64,
    tick: &(dyn Fn(u64) + Sync),
    mechanism: &(dyn Fn(&Scenario) -> Box<dyn Mechanism> + Sync),
) -> Vec<Record> {
    run_tasks(points, tasks, seed, tick, mechanism, &no_pricing, None)
}

/// [`execute_with`] with pricing strategies of the caller's as well: `pricing` gives a
/// provider group's strategy where it replaces the group's setting (see
/// [`Market::with_plugins`]).
pub fn execute_plugins(
    points: &[Point],
    tasks: &[(usize, u64)],
    seed: u64,
    tick: &(dyn Fn(u64) + Sync),
    mechanism: &(dyn Fn(&Scenario) -> Box<dyn Mechanism> + Sync),
    pricing: &PricingHook,
) -> Vec<Record> {
    run_tasks(points, tasks, seed, tick, mechanism, pricing, None)
}

/// [`execute`] with an event trace ([`trace_table`]) of at most `rows_per_run` rows per run
/// (the first events of each run; the rest are counted in its `trace.dropped`).
pub fn execute_traced(
    points: &[Point],
    tasks: &[(usize, u64)],
    seed: u64,
    tick: &(dyn Fn(u64) + Sync),
    rows_per_run: usize,
) -> Vec<Record> {
    run_tasks(
        points,
        tasks,
        seed,
        tick,
        &crate::market::builtin,
        &no_pricing,
        Some(rows_per_run),
    )
}

fn run_tasks(
    points: &[Point],
    tasks: &[(usize, u64)],
    seed: u64,
    tick: &(dyn Fn(u64) + Sync),
    mechanism: &(dyn Fn(&Scenario) -> Box<dyn Mechanism> + Sync),
    pricing: &PricingHook,
    trace: Option<usize>,
) -> Vec<Record> {
    let track = tracks_network(points);
    tasks
        .par_iter()
        .map(|&(point, replication)| {
            let sc = &points[point].scenario;
            let mut market = Market::with_plugins(sc, seed, replication, mechanism(sc), pricing);
            if track {
                market = market.track_network_scores();
            }
            if let Some(rows) = trace {
                market = market.with_trace(rows);
            }
            let result = market.run_observed(tick);
            Record {
                point,
                replication,
                result,
            }
        })
        .collect()
}

/// Whether a study keeps the completion record pool and network scores in every point: when
/// one of its points uses the network mode or has self-dealing providers (so that a sweep
/// over `reputation.mode` reports the network score in the local points too). Studies without
/// either write exactly the columns they always did.
pub fn tracks_network(points: &[Point]) -> bool {
    points.iter().any(|p| {
        p.scenario.reputation.network() || p.scenario.provider.iter().any(|g| g.self_dealing)
    })
}

/// Whether a study reports the no-show and false-class columns: when one of its points has
/// such a provider group (other studies keep their columns and bytes).
pub fn tracks_attacks(points: &[Point]) -> bool {
    points.iter().any(|p| {
        p.scenario
            .provider
            .iter()
            .any(|g| matches!(g.attack, Attack::NoShow | Attack::FalseClass))
    })
}

/// The no-show and false-class columns of `runs.csv` and `buckets.csv` (after the network
/// ones), from one bucket or a run's total.
fn attack_cells(b: &Bucket) -> Vec<(String, String)> {
    vec![
        ("no_shows".into(), b.no_shows.to_string()),
        (
            "no_show_lost_s".into(),
            f(b.no_show_lost_ms as f64 / 1000.0),
        ),
        (
            "false_class_detected".into(),
            b.false_class_detected.to_string(),
        ),
        (
            "false_class_lost_s".into(),
            f(b.false_class_lost_ms as f64 / 1000.0),
        ),
        (
            "false_class_undetected".into(),
            b.false_class_undetected.to_string(),
        ),
        (
            "false_class_shortfall".into(),
            money(b.false_class_shortfall),
        ),
    ]
}

/// The network reputation columns of `runs.csv` and `buckets.csv` (after the others), from
/// one bucket or a run's total; `groups` are the provider groups' names.
fn network_cells(b: &Bucket, groups: &[String]) -> Vec<(String, String)> {
    let [h, a] = &b.pop;
    let mut cells = vec![
        ("honest_score".into(), f(b.score[0])),
        ("attacker_score".into(), f(b.score[1])),
        (
            "attacker_share".into(),
            f(ratio(u128::from(a.leases), u128::from(a.leases + h.leases))),
        ),
        ("attacker_failed_paid".into(), money(a.failed_paid)),
        ("self_dealt_records".into(), b.self_dealt.to_string()),
    ];
    for (i, g) in groups.iter().enumerate() {
        let s = b.group_score.get(i).copied().unwrap_or(0.0);
        cells.push((format!("score_{g}"), f(s)));
    }
    cells
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

/// The columns `runs.csv` and `buckets.csv` share, computed from one bucket or from a run's
/// total (see `docs/simulations.md` for each definition). Names and cells in column order.
fn bucket_cells(b: &Bucket, classes: &[String]) -> Vec<(String, String)> {
    let [h, a] = &b.pop;
    let mut c: Vec<(String, String)> = Vec::new();
    let mut push = |name: &str, cell: String| c.push((name.to_string(), cell));
    push("jobs", b.jobs.to_string());
    push("jobs_matched", b.jobs_matched.to_string());
    push("jobs_abandoned", b.jobs_abandoned.to_string());
    push("resubmissions", b.resubmissions.to_string());
    push("resubmissions_matched", b.resubmissions_matched.to_string());
    push(
        "resubmissions_abandoned",
        b.resubmissions_abandoned.to_string(),
    );
    push("leases", b.leases().to_string());
    push(
        "mean_wait_s",
        f(ratio(u128::from(b.wait_sum_ms), u128::from(b.jobs_matched)) / 1000.0),
    );
    push(
        "resubmission_mean_wait_s",
        f(ratio(
            u128::from(b.resubmission_wait_sum_ms),
            u128::from(b.resubmissions_matched),
        ) / 1000.0),
    );
    push(
        "utilization",
        f(ratio(
            h.busy_gpu_ms + a.busy_gpu_ms,
            h.online_gpu_ms + a.online_gpu_ms,
        )),
    );
    for (pop, pb) in Population::ALL.iter().zip(&b.pop) {
        let n = pop.name();
        push(
            &format!("{n}_utilization"),
            f(ratio(pb.busy_gpu_ms, pb.online_gpu_ms)),
        );
    }
    for (ci, class) in classes.iter().enumerate() {
        for (pop, pb) in Population::ALL.iter().zip(&b.pop) {
            let n = pop.name();
            push(
                &format!("{n}_price_{class}"),
                f(ratio(pb.price_gpu_sum[ci], u128::from(pb.price_gpus[ci])) / 1e6),
            );
            push(&format!("{n}_gpus_{class}"), pb.price_gpus[ci].to_string());
        }
    }
    for (pop, pb) in Population::ALL.iter().zip(&b.pop) {
        let n = pop.name();
        push(&format!("{n}_leases"), pb.leases.to_string());
        push(&format!("{n}_ended_leases"), pb.ended.to_string());
        push(&format!("{n}_failed_leases"), pb.failed.to_string());
        push(
            &format!("{n}_gpu_hours"),
            f(pb.used_gpu_ms as f64 / 3_600_000.0),
        );
        push(&format!("{n}_revenue"), money(pb.revenue));
        push(&format!("{n}_renter_surplus"), signed_money(pb.surplus));
    }
    push("renter_surplus", signed_money(h.surplus + a.surplus));
    push("money_at_risk", money(h.unpaid));
    push("attacker_unpaid", money(a.unpaid));
    push("attacker_profit", signed_money(b.attacker_profit));
    push("inflation_caught", b.caught.to_string());
    // Welfare (crate::welfare), GLU: realised + the five losses = the maximum.
    let w = &b.welfare;
    let glu = |micros: f64| f(micros / 1e6);
    push("welfare_max", glu(w.max));
    push("welfare_realised_surplus", glu(w.realised));
    push(
        "welfare_efficiency",
        w.efficiency().map_or(String::new(), f),
    );
    push("welfare_renter_surplus", glu(w.renter));
    push("welfare_provider_surplus", glu(w.provider));
    push("welfare_lost_unserved", glu(w.unserved));
    push(
        "welfare_lost_extramarginal_demand",
        glu(w.extramarginal_demand),
    );
    push("welfare_lost_idle_supply", glu(w.idle_supply));
    push(
        "welfare_lost_extramarginal_supply",
        glu(w.extramarginal_supply),
    );
    push("welfare_lost_delivery", glu(w.delivery));
    c
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
    let shared: Vec<String> = bucket_cells(&Bucket::new(classes.len()), &classes)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let mut runs = Table {
        header: vec!["point".to_string()],
        rows: Vec::new(),
    };
    runs.header.extend(param_names.iter().cloned());
    runs.header.extend(["replication".into(), "seed".into()]);
    runs.header.extend(shared.iter().cloned());
    for h in [
        "jobs_waiting",
        "resubmissions_waiting",
        "abandonment_rate",
        "p50_wait_s",
        "p90_wait_s",
        "p99_wait_s",
        "max_at_risk",
        "bound_violations",
        "attacker_identities",
        "rejected_requests",
        "revenue_gini",
        "events",
        "channel_reports",
    ] {
        runs.header.push(h.into());
    }
    let net = records.iter().any(|r| r.result.network.is_some());
    let groups: Vec<String> = points
        .first()
        .map(|p| p.scenario.provider.iter().map(|g| g.name.clone()).collect())
        .unwrap_or_default();
    let net_names: Vec<String> = network_cells(&Bucket::new(classes.len()), &groups)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    if net {
        runs.header.extend(net_names.iter().cloned());
        runs.header.push("score_recomputes".into());
    }
    let attacks = tracks_attacks(points);
    let attack_names: Vec<String> = attack_cells(&Bucket::new(classes.len()))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    if attacks {
        runs.header.extend(attack_names.iter().cloned());
    }
    let mut buckets = Table {
        header: vec!["point".to_string()],
        rows: Vec::new(),
    };
    buckets.header.extend(param_names.iter().cloned());
    buckets
        .header
        .extend(["replication".into(), "bucket".into(), "t_start_h".into()]);
    buckets.header.extend(shared.iter().cloned());
    buckets.header.push("queue_len".into());
    if net {
        buckets.header.extend(net_names.iter().cloned());
    }
    if attacks {
        buckets.header.extend(attack_names.iter().cloned());
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
        let mut total = Bucket::new(classes.len());
        for b in &r.buckets {
            total.absorb(b);
        }
        let mut row = vec![rec.point.to_string()];
        row.extend(pv.iter().cloned());
        row.extend([rec.replication.to_string(), seed.to_string()]);
        row.extend(bucket_cells(&total, &classes).into_iter().map(|(_, v)| v));
        row.extend([
            r.jobs_waiting_at_end.to_string(),
            r.resubmissions_waiting_at_end.to_string(),
            f(ratio(
                u128::from(total.jobs_abandoned),
                u128::from(total.jobs),
            )),
            f(r.waits.quantile_s(0.5)),
            f(r.waits.quantile_s(0.9)),
            f(r.waits.quantile_s(0.99)),
            money(r.max_at_risk),
            r.bound_violations.to_string(),
            r.attacker_identities.to_string(),
            r.rejected_requests.to_string(),
            f(revenue_gini(r)),
            r.events.to_string(),
            r.channel_reports.to_string(),
        ]);
        if net {
            row.extend(network_cells(&total, &groups).into_iter().map(|(_, v)| v));
            row.push(r.network.as_ref().map_or(0, |n| n.recomputes).to_string());
        }
        if attacks {
            row.extend(attack_cells(&total).into_iter().map(|(_, v)| v));
        }
        runs.rows.push(row);
        for (i, b) in r.buckets.iter().enumerate() {
            let mut row = vec![rec.point.to_string()];
            row.extend(pv.iter().cloned());
            row.extend([
                rec.replication.to_string(),
                i.to_string(),
                f((i as u64 * r.bucket_ms) as f64 / 3_600_000.0),
            ]);
            row.extend(bucket_cells(b, &classes).into_iter().map(|(_, v)| v));
            row.push(b.queue_len.to_string());
            if net {
                row.extend(network_cells(b, &groups).into_iter().map(|(_, v)| v));
            }
            if attacks {
                row.extend(attack_cells(b).into_iter().map(|(_, v)| v));
            }
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

/// The per-agent tables: `providers.csv` (one row per point, replication and provider) and
/// `renters.csv` (one per point, replication and renter).
pub fn agent_tables(points: &[Point], records: &[Record]) -> (Table, Table) {
    let param_names: Vec<String> = points
        .first()
        .map(|p| p.params.iter().map(|(k, _)| k.clone()).collect())
        .unwrap_or_default();
    let head = |cols: &[&str]| {
        let mut h = vec!["point".to_string()];
        h.extend(param_names.iter().cloned());
        h.extend(cols.iter().map(|c| c.to_string()));
        h
    };
    let mut providers = Table {
        header: head(&[
            "replication",
            "provider",
            "group",
            "population",
            "class",
            "gpus",
            "identities",
            "leases",
            "ended_leases",
            "failed_leases",
            "gpu_hours",
            "online_hours",
            "utilization",
            "revenue",
            "unpaid",
        ]),
        rows: Vec::new(),
    };
    let net = records.iter().any(|r| r.result.network.is_some());
    if net {
        providers
            .header
            .extend(["score".to_string(), "records".to_string()]);
    }
    let mut renters = Table {
        header: head(&[
            "replication",
            "renter",
            "group",
            "jobs",
            "jobs_matched",
            "jobs_abandoned",
            "resubmissions",
            "leases",
            "mean_wait_s",
            "paid",
            "renter_surplus",
        ]),
        rows: Vec::new(),
    };
    for rec in records {
        let r = &rec.result;
        let sc = &points[rec.point].scenario;
        let mut lead = vec![rec.point.to_string()];
        lead.extend(points[rec.point].params.iter().map(|(_, v)| v.clone()));
        lead.push(rec.replication.to_string());
        for (i, st) in r.provider_stats.iter().enumerate() {
            let g = &sc.provider[r.provider_group[i]];
            let mut row = lead.clone();
            row.extend([
                i.to_string(),
                g.name.clone(),
                Population::of(r.provider_attacker[i]).name().to_string(),
                g.class.clone(),
                g.gpus.to_string(),
                st.identities.to_string(),
                st.leases.to_string(),
                st.ended.to_string(),
                st.failed.to_string(),
                f(st.used_gpu_ms as f64 / 3_600_000.0),
                f(st.online_ms as f64 / 3_600_000.0),
                f(ratio(
                    st.busy_gpu_ms,
                    u128::from(st.online_ms) * u128::from(g.gpus),
                )),
                money(r.provider_revenue[i]),
                money(st.unpaid),
            ]);
            if net {
                let n = r.network.as_ref();
                row.extend([
                    f(n.map_or(0.0, |n| n.provider_score[i])),
                    n.map_or(0, |n| n.provider_records[i]).to_string(),
                ]);
            }
            providers.rows.push(row);
        }
        for (i, st) in r.renter_stats.iter().enumerate() {
            let mut row = lead.clone();
            row.extend([
                i.to_string(),
                sc.renter[r.renter_group[i]].name.clone(),
                st.jobs.to_string(),
                st.jobs_matched.to_string(),
                st.jobs_abandoned.to_string(),
                st.resubmissions.to_string(),
                st.leases.to_string(),
                f(ratio(u128::from(st.wait_sum_ms), u128::from(st.jobs_matched)) / 1000.0),
                money(st.paid),
                signed_money(st.surplus),
            ]);
            renters.rows.push(row);
        }
    }
    (providers, renters)
}

/// Most rows `--trace-max-rows` may ask for (about 1.5 GB of CSV).
pub const TRACE_ROWS_LIMIT: usize = 20_000_000;
/// Default of `--trace-max-rows`.
pub const TRACE_ROWS_DEFAULT: usize = 1_000_000;

/// The rows each run of a study of `runs` runs (all shards) may trace so that the whole
/// trace stays within `max_rows` (at least one).
pub fn trace_rows_per_run(max_rows: usize, runs: usize) -> usize {
    (max_rows / runs.max(1)).max(1)
}

/// `trace.csv`: one row per traced event of every record, in (point, replication, event)
/// order: `point`, swept keys, `replication`, `t_s` (simulated seconds, ms precision),
/// `kind`, `renter`, `provider`, `identity`, `lease`, `amount` (GLU: the price per GPU-hour at
/// a lease start, the amount paid at its end), `reason` (why a lease ended); cells that do not
/// apply are empty. Returns the table and the rows dropped by the per-run cap.
pub fn trace_table(points: &[Point], records: &[Record]) -> (Table, u64) {
    let mut t = Table {
        header: vec!["point".to_string()],
        rows: Vec::new(),
    };
    if let Some(p) = points.first() {
        t.header.extend(p.params.iter().map(|(k, _)| k.clone()));
    }
    t.header.extend(
        [
            "replication",
            "t_s",
            "kind",
            "renter",
            "provider",
            "identity",
            "lease",
            "amount",
            "reason",
        ]
        .map(String::from),
    );
    let opt = |v: Option<String>| v.unwrap_or_default();
    let mut dropped = 0;
    for rec in records {
        let Some(trace) = &rec.result.trace else {
            continue;
        };
        dropped += trace.dropped;
        let pv: Vec<String> = points[rec.point]
            .params
            .iter()
            .map(|(_, v)| v.clone())
            .collect();
        for e in &trace.rows {
            let mut row = vec![rec.point.to_string()];
            row.extend(pv.iter().cloned());
            row.extend([
                rec.replication.to_string(),
                format!("{}.{:03}", e.t_ms / 1000, e.t_ms % 1000),
                e.kind.name().to_string(),
                opt(e.renter.map(|v| v.to_string())),
                opt(e.provider.map(|v| v.to_string())),
                opt(e.identity.map(|v| v.to_string())),
                opt(e.lease.map(|v| v.to_string())),
                opt(e.amount.map(|m| m.to_string())),
                opt(e.reason.map(|r| format!("{r:?}"))),
            ]);
            t.rows.push(row);
        }
    }
    (t, dropped)
}

/// Every table `run`, `sweep` and `merge` write, in this order.
pub const TABLES: [&str; 6] = [
    "runs.csv",
    "buckets.csv",
    "waits.csv",
    "summary.csv",
    "providers.csv",
    "renters.csv",
];

/// Writes `providers.csv` and `renters.csv` into `dir`; returns the file names.
pub fn write_agents(dir: &Path, providers: &Table, renters: &Table) -> Result<Vec<String>> {
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    providers.write(&dir.join("providers.csv"))?;
    renters.write(&dir.join("renters.csv"))?;
    Ok(vec!["providers.csv".into(), "renters.csv".into()])
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
            let s = Summary::of(
                &xs,
                seed,
                stats::key(&format!("{point}/{name}")),
                stats::Bounds::of(name),
            );
            let mut row: Vec<String> = rows[0][..=params].to_vec();
            row.push(name.clone());
            row.extend(s.cells());
            out.rows.push(row);
        }
    }
    out
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
/// and bucket (bin, provider, renter); summary and plots recomputed.
pub fn merge(shards: &[&Path], out: &Path, plots: bool) -> Result<Vec<String>> {
    const NAMES: [&str; 5] = [
        "runs.csv",
        "buckets.csv",
        "waits.csv",
        "providers.csv",
        "renters.csv",
    ];
    let mut merged: [Table; 5] = Default::default();
    for (k, name) in NAMES.iter().enumerate() {
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
        let sub = ["bucket", "bin_upper_s", "provider", "renter"]
            .iter()
            .find_map(|c| t.col(c));
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
    let [runs, buckets, waits, providers, renters] = merged;
    let mut files = write_all(out, &runs, &buckets, &waits, plots)?;
    files.extend(write_agents(out, &providers, &renters)?);
    Ok(files)
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
