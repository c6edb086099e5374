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
    /// Registry hosts tenants' images may come from, comma-separated (replaces the list;
    /// default docker.io,nvcr.io,ghcr.io,quay.io,public.ecr.aws). A loopback, private or
    /// local-network host is allowed only when listed here exactly (with its port).
    #[arg(long, value_delimiter = ',', value_name = "HOST[:PORT]")]
    pub registries: Option<Vec<String>>,
    /// Only images whose canonical reference starts with one of these, comma-separated
    /// (e.g. docker.io/pytorch/,nvcr.io/nvidia/); `--image-prefixes ''` allows any.
    #[arg(long, value_delimiter = ',', value_name = "PREFIX")]
    pub image_prefixes: Option<Vec<String>>,
    /// Local images (built or imported here, never pulled) tenants may run, comma-separated;
    /// no other local-only image is rentable.
    #[arg(long, value_delimiter = ',', value_name = "IMAGE")]
    pub local_images: Option<Vec<String>>,
    /// Largest image a tenant may pull, compressed, GiB (default 20).
    #[arg(long, value_name = "GIB", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_image_gib: Option<u64>,
    /// Largest image unpacked on this disk, GiB (default 60).
    #[arg(long, value_name = "GIB", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_unpacked_gib: Option<u64>,
    /// Hours of the day the GPUs are offered, in --tz: windows HH:MM-HH:MM separated by
    /// commas (`22:00-08:00,12:00-13:00`; a window may cross midnight), or `always` (the
    /// default). Outside them the offer says 0 free GPUs.
    #[arg(long, value_name = "WINDOWS")]
    pub hours: Option<String>,
    /// Time zone of --hours, an IANA name (Europe/Berlin), or `local`: the machine's zone (the
    /// default). Daylight saving time is followed.
    #[arg(long, value_name = "ZONE")]
    pub tz: Option<String>,
    /// Whether a running lease may be stopped when you want the GPU back (you start using
    /// it, or --hours end): it closes as `owner_reclaimed`, billed to the second. Stated in
    /// the offer; default false (only unleased GPUs are withdrawn).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub interruptible: Option<bool>,
    /// Stop offering.
    #[arg(long)]
    pub off: bool,
}

/// A price above this (GLU per GPU-hour) is published with a note: it is most likely a
/// slip of the decimal point (offers are a fraction of a GLU to a few GLU per GPU-hour).
pub const PRICE_NOTE_ABOVE: gridlease_contracts::Money =
    gridlease_contracts::Money::from_micros(1_000 * 1_000_000);

/// Changes the offer.
pub async fn run(api: &ApiClient, out: &Printer, args: &ProvideArgs) -> anyhow::Result<u8> {
    if let Some(p) = &args.price {
        let m = p
            .parse::<gridlease_contracts::Money>()
            .map_err(|e| anyhow::anyhow!("--price {p:?}: {e}"))?;
        if m == gridlease_contracts::Money::ZERO {
            anyhow::bail!("--price must be above 0, e.g. --price 0.40");
        }
        if m.micros() > crate::api::openapi::MAX_AMOUNT_MICROS {
            anyhow::bail!(
                "--price {p}: too large; a price is below 10000000000000 GLU per GPU-hour, e.g. --price 0.40"
            );
        }
        if m.micros() > PRICE_NOTE_ABOVE.micros() {
            out.note(&format!(
                "--price {m} GLU per GPU-hour is more than {PRICE_NOTE_ABOVE} GLU, far above what GPUs are offered at (a fraction of a GLU to a few GLU): check the decimal point; it is published as given"
            ));
        }
    }
    // Said here, before anything changes (the daemon checks the same again).
    if let Some(h) = &args.hours {
        h.parse::<gridlease_contracts::schedule::Schedule>()
            .map_err(|e| anyhow::anyhow!("--hours {h:?}: {e}"))?;
    }
    if let Some(z) = &args.tz {
        crate::lease::owner::zone(Some(z)).map_err(|e| anyhow::anyhow!("--tz: {e}"))?;
    }
    let body = ProvideBody {
        price: args.price.clone(),
        gpus: args.gpus.clone(),
        max_hours: args.max_hours,
        network_policy: args.network_policy.clone(),
        registries: args.registries.clone(),
        image_prefixes: args.image_prefixes.as_ref().map(|p| nonempty(p)),
        local_images: args.local_images.as_ref().map(|p| nonempty(p)),
        max_image_gib: args.max_image_gib,
        max_unpacked_gib: args.max_unpacked_gib,
        hours: args.hours.clone(),
        tz: args.tz.clone(),
        interruptible: args.interruptible,
        off: args.off,
    };
    let s: StatusView = api.put("/v1/provide", &body).await?;
    out.emit(&s, |p| match &s.own_offer {
        Some(o) => {
            p.line(&format!(
                "offering {} GPU(s) at {} {}/GPU-hour (offer {})",
                o.gpus,
                o.price_per_gpu_hour,
                gridlease_contracts::money::UNIT,
                crate::output::short(&o.id)
            ));
            if let Some(h) = s.schedule.as_ref().filter(|h| h.hours != "always") {
                p.line(&format!("hours {} ({}): {}", h.hours, h.tz, h.text));
            }
        }
        None => p.line("not offering anything"),
    });
    Ok(0)
}

/// A comma list without its empty items (`--image-prefixes ''` is the empty list).
fn nonempty(v: &[String]) -> Vec<String> {
    v.iter().filter(|s| !s.is_empty()).cloned().collect()
}
