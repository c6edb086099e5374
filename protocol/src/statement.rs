//! A lease's statement: every signed message that says what is owed, in one self-contained
//! file a third party can check with no node and no network (`gridlease statement`, `gridlease
//! verify`; the rules are `gridlease_contracts::statement`).
//!
//! File layout: [`STATEMENT_MAGIC`] (8 bytes), then one [`Statement`] in the project's codec
//! ([`crate::codec`]: bincode 2, standard configuration, little-endian varints), at most
//! [`MAX_STATEMENT_BYTES`] in all. Each signed message inside is an [`crate::Envelope`]
//! exactly as it travelled: its signature covers the same bytes it covered on the wire.
//!
//! What it holds, in order: the offer the terms were made from (when the node kept it), the
//! renter's signed request and the provider's signed acceptance (the same terms: the lease),
//! every accepted amendment (the renter's proposal and the provider's acceptance), the usage
//! reports the node kept (contiguous by sequence; the provider keeps all of its own, a renter
//! the newest; each is cumulative, so the last carries the totals) and the last payment
//! receipt (the renter's signature over the cumulative amount: the settlement), and the
//! renter's GPU check at the start (`crate::proof::ProofRecord`: every signed message of it,
//! co-signed by the provider when it passed), and, from layout 3, the chain's payment of the
//! lease's last voucher as the provider's node recorded it ([`Redemption`], issue 50: not a
//! signed message; its evidence is the chain). Layouts 1 (no GPU check) and 2 (no redemption)
//! are still read.

use serde::{Deserialize, Serialize};

use crate::codec::{self, CodecError};
use crate::envelope::Signed;
use crate::messages::{
    AmendAccept, LeaseAccept, LeaseAmendment, LeaseRequest, Offer, PaymentReceipt, UsageReport,
};

/// First bytes of a statement file: "GLSTMT" and the layout version (3: with the redemption).
pub const STATEMENT_MAGIC: [u8; 8] = *b"GLSTMT\x00\x03";
/// The second layout (with the GPU check, no redemption), still read.
pub const STATEMENT_MAGIC_V2: [u8; 8] = *b"GLSTMT\x00\x02";
/// The first layout (no GPU check), still read.
pub const STATEMENT_MAGIC_V1: [u8; 8] = *b"GLSTMT\x00\x01";

/// The chain's payment of a lease's last voucher, as the provider's node recorded it after
/// reading the lane's total back from the channel contract (issue 50). Not signed: anyone
/// checks it against the chain (the transaction, and `lane_redeemed` of the lease's lane).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redemption {
    /// The chain's EIP-155 id.
    pub chain_id: u64,
    /// The transaction that paid it (`None`: paid before, by one the node did not see
    /// confirmed).
    pub tx: Option<[u8; 32]>,
    /// Its block (0 when the transaction is unknown).
    pub block: u64,
    /// What the lane was paid in all, in the token's smallest units.
    pub paid: u128,
}

/// Largest statement file accepted (magic included). A 30-day lease reporting every 10 s has
/// about 260,000 reports of about 330 bytes: some 86 MB.
pub const MAX_STATEMENT_BYTES: usize = 256 << 20;

/// An amendment and its acceptance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedAmendment {
    /// The renter's proposal.
    pub proposal: Signed<LeaseAmendment>,
    /// The provider's signature over the identical amendment.
    pub acceptance: Signed<AmendAccept>,
}

/// The bundle (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statement {
    /// The offer the terms name (`None`: not kept by the node that wrote the statement).
    pub offer: Option<Signed<Offer>>,
    /// The renter's signed request: the terms, the renter's signature.
    pub request: Signed<LeaseRequest>,
    /// The provider's signed acceptance of the same terms.
    pub accept: Signed<LeaseAccept>,
    /// Accepted amendments, in order (1, 2, ...).
    pub amendments: Vec<SignedAmendment>,
    /// Usage reports, by sequence.
    pub usage: Vec<Signed<UsageReport>>,
    /// The last payment receipt (`None`: nothing was paid).
    pub receipt: Option<Signed<PaymentReceipt>>,
    /// The renter's GPU check at the lease's start (`None`: not run, `rent --no-verify` or a
    /// provider without one; the terms' `verify_window_s` says which).
    pub proof: Option<crate::proof::ProofRecord>,
    /// The chain's payment of the last voucher (a provider's statement of a lease settled on
    /// chain, once redeemed; `None` otherwise).
    pub redemption: Option<Redemption>,
}

