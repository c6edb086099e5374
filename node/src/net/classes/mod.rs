//! The network loop's class-following child ([`Classes`]): the offer topics this node
//! subscribes to, the GPU classes they name (published to the clients), the DHT provider
//! records it puts for its classes and the lookups of a followed class's nodes, and the
//! classes followed for a while because a search named them (`docs/protocol.md` 3c).
//! Methods take the swarm and the time as parameters; the book syncs a search asks for are
//! the router's to start (this child names the peers).

pub(in crate::net) mod searched;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use gridlease_protocol::{NetworkId, Offer, PeerId, class};
use libp2p::gossipsub::IdentTopic;
use libp2p::{Swarm, kad};
use tokio::sync::{oneshot, watch};

use super::behaviour::Behaviour;
use super::client::RawTopic;
use super::gossip;
use super::loop_ctx::LoopCtx;
use super::{Followed, NetworkEvent, NodeConfig};
use searched::SearchedClasses;

/// Most nodes of a class one DHT lookup dials.
pub(in crate::net) const CLASS_DIALS: usize = 3;

/// Which GPU classes this node follows, and how it finds their nodes.
pub(in crate::net) struct Classes {
    /// The network (topic names and DHT keys carry it).
    network: NetworkId,
    /// The node follows some classes only (`NodeConfig::follow` is set).
    follows_some: bool,
    /// How long a provider record put or a lookup done counts (`NodeConfig::offer_resync`).
    every: Duration,
    /// The topic of every offer: every provider publishes on it (and on its class's topic);
    /// nodes that follow every class subscribe to it.
    pub(in crate::net) topic: IdentTopic,
    /// The offer topics this node subscribes to: [`Self::topic`] when it follows every class,
    /// else the followed classes' topics and its own offer's class's (`docs/protocol.md` 3c).
    pub(in crate::net) offer_topics: Vec<IdentTopic>,
    /// GPU classes this node put a DHT provider record for (`class_key`), and when: put
    /// again each `offer_resync` (kad's own republication is every 12 h, and nodes holding
    /// the record come and go).
    provided: HashMap<String, Instant>,
    /// Provider records being put, by query: a put that fails is tried again at the next
    /// announce round.
    class_puts: HashMap<kad::QueryId, String>,
    /// DHT lookups of a followed class's nodes under way, by query.
    class_lookups: HashMap<kad::QueryId, String>,
    /// When each followed class was last looked up (again after `offer_resync` at the
    /// soonest: a class's nodes may be connected without subscribing to its topic, a
    /// provider that follows every class).
    looked_up: HashMap<String, Instant>,
    /// Classes followed because a search named them, and the fetches of their offers.
    pub(in crate::net) searched: SearchedClasses,
    /// The classes the book holds (`None`: every class), from [`Self::offer_topics`]; kept
    /// here and published to the clients ([`crate::net::Client::followed`]) when they change.
    followed: Option<Vec<String>>,
    followed_tx: watch::Sender<Option<Followed>>,
}

/// A search that follows a class now: the peers whose offers of it to fetch, then
/// [`Classes::finish_search`].
pub(in crate::net) struct SearchStart {
    /// The class searched.
    pub(in crate::net) class: String,
    /// Connected peers to fetch the class's offers from.
    pub(in crate::net) asked: Vec<PeerId>,
    /// No connected peer is known to hold the class: the DHT is asked too.
    holders_unknown: bool,
    /// Answered once the fetch ends.
    reply: oneshot::Sender<()>,
}

/// Whether the DHT's routing table holds anybody to ask.
pub(in crate::net) fn dht_has_peers(swarm: &mut Swarm<Behaviour>) -> bool {
    swarm
        .behaviour_mut()
        .kad
        .kbuckets()
        .any(|b| b.num_entries() > 0)
}

impl Classes {
    /// The classes `config` follows (subscriptions already made by the behaviour, unless a
    /// test fault holds them back); publishes them on `followed_tx`.
    pub(in crate::net) fn new(
        config: &NodeConfig,
        followed_tx: watch::Sender<Option<Followed>>,
    ) -> Self {
        let mut c = Self {
            network: config.network.clone(),
            follows_some: config.follow.is_some(),
            every: config.offer_resync,
            topic: gossip::offer_topic(&config.network),
            offer_topics: if config.subscribes_late() {
                Vec::new()
            } else {
                gossip::followed_topics(&config.network, config.follow.as_deref())
            },
            provided: HashMap::new(),
            class_puts: HashMap::new(),
            class_lookups: HashMap::new(),
            looked_up: HashMap::new(),
            searched: SearchedClasses::new(config.search_follow),
            followed: None,
            followed_tx,
        };
        c.topics_changed();
        c
    }

