//! The network loop's reach child ([`Reach`]): listen addresses, relay reservations,
//! AutoNAT verdicts, connections, connection reversals and connection liveness. Its methods
//! take the swarm and the time as parameters.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use gridlease_protocol::PeerId;
use libp2p::core::transport::ListenerId;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;
use libp2p::{Multiaddr, Swarm, autonat, dcutr, identify, relay};
use tokio::sync::oneshot;

use super::liveness::Liveness;
use super::{Connection, Connections, Observed};
use crate::net::behaviour::{Behaviour, IDENTIFY_PROTOCOL, KAD_PROTOCOL};
use crate::net::gossip;
use crate::net::loop_ctx::{LoopCtx, with_peer};
use crate::net::{NetworkEvent, NodeConfig};

/// Most relays this node keeps a reservation on.
const MAX_RELAYS: usize = 2;
/// Most peers with a connection reversal remembered at once.
const MAX_REVERSALS: usize = 1024;

/// How this node is reached and whom it is connected to.
pub(in crate::net) struct Reach {
    /// Our listen addresses, with `/p2p/<id>`.
    pub(in crate::net) listen_addrs: Vec<Multiaddr>,
    /// Clients waiting for the first listen address.
    listen_waiters: Vec<oneshot::Sender<Vec<Multiaddr>>>,
    /// Relays we asked for a reservation (at most [`MAX_RELAYS`]), with the listener that
    /// holds it: when it closes (the relay went away) the relay may be asked again.
    relays: Vec<(PeerId, ListenerId)>,
    /// Relays that accepted our reservation (a subset of `relays`).
    pub(in crate::net) reserved: Vec<PeerId>,
    /// What AutoNAT v2 observed about our addresses.
    pub(in crate::net) observed: Observed,
    /// Open connections per peer, relayed or direct.
    pub(in crate::net) connections: Connections,
    /// Peers reached only through a relay that this node dialed directly once (connection
    /// reversal), at most [`MAX_REVERSALS`]; forgotten when the peer disconnects.
    reversed: HashSet<PeerId>,
    /// Gossip that never started, lost bootstrap peers.
    pub(in crate::net) liveness: Liveness,
}

impl Reach {
    /// Nothing known yet; `grace` and `bootstrap` as [`Liveness::new`] takes them.
    pub(in crate::net) fn new(grace: Duration, bootstrap: &[Multiaddr]) -> Self {
        Self {
            listen_addrs: Vec::new(),
            listen_waiters: Vec::new(),
            relays: Vec::new(),
            reserved: Vec::new(),
            observed: Observed::default(),
            connections: Connections::default(),
            reversed: HashSet::new(),
            liveness: Liveness::new(grace, bootstrap),
        }
    }

    /// Answers `reply` with the listen addresses, or once the first is bound.
    pub(in crate::net) fn listen_addrs(&mut self, reply: oneshot::Sender<Vec<Multiaddr>>) {
        if self.listen_addrs.is_empty() {
            self.listen_waiters.push(reply);
        } else {
            let _ = reply.send(self.listen_addrs.clone());
        }
    }

    /// Disconnects gridlease peers whose gossip never started (the next connection starts
    /// it afresh) and dials lost bootstrap peers whose backoff is over (`liveness.rs`).
    pub(in crate::net) fn check_liveness(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        grace: Duration,
        now: Instant,
    ) {
        for peer in self.liveness.overdue(now) {
            tracing::info!(%peer, grace_s = grace.as_secs_f64(), "gossip with this peer did not start; disconnecting so it starts on a new connection");
            let _ = swarm.disconnect_peer_id(peer);
        }
        for addr in self.liveness.due(now) {
            tracing::info!(%addr, "dialing a lost bootstrap peer again");
            if let Err(e) = swarm.dial(addr.clone()) {
                tracing::debug!(%addr, error = %e, "cannot dial bootstrap peer");
            }
        }
    }

    /// Closes relayed connections to peers that have a direct one now (hole punched or
    /// dialed): the lease's traffic then rides the direct connection only.
    pub(in crate::net) fn retire_relayed(&mut self, swarm: &mut Swarm<Behaviour>, now: Instant) {
        for (peer, id) in self.connections.due(now) {
            tracing::info!(%peer, "direct connection up: closing the relayed one");
            swarm.close_connection(id);
        }
    }

