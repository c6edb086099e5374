//! The prover a provider node answers renters' GPU checks with (proof of GPU, issue 44), and
//! the self-test that decides whether its offer advertises a verification window at all: a
//! small challenge computed by the prover and checked by the renter's own rules, at start. A
//! prover that fails it (no CUDA, a driver fault, a wrong kernel) is not advertised: renters
//! then see an offer without a check, rather than leases that fail theirs.

use std::sync::Arc;

use gridlease_contracts::proof::params;
use gridlease_protocol::proof::{ProofParams, ProofPolicy};
use gridlease_sandbox::proof::Prover;

use crate::lease::provider::SharedProver;

/// What the self-test found.
pub struct Ready {
    /// The prover, with the rate it admits challenges against.
    pub prover: SharedProver,
    /// What the offer says.
    pub policy: ProofPolicy,
}

/// Readies a prover off the runtime's threads (`ready` self-tests and measures, which takes
/// a second or more), and when it is ready, puts its policy in the offer `t`: the prover its
/// lease sessions answer checks with.
pub async fn advertise(
    t: &mut crate::net::OfferTemplate,
    ready: impl FnOnce() -> Option<Ready> + Send + 'static,
) -> Option<SharedProver> {
    let r = tokio::task::spawn_blocking(ready).await.ok().flatten()?;
    t.proof = r.policy;
    Some(r.prover)
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

/// A small challenge, computed and then checked by the renter's rules
/// (`gridlease_sandbox::proof::selfcheck`, the check `gridlease-gpu-bench challenge` runs).
fn self_test(prover: &dyn Prover, devices: &[String]) -> Result<(), String> {
    let small = ProofParams {
        n: 256,
        gemms: 4,
        rows: 16,
        open_rows: 4,
        vram_bytes: 8 * 4096,
        page_bytes: 4096,
        open_pages: 8,
        // The rules, not the time: a cold start (NVRTC compiling the kernels) is slow.
        limit_ms: u64::MAX,
    };
    let found =
        gridlease_sandbox::proof::selfcheck::self_check(prover, devices, &[], small, [42; 32])
            .map_err(|e| e.to_string())?;
    if found.passed {
        Ok(())
    } else {
        Err(found.verdict)
    }
}
