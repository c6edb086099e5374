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
//! retained output ([`rewrite`], at most [`DRAIN_LIMIT`]; also how the output of a container
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

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use gridlease_protocol::{LeaseId, PeerId};
use gridlease_sandbox::{Sandbox, SandboxError};
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;

use super::view::LeaseView;
use super::wire::{LogChunk, MAX_LOG_CHUNK, SessionResponse};
use super::{Ctx, LeaseError};
use crate::store::{Role, StoredLease};

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

/// Which part of each chunk of output goes to the file now (the head) and which past it (to
/// the tail): bytes before `skip` are already in the file.
#[derive(Clone, Copy, Debug)]
struct Window {
    /// Bytes of the stream seen so far.
    seen: u64,
    /// Bytes already in the file when the writer started.
    skip: u64,
    head: u64,
}

impl Window {
    fn new(skip: u64, head: u64) -> Self {
        Self {
            seen: 0,
            skip,
            head,
        }
    }

    /// (the part of `chunk`, the next bytes of the stream, to append to the file; the part
    /// past the head).
    fn admit<'a>(&mut self, chunk: &'a [u8]) -> (&'a [u8], &'a [u8]) {
        let start = self.seen;
        let len = chunk.len() as u64;
        let end = start.saturating_add(len);
        self.seen = end;
        let from = self.skip.max(start).min(end);
        let to = self.head.max(from).min(end);
        let over = self.head.max(self.skip).max(start).min(end);
        // All are within [start, end], so the offsets fit the chunk.
        let at = |x: u64| usize::try_from(x - start).unwrap_or(chunk.len());
        (&chunk[at(from)..at(to)], &chunk[at(over)..])
    }

    /// The file's length if everything admitted to the head was written.
    fn kept(&self) -> u64 {
        self.skip.max(self.seen.min(self.head))
    }
}

/// The last bytes of the output past the head, at most `cap`, and how many before them were
/// cut.
#[derive(Debug, Default)]
pub struct Tail {
    bytes: std::collections::VecDeque<u8>,
    cap: usize,
    cut: u64,
}

impl Tail {
    fn new(cap: usize) -> Self {
        Self {
            bytes: std::collections::VecDeque::new(),
            cap,
            cut: 0,
        }
    }

    fn push(&mut self, b: &[u8]) {
        if b.len() >= self.cap {
            self.cut += (self.bytes.len() + b.len() - self.cap) as u64;
            self.bytes.clear();
            self.bytes.extend(&b[b.len() - self.cap..]);
            return;
        }
        let over = (self.bytes.len() + b.len()).saturating_sub(self.cap);
        self.bytes.drain(..over);
        self.cut += over as u64;
        self.bytes.extend(b);
    }
}

/// What a writer copied: the stats of the head it wrote, and the tail it holds.
#[derive(Debug)]
pub struct Written {
    /// The file as the writer left it (the head).
    pub stats: LogStats,
    /// The output past the head.
    pub tail: Tail,
}

/// Counts the bytes a writer has seen.
pub type Progress = std::sync::Arc<std::sync::atomic::AtomicU64>;

/// Appends `stream` (a container's output from its first byte) to `path`: its first
/// `caps.head` bytes to the file as they come, the last `caps.tail` past them to a [`Tail`] in
/// memory, until the stream ends or `stop` is cancelled (checked between chunks, so a write
/// is never cut short). Each batch of ready chunks is one write, flushed to the OS before the
/// next is read, so readers of the file see it at once. The tail is written by
/// [`write_tail`] once the output is complete.
pub async fn append_stream<S>(
    stream: S,
    path: &Path,
    caps: Caps,
    mode: WriteMode,
    stop: &CancellationToken,
    progress: &Progress,
) -> Result<Written, LogError>
where
    S: Stream<Item = Result<Bytes, SandboxError>>,
{
    append_stream_refilled(stream, None, path, caps, mode, stop, progress).await
}

/// A fresh, complete (not following) read of the container's output from its first byte.
pub type Refill =
    dyn Fn() -> futures::stream::BoxStream<'static, Result<Bytes, SandboxError>> + Send + Sync;

