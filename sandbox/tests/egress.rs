//! The egress firewall against the real Docker daemon, real iptables and network namespaces
//! this test creates (issue 13, "Egress test in network namespaces").
//!
//! Every address the containers are sent to belongs to this test: a "WAN" namespace (a server
//! at 198.19.R.1 behind a router hop, and its link 198.18.R.0/30, which the host reaches
//! directly), a "LAN" namespace (10.231.R.2, plus 100.64.R.2 and 169.254.169.254 on its
//! loopback), listeners on host addresses (the bridges' gateways, the host end of the LAN
//! link) and a listener in another tenant container. Routes to the loopback addresses live in
//! a policy routing table consulted only for packets from the test's own bridges, so the
//! host's own traffic (its cloud metadata included) never goes there. Names carry a per-run
//! prefix; a drop guard removes namespaces, links, routing rules, containers, networks, the
//! per-run image and the firewall rules, also when the test fails.
//!
//! Needs root (namespaces, iptables) and Docker: with `GRIDLEASE_REQUIRE_DOCKER=1` either
//! missing is a failure, otherwise the test skips with a note.

// Helpers outside #[test] fns: a panic is a test failure with a clear location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{Cleanup, probe_spec};
use gridlease_protocol::NetworkPolicy;
use gridlease_sandbox::firewall::{
    Chains, DnsAllow, EgressRules, Firewall, FirewallError, Teardown, bridge_of,
};
use gridlease_sandbox::meter::{Meter, MeterControl, meter_run};
use gridlease_sandbox::runtime::now_ms;
use gridlease_sandbox::{Sandbox, SandboxSpec};

fn required() -> bool {
    std::env::var("GRIDLEASE_REQUIRE_DOCKER").as_deref() == Ok("1")
}

/// Docker and root, or `None` (skip) / a panic (with `GRIDLEASE_REQUIRE_DOCKER=1`).
async fn docker_and_root(test: &str) -> Option<Sandbox> {
    let sb = common::sandbox_or_skip(test).await?;
    if !rustix::process::geteuid().is_root() {
        if required() {
            panic!(
                "{test}: GRIDLEASE_REQUIRE_DOCKER=1 but the egress tests need root (network namespaces, iptables)"
            );
        }
        eprintln!("{test}: SKIPPED, not root (network namespaces and iptables need it)");
        return None;
    }
    Some(sb)
}

