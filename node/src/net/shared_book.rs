//! The offer book, shared: one writer (the event loop, [`SharedBook`]), many readers
//! ([`BookReader`], held by every [`super::Client`]).
//!
//! Searches used to run on the event loop, so a large search stalled gossip and a gossip burst
//! delayed searches. Now a search runs under a read lock on the API's thread (which hands its
//! other tasks to another thread meanwhile, [`super::Client::search_page`]), never on the
//! loop; the loop takes the write lock for each admission or removal (microseconds). While a
//! search scans, a waiting admission is delayed by at most that one scan (about 2 ms at 100,000
//! offers, `docs/benchmarks.md`), and a search waits at most for one admission; neither waits
//! for the other's queue. The loop's own reads (gossip checks, book sync) take the read lock
//! for one call each.
//!
//! The book's rules stay in `gridlease_contracts::book::OfferBook`; this is only the handle.

use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use gridlease_contracts::book::{BookEntry, Cursor, OfferBook};
use gridlease_contracts::query::Query;
use gridlease_protocol::{OfferId, Timestamp};

/// An offer id a newer offer of the same provider replaced (providers re-sign before expiry,
/// so ids from an earlier search age out), with the provider's current offer.
#[derive(Clone, Debug)]
pub struct ReplacedOffer {
    /// The id asked about.
    pub old: OfferId,
    /// The provider's current offer.
    pub current: BookEntry,
    /// Same GPU models at the same or a lower price: what the old id meant.
    pub equivalent: bool,
    /// The old offer's price per GPU-hour, micro-units.
    pub old_price_per_gpu_hour: u64,
}

/// The writer's handle: only the event loop holds it.
#[derive(Debug)]
pub(crate) struct SharedBook(Arc<RwLock<OfferBook>>);

impl SharedBook {
    pub(crate) fn new(book: OfferBook) -> Self {
        Self(Arc::new(RwLock::new(book)))
    }

    /// A reader of this book.
    pub(crate) fn reader(&self) -> BookReader {
        BookReader(self.0.clone())
    }

    /// Runs one change on the book under the write lock. The guard never leaves this call, so
    /// the loop cannot hold a read guard (a temporary in a `match`, say) while it asks for the
    /// write lock, which would deadlock the loop. A panic while the lock was held leaves the
    /// book as the panicking `OfferBook` call left it, so a poisoned lock is taken over.
    pub(crate) fn update<T>(&self, change: impl FnOnce(&mut OfferBook) -> T) -> T {
        change(&mut self.0.write().unwrap_or_else(PoisonError::into_inner))
    }

    /// Runs one read of the book by the loop under the read lock (the guard stays inside).
    pub(crate) fn view<T>(&self, read: impl FnOnce(&OfferBook) -> T) -> T {
        read(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A read-only handle to the book, for searches and lookups off the event loop.
#[derive(Clone, Debug)]
pub struct BookReader(Arc<RwLock<OfferBook>>);

impl BookReader {
    fn read(&self) -> RwLockReadGuard<'_, OfferBook> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Live offers matching `query` at `now`, in its order (ties by id), at most `limit`,
    /// after the position `after` names, and the next page's cursor when more match (keyset
    /// pagination: `OfferBook::search_page`). Scans under the read lock; call it where blocking is
    /// allowed (`block_in_place`, a blocking thread).
    pub fn search(
        &self,
        query: &Query,
        now: Timestamp,
        limit: usize,
        after: Option<&Cursor>,
    ) -> (Vec<BookEntry>, Option<Cursor>) {
        let page = self.read().search_page(query, now, limit, after);
        (page.entries, page.next)
    }

    /// One offer, if it is still its provider's current one.
    pub fn get(&self, id: &OfferId) -> Option<BookEntry> {
        self.read().get(id)
    }

    /// Offers held.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// True when no offer is held.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// Ids of held offers starting with `prefix` (lowercase hex), at most `limit`.
    pub fn ids_with_prefix(&self, prefix: &str, limit: usize) -> Vec<OfferId> {
        self.read().ids_with_prefix(prefix, limit)
    }

    /// Ids of the current offers of providers whose key (hex) starts with `prefix`, at most
    /// `limit` (`OfferBook::ids_of_providers_with_prefix`: offer handles).
    pub fn ids_of_providers_with_prefix(&self, prefix: &str, limit: usize) -> Vec<OfferId> {
        self.read().ids_of_providers_with_prefix(prefix, limit)
    }

    /// Offers that newer ones from the same providers replaced, whose id starts with
    /// `prefix`, with each provider's current offer; at most `limit`.
    pub fn replaced(&self, prefix: &str, limit: usize) -> Vec<ReplacedOffer> {
        let book = self.read();
        book.replaced_with_prefix(prefix, limit)
            .into_iter()
            .filter_map(|old| {
                let r = book.replacement(&old)?;
                Some(ReplacedOffer {
                    old,
                    current: r.current,
                    equivalent: r.equivalent,
                    old_price_per_gpu_hour: r.old_price_per_gpu_hour,
                })
            })
            .collect()
    }
}
