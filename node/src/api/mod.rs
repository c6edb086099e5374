//! The local control API: HTTP/1.1 with JSON bodies on a Unix socket in the node's home
//! (`<home>/api.sock`, mode 0600, in a 0700 directory), versioned paths under `/v1`.
//! The CLI ([`client`]) is a typed client of it; `docs/api.md` describes every route.
//!
//! Invariant: the API only reads and asks; it never holds the swarm or the store. Every handler
//! goes through the network [`Client`] (bounded channel to the swarm task) or the lease service.

pub mod client;
pub mod types;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::Router;
use axum::extract::Path as UrlPath;
use axum::extract::{Query as QueryParams, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use gridlease_contracts::Money;
use gridlease_contracts::book::BookEntry;
use gridlease_contracts::query::Query;
use gridlease_protocol::{LeaseId, NetworkPolicy, OfferId, RejectReason};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::lease::{
    ExtendError, ExtendRequest, Extended, LeaseError, LeaseService, LeaseView, Ledger,
    ProvideError, ProvideSettings, RentError, RentRequest,
};
use crate::net::Client;
use types::{
    BegunView, ErrorBody, GpusView, ImageCacheView, OfferRow, OwnOfferView, PeerView, ProvideBody,
    RentedView, StatusView, StoppingView,
};

/// Socket file name inside the home.
pub const SOCKET_FILE: &str = "api.sock";
/// Most rows one search returns.
pub const MAX_SEARCH_LIMIT: usize = 10_000;

/// The socket path of a home.
pub fn socket_path(home: &Path) -> PathBuf {
    home.join(SOCKET_FILE)
}

/// What handlers can reach.
#[derive(Clone)]
pub struct ApiState {
    /// The network actor.
    pub client: Client,
    /// When the daemon started.
    pub started: Instant,
    /// Local GPUs (found or declared at start).
    pub gpus: Arc<GpusView>,
    /// Addresses configured as publicly reachable.
    pub external_addrs: Vec<String>,
    /// Leases: renting, providing, logs, ledger.
    pub leases: LeaseService,
}

/// A handler failure: HTTP status plus an [`ErrorBody`].
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: ErrorBody,
}

