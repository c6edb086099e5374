//! The task that owns the swarm. See the module docs of [`crate::net`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gridlease_contracts::book::Admission;
use gridlease_contracts::ingest::OfferIngestor;
use gridlease_protocol::class;
use gridlease_protocol::completion::{CoSigned, Completion, CompletionBatch};
use gridlease_protocol::{
    Digest, LeaseId, LeaseRequest, NodeKey, Offer, OfferId, PeerId, PublicKey, RejectReason,
    Signed, Timestamp,
};
use libp2p::gossipsub::{self, IdentTopic, MessageAcceptance};
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{self, OutboundRequestId, ResponseChannel};
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, Swarm, autonat, dcutr, identify, kad, mdns, noise, relay, tcp};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::behaviour::{Behaviour, BehaviourEvent};
use super::client::{Command, GossipStats, SyncStats};
use super::codec::{Incoming, LeaseRpc, LeaseRpcResponse};
use super::gossip::{self, OfferIgnore, Verdict};
use super::provider::{self, OwnOffer, ProviderState};
use super::ratelimit::RateLimiter;
use super::sync_queue::{Scope, SyncQueue};
use super::{BuildError, NetworkEvent, NodeConfig};
use super::{InboundLease, InboundRequest, Proposal};
use crate::clock;
use crate::store::StoreHandle;
use gridlease_protocol::session::SessionResponse;
use gridlease_protocol::sync::{BookRequest, BookResponse, MAX_SYNC_GET, MAX_SYNC_IDS};

/// Most offers buffered for the next store flush.
const OFFER_FLUSH_MAX: usize = 1024;
/// Verified offer messages the ingestor remembers beyond the book: copies of offers the node
/// did not keep (book full, rate-limited) arriving again. Re-announcements of offers it holds
/// are recognised by the book (`OfferBook::holds_frame`), which costs no memory; a cache
/// sized to the book cost about 140 bytes per offer (issue 19's memory budget).
const VERIFIED_OUTSIDE_BOOK: usize = 4096;
/// How often admitted offers are written to the store.
const OFFER_FLUSH_PERIOD: Duration = Duration::from_secs(1);
/// Most relays this node keeps a reservation on.
const MAX_RELAYS: usize = 2;
/// Most peers recorded per identify round in the store, and dialed from it at start.
pub(super) const STORED_PEERS: usize = 16;
/// How long a new connection may take (transport, security, multiplexing). Shorter than
/// libp2p's 10 s default because an AutoNAT v2 client waits 10 s for its server's verdict: a
/// dial-back to an address behind a router that drops unsolicited packets (most home routers)
/// must fail before that, or the client sees a timeout, learns nothing, and its NAT status
/// stays unknown.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
/// Most peers with a connection reversal remembered at once.
const MAX_REVERSALS: usize = 1024;
/// Most tracked peers in each rate limiter.
const RATE_KEYS: usize = 10_000;

/// Builds the swarm: TCP + QUIC, noise, yamux ([`super::muxer`]), DNS, relay client, the composite behaviour.
pub(super) fn build_swarm(
    key: &NodeKey,
    config: &NodeConfig,
    book_codec: super::codec::BookCodec,
) -> Result<Swarm<Behaviour>, BuildError> {
    let t = |e: &dyn std::fmt::Display| BuildError::Transport(e.to_string());
    let swarm = libp2p::SwarmBuilder::with_existing_identity(key.keypair().clone())
        .with_tokio()
        .with_tcp(
            tcp::Config::default().nodelay(true),
            noise::Config::new,
            super::muxer::Config::default,
        )
        .map_err(|e| t(&e))?
        .with_quic()
        .with_dns()
        .map_err(|e| t(&e))?
        .with_relay_client(noise::Config::new, super::muxer::Config::default)
        .map_err(|e| t(&e))?
        .with_behaviour(|kp, relay_client| {
            Behaviour::new(kp, relay_client, config, book_codec)
                .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { Box::new(e) })
        })
        .map_err(|e| t(&e))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(config.idle_connection_timeout))
        .with_connection_timeout(CONNECTION_TIMEOUT)
        .build();
    Ok(swarm)
}

/// Work finished off the loop that needs the swarm to complete.
#[derive(Debug)]
enum Internal {
    /// The lease service answered a forwarded lease-stream request.
    LeaseAnswered {
        peer: PeerId,
        channel: ResponseChannel<LeaseRpcResponse>,
        response: LeaseRpcResponse,
    },
}

/// A lease-stream request sent and not answered yet.
#[derive(Debug)]
struct PendingRpc {
    reply: oneshot::Sender<Result<LeaseRpcResponse, String>>,
    /// Kept for one more try when the first dial fails (see [`EventLoop::send_rpc`]).
    retry: Option<(PeerId, Vec<Multiaddr>, LeaseRpc)>,
}

/// Most differing id buckets a book sync lists one by one (`BucketIds`); with more it lists
/// whole pages (`Ids`/`ClassIds`) instead. An eighth: listing 32 buckets costs at least 32
/// round trips, the whole book of 100,000 ids 25.
const LIST_BUCKETS_UP_TO: usize = gridlease_protocol::sync::BUCKETS / 8;

/// Most lease-stream requests awaiting the lease service at once; more are answered `Busy`
/// (sessions) or refused (proposals).
const MAX_LEASE_IN_FLIGHT: usize = 1024;

pub(super) struct EventLoop {
    swarm: Swarm<Behaviour>,
    key: Arc<NodeKey>,
    config: NodeConfig,
    /// The topic of every offer: every provider publishes on it (and on its class's topic);
    /// nodes that follow every class subscribe to it.
    topic: IdentTopic,
    /// The offer topics this node subscribes to: [`Self::topic`] when it follows every class,
    /// else the followed classes' topics and its own offer's class's (`docs/protocol.md` 3c).
    offer_topics: Vec<IdentTopic>,
    store: StoreHandle,
    book: super::shared_book::SharedBook,
    /// Decodes and verifies gossiped offers; remembers provider keys and verified offers so
    /// re-announcements skip the signature check.
    ingestor: OfferIngestor,
    /// Verdicts given to gossiped offers (signature counts come from the ingestor and
    /// `book_refreshes`).
    verdicts: GossipStats,
    /// Received offers the book recognised as a held one (`Verdict::Refresh`): accepted
    /// without a signature check, reported with the ingestor's skips.
    book_refreshes: u64,
    provider: ProviderState,
    commands: mpsc::Receiver<Command>,
    /// Lease-stream requests forwarded to the lease service; each yields the answer.
    tasks: JoinSet<Internal>,
    events: broadcast::Sender<NetworkEvent>,
    cancel: CancellationToken,
    peer_limits: RateLimiter<PeerId>,
    provider_limits: RateLimiter<PublicKey>,
    listen_addrs: Vec<Multiaddr>,
    listen_waiters: Vec<oneshot::Sender<Vec<Multiaddr>>>,
    pending_rpcs: HashMap<OutboundRequestId, PendingRpc>,
    unflushed: Vec<(OfferId, Signed<Offer>, Offer, Timestamp)>,
    /// When each held offer was last accepted from gossip (bounded by the book: swept with it).
    last_accepted: HashMap<OfferId, Timestamp>,
    /// Relays we asked for a reservation (at most [`MAX_RELAYS`]), with the listener that
    /// holds it: when it closes (the relay went away) the relay may be asked again.
    relays: Vec<(PeerId, libp2p::core::transport::ListenerId)>,
    /// Relays that accepted our reservation (a subset of `relays`).
    reserved: Vec<PeerId>,
    /// What AutoNAT v2 observed about our addresses.
    observed: super::reach::Observed,
    /// Open connections per peer, relayed or direct.
    connections: super::reach::Connections,
    /// Peers reached only through a relay that this node dialed directly once (connection
    /// reversal), at most [`MAX_REVERSALS`]; forgotten when the peer disconnects.
    reversed: std::collections::HashSet<PeerId>,
    /// Where inbound lease-stream requests go (the lease service), once registered.
    lease_handler: Option<mpsc::Sender<InboundLease>>,
    /// Book syncs this node runs with peers it connected to (at most [`MAX_SYNCS`]).
    syncs: HashMap<PeerId, BookSync>,
    /// Syncs waiting for a slot, for the restore to finish, or for a sync with the same peer
    /// to end (at most [`MAX_SYNC_QUEUE`] peers).
    sync_queue: SyncQueue,
    /// The stored offers are still being restored ([`super::restore`]): syncs wait.
    restoring: bool,
    /// Offer ids a sync listed and will ask for, or has asked for and not had answered yet
    /// (never asked twice at once). Each leaves when its offer is admitted or refreshed, when
    /// the answer to its `Get` comes without it, or when its sync ends: one left behind would
    /// keep every later listing from asking for it again.
    wanted: std::collections::HashSet<OfferId>,
    /// Book sync requests answered per peer.
    sync_limits: RateLimiter<PeerId>,
    /// What book sync has done.
    sync_stats: SyncStats,
    /// INFO lines about malformed requests, per peer.
    probe_logs: RateLimiter<PeerId>,
    /// Book sync response bytes read (counted by the codec).
    sync_bytes: Arc<std::sync::atomic::AtomicU64>,
    /// Gossip that never started, lost bootstrap peers.
    liveness: super::liveness::Liveness,
    /// This node's own new offer sequences, paced a little below the rate receivers take from
    /// one provider (`NodeConfig::provider_rate`, [`super::ratelimit::RateLimit::with_headroom`]): a re-sign
    /// for capacity beyond it waits for a token instead of being ignored by every receiver,
    /// also when the network bunches two of them.
    own_resigns: RateLimiter<()>,
    /// Co-signed completion records and the reputation scores the book carries.
    completions: super::reputation::Completions,
    completion_topic: IdentTopic,
    /// Which connected peer the next completion anti-entropy round asks.
    completion_round: usize,
    /// Which connected peer the next offer anti-entropy round syncs with.
    resync_round: usize,
    /// The own offer's last publication reached no subscribed peer: publish it again when
    /// one subscribes (it is not re-announced periodically).
    publish_pending: bool,
    /// GPU classes this node put a DHT provider record for (`class_key`), and when: put
    /// again each `offer_resync` (kad's own republication is every 12 h, and nodes holding
    /// the record come and go).
    provided: HashMap<String, std::time::Instant>,
    /// Provider records being put, by query: a put that fails is tried again at the next
    /// announce round.
    class_puts: HashMap<kad::QueryId, String>,
    /// DHT lookups of a followed class's nodes under way, by query.
    class_lookups: HashMap<kad::QueryId, String>,
    /// When each followed class was last looked up (again after `offer_resync` at the
    /// soonest: a class's nodes may be connected without subscribing to its topic, a
    /// provider that follows every class).
    looked_up: HashMap<String, std::time::Instant>,
    /// Classes followed because a search named them, and the fetches of their offers.
    searched: super::searched::SearchedClasses,
    /// The classes the book holds (`None`: every class), from [`Self::offer_topics`]; kept
    /// here and published to the clients ([`super::Client::followed`]) when they change.
    followed: Option<Vec<String>>,
    followed_tx: tokio::sync::watch::Sender<Option<super::Followed>>,
}

/// Most nodes of a class one DHT lookup dials.
const CLASS_DIALS: usize = 3;

/// Lifetime of the re-signed offer that withdraws the own offer (`withdraw_own`): long enough
/// for receivers whose clocks run up to a minute ahead (`MAX_CLOCK_SKEW_S`) to take it.
const WITHDRAWAL_TTL_S: u64 = 90;
/// How long a stopping node keeps driving its connections so the withdrawal goes out.
const WITHDRAWAL_DRAIN: Duration = Duration::from_millis(300);

/// Whether a sync request's classes are acceptable: at most the followed-class limit, each a
/// class name; `None` (every class) always.
fn valid_classes(classes: Option<&[String]>) -> bool {
    classes.is_none_or(|cs| {
        cs.len() <= class::MAX_FOLLOWED_CLASSES && cs.iter().all(|c| class::is_class(c))
    })
}

