//! Host firewall rules for the egress bridge: an `egress` tenant reaches the internet, not the
//! provider's LAN, link-local or cloud metadata addresses, multicast, the host itself or
//! other tenants.
//!
//! The rule set is a pure function of [`EgressRules`] (the Docker network, its bridge
//! interface, the host's on-link subnets and the DNS resolvers Docker forwards to):
//! [`EgressRules::install_script`] turns it into one `iptables-restore --noflush` transaction,
//! [`removal_script`] into the one that takes it out. [`Firewall`] is the edge: it finds the
//! iptables backend dockerd uses ([`choose_backend`]: the one holding Docker's `DOCKER-USER`
//! chain, nf_tables or legacy, detected at run time) and runs the scripts.
//!
//! Rules, in the filter table, per egress network (chain names from [`Chains::of`]):
//! - `DOCKER-USER`, first rule: `-i <bridge> -j GLEG-<hash>-FWD`. That chain lets replies of
//!   established connections through (`RETURN`), then DNS to the resolvers Docker forwards
//!   to (udp/tcp 53, only those addresses), and rejects (`icmp-admin-prohibited`) everything
//!   addressed to [`BLOCKED`] and to the host's on-link subnets; the rest returns to Docker's
//!   own rules (which accept the bridge's outbound traffic and masquerade it).
//! - `INPUT`, first rule: `-i <bridge> -j GLEG-<hash>-IN`: established replies and the same
//!   DNS exceptions return, everything else from the bridge to any host address (the bridge
//!   gateway, every other interface's address, broadcast) is rejected. Docker's embedded DNS
//!   (`127.0.0.11`) listens inside each container's own network namespace, so it needs no
//!   exception here (checked by `sandbox/tests/egress.rs`).
//!
//! Installing is atomic and idempotent: the script declares (creates or flushes) the chains,
//! deletes every existing jump to them (stale ones from a node that crashed, or from an older
//! bridge) and inserts the new jumps, in one commit; running it twice leaves one copy.
//!
//! Requirements: root (or `CAP_NET_ADMIN` + `CAP_NET_RAW` for iptables), dockerd managing
//! iptables (its `DOCKER-USER` chain exists), and `net.bridge.bridge-nf-call-iptables = 1`
//! (bridged traffic between tenants passes iptables; Docker turns it on for a bridge with
//! inter-container traffic disabled). IPv4 only: the egress bridge has no IPv6 and Docker
//! disables IPv6 inside its containers (`disable_ipv6 = 1`, checked by the test).

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::Duration;

use backon::{BlockingRetryable, ConstantBuilder};

use crate::runtime::{Sandbox, SandboxError};

/// An IPv4 network in CIDR form (host bits zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ipv4Net {
    addr: Ipv4Addr,
    prefix: u8,
}

impl Ipv4Net {
    /// `a.b.c.d/prefix` with the host bits cleared; `None` when `prefix > 32`.
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Option<Self> {
        (prefix <= 32).then(|| Self {
            addr: Ipv4Addr::from(u32::from(addr) & mask(prefix)),
            prefix,
        })
    }

    const fn of(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Self {
        Self {
            addr: Ipv4Addr::new(a, b, c, d),
            prefix,
        }
    }

    /// The network address.
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is in this network.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.prefix) == u32::from(self.addr)
    }

    /// Whether every address of `other` is in this network.
    pub fn covers(&self, other: &Ipv4Net) -> bool {
        other.prefix >= self.prefix && self.contains(other.addr)
    }
}

impl std::fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl std::str::FromStr for Ipv4Net {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, p) = s.split_once('/').unwrap_or((s, "32"));
        let addr: Ipv4Addr = a
            .parse()
            .map_err(|_| format!("{s:?} is not an IPv4 network"))?;
        let prefix: u8 = p
            .parse()
            .map_err(|_| format!("{s:?} has no valid prefix"))?;
        Self::new(addr, prefix).ok_or_else(|| format!("{s:?} has a prefix above 32"))
    }
}

fn mask(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p => u32::MAX << (32 - u32::from(p.min(32))),
    }
}

/// Destinations an egress tenant never reaches, with why (besides the host's own on-link
/// subnets, [`EgressRules::on_link`], and the host itself, the `INPUT` chain).
pub const BLOCKED: &[(Ipv4Net, &str)] = &[
    (Ipv4Net::of(0, 0, 0, 0, 8), "\"this network\" (RFC 1122)"),
    (Ipv4Net::of(10, 0, 0, 0, 8), "private LAN (RFC 1918)"),
    (
        Ipv4Net::of(100, 64, 0, 0, 10),
        "carrier-grade NAT (RFC 6598)",
    ),
    (Ipv4Net::of(127, 0, 0, 0, 8), "loopback"),
    (
        Ipv4Net::of(169, 254, 0, 0, 16),
        "link-local, incl. cloud metadata 169.254.169.254 (RFC 3927)",
    ),
    (Ipv4Net::of(172, 16, 0, 0, 12), "private LAN (RFC 1918)"),
    (Ipv4Net::of(192, 168, 0, 0, 16), "private LAN (RFC 1918)"),
    (Ipv4Net::of(224, 0, 0, 0, 4), "multicast (RFC 5771)"),
    (
        Ipv4Net::of(240, 0, 0, 0, 4),
        "reserved, incl. broadcast 255.255.255.255 (RFC 1112)",
    ),
];

