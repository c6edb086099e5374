//! Offer gossip: topic, gossipsub configuration, peer scoring and offer validation.
//!
//! Validation order (cheapest first), answered to gossipsub as Accept / Reject / Ignore:
//! 0. forwarding peer's score below the graylist threshold (gossipsub only checks once per RPC,
//!    so a batch could otherwise cost a signature check per message) -> Ignore
//! 1. per-propagation-peer rate limit (CPU bound on signature checks) -> Ignore
//! 2. envelope decode (in place) with the offer cap -> Reject
//! 3. header (version, kind, network id), strict signature over the received bytes (skipped for
//!    bytes identical to an offer verified before: the ingestor's bounded dedup cache), payload
//!    decode -> Reject
//! 4. `validate_offer` (shape, signer == provider, expiry, TTL, field ranges) -> Reject, except an
//!    offer that expired less than the allowed clock skew ago -> Ignore (it may have expired in
//!    flight)
//! 5. the book: replayed (lower) sequence or equivocation (same sequence, other content) ->
//!    Reject; book full of longer-lived offers -> Ignore; (5c) on a GPU class's topic, an
//!    offer of another class -> Reject
//! 6. per-provider rate limit on new sequences -> Ignore
//!
//! 7. a refresh (the held offer again, byte for byte) already forwarded less than half an
//!    announce period ago -> Ignore
//!
//! `Reject` applies gossipsub's P4 penalty to the propagation source; `Ignore` drops the
//! message without penalty. A refresh is otherwise accepted and forwarded. Providers publish
//! an offer only when they sign it (a change, or near its expiry), so refreshes are rare: a
//! publication repeated because it first reached nobody. Late joiners learn live offers by
//! book sync (`docs/protocol.md` 3b), not from re-announcements.

use std::time::Duration;

use gridlease_contracts::book::{Admission, BookError, OfferBook};
use gridlease_contracts::ingest::{IngestError, OfferIngestor};
use gridlease_contracts::terms::{MAX_CLOCK_SKEW_S, OfferError};
use gridlease_protocol::envelope::ENVELOPE_OVERHEAD;
use gridlease_protocol::{
    EnvelopeError, MAX_OFFER_BYTES, NetworkId, Offer, OfferId, Signed, Timestamp,
};
use libp2p::gossipsub::{
    self, IdentTopic, MessageAuthenticity, MessageId, PeerScoreParams, PeerScoreThresholds,
    TopicHash, TopicScoreParams, ValidationMode,
};
use libp2p::identity;
use sha2::{Digest as _, Sha256};

use super::{BuildError, NodeConfig};

/// Gossipsub framing allowance on top of the signed offer (protobuf fields, topic, gossipsub's
/// own signature and key).
const GOSSIP_FRAMING: usize = 4096;

/// Largest gossipsub RPC accepted: one capped offer envelope plus framing.
pub const MAX_TRANSMIT_SIZE: usize = MAX_OFFER_BYTES + ENVELOPE_OVERHEAD + GOSSIP_FRAMING;

/// The versioned topic of every offer of `network`: what a node that follows every class
/// (the default) subscribes to. Every provider publishes its offer here and on its class's
/// topic ([`class_topic`]).
pub fn offer_topic(network: &NetworkId) -> IdentTopic {
    IdentTopic::new(format!("gridlease/v1/offers/{network}"))
}

/// The topic of the offers of one GPU class (`gridlease_protocol::class`) of `network`:
/// `gridlease/v1/offers/<network>/<class>`, what a node that follows some classes subscribes
/// to (`docs/protocol.md` 3c step 1). The messages are the same signed offers as on
/// [`offer_topic`].
pub fn class_topic(network: &NetworkId, class: &str) -> IdentTopic {
    IdentTopic::new(format!("gridlease/v1/offers/{network}/{class}"))
}

/// Which offer topic of `network` `topic` is: `Some(None)` for every offer's, `Some(Some(c))`
/// for class `c`'s, `None` for any other topic.
pub fn offer_topic_class<'a>(network: &NetworkId, topic: &'a TopicHash) -> Option<Option<&'a str>> {
    let rest = topic
        .as_str()
        .strip_prefix("gridlease/v1/offers/")?
        .strip_prefix(network.as_str())?;
    if rest.is_empty() {
        return Some(None);
    }
    let class = rest.strip_prefix('/')?;
    gridlease_protocol::class::is_class(class).then_some(Some(class))
}

