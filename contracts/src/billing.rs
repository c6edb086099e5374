//! Per-second billing.
//!
//! **The rounding rule** (the only one): the amount due after `s` whole seconds of use is
//! `floor(price_per_gpu_hour x gpus x s / 3600)` micro-units, computed exactly in 128-bit
//! integers. Meters run in milliseconds; billable seconds are the whole seconds elapsed
//! (`wall_ms / 1000`, rounded down). The charge for any interval is the difference of the
//! cumulative amounts at its ends, so charges of consecutive intervals always add up to the
//! charge of the whole span: rounding never accumulates, and neither side gains from how a lease
//! is cut into reports.
//!
//! **The duration cap**: a lease bills at most its `duration_s` of wall time, and GPU time at
//! most that wall time x the leased GPUs ([`Tariff::cap`]); nothing beyond the duration is ever
//! due ([`Tariff::due`], [`Tariff::final_due`]). A container that outlives its deadline (killed
//! late, or a node that came back late) is still billed exactly the lease, never more.
//!
//! **Owner reclaims**: a lease the provider's owner took back pays the seconds it ran, not the
//! minimum ([`minimum_waived`]).
//!
//! **Failed starts**: a start that fails on the renter's image (the pull failed, stalled or
//! timed out, or the pulled image was refused) costs the minimum billed duration
//! ([`Tariff::failed_start_fee`], `min_billed_s` of the offer), so a renter cannot make a
//! provider pull gigabytes again and again for free. A failure on the provider's side (no
//! container runtime, its database, creating or starting the container) costs nothing
//! ([`start_failure_is_billed`]).

use gridlease_protocol::{CloseReason, LeaseTerms, StartFailureKind};

use crate::money::{Money, MoneyError};

/// Seconds per hour.
const HOUR_S: u128 = 3600;

/// `floor(price_per_gpu_hour x gpus x seconds / 3600)`, or an overflow error.
#[inline]
pub fn cost(seconds: u64, gpus: u16, price_per_gpu_hour: Money) -> Result<Money, MoneyError> {
    // Asked at every usage report (several times): the usual product fits 64 bits, where the
    // checks are two multiplies' overflow flags and the division a multiply.
    if let Some(p) = price_per_gpu_hour
        .micros()
        .checked_mul(u64::from(gpus))
        .and_then(|r| r.checked_mul(seconds))
    {
        return Ok(Money::from_micros(p / HOUR_S as u64));
    }
    // price x gpus < 2^80 always fits; x seconds may not, hence checked.
    let product = (u128::from(price_per_gpu_hour.micros()) * u128::from(gpus))
        .checked_mul(u128::from(seconds))
        .ok_or(MoneyError::Overflow)?;
    // Same quotient; a 64-bit division by a constant is a multiply, a 128-bit one a call.
    let micros = match u64::try_from(product) {
        Ok(p) => u128::from(p / HOUR_S as u64),
        Err(_) => product / HOUR_S,
    };
    u64::try_from(micros)
        .map(Money::from_micros)
        .map_err(|_| MoneyError::Overflow)
}

/// **The default budget cap** of a lease whose renter names none: the cost of the whole
/// duration, or of the minimum billed time if that is longer,
/// `cost(max(duration_s, min_billed_s), gpus, price_per_gpu_hour)`. The renter's node proposes
/// it (`gridlease rent` without `--max-total`), the simulator's renters ask for it, and an
/// extension raises a cap by the difference of two of them ([`crate::amend::raised_cap`]).
/// An overflow error where that cost does not fit.
pub fn default_budget(
    duration_s: u32,
    min_billed_s: u32,
    gpus: u16,
    price_per_gpu_hour: Money,
) -> Result<Money, MoneyError> {
    cost(
        u64::from(duration_s.max(min_billed_s)),
        gpus,
        price_per_gpu_hour,
    )
}

/// The charge for usage between cumulative second `from_s` and `to_s` (`to_s >= from_s`).
pub fn interval_charge(
    from_s: u64,
    to_s: u64,
    gpus: u16,
    price_per_gpu_hour: Money,
) -> Result<Money, MoneyError> {
    let to = cost(to_s, gpus, price_per_gpu_hour)?;
    let from = cost(from_s, gpus, price_per_gpu_hour)?;
    to.checked_sub(from)
}

