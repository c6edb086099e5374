//! The discrete-event queue: events ordered by (time in ms, insertion sequence), so that two
//! events at the same millisecond always run in the order they were scheduled.

/// Heap arity: a 4-ary heap is shallower than a binary one and keeps siblings together,
/// which matters because popping the queue is the engine's hottest operation.
const D: usize = 4;

struct Entry<E> {
    key: (u64, u64),
    event: E,
}

/// A priority queue of events in simulated time (an implicit 4-ary min-heap on
/// (time, sequence)).
pub struct EventQueue<E> {
    heap: Vec<Entry<E>>,
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
            heap: Vec::new(),
            seq: 0,
            now: 0,
            popped: 0,
        }
    }

    /// Schedules `event` at `at` ms (never before now: earlier times are clamped to now).
    pub fn schedule(&mut self, at: u64, event: E) {
        self.seq += 1;
        let key = (at.max(self.now), self.seq);
        self.heap.push(Entry { key, event });
        // Sift up.
        let mut i = self.heap.len() - 1;
        while i > 0 {
            let parent = (i - 1) / D;
            if self.heap[parent].key <= key {
                break;
            }
            self.heap.swap(i, parent);
            i = parent;
        }
    }

    /// The next event at or before `until`, advancing the clock to it.
    pub fn pop_until(&mut self, until: u64) -> Option<(u64, E)> {
        if self.heap.first()?.key.0 > until {
            return None;
        }
        let last = self.heap.len() - 1;
        self.heap.swap(0, last);
        let top = self.heap.pop()?;
        // Sift down.
        let n = self.heap.len();
        let mut i = 0;
        loop {
            let first = i * D + 1;
            if first >= n {
                break;
            }
            let end = (first + D).min(n);
            let mut best = first;
            for c in first + 1..end {
                if self.heap[c].key < self.heap[best].key {
                    best = c;
                }
            }
            if self.heap[best].key >= self.heap[i].key {
                break;
            }
            self.heap.swap(i, best);
            i = best;
        }
        self.now = top.key.0;
        self.popped += 1;
        Some((top.key.0, top.event))
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
    fn pops_in_key_order_like_a_sort() {
        let mut q = EventQueue::new();
        let mut x: u64 = 12345;
        let mut keys = Vec::new();
        for i in 0..5000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = (x >> 40) % 1000;
            q.schedule(at, i);
            keys.push((at, i + 1, i));
        }
        keys.sort_unstable();
        let got: Vec<_> = std::iter::from_fn(|| q.pop_until(u64::MAX)).collect();
        let want: Vec<_> = keys.iter().map(|&(at, _, e)| (at, e)).collect();
        assert_eq!(got, want);
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
