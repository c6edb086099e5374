//! The network actor.
//!
//! One task ([`event_loop::EventLoop`]) owns the libp2p `Swarm`, the offer book and the provider
//! state. Everything else holds a cloneable [`Client`] that sends a [`Command`] over a bounded
//! channel and awaits a `oneshot` reply. The book has one writer, the loop, and is read off
//! the loop: searches and lookups go through a [`BookReader`] ([`shared_book`]), so a search
//! never waits behind gossip in the command queue nor stalls it. The loop turns swarm events
//! into [`NetworkEvent`]s, broadcast on a bounded channel (slow subscribers lag and lose
//! events, the loop never waits).
//!
//! Invariant: the loop never blocks on SQLite. Reads happen before it starts (the stored
//! offers after it started, by [`restore`], which hands them to the loop); writes go to the
//! store thread ([`crate::store::StoreHandle`]) and completions come back as internal messages.

pub mod behaviour;
mod book_sync;
mod classes;
pub mod client;
pub mod codec;
mod error;
mod event_loop;
pub mod gossip;
mod ingest;
pub mod ip_limits;
mod lease_rpc;
mod loop_ctx;
pub mod muxer;
mod own_offer;
pub mod provider;
pub mod ratelimit;
pub mod reach;
pub mod reputation;
mod restore;
mod shared_book;
mod timers;
pub mod tls;
mod transport;

use std::sync::Arc;
use std::time::Duration;

use gridlease_contracts::book::{DEFAULT_BOOK_CAPACITY, OfferBook};
use gridlease_contracts::terms::validate_offer;
use gridlease_protocol::{
    NetworkId, NodeKey, OfferId, PeerId, PublicKey, RejectReason, Signed, Timestamp,
};
use libp2p::Multiaddr;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use behaviour::{Behaviour, BehaviourEvent};
pub use client::{
    Client, Followed, GossipStats, NegotiationError, RawTopic, Reachability, SyncStats,
};
pub use error::NetError;
pub use provider::{OfferTemplate, OwnOffer, reject};
pub use ratelimit::RateLimit;
pub use restore::RestoreProgress;
pub use shared_book::BookReader;
pub use shared_book::ReplacedOffer;

use crate::clock;
use crate::store::{StoreError, StoreHandle};

/// Capacity of the command channel.
pub const COMMAND_QUEUE: usize = 256;
/// Capacity of the event broadcast channel.
pub const EVENT_QUEUE: usize = 4096;

/// Node network settings. [`NodeConfig::new`] gives production defaults; tests shorten the
/// periods.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The market.
    pub network: NetworkId,
    /// Addresses to listen on.
    pub listen: Vec<Multiaddr>,
    /// Peers to dial at start (`/ip4/../tcp/../p2p/<id>`).
    pub bootstrap: Vec<Multiaddr>,
    /// Run relay server, AutoNAT server and kad server mode.
    pub relay_server: bool,
    /// Publicly reachable addresses of this node (confirmed external addresses).
    pub external_addrs: Vec<Multiaddr>,
    /// LAN discovery.
    pub mdns: bool,
    /// Reserve a slot on relays (when no external address is confirmed) so peers behind NAT
    /// can be reached.
    pub use_relays: bool,
    /// How often the own offer is checked (re-signed and published when missing, close to
    /// expiry or out of date; an unchanged offer is not published again) and the book swept.
    pub announce_period: Duration,
    /// Offer anti-entropy: each period, a whole book sync with the next connected peer in
    /// turn (offers are announced only when they change).
    pub offer_resync: Duration,
    /// How often a provider republishes its newest completion records (reputation), for
    /// nodes that joined since.
    pub completions_republish: Duration,
    /// The reputation formula's constants (`docs/reputation.md`).
    pub reputation: gridlease_contracts::reputation::ScoreParams,
    /// Lifetime of the own offer; re-signed with a new sequence when less than two announce
    /// periods remain.
    pub offer_ttl: Duration,
    /// Gossipsub heartbeat.
    pub heartbeat: Duration,
    /// Connections without traffic close after this.
    pub idle_connection_timeout: Duration,
    /// Lease request timeout.
    pub request_timeout: Duration,
    /// Concurrent lease streams per connection.
    pub max_concurrent_lease_streams: usize,
    /// Most offers in the book.
    pub book_capacity: usize,
    /// New offers (new sequences) per provider.
    pub provider_rate: RateLimit,
    /// Gossip messages validated per forwarding peer.
    pub peer_rate: RateLimit,
    /// What this node offers as a provider.
    pub offer: Option<OfferTemplate>,
    /// The GPU classes whose offers this node follows (`gridlease_protocol::class`, canonical
    /// names, at most `MAX_FOLLOWED_CLASSES`), besides its own offer's: it subscribes to their
    /// topics only, and its book holds only their offers. `None`: every class (the topic of
    /// all offers, the whole book).
    pub follow: Option<Vec<String>>,
    /// How long a node that follows only some classes keeps following a class it was asked to
    /// search (a query's `gpu=MODEL`) after the last such search (`docs/protocol.md` 3c step
    /// 4); then that class's offers leave its book.
    pub search_follow: Duration,
    /// A connected gridlease peer that has not subscribed to the offer topic within this long
    /// has a connection whose gossip never started; it is disconnected so the next connection
    /// starts it afresh (`liveness.rs`).
    pub gossip_grace: Duration,
    /// Limits on the connections the node accepts ([`ConnectionCaps::for_descriptors`] in a
    /// daemon).
    pub connections: ConnectionCaps,
    /// The network loop's time: the instants its children compare (searched classes,
    /// lookups, provider records, liveness, relayed connections) and the timestamps it
    /// stamps. [`clock::system`] in a daemon; tests move a [`clock::ManualClock`] ahead
    /// instead of sleeping.
    pub clock: clock::SharedClock,
    /// Test faults; all off in a daemon (only with the `faults` feature).
    #[cfg(feature = "faults")]
    pub faults: NetFaults,
}

