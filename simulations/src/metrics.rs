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

/// The two provider populations every per-population metric is split into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Population {
    /// Providers with `attack = "none"`.
    Honest = 0,
    /// Providers with an attack (`usage_inflation`, `no_show`, `false_class`, self-dealing),
    /// whatever identity they use.
    Attacker = 1,
}

impl Population {
    /// Both, in column order.
    pub const ALL: [Population; 2] = [Population::Honest, Population::Attacker];

    /// The column prefix (`honest`, `attacker`).
    pub fn name(self) -> &'static str {
        match self {
            Population::Honest => "honest",
            Population::Attacker => "attacker",
        }
    }

    /// The population of a provider.
    pub fn of(attacker: bool) -> Self {
        if attacker {
            Population::Attacker
        } else {
            Population::Honest
        }
    }
}

/// What one provider population did in one bucket (leases counted where they start, money
/// where they end).
#[derive(Clone, Debug, Default)]
pub struct PopBucket {
    /// Per class: sum of price x GPUs of leases started, micro-units per hour.
    pub price_gpu_sum: Vec<u128>,
    /// Per class: GPUs leased by leases started.
    pub price_gpus: Vec<u64>,
    /// Leases started.
    pub leases: u64,
    /// GPU-ms leased (busy), integrated over time.
    pub busy_gpu_ms: u128,
    /// GPU-ms online, integrated over time.
    pub online_gpu_ms: u128,
    /// Leases that ended.
    pub ended: u64,
    /// Leases that ended in failure (crash, renter stopped paying, usage refused).
    pub failed: u64,
    /// GPU-ms of real use of leases that ended.
    pub used_gpu_ms: u128,
    /// Money paid to the population's providers for leases that ended, micro-units.
    pub revenue: u64,
    /// Renter surplus (valuation of real use - paid) of those leases, micro-units.
    pub surplus: i128,
    /// Real use left unpaid at the close of failed leases, micro-units: for honest providers
    /// their loss (money at risk); for attackers mostly the usage renters refused to pay after
    /// catching an inflated report (not a loss of anyone honest).
    pub unpaid: u64,
    /// What renters paid for the population's leases that ended in failure, micro-units
    /// (reported with network reputation only).
    pub failed_paid: u64,
}

/// Accumulators of one time bucket.
#[derive(Clone, Debug, Default)]
pub struct Bucket {
    /// New jobs that arrived (first submissions; resubmissions are not jobs).
    pub jobs: u64,
    /// Resubmissions: the rest of a job submitted again after its lease failed (crash) or was
    /// refused (inflated usage).
    pub resubmissions: u64,
    /// Jobs whose first submission got a lease.
    pub jobs_matched: u64,
    /// Resubmissions that got a lease.
    pub resubmissions_matched: u64,
    /// Jobs whose first submission ran out of patience (they never got a lease).
    pub jobs_abandoned: u64,
    /// Resubmissions that ran out of patience (the job's rest never ran).
    pub resubmissions_abandoned: u64,
    /// Sum of submission-to-lease waits of `jobs_matched`, ms.
    pub wait_sum_ms: u64,
    /// Sum of waits of `resubmissions_matched`, ms.
    pub resubmission_wait_sum_ms: u64,
    /// Waiting submissions (jobs and resubmissions) at the end of the bucket.
    pub queue_len: u64,
    /// Honest and attacker providers, indexed by [`Population`].
    pub pop: [PopBucket; 2],
    /// Attackers' gain over honest billing of their real use, micro-units (can be negative).
    pub attacker_profit: i128,
    /// Inflated usage reports refused by renters.
    pub caught: u64,
    /// Network reputation only: mean network score of each population's providers (current
    /// identities) at the bucket's end, as renters last saw it.
    pub score: [f64; 2],
    /// Network reputation only: the same mean per provider group (scenario order).
    pub group_score: Vec<f64>,
    /// Network reputation only: records self-dealing providers fabricated.
    pub self_dealt: u64,
    /// No-show attackers' leases that ended (the renter gave up waiting for the start).
    pub no_shows: u64,
    /// Renter time spent waiting for those starts, ms.
    pub no_show_lost_ms: u64,
    /// False-class leases the renter detected at start (failed as the provider's fault).
    pub false_class_detected: u64,
    /// Renter time spent on those start benchmarks, ms.
    pub false_class_lost_ms: u64,
    /// False-class leases that ended undetected.
    pub false_class_undetected: u64,
    /// What renters of undetected false-class leases valued but did not get (their valuation
    /// of the advertised class's throughput minus that of the delivered class), micro-units.
    pub false_class_shortfall: u64,
    /// The period's welfare: realised, the most it could have been, and the losses
    /// ([`crate::welfare`]).
    pub welfare: crate::welfare::Welfare,
}

