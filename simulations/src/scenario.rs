//! Scenario files: the TOML a researcher writes. Every field is documented here and in
//! `docs/simulations.md`; every struct refuses unknown fields, and every field has a default
//! (so a scenario only states what differs from the baseline).

use std::fmt;
use std::path::Path;

use gridlease_contracts::Money;
use gridlease_contracts::pricing::Pricing;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use crate::empirical::Empirical;

/// A money amount written as a decimal string (`"0.35"`), exact to the micro-unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Amount(pub Money);

impl Serialize for Amount {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_string())
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<Money>()
            .map(Amount)
            .map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

fn amt(s: &str) -> Amount {
    Amount(s.parse().unwrap_or(Money::ZERO))
}

/// Errors loading a scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("cannot read scenario {path}")]
    Read {
        /// The path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is invalid (the cause, the parser's message, is the error's source: shown once
    /// by `{:#}`, not repeated in this message).
    #[error("invalid scenario")]
    Parse(#[from] toml::de::Error),
    /// A value is out of range or inconsistent.
    #[error("invalid scenario: {0}")]
    Invalid(String),
}

/// How renters and providers meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Matching {
    /// Posted offers: a renter takes the cheapest feasible offer it can see (the real node).
    #[default]
    Posted,
    /// Reverse auction: providers bid during a bid window, the lowest bid wins (Akash-style).
    ReverseAuction,
    /// Continuous double auction per GPU class: renters bid, providers ask.
    DoubleAuction,
    /// Periodic call market (k-double auction) per GPU class: every `call_market.period_s`
    /// the waiting jobs' bids and the visible offers' asks clear at one price.
    CallMarket,
}

/// A whole scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scenario {
    /// Name used in outputs.
    pub name: String,
    /// Simulated duration, days.
    pub days: f64,
    /// Width of a time bucket in the per-bucket CSV, minutes.
    pub bucket_minutes: u32,
    /// Matching mechanism.
    pub matching: Matching,
    /// How often providers re-price, minutes.
    pub repricing_minutes: u32,
    /// Offer visibility delay.
    pub network: Network,
    /// Payment channel terms every offer carries.
    pub channel: Channel,
    /// Renters' trust policy.
    pub reputation: Reputation,
    /// Reverse auction settings.
    pub auction: Auction,
    /// Call market settings (`matching = "call_market"`).
    #[serde(skip_serializing_if = "skip_call_market")]
    pub call_market: CallMarket,
    /// GPU classes.
    pub gpu_class: Vec<GpuClass>,
    /// Provider groups.
    pub provider: Vec<ProviderGroup>,
    /// Renter groups.
    pub renter: Vec<RenterGroup>,
}

/// Offer visibility delay: lognormal with this median and log-sd, in milliseconds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Network {
    /// Median delay from publishing an offer to renters seeing it, ms.
    pub delay_median_ms: f64,
    /// Log-standard deviation of the delay (0 = constant).
    pub delay_sigma: f64,
}

/// Channel terms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Channel {
    /// Seconds between usage reports (1..=300, as the real offer rules demand).
    pub usage_interval_s: u32,
    /// Pay-ahead window, seconds (>= usage_interval_s).
    pub pay_ahead_s: u32,
    /// Grace before a silent renter is cut off, seconds (usage_interval_s..=600).
    pub grace_s: u32,
    /// Minimum billed seconds.
    pub min_billed_s: u32,
    /// How long a renter waits for an accepted lease to start before it gives up (the node's
    /// `start_allowance`, 300 s); it closes the lease after this plus two usage intervals.
    #[serde(skip_serializing_if = "skip_allowance")]
    pub start_allowance_s: u32,
}

/// Where renters' trust comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReputationMode {
    /// Each renter's own `ReputationBook` only (what the simulator always did).
    #[default]
    Local,
    /// Also the network score (`contracts::reputation::provider_scores`) over every completion
    /// record in the market: renters skip providers below `min_score` and, with posted offers,
    /// rank the offers they found by price / score.
    Network,
}

