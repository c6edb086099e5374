//! The matching mechanism interface: how waiting jobs and visible offers meet.
//!
//! The market calls only the hooks of [`Mechanism`]; the four built-in modes of
//! [`Matching`] implement it, and a researcher's own crate can implement it too and run a
//! market with [`Market::with_mechanism`] (or a whole study with
//! [`crate::output::execute_with`]). A hook receives the market and acts on it through its
//! public methods (the offers renters see, a job's view, lease requests judged by the real
//! `check_request`, timers); those methods never call a hook back.

use gridlease_contracts::Money;
use gridlease_contracts::auction::{Order, clear_call_market};

use super::{Market, cda_job_key};
use crate::scenario::{Matching, Scenario};

/// What the market reads of a mechanism once, when it is built (kept out of the hot loops'
/// virtual calls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// Whether a provider's standing offer carries its ask (posted prices: a new ask changes
    /// the offer and bumps its seq, so requests built on the old view are refused as stale).
    /// `false`: the offer carries the cost floor and the mechanism sets the lease price.
    pub offer_carries_ask: bool,
    /// Whether a waiting job retries only offers whose visible price it can afford.
    pub price_gates_retry: bool,
}

/// One visible offer in a class's book ([`Market::offers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OfferView {
    /// Provider index.
    pub provider: usize,
    /// The identity the offer is published under (what reputation books record).
    pub identity: u32,
    /// The provider's visible ask, per GPU-hour.
    pub price: Money,
    /// Free GPUs.
    pub free_gpus: u16,
    /// Latest lease end the offer allows, simulated ms.
    pub until_ms: u64,
}

/// An offer a job could lease ([`Market::feasible_offers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The provider's visible ask, per GPU-hour.
    pub price: Money,
    /// Provider index.
    pub provider: usize,
}

/// What a mechanism may read of a job ([`Market::job`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobView {
    /// Renter index.
    pub renter: u32,
    /// GPUs it needs, all on one provider.
    pub gpus: u16,
    /// Memory it needs per GPU, GiB.
    pub min_vram_gib: u32,
    /// Lease duration it asks for, s.
    pub duration_s: u32,
    /// Most it pays per GPU-hour.
    pub valuation: Money,
    /// When it was submitted, simulated ms.
    pub arrived_ms: u64,
    /// Whether it is waiting for a lease.
    pub waiting: bool,
    /// Whether the mechanism holds it ([`Market::hold`]).
    pub held: bool,
}

