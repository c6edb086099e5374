//! The renter's CPU cost of a proof-of-GPU check (issue 44): regenerating `B`, recomputing
//! every opened row and every opened VRAM page, at the parameters a renter chooses for an
//! RTX 4090, an H100 and the CPU reference; the median of ROUNDS, on one core (thread CPU
//! time), release build.
//!
//! `cargo run --release -p gridlease-contracts --example bench_proof_check -- [ROUNDS]`

#![allow(clippy::unwrap_used, clippy::print_stdout)]

use gridlease_contracts::proof::{data, params};
use gridlease_protocol::proof::ProofBackend;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let cases = [
        (
            "RTX 4090, 24 GiB",
            ProofBackend::Cuda,
            "NVIDIA GeForce RTX 4090",
            24u64 << 30,
        ),
        (
            "H100 SXM, 80 GiB",
            ProofBackend::Cuda,
            "NVIDIA H100 80GB HBM3",
            80 << 30,
        ),
        (
            "cpu-reference (4 GMAC/s claimed)",
            ProofBackend::CpuReference,
            "",
            24 << 30,
        ),
    ];
    println!(
        "| case | n | rows opened | pages opened | B bytes | renter CPU (median of {rounds}) |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, backend, model, vram) in cases {
        let rate = if backend == ProofBackend::Cuda {
            params::expected_macs(backend, &[model], 0).0
        } else {
            4e9
        };
        let p = params::choose(backend, rate, vram);
        let mut times = Vec::new();
        for r in 0..rounds {
            let seed = [r as u8; 32];
            let start = cpu_time::ThreadTime::now();
            let b = data::b_matrix(&seed, p.n);
            for i in 0..p.gemms * p.open_rows {
                let _ = data::true_row_leaf(&seed, p.n, &b, i % p.gemms, i);
            }
            for pg in 0..u64::from(p.open_pages) {
                let _ = data::true_page_leaf(&seed, p.page_bytes, pg);
            }
            times.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        println!(
            "| {name} | {} | {} | {} | {} MiB | {:.0} ms |",
            p.n,
            p.gemms * p.open_rows,
            p.open_pages,
            (u64::from(p.n) * u64::from(p.n)) >> 20,
            median(&mut times)
        );
    }
}
