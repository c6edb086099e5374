//! Offer ingestion: from gossip bytes to a verified, valid offer, as cheaply as possible.
//!
//! Signature checking is the ceiling of how fast a node can take in offers (one strict ed25519
//! verification costs tens of microseconds). Two things make ingestion cheaper than one
//! verification per frame:
//! - **batch verification** of queued frames ([`Signed::verify_batch`]), falling back to
//!   one-by-one checks only when a batch holds a bad signature;
//! - **content dedup**: providers re-announce the same signed offer every announce period
//!   (gossip has no replay), so most frames in steady state carry content this node already
//!   verified. A bounded cache of content ids (the digest of the signed input, independent of
//!   signature bytes) lets those skip the signature check; they are still decoded and validated
//!   against `now`, so an expired re-announcement is still refused.
//!
//! The cache is bounded (FIFO eviction) and keyed by content digest, never by sender, so a
//! hostile peer cannot grow it beyond its capacity or poison another provider's entries: an
//! entry exists only after a successful strict (or batch) verification.

use std::collections::{HashSet, VecDeque};

use gridlease_protocol::{Digest, EnvelopeError, NetworkId, Offer, Signed, Timestamp, Verified};

use crate::terms::{OfferError, validate_offer};

/// Why a frame was not ingested.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// Bad bytes or a bad signature: the sender should be penalised.
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// Signed correctly but invalid as an offer (expired, wrong provider, bad fields).
    #[error(transparent)]
    Invalid(#[from] OfferError),
}

/// A bounded set of content ids that already verified.
#[derive(Debug)]
pub struct VerifiedCache {
    capacity: usize,
    order: VecDeque<Digest>,
    set: HashSet<Digest>,
}

