//! Double-auction experiments from scenario files: unit schedules, market rules, treatments
//! (trader type per side), period lengths (in shouts or in simulated seconds), periods and
//! replications; results per period, per replication and per transaction index, and their
//! statistics.
//!
//! A replication is one session of `periods` trading periods; every period starts from the full
//! schedules (fresh endowments), as in Gode & Sunder's sessions. Replication r of treatment t at
//! period length l draws from its own stream, keyed by (seed, r, t, l), so adding a treatment or
//! a period length never changes another cell's results.

use std::collections::BTreeMap;
use std::path::Path;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::{Equilibrium, Length, Period, Rules, Schedules, Strategy, Trader, equilibrium, period};
use crate::rng::{StreamKind, mix64, stream};
use crate::stats::{self, Summary};
use crate::table::Table;

/// Errors loading an experiment file.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    /// The file could not be read.
    #[error("cannot read experiment {path}")]
    Read {
        /// The path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is invalid.
    #[error("invalid experiment file")]
    Parse(#[from] toml::de::Error),
    /// A value is out of range or inconsistent.
    #[error("invalid experiment: {0}")]
    Invalid(String),
    /// A treatment names a trader type nobody registered.
    #[error(
        "treatment {treatment:?}: no trader type {name:?} (known: {known}; others plug in through zi::experiment::Strategies)"
    )]
    UnknownTrader {
        /// The treatment.
        treatment: String,
        /// The type it names.
        name: String,
        /// The registered types.
        known: String,
    },
}

/// The trader types an experiment may name, by name: the built-in `zi-c` and `zi-u`, and any
/// [`Strategy`] registered with [`Strategies::with`] (the way to run your own trader type
/// through the whole pipeline: tables, statistics, figures).
pub struct Strategies {
    by_name: BTreeMap<String, Box<dyn Strategy>>,
}

impl Default for Strategies {
    fn default() -> Self {
        Self::builtin()
    }
}

impl Strategies {
    /// `zi-c` ([`Trader::Constrained`]) and `zi-u` ([`Trader::Unconstrained`]).
    pub fn builtin() -> Self {
        let mut by_name: BTreeMap<String, Box<dyn Strategy>> = BTreeMap::new();
        by_name.insert(ZI_C.into(), Box::new(Trader::Constrained));
        by_name.insert(ZI_U.into(), Box::new(Trader::Unconstrained));
        Self { by_name }
    }

    /// These types and `strategy` under `name` (replacing a type of that name).
    pub fn with(mut self, name: impl Into<String>, strategy: impl Strategy + 'static) -> Self {
        self.by_name.insert(name.into(), Box::new(strategy));
        self
    }

    /// The type called `name`.
    pub fn get(&self, name: &str) -> Option<&dyn Strategy> {
        self.by_name.get(name).map(|b| b.as_ref())
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.by_name.keys().map(String::as_str).collect()
    }
}

/// The built-in budget-constrained type's name.
pub const ZI_C: &str = "zi-c";
/// The built-in unconstrained type's name.
pub const ZI_U: &str = "zi-u";

/// One buyer: its units' redemption values, in trading order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Buyer {
    /// Values.
    pub values: Vec<u64>,
}

/// One seller: its units' costs, in trading order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seller {
    /// Costs.
    pub costs: Vec<u64>,
}

/// A treatment: a label and the trader type on each side, by name ([`Strategies`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Treatment {
    /// Label in outputs (`ZI-C`).
    pub name: String,
    /// Buyers' type (`zi-c`, `zi-u`, or a registered one).
    pub buyers: String,
    /// Sellers' type.
    pub sellers: String,
}

fn default_treatments() -> Vec<Treatment> {
    vec![
        Treatment {
            name: "ZI-C".into(),
            buyers: ZI_C.into(),
            sellers: ZI_C.into(),
        },
        Treatment {
            name: "ZI-U".into(),
            buyers: ZI_U.into(),
            sellers: ZI_U.into(),
        },
    ]
}

