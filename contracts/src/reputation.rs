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
//! 7. GPU checks (proof of GPU, issue 44; each record's [`GpuCheck`]): a failed check closed
//!    the lease `GpuCheckFailed`, so its record is provider-failed and weighs in step 5 like
//!    any other failure (disputed, half, when the renter disputed the provider's account);
//!    nothing more. [`ProviderScore::checks_passed`] and [`ProviderScore::checks_failed`]
//!    count the records' checks plainly, like `completed`: shown and searchable
//!    (`verified>=N`), not weighed, so fresh keys inflate them as they inflate `completed`.
//!
//! Limits (stated, not solved): standing is one hop. Colluding providers who rent from each
//! other with keys that paid real credit elsewhere are established; the cost of the attack is
//! that credit, paid to other providers for real GPU time. A ring that only pays itself is
//! bounded by the newcomer cap per provider. No seedless score is sybil-proof (Cheng and
//! Friedman 2005); a node that wants more can weigh its own experience first (the local book).
//! A provider can refuse to co-sign a failure; the renter keeps it in its local book (and a
//! failed GPU check's transcript in its own `lease_proofs`), not network-wide.

use std::collections::BTreeMap;

use gridlease_protocol::CloseReason;
use gridlease_protocol::completion::{Completion, CompletionOutcome, GpuCheck};
use gridlease_protocol::proof::{ProofRecord, ProofReport};
use gridlease_protocol::{LeaseId, LeaseTerms, Timestamp, WireMessage as _};

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
/// report (the renter has checked every report by then), its own close reason, and the GPU
/// check as its own record shows it ([`gpu_check_of`]).
pub fn completion_of(
    lease_id: LeaseId,
    terms: &LeaseTerms,
    settled: u64,
    last_wall_ms: u64,
    reason: CloseReason,
    closed_at: Timestamp,
    gpu_check: GpuCheck,
) -> Completion {
    Completion {
        lease_id,
        provider: terms.provider,
        renter: terms.renter,
        gpu_seconds: last_wall_ms.saturating_mul(u64::from(terms.gpu_count)) / 1000,
        paid: settled,
        closed_at,
        outcome: CompletionOutcome::of_close(reason),
        gpu_check,
    }
}

/// The GPU check a lease records, as either side computes it from its own kept check record
/// (`kept`: the node's `lease_proofs` row of the lease) and its close reason, by the same rule:
///
/// - a lease that closed `GpuCheckFailed` failed its check, whatever was kept (a pass whose
///   co-signature never reached the renter closes it so, and both sides record the failure);
/// - a kept record passed when the renter's report says so *and* the provider co-signed it
///   (`ProofRecord::ack`); any other kept record failed;
/// - nothing kept: no check ran (terms without a verification window, `verify_window_s` 0, or
///   a lease that ended before its check did).
pub fn gpu_check_of(kept: Option<&ProofRecord>, reason: CloseReason) -> GpuCheck {
    if reason == CloseReason::GpuCheckFailed {
        return GpuCheck::Failed;
    }
    match kept {
        None => GpuCheck::NotRun,
        Some(r) => {
            let passed = r.ack.is_some()
                && ProofReport::decode_payload(&r.report.envelope().payload)
                    .is_ok_and(|rep| rep.verdict.passed());
            if passed {
                GpuCheck::Passed
            } else {
                GpuCheck::Failed
            }
        }
    }
}

/// What a renter signs when its provider proposes `proposed` and its own view of the lease is
/// `mine` ([`completion_of`] on the renter's side): the proposal when they agree; when the
/// outcome or the GPU check differs (the closes or the check records disagree), the proposal
/// with the renter's own GPU check, marked `Disputed`; and nothing, with the reason, when the
/// lease, the keys or the amounts differ. The provider's close time is its own to state.
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
    if proposed.outcome != mine.outcome || proposed.gpu_check != mine.gpu_check {
        agreed.outcome = CompletionOutcome::Disputed;
        agreed.gpu_check = mine.gpu_check;
    }
    Ok(agreed)
}

