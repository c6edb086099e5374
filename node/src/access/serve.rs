//! Provider: accepting access streams and serving them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::container::LogOutput;
use futures::StreamExt;
use gridlease_protocol::access::{
    AccessKind, AccessPolicy, AccessRefusal, AccessReply, AccessRequest, ExecInput, ExecOutput,
    MAX_EXEC_CHUNK, MAX_EXEC_FRAME, MAX_REPLY_FRAME, MAX_REQUEST_FRAME, message,
};
use gridlease_protocol::{LeaseId, PeerId};
use gridlease_sandbox::Sandbox;
use gridlease_sandbox::access::{ConnectError, ContainerNetns, DEFAULT_SHELL, ExecSpec};
use tokio::io::{AsyncWriteExt, WriteHalf};
use tokio::sync::Semaphore;
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt};
use tokio_util::sync::CancellationToken;

use super::{MAX_STREAMS, MAX_STREAMS_PER_LEASE, REQUEST_TIMEOUT, SharedStats, authorize, frames};
use crate::lease::LeaseService;
use crate::net::Client;

type Io = Compat<libp2p::Stream>;

/// How long connecting inside a container may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Copy buffer of a forwarded connection, each way.
const FORWARD_BUFFER: usize = 256 * 1024;

#[derive(Clone)]
struct Server {
    leases: LeaseService,
    sandbox: Sandbox,
    policy: AccessPolicy,
    stats: SharedStats,
    /// Open streams per lease.
    open: Arc<Mutex<HashMap<LeaseId, usize>>>,
    /// Network namespaces of leases' containers, held open once found (see
    /// `gridlease_sandbox::access::ContainerNetns`); dropped when a lease is found not running.
    netns: Arc<Mutex<HashMap<LeaseId, Arc<ContainerNetns>>>>,
}

/// Serves access streams for this provider's leases until `cancel`. `policy` is what the
/// provider allows (and its offer advertises).
pub fn serve(
    client: &Client,
    leases: LeaseService,
    sandbox: Sandbox,
    policy: AccessPolicy,
    stats: SharedStats,
    cancel: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut control = client.streams();
    let mut incoming = control
        .accept(super::protocol())
        .map_err(|e| anyhow::anyhow!("access protocol: {e}"))?;
    let server = Server {
        leases,
        sandbox,
        policy,
        stats,
        open: Arc::default(),
        netns: Arc::default(),
    };
    let limit = Arc::new(Semaphore::new(MAX_STREAMS));
    Ok(tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => break,
                n = incoming.next() => n,
            };
            let Some((peer, stream)) = next else { break };
            let Ok(permit) = limit.clone().try_acquire_owned() else {
                tracing::warn!(%peer, "access stream dropped: {MAX_STREAMS} already open");
                continue;
            };
            let s = server.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = s.handle(peer, stream) => {}
                }
                drop(permit);
            });
        }
    }))
}

/// Decrements a lease's open-stream count when dropped.
struct Slot {
    open: Arc<Mutex<HashMap<LeaseId, usize>>>,
    lease: LeaseId,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut m) = self.open.lock()
            && let Some(n) = m.get_mut(&self.lease)
        {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.lease);
            }
        }
    }
}

