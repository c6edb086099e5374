//! Ingestion rate as a ratio of the raw `verify_strict` rate, robust to a noisy shared machine:
//! the variants are measured in interleaved rounds, in thread CPU time (not wall time, which
//! other processes on a shared machine inflate), and the median of per-round ratios is reported. `cargo bench -p gridlease-contracts --bench ingest_ratio`
//!
//! Variants (all per offer, 4-GPU offers, the same signed-input size):
//! - `raw`: one `verify_strict` per offer with an already decompressed key, over the signed
//!   inputs and signatures of distinct offers like the ones ingested (the ceiling);
//! - `single`: full pipeline, one frame at a time (decode envelope, strict verify, decode
//!   payload, validate), every frame new, provider keys seen before;
//! - `single, N providers`: one frame at a time from `INGEST_PROVIDERS` (100,000) providers in
//!   turn, each seen once before, through an ingestor sized to a book of that many (as the
//!   node builds it), and the same through one with the fixed 4,096-key cache of before;
//! - `batch64_new`: 64 new frames per call through batch verification, keys seen before;
//!   and the same from the `INGEST_PROVIDERS` providers in turn (a burst at 100,000 providers);
//! - `batch64_half_reannounced`: 64 frames per call of which half were verified before
//!   (providers re-announcing), the steady state of the gossip network.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use cpu_time::ThreadTime as Instant;
use std::hint::black_box;

use ed25519_dalek::{Signature, VerifyingKey};
use gridlease_contracts::ingest::OfferIngestor;
use gridlease_protocol::fixtures::{self, T0};
use gridlease_protocol::{NetworkId, NodeKey, Offer, Signed};

const PROVIDERS: u64 = 16;
const ROUNDS: usize = 61;
const PER_ROUND: usize = 256;

fn frame(net: &NetworkId, provider: u64, seq: u64) -> Vec<u8> {
    let key = NodeKey::from_secret([provider as u8 + 1; 32]);
    let offer = fixtures::offer(key.public(), seq, 4, 400_000);
    Signed::sign(&key, net, &offer).unwrap().to_bytes().unwrap()
}

