//! Reputation, two ways.
//!
//! **Local book** ([`ReputationBook`]): what one node concludes about a counterpart from the
//! leases it completed with it. Score: the mean of a Beta(good + 1, bad + 1) posterior, in
//! permille (a newcomer scores 500). Usage the renter's checks found implausible is fraud, not
//! bad luck: one such lease makes a counterpart untrusted for good. Whitewashing (rejoining
//! under a fresh identity) resets all of this, which is why [`TrustPolicy::trust_newcomers`]
//! exists.
//!
//! **Network score** ([`provider_scores`]): what every node computes alike from the co-signed
//! completions it has seen (`gridlease_protocol::completion`), so a renter can judge a provider
//! it never dealt with. The formula (also in `docs/reputation.md`):
//!
//! 1. Records are deduplicated by lease and taken in lease order (so sums, and so scores, are
//!    bit-identical on every node that holds the same records, whatever order they came in).
//! 2. A renter's **credit** with a provider is what it paid that provider in completed leases,
//!    capped at [`ScoreParams::credit_per_provider`].
//! 3. A renter's **standing** when provider `p` is scored is its credit with every *other*
//!    provider, over [`ScoreParams::established_paid`], at most 1. Paying yourself does not
//!    make you established: a key `p` made to rent from itself has standing 0 with `p`.
//! 4. Each record of `p` weighs the renter's standing `s`, plus a newcomer part
//!    `newcomer_weight x (1 - s)`, so honest first customers count a little; the newcomer parts
//!    of `p`'s *good* records together are scaled down to at most
//!    [`ScoreParams::newcomer_cap`]. Fresh keys, however many, add at most that cap; the
//!    newcomer parts of bad records are not capped (a record needs the provider's own
//!    signature, so nobody can fabricate another's failures), so made-up completions cannot
//!    dilute real failures either.
//! 5. Completed adds the weight to good, provider-failed to bad, disputed half to bad;
//!    renter-failed is not the provider's doing and adds nothing.
//! 6. Score = (good + prior_weight x prior_mean) / (good + bad + prior_weight): a provider with
//!    no records scores the prior mean.
//!
//! Limits (stated, not solved): standing is one hop. Colluding providers who rent from each
//! other with keys that paid real credit elsewhere are established; the cost of the attack is
//! that credit, paid to other providers for real GPU time. A ring that only pays itself is
//! bounded by the newcomer cap per provider. No seedless score is sybil-proof (Cheng and
//! Friedman 2005); a node that wants more can weigh its own experience first (the local book).
//! A provider can refuse to co-sign a failure; the renter keeps it in its local book.

use std::collections::BTreeMap;

use gridlease_protocol::CloseReason;
use gridlease_protocol::completion::{Completion, CompletionOutcome};
use gridlease_protocol::{LeaseId, LeaseTerms, Timestamp};

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
            | CloseReason::BudgetExhausted
            // The offer said the owner may take the GPU back (`Offer::interruptible`).
            | CloseReason::OwnerReclaimed => Self::Completed,
            CloseReason::ImplausibleUsage => Self::Fraud,
            CloseReason::ProviderStop
            | CloseReason::PaymentLagging
            | CloseReason::RenterUnreachable
            | CloseReason::ProviderUnreachable
            | CloseReason::BadReceipt
            | CloseReason::StartFailed
            // The renter's GPU check failed: a provider fault (its proof is in the record).
            | CloseReason::GpuCheckFailed => Self::Failed,
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

/// The record a settled lease leaves, as either side computes it from what both hold after the
/// settlement: the terms, the settled amount (what the last receipt pays for the usage: with a
/// prepay, less than the receipt's total) and the wall time of the provider's last usage
/// report (the renter has checked every report by then), and its own close reason.
pub fn completion_of(
    lease_id: LeaseId,
    terms: &LeaseTerms,
    settled: u64,
    last_wall_ms: u64,
    reason: CloseReason,
    closed_at: Timestamp,
) -> Completion {
    Completion {
        lease_id,
        provider: terms.provider,
        renter: terms.renter,
        gpu_seconds: last_wall_ms.saturating_mul(u64::from(terms.gpu_count)) / 1000,
        paid: settled,
        closed_at,
        outcome: CompletionOutcome::of_close(reason),
    }
}

