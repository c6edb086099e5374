//! The volume routes (issue 47): make a volume (a volume lease on an offer's provider), list
//! them, remove one; and the names of `POST /v1/leases`' `volumes` resolved to their leases.
//! A volume's keep period is extended with `extendLease` on its lease, its files are copied
//! with the access routes (`uploadFiles`, `downloadFiles`) on its lease.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use gridlease_contracts::Money;
use gridlease_protocol::{LeaseId, PREPAY_ALL, PublicKey};
use serde::Deserialize;

use super::problem::{ApiError, ApiJson, ApiPath, Problem, ProblemType as P};
use super::resolve::{lease_err, resolve_offer};
use super::types::{RentedView, StoppingView};
use super::{ApiState, openapi};
use crate::lease::{LeaseView, RentRequest};
use crate::renter::{Mount, VolumeMountRequest, VolumeRequest};
use crate::store::Role;

/// Body of `POST /v1/volumes`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct VolumeCreate {
    /// The name (1-64 of a-z, 0-9, `-`, `_`, `.`; not starting with `-` or `.`), unique among
    /// this node's live volumes on that provider.
    pub name: String,
    /// Size, GiB.
    pub size_gib: u32,
    /// Keep period, seconds: the volume is deleted at its end (extend it with extendLease).
    pub keep_s: u32,
    /// An offer (id, prefix or handle) of the provider to keep it; or `provider`.
    #[serde(default)]
    pub offer: Option<String>,
    /// The provider's peer id (its current offer is used); or `offer`.
    #[serde(default)]
    pub provider: Option<String>,
    /// Seconds of storage paid ahead of the provider's reports (4294967295, the default: the
    /// whole keep period at the first report, so the volume stays while this node is
    /// offline; a smaller window: paid per window, and this node must come back before each
    /// runs out or the provider deletes the volume).
    #[serde(default = "prepay_all")]
    pub prepay_s: u32,
    /// Budget cap (a decimal amount); default: the cost of the whole keep period.
    #[serde(default, with = "crate::renter::decimal")]
    #[schema(value_type = Option<String>)]
    pub max_total: Option<Money>,
}

fn prepay_all() -> u32 {
    PREPAY_ALL
}

