//! `POST /v1/leases/{id}/listen/{port}`: the renter's node itself listens for `gridlease
//! forward` (and `rent --forward`) and carries each accepted TCP connection straight onto an
//! access stream to the container's port: no process between the client and the node (the
//! forward command only holds the listener open and prints what the node reports).
//!
//! The upgraded connection is the listener's lifetime: the node writes one line
//! `listening ADDR` once it listens, then one line per connection that failed (`forward ADDR
//! -> PORT: why`); when the CLI closes the connection (Ctrl-C, exit), the node stops
//! listening and drops the connections it carried. At most [`MAX_CONNECTIONS`] connections at
//! once per listener; a connection to the provider that is lost before it was granted is
//! tried again (3 attempts, 200 ms then 400 ms apart), a refusal is not.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use gridlease_protocol::access::AccessRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Semaphore, mpsc};

use super::access::{AccessHeaders, AccessProblems, access_body, require_upgrade};
use super::problem::{ApiError, ApiPath, ProblemType as P};
use super::resolve::resolve_lease;
use super::{ApiState, types};
use crate::access::OpenError;

/// Most forwarded connections one listener carries at once.
pub(super) const MAX_CONNECTIONS: usize = 256;
/// Failure lines queued for the CLI; more are dropped (the CLI is slow or gone).
const REPORTS: usize = 64;

/// `POST /v1/leases/{id}/listen/{port}` (`{"address": "127.0.0.1", "port": 0}`) with `Upgrade:
/// gridlease-access`: the node listens there and forwards every connection to `port` in
/// the lease's container while the upgraded connection stays open.
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/listen/{port}",
    operation_id = "listenForLease",
    tag = "access",
    summary = "The node listens locally and forwards each connection to a container port (HTTP upgrade)",
    description = "After 101 the node writes `listening ADDR\\n`, then one line per connection that failed; closing the connection stops the listener.",
    params(
        ("id" = String, Path, description = "Lease id or unique hex prefix"),
        ("port" = u16, Path, description = "Port inside the container (1-65535)"),
        AccessHeaders,
    ),
    request_body = types::ListenBody,
    responses(
        (status = 101, description = "Listening: the connection now carries the listener's report lines"),
        AccessProblems,
    )
)]
pub(super) async fn listen(
    State(s): State<ApiState>,
    ApiPath((id, port)): ApiPath<(String, u16)>,
    mut req: axum::extract::Request,
) -> Result<Response, ApiError> {
    require_upgrade(&req)?;
    let upgrade = hyper::upgrade::on(&mut req);
    let body: types::ListenBody = access_body(req).await?;
    if port == 0 {
        return Err(ApiError::new(P::InvalidParameter, "port 0 is not a port"));
    }
    let lease_id = resolve_lease(&s, &id).await?;
    // Only a lease this node rents: nothing is bound for any other.
    rented_here(&s, lease_id).await?;
    let bind = SocketAddr::new(body.address, body.port);
    let listener = tokio::net::TcpListener::bind(bind)
        .await
        .map_err(|e| ApiError::new(P::ListenFailed, format!("cannot listen on {bind}: {e}")))?;
    let local = listener.local_addr().map_err(ApiError::internal)?;
    tokio::spawn(async move {
        let Ok(up) = upgrade.await else {
            return;
        };
        let cli = hyper_util::rt::TokioIo::new(up);
        serve(s, lease_id, port, listener, local, cli).await;
    });
    super::access::switching_protocols()
}

/// Refuses a lease this node does not rent (unknown here, or provided by this node): what
/// the node serves itself for a lease (a listener, an SSH server) is only for its renter.
pub(super) async fn rented_here(
    s: &ApiState,
    lease_id: gridlease_protocol::LeaseId,
) -> Result<(), ApiError> {
    match s
        .leases
        .provider_of(lease_id)
        .await
        .map_err(ApiError::internal)?
    {
        None => {
            let e = OpenError::Unknown(lease_id);
            Err(ApiError::new(P::UnknownLease, e.to_string()))
        }
        Some(None) => {
            let e = OpenError::NotRenter(lease_id);
            Err(ApiError::new(P::NotRenter, e.to_string()))
        }
        Some(Some(_)) => Ok(()),
    }
}

/// Accepts and forwards until the CLI's connection closes.
async fn serve<C>(
    s: ApiState,
    lease_id: gridlease_protocol::LeaseId,
    port: u16,
    listener: tokio::net::TcpListener,
    local: SocketAddr,
    cli: C,
) where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut cli_rd, mut cli_wr) = tokio::io::split(cli);
    if cli_wr
        .write_all(format!("listening {local}\n").as_bytes())
        .await
        .is_err()
    {
        return;
    }
    let (report, mut reports) = mpsc::channel::<String>(REPORTS);
    let writer = async move {
        while let Some(line) = reports.recv().await {
            if cli_wr.write_all(line.as_bytes()).await.is_err() {
                return;
            }
        }
    };
    let closed = async move {
        // The CLI sends nothing: any byte or the end means it is done.
        let mut b = [0u8; 1];
        let _ = cli_rd.read(&mut b).await;
    };
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut conns = tokio::task::JoinSet::new();
    let accept = async {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let (s, report) = (s.clone(), report.clone());
            conns.spawn(async move {
                if let Err(e) = carry(&s, lease_id, port, tcp).await {
                    let _ = report.try_send(format!("forward {local} -> {port}: {e}\n"));
                }
                drop(permit);
            });
            // Finished connections are reaped as new ones come.
            while conns.try_join_next().is_some() {}
        }
    };
    tokio::select! {
        () = closed => {}
        () = writer => {}
        () = accept => {}
    }
    conns.abort_all();
    tracing::debug!(%local, port, "forward listener closed");
}

/// One accepted connection onto a forward stream (retrying a lost connection to the provider,
/// not a refusal), carried until either side ends.
async fn carry(
    s: &ApiState,
    lease_id: gridlease_protocol::LeaseId,
    port: u16,
    mut tcp: tokio::net::TcpStream,
) -> Result<(), OpenError> {
    let stream = crate::access::open_retrying(
        &s.client,
        &s.leases,
        AccessRequest::Forward { lease_id, port },
    )
    .await;
    let stream = match stream {
        Ok(st) => st,
        Err(e) => {
            let _ = tcp.shutdown().await;
            return Err(e);
        }
    };
    let mut stream = tokio_util::compat::FuturesAsyncReadCompatExt::compat(stream);
    let _ = crate::access::splice(&mut tcp, &mut stream).await;
    Ok(())
}
