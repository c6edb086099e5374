//! The CPU reference against the contracts' own check (a whole signed transcript), and the
//! bounds every prover applies before it allocates. Helpers shared with the cheats' tests.

use gridlease_contracts::proof::{Transcript, check, open_leaf, openings, reveal_hash};
use gridlease_protocol::proof::{
    ProofBackend, ProofChallenge, ProofCommit, ProofOpening, ProofParams, ProofTiming,
    ProofVerdict, envelope_hash,
};
use gridlease_protocol::{Digest, LeaseId, NetworkId, NodeKey, Signed, Timestamp};

use gridlease_contracts::proof::data;

use super::*;

/// Small sizes (the rules do not depend on them): 4 GEMMs of 16 rows at n = 128, a fill of
/// 32 pages of 4 KiB.
pub(crate) fn small_params() -> ProofParams {
    ProofParams {
        n: 128,
        gemms: 4,
        rows: 16,
        open_rows: 4,
        vram_bytes: 32 * 4096,
        page_bytes: 4096,
        open_pages: 8,
        limit_ms: 60_000,
    }
}

/// A challenge with [`small_params`] for `seed`, and its reveal.
pub(crate) fn small_challenge(seed: [u8; 32]) -> (ProofChallenge, [u8; 32]) {
    let reveal = [seed[0].wrapping_add(100); 32];
    let c = ProofChallenge {
        lease_id: LeaseId(Digest([9; 32])),
        params: small_params(),
        backend: ProofBackend::CpuReference,
        seed,
        reveal_hash: reveal_hash(&reveal),
        sent_at: Timestamp(1_000),
    };
    (c, reveal)
}

/// The renter's verdict on what a prover computed: the challenge signed by a renter, the
/// commitment and the openings (from `computed`'s trees) signed by a provider, checked by
/// `gridlease_contracts::proof::check` with an on-time commitment.
pub(crate) fn verdict_of(
    c: &ProofChallenge,
    reveal: &[u8; 32],
    computed: &Computed,
) -> ProofVerdict {
    let net = NetworkId::devnet();
    let (renter, provider) = (NodeKey::from_secret([1; 32]), NodeKey::from_secret([2; 32]));
    let sc = Signed::sign(&renter, &net, c).expect("sign the challenge");
    let commit = ProofCommit {
        lease_id: c.lease_id,
        challenge: envelope_hash(&sc),
        backend: c.backend,
        gemm_roots: computed.gemm_trees.iter().map(Tree::root).collect(),
        vram_root: computed.vram_tree.root(),
        vram_bytes: computed.vram_bytes,
        work_ms: computed.work_ms,
        note: computed.note.clone(),
    };
    let sm = Signed::sign(&provider, &net, &commit).expect("sign the commitment");
    let commit_hash = envelope_hash(&sm);
    let leaves = openings(c, &commit_hash, reveal)
        .into_iter()
        .map(|i| {
            open_leaf(&computed.gemm_trees, &computed.vram_tree, i).expect("an index in the trees")
        })
        .collect();
    let opening = ProofOpening {
        lease_id: c.lease_id,
        commit: commit_hash,
        leaves,
    };
    let so = Signed::sign(&provider, &net, &opening).expect("sign the openings");
    check(&Transcript {
        challenge: c,
        challenge_hash: envelope_hash(&sc),
        commit: Some((&commit, commit_hash)),
        reveal,
        opening: Some((&opening, envelope_hash(&so))),
        timing: ProofTiming {
            rtt_ms: 1,
            commit_ms: 2,
            open_ms: 1,
            check_cpu_ms: 1,
        },
    })
}

#[test]
fn the_cpu_reference_passes_the_contracts_check() {
    for (seed, threads) in [([1u8; 32], 1), ([2; 32], 3), ([3; 32], 8)] {
        let (c, reveal) = small_challenge(seed);
        let computed = CpuReference::new(threads).compute(&c, &[]).unwrap();
        assert_eq!(computed.gemm_trees.len(), 4);
        assert_eq!(computed.vram_tree.len(), 32);
        assert_eq!(computed.vram_bytes, c.params.vram_bytes);
        assert_eq!(
            computed.note,
            format!("cpu-reference: not a GPU ({threads} threads)")
        );
        assert_eq!(verdict_of(&c, &reveal, &computed), ProofVerdict::Passed);
    }
}

