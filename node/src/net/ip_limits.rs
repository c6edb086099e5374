//! Inbound connections per remote IP address: a behaviour that denies a connection when its
//! address already has [`IpCaps::pending`] handshakes under way or [`IpCaps::established`]
//! connections up, so one host cannot take the node's whole budget of connections (libp2p's
//! `connection_limits` counts in total and per peer only, and peer ids cost nothing to make).
//!
//! Loopback addresses are not counted: whoever connects from this machine is already on it,
//! and a node's own tools and tests (and the scale harness, a hundred nodes on 127.0.0.1) run
//! there; the totals of `connection_limits` still hold for them.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::task::{Context, Poll};

use libp2p::PeerId;
use libp2p::core::multiaddr::Protocol;
use libp2p::core::transport::PortUse;
use libp2p::core::{Endpoint, Multiaddr};
use libp2p::swarm::{
    ConnectionDenied, ConnectionId, FromSwarm, NetworkBehaviour, THandler, THandlerInEvent,
    THandlerOutEvent, ToSwarm, dummy,
};

/// Per-address caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpCaps {
    /// Inbound handshakes under way from one address.
    pub pending: u32,
    /// Inbound connections up from one address.
    pub established: u32,
}

/// Why a connection was denied.
#[derive(Debug, thiserror::Error)]
#[error("{ip} already has {count} {what} inbound connection(s) (at most {cap})")]
pub struct IpLimitExceeded {
    /// The address.
    pub ip: IpAddr,
    /// How many it has.
    pub count: u32,
    /// The cap.
    pub cap: u32,
    /// `pending` or `established`.
    pub what: &'static str,
}

/// The counts, by address and by connection: pure, unit-tested without a swarm.
#[derive(Debug, Default)]
struct Counts {
    pending: HashMap<IpAddr, u32>,
    established: HashMap<IpAddr, u32>,
    /// Each counted connection's address and whether it is established.
    by_conn: HashMap<ConnectionId, (IpAddr, bool)>,
}

fn bump(map: &mut HashMap<IpAddr, u32>, ip: IpAddr, up: bool) {
    let n = map.entry(ip).or_insert(0);
    if up {
        *n += 1;
    } else {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(&ip);
        }
    }
}

impl Counts {
    fn pending(
        &mut self,
        caps: IpCaps,
        id: ConnectionId,
        ip: IpAddr,
    ) -> Result<(), IpLimitExceeded> {
        let count = self.pending.get(&ip).copied().unwrap_or(0);
        if count >= caps.pending {
            return Err(IpLimitExceeded {
                ip,
                count,
                cap: caps.pending,
                what: "pending",
            });
        }
        bump(&mut self.pending, ip, true);
        self.by_conn.insert(id, (ip, false));
        Ok(())
    }

    fn established(
        &mut self,
        caps: IpCaps,
        id: ConnectionId,
        ip: IpAddr,
    ) -> Result<(), IpLimitExceeded> {
        if let Some((was, false)) = self.by_conn.remove(&id) {
            bump(&mut self.pending, was, false);
        }
        let count = self.established.get(&ip).copied().unwrap_or(0);
        if count >= caps.established {
            return Err(IpLimitExceeded {
                ip,
                count,
                cap: caps.established,
                what: "established",
            });
        }
        bump(&mut self.established, ip, true);
        self.by_conn.insert(id, (ip, true));
        Ok(())
    }

    /// The connection ended (or failed, or another behaviour denied it).
    fn gone(&mut self, id: ConnectionId) {
        match self.by_conn.remove(&id) {
            Some((ip, true)) => bump(&mut self.established, ip, false),
            Some((ip, false)) => bump(&mut self.pending, ip, false),
            None => {}
        }
    }
}

/// The IP address of a remote multiaddr, if it names one and it is not loopback.
fn counted_ip(addr: &Multiaddr) -> Option<IpAddr> {
    let ip = addr.iter().find_map(|p| match p {
        Protocol::Ip4(ip) => Some(IpAddr::V4(ip)),
        Protocol::Ip6(ip) => Some(IpAddr::V6(ip)),
        _ => None,
    })?;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    (!ip.is_loopback()).then_some(ip)
}

/// The behaviour (see the module docs).
pub struct Behaviour {
    caps: IpCaps,
    counts: Counts,
}

