//! The router: every route with its OpenAPI description, the document's root, and serving it
//! on the home's Unix socket.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use axum::Router;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{
    ApiState, access, jobs, leases, listen, node, offers, openapi, problem, provide, socket_path,
    ssh, types, volumes,
};

/// The document's root: title, version, servers, tags. The paths and schemas come from the
/// routes ([`api_router`]).
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "gridlease control API",
        version = "1",
        description = "The local control API of a gridlease node: HTTP/1.1 on the Unix socket \
            `<home>/api.sock` (mode 0600). Errors are RFC 9457 problems \
            (`application/problem+json`) whose `type` is `urn:gridlease:problem:<slug>`; \
            `docs/api.md` lists the kinds. Generated from the handlers \
            (`node/src/api`); do not edit `docs/openapi.json` by hand.",
        license(name = "MIT OR Apache-2.0")
    ),
    servers((url = "http://gridlease", description = "the Unix socket <home>/api.sock")),
    tags(
        (name = "node", description = "This node: status, peers, GPUs, what it offers"),
        (name = "offers", description = "The offer book, searched locally"),
        (name = "leases", description = "Leases this node rents or provides"),
        (name = "access", description = "Interactive access to a lease (HTTP upgrades)"),
        (name = "jobs", description = "Jobs: batches of tasks over many leases (docs/jobs.md)"),
        (name = "volumes", description = "Volumes: storage kept on a provider beyond any lease (docs/volumes.md)"),
    ),
    // The access routes' header schemas (header parameters are not collected from routes).
    components(schemas(types::AccessUpgrade, types::ConnectionUpgrade))
)]
struct ApiDoc;

/// The document as served and committed (pretty JSON, a final newline).
pub fn document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut v = generate();
        let _ = openapi::constrain(&mut v);
        let mut text = serde_json::to_string_pretty(&v).unwrap_or_default();
        text.push('\n');
        text
    })
}

/// The document as utoipa generates it from the routes.
pub(super) fn generate() -> Value {
    let (_, api) = api_router().split_for_parts();
    serde_json::to_value(&api).unwrap_or_default()
}

/// Every route with its OpenAPI description (one list: a route cannot exist undocumented).
pub fn api_router() -> OpenApiRouter<ApiState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(openapi_json))
        .routes(routes!(node::status))
        .routes(routes!(node::peers))
        .routes(routes!(offers::offers))
        .routes(routes!(offers::offer))
        .routes(routes!(node::gpus))
        .routes(routes!(provide::provide))
        .routes(routes!(leases::leases, leases::rent))
        .routes(routes!(leases::lease))
        .routes(routes!(leases::logs))
        .routes(routes!(leases::telemetry))
        .routes(routes!(leases::stop))
        .routes(routes!(leases::begin))
        .routes(routes!(leases::verify_gpu))
        .routes(routes!(leases::extend))
        .routes(routes!(volumes::list, volumes::create))
        .routes(routes!(volumes::remove))
        .routes(routes!(volumes::keep_disk))
        .routes(routes!(jobs::list, jobs::submit))
        .routes(routes!(jobs::get))
        .routes(routes!(jobs::cancel))
        .routes(routes!(jobs::task_logs))
        .routes(routes!(access::exec))
        .routes(routes!(access::forward))
        .routes(routes!(access::upload))
        .routes(routes!(access::download))
        .routes(routes!(access::sftp))
        .routes(routes!(listen::listen))
        .routes(routes!(ssh::ssh))
        .routes(routes!(leases::statement))
        .routes(routes!(leases::ledger))
        .routes(routes!(node::wallet))
        .routes(routes!(node::settle))
}

/// The router with every route; unknown paths and methods answer problems too.
pub fn router(state: ApiState) -> Router {
    let (router, _) = api_router().split_for_parts();
    router
        .fallback(problem::no_route)
        .method_not_allowed_fallback(problem::wrong_method)
        .with_state(state)
}

/// `GET /v1/openapi.json`: this document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "getOpenApi",
    tag = "node",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of this API (the text of docs/openapi.json)",
            content_type = "application/json", body = Object),
    )
)]
async fn openapi_json() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        document(),
    )
        .into_response()
}

/// Problems starting the API.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Another daemon answers on this home's socket.
    #[error("a node is already running on {0}; stop it first or use another --home")]
    AlreadyRunning(PathBuf),
    /// Socket setup failed.
    #[error("cannot serve the control API on {path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Fails when a daemon already answers on this home's socket (checked before starting the
/// network, so a second daemon never touches the first one's peers).
pub async fn ensure_not_running(home: &Path) -> Result<(), ServeError> {
    let path = socket_path(home);
    if path.exists() && tokio::net::UnixStream::connect(&path).await.is_ok() {
        return Err(ServeError::AlreadyRunning(path));
    }
    Ok(())
}

/// Binds `<home>/api.sock` (replacing a stale socket, refusing a live one), restricts it to
/// mode 0600, and serves until `cancel`. Returns once bound.
pub async fn serve(
    home: &Path,
    state: ApiState,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    let path = socket_path(home);
    let io = |source| ServeError::Io {
        path: path.clone(),
        source,
    };
    if path.exists() {
        if tokio::net::UnixStream::connect(&path).await.is_ok() {
            return Err(ServeError::AlreadyRunning(path));
        }
        std::fs::remove_file(&path).map_err(io)?;
    }
    let listener = tokio::net::UnixListener::bind(&path).map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // The home directory is 0700 (see `Home::init`), so nobody else can reach the socket
        // before this; 0600 keeps it private even if the directory is opened up.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    let app = router(state);
    let remove = path.clone();
    Ok(tokio::spawn(async move {
        let shutdown = cancel.clone();
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
        {
            tracing::warn!(error = %e, "control API stopped");
        }
        let _ = std::fs::remove_file(&remove);
    }))
}
