//! How this node is reached: what AutoNAT v2 observed about its addresses (the NAT status
//! `status` shows), and the open connections per peer, relayed or direct, so a relayed
//! connection is closed once a direct one (hole punched by DCUtR, or dialed) carries the
//! peer's traffic. Pure state; the event loop feeds it swarm events.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use gridlease_protocol::PeerId;
use libp2p::Multiaddr;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;

pub(super) mod liveness;
mod state;

pub(super) use state::{Reach, on_dcutr};

/// Most addresses remembered per AutoNAT verdict (oldest forgotten first).
pub const MAX_PROBED_ADDRS: usize = 16;

/// A relayed connection is closed this long after a direct connection to the same peer came
/// up: requests already sent on it (request-response spreads requests over a peer's
/// connections) are answered first.
pub const RELAYED_CLOSE_DELAY: Duration = Duration::from_secs(3);

/// Reachability as observed by AutoNAT v2 dial-backs (never what was configured).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NatStatus {
    /// An AutoNAT server dialed one of our addresses back: reachable from outside.
    Public,
    /// Every address an AutoNAT server tried to dial back failed (behind a NAT or firewall);
    /// peers reach this node through a relay, or a hole punch.
    Private,
    /// No AutoNAT verdict yet (no AutoNAT server connected, or no candidate address).
    Unknown,
}

impl NatStatus {
    /// `public`, `private` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Public => "public",
            Self::Private => "private",
            Self::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for NatStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What AutoNAT v2 found, per address (the latest verdict counts).
#[derive(Debug, Default)]
pub struct Observed {
    reachable: VecDeque<Multiaddr>,
    unreachable: VecDeque<Multiaddr>,
}

fn remember(list: &mut VecDeque<Multiaddr>, addr: Multiaddr) {
    list.retain(|a| *a != addr);
    if list.len() >= MAX_PROBED_ADDRS {
        list.pop_front();
    }
    list.push_back(addr);
}

impl Observed {
    /// An AutoNAT probe of `addr` ended.
    pub fn probed(&mut self, addr: Multiaddr, reachable: bool) {
        if reachable {
            self.unreachable.retain(|a| *a != addr);
            remember(&mut self.reachable, addr);
        } else {
            self.reachable.retain(|a| *a != addr);
            remember(&mut self.unreachable, addr);
        }
    }

    /// The status these verdicts give.
    pub fn status(&self) -> NatStatus {
        if !self.reachable.is_empty() {
            NatStatus::Public
        } else if !self.unreachable.is_empty() {
            NatStatus::Private
        } else {
            NatStatus::Unknown
        }
    }

    /// Addresses dialed back successfully.
    pub fn reachable(&self) -> Vec<Multiaddr> {
        self.reachable.iter().cloned().collect()
    }

    /// Addresses whose dial-back failed.
    pub fn unreachable(&self) -> Vec<Multiaddr> {
        self.unreachable.iter().cloned().collect()
    }
}

/// Whether an address goes through a relay (`/p2p-circuit`).
pub fn is_relayed(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| matches!(p, Protocol::P2pCircuit))
}

/// Whether an address is on the loopback interface (`127.0.0.0/8`, `::1`).
pub fn is_loopback(addr: &Multiaddr) -> bool {
    match addr.iter().next() {
        Some(Protocol::Ip4(ip)) => ip.is_loopback(),
        Some(Protocol::Ip6(ip)) => ip.is_loopback(),
        _ => false,
    }
}

/// Whether an address is a direct one that could be reachable from the internet: not
/// relayed, not loopback, private (RFC 1918, IPv6 unique-local), link-local, shared (CGNAT,
/// 100.64.0.0/10) or unspecified.
pub fn is_public_direct(addr: &Multiaddr) -> bool {
    if is_relayed(addr) {
        return false;
    }
    match addr.iter().next() {
        Some(Protocol::Ip4(ip)) => {
            let o = ip.octets();
            !(ip.is_private()
                || ip.is_loopback()
                || ip.is_link_local()
                || ip.is_unspecified()
                || ip.is_broadcast()
                || (o[0] == 100 && (o[1] & 0xc0) == 64))
        }
        Some(Protocol::Ip6(ip)) => {
            let s = ip.segments();
            !(ip.is_loopback()
                || ip.is_unspecified()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80)
        }
        _ => false,
    }
}

/// The address without its final `/p2p/<id>` (where it is, not whom it reaches; a relayed
/// address keeps its relay's id).
pub fn transport_part(addr: &Multiaddr) -> Multiaddr {
    let mut a = addr.clone();
    if matches!(a.iter().last(), Some(Protocol::P2p(_))) {
        a.pop();
    }
    a
}

