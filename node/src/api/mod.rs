//! The local control API: HTTP/1.1 with JSON bodies on a Unix socket in the node's home
//! (`<home>/api.sock`, mode 0600, in a 0700 directory), versioned paths under `/v1`.
//! The CLI ([`client`]) is a typed client of it. Its OpenAPI document is generated from the
//! routes below ([`api_router`], [`openapi`]) and committed as `docs/openapi.json`; every error
//! answer is a [`Problem`] (`application/problem+json`); `docs/api.md` is the overview.
//!
//! Invariant: the API only reads and asks; it never holds the swarm or the store. Every handler
//! goes through the network [`Client`] (bounded channel to the swarm task) or the lease service.

pub mod client;
pub mod openapi;
pub mod problem;
pub mod types;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use gridlease_contracts::Money;
use gridlease_contracts::book::BookEntry;
use gridlease_contracts::query::Query;
use gridlease_contracts::schedule::Schedule;
use gridlease_protocol::{LeaseId, NetworkPolicy, OfferId, RejectReason};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::lease::{
    ExtendError, ExtendRequest, Extended, LeaseError, LeaseService, LeaseView, Ledger,
    ProvideError, ProvideSettings, RentError, RentRequest,
};
use crate::net::Client;
pub use problem::{ApiError, Problem, ProblemType};
use problem::{ApiJson, ApiPath, ApiQuery, ProblemType as P};
use types::{
    BegunView, ConnectionView, GpusView, ImageCacheView, OfferRow, OwnOfferView, PeerView,
    ProvideBody, RentedView, ScheduleView, StatusView, StoppingView,
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
    /// Leases: renting, providing, logs, ledger.
    pub leases: LeaseService,
}

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
    ),
    // The access routes' header schemas (header parameters are not collected from routes).
    components(schemas(types::AccessUpgrade, types::ConnectionUpgrade))
)]
struct ApiDoc;

/// Every route with its OpenAPI description (one list: a route cannot exist undocumented).
pub fn api_router() -> OpenApiRouter<ApiState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(openapi_json))
        .routes(routes!(status))
        .routes(routes!(peers))
        .routes(routes!(offers))
        .routes(routes!(offer))
        .routes(routes!(gpus))
        .routes(routes!(provide))
        .routes(routes!(leases, rent))
        .routes(routes!(lease))
        .routes(routes!(logs))
        .routes(routes!(telemetry))
        .routes(routes!(stop))
        .routes(routes!(begin))
        .routes(routes!(extend))
        .routes(routes!(exec))
        .routes(routes!(forward))
        .routes(routes!(upload))
        .routes(routes!(download))
        .routes(routes!(statement))
        .routes(routes!(ledger))
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
        openapi::document(),
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

/// `GET /v1/status`.
#[utoipa::path(
    get,
    path = "/v1/status",
    operation_id = "getStatus",
    tag = "node",
    summary = "Identity, addresses, reachability, peers, offers known, own offer, image cache",
    responses(
        (status = 200, description = "This node now", body = StatusView),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn status(State(s): State<ApiState>) -> Result<Json<StatusView>, ApiError> {
    let c = &s.client;
    // Asked at once: the network loop answers them in one pass, so a busy node (a flood of
    // connections) still answers `status` in one wait, not six.
    let own_with_numbers = async {
        let own = c.own_offer().await?;
        // The own offer's summary in the own book carries the score search shows.
        let numbers = match &own {
            Some(o) => c.offer(o.id).await?.map(|e| e.summary.numbers),
            None => None,
        };
        Ok::<_, crate::net::NegotiationError>((own, numbers))
    };
    let (listen, peers, offers, (own, own_numbers), reach) = tokio::try_join!(
        c.listen_addrs(),
        c.connected_peers(),
        c.book_len(),
        own_with_numbers,
        c.reachability(),
    )
    .map_err(ApiError::internal)?;
    let (cache, limits) = s.leases.image_cache().await;
    let text = |v: &[libp2p::Multiaddr]| v.iter().map(ToString::to_string).collect();
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
        offers_restoring: {
            let p = c.restore_progress();
            (!p.done).then(|| p.left())
        },
        nat_status: reach.nat_status.to_string(),
        reachable_addrs: text(&reach.reachable),
        unreachable_addrs: text(&reach.unreachable),
        external_addrs: text(&reach.external),
        relays: reach.relays.iter().map(ToString::to_string).collect(),
        schedule: s.leases.schedule().map(|n| ScheduleView {
            text: n.sentence(),
            hours: n.hours,
            tz: n.zone,
            offered: n.availability.offered,
            until_ms: n.availability.until.map(|t| t.0),
        }),
        own_offer: own.map(|o| OwnOfferView {
            id: o.id.to_string(),
            seq: o.offer.seq,
            gpus: o.offer.gpus.len(),
            price_per_gpu_hour: Money::from_micros(o.offer.price_per_gpu_hour).to_string(),
            expires_at_ms: o.offer.expires_at.0,
            ram_mib_per_gpu: o.offer.per_gpu.ram_mib,
            cpu_millicores_per_gpu: o.offer.per_gpu.cpu_millicores,
            disk_gib_per_gpu: o.offer.per_gpu.disk_gib,
            rep: f64::from(
                own_numbers.map_or(gridlease_contracts::query::REP_PRIOR_PERMILLE, |n| {
                    n.rep_permille
                }),
            ) / 1000.0,
            completed: own_numbers.map_or(0, |n| n.completed),
            interruptible: o.offer.interruptible,
        }),
    }))
}

