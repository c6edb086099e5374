//! The offer search language: `gpu~4090 vram>=24 price<=0.45 fp16_tflops>=100 verified>=3`.
//!
//! A query is a whitespace-separated list of conditions, all of which must hold (AND), plus at
//! most one `sort:KEY` term. A condition is `FIELD OP VALUE` with no spaces inside. Parse errors
//! carry the byte span of the offending token so a CLI can point at it ([`QueryError::render`]).
//! The full reference is `docs/search.md`.
//!
//! Matching works on an [`OfferSummary`], the numbers a query can ask about, computed once per
//! offer when it enters the book, so a search is a scan over plain integers.

use std::cmp::Ordering;
use std::fmt;

use gridlease_protocol::{Attestation, Isolation, NetworkPolicy, Offer};

use crate::money::Money;

/// What a query can ask about one offer. Per-GPU numbers describe the offer's weakest GPU, so a
/// condition that holds for the summary holds for every GPU a lease on the offer could get.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfferSummary {
    /// The numbers (a small `Copy` struct the book scans).
    pub numbers: Numbers,
    /// Lower-cased model names of the offer's GPUs, joined by `|`.
    pub models_lower: String,
    /// Lower-cased region.
    pub region_lower: String,
}

/// The numeric part of an [`OfferSummary`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Numbers {
    /// Smallest VRAM, MiB.
    pub vram_mib: u32,
    /// Smallest fp16 rate, GFLOP/s.
    pub fp16_gflops: u32,
    /// Smallest fp32 rate, GFLOP/s.
    pub fp32_gflops: u32,
    /// Smallest device memory bandwidth, MB/s.
    pub mem_mbps: u32,
    /// True when every GPU's benchmark was measured, not declared.
    pub measured: bool,
    /// Egress allowed.
    pub egress: bool,
    /// A running lease may be stopped for the provider's owner (`Offer::interruptible`).
    pub interruptible: bool,
    /// Tenants run under gVisor.
    pub gvisor: bool,
    /// GPUs in the offer.
    pub gpus: u32,
    /// Of those, free when the offer was signed.
    pub free_gpus: u32,
    /// Price per GPU-hour, micro-units.
    pub price: u64,
    /// Price per GPU-hour per fp16 TFLOPS, micro-units (`u64::MAX` without a benchmark).
    pub price_per_tflop: u64,
    /// CPU millicores per GPU.
    pub cpu_millicores: u32,
    /// RAM per GPU, MiB.
    pub ram_mib: u32,
    /// Disk per GPU, GiB.
    pub disk_gib: u32,
    /// Longest lease, seconds.
    pub max_duration_s: u32,
    /// Shortest lease, seconds.
    pub min_duration_s: u32,
    /// Least time billed for a lease, seconds.
    pub min_billed_s: u32,
    /// Best compute capability, as `major * 10 + minor`.
    pub compute_capability: u32,
    /// Lowest CUDA version the offer's drivers support, as `major * 10 + minor` (0 when a GPU
    /// reports none that parses, e.g. a declared GPU).
    pub cuda: u32,
    /// Lowest driver major version (550 for 550.54.14; 0 when one does not parse).
    pub driver: u32,
    /// Creation time of the offer (unix ms): sort key `age`.
    pub created_at: u64,
    /// What this node knows of the offer's provider from co-signed completion records: not
    /// part of the signed offer ([`ProviderNumbers::PRIOR`] until its records are known).
    pub provider: ProviderNumbers,
}

/// What a node computed about a provider from the co-signed completion records it holds
/// (`crate::reputation::provider_scores`), as its offers' summaries carry it
/// (`crate::book::OfferBook::set_reputation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProviderNumbers {
    /// The provider's network reputation, per mille (the prior, 500, until its completions
    /// are known).
    pub rep_permille: u32,
    /// The provider's completed leases (a plain count).
    pub completed: u32,
    /// The provider's GPU checks that passed, co-signed (proof of GPU, issue 44; a plain
    /// count, like `completed`).
    pub verified: u32,
}

impl ProviderNumbers {
    /// A provider no record is known of: the score's prior, no completed lease, no check.
    pub const PRIOR: Self = Self {
        rep_permille: REP_PRIOR_PERMILLE,
        completed: 0,
        verified: 0,
    };
}

impl Default for ProviderNumbers {
    /// [`ProviderNumbers::PRIOR`].
    fn default() -> Self {
        Self::PRIOR
    }
}