impl ApiError {
    /// 400 with a message and an optional hint.
    pub fn bad_request(error: impl Into<String>, hint: Option<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            body: ErrorBody {
                error: error.into(),
                hint,
            },
        }
    }

    /// 404.
    pub fn not_found(error: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            body: ErrorBody {
                error: error.into(),
                hint: None,
            },
        }
    }

    /// 409 for a refusal by the other side (a rejected lease).
    pub fn conflict(error: impl Into<String>, hint: Option<String>) -> Self {
        Self {
            status: StatusCode::CONFLICT,
            body: ErrorBody {
                error: error.into(),
                hint,
            },
        }
    }

    /// 500 for failures inside the node.
    pub fn internal(error: impl std::fmt::Display) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: ErrorBody {
                error: error.to_string(),
                hint: Some("see the node's log".into()),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

/// The router with every route.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/peers", get(peers))
        .route("/v1/offers", get(offers))
        .route("/v1/offers/{id}", get(offer))
        .route("/v1/gpus", get(gpus))
        .route("/v1/provide", put(provide))
        .route("/v1/leases", get(leases).post(rent))
        .route("/v1/leases/{id}", get(lease))
        .route("/v1/leases/{id}/logs", get(logs))
        .route("/v1/leases/{id}/stop", post(stop))
        .route("/v1/leases/{id}/begin", post(begin))
        .route("/v1/leases/{id}/extend", post(extend))
        .route("/v1/leases/{id}/exec", post(exec))
        .route("/v1/leases/{id}/forward/{port}", post(forward))
        .route("/v1/leases/{id}/upload", post(upload))
        .route("/v1/leases/{id}/download", post(download))
        .route("/v1/ledger", get(ledger))
        .with_state(state)
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

async fn status(State(s): State<ApiState>) -> Result<Json<StatusView>, ApiError> {
    let c = &s.client;
    let listen = c.listen_addrs().await.map_err(ApiError::internal)?;
    let peers = c.connected_peers().await.map_err(ApiError::internal)?;
    let offers = c.book_len().await.map_err(ApiError::internal)?;
    let own = c.own_offer().await.map_err(ApiError::internal)?;
    let (cache, limits) = s.leases.image_cache().await;
    Ok(Json(StatusView {
        image_cache: ImageCacheView {
            images: cache.images,
            bytes: cache.bytes,
            max_images: limits.max_images,
            max_bytes: limits.max_bytes,
        },
        peer_id: c.peer_id().to_string(),
        network: c.network().to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        uptime_s: s.started.elapsed().as_secs(),
        listen_addrs: listen.iter().map(ToString::to_string).collect(),
        connected_peers: peers.len(),
        offers_known: offers,
        nat_status: if s.external_addrs.is_empty() {
            "unknown".into()
        } else {
            "public".into()
        },
        own_offer: own.map(|o| OwnOfferView {
            id: o.id.to_string(),
            seq: o.offer.seq,
            gpus: o.offer.gpus.len(),
            price_per_gpu_hour: Money::from_micros(o.offer.price_per_gpu_hour).to_string(),
            expires_at_ms: o.offer.expires_at.0,
            ram_mib_per_gpu: o.offer.per_gpu.ram_mib,
            cpu_millicores_per_gpu: o.offer.per_gpu.cpu_millicores,
            disk_gib_per_gpu: o.offer.per_gpu.disk_gib,
        }),
    }))
}

async fn peers(State(s): State<ApiState>) -> Result<Json<Vec<PeerView>>, ApiError> {
    let c = &s.client;
    let connected = c.connected_peers().await.map_err(ApiError::internal)?;
    let mesh = c.mesh_peers().await.map_err(ApiError::internal)?;
    let mut out = Vec::with_capacity(connected.len());
    for p in connected {
        let score = c.peer_score(p).await.map_err(ApiError::internal)?;
        out.push(PeerView {
            peer_id: p.to_string(),
            score,
            in_mesh: mesh.contains(&p),
        });
    }
    out.sort_by(|a, b| a.peer_id.cmp(&b.peer_id));
    Ok(Json(out))
}

/// Query string of `GET /v1/offers`.
#[derive(Debug, Deserialize)]
pub struct OffersParams {
    /// The search query (see `docs/search.md`); empty matches everything.
    #[serde(default)]
    pub q: String,
    /// Sort key, e.g. `price`, `-fp16_tflops`, `price_per_tflop`.
    pub sort: Option<String>,
    /// Most rows (default 20).
    pub limit: Option<usize>,
}

async fn offers(
    State(s): State<ApiState>,
    QueryParams(p): QueryParams<OffersParams>,
) -> Result<Json<Vec<OfferRow>>, ApiError> {
    let text = match &p.sort {
        Some(k) if !k.trim().is_empty() => format!("{} sort:{}", p.q, k.trim()),
        _ => p.q.clone(),
    };
    let query = Query::parse(&text).map_err(|e| {
        ApiError::bad_request(
            format!("invalid query\n{}", e.render(&text)),
            Some(format!(
                "fields: {} (types and examples: `gridlease search --help`)",
                gridlease_contracts::query::Field::ALL
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        )
    })?;
    // Fully rented offers are left out unless the query asks about `free` itself.
    let mut query = query;
    if !query
        .conditions
        .iter()
        .any(|c| c.field == gridlease_contracts::query::Field::Free)
        && let Ok(free) = Query::parse("free>=1")
    {
        query.conditions.extend(free.conditions);
    }
    let limit = p.limit.unwrap_or(20).clamp(1, MAX_SEARCH_LIMIT);
    let rows = s
        .client
        .search(query, limit)
        .await
        .map_err(ApiError::internal)?;
    let now = crate::clock::now();
    Ok(Json(rows.iter().map(|e| offer_row(e, now)).collect()))
}

/// One search row from a book entry.
pub fn offer_row(e: &BookEntry, now: gridlease_protocol::Timestamp) -> OfferRow {
    let n = &e.summary.numbers;
    let mut models: Vec<&str> = e.offer.gpus.iter().map(|g| g.spec.model.as_str()).collect();
    models.dedup();
    OfferRow {
        id: e.id.to_string(),
        provider: e.offer.provider.to_string(),
        gpu: models.join(", "),
        gpus: n.gpus,
        free_gpus: n.free_gpus,
        vram_gib: (f64::from(n.vram_mib) / 1024.0 * 10.0).round() / 10.0,
        fp16_tflops: f64::from(n.fp16_gflops) / 1000.0,
        fp32_tflops: f64::from(n.fp32_gflops) / 1000.0,
        price_per_gpu_hour: Money::from_micros(n.price).to_string(),
        price_per_tflop: (n.price_per_tflop != u64::MAX)
            .then(|| Money::from_micros(n.price_per_tflop).to_string()),
        verified: n.verified,
        age_s: now.ms_since(e.offer.created_at) / 1000,
        region: e.offer.region.clone(),
        min_billed_s: e.offer.min_billed_s,
        max_duration_s: e.offer.max_duration_s,
        access: e.offer.sandbox.access,
        isolation: e.offer.sandbox.isolation,
        output_retention_s: e.offer.sandbox.output_retention_s,
        upload_hold_s: e.offer.sandbox.upload_hold_s,
    }
}

/// `GET /v1/offers/{id}`: one offer of the book, whole (an id or unique prefix; a replaced
/// id resolves as `rent` resolves it).
async fn offer(
    State(s): State<ApiState>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<types::OfferDetail>, ApiError> {
    let (id, _) = resolve_offer(&s, &id).await?;
    let e = s
        .client
        .offer(id)
        .await
        .map_err(ApiError::internal)?
        .ok_or_else(|| ApiError::not_found(format!("offer {id} is no longer in the book")))?;
    let o = &e.offer;
    Ok(Json(types::OfferDetail {
        id: e.id.to_string(),
        provider: o
            .provider
            .peer_id()
            .map(|p| p.to_string())
            .unwrap_or_else(|_| o.provider.to_string()),
        seq: o.seq,
        created_at_ms: o.created_at.0,
        expires_at_ms: o.expires_at.0,
        gpus: o
            .gpus
            .iter()
            .map(|g| types::OfferGpu {
                model: g.spec.model.clone(),
                vram_mib: g.spec.vram_mib,
                driver_version: g.spec.driver_version.clone(),
                cuda_version: g.spec.cuda_version.clone(),
                compute_capability: format!(
                    "{}.{}",
                    g.spec.compute_capability.major, g.spec.compute_capability.minor
                ),
                pcie: format!("gen {} x{}", g.spec.pcie_gen, g.spec.pcie_width),
                power_limit_w: g.spec.power_limit_w,
                fp32_gflops: g.bench.fp32_gflops,
                fp16_gflops: g.bench.fp16_gflops,
                device_mem_mbps: g.bench.device_mem_mbps,
                h2d_mbps: g.bench.h2d_mbps,
                attestation: match g.bench.attestation {
                    gridlease_protocol::Attestation::Measured => "measured".into(),
                    gridlease_protocol::Attestation::Declared => "declared".into(),
                },
            })
            .collect(),
        per_gpu: o.per_gpu,
        price_per_gpu_hour: Money::from_micros(o.price_per_gpu_hour).to_string(),
        min_duration_s: o.min_duration_s,
        max_duration_s: o.max_duration_s,
        min_billed_s: o.min_billed_s,
        usage_interval_s: o.usage_interval_s,
        pay_ahead_s: o.pay_ahead_s,
        network: match o.sandbox.network {
            NetworkPolicy::None => "none".into(),
            NetworkPolicy::Egress => "egress".into(),
        },
        image_prefixes: o.sandbox.image_prefixes.clone(),
        access: o.sandbox.access,
        isolation: o.sandbox.isolation,
        output_retention_s: o.sandbox.output_retention_s,
        upload_hold_s: o.sandbox.upload_hold_s,
        addrs: o.addrs.clone(),
        region: o.region.clone(),
    }))
}

async fn gpus(State(s): State<ApiState>) -> Json<GpusView> {
    Json((*s.gpus).clone())
}

/// Finds the one lease whose id starts with `prefix` (hex).
async fn resolve_lease(s: &ApiState, prefix: &str) -> Result<LeaseId, ApiError> {
    if let Ok(id) = prefix.parse::<LeaseId>() {
        return Ok(id);
    }
    let all = s.leases.leases().await.map_err(ApiError::internal)?;
    let hits: Vec<LeaseId> = all
        .iter()
        .map(|v| v.lease_id)
        .filter(|id| id.to_string().starts_with(&prefix.to_ascii_lowercase()))
        .collect();
    match hits.as_slice() {
        [one] => Ok(*one),
        [] => Err(ApiError::not_found(format!(
            "no lease {prefix} on this node"
        ))),
        _ => Err(ApiError::bad_request(
            format!(
                "lease id prefix {prefix} is ambiguous ({} leases)",
                hits.len()
            ),
            Some("give more digits".into()),
        )),
    }
}

/// Finds the one offer in the book whose id starts with `prefix` (hex). An id that its
/// provider has since replaced (offers are re-signed before they expire, so ids from an earlier
/// search age out) resolves to the provider's current offer when that has the same GPU models
/// at the same or a lower price, with a note saying so; otherwise it is a conflict naming the
/// current offer and its price.
async fn resolve_offer(s: &ApiState, prefix: &str) -> Result<(OfferId, Option<String>), ApiError> {
    let p = prefix.trim_end_matches('…').to_ascii_lowercase();
    if p.len() < 4 || p.len() > 64 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request(
            format!("{prefix:?} is not an offer id"),
            Some("use an id (or its first digits) from `gridlease search`".into()),
        ));
    }
    let hits = s
        .client
        .offer_ids(p.clone())
        .await
        .map_err(ApiError::internal)?;
    match hits.as_slice() {
        [one] => return Ok((*one, None)),
        [] => {}
        _ => {
            return Err(ApiError::bad_request(
                format!("offer id prefix {prefix} is ambiguous"),
                Some("give more digits".into()),
            ));
        }
    }
    let replaced = s
        .client
        .replaced_offers(p.clone())
        .await
        .map_err(ApiError::internal)?;
    match replaced.as_slice() {
        [] => Err(ApiError::not_found(format!(
            "offer {prefix} is not in this node's book (it may have expired); search again"
        ))),
        [r] if r.equivalent => Ok((
            r.current.id,
            Some(format!(
                "offer {} was re-signed by its provider as {} (same GPUs, {}/GPU-hour); renting that",
                r.old.short(),
                r.current.id.short(),
                Money::from_micros(r.current.offer.price_per_gpu_hour)
            )),
        )),
        [r] => Err(ApiError::conflict(
            format!(
                "offer {} was replaced by its provider: now {} ({}, {}/GPU-hour, was {})",
                r.old.short(),
                r.current.id.short(),
                r.current.summary.models_lower,
                Money::from_micros(r.current.offer.price_per_gpu_hour),
                Money::from_micros(r.old_price_per_gpu_hour)
            ),
            Some(format!(
                "rent {} to accept the new terms, or search again",
                r.current.id.short()
            )),
        )),
        _ => Err(ApiError::bad_request(
            format!("offer id prefix {prefix} is ambiguous"),
            Some("give more digits".into()),
        )),
    }
}

fn lease_err(e: LeaseError) -> ApiError {
    match e {
        LeaseError::Unknown(id) => ApiError::not_found(format!("no lease {id} on this node")),
        other => ApiError::internal(other),
    }
}

async fn leases(State(s): State<ApiState>) -> Result<Json<Vec<LeaseView>>, ApiError> {
    Ok(Json(s.leases.leases().await.map_err(lease_err)?))
}

async fn lease(
    State(s): State<ApiState>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<LeaseView>, ApiError> {
    let id = resolve_lease(&s, &id).await?;
    s.leases
        .lease(id)
        .await
        .map_err(lease_err)?
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("no lease {id} on this node")))
}

async fn rent(
    State(s): State<ApiState>,
    Json(mut req): Json<RentRequest>,
) -> Result<Json<RentedView>, ApiError> {
    let (offer, note) = resolve_offer(&s, &req.offer).await?;
    if req.duration_s == 0 {
        return Err(ApiError::bad_request("the duration must be positive", None));
    }
    req.offer = offer.to_string();
    match s.leases.rent(req).await {
        Ok(id) => Ok(Json(RentedView {
            lease_id: id.to_string(),
            note,
            min_billed_s: match s.leases.lease(id).await {
                Ok(Some(v)) => v.min_billed_s,
                _ => 0,
            },
        })),
        Err(RentError::Rejected(reason)) => Err(ApiError::conflict(
            format!("the provider rejected the lease: {}", reject_text(&reason)),
            Some("pick another offer with `gridlease search`".into()),
        )),
        Err(e @ RentError::UnknownOffer(_)) => Err(ApiError::not_found(e.to_string())),
        Err(e @ RentError::KeepOutputs { .. }) => Err(ApiError::bad_request(
            e.to_string(),
            Some("ask for less with --keep-outputs, or copy results out while it runs".into()),
        )),
        Err(e @ RentError::UploadHold { .. }) => Err(ApiError::bad_request(
            e.to_string(),
            Some("upload with `gridlease cp` once the lease runs, or pick an offer that holds containers for uploads".into()),
        )),
        Err(e) => Err(ApiError::internal(e)),
    }
}

/// Why the renter may not set the environment variable `name`, in words.
pub fn env_text(name: &str) -> String {
    let upper = name.to_ascii_uppercase();
    if upper.starts_with("CUDA_VISIBLE_DEVICES") || upper.starts_with("NVIDIA_") {
        format!("env {name} is set by the provider to the leased GPUs")
    } else {
        format!("env {name} may not be set by the renter (it changes how every program is loaded)")
    }
}

/// A provider's refusal in words (the error message of a rejected `POST /v1/leases`).
fn reject_text(r: &RejectReason) -> String {
    match r {
        RejectReason::UnknownOffer => "the provider does not hold this offer any more".into(),
        RejectReason::StaleOffer { current_seq } => {
            format!("the offer was replaced (now at sequence {current_seq}); search again")
        }
        RejectReason::OfferExpired => "the offer expired".into(),
        RejectReason::RequestExpired => "the request expired before the provider handled it".into(),
        RejectReason::WrongProvider => "the terms name another provider".into(),
        RejectReason::PriceBelowAsk { ask } => {
            format!(
                "the price is below the ask of {}/GPU-hour",
                Money::from_micros(*ask)
            )
        }
        RejectReason::NoCapacity { free } => format!("only {free} GPU(s) are free"),
        RejectReason::DurationOutOfBounds { min_s, max_s } => {
            format!("the duration must be between {min_s} s and {max_s} s")
        }
        RejectReason::TermsMismatch { field } => {
            format!("the terms differ from the offer in `{field}`")
        }
        RejectReason::ImageRefused { refusal } => gridlease_contracts::image::refusal_text(refusal),
        RejectReason::EnvNotAllowed { name } => env_text(name),
        RejectReason::NetworkNotAllowed => {
            "the provider's policy does not allow network access".into()
        }
        RejectReason::BudgetTooSmall { needed } => format!(
            "the budget cannot pay the minimum billed time ({} needed)",
            Money::from_micros(*needed)
        ),
        RejectReason::DuplicateNonce => "a request with this nonce had other terms".into(),
        RejectReason::Malformed { detail } => format!("the request is malformed: {detail}"),
        RejectReason::Internal => "the provider failed internally; try another offer".into(),
    }
}

async fn stop(
    State(s): State<ApiState>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<StoppingView>, ApiError> {
    let id = resolve_lease(&s, &id).await?;
    s.leases.stop(id).await.map_err(lease_err)?;
    Ok(Json(StoppingView {
        lease_id: id.to_string(),
        stopping: true,
    }))
}

/// `POST /v1/leases/{id}/begin` (renter): the provider starts the command of a container it
/// holds for uploads (`rent --upload`); 200 also when it already runs; 404 for an unknown
/// lease; 500 with the provider's answer when it could not be told.
async fn begin(
    State(s): State<ApiState>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<BegunView>, ApiError> {
    let id = resolve_lease(&s, &id).await?;
    s.leases.begin(id).await.map_err(lease_err)?;
    Ok(Json(BegunView {
        lease_id: id.to_string(),
        begun: true,
    }))
}

/// `POST /v1/leases/{id}/extend`: 200 with the new terms; 409 with the reason when refused
/// (by the provider, or here by the same rule); 400 for a bad request or a lease this node
/// provides; 404 for an unknown lease; 502 when the provider gave no usable answer (the
/// extension stays pending and is sent again by the next call).
async fn extend(
    State(s): State<ApiState>,
    UrlPath(id): UrlPath<String>,
    Json(req): Json<ExtendRequest>,
) -> Result<Json<Extended>, ApiError> {
    let id = resolve_lease(&s, &id).await?;
    match s.leases.extend(id, req).await {
        Ok(x) => Ok(Json(x)),
        Err(e @ ExtendError::Refused(_)) => Err(ApiError::conflict(
            format!("lease {} cannot be extended: {e}", id.short()),
            None,
        )),
        Err(e @ (ExtendError::BadRequest(_) | ExtendError::NotRenter(_))) => {
            Err(ApiError::bad_request(e.to_string(), None))
        }
        Err(e @ ExtendError::Unknown(_)) => Err(ApiError::not_found(e.to_string())),
        Err(e @ ExtendError::Remote { .. }) => Err(ApiError {
            status: StatusCode::BAD_GATEWAY,
            body: ErrorBody {
                error: e.to_string(),
                hint: Some("run the same `extend` again once the provider is reachable".into()),
            },
        }),
        Err(e) => Err(ApiError::internal(e)),
    }
}

/// Most bytes of an exec request body.
const MAX_EXEC_BODY: usize = 128 * 1024;

/// `POST /v1/leases/{id}/exec` with `Upgrade: gridlease-access`: opens a shell or a command
/// in the lease's container (through its provider) and, once granted, answers 101 and carries
/// the exec frames on the upgraded connection.
async fn exec(
    State(s): State<ApiState>,
    UrlPath(id): UrlPath<String>,
    mut req: axum::extract::Request,
) -> Result<Response, ApiError> {
    let upgrade = hyper::upgrade::on(&mut req);
    let body = axum::body::to_bytes(req.into_body(), MAX_EXEC_BODY)
        .await
        .map_err(|e| ApiError::bad_request(format!("exec request body: {e}"), None))?;
    let ask: types::ExecBody = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("exec request body: {e}"), None))?;
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
async fn forward(
    State(s): State<ApiState>,
    UrlPath((id, port)): UrlPath<(String, u16)>,
    mut req: axum::extract::Request,
) -> Result<Response, ApiError> {
    let upgrade = hyper::upgrade::on(&mut req);
    let lease_id = resolve_lease(&s, &id).await?;
    let request = gridlease_protocol::access::AccessRequest::Forward { lease_id, port };
    splice(&s, request, upgrade).await
}

/// Body of `POST /v1/leases/{id}/upload` and `/download`.
#[derive(Debug, Default, Deserialize)]
struct TransferBody {
    #[serde(default)]
    dest: String,
    #[serde(default)]
    path: String,
}

async fn transfer_body(req: axum::extract::Request) -> Result<TransferBody, ApiError> {
    let body = axum::body::to_bytes(req.into_body(), MAX_EXEC_BODY)
        .await
        .map_err(|e| ApiError::bad_request(format!("request body: {e}"), None))?;
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("request body: {e}"), None))
}

