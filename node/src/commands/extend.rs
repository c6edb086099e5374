//! `gridlease extend`: make a running lease longer (a signed amendment of its terms the
//! provider accepts or refuses; the budget cap rises by what the added time costs).

use clap::Args;
use gridlease_contracts::Money;

use crate::api::client::ApiClient;
use crate::api::types::{ExtendRequest, Extended};
use crate::output::{Printer, money, short};

/// Arguments of `gridlease extend`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("added").required(true).args(["minutes", "seconds"])))]
pub struct ExtendArgs {
    /// Lease id (or its first digits), one this node rents.
    #[arg(value_name = "LEASE")]
    pub lease: String,
    /// Minutes to add.
    #[arg(long, value_name = "N")]
    pub minutes: Option<u32>,
    /// Seconds to add.
    #[arg(long, value_name = "N")]
    pub seconds: Option<u32>,
    /// The new budget cap (default: the current cap plus the added time at the lease's
    /// price); never below the current cap.
    #[arg(long, value_name = "AMOUNT", allow_hyphen_values = true, value_parser = super::parse_amount)]
    pub max_total: Option<Money>,
}

/// The deadline in words: an HTTP date (UTC).
pub fn deadline_text(unix_ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms);
    httpdate::fmt_http_date(t)
}

/// Extends a lease; a refusal is an error with status 409 (exit code 4) and its reason.
pub async fn run(api: &ApiClient, out: &Printer, args: &ExtendArgs) -> anyhow::Result<u8> {
    let body = ExtendRequest {
        minutes: args.minutes,
        seconds: args.seconds,
        max_total: args.max_total,
    };
    let x: Extended = api.extend(&args.lease, &body).await?;
    if let Some(note) = &x.note {
        out.note(note);
    }
    out.emit(&x, |p| {
        p.line(&format!(
            "lease {} extended to {} s (extension {}): new deadline {} (in {} s), budget cap {}",
            short(&x.lease_id),
            x.duration_s,
            x.extensions,
            deadline_text(x.deadline_ms),
            x.time_left_s,
            money(x.max_total),
        ));
    });
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_read_as_utc_dates() {
        assert_eq!(
            deadline_text(784_111_777_000),
            "Sun, 06 Nov 1994 08:49:37 GMT"
        );
    }
}
