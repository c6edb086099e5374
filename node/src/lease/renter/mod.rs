//! The renter's session of one lease: answer each plausible usage report with a signed
//! cumulative receipt (persisted with its ledger rows before it is sent), refuse implausible
//! ones and close (`ImplausibleUsage`), close when the provider goes silent
//! (`ProviderUnreachable`), close on `stop`, and settle at the last receipt when the provider's
//! close arrives.

use std::sync::Arc;
use std::time::Duration;

use gridlease_contracts::{Actor, Lease, LeaseEvent, RenterChannel};
use gridlease_protocol::{
    AmendAccept, CloseReason, LeaseAmendment, LeaseClose, PaymentReceipt, PeerId, PublicKey,
    Signed, Timestamp, UsageReport,
};
use tokio::sync::{mpsc, watch};

use super::ctx::Ctx;
use super::extend::{self as ext, Answer, ExtendError, ExtendFailure, Extended};
use super::rpc::session_rpc;
use super::session::{InboundSession, SessionMsg, apply_and_persist_at, sign};
use super::view::{self, LeaseView};
use super::wire::{SessionRequest, SessionResponse, detail};
use crate::store::lease::{SessionPatch, SessionRecord, UsageKept};
use crate::store::{Role, StoredLease};

/// How often the renter checks on a silent provider.
const TICK: Duration = Duration::from_millis(250);
/// Slack on top of two usage intervals before a silent provider is given up.
const SILENCE_SLACK_MS: u64 = 2_000;
mod check;

/// How long the renter waits for the provider's close after its final report (the provider
/// saves the container's whole output first); then it settles on that report itself.
const FINAL_WAIT_MS: u64 = 60_000;

/// What reconciling with the provider found ([`Session::reconcile`]).
enum Reconciled {
    /// It answered: the lease runs on there.
    Live,
    /// The lease is over there and settled here (or was closed for a bad report).
    Settled,
    /// No usable answer.
    Unreachable,
}

struct Session {
    ctx: Arc<Ctx>,
    lease: Lease,
    provider: PublicKey,
    provider_peer: Option<PeerId>,
    channel: RenterChannel,
    last_signed: Option<Signed<PaymentReceipt>>,
    exit_code: Option<i32>,
    /// Why the provider could not start the container, as its close said.
    failure: Option<gridlease_protocol::StartFailure>,
    /// The provider's image pull so far (bytes pulled, bytes known), before the start.
    pull: Option<(u64, u64)>,
    /// The provider holds the created container for our uploads until then (before the start).
    held_until: Option<Timestamp>,
    /// An extension sent (and stored) whose answer was not seen yet ([`super::extend`]).
    pending: Option<(LeaseAmendment, Signed<LeaseAmendment>)>,
    /// The lease's offer declared its GPUs: their usage is unknown.
    gpus_declared: bool,
    /// The GPU check at the start (issue 44), as far as it went.
    check: Option<super::check_view::GpuCheckView>,
    view: watch::Sender<LeaseView>,
}

impl Session {
    fn publish(&self) {
        let known = view::Known {
            role: Role::Renter,
            counterparty: &self.provider,
            usage: self.channel.last_usage(),
            authorised: self.channel.paid().micros(),
            exit_code: self.exit_code,
            gpus_declared: self.gpus_declared,
        };
        let v = view::make(&self.lease, known, self.ctx.now())
            .with_failure(self.failure.as_ref())
            .with_pull(self.pull)
            .with_hold(self.held_until)
            .with_check(self.check.clone());
        self.view.send_replace(v);
    }

    /// Persist before act: stores the transition with `patch`, then applies it. Returns
    /// false (and logs why) when it did not happen.
    async fn transition(&mut self, event: LeaseEvent, actor: Actor, patch: SessionPatch) -> bool {
        let done =
            super::session::transition(&self.ctx, &mut self.lease, event, actor, patch).await;
        if done {
            self.publish();
        }
        done
    }

    /// The provider's first usage report shows its container running: record the start (as
    /// the provider's events; the start time is the report's end minus the wall time it
    /// claims), so this node's view says `running` with the time left.
    async fn note_running(&mut self, u: &UsageReport) {
        self.note_started(Timestamp(u.interval_end.0.saturating_sub(u.wall_ms)))
            .await;
    }