/// `POST /v1/leases/{id}/upload` (`{"dest": PATH}`) with `Upgrade: gridlease-access`: a tar
/// stream into the lease's workspace (`gridlease cp SRC LEASE:PATH`).
async fn upload(
    State(s): State<ApiState>,
    UrlPath(id): UrlPath<String>,
    req: axum::extract::Request,
) -> Result<Response, ApiError> {
    transfer(&s, &id, req, |lease_id, b| {
        gridlease_protocol::access::AccessRequest::Upload {
            lease_id,
            dest: b.dest,
        }
    })
    .await
}

/// `POST /v1/leases/{id}/download` (`{"path": PATH}`) with `Upgrade: gridlease-access`: a
/// tar stream of a workspace path (`gridlease cp LEASE:PATH DST`).
async fn download(
    State(s): State<ApiState>,
    UrlPath(id): UrlPath<String>,
    req: axum::extract::Request,
) -> Result<Response, ApiError> {
    transfer(&s, &id, req, |lease_id, b| {
        gridlease_protocol::access::AccessRequest::Download {
            lease_id,
            path: b.path,
        }
    })
    .await
}

/// The upload and download routes: the body, the lease, then [`splice`].
async fn transfer(
    s: &ApiState,
    id: &str,
    mut req: axum::extract::Request,
    make: impl FnOnce(LeaseId, TransferBody) -> gridlease_protocol::access::AccessRequest,
) -> Result<Response, ApiError> {
    let upgrade = hyper::upgrade::on(&mut req);
    let body = transfer_body(req).await?;
    let lease_id = resolve_lease(s, id).await?;
    splice(s, make(lease_id, body), upgrade).await
}

