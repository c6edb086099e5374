//! The network score in the simulator (issue 16): one pool of completion records that every
//! renter sees (the stand-in for gossip: no delay, no loss, no partition), scored by the node's
//! own `contracts::reputation::provider_scores`.
//!
//! Cost: a recomputation scores every record in the pool, `O(R log R)` for `R` records (at
//! most `records_kept`, and `records_per_provider` completed ones plus as many others per
//! identity), and happens only at a score tick after new records arrived.
//!
//! The per-provider bound is per class, as in the node's store: a provider's newest completed
//! records and, apart, its newest others (failed, disputed), so that a flood of completed
//! records (self-dealt ones) cannot push its failures out.

use std::collections::{BTreeMap, VecDeque};

use gridlease_contracts::reputation::{CompletionRecord, ScoreParams, provider_scores};
use gridlease_protocol::completion::{CompletionOutcome, GpuCheck};

use crate::scenario::Reputation;

/// A key in a record: a provider identity, a renter of the scenario, or a renter key a
/// self-dealing provider made for itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Key {
    /// Provider identity (whitewashing gives a provider a new one).
    Provider(u32),
    /// A renter of the scenario (its index).
    Renter(u32),
    /// A fresh key a self-dealing provider rents to itself from.
    SelfMade(u32),
}

/// The record pool and the scores computed from it.
pub(crate) struct NetRep {
    params: ScoreParams,
    per_provider: usize,
    kept: usize,
    /// Per provider identity: its completed records and its others, each oldest first.
    pool: BTreeMap<u32, [VecDeque<CompletionRecord<Key, u64>>; 2]>,
    /// (identity, lease) in the order received, for the pool's overall bound (at most twice
    /// `kept` entries: those of records the per-provider bound dropped are pruned).
    order: VecDeque<(u32, u64, usize)>,
    len: usize,
    next_lease: u64,
    next_key: u32,
    dirty: bool,
    /// Score per provider identity as of the last recomputation.
    scores: Vec<f64>,
    /// Recomputations done.
    pub(crate) recomputes: u64,
}

impl NetRep {
    /// An empty pool with the node's default score constants.
    pub(crate) fn new(rep: &Reputation) -> Self {
        Self {
            params: ScoreParams::default(),
            per_provider: rep.records_per_provider as usize,
            kept: rep.records_kept as usize,
            pool: BTreeMap::new(),
            order: VecDeque::new(),
            len: 0,
            next_lease: 0,
            next_key: 0,
            dirty: false,
            scores: Vec::new(),
            recomputes: 0,
        }
    }

    /// A renter key nobody used before.
    pub(crate) fn fresh_key(&mut self) -> Key {
        self.next_key += 1;
        Key::SelfMade(self.next_key - 1)
    }

    /// Adds one settled lease's record (its lease id is the pool's next number).
    pub(crate) fn add(
        &mut self,
        provider: u32,
        renter: Key,
        paid: u64,
        outcome: CompletionOutcome,
    ) {
        let lease = self.next_lease;
        self.next_lease += 1;
        let class = usize::from(outcome != CompletionOutcome::Completed);
        let q = &mut self.pool.entry(provider).or_default()[class];
        q.push_back(CompletionRecord {
            lease,
            provider: Key::Provider(provider),
            renter,
            paid,
            outcome,
            // The simulated market runs no GPU check.
            gpu_check: GpuCheck::NotRun,
        });
        self.len += 1;
        if self.per_provider > 0 && q.len() > self.per_provider {
            q.pop_front();
            self.len -= 1;
        }
        if self.kept > 0 {
            self.order.push_back((provider, lease, class));
            while self.len > self.kept {
                let Some((id, l, class)) = self.order.pop_front() else {
                    break;
                };
                // Entries the per-provider bound already dropped are skipped.
                if let Some(qs) = self.pool.get_mut(&id)
                    && let q = &mut qs[class]
                    && q.front().is_some_and(|r| r.lease == l)
                {
                    q.pop_front();
                    self.len -= 1;
                    if qs.iter().all(VecDeque::is_empty) {
                        self.pool.remove(&id);
                    }
                }
            }
            if self.order.len() > 2 * self.kept {
                // Drop the entries of records the per-provider bound removed: a record is
                // still held when its lease is not older than its provider's oldest held one
                // of its class.
                let pool = &self.pool;
                self.order.retain(|(id, l, class)| {
                    pool.get(id)
                        .and_then(|qs| qs[*class].front())
                        .is_some_and(|f| f.lease <= *l)
                });
            }
        }
        self.dirty = true;
    }

    /// Rescores every provider when records arrived since the last time; returns whether it did.
    pub(crate) fn recompute(&mut self) -> bool {
        if !self.dirty {
            return false;
        }
        let all: Vec<CompletionRecord<Key, u64>> = self
            .pool
            .values()
            .flat_map(|qs| qs.iter().flatten())
            .cloned()
            .collect();
        let prior = self.params.prior_mean;
        self.scores.iter_mut().for_each(|s| *s = prior);
        for (k, s) in provider_scores(&all, &self.params) {
            if let Key::Provider(id) = k {
                let i = id as usize;
                if self.scores.len() <= i {
                    self.scores.resize(i + 1, prior);
                }
                self.scores[i] = s.score;
            }
        }
        self.dirty = false;
        self.recomputes += 1;
        true
    }

    /// The score of provider identity `id` as of the last recomputation (the prior without
    /// records).
    pub(crate) fn score(&self, id: u32) -> f64 {
        self.scores
            .get(id as usize)
            .copied()
            .unwrap_or(self.params.prior_mean)
    }

    /// Records of identity `id` in the pool.
    pub(crate) fn records_of(&self, id: u32) -> usize {
        self.pool
            .get(&id)
            .map_or(0, |qs| qs.iter().map(VecDeque::len).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(per_provider: u32, kept: u32) -> NetRep {
        NetRep::new(&Reputation {
            records_per_provider: per_provider,
            records_kept: kept,
            ..Reputation::default()
        })
    }

    #[test]
    fn bounds_keep_the_newest_per_provider_and_in_all() {
        let mut n = pool(3, 5);
        for i in 0..10 {
            n.add(7, Key::Renter(i), 1, CompletionOutcome::Completed);
        }
        assert_eq!(n.records_of(7), 3);
        assert!(n.order.len() <= 10);
        for i in 0..4 {
            n.add(8, Key::Renter(i), 1, CompletionOutcome::ProviderFailed);
        }
        // 3 of 7's and 3 of 8's would be 6 > 5: the least recently received (7's oldest) goes.
        assert_eq!((n.records_of(7), n.records_of(8)), (2, 3));
        assert_eq!(n.len, 5);
        assert!(n.recompute());
        assert!(!n.recompute(), "nothing new: no recomputation");
        assert!(n.score(8) < 0.5 && n.score(7) > 0.5 - 1e-12);
        assert_eq!(n.score(99), 0.5);
    }

    #[test]
    fn completed_records_never_push_out_failures() {
        let mut n = pool(3, 0);
        n.add(7, Key::Renter(0), 1, CompletionOutcome::ProviderFailed);
        for _ in 0..50 {
            let k = n.fresh_key();
            n.add(7, k, 1, CompletionOutcome::Completed);
        }
        // Three completed (the newest) and the failure.
        assert_eq!(n.records_of(7), 4);
        let failures = n.pool[&7][1].len();
        assert_eq!(failures, 1);
    }
}
