//! The market's welfare accounts ([`crate::welfare`]): each job's presence and use, each
//! provider group's supply and sales, and who gained what, filled as jobs arrive, lease and
//! leave, and closed period by period (a period is a time bucket). The market calls these
//! hooks; the rules (the benchmark, the losses) are `crate::welfare`'s.

use super::{ChannelOutcome, Job, JobState, Market};
use crate::welfare::{Account, Demand, close};

/// What the accounts keep between events.
pub(super) struct Accounts {
    /// Per period (bucket), its open accounts.
    periods: Vec<Account>,
    /// Periods before this one are closed (their welfare is in the buckets).
    closed: usize,
    /// Per provider group: cost floor, micro-units per GPU-hour.
    cost: Vec<u64>,
    /// Per provider group: GPUs online (available) now.
    online: Vec<u64>,
    /// Per provider group: the time up to which its online GPU time is in the accounts.
    since: Vec<u64>,
}

impl Accounts {
    /// Accounts for `periods` periods and these groups' cost floors.
    pub(super) fn new(periods: usize, cost: Vec<u64>) -> Self {
        let groups = cost.len();
        Self {
            periods: (0..periods).map(|_| Account::new(groups)).collect(),
            closed: 0,
            cost,
            online: vec![0; groups],
            since: vec![0; groups],
        }
    }
}

/// How time is cut into periods: their length, how many, and the horizon.
#[derive(Clone, Copy)]
struct Periods {
    ms: u64,
    count: usize,
    horizon: u64,
}

impl Periods {
    /// The periods `[from, to)` overlaps, each with the overlap in ms (within the horizon).
    fn spans(self, from: u64, to: u64) -> impl Iterator<Item = (usize, u64)> {
        let to = to.min(self.horizon);
        let first = (from / self.ms) as usize;
        let n = if to > from {
            (((to - 1) / self.ms) as usize).min(self.count.saturating_sub(1)) + 1
        } else {
            first
        };
        (first..n).filter_map(move |b| {
            let (s, e) = (b as u64 * self.ms, (b as u64 + 1) * self.ms);
            let o = to.min(e).saturating_sub(from.max(s));
            (o > 0).then_some((b, o))
        })
    }
}

impl Market<'_> {
    fn periods(&self) -> Periods {
        Periods {
            ms: self.bucket_ms,
            count: self.acc.periods.len(),
            horizon: self.horizon,
        }
    }

    /// The start of the first open period: a departing job's presence before it is already in
    /// the closed periods' accounts.
    fn open_from(&self) -> u64 {
        self.acc.closed as u64 * self.bucket_ms
    }

    /// A job's presence `[from, to)` as one demand per period, with its real use `used` (an
    /// empty span for a job that did not run).
    fn present(&mut self, j: &Job, (from, to): (u64, u64), used: (u64, u64), delivered: u32) {
        let dur = u64::from(j.duration_s) * 1000;
        let gpus = u64::from(j.gpus);
        let periods = self.periods();
        for (b, o) in periods.spans(from, to) {
            let used_ms = periods
                .spans(used.0, used.1)
                .find(|u| u.0 == b)
                .map_or(0, |u| u.1);
            self.acc.periods[b].demand.push(Demand {
                value: j.valuation.micros(),
                cap_ms: gpus * o.min(dur),
                used_ms: gpus * used_ms,
                delivered_permille: delivered,
            });
        }
    }

    /// Provider group `g`'s online GPU time up to `to`, into the periods it spans.
    fn flush_supply(&mut self, g: usize, to: u64) {
        let (from, gpus) = (self.acc.since[g], self.acc.online[g]);
        if to <= from {
            return;
        }
        if gpus > 0 {
            for (b, o) in self.periods().spans(from, to) {
                self.acc.periods[b].online_ms[g] += gpus * o;
            }
        }
        self.acc.since[g] = to;
    }

    /// A provider of group `g` came online (`delta` > 0) or went away at `now`.
    pub(super) fn supply_changed(&mut self, g: usize, now: u64, delta: i64) {
        self.flush_supply(g, now);
        self.acc.online[g] = self.acc.online[g].saturating_add_signed(delta);
    }

    /// A job left without a lease at `now` (it ran out of patience).
    pub(super) fn account_abandon(&mut self, j: &Job, now: u64) {
        self.integrate(now);
        let from = j.arrived.max(self.open_from());
        self.present(j, (from, now), (0, 0), 1000);
    }

    /// A job got a lease on provider `p` at `now` whose channel ends as `out` says: its
    /// presence until the lease ends, its real use, the provider's sale, and who gained what.
    pub(super) fn account_lease(
        &mut self,
        j: &Job,
        p: usize,
        now: u64,
        out: &ChannelOutcome,
        delivered: u32,
    ) {
        self.integrate(now);
        let g = self.providers[p].group;
        let gpus = u64::from(j.gpus);
        let used = (now, now + out.real_wall_ms);
        let from = j.arrived.max(self.open_from());
        self.present(j, (from, now + out.end_ms), used, delivered);
        // Value and cost of the whole real use; payments are transfers between the two sides.
        let use_h = (gpus * out.real_wall_ms) as f64 / 3_600_000.0;
        let value = j.valuation.micros() as f64 * f64::from(delivered.min(1000)) / 1000.0 * use_h;
        let cost = self.acc.cost[g] as f64 * use_h;
        let paid = out.paid.micros() as f64;
        if out.real_wall_ms == 0 {
            let b = (now / self.bucket_ms) as usize;
            if let Some(a) = self.acc.periods.get_mut(b.min(self.buckets.len() - 1)) {
                a.renter -= paid;
                a.provider += paid;
            }
            return;
        }
        for (b, o) in self.periods().spans(used.0, used.1) {
            let share = o as f64 / out.real_wall_ms as f64;
            let a = &mut self.acc.periods[b];
            a.sold_ms[g] += gpus * o;
            a.renter += (value - paid) * share;
            a.provider += (paid - cost) * share;
        }
    }

    /// Closes period `b`, which ends at `end`: the jobs still waiting were present in it up to
    /// its end, the groups' supply is flushed to it, and its welfare goes into its bucket.
    pub(super) fn close_period(&mut self, b: usize, end: u64) {
        if b < self.acc.closed || b >= self.acc.periods.len() {
            return;
        }
        let start = b as u64 * self.bucket_ms;
        for i in 0..self.jobs.len() {
            let j = self.jobs[i];
            if j.state != JobState::Free && j.arrived < end {
                self.present(&j, (j.arrived.max(start), end), (0, 0), 1000);
            }
        }
        for g in 0..self.acc.cost.len() {
            self.flush_supply(g, end);
        }
        let w = close(&mut self.acc.periods[b], &self.acc.cost);
        self.buckets[b].welfare = w;
        // The closed period's accounts are done with: free their memory.
        self.acc.periods[b] = Account::default();
        self.acc.closed = b + 1;
    }

    /// Closes every period still open (the run has reached its horizon).
    pub(super) fn close_all(&mut self) {
        for b in self.acc.closed..self.acc.periods.len() {
            let end = ((b as u64 + 1) * self.bucket_ms).min(self.horizon);
            self.close_period(b, end);
        }
    }
}
