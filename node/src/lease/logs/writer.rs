//! Writing a lease's output: [`LogWriter`] follows the container's Docker log into the file,
//! keeping its head and tail ([`append_stream`], [`write_tail`]), and makes the file final from
//! one complete read once the container has stopped ([`catch_up`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use gridlease_sandbox::{Sandbox, SandboxError};
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;

use super::window::{Tail, Window};
use super::{BATCH, Caps, LogError, LogStats, WriteMode, cut_notice};

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
