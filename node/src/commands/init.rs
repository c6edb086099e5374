//! `gridlease init`.

use std::path::Path;

use anyhow::Context;
use clap::Args;
use gridlease_protocol::NetworkId;

use crate::home::Home;

/// Arguments of `gridlease init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// Network to join: `devnet` or a name of 1-32 characters a-z, 0-9, '-'.
    #[arg(long, default_value = "devnet")]
    pub network: String,
}

/// Creates the identity; returns the line to print.
pub fn run(home: &Path, args: &InitArgs) -> anyhow::Result<String> {
    let network = NetworkId::new(&args.network)?;
    let h = Home::init(home, &network)
        .with_context(|| format!("cannot initialize {}", home.display()))?;
    let wallet = h
        .wallet()
        .with_context(|| format!("cannot make the wallet key in {}", home.display()))?;
    Ok(format!(
        "initialized {} on network {}\npeer id {}\nwallet  {}",
        h.dir.display(),
        h.network,
        h.key.peer_id(),
        wallet.address()
    ))
}
