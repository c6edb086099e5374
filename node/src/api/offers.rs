//! The offer book's routes: search (with its page and class headers) and one offer whole.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use gridlease_contracts::Money;
use gridlease_contracts::book::BookEntry;
use gridlease_contracts::query::Query;
use gridlease_protocol::NetworkPolicy;
use serde::Deserialize;

use super::problem::{ApiError, ApiPath, ApiQuery, Problem, ProblemType as P};
use super::resolve::resolve_offer;
use super::types::{self, OfferRow};
use super::{ApiState, openapi};
/// Most rows one search returns.
pub const MAX_SEARCH_LIMIT: usize = 10_000;

/// Query string of `GET /v1/offers`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OffersParams {
    /// The search query (see `docs/search.md`); empty matches every offer with a free GPU.
    #[serde(default)]
    pub q: String,
    /// Sort key: `price` (default), `fp16_tflops`, `fp32_tflops`, `price_per_tflop`, `vram`,
    /// `age`, `rep` or `verified`; a leading `-` sorts descending. Given, it wins over a
    /// `sort:KEY` term of `q`.
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
pub(super) async fn offers(
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
        measured: n.measured,
        verified: n.provider.verified,
        gpu_check: types::GpuCheckPolicy::of(&e.offer.proof),
        verify_window_s: e.offer.proof.window_s,
        age_s: now.ms_since(e.offer.created_at) / 1000,
        region: e.offer.region.clone(),
        min_billed_s: e.offer.min_billed_s,
        min_duration_s: e.offer.min_duration_s,
        max_duration_s: e.offer.max_duration_s,
        access: e.offer.sandbox.access,
        isolation: e.offer.sandbox.isolation,
        output_retention_s: e.offer.sandbox.output_retention_s,
        upload_hold_s: e.offer.sandbox.upload_hold_s,
        rep: f64::from(n.provider.rep_permille) / 1000.0,
        completed: n.provider.completed,
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
        (status = 200, description = "The offer: GPUs with spec and benchmark, price, billing, durations, resources, sandbox, GPU check, addresses", body = types::OfferDetail),
        (status = 400, description = "Not an offer id (`invalid-parameter`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "Not in the book, nor a remembered replaced offer (`unknown-offer`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The prefix matches several offers (`ambiguous-id`), or the offer was replaced with other GPUs or a higher price (`offer-replaced`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn offer(
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
        gpu_check: types::GpuCheckPolicy::of(&o.proof),
        verify_window_s: o.proof.window_s,
        volumes: types::VolumeTermsView {
            price_per_gib_hour: Money::from_micros(o.sandbox.volumes.price_per_gib_hour)
                .to_string(),
            max_gib: o.sandbox.volumes.max_gib,
            max_keep_s: o.sandbox.volumes.max_keep_s,
        },
        verified: e.summary.numbers.provider.verified,
        addrs: o.addrs.clone(),
        region: o.region.clone(),
    }))
}
