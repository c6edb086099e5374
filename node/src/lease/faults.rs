//! Test-only misbehaviour of this node's sessions: the fault hooks the tests switch on.

use std::time::Duration;

/// Test-only misbehaviour of this node's sessions (see [`LeaseServiceConfig::faults`]).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Provider: from this usage report sequence on, claim twice the wall time (and the
    /// matching amount).
    pub inflate_usage_from_seq: Option<u64>,
    /// Renter: once this many receipts were sent, answer the next report with a bad receipt.
    pub bad_receipt_after: Option<(u64, BadReceipt)>,
    /// Provider: wait this long before creating the container, as a slow image pull would.
    pub slow_start: Option<Duration>,
    /// Provider: end the session right after creating the container, writing nothing more,
    /// as a node stopped (or killed) between create and start would.
    pub stop_after_create: bool,
    /// Provider: decide and store leases but never run their sessions (negotiation tests
    /// without Docker): they stay `accepted`, holding their GPUs.
    pub hold_sessions: bool,
    /// Provider: accept (and store, and act on) a lease's first extension but answer `Busy`,
    /// as if the answer were lost on the way.
    pub lose_first_extend_answer: bool,
}

/// Which bad receipt a faulty renter sends.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadReceipt {
    /// The previous receipt again.
    Replay,
    /// A new sequence with a lower total.
    Decreasing,
}
