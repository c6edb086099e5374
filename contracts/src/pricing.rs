//! Provider pricing strategies: how a provider sets its ask per GPU-hour.
//!
//! Pure and deterministic: what the provider knows is passed in as a [`PricingInput`], and the
//! one strategy that draws randomness takes the RNG as a parameter (`rand_core::RngCore`, no OS
//! entropy). The node uses these to re-price its offer; the simulator runs the same code.
//!
//! Every strategy respects the provider's cost floor: no quote is ever below it.

use crate::money::Money;
use rand_core::RngCore;

/// What a provider knows when it re-prices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PricingInput {
    /// The provider's marginal cost per GPU-hour: never quote below it.
    pub cost_floor: Money,
    /// The current ask.
    pub current: Money,
    /// Share of its GPUs leased over the last pricing period, in permille.
    pub utilization_permille: u16,
    /// The cheapest competing ask it can see for the same GPU class, if any.
    pub cheapest_competitor: Option<Money>,
}

/// A pricing strategy: given what the provider knows (and an RNG for the random ones), the next
/// ask. Implementations must be deterministic given `input` and the RNG's state.
///
/// Object-safe: a simulator or a node holds any strategy as `dyn PricingStrategy`, so a crate of
/// its own adds one by implementing this trait ([`Pricing`] is the built-in set), e.g. through
/// the simulator's `Market::with_plugins`.
pub trait PricingStrategy {
    /// The next ask per GPU-hour; never below `input.cost_floor`.
    fn quote(&self, input: &PricingInput, rng: &mut dyn RngCore) -> Money;
}

/// A uniform draw in `lo..=hi` (integers), unbiased to within 2^-64 (Lemire's multiply-shift).
/// Returns `lo` when `hi <= lo`.
pub fn uniform_inclusive<R: RngCore + ?Sized>(rng: &mut R, lo: u64, hi: u64) -> u64 {
    if hi <= lo {
        return lo;
    }
    let span = u128::from(hi - lo) + 1;
    let x = u128::from(rng.next_u64());
    // (x * span) >> 64 < span <= 2^64, so it fits in u64.
    lo + u64::try_from((x * span) >> 64).unwrap_or(0)
}

/// `amount * permille / 1000`, rounded down, saturating.
fn scale_permille(amount: Money, permille: u32) -> Money {
    let v = u128::from(amount.micros()) * u128::from(permille) / 1000;
    Money::from_micros(u64::try_from(v).unwrap_or(u64::MAX))
}

/// The built-in strategies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pricing {
    /// Always the same ask (raised to the cost floor if below it).
    Fixed {
        /// The ask per GPU-hour.
        price: Money,
    },
    /// Adaptive margin: raise the ask by `step_permille` when utilization is at or above
    /// `busy_permille`, lower it by the same step when at or below `idle_permille`, keep it
    /// otherwise; always within `[cost_floor, ceiling]`.
    AdaptiveMargin {
        /// Relative step, permille of the current ask (50 = 5 %).
        step_permille: u16,
        /// Utilization at or above which the ask rises.
        busy_permille: u16,
        /// Utilization at or below which the ask falls.
        idle_permille: u16,
        /// Highest ask.
        ceiling: Money,
    },
    /// Undercut the cheapest competitor by `by`, never below the cost floor; with no competitor
    /// visible, ask `ceiling`.
    Undercut {
        /// Amount to undercut by per GPU-hour.
        by: Money,
        /// Ask when nobody else is visible.
        ceiling: Money,
    },
    /// Zero-intelligence constrained (Gode & Sunder 1993): a uniform random ask between the
    /// cost floor and `ceiling`, drawn afresh at each re-pricing.
    ZeroIntelligence {
        /// Highest ask.
        ceiling: Money,
    },
}

impl PricingStrategy for Pricing {
    fn quote(&self, input: &PricingInput, rng: &mut dyn RngCore) -> Money {
        self.quote_with(input, rng)
    }
}