/// Shortest on-link prefix treated as a LAN: a route like `0.0.0.0/0 dev ppp0` (no gateway,
/// point-to-point) is the internet, not a LAN.
pub const MIN_ON_LINK_PREFIX: u8 = 8;

/// The user-defined chains of one egress network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chains {
    /// Forwarded traffic from the bridge (jumped to from `DOCKER-USER`).
    pub forward: String,
    /// Traffic from the bridge to the host (jumped to from `INPUT`).
    pub input: String,
}

impl Chains {
    /// Chain names for the Docker network `network`: `GLEG-<8 hex of its FNV-1a hash>-FWD`
    /// and `-IN` (iptables allows 28 characters; network names are longer).
    pub fn of(network: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in network.as_bytes() {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let tag = format!("GLEG-{:08x}", (h ^ (h >> 32)) as u32);
        Self {
            forward: format!("{tag}-FWD"),
            input: format!("{tag}-IN"),
        }
    }

    fn both(&self) -> [&str; 2] {
        [&self.forward, &self.input]
    }
}

/// Everything the rules of one egress network depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressRules {
    /// The Docker network's name (named in each rule's comment; chains derive from it).
    pub network: String,
    /// Its bridge interface (`br-<id prefix>` unless the network names one).
    pub bridge: String,
    /// The host's on-link IPv4 subnets ([`on_link_subnets`]): the provider's LANs, whatever
    /// their addresses, blocked like [`BLOCKED`].
    pub on_link: Vec<Ipv4Net>,
    /// Resolvers Docker's embedded DNS forwards to ([`docker_upstream_dns`]); tenants may
    /// send DNS (udp/tcp port 53) to exactly these, wherever they are.
    pub dns: Vec<Ipv4Addr>,
}

impl EgressRules {
    /// The chains.
    pub fn chains(&self) -> Chains {
        Chains::of(&self.network)
    }

    /// Rejected destinations: [`BLOCKED`] plus the on-link subnets it does not already cover
    /// (prefixes shorter than [`MIN_ON_LINK_PREFIX`] ignored), sorted, no duplicates.
    pub fn blocked(&self) -> Vec<Ipv4Net> {
        let mut out: Vec<Ipv4Net> = BLOCKED.iter().map(|(n, _)| *n).collect();
        for n in &self.on_link {
            if n.prefix >= MIN_ON_LINK_PREFIX && !out.iter().any(|b| b.covers(n)) {
                out.push(*n);
            }
        }
        out.sort();
        out.dedup();
        out
    }

    fn comment(&self) -> String {
        format!("\"gridlease egress {}\"", sanitize(&self.network))
    }

    /// The rules of both chains, in order, as `-A CHAIN ...` lines (iptables-restore syntax).
    pub fn chain_rules(&self) -> Vec<String> {
        let c = self.chains();
        let comment = self.comment();
        let mut dns = self.dns.clone();
        dns.sort();
        dns.dedup();
        let reject = "-j REJECT --reject-with icmp-admin-prohibited";
        let mut out = Vec::new();
        for chain in c.both() {
            out.push(format!(
                "-A {chain} -m conntrack --ctstate RELATED,ESTABLISHED -m comment --comment {comment} -j RETURN"
            ));
            for ip in &dns {
                for proto in ["udp", "tcp"] {
                    out.push(format!(
                        "-A {chain} -d {ip}/32 -p {proto} -m {proto} --dport 53 -m comment --comment {comment} -j RETURN"
                    ));
                }
            }
        }
        for net in self.blocked() {
            out.push(format!(
                "-A {} -d {net} -m comment --comment {comment} {reject}",
                c.forward
            ));
        }
        out.push(format!(
            "-A {} -m comment --comment {comment} {reject}",
            c.input
        ));
        out
    }

    /// The jumps into the chains, each the first rule of its built-in chain.
    pub fn jumps(&self) -> Vec<String> {
        let c = self.chains();
        let comment = self.comment();
        vec![
            format!(
                "-I DOCKER-USER 1 -i {} -m comment --comment {comment} -j {}",
                self.bridge, c.forward
            ),
            format!(
                "-I INPUT 1 -i {} -m comment --comment {comment} -j {}",
                self.bridge, c.input
            ),
        ]
    }

    /// One `iptables-restore --noflush` transaction that installs the rules given the current
    /// filter table `listing` (`iptables -S`): declares (creates or flushes) both chains, fills
    /// them, deletes every jump to them found in `listing` and inserts the new jumps.
    pub fn install_script(&self, listing: &str) -> String {
        let c = self.chains();
        let mut s = String::from("*filter\n");
        for chain in c.both() {
            s.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for line in self.chain_rules() {
            s.push_str(&line);
            s.push('\n');
        }
        for line in stale_jumps(listing, &c) {
            s.push_str(&line);
            s.push('\n');
        }
        for line in self.jumps() {
            s.push_str(&line);
            s.push('\n');
        }
        s.push_str("COMMIT\n");
        s
    }
}

/// Keeps the characters a Docker network name may have, so a comment stays one token.
fn sanitize(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .collect()
}

/// `-D` lines for every rule in `listing` (`iptables -S` output) that jumps to one of
/// `chains`, in any built-in or user chain.
pub fn stale_jumps(listing: &str, chains: &Chains) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.trim().strip_prefix("-A "))
        .filter(|rest| {
            let mut words = rest.split_whitespace();
            let owner = words.next().unwrap_or_default();
            let mut target = None;
            while let Some(w) = words.next() {
                if w == "-j" || w == "-g" {
                    target = words.next();
                }
            }
            !chains.both().contains(&owner) && target.is_some_and(|t| chains.both().contains(&t))
        })
        .map(|rest| format!("-D {rest}"))
        .collect()
}

