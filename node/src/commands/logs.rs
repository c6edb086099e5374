//! `gridlease logs`: a lease's container output (renters fetch it from the provider).
//!
//! Without `--follow` it prints everything the provider holds now (every chunk, not just the
//! first); `--tail N` prints the last N lines of that; `--json` prints one object with the text
//! and whether output was cut. The provider keeps the first and the last 4 MiB of a longer
//! output, with a notice of how many bytes it cut between them.

use clap::Args;
use serde::Serialize;

use crate::api::client::ApiClient;
use crate::api::{EOF_HEADER, EXIT_CODE_HEADER, NEXT_OFFSET_HEADER};
use crate::output::Printer;

/// Most bytes `logs` without `--follow` collects (the provider keeps 8 MiB and a notice).
const MAX_COLLECT: usize = 16 * 1024 * 1024;

/// Arguments of `gridlease logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Lease id (or its first digits).
    #[arg(value_name = "LEASE")]
    pub lease: String,
    /// Keep following until the container exits.
    #[arg(short, long, conflicts_with = "tail")]
    pub follow: bool,
    /// Print only the last N lines.
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
}

/// `logs --json`.
#[derive(Debug, Serialize)]
pub struct LogsView {
    /// The lease.
    pub lease_id: String,
    /// The output (invalid UTF-8 replaced by U+FFFD; without `--json` the bytes are exact).
    pub text: String,
    /// Bytes of output returned.
    pub bytes: u64,
    /// The output is complete (the lease is over).
    pub complete: bool,
    /// Bytes the provider cut between the head and the tail it keeps, if any.
    pub cut_bytes: Option<u64>,
    /// The container's exit code, once known.
    pub exit_code: Option<i32>,
}

/// What the provider holds now: (bytes, complete, exit code).
async fn collect(api: &ApiClient, lease: &str) -> anyhow::Result<(Vec<u8>, bool, Option<i32>)> {
    let mut data = Vec::new();
    let mut from = 0u64;
    loop {
        let (headers, body) = api
            .get_raw(&format!("/v1/leases/{lease}/logs?from={from}"))
            .await?;
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        data.extend_from_slice(&body);
        let exit = header(EXIT_CODE_HEADER).and_then(|v| v.parse().ok());
        let eof = header(EOF_HEADER).is_some();
        let next = header(NEXT_OFFSET_HEADER)
            .and_then(|v| v.parse().ok())
            .unwrap_or(from + body.len() as u64);
        if eof || body.is_empty() || next <= from || data.len() >= MAX_COLLECT {
            return Ok((data, eof, exit));
        }
        from = next;
    }
}

/// The number in a cut notice (`[gridlease: N bytes of output cut here; ...]`), if any.
pub fn cut_bytes(data: &[u8]) -> Option<u64> {
    const MARK: &[u8] = b"[gridlease: ";
    let at = data.windows(MARK.len()).position(|w| w == MARK)?;
    let rest = &data[at + MARK.len()..];
    let digits: Vec<u8> = rest
        .iter()
        .copied()
        .take_while(u8::is_ascii_digit)
        .collect();
    let after = &rest[digits.len()..];
    if !after.starts_with(b" bytes of output cut here") {
        return None;
    }
    std::str::from_utf8(&digits).ok()?.parse().ok()
}

/// The last `n` lines of `data` (a final line without a newline counts).
pub fn last_lines(data: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &data[data.len()..];
    }
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &data[i + 1..];
            }
        }
    }
    data
}

/// Prints output. With `--follow` it exits as `rent` does once the lease is over: with the
/// container's exit code, 5 when it could not start ([`super::rent::exit_status`]).
pub async fn run(api: &ApiClient, out: &Printer, args: &LogsArgs) -> anyhow::Result<u8> {
    if args.follow && !out.json {
        let exit = super::rent::follow_logs(api, out, &args.lease, 0, true).await?;
        let view = api.lease(&args.lease).await?;
        return Ok(super::rent::exit_status(&view, exit));
    }
    let (data, complete, exit_code) = if args.follow {
        // `--json --follow`: wait for the end, then print one object.
        let lease = args.lease.clone();
        super::rent::follow_logs(
            api,
            &Printer {
                quiet: true,
                ..*out
            },
            &lease,
            0,
            true,
        )
        .await?;
        collect(api, &args.lease).await?
    } else {
        collect(api, &args.lease).await?
    };
    let shown = match args.tail {
        Some(n) => last_lines(&data, n),
        None => &data[..],
    };
    let view = LogsView {
        lease_id: args.lease.clone(),
        text: String::from_utf8_lossy(shown).into_owned(),
        bytes: shown.len() as u64,
        complete,
        cut_bytes: cut_bytes(&data),
        exit_code,
    };
    if args.follow {
        let lease = api.lease(&args.lease).await?;
        let code = super::rent::exit_status(&lease, exit_code);
        out.emit(&view, |_| {});
        return Ok(code);
    }
    if out.json {
        out.emit(&view, |_| {});
    } else if !out.quiet {
        out.bytes(shown);
        if let Some(cut) = view.cut_bytes
            && args.tail.is_some()
        {
            // The notice may lie outside the lines shown: say it anyway, on stderr.
            out.note(&format!(
                "the provider cut {cut} bytes from the middle of this output (it keeps the first and the last 4 MiB)"
            ));
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_and_cut_notices() {
        assert_eq!(last_lines(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(last_lines(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(last_lines(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(last_lines(b"a\n", 0), b"");
        let notice = crate::lease::logs::cut_notice(1234, 10);
        let mut data = b"head".to_vec();
        data.extend_from_slice(notice.as_bytes());
        data.extend_from_slice(b"tail");
        assert_eq!(cut_bytes(&data), Some(1234));
        assert_eq!(cut_bytes(b"no notice [gridlease: x]"), None);
    }
}
