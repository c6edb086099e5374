//! Session plumbing shared by the provider's and the renter's sessions: how inbound session
//! requests reach a session ([`InboundSession`], [`SessionReply`], [`SessionMsg`]),
//! persist-before-act transitions ([`apply_and_persist`], [`transition`]) and signing
//! ([`sign`]). One session request to the other side is [`super::rpc::session_rpc`].

use gridlease_protocol::session::LeaseRpcResponse;
use gridlease_protocol::{PeerId, PublicKey, Signed};
use tokio::sync::oneshot;

use super::ctx::Ctx;
use super::extend;
use super::wire::{SessionRequest, SessionResponse};
use crate::store::{Role, StoreError, StoredLease};

/// Where a session answers an inbound request (the network loop sends it to the peer).
#[derive(Debug)]
pub struct SessionReply(pub(super) oneshot::Sender<LeaseRpcResponse>);

impl SessionReply {
    /// Answers the request; false when the network loop no longer waits for it.
    pub fn send(self, r: SessionResponse) -> bool {
        self.0.send(LeaseRpcResponse::Session(r)).is_ok()
    }
}

/// An inbound session request for one of this node's leases.
#[derive(Debug)]
pub struct InboundSession {
    /// The connected peer that sent it (the network authenticated it).
    pub peer: PeerId,
    /// The request.
    pub request: SessionRequest,
    /// Where to answer.
    pub reply: SessionReply,
}

/// Messages to a session task.
#[derive(Debug)]
pub(crate) enum SessionMsg {
    /// A request from the counterparty.
    Inbound(Box<InboundSession>),
    /// Stop the lease locally (renter: close; provider: stop the container).
    Stop(oneshot::Sender<()>),
    /// Provider: stop the lease because the owner takes its GPU back (an interruptible offer:
    /// [`owner`]); the same stop as [`SessionMsg::Stop`], closed `OwnerReclaimed`.
    Reclaim(oneshot::Sender<()>),
    /// Provider: end the lease as its renter's stop, its `/workspace` kept for the volume
    /// that adopts it (`stop --keep-disk`; [`Ctx::hand_over`](super::ctx::Ctx::hand_over)).
    HandOver,
    /// Extend the lease (renter only; [`extend`]).
    Extend(Box<extend::ExtendAsk>),
    /// Re-check the running lease's GPUs (renter only; `gridlease verify-gpu`).
    VerifyGpu(oneshot::Sender<Result<super::check_view::GpuCheckView, String>>),
}

/// Why a transition did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TransitionFailed {
    /// The state machine refuses it in this state.
    #[error("refused by the lease state machine: {0}")]
    Refused(#[from] gridlease_contracts::lease::TransitionError),
    /// The store could not write it; the lease did not advance.
    #[error("not stored: {0}")]
    Store(#[from] StoreError),
}

/// Persist before act: computes the transition on a copy of `lease` at the service clock's
/// now, stores it with `patch`, and only once that committed advances `lease`. A refused
/// transition or a failed write leaves `lease` as it was.
pub(crate) async fn apply_and_persist(
    ctx: &Ctx,
    lease: &mut gridlease_contracts::Lease,
    event: gridlease_contracts::LeaseEvent,
    actor: gridlease_contracts::Actor,
    patch: crate::store::lease::SessionPatch,
) -> Result<(), TransitionFailed> {
    apply_and_persist_at(ctx, lease, event, actor, patch, ctx.now()).await
}

/// [`apply_and_persist`], logging a transition that did not happen; true when it did.
pub(crate) async fn transition(
    ctx: &Ctx,
    lease: &mut gridlease_contracts::Lease,
    event: gridlease_contracts::LeaseEvent,
    actor: gridlease_contracts::Actor,
    patch: crate::store::lease::SessionPatch,
) -> bool {
    match apply_and_persist(ctx, lease, event, actor, patch).await {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(?event, error = %e, "lease transition did not happen");
            false
        }
    }
}

/// [`apply_and_persist`] for an event that happened at `at` (e.g. a start the renter learns
/// of from the provider's report).
pub(crate) async fn apply_and_persist_at(
    ctx: &Ctx,
    lease: &mut gridlease_contracts::Lease,
    event: gridlease_contracts::LeaseEvent,
    actor: gridlease_contracts::Actor,
    patch: crate::store::lease::SessionPatch,
    at: gridlease_protocol::Timestamp,
) -> Result<(), TransitionFailed> {
    let mut next = lease.clone();
    next.apply(event, actor, at)?;
    let id = next.id;
    let t = next.history.last().copied();
    let state = next.state;
    ctx.store
        .call(move |s| s.lease_transition(&id, t.as_ref(), state, &patch))
        .await?;
    *lease = next;
    Ok(())
}

/// Signs a message with this node's key.
pub(crate) fn sign<T: gridlease_protocol::WireMessage>(ctx: &Ctx, msg: &T) -> Option<Signed<T>> {
    match Signed::sign(ctx.client.key(), ctx.client.network(), msg) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!(error = %e, "cannot sign a session message");
            None
        }
    }
}

/// The counterparty's key of a lease seen from `role`.
pub(crate) fn counterparty(l: &StoredLease) -> PublicKey {
    match l.role {
        Role::Provider => l.lease.terms.renter,
        Role::Renter => l.lease.terms.provider,
    }
}
