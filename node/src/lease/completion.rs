//! Co-signed completions (issue 16, reputation): after a lease settles, the provider signs the
//! record of it (`gridlease_contracts::reputation::completion_of`) and asks the renter to sign
//! the same; the pair is stored on both nodes (the `completions` table) and is what network
//! reputation is computed from.
//!
//! - Provider ([`propose`]): spawned by the session once it settled (the GPUs are already
//!   free); one round trip. The record carries the lease's GPU check as the provider's own
//!   kept check shows it (`lease_proofs`, `gpu_check_of`). The renter answers with its
//!   signature over the record it agrees with: the same one, or the same marked `Disputed`
//!   (with the renter's own GPU check) when the two closes or checks disagree, which the
//!   provider then signs too. A renter away at that moment (an unattended lease) is asked
//!   again when it comes back and catches up on the lease's reports ([`propose_stored`]);
//!   one that never answers leaves no record (logged).
//! - Renter ([`answer`]): waits for its own side of the lease to settle, rebuilds the record
//!   from its store (`renter_answer` decides), signs, stores the pair when it is complete.
//!
//! The network loop owns the records once co-signed (`crate::net::reputation`): it persists
//! them, publishes this node's own (as provider or renter), and scores them for search.

use std::time::Duration;

use gridlease_contracts::reputation::{
    acceptable_answer, completion_of, gpu_check_of, renter_answer,
};
use gridlease_protocol::completion::{CoSigned, Completion, CompletionAck, GpuCheck};
use gridlease_protocol::session::{SessionRequest, SessionResponse};
use gridlease_protocol::{CloseReason, LeaseId, LeaseTerms, PeerId};

use super::ctx::Ctx;
use super::rpc::session_rpc;
use super::session::sign;
use super::view;
use crate::store::Role;

/// How long a renter waits for its own side of a lease to settle before answering.
const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// Hands a pair to the network loop, which verifies, keeps, persists and publishes it; `true`
/// if it was new.
pub(crate) async fn store(ctx: &Ctx, pair: CoSigned) -> bool {
    match ctx.client.add_completion(pair).await {
        Ok(new) => new,
        Err(e) => {
            tracing::warn!(error = %e, "a completion record was refused");
            false
        }
    }
}

/// Provider: proposes the record of a settled lease to its renter and stores the co-signed
/// pair.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn propose(
    ctx: std::sync::Arc<Ctx>,
    peer: PeerId,
    id: LeaseId,
    terms: LeaseTerms,
    settled: u64,
    last_wall_ms: u64,
    reason: CloseReason,
    closed_at: gridlease_protocol::Timestamp,
) {
    let Some(gpu_check) = kept_check(&ctx, id, reason).await else {
        return;
    };
    let record = completion_of(
        id,
        &terms,
        settled,
        last_wall_ms,
        reason,
        closed_at,
        gpu_check,
    );
    let Some(signed) = sign(&ctx, &record) else {
        return;
    };
    let ack = match session_rpc(&ctx, peer, SessionRequest::Complete(signed.clone())).await {
        Ok(SessionResponse::Completion(ack)) => ack,
        Ok(other) => {
            tracing::info!(lease = %id, answer = ?other, "the renter did not sign the lease's completion record");
            return;
        }
        Err(e) => {
            tracing::info!(lease = %id, error = %e, "the lease's completion record was not co-signed");
            return;
        }
    };
    let agreed = match ack.verify(ctx.client.network()) {
        Ok(v) if v.signer == terms.renter => v.message.completion,
        _ => {
            tracing::warn!(lease = %id, "the renter's signature on the completion record is bad");
            return;
        }
    };
    // The renter may only have marked the outcome disputed, with its own GPU check; anything
    // else is not ours.
    let provider = if agreed == record {
        signed
    } else if acceptable_answer(&record, &agreed) {
        let Some(s) = sign(&ctx, &agreed) else {
            return;
        };
        tracing::info!(
            lease = %id,
            gpu_check = record.gpu_check.name(),
            renter_gpu_check = agreed.gpu_check.name(),
            "the renter disputes the lease's outcome; recorded as disputed"
        );
        s
    } else {
        tracing::warn!(lease = %id, "the renter signed another record than proposed");
        return;
    };
    if store(
        &ctx,
        CoSigned {
            provider,
            renter: ack,
        },
    )
    .await
    {
        tracing::info!(lease = %id, outcome = agreed.outcome.name(), paid = agreed.paid, gpu_check = agreed.gpu_check.name(), "completion co-signed");
    }
}

