//! Welfare in market runs (issue 49): in every period of every shipped kind of market the
//! realised surplus and the five losses add up to the benchmark's maximum, no loss is negative
//! and the renters' and providers' parts add up to the realised surplus; a market where every
//! job runs at once on cheap supply is 100 % efficient, and one short of supply loses exactly
//! the demand it did not serve; and a mechanism comparison (posted prices against the
//! continuous double auction) reports efficiency with intervals.

#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod common;

use std::path::Path;

use gridlease_sim::market::Market;
use gridlease_sim::scenario::Scenario;
use gridlease_sim::welfare::Welfare;

fn scenario(name: &str) -> Scenario {
    Scenario::load(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("scenarios")
            .join(format!("{name}.toml")),
    )
    .unwrap()
}

/// The identity, the signs and the split, within rounding (micro-units, f64).
fn check(what: &str, w: &Welfare) {
    let tol = 1e-6 * w.max.abs().max(1e6);
    assert!(
        (w.realised + w.lost() - w.max).abs() <= tol,
        "{what}: realised {} + lost {} != max {}",
        w.realised,
        w.lost(),
        w.max
    );
    for (name, x) in w.losses() {
        assert!(x >= -tol, "{what}: {name} = {x}");
    }
    assert!(
        (w.renter + w.provider - w.realised).abs() <= tol,
        "{what}: renters {} + providers {} != realised {}",
        w.renter,
        w.provider,
        w.realised
    );
    assert!(w.realised <= w.max + tol, "{what}: {w:?}");
}

#[test]
fn every_period_of_every_market_adds_up() {
    for name in [
        "baseline",
        "attack",
        "no-show",
        "false-class",
        "home-diurnal",
        "double-auction",
        "call-market",
        "reverse-auction",
        "oversupply",
        "undersupply",
    ] {
        let mut sc = scenario(name);
        sc.days = sc.days.min(1.0);
        let res = Market::new(&sc, 3, 0).run();
        let mut total = Welfare::default();
        for (i, b) in res.buckets.iter().enumerate() {
            check(&format!("{name} period {i}"), &b.welfare);
            total.absorb(&b.welfare);
        }
        check(&format!("{name} run"), &total);
        assert!(total.max > 0.0, "{name}: nothing to gain?");
        println!(
            "{name}: efficiency {:.4}, lost: unserved {:.0} extramarginal demand {:.0} idle supply {:.0} extramarginal supply {:.0} delivery {:.0}",
            total.efficiency().unwrap(),
            total.unserved,
            total.extramarginal_demand,
            total.idle_supply,
            total.extramarginal_supply,
            total.delivery
        );
        if name == "false-class" {
            assert!(total.delivery > 0.0, "a false class delivers less");
        } else {
            assert_eq!(total.delivery, 0.0, "{name}");
        }
    }
}

/// One class, one-GPU jobs of exactly an hour, 64 always-on GPUs at cost 0.10 asking 0.20,
/// renters valuing 1.00: every job runs at once, and the market realises the whole benchmark.
/// With 1 GPU instead, jobs wait and some give up: the lost surplus is the demand not served.
#[test]
fn a_market_that_serves_everyone_at_once_is_fully_efficient() {
    let text = |gpus: u32| {
        format!(
            r#"
name = "simple"
days = 1.0
[[gpu_class]]
name = "rtx4090"
vram_gib = 24
[[provider]]
name = "p"
count = 1
gpus = {gpus}
cost_floor = "0.10"
pricing = {{ strategy = "fixed", price = "0.20" }}
[[renter]]
name = "r"
count = 40
jobs_per_day = 1.0
duration_median_minutes = 60.0
duration_sigma = 0.0
valuation_median = "1.00"
valuation_sigma = 0.0
patience_mean_minutes = 20.0
"#
        )
    };
    let sc = Scenario::from_toml(&text(16)).unwrap();
    let res = Market::new(&sc, 1, 0).run();
    let mut w = Welfare::default();
    for b in &res.buckets {
        w.absorb(&b.welfare);
    }
    check("ample", &w);
    assert!(res.leases > 20);
    assert!(
        (w.efficiency().unwrap() - 1.0).abs() < 1e-9,
        "{:?} {w:?}",
        w.efficiency()
    );
    // Each job's surplus is (1.00 - 0.10) per GPU-hour, an hour each (the last ones cut by the
    // end of the day): the maximum is at most 0.90 GLU a lease.
    assert!(w.max <= 0.9e6 * res.leases as f64 + 1.0);
    // Renters gain value - price (0.80 an hour), providers price - cost (0.10).
    assert!((w.renter / w.realised - 0.8 / 0.9).abs() < 0.01, "{w:?}");

    let sc = Scenario::from_toml(&text(1)).unwrap();
    let res = Market::new(&sc, 1, 0).run();
    let mut short = Welfare::default();
    for b in &res.buckets {
        short.absorb(&b.welfare);
    }
    check("short", &short);
    let eff = short.efficiency().unwrap();
    assert!(eff < 0.99, "{eff}");
    // One GPU can serve one job at a time: what is lost is unserved demand (and the GPU idle
    // between jobs), never surplus of trades that should not have happened.
    assert!(short.unserved > 0.0);
    assert_eq!(short.extramarginal_demand, 0.0);
    assert_eq!(short.extramarginal_supply, 0.0);
}

/// The mechanism comparison a paper would make: the same scarce market (`undersupply.toml`: 20
/// GPUs, 400 renters) under posted prices and under the continuous double auction, 10
/// replications each, efficiency with its bootstrap interval in `summary.csv`. Under scarcity
/// the auction gives the GPUs to the renters who value them most; posted prices to whoever
/// comes first: the auction's interval lies above.
#[test]
fn posted_prices_against_the_double_auction_with_intervals() {
    let d = tempfile::tempdir().unwrap();
    let o = d.path().join("o");
    let sc = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/undersupply.toml");
    let out = common::run(&[
        "-q",
        "sweep",
        sc.to_str().unwrap(),
        "--param",
        "matching=posted,double_auction",
        "--reps",
        "10",
        "--no-plots",
        "--out",
        o.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut r = csv::Reader::from_path(o.join("summary.csv")).unwrap();
    let h = r.headers().unwrap().clone();
    let col = |n: &str| h.iter().position(|x| x == n).unwrap();
    let (metric, mean, lo, hi, point) = (
        col("metric"),
        col("mean"),
        col("boot95_low"),
        col("boot95_high"),
        col("point"),
    );
    let rows: Vec<csv::StringRecord> = r
        .records()
        .map(Result::unwrap)
        .filter(|x| &x[metric] == "welfare_efficiency")
        .collect();
    assert_eq!(rows.len(), 2);
    let mut got = Vec::new();
    for x in &rows {
        let (m, l, u): (f64, f64, f64) = (
            x[mean].parse().unwrap(),
            x[lo].parse().unwrap(),
            x[hi].parse().unwrap(),
        );
        println!("point {}: efficiency {m:.4} [{l:.4}, {u:.4}]", &x[point]);
        assert!(l <= m && m <= u && u <= 1.0 && m > 0.0);
        got.push((l, u));
    }
    let (posted, auction) = (got[0], got[1]);
    assert!(
        auction.0 > posted.1,
        "posted {posted:?}, auction {auction:?}"
    );
}
