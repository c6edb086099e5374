//! Jobs (issue 46): the rules of the renter's scheduler over leases, pure. How an attempt's
//! end is judged (a provider fault is retried elsewhere with that provider excluded; a
//! non-zero exit is the user's and is retried only when its code is listed), what a task does
//! next, and the budget: every lease's possible spend counts before it is rented.
//!
//! The node's runner (`node/src/jobs/`) does the I/O and asks these functions what to do.

use gridlease_protocol::CloseReason;

use crate::money::{Money, MoneyError};

/// How one attempt (one lease) ended, as the renter's node saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptEnd {
    /// The lease closed for `reason`; `exit_code` is the container's, when it exited.
    Closed {
        /// Why the lease closed.
        reason: CloseReason,
        /// The container's exit code, if it ran and exited.
        exit_code: Option<i32>,
    },
    /// The provider refused the lease, or could not be reached to agree it.
    NotRented,
    /// The job was cancelled: the renter stopped the lease.
    Cancelled,
}

/// Whose the end of an attempt is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The command exited 0.
    Succeeded,
    /// The command exited non-zero: the user's error; retried only when `retry` (its code is
    /// listed in `retries.on_exit_codes`), on any provider.
    Exited {
        /// The exit code.
        code: i32,
        /// The code is listed for retries.
        retry: bool,
    },
    /// The provider's fault (vanished or closed the lease, the start or the GPU check failed,
    /// the task ran past its timeout): retried on another provider, this one excluded for the
    /// rest of the job.
    ProviderFault,
    /// Neither's: the renter's own node missed its part (it was offline past the grace period,
    /// say). Retried, the provider not excluded.
    RenterSide,
    /// The job was cancelled.
    Cancelled,
}

/// Judges an attempt's end. `retry_codes` are the spec's `retries.on_exit_codes`.
pub fn judge(end: AttemptEnd, retry_codes: &[i32]) -> Verdict {
    use CloseReason as R;
    match end {
        AttemptEnd::Cancelled => Verdict::Cancelled,
        AttemptEnd::NotRented => Verdict::ProviderFault,
        AttemptEnd::Closed { reason, exit_code } => match reason {
            R::ContainerExited => match exit_code {
                Some(0) => Verdict::Succeeded,
                Some(code) => Verdict::Exited {
                    code,
                    retry: retry_codes.contains(&code),
                },
                // Exited, but the code never reached the renter: the provider's to say.
                None => Verdict::ProviderFault,
            },
            // The lease's duration is the task's timeout, and its budget the cost of that
            // duration: either running out is the task timing out.
            R::Expired | R::BudgetExhausted => Verdict::ProviderFault,
            R::ProviderStop
            | R::ProviderUnreachable
            | R::OwnerReclaimed
            | R::StartFailed
            | R::GpuCheckFailed
            | R::ImplausibleUsage => Verdict::ProviderFault,
            R::RenterStop => Verdict::Cancelled,
            R::RenterUnreachable | R::PaymentLagging | R::BadReceipt => Verdict::RenterSide,
        },
    }
}

/// What a task does after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// The task is done.
    Succeeded,
    /// The task failed for good.
    Failed,
    /// Another attempt; `exclude` the provider of this one for the rest of the job.
    Retry {
        /// Exclude this attempt's provider.
        exclude: bool,
    },
    /// The job was cancelled.
    Cancelled,
}

/// What a task does after its `attempts`-th attempt (1-based) ended as `verdict`, with at most
/// `max_retries` attempts after the first.
pub fn next(verdict: Verdict, attempts: u32, max_retries: u32) -> Next {
    let left = attempts <= max_retries;
    match verdict {
        Verdict::Succeeded => Next::Succeeded,
        Verdict::Cancelled => Next::Cancelled,
        Verdict::Exited { retry: true, .. } if left => Next::Retry { exclude: false },
        Verdict::Exited { .. } => Next::Failed,
        Verdict::ProviderFault if left => Next::Retry { exclude: true },
        Verdict::RenterSide if left => Next::Retry { exclude: false },
        Verdict::ProviderFault | Verdict::RenterSide => Next::Failed,
    }
}

/// One lease of a job, for the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spend {
    /// A lease that may still be charged: its cap (the lease's budget; with a prepay, at most
    /// this is ever authorised).
    Open {
        /// The lease's budget cap.
        cap: Money,
    },
    /// A settled lease: what it cost.
    Settled {
        /// Its settled total.
        total: Money,
    },
}

/// The most the job's leases can cost: what settled ones cost plus every open one's cap.
pub fn exposure(leases: impl IntoIterator<Item = Spend>) -> Result<Money, MoneyError> {
    leases.into_iter().try_fold(Money::ZERO, |sum, s| match s {
        Spend::Open { cap } => sum.checked_add(cap),
        Spend::Settled { total } => sum.checked_add(total),
    })
}

