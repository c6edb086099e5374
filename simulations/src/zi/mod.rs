//! Zero-intelligence traders in a continuous double auction (Gode & Sunder 1993,
//! "Allocative Efficiency of Markets with Zero-Intelligence Traders: Market as a Partial
//! Substitute for Individual Rationality", JPE 101(1), 119-137).
//!
//! Traders hold unit schedules (buyers: redemption values, sellers: costs) and must trade their
//! units in order. At each shout a trader with units left is drawn uniformly and shouts a price
//! from its [`Strategy`]: ZI-U (unconstrained) anywhere in `min_price..=max_price`; ZI-C
//! (budget-constrained) a buyer at most its next unit's value, a seller at least its next
//! unit's cost. Admitted shouts go into the *real* `contracts::auction::DoubleAuction`; a
//! crossing shout trades at the standing order's price.
//!
//! Market rules ([`Rules`]) that the contracts book does not decide are applied here, in front
//! of it: the improvement rule (which shouts are admitted at all, [`Improvement`]) and whether
//! a trade clears the book. The book itself is unchanged: a trader's admitted order replaces
//! its standing one, and crossing is the book's own rule.
//!
//! Allocative efficiency of a period = realised surplus (value - cost of the traded units) /
//! maximum surplus.

pub mod experiment;

use gridlease_contracts::Money;
use gridlease_contracts::auction::DoubleAuction;
use gridlease_contracts::pricing::uniform_inclusive;
use rand::RngCore;
use serde::{Deserialize, Serialize};

/// A market's unit schedules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedules {
    /// Per buyer, its units' values (redemption values), in trading order.
    pub buyers: Vec<Vec<u64>>,
    /// Per seller, its units' costs, in trading order.
    pub sellers: Vec<Vec<u64>>,
    /// Lowest admissible price.
    pub min_price: u64,
    /// Highest admissible price.
    pub max_price: u64,
}

/// The competitive equilibrium of a set of schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Equilibrium {
    /// Units traded in equilibrium (pairs with value > cost, values sorted down against costs
    /// sorted up).
    pub quantity: usize,
    /// Lowest market-clearing price.
    pub price_low: u64,
    /// Highest market-clearing price.
    pub price_high: u64,
    /// Maximum total surplus (the sum of value - cost over those pairs).
    pub max_surplus: u64,
}

/// The competitive equilibrium: values sorted down against costs sorted up; the quantity is the
/// number of pairs with value > cost, the price range the prices at which exactly that many
/// units are demanded and supplied.
pub fn equilibrium(s: &Schedules) -> Equilibrium {
    let mut v: Vec<u64> = s.buyers.iter().flatten().copied().collect();
    let mut c: Vec<u64> = s.sellers.iter().flatten().copied().collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    c.sort_unstable();
    let q = v.iter().zip(&c).take_while(|(a, b)| a > b).count();
    let max_surplus = v.iter().zip(&c).take(q).map(|(a, b)| a - b).sum();
    if q == 0 {
        return Equilibrium {
            quantity: 0,
            price_low: 0,
            price_high: 0,
            max_surplus: 0,
        };
    }
    let price_low = c[q - 1].max(v.get(q).copied().unwrap_or(0));
    let price_high = v[q - 1].min(c.get(q).copied().unwrap_or(u64::MAX));
    Equilibrium {
        quantity: q,
        price_low,
        price_high,
        max_surplus,
    }
}

/// The maximum total surplus.
pub fn max_surplus(s: &Schedules) -> u64 {
    equilibrium(s).max_surplus
}

/// Which shouts the market admits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Improvement {
    /// Every shout is admitted; a trader's new order replaces its standing one even when worse
    /// (the contracts book's own behaviour).
    #[default]
    None,
    /// A trader's shout is admitted only if it improves that trader's own standing order (a
    /// higher bid, a lower ask); otherwise it is discarded and its standing order stays.
    Own,
    /// A shout is admitted only if it improves the market: a bid above the best standing bid,
    /// an ask below the best standing ask (the spread-reduction rule of NYSE-style double
    /// auctions). A crossing shout always qualifies.
    Market,
}

/// Market rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    /// Improvement rule (default `none`).
    #[serde(default)]
    pub improvement: Improvement,
    /// Whether a trade removes every standing order (Gode & Sunder: "a transaction canceled
    /// any unaccepted bids and offers"); default true.
    #[serde(default = "yes")]
    pub clear_after_trade: bool,
}

fn yes() -> bool {
    true
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            improvement: Improvement::None,
            clear_after_trade: true,
        }
    }
}

/// The side a trader is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Bids for units; its limit is the next unit's value.
    Buyer,
    /// Asks for units; its limit is the next unit's cost.
    Seller,
}

/// A trader type: how a trader with a unit of this `limit` (value for a buyer, cost for a
/// seller) picks a shout within the admissible prices `lo..=hi`. The hook for trader types
/// beyond ZI-U and ZI-C: implement it and call [`period`].
pub trait Strategy: Sync {
    /// The shout's price.
    fn shout(&self, side: Side, limit: u64, lo: u64, hi: u64, rng: &mut dyn RngCore) -> u64;
}

