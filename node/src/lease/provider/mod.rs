//! The provider's session of one lease: start (or re-attach to) the hardened container, meter
//! it, send a signed cumulative [`UsageReport`] every `usage_interval_s`, book the renter's
//! receipts, stop when the container exits, at the deadline, on the renter's close, or when
//! [`ProviderChannel::decide`] says stop; then send the final report (minimum billing via
//! [`Tariff::final_due`]), close, settle at the last valid receipt and free the GPUs.
//!
//! Deadline ([`StopSchedule`]): the session's expiry fires at `deadline - stop_grace` (SIGTERM)
//! and the container is SIGKILLed at the deadline itself; an earlier stop gets SIGTERM at once
//! and SIGKILL after the grace, never past the deadline. Every report is capped by
//! [`Tariff::cap`], so the final one never claims more than the lease (a tenant that ignores
//! SIGTERM pays exactly the lease). A [`watchdog`] process enforces the same schedule if the
//! node dies; the two share one SIGTERM claim.
//!
//! Files: this one holds the session's state and [`run`] (and [`serve_reports`]); `start`
//! starts the container (with `verify`, the renter's GPU check in the unbilled window), `meter` meters the run up to its final report, `finish` closes,
//! settles and removes the container.

mod finish;
mod meter;
mod start;
mod storage;
mod verify;

pub use crate::lease::prover::SharedProver;

use std::sync::Arc;

use gridlease_contracts::{
    Actor, BilledTime, Lease, LeaseEvent, LeaseState, Money, ProviderChannel, Tariff,
};
use gridlease_protocol::{
    AmendAccept, AmendRefusal, CloseReason, LeaseClose, LeaseId, PaymentReceipt, PeerId, PublicKey,
    Signed, StartFailure, Timestamp, UsageReport,
};
use gridlease_sandbox::meter::{Usage, to_usage_report};
use tokio::sync::{mpsc, watch};

use super::ctx::Ctx;
use super::error::SessionRpcError;
use super::logs::LogWriter;
use super::session::{InboundSession, SessionMsg, SessionReply, sign};
use super::view::{self, LeaseView};
use super::watchdog::{self};
use super::wire::{SessionRequest, SessionResponse};
use crate::store::lease::{SessionPatch, SessionRecord, UsageKept};
use crate::store::{Role, StoredLease};

/// How the run ended.
#[derive(Debug, Clone, Copy)]
enum Ended {
    Exited,
    Stop(CloseReason),
}

/// How a start ended without the command running.
enum Halt {
    /// It failed: the renter is told why (and pays the failed-start fee where one is due).
    Failed(StartFailure),
    /// A party stopped the lease while its container was held for uploads.
    Stopped(CloseReason),
    /// The node is shutting down.
    Shutdown,
}

impl From<StartFailure> for Halt {
    fn from(f: StartFailure) -> Self {
        Self::Failed(f)
    }
}

struct Session {
    ctx: Arc<Ctx>,
    lease: Lease,
    renter: PublicKey,
    renter_peer: Option<PeerId>,
    channel: ProviderChannel,
    seq: u64,
    last_report: Option<UsageReport>,
    exit_code: Option<i32>,
    /// The container, while it exists.
    container: Option<String>,
    /// The leased GPUs (UUID digests), as accepted.
    gpus: Vec<gridlease_protocol::Digest>,
    view: watch::Sender<LeaseView>,
    /// Copies the container's output to its file from the start (`None` until started here).
    logs: Option<LogWriter>,
    /// Why the start failed, once it did.
    failure: Option<StartFailure>,
    /// The finished lease's stopped container and workspace are kept for downloads (the
    /// terms' `output_retention_s`); the service's sweep removes them.
    kept_outputs: bool,
    /// While the created container is held for the renter's uploads: until when.
    held_until: Option<Timestamp>,
    /// The last amendment accepted and its signed acceptance: an identical retry (its answer
    /// lost) gets the same acceptance again.
    last_amendment: Option<(gridlease_protocol::LeaseAmendment, Signed<AmendAccept>)>,
    /// Live telemetry: written by the metering task, read by the service for the renter.
    telemetry: crate::lease::telemetry::Ring,
    /// The lease's offer declared its GPUs: their usage is unknown.
    gpus_declared: bool,
}

