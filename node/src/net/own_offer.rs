//! The network loop's own-offer child ([`Publisher`]): re-signs this node's offer when it
//! must (expiry near, addresses changed, free GPU count changed, paced), persists its
//! sequence, publishes it, and withdraws it. Decisions take the time as a parameter.

use std::time::Duration;

use gridlease_protocol::{Offer, OfferId, Signed, Timestamp, class};
use libp2p::gossipsub::{self, IdentTopic};
use libp2p::{Multiaddr, Swarm};

use super::NetworkEvent;
use super::behaviour::Behaviour;
use super::classes::Classes;
use super::gossip;
use super::loop_ctx::{LoopCtx, with_peer};
use super::provider::{OwnOffer, ProviderState};
use super::ratelimit::RateLimiter;

/// Lifetime of the re-signed offer that withdraws the own offer ([`Publisher::withdraw`]):
/// long enough for receivers whose clocks run up to a minute ahead (`MAX_CLOCK_SKEW_S`) to
/// take it.
const WITHDRAWAL_TTL_S: u64 = 90;

/// This node's own offer and its publication.
pub(super) struct Publisher {
    /// The template, the current signed offer, sequences, the free GPU count.
    pub(super) provider: ProviderState,
    /// This node's own new offer sequences, paced a little below the rate receivers take from
    /// one provider (`NodeConfig::provider_rate`, [`super::ratelimit::RateLimit::with_headroom`]): a re-sign
    /// for capacity beyond it waits for a token instead of being ignored by every receiver,
    /// also when the network bunches two of them.
    own_resigns: RateLimiter<()>,
    /// The own offer's last publication reached no subscribed peer: publish it again when
    /// one subscribes (it is not re-announced periodically).
    pub(super) publish_pending: bool,
}

impl Publisher {
    /// Offers `provider`'s template, re-signing at most at `rate` (with headroom).
    pub(super) fn new(provider: ProviderState, rate: super::ratelimit::RateLimit) -> Self {
        Self {
            provider,
            own_resigns: RateLimiter::new(rate.with_headroom(), 1),
            publish_pending: false,
        }
    }

    /// Whether the current offer must be re-signed at `now`: none yet, within `margin` ms of
    /// expiry, or our reachable addresses changed (a relay reservation came up, an external
    /// address was confirmed). No addresses yet (just started, listeners not reported) is
    /// not a change worth a new sequence.
    fn must_resign(&self, addrs: &[String], margin: u64, now: Timestamp) -> bool {
        match &self.provider.current {
            None => true,
            Some(cur) => {
                cur.offer.expires_at.ms_since(now) <= margin
                    || (!addrs.is_empty() && cur.offer.addrs != addrs)
            }
        }
    }

    /// Whether to sign a new sequence at `now`: when it must (taking a token: receivers
    /// count every sequence), or when a capacity change asks for it and the pace allows.
    fn stale(&mut self, must: bool, now: Timestamp) -> bool {
        if must {
            let _ = self.own_resigns.check(&(), now);
            true
        } else {
            self.provider.resign && self.own_resigns.check(&(), now)
        }
    }

    /// Re-signs the own offer when it must be (missing, close to expiry, addresses changed)
    /// or when a capacity change asks for it (`provider.resign`) and the pace allows (else
    /// it stays asked for: the network loop's tick comes back); publishes it when re-signed,
    /// or always with `publish`. `listen`: our listen addresses.
    pub(super) fn refresh(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        classes: &mut Classes,
        listen: &[Multiaddr],
        publish: bool,
        now: Timestamp,
    ) {
        if self.provider.template.is_none() {
            return;
        }
        let margin = u64::try_from((ctx.config.announce_period * 2).as_millis()).unwrap_or(0);
        let addrs = advertised_addrs(swarm, listen);
        let must = self.must_resign(&addrs, margin, now);
        let stale = self.stale(must, now);
        if !stale && !publish {
            return;
        }
        if stale && !self.resign(ctx, addrs, now) {
            return;
        }
        let Some(cur) = &self.provider.current else {
            return;
        };
        let (signed, offer) = (cur.signed.clone(), cur.offer.clone());
        classes.follow_own_class(swarm, &offer);
        self.publish(swarm, ctx, &classes.topic, &signed, &offer);
    }

