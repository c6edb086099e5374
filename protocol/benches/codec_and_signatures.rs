//! Codec and signature throughput: `cargo bench -p gridlease-protocol --bench codec_and_signatures`.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gridlease_protocol::fixtures;
use gridlease_protocol::{NetworkId, NodeKey, Offer, PaymentReceipt, Signed, WireMessage};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let key = NodeKey::from_secret([1; 32]);
    let net = NetworkId::devnet();
    let offer = fixtures::offer(key.public(), 1, 4, 400_000);
    let offer_bytes = offer.encode_payload().unwrap_or_default();
    let signed = match Signed::sign(&key, &net, &offer) {
        Ok(s) => s,
        Err(e) => panic!("sign: {e}"),
    };
    let wire = signed.to_bytes().unwrap_or_default();
    let receipt = fixtures::receipt(gridlease_protocol::LeaseId(Default::default()), 1, 1, 1);

    let mut g = c.benchmark_group("codec");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode_offer_4gpu", |b| {
        b.iter(|| black_box(&offer).encode_payload())
    });
    g.bench_function("decode_offer_4gpu", |b| {
        b.iter(|| Offer::decode_payload(black_box(&offer_bytes)))
    });
    g.bench_function("encode_receipt", |b| {
        b.iter(|| black_box(&receipt).encode_payload())
    });
    g.finish();

    let mut g = c.benchmark_group("signatures");
    g.throughput(Throughput::Elements(1));
    g.bench_function("sign_offer", |b| {
        b.iter(|| Signed::sign(&key, &net, black_box(&offer)))
    });
    g.bench_function("sign_receipt", |b| {
        b.iter(|| Signed::sign(&key, &net, black_box(&receipt)))
    });
    g.bench_function("envelope_from_bytes_verify_decode_offer", |b| {
        b.iter(|| Signed::<Offer>::from_bytes(black_box(&wire)).map(|s| s.verify(&net)))
    });
    let r = match Signed::sign(&key, &net, &receipt) {
        Ok(s) => s,
        Err(e) => panic!("sign: {e}"),
    };
    g.bench_function("verify_receipt", |b| {
        b.iter(|| Signed::<PaymentReceipt>::verify(black_box(&r), &net))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
