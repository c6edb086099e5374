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

use std::sync::Arc;
use std::time::Duration;

use gridlease_contracts::{
    Actor, BilledTime, Decision, Lease, LeaseEvent, LeaseState, Money, ProviderChannel,
    StopSchedule, Tariff,
};
use gridlease_protocol::{
    AmendAccept, AmendRefusal, CloseReason, LeaseClose, LeaseId, PaymentReceipt, PeerId, PublicKey,
    Signed, StartFailure, StartFailureKind, Timestamp, UsageReport,
};
use gridlease_sandbox::meter::{Cut, Meter, MeterControl, Usage, meter_run, to_usage_report};
use gridlease_sandbox::runtime::SandboxError;
use gridlease_sandbox::{Sandbox, SandboxSpec};
use tokio::sync::{mpsc, watch};

use super::config::MAX_LOG_BYTES;
use super::ctx::Ctx;
use super::logs::{self, LogWriter};
use super::session::{InboundSession, SessionMsg, SessionReply, session_rpc, sign};
use super::view::{self, LeaseView};
use super::watchdog::{self, Ensured};
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
    telemetry: super::telemetry::Ring,
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
            super::session::transition(&self.ctx, &mut self.lease, event, actor, patch).await;
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
                max_duration_s: own.offer.max_duration_s,
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
    async fn on_answer(&mut self, answer: Result<SessionResponse, String>) -> Option<CloseReason> {
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
    telemetry: super::telemetry::Ring,
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
            let (_, proposal) = super::extend::decode_proposal(&a.proposal)?;
            let (signed, _) = super::extend::decode_acceptance(a.acceptance.as_deref()?)?;
            Some((proposal, signed))
        }),
        telemetry,
        gpus_declared: rec.gpus_declared,
    };
    s.publish();

    let ended = match s.lease.state {
        LeaseState::Accepted | LeaseState::Starting => match start(&mut s, &mut inbox).await {
            Ok(()) => Some(meter_loop(&mut s, &mut inbox).await),
            Err(Halt::Failed(failure)) => {
                tracing::warn!(kind = ?failure.kind, "start failed: {}", failure.message);
                s.failure = Some(failure);
                finish(&mut s, CloseReason::StartFailed, &mut inbox).await;
                None
            }
            Err(Halt::Stopped(reason)) => {
                tracing::info!(?reason, "stopped while held for uploads");
                finish(&mut s, reason, &mut inbox).await;
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
                Some(meter_loop(&mut s, &mut inbox).await)
            } else {
                tracing::warn!("running lease has no container after restart; settling");
                Some(Ended::Stop(CloseReason::ProviderStop))
            }
        }
        LeaseState::Closing => {
            let reason = s.lease.close_reason.unwrap_or(CloseReason::ProviderStop);
            finish(&mut s, reason, &mut inbox).await;
            None
        }
        _ => None,
    };
    if let Some(ended) = ended {
        wrap_up(&mut s, ended, &mut inbox).await;
    }
    !ctx.cancel.is_cancelled() && (s.container.is_none() || s.kept_outputs)
}