impl Session {
    fn publish(&self) {
        let known = view::Known {
            role: Role::Provider,
            counterparty: &self.renter,
            usage: self.last_report.as_ref(),
            authorised: self.channel.paid().micros(),
            exit_code: self.exit_code,
            gpus_declared: self.gpus_declared,
        };
        let v = view::make(&self.lease, known, self.ctx.now())
            .with_failure(self.failure.as_ref())
            .with_hold(self.held_until);
        self.view.send_replace(v);
    }

    /// Persist before act: stores the transition with `patch`, then applies it. Returns
    /// false (and logs why) when it did not happen; the caller must not act on it.
    async fn transition(&mut self, event: LeaseEvent, actor: Actor, patch: SessionPatch) -> bool {
        let done =
            crate::lease::session::transition(&self.ctx, &mut self.lease, event, actor, patch)
                .await;
        if done {
            self.publish();
        }
        done
    }

    /// Books a receipt answering a report: validated by the channel, then stored with its
    /// ledger rows in one transaction. Returns false if it was refused.
    async fn book(&mut self, signed: Signed<PaymentReceipt>) -> bool {
        let net = self.ctx.client.network().clone();
        let Ok(v) = signed.verify(&net) else {
            tracing::warn!("receipt signature does not verify");
            return false;
        };
        let now = self.ctx.now();
        let before = self.channel.clone();
        match self.channel.accept_receipt(&v.signer, &v.message, now) {
            Ok(delta) => {
                let bytes = match signed.to_bytes() {
                    Ok(b) => b,
                    Err(_) => return false,
                };
                let (id, renter, receipt) = (self.lease.id, self.renter, v.message.clone());
                let booked = self
                    .ctx
                    .store
                    .call(move |s| {
                        s.book_receipt(Role::Provider, &id, &renter, &receipt, &bytes, None, now)
                    })
                    .await;
                match booked {
                    Ok(Some(d)) => {
                        debug_assert_eq!(d, delta.micros());
                        tracing::debug!(
                            seq = v.message.seq,
                            total = v.message.total_paid,
                            delta = d,
                            "receipt booked"
                        );
                    }
                    Ok(None) => {}
                    Err(e) => {
                        // Not stored: do not count it.
                        tracing::error!(error = %e, "cannot store a receipt");
                        self.channel = before;
                    }
                }
                self.publish();
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "receipt refused; nothing booked");
                false
            }
        }
    }

    /// Signs, persists and returns the next usage report for `totals`.
    async fn report(
        &mut self,
        iv_start: Timestamp,
        now: Timestamp,
        totals: &Usage,
        interval: &Usage,
        exit_code: Option<i32>,
        waive_minimum: bool,
    ) -> Option<Signed<UsageReport>> {
        let tariff = Tariff::of(&self.lease.terms);
        // Never more than the terms allow: a container stopped after its deadline (killed late,
        // or found by a node that came back late) is billed the lease's duration, exactly.
        let mut totals = *totals;
        let billed = tariff.cap(BilledTime {
            wall_ms: totals.wall_ms,
            gpu_ms: totals.gpu_ms,
        });
        totals.wall_ms = billed.wall_ms;
        totals.gpu_ms = billed.gpu_ms;
        let due = if exit_code.is_some() && !waive_minimum {
            tariff.final_due(totals.wall_ms)
        } else {
            tariff.due(totals.wall_ms)
        }
        .unwrap_or(tariff.max_total);
        // Never claim less than already claimed (a re-attached meter restarts from zero CPU).
        if let Some(p) = &self.last_report {
            totals.wall_ms = totals.wall_ms.max(p.wall_ms);
            totals.gpu_ms = totals.gpu_ms.max(p.gpu_ms);
            totals.cpu_ms = totals.cpu_ms.max(p.cpu_ms);
            totals.energy_mj = totals.energy_mj.max(p.energy_mj);
            totals.net_rx_bytes = totals.net_rx_bytes.max(p.net_rx_bytes);
            totals.net_tx_bytes = totals.net_tx_bytes.max(p.net_tx_bytes);
        }
        let due = match &self.last_report {
            Some(p) => due.max(Money::from_micros(p.amount_due)),
            None => due,
        };
        self.seq += 1;
        #[cfg(feature = "faults")]
        let (totals, due) = match self.ctx.config.faults.inflate_usage_from_seq {
            Some(from) if self.seq >= from && exit_code.is_none() => {
                let mut t = totals;
                t.wall_ms = t.wall_ms.saturating_mul(2);
                t.gpu_ms = t.gpu_ms.saturating_mul(2);
                (t, tariff.due(t.wall_ms).unwrap_or(tariff.max_total))
            }
            _ => (totals, due),
        };
        let r = to_usage_report(
            self.lease.id,
            self.seq,
            iv_start,
            now.max(iv_start),
            &totals,
            interval,
            due.micros(),
            exit_code,
        );
        let signed = sign(&self.ctx, &r)?;
        let bytes = signed.to_bytes().ok()?;
        let (id, seq) = (self.lease.id, self.seq);
        if let Err(e) = self
            .ctx
            .store
            .call(move |s| s.put_usage(&id, seq, &bytes, now, UsageKept::All))
            .await
        {
            tracing::error!(error = %e, "cannot persist a usage report; not sending it");
            return None;
        }
        self.last_report = Some(r);
        self.publish();
        Some(signed)
    }

    /// The renter's extension ([`super::extend`]): verified, decided by
    /// `gridlease_contracts::amend::check_amendment`, signed; then (persist before act) the
    /// watchdog's deadline file and the amendment with its acceptance are written, and only
    /// then the lease, its payment channel and (in the caller) the stop schedule take the new
    /// terms and the acceptance is sent. Returns true when the deadline moved.
    async fn on_extend(&mut self, m: InboundSession, grace_ms: u64) -> bool {
        let InboundSession {
            peer,
            request,
            reply,
        } = m;
        let SessionRequest::Extend(signed) = request else {
            let _ = reply.send(SessionResponse::UnknownLease);
            return false;
        };
        if Some(peer) != self.renter_peer {
            let _ = reply.send(SessionResponse::UnknownLease);
            return false;
        }
        let refuse = |reply: SessionReply, r: AmendRefusal| {
            tracing::info!(refusal = ?r, "extension refused");
            let _ = reply.send(SessionResponse::ExtendRefused(r));
            false
        };
        let ctx = self.ctx.clone();
        let Ok(v) = signed.verify(ctx.client.network()) else {
            return refuse(reply, AmendRefusal::BadSignature);
        };
        let a = v.message;
        if let Some((last, accepted)) = &self.last_amendment
            && last == &a
            && v.signer == self.renter
        {
            let _ = reply.send(SessionResponse::Extended(accepted.clone()));
            return false;
        }
        let limits = match ctx.client.own_offer().await {
            Ok(Some(own)) => Some(gridlease_contracts::amend::OfferLimits {
                // A volume's keep period is bounded by the offer's longest keep.
                max_duration_s: if self.lease.terms.is_volume() {
                    own.offer.sandbox.volumes.max_keep_s
                } else {
                    own.offer.max_duration_s
                },
                gpus_offered: self
                    .gpus
                    .iter()
                    .all(|g| own.offer.gpus.iter().any(|o| o.spec.uuid_digest == *g)),
            }),
            _ => None,
        };
        let now = ctx.now();
        if let Err(r) = gridlease_contracts::amend::check_amendment(
            &self.lease,
            &a,
            &v.signer,
            limits,
            grace_ms,
            now,
        ) {
            return refuse(reply, r);
        }
        let (Some(old), Some(started)) = (self.lease.deadline(), self.lease.started_at) else {
            return refuse(reply, AmendRefusal::Internal);
        };
        let deadline = started.plus_secs(u64::from(a.duration_s));
        let accept = AmendAccept {
            amendment: a.clone(),
            deadline,
            accepted_at: now,
        };
        let (Some(accepted), Ok(pbytes)) = (sign(&ctx, &accept), signed.to_bytes()) else {
            return refuse(reply, AmendRefusal::Internal);
        };
        let Ok(abytes) = accepted.to_bytes() else {
            return refuse(reply, AmendRefusal::Internal);
        };
        // The watchdog learns the new deadline before anything is acknowledged; were the
        // amendment not stored, the old deadline goes back (the session keeps it meanwhile).
        let dir = ctx.config.data_dir.clone();
        if let Err(e) = watchdog::set_deadline(&dir, &self.lease.id, deadline) {
            tracing::error!(error = %e, "cannot tell the watchdog the new deadline; extension refused");
            return refuse(reply, AmendRefusal::Internal);
        }
        let (id, stored) = (self.lease.id, a.clone());
        if let Err(e) = ctx
            .store
            .call(move |st| st.put_amendment(&id, &stored, &pbytes, Some(&abytes), now))
            .await
        {
            tracing::error!(error = %e, "cannot store the extension; refused");
            if let Err(e) = watchdog::set_deadline(&dir, &self.lease.id, old) {
                tracing::warn!(error = %e, "cannot restore the watchdog's deadline");
            }
            return refuse(reply, AmendRefusal::Internal);
        }
        if let Err(r) = self.lease.amend(&a) {
            // Checked above on the same lease: cannot happen.
            tracing::error!(refusal = ?r, "a checked extension did not apply");
            return refuse(reply, r);
        }
        self.channel.amend(&self.lease.terms);
        self.last_amendment = Some((a, accepted.clone()));
        self.publish();
        tracing::info!(
            seq = self.lease.extensions,
            duration_s = self.lease.terms.duration_s,
            max_total = self.lease.terms.max_total,
            deadline = %deadline,
            "lease extended"
        );
        #[cfg(feature = "faults")]
        if ctx.config.faults.lose_first_extend_answer && self.lease.extensions == 1 {
            let _ = reply.send(SessionResponse::Busy);
            return true;
        }
        let _ = reply.send(SessionResponse::Extended(accepted));
        true
    }

    /// Handles the renter's answer to a report. Returns a reason to stop, if any.
    async fn on_answer(
        &mut self,
        answer: Result<SessionResponse, SessionRpcError>,
    ) -> Option<CloseReason> {
        match answer {
            Ok(SessionResponse::Receipt(r)) => {
                if self.book(r).await {
                    None
                } else {
                    Some(CloseReason::BadReceipt)
                }
            }
            Ok(SessionResponse::NothingDue) => {
                self.channel.heard_from_renter(self.ctx.now());
                None
            }
            Ok(SessionResponse::Refused { reason, detail }) => {
                tracing::warn!(?reason, detail, "renter refused a usage report");
                Some(reason)
            }
            Ok(other) => {
                tracing::debug!(answer = ?other, "unexpected answer to a usage report");
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "usage report not answered");
                None
            }
        }
    }
}

