//! Staying in the gossip (issue 21): a connection on which gossip never started is made afresh,
//! and a lost bootstrap peer is dialed again.
//!
//! - **Gossip that never started.** libp2p-gossipsub 0.50 gives up on a connection's gossip
//!   stream for good after five failed attempts (or once the peer's answer to the protocol
//!   negotiation is refused) and says nothing (or only `GossipsubNotSupported`): the two
//!   nodes stay connected and one of them receives no offer again. Every gridlease node
//!   subscribes to the offer topic at start, so a peer that identified itself as one
//!   (`IDENTIFY_PROTOCOL`) and has not subscribed within [`NodeConfig::gossip_grace`] (or whose
//!   gossip is reported unsupported) has a broken connection: the node disconnects it, so the
//!   next connection negotiates gossip from scratch.
//! - **Bootstrap peers** are dialed again when the last connection to one closes or a dial
//!   fails, after a backoff of 1 s doubling up to [`MAX_BACKOFF`]; the backoff starts over once
//!   the peer's gossip works (it subscribed), not at mere connection, so a connection that
//!   keeps breaking is not redialed in a tight loop.
//!
//! State here is bounded by the connected peers and the configured bootstrap list; the network
//! loop owns it and feeds it events and the time.
//!
//! [`NodeConfig::gossip_grace`]: super::NodeConfig::gossip_grace

use std::collections::HashMap;
use std::time::{Duration, Instant};

use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};

/// First wait before a bootstrap peer is dialed again.
pub(in crate::net) const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest wait between dials of a lost bootstrap peer.
pub(in crate::net) const MAX_BACKOFF: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Bootstrap {
    addr: Multiaddr,
    /// When to dial it again (`None`: connected, or a dial is under way).
    next: Option<Instant>,
    backoff: Duration,
}

/// What the network loop tracks to keep its node in the gossip.
#[derive(Debug)]
pub(in crate::net) struct Liveness {
    grace: Duration,
    /// Gridlease peers connected and not (yet) subscribed to the offer topic: since when.
    waiting: HashMap<PeerId, Instant>,
    bootstrap: HashMap<PeerId, Bootstrap>,
}

impl Liveness {
    /// Tracks gossip with grace `grace`, and the bootstrap peers of `bootstrap` that name
    /// their peer id (`/p2p/<id>` last).
    pub(in crate::net) fn new(grace: Duration, bootstrap: &[Multiaddr]) -> Self {
        let bootstrap = bootstrap
            .iter()
            .filter_map(|a| match a.iter().last() {
                Some(Protocol::P2p(peer)) => Some((
                    peer,
                    Bootstrap {
                        addr: a.clone(),
                        next: None,
                        backoff: FIRST_BACKOFF,
                    },
                )),
                _ => None,
            })
            .collect();
        Self {
            grace,
            waiting: HashMap::new(),
            bootstrap,
        }
    }

    /// Identify arrived from a connected peer: a gridlease node not yet subscribed is watched.
    pub(in crate::net) fn identified(
        &mut self,
        peer: PeerId,
        gridlease: bool,
        subscribed: bool,
        now: Instant,
    ) {
        if gridlease && !subscribed {
            self.waiting.entry(peer).or_insert(now);
        }
    }

    /// The peer subscribed to the offer topic: its gossip works.
    pub(in crate::net) fn subscribed(&mut self, peer: &PeerId) {
        self.waiting.remove(peer);
        if let Some(b) = self.bootstrap.get_mut(peer) {
            b.backoff = FIRST_BACKOFF;
        }
    }

    /// Whether `peer` is a gridlease node whose gossip has not started.
    pub(in crate::net) fn is_waiting(&self, peer: &PeerId) -> bool {
        self.waiting.contains_key(peer)
    }

    /// A first connection to `peer` is up.
    pub(in crate::net) fn connected(&mut self, peer: &PeerId) {
        if let Some(b) = self.bootstrap.get_mut(peer) {
            b.next = None;
        }
    }

