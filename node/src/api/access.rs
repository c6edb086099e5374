//! The access routes (HTTP upgrades): exec, forward, upload, download, sftp, spliced onto the
//! lease's access stream.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use gridlease_protocol::LeaseId;

use super::problem::{self, ApiError, ApiPath, Problem, ProblemType as P};
use super::resolve::resolve_lease;
use super::{ApiState, types};
/// Most bytes of an exec request body.
const MAX_EXEC_BODY: usize = 128 * 1024;

/// An access route needs `Connection: upgrade` and `Upgrade: gridlease-access` (required
/// headers of the document): without them nothing is opened, and the request is malformed
/// (400, `upgrade-required`).
pub(super) fn require_upgrade(req: &axum::extract::Request) -> Result<(), ApiError> {
    let has = |name: axum::http::header::HeaderName, want: &str| {
        req.headers().get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(want)))
        })
    };
    let ok = has(axum::http::header::UPGRADE, types::ACCESS_UPGRADE)
        && has(axum::http::header::CONNECTION, "upgrade");
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            P::UpgradeRequired,
            format!(
                "this route switches protocols: send Connection: upgrade and Upgrade: {}",
                types::ACCESS_UPGRADE
            ),
        ))
    }
}

/// The headers every access route needs, documented once (both required, each with its one
/// value; [`require_upgrade`] checks them).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)] // A documentation type: never built, only described.
pub(super) struct AccessHeaders {
    /// The access protocol.
    upgrade: types::AccessUpgrade,
    /// The connection switches protocols.
    connection: types::ConnectionUpgrade,
}

/// The refusals every access route (exec, forward, upload, download) can give, documented once.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // A documentation type: never built, only described.
pub(super) enum AccessProblems {
    #[response(
        status = 400,
        description = "Not a lease id (`invalid-parameter`), no `Connection: upgrade` and `Upgrade: gridlease-access` headers (`upgrade-required`), or a body that cannot be read (`malformed-body`)",
        content_type = "application/problem+json"
    )]
    BadRequest(Problem),
    #[response(
        status = 422,
        description = "The body is not the route's request (`invalid-body`)",
        content_type = "application/problem+json"
    )]
    BadBody(Problem),
    #[response(
        status = 404,
        description = "No such lease (`unknown-lease`)",
        content_type = "application/problem+json"
    )]
    Unknown(Problem),
    #[response(
        status = 409,
        description = "The provider refused (`access-refused`: not running, not allowed by the offer, or not supported), this node provides the lease (`not-renter`), the prefix matches several leases (`ambiguous-id`), or the node cannot listen on the address asked (`listen-failed`, `listen` only)",
        content_type = "application/problem+json"
    )]
    Refused(Problem),

    #[response(
        status = 502,
        description = "The provider is unreachable (`provider-unreachable`)",
        content_type = "application/problem+json"
    )]
    Unreachable(Problem),
    #[response(
        status = 500,
        description = "A failure inside the node (`internal`)",
        content_type = "application/problem+json"
    )]
    Internal(Problem),
}

/// `POST /v1/leases/{id}/exec` with `Upgrade: gridlease-access`: opens a shell or a command
/// in the lease's container (through its provider) and, once granted, answers 101 and carries
/// the exec frames on the upgraded connection.
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/exec",
    operation_id = "execInLease",
    tag = "access",
    summary = "A shell or a command in the lease's container (HTTP upgrade)",
    description = "After 101 the connection carries ExecInput frames up and ExecOutput frames down.",
    params(("id" = String, Path, description = "Lease id or unique hex prefix"), AccessHeaders),
    request_body = types::ExecBody,
    responses(
        (status = 101, description = "Granted: the connection now carries the access protocol (docs/protocol.md section 4d)"),
        AccessProblems,
    )
)]
pub(super) async fn exec(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    mut req: axum::extract::Request,
) -> Result<Response, ApiError> {
    require_upgrade(&req)?;
    let upgrade = hyper::upgrade::on(&mut req);
    let ask: types::ExecBody = access_body(req).await?;
    let lease_id = resolve_lease(&s, &id).await?;
    let request = gridlease_protocol::access::AccessRequest::Exec {
        lease_id,
        argv: ask.argv,
        env: ask.env,
        tty: ask.tty,
    };
    splice(&s, request, upgrade).await
}