/// How long the follow stream may be silent, while the head is not full, before the writer
/// reads the retained output once to catch up ([`append_stream_refilled`]).
pub const REFILL_IDLE: Duration = Duration::from_secs(3);

/// [`append_stream`], and whenever `stream` (Docker's follow stream) has been silent for
/// [`REFILL_IDLE`] while the head is not full, one read of `refill` appends what the file
/// lacks up to the head: Docker's follow stream can sit on output already written until the
/// next write comes (seen here: 100 kB held back for 12 s), so followers would not see it.
/// Bytes the follow stream delivers later that the file has already are skipped.
pub async fn append_stream_refilled<S>(
    stream: S,
    refill: Option<&Refill>,
    path: &Path,
    caps: Caps,
    mode: WriteMode,
    stop: &CancellationToken,
    progress: &Progress,
) -> Result<Written, LogError>
where
    S: Stream<Item = Result<Bytes, SandboxError>>,
{
    let file_err = |source| LogError::File {
        path: path.to_path_buf(),
        source,
    };
    let mut opts = tokio::fs::OpenOptions::new();
    opts.create(true);
    match mode {
        WriteMode::Truncate => opts.write(true).truncate(true),
        WriteMode::Resume => opts.append(true),
    };
    let mut file = opts.open(path).await.map_err(file_err)?;
    let skip = match mode {
        WriteMode::Truncate => 0,
        WriteMode::Resume => file.metadata().await.map_err(file_err)?.len(),
    };
    if skip > caps.head {
        // Longer than the head: the file was completed (tail written) before; nothing to add.
        return Ok(Written {
            stats: LogStats {
                kept: skip,
                dropped: 0,
            },
            tail: Tail::new(caps.tail),
        });
    }
    let mut window = Window::new(skip, caps.head);
    let mut tail = Tail::new(caps.tail);
    let batches = stream.ready_chunks(BATCH);
    futures::pin_mut!(batches);
    let mut buf = Vec::new();
    let idle = tokio::time::sleep(REFILL_IDLE);
    tokio::pin!(idle);
    loop {
        let want_refill = refill.is_some() && window.kept() < caps.head;
        let batch = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            b = batches.next() => match b {
                Some(b) => b,
                None => break,
            },
            () = &mut idle, if want_refill => {
                if let Some(r) = refill {
                    let have = window.kept();
                    let now_has = top_up(r(), &mut file, have, caps.head).await.map_err(file_err)?;
                    if now_has > have {
                        tracing::debug!(added = now_has - have, "caught up with output the follow stream held back");
                        window.skip = now_has;
                    }
                }
                idle.as_mut().reset(tokio::time::Instant::now() + REFILL_IDLE);
                continue;
            }
        };
        idle.as_mut()
            .reset(tokio::time::Instant::now() + REFILL_IDLE);
        buf.clear();
        let mut failed = None;
        for item in batch {
            match item {
                Ok(bytes) => {
                    let (head, over) = window.admit(&bytes);
                    buf.extend_from_slice(head);
                    tail.push(over);
                    progress.fetch_add(bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if !buf.is_empty() {
            file.write_all(&buf).await.map_err(file_err)?;
            file.flush().await.map_err(file_err)?;
        }
        if let Some(e) = failed {
            return Err(e.into());
        }
    }
    file.flush().await.map_err(file_err)?;
    Ok(Written {
        stats: LogStats {
            kept: window.kept(),
            dropped: 0,
        },
        tail,
    })
}

/// Appends to `file` (holding the first `have` bytes of the output) what `stream` (the output
/// from its first byte) has beyond them, up to `head` bytes in all; stops reading there, or
/// after [`REFILL_IDLE`]. Returns the file's length. A failed read adds nothing more.
async fn top_up<S>(
    stream: S,
    file: &mut tokio::fs::File,
    have: u64,
    head: u64,
) -> std::io::Result<u64>
where
    S: Stream<Item = Result<Bytes, SandboxError>>,
{
    futures::pin_mut!(stream);
    let (mut seen, mut len) = (0u64, have);
    let deadline = tokio::time::Instant::now() + REFILL_IDLE;
    while len < head {
        let Ok(Some(Ok(bytes))) = tokio::time::timeout_at(deadline, stream.next()).await else {
            break;
        };
        let start = seen;
        seen += bytes.len() as u64;
        let from = len.max(start).min(seen);
        let to = head.min(seen);
        if to > from {
            let lo = usize::try_from(from - start).unwrap_or(0);
            let hi = usize::try_from(to - start).unwrap_or(0);
            file.write_all(&bytes[lo..hi]).await?;
            len = to;
        }
    }
    file.flush().await?;
    Ok(len)
}

/// Completes the file once the output is complete: the tail after the head, preceded by
/// [`cut_notice`] when bytes between them were cut. Returns what the file holds.
pub async fn write_tail(path: &Path, w: Written) -> LogStats {
    let Written { mut stats, tail } = w;
    if tail.bytes.is_empty() {
        return stats;
    }
    let mut out = Vec::with_capacity(tail.bytes.len() + 96);
    if tail.cut > 0 {
        out.extend_from_slice(cut_notice(tail.cut, tail.bytes.len()).as_bytes());
    }
    let (a, b) = tail.bytes.as_slices();
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    let written = async {
        let mut f = tokio::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .await?;
        f.write_all(&out).await?;
        f.flush().await
    }
    .await;
    match written {
        Ok(()) => {
            stats.kept += out.len() as u64;
            stats.dropped = tail.cut;
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the end of the container output");
            stats.dropped = tail.cut + (tail.bytes.len() as u64);
        }
    }
    stats
}

/// How long reading a stopped container's whole retained output may take ([`rewrite`]).
pub const DRAIN_LIMIT: Duration = Duration::from_secs(120);

/// The task copying one container's output into its lease's file. See the module docs.
#[derive(Debug)]
pub struct LogWriter {
    task: JoinHandle<Result<Written, LogError>>,
    stop: CancellationToken,
    /// Cancels `stop` when the writer is dropped (e.g. the node shuts down mid-lease).
    _guard: DropGuard,
    sandbox: Sandbox,
    container: String,
    path: PathBuf,
    caps: Caps,
}

impl LogWriter {
    /// Starts following a container that was just started; truncates `path`.
    pub fn spawn(sandbox: Sandbox, container_id: String, path: PathBuf, caps: Caps) -> Self {
        Self::start(sandbox, container_id, path, caps, WriteMode::Truncate, true)
    }

    /// Follows a container whose earlier output may already be in `path` (a node restart while
    /// it runs): skips that many bytes, appends the rest.
    pub fn resume(sandbox: Sandbox, container_id: String, path: PathBuf, caps: Caps) -> Self {
        Self::start(sandbox, container_id, path, caps, WriteMode::Resume, true)
    }

    fn start(
        sandbox: Sandbox,
        container: String,
        path: PathBuf,
        caps: Caps,
        mode: WriteMode,
        follow: bool,
    ) -> Self {
        let stop = CancellationToken::new();
        let progress = Progress::default();
        let stream = sandbox.log_stream(&container, follow);
        let (p, s, pr) = (path.clone(), stop.clone(), progress);
        let (sb, cid) = (sandbox.clone(), container.clone());
        let task = tokio::spawn(
            async move {
                let refill = move || sb.log_stream(&cid, false).boxed();
                let refill: Option<&Refill> = if follow { Some(&refill) } else { None };
                append_stream_refilled(stream, refill, &p, caps, mode, &s, &pr).await
            }
            .in_current_span(),
        );
        Self {
            task,
            _guard: stop.clone().drop_guard(),
            stop,
            sandbox,
            container,
            path,
            caps,
        }
    }

    /// Makes the file final once the container has stopped: the live writer is stopped, and
    /// the file is rewritten from one complete read of what Docker retains ([`rewrite`]):
    /// Docker's *follow* stream can end early or skip bytes while a fast writer's log rotates
    /// (observed here: 9.0 of 10.5 MB delivered, and a stream that stays open after the exit),
    /// so the live copy is only what followers see while the container runs. If that read
    /// fails, the live copy is completed with its own tail. Problems are logged; the stats say
    /// what the file holds.
    pub async fn finish(mut self) -> LogStats {
        self.stop.cancel();
        let outcome = (&mut self.task).await;
        let live = match outcome.map_err(LogError::from).and_then(|r| r) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "log writer failed; saving from Docker");
                None
            }
        };
        let stats = match rewrite(&self.sandbox, &self.container, &self.path, self.caps).await {
            Some(stats) => stats,
            None => match live {
                Some(w) => write_tail(&self.path, w).await,
                None => file_stats(&self.path).await,
            },
        };
        report(&stats);
        stats
    }
}