/// Which of a peer's announced addresses this node should dial: never one of its own direct
/// addresses (`own`: its listen addresses), loopback ones only when the peer announces
/// nothing else. Dialing an address that reaches this node itself (the same LAN address,
/// `127.0.0.1:4001` when both listen there) gives a connection with the wrong peer id, and
/// libp2p fails the whole dial on it, the peer's good addresses with it. Relayed addresses
/// name their target and are always kept.
pub fn dialable(addrs: &[Multiaddr], own: &[Multiaddr]) -> Vec<Multiaddr> {
    let own: Vec<Multiaddr> = own
        .iter()
        .filter(|a| !is_relayed(a))
        .map(transport_part)
        .collect();
    let beyond_loopback = addrs.iter().any(|a| !is_loopback(a));
    addrs
        .iter()
        .filter(|a| {
            is_relayed(a)
                || ((!beyond_loopback || !is_loopback(a)) && !own.contains(&transport_part(a)))
        })
        .cloned()
        .collect()
}

/// One open connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// The swarm's id.
    pub id: ConnectionId,
    /// The peer's address on it; for a relayed connection this node accepted, its own
    /// relayed address the peer came through (it names the relay).
    pub remote: Multiaddr,
    /// Through a relay.
    pub relayed: bool,
    /// This node dialed it (the remote address is one it can reach).
    pub dialer: bool,
}

/// The open connections per peer (bounded by what the swarm holds: entries leave with their
/// connection), and the relayed ones due to be closed.
#[derive(Debug, Default)]
pub struct Connections {
    by_peer: HashMap<PeerId, Vec<Connection>>,
    /// Relayed connections to close at the instant (one per connection at most).
    closing: Vec<(Instant, PeerId, ConnectionId)>,
}

impl Connections {
    /// A connection came up. A direct one schedules the peer's relayed connections to close
    /// after [`RELAYED_CLOSE_DELAY`]; a relayed one to a peer with a direct connection is
    /// scheduled at once.
    pub fn established(&mut self, peer: PeerId, conn: Connection, now: Instant) {
        let list = self.by_peer.entry(peer).or_default();
        list.retain(|c| c.id != conn.id);
        list.push(conn);
        if list.iter().any(|c| !c.relayed) {
            let due = now + RELAYED_CLOSE_DELAY;
            for c in list.iter().filter(|c| c.relayed) {
                if !self.closing.iter().any(|(_, _, id)| *id == c.id) {
                    self.closing.push((due, peer, c.id));
                }
            }
        }
    }

    /// A connection closed.
    pub fn closed(&mut self, peer: &PeerId, id: ConnectionId) {
        if let Some(list) = self.by_peer.get_mut(peer) {
            list.retain(|c| c.id != id);
            if list.is_empty() {
                self.by_peer.remove(peer);
            }
        }
        self.closing.retain(|(_, _, c)| *c != id);
    }

    /// Relayed connections whose delay is over (taken off the schedule), to be closed if the
    /// peer still has a direct connection.
    pub fn due(&mut self, now: Instant) -> Vec<(PeerId, ConnectionId)> {
        let mut out = Vec::new();
        let by_peer = &self.by_peer;
        self.closing.retain(|(at, peer, id)| {
            if *at > now {
                return true;
            }
            let direct = by_peer
                .get(peer)
                .is_some_and(|l| l.iter().any(|c| !c.relayed));
            if direct {
                out.push((*peer, *id));
            }
            false
        });
        out
    }

