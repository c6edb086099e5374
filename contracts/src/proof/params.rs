//! The sizes of a challenge, chosen by arithmetic (`docs/gpu.md` shows it): what the renter
//! asks for, the limit it sets, and what a provider agrees to compute unbilled.
//!
//! - **Catching partial work.** Each of the [`GEMMS`] outputs opens [`OPEN_ROWS`] random rows
//!   (chosen after the commitment): a provider that computed a fraction f of the rows escapes
//!   with probability at most f^(GEMMS x OPEN_ROWS) = f^160 (0.9^160 < 2^-24;
//!   [`escape_bound`]). Every GEMM has opened rows, so one GEMM done wrong is always caught.
//! - **The work dominates.** The rows per GEMM are set so the GEMMs take about
//!   [`TARGET_MS_GPU`] at [`EFFICIENCY_PERMILLE`] of the advertised GPUs' published dense int8
//!   rate: seconds, far above network jitter.
//! - **The renter's check stays cheap.** It regenerates `B` (n^2 bytes) and computes
//!   160 rows (160 n^2 multiply-accumulates): with n = 4096 about 2.7 G, under a core-second.

use gridlease_protocol::proof::{ProofBackend, ProofParams};

/// Independent GEMMs in a challenge.
pub const GEMMS: u32 = 32;
/// Rows opened per GEMM.
pub const OPEN_ROWS: u32 = 5;
/// Matrix dimension on GPUs.
pub const N_GPU: u32 = 4096;
/// Matrix dimension on the CPU reference (its rows are cheap enough for tests).
pub const N_CPU: u32 = 1024;
/// Bytes of one VRAM page.
pub const PAGE_BYTES: u32 = 1 << 20;
/// VRAM pages opened.
pub const OPEN_PAGES: u32 = 32;
/// The fill covers at least this share of the advertised memory, per mille.
pub const VRAM_FILL_PERMILLE: u64 = 900;
/// The CPU reference fills at most this much (a CPU has no VRAM to prove; the fill still
/// exercises the protocol).
pub const CPU_REFERENCE_FILL_CAP: u64 = 64 << 20;
/// Target GEMM time at the expected rate, GPUs.
pub const TARGET_MS_GPU: u64 = 2_000;
/// Target GEMM time at the claimed rate, CPU reference.
pub const TARGET_MS_CPU: u64 = 1_000;
/// Share of the published peak a GEMM is expected to reach, per mille.
pub const EFFICIENCY_PERMILLE: u64 = 500;
/// The limit: this many times the expected GEMM time, per mille...
pub const TOLERANCE_PERMILLE: u64 = 2_000;
/// ...plus this for set-up (generating the matrices, starting the work).
pub const SETUP_ALLOWANCE_MS: u64 = 500;
/// ...plus the fill and the hashing at this rate, bytes per millisecond (GPU: 20 GB/s).
pub const FILL_BYTES_PER_MS_GPU: u64 = 20_000_000;
/// The same on the CPU reference (200 MB/s).
pub const FILL_BYTES_PER_MS_CPU: u64 = 200_000;
/// Largest matrix dimension a provider computes (within `data::MAX_EXACT_N`).
pub const MAX_N: u32 = 8_192;
const _: () = assert!(MAX_N <= super::data::MAX_EXACT_N);
/// Most rows of one GEMM a provider computes.
pub const MAX_ROWS: u32 = 1 << 24;
/// Most leaves of one challenge, rows and pages together (a prover keeps every leaf and its
/// tree until the openings: 2^25 leaves are 1 GiB of leaves, 2 GiB with the trees). The
/// renter sizes its challenge under it: on the fastest GPUs the GEMMs then take less than the
/// target time (an H100 SXM: about 1.1 s at half its published rate, still far above jitter).
pub const MAX_LEAVES: u64 = 1 << 25;

/// A published dense int8 tensor rate (no sparsity), tera-operations per second (an
/// operation is a multiply or an add: 2 per multiply-accumulate). Sources in `docs/gpu.md`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PublishedRate {
    /// A substring of the model name, lowercase (the most specific first in [`RATES`]).
    pub model: &'static str,
    /// Dense int8 TOPS.
    pub int8_tops: f64,
}