/// An experiment file (`simulations/scenarios/gs-market*.toml`). Unknown fields are refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Experiment {
    /// Label in outputs.
    pub name: String,
    /// Where the schedules come from (citation).
    #[serde(default)]
    pub source: String,
    /// Non-empty when the schedules are a reconstruction, not the source's own numbers: says
    /// what was reconstructed and how.
    #[serde(default)]
    pub reconstruction: String,
    /// Lowest admissible price (default 1).
    #[serde(default = "one")]
    pub min_price: u64,
    /// Highest admissible price (default 200, Gode & Sunder's range).
    #[serde(default = "two_hundred")]
    pub max_price: u64,
    /// Trading periods per replication (default 6, Gode & Sunder's session length).
    #[serde(default = "six")]
    pub periods: u32,
    /// Replications (sessions) per treatment and period length (default 30).
    #[serde(default = "thirty")]
    pub replications: u32,
    /// Period lengths to run, in shouts (default `[500, 2000]`).
    #[serde(default = "default_shouts")]
    pub shouts_per_period: Vec<u32>,
    /// Period lengths to run, in simulated seconds (timed periods; default none).
    #[serde(default)]
    pub seconds_per_period: Vec<u32>,
    /// In timed periods, shouts per second of each trader with units left (default 1).
    #[serde(default = "one_f")]
    pub shout_rate: f64,
    /// Market rules.
    #[serde(default)]
    pub rules: Rules,
    /// Treatments (default ZI-C on both sides, ZI-U on both sides).
    #[serde(default = "default_treatments", rename = "treatment")]
    pub treatments: Vec<Treatment>,
    /// Buyers.
    #[serde(rename = "buyer")]
    pub buyers: Vec<Buyer>,
    /// Sellers.
    #[serde(rename = "seller")]
    pub sellers: Vec<Seller>,
    /// Mean efficiencies (percent) the source reports, by treatment name, for comparison.
    #[serde(default)]
    pub reported_efficiency: BTreeMap<String, f64>,
}

fn one() -> u64 {
    1
}
fn one_f() -> f64 {
    1.0
}
fn two_hundred() -> u64 {
    200
}
fn six() -> u32 {
    6
}
fn thirty() -> u32 {
    30
}
fn default_shouts() -> Vec<u32> {
    vec![500, 2000]
}

