//! Auction clearing rules: a continuous double auction, a periodic call market (k-double
//! auction) and a sealed-bid reverse auction.
//!
//! **Continuous double auction** ([`DoubleAuction`]): buyers post bids, sellers post asks; an
//! incoming order that crosses the best standing order on the other side trades at once, at the
//! *standing* order's price (the NYSE rule used by Gode & Sunder 1993). Priority is price, then
//! time (insertion sequence). A bid is all-or-nothing (one lease runs on one provider); an ask
//! may be split across several bids (a provider with several free GPUs). Each owner has at most
//! one standing order; a new order from the same owner replaces the old one.
//!
//! **Reverse auction** ([`reverse_auction_winner`]): a renter announces a request, providers
//! send sealed bids during a bid window, and the lowest bid at or below the renter's reserve
//! wins (ties: lowest owner, then earliest bid) -- the Akash-style market.
//!
//! **Call market** ([`clear_call_market`]): orders are collected over a call period and
//! cleared together at one price, `p = a* + k (b* - a*)` (a k-double auction,
//! Satterthwaite & Williams 1989), where `a*` and `b*` are the last matched ask and bid.
//!
//! Pure and deterministic: ordered maps only, no clocks, no randomness.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use crate::money::Money;

/// Which side of the book.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Side {
    /// A buyer's order.
    Bid,
    /// A seller's order.
    Ask,
}

/// A standing order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Order<K> {
    /// Who placed it.
    pub owner: K,
    /// Limit price per unit.
    pub price: Money,
    /// Units (GPUs) wanted or offered.
    pub qty: u32,
}

/// One execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Trade<K> {
    /// The buyer.
    pub buyer: K,
    /// The seller.
    pub seller: K,
    /// Price per unit: the standing order's limit.
    pub price: Money,
    /// Units traded (the bid's whole quantity).
    pub qty: u32,
}

type BidKey = (Reverse<Money>, u64);
type AskKey = (Money, u64);

/// A continuous double auction book. `K` identifies owners (agents, jobs); both sides share
/// one owner namespace.
#[derive(Clone, Debug)]
pub struct DoubleAuction<K: Ord + Copy> {
    bids: BTreeMap<BidKey, Order<K>>,
    asks: BTreeMap<AskKey, Order<K>>,
    index: BTreeMap<K, (Side, Money, u64)>,
    seq: u64,
}

impl<K: Ord + Copy> Default for DoubleAuction<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord + Copy> DoubleAuction<K> {
    /// An empty book.
    pub fn new() -> Self {
        Self {
            bids: BTreeMap::new(),
            asks: BTreeMap::new(),
            index: BTreeMap::new(),
            seq: 0,
        }
    }

    /// Best (highest) standing bid.
    pub fn best_bid(&self) -> Option<Order<K>> {
        self.bids.values().next().copied()
    }

    /// Best (lowest) standing ask.
    pub fn best_ask(&self) -> Option<Order<K>> {
        self.asks.values().next().copied()
    }

    /// Standing bids and asks.
    pub fn len(&self) -> (usize, usize) {
        (self.bids.len(), self.asks.len())
    }

    /// Whether both sides are empty.
    pub fn is_empty(&self) -> bool {
        self.bids.is_empty() && self.asks.is_empty()
    }

    /// Withdraws `owner`'s standing order, if any; returns it.
    pub fn cancel(&mut self, owner: K) -> Option<Order<K>> {
        let (side, price, seq) = self.index.remove(&owner)?;
        match side {
            Side::Bid => self.bids.remove(&(Reverse(price), seq)),
            Side::Ask => self.asks.remove(&(price, seq)),
        }
    }

    /// Removes every standing order (Gode & Sunder: a trade cancels all unaccepted orders).
    pub fn clear(&mut self) {
        self.bids.clear();
        self.asks.clear();
        self.index.clear();
    }

    /// A buyer's bid for `qty` units at up to `price` each. Trades at most once, all or
    /// nothing, against the cheapest ask at or below `price` that can fill it, at that ask's
    /// price; otherwise the bid stands. Replaces `owner`'s previous order.
    pub fn submit_bid(&mut self, owner: K, price: Money, qty: u32) -> Option<Trade<K>> {
        self.cancel(owner);
        let mut hit = None;
        for (key, ask) in &self.asks {
            if ask.price > price {
                break;
            }
            if ask.qty >= qty && ask.owner != owner {
                hit = Some((*key, *ask));
                break;
            }
        }
        if let Some((key, ask)) = hit {
            let left = ask.qty - qty;
            if left == 0 {
                self.asks.remove(&key);
                self.index.remove(&ask.owner);
            } else if let Some(a) = self.asks.get_mut(&key) {
                a.qty = left;
            }
            return Some(Trade {
                buyer: owner,
                seller: ask.owner,
                price: ask.price,
                qty,
            });
        }
        self.seq += 1;
        self.bids
            .insert((Reverse(price), self.seq), Order { owner, price, qty });
        self.index.insert(owner, (Side::Bid, price, self.seq));
        None
    }