impl Server {
    async fn handle(&self, peer: PeerId, stream: libp2p::Stream) {
        let mut io = stream.compat();
        let req = match tokio::time::timeout(
            REQUEST_TIMEOUT,
            frames::read::<AccessRequest, MAX_REQUEST_FRAME, _>(&mut io),
        )
        .await
        {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                tracing::warn!(%peer, error = %e, "access stream: bad request frame");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "access stream: no request in time");
                return;
            }
        };
        let kind = req.kind();
        let lease = req.lease_id();
        let slot = match self.admit(&peer, &req).await {
            Ok(slot) => slot,
            Err(refusal) => {
                self.stats.refuse(kind);
                tracing::warn!(%peer, lease = %lease, kind = kind.name(), reason = %refusal, "access refused");
                let _ = refuse(&mut io, refusal).await;
                return;
            }
        };
        match req {
            AccessRequest::Exec { argv, env, tty, .. } => {
                let argv = if argv.is_empty() {
                    DEFAULT_SHELL.iter().map(|s| s.to_string()).collect()
                } else {
                    argv
                };
                let spec = ExecSpec {
                    argv,
                    env,
                    tty: tty.map(|t| (t.cols, t.rows)),
                };
                self.exec(peer, lease, kind, spec, io).await;
            }
            AccessRequest::Forward { port, .. } => self.forward(peer, lease, port, io).await,
            AccessRequest::Upload { dest, .. } => {
                if self.grant(&mut io, kind).await {
                    let dir = self.leases.workspace_dir();
                    let n = super::files::upload(&dir, &lease, &dest, io).await;
                    tracing::info!(%peer, lease = %lease, dest, bytes = n, "upload ended");
                }
            }
            AccessRequest::Download { path, .. } => {
                if self.grant(&mut io, kind).await {
                    let dir = self.leases.workspace_dir();
                    let n = super::files::download(&dir, &lease, &path, io).await;
                    tracing::info!(%peer, lease = %lease, path, bytes = n, "download ended");
                }
            }
        }
        drop(slot);
    }

    /// Answers `Granted` and counts it; false when the renter is already gone.
    async fn grant(&self, io: &mut Io, kind: AccessKind) -> bool {
        let sent = frames::send::<_, MAX_REPLY_FRAME, _>(io, &AccessReply::Granted)
            .await
            .is_ok();
        if sent {
            self.stats.grant(kind);
        }
        sent
    }

    /// Authorizes the request and takes one of the lease's stream slots.
    async fn admit(&self, peer: &PeerId, req: &AccessRequest) -> Result<Slot, AccessRefusal> {
        let lease = req.lease_id();
        let view = self
            .leases
            .lease(lease)
            .await
            .map_err(|e| AccessRefusal::Failed {
                message: message(e),
            })?;
        let now = self.leases.now();
        if let Err(r) = authorize(peer, req, view.as_ref(), self.policy, now) {
            if matches!(
                r,
                AccessRefusal::NotRunning { .. } | AccessRefusal::UnknownLease
            ) && let Ok(mut m) = self.netns.lock()
            {
                m.remove(&lease);
            }
            return Err(r);
        }
        let mut open = self.open.lock().map_err(|_| AccessRefusal::Busy)?;
        let n = open.entry(lease).or_insert(0);
        if *n >= MAX_STREAMS_PER_LEASE {
            return Err(AccessRefusal::Busy);
        }
        *n += 1;
        Ok(Slot {
            open: self.open.clone(),
            lease,
        })
    }

    async fn exec(
        &self,
        peer: PeerId,
        lease: LeaseId,
        kind: AccessKind,
        spec: ExecSpec,
        mut io: Io,
    ) {
        let container = container_name(&lease);
        let exec = match self.sandbox.exec(&container, &spec).await {
            Ok(e) => e,
            Err(e) => {
                self.stats.refuse(kind);
                tracing::warn!(%peer, lease = %lease, error = %e, "exec could not start");
                let _ = refuse(
                    &mut io,
                    AccessRefusal::Failed {
                        message: message(format!("the command could not start: {e}")),
                    },
                )
                .await;
                return;
            }
        };
        if !self.grant(&mut io, kind).await {
            return;
        }
        tracing::info!(%peer, lease = %lease, kind = kind.name(), argv = ?spec.argv, "exec started");
        let (mut rd, mut wr) = tokio::io::split(io);
        let gridlease_sandbox::access::Exec {
            id,
            mut output,
            mut input,
        } = exec;
        let sandbox = self.sandbox.clone();
        let exec_id = id.clone();
        let inbound = async move {
            loop {
                match frames::read::<ExecInput, MAX_EXEC_FRAME, _>(&mut rd).await {
                    Ok(Some(ExecInput::Stdin(bytes))) => {
                        if input.write_all(&bytes).await.is_err() {
                            break;
                        }
                        let _ = input.flush().await;
                    }
                    Ok(Some(ExecInput::Resize(t))) => {
                        if let Err(e) = sandbox.resize_exec(&exec_id, t.cols, t.rows).await {
                            tracing::debug!(error = %e, "exec resize failed");
                        }
                    }
                    Ok(Some(ExecInput::Eof)) | Ok(None) | Err(_) => break,
                }
            }
            // The command's stdin ends: Docker closes it on the hijacked connection's
            // half-close.
            let _ = input.shutdown().await;
            // Keep the read half alive (dropping it is harmless; the stream closes when both
            // halves are gone).
            rd
        };
        let outbound = async {
            while let Some(item) = output.next().await {
                let (stdout, bytes) = match item {
                    Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                        (true, message)
                    }
                    Ok(LogOutput::StdErr { message }) => (false, message),
                    Ok(LogOutput::StdIn { .. }) => continue,
                    Err(e) => {
                        let _ = send_out(&mut wr, &ExecOutput::Error(message(e))).await;
                        return;
                    }
                };
                for chunk in bytes.chunks(MAX_EXEC_CHUNK) {
                    let frame = if stdout {
                        ExecOutput::Stdout(chunk.to_vec())
                    } else {
                        ExecOutput::Stderr(chunk.to_vec())
                    };
                    if send_out(&mut wr, &frame).await.is_err() {
                        return; // the renter is gone
                    }
                }
            }
            let last = match self.sandbox.exec_exit_code(&id).await {
                Ok(Some(code)) => ExecOutput::Exit(code),
                Ok(None) => ExecOutput::Error("the command's exit code is unknown".into()),
                Err(e) => ExecOutput::Error(message(e)),
            };
            tracing::info!(%peer, lease = %lease, result = ?last, "exec ended");
            let _ = send_out(&mut wr, &last).await;
            let _ = wr.shutdown().await;
        };
        tokio::pin!(inbound);
        tokio::pin!(outbound);
        let mut inbound_done = false;
        loop {
            tokio::select! {
                _ = &mut inbound, if !inbound_done => inbound_done = true,
                () = &mut outbound => break,
            }
        }
    }

    async fn forward(&self, peer: PeerId, lease: LeaseId, port: u16, mut io: Io) {
        let tcp = match self.connect(lease, port).await {
            Ok(s) => s,
            Err(e) => {
                self.stats.refuse(AccessKind::Forward);
                let refusal = match e {
                    ConnectError::Refused(port) => AccessRefusal::PortClosed { port },
                    other => AccessRefusal::Failed {
                        message: message(other),
                    },
                };
                tracing::info!(%peer, lease = %lease, port, reason = %refusal, "forward refused");
                let _ = refuse(&mut io, refusal).await;
                return;
            }
        };
        if !self.grant(&mut io, AccessKind::Forward).await {
            return;
        }
        tracing::debug!(%peer, lease = %lease, port, "forwarded connection opened");
        let Ok(mut tcp) = tokio::net::TcpStream::from_std(tcp) else {
            return;
        };
        match tokio::io::copy_bidirectional_with_sizes(
            &mut io,
            &mut tcp,
            FORWARD_BUFFER,
            FORWARD_BUFFER,
        )
        .await
        {
            Ok((up, down)) => {
                self.stats.forwarded(up + down);
                tracing::debug!(lease = %lease, port, up, down, "forwarded connection closed");
            }
            Err(e) => {
                tracing::debug!(lease = %lease, port, error = %e, "forwarded connection broke")
            }
        }
    }

    /// A connection to `port` inside the lease's container (its namespace found once, then
    /// held).
    async fn connect(
        &self,
        lease: LeaseId,
        port: u16,
    ) -> Result<std::net::TcpStream, ConnectError> {
        let cached = self.netns.lock().ok().and_then(|m| m.get(&lease).cloned());
        let ns = match cached {
            Some(ns) => ns,
            None => {
                let ns = Arc::new(
                    self.sandbox
                        .container_netns(&container_name(&lease))
                        .await?,
                );
                if let Ok(mut m) = self.netns.lock() {
                    m.insert(lease, ns.clone());
                }
                ns
            }
        };
        ns.connect(port, CONNECT_TIMEOUT).await
    }
}

fn container_name(lease: &LeaseId) -> String {
    gridlease_sandbox::spec::container_name_of(lease)
}

async fn refuse(io: &mut Io, refusal: AccessRefusal) -> std::io::Result<()> {
    frames::send::<_, MAX_REPLY_FRAME, _>(io, &AccessReply::Refused(refusal)).await?;
    io.shutdown().await
}

async fn send_out(wr: &mut WriteHalf<Io>, out: &ExecOutput) -> std::io::Result<()> {
    frames::send::<_, MAX_EXEC_FRAME, _>(wr, out).await
}