/// A frame of provider `provider` out of many (a key per index, not per byte).
fn frame_of_many(net: &NetworkId, provider: u64, seq: u64) -> Vec<u8> {
    let mut secret = [7u8; 32];
    secret[..8].copy_from_slice(&provider.to_le_bytes());
    let key = NodeKey::from_secret(secret);
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
    // What `raw` verifies: the signed inputs of other distinct offers of the same size, with
    // their signatures and already decompressed keys.
    let raw_inputs: Vec<(VerifyingKey, Vec<u8>, Signature)> = (0..(ROUNDS * PER_ROUND) as u64)
        .map(|i| {
            let env = Signed::<Offer>::from_bytes(&frame(&net, i % PROVIDERS, 1_000_000 + i))
                .unwrap()
                .into_envelope();
            let vk = VerifyingKey::from_bytes(&env.signer.0).unwrap();
            let sig = Signature::from_bytes(&env.signature.0);
            (vk, env.signing_input(), sig)
        })
        .collect();
    let mut raw_next = raw_inputs.chunks(PER_ROUND);

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

    // Many providers (`INGEST_PROVIDERS`, default 100,000), each seen once before, then new
    // offers from them in turn: one ingestor as the node builds it (key cache sized to a book
    // of that many), one with the fixed 4,096 keys of before (every key a miss).
    let many: u64 = std::env::var("INGEST_PROVIDERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let many_new = ROUNDS * PER_ROUND * 3 / 4;
    let many_frames: Vec<Vec<u8>> = (0..many + many_new as u64)
        .map(|i| frame_of_many(&net, i % many, i / many + 1))
        .collect();
    let mut sized = OfferIngestor::new(net.clone(), many as usize);
    let mut fixed = OfferIngestor::new(net.clone(), 64);
    for f in &many_frames[..many as usize] {
        sized.ingest(f, now).unwrap();
        fixed.ingest(f, now).unwrap();
    }
    let mut many_next = many as usize;

    let mut raw = Vec::new();
    let mut single = Vec::new();
    let mut single_sized = Vec::new();
    let mut single_fixed = Vec::new();
    let mut batch = Vec::new();
    let mut batch_many = Vec::new();
    let mut mixed = Vec::new();
    for _ in 0..ROUNDS {
        let chunk = raw_next.next().unwrap();
        let t = Instant::now();
        for (vk, input, sig) in chunk {
            black_box(vk.verify_strict(black_box(input), black_box(sig))).unwrap();
        }
        raw.push(chunk.len() as f64 / t.elapsed().as_secs_f64());

        let r = take(PER_ROUND / 2);
        let t = Instant::now();
        for f in &frames[r.clone()] {
            black_box(ing.ingest(f, now)).unwrap();
        }
        single.push(r.len() as f64 / t.elapsed().as_secs_f64());

        let r = many_next..many_next + PER_ROUND / 4;
        many_next += PER_ROUND / 4;
        let t = Instant::now();
        for f in &many_frames[r.clone()] {
            black_box(sized.ingest(f, now)).unwrap();
        }
        single_sized.push(r.len() as f64 / t.elapsed().as_secs_f64());
        let r = many_next..many_next + PER_ROUND / 4;
        many_next += PER_ROUND / 4;
        let t = Instant::now();
        for f in &many_frames[r.clone()] {
            black_box(fixed.ingest(f, now)).unwrap();
        }
        single_fixed.push(r.len() as f64 / t.elapsed().as_secs_f64());
        // A burst of new offers from the many providers, 64 per batch verification.
        let r = many_next..many_next + PER_ROUND / 4;
        many_next += PER_ROUND / 4;
        let t = Instant::now();
        for chunk in many_frames[r.clone()].chunks(64) {
            let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
            assert!(sized.ingest_batch(&refs, now).iter().all(Result::is_ok));
        }
        batch_many.push(r.len() as f64 / t.elapsed().as_secs_f64());

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
        format!("single, {many} providers"),
        median(single_sized.clone()),
        ratio(&single_sized)
    );
    println!(
        "{:<28} {:>12.0} {:>8.2}",
        "  same, 4096 keys (before)",
        median(single_fixed.clone()),
        ratio(&single_fixed)
    );
    println!(
        "{:<28} {:>12.0} {:>8.2}",
        "ingest batch64 new",
        median(batch.clone()),
        ratio(&batch)
    );
    println!(
        "{:<28} {:>12.0} {:>8.2}",
        format!("batch64 new, {many} prov."),
        median(batch_many.clone()),
        ratio(&batch_many)
    );
    println!(
        "{:<28} {:>12.0} {:>8.2}",
        "ingest batch64 half re-ann.",
        median(mixed.clone()),
        ratio(&mixed)
    );

    breakdown(&frames[..PER_ROUND], now);
}

/// Where the time above one verification goes: each step of single-frame ingestion alone, over
/// the same kind of frames (median over rounds of the mean per frame, thread CPU time).
fn breakdown(frames: &[Vec<u8>], now: gridlease_protocol::Timestamp) {
    use gridlease_protocol::envelope::{Envelope, MessageKind, WireMessage};
    let envs: Vec<Envelope> = frames
        .iter()
        .map(|f| Signed::<Offer>::from_bytes(f).unwrap().into_envelope())
        .collect();
    let offers: Vec<Offer> = envs
        .iter()
        .map(|e| Offer::decode_payload(&e.payload).unwrap())
        .collect();
    let step = |f: &mut dyn FnMut(usize)| {
        let per_round: Vec<f64> = (0..ROUNDS)
            .map(|_| {
                let t = Instant::now();
                for i in 0..frames.len() {
                    f(i);
                }
                t.elapsed().as_nanos() as f64 / frames.len() as f64
            })
            .collect();
        median(per_round)
    };
    println!(
        "single-frame steps besides the signature check, ns per 4-GPU offer (median of {ROUNDS} rounds):"
    );
    let rows: [(&str, f64); 5] = [
        (
            "(not on the path) owned envelope decode",
            step(&mut |i| {
                black_box(Envelope::from_bytes(black_box(&frames[i]), MessageKind::Offer).unwrap());
            }),
        ),
        (
            "signing input + SHA-256 content id",
            step(&mut |i| {
                black_box(envs[i].content_digest());
            }),
        ),
        (
            "payload decode",
            step(&mut |i| {
                black_box(Offer::decode_payload(black_box(&envs[i].payload)).unwrap());
            }),
        ),
        (
            "validate_offer",
            step(&mut |i| {
                gridlease_contracts::terms::validate_offer(&offers[i], &envs[i].signer, now)
                    .unwrap();
            }),
        ),
        (
            "all of the above, in place: a frame seen before",
            step(&mut {
                let mut ing = OfferIngestor::new(NetworkId::devnet(), frames.len());
                for f in frames {
                    ing.ingest(f, now).unwrap();
                }
                move |i| {
                    black_box(ing.ingest(black_box(&frames[i]), now)).unwrap();
                }
            }),
        ),
    ];
    for (name, ns) in rows {
        println!("  {name:<48} {ns:>8.0}");
    }
}