    /// A seller's ask of `qty` units at `price` or more each. Fills standing bids at or above
    /// `price`, best first, each at the bid's price, while units remain and a bid fits; the
    /// rest stands. Replaces `owner`'s previous order.
    pub fn submit_ask(&mut self, owner: K, price: Money, qty: u32) -> Vec<Trade<K>> {
        self.cancel(owner);
        let mut left = qty;
        let mut trades = Vec::new();
        let mut filled = Vec::new();
        for (key, bid) in &self.bids {
            if left == 0 || bid.price < price {
                break;
            }
            if bid.qty <= left && bid.owner != owner {
                left -= bid.qty;
                filled.push(*key);
                trades.push(Trade {
                    buyer: bid.owner,
                    seller: owner,
                    price: bid.price,
                    qty: bid.qty,
                });
            }
        }
        for key in filled {
            if let Some(b) = self.bids.remove(&key) {
                self.index.remove(&b.owner);
            }
        }
        if left > 0 {
            self.seq += 1;
            self.asks.insert(
                (price, self.seq),
                Order {
                    owner,
                    price,
                    qty: left,
                },
            );
            self.index.insert(owner, (Side::Ask, price, self.seq));
        }
        trades
    }
}

/// A sealed bid in a reverse auction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealedBid<K> {
    /// The bidding provider.
    pub owner: K,
    /// Asked price per GPU-hour.
    pub price: Money,
}

/// The winning bid's index: the lowest price at or below `reserve`; ties go to the lowest
/// owner, then the earliest bid. `None` when no bid is acceptable.
pub fn reverse_auction_winner<K: Ord>(bids: &[SealedBid<K>], reserve: Money) -> Option<usize> {
    bids.iter()
        .enumerate()
        .filter(|(_, b)| b.price <= reserve)
        .min_by(|(ia, a), (ib, b)| {
            a.price
                .cmp(&b.price)
                .then_with(|| a.owner.cmp(&b.owner))
                .then_with(|| ia.cmp(ib))
        })
        .map(|(i, _)| i)
}

/// One pair of a call market's clearing ([`clear_call_market`]): `buyer` gets `qty` units
/// from `seller`, at the clearing's one price.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallTrade<K> {
    /// The buyer (owner of the bid).
    pub buyer: K,
    /// The seller (owner of the ask).
    pub seller: K,
    /// Units: the bid's whole quantity.
    pub qty: u32,
}

/// The outcome of one call ([`clear_call_market`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallClearing<K> {
    /// The matched pairs, in matching order (highest bid first).
    pub trades: Vec<CallTrade<K>>,
    /// The one price every trade of the call pays per unit; `None` without trades.
    pub price: Option<Money>,
}