/// Renters' trust policy (contracts::reputation::TrustPolicy) and the network score.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Reputation {
    /// Whether renters consult their local reputation book at all.
    pub enabled: bool,
    /// Lowest acceptable score, permille (newcomers score 500).
    pub min_permille: u16,
    /// Whether providers without history are acceptable.
    pub trust_newcomers: bool,
    /// `local` or `network`.
    #[serde(skip_serializing_if = "skip_mode")]
    pub mode: ReputationMode,
    /// Network: lowest acceptable network score, 0..=1 (a provider without records scores 0.5).
    #[serde(skip_serializing_if = "skip_min_score")]
    pub min_score: f64,
    /// Network: minutes between score recomputations (only when new records arrived).
    #[serde(skip_serializing_if = "skip_interval")]
    pub score_interval_minutes: u32,
    /// Records kept per provider identity, its newest (the node's 256); 0 = all.
    #[serde(skip_serializing_if = "skip_per_provider")]
    pub records_per_provider: u32,
    /// Records kept in all, the least recently received dropped first (the node's 100,000);
    /// 0 = all.
    #[serde(skip_serializing_if = "skip_kept")]
    pub records_kept: u32,
}

impl Reputation {
    /// Whether this scenario needs the completion record pool and network scores.
    pub fn network(&self) -> bool {
        self.mode == ReputationMode::Network
    }
}

/// Reverse auction settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Auction {
    /// Bid window, seconds.
    pub bid_window_s: u32,
    /// Most providers invited to bid on one request.
    pub max_bidders: u32,
}

/// Call market settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CallMarket {
    /// Call period, seconds: orders are collected and cleared every `period_s`.
    pub period_s: u32,
    /// `k` of the clearing price `a* + k (b* - a*)`, permille (0 = the marginal ask,
    /// 1000 = the marginal bid).
    pub k_permille: u16,
}

impl Default for CallMarket {
    fn default() -> Self {
        Self {
            period_s: 60,
            k_permille: 500,
        }
    }
}

/// A GPU class.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpuClass {
    /// Model name.
    pub name: String,
    /// Memory, GiB.
    pub vram_gib: u32,
    /// FP32 TFLOPS (reported only).
    pub tflops: f64,
}

/// When a provider is online.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Availability {
    /// Always online.
    #[default]
    Always,
    /// Alternating exponential on and off periods (`mean_on_hours`, `mean_off_hours`).
    OnOff,
    /// Home GPU: online from `online_from_hour` to `online_to_hour` (simulated clock, UTC,
    /// wrapping past midnight), i.e. idle at night, busy in the evening.
    Diurnal,
}

/// What a provider group does wrong, if anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Attack {
    /// Honest.
    #[default]
    None,
    /// Reports more wall time than elapsed (by `inflation_permille`).
    UsageInflation,
    /// Accepts lease requests, then never starts the container: the renter waits out the
    /// start allowance (`channel.start_allowance_s` + two usage intervals, as the node does)
    /// and closes the lease as provider-unreachable.
    NoShow,
    /// Advertises its group's `class` but delivers `delivered_class` (a lesser GPU). Renters
    /// that benchmark at start (`benchmark_probability`) or whose job does not fit the
    /// delivered memory fail the lease as the provider's fault; the others pay the advertised
    /// price for the delivered class's throughput.
    FalseClass,
}

/// Pricing strategy, as written in a scenario (amounts as decimal strings).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "strategy", rename_all = "snake_case", deny_unknown_fields)]
pub enum PricingConfig {
    /// Always `price`.
    Fixed {
        /// Ask per GPU-hour.
        price: Amount,
    },
    /// Raise by `step_permille` when utilization >= `busy_permille`, lower when <= `idle_permille`.
    AdaptiveMargin {
        /// Start ask.
        start: Amount,
        /// Step, permille.
        step_permille: u16,
        /// Busy threshold, permille.
        busy_permille: u16,
        /// Idle threshold, permille.
        idle_permille: u16,
        /// Highest ask.
        ceiling: Amount,
    },
    /// Cheapest visible competitor minus `by`.
    Undercut {
        /// Undercut amount.
        by: Amount,
        /// Ask with no competitor.
        ceiling: Amount,
    },
    /// Uniform random between cost floor and `ceiling`.
    ZeroIntelligence {
        /// Highest ask.
        ceiling: Amount,
    },
    /// An ask drawn from data at each re-pricing: a value of a CSV column, GLU per GPU-hour
    /// (`{ strategy = "empirical", file, column }`), never below the cost floor; the first ask
    /// is the column's median.
    Empirical(Empirical),
}

