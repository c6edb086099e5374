//! Time for the node. Rules (`contracts`) take `now` as a parameter; the node reads it here.
//!
//! - [`now`] is the wall clock, read only at the edges (network loop, CLI, API).
//! - [`Clock`] is what lease sessions, renter-silence detection and GPU holds read, injected
//!   through the lease service's config: [`SystemClock`] in a daemon, [`ManualClock`] in tests
//!   of grace periods and expiry, which then advance time instead of sleeping.
//!
//! Timers (`tokio::time`) still pace the loops (how often a session looks); every decision
//! about *whether* a period has passed compares [`Clock::now`] values, so a test that advances
//! a [`ManualClock`] sees the decision at the next tick.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use gridlease_protocol::Timestamp;

/// Unix time in milliseconds.
pub fn now() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    Timestamp(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// A source of the current time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Unix time in milliseconds.
    fn now(&self) -> Timestamp;
}

/// A clock shared by the lease service and its sessions.
pub type SharedClock = Arc<dyn Clock>;

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        now()
    }
}

/// The system clock as a [`SharedClock`].
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

/// A clock that follows the wall clock plus an offset that only tests move forward: time
/// never stands still for the parts of the node that pace themselves with real timers, and
/// [`ManualClock::advance`] jumps it ahead (a grace period passes at once).
#[derive(Debug, Default)]
pub struct ManualClock {
    offset_ms: AtomicU64,
}

impl ManualClock {
    /// A clock equal to the wall clock until advanced.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Moves this clock `ms` milliseconds ahead.
    pub fn advance(&self, ms: u64) {
        self.offset_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        now().plus_ms(self.offset_ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_jumps_when_advanced_and_never_goes_back() {
        let c = ManualClock::new();
        let a = c.now();
        c.advance(60_000);
        let b = c.now();
        assert!(b.ms_since(a) >= 60_000);
        assert!(c.now() >= b);
    }
}
