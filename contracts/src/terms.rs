//! Offers and lease terms: which offers are valid, which requests a provider must accept, and
//! what a renter checks in an acceptance.
//!
//! Every function is pure: the caller passes `now` and the provider's current state.

use gridlease_protocol::{
    LeaseAccept, LeaseId, LeaseRequest, LeaseTerms, NetworkId, Offer, OfferId, PublicKey,
    RejectReason, Shape, ShapeError, Timestamp,
};

use crate::billing::Tariff;
use crate::money::Money;

/// Longest an offer may live; providers re-announce well before this.
pub const MAX_OFFER_TTL_S: u64 = 3600;
/// How far in the future a signed timestamp may be (clock skew between peers).
pub const MAX_CLOCK_SKEW_S: u64 = 60;
/// Usage report interval bounds, seconds.
pub const USAGE_INTERVAL_RANGE_S: (u32, u32) = (1, 300);
/// Most grace a renter may ask for before a silent renter is cut off, seconds.
pub const MAX_GRACE_S: u32 = 600;
/// Longest a lease request stays valid, seconds.
pub const MAX_REQUEST_TTL_S: u64 = 300;

/// Why an offer is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// Counts or lengths out of bounds.
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// The offer names a provider other than its signer.
    #[error("offer names provider {named} but was signed by {signer}")]
    NotSignedByProvider {
        /// The provider field.
        named: PublicKey,
        /// The signer.
        signer: PublicKey,
    },
    /// Already expired.
    #[error("offer expired at {expires_at} (now {now})")]
    Expired {
        /// Expiry.
        expires_at: Timestamp,
        /// Now.
        now: Timestamp,
    },
    /// Created in the future beyond clock skew.
    #[error("offer created at {created_at}, in the future (now {now})")]
    FromTheFuture {
        /// Creation time.
        created_at: Timestamp,
        /// Now.
        now: Timestamp,
    },
    /// Lives longer than [`MAX_OFFER_TTL_S`].
    #[error("offer lives {ttl_s} s, more than {MAX_OFFER_TTL_S} s")]
    TtlTooLong {
        /// Its lifetime.
        ttl_s: u64,
    },
    /// A field out of its allowed range.
    #[error("offer field `{field}`: {problem}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
}

fn field(field: &'static str, problem: impl Into<String>) -> OfferError {
    OfferError::Field {
        field,
        problem: problem.into(),
    }
}

/// Checks an offer received from `signer` at `now`: the rules every node applies before
/// accepting an offer into its book or forwarding it.
pub fn validate_offer(offer: &Offer, signer: &PublicKey, now: Timestamp) -> Result<(), OfferError> {
    offer.check_shape()?;
    if &offer.provider != signer {
        return Err(OfferError::NotSignedByProvider {
            named: offer.provider,
            signer: *signer,
        });
    }
    if offer.expires_at <= now {
        return Err(OfferError::Expired {
            expires_at: offer.expires_at,
            now,
        });
    }
    if offer.created_at > now.plus_secs(MAX_CLOCK_SKEW_S) {
        return Err(OfferError::FromTheFuture {
            created_at: offer.created_at,
            now,
        });
    }
    let ttl_s = offer.expires_at.ms_since(offer.created_at) / 1000;
    if ttl_s > MAX_OFFER_TTL_S {
        return Err(OfferError::TtlTooLong { ttl_s });
    }
    if offer.min_duration_s > offer.max_duration_s {
        return Err(field("min_duration_s", "greater than max_duration_s"));
    }
    if usize::from(offer.free_gpus) > offer.gpus.len() {
        return Err(field("free_gpus", "more than the GPUs offered"));
    }
    let (lo, hi) = USAGE_INTERVAL_RANGE_S;
    if !(lo..=hi).contains(&offer.usage_interval_s) {
        return Err(field(
            "usage_interval_s",
            format!("{} not in {lo}..={hi}", offer.usage_interval_s),
        ));
    }
    if offer.pay_ahead_s < offer.usage_interval_s {
        return Err(field(
            "pay_ahead_s",
            "shorter than one usage interval: every lease would stop at its first report",
        ));
    }
    if offer.min_billed_s > offer.max_duration_s {
        return Err(field("min_billed_s", "longer than max_duration_s"));
    }
    // A lease of every GPU for the longest duration must be billable without overflow.
    let gpus = u16::try_from(offer.gpus.len()).unwrap_or(u16::MAX);
    crate::billing::cost(
        u64::from(offer.max_duration_s),
        gpus,
        Money::from_micros(offer.price_per_gpu_hour),
    )
    .map_err(|_| field("price_per_gpu_hour", "a full lease would overflow"))?;
    let mut seen = std::collections::BTreeSet::new();
    for g in &offer.gpus {
        if !seen.insert(g.spec.uuid_digest) {
            return Err(field("gpus", "the same GPU is listed twice"));
        }
    }
    Ok(())
}

