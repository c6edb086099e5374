//! Every environment variable gridlease reads, in one place.

/// The node's home directory (same as `--home`).
pub const GRIDLEASE_HOME: &str = "GRIDLEASE_HOME";
/// `tracing` filter directives, e.g. `info,gridlease_node=debug`.
pub const RUST_LOG: &str = "RUST_LOG";
/// The user's home; the default node home is `$HOME/.gridlease`.
pub const HOME: &str = "HOME";
