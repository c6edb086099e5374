//! Cheating provers, for tests only (compiled with the `faults` feature; a build without it has
//! none of this): a [`Prover`] that commits to something other than the honest work, so tests
//! can show the renter's check catches each way of skimping.
//!
//! Where a cheat does part of the work honestly, that part runs on the CPU (the reference's
//! arithmetic) or, for [`Cheat::ZeroB`] and [`Cheat::FakeFill`], in the inner prover, whose
//! trees are then changed.

use std::time::Instant;

use gridlease_contracts::proof::data;
use gridlease_contracts::proof::merkle::Tree;
use gridlease_protocol::Digest;
use gridlease_protocol::proof::{ProofBackend, ProofChallenge, ProofParams};

use super::cpu::{fill_leaves, row_leaves};
use super::{Computed, Prover, ProverError, check_sizes, gemm_trees};

/// Threads the CPU parts of a cheat run on.
const THREADS: usize = 4;

/// A way to cheat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cheat {
    /// Random leaves for every GEMM row: no GEMM at all (the fill is honest).
    RandomOutput,
    /// Only the first `permille`/1000 of each GEMM's rows computed; the rest get the leaf of
    /// a zero row (the fill is honest).
    PartialRows {
        /// Share of each GEMM's rows computed, per mille.
        permille: u32,
    },
    /// GEMM `gemm` computed with `B` replaced by zeros (every other GEMM honest).
    ZeroB {
        /// The GEMM.
        gemm: u32,
    },
    /// Only the first `permille`/1000 of the fill's pages are the seeded pages, the rest zero
    /// pages, while the commitment still claims the full `vram_bytes`.
    FakeFill {
        /// Share of pages seeded, per mille.
        permille: u32,
    },
}

/// A prover that cheats as `cheat` says, honest where the cheat leaves it (through `inner`
/// or the CPU).
#[derive(Clone, Debug)]
pub struct Cheating<P: Prover> {
    /// The honest prover the cheat starts from (its backend and rate are claimed).
    pub inner: P,
    /// How it cheats.
    pub cheat: Cheat,
}

/// The first `permille`/1000 of `total` (rounded down).
fn share(total: u64, permille: u32) -> u64 {
    total * u64::from(permille.min(1000)) / 1000
}

/// A leaf that is no row's: keyed by the seed so it differs per challenge.
fn random_leaf(seed: &[u8; 32], gemm: u32, row: u32) -> Digest {
    let mut bytes = [0u8; 40];
    bytes[..32].copy_from_slice(seed);
    bytes[32..36].copy_from_slice(&gemm.to_le_bytes());
    bytes[36..].copy_from_slice(&row.to_le_bytes());
    Digest::of("gridlease/test/random-leaf", &bytes)
}

impl<P: Prover> Prover for Cheating<P> {
    fn backend(&self) -> ProofBackend {
        self.inner.backend()
    }

    fn compute(&self, c: &ProofChallenge, devices: &[String]) -> Result<Computed, ProverError> {
        let start = Instant::now();
        let p = &c.params;
        // Sizes as any prover checks them (no cap of its own on the fill).
        let pages = check_sizes(p, u64::MAX)?;
        let honest_fill = || fill_leaves(c, pages, THREADS, |_| true).map(|(l, _)| Tree::new(l));
        let mut out = match self.cheat {
            Cheat::RandomOutput => {
                let leaves = row_leaves(c, THREADS, |_, g, r| random_leaf(&c.seed, g, r))?;
                Computed {
                    gemm_trees: gemm_trees(leaves, p.rows)?,
                    vram_tree: honest_fill()?,
                    vram_bytes: p.vram_bytes,
                    work_ms: 0,
                    note: String::new(),
                }
            }
            Cheat::PartialRows { permille } => {
                let computed = share(u64::from(p.rows), permille);
                let b = data::b_matrix(&c.seed, p.n);
                let zero_row = vec![0i32; p.n as usize];
                let leaves = row_leaves(c, THREADS, |buf, g, r| {
                    if u64::from(r) < computed {
                        buf.true_leaf(&c.seed, p.n, &b, g, r)
                    } else {
                        data::row_leaf(g, r, &zero_row)
                    }
                })?;
                Computed {
                    gemm_trees: gemm_trees(leaves, p.rows)?,
                    vram_tree: honest_fill()?,
                    vram_bytes: p.vram_bytes,
                    work_ms: 0,
                    note: String::new(),
                }
            }
            Cheat::ZeroB { gemm } => {
                let mut honest = self.inner.compute(c, devices)?;
                if let Some(t) = honest.gemm_trees.get_mut(gemm as usize) {
                    // That GEMM's rows, really multiplied by a B of zeros.
                    let zeros = vec![0i8; (p.n as usize) * (p.n as usize)];
                    let one = ProofChallenge {
                        params: ProofParams { gemms: 1, ..*p },
                        ..c.clone()
                    };
                    let leaves = row_leaves(&one, THREADS, |buf, _, r| {
                        buf.true_leaf(&c.seed, p.n, &zeros, gemm, r)
                    })?;
                    *t = Tree::new(leaves);
                }
                honest
            }
            Cheat::FakeFill { permille } => {
                let mut honest = self.inner.compute(c, devices)?;
                let seeded = share(pages, permille);
                honest.vram_tree =
                    Tree::new(fill_leaves(c, pages, THREADS, |page| page < seeded)?.0);
                honest.vram_bytes = p.vram_bytes;
                honest
            }
        };
        if out.note.is_empty() {
            out.note = format!("{} (test prover)", self.backend().label());
        }
        out.work_ms = out.work_ms.max(start.elapsed().as_millis() as u64);
        Ok(out)
    }

