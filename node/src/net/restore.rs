//! Restores the offer book from the store after the node has started, off the event loop.
//!
//! A restart used to verify and admit every stored offer before the loop (and so the API)
//! started: 4.2 s at 100,000 offers. Now [`super::Node::start`] returns at once with the own
//! offer in the book, and this task reads the stored offers a page at a time (the store
//! thread), verifies each page again on a blocking thread (the database is not a trust
//! boundary the node skips: batch verification, 64 at a time), and hands the valid ones to the
//! loop, which admits them with one write lock per page: the loop stays the book's one
//! writer. Meanwhile the node answers (searches see the offers restored so far) and gossip and
//! book sync go on; an offer gossip brought in newer than its stored copy wins, as the book
//! refuses older sequence numbers. [`RestoreProgress`] says how far it got (`status`).

use gridlease_contracts::ingest::KEY_CACHE_CAPACITY;
use gridlease_contracts::terms::validate_offer;
use gridlease_protocol::{NetworkId, Offer, OfferId, Signed, Timestamp, VerifyCache};
use tokio::sync::{mpsc, oneshot, watch};

use crate::store::{StoreHandle, StoredOffer};

/// Stored offers read, verified and admitted per step. One page holds the loop's write lock
/// for its admissions only (about 1 µs each).
const PAGE: usize = 512;

/// An offer read from the store and verified again, ready for the book.
#[derive(Debug)]
pub(crate) struct Restored {
    pub signed: Signed<Offer>,
    pub offer: Offer,
    pub id: OfferId,
    pub received_at: Timestamp,
}

/// What the restore hands the network loop. The loop's command type converts from it
/// (`From<RestoreStep>`), so this module needs nothing of [`super::client`].
#[derive(Debug)]
pub(crate) enum RestoreStep {
    /// Stored offers, verified again, for the book; answers how many were admitted.
    Batch(Vec<Restored>, oneshot::Sender<usize>),
    /// The restore has finished (or given up): book syncs may start.
    Done,
}

/// How far the restore of the stored offers has got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreProgress {
    /// Unexpired offers in the store when the node started.
    pub stored: u64,
    /// Of those, read and checked so far.
    pub checked: u64,
    /// Of those, admitted to the book (valid, unexpired, not replaced by a newer one).
    pub restored: u64,
    /// Whether the restore has finished (or given up on a store error, logged).
    pub done: bool,
}

impl RestoreProgress {
    /// Stored offers not checked yet (0 once done).
    pub fn left(&self) -> u64 {
        if self.done {
            0
        } else {
            self.stored.saturating_sub(self.checked)
        }
    }
}

/// Restores the offers stored before `now` into the loop's book, page by page, publishing the
/// progress. Ends early (done) when the loop has stopped.
pub(super) async fn run<C: From<RestoreStep>>(
    store: StoreHandle,
    network: NetworkId,
    now: Timestamp,
    loop_tx: mpsc::Sender<C>,
    progress: watch::Sender<RestoreProgress>,
    hold: Option<std::time::Duration>,
) {
    let mut p = RestoreProgress::default();
    match store.call(move |s| s.count_live_offers(now)).await {
        Ok(n) => p.stored = n,
        Err(e) => tracing::warn!(error = %e, "cannot count the stored offers"),
    }
    progress.send_replace(p);
    let mut keys = VerifyCache::new(KEY_CACHE_CAPACITY, 0);
    let mut after: Option<[u8; 32]> = None;
    loop {
        let page = store
            .call(move |s| s.live_offers_page(now, after.as_ref(), PAGE))
            .await;
        let (stored, next) = match page {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "offer book restore stopped; gossip and book sync refill it");
                break;
            }
        };
        p.checked += stored.len() as u64;
        let net = network.clone();
        let verified = tokio::task::spawn_blocking(move || {
            let ok = verify(stored, &net, now, &mut keys);
            (ok, keys)
        })
        .await;
        let Ok((batch, k)) = verified else {
            tracing::error!("offer book restore: verification failed");
            break;
        };
        keys = k;
        if !batch.is_empty() {
            let (reply, admitted) = oneshot::channel();
            if loop_tx
                .send(RestoreStep::Batch(batch, reply).into())
                .await
                .is_err()
            {
                break;
            }
            let Ok(n) = admitted.await else {
                break;
            };
            p.restored += n as u64;
        }
        progress.send_replace(p);
        match next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    if let Some(hold) = hold {
        // A test fault (`NetFaults::hold_restore`).
        tokio::time::sleep(hold).await;
    }
    p.done = true;
    progress.send_replace(p);
    // The loop holds its book syncs until now: digests compared against a book still being
    // restored would differ everywhere and fetch again what the store holds.
    let _ = loop_tx.send(RestoreStep::Done.into()).await;
    tracing::info!(
        offers = p.restored,
        stored = p.stored,
        "offer book restored from the store"
    );
}

/// The stored offers whose signature and content still hold at `now` (expired ones and ones
/// altered on disk are left out). Takes the page, so the envelopes move into the book.
fn verify(
    stored: Vec<StoredOffer>,
    network: &NetworkId,
    now: Timestamp,
    keys: &mut VerifyCache,
) -> Vec<Restored> {
    let mut out = Vec::with_capacity(stored.len());
    let mut rest = stored.into_iter().peekable();
    while rest.peek().is_some() {
        let chunk: Vec<StoredOffer> = rest.by_ref().take(64).collect();
        let refs: Vec<&Signed<Offer>> = chunk.iter().map(|o| &o.signed).collect();
        let results = Signed::verify_batch_cached(&refs, network, keys);
        for (o, v) in chunk.into_iter().zip(results) {
            let Ok(v) = v else {
                continue;
            };
            if validate_offer(&v.message, &v.signer, now).is_err() {
                continue;
            }
            out.push(Restored {
                signed: o.signed,
                offer: v.message,
                id: OfferId(v.digest),
                received_at: o.received_at,
            });
        }
    }
    out
}
