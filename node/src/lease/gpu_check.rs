//! The renter's GPU check (proof of GPU, issue 44): run at the start of its own lease, in the
//! provider's unbilled verification window, before the command starts. Measures the round
//! trip, sends a fresh seed, times the commitment, reveals what to open, checks the openings
//! against its own CPU recomputation (`gridlease_contracts::proof`), signs its report, and
//! keeps the whole record (the lease's statement carries it). A pass is co-signed by the
//! provider and the command starts; a failure closes the lease with nothing billed.

use std::time::{Duration, Instant};

use gridlease_contracts::proof::{self, params};
use gridlease_protocol::proof::{
    ProofBackend, ProofChallenge, ProofFailure, ProofRecord, ProofReport, ProofTiming,
    ProofVerdict, envelope_hash,
};
use gridlease_protocol::{LeaseTerms, NetworkId, Offer, PeerId, PublicKey, Signed, WireMessage};
use serde::{Deserialize, Serialize};

use super::ctx::Ctx;
use super::rpc::session_rpc_within;
use super::session::sign;
use super::wire::{SessionRequest, SessionResponse};

/// Round trips measured before the challenge; the least counts.
const PINGS: usize = 3;

/// A lease's GPU check as the control API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GpuCheckView {
    /// `verifying`, `passed` or `failed`.
    pub state: String,
    /// What answered: `cuda`, or `cpu-reference: not a GPU`.
    pub backend: String,
    /// One sentence: what passed, or which part failed and by how much.
    pub summary: String,
    /// Seed-to-commitment time less the round trip, milliseconds (once measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took_ms: Option<u64>,
    /// The limit for the advertised GPUs, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_ms: Option<u64>,
    /// The renter's CPU time checking the openings, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_cpu_ms: Option<u64>,
    /// The provider co-signed the pass.
    #[serde(default)]
    pub cosigned: bool,
}

impl GpuCheckView {
    /// While the check runs.
    pub fn verifying() -> Self {
        Self {
            state: "verifying".into(),
            backend: String::new(),
            summary: "checking the leased GPUs".into(),
            took_ms: None,
            limit_ms: None,
            check_cpu_ms: None,
            cosigned: false,
        }
    }

    /// The view of a kept record (its messages were verified before it was kept).
    pub fn of(r: &ProofRecord) -> Option<Self> {
        let c = ProofChallenge::decode_payload(&r.challenge.envelope().payload).ok()?;
        let rep = ProofReport::decode_payload(&r.report.envelope().payload).ok()?;
        let took = rep.timing.commit_ms.saturating_sub(rep.timing.rtt_ms);
        Some(Self {
            state: if rep.verdict.passed() {
                "passed"
            } else {
                "failed"
            }
            .into(),
            backend: c.backend.label().into(),
            summary: proof::explain(&rep.verdict, c.backend),
            took_ms: (rep.commit.is_some()).then_some(took),
            limit_ms: Some(c.params.limit_ms),
            check_cpu_ms: Some(rep.timing.check_cpu_ms),
            cosigned: r.ack.is_some(),
        })
    }
}

/// What a check ended with.
pub(crate) struct Outcome {
    /// Passed and co-signed: the command starts.
    pub passed: bool,
    /// The view.
    pub view: GpuCheckView,
}

/// What the renter knows of the offer for the check.
struct Advertised {
    backend: ProofBackend,
    models: Vec<String>,
    vram_bytes: u64,
    claimed_mmacs: u64,
}

fn advertised(offer: &Offer, terms: &LeaseTerms) -> Option<Advertised> {
    let backend = offer.proof.backend?;
    let n = usize::from(terms.gpu_count).min(offer.gpus.len());
    let leased = &offer.gpus[..n];
    Some(Advertised {
        backend,
        models: leased.iter().map(|g| g.spec.model.clone()).collect(),
        vram_bytes: leased
            .iter()
            .map(|g| u64::from(g.spec.vram_mib) << 20)
            .sum(),
        claimed_mmacs: offer.proof.claimed_mmacs,
    })
}

