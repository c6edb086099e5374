//! Following a rented lease: its start (the image pull, the prepay of an unattended lease),
//! its output, and its end.

use std::time::Duration;

use super::short;
use crate::api::client::{ApiClient, ClientError};
use crate::lease::LeaseView;
use crate::output::Printer;

/// How long after it starts following a lease's output asks for it often while none came.
const EAGER_FOR: Duration = Duration::from_secs(3);

/// What one log fetch gave: output, or the news that the lease ended while the provider
/// could not answer.
enum Fetched {
    Logs((hyper::HeaderMap, bytes::Bytes)),
    Ended(Option<i32>),
}

/// The waits between failed log fetches in a row: 200 ms more each time up to 2 s, 30 retries
/// (about 50 s in all).
fn log_retry_delays() -> impl backon::Backoff {
    (1..=30u64).map(|n| Duration::from_millis(200 * n.min(10)))
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
    use crate::api::{EOF_HEADER, EXIT_CODE_HEADER, NEXT_OFFSET_HEADER};
    use backon::Retryable;
    let mut ended_at: Option<tokio::time::Instant> = None;
    let started = tokio::time::Instant::now();
    loop {
        let url = format!("/v1/leases/{lease}/logs?from={from}");
        // One fetch; a provider that fails it (busy, reconnecting) is asked again, unless the
        // lease is over meanwhile: then its exit code is the answer.
        let fetch = || async {
            match api.get_raw(&url).await {
                Ok(r) => Ok(Fetched::Logs(r)),
                Err(e @ ClientError::Api { status: 500.., .. }) if follow => {
                    if let Ok(view) = api.lease(lease).await
                        && view.is_terminal()
                    {
                        return Ok(Fetched::Ended(view.exit_code));
                    }
                    Err(e)
                }
                Err(e) => Err(e),
            }
        };
        let fetched = fetch
            .retry(log_retry_delays())
            .when(|e| follow && matches!(e, ClientError::Api { status: 500.., .. }))
            .notify(|e, _| tracing::debug!(error = %e, "log fetch failed; retrying"))
            .await?;
        let (headers, body) = match fetched {
            Fetched::Logs(r) => r,
            Fetched::Ended(exit) => return Ok(exit),
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
            && let Ok(view) = api.lease(lease).await
            && view.is_terminal()
        {
            // The lease is over but no end-of-output came: the provider may still be
            // flushing the last lines. Give it a few seconds, then report what we have.
            let since = *ended_at.get_or_insert_with(tokio::time::Instant::now);
            if since.elapsed() > Duration::from_secs(3) {
                return Ok(exit.or(view.exit_code));
            }
        }
        // Poll gently: the provider serves every renter's log requests; quickly only until the
        // first output came (or for the first seconds), so it shows as soon as it is written.
        let eager = from == 0 && started.elapsed() < EAGER_FOR;
        tokio::time::sleep(Duration::from_millis(if eager { 50 } else { 300 })).await;
    }
}

/// While the provider pulls the lease's image: a progress bar of the bytes it reports (on a
/// terminal), then one line with what was pulled. Returns once the container runs or the lease
/// is over, or with `held` once the provider holds the container for uploads (else after 2 s
/// when no pull is reported: the output follows then).
pub(super) async fn show_pull(
    api: &ApiClient,
    out: &Printer,
    lease: &str,
    held: bool,
) -> anyhow::Result<()> {
    let quiet_limit = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut bar: Option<indicatif::ProgressBar> = None;
    let mut last = None;
    loop {
        let view = api.lease(lease).await?;
        match view.pull {
            Some(p) if !view.is_terminal() => {
                let b = bar.get_or_insert_with(|| {
                    let b = indicatif::ProgressBar::new(p.total_bytes);
                    if let Ok(style) = indicatif::ProgressStyle::with_template(
                        "pulling the image {bar:30} {bytes}/{total_bytes} {bytes_per_sec}",
                    ) {
                        b.set_style(style);
                    }
                    if out.quiet || out.json {
                        b.set_draw_target(indicatif::ProgressDrawTarget::hidden());
                    }
                    b
                });
                b.set_length(p.total_bytes);
                b.set_position(p.pulled_bytes);
                last = Some(p);
            }
            _ => {
                let started = !matches!(
                    view.state,
                    gridlease_contracts::LeaseState::Accepted
                        | gridlease_contracts::LeaseState::Starting
                );
                let waiting = if held {
                    view.upload_until.is_none()
                } else {
                    bar.is_some() || tokio::time::Instant::now() <= quiet_limit
                };
                if started || view.is_terminal() || !waiting {
                    if let Some(b) = bar {
                        b.finish_and_clear();
                    }
                    if let Some(p) = last {
                        out.note(&format!(
                            "the provider pulled the image ({:.1} MiB)",
                            p.total_bytes as f64 / f64::from(1u32 << 20)
                        ));
                    }
                    return Ok(());
                }
            }
        }
        // The provider tells this node at once when the command starts: asked often, the
        // output follows within a few milliseconds of that.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// While the renter's GPU check runs (the provider's unbilled window): waits for its verdict
/// and says it in one line. `Some(exit code)` when it failed: the lease was aborted before its
/// command, nothing charged.
pub(super) async fn show_check(
    api: &ApiClient,
    out: &Printer,
    lease: &str,
) -> anyhow::Result<Option<u8>> {
    let limit = tokio::time::Instant::now() + Duration::from_secs(15 * 60);
    let mut said_checking = false;
    loop {
        let view = api.lease(lease).await?;
        let started = !matches!(
            view.state,
            gridlease_contracts::LeaseState::Accepted | gridlease_contracts::LeaseState::Starting
        );
        match &view.gpu_check {
            Some(c) if c.state == "verifying" && !view.is_terminal() && !said_checking => {
                out.note("checking the leased GPUs (unbilled)");
                said_checking = true;
            }
            Some(c) if c.state == "verifying" && !view.is_terminal() => {}
            Some(c) if c.state == "passed" => {
                out.note(&format!(
                    "{} in {:.2} s (limit {:.2} s); billing starts with the command",
                    c.summary,
                    c.took_ms.unwrap_or(0) as f64 / 1000.0,
                    c.limit_ms.unwrap_or(0) as f64 / 1000.0
                ));
                return Ok(None);
            }
            Some(c) if c.state == "failed" => {
                // The settled view follows the close; the charge is what it says (0).
                let done =
                    super::follow::wait_terminal(api, lease, Duration::from_secs(30)).await?;
                out.status(&format!(
                    "error: {}; the lease was aborted before its command: {} charged",
                    c.summary,
                    if done.paid == 0 {
                        "nothing was".to_string()
                    } else {
                        format!("{} GLU", crate::output::money(done.paid))
                    }
                ));
                out.emit(&done, |_| {});
                return Ok(Some(super::EXIT_GPU_CHECK_FAILED));
            }
            _ if started || view.is_terminal() => return Ok(None),
            // No check yet: the start goes on (a pull, or an offer without a check).
            None if !said_checking => {
                if view.state == gridlease_contracts::LeaseState::Starting && view.pull.is_none() {
                    // The window opens right after the container is created: look again.
                } else {
                    return Ok(None);
                }
            }
            _ => {}
        }
        if tokio::time::Instant::now() > limit {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (bounded) until the lease is settled, rejected or failed and returns its view (the
/// last one seen when `limit` runs out first).
pub async fn wait_terminal(
    api: &ApiClient,
    lease: &str,
    limit: Duration,
) -> anyhow::Result<LeaseView> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let view = api.lease(lease).await?;
        if view.is_terminal() || tokio::time::Instant::now() >= deadline {
            return Ok(view);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A prepaid lease (`--prepay --detach`): returns once the provider has started it and this
/// node has paid its prepay ahead (the answer to the provider's start notice), so nothing
/// after `rent` returns needs this node online. `Some(exit code)` when the lease ended first
/// (a failed start: 5).
pub(super) async fn await_prepaid(
    api: &ApiClient,
    out: &Printer,
    id: &str,
) -> anyhow::Result<Option<u8>> {
    let mut said = false;
    loop {
        let v = api.lease(id).await?;
        if v.state == gridlease_contracts::LeaseState::Running && v.authorised > 0 {
            out.note(&format!(
                "lease {} started and its prepay is paid ahead ({} authorised): it runs on while this node is offline",
                short(id),
                crate::output::money(v.authorised)
            ));
            return Ok(None);
        }
        if v.state.is_terminal() || v.state == gridlease_contracts::LeaseState::Closing {
            let why = v
                .failure
                .as_ref()
                .map(|f| f.message.clone())
                .or(v.close_reason.clone())
                .unwrap_or_default();
            out.status(&format!(
                "error: lease {} ended before it ran: {why}",
                short(id)
            ));
            return Ok(Some(if v.failure.is_some() { 5 } else { 1 }));
        }
        if !said {
            out.note(&format!(
                "waiting for the provider to start lease {}: its prepay is paid once it runs (keep this node online until then)",
                short(id)
            ));
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
