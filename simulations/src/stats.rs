//! Statistics across replications: mean, standard deviation, Student-t intervals with exact
//! quantiles (`statrs`), medians and quartiles, and percentile-bootstrap intervals.
//!
//! Which interval to read:
//! - `t95`/`t99`: mean +- t_{1-a/2, n-1} * sd / sqrt(n). Exact t quantiles, but symmetric, so
//!   near a bound (efficiency near 1, a rate near 0) they can leave the metric's range.
//! - `boot95`/`boot99`: percentile bootstrap of the mean (resample the n values with
//!   replacement, [`BOOTSTRAP_RESAMPLES`] times; the interval is the a/2 and 1-a/2 quantiles
//!   of the resampled means). Every resampled mean lies between the smallest and the largest
//!   observation, so the interval never leaves a range the observations respect ([0, 1],
//!   non-negative, ...). This is the interval to use for bounded metrics. Its resampling is
//!   seeded, so the same data and seed give the same interval.
//!
//! Quantiles (medians, quartiles, bootstrap percentiles) use linear interpolation between
//! order statistics (Hyndman & Fan type 7, the default of R and NumPy).
//!
//! Every metric has [`Bounds`] (a share in [0, 1], a count or amount >= 0, a surplus on the
//! whole line, an efficiency <= 1): every interval a [`Summary`] gives is clipped to them, so
//! none is ever printed or plotted outside the values the metric can take (clipping does not
//! fix a t interval's coverage: read the bootstrap's, the first columns). Below
//! [`MIN_N_FOR_INTERVAL`] observations there is no interval at all (its cells are empty and
//! [`Summary::note`] says why) rather than a zero-width or meaningless one.

use rand::RngCore;
use statrs::distribution::{Continuous, ContinuousCDF, StudentsT};

use crate::rng::{StreamKind, stream};

/// Bootstrap resamples per interval.
pub const BOOTSTRAP_RESAMPLES: usize = 4000;

/// Fewest observations a [`Summary`] gives intervals for; with fewer, none (and a note).
pub const MIN_N_FOR_INTERVAL: usize = 5;

/// The values a metric can take: what its intervals are clipped to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    /// Lowest value (may be `-inf`).
    pub low: f64,
    /// Highest value (may be `inf`).
    pub high: f64,
}

impl Bounds {
    /// A share or rate: [0, 1].
    pub const UNIT: Self = Self {
        low: 0.0,
        high: 1.0,
    };
    /// A count, an amount, a time: [0, inf).
    pub const NON_NEGATIVE: Self = Self {
        low: 0.0,
        high: f64::INFINITY,
    };
    /// Anything (a surplus, a profit).
    pub const ANY: Self = Self {
        low: f64::NEG_INFINITY,
        high: f64::INFINITY,
    };
    /// An efficiency (realised over the greatest surplus): at most 1, below 0 when trades
    /// lose surplus (zero-intelligence traders without a budget constraint).
    pub const AT_MOST_ONE: Self = Self {
        low: f64::NEG_INFINITY,
        high: 1.0,
    };

    /// The bounds of a metric of the simulator's tables, by its name: shares and rates
    /// (`utilization`, `*_utilization`, `*_rate`, `*_gini`) in [0, 1]; efficiencies at most 1;
    /// surpluses and profits anything; everything else (counts, prices, waits, revenues,
    /// amounts) at least 0.
    pub fn of(metric: &str) -> Self {
        if metric == "utilization"
            || metric.ends_with("_utilization")
            || metric.ends_with("_rate")
            || metric.ends_with("gini")
        {
            Self::UNIT
        } else if metric.contains("efficiency") {
            Self::AT_MOST_ONE
        } else if metric.contains("surplus") || metric.contains("profit") {
            Self::ANY
        } else {
            Self::NON_NEGATIVE
        }
    }

