//! gridlease market rules.
//!
//! What this crate is for: money ([`money`]), per-second billing ([`billing`]), offer and lease
//! term validation ([`terms`]), the lease state machine ([`lease`]), when a lease's container is
//! signalled ([`deadline`]), amending a running lease ([`amend`]), the payment channel
//! ([`channel`]) and what an offer may promise
//! from the host's capacity ([`capacity`]), which images a provider runs ([`image`]), and when a provider's schedule offers its GPUs ([`schedule`]). The node and the simulator both run exactly this
//! code.
//!
//! What it must never do: read the clock, draw randomness on its own, or perform I/O. Time and
//! randomness are parameters; every function here is deterministic. It depends on
//! `gridlease-protocol` only, never on tokio, libp2p, bollard or rusqlite.

pub mod amend;
pub mod billing;
pub mod book;
pub mod capacity;
pub mod channel;
pub mod deadline;
pub mod image;
pub mod ingest;
pub mod jobs;
pub mod lease;
pub mod money;
pub mod proof;
pub mod query;
pub mod schedule;
pub mod settlement;
pub mod statement;
pub mod terms;
pub mod volume;

pub use billing::{BilledTime, Tariff, cost, default_budget, interval_charge};
pub use channel::{
    Decision, ProviderChannel, ReceiptError, RenterChannel, UsageError, check_usage,
};
pub use deadline::StopSchedule;
pub use lease::{Actor, Lease, LeaseEvent, LeaseState, TransitionError};
pub use money::{Money, MoneyError};
pub use terms::{
    AcceptError, OfferError, ProviderView, check_accept, check_request, validate_offer,
};
pub mod auction;
pub mod pricing;
pub mod reputation;
