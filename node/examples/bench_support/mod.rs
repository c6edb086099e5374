//! Shared helpers of the benchmark binaries: real nodes on loopback with temporary homes.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use gridlease_node::home::Home;
use gridlease_node::net::{Node, NodeConfig};
use gridlease_node::store::{Store, StoreHandle};
use gridlease_protocol::{NetworkId, PeerId};
use libp2p::Multiaddr;

pub struct BenchNode {
    pub node: Node,
    pub addr: Multiaddr,
    pub peer: PeerId,
    pub store: StoreHandle,
    /// A provider's lease service (decides requests; never starts containers here).
    pub leases: Option<gridlease_node::lease::LeaseService>,
}

/// A provider: a node with a lease service that decides and stores lease requests, and never
/// runs their sessions (no Docker needed).
pub async fn start_provider(root: &Path, name: &str, config: NodeConfig) -> BenchNode {
    use gridlease_node::lease::{Faults, LeaseService, LeaseServiceConfig};
    let mut n = start(root, name, config).await;
    let mut svc = LeaseServiceConfig::new(root.join(name).join("leases"));
    svc.faults = Faults {
        hold_sessions: true,
        ..Faults::default()
    };
    let events = n.node.events.clone();
    let leases = LeaseService::start(
        n.node.client.clone(),
        &events,
        svc,
        None,
        n.node.cancel.child_token(),
    )
    .await
    .unwrap();
    n.leases = Some(leases);
    n
}

pub async fn start(root: &Path, name: &str, config: NodeConfig) -> BenchNode {
    let home = root.join(name);
    Home::init(&home, &config.network).unwrap();
    start_from(&home, config).await
}

/// A node from an existing home.
pub async fn start_from(home: &Path, config: NodeConfig) -> BenchNode {
    let h = Home::open(home).unwrap();
    let store = StoreHandle::spawn(Store::open(&h.db_path()).unwrap());
    let node = Node::start(h.key, config, store.clone()).await.unwrap();
    let addr = node.client.listen_addrs().await.unwrap()[0].clone();
    BenchNode {
        peer: node.client.peer_id(),
        node,
        addr,
        store,
        leases: None,
    }
}

pub fn config(announce: Duration) -> NodeConfig {
    NodeConfig::local(NetworkId::devnet(), announce)
}

pub async fn connect(a: &BenchNode, b: &BenchNode) {
    a.node.client.dial(b.addr.clone()).await.unwrap().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ab = a
            .node
            .client
            .connected_peers()
            .await
            .unwrap()
            .contains(&b.peer);
        let ba = b
            .node
            .client
            .connected_peers()
            .await
            .unwrap()
            .contains(&a.peer);
        if ab && ba {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "connect timed out");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Percentile (nearest rank) of sorted samples.
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn report(what: &str, mut samples: Vec<Duration>) -> String {
    samples.sort();
    format!(
        "{what}: n={} p50={:.3} ms p90={:.3} ms p99={:.3} ms min={:.3} ms max={:.3} ms",
        samples.len(),
        ms(pct(&samples, 50.0)),
        ms(pct(&samples, 90.0)),
        ms(pct(&samples, 99.0)),
        ms(samples[0]),
        ms(samples[samples.len() - 1]),
    )
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