/// Limits on the connections a node accepts, so a flood of handshakes from one host or many
/// cannot take the descriptors the node needs for its API, its store and Docker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionCaps {
    /// Inbound handshakes under way, in all.
    pub max_pending_incoming: u32,
    /// Inbound connections up, in all.
    pub max_established_incoming: u32,
    /// Connections with one peer.
    pub max_established_per_peer: u32,
    /// Inbound handshakes under way from one IP address (loopback not counted).
    pub max_pending_per_ip: u32,
    /// Inbound connections up from one IP address (loopback not counted).
    pub max_established_per_ip: u32,
}

/// Descriptors a node keeps for everything but peer connections (the control API and its
/// clients, SQLite, the Docker client, access streams' sockets, workspaces, lease logs).
pub const DESCRIPTORS_RESERVED: u64 = 512;

impl Default for ConnectionCaps {
    fn default() -> Self {
        Self {
            max_pending_incoming: 128,
            max_established_incoming: 1024,
            max_established_per_peer: 8,
            max_pending_per_ip: 16,
            max_established_per_ip: 64,
        }
    }
}

impl ConnectionCaps {
    /// The defaults, with inbound connections capped to what `nofile` descriptors leave after
    /// [`DESCRIPTORS_RESERVED`] and the pending handshakes (at least 32, at most 8,192).
    pub fn for_descriptors(nofile: u64) -> Self {
        let d = Self::default();
        let room = nofile
            .saturating_sub(DESCRIPTORS_RESERVED)
            .saturating_sub(u64::from(d.max_pending_incoming));
        Self {
            max_established_incoming: u32::try_from(room.clamp(32, 8192)).unwrap_or(8192),
            ..d
        }
    }
}

/// Faults a test can inject into the network loop (only with the `faults` feature).
#[cfg(feature = "faults")]
#[derive(Clone, Debug, Default)]
pub struct NetFaults {
    /// Subscribe to the offer topic only once the first connection has closed: a node whose
    /// gossip with its first peer never starts, and works after a reconnection.
    pub subscribe_after_first_disconnect: bool,
    /// Report the restore of the stored offers done only this long after it is (a big book's
    /// restore, which book syncs wait for).
    pub hold_restore: Option<Duration>,
    /// Answer every book sync `Get` with no offers, as a peer that no longer holds what it
    /// listed (evicted or expired since).
    pub answer_gets_empty: bool,
}

