//! Provider: accepting access streams and serving them.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

use super::{
    MAX_STREAMS, MAX_STREAMS_PER_LEASE, MAX_STREAMS_PER_PEER, REQUEST_TIMEOUT, SharedStats,
    authorize, frames,
};
use crate::lease::LeaseService;
use crate::net::Client;
use crate::store::Role;

type Io = Compat<libp2p::Stream>;

/// How long connecting inside a container may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a long-lived session checks that its lease still runs.
const ENDED_POLL: Duration = Duration::from_secs(2);
/// Copy buffer of a forwarded connection, each way.
const FORWARD_BUFFER: usize = 256 * 1024;
/// Streams of peers the gate does not know, vetted at once; more are dropped unread.
const MAX_VETTING: usize = 32;
/// How long a stranger's stream is kept to read its request and answer its refusal.
const STRANGER_TIMEOUT: Duration = Duration::from_secs(2);
/// The gate's cache of peers with leases is refilled this often...
const GATE_REFRESH: Duration = Duration::from_secs(5);
/// ...and for a peer it does not know, at once unless it is younger than this.
const GATE_REFILL_ON_MISS: Duration = Duration::from_millis(250);
/// Streams without a lease here that get a peer blocked...
const STRIKES: u32 = 32;
/// ...when opened within this long...
const STRIKE_WINDOW: Duration = Duration::from_secs(60);
/// ...for this long.
const BLOCK_FOR: Duration = Duration::from_secs(600);
/// Most peers counted, and most blocked, at once.
const MAX_STRIKE_PEERS: usize = 4096;
/// Log lines about refused or dropped streams: 20 at once, then one a second.
const LOG_RATE: crate::net::ratelimit::RateLimit = crate::net::ratelimit::RateLimit {
    burst: 20,
    per_token: Duration::from_secs(1),
};

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
    /// Who may hold a stream slot, and how many each holds.
    gate: Arc<Gate>,
    /// Refusals and drops are logged within this budget.
    log: Arc<LogBudget>,
    /// Strangers that keep opening streams are blocked for a while.
    strikes: Arc<Mutex<Strikes>>,
    client: Client,
}

/// Streams opened by peers with no lease here, per peer, and the peers blocked for it: a peer
/// that opens [`STRIKES`] such streams within [`STRIKE_WINDOW`] is blocked (its connections
/// closed, new ones refused) for [`BLOCK_FOR`]. At most [`MAX_STRIKE_PEERS`] peers of each.
#[derive(Default)]
struct Strikes {
    counted: HashMap<PeerId, (Instant, u32)>,
    blocked: HashMap<PeerId, Instant>,
}

impl Strikes {
    /// Counts one stream of `peer` at `now`; true when the peer is to be blocked now.
    fn strike(&mut self, peer: PeerId, now: Instant) -> bool {
        if self.blocked.contains_key(&peer) {
            return false;
        }
        if self.counted.len() >= MAX_STRIKE_PEERS && !self.counted.contains_key(&peer) {
            self.counted
                .retain(|_, (since, _)| now.duration_since(*since) < STRIKE_WINDOW);
            if self.counted.len() >= MAX_STRIKE_PEERS {
                return false;
            }
        }
        let (since, n) = self.counted.entry(peer).or_insert((now, 0));
        if now.duration_since(*since) >= STRIKE_WINDOW {
            *since = now;
            *n = 0;
        }
        *n += 1;
        if *n < STRIKES || self.blocked.len() >= MAX_STRIKE_PEERS {
            return false;
        }
        self.counted.remove(&peer);
        self.blocked.insert(peer, now);
        true
    }

    /// The blocked peers whose time is up (forgotten here).
    fn expired(&mut self, now: Instant) -> Vec<PeerId> {
        let done: Vec<PeerId> = self
            .blocked
            .iter()
            .filter(|(_, at)| now.duration_since(**at) >= BLOCK_FOR)
            .map(|(p, _)| *p)
            .collect();
        for p in &done {
            self.blocked.remove(p);
        }
        done
    }
}