    fn measure(&self, devices: &[String]) -> Result<f64, ProverError> {
        self.inner.measure(devices)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proof::CpuReference;
    use crate::proof::tests::{small_challenge, verdict_of};
    use gridlease_protocol::proof::{ProofFailure, ProofIndex, ProofVerdict};

    fn cheater(cheat: Cheat) -> Cheating<CpuReference> {
        Cheating {
            inner: CpuReference::new(2),
            cheat,
        }
    }

    #[test]
    fn the_honest_reference_passes_and_every_cheat_fails_the_contracts_check() {
        for seed in [1u8, 2, 3] {
            let (c, reveal) = small_challenge([seed; 32]);
            let honest = CpuReference::new(2).compute(&c, &[]).unwrap();
            assert_eq!(verdict_of(&c, &reveal, &honest), ProofVerdict::Passed);
            for (cheat, wanted) in [
                (Cheat::RandomOutput, "WrongRows"),
                (Cheat::PartialRows { permille: 500 }, "WrongRows"),
                (Cheat::PartialRows { permille: 0 }, "WrongRows"),
                (Cheat::ZeroB { gemm: 1 }, "WrongRows"),
                (Cheat::FakeFill { permille: 500 }, "WrongPages"),
                (Cheat::FakeFill { permille: 0 }, "WrongPages"),
            ] {
                let computed = cheater(cheat).compute(&c, &[]).unwrap();
                assert_eq!(computed.vram_bytes, c.params.vram_bytes);
                let got = verdict_of(&c, &reveal, &computed);
                let name = match &got {
                    ProofVerdict::Failed(ProofFailure::WrongRows { .. }) => "WrongRows",
                    ProofVerdict::Failed(ProofFailure::WrongPages { .. }) => "WrongPages",
                    _ => "other",
                };
                assert_eq!(name, wanted, "{cheat:?} with seed {seed}: {got:?}");
            }
        }
    }

    #[test]
    fn a_zeroed_b_is_caught_in_its_own_gemm_and_the_others_are_untouched() {
        let (c, reveal) = small_challenge([7; 32]);
        let honest = CpuReference::new(2).compute(&c, &[]).unwrap();
        let cheated = cheater(Cheat::ZeroB { gemm: 2 }).compute(&c, &[]).unwrap();
        for (g, (h, x)) in honest
            .gemm_trees
            .iter()
            .zip(&cheated.gemm_trees)
            .enumerate()
        {
            assert_eq!(h.root() == x.root(), g != 2, "GEMM {g}");
        }
        let got = verdict_of(&c, &reveal, &cheated);
        assert!(
            matches!(
                got,
                ProofVerdict::Failed(ProofFailure::WrongRows {
                    first: ProofIndex::Row { gemm: 2, .. },
                    ..
                })
            ),
            "{got:?}"
        );
    }

    #[test]
    fn partial_rows_keep_the_computed_rows_true() {
        let (c, _) = small_challenge([8; 32]);
        let honest = CpuReference::new(1).compute(&c, &[]).unwrap();
        let cheated = cheater(Cheat::PartialRows { permille: 500 })
            .compute(&c, &[])
            .unwrap();
        let half = u64::from(c.params.rows) / 2;
        for (h, x) in honest.gemm_trees.iter().zip(&cheated.gemm_trees) {
            for r in 0..u64::from(c.params.rows) {
                assert_eq!(h.leaf(r) == x.leaf(r), r < half, "row {r}");
            }
        }
    }
}
