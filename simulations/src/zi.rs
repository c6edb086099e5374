//! Validation: zero-intelligence traders in a continuous double auction (Gode & Sunder 1993,
//! "Allocative Efficiency of Markets with Zero-Intelligence Traders", JPE 101(1)).
//!
//! Traders hold unit schedules (buyers: values, highest first; sellers: costs, lowest first)
//! and must trade their units in order. At each step a trader with units left is drawn at
//! random and shouts a random price: ZI-U (unconstrained) anywhere in `1..=max_price`; ZI-C
//! (budget-constrained) a buyer at most its next unit's value, a seller at least its next
//! unit's cost. Shouts go into the *real* `contracts::auction::DoubleAuction`; a crossing shout
//! trades at the standing order's price, and (as in Gode & Sunder) a trade clears the book.
//! Allocative efficiency = realised surplus / maximum surplus.

use gridlease_contracts::Money;
use gridlease_contracts::auction::DoubleAuction;
use gridlease_contracts::pricing::uniform_inclusive;
use rand::RngCore;

use crate::rng::{StreamKind, stream};

/// A market's unit schedules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedules {
    /// Per buyer, its units' values (redemption values), in trading order.
    pub buyers: Vec<Vec<u64>>,
    /// Per seller, its units' costs, in trading order.
    pub sellers: Vec<Vec<u64>>,
    /// Highest admissible price.
    pub max_price: u64,
}

/// Trader type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trader {
    /// Unconstrained: shouts anywhere in `1..=max_price`.
    Unconstrained,
    /// Budget-constrained: never shouts at a loss.
    Constrained,
}

/// Result of one trading period.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Period {
    /// Realised surplus / maximum surplus.
    pub efficiency: f64,
    /// Units traded.
    pub trades: u32,
    /// Mean transaction price.
    pub mean_price: f64,
}

/// Market A (documented in docs/simulations.md): 6 buyers and 6 sellers with 3 units each;
/// steep schedules with many extra-marginal units, competitive equilibrium 9 units at ~100,
/// maximum surplus 900.
pub fn market_a() -> Schedules {
    Schedules {
        buyers: (0..6)
            .map(|i| vec![190 - 10 * i, 130 - 10 * i, 70 - 10 * i])
            .collect(),
        sellers: (0..6)
            .map(|i| vec![10 + 10 * i, 70 + 10 * i, 130 + 10 * i])
            .collect(),
        max_price: 200,
    }
}

/// Market B: a flat-supply market, 5 buyers x 4 units (values 150..60), 5 sellers x 4 units,
/// all at cost 80 -- equilibrium price 80.
pub fn market_b() -> Schedules {
    Schedules {
        buyers: (0..5)
            .map(|i| vec![150 - 5 * i, 125 - 5 * i, 100 - 5 * i, 75 - 5 * i])
            .collect(),
        sellers: (0..5).map(|_| vec![80; 4]).collect(),
        max_price: 200,
    }
}

/// The maximum total surplus: values sorted down against costs sorted up.
pub fn max_surplus(s: &Schedules) -> u64 {
    let mut v: Vec<u64> = s.buyers.iter().flatten().copied().collect();
    let mut c: Vec<u64> = s.sellers.iter().flatten().copied().collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    c.sort_unstable();
    v.iter()
        .zip(&c)
        .filter(|(a, b)| a > b)
        .map(|(a, b)| a - b)
        .sum()
}

/// Runs one period of `shouts` random shouts.
pub fn period<R: RngCore>(s: &Schedules, kind: Trader, shouts: u32, rng: &mut R) -> Period {
    let nb = s.buyers.len();
    let ns = s.sellers.len();
    let mut next_b = vec![0usize; nb];
    let mut next_s = vec![0usize; ns];
    let mut book: DoubleAuction<u32> = DoubleAuction::new();
    let mut surplus: i64 = 0;
    let mut trades = 0u32;
    let mut price_sum = 0u64;
    for _ in 0..shouts {
        let active: Vec<(bool, usize)> = (0..nb)
            .filter(|&i| next_b[i] < s.buyers[i].len())
            .map(|i| (true, i))
            .chain(
                (0..ns)
                    .filter(|&i| next_s[i] < s.sellers[i].len())
                    .map(|i| (false, i)),
            )
            .collect();
        if active.is_empty() {
            break;
        }
        // Draw among traders with units left: buyers first in index order, then sellers.
        let pick = uniform_inclusive(rng, 0, active.len() as u64 - 1) as usize;
        let who = active.get(pick).copied();
        let Some((is_buyer, i)) = who else { break };
        let trade = if is_buyer {
            let value = s.buyers[i][next_b[i]];
            let hi = match kind {
                Trader::Unconstrained => s.max_price,
                Trader::Constrained => value,
            };
            let p = uniform_inclusive(rng, 1, hi.max(1));
            book.submit_bid(i as u32, Money::from_micros(p), 1)
                .map(|t| (i, t.seller as usize - nb, t.price.micros()))
        } else {
            let c = s.sellers[i][next_s[i]];
            let lo = match kind {
                Trader::Unconstrained => 1,
                Trader::Constrained => c.max(1),
            };
            let p = uniform_inclusive(rng, lo, s.max_price.max(lo));
            book.submit_ask((nb + i) as u32, Money::from_micros(p), 1)
                .first()
                .map(|t| (t.buyer as usize, i, t.price.micros()))
        };
        if let Some((b, sl, price)) = trade {
            let v = s.buyers[b][next_b[b]];
            let c = s.sellers[sl][next_s[sl]];
            surplus += v as i64 - c as i64;
            next_b[b] += 1;
            next_s[sl] += 1;
            trades += 1;
            price_sum += price;
            book.clear();
        }
    }
    let max = max_surplus(s) as f64;
    Period {
        efficiency: if max > 0.0 { surplus as f64 / max } else { 0.0 },
        trades,
        mean_price: if trades > 0 {
            price_sum as f64 / f64::from(trades)
        } else {
            0.0
        },
    }
}

/// Mean efficiency, trades and price over `periods` periods, each with its own stream.
pub fn experiment(s: &Schedules, kind: Trader, periods: u32, shouts: u32, seed: u64) -> Period {
    let mut eff = 0.0;
    let mut trades = 0.0;
    let mut price = 0.0;
    for k in 0..periods {
        let mut rng = stream(seed, u64::from(k), StreamKind::Market, kind as u64);
        let p = period(s, kind, shouts, &mut rng);
        eff += p.efficiency;
        trades += f64::from(p.trades);
        price += p.mean_price;
    }
    let n = f64::from(periods.max(1));
    Period {
        efficiency: eff / n,
        trades: (trades / n).round() as u32,
        mean_price: price / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_surplus_of_the_documented_markets() {
        assert_eq!(max_surplus(&market_a()), 900);
        assert_eq!(max_surplus(&market_b()), 525);
    }
}
