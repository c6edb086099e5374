//! The network lab (issue 15): hosts as Linux network namespaces, an "internet" switch,
//! home routers that NAT, packet loss on the internet links, partitions, and `gridlease`
//! daemons run inside the namespaces (`ip netns exec`) with the real binary. Everything is
//! named with a per-run prefix and removed when the [`Lab`] is dropped, also when a test
//! fails.
//!
//! Topology (addresses only in ranges the lab creates; nothing is routed out of the machine:
//! no namespace has a default route to the host, the internet side has no default route at
//! all):
//!
//! ```text
//!                       <p>-inet: bridge "inet0" (the internet, 198.18.0.0/16)
//!          ┌──────────────────┬─────────────────┬───────────────────┐
//!   198.18.0.N eth0     198.18.0.M eth0   198.18.0.W wan       198.18.0.V wan
//!   <p>-relay           <p>-renter        <p>-r1 (router)       <p>-r2 (router)
//!   (public host)       (public host)     NAT: cone|symmetric   bridge "lan" 10.2.0.1/24
//!                                         bridge "lan" 10.1.0.1   │
//!                                           │                      10.2.0.10 <p>-r2h0
//!                                          10.1.0.10 <p>-r1h0 (a host behind the router)
//! ```
//!
//! A router's NAT: [`Nat::Cone`] is Linux `MASQUERADE` (the source port kept where free, so
//! one mapping per internal address and port whatever the destination: endpoint-independent
//! mapping; inbound only for established flows: address-and-port-dependent filtering), what
//! most Linux-based home routers do and what DCUtR can punch through. [`Nat::Symmetric`] is
//! `MASQUERADE --random-fully` (a fresh random port per flow: address-and-port-dependent
//! mapping), where the port a peer observed is not the one used towards anyone else, so hole
//! punching fails and the relay carries the traffic.
//!
//! Needs root, `ip` (iproute2), `iptables` and `nft`. With `GRIDLEASE_REQUIRE_DOCKER=1` (set by
//! `.ci/run`) a missing one fails the test, otherwise the test skips with a note.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr
)]

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::cli_support::{Daemon, cli, docker_required, json, text, wait_for};

/// How a home router maps and filters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nat {
    /// Endpoint-independent mapping, port-preserving (`MASQUERADE`).
    Cone,
    /// A random port per flow (`MASQUERADE --random-fully`).
    Symmetric,
}

/// A host (network namespace) of the lab.
#[derive(Clone, Debug)]
pub struct Host {
    /// Its namespace.
    pub ns: String,
    /// Its address (198.18.x on the internet, 10.x behind a router).
    pub ip: Ipv4Addr,
}

/// A home site: a router and the LAN behind it.
#[derive(Clone, Debug)]
pub struct Site {
    /// The router's namespace.
    pub router: String,
    /// The router's internet address (what peers see of the site's hosts).
    pub wan_ip: Ipv4Addr,
    /// The site's number: its LAN is 10.<n>.0.0/24.
    pub n: u8,
    /// Its NAT.
    pub nat: Nat,
}

/// Is this process root?
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn have(program: &str) -> bool {
    Command::new(program)
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Why the lab cannot be built here, if it cannot.
fn missing() -> Option<String> {
    if !is_root() {
        return Some("not root (network namespaces need it)".into());
    }
    for p in ["ip", "iptables", "nft"] {
        if !have(p) {
            return Some(format!("{p} is not installed"));
        }
    }
    None
}

/// Fails (under `GRIDLEASE_REQUIRE_DOCKER=1`) or skips (`false`) when the lab or its extra
/// `programs` cannot run here.
pub fn lab_or_skip(test: &str, programs: &[&str]) -> bool {
    let mut why = missing();
    for p in programs {
        if why.is_none() && !have(p) {
            why = Some(format!("{p} is not installed (`.ci/run` installs it)"));
        }
    }
    match why {
        None => true,
        Some(why) => {
            assert!(
                !docker_required(),
                "{test}: GRIDLEASE_REQUIRE_DOCKER=1 but the network lab cannot run: {why}"
            );
            eprintln!("{test}: SKIPPED, the network lab cannot run: {why}");
            false
        }
    }
}

/// Runs `program args..`, failing the test (with its stderr) when it fails.
fn must(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        text(&out.stderr)
    );
}

