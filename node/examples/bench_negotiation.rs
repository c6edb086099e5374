//! Lease negotiation round trip on loopback: signed request -> provider verifies, checks,
//! persists (SQLite, WAL, synchronous=FULL) -> signed accept -> renter verifies, checks, persists.
//!
//! `cargo run --release -p gridlease-node --example bench_negotiation -- [ROUNDS]`
//!
//! Each round is one full `lease::negotiate` call on the renter, timed end to end. The provider
//! offers 16 GPUs; every 16 leases it publishes a new offer with fresh GPUs so every request
//! takes the accept path.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod bench_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bench_support::*;
use gridlease_node::clock;
use gridlease_node::lease::NegotiationOutcome;
use gridlease_node::net::OfferTemplate;
use gridlease_protocol::fixtures;
use gridlease_protocol::{Digest, LeaseTerms, NetworkId, NetworkPolicy};

fn template(round: u32) -> OfferTemplate {
    let gpus = (0..16u8)
        .map(|i| {
            let mut g = fixtures::gpu(i);
            let mut seed = round.to_be_bytes().to_vec();
            seed.push(i);
            g.spec.uuid_digest = Digest::of("bench-gpu", &seed);
            g
        })
        .collect();
    let mut t = OfferTemplate::new(gpus, 350_000);
    // The fixture image is a local one the provider offers (never looked up in a registry).
    t.images.local_images = vec!["gridlease-probe:0.1.0".into()];
    t
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: u32 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(512);
    let dir = tempfile::tempdir().unwrap();
    let provider = start_provider(dir.path(), "provider", config(Duration::from_secs(10))).await;
    let renter = start(dir.path(), "renter", config(Duration::from_secs(10))).await;
    connect(&renter, &provider).await;

    let mut samples = Vec::new();
    let mut nonce = 0u64;
    let mut warmup = 32u32;
    let mut lease_round = 0u32;
    while (samples.len() as u32) < rounds {
        let own = provider
            .node
            .client
            .set_offer(Some(template(lease_round)))
            .await
            .unwrap()
            .unwrap();
        lease_round += 1;
        for _ in 0..16 {
            nonce += 1;
            // Each accepted lease re-signs the offer (one GPU fewer free): a request names the
            // current signature, as `rent` does, or it is refused as stale.
            let own = provider
                .node
                .client
                .own_offer()
                .await
                .unwrap()
                .unwrap_or_else(|| own.clone());
            let now = clock::now();
            let terms = LeaseTerms {
                volume: None,
                mounts: Vec::new(),
                settlement: None,
                verify_window_s: 0,
                network: NetworkId::devnet(),
                offer_id: own.id,
                offer_seq: own.offer.seq,
                provider: own.offer.provider,
                renter: renter.node.client.key().public(),
                gpu_count: 1,
                per_gpu: own.offer.per_gpu,
                price_per_gpu_hour: own.offer.price_per_gpu_hour,
                duration_s: 600,
                min_billed_s: own.offer.min_billed_s,
                usage_interval_s: own.offer.usage_interval_s,
                pay_ahead_s: own.offer.pay_ahead_s,
                grace_s: 30,
                max_total: 10_000_000,
                network_policy: NetworkPolicy::None,
                image: "gridlease-probe:0.1.0".into(),
                command: vec!["burn".into(), "15".into()],
                env: BTreeMap::new(),
                nonce,
                created_at: now,
                output_retention_s: 0,
                upload_hold_s: 0,
                prepay_s: 0,
            };
            let t0 = Instant::now();
            let out = gridlease_node::lease::negotiate(
                &renter.node.client,
                &gridlease_node::clock::SystemClock,
                terms,
                now.plus_secs(60),
                vec![provider.addr.clone()],
            )
            .await
            .unwrap();
            let took = t0.elapsed();
            assert!(
                matches!(out, NegotiationOutcome::Accepted { .. }),
                "{out:?}"
            );
            if warmup > 0 {
                warmup -= 1;
            } else {
                samples.push(took);
            }
        }
    }
    println!(
        "{}",
        report(
            "negotiation round trip (accept path, both sides persist)",
            samples
        )
    );
}
