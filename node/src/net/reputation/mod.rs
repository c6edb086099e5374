//! Network reputation (issue 16): the co-signed completion records this node holds, the
//! gossip that spreads them, and the scores computed from them
//! ([`gridlease_contracts::reputation::provider_scores`]), which the offer book's summaries
//! carry for search (`rep`, `completed`, `verified`).
//!
//! Owned by the network loop, beside the book it scores: records arrive from gossip
//! ([`Completions::ingest`]) and from this node's own leases ([`Completions::add`]), are kept
//! in memory (at most [`crate::store::COMPLETIONS_KEPT`]) and persisted by the loop; scores are
//! recomputed at most once per [`RESCORE_PERIOD`] when something changed.
//!
//! Gossip: both parties of a lease publish its record as soon as they hold the co-signed
//! pair (the renter too, so a provider cannot keep its failures to itself by not publishing
//! them), and their newest [`MAX_BATCH_COMPLETIONS`] again every republish period. A node that
//! connects fetches the records its peer holds and it lacks (book sync, after the offers). A batch is accepted only when every record in it verifies (an honest node never
//! forwards a bad one; the sender is penalised otherwise), and forwarded only when it taught
//! this node something.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use gridlease_contracts::query::ProviderNumbers;
use gridlease_contracts::reputation::{CompletionRecord, ScoreParams, provider_scores};
use gridlease_protocol::completion::CompletionOutcome;
use gridlease_protocol::completion::{
    CoSigned, Completion, CompletionBatch, CompletionError, MAX_BATCH_COMPLETIONS,
};
use gridlease_protocol::{LeaseId, NetworkId, PublicKey, Timestamp};

use crate::store::COMPLETIONS_PER_PROVIDER;

mod gossip;

pub(super) use gossip::{Reputation, graylisted};

/// Scores are recomputed at most this often.
pub const RESCORE_PERIOD: Duration = Duration::from_secs(1);

/// Why a gossiped batch was refused.
#[derive(Debug, thiserror::Error)]
pub enum BatchRejection {
    /// Not a batch, or too long.
    #[error("undecodable completion batch: {0}")]
    Decode(#[from] gridlease_protocol::CodecError),
    /// A record in it does not verify.
    #[error("record {index}: {source}")]
    Record {
        /// Its position.
        index: usize,
        /// Why.
        #[source]
        source: CompletionError,
    },
}

/// The records, the own ones to republish, and whether the scores are stale.
#[derive(Debug)]
pub struct Completions {
    network: NetworkId,
    own: PublicKey,
    capacity: usize,
    records: BTreeMap<LeaseId, Completion>,
    /// Every record by (close time, lease): the oldest go first when the pool is full.
    order: BTreeSet<(Timestamp, LeaseId)>,
    /// Per (provider, completed or not): its records by (close time, lease).
    by_class: BTreeMap<(PublicKey, bool), BTreeSet<(Timestamp, LeaseId)>>,
    /// The latest close time accepted ([`Completions::set_latest`]).
    latest: Timestamp,
    /// Every record's co-signed pair, encoded (what book sync serves).
    pairs: BTreeMap<LeaseId, Vec<u8>>,
    /// This node's newest records, as provider or renter (at most [`MAX_BATCH_COMPLETIONS`]).
    recent_own: VecDeque<CoSigned>,
    dirty: bool,
}

impl Completions {
    /// Starts from the stored records (already verified when they were stored; newest first)
    /// and this node's own among them.
    pub fn new(
        network: NetworkId,
        own: PublicKey,
        capacity: usize,
        stored: impl IntoIterator<Item = (Completion, Vec<u8>)>,
    ) -> Self {
        let mut c = Self {
            network,
            own,
            capacity: capacity.max(1),
            records: BTreeMap::new(),
            order: BTreeSet::new(),
            by_class: BTreeMap::new(),
            latest: Timestamp(u64::MAX),
            pairs: BTreeMap::new(),
            recent_own: VecDeque::new(),
            dirty: true,
        };
        for (record, bytes) in stored {
            if (record.provider == c.own || record.renter == c.own)
                && c.recent_own.len() < MAX_BATCH_COMPLETIONS
                && let Ok(pair) = CoSigned::from_bytes(&bytes)
            {
                // Stored newest first: the deque ends up oldest first.
                c.recent_own.push_front(pair);
            }
            if let Ok(pair) = CoSigned::from_bytes(&bytes) {
                c.insert(record, &pair);
            }
        }
        c.dirty = true;
        c
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Whether the record of `lease` is held.
    pub fn has(&self, lease: &LeaseId) -> bool {
        self.records.contains_key(lease)
    }

    /// The leases of the records held after `after` (in order), at most `max`, and whether
    /// more follow.
    pub fn ids_after(&self, after: Option<&LeaseId>, max: usize) -> (Vec<LeaseId>, bool) {
        let range = match after {
            Some(a) => self
                .records
                .range((std::ops::Bound::Excluded(*a), std::ops::Bound::Unbounded)),
            None => self.records.range(..),
        };
        let mut ids: Vec<LeaseId> = range.map(|(k, _)| *k).take(max + 1).collect();
        let more = ids.len() > max;
        ids.truncate(max);
        (ids, more)
    }

    /// The encoded pairs of these leases' records (those held).
    pub fn pairs_of<'a>(&'a self, ids: &'a [LeaseId]) -> impl Iterator<Item = &'a [u8]> + 'a {
        ids.iter()
            .filter_map(|id| self.pairs.get(id).map(Vec::as_slice))
    }