/// Writes the container's whole retained output (one read, no follow), head and tail, to a
/// temporary file and renames it over `path` (readers see the old file or the new one, never
/// a partial one). `None` when it could not be read (the container is gone) or written.
async fn rewrite(
    sandbox: &Sandbox,
    container_id: &str,
    path: &Path,
    caps: Caps,
) -> Option<LogStats> {
    let tmp = path.with_extension("log.tmp");
    let stop = CancellationToken::new();
    let stream = sandbox.log_stream(container_id, false);
    let progress = Progress::default();
    let read = append_stream(stream, &tmp, caps, WriteMode::Truncate, &stop, &progress);
    let written = match tokio::time::timeout(DRAIN_LIMIT, read).await {
        Ok(Ok(w)) => w,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "cannot read the container output from Docker");
            let _ = tokio::fs::remove_file(&tmp).await;
            return None;
        }
        Err(_) => {
            tracing::warn!(timeout = ?DRAIN_LIMIT, "reading the container output timed out");
            let _ = tokio::fs::remove_file(&tmp).await;
            return None;
        }
    };
    let stats = write_tail(&tmp, written).await;
    match tokio::fs::rename(&tmp, path).await {
        Ok(()) => Some(stats),
        Err(e) => {
            tracing::warn!(error = %e, "cannot replace the container output file");
            let _ = tokio::fs::remove_file(&tmp).await;
            None
        }
    }
}

