//! The provider's verification window (proof of GPU, issue 44): after the container is
//! created and before its command starts, unbilled, the renter's GPU check runs here. The
//! provider answers the challenge with its prover (`gridlease_sandbox::proof`), on the leased
//! devices, commits before it learns what is opened, opens what the reveal picks, and
//! co-signs a passed report; then the start goes on (the upload hold, the command: billing).
//! A failed check ends with the renter's close (`GpuCheckFailed`: nothing billed, the
//! provider's fault); a window that runs out without a report ends the lease unbilled as the
//! renter's (`RenterUnreachable`).

use std::time::Duration;

use gridlease_contracts::proof::{self, params};
use gridlease_protocol::proof::{
    ProofAck, ProofChallenge, ProofCommit, ProofOpening, ProofRecord, ProofReport, envelope_hash,
};
use gridlease_protocol::{CloseReason, Signed};
use gridlease_sandbox::proof::Computed;
use tokio::sync::mpsc;

use super::on_msg;
use super::{Halt, Session};
use crate::lease::rpc::session_rpc;
use crate::lease::session::{InboundSession, SessionMsg, sign};
use crate::lease::wire::{SessionRequest, SessionResponse};

/// Most seconds of work a re-check of a running lease may ask (`gridlease verify-gpu`: the
/// lease is billed meanwhile, so this bounds only the time the session spends on it).
pub(super) const RECHECK_WINDOW_S: u32 = 60;

/// What a check holds as it goes on (in the window, or a re-check of a running lease).
#[derive(Default)]
pub(super) struct Check {
    challenge: Option<(Signed<ProofChallenge>, ProofChallenge)>,
    computed: Option<Computed>,
    commit: Option<Signed<ProofCommit>>,
    opening: Option<Signed<ProofOpening>>,
    /// The renter reported on it: a new challenge starts a new check (a re-check).
    reported: bool,
}

/// Runs the verification window when the terms have one; returns when a check passed (the
/// start goes on), or halts the start.
pub(super) async fn window(
    s: &mut Session,
    inbox: &mut mpsc::Receiver<SessionMsg>,
) -> Result<(), Halt> {
    let window_s = s.lease.terms.verify_window_s;
    if window_s == 0 {
        return Ok(());
    }
    let ctx = s.ctx.clone();
    let until = ctx.now().plus_secs(u64::from(window_s));
    tracing::info!(
        window_s,
        "verification window open for the renter's GPU check"
    );
    if let Some(peer) = s.renter_peer {
        let (ctx, lease_id) = (ctx.clone(), s.lease.id);
        tokio::spawn(async move {
            let req = SessionRequest::Verifying { lease_id, until };
            if let Err(e) = session_rpc(&ctx, peer, req).await {
                tracing::warn!(error = %e, "cannot tell the renter the verification window is open");
            }
        });
    }
    let mut check = Check::default();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => return Err(Halt::Shutdown),
            msg = inbox.recv() => match msg {
                None => return Err(Halt::Shutdown),
                Some(SessionMsg::Inbound(m)) if is_proof(&m.request) => {
                    if Some(m.peer) != s.renter_peer {
                        let _ = m.reply.send(SessionResponse::UnknownLease);
                        continue;
                    }
                    if on_proof(s, &mut check, *m, s.lease.terms.verify_window_s).await {
                        tracing::info!("the renter's GPU check passed; starting");
                        return Ok(());
                    }
                }
                Some(msg) => {
                    if let Some(reason) = on_msg(s, msg) {
                        return Err(Halt::Stopped(reason));
                    }
                }
            },
            _ = tick.tick() => {
                if ctx.now() >= until {
                    // The renter closes a check that failed itself; one that never finished
                    // is the renter's to answer for.
                    tracing::warn!(window_s, "the verification window ran out without a passed check");
                    return Err(Halt::Stopped(CloseReason::RenterUnreachable));
                }
            }
        }
    }
}

