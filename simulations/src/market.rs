//! The simulated market: providers, renters, jobs and leases, driven by the event queue and
//! ruled by `gridlease-contracts` -- the same offer/request checks
//! ([`check_request`]), lease state machine ([`Lease`]), per-second billing ([`Tariff`]),
//! payment channel ([`ProviderChannel`], [`RenterChannel`], whose `check_usage` catches inflated
//! usage), pricing strategies, auction rules and reputation as the node.
//!
//! **Channel fast-forward.** Everything that can end a running lease early (the provider's
//! next crash, the renter's decision to stop paying, an attacker's inflation factor) is drawn
//! when the lease starts. The lease's whole report/receipt exchange is therefore run at start,
//! report by report through the real channel code, and one `LeaseEnd` event is scheduled at
//! the moment the channel (or the crash) ends it. The result is identical to scheduling every
//! report as its own event, at a fraction of the queue traffic; the reports are counted in
//! `channel_reports`.

mod book;
mod mechanism;
mod netrep;
mod trace;
mod welfare;

pub use self::mechanism::{CallMarket, Candidate, JobView, Mechanism, OfferView, Rules, builtin};
pub use self::trace::{Trace, TraceKind, TraceRow};

use std::collections::VecDeque;
use std::sync::Arc;

use gridlease_contracts::auction::{DoubleAuction, SealedBid, reverse_auction_winner};
use gridlease_contracts::image::ImagePolicy;
use gridlease_contracts::lease::Transition;
use gridlease_contracts::pricing::{PricingInput, PricingStrategy, uniform_inclusive};
use gridlease_contracts::reputation::{Outcome, ReputationBook, TrustPolicy};
use gridlease_contracts::{
    Actor, Decision, Lease, LeaseEvent, Money, ProviderChannel, ProviderView, RenterChannel,
    Tariff, check_request, cost, default_budget,
};
use gridlease_protocol::fixtures;
use gridlease_protocol::{
    CloseReason, Digest, LeaseId, LeaseRequest, LeaseTerms, NetworkId, NetworkPolicy, Offer,
    OfferId, PublicKey, Timestamp, UsageReport,
};
use rand_pcg::Pcg64Mcg;

use self::book::{Entry, OfferBook};
use self::netrep::{Key, NetRep};
use crate::engine::EventQueue;
use crate::metrics::{Bucket, Population, ProviderStats, RenterStats, WaitHistogram, gini};
use crate::rng::{StreamKind, bernoulli, exponential, lognormal, stream, unit_open};
use crate::scenario::{Arrivals, Attack, Availability, ProviderGroup, Scenario};
use gridlease_protocol::completion::CompletionOutcome;

/// A pricing strategy as the market holds it: one per provider group, shared by its providers.
pub type SharedPricing = Arc<dyn PricingStrategy + Send + Sync>;

/// A provider's next ask: its group's shared strategy where it has one, else its built-in one.
fn quote(custom: &[Option<SharedPricing>], pr: &mut Provider, input: &PricingInput) -> Money {
    match custom.get(pr.group).and_then(Option::as_ref) {
        Some(s) => s.quote(input, &mut pr.rng),
        None => pr.pricing.quote_with(input, &mut pr.rng),
    }
}

/// Which groups price by a strategy of the caller's ([`Market::with_plugins`]): `Some` for a
/// group replaces the strategy its `pricing` setting names.
pub type PricingHook = dyn Fn(&ProviderGroup) -> Option<SharedPricing> + Sync;

/// The hook of a market with only the built-in strategies.
pub fn no_pricing(_: &ProviderGroup) -> Option<SharedPricing> {
    None
}

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;
/// Longest lease an always-on provider offers, seconds.
const MAX_OFFER_DURATION_S: u64 = 30 * 24 * 3600;
/// Waiting jobs examined per newly visible offer.
const WAIT_SCAN: usize = 64;
/// Container image every simulated lease asks for.
const SIM_IMAGE: &str = "sim";
/// Most recycled allocations kept (see `Market::spare_terms`).
const SPARE_MAX: usize = 1 << 16;
/// Offers considered per class when a renter searches.
const CANDIDATES_PER_CLASS: usize = 8;

/// The events of the market.
#[derive(Clone, Copy, Debug)]
enum Ev {
    /// The next job of a renter group arrives.
    GroupArrival { group: u32 },
    /// A waiting job's patience runs out.
    Patience { job: u32, generation: u32 },
    /// A provider's published offer state reaches renters.
    OfferVisible { provider: u32, slot: u32 },
    /// A lease ends (time computed by the channel at start).
    LeaseEnd { lease: u32 },
    /// Provider comes online / goes offline (availability pattern).
    Online { provider: u32 },
    /// Provider goes offline.
    Offline { provider: u32 },
    /// Provider crashes.
    Crash { provider: u32 },
    /// Provider is back after a crash.
    Repair { provider: u32 },
    /// All providers re-price.
    Reprice,
    /// A mechanism's timer for one job (the reverse auction's bid window); dropped when the
    /// job slot was reused or freed.
    JobTimer { job: u32, generation: u32 },
    /// A mechanism's own timer (the call market's clearing).
    Tick { token: u32 },
    /// Network reputation: scores are recomputed (when records arrived).
    Scores,
    /// Network reputation: a self-dealing provider group fabricates its period's records.
    SelfDeal { group: u32 },
}

/// What renters learn when an offer update reaches them.
#[derive(Clone, Copy, Debug)]
struct Snapshot {
    version: u32,
    identity: u32,
    seq: u32,
    free: u16,
    available: bool,
    price: u64,
    /// Latest lease end the offer allows (its `created_at + max_duration_s`), sim ms.
    until: u64,
}

struct Provider {
    group: usize,
    class: usize,
    gpus: u16,
    free: u16,
    online: bool,
    crashed: bool,
    identity: u32,
    /// The real offer (boxed: it is large and cold next to the fields the matching loops read).
    offer: Box<Offer>,
    offer_id: OfferId,
    /// The ask (posted price; in auction modes the bid/ask it quotes).
    ask: Money,
    cost_floor: Money,
    /// The group's strategy (shared by its providers; each quotes with its own stream).
    /// The group's built-in strategy (a caller's own is in `Market::custom_pricing`).
    pricing: gridlease_contracts::pricing::Pricing,
    rng: Pcg64Mcg,
    next_off_at: u64,
    next_crash_at: u64,
    busy_acc_ms: u64,
    busy_since: u64,
    pub_version: u32,
    revenue: Money,
    attacker: bool,
    inflation_permille: u32,
    whitewash: bool,
    jitter_ms: u64,
}

/// A provider group's attack, read once per lease (kept out of the hot [`Provider`]).
#[derive(Clone, Copy, Debug)]
struct GroupAttack {
    /// What the group does wrong (`Attack::None` for honest providers).
    attack: Attack,
    /// False class: delivered throughput over advertised, permille (1000 otherwise).
    delivered_permille: u32,
    /// False class: memory of the delivered GPUs, GiB (the advertised class's otherwise).
    delivered_vram: u32,
}

impl Provider {
    fn available(&self) -> bool {
        self.online && !self.crashed
    }
}

struct Renter {
    group: usize,
    rng: Pcg64Mcg,
    book: ReputationBook<u32>,
    /// The identities with a record in `book` that `book` does not trust (see
    /// [`Market::trusted`]); usually none.
    distrusted: Vec<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum JobState {
    Free,
    Waiting,
    /// Taken out of the waiting queue by the mechanism ([`Market::hold`]): the reverse
    /// auction's bid window.
    Held,
}

#[derive(Clone, Copy, Debug)]
struct Job {
    renter: u32,
    generation: u32,
    state: JobState,
    gpus: u16,
    min_vram: u32,
    duration_s: u32,
    valuation: Money,
    arrived: u64,
    defaults: bool,
    /// The rest of an earlier job submitted again (not a new job).
    resubmission: bool,
}

/// What the retry test reads of one waiting job.
#[derive(Clone, Copy, Debug)]
struct WaitingJob {
    renter: u32,
    duration_s: u32,
    valuation: u64,
    gpus: u16,
}

/// The front of one waiting queue as `retry_waiting` would scan it: the entries up to and
/// including the `WAIT_SCAN`-th waiting job (or the whole queue), cached between retries.
/// Almost every retry finds that none of these jobs fits the improved offer, and then changes
/// nothing; the cache answers that without walking the queue and the jobs. It is dropped
/// whenever the queue's covered entries or one of the job slots they name change.
#[derive(Debug, Default)]
struct WaitPrefix {
    valid: bool,
    /// The job slot of every covered entry (waiting or not), for invalidation.
    slots: Vec<u32>,
    /// The waiting jobs among them, oldest first.
    jobs: Vec<WaitingJob>,
    /// Whether a covered entry names a job that is no longer waiting (the scan would drop it).
    stale: bool,
    /// Largest valuation, shortest duration and fewest GPUs among `jobs`.
    max_valuation: u64,
    min_duration_s: u32,
    min_gpus: u16,
}

/// What kind of lease a [`LeaseRec`] is, for the attack metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeaseKind {
    /// Started and ran as its channel says.
    Normal,
    /// Accepted by a no-show provider and never started.
    NoShow,
    /// A false-class provider's lease that the renter caught at start.
    FalseClassDetected,
    /// A false-class provider's lease that ran undetected.
    FalseClassUndetected,
}

struct LeaseRec {
    /// The lease's number, in start order (the trace's `lease`).
    seq: u64,
    kind: LeaseKind,
    /// The share of the advertised throughput delivered, permille (false class; else 1000).
    lease: Lease,
    provider: u32,
    renter: u32,
    identity: u32,
    valuation: Money,
    outcome: ChannelOutcome,
    renter_defaulted: bool,
}

/// How a lease's channel ended.
#[derive(Clone, Copy, Debug)]
struct ChannelOutcome {
    end_ms: u64,
    reason: CloseReason,
    failed: bool,
    paid: Money,
    honest_due: Money,
    unpaid: Money,
    bound: Money,
    caught: bool,
    real_wall_ms: u64,
}

/// Run-level results.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Per-bucket accumulators.
    pub buckets: Vec<Bucket>,
    /// Bucket width, ms.
    pub bucket_ms: u64,
    /// Class names.
    pub classes: Vec<String>,
    /// Wait-time histogram of matched jobs.
    pub waits: WaitHistogram,
    /// Revenue of each provider, micro-units.
    pub provider_revenue: Vec<u64>,
    /// Whether each provider (same order) is an attacker.
    pub provider_attacker: Vec<bool>,
    /// Each provider's group index (same order).
    pub provider_group: Vec<usize>,
    /// Per provider (same order).
    pub provider_stats: Vec<ProviderStats>,
    /// Each renter's group index.
    pub renter_group: Vec<usize>,
    /// Per renter.
    pub renter_stats: Vec<RenterStats>,
    /// Events processed.
    pub events: u64,
    /// Usage reports exchanged through the channel.
    pub channel_reports: u64,
    /// Lease requests the provider refused (stale view, capacity gone, duration).
    pub rejected_requests: u64,
    /// Jobs whose first submission was still waiting at the horizon.
    pub jobs_waiting_at_end: u64,
    /// Resubmissions still waiting at the horizon.
    pub resubmissions_waiting_at_end: u64,
    /// Leases started.
    pub leases: u64,
    /// Largest unpaid amount at the close of one honest provider's lease, micro-units.
    pub max_at_risk: u64,
    /// Honest providers' leases whose unpaid amount exceeded the channel's bound (window + one
    /// interval).
    pub bound_violations: u64,
    /// Attackers' leases that ended.
    pub attacker_leases: u64,
    /// What attackers were paid, micro-units.
    pub attacker_revenue: u64,
    /// Identities attackers used (whitewashing adds some).
    pub attacker_identities: u64,
    /// Mean cost floor per class, micro-units per GPU-hour (for sanity checks).
    pub class_cost_floor: Vec<u64>,
    /// With network reputation (or when the study tracks it): what it ended with.
    pub network: Option<NetworkResult>,
    /// The event trace, when asked for ([`Market::with_trace`]).
    pub trace: Option<Trace>,
}