/// Whole billable seconds in `wall_ms` milliseconds.
pub const fn billable_seconds(wall_ms: u64) -> u64 {
    wall_ms / 1000
}

/// The price schedule of one lease, taken from its terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tariff {
    /// Price per GPU-hour (a volume lease's: per GiB-hour).
    pub price_per_gpu_hour: Money,
    /// GPUs leased (a volume lease's: its GiB).
    pub gpus: u16,
    /// Minimum billed seconds, applied at settlement.
    pub min_billed_s: u32,
    /// Budget cap: nothing beyond it is ever due.
    pub max_total: Money,
    /// Most wall milliseconds billed: the lease's duration (`duration_s x 1000`).
    pub max_wall_ms: u64,
    /// Seconds of use the renter pays ahead of the reports (`LeaseTerms::prepay_s`).
    pub prepay_s: u32,
}

/// Metered time as the lease bills it (see [`Tariff::cap`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BilledTime {
    /// Wall milliseconds.
    pub wall_ms: u64,
    /// GPU milliseconds (wall x GPUs).
    pub gpu_ms: u64,
}

impl Tariff {
    /// The tariff of a lease.
    pub fn of(terms: &LeaseTerms) -> Self {
        // A volume lease counts its GiB where a lease counts GPUs (`crate::volume`).
        let (price, units) = match &terms.volume {
            Some(v) => (
                v.price_per_gib_hour,
                u16::try_from(v.size_gib).unwrap_or(u16::MAX),
            ),
            None => (terms.price_per_gpu_hour, terms.gpu_count),
        };
        Self {
            price_per_gpu_hour: Money::from_micros(price),
            gpus: units,
            min_billed_s: terms.min_billed_s,
            max_total: Money::from_micros(terms.max_total),
            max_wall_ms: u64::from(terms.duration_s).saturating_mul(1000),
            prepay_s: terms.prepay_s,
        }
    }

    /// What a receipt pays when `due` is due (the renter's rule, see
    /// [`crate::channel::RenterChannel`]): `due` plus the cost of the prepaid seconds, capped
    /// at the budget. With no prepay this is `due` (capped): payment in arrears. A prepay of
    /// at least the lease's duration pays the whole budget.
    #[inline]
    pub fn receipt_total(&self, due: Money) -> Money {
        if self.prepay_s == 0 {
            // Payment in arrears (the window of no seconds costs nothing).
            return due.min(self.max_total);
        }
        let ahead_ms = u64::from(self.prepay_s).saturating_mul(1000);
        if ahead_ms >= self.max_wall_ms && self.prepay_s > 0 {
            return self.max_total;
        }
        let ahead = self
            .window_cost(u64::from(self.prepay_s))
            .unwrap_or(self.max_total);
        due.checked_add(ahead)
            .unwrap_or(self.max_total)
            .min(self.max_total)
    }

    /// What the renter may lose to a provider that vanishes after a receipt: the prepaid
    /// amount beyond what is due ([`Tariff::receipt_total`] minus `due`).
    pub fn prepaid_beyond(&self, due: Money) -> Money {
        self.receipt_total(due).saturating_sub(due)
    }

    /// What the terms allow to be billed of `metered` time: wall time at most the lease's
    /// duration, GPU time at most that wall time x the leased GPUs. A provider applies this to
    /// every report, so no report claims more than the lease allows.
    pub fn cap(&self, metered: BilledTime) -> BilledTime {
        let wall_ms = metered.wall_ms.min(self.max_wall_ms);
        BilledTime {
            wall_ms,
            gpu_ms: metered
                .gpu_ms
                .min(wall_ms.saturating_mul(u64::from(self.gpus))),
        }
    }

    /// Due while running, for `wall_ms` of use so far: per-second cost of at most the lease's
    /// duration, capped at the budget.
    #[inline]
    pub fn due(&self, wall_ms: u64) -> Result<Money, MoneyError> {
        let c = cost(
            billable_seconds(wall_ms.min(self.max_wall_ms)),
            self.gpus,
            self.price_per_gpu_hour,
        )?;
        Ok(c.min(self.max_total))
    }