/// The DHT key under which the nodes of a GPU class put provider records (`docs/protocol.md`
/// 3c step 4): SHA-256 of `gridlease/v1/class`, NUL, the network id, NUL, the class.
pub fn class_key(network: &NetworkId, class: &str) -> libp2p::kad::RecordKey {
    let mut h = Sha256::new();
    h.update(b"gridlease/v1/class\0");
    h.update(network.as_str().as_bytes());
    h.update(b"\0");
    h.update(class.as_bytes());
    libp2p::kad::RecordKey::new(&h.finalize().as_slice())
}

/// The topics a node subscribes to for the offers it follows: every offer's when `follow` is
/// `None`, else each followed class's.
pub fn followed_topics(network: &NetworkId, follow: Option<&[String]>) -> Vec<IdentTopic> {
    match follow {
        None => vec![offer_topic(network)],
        Some(classes) => classes.iter().map(|c| class_topic(network, c)).collect(),
    }
}

/// The versioned topic of co-signed lease completions (reputation, issue 16) of `network`.
pub fn completion_topic(network: &NetworkId) -> IdentTopic {
    IdentTopic::new(format!("gridlease/v1/completions/{network}"))
}

/// Message id = SHA-256 over the publisher's gossipsub header (source, random sequence number)
/// and the data. Copies of one announcement dedupe on every path; two announcements never share
/// an id unless they carry identical bytes from the same publisher with the same sequence. The
/// header is not signed (see [`behaviour`]): a peer forging it only makes a copy look like
/// another announcement, which the application then drops as a recent refresh (without a
/// signature check: the bytes verified before).
///
/// Why not SHA-256 of the data alone: libp2p-gossipsub 0.50.1 refuses to publish a message id
/// that is in its duplicate cache, and `DuplicateCache::contains` does not expire entries (only
/// `insert` sweeps). On a quiet network a provider's identical re-announcement would be refused
/// as `Duplicate` forever, and late joiners would never learn the offer. Re-announcements are
/// instead deduplicated by the application: a refresh of a held offer is forwarded at most once
/// per half announce period (see `OfferIgnore::RecentlyRefreshed`).
pub fn message_id(m: &gossipsub::Message) -> MessageId {
    let mut h = Sha256::new();
    h.update(b"gridlease/v1/gossip-id\0");
    if let Some(source) = &m.source {
        h.update(source.to_bytes());
    }
    h.update(m.sequence_number.unwrap_or(0).to_be_bytes());
    h.update(&m.data);
    MessageId::from(h.finalize().to_vec())
}

/// Score thresholds. One invalid offer costs -10 (below `gossip_threshold`: no gossip exchanged
/// with that peer), two cost -40, three -90 (below `graylist_threshold`: everything from the
/// peer is ignored). Honest peers can earn at most +10 (`topic_score_cap`), so a few invalid
/// messages always dominate good behaviour.
pub fn thresholds() -> PeerScoreThresholds {
    PeerScoreThresholds {
        gossip_threshold: -10.0,
        publish_threshold: -50.0,
        graylist_threshold: -80.0,
        accept_px_threshold: 5.0,
        opportunistic_graft_threshold: 3.0,
    }
}

/// Score parameters of an offer topic (every offer's, or a class's).
pub fn offer_topic_params() -> TopicScoreParams {
    TopicScoreParams {
        topic_weight: 1.0,
        // P1: time in mesh, up to +1 after 10 s.
        time_in_mesh_weight: 0.1,
        time_in_mesh_quantum: Duration::from_secs(1),
        time_in_mesh_cap: 10.0,
        // P2: first deliveries of valid offers, up to +5.
        first_message_deliveries_weight: 0.5,
        first_message_deliveries_decay: gossipsub::score_parameter_decay(Duration::from_secs(600)),
        first_message_deliveries_cap: 10.0,
        // P3/P3b off: offers are sparse and bursty; a quiet mesh peer is not a bad peer.
        mesh_message_deliveries_weight: 0.0,
        mesh_failure_penalty_weight: 0.0,
        // P4: invalid offers, squared; decays to zero over about an hour.
        invalid_message_deliveries_weight: -10.0,
        invalid_message_deliveries_decay: gossipsub::score_parameter_decay(Duration::from_secs(
            3600,
        )),
        ..TopicScoreParams::default()
    }
}