/// The network reputation's state at the horizon.
#[derive(Clone, Debug, Default)]
pub struct NetworkResult {
    /// Per provider (same order as `provider_stats`): the score of its current identity as
    /// renters last saw it.
    pub provider_score: Vec<f64>,
    /// Per provider: records of its current identity in the pool.
    pub provider_records: Vec<u64>,
    /// Score recomputations.
    pub recomputes: u64,
}

/// The whole simulated world.
pub struct Market<'s> {
    sc: &'s Scenario,
    q: EventQueue<Ev>,
    horizon: u64,
    network: NetworkId,
    /// The providers' image rules (the defaults: the simulated image is a public one).
    images: ImagePolicy,
    class_vram: Vec<u32>,
    providers: Vec<Provider>,
    renters: Vec<Renter>,
    group_rngs: Vec<Pcg64Mcg>,
    group_first: Vec<usize>,
    jobs: Vec<Job>,
    free_jobs: Vec<u32>,
    /// Waiting jobs per home class (the smallest class that fits them), oldest first.
    waiting: Vec<VecDeque<u32>>,
    waiting_len: u64,
    /// Cached fronts of `waiting` (one per queue).
    prefix: Vec<WaitPrefix>,
    /// Per job slot: how many cached prefix entries name it.
    prefix_refs: Vec<u16>,
    /// Per class: the waiting queues a retry scans, in order.
    retry_queues: Vec<Vec<usize>>,
    /// Reused buffer of `retry_waiting`.
    kept: Vec<u32>,
    /// Heap parts of dropped lease terms and ended leases, reused by the next ones (the
    /// values are rewritten; only the allocations are recycled).
    spare_terms: Vec<(NetworkId, String)>,
    spare_history: Vec<Vec<Transition>>,
    leases: Vec<Option<LeaseRec>>,
    /// Per-agent totals (cold; `providers.csv`, `renters.csv`).
    pstats: Vec<ProviderStats>,
    rstats: Vec<RenterStats>,
    free_leases: Vec<u32>,
    /// Open visible offers per class, cheapest first (mirrors `vis`).
    book: Vec<OfferBook>,
    snaps: Vec<Snapshot>,
    free_snaps: Vec<u32>,
    /// What renters currently see of each provider (dense: the matching loops' hot data).
    vis: Vec<Option<Snapshot>>,
    cda: Vec<DoubleAuction<u64>>,
    auction_bids: Vec<Vec<SealedBid<u32>>>,
    next_identity: u32,
    /// GPUs leased and online now, per [`Population`].
    busy_gpus: [u64; 2],
    online_gpus: [u64; 2],
    integrated_to: u64,
    buckets: Vec<Bucket>,
    /// The welfare accounts of the periods (buckets).
    acc: welfare::Accounts,
    /// Per provider group: the strategy it prices by when not a built-in one (a caller's own
    /// through [`Market::with_plugins`], or prices from data).
    custom_pricing: Vec<Option<SharedPricing>>,
    bucket_ms: u64,
    waits: WaitHistogram,
    scratch: Vec<(u64, u32)>,
    result: RunResult,
    trust: TrustPolicy,
    /// Whether a reputation book trusts an identity it has no record of.
    strangers_trusted: bool,
    /// Per provider group: its attack.
    group_attack: Vec<GroupAttack>,
    /// The matching mechanism (taken out while one of its hooks runs; see [`Market::with_mech`]).
    mech: Option<Box<dyn Mechanism>>,
    /// The mechanism's [`Rules`], read once.
    rules: Rules,
    /// The completion record pool and network scores (network reputation, or tracked for a
    /// study that compares with it).
    net: Option<NetRep>,
    /// Whether renters choose by the network score (`mode = "network"`).
    net_choice: bool,
}

fn key_of(tag: u8, id: u32) -> PublicKey {
    let mut k = [0u8; 32];
    k[0] = tag;
    k[1..5].copy_from_slice(&id.to_le_bytes());
    PublicKey(k)
}

fn offer_id_of(identity: u32, seq: u32) -> OfferId {
    let mut d = [0u8; 32];
    d[0] = 0x0F;
    d[1..5].copy_from_slice(&identity.to_le_bytes());
    d[5..9].copy_from_slice(&seq.to_le_bytes());
    OfferId(Digest(d))
}

fn ts(ms: u64) -> Timestamp {
    fixtures::T0.plus_ms(ms)
}

/// The class a false-class group really has (`None` for other groups).
fn delivered_class<'a>(
    sc: &'a Scenario,
    g: &crate::scenario::ProviderGroup,
) -> Option<&'a crate::scenario::GpuClass> {
    if g.attack != Attack::FalseClass {
        return None;
    }
    sc.gpu_class.iter().find(|k| k.name == g.delivered_class)
}

/// Delivered over advertised throughput (TFLOPS), permille, at most 1000.
fn delivered_permille(sc: &Scenario, class: usize, g: &crate::scenario::ProviderGroup) -> u32 {
    let Some(d) = delivered_class(sc, g) else {
        return 1000;
    };
    let adv = sc.gpu_class[class].tflops;
    if adv <= 0.0 {
        return 1000;
    }
    ((d.tflops / adv).clamp(0.0, 1.0) * 1000.0).round() as u32
}

fn cda_job_key(job: u32) -> u64 {
    (1u64 << 40) | u64::from(job)
}

impl<'s> Market<'s> {
    /// Builds the world for one replication, matched by the scenario's `matching` mechanism.
    pub fn new(sc: &'s Scenario, seed: u64, replication: u64) -> Self {
        Self::with_mechanism(sc, seed, replication, builtin(sc))
    }

    /// Builds the world for one replication, matched by `mech` instead of the scenario's
    /// `matching` (which is then ignored). See [`Mechanism`].
    pub fn with_mechanism(
        sc: &'s Scenario,
        seed: u64,
        replication: u64,
        mech: Box<dyn Mechanism>,
    ) -> Self {
        Self::with_plugins(sc, seed, replication, mech, &no_pricing)
    }

    /// As [`Market::with_mechanism`], and each provider group's pricing strategy is what
    /// `pricing` returns for it, where it returns one (a researcher's own
    /// [`PricingStrategy`]); the group's `pricing` setting still gives the providers' first
    /// ask. Where it returns `None` the group prices as its setting says.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use gridlease_contracts::Money;
    /// use gridlease_contracts::pricing::{PricingInput, PricingStrategy};
    /// use gridlease_sim::market::{Market, builtin};
    /// use gridlease_sim::scenario::Scenario;
    ///
    /// /// Asks twice its cost.
    /// struct Double;
    /// impl PricingStrategy for Double {
    ///     fn quote(&self, input: &PricingInput, _: &mut dyn rand::RngCore) -> Money {
    ///         Money::from_micros(input.cost_floor.micros().saturating_mul(2))
    ///     }
    /// }
    /// let sc = Scenario::from_toml(include_str!("../scenarios/baseline.toml")).unwrap();
    /// let double = |g: &gridlease_sim::scenario::ProviderGroup| {
    ///     (g.name == "home-4090").then(|| Arc::new(Double) as gridlease_sim::market::SharedPricing)
    /// };
    /// let res = Market::with_plugins(&sc, 1, 0, builtin(&sc), &double).run();
    /// assert!(res.leases > 0);
    /// ```
    pub fn with_plugins(
        sc: &'s Scenario,
        seed: u64,
        replication: u64,
        mech: Box<dyn Mechanism>,
        pricing: &PricingHook,
    ) -> Self {
        let mut class_order: Vec<usize> = (0..sc.gpu_class.len()).collect();
        class_order.sort_by_key(|&i| (sc.gpu_class[i].vram_gib, i));
        let class_vram: Vec<u32> = sc.gpu_class.iter().map(|c| c.vram_gib).collect();
        let classes = sc.gpu_class.len();
        let c = &sc.channel;
        let mut providers = Vec::new();
        let mut custom_pricing = Vec::with_capacity(sc.provider.len());
        let mut floors = vec![(0u128, 0u64); classes];
        let mut next_identity = 0u32;
        for (gi, g) in sc.provider.iter().enumerate() {
            let class = sc
                .gpu_class
                .iter()
                .position(|k| k.name == g.class)
                .unwrap_or(0);
            // A built-in strategy stays in the provider (matched in place: every provider
            // re-prices every period); any other is shared through `custom_pricing`.
            let (builtin, start) = g.pricing.to_pricing();
            let custom = pricing(g).or_else(|| match &g.pricing {
                crate::scenario::PricingConfig::Empirical(e) => {
                    Some(Arc::new(e.clone()) as SharedPricing)
                }
                _ => None,
            });
            custom_pricing.push(custom);
            for _ in 0..g.count {
                let idx = providers.len() as u64;
                let mut rng = stream(seed, replication, StreamKind::Provider, idx);
                let identity = next_identity;
                next_identity += 1;
                let mut offer = fixtures::offer(key_of(1, identity), 1, g.gpus as u8, 0);
                for gpu in &mut offer.gpus {
                    gpu.spec.model.clone_from(&sc.gpu_class[class].name);
                    gpu.spec.vram_mib = sc.gpu_class[class].vram_gib * 1024;
                }
                offer.min_duration_s = 1;
                offer.min_billed_s = c.min_billed_s;
                offer.usage_interval_s = c.usage_interval_s;
                offer.pay_ahead_s = c.pay_ahead_s;
                let floor = g.cost_floor.0;
                floors[class].0 += u128::from(floor.micros());
                floors[class].1 += 1;
                let jitter = if g.jitter_minutes > 0 {
                    (rng.next_u64_below(u64::from(g.jitter_minutes) * 2 * 60_000 + 1)) as i64
                        - i64::from(g.jitter_minutes) * 60_000
                } else {
                    0
                };
                providers.push(Provider {
                    group: gi,
                    class,
                    gpus: g.gpus,
                    free: g.gpus,
                    online: false,
                    crashed: false,
                    identity,
                    offer: Box::new(offer),
                    offer_id: offer_id_of(identity, 1),
                    ask: start.max(floor),
                    cost_floor: floor,
                    pricing: builtin,
                    rng,
                    next_off_at: u64::MAX,
                    next_crash_at: u64::MAX,
                    busy_acc_ms: 0,
                    busy_since: 0,
                    pub_version: 0,
                    revenue: Money::ZERO,
                    attacker: g.is_attacker(),
                    inflation_permille: if g.attack == Attack::UsageInflation {
                        g.inflation_permille
                    } else {
                        1000
                    },
                    whitewash: g.whitewash,
                    jitter_ms: jitter.rem_euclid(DAY_MS as i64) as u64,
                });
            }
        }
        let mut renters = Vec::new();
        let mut group_first = Vec::new();
        let group_rngs = (0..sc.renter.len())
            .map(|g| stream(seed, replication, StreamKind::RenterGroup, g as u64))
            .collect();
        for (gi, g) in sc.renter.iter().enumerate() {
            group_first.push(renters.len());
            for _ in 0..g.count {
                let idx = renters.len() as u64;
                renters.push(Renter {
                    group: gi,
                    rng: stream(seed, replication, StreamKind::Renter, idx),
                    book: ReputationBook::new(),
                    distrusted: Vec::new(),
                });
            }
        }
        let horizon = (sc.days * DAY_MS as f64) as u64;
        let bucket_ms = u64::from(sc.bucket_minutes) * 60_000;
        let n_buckets = horizon.div_ceil(bucket_ms).max(1) as usize;
        let attacker_identities = providers.iter().filter(|p| p.attacker).count() as u64;
        let n_providers = providers.len();
        let n_renters = renters.len();
        let trust = TrustPolicy {
            min_permille: sc.reputation.min_permille,
            trust_newcomers: sc.reputation.trust_newcomers,
        };
        // A retry scans its own class's queue first, then those of smaller classes.
        let retry_queues = (0..classes)
            .map(|class| {
                let vram = class_vram[class];
                let mut queues: Vec<usize> = (0..classes)
                    .filter(|&q| q != class && class_vram[q] <= vram)
                    .collect();
                queues.sort_by_key(|&q| (std::cmp::Reverse(class_vram[q]), q));
                queues.insert(0, class);
                queues
            })
            .collect();
        Self {
            sc,
            q: EventQueue::new(),
            horizon,
            network: NetworkId::devnet(),
            images: ImagePolicy::default(),
            class_vram,
            providers,
            renters,
            group_rngs,
            group_first,
            jobs: Vec::new(),
            free_jobs: Vec::new(),
            waiting: vec![VecDeque::new(); classes],
            waiting_len: 0,
            prefix: (0..classes).map(|_| WaitPrefix::default()).collect(),
            prefix_refs: Vec::new(),
            retry_queues,
            kept: Vec::new(),
            spare_terms: Vec::new(),
            spare_history: Vec::new(),
            leases: Vec::new(),
            pstats: vec![
                ProviderStats {
                    identities: 1,
                    ..ProviderStats::default()
                };
                n_providers
            ],
            rstats: vec![RenterStats::default(); n_renters],
            free_leases: Vec::new(),
            book: (0..classes).map(|_| OfferBook::new()).collect(),
            snaps: Vec::new(),
            free_snaps: Vec::new(),
            vis: vec![None; n_providers],
            cda: (0..classes).map(|_| DoubleAuction::new()).collect(),
            auction_bids: Vec::new(),
            next_identity,
            busy_gpus: [0; 2],
            online_gpus: [0; 2],
            integrated_to: 0,
            buckets: (0..n_buckets).map(|_| Bucket::new(classes)).collect(),
            custom_pricing,
            acc: welfare::Accounts::new(
                n_buckets,
                sc.provider
                    .iter()
                    .map(|g| g.cost_floor.0.micros())
                    .collect(),
            ),
            bucket_ms,
            waits: WaitHistogram::new(),
            scratch: Vec::new(),
            result: RunResult {
                buckets: Vec::new(),
                bucket_ms,
                classes: sc.gpu_class.iter().map(|g| g.name.clone()).collect(),
                waits: WaitHistogram::new(),
                provider_revenue: Vec::new(),
                provider_attacker: Vec::new(),
                provider_group: Vec::new(),
                provider_stats: Vec::new(),
                renter_group: Vec::new(),
                renter_stats: Vec::new(),
                events: 0,
                channel_reports: 0,
                rejected_requests: 0,
                jobs_waiting_at_end: 0,
                resubmissions_waiting_at_end: 0,
                leases: 0,
                max_at_risk: 0,
                bound_violations: 0,
                attacker_leases: 0,
                attacker_revenue: 0,
                attacker_identities,
                class_cost_floor: floors
                    .iter()
                    .map(|&(s, n)| {
                        if n == 0 {
                            0
                        } else {
                            (s / u128::from(n)) as u64
                        }
                    })
                    .collect(),
                network: None,
                trace: None,
            },
            trust,
            strangers_trusted: ReputationBook::<u32>::new().trusts(&0, &trust),
            group_attack: sc
                .provider
                .iter()
                .map(|g| {
                    let class = sc
                        .gpu_class
                        .iter()
                        .position(|k| k.name == g.class)
                        .unwrap_or(0);
                    GroupAttack {
                        attack: g.attack,
                        delivered_permille: delivered_permille(sc, class, g),
                        delivered_vram: delivered_class(sc, g)
                            .map_or(sc.gpu_class[class].vram_gib, |d| d.vram_gib),
                    }
                })
                .collect(),
            rules: mech.rules(),
            mech: Some(mech),
            net: sc.reputation.network().then(|| NetRep::new(&sc.reputation)),
            net_choice: sc.reputation.network(),
        }
    }

