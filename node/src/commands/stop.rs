//! `gridlease stop`: end a lease now (renter: signed close; provider: stop the container);
//! with `--keep-disk` (renter), its `/workspace` is kept on the provider as a volume.

use std::time::Duration;

use clap::Args;
use gridlease_contracts::Money;
use serde::Serialize;

use crate::api::client::ApiClient;
use crate::api::types::RentedView;
use crate::lease::LeaseView;
use crate::output::{Printer, money, short};

/// Arguments of `gridlease stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// Lease id (or its first digits).
    #[arg(value_name = "LEASE")]
    pub lease: String,
    /// Keep the lease's `/workspace` on its provider as a volume (renter): the lease ends and
    /// settles, and the volume, of the workspace's size at the provider's volume price, is
    /// billed from then for `--keep`. Resume with `rent OFFER --volume NAME:/workspace`.
    #[arg(long, requires = "keep")]
    pub keep_disk: bool,
    /// With `--keep-disk`: how long the provider keeps it (`7d`, `12h`), unless extended.
    #[arg(long, value_name = "DURATION", requires = "keep_disk", value_parser = super::volume::parse_keep)]
    pub keep: Option<u32>,
    /// With `--keep-disk`: the volume's name (default: `lease-` and the lease id's first 8
    /// digits).
    #[arg(long, value_name = "NAME", requires = "keep_disk")]
    pub name: Option<String>,
    /// With `--keep-disk`: pay per window instead of for the whole keep period at once
    /// (`2h`, `all`), as `volume create --prepay`.
    #[arg(long, value_name = "DURATION|all", requires = "keep_disk", value_parser = super::rent::parse_prepay)]
    pub prepay: Option<u32>,
    /// With `--keep-disk`: the volume's budget cap (default: the cost of the keep period).
    #[arg(long, value_name = "AMOUNT", requires = "keep_disk", value_parser = super::parse_amount)]
    pub max_total: Option<Money>,
}

/// Body of `POST /v1/leases/{id}/keep-disk`.
#[derive(Debug, Serialize)]
struct KeepDiskBody<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    keep_s: u32,
    prepay_s: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_total: Option<String>,
}

/// What `stop --keep-disk --json` prints: the lease as it ended and its volume.
#[derive(Debug, Serialize)]
struct KeptDisk {
    lease: LeaseView,
    volume: LeaseView,
}

/// Longest wait for the lease to end and its volume to be kept (the provider's stop grace
/// is well within it).
const KEEP_WAIT: Duration = Duration::from_secs(180);

/// Stops a lease.
pub async fn run(api: &ApiClient, out: &Printer, args: &StopArgs) -> anyhow::Result<u8> {
    if let (true, Some(keep_s)) = (args.keep_disk, args.keep) {
        return keep_disk(api, out, args, keep_s).await;
    }
    let v = api.stop(&args.lease).await?;
    out.emit(&v, |p| p.line(&format!("stopping lease {}", v.lease_id)));
    Ok(0)
}

/// `stop --keep-disk`: the volume agreed, then followed until the lease has settled and the
/// volume is kept (exit 0) or could not be made (exit 1, with the provider's reason).
async fn keep_disk(
    api: &ApiClient,
    out: &Printer,
    args: &StopArgs,
    keep_s: u32,
) -> anyhow::Result<u8> {
    let body = KeepDiskBody {
        name: args.name.as_deref(),
        keep_s,
        prepay_s: args.prepay.unwrap_or(gridlease_protocol::PREPAY_ALL),
        max_total: args.max_total.map(|m| m.to_string()),
    };
    let made: RentedView = api
        .post(&format!("/v1/leases/{}/keep-disk", args.lease), &body)
        .await?;
    let until = tokio::time::Instant::now() + KEEP_WAIT;
    let (lease, volume) = loop {
        let volume: LeaseView = api.lease(&made.lease_id).await?;
        let lease: LeaseView = api.lease(&args.lease).await?;
        if volume.state.is_terminal() {
            let why = volume
                .failure
                .as_ref()
                .map_or_else(|| "it ended".to_string(), |f| f.message.clone());
            anyhow::bail!(
                "the disk of lease {} was not kept: {why}",
                short(&lease.lease_id.to_string())
            );
        }
        if volume.state == gridlease_contracts::LeaseState::Running && lease.state.is_terminal() {
            break (lease, volume);
        }
        if tokio::time::Instant::now() >= until {
            anyhow::bail!(
                "lease {} is {} and its volume {} is {} after {} s: see `gridlease leases`",
                short(&lease.lease_id.to_string()),
                lease.state.as_str(),
                short(&made.lease_id),
                volume.state.as_str(),
                KEEP_WAIT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let name = volume.volume.as_ref().map_or("", |v| v.name.as_str());
    let size = volume.volume.as_ref().map_or(0, |v| v.size_gib);
    let price = volume.volume.as_ref().map_or(0, |v| v.price_per_gib_hour);
    let kept = KeptDisk {
        lease: lease.clone(),
        volume: volume.clone(),
    };
    out.emit(&kept, |p| {
        p.line(&format!(
            "lease {} stopped and settled: {}",
            short(&lease.lease_id.to_string()),
            money(lease.settled_total.unwrap_or(lease.cost_so_far)),
        ));
        p.line(&format!(
            "its /workspace ({size} GiB) is volume {name} (lease {}), at {} per GiB-hour, deleted in {}",
            short(&made.lease_id),
            money(price),
            humantime::format_duration(Duration::from_secs(volume.time_left_s.unwrap_or(0))),
        ));
        if volume.prepay_s == gridlease_protocol::PREPAY_ALL {
            p.line(super::volume::PREPAY_NOTE);
        }
        p.line(&format!(
            "resume: gridlease rent OFFER --volume {name}:/workspace ... (an offer of the same provider)"
        ));
    });
    Ok(0)
}