/// Score parameters for the offer and completion topics (class topics get theirs when
/// subscribed: [`offer_topic_params`]).
pub fn score_params(network: &NetworkId) -> PeerScoreParams {
    let topic = offer_topic_params();
    let mut params = PeerScoreParams {
        topic_score_cap: 10.0,
        app_specific_weight: 1.0,
        // Several honest nodes behind one NAT or on one host are normal on a GPU market
        // (farms, devnets); only large colocations are penalised, loopback never.
        ip_colocation_factor_threshold: 16.0,
        ..PeerScoreParams::default()
    };
    params
        .ip_colocation_factor_whitelist
        .insert(std::net::IpAddr::from([127, 0, 0, 1]));
    params
        .ip_colocation_factor_whitelist
        .insert(std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST));
    params
        .topics
        .insert(offer_topic(network).hash(), topic.clone());
    // Completions: the same penalty for invalid records; they are rarer than offers.
    params
        .topics
        .insert(completion_topic(network).hash(), topic);
    params
}

/// The gossipsub behaviour: authored but unsigned gossipsub messages, application validation,
/// content ids, capped size, scoring.
///
/// Why gossipsub's own message signatures are off: every offer is already an ed25519-signed
/// envelope from its provider, strictly verified by the application (steps 2-3 above), and the
/// forwarding peer is authenticated by the Noise connection (that is who gossipsub's scoring
/// penalises). With `ValidationMode::Strict` each received message cost a second signature check
/// (libp2p's, over a protobuf re-encoding) that proved only which peer first published the
/// bytes, which nothing here relies on: a node ingested at most half the offers per CPU-second
/// that its own pipeline allows. Messages still carry a source and a random sequence number
/// (`MessageAuthenticity::Author`), which the message id needs (see [`message_id`]);
/// `Permissive` checks their format and would still verify a signature if a peer sent one.
pub fn behaviour(
    key: &identity::Keypair,
    config: &NodeConfig,
) -> Result<gossipsub::Behaviour, BuildError> {
    let gs_config = gossipsub::ConfigBuilder::default()
        .validation_mode(ValidationMode::Permissive)
        .validate_messages()
        .message_id_fn(message_id)
        .max_transmit_size(MAX_TRANSMIT_SIZE)
        .heartbeat_interval(config.heartbeat)
        .duplicate_cache_time(config.duplicate_cache_time())
        .build()
        .map_err(|e| BuildError::Gossip(e.to_string()))?;
    let author = MessageAuthenticity::Author(key.public().to_peer_id());
    let mut gs = gossipsub::Behaviour::new(author, gs_config)
        .map_err(|e| BuildError::Gossip(e.to_string()))?;
    gs.with_peer_score(score_params(&config.network), thresholds())
        .map_err(BuildError::Gossip)?;
    if !config.subscribes_late() {
        for topic in followed_topics(&config.network, config.follow.as_deref()) {
            subscribe_offers(&mut gs, &topic).map_err(BuildError::Gossip)?;
        }
    }
    gs.subscribe(&completion_topic(&config.network))
        .map_err(|e| BuildError::Gossip(e.to_string()))?;
    Ok(gs)
}

/// Subscribes to an offer topic, with the offer topics' score parameters.
pub fn subscribe_offers(gs: &mut gossipsub::Behaviour, topic: &IdentTopic) -> Result<(), String> {
    gs.set_topic_params(topic.clone(), offer_topic_params())
        .map_err(str::to_string)?;
    gs.subscribe(topic).map_err(|e| e.to_string())?;
    Ok(())
}

/// Why an offer was rejected (the sender is penalised).
#[derive(Debug, thiserror::Error)]
pub enum OfferRejection {
    /// Undecodable, wrong network, bad signature.
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// Breaks an offer rule.
    #[error(transparent)]
    Invalid(#[from] OfferError),
    /// Replayed sequence or equivocation.
    #[error(transparent)]
    Book(BookError),
    /// An offer of one GPU class on another class's topic.
    #[error("an offer of GPU class {class} on the topic of class {topic}")]
    WrongTopic {
        /// The offer's class.
        class: String,
        /// The topic's class.
        topic: String,
    },
}

/// Why an offer was ignored (dropped without penalty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfferIgnore {
    /// The forwarding peer's score is below the graylist threshold.
    #[error("forwarding peer is graylisted")]
    Graylisted,
    /// The forwarding peer is over its message rate.
    #[error("forwarding peer over its rate")]
    PeerRateLimited,
    /// The provider is announcing new offers too fast.
    #[error("provider announcing too fast")]
    ProviderRateLimited,
    /// Expired within the clock-skew allowance (may have expired in flight).
    #[error("expired in flight")]
    JustExpired,
    /// The book is full of longer-lived offers.
    #[error("offer book full")]
    BookFull,
    /// A refresh of an offer that was already refreshed less than half an announce period ago.
    #[error("offer refreshed too recently")]
    RecentlyRefreshed,
    /// Of a GPU class this node does not follow, or on a topic it does not take offers from.
    #[error("offer of a GPU class this node does not follow")]
    NotFollowed,
}

