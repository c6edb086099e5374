//! Amending a running lease (`gridlease extend`): a longer duration and the budget cap that goes
//! with it, proposed by the renter, accepted by the provider, each side signing the identical
//! [`LeaseAmendment`].
//!
//! **What changes**: only `duration_s` and `max_total` of the terms ([`amended_terms`]). The
//! lease id stays the hash of the original terms; the price, GPUs, image and every other term
//! stay. Amendments of a lease are numbered 1, 2, ... ([`Lease::extensions`] is the last one
//! accepted), so a replayed or skipped one is refused.
//!
//! **The budget cap** rises by what the added time costs ([`raised_cap`]): a cap that was the
//! default (the cost of the whole duration, or of the minimum billed time if longer) becomes the
//! default for the new duration, and a cap the renter chose tighter or looser keeps its margin.
//! A renter may name a higher cap instead; never a lower one than the current cap.
//!
//! **When**: only while the lease runs ([`LeaseState::can_amend`]), and no later than
//! [`AMEND_MARGIN_MS`] before the container's SIGTERM time (`deadline - grace`,
//! [`StopSchedule::at_deadline`]): once the stop has begun nothing moves it.
//!
//! **The provider's conditions** ([`check_amendment`]): the new duration within its offer's
//! `max_duration_s`, and the lease's GPUs still offered. The GPUs are held for the lease's real
//! life (until its container is gone), so a running lease needs no new hold to run longer.
//!
//! Pure: `now`, the offer's limits and the stop grace are parameters.

use gridlease_protocol::{
    AmendAccept, AmendRefusal, LeaseAmendment, LeaseTerms, PublicKey, Shape, Timestamp,
};

use crate::billing::default_budget;
use crate::deadline::StopSchedule;
use crate::lease::Lease;
use crate::money::{Money, MoneyError};

/// The latest an amendment may be accepted: this long before the container's SIGTERM time, so
/// that the node's session and the watchdog process both learn the new deadline before either
/// acts on the old one.
pub const AMEND_MARGIN_MS: u64 = 1_000;

/// What the provider offers now, as far as an amendment is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OfferLimits {
    /// The longest lease its current offer accepts, seconds.
    pub max_duration_s: u32,
    /// Every GPU of the lease is still in the current offer.
    pub gpus_offered: bool,
}

/// The terms after `a`: its duration and budget cap, everything else as before.
pub fn amended_terms(terms: &LeaseTerms, a: &LeaseAmendment) -> LeaseTerms {
    LeaseTerms {
        duration_s: a.duration_s,
        max_total: a.max_total,
        ..terms.clone()
    }
}

/// The budget cap for `new_duration_s` under `terms`: the current cap plus what the added time
/// costs (both durations counted at least the minimum billed time). Checked arithmetic.
pub fn raised_cap(terms: &LeaseTerms, new_duration_s: u32) -> Result<Money, MoneyError> {
    let price = Money::from_micros(terms.price_per_gpu_hour);
    let budget = |d: u32| default_budget(d, terms.min_billed_s, terms.gpu_count, price);
    let before = budget(terms.duration_s)?;
    let after = budget(new_duration_s)?;
    Money::from_micros(terms.max_total).checked_add(after.saturating_sub(before))
}

/// The checks both sides make of the next amendment of `lease` (its terms as amended so far):
/// the lease runs, the sequence is the next one, the duration is longer, the cap is not lower,
/// and the amended lease is still billable without overflow.
pub fn check_next(lease: &Lease, a: &LeaseAmendment) -> Result<(), AmendRefusal> {
    a.check_shape().map_err(|e| AmendRefusal::Malformed {
        detail: e.to_string(),
    })?;
    if a.lease_id != lease.id {
        return Err(AmendRefusal::Malformed {
            detail: format!("the amendment is for lease {}", a.lease_id),
        });
    }
    if !lease.state.can_amend() {
        return Err(AmendRefusal::NotRunning {
            state: lease.state.as_str().to_string(),
        });
    }
    let expected = lease.extensions.saturating_add(1);
    if a.seq != expected {
        return Err(AmendRefusal::BadSequence { expected });
    }
    let t = &lease.terms;
    if a.duration_s <= t.duration_s {
        return Err(AmendRefusal::NotLonger {
            current_s: t.duration_s,
        });
    }
    if a.max_total < t.max_total {
        return Err(AmendRefusal::BudgetLowered {
            current: t.max_total,
        });
    }
    default_budget(
        a.duration_s,
        t.min_billed_s,
        t.gpu_count,
        Money::from_micros(t.price_per_gpu_hour),
    )
    .map_err(|_| AmendRefusal::Malformed {
        detail: "the amended lease's cost overflows".into(),
    })?;
    Ok(())
}

