//! A volume lease's session (issue 47): the volume made (a quota'd ext4 image on a loop
//! device, exactly as a lease's workspace, keyed by the volume lease's id) or, for a lease's
//! disk kept (`VolumeTerms::adopts`), that lease ended and its workspace handed over; and
//! `Running` stored; then a usage report every `usage_interval_s` for the seconds kept so far (the
//! tariff counts the volume's GiB), answered by receipts, until the keep period ends, the
//! renter removes it, or the channel says stop (an unpaid volume); then the final report, and
//! [`super::finish`] closes, settles and deletes the volume (its Docker volume, loop device
//! and image file). A node that stops leaves the volume as it is; its restart resumes the
//! session from the store.

use std::time::Duration;

use gridlease_contracts::{Actor, BilledTime, Decision, LeaseEvent, ProviderChannel};
use gridlease_protocol::{CloseReason, StartFailure, StartFailureKind, Timestamp};
use gridlease_sandbox::meter::Usage;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{Ended, Halt, Session};
use crate::lease::error::SessionRpcError;
use crate::lease::rpc::session_rpc;
use crate::lease::session::SessionMsg;
use crate::lease::wire::{SessionRequest, SessionResponse};
use crate::store::lease::SessionPatch;

/// The volume's sandbox spec: its id and size.
fn spec(s: &Session) -> gridlease_sandbox::SandboxSpec {
    let mut spec =
        gridlease_sandbox::SandboxSpec::small_on_host(s.lease.id, &s.ctx.node_id, "", &[]);
    spec.workspace_bytes = s.lease.terms.workspace_bytes();
    spec
}

/// Makes the volume (or takes over the workspace it adopts) and stores `Running` (persist
/// before act: `Starting` before the image is made; a volume whose `Running` cannot be
/// stored is removed again). Billing starts at `Running`, after an adopted lease's ended.
pub(super) async fn start(s: &mut Session) -> Result<(), Halt> {
    let ctx = s.ctx.clone();
    let sb = super::start::sandbox_and_starting(s).await?;
    let spec = spec(s);
    let made = match s.lease.terms.volume.as_ref().and_then(|v| v.adopts) {
        Some(from) => adopt(s, &sb, from, &spec).await?,
        None => sb
            .create_workspace(&ctx.workspace_dir(), &spec)
            .await
            .map_err(|e| format!("the volume could not be created: {e}")),
    };
    if let Err(message) = made {
        tracing::warn!("{message}");
        return Err(StartFailure::new(StartFailureKind::Create, message).into());
    }
    let now = ctx.now();
    s.channel = ProviderChannel::new(s.lease.id, &s.lease.terms, now);
    let running = s
        .transition(
            LeaseEvent::Started,
            Actor::Provider,
            SessionPatch {
                started_at: Some(now),
                ..SessionPatch::default()
            },
        )
        .await;
    if !running {
        if let Err(e) = sb.remove_workspace(&ctx.workspace_dir(), &s.lease.id).await {
            tracing::warn!(error = %e, "cannot remove an unrecorded volume");
        }
        return Err(StartFailure::new(StartFailureKind::Create, "cannot record the volume").into());
    }
    if let Some(v) = &s.lease.terms.volume {
        tracing::info!(
            name = %v.name,
            size_gib = v.size_gib,
            until = %now.plus_secs(u64::from(s.lease.terms.duration_s)),
            "volume kept"
        );
    }
    Ok(())
}

/// Longest wait for an adopted lease to end, beyond its stop grace.
const HANDOVER_WAIT: Duration = Duration::from_secs(60);