/// Clears one call of a k-double auction.
///
/// Bids are taken highest first (ties: input order), each matched with the lowest remaining
/// ask (ties: input order) that is at or below it, can fill its whole quantity (a bid is
/// all-or-nothing; an ask may be split over several bids) and that `fits` accepts (e.g. the
/// lease must end before the offer does); matching stops at the first bid below the lowest
/// remaining ask, or below an ask already matched. Every trade pays
/// `p = a* + k (b* - a*)`, `k = k_permille / 1000` (at most 1000), rounded down to the
/// micro-unit, where
/// - `b*` is the last matched bid, the lowest matched bid (bids are taken highest first),
/// - `a*` is the highest matched ask; with unit quantities and `fits` always true, asks are
///   matched lowest first, so this is the last matched ask.
///
/// Why the last matched pair (and not the first unmatched one): the matching keeps every
/// matched ask at or below every matched bid, so `a* <= p <= b*` and no matched trader
/// trades beyond its limit at the common price. `k = 0` gives the sellers' limit, `k = 1`
/// the buyers'. Hand case (unit orders, `k = 0.5`): bids 0.9, 0.7, 0.4, 0.2 and asks 0.1,
/// 0.3, 0.5, 0.8 give two trades, (0.9, 0.1) and (0.7, 0.3), both at `0.3 + 0.5 (0.7 - 0.3)
/// = 0.5`; 0.4 is below the lowest remaining ask 0.5.
///
/// Cost: O((b + a) log + b a) for b bids and a asks in the worst case (each bid scans the
/// asks at or below it).
pub fn clear_call_market<K: Copy>(
    bids: &[Order<K>],
    asks: &[Order<K>],
    k_permille: u16,
    mut fits: impl FnMut(&Order<K>, &Order<K>) -> bool,
) -> CallClearing<K> {
    let k = u128::from(k_permille.min(1000));
    let mut bid_order: Vec<usize> = (0..bids.len()).collect();
    bid_order.sort_by_key(|&i| (Reverse(bids[i].price), i));
    let mut ask_order: Vec<usize> = (0..asks.len()).collect();
    ask_order.sort_by_key(|&i| (asks[i].price, i));
    let mut left: Vec<u32> = asks.iter().map(|a| a.qty).collect();
    let mut trades = Vec::new();
    let mut a_star: Option<Money> = None;
    let mut b_star: Option<Money> = None;
    for &bi in &bid_order {
        let bid = &bids[bi];
        if bid.qty == 0 {
            continue;
        }
        if a_star.is_some_and(|a| bid.price < a) {
            break;
        }
        let Some(&lowest) = ask_order.iter().find(|&&a| left[a] > 0) else {
            break;
        };
        if asks[lowest].price > bid.price {
            break;
        }
        let hit = ask_order
            .iter()
            .copied()
            .take_while(|&a| asks[a].price <= bid.price)
            .find(|&a| left[a] >= bid.qty && fits(bid, &asks[a]));
        if let Some(a) = hit {
            left[a] -= bid.qty;
            trades.push(CallTrade {
                buyer: bid.owner,
                seller: asks[a].owner,
                qty: bid.qty,
            });
            a_star = Some(a_star.map_or(asks[a].price, |x| x.max(asks[a].price)));
            b_star = Some(bid.price);
        }
    }
    let price = match (a_star, b_star) {
        (Some(a), Some(b)) => {
            let spread = u128::from(b.micros().saturating_sub(a.micros()));
            Some(Money::from_micros(a.micros() + (spread * k / 1000) as u64))
        }
        _ => None,
    };
    CallClearing { trades, price }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(micros: u64) -> Money {
        Money::from_micros(micros)
    }

    #[test]
    fn crossing_bid_trades_at_the_standing_ask() {
        let mut b = DoubleAuction::new();
        assert!(b.submit_ask(1u32, m(100), 1).is_empty());
        assert!(b.submit_ask(2, m(90), 1).is_empty());
        assert_eq!(b.submit_bid(10, m(80), 1), None);
        let t = b.submit_bid(11, m(120), 1).unwrap();
        assert_eq!((t.seller, t.price, t.buyer), (2, m(90), 11));
        assert_eq!(b.best_ask().unwrap().owner, 1);
        assert_eq!(b.best_bid().unwrap().owner, 10);
    }

    #[test]
    fn crossing_ask_trades_at_the_standing_bid_best_first() {
        let mut b = DoubleAuction::new();
        b.submit_bid(10u32, m(100), 1);
        b.submit_bid(11, m(150), 2);
        b.submit_bid(12, m(150), 1);
        let t = b.submit_ask(1, m(90), 3);
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].buyer, t[0].price, t[0].qty), (11, m(150), 2));
        assert_eq!((t[1].buyer, t[1].price, t[1].qty), (12, m(150), 1));
        assert_eq!(b.len(), (1, 0));
    }

    #[test]
    fn all_or_nothing_bids_skip_small_asks() {
        let mut b = DoubleAuction::new();
        b.submit_ask(1u32, m(50), 1);
        b.submit_ask(2, m(60), 4);
        let t = b.submit_bid(10, m(100), 2).unwrap();
        assert_eq!((t.seller, t.price), (2, m(60)));
        assert_eq!(b.best_ask().unwrap().owner, 1);
        assert_eq!(b.len(), (0, 2));
    }

    #[test]
    fn replace_cancel_and_clear() {
        let mut b = DoubleAuction::new();
        b.submit_bid(10u32, m(100), 1);
        b.submit_bid(10, m(50), 1);
        assert_eq!(b.len(), (1, 0));
        assert_eq!(b.best_bid().unwrap().price, m(50));
        assert!(b.cancel(10).is_some());
        assert!(b.cancel(10).is_none());
        b.submit_ask(1, m(70), 1);
        b.clear();
        assert!(b.is_empty());
    }

    #[test]
    fn time_priority_at_equal_price() {
        let mut b = DoubleAuction::new();
        b.submit_ask(5u32, m(70), 1);
        b.submit_ask(3, m(70), 1);
        assert_eq!(b.submit_bid(9, m(70), 1).unwrap().seller, 5);
    }

    fn unit(owner: u32, micros: u64) -> Order<u32> {
        Order {
            owner,
            price: m(micros),
            qty: 1,
        }
    }

    #[test]
    fn call_market_hand_case_two_trades_at_one_half() {
        let bids = [
            unit(1, 900_000),
            unit(2, 700_000),
            unit(3, 400_000),
            unit(4, 200_000),
        ];
        let asks = [
            unit(11, 100_000),
            unit(12, 300_000),
            unit(13, 500_000),
            unit(14, 800_000),
        ];
        let c = clear_call_market(&bids, &asks, 500, |_, _| true);
        assert_eq!(c.price, Some(m(500_000)));
        let pairs: Vec<_> = c.trades.iter().map(|t| (t.buyer, t.seller)).collect();
        assert_eq!(pairs, [(1, 11), (2, 12)]);
        // Order of the input does not matter; k moves the price between a* and b*.
        let rev_bids: Vec<_> = bids.iter().rev().copied().collect();
        let rev_asks: Vec<_> = asks.iter().rev().copied().collect();
        let c = clear_call_market(&rev_bids, &rev_asks, 0, |_, _| true);
        assert_eq!((c.trades.len(), c.price), (2, Some(m(300_000))));
        let c = clear_call_market(&bids, &asks, 1000, |_, _| true);
        assert_eq!(c.price, Some(m(700_000)));
        let c = clear_call_market(&bids, &asks, 250, |_, _| true);
        assert_eq!(c.price, Some(m(400_000)));
    }

    #[test]
    fn call_market_without_a_cross_trades_nothing() {
        let c = clear_call_market(&[unit(1, 100)], &[unit(2, 200)], 500, |_, _| true);
        assert_eq!(
            c,
            CallClearing {
                trades: vec![],
                price: None
            }
        );
        let c = clear_call_market::<u32>(&[], &[unit(2, 200)], 500, |_, _| true);
        assert_eq!(c.price, None);
    }

    #[test]
    fn call_market_bids_are_all_or_nothing_and_the_price_stays_within_every_limit() {
        // A 2-GPU bid at 0.9 can only be filled by the 0.8 ask; the 0.5 bid then cannot trade
        // at a price that also pays the 0.8 seller, so it is not matched.
        let bids = [
            Order {
                owner: 1u32,
                price: m(900),
                qty: 2,
            },
            unit(2, 500),
        ];
        let asks = [
            unit(11, 100),
            Order {
                owner: 12,
                price: m(800),
                qty: 4,
            },
        ];
        let c = clear_call_market(&bids, &asks, 500, |_, _| true);
        assert_eq!(
            c.trades,
            [CallTrade {
                buyer: 1,
                seller: 12,
                qty: 2
            }]
        );
        assert_eq!(c.price, Some(m(850)));
        // `fits` can refuse a pair: the bid takes the next ask that fits.
        let c = clear_call_market(
            &[unit(1, 900)],
            &[unit(11, 100), unit(12, 300)],
            500,
            |_, a| a.owner != 11,
        );
        assert_eq!(c.trades[0].seller, 12);
        assert_eq!(c.price, Some(m(600)));
        // An ask is split over several bids.
        let c = clear_call_market(
            &[unit(1, 900), unit(2, 800)],
            &[Order {
                owner: 11,
                price: m(100),
                qty: 2,
            }],
            500,
            |_, _| true,
        );
        assert_eq!(c.trades.len(), 2);
        assert_eq!(c.price, Some(m(450)));
    }

    #[test]
    fn reverse_auction_lowest_within_reserve() {
        let bids = [
            SealedBid {
                owner: 3u32,
                price: m(80),
            },
            SealedBid {
                owner: 1,
                price: m(70),
            },
            SealedBid {
                owner: 2,
                price: m(70),
            },
            SealedBid {
                owner: 4,
                price: m(10),
            },
        ];
        assert_eq!(reverse_auction_winner(&bids, m(100)), Some(3));
        assert_eq!(reverse_auction_winner(&bids[..3], m(100)), Some(1));
        assert_eq!(reverse_auction_winner(&bids[..3], m(60)), None);
        assert_eq!(reverse_auction_winner::<u32>(&[], m(60)), None);
    }
}