/// The GPU check of lease `id` (closed for `reason`) as this node's kept check record shows
/// it (`gpu_check_of`); `None` when the store cannot be read (logged): no record is better
/// than a wrong one.
async fn kept_check(ctx: &Ctx, id: LeaseId, reason: CloseReason) -> Option<GpuCheck> {
    match ctx.store.call(move |s| s.proof(&id)).await {
        Ok(kept) => Some(gpu_check_of(kept.as_ref(), reason)),
        Err(e) => {
            tracing::warn!(lease = %id, error = %e, "cannot read the lease's GPU check; no completion record");
            None
        }
    }
}

/// Provider: proposes the record of a settled lease from the store, unless one is held: for a
/// renter that was away when the lease settled and has just caught up.
pub(crate) async fn propose_stored(ctx: std::sync::Arc<Ctx>, peer: PeerId, id: LeaseId) {
    let Ok((lease, rec, held)) = ctx
        .store
        .call(move |s| {
            Ok((
                s.lease(&id)?,
                s.session_record(&id)?,
                s.has_completion(&id)?,
            ))
        })
        .await
    else {
        return;
    };
    let Some(l) = lease else {
        return;
    };
    if held
        || l.role != Role::Provider
        || l.lease.state != gridlease_contracts::LeaseState::Settled
        || l.lease.terms.renter.peer_id().ok() != Some(peer)
    {
        return;
    }
    let (Some(reason), Some(settled)) = (
        l.lease.close_reason.or(rec.fields.close_reason),
        rec.fields.settled_total,
    ) else {
        return;
    };
    let closed_at = l
        .lease
        .closed_at
        .or(rec.fields.closed_at)
        .unwrap_or_else(|| ctx.now());
    let wall_ms = last_wall_ms(&rec);
    propose(
        ctx,
        peer,
        id,
        l.lease.terms,
        settled,
        wall_ms,
        reason,
        closed_at,
    )
    .await;
}

/// The wall time of the last usage report a node stored for a lease (0 without one).
fn last_wall_ms(rec: &crate::store::lease::SessionRecord) -> u64 {
    rec.last_usage
        .as_ref()
        .and_then(|(_, b)| view::decode_usage(b))
        .map_or(0, |(_, u)| u.wall_ms)
}

/// Renter: answers a provider's [`SessionRequest::Complete`].
pub(crate) async fn answer(ctx: &Ctx, peer: PeerId, request: &SessionRequest) -> SessionResponse {
    let SessionRequest::Complete(signed) = request else {
        return SessionResponse::UnknownLease;
    };
    let Ok(v) = signed.verify(ctx.client.network()) else {
        return SessionResponse::UnknownLease;
    };
    let proposed = v.message;
    let id = proposed.lease_id;
    // Our side settles right after answering the provider's close: wait for it.
    let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
    let l = loop {
        let Ok(Some(l)) = ctx.store.call(move |s| s.lease(&id)).await else {
            return SessionResponse::UnknownLease;
        };
        let provider = l.lease.terms.provider;
        if l.role != Role::Renter || v.signer != provider || provider.peer_id().ok() != Some(peer) {
            return SessionResponse::UnknownLease;
        }
        if l.lease.state.is_terminal() {
            break l;
        }
        if tokio::time::Instant::now() >= deadline {
            return SessionResponse::Busy;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let Ok(rec) = ctx.store.call(move |s| s.session_record(&id)).await else {
        return SessionResponse::Busy;
    };
    let (Some(reason), Some(settled)) = (
        l.lease.close_reason.or(rec.fields.close_reason),
        rec.fields.settled_total,
    ) else {
        return SessionResponse::Busy;
    };
    let Some(gpu_check) = kept_check(ctx, id, reason).await else {
        return SessionResponse::Busy;
    };
    let mine = completion_of(
        id,
        &l.lease.terms,
        settled,
        last_wall_ms(&rec),
        reason,
        rec.fields.closed_at.unwrap_or(proposed.closed_at),
        gpu_check,
    );
    let agreed = match renter_answer(&proposed, &mine) {
        Ok(a) => a,
        Err(why) => {
            tracing::warn!(lease = %id, why, "refused to sign the provider's completion record");
            return SessionResponse::UnknownLease;
        }
    };
    let Some(ack) = sign(
        ctx,
        &CompletionAck {
            completion: agreed.clone(),
        },
    ) else {
        return SessionResponse::Busy;
    };
    if agreed == proposed {
        let pair = CoSigned {
            provider: signed.clone(),
            renter: ack.clone(),
        };
        store(ctx, pair).await;
    }
    SessionResponse::Completion(ack)
}

/// This node's stored completions (newest first, at most `limit`), verified again.
pub(crate) async fn list(ctx: &Ctx, limit: usize) -> Vec<(Completion, CoSigned)> {
    let Ok(rows) = ctx.store.call(move |s| s.completions(None, limit)).await else {
        return Vec::new();
    };
    rows.into_iter()
        .filter_map(|r| {
            let pair = CoSigned::from_bytes(&r.record).ok()?;
            Some((r.completion, pair))
        })
        .collect()
}
