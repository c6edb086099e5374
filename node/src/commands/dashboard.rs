//! `gridlease dashboard`: serves the node's web page on 127.0.0.1 (see [`crate::dashboard`])
//! and prints its URL with the access token.

use std::path::Path;

use clap::Args;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::output::Printer;

/// Arguments of `gridlease dashboard`.
#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// Port on 127.0.0.1 (0: any free port, printed).
    #[arg(long, value_name = "PORT", default_value_t = 0)]
    pub port: u16,
}

/// What `--json` prints once it listens.
#[derive(Debug, Serialize)]
struct Listening<'a> {
    url: &'a str,
    port: u16,
}

/// Serves until Ctrl-C or SIGTERM.
pub async fn run(home: &Path, out: &Printer, a: &DashboardArgs) -> anyhow::Result<u8> {
    let bound = crate::dashboard::bind(home, a.port).await?;
    let url = bound.url();
    // The URL holds the token: it goes to stdout (the person who started it), not to a log.
    out.emit(
        &Listening {
            url: &url,
            port: bound.addr.port(),
        },
        |p| {
            p.line(&format!("dashboard of {}: {url}", home.display()));
            p.line("(127.0.0.1 only; Ctrl-C to stop)");
        },
    );
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        stop.cancel();
    });
    bound.serve(cancel).await?;
    Ok(0)
}