/// Whether `listing` (`iptables -S`) still holds either chain.
pub fn chains_present(listing: &str, chains: &Chains) -> bool {
    listing.lines().any(|l| {
        l.trim()
            .strip_prefix("-N ")
            .is_some_and(|n| chains.both().contains(&n.trim()))
    })
}

/// The `iptables-restore --noflush` transaction that removes the chains of `chains` and
/// every jump to them; `None` when `listing` shows nothing of them.
pub fn removal_script(listing: &str, chains: &Chains) -> Option<String> {
    let jumps = stale_jumps(listing, chains);
    let present: Vec<&str> = chains
        .both()
        .into_iter()
        .filter(|c| listing.lines().any(|l| l.trim() == format!("-N {c}")))
        .collect();
    if jumps.is_empty() && present.is_empty() {
        return None;
    }
    let mut s = String::from("*filter\n");
    for j in jumps {
        s.push_str(&j);
        s.push('\n');
    }
    for c in &present {
        s.push_str(&format!("-F {c}\n"));
    }
    for c in &present {
        s.push_str(&format!("-X {c}\n"));
    }
    s.push_str("COMMIT\n");
    Some(s)
}

/// The IPv4 subnets the host reaches directly (no gateway), from `/proc/net/route` text (the
/// main routing table; addresses in the kernel's byte order, printed as native `u32` hex).
pub fn on_link_subnets(proc_net_route: &str) -> Vec<Ipv4Net> {
    const RTF_UP: u32 = 0x1;
    const RTF_GATEWAY: u32 = 0x2;
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    let mut out: Vec<Ipv4Net> = proc_net_route
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 || f[0] == "lo" {
                return None;
            }
            let (dest, gw, flags, mask) = (hex(f[1])?, hex(f[2])?, hex(f[3])?, hex(f[7])?);
            if flags & RTF_UP == 0 || flags & RTF_GATEWAY != 0 || gw != 0 {
                return None;
            }
            let mask = u32::from_be_bytes(mask.to_ne_bytes());
            let prefix = u8::try_from(mask.leading_ones()).ok()?;
            Ipv4Net::new(Ipv4Addr::from(dest.to_ne_bytes()), prefix)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The resolvers Docker's embedded DNS forwards to, as Docker picks them: the IPv4
/// `nameserver`s of `/etc/resolv.conf`, or of systemd-resolved's upstream file when
/// `/etc/resolv.conf` names only `127.0.0.53`; loopback ones are dropped (Docker does too and
/// then falls back to public resolvers, which need no exception).
pub fn docker_upstream_dns(
    etc_resolv_conf: &str,
    systemd_resolv_conf: Option<&str>,
) -> Vec<Ipv4Addr> {
    let servers = |text: &str| -> Vec<Ipv4Addr> {
        text.lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some("nameserver"))
                    .then(|| w.next().and_then(|a| a.parse::<Ipv4Addr>().ok()))
                    .flatten()
            })
            .collect()
    };
    let etc = servers(etc_resolv_conf);
    let stub = Ipv4Addr::new(127, 0, 0, 53);
    let chosen = match systemd_resolv_conf {
        Some(up) if !etc.is_empty() && etc.iter().all(|a| *a == stub) => servers(up),
        _ => etc,
    };
    chosen.into_iter().filter(|a| !a.is_loopback()).collect()
}

/// The iptables variant dockerd writes its rules with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `iptables-nft` (the nf_tables kernel API).
    Nft,
    /// `iptables-legacy` (the x_tables kernel API).
    Legacy,
    /// Plain `iptables`, on a host that has neither suffixed binary.
    Plain,
}

impl Backend {
    /// The `iptables` binary.
    pub fn iptables(self) -> &'static str {
        match self {
            Self::Nft => "iptables-nft",
            Self::Legacy => "iptables-legacy",
            Self::Plain => "iptables",
        }
    }

    /// The matching `iptables-restore` binary.
    pub fn restore(self) -> &'static str {
        match self {
            Self::Nft => "iptables-nft-restore",
            Self::Legacy => "iptables-legacy-restore",
            Self::Plain => "iptables-restore",
        }
    }

    /// The matching `iptables-save` binary.
    pub fn save(self) -> &'static str {
        match self {
            Self::Nft => "iptables-nft-save",
            Self::Legacy => "iptables-legacy-save",
            Self::Plain => "iptables-save",
        }
    }
}

/// What asking one backend found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendProbe {
    /// The backend.
    pub backend: Backend,
    /// Its binary runs.
    pub installed: bool,
    /// Its filter table has Docker's `DOCKER-USER` chain.
    pub docker_user: bool,
    /// Its `FORWARD` chain jumps to `DOCKER-USER` (dockerd's current rules).
    pub forward_jump: bool,
    /// Why the chain could not be read, if it could not (permission, missing chain).
    pub error: Option<String>,
}

