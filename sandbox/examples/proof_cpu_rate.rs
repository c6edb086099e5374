//! The CPU reference prover's rates: rows and multiply-accumulates a second at n = 1024 (the
//! CPU challenge size) and n = 4096 (the GPU size), on one thread and on every core, and the
//! rate of its fill. Run in release: `cargo run --release -p gridlease-sandbox --example
//! proof_cpu_rate`.

// An example whose product is its output.
#![allow(clippy::print_stdout)]

use std::time::Instant;

use gridlease_protocol::proof::{ProofBackend, ProofChallenge, ProofParams};
use gridlease_protocol::{Digest, LeaseId, Timestamp};
use gridlease_sandbox::proof::{CpuReference, Prover, ProverError};

fn challenge(p: ProofParams) -> ProofChallenge {
    ProofChallenge {
        lease_id: LeaseId(Digest([1; 32])),
        params: p,
        backend: ProofBackend::CpuReference,
        seed: [42; 32],
        reveal_hash: Digest::default(),
        sent_at: Timestamp(0),
    }
}

fn main() -> Result<(), ProverError> {
    let all = CpuReference::all_cores();
    println!("cores: {}", all.threads);
    for prover in [CpuReference::new(1), all] {
        println!(
            "measure() on {} threads: {:.3e} MAC/s",
            prover.threads,
            prover.measure(&[])?
        );
        for (n, rows) in [(1024u32, 64u32), (4096, 4)] {
            // 32 GEMMs (as params::choose asks) and the smallest fill: the rows' rate.
            let p = ProofParams {
                n,
                gemms: 32,
                rows,
                open_rows: 1,
                vram_bytes: 32 * 4096,
                page_bytes: 4096,
                open_pages: 32,
                limit_ms: 0,
            };
            let start = Instant::now();
            prover.compute(&challenge(p), &[])?;
            let secs = start.elapsed().as_secs_f64();
            let total = f64::from(p.gemms * p.rows);
            println!(
                "n = {n:>4}, {} threads: {:>8.1} rows/s, {:.3e} MAC/s ({} rows in {:.2} s)",
                prover.threads,
                total / secs,
                total * f64::from(n) * f64::from(n) / secs,
                total,
                secs
            );
        }
        // The fill alone: 64 MiB (the CPU reference's cap) in pages of 1 MiB, one small GEMM.
        let p = ProofParams {
            n: 64,
            gemms: 1,
            rows: 1,
            open_rows: 1,
            vram_bytes: 64 << 20,
            page_bytes: 1 << 20,
            open_pages: 32,
            limit_ms: 0,
        };
        let start = Instant::now();
        prover.compute(&challenge(p), &[])?;
        let secs = start.elapsed().as_secs_f64();
        println!(
            "fill, {} threads: 64 MiB generated and hashed at {:.0} MB/s",
            prover.threads,
            (64u64 << 20) as f64 / secs / 1e6
        );
    }
    Ok(())
}
