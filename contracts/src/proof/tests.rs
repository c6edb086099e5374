//! The rules against honest and tampered transcripts (issue 44's property tests).

use gridlease_protocol::proof::{
    ProofAck, ProofBackend, ProofChallenge, ProofCommit, ProofFailure, ProofIndex, ProofOpening,
    ProofParams, ProofRecord, ProofReport, ProofTiming, ProofVerdict, envelope_hash,
};
use gridlease_protocol::{Digest, LeaseId, NetworkId, NodeKey, Signed, Timestamp};
use proptest::prelude::*;

use super::merkle::Tree;
use super::*;

/// Small sizes: the rules do not depend on them.
fn small() -> ProofParams {
    ProofParams {
        n: 64,
        gemms: 4,
        rows: 12,
        open_rows: 3,
        vram_bytes: 16 * 4096,
        page_bytes: 4096,
        open_pages: 4,
        limit_ms: 1_000,
    }
}

struct Keys {
    renter: NodeKey,
    provider: NodeKey,
    net: NetworkId,
}

fn keys() -> Keys {
    Keys {
        renter: NodeKey::from_secret([1; 32]),
        provider: NodeKey::from_secret([2; 32]),
        net: NetworkId::devnet(),
    }
}

fn challenge(k: &Keys, seed: [u8; 32], reveal: &[u8; 32]) -> Signed<ProofChallenge> {
    let c = ProofChallenge {
        lease_id: LeaseId(Digest([9; 32])),
        params: small(),
        backend: ProofBackend::CpuReference,
        seed,
        reveal_hash: reveal_hash(reveal),
        sent_at: Timestamp(1_000),
    };
    Signed::sign(&k.renter, &k.net, &c).unwrap()
}

/// An honest prover's trees for a challenge.
fn honest_trees(c: &ProofChallenge) -> (Vec<Tree>, Tree) {
    let p = &c.params;
    let b = data::b_matrix(&c.seed, p.n);
    let gemms = (0..p.gemms)
        .map(|g| {
            Tree::new(
                (0..p.rows)
                    .map(|r| data::true_row_leaf(&c.seed, p.n, &b, g, r))
                    .collect(),
            )
        })
        .collect();
    let pages = p.vram_bytes / u64::from(p.page_bytes);
    let vram = Tree::new(
        (0..pages)
            .map(|pg| data::true_page_leaf(&c.seed, p.page_bytes, pg))
            .collect(),
    );
    (gemms, vram)
}

fn commit_of(
    k: &Keys,
    sc: &Signed<ProofChallenge>,
    trees: &(Vec<Tree>, Tree),
) -> Signed<ProofCommit> {
    let c = sc.verify(&k.net).unwrap().message;
    let m = ProofCommit {
        lease_id: c.lease_id,
        challenge: envelope_hash(sc),
        backend: ProofBackend::CpuReference,
        gemm_roots: trees.0.iter().map(Tree::root).collect(),
        vram_root: trees.1.root(),
        vram_bytes: c.params.vram_bytes,
        work_ms: 5,
        note: String::new(),
    };
    Signed::sign(&k.provider, &k.net, &m).unwrap()
}

fn opening_of(
    k: &Keys,
    c: &ProofChallenge,
    sm: &Signed<ProofCommit>,
    reveal: &[u8; 32],
    trees: &(Vec<Tree>, Tree),
) -> Signed<ProofOpening> {
    let h = envelope_hash(sm);
    let leaves = openings(c, &h, reveal)
        .into_iter()
        .map(|i| open_leaf(&trees.0, &trees.1, i).unwrap())
        .collect();
    let m = ProofOpening {
        lease_id: c.lease_id,
        commit: h,
        leaves,
    };
    Signed::sign(&k.provider, &k.net, &m).unwrap()
}

fn verdict(
    k: &Keys,
    sc: &Signed<ProofChallenge>,
    sm: &Signed<ProofCommit>,
    so: &Signed<ProofOpening>,
    reveal: &[u8; 32],
    timing: ProofTiming,
) -> ProofVerdict {
    let c = sc.verify(&k.net).unwrap().message;
    let m = sm.verify(&k.net).unwrap().message;
    let o = so.verify(&k.net).unwrap().message;
    check(&Transcript {
        challenge: &c,
        challenge_hash: envelope_hash(sc),
        commit: Some((&m, envelope_hash(sm))),
        reveal,
        opening: Some((&o, envelope_hash(so))),
        timing,
    })
}

