//! The errors of the lease service's operations: [`RentError`] (renting), [`LeaseError`]
//! (every operation on a lease that exists) with its [`RemoteError`], and [`SessionRpcError`]
//! (one session request to the other side).

use gridlease_protocol::telemetry::TelemetryError;
use gridlease_protocol::{IdentityError, LeaseId, OfferId, RejectReason};

use super::negotiate::NegotiateError;
use super::wire::SessionResponse;
use crate::net::NegotiationError;
use crate::store::StoreError;

/// Why renting failed.
#[derive(Debug, thiserror::Error)]
pub enum RentError {
    /// The offer id is not a whole offer id.
    #[error("{0:?} is not an offer id (64 hex digits)")]
    BadOffer(String),
    /// The offer is not in the local book.
    #[error("offer {0} is not known to this node; search again")]
    UnknownOffer(OfferId),
    /// The offer is this node's own.
    #[error("offer {0} is this node's own offer: a node does not rent from itself")]
    OwnOffer(OfferId),
    /// The provider refused.
    #[error("the provider refused: {0:?}")]
    Rejected(RejectReason),
    /// Looking the offer up or negotiating with its provider failed.
    #[error(transparent)]
    Negotiation(#[from] NegotiateError),
    /// The renter's payment channel to the provider could not be read, opened or topped up:
    /// nothing was signed.
    #[error("the payment channel: {0}")]
    Chain(String),
    /// The budget computation overflowed.
    #[error("the price of this lease overflows")]
    Overflow(#[from] gridlease_contracts::MoneyError),
    /// More output retention asked than the offer gives.
    #[error(
        "the provider keeps a finished lease's outputs for at most {most} s; {asked} s were asked"
    )]
    KeepOutputs {
        /// Asked for.
        asked: u32,
        /// The offer's most.
        most: u32,
    },
    /// The image is not one the offer allows (its registries, prefixes and local images, as
    /// the offer states them): refused before anything is signed.
    #[error("image {image}: {}; the offer runs {allowed}", gridlease_contracts::image::refusal_text(.refusal))]
    ImageNotOffered {
        /// The image asked for.
        image: String,
        /// Why the offer's policy refuses it.
        refusal: gridlease_protocol::ImageRefusal,
        /// What the offer runs, in words.
        allowed: String,
    },
    /// A longer upload hold asked than the offer gives.
    #[error(
        "the provider holds a container for uploads for at most {most} s; {asked} s were asked"
    )]
    UploadHold {
        /// Asked for.
        asked: u32,
        /// The offer's most.
        most: u32,
    },
    /// The lease service has stopped.
    #[error("the lease service has stopped")]
    Closed,
}

/// Why a lease operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// No such lease on this node.
    #[error("no lease {0} on this node")]
    Unknown(LeaseId),
    /// The lease is not running (it has not started here yet, or it is over).
    #[error("lease {0} is not running")]
    NotRunning(LeaseId),
    /// The provider could not be reached or answered something unexpected.
    #[error("lease {lease_id}: {cause}")]
    Remote {
        /// The lease.
        lease_id: LeaseId,
        /// Why.
        #[source]
        cause: RemoteError,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The network failed.
    #[error(transparent)]
    Network(#[from] NegotiationError),
    /// The lease's GPUs cannot be checked (`verify-gpu`): why.
    #[error("lease {0}: no GPU check: {1}")]
    NoGpuCheck(LeaseId, String),
    /// The lease service has stopped.
    #[error("the lease service has stopped")]
    Closed,
}

/// Why the other side of a lease could not answer an operation ([`LeaseError::Remote`]).
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The session request got no answer.
    #[error(transparent)]
    Rpc(#[from] SessionRpcError),
    /// The provider's per-renter rate or its queues are full.
    #[error("the provider is busy (this node asked it too often); retry in a second")]
    Busy,
    /// An answer that does not fit the request.
    #[error("provider answered {0:?}")]
    Unexpected(Box<SessionResponse>),
    /// The provider's telemetry does not validate.
    #[error("the provider's telemetry is refused: {0}")]
    BadTelemetry(#[from] TelemetryError),
    /// The provider's key in the terms is no peer id.
    #[error(transparent)]
    BadProviderKey(#[from] IdentityError),
    /// Only the renter may do this, and this node provides the lease.
    #[error("this node provides the lease; the renter begins it")]
    NotRenter,
}

/// Why a session request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum SessionRpcError {
    /// No answer within [`super::LeaseServiceConfig::rpc_timeout`].
    #[error("timed out")]
    TimedOut,
    /// The request could not be delivered or answered.
    #[error(transparent)]
    Network(#[from] NegotiationError),
    /// The peer answered with a negotiation message.
    #[error("answered with a negotiation message")]
    NotSession,
    /// The task that waited for the answer failed.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}