/// `POST /v1/volumes`.
#[utoipa::path(
    post,
    path = "/v1/volumes",
    operation_id = "createVolume",
    tag = "volumes",
    summary = "Make a volume on a provider: storage kept beyond any lease, billed per GiB-hour",
    description = "Agrees a volume lease (signed by both sides) on the offer's provider at its volume price; answers once it is stored on both. The volume is made in the background: getLease shows it `running` when it is kept. Mount it with `volumes` in rentOffer.",
    request_body = VolumeCreate,
    responses(
        (status = 201, description = "The volume lease was agreed", body = RentedView),
        (status = 400, description = "The body is not JSON (`malformed-body`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "The offer is not in the book, or the provider has none (`unknown-offer`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The provider refused (`lease-rejected`: keeps no volumes, too large, no space, the name is taken, ...), the prefix matches several offers (`ambiguous-id`), or the offer is this node's own (`own-offer`)", content_type = "application/problem+json", body = Problem),
        (status = 415, description = "The body is not application/json (`unsupported-media-type`)", content_type = "application/problem+json", body = Problem),
        (status = 422, description = "Not a valid volume: name, size, keep period, or neither/both of offer and provider (`invalid-body`)", content_type = "application/problem+json", body = Problem),
        (status = 502, description = "The provider could not be reached (`provider-unreachable`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn create(
    State(s): State<ApiState>,
    ApiJson(body): ApiJson<VolumeCreate>,
) -> Result<(StatusCode, Json<RentedView>), ApiError> {
    let bad = |m: String| Err(ApiError::new(P::InvalidBody, m));
    check_name(&body.name)?;
    if body.size_gib == 0 || body.size_gib > gridlease_protocol::MAX_VOLUME_GIB {
        return bad(format!(
            "size_gib {}: 1 to {}",
            body.size_gib,
            gridlease_protocol::MAX_VOLUME_GIB
        ));
    }
    check_keep(body.keep_s, body.max_total)?;
    let offer = match (&body.offer, &body.provider) {
        (Some(o), None) => resolve_offer(&s, o).await?.0,
        (None, Some(p)) => provider_offer(&s, p).await?,
        _ => return bad("give one of offer and provider".into()),
    };
    let volume = VolumeRequest {
        name: body.name.clone(),
        size_gib: body.size_gib,
        adopts: None,
    };
    agree(
        &s,
        offer,
        body.keep_s,
        body.prepay_s,
        body.max_total,
        volume,
    )
    .await
}

/// A volume's name, checked as the provider will.
fn check_name(name: &str) -> Result<(), ApiError> {
    if gridlease_protocol::valid_volume_name(name) {
        return Ok(());
    }
    Err(ApiError::new(
        P::InvalidBody,
        format!(
            "name {:?}: 1-64 of a-z, 0-9, '-', '_', '.', not starting with '-' or '.'",
            name.chars().take(80).collect::<String>()
        ),
    ))
}

/// A volume's keep period and budget cap, checked.
fn check_keep(keep_s: u32, max_total: Option<Money>) -> Result<(), ApiError> {
    if keep_s == 0 {
        return Err(ApiError::new(P::InvalidBody, "keep_s: at least 1 second"));
    }
    if max_total.is_some_and(|m| m.micros() > openapi::MAX_AMOUNT_MICROS) {
        return Err(ApiError::new(P::InvalidBody, "max_total is too large"));
    }
    Ok(())
}

/// Agrees the volume lease of `volume` on `offer`'s provider: 201 with its id.
async fn agree(
    s: &ApiState,
    offer: gridlease_protocol::OfferId,
    keep_s: u32,
    prepay_s: u32,
    max_total: Option<Money>,
    volume: VolumeRequest,
) -> Result<(StatusCode, Json<RentedView>), ApiError> {
    let req = RentRequest {
        offer: offer.to_string(),
        gpus: 0,
        duration_s: keep_s,
        image: String::new(),
        command: Vec::new(),
        env: Default::default(),
        max_total,
        network: gridlease_protocol::NetworkPolicy::None,
        keep_outputs_s: 0,
        upload_hold_s: 0,
        prepay_s,
        verify: false,
        volumes: Vec::new(),
        mounts: Vec::new(),
        volume: Some(volume),
    };
    match s.leases.rent(req).await {
        Ok(id) => Ok((
            StatusCode::CREATED,
            Json(RentedView {
                lease_id: id.to_string(),
                note: None,
                min_billed_s: 0,
            }),
        )),
        Err(e) => Err(super::refusals::rent_error(e)),
    }
}

/// Body of `POST /v1/leases/{id}/keep-disk`.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct KeepDisk {
    /// The volume's name (1-64 of a-z, 0-9, `-`, `_`, `.`; not starting with `-` or `.`);
    /// default: `lease-` and the lease id's first 8 hex digits.
    #[serde(default)]
    pub name: Option<String>,
    /// Keep period, seconds: the volume is deleted at its end (extend it with extendLease).
    pub keep_s: u32,
    /// Seconds of storage paid ahead, as in createVolume (default: the whole keep period).
    #[serde(default = "prepay_all")]
    pub prepay_s: u32,
    /// Budget cap (a decimal amount); default: the cost of the whole keep period.
    #[serde(default, with = "crate::renter::decimal")]
    #[schema(value_type = Option<String>)]
    pub max_total: Option<Money>,
}

/// `POST /v1/leases/{id}/keep-disk`.
#[utoipa::path(
    post,
    path = "/v1/leases/{id}/keep-disk",
    operation_id = "keepLeaseDisk",
    tag = "volumes",
    summary = "Stop a running lease and keep its /workspace as a volume on its provider (renter)",
    description = "Agrees a volume lease of the lease's workspace size at the provider's volume price for `keep_s`; the provider then ends the lease (the renter's stop: settled as any) and hands its workspace, files and all, to the volume, whose billing starts once the lease's has ended. Answers once the volume lease is agreed, with its id; getLease on it shows `running` once the workspace is kept. Mount it again with `volumes: [{volume, path: \"/workspace\"}]` in rentOffer.",
    params(("id" = String, Path, description = "Lease id or unique hex prefix")),
    request_body = KeepDisk,
    responses(
        (status = 201, description = "The volume lease was agreed; the lease is being stopped", body = RentedView),
        (status = 400, description = "Not a lease id (`invalid-parameter`), or the body is not JSON (`malformed-body`)", content_type = "application/problem+json", body = Problem),
        (status = 404, description = "No such lease (`unknown-lease`), or its provider has no offer in the book (`unknown-offer`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "This node provides the lease (`not-renter`), it is not running (`lease-not-running`), its /workspace is a volume already or the provider refused (`lease-rejected`: keeps no volumes, too large, keep too long, ...), or the prefix matches several leases (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 415, description = "The body is not application/json (`unsupported-media-type`)", content_type = "application/problem+json", body = Problem),
        (status = 422, description = "Not a valid name or keep period (`invalid-body`)", content_type = "application/problem+json", body = Problem),
        (status = 502, description = "The provider could not be reached (`provider-unreachable`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn keep_disk(
    State(s): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<KeepDisk>,
) -> Result<(StatusCode, Json<RentedView>), ApiError> {
    let id = super::resolve::resolve_lease(&s, &id).await?;
    let name = body
        .name
        .clone()
        .unwrap_or_else(|| format!("lease-{}", &id.to_string()[..8]));
    check_name(&name)?;
    check_keep(body.keep_s, body.max_total)?;
    let view = s
        .leases
        .lease(id)
        .await
        .map_err(lease_err)?
        .ok_or_else(|| ApiError::new(P::UnknownLease, format!("no lease {id} on this node")))?;
    if view.role != Role::Renter {
        return Err(ApiError::new(
            P::NotRenter,
            format!("this node provides lease {id}; its renter keeps its disk"),
        ));
    }
    if view.volume.is_some() {
        return Err(ApiError::new(
            P::LeaseRejected,
            format!("{id} is a volume already"),
        ));
    }
    if view.state != gridlease_contracts::LeaseState::Running {
        return Err(ApiError::new(
            P::LeaseNotRunning,
            format!(
                "lease {id} is {:?}: only a running lease's disk is kept",
                view.state
            ),
        ));
    }
    if view.workspace_lease() != id {
        return Err(ApiError::new(
            P::LeaseRejected,
            format!(
                "lease {id}'s /workspace is volume {} already: it stays when the lease stops",
                view.workspace_lease()
            ),
        ));
    }
    let offer = provider_offer(&s, &view.counterparty).await?;
    let volume = VolumeRequest {
        name,
        size_gib: u32::try_from(view.disk_bytes >> 30).unwrap_or(u32::MAX),
        adopts: Some(id),
    };
    agree(
        &s,
        offer,
        body.keep_s,
        body.prepay_s,
        body.max_total,
        volume,
    )
    .await
}

/// The current offer of the provider `who`: a peer id, or its key's hex (or first digits, as
/// an offer handle has them).
async fn provider_offer(s: &ApiState, who: &str) -> Result<gridlease_protocol::OfferId, ApiError> {
    let Ok(peer) = who.parse::<gridlease_protocol::PeerId>() else {
        return Ok(super::resolve::resolve_handle(s, who, "0").await?.0);
    };
    let book = s
        .client
        .search(gridlease_contracts::query::Query::default(), usize::MAX)
        .await
        .map_err(ApiError::internal)?;
    book.into_iter()
        .find(|e| e.offer.provider.peer_id().ok() == Some(peer))
        .map(|e| e.id)
        .ok_or_else(|| {
            ApiError::new(
                P::UnknownOffer,
                format!("no offer of provider {peer} in this node's book"),
            )
            .hint("`gridlease search` lists the providers this node knows")
        })
}

/// `GET /v1/volumes`.
#[utoipa::path(
    get,
    path = "/v1/volumes",
    operation_id = "listVolumes",
    tag = "volumes",
    summary = "This node's volumes (those it rents and those it keeps for renters), newest first",
    description = "Each is its volume lease's view: `volume` (name, size, price), `state` (`running`: kept), `time_left_s` until it is deleted, `authorised` (paid ahead), `cost_so_far`. Ended ones are listed until their lease is removed from the store.",
    responses(
        (status = 200, description = "The volumes", body = Vec<LeaseView>),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn list(State(s): State<ApiState>) -> Result<Json<Vec<LeaseView>>, ApiError> {
    let mut all: Vec<LeaseView> = s
        .leases
        .leases()
        .await
        .map_err(ApiError::internal)?
        .into_iter()
        .filter(|v| v.volume.is_some())
        .collect();
    all.sort_by_key(|v| std::cmp::Reverse(v.started_at.unwrap_or(u64::MAX)));
    Ok(Json(all))
}

/// `DELETE /v1/volumes/{volume}`.
#[utoipa::path(
    delete,
    path = "/v1/volumes/{volume}",
    operation_id = "removeVolume",
    tag = "volumes",
    summary = "Remove a volume now (renter): its lease ends, is settled, and the provider deletes it",
    description = "Answers once the stop is taken in hand; poll getLease until its state is terminal.",
    params(("volume" = String, Path, description = "The volume's name, or its lease id or unique hex prefix")),
    responses(
        (status = 200, description = "The removal was taken in hand", body = StoppingView),
        (status = 404, description = "No live volume of this node has this name or id (`unknown-volume`)", content_type = "application/problem+json", body = Problem),
        (status = 409, description = "The name or prefix matches several volumes (`ambiguous-id`)", content_type = "application/problem+json", body = Problem),
        (status = 500, description = "A failure inside the node (`internal`)", content_type = "application/problem+json", body = Problem),
    )
)]
pub(super) async fn remove(
    State(s): State<ApiState>,
    ApiPath(volume): ApiPath<String>,
) -> Result<Json<StoppingView>, ApiError> {
    let id = resolve_volume(&s, &volume, None).await?;
    s.leases.stop(id).await.map_err(lease_err)?;
    Ok(Json(StoppingView {
        lease_id: id.to_string(),
        stopping: true,
    }))
}

/// The one live volume this node rents whose name is `name` or whose id starts with it (on
/// the provider `provider`, when given).
pub(super) async fn resolve_volume(
    s: &ApiState,
    name: &str,
    provider: Option<&PublicKey>,
) -> Result<LeaseId, ApiError> {
    let peer = provider
        .and_then(|p| p.peer_id().ok())
        .map(|p| p.to_string());
    let all = s.leases.leases().await.map_err(ApiError::internal)?;
    let hex = name.to_ascii_lowercase();
    let hits: Vec<LeaseId> = all
        .iter()
        .filter(|v| v.role == Role::Renter && !v.state.is_terminal())
        .filter(|v| peer.as_ref().is_none_or(|p| &v.counterparty == p))
        .filter(|v| {
            v.volume.as_ref().is_some_and(|vol| vol.name == name)
                || (v.volume.is_some()
                    && hex.len() >= 4
                    && openapi::LEASE_ID.is_match(&hex)
                    && v.lease_id.to_string().starts_with(&hex))
        })
        .map(|v| v.lease_id)
        .collect();
    match hits.as_slice() {
        [one] => Ok(*one),
        [] => Err(ApiError::new(
            P::UnknownVolume,
            match provider {
                Some(_) => format!("no live volume {name:?} of this node on that offer's provider"),
                None => format!("no live volume {name:?} of this node"),
            },
        )
        .hint("`gridlease volume ls` lists them; a volume is mounted only on the provider that keeps it")),
        _ => Err(ApiError::new(
            P::AmbiguousId,
            format!("{name:?} names {} volumes", hits.len()),
        )
        .hint("give the volume's lease id (`gridlease volume ls`)")),
    }
}

/// `POST /v1/leases`' `volumes`, resolved to volume leases of this node on `provider`.
pub(super) async fn resolve_mounts(
    s: &ApiState,
    provider: &PublicKey,
    asked: &[VolumeMountRequest],
) -> Result<Vec<Mount>, ApiError> {
    let mut out = Vec::with_capacity(asked.len());
    for m in asked {
        if let Some(problem) = gridlease_protocol::mount_path_problem(&m.path) {
            return Err(ApiError::new(
                P::InvalidBody,
                format!("volume {} at {:?}: {problem}", m.volume, m.path),
            ));
        }
        out.push(Mount {
            volume: resolve_volume(s, &m.volume, Some(provider)).await?,
            path: m.path.clone(),
        });
    }
    Ok(out)
}
