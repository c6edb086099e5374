//! The cloneable handle to the network actor (the renter's side of negotiation is
//! `lease::negotiate`; `net` carries its request with [`Client::lease_rpc`]).

use std::sync::Arc;

use gridlease_contracts::book::{BookEntry, Cursor};
use gridlease_contracts::query::Query;
use gridlease_protocol::{CodecError, NetworkId, NodeKey, OfferId, PeerId};
use libp2p::Multiaddr;
use tokio::sync::{mpsc, oneshot};

use super::codec::{LeaseRpc, LeaseRpcResponse};
use super::error::NetError;
use super::provider::{OfferTemplate, OwnOffer};
use super::shared_book::ReplacedOffer;
use crate::store::{StoreError, StoreHandle};

/// Offer gossip handled since the node started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GossipStats {
    /// Offers accepted (admitted or refreshed, and forwarded).
    pub accepted: u64,
    /// Offers rejected (the forwarding peer was penalised).
    pub rejected: u64,
    /// Offers dropped without penalty (rate limits, graylist, recent refresh, full book).
    pub ignored: u64,
    /// Offer signatures checked.
    pub signatures_checked: u64,
    /// Offers identical to one verified before, accepted without a signature check.
    pub signatures_skipped: u64,
}

/// Counters of book sync, since the node started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Syncs started.
    pub started: u64,
    /// Syncs that ended, finished or not (`started - ended` run now).
    pub ended: u64,
    /// Ids received in id pages.
    pub ids_received: u64,
    /// Offers received, verified and admitted.
    pub offers_admitted: u64,
    /// Offers received but rejected (the sync with that peer stops).
    pub offers_rejected: u64,
    /// Response bytes received (frames included).
    pub bytes_received: u64,
    /// Syncs that have compared the peer's bucket digests with the book's (on connecting and
    /// in anti-entropy rounds).
    pub digest_rounds: u64,
    /// Id buckets whose digests differed in those syncs.
    pub buckets_differing: u64,
    /// Of those syncs, the ones where so many buckets differed that the peer's ids were
    /// listed in whole pages instead of bucket by bucket.
    pub whole_listings: u64,
    /// Offers asked for in a sync that did not come back new: left out of the peer's answer
    /// (it no longer held them), stale when they came, or lost with a failed request. Each is
    /// asked for again from the next peer that lists it.
    pub asked_not_admitted: u64,
}

/// Most ids answered for an id prefix: two are enough to call it ambiguous.
const MAX_PREFIX_MATCHES: usize = 2;

/// Which offer topic [`Client::publish_raw_on`] publishes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawTopic {
    /// The first this node follows.
    Followed,
    /// The topic of every offer.
    Every,
    /// A GPU class's topic (`gridlease_protocol::class`).
    Class(String),
}