/// Who may hold a stream slot: the renters of this provider's leases
/// ([`LeaseService::access_peers`], cached), at most [`MAX_STREAMS_PER_PEER`] each. A peer
/// the cache does not know is vetted off the accept loop, with only a vetting permit
/// ([`MAX_VETTING`]) while it is: a stranger never holds a slot the lease's renter needs.
struct Gate {
    leases: LeaseService,
    peers: std::sync::RwLock<HashSet<PeerId>>,
    /// When the cache was filled; taken while it is refilled (one refill at a time).
    filled: tokio::sync::Mutex<Option<Instant>>,
    per_peer: Mutex<HashMap<PeerId, usize>>,
}

impl Gate {
    fn knows(&self, peer: &PeerId) -> bool {
        self.peers.read().is_ok_and(|p| p.contains(peer))
    }

    /// Refills the cache unless it is younger than `max_age`.
    async fn refresh(&self, max_age: Duration) {
        let mut filled = self.filled.lock().await;
        if filled.is_some_and(|at| at.elapsed() < max_age) {
            return;
        }
        match self.leases.access_peers().await {
            Ok(peers) => {
                if let Ok(mut p) = self.peers.write() {
                    *p = peers;
                }
                *filled = Some(Instant::now());
            }
            Err(e) => tracing::warn!(error = %e, "cannot list the peers with leases here"),
        }
    }

    /// One of `peer`'s stream slots, or `None` when it holds [`MAX_STREAMS_PER_PEER`].
    fn take(self: &Arc<Self>, peer: PeerId) -> Option<PeerSlot> {
        let mut m = self.per_peer.lock().ok()?;
        let n = m.entry(peer).or_insert(0);
        if *n >= MAX_STREAMS_PER_PEER {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            gate: self.clone(),
            peer,
        })
    }
}

/// A peer's stream slot, given back when dropped.
struct PeerSlot {
    gate: Arc<Gate>,
    peer: PeerId,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Ok(mut m) = self.gate.per_peer.lock()
            && let Some(n) = m.get_mut(&self.peer)
        {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.peer);
            }
        }
    }
}

/// A budget for log lines about refused or dropped streams: a flood of them writes a bounded
/// number of lines, and the next line allowed says how many were not written.
struct LogBudget {
    limiter: Mutex<(crate::net::ratelimit::RateLimiter<()>, u64)>,
}

impl LogBudget {
    fn new() -> Self {
        Self {
            limiter: Mutex::new((crate::net::ratelimit::RateLimiter::new(LOG_RATE, 1), 0)),
        }
    }

    /// `Some(lines not written since the last one)` when a line may be written now.
    fn allow(&self) -> Option<u64> {
        let mut g = self.limiter.lock().ok()?;
        if g.0.check(&(), crate::clock::now()) {
            Some(std::mem::take(&mut g.1))
        } else {
            g.1 += 1;
            None
        }
    }
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
        gate: Arc::new(Gate {
            leases: leases.clone(),
            peers: Default::default(),
            filled: tokio::sync::Mutex::new(None),
            per_peer: Mutex::default(),
        }),
        leases,
        sandbox,
        policy,
        stats,
        open: Arc::default(),
        netns: Arc::default(),
        log: Arc::new(LogBudget::new()),
        strikes: Arc::default(),
        client: client.clone(),
    };
    let limit = Arc::new(Semaphore::new(MAX_STREAMS));
    let vetting = Arc::new(Semaphore::new(MAX_VETTING));
    Ok(tokio::spawn(async move {
        // Leases start and end: the cache follows within this period, and at once for a
        // peer it does not know (vetted below).
        let mut refill = tokio::time::interval(GATE_REFRESH);
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => break,
                _ = refill.tick() => {
                    let gate = server.gate.clone();
                    tokio::spawn(async move { gate.refresh(Duration::ZERO).await });
                    server.unblock_expired();
                    continue;
                }
                n = incoming.next() => n,
            };
            let Some((peer, stream)) = next else { break };
            // The accept loop never waits: a stream is admitted from the cache, or vetted in
            // a task of its own, or dropped.
            let known = server.gate.knows(&peer);
            let vet = if known {
                None
            } else {
                match vetting.clone().try_acquire_owned() {
                    Ok(p) => Some(p),
                    Err(_) => {
                        server.dropped(&peer, "too many streams from peers with no lease here");
                        server.strike(peer);
                        continue;
                    }
                }
            };
            let (s, cancel, limit) = (server.clone(), cancel.clone(), limit.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = s.admit_and_handle(peer, stream, vet, limit) => {}
                }
            });
        }
    }))
}

