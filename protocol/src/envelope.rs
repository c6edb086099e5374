//! Signed envelopes: `Signed<T>` = payload bytes + signer + signature.
//!
//! The signature covers `"gridlease\0" || version || domain tag || "\0" || len(network) ||
//! network || payload`. The domain tag differs per message kind, so an offer signature can never
//! be replayed as a receipt, and the network id is bound in, so a devnet message is worthless on
//! another network. Verification checks the exact received payload bytes with
//! `verify_strict` *before* decoding them; nothing is ever re-encoded to verify.

use std::fmt;
use std::marker::PhantomData;

use ed25519_dalek::{Signature, VerifyingKey};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

use crate::codec::{self, CodecError};
use crate::identity::{NodeKey, PublicKey};
use crate::types::Digest;

/// Version of the envelope and signing layout. Bumped on any incompatible change.
pub const PROTOCOL_VERSION: u16 = 1;

/// Envelope bytes beyond the payload, at most: version (varint u16: up to 3), kind (1), network
/// id (1 + 32), signer (1 + 32), signature (1 + 64), payload length (varint: up to 5 for any
/// payload under [`codec::MAX_FRAME_BYTES`]).
pub const ENVELOPE_OVERHEAD: usize = 3 + 1 + (1 + NetworkId::MAX_LEN) + (1 + 32) + (1 + 64) + 5;

/// The kinds of signed message. Each has its own domain tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MessageKind {
    /// A provider's offer (gossip).
    Offer,
    /// A renter's proposed lease terms.
    LeaseRequest,
    /// The provider's signature over the same terms.
    LeaseAccept,
    /// The provider's refusal, with a reason.
    LeaseReject,
    /// Provider-signed metered usage.
    UsageReport,
    /// Renter-signed cumulative payment.
    PaymentReceipt,
    /// Either side closing a lease.
    LeaseClose,
    /// A provider's GPU benchmark result.
    BenchReport,
    /// A renter's proposed amendment of a running lease (a longer duration).
    LeaseAmendment,
    /// The provider's signature over the same amendment.
    AmendAccept,
    /// A provider's record of a settled lease.
    Completion,
    /// The renter's signature over the same record.
    CompletionAck,
    /// A renter's proof-of-GPU challenge (`crate::proof`).
    ProofChallenge,
    /// The provider's commitment to its answer.
    ProofCommit,
    /// The provider's openings of that commitment.
    ProofOpening,
    /// The renter's transcript and verdict.
    ProofReport,
    /// The provider's signature over a passed report.
    ProofAck,
    /// A node's binding of its wallet address (`crate::wallet`).
    WalletBinding,
}

impl MessageKind {
    /// The domain-separation tag signed in front of every payload of this kind.
    pub const fn domain_tag(self) -> &'static str {
        match self {
            Self::Offer => "gridlease/v1/offer",
            Self::LeaseRequest => "gridlease/v1/lease-request",
            Self::LeaseAccept => "gridlease/v1/lease-accept",
            Self::LeaseReject => "gridlease/v1/lease-reject",
            Self::UsageReport => "gridlease/v1/usage-report",
            Self::PaymentReceipt => "gridlease/v1/payment-receipt",
            Self::LeaseClose => "gridlease/v1/lease-close",
            Self::BenchReport => "gridlease/v1/bench-report",
            Self::LeaseAmendment => "gridlease/v1/lease-amendment",
            Self::AmendAccept => "gridlease/v1/amend-accept",
            Self::Completion => "gridlease/v1/completion",
            Self::CompletionAck => "gridlease/v1/completion-ack",
            Self::ProofChallenge => "gridlease/v1/proof-challenge",
            Self::ProofCommit => "gridlease/v1/proof-commit",
            Self::ProofOpening => "gridlease/v1/proof-opening",
            Self::ProofReport => "gridlease/v1/proof-report",
            Self::ProofAck => "gridlease/v1/proof-ack",
            Self::WalletBinding => "gridlease/v1/wallet-binding",
        }
    }
}

/// Which market a message belongs to (`devnet`, or a named network). 1-32 of `[a-z0-9-]`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct NetworkId(String);

/// A string that is not a valid network id.
#[derive(Debug, thiserror::Error)]
#[error("invalid network id {0:?}: use 1-32 characters of a-z, 0-9 and '-'")]
pub struct InvalidNetworkId(pub String);