impl PricingConfig {
    /// The contracts strategy and the starting ask.
    pub fn to_pricing(&self) -> (Pricing, Money) {
        match self {
            Self::Fixed { price } => (Pricing::Fixed { price: price.0 }, price.0),
            Self::AdaptiveMargin {
                start,
                step_permille,
                busy_permille,
                idle_permille,
                ceiling,
            } => (
                Pricing::AdaptiveMargin {
                    step_permille: *step_permille,
                    busy_permille: *busy_permille,
                    idle_permille: *idle_permille,
                    ceiling: ceiling.0,
                },
                start.0,
            ),
            Self::Undercut { by, ceiling } => (
                Pricing::Undercut {
                    by: by.0,
                    ceiling: ceiling.0,
                },
                ceiling.0,
            ),
            Self::ZeroIntelligence { ceiling } => {
                (Pricing::ZeroIntelligence { ceiling: ceiling.0 }, ceiling.0)
            }
            // Not a contracts strategy: the market runs the column itself (`Empirical` is a
            // `PricingStrategy`); the median is its first ask.
            Self::Empirical(e) => {
                let median = e.median_ask();
                (Pricing::Fixed { price: median }, median)
            }
        }
    }
}

/// A group of identical providers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderGroup {
    /// Label in outputs.
    pub name: String,
    /// Number of providers.
    pub count: u32,
    /// GPU class name (must be in `gpu_class`).
    pub class: String,
    /// GPUs per provider.
    pub gpus: u16,
    /// Marginal cost per GPU-hour (electricity, wear): asks never go below it.
    pub cost_floor: Amount,
    /// Pricing strategy.
    pub pricing: PricingConfig,
    /// Availability pattern.
    pub availability: Availability,
    /// OnOff: mean online period, hours.
    pub mean_on_hours: f64,
    /// OnOff: mean offline period, hours.
    pub mean_off_hours: f64,
    /// Diurnal: hour the machine comes online.
    pub online_from_hour: u32,
    /// Diurnal: hour it goes offline.
    pub online_to_hour: u32,
    /// Diurnal: random shift of each provider's schedule, up to this many minutes either way.
    pub jitter_minutes: u32,
    /// Mean time between crashes, hours (0 = never crashes).
    pub mtbf_hours: f64,
    /// Time to come back after a crash, minutes.
    pub repair_minutes: f64,
    /// Attack behaviour.
    pub attack: Attack,
    /// UsageInflation: claimed wall time = real x this / 1000.
    pub inflation_permille: u32,
    /// Whitewashing: after a renter catches it, rejoin under a fresh identity.
    pub whitewash: bool,
    /// Self-dealing (sybil) attacker: each provider fabricates `self_dealing_keys` completed
    /// records per period, each with a fresh renter key of its own. Makes the group an
    /// attacker (also with 0 keys: then only its other behaviour remains).
    #[serde(skip_serializing_if = "skip_false")]
    pub self_dealing: bool,
    /// Self-dealing: fresh renter keys (one fabricated lease each) per provider and period.
    #[serde(skip_serializing_if = "skip_keys")]
    pub self_dealing_keys: u32,
    /// Self-dealing: what each fabricated lease pays (it circles back to the provider).
    #[serde(skip_serializing_if = "skip_paid")]
    pub self_dealing_paid: Amount,
    /// Self-dealing: the period, minutes.
    #[serde(skip_serializing_if = "skip_interval")]
    pub self_dealing_period_minutes: u32,
    /// `attack = "false_class"`: the class actually delivered (a `gpu_class` name other than
    /// `class`).
    #[serde(skip_serializing_if = "skip_empty")]
    pub delivered_class: String,
}

impl ProviderGroup {
    /// Whether the group is in the attacker population.
    pub fn is_attacker(&self) -> bool {
        self.attack != Attack::None || self.self_dealing
    }
}

/// When jobs arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Arrivals {
    /// Homogeneous Poisson.
    #[default]
    Poisson,
    /// Poisson with a sinusoidal daily rate, peak at `peak_hour`.
    Diurnal,
}

/// A group of identical renters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RenterGroup {
    /// Label in outputs.
    pub name: String,
    /// Number of renters.
    pub count: u32,
    /// Jobs per renter per day (mean).
    pub jobs_per_day: f64,
    /// Arrival pattern.
    pub arrivals: Arrivals,
    /// Diurnal: relative amplitude of the daily swing (0..1).
    pub diurnal_amplitude: f64,
    /// Diurnal: hour of peak demand.
    pub peak_hour: f64,
    /// Minimum GPU memory, GiB.
    pub min_vram_gib: u32,
    /// GPUs per job.
    pub gpus: u16,
    /// Median job duration, minutes (lognormal).
    pub duration_median_minutes: f64,
    /// Log-sd of job duration.
    pub duration_sigma: f64,
    /// Median valuation per GPU-hour (lognormal): the most the renter will pay.
    pub valuation_median: Amount,
    /// Log-sd of valuation.
    pub valuation_sigma: f64,
    /// Mean patience before abandoning an unmatched job, minutes (exponential).
    pub patience_mean_minutes: f64,
    /// Probability that a lease's renter stops paying part-way.
    pub default_probability: f64,
    /// Probability that a renter benchmarks the GPUs at the start of a lease (and so detects
    /// a provider delivering a lesser class than its offer names).
    #[serde(skip_serializing_if = "skip_zero")]
    pub benchmark_probability: f64,
    /// How long the start benchmark runs, seconds (the renter's time lost on a detected
    /// false class).
    #[serde(skip_serializing_if = "skip_bench_s")]
    pub benchmark_s: u32,
    /// Job durations from data, minutes: replaces the lognormal of `duration_median_minutes`
    /// and `duration_sigma`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_data: Option<Empirical>,
    /// Valuations from data, GLU per GPU-hour: replaces the lognormal of `valuation_median`
    /// and `valuation_sigma`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub valuation_data: Option<Empirical>,
    /// Gaps between the group's job arrivals from data, seconds: replaces the Poisson process
    /// of `jobs_per_day` (the group's arrivals are then a renewal process of these gaps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interarrival_data: Option<Empirical>,
}