    /// Records an event trace of at most `max_rows` rows (the first ones; later events are
    /// counted as dropped), returned in [`RunResult::trace`].
    pub fn with_trace(mut self, max_rows: usize) -> Self {
        self.result.trace = Some(Trace::new(max_rows));
        self
    }

    #[inline]
    fn trace(&mut self, row: impl FnOnce() -> TraceRow) {
        if let Some(t) = &mut self.result.trace {
            t.push(row());
        }
    }

    fn trace_provider(&mut self, kind: TraceKind, p: usize, now: u64) {
        let identity = self.providers[p].identity;
        self.trace(|| TraceRow {
            provider: Some(p as u32),
            identity: Some(identity),
            ..TraceRow::at(now, kind)
        });
    }

    /// Keeps the completion record pool and network scores even in the local mode, where
    /// renters do not use them (for a study that compares both modes; the outputs then carry
    /// the network columns for every point).
    pub fn track_network_scores(mut self) -> Self {
        if self.net.is_none() {
            self.net = Some(NetRep::new(&self.sc.reputation));
        }
        self
    }

    /// Mean network score of each population's and each group's providers (current
    /// identities).
    fn score_means(&self) -> ([f64; 2], Vec<f64>) {
        let groups = self.sc.provider.len();
        let Some(net) = &self.net else {
            return ([0.0; 2], vec![0.0; groups]);
        };
        let mut sum = [0.0f64; 2];
        let mut n = [0u64; 2];
        let mut gsum = vec![0.0f64; groups];
        let mut gn = vec![0u64; groups];
        for p in &self.providers {
            let k = Population::of(p.attacker) as usize;
            let s = net.score(p.identity);
            sum[k] += s;
            n[k] += 1;
            gsum[p.group] += s;
            gn[p.group] += 1;
        }
        let mean = |s: f64, n: u64| if n == 0 { 0.0 } else { s / n as f64 };
        (
            [0, 1].map(|k| mean(sum[k], n[k])),
            gsum.iter().zip(&gn).map(|(&s, &n)| mean(s, n)).collect(),
        )
    }

    fn on_scores(&mut self, now: u64) {
        // Buckets that end now record the scores renters saw until now.
        self.integrate(now);
        if let Some(net) = &mut self.net {
            net.recompute();
        }
        let every = u64::from(self.sc.reputation.score_interval_minutes) * 60_000;
        self.q.schedule(now + every, Ev::Scores);
    }

    /// A self-dealing group's period: each of its providers records leases "completed" for
    /// fresh renter keys of its own, paid with money that comes back to it.
    fn on_self_deal(&mut self, group: usize, now: u64) {
        let g = &self.sc.provider[group];
        let (keys, paid) = (g.self_dealing_keys, g.self_dealing_paid.0.micros());
        let every = u64::from(g.self_dealing_period_minutes) * 60_000;
        let mut made = 0;
        if let Some(net) = &mut self.net {
            for p in self.providers.iter().filter(|p| p.group == group) {
                for _ in 0..keys {
                    let key = net.fresh_key();
                    net.add(p.identity, key, paid, CompletionOutcome::Completed);
                    made += 1;
                }
            }
        }
        self.bucket_at(now).self_dealt += made;
        self.q.schedule(
            now + every,
            Ev::SelfDeal {
                group: group as u32,
            },
        );
    }

    fn bucket_at(&mut self, t: u64) -> &mut Bucket {
        let i = ((t / self.bucket_ms) as usize).min(self.buckets.len() - 1);
        &mut self.buckets[i]
    }

    /// Integrates busy and online GPU time up to `now`, split across bucket edges.
    fn integrate(&mut self, now: u64) {
        let now = now.min(self.horizon);
        while self.integrated_to < now {
            let b = self.integrated_to / self.bucket_ms;
            let edge = ((b + 1) * self.bucket_ms).min(now);
            let dt = u128::from(edge - self.integrated_to);
            let i = (b as usize).min(self.buckets.len() - 1);
            for k in 0..2 {
                let pop = &mut self.buckets[i].pop[k];
                pop.busy_gpu_ms += u128::from(self.busy_gpus[k]) * dt;
                pop.online_gpu_ms += u128::from(self.online_gpus[k]) * dt;
            }
            if edge == (b + 1) * self.bucket_ms {
                self.buckets[i].queue_len = self.waiting_len;
                if self.net.is_some() {
                    (self.buckets[i].score, self.buckets[i].group_score) = self.score_means();
                }
                self.integrated_to = edge;
                self.close_period(i, edge);
            }
            self.integrated_to = edge;
        }
    }

    fn delay(&mut self, provider: usize) -> u64 {
        let n = &self.sc.network;
        let rng = &mut self.providers[provider].rng;
        lognormal(rng, n.delay_median_ms, n.delay_sigma).max(0.0) as u64
    }

    /// Publishes the provider's current state; renters see it after the network delay.
    fn publish(&mut self, p: usize, now: u64) {
        let d = self.delay(p);
        let pr = &mut self.providers[p];
        pr.pub_version += 1;
        let snap = Snapshot {
            version: pr.pub_version,
            identity: pr.identity,
            seq: pr.offer.seq as u32,
            free: pr.free,
            available: pr.available(),
            price: pr.ask.micros(),
            until: now.saturating_add(u64::from(pr.offer.max_duration_s) * 1000),
        };
        // Snapshots wait in a slab so that queue entries stay small (the heap is the hot spot).
        let slot = match self.free_snaps.pop() {
            Some(i) => {
                self.snaps[i as usize] = snap;
                i
            }
            None => {
                self.snaps.push(snap);
                (self.snaps.len() - 1) as u32
            }
        };
        self.q.schedule(
            now + d,
            Ev::OfferVisible {
                provider: p as u32,
                slot,
            },
        );
    }

    /// Refreshes the offer's validity and duration bounds at `now`.
    fn refresh_offer(&mut self, p: usize, now: u64) {
        let pr = &mut self.providers[p];
        pr.offer.created_at = ts(now);
        pr.offer.expires_at = ts(now).plus_secs(3600);
        let left_s = pr.next_off_at.saturating_sub(now) / 1000;
        let max = left_s.min(MAX_OFFER_DURATION_S) as u32;
        pr.offer.max_duration_s = max.max(pr.offer.min_duration_s);
        pr.offer.price_per_gpu_hour = if self.rules.offer_carries_ask {
            pr.ask.micros()
        } else {
            pr.cost_floor.micros()
        };
    }