#[test]
fn the_cpu_reference_gives_the_contracts_leaves_whatever_the_thread_count() {
    // Every leaf, not only the opened ones: more threads than rows or pages included.
    let (mut c, _) = small_challenge([5; 32]);
    c.params.rows = 3;
    c.params.open_rows = 3;
    c.params.n = 192;
    let p = c.params;
    let b = data::b_matrix(&c.seed, p.n);
    for threads in [1, 2, 5, 64] {
        let computed = CpuReference::new(threads).compute(&c, &[]).unwrap();
        for (g, t) in computed.gemm_trees.iter().enumerate() {
            for r in 0..p.rows {
                let want = data::true_row_leaf(&c.seed, p.n, &b, g as u32, r);
                assert_eq!(t.leaf(u64::from(r)), Some(want), "{threads} threads");
            }
        }
        for pg in 0..computed.vram_tree.len() {
            let want = data::true_page_leaf(&c.seed, p.page_bytes, pg);
            assert_eq!(computed.vram_tree.leaf(pg), Some(want));
        }
    }
}

#[test]
fn sizes_outside_the_bounds_are_refused_before_anything_is_allocated() {
    let cpu = CpuReference::new(2);
    let bad = [
        ProofParams {
            n: 100,
            ..small_params()
        },
        ProofParams {
            n: 1 << 20,
            ..small_params()
        },
        ProofParams {
            gemms: 0,
            ..small_params()
        },
        ProofParams {
            rows: u32::MAX,
            ..small_params()
        },
        ProofParams {
            page_bytes: 1,
            ..small_params()
        },
        ProofParams {
            vram_bytes: 4096 * 32 + 1,
            ..small_params()
        },
        // More than the CPU reference's fill cap: a renter cannot make it allocate more.
        ProofParams {
            vram_bytes: params::CPU_REFERENCE_FILL_CAP + 4096,
            ..small_params()
        },
    ];
    for p in bad {
        let (mut c, _) = small_challenge([1; 32]);
        c.params = p;
        assert!(
            matches!(cpu.compute(&c, &[]), Err(ProverError::Params(_))),
            "{p:?}"
        );
    }
    // More leaves than a prover builds: refused by admit's bounds (the renter's rule, since
    // it sizes challenges within `params::MAX_LEAVES`), before anything is allocated.
    let many = ProofParams {
        gemms: 256,
        rows: params::MAX_ROWS,
        ..small_params()
    };
    assert!(matches!(
        check_sizes(&many, u64::MAX),
        Err(ProverError::Params(Inadmissible::Size(_)) | ProverError::TooManyLeaves { .. })
    ));
}

#[test]
fn errors_say_what_and_how_much() {
    let e = ProverError::VramAlloc {
        asked: 45 << 29,
        free: 12 << 30,
        device: String::new(),
    };
    assert_eq!(
        e.to_string(),
        "cannot allocate the VRAM fill: 22.5 GiB asked, 12.0 GiB free"
    );
    let e = ProverError::CudaUnavailable {
        detail: "the CUDA driver library (libcuda.so) was not found".into(),
    };
    assert_eq!(
        e.to_string(),
        "CUDA unavailable: the CUDA driver library (libcuda.so) was not found"
    );
}

#[test]
fn a_long_note_is_cut_on_a_character_boundary() {
    let long = "é".repeat(300);
    let cut = note(long);
    assert!(cut.len() <= gridlease_protocol::proof::MAX_PROOF_TEXT);
    assert!(cut.chars().all(|ch| ch == 'é'));
}

#[test]
fn the_cpu_reference_measures_a_rate() {
    let rate = CpuReference::new(2).measure(&[]).unwrap();
    assert!(rate > 1e6, "{rate}");
}