/// Runs a command; panics with its stderr when it fails.
fn sh(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs a cleanup command; failures are reported, not fatal.
fn sh_quiet(program: &str, args: &[&str]) {
    if let Ok(out) = Command::new(program).args(args).output()
        && !out.status.success()
    {
        let err = String::from_utf8_lossy(&out.stderr);
        if !err.contains("Cannot find") && !err.contains("No such") {
            eprintln!("cleanup: {program} {}: {err}", args.join(" "));
        }
    }
}

/// A short per-run prefix (interface names have 15 characters) and an octet for addresses.
fn run_id() -> (String, u8) {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let seed = (std::process::id() << 12) ^ nanos;
    (
        format!("gle{:05x}", seed & 0xfffff),
        16 + (seed % 230) as u8,
    )
}

/// The namespaces, links and routes of one run; removed on drop.
struct Lab {
    prefix: String,
    r: u8,
    table: u32,
    rule_prefs: Vec<u32>,
}

impl Lab {
    fn wan_ns(&self) -> String {
        format!("{}-wan", self.prefix)
    }
    fn lan_ns(&self) -> String {
        format!("{}-lan", self.prefix)
    }
    fn link(&self, which: &str) -> String {
        format!("{}{which}", self.prefix)
    }
    fn wan_host(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.r, 1)
    }
    /// The WAN router's address on the host's link: on-link, not RFC 1918.
    fn wan_link(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.r, 2)
    }
    /// The "internet" server, one routed hop away.
    fn wan_server(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, self.r, 1)
    }
    fn lan_host(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 231, self.r, 1)
    }
    fn lan(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 231, self.r, 2)
    }
    fn cgnat(&self) -> Ipv4Addr {
        Ipv4Addr::new(100, 64, self.r, 2)
    }
    const META: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

    fn new(prefix: &str, r: u8) -> Self {
        let lab = Self {
            prefix: prefix.to_string(),
            r,
            table: 40_000 + u32::from(r),
            rule_prefs: Vec::new(),
        };
        let t = lab.table.to_string();
        for (ns, host, peer, host_addr, peer_addr) in [
            (
                lab.wan_ns(),
                lab.link("w0"),
                lab.link("w1"),
                format!("{}/30", lab.wan_host()),
                format!("{}/30", lab.wan_link()),
            ),
            (
                lab.lan_ns(),
                lab.link("l0"),
                lab.link("l1"),
                format!("{}/24", lab.lan_host()),
                format!("{}/24", lab.lan()),
            ),
        ] {
            sh("ip", &["netns", "add", &ns]);
            sh(
                "ip",
                &["link", "add", &host, "type", "veth", "peer", "name", &peer],
            );
            sh("ip", &["link", "set", &peer, "netns", &ns]);
            sh("ip", &["addr", "add", &host_addr, "dev", &host]);
            // Loose reverse-path filtering: replies from the loopback addresses come back on
            // this link while the main table routes them elsewhere.
            sh(
                "sysctl",
                &["-qw", &format!("net.ipv4.conf.{host}.rp_filter=2")],
            );
            sh("ip", &["link", "set", &host, "up"]);
            sh("ip", &["-n", &ns, "addr", "add", &peer_addr, "dev", &peer]);
            sh("ip", &["-n", &ns, "link", "set", &peer, "up"]);
            sh("ip", &["-n", &ns, "link", "set", "lo", "up"]);
        }
        let (wan, lan) = (lab.wan_ns(), lab.lan_ns());
        sh(
            "ip",
            &[
                "-n",
                &wan,
                "addr",
                "add",
                &format!("{}/32", lab.wan_server()),
                "dev",
                "lo",
            ],
        );
        for a in [Self::META, lab.cgnat()] {
            sh(
                "ip",
                &["-n", &lan, "addr", "add", &format!("{a}/32"), "dev", "lo"],
            );
        }
        for (dst, via, dev) in [
            (lab.wan_server(), lab.wan_link(), lab.link("w0")),
            (Self::META, lab.lan(), lab.link("l0")),
            (lab.cgnat(), lab.lan(), lab.link("l0")),
        ] {
            sh(
                "ip",
                &[
                    "route",
                    "add",
                    &format!("{dst}/32"),
                    "via",
                    &via.to_string(),
                    "dev",
                    &dev,
                    "table",
                    &t,
                ],
            );
        }
        lab
    }

    /// Packets arriving from `bridge` use the lab's routes first.
    fn route_from(&mut self, bridge: &str) {
        let pref = 20_000 + u32::from(self.r) * 4 + self.rule_prefs.len() as u32;
        sh(
            "ip",
            &[
                "rule",
                "add",
                "iif",
                bridge,
                "lookup",
                &self.table.to_string(),
                "pref",
                &pref.to_string(),
            ],
        );
        self.rule_prefs.push(pref);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for pref in &self.rule_prefs {
            sh_quiet("ip", &["rule", "del", "pref", &pref.to_string()]);
        }
        sh_quiet("ip", &["route", "flush", "table", &self.table.to_string()]);
        for l in [self.link("w0"), self.link("l0")] {
            sh_quiet("ip", &["link", "del", &l]);
        }
        for ns in [self.wan_ns(), self.lan_ns()] {
            sh_quiet("ip", &["netns", "del", &ns]);
        }
    }
}

/// Removes the firewall rules of these networks on drop (after the containers: declare it
/// before the [`Cleanup`]).
struct FirewallGuard(Vec<String>);

impl Drop for FirewallGuard {
    fn drop(&mut self) {
        if let Ok(fw) = Firewall::detect() {
            for n in &self.0 {
                if let Err(e) = fw.remove(n) {
                    eprintln!("cleanup: firewall rules of {n}: {e}");
                }
            }
        }
    }
}