impl OfferSummary {
    /// Computes the summary of `offer`.
    pub fn of(offer: &Offer) -> Self {
        let min = |f: &dyn Fn(&gridlease_protocol::OfferedGpu) -> u32| {
            offer.gpus.iter().map(f).min().unwrap_or(0)
        };
        let fp16_gflops = min(&|g| g.bench.fp16_gflops);
        let price = offer.price_per_gpu_hour;
        let price_per_tflop = if fp16_gflops == 0 {
            u64::MAX
        } else {
            // price (micro/h) / (gflops / 1000) = price * 1000 / gflops; u128 cannot overflow.
            let v = u128::from(price) * 1000 / u128::from(fp16_gflops);
            u64::try_from(v).unwrap_or(u64::MAX)
        };
        let models_lower = offer
            .gpus
            .iter()
            .map(|g| g.spec.model.to_lowercase())
            .collect::<Vec<_>>()
            .join("|");
        Self {
            numbers: Numbers {
                vram_mib: min(&|g| g.spec.vram_mib),
                fp16_gflops,
                fp32_gflops: min(&|g| g.bench.fp32_gflops),
                mem_mbps: min(&|g| g.bench.device_mem_mbps),
                measured: !offer.gpus.is_empty()
                    && offer
                        .gpus
                        .iter()
                        .all(|g| g.bench.attestation == Attestation::Measured),
                egress: offer.sandbox.network == NetworkPolicy::Egress,
                interruptible: offer.interruptible,
                gvisor: offer.sandbox.isolation == Isolation::Gvisor,
                gpus: u32::try_from(offer.gpus.len()).unwrap_or(u32::MAX),
                free_gpus: u32::from(offer.free_gpus),
                price,
                price_per_tflop,
                cpu_millicores: offer.per_gpu.cpu_millicores,
                ram_mib: offer.per_gpu.ram_mib,
                disk_gib: offer.per_gpu.disk_gib,
                max_duration_s: offer.max_duration_s,
                min_duration_s: offer.min_duration_s,
                min_billed_s: offer.min_billed_s,
                compute_capability: offer
                    .gpus
                    .iter()
                    .map(|g| {
                        u32::from(g.spec.compute_capability.major) * 10
                            + u32::from(g.spec.compute_capability.minor)
                    })
                    .max()
                    .unwrap_or(0),
                cuda: min(&|g| {
                    version(&g.spec.cuda_version).map_or(0, |(major, minor)| {
                        major.saturating_mul(10).saturating_add(minor.min(9))
                    })
                }),
                driver: min(&|g| version(&g.spec.driver_version).map_or(0, |(major, _)| major)),
                created_at: offer.created_at.0,
                provider: ProviderNumbers::PRIOR,
            },
            models_lower,
            region_lower: offer.region.to_lowercase(),
        }
    }
}

/// The reputation an offer's summary carries until its provider's completions are known: the
/// score's prior mean ([`crate::reputation::ScoreParams::default`]).
pub const REP_PRIOR_PERMILLE: u32 = 500;

/// `MAJOR[.MINOR[...]]` as (major, minor); `None` unless it starts with a number.
fn version(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

/// A comparison operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `~` (case-insensitive substring; text fields only)
    Contains,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::Ne => "!=",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Ge => ">=",
            Self::Contains => "~",
        }
    }

    fn holds(self, ord: Ordering) -> bool {
        match self {
            Self::Eq => ord == Ordering::Equal,
            Self::Ne => ord != Ordering::Equal,
            Self::Lt => ord == Ordering::Less,
            Self::Le => ord != Ordering::Greater,
            Self::Gt => ord == Ordering::Greater,
            Self::Ge => ord != Ordering::Less,
            Self::Contains => false,
        }
    }
}

/// The kind of value a field takes, and how its text is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Free text; `=`, `!=`, `~`.
    Text,
    /// `true` / `false`; `=`, `!=`.
    Bool,
    /// A decimal number scaled by the field's factor; all comparisons but `~`.
    Number,
}

/// A field a condition can test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// GPU model name (text).
    Gpu,
    /// VRAM per GPU, GiB (rounded to the nearest GiB from MiB).
    Vram,
    /// Price per GPU-hour, units (e.g. `0.45`).
    Price,
    /// fp16 TFLOPS.
    Fp16Tflops,
    /// fp32 TFLOPS.
    Fp32Tflops,
    /// Device memory bandwidth, GB/s.
    MemBw,
    /// Price per GPU-hour per fp16 TFLOPS, units.
    PricePerTflop,
    /// Every GPU's benchmark measured, not declared (bool).
    Measured,
    /// GPUs in the offer.
    Gpus,
    /// Free GPUs of the offer.
    Free,
    /// CPU cores per GPU.
    Cpu,
    /// RAM per GPU, GiB.
    Ram,
    /// Disk per GPU, GiB.
    Disk,
    /// Longest lease, hours.
    Hours,
    /// Shortest lease, minutes.
    MinMinutes,
    /// Least time billed for a lease, seconds.
    MinBilled,
    /// Egress network allowed (bool).
    Egress,
    /// Tenants run under gVisor (bool).
    Gvisor,
    /// A running lease may be stopped for the provider's owner (bool).
    Interruptible,
    /// Region label (text).
    Region,
    /// Compute capability, e.g. `8.9`.
    Cc,
    /// CUDA version the drivers support, e.g. `12.4` (one decimal).
    Cuda,
    /// Driver major version, e.g. `550`.
    Driver,
    /// The provider's network reputation, 0 to 1.
    Rep,
    /// The provider's completed leases (co-signed records this node knows of).
    Completed,
    /// The provider's passed GPU checks (co-signed records this node knows of); `true` reads
    /// as `>=1`, `false` as `=0`.
    Verified,
}