/// A verified offer ready for the book.
#[derive(Debug)]
pub struct ValidOffer {
    /// As received.
    pub signed: Signed<Offer>,
    /// Decoded.
    pub offer: Offer,
    /// Content id.
    pub id: OfferId,
    /// What the book will do.
    pub admission: Admission,
}

/// The verdict on one gossiped offer.
#[derive(Debug)]
pub enum Verdict {
    /// Valid: admit and forward.
    Accept(Box<ValidOffer>),
    /// The offer the book holds, byte for byte (a re-announcement): valid, nothing to admit;
    /// forward it (rate limits aside).
    Refresh(OfferId),
    /// Invalid: penalise the sender.
    Reject(OfferRejection),
    /// Drop quietly.
    Ignore(OfferIgnore),
}

/// Step 5c: a class topic carries only offers of its class (`topic_class`; `None`, the topic
/// of every offer, carries any). A valid offer on the wrong class topic is rejected, so the
/// peer that forwarded it is penalised: honest nodes check before forwarding. A held offer
/// recognised from its bytes (a refresh) is checked with the class the book keeps for it.
pub fn check_topic(verdict: Verdict, topic_class: Option<&str>, book: &OfferBook) -> Verdict {
    let Some(topic) = topic_class else {
        return verdict;
    };
    let class = match &verdict {
        Verdict::Accept(v) => gridlease_protocol::class::offer_class(&v.offer),
        Verdict::Refresh(id) => book.class_of(id).unwrap_or_default().to_string(),
        Verdict::Reject(_) | Verdict::Ignore(_) => return verdict,
    };
    if class == topic {
        verdict
    } else {
        Verdict::Reject(OfferRejection::WrongTopic {
            class,
            topic: topic.to_string(),
        })
    }
}