/// Most book syncs run at once; more connections wait in a queue.
const MAX_SYNCS: usize = 8;
/// Most peers waiting for a book sync; a connection beyond them is not synced now (gossip and
/// the anti-entropy rounds still reach it).
const MAX_SYNC_QUEUE: usize = 1024;

/// One running book sync with a peer: pages of ids, then the missing offers in batches.
#[derive(Debug, Default)]
struct BookSync {
    /// Ids the peer holds that this node lacks, not yet asked for.
    missing: std::collections::VecDeque<OfferId>,
    /// Ids of the `Get` in flight (each also in `wanted`).
    asked: Vec<OfferId>,
    /// The classes this sync lists and fetches (`None`: every class), fixed at its start.
    classes: Option<Vec<String>>,
    /// The id pages are done.
    listed: bool,
    /// A request to the peer is in flight.
    busy: bool,
    /// After the offers: the completion records' pages were asked for.
    completions_started: bool,
    /// Their pages are done.
    completions_listed: bool,
    /// Leases whose records the peer holds and this node lacks, not yet asked for.
    completions_missing: std::collections::VecDeque<gridlease_protocol::LeaseId>,
    /// An anti-entropy round: the id buckets are compared first (`Digests`), and only those
    /// that differ are listed (`BucketIds`).
    by_bucket: bool,
    /// The bucket being listed (with `by_bucket`).
    bucket: Option<u8>,
    /// Buckets that differ, not listed yet.
    buckets: std::collections::VecDeque<u8>,
}