/// `GET /v1/peers`.
#[utoipa::path(
    get,
    path = "/v1/peers",
    operation_id = "listPeers",
    tag = "node",
    summary = "Connected peers with gossip score and mesh membership",
    responses(
        (status = 200, description = "Connected peers, by peer id", body = Vec<PeerView>),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn peers(State(s): State<ApiState>) -> Result<Json<Vec<PeerView>>, ApiError> {
    let c = &s.client;
    let connected = c.connected_peers().await.map_err(ApiError::internal)?;
    let mesh = c.mesh_peers().await.map_err(ApiError::internal)?;
    let mut out = Vec::with_capacity(connected.len());
    for p in connected {
        let score = c.peer_score(p).await.map_err(ApiError::internal)?;
        let connections = c
            .connections(p)
            .await
            .map_err(ApiError::internal)?
            .into_iter()
            .map(|k| ConnectionView {
                remote_addr: k.remote.to_string(),
                relayed: k.relayed,
            })
            .collect();
        out.push(PeerView {
            peer_id: p.to_string(),
            score,
            in_mesh: mesh.contains(&p),
            connections,
        });
    }
    out.sort_by(|a, b| a.peer_id.cmp(&b.peer_id));
    Ok(Json(out))
}

/// Query string of `GET /v1/offers`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OffersParams {
    /// The search query (see `docs/search.md`); empty matches every offer with a free GPU.
    #[serde(default)]
    pub q: String,
    /// Sort key: `price` (default), `fp16_tflops`, `fp32_tflops`, `price_per_tflop`, `vram`,
    /// `age` or `rep`; a leading `-` sorts descending. Given, it wins over a `sort:KEY` term of `q`.
    pub sort: Option<String>,
    /// Most rows.
    #[param(minimum = 1, maximum = 10000, default = 20)]
    pub limit: Option<usize>,
    /// A page cursor: the `x-gridlease-next-page` header of the previous page's answer. The
    /// rows that sort after the previous page's last row, under the same query and sort (offers
    /// admitted or gone between pages neither shift nor repeat the others).
    pub after: Option<String>,
}

/// The header of a search answer that names the next page's cursor (absent on the last page).
pub const NEXT_PAGE_HEADER: &str = "x-gridlease-next-page";
/// The header of an empty search answer from a node that follows only some GPU classes: those
/// classes, comma-separated (its book holds no other offers).
pub const FOLLOWED_CLASSES_HEADER: &str = "x-gridlease-followed-classes";
/// The header of a search answer given before the offers of the GPU classes it names were
/// all fetched (the node had just started following them): those classes, comma-separated.
pub const FETCHING_CLASSES_HEADER: &str = "x-gridlease-fetching-classes";
/// Longest a search waits for the offers of GPU classes it names and the node did not follow.
pub const CLASS_FETCH_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// Most GPU classes one search makes the node follow.
const MAX_CLASSES_PER_SEARCH: usize = 4;

/// On a node that follows only some GPU classes, a search whose `gpu=MODEL` conditions name
/// classes it does not follow (or follows for earlier searches only) has the node follow them
/// and fetch their offers first (`docs/protocol.md` 3c step 4), for at most
/// `wait` ([`CLASS_FETCH_WAIT`] in the API). Returns the classes whose fetch had not ended by
/// then (the answer's `x-gridlease-fetching-classes`).
pub async fn fetch_named_classes(
    client: &crate::net::Client,
    query: &Query,
    wait: std::time::Duration,
) -> Vec<String> {
    let Some(followed) = client.followed() else {
        return Vec::new();
    };
    let classes: Vec<String> = query
        .gpu_classes()
        .into_iter()
        .filter(|c| !followed.classes.contains(c) || followed.searched.contains(c))
        .take(MAX_CLASSES_PER_SEARCH)
        .collect();
    if classes.is_empty() {
        return Vec::new();
    }
    let deadline = tokio::time::Instant::now() + wait;
    let waits = classes.iter().map(|c| {
        let (client, c) = (client.clone(), c.clone());
        async move {
            tokio::time::timeout_at(deadline, client.search_class(c))
                .await
                .is_ok()
        }
    });
    let done = futures::future::join_all(waits).await;
    classes
        .into_iter()
        .zip(done)
        .filter(|(_, done)| !done)
        .map(|(c, _)| c)
        .collect()
}

