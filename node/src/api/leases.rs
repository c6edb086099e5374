//! The lease routes: list, one, rent, stop, begin, extend, logs, telemetry, statement, ledger.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::problem::{ApiError, ApiJson, ApiPath, ApiQuery, Problem, ProblemType as P};
use super::resolve::{lease_err, resolve_lease, resolve_offer};
use super::types::{self, BegunView, RentedView, StoppingView};
use super::{ApiState, openapi};
use crate::lease::{ExtendError, ExtendRequest, Extended, LeaseView, Ledger, RentRequest};
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
pub(super) async fn leases(State(s): State<ApiState>) -> Result<Json<Vec<LeaseView>>, ApiError> {
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
pub(super) async fn lease(
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
pub(super) fn check_rent(req: &RentRequest) -> Result<(), ApiError> {
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
pub(super) async fn rent(
    State(s): State<ApiState>,
    ApiJson(mut req): ApiJson<RentRequest>,
) -> Result<Json<RentedView>, ApiError> {
    check_rent(&req)?;
    let (offer, mut note) = resolve_offer(&s, &req.offer).await?;
    req.offer = offer.to_string();
    // The renter's volumes on this offer's provider (issue 47), by name or id.
    if !req.volumes.is_empty() {
        let provider = match s.client.offer(offer).await {
            Ok(Some(e)) => e.offer.provider,
            _ => {
                return Err(ApiError::new(
                    P::UnknownOffer,
                    format!("offer {offer} is not in the book"),
                ));
            }
        };
        req.mounts = super::volumes::resolve_mounts(&s, &provider, &req.volumes).await?;
    }
    let mut add = |says: String| {
        note = Some(match note.take() {
            Some(n) => format!("{n}; {says}"),
            None => says,
        });
    };
    if let Ok(Some(e)) = s.client.offer(offer).await {
        // Renters learn before the container starts that the owner may take the GPU back.
        if e.offer.interruptible {
            add("this offer is interruptible: the provider's owner may stop the lease when they want the GPU back (billed to the second it stops; `search interruptible=false` for offers that are not)".into());
        }
        // And how it is paid, where either side names a chain (issue 50).
        match s.leases.settlement_for(&e.offer) {
            Ok(st) => add(format!(
                "this lease settles on {}: every receipt carries your wallet's voucher",
                st.chain
            )),
            Err(gridlease_contracts::settlement::GluOnly::OfferHasNone)
                if !s.leases.settles_on_chain() => {}
            Err(why) => add(format!("this lease settles in GLU only: {why}")),
        }
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
        Err(e) => Err(super::refusals::rent_error(e)),
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
pub(super) async fn stop(
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
pub(super) async fn begin(
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

/// `POST /v1/leases/{id}/verify-gpu` (renter): the GPU check again, mid-lease.
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/verify-gpu",
    operation_id = "verifyLeaseGpu",
    tag = "leases",
    summary = "Re-check a running lease's GPUs (renter)",
    description = "Runs the renter's GPU check (`docs/gpu.md`) against the running lease's provider again and answers with its outcome (`state` `passed` or `failed`, and why). The lease is billed meanwhile as usual and runs on whatever the check finds; the record is kept (a failure is never replaced). A body, if any, is ignored.",
    params(("id" = String, Path, description = "Lease id or unique hex prefix")),
    responses(
        (status = 200, description = "The check ran", body = crate::lease::gpu_check::GpuCheckView),
        (status = 400, description = "Not a lease id (`invalid-parameter`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "No such lease (`unknown-lease`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The lease is not running (`lease-not-running`), its provider offers no GPU check or this node provides it (`no-gpu-check`), or the prefix matches several leases (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn verify_gpu(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<crate::lease::gpu_check::GpuCheckView>, ApiError> {
    let id = resolve_lease(&s, &id).await?;
    let view = s.leases.verify_gpu(id).await.map_err(lease_err)?;
    Ok(Json(view))
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
pub(super) async fn extend(
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
pub(super) async fn logs(
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
pub(super) async fn telemetry(
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
pub(super) async fn statement(
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
pub(super) async fn ledger(State(s): State<ApiState>) -> Result<Json<Ledger>, ApiError> {
    Ok(Json(s.leases.ledger().await.map_err(lease_err)?))
}
