//! The periodic call market (k-double auction) as a matching mode: the scenario file runs,
//! and its leases pay the call's one price `a* + k (b* - a*)`.

#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod common;

use std::path::Path;

use gridlease_sim::market::Market;
use gridlease_sim::metrics::Bucket;
use gridlease_sim::scenario::{Matching, Scenario};

fn call_market() -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/call-market.toml");
    Scenario::load(&path).unwrap()
}

/// Per bucket with leases: (mean price per GPU-hour in micro-units, GPUs leased).
fn bucket_prices(buckets: &[Bucket]) -> Vec<(f64, u64)> {
    buckets
        .iter()
        .filter(|b| b.pop[0].price_gpus[0] > 0)
        .map(|b| {
            let p = &b.pop[0];
            (
                p.price_gpu_sum[0] as f64 / p.price_gpus[0] as f64,
                p.price_gpus[0],
            )
        })
        .collect()
}

#[test]
fn the_scenario_file_selects_the_call_market_and_leases_gpus() {
    let s = call_market();
    assert_eq!(s.matching, Matching::CallMarket);
    assert_eq!(
        (s.call_market.period_s, s.call_market.k_permille),
        (60, 500)
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/call-market.toml");
    let o = common::run(&[
        "run",
        file.to_str().unwrap(),
        "--reps",
        "1",
        "--seed",
        "3",
        "--out",
        out,
        "--no-plots",
    ]);
    assert!(o.status.success());
    let runs = gridlease_sim::output::Table::read(&dir.path().join("runs.csv")).unwrap();
    let get = |n: &str| -> f64 { runs.rows[0][runs.col(n).unwrap()].parse().unwrap() };
    let price = get("honest_price_rtx4090");
    println!("leases {} mean price {price}", get("leases"));
    assert!(get("leases") > 100.0);
    assert!((0.10..=1.0).contains(&price), "{price}");
}

/// Every bid is 0.80 (valuations without spread), asks are zero-intelligence draws between
/// 0.10 and 1.00. With k = 1 every call clears at b* = 0.80 exactly, whatever asks matched;
/// posted offers, the reverse auction and the continuous double auction would trade at the
/// asks (below 0.80). With k = 0 a call clears at its highest matched ask, so prices vary by
/// call and stay below 0.80; k = 0.5 lies between.
#[test]
fn every_lease_of_a_call_pays_the_calls_one_price() {
    let mut s = call_market();
    s.days = 0.5;
    s.renter[0].valuation_sigma = 0.0;
    let mut mean = Vec::new();
    for k in [1000u16, 500, 0] {
        s.call_market.k_permille = k;
        let res = Market::new(&s, 9, 0).run();
        let prices = bucket_prices(&res.buckets);
        assert!(
            prices.len() > 5,
            "k={k}: leases in {} buckets",
            prices.len()
        );
        let gpus: u64 = prices.iter().map(|p| p.1).sum();
        let m = prices.iter().map(|p| p.0 * p.1 as f64).sum::<f64>() / gpus as f64;
        println!("k={k}: {gpus} GPUs leased, mean price {:.4}", m / 1e6);
        if k == 1000 {
            for (p, _) in &prices {
                assert_eq!(*p, 800_000.0, "k=1: every lease at the bid 0.80");
            }
        } else {
            assert!(prices.iter().all(|p| p.0 < 800_000.0 && p.0 >= 100_000.0));
        }
        mean.push(m);
    }
    assert!(mean[0] > mean[1] && mean[1] > mean[2], "{mean:?}");
    // The same market with continuous double auction does not trade at 0.80 throughout.
    s.matching = Matching::DoubleAuction;
    let cda = bucket_prices(&Market::new(&s, 9, 0).run().buckets);
    assert!(cda.iter().any(|p| p.0 != 800_000.0));
}