fn report(stats: &LogStats) {
    if stats.dropped > 0 {
        tracing::info!(
            kept = stats.kept,
            dropped = stats.dropped,
            "container output between the head and the tail was cut"
        );
    } else {
        tracing::debug!(kept = stats.kept, "container output saved");
    }
}

/// Saves the output of a container whose writer never ran or broke: one complete read of
/// what Docker retains ([`rewrite`]); if that fails, the file stays as it is. Returns what the
/// file holds (problems are logged).
pub async fn catch_up(sandbox: &Sandbox, container_id: &str, path: &Path, caps: Caps) -> LogStats {
    match rewrite(sandbox, container_id, path, caps).await {
        Some(stats) => stats,
        None => file_stats(path).await,
    }
}

async fn file_stats(path: &Path) -> LogStats {
    LogStats {
        kept: tokio::fs::metadata(path).await.map_or(0, |m| m.len()),
        dropped: 0,
    }
}

/// Reads at most `max` (capped at [`MAX_LOG_CHUNK`]) bytes of the output file from `offset`:
/// one open and read, from the page cache on the calling task or else on the blocking pool
/// (below). `finished`: the lease is over, so the file
/// will not grow (then `eof` is set once `offset` reaches its end). A missing file is empty
/// output; another I/O error is logged and gives an empty chunk without `eof`.
pub async fn read_chunk(
    path: &Path,
    offset: u64,
    max: u32,
    finished: bool,
    exit_code: Option<i32>,
) -> LogChunk {
    let max = max.min(MAX_LOG_CHUNK);
    // A live lease's file is being written by this node (its inode is cached) and a follower
    // reads what was just written (in the page cache): read it here when the page cache holds
    // all of it, which never waits for the disk; otherwise (or for a finished lease's file,
    // which may be cold) on the blocking pool. The pool's hop was most of a request's cost.
    let cached = if finished {
        None
    } else {
        read_cached(path, offset, max)
    };
    let read = match cached {
        Some(r) => r,
        None => {
            let p = path.to_path_buf();
            match tokio::task::spawn_blocking(move || read_at(&p, offset, max)).await {
                Ok(r) => r,
                Err(e) => Err(std::io::Error::other(e)),
            }
        }
    };
    match read {
        Ok((start, data, len)) => {
            let next_offset = start + data.len() as u64;
            LogChunk {
                eof: finished && next_offset >= len,
                next_offset,
                data,
                exit_code,
            }
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read container output");
            LogChunk {
                data: Vec::new(),
                next_offset: offset,
                eof: false,
                exit_code,
            }
        }
    }
}