/// The table, most specific names first.
pub const RATES: &[PublishedRate] = &[
    PublishedRate {
        model: "h200",
        int8_tops: 1979.0,
    },
    PublishedRate {
        model: "h100 pcie",
        int8_tops: 1513.0,
    },
    PublishedRate {
        model: "h100",
        int8_tops: 1979.0,
    },
    PublishedRate {
        model: "a100",
        int8_tops: 624.0,
    },
    PublishedRate {
        model: "l40s",
        int8_tops: 733.0,
    },
    PublishedRate {
        model: "l40",
        int8_tops: 362.0,
    },
    PublishedRate {
        model: "l4",
        int8_tops: 242.5,
    },
    PublishedRate {
        model: "a10",
        int8_tops: 250.0,
    },
    PublishedRate {
        model: "t4",
        int8_tops: 130.0,
    },
    PublishedRate {
        model: "rtx 4090",
        int8_tops: 660.6,
    },
    PublishedRate {
        model: "rtx 4080",
        int8_tops: 389.9,
    },
    PublishedRate {
        model: "rtx 3090",
        int8_tops: 284.0,
    },
    PublishedRate {
        model: "rtx 3080",
        int8_tops: 238.0,
    },
];

/// The published rate of `model`, if the table has it.
pub fn published(model: &str) -> Option<PublishedRate> {
    let m = model.to_ascii_lowercase();
    RATES.iter().copied().find(|r| m.contains(r.model))
}

/// Where the expected rate came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RateSource {
    /// The published table, for every leased GPU.
    Published,
    /// The provider's own claim in its offer (a model the table lacks, or `cpu-reference`).
    Claimed,
}

/// The expected rate of the leased GPUs (one model name each), multiply-accumulates per
/// second: the published rate of each model times the expected efficiency, or, where the
/// table lacks a model or the backend is the CPU reference, the offer's claim per GPU
/// (`claimed_mmacs`, millions) times the leased GPUs.
pub fn expected_macs(
    backend: ProofBackend,
    models: &[&str],
    claimed_mmacs: u64,
) -> (f64, RateSource) {
    let claimed = || {
        let gpus = models.len().max(1) as f64;
        (claimed_mmacs as f64 * 1e6 * gpus, RateSource::Claimed)
    };
    if backend == ProofBackend::CpuReference || models.is_empty() {
        return claimed();
    }
    let mut sum = 0.0;
    for m in models {
        match published(m) {
            Some(r) => sum += r.int8_tops * 1e12 / 2.0 * EFFICIENCY_PERMILLE as f64 / 1000.0,
            None => return claimed(),
        }
    }
    (sum, RateSource::Published)
}

/// Multiply-accumulates of a challenge's GEMMs.
pub fn work_macs(p: &ProofParams) -> u128 {
    u128::from(p.gemms) * u128::from(p.rows) * u128::from(p.n) * u128::from(p.n)
}

/// The renter's challenge sizes for GPUs expected to do `macs_per_s`, advertising
/// `vram_bytes` in all, and its limit on seed-to-commitment time.
pub fn choose(backend: ProofBackend, macs_per_s: f64, vram_bytes: u64) -> ProofParams {
    let (n, target_ms, fill_rate) = match backend {
        ProofBackend::Cuda => (N_GPU, TARGET_MS_GPU, FILL_BYTES_PER_MS_GPU),
        ProofBackend::CpuReference => (N_CPU, TARGET_MS_CPU, FILL_BYTES_PER_MS_CPU),
    };
    let per_row = f64::from(n) * f64::from(n);
    let rows_f = macs_per_s.max(1.0) * target_ms as f64 / 1000.0 / per_row / f64::from(GEMMS);
    let mut fill = vram_bytes.saturating_mul(VRAM_FILL_PERMILLE).div_ceil(1000);
    if backend == ProofBackend::CpuReference {
        fill = fill.min(CPU_REFERENCE_FILL_CAP);
    }
    let pages = fill
        .div_ceil(u64::from(PAGE_BYTES))
        .max(u64::from(OPEN_PAGES));
    // Rows and pages together within MAX_LEAVES.
    let most_rows = (MAX_LEAVES.saturating_sub(pages) / u64::from(GEMMS)).min(u64::from(MAX_ROWS));
    let most_rows = u32::try_from(most_rows).unwrap_or(MAX_ROWS).max(OPEN_ROWS);
    let rows = (rows_f.ceil() as u32).clamp(OPEN_ROWS, most_rows);
    let mut p = ProofParams {
        n,
        gemms: GEMMS,
        rows,
        open_rows: OPEN_ROWS,
        vram_bytes: pages * u64::from(PAGE_BYTES),
        page_bytes: PAGE_BYTES,
        open_pages: OPEN_PAGES,
        limit_ms: 0,
    };
    let expected_ms = (work_macs(&p) as f64 / macs_per_s.max(1.0) * 1000.0).ceil() as u64;
    p.limit_ms = expected_ms.saturating_mul(TOLERANCE_PERMILLE) / 1000
        + SETUP_ALLOWANCE_MS
        + p.vram_bytes / fill_rate;
    p
}

