//! Ending a provider lease: close and settle, the container and workspace removed (or kept
//! for downloads), the output saved.

use gridlease_contracts::{Actor, LeaseEvent};
use gridlease_protocol::{CloseReason, LeaseClose, LeaseId};
use gridlease_sandbox::Sandbox;
use tokio::sync::mpsc;

use super::{Ended, Session};
use crate::lease::config::MAX_LOG_BYTES;
use crate::lease::ctx::Ctx;
use crate::lease::logs::{self};
use crate::lease::rpc::session_rpc;
use crate::lease::session::{SessionMsg, sign};
use crate::lease::watchdog::{self};
use crate::lease::wire::{SessionRequest, SessionResponse};
use crate::store::lease::SessionPatch;

/// Removes the lease's workspace once its container is gone for good (the volume cannot be
/// removed while a container uses it; start-up reconciliation removes what is left).
async fn remove_workspace(s: &Session) {
    let Some(sb) = &s.ctx.sandbox else {
        return;
    };
    if let Err(e) = sb
        .remove_workspace(&s.ctx.workspace_dir(), &s.lease.id)
        .await
    {
        tracing::warn!(error = %e, "cannot remove the workspace");
    }
}

/// Whether a live volume adopts this lease's workspace (`stop --keep-disk`), as the store
/// says (so a node restarted in between still keeps it). When the store cannot answer, the
/// workspace is kept too: the next start's reconciliation removes it if nothing adopts it.
/// Only a renter's stop hands a workspace over: other endings never read the store here.
async fn handed_over(s: &Session, reason: CloseReason) -> bool {
    if s.lease.terms.is_volume() || reason != CloseReason::RenterStop {
        return false;
    }
    let id = s.lease.id;
    match s.ctx.store.call(|st| st.live_leases()).await {
        Ok(live) => live.iter().any(|(l, _)| {
            l.role == crate::store::Role::Provider
                && l.lease.terms.volume.as_ref().and_then(|v| v.adopts) == Some(id)
        }),
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell whether a volume adopts the workspace: keeping it");
            true
        }
    }
}

/// Whether the lease's container exists and has stopped.
async fn stopped(s: &Session) -> bool {
    let (Some(sb), Some(cid)) = (&s.ctx.sandbox, &s.container) else {
        return false;
    };
    sb.inspect(cid)
        .await
        .ok()
        .and_then(|i| i.state?.running)
        .is_some_and(|running| !running)
}

/// Stops and removes the lease's container; `s.container` is cleared once it is gone.
pub(super) async fn remove_container(s: &mut Session) {
    let (Some(sb), Some(cid)) = (s.ctx.sandbox.clone(), s.container.clone()) else {
        return;
    };
    match sb.remove(&cid).await {
        Ok(()) => s.container = None,
        Err(e) => {
            // Gone already is gone.
            if sb.inspect(&cid).await.is_err() {
                s.container = None;
            } else {
                tracing::warn!(error = %e, "cannot remove the container");
            }
        }
    }
}

/// After the run: close and settle (shared by all endings).
pub(super) async fn wrap_up(s: &mut Session, ended: Ended, inbox: &mut mpsc::Receiver<SessionMsg>) {
    if s.ctx.cancel.is_cancelled() {
        return;
    }
    let reason = match ended {
        Ended::Exited => CloseReason::ContainerExited,
        Ended::Stop(r) => r,
    };
    finish(s, reason, inbox).await;
}

