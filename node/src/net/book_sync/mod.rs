//! The network loop's book-sync child ([`BookSyncs`]): the syncs this node runs with its
//! peers (bucket digests, then the ids of the buckets that differ or whole pages, then the
//! missing offers and completion records), their queue and limits, the ids wanted, the
//! anti-entropy rounds, and the answers to peers' syncs ([`answer`]). Its methods take the
//! swarm and the sibling children it needs as [`SyncDeps`].

mod answer;
pub(super) mod queue;
mod response;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use gridlease_protocol::sync::{BookRequest, BookResponse, MAX_SYNC_GET};
use gridlease_protocol::{LeaseId, OfferId, PeerId};
use libp2p::Swarm;
use libp2p::request_response;

use super::behaviour::Behaviour;
use super::classes::Classes;
use super::client::SyncStats;
use super::codec::Incoming;
use super::ingest::Ingest;
use super::loop_ctx::{LoopCtx, RATE_KEYS};
use super::ratelimit::{RateLimit, RateLimiter};
use super::reputation::Reputation;
use queue::{Scope, SyncQueue};

/// Most book syncs run at once; more connections wait in a queue.
const MAX_SYNCS: usize = 8;
/// Most peers waiting for a book sync; a connection beyond them is not synced now (gossip and
/// the anti-entropy rounds still reach it).
const MAX_SYNC_QUEUE: usize = 1024;

/// What a book sync's methods need besides its own state: the swarm and the siblings.
pub(super) struct SyncDeps<'a> {
    /// The swarm (requests, responses, connected peers).
    pub(super) swarm: &'a mut Swarm<Behaviour>,
    /// The shared context (book, settings, events).
    pub(super) ctx: &'a LoopCtx,
    /// Which classes are followed; searches waiting for a class fetch.
    pub(super) classes: &'a mut Classes,
    /// Verifies and admits the offers a sync brings.
    pub(super) ingest: &'a mut Ingest,
    /// Completion records (served, and learnt from syncs).
    pub(super) reputation: &'a mut Reputation,
}

/// One running book sync with a peer: pages of ids, then the missing offers in batches.
#[derive(Debug, Default)]
struct BookSync {
    /// Ids the peer holds that this node lacks, not yet asked for.
    missing: VecDeque<OfferId>,
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
    completions_missing: VecDeque<LeaseId>,
    /// An anti-entropy round: the id buckets are compared first (`Digests`), and only those
    /// that differ are listed (`BucketIds`).
    by_bucket: bool,
    /// The bucket being listed (with `by_bucket`).
    bucket: Option<u8>,
    /// Buckets that differ, not listed yet.
    buckets: VecDeque<u8>,
}

/// Book syncs, run and answered.
pub(super) struct BookSyncs {
    /// Book syncs this node runs with peers it connected to (at most [`MAX_SYNCS`]).
    syncs: HashMap<PeerId, BookSync>,
    /// Syncs waiting for a slot, for the restore to finish, or for a sync with the same peer
    /// to end (at most [`MAX_SYNC_QUEUE`] peers).
    queue: SyncQueue,
    /// The stored offers are still being restored ([`super::restore`]): syncs wait.
    restoring: bool,
    /// Offer ids a sync listed and will ask for, or has asked for and not had answered yet
    /// (never asked twice at once). Each leaves when its offer is admitted or refreshed, when
    /// the answer to its `Get` comes without it, or when its sync ends: one left behind would
    /// keep every later listing from asking for it again.
    wanted: HashSet<OfferId>,
    /// Book sync requests answered per peer.
    limits: RateLimiter<PeerId>,
    /// What book sync has done.
    stats: SyncStats,
    /// Book sync response bytes read (counted by the codec).
    bytes: Arc<AtomicU64>,
    /// Which connected peer the next offer anti-entropy round syncs with.
    resync_round: usize,
}

/// The next connected peer in turn for a round counted by `round`, in peer id order.
fn next_in_turn(swarm: &Swarm<Behaviour>, round: &mut usize) -> Option<PeerId> {
    let mut peers: Vec<PeerId> = swarm.connected_peers().copied().collect();
    if peers.is_empty() {
        return None;
    }
    peers.sort();
    *round = round.wrapping_add(1);
    Some(peers[*round % peers.len()])
}

/// The request for a page of the peer's offer ids after `after`, of `classes` (a sync's;
/// `None`: every class).
fn ids_request(classes: Option<Vec<String>>, after: Option<OfferId>) -> BookRequest {
    match classes {
        None => BookRequest::Ids { after },
        Some(classes) => BookRequest::ClassIds { classes, after },
    }
}