/// A request to the event loop. Every variant carries its reply channel.
#[derive(Debug)]
pub(crate) enum Command {
    ListenAddrs(oneshot::Sender<Vec<Multiaddr>>),
    Dial(Multiaddr, oneshot::Sender<Result<(), NetError>>),
    ConnectedPeers(oneshot::Sender<Vec<PeerId>>),
    MeshPeers(oneshot::Sender<Vec<PeerId>>),
    PeerScore(PeerId, oneshot::Sender<Option<f64>>),
    /// A co-signed completion of this node's lease: kept, persisted, published when this node
    /// was its provider; answers whether it was new.
    AddCompletion(
        gridlease_protocol::completion::CoSigned,
        oneshot::Sender<Result<bool, NetError>>,
    ),
    GossipStats(oneshot::Sender<GossipStats>),
    /// Stored offers, verified again, for the book (the restore after start); answers how
    /// many were admitted.
    Restore(Vec<super::restore::Restored>, oneshot::Sender<usize>),
    /// The restore has finished (or given up): book syncs may start.
    RestoreDone,
    SyncStats(oneshot::Sender<SyncStats>),
    SetOffer(Option<OfferTemplate>, oneshot::Sender<Option<OwnOffer>>),
    SetFree(u16, u64, oneshot::Sender<()>),
    OwnOffer(oneshot::Sender<Option<OwnOffer>>),
    /// A search names a GPU class: follow it for a while if it is not followed, and answer
    /// once its offers are fetched (`docs/protocol.md` 3c step 4).
    SearchClass(String, oneshot::Sender<()>),
    Announce(oneshot::Sender<()>),
    PublishRaw(RawTopic, Vec<u8>, oneshot::Sender<Result<(), NetError>>),
    LeaseRpc {
        peer: PeerId,
        addrs: Vec<Multiaddr>,
        rpc: LeaseRpc,
        reply: oneshot::Sender<Result<LeaseRpcResponse, NetError>>,
    },
    SetLeaseHandler(mpsc::Sender<super::InboundLease>, oneshot::Sender<()>),
    Reachability(oneshot::Sender<Reachability>),
    Connections(PeerId, oneshot::Sender<Vec<super::reach::Connection>>),
    /// Blocks (`true`: its connections closed, new ones refused) or unblocks a peer; answers
    /// whether that changed anything.
    Block(PeerId, bool, oneshot::Sender<bool>),
}

impl From<super::restore::RestoreStep> for Command {
    fn from(step: super::restore::RestoreStep) -> Self {
        match step {
            super::restore::RestoreStep::Batch(batch, reply) => Command::Restore(batch, reply),
            super::restore::RestoreStep::Done => Command::RestoreDone,
        }
    }
}

/// How this node is reached, as observed (see [`super::reach`]).
#[derive(Clone, Debug)]
pub struct Reachability {
    /// What AutoNAT v2 dial-backs found.
    pub nat_status: super::reach::NatStatus,
    /// Addresses an AutoNAT server dialed back.
    pub reachable: Vec<Multiaddr>,
    /// Addresses whose dial-back failed.
    pub unreachable: Vec<Multiaddr>,
    /// The swarm's confirmed external addresses (configured, AutoNAT-confirmed, and the
    /// relayed addresses of accepted reservations).
    pub external: Vec<Multiaddr>,
    /// Relays that accepted a reservation.
    pub relays: Vec<PeerId>,
}

/// Why a request to the network task failed (a negotiation's rejection is not a failure:
/// see [`crate::lease::NegotiationOutcome`]).
#[derive(Debug, thiserror::Error)]
pub enum NegotiationError {
    /// The request could not be delivered or answered.
    #[error("lease request to {peer} failed: {detail}")]
    Network {
        /// The provider.
        peer: PeerId,
        /// Why.
        detail: String,
    },
    /// The terms could not be encoded or signed.
    #[error("cannot sign the request: {0}")]
    Codec(#[from] CodecError),
    /// The lease could not be stored.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The network task has stopped.
    #[error("the network task has stopped")]
    Closed,
}

/// Handle to a running node's network task.
#[derive(Clone)]
pub struct Client {
    tx: mpsc::Sender<Command>,
    network: NetworkId,
    key: Arc<NodeKey>,
    store: StoreHandle,
    streams: libp2p_stream::Control,
    book: super::BookReader,
    restore: tokio::sync::watch::Receiver<super::RestoreProgress>,
    followed: tokio::sync::watch::Receiver<Option<Followed>>,
}

/// The GPU classes a node that follows only some holds in its book (the network loop
/// publishes them as they change).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Followed {
    /// Every class followed: configured, the own offer's, and those followed for a search.
    pub classes: Vec<String>,
    /// Of those, the ones followed for a search only, for a while (`NodeConfig::search_follow`).
    pub searched: Vec<String>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

impl Client {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        tx: mpsc::Sender<Command>,
        network: NetworkId,
        key: Arc<NodeKey>,
        store: StoreHandle,
        streams: libp2p_stream::Control,
        book: super::BookReader,
        restore: tokio::sync::watch::Receiver<super::RestoreProgress>,
        followed: tokio::sync::watch::Receiver<Option<Followed>>,
    ) -> Self {
        Self {
            tx,
            network,
            key,
            store,
            streams,
            book,
            restore,
            followed,
        }
    }