impl RenterGroup {
    /// The group's data distributions with their field names.
    pub fn data(&self) -> [(&'static str, Option<&Empirical>); 3] {
        [
            ("duration_data", self.duration_data.as_ref()),
            ("valuation_data", self.valuation_data.as_ref()),
            ("interarrival_data", self.interarrival_data.as_ref()),
        ]
    }

    fn data_mut(&mut self) -> [(&'static str, Option<&mut Empirical>); 3] {
        [
            ("duration_data", self.duration_data.as_mut()),
            ("valuation_data", self.valuation_data.as_mut()),
            ("interarrival_data", self.interarrival_data.as_mut()),
        ]
    }
}

/// A data file a scenario reads, for the manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataFile {
    /// The renter group.
    pub group: String,
    /// The field (`duration_data`, ...).
    pub field: String,
    /// The file as the scenario names it.
    pub file: String,
    /// The column.
    pub column: String,
    /// BLAKE3 (hex) of the file.
    pub blake3: String,
    /// Values read.
    pub rows: usize,
}

impl Default for Scenario {
    fn default() -> Self {
        Self {
            name: "scenario".into(),
            days: 7.0,
            bucket_minutes: 60,
            matching: Matching::Posted,
            repricing_minutes: 15,
            network: Network::default(),
            channel: Channel::default(),
            reputation: Reputation::default(),
            auction: Auction::default(),
            call_market: CallMarket::default(),
            gpu_class: vec![GpuClass::default()],
            provider: vec![ProviderGroup::default()],
            renter: vec![RenterGroup::default()],
        }
    }
}

impl Default for Network {
    fn default() -> Self {
        Self {
            delay_median_ms: 500.0,
            delay_sigma: 0.5,
        }
    }
}

impl Default for Channel {
    fn default() -> Self {
        Self {
            usage_interval_s: 60,
            pay_ahead_s: 120,
            grace_s: 120,
            min_billed_s: 60,
            start_allowance_s: DEFAULT_START_ALLOWANCE_S,
        }
    }
}

impl Default for Reputation {
    fn default() -> Self {
        Self {
            enabled: true,
            min_permille: 300,
            trust_newcomers: true,
            mode: ReputationMode::Local,
            min_score: DEFAULT_MIN_SCORE,
            score_interval_minutes: 60,
            records_per_provider: 256,
            records_kept: 100_000,
        }
    }
}

impl Default for Auction {
    fn default() -> Self {
        Self {
            bid_window_s: 30,
            max_bidders: 16,
        }
    }
}

impl Default for GpuClass {
    fn default() -> Self {
        Self {
            name: "rtx4090".into(),
            vram_gib: 24,
            tflops: 82.6,
        }
    }
}

impl Default for ProviderGroup {
    fn default() -> Self {
        Self {
            name: "providers".into(),
            count: 100,
            class: "rtx4090".into(),
            gpus: 1,
            cost_floor: amt("0.10"),
            pricing: PricingConfig::Fixed { price: amt("0.40") },
            availability: Availability::Always,
            mean_on_hours: 8.0,
            mean_off_hours: 4.0,
            online_from_hour: 23,
            online_to_hour: 17,
            jitter_minutes: 60,
            mtbf_hours: 0.0,
            repair_minutes: 30.0,
            attack: Attack::None,
            inflation_permille: 1500,
            whitewash: false,
            self_dealing: false,
            self_dealing_keys: 10,
            self_dealing_paid: amt(DEFAULT_SELF_DEALING_PAID),
            self_dealing_period_minutes: 60,
            delivered_class: String::new(),
        }
    }
}

impl Default for RenterGroup {
    fn default() -> Self {
        Self {
            name: "renters".into(),
            count: 200,
            jobs_per_day: 1.0,
            arrivals: Arrivals::Poisson,
            diurnal_amplitude: 0.5,
            peak_hour: 14.0,
            min_vram_gib: 16,
            gpus: 1,
            duration_median_minutes: 60.0,
            duration_sigma: 0.8,
            valuation_median: amt("0.80"),
            valuation_sigma: 0.3,
            patience_mean_minutes: 30.0,
            default_probability: 0.0,
            benchmark_probability: 0.0,
            benchmark_s: DEFAULT_BENCHMARK_S,
            duration_data: None,
            valuation_data: None,
            interarrival_data: None,
        }
    }
}

impl Scenario {
    /// Parses and validates TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ScenarioError> {
        let s: Self = toml::from_str(text)?;
        s.validate()?;
        Ok(s)
    }

