//! Proof of GPU, the provider's side: the provers that answer a renter's challenge
//! (`gridlease_contracts::proof`). TEMPORARY minimal version (replaced by the full one).

use gridlease_contracts::proof::{data, merkle::Tree};
use gridlease_protocol::proof::{ProofBackend, ProofChallenge};

/// What a prover computed: one tree per GEMM, the fill's tree.
pub struct Computed {
    /// One tree per GEMM output, in order.
    pub gemm_trees: Vec<Tree>,
    /// The fill's tree.
    pub vram_tree: Tree,
    /// Bytes filled.
    pub vram_bytes: u64,
    /// Milliseconds of work.
    pub work_ms: u64,
    /// A note.
    pub note: String,
}

/// Why a prover could not answer.
#[derive(Debug, thiserror::Error)]
pub enum ProverError {
    /// Anything.
    #[error("{0}")]
    Failed(String),
}

/// A prover.
pub trait Prover: Send + Sync + 'static {
    /// Its backend.
    fn backend(&self) -> ProofBackend;
    /// Computes a challenge.
    fn compute(&self, c: &ProofChallenge, devices: &[String]) -> Result<Computed, ProverError>;
    /// Multiply-accumulates per second.
    fn measure(&self, devices: &[String]) -> Result<f64, ProverError>;
}

/// The CPU reference.
pub struct CpuReference {
    /// Threads.
    pub threads: usize,
}

impl Prover for CpuReference {
    fn backend(&self) -> ProofBackend {
        ProofBackend::CpuReference
    }

    fn compute(&self, c: &ProofChallenge, _devices: &[String]) -> Result<Computed, ProverError> {
        let start = std::time::Instant::now();
        let p = &c.params;
        let b = data::b_matrix(&c.seed, p.n);
        let gemm_trees = (0..p.gemms)
            .map(|g| {
                Tree::new(
                    (0..p.rows)
                        .map(|r| data::true_row_leaf(&c.seed, p.n, &b, g, r))
                        .collect(),
                )
            })
            .collect();
        let pages = p.vram_bytes / u64::from(p.page_bytes);
        let vram_tree = Tree::new(
            (0..pages)
                .map(|pg| data::true_page_leaf(&c.seed, p.page_bytes, pg))
                .collect(),
        );
        Ok(Computed {
            gemm_trees,
            vram_tree,
            vram_bytes: p.vram_bytes,
            work_ms: start.elapsed().as_millis() as u64,
            note: "cpu-reference: not a GPU".into(),
        })
    }

    fn measure(&self, _devices: &[String]) -> Result<f64, ProverError> {
        let n = 1024u32;
        let b = data::b_matrix(&[0; 32], n);
        let start = std::time::Instant::now();
        let rows = 32;
        for r in 0..rows {
            let _ = data::true_row_leaf(&[0; 32], n, &b, 0, r);
        }
        Ok(f64::from(rows) * f64::from(n) * f64::from(n) / start.elapsed().as_secs_f64().max(1e-6))
    }
}