    /// How far the restore of the stored offers (after start) has got.
    pub fn restore_progress(&self) -> super::RestoreProgress {
        *self.restore.borrow()
    }

    /// Waits until the stored offers are restored (or the restore ended without finishing,
    /// when the node stopped), and says how far it got.
    pub async fn restored(&self) -> super::RestoreProgress {
        let mut rx = self.restore.clone();
        let done = rx.wait_for(|p| p.done).await.map(|p| *p);
        done.unwrap_or_else(|_| *rx.borrow())
    }

    /// The offer book, read off the event loop.
    pub fn book(&self) -> &super::BookReader {
        &self.book
    }

    /// Opens and accepts raw libp2p streams (interactive access): a handle to the swarm's
    /// stream behaviour, used outside the event loop.
    pub fn streams(&self) -> libp2p_stream::Control {
        self.streams.clone()
    }

    async fn ask<R>(
        &self,
        make: impl FnOnce(oneshot::Sender<R>) -> Command,
    ) -> Result<R, NegotiationError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| NegotiationError::Closed)?;
        rx.await.map_err(|_| NegotiationError::Closed)
    }

    /// This node's peer id.
    pub fn peer_id(&self) -> PeerId {
        self.key.peer_id()
    }

    /// This node's key (for signing requests).
    pub fn key(&self) -> &NodeKey {
        &self.key
    }

    /// The network.
    pub fn network(&self) -> &NetworkId {
        &self.network
    }

    /// The store.
    pub fn store(&self) -> &StoreHandle {
        &self.store
    }

    /// Listen addresses, with `/p2p/<id>`; waits until at least one is bound.
    pub async fn listen_addrs(&self) -> Result<Vec<Multiaddr>, NegotiationError> {
        self.ask(Command::ListenAddrs).await
    }

    /// Dials an address; resolves when the dial was started (connection events follow).
    pub async fn dial(&self, addr: Multiaddr) -> Result<Result<(), NetError>, NegotiationError> {
        self.ask(|r| Command::Dial(addr, r)).await
    }

    /// How this node is reached, as observed.
    pub async fn reachability(&self) -> Result<Reachability, NegotiationError> {
        self.ask(Command::Reachability).await
    }

    /// The open connections to `peer`.
    pub async fn connections(
        &self,
        peer: PeerId,
    ) -> Result<Vec<super::reach::Connection>, NegotiationError> {
        self.ask(|r| Command::Connections(peer, r)).await
    }

    /// Blocks `peer`: its connections are closed and new ones refused, until
    /// [`Client::unblock`]. The application decides who (`access` blocks peers that flood it).
    pub async fn block(&self, peer: PeerId) -> Result<bool, NegotiationError> {
        self.ask(|r| Command::Block(peer, true, r)).await
    }

    /// Lifts a [`Client::block`].
    pub async fn unblock(&self, peer: PeerId) -> Result<bool, NegotiationError> {
        self.ask(|r| Command::Block(peer, false, r)).await
    }

    /// Connected peers.
    pub async fn connected_peers(&self) -> Result<Vec<PeerId>, NegotiationError> {
        self.ask(Command::ConnectedPeers).await
    }

    /// Peers in our gossipsub mesh for the offer topic.
    pub async fn mesh_peers(&self) -> Result<Vec<PeerId>, NegotiationError> {
        self.ask(Command::MeshPeers).await
    }

    /// Gossipsub's score of a peer.
    pub async fn peer_score(&self, peer: PeerId) -> Result<Option<f64>, NegotiationError> {
        self.ask(|r| Command::PeerScore(peer, r)).await
    }

    /// Live offers matching `query`, in its order, at most `limit`.
    pub async fn search(
        &self,
        query: Query,
        limit: usize,
    ) -> Result<Vec<BookEntry>, NegotiationError> {
        Ok(self.search_page(query, limit, None).await?.0)
    }

    /// A page of a search: at most `limit` live offers matching `query` that sort after
    /// `after`, and the cursor of the next page when more match. The scan runs under the
    /// book's read lock, never on the event loop: on the calling worker thread, whose other
    /// tasks move to another thread meanwhile (`block_in_place`), or on a blocking thread
    /// on a single-threaded runtime. In place, an answer waits for no other thread: handing
    /// the scan to the blocking pool and back cost two thread wake-ups, each a wait for a
    /// core on a busy machine (`docs/benchmarks.md`, issue 19's scale harness).
    pub async fn search_page(
        &self,
        query: Query,
        limit: usize,
        after: Option<Cursor>,
    ) -> Result<(Vec<BookEntry>, Option<Cursor>), NegotiationError> {
        let book = self.book.clone();
        let scan = move || book.search(&query, super::now(), limit, after.as_ref());
        if tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::MultiThread
        {
            return Ok(tokio::task::block_in_place(scan));
        }
        tokio::task::spawn_blocking(scan)
            .await
            // Only a panic in the scan (a bug) or a runtime shutting down fails the join.
            .map_err(|_| NegotiationError::Closed)
    }

    /// One offer from the book.
    pub async fn offer(&self, id: OfferId) -> Result<Option<BookEntry>, NegotiationError> {
        Ok(self.book.get(&id))
    }

    /// Hands a co-signed completion of one of this node's leases to the network loop, which
    /// verifies it, keeps and persists it, scores with it, and publishes it when this node was
    /// the provider. `Ok(false)`: it was known.
    pub async fn add_completion(
        &self,
        pair: gridlease_protocol::completion::CoSigned,
    ) -> Result<bool, NetError> {
        self.ask(|r| Command::AddCompletion(pair, r))
            .await
            .map_err(|_| NetError::Closed)?
    }

    /// Ids of held offers starting with `prefix` (lowercase hex); two at most (more is
    /// ambiguous anyway).
    pub async fn offer_ids(&self, prefix: String) -> Result<Vec<OfferId>, NegotiationError> {
        Ok(self.book.ids_with_prefix(&prefix, MAX_PREFIX_MATCHES))
    }

    /// Ids of the current offers of providers whose key (hex) starts with `prefix` (an offer
    /// handle's provider part); two at most.
    pub async fn offer_ids_of_providers(
        &self,
        prefix: String,
    ) -> Result<Vec<OfferId>, NegotiationError> {
        Ok(self
            .book
            .ids_of_providers_with_prefix(&prefix, MAX_PREFIX_MATCHES))
    }

    /// Offers that newer ones from the same providers replaced, whose id starts with `prefix`
    /// (lowercase hex), with each provider's current offer.
    pub async fn replaced_offers(
        &self,
        prefix: String,
    ) -> Result<Vec<ReplacedOffer>, NegotiationError> {
        Ok(self.book.replaced(&prefix, MAX_PREFIX_MATCHES))
    }

    /// Offer gossip counters.
    pub async fn gossip_stats(&self) -> Result<GossipStats, NegotiationError> {
        self.ask(Command::GossipStats).await
    }

    /// Book sync counters.
    pub async fn sync_stats(&self) -> Result<SyncStats, NegotiationError> {
        self.ask(Command::SyncStats).await
    }

    /// Offers held.
    pub async fn book_len(&self) -> Result<usize, NegotiationError> {
        Ok(self.book.len())
    }

    /// Sets (or withdraws, with `None`) what this node offers; a new offer is signed with a new
    /// sequence and announced at once.
    pub async fn set_offer(
        &self,
        template: Option<OfferTemplate>,
    ) -> Result<Option<OwnOffer>, NegotiationError> {
        self.ask(|r| Command::SetOffer(template, r)).await
    }

    /// How many of the offer's GPUs are free now (the lease side's count): when it changes the
    /// offer is re-signed with it and announced at once, so renters do not see taken GPUs.
    pub async fn set_free_gpus(&self, free: u16) -> Result<(), NegotiationError> {
        self.set_capacity(free, 0).await
    }

    /// [`Client::set_free_gpus`], and the GiB kept beyond leases (volumes, kept outputs: issue 47): the offer's disk
    /// per GPU is the template's less its share of them.
    pub async fn set_capacity(&self, free: u16, kept_gib: u64) -> Result<(), NegotiationError> {
        self.ask(|r| Command::SetFree(free, kept_gib, r)).await
    }

    /// The current own offer.
    pub async fn own_offer(&self) -> Result<Option<OwnOffer>, NegotiationError> {
        self.ask(Command::OwnOffer).await
    }

    /// The GPU classes whose offers this node's book holds (followed, and the own offer's);
    /// `None` when it follows every class.
    pub async fn followed_classes(&self) -> Result<Option<Vec<String>>, NegotiationError> {
        Ok(self.followed().map(|f| f.classes))
    }

    /// The classes this node follows, and which of them for a search only; `None` when it
    /// follows every class. Read without asking the network loop.
    pub fn followed(&self) -> Option<Followed> {
        self.followed.borrow().clone()
    }

    /// A search names `class`: a node that follows only some classes and not this one follows
    /// it for `NodeConfig::search_follow` (again from each search), fetches its offers from
    /// nodes that hold them (connected ones, or those a DHT lookup finds) and returns when
    /// that fetch has ended. Returns at once when the class is followed and fetched (or the
    /// node follows every class). Callers bound the wait.
    pub async fn search_class(&self, class: String) -> Result<(), NegotiationError> {
        self.ask(|reply| Command::SearchClass(class, reply)).await
    }

    /// Runs one announce round now (what the timer does every announce period).
    pub async fn announce(&self) -> Result<(), NegotiationError> {
        self.ask(Command::Announce).await
    }

    /// Publishes raw bytes on the first offer topic this node follows (the topic of every
    /// offer, by default), unvalidated. For tests and fault injection only.
    pub async fn publish_raw(
        &self,
        bytes: Vec<u8>,
    ) -> Result<Result<(), NetError>, NegotiationError> {
        self.publish_raw_on(RawTopic::Followed, bytes).await
    }

    /// Publishes raw bytes on the offer topic `on`, unvalidated. For tests, benchmarks (a load
    /// generator of many providers) and fault injection only.
    pub async fn publish_raw_on(
        &self,
        on: RawTopic,
        bytes: Vec<u8>,
    ) -> Result<Result<(), NetError>, NegotiationError> {
        self.ask(|r| Command::PublishRaw(on, bytes, r)).await
    }

    /// Sends one RPC on the lease stream and returns the raw answer.
    pub async fn lease_rpc(
        &self,
        peer: PeerId,
        addrs: Vec<Multiaddr>,
        rpc: LeaseRpc,
    ) -> Result<LeaseRpcResponse, NegotiationError> {
        self.ask(|reply| Command::LeaseRpc {
            peer,
            addrs,
            rpc,
            reply,
        })
        .await?
        .map_err(|e| NegotiationError::Network {
            peer,
            detail: e.to_string(),
        })
    }

    /// Routes inbound lease-stream requests (proposals and sessions) to `tx`, the lease
    /// service. Until one is registered, proposals are refused and sessions answered `Busy`.
    pub async fn set_lease_handler(
        &self,
        tx: mpsc::Sender<super::InboundLease>,
    ) -> Result<(), NegotiationError> {
        self.ask(|r| Command::SetLeaseHandler(tx, r)).await
    }
}