impl Pricing {
    /// [`PricingStrategy::quote`] for any RNG type: monomorphised, so a caller that knows its
    /// generator (the simulator, once per provider and re-pricing) pays no virtual calls.
    #[inline]
    pub fn quote_with<R: RngCore + ?Sized>(&self, input: &PricingInput, rng: &mut R) -> Money {
        let floor = input.cost_floor;
        match *self {
            Self::Fixed { price } => price.max(floor),
            Self::AdaptiveMargin {
                step_permille,
                busy_permille,
                idle_permille,
                ceiling,
            } => {
                let cur = input.current;
                let u = input.utilization_permille;
                let next = if u >= busy_permille {
                    // At least one micro-unit up, so a tiny ask can still climb.
                    scale_permille(cur, 1000 + u32::from(step_permille))
                        .max(Money::from_micros(cur.micros().saturating_add(1)))
                } else if u <= idle_permille {
                    scale_permille(cur, 1000u32.saturating_sub(u32::from(step_permille)))
                } else {
                    cur
                };
                next.min(ceiling.max(floor)).max(floor)
            }
            Self::Undercut { by, ceiling } => match input.cheapest_competitor {
                Some(c) => c.saturating_sub(by).max(floor),
                None => ceiling.max(floor),
            },
            Self::ZeroIntelligence { ceiling } => {
                let hi = ceiling.max(floor).micros();
                Money::from_micros(uniform_inclusive(rng, floor.micros(), hi))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic generator for tests (SplitMix64).
    struct SplitMix(u64);
    impl RngCore for SplitMix {
        fn next_u32(&mut self) -> u32 {
            (self.next_u64() >> 32) as u32
        }
        fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn fill_bytes(&mut self, dst: &mut [u8]) {
            rand_core::impls::fill_bytes_via_next(self, dst);
        }
    }

    fn m(s: &str) -> Money {
        s.parse().unwrap()
    }

    fn input(util: u16, competitor: Option<Money>) -> PricingInput {
        PricingInput {
            cost_floor: m("0.10"),
            current: m("0.50"),
            utilization_permille: util,
            cheapest_competitor: competitor,
        }
    }

    #[test]
    fn fixed_is_fixed_but_never_below_floor() {
        let mut r = SplitMix(1);
        let p = Pricing::Fixed { price: m("0.40") };
        assert_eq!(p.quote(&input(0, None), &mut r), m("0.40"));
        let p = Pricing::Fixed { price: m("0.01") };
        assert_eq!(p.quote(&input(0, None), &mut r), m("0.10"));
    }

    #[test]
    fn adaptive_margin_moves_with_utilization() {
        let mut r = SplitMix(1);
        let p = Pricing::AdaptiveMargin {
            step_permille: 100,
            busy_permille: 800,
            idle_permille: 200,
            ceiling: m("0.52"),
        };
        assert_eq!(p.quote(&input(900, None), &mut r), m("0.52"));
        assert_eq!(p.quote(&input(100, None), &mut r), m("0.45"));
        assert_eq!(p.quote(&input(500, None), &mut r), m("0.50"));
        let mut low = input(0, None);
        low.current = m("0.105");
        assert_eq!(p.quote(&low, &mut r), m("0.10"));
    }

    #[test]
    fn undercut_stops_at_the_floor() {
        let mut r = SplitMix(1);
        let p = Pricing::Undercut {
            by: m("0.01"),
            ceiling: m("0.90"),
        };
        assert_eq!(p.quote(&input(0, Some(m("0.30"))), &mut r), m("0.29"));
        assert_eq!(p.quote(&input(0, Some(m("0.105"))), &mut r), m("0.10"));
        assert_eq!(p.quote(&input(0, None), &mut r), m("0.90"));
    }

    #[test]
    fn zero_intelligence_stays_in_range_and_is_reproducible() {
        let p = Pricing::ZeroIntelligence { ceiling: m("1.00") };
        let mut a = SplitMix(7);
        let mut b = SplitMix(7);
        for _ in 0..1000 {
            let q = p.quote(&input(0, None), &mut a);
            assert!(q >= m("0.10") && q <= m("1.00"));
            assert_eq!(q, p.quote(&input(0, None), &mut b));
        }
    }

    #[test]
    fn uniform_covers_both_ends() {
        let mut r = SplitMix(3);
        let mut seen = [false; 3];
        for _ in 0..200 {
            let x = uniform_inclusive(&mut r, 5, 7);
            seen[(x - 5) as usize] = true;
        }
        assert_eq!(seen, [true; 3]);
        assert_eq!(uniform_inclusive(&mut r, 9, 3), 9);
    }
}
