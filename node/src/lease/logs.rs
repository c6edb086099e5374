//! Container output of the leases this node provides (issue 11): one writer per lease copies the
//! container's Docker log into `<data_dir>/<lease id>.log` as it is produced, and every log
//! request is answered from that file by the task that received it, never by re-reading Docker
//! and never by the lease's session (its meter loop does not see log requests at all).
//!
//! # Writer
//! [`LogWriter::spawn`] starts following a freshly started container (`follow=true`, stdout and
//! stderr, raw bytes: no UTF-8 conversion) and truncates the file first; [`LogWriter::resume`]
//! follows a container the node finds still running after a restart. Bytes past the cap
//! ([`super::MAX_LOG_BYTES`]) are dropped and counted ([`LogStats::dropped`]). The writer ends
//! when Docker's stream ends (the container exited and everything was delivered, or it was
//! removed); [`LogWriter::finish`] waits for that, at most [`DRAIN_TIMEOUT`], and if the stream
//! broke it makes one catch-up pass ([`catch_up`], which is also how output of a container whose
//! writer never ran is saved). Dropping a `LogWriter` stops its task at the next chunk.
//!
//! **Resume rule:** Docker returns a container's log from its first retained byte, so a resumed
//! writer reads from the start and skips as many bytes as the file already holds, then appends.
//! Followers keep their offsets valid (nothing already served changes). This is exact as long
//! as Docker still holds the start of the output: the tenant's log config
//! ([`gridlease_sandbox::spec::LOG_MAX_SIZE`] x [`gridlease_sandbox::spec::LOG_MAX_FILE`]) keeps
//! 20-30 MiB, well above the cap, so it only fails if the container wrote more than that before
//! the file reached the cap, e.g. while the node was down; the file then has a seam at the
//! resume point (the skipped bytes were not the ones saved). The alternative (truncate and
//! rewrite) would change bytes that followers have already read.
//!
//! # Serving
//! [`read_chunk`] opens the file, seeks to the offset and reads at most
//! [`super::wire::MAX_LOG_CHUNK`] bytes on the blocking pool: a follower's total cost is the
//! size of the output (`node/examples/bench_logs.rs`, docs/benchmarks.md). `eof` is set only
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

/// How long [`LogWriter::finish`] (and [`catch_up`]) wait for Docker to deliver the rest of an
/// exited container's output.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Most peers' log requests answered at once; more are answered `Busy` (the renter retries).
pub const LOG_READERS: usize = 16;
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
    /// Length of the file: bytes of output kept (at most the cap).
    pub kept: u64,
    /// Bytes of output past the cap that this writer saw and dropped.
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

/// Which part of each chunk of output goes to the file: bytes before `skip` are already there,
/// bytes from `cap` on are dropped.
#[derive(Clone, Copy, Debug)]
struct Window {
    /// Bytes of the stream seen so far.
    seen: u64,
    /// Bytes already in the file when the writer started.
    skip: u64,
    cap: u64,
    dropped: u64,
}

impl Window {
    fn new(skip: u64, cap: u64) -> Self {
        Self {
            seen: 0,
            skip,
            cap,
            dropped: 0,
        }
    }

    /// The part of `chunk` (the next bytes of the stream) to append to the file.
    fn admit<'a>(&mut self, chunk: &'a [u8]) -> &'a [u8] {
        let start = self.seen;
        let len = chunk.len() as u64;
        let end = start.saturating_add(len);
        self.seen = end;
        self.dropped = self
            .dropped
            .saturating_add(end.saturating_sub(start.max(self.cap)));
        let from = self.skip.max(start).min(end);
        let to = self.cap.max(from).min(end);
        // Both are within [start, end], so the offsets fit the chunk.
        let lo = usize::try_from(from - start).unwrap_or(chunk.len());
        let hi = usize::try_from(to - start).unwrap_or(chunk.len());
        &chunk[lo..hi]
    }

    /// The file's length if everything admitted was written.
    fn kept(&self) -> u64 {
        self.skip.max(self.seen.min(self.cap))
    }
}

