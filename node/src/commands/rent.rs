//! `gridlease rent`: rent an offer, follow the container's output, print the bill, exit with
//! the container's exit code.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use gridlease_contracts::Money;
use gridlease_protocol::RejectReason;

use crate::api::client::ApiClient;
use crate::api::types::{RentBody, RentedView};
use crate::output::Printer;

/// Arguments of `gridlease rent`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("duration").required(true).args(["hours", "minutes", "seconds"])))]
pub struct RentArgs {
    /// Offer id (or its first digits) from `gridlease search`.
    #[arg(value_name = "OFFER")]
    pub offer: String,
    /// GPUs to lease.
    #[arg(long, default_value_t = 1)]
    pub gpus: u16,
    /// Lease duration in hours (decimals allowed, e.g. 0.5).
    #[arg(long, value_name = "H")]
    pub hours: Option<String>,
    /// Lease duration in minutes.
    #[arg(long, value_name = "M")]
    pub minutes: Option<u32>,
    /// Lease duration in seconds.
    #[arg(long, value_name = "S")]
    pub seconds: Option<u32>,
    /// Container image (used as is if present on the provider, else pulled).
    #[arg(long, value_name = "IMG")]
    pub image: String,
    /// Environment variable for the container (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Most you will pay in total (default: the whole duration at the offer's price).
    #[arg(long, value_name = "AMOUNT")]
    pub max_total: Option<String>,
    /// Print the lease id and return; follow later with `gridlease logs -f`.
    #[arg(long)]
    pub detach: bool,
    /// Command and arguments (after `--`); without them the image's own entrypoint runs.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Duration in seconds from the duration flags.
pub fn duration_s(a: &RentArgs) -> anyhow::Result<u32> {
    let secs: u64 = if let Some(h) = &a.hours {
        let micros = h
            .parse::<Money>()
            .map_err(|_| anyhow::anyhow!("--hours {h:?} is not a number of hours"))?
            .micros();
        micros.saturating_mul(3600) / 1_000_000
    } else if let Some(m) = a.minutes {
        u64::from(m) * 60
    } else {
        u64::from(a.seconds.unwrap_or(0))
    };
    if secs == 0 {
        anyhow::bail!("the lease duration must be at least one second");
    }
    u32::try_from(secs).map_err(|_| anyhow::anyhow!("the lease duration is too long"))
}

/// Parses `K=V` pairs.
pub fn parse_env(pairs: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(anyhow::anyhow!("--env {p:?} is not KEY=VALUE")),
        })
        .collect()
}

/// A provider's refusal in words.
pub fn reason_text(r: &RejectReason) -> String {
    match r {
        RejectReason::UnknownOffer => "the provider does not hold this offer any more".into(),
        RejectReason::StaleOffer { current_seq } => {
            format!("the offer was replaced (now at sequence {current_seq}); search again")
        }
        RejectReason::OfferExpired => "the offer expired".into(),
        RejectReason::RequestExpired => "the request expired before the provider handled it".into(),
        RejectReason::WrongProvider => "the terms name another provider".into(),
        RejectReason::PriceBelowAsk { ask } => {
            format!(
                "the price is below the ask of {}/GPU-hour",
                Money::from_micros(*ask)
            )
        }
        RejectReason::NoCapacity { free } => format!("only {free} GPU(s) are free"),
        RejectReason::DurationOutOfBounds { min_s, max_s } => {
            format!("the duration must be between {min_s} s and {max_s} s")
        }
        RejectReason::TermsMismatch { field } => {
            format!("the terms differ from the offer in `{field}`")
        }
        RejectReason::ImageNotAllowed => "the provider's policy does not allow this image".into(),
        RejectReason::NetworkNotAllowed => {
            "the provider's policy does not allow network access".into()
        }
        RejectReason::BudgetTooSmall { needed } => format!(
            "the budget cannot pay the minimum billed time ({} needed)",
            Money::from_micros(*needed)
        ),
        RejectReason::DuplicateNonce => "a request with this nonce had other terms".into(),
        RejectReason::Malformed { detail } => format!("the request is malformed: {detail}"),
        RejectReason::Internal => "the provider failed internally; try another offer".into(),
    }
}

/// True for a lease state that will not change any more.
fn terminal(view: &serde_json::Value) -> bool {
    matches!(
        view["state"].as_str(),
        Some("settled" | "failed" | "rejected")
    )
}

fn exit_code_of(view: &serde_json::Value) -> Option<i32> {
    view["exit_code"]
        .as_i64()
        .and_then(|c| i32::try_from(c).ok())
}