    fn insert(&mut self, c: Completion, pair: &CoSigned) -> bool {
        if self.records.contains_key(&c.lease_id) || c.closed_at > self.latest {
            return false;
        }
        let Ok(bytes) = pair.to_bytes() else {
            return false;
        };
        let key = (c.closed_at, c.lease_id);
        let class = (c.provider, c.outcome == CompletionOutcome::Completed);
        self.pairs.insert(c.lease_id, bytes);
        self.records.insert(c.lease_id, c);
        self.order.insert(key);
        let held = self.by_class.entry(class).or_default();
        held.insert(key);
        // Per provider, its newest completed records and, apart, its newest others: completed
        // ones (self-dealt, say) never push its failures out. Then the oldest of all go.
        let mut drop = Vec::new();
        if held.len() > COMPLETIONS_PER_PROVIDER {
            drop.extend(held.pop_first());
        }
        while self.order.len() - drop.len() > self.capacity {
            match self.order.iter().find(|k| !drop.contains(k)) {
                Some(k) => drop.push(*k),
                None => break,
            }
        }
        for (_, lease) in drop {
            self.forget(&lease);
        }
        self.dirty = true;
        // False when the new record was itself the oldest.
        self.records.contains_key(&key.1)
    }

    fn forget(&mut self, lease: &LeaseId) {
        if let Some(c) = self.records.remove(lease) {
            let key = (c.closed_at, c.lease_id);
            self.order.remove(&key);
            let class = (c.provider, c.outcome == CompletionOutcome::Completed);
            if let Some(held) = self.by_class.get_mut(&class) {
                held.remove(&key);
                if held.is_empty() {
                    self.by_class.remove(&class);
                }
            }
        }
        self.pairs.remove(lease);
    }

    /// Records closed after `latest` are not taken (a record dated ahead would otherwise stay
    /// among a provider's newest for good): the loop sets it to now plus the allowed skew.
    pub fn set_latest(&mut self, latest: Timestamp) {
        self.latest = latest;
    }

    /// A pair this node's lease service co-signed (as provider or renter): verified, kept;
    /// returned as the batch to publish when it was new.
    pub fn add(
        &mut self,
        pair: CoSigned,
    ) -> Result<(bool, Option<CompletionBatch>), CompletionError> {
        let c = pair.verify(&self.network)?;
        let mine = c.provider == self.own || c.renter == self.own;
        let new = self.insert(c, &pair);
        if !(new && mine) {
            return Ok((new, None));
        }
        self.recent_own.push_back(pair.clone());
        while self.recent_own.len() > MAX_BATCH_COMPLETIONS {
            self.recent_own.pop_front();
        }
        Ok((
            true,
            Some(CompletionBatch {
                completions: vec![pair],
            }),
        ))
    }