impl Field {
    /// Every field with its query name.
    pub const ALL: [(&'static str, Field); 26] = [
        ("gpu", Field::Gpu),
        ("vram", Field::Vram),
        ("price", Field::Price),
        ("fp16_tflops", Field::Fp16Tflops),
        ("fp32_tflops", Field::Fp32Tflops),
        ("mem_bw", Field::MemBw),
        ("price_per_tflop", Field::PricePerTflop),
        ("measured", Field::Measured),
        ("gpus", Field::Gpus),
        ("free", Field::Free),
        ("cpu", Field::Cpu),
        ("ram", Field::Ram),
        ("disk", Field::Disk),
        ("hours", Field::Hours),
        ("min_minutes", Field::MinMinutes),
        ("min_billed", Field::MinBilled),
        ("egress", Field::Egress),
        ("gvisor", Field::Gvisor),
        ("interruptible", Field::Interruptible),
        ("region", Field::Region),
        ("cc", Field::Cc),
        ("cuda", Field::Cuda),
        ("driver", Field::Driver),
        ("rep", Field::Rep),
        ("completed", Field::Completed),
        ("verified", Field::Verified),
    ];

    fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, f)| *f)
    }

    /// The query name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, f)| *f == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }

    /// What the field means, its type and an example condition, for help texts.
    pub fn describe(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::Gpu => ("text", "GPU model name (~ contains)", "gpu~4090"),
            Self::Vram => ("number", "VRAM per GPU, GiB", "vram>=24"),
            Self::Price => ("number", "price per GPU-hour, GLU", "price<=0.45"),
            Self::Fp16Tflops => ("number", "fp16 TFLOPS per GPU", "fp16_tflops>=100"),
            Self::Fp32Tflops => ("number", "fp32 TFLOPS per GPU", "fp32_tflops>=40"),
            Self::MemBw => ("number", "device memory bandwidth, GB/s", "mem_bw>=900"),
            Self::PricePerTflop => (
                "number",
                "price per GPU-hour per fp16 TFLOPS",
                "price_per_tflop<=0.01",
            ),
            Self::Measured => ("bool", "every GPU's benchmark measured", "measured=true"),
            Self::Gpus => ("number", "GPUs in the offer", "gpus>=2"),
            Self::Free => ("number", "GPUs free now (default free>=1)", "free>=2"),
            Self::Cpu => ("number", "CPU cores per GPU", "cpu>=4"),
            Self::Ram => ("number", "RAM per GPU, GiB", "ram>=32"),
            Self::Disk => ("number", "disk per GPU, GiB", "disk>=100"),
            Self::Hours => ("number", "longest lease, hours", "hours>=24"),
            Self::MinMinutes => ("number", "shortest lease, minutes", "min_minutes<=10"),
            Self::MinBilled => ("number", "least time billed, seconds", "min_billed<=60"),
            Self::Egress => ("bool", "internet access allowed", "egress=true"),
            Self::Gvisor => ("bool", "tenants run under gVisor (runsc)", "gvisor=true"),
            Self::Interruptible => (
                "bool",
                "a lease may be stopped for the owner",
                "interruptible=false",
            ),
            Self::Region => ("text", "region label", "region=eu-west"),
            Self::Cc => ("number", "CUDA compute capability", "cc>=8.9"),
            Self::Cuda => ("number", "CUDA version the driver supports", "cuda>=12.4"),
            Self::Driver => ("number", "NVIDIA driver major version", "driver>=550"),
            Self::Rep => (
                "number",
                "provider reputation, 0-1 (0.5: unknown)",
                "rep>=0.8",
            ),
            Self::Completed => ("number", "provider's completed leases", "completed>=10"),
            Self::Verified => ("number", "passed GPU checks (true: >=1)", "verified>=3"),
        }
    }

    /// Every field as a help table: name, type, meaning, example (one line each).
    pub fn help_table() -> String {
        let mut out = String::new();
        for (name, f) in Self::ALL {
            let (kind, what, example) = f.describe();
            out.push_str(&format!("  {name:<16} {kind:<7} {what:<36} {example}\n"));
        }
        out
    }

    /// True for a number field that also takes `true` and `false` with `=` and `!=`
    /// (`verified`: `true` is `>=1`, `false` is `=0`).
    pub fn takes_bool(self) -> bool {
        self == Self::Verified
    }

    fn kind(self) -> Kind {
        match self {
            Self::Gpu | Self::Region => Kind::Text,
            Self::Measured | Self::Egress | Self::Gvisor | Self::Interruptible => Kind::Bool,
            _ => Kind::Number,
        }
    }

    /// How many summary units one unit of the query value is, and how many decimals it takes
    /// (public for the control API's description of the query language).
    pub fn scale(self) -> (u64, u32) {
        match self {
            // price: micro-units
            Self::Price | Self::PricePerTflop => (1_000_000, 6),
            // GFLOP/s and MB/s summary values from TFLOPS and GB/s
            Self::Fp16Tflops | Self::Fp32Tflops | Self::MemBw => (1000, 3),
            Self::Cpu => (1000, 3),
            Self::Hours => (3600, 0),
            Self::MinMinutes => (60, 1),
            Self::MinBilled => (1, 0),
            Self::Cc | Self::Cuda => (10, 1),
            Self::Driver | Self::Completed | Self::Verified => (1, 0),
            Self::Rep => (1000, 3),
            Self::Vram | Self::Ram | Self::Gpus | Self::Free | Self::Disk => (1, 0),
            Self::Gpu
            | Self::Region
            | Self::Measured
            | Self::Egress
            | Self::Gvisor
            | Self::Interruptible => (1, 0),
        }
    }

    fn number(self, s: &Numbers) -> u64 {
        match self {
            // Nearest GiB: a 24 564 MiB card is a 24 GiB card.
            Self::Vram => (u64::from(s.vram_mib) + 512) / 1024,
            Self::Ram => (u64::from(s.ram_mib) + 512) / 1024,
            Self::Price => s.price,
            Self::PricePerTflop => s.price_per_tflop,
            Self::Fp16Tflops => u64::from(s.fp16_gflops),
            Self::Fp32Tflops => u64::from(s.fp32_gflops),
            Self::MemBw => u64::from(s.mem_mbps),
            Self::Gpus => u64::from(s.gpus),
            Self::Free => u64::from(s.free_gpus),
            Self::Cpu => u64::from(s.cpu_millicores),
            Self::Disk => u64::from(s.disk_gib),
            Self::Hours => u64::from(s.max_duration_s),
            Self::MinMinutes => u64::from(s.min_duration_s),
            Self::MinBilled => u64::from(s.min_billed_s),
            Self::Cc => u64::from(s.compute_capability),
            Self::Cuda => u64::from(s.cuda),
            Self::Driver => u64::from(s.driver),
            Self::Rep => u64::from(s.provider.rep_permille),
            Self::Completed => u64::from(s.provider.completed),
            Self::Verified => u64::from(s.provider.verified),
            Self::Gpu
            | Self::Region
            | Self::Measured
            | Self::Egress
            | Self::Gvisor
            | Self::Interruptible => 0,
        }
    }
}

