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
    /// Provider: cheat the renter's GPU check at the commitment (the computation cheats are
    /// the prover's: `gridlease_sandbox::proof::Cheating`).
    pub proof: Option<ProofCheat>,
}

/// How a faulty provider cheats the GPU check at its commitment.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProofCheat {
    /// Answers each check with the commitment of this node's first check (another lease,
    /// another seed).
    Replay,
    /// Answers as a GPU this many times slower than the offer's rate allows would: no sooner
    /// than this many times the challenge's expected time at that rate.
    Slow(u32),
}

/// The replayed commitment ([`ProofCheat::Replay`]): the first one this process made.
static FIRST_COMMIT: std::sync::Mutex<
    Option<gridlease_protocol::Signed<gridlease_protocol::proof::ProofCommit>>,
> = std::sync::Mutex::new(None);

/// The commitment a faulty provider sends instead of `honest` (whose work took `work_ms`,
/// where the offer's rate allows `expected_ms`).
pub(crate) async fn proof_commit(
    cheat: Option<ProofCheat>,
    honest: gridlease_protocol::Signed<gridlease_protocol::proof::ProofCommit>,
    work_ms: u64,
    expected_ms: u64,
) -> gridlease_protocol::Signed<gridlease_protocol::proof::ProofCommit> {
    match cheat {
        None => honest,
        Some(ProofCheat::Slow(factor)) => {
            let total = expected_ms.saturating_mul(u64::from(factor));
            tokio::time::sleep(Duration::from_millis(total.saturating_sub(work_ms))).await;
            honest
        }
        Some(ProofCheat::Replay) => {
            let mut first = FIRST_COMMIT
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            first.get_or_insert(honest).clone()
        }
    }
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
