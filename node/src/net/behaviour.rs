//! The composite libp2p behaviour of a gridlease node.

// The derive generates `BehaviourEvent` with one undocumented variant per field.
#![allow(missing_docs)]

use std::time::Duration;

use libp2p::swarm::NetworkBehaviour;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::{
    StreamProtocol, autonat, dcutr, gossipsub, identify, identity, kad, mdns, ping, relay,
    request_response,
};

use super::codec::{BOOK_PROTOCOL, BookCodec, LEASE_PROTOCOL, LeaseCodec};
use super::gossip;
use super::{BuildError, NodeConfig};

/// Identify protocol version string.
pub const IDENTIFY_PROTOCOL: &str = "/gridlease/1.0.0";
/// Kademlia protocol name (a private DHT, not the IPFS one).
pub const KAD_PROTOCOL: StreamProtocol = StreamProtocol::new("/gridlease/kad/1.0.0");

/// Every protocol a node speaks. Field order is the order events are polled in, and the
/// order in which connections are vetted (the limits first).
#[derive(NetworkBehaviour)]
pub struct Behaviour {
    /// Peers the application blocked ([`super::Client::block`]): their connections closed, new
    /// ones refused.
    pub blocked: libp2p::allow_block_list::Behaviour<libp2p::allow_block_list::BlockedPeers>,
    /// Connections in total, pending and per peer ([`super::ConnectionCaps`]).
    pub limits: libp2p::connection_limits::Behaviour,
    /// Inbound connections per remote IP address ([`super::ip_limits`]).
    pub ip_limits: super::ip_limits::Behaviour,
    /// Offer gossip on `gridlease/v1/offers/<network>`, application-validated, peer-scored.
    pub gossipsub: gossipsub::Behaviour,
    /// Lease negotiation (`/gridlease/lease/1`), length-prefixed bincode frames.
    pub lease: request_response::Behaviour<LeaseCodec>,
    /// Book sync on connect (`/gridlease/book/1`).
    pub book: request_response::Behaviour<BookCodec>,
    /// Peer discovery and routing; server mode on relay/bootstrap nodes, automatic elsewhere.
    pub kad: kad::Behaviour<kad::store::MemoryStore>,
    /// Exchanges listen/observed addresses and protocols; feeds kad and external addresses.
    pub identify: identify::Behaviour,
    /// Liveness.
    pub ping: ping::Behaviour,
    /// LAN discovery; off in tests and on WAN-only nodes.
    pub mdns: Toggle<mdns::tokio::Behaviour>,
    /// Reservations on relays, so providers behind NAT are reachable.
    pub relay_client: relay::client::Behaviour,
    /// Hole punching over relayed connections.
    pub dcutr: dcutr::Behaviour,
    /// Tests which of our addresses are reachable from outside.
    pub autonat_client: autonat::v2::client::Behaviour,
    /// Relay server (`--relay-server` only).
    pub relay_server: Toggle<relay::Behaviour>,
    /// AutoNAT dial-back server (`--relay-server` only).
    pub autonat_server: Toggle<autonat::v2::server::Behaviour>,
    /// Raw streams outside the event loop (interactive access, `/gridlease/access/3`): opened
    /// and accepted through a [`libp2p_stream::Control`], bytes never pass through the loop.
    pub stream: libp2p_stream::Behaviour,
}

/// Most reservations a relay holds (libp2p default: 128).
pub const RELAY_MAX_RESERVATIONS: usize = 1024;
/// Most relayed circuits at once (libp2p default: 16).
pub const RELAY_MAX_CIRCUITS: usize = 256;
/// Most circuits per peer (libp2p default: 4): a provider behind a symmetric NAT serves each of
/// its renters through one.
pub const RELAY_MAX_CIRCUITS_PER_PEER: usize = 32;
/// How long one relayed circuit may live: the longest lease an offer may allow (24 h). The
/// libp2p default, 2 min, would cut every lease that cannot be hole punched.
pub const RELAY_MAX_CIRCUIT_DURATION: Duration = Duration::from_secs(24 * 3600);
/// Bytes one relayed circuit may carry: usage reports, receipts, logs and a few `cp`
/// transfers of a long lease (libp2p default: 128 KiB, a few minutes of reports and logs).
pub const RELAY_MAX_CIRCUIT_BYTES: u64 = 4 << 30;