/// Follows a lease's output from `from` until it ends; returns the exit code if known.
/// Transient failures of the provider (busy, reconnecting) are retried for about a minute.
pub async fn follow_logs(
    api: &ApiClient,
    out: &Printer,
    lease: &str,
    mut from: u64,
    follow: bool,
) -> anyhow::Result<Option<i32>> {
    use crate::api::client::ClientError;
    use crate::api::{EOF_HEADER, EXIT_CODE_HEADER, NEXT_OFFSET_HEADER};
    let mut failures = 0u32;
    let mut ended_at: Option<tokio::time::Instant> = None;
    loop {
        let fetched = api
            .get_raw(&format!("/v1/leases/{lease}/logs?from={from}"))
            .await;
        let (headers, body) = match fetched {
            Ok(r) => {
                failures = 0;
                r
            }
            Err(e @ ClientError::Api { status: 500.., .. }) if follow && failures < 30 => {
                failures += 1;
                tracing::debug!(error = %e, "log fetch failed; retrying");
                if let Ok(view) = api
                    .get::<serde_json::Value>(&format!("/v1/leases/{lease}"))
                    .await
                    && terminal(&view)
                {
                    return Ok(exit_code_of(&view));
                }
                let backoff = 200 * u64::from(failures.min(10));
                tokio::time::sleep(Duration::from_millis(backoff)).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if !out.quiet && !out.json {
            out.bytes(&body);
        }
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        from = header(NEXT_OFFSET_HEADER)
            .and_then(|v| v.parse().ok())
            .unwrap_or(from + body.len() as u64);
        let exit = header(EXIT_CODE_HEADER).and_then(|v| v.parse().ok());
        if header(EOF_HEADER).is_some() || !follow {
            return Ok(exit);
        }
        if body.len() >= 16 * 1024 {
            // More is probably waiting: ask again at once.
            continue;
        }
        if body.is_empty()
            && let Ok(view) = api
                .get::<serde_json::Value>(&format!("/v1/leases/{lease}"))
                .await
            && terminal(&view)
        {
            // The lease is over but no end-of-output came: the provider may still be
            // flushing the last lines. Give it a few seconds, then report what we have.
            let since = *ended_at.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() > Duration::from_secs(3) {
                return Ok(exit.or_else(|| exit_code_of(&view)));
            }
        }
        // Poll gently: the provider serves every renter's log requests.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Waits (bounded) until the lease is settled or failed and returns its view.
pub async fn wait_terminal(
    api: &ApiClient,
    lease: &str,
    limit: Duration,
) -> anyhow::Result<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let view: serde_json::Value = api.get(&format!("/v1/leases/{lease}")).await?;
        if matches!(
            view["state"].as_str(),
            Some("settled" | "failed" | "rejected")
        ) || tokio::time::Instant::now() >= deadline
        {
            return Ok(view);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Formats micro-units from a JSON number.
pub fn money(v: &serde_json::Value) -> String {
    v.as_u64()
        .map_or("-".into(), |m| Money::from_micros(m).to_string())
}

/// Prints the bill of a finished lease.
pub fn print_bill(out: &Printer, view: &serde_json::Value) {
    let wall_s = view["usage"]["wall_ms"].as_u64().unwrap_or(0) / 1000;
    out.line(&format!(
        "lease {} {}: ran {} s on {} GPU(s) at {}/GPU-hour; paid {}{}",
        crate::output::short(view["lease_id"].as_str().unwrap_or("?")),
        view["state"].as_str().unwrap_or("?"),
        wall_s,
        view["gpus"],
        money(&view["price_per_gpu_hour"]),
        money(
            &view["settled_total"]
                .as_u64()
                .map_or(view["paid"].clone(), serde_json::Value::from)
        ),
        view["close_reason"]
            .as_str()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default(),
    ));
}

/// Rents, then follows unless detached.
pub async fn run(api: &ApiClient, out: &Printer, args: &RentArgs) -> anyhow::Result<u8> {
    let body = RentBody {
        offer: args.offer.clone(),
        gpus: args.gpus,
        duration_s: duration_s(args)?,
        image: args.image.clone(),
        command: args.command.clone(),
        env: parse_env(&args.env)?,
        max_total: args.max_total.clone(),
    };
    if let Some(m) = &body.max_total {
        m.parse::<Money>()?;
    }
    let rented: RentedView = api.post("/v1/leases", &body).await?;
    if let Some(note) = &rented.note {
        out.note(note);
    }
    if args.detach {
        out.emit(&rented, |p| p.line(&rented.lease_id));
        return Ok(0);
    }
    out.line(&format!(
        "lease {} accepted; following its output",
        rented.lease_id
    ));
    let exit = follow_logs(api, out, &rented.lease_id, 0, true).await?;
    let view = wait_terminal(api, &rented.lease_id, Duration::from_secs(60)).await?;
    out.emit(&view, |p| print_bill(p, &view));
    let code = exit
        .or_else(|| {
            view["exit_code"]
                .as_i64()
                .and_then(|c| i32::try_from(c).ok())
        })
        .unwrap_or(1);
    Ok(u8::try_from(code.clamp(0, 255)).unwrap_or(1))
}
