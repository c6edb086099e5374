//! Provider: `gridlease cp` into and out of a lease's workspace, written and read by the node
//! itself on the workspace's filesystem (`gridlease_sandbox::files`: mounted on the host,
//! every name resolved beneath its root without following links), never through Docker's
//! archive API. Both directions stream through bounded queues to a blocking task, the files'
//! data as slices of the buffers it arrived in: memory does not grow with the transfer.
//!
//! Every wait on the renter is bounded ([`IDLE`]): a renter that stops sending or reading
//! frees its stream, and with it the workspace's files, instead of holding them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gridlease_protocol::LeaseId;
use gridlease_protocol::transfer::{MAX_TRANSFER_FRAME, TransferFrame, workspace_relative};
use gridlease_sandbox::files::{
    DownloadRules, Event, MAX_ENTRIES, Out, TarReader, TransferError, Upload, WorkspaceFs,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::frames::{self, Incoming};

/// Batches of parsed events (one batch per chunk received) queued for the writer.
const PIPE_DEPTH: usize = 8;
/// Pieces of a download's tar stream queued for the renter.
const OUT_DEPTH: usize = 8;
/// Most bytes of skip paths a download takes.
const MAX_SKIP_TOTAL: usize = 64 << 20;
/// Longest a transfer waits for the renter to send the next frame or to take the next one.
pub(super) const IDLE: Duration = Duration::from_secs(120);

async fn send<W: AsyncWrite + Unpin>(w: &mut W, f: &TransferFrame) -> std::io::Result<()> {
    within(frames::send::<_, MAX_TRANSFER_FRAME, _>(w, f)).await
}

/// `io` unless it takes longer than [`IDLE`].
async fn within<T>(io: impl Future<Output = std::io::Result<T>>) -> std::io::Result<T> {
    tokio::time::timeout(IDLE, io).await.unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the renter's side did not move for {} s", IDLE.as_secs()),
        ))
    })
}

fn err(e: impl std::fmt::Display) -> String {
    gridlease_protocol::access::message(e)
}

/// The lease's workspace, opened on the host.
async fn open(dir: &Path, lease: &LeaseId) -> Result<WorkspaceFs, String> {
    gridlease_sandbox::workspace::open_workspace_fs(dir, lease)
        .await
        .map_err(|e| {
            tracing::warn!(lease = %lease, error = %e, "cannot open the workspace for a copy");
            match e {
                gridlease_sandbox::WorkspaceError::Gone { .. } => {
                    "the lease's workspace is gone".to_string()
                }
                other => err(format!("the provider cannot open the workspace: {other}")),
            }
        })
}

/// Receives a tar stream into the workspace (images in `dir`) of `lease` at `dest`; answers
/// `Done` or `Error`. Returns the bytes received.
pub(super) async fn upload<S>(dir: &Path, lease: &LeaseId, dest: &str, io: S) -> u64
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let answer = match receive(dir, lease, dest, &mut rd).await {
        Ok((bytes, entries)) => TransferFrame::Done { bytes, entries },
        Err(e) => TransferFrame::Error(e),
    };
    let bytes = match &answer {
        TransferFrame::Done { bytes, .. } => *bytes,
        _ => 0,
    };
    let _ = send(&mut wr, &answer).await;
    let _ = within(wr.shutdown()).await;
    bytes
}