impl NetworkId {
    /// Longest network id.
    pub const MAX_LEN: usize = 32;

    /// The local development network.
    pub fn devnet() -> Self {
        Self("devnet".to_string())
    }

    /// Validates and wraps a network name.
    pub fn new(name: &str) -> Result<Self, InvalidNetworkId> {
        let ok = !name.is_empty()
            && name.len() <= Self::MAX_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if ok {
            Ok(Self(name.to_string()))
        } else {
            Err(InvalidNetworkId(name.to_string()))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for NetworkId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(&s).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for NetworkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NetworkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NetworkId({})", self.0)
    }
}

impl std::str::FromStr for NetworkId {
    type Err = InvalidNetworkId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// A 64-byte ed25519 signature as it travels.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SignatureBytes(pub [u8; 64]);

impl fmt::Debug for SignatureBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sig({}..)", hex::encode(&self.0[..8]))
    }
}

impl Serialize for SignatureBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde_bytes::serialize(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for SignatureBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde_bytes::deserialize(d).map(SignatureBytes)
    }
}

/// A message type that travels signed. Implemented for every wire message in [`crate::messages`].
pub trait WireMessage: Serialize + DeserializeOwned + Sized {
    /// Which kind (and so which domain tag).
    const KIND: MessageKind;
    /// Cap on the encoded payload.
    const MAX_BYTES: usize;
    /// Encodes with this kind's cap.
    fn encode_payload(&self) -> Result<Vec<u8>, CodecError>;
    /// Decodes with this kind's cap, rejecting trailing bytes.
    fn decode_payload(bytes: &[u8]) -> Result<Self, CodecError>;
}

/// Implements [`WireMessage`] with a literal cap (const generics need a concrete value).
macro_rules! wire_message {
    ($ty:ty, $kind:expr, $max:expr) => {
        impl $crate::envelope::WireMessage for $ty {
            const KIND: $crate::envelope::MessageKind = $kind;
            const MAX_BYTES: usize = $max;
            fn encode_payload(&self) -> Result<Vec<u8>, $crate::codec::CodecError> {
                $crate::codec::encode::<Self, { $max }>(self)
            }
            fn decode_payload(bytes: &[u8]) -> Result<Self, $crate::codec::CodecError> {
                $crate::codec::decode::<Self, { $max }>(bytes)
            }
        }
    };
}
pub(crate) use wire_message;

/// Why an envelope was refused.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// The envelope or its payload failed to decode.
    #[error("undecodable {kind:?}: {source}")]
    Codec {
        /// The kind expected.
        kind: MessageKind,
        /// The codec error.
        #[source]
        source: CodecError,
    },
    /// Another protocol version.
    #[error("unsupported protocol version {got} (this node speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion {
        /// The version received.
        got: u16,
    },
    /// Another kind of message than expected.
    #[error("expected a {expected:?} message, got {got:?}")]
    WrongKind {
        /// What the caller expected.
        expected: MessageKind,
        /// What the envelope says.
        got: MessageKind,
    },
    /// Signed for another network.
    #[error("message is for network {got}, this node is on {expected}")]
    WrongNetwork {
        /// This node's network.
        expected: NetworkId,
        /// The envelope's network.
        got: NetworkId,
    },
    /// The signer field is not a usable ed25519 public key.
    #[error("signer is not a valid ed25519 public key")]
    BadSignerKey,
    /// The signature does not verify (strictly) over the received bytes.
    #[error("signature does not verify for signer {signer}")]
    BadSignature {
        /// The claimed signer.
        signer: PublicKey,
    },
}

/// The untyped signed envelope, exactly as it travels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Envelope layout version ([`PROTOCOL_VERSION`]).
    pub version: u16,
    /// Message kind; selects the domain tag.
    pub kind: MessageKind,
    /// The network the signer meant this for.
    pub network: NetworkId,
    /// Who signed.
    pub signer: PublicKey,
    /// ed25519 signature over [`signing_input`].
    pub signature: SignatureBytes,
    /// The encoded message, verified before it is decoded.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}

/// [`Envelope`] decoded in place: the network id and the payload point into the received frame,
/// so ingestion copies nothing before the signature is checked. Same fields, same order, same
/// encoding as [`Envelope`] (a test decodes both ways).
#[derive(Deserialize)]
struct EnvelopeRef<'a> {
    version: u16,
    kind: MessageKind,
    network: &'a str,
    signer: PublicKey,
    signature: SignatureBytes,
    payload: &'a [u8],
}