    /// A new listen address: remembered, waiters answered, `Listening` emitted.
    pub(in crate::net) fn new_listen_addr(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        address: Multiaddr,
    ) {
        let me = *swarm.local_peer_id();
        let addr = with_peer(address, me);
        tracing::info!(%addr, "listening");
        // libp2p-relay 0.22 serves HOP only with a confirmed external address, and puts
        // those addresses into reservations (clients refuse reservations without any).
        // A relay/bootstrap node is public by definition: unless the operator named its
        // external addresses, its own listen addresses are them.
        let relayed = addr.iter().any(|p| matches!(p, Protocol::P2pCircuit));
        if ctx.config.relay_server && ctx.config.external_addrs.is_empty() && !relayed {
            swarm.add_external_address(addr.clone());
        }
        self.listen_addrs.push(addr.clone());
        for w in self.listen_waiters.drain(..) {
            let _ = w.send(self.listen_addrs.clone());
        }
        ctx.emit(NetworkEvent::Listening { addr });
    }

    /// A listen address went away.
    pub(in crate::net) fn expired_listen_addr(&mut self, me: PeerId, address: Multiaddr) {
        let addr = with_peer(address, me);
        tracing::info!(%addr, "no longer listening");
        self.listen_addrs.retain(|a| *a != addr);
    }

    /// A listener closed: when it held a relay reservation, the relay may be asked again.
    pub(in crate::net) fn listener_closed<E: std::fmt::Debug>(
        &mut self,
        listener_id: ListenerId,
        reason: &E,
    ) {
        if let Some(i) = self.relays.iter().position(|(_, l)| *l == listener_id) {
            let (relay, _) = self.relays.remove(i);
            self.reserved.retain(|r| *r != relay);
            tracing::info!(%relay, ?reason, "relay reservation ended; the relay is asked again when it is identified");
        }
    }

    /// A connection came up (recorded for [`Self::retire_relayed`]).
    pub(in crate::net) fn established(
        &mut self,
        peer: PeerId,
        id: ConnectionId,
        endpoint: &libp2p::core::ConnectedPoint,
        now: Instant,
    ) {
        let relayed = endpoint.is_relayed();
        let dialer = endpoint.is_dialer();
        // A relayed connection this node accepted has no address of the peer (just
        // `/p2p/<id>`): the relayed address it was reached at names the relay.
        let remote = match endpoint {
            libp2p::core::ConnectedPoint::Listener { local_addr, .. } if relayed => {
                local_addr.clone()
            }
            _ => endpoint.get_remote_address().clone(),
        };
        tracing::debug!(%peer, addr = %remote, relayed, "connected");
        self.connections.established(
            peer,
            Connection {
                id,
                remote,
                relayed,
                dialer,
            },
            now,
        );
    }

    /// The last connection to `peer` closed.
    pub(in crate::net) fn disconnected(&mut self, peer: &PeerId, id: ConnectionId, now: Instant) {
        self.connections.closed(peer, id);
        self.liveness.lost(peer, now);
        self.reversed.remove(peer);
    }

    /// A peer identified itself: liveness learns whether it speaks gridlease and gossips,
    /// its dialable addresses go to the swarm (and kad), relays are asked for a reservation,
    /// relayed peers with public addresses dialed directly, and the peer recorded in the
    /// store for the next start.
    pub(in crate::net) fn on_identify(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        peer_id: PeerId,
        info: identify::Info,
        now: Instant,
    ) {
        // Subscribed to any offer topic (every offer's, or a class's: its gossip works
        // even if it follows no class this node follows).
        let network = &ctx.config.network;
        let subscribed = swarm.behaviour().gossipsub.all_peers().any(|(p, topics)| {
            *p == peer_id
                && topics
                    .iter()
                    .any(|t| gossip::offer_topic_class(network, t).is_some())
        });
        self.liveness.identified(
            peer_id,
            info.protocol_version == IDENTIFY_PROTOCOL,
            subscribed,
            now,
        );
        // The peer's addresses this node may dial it on later (identify's own address
        // cache is off: it would hand out every announced address, loopback and this
        // node's own included; see `reach::dialable`).
        let dialable = super::dialable(&info.listen_addrs, &self.listen_addrs);
        for addr in dialable.iter().take(gridlease_protocol::MAX_OFFER_ADDRS) {
            swarm.add_peer_address(peer_id, addr.clone());
        }
        if info.protocols.contains(&KAD_PROTOCOL) {
            for addr in &dialable {
                swarm
                    .behaviour_mut()
                    .kad
                    .add_address(&peer_id, addr.clone());
            }
        }
        if info.protocols.contains(&relay::HOP_PROTOCOL_NAME) {
            self.maybe_reserve(swarm, &ctx.config, peer_id, &info.listen_addrs);
        }
        self.maybe_reverse(swarm, peer_id, &info.listen_addrs);
        let addrs: Vec<String> = info
            .listen_addrs
            .iter()
            .take(gridlease_protocol::MAX_OFFER_ADDRS)
            .map(ToString::to_string)
            .collect();
        let peer = peer_id.to_string();
        let now = ctx.now();
        // Best effort: a full store queue only loses a restart hint.
        let _ = ctx.store.try_submit(move |s| {
            if let Err(e) = s.put_peer(&peer, &addrs, now) {
                tracing::debug!(error = %e, "cannot record peer");
            }
        });
    }

