//! gridlease node: the libp2p network actor, offer gossip and the offer book, lease
//! negotiation, the SQLite store, and the `gridlease` command line.
//!
//! What this crate is for: everything that does I/O for a gridlease node. Market rules (offer
//! validity, which requests to accept, the book and the query language) come from
//! `gridlease-contracts`; wire types and signatures from `gridlease-protocol`.
//!
//! What it must never do: decide market rules itself, block the network event loop on disk, hold
//! the swarm behind a shared lock, or acknowledge a lease before it is stored.

pub mod access;
pub mod api;
pub mod chain;
pub mod clock;
pub mod commands;
pub mod config;
pub mod dashboard;
pub mod env_vars;
pub mod home;
pub mod jobs;
pub mod lease;
pub mod metrics;
pub mod net;
pub mod output;
pub mod provider_gpus;
pub mod provider_proof;
pub mod renter;
pub mod settlement;
pub mod store;
