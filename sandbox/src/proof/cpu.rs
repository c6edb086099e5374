//! The `cpu-reference` prover: the challenge's arithmetic on the provider's CPU, split across
//! threads, for `--dev-gpus` providers (which have no GPU). Honest and complete, labelled
//! "cpu-reference: not a GPU" wherever it shows; its rate never counts as a GPU's.
//!
//! `B` is generated once per challenge; each thread owns one `A` row and one `C` row buffer
//! for all its rows (nothing is allocated per row); the fill is a real host buffer of
//! `vram_bytes`, held until every page's leaf is hashed.

use std::time::{Duration, Instant};

use gridlease_contracts::proof::data;
use gridlease_contracts::proof::merkle::Tree;
use gridlease_contracts::proof::params;
use gridlease_protocol::Digest;
use gridlease_protocol::proof::{ProofBackend, ProofChallenge};

use super::{Computed, Prover, ProverError, check_sizes, gemm_trees, note, panic_detail};

/// The CPU reference prover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuReference {
    /// Worker threads (0 counts as 1).
    pub threads: usize,
}

impl CpuReference {
    /// A prover on `threads` threads.
    pub fn new(threads: usize) -> Self {
        Self { threads }
    }

    /// A prover on every core the process may use.
    pub fn all_cores() -> Self {
        Self::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    fn threads(&self) -> usize {
        self.threads.max(1)
    }
}

/// How long [`CpuReference::measure`] computes rows.
pub const MEASURE_FOR: Duration = Duration::from_millis(300);

impl Prover for CpuReference {
    fn backend(&self) -> ProofBackend {
        ProofBackend::CpuReference
    }

    /// `devices` is ignored: the CPU reference proves no GPU.
    fn compute(&self, c: &ProofChallenge, _devices: &[String]) -> Result<Computed, ProverError> {
        let start = Instant::now();
        let p = &c.params;
        let pages = check_sizes(p, params::CPU_REFERENCE_FILL_CAP)?;
        let threads = self.threads();
        let b = data::b_matrix(&c.seed, p.n);
        let leaves = row_leaves(c, threads, |buf, gemm, row| {
            buf.true_leaf(&c.seed, p.n, &b, gemm, row)
        })?;
        drop(b);
        let gemm_trees = gemm_trees(leaves, p.rows)?;
        let (page_leaves, fill) = fill_leaves(c, pages, threads, |_| true)?;
        let vram_tree = Tree::new(page_leaves);
        drop(fill); // Held until the tree is built.

        Ok(Computed {
            gemm_trees,
            vram_tree,
            vram_bytes: p.vram_bytes,
            work_ms: start.elapsed().as_millis() as u64,
            note: note(format!("cpu-reference: not a GPU ({threads} threads)")),
        })
    }

