//! Welfare of a market run, per period (time bucket): the surplus the market realised, the most
//! the period's supply and demand could have realised, and why the difference was lost.
//!
//! The benchmark is the period's pooled GPU-time market, a relaxation of everything the real
//! market must respect. Supply: each provider group's GPU time online in the period, at the
//! group's cost floor per GPU-hour (its marginal cost). Demand: each job present in the period
//! (waiting, or holding its lease) may use up to `gpus x min(time present in the period, its
//! duration)` of GPU time at its valuation per GPU-hour. GPU time is divisible, any job may use
//! any class, and any GPU time of the period counts whenever it falls. The most surplus of that
//! market ([`close`]: values sorted down against costs sorted up) is an upper bound on what any
//! allocation of the period could realise: exact where those relaxations do not bind (one
//! class, one-GPU jobs, steady supply), above it otherwise. Efficiency is realised / maximum.
//!
//! With a clearing price `p` of the benchmark, the maximum splits into what was realised and
//! five losses, each at least 0 (the identity `max = realised + lost` holds exactly, whatever
//! `p` in the clearing range; Gode and Sunder's decomposition by traders' marginality):
//! - `unserved`: demand worth more than `p` that did not run (`(v - p) x (q* - used)`);
//! - `extramarginal_demand`: demand worth less than `p` that ran (`(p - v) x used`);
//! - `idle_supply`: supply cheaper than `p` left idle (`(p - c) x (online - sold)`);
//! - `extramarginal_supply`: supply dearer than `p` that was sold (`(c - p) x sold`);
//! - `delivery`: value the renter did not get from GPU time it paid for (a false class
//!   delivers part of the throughput: `v x (1 - delivered) x used`).
//!
//! Realised surplus = value of the GPU time used (times the share delivered) minus its cost;
//! it splits into the renters' part (value - payments) and the providers' (payments - cost).
//! Payments are transfers: they move surplus between the two, never create it.

use serde::Serialize;

/// Milliseconds in an hour: prices are per GPU-hour, quantities GPU-milliseconds.
const HOUR_MS: f64 = 3_600_000.0;

/// One job's demand in one period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    /// Valuation, micro-units per GPU-hour.
    pub value: u64,
    /// The most GPU time it could have used in the period, GPU-ms.
    pub cap_ms: u64,
    /// GPU time it used (its lease's real use in the period), GPU-ms; at most `cap_ms`.
    pub used_ms: u64,
    /// The share of the throughput it paid for that it got, permille.
    pub delivered_permille: u32,
}

/// One period's accounts, filled as the run goes and closed when the period ends.
#[derive(Clone, Debug, Default)]
pub struct Account {
    /// Every job present in the period, once.
    pub demand: Vec<Demand>,
    /// Per provider group: GPU time online (available), GPU-ms.
    pub online_ms: Vec<u64>,
    /// Per provider group: GPU time sold (real use of its leases), GPU-ms.
    pub sold_ms: Vec<u64>,
    /// Renters' surplus (value - payments) of the period's use, micro-units.
    pub renter: f64,
    /// Providers' surplus (payments - cost) of the period's use, micro-units.
    pub provider: f64,
}

impl Account {
    /// Empty accounts for `groups` provider groups.
    pub fn new(groups: usize) -> Self {
        Self {
            online_ms: vec![0; groups],
            sold_ms: vec![0; groups],
            ..Self::default()
        }
    }
}

/// A period's welfare (or a run's: the sum of its periods'), micro-units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Welfare {
    /// The benchmark's surplus: the most the period's supply and demand could realise.
    pub max: f64,
    /// Surplus realised.
    pub realised: f64,
    /// Renters' part of it.
    pub renter: f64,
    /// Providers' part of it.
    pub provider: f64,
    /// Demand worth more than the clearing price that did not run.
    pub unserved: f64,
    /// Demand worth less than the clearing price that ran.
    pub extramarginal_demand: f64,
    /// Supply cheaper than the clearing price left idle.
    pub idle_supply: f64,
    /// Supply dearer than the clearing price that was sold.
    pub extramarginal_supply: f64,
    /// Value not delivered (false class).
    pub delivery: f64,
}

impl Welfare {
    /// All five losses.
    pub fn lost(&self) -> f64 {
        self.losses().iter().map(|(_, x)| x).sum()
    }

