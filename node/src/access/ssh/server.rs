//! The SSH server of a lease, run by the renter's node on a connection from `gridlease
//! ssh-proxy` (the user's OpenSSH client runs the proxy as its `ProxyCommand`). Every SSH
//! channel becomes one access stream of the lease, opened by this node exactly as `gridlease
//! shell`, `exec`, `forward` and `cp` open theirs (so the provider authorizes and counts it the
//! same way: only the lease's renter, only while the lease runs):
//!
//! | SSH                                   | access stream                                   |
//! |---------------------------------------|-------------------------------------------------|
//! | `pty-req` + `shell`                   | exec with a terminal: the container's shell     |
//! | `shell` without a pty                 | exec with pipes: the container's shell          |
//! | `exec CMD` (`pty-req` first: `ssh -t`)| exec of `/bin/sh -c CMD`, exit status, stdin EOF|
//! | `window-change`                       | a resize of the remote terminal                 |
//! | `subsystem sftp`                      | an SFTP session on `/workspace` (scp, sftp)     |
//! | `direct-tcpip` to a loopback address  | a forward to that port of the container         |
//!
//! Refused: `direct-tcpip` to any other host (the container's own ports only, as `forward`),
//! remote forwarding (`ssh -R`), agent and X11 forwarding, other subsystems. Ctrl-C and the
//! other keys a terminal turns into signals travel as keys to the remote terminal; SSH
//! `signal` requests (which OpenSSH's client does not send) are ignored. Why a session channel
//! failed reaches the user as the channel's stderr (and exit status 255); a refused channel
//! open carries only SSH's reason code, so why is in this node's log.
//!
//! Authentication: the `none` method is accepted. The connection comes from the node's control
//! socket, which only this node's user can open: that is what authorizes (see the parent module
//! for the host key).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gridlease_protocol::LeaseId;
use gridlease_protocol::access::AccessRequest;
use gridlease_protocol::access::{
    ExecInput, ExecOutput, MAX_ENV, MAX_EXEC_CHUNK, MAX_EXEC_FRAME, TermSize,
};
use russh::server::{Auth, ChannelOpenHandle, Handler, Msg, Session};
use russh::{Channel, ChannelId, ChannelMsg, ChannelOpenFailure, ChannelWriteHalf};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt};

use crate::access::{OpenError, frames};
use crate::lease::LeaseService;
use crate::net::Client;

/// Most session channels (shells, commands, SFTP) open at once.
pub const MAX_SESSIONS: usize = 64;
/// Most forwarded connections (`direct-tcpip`) open at once.
pub const MAX_FORWARDS: usize = 256;
/// The server's channel window (how much a client may send ahead, per channel).
const WINDOW: u32 = 8 << 20;
/// The largest packet the client may send.
const MAX_PACKET: u32 = 64 << 10;
/// Exit status reported when the command's status is unknown (the connection to the provider
/// was lost, or it refused): what OpenSSH's client itself uses for its own failures.
const EXIT_UNKNOWN: u32 = 255;
/// Addresses of a `direct-tcpip` request that mean the container itself.
const LOOPBACK: [&str; 5] = ["localhost", "127.0.0.1", "::1", "0.0.0.0", "ip6-localhost"];

/// The ciphers offered, the client's preference choosing: AES-GCM first where the entry
/// asks for it (`config::CIPHERS`: AES-NI makes it the cheapest on x86), ChaCha20 for clients
/// that want only that.
const CIPHERS: &[russh::cipher::Name] = &[
    russh::cipher::AES_128_GCM,
    russh::cipher::AES_256_GCM,
    russh::cipher::CHACHA20_POLY1305,
    russh::cipher::AES_256_CTR,
    russh::cipher::AES_128_CTR,
];

/// The server's configuration with the lease's host key.
pub fn server_config(key: russh::keys::PrivateKey) -> russh::server::Config {
    russh::server::Config {
        server_id: russh::SshId::Standard(
            concat!("SSH-2.0-gridlease_", env!("CARGO_PKG_VERSION")).into(),
        ),
        methods: russh::MethodSet::from(&[russh::MethodKind::None][..]),
        auth_rejection_time: Duration::ZERO,
        auth_rejection_time_initial: Some(Duration::ZERO),
        keys: vec![key],
        window_size: WINDOW,
        maximum_packet_size: MAX_PACKET,
        // The client keeps the connection as long as it wants: an idle shell is fine.
        inactivity_timeout: None,
        preferred: russh::Preferred {
            cipher: std::borrow::Cow::Borrowed(CIPHERS),
            ..russh::Preferred::DEFAULT
        },
        ..Default::default()
    }
}

