//! Ids and prefixes in paths and bodies, resolved to the one lease or offer they name, and
//! lease errors as problems.

use gridlease_contracts::Money;
use gridlease_protocol::{LeaseId, OfferId};

use super::problem::{ApiError, ProblemType as P};
use super::{ApiState, openapi};
use crate::lease::LeaseError;
/// Finds the one lease whose id starts with `prefix` (hex).
pub(super) async fn resolve_lease(s: &ApiState, prefix: &str) -> Result<LeaseId, ApiError> {
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
pub(super) async fn resolve_offer(
    s: &ApiState,
    prefix: &str,
) -> Result<(OfferId, Option<String>), ApiError> {
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
pub(super) async fn resolve_handle(
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

/// A lease service error as the problem it answers.
pub(super) fn lease_err(e: LeaseError) -> ApiError {
    match e {
        LeaseError::Unknown(id) => {
            ApiError::new(P::UnknownLease, format!("no lease {id} on this node"))
        }
        e @ LeaseError::NotRunning(_) => ApiError::new(P::LeaseNotRunning, e.to_string()),
        e @ LeaseError::NoGpuCheck(..) => ApiError::new(P::NoGpuCheck, e.to_string()),
        e @ LeaseError::Remote { .. } => ApiError::new(P::ProviderUnreachable, e.to_string())
            .hint("check `gridlease peers`, then retry"),
        other => ApiError::internal(other),
    }
}