    /// Reads, parses and validates a file, and reads the data files it names (relative to its
    /// directory).
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_in(&text, path.parent().unwrap_or(Path::new(".")))
    }

    /// Parses TOML text whose data files are relative to `dir`, reads them, and validates.
    pub fn from_toml_in(text: &str, dir: &Path) -> Result<Self, ScenarioError> {
        let mut s: Self = toml::from_str(text)?;
        s.load_data(dir)?;
        s.validate()?;
        Ok(s)
    }

    /// Reads every data file the groups name, relative to `dir`.
    pub fn load_data(&mut self, dir: &Path) -> Result<(), ScenarioError> {
        for (label, field, e) in self.data_slots_mut() {
            e.load(dir, &format!("{label} {field}"))
                .map_err(ScenarioError::Invalid)?;
        }
        Ok(())
    }

    /// The data files read, for the manifest.
    pub fn data_files(&self) -> Vec<DataFile> {
        self.data_slots()
            .into_iter()
            .map(|(label, field, e)| DataFile {
                group: label,
                field: field.into(),
                file: e.file.clone(),
                column: e.column.clone(),
                blake3: e.blake3.clone(),
                rows: e.values.len(),
            })
            .collect()
    }

    /// Every data distribution the scenario names: (`renter group "x"` or `provider group
    /// "y"`, field, distribution), renters first, in file order.
    pub fn data_slots(&self) -> Vec<(String, &'static str, &Empirical)> {
        let mut out = Vec::new();
        for g in &self.renter {
            for (field, e) in g.data() {
                if let Some(e) = e {
                    out.push((format!("renter group {:?}", g.name), field, e));
                }
            }
        }
        for g in &self.provider {
            if let PricingConfig::Empirical(e) = &g.pricing {
                out.push((format!("provider group {:?}", g.name), "pricing", e));
            }
        }
        out
    }

    fn data_slots_mut(&mut self) -> Vec<(String, &'static str, &mut Empirical)> {
        let mut out = Vec::new();
        for g in &mut self.renter {
            let label = format!("renter group {:?}", g.name);
            for (field, e) in g.data_mut() {
                if let Some(e) = e {
                    out.push((label.clone(), field, e));
                }
            }
        }
        for g in &mut self.provider {
            let label = format!("provider group {:?}", g.name);
            if let PricingConfig::Empirical(e) = &mut g.pricing {
                out.push((label, "pricing", e));
            }
        }
        out
    }

    /// The canonical TOML of this scenario (what the hash covers). Fields added after a
    /// release (network reputation, issue 16) are left out while they hold their defaults, so
    /// that a scenario that does not use them keeps its hash.
    pub fn to_toml(&self) -> String {
        CANONICAL.with(|c| c.set(true));
        let text = toml::to_string(self).unwrap_or_default();
        CANONICAL.with(|c| c.set(false));
        text
    }

    /// Checks ranges and references.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let bad = |m: String| Err(ScenarioError::Invalid(m));
        if !(self.days > 0.0 && self.days <= 3650.0) {
            return bad(format!("days = {} not in (0, 3650]", self.days));
        }
        if self.bucket_minutes == 0 || !(1..60).contains(&self.repricing_minutes) {
            // Offers live at most an hour (contracts::terms::MAX_OFFER_TTL_S); the re-pricing
            // tick also refreshes them.
            return bad("bucket_minutes > 0 and 1 <= repricing_minutes < 60 required".into());
        }
        let c = &self.channel;
        if !(1..=300).contains(&c.usage_interval_s)
            || c.pay_ahead_s < c.usage_interval_s
            || c.grace_s < c.usage_interval_s
            || c.grace_s > 600
        {
            return bad("channel: need 1 <= usage_interval_s <= 300, pay_ahead_s >= usage_interval_s, usage_interval_s <= grace_s <= 600".into());
        }
        if self.network.delay_median_ms < 0.0 || self.network.delay_sigma < 0.0 {
            return bad("network delay parameters must be >= 0".into());
        }
        if self.call_market.period_s == 0 || self.call_market.k_permille > 1000 {
            return bad("call_market: need period_s > 0 and k_permille <= 1000".into());
        }
        let r = &self.reputation;
        if !(0.0..=1.0).contains(&r.min_score) || r.score_interval_minutes == 0 {
            return bad(
                "reputation: need 0 <= min_score <= 1 and score_interval_minutes > 0".into(),
            );
        }
        if self.gpu_class.is_empty() || self.provider.is_empty() || self.renter.is_empty() {
            return bad("need at least one gpu_class, provider and renter group".into());
        }
        for p in &self.provider {
            if !self.gpu_class.iter().any(|g| g.name == p.class) {
                return bad(format!(
                    "provider group {:?}: unknown class {:?}",
                    p.name, p.class
                ));
            }
            if p.gpus == 0 || p.gpus > 16 || p.online_from_hour > 23 || p.online_to_hour > 23 {
                return bad(format!(
                    "provider group {:?}: gpus > 0, hours in 0..=23",
                    p.name
                ));
            }
            if p.self_dealing_period_minutes == 0 {
                return bad(format!(
                    "provider group {:?}: self_dealing_period_minutes > 0 required",
                    p.name
                ));
            }
            let delivered = self.gpu_class.iter().any(|g| g.name == p.delivered_class);
            if p.attack == Attack::FalseClass && (!delivered || p.delivered_class == p.class) {
                return bad(format!(
                    "provider group {:?}: attack = \"false_class\" needs delivered_class, a \
                     gpu_class other than {:?} (got {:?})",
                    p.name, p.class, p.delivered_class
                ));
            }
            if p.mtbf_hours < 0.0 || p.mean_on_hours <= 0.0 || p.mean_off_hours <= 0.0 {
                return bad(format!(
                    "provider group {:?}: negative or zero periods",
                    p.name
                ));
            }
        }
        for r in &self.renter {
            if r.gpus == 0
                || r.gpus > 16
                || r.jobs_per_day < 0.0
                || r.duration_median_minutes <= 0.0
                || r.patience_mean_minutes <= 0.0
                || !(0.0..=1.0).contains(&r.default_probability)
                || !(0.0..=1.0).contains(&r.benchmark_probability)
                || !(0.0..=1.0).contains(&r.diurnal_amplitude)
            {
                return bad(format!("renter group {:?}: out-of-range field", r.name));
            }
            if r.interarrival_data.is_some() && r.arrivals == Arrivals::Diurnal {
                return bad(format!(
                    "renter group {:?}: interarrival_data gives the arrivals; arrivals = \
                     \"diurnal\" cannot also shape them",
                    r.name
                ));
            }
        }
        for (label, field, e) in self.data_slots() {
            if !e.loaded() {
                return bad(format!(
                    "{label}: {field} names {:?}, which was not read: load the scenario from \
                     its file (Scenario::load) or with Scenario::from_toml_in",
                    e.file
                ));
            }
        }
        Ok(())
    }

    /// Sets one field by dotted path, for sweeps: `days`, `channel.pay_ahead_s`,
    /// `renter.0.jobs_per_day` (a group by index), `provider.home-4090.count` (a group by
    /// name; `-` and `_` in names are interchangeable), `provider.0.pricing.price` (a field of
    /// an inline table), `provider.0.pricing` (the whole table, given as a TOML inline table).
    /// A path segment that names neither an element nor a group applies the rest of the path
    /// to every element of the list (`provider.count` sets every provider group).
    /// Shorthands: `providers` = `provider.count`, `renters` = `renter.count`, `renter_rate` =
    /// `renter.jobs_per_day`; `providers.` and `renters.` prefixes = `provider.` and `renter.`.
    /// Errors name the key, the value and, for a group, its name.
    pub fn set_param(&mut self, key: &str, value: &str) -> Result<(), ScenarioError> {
        let expanded = match key {
            "providers" => "provider.count".to_string(),
            "renters" => "renter.count".to_string(),
            "renter_rate" => "renter.jobs_per_day".to_string(),
            k => match k.split_once('.') {
                Some(("providers", rest)) => format!("provider.{rest}"),
                Some(("renters", rest)) => format!("renter.{rest}"),
                _ => k.to_string(),
            },
        };
        let invalid = |m: String| ScenarioError::Invalid(format!("--param {key}={value}: {m}"));
        let mut tree =
            toml::Value::try_from(&*self).map_err(|e| ScenarioError::Invalid(e.to_string()))?;
        let parts: Vec<&str> = expanded.split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(invalid("empty path segment".into()));
        }
        let parsed: toml::Value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.to_string()));
        let set = set_path(&mut tree, &parts, &parsed, "").map_err(invalid)?;
        if set == 0 {
            return Err(invalid(
                "the key matches no field (an empty group list?)".into(),
            ));
        }
        let text = toml::to_string(&tree).map_err(|e| ScenarioError::Invalid(e.to_string()))?;
        let before: Vec<(String, &'static str, Empirical)> = self
            .data_slots()
            .into_iter()
            .map(|(l, f, e)| (l, f, e.clone()))
            .collect();
        *self = match toml::from_str::<Self>(&text) {
            Ok(s) => s,
            Err(e) => {
                let mut m = e.message().to_string();
                if parts.last() == Some(&"strategy") {
                    m.push_str(
                        "; to change a pricing strategy, sweep the whole table: \
                         provider.0.pricing='{ strategy = \"fixed\", price = \"0.40\" }'",
                    );
                }
                return Err(invalid(m));
            }
        };
        // Data files are read once, from the scenario's directory: a parameter cannot name
        // another file, and the values read are kept.
        let mut after = self.data_slots_mut();
        let swept = |label: &str, field: &str| {
            invalid(format!(
                "{label}: {field} cannot be swept (data files are read with the scenario)"
            ))
        };
        if after.len() != before.len() {
            let (label, field) = after
                .first()
                .map(|(l, f, _)| (l.clone(), *f))
                .or_else(|| before.first().map(|(l, f, _)| (l.clone(), *f)))
                .unwrap_or_default();
            return Err(swept(&label, field));
        }
        for ((label, field, new), (old_label, old_field, old)) in after.iter_mut().zip(&before) {
            if label != old_label || field != old_field || **new != *old {
                return Err(swept(label, field));
            }
            new.values = old.values.clone();
        }
        self.validate().map_err(|e| match e {
            ScenarioError::Invalid(m) => invalid(m),
            other => other,
        })?;
        Ok(())
    }
}

