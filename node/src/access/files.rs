//! Provider: `gridlease cp` into and out of a lease's workspace, through Docker's archive API
//! (`gridlease_sandbox::files`). Both directions stream through fixed pipes: memory does not
//! grow with the transfer.

use std::collections::HashSet;

use futures::StreamExt;
use gridlease_protocol::transfer::{
    MAX_CHUNK, MAX_TRANSFER_FRAME, TransferFrame, WORKSPACE, workspace_relative,
};
use gridlease_sandbox::Sandbox;
use gridlease_sandbox::files::{MAX_ENTRIES, Rules, rewrite};
use sha2::Digest as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::frames::{self, Incoming};

/// Pipe buffer between the stages of a transfer.
const PIPE: usize = 256 * 1024;
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
    // Chunks go to the rewriter as they came (no copy), a few at a time.
    let (to_rewrite, rewrite_in) = frames::chunk_pipe(8);
    let (rewrite_out, docker_in) = tokio::io::duplex(PIPE);
    let body = tokio_util::io::ReaderStream::with_capacity(docker_in, PIPE);
    let receive = async move {
        let mut sha = sha2::Sha256::new();
        let mut n = 0u64;
        loop {
            match frames::read_transfer(&mut rd).await {
                Ok(Some(Incoming::Chunk(b))) => {
                    sha.update(&b);
                    n += b.len() as u64;
                    // A rewriter that stopped gives its own error; the stream is still
                    // read to its end and checked.
                    let _ = to_rewrite.send(Ok(b)).await;
                }
                Ok(Some(Incoming::Frame(TransferFrame::End { bytes, sha256 }))) => {
                    drop(to_rewrite);
                    let got: [u8; 32] = sha.finalize().into();
                    if bytes != n || sha256 != got {
                        return Err(format!(
                            "the upload arrived damaged ({n} bytes received, {bytes} sent, or the SHA-256 differs); nothing is reported copied: run the same cp again"
                        ));
                    }
                    return Ok(n);
                }
                Ok(Some(Incoming::Frame(other))) => {
                    return Err(format!("unexpected {other:?} in an upload"));
                }
                Ok(None) => return Err("the renter's stream ended before the upload did".into()),
                Err(e) => return Err(err(e)),
            }
        }
    };
    let rules = Rules {
        prefix,
        ..Rules::default()
    };
    let extract = async {
        let (r, mut out) = rewrite(rewrite_in, rewrite_out, &rules, None)
            .await
            .map_err(err)?;
        // Docker's body ends here.
        out.shutdown().await.map_err(err)?;
        Ok::<_, String>(r.entries)
    };
    let docker = async {
        sb.put_workspace_archive(container, body.map(|r| r))
            .await
            .map_err(|e| err(format!("extracting into the workspace failed: {e}")))
    };
    let answer = match tokio::try_join!(receive, extract, docker) {
        Ok((bytes, entries, ())) => TransferFrame::Done { bytes, entries },
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
    let stream = sb
        .get_archive(container, &full)
        .map(|r| r.map_err(std::io::Error::other));
    let from_docker = tokio_util::io::StreamReader::new(stream);
    let (filtered_in, mut filtered_out) = tokio::io::duplex(PIPE);
    let rules = Rules {
        strip_first: true,
        skip,
        skip_others: true,
        ..Rules::default()
    };
    let (root_tx, root_rx) = tokio::sync::oneshot::channel::<bool>();
    let filter = async {
        // The root's kind is known once the first entry was read; the sender waits for it.
        let r = match rewrite(from_docker, filtered_in, &rules, Some(root_tx)).await {
            Ok((r, mut out)) => out.shutdown().await.map(|()| r).map_err(Into::into),
            Err(e) => Err(e),
        };
        r.map_err(|e: gridlease_sandbox::files::SanitizeError| {
            let text = e.to_string();
            if text.contains("No such container:path") || text.contains("Could not find the file") {
                format!("{full} does not exist in the lease's container")
            } else {
                err(format!("reading {full}: {text}"))
            }
        })
    };
    let sender = async {
        let directory = root_rx.await.unwrap_or(true);
        send(&mut wr, &TransferFrame::Root { directory })
            .await
            .map_err(err)?;
        let mut sha = sha2::Sha256::new();
        let mut n = 0u64;
        let mut buf = vec![0u8; MAX_CHUNK];
        loop {
            let k = filtered_out.read(&mut buf).await.map_err(err)?;
            if k == 0 {
                break;
            }
            sha.update(&buf[..k]);
            n += k as u64;
            frames::write_chunk(&mut wr, &buf[..k]).await.map_err(err)?;
        }
        send(
            &mut wr,
            &TransferFrame::End {
                bytes: n,
                sha256: sha.finalize().into(),
            },
        )
        .await
        .map_err(err)?;
        Ok::<_, String>(n)
    };
    let sent = match tokio::try_join!(filter, sender) {
        Ok((_, n)) => n,
        Err(e) => {
            let _ = send(&mut wr, &TransferFrame::Error(e)).await;
            0
        }
    };
    let _ = wr.shutdown().await;
    sent
}