/// Sends the signed close to the renter (taking its last receipt if we missed it), settles at
/// the last valid receipt, removes the container and frees the GPUs.
pub(super) async fn finish(
    s: &mut Session,
    reason: CloseReason,
    _inbox: &mut mpsc::Receiver<SessionMsg>,
) {
    let ctx = s.ctx.clone();
    let now = ctx.now();
    // Outputs the terms keep: the stopped container and its workspace stay for the renter's
    // downloads (stored with the close, before anything is removed or kept).
    let retention = u64::from(s.lease.terms.output_retention_s);
    // A workspace the renter keeps as a volume goes to it, not to kept outputs.
    let handed = handed_over(s, reason).await;
    let keep = retention > 0
        && !handed
        && s.container.is_some()
        && s.lease.started_at.is_some()
        && reason != CloseReason::StartFailed;
    let until = keep.then(|| s.lease.closed_at.unwrap_or(now).plus_secs(retention));
    if s.lease.state.can_close() {
        let patch = SessionPatch {
            closed_at: Some(now),
            close_reason: Some(reason),
            exit_code: s.exit_code,
            failure: s.failure.clone(),
            outputs_until: until,
            ..SessionPatch::default()
        };
        s.transition(LeaseEvent::Close(reason), Actor::Provider, patch)
            .await;
    }
    let close = LeaseClose {
        lease_id: s.lease.id,
        reason,
        at: now,
        exit_code: s.exit_code,
        failure: s.failure.clone(),
    };
    let renter_gone = matches!(reason, CloseReason::RenterUnreachable);
    if let (Some(signed), Some(peer), false) = (sign(&ctx, &close), s.renter_peer, renter_gone) {
        match session_rpc(&ctx, peer, SessionRequest::Close(signed)).await {
            Ok(SessionResponse::Closed {
                last_receipt: Some(r),
            }) => {
                // Booked only if newer than ours (a receipt whose answer was lost).
                let newer = r
                    .verify(ctx.client.network())
                    .is_ok_and(|v| v.message.seq > s.channel.last_receipt().map_or(0, |l| l.seq));
                if newer {
                    let _ = s.book(r).await;
                }
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "close not delivered"),
        }
    }
    if let (Some(sb), Some(cid)) = (&ctx.sandbox, &s.container)
        && !ctx.log_path(&s.lease.id).exists()
    {
        save_logs(&ctx, sb, cid, s.lease.id).await;
    }
    // The GPUs are free once this is gone (the service releases them when the session ends),
    // or, for kept outputs, once it is stopped: a stopped container holds no GPU, and the
    // service's sweep removes it and its workspace when their time is up.
    let kept = keep && stopped(s).await;
    if kept {
        watchdog::forget(&ctx.config.data_dir, &s.lease.id);
        tracing::info!(until = ?until, "outputs kept for the renter's downloads");
    } else {
        remove_container(s).await;
        if s.container.is_none() {
            watchdog::forget(&ctx.config.data_dir, &s.lease.id);
            if handed {
                tracing::info!("the workspace stays: it becomes the renter's volume");
            } else {
                remove_workspace(s).await;
            }
        }
    }
    s.kept_outputs = kept;
    if kept || s.container.is_none() {
        ctx.gpus_free(s.lease.id);
    }
    let total = s.channel.settlement(s.last_report.as_ref());
    if s.lease.state.can_settle() {
        let patch = SessionPatch {
            settled_total: Some(total.micros()),
            // Again with the settlement: a close stored before a restart did not carry it.
            outputs_until: until.filter(|_| kept),
            ..SessionPatch::default()
        };
        s.transition(LeaseEvent::Settle { total }, Actor::Provider, patch)
            .await;
    }
    tracing::info!(?reason, total = %total, exit_code = ?s.exit_code, "lease settled");
    s.publish();
    // The record reputation is made of, co-signed with the renter (after the GPUs are free:
    // a slow renter delays nothing).
    if let (Some(peer), false, true) = (
        s.renter_peer,
        renter_gone,
        s.lease.state == gridlease_contracts::LeaseState::Settled,
    ) {
        tokio::spawn(crate::lease::completion::propose(
            ctx.clone(),
            peer,
            s.lease.id,
            s.lease.terms.clone(),
            total.micros(),
            s.last_report.as_ref().map_or(0, |r| r.wall_ms),
            reason,
            s.lease.closed_at.unwrap_or(now),
        ));
    }
}

/// Saves the output of a container whose writer never ran here (see [`logs::catch_up`]).
async fn save_logs(ctx: &Ctx, sb: &Sandbox, cid: &str, id: LeaseId) {
    logs::catch_up(
        sb,
        cid,
        &ctx.log_path(&id),
        logs::Caps::split(MAX_LOG_BYTES),
    )
    .await;
}
