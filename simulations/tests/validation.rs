//! Gode & Sunder (1993) validation: ZI-C traders in the real double auction reach allocative
//! efficiency near 100 %, clearly above ZI-U on the same schedules.

// Helpers outside #[test] fns: a panic here is still a test failure with a location.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use gridlease_sim::zi::{Trader, experiment, market_a, market_b, max_surplus};

#[test]
fn zi_c_is_near_fully_efficient_and_beats_zi_u() {
    for (name, s) in [("A", market_a()), ("B", market_b())] {
        let c = experiment(&s, Trader::Constrained, 200, 2000, 1);
        let u = experiment(&s, Trader::Unconstrained, 200, 2000, 1);
        println!(
            "market {name}: max surplus {}, ZI-C eff {:.4} trades {} price {:.1}; ZI-U eff {:.4} trades {} price {:.1}",
            max_surplus(&s),
            c.efficiency,
            c.trades,
            c.mean_price,
            u.efficiency,
            u.trades,
            u.mean_price
        );
        assert!(c.efficiency >= 0.95, "market {name}: ZI-C {}", c.efficiency);
        assert!(
            c.efficiency - u.efficiency >= 0.10,
            "market {name}: ZI-C {} vs ZI-U {}",
            c.efficiency,
            u.efficiency
        );
    }
}
