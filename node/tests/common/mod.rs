//! Helpers for in-process multi-node tests on loopback: real swarms through the real builder
//! (tcp + noise + yamux), temporary homes, waiting on events or state with deadlines.

// Test support: a failed setup step is a test failure, so unwrapping is the point.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gridlease_node::home::Home;
use gridlease_node::net::{NetworkEvent, Node, NodeConfig, OfferTemplate};
use gridlease_node::store::{Store, StoreHandle};
use gridlease_protocol::fixtures;
use gridlease_protocol::{NetworkId, NodeKey, Offer, PeerId, PublicKey, Timestamp};
use libp2p::Multiaddr;
use tokio::sync::broadcast;

pub const ANNOUNCE: Duration = Duration::from_millis(1000);
pub const DEADLINE: Duration = Duration::from_secs(30);

pub struct TestNode {
    pub node: Node,
    pub addr: Multiaddr,
    pub peer: PeerId,
    pub key_public: PublicKey,
    pub store: StoreHandle,
    pub home: PathBuf,
    pub events: broadcast::Receiver<NetworkEvent>,
    /// The lease service of a provider started by [`start_provider`] (it decides lease
    /// requests); `None` for plain nodes.
    pub leases: Option<gridlease_node::lease::LeaseService>,
}

pub fn net() -> NetworkId {
    NetworkId::devnet()
}

pub fn config() -> NodeConfig {
    NodeConfig::local(net(), ANNOUNCE)
}

/// A template of `gpus` declared GPUs at `price` micro-units per GPU-hour.
pub fn template(gpus: u8, price: u64) -> OfferTemplate {
    let offered = (0..gpus).map(fixtures::gpu).collect();
    let mut t = OfferTemplate::new(offered, price);
    // Test providers offer the probe image (local-only: imported here, never pulled), under
    // the fixtures' tag and this build's.
    t.images.local_images = vec![
        "gridlease-probe:0.1.0".into(),
        gridlease_sandbox::probe_image::probe_image_tag(),
    ];
    t
}

/// Logs to the test's captured output when `RUST_LOG` is set.
pub fn init_tracing() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// Starts a node with a fresh home under `root`.
pub async fn start(root: &Path, name: &str, config: NodeConfig) -> TestNode {
    let home = root.join(name);
    Home::init(&home, &config.network).unwrap();
    start_from_home(&home, config).await
}

/// Starts (or restarts) the node whose home is `home`.
pub async fn start_from_home(home: &Path, config: NodeConfig) -> TestNode {
    init_tracing();
    let config_listens = !config.listen.is_empty();
    let h = Home::open(home).unwrap();
    let key_public = h.key.public();
    let store = StoreHandle::spawn(Store::open(&h.db_path()).unwrap());
    let node = Node::start(h.key, config, store.clone()).await.unwrap();
    let events = node.events.subscribe();
    // A node without listeners (outbound only, like one behind NAT) has no address to wait for.
    let addr = if config_listens {
        node.client.listen_addrs().await.unwrap()[0].clone()
    } else {
        Multiaddr::empty()
    };
    TestNode {
        peer: node.client.peer_id(),
        node,
        addr,
        key_public,
        store,
        home: home.to_path_buf(),
        events,
        leases: None,
    }
}

/// A provider node with a lease service that decides requests (desk, GPU holds, nonces) but
/// never starts a container: for negotiation tests without Docker.
pub async fn start_provider(root: &Path, name: &str, config: NodeConfig) -> TestNode {
    let home = root.join(name);
    Home::init(&home, &config.network).unwrap();
    start_provider_from_home(&home, config).await
}