/// The request for a page of the peer's ids in `bucket` after `after`, of `classes` (a
/// sync's; `None`: every class).
fn bucket_request(classes: Option<Vec<String>>, bucket: u8, after: Option<OfferId>) -> BookRequest {
    BookRequest::BucketIds {
        classes,
        bucket,
        after,
    }
}

impl BookSyncs {
    /// No sync yet; the restore runs (syncs wait for [`Self::restore_done`]). `bytes`: the
    /// codec's count of response bytes read.
    pub(super) fn new(bytes: Arc<AtomicU64>) -> Self {
        Self {
            syncs: HashMap::new(),
            queue: SyncQueue::new(MAX_SYNC_QUEUE),
            restoring: true,
            wanted: HashSet::new(),
            limits: RateLimiter::new(
                RateLimit {
                    burst: 512,
                    per_token: Duration::from_millis(10),
                },
                RATE_KEYS,
            ),
            stats: SyncStats::default(),
            bytes,
            resync_round: 0,
        }
    }

    /// What book sync has done ([`crate::net::Client::sync_stats`]).
    pub(super) fn stats(&self) -> SyncStats {
        let mut st = self.stats;
        st.bytes_received = self.bytes.load(Ordering::Relaxed);
        st
    }

    /// The restore has finished: queued syncs start.
    pub(super) fn restore_done(&mut self, d: &mut SyncDeps<'_>) {
        self.restoring = false;
        self.next_queued_sync(d);
    }

    /// Syncs the offers of `class`, followed for a search, from the connected `peer`: a sync
    /// over that class's offers only (the completion records came with the connection's
    /// sync), now or, when it must wait (a sync with the peer runs, the most syncs run, the
    /// restore runs), from the queue: there it merges with other classes fetched from the
    /// peer, and a whole sync queued with the peer covers it.
    pub(super) fn fetch_class_from(&mut self, d: &mut SyncDeps<'_>, class: &str, peer: PeerId) {
        if d.classes.searched.waits_for(class, &peer) {
            return;
        }
        d.classes.searched.fetching_from(class, peer);
        let classes = vec![class.to_string()];
        if self.must_wait_to_sync(&peer) {
            self.queue_sync(d.classes, peer, Scope::Classes(classes));
        } else {
            self.begin_class_fetch(d, peer, classes);
        }
    }

    /// A sync with `peer` over `classes`' offers only, without the completion records.
    fn begin_class_fetch(&mut self, d: &mut SyncDeps<'_>, peer: PeerId, classes: Vec<String>) {
        self.begin_sync(d.swarm, peer, Some(classes));
        if let Some(s) = self.syncs.get_mut(&peer) {
            s.completions_started = true;
            s.completions_listed = true;
        }
    }

    /// Whether a sync with `peer` must wait in the queue: one with it is queued or runs, the
    /// most syncs run, or the restore runs.
    fn must_wait_to_sync(&self, peer: &PeerId) -> bool {
        self.queue.contains(peer)
            || self.syncs.contains_key(peer)
            || self.syncs.len() >= MAX_SYNCS
            || self.restoring
    }

    /// Queues a sync with `peer`. When the queue is full the peer is not synced now (gossip
    /// and the anti-entropy rounds still reach it), and searches waiting for a class fetch
    /// from it wait no more.
    fn queue_sync(&mut self, classes: &mut Classes, peer: PeerId, scope: Scope) {
        if let Err(refused) = self.queue.push(peer, scope) {
            tracing::debug!(%peer, "book sync queue full: not synced now");
            if let Scope::Classes(cs) = refused {
                classes.searched.sync_ended(&peer, Some(cs.as_slice()));
            }
        }
    }

