//! gridlease-sim: a deterministic agent-based digital twin of the gridlease market.
//!
//! What it is for: studying prices, utilization, waits, fairness and attacks in a market that
//! runs the *same* rules as the real node -- offer/request checks, the lease state machine,
//! per-second billing, the payment channel, pricing, auctions and reputation all come from
//! `gridlease-contracts`.
//!
//! What it must never do: read the wall clock or OS randomness on a path that changes
//! results, iterate a hash map where order matters, or re-implement a market rule that
//! `contracts` owns. Same scenario + seed => byte-identical outputs.

pub mod columnar;
pub mod design;
pub mod empirical;
pub mod engine;
pub mod manifest;
pub mod market;
pub mod metrics;
pub mod output;
pub mod plot;
pub mod rng;
pub mod scenario;
pub mod shards;
pub mod stats;
pub mod sweep;
pub mod table;
pub mod welfare;
pub mod zi;
