//! A provider's own check of its prover (`gridlease-gpu-bench challenge`): a challenge as a
//! renter would choose it for these GPUs, computed by the prover, committed, opened and
//! judged by the contracts' rules on the CPU, with the time it took against the published
//! rate of the models.

use std::time::Instant;

use gridlease_contracts::proof::merkle::Tree;
use gridlease_contracts::proof::{
    Transcript, check, explain, open_leaf, openings, params, reveal_hash,
};
use gridlease_protocol::proof::{
    ProofBackend, ProofChallenge, ProofCommit, ProofOpening, ProofParams, ProofTiming,
    envelope_hash,
};
use gridlease_protocol::{Digest, LeaseId, NetworkId, NodeKey, Signed, Timestamp};
use serde::Serialize;

use super::{Prover, ProverError};

/// What a self-check found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SelfCheck {
    /// The prover's backend.
    pub backend: ProofBackend,
    /// The GPUs' model names (none for the CPU reference).
    pub models: Vec<String>,
    /// Matrix dimension.
    pub n: u32,
    /// GEMMs.
    pub gemms: u32,
    /// Rows of each GEMM.
    pub rows: u32,
    /// Bytes of the VRAM fill.
    pub vram_bytes: u64,
    /// Multiply-accumulates of the GEMMs.
    pub work_macs: u64,
    /// Seed to trees, milliseconds (the prover's whole computation: GEMMs, fill, hashing).
    pub elapsed_ms: u64,
    /// The renter's limit on that time, milliseconds.
    pub limit_ms: u64,
    /// The GEMMs' operations (2 a multiply-accumulate) over the elapsed time, tera a second.
    pub achieved_tops: f64,
    /// The published dense int8 rate of the models together (`params::published`), where
    /// the table has every one.
    pub published_tops: Option<f64>,
    /// `achieved_tops / published_tops`.
    pub ratio: Option<f64>,
    /// Whether the contracts' check passed.
    pub passed: bool,
    /// The check's verdict in words (`gridlease_contracts::proof::explain`).
    pub verdict: String,
    /// The prover's note.
    pub note: String,
}

/// The sum of the published rates of `models`, if the table has them all.
pub fn published_tops(models: &[String]) -> Option<f64> {
    models
        .iter()
        .map(|m| params::published(m).map(|r| r.int8_tops))
        .sum()
}

/// The renter's parameters for `models` (at their published rates; where the table lacks one,
/// at `measured` multiply-accumulates a second) with `vram_bytes` of memory in all.
pub fn params_for(
    backend: ProofBackend,
    models: &[String],
    measured: f64,
    vram_bytes: u64,
) -> ProofParams {
    let names: Vec<&str> = models.iter().map(String::as_str).collect();
    // The measured rate is all the GPUs' together; an offer claims per GPU.
    let claimed_mmacs = (measured / 1e6 / names.len().max(1) as f64) as u64;
    let (rate, _) = params::expected_macs(backend, &names, claimed_mmacs);
    params::choose(backend, rate, vram_bytes)
}

