//! `gridlease leases`: this node's leases with live metered usage.

use clap::Args;

use super::rent::money;
use crate::api::client::ApiClient;
use crate::output::{Printer, short};

/// Arguments of `gridlease leases`.
#[derive(Debug, Args)]
pub struct LeasesArgs {
    /// Also show settled and failed leases.
    #[arg(long)]
    pub all: bool,
}

/// Prints leases.
pub async fn run(api: &ApiClient, out: &Printer, args: &LeasesArgs) -> anyhow::Result<u8> {
    let mut views: Vec<serde_json::Value> = api.get("/v1/leases").await?;
    if !args.all {
        views.retain(|v| !matches!(v["state"].as_str(), Some("settled" | "failed" | "rejected")));
    }
    out.emit(&views, |p| {
        if views.is_empty() {
            p.line(if args.all {
                "no leases"
            } else {
                "no active leases (--all shows finished ones)"
            });
            return;
        }
        let rows = views
            .iter()
            .map(|v| {
                let u = &v["usage"];
                vec![
                    short(v["lease_id"].as_str().unwrap_or("?")),
                    v["role"].as_str().unwrap_or("?").to_string(),
                    v["state"].as_str().unwrap_or("?").to_string(),
                    short(v["counterparty"].as_str().unwrap_or("?")),
                    v["gpus"].to_string(),
                    u["gpu_util_permille"]
                        .as_u64()
                        .map_or("-".into(), |x| format!("{:.0}%", x as f64 / 10.0)),
                    u["vram_peak_mib"]
                        .as_u64()
                        .map_or("-".into(), |x| format!("{x} MiB")),
                    u["cpu_ms"]
                        .as_u64()
                        .map_or("-".into(), |x| format!("{:.1}", x as f64 / 1000.0)),
                    money(&v["cost_so_far"]),
                    money(&v["paid"]),
                    v["time_left_s"]
                        .as_u64()
                        .map_or("-".into(), |x| format!("{x} s")),
                ]
            })
            .collect();
        p.table(
            &[
                "lease",
                "role",
                "state",
                "counterparty",
                "gpus",
                "gpu util",
                "vram",
                "cpu s",
                "cost",
                "paid",
                "left",
            ],
            rows,
        );
    });
    Ok(0)
}