pub(super) fn is_proof(r: &SessionRequest) -> bool {
    matches!(
        r,
        SessionRequest::ProofPing { .. }
            | SessionRequest::ProofChallenge(_)
            | SessionRequest::ProofOpen { .. }
            | SessionRequest::ProofReport(_)
            | SessionRequest::Begin { .. }
    )
}

fn refuse(detail: impl std::fmt::Display) -> SessionResponse {
    SessionResponse::Refused {
        reason: CloseReason::GpuCheckFailed,
        detail: gridlease_protocol::session::detail(detail),
    }
}

/// One step of a check whose work may take up to half of `window_s`; true when a passed
/// report was co-signed.
pub(super) async fn on_proof(
    s: &mut Session,
    check: &mut Check,
    m: InboundSession,
    window_s: u32,
) -> bool {
    let answer = match m.request {
        SessionRequest::ProofPing { .. } | SessionRequest::Begin { .. } => {
            SessionResponse::NothingDue
        }
        SessionRequest::ProofChallenge(signed) => {
            if check.reported {
                *check = Check::default();
            }
            challenge(s, check, signed, window_s).await
        }
        SessionRequest::ProofOpen { reveal, .. } => open(s, check, &reveal),
        SessionRequest::ProofReport(signed) => {
            let (answer, passed) = report(s, check, signed).await;
            let _ = m.reply.send(answer);
            return passed;
        }
        _ => SessionResponse::UnknownLease,
    };
    let _ = m.reply.send(answer);
    false
}

/// The challenge: checked against the offer's bounds, computed on the leased devices,
/// committed to.
async fn challenge(
    s: &mut Session,
    check: &mut Check,
    signed: Signed<ProofChallenge>,
    window_s: u32,
) -> SessionResponse {
    let ctx = s.ctx.clone();
    let net = ctx.client.network().clone();
    let c = match signed.verify(&net) {
        Ok(v) if v.signer == s.renter && v.message.lease_id == s.lease.id => v.message,
        _ => return SessionResponse::UnknownLease,
    };
    if let (Some((answered, _)), Some(commit)) = (&check.challenge, &check.commit) {
        // The same challenge again (its answer was lost on the way): the same commitment;
        // the renter times from its first send, so this gains a provider no time.
        if envelope_hash(answered) == envelope_hash(&signed) {
            return SessionResponse::ProofCommit(commit.clone());
        }
        return refuse("a challenge was answered already in this window");
    }
    let Some(prover) = ctx.config.prover.clone() else {
        return refuse("this provider has no prover");
    };
    if c.backend != prover.prover.backend() {
        return refuse(format!(
            "this provider's prover is {}, not {}",
            prover.prover.backend(),
            c.backend
        ));
    }
    let leased = s.gpus.len();
    let own_rate = prover.macs_per_gpu * leased.max(1) as f64;
    let vram = prover.vram_for(&s.gpus);
    if let Err(e) = params::admit(&c.params, own_rate, window_s, vram) {
        tracing::warn!(error = %e, "GPU check refused");
        return refuse(e);
    }
    let devices = super::leased_uuids(&ctx, &s.gpus);
    let work = {
        let (p, c) = (prover.clone(), c.clone());
        tokio::task::spawn_blocking(move || p.compute(&c, &devices))
    };
    let computed = match work.await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the prover failed");
            return refuse(format!("the prover failed: {e}"));
        }
        Err(e) => return refuse(format!("the prover stopped: {e}")),
    };
    let commit = ProofCommit {
        lease_id: c.lease_id,
        challenge: envelope_hash(&signed),
        backend: prover.prover.backend(),
        gemm_roots: computed.gemm_trees.iter().map(|t| t.root()).collect(),
        vram_root: computed.vram_tree.root(),
        vram_bytes: computed.vram_bytes,
        work_ms: computed.work_ms,
        note: gridlease_protocol::text::truncated(
            &computed.note,
            gridlease_protocol::proof::MAX_PROOF_TEXT,
        ),
    };
    #[cfg_attr(not(feature = "faults"), allow(unused_mut))]
    let Some(mut sc) = sign(&ctx, &commit) else {
        return SessionResponse::Busy;
    };
    #[cfg(feature = "faults")]
    {
        let expected_ms = (params::work_macs(&c.params) as f64 / own_rate * 1000.0) as u64;
        sc = crate::lease::faults::proof_commit(
            ctx.config.faults.proof,
            sc,
            computed.work_ms,
            expected_ms,
        )
        .await;
    }
    tracing::info!(work_ms = computed.work_ms, "GPU check committed");
    check.challenge = Some((signed, c));
    check.computed = Some(computed);
    check.commit = Some(sc.clone());
    SessionResponse::ProofCommit(sc)
}