/// Runs `program args..` inside namespace `ns`, failing the test when it fails.
pub fn ns_must(ns: &str, program: &str, args: &[&str]) {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    must("ip", &all);
}

/// Runs `program args..` inside namespace `ns` and answers its output (success or not).
pub fn ns_run(ns: &str, program: &str, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .output()
        .unwrap()
}

/// A per-run prefix: `gl` and five hex digits (interface names stay within 15 bytes), from
/// the process, the clock and a counter (several labs in one test process differ).
fn prefix() -> String {
    use std::hash::{Hash, Hasher};
    static LABS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::process::id().hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    LABS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .hash(&mut h);
    format!("gl{:05x}", h.finish() & 0xfffff)
}

/// The lab. Dropped: its processes are killed, then its namespaces deleted (which removes
/// their links, addresses, routes, firewall and NAT state with them).
pub struct Lab {
    /// The per-run prefix of every name.
    pub prefix: String,
    /// The internet switch's namespace.
    inet: String,
    /// Every namespace made, in creation order.
    namespaces: Vec<String>,
    /// The next host number on the internet (198.18.0.N).
    next_public: u8,
    /// The next site number (10.N.0.0/24).
    next_site: u8,
    /// Hosts made per site number.
    site_hosts: std::collections::BTreeMap<u8, u8>,
    /// Internet links: (namespace, device), both ends, for loss.
    links: Vec<(String, String)>,
    /// Helper processes, killed first.
    children: Vec<Child>,
    /// The internet is a userspace switch with latency (`delay_switch.py`), started by
    /// [`Lab::start_delay_switch`], instead of a kernel bridge.
    delayed: bool,
}

impl Lab {
    /// An empty internet (a kernel bridge: no latency).
    pub fn new() -> Self {
        Self::build(false)
    }

    /// An empty internet whose switch adds latency: build the topology, then call
    /// [`Lab::start_delay_switch`] (this kernel has no `sch_netem`).
    pub fn delayed() -> Self {
        Self::build(true)
    }

    fn build(delayed: bool) -> Self {
        let p = prefix();
        let mut lab = Self {
            inet: format!("{p}-inet"),
            prefix: p,
            namespaces: Vec::new(),
            next_public: 1,
            next_site: 1,
            site_hosts: Default::default(),
            links: Vec::new(),
            children: Vec::new(),
            delayed,
        };
        let inet = lab.inet.clone();
        lab.add_ns(&inet);
        if delayed {
            return lab;
        }
        ns_must(
            &inet,
            "ip",
            &["link", "add", "name", "inet0", "type", "bridge"],
        );
        ns_must(&inet, "ip", &["link", "set", "dev", "inet0", "up"]);
        lab
    }

    fn add_ns(&mut self, ns: &str) {
        must("ip", &["netns", "add", ns]);
        self.namespaces.push(ns.to_string());
        ns_must(ns, "ip", &["link", "set", "lo", "up"]);
        // The lab is IPv4 only: no link-local IPv6 chatter, no v6 addresses in offers.
        for knob in [
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        ] {
            let _ = ns_run(ns, "sysctl", &["-q", "-w", knob]);
        }
    }

    /// A veth from `ns` (device `dev`, address `ip/16`) to the internet switch.
    fn plug_into_internet(&mut self, ns: &str, dev: &str, ip: Ipv4Addr) {
        let port = format!("{}i{}", self.prefix, self.links.len() / 2);
        must(
            "ip",
            &[
                "link", "add", "name", dev, "netns", ns, "type", "veth", "peer", "name", &port,
                "netns", &self.inet,
            ],
        );
        if !self.delayed {
            ns_must(&self.inet, "ip", &["link", "set", &port, "master", "inet0"]);
        }
        ns_must(&self.inet, "ip", &["link", "set", &port, "up"]);
        ns_must(ns, "ip", &["addr", "add", &format!("{ip}/16"), "dev", dev]);
        ns_must(ns, "ip", &["link", "set", dev, "up"]);
        self.no_offload(ns, dev);
        self.no_offload(&self.inet.clone(), &port);
        self.links.push((ns.to_string(), dev.to_string()));
        self.links.push((self.inet.clone(), port));
    }