/// Decrements a lease's open-stream count when dropped.
struct Slot {
    open: Arc<Mutex<HashMap<LeaseId, usize>>>,
    lease: LeaseId,
    /// The lease whose workspace image file copies go to: a volume mounted at `/workspace`,
    /// else the lease's own (a volume lease's own image is the volume).
    workspace: LeaseId,
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
    /// Counts a stream of a peer with no lease here; blocks the peer when it has opened too
    /// many.
    fn strike(&self, peer: PeerId) {
        let block = self
            .strikes
            .lock()
            .is_ok_and(|mut s| s.strike(peer, Instant::now()));
        if block {
            tracing::warn!(%peer, strikes = STRIKES, window_s = STRIKE_WINDOW.as_secs(), for_s = BLOCK_FOR.as_secs(), "peer blocked: it keeps opening access streams with no lease here");
            let client = self.client.clone();
            tokio::spawn(async move {
                let _ = client.block(peer).await;
            });
        }
    }

    /// Lifts the blocks whose time is up.
    fn unblock_expired(&self) {
        let done = self
            .strikes
            .lock()
            .map(|mut s| s.expired(Instant::now()))
            .unwrap_or_default();
        for peer in done {
            let client = self.client.clone();
            tokio::spawn(async move {
                let _ = client.unblock(peer).await;
            });
        }
    }

    /// Why a request of a peer the gate does not know is refused: the lease's own reason
    /// when the peer is its renter (it has ended: "not running"), else
    /// [`AccessRefusal::NotRenter`], the same for a lease that does not exist, so a stranger
    /// learns nothing of the leases here.
    async fn refusal_of_no_lease(&self, peer: &PeerId, req: &AccessRequest) -> AccessRefusal {
        let view = match self.leases.lease(req.lease_id()).await {
            Ok(Some(v)) if v.role == Role::Provider && v.counterparty == peer.to_string() => v,
            _ => return AccessRefusal::NotRenter,
        };
        match authorize(peer, req, Some(&view), self.policy, self.leases.now()) {
            // The gate's cache lags a lease that has just started: the next try is admitted.
            Ok(()) => AccessRefusal::Failed {
                message: "the lease has only just started here; retry in a few seconds".into(),
            },
            Err(r) => r,
        }
    }

    /// Logs (within the budget) a stream dropped before its request was read.
    fn dropped(&self, peer: &PeerId, why: &str) {
        if let Some(unlogged) = self.log.allow() {
            tracing::warn!(%peer, unlogged, "access stream dropped: {why}");
        }
    }

    /// Admits a stream (a peer the gate does not know is vetted first, holding only `vet`),
    /// takes the peer's and the provider's slots, then serves it.
    async fn admit_and_handle(
        &self,
        peer: PeerId,
        stream: libp2p::Stream,
        vet: Option<tokio::sync::OwnedSemaphorePermit>,
        limit: Arc<Semaphore>,
    ) {
        let mut io = stream.compat();
        if vet.is_some() {
            self.gate.refresh(GATE_REFILL_ON_MISS).await;
            if !self.gate.knows(&peer) {
                // No running lease of this peer here: its request (read within a short time)
                // is refused, never given a slot.
                let req = tokio::time::timeout(
                    STRANGER_TIMEOUT,
                    frames::read::<AccessRequest, MAX_REQUEST_FRAME, _>(&mut io),
                )
                .await;
                let refusal = match req {
                    Ok(Ok(Some(req))) => {
                        let refusal = self.refusal_of_no_lease(&peer, &req).await;
                        self.stats.refuse(req.kind());
                        if let Some(unlogged) = self.log.allow() {
                            tracing::warn!(%peer, lease = %req.lease_id(), kind = req.kind().name(), reason = %refusal, unlogged, "access refused");
                        }
                        refusal
                    }
                    _ => AccessRefusal::NotRenter,
                };
                // A stranger counts towards a block; the renter of a lease that has ended
                // (told so: "the lease is not running") does not.
                if refusal == AccessRefusal::NotRenter {
                    self.strike(peer);
                }
                let _ = tokio::time::timeout(STRANGER_TIMEOUT, refuse(&mut io, refusal)).await;
                return;
            }
        }
        drop(vet);
        let Some(_peer_slot) = self.gate.take(peer) else {
            self.dropped(&peer, "the peer holds too many streams");
            let _ =
                tokio::time::timeout(STRANGER_TIMEOUT, refuse(&mut io, AccessRefusal::Busy)).await;
            return;
        };
        let Ok(_permit) = limit.try_acquire_owned() else {
            self.dropped(&peer, "the provider's access streams are all in use");
            let _ =
                tokio::time::timeout(STRANGER_TIMEOUT, refuse(&mut io, AccessRefusal::Busy)).await;
            return;
        };
        self.handle(peer, io).await;
    }