    fn set_busy(&mut self, p: usize, now: u64, delta_busy: i64) {
        self.integrate(now);
        let pr = &mut self.providers[p];
        let busy = u64::from(pr.gpus - pr.free);
        let dt = busy * now.saturating_sub(pr.busy_since);
        pr.busy_acc_ms += dt;
        pr.busy_since = now;
        self.pstats[p].busy_gpu_ms += u128::from(dt);
        let k = Population::of(pr.attacker) as usize;
        self.busy_gpus[k] = (self.busy_gpus[k] as i64 + delta_busy) as u64;
    }

    fn set_online(&mut self, p: usize, now: u64, available: bool) {
        self.integrate(now);
        let was = self.providers[p].available();
        let g = u64::from(self.providers[p].gpus);
        let k = Population::of(self.providers[p].attacker) as usize;
        let group = self.providers[p].group;
        if was && !available {
            self.online_gpus[k] -= g;
            let st = &mut self.pstats[p];
            st.online_ms += now.saturating_sub(st.online_since);
            self.supply_changed(group, now, -(g as i64));
        } else if !was && available {
            self.online_gpus[k] += g;
            self.pstats[p].online_since = now;
            self.supply_changed(group, now, g as i64);
        }
    }

    fn schedule_availability(&mut self, p: usize, now: u64) {
        let g = &self.sc.provider[self.providers[p].group];
        match g.availability {
            Availability::Always => {
                self.q.schedule(now, Ev::Online { provider: p as u32 });
            }
            Availability::OnOff => {
                let on = g.mean_on_hours;
                let off = g.mean_off_hours;
                let start_on = unit_open(&mut self.providers[p].rng) <= on / (on + off);
                if start_on {
                    self.q.schedule(now, Ev::Online { provider: p as u32 });
                } else {
                    let t = exponential(&mut self.providers[p].rng, off * HOUR_MS as f64) as u64;
                    self.q.schedule(now + t, Ev::Online { provider: p as u32 });
                }
            }
            Availability::Diurnal => {
                let t = self.next_diurnal_edge(p, now, true);
                if self.diurnal_online(p, now) {
                    self.q.schedule(now, Ev::Online { provider: p as u32 });
                } else {
                    self.q.schedule(t, Ev::Online { provider: p as u32 });
                }
            }
        }
    }

    fn diurnal_online(&self, p: usize, t: u64) -> bool {
        let pr = &self.providers[p];
        let g = &self.sc.provider[pr.group];
        let local = (t + DAY_MS - pr.jitter_ms) % DAY_MS;
        let from = u64::from(g.online_from_hour) * HOUR_MS;
        let to = u64::from(g.online_to_hour) * HOUR_MS;
        if from <= to {
            local >= from && local < to
        } else {
            local >= from || local < to
        }
    }

    /// Next time after `t` at which the provider comes online (`up`) or goes offline.
    fn next_diurnal_edge(&self, p: usize, t: u64, up: bool) -> u64 {
        let pr = &self.providers[p];
        let g = &self.sc.provider[pr.group];
        let hour = if up {
            g.online_from_hour
        } else {
            g.online_to_hour
        };
        let edge = (u64::from(hour) * HOUR_MS + pr.jitter_ms) % DAY_MS;
        let day_start = t - t % DAY_MS;
        let mut e = day_start + edge;
        while e <= t {
            e += DAY_MS;
        }
        e
    }

    fn sample_crash(&mut self, p: usize, now: u64) {
        let mtbf = self.sc.provider[self.providers[p].group].mtbf_hours;
        if mtbf > 0.0 {
            let t = exponential(&mut self.providers[p].rng, mtbf * HOUR_MS as f64) as u64;
            let at = now + t.max(1);
            self.providers[p].next_crash_at = at;
            self.q.schedule(at, Ev::Crash { provider: p as u32 });
        } else {
            self.providers[p].next_crash_at = u64::MAX;
        }
    }

    /// Schedules a renter group's next job. The group's renters are independent Poisson
    /// processes; their superposition is one Poisson process of the summed rate whose jobs go
    /// to a uniformly drawn renter. Times and the renter come from the group's stream; the job
    /// itself from the renter's stream. (One pending event per group instead of per renter
    /// keeps the queue small.)
    fn schedule_group_arrival(&mut self, gi: usize, now: u64) {
        let g = &self.sc.renter[gi];
        if g.count == 0 || (g.jobs_per_day <= 0.0 && g.interarrival_data.is_none()) {
            return;
        }
        let mean = DAY_MS as f64 / (g.jobs_per_day * f64::from(g.count));
        let rng = &mut self.group_rngs[gi];
        let mut t = now as f64;
        match (&g.interarrival_data, g.arrivals) {
            // A gap of the data, seconds (at least a millisecond: time moves on).
            (Some(d), _) => t += (d.sample(rng) * 1000.0).max(1.0),
            (None, Arrivals::Poisson) => t += exponential(rng, mean),
            (None, Arrivals::Diurnal) => {
                // Thinning: candidates at the peak rate, kept with rate(t) / peak.
                let a = g.diurnal_amplitude;
                let peak_mean = mean / (1.0 + a);
                loop {
                    t += exponential(rng, peak_mean);
                    let hour = (t / HOUR_MS as f64) % 24.0;
                    let phase = (hour - g.peak_hour) / 24.0 * std::f64::consts::TAU;
                    let rate = (1.0 + a * phase.cos()) / (1.0 + a);
                    if unit_open(rng) <= rate || t > self.horizon as f64 {
                        break;
                    }
                }
            }
        }
        if t <= self.horizon as f64 {
            self.q
                .schedule(t as u64, Ev::GroupArrival { group: gi as u32 });
        }
    }

    fn on_group_arrival(&mut self, gi: usize, now: u64) {
        self.schedule_group_arrival(gi, now);
        let n = u64::from(self.sc.renter[gi].count);
        let k = uniform_inclusive(&mut self.group_rngs[gi], 0, n - 1) as usize;
        self.on_arrival(self.group_first[gi] + k, now);
    }

    /// Runs the replication to the horizon.
    pub fn run(self) -> RunResult {
        self.run_observed(&|_| {})
    }

    /// Simulated duration of the run, ms.
    pub fn horizon_ms(&self) -> u64 {
        self.horizon
    }

    /// Runs to the horizon, calling `progress` with the simulated milliseconds covered since
    /// its last call (once per re-pricing period and at the end; for progress bars).
    pub fn run_observed(mut self, progress: &dyn Fn(u64)) -> RunResult {
        let mut reported = 0;
        for p in 0..self.providers.len() {
            self.schedule_availability(p, 0);
            self.sample_crash(p, 0);
        }
        for g in 0..self.sc.renter.len() {
            self.schedule_group_arrival(g, 0);
        }
        let period = u64::from(self.sc.repricing_minutes) * 60_000;
        self.q.schedule(period, Ev::Reprice);
        self.with_mech(|mech, m| mech.start(m, 0));
        if self.net.is_some() {
            let every = u64::from(self.sc.reputation.score_interval_minutes) * 60_000;
            self.q.schedule(every, Ev::Scores);
            for (gi, g) in self.sc.provider.iter().enumerate() {
                if g.self_dealing && g.self_dealing_keys > 0 {
                    let every = u64::from(g.self_dealing_period_minutes) * 60_000;
                    self.q.schedule(every, Ev::SelfDeal { group: gi as u32 });
                }
            }
        }
        while let Some((now, ev)) = self.q.pop_until(self.horizon) {
            match ev {
                Ev::GroupArrival { group } => self.on_group_arrival(group as usize, now),
                Ev::Patience { job, generation } => self.on_patience(job, generation, now),
                Ev::OfferVisible { provider, slot } => {
                    let snap = self.snaps[slot as usize];
                    self.free_snaps.push(slot);
                    self.on_visible(provider as usize, snap, now)
                }
                Ev::LeaseEnd { lease } => self.on_lease_end(lease, now),
                Ev::Online { provider } => self.on_online(provider as usize, now),
                Ev::Offline { provider } => self.on_offline(provider as usize, now),
                Ev::Crash { provider } => self.on_crash(provider as usize, now),
                Ev::Repair { provider } => self.on_repair(provider as usize, now),
                Ev::Reprice => {
                    progress(now - reported);
                    reported = now;
                    self.on_reprice(now);
                    self.q.schedule(now + period, Ev::Reprice);
                }
                Ev::JobTimer { job, generation } => {
                    let j = self.jobs[job as usize];
                    if j.generation == generation && j.state != JobState::Free {
                        self.with_mech(|mech, m| mech.job_timer(m, job, now));
                    }
                }
                Ev::Tick { token } => self.with_mech(|mech, m| mech.tick(m, token, now)),
                Ev::Scores => self.on_scores(now),
                Ev::SelfDeal { group } => self.on_self_deal(group as usize, now),
            }
        }
        self.integrate(self.horizon);
        self.close_all();
        if let Some(net) = &self.net {
            let means = self.score_means();
            if let Some(last) = self.buckets.last_mut() {
                (last.score, last.group_score) = means;
            }
            self.result.network = Some(NetworkResult {
                provider_score: self
                    .providers
                    .iter()
                    .map(|p| net.score(p.identity))
                    .collect(),
                provider_records: self
                    .providers
                    .iter()
                    .map(|p| net.records_of(p.identity) as u64)
                    .collect(),
                recomputes: net.recomputes,
            });
        }
        progress(self.horizon - reported);
        let mut res = self.result;
        res.events = self.q.popped();
        res.buckets = self.buckets;
        res.waits = self.waits;
        res.provider_revenue = self.providers.iter().map(|p| p.revenue.micros()).collect();
        res.provider_attacker = self.providers.iter().map(|p| p.attacker).collect();
        res.provider_group = self.providers.iter().map(|p| p.group).collect();
        res.renter_group = self.renters.iter().map(|r| r.group).collect();
        let horizon = self.horizon;
        for (pr, st) in self.providers.iter().zip(&mut self.pstats) {
            st.busy_gpu_ms +=
                u128::from(u64::from(pr.gpus - pr.free) * horizon.saturating_sub(pr.busy_since));
            if pr.available() {
                st.online_ms += horizon.saturating_sub(st.online_since);
            }
        }
        res.provider_stats = self.pstats;
        res.renter_stats = self.rstats;
        for j in self.jobs.iter().filter(|j| j.state != JobState::Free) {
            if j.resubmission {
                res.resubmissions_waiting_at_end += 1;
            } else {
                res.jobs_waiting_at_end += 1;
            }
        }
        res
    }

    fn on_online(&mut self, p: usize, now: u64) {
        if self.providers[p].online {
            return;
        }
        self.trace_provider(TraceKind::Online, p, now);
        self.set_online(p, now, !self.providers[p].crashed);
        self.providers[p].online = true;
        let g = &self.sc.provider[self.providers[p].group];
        let off_at = match g.availability {
            Availability::Always => u64::MAX,
            Availability::OnOff => {
                let on = g.mean_on_hours * HOUR_MS as f64;
                now + exponential(&mut self.providers[p].rng, on) as u64
            }
            Availability::Diurnal => self.next_diurnal_edge(p, now, false),
        };
        self.providers[p].next_off_at = off_at;
        if off_at != u64::MAX {
            self.q.schedule(off_at, Ev::Offline { provider: p as u32 });
        }
        self.refresh_offer(p, now);
        self.publish(p, now);
    }

