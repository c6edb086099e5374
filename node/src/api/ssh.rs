//! `POST /v1/leases/{id}/ssh`: the renter's node serves SSH for a lease on the upgraded
//! connection ([`crate::access::ssh::server`]); `gridlease ssh-proxy` opens it for the user's
//! OpenSSH client and hands that client the connection itself (`ProxyUseFdpass`), so the
//! client's bytes reach this node with no process between them.

use axum::extract::State;
use axum::response::Response;

use super::ApiState;
use super::access::{AccessHeaders, AccessProblems, require_upgrade, switching_protocols};
use super::listen::rented_here;
use super::problem::{ApiError, ApiPath};
use super::resolve::resolve_lease;
use crate::access::ssh::server::{Opener, Prefixed, serve};

/// `POST /v1/leases/{id}/ssh` with `Upgrade: gridlease-access`: an SSH server for the lease on
/// the upgraded connection, each SSH channel one access stream of the lease.
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/ssh",
    operation_id = "sshToLease",
    tag = "access",
    summary = "An SSH server for the lease on this connection (HTTP upgrade)",
    description = "No body. After 101 the connection carries SSH (RFC 4253): the client speaks first; authentication `none`; the host key is the lease's (`gridlease ssh-config` writes it into known_hosts). Sessions run shells, commands and SFTP in the container; `direct-tcpip` reaches the container's own ports.",
    params(("id" = String, Path, description = "Lease id or unique hex prefix"), AccessHeaders),
    responses(
        (status = 101, description = "The connection now carries SSH"),
        AccessProblems,
    )
)]
pub(super) async fn ssh(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    mut req: axum::extract::Request,
) -> Result<Response, ApiError> {
    require_upgrade(&req)?;
    let upgrade = hyper::upgrade::on(&mut req);
    let lease_id = resolve_lease(&s, &id).await?;
    rented_here(&s, lease_id).await?;
    let key = crate::access::ssh::host_key(&s.home, &lease_id).map_err(ApiError::internal)?;
    let opener = Opener {
        client: s.client.clone(),
        leases: s.leases.clone(),
    };
    tokio::spawn(async move {
        let Ok(up) = upgrade.await else {
            return;
        };
        // The socket itself where it is one (what `axum::serve` hands hyper), without hyper's
        // layers on every read and write; what hyper read past the request is read first.
        let ended = match up.downcast::<hyper_util::rt::TokioIo<tokio::net::UnixStream>>() {
            Ok(parts) => {
                let io = Prefixed::new(parts.read_buf.to_vec(), parts.io.into_inner());
                serve(opener, lease_id, key, io).await
            }
            Err(up) => serve(opener, lease_id, key, hyper_util::rt::TokioIo::new(up)).await,
        };
        if let Err(e) = ended {
            tracing::info!(lease = %lease_id.short(), "ssh connection ended: {e:#}");
        }
    });
    switching_protocols()
}
