//! Book syncs waiting to start (`docs/protocol.md` 3b): while the restore runs, while the most
//! syncs at once run, or while a sync with the same peer runs. A waiting sync is either a
//! whole one (the connection's sync or an anti-entropy round: the classes the node follows
//! when it starts, then the completion records) or a class fetch for a search (those classes'
//! offers only, 3c step 4). One entry per peer: a whole sync covers any class fetch queued with
//! it (the searched class is followed by the time it starts), and class fetches with the same
//! peer merge.
//!
//! The network loop owns it; this is the bookkeeping only.

use std::collections::VecDeque;

use libp2p::PeerId;

/// What a queued sync covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::net) enum Scope {
    /// The classes followed when it starts, and the completion records.
    Whole,
    /// These classes' offers only (classes followed for a search).
    Classes(Vec<String>),
}

/// Waiting syncs, in the order they were first asked for, at most `cap` peers.
#[derive(Debug)]
pub(in crate::net) struct SyncQueue {
    queue: VecDeque<(PeerId, Scope)>,
    cap: usize,
}

impl SyncQueue {
    pub(in crate::net) fn new(cap: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            cap,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.queue.len()
    }

    pub(in crate::net) fn contains(&self, peer: &PeerId) -> bool {
        self.queue.iter().any(|(p, _)| p == peer)
    }

    /// Queues a sync with `peer` over `scope`, merged with one already queued with it.
    /// Returns the scope that was refused when the queue is full and `peer` has no entry:
    /// whatever waits for that sync must stop waiting.
    pub(in crate::net) fn push(&mut self, peer: PeerId, scope: Scope) -> Result<(), Scope> {
        if let Some((_, queued)) = self.queue.iter_mut().find(|(p, _)| *p == peer) {
            match (queued, scope) {
                (Scope::Whole, _) => {}
                (queued, Scope::Whole) => *queued = Scope::Whole,
                (Scope::Classes(have), Scope::Classes(more)) => {
                    for c in more {
                        if !have.contains(&c) {
                            have.push(c);
                        }
                    }
                }
            }
            return Ok(());
        }
        if self.queue.len() >= self.cap {
            return Err(scope);
        }
        self.queue.push_back((peer, scope));
        Ok(())
    }

    /// Takes the first queued sync whose peer `ready` accepts (one with a sync running stays
    /// queued until that ends).
    pub(in crate::net) fn pop_ready(
        &mut self,
        mut ready: impl FnMut(&PeerId) -> bool,
    ) -> Option<(PeerId, Scope)> {
        let at = self.queue.iter().position(|(p, _)| ready(p))?;
        self.queue.remove(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(cs: &[&str]) -> Scope {
        Scope::Classes(cs.iter().map(|c| c.to_string()).collect())
    }

    #[test]
    fn a_peers_class_fetches_merge_and_a_whole_sync_covers_them() {
        let (a, b) = (PeerId::random(), PeerId::random());
        let mut q = SyncQueue::new(8);
        q.push(a, classes(&["a100"])).unwrap();
        q.push(b, classes(&["h100"])).unwrap();
        q.push(a, classes(&["h100", "a100"])).unwrap();
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_ready(|_| true), Some((a, classes(&["a100", "h100"]))));
        // A whole sync queued after a class fetch takes its place; a class fetch queued
        // after a whole sync adds nothing.
        q.push(b, Scope::Whole).unwrap();
        q.push(a, Scope::Whole).unwrap();
        q.push(a, classes(&["a100"])).unwrap();
        assert_eq!(q.pop_ready(|_| true), Some((b, Scope::Whole)));
        assert_eq!(q.pop_ready(|_| true), Some((a, Scope::Whole)));
        assert_eq!(q.pop_ready(|_| true), None);
    }

    #[test]
    fn a_peer_not_ready_keeps_its_place_and_a_full_queue_refuses_new_peers_only() {
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        let mut q = SyncQueue::new(2);
        q.push(a, Scope::Whole).unwrap();
        q.push(b, classes(&["a100"])).unwrap();
        assert_eq!(q.push(c, classes(&["h100"])), Err(classes(&["h100"])));
        // Merging into a queued peer needs no room.
        q.push(b, classes(&["h100"])).unwrap();
        assert_eq!(
            q.pop_ready(|p| *p != a),
            Some((b, classes(&["a100", "h100"])))
        );
        assert_eq!(q.pop_ready(|p| *p != a), None);
        assert_eq!(q.pop_ready(|_| true), Some((a, Scope::Whole)));
    }
}
