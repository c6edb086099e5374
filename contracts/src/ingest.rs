//! Offer ingestion: from gossip bytes to a verified, valid offer, as cheaply as possible.
//!
//! Signature checking is the ceiling of how fast a node can take in offers (one strict ed25519
//! verification costs tens of microseconds). Three things keep ingestion close to, or above,
//! one verification per frame:
//! - **one pass**: the signed input is built once and hashed once (the content id), the key
//!   is decompressed once per provider ([`gridlease_protocol::KeyCache`] inside the
//!   [`VerifyCache`]);
//! - **batch verification** of queued frames ([`Signed::verify_batch_cached`]), falling back to
//!   one-by-one checks only when a batch holds a bad signature;
//! - **dedup**: providers re-announce the same signed offer every announce period (gossip has
//!   no replay), so in steady state most frames are identical to frames this node already
//!   verified; those skip the signature check. They are still decoded and validated against
//!   `now`, so an expired re-announcement is still refused.
//!
//! All caches are bounded (keys: least recently used go first; verified messages: FIFO), and a message enters the dedup cache only after it
//! verified, keyed by content id (signer included) *and* signature bytes, so a hostile peer can
//! neither grow them beyond capacity nor get an unverified variant of a cached frame accepted.

use gridlease_protocol::{
    EnvelopeError, NetworkId, Offer, Signed, Timestamp, Verified, VerifyCache, VerifyStats,
};

use crate::terms::{OfferError, validate_offer};

/// Fewest provider keys an ingestor remembers (it remembers as many as it remembers verified
/// offers, when that is more: one key per provider the book can hold).
pub const KEY_CACHE_CAPACITY: usize = 4096;

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

/// Turns offer frames into verified, valid offers.
#[derive(Debug)]
pub struct OfferIngestor {
    network: NetworkId,
    cache: VerifyCache,
}

impl OfferIngestor {
    /// An ingestor for `network` remembering up to `verified_capacity` verified offers and as
    /// many provider keys (at least [`KEY_CACHE_CAPACITY`]): the node passes its book's
    /// capacity, so every provider in a full book keeps its key decompressed.
    pub fn new(network: NetworkId, verified_capacity: usize) -> Self {
        Self::with_caches(network, verified_capacity, verified_capacity)
    }

    /// An ingestor remembering up to `keys` provider keys (at least [`KEY_CACHE_CAPACITY`]) and
    /// `verified` verified messages. The node sizes the keys to its book and keeps few
    /// verified messages: its book recognises re-announcements of the offers it holds
    /// (`OfferBook::holds_frame`), so this cache only has to cover offers it did not keep.
    pub fn with_caches(network: NetworkId, keys: usize, verified: usize) -> Self {
        Self {
            network,
            cache: VerifyCache::new(keys.max(KEY_CACHE_CAPACITY), verified),
        }
    }

    /// The network this ingestor accepts offers for.
    pub fn network(&self) -> &NetworkId {
        &self.network
    }

    /// Ingests one frame: decode the envelope in place, verify strictly (unless this exact
    /// message already verified), decode the payload, validate at `now`.
    pub fn ingest(&mut self, frame: &[u8], now: Timestamp) -> Result<Verified<Offer>, IngestError> {
        let verified = Signed::<Offer>::verify_frame(frame, &self.network, &mut self.cache)?;
        validate_offer(&verified.message, &verified.signer, now)?;
        Ok(verified)
    }

    /// Ingests a queue of frames with one batch verification for everything not verified
    /// before. Results are in input order.
    pub fn ingest_batch(
        &mut self,
        frames: &[&[u8]],
        now: Timestamp,
    ) -> Vec<Result<Verified<Offer>, IngestError>> {
        let decoded: Vec<Result<Signed<Offer>, EnvelopeError>> = frames
            .iter()
            .map(|f| Signed::<Offer>::from_bytes(f))
            .collect();
        let ok: Vec<&Signed<Offer>> = decoded.iter().filter_map(|d| d.as_ref().ok()).collect();
        let mut verified =
            Signed::verify_batch_cached(&ok, &self.network, &mut self.cache).into_iter();
        decoded
            .into_iter()
            .map(|d| {
                let v = match d {
                    Ok(_) => verified
                        .next()
                        .unwrap_or(Err(EnvelopeError::BadSignerKey))?,
                    Err(e) => return Err(e.into()),
                };
                validate_offer(&v.message, &v.signer, now)?;
                Ok(v)
            })
            .collect()
    }

    /// Verified offers remembered.
    pub fn cached(&self) -> usize {
        self.cache.remembered()
    }

    /// Signatures checked, and frames accepted without one (already verified), so far.
    pub fn stats(&self) -> VerifyStats {
        self.cache.stats()
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
        for (f, r) in frames.iter().zip(&batch) {
            assert_eq!(b.ingest(f, now).unwrap().digest, r.as_ref().unwrap().digest);
        }
        // Re-announcements are accepted from the cache, still validated against `now`.
        assert_eq!(
            a.stats(),
            VerifyStats {
                checked: 8,
                skipped: 0
            }
        );
        assert!(a.ingest(&frames[0], now).is_ok());
        assert_eq!(a.cached(), 8);
        assert_eq!(
            a.stats(),
            VerifyStats {
                checked: 8,
                skipped: 1
            }
        );
        assert!(matches!(
            a.ingest(&frames[0], T0.plus_secs(301)),
            Err(IngestError::Invalid(OfferError::Expired { .. }))
        ));
    }

    #[test]
    fn bad_frames_in_a_batch_fail_alone() {
        let now = T0.plus_secs(1);
        let mut ing = OfferIngestor::new(NetworkId::devnet(), 100);
        let good = frame(1, 1);
        let mut bad = Signed::<Offer>::from_bytes(&frame(1, 2))
            .unwrap()
            .into_envelope();
        bad.signature.0[10] ^= 1;
        let bad = bad.to_bytes().unwrap();
        let garbage = vec![1u8, 2, 3];
        let refs = [bad.as_slice(), good.as_slice(), garbage.as_slice()];
        let r = ing.ingest_batch(&refs, now);
        assert!(matches!(
            r[0],
            Err(IngestError::Envelope(EnvelopeError::BadSignature { .. }))
        ));
        assert!(r[1].is_ok());
        assert!(matches!(
            r[2],
            Err(IngestError::Envelope(EnvelopeError::Codec { .. }))
        ));
        assert_eq!(ing.cached(), 1);
    }

    #[test]
    fn a_variant_of_a_verified_frame_is_verified_again() {
        // Same content, other signature bytes: not in the cache, so it is checked and refused.
        let now = T0.plus_secs(1);
        let mut ing = OfferIngestor::new(NetworkId::devnet(), 100);
        let good = frame(1, 1);
        ing.ingest(&good, now).unwrap();
        let mut forged = Signed::<Offer>::from_bytes(&good).unwrap().into_envelope();
        forged.signature.0[40] ^= 1;
        let forged = forged.to_bytes().unwrap();
        assert!(matches!(
            ing.ingest(&forged, now),
            Err(IngestError::Envelope(EnvelopeError::BadSignature { .. }))
        ));
        let r = ing.ingest_batch(&[forged.as_slice()], now);
        assert!(r[0].is_err());
    }

    #[test]
    fn cached_content_under_another_signer_is_not_trusted() {
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
        let now = T0.plus_secs(1);
        let mut ing = OfferIngestor::new(NetworkId::devnet(), 3);
        for i in 1..=10 {
            ing.ingest(&frame(i, 1), now).unwrap();
        }
        assert_eq!(ing.cached(), 3);
    }
}
