//! `gridlease leases`: this node's leases with live metered usage.

use clap::Args;

use crate::api::client::ApiClient;
use crate::output::{Printer, money, short};

/// Arguments of `gridlease leases`.
#[derive(Debug, Args)]
pub struct LeasesArgs {
    /// Also show settled and failed leases.
    #[arg(long)]
    pub all: bool,
    /// Show every column, however wide the terminal.
    #[arg(long)]
    pub wide: bool,
}

/// Prints leases.
pub async fn run(api: &ApiClient, out: &Printer, args: &LeasesArgs) -> anyhow::Result<u8> {
    let mut views = api.leases().await?;
    if !args.all {
        views.retain(|v| !v.is_terminal());
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
                let u = v.usage.as_ref();
                // Declared GPUs: nothing measures them (null), shown as n/a, never 0.
                let gpu = |x: Option<String>| x.unwrap_or_else(|| "n/a".into());
                vec![
                    short(&v.lease_id.to_string()),
                    v.role.as_str().to_string(),
                    v.state.as_str().to_string(),
                    short(&v.counterparty),
                    // A volume lease keeps disk, not GPUs (`volume ls` lists them).
                    v.volume
                        .as_ref()
                        .map_or_else(|| v.gpus.to_string(), |x| format!("vol {}G", x.size_gib)),
                    u.map_or("-".into(), |u| {
                        gpu(u
                            .gpu_util_permille
                            .map(|p| format!("{:.0}%", f64::from(p) / 10.0)))
                    }),
                    u.map_or("-".into(), |u| {
                        gpu(u.vram_peak_mib.map(|m| format!("{m} MiB")))
                    }),
                    u.map_or("-".into(), |u| format!("{:.1}", u.cpu_ms as f64 / 1000.0)),
                    u.map_or("-".into(), |u| {
                        format!("{}/{}", size(u.net_rx_bytes), size(u.net_tx_bytes))
                    }),
                    money(v.cost_so_far),
                    money(v.paid),
                    money(v.authorised),
                    v.time_left_s.map_or("-".into(), |x| format!("{x} s")),
                    ended(v),
                    if v.extensions > 0 {
                        format!("{} s ({} ext)", v.duration_s, v.extensions)
                    } else {
                        format!("{} s", v.duration_s)
                    },
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
                "net rx/tx",
                "cost GLU",
                "paid GLU",
                "authorised GLU",
                "left",
                "ended",
                "duration",
            ],
            rows,
            // Least important first: duration (with its extensions), counterparty, net, cpu s,
            // vram, authorised, gpu util, gpus, role, paid.
            &[14, 3, 8, 7, 6, 11, 5, 4, 1, 10],
            args.wide,
        );
        for v in &views {
            if let Some(s) = super::rent::reason_sentence(v.close_reason.as_deref()) {
                p.line(&format!("lease {}: {s}", short(&v.lease_id.to_string())));
            }
        }
    });
    Ok(0)
}

/// How a finished lease ended: why, and the container's exit code when it has one
/// (`container_exited, exit 3`); `-` while it runs.
fn ended(v: &crate::lease::LeaseView) -> String {
    match (v.close_reason.as_deref(), v.exit_code) {
        (Some(r), Some(code)) => format!("{r}, exit {code}"),
        (Some(r), None) => r.to_string(),
        (None, Some(code)) => format!("exit {code}"),
        (None, None) => "-".into(),
    }
}

/// Bytes in the largest binary unit that keeps the number at least 1 (`0`, `512 B`, `1.5 MiB`).
fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(super::size(0), "0 B");
        assert_eq!(super::size(1023), "1023 B");
        assert_eq!(super::size(1536), "1.5 KiB");
        assert_eq!(super::size(3 << 20), "3.0 MiB");
        assert_eq!(super::size(5 << 40), "5.0 TiB");
    }
}