/// Why a provider refuses to compute a challenge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Inadmissible {
    /// A size outside what any honest renter asks.
    #[error("{0}")]
    Size(String),
    /// More work than the window allows at the provider's own rate.
    #[error(
        "the challenge takes about {expected_ms} ms at this provider's rate, more than half of its {window_s} s window"
    )]
    TooMuchWork {
        /// At the provider's rate.
        expected_ms: u64,
        /// Its window.
        window_s: u32,
    },
    /// A bigger fill than the provider has.
    #[error("the challenge fills {asked} bytes; this provider has {have}")]
    TooMuchMemory {
        /// Asked.
        asked: u64,
        /// What the provider has for the leased GPUs.
        have: u64,
    },
}

/// Whether a provider computes `p` unbilled: sizes within bounds, the GEMMs within half of the
/// window at `own_macs_per_s` (its own rate for the leased GPUs), the fill within `vram_bytes`
/// (the leased GPUs' memory; the CPU reference's cap). A renter cannot make a provider work
/// for free beyond that.
pub fn admit(
    p: &ProofParams,
    own_macs_per_s: f64,
    window_s: u32,
    vram_bytes: u64,
) -> Result<(), Inadmissible> {
    let size = |what: String| Err(Inadmissible::Size(what));
    if !(64..=MAX_N).contains(&p.n) || !p.n.is_multiple_of(64) {
        return size(format!("n = {} (64..={MAX_N}, a multiple of 64)", p.n));
    }
    if p.gemms == 0 || p.gemms > 256 || p.rows == 0 || p.rows > MAX_ROWS {
        return size(format!("{} GEMMs of {} rows", p.gemms, p.rows));
    }
    let leaves =
        u64::from(p.gemms) * u64::from(p.rows) + p.vram_bytes / u64::from(p.page_bytes.max(1));
    if leaves > MAX_LEAVES {
        return size(format!("{leaves} leaves, at most {MAX_LEAVES}"));
    }
    let opened = u64::from(p.gemms) * u64::from(p.open_rows) + u64::from(p.open_pages);
    if p.open_rows == 0
        || p.open_rows > p.rows
        || p.open_pages == 0
        || opened > gridlease_protocol::proof::MAX_PROOF_OPENINGS as u64
    {
        return size(format!(
            "{opened} openings (1..={} in all, at most the rows)",
            gridlease_protocol::proof::MAX_PROOF_OPENINGS
        ));
    }
    if !(4096..=(16 << 20)).contains(&p.page_bytes)
        || p.vram_bytes == 0
        || !p.vram_bytes.is_multiple_of(u64::from(p.page_bytes))
        || p.vram_bytes / u64::from(p.page_bytes) < u64::from(p.open_pages)
    {
        return size(format!(
            "a fill of {} bytes in pages of {}",
            p.vram_bytes, p.page_bytes
        ));
    }
    if p.vram_bytes > vram_bytes {
        return Err(Inadmissible::TooMuchMemory {
            asked: p.vram_bytes,
            have: vram_bytes,
        });
    }
    let expected_ms = (work_macs(p) as f64 / own_macs_per_s.max(1.0) * 1000.0).ceil() as u64;
    if expected_ms > u64::from(window_s) * 1000 / 2 {
        return Err(Inadmissible::TooMuchWork {
            expected_ms,
            window_s,
        });
    }
    Ok(())
}

/// Upper bound on the chance that a provider which computed only a fraction `f` of the rows
/// of every GEMM (on average) escapes: `f^(gemms x open_rows)` (sampling without
/// replacement within a GEMM only lowers it; the product over GEMMs is largest when the
/// computed fraction is the same in each, by the AM-GM inequality).
pub fn escape_bound(p: &ProofParams, f: f64) -> f64 {
    f.clamp(0.0, 1.0)
        .powf(f64::from(p.gemms) * f64::from(p.open_rows))
}

/// The exact chance of escape when `computed` of the `rows` rows of each GEMM are right:
/// every opened row (drawn without replacement) is one of them, in every GEMM.
pub fn escape_exact(p: &ProofParams, computed: u32) -> f64 {
    let mut per_gemm = 1.0;
    for k in 0..p.open_rows {
        if computed < k {
            return 0.0;
        }
        per_gemm *= f64::from(computed - k) / f64::from(p.rows - k);
    }
    per_gemm.powf(f64::from(p.gemms))
}