/// Where a lease's SSH channels open their access streams: this node's network and leases.
#[derive(Clone)]
pub struct Opener {
    /// The network actor (streams to the provider).
    pub client: Client,
    /// The leases (which provider serves a lease).
    pub leases: LeaseService,
}

impl Opener {
    /// Opens an access stream once (an exec: a command is not started twice).
    async fn open(&self, req: AccessRequest) -> Result<Compat<libp2p::Stream>, OpenError> {
        Ok(crate::access::open(&self.client, &self.leases, req)
            .await?
            .compat())
    }

    /// Opens an access stream, trying again while the provider cannot be reached.
    async fn open_retrying(&self, req: AccessRequest) -> Result<Compat<libp2p::Stream>, OpenError> {
        Ok(
            crate::access::open_retrying(&self.client, &self.leases, req)
                .await?
                .compat(),
        )
    }
}

/// The read buffer in front of the connection: russh reads each packet with two exact reads,
/// so without it every 32 KiB packet costs two or more system calls.
const READ_BUFFER: usize = 256 * 1024;

/// Runs the SSH server on `io` for `lease` until the client disconnects.
///
/// The server writes nothing before the client's first bytes: `ssh-proxy` may still be reading
/// the HTTP 101 that switched this connection, and must find no SSH byte after it when it
/// hands the bare socket to `ssh` (OpenSSH's client sends its identification first).
pub async fn serve<S>(
    opener: Opener,
    lease: LeaseId,
    key: russh::keys::PrivateKey,
    io: S,
) -> anyhow::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut io = tokio::io::BufReader::with_capacity(READ_BUFFER, io);
    if io.fill_buf().await?.is_empty() {
        return Ok(());
    }
    let handler = Server {
        opener,
        lease,
        pending: HashMap::new(),
        sessions: Arc::new(Semaphore::new(MAX_SESSIONS)),
        forwards: Arc::new(Semaphore::new(MAX_FORWARDS)),
    };
    let running = russh::server::run_stream(Arc::new(server_config(key)), io, handler)
        .await
        .map_err(|e| anyhow::anyhow!("ssh: {e}"))?;
    match running.await {
        Ok(()) => Ok(()),
        // The client went away: its own message says why.
        Err(russh::Error::Disconnect | russh::Error::HUP | russh::Error::IO(_)) => Ok(()),
        Err(e) => Err(anyhow::anyhow!("ssh: {e}")),
    }
}