/// `POST /v1/leases/{id}/forward/{port}` with `Upgrade: gridlease-access`: one TCP connection
/// to `port` inside the lease's container; once granted, answers 101 and carries the
/// connection's bytes on the upgraded connection.
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/forward/{port}",
    operation_id = "forwardToLease",
    tag = "access",
    summary = "One TCP connection to a port inside the lease's container (HTTP upgrade)",
    description = "No body. After 101 the connection carries the TCP connection's bytes both ways.",
    params(
        ("id" = String, Path, description = "Lease id or unique hex prefix"),
        ("port" = u16, Path, description = "Port inside the container"),
        AccessHeaders,
    ),
    responses(
        (status = 101, description = "Granted: the connection now carries the access protocol (docs/protocol.md section 4d)"),
        AccessProblems,
    )
)]
pub(super) async fn forward(
    State(s): State<ApiState>,
    ApiPath((id, port)): ApiPath<(String, u16)>,
    mut req: axum::extract::Request,
) -> Result<Response, ApiError> {
    require_upgrade(&req)?;
    let upgrade = hyper::upgrade::on(&mut req);
    let lease_id = resolve_lease(&s, &id).await?;
    let request = gridlease_protocol::access::AccessRequest::Forward { lease_id, port };
    splice(&s, request, upgrade).await
}

/// `POST /v1/leases/{id}/sftp` with `Upgrade: gridlease-access`: an SFTP v3 session on the
/// lease's `/workspace`, served by its provider; once granted, answers 101 and carries the
/// SFTP packets both ways (`gridlease ssh-proxy` maps an SSH client's `sftp` subsystem onto it).
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/sftp",
    operation_id = "sftpInLease",
    tag = "access",
    summary = "An SFTP session on the lease's /workspace (HTTP upgrade)",
    description = "No body. After 101 the connection carries SFTP version 3 packets both ways (the provider serves them; paths outside /workspace are refused).",
    params(("id" = String, Path, description = "Lease id or unique hex prefix"), AccessHeaders),
    responses(
        (status = 101, description = "Granted: the connection now carries the access protocol (docs/protocol.md section 4d)"),
        AccessProblems,
    )
)]
pub(super) async fn sftp(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    mut req: axum::extract::Request,
) -> Result<Response, ApiError> {
    require_upgrade(&req)?;
    let upgrade = hyper::upgrade::on(&mut req);
    let lease_id = resolve_lease(&s, &id).await?;
    let request = gridlease_protocol::access::AccessRequest::Sftp { lease_id };
    splice(&s, request, upgrade).await
}

/// The JSON body of an access route (at most [`MAX_EXEC_BODY`] bytes), read as every route
/// reads one ([`problem::json_body`]).
pub(super) async fn access_body<T: serde::de::DeserializeOwned>(
    req: axum::extract::Request,
) -> Result<T, ApiError> {
    let body = axum::body::to_bytes(req.into_body(), MAX_EXEC_BODY)
        .await
        .map_err(|e| ApiError::new(P::MalformedBody, format!("request body: {e}")))?;
    problem::json_body(&body)
}

/// `POST /v1/leases/{id}/upload` (`{"dest": PATH}`) with `Upgrade: gridlease-access`: a tar
/// stream into the lease's workspace (`gridlease cp SRC LEASE:PATH`).
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/upload",
    operation_id = "uploadToLease",
    tag = "access",
    summary = "A tar stream into the lease's /workspace (HTTP upgrade)",
    description = "After 101: TransferFrame Chunks of a tar stream and End up, Done or Error down.",
    params(("id" = String, Path, description = "Lease id or unique hex prefix"), AccessHeaders),
    request_body = types::UploadBody,
    responses(
        (status = 101, description = "Granted: the connection now carries the access protocol (docs/protocol.md section 4d)"),
        AccessProblems,
    )
)]
pub(super) async fn upload(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    req: axum::extract::Request,
) -> Result<Response, ApiError> {
    transfer(&s, &id, req, |lease_id, b: types::UploadBody| {
        gridlease_protocol::access::AccessRequest::Upload {
            lease_id,
            dest: b.dest,
        }
    })
    .await
}

/// `POST /v1/leases/{id}/download` (`{"path": PATH}`) with `Upgrade: gridlease-access`: a
/// tar stream of a workspace path (`gridlease cp LEASE:PATH DST`).
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/download",
    operation_id = "downloadFromLease",
    tag = "access",
    summary = "A tar stream of a path in the lease's /workspace (HTTP upgrade)",
    description = "After 101: Skips and Go up; Root, Chunks and End (or Error) down.",
    params(("id" = String, Path, description = "Lease id or unique hex prefix"), AccessHeaders),
    request_body = types::DownloadBody,
    responses(
        (status = 101, description = "Granted: the connection now carries the access protocol (docs/protocol.md section 4d)"),
        AccessProblems,
    )
)]
pub(super) async fn download(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    req: axum::extract::Request,
) -> Result<Response, ApiError> {
    transfer(&s, &id, req, |lease_id, b: types::DownloadBody| {
        gridlease_protocol::access::AccessRequest::Download {
            lease_id,
            path: b.path,
        }
    })
    .await
}