    /// The open connections to `peer`.
    pub fn of(&self, peer: &PeerId) -> Vec<Connection> {
        self.by_peer.get(peer).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> Multiaddr {
        s.parse().unwrap()
    }

    #[test]
    fn public_direct_addresses() {
        for (a, public) in [
            ("/ip4/198.18.0.3/tcp/4001", true),
            ("/ip4/203.0.113.7/udp/4001/quic-v1", true),
            ("/ip4/10.1.0.10/tcp/4001", false),
            ("/ip4/192.168.1.2/tcp/4001", false),
            ("/ip4/100.64.3.4/tcp/4001", false),
            ("/ip4/127.0.0.1/tcp/4001", false),
            ("/ip4/169.254.169.254/tcp/80", false),
            ("/ip6/fd00::1/tcp/4001", false),
            ("/ip6/2001:db8::1/tcp/4001", true),
            ("/ip4/198.18.0.1/tcp/4001/p2p-circuit", false),
        ] {
            assert_eq!(is_public_direct(&addr(a)), public, "{a}");
        }
    }

    #[test]
    fn dialable_leaves_out_own_and_loopback_addresses() {
        let peer = PeerId::random();
        let relay = PeerId::random();
        let theirs = [
            addr("/ip4/127.0.0.1/tcp/4001"),
            addr("/ip4/10.1.0.10/tcp/4001"),
            addr("/ip4/10.2.0.10/tcp/4001"),
            addr(&format!(
                "/ip4/198.18.0.1/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{peer}"
            )),
        ];
        let me = PeerId::random();
        let own = [
            addr(&format!("/ip4/10.2.0.10/tcp/4001/p2p/{me}")),
            addr(&format!(
                "/ip4/198.18.0.1/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{me}"
            )),
        ];
        assert_eq!(
            dialable(&theirs, &own),
            vec![theirs[1].clone(), theirs[3].clone()]
        );
        let local = [addr("/ip4/127.0.0.1/tcp/5000")];
        assert_eq!(
            dialable(&local, &[]),
            local.to_vec(),
            "a node on one machine"
        );
    }

    #[test]
    fn loopback_and_transport_parts() {
        assert!(is_loopback(&addr("/ip4/127.0.0.1/tcp/4001")));
        assert!(!is_loopback(&addr("/ip4/10.1.0.10/tcp/4001")));
        let id = PeerId::random();
        assert_eq!(
            transport_part(&addr(&format!("/ip4/10.1.0.10/udp/4001/quic-v1/p2p/{id}"))),
            addr("/ip4/10.1.0.10/udp/4001/quic-v1")
        );
        let relay = PeerId::random();
        let circuit = format!("/ip4/198.18.0.1/tcp/4001/p2p/{relay}/p2p-circuit");
        assert_eq!(
            transport_part(&addr(&format!("{circuit}/p2p/{id}"))),
            addr(&circuit),
            "a relayed address keeps its relay"
        );
    }

    #[test]
    fn status_follows_the_latest_verdict_per_address() {
        let mut o = Observed::default();
        assert_eq!(o.status(), NatStatus::Unknown);
        let a = addr("/ip4/198.18.0.10/tcp/4001");
        o.probed(a.clone(), false);
        assert_eq!(o.status(), NatStatus::Private);
        o.probed(a.clone(), true);
        assert_eq!(o.status(), NatStatus::Public);
        assert!(o.unreachable().is_empty());
        o.probed(a, false);
        assert_eq!(o.status(), NatStatus::Private);
    }

    #[test]
    fn verdicts_are_bounded() {
        let mut o = Observed::default();
        for port in 0..100u16 {
            o.probed(addr(&format!("/ip4/198.18.0.1/tcp/{port}")), false);
        }
        assert_eq!(o.unreachable().len(), MAX_PROBED_ADDRS);
    }

    #[test]
    fn a_direct_connection_retires_the_relayed_one_after_the_delay() {
        let mut c = Connections::default();
        let peer = PeerId::random();
        let t = Instant::now();
        let relayed = ConnectionId::new_unchecked(1);
        let direct = ConnectionId::new_unchecked(2);
        c.established(
            peer,
            Connection {
                id: relayed,
                remote: addr("/ip4/198.18.0.1/tcp/1/p2p-circuit"),
                relayed: true,
                dialer: true,
            },
            t,
        );
        assert!(
            c.due(t + RELAYED_CLOSE_DELAY * 2).is_empty(),
            "no direct one"
        );
        c.established(
            peer,
            Connection {
                id: direct,
                remote: addr("/ip4/198.18.0.2/tcp/1"),
                relayed: false,
                dialer: true,
            },
            t,
        );
        assert!(c.due(t).is_empty(), "not before the delay");
        assert_eq!(c.due(t + RELAYED_CLOSE_DELAY), vec![(peer, relayed)]);
        assert!(c.due(t + RELAYED_CLOSE_DELAY).is_empty(), "once");
        c.closed(&peer, relayed);
        assert_eq!(c.of(&peer).len(), 1);
        c.closed(&peer, direct);
        assert!(c.of(&peer).is_empty());
    }

    #[test]
    fn a_relayed_connection_is_kept_when_the_direct_one_closed_first() {
        let mut c = Connections::default();
        let peer = PeerId::random();
        let t = Instant::now();
        let (relayed, direct) = (
            ConnectionId::new_unchecked(1),
            ConnectionId::new_unchecked(2),
        );
        for (id, relayed, a) in [
            (relayed, true, "/ip4/198.18.0.1/tcp/1/p2p-circuit"),
            (direct, false, "/ip4/198.18.0.2/tcp/1"),
        ] {
            c.established(
                peer,
                Connection {
                    id,
                    remote: addr(a),
                    relayed,
                    dialer: true,
                },
                t,
            );
        }
        c.closed(&peer, direct);
        assert!(c.due(t + RELAYED_CLOSE_DELAY).is_empty());
    }
}