/// [`start_provider`] from an existing home.
pub async fn start_provider_from_home(home: &Path, config: NodeConfig) -> TestNode {
    use gridlease_node::lease::{Faults, LeaseService, LeaseServiceConfig};
    let mut n = start_from_home(home, config).await;
    let mut svc = LeaseServiceConfig::new(home.join("leases"));
    svc.faults = Faults {
        hold_sessions: true,
        ..Faults::default()
    };
    let leases = LeaseService::start(
        n.node.client.clone(),
        &n.node.events,
        svc,
        None,
        n.node.cancel.child_token(),
    )
    .await
    .unwrap();
    n.leases = Some(leases);
    n
}

/// Stops a node and waits until its pending store writes are done.
pub async fn stop(n: TestNode) -> PathBuf {
    let store = n.store.clone();
    n.node.shutdown().await;
    // The store queue is FIFO: once this runs, every earlier write has committed.
    store.call(|_| Ok(())).await.unwrap();
    n.home
}

/// Polls `cond` until it holds or the deadline passes.
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if cond().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for the first event matching `pred` (lagging is tolerated: state checks back it up).
pub async fn wait_event<T>(
    rx: &mut broadcast::Receiver<NetworkEvent>,
    mut pred: impl FnMut(&NetworkEvent) -> Option<T>,
) -> T {
    let fut = async {
        loop {
            match rx.recv().await {
                Ok(ev) => {
                    if let Some(t) = pred(&ev) {
                        return t;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("event channel closed"),
            }
        }
    };
    tokio::time::timeout(DEADLINE, fut)
        .await
        .expect("timed out waiting for an event")
}

/// Connects `a` to `b` and waits until both see the connection. The dial is made again when
/// no connection is up within 3 s: when `b` dials `a` at the same moment (a node started
/// from its home dials the peers it knew), both dials leave from the nodes' listening ports
/// (libp2p reuses them), the two SYNs make one TCP connection by simultaneous open, each node
/// starts the noise handshake as the initiator, and both fail.
pub async fn connect(a: &TestNode, b: &TestNode) {
    let (ca, cb) = (a.node.client.clone(), b.node.client.clone());
    let (pa, pb) = (a.peer, b.peer);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        a.node.client.dial(b.addr.clone()).await.unwrap().unwrap();
        let up = tokio::time::timeout(Duration::from_secs(3), async {
            loop {
                if ca.connected_peers().await.unwrap().contains(&pb)
                    && cb.connected_peers().await.unwrap().contains(&pa)
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        if up.is_ok() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for connection"
        );
    }
}

/// Connects `nodes` as a random tree (so the graph is connected) plus `extra` random edges,
/// drawn from `rng`.
pub async fn random_topology(nodes: &[TestNode], rng: &mut Rng, extra: usize) {
    let n = nodes.len();
    let mut edges = std::collections::BTreeSet::new();
    for i in 1..n {
        edges.insert((rng.below(i), i));
    }
    while edges.len() < n - 1 + extra {
        let (a, b) = (rng.below(n), rng.below(n));
        if a != b {
            edges.insert((a.min(b), a.max(b)));
        }
    }
    for (a, b) in edges {
        connect(&nodes[a], &nodes[b]).await;
    }
}

/// Waits until every node's offer-topic mesh holds min(its connections, 4) peers.
pub async fn wait_mesh(nodes: &[TestNode]) {
    for n in nodes {
        let c = n.node.client.clone();
        eventually("gossip mesh", || {
            let c = c.clone();
            async move {
                let conns = c.connected_peers().await.unwrap().len();
                let mesh = c.mesh_peers().await.unwrap().len();
                conns > 0 && mesh >= conns.min(4)
            }
        })
        .await;
    }
}

/// A loopback TCP port free now (bound, then released for a node or server to listen on).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An offer by `key` valid from now for `ttl_s` seconds.
pub fn live_offer(key: &NodeKey, seq: u64, price: u64, now: Timestamp, ttl_s: u64) -> Offer {
    let mut o = fixtures::offer(key.public(), seq, 1, price);
    o.created_at = now;
    o.expires_at = now.plus_secs(ttl_s);
    o
}

/// A tiny seeded generator (xorshift64*), so topologies are reproducible.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