/// The reveal: the leaves it picks, with their paths.
fn open(s: &Session, check: &mut Check, reveal: &[u8; 32]) -> SessionResponse {
    let (Some((_, c)), Some(computed), Some(sc)) =
        (&check.challenge, &check.computed, &check.commit)
    else {
        return refuse("no commitment to open");
    };
    if proof::reveal_hash(reveal) != c.reveal_hash {
        return refuse("the reveal is not the one the challenge committed to");
    }
    let commit_hash = envelope_hash(sc);
    let leaves = proof::openings(c, &commit_hash, reveal)
        .into_iter()
        .filter_map(|i| proof::open_leaf(&computed.gemm_trees, &computed.vram_tree, i))
        .collect();
    let opening = ProofOpening {
        lease_id: s.lease.id,
        commit: commit_hash,
        leaves,
    };
    let Some(so) = sign(&s.ctx, &opening) else {
        return SessionResponse::Busy;
    };
    check.opening = Some(so.clone());
    SessionResponse::ProofOpening(so)
}

/// The renter's report: re-checked here with the renter's timing (the one part that is its
/// word); kept either way; a pass the rules confirm is co-signed and the start goes on.
async fn report(
    s: &mut Session,
    check: &mut Check,
    signed: Signed<ProofReport>,
) -> (SessionResponse, bool) {
    let ctx = s.ctx.clone();
    let net = ctx.client.network().clone();
    let r = match signed.verify(&net) {
        Ok(v) if v.signer == s.renter && v.message.lease_id == s.lease.id => v.message,
        _ => return (SessionResponse::UnknownLease, false),
    };
    // The same report again (the co-signature was lost on the way, and the command may run
    // by now): the kept co-signature.
    let (id, again) = (s.lease.id, envelope_hash(&signed));
    if let Ok(Some(kept)) = ctx.store.call(move |st| st.proof(&id)).await
        && envelope_hash(&kept.report) == again
        && let Some(ack) = kept.ack
    {
        return (SessionResponse::ProofAck(ack), false);
    }
    let Some((sc, _)) = &check.challenge else {
        return (refuse("no challenge was answered"), false);
    };
    check.reported = true;
    let mut record = ProofRecord {
        challenge: sc.clone(),
        commit: check.commit.clone(),
        opening: check.opening.clone(),
        report: signed,
        ack: None,
    };
    let verdict = proof::recheck(&record, &net, &s.renter, &ctx.client.key().public());
    let passed = matches!(verdict, Ok(ref v) if v.passed());
    if passed {
        let ack = ProofAck {
            lease_id: s.lease.id,
            report: envelope_hash(&record.report),
        };
        let Some(sa) = sign(&ctx, &ack) else {
            return (SessionResponse::Busy, false);
        };
        record.ack = Some(sa);
    } else {
        tracing::warn!(verdict = ?r.verdict, check = ?verdict, "the renter's GPU check did not pass");
    }
    let (id, provider, at) = (s.lease.id, ctx.client.key().public(), ctx.now());
    let kept = record.clone();
    if let Err(e) = ctx
        .store
        .call(move |st| st.put_proof(&id, &provider, &kept, at))
        .await
    {
        tracing::error!(error = %e, "cannot store the GPU check");
        return (SessionResponse::Busy, false);
    }
    match record.ack {
        Some(a) if passed => (SessionResponse::ProofAck(a), true),
        _ => (SessionResponse::NothingDue, false),
    }
}