impl Lease {
    /// Applies an accepted amendment (a longer duration and its budget cap) if it is the next
    /// one and the lease runs ([`check_next`]); a refused one changes nothing.
    /// Not a state transition: the lease keeps running, to a later deadline.
    ///
    /// Defined here, not in [`crate::lease`], so that the state machine does not depend on the
    /// amendment rules (no import cycle between the two modules).
    pub fn amend(&mut self, a: &LeaseAmendment) -> Result<(), AmendRefusal> {
        check_next(self, a)?;
        self.terms = amended_terms(&self.terms, a);
        self.extensions = a.seq;
        Ok(())
    }
}

/// The renter's next amendment of `lease`: `add_s` more seconds, and the cap `max_total` (by
/// default the [`raised_cap`]). Refused locally, with the reason the provider would give, when
/// [`check_next`] refuses it.
pub fn propose(
    lease: &Lease,
    add_s: u32,
    max_total: Option<Money>,
    now: Timestamp,
) -> Result<LeaseAmendment, AmendRefusal> {
    let t = &lease.terms;
    let too_long = || AmendRefusal::Malformed {
        detail: "the amended duration is too long".into(),
    };
    let duration_s = t.duration_s.checked_add(add_s).ok_or_else(too_long)?;
    let max_total = match max_total {
        Some(m) => m,
        None => raised_cap(t, duration_s).map_err(|_| too_long())?,
    };
    let a = LeaseAmendment {
        lease_id: lease.id,
        seq: lease.extensions.saturating_add(1),
        duration_s,
        max_total: max_total.micros(),
        created_at: now,
    };
    check_next(lease, &a)?;
    Ok(a)
}

/// The provider's decision on a verified amendment from `signer` at `now`: [`check_next`], the
/// renter's signature, the offer's limits (`None`: the provider offers nothing now) and the
/// time left before the stop begins (`stop_grace_ms`: its SIGTERM-to-SIGKILL grace).
pub fn check_amendment(
    lease: &Lease,
    a: &LeaseAmendment,
    signer: &PublicKey,
    offer: Option<OfferLimits>,
    stop_grace_ms: u64,
    now: Timestamp,
) -> Result<(), AmendRefusal> {
    if signer != &lease.terms.renter {
        return Err(AmendRefusal::BadSignature);
    }
    check_next(lease, a)?;
    let deadline = lease.deadline().ok_or_else(|| AmendRefusal::NotRunning {
        state: "not started".into(),
    })?;
    let term_at = StopSchedule::at_deadline(deadline, stop_grace_ms).term_at;
    if now.plus_ms(AMEND_MARGIN_MS) >= term_at {
        return Err(AmendRefusal::TooLate { deadline });
    }
    let offer = match offer {
        Some(o) if o.gpus_offered => o,
        _ => return Err(AmendRefusal::NotOffered),
    };
    if a.duration_s > offer.max_duration_s {
        return Err(AmendRefusal::BeyondMaxDuration {
            max_s: offer.max_duration_s,
        });
    }
    Ok(())
}

/// Why a renter refuses a provider's acceptance of its amendment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmendAcceptError {
    /// Signed by someone other than the lease's provider.
    #[error("the acceptance is signed by {signer}, not by the lease's provider")]
    WrongSigner {
        /// Who signed it.
        signer: PublicKey,
    },
    /// The accepted amendment differs from the proposed one.
    #[error("the provider accepted another amendment than the one proposed")]
    Differs,
}