    /// The five losses by name.
    pub fn losses(&self) -> [(&'static str, f64); 5] {
        [
            ("unserved", self.unserved),
            ("extramarginal_demand", self.extramarginal_demand),
            ("idle_supply", self.idle_supply),
            ("extramarginal_supply", self.extramarginal_supply),
            ("delivery", self.delivery),
        ]
    }

    /// Realised / maximum; `None` when nothing could be gained.
    pub fn efficiency(&self) -> Option<f64> {
        (self.max > 0.0).then(|| self.realised / self.max)
    }

    /// Adds `o` (a later period) to this sum.
    pub fn absorb(&mut self, o: &Welfare) {
        self.max += o.max;
        self.realised += o.realised;
        self.renter += o.renter;
        self.provider += o.provider;
        self.unserved += o.unserved;
        self.extramarginal_demand += o.extramarginal_demand;
        self.idle_supply += o.idle_supply;
        self.extramarginal_supply += o.extramarginal_supply;
        self.delivery += o.delivery;
    }
}

/// Closes a period: the benchmark's maximum and clearing price, the realised surplus and the
/// losses. `costs[g]` is group g's cost, micro-units per GPU-hour. Empties `acc.demand`.
pub fn close(acc: &mut Account, costs: &[u64]) -> Welfare {
    let mut demand = std::mem::take(&mut acc.demand);
    // Values down, then caps down: a deterministic order.
    demand.sort_unstable_by(|a, b| b.value.cmp(&a.value).then(b.cap_ms.cmp(&a.cap_ms)));
    let mut supply: Vec<(u64, usize)> = (0..costs.len().min(acc.online_ms.len()))
        .filter(|&g| acc.online_ms[g] > 0)
        .map(|g| (costs[g], g))
        .collect();
    supply.sort_unstable();
    // Greedy: the most valuable demand against the cheapest supply while value > cost.
    let mut served = vec![0u64; demand.len()];
    let mut supplied = vec![0u64; costs.len()];
    let mut max: u128 = 0;
    let (mut i, mut k) = (0usize, 0usize);
    let (mut left_d, mut left_s) = (
        demand.first().map_or(0, |d| d.cap_ms),
        supply.first().map_or(0, |&(_, g)| acc.online_ms[g]),
    );
    while i < demand.len() && k < supply.len() && demand[i].value > supply[k].0 {
        let q = left_d.min(left_s);
        let g = supply[k].1;
        max += u128::from(demand[i].value - supply[k].0) * u128::from(q);
        served[i] += q;
        supplied[g] += q;
        left_d -= q;
        left_s -= q;
        if left_d == 0 {
            i += 1;
            left_d = demand.get(i).map_or(0, |d| d.cap_ms);
        }
        if left_s == 0 {
            k += 1;
            left_s = supply.get(k).map_or(0, |&(_, g)| acc.online_ms[g]);
        }
    }
    // A clearing price: at least the last cost sold and the first value unserved, at most the
    // last value served and the first cost unsold.
    let last_value = (0..demand.len())
        .rev()
        .find(|&j| served[j] > 0)
        .map(|j| demand[j].value);
    let next_value = demand.get(i).map(|d| d.value);
    let last_cost = supply
        .iter()
        .rev()
        .find(|&&(_, g)| supplied[g] > 0)
        .map(|s| s.0);
    let next_cost = supply.get(k).map(|s| s.0);
    let low = last_cost.into_iter().chain(next_value).max().unwrap_or(0) as f64;
    let high = last_value
        .into_iter()
        .chain(next_cost)
        .min()
        .map(|x| x as f64);
    let p = match high {
        Some(h) if h >= low => (low + h) / 2.0,
        _ => low,
    };
    let mut w = Welfare {
        max: max as f64 / HOUR_MS,
        renter: acc.renter,
        provider: acc.provider,
        ..Welfare::default()
    };
    for (d, &q) in demand.iter().zip(&served) {
        let v = d.value as f64;
        let used = d.used_ms as f64;
        let delivered = f64::from(d.delivered_permille.min(1000)) / 1000.0;
        w.realised += v * delivered * used / HOUR_MS;
        w.delivery += v * (1.0 - delivered) * used / HOUR_MS;
        let term = (v - p) * (q as f64 - used) / HOUR_MS;
        if v >= p {
            w.unserved += term;
        } else {
            w.extramarginal_demand += term;
        }
    }
    for (g, &c) in costs.iter().enumerate() {
        let sold = acc.sold_ms.get(g).copied().unwrap_or(0) as f64;
        let c = c as f64;
        w.realised -= c * sold / HOUR_MS;
        let s = supplied[g] as f64;
        // Every unit online is offered: q* is what the benchmark sold of it.
        let term = (p - c) * (s - sold) / HOUR_MS;
        if c <= p {
            w.idle_supply += term;
        } else {
            w.extramarginal_supply += term;
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(value: u64, cap_h: u64, used_h: u64) -> Demand {
        Demand {
            value,
            cap_ms: cap_h * 3_600_000,
            used_ms: used_h * 3_600_000,
            delivered_permille: 1000,
        }
    }

    fn acc(demand: Vec<Demand>, online_h: &[u64], sold_h: &[u64]) -> Account {
        Account {
            demand,
            online_ms: online_h.iter().map(|h| h * 3_600_000).collect(),
            sold_ms: sold_h.iter().map(|h| h * 3_600_000).collect(),
            renter: 0.0,
            provider: 0.0,
        }
    }

    fn identity(w: &Welfare) {
        assert!(
            (w.realised + w.lost() - w.max).abs() < 1e-6 * w.max.max(1.0),
            "{w:?}"
        );
        for (_, x) in w.losses() {
            assert!(x >= -1e-9, "{w:?}");
        }
    }

    /// Values 10, 8, 3 (1 h each) against 2 h at cost 2 and 2 h at cost 5: the benchmark sells
    /// 10 and 8 at cost 2 (max 14); 3 is worth less than 5.
    #[test]
    fn the_benchmark_and_an_efficient_allocation() {
        let mut a = acc(vec![d(10, 1, 1), d(8, 1, 1), d(3, 1, 0)], &[2, 2], &[2, 0]);
        let w = close(&mut a, &[2, 5]);
        assert_eq!(w.max, 14.0);
        assert_eq!(w.realised, 14.0);
        assert_eq!(w.efficiency(), Some(1.0));
        identity(&w);
        assert!(a.demand.is_empty());
    }

    /// The same market, badly allocated: 8 waits, 3 runs on the dear supply.
    #[test]
    fn losses_name_what_went_wrong() {
        let mut a = acc(vec![d(10, 1, 1), d(8, 1, 0), d(3, 1, 1)], &[2, 2], &[1, 1]);
        let w = close(&mut a, &[2, 5]);
        // realised: 10 + 3 - 2 - 5 = 6; max 14; lost 8.
        assert_eq!((w.max, w.realised), (14.0, 6.0));
        identity(&w);
        // The clearing range is [3, 5] (first unserved value 3, first unsold cost 5 -- and
        // last sold cost 2, last served value 8): p = 4.
        assert_eq!(w.unserved, 8.0 - 4.0); // 8 did not run
        assert_eq!(w.extramarginal_demand, 4.0 - 3.0); // 3 ran
        assert_eq!(w.idle_supply, 4.0 - 2.0); // one cheap hour idle
        assert_eq!(w.extramarginal_supply, 5.0 - 4.0); // one dear hour sold
        assert_eq!(w.delivery, 0.0);
    }

    /// A false class: the renter paid for the hour and got 60 % of its throughput.
    #[test]
    fn undelivered_value_is_its_own_loss() {
        let mut demand = d(10, 1, 1);
        demand.delivered_permille = 600;
        let mut a = acc(vec![demand], &[1], &[1]);
        let w = close(&mut a, &[2]);
        assert_eq!(w.max, 8.0);
        assert!((w.realised - 4.0).abs() < 1e-12);
        assert!((w.delivery - 4.0).abs() < 1e-12);
        identity(&w);
    }

    /// Nothing can trade (values below costs), or nothing is there: max 0, no efficiency.
    #[test]
    fn empty_and_untradeable_periods() {
        let mut a = acc(vec![d(1, 1, 0)], &[1], &[0]);
        let w = close(&mut a, &[2]);
        assert_eq!(w.max, 0.0);
        assert_eq!(w.efficiency(), None);
        identity(&w);
        let w = close(&mut Account::new(3), &[1, 2, 3]);
        assert_eq!(w, Welfare::default());
    }

    /// Random markets and allocations within the caps: the identity and the signs hold.
    #[test]
    fn the_identity_holds_for_any_feasible_allocation() {
        use proptest::prelude::*;
        let mut runner = proptest::test_runner::TestRunner::default();
        let item = (1u64..2_000_000, 1u64..100_000, 0u64..=1000, 0u32..=1000);
        runner
            .run(
                &(
                    proptest::collection::vec(item, 0..40),
                    proptest::collection::vec((1u64..2_000_000, 0u64..400_000), 1..5),
                ),
                |(items, groups)| {
                    let demand: Vec<Demand> = items
                        .iter()
                        .map(|&(value, cap, share, delivered)| Demand {
                            value,
                            cap_ms: cap,
                            used_ms: cap * share / 1000,
                            delivered_permille: delivered,
                        })
                        .collect();
                    // Sell what was used, spread over the groups within their online time.
                    let mut left: u64 = demand.iter().map(|d| d.used_ms).sum();
                    let mut online: Vec<u64> = groups.iter().map(|g| g.1).collect();
                    let mut sold = vec![0u64; groups.len()];
                    for (g, o) in online.iter_mut().enumerate() {
                        let s = left.min(*o);
                        sold[g] = s;
                        left -= s;
                    }
                    // Whatever no group had room for was online somewhere: the last group.
                    if let Some(last) = online.last_mut() {
                        *last += left;
                    }
                    if let Some(last) = sold.last_mut() {
                        *last += left;
                    }
                    let costs: Vec<u64> = groups.iter().map(|g| g.0).collect();
                    let mut a = Account {
                        demand,
                        online_ms: online,
                        sold_ms: sold,
                        renter: 0.0,
                        provider: 0.0,
                    };
                    let w = close(&mut a, &costs);
                    prop_assert!(w.realised <= w.max + 1e-6 * w.max.max(1.0), "{:?}", w);
                    prop_assert!(
                        (w.realised + w.lost() - w.max).abs() <= 1e-6 * w.max.max(1.0),
                        "{:?}",
                        w
                    );
                    for (_, x) in w.losses() {
                        prop_assert!(x >= -1e-6 * w.max.max(1.0), "{:?}", w);
                    }
                    Ok(())
                },
            )
            .unwrap();
    }
}