    /// Due at settlement: like [`Tariff::due`] but never below the minimum billed duration.
    #[inline]
    pub fn final_due(&self, wall_ms: u64) -> Result<Money, MoneyError> {
        let secs =
            billable_seconds(wall_ms.min(self.max_wall_ms)).max(u64::from(self.min_billed_s));
        let c = cost(secs, self.gpus, self.price_per_gpu_hour)?;
        Ok(c.min(self.max_total))
    }

    /// What a start that failed on the renter's image costs (see [`start_failure_is_billed`]):
    /// the minimum billed duration, within the budget cap.
    pub fn failed_start_fee(&self) -> Result<Money, MoneyError> {
        self.final_due(0)
    }

    /// The cost of `seconds` of use (no cap): what a window of that length is worth.
    #[inline]
    pub fn window_cost(&self, seconds: u64) -> Result<Money, MoneyError> {
        cost(seconds, self.gpus, self.price_per_gpu_hour)
    }

    /// Wall milliseconds after which the budget cap is reached (`u64::MAX` if never).
    pub fn budget_exhausted_after_ms(&self) -> u64 {
        let per_hour = u128::from(self.price_per_gpu_hour.micros()) * u128::from(self.gpus);
        if per_hour == 0 {
            return u64::MAX;
        }
        // Smallest s with floor(per_hour * s / 3600) >= max_total.
        let need = u128::from(self.max_total.micros()) * HOUR_S;
        let secs = need.div_ceil(per_hour);
        u64::try_from(secs.saturating_mul(1000)).unwrap_or(u64::MAX)
    }
}

/// True when a lease that the provider closed for `reason` is billed only the seconds it ran,
/// without the minimum billed duration: a lease the provider's owner took back
/// (`OwnerReclaimed`: the owner's process on a GPU of an interruptible offer, or its offered
/// hours ending) did not end by the renter's doing. (The renter accepts a final report at either amount, `check_usage`.)
pub fn minimum_waived(reason: CloseReason) -> bool {
    matches!(reason, CloseReason::OwnerReclaimed)
}

