//! Co-signed lease completions (issue 16): the record of one settled lease that both sides
//! signed, which is what reputation is computed from.
//!
//! At settlement the provider signs a [`Completion`] (the lease, both keys, the GPU-seconds
//! delivered, the amount paid, the outcome, the GPU check's result) and sends it to the renter; the renter checks every
//! field against its own ledger and, when they agree, signs the identical body as a
//! [`CompletionAck`]. The pair is a [`CoSigned`] completion: neither side can make one alone,
//! and neither can change one afterwards. Providers gossip their recent ones
//! ([`CompletionBatch`]); anyone checks them with [`CoSigned::verify`] and no other context.
//!
//! What a co-signature proves is agreement, not truth: a provider that rents to itself from
//! fresh keys gets valid records. The scoring rules (`gridlease_contracts::reputation`) weigh
//! each record by the renter's own history for that reason.

use serde::{Deserialize, Serialize};

use crate::envelope::{EnvelopeError, MessageKind, NetworkId, Signed, wire_message};
use crate::identity::PublicKey;
use crate::shape::{Shape, ShapeError};
use crate::types::{LeaseId, Timestamp};

/// Cap on an encoded [`Completion`] (and so on a [`CompletionAck`]).
pub const MAX_COMPLETION_BYTES: usize = 256;
/// Most completions in one [`CompletionBatch`] (one gossip message: about 7 KB).
pub const MAX_BATCH_COMPLETIONS: usize = 16;
/// Cap on an encoded [`CoSigned`] pair.
pub const MAX_COSIGNED_BYTES: usize = 1024;
/// Cap on an encoded [`CompletionBatch`].
pub const MAX_COMPLETION_BATCH_BYTES: usize = MAX_BATCH_COMPLETIONS * MAX_COSIGNED_BYTES;

/// How a lease ended, as both sides agree to record it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CompletionOutcome {
    /// It ran to its end, or its renter stopped it, and it was paid.
    Completed,
    /// The provider failed it (stopped it, vanished, the container did not start).
    ProviderFailed,
    /// The renter failed it (stopped paying, vanished, sent a bad receipt).
    RenterFailed,
    /// The two sides' accounts of the lease disagree.
    Disputed,
}

impl CompletionOutcome {
    /// The outcome a lease that closed for `reason` records.
    pub fn of_close(reason: crate::CloseReason) -> Self {
        use crate::CloseReason as R;
        match reason {
            // An interruptible offer said the owner may take the GPU back: no failure.
            R::Expired
            | R::RenterStop
            | R::ContainerExited
            | R::BudgetExhausted
            | R::OwnerReclaimed => Self::Completed,
            R::ProviderStop | R::ProviderUnreachable | R::StartFailed | R::GpuCheckFailed => {
                Self::ProviderFailed
            }
            R::PaymentLagging | R::RenterUnreachable | R::BadReceipt => Self::RenterFailed,
            R::ImplausibleUsage => Self::Disputed,
        }
    }

    /// The outcome in words (`completed`, `provider-failed`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::ProviderFailed => "provider-failed",
            Self::RenterFailed => "renter-failed",
            Self::Disputed => "disputed",
        }
    }
}

/// What the renter's GPU check at the start of the lease (proof of GPU, issue 44:
/// [`crate::proof`]) came to, as both sides agree to record it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GpuCheck {
    /// No check ran: the terms had no verification window (`LeaseTerms::verify_window_s` 0),
    /// or the lease ended before one finished.
    #[default]
    NotRun,
    /// The check passed and the provider co-signed the pass (`ProofRecord::ack`).
    Passed,
    /// The check failed (or passed without the provider's co-signature): the lease closed
    /// `GpuCheckFailed`, unbilled.
    Failed,
}

impl GpuCheck {
    /// The result in words (`none`, `passed`, `failed`).
    pub fn name(self) -> &'static str {
        match self {
            Self::NotRun => "none",
            Self::Passed => "passed",
            Self::Failed => "failed",
        }
    }
}

/// One settled lease as its provider records it (signed by the provider).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    /// The lease.
    pub lease_id: LeaseId,
    /// The provider's key (the signer of this record).
    pub provider: PublicKey,
    /// The renter's key (the signer of the [`CompletionAck`]).
    pub renter: PublicKey,
    /// GPU-seconds the last receipt paid for (its wall time x the lease's GPUs, rounded down).
    pub gpu_seconds: u64,
    /// What the last receipt paid, micro-units.
    pub paid: u64,
    /// When the lease closed (the provider's clock).
    pub closed_at: Timestamp,
    /// How it ended.
    pub outcome: CompletionOutcome,
    /// The renter's GPU check of the lease.
    pub gpu_check: GpuCheck,
}

impl Shape for Completion {
    fn check_shape(&self) -> Result<(), ShapeError> {
        if self.provider == self.renter {
            return Err(ShapeError {
                field: "renter",
                problem: "a provider cannot record a lease with itself".into(),
            });
        }
        Ok(())
    }
}