/// The right-hand side of a condition, already in summary units.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Value {
    Text(String),
    Bool(bool),
    Number(u64),
}

/// One `FIELD OP VALUE` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    /// The field tested.
    pub field: Field,
    /// The operator.
    pub op: Op,
    value: Value,
}

impl Condition {
    /// True when the summary satisfies this condition.
    pub fn matches(&self, s: &OfferSummary) -> bool {
        match self.matches_numbers(&s.numbers) {
            Some(v) => v,
            None => self.matches_text(match self.field {
                Field::Gpu => &s.models_lower,
                _ => &s.region_lower,
            }),
        }
    }

    /// The verdict for a numeric or boolean condition; `None` for a text condition.
    pub fn matches_numbers(&self, s: &Numbers) -> Option<bool> {
        match &self.value {
            Value::Number(v) => Some(self.op.holds(self.field.number(s).cmp(v))),
            Value::Bool(v) => {
                let actual = match self.field {
                    Field::Measured => s.measured,
                    Field::Egress => s.egress,
                    Field::Gvisor => s.gvisor,
                    Field::Interruptible => s.interruptible,
                    _ => return Some(false),
                };
                Some(self.op.holds(actual.cmp(v)))
            }
            Value::Text(_) => None,
        }
    }

    /// True when the text condition holds for `actual`, the lower-cased text of its field
    /// (models joined by `|` for `gpu`, the region for `region`). False for other conditions.
    pub fn matches_text(&self, actual: &str) -> bool {
        let Value::Text(v) = &self.value else {
            return false;
        };
        match self.op {
            Op::Contains => actual.contains(v.as_str()),
            // A multi-GPU offer equals a model when one of its GPUs has that name.
            Op::Eq => actual.split('|').any(|m| m == v),
            Op::Ne => !actual.split('|').any(|m| m == v),
            _ => false,
        }
    }

    /// True for conditions on text fields (`gpu`, `region`).
    pub fn is_text(&self) -> bool {
        matches!(self.value, Value::Text(_))
    }
}

/// A sort order for results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SortKey {
    /// The field sorted by.
    pub field: SortField,
    /// Largest first.
    pub descending: bool,
}

/// Fields results can be sorted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortField {
    /// Price per GPU-hour.
    Price,
    /// fp16 TFLOPS.
    Fp16Tflops,
    /// fp32 TFLOPS.
    Fp32Tflops,
    /// Price per fp16 TFLOPS.
    PricePerTflop,
    /// VRAM.
    Vram,
    /// Creation time (`age` ascending = newest first).
    Age,
    /// Provider reputation (`-rep`: best first).
    Rep,
    /// The provider's passed GPU checks (`-verified`: most first).
    Verified,
}

impl SortField {
    /// Every sort key's name and field, in the order the docs list them.
    pub const ALL: [(&'static str, Self); 8] = [
        ("price", Self::Price),
        ("fp16_tflops", Self::Fp16Tflops),
        ("fp32_tflops", Self::Fp32Tflops),
        ("price_per_tflop", Self::PricePerTflop),
        ("vram", Self::Vram),
        ("age", Self::Age),
        ("rep", Self::Rep),
        ("verified", Self::Verified),
    ];

    /// The names, comma-separated (for messages).
    pub fn names() -> String {
        Self::ALL.map(|(n, _)| n).join(", ")
    }
}

impl SortKey {
    /// The default order: cheapest first.
    pub const DEFAULT: Self = Self {
        field: SortField::Price,
        descending: false,
    };

    /// Parses `price`, `-fp16_tflops`, `price_per_tflop`, ... (a leading `-` means descending).
    pub fn parse(text: &str) -> Result<Self, QueryError> {
        Self::parse_at(text, 0)
    }