    /// `i` within the bounds (NaN stays NaN).
    pub fn clip(self, i: Interval) -> Interval {
        let c = |x: f64| {
            if x.is_nan() {
                x
            } else {
                x.clamp(self.low, self.high)
            }
        };
        Interval {
            low: c(i.low),
            high: c(i.high),
        }
    }

    /// Whether `x` is a value the metric can take.
    pub fn contains(self, x: f64) -> bool {
        self.low <= x && x <= self.high
    }

    /// As the summary's `bounds` column writes them (no comma: a CSV cell): `0..1`, `>=0`,
    /// `<=1`, `any`.
    pub fn text(self) -> String {
        match (self.low.is_finite(), self.high.is_finite()) {
            (false, false) => "any".into(),
            (true, true) => format!("{}..{}", self.low, self.high),
            (true, false) => format!(">={}", self.low),
            (false, true) => format!("<={}", self.high),
        }
    }
}

/// The `p` quantile of Student's t with `df` degrees of freedom (NaN for df = 0 or p outside
/// (0, 1)).
pub fn t_quantile(p: f64, df: u64) -> f64 {
    if df == 0 || !(p > 0.0 && p < 1.0) {
        return f64::NAN;
    }
    let Ok(t) = StudentsT::new(0.0, 1.0, df as f64) else {
        return f64::NAN;
    };
    // statrs' inverse is exact to ~1e-9 up to df ~ 1e4 but drifts beyond (1.95985 instead of
    // 1.95997 at df = 1e6); a few Newton steps on its (accurate) cdf fix that.
    let mut x = t.inverse_cdf(p);
    for _ in 0..4 {
        let d = t.pdf(x);
        if d.is_nan() || d <= 0.0 {
            break;
        }
        x -= (t.cdf(x) - p) / d;
    }
    x
}

/// The `p` quantile (type 7) of sorted values; NaN when empty.
pub fn quantile_sorted(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    let h = (n - 1) as f64 * p.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(n - 1);
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

/// A two-sided interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    /// Lower end.
    pub low: f64,
    /// Upper end.
    pub high: f64,
}

impl Interval {
    /// Whether the two intervals have no point in common.
    pub fn disjoint(&self, other: &Self) -> bool {
        self.high < other.low || other.high < self.low
    }

    /// Whether `x` lies inside (ends included).
    pub fn contains(&self, x: f64) -> bool {
        self.low <= x && x <= self.high
    }
}

/// Student-t interval of the mean at confidence `level` (e.g. 0.95); both ends equal the mean
/// when n = 1, NaN when n = 0.
pub fn t_interval(xs: &[f64], level: f64) -> Interval {
    let n = xs.len();
    let (mean, sd) = mean_sd(xs);
    if n < 2 {
        return Interval {
            low: mean,
            high: mean,
        };
    }
    let half = t_quantile(0.5 + level / 2.0, n as u64 - 1) * sd / (n as f64).sqrt();
    Interval {
        low: mean - half,
        high: mean + half,
    }
}

/// Percentile-bootstrap interval of the mean at confidence `level`, `resamples` resamples
/// drawn from `rng`.
pub fn bootstrap_interval<R: RngCore>(
    xs: &[f64],
    level: f64,
    resamples: usize,
    rng: &mut R,
) -> Interval {
    let means = bootstrap_means(xs, resamples, rng);
    percentile_interval(&means, level)
}

