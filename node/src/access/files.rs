//! Provider: `gridlease cp` into and out of a lease's workspace, through Docker's archive API
//! (`gridlease_sandbox::files`). Both directions stream through [`TarFilter`] and bounded
//! queues, the files' data as slices of the buffers it arrived in: memory does not grow with
//! the transfer.

use std::collections::HashSet;

use bytes::Bytes;
use futures::StreamExt;
use gridlease_protocol::transfer::{
    MAX_TRANSFER_FRAME, TransferFrame, WORKSPACE, workspace_relative,
};
use gridlease_sandbox::Sandbox;
use gridlease_sandbox::files::{MAX_ENTRIES, Rules, TarFilter};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::frames::{self, Incoming};

/// Batches of rewritten pieces (one batch per chunk received) queued for Docker.
const PIPE_DEPTH: usize = 8;
/// Most bytes of skip paths a download takes.
const MAX_SKIP_TOTAL: usize = 64 << 20;

async fn send<W: AsyncWrite + Unpin>(w: &mut W, f: &TransferFrame) -> std::io::Result<()> {
    frames::send::<_, MAX_TRANSFER_FRAME, _>(w, f).await
}

fn err(e: impl std::fmt::Display) -> String {
    gridlease_protocol::access::message(e)
}

/// Receives a tar stream into the workspace at `dest`; answers `Done` or `Error`. Returns
/// the bytes received.
pub(super) async fn upload<S>(sb: &Sandbox, container: &str, dest: &str, io: S) -> u64
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let prefix = match workspace_relative(dest) {
        Ok(p) => p,
        Err(e) => {
            let _ = send(&mut wr, &TransferFrame::Error(err(e))).await;
            return 0;
        }
    };
    let rules = Rules {
        prefix,
        ..Rules::default()
    };
    // Chunks are rewritten as they come, and what the filter gives (rebuilt headers, slices
    // of the chunks) goes to Docker's request body without a copy, a few batches at a time.
    let (to_docker, docker_in) = tokio::sync::mpsc::channel::<Vec<Bytes>>(PIPE_DEPTH);
    let body = futures::stream::unfold(docker_in, |mut rx| async move {
        rx.recv().await.map(|batch| (batch, rx))
    })
    .flat_map(|batch| futures::stream::iter(batch.into_iter().map(Ok::<_, std::io::Error>)));
    let receive = async move {
        let mut filter = TarFilter::new(rules);
        let mut out = Vec::new();
        let mut tally = frames::Tally::default();
        loop {
            match frames::read_transfer(&mut rd).await {
                Ok(Some(Incoming::Chunk(b))) => {
                    tally.update(&b);
                    filter.push(b, &mut out).map_err(err)?;
                    // Docker stopping gives its own error.
                    let _ = to_docker.send(std::mem::take(&mut out)).await;
                }
                Ok(Some(Incoming::Frame(TransferFrame::End { bytes, blake3 }))) => {
                    let n = tally.bytes();
                    if !tally.matches(bytes, &blake3) {
                        return Err(format!(
                            "the upload arrived damaged ({n} bytes received, {bytes} sent, or the checksum differs); nothing is reported copied: run the same cp again"
                        ));
                    }
                    let entries = filter.entries();
                    filter.finish(&mut out).map_err(err)?;
                    let _ = to_docker.send(out).await;
                    // Docker's body ends here.
                    drop(to_docker);
                    return Ok((n, entries));
                }
                Ok(Some(Incoming::Frame(other))) => {
                    return Err(format!("unexpected {other:?} in an upload"));
                }
                Ok(None) => return Err("the renter's stream ended before the upload did".into()),
                Err(e) => return Err(err(e)),
            }
        }
    };
    let docker = async {
        sb.put_workspace_archive(container, body)
            .await
            .map_err(|e| err(format!("extracting into the workspace failed: {e}")))
    };
    let answer = match tokio::try_join!(receive, docker) {
        Ok(((bytes, entries), ())) => TransferFrame::Done { bytes, entries },
        Err(e) => TransferFrame::Error(e),
    };
    let bytes = match &answer {
        TransferFrame::Done { bytes, .. } => *bytes,
        _ => 0,
    };
    let _ = send(&mut wr, &answer).await;
    let _ = wr.shutdown().await;
    bytes
}

