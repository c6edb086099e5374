//! The renter's half of negotiation (the provider's is the [`super::desk`]): sign the terms
//! as a request, send it over the lease stream ([`Client::lease_rpc`]: `net` only carries
//! it), check the provider's answer and store the accepted lease, stamped by the caller's
//! clock (the service's [`super::LeaseServiceConfig::clock`]).

use gridlease_contracts::terms::{AcceptError, check_accept};
use gridlease_contracts::{Actor, Lease, LeaseEvent};
use gridlease_protocol::session::{LeaseRpc, LeaseRpcResponse};
use gridlease_protocol::{
    CodecError, EnvelopeError, LeaseAccept, LeaseId, LeaseReject, LeaseRequest, LeaseTerms, PeerId,
    RejectReason, Signed, Timestamp,
};
use libp2p::Multiaddr;

use crate::clock::Clock;
use crate::net::{Client, NegotiationError};
use crate::store::{Role, StoreError, StoredLease};

/// Why a negotiation failed (a rejection is not a failure: see [`NegotiationOutcome`]).
#[derive(Debug, thiserror::Error)]
pub enum NegotiateError {
    /// The terms could not be encoded or signed.
    #[error("cannot sign the request: {0}")]
    Codec(#[from] CodecError),
    /// The provider key does not map to a peer id.
    #[error("provider key is not a valid peer id")]
    BadProvider,
    /// The request could not be delivered or answered (or the network task has stopped).
    #[error(transparent)]
    Network(#[from] NegotiationError),
    /// The provider's answer does not verify.
    #[error("provider's answer does not verify: {0}")]
    BadSignature(#[from] EnvelopeError),
    /// The acceptance does not match what was asked.
    #[error("provider's acceptance is not valid: {0}")]
    BadAccept(#[from] AcceptError),
    /// A rejection for another request (or an acceptance the lease's state machine refuses).
    #[error("provider's rejection does not answer this request")]
    BadReject,
    /// The provider answered the proposal with a session message.
    #[error("lease request to {peer} failed: provider answered a proposal with a session message")]
    Unexpected {
        /// The provider.
        peer: PeerId,
    },
    /// The lease could not be stored.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The result of a negotiation.
#[derive(Debug, Clone)]
pub enum NegotiationOutcome {
    /// Both signatures exist and the lease is stored on this side.
    Accepted {
        /// The lease id (hash of the terms).
        lease_id: LeaseId,
        /// The renter's signed request.
        request: Signed<LeaseRequest>,
        /// The provider's signed acceptance.
        accept: Signed<LeaseAccept>,
        /// The lease as this node stored it (its session starts from it).
        stored: Box<StoredLease>,
    },
    /// The provider refused.
    Rejected {
        /// Why.
        reason: RejectReason,
        /// The signed refusal.
        reject: Signed<LeaseReject>,
    },
}

/// The renter's negotiation: signs `terms` as a request valid until `expires_at`, sends it
/// to the provider, verifies the answer (provider's signature, identical terms, lease id,
/// GPU count) and stores the lease (created at `clock`'s now) before returning. `addrs` are
/// dial hints (e.g. the offer's addresses).
pub async fn negotiate(
    client: &Client,
    clock: &dyn Clock,
    terms: LeaseTerms,
    expires_at: Timestamp,
    addrs: Vec<Multiaddr>,
) -> Result<NegotiationOutcome, NegotiateError> {
    let request = Signed::sign(
        client.key(),
        client.network(),
        &LeaseRequest {
            terms: terms.clone(),
            expires_at,
        },
    )?;
    negotiate_signed(client, clock, request, terms, addrs).await
}

/// [`negotiate`] with an already signed request (retries resend the same bytes).
pub async fn negotiate_signed(
    client: &Client,
    clock: &dyn Clock,
    request: Signed<LeaseRequest>,
    terms: LeaseTerms,
    addrs: Vec<Multiaddr>,
) -> Result<NegotiationOutcome, NegotiateError> {
    let peer = terms
        .provider
        .peer_id()
        .map_err(|_| NegotiateError::BadProvider)?;
    let answer = client
        .lease_rpc(peer, addrs, LeaseRpc::Propose(request.clone()))
        .await?;
    match answer {
        LeaseRpcResponse::Accepted(accept) => {
            let stored = accepted(client, clock, &request, &terms, &accept)?;
            let lease_id = stored.lease.id;
            let row = stored.clone();
            client.store().call(move |s| s.insert_lease(&row)).await?;
            Ok(NegotiationOutcome::Accepted {
                lease_id,
                request,
                accept,
                stored: Box::new(stored),
            })
        }
        LeaseRpcResponse::Rejected(reject) => {
            let v = reject.verify(client.network())?;
            if v.signer != terms.provider || v.message.nonce != terms.nonce {
                return Err(NegotiateError::BadReject);
            }
            Ok(NegotiationOutcome::Rejected {
                reason: v.message.reason,
                reject,
            })
        }
        LeaseRpcResponse::Session(_) => Err(NegotiateError::Unexpected { peer }),
    }
}

/// Checks the provider's acceptance of `terms` and makes the renter's lease row from it
/// (not stored yet): the provider's `Accept` applied at its `accepted_at`, the row created
/// at `clock`'s now.
fn accepted(
    client: &Client,
    clock: &dyn Clock,
    request: &Signed<LeaseRequest>,
    terms: &LeaseTerms,
    accept: &Signed<LeaseAccept>,
) -> Result<StoredLease, NegotiateError> {
    let v = accept.verify(client.network())?;
    let lease_id = check_accept(terms, &v.message, &v.signer)?;
    let mut lease = Lease::propose(lease_id, terms.clone());
    // The renter records the provider's acceptance as the provider's event.
    lease
        .apply(LeaseEvent::Accept, Actor::Provider, v.message.accepted_at)
        .map_err(|_| NegotiateError::BadReject)?;
    Ok(StoredLease {
        role: Role::Renter,
        lease,
        request: request.clone(),
        accept: Some(accept.clone()),
        gpus: v.message.gpus.clone(),
        created_at: clock.now(),
    })
}

/// A nonce unique per renter: the clock in nanoseconds (requests are idempotent by nonce, so
/// only uniqueness matters).
pub(super) fn fresh_nonce() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(1)
}
