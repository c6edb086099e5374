//! The task that owns the swarm: a router over the network loop's child state machines
//! (see the module docs of [`crate::net`]). It keeps the swarm, the shared context
//! ([`LoopCtx`]) and the children, and dispatches commands, swarm events and timer ticks to
//! them: [`Reach`] (addresses, relays, NAT, connections, liveness), [`Classes`] (followed
//! GPU classes, DHT records and lookups, searches), [`Ingest`] (offer verification and
//! admission), [`Reputation`] (completion records), [`BookSyncs`] (book sync), [`Publisher`]
//! (the own offer) and [`LeaseRpcs`] (the lease stream).

use std::sync::Arc;

use futures::StreamExt;
use gridlease_protocol::{NodeKey, PeerId, class};
use libp2p::gossipsub;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, Swarm, identify, kad, mdns, relay};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::behaviour::{Behaviour, BehaviourEvent};
use super::book_sync::{BookSyncs, SyncDeps};
use super::classes::Classes;
use super::client::Command;
use super::ingest::Ingest;
use super::lease_rpc::LeaseRpcs;
use super::loop_ctx::LoopCtx;
use super::own_offer::{Publisher, WITHDRAWAL_DRAIN};
use super::provider::ProviderState;
use super::reach::Reach;
use super::reputation::{Reputation, graylisted};
use super::timers::{Tick, Timers};
use super::{BuildError, NetworkEvent, NodeConfig, gossip};
use crate::store::StoreHandle;

/// Most peers recorded per identify round in the store, and dialed from it at start.
pub(super) const STORED_PEERS: usize = 16;

