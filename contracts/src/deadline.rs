//! When a lease's container is signalled: the deadline rule.
//!
//! **The rule**: a lease that runs to its end gets SIGTERM at `deadline - grace` and SIGKILL at
//! the `deadline` itself, so the container never runs past the time the renter pays for,
//! whatever the tenant does with SIGTERM. A lease stopped earlier (renter's close, payment
//! lagging, the provider's stop) gets SIGTERM now and SIGKILL `grace` later, but never after
//! the deadline. The deadline is `started_at + duration_s` ([`crate::Lease::deadline`]).
//!
//! Pure: `now` and the deadline are parameters. The node's provider session and the watchdog
//! process that outlives the node both follow the same [`StopSchedule`].

use gridlease_protocol::Timestamp;

/// When to send SIGTERM and SIGKILL to a lease's container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopSchedule {
    /// SIGTERM (the tenant's chance to shut down cleanly).
    pub term_at: Timestamp,
    /// SIGKILL if still running; never after the lease's deadline.
    pub kill_at: Timestamp,
}

impl StopSchedule {
    /// A lease that runs to its end: SIGTERM at `deadline - grace_ms`, SIGKILL at `deadline`.
    pub fn at_deadline(deadline: Timestamp, grace_ms: u64) -> Self {
        Self {
            term_at: Timestamp(deadline.0.saturating_sub(grace_ms)),
            kill_at: deadline,
        }
    }

    /// A lease stopped at `now`: SIGTERM now, SIGKILL after `grace_ms` or at the deadline,
    /// whichever comes first (past the deadline: both now).
    pub fn early(now: Timestamp, deadline: Timestamp, grace_ms: u64) -> Self {
        let term_at = now.min(deadline);
        Self {
            term_at,
            kill_at: now.plus_ms(grace_ms).min(deadline).max(term_at),
        }
    }

    /// Whether the lease has reached the time to be stopped for its deadline.
    pub fn expired(deadline: Timestamp, grace_ms: u64, now: Timestamp) -> bool {
        now >= Self::at_deadline(deadline, grace_ms).term_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn at_the_deadline_sigterm_comes_grace_before_and_sigkill_at_it() {
        let d = Timestamp(10_000);
        assert_eq!(
            StopSchedule::at_deadline(d, 2_000),
            StopSchedule {
                term_at: Timestamp(8_000),
                kill_at: d
            }
        );
        // A grace longer than the lease: SIGTERM at once.
        assert_eq!(StopSchedule::at_deadline(d, 20_000).term_at, Timestamp(0));
        assert!(!StopSchedule::expired(d, 2_000, Timestamp(7_999)));
        assert!(StopSchedule::expired(d, 2_000, Timestamp(8_000)));
    }

    #[test]
    fn an_early_stop_gets_the_grace_unless_the_deadline_comes_first() {
        let d = Timestamp(10_000);
        assert_eq!(
            StopSchedule::early(Timestamp(3_000), d, 2_000),
            StopSchedule {
                term_at: Timestamp(3_000),
                kill_at: Timestamp(5_000)
            }
        );
        assert_eq!(
            StopSchedule::early(Timestamp(9_000), d, 2_000),
            StopSchedule {
                term_at: Timestamp(9_000),
                kill_at: d
            }
        );
        // Past the deadline (a node that came back late): both times have passed, both go now.
        assert_eq!(
            StopSchedule::early(Timestamp(12_000), d, 2_000),
            StopSchedule {
                term_at: d,
                kill_at: d
            }
        );
    }

    proptest! {
        /// SIGKILL is never after the deadline and never before SIGTERM.
        #[test]
        fn sigkill_never_after_the_deadline(
            now in 0u64..1_000_000, deadline in 0u64..1_000_000, grace in 0u64..100_000,
        ) {
            let (now, d) = (Timestamp(now), Timestamp(deadline));
            for s in [StopSchedule::at_deadline(d, grace), StopSchedule::early(now, d, grace)] {
                prop_assert!(s.kill_at <= d);
                prop_assert!(s.term_at <= s.kill_at);
            }
            let e = StopSchedule::early(now, d, grace);
            prop_assert!(e.term_at <= now);
            prop_assert!(e.kill_at.0 <= now.0.saturating_add(grace));
        }
    }
}