/// The built-in trader types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Trader {
    /// ZI-U, unconstrained: uniform in `lo..=hi`, whatever its value or cost.
    #[serde(rename = "zi-u")]
    Unconstrained,
    /// ZI-C, budget-constrained: a buyer uniform in `lo..=value`, a seller uniform in
    /// `cost..=hi` -- never a shout at a loss.
    #[serde(rename = "zi-c")]
    Constrained,
}

impl Strategy for Trader {
    fn shout(&self, side: Side, limit: u64, lo: u64, hi: u64, rng: &mut dyn RngCore) -> u64 {
        match (self, side) {
            (Trader::Unconstrained, _) => uniform_inclusive(rng, lo, hi),
            (Trader::Constrained, Side::Buyer) => uniform_inclusive(rng, lo, limit.clamp(lo, hi)),
            (Trader::Constrained, Side::Seller) => uniform_inclusive(rng, limit.clamp(lo, hi), hi),
        }
    }
}

/// Result of one trading period.
#[derive(Clone, Debug, PartialEq)]
pub struct Period {
    /// Realised surplus (value - cost over traded units; negative when losing units trade).
    pub surplus: i64,
    /// Realised surplus / maximum surplus.
    pub efficiency: f64,
    /// Units traded.
    pub trades: u32,
    /// Transaction prices in trade order (the period's price path).
    pub prices: Vec<u64>,
    /// Shouts the improvement rule admitted (of the period's shouts).
    pub admitted: u32,
}

impl Period {
    /// Mean transaction price; NaN without trades.
    pub fn mean_price(&self) -> f64 {
        if self.prices.is_empty() {
            f64::NAN
        } else {
            self.prices.iter().sum::<u64>() as f64 / self.prices.len() as f64
        }
    }
}