/// Sorted means of `resamples` resamples (with replacement) of `xs`.
fn bootstrap_means<R: RngCore>(xs: &[f64], resamples: usize, rng: &mut R) -> Vec<f64> {
    let n = xs.len();
    if n == 0 {
        return Vec::new();
    }
    let mut means: Vec<f64> = (0..resamples)
        .map(|_| {
            let s: f64 = (0..n)
                .map(|_| {
                    xs[gridlease_contracts::pricing::uniform_inclusive(rng, 0, n as u64 - 1)
                        as usize]
                })
                .sum();
            s / n as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    means
}

fn percentile_interval(sorted_means: &[f64], level: f64) -> Interval {
    let a = (1.0 - level) / 2.0;
    Interval {
        low: quantile_sorted(sorted_means, a),
        high: quantile_sorted(sorted_means, 1.0 - a),
    }
}

/// Mean and sample standard deviation (0 for n = 1; NaN mean for n = 0).
pub fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    let sd = if n > 1 {
        (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    (mean, sd)
}

/// Everything reported about one metric across replications.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Observations.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation.
    pub sd: f64,
    /// Minimum.
    pub min: f64,
    /// First quartile.
    pub q1: f64,
    /// Median.
    pub median: f64,
    /// Third quartile.
    pub q3: f64,
    /// Maximum.
    pub max: f64,
    /// Student-t 95 % interval of the mean.
    pub t95: Interval,
    /// Student-t 99 % interval of the mean.
    pub t99: Interval,
    /// Percentile-bootstrap 95 % interval of the mean.
    pub boot95: Interval,
    /// Percentile-bootstrap 99 % interval of the mean.
    pub boot99: Interval,
    /// The metric's bounds (every interval is clipped to them).
    pub bounds: Bounds,
    /// Why there is no interval, when there is none (`n < 5`).
    pub note: &'static str,
}

impl Summary {
    /// Summarises `xs` (NaN entries are dropped) of a metric within `bounds`; the bootstrap
    /// draws from a stream derived from `seed` and `key` (e.g. a hash of the metric's name and
    /// group), so the result is a function of the data, the seed and the key only. Intervals
    /// are clipped to `bounds`; with fewer than [`MIN_N_FOR_INTERVAL`] values they are NaN
    /// (no interval) and `note` says so.
    pub fn of(xs: &[f64], seed: u64, key: u64, bounds: Bounds) -> Self {
        let xs: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
        let mut sorted = xs.clone();
        sorted.sort_by(f64::total_cmp);
        let (mean, sd) = mean_sd(&xs);
        let few = xs.len() < MIN_N_FOR_INTERVAL;
        let means = if few {
            Vec::new()
        } else {
            let mut rng = stream(seed, key, StreamKind::Statistics, 0);
            bootstrap_means(&xs, BOOTSTRAP_RESAMPLES, &mut rng)
        };
        let none = Interval {
            low: f64::NAN,
            high: f64::NAN,
        };
        let ci = |i: Interval| if few { none } else { bounds.clip(i) };
        Self {
            n: xs.len(),
            mean,
            sd,
            min: sorted.first().copied().unwrap_or(f64::NAN),
            q1: quantile_sorted(&sorted, 0.25),
            median: quantile_sorted(&sorted, 0.5),
            q3: quantile_sorted(&sorted, 0.75),
            max: sorted.last().copied().unwrap_or(f64::NAN),
            t95: ci(t_interval(&xs, 0.95)),
            t99: ci(t_interval(&xs, 0.99)),
            boot95: ci(percentile_interval(&means, 0.95)),
            boot99: ci(percentile_interval(&means, 0.99)),
            bounds,
            note: if few {
                "fewer than 5 replications: no interval"
            } else {
                ""
            },
        }
    }

    /// Whether it has intervals (at least [`MIN_N_FOR_INTERVAL`] values).
    pub fn has_interval(&self) -> bool {
        self.note.is_empty()
    }

    /// Column names of [`Summary::cells`]: the recommended interval (the bootstrap's) first.
    pub const COLUMNS: [&'static str; 18] = [
        "n",
        "mean",
        "sd",
        "min",
        "q1",
        "median",
        "q3",
        "max",
        "boot95_low",
        "boot95_high",
        "boot99_low",
        "boot99_high",
        "t95_low",
        "t95_high",
        "t99_low",
        "t99_high",
        "bounds",
        "note",
    ];

    /// The values in [`Summary::COLUMNS`] order, as text with 6 decimals (empty for NaN).
    pub fn cells(&self) -> Vec<String> {
        let f = |x: f64| {
            if x.is_nan() {
                String::new()
            } else {
                format!("{x:.6}")
            }
        };
        let mut v = vec![self.n.to_string()];
        for x in [
            self.mean,
            self.sd,
            self.min,
            self.q1,
            self.median,
            self.q3,
            self.max,
            self.boot95.low,
            self.boot95.high,
            self.boot99.low,
            self.boot99.high,
            self.t95.low,
            self.t95.high,
            self.t99.low,
            self.t99.high,
        ] {
            v.push(f(x));
        }
        v.push(self.bounds.text());
        v.push(self.note.to_string());
        v
    }
}

/// A stable 64-bit key of a text (FNV-1a), for [`Summary::of`]'s bootstrap stream.
pub fn key(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::unit_open;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn t_quantiles_match_published_tables() {
        // Two-sided 95 % and 99 % critical values (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.2).
        for (p, df, want) in [
            (0.975, 1, 12.706205),
            (0.975, 2, 4.302653),
            (0.975, 10, 2.228139),
            (0.975, 29, 2.045230),
            (0.975, 30, 2.042272),
            (0.975, 40, 2.021075),
            (0.975, 60, 2.000298),
            (0.975, 120, 1.979930),
            (0.995, 10, 3.169273),
            (0.995, 29, 2.756386),
            (0.995, 100, 2.625891),
        ] {
            let got = t_quantile(p, df);
            assert!(close(got, want, 1e-5), "t_({p}, {df}) = {got}, want {want}");
        }
        // Large df approaches the normal quantile.
        let big = t_quantile(0.975, 1_000_000);
        assert!(close(big, 1.959966, 1e-5), "{big}");
        assert!(t_quantile(0.975, 0).is_nan());
    }

    #[test]
    fn quartiles_interpolate_linearly() {
        let s = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile_sorted(&s, 0.5), 2.5);
        assert_eq!(quantile_sorted(&s, 0.25), 1.75);
        assert_eq!(quantile_sorted(&s, 0.75), 3.25);
        assert_eq!(quantile_sorted(&s, 0.0), 1.0);
        assert_eq!(quantile_sorted(&s, 1.0), 4.0);
        let m = Summary::of(&[3.0, 1.0, 2.0], 1, 0, Bounds::ANY);
        assert_eq!((m.min, m.median, m.max), (1.0, 2.0, 3.0));
        // mean 2, sd 1, n 3: half width t_{0.975,2} / sqrt(3)
        let t = t_interval(&[1.0, 2.0, 3.0], 0.95);
        assert!(close(t.high - 2.0, 4.302653 / 3f64.sqrt(), 1e-5));
        // Three values: no interval in the summary, and a note saying why.
        assert!(m.t95.low.is_nan() && m.boot95.high.is_nan() && !m.has_interval());
        assert!(m.note.contains("fewer than 5"), "{}", m.note);
        let cells = m.cells();
        assert_eq!(cells.len(), Summary::COLUMNS.len());
        assert_eq!(cells[8], "", "boot95_low empty");
    }

    /// Coverage of the bootstrap 95 % interval on a known distribution: Uniform(0, 1)^4
    /// (skewed, mean 1/5, in [0, 1]), n = 30, 400 samples, deterministic seed. The percentile
    /// bootstrap under-covers a little at small n; the tolerance allows 0.91..=0.98.
    #[test]
    fn bootstrap_covers_the_true_mean_and_respects_bounds() {
        let mut data_rng = stream(42, 0, StreamKind::Statistics, 1);
        let mut boot_rng = stream(42, 0, StreamKind::Statistics, 2);
        let (trials, n, truth) = (400, 30, 0.2);
        let mut covered = 0;
        for _ in 0..trials {
            let xs: Vec<f64> = (0..n).map(|_| unit_open(&mut data_rng).powi(4)).collect();
            let ci = bootstrap_interval(&xs, 0.95, 1000, &mut boot_rng);
            if ci.contains(truth) {
                covered += 1;
            }
        }
        let coverage = f64::from(covered) / f64::from(trials);
        assert!((0.91..=0.98).contains(&coverage), "coverage {coverage}");

        // Near the bound 1: the t interval leaves [0, 1], the bootstrap interval does not.
        let xs = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.6];
        assert!(t_interval(&xs, 0.99).high > 1.0);
        let s = Summary::of(&xs, 1, 7, Bounds::UNIT);
        assert!(s.t99.high <= 1.0, "clipped t99 {:?}", s.t99);
        assert!(
            s.boot99.high <= 1.0 && s.boot99.low >= 0.6,
            "boot99 {:?}",
            s.boot99
        );
        assert!(s.boot99.low < s.mean);
    }

    #[test]
    fn summary_is_a_function_of_data_seed_and_key() {
        let xs: Vec<f64> = (0..20).map(|i| f64::from(i % 7)).collect();
        let any = Bounds::ANY;
        assert_eq!(
            Summary::of(&xs, 3, key("a"), any),
            Summary::of(&xs, 3, key("a"), any)
        );
        assert_ne!(
            Summary::of(&xs, 3, key("a"), any).boot95,
            Summary::of(&xs, 3, key("b"), any).boot95
        );
    }

    #[test]
    fn metrics_have_the_bounds_their_names_say() {
        for m in [
            "utilization",
            "honest_utilization",
            "abandonment_rate",
            "revenue_gini",
        ] {
            assert_eq!(Bounds::of(m), Bounds::UNIT, "{m}");
        }
        for m in [
            "jobs",
            "leases",
            "mean_wait_s",
            "honest_revenue",
            "volume",
            "mean_price",
        ] {
            assert_eq!(Bounds::of(m), Bounds::NON_NEGATIVE, "{m}");
        }
        for m in ["renter_surplus", "honest_renter_surplus", "attacker_profit"] {
            assert_eq!(Bounds::of(m), Bounds::ANY, "{m}");
        }
        assert_eq!(Bounds::of("efficiency"), Bounds::AT_MOST_ONE);
        assert_eq!(Bounds::UNIT.text(), "0..1");
        assert_eq!(Bounds::NON_NEGATIVE.text(), ">=0");
        assert_eq!(Bounds::AT_MOST_ONE.text(), "<=1");
        assert_eq!(Bounds::ANY.text(), "any");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// Whatever the sample (any size, values anywhere in the metric's range, piled up at
        /// a bound or spread), no interval a summary gives crosses the metric's bounds, and
        /// below 5 values there is none.
        #[test]
        fn no_interval_crosses_its_metrics_bounds(
            kind in 0usize..4,
            raw in proptest::collection::vec((0u8..4, 0.0f64..1.0), 0..40),
            seed in proptest::prelude::any::<u64>(),
        ) {
            let bounds = [Bounds::UNIT, Bounds::NON_NEGATIVE, Bounds::AT_MOST_ONE, Bounds::ANY][kind];
            // Values at the bounds, near them, and far inside.
            let xs: Vec<f64> = raw
                .iter()
                .map(|&(how, u)| {
                    let (lo, hi) = (bounds.low.max(-1e6), bounds.high.min(1e6));
                    match how {
                        0 => lo,
                        1 => hi,
                        2 => lo + (hi - lo) * u * 1e-3,
                        _ => lo + (hi - lo) * u,
                    }
                })
                .collect();
            let s = Summary::of(&xs, seed, 1, bounds);
            for i in [s.t95, s.t99, s.boot95, s.boot99] {
                if xs.len() < MIN_N_FOR_INTERVAL {
                    proptest::prop_assert!(i.low.is_nan() && i.high.is_nan());
                } else {
                    proptest::prop_assert!(bounds.contains(i.low) && bounds.contains(i.high), "{i:?} outside {bounds:?} for {xs:?}");
                    proptest::prop_assert!(i.low <= i.high);
                }
            }
            proptest::prop_assert_eq!(s.has_interval(), xs.len() >= MIN_N_FOR_INTERVAL);
        }
    }
}
