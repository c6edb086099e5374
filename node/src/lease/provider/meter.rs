//! The running provider lease: metering, usage reports and receipts, the deadline, the
//! renter's messages, the stop and the final report.

use std::sync::Arc;
use std::time::Duration;

use gridlease_contracts::{Decision, StopSchedule};
use gridlease_protocol::{CloseReason, Timestamp};
use gridlease_sandbox::Sandbox;
use gridlease_sandbox::meter::{Cut, Meter, MeterControl, Usage, meter_run};
use gridlease_sandbox::runtime::{ExitInfo, SandboxError, TermClaim};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::{Ended, Session};
use crate::lease::config::MAX_LOG_BYTES;
use crate::lease::error::SessionRpcError;
use crate::lease::logs::{self, LogWriter};
use crate::lease::rpc::session_rpc;
use crate::lease::session::SessionMsg;
use crate::lease::watchdog::{self, Ensured};
use crate::lease::wire::{SessionRequest, SessionResponse};

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

/// What the metering task returns: the meter, and how the run ended (exit, totals, samples).
type Metered = (Meter, Result<(ExitInfo, Usage, usize), SandboxError>);

/// Meters the running container and exchanges reports and receipts until the run ends.
/// Metering is `sandbox::meter::meter_run` in its own task; each report closes an interval
/// through its control channel.
pub(super) async fn meter_loop(s: &mut Session, inbox: &mut mpsc::Receiver<SessionMsg>) -> Ended {
    let Some((mut run, log_writer)) = Run::start(s) else {
        return Ended::Stop(CloseReason::StartFailed);
    };
    let Some(ended) = run.exchange(s, inbox).await else {
        // Node shutting down: leave the container running; the restart resumes it.
        return Ended::Stop(CloseReason::ProviderStop);
    };
    let ended = run.stop(s, ended).await;
    let totals = run.totals(s).await;
    run.final_report(s, ended, &totals).await;
    // Before the lease closes: a follower gets `eof` only once the file is complete.
    log_writer.finish().await;
    ended
}

/// One run of the container: what the report exchange, the stop and the final report share.
struct Run {
    sb: Sandbox,
    cid: String,
    /// The deadline moves later when the renter's extension is accepted (`on_extend`).
    deadline: Timestamp,
    grace_ms: u64,
    at_deadline: StopSchedule,
    claim: TermClaim,
    /// The metering task.
    metering: JoinSet<Metered>,
    /// Closes the meter's intervals.
    cut_tx: mpsc::Sender<Cut>,
    /// At most one report in flight: a slow renter delays the next report, never the loop.
    inflight: JoinSet<Result<SessionResponse, SessionRpcError>>,
    /// Where the next report's interval starts.
    iv_start: Timestamp,
    /// The metering task's end, once the loop saw it.
    finished: Option<Result<Metered, tokio::task::JoinError>>,
    /// A re-check of the running lease's GPUs (`gridlease verify-gpu`), as far as it went.
    recheck: super::verify::Check,
}

impl Run {
    /// Starts metering the running container (and its deadline watchdog) and tells the renter
    /// that the command runs; `None` without a container or a start time. Also returns the
    /// writer of the container's output (re-attached after a restart).
    fn start(s: &mut Session) -> Option<(Self, LogWriter)> {
        let ctx = s.ctx.clone();
        let (Some(sb), Some(cid)) = (ctx.sandbox.clone(), s.container.clone()) else {
            return None;
        };
        let started = s.lease.started_at?;
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
        let deadline = started.plus_secs(u64::from(terms.duration_s));
        let grace_ms = u64::try_from(ctx.config.stop_grace.as_millis()).unwrap_or(u64::MAX);
        let at_deadline = StopSchedule::at_deadline(deadline, grace_ms);
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
                ring.push(crate::lease::telemetry::sample(&l, &ids, gpus));
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
        let mut metering = JoinSet::new();
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
        let mut inflight = JoinSet::new();
        // The renter learns at once that the command runs (and pays ahead a prepaid lease then).
        super::tell_started(s, started, &mut inflight);
        let run = Self {
            sb,
            cid,
            deadline,
            grace_ms,
            at_deadline,
            claim,
            metering,
            cut_tx,
            inflight,
            iv_start: ctx.now().max(started),
            finished: None,
            recheck: super::verify::Check::default(),
        };
        Some((run, log_writer))
    }