/// Opens the access stream, then answers 101 and copies bytes both ways between the
/// upgraded connection and the stream (fixed buffers; each side's flow control holds the
/// other back).
async fn splice(
    s: &ApiState,
    request: gridlease_protocol::access::AccessRequest,
    upgrade: hyper::upgrade::OnUpgrade,
) -> Result<Response, ApiError> {
    use crate::access::OpenError;
    let kind = request.kind();
    let stream = crate::access::open(&s.client, &s.leases, request)
        .await
        .map_err(|e| match e {
            OpenError::Unknown(_) => ApiError::not_found(e.to_string()),
            OpenError::NotRenter(_) => ApiError::bad_request(e.to_string(), None),
            OpenError::Refused(ref r) => ApiError::conflict(
                e.to_string(),
                matches!(
                    r,
                    gridlease_protocol::access::AccessRefusal::NotRunning { .. }
                )
                .then(|| "see `gridlease leases`".to_string()),
            ),
            OpenError::Unsupported => ApiError::conflict(e.to_string(), None),
            OpenError::Unreachable(_) => ApiError {
                status: StatusCode::BAD_GATEWAY,
                body: ErrorBody {
                    error: e.to_string(),
                    hint: Some("check `gridlease peers`, then retry".into()),
                },
            },
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
        let r = tokio::io::copy_bidirectional_with_sizes(
            &mut up,
            &mut stream,
            crate::access::SPLICE_BUFFER,
            crate::access::SPLICE_BUFFER,
        )
        .await;
        tracing::debug!(kind = kind.name(), result = ?r, "access stream closed");
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(axum::http::header::CONNECTION, "upgrade")
        .header(axum::http::header::UPGRADE, types::ACCESS_UPGRADE)
        .body(axum::body::Body::empty())
        .map_err(ApiError::internal)
}

/// Query string of `GET /v1/leases/{id}/logs`.
#[derive(Debug, Deserialize)]
pub struct LogsParams {
    /// Byte offset to read from.
    #[serde(default)]
    pub from: u64,
}

/// Header carrying the offset to ask for next.
pub const NEXT_OFFSET_HEADER: &str = "x-gridlease-next-offset";
/// Header present once no more output will come.
pub const EOF_HEADER: &str = "x-gridlease-eof";
/// Header carrying the container's exit code once known.
pub const EXIT_CODE_HEADER: &str = "x-gridlease-exit-code";

async fn logs(
    State(s): State<ApiState>,
    UrlPath(id): UrlPath<String>,
    QueryParams(p): QueryParams<LogsParams>,
) -> Result<Response, ApiError> {
    let id = resolve_lease(&s, &id).await?;
    let chunk = s.leases.logs(id, p.from).await.map_err(lease_err)?;
    let mut resp = (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        chunk.data,
    )
        .into_response();
    let h = resp.headers_mut();
    if let Ok(v) = chunk.next_offset.to_string().parse() {
        h.insert(NEXT_OFFSET_HEADER, v);
    }
    if chunk.eof
        && let Ok(v) = "1".parse()
    {
        h.insert(EOF_HEADER, v);
    }
    if let Some(code) = chunk.exit_code
        && let Ok(v) = code.to_string().parse()
    {
        h.insert(EXIT_CODE_HEADER, v);
    }
    Ok(resp)
}

async fn ledger(State(s): State<ApiState>) -> Result<Json<Ledger>, ApiError> {
    Ok(Json(s.leases.ledger().await.map_err(lease_err)?))
}

async fn provide(
    State(s): State<ApiState>,
    Json(b): Json<ProvideBody>,
) -> Result<Json<StatusView>, ApiError> {
    // What the request leaves out stays as the last `provide` set it.
    let current = s.leases.provide_settings();
    let price = match (&b.price, &current) {
        (Some(p), _) => {
            let m = p.parse::<Money>().map_err(|e| {
                ApiError::bad_request(e.to_string(), Some("e.g. --price 0.40".into()))
            })?;
            if m == Money::ZERO && !b.off {
                return Err(ApiError::bad_request(
                    "the price must be above 0",
                    Some("e.g. `gridlease provide --price 0.40`".into()),
                ));
            }
            m
        }
        (None, Some(c)) => c.price_per_gpu_hour,
        (None, None) if b.off => Money::ZERO,
        (None, None) => {
            return Err(ApiError::bad_request(
                "a price is needed to provide",
                Some("e.g. `gridlease provide --price 0.40`".into()),
            ));
        }
    };
    if b.max_hours == Some(0) {
        return Err(ApiError::bad_request(
            "the longest lease must be at least 1 hour",
            Some("e.g. --max-hours 24".into()),
        ));
    }
    let network_policy = match b.network_policy.as_deref() {
        None => current
            .as_ref()
            .map_or(NetworkPolicy::None, |c| c.network_policy),
        Some("none") => NetworkPolicy::None,
        Some("egress") => NetworkPolicy::Egress,
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("network policy {other:?} is not none or egress"),
                None,
            ));
        }
    };
    let gpus = match b.gpus {
        Some(g) if g.len() == 1 && g[0] == "all" => None,
        Some(g) => Some(g),
        None => current.as_ref().and_then(|c| c.gpus.clone()),
    };
    // The first `provide` starts from the node's configured image rules.
    let mut images = match &current {
        Some(c) => c.images.clone(),
        None => s.leases.base_images(),
    };
    if let Some(r) = &b.registries {
        images.registries = r.clone();
    }
    if let Some(p) = &b.image_prefixes {
        images.prefixes = p.clone();
    }
    if let Some(l) = &b.local_images {
        images.local_images = l.clone();
    }
    if let Some(g) = b.max_image_gib {
        images.max_compressed_bytes = g.saturating_mul(1 << 30);
    }
    if let Some(g) = b.max_unpacked_gib {
        images.max_unpacked_bytes = g.saturating_mul(1 << 30);
    }
    gridlease_contracts::image::check_policy(&images)
        .map_err(|e| ApiError::bad_request(format!("image policy: {e}"), None))?;
    let settings = ProvideSettings {
        price_per_gpu_hour: price,
        gpus,
        max_hours: b.max_hours.or(current.as_ref().and_then(|c| c.max_hours)),
        network_policy,
        images,
        enabled: !b.off,
    };
    match s.leases.provide(settings).await {
        Ok(()) => status(State(s)).await,
        Err(e @ (ProvideError::NoGpus | ProvideError::NoMatchingGpus)) => {
            Err(ApiError::bad_request(e.to_string(), None))
        }
        Err(e) => Err(ApiError::internal(e)),
    }
}
