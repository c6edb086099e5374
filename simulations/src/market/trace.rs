//! The optional event trace: one row per market event of a run (`trace.csv`), bounded.

use gridlease_contracts::Money;
use gridlease_protocol::CloseReason;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceKind {
    /// A renter's new job arrived.
    Arrival,
    /// A renter submitted the rest of a job again (after a failed lease).
    Resubmission,
    /// A waiting submission ran out of patience.
    Abandon,
    /// A lease started (`amount`: its price per GPU-hour).
    LeaseStart,
    /// A lease ended (`amount`: what the renter paid; `reason`: why).
    LeaseEnd,
    /// A provider came online.
    Online,
    /// A provider went offline.
    Offline,
    /// A provider crashed.
    Crash,
    /// A provider came back after a crash.
    Repair,
}

impl TraceKind {
    /// The name in `trace.csv`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Arrival => "arrival",
            Self::Resubmission => "resubmission",
            Self::Abandon => "abandon",
            Self::LeaseStart => "lease_start",
            Self::LeaseEnd => "lease_end",
            Self::Online => "online",
            Self::Offline => "offline",
            Self::Crash => "crash",
            Self::Repair => "repair",
        }
    }
}

/// One traced event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceRow {
    /// Simulated time, ms since the start.
    pub t_ms: u64,
    /// What happened.
    pub kind: TraceKind,
    /// The renter involved, if any.
    pub renter: Option<u32>,
    /// The provider involved (index), if any.
    pub provider: Option<u32>,
    /// The provider identity (key) involved, if any.
    pub identity: Option<u32>,
    /// The lease (numbered from 0 in start order), if any.
    pub lease: Option<u64>,
    /// Price per GPU-hour (lease start) or amount paid (lease end).
    pub amount: Option<Money>,
    /// Why a lease ended.
    pub reason: Option<CloseReason>,
}

impl TraceRow {
    /// A row of `kind` at `t_ms` with nothing else set.
    pub fn at(t_ms: u64, kind: TraceKind) -> Self {
        Self {
            t_ms,
            kind,
            renter: None,
            provider: None,
            identity: None,
            lease: None,
            amount: None,
            reason: None,
        }
    }
}

/// A run's trace: at most `cap` rows, the first ones in event order; the rest are counted.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// The rows kept.
    pub rows: Vec<TraceRow>,
    /// Rows not kept because the cap was reached.
    pub dropped: u64,
    cap: usize,
}

impl Trace {
    /// An empty trace keeping at most `cap` rows.
    pub fn new(cap: usize) -> Self {
        Self {
            rows: Vec::new(),
            dropped: 0,
            cap,
        }
    }

    /// Adds a row, or counts it as dropped.
    pub fn push(&mut self, row: TraceRow) {
        if self.rows.len() < self.cap {
            self.rows.push(row);
        } else {
            self.dropped += 1;
        }
    }
}