    /// Anti-entropy for completion records: each republish period, the completions phase of a
    /// book sync with the next connected peer in turn (gossip can miss a node whose mesh was
    /// forming; a batch nobody learns from is not forwarded). Costs one page of lease ids per
    /// 4,096 records when nothing is missing.
    pub(super) fn completion_anti_entropy(&mut self, d: &mut SyncDeps<'_>) {
        let Some(peer) = next_in_turn(d.swarm, &mut d.reputation.round) else {
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
        self.sync_next(d, peer);
    }

    /// Anti-entropy for offers, which are published only when they change: each
    /// [`super::NodeConfig::offer_resync`], a book sync (bucket digests, the ids of the
    /// buckets that differ, then completion records) with the next connected peer in turn.
    /// Catches what gossip missed (a message lost while a mesh was forming, an offer a peer
    /// learned by sync, which is not re-gossiped). Costs one 2 KB answer when nothing is
    /// missing.
    pub(super) fn offer_anti_entropy(&mut self, d: &mut SyncDeps<'_>) {
        if self.restoring {
            return;
        }
        let Some(peer) = next_in_turn(d.swarm, &mut self.resync_round) else {
            return;
        };
        if self.syncs.contains_key(&peer) || self.syncs.len() >= MAX_SYNCS {
            return;
        }
        self.begin_sync(d.swarm, peer, d.classes.followed_classes());
    }

    /// A book sync with `peer`: bucket digests first, then the ids of the buckets that differ
    /// (or whole pages, when most do), then the missing offers and completion records; over
    /// `classes` (`None`: every class).
    fn begin_sync(
        &mut self,
        swarm: &mut Swarm<Behaviour>,
        peer: PeerId,
        classes: Option<Vec<String>>,
    ) {
        self.stats.started += 1;
        self.syncs.insert(
            peer,
            BookSync {
                by_bucket: true,
                classes: classes.clone(),
                ..BookSync::default()
            },
        );
        self.request(swarm, peer, BookRequest::Digests { classes });
    }

    /// Asks a newly connected peer which live offers it holds (bounded: [`MAX_SYNCS`] at once,
    /// [`MAX_SYNC_QUEUE`] waiting). Waits in the queue while the restore runs, while
    /// [`MAX_SYNCS`] run, or while another sync with the peer runs (an anti-entropy round that
    /// picked it first: the connection's sync, dropped then, left a new node with only what
    /// other peers gave it).
    pub(super) fn start_sync(&mut self, d: &mut SyncDeps<'_>, peer: PeerId) {
        if self.must_wait_to_sync(&peer) {
            self.queue_sync(d.classes, peer, Scope::Whole);
            return;
        }
        // As an anti-entropy round: a node that reconnects, or restarts with its book, lists
        // only the buckets that differ (a new node lists all).
        self.begin_sync(d.swarm, peer, d.classes.followed_classes());
    }

    /// Sends `req` to `peer` (its sync is busy until the answer).
    fn request(&mut self, swarm: &mut Swarm<Behaviour>, peer: PeerId, req: BookRequest) {
        if let Some(s) = self.syncs.get_mut(&peer) {
            s.busy = true;
        }
        swarm
            .behaviour_mut()
            .book
            .send_request(&peer, Incoming::Valid(req));
    }

    /// Asks for the next batch of missing offers, or ends the sync.
    fn sync_next(&mut self, d: &mut SyncDeps<'_>, peer: PeerId) {
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
            self.request(d.swarm, peer, BookRequest::Get { ids });
            return;
        }
        if !s.listed {
            return;
        }
        // The offers are done: then the completion records (reputation).
        if !s.completions_started {
            s.completions_started = true;
            self.request(d.swarm, peer, BookRequest::CompletionIds { after: None });
            return;
        }
        let n = s.completions_missing.len().min(MAX_SYNC_GET);
        let leases: Vec<_> = s.completions_missing.drain(..n).collect();
        if !leases.is_empty() {
            self.request(d.swarm, peer, BookRequest::GetCompletions { leases });
        } else if s.completions_listed {
            if let Some(s) = self.syncs.remove(&peer) {
                self.stats.ended += 1;
                d.classes.searched.sync_ended(&peer, s.classes.as_deref());
            }
            self.next_queued_sync(d);
        }
    }

    /// Lists the next differing bucket of an anti-entropy round, or, when none is left (or
    /// the sync lists whole pages), ends the listing and fetches what is missing.
    fn next_bucket(&mut self, d: &mut SyncDeps<'_>, peer: PeerId) {
        let Some(s) = self.syncs.get_mut(&peer) else {
            return;
        };
        s.bucket = s.buckets.pop_front();
        match s.bucket {
            Some(bucket) => {
                let next = bucket_request(s.classes.clone(), bucket, None);
                self.request(d.swarm, peer, next);
            }
            None => {
                s.listed = true;
                self.sync_next(d, peer);
            }
        }
    }

    /// Ends the sync with `peer` early (failed, refused, or the peer misbehaved): what it
    /// wanted is released, and the next queued sync starts.
    fn end_sync(&mut self, d: &mut SyncDeps<'_>, peer: &PeerId) {
        if let Some(s) = self.syncs.remove(peer) {
            self.stats.ended += 1;
            tracing::debug!(%peer, missing = s.missing.len(), asked = s.asked.len(), listed = s.listed, "book sync ended early");
            for id in s.missing {
                self.wanted.remove(&id);
            }
            self.release_asked(s.asked);
            d.classes.searched.sync_ended(peer, s.classes.as_deref());
        }
        self.next_queued_sync(d);
    }