impl Behaviour {
    /// Denies beyond `caps`.
    pub fn new(caps: IpCaps) -> Self {
        Self {
            caps,
            counts: Counts::default(),
        }
    }
}

impl NetworkBehaviour for Behaviour {
    type ConnectionHandler = dummy::ConnectionHandler;
    type ToSwarm = Infallible;

    fn handle_pending_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        _local: &Multiaddr,
        remote: &Multiaddr,
    ) -> Result<(), ConnectionDenied> {
        match counted_ip(remote) {
            Some(ip) => self
                .counts
                .pending(self.caps, connection_id, ip)
                .map_err(ConnectionDenied::new),
            None => Ok(()),
        }
    }

    fn handle_established_inbound_connection(
        &mut self,
        connection_id: ConnectionId,
        _peer: PeerId,
        _local: &Multiaddr,
        remote: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        if let Some(ip) = counted_ip(remote) {
            self.counts
                .established(self.caps, connection_id, ip)
                .map_err(ConnectionDenied::new)?;
        }
        Ok(dummy::ConnectionHandler)
    }

    fn handle_established_outbound_connection(
        &mut self,
        _connection_id: ConnectionId,
        _peer: PeerId,
        _addr: &Multiaddr,
        _role_override: Endpoint,
        _port_use: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn on_swarm_event(&mut self, event: FromSwarm<'_>) {
        match event {
            FromSwarm::ConnectionClosed(c) => self.counts.gone(c.connection_id),
            FromSwarm::ListenFailure(f) => self.counts.gone(f.connection_id),
            _ => {}
        }
    }

    fn on_connection_handler_event(
        &mut self,
        _peer: PeerId,
        _connection: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        libp2p::core::util::unreachable(event)
    }

    fn poll(&mut self, _: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: IpCaps = IpCaps {
        pending: 2,
        established: 3,
    };

    #[test]
    fn an_address_gets_its_caps_and_its_slots_back() {
        let mut c = Counts::default();
        let a: IpAddr = "198.18.0.7".parse().unwrap();
        let b: IpAddr = "198.18.0.8".parse().unwrap();
        let id = ConnectionId::new_unchecked;
        assert!(c.pending(CAPS, id(1), a).is_ok());
        assert!(c.pending(CAPS, id(2), a).is_ok());
        let e = c.pending(CAPS, id(3), a).unwrap_err();
        assert_eq!((e.count, e.what), (2, "pending"));
        // Another address is not held back.
        assert!(c.pending(CAPS, id(4), b).is_ok());
        // A handshake that completes frees its pending slot.
        assert!(c.established(CAPS, id(1), a).is_ok());
        assert!(c.pending(CAPS, id(5), a).is_ok());
        // One that fails does too.
        c.gone(id(2));
        assert!(c.established(CAPS, id(5), a).is_ok());
        assert!(c.pending(CAPS, id(6), a).is_ok());
        assert!(c.established(CAPS, id(6), a).is_ok());
        assert!(c.pending(CAPS, id(7), a).is_ok());
        let e = c.established(CAPS, id(7), a).unwrap_err();
        assert_eq!((e.count, e.what), (3, "established"));
        // The denied one's closing changes nothing; a closed one frees its slot.
        c.gone(id(7));
        c.gone(id(1));
        assert!(c.pending(CAPS, id(8), a).is_ok());
        assert!(c.established(CAPS, id(8), a).is_ok());
        assert_eq!(c.established.get(&a), Some(&3));
        for i in [5, 6, 8, 4] {
            c.gone(id(i));
        }
        assert!(c.pending.is_empty() && c.established.is_empty() && c.by_conn.is_empty());
    }

    #[test]
    fn loopback_is_not_counted_and_mapped_v4_is_v4() {
        let lo: Multiaddr = "/ip4/127.0.0.1/tcp/1".parse().unwrap();
        let lo6: Multiaddr = "/ip6/::1/tcp/1".parse().unwrap();
        let mapped: Multiaddr = "/ip6/::ffff:198.18.0.7/tcp/1".parse().unwrap();
        let dns: Multiaddr = "/dns4/example.org/tcp/1".parse().unwrap();
        assert_eq!(counted_ip(&lo), None);
        assert_eq!(counted_ip(&lo6), None);
        assert_eq!(counted_ip(&mapped), Some("198.18.0.7".parse().unwrap()));
        assert_eq!(counted_ip(&dns), None);
    }
}