    /// Closes the meter's interval at `at`: the interval's usage and the totals (`None` once
    /// the meter has ended).
    async fn cut(&self, at: Timestamp) -> Option<(Usage, Usage)> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.cut_tx.send(Cut { at, reply }).await.ok()?;
        rx.await.ok()
    }

    /// Reports and receipts, the renter's messages and the deadline, until the run ends;
    /// `None` when the node shuts down (the container keeps running for the restart).
    async fn exchange(
        &mut self,
        s: &mut Session,
        inbox: &mut mpsc::Receiver<SessionMsg>,
    ) -> Option<Ended> {
        let ctx = s.ctx.clone();
        let grace_ms = self.grace_ms;
        let period = Duration::from_secs(u64::from(s.lease.terms.usage_interval_s.max(1)));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Expiry: the time to send SIGTERM (the tick re-checks by the clock).
        let until_term = Duration::from_millis(self.at_deadline.term_at.ms_since(ctx.now()));
        let expiry = tokio::time::sleep(until_term);
        tokio::pin!(expiry);
        let ended = loop {
            tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => return None,
                done = self.metering.join_next(), if self.finished.is_none() => {
                    self.finished = done;
                    break Ended::Exited;
                }
                () = &mut expiry => break Ended::Stop(CloseReason::Expired),
                Some(msg) = inbox.recv() => match msg {
                    SessionMsg::Inbound(m) if matches!(m.request, SessionRequest::Extend(_)) => {
                        if s.on_extend(*m, grace_ms).await
                            && let Some(d) = s.lease.deadline()
                        {
                            self.deadline = d;
                            self.at_deadline = StopSchedule::at_deadline(d, grace_ms);
                            let until =
                                Duration::from_millis(self.at_deadline.term_at.ms_since(ctx.now()));
                            expiry.as_mut().reset(tokio::time::Instant::now() + until);
                        }
                    }
                    // A re-check of the running lease (`gridlease verify-gpu`), billed as
                    // usage: the renter's only.
                    SessionMsg::Inbound(m)
                        if super::verify::is_proof(&m.request) && Some(m.peer) == s.renter_peer =>
                    {
                        let window_s = super::verify::RECHECK_WINDOW_S;
                        super::verify::on_proof(s, &mut self.recheck, *m, window_s).await;
                    }
                    msg => {
                        if let Some(reason) = super::on_msg(s, msg) {
                            break Ended::Stop(reason);
                        }
                    }
                },
                Some(answer) = self.inflight.join_next(), if !self.inflight.is_empty() => {
                    let answer = answer.unwrap_or_else(|e| Err(e.into()));
                    if let Some(reason) = s.on_answer(answer).await {
                        break Ended::Stop(reason);
                    }
                }
                _ = tick.tick() => {
                    if let Some(ended) = self.on_tick(s).await {
                        break ended;
                    }
                }
            }
        };
        Some(ended)
    }

    /// A report period passed: the deadline checked, the interval closed and reported (unless
    /// a report is in flight), the channel asked whether to go on. Returns why the run ends.
    async fn on_tick(&mut self, s: &mut Session) -> Option<Ended> {
        let ctx = s.ctx.clone();
        let now = ctx.now();
        if StopSchedule::expired(self.deadline, self.grace_ms, now) {
            return Some(Ended::Stop(CloseReason::Expired));
        }
        // None: the meter ended (container exited): the next turn collects it.
        let (interval, totals) = self.cut(crate::clock::now()).await?;
        if self.inflight.is_empty() {
            if let Some(signed) = s
                .report(self.iv_start, now, &totals, &interval, None, false)
                .await
                && let Some(peer) = s.renter_peer
            {
                let ctx2 = ctx.clone();
                self.inflight.spawn(async move {
                    session_rpc(&ctx2, peer, SessionRequest::Usage(signed)).await
                });
            }
            self.iv_start = now;
        }
        match s.channel.decide(totals.wall_ms, now) {
            Ok(Decision::Continue) => None,
            Ok(Decision::Stop(reason)) => {
                tracing::warn!(?reason, wall_ms = totals.wall_ms, paid = %s.channel.paid(), "payment channel says stop");
                Some(Ended::Stop(reason))
            }
            Err(e) => {
                tracing::error!(error = %e, "billing overflow");
                None
            }
        }
    }

    /// Stops the container on its schedule while an in-flight report finishes; returns how
    /// the run ended (an exit after the watchdog's SIGTERM past the deadline: expired).
    async fn stop(&mut self, s: &mut Session, ended: Ended) -> Ended {
        let ctx = s.ctx.clone();
        // Stop the container on schedule (expired: SIGTERM now, at deadline - grace, and SIGKILL at
        // the deadline; stopped earlier: SIGTERM now, SIGKILL after the grace but never past the
        // deadline) while an in-flight report finishes, so the final report's sequence follows it
        // and waiting for the renter never delays a signal.
        let schedule = match ended {
            Ended::Stop(CloseReason::Expired) => Some(self.at_deadline),
            Ended::Stop(_) => Some(StopSchedule::early(ctx.now(), self.deadline, self.grace_ms)),
            Ended::Exited => None,
        };
        let clock = ctx.config.clock.clone();
        let now = move || clock.now();
        let stopping = async {
            if let Some(schedule) = schedule
                && let Err(e) = self
                    .sb
                    .enforce_stop(&self.cid, schedule, &now, Some(&self.claim))
                    .await
            {
                tracing::warn!(error = %e, "stopping the container failed");
            }
        };
        let answered = tokio::time::timeout(ctx.config.rpc_timeout, self.inflight.join_next());
        let ((), answer) = tokio::join!(stopping, answered);
        if let Ok(Some(Ok(answer))) = answer {
            let _ = s.on_answer(answer).await;
        }
        // Stopped by the watchdog's SIGTERM (a node that came back after the deadline, or the
        // watchdog first at deadline - grace): the lease expired.
        match ended {
            Ended::Exited
                if self.claim.taken()
                    && StopSchedule::expired(self.deadline, self.grace_ms, ctx.now()) =>
            {
                Ended::Stop(CloseReason::Expired)
            }
            e => e,
        }
    }

    /// The run's totals from the meter, which ends with the container (its totals use the
    /// daemon's run time); the last report's if it does not finish. Sets the exit code.
    async fn totals(&mut self, s: &mut Session) -> Usage {
        let ctx = s.ctx.clone();
        // The meter ends with the container; its totals use the daemon's run time.
        let finished = match self.finished.take() {
            Some(f) => Some(f),
            None => tokio::time::timeout(ctx.config.rpc_timeout, self.metering.join_next())
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
                let exit = self.sb.exit_info(&self.cid).await.ok();
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
        totals
    }

    /// The final report (minimum billing applies, unless the owner took the GPUs back), sent
    /// unless the renter is known to be gone, and the renter's answer booked.
    async fn final_report(&self, s: &mut Session, ended: Ended, totals: &Usage) {
        let ctx = s.ctx.clone();
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
                self.iv_start,
                now,
                totals,
                totals,
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
    }
}