/// Runs a provider lease to settlement (or resumes one after a restart). Returns whether
/// the lease's GPUs are free: its container is gone (removed, or never created). A node that
/// is shutting down leaves the container running for the restart to resume: `false`.
pub(crate) async fn run(
    ctx: Arc<Ctx>,
    stored: StoredLease,
    rec: SessionRecord,
    mut inbox: mpsc::Receiver<SessionMsg>,
    view_tx: watch::Sender<LeaseView>,
    telemetry: crate::lease::telemetry::Ring,
) -> bool {
    #[cfg(feature = "faults")]
    if ctx.config.faults.hold_sessions {
        ctx.cancel.cancelled().await;
        return false;
    }
    let mut lease = stored.lease.clone();
    view::restore_lease(&mut lease, &rec);
    let terms = lease.terms.clone();
    let renter = terms.renter;
    let started_hint = lease.started_at.unwrap_or_else(|| ctx.now());
    let last_receipt = rec
        .last_receipt
        .as_ref()
        .and_then(|(_, b)| view::decode_receipt(b))
        .map(|(_, r)| r);
    let last_report = rec
        .last_usage
        .as_ref()
        .and_then(|(_, b)| view::decode_usage(b))
        .map(|(_, u)| u);
    let channel =
        ProviderChannel::new(lease.id, &terms, started_hint).restore(last_receipt, ctx.now());
    let mut s = Session {
        renter_peer: renter.peer_id().ok(),
        ctx: ctx.clone(),
        lease,
        renter,
        channel,
        seq: rec.last_usage.as_ref().map_or(0, |(q, _)| *q),
        last_report,
        exit_code: rec.fields.exit_code,
        container: rec.fields.container_id.clone(),
        gpus: stored.gpus.clone(),
        view: view_tx,
        logs: None,
        failure: rec.fields.failure.clone(),
        kept_outputs: false,
        held_until: None,
        last_amendment: rec.amendment.as_ref().and_then(|a| {
            let (_, proposal) = crate::lease::extend::decode_proposal(&a.proposal)?;
            let (signed, _) = crate::lease::extend::decode_acceptance(a.acceptance.as_deref()?)?;
            Some((proposal, signed))
        }),
        telemetry,
        gpus_declared: rec.gpus_declared,
    };
    s.publish();

    if s.lease.terms.is_volume() {
        return run_volume(s, inbox).await;
    }
    let ended = match s.lease.state {
        LeaseState::Accepted | LeaseState::Starting => match start::start(&mut s, &mut inbox).await
        {
            Ok(()) => Some(meter::meter_loop(&mut s, &mut inbox).await),
            Err(Halt::Failed(failure)) => {
                tracing::warn!(kind = ?failure.kind, "start failed: {}", failure.message);
                s.failure = Some(failure);
                finish::finish(&mut s, CloseReason::StartFailed, &mut inbox).await;
                None
            }
            Err(Halt::Stopped(reason)) => {
                tracing::info!(?reason, "stopped while held for uploads");
                finish::finish(&mut s, reason, &mut inbox).await;
                None
            }
            Err(Halt::Shutdown) => return false,
        },
        LeaseState::Running => {
            let present = match (&ctx.sandbox, &s.container) {
                (Some(sb), Some(c)) => sb.inspect(c).await.is_ok(),
                _ => false,
            };
            if present {
                tracing::info!("resuming a running lease after restart");
                Some(meter::meter_loop(&mut s, &mut inbox).await)
            } else {
                tracing::warn!("running lease has no container after restart; settling");
                Some(Ended::Stop(CloseReason::ProviderStop))
            }
        }
        LeaseState::Closing => {
            let reason = s.lease.close_reason.unwrap_or(CloseReason::ProviderStop);
            finish::finish(&mut s, reason, &mut inbox).await;
            None
        }
        _ => None,
    };
    if let Some(ended) = ended {
        finish::wrap_up(&mut s, ended, &mut inbox).await;
    }
    !ctx.cancel.is_cancelled() && (s.container.is_none() || s.kept_outputs)
}