/// True for environment variables a renter may not set: the loader's hooks (`LD_PRELOAD`,
/// `LD_LIBRARY_PATH`, `LD_AUDIT`) and everything the NVIDIA container toolkit or CUDA reads to
/// pick devices (`NVIDIA_*`, `CUDA_VISIBLE_DEVICES*`): the provider sets those to the leased
/// GPUs. Case-insensitive. Refused at negotiation, before anything is signed.
pub fn is_forbidden_env(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper == "LD_PRELOAD"
        || upper == "LD_LIBRARY_PATH"
        || upper == "LD_AUDIT"
        || upper.starts_with("NVIDIA_")
        || upper.starts_with("CUDA_VISIBLE_DEVICES")
}

/// What the provider knows when it decides on a request.
#[derive(Debug, Clone, Copy)]
pub struct ProviderView<'a> {
    /// The network this node is on.
    pub network: &'a NetworkId,
    /// The provider's current offer and its id.
    pub offer: &'a Offer,
    /// That offer's id.
    pub offer_id: OfferId,
    /// Earlier signatures of the same offer the provider still honours (id, sequence): the
    /// same terms re-signed only for its expiry, addresses or free GPU count, so a request
    /// made from one of them is decided against the current offer as if it named it.
    pub equivalent: &'a [(OfferId, u64)],
    /// GPUs of that offer not leased right now.
    pub free_gpus: u16,
    /// The provider's image rules (the part decidable from the reference alone is checked
    /// here; [`crate::image::admit`] checks the rest once the image's facts are known).
    pub images: &'a crate::image::ImagePolicy,
    /// Now.
    pub now: Timestamp,
}