/// The second layout, without [`Statement::redemption`].
#[derive(Deserialize)]
struct StatementV2 {
    offer: Option<Signed<Offer>>,
    request: Signed<LeaseRequest>,
    accept: Signed<LeaseAccept>,
    amendments: Vec<SignedAmendment>,
    usage: Vec<Signed<UsageReport>>,
    receipt: Option<Signed<PaymentReceipt>>,
    proof: Option<crate::proof::ProofRecord>,
}

impl From<StatementV1> for StatementV2 {
    fn from(s: StatementV1) -> Self {
        Self {
            offer: s.offer,
            request: s.request,
            accept: s.accept,
            amendments: s.amendments,
            usage: s.usage,
            receipt: s.receipt,
            proof: None,
        }
    }
}

impl From<StatementV2> for Statement {
    fn from(s: StatementV2) -> Self {
        Self {
            offer: s.offer,
            request: s.request,
            accept: s.accept,
            amendments: s.amendments,
            usage: s.usage,
            receipt: s.receipt,
            proof: s.proof,
            redemption: None,
        }
    }
}

/// The first layout, without [`Statement::proof`].
#[derive(Deserialize)]
struct StatementV1 {
    offer: Option<Signed<Offer>>,
    request: Signed<LeaseRequest>,
    accept: Signed<LeaseAccept>,
    amendments: Vec<SignedAmendment>,
    usage: Vec<Signed<UsageReport>>,
    receipt: Option<Signed<PaymentReceipt>>,
}

/// Why bytes are not a statement.
#[derive(Debug, thiserror::Error)]
pub enum StatementFormatError {
    /// Too long to be one.
    #[error("{len} bytes: a statement is at most {MAX_STATEMENT_BYTES}")]
    TooLarge {
        /// Its length.
        len: usize,
    },
    /// Another kind of file.
    #[error("not a gridlease statement (it does not start with the statement magic)")]
    NotAStatement,
    /// The codec refused it.
    #[error("the statement does not decode: {0}")]
    Codec(#[from] CodecError),
}

impl Statement {
    /// The file's bytes: magic, then the encoded bundle.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CodecError> {
        let body = codec::encode::<Self, { MAX_STATEMENT_BYTES - 8 }>(self)?;
        let mut out = Vec::with_capacity(8 + body.len());
        out.extend_from_slice(&STATEMENT_MAGIC);
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Reads a statement file's bytes (signatures are not checked here).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, StatementFormatError> {
        if bytes.len() > MAX_STATEMENT_BYTES {
            return Err(StatementFormatError::TooLarge { len: bytes.len() });
        }
        if let Some(v1) = bytes.strip_prefix(&STATEMENT_MAGIC_V1[..]) {
            let s = codec::decode::<StatementV1, { MAX_STATEMENT_BYTES - 8 }>(v1)?;
            return Ok(StatementV2::from(s).into());
        }
        if let Some(v2) = bytes.strip_prefix(&STATEMENT_MAGIC_V2[..]) {
            let s = codec::decode::<StatementV2, { MAX_STATEMENT_BYTES - 8 }>(v2)?;
            return Ok(s.into());
        }
        let body = bytes
            .strip_prefix(&STATEMENT_MAGIC[..])
            .ok_or(StatementFormatError::NotAStatement)?;
        Ok(codec::decode::<Self, { MAX_STATEMENT_BYTES - 8 }>(body)?)
    }
}