    /// The last connection to `peer` closed, or a dial to it failed: a bootstrap peer is
    /// dialed again after its backoff, which doubles.
    pub(in crate::net) fn lost(&mut self, peer: &PeerId, now: Instant) {
        self.waiting.remove(peer);
        if let Some(b) = self.bootstrap.get_mut(peer)
            && b.next.is_none()
        {
            b.next = Some(now + b.backoff);
            b.backoff = (b.backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Gridlease peers whose gossip has not started within the grace: no longer watched (the
    /// caller disconnects them).
    pub(in crate::net) fn overdue(&mut self, now: Instant) -> Vec<PeerId> {
        let grace = self.grace;
        let late: Vec<PeerId> = self
            .waiting
            .iter()
            .filter(|(_, since)| now.saturating_duration_since(**since) >= grace)
            .map(|(p, _)| *p)
            .collect();
        for p in &late {
            self.waiting.remove(p);
        }
        late
    }

    /// Bootstrap addresses due for a dial now (each is then not due again until it is lost
    /// again).
    pub(in crate::net) fn due(&mut self, now: Instant) -> Vec<Multiaddr> {
        self.bootstrap
            .values_mut()
            .filter(|b| b.next.is_some_and(|t| t <= now))
            .map(|b| {
                b.next = None;
                b.addr.clone()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> PeerId {
        PeerId::random()
    }

    #[test]
    fn a_gridlease_peer_that_never_subscribes_is_overdue_after_the_grace_only() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::from_secs(30), &[]);
        let (silent, fine, other) = (peer(), peer(), peer());
        l.identified(silent, true, false, t0);
        l.identified(fine, true, false, t0);
        l.identified(other, false, false, t0);
        l.subscribed(&fine);
        assert!(l.is_waiting(&silent) && !l.is_waiting(&fine) && !l.is_waiting(&other));
        assert!(l.overdue(t0 + Duration::from_secs(29)).is_empty());
        assert_eq!(l.overdue(t0 + Duration::from_secs(30)), vec![silent]);
        assert!(
            l.overdue(t0 + Duration::from_secs(90)).is_empty(),
            "reported once"
        );
        // A peer already subscribed when identify arrives is not watched.
        let early = peer();
        l.identified(early, true, true, t0);
        assert!(!l.is_waiting(&early));
    }

    #[test]
    fn a_lost_bootstrap_peer_is_dialed_with_a_backoff_that_restarts_once_gossip_works() {
        let b = peer();
        let addr: Multiaddr = format!("/ip4/127.0.0.1/tcp/4001/p2p/{b}").parse().unwrap();
        let unnamed: Multiaddr = "/ip4/127.0.0.1/tcp/4002".parse().unwrap();
        let mut l = Liveness::new(Duration::from_secs(30), &[addr.clone(), unnamed]);
        let t0 = Instant::now();
        l.connected(&b);
        assert!(l.due(t0 + Duration::from_secs(600)).is_empty(), "connected");
        l.lost(&b, t0);
        assert!(l.due(t0).is_empty());
        assert_eq!(l.due(t0 + FIRST_BACKOFF), vec![addr.clone()]);
        assert!(
            l.due(t0 + Duration::from_secs(600)).is_empty(),
            "dialed once"
        );
        // The dial fails: twice the wait; again: four times.
        l.lost(&b, t0);
        assert!(l.due(t0 + FIRST_BACKOFF).is_empty());
        assert_eq!(l.due(t0 + 2 * FIRST_BACKOFF), vec![addr.clone()]);
        l.lost(&b, t0);
        assert_eq!(l.due(t0 + 4 * FIRST_BACKOFF), vec![addr.clone()]);
        for _ in 0..10 {
            l.lost(&b, t0);
            l.due(t0 + MAX_BACKOFF);
        }
        l.lost(&b, t0);
        assert_eq!(l.due(t0 + MAX_BACKOFF), vec![addr.clone()], "capped");
        // Connected and gossiping: the next loss waits the first backoff again.
        l.connected(&b);
        l.subscribed(&b);
        l.lost(&b, t0);
        assert_eq!(l.due(t0 + FIRST_BACKOFF), vec![addr]);
    }
}