    /// Signs a new sequence of the template with `addrs`, admits it to the own book and
    /// makes it current (the earlier ones kept for requests in flight). False when it could
    /// not be signed.
    fn resign(&mut self, ctx: &LoopCtx, addrs: Vec<String>, now: Timestamp) -> bool {
        let Some(template) = self.provider.template.clone() else {
            return false;
        };
        let ttl_ms = u64::try_from(ctx.config.offer_ttl.as_millis()).unwrap_or(u64::MAX);
        let seq = self.provider.next_seq(now);
        let offer = template.offer(
            ctx.key.public(),
            seq,
            now,
            ttl_ms,
            addrs,
            self.provider.free_gpus,
            self.provider.kept_gib,
        );
        let Some((signed, id)) = sign(ctx, &offer, false) else {
            return false;
        };
        let admitted = ctx
            .book
            .update(|b| b.admit(signed.clone(), offer.clone(), id, now));
        if let Err(e) = admitted {
            tracing::warn!(error = %e, "own offer not admitted to own book");
        }
        let images = std::sync::Arc::new(template.images.clone());
        // The same template signed before stays acceptable for requests in flight.
        let earlier = match self.provider.current.take() {
            Some(prev) => std::iter::once((prev.id, prev.offer.seq))
                .chain(prev.earlier)
                .take(super::provider::EARLIER_KEPT)
                .collect(),
            None => Vec::new(),
        };
        self.provider.resign = false;
        self.provider.current = Some(OwnOffer {
            signed,
            offer,
            id,
            images,
            earlier,
        });
        ctx.emit(NetworkEvent::OfferPublished { id, seq });
        true
    }

    /// Publishes an own offer on the topic of every offer (`every`) and on its GPU class's
    /// topic (two publications: each gets its own random gossipsub sequence number, so their
    /// message ids differ). One that reaches no subscribed peer on either topic is published
    /// again when one subscribes (`publish_pending`).
    fn publish(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        every: &IdentTopic,
        signed: &Signed<Offer>,
        offer: &Offer,
    ) {
        let bytes = match signed.to_bytes() {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode own offer");
                return;
            }
        };
        let seq = offer.seq;
        let topics = [
            every.clone(),
            gossip::class_topic(&ctx.config.network, &class::offer_class(offer)),
        ];
        let mut reached = false;
        for topic in topics {
            match swarm
                .behaviour_mut()
                .gossipsub
                .publish(topic.clone(), bytes.clone())
            {
                Ok(_) | Err(gossipsub::PublishError::Duplicate) => {
                    reached = true;
                    tracing::debug!(seq, %topic, "offer announced");
                }
                Err(gossipsub::PublishError::NoPeersSubscribedToTopic) => {}
                Err(e) => {
                    tracing::warn!(error = %e, %topic, "offer announce failed");
                }
            }
        }
        self.publish_pending = !reached;
        if !reached {
            tracing::debug!("no peers to announce to yet; publishing when one subscribes");
        }
    }

    /// Withdraws the own offer from other nodes' books: it is re-signed with a new sequence,
    /// no free GPU and a lifetime of [`WITHDRAWAL_TTL_S`], and published. Receivers replace
    /// the offer they hold with it (searches leave out offers with no free GPU) and evict it
    /// when it expires, instead of listing the old offer until its own expiry (up to an hour,
    /// since unchanged offers are not re-announced). Best effort: a node that misses it keeps
    /// the old offer until that expires, as it would after a crash.
    ///
    /// Returns whether there was an offer to withdraw.
    pub(super) fn withdraw(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        every: &IdentTopic,
        now: Timestamp,
    ) -> bool {
        let Some(prev) = self.provider.current.take() else {
            return false;
        };
        ctx.book.update(|b| b.remove(&ctx.key.public()));
        let mut offer = prev.offer;
        offer.seq = self.provider.next_seq(now);
        offer.created_at = now;
        offer.expires_at = now.plus_secs(WITHDRAWAL_TTL_S);
        offer.free_gpus = 0;
        let _ = self.own_resigns.check(&(), now);
        if let Some((signed, _)) = sign(ctx, &offer, true) {
            self.publish(swarm, ctx, every, &signed, &offer);
            // Not repeated when a peer subscribes: it syncs our book, which no longer holds
            // the offer.
            self.publish_pending = false;
            tracing::info!(seq = offer.seq, "own offer withdrawn");
        }
        true
    }

    /// A new free GPU count: whether the offer must be re-signed and announced now (the
    /// count changed and the current offer carries another).
    pub(super) fn set_free(&mut self, free: u16, kept_gib: u64) -> bool {
        if self.provider.kept_gib != kept_gib {
            self.provider.kept_gib = kept_gib;
            if self.provider.current.is_some() {
                self.provider.free_gpus = Some(free);
                self.provider.resign = true;
                return true;
            }
        }
        let changed = self.provider.free_gpus != Some(free);
        self.provider.free_gpus = Some(free);
        if changed
            && self
                .provider
                .current
                .as_ref()
                .is_some_and(|c| c.offer.free_gpus != free)
        {
            self.provider.resign = true;
            return true;
        }
        false
    }
}