/// The provider's decision on a verified request from `signer`: `Ok(lease id)` to accept, or the
/// reason to reject. Nonce idempotency is the store's job (it needs history).
pub fn check_request(
    view: &ProviderView<'_>,
    request: &LeaseRequest,
    signer: &PublicKey,
) -> Result<LeaseId, RejectReason> {
    let t = &request.terms;
    let offer = view.offer;
    let malformed = |detail: String| RejectReason::Malformed { detail };
    request
        .check_shape()
        .map_err(|e| malformed(e.to_string()))?;
    let lease_id = t.lease_id().map_err(|e| malformed(e.to_string()))?;
    if &t.renter != signer {
        return Err(malformed(
            "terms name another renter than the signer".into(),
        ));
    }
    if &t.network != view.network {
        return Err(malformed(format!("terms are for network {}", t.network)));
    }
    if request.expires_at <= view.now
        || request.expires_at > t.created_at.plus_secs(MAX_REQUEST_TTL_S)
    {
        return Err(RejectReason::RequestExpired);
    }
    if t.provider != offer.provider {
        return Err(RejectReason::WrongProvider);
    }
    let same_offer = t.offer_id == view.offer_id && t.offer_seq == offer.seq;
    let equivalent = view
        .equivalent
        .iter()
        .any(|(id, seq)| *id == t.offer_id && *seq == t.offer_seq);
    if t.offer_id != view.offer_id && !equivalent {
        return Err(if t.offer_seq < offer.seq {
            RejectReason::StaleOffer {
                current_seq: offer.seq,
            }
        } else {
            RejectReason::UnknownOffer
        });
    }
    if offer.expires_at <= view.now {
        return Err(RejectReason::OfferExpired);
    }
    if let Some(v) = &t.volume {
        if !same_offer && !equivalent {
            return Err(RejectReason::TermsMismatch {
                field: "offer_seq".into(),
            });
        }
        check_channel_terms(offer, t)?;
        crate::settlement::check_terms(view.network, offer, t)?;
        crate::volume::check_volume_terms(offer, t, v)?;
        return Ok(lease_id);
    }
    if t.price_per_gpu_hour < offer.price_per_gpu_hour {
        return Err(RejectReason::PriceBelowAsk {
            ask: offer.price_per_gpu_hour,
        });
    }
    if t.gpu_count > view.free_gpus {
        return Err(RejectReason::NoCapacity {
            free: view.free_gpus,
        });
    }
    if t.duration_s < offer.min_duration_s || t.duration_s > offer.max_duration_s {
        return Err(RejectReason::DurationOutOfBounds {
            min_s: offer.min_duration_s,
            max_s: offer.max_duration_s,
        });
    }
    let mismatch = |f: &str| RejectReason::TermsMismatch {
        field: f.to_string(),
    };
    if !same_offer && !equivalent {
        return Err(mismatch("offer_seq"));
    }
    if t.min_billed_s != offer.min_billed_s {
        return Err(mismatch("min_billed_s"));
    }
    if t.output_retention_s > offer.sandbox.output_retention_s {
        return Err(mismatch("output_retention_s"));
    }
    if t.upload_hold_s > offer.sandbox.upload_hold_s {
        return Err(mismatch("upload_hold_s"));
    }
    // A GPU check only where the offer has a window, and no longer.
    if t.verify_window_s > offer.proof.window_s
        || (t.verify_window_s > 0 && offer.proof.backend.is_none())
    {
        return Err(mismatch("verify_window_s"));
    }
    check_channel_terms(offer, t)?;
    crate::settlement::check_terms(view.network, offer, t)?;
    if !t.per_gpu.fits_within(&offer.per_gpu) {
        return Err(mismatch("per_gpu"));
    }
    for name in t.env.keys() {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(malformed(format!(
                "invalid environment variable name {name:?}"
            )));
        }
        if is_forbidden_env(name) {
            return Err(RejectReason::EnvNotAllowed { name: name.clone() });
        }
    }
    let image = crate::image::check_reference(view.images, &t.image)
        .map_err(|refusal| RejectReason::ImageRefused { refusal })?;
    if !offer.sandbox.allows_image(&image.canonical()) {
        return Err(RejectReason::ImageRefused {
            refusal: gridlease_protocol::ImageRefusal::NotListed,
        });
    }
    if !offer.sandbox.allows_network(t.network_policy) {
        return Err(RejectReason::NetworkNotAllowed);
    }
    let tariff = Tariff::of(t);
    let needed = crate::billing::cost(
        u64::from(t.min_billed_s),
        t.gpu_count,
        tariff.price_per_gpu_hour,
    )
    .map_err(|_| malformed("price overflows".into()))?;
    if tariff.max_total < needed {
        return Err(RejectReason::BudgetTooSmall {
            needed: needed.micros(),
        });
    }
    Ok(lease_id)
}

/// The payment channel's terms every lease (a volume lease too) takes from the offer: its
/// report interval, at most its pay-ahead window (at least one interval), and a grace the
/// provider accepts.
fn check_channel_terms(offer: &Offer, t: &LeaseTerms) -> Result<(), RejectReason> {
    let mismatch = |f: &str| RejectReason::TermsMismatch {
        field: f.to_string(),
    };
    if t.usage_interval_s != offer.usage_interval_s {
        return Err(mismatch("usage_interval_s"));
    }
    if t.pay_ahead_s > offer.pay_ahead_s || t.pay_ahead_s < t.usage_interval_s {
        return Err(mismatch("pay_ahead_s"));
    }
    if t.grace_s > MAX_GRACE_S || t.grace_s < t.usage_interval_s {
        return Err(mismatch("grace_s"));
    }
    Ok(())
}