/// `GET /v1/offers`: a search of the local book.
#[utoipa::path(
    get,
    path = "/v1/offers",
    operation_id = "searchOffers",
    tag = "offers",
    summary = "Search the offer book",
    params(OffersParams),
    responses(
        (status = 200, description = "Matching offers, in the sort order", body = Vec<OfferRow>,
            headers(
                ("x-gridlease-next-page" = String, description = "Present when more offers match: the cursor of the next page (pass it as `after`)"),
                ("x-gridlease-followed-classes" = String, description = "Present on an empty answer when the node follows only some GPU classes (`follow`): those classes, comma-separated; its book holds no offers of other classes"),
                ("x-gridlease-fetching-classes" = String, description = "Present when the query names GPU classes (`gpu=MODEL`) the node did not follow and their offers were still being fetched from the network after 5 s: those classes, comma-separated; the answer holds what had arrived, and the same search a little later holds more"),
            ),
            links(
                ("getOffer" = (operation_id = "getOffer", parameters(("id" = "$response.body#/0/id")),
                    description = "The first row's offer, whole")),
                ("rentOffer" = (operation_id = "rentOffer", request_body = json!({"offer": "$response.body#/0/id", "gpus": 1, "duration_s": 600}),
                    description = "Rent one GPU of the first row's offer for 10 minutes")),
            )),
        (status = 400, description = "A parameter is malformed (`invalid-parameter`: limit out of 1..10000, an unknown sort key, a cursor that is not one), or the query does not parse (`invalid-query`: the detail shows it with carets under the bad token)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn offers(
    State(s): State<ApiState>,
    ApiQuery(p): ApiQuery<OffersParams>,
) -> Result<Response, ApiError> {
    let limit = p.limit.unwrap_or(20);
    if !(1..=MAX_SEARCH_LIMIT).contains(&limit) {
        return Err(ApiError::new(
            P::InvalidParameter,
            format!("limit {limit} is not between 1 and {MAX_SEARCH_LIMIT}"),
        ));
    }
    let after = p
        .after
        .as_deref()
        .map(|a| {
            a.parse::<gridlease_contracts::book::Cursor>()
                .map_err(|e| ApiError::new(P::InvalidParameter, format!("after: {e}")))
        })
        .transpose()?;
    let fields = || {
        format!(
            "fields: {} (types and examples: `gridlease search --help`)",
            gridlease_contracts::query::Field::ALL
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let parsed = Query::parse(&p.q);
    let mut query = match parsed {
        Ok(q) if openapi::query_matches(&p.q) => q,
        Ok(_) => {
            return Err(ApiError::new(
                P::InvalidQuery,
                format!("invalid query\n{}", p.q),
            )
            .hint("terms are separated by single spaces, at most 31 conditions, a sort: term only last; see docs/search.md"));
        }
        Err(e) => {
            // An unknown field's message lists the fields already.
            let hint = match e.kind {
                gridlease_contracts::query::QueryErrorKind::UnknownField(_) => {
                    "types and examples: `gridlease search --help`".to_string()
                }
                _ => fields(),
            };
            return Err(ApiError::new(
                P::InvalidQuery,
                format!("invalid query\n{}", e.render(&p.q)),
            )
            .hint(hint));
        }
    };
    // The `sort` parameter, when given, is the order (over a `sort:` term of the query).
    if let Some(k) = &p.sort {
        query.sort = gridlease_contracts::query::SortKey::parse(k)
            .ok()
            .filter(|_| openapi::SORT.is_match(k))
            .ok_or_else(|| {
                ApiError::new(P::InvalidParameter, format!("sort {k:?} is not a sort key")).hint(
                    format!(
                        "{}; - before it sorts descending",
                        gridlease_contracts::query::SortField::names()
                    ),
                )
            })?;
    }
    // Fully rented offers are left out unless the query asks about `free` itself.
    if !query
        .conditions
        .iter()
        .any(|c| c.field == gridlease_contracts::query::Field::Free)
        && let Ok(free) = Query::parse("free>=1")
    {
        query.conditions.extend(free.conditions);
    }
    let fetching = fetch_named_classes(&s.client, &query, CLASS_FETCH_WAIT).await;
    let (rows, next) = s
        .client
        .search_page(query, limit, after)
        .await
        .map_err(ApiError::internal)?;
    let now = crate::clock::now();
    let rows: Vec<OfferRow> = rows.iter().map(|e| offer_row(e, now)).collect();
    let followed = if rows.is_empty() {
        s.client
            .followed_classes()
            .await
            .map_err(ApiError::internal)?
    } else {
        None
    };
    let mut answer = Json(rows).into_response();
    if !fetching.is_empty()
        && let Ok(v) = axum::http::HeaderValue::from_str(&fetching.join(","))
    {
        answer.headers_mut().insert(FETCHING_CLASSES_HEADER, v);
    }
    if let Some(classes) = followed
        && let Ok(v) = axum::http::HeaderValue::from_str(&classes.join(","))
    {
        answer.headers_mut().insert(FOLLOWED_CLASSES_HEADER, v);
    }
    if let Some(next) = next
        && let Ok(v) = axum::http::HeaderValue::from_str(&next.to_string())
    {
        answer.headers_mut().insert(NEXT_PAGE_HEADER, v);
    }
    Ok(answer)
}

/// One search row from a book entry.
pub fn offer_row(e: &BookEntry, now: gridlease_protocol::Timestamp) -> OfferRow {
    let n = &e.summary.numbers;
    let mut models: Vec<&str> = e.offer.gpus.iter().map(|g| g.spec.model.as_str()).collect();
    models.dedup();
    OfferRow {
        id: e.id.to_string(),
        handle: gridlease_contracts::book::offer_handle(&e.offer.provider),
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
        rep: f64::from(n.rep_permille) / 1000.0,
        completed: n.completed,
        interruptible: e.offer.interruptible,
    }
}

/// `GET /v1/offers/{id}`: one offer of the book, whole (an id or unique prefix; a replaced
/// id resolves as `rent` resolves it).
#[utoipa::path(
    get,
    path = "/v1/offers/{id}",
    operation_id = "getOffer",
    tag = "offers",
    summary = "One offer whole",
    description = "An id or a unique prefix of at least 4 hex digits. An id its provider has replaced resolves to the provider's current offer when that has the same GPUs at the same or a lower price.",
    params(("id" = String, Path, description = "Offer id or unique hex prefix")),
    responses(
        (status = 200, description = "The offer: GPUs with spec and benchmark, price, billing, durations, resources, sandbox, addresses", body = types::OfferDetail),
        (status = 400, description = "Not an offer id (`invalid-parameter`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "Not in the book, nor a remembered replaced offer (`unknown-offer`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The prefix matches several offers (`ambiguous-id`), or the offer was replaced with other GPUs or a higher price (`offer-replaced`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn offer(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<types::OfferDetail>, ApiError> {
    let (id, _) = resolve_offer(&s, &id).await?;
    let e = s
        .client
        .offer(id)
        .await
        .map_err(ApiError::internal)?
        .ok_or_else(|| {
            ApiError::new(
                P::UnknownOffer,
                format!("offer {id} is no longer in the book"),
            )
        })?;
    let o = &e.offer;
    Ok(Json(types::OfferDetail {
        id: e.id.to_string(),
        handle: gridlease_contracts::book::offer_handle(&o.provider),
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
        free_gpus: o.free_gpus,
        interruptible: o.interruptible,
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
        registries: o.sandbox.registries.clone(),
        local_images: o.sandbox.local_images.clone(),
        access: o.sandbox.access,
        isolation: o.sandbox.isolation,
        output_retention_s: o.sandbox.output_retention_s,
        upload_hold_s: o.sandbox.upload_hold_s,
        addrs: o.addrs.clone(),
        region: o.region.clone(),
    }))
}

/// `GET /v1/gpus`.
#[utoipa::path(
    get,
    path = "/v1/gpus",
    operation_id = "listGpus",
    tag = "node",
    summary = "GPUs found (NVML) or declared (--dev-gpus)",
    responses((status = 200, description = "This node's GPUs", body = GpusView))
)]
async fn gpus(State(s): State<ApiState>) -> Json<GpusView> {
    Json((*s.gpus).clone())
}

/// Finds the one lease whose id starts with `prefix` (hex).
async fn resolve_lease(s: &ApiState, prefix: &str) -> Result<LeaseId, ApiError> {
    if !openapi::LEASE_ID.is_match(prefix) {
        return Err(ApiError::new(
            P::InvalidParameter,
            format!("{prefix:?} is not a lease id (hex digits)"),
        )
        .hint("use an id (or its first digits) from `gridlease leases`"));
    }
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
        [] => Err(ApiError::new(
            P::UnknownLease,
            format!("no lease {prefix} on this node"),
        )),
        _ => Err(ApiError::new(
            P::AmbiguousId,
            format!(
                "lease id prefix {prefix} is ambiguous ({} leases)",
                hits.len()
            ),
        )
        .hint("give more digits")),
    }
}

/// Finds the one offer in the book whose id starts with `prefix` (hex). An id that its
/// provider has since replaced (offers are re-signed before they expire, so ids from an earlier
/// search age out) resolves to the provider's current offer when that has the same GPU models
/// at the same or a lower price, with a note saying so; otherwise it is a conflict naming the
/// current offer and its price.
async fn resolve_offer(s: &ApiState, prefix: &str) -> Result<(OfferId, Option<String>), ApiError> {
    if !openapi::OFFER_ID.is_match(prefix) {
        return Err(ApiError::new(
            P::InvalidParameter,
            format!("{prefix:?} is not an offer id or handle"),
        )
        .hint("use a handle (PROVIDER/0) or an id (or its first digits) from `gridlease search`"));
    }
    if let Some((provider, slot)) = prefix.split_once('/') {
        return resolve_handle(s, provider, slot).await;
    }
    let p = prefix.trim_end_matches('…').to_ascii_lowercase();
    let hits = s
        .client
        .offer_ids(p.clone())
        .await
        .map_err(ApiError::internal)?;
    match hits.as_slice() {
        [one] => return Ok((*one, None)),
        [] => {}
        _ => {
            return Err(ApiError::new(
                P::AmbiguousId,
                format!("offer id prefix {prefix} is ambiguous"),
            )
            .hint("give more digits"));
        }
    }
    let replaced = s
        .client
        .replaced_offers(p.clone())
        .await
        .map_err(ApiError::internal)?;
    match replaced.as_slice() {
        [] => Err(ApiError::new(
            P::UnknownOffer,
            format!(
                "offer {prefix} is not in this node's book (it may have expired); search again"
            ),
        )),
        [r] if r.equivalent => Ok((
            r.current.id,
            Some(format!(
                "offer {} was re-signed by its provider as {} (same GPUs, {}/GPU-hour); renting that",
                r.old.short(),
                r.current.id.short(),
                Money::from_micros(r.current.offer.price_per_gpu_hour)
            )),
        )),
        [r] => Err(ApiError::new(
            P::OfferReplaced,
            format!(
                "offer {} was replaced by its provider: now {} ({}, {}/GPU-hour, was {})",
                r.old.short(),
                r.current.id.short(),
                r.current.summary.models_lower,
                Money::from_micros(r.current.offer.price_per_gpu_hour),
                Money::from_micros(r.old_price_per_gpu_hour)
            ),
        )
        .hint(format!(
            "rent {} to accept the new terms, or search again",
            r.current.id.short()
        ))),
        _ => Err(ApiError::new(
            P::AmbiguousId,
            format!("offer id prefix {prefix} is ambiguous"),
        )
        .hint("give more digits")),
    }
}

/// The current offer an offer handle (`<provider key hex, or its first digits>/<slot>`, see
/// `gridlease_contracts::book::offer_handle`) names: the provider's offer as it is signed now,
/// whatever its id.
async fn resolve_handle(
    s: &ApiState,
    provider: &str,
    slot: &str,
) -> Result<(OfferId, Option<String>), ApiError> {
    let handle = format!("{provider}/{slot}");
    if slot.parse::<u8>() != Ok(0) {
        return Err(ApiError::new(
            P::UnknownOffer,
            format!("offer {handle}: a provider offers one offer, slot 0"),
        ));
    }
    let hits = s
        .client
        .offer_ids_of_providers(provider.to_ascii_lowercase())
        .await
        .map_err(ApiError::internal)?;
    match hits.as_slice() {
        [one] => Ok((*one, None)),
        [] => Err(ApiError::new(
            P::UnknownOffer,
            format!(
                "offer {handle}: no provider whose key starts with {provider} has an offer in this node's book (it may have withdrawn it, or it expired); search again"
            ),
        )),
        _ => Err(ApiError::new(
            P::AmbiguousId,
            format!("offer handle {handle} is ambiguous"),
        )
        .hint("give more digits of the provider")),
    }
}

fn lease_err(e: LeaseError) -> ApiError {
    match e {
        LeaseError::Unknown(id) => {
            ApiError::new(P::UnknownLease, format!("no lease {id} on this node"))
        }
        e @ LeaseError::NotRunning(_) => ApiError::new(P::LeaseNotRunning, e.to_string()),
        e @ LeaseError::Remote { .. } => ApiError::new(P::ProviderUnreachable, e.to_string())
            .hint("check `gridlease peers`, then retry"),
        other => ApiError::internal(other),
    }
}

/// `GET /v1/leases`.
#[utoipa::path(
    get,
    path = "/v1/leases",
    operation_id = "listLeases",
    tag = "leases",
    summary = "This node's leases (renter and provider side), oldest first",
    responses(
        (status = 200, description = "Every lease of this node", body = Vec<LeaseView>,
            links(
                ("getLease" = (operation_id = "getLease", parameters(("id" = "$response.body#/0/lease_id")),
                    description = "The first lease")),
                ("getLeaseLogs" = (operation_id = "getLeaseLogs", parameters(("id" = "$response.body#/0/lease_id")),
                    description = "The first lease's output")),
                ("getLeaseTelemetry" = (operation_id = "getLeaseTelemetry", parameters(("id" = "$response.body#/0/lease_id")),
                    description = "The first lease's live telemetry")),
                ("extendLease" = (operation_id = "extendLease", parameters(("id" = "$response.body#/0/lease_id")),
                    description = "Extend the first lease")),
                ("beginLease" = (operation_id = "beginLease", parameters(("id" = "$response.body#/0/lease_id")),
                    description = "Start the first lease's held command")),
                ("stopLease" = (operation_id = "stopLease", parameters(("id" = "$response.body#/0/lease_id")),
                    description = "Stop the first lease")),
            )),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn leases(State(s): State<ApiState>) -> Result<Json<Vec<LeaseView>>, ApiError> {
    Ok(Json(s.leases.leases().await.map_err(lease_err)?))
}

/// `GET /v1/leases/{id}`.
#[utoipa::path(
    get,
    path = "/v1/leases/{id}",
    operation_id = "getLease",
    tag = "leases",
    summary = "One lease",
    params(("id" = String, Path, description = "Lease id or unique hex prefix")),
    responses(
        (status = 200, description = "The lease now", body = LeaseView),
        (status = 400, description = "Not a lease id (`invalid-parameter`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "No such lease (`unknown-lease`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The prefix matches several leases (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn lease(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<LeaseView>, ApiError> {
    let id = resolve_lease(&s, &id).await?;
    s.leases
        .lease(id)
        .await
        .map_err(lease_err)?
        .map(Json)
        .ok_or_else(|| ApiError::new(P::UnknownLease, format!("no lease {id} on this node")))
}

/// What the document says of `POST /v1/leases`, checked before anything is looked up.
fn check_rent(req: &RentRequest) -> Result<(), ApiError> {
    let bad = |detail: String| Err(ApiError::new(P::InvalidBody, detail));
    if req.gpus == 0 {
        return bad("gpus must be at least 1".into());
    }
    if req.duration_s == 0 {
        return bad("the duration must be positive".into());
    }
    if req.image.is_empty() || req.image.len() > gridlease_protocol::MAX_IMAGE_LEN {
        return bad(format!(
            "image must be 1 to {} bytes",
            gridlease_protocol::MAX_IMAGE_LEN
        ));
    }
    if !openapi::OFFER_ID.is_match(&req.offer) {
        return bad(format!(
            "offer {:?} is not an offer id or handle",
            req.offer
        ));
    }
    if req
        .max_total
        .is_some_and(|m| m.micros() > openapi::MAX_AMOUNT_MICROS)
    {
        return bad("max_total is too large".into());
    }
    Ok(())
}

/// `POST /v1/leases`.
#[utoipa::path(
    post,
    path = "/v1/leases",
    operation_id = "rentOffer",
    tag = "leases",
    summary = "Rent an offer",
    description = "Answers once both sides signed and stored the lease; the run proceeds in the background (follow it with getLease).",
    request_body = RentRequest,
    responses(
        (status = 200, description = "The lease was agreed", body = RentedView,
            links(
                ("getLease" = (operation_id = "getLease", parameters(("id" = "$response.body#/lease_id")),
                    description = "The new lease")),
                ("getLeaseLogs" = (operation_id = "getLeaseLogs", parameters(("id" = "$response.body#/lease_id")),
                    description = "The new lease's output")),
                ("getLeaseTelemetry" = (operation_id = "getLeaseTelemetry", parameters(("id" = "$response.body#/lease_id")),
                    description = "The new lease's live telemetry")),
                ("beginLease" = (operation_id = "beginLease", parameters(("id" = "$response.body#/lease_id")),
                    description = "Start the command of a lease held for uploads")),
                ("extendLease" = (operation_id = "extendLease", parameters(("id" = "$response.body#/lease_id")),
                    description = "Extend the new lease")),
                ("stopLease" = (operation_id = "stopLease", parameters(("id" = "$response.body#/lease_id")),
                    description = "Stop the new lease")),
            )),
        (status = 400, description = "The body is not JSON (`malformed-body`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "The offer is not in the book, nor a remembered replaced offer (`unknown-offer`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The provider rejected the lease (`lease-rejected`, the reason in words); the offer was replaced with other GPUs or a higher price (`offer-replaced`); the prefix matches several offers (`ambiguous-id`); keep_outputs_s or upload_hold_s exceed the offer's (`beyond-offer-terms`)", content_type = "application/problem+json", body = Problem),
        (status = 415, description = "The body is not application/json (`unsupported-media-type`)", content_type = "application/problem+json", body = Problem),
        (status = 422, description = "The body is not a valid rent request (`invalid-body`)", content_type = "application/problem+json", body = Problem),
        (status = 502, description = "The provider could not be reached (`provider-unreachable`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn rent(
    State(s): State<ApiState>,
    ApiJson(mut req): ApiJson<RentRequest>,
) -> Result<Json<RentedView>, ApiError> {
    check_rent(&req)?;
    let (offer, mut note) = resolve_offer(&s, &req.offer).await?;
    req.offer = offer.to_string();
    // Renters learn before the container starts that the owner may take the GPU back.
    if let Ok(Some(e)) = s.client.offer(offer).await
        && e.offer.interruptible
    {
        let says = "this offer is interruptible: the provider's owner may stop the lease when they want the GPU back (billed to the second it stops; `search interruptible=false` for offers that are not)";
        note = Some(match note {
            Some(n) => format!("{n}; {says}"),
            None => says.to_string(),
        });
    }
    match s.leases.rent(req).await {
        Ok(id) => Ok(Json(RentedView {
            lease_id: id.to_string(),
            note,
            min_billed_s: match s.leases.lease(id).await {
                Ok(Some(v)) => v.min_billed_s,
                _ => 0,
            },
        })),
        Err(RentError::Rejected(reason)) => Err(ApiError::new(
            P::LeaseRejected,
            format!("the provider rejected the lease: {}", reject_text(&reason)),
        )
        .hint("pick another offer with `gridlease search`")),
        Err(e @ RentError::UnknownOffer(_)) => Err(ApiError::new(P::UnknownOffer, e.to_string())),
        Err(e @ RentError::OwnOffer(_)) => Err(ApiError::new(P::OwnOffer, e.to_string())
            .hint("rent from another provider: `gridlease search` lists their offers")),
        Err(e @ RentError::ImageNotOffered { .. }) => Err(ApiError::new(
            P::BeyondOfferTerms,
            e.to_string(),
        )
        .hint("`gridlease offer OFFER` shows the images it runs")),
        Err(e @ RentError::KeepOutputs { .. }) => Err(ApiError::new(
            P::BeyondOfferTerms,
            e.to_string(),
        )
        .hint("ask for less with --keep-outputs, or copy results out while it runs")),
        Err(e @ RentError::UploadHold { .. }) => Err(ApiError::new(
            P::BeyondOfferTerms,
            e.to_string(),
        )
        .hint("upload with `gridlease cp` once the lease runs, or pick an offer that holds containers for uploads")),
        Err(e @ RentError::Negotiation(_)) => Err(ApiError::new(
            P::ProviderUnreachable,
            e.to_string(),
        )
        .hint("check `gridlease peers`, then retry")),
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
        RejectReason::HoldBusy => "this provider already holds a container for your uploads (rent --upload) whose command has not started: begin or stop that lease first (one held container per renter)".into(),
    }
}

/// `POST /v1/leases/{id}/stop`.
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/stop",
    operation_id = "stopLease",
    tag = "leases",
    summary = "End the lease (renter: a signed close; provider: stop the container)",
    description = "Answers once the node has taken the stop in hand, before the lease has settled; poll getLease until its state is terminal. Stopping a lease that is already closing or over answers 200 too. A body, if any, is ignored.",
    params(("id" = String, Path, description = "Lease id or unique hex prefix")),
    responses(
        (status = 200, description = "The stop was taken in hand", body = StoppingView),
        (status = 400, description = "Not a lease id (`invalid-parameter`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "No such lease (`unknown-lease`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The prefix matches several leases (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn stop(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<StoppingView>, ApiError> {
    let id = resolve_lease(&s, &id).await?;
    s.leases.stop(id).await.map_err(lease_err)?;
    Ok(Json(StoppingView {
        lease_id: id.to_string(),
        stopping: true,
    }))
}

/// `POST /v1/leases/{id}/begin` (renter): the provider starts the command of a container it
/// holds for uploads (`rent --upload`).
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/begin",
    operation_id = "beginLease",
    tag = "leases",
    summary = "Start the command of a lease whose container the provider holds for uploads (renter)",
    description = "Tells the provider the uploads are done (`gridlease rent --upload` calls it after them). 200 once the provider took it, also when the command already runs (the hold ran out). A body, if any, is ignored.",
    params(("id" = String, Path, description = "Lease id or unique hex prefix")),
    responses(
        (status = 200, description = "The provider starts (or already runs) the command", body = BegunView),
        (status = 400, description = "Not a lease id (`invalid-parameter`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "No such lease (`unknown-lease`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "This node provides the lease (`not-renter`), the lease is over (`lease-over`), or the prefix matches several leases (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 502, description = "The provider could not be told (`provider-unreachable`); it starts the command when the hold runs out", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn begin(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<BegunView>, ApiError> {
    let id = resolve_lease(&s, &id).await?;
    let view = s
        .leases
        .lease(id)
        .await
        .map_err(lease_err)?
        .ok_or_else(|| ApiError::new(P::UnknownLease, format!("no lease {id} on this node")))?;
    if view.role != crate::store::Role::Renter {
        return Err(ApiError::new(
            P::NotRenter,
            format!(
                "this node provides lease {}; its renter begins it",
                id.short()
            ),
        ));
    }
    if view.is_terminal() {
        return Err(ApiError::new(
            P::LeaseOver,
            format!("lease {} is over ({})", id.short(), view.state.as_str()),
        )
        .hint("see `gridlease leases`"));
    }
    s.leases.begin(id).await.map_err(lease_err)?;
    Ok(Json(BegunView {
        lease_id: id.to_string(),
        begun: true,
    }))
}

/// `POST /v1/leases/{id}/extend`.
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/extend",
    operation_id = "extendLease",
    tag = "leases",
    summary = "Extend a running lease this node rents (a signed amendment the provider accepts)",
    description = "Answers once the provider accepted the amendment and both nodes stored it. The budget cap rises by the cost of the added time unless max_total names a higher one.",
    params(("id" = String, Path, description = "Lease id or unique hex prefix")),
    request_body = ExtendRequest,
    responses(
        (status = 200, description = "The lease's terms now", body = Extended),
        (status = 400, description = "Not a lease id (`invalid-parameter`), or the body is not JSON (`malformed-body`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "No such lease (`unknown-lease`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "Refused, with the reason in words (`extension-refused`: not running, too late, beyond the offer's longest lease, a lower cap; nothing changed), this node provides the lease (`not-renter`), or the prefix matches several leases (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 415, description = "The body is not application/json (`unsupported-media-type`)", content_type = "application/problem+json", body = Problem),
        (status = 422, description = "Not exactly one of minutes and seconds, zero, or another field (`invalid-body`)", content_type = "application/problem+json", body = Problem),
        (status = 502, description = "The provider gave no usable answer (`provider-unreachable`); the extension is kept pending and sent again by the next call", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn extend(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<ExtendRequest>,
) -> Result<Json<Extended>, ApiError> {
    if let Err(e) = req.added_s() {
        return Err(ApiError::new(P::InvalidBody, e.to_string()));
    }
    if req
        .max_total
        .is_some_and(|m| m.micros() > openapi::MAX_AMOUNT_MICROS)
    {
        return Err(ApiError::new(P::InvalidBody, "max_total is too large"));
    }
    let id = resolve_lease(&s, &id).await?;
    match s.leases.extend(id, req).await {
        Ok(x) => Ok(Json(x)),
        Err(e @ ExtendError::Refused(_)) => Err(ApiError::new(
            P::ExtensionRefused,
            format!("lease {} cannot be extended: {e}", id.short()),
        )),
        Err(e @ ExtendError::BadRequest(_)) => Err(ApiError::new(P::InvalidBody, e.to_string())),
        Err(e @ ExtendError::NotRenter(_)) => Err(ApiError::new(P::NotRenter, e.to_string())),
        Err(e @ ExtendError::Unknown(_)) => Err(ApiError::new(P::UnknownLease, e.to_string())),
        Err(e @ ExtendError::Remote { .. }) => {
            Err(ApiError::new(P::ProviderUnreachable, e.to_string())
                .hint("run the same `extend` again once the provider is reachable"))
        }
        Err(e) => Err(ApiError::internal(e)),
    }
}

/// Most bytes of an exec request body.
const MAX_EXEC_BODY: usize = 128 * 1024;

/// An access route needs `Connection: upgrade` and `Upgrade: gridlease-access` (required
/// headers of the document): without them nothing is opened, and the request is malformed
/// (400, `upgrade-required`).
fn require_upgrade(req: &axum::extract::Request) -> Result<(), ApiError> {
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
struct AccessHeaders {
    /// The access protocol.
    upgrade: types::AccessUpgrade,
    /// The connection switches protocols.
    connection: types::ConnectionUpgrade,
}

/// The refusals every access route (exec, forward, upload, download) can give, documented once.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // A documentation type: never built, only described.
enum AccessProblems {
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
        description = "The provider refused (`access-refused`: not running, not allowed by the offer, or not supported), this node provides the lease (`not-renter`), or the prefix matches several leases (`ambiguous-id`)",
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
async fn exec(
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
async fn forward(
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

/// The JSON body of an access route (at most [`MAX_EXEC_BODY`] bytes), read as every route
/// reads one ([`problem::json_body`]).
async fn access_body<T: serde::de::DeserializeOwned>(
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
async fn upload(
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
async fn download(
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
async fn transfer<B: serde::de::DeserializeOwned>(
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
        let r = if kind == gridlease_protocol::access::AccessKind::Forward {
            // A forwarded TCP connection: each direction's half-close travels on its own.
            tokio::io::copy_bidirectional_with_sizes(
                &mut up,
                &mut stream,
                crate::access::SPLICE_BUFFER,
                crate::access::SPLICE_BUFFER,
            )
            .await
            .map(|_| ())
        } else {
            until_provider_ends(&mut up, &mut stream).await
        };
        tracing::debug!(kind = kind.name(), result = ?r, "access stream closed");
    });
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
async fn until_provider_ends<A, B>(cli: &mut A, provider: &mut B) -> std::io::Result<()>
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

/// Query string of `GET /v1/leases/{id}/logs`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogsParams {
    /// Byte offset to read from.
    #[serde(default)]
    #[param(default = 0)]
    pub from: u64,
}

/// Header carrying the offset to ask for next.
pub const NEXT_OFFSET_HEADER: &str = "x-gridlease-next-offset";
/// Header present once no more output will come.
pub const EOF_HEADER: &str = "x-gridlease-eof";
/// Header carrying the container's exit code once known.
pub const EXIT_CODE_HEADER: &str = "x-gridlease-exit-code";

/// `GET /v1/leases/{id}/logs`.
#[utoipa::path(
    get,
    path = "/v1/leases/{id}/logs",
    operation_id = "getLeaseLogs",
    tag = "leases",
    summary = "Container output from an offset (a renter fetches it from the provider)",
    params(("id" = String, Path, description = "Lease id or unique hex prefix"), LogsParams),
    responses(
        (status = 200, description = "Raw output bytes, at most 1 MiB per call", content_type = "application/octet-stream", body = Vec<u8>,
            headers(
                ("x-gridlease-next-offset" = u64, description = "The offset to ask for next"),
                ("x-gridlease-eof" = String, description = "Present (`1`) once no more output will come"),
                ("x-gridlease-exit-code" = i32, description = "Present once the container exited"),
            )),
        (status = 400, description = "Not a lease id, or from is not a number (`invalid-parameter`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "No such lease (`unknown-lease`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The prefix matches several leases (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 502, description = "The provider could not be reached (`provider-unreachable`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn logs(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(p): ApiQuery<LogsParams>,
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

/// `GET /v1/leases/{id}/telemetry` parameters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TelemetryParams {
    /// Only samples taken after this time (ms since the epoch, the provider's clock); 0 for
    /// every sample kept.
    #[serde(default)]
    #[param(default = 0)]
    pub after_ms: u64,
}

/// `GET /v1/leases/{id}/telemetry`.
#[utoipa::path(
    get,
    path = "/v1/leases/{id}/telemetry",
    operation_id = "getLeaseTelemetry",
    tag = "leases",
    summary = "Live GPU and container samples of a running lease (`gridlease top`)",
    params(("id" = String, Path, description = "Lease id or unique hex prefix"), TelemetryParams),
    responses(
        (status = 200, description = "The samples taken after `after_ms`, oldest first", body = types::TelemetryView),
        (status = 400, description = "Not a lease id, or after_ms is not a number (`invalid-parameter`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "No such lease (`unknown-lease`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The prefix matches several leases (`ambiguous-id`), or the lease does not run (`lease-not-running`)", content_type = "application/problem+json", body = Problem),
        (status = 502, description = "The provider could not be reached or sent telemetry that does not fit the lease (`provider-unreachable`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn telemetry(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(p): ApiQuery<TelemetryParams>,
) -> Result<Json<types::TelemetryView>, ApiError> {
    let id = resolve_lease(&s, &id).await?;
    let b = s
        .leases
        .telemetry(id, gridlease_protocol::Timestamp(p.after_ms))
        .await
        .map_err(lease_err)?;
    Ok(Json(types::TelemetryView::of(id, b)))
}

/// `GET /v1/leases/{id}/statement`.
#[utoipa::path(
    get,
    path = "/v1/leases/{id}/statement",
    operation_id = "getLeaseStatement",
    tag = "leases",
    summary = "The lease's statement: every signed message that says what is owed (`gridlease statement`)",
    description = "The statement file `gridlease verify` checks with no node and no network: the offer (when kept), the signed request and acceptance, accepted amendments, the usage reports this node keeps and the last receipt (format: docs/billing.md). Either side of a lease may ask; a provider's holds all of its reports.",
    params(("id" = String, Path, description = "Lease id or unique hex prefix")),
    responses(
        (status = 200, description = "The statement file's bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "Not a lease id (`invalid-parameter`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "No such lease (`unknown-lease`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The prefix matches several leases (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn statement(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let id = resolve_lease(&s, &id).await?;
    let bytes = s
        .leases
        .statement(id)
        .await
        .map_err(lease_err)?
        .to_bytes()
        .map_err(ApiError::internal)?;
    Ok((
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        bytes,
    )
        .into_response())
}

/// `GET /v1/ledger`.
#[utoipa::path(
    get,
    path = "/v1/ledger",
    operation_id = "getLedger",
    tag = "leases",
    summary = "Per-lease statements, per-counterparty totals, totals, double-entry check",
    responses(
        (status = 200, description = "The ledger", body = Ledger),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn ledger(State(s): State<ApiState>) -> Result<Json<Ledger>, ApiError> {
    Ok(Json(s.leases.ledger().await.map_err(lease_err)?))
}

/// What the document says of `PUT /v1/provide`, checked before anything changes.
fn check_provide(b: &ProvideBody) -> Result<(), ApiError> {
    let bad = |detail: String| Err(ApiError::new(P::InvalidBody, detail));
    if let Some(p) = &b.price
        && !openapi::PRICE.is_match(p)
    {
        return Err(ApiError::new(
            P::InvalidBody,
            format!(
                "price {p:?} is not an amount above 0 and below 10000000000000 (at most 6 decimals)"
            ),
        )
        .hint("e.g. `gridlease provide --price 0.40`"));
    }
    if let Some(g) = &b.gpus
        && (g.is_empty() || g.iter().any(String::is_empty))
    {
        return bad("gpus lists GPU ids (or `all`); an empty list or id offers nothing".into());
    }
    if b.max_hours == Some(0) {
        return Err(
            ApiError::new(P::InvalidBody, "the longest lease must be at least 1 hour")
                .hint("e.g. --max-hours 24"),
        );
    }
    if let Some(n) = &b.network_policy
        && n != "none"
        && n != "egress"
    {
        return bad(format!("network policy {n:?} is not none or egress"));
    }
    if let Some(h) = b
        .registries
        .iter()
        .flatten()
        .find(|h| !openapi::HOST.is_match(h))
    {
        return bad(format!("registry {h:?} is not a host[:port]"));
    }
    if let Some(p) = &b.image_prefixes {
        if p.len() > gridlease_protocol::MAX_IMAGE_PREFIXES {
            return bad(format!(
                "at most {} image prefixes",
                gridlease_protocol::MAX_IMAGE_PREFIXES
            ));
        }
        if let Some(x) = p
            .iter()
            .find(|x| x.is_empty() || x.len() > gridlease_protocol::MAX_IMAGE_LEN)
        {
            return bad(format!(
                "image prefix {x:?} must be 1 to {} bytes",
                gridlease_protocol::MAX_IMAGE_LEN
            ));
        }
    }
    if let Some(l) = b
        .local_images
        .iter()
        .flatten()
        .find(|l| !openapi::IMAGE.is_match(l) || l.len() > openapi::MAX_LOCAL_IMAGE_LEN)
    {
        return bad(format!("local image {l:?} is not an image reference"));
    }
    if b.max_image_gib == Some(0) || b.max_unpacked_gib == Some(0) {
        return bad("image size caps must be at least 1 GiB".into());
    }
    Ok(())
}

/// `PUT /v1/provide`.
#[utoipa::path(
    put,
    path = "/v1/provide",
    operation_id = "setProvide",
    tag = "node",
    summary = "Set or withdraw this node's offer",
    description = "Every field is optional: what the request leaves out stays as the last call set it (the first call starts from the node's configuration). The offer is re-signed and announced at once.",
    request_body = ProvideBody,
    responses(
        (status = 200, description = "This node now, with its new offer (or none)", body = StatusView),
        (status = 400, description = "The body is not JSON (`malformed-body`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "No price given and none set before (`price-needed`), or no GPU of this node matches (`no-gpus`)", content_type = "application/problem+json", body = Problem),
        (status = 415, description = "The body is not application/json (`unsupported-media-type`)", content_type = "application/problem+json", body = Problem),
        (status = 422, description = "A field is out of range or does not match its pattern (`invalid-body`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
async fn provide(
    State(s): State<ApiState>,
    ApiJson(b): ApiJson<ProvideBody>,
) -> Result<Json<StatusView>, ApiError> {
    check_provide(&b)?;
    // What the request leaves out stays as the last `provide` set it.
    let current = s.leases.provide_settings();
    let price = match (&b.price, &current) {
        (Some(p), _) => p
            .parse::<Money>()
            .map_err(|e| ApiError::new(P::InvalidBody, e.to_string()).hint("e.g. --price 0.40"))?,
        (None, Some(c)) => c.price_per_gpu_hour,
        (None, None) if b.off => Money::ZERO,
        (None, None) => {
            return Err(
                ApiError::new(P::PriceNeeded, "a price is needed to provide")
                    .hint("e.g. `gridlease provide --price 0.40`"),
            );
        }
    };
    let network_policy = match b.network_policy.as_deref() {
        None => current
            .as_ref()
            .map_or(NetworkPolicy::None, |c| c.network_policy),
        Some("none") => NetworkPolicy::None,
        Some("egress") => NetworkPolicy::Egress,
        Some(other) => {
            return Err(ApiError::new(
                P::InvalidBody,
                format!("network policy {other:?} is not none or egress"),
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
        .map_err(|e| ApiError::new(P::InvalidBody, format!("image policy: {e}")))?;
    if let Some(h) = &b.hours
        && !openapi::HOURS.is_match(h)
    {
        return Err(ApiError::new(
            P::InvalidBody,
            format!("hours {h:?} are not windows HH:MM-HH:MM separated by commas (at most {}), or `always`", gridlease_contracts::schedule::MAX_WINDOWS),
        )
        .hint("e.g. `gridlease provide --hours 22:00-08:00 --tz Europe/Berlin`"));
    }
    let hours = match &b.hours {
        Some(h) => h.parse::<Schedule>().map_err(|e| {
            ApiError::new(P::InvalidBody, format!("hours: {e}"))
                .hint("e.g. `gridlease provide --hours 22:00-08:00 --tz Europe/Berlin`")
        })?,
        None => current
            .as_ref()
            .map(|c| c.hours.clone())
            .unwrap_or_default(),
    };
    let tz = match b.tz.as_deref() {
        Some("local") => None,
        Some(z) => Some(z.to_string()),
        None => current.as_ref().and_then(|c| c.tz.clone()),
    };
    // An unknown zone is refused before anything changes.
    crate::lease::owner::zone(tz.as_deref()).map_err(|e| ApiError::new(P::InvalidBody, e))?;
    let settings = ProvideSettings {
        price_per_gpu_hour: price,
        gpus,
        max_hours: b.max_hours.or(current.as_ref().and_then(|c| c.max_hours)),
        network_policy,
        images,
        hours,
        tz,
        interruptible: b
            .interruptible
            .unwrap_or_else(|| current.as_ref().is_some_and(|c| c.interruptible)),
        enabled: !b.off,
    };
    match s.leases.provide(settings).await {
        Ok(()) => status(State(s)).await,
        Err(e @ (ProvideError::NoGpus | ProvideError::NoMatchingGpus)) => {
            Err(ApiError::new(P::NoGpus, e.to_string()))
        }
        Err(ProvideError::Hours(e)) => Err(ApiError::new(P::InvalidBody, e)),
        Err(e) => Err(ApiError::internal(e)),
    }
}
