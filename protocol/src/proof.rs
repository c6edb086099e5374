//! Proof of GPU (issue 44): the challenge a renter runs at the start of its own lease, in an
//! unbilled verification window, to check that the leased GPUs are the ones advertised.
//!
//! The messages, in order (all on the lease stream, `crate::session`):
//!
//! 1. provider -> renter `Verifying { until }`: the container is created; the window is open.
//! 2. renter -> provider [`ProofChallenge`] (signed): the lease, the parameters, a fresh
//!    random seed, and a hash of a second secret (the *reveal*) that picks what is opened.
//!    Answered with the provider's signed [`ProofCommit`]: one BLAKE3 Merkle root per GEMM
//!    output (over its rows) and one over the VRAM fill (over its pages), made before the
//!    provider can know what will be checked. The renter times this round trip.
//! 3. renter -> provider `ProofOpen { reveal }`: answered with the provider's signed
//!    [`ProofOpening`]: for each index the reveal picks (a pure function of seed, commitment
//!    and reveal: `gridlease_contracts::proof`), the leaf it committed to and its Merkle path.
//! 4. renter -> provider [`ProofReport`] (signed): the hashes of the messages above, the
//!    reveal, the renter's timings and its verdict. A pass is answered with the provider's [`ProofAck`] (its signature over the
//!    same report), and billing starts with the command; a fail closes the lease with nothing
//!    billed. Either way the report is self-contained evidence (`gridlease verify`).
//!
//! The rules (parameters, derivation, checking) live in `gridlease_contracts::proof`; this
//! module is only the vocabulary and its size caps.

use serde::{Deserialize, Serialize};

use crate::envelope::{ENVELOPE_OVERHEAD, MessageKind, Signed, wire_message};
use crate::shape::{Shape, ShapeError};
use crate::types::{Digest, LeaseId, Timestamp};
pub use crate::types::{ProofBackend, ProofPolicy};

/// Most GEMMs in one challenge.
pub const MAX_PROOF_GEMMS: usize = 256;
/// Most indices opened in one challenge (rows and pages together).
pub const MAX_PROOF_OPENINGS: usize = 512;
/// Deepest Merkle path (a tree of at most 2^32 leaves).
pub const MAX_PROOF_PATH: usize = 32;
/// Longest free text in a proof message (a backend's note, a failure's detail).
pub const MAX_PROOF_TEXT: usize = 200;
/// Cap on an encoded [`ProofChallenge`].
pub const MAX_PROOF_CHALLENGE_BYTES: usize = 512;
/// Cap on an encoded [`ProofCommit`].
pub const MAX_PROOF_COMMIT_BYTES: usize = 1024 + MAX_PROOF_GEMMS * 40;
/// Cap on an encoded [`ProofOpening`]: every opening at the deepest path.
pub const MAX_PROOF_OPENING_BYTES: usize = 512 + MAX_PROOF_OPENINGS * (48 + MAX_PROOF_PATH * 33);
/// Cap on an encoded [`ProofReport`].
pub const MAX_PROOF_REPORT_BYTES: usize = 1024;
/// Cap on an encoded [`ProofRecord`].
pub const MAX_PROOF_RECORD_BYTES: usize = MAX_PROOF_CHALLENGE_BYTES
    + MAX_PROOF_COMMIT_BYTES
    + MAX_PROOF_OPENING_BYTES
    + MAX_PROOF_REPORT_BYTES
    + MAX_PROOF_ACK_BYTES
    + 5 * ENVELOPE_OVERHEAD
    + 64;
// The openings travel in one lease-stream response frame.
const _: () =
    assert!(MAX_PROOF_OPENING_BYTES + ENVELOPE_OVERHEAD + 64 <= crate::codec::MAX_FRAME_BYTES);
/// Cap on an encoded [`ProofAck`].
pub const MAX_PROOF_ACK_BYTES: usize = 128;

/// The sizes of one challenge, chosen by the renter (`gridlease_contracts::proof::params`)
/// and checked by the provider against its offer before it computes anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProofParams {
    /// Matrix dimension: `B` is n x n, each row of `A_i` and of `C_i` has n entries.
    pub n: u32,
    /// Independent GEMMs.
    pub gemms: u32,
    /// Rows of each `A_i` (and of its output `C_i = A_i B`).
    pub rows: u32,
    /// Rows opened in each GEMM.
    pub open_rows: u32,
    /// Bytes of the VRAM fill.
    pub vram_bytes: u64,
    /// Bytes of one VRAM page (a leaf of the fill's tree).
    pub page_bytes: u32,
    /// Pages opened.
    pub open_pages: u32,
    /// The renter's limit on seed-to-commitment time, less the round trip, milliseconds.
    pub limit_ms: u64,
}

/// The renter's challenge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofChallenge {
    /// The lease.
    pub lease_id: LeaseId,
    /// The sizes.
    pub params: ProofParams,
    /// The backend the renter expects (from the offer).
    pub backend: ProofBackend,
    /// Fresh randomness: every matrix and page derives from it.
    #[serde(with = "serde_bytes")]
    pub seed: [u8; 32],
    /// BLAKE3 of the reveal sent after the commitment (it picks the openings).
    pub reveal_hash: Digest,
    /// When the renter sent it (its clock).
    pub sent_at: Timestamp,
}

