//! The metrics' definitions (docs/simulations.md, "Metrics"): their invariants on the attack
//! scenario and on every example, a small market whose values are computed by hand,
//! attackers' refused usage kept out of the honest providers' money at risk, and the
//! per-agent tables (`providers.csv`, `renters.csv`) adding up to the run's totals.

// Helpers outside #[test] fns: a panic here is still a test failure with a location.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::path::Path;

use gridlease_sim::output::{self, Point, Table};
use gridlease_sim::scenario::Scenario;

fn scenario(name: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"));
    Scenario::load(&path).unwrap()
}

fn tables(s: &Scenario, seed: u64, reps: u64) -> (Table, Table) {
    let points = vec![Point {
        params: Vec::new(),
        scenario: s.clone(),
    }];
    let tasks = output::tasks(1, reps, None);
    let records = output::execute(&points, &tasks, seed, &|_| {});
    let (runs, buckets, _) = output::tables(&points, &records, seed);
    (runs, buckets)
}

/// `providers.csv` and `renters.csv` of the same runs.
fn agents(s: &Scenario, seed: u64, reps: u64) -> (Table, Table) {
    let points = vec![Point {
        params: Vec::new(),
        scenario: s.clone(),
    }];
    let tasks = output::tasks(1, reps, None);
    let records = output::execute(&points, &tasks, seed, &|_| {});
    output::agent_tables(&points, &records)
}

/// Sum of an agent-table column over one replication's rows, optionally of one population.
fn agent_sum(t: &Table, replication: usize, population: Option<&str>, name: &str) -> f64 {
    let rc = t.col("replication").unwrap();
    let pc = t.col("population");
    (0..t.rows.len())
        .filter(|&i| t.rows[i][rc] == replication.to_string())
        .filter(|&i| population.is_none_or(|p| pc.is_some_and(|c| t.rows[i][c] == p)))
        .map(|i| num(t, i, name))
        .sum()
}

/// The per-agent tables add up to the run's totals.
fn check_agents(name: &str, s: &Scenario, seed: u64, reps: u64, runs: &Table) {
    let (providers, renters) = agents(s, seed, reps);
    let n_providers: u64 = s.provider.iter().map(|g| u64::from(g.count)).sum();
    let n_renters: u64 = s.renter.iter().map(|g| u64::from(g.count)).sum();
    assert_eq!(providers.rows.len() as u64, n_providers * reps, "{name}");
    assert_eq!(renters.rows.len() as u64, n_renters * reps, "{name}");
    for row in 0..reps as usize {
        // Hours are written to 6 decimals per row, so their sums may differ by half a unit
        // of the last digit per row; counts and money (exact micro-units) agree exactly.
        let tolerance = 1e-6 + 5e-7 * n_providers as f64;
        let close = |a: f64, b: f64, what: &str| {
            assert!(
                (a - b).abs() <= tolerance,
                "{name} rep {row}: {what}: {a} vs {b}"
            );
        };
        let v = |n: &str| num(runs, row, n);
        close(
            agent_sum(&providers, row, None, "leases"),
            v("leases"),
            "leases",
        );
        for pop in ["honest", "attacker"] {
            for (agent, total) in [
                ("leases", "leases"),
                ("ended_leases", "ended_leases"),
                ("failed_leases", "failed_leases"),
                ("gpu_hours", "gpu_hours"),
                ("revenue", "revenue"),
            ] {
                close(
                    agent_sum(&providers, row, Some(pop), agent),
                    v(&format!("{pop}_{total}")),
                    &format!("{pop} {agent}"),
                );
            }
        }
        close(
            agent_sum(&providers, row, Some("honest"), "unpaid"),
            v("money_at_risk"),
            "money_at_risk",
        );
        close(
            agent_sum(&providers, row, Some("attacker"), "unpaid"),
            v("attacker_unpaid"),
            "attacker_unpaid",
        );
        close(
            agent_sum(&providers, row, Some("attacker"), "identities"),
            v("attacker_identities"),
            "attacker_identities",
        );
        for col in [
            "jobs",
            "jobs_matched",
            "jobs_abandoned",
            "resubmissions",
            "leases",
        ] {
            close(agent_sum(&renters, row, None, col), v(col), col);
        }
        close(
            agent_sum(&renters, row, None, "renter_surplus"),
            v("renter_surplus"),
            "renter_surplus",
        );
        close(
            agent_sum(&renters, row, None, "paid"),
            v("honest_revenue") + v("attacker_revenue"),
            "paid",
        );
        let rc = providers.col("replication").unwrap();
        for i in (0..providers.rows.len()).filter(|&i| providers.rows[i][rc] == row.to_string()) {
            let u = num(&providers, i, "utilization");
            assert!((0.0..=1.0 + 1e-9).contains(&u), "{name}: utilization {u}");
        }
    }
}