/// [`run`] for a volume lease ([`storage`]): the volume made, kept and billed, then deleted.
/// Returns whether the session is over (false: the node shuts down, the volume stays).
async fn run_volume(mut s: Session, mut inbox: mpsc::Receiver<SessionMsg>) -> bool {
    let ended = match s.lease.state {
        LeaseState::Accepted | LeaseState::Starting => match storage::start(&mut s).await {
            Ok(()) => storage::keep(&mut s, &mut inbox).await,
            Err(Halt::Failed(failure)) => {
                tracing::warn!(kind = ?failure.kind, "volume not made: {}", failure.message);
                s.failure = Some(failure);
                finish::finish(&mut s, CloseReason::StartFailed, &mut inbox).await;
                None
            }
            Err(_) => return false,
        },
        LeaseState::Running if storage::reattach(&s).await => {
            tracing::info!("resuming a kept volume after restart");
            storage::keep(&mut s, &mut inbox).await
        }
        LeaseState::Running => {
            tracing::warn!("a kept volume's image is gone after restart; settling");
            Some(Ended::Stop(CloseReason::ProviderStop))
        }
        LeaseState::Closing => {
            let reason = s.lease.close_reason.unwrap_or(CloseReason::ProviderStop);
            finish::finish(&mut s, reason, &mut inbox).await;
            None
        }
        _ => None,
    };
    if s.ctx.cancel.is_cancelled() {
        return false;
    }
    if let Some(ended) = ended {
        finish::wrap_up(&mut s, ended, &mut inbox).await;
    }
    storage::remove_when_free(&s);
    true
}

