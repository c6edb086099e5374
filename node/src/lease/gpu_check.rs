//! The renter's GPU check (proof of GPU, issue 44): run at the start of its own lease, in the
//! provider's unbilled verification window, before the command starts. Measures the round
//! trip, sends a fresh seed, times the commitment, reveals what to open, checks the openings
//! against its own CPU recomputation (`gridlease_contracts::proof`), signs its report, and
//! keeps the whole record (the lease's statement carries it). A pass is co-signed by the
//! provider and the command starts; a failure closes the lease with nothing billed.

use std::time::{Duration, Instant};

use gridlease_contracts::proof::{self, params};
use gridlease_protocol::proof::{
    ProofBackend, ProofChallenge, ProofCommit, ProofFailure, ProofOpening, ProofRecord,
    ProofReport, ProofTiming, ProofVerdict, envelope_hash,
};
use gridlease_protocol::{
    LeaseId, LeaseTerms, NetworkId, Offer, PeerId, PublicKey, Signed, WireMessage,
};

pub use super::check_view::GpuCheckView;
use super::ctx::Ctx;
use super::rpc::session_rpc_within;
use super::session::sign;
use super::wire::{SessionRequest, SessionResponse};

/// Round trips measured before the challenge; the least counts.
const PINGS: usize = 3;
/// Most sends of one step of the check (a lossy link loses a request or its answer).
const ATTEMPTS: u32 = 3;

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

/// Runs the check of lease `terms` against `peer` (its provider) within `window` (the
/// provider's window, by this node's clock), keeps its record, and returns it.
pub(crate) async fn run(
    ctx: &Ctx,
    peer: PeerId,
    terms: &LeaseTerms,
    window: Duration,
) -> Option<Outcome> {
    let id = terms.lease_id().ok()?;
    let ad = advertised_of(ctx, terms, id).await?;
    let (rate, _source) = params::expected_macs(
        ad.backend,
        &ad.models.iter().map(String::as_str).collect::<Vec<_>>(),
        ad.claimed_mmacs,
    );
    let mut seed = [0u8; 32];
    let mut reveal = [0u8; 32];
    if getrandom::fill(&mut seed).is_err() || getrandom::fill(&mut reveal).is_err() {
        tracing::error!("no randomness for the GPU check");
        return None;
    }
    let challenge = ProofChallenge {
        lease_id: id,
        params: params::choose(ad.backend, rate, ad.vram_bytes),
        backend: ad.backend,
        seed,
        reveal_hash: proof::reveal_hash(&reveal),
        sent_at: ctx.now(),
    };
    let x = Exchange {
        ctx,
        peer,
        terms,
        id,
        net: ctx.client.network().clone(),
        started: Instant::now(),
        window,
    };
    let sc = sign(ctx, &challenge)?;
    let mut timing = ProofTiming {
        rtt_ms: x.rtt().await,
        ..ProofTiming::default()
    };
    let (commit, commit_ms) = x.commit(&sc).await;
    timing.commit_ms = commit_ms;
    let (opening, open_ms) = match &commit {
        Some(_) => x.open(reveal).await,
        None => (None, 0),
    };
    timing.open_ms = open_ms;
    let (verdict, cpu_ms) = judge(&challenge, &sc, &commit, &opening, reveal, timing).await;
    timing.check_cpu_ms = cpu_ms;
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
    let record = ProofRecord {
        challenge: sc,
        commit: commit.map(|(s, _)| s),
        opening: opening.map(|(s, _)| s),
        report: sign(ctx, &report)?,
        ack: None,
    };
    Some(x.conclude(record, &verdict).await)
}

/// The offer's side of the check, from the offer this node kept for the lease.
async fn advertised_of(ctx: &Ctx, terms: &LeaseTerms, id: LeaseId) -> Option<Advertised> {
    let offer = ctx
        .store
        .call(move |st| st.session_record(&id))
        .await
        .ok()
        .and_then(|r| r.offer)
        .and_then(|b| Signed::<Offer>::from_bytes(&b).ok())
        .and_then(|s| Offer::decode_payload(&s.envelope().payload).ok());
    let ad = offer.as_ref().and_then(|o| advertised(o, terms));
    if ad.is_none() {
        tracing::warn!("no GPU check: the offer of this lease is not kept here or has no backend");
    }
    ad
}

/// One check's exchange with the provider, within the window.
struct Exchange<'a> {
    ctx: &'a Ctx,
    peer: PeerId,
    terms: &'a LeaseTerms,
    id: LeaseId,
    net: NetworkId,
    started: Instant,
    window: Duration,
}