/// Ensure image, create and start the container. Persist before act: `Starting` is stored
/// before anything is pulled or created, `Running` (with the start time: the lease clock's
/// zero, and the container id) right after the start; a write that fails stops the start,
/// and a container already created is removed. A container left by an interrupted start has
/// the lease's name (`container_name`), so a start resumed after a restart (`Starting`
/// stored) removes it by name first; its id needs no write of its own. With an upload hold in
/// the terms, the created container waits for the renter between create and start ([`hold`]),
/// and its id is stored before that wait (a restart during the hold finds it).
async fn start(s: &mut Session, inbox: &mut mpsc::Receiver<SessionMsg>) -> Result<(), Halt> {
    let ctx = s.ctx.clone();
    let Some(sb) = ctx.sandbox.clone() else {
        tracing::error!("no Docker: cannot start the container");
        return Err(StartFailure::new(
            StartFailureKind::NoSandbox,
            "the provider's node has no container runtime (Docker is unreachable)",
        )
        .into());
    };
    // Stored as `Starting` already: this node stopped during an earlier start of the lease.
    let resumed = s.lease.state == LeaseState::Starting;
    if s.lease.state == LeaseState::Accepted
        && !s
            .transition(
                LeaseEvent::BeginStart,
                Actor::Provider,
                SessionPatch::default(),
            )
            .await
    {
        return Err(internal("cannot record the start").into());
    }
    #[cfg(feature = "faults")]
    if let Some(d) = ctx.config.faults.slow_start {
        tokio::time::sleep(d).await;
    }
    let terms = s.lease.terms.clone();
    if terms.upload_hold_s > 0 && s.container.is_some() {
        // This node stopped while the container was held: the workspace is made afresh below,
        // so what the renter uploaded (and its copy journal says is there) would be gone.
        remove_container(s).await;
        return Err(internal(
            "the provider's node restarted while the container was held for uploads; rent again",
        )
        .into());
    }
    // The cap on unpacked size is the offer's (a registry states only compressed sizes:
    // checked while the image is pulled, and the pull stopped at it).
    let max_unpacked = match ctx.client.own_offer().await {
        Ok(Some(own)) => own.images.max_unpacked_bytes,
        _ => gridlease_contracts::image::ImagePolicy::default().max_unpacked_bytes,
    };
    let limits = gridlease_sandbox::runtime::PullLimits {
        stall: ctx.config.pull_stall,
        total: ctx.config.pull_timeout,
        max_unpacked: Some(max_unpacked),
    };
    // Pull progress goes to the renter (at most once a second), so a long pull that keeps
    // progressing is not taken for a silent provider.
    let (progress_tx, forward) = pull_progress(&ctx, s.lease.id, s.renter_peer);
    let mut layers: std::collections::HashMap<String, (u64, u64)> = Default::default();
    let pulled = sb
        .ensure_image_within(&terms.image, limits, |p| {
            let Some(layer) = p.layer else { return };
            let e = layers.entry(layer).or_default();
            match (p.status.as_str(), p.current, p.total) {
                ("Downloading", Some(c), Some(t)) => {
                    *e = (u64::try_from(c).unwrap_or(0), u64::try_from(t).unwrap_or(0));
                }
                ("Download complete" | "Pull complete" | "Already exists", _, _) => e.0 = e.1,
                _ => return,
            }
            let sum = layers
                .values()
                .fold((0u64, 0u64), |(a, b), (c, t)| (a + c, b + t));
            progress_tx.send_replace(sum);
        })
        .await;
    drop(progress_tx);
    if let Some(f) = forward {
        f.abort();
    }
    let presence = pulled.map_err(|e| {
        tracing::warn!(error = %e, image = %terms.image, "image not available");
        pull_failure(&e)
    })?;
    // Pulled for a lease: tracked in the bounded cache (`images::evict`); used again: touched.
    let (reference, now) = (super::images::canonical(&terms.image), ctx.now());
    let bytes = match presence {
        gridlease_sandbox::runtime::Presence::Pulled { bytes } => Some(bytes),
        gridlease_sandbox::runtime::Presence::Present => None,
    };
    if let Err(e) = ctx
        .store
        .call(move |st| st.touch_pulled_image(&reference, bytes, now))
        .await
    {
        tracing::warn!(error = %e, "cannot record the image in the cache");
    }
    // Egress only behind the host firewall: no rules, no container.
    super::egress::ensure(&ctx, &sb, terms.network_policy).await?;
    let uuids = leased_uuids(&ctx, &s.gpus);
    // The deadline counts from now (after the upload hold) at the latest; the watcher uses
    // the real start below.
    let expires = ctx
        .now()
        .plus_secs(u64::from(terms.upload_hold_s))
        .plus_secs(u64::from(terms.duration_s));
    let mut spec = SandboxSpec::from_terms(
        s.lease.id,
        &terms,
        &ctx.node_id,
        expires,
        uuids,
        &ctx.config.limits,
    );
    // Docker refuses a CPU quota above the host's CPUs; an offer that promises more than the
    // host has is capped here (with a warning) rather than failing the lease.
    let host_millicores = std::thread::available_parallelism()
        .map(|n| {
            u32::try_from(n.get())
                .unwrap_or(u32::MAX)
                .saturating_mul(1000)
        })
        .unwrap_or(1000);
    if spec.cpu_millicores > host_millicores {
        tracing::warn!(
            promised = spec.cpu_millicores,
            host = host_millicores,
            "offer promises more CPU than this host has; capping"
        );
        spec.cpu_millicores = host_millicores;
    }
    // A container from an interrupted start (a stop between create and `Running`) is replaced.
    if resumed {
        let name = gridlease_sandbox::spec::container_name(&spec);
        let _ = sb.remove(&name).await;
    }
    // The lease's /workspace, before the container that mounts it (removed in `finish`).
    let workspace = create_workspace(&ctx, &sb, &spec).await;
    spec.workspace = Some(workspace.map_err(|e| {
        StartFailure::new(
            StartFailureKind::Create,
            format!("the lease's /workspace could not be created: {e}"),
        )
    })?);
    let id = sb.create(&spec).await.map_err(|e| {
        tracing::warn!(error = %e, "cannot create the container");
        StartFailure::new(
            StartFailureKind::Create,
            format!("the container could not be created: {e}"),
        )
    })?;
    s.container = Some(id.clone());
    #[cfg(feature = "faults")]
    if ctx.config.faults.stop_after_create {
        tracing::info!(container = %id, "stopping after create (test fault)");
        return Err(Halt::Shutdown);
    }
    if terms.upload_hold_s > 0 {
        // The hold may last minutes: a restart during it must find the container.
        let patch = SessionPatch {
            container_id: Some(id.clone()),
            ..SessionPatch::default()
        };
        let (lid, state) = (s.lease.id, s.lease.state);
        if let Err(e) = ctx
            .store
            .call(move |st| st.lease_transition(&lid, None, state, &patch))
            .await
        {
            tracing::error!(error = %e, "cannot store the container id; not starting it");
            remove_container(s).await;
            return Err(internal("cannot record the container").into());
        }
    }
    if let Err(halt) = hold(s, inbox).await {
        remove_container(s).await;
        return Err(halt);
    }
    if let Err(e) = sb.start(&id).await {
        tracing::warn!(error = %e, "cannot start the container");
        remove_container(s).await;
        return Err(StartFailure::new(
            StartFailureKind::Start,
            format!("the container could not be started: {e}"),
        )
        .into());
    }
    s.logs = Some(LogWriter::spawn(
        sb.clone(),
        id.clone(),
        ctx.log_path(&s.lease.id),
        logs::Caps::split(MAX_LOG_BYTES),
    ));
    let now = ctx.now();
    s.channel = ProviderChannel::new(s.lease.id, &terms, now);
    let running = s
        .transition(
            LeaseEvent::Started,
            Actor::Provider,
            SessionPatch {
                started_at: Some(now),
                container_id: Some(id.clone()),
                ..SessionPatch::default()
            },
        )
        .await;
    if !running {
        // Not recorded as running: it must not run (or be billed) unrecorded.
        remove_container(s).await;
        return Err(internal("cannot record the running container").into());
    }
    tracing::info!(container = %id, "lease running");
    Ok(())
}