/// The relay server's limits, sized for lease traffic (see the constants above and
/// `docs/networking.md`); rate limits per peer and IP as libp2p's defaults.
pub fn relay_config() -> relay::Config {
    relay::Config {
        max_reservations: RELAY_MAX_RESERVATIONS,
        max_circuits: RELAY_MAX_CIRCUITS,
        max_circuits_per_peer: RELAY_MAX_CIRCUITS_PER_PEER,
        max_circuit_duration: RELAY_MAX_CIRCUIT_DURATION,
        max_circuit_bytes: RELAY_MAX_CIRCUIT_BYTES,
        ..relay::Config::default()
    }
}

impl Behaviour {
    /// Builds the behaviour for `key` under `config`.
    pub fn new(
        key: &identity::Keypair,
        relay_client: relay::client::Behaviour,
        config: &NodeConfig,
        book_codec: BookCodec,
    ) -> Result<Self, BuildError> {
        let peer_id = key.public().to_peer_id();
        let gossipsub = gossip::behaviour(key, config)?;
        let lease = request_response::Behaviour::with_codec(
            LeaseCodec::default(),
            [(LEASE_PROTOCOL, request_response::ProtocolSupport::Full)],
            request_response::Config::default()
                .with_request_timeout(config.request_timeout)
                .with_max_concurrent_streams(config.max_concurrent_lease_streams),
        );
        let book = request_response::Behaviour::with_codec(
            book_codec,
            [(BOOK_PROTOCOL, request_response::ProtocolSupport::Full)],
            request_response::Config::default()
                .with_request_timeout(config.request_timeout)
                .with_max_concurrent_streams(16),
        );
        let mut kad_config = kad::Config::new(KAD_PROTOCOL);
        kad_config.set_query_timeout(Duration::from_secs(30));
        let mut kad =
            kad::Behaviour::with_config(peer_id, kad::store::MemoryStore::new(peer_id), kad_config);
        if config.relay_server {
            kad.set_mode(Some(kad::Mode::Server));
        }
        let identify = identify::Behaviour::new(
            identify::Config::new(IDENTIFY_PROTOCOL.to_string(), key.public())
                .with_agent_version(format!("gridlease/{}", env!("CARGO_PKG_VERSION")))
                // No address cache: the event loop records the announced addresses it may dial
                // (`net::reach::dialable`), never loopback or its own ones.
                .with_cache_size(0),
        );
        let mdns = if config.mdns {
            Some(
                mdns::tokio::Behaviour::new(mdns::Config::default(), peer_id)
                    .map_err(|e| BuildError::Transport(e.to_string()))?,
            )
        } else {
            None
        };
        let (relay_server, autonat_server) = if config.relay_server {
            (
                Some(relay::Behaviour::new(peer_id, relay_config())),
                Some(autonat::v2::server::Behaviour::default()),
            )
        } else {
            (None, None)
        };
        let caps = config.connections;
        let limits = libp2p::connection_limits::Behaviour::new(
            libp2p::connection_limits::ConnectionLimits::default()
                .with_max_pending_incoming(Some(caps.max_pending_incoming))
                .with_max_established_incoming(Some(caps.max_established_incoming))
                .with_max_established_per_peer(Some(caps.max_established_per_peer)),
        );
        let ip_limits = super::ip_limits::Behaviour::new(super::ip_limits::IpCaps {
            pending: caps.max_pending_per_ip,
            established: caps.max_established_per_ip,
        });
        Ok(Self {
            blocked: Default::default(),
            limits,
            ip_limits,
            gossipsub,
            lease,
            book,
            kad,
            identify,
            ping: ping::Behaviour::new(ping::Config::new()),
            mdns: Toggle::from(mdns),
            relay_client,
            dcutr: dcutr::Behaviour::new(peer_id),
            autonat_client: autonat::v2::client::Behaviour::default(),
            relay_server: Toggle::from(relay_server),
            autonat_server: Toggle::from(autonat_server),
            stream: libp2p_stream::Behaviour::new(),
        })
    }
}
