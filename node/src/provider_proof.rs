//! The prover a provider node answers renters' GPU checks with (proof of GPU, issue 44), and
//! the self-test that decides whether its offer advertises a verification window at all: a
//! small challenge computed by the prover and checked by the renter's own rules, at start. A
//! prover that fails it (no CUDA, a driver fault, a wrong kernel) is not advertised: renters
//! then see an offer without a check, rather than leases that fail theirs.

use std::sync::Arc;

use gridlease_contracts::proof::{self, params};
use gridlease_protocol::proof::{
    ProofChallenge, ProofCommit, ProofOpening, ProofParams, ProofPolicy, ProofTiming, envelope_hash,
};
use gridlease_protocol::{Digest, LeaseId, NetworkId, NodeKey, Signed, Timestamp};
use gridlease_sandbox::proof::Prover;

use crate::lease::provider::SharedProver;

/// What the self-test found.
pub struct Ready {
    /// The prover, with the rate it admits challenges against.
    pub prover: SharedProver,
    /// What the offer says.
    pub policy: ProofPolicy,
}

/// The CPU reference prover of a `--dev-gpus` node (labelled "cpu-reference: not a GPU"
/// wherever it shows), self-tested and measured, claiming half of the rate it measured (so a
/// busy host still answers in time); `None` (and a warning) when it fails its self-test or
/// `window_s` is 0.
pub fn cpu_reference(window_s: u32) -> Option<Ready> {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let prover: Arc<dyn Prover> = Arc::new(gridlease_sandbox::proof::CpuReference { threads });
    ready(prover, window_s, params::CPU_REFERENCE_FILL_CAP, &[], 0.5)
}

/// The CUDA prover of a node with driver GPUs (`uuids`, each with `vram_per_gpu` bytes),
/// self-tested on them and measured at start, claiming half the rate it measured (the claim
/// counts only for a model the renter's table of published rates lacks); `None` (and a
/// warning) when CUDA is missing or the self-test fails, so offers then advertise no check.
pub fn cuda(window_s: u32, uuids: Vec<String>, vram_per_gpu: u64) -> Option<Ready> {
    if window_s == 0 || uuids.is_empty() {
        return None;
    }
    let prover: Arc<dyn Prover> = Arc::new(gridlease_sandbox::proof::Cuda::new());
    ready(prover, window_s, vram_per_gpu, &uuids, 0.5)
}

/// Self-tests `prover` on `devices` and measures it; the ready prover and its offer policy.
/// `vram_per_gpu`: what it may fill per leased GPU; `claim_share`: the share of the measured
/// rate it claims.
pub fn ready(
    prover: Arc<dyn Prover>,
    window_s: u32,
    vram_per_gpu: u64,
    devices: &[String],
    claim_share: f64,
) -> Option<Ready> {
    if window_s == 0 {
        return None;
    }
    let backend = prover.backend();
    if let Err(e) = self_test(prover.as_ref(), devices) {
        tracing::warn!(%backend, error = %e, "the GPU-check prover failed its self-test; offers advertise no GPU check");
        return None;
    }
    let measured = match prover.measure(devices) {
        Ok(r) if r.is_finite() && r > 0.0 => r,
        Ok(r) => {
            tracing::warn!(%backend, rate = r, "the GPU-check prover measured no rate; no GPU check offered");
            return None;
        }
        Err(e) => {
            tracing::warn!(%backend, error = %e, "the GPU-check prover could not be measured; no GPU check offered");
            return None;
        }
    };
    let per_gpu = measured / devices.len().max(1) as f64 * claim_share;
    tracing::info!(
        backend = backend.label(),
        measured_gmacs = measured / 1e9,
        claimed_gmacs_per_gpu = per_gpu / 1e9,
        window_s,
        "GPU check offered"
    );
    Some(Ready {
        prover: SharedProver {
            prover,
            macs_per_gpu: per_gpu,
            vram_per_gpu,
        },
        policy: ProofPolicy {
            window_s,
            backend: Some(backend),
            claimed_mmacs: (per_gpu / 1e6) as u64,
        },
    })
}

/// A small challenge, computed and then checked by the renter's rules.
fn self_test(prover: &dyn Prover, devices: &[String]) -> Result<(), String> {
    let key = NodeKey::generate();
    let net = NetworkId::devnet();
    let reveal = [7u8; 32];
    let c = ProofChallenge {
        lease_id: LeaseId(Digest([0; 32])),
        params: ProofParams {
            n: 256,
            gemms: 4,
            rows: 16,
            open_rows: 4,
            vram_bytes: 8 * 4096,
            page_bytes: 4096,
            open_pages: 8,
            limit_ms: u64::MAX,
        },
        backend: prover.backend(),
        seed: [42; 32],
        reveal_hash: proof::reveal_hash(&reveal),
        sent_at: Timestamp(0),
    };
    let sign_err = |e: gridlease_protocol::CodecError| e.to_string();
    let sc = Signed::sign(&key, &net, &c).map_err(sign_err)?;
    let done = prover.compute(&c, devices).map_err(|e| e.to_string())?;
    let commit = ProofCommit {
        lease_id: c.lease_id,
        challenge: envelope_hash(&sc),
        backend: c.backend,
        gemm_roots: done.gemm_trees.iter().map(|t| t.root()).collect(),
        vram_root: done.vram_tree.root(),
        vram_bytes: done.vram_bytes,
        work_ms: done.work_ms,
        note: String::new(),
    };
    let sm = Signed::sign(&key, &net, &commit).map_err(sign_err)?;
    let commit_hash = envelope_hash(&sm);
    let leaves = proof::openings(&c, &commit_hash, &reveal)
        .into_iter()
        .filter_map(|i| proof::open_leaf(&done.gemm_trees, &done.vram_tree, i))
        .collect();
    let opening = ProofOpening {
        lease_id: c.lease_id,
        commit: commit_hash,
        leaves,
    };
    let so = Signed::sign(&key, &net, &opening).map_err(sign_err)?;
    let verdict = proof::check(&proof::Transcript {
        challenge: &c,
        challenge_hash: envelope_hash(&sc),
        commit: Some((&commit, commit_hash)),
        reveal: &reveal,
        opening: Some((&opening, envelope_hash(&so))),
        timing: ProofTiming::default(),
    });
    if verdict.passed() {
        Ok(())
    } else {
        Err(proof::explain(&verdict, prover.backend()))
    }
}