thread_local! {
    /// Set while [`Scenario::to_toml`] serializes: fields added later are then skipped at
    /// their defaults.
    static CANONICAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether `v` is skipped from the canonical TOML: canonical serialization and `v == default`.
fn added_default<T: PartialEq>(v: &T, default: T) -> bool {
    CANONICAL.with(std::cell::Cell::get) && *v == default
}

fn skip_mode(v: &ReputationMode) -> bool {
    added_default(v, ReputationMode::Local)
}
fn skip_min_score(v: &f64) -> bool {
    added_default(v, DEFAULT_MIN_SCORE)
}
fn skip_interval(v: &u32) -> bool {
    added_default(v, 60)
}
fn skip_per_provider(v: &u32) -> bool {
    added_default(v, 256)
}
fn skip_kept(v: &u32) -> bool {
    added_default(v, 100_000)
}
fn skip_call_market(v: &CallMarket) -> bool {
    added_default(v, CallMarket::default())
}
fn skip_allowance(v: &u32) -> bool {
    added_default(v, DEFAULT_START_ALLOWANCE_S)
}
fn skip_empty(v: &String) -> bool {
    added_default(v, String::new())
}
fn skip_zero(v: &f64) -> bool {
    added_default(v, 0.0)
}
fn skip_bench_s(v: &u32) -> bool {
    added_default(v, DEFAULT_BENCHMARK_S)
}
fn skip_false(v: &bool) -> bool {
    added_default(v, false)
}
fn skip_keys(v: &u32) -> bool {
    added_default(v, 10)
}
fn skip_paid(v: &Amount) -> bool {
    added_default(v, amt(DEFAULT_SELF_DEALING_PAID))
}

/// Default `start_allowance_s` (the node's `start_allowance`).
const DEFAULT_START_ALLOWANCE_S: u32 = 300;
/// Default `benchmark_s`.
const DEFAULT_BENCHMARK_S: u32 = 60;
/// Default `min_score`.
const DEFAULT_MIN_SCORE: f64 = 0.4;
/// Default `self_dealing_paid`.
const DEFAULT_SELF_DEALING_PAID: &str = "0.10";

/// Whether list element `el` is the one named `sel` (`-` and `_` interchangeable).
fn named(el: &toml::Value, sel: &str) -> bool {
    let norm = |s: &str| s.replace('-', "_");
    el.get("name")
        .and_then(toml::Value::as_str)
        .is_some_and(|n| n == sel || norm(n) == norm(sel))
}

/// Sets `value` at `parts` under `node`; returns how many fields were set. `at` is the path
/// walked so far (for messages).
fn set_path(
    node: &mut toml::Value,
    parts: &[&str],
    value: &toml::Value,
    at: &str,
) -> Result<usize, String> {
    let Some((head, rest)) = parts.split_first() else {
        *node = coerce(node, value);
        return Ok(1);
    };
    let here = if at.is_empty() {
        (*head).to_string()
    } else {
        format!("{at}.{head}")
    };
    match node {
        toml::Value::Table(t) => {
            let fields: Vec<String> = t.keys().cloned().collect();
            let child = t.get_mut(*head).ok_or_else(|| {
                let within = if at.is_empty() { "the scenario" } else { at };
                format!(
                    "{within} has no field {head:?} (fields: {})",
                    fields.join(", ")
                )
            })?;
            set_path(child, rest, value, &here)
        }
        toml::Value::Array(a) => {
            if let Ok(i) = head.parse::<usize>() {
                let n = a.len();
                let child = a
                    .get_mut(i)
                    .ok_or_else(|| format!("{at} has {n} elements, no element {i}"))?;
                return set_path(child, rest, value, &here);
            }
            let names: Vec<String> = a
                .iter()
                .filter_map(|el| el.get("name").and_then(toml::Value::as_str))
                .map(str::to_string)
                .collect();
            if let Some(el) = a.iter_mut().find(|el| named(el, head)) {
                return set_path(el, rest, value, &format!("{at}.{head}"));
            }
            let is_field = a.first().is_some_and(|el| el.get(*head).is_some());
            if !is_field {
                return Err(format!(
                    "{at}: no group named {head:?} and no field {head:?} (groups: {})",
                    names.join(", ")
                ));
            }
            // Every element: the field is set in each group.
            let mut n = 0;
            for (i, child) in a.iter_mut().enumerate() {
                let label = names.get(i).map_or(i.to_string(), |n| n.clone());
                n += set_path(child, parts, value, &format!("{at}.{label}"))?;
            }
            Ok(n)
        }
        _ => Err(format!("{at} is a value, not a table (no field {head:?})")),
    }
}

/// Keeps the target's type where the text is ambiguous (`2` for a float field).
fn coerce(old: &toml::Value, new: &toml::Value) -> toml::Value {
    match (old, new) {
        (toml::Value::Float(_), toml::Value::Integer(i)) => toml::Value::Float(*i as f64),
        (toml::Value::String(_), toml::Value::Integer(i)) => toml::Value::String(i.to_string()),
        (toml::Value::String(_), toml::Value::Float(f)) => toml::Value::String(f.to_string()),
        _ => new.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_round_trip() {
        let s = Scenario::default();
        s.validate().unwrap();
        assert_eq!(Scenario::from_toml(&s.to_toml()).unwrap(), s);
    }

    #[test]
    fn added_fields_keep_old_hashes_until_used() {
        let mut s = Scenario::default();
        let old = s.to_toml();
        assert!(!old.contains("mode") && !old.contains("self_dealing"));
        s.set_param("reputation.mode", "network").unwrap();
        s.set_param("provider.0.self_dealing", "true").unwrap();
        s.set_param("provider.0.self_dealing_keys", "100").unwrap();
        let new = s.to_toml();
        assert!(new.contains("mode = \"network\"") && new.contains("self_dealing_keys = 100"));
        assert_eq!(Scenario::from_toml(&new).unwrap(), s);
    }

    #[test]
    fn unknown_fields_are_refused() {
        assert!(Scenario::from_toml("dayz = 3").is_err());
        assert!(Scenario::from_toml("[[provider]]\ncolour = 1").is_err());
    }

    #[test]
    fn params_set_nested_fields() {
        let mut s = Scenario::default();
        s.set_param("providers", "7").unwrap();
        s.set_param("renter_rate", "2.5").unwrap();
        s.set_param("days", "2").unwrap();
        s.set_param("provider.0.cost_floor", "\"0.20\"").unwrap();
        assert_eq!(s.provider[0].count, 7);
        assert_eq!(s.renter[0].jobs_per_day, 2.5);
        assert_eq!(s.days, 2.0);
        assert_eq!(s.provider[0].cost_floor.0.micros(), 200_000);
        assert!(s.set_param("nonsense", "1").is_err());
    }
}
