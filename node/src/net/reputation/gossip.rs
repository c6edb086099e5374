//! The network loop's reputation child ([`Reputation`]): the completion records it holds
//! ([`super::Completions`]), their gossip topic, the store writes, the rescoring of the
//! book, and whose turn the completion anti-entropy round is. The time comes as a parameter.

use gridlease_protocol::completion::{CoSigned, Completion, CompletionBatch, CompletionError};
use gridlease_protocol::{PeerId, Timestamp};
use libp2p::Swarm;
use libp2p::gossipsub::{self, IdentTopic, MessageAcceptance, TopicHash};

use super::Completions;
use crate::net::behaviour::Behaviour;
use crate::net::gossip as net_gossip;
use crate::net::loop_ctx::LoopCtx;

/// Completion records and their gossip.
pub(in crate::net) struct Reputation {
    /// Co-signed completion records and the reputation scores the book carries.
    pub(in crate::net) completions: Completions,
    /// The completion records' gossip topic.
    topic: IdentTopic,
    /// Which connected peer the next completion anti-entropy round asks.
    pub(in crate::net) round: usize,
}

impl Reputation {
    /// `completions` (restored from the store) gossiped on `topic`.
    pub(in crate::net) fn new(completions: Completions, topic: IdentTopic) -> Self {
        Self {
            completions,
            topic,
            round: 0,
        }
    }

    /// Whether `topic` is the completion records' topic.
    pub(in crate::net) fn is_topic(&self, topic: &TopicHash) -> bool {
        *topic == self.topic.hash()
    }

    /// Records may be dated at most the allowed clock skew ahead of `now`.
    pub(in crate::net) fn set_clock(&mut self, now: Timestamp) {
        self.completions
            .set_latest(now.plus_secs(gridlease_contracts::terms::MAX_CLOCK_SKEW_S));
    }

    /// A co-signed completion of this node's lease: kept, persisted, published when this
    /// node was its provider; whether it was new.
    pub(in crate::net) fn add(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        pair: CoSigned,
        now: Timestamp,
    ) -> Result<bool, CompletionError> {
        self.set_clock(now);
        let (new, batch) = self.completions.add(pair.clone())?;
        if new && let Ok(c) = pair.record_unchecked() {
            persist(ctx, vec![(c, pair)], now);
        }
        if let Some(batch) = batch {
            self.publish(swarm, &batch);
        }
        Ok(new)
    }

    /// A gossiped batch of completion records from a peer in good standing and within its
    /// rate: every record verified; the new ones kept and persisted. Forwarded only when it
    /// taught this node something.
    pub(in crate::net) fn on_batch(
        &mut self,
        ctx: &LoopCtx,
        from: &PeerId,
        data: &[u8],
        now: Timestamp,
    ) -> MessageAcceptance {
        self.set_clock(now);
        match self.completions.ingest(data) {
            Ok(new) if new.is_empty() => MessageAcceptance::Ignore,
            Ok(new) => {
                tracing::debug!(peer = %from, records = new.len(), "completion records learnt");
                persist(ctx, new, now);
                MessageAcceptance::Accept
            }
            Err(e) => {
                tracing::debug!(peer = %from, error = %e, "completion batch rejected");
                MessageAcceptance::Reject
            }
        }
    }

    /// Pairs a book sync brought: verified (all or none), the new ones kept and persisted.
    pub(in crate::net) fn on_synced(
        &mut self,
        ctx: &LoopCtx,
        pairs: &[serde_bytes::ByteBuf],
        now: Timestamp,
    ) -> Result<(), String> {
        let decoded: Result<Vec<CoSigned>, _> =
            pairs.iter().map(|b| CoSigned::from_bytes(b)).collect();
        self.set_clock(now);
        let new = match decoded {
            Ok(pairs) => self
                .completions
                .ingest_pairs(pairs)
                .map_err(|e| e.to_string())?,
            Err(e) => return Err(e.to_string()),
        };
        if !new.is_empty() {
            persist(ctx, new, now);
        }
        Ok(())
    }

    /// Publishes a batch of records (no subscribed peer is fine).
    fn publish(&self, swarm: &mut Swarm<Behaviour>, batch: &CompletionBatch) {
        let Ok(bytes) = batch.to_bytes() else {
            return;
        };
        match swarm
            .behaviour_mut()
            .gossipsub
            .publish(self.topic.clone(), bytes)
        {
            Ok(_) | Err(gossipsub::PublishError::NoPeersSubscribedToTopic) => {}
            Err(e) => tracing::debug!(error = %e, "completion records not published"),
        }
    }

    /// The republish period: this node's newest own records go out again.
    pub(in crate::net) fn republish(&self, swarm: &mut Swarm<Behaviour>) {
        if let Some(batch) = self.completions.republish() {
            self.publish(swarm, &batch);
        }
    }

    /// The rescore period: the book's scores follow the records (when they changed).
    pub(in crate::net) fn rescore(&mut self, ctx: &LoopCtx) {
        if let Some(scores) = self.completions.rescore(&ctx.config.reputation) {
            ctx.book.update(|b| b.set_reputation(scores));
        }
    }
}

/// Whether a gossipsub score is below the graylist threshold (the peer is not listened to).
pub(in crate::net) fn graylisted(score: Option<f64>) -> bool {
    score.is_some_and(|s| s < net_gossip::thresholds().graylist_threshold)
}

/// Writes verified records to the store (best effort: a full queue loses a restart
/// hint, not a record others still hold).
fn persist(ctx: &LoopCtx, records: Vec<(Completion, CoSigned)>, now: Timestamp) {
    let rows: Vec<(Completion, Vec<u8>)> = records
        .into_iter()
        .filter_map(|(c, pair)| pair.to_bytes().ok().map(|b| (c, b)))
        .collect();
    if !ctx.store.try_submit(move |s| {
        for (c, bytes) in &rows {
            if let Err(e) = s.put_completion(c, bytes, now) {
                tracing::warn!(error = %e, "completion record not stored");
            }
        }
    }) {
        tracing::warn!("store queue full; completion records not persisted");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_graylist_threshold_decides() {
        let t = net_gossip::thresholds().graylist_threshold;
        assert!(!graylisted(None));
        assert!(!graylisted(Some(t)));
        assert!(graylisted(Some(t - 1.0)));
    }
}
