//! Shared helpers of the benchmark binaries: real nodes on loopback with temporary homes.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// `n` live offers of `n` providers (1-4 GPUs, an hour to live from `now`), signed: provider
/// `i`'s key is seeded with `tag` and `i`, so different tags give different providers.
pub fn signed_offers(
    net: &NetworkId,
    tag: u8,
    n: usize,
    now: gridlease_protocol::Timestamp,
) -> Vec<(
    gridlease_protocol::OfferId,
    gridlease_protocol::Signed<gridlease_protocol::Offer>,
    gridlease_protocol::Offer,
)> {
    use gridlease_protocol::{NodeKey, OfferId, Signed, fixtures};
    (0..n)
        .map(|i| {
            let mut secret = [0u8; 32];
            secret[0] = tag;
            secret[8..16].copy_from_slice(&(i as u64 + 1).to_be_bytes());
            let key = NodeKey::from_secret(secret);
            let mut offer = fixtures::offer(key.public(), 1, 1 + (i % 4) as u8, 350_000);
            offer.created_at = now;
            offer.expires_at = now.plus_secs(3600);
            let signed = Signed::sign(&key, net, &offer).unwrap();
            let id = OfferId(signed.envelope().content_digest());
            (id, signed, offer)
        })
        .collect()
}

/// Stores `n` offers ([`signed_offers`], tag 0) in the home's database, as gossip stores them;
/// returns the bytes of their envelopes.
pub fn store_offers(home: &Path, net: &NetworkId, n: usize) -> usize {
    let now = gridlease_node::clock::now();
    let mut store = Store::open(&Home::open(home).unwrap().db_path()).unwrap();
    let mut bytes = 0;
    for chunk in signed_offers(net, 0, n, now).chunks(10_000) {
        let batch: Vec<_> = chunk
            .iter()
            .map(|(id, s, o)| {
                bytes += s.to_bytes().unwrap().len();
                (*id, s.clone(), o.clone(), now)
            })
            .collect();
        store.put_offers(&batch, now).unwrap();
    }
    bytes
}

/// `GET path` on the home's control socket (HTTP/1.1, one request per connection): the status
/// code and the body, or `None` while the daemon does not answer.
pub fn api_get(home: &Path, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s =
        std::os::unix::net::UnixStream::connect(home.join(gridlease_node::api::SOCKET_FILE))
            .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: gridlease\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// `GET /v1/status` when it answers 200.
pub fn api_status(home: &Path) -> Option<serde_json::Value> {
    match api_get(home, "/v1/status")? {
        (200, body) => serde_json::from_str(&body).ok(),
        _ => None,
    }
}

/// The `gridlease` binary beside this example's directory (`target/<profile>/gridlease`), or
/// the one `BENCH_GRIDLEASE_BIN` names (to drive another build's daemon with this benchmark).
pub fn gridlease_bin() -> std::path::PathBuf {
    if let Some(bin) = std::env::var_os("BENCH_GRIDLEASE_BIN") {
        return bin.into();
    }
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("gridlease");
    assert!(
        bin.exists(),
        "{} is missing: cargo build --release -p gridlease-node --bins",
        bin.display()
    );
    bin
}

/// A process's resident memory (`VmRSS`), MiB.
pub fn rss_mib(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024.0
}

/// A child process killed and reaped when dropped.
pub struct Kill(pub std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gridlease --home HOME node` on loopback without mDNS, output discarded: add arguments and
/// spawn.
pub fn daemon_command(home: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(gridlease_bin());
    cmd.arg("--home")
        .arg(home)
        .args(["node", "--no-mdns", "--listen", "/ip4/127.0.0.1/tcp/0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    cmd
}

/// Starts `gridlease node` on `home` (loopback, no mDNS), quiet.
pub fn spawn_daemon(home: &Path) -> Kill {
    Kill(daemon_command(home).spawn().unwrap())
}

/// A seeded xorshift generator: the same topology for the same seed.
pub struct Rng(pub u64);

impl Rng {
    /// A number below `n`.
    pub fn below(&mut self, n: usize) -> usize {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }
}

/// CPU seconds (user + system) the process has used, from `/proc/PID/stat`.
pub fn cpu_s(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks / 100.0 // USER_HZ, 100 on Linux
}

/// `gridlease --home HOME --json ARGS..` (it must succeed), parsed (null when not JSON).
pub fn cli(home: &Path, args: &[&str]) -> serde_json::Value {
    let out = Command::new(gridlease_bin())
        .arg("--home")
        .arg(home)
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gridlease {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// `gridlease init` then `gridlease node` on a loopback port (`extra` flags added), once its
/// API answers.
pub fn daemon(home: &Path, extra: &[&str]) -> Kill {
    let init = Command::new(gridlease_bin())
        .arg("--home")
        .arg(home)
        .arg("init")
        .output()
        .unwrap();
    assert!(init.status.success());
    let child = Command::new(gridlease_bin())
        .arg("--home")
        .arg(home)
        .args([
            "node",
            "--no-mdns",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--announce-secs",
            "1",
        ])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let d = Kill(child);
    wait(Duration::from_secs(30), || {
        Command::new(gridlease_bin())
            .arg("--home")
            .arg(home)
            .arg("status")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    d
}

/// Waits until `f` holds, at most `limit`.
pub fn wait(limit: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out");
        std::thread::sleep(Duration::from_millis(100));
    }
}
