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
//! A period is either a number of shouts ([`Length::Shouts`]) or a span of simulated time
//! ([`Length::Seconds`]): each trader with units left shouts as a Poisson process of its own, so
//! the market's shout rate falls as traders finish, and a period's length does not depend on
//! how many traders the market has.
//!
//! Allocative efficiency of a period = realised surplus (value - cost of the traded units) /
//! maximum surplus. Price convergence: the root-mean-square deviation of the transaction prices
//! from the equilibrium price, and Smith's coefficient of convergence alpha = 100 x RMSD /
//! equilibrium price (Smith 1962).

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

impl Equilibrium {
    /// The equilibrium price the convergence metrics measure against: the middle of the
    /// clearing range.
    pub fn price(&self) -> f64 {
        (self.price_low as f64 + self.price_high as f64) / 2.0
    }
}

/// Root-mean-square deviation of `prices` from `p0`; NaN without prices.
pub fn price_rmsd(prices: &[u64], p0: f64) -> f64 {
    if prices.is_empty() {
        return f64::NAN;
    }
    let ss: f64 = prices.iter().map(|&p| (p as f64 - p0).powi(2)).sum();
    (ss / prices.len() as f64).sqrt()
}

/// Smith's coefficient of convergence: 100 x RMSD / `p0`, percent; NaN without prices.
pub fn alpha(prices: &[u64], p0: f64) -> f64 {
    100.0 * price_rmsd(prices, p0) / p0
}

/// How long a trading period lasts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Length {
    /// This many shouts (a shout the improvement rule discards still counts).
    Shouts(u32),
    /// This many simulated seconds, each trader with units left shouting as a Poisson process
    /// of `rate` shouts per second.
    Seconds {
        /// The period, seconds.
        seconds: u32,
        /// Shouts per second of each trader with units left.
        rate: f64,
    },
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
    /// Per trade, in trade order, the surplus it realised (value - cost).
    pub gains: Vec<i64>,
    /// Shouts made (all of a period in shouts, unless one side ran out of units first).
    pub shouts: u32,
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

    /// Root-mean-square deviation of the prices from `p0`; NaN without trades.
    pub fn price_rmsd(&self, p0: f64) -> f64 {
        price_rmsd(&self.prices, p0)
    }
}

/// Runs one period of `length`: buyers follow `buyer`, sellers `seller`. A shout is one draw of
/// a trader (with units left, uniformly) and a price; a shout the improvement rule discards
/// still counts. In a period of seconds the next shout comes after an exponential wait with
/// rate `rate` x the traders with units left. The period ends when its shouts or seconds are
/// used up, or when one side has no units left.
pub fn period(
    s: &Schedules,
    rules: Rules,
    buyer: &dyn Strategy,
    seller: &dyn Strategy,
    length: Length,
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
    let mut gains = Vec::new();
    let mut admitted = 0u32;
    let mut shouts = 0u32;
    let mut clock = 0.0f64;
    let (lo, hi) = (s.min_price, s.max_price.max(s.min_price));
    let mut active: Vec<(Side, usize)> = Vec::with_capacity(nb + ns);
    loop {
        if let Length::Shouts(n) = length
            && shouts >= n
        {
            break;
        }
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
        if let Length::Seconds { seconds, rate } = length {
            clock += crate::rng::exponential(rng, 1.0 / (rate * active.len() as f64));
            if clock > f64::from(seconds) {
                break;
            }
        }
        shouts += 1;
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
                gains.push(v as i64 - c as i64);
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
        gains,
        shouts,
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
                        Length::Shouts(300),
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
                        Length::Shouts(200),
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

    #[test]
    fn convergence_metrics() {
        // Deviations -2, 0, +2 from 100: RMSD sqrt(8/3), alpha 100 x that / 100.
        let r = price_rmsd(&[98, 100, 102], 100.0);
        assert!((r - (8.0f64 / 3.0).sqrt()).abs() < 1e-12);
        assert!((alpha(&[98, 100, 102], 100.0) - r).abs() < 1e-12);
        assert!(price_rmsd(&[], 100.0).is_nan());
        assert_eq!(equilibrium(&tiny()).price(), 105.0);
    }

    /// A timed period's shouts are a Poisson count: with nobody trading, `n` traders shouting at
    /// `rate` per second make rate x seconds x n shouts on average, whatever the market's size,
    /// per second of the period; a period in shouts makes exactly its shouts.
    #[test]
    fn timed_periods_make_shouts_at_the_traders_rate() {
        struct Apart;
        impl Strategy for Apart {
            fn shout(&self, side: Side, _: u64, _: u64, _: u64, _: &mut dyn RngCore) -> u64 {
                match side {
                    Side::Buyer => 10,
                    Side::Seller => 190,
                }
            }
        }
        let mean = |s: &Schedules, length| {
            let mut rng = stream(2, 0, StreamKind::Market, 0);
            let n = 400;
            (0..n)
                .map(|_| {
                    let p = period(s, Rules::default(), &Apart, &Apart, length, &mut rng);
                    assert_eq!(p.trades, 0);
                    f64::from(p.shouts)
                })
                .sum::<f64>()
                / f64::from(n)
        };
        let four = tiny();
        let mut eight = tiny();
        eight.buyers.extend(tiny().buyers);
        eight.sellers.extend(tiny().sellers);
        let timed = Length::Seconds {
            seconds: 50,
            rate: 0.5,
        };
        // 0.5 x 50 x 4 = 100 and x 8 = 200; the sd of a mean of 400 Poisson(100) counts is 0.5.
        assert!(
            (mean(&four, timed) - 100.0).abs() < 3.0,
            "{}",
            mean(&four, timed)
        );
        assert!(
            (mean(&eight, timed) - 200.0).abs() < 4.0,
            "{}",
            mean(&eight, timed)
        );
        assert_eq!(mean(&four, Length::Shouts(77)), 77.0);
    }

    /// A timed period ends when one side's units run out: where every pair of units can trade at
    /// a gain, ZI-C trades them all long before a very long period is over.
    #[test]
    fn timed_periods_end_when_the_units_run_out() {
        let s = Schedules {
            buyers: vec![vec![150], vec![120]],
            sellers: vec![vec![40], vec![90]],
            min_price: 1,
            max_price: 200,
        };
        let mut rng = stream(4, 0, StreamKind::Market, 0);
        for _ in 0..100 {
            let p = period(
                &s,
                Rules::default(),
                &Trader::Constrained,
                &Trader::Constrained,
                Length::Seconds {
                    seconds: 100_000,
                    rate: 1.0,
                },
                &mut rng,
            );
            assert_eq!((p.trades, p.surplus), (2, 140));
            // Far fewer shouts than 100,000 s x 4 traders: the period ended with the units.
            assert!(p.shouts < 100_000, "{}", p.shouts);
            assert_eq!(p.gains.iter().sum::<i64>(), p.surplus);
        }
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
        let p = period(&s, market, &Fixed, &Fixed, Length::Shouts(100), &mut rng);
        assert_eq!((p.admitted, p.trades), (2, 0));
        let own = Rules {
            improvement: Improvement::Own,
            ..market
        };
        // `own`: each of the 4 traders gets its first shout in, then nothing improves.
        let p = period(&s, own, &Fixed, &Fixed, Length::Shouts(100), &mut rng);
        assert_eq!((p.admitted, p.trades), (4, 0));
        let none = Rules::default();
        let p = period(&s, none, &Fixed, &Fixed, Length::Shouts(100), &mut rng);
        assert_eq!((p.admitted, p.trades), (100, 0));
    }
}
