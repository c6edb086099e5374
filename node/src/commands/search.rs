//! `gridlease search`: query the node's offer book.

use clap::Args;

use crate::api::client::ApiClient;
use crate::api::types::OfferRow;
use crate::output::{Printer, short};

/// Arguments of `gridlease search`.
#[derive(Debug, Args)]
pub struct SearchArgs {
    /// Query: conditions on the fields listed below, all of which must hold, e.g.
    /// 'gpu~4090 vram>=24 price<=0.45 verified>=3'. Operators: = != < <= > >= and ~ (text
    /// contains); booleans are true/false (yes/no).
    #[arg(value_name = "QUERY", num_args = 0..)]
    pub query: Vec<String>,
    /// Sort key: a field below, or age; '-' before it sorts descending
    /// (`--sort -fp16_tflops` or `--sort=-fp16_tflops`).
    #[arg(long, value_name = "KEY", allow_hyphen_values = true)]
    pub sort: Option<String>,
    /// Most offers to show (1 to 10000).
    #[arg(long, default_value_t = 20, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    /// The next page: the cursor a previous search printed (`more offers match: ... --after
    /// CURSOR`), with the same query and sort.
    #[arg(long, value_name = "CURSOR")]
    pub after: Option<String>,
    /// Show every column, however wide the terminal (without it, columns that do not fit are
    /// left out; `--json` has every field).
    #[arg(long)]
    pub wide: bool,
}

/// Percent-encodes a query string value.
pub fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(b));
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The API path of a search.
pub fn path(query: &str, sort: Option<&str>, limit: u32) -> String {
    let mut p = format!("/v1/offers?q={}&limit={limit}", urlencode(query));
    if let Some(s) = sort {
        // The API takes sort keys in lower case (its document's pattern).
        p.push_str(&format!("&sort={}", urlencode(&s.to_ascii_lowercase())));
    }
    p
}

/// An offer handle as tables show it: the provider key's first 12 hex digits and the slot
/// (`3f9a21c4b7e0/0`), which `rent` and `offer` take as they are.
pub fn short_handle(handle: &str) -> String {
    match handle.split_once('/') {
        Some((provider, slot)) => format!("{}/{slot}", &provider[..provider.len().min(12)]),
        None => short(handle),
    }
}

/// The value of a `gpu=VALUE` term of `query` (unquoted, any case): an exact model name is
/// rarely what was meant when nothing matched.
fn exact_gpu_value(query: &str) -> Option<&str> {
    query.split(' ').find_map(|t| {
        let (field, value) = t.split_once('=')?;
        (field.eq_ignore_ascii_case("gpu") && !value.is_empty() && !value.starts_with('"'))
            .then_some(value)
    })
}

/// Searches and prints a table.
pub async fn run(api: &ApiClient, out: &Printer, args: &SearchArgs) -> anyhow::Result<u8> {
    let q = args.query.join(" ");
    let mut path = path(&q, args.sort.as_deref(), args.limit);
    if let Some(a) = &args.after {
        path.push_str(&format!("&after={}", urlencode(a)));
    }
    let (headers, body) = api.get_raw(&path).await?;
    let rows: Vec<OfferRow> = serde_json::from_slice(&body)
        .map_err(|e| anyhow::anyhow!("the node's search answer does not parse: {e}"))?;
    let next = headers
        .get(crate::api::NEXT_PAGE_HEADER)
        .and_then(|v| v.to_str().ok());
    let followed = headers
        .get(crate::api::FOLLOWED_CLASSES_HEADER)
        .and_then(|v| v.to_str().ok());
    let fetching = headers
        .get(crate::api::FETCHING_CLASSES_HEADER)
        .and_then(|v| v.to_str().ok());
    out.emit(&rows, |p| {
        if let Some(classes) = fetching {
            p.line(&format!(
                "offers of the GPU classes {classes} are still arriving from the network (this node did not follow them before this search): search again in a few seconds for the rest"
            ));
        }
        if rows.is_empty() {
            p.line("no offers match");
            if let Some(v) = exact_gpu_value(&q) {
                p.line(&format!(
                    "gpu={v} matches the whole model name only (gpu=\"nvidia geforce rtx 4090\"); gpu~{v} matches models that contain it"
                ));
            }
            if let Some(classes) = followed {
                p.line(&format!(
                    "this node follows only the GPU classes {classes} (its follow setting, `gridlease node --follow`, and classes searched lately): offers of other classes are not in its book; a search that names a model exactly (gpu=\"nvidia a100-sxm4-80gb\") has the node fetch that model's offers"
                ));
            }
            return;
        }
        let table = rows
            .iter()
            .map(|r| {
                vec![
                    short_handle(&r.handle),
                    short(&r.provider),
                    match (r.gpus, r.free_gpus) {
                        (1, _) => r.gpu.clone(),
                        (n, f) if f == n => format!("{n}x {}", r.gpu),
                        (n, f) => format!("{f}/{n}x {}", r.gpu),
                    },
                    format!("{:.0} GiB", r.vram_gib),
                    format!("{:.1}", r.fp16_tflops),
                    r.price_per_gpu_hour.clone(),
                    r.price_per_tflop.clone().unwrap_or_else(|| "-".into()),
                    format!("{:.2} ({})", r.rep, r.completed),
                    r.checks(),
                    r.bench().into(),
                    format!("{} s", r.age_s),
                    format!("{} s", r.min_billed_s),
                    r.access.describe(),
                    r.isolation.to_string(),
                    if r.interruptible { "yes" } else { "no" }.into(),
                ]
            })
            .collect();
        p.table(
            &[
                "offer",
                "provider",
                "gpu",
                "vram",
                "fp16 TFLOPS",
                "GLU/GPU-h",
                "per TFLOP",
                "rep (done)",
                "checks",
                "bench",
                "age",
                "min bill",
                "access",
                "isolation",
                "interruptible",
            ],
            table,
            // Least important first; `min bill` (billed per second, at least this long),
            // `access` (shell, exec, forward) and `isolation` (runc, gvisor) show in wide
            // terminals and with --wide.
            // `rep (done)`: reputation and completed leases (docs/reputation.md).
            // `checks`: the provider's passed GPU checks and the check the offer grants
            // (`3 cpu`, `12 cuda`, `-`), kept before `bench` (benchmark figures measured or
            // declared: a `cpu` check already says the GPUs are declared ones).
            // `interruptible` (the owner may stop a lease: `search interruptible=false`)
            // likewise.
            &[14, 13, 12, 11, 1, 6, 10, 9, 4, 8, 7],
            args.wide,
        );
    });
    if let Some(next) = next {
        // On stderr, so `--json` output stays one array.
        out.note(&format!(
            "more offers match; the next {} with the same query: --after {next}",
            args.limit
        ));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_shown_short_with_their_slot() {
        let h = format!("{}/0", "ab".repeat(32));
        assert_eq!(short_handle(&h), "abababababab/0");
        assert_eq!(short_handle("abc/0"), "abc/0");
    }

    #[test]
    fn an_exact_gpu_term_is_found_for_its_hint() {
        assert_eq!(exact_gpu_value("gpu=4090 vram>=24"), Some("4090"));
        assert_eq!(exact_gpu_value("vram>=24 GPU=a100"), Some("a100"));
        assert_eq!(exact_gpu_value("gpu~4090"), None);
        assert_eq!(exact_gpu_value("gpu!=4090"), None);
        assert_eq!(exact_gpu_value("gpu=\"nvidia a100\""), None);
    }
}