/// How long a stopping node keeps driving its connections so the withdrawal goes out.
pub(super) const WITHDRAWAL_DRAIN: Duration = Duration::from_millis(300);

/// Signs an own offer and persists it with its sequence (so sequences never go back);
/// a withdrawal (`withdrawn`) only persists its sequence.
fn sign(ctx: &LoopCtx, offer: &Offer, withdrawn: bool) -> Option<(Signed<Offer>, OfferId)> {
    let signed = match Signed::sign(&ctx.key, &ctx.config.network, offer) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot sign own offer");
            return None;
        }
    };
    let id = OfferId(signed.envelope().content_digest());
    let (persisted, seq) = (signed.clone(), offer.seq);
    let submitted = ctx.store.try_submit(move |s| {
        let r = if withdrawn {
            s.put_own_withdrawal(seq)
        } else {
            s.put_own_offer(id, &persisted, seq)
        };
        if let Err(e) = r {
            tracing::error!(error = %e, "cannot persist own offer");
        }
    });
    if !submitted {
        tracing::warn!("store queue full; own offer sequence not persisted this round");
    }
    Some((signed, id))
}

/// Our addresses as text for the offer: external ones first, then listen addresses;
/// loopback ones only when there is nothing else (a node on one machine). A renter that
/// dialed a provider's `127.0.0.1:4001` would reach itself when it listens there too, and
/// that wrong-peer connection fails the whole dial, the good addresses with it.
fn advertised_addrs(swarm: &Swarm<Behaviour>, listen: &[Multiaddr]) -> Vec<String> {
    let me = *swarm.local_peer_id();
    let all: Vec<&Multiaddr> = swarm.external_addresses().chain(listen.iter()).collect();
    let beyond_loopback = all.iter().any(|a| !super::reach::is_loopback(a));
    let mut out: Vec<String> = all
        .into_iter()
        .filter(|a| !beyond_loopback || !super::reach::is_loopback(a))
        .map(|a| with_peer(a.clone(), me).to_string())
        .filter(|s| s.len() <= gridlease_protocol::MAX_ADDR_LEN)
        .collect();
    out.dedup();
    out.truncate(gridlease_protocol::MAX_OFFER_ADDRS);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::ratelimit::RateLimit;

    fn publisher() -> Publisher {
        let rate = RateLimit {
            burst: 2,
            per_token: Duration::from_secs(1),
        };
        Publisher::new(ProviderState::default(), rate)
    }

    #[test]
    fn a_capacity_resign_waits_for_the_pace_on_the_injected_clock() {
        let mut p = publisher();
        let t0 = Timestamp(10_000_000);
        // Nothing asked: not stale.
        assert!(!p.stale(false, t0));
        p.provider.resign = true;
        // The burst allows what the headroom leaves; then the pace holds it back.
        let mut allowed = 0;
        while p.stale(false, t0) {
            allowed += 1;
            assert!(allowed < 10, "the pace never held the re-sign back");
        }
        assert!(allowed >= 1);
        // A re-sign that must happen (expiry, addresses) never waits.
        assert!(p.stale(true, t0));
        // Later on the same clock, a token is back.
        assert!(p.stale(false, Timestamp(t0.0 + 10_000)));
    }

    #[test]
    fn no_current_offer_must_be_signed() {
        let p = publisher();
        assert!(p.must_resign(&[], 0, Timestamp(1)));
    }
}