/// A matching mechanism. Jobs are job slots (`u32`, reused after a job leaves), providers are
/// indices (`usize`), times simulated ms, prices per GPU-hour.
///
/// The market owns the waiting queues: a job that [`Mechanism::place`] does not lease waits
/// in its class's queue until it is leased or its patience runs out
/// ([`Mechanism::withdraw`]). A mechanism keeps whatever state it needs in `self`; it is built
/// anew for every replication and must be deterministic (draw randomness only through the
/// market, e.g. [`Market::quote`]).
///
/// ```
/// use gridlease_contracts::Money;
/// use gridlease_sim::market::{Market, Mechanism, Rules};
/// use gridlease_sim::scenario::Scenario;
///
/// /// Takes the most expensive offer the job can afford (a bad idea, for illustration).
/// struct Priciest;
///
/// impl Mechanism for Priciest {
///     fn rules(&self) -> Rules {
///         Rules { offer_carries_ask: true, price_gates_retry: true }
///     }
///     fn place(&mut self, m: &mut Market<'_>, job: u32, now: u64) -> bool {
///         let offers = m.feasible_offers(job, 8, now);
///         offers
///             .iter()
///             .rev()
///             .any(|c| m.request_lease(job, c.provider, c.price, now))
///     }
/// }
///
/// let mut sc = Scenario::default();
/// sc.days = 0.1;
/// let res = Market::with_mechanism(&sc, 1, 0, Box::new(Priciest)).run();
/// assert!(res.leases > 0);
/// ```
pub trait Mechanism {
    /// The rules the market applies around the mechanism (read once).
    fn rules(&self) -> Rules;
    /// Called once at time 0, before any event (e.g. to schedule a first [`Market::schedule_tick`]).
    fn start(&mut self, _m: &mut Market<'_>, _now: u64) {}
    /// A job (new, a resubmission, or a waiting one retrying) looks for a provider; `true`
    /// when it got a lease now ([`Market::request_lease`] returned `true`). Otherwise it waits.
    fn place(&mut self, m: &mut Market<'_>, job: u32, now: u64) -> bool;
    /// An update of `provider`'s offer reached renters (the market's offer book already holds
    /// it: open, with free GPUs, or gone); `better` when it made the offer more attractive.
    /// Returns whether waiting jobs it could serve retry it (oldest first, calling
    /// [`Mechanism::place`]); by default when it got better.
    fn offer_visible(
        &mut self,
        _m: &mut Market<'_>,
        _provider: usize,
        _open: bool,
        better: bool,
        _now: u64,
    ) -> bool {
        better
    }
    /// A job ran out of patience and leaves the market.
    fn withdraw(&mut self, _m: &mut Market<'_>, _job: u32) {}
    /// A timer set with [`Market::schedule_job_timer`] fired, and the job is still there.
    fn job_timer(&mut self, _m: &mut Market<'_>, _job: u32, _now: u64) {}
    /// A timer set with [`Market::schedule_tick`] fired.
    fn tick(&mut self, _m: &mut Market<'_>, _token: u32, _now: u64) {}
}

/// The mechanism of the scenario's `matching`.
pub fn builtin(sc: &Scenario) -> Box<dyn Mechanism> {
    match sc.matching {
        Matching::Posted => Box::new(PostedOffers),
        Matching::ReverseAuction => Box::new(ReverseAuction),
        Matching::DoubleAuction => Box::new(ContinuousDoubleAuction),
        Matching::CallMarket => Box::new(CallMarket::new(
            sc.call_market.period_s,
            sc.call_market.k_permille,
        )),
    }
}

/// The rules of posted offers: the standing offer carries the ask, retries are gated by price.
const ASK_PRICED: Rules = Rules {
    offer_carries_ask: true,
    price_gates_retry: true,
};

/// Stands in while the real mechanism's hook runs ([`Market::with_mech`]); the market's
/// actions never call a hook, so it is never asked anything.
pub(super) struct Detached;

impl Mechanism for Detached {
    fn rules(&self) -> Rules {
        ASK_PRICED
    }
    fn place(&mut self, _m: &mut Market<'_>, _job: u32, _now: u64) -> bool {
        false
    }
}

/// Posted offers: the renter takes the cheapest feasible offer it sees (the real node).
struct PostedOffers;

impl Mechanism for PostedOffers {
    fn rules(&self) -> Rules {
        ASK_PRICED
    }
    fn place(&mut self, m: &mut Market<'_>, job: u32, now: u64) -> bool {
        m.match_posted(job, now)
    }
}

/// Reverse auction with a bid window (Akash-style). The standing offer carries the cost
/// floor; the winning bid sets the lease price.
struct ReverseAuction;

/// The rules of the mechanisms whose standing offers carry the cost floor.
const FLOOR_PRICED: Rules = Rules {
    offer_carries_ask: false,
    price_gates_retry: false,
};

impl Mechanism for ReverseAuction {
    fn rules(&self) -> Rules {
        FLOOR_PRICED
    }
    fn place(&mut self, m: &mut Market<'_>, job: u32, now: u64) -> bool {
        m.open_auction(job, now);
        false
    }
    fn job_timer(&mut self, m: &mut Market<'_>, job: u32, now: u64) {
        let generation = m.jobs[job as usize].generation;
        m.on_auction_close(job, generation, now);
    }
}

/// Continuous double auction per GPU class. The standing offer carries the cost floor; the
/// trade price is the standing order's limit.
struct ContinuousDoubleAuction;

impl Mechanism for ContinuousDoubleAuction {
    fn rules(&self) -> Rules {
        FLOOR_PRICED
    }
    fn place(&mut self, m: &mut Market<'_>, job: u32, now: u64) -> bool {
        m.bid_cda(job, now)
    }
    fn offer_visible(
        &mut self,
        m: &mut Market<'_>,
        p: usize,
        open: bool,
        better: bool,
        now: u64,
    ) -> bool {
        if let Some(snap) = m.vis[p] {
            m.ask_cda(p, snap, open, now);
        }
        better
    }
    fn withdraw(&mut self, m: &mut Market<'_>, job: u32) {
        for book in &mut m.cda {
            book.cancel(cda_job_key(job));
        }
    }
}

/// Periodic call market (k-double auction) per GPU class, written against the public market
/// API only. Jobs do not trade on arrival: they wait in their home class's queue; every
/// `period` the waiting jobs of each class bid their valuation for their GPU count
/// (all-or-nothing), each open visible offer of the class asks its visible price for its free
/// GPUs, and `contracts::auction::clear_call_market` matches them and sets the call's one
/// price. Each matched pair becomes a lease request at that price, judged by `check_request`;
/// a refused one (the provider's true state differs from what renters saw) leaves the job
/// waiting for the next call. The standing offer carries the cost floor.
pub struct CallMarket {
    period_ms: u64,
    k_permille: u16,
}

impl CallMarket {
    /// A call market clearing every `period_s` seconds with `k = k_permille / 1000`.
    pub fn new(period_s: u32, k_permille: u16) -> Self {
        Self {
            period_ms: u64::from(period_s.max(1)) * 1000,
            k_permille,
        }
    }

    /// One call in `class`: returns the leases started.
    fn clear(&self, m: &mut Market<'_>, class: usize, now: u64) -> usize {
        let jobs = m.waiting_jobs(class);
        if jobs.is_empty() {
            return 0;
        }
        let offers: Vec<OfferView> = m.offers(class).collect();
        if offers.is_empty() {
            return 0;
        }
        let views: Vec<JobView> = jobs.iter().map(|&j| m.job(j)).collect();
        // Owners are indices into `jobs` / `offers`.
        let bids: Vec<Order<usize>> = views
            .iter()
            .enumerate()
            .map(|(i, v)| Order {
                owner: i,
                price: v.valuation,
                qty: u32::from(v.gpus),
            })
            .collect();
        let asks: Vec<Order<usize>> = offers
            .iter()
            .enumerate()
            .map(|(i, o)| Order {
                owner: i,
                price: o.price,
                qty: u32::from(o.free_gpus),
            })
            .collect();
        let clearing = clear_call_market(&bids, &asks, self.k_permille, |b, a| {
            let (v, o) = (&views[b.owner], &offers[a.owner]);
            now + u64::from(v.duration_s) * 1000 <= o.until_ms && m.trusts(v.renter, o.identity)
        });
        let Some(price) = clearing.price else {
            return 0;
        };
        clearing
            .trades
            .iter()
            .filter(|t| m.request_lease(jobs[t.buyer], offers[t.seller].provider, price, now))
            .count()
    }
}

impl Mechanism for CallMarket {
    fn rules(&self) -> Rules {
        FLOOR_PRICED
    }
    fn start(&mut self, m: &mut Market<'_>, now: u64) {
        m.schedule_tick(now + self.period_ms, 0);
    }
    fn place(&mut self, _m: &mut Market<'_>, _job: u32, _now: u64) -> bool {
        // Orders wait for the next call.
        false
    }
    fn offer_visible(
        &mut self,
        _m: &mut Market<'_>,
        _provider: usize,
        _open: bool,
        _better: bool,
        _now: u64,
    ) -> bool {
        // No continuous trading: waiting jobs do not retry between calls.
        false
    }
    fn tick(&mut self, m: &mut Market<'_>, _token: u32, now: u64) {
        for class in 0..m.classes() {
            self.clear(m, class, now);
        }
        m.schedule_tick(now + self.period_ms, 0);
    }
}