/// `rent --upload`: the created container waits, its `/workspace` open to the renter's copies
/// (`access::authorize` sees `upload_until` in the view), until the renter says to begin
/// (`SessionRequest::Begin`) or the terms' `upload_hold_s` runs out (then the command starts
/// anyway: the renter asked for that long). A stop or close meanwhile ends the lease; it was
/// not billed (the lease clock starts with the command). No hold in the terms: returns at once.
async fn hold(s: &mut Session, inbox: &mut mpsc::Receiver<SessionMsg>) -> Result<(), Halt> {
    let hold_s = s.lease.terms.upload_hold_s;
    if hold_s == 0 {
        return Ok(());
    }
    let ctx = s.ctx.clone();
    let until = ctx.now().plus_secs(u64::from(hold_s));
    s.held_until = Some(until);
    s.publish();
    tracing::info!(hold_s, "container held for the renter's uploads");
    if let Some(peer) = s.renter_peer {
        // Told once, off the loop: a renter that misses it sees the lease start at the end.
        let (ctx, lease_id) = (ctx.clone(), s.lease.id);
        tokio::spawn(async move {
            let req = SessionRequest::Held { lease_id, until };
            if let Err(e) = session_rpc(&ctx, peer, req).await {
                tracing::warn!(error = %e, "cannot tell the renter about the upload hold");
            }
        });
    }
    // Paces the look at the clock (a manual clock in tests moves without a timer).
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let ended = loop {
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => break Err(Halt::Shutdown),
            msg = inbox.recv() => match msg {
                None => break Err(Halt::Shutdown),
                Some(SessionMsg::Inbound(m))
                    if matches!(m.request, SessionRequest::Begin { .. }) =>
                {
                    if Some(m.peer) == s.renter_peer {
                        let _ = m.reply.send(SessionResponse::NothingDue);
                        tracing::info!("the renter's uploads are done; starting");
                        break Ok(());
                    }
                    let _ = m.reply.send(SessionResponse::UnknownLease);
                }
                Some(SessionMsg::Inbound(m)) if matches!(m.request, SessionRequest::Extend(_)) => {
                    // Decided once the command runs (the deadline counts from then).
                    let _ = m.reply.send(SessionResponse::Busy);
                }
                Some(msg) => {
                    if let Some(reason) = on_msg(s, msg) {
                        break Err(Halt::Stopped(reason));
                    }
                }
            },
            _ = tick.tick() => {
                if ctx.now() >= until {
                    tracing::warn!(hold_s, "upload hold ran out; starting the command anyway");
                    break Ok(());
                }
            }
        }
    };
    s.held_until = None;
    s.publish();
    ended
}