/// The renter's signature over the identical [`Completion`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletionAck {
    /// The provider's record, unchanged.
    pub completion: Completion,
}

impl Shape for CompletionAck {
    fn check_shape(&self) -> Result<(), ShapeError> {
        self.completion.check_shape()
    }
}

wire_message!(Completion, MessageKind::Completion, MAX_COMPLETION_BYTES);
wire_message!(
    CompletionAck,
    MessageKind::CompletionAck,
    MAX_COMPLETION_BYTES
);

/// A completion both sides signed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoSigned {
    /// The provider's record.
    pub provider: Signed<Completion>,
    /// The renter's signature over the same record.
    pub renter: Signed<CompletionAck>,
}

/// Why a co-signed completion is refused.
#[derive(Debug, thiserror::Error)]
pub enum CompletionError {
    /// A signature or an envelope is bad.
    #[error("the {who}'s signature does not verify: {source}")]
    Signature {
        /// `provider` or `renter`.
        who: &'static str,
        /// Why.
        #[source]
        source: EnvelopeError,
    },
    /// Signed by a key other than the one the record names.
    #[error("the {who}'s part is signed by another key than the record names")]
    WrongSigner {
        /// `provider` or `renter`.
        who: &'static str,
    },
    /// The two signed bodies differ.
    #[error("the renter signed a different record than the provider")]
    Mismatch,
    /// A field is out of bounds.
    #[error("malformed completion: {0}")]
    Shape(#[from] ShapeError),
}

impl CoSigned {
    /// Encodes the pair (the project's codec).
    pub fn to_bytes(&self) -> Result<Vec<u8>, crate::CodecError> {
        crate::codec::encode::<Self, MAX_COSIGNED_BYTES>(self)
    }

    /// Decodes a pair (signatures are not checked here).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, crate::CodecError> {
        crate::codec::decode::<Self, MAX_COSIGNED_BYTES>(bytes)
    }

    /// The provider's record, decoded without checking anything: only for pairs that were
    /// verified before they were stored.
    pub fn record_unchecked(&self) -> Result<Completion, crate::CodecError> {
        use crate::envelope::WireMessage as _;
        Completion::decode_payload(&self.provider.envelope().payload)
    }

    /// Checks both signatures, that each is by the key the record names, and that both signed
    /// the same record; returns the record.
    pub fn verify(&self, network: &NetworkId) -> Result<Completion, CompletionError> {
        let p = self
            .provider
            .verify(network)
            .map_err(|source| CompletionError::Signature {
                who: "provider",
                source,
            })?;
        let r = self
            .renter
            .verify(network)
            .map_err(|source| CompletionError::Signature {
                who: "renter",
                source,
            })?;
        let c = p.message;
        c.check_shape()?;
        if p.signer != c.provider {
            return Err(CompletionError::WrongSigner { who: "provider" });
        }
        if r.signer != c.renter {
            return Err(CompletionError::WrongSigner { who: "renter" });
        }
        if r.message.completion != c {
            return Err(CompletionError::Mismatch);
        }
        Ok(c)
    }
}

/// A provider's recent completions, as it publishes them (newest last). Each is checked on its
/// own: one bad record is dropped, not the batch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompletionBatch {
    /// The records, at most [`MAX_BATCH_COMPLETIONS`].
    pub completions: Vec<CoSigned>,
}

impl CompletionBatch {
    /// Encodes for the wire.
    pub fn to_bytes(&self) -> Result<Vec<u8>, crate::CodecError> {
        crate::codec::encode::<Self, MAX_COMPLETION_BATCH_BYTES>(self)
    }