/// Whether a lease capped at `cap` may be rented with the job's leases so far costing at most
/// `exposure`, under `budget` (`None`: no budget).
pub fn may_launch(budget: Option<Money>, exposure: Money, cap: Money) -> bool {
    match budget {
        None => true,
        Some(b) => exposure.checked_add(cap).is_ok_and(|total| total <= b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALL: [CloseReason; 13] = CloseReason::ALL;

    #[test]
    fn exits_are_the_users_and_retried_only_when_listed() {
        let exited = |code| AttemptEnd::Closed {
            reason: CloseReason::ContainerExited,
            exit_code: Some(code),
        };
        assert_eq!(judge(exited(0), &[3]), Verdict::Succeeded);
        assert_eq!(
            judge(exited(1), &[3]),
            Verdict::Exited {
                code: 1,
                retry: false
            }
        );
        assert_eq!(
            judge(exited(3), &[3]),
            Verdict::Exited {
                code: 3,
                retry: true
            }
        );
        assert_eq!(next(judge(exited(1), &[3]), 1, 5), Next::Failed);
        assert_eq!(
            next(judge(exited(3), &[3]), 1, 5),
            Next::Retry { exclude: false }
        );
        assert_eq!(next(judge(exited(3), &[3]), 6, 5), Next::Failed);
    }

    #[test]
    fn provider_faults_exclude_the_provider_and_stop_at_the_retry_limit() {
        for reason in [
            CloseReason::ProviderUnreachable,
            CloseReason::ProviderStop,
            CloseReason::StartFailed,
            CloseReason::GpuCheckFailed,
            CloseReason::Expired,
            CloseReason::OwnerReclaimed,
        ] {
            let v = judge(
                AttemptEnd::Closed {
                    reason,
                    exit_code: None,
                },
                &[],
            );
            assert_eq!(v, Verdict::ProviderFault, "{reason:?}");
            assert_eq!(next(v, 1, 1), Next::Retry { exclude: true });
            assert_eq!(next(v, 2, 1), Next::Failed);
        }
        assert_eq!(judge(AttemptEnd::NotRented, &[]), Verdict::ProviderFault);
        // A timed-out container is stopped with a signal: its code does not make it the user's.
        let timed_out = AttemptEnd::Closed {
            reason: CloseReason::Expired,
            exit_code: Some(137),
        };
        assert_eq!(judge(timed_out, &[137]), Verdict::ProviderFault);
    }

    #[test]
    fn the_renters_own_lapses_retry_without_excluding() {
        let v = judge(
            AttemptEnd::Closed {
                reason: CloseReason::RenterUnreachable,
                exit_code: None,
            },
            &[],
        );
        assert_eq!(v, Verdict::RenterSide);
        assert_eq!(next(v, 1, 3), Next::Retry { exclude: false });
        assert_eq!(
            next(judge(AttemptEnd::Cancelled, &[]), 1, 3),
            Next::Cancelled
        );
    }

    proptest! {
        /// Whatever the ends, a task never gets more than 1 + max_retries attempts, and only
        /// a provider fault excludes.
        #[test]
        fn attempts_are_bounded(
            ends in proptest::collection::vec((0usize..ALL.len(), proptest::option::of(0i32..4)), 1..40),
            max in 0u32..6,
            codes in proptest::collection::vec(1i32..4, 0..3),
        ) {
            let mut attempts = 0u32;
            for (r, code) in ends {
                attempts += 1;
                let v = judge(AttemptEnd::Closed { reason: ALL[r], exit_code: code }, &codes);
                match next(v, attempts, max) {
                    Next::Retry { exclude } => {
                        prop_assert!(attempts <= max);
                        prop_assert_eq!(exclude, v == Verdict::ProviderFault);
                    }
                    _ => break,
                }
            }
            prop_assert!(attempts <= max + 1);
        }

        /// Launching only while `may_launch` says so, with each lease settling at most at its
        /// cap, the job's total never passes the budget.
        #[test]
        fn spending_never_passes_the_budget(
            budget in 0u64..10_000_000,
            caps in proptest::collection::vec(1u64..3_000_000, 1..30),
            used in proptest::collection::vec(0u64..=100, 30),
        ) {
            let budget = Money::from_micros(budget);
            let mut leases: Vec<Spend> = Vec::new();
            for (i, cap) in caps.into_iter().enumerate() {
                let cap = Money::from_micros(cap);
                // Settle a lease launched earlier at some fraction of its cap.
                if let Some(Spend::Open { cap: c }) = leases.first().copied() {
                    leases[0] = Spend::Settled {
                        total: Money::from_micros(c.micros() * used[i] / 100),
                    };
                    leases.rotate_left(1);
                }
                let e = exposure(leases.iter().copied()).unwrap();
                if may_launch(Some(budget), e, cap) {
                    leases.push(Spend::Open { cap });
                }
                prop_assert!(exposure(leases.iter().copied()).unwrap() <= budget);
            }
        }
    }
}