/// A connection whose first bytes were already read: they are read again first.
pub struct Prefixed<S> {
    first: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    /// `inner`, whose bytes `first` were read before.
    pub fn new(first: Vec<u8>, inner: S) -> Self {
        Self {
            first,
            at: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = &mut *self;
        if this.at < this.first.len() {
            let n = (this.first.len() - this.at).min(buf.remaining());
            buf.put_slice(&this.first[this.at..this.at + n]);
            this.at += n;
            if this.at == this.first.len() {
                this.first = Vec::new();
                this.at = 0;
            }
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A session channel opened and not yet started (no shell, exec or subsystem yet).
struct Pending {
    channel: Channel<Msg>,
    pty: Option<TermSize>,
    env: Vec<String>,
}

/// What a session channel runs.
enum Start {
    Shell,
    Exec(String),
    Sftp,
}

struct Server {
    opener: Opener,
    lease: LeaseId,
    pending: HashMap<ChannelId, Pending>,
    sessions: Arc<Semaphore>,
    forwards: Arc<Semaphore>,
}

/// A line for this node's log about a lease's SSH connection (what the client is told is
/// only SSH's reason code).
fn note(lease: LeaseId, message: &str) {
    tracing::info!(lease = %lease.short(), "ssh: {message}");
}

impl Server {
    fn start(
        &mut self,
        id: ChannelId,
        what: Start,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        let Some(p) = self.pending.remove(&id) else {
            return session.channel_failure(id);
        };
        let Ok(permit) = self.sessions.clone().try_acquire_owned() else {
            note(
                self.lease,
                &format!("more than {MAX_SESSIONS} sessions at once; refused one"),
            );
            return session.channel_failure(id);
        };
        session.channel_success(id)?;
        let opener = self.opener.clone();
        let lease = self.lease;
        tokio::spawn(async move {
            match what {
                Start::Sftp => sftp(&opener, lease, p.channel).await,
                Start::Shell => exec(&opener, lease, p.channel, Vec::new(), p.env, p.pty).await,
                Start::Exec(cmd) => {
                    let argv = vec!["/bin/sh".to_string(), "-c".to_string(), cmd];
                    exec(&opener, lease, p.channel, argv, p.env, p.pty).await;
                }
            }
            drop(permit);
        });
        Ok(())
    }
}

impl Handler for Server {
    type Error = russh::Error;

    async fn auth_none(&mut self, _user: &str) -> Result<Auth, Self::Error> {
        Ok(Auth::Accept)
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.pending.len() >= MAX_SESSIONS {
            reply.reject(ChannelOpenFailure::ResourceShortage).await;
            return Ok(());
        }
        reply.accept().await;
        self.pending.insert(
            channel.id(),
            Pending {
                channel,
                pty: None,
                env: Vec::new(),
            },
        );
        Ok(())
    }

    async fn channel_close(
        &mut self,
        channel: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.pending.remove(&channel);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn pty_request(
        &mut self,
        channel: ChannelId,
        term: &str,
        col_width: u32,
        row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(p) = self.pending.get_mut(&channel) else {
            return session.channel_failure(channel);
        };
        p.pty = Some(term_size(col_width, row_height));
        let term = if valid_value(term) {
            term
        } else {
            "xterm-256color"
        };
        p.env.retain(|e| !e.starts_with("TERM="));
        p.env.push(format!("TERM={term}"));
        session.channel_success(channel)
    }

    async fn env_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let ok = valid_name(name) && valid_value(value);
        match self.pending.get_mut(&channel) {
            Some(p) if ok && p.env.len() < MAX_ENV - 1 => {
                p.env
                    .retain(|e| e.split_once('=').is_none_or(|(n, _)| n != name));
                p.env.push(format!("{name}={value}"));
                session.channel_success(channel)
            }
            _ => session.channel_failure(channel),
        }
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.start(channel, Start::Shell, session)
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        match std::str::from_utf8(data) {
            Ok(cmd) if !cmd.contains('\0') => {
                self.start(channel, Start::Exec(cmd.to_string()), session)
            }
            _ => {
                note(self.lease, "a command that is not UTF-8 text; refused");
                session.channel_failure(channel)
            }
        }
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if name == "sftp" {
            self.start(channel, Start::Sftp, session)
        } else {
            note(
                self.lease,
                &format!("subsystem {name:?} is not offered (only sftp)"),
            );
            session.channel_failure(channel)
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host: &str,
        port: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let port = match u16::try_from(port) {
            Ok(p) if p != 0 && LOOPBACK.contains(&host) => p,
            _ => {
                note(
                    self.lease,
                    &format!(
                        "forwarding reaches only the container's own ports (localhost:PORT), not {host}:{port}"
                    ),
                );
                reply
                    .reject(ChannelOpenFailure::AdministrativelyProhibited)
                    .await;
                return Ok(());
            }
        };
        let Ok(permit) = self.forwards.clone().try_acquire_owned() else {
            note(
                self.lease,
                &format!("more than {MAX_FORWARDS} forwarded connections at once; refused one"),
            );
            reply.reject(ChannelOpenFailure::ResourceShortage).await;
            return Ok(());
        };
        let opener = self.opener.clone();
        let lease_id = self.lease;
        tokio::spawn(async move {
            let req = AccessRequest::Forward { lease_id, port };
            match opener.open_retrying(req).await {
                Ok(remote) => {
                    reply.accept().await;
                    carry(channel.into_stream(), remote).await;
                }
                Err(e) => {
                    note(lease_id, &format!("forward to port {port}: {e}"));
                    reply.reject(ChannelOpenFailure::ConnectFailed).await;
                }
            }
            drop(permit);
        });
        Ok(())
    }
}

/// A forwarded connection: the channel's bytes onto the access stream and back, each
/// direction's end passed on as a half-close, until both ended.
///
/// Towards the provider, what the channel already holds is gathered before each write: SSH
/// hands data over a packet at a time (OpenSSH sends 16 to 32 KiB each), and every write to a
/// libp2p stream is a frame and a hand-over to its connection's task, so a write per packet
/// costs several times what one write per read of a TCP socket does (`forward`'s path).
async fn carry<L, R>(local: L, remote: R)
where
    L: AsyncRead + AsyncWrite + Unpin,
    R: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    let (mut from_client, mut to_client) = tokio::io::split(local);
    let (from_remote, mut to_remote) = tokio::io::split(remote);
    let up = async {
        let _ = gather_copy(&mut from_client, &mut to_remote).await;
        let _ = to_remote.shutdown().await;
    };
    let down = async {
        let mut from_remote =
            tokio::io::BufReader::with_capacity(crate::access::SPLICE_BUFFER, from_remote);
        let _ = tokio::io::copy_buf(&mut from_remote, &mut to_client).await;
        let _ = to_client.shutdown().await;
    };
    tokio::join!(up, down);
}

/// Copies `from` to `to` until `from` ends, each write carrying everything `from` had ready
/// (up to [`crate::access::SPLICE_BUFFER`] bytes) rather than one read's worth.
async fn gather_copy<F, T>(from: &mut F, to: &mut T) -> std::io::Result<u64>
where
    F: AsyncRead + Unpin,
    T: AsyncWrite + Unpin,
{
    use futures::FutureExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; crate::access::SPLICE_BUFFER];
    let mut total = 0u64;
    loop {
        let mut n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(total);
        }
        let mut ended = false;
        while n < buf.len() {
            match from.read(&mut buf[n..]).now_or_never() {
                Some(Ok(0)) => {
                    ended = true;
                    break;
                }
                Some(Ok(m)) => n += m,
                Some(Err(e)) => return Err(e),
                None => break,
            }
        }
        to.write_all(&buf[..n]).await?;
        to.flush().await?;
        total += n as u64;
        if ended {
            return Ok(total);
        }
    }
}

/// An SSH terminal size as the access protocol's (at least 1x1).
fn term_size(cols: u32, rows: u32) -> TermSize {
    let clamp = |v: u32| u16::try_from(v).unwrap_or(u16::MAX).max(1);
    TermSize {
        cols: clamp(cols),
        rows: clamp(rows),
    }
}

/// A name the access protocol takes for an environment variable.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn valid_value(value: &str) -> bool {
    value.len() <= 4096 && !value.contains('\0')
}

/// Tells the client why its channel failed (on the channel's stderr, with exit status 255) and
/// closes it.
async fn fail(wr: &ChannelWriteHalf<Msg>, message: &str) {
    let line = format!("gridlease: {message}\n");
    let _ = wr.extended_data_bytes(1, line.into_bytes()).await;
    let _ = wr.exit_status(EXIT_UNKNOWN).await;
    let _ = wr.eof().await;
    let _ = wr.close().await;
}

/// A shell or a command: the channel's data, EOF and window changes go out as exec frames;
/// the command's output comes back as channel data (stdout) and extended data 1 (stderr), its
/// exit code as the channel's exit status.
async fn exec(
    opener: &Opener,
    lease_id: LeaseId,
    channel: Channel<Msg>,
    argv: Vec<String>,
    env: Vec<String>,
    tty: Option<TermSize>,
) {
    let (mut rd, wr) = channel.split();
    let req = AccessRequest::Exec {
        lease_id,
        argv,
        env,
        tty,
    };
    let io = match opener.open(req).await {
        Ok(io) => io,
        Err(e) => return fail(&wr, &e.to_string()).await,
    };
    let (mut from, mut to) = tokio::io::split(io);
    let input = async {
        let mut eof = false;
        while let Some(msg) = rd.wait().await {
            let frames: Vec<ExecInput> = match msg {
                ChannelMsg::Data { data } if !eof => data
                    .chunks(MAX_EXEC_CHUNK)
                    .map(|c| ExecInput::Stdin(c.to_vec()))
                    .collect(),
                ChannelMsg::Eof if !eof => {
                    eof = true;
                    vec![ExecInput::Eof]
                }
                ChannelMsg::WindowChange {
                    col_width,
                    row_height,
                    ..
                } => vec![ExecInput::Resize(term_size(col_width, row_height))],
                ChannelMsg::Close => break,
                _ => continue,
            };
            for f in frames {
                if frames::send::<_, MAX_EXEC_FRAME, _>(&mut to, &f)
                    .await
                    .is_err()
                {
                    // The provider's side is gone; its end arrives on the output side.
                    std::future::pending::<()>().await;
                }
            }
        }
    };
    let output = async {
        loop {
            match frames::read::<ExecOutput, MAX_EXEC_FRAME, _>(&mut from).await {
                Ok(Some(ExecOutput::Stdout(b))) => {
                    if wr.data_bytes(b).await.is_err() {
                        return;
                    }
                }
                Ok(Some(ExecOutput::Stderr(b))) => {
                    if wr.extended_data_bytes(1, b).await.is_err() {
                        return;
                    }
                }
                Ok(Some(ExecOutput::Exit(code))) => {
                    let _ = wr
                        .exit_status(u32::try_from(code).unwrap_or(EXIT_UNKNOWN))
                        .await;
                    let _ = wr.eof().await;
                    let _ = wr.close().await;
                    return;
                }
                Ok(Some(ExecOutput::Error(m))) => {
                    return fail(&wr, &format!("remote command: {m}")).await;
                }
                Ok(None) | Err(_) => {
                    return fail(
                        &wr,
                        "the connection to the provider was lost before the command ended",
                    )
                    .await;
                }
            }
        }
    };
    // The client closing its channel ends the command's streams; the command's end closes
    // the channel.
    tokio::select! {
        () = input => {}
        () = output => {}
    }
}

/// The `sftp` subsystem: the channel's bytes both ways on an SFTP access stream (the provider
/// serves the SFTP protocol on the lease's `/workspace`); exit status 0 once the session ended
/// (OpenSSH's `ssh`, and with it `scp` and `sftp`, count a channel closed without one as a
/// failure).
async fn sftp(opener: &Opener, lease_id: LeaseId, channel: Channel<Msg>) {
    use tokio::io::AsyncWriteExt;
    let (mut rd, wr) = channel.split();
    let remote = match opener.open_retrying(AccessRequest::Sftp { lease_id }).await {
        Ok(io) => io,
        Err(e) => return fail(&wr, &format!("sftp: {e}")).await,
    };
    let (mut from, mut to) = tokio::io::split(remote);
    let mut local_out = wr.make_writer();
    let up = async {
        let mut local_in = rd.make_reader();
        let _ = tokio::io::copy(&mut local_in, &mut to).await;
        let _ = to.shutdown().await;
    };
    let down = async {
        let copied = tokio::io::copy(&mut from, &mut local_out).await;
        let _ = local_out.flush().await;
        copied.is_ok()
    };
    // The session ends when the provider's side does: after the client closed its side, or
    // on its own (the lease ended), when whatever the client still sends is not carried.
    tokio::pin!(up);
    tokio::pin!(down);
    let ended_cleanly = tokio::select! {
        clean = &mut down => clean,
        () = &mut up => (&mut down).await,
    };
    let _ = wr
        .exit_status(if ended_cleanly { 0 } else { EXIT_UNKNOWN })
        .await;
    let _ = wr.eof().await;
    let _ = wr.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out one chunk per read, as an SSH channel hands out one packet per read.
    struct Packets(std::collections::VecDeque<Vec<u8>>);

    impl AsyncRead for Packets {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            if let Some(p) = self.0.pop_front() {
                buf.put_slice(&p);
            }
            std::task::Poll::Ready(Ok(()))
        }
    }

    /// Records the size of every write.
    #[derive(Default)]
    struct Writes(Vec<usize>);

    impl AsyncWrite for Writes {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.0.push(buf.len());
            std::task::Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn packets_that_are_ready_go_out_in_one_write() {
        let packets = (0..20).map(|i| vec![i as u8; 16 * 1024]).collect();
        let mut from = Packets(packets);
        let mut to = Writes::default();
        let copied = gather_copy(&mut from, &mut to).await.unwrap();
        assert_eq!(copied, 20 * 16 * 1024);
        // 16 packets fill the 256 KiB buffer; the other four follow in a second write.
        assert_eq!(to.0, vec![256 * 1024, 4 * 16 * 1024]);
    }

    #[test]
    fn sizes_and_names_are_checked_before_they_travel() {
        assert_eq!(term_size(0, 0), TermSize { cols: 1, rows: 1 });
        assert_eq!(
            term_size(100_000, 40),
            TermSize {
                cols: u16::MAX,
                rows: 40
            }
        );
        assert!(valid_name("LANG") && valid_name("LC_ALL"));
        assert!(!valid_name("A-B") && !valid_name("") && !valid_name("A=B"));
        assert!(!valid_value("a\0b"));
    }
}