/// Appends `stream` (a container's output from its first byte) to `path`, keeping at most `cap`
/// bytes in the file, until the stream ends or `stop` is cancelled (checked between chunks, so
/// a write is never cut short). Each batch of ready chunks is one write, flushed to the OS
/// before the next is read, so readers of the file see it at once.
pub async fn append_stream<S>(
    stream: S,
    path: &Path,
    cap: u64,
    mode: WriteMode,
    stop: &CancellationToken,
) -> Result<LogStats, LogError>
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
    let mut window = Window::new(skip, cap);
    let batches = stream.ready_chunks(BATCH);
    futures::pin_mut!(batches);
    let mut buf = Vec::new();
    loop {
        let batch = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            b = batches.next() => match b {
                Some(b) => b,
                None => break,
            },
        };
        buf.clear();
        let mut failed = None;
        for item in batch {
            match item {
                Ok(bytes) => buf.extend_from_slice(window.admit(&bytes)),
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
    Ok(LogStats {
        kept: window.kept(),
        dropped: window.dropped,
    })
}

/// The task copying one container's output into its lease's file. See the module docs.
#[derive(Debug)]
pub struct LogWriter {
    task: JoinHandle<Result<LogStats, LogError>>,
    stop: CancellationToken,
    /// Cancels `stop` when the writer is dropped (e.g. the node shuts down mid-lease).
    _guard: DropGuard,
    sandbox: Sandbox,
    container: String,
    path: PathBuf,
    cap: u64,
}

impl LogWriter {
    /// Starts following a container that was just started; truncates `path`.
    pub fn spawn(sandbox: Sandbox, container_id: String, path: PathBuf, cap: u64) -> Self {
        Self::start(sandbox, container_id, path, cap, WriteMode::Truncate, true)
    }

    /// Follows a container whose earlier output may already be in `path` (a node restart while
    /// it runs): skips that many bytes, appends the rest.
    pub fn resume(sandbox: Sandbox, container_id: String, path: PathBuf, cap: u64) -> Self {
        Self::start(sandbox, container_id, path, cap, WriteMode::Resume, true)
    }

    fn start(
        sandbox: Sandbox,
        container: String,
        path: PathBuf,
        cap: u64,
        mode: WriteMode,
        follow: bool,
    ) -> Self {
        let stop = CancellationToken::new();
        let stream = sandbox.log_stream(&container, follow);
        let (p, s) = (path.clone(), stop.clone());
        let task = tokio::spawn(
            async move { append_stream(stream, &p, cap, mode, &s).await }.in_current_span(),
        );
        Self {
            task,
            _guard: stop.clone().drop_guard(),
            stop,
            sandbox,
            container,
            path,
            cap,
        }
    }

    /// Waits (at most [`DRAIN_TIMEOUT`]) for the writer to copy the rest of the output of the
    /// exited (or stopped) container, then stops it. If Docker's stream broke, makes one
    /// catch-up pass. Problems are logged; the stats say what the file holds.
    pub async fn finish(mut self) -> LogStats {
        let outcome = match tokio::time::timeout(DRAIN_TIMEOUT, &mut self.task).await {
            Ok(joined) => joined,
            Err(_) => {
                tracing::warn!(timeout = ?DRAIN_TIMEOUT, "container output still streaming; stopping the log writer");
                self.stop.cancel();
                (&mut self.task).await
            }
        };
        let stats = match outcome.map_err(LogError::from).and_then(|r| r) {
            Ok(stats) => stats,
            Err(e) => {
                tracing::warn!(error = %e, "log writer failed; catching up");
                catch_up(&self.sandbox, &self.container, &self.path, self.cap).await
            }
        };
        report(&stats);
        stats
    }
}

fn report(stats: &LogStats) {
    if stats.dropped > 0 {
        tracing::info!(
            kept = stats.kept,
            dropped = stats.dropped,
            "container output past the cap was dropped"
        );
    } else {
        tracing::debug!(kept = stats.kept, "container output saved");
    }
}

/// One pass over the output Docker has now (no follow), appending what `path` lacks (see
/// [`WriteMode::Resume`]); at most [`DRAIN_TIMEOUT`]. For a container whose writer never ran
/// or broke. Returns what the file holds (problems are logged).
pub async fn catch_up(sandbox: &Sandbox, container_id: &str, path: &Path, cap: u64) -> LogStats {
    let w = LogWriter::start(
        sandbox.clone(),
        container_id.to_string(),
        path.to_path_buf(),
        cap,
        WriteMode::Resume,
        false,
    );
    let outcome = tokio::time::timeout(DRAIN_TIMEOUT, w.task).await;
    match outcome {
        Ok(Ok(Ok(stats))) => stats,
        Ok(Ok(Err(e))) => {
            tracing::debug!(error = %e, "no container output to save");
            file_stats(path).await
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "saving the container output failed");
            file_stats(path).await
        }
        Err(_) => {
            tracing::warn!(timeout = ?DRAIN_TIMEOUT, "saving the container output timed out");
            file_stats(path).await
        }
    }
}

async fn file_stats(path: &Path) -> LogStats {
    LogStats {
        kept: tokio::fs::metadata(path).await.map_or(0, |m| m.len()),
        dropped: 0,
    }
}