/// True when a start that failed this way is the renter's to pay ([`Tariff::failed_start_fee`]):
/// failures of the image the renter chose. The provider's own failures are free.
pub fn start_failure_is_billed(kind: StartFailureKind) -> bool {
    match kind {
        StartFailureKind::ImagePull
        | StartFailureKind::PullStalled
        | StartFailureKind::PullTimeout
        | StartFailureKind::ImageRefused => true,
        StartFailureKind::NoSandbox
        | StartFailureKind::Create
        | StartFailureKind::Start
        | StartFailureKind::Internal => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_default_budget_is_the_cost_of_the_duration_or_of_the_minimum_billed_time() {
        let price = Money::from_micros(3_600_000); // 1_000 micro-units per GPU-second
        // Longer than the minimum: the whole duration, every GPU.
        assert_eq!(
            default_budget(600, 60, 2, price),
            Ok(Money::from_micros(1_200_000))
        );
        // Shorter than the minimum: the minimum billed time.
        assert_eq!(
            default_budget(30, 60, 2, price),
            Ok(Money::from_micros(120_000))
        );
        assert_eq!(default_budget(60, 60, 1, Money::ZERO), Ok(Money::ZERO));
        assert_eq!(
            default_budget(u32::MAX, 0, u16::MAX, Money::from_micros(u64::MAX)),
            Err(MoneyError::Overflow)
        );
    }

    #[test]
    fn only_an_owner_reclaim_waives_the_minimum() {
        assert!(minimum_waived(CloseReason::OwnerReclaimed));
        for r in [
            CloseReason::ContainerExited,
            CloseReason::RenterStop,
            CloseReason::ProviderStop,
            CloseReason::Expired,
        ] {
            assert!(!minimum_waived(r), "{r:?}");
        }
    }

    fn price(s: &str) -> Money {
        s.parse().unwrap()
    }

    #[test]
    fn cost_is_the_128_bit_quotient_on_both_sides_of_2_pow_64() {
        for (price_micros, gpus, seconds) in [
            (1u64, 1u16, u64::MAX),
            (u64::MAX, 1, 1),
            (u64::MAX, 1, 2),
            // price x gpus alone beyond 64 bits, the quotient within.
            (u64::MAX, 2, 1),
            (u64::MAX / 2, 3, 0),
            (4_294_967_296, 2, 2_147_483_648),
            (4_294_967_296, 2, 2_147_483_647),
            (3_599, 7, 3_601),
            (350_000, 4, 2_592_000),
        ] {
            let exact = u128::from(price_micros) * u128::from(gpus) * u128::from(seconds) / 3600;
            let got = cost(seconds, gpus, Money::from_micros(price_micros));
            assert_eq!(
                got.ok().map(Money::micros).map(u128::from),
                Some(exact).filter(|&e| e <= u128::from(u64::MAX))
            );
        }
    }

    #[test]
    fn one_hour_of_one_gpu_costs_the_price() {
        assert_eq!(cost(3600, 1, price("0.35")).unwrap(), price("0.35"));
        assert_eq!(cost(3600, 2, price("0.35")).unwrap(), price("0.70"));
        // 0.35/h for 1 s = 97.22 micro-units, rounded down.
        assert_eq!(cost(1, 1, price("0.35")).unwrap().micros(), 97);
    }

    #[test]
    fn zero_price_zero_time_zero_gpus_cost_nothing() {
        assert_eq!(cost(0, 4, price("9.99")).unwrap(), Money::ZERO);
        assert_eq!(cost(1000, 0, price("9.99")).unwrap(), Money::ZERO);
        assert_eq!(cost(1000, 4, Money::ZERO).unwrap(), Money::ZERO);
    }

    #[test]
    fn overflow_is_an_error() {
        let huge = Money::from_micros(u64::MAX);
        assert_eq!(cost(u64::MAX, u16::MAX, huge), Err(MoneyError::Overflow));
        assert_eq!(cost(7200, 1, huge), Err(MoneyError::Overflow));
        assert_eq!(cost(3600, 1, huge), Ok(huge));
    }

    #[test]
    fn minimum_billing_and_budget_cap() {
        let t = Tariff {
            price_per_gpu_hour: price("3.60"),
            gpus: 1,
            min_billed_s: 60,
            max_total: price("0.10"),
            max_wall_ms: 3_600_000,
            prepay_s: 0,
        };
        // 3.60/h = 1000 micro-units per second.
        assert_eq!(t.due(10_999).unwrap().micros(), 10_000);
        assert_eq!(t.final_due(10_999).unwrap().micros(), 60_000);
        assert_eq!(t.due(500_000).unwrap(), price("0.10"));
        assert_eq!(t.budget_exhausted_after_ms(), 100_000);
    }

    #[test]
    fn nothing_beyond_the_duration_is_billed() {
        // 10 s at 1000 micro-units per GPU-second, 2 GPUs, budget far above the lease.
        let t = Tariff {
            price_per_gpu_hour: price("3.60"),
            gpus: 2,
            min_billed_s: 1,
            max_total: price("1.00"),
            max_wall_ms: 10_000,
            prepay_s: 0,
        };
        // Killed 2.1 s late: billed the 10 s of the lease, exactly.
        let late = BilledTime {
            wall_ms: 12_100,
            gpu_ms: 24_200,
        };
        assert_eq!(
            t.cap(late),
            BilledTime {
                wall_ms: 10_000,
                gpu_ms: 20_000
            }
        );
        assert_eq!(t.due(12_100).unwrap().micros(), 20_000);
        assert_eq!(t.final_due(12_100).unwrap().micros(), 20_000);
        assert_eq!(t.final_due(10_000).unwrap().micros(), 20_000);
        // Within the lease nothing changes.
        let early = BilledTime {
            wall_ms: 9_999,
            gpu_ms: 19_998,
        };
        assert_eq!(t.cap(early), early);
        assert_eq!(t.due(9_999).unwrap().micros(), 18_000);
        // GPU time is never more than the (capped) wall time x GPUs.
        let odd = BilledTime {
            wall_ms: 4_000,
            gpu_ms: 9_000,
        };
        assert_eq!(t.cap(odd).gpu_ms, 8_000);
    }

    proptest! {
        /// Whatever was metered, the capped time and its amount stay within the terms: wall at
        /// most the duration, GPU at most wall x GPUs, due at most the cost of the duration and
        /// the budget; and capping changes nothing within the lease.
        #[test]
        fn capped_usage_never_exceeds_the_terms(
            wall in 0u64..10_000_000,
            gpu in 0u64..80_000_000,
            duration_s in 1u64..5_000,
            gpus in 1u16..8,
            micros in 0u64..100_000_000,
            budget in 0u64..u64::from(u32::MAX),
            min_billed_s in 0u32..100,
        ) {
            let t = Tariff {
                price_per_gpu_hour: Money::from_micros(micros),
                gpus,
                min_billed_s,
                max_total: Money::from_micros(budget),
                max_wall_ms: duration_s * 1000,
                prepay_s: 0,
            };
            let c = t.cap(BilledTime { wall_ms: wall, gpu_ms: gpu });
            prop_assert!(c.wall_ms <= duration_s * 1000);
            prop_assert!(c.gpu_ms <= c.wall_ms * u64::from(gpus));
            let lease = cost(duration_s.max(u64::from(min_billed_s)), gpus, t.price_per_gpu_hour).unwrap();
            prop_assert!(t.final_due(wall).unwrap() <= lease.min(t.max_total));
            prop_assert!(t.due(wall).unwrap() <= t.final_due(wall).unwrap());
            prop_assert_eq!(t.due(c.wall_ms).unwrap(), t.due(wall).unwrap());
            if wall <= duration_s * 1000 && gpu <= wall * u64::from(gpus) {
                prop_assert_eq!(c, BilledTime { wall_ms: wall, gpu_ms: gpu });
            }
        }

        /// Cutting a lease into any intervals gives the same total as billing it whole.
        #[test]
        fn splitting_never_changes_the_total(
            mut cuts in proptest::collection::vec(0u64..1_000_000, 0..40),
            end in 0u64..1_000_000,
            gpus in 0u16..16,
            micros in 0u64..100_000_000,
        ) {
            let p = Money::from_micros(micros);
            cuts.retain(|c| *c <= end);
            cuts.push(0);
            cuts.push(end);
            cuts.sort_unstable();
            let parts: Vec<Money> = cuts
                .windows(2)
                .map(|w| interval_charge(w[0], w[1], gpus, p).unwrap())
                .collect();
            prop_assert_eq!(Money::checked_sum(parts).unwrap(), cost(end, gpus, p).unwrap());
        }

        /// The 64-bit path and the 128-bit one give the 128-bit quotient (or overflow).
        #[test]
        fn cost_is_the_exact_quotient_everywhere(
            s in any::<u64>(), gpus in any::<u16>(), micros in any::<u64>(), shift in 0u32..64,
        ) {
            // Shifted so that both paths are taken often.
            let s = s >> shift;
            let exact = (u128::from(micros) * u128::from(gpus))
                .checked_mul(u128::from(s))
                .map(|p| p / 3600)
                .filter(|&e| e <= u128::from(u64::MAX));
            let got = cost(s, gpus, Money::from_micros(micros));
            prop_assert_eq!(got.ok().map(|m| u128::from(m.micros())), exact);
        }

        /// Cost is monotonic in time, and linear up to one micro-unit of rounding.
        #[test]
        fn cost_is_monotonic_and_close_to_exact(
            s in 0u64..10_000_000, gpus in 0u16..64, micros in 0u64..1_000_000_000,
        ) {
            let p = Money::from_micros(micros);
            let a = cost(s, gpus, p).unwrap();
            let b = cost(s + 1, gpus, p).unwrap();
            prop_assert!(a <= b);
            let exact = u128::from(micros) * u128::from(gpus) * u128::from(s);
            prop_assert!(u128::from(a.micros()) * 3600 <= exact);
            prop_assert!(exact < (u128::from(a.micros()) + 1) * 3600);
        }

        #[test]
        fn budget_exhaustion_time_is_exact(micros in 1u64..10_000_000, gpus in 1u16..8, cap in 1u64..10_000_000) {
            let t = Tariff {
                price_per_gpu_hour: Money::from_micros(micros),
                gpus,
                min_billed_s: 0,
                max_total: Money::from_micros(cap),
                max_wall_ms: u64::MAX,
                prepay_s: 0,
            };
            let at = t.budget_exhausted_after_ms();
            prop_assert!(cost(at / 1000, gpus, t.price_per_gpu_hour).unwrap() >= t.max_total);
            if at >= 1000 {
                prop_assert!(cost(at / 1000 - 1, gpus, t.price_per_gpu_hour).unwrap() < t.max_total);
            }
        }
    }
}