fn num(t: &Table, row: usize, name: &str) -> f64 {
    let c = t
        .col(name)
        .unwrap_or_else(|| panic!("no column {name:?} in {:?}", t.header));
    t.rows[row][c].parse().unwrap()
}

/// Sum of a `buckets.csv` column over one replication's buckets.
fn bucket_sum(b: &Table, replication: usize, name: &str) -> f64 {
    let rc = b.col("replication").unwrap();
    (0..b.rows.len())
        .filter(|&i| b.rows[i][rc] == replication.to_string())
        .map(|i| num(b, i, name))
        .sum()
}

/// The documented invariants of one `runs.csv` row (and its buckets).
fn check_invariants(name: &str, runs: &Table, buckets: &Table, row: usize) {
    let v = |n: &str| num(runs, row, n);
    let jobs = v("jobs");
    let resub = v("resubmissions");
    assert!(v("jobs_matched") <= jobs, "{name}: jobs_matched > jobs");
    assert_eq!(
        jobs,
        v("jobs_matched") + v("jobs_abandoned") + v("jobs_waiting"),
        "{name}: jobs = jobs_matched + jobs_abandoned + jobs_waiting"
    );
    assert_eq!(
        resub,
        v("resubmissions_matched") + v("resubmissions_abandoned") + v("resubmissions_waiting"),
        "{name}: resubmissions split"
    );
    assert_eq!(
        v("leases"),
        v("jobs_matched") + v("resubmissions_matched"),
        "{name}: leases = jobs_matched + resubmissions_matched"
    );
    assert_eq!(
        v("leases"),
        v("honest_leases") + v("attacker_leases"),
        "{name}: leases = honest_leases + attacker_leases"
    );
    assert!(
        resub <= v("honest_failed_leases") + v("attacker_failed_leases"),
        "{name}: every resubmission follows a failed lease"
    );
    for pop in ["honest", "attacker"] {
        assert!(v(&format!("{pop}_failed_leases")) <= v(&format!("{pop}_ended_leases")));
        assert!(v(&format!("{pop}_ended_leases")) <= v(&format!("{pop}_leases")));
    }
    // Network reputation's sums (when the study has them): the money renters paid for
    // attackers' failed leases is part of what attackers were paid.
    if runs.col("self_dealt_records").is_some() {
        for col in ["attacker_failed_paid", "self_dealt_records"] {
            let total = bucket_sum(buckets, row, col);
            assert!((total - v(col)).abs() < 1e-6, "{name}: {col}");
        }
        assert!(v("attacker_failed_paid") <= v("attacker_revenue"), "{name}");
    }
    let rate = v("abandonment_rate");
    assert!((rate - v("jobs_abandoned") / jobs.max(1.0)).abs() < 1e-6);
    // runs.csv totals are the sums of buckets.csv.
    for col in [
        "jobs",
        "jobs_matched",
        "jobs_abandoned",
        "resubmissions",
        "resubmissions_matched",
        "leases",
        "honest_leases",
        "attacker_leases",
        "honest_revenue",
        "attacker_revenue",
        "money_at_risk",
        "attacker_unpaid",
        "inflation_caught",
    ] {
        let total = bucket_sum(buckets, row, col);
        assert!(
            (total - v(col)).abs() < 1e-6,
            "{name}: {col}: runs {} vs buckets {total}",
            v(col)
        );
    }
}