/// Picks dockerd's backend: the one whose `FORWARD` jumps to `DOCKER-USER`, else the one
/// that has the chain; nf_tables first when both qualify (a packet passes both backends'
/// hooks, so a reject in either holds; Docker 20.10+ prefers nf_tables where present).
pub fn choose_backend(probes: &[BackendProbe]) -> Result<Backend, FirewallError> {
    let pick = |ok: &dyn Fn(&BackendProbe) -> bool| {
        [Backend::Nft, Backend::Legacy, Backend::Plain]
            .into_iter()
            .find(|b| probes.iter().any(|p| p.backend == *b && ok(p)))
    };
    if let Some(b) = pick(&|p| p.docker_user && p.forward_jump) {
        return Ok(b);
    }
    if let Some(b) = pick(&|p| p.docker_user) {
        return Ok(b);
    }
    if !probes.iter().any(|p| p.installed) {
        return Err(FirewallError::NoIptables);
    }
    let detail = probes
        .iter()
        .filter(|p| p.installed)
        .map(|p| {
            format!(
                "{}: {}",
                p.backend.iptables(),
                p.error.as_deref().unwrap_or("no DOCKER-USER chain")
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    Err(FirewallError::NoDockerChain { detail })
}

/// The host firewall could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    /// No iptables binary runs on this host.
    #[error("no iptables binary (iptables-nft, iptables-legacy or iptables) runs on this host")]
    NoIptables,
    /// No backend has Docker's chain.
    #[error(
        "Docker's DOCKER-USER chain was not found ({detail}); the node must run as root (or with CAP_NET_ADMIN) and dockerd must manage iptables"
    )]
    NoDockerChain {
        /// What each backend said.
        detail: String,
    },
    /// A command could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The binary.
        program: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A command failed.
    #[error("{program} {args} failed ({status}): {stderr}")]
    Command {
        /// The binary.
        program: &'static str,
        /// Its arguments.
        args: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr (last lines).
        stderr: String,
    },
    /// Bridged traffic does not pass iptables, so tenants on one bridge are not separated.
    #[error(
        "net.bridge.bridge-nf-call-iptables is {value:?}, not 1: traffic between tenants on the egress bridge would bypass the firewall"
    )]
    BridgeNetfilter {
        /// What the sysctl reads.
        value: String,
    },
    /// The bridge interface named by Docker does not exist.
    #[error("the egress bridge interface {bridge} does not exist")]
    NoBridge {
        /// The interface.
        bridge: String,
    },
    /// A host fact the rules need could not be read.
    #[error("cannot read {path}: {source}")]
    HostFact {
        /// The file.
        path: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Serializes read-then-restore sequences of this process (two lease starts at once would
/// otherwise each delete the same stale jump, and the second transaction would fail).
static APPLY_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Finds `name` in the system directories first (a root service's `PATH` may lack `sbin`),
/// then on `PATH`.
fn binary(name: &str) -> std::path::PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| name.into())
}

fn run(program: &'static str, args: &[&str], stdin: Option<&str>) -> Result<String, FirewallError> {
    use std::io::Write;
    let mut child = Command::new(binary(program))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| FirewallError::Spawn { program, source })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|source| FirewallError::Spawn { program, source })?;
    }
    let out = child
        .wait_with_output()
        .map_err(|source| FirewallError::Spawn { program, source })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.contains("iptables-legacy tables present"))
        .collect();
    Err(FirewallError::Command {
        program,
        args: args.join(" "),
        status: out.status.to_string(),
        stderr: stderr[stderr.len().saturating_sub(4)..].join(" / "),
    })
}

/// The host firewall through dockerd's iptables backend. Every method blocks (it runs
/// iptables); call it from `spawn_blocking` in async code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Firewall {
    backend: Backend,
}

impl Firewall {
    /// Uses `backend` as is (tests; [`Firewall::detect`] finds dockerd's).
    pub fn with_backend(backend: Backend) -> Self {
        Self { backend }
    }