/// A 32-byte value from the process's hash seeds (the OS's randomness), std only.
pub fn fresh_seed() -> [u8; 32] {
    use std::hash::{BuildHasher, Hasher};
    let mut out = [0u8; 32];
    for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_usize(i);
        chunk.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// Runs the challenge `p` (seed `seed`) on `prover` and `devices`, then everything a renter
/// does: a signed challenge, the provider's signed commitment and openings for a reveal it
/// could not know, the contracts' check with the computation's time as the commitment's
/// (no round trip).
pub fn self_check(
    prover: &dyn Prover,
    devices: &[String],
    models: &[String],
    p: ProofParams,
    seed: [u8; 32],
) -> Result<SelfCheck, ProverError> {
    let reveal = {
        let mut r = seed;
        r.reverse();
        r[0] ^= 0x5a;
        r
    };
    let c = ProofChallenge {
        lease_id: LeaseId(Digest::of("gridlease/v1/proof-self-check", &seed)),
        params: p,
        backend: prover.backend(),
        seed,
        reveal_hash: reveal_hash(&reveal),
        sent_at: Timestamp(0),
    };
    let start = Instant::now();
    let computed = prover.compute(&c, devices)?;
    let elapsed_ms = start.elapsed().as_millis() as u64;
    // Throwaway keys: the check needs signed messages, not these identities.
    let net = NetworkId::devnet();
    let renter = NodeKey::from_secret(seed);
    let provider = NodeKey::from_secret(reveal);
    let sign_err = |e: gridlease_protocol::CodecError| ProverError::Encode {
        detail: e.to_string(),
    };
    let sc = Signed::sign(&renter, &net, &c).map_err(sign_err)?;
    let commit = ProofCommit {
        lease_id: c.lease_id,
        challenge: envelope_hash(&sc),
        backend: prover.backend(),
        gemm_roots: computed.gemm_trees.iter().map(Tree::root).collect(),
        vram_root: computed.vram_tree.root(),
        vram_bytes: computed.vram_bytes,
        work_ms: computed.work_ms,
        note: computed.note.clone(),
    };
    let sm = Signed::sign(&provider, &net, &commit).map_err(sign_err)?;
    let commit_hash = envelope_hash(&sm);
    let picked = openings(&c, &commit_hash, &reveal);
    let leaves: Vec<_> = picked
        .iter()
        .filter_map(|&i| open_leaf(&computed.gemm_trees, &computed.vram_tree, i))
        .collect();
    let opening = ProofOpening {
        lease_id: c.lease_id,
        commit: commit_hash,
        leaves,
    };
    let so = Signed::sign(&provider, &net, &opening).map_err(sign_err)?;
    let verdict = check(&Transcript {
        challenge: &c,
        challenge_hash: envelope_hash(&sc),
        commit: Some((&commit, commit_hash)),
        reveal: &reveal,
        opening: Some((&opening, envelope_hash(&so))),
        timing: ProofTiming {
            rtt_ms: 0,
            commit_ms: elapsed_ms,
            open_ms: 0,
            check_cpu_ms: 0,
        },
    });
    let work_macs = u64::try_from(params::work_macs(&p)).unwrap_or(u64::MAX);
    let achieved_tops = 2.0 * work_macs as f64 / (elapsed_ms.max(1) as f64 / 1000.0) / 1e12;
    let published = match prover.backend() {
        ProofBackend::Cuda => published_tops(models),
        ProofBackend::CpuReference => None,
    };
    Ok(SelfCheck {
        backend: prover.backend(),
        models: models.to_vec(),
        n: p.n,
        gemms: p.gemms,
        rows: p.rows,
        vram_bytes: p.vram_bytes,
        work_macs,
        elapsed_ms,
        limit_ms: p.limit_ms,
        achieved_tops,
        published_tops: published,
        ratio: published.map(|t| achieved_tops / t),
        passed: verdict.passed(),
        verdict: explain(&verdict, prover.backend()),
        note: computed.note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proof::CpuReference;
    use crate::proof::tests::small_params;

    #[test]
    fn the_cpu_reference_passes_its_own_check() {
        let got = self_check(&CpuReference::new(2), &[], &[], small_params(), [3; 32]).unwrap();
        assert!(got.passed, "{got:?}");
        assert_eq!(got.verdict, "GPU check passed (cpu-reference: not a GPU)");
        assert_eq!(got.work_macs, 4 * 16 * 128 * 128);
        assert_eq!(got.published_tops, None);
        let json = serde_json::to_value(&got).unwrap();
        assert_eq!(json["backend"], "cpu-reference");
    }

    #[test]
    fn a_renters_parameters_for_known_and_unknown_models() {
        let h100 = vec!["NVIDIA H100 80GB HBM3".to_string()];
        assert_eq!(published_tops(&h100), Some(1979.0));
        assert_eq!(published_tops(&["Mystery GPU".to_string()]), None);
        let p = params_for(ProofBackend::Cuda, &h100, 0.0, 80 << 30);
        assert_eq!(p.n, params::N_GPU);
        assert!(p.vram_bytes >= (80u64 << 30) * 9 / 10);
        // An unknown model is challenged at the measured rate.
        let slow = params_for(ProofBackend::Cuda, &["Mystery GPU".into()], 1e12, 8 << 30);
        let fast = params_for(ProofBackend::Cuda, &["Mystery GPU".into()], 1e14, 8 << 30);
        assert!(fast.rows > slow.rows);
    }

    #[test]
    fn fresh_seeds_differ() {
        assert_ne!(fresh_seed(), fresh_seed());
    }
}