/// The output file opened for a read of at most `max` bytes from `offset`: (the file, where
/// the data starts: `offset` clamped to the file's length, how many bytes, the file's length);
/// `None` for a missing file (empty output).
fn open_range(
    path: &Path,
    offset: u64,
    max: u32,
) -> std::io::Result<Option<(std::fs::File, u64, u64, u64)>> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let start = offset.min(len);
    Ok(Some((f, start, (len - start).min(u64::from(max)), len)))
}

/// [`read_at`] without waiting for the disk: `preadv2(RWF_NOWAIT)` answers only from the page
/// cache. `None` when it cannot (part of the range not cached, or the kernel lacks the flag):
/// the caller reads on the blocking pool.
fn read_cached(path: &Path, offset: u64, max: u32) -> Option<std::io::Result<(u64, Vec<u8>, u64)>> {
    use rustix::io::{Errno, ReadWriteFlags, preadv2};
    let (f, start, n, len) = match open_range(path, offset, max) {
        Ok(Some(r)) => r,
        Ok(None) => return Some(Ok((0, Vec::new(), 0))),
        Err(e) => return Some(Err(e)),
    };
    // n <= MAX_LOG_CHUNK.
    let mut data = vec![0u8; usize::try_from(n).unwrap_or(0)];
    let mut got = 0;
    while got < data.len() {
        let mut bufs = [std::io::IoSliceMut::new(&mut data[got..])];
        match preadv2(&f, &mut bufs, start + got as u64, ReadWriteFlags::NOWAIT) {
            Ok(0) => return None,
            Ok(k) => got += k,
            Err(Errno::INTR) => {}
            // Not (all) in the page cache, or no RWF_NOWAIT here: the blocking pool reads it.
            Err(_) => return None,
        }
    }
    Some(Ok((start, data, len)))
}

/// (where the data starts: `offset` clamped to the file's length, the data, the file's length).
fn read_at(path: &Path, offset: u64, max: u32) -> std::io::Result<(u64, Vec<u8>, u64)> {
    let Some((mut f, start, n, len)) = open_range(path, offset, max)? else {
        return Ok((0, Vec::new(), 0));
    };
    // n <= MAX_LOG_CHUNK, read into uninitialised capacity (`read_to_end` through `take`).
    let mut data = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    f.seek(SeekFrom::Start(start))?;
    f.take(n).read_to_end(&mut data)?;
    if (data.len() as u64) < n {
        // The file shrank under us (it is only ever renamed over, so this is a replaced file).
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
    }
    Ok((start, data, len))
}

/// What a log request needs to know about a lease this node provides, from its live view.
#[derive(Clone, Debug)]
pub(crate) struct LiveLog {
    /// The lease's renter (the only peer that may read the output).
    renter: Option<PeerId>,
    /// The lease is over: its writer has finished.
    finished: bool,
    exit_code: Option<i32>,
}

impl LiveLog {
    /// `None` unless the view is of a lease this node provides.
    pub(crate) fn of(view: &LeaseView) -> Option<Self> {
        (view.role == crate::store::Role::Provider).then(|| Self {
            renter: view.counterparty.parse().ok(),
            finished: view.is_terminal(),
            exit_code: view.exit_code,
        })
    }

    /// Reads a chunk of this lease's output.
    pub(crate) async fn read(&self, ctx: &Ctx, id: &LeaseId, offset: u64, max: u32) -> LogChunk {
        read_chunk(
            &ctx.log_path(id),
            offset,
            max,
            self.finished,
            self.exit_code,
        )
        .await
    }
}