/// A received frame of a known kind and network, read in place ([`Signed::view_frame`]);
/// nothing in it is verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameView<'a> {
    network: &'a str,
    /// Who claims to have signed.
    pub signer: PublicKey,
    /// The signature bytes, as received.
    pub signature: SignatureBytes,
    /// The encoded message, as received.
    pub payload: &'a [u8],
}

impl FrameView<'_> {
    /// The network id the frame names (checked by [`Signed::view_frame`] to be the node's).
    pub fn network(&self) -> &str {
        self.network
    }
}

/// The exact bytes an envelope's signature covers.
pub fn signing_input(kind: MessageKind, network: &NetworkId, payload: &[u8]) -> Vec<u8> {
    let tag = kind.domain_tag().as_bytes();
    let net = network.as_str().as_bytes();
    let mut out = Vec::with_capacity(10 + 2 + tag.len() + 2 + net.len() + payload.len());
    out.extend_from_slice(b"gridlease\0");
    out.extend_from_slice(&PROTOCOL_VERSION.to_be_bytes());
    out.extend_from_slice(tag);
    out.push(0);
    // NetworkId::MAX_LEN is 32, so the length fits a byte.
    out.push(net.len() as u8);
    out.extend_from_slice(net);
    out.extend_from_slice(payload);
    out
}

impl Envelope {
    /// Decodes an envelope, refusing more than `max_payload` + overhead bytes.
    pub fn from_bytes(bytes: &[u8], kind: MessageKind) -> Result<Self, EnvelopeError> {
        codec::decode::<Self, { codec::MAX_FRAME_BYTES }>(bytes)
            .map_err(|source| EnvelopeError::Codec { kind, source })
    }

    /// Encodes the envelope.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CodecError> {
        codec::encode::<Self, { codec::MAX_FRAME_BYTES }>(self)
    }

    /// The content id: SHA-256 of the signer and the signed input. Independent of the
    /// signature bytes, so a malleated signature over the same content has the same id; bound
    /// to the signer, so nobody can claim another key's content under this id.
    pub fn content_digest(&self) -> Digest {
        content_digest_of(
            &self.signer,
            &signing_input(self.kind, &self.network, &self.payload),
        )
    }

    /// The exact bytes this envelope's signature covers.
    pub fn signing_input(&self) -> Vec<u8> {
        signing_input(self.kind, &self.network, &self.payload)
    }

    /// The cheap checks that need no cryptography: version, kind, network.
    fn check_header(
        &self,
        expected: MessageKind,
        network: &NetworkId,
    ) -> Result<(), EnvelopeError> {
        if self.version != PROTOCOL_VERSION {
            return Err(EnvelopeError::UnsupportedVersion { got: self.version });
        }
        if self.kind != expected {
            return Err(EnvelopeError::WrongKind {
                expected,
                got: self.kind,
            });
        }
        if &self.network != network {
            return Err(EnvelopeError::WrongNetwork {
                expected: network.clone(),
                got: self.network.clone(),
            });
        }
        Ok(())
    }

    fn verify_signature(&self, key: &VerifyingKey, input: &[u8]) -> Result<(), EnvelopeError> {
        verify_strict(key, &self.signer, &self.signature, input)
    }
}

fn verify_strict(
    key: &VerifyingKey,
    signer: &PublicKey,
    signature: &SignatureBytes,
    input: &[u8],
) -> Result<(), EnvelopeError> {
    key.verify_strict(input, &Signature::from_bytes(&signature.0))
        .map_err(|_| EnvelopeError::BadSignature { signer: *signer })
}

fn check_payload_len<T: WireMessage>(payload: &[u8]) -> Result<(), EnvelopeError> {
    if payload.len() > T::MAX_BYTES {
        return Err(EnvelopeError::Codec {
            kind: T::KIND,
            source: CodecError::TooLarge {
                len: payload.len(),
                max: T::MAX_BYTES,
            },
        });
    }
    Ok(())
}

fn decode_verified<T: WireMessage>(
    signer: PublicKey,
    payload: &[u8],
    digest: Digest,
) -> Result<Verified<T>, EnvelopeError> {
    let message = T::decode_payload(payload).map_err(|source| EnvelopeError::Codec {
        kind: T::KIND,
        source,
    })?;
    Ok(Verified {
        signer,
        message,
        digest,
    })
}

