//! The local control API: HTTP/1.1 with JSON bodies on a Unix socket in the node's home
//! (`<home>/api.sock`, mode 0600, in a 0700 directory), versioned paths under `/v1`.
//! The CLI ([`client`]) is a typed client of it. Its OpenAPI document is generated from the
//! routes ([`api_router`], [`openapi`]) and committed as `docs/openapi.json`; every error
//! answer is a [`Problem`] (`application/problem+json`); `docs/api.md` is the overview.
//!
//! Invariant: the API only reads and asks; it never holds the swarm or the store. Every handler
//! goes through the network [`Client`] (bounded channel to the swarm task) or the lease service.

pub mod client;
pub mod openapi;
pub mod problem;
pub mod types;

mod access;
mod jobs;
mod leases;
mod listen;
mod node;
mod offers;
mod provide;
mod refusals;
mod resolve;
mod router;
mod ssh;
mod volumes;

use std::sync::Arc;
use std::time::Instant;

use crate::lease::LeaseService;
use crate::net::Client;
pub use leases::{EOF_HEADER, EXIT_CODE_HEADER, LogsParams, NEXT_OFFSET_HEADER, TelemetryParams};
pub use offers::{
    CLASS_FETCH_WAIT, FETCHING_CLASSES_HEADER, FOLLOWED_CLASSES_HEADER, MAX_SEARCH_LIMIT,
    NEXT_PAGE_HEADER, OffersParams, fetch_named_classes, offer_row,
};
pub use problem::{ApiError, Problem, ProblemType};
pub use refusals::env_text;
pub use router::{ServeError, api_router, document, ensure_not_running, router, serve};
use types::GpusView;

pub use client::{SOCKET_FILE, socket_path};

/// What handlers can reach.
#[derive(Clone)]
pub struct ApiState {
    /// The network actor.
    pub client: Client,
    /// When the daemon started.
    pub started: Instant,
    /// Local GPUs (found or declared at start).
    pub gpus: Arc<GpusView>,
    /// Leases: renting, providing, logs, ledger.
    pub leases: LeaseService,
    /// Jobs: batches of tasks over leases.
    pub jobs: crate::jobs::JobService,
    /// The node's home (the SSH host keys' seed lives under it).
    pub home: Arc<std::path::Path>,
    /// The settlement wallet's address (`<home>/wallet.key`).
    pub wallet: gridlease_protocol::wallet::Address,
    /// The settlement service's status, when it runs (`chain_rpc`).
    pub settlement: Option<crate::settlement::SettlementHandle>,
}