/// Sends the `Root` frame once (a directory unless `root` says otherwise), then `out`'s pieces
/// as chunks.
async fn emit<W: AsyncWrite + Unpin>(
    wr: &mut W,
    chunks: &mut frames::ChunkWriter,
    out: &mut Vec<Bytes>,
    root_sent: &mut bool,
    root: Option<bool>,
) -> Result<(), String> {
    if !*root_sent {
        let directory = root.unwrap_or(true);
        send(wr, &TransferFrame::Root { directory })
            .await
            .map_err(err)?;
        *root_sent = true;
    }
    for piece in out.drain(..) {
        chunks.put(wr, &piece).await.map_err(err)?;
    }
    Ok(())
}

/// Sends `path` of the workspace as a tar stream, leaving out what the renter's `Skip`
/// frames name. Returns the bytes sent.
pub(super) async fn download<S>(sb: &Sandbox, container: &str, path: &str, io: S) -> u64
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
    let mut skip = HashSet::new();
    let mut skip_bytes = 0usize;
    loop {
        match frames::read::<TransferFrame, MAX_TRANSFER_FRAME, _>(&mut rd).await {
            Ok(Some(TransferFrame::Skip(paths))) => {
                skip_bytes += paths.iter().map(String::len).sum::<usize>();
                if skip_bytes > MAX_SKIP_TOTAL || skip.len() as u64 > MAX_ENTRIES {
                    let _ = send(
                        &mut wr,
                        &TransferFrame::Error("the skip list is too long".into()),
                    )
                    .await;
                    return 0;
                }
                skip.extend(paths);
            }
            Ok(Some(TransferFrame::Go)) => break,
            _ => return 0,
        }
    }
    let full = if rel.is_empty() {
        WORKSPACE.to_string()
    } else {
        format!("{WORKSPACE}/{rel}")
    };
    let rules = Rules {
        strip_first: true,
        skip,
        skip_others: true,
        ..Rules::default()
    };
    let docker_error = |text: String| {
        if text.contains("No such container:path") || text.contains("Could not find the file") {
            format!("{full} does not exist in the lease's container")
        } else {
            err(format!("reading {full}: {text}"))
        }
    };
    // Docker's pieces go through the filter and straight into chunk frames: one copy, into
    // the frame being filled.
    let send_all = async {
        let mut from_docker = std::pin::pin!(sb.get_archive(container, &full));
        let mut filter = TarFilter::new(rules);
        let mut out = Vec::new();
        let mut chunks = frames::ChunkWriter::new();
        let mut root_sent = false;
        while let Some(piece) = from_docker.next().await {
            let piece = piece.map_err(|e| docker_error(e.to_string()))?;
            filter
                .push(piece, &mut out)
                .map_err(|e| docker_error(e.to_string()))?;
            // The root's kind is known once the first entry was read; it goes first.
            if filter.root_is_dir().is_some() || !out.is_empty() {
                emit(
                    &mut wr,
                    &mut chunks,
                    &mut out,
                    &mut root_sent,
                    filter.root_is_dir(),
                )
                .await?;
            }
        }
        let root = filter.root_is_dir();
        // An archive that ends inside an entry is refused here.
        filter
            .finish(&mut out)
            .map_err(|e| docker_error(e.to_string()))?;
        emit(&mut wr, &mut chunks, &mut out, &mut root_sent, root).await?;
        let bytes = chunks.bytes();
        let end = chunks.finish(&mut wr).await.map_err(err)?;
        send(&mut wr, &end).await.map_err(err)?;
        Ok::<_, String>(bytes)
    };
    let sent = match send_all.await {
        Ok(n) => n,
        Err(e) => {
            let _ = send(&mut wr, &TransferFrame::Error(e)).await;
            0
        }
    };
    let _ = wr.shutdown().await;
    sent
}