    /// Asks each backend for Docker's chain and picks dockerd's ([`choose_backend`]).
    pub fn detect() -> Result<Self, FirewallError> {
        let mut probes = Vec::new();
        for backend in [Backend::Nft, Backend::Legacy] {
            probes.push(probe(backend));
        }
        if !probes.iter().any(|p| p.installed) {
            probes.push(probe(Backend::Plain));
        }
        let backend = choose_backend(&probes)?;
        tracing::debug!(iptables = backend.iptables(), "firewall backend");
        Ok(Self { backend })
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The filter table as `iptables -S` prints it.
    pub fn listing(&self) -> Result<String, FirewallError> {
        run(
            self.backend.iptables(),
            &["-w", "10", "-t", "filter", "-S"],
            None,
        )
    }

    fn restore(&self, script: &str) -> Result<(), FirewallError> {
        run(
            self.backend.restore(),
            &["--wait=10", "--noflush"],
            Some(script),
        )
        .map(|_| ())
    }

    /// Installs (or replaces: stale jumps and old rules go, in the same transaction) the rules
    /// of `rules`. Refuses when bridged traffic bypasses iptables or the bridge is missing.
    pub fn apply(&self, rules: &EgressRules) -> Result<(), FirewallError> {
        let path = "/proc/sys/net/bridge/bridge-nf-call-iptables";
        let value = std::fs::read_to_string(path).unwrap_or_else(|_| "absent".into());
        if value.trim() != "1" {
            return Err(FirewallError::BridgeNetfilter {
                value: value.trim().to_string(),
            });
        }
        if !std::path::Path::new("/sys/class/net")
            .join(&rules.bridge)
            .exists()
        {
            return Err(FirewallError::NoBridge {
                bridge: rules.bridge.clone(),
            });
        }
        let _guard = APPLY_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        (|| {
            let listing = self.listing().map_err(Attempt::Fatal)?;
            self.restore(&rules.install_script(&listing))
                .map_err(Attempt::Conflict)
        })
        .retry(RETRY_TRANSACTION)
        .sleep(std::thread::sleep)
        // Another process changed the table between the read and the commit.
        .when(Attempt::is_conflict)
        .notify(|e, _| {
            tracing::debug!(error = %e.error(), "firewall transaction failed; retrying");
        })
        .call()
        .map_err(Attempt::into_error)?;
        tracing::info!(
            network = %rules.network,
            bridge = %rules.bridge,
            iptables = self.backend.iptables(),
            blocked = rules.blocked().len(),
            dns = ?rules.dns,
            "egress firewall rules installed"
        );
        Ok(())
    }

    /// Removes the rules of `network` (its chains and every jump to them). `Ok(false)` when
    /// there were none.
    pub fn remove(&self, network: &str) -> Result<bool, FirewallError> {
        let chains = Chains::of(network);
        let _guard = APPLY_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let removed = (|| {
            let listing = self.listing().map_err(Attempt::Fatal)?;
            let Some(script) = removal_script(&listing, &chains) else {
                return Ok(false);
            };
            self.restore(&script).map_err(Attempt::Conflict)?;
            Ok(true)
        })
        .retry(RETRY_TRANSACTION)
        .sleep(std::thread::sleep)
        .when(Attempt::is_conflict)
        .notify(|e, _| {
            tracing::debug!(error = %e.error(), "firewall removal failed; retrying");
        })
        .call()
        .map_err(Attempt::into_error)?;
        if removed {
            tracing::info!(network, "egress firewall rules removed");
        }
        Ok(removed)
    }

    /// Whether the rules of `network` are installed (both chains exist).
    pub fn installed(&self, network: &str) -> Result<bool, FirewallError> {
        Ok(chains_present(&self.listing()?, &Chains::of(network)))
    }
}

/// How a firewall transaction is tried again when its commit fails (another process changed
/// the table between the read and the commit): 3 attempts in all, straight after each other.
const RETRY_TRANSACTION: ConstantBuilder = ConstantBuilder::new()
    .with_delay(Duration::ZERO)
    .with_max_times(2);

/// Why one attempt at a firewall transaction failed: reading the table is not tried again,
/// committing the change is.
#[derive(Debug)]
enum Attempt {
    /// Listing the rules failed: given up at once.
    Fatal(FirewallError),
    /// The commit failed: tried again.
    Conflict(FirewallError),
}

impl Attempt {
    /// Whether this attempt is tried again.
    fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict(_))
    }

    /// The failure.
    fn error(&self) -> &FirewallError {
        match self {
            Self::Fatal(e) | Self::Conflict(e) => e,
        }
    }

    /// The failure, as the caller reports it.
    fn into_error(self) -> FirewallError {
        match self {
            Self::Fatal(e) | Self::Conflict(e) => e,
        }
    }
}

fn probe(backend: Backend) -> BackendProbe {
    let mut p = BackendProbe {
        backend,
        installed: false,
        docker_user: false,
        forward_jump: false,
        error: None,
    };
    match run(
        backend.iptables(),
        &["-w", "10", "-t", "filter", "-S", "DOCKER-USER"],
        None,
    ) {
        Ok(_) => {
            p.installed = true;
            p.docker_user = true;
        }
        Err(FirewallError::Spawn { .. }) => return p,
        Err(e) => {
            p.installed = true;
            p.error = Some(e.to_string());
        }
    }
    if let Ok(fwd) = run(
        backend.iptables(),
        &["-w", "10", "-t", "filter", "-S", "FORWARD"],
        None,
    ) {
        p.forward_jump = fwd.lines().any(|l| {
            l.split_whitespace()
                .collect::<Vec<_>>()
                .ends_with(&["-j", "DOCKER-USER"])
        });
    }
    p
}

/// The host facts the rules need, read now: on-link subnets (`/proc/net/route`) and the
/// resolvers Docker forwards to (`/etc/resolv.conf`, systemd-resolved's upstream file).
pub fn host_facts() -> Result<(Vec<Ipv4Net>, Vec<Ipv4Addr>), FirewallError> {
    let read = |path: &'static str| {
        std::fs::read_to_string(path).map_err(|source| FirewallError::HostFact { path, source })
    };
    let routes = read("/proc/net/route")?;
    let resolv = read("/etc/resolv.conf").unwrap_or_default();
    let systemd = std::fs::read_to_string("/run/systemd/resolve/resolv.conf").ok();
    Ok((
        on_link_subnets(&routes),
        docker_upstream_dns(&resolv, systemd.as_deref()),
    ))
}

/// Which resolvers tenants may send DNS to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DnsAllow {
    /// Those Docker's embedded DNS forwards to on this host ([`docker_upstream_dns`]).
    Host,
    /// Exactly these (tests, or containers created with their own `--dns`).
    Only(Vec<Ipv4Addr>),
}

/// The egress network as created, with its firewall rules installed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressNetwork {
    /// Docker network name.
    pub name: String,
    /// Docker network id.
    pub id: String,
    /// Bridge interface.
    pub bridge: String,
    /// The bridge's gateway address (the host's address on it), if Docker reports one.
    pub gateway: Option<Ipv4Addr>,
    /// The rules installed.
    pub rules: EgressRules,
}

/// Setting up or taking down the egress network failed.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// A Docker call failed.
    #[error(transparent)]
    Docker(#[from] SandboxError),
    /// The firewall rules could not be read, installed or removed.
    #[error("egress firewall for network {network}: {source}")]
    Firewall {
        /// The Docker network.
        network: String,
        /// Why.
        #[source]
        source: FirewallError,
    },
    /// The blocking firewall task did not finish.
    #[error("the firewall task failed: {0}")]
    Task(String),
}