impl Experiment {
    /// Parses and validates TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ExperimentError> {
        let e: Self = toml::from_str(text)?;
        e.validate()?;
        Ok(e)
    }

    /// Reads, parses and validates a file.
    pub fn load(path: &Path) -> Result<Self, ExperimentError> {
        let text = std::fs::read_to_string(path).map_err(|source| ExperimentError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// The canonical TOML (what the hash covers).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ExperimentError> {
        let bad = |m: String| Err(ExperimentError::Invalid(m));
        if self.min_price == 0 || self.min_price >= self.max_price {
            return bad(format!(
                "need 1 <= min_price < max_price, got {}..{}",
                self.min_price, self.max_price
            ));
        }
        if self.periods == 0 {
            return bad("periods must be at least 1".into());
        }
        if self.replications == 0 {
            return bad("replications must be at least 1".into());
        }
        if self.shouts_per_period.contains(&0) || self.seconds_per_period.contains(&0) {
            return bad("period lengths must be at least 1 (shout or second)".into());
        }
        if self.shouts_per_period.is_empty() && self.seconds_per_period.is_empty() {
            return bad(
                "at least one period length: shouts_per_period or seconds_per_period".into(),
            );
        }
        if self.seconds_per_period.iter().any(|&s| s > MAX_SECONDS) {
            return bad(format!(
                "seconds_per_period: at most {MAX_SECONDS} seconds a period"
            ));
        }
        if !(self.shout_rate.is_finite() && self.shout_rate > 0.0) {
            return bad(format!(
                "shout_rate must be a positive number, got {}",
                self.shout_rate
            ));
        }
        let traders = (self.buyers.len() + self.sellers.len()) as f64;
        let longest = self.seconds_per_period.iter().copied().max().unwrap_or(0);
        if self.shout_rate * f64::from(longest) * traders > MAX_SHOUTS as f64 {
            return bad(format!(
                "shout_rate x seconds x traders = {:.0} expected shouts a period: more than {MAX_SHOUTS}",
                self.shout_rate * f64::from(longest) * traders
            ));
        }
        if self.shouts_per_period.iter().any(|&s| s > MAX_SHOUTS) {
            return bad(format!("shouts_per_period: at most {MAX_SHOUTS} a period"));
        }
        if self.treatments.is_empty() {
            return bad("at least one [[treatment]]".into());
        }
        let mut names: Vec<&str> = self.treatments.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return bad("treatment names must be unique".into());
        }
        if self.buyers.is_empty() || self.sellers.is_empty() {
            return bad("at least one [[buyer]] and one [[seller]]".into());
        }
        let range = self.min_price..=self.max_price;
        for (i, b) in self.buyers.iter().enumerate() {
            if b.values.is_empty() || !b.values.iter().all(|v| range.contains(v)) {
                return bad(format!(
                    "buyer {i}: needs at least one value, each in {}..={}",
                    self.min_price, self.max_price
                ));
            }
        }
        for (i, s) in self.sellers.iter().enumerate() {
            if s.costs.is_empty() || !s.costs.iter().all(|c| range.contains(c)) {
                return bad(format!(
                    "seller {i}: needs at least one cost, each in {}..={}",
                    self.min_price, self.max_price
                ));
            }
        }
        if equilibrium(&self.schedules()).max_surplus == 0 {
            return bad("no unit can trade at a gain: maximum surplus is 0".into());
        }
        Ok(())
    }

    /// The schedules.
    pub fn schedules(&self) -> Schedules {
        Schedules {
            buyers: self.buyers.iter().map(|b| b.values.clone()).collect(),
            sellers: self.sellers.iter().map(|s| s.costs.clone()).collect(),
            min_price: self.min_price,
            max_price: self.max_price,
        }
    }

    /// The competitive equilibrium.
    pub fn equilibrium(&self) -> Equilibrium {
        equilibrium(&self.schedules())
    }

    /// Each treatment's (buyers', sellers') types from `strategies`; an error names the first
    /// type it does not have.
    pub fn sides<'s>(
        &self,
        strategies: &'s Strategies,
    ) -> Result<Vec<(&'s dyn Strategy, &'s dyn Strategy)>, ExperimentError> {
        let mut sides = Vec::with_capacity(self.treatments.len());
        for tr in &self.treatments {
            let side = |name: &str| {
                strategies
                    .get(name)
                    .ok_or_else(|| ExperimentError::UnknownTrader {
                        treatment: tr.name.clone(),
                        name: name.to_string(),
                        known: strategies.names().join(", "),
                    })
            };
            sides.push((side(&tr.buyers)?, side(&tr.sellers)?));
        }
        Ok(sides)
    }

    /// The period lengths run: those in shouts, then those in seconds.
    pub fn lengths(&self) -> Vec<Length> {
        let shouts = self.shouts_per_period.iter().map(|&n| Length::Shouts(n));
        let timed = self
            .seconds_per_period
            .iter()
            .map(|&seconds| Length::Seconds {
                seconds,
                rate: self.shout_rate,
            });
        shouts.chain(timed).collect()
    }
}

/// Longest timed period, seconds (the stream key keeps a bit for the unit).
pub const MAX_SECONDS: u32 = 1 << 30;
/// Most shouts a period may make (in shouts, or expected in a timed period).
pub const MAX_SHOUTS: u32 = 10_000_000;

/// A period length's two table columns: the number and its unit (`shouts` or `seconds`).
pub fn length_cells(l: Length) -> [String; 2] {
    match l {
        Length::Shouts(n) => [n.to_string(), "shouts".into()],
        Length::Seconds { seconds, .. } => [seconds.to_string(), "seconds".into()],
    }
}

/// A period length as text: `500 shouts`, `30 s`.
pub fn length_label(l: Length) -> String {
    match l {
        Length::Shouts(n) => format!("{n} shouts"),
        Length::Seconds { seconds, .. } => format!("{seconds} s"),
    }
}