impl Bucket {
    /// An empty bucket for `classes` GPU classes.
    pub fn new(classes: usize) -> Self {
        let pop = || PopBucket {
            price_gpu_sum: vec![0; classes],
            price_gpus: vec![0; classes],
            ..PopBucket::default()
        };
        Self {
            pop: [pop(), pop()],
            ..Self::default()
        }
    }

    /// All leases started in the bucket (both populations).
    pub fn leases(&self) -> u64 {
        self.pop[0].leases + self.pop[1].leases
    }

    /// Adds `other`'s counts to this one (run totals); `queue_len` takes `other`'s, the later
    /// bucket's.
    pub fn absorb(&mut self, other: &Bucket) {
        self.jobs += other.jobs;
        self.resubmissions += other.resubmissions;
        self.jobs_matched += other.jobs_matched;
        self.resubmissions_matched += other.resubmissions_matched;
        self.jobs_abandoned += other.jobs_abandoned;
        self.resubmissions_abandoned += other.resubmissions_abandoned;
        self.wait_sum_ms += other.wait_sum_ms;
        self.resubmission_wait_sum_ms += other.resubmission_wait_sum_ms;
        self.queue_len = other.queue_len;
        self.welfare.absorb(&other.welfare);
        for (a, b) in self.pop.iter_mut().zip(&other.pop) {
            for (x, y) in a.price_gpu_sum.iter_mut().zip(&b.price_gpu_sum) {
                *x += y;
            }
            for (x, y) in a.price_gpus.iter_mut().zip(&b.price_gpus) {
                *x += y;
            }
            a.leases += b.leases;
            a.busy_gpu_ms += b.busy_gpu_ms;
            a.online_gpu_ms += b.online_gpu_ms;
            a.ended += b.ended;
            a.failed += b.failed;
            a.used_gpu_ms += b.used_gpu_ms;
            a.revenue += b.revenue;
            a.surplus += b.surplus;
            a.unpaid += b.unpaid;
            a.failed_paid += b.failed_paid;
        }
        self.attacker_profit += other.attacker_profit;
        self.caught += other.caught;
        self.score = other.score;
        self.group_score.clone_from(&other.group_score);
        self.self_dealt += other.self_dealt;
        self.no_shows += other.no_shows;
        self.no_show_lost_ms += other.no_show_lost_ms;
        self.false_class_detected += other.false_class_detected;
        self.false_class_lost_ms += other.false_class_lost_ms;
        self.false_class_undetected += other.false_class_undetected;
        self.false_class_shortfall += other.false_class_shortfall;
    }
}

/// What one provider did over a run (`providers.csv`).
#[derive(Clone, Debug, Default)]
pub struct ProviderStats {
    /// Leases started.
    pub leases: u64,
    /// Leases that ended.
    pub ended: u64,
    /// Ended leases that failed.
    pub failed: u64,
    /// GPU-ms of real use of ended leases.
    pub used_gpu_ms: u128,
    /// GPU-ms leased (busy), integrated to the horizon.
    pub busy_gpu_ms: u128,
    /// Ms online and not crashed, integrated to the horizon.
    pub online_ms: u64,
    /// Since when it is online (valid while online).
    pub online_since: u64,
    /// Real use left unpaid at the close of its failed leases, micro-units.
    pub unpaid: u64,
    /// Identities used (1 + rejoins under a fresh identity).
    pub identities: u64,
}

/// What one renter did over a run (`renters.csv`).
#[derive(Clone, Debug, Default)]
pub struct RenterStats {
    /// Jobs that arrived.
    pub jobs: u64,
    /// Jobs whose first submission got a lease.
    pub jobs_matched: u64,
    /// Jobs whose first submission ran out of patience.
    pub jobs_abandoned: u64,
    /// Resubmissions made.
    pub resubmissions: u64,
    /// Leases started (all submissions).
    pub leases: u64,
    /// Sum of waits of `jobs_matched`, ms.
    pub wait_sum_ms: u64,
    /// Paid for ended leases, micro-units.
    pub paid: u64,
    /// Valuation of real use minus paid, ended leases, micro-units.
    pub surplus: i128,
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