/// Steps 2-5 of the validation (rate limits are the caller's, they need mutable state).
///
/// A re-announcement of an offer the book holds (same signer, signature bytes and payload,
/// still live) is recognised first, from the frame read in place: no hashing, no signature
/// check, no decoding of the offer, no copy ([`Verdict::Refresh`]). Anything else goes through
/// the node's [`OfferIngestor`]:
/// the envelope is decoded in place, provider keys are decompressed once, and a message
/// byte-identical to one it verified before skips the signature check (it is still decoded
/// and validated at `now`).
pub fn check_offer(
    data: &[u8],
    ingestor: &mut OfferIngestor,
    book: &OfferBook,
    now: Timestamp,
) -> Verdict {
    if let Some(id) = Signed::<Offer>::view_frame(data, ingestor.network())
        .and_then(|frame| book.holds_frame(&frame, now))
    {
        return Verdict::Refresh(id);
    }
    let verified = match ingestor.ingest(data, now) {
        Ok(v) => v,
        Err(IngestError::Envelope(e)) => return Verdict::Reject(e.into()),
        Err(IngestError::Invalid(e)) => {
            if let OfferError::Expired { expires_at, .. } = e
                && now.ms_since(expires_at) <= MAX_CLOCK_SKEW_S * 1000
            {
                return Verdict::Ignore(OfferIgnore::JustExpired);
            }
            return Verdict::Reject(e.into());
        }
    };
    let id = OfferId(verified.digest);
    match book.check(&verified.message, &id, now) {
        Ok(admission) => {
            // The envelope as received, for the book, the store and re-serving; only offers
            // that get this far pay for the owned copy.
            let signed = match Signed::<Offer>::from_bytes(data) {
                Ok(s) => s,
                Err(e) => return Verdict::Reject(e.into()),
            };
            Verdict::Accept(Box::new(ValidOffer {
                signed,
                offer: verified.message,
                id,
                admission,
            }))
        }
        Err(BookError::Full { .. }) => Verdict::Ignore(OfferIgnore::BookFull),
        Err(BookError::Expired { .. }) => Verdict::Ignore(OfferIgnore::JustExpired),
        Err(e) => Verdict::Reject(OfferRejection::Book(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::NodeKey;
    use gridlease_protocol::fixtures::{self, T0};

    fn offer(key: &NodeKey, seq: u64, created: Timestamp, ttl_s: u64) -> Offer {
        let mut o = fixtures::offer(key.public(), seq, 1, 100_000);
        o.created_at = created;
        o.expires_at = created.plus_secs(ttl_s);
        o
    }

    fn bytes(key: &NodeKey, net: &NetworkId, o: &Offer) -> Vec<u8> {
        Signed::sign(key, net, o).unwrap().to_bytes().unwrap()
    }

    #[test]
    fn verdicts() {
        let net = NetworkId::devnet();
        let key = NodeKey::from_secret([9; 32]);
        let mut book = OfferBook::default();
        // No cache of verified messages: only the book can recognise a re-announcement.
        let mut ing = OfferIngestor::with_caches(net.clone(), 64, 0);
        let now = T0.plus_secs(10);

        let good = bytes(&key, &net, &offer(&key, 5, T0, 300));
        let Verdict::Accept(v) = check_offer(&good, &mut ing, &book, now) else {
            panic!("valid offer not accepted");
        };
        assert_eq!(v.admission, Admission::New);
        let held = v.id;
        book.admit(v.signed, v.offer, v.id, now).unwrap();
        let checked = ing.stats().checked;
        assert!(matches!(
            check_offer(&good, &mut ing, &book, now),
            Verdict::Refresh(id) if id == held
        ));
        assert_eq!(
            ing.stats().checked,
            checked,
            "the held offer is not verified again"
        );
        // Once the held offer has expired, a copy is judged in full again.
        assert!(matches!(
            check_offer(&good, &mut ing, &book, T0.plus_secs(300)),
            Verdict::Ignore(OfferIgnore::JustExpired)
        ));

        // The refresh above skipped the signature check (the book holds these bytes); a copy
        // with one signature bit flipped is not taken for it.
        let mut tampered = good.clone();
        // version, kind, "devnet", signer (1 + 32): the signature starts at byte 43.
        tampered[50] ^= 1;
        assert!(matches!(
            check_offer(&tampered, &mut ing, &book, now),
            Verdict::Reject(OfferRejection::Envelope(_))
        ));

        let replay = bytes(&key, &net, &offer(&key, 4, T0, 300));
        assert!(matches!(
            check_offer(&replay, &mut ing, &book, now),
            Verdict::Reject(OfferRejection::Book(BookError::Replay { .. }))
        ));
        let equivocation = bytes(&key, &net, &offer(&key, 5, T0.plus_secs(1), 300));
        assert!(matches!(
            check_offer(&equivocation, &mut ing, &book, now),
            Verdict::Reject(OfferRejection::Book(BookError::Equivocation { .. }))
        ));
        // The held offer's signature on other content is not taken for the held offer.
        let mut forged = Signed::<Offer>::from_bytes(&equivocation)
            .unwrap()
            .into_envelope();
        forged.signature = Signed::<Offer>::from_bytes(&good)
            .unwrap()
            .envelope()
            .signature;
        assert!(matches!(
            check_offer(&forged.to_bytes().unwrap(), &mut ing, &book, now),
            Verdict::Reject(OfferRejection::Envelope(EnvelopeError::BadSignature { .. }))
        ));

        let other = NetworkId::new("othernet").unwrap();
        let wrong_net = bytes(&key, &other, &offer(&key, 6, T0, 300));
        assert!(matches!(
            check_offer(&wrong_net, &mut ing, &book, now),
            Verdict::Reject(OfferRejection::Envelope(EnvelopeError::WrongNetwork { .. }))
        ));

        // Signed by one key, naming another provider.
        let thief = NodeKey::from_secret([8; 32]);
        let stolen = bytes(&thief, &net, &offer(&key, 7, T0, 300));
        assert!(matches!(
            check_offer(&stolen, &mut ing, &book, now),
            Verdict::Reject(OfferRejection::Invalid(
                OfferError::NotSignedByProvider { .. }
            ))
        ));

        // Expired 30 s ago: may have expired in flight. Expired 10 min ago: invalid.
        let just = bytes(&key, &net, &offer(&key, 8, T0, 5));
        assert!(matches!(
            check_offer(&just, &mut ing, &book, T0.plus_secs(35)),
            Verdict::Ignore(OfferIgnore::JustExpired)
        ));
        assert!(matches!(
            check_offer(&just, &mut ing, &book, T0.plus_secs(605)),
            Verdict::Reject(OfferRejection::Invalid(OfferError::Expired { .. }))
        ));

        assert!(matches!(
            check_offer(b"not an envelope", &mut ing, &book, now),
            Verdict::Reject(OfferRejection::Envelope(_))
        ));
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic the validator and are never accepted.
        #[test]
        fn arbitrary_bytes_are_never_accepted(data in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            let book = OfferBook::default();
            let mut ing = OfferIngestor::new(NetworkId::devnet(), 4);
            let v = check_offer(&data, &mut ing, &book, T0);
            proptest::prop_assert!(!matches!(v, Verdict::Accept(_)));
        }
    }
}