impl EventLoop {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        swarm: Swarm<Behaviour>,
        key: Arc<NodeKey>,
        config: NodeConfig,
        store: StoreHandle,
        book: super::shared_book::SharedBook,
        provider: ProviderState,
        commands: mpsc::Receiver<Command>,
        events: broadcast::Sender<NetworkEvent>,
        cancel: CancellationToken,
        sync_bytes: Arc<std::sync::atomic::AtomicU64>,
        completions: super::reputation::Completions,
        followed_tx: tokio::sync::watch::Sender<Option<super::Followed>>,
    ) -> Self {
        let (config_grace, config_bootstrap) = (config.gossip_grace, config.bootstrap.clone());
        let config_provider_rate = config.provider_rate;
        let mut el = Self {
            topic: gossip::offer_topic(&config.network),
            offer_topics: if config.faults.subscribe_after_first_disconnect {
                Vec::new()
            } else {
                gossip::followed_topics(&config.network, config.follow.as_deref())
            },
            completion_topic: gossip::completion_topic(&config.network),
            completions,
            completion_round: 0,
            resync_round: 0,
            publish_pending: false,
            provided: HashMap::new(),
            class_puts: HashMap::new(),
            class_lookups: HashMap::new(),
            looked_up: HashMap::new(),
            searched: super::searched::SearchedClasses::new(config.search_follow),
            followed: None,
            followed_tx,
            // Keys for every provider the book can hold; few verified messages, since the book
            // itself recognises re-announcements of what it holds (`gossip::check_offer`).
            ingestor: OfferIngestor::with_caches(
                config.network.clone(),
                config.book_capacity,
                VERIFIED_OUTSIDE_BOOK,
            ),
            verdicts: GossipStats::default(),
            book_refreshes: 0,
            peer_limits: RateLimiter::new(config.peer_rate, RATE_KEYS),
            provider_limits: RateLimiter::new(config.provider_rate, RATE_KEYS),
            swarm,
            key,
            config,
            store,
            book,
            provider,
            commands,
            tasks: JoinSet::new(),
            events,
            cancel,
            listen_addrs: Vec::new(),
            listen_waiters: Vec::new(),
            pending_rpcs: HashMap::new(),
            unflushed: Vec::new(),
            last_accepted: HashMap::new(),
            relays: Vec::new(),
            reserved: Vec::new(),
            observed: super::reach::Observed::default(),
            connections: super::reach::Connections::default(),
            reversed: std::collections::HashSet::new(),
            lease_handler: None,
            syncs: HashMap::new(),
            sync_queue: SyncQueue::new(MAX_SYNC_QUEUE),
            restoring: true,
            wanted: std::collections::HashSet::new(),
            sync_limits: RateLimiter::new(
                super::ratelimit::RateLimit {
                    burst: 512,
                    per_token: Duration::from_millis(10),
                },
                RATE_KEYS,
            ),
            sync_stats: SyncStats::default(),
            probe_logs: RateLimiter::new(
                super::ratelimit::RateLimit {
                    burst: 3,
                    per_token: Duration::from_secs(10),
                },
                RATE_KEYS,
            ),
            sync_bytes,
            liveness: super::liveness::Liveness::new(config_grace, &config_bootstrap),
            own_resigns: RateLimiter::new(config_provider_rate.with_headroom(), 1),
        };
        el.topics_changed();
        el
    }

    /// Binds the listen addresses, registers external addresses and dials bootstrap peers.
    pub(super) fn start_listening(&mut self) -> Result<(), BuildError> {
        for addr in self.config.listen.clone() {
            self.swarm
                .listen_on(addr.clone())
                .map_err(|e| BuildError::Listen {
                    addr,
                    detail: e.to_string(),
                })?;
        }
        for addr in self.config.external_addrs.clone() {
            self.swarm.add_external_address(addr);
        }
        if self.config.relay_server && self.config.external_addrs.is_empty() {
            tracing::info!(
                "relay server without --external-addr: its listen addresses count as external"
            );
        }
        for addr in self.config.bootstrap.clone() {
            if let Some(Protocol::P2p(peer)) = addr.iter().last() {
                self.swarm
                    .behaviour_mut()
                    .kad
                    .add_address(&peer, addr.clone());
            }
            if let Err(e) = self.swarm.dial(addr.clone()) {
                tracing::warn!(%addr, error = %e, "cannot dial bootstrap peer");
            }
        }
        Ok(())
    }

    /// Dials peers remembered from earlier runs (addresses as stored, with `/p2p/<id>` added).
    pub(super) fn dial_known(&mut self, peers: &[(String, Vec<String>)]) {
        for (peer, addrs) in peers {
            let Ok(peer) = peer.parse::<PeerId>() else {
                continue;
            };
            if peer == *self.swarm.local_peer_id() {
                continue;
            }
            for a in addrs.iter().filter_map(|a| a.parse::<Multiaddr>().ok()) {
                self.swarm.add_peer_address(peer, a);
            }
            let _ = self.swarm.dial(peer);
        }
    }

    /// Disconnects gridlease peers whose gossip never started (the next connection starts
    /// it afresh) and dials lost bootstrap peers whose backoff is over (`liveness.rs`).
    fn check_liveness(&mut self) {
        let now = std::time::Instant::now();
        for peer in self.liveness.overdue(now) {
            tracing::info!(%peer, grace_s = self.config.gossip_grace.as_secs_f64(), "gossip with this peer did not start; disconnecting so it starts on a new connection");
            let _ = self.swarm.disconnect_peer_id(peer);
        }
        for addr in self.liveness.due(now) {
            tracing::info!(%addr, "dialing a lost bootstrap peer again");
            if let Err(e) = self.swarm.dial(addr.clone()) {
                tracing::debug!(%addr, error = %e, "cannot dial bootstrap peer");
            }
        }
    }

    /// Closes relayed connections to peers that have a direct one now (hole punched or
    /// dialed): the lease's traffic then rides the direct connection only.
    fn retire_relayed(&mut self) {
        for (peer, id) in self.connections.due(std::time::Instant::now()) {
            tracing::info!(%peer, "direct connection up: closing the relayed one");
            self.swarm.close_connection(id);
        }
    }

    fn emit(&self, event: NetworkEvent) {
        // No subscriber is fine; a lagging one loses old events.
        let _ = self.events.send(event);
    }

    pub(super) async fn run(mut self) {
        let mut announce = tokio::time::interval(self.config.announce_period);
        announce.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut flush = tokio::time::interval(OFFER_FLUSH_PERIOD);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut kad_walk = tokio::time::interval(Duration::from_secs(300));
        kad_walk.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut live = tokio::time::interval(Duration::from_millis(250));
        live.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut rescore = tokio::time::interval(super::reputation::RESCORE_PERIOD);
        rescore.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut republish = tokio::time::interval(self.config.completions_republish);
        republish.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut resync = tokio::time::interval_at(
            tokio::time::Instant::now() + self.config.offer_resync,
            self.config.offer_resync,
        );
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => break,
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => match done {
                    Ok(done) => self.on_internal(done),
                    Err(e) => tracing::error!(error = %e, "lease request task failed"),
                },
                cmd = self.commands.recv() => match cmd {
                    Some(cmd) => self.on_command(cmd),
                    None => break,
                },
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                _ = announce.tick() => self.announce(),
                _ = rescore.tick() => {
                    if let Some(scores) = self.completions.rescore(&self.config.reputation) {
                        self.book.update(|b| b.set_reputation(scores));
                    }
                }
                _ = republish.tick() => {
                    if let Some(batch) = self.completions.republish() {
                        self.publish_completions(&batch);
                    }
                    self.completion_anti_entropy();
                }
                _ = resync.tick() => self.offer_anti_entropy(),
                _ = flush.tick() => self.flush_offers(),
                _ = kad_walk.tick() => {
                    // Random walk to keep the routing table fresh; no known peers is fine.
                    let _ = self.swarm.behaviour_mut().kad.bootstrap();
                }
                _ = live.tick() => {
                    self.check_liveness();
                    self.retire_relayed();
                    if self.provider.resign {
                        // A capacity re-sign waiting for the pace.
                        self.refresh_own(false);
                    }
                }
            }
        }
        // Tell the others this node's offer is gone; give the connections, if any, a moment
        // to send it.
        if self.withdraw_own() && self.swarm.connected_peers().next().is_some() {
            let swarm = &mut self.swarm;
            let _ = tokio::time::timeout(WITHDRAWAL_DRAIN, async {
                loop {
                    let _ = swarm.select_next_some().await;
                }
            })
            .await;
        }
        self.flush_offers();
        tracing::info!("network loop stopped");
    }

    // ---- commands ------------------------------------------------------------------------

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::ListenAddrs(reply) => {
                if self.listen_addrs.is_empty() {
                    self.listen_waiters.push(reply);
                } else {
                    let _ = reply.send(self.listen_addrs.clone());
                }
            }
            Command::Dial(addr, reply) => {
                let _ = reply.send(self.swarm.dial(addr).map_err(|e| e.to_string()));
            }
            Command::ConnectedPeers(reply) => {
                let _ = reply.send(self.swarm.connected_peers().copied().collect());
            }
            Command::Block(peer, block, reply) => {
                let blocked = &mut self.swarm.behaviour_mut().blocked;
                let changed = if block {
                    blocked.block_peer(peer)
                } else {
                    blocked.unblock_peer(peer)
                };
                let _ = reply.send(changed);
            }
            Command::MeshPeers(reply) => {
                // Every offer topic's mesh, each peer once.
                let gs = &self.swarm.behaviour().gossipsub;
                let mut peers: Vec<PeerId> = Vec::new();
                for t in &self.offer_topics {
                    peers.extend(gs.mesh_peers(&t.hash()).copied());
                }
                peers.sort();
                peers.dedup();
                let _ = reply.send(peers);
            }
            Command::PeerScore(peer, reply) => {
                let _ = reply.send(self.swarm.behaviour().gossipsub.peer_score(&peer));
            }
            Command::AddCompletion(pair, reply) => {
                self.completions_clock();
                let r = match self.completions.add(pair.clone()) {
                    Ok((new, batch)) => {
                        if new && let Ok(c) = pair.record_unchecked() {
                            self.persist_completions(vec![(c, pair)]);
                        }
                        if let Some(batch) = batch {
                            self.publish_completions(&batch);
                        }
                        Ok(new)
                    }
                    Err(e) => Err(e.to_string()),
                };
                let _ = reply.send(r);
            }
            Command::GossipStats(reply) => {
                let sig = self.ingestor.stats();
                let _ = reply.send(GossipStats {
                    signatures_checked: sig.checked,
                    // The ingestor's skips, and re-announcements the book recognised.
                    signatures_skipped: sig.skipped + self.book_refreshes,
                    ..self.verdicts
                });
            }
            Command::Restore(batch, reply) => {
                // Already verified (off the loop); stored offers are not persisted again nor
                // announced as learned.
                // Only the classes followed now (the node may have followed others before).
                let followed = self.followed_classes();
                let admitted = self.book.update(|b| {
                    batch
                        .into_iter()
                        .filter(|r| {
                            followed
                                .as_ref()
                                .is_none_or(|f| f.contains(&class::offer_class(&r.offer)))
                        })
                        .map(|r| b.admit(r.signed, r.offer, r.id, r.received_at))
                        .filter(Result::is_ok)
                        .count()
                });
                let _ = reply.send(admitted);
            }
            Command::RestoreDone => {
                self.restoring = false;
                self.next_queued_sync();
            }
            Command::SyncStats(reply) => {
                let mut st = self.sync_stats;
                st.bytes_received = self.sync_bytes.load(std::sync::atomic::Ordering::Relaxed);
                let _ = reply.send(st);
            }
            Command::SetOffer(template, reply) => {
                if template.is_none() {
                    // Also takes the offer out of the own book.
                    self.withdraw_own();
                }
                self.provider.template = template;
                self.provider.current = None;
                if self.provider.template.is_some() {
                    self.announce();
                }
                let _ = reply.send(self.provider.current.clone());
            }
            Command::SetFree(free, reply) => {
                // Re-signed and announced at once when the count changes.
                let changed = self.provider.free_gpus != Some(free);
                self.provider.free_gpus = Some(free);
                if changed
                    && self
                        .provider
                        .current
                        .as_ref()
                        .is_some_and(|c| c.offer.free_gpus != free)
                {
                    self.provider.resign = true;
                    self.announce();
                }
                let _ = reply.send(());
            }
            Command::SearchClass(class, reply) => self.search_class(class, reply),
            Command::OwnOffer(reply) => {
                let _ = reply.send(self.provider.current.clone());
            }
            Command::Announce(reply) => {
                self.announce();
                let _ = reply.send(());
            }
            Command::PublishRaw(on, bytes, reply) => {
                let topic = match on {
                    // Every offer's by default.
                    super::client::RawTopic::Followed => {
                        self.offer_topics.first().unwrap_or(&self.topic).clone()
                    }
                    super::client::RawTopic::Every => self.topic.clone(),
                    super::client::RawTopic::Class(c) => {
                        gossip::class_topic(&self.config.network, &c)
                    }
                };
                let r = self
                    .swarm
                    .behaviour_mut()
                    .gossipsub
                    .publish(topic, bytes)
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                let _ = reply.send(r);
            }
            Command::LeaseRpc {
                peer,
                addrs,
                rpc,
                reply,
            } => {
                let retry =
                    (!self.swarm.is_connected(&peer)).then(|| (peer, addrs.clone(), rpc.clone()));
                self.send_rpc(peer, &addrs, rpc, PendingRpc { reply, retry });
            }
            Command::SetLeaseHandler(tx, reply) => {
                self.lease_handler = Some(tx);
                let _ = reply.send(());
            }
            Command::Reachability(reply) => {
                let _ = reply.send(super::client::Reachability {
                    nat_status: self.observed.status(),
                    reachable: self.observed.reachable(),
                    unreachable: self.observed.unreachable(),
                    external: self.swarm.external_addresses().cloned().collect(),
                    relays: self.reserved.clone(),
                });
            }
            Command::Connections(peer, reply) => {
                let _ = reply.send(self.connections.of(&peer));
            }
        }
    }

    /// Sends a lease-stream request to `peer`, dialing it first at `addrs` (never one of our
    /// own: `reach::dialable`) when not connected. The explicit dial matters: request-response
    /// would otherwise join a dial already under way (kad's, with the peer's LAN addresses
    /// only) and fail the request with it.
    fn send_rpc(&mut self, peer: PeerId, addrs: &[Multiaddr], rpc: LeaseRpc, pending: PendingRpc) {
        let addrs = super::reach::dialable(addrs, &self.listen_addrs);
        for a in &addrs {
            self.swarm.add_peer_address(peer, a.clone());
        }
        if !self.swarm.is_connected(&peer) && !addrs.is_empty() {
            let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
                .addresses(addrs)
                .condition(libp2p::swarm::dial_opts::PeerCondition::Always)
                .build();
            if let Err(e) = self.swarm.dial(opts) {
                tracing::debug!(%peer, error = %e, "lease request dial not started");
            }
        }
        let id = self
            .swarm
            .behaviour_mut()
            .lease
            .send_request(&peer, Incoming::Valid(rpc));
        self.pending_rpcs.insert(id, pending);
    }

    // ---- own offer -----------------------------------------------------------------------

    /// One announce round: sweeps expired offers from the book and re-signs the own offer
    /// when it is missing, close to expiry or out of date, publishing it then. An unchanged
    /// offer is not published again: nodes that missed it get it by book sync, on connecting
    /// and from the anti-entropy round (`offer_anti_entropy`); once more only when its last
    /// publication found no subscribed peer (`publish_pending`, done when one subscribes).
    fn announce(&mut self) {
        let now = clock::now();
        self.book.update(|b| b.evict_expired(now));
        let last_accepted = &mut self.last_accepted;
        self.book
            .view(|b| last_accepted.retain(|id, _| b.contains(id)));
        self.refresh_own(false);
        for class in self.searched.idle(std::time::Instant::now()) {
            self.unfollow_searched(&class);
        }
        self.provide_classes();
        self.find_class_peers();
    }

    /// Puts a DHT provider record under the key of each class whose offers this node follows
    /// or serves (`docs/protocol.md` 3c step 4), once it has a confirmed external address: a
    /// record holds the addresses others will dial (kad sends the confirmed external ones),
    /// so a node without any puts none. A node behind a NAT has its relay reservation's
    /// address (libp2p-relay confirms it): those who find it come through the relay, and
    /// DCUtR may then punch a direct path.
    fn provide_classes(&mut self) {
        let reachable = self.swarm.external_addresses().next().is_some();
        // A record put with no DHT peer known stays local until kad republishes it.
        if !reachable || !self.dht_has_peers() {
            return;
        }
        let now = std::time::Instant::now();
        let every = self.config.offer_resync;
        // Not those followed for a search only: the node leaves them when no search names
        // them for a while, and a record lives 48 h.
        let searched = &self.searched;
        let mut classes: Vec<String> = self
            .followed_classes()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| !searched.contains(c))
            .collect();
        if let Some(own) = &self.provider.current {
            classes.push(class::offer_class(&own.offer));
        }
        for c in classes {
            if self
                .provided
                .get(&c)
                .is_some_and(|at| now.duration_since(*at) < every)
            {
                continue;
            }
            let key = gossip::class_key(&self.config.network, &c);
            match self.swarm.behaviour_mut().kad.start_providing(key) {
                Ok(query) => {
                    tracing::debug!(class = %c, "putting a provider record in the DHT for the GPU class");
                    self.provided.insert(c.clone(), now);
                    self.class_puts.insert(query, c);
                }
                Err(e) => {
                    tracing::warn!(class = %c, error = %e, "cannot put the class's provider record")
                }
            }
        }
    }

    /// For each followed class no connected peer subscribes to, looks up the class's nodes in
    /// the DHT (one lookup per class at a time); the nodes found are dialed
    /// ([`Self::on_class_providers`]), and the connection's book sync and gossip subscriptions
    /// do the rest.
    fn find_class_peers(&mut self) {
        let Some(classes) = self.followed_classes() else {
            return;
        };
        // Nobody to ask yet (the bootstrap connections are not up).
        if !self.dht_has_peers() {
            return;
        }
        let network = self.config.network.clone();
        let now = std::time::Instant::now();
        for c in classes {
            let recent = self
                .looked_up
                .get(&c)
                .is_some_and(|at| now.duration_since(*at) < self.config.offer_resync);
            if recent || self.class_lookups.values().any(|l| *l == c) {
                continue;
            }
            let topic = gossip::class_topic(&network, &c).hash();
            let heard = self
                .swarm
                .behaviour()
                .gossipsub
                .all_peers()
                .any(|(_, topics)| topics.contains(&&topic));
            if heard {
                continue;
            }
            tracing::debug!(class = %c, "looking up the GPU class's nodes in the DHT");
            self.lookup_class(c, now);
        }
    }

    /// Whether the DHT's routing table holds anybody to ask.
    fn dht_has_peers(&mut self) -> bool {
        self.swarm
            .behaviour_mut()
            .kad
            .kbuckets()
            .any(|b| b.num_entries() > 0)
    }

    /// Starts a DHT lookup of the nodes that put a provider record for `class`; the answer
    /// comes to [`Self::on_class_providers`].
    fn lookup_class(&mut self, class: String, now: std::time::Instant) {
        let key = gossip::class_key(&self.config.network, &class);
        let query = self.swarm.behaviour_mut().kad.get_providers(key);
        self.looked_up.insert(class.clone(), now);
        self.class_lookups.insert(query, class);
    }

    /// Nodes of a followed class found in the DHT: dials up to [`CLASS_DIALS`] of them this
    /// node is not connected to (kad supplies their addresses from the lookup).
    fn on_class_providers(&mut self, class: &str, providers: &std::collections::HashSet<PeerId>) {
        let me = *self.swarm.local_peer_id();
        let found: Vec<PeerId> = providers.iter().filter(|p| **p != me).copied().collect();
        if found.is_empty() {
            return;
        }
        let fresh: Vec<PeerId> = found
            .iter()
            .filter(|p| !self.swarm.is_connected(p))
            .take(CLASS_DIALS)
            .copied()
            .collect();
        if self.searched.contains(class) {
            // A search waits for this class: connected nodes of it are synced now.
            let connected: Vec<PeerId> = found
                .iter()
                .filter(|p| self.swarm.is_connected(p))
                .take(CLASS_DIALS)
                .copied()
                .collect();
            for peer in connected {
                self.fetch_class_from(class, peer);
            }
        }
        self.emit(NetworkEvent::ClassNodesFound {
            class: class.to_string(),
            peers: found,
        });
        for peer in fresh {
            tracing::info!(%class, %peer, "dialing a node of a followed GPU class found in the DHT");
            let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
                .condition(libp2p::swarm::dial_opts::PeerCondition::DisconnectedAndNotDialing)
                .build();
            if self.swarm.dial(opts).is_ok() {
                // Its connection's sync fetches the class (a followed one).
                self.searched.fetching_from(class, peer);
            } else {
                tracing::debug!(%peer, "node of the class not dialed");
            }
        }
    }

    /// A search names `class` ([`Command::SearchClass`]; `docs/protocol.md` 3c step 4). On a
    /// node that follows only some classes and not this one: follows it (subscribes to its
    /// topic; the least recently searched class makes room when the followed classes are at
    /// their limit), syncs its offers from up to [`CLASS_DIALS`] connected peers that hold
    /// them (on its topic or on the topic of every offer), or looks its nodes up in the DHT
    /// when none is connected; `reply` is answered when that fetch ends. A class followed for
    /// a search already stays followed longer, and the search waits for a fetch under way.
    fn search_class(&mut self, class: String, reply: oneshot::Sender<()>) {
        let now = std::time::Instant::now();
        if self.config.follow.is_none() || !class::is_class(&class) {
            let _ = reply.send(());
            return;
        }
        if self.searched.touch(&class, now) {
            self.searched.wait(&class, reply);
            return;
        }
        if self.follows(&class) {
            let _ = reply.send(());
            return;
        }
        if self.offer_topics.len() >= class::MAX_FOLLOWED_CLASSES {
            match self.searched.least_recent() {
                Some(old) => self.unfollow_searched(&old),
                None => {
                    tracing::info!(%class, "a search names a GPU class this node cannot follow too (it follows the most it may)");
                    let _ = reply.send(());
                    return;
                }
            }
        }
        let topic = gossip::class_topic(&self.config.network, &class);
        if let Err(e) = gossip::subscribe_offers(&mut self.swarm.behaviour_mut().gossipsub, &topic)
        {
            tracing::warn!(%class, error = %e, "cannot follow the GPU class a search names");
            let _ = reply.send(());
            return;
        }
        tracing::info!(%class, "following a GPU class a search names, and fetching its offers");
        self.offer_topics.push(topic);
        self.searched.start(&class, now);
        self.topics_changed();
        // Connected peers that hold the class's offers: on its topic, or following every class.
        let class_hash = gossip::class_topic(&self.config.network, &class).hash();
        let every = self.topic.hash();
        let holders: Vec<PeerId> = self
            .swarm
            .behaviour()
            .gossipsub
            .all_peers()
            .filter(|(_, topics)| topics.contains(&&class_hash) || topics.contains(&&every))
            .map(|(p, _)| *p)
            .take(CLASS_DIALS)
            .collect();
        // None known (a peer's subscriptions may not have arrived yet): the first connected
        // peers are asked anyway (a peer without the class answers empty digests), and the
        // DHT too.
        let asked: Vec<PeerId> = if holders.is_empty() {
            let mut peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
            peers.sort();
            peers.truncate(CLASS_DIALS);
            peers
        } else {
            holders.clone()
        };
        for peer in asked {
            self.fetch_class_from(&class, peer);
        }
        if holders.is_empty() && self.dht_has_peers() {
            tracing::debug!(%class, "looking up the searched GPU class's nodes in the DHT");
            self.lookup_class(class.clone(), now);
            self.searched.looking_up(&class, true);
        }
        // Answered at once when there is nothing to wait for (no holder connected, no DHT
        // peer known): the search reads the book as it is.
        self.searched.wait(&class, reply);
    }

    /// Syncs the offers of `class`, followed for a search, from the connected `peer`: a sync
    /// over that class's offers only (the completion records came with the connection's
    /// sync), now or, when it must wait (a sync with the peer runs, the most syncs run, the
    /// restore runs), from the queue: there it merges with other classes fetched from the
    /// peer, and a whole sync queued with the peer covers it.
    fn fetch_class_from(&mut self, class: &str, peer: PeerId) {
        if self.searched.waits_for(class, &peer) {
            return;
        }
        self.searched.fetching_from(class, peer);
        let classes = vec![class.to_string()];
        if self.must_wait_to_sync(&peer) {
            self.queue_sync(peer, Scope::Classes(classes));
        } else {
            self.begin_class_fetch(peer, classes);
        }
    }

    /// A sync with `peer` over `classes`' offers only, without the completion records.
    fn begin_class_fetch(&mut self, peer: PeerId, classes: Vec<String>) {
        self.begin_sync(peer, Some(classes));
        if let Some(s) = self.syncs.get_mut(&peer) {
            s.completions_started = true;
            s.completions_listed = true;
        }
    }

    /// Whether a sync with `peer` must wait in the queue: one with it is queued or runs, the
    /// most syncs run, or the restore runs.
    fn must_wait_to_sync(&self, peer: &PeerId) -> bool {
        self.sync_queue.contains(peer)
            || self.syncs.contains_key(peer)
            || self.syncs.len() >= MAX_SYNCS
            || self.restoring
    }

    /// Queues a sync with `peer`. When the queue is full the peer is not synced now (gossip
    /// and the anti-entropy rounds still reach it), and searches waiting for a class fetch
    /// from it wait no more.
    fn queue_sync(&mut self, peer: PeerId, scope: Scope) {
        if let Err(refused) = self.sync_queue.push(peer, scope) {
            tracing::debug!(%peer, "book sync queue full: not synced now");
            if let Scope::Classes(classes) = refused {
                self.searched.sync_ended(&peer, Some(classes.as_slice()));
            }
        }
    }

    /// Stops following a class followed for a search: unsubscribes from its topic and drops
    /// its offers from the book (the store keeps them until they expire; a restore admits
    /// the followed classes only).
    fn unfollow_searched(&mut self, class: &str) {
        let topic = gossip::class_topic(&self.config.network, class);
        self.swarm.behaviour_mut().gossipsub.unsubscribe(&topic);
        self.offer_topics.retain(|t| t.hash() != topic.hash());
        self.searched.remove(class);
        self.provided.remove(class);
        self.topics_changed();
        let dropped = self.book.update(|b| b.remove_class(class));
        tracing::info!(%class, dropped, "no longer following a GPU class no search named for a while");
    }

    /// Re-signs the own offer when it must be (missing, close to expiry, addresses changed)
    /// or when a capacity change asks for it (`provider.resign`) and the pace allows (else
    /// it stays asked for: the network loop's tick comes back); publishes it when re-signed,
    /// or always with `publish`.
    fn refresh_own(&mut self, publish: bool) {
        let now = clock::now();
        let Some(template) = self.provider.template.clone() else {
            return;
        };
        let ttl_ms = u64::try_from(self.config.offer_ttl.as_millis()).unwrap_or(u64::MAX);
        let margin = u64::try_from((self.config.announce_period * 2).as_millis()).unwrap_or(0);
        let addrs = self.advertised_addrs();
        // Re-sign when close to expiry, or when our reachable addresses changed (a relay
        // reservation came up, an external address was confirmed). No addresses yet (just
        // started, listeners not reported) is not a change worth a new sequence.
        let must = match &self.provider.current {
            None => true,
            Some(cur) => {
                cur.offer.expires_at.ms_since(now) <= margin
                    || (!addrs.is_empty() && cur.offer.addrs != addrs)
            }
        };
        // Every new sequence takes a token (receivers count them all); only a capacity
        // re-sign waits for one.
        let stale = if must {
            let _ = self.own_resigns.check(&(), now);
            true
        } else {
            self.provider.resign && self.own_resigns.check(&(), now)
        };
        if !stale && !publish {
            return;
        }
        if stale {
            let seq = self.provider.next_seq(now);
            let offer = template.offer(
                self.key.public(),
                seq,
                now,
                ttl_ms,
                addrs,
                self.provider.free_gpus,
            );
            let Some((signed, id)) = self.sign_own(&offer, false) else {
                return;
            };
            let admitted = self
                .book
                .update(|b| b.admit(signed.clone(), offer.clone(), id, now));
            if let Err(e) = admitted {
                tracing::warn!(error = %e, "own offer not admitted to own book");
            }
            let images = std::sync::Arc::new(template.images.clone());
            // The same template signed before stays acceptable for requests in flight.
            let earlier = match self.provider.current.take() {
                Some(prev) => std::iter::once((prev.id, prev.offer.seq))
                    .chain(prev.earlier)
                    .take(super::provider::EARLIER_KEPT)
                    .collect(),
                None => Vec::new(),
            };
            self.provider.resign = false;
            self.provider.current = Some(OwnOffer {
                signed,
                offer,
                id,
                images,
                earlier,
            });
            self.emit(NetworkEvent::OfferPublished { id, seq });
        }
        let Some(cur) = &self.provider.current else {
            return;
        };
        let (signed, offer) = (cur.signed.clone(), cur.offer.clone());
        self.follow_own_class(&offer);
        self.publish_own(&signed, &offer);
    }

    /// A node that follows some classes also follows its own offer's: it subscribes to that
    /// class's topic when it first signs an offer of it (and never unsubscribes: its book may
    /// hold that class's offers now).
    fn follow_own_class(&mut self, offer: &Offer) {
        if self.config.follow.is_none() {
            return;
        }
        let own = class::offer_class(offer);
        if self.searched.contains(&own) {
            // Followed for a search until now: for good from here.
            self.searched.remove(&own);
            self.topics_changed();
            return;
        }
        let topic = gossip::class_topic(&self.config.network, &own);
        if self.offer_topics.iter().any(|t| t.hash() == topic.hash()) {
            return;
        }
        match gossip::subscribe_offers(&mut self.swarm.behaviour_mut().gossipsub, &topic) {
            Ok(()) => {
                tracing::info!(topic = %topic, "following the own offer's GPU class");
                self.offer_topics.push(topic);
                self.topics_changed();
            }
            Err(e) => tracing::warn!(error = %e, "cannot follow the own offer's GPU class"),
        }
    }

    /// The GPU classes whose offers this node's book holds: `None` for every class, else the
    /// followed ones and the own offer's.
    fn followed_classes(&self) -> Option<Vec<String>> {
        self.followed.clone()
    }

    /// Recomputes the followed classes after [`Self::offer_topics`] changed, and publishes
    /// them to the clients.
    fn topics_changed(&mut self) {
        self.followed = self.config.follow.as_ref().map(|_| {
            self.offer_topics
                .iter()
                .filter_map(|t| {
                    let hash = t.hash();
                    gossip::offer_topic_class(&self.config.network, &hash)
                        .flatten()
                        .map(str::to_string)
                })
                .collect()
        });
        let view = self.followed.as_ref().map(|classes| super::Followed {
            classes: classes.clone(),
            searched: {
                let mut s: Vec<String> = self.searched.names().map(str::to_string).collect();
                s.sort();
                s
            },
        });
        self.followed_tx.send_replace(view);
    }

    /// Whether this node's book takes an offer of `class`.
    fn follows(&self, class: &str) -> bool {
        let topic = gossip::class_topic(&self.config.network, class).hash();
        self.config.follow.is_none() || self.offer_topics.iter().any(|t| t.hash() == topic)
    }

    /// Signs an own offer and persists it with its sequence (so sequences never go back);
    /// a withdrawal (`withdrawn`) only persists its sequence.
    fn sign_own(&mut self, offer: &Offer, withdrawn: bool) -> Option<(Signed<Offer>, OfferId)> {
        let signed = match Signed::sign(&self.key, &self.config.network, offer) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot sign own offer");
                return None;
            }
        };
        let id = OfferId(signed.envelope().content_digest());
        let (persisted, seq) = (signed.clone(), offer.seq);
        let submitted = self.store.try_submit(move |s| {
            let r = if withdrawn {
                s.put_own_withdrawal(seq)
            } else {
                s.put_own_offer(id, &persisted, seq)
            };
            if let Err(e) = r {
                tracing::error!(error = %e, "cannot persist own offer");
            }
        });
        if !submitted {
            tracing::warn!("store queue full; own offer sequence not persisted this round");
        }
        Some((signed, id))
    }

    /// Publishes an own offer on the topic of every offer and on its GPU class's topic (two
    /// publications: each gets its own random gossipsub sequence number, so their message ids
    /// differ). One that reaches no subscribed peer on either topic is published again when
    /// one subscribes (`publish_pending`).
    fn publish_own(&mut self, signed: &Signed<Offer>, offer: &Offer) {
        let bytes = match signed.to_bytes() {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode own offer");
                return;
            }
        };
        let seq = offer.seq;
        let topics = [
            self.topic.clone(),
            gossip::class_topic(&self.config.network, &class::offer_class(offer)),
        ];
        let mut reached = false;
        for topic in topics {
            match self
                .swarm
                .behaviour_mut()
                .gossipsub
                .publish(topic.clone(), bytes.clone())
            {
                Ok(_) | Err(gossipsub::PublishError::Duplicate) => {
                    reached = true;
                    tracing::debug!(seq, %topic, "offer announced");
                }
                Err(gossipsub::PublishError::NoPeersSubscribedToTopic) => {}
                Err(e) => {
                    tracing::warn!(error = %e, %topic, "offer announce failed");
                }
            }
        }
        self.publish_pending = !reached;
        if !reached {
            tracing::debug!("no peers to announce to yet; publishing when one subscribes");
        }
    }

    /// Withdraws the own offer from other nodes' books: it is re-signed with a new sequence,
    /// no free GPU and a lifetime of [`WITHDRAWAL_TTL_S`], and published. Receivers replace
    /// the offer they hold with it (searches leave out offers with no free GPU) and evict it
    /// when it expires, instead of listing the old offer until its own expiry (up to an hour,
    /// since unchanged offers are not re-announced). Best effort: a node that misses it keeps
    /// the old offer until that expires, as it would after a crash.
    ///
    /// Returns whether there was an offer to withdraw.
    fn withdraw_own(&mut self) -> bool {
        let Some(prev) = self.provider.current.take() else {
            return false;
        };
        self.book.update(|b| b.remove(&self.key.public()));
        let now = clock::now();
        let mut offer = prev.offer;
        offer.seq = self.provider.next_seq(now);
        offer.created_at = now;
        offer.expires_at = now.plus_secs(WITHDRAWAL_TTL_S);
        offer.free_gpus = 0;
        let _ = self.own_resigns.check(&(), now);
        if let Some((signed, _)) = self.sign_own(&offer, true) {
            self.publish_own(&signed, &offer);
            // Not repeated when a peer subscribes: it syncs our book, which no longer holds
            // the offer.
            self.publish_pending = false;
            tracing::info!(seq = offer.seq, "own offer withdrawn");
        }
        true
    }

    /// Our addresses as text for the offer: external ones first, then listen addresses;
    /// loopback ones only when there is nothing else (a node on one machine). A renter that
    /// dialed a provider's `127.0.0.1:4001` would reach itself when it listens there too, and
    /// that wrong-peer connection fails the whole dial, the good addresses with it.
    fn advertised_addrs(&self) -> Vec<String> {
        let me = *self.swarm.local_peer_id();
        let all: Vec<&Multiaddr> = self
            .swarm
            .external_addresses()
            .chain(self.listen_addrs.iter())
            .collect();
        let beyond_loopback = all.iter().any(|a| !super::reach::is_loopback(a));
        let mut out: Vec<String> = all
            .into_iter()
            .filter(|a| !beyond_loopback || !super::reach::is_loopback(a))
            .map(|a| with_peer(a.clone(), me).to_string())
            .filter(|s| s.len() <= gridlease_protocol::MAX_ADDR_LEN)
            .collect();
        out.dedup();
        out.truncate(gridlease_protocol::MAX_OFFER_ADDRS);
        out
    }

    fn flush_offers(&mut self) {
        if self.unflushed.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.unflushed);
        let now = clock::now();
        let n = batch.len();
        let ok = self.store.try_submit(move |s| {
            if let Err(e) = s.put_offers(&batch, now) {
                tracing::warn!(error = %e, "cannot persist offers");
            }
        });
        if !ok {
            // Offers are re-announced; losing a cache write costs a slower warm start only.
            tracing::warn!(offers = n, "store queue full; offer cache write skipped");
        }
    }

    // ---- internal completions -------------------------------------------------------------

    fn on_internal(&mut self, done: Internal) {
        match done {
            Internal::LeaseAnswered {
                peer,
                channel,
                response,
            } => {
                if let LeaseRpcResponse::Rejected(r) = &response
                    && let Ok(v) = r.verify(&self.config.network)
                {
                    self.emit(NetworkEvent::LeaseRejected {
                        peer,
                        reason: v.message.reason,
                    });
                }
                let _ = self
                    .swarm
                    .behaviour_mut()
                    .lease
                    .send_response(channel, response);
            }
        }
    }

    // ---- swarm events ----------------------------------------------------------------------

    /// The one place where swarm events become node events.
    fn on_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                let me = *self.swarm.local_peer_id();
                let addr = with_peer(address, me);
                tracing::info!(%addr, "listening");
                // libp2p-relay 0.22 serves HOP only with a confirmed external address, and puts
                // those addresses into reservations (clients refuse reservations without any).
                // A relay/bootstrap node is public by definition: unless the operator named its
                // external addresses, its own listen addresses are them.
                let relayed = addr.iter().any(|p| matches!(p, Protocol::P2pCircuit));
                if self.config.relay_server && self.config.external_addrs.is_empty() && !relayed {
                    self.swarm.add_external_address(addr.clone());
                }
                self.listen_addrs.push(addr.clone());
                for w in self.listen_waiters.drain(..) {
                    let _ = w.send(self.listen_addrs.clone());
                }
                self.emit(NetworkEvent::Listening { addr });
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                num_established,
                endpoint,
                ..
            } => {
                let relayed = endpoint.is_relayed();
                let dialer = endpoint.is_dialer();
                // A relayed connection this node accepted has no address of the peer (just
                // `/p2p/<id>`): the relayed address it was reached at names the relay.
                let remote = match &endpoint {
                    libp2p::core::ConnectedPoint::Listener { local_addr, .. } if relayed => {
                        local_addr.clone()
                    }
                    _ => endpoint.get_remote_address().clone(),
                };
                tracing::debug!(peer = %peer_id, addr = %remote, relayed, "connected");
                self.connections.established(
                    peer_id,
                    super::reach::Connection {
                        id: connection_id,
                        remote,
                        relayed,
                        dialer,
                    },
                    std::time::Instant::now(),
                );
                if num_established.get() == 1 {
                    self.liveness.connected(&peer_id);
                    self.emit(NetworkEvent::PeerConnected { peer: peer_id });
                    self.start_sync(peer_id);
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established,
                ..
            } if num_established > 0 => {
                self.connections.closed(&peer_id, connection_id);
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                ..
            } => {
                self.connections.closed(&peer_id, connection_id);
                self.liveness.lost(&peer_id, std::time::Instant::now());
                self.reversed.remove(&peer_id);
                self.searched.peer_gone(&peer_id);
                if self.config.faults.subscribe_after_first_disconnect {
                    // Test fault: gossip starts working after the first reconnection.
                    self.config.faults.subscribe_after_first_disconnect = false;
                    for topic in
                        gossip::followed_topics(&self.config.network, self.config.follow.as_deref())
                    {
                        let gs = &mut self.swarm.behaviour_mut().gossipsub;
                        if gossip::subscribe_offers(gs, &topic).is_ok() {
                            self.offer_topics.push(topic);
                        }
                    }
                    self.topics_changed();
                }
                self.emit(NetworkEvent::PeerDisconnected { peer: peer_id });
            }
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                if let Some(peer) = peer_id {
                    self.liveness.lost(&peer, std::time::Instant::now());
                    if !self.swarm.is_connected(&peer) {
                        self.searched.peer_gone(&peer);
                    }
                }
                tracing::debug!(peer = ?peer_id, error = %error, "outgoing connection failed");
            }
            SwarmEvent::ExternalAddrConfirmed { address } => {
                tracing::info!(%address, "external address confirmed");
                self.provide_classes();
            }
            SwarmEvent::ExternalAddrExpired { address } => {
                tracing::info!(%address, "external address expired");
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                let me = *self.swarm.local_peer_id();
                let addr = with_peer(address, me);
                tracing::info!(%addr, "no longer listening");
                self.listen_addrs.retain(|a| *a != addr);
            }
            SwarmEvent::ListenerClosed {
                listener_id,
                reason,
                ..
            } => {
                if let Some(i) = self.relays.iter().position(|(_, l)| *l == listener_id) {
                    let (relay, _) = self.relays.remove(i);
                    self.reserved.retain(|r| *r != relay);
                    tracing::info!(%relay, ?reason, "relay reservation ended; the relay is asked again when it is identified");
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Gossipsub(e)) => self.on_gossip(e),
            SwarmEvent::Behaviour(BehaviourEvent::Lease(e)) => self.on_lease(e),
            SwarmEvent::Behaviour(BehaviourEvent::Book(e)) => self.on_book(e),
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) => {
                // Subscribed to any offer topic (every offer's, or a class's: its gossip works
                // even if it follows no class this node follows).
                let network = &self.config.network;
                let subscribed = self
                    .swarm
                    .behaviour()
                    .gossipsub
                    .all_peers()
                    .any(|(p, topics)| {
                        *p == peer_id
                            && topics
                                .iter()
                                .any(|t| gossip::offer_topic_class(network, t).is_some())
                    });
                self.liveness.identified(
                    peer_id,
                    info.protocol_version == super::behaviour::IDENTIFY_PROTOCOL,
                    subscribed,
                    std::time::Instant::now(),
                );
                // The peer's addresses this node may dial it on later (identify's own address
                // cache is off: it would hand out every announced address, loopback and this
                // node's own included; see `reach::dialable`).
                let dialable = super::reach::dialable(&info.listen_addrs, &self.listen_addrs);
                for addr in dialable.iter().take(gridlease_protocol::MAX_OFFER_ADDRS) {
                    self.swarm.add_peer_address(peer_id, addr.clone());
                }
                let kad_proto = super::behaviour::KAD_PROTOCOL;
                if info.protocols.contains(&kad_proto) {
                    for addr in &dialable {
                        self.swarm
                            .behaviour_mut()
                            .kad
                            .add_address(&peer_id, addr.clone());
                    }
                }
                if info.protocols.contains(&relay::HOP_PROTOCOL_NAME) {
                    self.maybe_reserve(peer_id, &info.listen_addrs);
                }
                self.maybe_reverse(peer_id, &info.listen_addrs);
                let addrs: Vec<String> = info
                    .listen_addrs
                    .iter()
                    .take(gridlease_protocol::MAX_OFFER_ADDRS)
                    .map(ToString::to_string)
                    .collect();
                let peer = peer_id.to_string();
                let now = clock::now();
                // Best effort: a full store queue only loses a restart hint.
                let _ = self.store.try_submit(move |s| {
                    if let Err(e) = s.put_peer(&peer, &addrs, now) {
                        tracing::debug!(error = %e, "cannot record peer");
                    }
                });
            }
            SwarmEvent::Behaviour(BehaviourEvent::Mdns(mdns::Event::Discovered(found))) => {
                for (peer, addr) in found {
                    if !self.swarm.is_connected(&peer) {
                        self.swarm.add_peer_address(peer, addr.clone());
                        let _ = self.swarm.dial(addr);
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::RelayClient(
                relay::client::Event::ReservationReqAccepted { relay_peer_id, .. },
            )) => {
                if !self.reserved.contains(&relay_peer_id) {
                    self.reserved.push(relay_peer_id);
                }
                self.emit(NetworkEvent::RelayReservation {
                    relay: relay_peer_id,
                });
            }
            SwarmEvent::Behaviour(BehaviourEvent::AutonatClient(autonat::v2::client::Event {
                tested_addr,
                result,
                server,
                ..
            })) => {
                let reachable = result.is_ok();
                tracing::info!(addr = %tested_addr, %server, reachable, "AutoNAT probe");
                self.observed.probed(tested_addr.clone(), reachable);
                self.emit(NetworkEvent::NatProbe {
                    addr: tested_addr,
                    reachable,
                });
            }
            SwarmEvent::Behaviour(BehaviourEvent::Dcutr(dcutr::Event {
                remote_peer_id,
                result,
            })) => match result {
                Ok(_) => {
                    tracing::info!(peer = %remote_peer_id, "hole punch succeeded: direct connection");
                    self.emit(NetworkEvent::HolePunched {
                        peer: remote_peer_id,
                    });
                }
                Err(e) => {
                    tracing::info!(peer = %remote_peer_id, error = %e, "hole punch failed: the relay carries the connection");
                }
            },
            SwarmEvent::Behaviour(BehaviourEvent::Kad(kad::Event::OutboundQueryProgressed {
                id,
                result,
                step,
                ..
            })) if self.class_lookups.contains_key(&id) => {
                if let kad::QueryResult::GetProviders(Ok(kad::GetProvidersOk::FoundProviders {
                    providers,
                    ..
                })) = &result
                    && let Some(class) = self.class_lookups.get(&id).cloned()
                {
                    self.on_class_providers(&class, providers);
                }
                if step.last
                    && let Some(class) = self.class_lookups.remove(&id)
                {
                    // A search waiting for the class's fetch waits for the lookup no more (but
                    // for the syncs with the nodes it found).
                    self.searched.looking_up(&class, false);
                    if step.count.get() == 1
                        && !matches!(
                            result,
                            kad::QueryResult::GetProviders(Ok(
                                kad::GetProvidersOk::FoundProviders { .. }
                            ))
                        )
                    {
                        // Found nobody: asked again at the next announce round, not after
                        // `offer_resync`.
                        self.looked_up.remove(&class);
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Kad(kad::Event::OutboundQueryProgressed {
                id,
                result: kad::QueryResult::StartProviding(result),
                ..
            })) => {
                let Some(class) = self.class_puts.remove(&id) else {
                    return;
                };
                match result {
                    Ok(_) => {
                        tracing::debug!(%class, "provider record for the GPU class stored in the DHT");
                        self.emit(NetworkEvent::ClassRecordPut { class });
                    }
                    Err(e) => {
                        tracing::info!(%class, error = %e, "the GPU class's provider record was not stored in the DHT (tried again at the next announce round)");
                        self.provided.remove(&class);
                    }
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Kad(kad::Event::RoutingUpdated {
                peer, ..
            })) => {
                tracing::trace!(%peer, "kad routing updated");
            }
            _ => {}
        }
    }

    /// Connection reversal (the DCUtR spec's unilateral upgrade, which libp2p-dcutr 0.15
    /// lacks): a peer reached only through a relay that announces public addresses may be
    /// dialed directly. Without it a hole punch towards a public peer fails: the public
    /// peer's listener accepts the punch's SYN, and both ends then wait as the responder of
    /// the security handshake. The dial takes a new local port, so it never collides with a
    /// hole punch's port-reusing one.
    fn maybe_reverse(&mut self, peer: PeerId, addrs: &[Multiaddr]) {
        let conns = self.connections.of(&peer);
        if conns.is_empty()
            || conns.iter().any(|c| !c.relayed)
            || self.reversed.contains(&peer)
            || self.reversed.len() >= MAX_REVERSALS
        {
            return;
        }
        let public: Vec<Multiaddr> = addrs
            .iter()
            .filter(|a| super::reach::is_public_direct(a))
            .cloned()
            .collect();
        if public.is_empty() {
            return;
        }
        self.reversed.insert(peer);
        tracing::info!(%peer, addrs = ?public, "relayed peer announces public addresses: dialing it directly");
        let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
            .addresses(public)
            .condition(libp2p::swarm::dial_opts::PeerCondition::Always)
            .allocate_new_port()
            .build();
        if let Err(e) = self.swarm.dial(opts) {
            tracing::debug!(%peer, error = %e, "connection reversal not dialed");
        }
    }

    /// Listens through `relay` when this node has no confirmed external address (it may be
    /// behind NAT): the relay then forwards inbound connections, and DCUtR tries to upgrade
    /// them to direct ones.
    fn maybe_reserve(&mut self, relay: PeerId, relay_addrs: &[Multiaddr]) {
        // A relay's reservation is itself a confirmed external address (libp2p-relay 0.22):
        // only a direct one (configured, or confirmed by AutoNAT) makes relays unnecessary.
        if self.config.relay_server
            || !self.config.use_relays
            || self.relays.len() >= MAX_RELAYS
            || self.relays.iter().any(|(r, _)| *r == relay)
            || self
                .swarm
                .external_addresses()
                .any(|a| !super::reach::is_relayed(a))
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
        let Some(base) = dialed.or_else(|| {
            relay_addrs
                .iter()
                .find(|a| !super::reach::is_relayed(a))
                .cloned()
        }) else {
            return;
        };
        let circuit = with_peer(base, relay).with(Protocol::P2pCircuit);
        match self.swarm.listen_on(circuit.clone()) {
            Ok(listener) => {
                tracing::info!(%relay, addr = %circuit, "requesting a relay reservation");
                self.relays.push((relay, listener));
            }
            Err(e) => tracing::warn!(%relay, error = %e, "cannot listen through relay"),
        }
    }

    fn on_gossip(&mut self, event: gossipsub::Event) {
        match event {
            gossipsub::Event::Message {
                propagation_source,
                message_id,
                message,
            } if message.topic == self.completion_topic.hash() => {
                let acceptance = self.on_completions(&propagation_source, &message.data);
                self.swarm
                    .behaviour_mut()
                    .gossipsub
                    .report_message_validation_result(&message_id, &propagation_source, acceptance);
            }
            gossipsub::Event::Message {
                propagation_source,
                message_id,
                message,
            } => {
                let verdict = match gossip::offer_topic_class(&self.config.network, &message.topic)
                {
                    Some(class) => {
                        let class = class.map(str::to_string);
                        self.validate(&propagation_source, &message.data, class.as_deref())
                    }
                    None => Verdict::Ignore(OfferIgnore::NotFollowed),
                };
                match &verdict {
                    Verdict::Accept(_) | Verdict::Refresh(_) => self.verdicts.accepted += 1,
                    Verdict::Reject(_) => self.verdicts.rejected += 1,
                    Verdict::Ignore(_) => self.verdicts.ignored += 1,
                }
                let acceptance = match verdict {
                    Verdict::Refresh(id) => {
                        self.emit(NetworkEvent::OfferRefreshed {
                            id,
                            from: propagation_source,
                        });
                        MessageAcceptance::Accept
                    }
                    Verdict::Accept(valid) => {
                        let now = clock::now();
                        let valid = *valid;
                        let (id, provider, seq) = (valid.id, valid.offer.provider, valid.offer.seq);
                        let admitted = self.book.update(|b| {
                            b.admit(valid.signed.clone(), valid.offer.clone(), id, now)
                        });
                        match admitted {
                            Ok(Admission::Refresh) => {
                                self.emit(NetworkEvent::OfferRefreshed {
                                    id,
                                    from: propagation_source,
                                });
                            }
                            Ok(_) => {
                                if self.unflushed.len() < OFFER_FLUSH_MAX {
                                    self.unflushed.push((id, valid.signed, valid.offer, now));
                                }
                                self.emit(NetworkEvent::OfferAdmitted {
                                    id,
                                    provider,
                                    seq,
                                    from: propagation_source,
                                });
                            }
                            Err(e) => tracing::debug!(error = %e, "offer not admitted"),
                        }
                        MessageAcceptance::Accept
                    }
                    Verdict::Reject(why) => {
                        tracing::debug!(peer = %propagation_source, reason = %why, "offer rejected");
                        self.emit(NetworkEvent::OfferRejected {
                            from: propagation_source,
                            reason: why.to_string(),
                        });
                        MessageAcceptance::Reject
                    }
                    Verdict::Ignore(why) => {
                        tracing::debug!(peer = %propagation_source, reason = %why, "offer ignored");
                        self.emit(NetworkEvent::OfferIgnored {
                            from: propagation_source,
                            reason: why,
                        });
                        MessageAcceptance::Ignore
                    }
                };
                self.swarm
                    .behaviour_mut()
                    .gossipsub
                    .report_message_validation_result(&message_id, &propagation_source, acceptance);
            }
            gossipsub::Event::Subscribed { peer_id, topic }
                if gossip::offer_topic_class(&self.config.network, &topic).is_some() =>
            {
                self.liveness.subscribed(&peer_id);
                self.emit(NetworkEvent::PeerSubscribed { peer: peer_id });
                if self.publish_pending {
                    // The own offer's last publication reached nobody.
                    self.refresh_own(true);
                }
            }
            gossipsub::Event::GossipsubNotSupported { peer_id }
                if self.liveness.is_waiting(&peer_id) =>
            {
                // A gridlease node whose gossip stream was refused: a new connection retries.
                tracing::info!(peer = %peer_id, "gossip with this gridlease peer was refused; disconnecting so it starts on a new connection");
                let _ = self.swarm.disconnect_peer_id(peer_id);
            }
            _ => {}
        }
    }

    /// A gossiped batch of completion records: from a peer in good standing and within its
    /// rate, every record verified; the new ones kept and persisted. Forwarded only when it
    /// taught this node something.
    fn on_completions(&mut self, from: &PeerId, data: &[u8]) -> MessageAcceptance {
        let now = clock::now();
        if let Some(score) = self.swarm.behaviour().gossipsub.peer_score(from)
            && score < gossip::thresholds().graylist_threshold
        {
            return MessageAcceptance::Ignore;
        }
        if !self.peer_limits.check(from, now) {
            return MessageAcceptance::Ignore;
        }
        self.completions_clock();
        match self.completions.ingest(data) {
            Ok(new) if new.is_empty() => MessageAcceptance::Ignore,
            Ok(new) => {
                tracing::debug!(peer = %from, records = new.len(), "completion records learnt");
                self.persist_completions(new);
                MessageAcceptance::Accept
            }
            Err(e) => {
                tracing::debug!(peer = %from, error = %e, "completion batch rejected");
                MessageAcceptance::Reject
            }
        }
    }

    /// Writes verified records to the store (best effort: a full queue loses a restart
    /// hint, not a record others still hold).
    fn persist_completions(&mut self, records: Vec<(Completion, CoSigned)>) {
        let rows: Vec<(Completion, Vec<u8>)> = records
            .into_iter()
            .filter_map(|(c, pair)| pair.to_bytes().ok().map(|b| (c, b)))
            .collect();
        let now = clock::now();
        if !self.store.try_submit(move |s| {
            for (c, bytes) in &rows {
                if let Err(e) = s.put_completion(c, bytes, now) {
                    tracing::warn!(error = %e, "completion record not stored");
                }
            }
        }) {
            tracing::warn!("store queue full; completion records not persisted");
        }
    }

    /// Records may be dated at most the allowed clock skew ahead of this node's clock.
    fn completions_clock(&mut self) {
        self.completions
            .set_latest(clock::now().plus_secs(gridlease_contracts::terms::MAX_CLOCK_SKEW_S));
    }

    fn publish_completions(&mut self, batch: &CompletionBatch) {
        let Ok(bytes) = batch.to_bytes() else {
            return;
        };
        match self
            .swarm
            .behaviour_mut()
            .gossipsub
            .publish(self.completion_topic.clone(), bytes)
        {
            Ok(_) | Err(gossipsub::PublishError::NoPeersSubscribedToTopic) => {}
            Err(e) => tracing::debug!(error = %e, "completion records not published"),
        }
    }

    /// `topic_class`: the GPU class of the topic the offer came on (`None`: every offer's).
    fn validate(&mut self, from: &PeerId, data: &[u8], topic_class: Option<&str>) -> Verdict {
        let now = clock::now();
        // Gossipsub drops RPCs from graylisted peers, but checks once per RPC: a batch of
        // invalid offers in one RPC would still cost a signature check each. Stop paying for a
        // peer as soon as its score is below the graylist threshold.
        if let Some(score) = self.swarm.behaviour().gossipsub.peer_score(from)
            && score < gossip::thresholds().graylist_threshold
        {
            return Verdict::Ignore(OfferIgnore::Graylisted);
        }
        if !self.peer_limits.check(from, now) {
            return Verdict::Ignore(OfferIgnore::PeerRateLimited);
        }
        let ingestor = &mut self.ingestor;
        let verdict = self.book.view(|b| {
            gossip::check_topic(gossip::check_offer(data, ingestor, b, now), topic_class, b)
        });
        let (id, refresh) = match &verdict {
            Verdict::Refresh(id) => {
                self.book_refreshes += 1;
                (*id, true)
            }
            Verdict::Accept(v) => (v.id, v.admission == Admission::Refresh),
            Verdict::Reject(_) | Verdict::Ignore(_) => return verdict,
        };
        if refresh {
            let min = u64::try_from(self.config.min_refresh_interval().as_millis()).unwrap_or(0);
            if let Some(last) = self.last_accepted.get(&id)
                && now.ms_since(*last) < min
            {
                return Verdict::Ignore(OfferIgnore::RecentlyRefreshed);
            }
        } else if let Verdict::Accept(v) = &verdict
            && !self.provider_limits.check(&v.offer.provider, now)
        {
            return Verdict::Ignore(OfferIgnore::ProviderRateLimited);
        }
        self.last_accepted.insert(id, now);
        verdict
    }

    /// A malformed request from a peer: logged at INFO (at most a few per peer and second, the
    /// rest at DEBUG), so probing is visible without flooding the log.
    fn probed(&mut self, peer: &PeerId, stream: &str, detail: &str) {
        if self.probe_logs.check(peer, clock::now()) {
            tracing::info!(%peer, stream, detail, "malformed request answered");
        } else {
            tracing::debug!(%peer, stream, detail, "malformed request answered");
        }
    }

    // ---- book sync -------------------------------------------------------------------------

    /// Anti-entropy for completion records: each republish period, the completions phase of a
    /// book sync with the next connected peer in turn (gossip can miss a node whose mesh was
    /// forming; a batch nobody learns from is not forwarded). Costs one page of lease ids per
    /// 4,096 records when nothing is missing.
    fn completion_anti_entropy(&mut self) {
        let Some(peer) = self.next_in_turn(|l| &mut l.completion_round) else {
            return;
        };
        if self.syncs.contains_key(&peer) || self.syncs.len() >= MAX_SYNCS {
            return;
        }
        self.syncs.insert(
            peer,
            BookSync {
                listed: true,
                ..BookSync::default()
            },
        );
        self.sync_next(peer);
    }

    /// Anti-entropy for offers, which are published only when they change: each
    /// [`super::NodeConfig::offer_resync`], a book sync (bucket digests, the ids of the
    /// buckets that differ, then completion records) with the next connected peer in turn.
    /// Catches what gossip missed (a message lost while a mesh was forming, an offer a peer
    /// learned by sync, which is not re-gossiped). Costs one 2 KB answer when nothing is
    /// missing.
    fn offer_anti_entropy(&mut self) {
        if self.restoring {
            return;
        }
        let Some(peer) = self.next_in_turn(|l| &mut l.resync_round) else {
            return;
        };
        if self.syncs.contains_key(&peer) || self.syncs.len() >= MAX_SYNCS {
            return;
        }
        self.begin_sync(peer, self.followed_classes());
    }

    /// The next connected peer in turn for a round counted by `round`, in peer id order.
    fn next_in_turn(&mut self, round: impl FnOnce(&mut Self) -> &mut usize) -> Option<PeerId> {
        let mut peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        if peers.is_empty() {
            return None;
        }
        peers.sort();
        let r = round(self);
        *r = r.wrapping_add(1);
        Some(peers[*r % peers.len()])
    }

    /// A book sync with `peer`: bucket digests first, then the ids of the buckets that differ
    /// (or whole pages, when most do), then the missing offers and completion records; over
    /// `classes` (`None`: every class).
    fn begin_sync(&mut self, peer: PeerId, classes: Option<Vec<String>>) {
        self.sync_stats.started += 1;
        self.syncs.insert(
            peer,
            BookSync {
                by_bucket: true,
                classes: classes.clone(),
                ..BookSync::default()
            },
        );
        self.sync_request(peer, BookRequest::Digests { classes });
    }

    /// Asks a newly connected peer which live offers it holds (bounded: [`MAX_SYNCS`] at once,
    /// [`MAX_SYNC_QUEUE`] waiting). Waits in the queue while the restore runs, while
    /// [`MAX_SYNCS`] run, or while another sync with the peer runs (an anti-entropy round that
    /// picked it first: the connection's sync, dropped then, left a new node with only what
    /// other peers gave it).
    fn start_sync(&mut self, peer: PeerId) {
        if self.must_wait_to_sync(&peer) {
            self.queue_sync(peer, Scope::Whole);
            return;
        }
        // As an anti-entropy round: a node that reconnects, or restarts with its book, lists
        // only the buckets that differ (a new node lists all).
        self.begin_sync(peer, self.followed_classes());
    }

    /// The request for a page of the peer's offer ids after `after`, of `classes` (a sync's;
    /// `None`: every class).
    fn ids_request(classes: Option<Vec<String>>, after: Option<OfferId>) -> BookRequest {
        match classes {
            None => BookRequest::Ids { after },
            Some(classes) => BookRequest::ClassIds { classes, after },
        }
    }

    fn sync_request(&mut self, peer: PeerId, req: BookRequest) {
        if let Some(s) = self.syncs.get_mut(&peer) {
            s.busy = true;
        }
        self.swarm
            .behaviour_mut()
            .book
            .send_request(&peer, Incoming::Valid(req));
    }

    /// Asks for the next batch of missing offers, or ends the sync.
    fn sync_next(&mut self, peer: PeerId) {
        let Some(s) = self.syncs.get_mut(&peer) else {
            return;
        };
        s.busy = false;
        let mut ids = Vec::new();
        while ids.len() < MAX_SYNC_GET {
            let Some(id) = s.missing.pop_front() else {
                break;
            };
            ids.push(id);
        }
        if !ids.is_empty() {
            s.asked.clone_from(&ids);
            self.sync_request(peer, BookRequest::Get { ids });
            return;
        }
        if !s.listed {
            return;
        }
        // The offers are done: then the completion records (reputation).
        if !s.completions_started {
            s.completions_started = true;
            self.sync_request(peer, BookRequest::CompletionIds { after: None });
            return;
        }
        let n = s.completions_missing.len().min(MAX_SYNC_GET);
        let leases: Vec<_> = s.completions_missing.drain(..n).collect();
        if !leases.is_empty() {
            self.sync_request(peer, BookRequest::GetCompletions { leases });
        } else if s.completions_listed {
            if let Some(s) = self.syncs.remove(&peer) {
                self.sync_stats.ended += 1;
                self.searched.sync_ended(&peer, s.classes.as_deref());
            }
            self.next_queued_sync();
        }
    }

    /// The request for a page of the peer's ids in `bucket` after `after`, of `classes` (a
    /// sync's; `None`: every class).
    fn bucket_request(
        classes: Option<Vec<String>>,
        bucket: u8,
        after: Option<OfferId>,
    ) -> BookRequest {
        BookRequest::BucketIds {
            classes,
            bucket,
            after,
        }
    }

    /// Lists the next differing bucket of an anti-entropy round, or, when none is left (or
    /// the sync lists whole pages), ends the listing and fetches what is missing.
    fn next_bucket(&mut self, peer: PeerId) {
        let Some(s) = self.syncs.get_mut(&peer) else {
            return;
        };
        s.bucket = s.buckets.pop_front();
        match s.bucket {
            Some(bucket) => {
                let next = Self::bucket_request(s.classes.clone(), bucket, None);
                self.sync_request(peer, next);
            }
            None => {
                s.listed = true;
                self.sync_next(peer);
            }
        }
    }

    fn end_sync(&mut self, peer: &PeerId) {
        if let Some(s) = self.syncs.remove(peer) {
            self.sync_stats.ended += 1;
            tracing::debug!(%peer, missing = s.missing.len(), asked = s.asked.len(), listed = s.listed, "book sync ended early");
            for id in s.missing {
                self.wanted.remove(&id);
            }
            self.release_asked(s.asked);
            self.searched.sync_ended(peer, s.classes.as_deref());
        }
        self.next_queued_sync();
    }

    /// Releases the ids of an answered or abandoned `Get` that are still wanted: offers the
    /// answer left out (the peer no longer held them), stale ones, or ones a failed request
    /// lost. The next listing that names them asks for them again.
    fn release_asked(&mut self, asked: Vec<OfferId>) {
        for id in asked {
            if self.wanted.remove(&id) {
                self.sync_stats.asked_not_admitted += 1;
            }
        }
    }

    /// Starts queued syncs while slots are free: the first queued peers with no sync running
    /// (one that runs stays queued until it ends; every end calls this). A class fetch
    /// starts over the classes still followed for a search (one dropped meanwhile has
    /// answered its searches).
    fn next_queued_sync(&mut self) {
        while self.syncs.len() < MAX_SYNCS && !self.restoring {
            let syncs = &self.syncs;
            let Some((peer, scope)) = self.sync_queue.pop_ready(|p| !syncs.contains_key(p)) else {
                return;
            };
            // A peer gone since has released what waited for it (`SearchedClasses::peer_gone`).
            if !self.swarm.is_connected(&peer) {
                continue;
            }
            match scope {
                Scope::Whole => self.start_sync(peer),
                Scope::Classes(mut classes) => {
                    classes.retain(|c| self.searched.contains(c));
                    if !classes.is_empty() {
                        self.begin_class_fetch(peer, classes);
                    }
                }
            }
        }
    }

    fn on_book(&mut self, event: request_response::Event<Incoming<BookRequest>, BookResponse>) {
        match event {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request {
                    request, channel, ..
                } => {
                    let response = match request {
                        Incoming::Valid(r) => self.answer_sync(&peer, r),
                        Incoming::Malformed(detail) => {
                            self.probed(&peer, "book sync", &detail);
                            BookResponse::Refused
                        }
                    };
                    let _ = self
                        .swarm
                        .behaviour_mut()
                        .book
                        .send_response(channel, response);
                }
                request_response::Message::Response { response, .. } => {
                    self.sync_stats.bytes_received =
                        self.sync_bytes.load(std::sync::atomic::Ordering::Relaxed);
                    self.on_sync_response(peer, response);
                }
            },
            request_response::Event::OutboundFailure { peer, error, .. } => {
                tracing::debug!(%peer, %error, "book sync request failed");
                self.end_sync(&peer);
            }
            request_response::Event::InboundFailure { peer, error, .. } => {
                tracing::debug!(%peer, %error, "inbound book sync request failed");
            }
            request_response::Event::ResponseSent { .. } => {}
        }
    }

    /// What this node answers a syncing peer: its live offers' ids, or their envelopes.
    fn answer_sync(&mut self, peer: &PeerId, request: BookRequest) -> BookResponse {
        let now = clock::now();
        if !self.sync_limits.check(peer, now) {
            return BookResponse::Refused;
        }
        match request {
            BookRequest::Ids { after } => {
                let (ids, more) = self
                    .book
                    .view(|b| b.ids_after(after.as_ref(), MAX_SYNC_IDS, now));
                BookResponse::Ids { ids, more }
            }
            BookRequest::ClassIds { classes, after }
                if classes.len() <= class::MAX_FOLLOWED_CLASSES
                    && classes.iter().all(|c| class::is_class(c)) =>
            {
                let (ids, more) = self
                    .book
                    .view(|b| b.class_ids_after(&classes, after.as_ref(), MAX_SYNC_IDS, now));
                BookResponse::Ids { ids, more }
            }
            BookRequest::ClassIds { .. } => BookResponse::Refused,
            BookRequest::Digests { classes } if valid_classes(classes.as_deref()) => {
                let digests = self
                    .book
                    .view(|b| b.bucket_digests(classes.as_deref(), now));
                BookResponse::Digests { digests }
            }
            BookRequest::BucketIds {
                classes,
                bucket,
                after,
            } if valid_classes(classes.as_deref()) => {
                let (ids, more) = self.book.view(|b| {
                    b.bucket_ids_after(
                        classes.as_deref(),
                        bucket,
                        after.as_ref(),
                        MAX_SYNC_IDS,
                        now,
                    )
                });
                BookResponse::Ids { ids, more }
            }
            BookRequest::Digests { .. } | BookRequest::BucketIds { .. } => BookResponse::Refused,
            // A test fault: a peer that no longer holds what it listed.
            BookRequest::Get { ids } if self.config.faults.answer_gets_empty => {
                tracing::debug!(
                    asked = ids.len(),
                    "book sync Get answered empty (test fault)"
                );
                BookResponse::Offers {
                    envelopes: Vec::new(),
                }
            }
            BookRequest::Get { ids } if ids.len() <= MAX_SYNC_GET => {
                let envelopes = self.book.view(|book| {
                    ids.iter()
                        .filter_map(|id| book.envelope(id))
                        .filter_map(|s| s.to_bytes().ok())
                        .map(serde_bytes::ByteBuf::from)
                        .collect()
                });
                BookResponse::Offers { envelopes }
            }
            BookRequest::Get { .. } => BookResponse::Refused,
            BookRequest::CompletionIds { after } => {
                let (ids, more) = self.completions.ids_after(after.as_ref(), MAX_SYNC_IDS);
                BookResponse::CompletionIds { ids, more }
            }
            BookRequest::GetCompletions { leases } if leases.len() <= MAX_SYNC_GET => {
                let pairs = self
                    .completions
                    .pairs_of(&leases)
                    .map(|b| serde_bytes::ByteBuf::from(b.to_vec()))
                    .collect();
                BookResponse::Completions { pairs }
            }
            BookRequest::GetCompletions { .. } => BookResponse::Refused,
        }
    }

    fn on_sync_response(&mut self, peer: PeerId, response: BookResponse) {
        if !self.syncs.contains_key(&peer) {
            return;
        }
        match response {
            BookResponse::Ids { ids, more } => {
                self.sync_stats.ids_received += ids.len() as u64;
                let last = ids.last().copied();
                let wanted = &self.wanted;
                let fresh: Vec<OfferId> = self.book.view(|book| {
                    ids.into_iter()
                        .filter(|id| !book.contains(id) && !wanted.contains(id))
                        .collect()
                });
                // Never want more than the book holds.
                let room = self.config.book_capacity.saturating_sub(self.wanted.len());
                let Some(s) = self.syncs.get_mut(&peer) else {
                    return;
                };
                for id in fresh.into_iter().take(room) {
                    self.wanted.insert(id);
                    s.missing.push_back(id);
                }
                match (more, last, s.bucket) {
                    (true, Some(after), Some(bucket)) => {
                        let next = Self::bucket_request(s.classes.clone(), bucket, Some(after));
                        self.sync_request(peer, next);
                    }
                    (true, Some(after), None) => {
                        let next = Self::ids_request(s.classes.clone(), Some(after));
                        self.sync_request(peer, next);
                    }
                    _ => self.next_bucket(peer),
                }
            }
            BookResponse::Offers { envelopes } => {
                for bytes in envelopes {
                    if !self.admit_synced(&peer, &bytes) {
                        // An invalid offer from a peer we asked: stop syncing with it.
                        self.sync_stats.offers_rejected += 1;
                        self.end_sync(&peer);
                        return;
                    }
                }
                if let Some(s) = self.syncs.get_mut(&peer) {
                    let asked = std::mem::take(&mut s.asked);
                    self.release_asked(asked);
                }
                self.sync_next(peer);
            }
            BookResponse::Refused => {
                tracing::debug!(%peer, "book sync refused by the peer");
                self.end_sync(&peer);
            }
            BookResponse::Digests { digests } => {
                let Some(s) = self.syncs.get(&peer) else {
                    return;
                };
                if !s.by_bucket || digests.len() != gridlease_protocol::sync::BUCKETS {
                    // Not asked for, or malformed.
                    self.end_sync(&peer);
                    return;
                }
                let now = clock::now();
                let classes = s.classes.clone();
                let own = self
                    .book
                    .view(|b| b.bucket_digests(classes.as_deref(), now));
                let differ: std::collections::VecDeque<u8> = (0..=u8::MAX)
                    .filter(|&b| own[usize::from(b)] != digests[usize::from(b)])
                    .collect();
                self.sync_stats.digest_rounds += 1;
                self.sync_stats.buckets_differing += differ.len() as u64;
                if differ.len() > LIST_BUCKETS_UP_TO {
                    // Most buckets differ (a new node, or one long away): whole pages of ids
                    // take a round trip per 4,096 ids, a bucket at least one each.
                    self.sync_stats.whole_listings += 1;
                    let first = Self::ids_request(classes, None);
                    self.sync_request(peer, first);
                    return;
                }
                if let Some(s) = self.syncs.get_mut(&peer) {
                    s.buckets = differ;
                }
                self.next_bucket(peer);
            }
            BookResponse::CompletionIds { ids, more } => {
                let last = ids.last().copied();
                let room = crate::store::COMPLETIONS_KEPT;
                let completions = &self.completions;
                let Some(s) = self.syncs.get_mut(&peer) else {
                    return;
                };
                for id in ids {
                    if !completions.has(&id) && s.completions_missing.len() < room {
                        s.completions_missing.push_back(id);
                    }
                }
                match (more, last) {
                    (true, Some(after)) => {
                        self.sync_request(peer, BookRequest::CompletionIds { after: Some(after) })
                    }
                    _ => {
                        s.completions_listed = true;
                        self.sync_next(peer);
                    }
                }
            }
            BookResponse::Completions { pairs } => {
                let decoded: Result<Vec<CoSigned>, _> =
                    pairs.iter().map(|b| CoSigned::from_bytes(b)).collect();
                self.completions_clock();
                let ingested = match decoded {
                    Ok(pairs) => self
                        .completions
                        .ingest_pairs(pairs)
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                match ingested {
                    Ok(new) => {
                        if !new.is_empty() {
                            self.persist_completions(new);
                        }
                        self.sync_next(peer);
                    }
                    Err(e) => {
                        // A bad record from a peer we asked: stop syncing with it.
                        tracing::info!(%peer, error = %e, "invalid completion record in a book sync");
                        self.end_sync(&peer);
                    }
                }
            }
        }
    }

    /// Verifies one synced envelope as gossip would (ingestor, provider rate limit, book) and
    /// admits it. Returns false for an invalid one.
    fn admit_synced(&mut self, peer: &PeerId, bytes: &[u8]) -> bool {
        let now = clock::now();
        let ingestor = &mut self.ingestor;
        let verdict = self
            .book
            .view(|b| gossip::check_offer(bytes, ingestor, b, now));
        match verdict {
            Verdict::Refresh(id) => {
                self.book_refreshes += 1;
                self.wanted.remove(&id);
                true
            }
            Verdict::Accept(v) => {
                let valid = *v;
                self.wanted.remove(&valid.id);
                if !self.follows(&class::offer_class(&valid.offer)) {
                    // Not asked for (this node asks for its classes only): not kept.
                    return true;
                }
                if valid.admission != Admission::Refresh
                    && !self.provider_limits.check(&valid.offer.provider, now)
                {
                    return true;
                }
                let (id, provider, seq) = (valid.id, valid.offer.provider, valid.offer.seq);
                let admitted = self
                    .book
                    .update(|b| b.admit(valid.signed.clone(), valid.offer.clone(), id, now));
                match admitted {
                    Ok(Admission::Refresh) => {}
                    Ok(_) => {
                        self.sync_stats.offers_admitted += 1;
                        self.last_accepted.insert(id, now);
                        if self.unflushed.len() < OFFER_FLUSH_MAX {
                            self.unflushed.push((id, valid.signed, valid.offer, now));
                        }
                        self.emit(NetworkEvent::OfferAdmitted {
                            id,
                            provider,
                            seq,
                            from: *peer,
                        });
                    }
                    Err(e) => tracing::debug!(error = %e, "synced offer not admitted"),
                }
                true
            }
            // Stale or superseded by now: not the peer's fault.
            Verdict::Ignore(_) => true,
            Verdict::Reject(why) => {
                tracing::info!(%peer, reason = %why, "invalid offer in a book sync");
                self.emit(NetworkEvent::OfferRejected {
                    from: *peer,
                    reason: why.to_string(),
                });
                false
            }
        }
    }

    fn on_lease(&mut self, event: request_response::Event<Incoming<LeaseRpc>, LeaseRpcResponse>) {
        match event {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request {
                    request, channel, ..
                } => match request {
                    Incoming::Valid(request) => self.on_lease_request(peer, request, channel),
                    Incoming::Malformed(detail) => {
                        self.probed(&peer, "lease", &detail);
                        let blank = LeaseId(Digest::default());
                        let answer = provider::reject(
                            &self.key,
                            &self.config.network,
                            blank,
                            0,
                            RejectReason::Malformed {
                                detail: truncate(detail),
                            },
                            clock::now(),
                        );
                        let _ = self
                            .swarm
                            .behaviour_mut()
                            .lease
                            .send_response(channel, answer);
                    }
                },
                request_response::Message::Response {
                    request_id,
                    response,
                } => {
                    if let Some(p) = self.pending_rpcs.remove(&request_id) {
                        let _ = p.reply.send(Ok(response));
                    }
                }
            },
            request_response::Event::OutboundFailure {
                request_id, error, ..
            } => {
                let Some(p) = self.pending_rpcs.remove(&request_id) else {
                    return;
                };
                match (error, p.retry) {
                    // The first dial that failed may have been another one (a request joins
                    // any dial to its peer); once more, dialing the given addresses.
                    (request_response::OutboundFailure::DialFailure, Some((peer, addrs, rpc))) => {
                        tracing::debug!(%peer, "lease request's dial failed; trying once more");
                        let pending = PendingRpc {
                            reply: p.reply,
                            retry: None,
                        };
                        self.send_rpc(peer, &addrs, rpc, pending);
                    }
                    (error, _) => {
                        let _ = p.reply.send(Err(error.to_string()));
                    }
                }
            }
            request_response::Event::InboundFailure { peer, error, .. } => {
                tracing::debug!(%peer, %error, "inbound lease request failed");
            }
            request_response::Event::ResponseSent { .. } => {}
        }
    }

    /// Forwards a lease-stream request to the lease service without waiting for it; the
    /// answer comes back as [`Internal::LeaseAnswered`]. A proposal is verified first (envelope,
    /// and signed by the sending peer) and goes with the offer this node advertises now.
    fn on_lease_request(
        &mut self,
        peer: PeerId,
        request: LeaseRpc,
        channel: ResponseChannel<LeaseRpcResponse>,
    ) {
        let now = clock::now();
        let refuse = |this: &mut Self, lease_id, nonce, reason| {
            provider::reject(
                &this.key,
                &this.config.network,
                lease_id,
                nonce,
                reason,
                now,
            )
        };
        let (request, unavailable) = match request {
            LeaseRpc::Propose(signed) => match self.verify_request(&peer, &signed) {
                Ok(verified) => {
                    let (id, nonce) = (
                        verified
                            .message
                            .terms
                            .lease_id()
                            .unwrap_or(LeaseId(Digest::default())),
                        verified.message.terms.nonce,
                    );
                    let busy = refuse(self, id, nonce, RejectReason::Internal);
                    let offer = self.provider.current.clone();
                    (
                        InboundRequest::Propose(Box::new(Proposal {
                            signed,
                            verified,
                            offer,
                        })),
                        busy,
                    )
                }
                Err((lease_id, nonce, reason)) => {
                    let response = refuse(self, lease_id, nonce, reason.clone());
                    self.emit(NetworkEvent::LeaseRejected { peer, reason });
                    let _ = self
                        .swarm
                        .behaviour_mut()
                        .lease
                        .send_response(channel, response);
                    return;
                }
            },
            LeaseRpc::Session(request) => (
                InboundRequest::Session(request),
                LeaseRpcResponse::Session(SessionResponse::Busy),
            ),
        };
        let handler = self.lease_handler.clone();
        let (reply, rx) = oneshot::channel();
        let forwarded = self.tasks.len() < MAX_LEASE_IN_FLIGHT
            && handler.is_some_and(|tx| {
                tx.try_send(InboundLease {
                    peer,
                    request,
                    reply,
                })
                .is_ok()
            });
        if !forwarded {
            let _ = self
                .swarm
                .behaviour_mut()
                .lease
                .send_response(channel, unavailable);
            return;
        }
        self.tasks.spawn(async move {
            let response = rx.await.unwrap_or(unavailable);
            Internal::LeaseAnswered {
                peer,
                channel,
                response,
            }
        });
    }

    /// Verifies a request's envelope and that it was signed by the peer that sent it.
    fn verify_request(
        &self,
        peer: &PeerId,
        signed: &Signed<LeaseRequest>,
    ) -> Result<gridlease_protocol::Verified<LeaseRequest>, (LeaseId, u64, RejectReason)> {
        let blank = LeaseId(Digest::default());
        let v = signed.verify(&self.config.network).map_err(|e| {
            (
                blank,
                0,
                RejectReason::Malformed {
                    detail: truncate(e.to_string()),
                },
            )
        })?;
        let lease_id = v.message.terms.lease_id().unwrap_or(blank);
        let nonce = v.message.terms.nonce;
        match PublicKey::from_peer_id(peer) {
            Ok(k) if k == v.signer => Ok(v),
            _ => Err((
                lease_id,
                nonce,
                RejectReason::Malformed {
                    detail: "request not signed by the sending peer".into(),
                },
            )),
        }
    }
}

fn truncate(mut s: String) -> String {
    if s.len() > 200 {
        let mut cut = 200;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

fn with_peer(addr: Multiaddr, peer: PeerId) -> Multiaddr {
    if matches!(addr.iter().last(), Some(Protocol::P2p(_))) {
        addr
    } else {
        addr.with(Protocol::P2p(peer))
    }
}