/// Reads at most `max` (capped at [`MAX_LOG_CHUNK`]) bytes of the output file from `offset`:
/// one open, seek and read, on the blocking pool. `finished`: the lease is over, so the file
/// will not grow (then `eof` is set once `offset` reaches its end). A missing file is empty
/// output; another I/O error is logged and gives an empty chunk without `eof`.
pub async fn read_chunk(
    path: &Path,
    offset: u64,
    max: u32,
    finished: bool,
    exit_code: Option<i32>,
) -> LogChunk {
    let p = path.to_path_buf();
    let max = max.min(MAX_LOG_CHUNK);
    let read = tokio::task::spawn_blocking(move || read_at(&p, offset, max)).await;
    let read = match read {
        Ok(r) => r,
        Err(e) => Err(std::io::Error::other(e)),
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

/// (where the data starts: `offset` clamped to the file's length, the data, the file's length).
fn read_at(path: &Path, offset: u64, max: u32) -> std::io::Result<(u64, Vec<u8>, u64)> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let start = offset.min(len);
    let n = (len - start).min(u64::from(max));
    // n <= MAX_LOG_CHUNK.
    let mut data = vec![0; usize::try_from(n).unwrap_or(0)];
    f.seek(SeekFrom::Start(start))?;
    f.read_exact(&mut data)?;
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
        let data = bytes(100_000);
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
        let tail = 100_000 - 100;
        let c = read_chunk(&path, tail, MAX_LOG_CHUNK, false, None).await;
        assert_eq!(
            (c.data.as_slice(), c.next_offset, c.eof),
            (&data[tail as usize..], 100_000, false)
        );
        let c = read_chunk(&path, tail, MAX_LOG_CHUNK, true, Some(0)).await;
        assert_eq!((c.data.len(), c.next_offset, c.eof), (100, 100_000, true));
        let c = read_chunk(&path, 100_000, MAX_LOG_CHUNK, true, Some(0)).await;
        assert_eq!((c.data.len(), c.next_offset, c.eof), (0, 100_000, true));
        // Past the end: clamped to the end.
        let c = read_chunk(&path, 200_000, MAX_LOG_CHUNK, false, None).await;
        assert_eq!((c.data.len(), c.next_offset, c.eof), (0, 100_000, false));

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
    fn window_skips_what_the_file_has_and_drops_past_the_cap() {
        let data = bytes(100);
        let mut w = Window::new(0, 30);
        assert_eq!(w.admit(&data[..20]), &data[..20]);
        assert_eq!(w.admit(&data[20..40]), &data[20..30]);
        assert_eq!(w.admit(&data[40..]), &[] as &[u8]);
        assert_eq!((w.kept(), w.dropped), (30, 70));

        let mut w = Window::new(25, 30);
        assert_eq!(w.admit(&data[..20]), &[] as &[u8]);
        assert_eq!(w.admit(&data[20..28]), &data[25..28]);
        assert_eq!(w.admit(&data[28..]), &data[28..30]);
        assert_eq!((w.kept(), w.dropped), (30, 70));

        // A file already longer than the cap is left alone.
        let mut w = Window::new(50, 30);
        assert_eq!(w.admit(&data), &[] as &[u8]);
        assert_eq!((w.kept(), w.dropped), (50, 70));
    }

    #[tokio::test]
    async fn append_stream_writes_bytes_exactly_truncates_resumes_and_caps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.log");
        let stop = CancellationToken::new();
        let data = bytes(10_000);
        std::fs::write(&path, b"stale output of an interrupted start").unwrap();

        let s = append_stream(
            stream_of(&data, 333),
            &path,
            1 << 20,
            WriteMode::Truncate,
            &stop,
        )
        .await
        .unwrap();
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
        let s = append_stream(
            stream_of(&data, 1000),
            &path,
            1 << 20,
            WriteMode::Resume,
            &stop,
        )
        .await
        .unwrap();
        assert_eq!(s.kept, 10_000);
        assert_eq!(std::fs::read(&path).unwrap(), data);

        // Cap: the rest is dropped and counted.
        let s = append_stream(
            stream_of(&data, 777),
            &path,
            6_000,
            WriteMode::Truncate,
            &stop,
        )
        .await
        .unwrap();
        assert_eq!(
            s,
            LogStats {
                kept: 6_000,
                dropped: 4_000
            }
        );
        assert_eq!(std::fs::read(&path).unwrap(), &data[..6_000]);

        // A broken stream is an error; what came before it is in the file.
        let broken =
            stream_of(&data[..500], 100).chain(futures::stream::iter([Err(SandboxError::Build {
                image: "x".into(),
                message: "gone".into(),
            })]));
        let r = append_stream(broken, &path, 1 << 20, WriteMode::Truncate, &stop).await;
        assert!(matches!(r, Err(LogError::Stream(_))), "{r:?}");
        assert_eq!(std::fs::read(&path).unwrap(), &data[..500]);

        // Stopped: ends at once, without waiting for the stream.
        stop.cancel();
        let s = append_stream(
            futures::stream::pending(),
            &path,
            1 << 20,
            WriteMode::Resume,
            &stop,
        )
        .await
        .unwrap();
        assert_eq!(s.kept, 500);
    }
}