/// The one verification path behind [`Signed::verify_with`] and [`Signed::verify_frame`], for
/// a header already checked: strict signature over the exact payload bytes unless this exact
/// (content, signature) verified before, then decode.
fn verify_through_cache<T: WireMessage>(
    signer: PublicKey,
    signature: &SignatureBytes,
    network: &NetworkId,
    payload: &[u8],
    cache: &mut VerifyCache,
) -> Result<Verified<T>, EnvelopeError> {
    check_payload_len::<T>(payload)?;
    let input = signing_input(T::KIND, network, payload);
    let digest = content_digest_of(&signer, &input);
    if !cache.already_verified(&digest, signature) {
        let key = cache.keys.get(&signer)?;
        cache.stats.checked += 1;
        verify_strict(&key, &signer, signature, &input)?;
        cache.remember(digest, *signature);
    }
    decode_verified(signer, payload, digest)
}

fn content_digest_of(signer: &PublicKey, input: &[u8]) -> Digest {
    let mut h = Sha256::new();
    h.update(signer.0);
    h.update(input);
    Digest(h.finalize().into())
}

/// A bounded cache of decompressed verifying keys. Decompressing a public key costs about a
/// tenth of a verification, and offers come from a bounded set of providers that re-announce,
/// so nodes keep one of these next to their ingestion path, sized to the book (one key per
/// provider it can hold): the least recently used key goes first when it is full. Memory grows
/// with the keys actually seen (about 250 bytes each), not with the capacity.
pub struct KeyCache {
    capacity: usize,
    keys: lru::LruCache<PublicKey, VerifyingKey>,
}

impl fmt::Debug for KeyCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyCache")
            .field("capacity", &self.capacity)
            .field("len", &self.keys.len())
            .finish()
    }
}

impl KeyCache {
    /// A cache of at most `capacity` keys (least recently used eviction).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            keys: lru::LruCache::unbounded(),
        }
    }

    /// The verifying key for `signer`, decompressed once. Refuses bytes that are not a point
    /// and keys of small order (as `verify_strict` would).
    pub fn get(&mut self, signer: &PublicKey) -> Result<VerifyingKey, EnvelopeError> {
        if let Some(k) = self.keys.get(signer) {
            return Ok(*k);
        }
        let key = VerifyingKey::from_bytes(&signer.0).map_err(|_| EnvelopeError::BadSignerKey)?;
        if key.is_weak() {
            return Err(EnvelopeError::BadSignerKey);
        }
        self.keys.put(*signer, key);
        if self.keys.len() > self.capacity {
            self.keys.pop_lru();
        }
        Ok(key)
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether `signer`'s key is held (without touching its recency).
    pub fn contains(&self, signer: &PublicKey) -> bool {
        self.keys.contains(signer)
    }
}

/// What a node remembers to make verification cheaper: decompressed keys, and which exact
/// (content, signature) pairs already verified. Both bounded (FIFO eviction).
///
/// A re-announced offer is byte-identical to one verified before (ed25519 signatures are
/// deterministic), so its signature check can be skipped; an entry matches only the same
/// content id (signer included) with the same signature bytes, and enters the cache only after
/// a successful verification, so an unverified variant is never let through.
#[derive(Debug)]
pub struct VerifyCache {
    keys: KeyCache,
    capacity: usize,
    seen: std::collections::HashMap<Digest, SignatureBytes>,
    order: std::collections::VecDeque<Digest>,
    stats: VerifyStats,
}

/// Signature work done through a [`VerifyCache`] since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifyStats {
    /// Signatures checked (one by one or in a batch).
    pub checked: u64,
    /// Messages identical to one verified before, accepted without a signature check.
    pub skipped: u64,
}

impl VerifyCache {
    /// Remembers up to `keys` provider keys and `verified` verified messages.
    pub fn new(keys: usize, verified: usize) -> Self {
        Self {
            keys: KeyCache::new(keys),
            capacity: verified,
            seen: std::collections::HashMap::new(),
            order: std::collections::VecDeque::new(),
            stats: VerifyStats::default(),
        }
    }