/// What [`Sandbox::teardown_egress`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Teardown {
    /// Network and rules removed (or there were none).
    Removed {
        /// Whether firewall rules were found and removed.
        rules: bool,
    },
    /// Containers are still attached (leases that outlive this node's run): network and rules
    /// are kept, so those tenants stay fenced in.
    InUse {
        /// How many containers.
        containers: usize,
    },
}

async fn blocking<T: Send + 'static>(
    network: &str,
    f: impl FnOnce() -> Result<T, FirewallError> + Send + 'static,
) -> Result<T, EgressError> {
    let network = network.to_string();
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(EgressError::Firewall { network, source }),
        Err(e) => Err(EgressError::Task(e.to_string())),
    }
}

/// The bridge interface of an inspected network: the name it was created with
/// (`com.docker.network.bridge.name`), else Docker's `br-<first 12 hex of the id>`.
pub fn bridge_of(id: &str, options: Option<&std::collections::HashMap<String, String>>) -> String {
    options
        .and_then(|o| o.get("com.docker.network.bridge.name"))
        .cloned()
        .unwrap_or_else(|| format!("br-{}", &id[..id.len().min(12)]))
}

impl Sandbox {
    /// Creates the egress bridge if missing ([`Sandbox::ensure_egress_network`]) and installs
    /// (or re-installs, replacing stale ones) its firewall rules. An egress container may only
    /// be started after this succeeded: on error, run none.
    pub async fn ensure_egress(
        &self,
        name: &str,
        dns: DnsAllow,
    ) -> Result<EgressNetwork, EgressError> {
        let id = self.ensure_egress_network(name).await?;
        let info = self
            .docker()
            .inspect_network(name, None)
            .await
            .map_err(|source| SandboxError::Docker {
                op: "inspect_network",
                target: name.to_string(),
                source,
            })?;
        let bridge = bridge_of(&id, info.options.as_ref());
        let gateway = info
            .ipam
            .and_then(|i| i.config)
            .and_then(|c| c.into_iter().find_map(|c| c.gateway))
            .and_then(|g| g.parse().ok());
        let (network, br) = (name.to_string(), bridge.clone());
        let rules = blocking(name, move || {
            let fw = Firewall::detect()?;
            let (on_link, host_dns) = host_facts()?;
            let rules = EgressRules {
                network,
                bridge: br,
                on_link,
                dns: match dns {
                    DnsAllow::Host => host_dns,
                    DnsAllow::Only(list) => list,
                },
            };
            fw.apply(&rules)?;
            Ok(rules)
        })
        .await?;
        Ok(EgressNetwork {
            name: name.to_string(),
            id,
            bridge,
            gateway,
            rules,
        })
    }