/// Answers a renter's [`SessionRequest::Reports`] from the store: its signed usage reports
/// after `after_seq` (at most `MAX_REPORTS_PER_BATCH`, `more` when others follow) and, once
/// the lease is closed here and no reports follow, a signed close saying why, with the exit
/// code. Only to the lease's renter; `Busy` when the store cannot answer.
pub(crate) async fn serve_reports(
    ctx: &Ctx,
    peer: PeerId,
    lease_id: LeaseId,
    after_seq: u64,
) -> SessionResponse {
    use gridlease_protocol::session::{MAX_REPORTS_PER_BATCH, ReportBatch};
    let Ok(Some(l)) = ctx.store.call(move |s| s.lease(&lease_id)).await else {
        return SessionResponse::UnknownLease;
    };
    if l.role != Role::Provider || l.lease.terms.renter.peer_id().ok() != Some(peer) {
        return SessionResponse::UnknownLease;
    }
    let rows = ctx
        .store
        .call(move |s| {
            let rows = s.usage_after(&lease_id, after_seq, MAX_REPORTS_PER_BATCH + 1)?;
            let rec = s.session_record(&lease_id)?;
            Ok::<_, crate::store::StoreError>((rows, rec))
        })
        .await;
    let Ok((mut rows, rec)) = rows else {
        return SessionResponse::Busy;
    };
    let more = rows.len() > MAX_REPORTS_PER_BATCH;
    rows.truncate(MAX_REPORTS_PER_BATCH);
    let mut reports = Vec::with_capacity(rows.len());
    for b in rows {
        match Signed::<UsageReport>::from_bytes(&b) {
            Ok(r) => reports.push(r),
            Err(e) => {
                tracing::error!(error = %e, "a stored usage report does not decode");
                return SessionResponse::Busy;
            }
        }
    }
    // The close is stored after the final report, so with it every report is here.
    let close = match (more, rec.fields.close_reason) {
        (false, Some(reason)) => sign(
            ctx,
            &LeaseClose {
                lease_id,
                reason,
                at: rec.fields.closed_at.unwrap_or_else(|| ctx.now()),
                exit_code: rec.fields.exit_code,
                failure: rec.fields.failure.clone(),
            },
        ),
        _ => None,
    };
    SessionResponse::Reports(ReportBatch {
        reports,
        more,
        close,
    })
}

