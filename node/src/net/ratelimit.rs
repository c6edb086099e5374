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

impl RateLimit {
    /// The pace for a sender whose messages receivers count with `self`: one token less of
    /// burst and a quarter longer per token, so messages that arrive bunched by the network
    /// (one delayed, the next not) still find a token at the receiver, up to a delay of a
    /// quarter of `per_token` plus one banked token. Pacing at exactly the receivers' rate
    /// loses a message whenever delivery jitter bunches two of them.
    pub fn with_headroom(self) -> Self {
        Self {
            burst: self.burst.saturating_sub(1).max(1),
            per_token: self.per_token.saturating_mul(5) / 4,
        }
    }
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

    /// A sender pacing with `pace` sends as fast as its tokens allow for 60 s; the network
    /// delays every other message by `jitter_ms`; a receiver counting with `recv` rejects how
    /// many?
    fn rejected(pace: RateLimit, recv: RateLimit, jitter_ms: u64) -> usize {
        let mut sender = RateLimiter::new(pace, 1);
        let mut arrivals = Vec::new();
        for t in 0..60_000u64 {
            if sender.check(&(), Timestamp(t)) {
                let delay = if arrivals.len() % 2 == 0 {
                    jitter_ms
                } else {
                    0
                };
                arrivals.push(t + delay);
            }
        }
        arrivals.sort_unstable();
        let mut receiver = RateLimiter::new(recv, 1);
        arrivals
            .into_iter()
            .filter(|t| !receiver.check(&(), Timestamp(*t)))
            .count()
    }

    #[test]
    fn a_sender_paced_with_headroom_survives_bunched_delivery() {
        let recv = RateLimit {
            burst: 5,
            per_token: Duration::from_millis(200),
        };
        // Delays of up to a quarter of a token interval bunch messages: at the receivers'
        // exact rate some are dropped, with the headroom none.
        for jitter in [10, 50, 100] {
            assert!(rejected(recv, recv, jitter) > 0, "jitter {jitter} ms");
            assert_eq!(
                rejected(recv.with_headroom(), recv, jitter),
                0,
                "jitter {jitter}"
            );
        }
        let h = recv.with_headroom();
        assert_eq!((h.burst, h.per_token), (4, Duration::from_millis(250)));
        let one = RateLimit {
            burst: 1,
            per_token: Duration::from_secs(1),
        };
        assert_eq!(one.with_headroom().burst, 1);
    }

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
