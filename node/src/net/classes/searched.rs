//! GPU classes followed for a search (`docs/protocol.md` 3c step 4): a node that follows only
//! some classes and is asked to search another (a query's `gpu=MODEL`) follows that class for
//! a while: it subscribes to the class's topic, syncs the class's offers from up to three
//! connected nodes that hold them (or from the nodes a DHT lookup of the class finds), and
//! answers the search once those syncs end. The class stays followed
//! [`NodeConfig::search_follow`] after its last search, then its offers leave the book.
//!
//! This is the bookkeeping only: which classes are followed for searches, which peers each
//! one's first fetch still waits for, and the searches waiting for it. The network loop owns
//! it, does the subscribing, syncing and lookups, and feeds it what happened.
//!
//! [`NodeConfig::search_follow`]: super::NodeConfig::search_follow

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use libp2p::PeerId;
use tokio::sync::oneshot;

/// Most searches waiting for one class's fetch; more are answered at once (from what the book
/// holds by then).
const MAX_WAITERS: usize = 256;

#[derive(Debug)]
struct Searched {
    /// The class's last search.
    last: Instant,
    /// Peers whose sync of the class has not ended yet.
    pending: HashSet<PeerId>,
    /// A DHT lookup of the class's nodes is under way.
    lookup: bool,
    /// Searches waiting for the fetch to end.
    waiters: Vec<oneshot::Sender<()>>,
}

/// The classes followed for searches, and the fetches of their offers.
#[derive(Debug)]
pub(in crate::net) struct SearchedClasses {
    classes: HashMap<String, Searched>,
    keep: Duration,
}

impl SearchedClasses {
    /// Classes stay followed `keep` after their last search.
    pub(in crate::net) fn new(keep: Duration) -> Self {
        Self {
            classes: HashMap::new(),
            keep,
        }
    }

    pub(in crate::net) fn contains(&self, class: &str) -> bool {
        self.classes.contains_key(class)
    }

    /// The classes followed for searches, in no order.
    pub(in crate::net) fn names(&self) -> impl Iterator<Item = &str> {
        self.classes.keys().map(String::as_str)
    }

    /// Starts following `class` for a search at `now` (the network loop has subscribed).
    pub(in crate::net) fn start(&mut self, class: &str, now: Instant) {
        self.classes.insert(
            class.to_string(),
            Searched {
                last: now,
                pending: HashSet::new(),
                lookup: false,
                waiters: Vec::new(),
            },
        );
    }

    /// Another search of a class followed for searches: it stays followed `keep` from `now`.
    /// False when the class is not followed for searches.
    pub(in crate::net) fn touch(&mut self, class: &str, now: Instant) -> bool {
        match self.classes.get_mut(class) {
            Some(s) => {
                s.last = now;
                true
            }
            None => false,
        }
    }

    /// A search waits for the class's fetch: answered when it ends (at once when nothing is
    /// pending, or when too many wait already).
    pub(in crate::net) fn wait(&mut self, class: &str, waiter: oneshot::Sender<()>) {
        match self.classes.get_mut(class) {
            Some(s) if s.waiters.len() < MAX_WAITERS => s.waiters.push(waiter),
            _ => {
                let _ = waiter.send(());
            }
        }
        self.release(class);
    }

    /// The class's offers are being synced from `peer`.
    pub(in crate::net) fn fetching_from(&mut self, class: &str, peer: PeerId) {
        if let Some(s) = self.classes.get_mut(class) {
            s.pending.insert(peer);
        }
    }

    /// Whether the class's fetch already waits for `peer`.
    pub(in crate::net) fn waits_for(&self, class: &str, peer: &PeerId) -> bool {
        self.classes
            .get(class)
            .is_some_and(|s| s.pending.contains(peer))
    }

    /// A DHT lookup of the class's nodes started (`true`) or ended.
    pub(in crate::net) fn looking_up(&mut self, class: &str, on: bool) {
        if let Some(s) = self.classes.get_mut(class) {
            s.lookup = on;
        }
        self.release(class);
    }