impl VerifiedCache {
    /// A cache of at most `capacity` ids.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            order: VecDeque::with_capacity(capacity.min(1 << 16)),
            set: HashSet::with_capacity(capacity.min(1 << 16)),
        }
    }

    /// True when `id` verified before (and is still remembered).
    pub fn contains(&self, id: &Digest) -> bool {
        self.set.contains(id)
    }

    /// Remembers `id`, evicting the oldest entry when full.
    pub fn insert(&mut self, id: Digest) {
        if self.set.insert(id) {
            self.order.push_back(id);
            if self.order.len() > self.capacity
                && let Some(old) = self.order.pop_front()
            {
                self.set.remove(&old);
            }
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// Turns offer frames into verified, valid offers.
#[derive(Debug)]
pub struct OfferIngestor {
    network: NetworkId,
    cache: VerifiedCache,
}

impl OfferIngestor {
    /// An ingestor for `network` remembering up to `cache_capacity` verified offers.
    pub fn new(network: NetworkId, cache_capacity: usize) -> Self {
        Self {
            network,
            cache: VerifiedCache::new(cache_capacity),
        }
    }

    /// Ingests one frame: decode the envelope, verify strictly (unless this exact content
    /// already verified), decode the payload, validate at `now`.
    pub fn ingest(&mut self, frame: &[u8], now: Timestamp) -> Result<Verified<Offer>, IngestError> {
        let signed = Signed::<Offer>::from_bytes(frame)?;
        let digest = signed.envelope().content_digest();
        let verified = if self.cache.contains(&digest) {
            signed.decode_already_verified(&self.network)?
        } else {
            let v = signed.verify(&self.network)?;
            self.cache.insert(digest);
            v
        };
        validate_offer(&verified.message, &verified.signer, now)?;
        Ok(verified)
    }

    /// Ingests a queue of frames with one batch verification for everything not cached.
    /// Results are in input order.
    pub fn ingest_batch(
        &mut self,
        frames: &[&[u8]],
        now: Timestamp,
    ) -> Vec<Result<Verified<Offer>, IngestError>> {
        let mut out: Vec<Option<Result<Verified<Offer>, IngestError>>> =
            (0..frames.len()).map(|_| None).collect();
        let mut pending: Vec<(usize, Signed<Offer>)> = Vec::with_capacity(frames.len());
        for (i, frame) in frames.iter().enumerate() {
            match Signed::<Offer>::from_bytes(frame) {
                Ok(signed) => {
                    let digest = signed.envelope().content_digest();
                    if self.cache.contains(&digest) {
                        out[i] = Some(
                            signed
                                .decode_already_verified(&self.network)
                                .map_err(Into::into),
                        );
                    } else {
                        pending.push((i, signed));
                    }
                }
                Err(e) => out[i] = Some(Err(e.into())),
            }
        }
        let refs: Vec<&Signed<Offer>> = pending.iter().map(|(_, s)| s).collect();
        let results = Signed::verify_batch(&refs, &self.network);
        for ((i, _), r) in pending.iter().zip(results) {
            if let Ok(v) = &r {
                self.cache.insert(v.digest);
            }
            out[*i] = Some(r.map_err(Into::into));
        }
        out.into_iter()
            .map(|r| {
                let r = r.unwrap_or(Err(IngestError::Envelope(EnvelopeError::BadSignerKey)));
                r.and_then(|v| {
                    validate_offer(&v.message, &v.signer, now)?;
                    Ok(v)
                })
            })
            .collect()
    }

    /// Content ids remembered.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::NodeKey;
    use gridlease_protocol::fixtures::{self, T0};

    fn frame(secret: u8, seq: u64) -> Vec<u8> {
        let key = NodeKey::from_secret([secret; 32]);
        let offer = fixtures::offer(key.public(), seq, 2, 400_000);
        Signed::sign(&key, &NetworkId::devnet(), &offer)
            .unwrap()
            .to_bytes()
            .unwrap()
    }

    #[test]
    fn single_and_batch_agree_and_cache_skips_reverification() {
        let now = T0.plus_secs(1);
        let frames: Vec<Vec<u8>> = (1..=8).map(|i| frame(i, 1)).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let mut a = OfferIngestor::new(NetworkId::devnet(), 100);
        let batch = a.ingest_batch(&refs, now);
        assert!(batch.iter().all(Result::is_ok));
        assert_eq!(a.cached(), 8);
        let mut b = OfferIngestor::new(NetworkId::devnet(), 100);
        for f in &frames {
            b.ingest(f, now).unwrap();
        }
        // Re-announcements are accepted from the cache, still validated against `now`.
        assert!(a.ingest(&frames[0], now).is_ok());
        assert!(matches!(
            a.ingest(&frames[0], T0.plus_secs(301)),
            Err(IngestError::Invalid(OfferError::Expired { .. }))
        ));
    }

    #[test]
    fn a_forged_copy_of_cached_content_is_not_trusted() {
        // A different content with a garbage signature is refused, alone or in a batch, even
        // after the same provider's other content verified.
        let now = T0.plus_secs(1);
        let mut ing = OfferIngestor::new(NetworkId::devnet(), 100);
        let good = frame(1, 1);
        ing.ingest(&good, now).unwrap();
        let mut other = Signed::<Offer>::from_bytes(&frame(1, 2))
            .unwrap()
            .into_envelope();
        other.signature.0[10] ^= 1;
        let bytes = other.to_bytes().unwrap();
        assert!(matches!(
            ing.ingest(&bytes, now),
            Err(IngestError::Envelope(_))
        ));
        let refs = [bytes.as_slice(), good.as_slice()];
        let r = ing.ingest_batch(&refs, now);
        assert!(r[0].is_err() && r[1].is_ok());
    }

    #[test]
    fn cached_content_under_another_signer_is_not_trusted() {
        // The content id binds the signer: copying a verified payload under another key with
        // any signature is a cache miss and fails verification.
        let now = T0.plus_secs(1);
        let mut ing = OfferIngestor::new(NetworkId::devnet(), 100);
        let good = frame(1, 1);
        ing.ingest(&good, now).unwrap();
        let mut stolen = Signed::<Offer>::from_bytes(&good).unwrap().into_envelope();
        stolen.signer = NodeKey::from_secret([2; 32]).public();
        let bytes = stolen.to_bytes().unwrap();
        assert!(matches!(
            ing.ingest(&bytes, now),
            Err(IngestError::Envelope(EnvelopeError::BadSignature { .. }))
        ));
    }

    #[test]
    fn cache_is_bounded() {
        let mut c = VerifiedCache::new(3);
        for i in 0..10u8 {
            c.insert(Digest([i; 32]));
        }
        assert_eq!(c.len(), 3);
        assert!(c.contains(&Digest([9; 32])));
        assert!(!c.contains(&Digest([0; 32])));
    }
}