/// A channel for pull progress (bytes pulled, bytes known) and the task that forwards its
/// latest value to the renter at most once a second (none without a renter peer).
fn pull_progress(
    ctx: &Arc<Ctx>,
    lease_id: LeaseId,
    peer: Option<PeerId>,
) -> (
    watch::Sender<(u64, u64)>,
    Option<tokio::task::JoinHandle<()>>,
) {
    let (tx, mut rx) = watch::channel((0u64, 0u64));
    let forward = peer.map(|peer| {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let (pulled, total) = *rx.borrow_and_update();
                let msg = SessionRequest::Starting {
                    lease_id,
                    pulled,
                    total,
                };
                if let Err(e) = session_rpc(&ctx, peer, msg).await {
                    tracing::debug!(error = %e, "pull progress not delivered");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    });
    (tx, forward)
}

/// The provider's own bookkeeping failed during a start.
fn internal(what: &str) -> StartFailure {
    StartFailure::new(
        StartFailureKind::Internal,
        format!("the provider's node failed: {what} (its database refused the write)"),
    )
}

/// A failed `ensure_image`, for the renter.
fn pull_failure(e: &SandboxError) -> StartFailure {
    match e {
        SandboxError::Pull { message, .. } => StartFailure::new(
            StartFailureKind::ImagePull,
            format!("image pull failed: {message}"),
        ),
        SandboxError::PullStalled { secs, .. } => StartFailure::new(
            StartFailureKind::PullStalled,
            format!("image pull stalled: no progress for {secs} s"),
        ),
        SandboxError::PullTimeout { secs, .. } => StartFailure::new(
            StartFailureKind::PullTimeout,
            format!("image pull took longer than the provider's limit of {secs} s"),
        ),
        SandboxError::PullTooLarge { max, .. } => StartFailure::new(
            StartFailureKind::ImageRefused,
            format!(
                "image refused: it unpacks to more than the provider's limit of {:.1} GiB (max_unpacked_gib); the pull was stopped and nothing of it kept",
                *max as f64 / f64::from(1u32 << 30)
            ),
        ),
        SandboxError::Image { source } | SandboxError::Spec { source, .. } => StartFailure::new(
            StartFailureKind::ImageRefused,
            format!("image refused: {source}"),
        ),
        SandboxError::Docker { source, .. } => StartFailure::new(
            StartFailureKind::ImagePull,
            format!("image pull failed: {}", docker_message(source)),
        ),
        SandboxError::Build { message, .. } | SandboxError::Unexpected { message, .. } => {
            StartFailure::new(
                StartFailureKind::ImagePull,
                format!("image pull failed: {message}"),
            )
        }
    }
}

/// The daemon's own message from a Docker error (without bollard's wrapping).
fn docker_message(e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerResponseServerError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// Creates the lease's workspace volume (a fresh one; whatever an interrupted start left is
/// replaced) and returns its name.
async fn create_workspace(
    ctx: &Ctx,
    sb: &Sandbox,
    spec: &SandboxSpec,
) -> Result<String, gridlease_sandbox::WorkspaceError> {
    match sb.create_workspace(&ctx.workspace_dir(), spec).await {
        Ok(ws) => Ok(ws.volume),
        Err(e) => {
            tracing::warn!(error = %e, "cannot create the workspace");
            Err(e)
        }
    }
}

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
async fn remove_container(s: &mut Session) {
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

/// Real NVML UUIDs of the lease's GPUs (none for declared dev GPUs).
fn leased_uuids(ctx: &Ctx, gpus: &[gridlease_protocol::Digest]) -> Vec<String> {
    gpus.iter()
        .filter_map(|d| ctx.config.gpu_uuids.get(d).cloned())
        .collect()
}

/// Makes sure the container's deadline watchdog runs, if this node has one ([`watchdog`]).
/// Its deadline is by this service's clock (the wall clock in a daemon).
fn ensure_watchdog(s: &Session, cid: &str, deadline: Timestamp) {
    let Some(exe) = &s.ctx.config.watchdog else {
        return;
    };
    let (dir, id, grace) = (&s.ctx.config.data_dir, &s.lease.id, s.ctx.config.stop_grace);
    match watchdog::ensure(exe, dir, id, cid, deadline, grace) {
        Ok(Ensured::Spawned(pid)) => {
            tracing::info!(pid, deadline = %deadline, "deadline watchdog started")
        }
        Ok(Ensured::Running(pid)) => tracing::info!(pid, "deadline watchdog already running"),
        Err(e) => tracing::warn!(
            error = %e,
            "no deadline watchdog: the container is stopped at its deadline only while this node runs"
        ),
    }
}

/// Meters the running container and exchanges reports and receipts until the run ends.
/// Metering is `sandbox::meter::meter_run` in its own task; each report closes an interval
/// through its control channel.
async fn meter_loop(s: &mut Session, inbox: &mut mpsc::Receiver<SessionMsg>) -> Ended {
    let ctx = s.ctx.clone();
    let (Some(sb), Some(cid)) = (ctx.sandbox.clone(), s.container.clone()) else {
        return Ended::Stop(CloseReason::StartFailed);
    };
    let Some(started) = s.lease.started_at else {
        return Ended::Stop(CloseReason::StartFailed);
    };
    // Re-attached after a restart: continue the output file where it stopped.
    let log_writer = s.logs.take().unwrap_or_else(|| {
        LogWriter::resume(
            sb.clone(),
            cid.clone(),
            ctx.log_path(&s.lease.id),
            logs::Caps::split(MAX_LOG_BYTES),
        )
    });
    let terms = s.lease.terms.clone();
    // The deadline moves later when the renter's extension is accepted (`on_extend`).
    let mut deadline = started.plus_secs(u64::from(terms.duration_s));
    let grace_ms = u64::try_from(ctx.config.stop_grace.as_millis()).unwrap_or(u64::MAX);
    let mut at_deadline = StopSchedule::at_deadline(deadline, grace_ms);
    let claim = watchdog::term_claim(&ctx.config.data_dir, &s.lease.id);
    ensure_watchdog(s, &cid, deadline);
    // The sampler's ids of the leased GPUs, in the lease's order.
    let gpu_uuids: Vec<String> = ctx.config.gpu_sampler.as_ref().map_or_else(Vec::new, |g| {
        s.gpus
            .iter()
            .filter_map(|d| g.ids.get(d).cloned())
            .collect()
    });
    let live = {
        let (ring, ids, gpus) = (s.telemetry.clone(), gpu_uuids.clone(), s.gpus.len());
        Box::new(move |l: gridlease_sandbox::meter::LiveSample<'_>| {
            ring.push(super::telemetry::sample(&l, &ids, gpus));
        })
    };
    let (cut_tx, cuts) = mpsc::channel(4);
    // The meter measures what the container really used, so it stamps samples and cuts with
    // the system clock whatever the service's clock is: a test that advances the lease clock
    // (a grace period passing at once) moves silence limits and deadlines, not the usage the
    // container had. In a daemon the two are the same clock.
    let mut control = MeterControl {
        cuts,
        now: Arc::new(crate::clock::now),
        live: Some(live),
    };
    let mut metering: tokio::task::JoinSet<_> = tokio::task::JoinSet::new();
    {
        let (sb, cid) = (sb.clone(), cid.clone());
        let sampler = ctx.config.gpu_sampler.clone();
        let gpus = u32::from(terms.gpu_count);
        metering.spawn(async move {
            let mut meter = Meter::new(started, gpus);
            let r = meter_run(
                &sb,
                &cid,
                &mut meter,
                &gpu_uuids,
                sampler.as_ref().map(|g| g.sampler.as_ref()),
                &mut control,
            )
            .await;
            (meter, r)
        });
    }
    let cut = |at: Timestamp| {
        let tx = cut_tx.clone();
        async move {
            let (reply, rx) = tokio::sync::oneshot::channel();
            tx.send(Cut { at, reply }).await.ok()?;
            rx.await.ok()
        }
    };
    let period = Duration::from_secs(u64::from(terms.usage_interval_s.max(1)));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Expiry: the time to send SIGTERM (the tick re-checks by the clock).
    let until_term = Duration::from_millis(at_deadline.term_at.ms_since(ctx.now()));
    let expiry = tokio::time::sleep(until_term);
    tokio::pin!(expiry);
    // At most one report in flight: a slow renter delays the next report, never the loop.
    let mut inflight: tokio::task::JoinSet<Result<SessionResponse, String>> =
        tokio::task::JoinSet::new();
    // The renter learns at once that the command runs (and pays ahead a prepaid lease then).
    if let Some(peer) = s.renter_peer {
        let (ctx2, lease_id) = (ctx.clone(), s.lease.id);
        inflight.spawn(async move {
            session_rpc(
                &ctx2,
                peer,
                SessionRequest::Started {
                    lease_id,
                    started_at: started,
                },
            )
            .await
        });
    }
    let mut iv_start = ctx.now().max(started);
    let mut finished = None;
    let ended = loop {
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => {
                // Node shutting down: leave the container running; the restart resumes it.
                return Ended::Stop(CloseReason::ProviderStop);
            }
            done = metering.join_next(), if finished.is_none() => {
                finished = done;
                break Ended::Exited;
            }
            () = &mut expiry => break Ended::Stop(CloseReason::Expired),
            Some(msg) = inbox.recv() => match msg {
                SessionMsg::Inbound(m) if matches!(m.request, SessionRequest::Extend(_)) => {
                    if s.on_extend(*m, grace_ms).await
                        && let Some(d) = s.lease.deadline()
                    {
                        deadline = d;
                        at_deadline = StopSchedule::at_deadline(deadline, grace_ms);
                        let until = Duration::from_millis(at_deadline.term_at.ms_since(ctx.now()));
                        expiry.as_mut().reset(tokio::time::Instant::now() + until);
                    }
                }
                msg => {
                    if let Some(reason) = on_msg(s, msg) {
                        break Ended::Stop(reason);
                    }
                }
            },
            Some(answer) = inflight.join_next(), if !inflight.is_empty() => {
                let answer = answer.unwrap_or_else(|e| Err(e.to_string()));
                if let Some(reason) = s.on_answer(answer).await {
                    break Ended::Stop(reason);
                }
            }
            _ = tick.tick() => {
                let now = ctx.now();
                if StopSchedule::expired(deadline, grace_ms, now) {
                    break Ended::Stop(CloseReason::Expired);
                }
                let Some((interval, totals)) = cut(crate::clock::now()).await else {
                    // The meter ended (container exited): the next turn collects it.
                    continue;
                };
                if inflight.is_empty() {
                    if let Some(signed) = s.report(iv_start, now, &totals, &interval, None, false).await
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
                        tracing::warn!(?reason, wall_ms = totals.wall_ms, paid = %s.channel.paid(), "payment channel says stop");
                        break Ended::Stop(reason);
                    }
                    Err(e) => tracing::error!(error = %e, "billing overflow"),
                }
            }
        }
    };
    // Stop the container on schedule (expired: SIGTERM now, at deadline - grace, and SIGKILL at
    // the deadline; stopped earlier: SIGTERM now, SIGKILL after the grace but never past the
    // deadline) while an in-flight report finishes, so the final report's sequence follows it
    // and waiting for the renter never delays a signal.
    let schedule = match ended {
        Ended::Stop(CloseReason::Expired) => Some(at_deadline),
        Ended::Stop(_) => Some(StopSchedule::early(ctx.now(), deadline, grace_ms)),
        Ended::Exited => None,
    };
    let clock = ctx.config.clock.clone();
    let now = move || clock.now();
    let stopping = async {
        if let Some(schedule) = schedule
            && let Err(e) = sb.enforce_stop(&cid, schedule, &now, Some(&claim)).await
        {
            tracing::warn!(error = %e, "stopping the container failed");
        }
    };
    let answered = tokio::time::timeout(ctx.config.rpc_timeout, inflight.join_next());
    let ((), answer) = tokio::join!(stopping, answered);
    if let Ok(Some(Ok(answer))) = answer {
        let _ = s.on_answer(answer).await;
    }
    // Stopped by the watchdog's SIGTERM (a node that came back after the deadline, or the
    // watchdog first at deadline - grace): the lease expired.
    let ended = match ended {
        Ended::Exited if claim.taken() && StopSchedule::expired(deadline, grace_ms, ctx.now()) => {
            Ended::Stop(CloseReason::Expired)
        }
        e => e,
    };
    // The meter ends with the container; its totals use the daemon's run time.
    let finished = match finished {
        Some(f) => Some(f),
        None => tokio::time::timeout(ctx.config.rpc_timeout, metering.join_next())
            .await
            .ok()
            .flatten(),
    };
    let (totals, samples) = match finished {
        Some(Ok((_, Ok((exit, totals, n))))) => {
            s.exit_code = Some(i32::try_from(exit.exit_code).unwrap_or(-1));
            (totals, n)
        }
        Some(Ok((mut meter, Err(e)))) => {
            tracing::warn!(error = %e, "metering ended with an error");
            let exit = sb.exit_info(&cid).await.ok();
            if let Some(x) = &exit {
                s.exit_code = Some(i32::try_from(x.exit_code).unwrap_or(-1));
            }
            (
                meter.finish(crate::clock::now(), exit.and_then(|x| x.run_ms)),
                0,
            )
        }
        _ => {
            tracing::error!("the meter did not finish; reporting the last totals");
            let last = s.last_report.as_ref();
            let wall = last.map_or(0, |r| r.wall_ms);
            (
                Usage {
                    wall_ms: wall,
                    gpu_ms: last.map_or(0, |r| r.gpu_ms),
                    cpu_ms: last.map_or(0, |r| r.cpu_ms),
                    ..Usage::default()
                },
                0,
            )
        }
    };
    tracing::info!(
        wall_ms = totals.wall_ms,
        cpu_ms = totals.cpu_ms,
        samples,
        exit_code = ?s.exit_code,
        "container stopped"
    );
    // Final report (minimum billing applies, unless the owner took the GPUs back), unless the
    // renter is known to be gone. Sent
    // before the output file is made final, which reads the whole log again: the renter
    // hears the end of the run at once, not after a large log is re-read.
    let send_final = !matches!(
        ended,
        Ended::Stop(CloseReason::RenterUnreachable | CloseReason::BadReceipt)
    );
    let now = ctx.now();
    if let Some(signed) = s
        .report(
            iv_start,
            now,
            &totals,
            &totals,
            Some(s.exit_code.unwrap_or(-1)),
            matches!(ended, Ended::Stop(r) if gridlease_contracts::billing::minimum_waived(r)),
        )
        .await
        && send_final
        && let Some(peer) = s.renter_peer
    {
        let answer = session_rpc(&ctx, peer, SessionRequest::Usage(signed)).await;
        let _ = s.on_answer(answer).await;
    }
    // Before the lease closes: a follower gets `eof` only once the file is complete.
    log_writer.finish().await;
    ended
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
        SessionMsg::Extend(ask) => {
            let _ = ask
                .reply
                .send(Err(super::extend::ExtendError::NotRenter(s.lease.id)));
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

/// After the run: close and settle (shared by all endings).
async fn wrap_up(s: &mut Session, ended: Ended, inbox: &mut mpsc::Receiver<SessionMsg>) {
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
async fn finish(s: &mut Session, reason: CloseReason, _inbox: &mut mpsc::Receiver<SessionMsg>) {
    let ctx = s.ctx.clone();
    let now = ctx.now();
    // Outputs the terms keep: the stopped container and its workspace stay for the renter's
    // downloads (stored with the close, before anything is removed or kept).
    let retention = u64::from(s.lease.terms.output_retention_s);
    let keep = retention > 0
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
            remove_workspace(s).await;
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
        tokio::spawn(super::completion::propose(
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
