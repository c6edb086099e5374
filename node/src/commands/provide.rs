//! `gridlease provide`: what this node offers.

use clap::Args;

use crate::api::client::ApiClient;
use crate::api::types::{ProvideOptions, StatusView};
use crate::output::Printer;

/// Arguments of `gridlease provide`: the provide options, as the body of `PUT /v1/provide`
/// takes them.
#[derive(Debug, Args)]
pub struct ProvideArgs {
    /// What to offer; every setting left out stays as the last `provide` set it.
    #[command(flatten)]
    pub options: ProvideOptions,
}

/// A price above this (GLU per GPU-hour) is published with a note: it is most likely a
/// slip of the decimal point (offers are a fraction of a GLU to a few GLU per GPU-hour).
pub const PRICE_NOTE_ABOVE: gridlease_contracts::Money =
    gridlease_contracts::Money::from_micros(1_000 * 1_000_000);

/// Changes the offer.
pub async fn run(api: &ApiClient, out: &Printer, args: &ProvideArgs) -> anyhow::Result<u8> {
    let args = &args.options;
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
        crate::lease::hours::zone(Some(z)).map_err(|e| anyhow::anyhow!("--tz: {e}"))?;
    }
    // `--image-prefixes ''` is the empty list.
    let body = ProvideOptions {
        image_prefixes: args.image_prefixes.as_deref().map(nonempty),
        local_images: args.local_images.as_deref().map(nonempty),
        ..args.clone()
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