    /// Releases the ids of an answered or abandoned `Get` that are still wanted: offers the
    /// answer left out (the peer no longer held them), stale ones, or ones a failed request
    /// lost. The next listing that names them asks for them again.
    fn release_asked(&mut self, asked: Vec<OfferId>) {
        for id in asked {
            if self.wanted.remove(&id) {
                self.stats.asked_not_admitted += 1;
            }
        }
    }

    /// Starts queued syncs while slots are free: the first queued peers with no sync running
    /// (one that runs stays queued until it ends; every end calls this). A class fetch
    /// starts over the classes still followed for a search (one dropped meanwhile has
    /// answered its searches).
    fn next_queued_sync(&mut self, d: &mut SyncDeps<'_>) {
        while self.syncs.len() < MAX_SYNCS && !self.restoring {
            let syncs = &self.syncs;
            let Some((peer, scope)) = self.queue.pop_ready(|p| !syncs.contains_key(p)) else {
                return;
            };
            // A peer gone since has released what waited for it (`SearchedClasses::peer_gone`).
            if !d.swarm.is_connected(&peer) {
                continue;
            }
            match scope {
                Scope::Whole => self.start_sync(d, peer),
                Scope::Classes(mut classes) => {
                    classes.retain(|c| d.classes.searched.contains(c));
                    if !classes.is_empty() {
                        self.begin_class_fetch(d, peer, classes);
                    }
                }
            }
        }
    }

    /// A book-sync stream event: a peer's request answered, an answer to ours handled, a
    /// failed request ending its sync.
    pub(super) fn on_event(
        &mut self,
        d: &mut SyncDeps<'_>,
        event: request_response::Event<Incoming<BookRequest>, BookResponse>,
    ) {
        match event {
            request_response::Event::Message { peer, message, .. } => match message {
                request_response::Message::Request {
                    request, channel, ..
                } => {
                    let now = d.ctx.now();
                    let response = match request {
                        Incoming::Valid(r) => answer::answer(
                            d.ctx,
                            &mut self.limits,
                            &d.reputation.completions,
                            &peer,
                            r,
                            now,
                        ),
                        Incoming::Malformed(detail) => {
                            d.ingest.probed(&peer, "book sync", &detail, now);
                            BookResponse::Refused
                        }
                    };
                    let _ = d
                        .swarm
                        .behaviour_mut()
                        .book
                        .send_response(channel, response);
                }
                request_response::Message::Response { response, .. } => {
                    self.stats.bytes_received = self.bytes.load(Ordering::Relaxed);
                    self.on_response(d, peer, response);
                }
            },
            request_response::Event::OutboundFailure { peer, error, .. } => {
                tracing::debug!(%peer, %error, "book sync request failed");
                self.end_sync(d, &peer);
            }
            request_response::Event::InboundFailure { peer, error, .. } => {
                tracing::debug!(%peer, %error, "inbound book sync request failed");
            }
            request_response::Event::ResponseSent { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syncs() -> BookSyncs {
        BookSyncs::new(Arc::new(AtomicU64::new(0)))
    }

    #[test]
    fn syncs_wait_for_the_restore_a_running_sync_and_a_free_slot() {
        let mut s = syncs();
        let peer = PeerId::random();
        assert!(s.must_wait_to_sync(&peer), "the restore runs");
        s.restoring = false;
        assert!(!s.must_wait_to_sync(&peer));
        s.syncs.insert(peer, BookSync::default());
        assert!(s.must_wait_to_sync(&peer), "a sync with the peer runs");
        for _ in 1..MAX_SYNCS {
            s.syncs.insert(PeerId::random(), BookSync::default());
        }
        assert!(s.must_wait_to_sync(&PeerId::random()), "every slot taken");
    }

    #[test]
    fn asked_ids_still_wanted_are_released_and_counted() {
        let mut s = syncs();
        let id = |b: u8| OfferId(gridlease_protocol::Digest([b; 32]));
        s.wanted.insert(id(1));
        s.wanted.insert(id(2));
        // id(3) was admitted meanwhile (no longer wanted): not counted.
        s.release_asked(vec![id(1), id(3)]);
        assert!(!s.wanted.contains(&id(1)));
        assert!(s.wanted.contains(&id(2)));
        assert_eq!(s.stats().asked_not_admitted, 1);
        s.bytes.store(42, Ordering::Relaxed);
        assert_eq!(s.stats().bytes_received, 42);
    }
}
