//! `gridlease offer OFFER`: one offer of the book, whole.

use clap::Args;

use crate::api::client::ApiClient;
use crate::api::types::OfferDetail;
use crate::output::Printer;

/// Arguments of `gridlease offer`.
#[derive(Debug, Args)]
pub struct OfferArgs {
    /// Offer handle (`PROVIDER/0`, as `search` shows it: stable across re-signs) or id (or a
    /// unique prefix).
    #[arg(value_name = "OFFER")]
    pub offer: String,
}

/// Prints the offer.
pub async fn run(api: &ApiClient, out: &Printer, a: &OfferArgs) -> anyhow::Result<u8> {
    let o: OfferDetail = api
        .get(&format!(
            "/v1/offers/{}",
            super::search::urlencode(&a.offer)
        ))
        .await?;
    out.emit(&o, |p| {
        let secs = |ms: u64| httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms));
        p.line(&format!("offer        {}", o.id));
        p.line(&format!(
            "handle       {} (stays the same when the provider re-signs the offer)",
            o.handle
        ));
        p.line(&format!("provider     {} (seq {})", o.provider, o.seq));
        p.line(&format!(
            "gpus         {} free of {} when signed",
            o.free_gpus,
            o.gpus.len()
        ));
        p.line(&format!(
            "price        {} {}/GPU-hour, billed per second, at least {} s",
            o.price_per_gpu_hour,
            gridlease_contracts::money::UNIT,
            o.min_billed_s
        ));
        p.line(&format!(
            "leases       {} s to {} s; usage reported every {} s, at most {} s owed",
            o.min_duration_s, o.max_duration_s, o.usage_interval_s, o.pay_ahead_s
        ));
        p.line(&format!(
            "per GPU      {} millicores CPU, {} MiB RAM, {} GiB /workspace disk",
            o.per_gpu.cpu_millicores, o.per_gpu.ram_mib, o.per_gpu.disk_gib
        ));
        p.line(&format!("network      {}", o.network));
        p.line(&format!("access       {}", o.access.describe()));
        p.line(&format!(
            "outputs      {}",
            if o.output_retention_s == 0 {
                "removed when a lease ends (copy results out while it runs)".to_string()
            } else {
                format!(
                    "kept up to {} s after a lease ends when asked (rent --keep-outputs, --download)",
                    o.output_retention_s
                )
            }
        ));
        p.line(&format!(
            "uploads      {}",
            if o.upload_hold_s == 0 {
                "copy them in once the lease runs (gridlease cp)".to_string()
            } else {
                format!(
                    "before the command starts: the container is held up to {} s (rent --upload), one per renter at a time; stopping during the hold costs the minimum billed {} s",
                    o.upload_hold_s, o.min_billed_s
                )
            }
        ));
        p.line(&format!(
            "isolation    {}",
            match o.isolation {
                gridlease_protocol::Isolation::Runc => "runc (namespaces, cgroups, seccomp)",
                gridlease_protocol::Isolation::Gvisor =>
                    "gvisor (runsc: an application kernel between the container and the host)",
            }
        ));
        p.line(&format!(
            "gpu check    {}",
            o.gpu_check.line(o.verify_window_s, o.verified)
        ));
        p.line(&format!(
            "images       {}",
            gridlease_contracts::image::policy_text(&o.registries, &o.image_prefixes, &o.local_images)
        ));
        if !o.region.is_empty() {
            p.line(&format!("region       {}", o.region));
        }
        p.line(&format!("signed       {}", secs(o.created_at_ms)));
        p.line(&format!("expires      {}", secs(o.expires_at_ms)));
        for (i, g) in o.gpus.iter().enumerate() {
            p.line(&format!(
                "gpu {i}        {}, {} MiB, driver {} (CUDA {}), sm {}, PCIe {}, {} W",
                g.model,
                g.vram_mib,
                g.driver_version,
                g.cuda_version,
                g.compute_capability,
                g.pcie,
                g.power_limit_w
            ));
            p.line(&format!(
                "             fp16 {:.1} TFLOPS, fp32 {:.1} TFLOPS, memory {} MB/s, host->device {} MB/s ({})",
                f64::from(g.fp16_gflops) / 1000.0,
                f64::from(g.fp32_gflops) / 1000.0,
                g.device_mem_mbps,
                g.h2d_mbps,
                if g.attestation == "declared" {
                    "declared, unverified"
                } else {
                    "measured by the provider's node"
                }
            ));
        }
        for a in &o.addrs {
            p.line(&format!("address      {a}"));
        }
    });
    Ok(0)
}