impl NodeConfig {
    /// Production defaults on `network`: listen on TCP and QUIC on all interfaces, port 0.
    pub fn new(network: NetworkId) -> Self {
        Self {
            network,
            listen: Vec::new(),
            bootstrap: Vec::new(),
            relay_server: false,
            external_addrs: Vec::new(),
            mdns: true,
            use_relays: true,
            announce_period: Duration::from_secs(60),
            offer_resync: Duration::from_secs(600),
            completions_republish: Duration::from_secs(600),
            reputation: gridlease_contracts::reputation::ScoreParams::default(),
            offer_ttl: Duration::from_secs(3600),
            heartbeat: Duration::from_secs(1),
            // Longer than the longest usage interval (300 s) times three: a lease's own traffic
            // keeps its connection alive.
            idle_connection_timeout: Duration::from_secs(15 * 60),
            request_timeout: Duration::from_secs(30),
            max_concurrent_lease_streams: 64,
            book_capacity: DEFAULT_BOOK_CAPACITY,
            provider_rate: RateLimit {
                burst: 10,
                per_token: Duration::from_secs(10),
            },
            peer_rate: RateLimit {
                burst: 2000,
                per_token: Duration::from_millis(2),
            },
            offer: None,
            follow: None,
            search_follow: Duration::from_secs(600),
            gossip_grace: Duration::from_secs(30),
            connections: ConnectionCaps::default(),
            clock: clock::system(),
            #[cfg(feature = "faults")]
            faults: NetFaults::default(),
        }
    }

    /// Whether the offer topics wait for the first disconnection
    /// (`NetFaults::subscribe_after_first_disconnect`); never without the `faults` feature.
    pub(crate) fn subscribes_late(&self) -> bool {
        #[cfg(feature = "faults")]
        return self.faults.subscribe_after_first_disconnect;
        #[cfg(not(feature = "faults"))]
        false
    }

    /// Whether book sync `Get`s are answered empty (`NetFaults::answer_gets_empty`); never
    /// without the `faults` feature.
    pub(crate) fn answers_gets_empty(&self) -> bool {
        #[cfg(feature = "faults")]
        return self.faults.answer_gets_empty;
        #[cfg(not(feature = "faults"))]
        false
    }

    /// How long the restore's end is held back (`NetFaults::hold_restore`); never without
    /// the `faults` feature.
    pub(crate) fn restore_hold(&self) -> Option<Duration> {
        #[cfg(feature = "faults")]
        return self.faults.hold_restore;
        #[cfg(not(feature = "faults"))]
        None
    }

    /// Loopback-only settings for tests and benchmarks: TCP on 127.0.0.1, no mDNS, fast
    /// heartbeat and announce period.
    pub fn local(network: NetworkId, announce_period: Duration) -> Self {
        let mut c = Self::new(network);
        c.listen = vec![loopback_tcp()];
        c.mdns = false;
        c.use_relays = false;
        c.announce_period = announce_period;
        c.completions_republish = announce_period * 5;
        c.offer_ttl = Self::ttl_for(announce_period);
        c.offer_resync = Self::resync_for(announce_period);
        c.heartbeat = Duration::from_millis(100).min(announce_period / 2);
        c.provider_rate = RateLimit {
            burst: 20,
            per_token: announce_period / 10,
        };
        c
    }

    /// The offer lifetime for an announce period: sixty periods, at most the protocol's
    /// [`gridlease_contracts::terms::MAX_OFFER_TTL_S`] (3,600 s at the default 60 s). An
    /// unchanged offer is published only when it is re-signed, two periods before it expires,
    /// so the lifetime sets the steady announcement rate (`docs/protocol.md` 3c).
    pub fn ttl_for(announce_period: Duration) -> Duration {
        (announce_period * 60).min(Duration::from_secs(
            gridlease_contracts::terms::MAX_OFFER_TTL_S,
        ))
    }

    /// The offer anti-entropy period for an announce period: ten periods, at most 600 s.
    pub fn resync_for(announce_period: Duration) -> Duration {
        (announce_period * 10).min(Duration::from_secs(600))
    }

    /// How long gossipsub remembers message ids (ids are per announcement, see
    /// [`gossip::message_id`]).
    pub fn duplicate_cache_time(&self) -> Duration {
        Duration::from_secs(60)
    }

    /// A held offer's refresh is forwarded at most once per this interval.
    pub fn min_refresh_interval(&self) -> Duration {
        self.announce_period / 2
    }
}

/// `/ip4/127.0.0.1/tcp/0`.
pub fn loopback_tcp() -> Multiaddr {
    Multiaddr::from(std::net::Ipv4Addr::LOCALHOST).with(libp2p::multiaddr::Protocol::Tcp(0))
}