    fn on_offline(&mut self, p: usize, now: u64) {
        self.trace_provider(TraceKind::Offline, p, now);
        let avail = self.providers[p].available();
        if avail {
            self.set_online(p, now, false);
        }
        self.providers[p].online = false;
        self.providers[p].next_off_at = now;
        self.publish(p, now);
        let g = &self.sc.provider[self.providers[p].group];
        let next_on = match g.availability {
            Availability::Always => now,
            Availability::OnOff => {
                let off = g.mean_off_hours * HOUR_MS as f64;
                now + exponential(&mut self.providers[p].rng, off) as u64
            }
            Availability::Diurnal => self.next_diurnal_edge(p, now, true),
        };
        self.q.schedule(next_on, Ev::Online { provider: p as u32 });
    }

    fn on_crash(&mut self, p: usize, now: u64) {
        if self.providers[p].next_crash_at != now || self.providers[p].crashed {
            return;
        }
        self.trace_provider(TraceKind::Crash, p, now);
        let avail = self.providers[p].available();
        if avail {
            self.set_online(p, now, false);
        }
        self.providers[p].crashed = true;
        // Renters notice the dead provider when its offer vanishes from their view.
        self.publish(p, now);
        let repair = self.sc.provider[self.providers[p].group].repair_minutes;
        let t = exponential(&mut self.providers[p].rng, repair * 60_000.0) as u64;
        self.q
            .schedule(now + t.max(1), Ev::Repair { provider: p as u32 });
    }

    fn on_repair(&mut self, p: usize, now: u64) {
        self.trace_provider(TraceKind::Repair, p, now);
        let online = self.providers[p].online;
        if online {
            self.set_online(p, now, true);
        }
        self.providers[p].crashed = false;
        self.sample_crash(p, now);
        self.refresh_offer(p, now);
        self.publish(p, now);
    }

    fn on_reprice(&mut self, now: u64) {
        let period = u64::from(self.sc.repricing_minutes) * 60_000;
        for p in 0..self.providers.len() {
            // Utilization over the period, from the provider's own busy integral.
            let pr = &mut self.providers[p];
            let busy = u64::from(pr.gpus - pr.free);
            let dt = busy * now.saturating_sub(pr.busy_since);
            pr.busy_acc_ms += dt;
            pr.busy_since = now;
            self.pstats[p].busy_gpu_ms += u128::from(dt);
            let util = (pr.busy_acc_ms * 1000 / (u64::from(pr.gpus) * period).max(1)).min(1000);
            pr.busy_acc_ms = 0;
            if !pr.available() {
                continue;
            }
            let class = pr.class;
            let cheapest = self.book[class]
                .iter()
                .find(|e| e.provider as usize != p)
                .map(|e| Money::from_micros(e.price));
            let pr = &mut self.providers[p];
            let input = PricingInput {
                cost_floor: pr.cost_floor,
                current: pr.ask,
                utilization_permille: util as u16,
                cheapest_competitor: cheapest,
            };
            let ask = quote(&self.custom_pricing, pr, &input);
            let changed = ask != pr.ask;
            if changed {
                pr.ask = ask;
                if self.rules.offer_carries_ask {
                    pr.offer.seq += 1;
                    pr.offer_id = offer_id_of(pr.identity, pr.offer.seq as u32);
                }
            }
            self.refresh_offer(p, now);
            if changed {
                self.publish(p, now);
            }
        }
    }

    fn new_job(&mut self, r: usize, now: u64) -> u32 {
        let g = &self.sc.renter[self.renters[r].group];
        let rng = &mut self.renters[r].rng;
        let dur_min = match &g.duration_data {
            Some(d) => d.sample(rng),
            None => lognormal(rng, g.duration_median_minutes, g.duration_sigma),
        };
        let duration_s = ((dur_min * 60.0) as u64).clamp(60, MAX_OFFER_DURATION_S) as u32;
        let val = match &g.valuation_data {
            // GLU per GPU-hour -> micro-units.
            Some(d) => (d.sample(rng) * 1e6).min(u64::MAX as f64 / 2.0),
            None => lognormal(rng, g.valuation_median.0.micros() as f64, g.valuation_sigma),
        };
        let defaults = bernoulli(rng, g.default_probability);
        let job = Job {
            renter: r as u32,
            generation: 0,
            state: JobState::Waiting,
            gpus: g.gpus,
            min_vram: g.min_vram_gib,
            duration_s,
            valuation: Money::from_micros(val.max(1.0) as u64),
            arrived: now,
            defaults,
            resubmission: false,
        };
        if let Some(id) = self.free_jobs.pop() {
            self.touch_job(id);
            let generation = self.jobs[id as usize].generation + 1;
            self.jobs[id as usize] = Job { generation, ..job };
            id
        } else {
            self.jobs.push(job);
            (self.jobs.len() - 1) as u32
        }
    }

    fn release_job(&mut self, job: u32) {
        if self.jobs[job as usize].state != JobState::Free {
            self.touch_job(job);
            self.jobs[job as usize].state = JobState::Free;
            self.free_jobs.push(job);
        }
    }

    /// Called before a job slot changes: drops the cached queue fronts that name it.
    fn touch_job(&mut self, job: u32) {
        if self.prefix_refs.get(job as usize).is_some_and(|&n| n > 0) {
            for q in 0..self.prefix.len() {
                self.invalidate_prefix(q);
            }
        }
    }

    fn invalidate_prefix(&mut self, q: usize) {
        let c = &mut self.prefix[q];
        if c.valid {
            c.valid = false;
            for &slot in &c.slots {
                self.prefix_refs[slot as usize] -= 1;
            }
        }
    }

    /// Caches the front of waiting queue `q` (see [`WaitPrefix`]) unless it is cached.
    fn build_prefix(&mut self, q: usize) {
        if self.prefix[q].valid {
            return;
        }
        if self.prefix_refs.len() < self.jobs.len() {
            self.prefix_refs.resize(self.jobs.len(), 0);
        }
        let c = &mut self.prefix[q];
        c.slots.clear();
        c.jobs.clear();
        c.stale = false;
        c.max_valuation = 0;
        c.min_duration_s = u32::MAX;
        c.min_gpus = u16::MAX;
        for &job in &self.waiting[q] {
            c.slots.push(job);
            self.prefix_refs[job as usize] += 1;
            let j = &self.jobs[job as usize];
            if j.state != JobState::Waiting {
                c.stale = true;
                continue;
            }
            c.jobs.push(WaitingJob {
                renter: j.renter,
                duration_s: j.duration_s,
                valuation: j.valuation.micros(),
                gpus: j.gpus,
            });
            c.max_valuation = c.max_valuation.max(j.valuation.micros());
            c.min_duration_s = c.min_duration_s.min(j.duration_s);
            c.min_gpus = c.min_gpus.min(j.gpus);
            if c.jobs.len() == WAIT_SCAN {
                break;
            }
        }
        c.valid = true;
    }

    fn on_arrival(&mut self, r: usize, now: u64) {
        self.trace(|| TraceRow {
            renter: Some(r as u32),
            ..TraceRow::at(now, TraceKind::Arrival)
        });
        let job = self.new_job(r, now);
        self.bucket_at(now).jobs += 1;
        self.rstats[r].jobs += 1;
        self.enqueue(r, job, now);
    }

    /// A job starts looking for a provider: patience clock, first match attempt, queue.
    fn enqueue(&mut self, r: usize, job: u32, now: u64) {
        self.integrate(now);
        self.waiting_len += 1;
        let patience = self.sc.renter[self.renters[r].group].patience_mean_minutes;
        let t = exponential(&mut self.renters[r].rng, patience * 60_000.0) as u64;
        let generation = self.jobs[job as usize].generation;
        // The patience draw is always made (streams stay aligned); the event only when waiting.
        if !self.try_match(job, now) {
            self.push_waiting(job);
            self.q.schedule(now + t, Ev::Patience { job, generation });
        }
    }

    fn on_patience(&mut self, job: u32, generation: u32, now: u64) {
        let j = self.jobs[job as usize];
        if j.generation != generation || j.state == JobState::Free {
            return;
        }
        self.trace(|| TraceRow {
            renter: Some(j.renter),
            ..TraceRow::at(now, TraceKind::Abandon)
        });
        self.integrate(now);
        self.waiting_len -= 1;
        let b = self.bucket_at(now);
        if j.resubmission {
            b.resubmissions_abandoned += 1;
        } else {
            b.jobs_abandoned += 1;
            self.rstats[j.renter as usize].jobs_abandoned += 1;
        }
        self.with_mech(|mech, m| mech.withdraw(m, job));
        self.account_abandon(&j, now);
        self.release_job(job);
    }

    /// Tries to place a waiting job: at once (posted), by opening an auction, or by bidding.
    fn try_match(&mut self, job: u32, now: u64) -> bool {
        self.with_mech(|mech, m| mech.place(m, job, now))
    }

    /// Whether the network score (network mode: the pool's last recomputation) and the
    /// renter's reputation book accept `identity`. A book's score changes only when a lease
    /// with that identity is recorded, so the book's verdict on every identity it has a record
    /// of is kept in `distrusted` (asked of the book after each record); identities without a
    /// record get the book's verdict on a stranger, asked once.
    fn trusted(&self, renter: u32, identity: u32) -> bool {
        if self.net_choice
            && let Some(net) = &self.net
            && net.score(identity) < self.sc.reputation.min_score
        {
            return false;
        }
        if !self.sc.reputation.enabled {
            return true;
        }
        let r = &self.renters[renter as usize];
        if self.strangers_trusted {
            !r.distrusted.contains(&identity)
        } else {
            r.book.trusts(&identity, &self.trust)
        }
    }

    /// Visible, feasible offers for `job`, cheapest first: (price, provider).
    fn candidates(&mut self, job: u32, limit_per_class: usize, now: u64) -> Vec<(u64, u32)> {
        let j = self.jobs[job as usize];
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        for class in 0..self.book.len() {
            if self.class_vram[class] < j.min_vram {
                continue;
            }
            let mut n = 0;
            let end = now + u64::from(j.duration_s) * 1000;
            // Book entries carry their provider's visible snapshot (`vis`), so no lookup.
            for v in self.book[class].iter_until(end) {
                if v.price > j.valuation.micros() || n >= limit_per_class {
                    break;
                }
                if v.free >= j.gpus && end <= v.until && self.trusted(j.renter, v.identity) {
                    out.push((v.price, v.provider));
                    n += 1;
                }
            }
        }
        out.sort_unstable();
        out
    }

    fn match_posted(&mut self, job: u32, now: u64) -> bool {
        let mut cands = self.candidates(job, CANDIDATES_PER_CLASS, now);
        if self.net_choice
            && let Some(net) = &self.net
        {
            // Price per expected completion: the price over the provider's network score.
            let per_score = |&(price, p): &(u64, u32)| {
                let id = self.vis[p as usize].map_or(0, |v| v.identity);
                price as f64 / net.score(id).max(1e-9)
            };
            cands.sort_by(|a, b| per_score(a).total_cmp(&per_score(b)).then(a.cmp(b)));
        }
        let mut done = false;
        for &(price, p) in &cands {
            if self.request(job, p as usize, Money::from_micros(price), now) {
                done = true;
                break;
            }
        }
        self.scratch = cands;
        done
    }

