//! `gridlease logs`: a lease's container output (renters fetch it from the provider).

use clap::Args;

use crate::api::client::ApiClient;
use crate::output::Printer;

/// Arguments of `gridlease logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Lease id (or its first digits).
    #[arg(value_name = "LEASE")]
    pub lease: String,
    /// Keep following until the container exits.
    #[arg(short, long)]
    pub follow: bool,
}

/// Prints output.
pub async fn run(api: &ApiClient, out: &Printer, args: &LogsArgs) -> anyhow::Result<u8> {
    super::rent::follow_logs(api, out, &args.lease, 0, args.follow).await?;
    Ok(0)
}