    fn already_verified(&mut self, digest: &Digest, sig: &SignatureBytes) -> bool {
        let hit = self.seen.get(digest) == Some(sig);
        if hit {
            self.stats.skipped += 1;
        }
        hit
    }

    /// Signatures checked and skipped so far.
    pub fn stats(&self) -> VerifyStats {
        self.stats
    }

    fn remember(&mut self, digest: Digest, sig: SignatureBytes) {
        if self.capacity == 0 {
            return;
        }
        if self.seen.insert(digest, sig).is_none() {
            self.order.push_back(digest);
            if self.order.len() > self.capacity
                && let Some(old) = self.order.pop_front()
            {
                self.seen.remove(&old);
            }
        }
    }

    /// Verified messages remembered.
    pub fn remembered(&self) -> usize {
        self.order.len()
    }

    /// The key cache.
    pub fn keys(&mut self) -> &mut KeyCache {
        &mut self.keys
    }
}

/// A typed signed message. Holding one says nothing about validity: call [`Signed::verify`].
#[derive(Clone, PartialEq, Eq)]
pub struct Signed<T> {
    envelope: Envelope,
    _t: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for Signed<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signed")
            .field("kind", &self.envelope.kind)
            .field("signer", &self.envelope.signer)
            .field("payload_len", &self.envelope.payload.len())
            .finish()
    }
}

impl<T> Serialize for Signed<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.envelope.serialize(s)
    }
}

impl<'de, T> Deserialize<'de> for Signed<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self {
            envelope: Envelope::deserialize(d)?,
            _t: PhantomData,
        })
    }
}

/// A message whose signature verified and whose payload decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified<T> {
    /// Who signed it.
    pub signer: PublicKey,
    /// The decoded message.
    pub message: T,
    /// The content id ([`Envelope::content_digest`]).
    pub digest: Digest,
}

impl<T: WireMessage> Signed<T> {
    /// Encodes and signs `message` for `network`.
    pub fn sign(key: &NodeKey, network: &NetworkId, message: &T) -> Result<Self, CodecError> {
        let payload = message.encode_payload()?;
        let signature = key.sign_raw(&signing_input(T::KIND, network, &payload));
        Ok(Self {
            envelope: Envelope {
                version: PROTOCOL_VERSION,
                kind: T::KIND,
                network: network.clone(),
                signer: key.public(),
                signature: SignatureBytes(signature),
                payload,
            },
            _t: PhantomData,
        })
    }

    /// Wraps an untyped envelope; the kind is checked again at verification.
    pub fn from_envelope(envelope: Envelope) -> Self {
        Self {
            envelope,
            _t: PhantomData,
        }
    }

