//! A peer's answers to this node's book sync ([`BookSyncs::on_response`]): id pages, bucket
//! digests, offers, completion record ids and pairs, each moving its sync on.

use std::collections::VecDeque;

use gridlease_protocol::sync::{BookRequest, BookResponse};
use gridlease_protocol::{LeaseId, OfferId, PeerId};

use super::{BookSyncs, SyncDeps, bucket_request, ids_request};
use crate::net::ingest::SyncedOffer;

/// Most differing id buckets a book sync lists one by one (`BucketIds`); with more it lists
/// whole pages (`Ids`/`ClassIds`) instead. An eighth: listing 32 buckets costs at least 32
/// round trips, the whole book of 100,000 ids 25.
const LIST_BUCKETS_UP_TO: usize = gridlease_protocol::sync::BUCKETS / 8;

impl BookSyncs {
    /// An answer from `peer` to this node's sync with it.
    pub(super) fn on_response(
        &mut self,
        d: &mut SyncDeps<'_>,
        peer: PeerId,
        response: BookResponse,
    ) {
        if !self.syncs.contains_key(&peer) {
            return;
        }
        match response {
            BookResponse::Ids { ids, more } => self.on_ids(d, peer, ids, more),
            BookResponse::Offers { envelopes } => self.on_offers(d, peer, envelopes),
            BookResponse::Refused => {
                tracing::debug!(%peer, "book sync refused by the peer");
                self.end_sync(d, &peer);
            }
            BookResponse::Digests { digests } => self.on_digests(d, peer, &digests),
            BookResponse::CompletionIds { ids, more } => self.on_completion_ids(d, peer, ids, more),
            BookResponse::Completions { pairs } => {
                let now = d.ctx.now();
                match d.reputation.on_synced(d.ctx, &pairs, now) {
                    Ok(()) => self.sync_next(d, peer),
                    Err(e) => {
                        // A bad record from a peer we asked: stop syncing with it.
                        tracing::info!(%peer, error = %e, "invalid completion record in a book sync");
                        self.end_sync(d, &peer);
                    }
                }
            }
        }
    }

    /// A page of the peer's offer ids: the ones this node lacks (and wants no other sync to
    /// bring) become missing, within the book's capacity; the next page or bucket follows.
    fn on_ids(&mut self, d: &mut SyncDeps<'_>, peer: PeerId, ids: Vec<OfferId>, more: bool) {
        self.stats.ids_received += ids.len() as u64;
        let last = ids.last().copied();
        let wanted = &self.wanted;
        let fresh: Vec<OfferId> = d.ctx.book.view(|book| {
            ids.into_iter()
                .filter(|id| !book.contains(id) && !wanted.contains(id))
                .collect()
        });
        // Never want more than the book holds.
        let room = d.ctx.config.book_capacity.saturating_sub(self.wanted.len());
        let Some(s) = self.syncs.get_mut(&peer) else {
            return;
        };
        for id in fresh.into_iter().take(room) {
            self.wanted.insert(id);
            s.missing.push_back(id);
        }
        match (more, last, s.bucket) {
            (true, Some(after), Some(bucket)) => {
                let next = bucket_request(s.classes.clone(), bucket, Some(after));
                self.request(d.swarm, peer, next);
            }
            (true, Some(after), None) => {
                let next = ids_request(s.classes.clone(), Some(after));
                self.request(d.swarm, peer, next);
            }
            _ => self.next_bucket(d, peer),
        }
    }

    /// Offers this node asked for: each verified and admitted; an invalid one ends the sync.
    fn on_offers(
        &mut self,
        d: &mut SyncDeps<'_>,
        peer: PeerId,
        envelopes: Vec<serde_bytes::ByteBuf>,
    ) {
        for bytes in envelopes {
            let now = d.ctx.now();
            let classes = &*d.classes;
            let synced = d
                .ingest
                .admit_synced(d.ctx, &peer, &bytes, |c| classes.follows(c), now);
            match synced {
                SyncedOffer::Valid { id, new } => {
                    self.wanted.remove(&id);
                    if new {
                        self.stats.offers_admitted += 1;
                    }
                }
                SyncedOffer::Stale => {}
                SyncedOffer::Invalid => {
                    // An invalid offer from a peer we asked: stop syncing with it.
                    self.stats.offers_rejected += 1;
                    self.end_sync(d, &peer);
                    return;
                }
            }
        }
        if let Some(s) = self.syncs.get_mut(&peer) {
            let asked = std::mem::take(&mut s.asked);
            self.release_asked(asked);
        }
        self.sync_next(d, peer);
    }

    /// The peer's bucket digests: the buckets that differ from the book's are listed one by
    /// one, or, when most differ, the peer's ids in whole pages.
    fn on_digests(&mut self, d: &mut SyncDeps<'_>, peer: PeerId, digests: &[u64]) {
        let Some(s) = self.syncs.get(&peer) else {
            return;
        };
        if !s.by_bucket || digests.len() != gridlease_protocol::sync::BUCKETS {
            // Not asked for, or malformed.
            self.end_sync(d, &peer);
            return;
        }
        let now = d.ctx.now();
        let classes = s.classes.clone();
        let own = d
            .ctx
            .book
            .view(|b| b.bucket_digests(classes.as_deref(), now));
        let differ: VecDeque<u8> = (0..=u8::MAX)
            .filter(|&b| own[usize::from(b)] != digests[usize::from(b)])
            .collect();
        self.stats.digest_rounds += 1;
        self.stats.buckets_differing += differ.len() as u64;
        if differ.len() > LIST_BUCKETS_UP_TO {
            // Most buckets differ (a new node, or one long away): whole pages of ids
            // take a round trip per 4,096 ids, a bucket at least one each.
            self.stats.whole_listings += 1;
            let first = ids_request(classes, None);
            self.request(d.swarm, peer, first);
            return;
        }
        if let Some(s) = self.syncs.get_mut(&peer) {
            s.buckets = differ;
        }
        self.next_bucket(d, peer);
    }

    /// A page of the peer's completion record ids: the ones this node lacks become missing;
    /// the next page follows, or the records are fetched.
    fn on_completion_ids(
        &mut self,
        d: &mut SyncDeps<'_>,
        peer: PeerId,
        ids: Vec<LeaseId>,
        more: bool,
    ) {
        let last = ids.last().copied();
        let room = crate::store::COMPLETIONS_KEPT;
        let completions = &d.reputation.completions;
        let Some(s) = self.syncs.get_mut(&peer) else {
            return;
        };
        for id in ids {
            if !completions.has(&id) && s.completions_missing.len() < room {
                s.completions_missing.push_back(id);
            }
        }
        match (more, last) {
            (true, Some(after)) => self.request(
                d.swarm,
                peer,
                BookRequest::CompletionIds { after: Some(after) },
            ),
            _ => {
                s.completions_listed = true;
                self.sync_next(d, peer);
            }
        }
    }
}