/// Ends lease `from` (asked of its session until it is over: the renter's stop, settled as
/// any, its container removed and its workspace kept, since [`super::finish`] finds this
/// volume adopting it) and takes its workspace over. The outer error is a shutdown.
async fn adopt(
    s: &Session,
    sb: &gridlease_sandbox::Sandbox,
    from: gridlease_protocol::LeaseId,
    spec: &gridlease_sandbox::SandboxSpec,
) -> Result<Result<gridlease_sandbox::workspace::Workspace, String>, Halt> {
    let ctx = &s.ctx;
    let limit = tokio::time::Instant::now() + ctx.config.stop_grace + HANDOVER_WAIT;
    let mut asked = None;
    loop {
        match ctx.store.call(move |st| st.lease(&from)).await {
            Ok(Some(l)) if l.lease.state.is_terminal() => break,
            Ok(Some(_)) => {}
            Ok(None) => return Ok(Err(format!("lease {} is not here", from.short()))),
            Err(e) => tracing::warn!(error = %e, "cannot read the adopted lease"),
        }
        if tokio::time::Instant::now() >= limit {
            return Ok(Err(format!(
                "lease {} did not end in time; its workspace stays with it",
                from.short()
            )));
        }
        // Asked again every 5 s (a message lost to a full inbox, or a restart in between).
        if asked.is_none_or(|t: tokio::time::Instant| t.elapsed() >= Duration::from_secs(5)) {
            ctx.hand_over(from);
            asked = Some(tokio::time::Instant::now());
        }
        tokio::select! {
            () = ctx.cancel.cancelled() => return Err(Halt::Shutdown),
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    match sb.adopt_workspace(&ctx.workspace_dir(), &from, spec).await {
        Ok(ws) => Ok(Ok(ws)),
        Err(e) => {
            // The lease is over and nothing else takes its workspace: it goes now rather
            // than at the next start's reconciliation (a volume still in use stays).
            if let Err(e) = sb.remove_workspace(&ctx.workspace_dir(), &from).await {
                tracing::warn!(error = %e, "cannot remove the workspace that was not kept");
            }
            Ok(Err(format!(
                "the workspace of lease {} could not be kept: {e}",
                from.short()
            )))
        }
    }
}

/// A restarted node's volume, its loop device and Docker volume made again if they are gone
/// (the host rebooted; the image stays). Whether the volume is there now.
pub(super) async fn reattach(s: &Session) -> bool {
    let Some(sb) = &s.ctx.sandbox else {
        return false;
    };
    match sb
        .reattach_workspace(&s.ctx.workspace_dir(), &spec(s))
        .await
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot attach the kept volume again");
            false
        }
    }
}

/// Whether a restarted node still has the volume: its image attached to a loop device.
pub(super) fn present(s: &Session) -> bool {
    let image = gridlease_sandbox::workspace::image_path(
        &std::fs::canonicalize(s.ctx.workspace_dir()).unwrap_or_else(|_| s.ctx.workspace_dir()),
        &s.lease.id,
    );
    let loops = gridlease_sandbox::workspace::attached_loops();
    gridlease_sandbox::workspace::loops_backed_by(&loops, &image)
        .next()
        .is_some()
}

/// The seconds kept so far, as the lease bills them (at most its keep period).
fn kept(s: &Session, now: Timestamp) -> Usage {
    let started = s.lease.started_at.unwrap_or(now);
    let billed = gridlease_contracts::Tariff::of(&s.lease.terms).cap(BilledTime {
        wall_ms: now.ms_since(started),
        gpu_ms: 0,
    });
    Usage {
        wall_ms: billed.wall_ms,
        ..Usage::default()
    }
}

/// How long before its deletion a volume's end is announced in the provider's log: a tenth
/// of its keep period, at most an hour.
fn announce_before_ms(s: &Session) -> u64 {
    (u64::from(s.lease.terms.duration_s) * 100).min(3_600_000)
}

