//! Search over a book of 100k offers: parse + match + sort + limit, timed per query.
//!
//! `cargo bench -p gridlease-contracts --bench search`
//!
//! Prints p50/p90/p99 per query over 200 runs each (after 20 warm-up runs). The book is built
//! from signed offers with a seeded mix of models, prices, VRAM, benchmarks and attestation.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use std::time::{Duration, Instant};

use gridlease_contracts::book::OfferBook;
use gridlease_contracts::query::Query;
use gridlease_protocol::fixtures::{self, T0};
use gridlease_protocol::{Attestation, NetworkId, NodeKey, OfferId, Signed};

const MODELS: [(&str, u32, u32); 6] = [
    ("NVIDIA GeForce RTX 4090", 24_564, 165_200),
    ("NVIDIA GeForce RTX 3090", 24_576, 71_000),
    ("NVIDIA GeForce RTX 4080", 16_376, 97_500),
    ("NVIDIA A100 80GB", 81_920, 312_000),
    ("NVIDIA H100", 81_559, 989_000),
    ("NVIDIA L40S", 46_068, 362_000),
];

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

fn main() {
    let n: usize = std::env::var("GRIDLEASE_BENCH_OFFERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let net = NetworkId::devnet();
    let mut book = OfferBook::with_capacity(n);
    let mut x: u64 = 0x5eed;
    let mut next = || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let t = Instant::now();
    for i in 0..n {
        let mut secret = [0u8; 32];
        secret[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
        let key = NodeKey::from_secret(secret);
        let gpus = 1 + (next() % 8) as u8;
        let price = 100_000 + next() % 900_000;
        let mut offer = fixtures::offer(key.public(), 1, gpus, price);
        let (model, vram, fp16) = MODELS[(next() % MODELS.len() as u64) as usize];
        let measured = next() % 3 == 0;
        for g in &mut offer.gpus {
            g.spec.model = model.into();
            g.spec.vram_mib = vram;
            g.bench.fp16_gflops = fp16 - (next() % 10_000) as u32;
            g.bench.attestation = if measured {
                Attestation::Measured
            } else {
                Attestation::Declared
            };
        }
        let signed = Signed::sign(&key, &net, &offer).unwrap();
        let id = OfferId(signed.envelope().content_digest());
        book.admit(signed, offer, id, T0).unwrap();
    }
    println!(
        "built a book of {} offers in {:.1} s",
        book.len(),
        t.elapsed().as_secs_f64()
    );
    let now = T0.plus_secs(1);
    for (q, limit) in [
        (
            "gpu~4090 vram>=24 price<=0.45 fp16_tflops>=100 measured=true gpus>=2",
            20,
        ),
        (
            "gpu~4090 vram>=24 price<=0.45 fp16_tflops>=100 measured=true gpus>=2 sort:price_per_tflop",
            20,
        ),
        ("sort:-fp16_tflops", 20),
        ("price<=0.9 sort:price_per_tflop", 1000),
        ("", 20),
    ] {
        let mut samples = Vec::new();
        let mut hits = 0;
        for run in 0..220 {
            let t = Instant::now();
            let query = Query::parse(q).unwrap();
            let found = book.search(&query, now, limit);
            hits = found.len();
            let took = t.elapsed();
            if run >= 20 {
                samples.push(took);
            }
        }
        samples.sort();
        println!(
            "search {q:?} limit {limit}: {hits} hits, p50={:.3} ms p90={:.3} ms p99={:.3} ms",
            pct(&samples, 50.0),
            pct(&samples, 90.0),
            pct(&samples, 99.0)
        );
    }
}