    /// The GPU classes whose offers this node's book holds: `None` for every class, else the
    /// followed ones and the own offer's.
    pub(in crate::net) fn followed_classes(&self) -> Option<Vec<String>> {
        self.followed.clone()
    }

    /// Whether this node's book takes an offer of `class`.
    pub(in crate::net) fn follows(&self, class: &str) -> bool {
        let topic = gossip::class_topic(&self.network, class).hash();
        !self.follows_some || self.offer_topics.iter().any(|t| t.hash() == topic)
    }

    /// Recomputes the followed classes after [`Self::offer_topics`] changed, and publishes
    /// them to the clients.
    fn topics_changed(&mut self) {
        self.followed = self.follows_some.then(|| {
            self.offer_topics
                .iter()
                .filter_map(|t| {
                    let hash = t.hash();
                    gossip::offer_topic_class(&self.network, &hash)
                        .flatten()
                        .map(str::to_string)
                })
                .collect()
        });
        let view = self.followed.as_ref().map(|classes| Followed {
            classes: classes.clone(),
            searched: {
                let mut s: Vec<String> = self.searched.names().map(str::to_string).collect();
                s.sort();
                s
            },
        });
        self.followed_tx.send_replace(view);
    }

    /// The topic a raw publication goes to ([`crate::net::Client::publish_raw_on`]).
    pub(in crate::net) fn raw_topic(&self, on: RawTopic) -> IdentTopic {
        match on {
            // Every offer's by default.
            RawTopic::Followed => self.offer_topics.first().unwrap_or(&self.topic).clone(),
            RawTopic::Every => self.topic.clone(),
            RawTopic::Class(c) => gossip::class_topic(&self.network, &c),
        }
    }

    /// Every offer topic's mesh, each peer once.
    pub(in crate::net) fn mesh_peers(&self, swarm: &Swarm<Behaviour>) -> Vec<PeerId> {
        let gs = &swarm.behaviour().gossipsub;
        let mut peers: Vec<PeerId> = Vec::new();
        for t in &self.offer_topics {
            peers.extend(gs.mesh_peers(&t.hash()).copied());
        }
        peers.sort();
        peers.dedup();
        peers
    }

    /// Test fault (`NetFaults::subscribe_after_first_disconnect`): the offer topics are
    /// subscribed now, after the first disconnection.
    #[cfg(feature = "faults")]
    pub(in crate::net) fn subscribe_late(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        config: &NodeConfig,
    ) {
        for topic in gossip::followed_topics(&config.network, config.follow.as_deref()) {
            let gs = &mut swarm.behaviour_mut().gossipsub;
            if gossip::subscribe_offers(gs, &topic).is_ok() {
                self.offer_topics.push(topic);
            }
        }
        self.topics_changed();
    }