    /// A relay accepted our reservation.
    pub(in crate::net) fn reservation_accepted(&mut self, ctx: &LoopCtx, relay: PeerId) {
        if !self.reserved.contains(&relay) {
            self.reserved.push(relay);
        }
        ctx.emit(NetworkEvent::RelayReservation { relay });
    }

    /// An AutoNAT v2 verdict on one of our addresses.
    pub(in crate::net) fn on_autonat(&mut self, ctx: &LoopCtx, event: autonat::v2::client::Event) {
        let autonat::v2::client::Event {
            tested_addr,
            result,
            server,
            ..
        } = event;
        let reachable = result.is_ok();
        tracing::info!(addr = %tested_addr, %server, reachable, "AutoNAT probe");
        self.observed.probed(tested_addr.clone(), reachable);
        ctx.emit(NetworkEvent::NatProbe {
            addr: tested_addr,
            reachable,
        });
    }

    /// Connection reversal (the DCUtR spec's unilateral upgrade, which libp2p-dcutr 0.15
    /// lacks): a peer reached only through a relay that announces public addresses may be
    /// dialed directly. Without it a hole punch towards a public peer fails: the public
    /// peer's listener accepts the punch's SYN, and both ends then wait as the responder of
    /// the security handshake. The dial takes a new local port, so it never collides with a
    /// hole punch's port-reusing one.
    fn maybe_reverse(&mut self, swarm: &mut Swarm<Behaviour>, peer: PeerId, addrs: &[Multiaddr]) {
        let Some(public) = self.reversal_addrs(&peer, addrs) else {
            return;
        };
        self.reversed.insert(peer);
        tracing::info!(%peer, addrs = ?public, "relayed peer announces public addresses: dialing it directly");
        let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
            .addresses(public)
            .condition(libp2p::swarm::dial_opts::PeerCondition::Always)
            .allocate_new_port()
            .build();
        if let Err(e) = swarm.dial(opts) {
            tracing::debug!(%peer, error = %e, "connection reversal not dialed");
        }
    }

    /// The public addresses to dial `peer` on directly (connection reversal): `None` unless
    /// it is connected through relays only, not reversed before, and announces some.
    fn reversal_addrs(&self, peer: &PeerId, addrs: &[Multiaddr]) -> Option<Vec<Multiaddr>> {
        let conns = self.connections.of(peer);
        if conns.is_empty()
            || conns.iter().any(|c| !c.relayed)
            || self.reversed.contains(peer)
            || self.reversed.len() >= MAX_REVERSALS
        {
            return None;
        }
        let public: Vec<Multiaddr> = addrs
            .iter()
            .filter(|a| super::is_public_direct(a))
            .cloned()
            .collect();
        (!public.is_empty()).then_some(public)
    }