    /// `devices` is ignored. Runs the challenge's per-row work (generate the `A` row, the
    /// product with `B`, the leaf) at `params::N_CPU` on every thread for [`MEASURE_FOR`].
    fn measure(&self, _devices: &[String]) -> Result<f64, ProverError> {
        let n = params::N_CPU;
        let seed = [0x5a; 32];
        let b = data::b_matrix(&seed, n);
        let start = Instant::now();
        let deadline = start + MEASURE_FOR;
        let rows: u64 = std::thread::scope(|s| {
            let workers: Vec<_> = (0..self.threads())
                .map(|t| {
                    let b = &b;
                    s.spawn(move || {
                        let mut row = RowBuffers::new(n);
                        let mut done = 0u64;
                        while Instant::now() < deadline {
                            let _ = row.true_leaf(&seed, n, b, t as u32, done as u32);
                            done += 1;
                        }
                        done
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().map_err(|p| panic_detail(&*p)))
                .sum::<Result<u64, String>>()
        })
        .map_err(|detail| ProverError::Panicked { detail })?;
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        Ok(rows as f64 * f64::from(n) * f64::from(n) / secs)
    }
}

/// One thread's row buffers: an `A` row and a `C` row, reused for every row it computes.
pub(crate) struct RowBuffers {
    a: Vec<i8>,
    c: Vec<i32>,
}

impl RowBuffers {
    pub(crate) fn new(n: u32) -> Self {
        Self {
            a: vec![0; n as usize],
            c: vec![0; n as usize],
        }
    }

    /// The leaf of row `row` of `A_gemm b` (`b` the true `B`, or a cheat's).
    pub(crate) fn true_leaf(
        &mut self,
        seed: &[u8; 32],
        n: u32,
        b: &[i8],
        gemm: u32,
        row: u32,
    ) -> Digest {
        data::a_row(seed, n, gemm, row, &mut self.a);
        data::c_row(&self.a, b, &mut self.c);
        data::row_leaf(gemm, row, &self.c)
    }
}

/// The leaves of every GEMM's rows, in order (GEMM 0's rows, then GEMM 1's, ...), split in
/// contiguous runs across `threads`: `leaf(buffers, gemm, row)` for each (the honest one is
/// [`RowBuffers::true_leaf`]; the cheats' tests pass others).
pub(crate) fn row_leaves(
    c: &ProofChallenge,
    threads: usize,
    leaf: impl Fn(&mut RowBuffers, u32, u32) -> Digest + Sync,
) -> Result<Vec<Digest>, ProverError> {
    let p = &c.params;
    let rows = p.rows as usize;
    let count = p.gemms as usize * rows;
    par_leaves(
        count,
        threads,
        || RowBuffers::new(p.n),
        |buf, i| leaf(buf, (i / rows) as u32, (i % rows) as u32),
    )
}

/// The VRAM fill in host memory: `pages` pages, each generated (`seeded(page)`) or left zero
/// (a cheat's), then every page's leaf. Returns the leaves and the fill, for the caller to hold
/// until its tree is built.
pub(crate) fn fill_leaves(
    c: &ProofChallenge,
    pages: u64,
    threads: usize,
    seeded: impl Fn(u64) -> bool + Sync,
) -> Result<(Vec<Digest>, Vec<u8>), ProverError> {
    let p = &c.params;
    let page_bytes = p.page_bytes as usize;
    let len = usize::try_from(p.vram_bytes).map_err(|_| ProverError::HostAlloc {
        what: "the fill",
        bytes: p.vram_bytes,
    })?;
    let mut fill: Vec<u8> = Vec::new();
    fill.try_reserve_exact(len)
        .map_err(|_| ProverError::HostAlloc {
            what: "the fill",
            bytes: p.vram_bytes,
        })?;
    fill.resize(len, 0);
    let per_thread = (pages as usize).div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let workers: Vec<_> = fill
            .chunks_mut(per_thread * page_bytes)
            .enumerate()
            .map(|(t, run)| {
                let seeded = &seeded;
                s.spawn(move || {
                    for (i, page) in run.chunks_exact_mut(page_bytes).enumerate() {
                        let index = (t * per_thread + i) as u64;
                        if seeded(index) {
                            data::page(&c.seed, p.page_bytes, index, page);
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|p| panic_detail(&*p)))
    })
    .map_err(|detail| ProverError::Panicked { detail })?;
    let leaves = par_leaves(
        pages as usize,
        threads,
        || (),
        |_, i| data::page_leaf(i as u64, &fill[i * page_bytes..(i + 1) * page_bytes]),
    )?;
    Ok((leaves, fill))
}

/// `count` leaves, `leaf(scratch, i)` for each, in contiguous runs across `threads` threads,
/// each with its own scratch from `scratch()` (made once per thread).
pub(crate) fn par_leaves<S>(
    count: usize,
    threads: usize,
    scratch: impl Fn() -> S + Sync,
    leaf: impl Fn(&mut S, usize) -> Digest + Sync,
) -> Result<Vec<Digest>, ProverError> {
    let mut out: Vec<Digest> = Vec::new();
    out.try_reserve_exact(count)
        .map_err(|_| ProverError::HostAlloc {
            what: "the leaves",
            bytes: count as u64 * 32,
        })?;
    out.resize(count, Digest::default());
    let per_thread = count.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let workers: Vec<_> = out
            .chunks_mut(per_thread)
            .enumerate()
            .map(|(t, run)| {
                let (scratch, leaf) = (&scratch, &leaf);
                s.spawn(move || {
                    let mut st = scratch();
                    for (i, slot) in run.iter_mut().enumerate() {
                        *slot = leaf(&mut st, t * per_thread + i);
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|p| panic_detail(&*p)))
    })
    .map_err(|detail| ProverError::Panicked { detail })?;
    Ok(out)
}