/// What a renter signs when its provider proposes `proposed` and its own view of the lease is
/// `mine` ([`completion_of`] on the renter's side): the proposal when they agree, the proposal
/// marked `Disputed` when only the outcome differs (the closes disagree), and nothing, with the
/// reason, when the lease, the keys or the amounts differ. The provider's close time is its
/// own to state.
pub fn renter_answer(proposed: &Completion, mine: &Completion) -> Result<Completion, String> {
    let same = |a: &Completion, b: &Completion| {
        a.lease_id == b.lease_id
            && a.provider == b.provider
            && a.renter == b.renter
            && a.gpu_seconds == b.gpu_seconds
            && a.paid == b.paid
    };
    if !same(proposed, mine) {
        return Err(format!(
            "the record does not match this renter's (paid {} vs {}, GPU-seconds {} vs {})",
            proposed.paid, mine.paid, proposed.gpu_seconds, mine.gpu_seconds
        ));
    }
    let mut agreed = proposed.clone();
    if proposed.outcome != mine.outcome {
        agreed.outcome = CompletionOutcome::Disputed;
    }
    Ok(agreed)
}

/// One co-signed completion, as the network score reads it (`K`: a node's key, `L`: a lease
/// id). The node verifies the signatures before a record gets here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletionRecord<K, L> {
    /// The lease.
    pub lease: L,
    /// Its provider.
    pub provider: K,
    /// Its renter.
    pub renter: K,
    /// Paid, micro-units.
    pub paid: u64,
    /// How it ended.
    pub outcome: CompletionOutcome,
}

impl From<&Completion> for CompletionRecord<gridlease_protocol::PublicKey, LeaseId> {
    /// What the score reads of a (verified) co-signed record.
    fn from(c: &Completion) -> Self {
        Self {
            lease: c.lease_id,
            provider: c.provider,
            renter: c.renter,
            paid: c.paid,
            outcome: c.outcome,
        }
    }
}

/// The constants of [`provider_scores`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreParams {
    /// Credit a renter needs with other providers to weigh fully, micro-units.
    pub established_paid: u64,
    /// Most credit one provider gives a renter, micro-units.
    pub credit_per_provider: u64,
    /// Weight of a record from a renter with no standing.
    pub newcomer_weight: f64,
    /// Most weight the newcomer parts of one provider's good records add together.
    pub newcomer_cap: f64,
    /// The score of a provider with no records.
    pub prior_mean: f64,
    /// How many records' worth of weight the prior counts for.
    pub prior_weight: f64,
}

impl Default for ScoreParams {
    /// 1 GLU of credit with at least two other providers (0.5 GLU each) to be established;
    /// a newcomer's record weighs 0.02, all of them together at most 0.5 (half an established
    /// renter's record); prior 0.5 worth two records.
    fn default() -> Self {
        Self {
            established_paid: 1_000_000,
            credit_per_provider: 500_000,
            newcomer_weight: 0.02,
            newcomer_cap: 0.5,
            prior_mean: 0.5,
            prior_weight: 2.0,
        }
    }
}

/// A provider's network score and the counts behind it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProviderScore {
    /// The score, 0..=1.
    pub score: f64,
    /// Completed records (a plain count: fresh keys inflate it; the score does not follow).
    pub completed: u32,
    /// Provider-failed records.
    pub failed: u32,
    /// Renter-failed records.
    pub renter_failed: u32,
    /// Disputed records.
    pub disputed: u32,
    /// Distinct renters.
    pub renters: u32,
    /// Total weight of the records (what the score rests on beside the prior).
    pub weight: f64,
}