    /// A gossiped batch: every record verified, the new ones kept. Returns the new pairs (to
    /// persist); empty when the batch taught nothing.
    pub fn ingest(&mut self, bytes: &[u8]) -> Result<Vec<(Completion, CoSigned)>, BatchRejection> {
        let batch = CompletionBatch::from_bytes(bytes)?;
        self.ingest_pairs(batch.completions)
    }

    /// Pairs from a peer (gossip or book sync): every one verified, else none is kept; the new
    /// ones kept and returned.
    pub fn ingest_pairs(
        &mut self,
        pairs: Vec<CoSigned>,
    ) -> Result<Vec<(Completion, CoSigned)>, BatchRejection> {
        let mut checked = Vec::with_capacity(pairs.len());
        for (index, pair) in pairs.into_iter().enumerate() {
            let c = pair
                .verify(&self.network)
                .map_err(|source| BatchRejection::Record { index, source })?;
            checked.push((c, pair));
        }
        Ok(checked
            .into_iter()
            .filter(|(c, pair)| self.insert(c.clone(), pair))
            .collect())
    }

    /// This node's newest own records, to republish (`None` when it has none).
    pub fn republish(&self) -> Option<CompletionBatch> {
        (!self.recent_own.is_empty()).then(|| CompletionBatch {
            completions: self.recent_own.iter().cloned().collect(),
        })
    }

