//! `PUT /v1/provide`: set or withdraw this node's offer.

use axum::Json;
use axum::extract::State;
use gridlease_contracts::Money;
use gridlease_contracts::schedule::Schedule;
use gridlease_protocol::NetworkPolicy;

use super::node::status;
use super::problem::{ApiError, ApiJson, Problem, ProblemType as P};
use super::types::{ProvideBody, StatusView};
use super::{ApiState, openapi};
use crate::lease::{ProvideError, ProvideSettings};
/// What the document says of `PUT /v1/provide`, checked before anything changes.
pub(super) fn check_provide(b: &ProvideBody) -> Result<(), ApiError> {
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
pub(super) async fn provide(
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
    crate::lease::hours::zone(tz.as_deref()).map_err(|e| ApiError::new(P::InvalidBody, e))?;
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
