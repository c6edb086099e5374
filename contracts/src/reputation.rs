//! Local reputation: what one node concludes about a counterpart from the leases it completed
//! with it. No gossip, no global score: each node keeps its own book.
//!
//! Score: the mean of a Beta(good + 1, bad + 1) posterior, in permille (a newcomer scores 500).
//! Usage the renter's checks found implausible is fraud, not bad luck: one such lease makes a
//! counterpart untrusted for good. Whitewashing (rejoining under a fresh identity) resets all of
//! this, which is why [`TrustPolicy::trust_newcomers`] exists.

use std::collections::BTreeMap;

use gridlease_protocol::CloseReason;

/// How a lease ended, from the scoring node's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Ran to the agreed end (or was stopped by its renter) and settled.
    Completed,
    /// The counterpart failed it (crash, vanished, stopped paying).
    Failed,
    /// The counterpart's usage reports were refused as implausible.
    Fraud,
}

impl Outcome {
    /// The outcome a lease that closed for `reason` means for the provider's reputation.
    pub fn for_provider(reason: CloseReason) -> Self {
        match reason {
            CloseReason::Expired
            | CloseReason::RenterStop
            | CloseReason::ContainerExited
            | CloseReason::BudgetExhausted => Self::Completed,
            CloseReason::ImplausibleUsage => Self::Fraud,
            CloseReason::ProviderStop
            | CloseReason::PaymentLagging
            | CloseReason::RenterUnreachable
            | CloseReason::ProviderUnreachable
            | CloseReason::BadReceipt
            | CloseReason::StartFailed => Self::Failed,
        }
    }
}

/// One counterpart's record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Score {
    /// Completed leases.
    pub good: u32,
    /// Failed leases.
    pub bad: u32,
    /// Leases with refused (implausible) usage.
    pub fraud: u32,
}

impl Score {
    /// Adds one lease's outcome.
    pub fn record(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Completed => self.good = self.good.saturating_add(1),
            Outcome::Failed => self.bad = self.bad.saturating_add(1),
            Outcome::Fraud => self.fraud = self.fraud.saturating_add(1),
        }
    }

    /// Leases seen.
    pub fn count(&self) -> u64 {
        u64::from(self.good) + u64::from(self.bad) + u64::from(self.fraud)
    }

    /// Beta-posterior mean of "completes a lease", permille; fraud counts as failure.
    pub fn permille(&self) -> u16 {
        let good = u64::from(self.good) + 1;
        let all = self.count() + 2;
        u16::try_from(good * 1000 / all).unwrap_or(1000)
    }
}

/// When a node is willing to deal with a counterpart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrustPolicy {
    /// Lowest acceptable score, permille.
    pub min_permille: u16,
    /// Whether counterparts with no history are acceptable.
    pub trust_newcomers: bool,
}

impl TrustPolicy {
    /// Whether `score` is acceptable.
    pub fn accepts(&self, score: &Score) -> bool {
        if score.fraud > 0 {
            return false;
        }
        if score.count() == 0 {
            return self.trust_newcomers;
        }
        score.permille() >= self.min_permille
    }
}

/// A node's local book of scores, keyed by counterpart identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReputationBook<K: Ord> {
    scores: BTreeMap<K, Score>,
}

impl<K: Ord> ReputationBook<K> {
    /// An empty book.
    pub fn new() -> Self {
        Self {
            scores: BTreeMap::new(),
        }
    }

    /// Records one lease with `who`.
    pub fn record(&mut self, who: K, outcome: Outcome) {
        self.scores.entry(who).or_default().record(outcome);
    }

    /// The score of `who` (empty for a stranger).
    pub fn score(&self, who: &K) -> Score {
        self.scores.get(who).copied().unwrap_or_default()
    }

    /// Whether `policy` accepts `who`.
    pub fn trusts(&self, who: &K, policy: &TrustPolicy) -> bool {
        policy.accepts(&self.score(who))
    }

    /// Counterparts known.
    pub fn len(&self) -> usize {
        self.scores.len()
    }

    /// Whether nobody is known.
    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newcomer_scores_half_and_history_moves_it() {
        let mut s = Score::default();
        assert_eq!(s.permille(), 500);
        s.record(Outcome::Completed);
        s.record(Outcome::Completed);
        assert_eq!(s.permille(), 750);
        s.record(Outcome::Failed);
        assert_eq!(s.permille(), 600);
    }

    #[test]
    fn fraud_is_never_forgiven() {
        let policy = TrustPolicy {
            min_permille: 100,
            trust_newcomers: true,
        };
        let mut book = ReputationBook::new();
        for _ in 0..100 {
            book.record(7u32, Outcome::Completed);
        }
        assert!(book.trusts(&7, &policy));
        book.record(7, Outcome::Fraud);
        assert!(!book.trusts(&7, &policy));
        assert!(book.trusts(&8, &policy));
        let strict = TrustPolicy {
            trust_newcomers: false,
            ..policy
        };
        assert!(!book.trusts(&8, &strict));
    }

    #[test]
    fn close_reasons_map_to_outcomes() {
        assert_eq!(
            Outcome::for_provider(CloseReason::Expired),
            Outcome::Completed
        );
        assert_eq!(
            Outcome::for_provider(CloseReason::ImplausibleUsage),
            Outcome::Fraud
        );
        assert_eq!(
            Outcome::for_provider(CloseReason::ProviderUnreachable),
            Outcome::Failed
        );
    }
}