    /// Decodes from the wire, refusing more than `T::MAX_BYTES` plus envelope overhead.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        Self::check_frame_len(bytes)?;
        Envelope::from_bytes(bytes, T::KIND).map(Self::from_envelope)
    }

    /// Encodes for the wire.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CodecError> {
        self.envelope.to_bytes()
    }

    /// The envelope as it travels.
    pub fn envelope(&self) -> &Envelope {
        &self.envelope
    }

    /// Consumes into the untyped envelope.
    pub fn into_envelope(self) -> Envelope {
        self.envelope
    }

    /// Who claims to have signed (not yet verified).
    pub fn signer(&self) -> PublicKey {
        self.envelope.signer
    }

    /// Checks header, then the strict signature over the exact payload bytes, then decodes.
    pub fn verify(&self, network: &NetworkId) -> Result<Verified<T>, EnvelopeError> {
        self.verify_cached(network, &mut KeyCache::new(1))
    }

    /// [`Signed::verify`], taking the signer's decompressed key from `keys`.
    pub fn verify_cached(
        &self,
        network: &NetworkId,
        keys: &mut KeyCache,
    ) -> Result<Verified<T>, EnvelopeError> {
        let env = &self.envelope;
        env.check_header(T::KIND, network)?;
        check_payload_len::<T>(&env.payload)?;
        let key = keys.get(&env.signer)?;
        let input = env.signing_input();
        env.verify_signature(&key, &input)?;
        decode_verified(
            env.signer,
            &env.payload,
            content_digest_of(&env.signer, &input),
        )
    }

    /// [`Signed::verify`] through a [`VerifyCache`]: a message identical (content, signer and
    /// signature) to one verified before skips the signature check; anything else is verified
    /// strictly and remembered.
    pub fn verify_with(
        &self,
        network: &NetworkId,
        cache: &mut VerifyCache,
    ) -> Result<Verified<T>, EnvelopeError> {
        let env = &self.envelope;
        env.check_header(T::KIND, network)?;
        verify_through_cache(env.signer, &env.signature, network, &env.payload, cache)
    }

    /// Decodes and verifies a received frame in one step, copying nothing before the signature
    /// is checked: the same checks and results as `Signed::from_bytes(frame)?.verify_with(..)`,
    /// without building the owned envelope. What ingestion paths use.
    pub fn verify_frame(
        frame: &[u8],
        network: &NetworkId,
        cache: &mut VerifyCache,
    ) -> Result<Verified<T>, EnvelopeError> {
        Self::check_frame_len(frame)?;
        let env: EnvelopeRef<'_> = codec::decode_borrowed::<_, { codec::MAX_FRAME_BYTES }>(frame)
            .map_err(|source| EnvelopeError::Codec {
            kind: T::KIND,
            source,
        })?;
        if env.version != PROTOCOL_VERSION || env.kind != T::KIND || env.network != network.as_str()
        {
            // Rare: decode the owned envelope so the error is exactly the owned path's (an
            // invalid network id is a decode error there, a valid other one `WrongNetwork`).
            Envelope::from_bytes(frame, T::KIND)?.check_header(T::KIND, network)?;
        }
        verify_through_cache(env.signer, &env.signature, network, env.payload, cache)
    }

    /// A received frame read in place, without verifying or copying anything: `None` when it
    /// does not decode or is not a current-version `T` for `network`. With
    /// [`Signed::is_frame`], a node recognises a copy of a message it verified before.
    pub fn view_frame<'a>(frame: &'a [u8], network: &NetworkId) -> Option<FrameView<'a>> {
        Self::check_frame_len(frame).ok()?;
        let env: EnvelopeRef<'a> =
            codec::decode_borrowed::<_, { codec::MAX_FRAME_BYTES }>(frame).ok()?;
        if env.version != PROTOCOL_VERSION || env.kind != T::KIND || env.network != network.as_str()
        {
            return None;
        }
        check_payload_len::<T>(env.payload).ok()?;
        Some(FrameView {
            network: env.network,
            signer: env.signer,
            signature: env.signature,
            payload: env.payload,
        })
    }

    /// True when `frame` is this very message: same signer, signature bytes, network and
    /// payload (the version and kind were checked by [`Signed::view_frame`]). Signature
    /// verification is a function of exactly these, so a frame that is a message verified
    /// before need not be verified again. Costs a comparison, no hashing.
    pub fn is_frame(&self, frame: &FrameView<'_>) -> bool {
        let env = &self.envelope;
        env.signer == frame.signer
            && env.signature == frame.signature
            && env.kind == T::KIND
            && env.version == PROTOCOL_VERSION
            && env.network.as_str() == frame.network
            && env.payload == frame.payload
    }

    fn check_frame_len(frame: &[u8]) -> Result<(), EnvelopeError> {
        let max = T::MAX_BYTES + ENVELOPE_OVERHEAD;
        if frame.len() > max {
            return Err(EnvelopeError::Codec {
                kind: T::KIND,
                source: CodecError::TooLarge {
                    len: frame.len(),
                    max,
                },
            });
        }
        Ok(())
    }

    /// Verifies many envelopes at once with ed25519 batch verification, falling back to
    /// one-by-one strict verification when the batch fails, so one bad signature never hides
    /// good ones. Results are in input order.
    ///
    /// Strictness: keys of small order are refused, as `verify_strict` does. The batch equation
    /// is not cofactored and does not check `R` for small order or a torsion component, which
    /// `verify_strict` does; the only signatures accepted here and refused there are ones that
    /// only the key holder can make (a malleated `R`), and they never change the content id,
    /// which ignores signature bytes.
    pub fn verify_batch(
        items: &[&Self],
        network: &NetworkId,
    ) -> Vec<Result<Verified<T>, EnvelopeError>> {
        Self::verify_batch_cached(items, network, &mut VerifyCache::new(items.len(), 0))
    }

    /// [`Signed::verify_batch`] through a [`VerifyCache`]: messages verified before skip the
    /// batch; the rest are batch-verified and remembered.
    pub fn verify_batch_cached(
        items: &[&Self],
        network: &NetworkId,
        cache: &mut VerifyCache,
    ) -> Vec<Result<Verified<T>, EnvelopeError>> {
        let mut results: Vec<Option<Result<Verified<T>, EnvelopeError>>> =
            (0..items.len()).map(|_| None).collect();
        let mut idx = Vec::with_capacity(items.len());
        let mut inputs = Vec::with_capacity(items.len());
        let mut digests = Vec::with_capacity(items.len());
        let mut sigs = Vec::with_capacity(items.len());
        let mut vks = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let env = &item.envelope;
            if let Err(e) = env
                .check_header(T::KIND, network)
                .and_then(|()| check_payload_len::<T>(&env.payload))
            {
                results[i] = Some(Err(e));
                continue;
            }
            let input = env.signing_input();
            let digest = content_digest_of(&env.signer, &input);
            if cache.already_verified(&digest, &env.signature) {
                results[i] = Some(decode_verified(env.signer, &env.payload, digest));
                continue;
            }
            match cache.keys.get(&env.signer) {
                Ok(key) => {
                    idx.push(i);
                    inputs.push(input);
                    digests.push(digest);
                    sigs.push(Signature::from_bytes(&env.signature.0));
                    vks.push(key);
                }
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        cache.stats.checked += idx.len() as u64;
        let refs: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let batch_ok = !idx.is_empty() && ed25519_dalek::verify_batch(&refs, &sigs, &vks).is_ok();
        for (n, &i) in idx.iter().enumerate() {
            let item = items[i];
            let ok = batch_ok || item.envelope.verify_signature(&vks[n], &inputs[n]).is_ok();
            results[i] = Some(if ok {
                cache.remember(digests[n], item.envelope.signature);
                decode_verified(item.envelope.signer, &item.envelope.payload, digests[n])
            } else {
                Err(EnvelopeError::BadSignature {
                    signer: item.envelope.signer,
                })
            });
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or(Err(EnvelopeError::BadSignerKey)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::CloseReason;
    use crate::messages::LeaseClose;
    use crate::types::{LeaseId, Timestamp};

    fn close() -> LeaseClose {
        LeaseClose {
            lease_id: LeaseId(Digest([9; 32])),
            reason: CloseReason::RenterStop,
            at: Timestamp(1_700_000_000_000),
            exit_code: None,
            failure: None,
        }
    }

    #[test]
    fn the_key_cache_keeps_the_recently_used_keys() {
        let k = |i: u8| NodeKey::from_secret([i; 32]).public();
        let mut c = KeyCache::new(2);
        for i in [1, 2, 1, 3] {
            c.get(&k(i)).unwrap();
        }
        // 2 was the least recently used when 3 came (FIFO would have dropped 1).
        assert_eq!(c.len(), 2);
        assert!(c.contains(&k(1)) && c.contains(&k(3)) && !c.contains(&k(2)));
        // A hostile stream of new keys never grows it beyond capacity.
        for i in 10..60 {
            c.get(&k(i)).unwrap();
        }
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn sign_then_verify() {
        let key = NodeKey::from_secret([1; 32]);
        let net = NetworkId::devnet();
        let signed = Signed::sign(&key, &net, &close()).unwrap();
        let v = signed.verify(&net).unwrap();
        assert_eq!(v.message, close());
        assert_eq!(v.signer, key.public());
        let bytes = signed.to_bytes().unwrap();
        let back = Signed::<LeaseClose>::from_bytes(&bytes).unwrap();
        assert_eq!(back.verify(&net).unwrap().message, close());
    }

    #[test]
    fn a_frame_is_recognised_only_when_it_is_the_same_message() {
        let key = NodeKey::from_secret([1; 32]);
        let net = NetworkId::devnet();
        let signed = Signed::sign(&key, &net, &close()).unwrap();
        let bytes = signed.to_bytes().unwrap();
        let view = Signed::<LeaseClose>::view_frame(&bytes, &net).unwrap();
        assert_eq!(view.signer, key.public());
        assert!(signed.is_frame(&view));

        // Another payload from the same signer, and the same payload with one signature bit
        // flipped (which `verify` would refuse), are not this message.
        let mut later = close();
        later.at = Timestamp(later.at.0 + 1);
        let other = Signed::sign(&key, &net, &later)
            .unwrap()
            .to_bytes()
            .unwrap();
        assert!(!signed.is_frame(&Signed::<LeaseClose>::view_frame(&other, &net).unwrap()));
        // A forgery: the held message's signer and signature over another payload. Taken for
        // the held message, it would skip the signature check that refuses it.
        let mut forged = Signed::<LeaseClose>::from_bytes(&other)
            .unwrap()
            .into_envelope();
        forged.signature = signed.envelope().signature;
        let forged = forged.to_bytes().unwrap();
        assert!(!signed.is_frame(&Signed::<LeaseClose>::view_frame(&forged, &net).unwrap()));
        assert!(
            Signed::<LeaseClose>::from_bytes(&forged)
                .unwrap()
                .verify(&net)
                .is_err()
        );
        let mut flipped = bytes.clone();
        // version, kind, "devnet", signer (1 + 32): the signature starts at byte 43.
        flipped[50] ^= 1;
        let v = Signed::<LeaseClose>::view_frame(&flipped, &net).unwrap();
        assert!(!signed.is_frame(&v));
        assert!(
            Signed::<LeaseClose>::from_bytes(&flipped)
                .unwrap()
                .verify(&net)
                .is_err()
        );

        // Another network, another kind, or bytes that do not decode: no view at all.
        assert!(
            Signed::<LeaseClose>::view_frame(&bytes, &NetworkId::new("mainnet").unwrap()).is_none()
        );
        assert!(Signed::<crate::messages::Offer>::view_frame(&bytes, &net).is_none());
        assert!(Signed::<LeaseClose>::view_frame(&bytes[..bytes.len() - 1], &net).is_none());
    }

    #[test]
    fn other_network_is_rejected() {
        let key = NodeKey::from_secret([1; 32]);
        let signed = Signed::sign(&key, &NetworkId::devnet(), &close()).unwrap();
        let err = signed
            .verify(&NetworkId::new("mainnet").unwrap())
            .unwrap_err();
        assert!(matches!(err, EnvelopeError::WrongNetwork { .. }), "{err}");
        // Relabelling the network breaks the signature.
        let mut env = signed.into_envelope();
        env.network = NetworkId::new("mainnet").unwrap();
        let err = Signed::<LeaseClose>::from_envelope(env)
            .verify(&NetworkId::new("mainnet").unwrap())
            .unwrap_err();
        assert!(matches!(err, EnvelopeError::BadSignature { .. }), "{err}");
    }

    #[test]
    fn network_ids_are_validated() {
        assert!(NetworkId::new("devnet").is_ok());
        assert!(NetworkId::new("my-net-2").is_ok());
        for bad in ["", "Dev", "a b", "x".repeat(33).as_str(), "ü"] {
            assert!(NetworkId::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn small_order_signer_keys_are_refused_by_single_and_batch_paths() {
        let net = NetworkId::devnet();
        let key = NodeKey::from_secret([1; 32]);
        let mut env = Signed::sign(&key, &net, &close()).unwrap().into_envelope();
        // The identity point: a valid encoding of a key of small order.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        env.signer = PublicKey(identity);
        let weak = Signed::<LeaseClose>::from_envelope(env);
        assert!(matches!(
            weak.verify(&net),
            Err(EnvelopeError::BadSignerKey)
        ));
        let r = Signed::verify_batch(&[&weak], &net);
        assert!(matches!(r[0], Err(EnvelopeError::BadSignerKey)));
    }

    #[test]
    fn batch_verification_matches_single_verification() {
        let net = NetworkId::devnet();
        let keys: Vec<NodeKey> = (0..8u8)
            .map(|i| NodeKey::from_secret([i + 1; 32]))
            .collect();
        let mut signed: Vec<Signed<LeaseClose>> = keys
            .iter()
            .map(|k| Signed::sign(k, &net, &close()).unwrap())
            .collect();
        let refs: Vec<&Signed<LeaseClose>> = signed.iter().collect();
        assert!(Signed::verify_batch(&refs, &net).iter().all(Result::is_ok));
        // Corrupt one: only that one fails, the others still verify.
        signed[3].envelope.signature.0[40] ^= 1;
        let refs: Vec<&Signed<LeaseClose>> = signed.iter().collect();
        let results = Signed::verify_batch(&refs, &net);
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.is_ok(), i != 3, "item {i}: {r:?}");
        }
    }
}
