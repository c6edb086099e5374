//! A pricing strategy defined outside the crate, through the public API only: it prices one
//! provider group in a market and in a whole study, and the leases it makes carry its asks.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use gridlease_contracts::Money;
use gridlease_contracts::pricing::{PricingInput, PricingStrategy};
use gridlease_sim::market::{Market, RunResult, SharedPricing, builtin};
use gridlease_sim::output::{self, Point};
use gridlease_sim::scenario::{ProviderGroup, Scenario};

/// Asks three times its cost floor, whatever the market does.
struct Triple;

impl PricingStrategy for Triple {
    fn quote(&self, input: &PricingInput, _: &mut dyn rand::RngCore) -> Money {
        Money::from_micros(input.cost_floor.micros().saturating_mul(3))
    }
}

/// One provider group of 16 GPUs posting 0.40 with a cost floor of 0.10, re-priced every 10
/// minutes; renters value 0.80, so they take whichever of 0.40 and 0.30 is asked.
fn market() -> Scenario {
    Scenario::from_toml(
        r#"
name = "priced"
days = 1.0
repricing_minutes = 10
[[gpu_class]]
name = "rtx4090"
vram_gib = 24
[[provider]]
name = "mine"
count = 1
gpus = 16
cost_floor = "0.10"
pricing = { strategy = "fixed", price = "0.40" }
[[renter]]
name = "r"
count = 20
jobs_per_day = 4.0
valuation_median = "0.80"
valuation_sigma = 0.0
"#,
    )
    .unwrap()
}

/// Mean price per GPU-hour of the leases started after the first hour (every re-pricing done).
fn late_price(res: &RunResult) -> f64 {
    let (mut sum, mut gpus) = (0u128, 0u64);
    for b in res.buckets.iter().skip(2) {
        for pop in &b.pop {
            sum += pop.price_gpu_sum.iter().sum::<u128>();
            gpus += pop.price_gpus.iter().sum::<u64>();
        }
    }
    assert!(gpus > 0, "no lease started");
    sum as f64 / gpus as f64 / 1e6
}

fn triple_for_mine(g: &ProviderGroup) -> Option<SharedPricing> {
    (g.name == "mine").then(|| Arc::new(Triple) as SharedPricing)
}

#[test]
fn an_outside_strategy_sets_the_groups_asks() {
    let sc = market();
    assert_eq!(
        sc.bucket_minutes, 60,
        "late_price skips the first two buckets"
    );
    let builtin_only = Market::new(&sc, 1, 0).run();
    let mine = Market::with_plugins(&sc, 1, 0, builtin(&sc), &triple_for_mine).run();
    assert!((late_price(&builtin_only) - 0.40).abs() < 1e-9);
    assert!(
        (late_price(&mine) - 0.30).abs() < 1e-9,
        "{}",
        late_price(&mine)
    );
    // A hook that names no group changes nothing, byte for byte in what it measured.
    let none = Market::with_plugins(&sc, 1, 0, builtin(&sc), &|_: &ProviderGroup| None).run();
    assert_eq!(none.provider_revenue, builtin_only.provider_revenue);
    assert_eq!(none.leases, builtin_only.leases);
}

#[test]
fn a_whole_study_runs_with_it() {
    let sc = market();
    let points = vec![Point {
        params: Vec::new(),
        scenario: sc,
    }];
    let tasks = [(0usize, 0u64), (0, 1)];
    let records = output::execute_plugins(
        &points,
        &tasks,
        1,
        &|_| {},
        &gridlease_sim::market::builtin,
        &triple_for_mine,
    );
    assert_eq!(records.len(), 2);
    for r in &records {
        assert!((late_price(&r.result) - 0.30).abs() < 1e-9);
    }
}