    /// Records the lease's start at `started` (provider's clock), once: the view says running.
    async fn note_started(&mut self, started: Timestamp) {
        if self.lease.state == gridlease_contracts::LeaseState::Accepted
            && !self
                .transition(
                    LeaseEvent::BeginStart,
                    Actor::Provider,
                    SessionPatch::default(),
                )
                .await
        {
            return;
        }
        if self.lease.state == gridlease_contracts::LeaseState::Starting {
            let patch = SessionPatch {
                started_at: Some(started),
                ..SessionPatch::default()
            };
            let ctx = self.ctx.clone();
            let event = LeaseEvent::Started;
            match apply_and_persist_at(
                &ctx,
                &mut self.lease,
                event,
                Actor::Provider,
                patch,
                started,
            )
            .await
            {
                Ok(()) => self.publish(),
                Err(e) => tracing::error!(error = %e, "the lease's start was not recorded"),
            }
        }
    }

    async fn close(&mut self, reason: CloseReason, actor: Actor) {
        if self.lease.state.can_close() {
            let patch = SessionPatch {
                closed_at: Some(self.ctx.now()),
                close_reason: Some(reason),
                exit_code: self.exit_code,
                failure: self.failure.clone(),
                ..SessionPatch::default()
            };
            self.transition(LeaseEvent::Close(reason), actor, patch)
                .await;
        }
    }

    /// Tells the provider (best effort, in the background).
    fn send_close(&self, reason: CloseReason) {
        let msg = LeaseClose {
            lease_id: self.lease.id,
            reason,
            at: self.ctx.now(),
            exit_code: None,
            failure: None,
        };
        if let (Some(signed), Some(peer)) = (sign(&self.ctx, &msg), self.provider_peer) {
            let ctx = self.ctx.clone();
            tokio::spawn(async move {
                if let Err(e) = session_rpc(&ctx, peer, SessionRequest::Close(signed)).await {
                    tracing::debug!(error = %e, "close not delivered");
                }
            });
        }
    }

    async fn settle(&mut self, reason: CloseReason) {
        self.close(reason, Actor::Renter).await;
        let total = self.channel.settlement();
        let patch = SessionPatch {
            settled_total: Some(total.micros()),
            exit_code: self.exit_code,
            ..SessionPatch::default()
        };
        self.transition(LeaseEvent::Settle { total }, Actor::Renter, patch)
            .await;
        tracing::info!(?reason, total = %total, exit_code = ?self.exit_code, "lease settled");
    }

    /// A deliberately bad receipt, when the test-only fault says so.
    #[cfg(feature = "faults")]
    fn fault(&mut self) -> Option<SessionResponse> {
        let (after, kind) = self.ctx.config.faults.bad_receipt_after?;
        let last = self.channel.last_receipt()?.clone();
        if last.seq < after {
            return None;
        }
        match kind {
            super::faults::BadReceipt::Replay => {
                self.last_signed.clone().map(SessionResponse::Receipt)
            }
            super::faults::BadReceipt::Decreasing => {
                let r = PaymentReceipt {
                    seq: last.seq + 1,
                    total_paid: last.total_paid.saturating_sub(1),
                    issued_at: self.ctx.now(),
                    ..last
                };
                sign(&self.ctx, &r).map(SessionResponse::Receipt)
            }
        }
    }