impl ScoreParams {
    /// The score of a provider with these weighed good and bad totals.
    pub fn score(&self, good: f64, bad: f64) -> f64 {
        (good + self.prior_weight * self.prior_mean) / (good + bad + self.prior_weight)
    }
}

/// Every provider's network score from `records` (see the module documentation). The same
/// records, in any order and with any duplicates, give bit-identical scores.
pub fn provider_scores<K: Ord + Clone, L: Ord + Clone>(
    records: &[CompletionRecord<K, L>],
    params: &ScoreParams,
) -> BTreeMap<K, ProviderScore> {
    // 1. One record per lease, in lease order.
    let mut by_lease: BTreeMap<&L, &CompletionRecord<K, L>> = BTreeMap::new();
    for r in records {
        by_lease.entry(&r.lease).or_insert(r);
    }
    let records: Vec<&CompletionRecord<K, L>> = by_lease.into_values().collect();
    // 2. Credit per (renter, provider).
    let mut credit: BTreeMap<(&K, &K), u64> = BTreeMap::new();
    for r in &records {
        if r.outcome == CompletionOutcome::Completed {
            let c = credit.entry((&r.renter, &r.provider)).or_insert(0);
            *c = c.saturating_add(r.paid).min(params.credit_per_provider);
        }
    }
    let mut total: BTreeMap<&K, u64> = BTreeMap::new();
    for ((renter, _), c) in &credit {
        let t = total.entry(*renter).or_insert(0);
        *t = t.saturating_add(*c);
    }
    // 3.-5. Per provider: established and newcomer parts of good and bad.
    struct Acc<'a, K> {
        good: f64,
        bad: f64,
        new_good: f64,
        new_bad: f64,
        counts: ProviderScore,
        renters: std::collections::BTreeSet<&'a K>,
    }
    let mut acc: BTreeMap<&K, Acc<'_, K>> = BTreeMap::new();
    for r in &records {
        let own = credit.get(&(&r.renter, &r.provider)).copied().unwrap_or(0);
        let elsewhere = total.get(&r.renter).copied().unwrap_or(0) - own;
        let standing = if params.established_paid == 0 {
            1.0
        } else {
            (elsewhere as f64 / params.established_paid as f64).min(1.0)
        };
        let newcomer = params.newcomer_weight * (1.0 - standing);
        let a = acc.entry(&r.provider).or_insert_with(|| Acc {
            good: 0.0,
            bad: 0.0,
            new_good: 0.0,
            new_bad: 0.0,
            counts: ProviderScore::default(),
            renters: std::collections::BTreeSet::new(),
        });
        a.renters.insert(&r.renter);
        let (good, bad) = match r.outcome {
            CompletionOutcome::Completed => {
                a.counts.completed += 1;
                (1.0, 0.0)
            }
            CompletionOutcome::ProviderFailed => {
                a.counts.failed += 1;
                (0.0, 1.0)
            }
            CompletionOutcome::Disputed => {
                a.counts.disputed += 1;
                (0.0, 0.5)
            }
            CompletionOutcome::RenterFailed => {
                a.counts.renter_failed += 1;
                (0.0, 0.0)
            }
        };
        a.good += good * standing;
        a.bad += bad * standing;
        a.new_good += good * newcomer;
        a.new_bad += bad * newcomer;
    }
    acc.into_iter()
        .map(|(k, a)| {
            let new_good = a.new_good.min(params.newcomer_cap);
            let (good, bad) = (a.good + new_good, a.bad + a.new_bad);
            let mut s = a.counts;
            s.score = params.score(good, bad);
            s.weight = good + bad;
            s.renters = u32::try_from(a.renters.len()).unwrap_or(u32::MAX);
            (k.clone(), s)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        lease: u32,
        provider: u32,
        renter: u32,
        paid: u64,
        outcome: CompletionOutcome,
    ) -> CompletionRecord<u32, u32> {
        CompletionRecord {
            lease,
            provider,
            renter,
            paid,
            outcome,
        }
    }

    /// Renter 100 is established: it paid providers 1 and 2 their full credit.
    fn established() -> Vec<CompletionRecord<u32, u32>> {
        vec![
            rec(1, 1, 100, 600_000, CompletionOutcome::Completed),
            rec(2, 2, 100, 600_000, CompletionOutcome::Completed),
        ]
    }

    #[test]
    fn one_honest_completion_outweighs_any_number_of_self_made_renters() {
        let p = ScoreParams::default();
        // Provider 7 rents to itself from 10 fresh keys (1000..1010), paying itself a lot.
        let mut sybil = established();
        for k in 0..10 {
            sybil.push(rec(
                100 + k,
                7,
                1000 + k,
                50_000_000,
                CompletionOutcome::Completed,
            ));
        }
        let s_sybil = provider_scores(&sybil, &p)[&7];
        // Provider 8: one completion from the established renter.
        let mut honest = established();
        honest.push(rec(50, 8, 100, 100_000, CompletionOutcome::Completed));
        let s_honest = provider_scores(&honest, &p)[&8];
        let prior = p.prior_mean;
        assert!(
            s_sybil.score - prior < s_honest.score - prior,
            "{s_sybil:?} {s_honest:?}"
        );
        // The numbers docs/reputation.md quotes.
        assert!((s_sybil.score - 0.5454).abs() < 1e-3, "{}", s_sybil.score);
        assert!((s_honest.score - 0.6667).abs() < 1e-3, "{}", s_honest.score);
        // A thousand fresh keys gain no more than the newcomer cap allows.
        let mut many = established();
        for k in 0..1000 {
            many.push(rec(100 + k, 7, 1000 + k, 1, CompletionOutcome::Completed));
        }
        let s_many = provider_scores(&many, &p)[&7];
        assert!((s_many.score - p.score(p.newcomer_cap, 0.0)).abs() < 1e-9);
        assert!(s_many.score < s_honest.score);
        assert_eq!(s_many.completed, 1000);
    }

    #[test]
    fn made_up_completions_do_not_dilute_failures() {
        let p = ScoreParams::default();
        // Provider 7 failed 20 newcomers (renters 200..220, no standing).
        let mut v: Vec<CompletionRecord<u32, u32>> = (0..20)
            .map(|k| rec(500 + k, 7, 200 + k, 0, CompletionOutcome::ProviderFailed))
            .collect();
        let failed = provider_scores(&v, &p)[&7].score;
        for k in 0..1000 {
            v.push(rec(
                1000 + k,
                7,
                10_000 + k,
                1,
                CompletionOutcome::Completed,
            ));
        }
        let flooded = provider_scores(&v, &p)[&7];
        // The made-up completions add at most the newcomer cap to good; the failures' weight
        // (20 newcomer parts of 0.02) stays whole instead of being scaled down with them.
        assert!((flooded.weight - (p.newcomer_cap + 20.0 * p.newcomer_weight)).abs() < 1e-9);
        assert!((flooded.score - p.score(p.newcomer_cap, 20.0 * p.newcomer_weight)).abs() < 1e-9);
        assert!(
            failed < 0.5 && flooded.score < 0.52,
            "{failed} -> {flooded:?}"
        );
    }

    #[test]
    fn outcomes_move_the_score_the_way_they_should() {
        let p = ScoreParams::default();
        let base = established();
        let with = |o| {
            let mut v = base.clone();
            v.push(rec(9, 1, 100, 1, o));
            provider_scores(&v, &p)[&1]
        };
        let before = provider_scores(&base, &p)[&1];
        // Renter 100's record with provider 1 weighs by its credit with provider 2 (0.5 GLU):
        // standing 0.5.
        assert!(
            (before.score - p.score(0.5 + 0.01, 0.0)).abs() < 1e-9,
            "{before:?}"
        );
        assert!(with(CompletionOutcome::Completed).score > before.score);
        assert!(with(CompletionOutcome::ProviderFailed).score < before.score);
        assert!(with(CompletionOutcome::Disputed).score < before.score);
        assert!(
            with(CompletionOutcome::Disputed).score > with(CompletionOutcome::ProviderFailed).score
        );
        assert_eq!(with(CompletionOutcome::RenterFailed).score, before.score);
        assert_eq!(with(CompletionOutcome::RenterFailed).renter_failed, 1);
        assert!(provider_scores::<u32, u32>(&[], &p).is_empty());
    }

    proptest::proptest! {
        /// The same records in any order, with duplicates, give bit-identical scores, each in
        /// 0..=1: what lets every node agree.
        #[test]
        fn scores_do_not_depend_on_order_or_duplicates(
            raw in proptest::collection::vec((0u32..40, 0u32..6, 0u32..12, 0u64..2_000_000, 0u8..4), 0..80),
            seed in proptest::prelude::any::<u64>(),
        ) {
            let outcome = |o: u8| match o {
                0 => CompletionOutcome::Completed,
                1 => CompletionOutcome::ProviderFailed,
                2 => CompletionOutcome::RenterFailed,
                _ => CompletionOutcome::Disputed,
            };
            // A lease has one record: its id decides the rest.
            let mut seen = BTreeMap::new();
            for (lease, prov, renter, paid, o) in raw {
                seen.entry(lease).or_insert(rec(lease, prov, 100 + renter, paid, outcome(o)));
            }
            let records: Vec<_> = seen.into_values().collect();
            let p = ScoreParams::default();
            let a = provider_scores(&records, &p);
            let mut shuffled = records.clone();
            shuffled.extend(records.iter().take(5).cloned());
            let mut x = seed;
            for i in (1..shuffled.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                shuffled.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let b = provider_scores(&shuffled, &p);
            proptest::prop_assert_eq!(a.len(), b.len());
            for (k, s) in &a {
                proptest::prop_assert_eq!(s.score.to_bits(), b[k].score.to_bits());
                proptest::prop_assert!((0.0..=1.0).contains(&s.score));
            }
        }

        /// However many fresh keys a provider rents to itself from, and whatever they pay, it
        /// gains less than from one completion by an established renter.
        #[test]
        fn fresh_keys_never_buy_an_established_renters_weight(n in 1u32..300, paid in 0u64..100_000_000) {
            let p = ScoreParams::default();
            let mut v = established();
            for k in 0..n {
                v.push(rec(100 + k, 7, 10_000 + k, paid, CompletionOutcome::Completed));
            }
            let sybil = provider_scores(&v, &p)[&7].score;
            let mut h = established();
            h.push(rec(50, 8, 100, 1, CompletionOutcome::Completed));
            let honest = provider_scores(&h, &p)[&8].score;
            proptest::prop_assert!(sybil < honest, "{} fresh keys: {} vs {}", n, sybil, honest);
        }
    }

    #[test]
    fn a_renter_signs_what_it_agrees_with_and_disputes_only_the_outcome() {
        let c = |paid, outcome| Completion {
            lease_id: LeaseId(gridlease_protocol::Digest([1; 32])),
            provider: gridlease_protocol::PublicKey([2; 32]),
            renter: gridlease_protocol::PublicKey([3; 32]),
            gpu_seconds: 60,
            paid,
            closed_at: Timestamp(5),
            outcome,
        };
        let done = c(10, CompletionOutcome::Completed);
        assert_eq!(renter_answer(&done, &done).unwrap(), done);
        let mine = c(10, CompletionOutcome::ProviderFailed);
        assert_eq!(
            renter_answer(&done, &mine).unwrap().outcome,
            CompletionOutcome::Disputed
        );
        assert!(renter_answer(&c(11, CompletionOutcome::Completed), &done).is_err());
        let mut later = done.clone();
        later.closed_at = Timestamp(99);
        assert_eq!(renter_answer(&later, &done).unwrap(), later);
    }

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