    async fn handle(&self, peer: PeerId, mut io: Io) {
        let req = match tokio::time::timeout(
            REQUEST_TIMEOUT,
            frames::read::<AccessRequest, MAX_REQUEST_FRAME, _>(&mut io),
        )
        .await
        {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                if let Some(unlogged) = self.log.allow() {
                    tracing::warn!(%peer, error = %e, unlogged, "access stream: bad request frame");
                }
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
                if let Some(unlogged) = self.log.allow() {
                    tracing::warn!(%peer, lease = %lease, kind = kind.name(), reason = %refusal, unlogged, "access refused");
                }
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
                    let n = super::files::upload(&dir, &slot.workspace, &dest, io).await;
                    tracing::info!(%peer, lease = %lease, dest, bytes = n, "upload ended");
                }
            }
            AccessRequest::Download { path, .. } => {
                if self.grant(&mut io, kind).await {
                    let dir = self.leases.workspace_dir();
                    let n = super::files::download(&dir, &slot.workspace, &path, io).await;
                    tracing::info!(%peer, lease = %lease, path, bytes = n, "download ended");
                }
            }
            AccessRequest::Sftp { .. } => {
                if self.grant(&mut io, kind).await {
                    let dir = self.leases.workspace_dir();
                    let ended = self.lease_ended(lease);
                    let t = super::sftp::serve(&dir, &slot.workspace, io, ended).await;
                    tracing::info!(%peer, lease = %lease, requests = t.requests, bytes_read = t.bytes_read, bytes_written = t.bytes_written, end = %t.end, "sftp session ended");
                }
            }
        }
        drop(slot);
    }

    /// Resolves once `lease` no longer runs here (checked every [`ENDED_POLL`]): a long-lived
    /// session (SFTP) ends with its lease instead of holding the workspace open.
    fn lease_ended(&self, lease: LeaseId) -> impl Future<Output = ()> + Send + 'static {
        let leases = self.leases.clone();
        async move {
            loop {
                tokio::time::sleep(ENDED_POLL).await;
                let running = matches!(
                    leases.lease(lease).await,
                    Ok(Some(v)) if !v.state.is_terminal()
                );
                if !running {
                    return;
                }
            }
        }
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
            workspace: view
                .as_ref()
                .map_or(lease, crate::lease::LeaseView::workspace_lease),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_keeps_opening_streams_without_a_lease_is_blocked_for_a_while() {
        let mut s = Strikes::default();
        let (a, b) = (PeerId::random(), PeerId::random());
        let t0 = Instant::now();
        for i in 1..STRIKES {
            assert!(!s.strike(a, t0 + Duration::from_millis(u64::from(i))));
        }
        // Another peer's streams do not count against it.
        assert!(!s.strike(b, t0));
        assert!(s.strike(a, t0 + Duration::from_secs(1)), "the 32nd stream");
        assert!(!s.strike(a, t0 + Duration::from_secs(2)), "blocked already");
        // A slow trickle never adds up: the window restarts.
        for i in 0..3 * STRIKES {
            let at = t0 + STRIKE_WINDOW * (i + 1);
            assert!(!s.strike(b, at));
        }
        assert!(s.expired(t0 + BLOCK_FOR / 2).is_empty());
        assert_eq!(s.expired(t0 + BLOCK_FOR + Duration::from_secs(1)), vec![a]);
        assert!(s.blocked.is_empty());
    }
}