/// The upload and download routes: the body, the lease, then [`splice`].
pub(super) async fn transfer<B: serde::de::DeserializeOwned>(
    s: &ApiState,
    id: &str,
    mut req: axum::extract::Request,
    make: impl FnOnce(LeaseId, B) -> gridlease_protocol::access::AccessRequest,
) -> Result<Response, ApiError> {
    require_upgrade(&req)?;
    let upgrade = hyper::upgrade::on(&mut req);
    let body = access_body(req).await?;
    let lease_id = resolve_lease(s, id).await?;
    splice(s, make(lease_id, body), upgrade).await
}

/// Opens the access stream, then answers 101 and copies bytes both ways between the
/// upgraded connection and the stream (fixed buffers; each side's flow control holds the
/// other back).
pub(super) async fn splice(
    s: &ApiState,
    request: gridlease_protocol::access::AccessRequest,
    upgrade: hyper::upgrade::OnUpgrade,
) -> Result<Response, ApiError> {
    use crate::access::OpenError;
    use gridlease_protocol::access::AccessRequest;
    let kind = request.kind();
    // A byte stream both ways (a TCP connection, an SFTP session), not frames that end with
    // the provider's last one.
    let raw = matches!(
        request,
        AccessRequest::Forward { .. } | AccessRequest::Sftp { .. }
    );
    let stream = crate::access::open(&s.client, &s.leases, request)
        .await
        .map_err(|e| match e {
            OpenError::Unknown(_) => ApiError::new(P::UnknownLease, e.to_string()),
            OpenError::NotRenter(_) => ApiError::new(P::NotRenter, e.to_string()),
            OpenError::Refused(ref r) => ApiError::new(P::AccessRefused, e.to_string()).maybe_hint(
                matches!(
                    r,
                    gridlease_protocol::access::AccessRefusal::NotRunning { .. }
                )
                .then(|| "see `gridlease leases`".to_string()),
            ),
            OpenError::Unsupported => ApiError::new(P::AccessRefused, e.to_string()),
            OpenError::Unreachable(_) => ApiError::new(P::ProviderUnreachable, e.to_string())
                .hint("check `gridlease peers`, then retry"),
            OpenError::Lease(_) => ApiError::internal(e),
        })?;
    tokio::spawn(async move {
        let up = match upgrade.await {
            Ok(up) => up,
            Err(e) => {
                tracing::debug!(error = %e, "access: the CLI's connection was not upgraded");
                return;
            }
        };
        let mut up = hyper_util::rt::TokioIo::new(up);
        let mut stream = tokio_util::compat::FuturesAsyncReadCompatExt::compat(stream);
        let r = if raw {
            // Each direction's half-close travels on its own.
            crate::access::splice(&mut up, &mut stream)
                .await
                .map(|_| ())
        } else {
            until_provider_ends(&mut up, &mut stream).await
        };
        tracing::debug!(kind = kind.name(), result = ?r, "access stream closed");
    });
    switching_protocols()
}

/// The 101 that hands the CLI's connection over to an access stream or a listener's report.
pub(super) fn switching_protocols() -> Result<Response, ApiError> {
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(axum::http::header::CONNECTION, "upgrade")
        .header(axum::http::header::UPGRADE, types::ACCESS_UPGRADE)
        .body(axum::body::Body::empty())
        .map_err(ApiError::internal)
}

/// Copies both ways between the CLI's connection and an exec or transfer stream until the
/// provider's side ends: after its last frame (an exit code, `Done` or `Error`) the provider
/// reads nothing more, so whatever the CLI still sends is not carried (a stream the provider
/// stopped reading would hold the copy, and the CLI's connection, forever).
pub(super) async fn until_provider_ends<A, B>(cli: &mut A, provider: &mut B) -> std::io::Result<()>
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    let (mut cr, mut cw) = tokio::io::split(cli);
    let (mut pr, mut pw) = tokio::io::split(provider);
    let to_provider = async {
        let mut r = tokio::io::BufReader::with_capacity(crate::access::SPLICE_BUFFER, &mut cr);
        tokio::io::copy_buf(&mut r, &mut pw).await?;
        pw.shutdown().await
    };
    let from_provider = async {
        let mut r = tokio::io::BufReader::with_capacity(crate::access::SPLICE_BUFFER, &mut pr);
        tokio::io::copy_buf(&mut r, &mut cw).await?;
        cw.shutdown().await
    };
    tokio::pin!(to_provider);
    tokio::pin!(from_provider);
    let mut sent = false;
    loop {
        tokio::select! {
            r = &mut from_provider => return r,
            r = &mut to_provider, if !sent => {
                sent = true;
                r?;
            }
        }
    }
}
