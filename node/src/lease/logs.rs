//! Container output of the leases this node provides (issue 11): one writer per lease copies the
//! container's Docker log into `<data_dir>/<lease id>.log` as it is produced, and every log
//! request is answered from that file by the task that received it, never by re-reading Docker
//! and never by the lease's session (its meter loop does not see log requests at all).
//!
//! # Writer
//! [`LogWriter::spawn`] starts following a freshly started container (`follow=true`, stdout and
//! stderr, raw bytes: no UTF-8 conversion) and truncates the file first; [`LogWriter::resume`]
//! follows a container the node finds still running after a restart. The file keeps the
//! output's **head and tail** ([`Caps`], half of [`super::MAX_LOG_BYTES`] each): the first
//! bytes are written as they come (followers see them live); past the head, the last bytes are
//! held in memory ([`Tail`], bounded) and written when the output is complete, after a
//! [`cut_notice`] that says how many bytes were cut between them ([`LogStats::dropped`]). So the
//! end of a job's output (its final metrics, its traceback) is always kept. The writer ends
//! when Docker's stream ends or it is stopped. Once the container has stopped,
//! [`LogWriter::finish`] stops it and makes the file final from one complete read of Docker's
//! retained output ([`writer::rewrite`], at most [`DRAIN_LIMIT`]; also how the output of a container
//! whose writer never ran is saved, [`catch_up`]), renamed over the live copy. Dropping a
//! `LogWriter` (the node shutting down) stops its task at the next chunk without writing the
//! tail: a resumed writer rebuilds it.
//!
//! **Resume rule:** Docker returns a container's log from its first retained byte, so a resumed
//! writer reads from the start and skips as many bytes as the file already holds, then appends.
//! Followers keep their offsets valid (nothing already served changes). This is exact as long
//! as Docker still holds the start of the output: the tenant's log config
//! ([`gridlease_sandbox::spec::LOG_MAX_FILE`] files of [`gridlease_sandbox::spec::log_file_mib`]) keeps
//! 20-30 MiB, well above the head, so it only fails if the container wrote more than that before
//! the file reached the head, e.g. while the node was down; the file then has a seam at the
//! resume point (the skipped bytes were not the ones saved). The alternative (truncate and
//! rewrite) would change bytes that followers have already read. The tail is rebuilt from what
//! Docker retains, which always includes the end.
//!
//! # Serving
//! [`read_chunk`] opens the file and reads at most [`super::wire::MAX_LOG_CHUNK`] bytes from
//! the offset: for a live lease on the calling task when the page cache holds them all
//! (`preadv2` with `RWF_NOWAIT`, which never waits for the disk: a follower reads what was
//! just written), else on the blocking pool. A follower's total cost is the size of the
//! output (`node/examples/bench_logs.rs`, docs/benchmarks.md). `eof` is set only
//! once the lease is over (settled or failed; the provider session finishes its writer before it
//! closes the lease) and the offset has reached the end of the file. Whether it is over and the
//! exit code come from the live session's [`LeaseView`] (a `watch`, never waiting on the
//! session) or, once the session has ended, from the store.

use std::path::PathBuf;
use std::time::Duration;

use gridlease_sandbox::SandboxError;

mod serve;
#[cfg(test)]
mod tests;
mod window;
mod writer;

pub use serve::read_chunk;
pub(crate) use serve::{LiveLog, logs_from_file, serve_renter};
pub use window::Tail;
pub use writer::{
    DRAIN_LIMIT, LogWriter, Progress, REFILL_IDLE, Refill, Written, append_stream,
    append_stream_refilled, catch_up, write_tail,
};

/// Most peers' log requests answered at once; more are answered `Busy` (the renter retries).
pub const LOG_READERS: usize = 16;
/// Log requests one peer may make: a burst of 40, then 40 a second (a follower asks about
/// three times a second; one chunk is at most 1023 KiB, so a reader catching up gets up to
/// 40 MiB/s).
pub const PEER_LOG_RATE: crate::net::ratelimit::RateLimit = crate::net::ratelimit::RateLimit {
    burst: 40,
    per_token: Duration::from_millis(25),
};
/// Most Docker log frames the writer gathers into one file write.
const BATCH: usize = 64;

/// Why writing a lease's output failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The output file could not be opened or written.
    #[error("cannot write container output to {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Docker's log stream failed.
    #[error(transparent)]
    Stream(#[from] SandboxError),
    /// The writer task panicked or was cancelled.
    #[error("the log writer task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// What a writer did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Length of the file (the output kept, and the cut notice if any).
    pub kept: u64,
    /// Bytes of output cut between the head and the tail.
    pub dropped: u64,
}

/// Whether a writer starts a new file or continues one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// A freshly started container: truncate the file.
    Truncate,
    /// The same container as the file's content: skip as many bytes of the stream as the file
    /// holds, append the rest.
    Resume,
}

/// How much of a container's output is kept: its first `head` bytes and its last `tail`
/// bytes; what lies between is cut, and a notice saying how much takes its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Bytes kept from the start (written as they come, so followers see them live).
    pub head: u64,
    /// Bytes kept from the end (held in memory, written when the output ends).
    pub tail: usize,
}

impl Caps {
    /// Half of `total` for each end.
    pub fn split(total: u64) -> Self {
        Self {
            head: total / 2,
            tail: usize::try_from(total - total / 2).unwrap_or(usize::MAX),
        }
    }
}

/// The notice written where output was cut.
pub fn cut_notice(cut: u64, tail: usize) -> String {
    format!("\n[gridlease: {cut} bytes of output cut here; the last {tail} bytes follow]\n")
}