/// Runs the check of lease `terms` against `peer` (its provider) before `deadline` (the
/// provider's window, by this node's clock), keeps its record, and returns it.
pub(crate) async fn run(
    ctx: &Ctx,
    peer: PeerId,
    terms: &LeaseTerms,
    window: Duration,
) -> Option<Outcome> {
    let id = terms.lease_id().ok()?;
    let offer = ctx
        .store
        .call(move |st| st.session_record(&id))
        .await
        .ok()
        .and_then(|r| r.offer)
        .and_then(|b| Signed::<Offer>::from_bytes(&b).ok())
        .and_then(|s| Offer::decode_payload(&s.envelope().payload).ok());
    let Some(ad) = offer.as_ref().and_then(|o| advertised(o, terms)) else {
        tracing::warn!("no GPU check: the offer of this lease is not kept here or has no backend");
        return None;
    };
    let started = Instant::now();
    let (rate, _source) = params::expected_macs(
        ad.backend,
        &ad.models.iter().map(String::as_str).collect::<Vec<_>>(),
        ad.claimed_mmacs,
    );
    let p = params::choose(ad.backend, rate, ad.vram_bytes);
    let mut seed = [0u8; 32];
    let mut reveal = [0u8; 32];
    if getrandom::fill(&mut seed).is_err() || getrandom::fill(&mut reveal).is_err() {
        tracing::error!("no randomness for the GPU check");
        return None;
    }
    let challenge = ProofChallenge {
        lease_id: id,
        params: p,
        backend: ad.backend,
        seed,
        reveal_hash: proof::reveal_hash(&reveal),
        sent_at: ctx.now(),
    };
    let sc = sign(ctx, &challenge)?;
    let left = |spent: Duration| window.saturating_sub(spent).max(Duration::from_secs(1));
    let mut timing = ProofTiming::default();
    // 1. The round trip (the least of a few).
    let mut rtt = None::<Duration>;
    for _ in 0..PINGS {
        let t = Instant::now();
        let ping = SessionRequest::ProofPing { lease_id: id };
        if session_rpc_within(ctx, peer, ping, left(started.elapsed()))
            .await
            .is_ok()
        {
            rtt = Some(rtt.map_or(t.elapsed(), |r| r.min(t.elapsed())));
        }
    }
    timing.rtt_ms = ms(rtt.unwrap_or_default());
    // 2. The challenge, timed.
    let t = Instant::now();
    let answer = session_rpc_within(
        ctx,
        peer,
        SessionRequest::ProofChallenge(sc.clone()),
        left(started.elapsed()),
    )
    .await;
    timing.commit_ms = ms(t.elapsed());
    let net = ctx.client.network().clone();
    let commit = match answer {
        Ok(SessionResponse::ProofCommit(s)) => provider_signed(&s, &net, &terms.provider),
        Ok(other) => {
            tracing::warn!(answer = ?brief(&other), "the provider did not commit");
            None
        }
        Err(e) => {
            tracing::warn!(error = %e, "the provider did not commit");
            None
        }
    };
    // 3. The reveal and the openings.
    let mut opening = None;
    if commit.is_some() {
        let t = Instant::now();
        let open = SessionRequest::ProofOpen {
            lease_id: id,
            reveal,
        };
        match session_rpc_within(ctx, peer, open, left(started.elapsed())).await {
            Ok(SessionResponse::ProofOpening(s)) => {
                opening = provider_signed(&s, &net, &terms.provider);
            }
            Ok(other) => tracing::warn!(answer = ?brief(&other), "the provider did not open"),
            Err(e) => tracing::warn!(error = %e, "the provider did not open"),
        }
        timing.open_ms = ms(t.elapsed());
    }
    // 4. The check (CPU work, off the runtime's threads).
    let (verdict, cpu_ms) = {
        let (c, commit, opening, reveal) =
            (challenge.clone(), commit.clone(), opening.clone(), reveal);
        let challenge_hash = envelope_hash(&sc);
        tokio::task::spawn_blocking(move || {
            let cpu = cpu_time::ThreadTime::now();
            let t = proof::Transcript {
                challenge: &c,
                challenge_hash,
                commit: commit.as_ref().map(|(s, m)| (m, envelope_hash(s))),
                reveal: &reveal,
                opening: opening.as_ref().map(|(s, m)| (m, envelope_hash(s))),
                timing,
            };
            (proof::check(&t), ms(cpu.elapsed()))
        })
        .await
        .unwrap_or_else(|e| {
            (
                ProofVerdict::Failed(ProofFailure::BadOpening {
                    detail: format!("the check could not run: {e}"),
                }),
                0,
            )
        })
    };
    timing.check_cpu_ms = cpu_ms;
    // 5. The report, co-signed by the provider when it passed.
    let report = ProofReport {
        lease_id: id,
        challenge: envelope_hash(&sc),
        commit: commit.as_ref().map(|(s, _)| envelope_hash(s)),
        reveal,
        opening: opening.as_ref().map(|(s, _)| envelope_hash(s)),
        timing,
        verdict: verdict.clone(),
        decided_at: ctx.now(),
    };
    let sr = sign(ctx, &report)?;
    let mut record = ProofRecord {
        challenge: sc,
        commit: commit.map(|(s, _)| s),
        opening: opening.map(|(s, _)| s),
        report: sr.clone(),
        ack: None,
    };
    let answer = session_rpc_within(
        ctx,
        peer,
        SessionRequest::ProofReport(sr.clone()),
        left(started.elapsed()),
    )
    .await;
    if let (true, Ok(SessionResponse::ProofAck(a))) = (verdict.passed(), answer) {
        let ok = a.verify(&net).is_ok_and(|v| {
            v.signer == terms.provider
                && v.message.lease_id == id
                && v.message.report == envelope_hash(&sr)
        });
        if ok {
            record.ack = Some(a);
        }
    }
    let passed = verdict.passed() && record.ack.is_some();
    let (provider, at, kept) = (terms.provider, ctx.now(), record.clone());
    if let Err(e) = ctx
        .store
        .call(move |st| st.put_proof(&id, &provider, &kept, at))
        .await
    {
        tracing::error!(error = %e, "cannot keep the GPU check");
    }
    let mut view = GpuCheckView::of(&record).unwrap_or_else(GpuCheckView::verifying);
    if verdict.passed() && !passed {
        view.state = "failed".into();
        view.summary = "GPU check passed, but the provider did not co-sign it".into();
    }
    tracing::info!(state = %view.state, summary = %view.summary, "GPU check done");
    Some(Outcome { passed, view })
}

/// A signed message from the lease's provider, verified, with its payload.
fn provider_signed<T: WireMessage + Clone>(
    s: &Signed<T>,
    net: &NetworkId,
    provider: &PublicKey,
) -> Option<(Signed<T>, T)> {
    let v = s.verify(net).ok()?;
    (v.signer == *provider).then(|| (s.clone(), v.message))
}

fn brief(r: &SessionResponse) -> String {
    match r {
        SessionResponse::Refused { detail, .. } => format!("refused: {detail}"),
        other => format!("{other:?}").chars().take(80).collect(),
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
