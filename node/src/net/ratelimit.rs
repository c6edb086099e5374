//! Per-key token buckets with a bounded number of keys. Pure: time is passed in.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use gridlease_protocol::Timestamp;

/// Bucket parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// Most tokens a key can bank.
    pub burst: u32,
    /// One token is refilled every `per_token`.
    pub per_token: Duration,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Tokens in milli-tokens, so refill needs no floats.
    milli: u64,
    last: Timestamp,
}

/// Token buckets keyed by `K`, at most `max_keys` of them (full buckets are forgotten first,
/// then the stalest).
#[derive(Debug)]
pub struct RateLimiter<K> {
    limit: RateLimit,
    max_keys: usize,
    buckets: HashMap<K, Bucket>,
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    /// A limiter remembering at most `max_keys` keys.
    pub fn new(limit: RateLimit, max_keys: usize) -> Self {
        Self {
            limit,
            max_keys: max_keys.max(1),
            buckets: HashMap::new(),
        }
    }

    fn cap(&self) -> u64 {
        u64::from(self.limit.burst) * 1000
    }

    fn refill(&self, b: &mut Bucket, now: Timestamp) {
        let per_ms = u64::try_from(self.limit.per_token.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let elapsed = now.ms_since(b.last);
        let add = elapsed.saturating_mul(1000) / per_ms;
        if add > 0 {
            b.milli = b.milli.saturating_add(add).min(self.cap());
            b.last = now;
        }
    }

    /// Takes one token for `key` at `now`; false when the key is over its rate.
    pub fn check(&mut self, key: &K, now: Timestamp) -> bool {
        if !self.buckets.contains_key(key) && self.buckets.len() >= self.max_keys {
            self.shrink(now);
        }
        let cap = self.cap();
        let mut bucket = self.buckets.get(key).copied().unwrap_or(Bucket {
            milli: cap,
            last: now,
        });
        self.refill(&mut bucket, now);
        let ok = bucket.milli >= 1000;
        if ok {
            bucket.milli -= 1000;
        }
        self.buckets.insert(key.clone(), bucket);
        ok
    }

    fn shrink(&mut self, now: Timestamp) {
        let cap = self.cap();
        let limit = self.limit;
        let per_ms = u64::try_from(limit.per_token.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        // Forget buckets that would be full again: they carry no information.
        self.buckets.retain(|_, b| {
            let refilled = b
                .milli
                .saturating_add(now.ms_since(b.last).saturating_mul(1000) / per_ms);
            refilled < cap
        });
        if self.buckets.len() >= self.max_keys
            && let Some(oldest) = self
                .buckets
                .iter()
                .min_by_key(|(_, b)| b.last)
                .map(|(k, _)| k.clone())
        {
            self.buckets.remove(&oldest);
        }
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// True when no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refill() {
        let mut r = RateLimiter::new(
            RateLimit {
                burst: 3,
                per_token: Duration::from_secs(1),
            },
            10,
        );
        let t = Timestamp(1_000_000);
        assert!(r.check(&1, t));
        assert!(r.check(&1, t));
        assert!(r.check(&1, t));
        assert!(!r.check(&1, t));
        assert!(r.check(&2, t), "keys are independent");
        assert!(!r.check(&1, t.plus_ms(500)));
        assert!(r.check(&1, t.plus_ms(1600)));
    }

    #[test]
    fn key_count_is_bounded() {
        let mut r = RateLimiter::new(
            RateLimit {
                burst: 1,
                per_token: Duration::from_secs(60),
            },
            4,
        );
        for k in 0..100u32 {
            r.check(&k, Timestamp(u64::from(k)));
        }
        assert!(r.len() <= 4);
    }
}
