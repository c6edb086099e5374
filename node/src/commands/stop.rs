//! `gridlease stop`: end a lease now (renter: signed close; provider: stop the container).

use clap::Args;

use crate::api::client::ApiClient;
use crate::output::Printer;

/// Arguments of `gridlease stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// Lease id (or its first digits).
    #[arg(value_name = "LEASE")]
    pub lease: String,
}

/// Stops a lease.
pub async fn run(api: &ApiClient, out: &Printer, args: &StopArgs) -> anyhow::Result<u8> {
    let v = api.stop(&args.lease).await?;
    out.emit(&v, |p| p.line(&format!("stopping lease {}", v.lease_id)));
    Ok(0)
}