/// Reports and receipts until the volume's end: `None` when the node shuts down (the volume
/// stays for the restart).
pub(super) async fn keep(s: &mut Session, inbox: &mut mpsc::Receiver<SessionMsg>) -> Option<Ended> {
    let ctx = s.ctx.clone();
    let started = s.lease.started_at?;
    let grace_ms = u64::try_from(ctx.config.stop_grace.as_millis()).unwrap_or(u64::MAX);
    let mut inflight: JoinSet<Result<SessionResponse, SessionRpcError>> = JoinSet::new();
    super::tell_started(s, started, &mut inflight);
    let period = Duration::from_secs(u64::from(s.lease.terms.usage_interval_s.max(1)));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = |s: &Session| s.lease.deadline().unwrap_or(started);
    let until = |s: &Session| Duration::from_millis(deadline(s).ms_since(s.ctx.now()));
    let expiry = tokio::time::sleep(until(s));
    tokio::pin!(expiry);
    let mut iv_start = ctx.now().max(started);
    let mut announced = false;
    let ended = loop {
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => return None,
            () = &mut expiry => break Ended::Stop(CloseReason::Expired),
            Some(msg) = inbox.recv() => match msg {
                // `volume extend`: a longer keep period, as any lease's extension.
                SessionMsg::Inbound(m) if matches!(m.request, SessionRequest::Extend(_)) => {
                    if s.on_extend(*m, grace_ms).await {
                        expiry.as_mut().reset(tokio::time::Instant::now() + until(s));
                        announced = false;
                    }
                }
                msg => {
                    if let Some(reason) = super::on_msg(s, msg) {
                        break Ended::Stop(reason);
                    }
                }
            },
            Some(answer) = inflight.join_next(), if !inflight.is_empty() => {
                let answer = answer.unwrap_or_else(|e| Err(e.into()));
                if let Some(reason) = s.on_answer(answer).await {
                    break Ended::Stop(reason);
                }
            }
            _ = tick.tick() => {
                let now = ctx.now();
                if now >= deadline(s) {
                    break Ended::Stop(CloseReason::Expired);
                }
                let left_ms = deadline(s).ms_since(now);
                if !announced && left_ms <= announce_before_ms(s) {
                    announced = true;
                    tracing::warn!(
                        name = s.lease.terms.volume.as_ref().map_or("", |v| v.name.as_str()),
                        left_s = left_ms / 1000,
                        until = %deadline(s),
                        "volume will be deleted at the end of its keep period unless its renter extends it"
                    );
                }
                let totals = kept(s, now);
                if inflight.is_empty() {
                    if let Some(signed) = s.report(iv_start, now, &totals, &totals, None, false).await
                        && let Some(peer) = s.renter_peer
                    {
                        let ctx2 = ctx.clone();
                        inflight.spawn(async move {
                            session_rpc(&ctx2, peer, SessionRequest::Usage(signed)).await
                        });
                    }
                    iv_start = now;
                }
                match s.channel.decide(totals.wall_ms, now) {
                    Ok(Decision::Continue) => {}
                    Ok(Decision::Stop(reason)) => {
                        tracing::warn!(?reason, paid = %s.channel.paid(), "payment channel says stop: the volume goes");
                        break Ended::Stop(reason);
                    }
                    Err(e) => tracing::error!(error = %e, "billing overflow"),
                }
            }
        }
    };
    // The in-flight report's answer first, so the final report's sequence follows it.
    if let Ok(Some(Ok(answer))) =
        tokio::time::timeout(ctx.config.rpc_timeout, inflight.join_next()).await
    {
        let _ = s.on_answer(answer).await;
    }
    // The final report: every second kept, no minimum (a volume has none).
    let now = ctx.now();
    let totals = kept(s, now);
    s.exit_code = Some(0);
    let send = !matches!(
        ended,
        Ended::Stop(CloseReason::RenterUnreachable | CloseReason::BadReceipt)
    );
    if let Some(signed) = s
        .report(iv_start, now, &totals, &totals, Some(0), true)
        .await
        && send
        && let Some(peer) = s.renter_peer
    {
        let answer = session_rpc(&ctx, peer, SessionRequest::Usage(signed)).await;
        let _ = s.on_answer(answer).await;
    }
    tracing::info!(?ended, kept_ms = totals.wall_ms, "volume ends: deleting it");
    Some(ended)
}

/// After [`super::finish`]: a volume still mounted in a container (a lease of the renter
/// whose container has not gone yet) cannot be removed at once; it is tried again every
/// 10 s until it is gone (the node's start-up reconciliation removes it otherwise).
pub(super) fn remove_when_free(s: &Session) {
    let (ctx, id) = (s.ctx.clone(), s.lease.id);
    let Some(sb) = ctx.sandbox.clone() else {
        return;
    };
    if !present(s) {
        return;
    }
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = ctx.cancel.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
            match sb.remove_workspace(&ctx.workspace_dir(), &id).await {
                Ok(()) => {
                    tracing::info!(volume = %id.short(), "volume deleted once its last mount was gone");
                    return;
                }
                Err(e) => tracing::debug!(volume = %id.short(), error = %e, "volume still in use"),
            }
        }
    });
}
