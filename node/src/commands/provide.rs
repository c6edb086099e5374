//! `gridlease provide`: what this node offers.

use clap::Args;

use crate::api::client::ApiClient;
use crate::api::types::{ProvideBody, StatusView};
use crate::output::Printer;

/// Arguments of `gridlease provide`.
#[derive(Debug, Args)]
pub struct ProvideArgs {
    /// Price per GPU-hour, e.g. 0.40.
    #[arg(long, value_name = "AMOUNT", required_unless_present = "off")]
    pub price: Option<String>,
    /// GPUs to offer: `all` or UUIDs separated by commas.
    #[arg(long, default_value = "all", value_delimiter = ',')]
    pub gpus: Vec<String>,
    /// Longest lease, hours.
    #[arg(long, value_name = "H")]
    pub max_hours: Option<u32>,
    /// Network access tenants may get.
    #[arg(long, value_parser = ["none", "egress"], default_value = "none")]
    pub network_policy: String,
    /// Stop offering.
    #[arg(long)]
    pub off: bool,
}

/// Changes the offer.
pub async fn run(api: &ApiClient, out: &Printer, args: &ProvideArgs) -> anyhow::Result<u8> {
    if let Some(p) = &args.price {
        p.parse::<gridlease_contracts::Money>()?;
    }
    let body = ProvideBody {
        price: args.price.clone(),
        gpus: Some(args.gpus.clone()),
        max_hours: args.max_hours,
        network_policy: Some(args.network_policy.clone()),
        off: args.off,
    };
    let s: StatusView = api.put("/v1/provide", &body).await?;
    out.emit(&s, |p| match &s.own_offer {
        Some(o) => p.line(&format!(
            "offering {} GPU(s) at {}/GPU-hour (offer {})",
            o.gpus,
            o.price_per_gpu_hour,
            crate::output::short(&o.id)
        )),
        None => p.line("not offering anything"),
    });
    Ok(0)
}