    /// Decodes from the wire (signatures are not checked here), refusing more than
    /// [`MAX_BATCH_COMPLETIONS`] records.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, crate::CodecError> {
        let b: Self = crate::codec::decode::<Self, MAX_COMPLETION_BATCH_BYTES>(bytes)?;
        if b.completions.len() > MAX_BATCH_COMPLETIONS {
            return Err(crate::CodecError::TooLarge {
                len: b.completions.len(),
                max: MAX_BATCH_COMPLETIONS,
            });
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeKey;

    fn net() -> NetworkId {
        NetworkId::devnet()
    }

    fn record(p: &NodeKey, r: &NodeKey) -> Completion {
        Completion {
            lease_id: LeaseId(crate::Digest([7; 32])),
            provider: p.public(),
            renter: r.public(),
            gpu_seconds: 3600,
            paid: 1_250_000,
            closed_at: Timestamp(1_700_000_000_000),
            outcome: CompletionOutcome::Completed,
            gpu_check: GpuCheck::Passed,
        }
    }

    fn cosign(p: &NodeKey, r: &NodeKey, c: &Completion) -> CoSigned {
        CoSigned {
            provider: Signed::sign(p, &net(), c).unwrap(),
            renter: Signed::sign(
                r,
                &net(),
                &CompletionAck {
                    completion: c.clone(),
                },
            )
            .unwrap(),
        }
    }

    #[test]
    fn a_cosigned_completion_verifies_and_round_trips() {
        let (p, r) = (NodeKey::from_secret([1; 32]), NodeKey::from_secret([2; 32]));
        let c = record(&p, &r);
        let both = cosign(&p, &r, &c);
        assert_eq!(both.verify(&net()).unwrap(), c);
        let batch = CompletionBatch {
            completions: vec![both.clone(), both],
        };
        let back = CompletionBatch::from_bytes(&batch.to_bytes().unwrap()).unwrap();
        let one = CoSigned::from_bytes(&batch.completions[0].to_bytes().unwrap()).unwrap();
        assert_eq!(one.record_unchecked().unwrap(), c);
        assert_eq!(back, batch);
        assert_eq!(back.completions[0].verify(&net()).unwrap(), c);
    }

    #[test]
    fn every_forgery_is_refused_with_its_reason() {
        let (p, r, x) = (
            NodeKey::from_secret([1; 32]),
            NodeKey::from_secret([2; 32]),
            NodeKey::from_secret([3; 32]),
        );
        let c = record(&p, &r);
        // The renter signed other numbers.
        let mut other = c.clone();
        other.paid += 1;
        let mut both = cosign(&p, &r, &c);
        both.renter = Signed::sign(&r, &net(), &CompletionAck { completion: other }).unwrap();
        assert!(matches!(
            both.verify(&net()),
            Err(CompletionError::Mismatch)
        ));
        // A third key signs in the renter's place.
        let both = CoSigned {
            renter: cosign(&x, &x, &c).renter,
            ..cosign(&p, &r, &c)
        };
        assert!(matches!(
            both.verify(&net()),
            Err(CompletionError::WrongSigner { who: "renter" })
        ));
        // The renter signs both parts.
        let both = cosign(&r, &r, &c);
        assert!(matches!(
            both.verify(&net()),
            Err(CompletionError::WrongSigner { who: "provider" })
        ));
        // A lease with itself.
        let selfish = record(&p, &p);
        assert!(matches!(
            cosign(&p, &p, &selfish).verify(&net()),
            Err(CompletionError::Shape(_))
        ));
        // A flipped byte in either signature.
        let mut both = cosign(&p, &r, &c);
        let mut bytes = both.provider.to_bytes().unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        both.provider = Signed::from_bytes(&bytes).unwrap();
        assert!(matches!(
            both.verify(&net()),
            Err(CompletionError::Signature {
                who: "provider",
                ..
            })
        ));
        // Another network.
        let both = cosign(&p, &r, &c);
        assert!(
            both.verify(&NetworkId::new("gridlease-other").unwrap())
                .is_err()
        );
    }

    #[test]
    fn the_largest_completion_fits_its_caps() {
        use crate::envelope::WireMessage as _;
        let (p, r) = (NodeKey::from_secret([1; 32]), NodeKey::from_secret([2; 32]));
        let c = Completion {
            gpu_seconds: u64::MAX,
            paid: u64::MAX,
            closed_at: Timestamp(u64::MAX),
            outcome: CompletionOutcome::Disputed,
            gpu_check: GpuCheck::Failed,
            ..record(&p, &r)
        };
        let ack = CompletionAck {
            completion: c.clone(),
        };
        let body = c.encode_payload().unwrap().len();
        let acked = ack.encode_payload().unwrap().len();
        assert!(
            body <= MAX_COMPLETION_BYTES && acked <= MAX_COMPLETION_BYTES,
            "{body} {acked}"
        );
        let pair = cosign(&p, &r, &c);
        let bytes = pair.to_bytes().unwrap();
        assert!(bytes.len() <= MAX_COSIGNED_BYTES, "{}", bytes.len());
        assert_eq!(
            CoSigned::from_bytes(&bytes)
                .unwrap()
                .verify(&net())
                .unwrap(),
            c
        );
        let names: Vec<_> = [GpuCheck::NotRun, GpuCheck::Passed, GpuCheck::Failed]
            .map(GpuCheck::name)
            .into();
        assert_eq!(names, ["none", "passed", "failed"]);
    }

    #[test]
    fn outcomes_follow_the_close_reason() {
        use crate::CloseReason as R;
        assert_eq!(
            CompletionOutcome::of_close(R::Expired),
            CompletionOutcome::Completed
        );
        assert_eq!(
            CompletionOutcome::of_close(R::StartFailed),
            CompletionOutcome::ProviderFailed
        );
        assert_eq!(
            CompletionOutcome::of_close(R::PaymentLagging),
            CompletionOutcome::RenterFailed
        );
        assert_eq!(
            CompletionOutcome::of_close(R::ImplausibleUsage),
            CompletionOutcome::Disputed
        );
    }
}