impl Shape for ProofChallenge {
    fn check_shape(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        if p.gemms == 0 || p.gemms as usize > MAX_PROOF_GEMMS {
            return Err(ShapeError {
                field: "params.gemms",
                problem: format!("{} GEMMs, 1..={MAX_PROOF_GEMMS} allowed", p.gemms),
            });
        }
        let opened = u64::from(p.gemms) * u64::from(p.open_rows) + u64::from(p.open_pages);
        if opened > MAX_PROOF_OPENINGS as u64 {
            return Err(ShapeError {
                field: "params",
                problem: format!("{opened} openings, at most {MAX_PROOF_OPENINGS}"),
            });
        }
        Ok(())
    }
}

/// The provider's commitment, made before it learns what is opened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofCommit {
    /// The lease.
    pub lease_id: LeaseId,
    /// Hash of the signed challenge it answers (its envelope bytes): a commitment made for
    /// another seed cannot be replayed.
    pub challenge: Digest,
    /// The backend that computed it.
    pub backend: ProofBackend,
    /// Merkle root over the rows of each `C_i`, in order.
    pub gemm_roots: Vec<Digest>,
    /// Merkle root over the pages of the VRAM fill.
    pub vram_root: Digest,
    /// Bytes the provider filled (what it could allocate; the renter checks it is enough).
    pub vram_bytes: u64,
    /// The provider's own measurement, milliseconds: the GEMMs, the fill and the hashing.
    /// Informational only: the renter's clock decides.
    pub work_ms: u64,
    /// Free text from the backend (the device, a note), at most [`MAX_PROOF_TEXT`] bytes.
    pub note: String,
}

impl Shape for ProofCommit {
    fn check_shape(&self) -> Result<(), ShapeError> {
        if self.gemm_roots.len() > MAX_PROOF_GEMMS {
            return Err(ShapeError {
                field: "gemm_roots",
                problem: format!("{} roots, at most {MAX_PROOF_GEMMS}", self.gemm_roots.len()),
            });
        }
        if self.note.len() > MAX_PROOF_TEXT {
            return Err(ShapeError {
                field: "note",
                problem: format!("{} bytes, at most {MAX_PROOF_TEXT}", self.note.len()),
            });
        }
        Ok(())
    }
}

/// What one opening opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ProofIndex {
    /// Row `row` of the output of GEMM `gemm`.
    Row {
        /// The GEMM.
        gemm: u32,
        /// The row.
        row: u32,
    },
    /// Page `page` of the VRAM fill.
    Page {
        /// The page.
        page: u64,
    },
}

/// One opened leaf: the leaf hash the provider committed to and its path to the root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofLeaf {
    /// What is opened.
    pub index: ProofIndex,
    /// The leaf hash in the committed tree.
    pub leaf: Digest,
    /// Sibling hashes from the leaf up to the root.
    pub path: Vec<Digest>,
}

/// The provider's openings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofOpening {
    /// The lease.
    pub lease_id: LeaseId,
    /// Hash of the signed commitment it opens.
    pub commit: Digest,
    /// One per index the reveal picked, in the order `gridlease_contracts::proof` lists them.
    pub leaves: Vec<ProofLeaf>,
}

impl Shape for ProofOpening {
    fn check_shape(&self) -> Result<(), ShapeError> {
        if self.leaves.len() > MAX_PROOF_OPENINGS {
            return Err(ShapeError {
                field: "leaves",
                problem: format!("{} leaves, at most {MAX_PROOF_OPENINGS}", self.leaves.len()),
            });
        }
        if self.leaves.iter().any(|l| l.path.len() > MAX_PROOF_PATH) {
            return Err(ShapeError {
                field: "leaves.path",
                problem: format!("a path deeper than {MAX_PROOF_PATH}"),
            });
        }
        Ok(())
    }
}

/// The renter's measurements, its own clock, milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProofTiming {
    /// The round trip of an empty request just before the challenge (the least of a few).
    pub rtt_ms: u64,
    /// From the challenge sent to the commitment received.
    pub commit_ms: u64,
    /// From the reveal sent to the openings received.
    pub open_ms: u64,
    /// The renter's CPU time checking the openings.
    pub check_cpu_ms: u64,
}