    /// The renter sends a lease request at `price` for the provider's visible offer; the
    /// provider decides with the real `check_request`. On acceptance the lease starts.
    fn request(&mut self, job: u32, p: usize, price: Money, now: u64) -> bool {
        let j = self.jobs[job as usize];
        let pr = &self.providers[p];
        let Some(vis) = self.vis[p] else {
            return false;
        };
        if !pr.available() {
            // Nobody answers: the renter's request times out.
            self.result.rejected_requests += 1;
            return false;
        }
        let c = &self.sc.channel;
        let tariff_budget =
            default_budget(j.duration_s, c.min_billed_s, j.gpus, price).unwrap_or(Money::ZERO);
        let (network, image) = match self.spare_terms.pop() {
            Some((mut network, mut image)) => {
                if network != self.network {
                    network = self.network.clone();
                }
                if image != SIM_IMAGE {
                    image.clear();
                    image.push_str(SIM_IMAGE);
                }
                (network, image)
            }
            None => (self.network.clone(), SIM_IMAGE.to_string()),
        };
        let terms = LeaseTerms {
            volume: None,
            mounts: Vec::new(),
            settlement: None,
            verify_window_s: 0,
            network,
            offer_id: offer_id_of(vis.identity, vis.seq),
            offer_seq: u64::from(vis.seq),
            provider: key_of(1, vis.identity),
            renter: key_of(2, j.renter),
            gpu_count: j.gpus,
            per_gpu: pr.offer.per_gpu,
            price_per_gpu_hour: price.micros(),
            duration_s: j.duration_s,
            min_billed_s: c.min_billed_s,
            usage_interval_s: c.usage_interval_s,
            pay_ahead_s: c.pay_ahead_s,
            grace_s: c.grace_s,
            max_total: tariff_budget.micros(),
            network_policy: NetworkPolicy::None,
            image,
            command: Vec::new(),
            env: Default::default(),
            nonce: u64::from(job) << 32 | u64::from(j.generation),
            created_at: ts(now),
            output_retention_s: 0,
            upload_hold_s: 0,
            prepay_s: 0,
        };
        let request = LeaseRequest {
            terms,
            expires_at: ts(now).plus_secs(60),
        };
        let view = ProviderView {
            network: &self.network,
            images: &self.images,
            offer: &pr.offer,
            offer_id: pr.offer_id,
            equivalent: &[],
            free_gpus: pr.free,
            now: ts(now),
        };
        match check_request(&view, &request, &request.terms.renter) {
            Ok(id) => {
                self.start_lease(job, p, id, request.terms, now);
                true
            }
            Err(_) => {
                self.result.rejected_requests += 1;
                self.recycle_terms(request.terms);
                false
            }
        }
    }

    /// Keeps the allocations of terms that are no longer needed for the next request.
    fn recycle_terms(&mut self, terms: LeaseTerms) {
        if self.spare_terms.len() < SPARE_MAX {
            self.spare_terms.push((terms.network, terms.image));
        }
    }

    fn start_lease(&mut self, job: u32, p: usize, id: LeaseId, terms: LeaseTerms, now: u64) {
        let j = self.jobs[job as usize];
        let gpus = j.gpus;
        let class = self.providers[p].class;
        let mut lease = Lease::propose(id, terms);
        // Six transitions at most (accept, begin start, started, close, settle): allocate once,
        // or reuse the (emptied) history of an ended lease.
        match self.spare_history.pop() {
            Some(history) if lease.history.is_empty() => lease.history = history,
            _ => lease.history.reserve(6),
        }
        let t = ts(now);
        // The provider's side of the lifecycle; these transitions are legal by construction.
        let _ = lease.apply(LeaseEvent::Accept, Actor::Provider, t);
        // Draw what can end the lease early, then run its channel.
        let duration_ms = u64::from(j.duration_s) * 1000;
        let stops_at = if j.defaults {
            let u = unit_open(&mut self.renters[j.renter as usize].rng);
            Some((u * duration_ms as f64) as u64)
        } else {
            None
        };
        let crash_rel = self.providers[p].next_crash_at.saturating_sub(now);
        let inflation = self.providers[p].inflation_permille;
        let ga = self.group_attack[self.providers[p].group];
        let attack = ga.attack;
        let mut kind = LeaseKind::Normal;
        let out = if attack == Attack::NoShow {
            // Accepted, never started: the renter gives up after the start allowance and two
            // report intervals without a word (the node's renter session), nothing paid.
            let c = &self.sc.channel;
            let wait_ms =
                (u64::from(c.start_allowance_s) + 2 * u64::from(c.usage_interval_s)) * 1000;
            kind = LeaseKind::NoShow;
            ChannelOutcome {
                end_ms: wait_ms,
                reason: CloseReason::ProviderUnreachable,
                failed: true,
                paid: Money::ZERO,
                honest_due: Money::ZERO,
                unpaid: Money::ZERO,
                bound: Money::ZERO,
                caught: false,
                real_wall_ms: 0,
            }
        } else {
            let _ = lease.apply(LeaseEvent::BeginStart, Actor::Provider, t);
            let _ = lease.apply(LeaseEvent::Started, Actor::Provider, t);
            // A false class is caught when the renter benchmarks at start, or when the job
            // does not fit the delivered memory: the lease fails at the benchmark's end.
            let mut detect_at = u64::MAX;
            if attack == Attack::FalseClass {
                let r = j.renter as usize;
                let g = &self.sc.renter[self.renters[r].group];
                let (prob, bench_ms) = (g.benchmark_probability, u64::from(g.benchmark_s) * 1000);
                let benchmarks = bernoulli(&mut self.renters[r].rng, prob);
                if benchmarks || ga.delivered_vram < j.min_vram {
                    detect_at = bench_ms.max(1);
                }
                kind = LeaseKind::FalseClassUndetected;
            }
            let mut out = run_channel(
                &lease.terms,
                id,
                now,
                crash_rel.min(detect_at),
                stops_at,
                inflation,
                &mut self.result.channel_reports,
            );
            if detect_at < crash_rel
                && out.reason == CloseReason::ProviderUnreachable
                && out.end_ms == detect_at
            {
                // No close reason says "not the hardware offered"; a failed start is the
                // provider's failure in both the local book and the network record.
                out.reason = CloseReason::StartFailed;
                kind = LeaseKind::FalseClassDetected;
            }
            out
        };
        // Book keeping: wait, price, capacity.
        self.integrate(now);
        self.waiting_len -= 1;
        let wait = now - j.arrived;
        if !j.resubmission {
            self.waits.add(wait);
        }
        let pop = Population::of(self.providers[p].attacker) as usize;
        let b = self.bucket_at(now);
        if j.resubmission {
            b.resubmissions_matched += 1;
            b.resubmission_wait_sum_ms += wait;
        } else {
            b.jobs_matched += 1;
            b.wait_sum_ms += wait;
        }
        let pb = &mut b.pop[pop];
        pb.leases += 1;
        pb.price_gpu_sum[class] += u128::from(lease.terms.price_per_gpu_hour) * u128::from(gpus);
        pb.price_gpus[class] += u64::from(gpus);
        let rs = &mut self.rstats[j.renter as usize];
        rs.leases += 1;
        if !j.resubmission {
            rs.jobs_matched += 1;
            rs.wait_sum_ms += wait;
        }
        self.pstats[p].leases += 1;
        self.set_busy(p, now, i64::from(gpus));
        self.providers[p].free -= gpus;
        let seq = self.result.leases;
        self.result.leases += 1;
        let identity = self.providers[p].identity;
        let price = Money::from_micros(lease.terms.price_per_gpu_hour);
        self.trace(|| TraceRow {
            renter: Some(j.renter),
            provider: Some(p as u32),
            identity: Some(identity),
            lease: Some(seq),
            amount: Some(price),
            ..TraceRow::at(now, TraceKind::LeaseStart)
        });
        let delivered = if kind == LeaseKind::FalseClassUndetected {
            ga.delivered_permille
        } else {
            1000
        };
        self.account_lease(&j, p, now, &out, delivered);
        let rec = LeaseRec {
            seq,
            kind,
            lease,
            provider: p as u32,
            renter: j.renter,
            identity,
            valuation: j.valuation,
            outcome: out,
            renter_defaulted: stops_at.is_some_and(|s| s < out.end_ms),
        };
        let slot = if let Some(s) = self.free_leases.pop() {
            self.leases[s as usize] = Some(rec);
            s
        } else {
            self.leases.push(Some(rec));
            (self.leases.len() - 1) as u32
        };
        self.q
            .schedule(now + out.end_ms, Ev::LeaseEnd { lease: slot });
        self.release_job(job);
        self.refresh_offer(p, now);
        self.publish(p, now);
    }

    fn on_lease_end(&mut self, slot: u32, now: u64) {
        let Some(mut rec) = self.leases[slot as usize].take() else {
            return;
        };
        self.free_leases.push(slot);
        let out = rec.outcome;
        self.trace(|| TraceRow {
            renter: Some(rec.renter),
            provider: Some(rec.provider),
            identity: Some(rec.identity),
            lease: Some(rec.seq),
            amount: Some(out.paid),
            reason: Some(out.reason),
            ..TraceRow::at(now, TraceKind::LeaseEnd)
        });
        let t = ts(now);
        let actor = if out.reason == CloseReason::ImplausibleUsage {
            Actor::Renter
        } else {
            Actor::Provider
        };
        if matches!(
            out.reason,
            CloseReason::ProviderUnreachable | CloseReason::StartFailed
        ) {
            let _ = rec
                .lease
                .apply(LeaseEvent::Fail(out.reason), Actor::Local, t);
        } else {
            let _ = rec.lease.apply(LeaseEvent::Close(out.reason), actor, t);
            let _ = rec
                .lease
                .apply(LeaseEvent::Settle { total: out.paid }, actor, t);
        }
        let p = rec.provider as usize;
        let gpus = rec.lease.terms.gpu_count;
        self.set_busy(p, now, -i64::from(gpus));
        self.providers[p].free += gpus;
        let pr = &mut self.providers[p];
        pr.revenue = pr.revenue.checked_add(out.paid).unwrap_or(pr.revenue);
        let attacker = pr.attacker;
        // Renter surplus: what the usage was worth to it minus what it paid.
        let full = cost(out.real_wall_ms / 1000, gpus, rec.valuation).unwrap_or(Money::ZERO);
        // A false class delivers a share of the throughput the renter valued.
        let worth = if rec.kind == LeaseKind::FalseClassUndetected {
            let share = self.group_attack[self.providers[p].group].delivered_permille;
            (u128::from(full.micros()) * u128::from(share) / 1000) as u64
        } else {
            full.micros()
        };
        let surplus = i128::from(worth) - i128::from(out.paid.micros());
        let b = self.bucket_at(now);
        match rec.kind {
            LeaseKind::Normal => {}
            LeaseKind::NoShow => {
                b.no_shows += 1;
                b.no_show_lost_ms += out.end_ms;
            }
            LeaseKind::FalseClassDetected => {
                b.false_class_detected += 1;
                b.false_class_lost_ms += out.end_ms;
            }
            LeaseKind::FalseClassUndetected => {
                b.false_class_undetected += 1;
                b.false_class_shortfall += full.micros() - worth;
            }
        }
        let pb = &mut b.pop[Population::of(attacker) as usize];
        pb.ended += 1;
        pb.revenue += out.paid.micros();
        pb.surplus += surplus;
        pb.used_gpu_ms += u128::from(out.real_wall_ms) * u128::from(gpus);
        if out.failed {
            pb.failed += 1;
            pb.unpaid += out.unpaid.micros();
            pb.failed_paid += out.paid.micros();
        }
        if out.caught {
            b.caught += 1;
        }
        if let Some(net) = &mut self.net {
            // The co-signed completion this lease leaves (both sides assumed to sign it, even
            // a failure: see docs/simulations.md, limits).
            net.add(
                rec.identity,
                Key::Renter(rec.renter),
                out.paid.micros(),
                CompletionOutcome::of_close(out.reason),
            );
        }
        let st = &mut self.pstats[p];
        st.ended += 1;
        st.used_gpu_ms += u128::from(out.real_wall_ms) * u128::from(gpus);
        if out.failed {
            st.failed += 1;
            st.unpaid += out.unpaid.micros();
        }
        let rs = &mut self.rstats[rec.renter as usize];
        rs.paid += out.paid.micros();
        rs.surplus += surplus;
        let b = self.bucket_at(now);
        if attacker {
            b.attacker_profit +=
                i128::from(out.paid.micros()) - i128::from(out.honest_due.micros());
            self.result.attacker_leases += 1;
            self.result.attacker_revenue += out.paid.micros();
        } else {
            // Only honest providers' unpaid usage is a loss the channel must bound; an
            // attacker's is its own refused (inflated) claim.
            self.result.max_at_risk = self.result.max_at_risk.max(out.unpaid.micros());
            if out.unpaid > out.bound {
                self.result.bound_violations += 1;
            }
        }
        if !rec.renter_defaulted {
            self.renters[rec.renter as usize]
                .book
                .record(rec.identity, Outcome::for_provider(out.reason));
            let r = &mut self.renters[rec.renter as usize];
            let trusted = r.book.trusts(&rec.identity, &self.trust);
            let listed = r.distrusted.iter().position(|&i| i == rec.identity);
            match (trusted, listed) {
                (false, None) => r.distrusted.push(rec.identity),
                (true, Some(at)) => {
                    r.distrusted.swap_remove(at);
                }
                _ => {}
            }
        }
        if out.caught && self.providers[p].whitewash && self.providers[p].identity == rec.identity {
            // Rejoin under a fresh identity: a new key and a new offer.
            let id = self.next_identity;
            self.next_identity += 1;
            self.result.attacker_identities += 1;
            self.pstats[p].identities += 1;
            let pr = &mut self.providers[p];
            pr.identity = id;
            pr.offer.provider = key_of(1, id);
            pr.offer.seq += 1;
            pr.offer_id = offer_id_of(id, pr.offer.seq as u32);
        }
        self.refresh_offer(p, now);
        self.publish(p, now);
        if out.caught
            || matches!(
                out.reason,
                CloseReason::ProviderUnreachable | CloseReason::StartFailed
            )
        {
            // The renter still needs the rest of its job: it submits it again.
            let left_s = (u64::from(rec.lease.terms.duration_s) * 1000)
                .saturating_sub(out.real_wall_ms)
                / 1000;
            if left_s >= 60 {
                let gpus = rec.lease.terms.gpu_count;
                self.resubmit(rec.renter as usize, left_s as u32, rec.valuation, gpus, now);
            }
        }
        let Lease {
            terms, mut history, ..
        } = rec.lease;
        self.recycle_terms(terms);
        if self.spare_history.len() < SPARE_MAX {
            history.clear();
            self.spare_history.push(history);
        }
    }

