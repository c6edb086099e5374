//! `gridlease cp SRC LEASE:PATH` and `gridlease cp LEASE:PATH DST`: files and directories into
//! and out of a running lease's `/workspace`, over the P2P link (an access stream, see
//! `gridlease_protocol::transfer`), streamed (fixed buffers), checksummed (BLAKE3 of each
//! transfer's tar bytes, checked by the receiver), and resumable: what was copied is recorded in
//! a journal under `<home>/transfers/`, so after a lost connection (retried at once) or a
//! killed command (run it again) completed files are not sent again.
//!
//! `SRC` lands at `PATH` (like `cp -r SRC PATH` when `PATH` does not exist; an existing
//! directory is merged into). Uploads ([`upload`]) go in batches of at most [`BATCH_BYTES`] or
//! [`BATCH_ENTRIES`]: a batch is recorded once the provider wrote it and the checksum
//! matched, so an interrupted upload resends at most one batch. Downloads ([`download`]) record
//! each file as it is written, keep holes as holes, write at most `--max-size` bytes of data
//! (default: the lease's disk), and leave out with a warning what cannot land safely here; the
//! provider names what it left out itself.

mod download;
mod upload;

pub(crate) use download::{download, download_changed};
pub(crate) use upload::upload;

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde::Serialize;
use sha2::Digest as _;

use crate::api::client::{ApiClient, ClientError};
use crate::output::Printer;

/// Most file bytes in one upload batch.
pub const BATCH_BYTES: u64 = 64 << 20;
/// Upload batches streaming or awaiting their confirmation at once.
pub const IN_FLIGHT: usize = 2;
/// Most entries in one upload batch.
pub const BATCH_ENTRIES: usize = 2048;
/// Attempts per batch (or download) before giving up on a lost connection.
pub const ATTEMPTS: usize = 5;
/// Read and write buffer for local files (each read or write of a tokio file is a trip to the
/// blocking pool: in 8 KiB steps they cost more CPU than the rest of a copy together).
const FILE_BUFFER: usize = 1 << 20;
/// Most entries of a local tree sent in one `cp`.
pub const MAX_ENTRIES: usize = 1_000_000;

/// Arguments of `gridlease cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// Source: a local path, or `LEASE:PATH` (PATH inside `/workspace`).
    #[arg(value_name = "SRC")]
    pub src: String,
    /// Destination: `LEASE:PATH`, or a local path.
    #[arg(value_name = "DST")]
    pub dst: String,
    /// Download: the most bytes of file data to write here (`20GiB`, `500MB`, or bytes);
    /// files that would pass it are left out, each named. Default: the lease's disk.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
}

/// A size on the command line: bytes, or a number with a unit (`500MB`, `20GiB`).
fn parse_size(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|_| {
            format!(
                "{s:?} is not a size: write bytes, or a number with a unit such as 500MB or 20GiB"
            )
        })
}

/// One side of a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loc {
    /// A path on this machine.
    Local(PathBuf),
    /// A path in a lease's workspace.
    Remote {
        /// Lease id or unique prefix.
        lease: String,
        /// Path inside `/workspace`.
        path: String,
    },
}

impl Loc {
    /// `LEASE:PATH` when the part before the first `:` is 4 or more hex digits, else local.
    pub fn parse(s: &str) -> Self {
        if let Some((lease, path)) = s.split_once(':')
            && lease.len() >= 4
            && lease.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Self::Remote {
                lease: lease.to_ascii_lowercase(),
                path: path.to_string(),
            };
        }
        Self::Local(PathBuf::from(s))
    }
}

/// What a `cp` did (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct CopyReport {
    /// `upload` or `download`.
    pub direction: &'static str,
    /// Files copied by this run.
    pub files: u64,
    /// Files left out because an earlier, interrupted run of the same copy had copied them.
    pub skipped: u64,
    /// Bytes of file data copied by this run.
    pub bytes: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Connections lost and retried.
    pub retries: u64,
    /// Download: entries left out, each with why (a symlink out of the tree, a file over
    /// `--max-size`, ...).
    pub left_out: Vec<LeftOut>,
}

/// An entry a download left out.
#[derive(Clone, Debug, Serialize)]
pub struct LeftOut {
    /// Its path, relative to the copied path.
    pub path: String,
    /// Why, in words.
    pub reason: String,
}

