//! Proof of GPU (issue 44), the provider's side: the [`Prover`] that computes a renter's
//! challenge (its K int8 GEMMs and its VRAM fill, every row and page hashed into the leaves of
//! Merkle trees), on the leased GPUs ([`Cuda`]) or on the CPU ([`CpuReference`], for
//! `--dev-gpus` providers; never presented as a GPU).
//!
//! The rules (the seeded data, the leaves, the trees, the sizes) are
//! `gridlease_contracts::proof`; a prover must give exactly the leaves `proof::data` defines,
//! and the tests here hold every backend to the contracts' own `check`.
//!
//! What a prover must never do: allocate beyond what the challenge's parameters ask once they
//! passed `params::admit`'s bounds ([`check_sizes`] runs first), panic on a bad challenge or a
//! machine without CUDA, or touch GPUs other than the ones it is given.

pub mod cpu;
pub mod cuda;
#[cfg(feature = "faults")]
pub mod faults;
pub mod selfcheck;

use gridlease_contracts::proof::merkle::Tree;
use gridlease_contracts::proof::params::{self, Inadmissible};
use gridlease_protocol::proof::{ProofBackend, ProofChallenge, ProofParams};

pub use cpu::CpuReference;
pub use cuda::Cuda;

/// Most leaves (GEMM rows of all GEMMs, and pages) a prover builds trees over: a bound of its
/// own on top of `params::admit`'s, so the host memory of the leaves and trees (64 bytes a
/// leaf, about) stays under 2 GiB whatever a renter asks. The renter's own sizes
/// (`params::choose`) stay far below it: about 60 000 rows and 130 000 pages for eight H200s.
pub const MAX_LEAVES: u64 = gridlease_contracts::proof::params::MAX_LEAVES;

/// What a prover computed for one challenge: the trees the provider commits to and opens.
#[derive(Clone, Debug)]
pub struct Computed {
    /// One tree per GEMM, in order, over the leaves of its output's rows.
    pub gemm_trees: Vec<Tree>,
    /// The tree over the leaves of the VRAM fill's pages.
    pub vram_tree: Tree,
    /// Bytes filled (what the commitment states).
    pub vram_bytes: u64,
    /// The prover's own measurement of the work, milliseconds (the commitment's `work_ms`).
    pub work_ms: u64,
    /// Free text for the commitment's note (at most `MAX_PROOF_TEXT` bytes).
    pub note: String,
}

/// Computes challenges. Blocking calls: the node runs them in `spawn_blocking`.
pub trait Prover: Send + Sync + 'static {
    /// The backend this prover is, as commitments name it.
    fn backend(&self) -> ProofBackend;

    /// Runs the challenge's K GEMMs (`C_i = A_i B`, every row hashed into leaves, one Merkle
    /// tree per GEMM) and the VRAM fill (`params.vram_bytes` in pages of `params.page_bytes`,
    /// each page's leaf, one tree) on `devices` (NVML UUIDs of the leased GPUs; empty for the
    /// CPU reference). Holds the fill allocated until the trees are built. Gives exactly the
    /// leaves `gridlease_contracts::proof::data` defines.
    fn compute(&self, c: &ProofChallenge, devices: &[String]) -> Result<Computed, ProverError>;

    /// Multiply-accumulates per second this prover reaches on `devices` (a short measurement,
    /// under a second), for the offer's claimed rate.
    fn measure(&self, devices: &[String]) -> Result<f64, ProverError>;
}

