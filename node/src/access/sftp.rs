//! Provider: an SFTP version 3 server on a lease's `/workspace` (`AccessRequest::Sftp`).
//! Stub: the packet loop and the file operations land next.

use std::path::Path;

use gridlease_protocol::LeaseId;
use tokio::io::{AsyncRead, AsyncWrite};

/// What one SFTP session did, for the provider's log.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Requests answered.
    pub requests: u64,
    /// File bytes read (sent to the renter).
    pub bytes_read: u64,
    /// File bytes written (received from the renter).
    pub bytes_written: u64,
    /// Why the session ended.
    pub end: String,
}

/// Serves SFTP on `io` for the workspace of `lease` (images in `dir`) until the renter closes
/// the stream, a bound is broken, or `ended` resolves (the lease stopped running).
pub(super) async fn serve<S>(
    dir: &Path,
    lease: &LeaseId,
    io: S,
    ended: impl Future<Output = ()> + Send,
) -> Tally
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let _ = (dir, lease, io, ended);
    Tally {
        end: "not implemented yet".into(),
        ..Tally::default()
    }
}