/// `gridlease cp`.
pub async fn run(api: &ApiClient, out: &Printer, a: &CpArgs) -> anyhow::Result<u8> {
    let report = match (Loc::parse(&a.src), Loc::parse(&a.dst)) {
        (Loc::Local(src), Loc::Remote { lease, path }) => {
            upload(api, out, &src, &lease, &path).await?
        }
        (Loc::Remote { lease, path }, Loc::Local(dst)) => {
            download(api, out, &lease, &path, &dst, a.max_size).await?
        }
        (Loc::Remote { .. }, Loc::Remote { .. }) => {
            anyhow::bail!("both sides are leases; copy through this machine in two steps")
        }
        (Loc::Local(_), Loc::Local(_)) => {
            anyhow::bail!(
                "neither side is a lease: write one as LEASE:PATH (e.g. 5612757b:/workspace/data)"
            )
        }
    };
    out.emit(&report, |p| {
        p.line(&format!(
            "{} {} file(s), {:.1} MiB in {:.1} s ({:.1} MiB/s){}",
            if report.direction == "upload" {
                "uploaded"
            } else {
                "downloaded"
            },
            report.files,
            report.bytes as f64 / 1048576.0,
            report.seconds,
            report.bytes as f64 / 1048576.0 / report.seconds.max(1e-3),
            if report.skipped > 0 {
                format!("; {} already copied by an earlier run", report.skipped)
            } else {
                String::new()
            }
        ));
        if !report.left_out.is_empty() {
            p.line(&format!(
                "{} entr{} left out (named above)",
                report.left_out.len(),
                if report.left_out.len() == 1 {
                    "y"
                } else {
                    "ies"
                }
            ));
        }
    });
    // A copy that left entries out did not copy everything: scripts must see it.
    Ok(if report.left_out.is_empty() {
        0
    } else {
        LEFT_OUT_EXIT
    })
}

/// Exit code of a download that finished but left entries out.
pub const LEFT_OUT_EXIT: u8 = 6;

/// The journal of one copy: the entries already copied, one per line, appended and synced.
struct Journal {
    path: PathBuf,
    done: HashSet<String>,
}

impl Journal {
    fn open(home: &Path, key: &str) -> anyhow::Result<Self> {
        let dir = home.join("transfers");
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let digest = sha2::Sha256::digest(key.as_bytes());
        let path = dir.join(format!("{}.journal", hex::encode(&digest[..12])));
        let done = match std::fs::read_to_string(&path) {
            Ok(t) => t.lines().map(str::to_string).collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashSet::new(),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        Ok(Self { path, done })
    }

    fn record(&mut self, lines: impl IntoIterator<Item = String>) -> anyhow::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        let mut text = String::new();
        for l in lines {
            text.push_str(&l);
            text.push('\n');
            self.done.insert(l);
        }
        f.write_all(text.as_bytes())?;
        f.sync_data()?;
        Ok(())
    }

    fn finish(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn bar(out: &Printer, total: Option<u64>, what: &str) -> indicatif::ProgressBar {
    let b = match total {
        Some(t) => indicatif::ProgressBar::new(t),
        None => indicatif::ProgressBar::new_spinner(),
    };
    let template = if total.is_some() {
        format!("{what} {{bar:30}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} {{eta}}")
    } else {
        format!("{what} {{spinner}} {{bytes}} {{bytes_per_sec}}")
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
        b.set_style(style);
    }
    if out.quiet || out.json || !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        b.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    b
}

/// The waits between the [`ATTEMPTS`] attempts of a batch (or download) after a lost
/// connection: 500 ms, then 500 ms longer each time (1 s, 1.5 s, 2 s).
fn retry_delays() -> impl backon::Backoff {
    (1..ATTEMPTS).map(|attempt| std::time::Duration::from_millis(500 * attempt as u64))
}

/// Whether a failed attempt is worth another: the connection, not the provider's answer.
fn retryable(e: &anyhow::Error) -> bool {
    match e.downcast_ref::<ClientError>() {
        Some(ClientError::Transport(_)) | Some(ClientError::Api { status: 502, .. }) => true,
        Some(_) => false,
        None => e.downcast_ref::<Lost>().is_some(),
    }
}

/// The stream broke before the transfer ended.
#[derive(Debug, thiserror::Error)]
#[error("the connection to the provider was lost: {0}")]
struct Lost(String);