    /// With the userspace switch, checksums must be in the frames it reads: a veth leaves
    /// them to "hardware" (offload) otherwise, and the receiver drops the forwarded frame.
    fn no_offload(&self, ns: &str, dev: &str) {
        if self.delayed {
            let out = ns_run(ns, "ethtool", &["-K", dev, "tx", "off"]);
            assert!(
                out.status.success(),
                "ethtool -K {dev} tx off in {ns}: {}",
                text(&out.stderr)
            );
        }
    }

    fn public_ip(&mut self) -> Ipv4Addr {
        let n = self.next_public;
        self.next_public = n.checked_add(1).expect("at most 254 internet hosts");
        Ipv4Addr::new(198, 18, 0, n)
    }

    /// A host on the internet side (a public address, no NAT).
    pub fn public_host(&mut self, name: &str) -> Host {
        let ns = format!("{}-{name}", self.prefix);
        self.add_ns(&ns);
        let ip = self.public_ip();
        self.plug_into_internet(&ns, "eth0", ip);
        Host { ns, ip }
    }

    /// A home router with `nat` on the internet, and an empty LAN behind it.
    pub fn site(&mut self, name: &str, nat: Nat) -> Site {
        let n = self.next_site;
        self.next_site = n.checked_add(1).expect("at most 254 sites");
        let router = format!("{}-{name}", self.prefix);
        self.add_ns(&router);
        let wan_ip = self.public_ip();
        self.plug_into_internet(&router, "wan", wan_ip);
        let r = router.as_str();
        ns_must(r, "ip", &["link", "add", "name", "lan", "type", "bridge"]);
        ns_must(
            r,
            "ip",
            &["addr", "add", &format!("10.{n}.0.1/24"), "dev", "lan"],
        );
        ns_must(r, "ip", &["link", "set", "lan", "up"]);
        ns_must(r, "sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"]);
        let mut masquerade = vec![
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-o",
            "wan",
            "-j",
            "MASQUERADE",
        ];
        if nat == Nat::Symmetric {
            masquerade.push("--random-fully");
        }
        ns_must(r, "iptables", &masquerade);
        // A home router's firewall: out from the LAN, back in only for established flows (and
        // for flows a port forwarding let in: conntrack state DNAT).
        ns_must(r, "iptables", &["-P", "FORWARD", "DROP"]);
        ns_must(
            r,
            "iptables",
            &["-A", "FORWARD", "-i", "lan", "-o", "wan", "-j", "ACCEPT"],
        );
        ns_must(
            r,
            "iptables",
            &[
                "-A",
                "FORWARD",
                "-m",
                "conntrack",
                "--ctstate",
                "ESTABLISHED,RELATED,DNAT",
                "-j",
                "ACCEPT",
            ],
        );
        // Unsolicited packets to the router itself are dropped, as most home routers do
        // ("stealth"), not answered with a reset: a hole punch's early SYN from the far side
        // then leaves no conntrack entry behind (the dropped packet's entry is never
        // confirmed) that would make the NAT pick another port for this side's own SYN, and
        // the far side's TCP retransmits the SYN once the mapping exists.
        ns_must(
            r,
            "iptables",
            &[
                "-A",
                "INPUT",
                "-i",
                "wan",
                "-m",
                "conntrack",
                "--ctstate",
                "ESTABLISHED,RELATED",
                "-j",
                "ACCEPT",
            ],
        );
        ns_must(r, "iptables", &["-A", "INPUT", "-i", "wan", "-j", "DROP"]);
        self.site_hosts.insert(n, 0);
        Site {
            router,
            wan_ip,
            n,
            nat,
        }
    }

    /// A host on `site`'s LAN (10.<n>.0.10 and up), its default route through the router.
    pub fn site_host(&mut self, site: &Site, name: &str) -> Host {
        let count = self.site_hosts.get(&site.n).copied().unwrap_or(0);
        self.site_hosts.insert(site.n, count + 1);
        let ns = format!("{}-{name}", self.prefix);
        self.add_ns(&ns);
        let ip = Ipv4Addr::new(10, site.n, 0, 10 + count);
        let port = format!("p{count}");
        must(
            "ip",
            &[
                "link",
                "add",
                "name",
                "eth0",
                "netns",
                &ns,
                "type",
                "veth",
                "peer",
                "name",
                &port,
                "netns",
                &site.router,
            ],
        );
        ns_must(&site.router, "ip", &["link", "set", &port, "master", "lan"]);
        ns_must(&site.router, "ip", &["link", "set", &port, "up"]);
        self.no_offload(&site.router, &port);
        self.no_offload(&ns, "eth0");
        ns_must(
            &ns,
            "ip",
            &["addr", "add", &format!("{ip}/24"), "dev", "eth0"],
        );
        ns_must(&ns, "ip", &["link", "set", "eth0", "up"]);
        ns_must(
            &ns,
            "ip",
            &[
                "route",
                "add",
                "default",
                "via",
                &format!("10.{}.0.1", site.n),
            ],
        );
        Host { ns, ip }
    }

    /// `loss_pct` % of the packets arriving at either end of every internet link made so far
    /// are dropped (nftables `numgen random` on the device's ingress hook, in each end's
    /// namespace). Latency is not offered: this machine's kernel has no `sch_netem`
    /// (`CONFIG_NET_SCH_NETEM` is not set), and no other qdisc delays packets.
    pub fn loss(&self, loss_pct: u32) {
        for (i, (ns, dev)) in self.links.iter().enumerate() {
            let chain = format!("in{i}");
            let _ = ns_run(ns, "nft", &["add", "table", "netdev", "lab"]);
            let hook = format!(
                "{{ type filter hook ingress device \"{dev}\" priority 0; policy accept; }}"
            );
            ns_must(ns, "nft", &["add", "chain", "netdev", "lab", &chain, &hook]);
            let pct = loss_pct.to_string();
            ns_must(
                ns,
                "nft",
                &[
                    "add", "rule", "netdev", "lab", &chain, "numgen", "random", "mod", "100", "<",
                    &pct, "drop",
                ],
            );
        }
    }

    /// Starts the userspace internet switch of a [`Lab::delayed`] lab between every internet
    /// link made so far: each frame held `delay_ms` (two hosts see 2 x `delay_ms` round trip),
    /// `loss_pct` % dropped. Killed with the lab.
    pub fn start_delay_switch(&mut self, delay_ms: u32, loss_pct: u32) {
        assert!(self.delayed, "a Lab::delayed lab");
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lab_support/delay_switch.py");
        let ports: Vec<String> = self
            .links
            .iter()
            .filter(|(ns, _)| *ns == self.inet)
            .map(|(_, dev)| dev.clone())
            .collect();
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.inet, "python3"])
            .arg(&script)
            .args([delay_ms.to_string(), loss_pct.to_string()])
            .args(&ports)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        // Ready once it says so (its sockets are bound).
        let mut line = String::new();
        let out = child.stdout.take().unwrap();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).unwrap();
        assert!(line.starts_with("switching"), "delay switch: {line:?}");
        self.children.push(child);
    }

    /// Cuts `site` off the internet: its router drops everything it would forward.
    pub fn cut(&self, site: &Site) {
        ns_must(
            &site.router,
            "iptables",
            &["-I", "FORWARD", "1", "-j", "DROP"],
        );
    }

    /// Undoes [`Lab::cut`].
    pub fn heal(&self, site: &Site) {
        ns_must(&site.router, "iptables", &["-D", "FORWARD", "-j", "DROP"]);
    }

    /// Names of the lab's namespaces that exist now.
    pub fn live_namespaces(&self) -> Vec<String> {
        let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
        text(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .filter(|n| n.starts_with(&format!("{}-", self.prefix)))
            .map(str::to_string)
            .collect()
    }
}

