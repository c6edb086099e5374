//! The discrete-event queue: events ordered by (time in ms, insertion sequence), so that two
//! events at the same millisecond always run in the order they were scheduled.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Entry<E> {
    at: u64,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    /// Reversed: the heap's maximum is the earliest (time, seq).
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// A priority queue of events in simulated time.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
    now: u64,
    popped: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> EventQueue<E> {
    /// An empty queue at time 0.
    pub fn new() -> Self {
        Self {
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0,
            popped: 0,
        }
    }

    /// Schedules `event` at `at` ms (never before now: earlier times are clamped to now).
    pub fn schedule(&mut self, at: u64, event: E) {
        self.seq += 1;
        self.heap.push(Entry {
            at: at.max(self.now),
            seq: self.seq,
            event,
        });
    }

    /// The next event at or before `until`, advancing the clock to it.
    pub fn pop_until(&mut self, until: u64) -> Option<(u64, E)> {
        if self.heap.peek()?.at > until {
            return None;
        }
        let e = self.heap.pop()?;
        self.now = e.at;
        self.popped += 1;
        Some((e.at, e.event))
    }

    /// The current simulated time, ms.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Events processed so far.
    pub fn popped(&self) -> u64 {
        self.popped
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_run_in_insertion_order() {
        let mut q = EventQueue::new();
        q.schedule(10, "b");
        q.schedule(5, "a");
        q.schedule(10, "c");
        q.schedule(10, "d");
        let order: Vec<_> = std::iter::from_fn(|| q.pop_until(u64::MAX)).collect();
        assert_eq!(order, vec![(5, "a"), (10, "b"), (10, "c"), (10, "d")]);
        assert_eq!(q.popped(), 4);
    }

    #[test]
    fn stops_at_the_horizon_and_clamps_the_past() {
        let mut q = EventQueue::new();
        q.schedule(10, 1);
        q.schedule(20, 2);
        assert_eq!(q.pop_until(15), Some((10, 1)));
        assert_eq!(q.pop_until(15), None);
        q.schedule(3, 3);
        assert_eq!(q.pop_until(15), Some((10, 3)));
    }
}