/// Which part of a check failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProofFailure {
    /// The provider did not answer a step within the window (or refused it).
    NoAnswer {
        /// Which step.
        step: String,
    },
    /// The commitment does not answer this challenge (another lease, another challenge: a
    /// replay), or has the wrong shape.
    BadCommit {
        /// What is wrong.
        detail: String,
    },
    /// The openings do not answer this commitment, or open other indices.
    BadOpening {
        /// What is wrong.
        detail: String,
    },
    /// Opened rows whose committed leaf is not the hash of the true row of `A_i B`.
    WrongRows {
        /// How many of the opened rows.
        wrong: u32,
        /// Of how many opened.
        opened: u32,
        /// The first wrong one.
        first: ProofIndex,
    },
    /// Opened leaves whose path does not lead to the committed root.
    BadPaths {
        /// How many.
        bad: u32,
        /// The first.
        first: ProofIndex,
    },
    /// Opened VRAM pages whose committed leaf is not the hash of the seeded page.
    WrongPages {
        /// How many of the opened pages.
        wrong: u32,
        /// Of how many opened.
        opened: u32,
        /// The first.
        first: ProofIndex,
    },
    /// The fill is smaller than the challenge asked.
    VramShort {
        /// Bytes filled.
        filled: u64,
        /// Bytes asked.
        required: u64,
    },
    /// The commitment came too late for the advertised GPUs.
    TooSlow {
        /// Seed-to-commitment time less the round trip, milliseconds.
        took_ms: u64,
        /// The limit.
        limit_ms: u64,
    },
}

/// The renter's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProofVerdict {
    /// Every part held.
    Passed,
    /// A part failed (the first found, in the order the rules check).
    Failed(ProofFailure),
}

impl ProofVerdict {
    /// True for a pass.
    pub fn passed(&self) -> bool {
        matches!(self, Self::Passed)
    }
}

/// The renter's signed summary of one check: the hashes of what it sent and what the provider
/// signed, the reveal, what it measured and what it concluded. With the messages it names
/// (a [`ProofRecord`]) it is self-contained: anyone re-checks it with
/// `gridlease_contracts::proof::check_record` and nothing else (the timing is the renter's
/// word; every other failure is proved by the provider's own signatures).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofReport {
    /// The lease.
    pub lease_id: LeaseId,
    /// Hash of the signed challenge ([`envelope_hash`]).
    pub challenge: Digest,
    /// Hash of the provider's signed commitment (`None`: it never answered).
    pub commit: Option<Digest>,
    /// The reveal whose hash the challenge carried (zeros when never sent).
    #[serde(with = "serde_bytes")]
    pub reveal: [u8; 32],
    /// Hash of the provider's signed openings (`None`: never asked or never answered).
    pub opening: Option<Digest>,
    /// The renter's measurements.
    pub timing: ProofTiming,
    /// What the renter concluded.
    pub verdict: ProofVerdict,
    /// When the renter concluded (its clock).
    pub decided_at: Timestamp,
}

impl Shape for ProofReport {
    fn check_shape(&self) -> Result<(), ShapeError> {
        Ok(())
    }
}

/// The provider's signature over a passed report: the pass is co-signed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofAck {
    /// The lease.
    pub lease_id: LeaseId,
    /// Hash of the signed report (its envelope bytes).
    pub report: Digest,
}

impl Shape for ProofAck {
    fn check_shape(&self) -> Result<(), ShapeError> {
        Ok(())
    }
}

wire_message!(
    ProofChallenge,
    MessageKind::ProofChallenge,
    MAX_PROOF_CHALLENGE_BYTES
);
wire_message!(
    ProofCommit,
    MessageKind::ProofCommit,
    MAX_PROOF_COMMIT_BYTES
);
wire_message!(
    ProofOpening,
    MessageKind::ProofOpening,
    MAX_PROOF_OPENING_BYTES
);
wire_message!(
    ProofReport,
    MessageKind::ProofReport,
    MAX_PROOF_REPORT_BYTES
);
wire_message!(ProofAck, MessageKind::ProofAck, MAX_PROOF_ACK_BYTES);

/// A check as a lease record and a statement keep it: every signed message of it, the
/// renter's report and, for a pass, the provider's signature over that report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofRecord {
    /// The renter's challenge.
    pub challenge: Signed<ProofChallenge>,
    /// The provider's commitment (`None`: it never answered).
    pub commit: Option<Signed<ProofCommit>>,
    /// The provider's openings (`None`: never asked or never answered).
    pub opening: Option<Signed<ProofOpening>>,
    /// The renter's signed report.
    pub report: Signed<ProofReport>,
    /// The provider's co-signature (`None` for a failure: a cheat does not sign its failure,
    /// and need not, its signed commitment and openings prove it).
    pub ack: Option<Signed<ProofAck>>,
}

impl ProofRecord {
    /// The record's bytes (the project's codec).
    pub fn to_bytes(&self) -> Result<Vec<u8>, crate::CodecError> {
        crate::codec::encode::<Self, MAX_PROOF_RECORD_BYTES>(self)
    }

    /// A record from its bytes (signatures are not checked here).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, crate::CodecError> {
        crate::codec::decode::<Self, MAX_PROOF_RECORD_BYTES>(bytes)
    }
}

/// Hash of a signed message's envelope bytes, as commitments and acks name what they answer.
pub fn envelope_hash<T: crate::WireMessage>(signed: &Signed<T>) -> Digest {
    let bytes = signed.to_bytes().unwrap_or_default();
    Digest::of("gridlease/v1/proof-envelope", &bytes)
}
