//! Accept-then-no-show and false-GPU-class providers: what they cost renters, how renters and
//! reputation react, and that the honest population's metrics leave them out.

#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::path::Path;

use gridlease_sim::output::{self, Point, Table};
use gridlease_sim::scenario::Scenario;

fn scenario(name: &str, days: f64) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"));
    let mut s = Scenario::load(&path).unwrap();
    s.days = days;
    s
}

/// `runs.csv` and `buckets.csv` of one replication, and `providers.csv`.
fn run(s: &Scenario, seed: u64) -> (Table, Table, Table) {
    let points = vec![Point {
        params: Vec::new(),
        scenario: s.clone(),
    }];
    let tasks = output::tasks(1, 1, None);
    let records = output::execute(&points, &tasks, seed, &|_| {});
    let (runs, buckets, _) = output::tables(&points, &records, seed);
    let (providers, _) = output::agent_tables(&points, &records);
    (runs, buckets, providers)
}

fn v(t: &Table, row: usize, name: &str) -> f64 {
    let c = t.col(name).unwrap_or_else(|| panic!("no column {name}"));
    t.rows[row][c].parse().unwrap()
}

/// Sum of a `providers.csv` column over one population.
fn agent_sum(t: &Table, population: &str, name: &str) -> f64 {
    let pc = t.col("population").unwrap();
    (0..t.rows.len())
        .filter(|&i| t.rows[i][pc] == population)
        .map(|i| v(t, i, name))
        .sum()
}

/// The attacker population's leases never start: nothing used, nothing paid, every one
/// fails and costs its renter the start allowance plus two report intervals, and the job is
/// submitted again. The honest columns show none of it.
#[test]
fn no_show_leases_never_start_and_cost_renters_the_start_allowance() {
    for allowance in [300u32, 60] {
        let mut s = scenario("no-show", 0.5);
        s.channel.start_allowance_s = allowance;
        let (runs, _, providers) = run(&s, 1);
        let g = |n: &str| v(&runs, 0, n);
        let no_shows = g("no_shows");
        println!(
            "allowance {allowance}: no-shows {no_shows}, lost {} s, attacker leases {}, honest leases {}",
            g("no_show_lost_s"),
            g("attacker_leases"),
            g("honest_leases")
        );
        assert!(no_shows > 100.0);
        assert_eq!(
            g("no_show_lost_s"),
            no_shows * f64::from(allowance + 2 * 60)
        );
        assert_eq!(g("attacker_failed_leases"), no_shows);
        assert_eq!(g("resubmissions"), no_shows);
        assert_eq!(g("attacker_revenue"), 0.0);
        assert_eq!(g("attacker_gpu_hours"), 0.0);
        assert_eq!(g("attacker_renter_surplus"), 0.0);
        // Honest providers: no failures, no money at risk; their revenue is theirs alone.
        assert_eq!(g("honest_failed_leases"), 0.0);
        assert_eq!(g("money_at_risk"), 0.0);
        assert!(g("honest_revenue") > 0.0);
        assert_eq!(agent_sum(&providers, "honest", "failed_leases"), 0.0);
        assert_eq!(agent_sum(&providers, "attacker", "failed_leases"), no_shows);
        assert_eq!(g("leases"), g("honest_leases") + g("attacker_leases"));
        assert_eq!(g("false_class_detected") + g("false_class_undetected"), 0.0);
    }
}

/// Each renter's own book needs two failures per identity before it distrusts it, so with
/// 400 renters and 10 no-show identities local reputation barely dents the attack; the
/// network score, which every renter shares, shuts it out after its first recomputation.
#[test]
fn network_reputation_shuts_out_no_shows_that_local_books_only_dent() {
    let base = scenario("no-show", 1.0);
    let mut off = base.clone();
    off.reputation.enabled = false;
    let mut network = base.clone();
    network.set_param("reputation.mode", "network").unwrap();
    let count = |s: &Scenario| {
        let (runs, buckets, _) = run(s, 4);
        let late: f64 = (0..buckets.rows.len())
            .filter(|&i| v(&buckets, i, "t_start_h") >= 12.0)
            .map(|i| v(&buckets, i, "no_shows"))
            .sum();
        (v(&runs, 0, "no_shows"), late)
    };
    let (off_n, _) = count(&off);
    let (local_n, _) = count(&base);
    let (net_n, net_late) = count(&network);
    println!("no-shows in a day: reputation off {off_n}, local {local_n}, network {net_n}");
    assert!(local_n <= off_n);
    assert!(local_n > 0.5 * off_n, "local books are slow to learn");
    assert!(net_n < 0.1 * local_n);
    assert_eq!(
        net_late, 0.0,
        "no no-show in the second half day with network scores"
    );
}

/// Renters that benchmark at start catch every false-class lease (it fails after the 60 s
/// benchmark as the provider's fault); renters that do not pay for throughput they do not
/// get. Jobs that do not fit the delivered memory are caught without a benchmark.
#[test]
fn false_class_is_caught_by_benchmarks_and_costs_the_others_throughput() {
    let s = scenario("false-class", 0.5);
    let (runs, _, providers) = run(&s, 1);
    let g = |n: &str| v(&runs, 0, n);
    let detected = g("false_class_detected");
    let undetected = g("false_class_undetected");
    println!(
        "detected {detected}, undetected {undetected}, shortfall {}, surplus/h honest {} attacker {}",
        g("false_class_shortfall"),
        g("honest_renter_surplus") / g("honest_gpu_hours"),
        g("attacker_renter_surplus") / g("attacker_gpu_hours"),
    );
    assert!(detected > 50.0 && undetected > 20.0);
    assert_eq!(g("false_class_lost_s"), detected * 60.0);
    assert_eq!(g("attacker_failed_leases"), detected);
    // The rest of the job is submitted again when at least a minute of it is left.
    assert!(g("resubmissions") <= detected && g("resubmissions") > 0.95 * detected);
    assert!(g("false_class_shortfall") > 0.0);
    // Per GPU-hour, renters of false-class leases get far less surplus than honest ones.
    let per_h = |pop: &str| g(&format!("{pop}_renter_surplus")) / g(&format!("{pop}_gpu_hours"));
    assert!(per_h("attacker") < 0.6 * per_h("honest"));
    assert_eq!(g("honest_failed_leases"), 0.0);
    assert_eq!(agent_sum(&providers, "honest", "failed_leases"), 0.0);
    assert_eq!(agent_sum(&providers, "attacker", "failed_leases"), detected);

    // Nobody benchmarks: nothing is caught.
    let mut blind = s.clone();
    blind
        .set_param("renter.benchmark_probability", "0.0")
        .unwrap();
    let (runs, _, _) = run(&blind, 1);
    assert_eq!(v(&runs, 0, "false_class_detected"), 0.0);
    assert_eq!(v(&runs, 0, "attacker_failed_leases"), 0.0);
    assert!(v(&runs, 0, "false_class_undetected") > 50.0);

    // Jobs that need more memory than the delivered 16 GiB fail on it, benchmark or not.
    blind.set_param("renter.min_vram_gib", "20").unwrap();
    let (runs, _, _) = run(&blind, 1);
    assert_eq!(v(&runs, 0, "false_class_undetected"), 0.0);
    assert!(v(&runs, 0, "false_class_detected") > 50.0);
}