/// The upload's work: frames in, parsed on this task, applied by a blocking writer.
async fn receive<R: AsyncRead + Unpin>(
    dir: &Path,
    lease: &LeaseId,
    dest: &str,
    rd: &mut R,
) -> Result<(u64, u64), String> {
    let prefix = PathBuf::from(workspace_relative(dest)?);
    let fs = open(dir, lease).await?;
    let (to_writer, mut events) = tokio::sync::mpsc::channel::<Vec<Event>>(PIPE_DEPTH);
    let writer = tokio::task::spawn_blocking(move || {
        let mut up = Upload::new(&fs, &prefix)?;
        while let Some(batch) = events.blocking_recv() {
            for e in batch {
                up.apply(e)?;
            }
        }
        up.finish()
    });
    let mut reader = TarReader::new();
    let mut tally = frames::Tally::default();
    let mut batch = Vec::new();
    let received: Result<u64, String> = loop {
        match within(frames::read_transfer(rd)).await {
            Ok(Some(Incoming::Chunk(b))) => {
                tally.update(&b);
                if let Err(e) = reader.push(b, &mut batch) {
                    break Err(err(e));
                }
                if to_writer.send(std::mem::take(&mut batch)).await.is_err() {
                    // The writer stopped: its error says why.
                    break Ok(tally.bytes());
                }
            }
            Ok(Some(Incoming::Frame(TransferFrame::End { bytes, blake3 }))) => {
                let n = tally.bytes();
                if !tally.matches(bytes, &blake3) {
                    break Err(format!(
                        "the upload arrived damaged ({n} bytes received, {bytes} sent, or the checksum differs); run the same cp again"
                    ));
                }
                break reader.finish().map(|_| n).map_err(err);
            }
            Ok(Some(Incoming::Frame(other))) => {
                break Err(format!("unexpected {other:?} in an upload"));
            }
            Ok(None) => break Err("the renter's stream ended before the upload did".into()),
            Err(e) => break Err(err(e)),
        }
    };
    // The writer's queue ends here; it finishes what it holds.
    drop(to_writer);
    let written = writer
        .await
        .map_err(|e| err(format!("the upload's writer failed: {e}")))?;
    match (received, written) {
        (Ok(n), Ok(entries)) => Ok((n, entries)),
        // The writer's refusal first: it is why the stream was cut short.
        (_, Err(e @ (TransferError::Refused { .. } | TransferError::Full { .. }))) => Err(err(e)),
        (Err(e), _) => Err(e),
        (Ok(_), Err(e)) => Err(err(e)),
    }
}

/// Sends `path` of the workspace (images in `dir`) of `lease` as a tar stream, leaving out
/// what the renter's `Skip` frames name. Returns the bytes sent.
pub(super) async fn download<S>(dir: &Path, lease: &LeaseId, path: &str, io: S) -> u64
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let rel = match workspace_relative(path) {
        Ok(p) => p,
        Err(e) => {
            let _ = send(&mut wr, &TransferFrame::Error(err(e))).await;
            return 0;
        }
    };
    let mut rules = DownloadRules::default();
    let mut skip_bytes = 0usize;
    loop {
        match within(frames::read::<TransferFrame, MAX_TRANSFER_FRAME, _>(
            &mut rd,
        ))
        .await
        {
            Ok(Some(TransferFrame::Skip(paths))) => {
                skip_bytes += paths.iter().map(String::len).sum::<usize>();
                if skip_bytes > MAX_SKIP_TOTAL || rules.skip.len() as u64 > MAX_ENTRIES {
                    let _ = send(
                        &mut wr,
                        &TransferFrame::Error("the skip list is too long".into()),
                    )
                    .await;
                    return 0;
                }
                rules.skip.extend(paths);
            }
            Ok(Some(TransferFrame::SkipSame(files))) => {
                skip_bytes += files.iter().map(|f| f.path.len() + 16).sum::<usize>();
                if skip_bytes > MAX_SKIP_TOTAL
                    || (rules.skip.len() + rules.same.len()) as u64 > MAX_ENTRIES
                {
                    let _ = send(
                        &mut wr,
                        &TransferFrame::Error("the skip list is too long".into()),
                    )
                    .await;
                    return 0;
                }
                rules
                    .same
                    .extend(files.into_iter().map(|f| (f.path, (f.size, f.mtime))));
            }
            Ok(Some(TransferFrame::Go { max_bytes })) => {
                rules.max_bytes = max_bytes;
                break;
            }
            _ => return 0,
        }
    }
    let sent = match send_tree(dir, lease, PathBuf::from(rel), rules, &mut wr).await {
        Ok(n) => n,
        Err(e) => {
            let _ = send(&mut wr, &TransferFrame::Error(e)).await;
            0
        }
    };
    let _ = within(wr.shutdown()).await;
    sent
}

