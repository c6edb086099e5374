//! Provider: an SFTP version 3 server (draft-ietf-secsh-filexfer-02) on a lease's
//! `/workspace` (`AccessRequest::Sftp`), for the renter's `gridlease ssh-proxy`, which maps an
//! SSH client's `sftp` subsystem (OpenSSH `sftp`, and `scp`, which speaks SFTP) onto the
//! stream. The packets are decoded by `russh_sftp::protocol`; the loop, its bounds and every
//! file operation are this node's own.
//!
//! The client sees the container's paths: `/workspace` is its home, relative paths start
//! there, and any other absolute path is refused ([`paths::OUTSIDE`]). The files are read and
//! written by the node on the workspace's filesystem (`gridlease_sandbox::files`, the same
//! rules as `gridlease cp`): every name resolved beneath its root, no symbolic link ever
//! followed (STAT of a link fails and says so; LSTAT, READLINK, REMOVE and RENAME act on the
//! link itself), files and directories made belong to the tenant with permission bits only
//! (no setuid, setgid or sticky), only regular files are opened, a symlink made must point
//! inside the workspace, and an owner change is refused.
//!
//! Bounds: a packet longer than [`MAX_PACKET`] ends the session before anything is allocated
//! for it; a read returns at most [`session::MAX_READ`] bytes; at most
//! [`session::MAX_HANDLES`] handles are open at once; a renter that sends nothing for
//! [`SESSION_IDLE`], or does not take a reply within [`SEND_WITHIN`], loses the session, as
//! does everyone when the lease stops. Requests are answered one at a time, in order, each
//! one's file work on a blocking thread.
//!
//! Supported: OPEN (READ, WRITE, APPEND, CREAT, TRUNC, EXCL), CLOSE, READ, WRITE, LSTAT,
//! STAT, FSTAT, SETSTAT and FSETSTAT (size, permissions, times), OPENDIR, READDIR (with `ls
//! -l` long names, times in UTC), REMOVE, MKDIR, RMDIR, REALPATH (lexical), RENAME (fails when
//! the target exists), READLINK, SYMLINK (OpenSSH's argument order), and the extensions
//! `posix-rename@openssh.com`, `fsync@openssh.com` and `limits@openssh.com`. Not supported:
//! other extensions (`statvfs@openssh.com`, `hardlink@openssh.com`, ...: OP_UNSUPPORTED),
//! FSTAT and FSETSTAT on directory handles, and names that are not UTF-8 (they are listed
//! with replacement characters and cannot be opened by those names).

mod paths;
mod session;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use gridlease_protocol::LeaseId;
use gridlease_sandbox::files::WorkspaceFs;
use russh_sftp::protocol::{Packet, StatusCode, VERSION, Version};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use session::MAX_PACKET;
use session::{Session, status};

/// Longest a session waits for the renter's next packet.
pub(super) const SESSION_IDLE: Duration = Duration::from_secs(600);
/// Longest a reply waits for the renter to take it.
pub(super) const SEND_WITHIN: Duration = super::files::IDLE;

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
    match gridlease_sandbox::workspace::open_workspace_fs(dir, lease).await {
        Ok(fs) => serve_fs(fs, io, ended).await,
        Err(e) => {
            tracing::warn!(lease = %lease, error = %e, "cannot open the workspace for sftp");
            Tally {
                end: format!("the provider cannot open the workspace: {e}"),
                ..Tally::default()
            }
        }
    }
}

/// A client's packet, decoded.
enum Decoded {
    /// A request for the session.
    Request(Packet),
    /// Not answerable: this status is the reply.
    Refused(Packet),
}

/// Decodes one packet body (type byte onwards). A body too short to carry a request id is
/// an error that ends the session; any other undecodable one is refused with a status.
fn decode(body: Bytes) -> Result<Decoded, String> {
    let kind = body.first().copied().unwrap_or(0);
    let id = body
        .get(1..5)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_be_bytes);
    let mut rest = body;
    match (Packet::try_from(&mut rest), id) {
        (Ok(p @ Packet::Init(_)), _) => Ok(Decoded::Request(p)),
        (Ok(p), Some(id)) if p.get_request_id() != id => Ok(Decoded::Refused(status(
            id,
            StatusCode::BadMessage,
            "not a request",
        ))),
        (Ok(p), _) => Ok(Decoded::Request(p)),
        (Err(e), Some(id)) => {
            let known = matches!(kind, 1..=20 | 101..=105 | 200 | 201);
            let (code, message) = if known {
                (StatusCode::BadMessage, format!("a malformed packet: {e}"))
            } else {
                (
                    StatusCode::OpUnsupported,
                    format!("unknown packet type {kind}"),
                )
            };
            Ok(Decoded::Refused(status(id, code, message)))
        }
        (Err(e), None) => Err(format!("an undecodable packet: {e}")),
    }
}