/// One replication's periods, for one treatment and period length.
#[derive(Clone, Debug, PartialEq)]
pub struct Replication {
    /// Treatment index.
    pub treatment: usize,
    /// The period length.
    pub length: Length,
    /// Replication index.
    pub replication: u32,
    /// The periods, in order.
    pub periods: Vec<Period>,
}

impl Replication {
    /// Realised surplus over all periods / (periods x maximum surplus).
    pub fn efficiency(&self) -> f64 {
        let n = self.periods.len().max(1) as f64;
        self.periods.iter().map(|p| p.efficiency).sum::<f64>() / n
    }

    /// Mean units traded per period.
    pub fn volume(&self) -> f64 {
        let n = self.periods.len().max(1) as f64;
        self.periods
            .iter()
            .map(|p| f64::from(p.trades))
            .sum::<f64>()
            / n
    }

    /// Root-mean-square deviation of all the replication's prices from `p0` (NaN without
    /// trades).
    pub fn price_rmsd(&self, p0: f64) -> f64 {
        let all: Vec<u64> = self.prices().collect();
        super::price_rmsd(&all, p0)
    }

    /// Every trade's price, period by period.
    pub fn prices(&self) -> impl Iterator<Item = u64> + '_ {
        self.periods.iter().flat_map(|p| p.prices.iter().copied())
    }

    /// Mean price over all of the replication's trades (NaN without trades).
    pub fn mean_price(&self) -> f64 {
        let (sum, n) = self.periods.iter().fold((0u64, 0usize), |(s, n), p| {
            (s + p.prices.iter().sum::<u64>(), n + p.prices.len())
        });
        if n == 0 {
            f64::NAN
        } else {
            sum as f64 / n as f64
        }
    }
}

/// The stream of replication `r` of treatment `t` at period length `length` (a length in
/// seconds sets bit 31 of its key; the rate is not in the key).
fn cell_stream(seed: u64, r: u32, t: usize, length: Length) -> rand_pcg::Pcg64Mcg {
    let l = match length {
        Length::Shouts(n) => u64::from(n),
        Length::Seconds { seconds, .. } => (1 << 31) | u64::from(seconds),
    };
    let index = mix64(((t as u64) << 32) | l);
    stream(seed, u64::from(r), StreamKind::Market, index)
}

/// Runs one replication of treatment `t`, whose sides follow `sides`.
fn replication(
    e: &Experiment,
    sides: (&dyn Strategy, &dyn Strategy),
    t: usize,
    length: Length,
    r: u32,
    seed: u64,
) -> Replication {
    let s = e.schedules();
    let mut rng = cell_stream(seed, r, t, length);
    let periods = (0..e.periods)
        .map(|_| period(&s, e.rules, sides.0, sides.1, length, &mut rng))
        .collect();
    Replication {
        treatment: t,
        length,
        replication: r,
        periods,
    }
}

/// Runs every (treatment, period length, replication) with the built-in trader types, in
/// parallel; results in that order.
pub fn run(e: &Experiment, seed: u64) -> Result<Vec<Replication>, ExperimentError> {
    run_with(e, seed, &Strategies::builtin())
}

/// Runs every (treatment, period length, replication), the treatments' types taken from
/// `strategies`, in parallel; results in that order. A type `strategies` does not have is
/// refused before anything runs.
pub fn run_with(
    e: &Experiment,
    seed: u64,
    strategies: &Strategies,
) -> Result<Vec<Replication>, ExperimentError> {
    let sides = e.sides(strategies)?;
    let lengths = e.lengths();
    let cells: Vec<(usize, Length, u32)> = (0..e.treatments.len())
        .flat_map(|t| {
            lengths
                .iter()
                .flat_map(move |&l| (0..e.replications).map(move |r| (t, l, r)))
        })
        .collect();
    Ok(cells
        .par_iter()
        .map(|&(t, s, r)| replication(e, sides[t], t, s, r, seed))
        .collect())
}

fn f(x: f64) -> String {
    if x.is_nan() {
        String::new()
    } else {
        format!("{x:.6}")
    }
}