    fn resubmit(&mut self, r: usize, duration_s: u32, valuation: Money, gpus: u16, now: u64) {
        self.trace(|| TraceRow {
            renter: Some(r as u32),
            ..TraceRow::at(now, TraceKind::Resubmission)
        });
        let job = self.new_job(r, now);
        self.touch_job(job);
        let j = &mut self.jobs[job as usize];
        j.duration_s = duration_s;
        j.valuation = valuation;
        j.gpus = gpus;
        j.defaults = false;
        j.resubmission = true;
        self.bucket_at(now).resubmissions += 1;
        self.rstats[r].resubmissions += 1;
        self.enqueue(r, job, now);
    }

    fn on_visible(&mut self, p: usize, snap: Snapshot, now: u64) {
        let class = self.providers[p].class;
        let open = snap.available && snap.free > 0;
        // Waiting renters search again only when the offer got more attractive: newly open,
        // more free GPUs, a lower price, or a new identity.
        let mut better = open;
        if let Some(old) = self.vis[p] {
            if old.version >= snap.version {
                return;
            }
            let was_open = old.available && old.free > 0;
            // The book holds exactly the open offers.
            if was_open {
                self.book[class].remove(old.price, p as u32);
            }
            better = open
                && (!was_open
                    || snap.free > old.free
                    || snap.price < old.price
                    || snap.identity != old.identity);
        }
        self.vis[p] = Some(snap);
        if open {
            self.book[class].insert(Entry {
                price: snap.price,
                provider: p as u32,
                identity: snap.identity,
                until: snap.until,
                free: snap.free,
            });
        }
        let retry = self.with_mech(|mech, m| mech.offer_visible(m, p, open, better, now));
        if retry {
            self.retry_waiting(p, now);
        }
    }

    /// The double auction's reaction to a visible offer update: the provider's ask for its
    /// free GPUs (or its withdrawal); crossing bids become leases.
    fn ask_cda(&mut self, p: usize, snap: Snapshot, open: bool, now: u64) {
        let class = self.providers[p].class;
        if open {
            let key = p as u64;
            let trades = self.cda[class].submit_ask(
                key,
                Money::from_micros(snap.price),
                u32::from(snap.free),
            );
            for tr in trades {
                let job = (tr.buyer & 0xFFFF_FFFF) as u32;
                let renter = self.jobs[job as usize].renter;
                if !(self.trusted(renter, snap.identity) && self.request(job, p, tr.price, now)) {
                    // The trade could not become a lease (stale view): bid again later.
                    self.push_waiting(job);
                }
            }
        } else {
            self.cda[class].cancel(p as u64);
        }
    }

    fn push_waiting(&mut self, job: u32) {
        let c = self.home_class(self.jobs[job as usize].min_vram);
        self.waiting[c].push_back(job);
        if self.prefix[c].jobs.len() < WAIT_SCAN {
            // The cached front covered the whole queue; now it would not.
            self.invalidate_prefix(c);
        }
    }

    /// A newly visible, more attractive offer: waiting jobs it could serve try again, oldest
    /// first -- its own class's queue first, then the queues of smaller classes.
    fn retry_waiting(&mut self, p: usize, now: u64) {
        let class = self.providers[p].class;
        let mut scanned = 0;
        for qi in 0..self.retry_queues[class].len() {
            let q = self.retry_queues[class][qi];
            let stop = match self.retry_unchanged(q, p, WAIT_SCAN - scanned, now) {
                Some((stop, examined)) => {
                    scanned += examined;
                    stop
                }
                None => {
                    let stop = self.retry_queue(q, p, &mut scanned, now);
                    self.invalidate_prefix(q);
                    stop
                }
            };
            if stop || scanned >= WAIT_SCAN {
                break;
            }
        }
    }

    /// The common case of a retry, answered from the cached queue front: when the scan of
    /// queue `q` (with `budget` jobs left to examine) would change nothing -- it drops no stale
    /// entry and no job it examines fits -- returns what it would have returned (whether it
    /// stopped, jobs examined). `None`: the scan must run.
    fn retry_unchanged(
        &mut self,
        q: usize,
        p: usize,
        budget: usize,
        now: u64,
    ) -> Option<(bool, usize)> {
        self.build_prefix(q);
        let c = &self.prefix[q];
        if c.stale {
            return None;
        }
        if c.jobs.is_empty() {
            // The queue is empty.
            return Some((false, 0));
        }
        // The scan would stop at the first job, and put it back.
        let Some(v) = self.vis[p] else {
            return Some((true, 1));
        };
        if !(v.available && v.free > 0) || self.providers[p].free == 0 {
            return Some((true, 1));
        }
        let k = budget.min(c.jobs.len());
        let gate = self.rules.price_gates_retry;
        let none_fit_any = v.free < c.min_gpus
            || now + u64::from(c.min_duration_s) * 1000 > v.until
            || (gate && v.price > c.max_valuation);
        if !none_fit_any {
            for w in &c.jobs[..k] {
                let fits = v.free >= w.gpus
                    && now + u64::from(w.duration_s) * 1000 <= v.until
                    && (!gate || v.price <= w.valuation)
                    && self.trusted(w.renter, v.identity);
                if fits {
                    return None;
                }
            }
        }
        Some((false, k))
    }

    /// Scans waiting queue `q` for a retry, oldest first: drops jobs no longer waiting, and
    /// lets each waiting one that fits the offer try to match, until `scanned` reaches
    /// `WAIT_SCAN`. Returns whether it stopped because the offer is gone.
    fn retry_queue(&mut self, q: usize, p: usize, scanned: &mut usize, now: u64) -> bool {
        let mut kept = std::mem::take(&mut self.kept);
        kept.clear();
        let mut stop = false;
        while *scanned < WAIT_SCAN {
            let Some(job) = self.waiting[q].pop_front() else {
                break;
            };
            let j = self.jobs[job as usize];
            if j.state != JobState::Waiting {
                continue;
            }
            *scanned += 1;
            let Some(v) = self.vis[p] else {
                kept.push(job);
                stop = true;
                break;
            };
            // Once the freed GPUs are taken, the other renters racing for them would only
            // be refused; they are not modelled as requests.
            if !(v.available && v.free > 0) || self.providers[p].free == 0 {
                kept.push(job);
                stop = true;
                break;
            }
            let fits = v.free >= j.gpus
                && now + u64::from(j.duration_s) * 1000 <= v.until
                && (!self.rules.price_gates_retry || v.price <= j.valuation.micros())
                && self.trusted(j.renter, v.identity);
            if !(fits && self.try_match(job, now)) {
                let j = self.jobs[job as usize];
                if j.state == JobState::Waiting {
                    kept.push(job);
                }
            }
        }
        for &job in kept.iter().rev() {
            self.waiting[q].push_front(job);
        }
        self.kept = kept;
        stop
    }

    // ---- reverse auction ----

    fn open_auction(&mut self, job: u32, now: u64) {
        let j = self.jobs[job as usize];
        if j.state != JobState::Waiting {
            return;
        }
        let max = self.sc.auction.max_bidders as usize;
        let cands = self.candidates(job, max, now);
        let mut bids = Vec::with_capacity(cands.len().min(max));
        for &(_, p) in cands.iter().take(max) {
            let pr = &mut self.providers[p as usize];
            let input = PricingInput {
                cost_floor: pr.cost_floor,
                current: pr.ask,
                utilization_permille: 0,
                cheapest_competitor: None,
            };
            let price = quote(&self.custom_pricing, pr, &input);
            bids.push(SealedBid { owner: p, price });
        }
        self.scratch = cands;
        let idx = job as usize;
        if self.auction_bids.len() <= idx {
            self.auction_bids.resize_with(idx + 1, Vec::new);
        }
        self.auction_bids[idx] = bids;
        self.touch_job(job);
        self.jobs[idx].state = JobState::Held;
        let close = now + u64::from(self.sc.auction.bid_window_s) * 1000;
        self.q.schedule(
            close,
            Ev::JobTimer {
                job,
                generation: j.generation,
            },
        );
    }

    fn on_auction_close(&mut self, job: u32, generation: u32, now: u64) {
        let j = self.jobs[job as usize];
        if j.generation != generation || j.state != JobState::Held {
            return;
        }
        let mut bids = std::mem::take(&mut self.auction_bids[job as usize]);
        self.touch_job(job);
        self.jobs[job as usize].state = JobState::Waiting;
        while let Some(i) = reverse_auction_winner(&bids, j.valuation) {
            let b = bids.swap_remove(i);
            if self.request(job, b.owner as usize, b.price, now) {
                return;
            }
        }
        self.push_waiting(job);
    }

    // ---- continuous double auction ----