    fn parse_at(text: &str, offset: usize) -> Result<Self, QueryError> {
        let (descending, name) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text.strip_prefix('+').unwrap_or(text)),
        };
        let Some(&(_, field)) = SortField::ALL
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
        else {
            return Err(QueryError {
                start: offset,
                end: offset + text.len(),
                kind: QueryErrorKind::UnknownSortKey(text.to_string()),
            });
        };
        Ok(Self { field, descending })
    }

    /// Compares two summaries under this order. Ties are left to the caller.
    pub fn compare(&self, a: &Numbers, b: &Numbers) -> Ordering {
        self.rank(a).cmp(&self.rank(b))
    }

    /// Where a summary sorts under this order, as one number: smaller first. What a page
    /// cursor keeps (`book::Cursor`).
    pub fn rank(&self, n: &Numbers) -> u64 {
        let v = match self.field {
            SortField::Price => n.price,
            SortField::Fp16Tflops => n.fp16_gflops.into(),
            SortField::Fp32Tflops => n.fp32_gflops.into(),
            SortField::PricePerTflop => n.price_per_tflop,
            SortField::Vram => n.vram_mib.into(),
            // Newest first when ascending by age.
            SortField::Age => !n.created_at,
            SortField::Rep => n.provider.rep_permille.into(),
            SortField::Verified => n.provider.verified.into(),
        };
        // `!v` is `u64::MAX - v`: the order reversed.
        if self.descending { !v } else { v }
    }
}

/// A parsed query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Query {
    /// Conditions, all of which must hold.
    pub conditions: Vec<Condition>,
    /// Result order.
    pub sort: SortKey,
}

impl Default for Query {
    fn default() -> Self {
        Self {
            conditions: Vec::new(),
            sort: SortKey::DEFAULT,
        }
    }
}

/// What is wrong with a query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueryErrorKind {
    /// No operator in a term.
    MissingOperator(String),
    /// A field name that does not exist.
    UnknownField(String),
    /// An operator the field does not support.
    OperatorNotSupported {
        /// The field.
        field: &'static str,
        /// The operator.
        op: &'static str,
    },
    /// A value that is not of the field's type.
    BadValue {
        /// The field.
        field: &'static str,
        /// What was expected.
        expected: &'static str,
    },
    /// Nothing after the operator.
    MissingValue,
    /// An unknown sort key.
    UnknownSortKey(String),
    /// Two sort terms.
    DuplicateSort,
    /// Too many terms.
    TooManyTerms,
}

/// A parse error with the byte span of the offending token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} (at byte {start})")]
pub struct QueryError {
    /// First byte of the offending token.
    pub start: usize,
    /// One past its last byte.
    pub end: usize,
    /// What is wrong.
    pub kind: QueryErrorKind,
}

/// Most conditions in one query.
pub const MAX_TERMS: usize = 32;

impl fmt::Display for QueryErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingOperator(t) => write!(
                f,
                "`{t}` is not a condition: write FIELD OP VALUE, e.g. price<=0.45"
            ),
            Self::UnknownField(n) => {
                let names: Vec<&str> = Field::ALL.iter().map(|(n, _)| *n).collect();
                write!(f, "unknown field `{n}`; known: {}", names.join(", "))
            }
            Self::OperatorNotSupported { field, op } => {
                write!(f, "field `{field}` does not support `{op}`")
            }
            Self::BadValue { field, expected } => {
                write!(f, "field `{field}` expects {expected}")
            }
            Self::MissingValue => write!(f, "missing value after the operator"),
            Self::UnknownSortKey(k) => write!(
                f,
                "unknown sort key `{k}`; known: {} (prefix `-` for descending)",
                SortField::names()
            ),
            Self::DuplicateSort => write!(f, "only one sort term is allowed"),
            Self::TooManyTerms => write!(f, "more than {MAX_TERMS} terms"),
        }
    }
}

impl QueryError {
    /// The query with a caret line under the offending token, for terminals.
    pub fn render(&self, input: &str) -> String {
        let width = self.end.saturating_sub(self.start).max(1);
        let lead = input
            .get(..self.start)
            .map_or(self.start, |s| s.chars().count());
        let marks = input
            .get(self.start..self.end)
            .map_or(width, |s| s.chars().count().max(1));
        format!(
            "{input}\n{}{}\nerror: {}",
            " ".repeat(lead),
            "^".repeat(marks),
            self.kind
        )
    }
}