    /// Puts a DHT provider record under the key of each class whose offers this node follows
    /// or serves (`docs/protocol.md` 3c step 4; `own`: the own offer's class), once it has a
    /// confirmed external address: a record holds the addresses others will dial (kad sends
    /// the confirmed external ones), so a node without any puts none. A node behind a NAT
    /// has its relay reservation's address (libp2p-relay confirms it): those who find it
    /// come through the relay, and DCUtR may then punch a direct path.
    pub(in crate::net) fn provide_classes(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        own: Option<String>,
        now: Instant,
    ) {
        let reachable = swarm.external_addresses().next().is_some();
        // A record put with no DHT peer known stays local until kad republishes it.
        if !reachable || !dht_has_peers(swarm) {
            return;
        }
        // Not those followed for a search only: the node leaves them when no search names
        // them for a while, and a record lives 48 h.
        let mut classes = self.classes_to_provide();
        classes.extend(own);
        for c in classes {
            if self
                .provided
                .get(&c)
                .is_some_and(|at| now.duration_since(*at) < self.every)
            {
                continue;
            }
            let key = gossip::class_key(&self.network, &c);
            match swarm.behaviour_mut().kad.start_providing(key) {
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

    /// The followed classes, less those followed for a search only.
    fn classes_to_provide(&self) -> Vec<String> {
        self.followed_classes()
            .unwrap_or_default()
            .into_iter()
            .filter(|c| !self.searched.contains(c))
            .collect()
    }

    /// The outcome of a provider record put.
    pub(in crate::net) fn on_put_result(
        &mut self,
        ctx: &LoopCtx,
        id: kad::QueryId,
        result: kad::AddProviderResult,
    ) {
        let Some(class) = self.class_puts.remove(&id) else {
            return;
        };
        match result {
            Ok(_) => {
                tracing::debug!(%class, "provider record for the GPU class stored in the DHT");
                ctx.emit(NetworkEvent::ClassRecordPut { class });
            }
            Err(e) => {
                tracing::info!(%class, error = %e, "the GPU class's provider record was not stored in the DHT (tried again at the next announce round)");
                self.provided.remove(&class);
            }
        }
    }

    /// For each followed class no connected peer subscribes to, looks up the class's nodes in
    /// the DHT (one lookup per class at a time); the nodes found are dialed
    /// ([`Self::on_class_providers`]), and the connection's book sync and gossip subscriptions
    /// do the rest.
    pub(in crate::net) fn find_class_peers(&mut self, swarm: &mut Swarm<Behaviour>, now: Instant) {
        let Some(classes) = self.followed_classes() else {
            return;
        };
        // Nobody to ask yet (the bootstrap connections are not up).
        if !dht_has_peers(swarm) {
            return;
        }
        for c in classes {
            if !self.due_for_lookup(&c, now) {
                continue;
            }
            let topic = gossip::class_topic(&self.network, &c).hash();
            let heard = swarm
                .behaviour()
                .gossipsub
                .all_peers()
                .any(|(_, topics)| topics.contains(&&topic));
            if heard {
                continue;
            }
            tracing::debug!(class = %c, "looking up the GPU class's nodes in the DHT");
            self.lookup_class(swarm, c, now);
        }
    }

    /// Whether `class` may be looked up at `now`: not within `offer_resync` of the last
    /// lookup, and none under way.
    fn due_for_lookup(&self, class: &str, now: Instant) -> bool {
        let recent = self
            .looked_up
            .get(class)
            .is_some_and(|at| now.duration_since(*at) < self.every);
        !recent && !self.class_lookups.values().any(|l| l == class)
    }

    /// Starts a DHT lookup of the nodes that put a provider record for `class`; the answer
    /// comes to [`Self::on_class_providers`].
    fn lookup_class(&mut self, swarm: &mut Swarm<Behaviour>, class: String, now: Instant) {
        let key = gossip::class_key(&self.network, &class);
        let query = swarm.behaviour_mut().kad.get_providers(key);
        self.looked_up.insert(class.clone(), now);
        self.class_lookups.insert(query, class);
    }

    /// Whether `id` is one of this child's class lookups.
    pub(in crate::net) fn is_lookup(&self, id: &kad::QueryId) -> bool {
        self.class_lookups.contains_key(id)
    }

    /// A class lookup progressed: the nodes found are handled ([`Self::on_class_providers`];
    /// its peers to fetch from are returned), and its last step ends the lookup.
    pub(in crate::net) fn on_lookup_progress(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        id: kad::QueryId,
        result: &kad::QueryResult,
        step: &kad::ProgressStep,
    ) -> Option<(String, Vec<PeerId>)> {
        let mut fetch = None;
        if let kad::QueryResult::GetProviders(Ok(kad::GetProvidersOk::FoundProviders {
            providers,
            ..
        })) = result
            && let Some(class) = self.class_lookups.get(&id).cloned()
        {
            let peers = self.on_class_providers(swarm, ctx, &class, providers);
            fetch = Some((class, peers));
        }
        if step.last
            && let Some(class) = self.class_lookups.remove(&id)
        {
            // A search waiting for the class's fetch waits for the lookup no more (but
            // for the syncs with the nodes it found).
            self.searched.looking_up(&class, false);
            let found = matches!(
                result,
                kad::QueryResult::GetProviders(Ok(kad::GetProvidersOk::FoundProviders { .. }))
            );
            if step.count.get() == 1 && !found {
                // Found nobody: asked again at the next announce round, not after
                // `offer_resync`.
                self.looked_up.remove(&class);
            }
        }
        fetch
    }

    /// Nodes of a followed class found in the DHT: dials up to [`CLASS_DIALS`] of them this
    /// node is not connected to (kad supplies their addresses from the lookup). Returns the
    /// connected ones to fetch the class's offers from now, when a search waits for it.
    fn on_class_providers(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        class: &str,
        providers: &HashSet<PeerId>,
    ) -> Vec<PeerId> {
        let me = *swarm.local_peer_id();
        let found: Vec<PeerId> = providers.iter().filter(|p| **p != me).copied().collect();
        if found.is_empty() {
            return Vec::new();
        }
        let fresh: Vec<PeerId> = found
            .iter()
            .filter(|p| !swarm.is_connected(p))
            .take(CLASS_DIALS)
            .copied()
            .collect();
        // A search waits for this class: connected nodes of it are synced now.
        let connected: Vec<PeerId> = if self.searched.contains(class) {
            found
                .iter()
                .filter(|p| swarm.is_connected(p))
                .take(CLASS_DIALS)
                .copied()
                .collect()
        } else {
            Vec::new()
        };
        ctx.emit(NetworkEvent::ClassNodesFound {
            class: class.to_string(),
            peers: found,
        });
        for peer in fresh {
            tracing::info!(%class, %peer, "dialing a node of a followed GPU class found in the DHT");
            let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
                .condition(libp2p::swarm::dial_opts::PeerCondition::DisconnectedAndNotDialing)
                .build();
            if swarm.dial(opts).is_ok() {
                // Its connection's sync fetches the class (a followed one).
                self.searched.fetching_from(class, peer);
            } else {
                tracing::debug!(%peer, "node of the class not dialed");
            }
        }
        connected
    }

    /// A search names `class` ([`crate::net::client::Command::SearchClass`];
    /// `docs/protocol.md` 3c step 4). On a node that follows only some classes and not this
    /// one: follows it (subscribes to its topic; the least recently searched class makes
    /// room when the followed classes are at their limit) and returns the connected peers
    /// (up to [`CLASS_DIALS`]) that hold its offers (on its topic or on the topic of every
    /// offer; the first connected peers when none is known) for the router to fetch from,
    /// then [`Self::finish_search`]. Else `reply` is answered or waits here, and `None`
    /// comes back. A class followed for a search already stays followed longer, and the
    /// search waits for a fetch under way.
    pub(in crate::net) fn begin_search(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        class: String,
        reply: oneshot::Sender<()>,
        now: Instant,
    ) -> Option<SearchStart> {
        if !self.follows_some || !class::is_class(&class) {
            let _ = reply.send(());
            return None;
        }
        if self.searched.touch(&class, now) {
            self.searched.wait(&class, reply);
            return None;
        }
        if self.follows(&class) {
            let _ = reply.send(());
            return None;
        }
        if self.offer_topics.len() >= class::MAX_FOLLOWED_CLASSES {
            match self.searched.least_recent() {
                Some(old) => self.unfollow_searched(swarm, ctx, &old),
                None => {
                    tracing::info!(%class, "a search names a GPU class this node cannot follow too (it follows the most it may)");
                    let _ = reply.send(());
                    return None;
                }
            }
        }
        let topic = gossip::class_topic(&self.network, &class);
        if let Err(e) = gossip::subscribe_offers(&mut swarm.behaviour_mut().gossipsub, &topic) {
            tracing::warn!(%class, error = %e, "cannot follow the GPU class a search names");
            let _ = reply.send(());
            return None;
        }
        tracing::info!(%class, "following a GPU class a search names, and fetching its offers");
        self.offer_topics.push(topic);
        self.searched.start(&class, now);
        self.topics_changed();
        let holders = self.holders(swarm, &class);
        // None known (a peer's subscriptions may not have arrived yet): the first connected
        // peers are asked anyway (a peer without the class answers empty digests), and the
        // DHT too.
        let asked: Vec<PeerId> = if holders.is_empty() {
            let mut peers: Vec<PeerId> = swarm.connected_peers().copied().collect();
            peers.sort();
            peers.truncate(CLASS_DIALS);
            peers
        } else {
            holders.clone()
        };
        Some(SearchStart {
            class,
            asked,
            holders_unknown: holders.is_empty(),
            reply,
        })
    }

    /// Connected peers that hold `class`'s offers: on its topic, or following every class.
    fn holders(&self, swarm: &Swarm<Behaviour>, class: &str) -> Vec<PeerId> {
        let class_hash = gossip::class_topic(&self.network, class).hash();
        let every = self.topic.hash();
        swarm
            .behaviour()
            .gossipsub
            .all_peers()
            .filter(|(_, topics)| topics.contains(&&class_hash) || topics.contains(&&every))
            .map(|(p, _)| *p)
            .take(CLASS_DIALS)
            .collect()
    }

    /// The rest of a search begun with [`Self::begin_search`], once its fetches started:
    /// looks the class's nodes up in the DHT when no holder is connected, and makes the
    /// search wait for what is under way (answered at once when there is nothing to wait
    /// for: the search reads the book as it is).
    pub(in crate::net) fn finish_search(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        start: SearchStart,
        now: Instant,
    ) {
        let SearchStart {
            class,
            holders_unknown,
            reply,
            ..
        } = start;
        if holders_unknown && dht_has_peers(swarm) {
            tracing::debug!(%class, "looking up the searched GPU class's nodes in the DHT");
            self.lookup_class(swarm, class.clone(), now);
            self.searched.looking_up(&class, true);
        }
        self.searched.wait(&class, reply);
    }

    /// Stops following the classes followed for a search that no search named for a while.
    pub(in crate::net) fn unfollow_idle(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        ctx: &LoopCtx,
        now: Instant,
    ) {
        for class in self.searched.idle(now) {
            self.unfollow_searched(swarm, ctx, &class);
        }
    }

    /// Stops following a class followed for a search: unsubscribes from its topic and drops
    /// its offers from the book (the store keeps them until they expire; a restore admits
    /// the followed classes only).
    fn unfollow_searched(&mut self, swarm: &mut Swarm<Behaviour>, ctx: &LoopCtx, class: &str) {
        let topic = gossip::class_topic(&self.network, class);
        swarm.behaviour_mut().gossipsub.unsubscribe(&topic);
        self.offer_topics.retain(|t| t.hash() != topic.hash());
        self.searched.remove(class);
        self.provided.remove(class);
        self.topics_changed();
        let dropped = ctx.book.update(|b| b.remove_class(class));
        tracing::info!(%class, dropped, "no longer following a GPU class no search named for a while");
    }

    /// A node that follows some classes also follows its own offer's: it subscribes to that
    /// class's topic when it first signs an offer of it (and never unsubscribes: its book may
    /// hold that class's offers now).
    pub(in crate::net) fn follow_own_class(&mut self, swarm: &mut Swarm<Behaviour>, offer: &Offer) {
        if !self.follows_some {
            return;
        }
        let own = class::offer_class(offer);
        if self.searched.contains(&own) {
            // Followed for a search until now: for good from here.
            self.searched.remove(&own);
            self.topics_changed();
            return;
        }
        let topic = gossip::class_topic(&self.network, &own);
        if self.offer_topics.iter().any(|t| t.hash() == topic.hash()) {
            return;
        }
        match gossip::subscribe_offers(&mut swarm.behaviour_mut().gossipsub, &topic) {
            Ok(()) => {
                tracing::info!(topic = %topic, "following the own offer's GPU class");
                self.offer_topics.push(topic);
                self.topics_changed();
            }
            Err(e) => tracing::warn!(error = %e, "cannot follow the own offer's GPU class"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(follow: Option<Vec<String>>) -> (Classes, watch::Receiver<Option<Followed>>) {
        let mut config = NodeConfig::new(NetworkId::new("classes-test").unwrap());
        config.follow = follow;
        config.offer_resync = Duration::from_secs(60);
        let (tx, rx) = watch::channel(None);
        (Classes::new(&config, tx), rx)
    }

    #[test]
    fn a_node_following_every_class_takes_any_and_publishes_none() {
        let (c, rx) = classes(None);
        assert!(c.follows("h100-80gb"));
        assert_eq!(c.followed_classes(), None);
        assert!(rx.borrow().is_none());
    }

    #[test]
    fn followed_classes_are_published_and_lookups_wait_for_the_resync_period() {
        let class = class::class_of_model("NVIDIA H100 80GB");
        let (mut c, rx) = classes(Some(vec![class.clone()]));
        assert!(c.follows(&class));
        assert!(!c.follows("other-class"));
        assert_eq!(c.followed_classes(), Some(vec![class.clone()]));
        assert_eq!(rx.borrow().as_ref().unwrap().classes, vec![class.clone()]);
        // Driven time: a class looked up at t0 is due again only after `offer_resync`.
        let t0 = Instant::now();
        assert!(c.due_for_lookup(&class, t0));
        c.looked_up.insert(class.clone(), t0);
        assert!(!c.due_for_lookup(&class, t0 + Duration::from_secs(59)));
        assert!(c.due_for_lookup(&class, t0 + Duration::from_secs(60)));
    }
}