/// Output of a provider lease without a live session, from its file (the lease's state and exit
/// code from the store).
pub(crate) async fn logs_from_file(
    ctx: &Ctx,
    l: &StoredLease,
    offset: u64,
    max: u32,
) -> Result<LogChunk, LeaseError> {
    let id = l.lease.id;
    let rec = ctx.store.call(move |s| s.session_record(&id)).await?;
    let finished = l.lease.state.is_terminal();
    Ok(read_chunk(
        &ctx.log_path(&id),
        offset,
        max,
        finished,
        rec.fields.exit_code,
    )
    .await)
}

/// Answers a peer's log request for lease `id`: from the file, with the live session's view
/// (`live`) if the lease has one, else from the store. Only the lease's renter gets an answer
/// other than `UnknownLease`.
pub(crate) async fn serve_renter(
    ctx: &Ctx,
    live: Option<LeaseView>,
    peer: PeerId,
    id: LeaseId,
    offset: u64,
    max: u32,
) -> SessionResponse {
    if let Some(v) = live {
        return match LiveLog::of(&v) {
            Some(l) if l.renter == Some(peer) => {
                SessionResponse::Logs(l.read(ctx, &id, offset, max).await)
            }
            _ => SessionResponse::UnknownLease,
        };
    }
    let Ok(Some(l)) = ctx.store.call(move |s| s.lease(&id)).await else {
        return SessionResponse::UnknownLease;
    };
    if l.role != Role::Provider || l.lease.terms.renter.peer_id().ok() != Some(peer) {
        return SessionResponse::UnknownLease;
    }
    match logs_from_file(ctx, &l, offset, max).await {
        Ok(chunk) => SessionResponse::Logs(chunk),
        Err(e) => {
            tracing::warn!(error = %e, "cannot serve logs");
            SessionResponse::Busy
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn a_cached_read_gives_what_the_pool_read_gives() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.log");
        let data = bytes(3 * MAX_LOG_CHUNK as usize / 2);
        std::fs::write(&path, &data).unwrap();
        for (offset, max) in [
            (0, MAX_LOG_CHUNK),
            (100, 7),
            (data.len() as u64 - 3, 64),
            (1 << 40, 8),
        ] {
            // Just written: in the page cache (where RWF_NOWAIT exists, which it does on the
            // kernels this runs on: 4.14+).
            let cached = read_cached(&path, offset, max)
                .expect("in the page cache")
                .unwrap();
            assert_eq!(
                cached,
                read_at(&path, offset, max).unwrap(),
                "offset {offset}"
            );
        }
        let missing = read_cached(&dir.path().join("none"), 0, 8)
            .unwrap()
            .unwrap();
        assert_eq!(missing, (0, Vec::new(), 0));
    }

    fn stream_of(
        data: &[u8],
        chunk: usize,
    ) -> impl Stream<Item = Result<Bytes, SandboxError>> + use<> {
        let chunks: Vec<_> = data
            .chunks(chunk)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures::stream::iter(chunks)
    }

    #[tokio::test]
    async fn read_chunk_follows_offsets_caps_max_and_sets_eof_only_when_finished() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.log");
        let size = 2 * MAX_LOG_CHUNK as usize + 100_000;
        let data = bytes(size);
        std::fs::write(&path, &data).unwrap();

        let c = read_chunk(&path, 0, 10, false, None).await;
        assert_eq!(c.data, &data[..10]);
        assert_eq!((c.next_offset, c.eof), (10, false));

        // `max` is capped at MAX_LOG_CHUNK.
        let c = read_chunk(&path, 10, u32::MAX, true, Some(3)).await;
        assert_eq!(c.data.len(), MAX_LOG_CHUNK as usize);
        assert_eq!(c.data, &data[10..10 + MAX_LOG_CHUNK as usize]);
        assert!(!c.eof, "more to read");
        assert_eq!(c.exit_code, Some(3));

        // The last bytes: eof only when finished.
        let tail = size as u64 - 100;
        let c = read_chunk(&path, tail, MAX_LOG_CHUNK, false, None).await;
        assert_eq!(
            (c.data.as_slice(), c.next_offset, c.eof),
            (&data[tail as usize..], size as u64, false)
        );
        let c = read_chunk(&path, tail, MAX_LOG_CHUNK, true, Some(0)).await;
        assert_eq!(
            (c.data.len(), c.next_offset, c.eof),
            (100, size as u64, true)
        );
        let c = read_chunk(&path, size as u64, MAX_LOG_CHUNK, true, Some(0)).await;
        assert_eq!((c.data.len(), c.next_offset, c.eof), (0, size as u64, true));
        // Past the end: clamped to the end.
        let c = read_chunk(&path, 2 * size as u64, MAX_LOG_CHUNK, false, None).await;
        assert_eq!(
            (c.data.len(), c.next_offset, c.eof),
            (0, size as u64, false)
        );

        // Following chunk by chunk gives the file back exactly.
        let (mut out, mut at) = (Vec::new(), 0);
        loop {
            let c = read_chunk(&path, at, MAX_LOG_CHUNK, true, None).await;
            out.extend_from_slice(&c.data);
            at = c.next_offset;
            if c.eof {
                break;
            }
        }
        assert_eq!(out, data);

        // No file yet: empty output, finished or not.
        let none = dir.path().join("none.log");
        let c = read_chunk(&none, 0, MAX_LOG_CHUNK, false, None).await;
        assert_eq!((c.data.len(), c.next_offset, c.eof), (0, 0, false));
        let c = read_chunk(&none, 0, MAX_LOG_CHUNK, true, None).await;
        assert!(c.eof);
    }

    #[test]
    fn window_skips_what_the_file_has_and_sends_the_rest_past_the_head_to_the_tail() {
        let data = bytes(100);
        let mut w = Window::new(0, 30);
        assert_eq!(w.admit(&data[..20]), (&data[..20], &[] as &[u8]));
        assert_eq!(w.admit(&data[20..40]), (&data[20..30], &data[30..40]));
        assert_eq!(w.admit(&data[40..]), (&[] as &[u8], &data[40..]));
        assert_eq!(w.kept(), 30);

        let mut w = Window::new(25, 30);
        assert_eq!(w.admit(&data[..20]), (&[] as &[u8], &[] as &[u8]));
        assert_eq!(w.admit(&data[20..28]), (&data[25..28], &[] as &[u8]));
        assert_eq!(w.admit(&data[28..]), (&data[28..30], &data[30..]));
        assert_eq!(w.kept(), 30);
    }

    #[test]
    fn tail_keeps_the_last_bytes_and_counts_the_cut() {
        let data = bytes(1000);
        let mut t = Tail::new(100);
        for c in data.chunks(7) {
            t.push(c);
        }
        assert_eq!(t.bytes.iter().copied().collect::<Vec<_>>(), &data[900..]);
        assert_eq!(t.cut, 900);
        let mut t = Tail::new(100);
        t.push(&data[..50]);
        t.push(&data[50..500]);
        assert_eq!(t.bytes.iter().copied().collect::<Vec<_>>(), &data[400..500]);
        assert_eq!(t.cut, 400);
    }

    async fn write_all(
        data: &[u8],
        chunk: usize,
        path: &Path,
        caps: Caps,
        mode: WriteMode,
    ) -> LogStats {
        let stop = CancellationToken::new();
        let w = append_stream(
            stream_of(data, chunk),
            path,
            caps,
            mode,
            &stop,
            &Progress::default(),
        )
        .await
        .unwrap();
        write_tail(path, w).await
    }

    #[tokio::test]
    async fn append_stream_writes_bytes_exactly_truncates_resumes_and_keeps_head_and_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.log");
        let data = bytes(10_000);
        let big = Caps {
            head: 1 << 20,
            tail: 1 << 20,
        };
        std::fs::write(&path, b"stale output of an interrupted start").unwrap();

        let s = write_all(&data, 333, &path, big, WriteMode::Truncate).await;
        assert_eq!(
            s,
            LogStats {
                kept: 10_000,
                dropped: 0
            }
        );
        assert_eq!(std::fs::read(&path).unwrap(), data);

        // Resume after a restart: the file has a prefix, the stream starts from byte 0 again.
        std::fs::write(&path, &data[..4_321]).unwrap();
        let s = write_all(&data, 1000, &path, big, WriteMode::Resume).await;
        assert_eq!(s.kept, 10_000);
        assert_eq!(std::fs::read(&path).unwrap(), data);

        // Past the head and the tail: head, notice, tail.
        let caps = Caps {
            head: 3_000,
            tail: 2_000,
        };
        let s = write_all(&data, 777, &path, caps, WriteMode::Truncate).await;
        let mut expected = data[..3_000].to_vec();
        expected.extend_from_slice(cut_notice(5_000, 2_000).as_bytes());
        expected.extend_from_slice(&data[8_000..]);
        assert_eq!(std::fs::read(&path).unwrap(), expected);
        assert_eq!(s.dropped, 5_000);
        assert_eq!(s.kept, expected.len() as u64);
        // Past the head but within the tail: nothing cut, the file is the output exactly.
        let caps = Caps {
            head: 6_000,
            tail: 5_000,
        };
        let s = write_all(&data, 500, &path, caps, WriteMode::Truncate).await;
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert_eq!(s.dropped, 0);
        // Resumed with the head full: the tail is rebuilt from the stream.
        std::fs::write(&path, &data[..3_000]).unwrap();
        let caps = Caps {
            head: 3_000,
            tail: 2_000,
        };
        write_all(&data, 999, &path, caps, WriteMode::Resume).await;
        assert_eq!(std::fs::read(&path).unwrap(), expected);
        // A completed file is never appended to again.
        write_all(&data, 999, &path, caps, WriteMode::Resume).await;
        assert_eq!(std::fs::read(&path).unwrap(), expected);

        // A broken stream is an error; what came before it is in the file.
        let stop = CancellationToken::new();
        let broken =
            stream_of(&data[..500], 100).chain(futures::stream::iter([Err(SandboxError::Build {
                image: "x".into(),
                message: "gone".into(),
            })]));
        let r = append_stream(
            broken,
            &path,
            big,
            WriteMode::Truncate,
            &stop,
            &Progress::default(),
        )
        .await;
        assert!(matches!(r, Err(LogError::Stream(_))), "{r:?}");
        assert_eq!(std::fs::read(&path).unwrap(), &data[..500]);

        // Stopped: ends at once, without waiting for the stream.
        stop.cancel();
        let w = append_stream(
            futures::stream::pending(),
            &path,
            big,
            WriteMode::Resume,
            &stop,
            &Progress::default(),
        )
        .await
        .unwrap();
        assert_eq!(w.stats.kept, 500);
    }

    /// Real time (the refill waits [`REFILL_IDLE`], 3 s): about 6 s.
    #[tokio::test]
    async fn a_silent_follow_stream_is_caught_up_from_a_full_read_without_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.log");
        let data = bytes(3_000);
        // The follow stream delivers 1000 bytes, holds the rest back for a while, then sends
        // everything after those 1000 (as Docker would once the next write wakes it).
        let late = data[1_000..].to_vec();
        let follow = stream_of(&data[..1_000], 100)
            .chain(futures::stream::once(async {
                tokio::time::sleep(Duration::from_secs(6)).await;
                Ok(Bytes::new())
            }))
            .chain(stream_of(&late, 250));
        let full = data.clone();
        let refill = move || stream_of(&full, 400).boxed();
        let stop = CancellationToken::new();
        let caps = Caps {
            head: 10_000,
            tail: 10_000,
        };
        // Look at the file 4.5 s in, while the follow stream still holds its bytes back.
        let (p, s) = (path.clone(), stop.clone());
        let early = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(4_500)).await;
            let seen = std::fs::read(&p).unwrap();
            drop(s);
            seen
        });
        let w = append_stream_refilled(
            follow,
            Some(&refill),
            &path,
            caps,
            WriteMode::Truncate,
            &stop,
            &Progress::default(),
        )
        .await
        .unwrap();
        assert_eq!(
            early.await.unwrap(),
            data,
            "caught up while the follow stream was silent"
        );
        assert_eq!(w.stats.kept, 3_000);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            data,
            "caught up once, nothing twice"
        );
    }
}