impl Exchange<'_> {
    /// What is left of the window (at least a second, so a late step still gets its answer).
    fn left(&self) -> Duration {
        self.window
            .saturating_sub(self.started.elapsed())
            .max(Duration::from_secs(1))
    }

    /// One request, sent again (the same bytes: every step is idempotent on the provider's
    /// side) when the link lost it or the provider was busy, while the window lasts, at most
    /// [`ATTEMPTS`] times. A refusal or any other answer is final.
    async fn ask(
        &self,
        req: SessionRequest,
    ) -> Result<SessionResponse, super::error::SessionRpcError> {
        let mut attempt = 1;
        loop {
            let answer = session_rpc_within(self.ctx, self.peer, req.clone(), self.left()).await;
            let again = matches!(answer, Err(_) | Ok(SessionResponse::Busy))
                && attempt < ATTEMPTS
                && self.window > self.started.elapsed() + Duration::from_secs(1);
            if !again {
                return answer;
            }
            tracing::debug!(attempt, answer = ?answer.as_ref().map(brief), "GPU check step sent again");
            attempt += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The round trip, milliseconds: the least of a few empty requests.
    async fn rtt(&self) -> u64 {
        let mut rtt = None::<Duration>;
        for _ in 0..PINGS {
            let t = Instant::now();
            let ping = SessionRequest::ProofPing { lease_id: self.id };
            if self.ask(ping).await.is_ok() {
                rtt = Some(rtt.map_or(t.elapsed(), |r| r.min(t.elapsed())));
            }
        }
        ms(rtt.unwrap_or_default())
    }

    /// The challenge sent, the provider's commitment (verified as its), and the time it took.
    async fn commit(
        &self,
        sc: &Signed<ProofChallenge>,
    ) -> (Option<(Signed<ProofCommit>, ProofCommit)>, u64) {
        let req = SessionRequest::ProofChallenge(sc.clone());
        self.signed_answer(req, "commit", |r| match r {
            SessionResponse::ProofCommit(s) => Some(s.clone()),
            _ => None,
        })
        .await
    }

    /// The reveal sent, the provider's openings (verified as its), and the time it took.
    async fn open(&self, reveal: [u8; 32]) -> (Option<(Signed<ProofOpening>, ProofOpening)>, u64) {
        let req = SessionRequest::ProofOpen {
            lease_id: self.id,
            reveal,
        };
        self.signed_answer(req, "open", |r| match r {
            SessionResponse::ProofOpening(s) => Some(s.clone()),
            _ => None,
        })
        .await
    }

    /// `req` sent; the provider-signed message `pick` takes from the answer (verified as the
    /// provider's), and the milliseconds from the first send to the answer. Anything else is
    /// logged as the provider not doing `what`.
    async fn signed_answer<T: WireMessage + Clone>(
        &self,
        req: SessionRequest,
        what: &str,
        pick: impl FnOnce(&SessionResponse) -> Option<Signed<T>>,
    ) -> (Option<(Signed<T>, T)>, u64) {
        let t = Instant::now();
        let answer = self.ask(req).await;
        let took = ms(t.elapsed());
        let got = match answer {
            Ok(r) => match pick(&r) {
                Some(s) => provider_signed(&s, &self.net, &self.terms.provider),
                None => {
                    tracing::warn!(answer = ?brief(&r), "the provider did not {what}");
                    None
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "the provider did not {what}");
                None
            }
        };
        (got, took)
    }

    /// The report sent (a pass comes back co-signed), the record kept, the outcome.
    async fn conclude(&self, mut record: ProofRecord, verdict: &ProofVerdict) -> Outcome {
        let sr = record.report.clone();
        let answer = self.ask(SessionRequest::ProofReport(sr.clone())).await;
        if let (true, Ok(SessionResponse::ProofAck(a))) = (verdict.passed(), answer) {
            let ok = a.verify(&self.net).is_ok_and(|v| {
                v.signer == self.terms.provider
                    && v.message.lease_id == self.id
                    && v.message.report == envelope_hash(&sr)
            });
            if ok {
                record.ack = Some(a);
            }
        }
        let passed = verdict.passed() && record.ack.is_some();
        let (id, provider, at, kept) =
            (self.id, self.terms.provider, self.ctx.now(), record.clone());
        if let Err(e) = self
            .ctx
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
        Outcome { passed, view }
    }
}

/// The verdict on what came back, and the renter's CPU milliseconds computing it (off the
/// runtime's threads: it recomputes the opened rows).
async fn judge(
    challenge: &ProofChallenge,
    sc: &Signed<ProofChallenge>,
    commit: &Option<(Signed<ProofCommit>, ProofCommit)>,
    opening: &Option<(Signed<ProofOpening>, ProofOpening)>,
    reveal: [u8; 32],
    timing: ProofTiming,
) -> (ProofVerdict, u64) {
    let (c, commit, opening) = (challenge.clone(), commit.clone(), opening.clone());
    let challenge_hash = envelope_hash(sc);
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
        let detail = format!("the check could not run: {e}");
        (ProofVerdict::Failed(ProofFailure::BadOpening { detail }), 0)
    })
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