impl Default for Lab {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.namespaces.iter().rev() {
            // Any process still inside (a daemon whose guard leaked) is killed first, or the
            // namespace would live on with it.
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in text(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The `gridlease` binary's path (as `cli_support::bin` runs it).
fn gridlease_path() -> PathBuf {
    assert_cmd::cargo::cargo_bin("gridlease")
}

/// `gridlease --home HOME node ..` inside `host`'s namespace: TCP and QUIC on port 4001 of
/// every interface there, no mDNS, 1 s announcements, the probe image rentable, `extra` flags;
/// its log (at `info`, with the network loop at `debug`) to `log`. Waits for its API (a Unix
/// socket: the CLI reaches it from the host's namespace).
pub fn node_in(host: &Host, home: &Path, extra: &[&str], log: &Path) -> Daemon {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &host.ns]).arg(gridlease_path());
    for (k, _) in std::env::vars() {
        if k.starts_with("GRIDLEASE_") {
            cmd.env_remove(k);
        }
    }
    let child = cmd
        .env(
            "RUST_LOG",
            "info,gridlease_node::net::event_loop=debug,libp2p_dcutr=debug",
        )
        .env(
            gridlease_node::env_vars::GRIDLEASE_LOCAL_IMAGES,
            gridlease_sandbox::probe_image::probe_image_tag(),
        )
        // As `cli_support::start_node_launched`: the temporary directory may be a small tmpfs.
        .env(gridlease_node::env_vars::GRIDLEASE_RESERVE_DISK_GIB, "0")
        .arg("--home")
        .arg(home)
        .args([
            "node",
            "--no-mdns",
            "--listen",
            "/ip4/0.0.0.0/tcp/4001",
            "--listen",
            "/ip4/0.0.0.0/udp/4001/quic-v1",
            "--announce-secs",
            "1",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
        .spawn()
        .unwrap();
    let d = Daemon(child);
    wait_for(Duration::from_secs(30), "the node's API", || {
        cli(home, &["status"]).status.success()
    });
    d
}

/// The node's `status --json`.
pub fn status(home: &Path) -> serde_json::Value {
    json(home, &["status"])
}

/// Waits (at most `limit`) until the node reports `want` as its NAT status; answers the
/// status.
pub fn wait_nat(home: &Path, want: &str, limit: Duration) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let s = status(home);
        if s["nat_status"] == want {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "NAT status {want:?} not reported within {limit:?}: {s:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The node's connections to `peer` as `peers --json` shows them: `(remote address, relayed)`.
pub fn connections_to(home: &Path, peer: &str) -> Vec<(String, bool)> {
    let peers = json(home, &["peers"]);
    peers
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["peer_id"] == peer)
        .flat_map(|p| p["connections"].as_array().cloned().unwrap_or_default())
        .map(|c| {
            (
                c["remote_addr"].as_str().unwrap_or_default().to_string(),
                c["relayed"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// The first line of `log` containing `needle`, if any.
pub fn log_line(log: &Path, needle: &str) -> Option<String> {
    std::fs::read_to_string(log)
        .ok()?
        .lines()
        .find(|l| l.contains(needle))
        .map(str::to_string)
}

/// A `gridlease` node of the lab: its host, home, log, peer id and daemon.
pub struct Party {
    /// Killed when dropped.
    pub daemon: Daemon,
    pub host: Host,
    pub home: PathBuf,
    pub log: PathBuf,
    pub peer: String,
}

impl Party {
    /// Starts a node on `host` (home `dir/name`, log `dir/name.log`) with `extra` flags.
    pub fn start(dir: &Path, name: &str, host: &Host, extra: &[&str]) -> Self {
        let home = dir.join(name);
        crate::cli_support::init(&home);
        let log = dir.join(format!("{name}.log"));
        let daemon = node_in(host, &home, extra, &log);
        let peer = status(&home)["peer_id"].as_str().unwrap().to_string();
        Self {
            daemon,
            host: host.clone(),
            home,
            log,
            peer,
        }
    }

    /// Its TCP address on the internet, `/ip4/<ip>/tcp/4001/p2p/<id>` (for a public host).
    pub fn addr(&self) -> String {
        format!("/ip4/{}/tcp/4001/p2p/{}", self.host.ip, self.peer)
    }

    /// Kills the daemon now (no goodbye to anyone).
    pub fn kill(&mut self) {
        let _ = self.daemon.0.kill();
        let _ = self.daemon.0.wait();
    }

    /// The tail of its log (for failure messages).
    pub fn log_tail(&self, lines: usize) -> String {
        let all = std::fs::read_to_string(&self.log).unwrap_or_default();
        let v: Vec<&str> = all.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }
}

/// A relay server on `host`: it announces its internet addresses (TCP and QUIC).
pub fn relay(dir: &Path, name: &str, host: &Host) -> Party {
    let tcp = format!("/ip4/{}/tcp/4001", host.ip);
    let quic = format!("/ip4/{}/udp/4001/quic-v1", host.ip);
    Party::start(
        dir,
        name,
        host,
        &[
            "--relay-server",
            "--external-addr",
            &tcp,
            "--external-addr",
            &quic,
        ],
    )
}

/// Where a party sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// On the internet.
    Public,
    /// Behind a home router with this NAT.
    Behind(Nat),
}

/// A lease's windows, seconds: the provider's usage interval and pay-ahead window, the
/// renter's grace.
#[derive(Clone, Copy, Debug)]
pub struct Windows {
    pub interval: u32,
    pub window: u32,
    pub grace: u32,
}

/// Short lease windows for the lab: 1 s reports, 3 s pay-ahead window on the provider, 3 s
/// renter grace.
pub const SHORT: Windows = Windows {
    interval: 1,
    window: 3,
    grace: 3,
};

/// A provider (one declared GPU) and a renter placed as asked, relays on the internet (both
/// parties bootstrap from all of them), `loss_pct` % loss on every internet link, the
/// renter holding the provider's offer with a relayed address in it when the provider is
/// behind a NAT. Fields drop in order: daemons, then the provider's containers, then the lab,
/// then the directory.
pub struct Market {
    pub provider: Party,
    pub renter: Party,
    pub relays: Vec<Party>,
    pub guard: crate::cli_support::ContainersGuard,
    pub provider_site: Option<Site>,
    pub renter_site: Option<Site>,
    /// The first digits of the provider's offer id.
    pub offer: String,
    pub lab: Lab,
    pub dir: tempfile::TempDir,
}

/// Builds a [`Market`] with the [`SHORT`] windows.
pub fn market(provider_at: Place, renter_at: Place, relays: usize, loss_pct: u32) -> Market {
    market_with(provider_at, renter_at, relays, loss_pct, SHORT, 0)
}

/// Builds a [`Market`] whose leases run with `w`; with `delay_ms` > 0 the internet is the
/// userspace switch holding every frame that long ([`Lab::delayed`]).
pub fn market_with(
    provider_at: Place,
    renter_at: Place,
    relays: usize,
    loss_pct: u32,
    w: Windows,
    delay_ms: u32,
) -> Market {
    market_full(provider_at, renter_at, relays, loss_pct, w, delay_ms, &[])
}

/// [`market_with`], the provider's daemon started with more flags (`provider_extra`).
pub fn market_full(
    provider_at: Place,
    renter_at: Place,
    relays: usize,
    loss_pct: u32,
    w: Windows,
    delay_ms: u32,
    provider_extra: &[&str],
) -> Market {
    let dir = tempfile::tempdir().unwrap();
    let mut lab = if delay_ms > 0 {
        Lab::delayed()
    } else {
        Lab::new()
    };
    let relay_hosts: Vec<Host> = (0..relays)
        .map(|i| lab.public_host(&format!("relay{i}")))
        .collect();
    let place = |lab: &mut Lab, name: &str, at: Place| match at {
        Place::Public => (lab.public_host(name), None),
        Place::Behind(nat) => {
            let site = lab.site(&format!("{name}-gw"), nat);
            (lab.site_host(&site, name), Some(site))
        }
    };
    let (provider_host, provider_site) = place(&mut lab, "provider", provider_at);
    let (renter_host, renter_site) = place(&mut lab, "renter", renter_at);
    if loss_pct > 0 {
        lab.loss(loss_pct);
    }
    if delay_ms > 0 {
        lab.start_delay_switch(delay_ms, 0);
    }
    let relays: Vec<Party> = relay_hosts
        .iter()
        .enumerate()
        .map(|(i, h)| relay(dir.path(), &format!("relay{i}"), h))
        .collect();
    let boot: Vec<String> = relays.iter().map(Party::addr).collect();
    let mut common: Vec<String> = Vec::new();
    for b in &boot {
        common.push("--bootstrap".into());
        common.push(b.clone());
    }
    let (i, w, g) = (
        w.interval.to_string(),
        w.window.to_string(),
        w.grace.to_string(),
    );
    let mut pflags: Vec<&str> = vec![
        "--dev-gpus",
        "RTX 4090:24GiB:3.60",
        "--usage-interval-secs",
        &i,
        "--pay-ahead-secs",
        &w,
    ];
    pflags.extend(common.iter().map(String::as_str));
    pflags.extend_from_slice(provider_extra);
    let provider = Party::start(dir.path(), "provider", &provider_host, &pflags);
    let guard = crate::cli_support::ContainersGuard(provider.peer.clone());
    let mut rflags: Vec<&str> = vec!["--renter-grace-secs", &g];
    rflags.extend(common.iter().map(String::as_str));
    let renter = Party::start(dir.path(), "renter", &renter_host, &rflags);
    let private = provider_site.is_some();
    let offer = offer_seen(&provider, &renter, private);
    Market {
        provider,
        renter,
        relays,
        guard,
        provider_site,
        renter_site,
        offer,
        lab,
        dir,
    }
}

/// Waits until `renter` holds `provider`'s offer, with a relayed address in it when the
/// provider is `private` (it re-signs its offer when its reservation is accepted; renting from
/// the first one would dial only unreachable addresses); answers the offer id's first digits.
fn offer_seen(provider: &Party, renter: &Party, private: bool) -> String {
    let limit = Duration::from_secs(60);
    let deadline = Instant::now() + limit;
    loop {
        let found = json(&renter.home, &["search", "gpu~4090"]);
        if let Some(id) = found[0]["id"].as_str() {
            let detail = json(&renter.home, &["offer", id]);
            let relayed = detail["addrs"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|x| x.as_str().unwrap_or("").contains("p2p-circuit"))
            });
            if relayed || !private {
                return id[..12].to_string();
            }
        }
        assert!(
            Instant::now() < deadline,
            "the provider's offer{} did not reach the renter within {limit:?}\nprovider:\n{}\nrenter:\n{}",
            if private {
                " with a relayed address"
            } else {
                ""
            },
            provider.log_tail(40),
            renter.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

impl Market {
    /// Waits for the renter to hold the provider's current offer (see [`offer_seen`]) and
    /// rents from it from now on (after a renter was replaced).
    pub fn refresh_offer(&mut self) {
        self.offer = offer_seen(&self.provider, &self.renter, self.provider_site.is_some());
    }

    /// Rents the offer for 60 s (the minimum billed) with the probe `args`; answers the lease id.
    pub fn rent(&self, image: &str, args: &[&str]) -> String {
        let mut all = vec![
            "rent",
            &self.offer,
            "--seconds",
            "60",
            "--detach",
            "--image",
            image,
            "--",
        ];
        all.extend_from_slice(args);
        let out = crate::cli_support::bin()
            .arg("--home")
            .arg(&self.renter.home)
            .arg("--json")
            .args(&all)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rent failed: {}\nprovider:\n{}\nrenter:\n{}",
            text(&out.stderr),
            self.provider.log_tail(40),
            self.renter.log_tail(40)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["lease_id"].as_str().unwrap().to_string()
    }

    /// The lease on both sides once both settled (at most `limit`).
    pub fn settled(&self, id: &str, limit: Duration) -> (serde_json::Value, serde_json::Value) {
        use crate::cli_support::lease_of;
        let deadline = Instant::now() + limit;
        loop {
            let (p, r) = (
                lease_of(&self.provider.home, id),
                lease_of(&self.renter.home, id),
            );
            if p["state"] == "settled" && r["state"] == "settled" {
                return (p, r);
            }
            assert!(
                Instant::now() < deadline,
                "lease not settled on both sides within {limit:?}:\nprovider {p:#}\nrenter {r:#}\nprovider log:\n{}\nrenter log:\n{}",
                self.provider.log_tail(30),
                self.renter.log_tail(30)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Asserts both ledgers are balanced and agree to the micro-unit; answers the total.
    pub fn ledgers_agree(&self) -> u64 {
        let spent = json(&self.renter.home, &["ledger"]);
        let earned = json(&self.provider.home, &["ledger"]);
        assert_eq!(spent["balanced"], true, "{spent:#}");
        assert_eq!(earned["balanced"], true, "{earned:#}");
        let total = spent["total_spent"].as_u64().unwrap();
        assert_eq!(
            earned["total_earned"].as_u64(),
            Some(total),
            "ledgers disagree: renter {spent:#}, provider {earned:#}"
        );
        total
    }
}
