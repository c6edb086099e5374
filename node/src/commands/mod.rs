//! The command line: one file per subcommand. `main.rs` parses and dispatches.

pub mod init;
pub mod node;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::env_vars;

/// gridlease: a peer-to-peer GPU rental market.
#[derive(Debug, Parser)]
#[command(name = "gridlease", version, about)]
pub struct Cli {
    /// Node home directory (identity, database). Defaults to ~/.gridlease.
    #[arg(long, global = true, env = env_vars::GRIDLEASE_HOME, value_name = "DIR")]
    pub home: Option<PathBuf>,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The home directory to use.
    pub fn home_dir(&self) -> PathBuf {
        self.home.clone().unwrap_or_else(crate::home::default_home)
    }
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a node identity and database; refuses to overwrite an existing identity.
    Init(init::InitArgs),
    /// Run the node daemon in the foreground (Ctrl-C to stop).
    Node(node::NodeArgs),
}