/// Failures building the swarm.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// Transport setup failed.
    #[error("transport: {0}")]
    Transport(String),
    /// Gossipsub configuration was refused.
    #[error("gossipsub: {0}")]
    Gossip(String),
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}: {detail}")]
    Listen {
        /// The address.
        addr: Multiaddr,
        /// Why.
        detail: String,
    },
    /// Loading state from the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the node reports. Broadcast; a lagging subscriber loses events, never the loop.
#[derive(Clone, Debug)]
pub enum NetworkEvent {
    /// Listening on a new address.
    Listening {
        /// The address (with `/p2p/<id>` appended).
        addr: Multiaddr,
    },
    /// A connection to a peer is up.
    PeerConnected {
        /// The peer.
        peer: PeerId,
    },
    /// The last connection to a peer closed.
    PeerDisconnected {
        /// The peer.
        peer: PeerId,
    },
    /// A peer subscribed to an offer topic (every offer's or a class's).
    PeerSubscribed {
        /// The peer.
        peer: PeerId,
    },
    /// This node's provider record for a GPU class (`docs/protocol.md` 3c step 4) was stored
    /// at the DHT nodes closest to the class's key.
    ClassRecordPut {
        /// The class.
        class: String,
    },
    /// A DHT lookup found nodes of a followed GPU class (`docs/protocol.md` 3c step 4).
    ClassNodesFound {
        /// The class.
        class: String,
        /// The nodes that put a record under its key (this node left out).
        peers: Vec<PeerId>,
    },
    /// A new or newer offer entered the book.
    OfferAdmitted {
        /// Its id.
        id: OfferId,
        /// Its provider.
        provider: PublicKey,
        /// Its sequence.
        seq: u64,
        /// Who forwarded it (this node for its own offers).
        from: PeerId,
    },
    /// A held offer was re-announced.
    OfferRefreshed {
        /// Its id.
        id: OfferId,
        /// Who forwarded it.
        from: PeerId,
    },
    /// An offer was rejected; the forwarding peer was penalised.
    OfferRejected {
        /// Who forwarded it.
        from: PeerId,
        /// Why, in words.
        reason: String,
    },
    /// An offer was dropped without penalty.
    OfferIgnored {
        /// Who forwarded it.
        from: PeerId,
        /// Why.
        reason: gossip::OfferIgnore,
    },
    /// This node published its offer.
    OfferPublished {
        /// Its id.
        id: OfferId,
        /// Its sequence.
        seq: u64,
    },
    /// Provider: a request was refused.
    LeaseRejected {
        /// The renter's peer.
        peer: PeerId,
        /// Why.
        reason: RejectReason,
    },
    /// A relay accepted our reservation.
    RelayReservation {
        /// The relay.
        relay: PeerId,
    },
    /// AutoNAT tested one of our addresses.
    NatProbe {
        /// The address.
        addr: Multiaddr,
        /// Reachable from outside.
        reachable: bool,
    },
    /// A direct connection was established by hole punching.
    HolePunched {
        /// The peer.
        peer: PeerId,
    },
}

/// A lease-stream request forwarded by the network loop to the lease service (registered with
/// [`Client::set_lease_handler`]). The loop answers the peer with what is sent on `reply`, or
/// with `Busy` / an `Internal` refusal if it is dropped.
#[derive(Debug)]
pub struct InboundLease {
    /// The connected peer that sent it (the transport authenticated it).
    pub peer: PeerId,
    /// The request.
    pub request: InboundRequest,
    /// Where to answer.
    pub reply: tokio::sync::oneshot::Sender<gridlease_protocol::session::LeaseRpcResponse>,
}

/// What an [`InboundLease`] asks.
#[derive(Debug)]
pub enum InboundRequest {
    /// A renter's lease request.
    Propose(Box<Proposal>),
    /// A message of a running lease.
    Session(gridlease_protocol::session::SessionRequest),
}

/// A renter's lease request whose envelope verified and whose signer is the sending peer,
/// with the offer this node advertises now.
#[derive(Debug)]
pub struct Proposal {
    /// As received.
    pub signed: Signed<gridlease_protocol::LeaseRequest>,
    /// Its verified content.
    pub verified: gridlease_protocol::Verified<gridlease_protocol::LeaseRequest>,
    /// The current own offer (`None` when this node offers nothing).
    pub offer: Option<OwnOffer>,
}

