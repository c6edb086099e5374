//! Leases end to end (issue 5): the provider agent that runs the renter's container, per-second
//! metering, signed usage reports answered by signed cumulative receipts, the double-entry
//! ledger, and crash recovery.
//!
//! # Shape
//! [`LeaseService`] is a cloneable handle to one actor task (the *service*), spawned next to the
//! network client by [`LeaseService::start`]. The network loop forwards every lease-stream
//! request to the service ([`crate::net::InboundLease`]). The service owns:
//! - the provider's [`desk::Desk`]: deciding requests, GPU holds and the nonce index. An
//!   accepted lease is stored, then answered, then its session is spawned from the row in
//!   hand (no re-read, no rescan);
//! - one task per live lease (a *session*: [`provider`] or [`renter`]), the one in-memory owner
//!   of that lease's state. It routes inbound session messages to it over bounded channels.
//!   Each session publishes its [`LeaseView`] on a `watch` channel, so reading state never
//!   waits for a busy session; a provider session's end (container gone) releases its holds.
//!
//! # Files
//! - [`config`]: [`LeaseServiceConfig`], [`SharedGpuSampler`], the
//!   queue bounds;
//! - [`error`]: [`RentError`], [`LeaseError`], [`RemoteError`], [`SessionRpcError`] (and
//!   [`NegotiateError`] in [`negotiate`], [`ExtendError`] in [`extend`]);
//! - `ctx`: the context shared by the service and its sessions;
//! - [`service`]: the [`LeaseService`] handle, its start-up and operations;
//! - `actor`: the actor behind the handle (commands, inbound requests, the desk, sessions);
//! - [`negotiate`]: the renter's half of negotiation (the provider's: [`desk`]);
//! - [`session`]: plumbing shared by sessions (inbound requests, persisted transitions,
//!   signing); `rpc`: one session request to the other side;
//! - [`provider`], [`renter`]: the two sessions; [`extend`], [`completion`], [`logs`],
//!   [`telemetry`], [`images`], [`owner`], [`watchdog`], [`retention`]: what they use;
//! - `faults` (feature `faults` only): test-only misbehaviour.
//!
//! The rent request itself ([`RentRequest`]) and the terms made from it are the renter's
//! ([`crate::renter`]); this module re-exports the request.
//!
//! Money rules come from `gridlease_contracts::channel` and `gridlease_contracts::billing`;
//! nothing here decides an amount. Time comes from [`LeaseServiceConfig::clock`].
//!
//! # API (what the control API calls)
//! - [`LeaseService::rent`]`(RentRequest) -> Result<LeaseId, RentError>`: negotiates with the
//!   offer's provider, stores the lease, starts the renter session, returns; the run proceeds in
//!   the background. A refusal is [`RentError::Rejected`] with the provider's `RejectReason`.
//! - [`LeaseService::leases`]`() -> Vec<LeaseView>`, [`LeaseService::lease`]`(id) ->
//!   Option<LeaseView>`.
//! - [`LeaseService::logs`]`(id, from_offset) -> Result<LogChunk, LeaseError>`: a renter
//!   fetches from the provider over the network; a provider reads locally. At most
//!   [`wire::MAX_LOG_CHUNK`] bytes per call, read from the file the lease's [`logs::LogWriter`]
//!   fills; neither way goes through the session.
//! - [`LeaseService::stop`]`(id)`: renter sends a signed `LeaseClose`; provider stops the
//!   container. Either way the lease settles at the last valid receipt.
//! - [`LeaseService::ledger`]`() -> Ledger`.
//! - [`LeaseService::provide`]`(ProvideSettings)`: what this node offers; republished at once.
//! - [`LeaseService::wait_closed`]`(id) -> Result<LeaseView, LeaseError>`: resolves when the
//!   lease is settled or failed (in-process callers and tests; the CLI's `rent` polls
//!   `GET /v1/leases/{id}` instead).
//!
//! # Invariants
//! - Persist before act: a transition whose store write fails does not happen (the session
//!   does not advance in memory, no container starts, nothing is acknowledged).
//! - A GPU is held from the accept until its lease's container is gone.
//! - A receipt is persisted (with its ledger rows, in one transaction) before the renter sends
//!   it and before the provider counts it.
//! - A usage report is persisted by the provider before it is sent, so sequences never repeat
//!   after a crash.
//! - Final statement = last valid receipt, on both nodes.

mod actor;
mod capacity;
mod channel;
pub mod check_view;
pub(crate) mod completion;
pub mod config;
mod ctx;
pub mod desk;
mod egress;
pub mod error;
pub mod extend;
#[cfg(feature = "faults")]
mod faults;
pub mod gpu_check;
pub mod hours;
pub mod images;
pub mod logs;
pub mod negotiate;
mod outputs;
pub mod owner;
pub mod prover;
pub mod provider;
pub mod renter;
pub mod retention;
mod rpc;
pub mod service;
pub mod session;
mod settings;
pub mod telemetry;
pub mod view;
pub mod wallet;
pub mod watchdog;
pub mod wire;

pub use config::{
    BUSY_UTIL_PERCENT, INBOUND_QUEUE, LeaseServiceConfig, MAX_LOG_BYTES, OWNER_IDLE_S,
    RENTER_GRACE_S, SERVICE_QUEUE, SESSION_QUEUE, SharedGpuSampler,
};
/// The sessions' shared context (re-exported for `logs`, which names it `super::Ctx`).
pub(crate) use ctx::Ctx;
pub use error::{LeaseError, RemoteError, RentError, SessionRpcError};
pub use extend::{ExtendError, ExtendFailure, ExtendRequest, Extended};
#[cfg(feature = "faults")]
pub use faults::{BadReceipt, Faults, ProofCheat};
pub use negotiate::{NegotiateError, NegotiationOutcome, negotiate, negotiate_signed};
pub use service::{LeaseService, start_for_daemon};
pub use session::{InboundSession, SessionReply};
pub use settings::{ProvideError, ProvideSettings};
pub use view::{FailureView, LeaseStatement, LeaseView, Ledger, PullView, UsageView};
pub use wire::{LogChunk, SessionRequest, SessionResponse};

pub use crate::renter::RentRequest;