    fn bid_cda(&mut self, job: u32, now: u64) -> bool {
        let j = self.jobs[job as usize];
        // The job bids in the smallest class that fits it.
        let Some(class) = (0..self.class_vram.len())
            .filter(|&c| self.class_vram[c] >= j.min_vram)
            .min_by_key(|&c| (self.class_vram[c], c))
        else {
            return false;
        };
        let trade = self.cda[class].submit_bid(cda_job_key(job), j.valuation, u32::from(j.gpus));
        match trade {
            Some(tr) => {
                let p = tr.seller as usize;
                if self.trusted(j.renter, self.providers[p].identity)
                    && self.request(job, p, tr.price, now)
                {
                    true
                } else {
                    self.cda[class].cancel(cda_job_key(job));
                    false
                }
            }
            None => false,
        }
    }
}

/// What a [`Mechanism`] may do with the market. These calls never run a mechanism hook
/// themselves, so a hook can use them freely.
impl Market<'_> {
    /// Runs `f` with the mechanism taken out of the market (so that it can act on the market
    /// mutably); a hook that ran while it is out would get [`mechanism::Detached`].
    fn with_mech<R>(&mut self, f: impl FnOnce(&mut dyn Mechanism, &mut Self) -> R) -> R {
        // `take` leaves `None`: no placeholder to build or drop on this hot path.
        let Some(mut mech) = self.mech.take() else {
            return f(&mut mechanism::Detached, self);
        };
        let r = f(&mut *mech, self);
        self.mech = Some(mech);
        r
    }

    /// The scenario being run.
    pub fn scenario(&self) -> &Scenario {
        self.sc
    }

    /// Number of GPU classes (indices into the scenario's `gpu_class`).
    pub fn classes(&self) -> usize {
        self.class_vram.len()
    }

    /// The class of provider `provider`.
    pub fn provider_class(&self, provider: usize) -> usize {
        self.providers[provider].class
    }

    /// The smallest class (by VRAM, then index) with at least `min_vram_gib`: where a job
    /// waits, and where the double auctions place its bid.
    pub fn home_class(&self, min_vram_gib: u32) -> usize {
        (0..self.class_vram.len())
            .filter(|&c| self.class_vram[c] >= min_vram_gib)
            .min_by_key(|&c| (self.class_vram[c], c))
            .unwrap_or(0)
    }

    /// What a mechanism may read of job slot `job`.
    pub fn job(&self, job: u32) -> JobView {
        let j = &self.jobs[job as usize];
        JobView {
            renter: j.renter,
            gpus: j.gpus,
            min_vram_gib: j.min_vram,
            duration_s: j.duration_s,
            valuation: j.valuation,
            arrived_ms: j.arrived,
            waiting: j.state == JobState::Waiting,
            held: j.state == JobState::Held,
        }
    }

    /// The open offers of `class` renters currently see, cheapest first.
    pub fn offers(&self, class: usize) -> impl Iterator<Item = OfferView> + '_ {
        self.book[class].iter().map(|e| OfferView {
            provider: e.provider as usize,
            identity: e.identity,
            price: Money::from_micros(e.price),
            free_gpus: e.free,
            until_ms: e.until,
        })
    }

    /// Up to `limit_per_class` visible offers per class that `job` could lease (memory,
    /// free GPUs, price at most its valuation, long enough, trusted by its renter), cheapest
    /// first.
    pub fn feasible_offers(
        &mut self,
        job: u32,
        limit_per_class: usize,
        now: u64,
    ) -> Vec<Candidate> {
        let cands = self.candidates(job, limit_per_class, now);
        let out = cands
            .iter()
            .map(|&(price, p)| Candidate {
                price: Money::from_micros(price),
                provider: p as usize,
            })
            .collect();
        self.scratch = cands;
        out
    }

    /// Whether renter `renter`'s reputation book accepts provider identity `identity` (always
    /// true when the scenario disables reputation) and, with `reputation.mode = "network"`,
    /// whether its network score is at least `reputation.min_score`.
    pub fn trusts(&self, renter: u32, identity: u32) -> bool {
        self.trusted(renter, identity)
    }

    /// A fresh quote from provider `provider`'s pricing strategy (what it bids in an auction;
    /// draws from the provider's stream).
    pub fn quote(&mut self, provider: usize) -> Money {
        let pr = &mut self.providers[provider];
        let input = PricingInput {
            cost_floor: pr.cost_floor,
            current: pr.ask,
            utilization_permille: 0,
            cheapest_competitor: None,
        };
        quote(&self.custom_pricing, pr, &input)
    }

    /// The renter of `job` asks `provider` for a lease at `price` per GPU-hour; the provider
    /// decides with the real `check_request` on its true state. `true`: the lease started and
    /// the job slot is freed. Refused for a job that is neither waiting nor held.
    pub fn request_lease(&mut self, job: u32, provider: usize, price: Money, now: u64) -> bool {
        if self.jobs[job as usize].state == JobState::Free {
            return false;
        }
        self.request(job, provider, price, now)
    }

    /// Takes a waiting job out of the retry queues (its patience still runs; a retry skips
    /// it); [`Market::requeue`] puts it back.
    pub fn hold(&mut self, job: u32) {
        if self.jobs[job as usize].state == JobState::Waiting {
            self.touch_job(job);
            self.jobs[job as usize].state = JobState::Held;
        }
    }

    /// Puts a held job back into its class's waiting queue.
    pub fn requeue(&mut self, job: u32) {
        if self.jobs[job as usize].state == JobState::Held {
            self.touch_job(job);
            self.jobs[job as usize].state = JobState::Waiting;
            self.push_waiting(job);
        }
    }

    /// The jobs waiting in `class`'s queue (jobs wait in their [`Market::home_class`]), oldest
    /// first; drops the queue's entries of jobs no longer waiting.
    pub fn waiting_jobs(&mut self, class: usize) -> Vec<u32> {
        let jobs = &self.jobs;
        self.waiting[class].retain(|&j| jobs[j as usize].state == JobState::Waiting);
        self.invalidate_prefix(class);
        self.waiting[class].iter().copied().collect()
    }

    /// Calls [`Mechanism::job_timer`] for `job` at `at` ms, unless the job has left the
    /// market (leased or abandoned) by then.
    pub fn schedule_job_timer(&mut self, at: u64, job: u32) {
        let generation = self.jobs[job as usize].generation;
        self.q.schedule(at, Ev::JobTimer { job, generation });
    }

    /// Calls [`Mechanism::tick`] with `token` at `at` ms.
    pub fn schedule_tick(&mut self, at: u64, token: u32) {
        self.q.schedule(at, Ev::Tick { token });
    }
}

/// Runs one lease's report/receipt exchange through the real channel code.
/// `crash_rel` is the provider's next crash (ms after start), `stops_at` when the renter stops
/// paying, `inflation` the provider's claimed/real wall-time ratio in permille.
fn run_channel(
    terms: &LeaseTerms,
    id: LeaseId,
    start: u64,
    crash_rel: u64,
    stops_at: Option<u64>,
    inflation: u32,
    reports: &mut u64,
) -> ChannelOutcome {
    let tariff = Tariff::of(terms);
    let provider_key = terms.provider;
    let renter_key = terms.renter;
    let mut pc = ProviderChannel::new(id, terms, ts(start));
    let mut rc = RenterChannel::new(id, terms.clone());
    let duration = u64::from(terms.duration_s) * 1000;
    let interval = u64::from(terms.usage_interval_s) * 1000;
    let stops = stops_at.unwrap_or(u64::MAX);
    // The provider stops at the first report where more than one window is unpaid, so at most
    // one window plus one report interval of usage is ever unpaid -- plus one micro-unit,
    // because cumulative per-second rounding (floor of a sum vs sum of floors) can add one.
    let bound = tariff
        .window_cost(u64::from(terms.pay_ahead_s) + u64::from(terms.usage_interval_s))
        .and_then(|b| b.checked_add(Money::from_micros(1)))
        .unwrap_or(Money::from_micros(u64::MAX));
    let mut seq = 0;
    let mut prev_end = 0;
    let finish =
        |end: u64, reason: CloseReason, failed: bool, caught: bool, pc: &ProviderChannel| {
            let real = end.min(duration);
            let honest = tariff.due(real).unwrap_or(Money::ZERO);
            ChannelOutcome {
                end_ms: end,
                reason,
                failed,
                paid: pc.paid(),
                honest_due: honest,
                unpaid: honest.saturating_sub(pc.paid()),
                bound,
                caught,
                real_wall_ms: real,
            }
        };
    let mut n = 0u64;
    loop {
        let t = (prev_end + interval).min(duration);
        if crash_rel <= t && crash_rel < duration {
            *reports += n;
            return finish(
                crash_rel,
                CloseReason::ProviderUnreachable,
                true,
                false,
                &pc,
            );
        }
        let last = t >= duration;
        // Honest providers (inflation 1000) claim the real time; skip the 128-bit division.
        let claimed = if inflation == 1000 {
            t
        } else {
            (u128::from(t) * u128::from(inflation) / 1000) as u64
        };
        seq += 1;
        n += 1;
        let amount = if last {
            tariff.final_due(claimed)
        } else {
            tariff.due(claimed)
        }
        .unwrap_or(Money::ZERO);
        let report = UsageReport {
            lease_id: id,
            seq,
            interval_start: ts(start + prev_end),
            interval_end: ts(start + t),
            wall_ms: claimed,
            gpu_ms: claimed * u64::from(terms.gpu_count),
            cpu_ms: 0,
            energy_mj: 0,
            net_rx_bytes: 0,
            net_tx_bytes: 0,
            gpu_util_permille: 1000,
            vram_peak_mib: 0,
            mem_peak_mib: 0,
            amount_due: amount.micros(),
            exit_code: last.then_some(0),
        };
        prev_end = t;
        let now = ts(start + t);
        if t < stops {
            // The receipt is used where `on_usage` returned it (matched by reference, not
            // moved out: copying it right after the call stalled on store forwarding).
            let answer = rc.on_usage(&report, &provider_key, t, now);
            match &answer {
                Err(_) => {
                    *reports += n;
                    return finish(t, CloseReason::ImplausibleUsage, true, true, &pc);
                }
                Ok(Some(receipt)) => {
                    let _ = pc.accept_receipt(&renter_key, receipt, now);
                }
                Ok(None) => pc.heard_from_renter(now),
            }
        }
        if last {
            *reports += n;
            let failed = t >= stops;
            return finish(t, CloseReason::Expired, failed, false, &pc);
        }
        if let Ok(Decision::Stop(reason)) = pc.decide(claimed, now) {
            *reports += n;
            let failed = reason != CloseReason::BudgetExhausted;
            return finish(t, reason, failed, false, &pc);
        }
    }
}

/// Gini of revenue across honest providers (attackers, paid nothing once caught, would make
/// an honest market look unequal).
pub fn revenue_gini(res: &RunResult) -> f64 {
    let honest: Vec<u64> = res
        .provider_revenue
        .iter()
        .zip(&res.provider_attacker)
        .filter(|(_, a)| !**a)
        .map(|(&r, _)| r)
        .collect();
    gini(&honest)
}

trait BelowExt {
    fn next_u64_below(&mut self, n: u64) -> u64;
}

impl BelowExt for Pcg64Mcg {
    fn next_u64_below(&mut self, n: u64) -> u64 {
        gridlease_contracts::pricing::uniform_inclusive(self, 0, n.saturating_sub(1))
    }
}