/// Reads a non-negative decimal with at most `decimals` fractional digits, scaled by `scale`.
fn parse_scaled(text: &str, scale: u64, decimals: u32) -> Option<u64> {
    let (int, frac) = match text.split_once('.') {
        Some((i, f)) => (i, f),
        None => (text, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_len = u32::try_from(frac.len()).ok()?;
    if frac_len > decimals {
        return None;
    }
    let int_v: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac_v: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    // scale / 10^frac_len is exact: scale is a multiple of 10^decimals where decimals > 0.
    let frac_scale = scale / 10u64.checked_pow(frac_len)?;
    int_v
        .checked_mul(scale)?
        .checked_add(frac_v.checked_mul(frac_scale)?)
}

impl Query {
    /// The GPU classes (`gridlease_protocol::class`) the query's `gpu=MODEL` conditions name,
    /// in order, each once: the class of every single-model offer the query can match (a
    /// multi-model offer's class is `mixed`). Empty when no condition names a model exactly
    /// (`gpu~4090` names no class).
    pub fn gpu_classes(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for c in &self.conditions {
            if let (Field::Gpu, Op::Eq, Value::Text(model)) = (c.field, c.op, &c.value) {
                let class = gridlease_protocol::class::class_of_model(model);
                if !out.contains(&class) {
                    out.push(class);
                }
            }
        }
        out
    }

    /// Parses a query. The empty string matches every offer.
    pub fn parse(input: &str) -> Result<Self, QueryError> {
        let mut q = Self::default();
        let mut sort_seen = false;
        let mut count = 0usize;
        for (start, token) in tokens(input) {
            count += 1;
            let err = |kind| QueryError {
                start,
                end: start + token.len(),
                kind,
            };
            if count > MAX_TERMS {
                return Err(err(QueryErrorKind::TooManyTerms));
            }
            if let Some(key) = token
                .strip_prefix("sort:")
                .or_else(|| token.strip_prefix("sort="))
            {
                if sort_seen {
                    return Err(err(QueryErrorKind::DuplicateSort));
                }
                sort_seen = true;
                q.sort = SortKey::parse_at(key, start + 5)?;
                continue;
            }
            q.conditions.push(parse_condition(start, token)?);
        }
        Ok(q)
    }

    /// True when every condition holds.
    pub fn matches(&self, s: &OfferSummary) -> bool {
        self.conditions.iter().all(|c| c.matches(s))
    }
}

/// Whitespace-separated tokens with their byte offsets; whitespace inside double quotes does
/// not split (`gpu="rtx 4090"`).
fn tokens(input: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut pos = 0;
    std::iter::from_fn(move || {
        let rest = &input[pos..];
        let trimmed = rest.trim_start();
        pos += rest.len() - trimmed.len();
        if trimmed.is_empty() {
            return None;
        }
        let mut in_quote = false;
        let mut len = trimmed.len();
        for (i, c) in trimmed.char_indices() {
            if c == '"' {
                in_quote = !in_quote;
            } else if c.is_whitespace() && !in_quote {
                len = i;
                break;
            }
        }
        let at = pos;
        pos += len;
        Some((at, &trimmed[..len]))
    })
}

fn parse_condition(start: usize, token: &str) -> Result<Condition, QueryError> {
    let op_at = token
        .find(['=', '!', '<', '>', '~'])
        .ok_or_else(|| QueryError {
            start,
            end: start + token.len(),
            kind: QueryErrorKind::MissingOperator(token.to_string()),
        })?;
    let name = &token[..op_at];
    let after = &token[op_at..];
    let (op, op_len) = if after.starts_with("<=") {
        (Op::Le, 2)
    } else if after.starts_with(">=") {
        (Op::Ge, 2)
    } else if after.starts_with("!=") {
        (Op::Ne, 2)
    } else if after.starts_with("==") {
        (Op::Eq, 2)
    } else if after.starts_with('<') {
        (Op::Lt, 1)
    } else if after.starts_with('>') {
        (Op::Gt, 1)
    } else if after.starts_with('=') {
        (Op::Eq, 1)
    } else if after.starts_with('~') {
        (Op::Contains, 1)
    } else {
        return Err(QueryError {
            start: start + op_at,
            end: start + op_at + 1,
            kind: QueryErrorKind::MissingOperator(token.to_string()),
        });
    };
    let field = Field::from_name(name).ok_or_else(|| QueryError {
        start,
        end: start + op_at.max(1),
        kind: if name.is_empty() {
            QueryErrorKind::MissingOperator(token.to_string())
        } else {
            QueryErrorKind::UnknownField(name.to_string())
        },
    })?;
    let value_at = start + op_at + op_len;
    let raw = &token[op_at + op_len..];
    let op_err = || QueryError {
        start: start + op_at,
        end: value_at,
        kind: QueryErrorKind::OperatorNotSupported {
            field: field.name(),
            op: op.as_str(),
        },
    };
    if raw.is_empty() {
        return Err(QueryError {
            start,
            end: value_at,
            kind: QueryErrorKind::MissingValue,
        });
    }
    let bad_value = |expected| QueryError {
        start: value_at,
        end: value_at + raw.len(),
        kind: QueryErrorKind::BadValue {
            field: field.name(),
            expected,
        },
    };
    let value = match field.kind() {
        Kind::Text => {
            if !matches!(op, Op::Eq | Op::Ne | Op::Contains) {
                return Err(op_err());
            }
            let text = match raw.strip_prefix('"') {
                Some(quoted) => match quoted.strip_suffix('"') {
                    Some(inner) if !inner.contains('"') => inner,
                    _ => return Err(bad_value("text, quoted as \"..\" when it has spaces")),
                },
                None if raw.contains('"') => {
                    return Err(bad_value("text, quoted as \"..\" when it has spaces"));
                }
                None => raw,
            };
            Value::Text(text.to_lowercase())
        }
        Kind::Bool => {
            if !matches!(op, Op::Eq | Op::Ne) {
                return Err(op_err());
            }
            match raw.to_ascii_lowercase().as_str() {
                "true" | "yes" | "1" => Value::Bool(true),
                "false" | "no" | "0" => Value::Bool(false),
                _ => return Err(bad_value("true or false")),
            }
        }
        Kind::Number => {
            if op == Op::Contains {
                return Err(op_err());
            }
            // `verified` was a bool (every benchmark measured, now `measured`): `verified=true`
            // still reads as "at least one passed GPU check", `verified=false` as "none".
            if field.takes_bool()
                && let Some(yes) = match raw.to_ascii_lowercase().as_str() {
                    "true" | "yes" => Some(true),
                    "false" | "no" => Some(false),
                    _ => None,
                }
            {
                let op = match (op, yes) {
                    (Op::Eq, true) | (Op::Ne, false) => Op::Ge,
                    (Op::Eq, false) | (Op::Ne, true) => Op::Eq,
                    _ => {
                        return Err(bad_value(
                            "a whole number (true or false only with = or !=)",
                        ));
                    }
                };
                return Ok(Condition {
                    field,
                    op,
                    value: Value::Number(u64::from(op == Op::Ge)),
                });
            }
            let (scale, decimals) = field.scale();
            let v = if field == Field::Price || field == Field::PricePerTflop {
                raw.parse::<Money>().ok().map(Money::micros)
            } else {
                parse_scaled(raw, scale, decimals)
            };
            match v {
                Some(v) => Value::Number(v),
                None => {
                    return Err(bad_value(match (field.takes_bool(), decimals) {
                        (true, _) => "a whole number, or true or false",
                        (_, 0) => "a whole number",
                        _ => "a decimal number",
                    }));
                }
            }
        }
    };
    Ok(Condition { field, op, value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::NodeKey;
    use gridlease_protocol::fixtures;

    fn summary(price: u64) -> OfferSummary {
        let key = NodeKey::from_secret([3; 32]);
        OfferSummary::of(&fixtures::offer(key.public(), 1, 2, price))
    }

    #[test]
    fn the_issue_example_parses_and_matches() {
        let q =
            Query::parse("gpu~4090 vram>=24 price<=0.45 fp16_tflops>=100 measured=false gpus>=2")
                .unwrap();
        assert_eq!(q.conditions.len(), 6);
        assert!(q.matches(&summary(400_000)));
        assert!(!q.matches(&summary(450_001)));
        let q = Query::parse("measured=true").unwrap();
        assert!(!q.matches(&summary(1)), "declared GPUs are not measured");
    }

    #[test]
    fn verified_counts_passed_gpu_checks_and_reads_true_and_false_as_before() {
        let mut s = summary(1);
        let holds = |q: &str, s: &OfferSummary| Query::parse(q).unwrap().matches(s);
        // Nothing known of the provider: no check.
        assert_eq!(s.numbers.provider, ProviderNumbers::PRIOR);
        for (q, want) in [
            ("verified=0", true),
            ("verified>=1", false),
            ("verified=false", true),
            ("verified=no", true),
            ("verified!=true", true),
            ("verified=true", false),
            ("verified!=false", false),
        ] {
            assert_eq!(holds(q, &s), want, "{q} with no check");
        }
        s.numbers.provider.verified = 3;
        for (q, want) in [
            ("verified>=3", true),
            ("verified>3", false),
            ("verified=3", true),
            ("verified<=2", false),
            ("verified=true", true),
            ("verified=YES", true),
            ("verified!=false", true),
            ("verified=false", false),
            ("verified!=true", false),
            ("verified=0", false),
        ] {
            assert_eq!(holds(q, &s), want, "{q} with 3 passed checks");
        }
        // `true` is `>=1`, `false` is `=0`, as parsed.
        assert_eq!(
            Query::parse("verified=true").unwrap(),
            Query::parse("verified>=1").unwrap()
        );
        assert_eq!(
            Query::parse("verified=false").unwrap(),
            Query::parse("verified=0").unwrap()
        );
        for bad in [
            "verified>=true",
            "verified<false",
            "verified=maybe",
            "verified>=1.5",
        ] {
            let e = Query::parse(bad).unwrap_err();
            assert!(
                matches!(
                    e.kind,
                    QueryErrorKind::BadValue {
                        field: "verified",
                        ..
                    }
                ),
                "{bad}: {e}"
            );
        }
        assert!(
            Query::parse("verified=maybe")
                .unwrap_err()
                .to_string()
                .contains("a whole number, or true or false")
        );
        // Most checks first.
        let mut t = summary(1);
        t.numbers.provider.verified = 12;
        let most = SortKey::parse("-verified").unwrap();
        assert_eq!(most.compare(&t.numbers, &s.numbers), Ordering::Less);
        assert_eq!(Field::Verified.describe().0, "number");
        assert_eq!(Field::Measured.describe().0, "bool");
    }

    #[test]
    fn every_operator_on_numbers() {
        let s = summary(400_000);
        for (q, want) in [
            ("price=0.4", true),
            ("price!=0.4", false),
            ("price<0.4", false),
            ("price<=0.4", true),
            ("price>0.39", true),
            ("price>=0.41", false),
            ("gpus==2", true),
            ("cc>=8.9", true),
            ("cc>8.9", false),
            ("fp16_tflops>=165.2", true),
            ("fp16_tflops>165.2", false),
            ("hours>=24", true),
            ("cpu>=8", true),
            ("ram>=32", true),
            ("mem_bw>=1000", true),
            ("region=EU-west", true),
            ("region~east", false),
            ("gpu=nvidia geforce rtx 4090", false), // a space splits terms
            ("gpu=\"nvidia geforce rtx 4090\"", true),
            ("gpu=\"NVIDIA GeForce RTX 3090\"", false),
            ("egress=false", true),
            ("gvisor=false", true),
            ("interruptible=false", true),
            ("interruptible=true", false),
            ("free>=1", true),
            ("free>=9", false),
            ("gvisor=true", false),
            ("price_per_tflop<=0.003", true),
            // The fixture's GPUs: driver 550.54.14, CUDA 12.4.
            ("cuda>=12.4", true),
            ("cuda>12.4", false),
            ("cuda<12.5", true),
            ("cuda>=12", true),
            ("driver>=550", true),
            ("driver>550", false),
            ("driver=550", true),
            // The fixture's lease terms: 60 s to 24 h, at least 60 s billed.
            ("min_minutes<=1", true),
            ("min_minutes<1", false),
            ("min_minutes<=0.9", false),
            ("min_minutes=1.0", true),
            ("min_billed<=60", true),
            ("min_billed<60", false),
            ("min_billed>=60", true),
        ] {
            let parsed = Query::parse(q);
            let parsed = match parsed {
                Ok(p) => p,
                Err(e) if q.contains(' ') => {
                    assert!(matches!(e.kind, QueryErrorKind::MissingOperator(_)));
                    continue;
                }
                Err(e) => panic!("{q}: {e}"),
            };
            assert_eq!(parsed.matches(&s), want, "{q}");
        }
    }

    #[test]
    fn errors_point_at_the_offending_token() {
        let input = "gpu~4090  vrma>=24 price<=0.45";
        let e = Query::parse(input).unwrap_err();
        assert_eq!(&input[e.start..e.end], "vrma");
        assert!(matches!(e.kind, QueryErrorKind::UnknownField(_)));
        let rendered = e.render(input);
        assert!(rendered.contains("\n          ^^^^\n"), "{rendered}");

        let input = "price<=cheap";
        let e = Query::parse(input).unwrap_err();
        assert_eq!(&input[e.start..e.end], "cheap");

        let input = "vram>=24 gpu>=4090";
        let e = Query::parse(input).unwrap_err();
        assert_eq!(&input[e.start..e.end], ">=");

        let input = "vram>=24 4090";
        let e = Query::parse(input).unwrap_err();
        assert_eq!(&input[e.start..e.end], "4090");

        let input = "vram>= 24";
        let e = Query::parse(input).unwrap_err();
        assert_eq!(e.kind, QueryErrorKind::MissingValue);

        let input = "measured=maybe";
        let e = Query::parse(input).unwrap_err();
        assert_eq!(&input[e.start..e.end], "maybe");
        let input = "verified=maybe";
        let e = Query::parse(input).unwrap_err();
        assert_eq!(&input[e.start..e.end], "maybe");

        let input = "vram>=24.5";
        let e = Query::parse(input).unwrap_err();
        assert_eq!(&input[e.start..e.end], "24.5");

        let input = "gpu=\"rtx 4090 vram>=24";
        let e = Query::parse(input).unwrap_err();
        assert_eq!(&input[e.start..e.end], "\"rtx 4090 vram>=24");

        let input = "price<=1 sort:cheapest";
        let e = Query::parse(input).unwrap_err();
        assert_eq!(&input[e.start..e.end], "cheapest");
    }

    #[test]
    fn sort_keys() {
        let q = Query::parse("sort:-fp16_tflops").unwrap();
        assert_eq!(
            q.sort,
            SortKey {
                field: SortField::Fp16Tflops,
                descending: true
            }
        );
        assert_eq!(
            SortKey::parse("price_per_tflop").unwrap().field,
            SortField::PricePerTflop
        );
        assert!(Query::parse("sort:price sort:age").is_err());
        let a = summary(100);
        let b = summary(200);
        assert_eq!(
            SortKey::DEFAULT.compare(&a.numbers, &b.numbers),
            Ordering::Less
        );
        assert_eq!(
            SortKey::parse("-price")
                .unwrap()
                .compare(&a.numbers, &b.numbers),
            Ordering::Greater
        );
    }

    #[test]
    fn gpu_conditions_name_the_classes_of_the_models_they_equal() {
        let q = Query::parse(
            r#"gpu="NVIDIA GeForce RTX 4090" vram>=24 gpu!=a100 gpu~h100 gpu=rtx-4090 gpu="nvidia a100-sxm4-80gb""#,
        )
        .unwrap();
        assert_eq!(q.gpu_classes(), vec!["rtx-4090", "a100-sxm4-80gb"]);
        assert!(Query::parse("gpu~4090").unwrap().gpu_classes().is_empty());
    }

    #[test]
    fn empty_query_matches_everything() {
        let q = Query::parse("   ").unwrap();
        assert!(q.matches(&summary(5)));
    }

    #[test]
    fn scaled_numbers() {
        assert_eq!(parse_scaled("1.5", 1000, 3), Some(1500));
        assert_eq!(parse_scaled(".5", 1000, 3), Some(500));
        assert_eq!(parse_scaled("1.2345", 1000, 3), None);
        assert_eq!(parse_scaled("-1", 1000, 3), None);
        assert_eq!(parse_scaled("", 1000, 3), None);
        assert_eq!(parse_scaled("99999999999999999999", 1, 0), None);
    }

    #[test]
    fn cuda_and_driver_take_the_weakest_gpu_and_unknown_versions_match_nothing() {
        let key = NodeKey::from_secret([3; 32]);
        let mut offer = fixtures::offer(key.public(), 1, 2, 400_000);
        offer.gpus[1].spec.cuda_version = "12.8".into();
        offer.gpus[1].spec.driver_version = "570.86.10".into();
        let s = OfferSummary::of(&offer);
        assert_eq!(
            (s.numbers.cuda, s.numbers.driver),
            (124, 550),
            "the weakest GPU's"
        );
        offer.gpus[0].spec.cuda_version = "declared".into();
        offer.gpus[0].spec.driver_version = String::new();
        let s = OfferSummary::of(&offer);
        assert_eq!((s.numbers.cuda, s.numbers.driver), (0, 0));
        for q in ["cuda>=1", "driver>=1"] {
            assert!(!Query::parse(q).unwrap().matches(&s), "{q}");
        }
        assert_eq!(version("13.0"), Some((13, 0)));
        assert_eq!(version("560"), Some((560, 0)));
        assert_eq!(version("x.1"), None);
    }
}