#[test]
fn attack_scenario_metrics_are_consistent_and_split_by_population() {
    // attack.toml as shipped (renters default on 5 % of leases), shortened to 12 h.
    let mut s = scenario("attack");
    s.days = 0.5;
    let (runs, buckets) = tables(&s, 1, 2);
    check_agents("attack", &s, 1, 2, &runs);
    for row in 0..2 {
        check_invariants("attack", &runs, &buckets, row);
        let v = |n: &str| num(&runs, row, n);
        println!(
            "attack rep {row}: jobs {}, jobs_matched {}, resubmissions {}, leases {}, \
             honest/attacker leases {}/{}, money_at_risk {}, attacker_unpaid {}",
            v("jobs"),
            v("jobs_matched"),
            v("resubmissions"),
            v("leases"),
            v("honest_leases"),
            v("attacker_leases"),
            v("money_at_risk"),
            v("attacker_unpaid"),
        );
        // The shape the issue reported: far more leases than jobs, all of the excess
        // resubmissions after refused (inflated) usage.
        assert!(v("leases") > 10.0 * v("jobs"));
        assert!(v("jobs_matched") <= v("jobs"));
        // Attackers' own refused usage is theirs, not the providers' loss: it is reported
        // apart and is what their profit over honest billing lacks (they are paid nothing).
        assert!(v("attacker_unpaid") > 1.0);
        assert_eq!(v("attacker_revenue"), 0.0);
        assert!((v("attacker_unpaid") + v("attacker_profit")).abs() < 1e-6);
        // Honest providers lose at most one pay-ahead window + one interval per failed lease
        // (0.40/h x 180 s = 0.02 each), far below the attackers' refused usage.
        assert!(v("money_at_risk") <= v("honest_failed_leases") * 0.020001);
        assert!(v("money_at_risk") < v("attacker_unpaid") / 10.0);
        // Prices per population: each group's own fixed price.
        assert_eq!(v("honest_price_rtx4090"), 0.40);
        assert_eq!(v("attacker_price_rtx4090"), 0.30);
    }
}

#[test]
fn attacker_refused_usage_is_not_in_money_at_risk() {
    // Nothing can make an honest provider lose money here (no crashes, every renter pays):
    // money at risk must be exactly zero however much attackers' usage is refused.
    let mut s = scenario("attack");
    s.days = 0.5;
    for r in &mut s.renter {
        r.default_probability = 0.0;
    }
    let (runs, buckets) = tables(&s, 3, 1);
    check_invariants("attack, paying renters", &runs, &buckets, 0);
    assert_eq!(num(&runs, 0, "money_at_risk"), 0.0);
    assert_eq!(num(&runs, 0, "max_at_risk"), 0.0);
    assert_eq!(num(&runs, 0, "honest_failed_leases"), 0.0);
    assert!(num(&runs, 0, "attacker_unpaid") > 1.0);
}

#[test]
fn invariants_hold_in_every_example_scenario() {
    for name in [
        "baseline",
        "home-diurnal",
        "oversupply",
        "undersupply",
        "reverse-auction",
        "double-auction",
        "sybil",
        "no-show",
        "false-class",
    ] {
        let mut s = scenario(name);
        s.days = 0.5;
        let (runs, buckets) = tables(&s, 2, 2);
        check_agents(name, &s, 2, 2, &runs);
        for row in 0..2 {
            check_invariants(name, &runs, &buckets, row);
        }
    }
}

/// One honest provider (1 GPU, fixed 0.50/GPU-hour), one attacker (fixed 0.30, inflating
/// 1.5x, no whitewashing), one renter: every job is one GPU for exactly 60 min, valued at
/// exactly 0.80/GPU-hour, with (nearly) endless patience.
const HAND: &str = r#"
name = "hand"
days = 2.0
[reputation]
enabled = true
min_permille = 300
trust_newcomers = true
[[provider]]
name = "honest"
count = 1
pricing = { strategy = "fixed", price = "0.50" }
[[provider]]
name = "attacker"
count = 1
cost_floor = "0.01"
pricing = { strategy = "fixed", price = "0.30" }
attack = "usage_inflation"
inflation_permille = 1500
[[renter]]
name = "renter"
count = 1
jobs_per_day = 4.0
duration_median_minutes = 60.0
duration_sigma = 0.0
valuation_median = "0.80"
valuation_sigma = 0.0
patience_mean_minutes = 1000000.0
"#;

