//! `gridlease provide`: what this node offers.

use clap::Args;

use crate::api::client::ApiClient;
use crate::api::types::{ProvideBody, StatusView};
use crate::output::Printer;

/// Arguments of `gridlease provide`.
#[derive(Debug, Args)]
pub struct ProvideArgs {
    /// Price per GPU-hour, e.g. 0.40 (above 0). Needed the first time; later ones keep the
    /// last price unless given. Every setting left out stays as the last `provide` set it.
    #[arg(long, value_name = "AMOUNT")]
    pub price: Option<String>,
    /// GPUs to offer: `all`, or ids from `gridlease gpus` (UUIDs, or declared-N) separated by
    /// commas.
    #[arg(long, value_delimiter = ',')]
    pub gpus: Option<Vec<String>>,
    /// Longest lease, hours (at least 1).
    #[arg(long, value_name = "H", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_hours: Option<u32>,
    /// Network access tenants may get.
    #[arg(long, value_parser = ["none", "egress"])]
    pub network_policy: Option<String>,
    /// Stop offering.
    #[arg(long)]
    pub off: bool,
}

/// Changes the offer.
pub async fn run(api: &ApiClient, out: &Printer, args: &ProvideArgs) -> anyhow::Result<u8> {
    if let Some(p) = &args.price {
        let m = p
            .parse::<gridlease_contracts::Money>()
            .map_err(|e| anyhow::anyhow!("--price {p:?}: {e}"))?;
        if m == gridlease_contracts::Money::ZERO {
            anyhow::bail!("--price must be above 0, e.g. --price 0.40");
        }
    }
    let body = ProvideBody {
        price: args.price.clone(),
        gpus: args.gpus.clone(),
        max_hours: args.max_hours,
        network_policy: args.network_policy.clone(),
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
