//! What a run measures: per time bucket and per run. All values are deterministic functions
//! of the event sequence (no wall-clock time in here).

use serde::Serialize;

/// Upper edges of the wait-time histogram bins, seconds (the last bin is open).
pub const WAIT_BINS_S: [u64; 16] = [
    0, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800,
];

/// A wait-time histogram (bin `i` counts waits <= `WAIT_BINS_S[i]` s and above the previous
/// edge; one extra bin for longer waits).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WaitHistogram {
    /// Counts per bin; `WAIT_BINS_S.len() + 1` entries.
    pub counts: Vec<u64>,
}

impl WaitHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self {
            counts: vec![0; WAIT_BINS_S.len() + 1],
        }
    }

    /// Adds one wait.
    pub fn add(&mut self, wait_ms: u64) {
        let s = wait_ms.div_ceil(1000);
        let i = WAIT_BINS_S
            .iter()
            .position(|&edge| s <= edge)
            .unwrap_or(WAIT_BINS_S.len());
        self.counts[i] += 1;
    }

    /// The upper edge (seconds) of the bin holding quantile `q`; the open bin reports twice the
    /// last edge.
    pub fn quantile_s(&self, q: f64) -> f64 {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let target = (q * total as f64).ceil().max(1.0) as u64;
        let mut acc = 0;
        for (i, c) in self.counts.iter().enumerate() {
            acc += c;
            if acc >= target {
                return WAIT_BINS_S
                    .get(i)
                    .map_or(2.0 * WAIT_BINS_S[WAIT_BINS_S.len() - 1] as f64, |&e| {
                        e as f64
                    });
            }
        }
        0.0
    }
}

/// Accumulators of one time bucket.
#[derive(Clone, Debug, Default)]
pub struct Bucket {
    /// Jobs that arrived.
    pub arrivals: u64,
    /// Jobs that got a lease.
    pub matched: u64,
    /// Jobs abandoned (patience ran out).
    pub abandoned: u64,
    /// Sum of waits of matched jobs, ms.
    pub wait_sum_ms: u64,
    /// Per class: sum of price x GPUs of leases started, micro-units per hour.
    pub price_gpu_sum: Vec<u128>,
    /// Per class: GPUs leased by leases started.
    pub price_gpus: Vec<u64>,
    /// GPU-ms leased.
    pub busy_gpu_ms: u128,
    /// GPU-ms online.
    pub online_gpu_ms: u128,
    /// Waiting jobs at the end of the bucket.
    pub queue_len: u64,
    /// Money booked by providers from leases that ended, micro-units.
    pub revenue: u64,
    /// Renter surplus (valuation of usage - paid) of leases that ended, micro-units.
    pub surplus: i128,
    /// Leases that ended in failure (crash, renter stopped paying, fraud).
    pub failed: u64,
    /// Leases that ended.
    pub ended: u64,
    /// Unpaid usage at close of failed leases, micro-units.
    pub at_risk: u64,
    /// Attackers' gain over honest billing, micro-units (can be negative).
    pub attacker_profit: i128,
    /// Inflated usage reports refused by renters.
    pub caught: u64,
}

impl Bucket {
    /// An empty bucket for `classes` GPU classes.
    pub fn new(classes: usize) -> Self {
        Self {
            price_gpu_sum: vec![0; classes],
            price_gpus: vec![0; classes],
            ..Self::default()
        }
    }
}

/// Gini coefficient of non-negative values (0 = equal, ~1 = one takes all).
pub fn gini(values: &[u64]) -> f64 {
    let mut v: Vec<u64> = values.to_vec();
    v.sort_unstable();
    let n = v.len() as f64;
    let total: f64 = v.iter().map(|&x| x as f64).sum();
    if v.is_empty() || total == 0.0 {
        return 0.0;
    }
    let weighted: f64 = v
        .iter()
        .enumerate()
        .map(|(i, &x)| (i as f64 + 1.0) * x as f64)
        .sum();
    (2.0 * weighted) / (n * total) - (n + 1.0) / n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gini_extremes() {
        assert_eq!(gini(&[5, 5, 5, 5]), 0.0);
        assert!((gini(&[0, 0, 0, 10]) - 0.75).abs() < 1e-12);
        assert_eq!(gini(&[]), 0.0);
    }

    #[test]
    fn histogram_quantiles() {
        let mut h = WaitHistogram::new();
        for ms in [0, 500, 1500, 59_000, 10_000_000_000] {
            h.add(ms);
        }
        assert_eq!(h.counts[0], 1);
        assert_eq!(h.quantile_s(0.5), 2.0);
        assert_eq!(h.quantile_s(1.0), 57_600.0);
    }
}
