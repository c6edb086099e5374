//! The discrete-event queue: events ordered by (time in ms, insertion sequence), so that two
//! events at the same millisecond always run in the order they were scheduled.

/// Number of buckets: one per bit of the 128-bit key (bucket 0, "equal to the last key", is
/// never kept: the minimum is taken out as soon as it is found).
const BUCKETS: usize = 128;

struct Entry<E> {
    /// (time << 64) | sequence: unique, and ordered like (time, sequence).
    key: u128,
    event: E,
}

/// A priority queue of events in simulated time, ordered by (time, sequence).
///
/// A radix heap: keys only grow (an event is never scheduled before the last one popped, and
/// sequence numbers increase), so each pending key sits in the bucket of the highest bit in
/// which it differs from the last popped key. Popping takes the lowest non-empty bucket, finds
/// its minimum and redistributes the rest into lower buckets. Every pending event moves down at
/// most once per bit, and all moves are sequential, which beats a heap's random sifting when
/// the queue is larger than the cache. Keys are unique, so the order is exactly the (time,
/// sequence) order of a heap.
pub struct EventQueue<E> {
    /// `buckets[b]` holds keys whose highest bit differing from `last` is bit `b`.
    buckets: Vec<Vec<Entry<E>>>,
    /// Bit `b` set when `buckets[b]` is not empty.
    occupied: u128,
    /// Key of the last event popped.
    last: u128,
    len: usize,
    seq: u64,
    now: u64,
    popped: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

fn key_time(key: u128) -> u64 {
    (key >> 64) as u64
}

impl<E> EventQueue<E> {
    /// An empty queue at time 0.
    pub fn new() -> Self {
        Self {
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            occupied: 0,
            last: 0,
            len: 0,
            seq: 0,
            now: 0,
            popped: 0,
        }
    }

    fn push(&mut self, entry: Entry<E>) {
        // `entry.key > self.last`, so the xor is not zero.
        let b = (127 - (entry.key ^ self.last).leading_zeros()) as usize;
        self.buckets[b].push(entry);
        self.occupied |= 1 << b;
    }

    /// Schedules `event` at `at` ms (never before now: earlier times are clamped to now).
    pub fn schedule(&mut self, at: u64, event: E) {
        self.seq += 1;
        let key = (u128::from(at.max(self.now)) << 64) | u128::from(self.seq);
        self.push(Entry { key, event });
        self.len += 1;
    }

    /// The next event at or before `until`, advancing the clock to it.
    pub fn pop_until(&mut self, until: u64) -> Option<(u64, E)> {
        if self.occupied == 0 {
            return None;
        }
        let b = self.occupied.trailing_zeros() as usize;
        let bucket = &self.buckets[b];
        let mut m = 0;
        for (i, e) in bucket.iter().enumerate().skip(1) {
            if e.key < bucket[m].key {
                m = i;
            }
        }
        if key_time(bucket[m].key) > until {
            return None;
        }
        let mut bucket = std::mem::take(&mut self.buckets[b]);
        let top = bucket.swap_remove(m);
        self.occupied &= !(1 << b);
        self.last = top.key;
        // Everything else in the bucket shares the bits above `b` with the new last key and
        // is larger, so it lands in a lower bucket.
        for e in bucket.drain(..) {
            self.push(e);
        }
        self.buckets[b] = bucket;
        self.len -= 1;
        self.now = key_time(top.key);
        self.popped += 1;
        Some((self.now, top.event))
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
        self.len
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
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
    fn interleaved_schedules_and_pops_match_a_sorted_model() {
        // Events scheduled while popping, at or after the current time (like the market).
        let mut q = EventQueue::new();
        let mut model = std::collections::BTreeSet::new();
        let mut x: u64 = 7;
        let mut seq = 0u64;
        for step in 0..200_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if (x >> 60) < 9 || model.is_empty() {
                let spread = [0, 1, 1000, 1 << 20, 1 << 34][((x >> 8) % 5) as usize];
                let at = q.now() + if spread == 0 { 0 } else { (x >> 16) % spread };
                seq += 1;
                q.schedule(at, step);
                model.insert((at, seq, step));
            } else {
                let want = model.pop_first().map(|(at, _, e)| (at, e));
                assert_eq!(q.pop_until(u64::MAX), want);
                assert_eq!(q.len(), model.len());
            }
        }
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