    /// Extends the lease by `add_s` seconds (cap `max_total`, default raised by the added
    /// time's cost): a pending extension is resolved first (if the provider had accepted it,
    /// that is the answer); then the next amendment is proposed, stored as pending, sent, and
    /// applied once its acceptance is verified and stored.
    async fn extend(
        &mut self,
        add_s: u32,
        max_total: Option<gridlease_contracts::Money>,
    ) -> Result<Extended, ExtendError> {
        if let Some((earlier, _)) = self.pending.clone() {
            match self.resolve_pending().await {
                Ok(Some(mut x)) => {
                    x.note = Some(format!(
                        "extension {} (to {} s) had not been answered; the provider had                          accepted it, so no further extension was asked for",
                        earlier.seq, earlier.duration_s
                    ));
                    return Ok(x);
                }
                Ok(None) | Err(ExtendError::Refused(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let now = self.ctx.now();
        let a = gridlease_contracts::amend::propose(&self.lease, add_s, max_total, now)
            .map_err(ExtendError::Refused)?;
        let signed = sign(&self.ctx, &a).ok_or(ExtendError::Refused(
            gridlease_protocol::AmendRefusal::Internal,
        ))?;
        let bytes = signed
            .to_bytes()
            .map_err(|e| ExtendError::BadRequest(e.to_string()))?;
        // Persist before sending: a restarted node still knows what it may have agreed to.
        let (id, stored) = (self.lease.id, a.clone());
        self.ctx
            .store
            .call(move |s| s.put_amendment(&id, &stored, &bytes, None, now))
            .await?;
        self.pending = Some((a, signed));
        self.resolve_pending().await?.ok_or(ExtendError::Closed)
    }

    /// Sends the pending extension (if any) and applies its acceptance: `Ok(None)` when none
    /// was pending. A refusal forgets it; no answer keeps it pending.
    async fn resolve_pending(&mut self) -> Result<Option<Extended>, ExtendError> {
        let Some((a, signed)) = self.pending.clone() else {
            return Ok(None);
        };
        let Some(peer) = self.provider_peer else {
            return Err(ExtendError::Remote {
                lease_id: self.lease.id,
                detail: Box::new(ExtendFailure::NoPeer),
            });
        };
        match ext::send(&self.ctx, peer, &self.provider, &signed, &a).await {
            Answer::Accepted(sa, accept) => {
                self.accepted(&a, &signed, &sa, &accept).await.map(Some)
            }
            Answer::Refused(r) => {
                tracing::info!(refusal = ?r, seq = a.seq, "extension refused by the provider");
                let (id, seq) = (self.lease.id, a.seq);
                if let Err(e) = self
                    .ctx
                    .store
                    .call(move |s| s.drop_pending_amendment(&id, seq))
                    .await
                {
                    tracing::warn!(error = %e, "cannot forget a refused extension");
                }
                self.pending = None;
                Err(ExtendError::Refused(r))
            }
            Answer::Failed(detail) => Err(ExtendError::Remote {
                lease_id: self.lease.id,
                detail: Box::new(detail),
            }),
        }
    }

    /// The provider accepted amendment `a`: store its acceptance, then take the new terms.
    async fn accepted(
        &mut self,
        a: &LeaseAmendment,
        signed: &Signed<LeaseAmendment>,
        sa: &Signed<AmendAccept>,
        accept: &AmendAccept,
    ) -> Result<Extended, ExtendError> {
        let now = self.ctx.now();
        let (pbytes, abytes) = match (signed.to_bytes(), sa.to_bytes()) {
            (Ok(p), Ok(b)) => (p, b),
            (Err(e), _) | (_, Err(e)) => return Err(ExtendError::BadRequest(e.to_string())),
        };
        let (id, stored) = (self.lease.id, a.clone());
        self.ctx
            .store
            .call(move |s| s.put_amendment(&id, &stored, &pbytes, Some(&abytes), now))
            .await?;
        self.pending = None;
        if let Err(r) = self.lease.amend(a) {
            // Accepted and stored, but this lease moved on meanwhile (it closed): nothing to run.
            tracing::warn!(refusal = ?r, "an accepted extension no longer applies here");
            return Err(ExtendError::Refused(r));
        }
        self.channel.amend(&self.lease.terms);
        self.publish();
        tracing::info!(
            seq = a.seq,
            duration_s = a.duration_s,
            max_total = a.max_total,
            deadline = %accept.deadline,
            "lease extended"
        );
        Ok(Extended::of(accept, now))
    }

    /// Signs `receipt` (already booked in the channel) and stores it with the ledger rows (and
    /// the usage report it answers, if any) before it may be sent: persist before act. `None`
    /// when it cannot be signed or stored (logged); the caller restores the channel.
    async fn persist_receipt(
        &mut self,
        receipt: &PaymentReceipt,
        usage: Option<(u64, Vec<u8>)>,
        now: Timestamp,
    ) -> Option<Signed<PaymentReceipt>> {
        // A lease settled on chain: the receipt carries the renter wallet's voucher for its
        // total, which the provider redeems on chain.
        let mut receipt = receipt.clone();
        if let Some(s) = &self.lease.terms.settlement {
            let Some(ours) = &self.ctx.config.settlement else {
                tracing::error!(
                    "the lease settles on chain and this node has no wallet configured for it; not paying"
                );
                return None;
            };
            let voucher = s.voucher(&self.lease.id, receipt.total_paid);
            receipt.voucher = Some(voucher.sign(&s.chain.domain(), &ours.wallet).to_vec());
        }
        let receipt = &receipt;
        let rs = sign(&self.ctx, receipt)?;
        let rbytes = rs.to_bytes().ok()?;
        let (id, provider, rc) = (self.lease.id, self.provider, receipt.clone());
        let booked = self
            .ctx
            .store
            .call(move |s| {
                let usage = usage.as_ref().map(|(q, b)| (*q, b.as_slice()));
                s.book_receipt(Role::Renter, &id, &provider, &rc, &rbytes, usage, now)
            })
            .await;
        match booked {
            Ok(_) => {
                self.last_signed = Some(rs.clone());
                Some(rs)
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot store a receipt; not sending it");
                None
            }
        }
    }

    /// Pays the failed-start fee the terms set for a start that failed on the image
    /// (`gridlease_contracts::billing::start_failure_is_billed`), stored before the provider's
    /// close is answered with it. Nothing for the provider's own failures.
    async fn pay_failed_start(&mut self, failure: Option<&gridlease_protocol::StartFailure>) {
        let Some(kind) = failure.map(|f| f.kind) else {
            return;
        };
        let now = self.ctx.now();
        let before = self.channel.clone();
        match self.channel.on_start_failure(kind, now) {
            Ok(Some(receipt)) => {
                if self.persist_receipt(&receipt, None, now).await.is_some() {
                    tracing::info!(
                        ?kind,
                        total = %self.channel.paid(),
                        "failed start on the image: paying the minimum billed duration"
                    );
                } else {
                    self.channel = before;
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "failed-start fee not computed");
                self.channel = before;
            }
        }
    }

    /// The provider says the command started: recorded, and the terms' prepay paid ahead at
    /// once (stored before it is answered), so the lease holds whatever becomes of this node
    /// from now on. The answer: that receipt, or `NothingDue`.
    async fn on_started(&mut self, started_at: Timestamp) -> SessionResponse {
        self.note_started(started_at).await;
        let now = self.ctx.now();
        let before = self.channel.clone();
        let Some(receipt) = self.channel.on_started(now) else {
            return SessionResponse::NothingDue;
        };
        match self.persist_receipt(&receipt, None, now).await {
            Some(rs) => {
                tracing::info!(total = %self.channel.paid(), "the lease started: prepay paid ahead");
                self.publish();
                SessionResponse::Receipt(rs)
            }
            None => {
                self.channel = before;
                SessionResponse::Busy
            }
        }
    }

    /// Pays for a container the provider held for our uploads and that we stopped before its
    /// command started (`RenterChannel::on_hold_abandoned`: the minimum billed duration).
    async fn pay_abandoned_hold(&mut self) {
        let now = self.ctx.now();
        let before = self.channel.clone();
        match self.channel.on_hold_abandoned(now) {
            Ok(Some(receipt)) => {
                if self.persist_receipt(&receipt, None, now).await.is_some() {
                    tracing::info!(
                        total = %self.channel.paid(),
                        "stopped during the upload hold: paying the minimum billed duration"
                    );
                } else {
                    self.channel = before;
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "upload-hold fee not computed");
                self.channel = before;
            }
        }
    }

    /// After a silence (this node was suspended, offline, or the provider's reports were
    /// lost): asks the provider for its reports since the last one seen, checks each one in
    /// order (recorded, not paid: the provider's next report is answered with a receipt that
    /// covers them, being cumulative) and, when the provider has closed the lease, settles as
    /// its close says. Bounded: pages of at most `MAX_REPORTS_PER_BATCH`, no more pages than
    /// the lease can have reports.
    async fn reconcile(&mut self, seen_at: Timestamp) -> Reconciled {
        use gridlease_protocol::session::MAX_REPORTS_PER_BATCH;
        let Some(peer) = self.provider_peer else {
            return Reconciled::Unreachable;
        };
        let net = self.ctx.client.network().clone();
        let terms = &self.lease.terms;
        let pages = u64::from(terms.duration_s)
            / u64::from(terms.usage_interval_s.max(1))
            / MAX_REPORTS_PER_BATCH as u64
            + 4;
        let mut checked = 0usize;
        for _ in 0..pages {
            let after_seq = self.channel.last_usage().map_or(0, |u| u.seq);
            let ask = SessionRequest::Reports {
                lease_id: self.lease.id,
                after_seq,
            };
            let batch = match session_rpc(&self.ctx, peer, ask).await {
                Ok(SessionResponse::Reports(b)) => match b.validate() {
                    Ok(()) => b,
                    Err(e) => {
                        tracing::warn!(error = %e, "malformed report batch");
                        return Reconciled::Unreachable;
                    }
                },
                Ok(other) => {
                    tracing::debug!(answer = ?other, "reports not given");
                    return Reconciled::Unreachable;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "reports not reached");
                    return Reconciled::Unreachable;
                }
            };
            for signed in &batch.reports {
                let checked_one = match signed.verify(&net) {
                    Ok(v) => {
                        let elapsed = self.ctx.now().ms_since(seen_at);
                        self.note_running(&v.message).await;
                        self.channel
                            .observe(&v.message, &v.signer, elapsed)
                            .map(|()| v.message)
                            .map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                };
                let report = match checked_one {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(error = %e, "implausible usage report while reconciling; closing");
                        self.send_close(CloseReason::ImplausibleUsage);
                        self.settle(CloseReason::ImplausibleUsage).await;
                        return Reconciled::Settled;
                    }
                };
                if report.exit_code.is_some() {
                    self.exit_code = report.exit_code;
                }
                if let Ok(bytes) = signed.to_bytes() {
                    let (id, seq, now) = (self.lease.id, report.seq, self.ctx.now());
                    if let Err(e) = self
                        .ctx
                        .store
                        .call(move |s| s.put_usage(&id, seq, &bytes, now, UsageKept::Newest))
                        .await
                    {
                        tracing::warn!(error = %e, "a reconciled report was not stored");
                    }
                }
                checked += 1;
            }
            if batch.more && !batch.reports.is_empty() {
                continue;
            }
            self.publish();
            let Some(close) = batch.close else {
                tracing::info!(checked, "reconciled with the provider: the lease runs on");
                return Reconciled::Live;
            };
            match close.verify(&net) {
                Ok(v) if v.signer == self.provider && v.message.lease_id == self.lease.id => {
                    tracing::info!(checked, reason = ?v.message.reason, "reconciled with the provider: the lease is over");
                    if v.message.exit_code.is_some() {
                        self.exit_code = v.message.exit_code;
                    }
                    if v.message.failure.is_some() {
                        self.failure = v.message.failure.clone();
                    }
                    self.close(v.message.reason, Actor::Provider).await;
                    self.settle(v.message.reason).await;
                    return Reconciled::Settled;
                }
                _ => {
                    tracing::warn!("the provider's close does not verify");
                    return Reconciled::Unreachable;
                }
            }
        }
        Reconciled::Unreachable
    }

    /// Handles a usage report. Returns `Some(reason)` when the lease must end.
    async fn on_usage(
        &mut self,
        signed: Signed<UsageReport>,
        seen_at: Timestamp,
    ) -> (SessionResponse, Option<CloseReason>) {
        let net = self.ctx.client.network().clone();
        let v = match signed.verify(&net) {
            Ok(v) => v,
            Err(e) => {
                let r = SessionResponse::Refused {
                    reason: CloseReason::ImplausibleUsage,
                    detail: detail(e),
                };
                return (r, Some(CloseReason::ImplausibleUsage));
            }
        };
        let now = self.ctx.now();
        #[cfg(feature = "faults")]
        if let Some(bad) = self.fault() {
            return (bad, None);
        }
        let elapsed = now.ms_since(seen_at);
        self.note_running(&v.message).await;
        let before = self.channel.clone();
        let mut checked = self.channel.on_usage(&v.message, &v.signer, elapsed, now);
        if checked.is_err() && self.pending.is_some() {
            // A report beyond the terms we hold may be covered by an extension whose answer we
            // missed: learn its fate before refusing the report.
            if let Err(e) = self.resolve_pending().await {
                tracing::debug!(error = %e, "pending extension not resolved");
            }
            checked = self.channel.on_usage(&v.message, &v.signer, elapsed, now);
        }
        match checked {
            Ok(Some(receipt)) => {
                let usage = signed.to_bytes().ok().map(|b| (v.message.seq, b));
                match self.persist_receipt(&receipt, usage, now).await {
                    Some(rs) => {
                        if v.message.exit_code.is_some() {
                            self.exit_code = v.message.exit_code;
                        }
                        self.publish();
                        (SessionResponse::Receipt(rs), None)
                    }
                    None => {
                        self.channel = before;
                        (SessionResponse::Busy, None)
                    }
                }
            }
            Ok(None) => {
                if let Ok(bytes) = signed.to_bytes() {
                    let (id, seq) = (self.lease.id, v.message.seq);
                    let _ = self
                        .ctx
                        .store
                        .call(move |s| s.put_usage(&id, seq, &bytes, now, UsageKept::Newest))
                        .await;
                }
                if v.message.exit_code.is_some() {
                    self.exit_code = v.message.exit_code;
                }
                self.publish();
                (SessionResponse::NothingDue, None)
            }
            Err(gridlease_contracts::channel::UsageError::StaleSeq { last, got }) => {
                // An older report delivered late (this node was away and reconciled past it,
                // or a retry): already covered by a newer one; nothing to pay, nothing wrong.
                tracing::debug!(last, got, "a late usage report, already covered");
                (SessionResponse::NothingDue, None)
            }
            Err(e) => {
                tracing::warn!(error = %e, "implausible usage report refused; closing");
                let r = SessionResponse::Refused {
                    reason: CloseReason::ImplausibleUsage,
                    detail: detail(e),
                };
                (r, Some(CloseReason::ImplausibleUsage))
            }
        }
    }
}

/// Runs a renter lease until it settles (or the node stops).
pub(crate) async fn run(
    ctx: Arc<Ctx>,
    stored: StoredLease,
    rec: SessionRecord,
    mut inbox: mpsc::Receiver<SessionMsg>,
    view_tx: watch::Sender<LeaseView>,
) {
    let mut s = restore(ctx.clone(), &stored, &rec, view_tx);
    s.publish();
    let mut w = Liveness::new(&s, &stored);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Resumed (this node restarted) with a lease that had started: where it stands is asked at
    // once, so a lease the provider ended meanwhile is settled as it says now, not after a
    // silence, and the view is never behind by more than a round trip.
    // (A lease rented now starts `accepted`: only a resumed one is `running` here.)
    if s.lease.state == gridlease_contracts::LeaseState::Running && w.closing_since.is_none() {
        match s.reconcile(w.seen_at).await {
            Reconciled::Settled => return,
            Reconciled::Live | Reconciled::Unreachable => w.last_heard = ctx.now(),
        }
    }
    loop {
        let flow = tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => return,
            msg = inbox.recv() => match msg {
                None => return,
                Some(msg) => on_message(&mut s, &mut w, msg).await,
            },
            _ = tick.tick() => on_tick(&mut s, &mut w).await,
        };
        if let Flow::End = flow {
            return;
        }
    }
}

/// Whether a renter session goes on after a message or a tick.
enum Flow {
    /// It goes on.
    Continue,
    /// The lease is settled (or the session must end).
    End,
}

/// The renter's watch on the provider: when it was last heard from, and what bounds its
/// silence.
struct Liveness {
    /// The renter's clock for plausibility: from when it stored the accepted lease.
    seen_at: Timestamp,
    interval_ms: u64,
    start_ms: u64,
    last_heard: Timestamp,
    heard_any: bool,
    /// The provider holds the container for our uploads this long more before it starts.
    hold_ms: u64,
    /// Since when this node waits for the provider's close after its own.
    closing_since: Option<Timestamp>,
    /// When the provider's final report (with the exit code) came: its close follows.
    final_since: Option<Timestamp>,
}

impl Liveness {
    /// At the session's (re)start.
    fn new(s: &Session, stored: &StoredLease) -> Self {
        let ctx = &s.ctx;
        Self {
            seen_at: stored.created_at,
            interval_ms: u64::from(s.lease.terms.usage_interval_s) * 1000,
            start_ms: u64::try_from(ctx.config.start_allowance.as_millis()).unwrap_or(u64::MAX),
            last_heard: ctx.now(),
            heard_any: s.channel.last_usage().is_some(),
            hold_ms: 0,
            closing_since: (s.lease.state == gridlease_contracts::LeaseState::Closing)
                .then(|| ctx.now()),
            final_since: None,
        }
    }
}

/// The session of a stored renter lease, as its record left it (restored after a restart).
fn restore(
    ctx: Arc<Ctx>,
    stored: &StoredLease,
    rec: &SessionRecord,
    view_tx: watch::Sender<LeaseView>,
) -> Session {
    let mut lease = stored.lease.clone();
    view::restore_lease(&mut lease, rec);
    let terms = lease.terms.clone();
    let provider = terms.provider;
    let last_usage = rec
        .last_usage
        .as_ref()
        .and_then(|(_, b)| view::decode_usage(b));
    let last_receipt = rec
        .last_receipt
        .as_ref()
        .and_then(|(_, b)| view::decode_receipt(b));
    let channel = RenterChannel::new(lease.id, terms.clone()).restore(
        last_usage.as_ref().map(|(_, u)| u.clone()),
        last_receipt.as_ref().map(|(_, r)| r.clone()),
    );
    Session {
        ctx,
        provider_peer: provider.peer_id().ok(),
        lease,
        provider,
        channel,
        last_signed: last_receipt.map(|(s, _)| s),
        exit_code: rec.fields.exit_code,
        failure: rec.fields.failure.clone(),
        pull: None,
        held_until: None,
        pending: rec
            .amendment
            .as_ref()
            .filter(|a| a.acceptance.is_none())
            .and_then(|a| ext::decode_proposal(&a.proposal))
            .map(|(s, m)| (m, s)),
        gpus_declared: rec.gpus_declared,
        check: rec
            .proof
            .as_ref()
            .and_then(super::check_view::GpuCheckView::of),
        view: view_tx,
    }
}

/// A message for the session: the node's stop or extension, or the provider's request.
async fn on_message(s: &mut Session, w: &mut Liveness, msg: SessionMsg) -> Flow {
    let ctx = s.ctx.clone();
    match msg {
        SessionMsg::Stop(done) => {
            if s.lease.state.can_close() {
                if s.held_until.is_some() && !w.heard_any {
                    // Stopped while the provider holds the container for our uploads:
                    // the hold is paid (stored before the provider's close asks).
                    s.pay_abandoned_hold().await;
                }
                s.close(CloseReason::RenterStop, Actor::Renter).await;
                s.send_close(CloseReason::RenterStop);
                w.closing_since = Some(ctx.now());
            }
            let _ = done.send(());
        }
        SessionMsg::Extend(ask) => {
            let _ = ask.reply.send(s.extend(ask.add_s, ask.max_total).await);
        }
        // Only a provider reclaims its GPUs, or hands a workspace over.
        SessionMsg::Reclaim(done) => {
            let _ = done.send(());
        }
        SessionMsg::HandOver => {}
        SessionMsg::VerifyGpu(reply) => {
            let _ = reply.send(s.recheck().await);
            w.last_heard = ctx.now();
        }
        SessionMsg::Inbound(m) => return on_inbound(s, w, *m).await,
    }
    Flow::Continue
}

/// A request from the lease's provider (anyone else's is answered `UnknownLease`).
async fn on_inbound(s: &mut Session, w: &mut Liveness, m: InboundSession) -> Flow {
    let ctx = s.ctx.clone();
    let InboundSession {
        peer,
        request,
        reply,
    } = m;
    if Some(peer) != s.provider_peer {
        let _ = reply.send(SessionResponse::UnknownLease);
        return Flow::Continue;
    }
    match request {
        SessionRequest::Usage(signed) => {
            let (answer, end) = s.on_usage(signed, w.seen_at).await;
            let _ = reply.send(answer);
            w.last_heard = ctx.now();
            w.heard_any = true;
            if s.exit_code.is_some() && w.final_since.is_none() {
                w.final_since = Some(w.last_heard);
            }
            if let Some(reason) = end {
                s.send_close(reason);
                s.settle(reason).await;
                return Flow::End;
            }
        }
        SessionRequest::Close(signed) => {
            let net = ctx.client.network().clone();
            match signed.verify(&net) {
                Ok(v) if v.signer == s.provider && v.message.lease_id == s.lease.id => {
                    if v.message.reason == CloseReason::StartFailed {
                        s.failure = v.message.failure.clone();
                        // Stored before the answer that carries it.
                        s.pay_failed_start(v.message.failure.as_ref()).await;
                    }
                    let _ = reply.send(SessionResponse::Closed {
                        last_receipt: s.last_signed.clone(),
                    });
                    if v.message.exit_code.is_some() {
                        s.exit_code = v.message.exit_code;
                    }
                    s.close(v.message.reason, Actor::Provider).await;
                    s.settle(v.message.reason).await;
                    return Flow::End;
                }
                _ => {
                    let _ = reply.send(SessionResponse::UnknownLease);
                }
            }
        }
        SessionRequest::Logs { .. }
        | SessionRequest::Extend(_)
        | SessionRequest::Telemetry { .. }
        | SessionRequest::Reports { .. }
        | SessionRequest::Complete(_)
        | SessionRequest::ProofPing { .. }
        | SessionRequest::ProofChallenge(_)
        | SessionRequest::ProofOpen { .. }
        | SessionRequest::ProofReport(_)
        | SessionRequest::Begin { .. } => {
            let _ = reply.send(SessionResponse::UnknownLease);
        }
        SessionRequest::Verifying { until, .. } => {
            let _ = reply.send(SessionResponse::NothingDue);
            return s.verify(w, until).await;
        }
        SessionRequest::Held { until, .. } => {
            // Created and waiting for our uploads: the start allowance
            // counts from the end of the hold.
            let _ = reply.send(SessionResponse::NothingDue);
            if !w.heard_any {
                w.last_heard = ctx.now();
                w.hold_ms = until
                    .ms_since(w.last_heard)
                    .min(u64::from(s.lease.terms.upload_hold_s) * 1000);
                s.held_until = Some(until);
                s.publish();
            }
        }
        SessionRequest::Started { started_at, .. } => {
            let _ = reply.send(s.on_started(started_at).await);
            w.last_heard = ctx.now();
            w.heard_any = true;
        }
        SessionRequest::Starting { pulled, total, .. } => {
            // The start is progressing: the start allowance counts from now.
            let _ = reply.send(SessionResponse::NothingDue);
            if !w.heard_any {
                w.last_heard = ctx.now();
                s.pull = Some((pulled, total.max(pulled)));
                s.publish();
            }
        }
    }
    Flow::Continue
}

/// The session's tick: a close that the provider does not answer, a final report with no
/// close after it, and a provider silent too long (asked where the lease stands first).
async fn on_tick(s: &mut Session, w: &mut Liveness) -> Flow {
    let ctx = s.ctx.clone();
    let now = ctx.now();
    if let Some(since) = w.closing_since {
        // Waiting for the provider's close after ours: bounded.
        let wait = u64::try_from((ctx.config.rpc_timeout + ctx.config.stop_grace).as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(2 * w.interval_ms);
        if now.ms_since(since) > wait {
            let reason = s.lease.close_reason.unwrap_or(CloseReason::RenterStop);
            s.settle(reason).await;
            return Flow::End;
        }
        return Flow::Continue;
    }
    if let Some(since) = w.final_since {
        if now.ms_since(since) > FINAL_WAIT_MS {
            tracing::warn!("no close after the provider's final report; settling on it");
            s.settle(CloseReason::ContainerExited).await;
            return Flow::End;
        }
        return Flow::Continue;
    }
    let limit = if w.heard_any {
        2 * w.interval_ms + SILENCE_SLACK_MS
    } else {
        w.start_ms
            .saturating_add(2 * w.interval_ms)
            .saturating_add(w.hold_ms)
    };
    if now.ms_since(w.last_heard) > limit {
        // Silent since the last report (or the start notice): perhaps this node was
        // away (suspended, offline). Ask the provider where the lease stands
        // before giving up.
        tracing::info!(
            silent_ms = now.ms_since(w.last_heard),
            "provider silent; reconciling"
        );
        match s.reconcile(w.seen_at).await {
            Reconciled::Settled => return Flow::End,
            Reconciled::Live => {
                w.last_heard = ctx.now();
                return Flow::Continue;
            }
            Reconciled::Unreachable => {}
        }
    }
    if now.ms_since(w.last_heard) > limit {
        tracing::warn!(
            silent_ms = now.ms_since(w.last_heard),
            "provider silent; closing"
        );
        s.send_close(CloseReason::ProviderUnreachable);
        s.settle(CloseReason::ProviderUnreachable).await;
        return Flow::End;
    }
    Flow::Continue
}

/// Answers a provider's close for a lease whose renter session has ended: its last receipt
/// from the store, if the close is signed by the lease's provider and sent by it.
pub(crate) async fn answer_late_close(
    ctx: &Ctx,
    peer: PeerId,
    request: &SessionRequest,
) -> SessionResponse {
    let SessionRequest::Close(signed) = request else {
        return SessionResponse::UnknownLease;
    };
    let Ok(v) = signed.verify(ctx.client.network()) else {
        return SessionResponse::UnknownLease;
    };
    let id = v.message.lease_id;
    let Ok(Some(l)) = ctx.store.call(move |s| s.lease(&id)).await else {
        return SessionResponse::UnknownLease;
    };
    let provider = l.lease.terms.provider;
    if l.role != Role::Renter || v.signer != provider || provider.peer_id().ok() != Some(peer) {
        return SessionResponse::UnknownLease;
    }
    let Ok(rec) = ctx.store.call(move |s| s.session_record(&id)).await else {
        return SessionResponse::Busy;
    };
    let last_receipt = rec
        .last_receipt
        .as_ref()
        .and_then(|(_, b)| view::decode_receipt(b))
        .map(|(s, _)| s);
    SessionResponse::Closed { last_receipt }
}
