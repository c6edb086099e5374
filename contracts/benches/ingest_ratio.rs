//! Ingestion rate as a ratio of the raw `verify_strict` rate, robust to a noisy shared machine:
//! the variants are measured in interleaved rounds, in thread CPU time (not wall time, which
//! other processes on a shared machine inflate), and the median of per-round ratios is reported. `cargo bench -p gridlease-contracts --bench ingest_ratio`
//!
//! Variants (all per offer, 4-GPU offers, the same signed-input size):
//! - `raw`: one `verify_strict` with an already decompressed key (the ceiling);
//! - `single`: full pipeline, one frame at a time (decode envelope, strict verify, decode
//!   payload, validate), every frame new, provider keys seen before;
//! - `batch64_new`: 64 new frames per call through batch verification, keys seen before;
//! - `batch64_half_reannounced`: 64 frames per call of which half were verified before
//!   (providers re-announcing), the steady state of the gossip network.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use cpu_time::ThreadTime as Instant;
use std::hint::black_box;

use ed25519_dalek::{Signature, Signer, SigningKey};
use gridlease_contracts::ingest::OfferIngestor;
use gridlease_protocol::fixtures::{self, T0};
use gridlease_protocol::{NetworkId, NodeKey, Signed};

const PROVIDERS: u64 = 16;
const ROUNDS: usize = 61;
const PER_ROUND: usize = 256;

fn frame(net: &NetworkId, provider: u64, seq: u64) -> Vec<u8> {
    let key = NodeKey::from_secret([provider as u8 + 1; 32]);
    let offer = fixtures::offer(key.public(), seq, 4, 400_000);
    Signed::sign(&key, net, &offer).unwrap().to_bytes().unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let net = NetworkId::devnet();
    let now = T0.plus_secs(1);
    // Frames: ROUNDS * PER_ROUND distinct offers, so nothing is ever re-verified by accident.
    let total = ROUNDS * PER_ROUND * 2;
    let frames: Vec<Vec<u8>> = (0..total as u64)
        .map(|i| frame(&net, i % PROVIDERS, i / PROVIDERS + 1))
        .collect();
    let sample = gridlease_protocol::Signed::<gridlease_protocol::Offer>::from_bytes(&frames[0])
        .unwrap()
        .into_envelope();
    let input = sample.signing_input();
    let sk = SigningKey::from_bytes(&[1; 32]);
    let vk = sk.verifying_key();
    let sig: Signature = sk.sign(&input);

    // One ingestor throughout, remembering only a few verified frames; warm its key cache.
    let mut ing = OfferIngestor::new(net.clone(), 64);
    for f in frames.iter().take(PROVIDERS as usize) {
        ing.ingest(f, now).unwrap();
    }
    let mut next = PROVIDERS as usize;
    let mut take = |n: usize| {
        let s = next;
        next += n;
        s..s + n
    };

    let mut raw = Vec::new();
    let mut single = Vec::new();
    let mut batch = Vec::new();
    let mut mixed = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..PER_ROUND {
            black_box(vk.verify_strict(black_box(&input), black_box(&sig))).unwrap();
        }
        raw.push(PER_ROUND as f64 / t.elapsed().as_secs_f64());

        let r = take(PER_ROUND / 2);
        let t = Instant::now();
        for f in &frames[r.clone()] {
            black_box(ing.ingest(f, now)).unwrap();
        }
        single.push(r.len() as f64 / t.elapsed().as_secs_f64());

        let r = take(PER_ROUND / 4);
        let t = Instant::now();
        for chunk in frames[r.clone()].chunks(64) {
            let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
            assert!(ing.ingest_batch(&refs, now).iter().all(Result::is_ok));
        }
        batch.push(r.len() as f64 / t.elapsed().as_secs_f64());

        // Half re-announced: 32 frames verified just before (the tail of the previous batch
        // call is in the ingestor's 64-entry cache), 32 new.
        let old = take(32);
        let warm: Vec<&[u8]> = frames[old.clone()].iter().map(Vec::as_slice).collect();
        ing.ingest_batch(&warm, now);
        let new = take(32);
        let refs: Vec<&[u8]> = frames[old]
            .iter()
            .zip(&frames[new])
            .flat_map(|(a, b)| [a.as_slice(), b.as_slice()])
            .collect();
        let t = Instant::now();
        assert!(ing.ingest_batch(&refs, now).iter().all(Result::is_ok));
        mixed.push(refs.len() as f64 / t.elapsed().as_secs_f64());
    }

    let ratio = |v: &[f64]| median(v.iter().zip(&raw).map(|(a, r)| a / r).collect());
    println!(
        "rounds: {ROUNDS}, thread CPU time; medians of per-round rates (offers per CPU-second) and of per-round ratios to raw"
    );
    println!("{:<28} {:>12} {:>8}", "variant", "offers/s", "x raw");
    println!(
        "{:<28} {:>12.0} {:>8.2}",
        "raw verify_strict",
        median(raw.clone()),
        1.0
    );
    println!(
        "{:<28} {:>12.0} {:>8.2}",
        "ingest single",
        median(single.clone()),
        ratio(&single)
    );
    println!(
        "{:<28} {:>12.0} {:>8.2}",
        "ingest batch64 new",
        median(batch.clone()),
        ratio(&batch)
    );
    println!(
        "{:<28} {:>12.0} {:>8.2}",
        "ingest batch64 half re-ann.",
        median(mixed.clone()),
        ratio(&mixed)
    );
}