/// The network loop: the swarm, the shared context, the children, and dispatch.
pub(super) struct EventLoop {
    swarm: Swarm<Behaviour>,
    /// Key, settings, store, book, event channel.
    ctx: LoopCtx,
    commands: mpsc::Receiver<Command>,
    cancel: CancellationToken,
    /// Addresses, relays, NAT, connections, liveness.
    reach: Reach,
    /// Followed classes, DHT records and lookups, searches.
    classes: Classes,
    /// Offer verification and admission.
    ingest: Ingest,
    /// Completion records.
    reputation: Reputation,
    /// Book syncs, run and answered.
    sync: BookSyncs,
    /// The own offer.
    own: Publisher,
    /// The lease stream.
    lease: LeaseRpcs,
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
        Self {
            reach: Reach::new(config.gossip_grace, &config.bootstrap),
            classes: Classes::new(&config, followed_tx),
            ingest: Ingest::new(&config),
            reputation: Reputation::new(completions, gossip::completion_topic(&config.network)),
            sync: BookSyncs::new(sync_bytes),
            own: Publisher::new(provider, config.provider_rate),
            lease: LeaseRpcs::default(),
            swarm,
            ctx: LoopCtx {
                key,
                config,
                store,
                book,
                events,
            },
            commands,
            cancel,
        }
    }

    /// The book-sync child, and the rest it needs.
    fn sync_parts(&mut self) -> (&mut BookSyncs, SyncDeps<'_>) {
        let deps = SyncDeps {
            swarm: &mut self.swarm,
            ctx: &self.ctx,
            classes: &mut self.classes,
            ingest: &mut self.ingest,
            reputation: &mut self.reputation,
        };
        (&mut self.sync, deps)
    }

    /// Binds the listen addresses, registers external addresses and dials bootstrap peers.
    pub(super) fn start_listening(&mut self) -> Result<(), BuildError> {
        let config = &self.ctx.config;
        for addr in config.listen.clone() {
            self.swarm
                .listen_on(addr.clone())
                .map_err(|e| BuildError::Listen {
                    addr,
                    detail: e.to_string(),
                })?;
        }
        for addr in config.external_addrs.clone() {
            self.swarm.add_external_address(addr);
        }
        if config.relay_server && config.external_addrs.is_empty() {
            tracing::info!(
                "relay server without --external-addr: its listen addresses count as external"
            );
        }
        for addr in config.bootstrap.clone() {
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

    /// Runs until cancelled (or every client is gone); then withdraws the own offer and
    /// flushes the admitted offers.
    pub(super) async fn run(mut self) {
        let mut timers = Timers::new(&self.ctx.config);
        loop {
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => break,
                Some(done) = self.lease.tasks.join_next(), if !self.lease.tasks.is_empty() => match done {
                    Ok(done) => self.lease.on_answered(&mut self.swarm, &self.ctx, done),
                    Err(e) => tracing::error!(error = %e, "lease request task failed"),
                },
                cmd = self.commands.recv() => match cmd {
                    Some(cmd) => self.on_command(cmd),
                    None => break,
                },
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                tick = timers.next() => self.on_tick(tick),
            }
        }
        // Tell the others this node's offer is gone; give the connections, if any, a moment
        // to send it.
        let every = self.classes.topic.clone();
        let withdrawn = self
            .own
            .withdraw(&mut self.swarm, &self.ctx, &every, self.ctx.now());
        if withdrawn && self.swarm.connected_peers().next().is_some() {
            let swarm = &mut self.swarm;
            let _ = tokio::time::timeout(WITHDRAWAL_DRAIN, async {
                loop {
                    let _ = swarm.select_next_some().await;
                }
            })
            .await;
        }
        self.ingest.flush(&self.ctx, self.ctx.now());
        tracing::info!("network loop stopped");
    }

    /// A timer's tick goes to the child whose work it is.
    fn on_tick(&mut self, tick: Tick) {
        match tick {
            Tick::Announce => self.announce(),
            Tick::Rescore => self.reputation.rescore(&self.ctx),
            Tick::Republish => {
                self.reputation.republish(&mut self.swarm);
                let (sync, mut d) = self.sync_parts();
                sync.completion_anti_entropy(&mut d);
            }
            Tick::Resync => {
                let (sync, mut d) = self.sync_parts();
                sync.offer_anti_entropy(&mut d);
            }
            Tick::Flush => self.ingest.flush(&self.ctx, self.ctx.now()),
            Tick::KadWalk => {
                // Random walk to keep the routing table fresh; no known peers is fine.
                let _ = self.swarm.behaviour_mut().kad.bootstrap();
            }
            Tick::Live => {
                let now = self.ctx.instant();
                let grace = self.ctx.config.gossip_grace;
                self.reach.check_liveness(&mut self.swarm, grace, now);
                self.reach.retire_relayed(&mut self.swarm, now);
                if self.own.provider.resign {
                    // A capacity re-sign waiting for the pace.
                    self.refresh_own(false);
                }
            }
        }
    }

    /// Re-signs the own offer when due and publishes it (always with `publish`).
    fn refresh_own(&mut self, publish: bool) {
        self.own.refresh(
            &mut self.swarm,
            &self.ctx,
            &mut self.classes,
            &self.reach.listen_addrs,
            publish,
            self.ctx.now(),
        );
    }

    /// One announce round: sweeps expired offers from the book and re-signs the own offer
    /// when it is missing, close to expiry or out of date, publishing it then. An unchanged
    /// offer is not published again: nodes that missed it get it by book sync, on connecting
    /// and from the anti-entropy round (`offer_anti_entropy`); once more only when its last
    /// publication found no subscribed peer (`publish_pending`, done when one subscribes).
    fn announce(&mut self) {
        let now = self.ctx.now();
        self.ctx.book.update(|b| b.evict_expired(now));
        self.ingest.sweep(&self.ctx);
        self.refresh_own(false);
        let instant = self.ctx.instant();
        self.classes
            .unfollow_idle(&mut self.swarm, &self.ctx, instant);
        self.provide_classes();
        self.classes.find_class_peers(&mut self.swarm, instant);
    }

    /// DHT provider records for the followed classes and the own offer's.
    fn provide_classes(&mut self) {
        let own = self
            .own
            .provider
            .current
            .as_ref()
            .map(|o| class::offer_class(&o.offer));
        self.classes
            .provide_classes(&mut self.swarm, own, self.ctx.instant());
    }

    // ---- commands ------------------------------------------------------------------------

    /// A client's command, answered on its reply channel.
    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::ListenAddrs(reply) => self.reach.listen_addrs(reply),
            Command::Dial(addr, reply) => {
                let _ = reply.send(self.swarm.dial(addr).map_err(super::NetError::from));
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
                let _ = reply.send(self.classes.mesh_peers(&self.swarm));
            }
            Command::PeerScore(peer, reply) => {
                let _ = reply.send(self.swarm.behaviour().gossipsub.peer_score(&peer));
            }
            Command::AddCompletion(pair, reply) => {
                let r = self
                    .reputation
                    .add(&mut self.swarm, &self.ctx, pair, self.ctx.now());
                let _ = reply.send(r.map_err(super::NetError::from));
            }
            Command::GossipStats(reply) => {
                let _ = reply.send(self.ingest.stats());
            }
            Command::Restore(batch, reply) => {
                let _ = reply.send(self.restore(batch));
            }
            Command::RestoreDone => {
                let (sync, mut d) = self.sync_parts();
                sync.restore_done(&mut d);
            }
            Command::SyncStats(reply) => {
                let _ = reply.send(self.sync.stats());
            }
            Command::SearchClass(class, reply) => self.search_class(class, reply),
            Command::PublishRaw(on, bytes, reply) => {
                let topic = self.classes.raw_topic(on);
                let r = self.swarm.behaviour_mut().gossipsub.publish(topic, bytes);
                let _ = reply.send(r.map(|_| ()).map_err(super::NetError::from));
            }
            Command::LeaseRpc {
                peer,
                addrs,
                rpc,
                reply,
            } => {
                let listen = &self.reach.listen_addrs;
                self.lease
                    .send(&mut self.swarm, listen, peer, addrs, rpc, reply);
            }
            Command::SetLeaseHandler(tx, reply) => {
                self.lease.set_handler(tx);
                let _ = reply.send(());
            }
            Command::Reachability(reply) => {
                let observed = &self.reach.observed;
                let _ = reply.send(super::client::Reachability {
                    nat_status: observed.status(),
                    reachable: observed.reachable(),
                    unreachable: observed.unreachable(),
                    external: self.swarm.external_addresses().cloned().collect(),
                    relays: self.reach.reserved.clone(),
                });
            }
            Command::Connections(peer, reply) => {
                let _ = reply.send(self.reach.connections.of(&peer));
            }
            cmd => self.on_own_offer_command(cmd),
        }
    }

    /// The commands about the own offer.
    fn on_own_offer_command(&mut self, cmd: Command) {
        match cmd {
            Command::SetOffer(template, reply) => {
                if template.is_none() {
                    // Also takes the offer out of the own book.
                    let every = self.classes.topic.clone();
                    self.own
                        .withdraw(&mut self.swarm, &self.ctx, &every, self.ctx.now());
                }
                self.own.provider.template = template;
                self.own.provider.current = None;
                if self.own.provider.template.is_some() {
                    self.announce();
                }
                let _ = reply.send(self.own.provider.current.clone());
            }
            Command::SetFree(free, kept_gib, reply) => {
                // Re-signed and announced at once when the count changes.
                if self.own.set_free(free, kept_gib) {
                    self.announce();
                }
                let _ = reply.send(());
            }
            Command::OwnOffer(reply) => {
                let _ = reply.send(self.own.provider.current.clone());
            }
            Command::Announce(reply) => {
                self.announce();
                let _ = reply.send(());
            }
            other => tracing::error!(command = ?other, "command not routed"),
        }
    }

    /// Stored offers, already verified (off the loop), for the book: not persisted again nor
    /// announced as learned; only those of the classes followed now (the node may have
    /// followed others before). Returns how many were admitted.
    fn restore(&mut self, batch: Vec<super::restore::Restored>) -> usize {
        let followed = self.classes.followed_classes();
        self.ctx.book.update(|b| {
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
        })
    }

    /// A search names `class`: the classes child follows it and names the peers to fetch its
    /// offers from; the book-sync child fetches them.
    fn search_class(&mut self, class: String, reply: oneshot::Sender<()>) {
        let now = self.ctx.instant();
        let Some(start) = self
            .classes
            .begin_search(&mut self.swarm, &self.ctx, class, reply, now)
        else {
            return;
        };
        let (sync, mut d) = self.sync_parts();
        for peer in &start.asked {
            sync.fetch_class_from(&mut d, &start.class, *peer);
        }
        self.classes.finish_search(&mut self.swarm, start, now);
    }

    // ---- swarm events ----------------------------------------------------------------------

    /// The one place where swarm events become node events.
    fn on_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        match event {
            SwarmEvent::NewListenAddr { address, .. } => {
                self.reach
                    .new_listen_addr(&mut self.swarm, &self.ctx, address)
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                num_established,
                endpoint,
                ..
            } => {
                self.reach
                    .established(peer_id, connection_id, &endpoint, self.ctx.instant());
                if num_established.get() == 1 {
                    self.reach.liveness.connected(&peer_id);
                    self.ctx.emit(NetworkEvent::PeerConnected { peer: peer_id });
                    let (sync, mut d) = self.sync_parts();
                    sync.start_sync(&mut d, peer_id);
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established,
                ..
            } if num_established > 0 => {
                self.reach.connections.closed(&peer_id, connection_id);
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                ..
            } => self.on_disconnected(peer_id, connection_id),
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                if let Some(peer) = peer_id {
                    self.reach.liveness.lost(&peer, self.ctx.instant());
                    if !self.swarm.is_connected(&peer) {
                        self.classes.searched.peer_gone(&peer);
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
                self.reach.expired_listen_addr(me, address);
            }
            SwarmEvent::ListenerClosed {
                listener_id,
                reason,
                ..
            } => self.reach.listener_closed(listener_id, &reason),
            SwarmEvent::Behaviour(event) => self.on_behaviour_event(event),
            _ => {}
        }
    }

    /// The last connection to a peer closed.
    fn on_disconnected(&mut self, peer: PeerId, id: libp2p::swarm::ConnectionId) {
        self.reach.disconnected(&peer, id, self.ctx.instant());
        self.classes.searched.peer_gone(&peer);
        #[cfg(feature = "faults")]
        if self.ctx.config.faults.subscribe_after_first_disconnect {
            // Test fault: gossip starts working after the first reconnection.
            self.ctx.config.faults.subscribe_after_first_disconnect = false;
            self.classes
                .subscribe_late(&mut self.swarm, &self.ctx.config);
        }
        self.ctx.emit(NetworkEvent::PeerDisconnected { peer });
    }

    /// A behaviour's event, to the child whose protocol it is.
    fn on_behaviour_event(&mut self, event: BehaviourEvent) {
        match event {
            BehaviourEvent::Gossipsub(e) => self.on_gossip(e),
            BehaviourEvent::Lease(e) => {
                let own = self.own.provider.current.as_ref();
                let listen = &self.reach.listen_addrs;
                self.lease
                    .on_event(&mut self.swarm, &self.ctx, &mut self.ingest, own, listen, e);
            }
            BehaviourEvent::Book(e) => {
                let (sync, mut d) = self.sync_parts();
                sync.on_event(&mut d, e);
            }
            BehaviourEvent::Identify(identify::Event::Received { peer_id, info, .. }) => {
                self.reach.on_identify(
                    &mut self.swarm,
                    &self.ctx,
                    peer_id,
                    info,
                    self.ctx.instant(),
                );
            }
            BehaviourEvent::Mdns(mdns::Event::Discovered(found)) => {
                for (peer, addr) in found {
                    if !self.swarm.is_connected(&peer) {
                        self.swarm.add_peer_address(peer, addr.clone());
                        let _ = self.swarm.dial(addr);
                    }
                }
            }
            BehaviourEvent::RelayClient(relay::client::Event::ReservationReqAccepted {
                relay_peer_id,
                ..
            }) => self.reach.reservation_accepted(&self.ctx, relay_peer_id),
            BehaviourEvent::AutonatClient(e) => self.reach.on_autonat(&self.ctx, e),
            BehaviourEvent::Dcutr(e) => super::reach::on_dcutr(&self.ctx, e),
            BehaviourEvent::Kad(e) => self.on_kad(e),
            _ => {}
        }
    }

    /// A DHT event: class lookups and provider record puts go to the classes child; the
    /// peers a lookup names for a waiting search are fetched from.
    fn on_kad(&mut self, event: kad::Event) {
        match event {
            kad::Event::OutboundQueryProgressed {
                id, result, step, ..
            } if self.classes.is_lookup(&id) => {
                let found =
                    self.classes
                        .on_lookup_progress(&mut self.swarm, &self.ctx, id, &result, &step);
                if let Some((class, peers)) = found {
                    let (sync, mut d) = self.sync_parts();
                    for peer in peers {
                        sync.fetch_class_from(&mut d, &class, peer);
                    }
                }
            }
            kad::Event::OutboundQueryProgressed {
                id,
                result: kad::QueryResult::StartProviding(result),
                ..
            } => self.classes.on_put_result(&self.ctx, id, result),
            kad::Event::RoutingUpdated { peer, .. } => {
                tracing::trace!(%peer, "kad routing updated");
            }
            _ => {}
        }
    }

    /// A gossip event: completion batches to the reputation child, offers to the ingest
    /// child (their validation reported to gossipsub), subscriptions to liveness and the
    /// own offer's pending publication.
    fn on_gossip(&mut self, event: gossipsub::Event) {
        match event {
            gossipsub::Event::Message {
                propagation_source: from,
                message_id,
                message,
            } => {
                let now = self.ctx.now();
                let score = self.swarm.behaviour().gossipsub.peer_score(&from);
                let acceptance = if self.reputation.is_topic(&message.topic) {
                    if graylisted(score) || !self.ingest.allow_peer(&from, now) {
                        gossipsub::MessageAcceptance::Ignore
                    } else {
                        self.reputation
                            .on_batch(&self.ctx, &from, &message.data, now)
                    }
                } else {
                    self.ingest
                        .on_offer(&self.ctx, from, &message.data, &message.topic, score, now)
                };
                self.swarm
                    .behaviour_mut()
                    .gossipsub
                    .report_message_validation_result(&message_id, &from, acceptance);
            }
            gossipsub::Event::Subscribed { peer_id, topic }
                if gossip::offer_topic_class(&self.ctx.config.network, &topic).is_some() =>
            {
                self.reach.liveness.subscribed(&peer_id);
                self.ctx
                    .emit(NetworkEvent::PeerSubscribed { peer: peer_id });
                if self.own.publish_pending {
                    // The own offer's last publication reached nobody.
                    self.refresh_own(true);
                }
            }
            gossipsub::Event::GossipsubNotSupported { peer_id }
                if self.reach.liveness.is_waiting(&peer_id) =>
            {
                // A gridlease node whose gossip stream was refused: a new connection retries.
                tracing::info!(peer = %peer_id, "gossip with this gridlease peer was refused; disconnecting so it starts on a new connection");
                let _ = self.swarm.disconnect_peer_id(peer_id);
            }
            _ => {}
        }
    }
}