/// A TCP listener counting accepted connections (each one read to its end).
struct Listener {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Listener {
    /// Listens on `ip:port` (0: any port) inside namespace `ns` (`None`: the host's).
    fn start(ns: Option<String>, ip: Ipv4Addr, port: u16) -> Self {
        let l = std::thread::spawn(move || {
            if let Some(ns) = ns {
                let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
                rustix::thread::move_into_link_name_space(
                    f.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .unwrap();
            }
            // The socket stays in the namespace it was made in, whichever thread uses it.
            TcpListener::bind((ip, port)).unwrap()
        })
        .join()
        .unwrap();
        let addr = l.local_addr().unwrap();
        l.set_nonblocking(true).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (accepted.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut conn, _)) => {
                        a.fetch_add(1, Ordering::Relaxed);
                        std::thread::spawn(move || {
                            let _ = conn.set_nonblocking(false);
                            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                            let mut sink = [0u8; 64 * 1024];
                            while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self {
            addr,
            accepted,
            stop,
        }
    }

    fn count(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `CONNECT addr=A result=R` lines of a probe's output, by address.
fn connects(logs: &str) -> BTreeMap<String, String> {
    logs.lines()
        .filter_map(|l| l.trim().strip_prefix("CONNECT addr="))
        .filter_map(|rest| rest.split_once(" result="))
        .map(|(a, r)| (a.to_string(), r.trim().to_string()))
        .collect()
}

/// This build's probe under a per-run tag (removed by `cleanup`), so a shared tag is never
/// retagged under a parallel test.
async fn run_image(sb: &Sandbox, prefix: &str, cleanup: &mut Cleanup) -> String {
    let image = format!("{prefix}-probe:1");
    cleanup.images.push(image.clone());
    sb.import_image(
        &image,
        gridlease_sandbox::probe_image::rootfs_tar().unwrap(),
        &["ENTRYPOINT [\"/probe\"]"],
    )
    .await
    .unwrap();
    image
}

fn spec_on(image: &str, node: &str, network: &str, args: &[&str]) -> SandboxSpec {
    let mut s = probe_spec(image, node, args);
    s.network = NetworkPolicy::Egress;
    s.egress_network = network.to_string();
    s
}

/// Starts a tenant listening on port 7000 on `network`; returns (container id, a DNS name of
/// it, its address).
async fn listening_tenant(
    sb: &Sandbox,
    image: &str,
    node: &str,
    network: &str,
    cleanup: &mut Cleanup,
) -> (String, String, String) {
    let spec = spec_on(image, node, network, &["listen", "0.0.0.0:7000", "60"]);
    let id = sb.create(&spec).await.unwrap();
    cleanup.containers.push(id.clone());
    sb.start(&id).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let logs = sb.logs(&id, false, 1 << 16).await.unwrap();
        if logs.contains("LISTEN addr=0.0.0.0:7000 result=ok") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "tenant never listened: {logs}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let info = sb.inspect(&id).await.unwrap();
    // Docker's DNS knows a container by its short id too (its name, `gridlease-<lease id>`,
    // is longer than a DNS label may be).
    let name = id[..12].to_string();
    let ip = info
        .network_settings
        .and_then(|n| n.networks)
        .and_then(|n| n.get(network).and_then(|e| e.ip_address.clone()))
        .expect("the tenant has an address on the network");
    (id, name, format!("{ip}:7000"))
}

/// Runs a probe to its end under the meter; returns (exit code, output, bytes sent).
async fn metered_run(
    sb: &Sandbox,
    spec: &SandboxSpec,
    cleanup: &mut Cleanup,
) -> (i64, String, u64) {
    let id = sb.create(spec).await.unwrap();
    cleanup.containers.push(id.clone());
    sb.start(&id).await.unwrap();
    let mut meter = Meter::new(now_ms(), 0);
    let (exit, usage, _) = meter_run(sb, &id, &mut meter, &[], None, &mut MeterControl::idle())
        .await
        .unwrap();
    let logs = sb.logs(&id, false, 1 << 20).await.unwrap();
    (exit.exit_code, logs, usage.net_tx_bytes)
}

async fn gateway_of(sb: &Sandbox, network: &str) -> (String, Ipv4Addr) {
    let info = sb.docker().inspect_network(network, None).await.unwrap();
    let id = info.id.clone().unwrap();
    let gw = info
        .ipam
        .and_then(|i| i.config)
        .and_then(|c| c.into_iter().find_map(|c| c.gateway))
        .unwrap()
        .parse()
        .unwrap();
    (bridge_of(&id, info.options.as_ref()), gw)
}

/// The "Must show": an egress tenant reaches the WAN and nothing else, and the same
/// probe on a plain bridge without the rules reaches the LAN, metadata, host and tenant
/// listeners, so this test fails if the rules are missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_reaches_the_internet_but_not_the_lan_metadata_host_or_other_tenants() {
    let Some(sb) = docker_and_root("egress").await else {
        return;
    };
    let (prefix, r) = run_id();
    let (net, ctl) = (format!("{prefix}-egress"), format!("{prefix}-plain"));
    let _fw = FirewallGuard(vec![net.clone()]);
    let mut lab = Lab::new(&prefix, r);
    let mut cleanup = Cleanup::default();
    let image = run_image(&sb, &prefix, &mut cleanup).await;
    let node = format!("{prefix}-node");

    // The egress network with its rules; DNS may go to the LAN host's port 53 only.
    cleanup.networks.push(net.clone());
    let egress = sb
        .ensure_egress(&net, DnsAllow::Only(vec![lab.lan()]))
        .await
        .unwrap();
    let fw = Firewall::detect().unwrap();
    assert!(fw.installed(&net).unwrap());
    // The control: a plain bridge (tenants may talk to each other), no rules.
    cleanup.networks.push(ctl.clone());
    sb.docker()
        .create_network(bollard::models::NetworkCreateRequest {
            name: ctl.clone(),
            driver: Some("bridge".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let (ctl_bridge, ctl_gw) = gateway_of(&sb, &ctl).await;
    lab.route_from(&egress.bridge);
    lab.route_from(&ctl_bridge);

    let wan = Listener::start(Some(lab.wan_ns()), lab.wan_server(), 0);
    let wan_link = Listener::start(Some(lab.wan_ns()), lab.wan_link(), 0);
    let lan = Listener::start(Some(lab.lan_ns()), lab.lan(), 0);
    let lan_dns = Listener::start(Some(lab.lan_ns()), lab.lan(), 53);
    let meta = Listener::start(Some(lab.lan_ns()), Lab::META, 80);
    let cgnat = Listener::start(Some(lab.lan_ns()), lab.cgnat(), 0);
    let host_gw = Listener::start(None, egress.gateway.unwrap(), 0);
    let ctl_host_gw = Listener::start(None, ctl_gw, 0);
    let host_veth = Listener::start(None, lab.lan_host(), 0);

    // --- Egress: the tenant and its neighbour on the egress bridge. ---
    let (b_id, b_name, b_addr) = listening_tenant(&sb, &image, &node, &net, &mut cleanup).await;
    let blocked = [
        ("LAN 10.x", lan.addr.to_string(), &lan),
        ("metadata 169.254.169.254", meta.addr.to_string(), &meta),
        ("CGNAT 100.64/10", cgnat.addr.to_string(), &cgnat),
        (
            "the host's on-link WAN router",
            wan_link.addr.to_string(),
            &wan_link,
        ),
        (
            "the host (bridge gateway)",
            host_gw.addr.to_string(),
            &host_gw,
        ),
        (
            "the host (LAN link address)",
            host_veth.addr.to_string(),
            &host_veth,
        ),
    ];
    let wan_addr = wan.addr.to_string();
    let dns_addr = lan_dns.addr.to_string();
    let mut args: Vec<&str> = vec![
        "cat",
        "/proc/sys/net/ipv6/conf/all/disable_ipv6",
        "dns",
        "127.0.0.11",
        &b_name,
        "connect",
        &wan_addr,
        "send",
        &wan_addr,
        "1048576",
        "connect",
        &dns_addr,
        "connect",
        &b_addr,
    ];
    for (_, a, _) in &blocked {
        args.extend(["connect", a.as_str()]);
    }
    // Idle long enough for a stats sample to see the bytes sent.
    args.extend(["sleep", "2.5"]);
    let (code, logs, tx) =
        metered_run(&sb, &spec_on(&image, &node, &net, &args), &mut cleanup).await;
    assert_eq!(code, 0, "{logs}");
    let got = connects(&logs);
    assert_eq!(
        got.get(&wan_addr).map(String::as_str),
        Some("ok"),
        "the WAN server must be reachable: {logs}"
    );
    assert!(
        logs.contains(&format!("SEND addr={wan_addr} bytes=1048576 result=ok")),
        "{logs}"
    );
    assert!(
        tx >= 1 << 20,
        "the meter counts the bytes sent: {tx}\n{logs}"
    );
    assert_eq!(
        got.get(&dns_addr).map(String::as_str),
        Some("ok"),
        "DNS to the allowed resolver passes: {logs}"
    );
    for (what, addr, l) in &blocked {
        assert_eq!(
            got.get(addr).map(String::as_str),
            Some("EHOSTUNREACH"),
            "{what} ({addr}) must be rejected by the egress rules: {logs}"
        );
        assert_eq!(l.count(), 0, "{what} saw a connection");
    }
    assert_eq!(
        got.get(&b_addr).map(String::as_str),
        Some("EHOSTUNREACH"),
        "another tenant on the egress bridge must be unreachable: {logs}"
    );
    // Docker's embedded DNS (inside the container's namespace) still answers: no INPUT hole.
    assert!(
        logs.contains(&format!("DNS name={b_name} result=ok addr=")),
        "{logs}"
    );
    // No IPv6 inside: the IPv4 rules are the whole fence.
    assert!(
        logs.contains("CAT path=/proc/sys/net/ipv6/conf/all/disable_ipv6 value=1"),
        "{logs}"
    );
    assert!(wan.count() >= 2 && lan_dns.count() == 1);
    sb.remove(&b_id).await.unwrap();
    let b_logs = sb.logs(&b_id, false, 1 << 16).await.unwrap_or_default();
    assert!(
        !b_logs.contains("ACCEPT"),
        "the neighbour accepted a connection: {b_logs}"
    );

    // --- Control: the same probe on a plain bridge without the rules. ---
    let (c_id, _, c_addr) = listening_tenant(&sb, &image, &node, &ctl, &mut cleanup).await;
    let reach = [
        ("WAN", wan_addr.clone()),
        ("LAN 10.x", lan.addr.to_string()),
        ("metadata 169.254.169.254", meta.addr.to_string()),
        ("CGNAT 100.64/10", cgnat.addr.to_string()),
        ("the host's on-link WAN router", wan_link.addr.to_string()),
        ("the host (bridge gateway)", ctl_host_gw.addr.to_string()),
        ("the host (LAN link address)", host_veth.addr.to_string()),
        ("another tenant", c_addr.clone()),
    ];
    let mut args: Vec<&str> = Vec::new();
    for (_, a) in &reach {
        args.extend(["connect", a.as_str()]);
    }
    let (code, logs, _) =
        metered_run(&sb, &spec_on(&image, &node, &ctl, &args), &mut cleanup).await;
    assert_eq!(code, 0, "{logs}");
    let got = connects(&logs);
    for (what, addr) in &reach {
        assert_eq!(
            got.get(addr).map(String::as_str),
            Some("ok"),
            "without the rules {what} ({addr}) is reachable, so the egress run proves the rules: {logs}"
        );
    }
    for l in [&lan, &meta, &cgnat, &wan_link, &ctl_host_gw, &host_veth] {
        assert_eq!(l.count(), 1);
    }
    let c_logs = sb.logs(&c_id, false, 1 << 16).await.unwrap();
    assert!(c_logs.contains("ACCEPT addr=0.0.0.0:7000"), "{c_logs}");
}

fn jumps_to(listing: &str, builtin: &str, chain: &str) -> Vec<String> {
    listing
        .lines()
        .filter(|l| l.starts_with(&format!("-A {builtin} ")) && l.ends_with(&format!("-j {chain}")))
        .map(str::to_string)
        .collect()
}

/// Installing twice or over a crashed node's leftovers leaves one copy; a network still in
/// use keeps its rules; taking it down leaves nothing of ours in `iptables -S`.
#[tokio::test]
async fn rules_are_replaced_not_duplicated_and_removed_with_the_network() {
    let Some(sb) = docker_and_root("egress_rules").await else {
        return;
    };
    let (prefix, _) = run_id();
    let net = format!("{prefix}-rules");
    let _fw = FirewallGuard(vec![net.clone()]);
    let mut cleanup = Cleanup::default();
    cleanup.networks.push(net.clone());
    let fw = Firewall::detect().unwrap();
    let chains = Chains::of(&net);

    let first = sb.ensure_egress(&net, DnsAllow::Host).await.unwrap();
    let once = fw.listing().unwrap();
    let second = sb.ensure_egress(&net, DnsAllow::Host).await.unwrap();
    assert_eq!(first.bridge, second.bridge);
    let twice = fw.listing().unwrap();
    for (builtin, chain) in [("DOCKER-USER", &chains.forward), ("INPUT", &chains.input)] {
        assert_eq!(jumps_to(&twice, builtin, chain).len(), 1, "{twice}");
        assert!(jumps_to(&twice, builtin, chain)[0].contains(&format!("-i {}", first.bridge)));
    }
    let own = |l: &str| l.contains(&chains.forward) || l.contains(&chains.input);
    let count = |t: &str| t.lines().filter(|l| own(l)).count();
    assert_eq!(
        count(&once),
        count(&twice),
        "re-installing duplicated rules"
    );
    // Exactly the rule set of the pure function, in order.
    let installed: Vec<&str> = twice
        .lines()
        .filter(|l| {
            l.starts_with(&format!("-A {} ", chains.forward))
                || l.starts_with(&format!("-A {} ", chains.input))
        })
        .collect();
    let want = first.rules.chain_rules();
    assert_eq!(installed.len(), want.len(), "{twice}");
    // The jump is the first rule of DOCKER-USER and INPUT.
    let first_rule = |builtin: &str| {
        twice
            .lines()
            .find(|l| l.starts_with(&format!("-A {builtin} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        first_rule("DOCKER-USER").ends_with(&chains.forward),
        "{twice}"
    );
    assert!(first_rule("INPUT").ends_with(&chains.input), "{twice}");

    // A crashed node's leftover: a jump for an older bridge of the same network.
    sh(
        fw.backend().iptables(),
        &[
            "-w",
            "10",
            "-I",
            "DOCKER-USER",
            "2",
            "-i",
            &format!("{prefix}old"),
            "-m",
            "comment",
            "--comment",
            &format!("gridlease egress {net}"),
            "-j",
            &chains.forward,
        ],
    );
    assert_eq!(
        jumps_to(&fw.listing().unwrap(), "DOCKER-USER", &chains.forward).len(),
        2
    );
    sb.ensure_egress(&net, DnsAllow::Host).await.unwrap();
    let healed = fw.listing().unwrap();
    let j = jumps_to(&healed, "DOCKER-USER", &chains.forward);
    assert_eq!(j.len(), 1, "{healed}");
    assert!(j[0].contains(&format!("-i {}", first.bridge)));
    assert_eq!(count(&healed), count(&once));

    // The firewall refuses a bridge that does not exist (rules that match nothing).
    let ghost = EgressRules {
        network: net.clone(),
        bridge: format!("{prefix}none"),
        on_link: vec![],
        dns: vec![],
    };
    assert!(matches!(
        fw.apply(&ghost),
        Err(FirewallError::NoBridge { .. })
    ));

    // In use: kept.
    let image = run_image(&sb, &prefix, &mut cleanup).await;
    let spec = spec_on(&image, &format!("{prefix}-node"), &net, &["sleep", "60"]);
    let id = sb.create(&spec).await.unwrap();
    cleanup.containers.push(id.clone());
    sb.start(&id).await.unwrap();
    assert_eq!(
        sb.teardown_egress(&net).await.unwrap(),
        Teardown::InUse { containers: 1 }
    );
    assert!(fw.installed(&net).unwrap());
    sb.remove(&id).await.unwrap();

    // Torn down: neither chain, nor a jump, nor the network's name is left.
    assert_eq!(
        sb.teardown_egress(&net).await.unwrap(),
        Teardown::Removed { rules: true }
    );
    let after = fw.listing().unwrap();
    assert!(
        !after.contains(&chains.forward) && !after.contains(&chains.input),
        "{after}"
    );
    assert!(!after.contains(&net), "{after}");
    let save = Command::new(fw.backend().save())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(
        !save.contains(&net) && !save.contains(&chains.forward),
        "{save}"
    );
    assert!(matches!(
        sb.docker().inspect_network(&net, None).await,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        })
    ));
    assert_eq!(
        sb.teardown_egress(&net).await.unwrap(),
        Teardown::Removed { rules: false }
    );
}
