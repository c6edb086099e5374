//! The network loop's offer-ingest child ([`Ingest`]): verifies offers received by gossip
//! or book sync (signatures, rate limits per peer and provider, refresh pacing), admits the
//! valid ones to the book, counts verdicts, and batches admitted offers for the store. Every
//! decision takes the time as a parameter.

use std::collections::HashMap;

use gridlease_contracts::book::Admission;
use gridlease_contracts::ingest::OfferIngestor;
use gridlease_protocol::{Offer, OfferId, PeerId, PublicKey, Signed, Timestamp};
use libp2p::gossipsub::{MessageAcceptance, TopicHash};

use super::NetworkEvent;
use super::NodeConfig;
use super::client::GossipStats;
use super::gossip::{self, OfferIgnore, Verdict};
use super::loop_ctx::LoopCtx;
use super::loop_ctx::RATE_KEYS;
use super::ratelimit::{RateLimit, RateLimiter};

/// Most offers buffered for the next store flush.
const OFFER_FLUSH_MAX: usize = 1024;
/// Verified offer messages the ingestor remembers beyond the book: copies of offers the node
/// did not keep (book full, rate-limited) arriving again. Re-announcements of offers it holds
/// are recognised by the book (`OfferBook::holds_frame`), which costs no memory; a cache
/// sized to the book cost about 140 bytes per offer (issue 19's memory budget).
const VERIFIED_OUTSIDE_BOOK: usize = 4096;

/// What became of one offer a book sync brought ([`Ingest::admit_synced`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SyncedOffer {
    /// Valid (admitted, refreshed, or not kept: another class, the provider's rate), with its
    /// id; `new`: admitted as a new offer or sequence.
    Valid {
        /// The offer's id.
        id: OfferId,
        /// Admitted new.
        new: bool,
    },
    /// Stale or superseded by now: not the peer's fault.
    Stale,
    /// Invalid: the peer sent a bad offer.
    Invalid,
}

/// Offer verification and admission.
pub(super) struct Ingest {
    /// Decodes and verifies offers; remembers provider keys and verified offers so
    /// re-announcements skip the signature check.
    ingestor: OfferIngestor,
    /// Verdicts given to gossiped offers (signature counts come from the ingestor and
    /// `book_refreshes`).
    verdicts: GossipStats,
    /// Received offers the book recognised as a held one (`Verdict::Refresh`): accepted
    /// without a signature check, reported with the ingestor's skips.
    book_refreshes: u64,
    /// Gossip messages taken per forwarding peer.
    peer_limits: RateLimiter<PeerId>,
    /// New offers taken per provider.
    provider_limits: RateLimiter<PublicKey>,
    /// Admitted offers not written to the store yet.
    unflushed: Vec<(OfferId, Signed<Offer>, Offer, Timestamp)>,
    /// When each held offer was last accepted from gossip (bounded by the book: swept with it).
    last_accepted: HashMap<OfferId, Timestamp>,
    /// INFO lines about malformed requests, per peer.
    probe_logs: RateLimiter<PeerId>,
}

impl Ingest {
    /// Limits and caches from `config`.
    pub(super) fn new(config: &NodeConfig) -> Self {
        Self {
            // Keys for every provider the book can hold; few verified messages, since the book
            // itself recognises re-announcements of what it holds (`gossip::check_offer`).
            ingestor: OfferIngestor::with_caches(
                config.network.clone(),
                config.book_capacity,
                VERIFIED_OUTSIDE_BOOK,
            ),
            verdicts: GossipStats::default(),
            book_refreshes: 0,
            peer_limits: RateLimiter::new(config.peer_rate, RATE_KEYS),
            provider_limits: RateLimiter::new(config.provider_rate, RATE_KEYS),
            unflushed: Vec::new(),
            last_accepted: HashMap::new(),
            probe_logs: RateLimiter::new(
                RateLimit {
                    burst: 3,
                    per_token: std::time::Duration::from_secs(10),
                },
                RATE_KEYS,
            ),
        }
    }

    /// What gossip has done ([`crate::net::Client::gossip_stats`]).
    pub(super) fn stats(&self) -> GossipStats {
        let sig = self.ingestor.stats();
        GossipStats {
            signatures_checked: sig.checked,
            // The ingestor's skips, and re-announcements the book recognised.
            signatures_skipped: sig.skipped + self.book_refreshes,
            ..self.verdicts
        }
    }

    /// Whether a message from `from` fits its gossip rate at `now`.
    pub(super) fn allow_peer(&mut self, from: &PeerId, now: Timestamp) -> bool {
        self.peer_limits.check(from, now)
    }

    /// Forgets the acceptance times of offers the book no longer holds.
    pub(super) fn sweep(&mut self, ctx: &LoopCtx) {
        let last_accepted = &mut self.last_accepted;
        ctx.book
            .view(|b| last_accepted.retain(|id, _| b.contains(id)));
    }

