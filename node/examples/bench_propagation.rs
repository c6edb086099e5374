//! Offer propagation on a 50-node loopback network (tcp + noise + yamux, real swarms in one
//! process): time from the provider's `set_offer` (sign + publish) until 99% of the other nodes
//! have validated and admitted the offer.
//!
//! `cargo run --release -p gridlease-node --example bench_propagation -- [NODES] [ROUNDS] [SEED]`
//!
//! Topology: every node dials 3 distinct random others (seeded), so the mean degree is ~6.
//! Each round a different node publishes a new offer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod bench_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bench_support::*;
use gridlease_node::net::{NetworkEvent, OfferTemplate};
use gridlease_protocol::OfferId;
use gridlease_protocol::fixtures;
use tokio::sync::mpsc;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(50);
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20);
    let seed: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(0x5eed);
    let dir = tempfile::tempdir().unwrap();
    // Long announce period: only the measured publications travel.
    let mut nodes = Vec::new();
    for i in 0..n {
        nodes.push(
            start(
                dir.path(),
                &format!("n{i}"),
                config(Duration::from_secs(600)),
            )
            .await,
        );
    }
    let mut rng = Rng(seed);
    let mut edges = BTreeSet::new();
    // Three new distinct edges each (fewer on a network too small to have them; the tries
    // are bounded, so a tiny network cannot loop forever).
    let want = 3.min(n.saturating_sub(1) / 2);
    for a in 0..n {
        let (mut k, mut tries) = (0, 0);
        while k < want && tries < 10_000 {
            tries += 1;
            let b = rng.below(n);
            if b != a && edges.insert((a.min(b), a.max(b))) {
                k += 1;
            }
        }
    }
    for &(a, b) in &edges {
        connect(&nodes[a], &nodes[b]).await;
    }
    // Mesh formed: every node has min(degree, 4) mesh peers.
    for node in &nodes {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let conns = node.node.client.connected_peers().await.unwrap().len();
            let mesh = node.node.client.mesh_peers().await.unwrap().len();
            if mesh >= conns.min(4) {
                break;
            }
            assert!(Instant::now() < deadline, "mesh did not form");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (tx, mut rx) = mpsc::channel::<(usize, OfferId, Instant)>(100_000);
    for (i, node) in nodes.iter().enumerate() {
        let mut events = node.node.events.subscribe();
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Ok(ev) = events.recv().await {
                if let NetworkEvent::OfferAdmitted { id, .. } = ev {
                    let _ = tx.send((i, id, Instant::now())).await;
                }
            }
        });
    }
    let need = ((n - 1) as f64 * 0.99).ceil() as usize;
    let mut samples = Vec::new();
    let mut full = Vec::new();
    for r in 0..rounds {
        let p = (r * 7) % n;
        let gpus = vec![fixtures::gpu(r as u8)];
        let t0 = Instant::now();
        let own = nodes[p]
            .node
            .client
            .set_offer(Some(OfferTemplate::new(gpus, 300_000 + r as u64)))
            .await
            .unwrap()
            .unwrap();
        let mut got = BTreeSet::new();
        let mut at_need = None;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while got.len() < n - 1 {
            let (i, id, at) = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .expect("round timed out")
                .unwrap();
            if id == own.id && i != p && got.insert(i) && got.len() == need {
                at_need = Some(at - t0);
            }
        }
        let last = Instant::now() - t0;
        samples.push(at_need.unwrap());
        full.push(last);
    }
    println!(
        "{}",
        report(
            &format!(
                "offer propagation to 99% ({need} of {}) of a {n}-node network",
                n - 1
            ),
            samples
        )
    );
    println!(
        "{}",
        report(
            "offer propagation to 100% (upper bound, includes collector lag)",
            full
        )
    );
}
