//! `gridlease status`: identity, addresses, reachability, peers, offers known, own offer,
//! the cache of pulled images.

use clap::Args;

use crate::api::client::ApiClient;
use crate::output::Printer;

/// Arguments of `gridlease status`.
#[derive(Debug, Args)]
pub struct StatusArgs {}

/// Prints the node's status.
pub async fn run(api: &ApiClient, out: &Printer, _args: &StatusArgs) -> anyhow::Result<u8> {
    let s = api.status().await?;
    out.emit(&s, |p| {
        p.line(&format!("peer id      {}", s.peer_id));
        if !s.wallet.is_empty() {
            p.line(&format!(
                "wallet       {}  (no chain configured: leases settle in GLU)",
                s.wallet
            ));
        }
        p.line(&format!("network      {}", s.network));
        p.line(&format!(
            "version      {}  (up {} s)",
            s.version, s.uptime_s
        ));
        p.line(&format!(
            "reachability {} (observed by AutoNAT)",
            s.nat_status
        ));
        for a in &s.external_addrs {
            p.line(&format!("external     {a}"));
        }
        for r in &s.relays {
            p.line(&format!("relay        {r}"));
        }
        for a in &s.listen_addrs {
            p.line(&format!("listening    {a}"));
        }
        p.line(&format!("peers        {}", s.connected_peers));
        match s.offers_restoring {
            Some(left) => p.line(&format!(
                "offers known {} (restoring from the store: {left} left to check)",
                s.offers_known
            )),
            None => p.line(&format!("offers known {}", s.offers_known)),
        }
        match &s.own_offer {
            Some(o) => {
                p.line(&format!(
                    "providing    {} GPU(s) at {} {}/GPU-hour (offer {}, seq {})",
                    o.gpus,
                    o.price_per_gpu_hour,
                    gridlease_contracts::money::UNIT,
                    crate::output::short(&o.id),
                    o.seq
                ));
                p.line(&format!(
                    "per GPU      {} MiB RAM, {} millicores CPU, {} GiB disk",
                    o.ram_mib_per_gpu, o.cpu_millicores_per_gpu, o.disk_gib_per_gpu
                ));
                p.line(&format!(
                    "reputation   {:.2} ({} completed lease(s) on record; docs/reputation.md)",
                    o.rep, o.completed
                ));
                p.line(if o.interruptible {
                    "interrupt    a running lease may be stopped when the owner wants the GPU back"
                } else {
                    "interrupt    no: running leases run to their end"
                });
                if let Some(h) = &s.schedule {
                    p.line(&format!("hours        {} ({}): {}", h.hours, h.tz, h.text));
                }
            }
            None => p.line("providing    nothing"),
        }
        let c = &s.image_cache;
        p.line(&format!(
            "image cache  {} image(s), {:.1} GiB (bounds: {} images, {:.0} GiB)",
            c.images,
            c.bytes as f64 / f64::from(1u32 << 30),
            c.max_images,
            c.max_bytes as f64 / f64::from(1u32 << 30)
        ));
        for v in &s.kept_volumes {
            p.line(&format!(
                "volume       {} ({} GiB) of {}, {}, paid {} (signed for {}), deleted {}",
                v.name,
                v.size_gib,
                crate::output::short(&v.renter),
                v.state,
                crate::output::money(v.paid),
                crate::output::money(v.authorised),
                v.time_left_s.map_or_else(
                    || "when it ends".to_string(),
                    |t| format!(
                        "in {}",
                        humantime::format_duration(std::time::Duration::from_secs(t))
                    )
                )
            ));
        }
    });
    Ok(0)
}