    /// A gossiped offer on `topic` from `from` (gossipsub score `score`): verified, counted,
    /// admitted when valid, and the node event emitted. Returns the validation result to
    /// report to gossipsub.
    pub(super) fn on_offer(
        &mut self,
        ctx: &LoopCtx,
        from: PeerId,
        data: &[u8],
        topic: &TopicHash,
        score: Option<f64>,
        now: Timestamp,
    ) -> MessageAcceptance {
        let verdict = match gossip::offer_topic_class(&ctx.config.network, topic) {
            Some(class) => self.validate(ctx, &from, data, class, score, now),
            None => Verdict::Ignore(OfferIgnore::NotFollowed),
        };
        match &verdict {
            Verdict::Accept(_) | Verdict::Refresh(_) => self.verdicts.accepted += 1,
            Verdict::Reject(_) => self.verdicts.rejected += 1,
            Verdict::Ignore(_) => self.verdicts.ignored += 1,
        }
        match verdict {
            Verdict::Refresh(id) => {
                ctx.emit(NetworkEvent::OfferRefreshed { id, from });
                MessageAcceptance::Accept
            }
            Verdict::Accept(valid) => {
                self.admit(ctx, *valid, from, now);
                MessageAcceptance::Accept
            }
            Verdict::Reject(why) => {
                tracing::debug!(peer = %from, reason = %why, "offer rejected");
                ctx.emit(NetworkEvent::OfferRejected {
                    from,
                    reason: why.to_string(),
                });
                MessageAcceptance::Reject
            }
            Verdict::Ignore(why) => {
                tracing::debug!(peer = %from, reason = %why, "offer ignored");
                ctx.emit(NetworkEvent::OfferIgnored { from, reason: why });
                MessageAcceptance::Ignore
            }
        }
    }

    /// Admits a valid gossiped offer; a new one is queued for the store.
    fn admit(&mut self, ctx: &LoopCtx, valid: gossip::ValidOffer, from: PeerId, now: Timestamp) {
        let (id, provider, seq) = (valid.id, valid.offer.provider, valid.offer.seq);
        let admitted = ctx
            .book
            .update(|b| b.admit(valid.signed.clone(), valid.offer.clone(), id, now));
        match admitted {
            Ok(Admission::Refresh) => {
                ctx.emit(NetworkEvent::OfferRefreshed { id, from });
            }
            Ok(_) => {
                if self.unflushed.len() < OFFER_FLUSH_MAX {
                    self.unflushed.push((id, valid.signed, valid.offer, now));
                }
                ctx.emit(NetworkEvent::OfferAdmitted {
                    id,
                    provider,
                    seq,
                    from,
                });
            }
            Err(e) => tracing::debug!(error = %e, "offer not admitted"),
        }
    }

    /// `topic_class`: the GPU class of the topic the offer came on (`None`: every offer's).
    fn validate(
        &mut self,
        ctx: &LoopCtx,
        from: &PeerId,
        data: &[u8],
        topic_class: Option<&str>,
        score: Option<f64>,
        now: Timestamp,
    ) -> Verdict {
        // Gossipsub drops RPCs from graylisted peers, but checks once per RPC: a batch of
        // invalid offers in one RPC would still cost a signature check each. Stop paying for a
        // peer as soon as its score is below the graylist threshold.
        if let Some(score) = score
            && score < gossip::thresholds().graylist_threshold
        {
            return Verdict::Ignore(OfferIgnore::Graylisted);
        }
        if !self.peer_limits.check(from, now) {
            return Verdict::Ignore(OfferIgnore::PeerRateLimited);
        }
        let ingestor = &mut self.ingestor;
        let verdict = ctx.book.view(|b| {
            gossip::check_topic(gossip::check_offer(data, ingestor, b, now), topic_class, b)
        });
        let (id, refresh) = match &verdict {
            Verdict::Refresh(id) => {
                self.book_refreshes += 1;
                (*id, true)
            }
            Verdict::Accept(v) => (v.id, v.admission == Admission::Refresh),
            Verdict::Reject(_) | Verdict::Ignore(_) => return verdict,
        };
        if refresh {
            let min = u64::try_from(ctx.config.min_refresh_interval().as_millis()).unwrap_or(0);
            if self.refreshed_within(&id, min, now) {
                return Verdict::Ignore(OfferIgnore::RecentlyRefreshed);
            }
        } else if let Verdict::Accept(v) = &verdict
            && !self.provider_limits.check(&v.offer.provider, now)
        {
            return Verdict::Ignore(OfferIgnore::ProviderRateLimited);
        }
        self.last_accepted.insert(id, now);
        verdict
    }

    /// Whether offer `id` was accepted less than `min_ms` before `now`.
    fn refreshed_within(&self, id: &OfferId, min_ms: u64, now: Timestamp) -> bool {
        self.last_accepted
            .get(id)
            .is_some_and(|last| now.ms_since(*last) < min_ms)
    }