/// Why a prover did not compute a challenge.
#[derive(Debug, thiserror::Error)]
pub enum ProverError {
    /// The challenge's sizes are outside `params::admit`'s bounds.
    #[error("the challenge's sizes are refused: {0}")]
    Params(#[from] Inadmissible),
    /// More leaves than [`MAX_LEAVES`].
    #[error("the challenge has {leaves} leaves (rows and pages), this prover builds at most {max}")]
    TooManyLeaves {
        /// Rows of all GEMMs plus pages.
        leaves: u64,
        /// [`MAX_LEAVES`].
        max: u64,
    },
    /// The fill does not fit in what the device (or the host) has free.
    #[error(
        "cannot allocate the VRAM fill: {:.1} GiB asked, {:.1} GiB free{}",
        gib(*asked),
        gib(*free),
        on_device(device)
    )]
    VramAlloc {
        /// Bytes asked (this device's share of the fill).
        asked: u64,
        /// Bytes free when asked.
        free: u64,
        /// The device (empty for the host).
        device: String,
    },
    /// A host buffer could not be allocated.
    #[error("cannot allocate {what} in host memory: {bytes} bytes")]
    HostAlloc {
        /// What it was for.
        what: &'static str,
        /// Its size.
        bytes: u64,
    },
    /// No CUDA driver, library or device.
    #[error("CUDA unavailable: {detail}")]
    CudaUnavailable {
        /// What is missing.
        detail: String,
    },
    /// The CUDA prover was given no GPU.
    #[error("no GPU named: the CUDA prover computes on the leased GPUs' UUIDs")]
    NoDevices,
    /// A UUID that no CUDA device has.
    #[error("no CUDA device has UUID {uuid}")]
    UnknownDevice {
        /// The UUID asked for.
        uuid: String,
    },
    /// A UUID named twice.
    #[error("GPU {uuid} is named twice")]
    DuplicateDevice {
        /// The UUID.
        uuid: String,
    },
    /// A CUDA driver call failed.
    #[error("cuda {op} failed on {device}: {detail}")]
    Driver {
        /// Which call.
        op: &'static str,
        /// The device.
        device: String,
        /// The driver's error.
        detail: String,
    },
    /// A cuBLAS call failed.
    #[error("cublas {op} failed on {device}: {detail}")]
    Cublas {
        /// Which call.
        op: &'static str,
        /// The device.
        device: String,
        /// The error.
        detail: String,
    },
    /// NVRTC did not compile the kernels.
    #[error("the proof kernels did not compile: {detail}")]
    Compile {
        /// NVRTC's log.
        detail: String,
    },
    /// The device's results do not have the shape asked (a driver or kernel fault).
    #[error("the device returned {got} leaves for {want}")]
    ShortResult {
        /// Leaves returned.
        got: u64,
        /// Leaves asked.
        want: u64,
    },
    /// A message of the self-check could not be encoded (`selfcheck`).
    #[error("the self-check's messages could not be encoded: {detail}")]
    Encode {
        /// The codec's error.
        detail: String,
    },
    /// A worker panicked (caught).
    #[error("the prover panicked: {detail}")]
    Panicked {
        /// The panic message.
        detail: String,
    },
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

fn on_device(device: &str) -> String {
    if device.is_empty() {
        String::new()
    } else {
        format!(" on {device}")
    }
}

/// Checks a challenge's sizes before anything is allocated: `params::admit`'s bounds (with no
/// limit of rate or window: those are the node's to apply against its offer), a fill of at
/// most `max_fill` bytes, and at most [`MAX_LEAVES`] leaves. Returns the number of pages.
pub fn check_sizes(p: &ProofParams, max_fill: u64) -> Result<u64, ProverError> {
    params::admit(p, f64::MAX, u32::MAX, max_fill)?;
    let pages = p.vram_bytes / u64::from(p.page_bytes);
    let leaves = u64::from(p.gemms) * u64::from(p.rows) + pages;
    if leaves > MAX_LEAVES {
        return Err(ProverError::TooManyLeaves {
            leaves,
            max: MAX_LEAVES,
        });
    }
    Ok(pages)
}

/// The panic message of a caught panic.
pub(crate) fn panic_detail(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Cuts `leaves` (every GEMM's rows in order, `rows` each) into one tree per GEMM.
pub(crate) fn gemm_trees(
    leaves: Vec<gridlease_protocol::Digest>,
    rows: u32,
) -> Result<Vec<Tree>, ProverError> {
    let rows = rows as usize;
    if rows == 0 || !leaves.len().is_multiple_of(rows) {
        return Err(ProverError::ShortResult {
            got: leaves.len() as u64,
            want: rows as u64,
        });
    }
    Ok(leaves.chunks(rows).map(|c| Tree::new(c.to_vec())).collect())
}

/// The note of a commitment, cut to `MAX_PROOF_TEXT` bytes on a character boundary.
pub(crate) fn note(text: String) -> String {
    let max = gridlease_protocol::proof::MAX_PROOF_TEXT;
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

#[cfg(test)]
mod tests;