    /// Takes the egress network down: removes it, then its firewall rules, unless containers
    /// are still attached (then both stay: see [`Teardown::InUse`]). The network goes first,
    /// so no container can join it once its rules are gone.
    pub async fn teardown_egress(&self, name: &str) -> Result<Teardown, EgressError> {
        match self.docker().inspect_network(name, None).await {
            Ok(info) => {
                let attached = info.containers.map_or(0, |c| c.len());
                if attached > 0 {
                    return Ok(Teardown::InUse {
                        containers: attached,
                    });
                }
                if let Err(e) = self.remove_network(name).await {
                    // Attached meanwhile (Docker refuses to remove a network in use).
                    tracing::warn!(network = name, error = %e, "egress network not removed; keeping its firewall rules");
                    return Ok(Teardown::InUse { containers: 1 });
                }
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(source) => {
                return Err(SandboxError::Docker {
                    op: "inspect_network",
                    target: name.to_string(),
                    source,
                }
                .into());
            }
        }
        let network = name.to_string();
        let rules = blocking(name, move || {
            // No iptables or no Docker chain: nothing of ours can be installed either.
            match Firewall::detect() {
                Ok(fw) => fw.remove(&network),
                Err(FirewallError::NoIptables | FirewallError::NoDockerChain { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await?;
        Ok(Teardown::Removed { rules })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> EgressRules {
        EgressRules {
            network: "gridlease-egress".into(),
            bridge: "br-0123456789ab".into(),
            on_link: vec![
                "192.0.2.0/24".parse().unwrap(),
                "10.1.0.0/16".parse().unwrap(),
                "0.0.0.0/0".parse().unwrap(),
            ],
            dns: vec![Ipv4Addr::new(10, 255, 255, 53)],
        }
    }

    #[test]
    fn nets_parse_mask_and_cover() {
        let n: Ipv4Net = "10.1.2.3/8".parse().unwrap();
        assert_eq!(n.to_string(), "10.0.0.0/8");
        assert!(n.contains(Ipv4Addr::new(10, 200, 0, 1)));
        assert!(!n.contains(Ipv4Addr::new(11, 0, 0, 1)));
        assert!(n.covers(&"10.1.0.0/16".parse().unwrap()));
        assert!(!"10.1.0.0/16".parse::<Ipv4Net>().unwrap().covers(&n));
        assert_eq!(
            "1.2.3.4".parse::<Ipv4Net>().unwrap().to_string(),
            "1.2.3.4/32"
        );
        assert!("1.2.3.4/33".parse::<Ipv4Net>().is_err());
        assert!(
            "0.0.0.0/0"
                .parse::<Ipv4Net>()
                .unwrap()
                .contains(Ipv4Addr::BROADCAST)
        );
    }

    #[test]
    fn the_blocked_ranges_hold_every_address_the_issue_names_and_not_the_internet() {
        let r = rules();
        let blocked = r.blocked();
        let hit = |ip: [u8; 4]| blocked.iter().any(|n| n.contains(Ipv4Addr::from(ip)));
        for ip in [
            [10, 0, 0, 1],
            [172, 16, 0, 1],
            [172, 31, 255, 254],
            [192, 168, 1, 1],
            [100, 64, 0, 1],
            [100, 127, 255, 254],
            [169, 254, 169, 254],
            [169, 254, 0, 1],
            [224, 0, 0, 251],
            [239, 255, 255, 250],
            [255, 255, 255, 255],
            [127, 0, 0, 1],
            [0, 0, 0, 0],
            // The host's own LAN on a public range, from its on-link routes.
            [192, 0, 2, 1],
        ] {
            assert!(hit(ip), "{ip:?} must be blocked");
        }
        for ip in [
            [1, 1, 1, 1],
            [8, 8, 8, 8],
            [198, 18, 0, 1],
            [100, 128, 0, 1],
            [172, 32, 0, 1],
            [192, 169, 0, 1],
        ] {
            assert!(!hit(ip), "{ip:?} is the internet");
        }
        // The on-link /16 inside 10/8 and the /0 add nothing; 192.0.2.0/24 is added once.
        assert_eq!(blocked.len(), BLOCKED.len() + 1);
        assert!(blocked.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn chain_names_are_short_stable_and_per_network() {
        let a = Chains::of("gridlease-egress");
        assert_eq!(a, Chains::of("gridlease-egress"));
        assert_ne!(a.forward, Chains::of("gridlease-egress-2").forward);
        assert!(a.forward.len() <= 28 && a.input.len() <= 28);
        assert!(a.forward.starts_with("GLEG-") && a.forward.ends_with("-FWD"));
        assert!(a.input.ends_with("-IN"));
    }

    #[test]
    fn rules_keep_replies_and_dns_then_reject_the_lan_and_the_host() {
        let r = rules();
        let c = r.chains();
        let lines = r.chain_rules();
        let fwd: Vec<&String> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("-A {} ", c.forward)))
            .collect();
        let inp: Vec<&String> = lines
            .iter()
            .filter(|l| l.starts_with(&format!("-A {} ", c.input)))
            .collect();
        assert_eq!(fwd.len() + inp.len(), lines.len());
        for chain in [&fwd, &inp] {
            assert!(
                chain[0].contains("--ctstate RELATED,ESTABLISHED")
                    && chain[0].ends_with("-j RETURN")
            );
            assert!(chain[1].contains("-d 10.255.255.53/32 -p udp -m udp --dport 53"));
            assert!(chain[2].contains("-d 10.255.255.53/32 -p tcp -m tcp --dport 53"));
            assert!(chain[1].ends_with("-j RETURN") && chain[2].ends_with("-j RETURN"));
            assert!(
                chain[3..]
                    .iter()
                    .all(|l| l.ends_with("-j REJECT --reject-with icmp-admin-prohibited"))
            );
            assert!(
                chain
                    .iter()
                    .all(|l| l.contains("--comment \"gridlease egress gridlease-egress\""))
            );
        }
        let rejected: Vec<String> = fwd[3..]
            .iter()
            .map(|l| l.split_whitespace().nth(3).unwrap().to_string())
            .collect();
        let want: Vec<String> = r.blocked().iter().map(ToString::to_string).collect();
        assert_eq!(rejected, want);
        // INPUT: everything else from the bridge to the host is rejected, whatever the address.
        assert_eq!(inp.len(), 4);
        assert!(!inp[3].contains(" -d "));
        let jumps = r.jumps();
        assert_eq!(
            jumps[0],
            format!(
                "-I DOCKER-USER 1 -i br-0123456789ab -m comment --comment \"gridlease egress gridlease-egress\" -j {}",
                c.forward
            )
        );
        assert!(
            jumps[1].starts_with("-I INPUT 1 -i br-0123456789ab ") && jumps[1].ends_with(&c.input)
        );
    }

    #[test]
    fn install_replaces_stale_jumps_in_one_transaction_and_removal_undoes_it() {
        let r = rules();
        let c = r.chains();
        let listing = format!(
            "-P INPUT ACCEPT\n-N DOCKER-USER\n-N {f}\n-N {i}\n-A INPUT -i br-old -m comment --comment \"gridlease egress gridlease-egress\" -j {i}\n-A DOCKER-USER -i br-old -m comment --comment \"gridlease egress gridlease-egress\" -j {f}\n-A DOCKER-USER -i br-other -j GLEG-ffffffff-FWD\n-A DOCKER-USER -j RETURN\n-A {f} -d 10.0.0.0/8 -j REJECT\n-A {i} -j REJECT\n",
            f = c.forward,
            i = c.input
        );
        let stale = stale_jumps(&listing, &c);
        assert_eq!(stale.len(), 2, "{stale:?}");
        assert!(stale[0].starts_with("-D INPUT -i br-old"));
        assert!(stale[1].starts_with("-D DOCKER-USER -i br-old"));
        let script = r.install_script(&listing);
        let lines: Vec<&str> = script.lines().collect();
        assert_eq!(lines[0], "*filter");
        assert_eq!(lines[1], format!(":{} - [0:0]", c.forward));
        assert_eq!(lines[2], format!(":{} - [0:0]", c.input));
        assert_eq!(*lines.last().unwrap(), "COMMIT");
        // Deletes come before the inserts, so the new jumps are not deleted.
        let del = lines.iter().rposition(|l| l.starts_with("-D ")).unwrap();
        let ins = lines.iter().position(|l| l.starts_with("-I ")).unwrap();
        assert!(del < ins);
        assert_eq!(lines.iter().filter(|l| l.starts_with("-I ")).count(), 2);
        assert!(
            !script.contains("GLEG-ffffffff"),
            "another network's rules are left alone"
        );
        // Nothing installed: no stale jumps, same rules.
        assert!(stale_jumps("-N DOCKER-USER\n-A DOCKER-USER -j RETURN\n", &c).is_empty());

        let removal = removal_script(&listing, &c).unwrap();
        assert!(removal.contains(&format!("-F {}\n", c.forward)));
        assert!(removal.contains(&format!("-X {}\n", c.input)));
        assert_eq!(removal.matches("-D ").count(), 2);
        assert!(removal.find("-D ").unwrap() < removal.find("-X ").unwrap());
        assert!(chains_present(&listing, &c));
        let clean = "-P INPUT ACCEPT\n-N DOCKER-USER\n-A DOCKER-USER -j RETURN\n";
        assert_eq!(removal_script(clean, &c), None);
        assert!(!chains_present(clean, &c));
    }

    #[test]
    fn on_link_subnets_come_from_gatewayless_routes() {
        // As this kernel prints them (little-endian hex of the network-order address).
        let text = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
            eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
            docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
            wan0\t011312C6\t021212C6\t0007\t0\t0\t0\tFFFFFFFF\t0\t0\t0\n\
            lo\t0000007F\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n";
        if cfg!(target_endian = "little") {
            let got: Vec<String> = on_link_subnets(text)
                .iter()
                .map(ToString::to_string)
                .collect();
            assert_eq!(got, vec!["172.17.0.0/16", "192.0.2.0/24"]);
        }
    }

    #[test]
    fn dns_upstreams_follow_dockers_choice() {
        let etc =
            "# comment\nnameserver 10.255.255.53\nnameserver 127.0.0.1\nnameserver ::1\nsearch x\n";
        assert_eq!(
            docker_upstream_dns(etc, None),
            vec![Ipv4Addr::new(10, 255, 255, 53)]
        );
        let stub = "nameserver 127.0.0.53\noptions edns0\n";
        let up = "nameserver 192.168.1.1\nnameserver 9.9.9.9\n";
        assert_eq!(
            docker_upstream_dns(stub, Some(up)),
            vec![Ipv4Addr::new(192, 168, 1, 1), Ipv4Addr::new(9, 9, 9, 9)]
        );
        assert!(docker_upstream_dns(stub, None).is_empty());
        assert!(docker_upstream_dns("", Some(up)).is_empty());
    }

    #[test]
    fn backend_choice_follows_dockers_chain() {
        let p = |backend, installed, docker_user, forward_jump| BackendProbe {
            backend,
            installed,
            docker_user,
            forward_jump,
            error: None,
        };
        // This host: nf_tables holds Docker's rules, legacy tables exist but are empty.
        let host = [
            p(Backend::Nft, true, true, true),
            p(Backend::Legacy, true, false, false),
        ];
        assert_eq!(choose_backend(&host).unwrap(), Backend::Nft);
        let legacy = [
            p(Backend::Nft, true, false, false),
            p(Backend::Legacy, true, true, true),
        ];
        assert_eq!(choose_backend(&legacy).unwrap(), Backend::Legacy);
        // A leftover chain in one backend, the live jump in the other.
        let moved = [
            p(Backend::Nft, true, true, false),
            p(Backend::Legacy, true, true, true),
        ];
        assert_eq!(choose_backend(&moved).unwrap(), Backend::Legacy);
        let both = [
            p(Backend::Nft, true, true, true),
            p(Backend::Legacy, true, true, true),
        ];
        assert_eq!(choose_backend(&both).unwrap(), Backend::Nft);
        let old = [
            p(Backend::Nft, false, false, false),
            p(Backend::Legacy, false, false, false),
            p(Backend::Plain, true, true, true),
        ];
        assert_eq!(choose_backend(&old).unwrap(), Backend::Plain);
        let none = [p(Backend::Nft, true, false, false)];
        assert!(matches!(
            choose_backend(&none),
            Err(FirewallError::NoDockerChain { .. })
        ));
        assert!(matches!(
            choose_backend(&[p(Backend::Nft, false, false, false)]),
            Err(FirewallError::NoIptables)
        ));
    }

    #[test]
    fn bridge_name_is_the_option_or_dockers_default() {
        let id = "fefc015a6bb6fa7441bc721446c6f3a167d58fbd58533715750c9aeff784a9cd";
        assert_eq!(bridge_of(id, None), "br-fefc015a6bb6");
        let mut o = std::collections::HashMap::new();
        o.insert(
            "com.docker.network.bridge.name".to_string(),
            "gl0".to_string(),
        );
        assert_eq!(bridge_of(id, Some(&o)), "gl0");
    }

    #[test]
    fn comments_stay_one_token() {
        let mut r = rules();
        r.network = "evil\" -j ACCEPT #".into();
        assert!(
            r.chain_rules()
                .iter()
                .all(|l| l.contains("--comment \"gridlease egress evil-jACCEPT\""))
        );
    }
}