    /// Verifies one synced envelope as gossip would (ingestor, provider rate limit, book) and
    /// admits it when its class is followed (`follows`).
    pub(super) fn admit_synced(
        &mut self,
        ctx: &LoopCtx,
        peer: &PeerId,
        bytes: &[u8],
        follows: impl Fn(&str) -> bool,
        now: Timestamp,
    ) -> SyncedOffer {
        let ingestor = &mut self.ingestor;
        let verdict = ctx
            .book
            .view(|b| gossip::check_offer(bytes, ingestor, b, now));
        match verdict {
            Verdict::Refresh(id) => {
                self.book_refreshes += 1;
                SyncedOffer::Valid { id, new: false }
            }
            Verdict::Accept(v) => {
                let valid = *v;
                let id = valid.id;
                if !follows(&gridlease_protocol::class::offer_class(&valid.offer)) {
                    // Not asked for (this node asks for its classes only): not kept.
                    return SyncedOffer::Valid { id, new: false };
                }
                if valid.admission != Admission::Refresh
                    && !self.provider_limits.check(&valid.offer.provider, now)
                {
                    return SyncedOffer::Valid { id, new: false };
                }
                let new = self.admit_synced_valid(ctx, valid, *peer, now);
                SyncedOffer::Valid { id, new }
            }
            // Stale or superseded by now: not the peer's fault.
            Verdict::Ignore(_) => SyncedOffer::Stale,
            Verdict::Reject(why) => {
                tracing::info!(%peer, reason = %why, "invalid offer in a book sync");
                ctx.emit(NetworkEvent::OfferRejected {
                    from: *peer,
                    reason: why.to_string(),
                });
                SyncedOffer::Invalid
            }
        }
    }

    /// Admits a verified synced offer; whether it was new.
    fn admit_synced_valid(
        &mut self,
        ctx: &LoopCtx,
        valid: gossip::ValidOffer,
        from: PeerId,
        now: Timestamp,
    ) -> bool {
        let (id, provider, seq) = (valid.id, valid.offer.provider, valid.offer.seq);
        let admitted = ctx
            .book
            .update(|b| b.admit(valid.signed.clone(), valid.offer.clone(), id, now));
        match admitted {
            Ok(Admission::Refresh) => false,
            Ok(_) => {
                self.last_accepted.insert(id, now);
                if self.unflushed.len() < OFFER_FLUSH_MAX {
                    self.unflushed.push((id, valid.signed, valid.offer, now));
                }
                ctx.emit(NetworkEvent::OfferAdmitted {
                    id,
                    provider,
                    seq,
                    from,
                });
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "synced offer not admitted");
                false
            }
        }
    }

    /// Writes the admitted offers to the store (best effort).
    pub(super) fn flush(&mut self, ctx: &LoopCtx, now: Timestamp) {
        if self.unflushed.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.unflushed);
        let n = batch.len();
        let ok = ctx.store.try_submit(move |s| {
            if let Err(e) = s.put_offers(&batch, now) {
                tracing::warn!(error = %e, "cannot persist offers");
            }
        });
        if !ok {
            // Offers are re-announced; losing a cache write costs a slower warm start only.
            tracing::warn!(offers = n, "store queue full; offer cache write skipped");
        }
    }

    /// A malformed request from a peer: logged at INFO (at most a few per peer and ten
    /// seconds, the rest at DEBUG), so probing is visible without flooding the log.
    pub(super) fn probed(&mut self, peer: &PeerId, stream: &str, detail: &str, now: Timestamp) {
        if self.probe_logs.check(peer, now) {
            tracing::info!(%peer, stream, detail, "malformed request answered");
        } else {
            tracing::debug!(%peer, stream, detail, "malformed request answered");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refresh_is_paced_by_the_injected_clock() {
        let config = NodeConfig::new(gridlease_protocol::NetworkId::new("ingest-test").unwrap());
        let mut ingest = Ingest::new(&config);
        let id = OfferId(gridlease_protocol::Digest::default());
        let t0 = Timestamp(1_000_000);
        assert!(!ingest.refreshed_within(&id, 500, t0));
        ingest.last_accepted.insert(id, t0);
        assert!(ingest.refreshed_within(&id, 500, Timestamp(t0.0 + 499)));
        assert!(!ingest.refreshed_within(&id, 500, Timestamp(t0.0 + 500)));
    }

    #[test]
    fn a_peer_beyond_its_gossip_rate_waits_for_driven_time() {
        let mut config =
            NodeConfig::new(gridlease_protocol::NetworkId::new("ingest-test").unwrap());
        config.peer_rate = RateLimit {
            burst: 2,
            per_token: std::time::Duration::from_secs(1),
        };
        let mut ingest = Ingest::new(&config);
        let peer = PeerId::random();
        let t0 = Timestamp(5_000_000);
        assert!(ingest.allow_peer(&peer, t0));
        assert!(ingest.allow_peer(&peer, t0));
        assert!(!ingest.allow_peer(&peer, t0));
        assert!(ingest.allow_peer(&peer, Timestamp(t0.0 + 1_000)));
    }
}