/// `periods.csv`: one row per (treatment, shouts, replication, period).
pub fn periods_table(e: &Experiment, reps: &[Replication]) -> Table {
    let mut t = Table {
        header: [
            "treatment",
            "length",
            "unit",
            "replication",
            "period",
            "efficiency",
            "surplus",
            "trades",
            "mean_price",
            "price_rmsd",
            "alpha",
            "shouts",
            "admitted_shouts",
            "prices",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    let p0 = e.equilibrium().price();
    for r in reps {
        let [length, unit] = length_cells(r.length);
        for (k, p) in r.periods.iter().enumerate() {
            t.rows.push(vec![
                e.treatments[r.treatment].name.clone(),
                length.clone(),
                unit.clone(),
                r.replication.to_string(),
                (k + 1).to_string(),
                f(p.efficiency),
                p.surplus.to_string(),
                p.trades.to_string(),
                f(p.mean_price()),
                f(p.price_rmsd(p0)),
                f(super::alpha(&p.prices, p0)),
                p.shouts.to_string(),
                p.admitted.to_string(),
                p.prices
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(" "),
            ]);
        }
    }
    t
}

/// `replications.csv`: one row per (treatment, shouts, replication).
pub fn replications_table(e: &Experiment, reps: &[Replication]) -> Table {
    let mut t = Table {
        header: [
            "treatment",
            "length",
            "unit",
            "replication",
            "efficiency",
            "volume",
            "mean_price",
            "price_rmsd",
            "alpha",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    let p0 = e.equilibrium().price();
    for r in reps {
        let [length, unit] = length_cells(r.length);
        let rmsd = r.price_rmsd(p0);
        t.rows.push(vec![
            e.treatments[r.treatment].name.clone(),
            length,
            unit,
            r.replication.to_string(),
            f(r.efficiency()),
            f(r.volume()),
            f(r.mean_price()),
            f(rmsd),
            f(100.0 * rmsd / p0),
        ]);
    }
    t
}

/// Statistics of one metric in one (treatment, shouts) cell; `period` is `None` for the
/// replication-level metric (one value per replication), `Some(k)` for period k's values across
/// replications.
#[derive(Clone, Debug, PartialEq)]
pub struct CellSummary {
    /// Treatment name.
    pub treatment: String,
    /// The period length.
    pub length: Length,
    /// Period (1-based), or `None` for the whole replication.
    pub period: Option<u32>,
    /// `efficiency`, `volume`, `mean_price`, `price_rmsd` or `alpha`.
    pub metric: &'static str,
    /// The statistics.
    pub summary: Summary,
}

/// Statistics of efficiency, volume, mean price, price RMSD and alpha per (treatment, period
/// length): over replications (`period = None`) and per period index across replications.
pub fn summaries(e: &Experiment, reps: &[Replication], seed: u64) -> Vec<CellSummary> {
    let mut out = Vec::new();
    let p0 = e.equilibrium().price();
    for (ti, tr) in e.treatments.iter().enumerate() {
        for length in e.lengths() {
            let cell: Vec<&Replication> = reps
                .iter()
                .filter(|r| r.treatment == ti && r.length == length)
                .collect();
            // Lengths in shouts keep the keys they had before timed periods existed.
            let l = match length {
                Length::Shouts(n) => n.to_string(),
                Length::Seconds { seconds, .. } => format!("{seconds}s"),
            };
            let mut push = |period: Option<u32>, metric: &'static str, xs: Vec<f64>| {
                let key = stats::key(&format!("{}/{l}/{}/{metric}", tr.name, period.unwrap_or(0)));
                out.push(CellSummary {
                    treatment: tr.name.clone(),
                    length,
                    period,
                    metric,
                    summary: Summary::of(&xs, seed, key, stats::Bounds::of(metric)),
                });
            };
            push(
                None,
                "efficiency",
                cell.iter().map(|r| r.efficiency()).collect(),
            );
            push(None, "volume", cell.iter().map(|r| r.volume()).collect());
            push(
                None,
                "mean_price",
                cell.iter().map(|r| r.mean_price()).collect(),
            );
            let rmsd: Vec<f64> = cell.iter().map(|r| r.price_rmsd(p0)).collect();
            let alpha = rmsd.iter().map(|x| 100.0 * x / p0).collect();
            push(None, "price_rmsd", rmsd);
            push(None, "alpha", alpha);
            for k in 0..e.periods as usize {
                let at = |g: &dyn Fn(&Period) -> f64| -> Vec<f64> {
                    cell.iter()
                        .filter_map(|r| r.periods.get(k).map(g))
                        .collect()
                };
                let p = Some(k as u32 + 1);
                push(p, "efficiency", at(&|p| p.efficiency));
                push(p, "volume", at(&|p| f64::from(p.trades)));
                push(p, "mean_price", at(&|p| p.mean_price()));
                push(p, "price_rmsd", at(&|p| p.price_rmsd(p0)));
                push(p, "alpha", at(&|p| super::alpha(&p.prices, p0)));
            }
        }
    }
    out
}

/// `summary.csv`: one row per [`CellSummary`] (`period` empty for the replication level).
pub fn summary_table(cells: &[CellSummary]) -> Table {
    let mut header: Vec<String> = ["treatment", "length", "unit", "period", "metric"]
        .map(String::from)
        .to_vec();
    header.extend(Summary::COLUMNS.iter().map(|c| c.to_string()));
    let mut t = Table {
        header,
        rows: Vec::new(),
    };
    for c in cells {
        let [length, unit] = length_cells(c.length);
        let mut row = vec![
            c.treatment.clone(),
            length,
            unit,
            c.period.map_or(String::new(), |p| p.to_string()),
            c.metric.to_string(),
        ];
        row.extend(c.summary.cells());
        t.rows.push(row);
    }
    t
}

/// `transactions.csv`: per (treatment, period length, transaction index k within a period),
/// over every period of every replication: how many periods had a k-th trade, that trade's mean
/// price with its 95 % percentile-bootstrap interval, and the mean efficiency the period had
/// realised after its first k trades (a period with fewer trades counts all of its surplus, so
/// the last rows approach the cell's efficiency).
pub fn transactions_table(e: &Experiment, reps: &[Replication], seed: u64) -> Table {
    let mut t = Table {
        header: [
            "treatment",
            "length",
            "unit",
            "transaction",
            "periods",
            "mean_price",
            "price_boot95_low",
            "price_boot95_high",
            "efficiency_after",
        ]
        .map(String::from)
        .to_vec(),
        rows: Vec::new(),
    };
    let max = e.equilibrium().max_surplus as f64;
    for (ti, tr) in e.treatments.iter().enumerate() {
        for length in e.lengths() {
            let periods: Vec<&Period> = reps
                .iter()
                .filter(|r| r.treatment == ti && r.length == length)
                .flat_map(|r| r.periods.iter())
                .collect();
            let most = periods.iter().map(|p| p.prices.len()).max().unwrap_or(0);
            let [l, unit] = length_cells(length);
            for k in 0..most {
                let prices: Vec<f64> = periods
                    .iter()
                    .filter_map(|p| p.prices.get(k).map(|&x| x as f64))
                    .collect();
                let key = stats::key(&format!("{}/{l}{unit}/transaction/{k}", tr.name));
                let s = Summary::of(&prices, seed, key, stats::Bounds::NON_NEGATIVE);
                let after: Vec<f64> = periods
                    .iter()
                    .map(|p| p.gains.iter().take(k + 1).sum::<i64>() as f64 / max)
                    .collect();
                let (eff, _) = stats::mean_sd(&after);
                t.rows.push(vec![
                    tr.name.clone(),
                    l.clone(),
                    unit.clone(),
                    (k + 1).to_string(),
                    prices.len().to_string(),
                    f(s.mean),
                    f(s.boot95.low),
                    f(s.boot95.high),
                    f(eff),
                ]);
            }
        }
    }
    t
}

/// The replication-level summary of `metric` for a treatment and period length.
pub fn find<'a>(
    cells: &'a [CellSummary],
    treatment: &str,
    length: Length,
    metric: &str,
) -> Option<&'a Summary> {
    cells
        .iter()
        .find(|c| {
            c.treatment == treatment
                && c.length == length
                && c.period.is_none()
                && c.metric == metric
        })
        .map(|c| &c.summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"
name = "t"
periods = 2
replications = 3
shouts_per_period = [50, 100]
[[buyer]]
values = [150, 60]
[[buyer]]
values = [120]
[[seller]]
costs = [40, 140]
[[seller]]
costs = [90]
"#;

    #[test]
    fn defaults_and_refusals() {
        let e = Experiment::from_toml(TEXT).unwrap();
        assert_eq!(e.treatments.len(), 2);
        assert_eq!((e.min_price, e.max_price), (1, 200));
        assert_eq!(e.equilibrium().max_surplus, 140);
        for (from, to) in [
            ("replications = 3", "replications = 0"),
            ("periods = 2", "periods = 0"),
            ("shouts_per_period = [50, 100]", "shouts_per_period = []"),
            ("values = [120]", "values = [220]"),
            ("costs = [90]", "costs = []"),
            ("name = \"t\"", "name = \"t\"\ncolour = 1"),
        ] {
            let text = TEXT.replace(from, to);
            assert!(Experiment::from_toml(&text).is_err(), "{to} accepted");
        }
    }

    #[test]
    fn tables_have_a_row_per_unit_of_work_and_are_reproducible() {
        let e = Experiment::from_toml(TEXT).unwrap();
        let a = run(&e, 9).unwrap();
        assert_eq!(a.len(), 2 * 2 * 3);
        assert_eq!(a, run(&e, 9).unwrap());
        assert_ne!(a, run(&e, 10).unwrap());
        assert_eq!(periods_table(&e, &a).rows.len(), 2 * 2 * 3 * 2);
        assert_eq!(replications_table(&e, &a).rows.len(), 12);
        let s = summaries(&e, &a, 9);
        // 2 treatments x 2 lengths x 5 metrics x (1 + 2 periods)
        assert_eq!(s.len(), 60);
        assert_eq!(
            find(&s, "ZI-C", Length::Shouts(100), "efficiency")
                .unwrap()
                .n,
            3
        );
        // Three units trade at most (two buyers' three values): at most three transaction rows
        // per cell, the first in every period that traded.
        let tx = transactions_table(&e, &a, 9);
        assert!(!tx.rows.is_empty() && tx.rows.len() <= 2 * 2 * 3);
        assert!(tx.rows.iter().all(|r| r[3] != "1" || r[4] != "0"));
    }

    #[test]
    fn timed_periods_run_beside_periods_in_shouts_and_keep_their_cells_apart() {
        let timed = TEXT.replace(
            "shouts_per_period = [50, 100]",
            "shouts_per_period = [50, 100]\nseconds_per_period = [30]\nshout_rate = 0.5",
        );
        let e = Experiment::from_toml(&timed).unwrap();
        assert_eq!(e.lengths().len(), 3);
        let a = run(&e, 9).unwrap();
        assert_eq!(a.len(), 2 * 3 * 3);
        // Adding the timed length leaves the cells in shouts as they were.
        let before = run(&Experiment::from_toml(TEXT).unwrap(), 9).unwrap();
        let in_shouts: Vec<_> = a
            .iter()
            .filter(|r| matches!(r.length, Length::Shouts(_)))
            .cloned()
            .collect();
        assert_eq!(in_shouts, before);
        let rows = replications_table(&e, &a).rows;
        assert!(rows.iter().any(|r| r[1] == "30" && r[2] == "seconds"));
        for (from, to) in [
            ("shout_rate = 0.5", "shout_rate = 0"),
            ("shout_rate = 0.5", "shout_rate = nan"),
            ("seconds_per_period = [30]", "seconds_per_period = [0]"),
            ("shout_rate = 0.5", "shout_rate = 1e9"),
        ] {
            assert!(
                Experiment::from_toml(&timed.replace(from, to)).is_err(),
                "{to} accepted"
            );
        }
        let only_timed = timed.replace("shouts_per_period = [50, 100]", "shouts_per_period = []");
        assert_eq!(
            Experiment::from_toml(&only_timed).unwrap().lengths().len(),
            1
        );
        let none = only_timed.replace("seconds_per_period = [30]", "seconds_per_period = []");
        assert!(Experiment::from_toml(&none).is_err());
    }
}