/// Runs one period of `shouts` shouts: buyers follow `buyer`, sellers `seller`. A shout is one
/// draw of a trader (with units left) and a price; a shout the improvement rule discards still
/// counts. The period ends after `shouts` shouts or when one side has no units left.
pub fn period(
    s: &Schedules,
    rules: Rules,
    buyer: &dyn Strategy,
    seller: &dyn Strategy,
    shouts: u32,
    rng: &mut dyn RngCore,
) -> Period {
    let nb = s.buyers.len();
    let ns = s.sellers.len();
    let mut next_b = vec![0usize; nb];
    let mut next_s = vec![0usize; ns];
    // Each trader's standing order as the ZI layer admitted it (owner ids: buyers 0..nb,
    // sellers nb..nb+ns), kept in step with the book for the `own` rule.
    let mut standing: Vec<Option<u64>> = vec![None; nb + ns];
    let mut book: DoubleAuction<u32> = DoubleAuction::new();
    let mut surplus: i64 = 0;
    let mut prices = Vec::new();
    let mut admitted = 0u32;
    let (lo, hi) = (s.min_price, s.max_price.max(s.min_price));
    let mut active: Vec<(Side, usize)> = Vec::with_capacity(nb + ns);
    for _ in 0..shouts {
        active.clear();
        active.extend(
            (0..nb)
                .filter(|&i| next_b[i] < s.buyers[i].len())
                .map(|i| (Side::Buyer, i)),
        );
        let buyers_left = active.len();
        active.extend(
            (0..ns)
                .filter(|&i| next_s[i] < s.sellers[i].len())
                .map(|i| (Side::Seller, i)),
        );
        if buyers_left == 0 || buyers_left == active.len() {
            break;
        }
        // Draw among traders with units left: buyers first in index order, then sellers.
        let pick = uniform_inclusive(rng, 0, active.len() as u64 - 1) as usize;
        let Some(&(side, i)) = active.get(pick) else {
            break;
        };
        let (owner, limit, strategy) = match side {
            Side::Buyer => (i, s.buyers[i][next_b[i]], buyer),
            Side::Seller => (nb + i, s.sellers[i][next_s[i]], seller),
        };
        let p = strategy.shout(side, limit, lo, hi, rng);
        let improves = |old: Option<u64>| match (side, old) {
            (_, None) => true,
            (Side::Buyer, Some(q)) => p > q,
            (Side::Seller, Some(q)) => p < q,
        };
        let admit = match rules.improvement {
            Improvement::None => true,
            Improvement::Own => improves(standing[owner]),
            Improvement::Market => match side {
                Side::Buyer => improves(book.best_bid().map(|o| o.price.micros())),
                Side::Seller => improves(book.best_ask().map(|o| o.price.micros())),
            },
        };
        if !admit {
            continue;
        }
        admitted += 1;
        let trade = match side {
            Side::Buyer => book
                .submit_bid(owner as u32, Money::from_micros(p), 1)
                .map(|t| (i, t.seller as usize - nb, t.price.micros())),
            Side::Seller => book
                .submit_ask(owner as u32, Money::from_micros(p), 1)
                .first()
                .map(|t| (t.buyer as usize, i, t.price.micros())),
        };
        match trade {
            Some((b, sl, price)) => {
                let v = s.buyers[b][next_b[b]];
                let c = s.sellers[sl][next_s[sl]];
                surplus += v as i64 - c as i64;
                next_b[b] += 1;
                next_s[sl] += 1;
                prices.push(price);
                standing[b] = None;
                standing[nb + sl] = None;
                if rules.clear_after_trade {
                    book.clear();
                    standing.iter_mut().for_each(|o| *o = None);
                }
            }
            None => standing[owner] = Some(p),
        }
    }
    let max = max_surplus(s) as f64;
    Period {
        surplus,
        efficiency: if max > 0.0 { surplus as f64 / max } else { 0.0 },
        trades: prices.len() as u32,
        prices,
        admitted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{StreamKind, stream};

    fn tiny() -> Schedules {
        Schedules {
            buyers: vec![vec![150, 60], vec![120]],
            sellers: vec![vec![40, 140], vec![90]],
            min_price: 1,
            max_price: 200,
        }
    }

    #[test]
    fn equilibrium_of_a_small_market() {
        // values 150 120 60, costs 40 90 140: two units, price in [90, 120], surplus 140.
        let e = equilibrium(&tiny());
        assert_eq!(
            e,
            Equilibrium {
                quantity: 2,
                price_low: 90,
                price_high: 120,
                max_surplus: 140
            }
        );
    }

    #[test]
    fn zi_c_never_trades_at_a_loss_and_the_rules_hold() {
        let s = tiny();
        for improvement in [Improvement::None, Improvement::Own, Improvement::Market] {
            for clear_after_trade in [true, false] {
                let rules = Rules {
                    improvement,
                    clear_after_trade,
                };
                let mut rng = stream(5, 0, StreamKind::Market, 0);
                for _ in 0..200 {
                    let p = period(
                        &s,
                        rules,
                        &Trader::Constrained,
                        &Trader::Constrained,
                        300,
                        &mut rng,
                    );
                    // ZI-C: surplus never negative, never above the maximum.
                    assert!(p.surplus >= 0 && p.surplus <= 140, "{rules:?} {p:?}");
                    assert!(p.admitted <= 300);
                    assert!(p.prices.iter().all(|&x| (1..=200).contains(&x)));
                }
            }
        }
    }

    /// When a trade clears the book, `own` and `market` admit different shouts but trade
    /// identically (only the best quote trades, and it moves only by improvement or by a trade
    /// that empties the book); without clearing they differ.
    #[test]
    fn own_and_market_coincide_when_trades_clear_the_book() {
        let s = Schedules {
            buyers: (0..4).map(|i| vec![150 - 10 * i, 100 - 10 * i]).collect(),
            sellers: (0..4).map(|i| vec![40 + 10 * i, 90 + 10 * i]).collect(),
            min_price: 1,
            max_price: 200,
        };
        let go = |improvement, clear_after_trade| {
            let rules = Rules {
                improvement,
                clear_after_trade,
            };
            let mut rng = stream(3, 0, StreamKind::Market, 0);
            (0..50)
                .map(|_| {
                    let p = period(
                        &s,
                        rules,
                        &Trader::Constrained,
                        &Trader::Constrained,
                        200,
                        &mut rng,
                    );
                    (p.surplus, p.prices)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(go(Improvement::Own, true), go(Improvement::Market, true));
        assert_ne!(go(Improvement::Own, false), go(Improvement::Market, false));
        assert_ne!(go(Improvement::None, true), go(Improvement::Market, true));
    }

    /// With the `market` rule a shout that does not beat the best quote is discarded: a
    /// strategy that always bids 10 and asks 190 gets one bid and one ask admitted, never trades.
    #[test]
    fn market_improvement_discards_non_improving_shouts() {
        struct Fixed;
        impl Strategy for Fixed {
            fn shout(&self, side: Side, _: u64, _: u64, _: u64, _: &mut dyn RngCore) -> u64 {
                match side {
                    Side::Buyer => 10,
                    Side::Seller => 190,
                }
            }
        }
        let s = tiny();
        let mut rng = stream(1, 0, StreamKind::Market, 0);
        let market = Rules {
            improvement: Improvement::Market,
            clear_after_trade: true,
        };
        let p = period(&s, market, &Fixed, &Fixed, 100, &mut rng);
        assert_eq!((p.admitted, p.trades), (2, 0));
        let own = Rules {
            improvement: Improvement::Own,
            ..market
        };
        // `own`: each of the 4 traders gets its first shout in, then nothing improves.
        let p = period(&s, own, &Fixed, &Fixed, 100, &mut rng);
        assert_eq!((p.admitted, p.trades), (4, 0));
        let none = Rules::default();
        let p = period(&s, none, &Fixed, &Fixed, 100, &mut rng);
        assert_eq!((p.admitted, p.trades), (100, 0));
    }
}
