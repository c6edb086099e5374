//! The running provider lease: metering, usage reports and receipts, the deadline, the
//! renter's messages, the stop and the final report.

use std::sync::Arc;
use std::time::Duration;

use gridlease_contracts::{Decision, StopSchedule};
use gridlease_protocol::{CloseReason, Timestamp};
use gridlease_sandbox::meter::{Cut, Meter, MeterControl, Usage, meter_run};
use tokio::sync::mpsc;

use super::{Ended, Session, serve_reports};
use crate::lease::config::MAX_LOG_BYTES;
use crate::lease::logs::{self, LogWriter};
use crate::lease::session::{SessionMsg, session_rpc};
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

/// Meters the running container and exchanges reports and receipts until the run ends.
/// Metering is `sandbox::meter::meter_run` in its own task; each report closes an interval
/// through its control channel.
pub(super) async fn meter_loop(s: &mut Session, inbox: &mut mpsc::Receiver<SessionMsg>) -> Ended {
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
pub(super) fn on_msg(s: &mut Session, msg: SessionMsg) -> Option<CloseReason> {
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
                .send(Err(crate::lease::extend::ExtendError::NotRenter(
                    s.lease.id,
                )));
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
