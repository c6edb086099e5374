//! gridlease sandbox: everything that touches the provider's machine.
//!
//! What this crate is for: running a renter's container under a hardened Docker spec with
//! exactly the leased GPUs ([`spec`], [`runtime`]) under runc or gVisor ([`isolation`]), the project's own seccomp profile
//! ([`seccomp`]) and a disk-backed, size-limited `/workspace` ([`workspace`]), fencing `egress`
//! tenants off the provider's LAN and host with host firewall rules ([`firewall`]), reading what
//! the host has to give ([`host`]), metering what a container uses ([`meter`]), building the
//! registry-free probe image used by tests ([`probe_image`]), describing and benchmarking
//! the provider's GPUs ([`gpu`], [`bench`](mod@bench)), and computing a renter's proof-of-GPU
//! challenge on them ([`proof`]).
//!
//! What it must never do: give a tenant container privileges, host namespaces, host paths or
//! the Docker socket (its only mounts are the lease's own volumes: `/tmp` and the workspace);
//! let a tenant write more to the provider's disk than its workspace; widen GPU access beyond
//! the leased UUIDs; panic when there is no GPU, no CUDA or no Docker. It does not depend on
//! the node crate or decide money.

pub mod access;
pub mod bench;
pub mod dev_gpus;
pub mod direct;
pub mod docker;
pub mod files;
pub mod firewall;
pub mod gpu;
pub mod host;
pub mod images;
pub mod isolation;
pub mod meter;
pub mod probe_image;
pub mod proof;
pub mod runtime;
pub mod seccomp;
pub mod spec;
pub mod time;
pub mod unpack;
pub mod workspace;

pub use docker::{ConnectError, connect};
pub use runtime::{ExitInfo, PullProgress, ReconcileReport, Sandbox, SandboxError};
pub use spec::{SandboxSpec, SpecError, build_create_body};
pub use workspace::{Workspace, WorkspaceError};