/// Whether `agreed`, what the renter signed, is a version of the provider's `proposed` the
/// provider signs too: the same record, or the same marked `Disputed` with the renter's GPU
/// check ([`renter_answer`]).
pub fn acceptable_answer(proposed: &Completion, agreed: &Completion) -> bool {
    agreed == proposed
        || *agreed
            == (Completion {
                outcome: CompletionOutcome::Disputed,
                gpu_check: agreed.gpu_check,
                ..proposed.clone()
            })
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
    /// The renter's GPU check of the lease.
    pub gpu_check: GpuCheck,
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
            gpu_check: c.gpu_check,
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
    /// Records whose GPU check passed, co-signed (a plain count, like `completed`: what
    /// search's `verified` reads).
    pub checks_passed: u32,
    /// Records whose GPU check failed (each also a provider-failed or disputed record, weighed
    /// in the score as such).
    pub checks_failed: u32,
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
        match r.gpu_check {
            GpuCheck::Passed => a.counts.checks_passed += 1,
            GpuCheck::Failed => a.counts.checks_failed += 1,
            GpuCheck::NotRun => {}
        }
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
            gpu_check: GpuCheck::NotRun,
        }
    }

    /// A record with a GPU check.
    fn checked(
        lease: u32,
        provider: u32,
        renter: u32,
        outcome: CompletionOutcome,
        gpu_check: GpuCheck,
    ) -> CompletionRecord<u32, u32> {
        CompletionRecord {
            gpu_check,
            ..rec(lease, provider, renter, 100_000, outcome)
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
            raw in proptest::collection::vec((0u32..40, 0u32..6, 0u32..12, 0u64..2_000_000, 0u8..4, 0u8..3), 0..80),
            seed in proptest::prelude::any::<u64>(),
        ) {
            let outcome = |o: u8| match o {
                0 => CompletionOutcome::Completed,
                1 => CompletionOutcome::ProviderFailed,
                2 => CompletionOutcome::RenterFailed,
                _ => CompletionOutcome::Disputed,
            };
            let check = |c: u8| match c {
                0 => GpuCheck::NotRun,
                1 => GpuCheck::Passed,
                _ => GpuCheck::Failed,
            };
            // A lease has one record: its id decides the rest.
            let mut seen = BTreeMap::new();
            for (lease, prov, renter, paid, o, c) in raw {
                seen.entry(lease).or_insert(CompletionRecord {
                    gpu_check: check(c),
                    ..rec(lease, prov, 100 + renter, paid, outcome(o))
                });
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
                // The counts follow the (deduplicated) records, whatever their order.
                let count = |o: Option<CompletionOutcome>, c: Option<GpuCheck>| {
                    records
                        .iter()
                        .filter(|r| r.provider == *k)
                        .filter(|r| o.is_none_or(|o| r.outcome == o))
                        .filter(|r| c.is_none_or(|c| r.gpu_check == c))
                        .count() as u32
                };
                proptest::prop_assert_eq!(s.checks_passed, count(None, Some(GpuCheck::Passed)));
                proptest::prop_assert_eq!(s.checks_failed, count(None, Some(GpuCheck::Failed)));
                proptest::prop_assert_eq!(s.completed, count(Some(CompletionOutcome::Completed), None));
                proptest::prop_assert_eq!(s.failed, count(Some(CompletionOutcome::ProviderFailed), None));
                proptest::prop_assert_eq!(
                    (s.checks_passed, s.checks_failed, s.completed, s.failed, s.disputed, s.renters),
                    (b[k].checks_passed, b[k].checks_failed, b[k].completed, b[k].failed, b[k].disputed, b[k].renters)
                );
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
    fn gpu_checks_are_counted_and_a_failed_one_weighs_as_a_provider_failure() {
        let p = ScoreParams::default();
        let base = established();
        let mut v = base.clone();
        v.push(checked(
            10,
            1,
            100,
            CompletionOutcome::Completed,
            GpuCheck::Passed,
        ));
        v.push(checked(
            11,
            1,
            100,
            CompletionOutcome::Completed,
            GpuCheck::Passed,
        ));
        v.push(checked(
            12,
            1,
            100,
            CompletionOutcome::ProviderFailed,
            GpuCheck::Failed,
        ));
        v.push(checked(
            13,
            1,
            100,
            CompletionOutcome::Disputed,
            GpuCheck::Failed,
        ));
        let s = provider_scores(&v, &p)[&1];
        assert_eq!((s.checks_passed, s.checks_failed), (2, 2));
        assert_eq!((s.completed, s.failed, s.disputed), (3, 1, 1));
        // The score reads the outcomes only: the same records without their checks score
        // bit for bit the same (a failed check is its provider-failed record, nothing more).
        let plain: Vec<_> = v
            .iter()
            .map(|r| CompletionRecord {
                gpu_check: GpuCheck::NotRun,
                ..r.clone()
            })
            .collect();
        let without = provider_scores(&plain, &p)[&1];
        assert_eq!(s.score.to_bits(), without.score.to_bits());
        assert_eq!((without.checks_passed, without.checks_failed), (0, 0));
        // A duplicate of a record (the same lease) counts once.
        v.push(v[2].clone());
        assert_eq!(provider_scores(&v, &p)[&1], s);
        // Other providers' checks are theirs.
        assert_eq!(provider_scores(&v, &p)[&2].checks_passed, 0);
    }

    #[test]
    fn the_gpu_check_follows_the_kept_record_and_the_close() {
        use gridlease_protocol::proof::{
            ProofAck, ProofBackend, ProofChallenge, ProofFailure, ProofParams, ProofTiming,
            ProofVerdict,
        };
        use gridlease_protocol::{Digest, NetworkId, NodeKey, Signed};
        let (net, r, pk) = (
            NetworkId::devnet(),
            NodeKey::from_secret([1; 32]),
            NodeKey::from_secret([2; 32]),
        );
        let lease_id = LeaseId(Digest([9; 32]));
        let record = |verdict: ProofVerdict, acked: bool| {
            let challenge = ProofChallenge {
                lease_id,
                params: ProofParams {
                    n: 64,
                    gemms: 1,
                    rows: 4,
                    open_rows: 1,
                    vram_bytes: 4096,
                    page_bytes: 4096,
                    open_pages: 1,
                    limit_ms: 1000,
                },
                backend: ProofBackend::CpuReference,
                seed: [3; 32],
                reveal_hash: Digest([4; 32]),
                sent_at: Timestamp(1),
            };
            let report = ProofReport {
                lease_id,
                challenge: Digest([5; 32]),
                commit: None,
                reveal: [6; 32],
                opening: None,
                timing: ProofTiming {
                    rtt_ms: 1,
                    commit_ms: 2,
                    open_ms: 3,
                    check_cpu_ms: 4,
                },
                verdict,
                decided_at: Timestamp(2),
            };
            let report = Signed::sign(&r, &net, &report).unwrap();
            let ack = ProofAck {
                lease_id,
                report: gridlease_protocol::proof::envelope_hash(&report),
            };
            ProofRecord {
                challenge: Signed::sign(&r, &net, &challenge).unwrap(),
                commit: None,
                opening: None,
                report,
                ack: acked.then(|| Signed::sign(&pk, &net, &ack).unwrap()),
            }
        };
        let failed = ProofVerdict::Failed(ProofFailure::NoAnswer {
            step: "commit".into(),
        });
        let passed = record(ProofVerdict::Passed, true);
        assert_eq!(
            gpu_check_of(Some(&passed), CloseReason::Expired),
            GpuCheck::Passed
        );
        // A pass without the provider's co-signature is no pass.
        assert_eq!(
            gpu_check_of(
                Some(&record(ProofVerdict::Passed, false)),
                CloseReason::Expired
            ),
            GpuCheck::Failed
        );
        assert_eq!(
            gpu_check_of(Some(&record(failed, false)), CloseReason::GpuCheckFailed),
            GpuCheck::Failed
        );
        // The close decides over a kept pass (its co-signature never reached the renter).
        assert_eq!(
            gpu_check_of(Some(&passed), CloseReason::GpuCheckFailed),
            GpuCheck::Failed
        );
        assert_eq!(
            gpu_check_of(None, CloseReason::GpuCheckFailed),
            GpuCheck::Failed
        );
        // Nothing kept: no check ran (no window, or the lease ended before one finished).
        assert_eq!(gpu_check_of(None, CloseReason::Expired), GpuCheck::NotRun);
        assert_eq!(
            gpu_check_of(None, CloseReason::RenterUnreachable),
            GpuCheck::NotRun
        );
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
            gpu_check: GpuCheck::NotRun,
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
        assert!(acceptable_answer(&done, &done));
        assert!(acceptable_answer(
            &done,
            &renter_answer(&done, &mine).unwrap()
        ));
        // The GPU checks differ: the renter signs its own, disputed; the provider accepts
        // that, and nothing else.
        let passed = Completion {
            gpu_check: GpuCheck::Passed,
            ..done.clone()
        };
        let answer = renter_answer(&passed, &done).unwrap();
        assert_eq!(
            (answer.outcome, answer.gpu_check),
            (CompletionOutcome::Disputed, GpuCheck::NotRun)
        );
        assert!(acceptable_answer(&passed, &answer));
        assert!(!acceptable_answer(&passed, &done), "not marked disputed");
        let other = Completion {
            paid: 11,
            ..answer.clone()
        };
        assert!(!acceptable_answer(&passed, &other));
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