#[test]
fn hand_computed_small_market() {
    let s = Scenario::from_toml(HAND).unwrap();
    let (runs, buckets) = tables(&s, 1, 1);
    check_invariants("hand", &runs, &buckets, 0);
    check_agents("hand", &s, 1, 1, &runs);
    // Per agent: the attacker (row 1) ran the one caught lease; the honest provider (row 0)
    // ran every other; the renter made every job.
    let (providers, renters) = agents(&s, 1, 1);
    assert_eq!(num(&providers, 1, "leases"), 1.0);
    assert_eq!(num(&providers, 1, "unpaid"), 0.005);
    assert_eq!(
        providers.rows[1][providers.col("population").unwrap()],
        "attacker"
    );
    assert_eq!(num(&providers, 0, "leases"), num(&runs, 0, "honest_leases"));
    assert_eq!(num(&renters, 0, "jobs"), num(&runs, 0, "jobs"));
    // One GPU online for the whole 48 h.
    assert!((num(&providers, 0, "online_hours") - 48.0).abs() < 1e-6);
    let v = |n: &str| num(&runs, 0, n);
    println!(
        "hand: jobs {}, honest ended {}, honest GPU-h {}, honest revenue {}",
        v("jobs"),
        v("honest_ended_leases"),
        v("honest_gpu_hours"),
        v("honest_revenue")
    );
    assert!(v("jobs") >= 3.0, "too few jobs to check anything");
    // The renter tries the cheaper attacker first; its first report (60 s of real use claimed
    // as 90 s) is refused, the renter distrusts that identity forever and resubmits the
    // remaining 3540 s, which the honest provider runs.
    assert_eq!(v("attacker_leases"), 1.0);
    assert_eq!(v("inflation_caught"), 1.0);
    assert_eq!(v("resubmissions"), 1.0);
    assert_eq!(v("resubmissions_matched"), 1.0);
    assert_eq!(v("attacker_revenue"), 0.0);
    // Refused use: 60 s at 0.30/h = 0.005; the renter's surplus on it: 60 s at 0.80/h, paid 0.
    assert_eq!(v("attacker_unpaid"), 0.005);
    assert_eq!(v("attacker_profit"), -0.005);
    assert!((v("attacker_gpu_hours") - 60.0 / 3600.0).abs() < 1e-6);
    assert!((v("attacker_renter_surplus") - 60.0 * 0.80 / 3600.0).abs() < 2e-6);
    // Nobody honest lost anything.
    assert_eq!(v("money_at_risk"), 0.0);
    assert_eq!(v("honest_failed_leases"), 0.0);
    // Honest leases: each ran its full length (3600 s, or 3540 s for the resubmitted rest), so
    // GPU-hours are whole hours, less 1/60 h if the resubmitted lease has ended; revenue is
    // 0.50 per GPU-hour and the renter's surplus 0.80 - 0.50 per GPU-hour (per-second billing
    // floors each lease's amount to the micro-unit).
    let ended = v("honest_ended_leases");
    let hours = v("honest_gpu_hours");
    let full = ended - 1.0 + 3540.0 / 3600.0;
    assert!(
        (hours - ended).abs() < 1e-6 || (hours - full).abs() < 1e-6,
        "honest GPU-hours {hours} with {ended} ended leases"
    );
    assert!((v("honest_revenue") - 0.50 * hours).abs() <= 1e-6 * ended.max(1.0));
    assert!((v("honest_renter_surplus") - 0.30 * hours).abs() <= 1e-6 * ended.max(1.0) + 1e-9);
    assert_eq!(v("honest_price_rtx4090"), 0.50);
    assert_eq!(v("attacker_price_rtx4090"), 0.30);
    assert_eq!(v("honest_gpus_rtx4090"), v("honest_leases"));
    // One GPU each, always online for 48 h: utilization is GPU-hours leased over 48 GPU-hours,
    // counting leases still running at the horizon for their time so far.
    assert!(v("attacker_utilization") > 0.0 && v("attacker_utilization") < 0.001);
    assert!(v("honest_utilization") >= hours / 48.0 - 1e-6);
    assert!(v("honest_utilization") <= (hours + 1.0) / 48.0 + 1e-6);
}
