//! Offer ingestion against the raw signature ceiling:
//! `cargo bench -p gridlease-contracts --bench ingest`.
//!
//! All rates are per offer. `raw_verify_strict` is one ed25519 `verify_strict` over the same
//! number of bytes an offer's signature covers: the ceiling a one-by-one pipeline cannot beat.
//! `ingest_single` is the full pipeline for a new offer (envelope decode, strict verify,
//! payload decode, validation) from a provider whose key the node has seen before. `ingest_batch64_new` feeds 64 distinct new offers through batch
//! verification. `ingest_batch64_half_reannounced` is the steady state of a gossip network
//! where providers re-announce every period: half the frames carry content already verified.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use ed25519_dalek::{Signature, Signer, SigningKey};
use gridlease_contracts::ingest::OfferIngestor;
use gridlease_protocol::envelope::signing_input;
use gridlease_protocol::fixtures::{self, T0};
use gridlease_protocol::{MessageKind, NetworkId, NodeKey, Signed, WireMessage};
use std::hint::black_box;

const N: usize = 64;

fn frames(n: usize, salt: u8) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            let mut secret = [salt; 32];
            secret[0] = i as u8;
            let key = NodeKey::from_secret(secret);
            let offer = fixtures::offer(key.public(), 1, 4, 400_000);
            match Signed::sign(&key, &NetworkId::devnet(), &offer).and_then(|s| s.to_bytes()) {
                Ok(b) => b,
                Err(e) => panic!("fixture: {e}"),
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let now = T0.plus_secs(1);
    let net = NetworkId::devnet();

    // The raw ceiling: verify_strict over an offer-sized signing input.
    let key = NodeKey::from_secret([1; 32]);
    let offer = fixtures::offer(key.public(), 1, 4, 400_000);
    let payload = offer.encode_payload().unwrap_or_default();
    let input = signing_input(MessageKind::Offer, &net, &payload);
    let sk = SigningKey::from_bytes(&[1; 32]);
    let vk = sk.verifying_key();
    let sig: Signature = sk.sign(&input);

    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements(1));
    g.bench_function("raw_verify_strict", |b| {
        b.iter(|| vk.verify_strict(black_box(&input), black_box(&sig)))
    });

    // 256 distinct offers from 16 providers (each with 16 sequence numbers), cycled through an
    // ingestor whose frame cache holds one entry: every frame is new content, every provider key
    // is known after its first offer, as in a network of re-announcing providers.
    let distinct: Vec<Vec<u8>> = (0..256u64)
        .map(|i| {
            let key = NodeKey::from_secret([(i % 16) as u8 + 1; 32]);
            let offer = fixtures::offer(key.public(), i / 16 + 1, 4, 400_000);
            match Signed::sign(&key, &net, &offer).and_then(|s| s.to_bytes()) {
                Ok(b) => b,
                Err(e) => panic!("fixture: {e}"),
            }
        })
        .collect();
    let mut ing = OfferIngestor::new(net.clone(), 1);
    let mut next = 0usize;
    g.bench_function("ingest_single", |b| {
        b.iter(|| {
            next = (next + 1) % distinct.len();
            ing.ingest(black_box(&distinct[next]), now).is_ok()
        })
    });
    g.finish();

    let mut g = c.benchmark_group("ingest_batch");
    g.throughput(Throughput::Elements(N as u64));
    let new = frames(N, 9);
    let refs: Vec<&[u8]> = new.iter().map(Vec::as_slice).collect();
    g.bench_function("ingest_batch64_new", |b| {
        b.iter_batched(
            || OfferIngestor::new(net.clone(), 1024),
            |mut ing| ing.ingest_batch(black_box(&refs), now).len(),
            BatchSize::SmallInput,
        )
    });

    let old = frames(N / 2, 11);
    let fresh = frames(N / 2, 13);
    let mixed: Vec<&[u8]> = old
        .iter()
        .zip(&fresh)
        .flat_map(|(a, b)| [a.as_slice(), b.as_slice()])
        .collect();
    g.bench_function("ingest_batch64_half_reannounced", |b| {
        b.iter_batched(
            || {
                let mut ing = OfferIngestor::new(net.clone(), 1024);
                let warm: Vec<&[u8]> = old.iter().map(Vec::as_slice).collect();
                ing.ingest_batch(&warm, now);
                ing
            },
            |mut ing| ing.ingest_batch(black_box(&mixed), now).len(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
