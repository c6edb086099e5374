//! Per-second billing.
//!
//! **The rounding rule** (the only one): the amount due after `s` whole seconds of use is
//! `floor(price_per_gpu_hour x gpus x s / 3600)` micro-units, computed exactly in 128-bit
//! integers. Meters run in milliseconds; billable seconds are the whole seconds elapsed
//! (`wall_ms / 1000`, rounded down). The charge for any interval is the difference of the
//! cumulative amounts at its ends, so charges of consecutive intervals always add up to the
//! charge of the whole span: rounding never accumulates, and neither side gains from how a lease
//! is cut into reports.

use gridlease_protocol::LeaseTerms;

use crate::money::{Money, MoneyError};

/// Seconds per hour.
const HOUR_S: u128 = 3600;

/// `floor(price_per_gpu_hour x gpus x seconds / 3600)`, or an overflow error.
pub fn cost(seconds: u64, gpus: u16, price_per_gpu_hour: Money) -> Result<Money, MoneyError> {
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
    /// Price per GPU-hour.
    pub price_per_gpu_hour: Money,
    /// GPUs leased.
    pub gpus: u16,
    /// Minimum billed seconds, applied at settlement.
    pub min_billed_s: u32,
    /// Budget cap: nothing beyond it is ever due.
    pub max_total: Money,
}

impl Tariff {
    /// The tariff of a lease.
    pub fn of(terms: &LeaseTerms) -> Self {
        Self {
            price_per_gpu_hour: Money::from_micros(terms.price_per_gpu_hour),
            gpus: terms.gpu_count,
            min_billed_s: terms.min_billed_s,
            max_total: Money::from_micros(terms.max_total),
        }
    }

    /// Due while running, for `wall_ms` of use so far: per-second cost, capped at the budget.
    pub fn due(&self, wall_ms: u64) -> Result<Money, MoneyError> {
        let c = cost(
            billable_seconds(wall_ms),
            self.gpus,
            self.price_per_gpu_hour,
        )?;
        Ok(c.min(self.max_total))
    }

    /// Due at settlement: like [`Tariff::due`] but never below the minimum billed duration.
    pub fn final_due(&self, wall_ms: u64) -> Result<Money, MoneyError> {
        let secs = billable_seconds(wall_ms).max(u64::from(self.min_billed_s));
        let c = cost(secs, self.gpus, self.price_per_gpu_hour)?;
        Ok(c.min(self.max_total))
    }

    /// The cost of `seconds` of use (no cap): what a window of that length is worth.
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn price(s: &str) -> Money {
        s.parse().unwrap()
    }

    #[test]
    fn cost_is_the_128_bit_quotient_on_both_sides_of_2_pow_64() {
        for (price_micros, gpus, seconds) in [
            (1u64, 1u16, u64::MAX),
            (u64::MAX, 1, 1),
            (u64::MAX, 1, 2),
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
        };
        // 3.60/h = 1000 micro-units per second.
        assert_eq!(t.due(10_999).unwrap().micros(), 10_000);
        assert_eq!(t.final_due(10_999).unwrap().micros(), 60_000);
        assert_eq!(t.due(500_000).unwrap(), price("0.10"));
        assert_eq!(t.budget_exhausted_after_ms(), 100_000);
    }

    proptest! {
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
            };
            let at = t.budget_exhausted_after_ms();
            prop_assert!(cost(at / 1000, gpus, t.price_per_gpu_hour).unwrap() >= t.max_total);
            if at >= 1000 {
                prop_assert!(cost(at / 1000 - 1, gpus, t.price_per_gpu_hour).unwrap() < t.max_total);
            }
        }
    }
}
