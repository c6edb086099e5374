//! The provider's prover as its lease sessions share it ([`SharedProver`]): the prover
//! (`gridlease_sandbox::proof`), the rate it claims and the memory it may fill.

use std::sync::Arc;

use gridlease_protocol::proof::ProofChallenge;
use gridlease_sandbox::proof::Computed;

/// The provider's prover, shared by its sessions, with the rate it claims per offered GPU.
#[derive(Clone)]
pub struct SharedProver {
    /// The prover.
    pub prover: Arc<dyn gridlease_sandbox::proof::Prover>,
    /// Multiply-accumulates per second per GPU it claims (the offer's `claimed_mmacs` over
    /// its GPUs): what it admits challenges against.
    pub macs_per_gpu: f64,
    /// Bytes of memory per leased GPU it can fill (the GPUs' VRAM; the CPU reference's cap).
    pub vram_per_gpu: u64,
}

impl SharedProver {
    /// Bytes it may fill for a lease of `gpus`.
    pub(crate) fn vram_for(&self, gpus: &[gridlease_protocol::Digest]) -> u64 {
        self.vram_per_gpu.saturating_mul(gpus.len().max(1) as u64)
    }

    /// Computes `c` on `devices` (blocking).
    pub(crate) fn compute(
        &self,
        c: &ProofChallenge,
        devices: &[String],
    ) -> Result<Computed, gridlease_sandbox::proof::ProverError> {
        self.prover.compute(c, devices)
    }
}

impl std::fmt::Debug for SharedProver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedProver({})", self.prover.backend())
    }
}