/// The download's work: a blocking walk of the tree hands pieces of tar over a bounded queue;
/// this task frames them. The renter going away (or stalling past [`IDLE`]) drops the queue,
/// which stops the walk.
async fn send_tree<W: AsyncWrite + Unpin>(
    dir: &Path,
    lease: &LeaseId,
    rel: PathBuf,
    rules: DownloadRules,
    wr: &mut W,
) -> Result<u64, String> {
    let fs = open(dir, lease).await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Out>(OUT_DEPTH);
    let walk = tokio::task::spawn_blocking(move || {
        gridlease_sandbox::files::download(&fs, &rel, &rules, &mut |o| tx.blocking_send(o).is_ok())
    });
    let mut chunks = frames::ChunkWriter::new();
    let framed: Result<(), String> = async {
        while let Some(out) = rx.recv().await {
            match out {
                Out::Root { directory } => {
                    send(wr, &TransferFrame::Root { directory })
                        .await
                        .map_err(err)?;
                }
                Out::Tar(piece) => within(chunks.put(wr, &piece)).await.map_err(err)?,
                Out::Skipped { path, reason } => {
                    within(chunks.flush(wr)).await.map_err(err)?;
                    send(wr, &TransferFrame::Skipped { path, reason })
                        .await
                        .map_err(err)?;
                }
            }
        }
        Ok(())
    }
    .await;
    // Whatever happened, the walk stops: its queue is gone.
    drop(rx);
    let walked = walk
        .await
        .map_err(|e| err(format!("the download's reader failed: {e}")))?;
    framed?;
    walked.map_err(err)?;
    let bytes = chunks.bytes();
    let end = within(chunks.finish(wr)).await.map_err(err)?;
    send(wr, &end).await.map_err(err)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use gridlease_protocol::access::frame;
    use gridlease_protocol::transfer::{MAX_SKIP_BYTES, SameFile};
    use tokio::io::AsyncReadExt;

    use super::*;

    /// A renter that names more unchanged files than any download takes, in raw frames, gets
    /// an error frame and a closed stream, with the list's memory bounded.
    #[tokio::test]
    async fn an_endless_list_of_unchanged_files_is_refused() {
        let (mut renter, provider) = tokio::io::duplex(1 << 20);
        let dir = tempfile::tempdir().unwrap();
        let serve = tokio::spawn({
            let dir = dir.path().to_path_buf();
            async move {
                download(
                    &dir,
                    &LeaseId(gridlease_protocol::Digest([3; 32])),
                    "/workspace/ckpt",
                    provider,
                )
                .await
            }
        });
        let path = "x".repeat(200);
        let per_frame = MAX_SKIP_BYTES / (path.len() + 24);
        let files: Vec<SameFile> = (0..per_frame)
            .map(|i| SameFile {
                path: format!("{path}{i}"),
                size: 1,
                mtime: 0,
            })
            .collect();
        let raw = frame::<_, MAX_TRANSFER_FRAME>(&TransferFrame::SkipSame(files)).unwrap();
        let mut sent = 0usize;
        // Past the total the provider takes; it stops reading long before this.
        while sent <= 2 * MAX_SKIP_TOTAL {
            if renter.write_all(&raw).await.is_err() {
                break;
            }
            sent += raw.len();
        }
        assert!(sent <= MAX_SKIP_TOTAL + 2 * raw.len(), "{sent} bytes taken");
        let mut answer = Vec::new();
        let _ = renter.read_to_end(&mut answer).await;
        let err = frame::<_, MAX_TRANSFER_FRAME>(&TransferFrame::Error(
            "the skip list is too long".into(),
        ))
        .unwrap();
        assert_eq!(answer, err);
        assert_eq!(serve.await.unwrap(), 0);
    }
}