/// A message for a running session (log requests never come here: see [`logs`]). Returns a
/// reason to stop, if any.
fn on_msg(s: &mut Session, msg: SessionMsg) -> Option<CloseReason> {
    match msg {
        SessionMsg::Stop(done) => {
            let _ = done.send(());
            Some(CloseReason::ProviderStop)
        }
        SessionMsg::Reclaim(done) => {
            let _ = done.send(());
            Some(CloseReason::OwnerReclaimed)
        }
        // The renter keeps the disk (`stop --keep-disk`): its stop, the workspace kept
        // ([`finish`] finds the volume that adopts it).
        SessionMsg::HandOver => {
            tracing::info!("the renter keeps this lease's disk as a volume: stopping");
            Some(CloseReason::RenterStop)
        }
        SessionMsg::Extend(ask) => {
            let _ = ask
                .reply
                .send(Err(crate::lease::extend::ExtendError::NotRenter(
                    s.lease.id,
                )));
            None
        }
        SessionMsg::VerifyGpu(reply) => {
            let _ = reply.send(Err("this node provides the lease; its renter checks".into()));
            None
        }
        SessionMsg::Inbound(m) => {
            let from_renter = Some(m.peer) == s.renter_peer;
            match m.request {
                SessionRequest::Close(signed) if from_renter => {
                    let net = s.ctx.client.network().clone();
                    match signed.verify(&net) {
                        Ok(v) if v.signer == s.renter && v.message.lease_id == s.lease.id => {
                            s.channel.heard_from_renter(s.ctx.now());
                            let _ = m.reply.send(SessionResponse::Closed { last_receipt: None });
                            Some(v.message.reason)
                        }
                        _ => {
                            let _ = m.reply.send(SessionResponse::UnknownLease);
                            None
                        }
                    }
                }
                // A renter that was away catching up: heard from, answered from the store.
                SessionRequest::Reports {
                    lease_id,
                    after_seq,
                } if from_renter => {
                    s.channel.heard_from_renter(s.ctx.now());
                    let (ctx, peer, reply) = (s.ctx.clone(), m.peer, m.reply);
                    tokio::spawn(async move {
                        let _ = reply.send(serve_reports(&ctx, peer, lease_id, after_seq).await);
                    });
                    None
                }
                // Already started (the hold ran out, or a retried begin).
                SessionRequest::Begin { .. } if from_renter => {
                    let _ = m.reply.send(SessionResponse::NothingDue);
                    None
                }
                _ => {
                    let _ = m.reply.send(SessionResponse::UnknownLease);
                    None
                }
            }
        }
    }
}

/// Tells the renter, in `inflight`, that the lease runs from `started` (a prepaid lease pays
/// ahead then).
fn tell_started(
    s: &Session,
    started: Timestamp,
    inflight: &mut tokio::task::JoinSet<Result<SessionResponse, SessionRpcError>>,
) {
    let Some(peer) = s.renter_peer else {
        return;
    };
    let (ctx, lease_id) = (s.ctx.clone(), s.lease.id);
    inflight.spawn(async move {
        crate::lease::rpc::session_rpc(
            &ctx,
            peer,
            SessionRequest::Started {
                lease_id,
                started_at: started,
            },
        )
        .await
    });
}

/// Real NVML UUIDs of the lease's GPUs (none for declared dev GPUs).
fn leased_uuids(ctx: &Ctx, gpus: &[gridlease_protocol::Digest]) -> Vec<String> {
    gpus.iter()
        .filter_map(|d| ctx.config.gpu_uuids.get(d).cloned())
        .collect()
}