    /// When records changed since the last call: every provider's score (per mille),
    /// completed count and passed GPU checks, for the book.
    pub fn rescore(&mut self, params: &ScoreParams) -> Option<HashMap<PublicKey, ProviderNumbers>> {
        if !self.dirty {
            return None;
        }
        self.dirty = false;
        let records: Vec<CompletionRecord<PublicKey, LeaseId>> =
            self.records.values().map(CompletionRecord::from).collect();
        Some(
            provider_scores(&records, params)
                .into_iter()
                .map(|(k, s)| {
                    let rep_permille = (s.score * 1000.0).round().clamp(0.0, 1000.0) as u32;
                    let numbers = ProviderNumbers {
                        rep_permille,
                        completed: s.completed,
                        verified: s.checks_passed,
                    };
                    (k, numbers)
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::completion::{CompletionAck, CompletionOutcome, GpuCheck};
    use gridlease_protocol::{Digest, NodeKey, Signed, Timestamp};

    fn pair(p: &NodeKey, r: &NodeKey, lease: u8, paid: u64) -> (Completion, CoSigned) {
        let net = NetworkId::devnet();
        let c = Completion {
            lease_id: LeaseId(Digest([lease; 32])),
            provider: p.public(),
            renter: r.public(),
            gpu_seconds: 60,
            paid,
            closed_at: Timestamp(u64::from(lease)),
            outcome: CompletionOutcome::Completed,
            gpu_check: GpuCheck::Passed,
        };
        let both = CoSigned {
            provider: Signed::sign(p, &net, &c).unwrap(),
            renter: Signed::sign(
                r,
                &net,
                &CompletionAck {
                    completion: c.clone(),
                },
            )
            .unwrap(),
        };
        (c, both)
    }

    #[test]
    fn own_records_are_published_gossip_is_verified_and_scores_follow() {
        let (me, renter, other) = (
            NodeKey::from_secret([1; 32]),
            NodeKey::from_secret([2; 32]),
            NodeKey::from_secret([3; 32]),
        );
        let mut c = Completions::new(NetworkId::devnet(), me.public(), 10, []);
        let (_, p1) = pair(&me, &renter, 1, 600_000);
        let (new, batch) = c.add(p1.clone()).unwrap();
        assert!(new);
        assert_eq!(batch.unwrap().completions, vec![p1.clone()]);
        // Again: nothing new, nothing to publish.
        assert_eq!(c.add(p1).unwrap(), (false, None));
        // The renter also rented from another provider: gossip brings that record.
        let (_, p2) = pair(&other, &renter, 2, 600_000);
        let bytes = CompletionBatch {
            completions: vec![p2.clone()],
        }
        .to_bytes()
        .unwrap();
        assert_eq!(c.ingest(&bytes).unwrap().len(), 1);
        assert!(c.ingest(&bytes).unwrap().is_empty(), "taught nothing");
        let scores = c.rescore(&ScoreParams::default()).unwrap();
        // The one record weighs 0.5 (the renter's credit elsewhere) + 0.01: 1.51 / 2.51.
        assert_eq!(
            scores[&me.public()],
            ProviderNumbers {
                rep_permille: 602,
                completed: 1,
                verified: 1
            }
        );
        assert!(c.rescore(&ScoreParams::default()).is_none(), "unchanged");
        // A batch with one forged record is refused whole.
        let mut forged = p2;
        forged.renter = pair(&other, &other, 3, 1).1.renter;
        let bad = CompletionBatch {
            completions: vec![pair(&other, &renter, 4, 1).1, forged],
        }
        .to_bytes()
        .unwrap();
        assert!(matches!(
            c.ingest(&bad),
            Err(BatchRejection::Record { index: 1, .. })
        ));
        assert_eq!(c.len(), 2, "nothing of the bad batch kept");
        assert_eq!(c.republish().unwrap().completions.len(), 1);
    }

    #[test]
    fn completed_records_never_push_a_providers_failures_out_and_future_ones_are_refused() {
        let (p, r) = (NodeKey::from_secret([1; 32]), NodeKey::from_secret([2; 32]));
        let mut c = Completions::new(NetworkId::devnet(), PublicKey([9; 32]), 10_000, []);
        let net = NetworkId::devnet();
        let make = |lease: u32, outcome| {
            let mut id = [0u8; 32];
            id[..4].copy_from_slice(&lease.to_le_bytes());
            let rec = Completion {
                lease_id: LeaseId(Digest(id)),
                provider: p.public(),
                renter: r.public(),
                gpu_seconds: 1,
                paid: 1,
                closed_at: Timestamp(1_000 + u64::from(lease)),
                outcome,
                gpu_check: GpuCheck::NotRun,
            };
            CoSigned {
                provider: Signed::sign(&p, &net, &rec).unwrap(),
                renter: Signed::sign(&r, &net, &CompletionAck { completion: rec }).unwrap(),
            }
        };
        c.add(make(0, CompletionOutcome::ProviderFailed)).unwrap();
        let n = u32::try_from(COMPLETIONS_PER_PROVIDER).unwrap() + 50;
        for lease in 1..=n {
            c.add(make(lease, CompletionOutcome::Completed)).unwrap();
        }
        assert_eq!(
            c.len(),
            COMPLETIONS_PER_PROVIDER + 1,
            "the newest completed and the failure"
        );
        assert!(
            c.has(
                &make(0, CompletionOutcome::ProviderFailed)
                    .record_unchecked()
                    .unwrap()
                    .lease_id
            )
        );
        // A record dated after the latest accepted close time is not taken.
        c.set_latest(Timestamp(1_000 + u64::from(n) + 1));
        assert_eq!(
            c.add(make(n + 5, CompletionOutcome::Completed)).unwrap(),
            (false, None)
        );
        assert!(c.add(make(n + 1, CompletionOutcome::Completed)).unwrap().0);
        assert_eq!(c.order.len(), c.records.len());
    }

    #[test]
    fn the_oldest_records_make_room() {
        let (p, r) = (NodeKey::from_secret([1; 32]), NodeKey::from_secret([2; 32]));
        let mut c = Completions::new(NetworkId::devnet(), PublicKey([9; 32]), 3, []);
        for lease in 1..=5u8 {
            let (_, both) = pair(&p, &r, lease, 1);
            c.add(both).unwrap();
        }
        assert_eq!(c.len(), 3);
        assert!(c.records.contains_key(&LeaseId(Digest([5; 32]))));
        assert!(!c.records.contains_key(&LeaseId(Digest([1; 32]))));
    }
}
