//! `gridlease-sim zi`: the Gode & Sunder validation, printed.

use anyhow::Result;
use gridlease_sim::zi::{Trader, experiment, market_a, market_b, max_surplus};

use crate::Printer;

pub(crate) fn zi(periods: u32, shouts: u32, seed: u64, p: &Printer) -> Result<()> {
    let mut rows = Vec::new();
    for (name, s) in [("A", market_a()), ("B", market_b())] {
        for kind in [Trader::Constrained, Trader::Unconstrained] {
            let r = experiment(&s, kind, periods, shouts, seed);
            let k = if kind == Trader::Constrained {
                "ZI-C"
            } else {
                "ZI-U"
            };
            p.result(
                &format!(
                    "market {name} {k}: efficiency {:.4}, trades {}, mean price {:.2} (max surplus {})",
                    r.efficiency,
                    r.trades,
                    r.mean_price,
                    max_surplus(&s)
                ),
                &serde_json::json!({ "market": name, "trader": k, "efficiency": r.efficiency,
                    "trades": r.trades, "mean_price": r.mean_price }),
            );
            rows.push(r);
        }
    }
    Ok(())
}