/// The renter's check of a verified acceptance from `signer` of its amendment `proposed`.
pub fn check_acceptance(
    proposed: &LeaseAmendment,
    accept: &AmendAccept,
    signer: &PublicKey,
    provider: &PublicKey,
) -> Result<(), AmendAcceptError> {
    if signer != provider {
        return Err(AmendAcceptError::WrongSigner { signer: *signer });
    }
    if &accept.amendment != proposed {
        return Err(AmendAcceptError::Differs);
    }
    Ok(())
}

/// A refusal in words, for the renter (the CLI prints it).
pub fn refusal_text(r: &AmendRefusal) -> String {
    match r {
        AmendRefusal::NotRunning { state } => {
            format!("the lease is not running ({state}): only a running lease can be extended")
        }
        AmendRefusal::TooLate { deadline } => format!(
            "too late: the lease ends at {deadline} and its container is already being stopped"
        ),
        AmendRefusal::BadSequence { expected } => {
            format!("out of order: the next extension of this lease is number {expected}")
        }
        AmendRefusal::NotLonger { current_s } => {
            format!("the new duration must be longer than the current {current_s} s")
        }
        AmendRefusal::BeyondMaxDuration { max_s } => {
            format!("the provider's offer allows leases of at most {max_s} s")
        }
        AmendRefusal::BudgetLowered { current } => format!(
            "the budget cap cannot be lowered below the current {}",
            Money::from_micros(*current)
        ),
        AmendRefusal::NotOffered => {
            "the provider no longer offers this lease's GPUs, so it does not extend it".into()
        }
        AmendRefusal::BadSignature => "the extension is not signed by the lease's renter".into(),
        AmendRefusal::Malformed { detail } => format!("the extension is malformed: {detail}"),
        AmendRefusal::Internal => {
            "the provider could not record the extension; nothing changed (try again)".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::billing::cost;
    use crate::lease::{Actor, LeaseEvent, LeaseState};
    use gridlease_protocol::fixtures::{self, T0};
    use gridlease_protocol::{CloseReason, Digest, LeaseId, NodeKey, OfferId};
    use proptest::prelude::*;

    const GRACE_MS: u64 = 2_000;

    /// 1000 micro-units per GPU-second (3.60/GPU-hour), 1 GPU, 600 s, minimum billed 60 s,
    /// running since T0.
    fn running() -> (Lease, PublicKey, PublicKey) {
        let p = NodeKey::from_secret([1; 32]).public();
        let r = NodeKey::from_secret([2; 32]).public();
        let offer = fixtures::offer(p, 1, 1, 3_600_000);
        let mut terms = fixtures::terms(OfferId(Digest([3; 32])), &offer, r, 1, 600);
        terms.min_billed_s = 60;
        terms.max_total = 600_000;
        let mut l = Lease::propose(terms.lease_id().unwrap(), terms);
        for e in [
            LeaseEvent::Accept,
            LeaseEvent::BeginStart,
            LeaseEvent::Started,
        ] {
            l.apply(e, Actor::Provider, T0).unwrap();
        }
        (l, p, r)
    }

    fn offer(max_duration_s: u32) -> Option<OfferLimits> {
        Some(OfferLimits {
            max_duration_s,
            gpus_offered: true,
        })
    }

    #[test]
    fn an_extension_adds_the_cost_of_the_added_time_to_the_cap() {
        let (l, _, _) = running();
        let a = propose(&l, 300, None, T0.plus_secs(10)).unwrap();
        assert_eq!((a.seq, a.duration_s, a.max_total), (1, 900, 900_000));
        // A renter's own tighter cap keeps its margin: 100 below the lease's cost stays 100 below.
        let mut tight = l.clone();
        tight.terms.max_total = 599_900;
        assert_eq!(propose(&tight, 300, None, T0).unwrap().max_total, 899_900);
        // A lease shorter than its minimum billed time: only time beyond the minimum costs more.
        let mut short = l.clone();
        short.terms.duration_s = 20;
        short.terms.max_total = 60_000;
        assert_eq!(propose(&short, 30, None, T0).unwrap().max_total, 60_000);
        assert_eq!(propose(&short, 50, None, T0).unwrap().max_total, 70_000);
        // An explicit cap is the renter's, but never below the current one.
        let own = propose(&l, 300, Some(Money::from_micros(2_000_000)), T0).unwrap();
        assert_eq!(own.max_total, 2_000_000);
        assert_eq!(
            propose(&l, 300, Some(Money::from_micros(1)), T0),
            Err(AmendRefusal::BudgetLowered { current: 600_000 })
        );
    }

    #[test]
    fn the_provider_accepts_a_next_longer_amendment_within_its_offer() {
        let (mut l, _, r) = running();
        let a = propose(&l, 300, None, T0.plus_secs(10)).unwrap();
        assert_eq!(
            check_amendment(&l, &a, &r, offer(3600), GRACE_MS, T0.plus_secs(10)),
            Ok(())
        );
        l.amend(&a).unwrap();
        assert_eq!(l.extensions, 1);
        assert_eq!(l.terms.duration_s, 900);
        assert_eq!(l.terms.max_total, 900_000);
        assert_eq!(l.deadline(), Some(T0.plus_secs(900)));
        // The id is still the hash of the original terms.
        assert_ne!(l.terms.lease_id().unwrap(), l.id);
        // A second one follows with sequence 2.
        let b = propose(&l, 60, None, T0.plus_secs(20)).unwrap();
        assert_eq!((b.seq, b.duration_s, b.max_total), (2, 960, 960_000));
        assert_eq!(
            check_amendment(&l, &b, &r, offer(3600), GRACE_MS, T0.plus_secs(20)),
            Ok(())
        );
    }

    #[test]
    fn refusals_name_their_reason_and_change_nothing() {
        let (l, p, r) = running();
        let now = T0.plus_secs(10);
        let a = propose(&l, 300, None, now).unwrap();
        let check = |lease: &Lease, a: &LeaseAmendment, signer: &PublicKey, o, at| {
            let before = lease.clone();
            let got = check_amendment(lease, a, signer, o, GRACE_MS, at);
            assert_eq!(lease, &before);
            got
        };
        // Beyond the offer's longest lease.
        assert_eq!(
            check(&l, &a, &r, offer(899), now),
            Err(AmendRefusal::BeyondMaxDuration { max_s: 899 })
        );
        // Not signed by the renter.
        assert_eq!(
            check(&l, &a, &p, offer(3600), now),
            Err(AmendRefusal::BadSignature)
        );
        // Sequence replayed or skipped.
        for seq in [0, 2, 7] {
            let bad = LeaseAmendment { seq, ..a.clone() };
            let got = check(&l, &bad, &r, offer(3600), now);
            if seq == 0 {
                assert!(
                    matches!(got, Err(AmendRefusal::Malformed { .. })),
                    "{got:?}"
                );
            } else {
                assert_eq!(got, Err(AmendRefusal::BadSequence { expected: 1 }));
            }
        }
        // Not longer; a lower cap; another lease.
        let same = LeaseAmendment {
            duration_s: 600,
            ..a.clone()
        };
        assert_eq!(
            check(&l, &same, &r, offer(3600), now),
            Err(AmendRefusal::NotLonger { current_s: 600 })
        );
        let lower = LeaseAmendment {
            max_total: 599_999,
            ..a.clone()
        };
        assert_eq!(
            check(&l, &lower, &r, offer(3600), now),
            Err(AmendRefusal::BudgetLowered { current: 600_000 })
        );
        let other = LeaseAmendment {
            lease_id: LeaseId(Digest([9; 32])),
            ..a.clone()
        };
        assert!(matches!(
            check(&l, &other, &r, offer(3600), now),
            Err(AmendRefusal::Malformed { .. })
        ));
        // Not offering these GPUs any more, or nothing at all.
        let withdrawn = Some(OfferLimits {
            max_duration_s: 3600,
            gpus_offered: false,
        });
        assert_eq!(
            check(&l, &a, &r, withdrawn, now),
            Err(AmendRefusal::NotOffered)
        );
        assert_eq!(check(&l, &a, &r, None, now), Err(AmendRefusal::NotOffered));
        // Too late: within the margin before SIGTERM (600 s - 2 s grace - 1 s margin).
        let late = T0.plus_ms(600_000 - GRACE_MS - AMEND_MARGIN_MS);
        assert_eq!(
            check(&l, &a, &r, offer(3600), late),
            Err(AmendRefusal::TooLate {
                deadline: T0.plus_secs(600)
            })
        );
        assert_eq!(
            check(&l, &a, &r, offer(3600), Timestamp(late.0 - 1)),
            Ok(())
        );
    }

    #[test]
    fn only_a_running_lease_is_amended() {
        let (running, _, r) = running();
        let a = propose(&running, 60, None, T0).unwrap();
        let mut starting = running.clone();
        starting.state = LeaseState::Starting;
        starting.started_at = None;
        assert_eq!(
            check_amendment(&starting, &a, &r, offer(3600), GRACE_MS, T0),
            Err(AmendRefusal::NotRunning {
                state: "starting".into()
            })
        );
        let mut closing = running.clone();
        closing
            .apply(
                LeaseEvent::Close(CloseReason::RenterStop),
                Actor::Renter,
                T0.plus_secs(5),
            )
            .unwrap();
        assert_eq!(
            propose(&closing, 60, None, T0),
            Err(AmendRefusal::NotRunning {
                state: "closing".into()
            })
        );
        let mut copy = closing.clone();
        assert!(copy.amend(&a).is_err());
        assert_eq!(copy, closing, "a refused amendment changes nothing");
    }

    #[test]
    fn an_acceptance_must_be_the_providers_signature_over_the_same_amendment() {
        let (l, p, r) = running();
        let a = propose(&l, 60, None, T0).unwrap();
        let accept = AmendAccept {
            amendment: a.clone(),
            deadline: T0.plus_secs(660),
            accepted_at: T0,
        };
        assert_eq!(check_acceptance(&a, &accept, &p, &p), Ok(()));
        assert_eq!(
            check_acceptance(&a, &accept, &r, &p),
            Err(AmendAcceptError::WrongSigner { signer: r })
        );
        let other = AmendAccept {
            amendment: LeaseAmendment {
                max_total: a.max_total + 1,
                ..a.clone()
            },
            ..accept
        };
        assert_eq!(
            check_acceptance(&a, &other, &p, &p),
            Err(AmendAcceptError::Differs)
        );
    }

    #[test]
    fn every_refusal_has_a_sentence() {
        for r in [
            AmendRefusal::NotRunning {
                state: "closing".into(),
            },
            AmendRefusal::TooLate {
                deadline: Timestamp(1),
            },
            AmendRefusal::BadSequence { expected: 2 },
            AmendRefusal::NotLonger { current_s: 60 },
            AmendRefusal::BeyondMaxDuration { max_s: 86_400 },
            AmendRefusal::BudgetLowered { current: 1 },
            AmendRefusal::NotOffered,
            AmendRefusal::BadSignature,
            AmendRefusal::Malformed { detail: "x".into() },
            AmendRefusal::Internal,
        ] {
            let text = refusal_text(&r);
            assert!(text.len() > 10 && !text.ends_with('.'), "{text}");
        }
        assert!(refusal_text(&AmendRefusal::BeyondMaxDuration { max_s: 86_400 }).contains("86400"));
    }

    proptest! {
        /// However a lease is extended, the default cap is exactly the cost of the new duration
        /// (at least the minimum billed time) when the old cap was that cost for the old one,
        /// and it never goes down.
        #[test]
        fn default_caps_follow_the_duration(
            duration in 1u32..100_000,
            adds in proptest::collection::vec(1u32..10_000, 1..8),
            micros in 0u64..100_000_000,
            gpus in 1u16..8,
            min_billed in 0u32..600,
        ) {
            let (mut l, _, _) = running();
            l.terms.duration_s = duration;
            l.terms.gpu_count = gpus;
            l.terms.price_per_gpu_hour = micros;
            l.terms.min_billed_s = min_billed;
            let price = Money::from_micros(micros);
            l.terms.max_total = cost(u64::from(duration.max(min_billed)), gpus, price).unwrap().micros();
            for add in adds {
                let before = l.terms.max_total;
                let a = propose(&l, add, None, T0).unwrap();
                l.amend(&a).unwrap();
                prop_assert!(l.terms.max_total >= before);
                let full = cost(u64::from(l.terms.duration_s.max(min_billed)), gpus, price).unwrap();
                prop_assert_eq!(l.terms.max_total, full.micros());
            }
        }
    }
}
