//! Serving a lease's output: every log request is answered from the file by the task that
//! received it ([`read_chunk`]), for the provider's peers ([`serve_renter`]) and its own
//! control API ([`logs_from_file`]).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use gridlease_protocol::{LeaseId, PeerId};

use super::super::view::LeaseView;
use super::super::wire::{LogChunk, MAX_LOG_CHUNK, SessionResponse};
use super::super::{Ctx, LeaseError};
use crate::store::{Role, StoredLease};

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
pub(super) fn read_cached(
    path: &Path,
    offset: u64,
    max: u32,
) -> Option<std::io::Result<(u64, Vec<u8>, u64)>> {
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
pub(super) fn read_at(path: &Path, offset: u64, max: u32) -> std::io::Result<(u64, Vec<u8>, u64)> {
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
