//! A mechanism defined outside the crate, through the public API only: it runs a market
//! and changes who gets the leases.

#![allow(clippy::unwrap_used)]

use gridlease_sim::market::{Market, Mechanism, Rules};
use gridlease_sim::output::{self, Point, Table};
use gridlease_sim::scenario::Scenario;

/// Takes the most expensive offer the job can afford, and counts its calls.
struct Priciest {
    placed: u64,
}

impl Mechanism for Priciest {
    fn rules(&self) -> Rules {
        Rules {
            offer_carries_ask: true,
            price_gates_retry: true,
        }
    }
    fn place(&mut self, m: &mut Market<'_>, job: u32, now: u64) -> bool {
        self.placed += 1;
        let offers = m.feasible_offers(job, 8, now);
        offers
            .iter()
            .rev()
            .any(|c| m.request_lease(job, c.provider, c.price, now))
    }
}

/// A cheap (0.20) and a dear (0.40) provider with 16 GPUs each, renters valuing 0.80.
fn two_providers() -> Scenario {
    Scenario::from_toml(
        r#"
name = "two"
days = 1.0
[[gpu_class]]
name = "rtx4090"
vram_gib = 24
[[provider]]
name = "cheap"
count = 1
gpus = 16
pricing = { strategy = "fixed", price = "0.20" }
[[provider]]
name = "dear"
count = 1
gpus = 16
pricing = { strategy = "fixed", price = "0.40" }
[[renter]]
name = "r"
count = 20
jobs_per_day = 2.0
valuation_median = "0.80"
valuation_sigma = 0.0
"#,
    )
    .unwrap()
}

fn leases_by_provider(t: &Table) -> Vec<u64> {
    let c = t.col("leases").unwrap();
    t.rows.iter().map(|r| r[c].parse().unwrap()).collect()
}

#[test]
fn an_outside_mechanism_runs_a_market_and_decides_the_matches() {
    let sc = two_providers();
    let points = vec![Point {
        params: Vec::new(),
        scenario: sc.clone(),
    }];
    let tasks = output::tasks(1, 1, None);
    let posted = output::execute(&points, &tasks, 1, &|_| {});
    let mine = output::execute_with(&points, &tasks, 1, &|_| {}, &|_| {
        Box::new(Priciest { placed: 0 })
    });
    let (p_posted, _) = output::agent_tables(&points, &posted);
    let (p_mine, _) = output::agent_tables(&points, &mine);
    let posted = leases_by_provider(&p_posted);
    let mine = leases_by_provider(&p_mine);
    // Posted offers: the cheap provider gets the leases; the outside mechanism sends them all
    // to the dear one (16 GPUs are never all busy with these 1-hour jobs).
    assert!(posted[0] > 0 && posted[1] == 0, "posted: {posted:?}");
    assert!(mine[0] == 0 && mine[1] > 0, "outside mechanism: {mine:?}");
    assert_eq!(posted[0], mine[1]);
    // The market asked the mechanism to place every job it leased.
    let placed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    struct Counting(std::sync::Arc<std::sync::atomic::AtomicU64>, Priciest);
    impl Mechanism for Counting {
        fn rules(&self) -> Rules {
            self.1.rules()
        }
        fn place(&mut self, m: &mut Market<'_>, job: u32, now: u64) -> bool {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.1.place(m, job, now)
        }
    }
    let res = Market::with_mechanism(
        &sc,
        1,
        0,
        Box::new(Counting(placed.clone(), Priciest { placed: 0 })),
    )
    .run();
    assert_eq!(res.leases, mine.iter().sum::<u64>());
    assert!(placed.load(std::sync::atomic::Ordering::Relaxed) >= res.leases);
}