    /// A sync with `peer` over `classes` (`None`: every class) ended, finished or not.
    pub(in crate::net) fn sync_ended(&mut self, peer: &PeerId, classes: Option<&[String]>) {
        let names: Vec<String> = self
            .classes
            .iter_mut()
            .filter(|(c, _)| classes.is_none_or(|cs| cs.contains(c)))
            .filter_map(|(c, s)| s.pending.remove(peer).then(|| c.clone()))
            .collect();
        for c in names {
            self.release(&c);
        }
    }

    /// `peer` is gone (its connection closed, or a dial failed): no fetch waits for it.
    pub(in crate::net) fn peer_gone(&mut self, peer: &PeerId) {
        self.sync_ended(peer, None);
    }

    /// Answers the searches waiting for `class` once its fetch has nothing left to wait for.
    fn release(&mut self, class: &str) {
        if let Some(s) = self.classes.get_mut(class)
            && s.pending.is_empty()
            && !s.lookup
        {
            for w in s.waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }

    /// The class searched least recently with no search waiting for it: the one to stop
    /// following when another class needs the room.
    pub(in crate::net) fn least_recent(&self) -> Option<String> {
        self.classes
            .iter()
            .filter(|(_, s)| s.waiters.is_empty())
            .min_by_key(|(_, s)| s.last)
            .map(|(c, _)| c.clone())
    }

    /// The classes not searched for `keep` by `now`, with no search waiting.
    pub(in crate::net) fn idle(&self, now: Instant) -> Vec<String> {
        self.classes
            .iter()
            .filter(|(_, s)| s.waiters.is_empty() && now.duration_since(s.last) >= self.keep)
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// Stops tracking `class` (no longer followed for searches, or followed for good now);
    /// its waiting searches are answered.
    pub(in crate::net) fn remove(&mut self, class: &str) {
        if let Some(s) = self.classes.remove(class) {
            for w in s.waiters {
                let _ = w.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter() -> (oneshot::Sender<()>, oneshot::Receiver<()>) {
        oneshot::channel()
    }

    #[test]
    fn a_search_waits_for_every_pending_sync_and_the_lookup() {
        let t = Instant::now();
        let mut s = SearchedClasses::new(Duration::from_secs(600));
        s.start("a100", t);
        let (a, b) = (PeerId::random(), PeerId::random());
        s.fetching_from("a100", a);
        s.fetching_from("a100", b);
        s.looking_up("a100", true);
        let (tx, mut rx) = waiter();
        s.wait("a100", tx);
        // A sync over other classes does not count.
        s.sync_ended(&a, Some(&["rtx-4090".to_string()]));
        assert!(rx.try_recv().is_err());
        s.sync_ended(&a, Some(&["a100".to_string()]));
        assert!(rx.try_recv().is_err());
        s.peer_gone(&b);
        assert!(rx.try_recv().is_err(), "the lookup is still under way");
        s.looking_up("a100", false);
        assert_eq!(rx.try_recv(), Ok(()));
        // Nothing pending: a later search is answered at once.
        let (tx, mut rx) = waiter();
        s.wait("a100", tx);
        assert_eq!(rx.try_recv(), Ok(()));
    }

    #[test]
    fn classes_idle_past_keep_and_the_least_recent_are_named() {
        let t = Instant::now();
        let keep = Duration::from_secs(600);
        let mut s = SearchedClasses::new(keep);
        s.start("a100", t);
        s.start("h100", t + Duration::from_secs(10));
        assert_eq!(s.least_recent().as_deref(), Some("a100"));
        assert!(s.idle(t + Duration::from_secs(599)).is_empty());
        assert_eq!(s.idle(t + keep), vec!["a100".to_string()]);
        assert!(s.touch("a100", t + Duration::from_secs(20)));
        assert!(!s.touch("v100", t));
        assert_eq!(s.least_recent().as_deref(), Some("h100"));
        // A class a search waits for is neither idle nor evicted.
        s.fetching_from("h100", PeerId::random());
        let (tx, mut rx) = waiter();
        s.wait("h100", tx);
        assert!(s.idle(t + keep * 2).iter().all(|c| c != "h100"));
        assert_eq!(s.least_recent().as_deref(), Some("a100"));
        s.remove("h100");
        assert_eq!(rx.try_recv(), Ok(()), "removal answers its searches");
        assert!(!s.contains("h100"));
    }
}