/// Why a renter refuses an acceptance.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcceptError {
    /// Signed by someone other than the provider in the terms.
    #[error("acceptance signed by {signer}, not by the provider {provider}")]
    WrongSigner {
        /// Signer.
        signer: PublicKey,
        /// Expected provider.
        provider: PublicKey,
    },
    /// The accepted terms differ from the requested ones.
    #[error("accepted terms differ from the requested terms")]
    TermsDiffer,
    /// The lease id is not the hash of the terms.
    #[error("lease id is not the hash of the terms")]
    BadLeaseId,
    /// Wrong number of GPUs assigned.
    #[error("{assigned} GPUs assigned, {requested} requested")]
    GpuCount {
        /// Assigned.
        assigned: usize,
        /// Requested.
        requested: u16,
    },
}

/// The renter's check of a verified acceptance against the terms it proposed.
pub fn check_accept(
    proposed: &LeaseTerms,
    accept: &LeaseAccept,
    signer: &PublicKey,
) -> Result<LeaseId, AcceptError> {
    if signer != &proposed.provider {
        return Err(AcceptError::WrongSigner {
            signer: *signer,
            provider: proposed.provider,
        });
    }
    if &accept.terms != proposed {
        return Err(AcceptError::TermsDiffer);
    }
    let id = proposed.lease_id().map_err(|_| AcceptError::BadLeaseId)?;
    if id != accept.lease_id {
        return Err(AcceptError::BadLeaseId);
    }
    if accept.gpus.len() != usize::from(proposed.gpu_count) {
        return Err(AcceptError::GpuCount {
            assigned: accept.gpus.len(),
            requested: proposed.gpu_count,
        });
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::fixtures::{self, T0};
    use gridlease_protocol::{Digest, NodeKey};

    struct World {
        provider: NodeKey,
        renter: NodeKey,
        offer: Offer,
        offer_id: OfferId,
        net: NetworkId,
        images: crate::image::ImagePolicy,
    }

    fn world() -> World {
        let provider = NodeKey::from_secret([1; 32]);
        let renter = NodeKey::from_secret([2; 32]);
        let offer = fixtures::offer(provider.public(), 7, 4, 400_000);
        World {
            provider,
            renter,
            offer,
            offer_id: OfferId(Digest([5; 32])),
            net: NetworkId::devnet(),
            images: crate::image::ImagePolicy::default(),
        }
    }

    fn request(w: &World) -> LeaseRequest {
        LeaseRequest {
            terms: fixtures::terms(w.offer_id, &w.offer, w.renter.public(), 2, 600),
            expires_at: T0.plus_secs(30),
        }
    }

    fn view(w: &World) -> ProviderView<'_> {
        ProviderView {
            network: &w.net,
            offer: &w.offer,
            offer_id: w.offer_id,
            equivalent: &[],
            free_gpus: 4,
            now: T0.plus_secs(1),
            images: &w.images,
        }
    }

    #[test]
    fn valid_offer_passes_and_bad_ones_fail() {
        let w = world();
        let now = T0.plus_secs(1);
        validate_offer(&w.offer, &w.provider.public(), now).unwrap();
        assert!(matches!(
            validate_offer(&w.offer, &w.renter.public(), now),
            Err(OfferError::NotSignedByProvider { .. })
        ));
        assert!(matches!(
            validate_offer(&w.offer, &w.provider.public(), T0.plus_secs(301)),
            Err(OfferError::Expired { .. })
        ));
        let mut o = w.offer.clone();
        o.expires_at = T0.plus_secs(MAX_OFFER_TTL_S + 1);
        assert!(matches!(
            validate_offer(&o, &w.provider.public(), now),
            Err(OfferError::TtlTooLong { .. })
        ));
        let mut o = w.offer.clone();
        o.gpus[1] = o.gpus[0].clone();
        assert!(matches!(
            validate_offer(&o, &w.provider.public(), now),
            Err(OfferError::Field { field: "gpus", .. })
        ));
        let mut o = w.offer.clone();
        o.pay_ahead_s = 5;
        assert!(validate_offer(&o, &w.provider.public(), now).is_err());
        let mut o = w.offer.clone();
        o.created_at = now.plus_secs(MAX_CLOCK_SKEW_S + 1);
        o.expires_at = o.created_at.plus_secs(60);
        assert!(matches!(
            validate_offer(&o, &w.provider.public(), now),
            Err(OfferError::FromTheFuture { .. })
        ));
        let mut o = w.offer.clone();
        o.price_per_gpu_hour = u64::MAX;
        assert!(validate_offer(&o, &w.provider.public(), now).is_err());
    }

    #[test]
    fn matching_request_is_accepted_with_the_terms_hash() {
        let w = world();
        let r = request(&w);
        let id = check_request(&view(&w), &r, &w.renter.public()).unwrap();
        assert_eq!(id, r.terms.lease_id().unwrap());
    }

    #[test]
    fn each_rule_rejects_with_its_reason() {
        let w = world();
        let v = view(&w);
        let renter = w.renter.public();
        let check = |f: &dyn Fn(&mut LeaseRequest)| {
            let mut r = request(&w);
            f(&mut r);
            check_request(&v, &r, &renter).unwrap_err()
        };
        assert_eq!(
            check(&|r| r.terms.price_per_gpu_hour = 399_999),
            RejectReason::PriceBelowAsk { ask: 400_000 }
        );
        assert_eq!(
            check(&|r| r.terms.gpu_count = 5),
            RejectReason::NoCapacity { free: 4 }
        );
        assert_eq!(
            check(&|r| r.terms.duration_s = 30),
            RejectReason::DurationOutOfBounds {
                min_s: 60,
                max_s: 86_400
            }
        );
        assert_eq!(
            check(&|r| {
                r.terms.offer_id = OfferId(Digest([6; 32]));
                r.terms.offer_seq = 6;
            }),
            RejectReason::StaleOffer { current_seq: 7 }
        );
        assert_eq!(
            check(&|r| r.terms.offer_id = OfferId(Digest([6; 32]))),
            RejectReason::UnknownOffer
        );
        // An earlier signature of the same offer the provider still honours is decided
        // against the current one; an older one it does not list stays stale.
        let earlier = [(OfferId(Digest([6; 32])), 6)];
        let honouring = ProviderView {
            equivalent: &earlier,
            ..view(&w)
        };
        let mut r = request(&w);
        r.terms.offer_id = OfferId(Digest([6; 32]));
        r.terms.offer_seq = 6;
        assert!(check_request(&honouring, &r, &renter).is_ok());
        r.terms.offer_seq = 5;
        assert_eq!(
            check_request(&honouring, &r, &renter).unwrap_err(),
            RejectReason::StaleOffer { current_seq: 7 }
        );
        assert_eq!(check(&|r| r.expires_at = T0), RejectReason::RequestExpired);
        assert_eq!(
            check(&|r| r.terms.provider = renter),
            RejectReason::WrongProvider
        );
        assert_eq!(
            check(&|r| r.terms.usage_interval_s = 5),
            RejectReason::TermsMismatch {
                field: "usage_interval_s".into()
            }
        );
        assert_eq!(
            check(&|r| r.terms.per_gpu.ram_mib += 1),
            RejectReason::TermsMismatch {
                field: "per_gpu".into()
            }
        );
        assert_eq!(
            check(&|r| r.terms.network_policy = gridlease_protocol::NetworkPolicy::Egress),
            RejectReason::NetworkNotAllowed
        );
        assert!(matches!(
            check(&|r| r.terms.max_total = 1),
            RejectReason::BudgetTooSmall { .. }
        ));
        assert!(matches!(
            check(&|r| r.terms.image.clear()),
            RejectReason::Malformed { .. }
        ));
        // Signed by someone else than the renter in the terms.
        let r = request(&w);
        assert!(matches!(
            check_request(&v, &r, &w.provider.public()),
            Err(RejectReason::Malformed { .. })
        ));
        // Offer expired.
        let late = ProviderView {
            now: T0.plus_secs(29),
            ..v
        };
        let mut o = w.offer.clone();
        o.expires_at = T0.plus_secs(20);
        let late = ProviderView { offer: &o, ..late };
        assert_eq!(
            check_request(&late, &r, &renter).unwrap_err(),
            RejectReason::OfferExpired
        );
    }

    #[test]
    fn image_policy_is_enforced() {
        let mut w = world();
        w.offer.sandbox.image_prefixes = vec!["docker.io/pytorch/".into()];
        let r = request(&w);
        assert_eq!(
            check_request(&view(&w), &r, &w.renter.public()).unwrap_err(),
            RejectReason::ImageRefused {
                refusal: gridlease_protocol::ImageRefusal::NotListed
            }
        );
        // The provider's own registry list, before anything is signed.
        let mut w = world();
        w.images.registries = vec!["nvcr.io".into()];
        let r = request(&w);
        assert!(matches!(
            check_request(&view(&w), &r, &w.renter.public()).unwrap_err(),
            RejectReason::ImageRefused {
                refusal: gridlease_protocol::ImageRefusal::RegistryNotAllowed { .. }
            }
        ));
        let w = world();
        let mut r = request(&w);
        r.terms.image = "sha256:".to_string() + &"1".repeat(64);
        assert_eq!(
            check_request(&view(&w), &r, &w.renter.public()).unwrap_err(),
            RejectReason::ImageRefused {
                refusal: gridlease_protocol::ImageRefusal::BareId
            }
        );
    }

    #[test]
    fn forbidden_env_is_refused_before_signing() {
        let w = world();
        for name in [
            "CUDA_VISIBLE_DEVICES",
            "ld_preload",
            "NVIDIA_VISIBLE_DEVICES",
        ] {
            let mut r = request(&w);
            r.terms.env.insert(name.to_string(), "0".into());
            assert_eq!(
                check_request(&view(&w), &r, &w.renter.public()).unwrap_err(),
                RejectReason::EnvNotAllowed { name: name.into() }
            );
        }
        let mut r = request(&w);
        r.terms.env.insert("A=B".to_string(), "0".into());
        assert!(matches!(
            check_request(&view(&w), &r, &w.renter.public()).unwrap_err(),
            RejectReason::Malformed { .. }
        ));
    }

    #[test]
    fn renter_checks_the_acceptance() {
        let w = world();
        let terms = request(&w).terms;
        let id = terms.lease_id().unwrap();
        let accept = LeaseAccept {
            lease_id: id,
            terms: terms.clone(),
            gpus: vec![Digest([1; 32]), Digest([2; 32])],
            accepted_at: T0,
        };
        assert_eq!(
            check_accept(&terms, &accept, &w.provider.public()).unwrap(),
            id
        );
        assert!(matches!(
            check_accept(&terms, &accept, &w.renter.public()),
            Err(AcceptError::WrongSigner { .. })
        ));
        let mut other = accept.clone();
        other.terms.price_per_gpu_hour += 1;
        assert_eq!(
            check_accept(&terms, &other, &w.provider.public()),
            Err(AcceptError::TermsDiffer)
        );
        let mut other = accept.clone();
        other.lease_id = LeaseId(Digest([0; 32]));
        assert_eq!(
            check_accept(&terms, &other, &w.provider.public()),
            Err(AcceptError::BadLeaseId)
        );
        let mut other = accept;
        other.gpus.pop();
        assert!(matches!(
            check_accept(&terms, &other, &w.provider.public()),
            Err(AcceptError::GpuCount { .. })
        ));
    }

    #[test]
    fn both_sides_compute_the_same_lease_id() {
        let w = world();
        let terms = request(&w).terms;
        // The provider decodes the renter's bytes and re-derives the id.
        let bytes = terms.canonical_bytes().unwrap();
        let decoded: LeaseTerms = gridlease_protocol::codec::decode::<_, 65536>(&bytes).unwrap();
        assert_eq!(decoded.lease_id().unwrap(), terms.lease_id().unwrap());
        let mut other = terms.clone();
        other.nonce += 1;
        assert_ne!(other.lease_id().unwrap(), terms.lease_id().unwrap());
    }
}