    /// Listens through `relay` when this node has no confirmed external address (it may be
    /// behind NAT): the relay then forwards inbound connections, and DCUtR tries to upgrade
    /// them to direct ones.
    fn maybe_reserve(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        config: &NodeConfig,
        relay: PeerId,
        relay_addrs: &[Multiaddr],
    ) {
        // A relay's reservation is itself a confirmed external address (libp2p-relay 0.22):
        // only a direct one (configured, or confirmed by AutoNAT) makes relays unnecessary.
        if config.relay_server
            || !config.use_relays
            || self.relays.len() >= MAX_RELAYS
            || self.relays.iter().any(|(r, _)| *r == relay)
            || swarm.external_addresses().any(|a| !super::is_relayed(a))
        {
            return;
        }
        // The address this node reached the relay on (it works from here; a relay listening
        // on every interface also lists loopback and LAN addresses), else the first direct
        // one it announces.
        let dialed = self
            .connections
            .of(&relay)
            .into_iter()
            .find(|c| !c.relayed && c.dialer)
            .map(|c| c.remote);
        let Some(base) =
            dialed.or_else(|| relay_addrs.iter().find(|a| !super::is_relayed(a)).cloned())
        else {
            return;
        };
        let circuit = with_peer(base, relay).with(Protocol::P2pCircuit);
        match swarm.listen_on(circuit.clone()) {
            Ok(listener) => {
                tracing::info!(%relay, addr = %circuit, "requesting a relay reservation");
                self.relays.push((relay, listener));
            }
            Err(e) => tracing::warn!(%relay, error = %e, "cannot listen through relay"),
        }
    }
}

/// A hole punch's outcome: logged, and `HolePunched` emitted when it worked.
pub(in crate::net) fn on_dcutr(ctx: &LoopCtx, event: dcutr::Event) {
    let dcutr::Event {
        remote_peer_id,
        result,
    } = event;
    match result {
        Ok(_) => {
            tracing::info!(peer = %remote_peer_id, "hole punch succeeded: direct connection");
            ctx.emit(NetworkEvent::HolePunched {
                peer: remote_peer_id,
            });
        }
        Err(e) => {
            tracing::info!(peer = %remote_peer_id, error = %e, "hole punch failed: the relay carries the connection");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> Multiaddr {
        s.parse().unwrap()
    }

    fn conn(id: usize, relayed: bool) -> Connection {
        Connection {
            id: ConnectionId::new_unchecked(id),
            remote: addr("/ip4/203.0.113.9/tcp/4001"),
            relayed,
            dialer: true,
        }
    }

    #[test]
    fn a_relayed_only_peer_with_public_addresses_is_reversed_once() {
        let mut reach = Reach::new(Duration::from_secs(30), &[]);
        let peer = PeerId::random();
        let public = [addr("/ip4/198.51.100.7/tcp/4001")];
        // Not connected: nothing to reverse.
        assert!(reach.reversal_addrs(&peer, &public).is_none());
        let t0 = Instant::now();
        reach.connections.established(peer, conn(1, true), t0);
        assert_eq!(
            reach.reversal_addrs(&peer, &public).unwrap(),
            public.to_vec()
        );
        // Only private addresses: nothing to dial.
        assert!(
            reach
                .reversal_addrs(&peer, &[addr("/ip4/192.168.1.5/tcp/4001")])
                .is_none()
        );
        reach.reversed.insert(peer);
        assert!(reach.reversal_addrs(&peer, &public).is_none());
        // A direct connection makes it unnecessary.
        let other = PeerId::random();
        reach.connections.established(other, conn(2, true), t0);
        reach.connections.established(other, conn(3, false), t0);
        assert!(reach.reversal_addrs(&other, &public).is_none());
    }

    #[test]
    fn a_disconnect_forgets_the_reversal_and_starts_the_liveness_clock() {
        let mut reach = Reach::new(Duration::from_secs(30), &[]);
        let peer = PeerId::random();
        let t0 = Instant::now();
        reach.connections.established(peer, conn(1, true), t0);
        reach.reversed.insert(peer);
        reach.disconnected(&peer, ConnectionId::new_unchecked(1), t0);
        assert!(reach.connections.of(&peer).is_empty());
        assert!(!reach.reversed.contains(&peer));
        // Driven time: a relayed connection with a direct one retires after the delay only.
        reach.connections.established(peer, conn(4, true), t0);
        reach.connections.established(peer, conn(5, false), t0);
        assert!(reach.connections.due(t0).is_empty());
        let later = t0 + super::super::RELAYED_CLOSE_DELAY + Duration::from_millis(1);
        assert_eq!(
            reach.connections.due(later),
            vec![(peer, ConnectionId::new_unchecked(4))]
        );
    }
}