/// A running node: its client, its events, its task.
#[derive(Debug)]
pub struct Node {
    /// Send commands here.
    pub client: Client,
    /// Subscribe to events here.
    pub events: broadcast::Sender<NetworkEvent>,
    /// Cancels the loop.
    pub cancel: CancellationToken,
    /// The loop task.
    pub task: JoinHandle<()>,
}

impl Node {
    /// Loads persisted offers and leases, builds the swarm, starts listening and spawns the
    /// event loop.
    pub async fn start(
        key: NodeKey,
        config: NodeConfig,
        store: StoreHandle,
    ) -> Result<Self, BuildError> {
        let key = Arc::new(key);
        let now = clock::now();
        let network = config.network.clone();
        let own = store.call(|s| s.own_offer()).await?;
        let known_peers = store.call(|s| s.peers(event_loop::STORED_PEERS)).await?;
        let stored_completions = store
            .call(|s| s.completions(None, crate::store::COMPLETIONS_KEPT))
            .await?;
        let completions = reputation::Completions::new(
            network.clone(),
            key.public(),
            crate::store::COMPLETIONS_KEPT,
            stored_completions
                .into_iter()
                .map(|c| (c.completion, c.record)),
        );

        // The stored offers are restored after the loop starts (`restore`); the own offer is
        // in the book from the start.
        let mut book = OfferBook::with_capacity(config.book_capacity);
        let mut provider = provider::ProviderState::new(config.offer.clone());
        if let Some((own, used_seq)) = own
            && let Ok(v) = own.verify(&network)
            && v.signer == key.public()
        {
            provider.last_seq = v.message.seq.max(used_seq);
            // A stored offer withdrawn since (a later sequence was used) stays withdrawn: the
            // other books hold the withdrawal, and would refuse it as a replay.
            let withdrawn = used_seq > v.message.seq;
            if config.offer.is_some()
                && !withdrawn
                && validate_offer(&v.message, &v.signer, now).is_ok()
            {
                let id = OfferId(v.digest);
                // The restored own offer is in this node's own book at once (its `search` and
                // `offers_known` count it), as a freshly signed one would be.
                if !book.contains(&id)
                    && let Err(e) = book.admit(own.clone(), v.message.clone(), id, now)
                {
                    tracing::warn!(error = %e, "restored own offer not admitted to own book");
                }
                let images = config
                    .offer
                    .as_ref()
                    .map(|t| t.images.clone())
                    .unwrap_or_default();
                provider.current = Some(OwnOffer {
                    signed: own,
                    offer: v.message,
                    id,
                    images: std::sync::Arc::new(images),
                    earlier: Vec::new(),
                });
            }
        }

        let book_codec = codec::BookCodec::default();
        let sync_bytes = book_codec.received();
        let swarm = transport::build_swarm(&key, &config, book_codec)?;
        let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_QUEUE);
        let (events, _) = broadcast::channel(EVENT_QUEUE);
        let cancel = CancellationToken::new();
        let streams = swarm.behaviour().stream.new_control();
        let book = shared_book::SharedBook::new(book);
        let (restore_tx, restore_rx) = watch::channel(RestoreProgress::default());
        let (followed_tx, followed_rx) = watch::channel(None);
        let client = Client::new(
            cmd_tx.clone(),
            network.clone(),
            key.clone(),
            store.clone(),
            streams,
            book.reader(),
            restore_rx,
            followed_rx,
        );
        let store_for_restore = store.clone();
        let hold_restore = config.restore_hold();
        let mut el = event_loop::EventLoop::new(
            swarm,
            key,
            config,
            store,
            book,
            provider,
            cmd_rx,
            events.clone(),
            cancel.clone(),
            sync_bytes,
            completions,
            followed_tx,
        );
        el.start_listening()?;
        el.dial_known(&known_peers);
        let peer = client.peer_id();
        let span = tracing::info_span!("network", peer = %peer);
        let task = tokio::spawn(tracing::Instrument::instrument(el.run(), span.clone()));
        tokio::spawn(tracing::Instrument::instrument(
            restore::run(
                store_for_restore,
                network,
                now,
                cmd_tx,
                restore_tx,
                hold_restore,
            ),
            span,
        ));
        Ok(Self {
            client,
            events,
            cancel,
            task,
        })
    }

    /// Stops the loop and waits for it.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

/// Current time (the network edge reads the clock, the rules never do).
pub fn now() -> Timestamp {
    clock::now()
}