fn on_time() -> ProofTiming {
    ProofTiming {
        rtt_ms: 20,
        commit_ms: 300,
        open_ms: 25,
        check_cpu_ms: 1,
    }
}

/// A whole honest record, co-signed.
fn record(k: &Keys, seed: [u8; 32], reveal: [u8; 32]) -> ProofRecord {
    let sc = challenge(k, seed, &reveal);
    let c = sc.verify(&k.net).unwrap().message;
    let trees = honest_trees(&c);
    let sm = commit_of(k, &sc, &trees);
    let so = opening_of(k, &c, &sm, &reveal, &trees);
    let v = verdict(k, &sc, &sm, &so, &reveal, on_time());
    let report = ProofReport {
        lease_id: c.lease_id,
        challenge: envelope_hash(&sc),
        commit: Some(envelope_hash(&sm)),
        reveal,
        opening: Some(envelope_hash(&so)),
        timing: on_time(),
        verdict: v,
        decided_at: Timestamp(2_000),
    };
    let sr = Signed::sign(&k.renter, &k.net, &report).unwrap();
    let ack = ProofAck {
        lease_id: c.lease_id,
        report: envelope_hash(&sr),
    };
    ProofRecord {
        challenge: sc,
        commit: Some(sm),
        opening: Some(so),
        ack: Some(Signed::sign(&k.provider, &k.net, &ack).unwrap()),
        report: sr,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn an_honest_transcript_always_passes(seed in any::<[u8; 32]>(), reveal in any::<[u8; 32]>()) {
        let k = keys();
        let r = record(&k, seed, reveal);
        let v = check_record(&r, &k.net, &k.renter.public(), &k.provider.public());
        prop_assert_eq!(v, Ok(ProofVerdict::Passed));
    }

    #[test]
    fn a_wrong_row_fails(seed in any::<[u8; 32]>(), reveal in any::<[u8; 32]>(), gemm in 0u32..4, row in 0u32..12, bit in 0usize..256) {
        // The provider committed to a tree where one row's leaf is not the true row's hash;
        // when that row is opened the check names it, otherwise (not opened) it passes.
        let k = keys();
        let sc = challenge(&k, seed, &reveal);
        let c = sc.verify(&k.net).unwrap().message;
        let (mut g, v) = honest_trees(&c);
        let mut leaves: Vec<Digest> = (0..c.params.rows).map(|r| g[gemm as usize].leaf(u64::from(r)).unwrap()).collect();
        leaves[row as usize].0[bit / 8] ^= 1 << (bit % 8);
        g[gemm as usize] = Tree::new(leaves);
        let trees = (g, v);
        let sm = commit_of(&k, &sc, &trees);
        let so = opening_of(&k, &c, &sm, &reveal, &trees);
        let opened = openings(&c, &envelope_hash(&sm), &reveal).contains(&ProofIndex::Row { gemm, row });
        let got = verdict(&k, &sc, &sm, &so, &reveal, on_time());
        if opened {
            let wrong_row = matches!(got, ProofVerdict::Failed(ProofFailure::WrongRows { first: ProofIndex::Row { gemm: g2, row: r2 }, .. }) if g2 == gemm && r2 == row);
            prop_assert!(wrong_row, "{got:?}");
        } else {
            prop_assert_eq!(got, ProofVerdict::Passed);
        }
    }

    #[test]
    fn a_wrong_merkle_path_fails(seed in any::<[u8; 32]>(), reveal in any::<[u8; 32]>(), which in any::<prop::sample::Index>(), step in any::<prop::sample::Index>(), bit in 0usize..256) {
        let k = keys();
        let sc = challenge(&k, seed, &reveal);
        let c = sc.verify(&k.net).unwrap().message;
        let trees = honest_trees(&c);
        let sm = commit_of(&k, &sc, &trees);
        let mut o = opening_of(&k, &c, &sm, &reveal, &trees).verify(&k.net).unwrap().message;
        let l = which.get_mut(&mut o.leaves);
        prop_assume!(!l.path.is_empty());
        let s = step.get_mut(&mut l.path);
        s.0[bit / 8] ^= 1 << (bit % 8);
        let so = Signed::sign(&k.provider, &k.net, &o).unwrap();
        let got = verdict(&k, &sc, &sm, &so, &reveal, on_time());
        prop_assert!(matches!(got, ProofVerdict::Failed(ProofFailure::BadPaths { .. })), "{got:?}");
    }

    #[test]
    fn a_commitment_replayed_from_another_seed_fails(seed in any::<[u8; 32]>(), old in any::<[u8; 32]>(), reveal in any::<[u8; 32]>()) {
        prop_assume!(seed != old);
        let k = keys();
        // The old challenge's honest commitment and openings, sent for the new challenge:
        // as signed, or with its challenge hash rewritten to the new one.
        let old_sc = challenge(&k, old, &reveal);
        let old_c = old_sc.verify(&k.net).unwrap().message;
        let old_trees = honest_trees(&old_c);
        let sc = challenge(&k, seed, &reveal);
        let c = sc.verify(&k.net).unwrap().message;
        let replayed = commit_of(&k, &old_sc, &old_trees);
        let so = opening_of(&k, &c, &replayed, &reveal, &old_trees);
        let got = verdict(&k, &sc, &replayed, &so, &reveal, on_time());
        prop_assert!(matches!(got, ProofVerdict::Failed(ProofFailure::BadCommit { .. })), "{got:?}");
        let mut m = replayed.verify(&k.net).unwrap().message;
        m.challenge = envelope_hash(&sc);
        let relabelled = Signed::sign(&k.provider, &k.net, &m).unwrap();
        let so = opening_of(&k, &c, &relabelled, &reveal, &old_trees);
        let got = verdict(&k, &sc, &relabelled, &so, &reveal, on_time());
        prop_assert!(matches!(got, ProofVerdict::Failed(ProofFailure::WrongRows { .. })), "{got:?}");
    }

    #[test]
    fn a_late_commitment_fails_and_the_round_trip_is_not_counted(seed in any::<[u8; 32]>(), reveal in any::<[u8; 32]>(), rtt in 0u64..500, over in 1u64..10_000) {
        let k = keys();
        let sc = challenge(&k, seed, &reveal);
        let c = sc.verify(&k.net).unwrap().message;
        let trees = honest_trees(&c);
        let sm = commit_of(&k, &sc, &trees);
        let so = opening_of(&k, &c, &sm, &reveal, &trees);
        let at = |commit_ms| ProofTiming { rtt_ms: rtt, commit_ms, open_ms: 1, check_cpu_ms: 1 };
        let limit = c.params.limit_ms;
        prop_assert_eq!(verdict(&k, &sc, &sm, &so, &reveal, at(limit + rtt)), ProofVerdict::Passed);
        let late = verdict(&k, &sc, &sm, &so, &reveal, at(limit + rtt + over));
        prop_assert_eq!(late, ProofVerdict::Failed(ProofFailure::TooSlow { took_ms: limit + over, limit_ms: limit }));
    }

    #[test]
    fn one_changed_byte_in_a_record_is_refused(seed in any::<[u8; 32]>(), reveal in any::<[u8; 32]>(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let k = keys();
        let r = record(&k, seed, reveal);
        let mut bytes = r.to_bytes().unwrap();
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        if let Ok(changed) = ProofRecord::from_bytes(&bytes) {
            prop_assume!(changed != r);
            let got = check_record(&changed, &k.net, &k.renter.public(), &k.provider.public());
            prop_assert!(got.is_err(), "a changed record was accepted: {got:?}");
        }
    }
}

#[test]
fn a_zeroed_b_in_one_gemm_is_always_caught() {
    // Every GEMM has opened rows, so a GEMM computed with B = 0 is caught whatever the reveal.
    let k = keys();
    for s in 0..8u8 {
        let (seed, reveal) = ([s; 32], [s.wrapping_add(100); 32]);
        let sc = challenge(&k, seed, &reveal);
        let c = sc.verify(&k.net).unwrap().message;
        let (mut g, v) = honest_trees(&c);
        let zero = vec![0i32; c.params.n as usize];
        g[1] = Tree::new(
            (0..c.params.rows)
                .map(|r| data::row_leaf(1, r, &zero))
                .collect(),
        );
        let trees = (g, v);
        let sm = commit_of(&k, &sc, &trees);
        let so = opening_of(&k, &c, &sm, &reveal, &trees);
        let got = verdict(&k, &sc, &sm, &so, &reveal, on_time());
        assert!(
            matches!(
                got,
                ProofVerdict::Failed(ProofFailure::WrongRows {
                    first: ProofIndex::Row { gemm: 1, .. },
                    ..
                })
            ),
            "{got:?}"
        );
    }
}

#[test]
fn a_short_fill_is_caught_by_size_or_by_its_pages() {
    let k = keys();
    let reveal = [5; 32];
    let sc = challenge(&k, [4; 32], &reveal);
    let c = sc.verify(&k.net).unwrap().message;
    let trees = honest_trees(&c);
    // Says so: refused on size.
    let mut m = commit_of(&k, &sc, &trees).verify(&k.net).unwrap().message;
    m.vram_bytes = c.params.vram_bytes / 2;
    let sm = Signed::sign(&k.provider, &k.net, &m).unwrap();
    let so = opening_of(&k, &c, &sm, &reveal, &trees);
    let got = verdict(&k, &sc, &sm, &so, &reveal, on_time());
    assert!(
        matches!(got, ProofVerdict::Failed(ProofFailure::VramShort { .. })),
        "{got:?}"
    );
    // Lies: half the pages are zeros; opened zero pages are wrong.
    let pages = c.params.vram_bytes / u64::from(c.params.page_bytes);
    let zero = vec![0u8; c.params.page_bytes as usize];
    let vram = Tree::new(
        (0..pages)
            .map(|p| {
                if p < pages / 2 {
                    data::true_page_leaf(&c.seed, c.params.page_bytes, p)
                } else {
                    data::page_leaf(p, &zero)
                }
            })
            .collect(),
    );
    let trees = (trees.0, vram);
    let sm = commit_of(&k, &sc, &trees);
    let so = opening_of(&k, &c, &sm, &reveal, &trees);
    let got = verdict(&k, &sc, &sm, &so, &reveal, on_time());
    assert!(
        matches!(got, ProofVerdict::Failed(ProofFailure::WrongPages { .. })),
        "{got:?}"
    );
}

#[test]
fn with_the_default_parameters_a_provider_that_computed_ninety_percent_is_caught_with_probability_one_minus_two_to_the_minus_twenty()
 {
    // The renter's parameters for a single RTX 4090 (24 GiB) and for the CPU reference.
    let (rate, _) = params::expected_macs(ProofBackend::Cuda, &["NVIDIA GeForce RTX 4090"], 0);
    for p in [
        params::choose(ProofBackend::Cuda, rate, 24 << 30),
        params::choose(ProofBackend::CpuReference, 4e9, 24 << 30),
    ] {
        let bound = params::escape_bound(&p, 0.9);
        assert!(bound <= 2f64.powi(-20), "escape bound {bound} with {p:?}");
        // The exact chance (without replacement) is below the bound.
        let computed = (f64::from(p.rows) * 0.9).floor() as u32;
        let exact = params::escape_exact(&p, computed);
        assert!(exact <= bound, "exact {exact} above the bound {bound}");
        // And f = 0.9 means 1 - 2^-20 at least.
        assert!(1.0 - exact >= 1.0 - 2f64.powi(-20));
    }
}

#[test]
fn the_escape_rate_matches_a_simulation() {
    // A provider computing 90 % of each GEMM's rows, against many reveals: the observed escape
    // rate with 1 opened row per GEMM and 2 GEMMs is near 0.81.
    let p = ProofParams {
        gemms: 2,
        open_rows: 1,
        rows: 10,
        ..small()
    };
    let c = ProofChallenge {
        lease_id: LeaseId(Digest([1; 32])),
        params: p,
        backend: ProofBackend::CpuReference,
        seed: [7; 32],
        reveal_hash: Digest::default(),
        sent_at: Timestamp(0),
    };
    let trials = 4000u32;
    let escaped = (0..trials)
        .filter(|t| {
            let mut reveal = [0u8; 32];
            reveal[..4].copy_from_slice(&t.to_le_bytes());
            openings(&c, &Digest::default(), &reveal)
                .iter()
                .all(|i| !matches!(i, ProofIndex::Row { row: 9, .. }))
        })
        .count();
    let rate = escaped as f64 / f64::from(trials);
    let exact = params::escape_exact(&p, 9);
    assert!(
        (rate - exact).abs() < 0.03,
        "observed {rate}, exact {exact}"
    );
}

#[test]
fn a_record_whose_challenge_opens_everything_is_refused_before_anything_is_derived() {
    // A hostile record (anyone's input to `gridlease verify`): a challenge opening all of 2^24
    // rows of 256 GEMMs would make the verifier list 4 G indices. Refused on its sizes first.
    let k = keys();
    let mut r = record(&k, [1; 32], [2; 32]);
    let mut c = r.challenge.verify(&k.net).unwrap().message;
    c.params.gemms = 256;
    c.params.rows = params::MAX_ROWS;
    c.params.open_rows = params::MAX_ROWS;
    r.challenge = Signed::sign(&k.renter, &k.net, &c).unwrap();
    let got = check_record(&r, &k.net, &k.renter.public(), &k.provider.public());
    assert!(matches!(got, Err(RecordError::Sizes(_))), "{got:?}");
    // And a provider refuses it before computing.
    assert!(matches!(
        params::admit(&c.params, 1e18, 600, u64::MAX),
        Err(params::Inadmissible::Size(_))
    ));
}

#[test]
fn a_renter_never_asks_more_leaves_than_a_prover_keeps() {
    for model in [
        "NVIDIA H200",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA GeForce RTX 4090",
        "Tesla T4",
    ] {
        let (rate, _) = params::expected_macs(
            ProofBackend::Cuda,
            &[model, model, model, model, model, model, model, model],
            0,
        );
        let p = params::choose(ProofBackend::Cuda, rate, 8 * (141 << 30));
        let leaves =
            u64::from(p.gemms) * u64::from(p.rows) + p.vram_bytes / u64::from(p.page_bytes);
        assert!(leaves <= params::MAX_LEAVES, "{model}: {leaves} leaves");
        assert_eq!(
            params::admit(&p, rate, 600, u64::MAX),
            Ok(()),
            "{model}: {p:?}"
        );
    }
}

#[test]
fn a_provider_refuses_more_work_or_memory_than_its_window_and_gpus() {
    let p = params::choose(ProofBackend::CpuReference, 4e9, 1 << 30);
    assert_eq!(params::admit(&p, 4e9, 30, 1 << 30), Ok(()));
    assert!(matches!(
        params::admit(&p, 4e7, 30, 1 << 30),
        Err(params::Inadmissible::TooMuchWork { .. })
    ));
    assert!(matches!(
        params::admit(&p, 4e9, 30, 1 << 20),
        Err(params::Inadmissible::TooMuchMemory { .. })
    ));
    let odd = ProofParams { n: 100, ..p };
    assert!(matches!(
        params::admit(&odd, 4e9, 30, 1 << 30),
        Err(params::Inadmissible::Size(_))
    ));
}

#[test]
fn the_renters_check_at_the_gpu_size_stays_under_a_core_second() {
    // Not a benchmark: a bound (docs/benchmarks.md has the numbers). Release builds only.
    if cfg!(debug_assertions) {
        return;
    }
    let (rate, _) = params::expected_macs(ProofBackend::Cuda, &["NVIDIA H100 80GB HBM3"], 0);
    let p = params::choose(ProofBackend::Cuda, rate, 80 << 30);
    let start = cpu_time::ThreadTime::now();
    let b = data::b_matrix(&[1; 32], p.n);
    for i in 0..p.gemms * p.open_rows {
        let _ = data::true_row_leaf(&[1; 32], p.n, &b, i % p.gemms, i);
    }
    for pg in 0..u64::from(p.open_pages) {
        let _ = data::true_page_leaf(&[1; 32], p.page_bytes, pg);
    }
    let spent = start.elapsed();
    assert!(spent.as_secs_f64() < 1.0, "{spent:?}");
}