/// The next packet's body (type byte onwards); `None` when the renter closed the stream.
async fn read_packet<R: AsyncRead + Unpin>(rd: &mut R) -> Result<Option<Bytes>, String> {
    let mut len = [0u8; 4];
    match rd.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(format!("reading from the renter failed: {e}")),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > MAX_PACKET {
        return Err(format!(
            "the renter sent a packet of {len} bytes (at most {MAX_PACKET})"
        ));
    }
    let mut body = vec![0u8; len];
    rd.read_exact(&mut body)
        .await
        .map_err(|e| format!("reading from the renter failed: {e}"))?;
    Ok(Some(Bytes::from(body)))
}

/// The reply to the first packet, which must be INIT.
fn version(body: Bytes) -> Result<Packet, String> {
    let mut rest = body;
    match Packet::try_from(&mut rest) {
        Ok(Packet::Init(_)) => {
            let extensions: HashMap<String, String> = [
                "posix-rename@openssh.com",
                "fsync@openssh.com",
                "limits@openssh.com",
            ]
            .into_iter()
            .map(|e| (e.to_string(), "1".to_string()))
            .collect();
            Ok(Packet::Version(Version {
                version: VERSION,
                extensions,
            }))
        }
        _ => Err("the renter's first packet was not SSH_FXP_INIT".into()),
    }
}

/// Answers one decoded packet on a blocking thread; the session moves there and back.
async fn answer(session: &mut Option<Session>, packet: Packet) -> Result<Packet, String> {
    let mut s = session
        .take()
        .ok_or_else(|| "the session was lost".to_string())?;
    let (s, reply) = tokio::task::spawn_blocking(move || {
        let reply = s.answer(packet);
        (s, reply)
    })
    .await
    .map_err(|e| format!("a file operation failed: {e}"))?;
    *session = Some(s);
    Ok(reply)
}

/// Serves SFTP on `io` for the workspace `fs` (see [`serve`]).
async fn serve_fs<S>(fs: WorkspaceFs, io: S, ended: impl Future<Output = ()> + Send) -> Tally
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let mut ended = std::pin::pin!(ended);
    let mut session = Some(Session::new(fs));
    let mut tally = Tally::default();
    let mut started = false;
    let end: String = loop {
        let body = tokio::select! {
            () = &mut ended => break "the lease stopped".into(),
            got = tokio::time::timeout(SESSION_IDLE, read_packet(&mut rd)) => match got {
                Err(_) => break format!("the renter sent nothing for {} s", SESSION_IDLE.as_secs()),
                Ok(Err(e)) => break e,
                Ok(Ok(None)) => break "the renter closed the session".into(),
                Ok(Ok(Some(body))) => body,
            },
        };
        let reply = if started {
            match decode(body) {
                Ok(Decoded::Request(p)) => match answer(&mut session, p).await {
                    Ok(reply) => reply,
                    Err(e) => break e,
                },
                Ok(Decoded::Refused(reply)) => reply,
                Err(e) => break e,
            }
        } else {
            match version(body) {
                Ok(reply) => {
                    started = true;
                    reply
                }
                Err(e) => break e,
            }
        };
        tally.requests += 1;
        let bytes = match Bytes::try_from(reply) {
            Ok(b) => b,
            Err(e) => break format!("a reply could not be encoded: {e}"),
        };
        let sent = async {
            wr.write_all(&bytes).await?;
            wr.flush().await
        };
        tokio::select! {
            () = &mut ended => break "the lease stopped".into(),
            sent = tokio::time::timeout(SEND_WITHIN, sent) => match sent {
                Ok(Ok(())) => {}
                Ok(Err(e)) => break format!("writing to the renter failed: {e}"),
                Err(_) => break format!("the renter took no reply for {} s", SEND_WITHIN.as_secs()),
            },
        }
    };
    tally.end = end;
    if let Some(s) = session {
        tally.bytes_read = s.bytes_read;
        tally.bytes_written = s.bytes_written;
        // Closing files may wait on the disk: not on the runtime.
        drop(tokio::task::spawn_blocking(move || drop(s)));
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), wr.shutdown()).await;
    tally
}
