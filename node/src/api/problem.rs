//! The one error body of the control API: an RFC 9457 problem (`application/problem+json`)
//! whose `type` names a [`ProblemType`], plus the human `hint` as an extension member.
//!
//! Every failure a handler, an extractor or the router gives goes through [`ApiError`], so a
//! client reads one shape: `type` to decide, `detail` and `hint` to show.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The media type of every error answer.
pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// The prefix of every problem `type` (a URN: it names the problem, it is not fetched); the
/// slug follows it, e.g. `urn:gridlease:problem:unknown-lease`.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:gridlease:problem:";

/// What went wrong, machine-readably: each kind has a stable slug, a title and one HTTP status.
/// `docs/api.md` lists them; clients branch on these, never on the `detail` text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProblemType {
    /// A path or query parameter is malformed (not a number, out of range, not hex).
    InvalidParameter,
    /// The search query does not parse (`GET /v1/offers?q=`); `detail` points at the token.
    InvalidQuery,
    /// The body is not JSON.
    MalformedBody,
    /// The body is JSON but not a valid request (a missing or mistyped field, a value out of
    /// range or not matching its pattern).
    InvalidBody,
    /// The body is not `application/json`.
    UnsupportedMediaType,
    /// No such route.
    NotFound,
    /// The route does not take this method.
    MethodNotAllowed,
    /// An access route was called without `Upgrade: gridlease-access`.
    UpgradeRequired,
    /// No lease of this node has this id (or prefix).
    UnknownLease,
    /// No offer in this node's book has this id (or prefix).
    UnknownOffer,
    /// The id prefix matches more than one lease or offer.
    AmbiguousId,
    /// The offer was replaced by its provider with other GPUs or a higher price.
    OfferReplaced,
    /// The request asks more than the offer gives (output retention, upload hold) or an image
    /// it does not run.
    BeyondOfferTerms,
    /// The offer is this node's own: a node does not rent from itself.
    OwnOffer,
    /// The provider refused the lease.
    LeaseRejected,
    /// The extension was refused (by the provider, or here by the same rule).
    ExtensionRefused,
    /// The provider refused interactive access, or does not offer it.
    AccessRefused,
    /// Only a lease's renter can do this, and this node provides the lease.
    NotRenter,
    /// The lease is over; nothing can be started in it.
    LeaseOver,
    /// The lease does not run (not started yet, or over): it has no live telemetry.
    LeaseNotRunning,
    /// The lease's provider offers no GPU check (`verify-gpu`), or this node is not its renter.
    NoGpuCheck,
    /// `PUT /v1/provide` without a price, and none was set before.
    PriceNeeded,
    /// `PUT /v1/provide` names no GPU this node has.
    NoGpus,
    /// The node cannot listen on the address asked (`listen`: in use, or not this machine's).
    ListenFailed,
    /// The provider could not be reached or gave no usable answer.
    ProviderUnreachable,
    /// The payment channel could not be read, opened or topped up on the chain.
    ChainFailed,
    /// This node does not settle on a chain by itself (no `chain_rpc`).
    NoChain,
    /// A job spec cannot run (`POST /v1/jobs`): `detail` names the field and line.
    InvalidJobSpec,
    /// No job of this node has this id (or prefix).
    UnknownJob,
    /// The job is over; it cannot be cancelled.
    JobOver,
    /// No live volume of this node's has this name or id (issue 47).
    UnknownVolume,
    /// A failure inside the node (see its log).
    Internal,
}

impl ProblemType {
    /// Every kind, in the order `docs/api.md` lists them.
    pub const ALL: [Self; 32] = [
        Self::InvalidParameter,
        Self::InvalidQuery,
        Self::MalformedBody,
        Self::InvalidBody,
        Self::UnsupportedMediaType,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::UpgradeRequired,
        Self::UnknownLease,
        Self::UnknownOffer,
        Self::AmbiguousId,
        Self::OfferReplaced,
        Self::BeyondOfferTerms,
        Self::OwnOffer,
        Self::LeaseRejected,
        Self::ExtensionRefused,
        Self::AccessRefused,
        Self::NotRenter,
        Self::LeaseOver,
        Self::LeaseNotRunning,
        Self::NoGpuCheck,
        Self::PriceNeeded,
        Self::NoGpus,
        Self::ListenFailed,
        Self::ProviderUnreachable,
        Self::ChainFailed,
        Self::NoChain,
        Self::InvalidJobSpec,
        Self::UnknownJob,
        Self::JobOver,
        Self::UnknownVolume,
        Self::Internal,
    ];

    /// The stable name, the last part of the `type` URN.
    pub fn slug(self) -> &'static str {
        match self {
            Self::InvalidParameter => "invalid-parameter",
            Self::InvalidQuery => "invalid-query",
            Self::MalformedBody => "malformed-body",
            Self::InvalidBody => "invalid-body",
            Self::UnsupportedMediaType => "unsupported-media-type",
            Self::NotFound => "not-found",
            Self::MethodNotAllowed => "method-not-allowed",
            Self::UpgradeRequired => "upgrade-required",
            Self::UnknownLease => "unknown-lease",
            Self::UnknownOffer => "unknown-offer",
            Self::AmbiguousId => "ambiguous-id",
            Self::OfferReplaced => "offer-replaced",
            Self::BeyondOfferTerms => "beyond-offer-terms",
            Self::OwnOffer => "own-offer",
            Self::LeaseRejected => "lease-rejected",
            Self::ExtensionRefused => "extension-refused",
            Self::AccessRefused => "access-refused",
            Self::NotRenter => "not-renter",
            Self::LeaseOver => "lease-over",
            Self::LeaseNotRunning => "lease-not-running",
            Self::NoGpuCheck => "no-gpu-check",
            Self::PriceNeeded => "price-needed",
            Self::NoGpus => "no-gpus",
            Self::ListenFailed => "listen-failed",
            Self::ProviderUnreachable => "provider-unreachable",
            Self::ChainFailed => "chain-failed",
            Self::NoChain => "no-chain",
            Self::InvalidJobSpec => "invalid-job-spec",
            Self::UnknownJob => "unknown-job",
            Self::JobOver => "job-over",
            Self::UnknownVolume => "unknown-volume",
            Self::Internal => "internal",
        }
    }

    /// A short summary that does not change from occurrence to occurrence.
    pub fn title(self) -> &'static str {
        match self {
            Self::InvalidParameter => "a parameter is malformed",
            Self::InvalidQuery => "the search query does not parse",
            Self::MalformedBody => "the body is not JSON",
            Self::InvalidBody => "the body is not a valid request",
            Self::UnsupportedMediaType => "the body must be application/json",
            Self::NotFound => "no such route",
            Self::MethodNotAllowed => "the route does not take this method",
            Self::UpgradeRequired => "this route needs Upgrade: gridlease-access",
            Self::UnknownLease => "no such lease",
            Self::UnknownOffer => "no such offer",
            Self::AmbiguousId => "the id prefix is ambiguous",
            Self::OfferReplaced => "the offer was replaced",
            Self::BeyondOfferTerms => "the request exceeds the offer's terms",
            Self::OwnOffer => "the offer is this node's own",
            Self::LeaseRejected => "the provider rejected the lease",
            Self::ExtensionRefused => "the extension was refused",
            Self::AccessRefused => "access was refused",
            Self::NotRenter => "only the lease's renter can do this",
            Self::LeaseOver => "the lease is over",
            Self::LeaseNotRunning => "the lease is not running",
            Self::NoGpuCheck => "no GPU check for this lease",
            Self::PriceNeeded => "a price is needed",
            Self::NoGpus => "no GPU to offer",
            Self::ListenFailed => "the node cannot listen on that address",
            Self::ProviderUnreachable => "the provider is unreachable",
            Self::ChainFailed => "the payment channel could not be opened or topped up",
            Self::NoChain => "this node does not settle on a chain by itself",
            Self::InvalidJobSpec => "the job spec cannot run",
            Self::UnknownJob => "no such job",
            Self::JobOver => "the job is over",
            Self::UnknownVolume => "no such volume",
            Self::Internal => "the node failed internally",
        }
    }

    /// The HTTP status this kind always answers with.
    pub fn status(self) -> StatusCode {
        match self {
            Self::InvalidParameter | Self::InvalidQuery | Self::MalformedBody => {
                StatusCode::BAD_REQUEST
            }
            Self::InvalidBody | Self::InvalidJobSpec => StatusCode::UNPROCESSABLE_ENTITY,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::NotFound
            | Self::UnknownLease
            | Self::UnknownOffer
            | Self::UnknownJob
            | Self::UnknownVolume => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            // A missing required header: a malformed request (the document requires both).
            Self::UpgradeRequired => StatusCode::BAD_REQUEST,
            Self::AmbiguousId
            | Self::OfferReplaced
            | Self::BeyondOfferTerms
            | Self::OwnOffer
            | Self::LeaseRejected
            | Self::ExtensionRefused
            | Self::AccessRefused
            | Self::NotRenter
            | Self::LeaseOver
            | Self::LeaseNotRunning
            | Self::NoGpuCheck
            | Self::PriceNeeded
            | Self::NoGpus
            | Self::ListenFailed
            | Self::JobOver
            | Self::NoChain => StatusCode::CONFLICT,
            Self::ProviderUnreachable => StatusCode::BAD_GATEWAY,
            Self::ChainFailed => StatusCode::BAD_GATEWAY,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `type` member: [`PROBLEM_TYPE_PREFIX`] and the slug.
    pub fn uri(self) -> String {
        format!("{PROBLEM_TYPE_PREFIX}{}", self.slug())
    }

    /// The kind a `type` member names (`None` for one this version does not know).
    pub fn from_uri(uri: &str) -> Option<Self> {
        let slug = uri.strip_prefix(PROBLEM_TYPE_PREFIX)?;
        Self::ALL.into_iter().find(|k| k.slug() == slug)
    }

    /// The other side (a provider, or the market's rules) said no: the CLI exits with 4.
    pub fn is_refusal(self) -> bool {
        matches!(
            self,
            Self::LeaseRejected
                | Self::OfferReplaced
                | Self::OwnOffer
                | Self::BeyondOfferTerms
                | Self::ExtensionRefused
                | Self::AccessRefused
        )
    }
}

/// The body of every error answer (RFC 9457), `application/problem+json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Problem {
    /// What kind of problem: `urn:gridlease:problem:<slug>`, one of the kinds `docs/api.md`
    /// lists. Stable; branch on it.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind (the same for every occurrence).
    pub title: String,
    /// The HTTP status, repeated.
    pub status: u16,
    /// What went wrong this time, in words.
    pub detail: String,
    /// What to do about it, when there is something to do (an extension member).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Problem {
    /// The kind its `type` names, if this version knows it.
    pub fn problem_type(&self) -> Option<ProblemType> {
        ProblemType::from_uri(&self.kind)
    }
}

/// A handler failure: a [`ProblemType`] with this occurrence's detail and hint.
#[derive(Debug)]
pub struct ApiError {
    kind: ProblemType,
    detail: String,
    hint: Option<String>,
}

impl ApiError {
    /// A problem of `kind`.
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            hint: None,
        }
    }

    /// With what to do about it.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// With an optional hint.
    pub fn maybe_hint(mut self, hint: Option<String>) -> Self {
        self.hint = hint;
        self
    }

    /// A failure inside the node.
    pub fn internal(error: impl std::fmt::Display) -> Self {
        Self::new(ProblemType::Internal, error.to_string()).hint("see the node's log")
    }

    /// The kind.
    pub fn kind(&self) -> ProblemType {
        self.kind
    }

    /// The body it answers with.
    pub fn problem(&self) -> Problem {
        Problem {
            kind: self.kind.uri(),
            title: self.kind.title().to_string(),
            status: self.kind.status().as_u16(),
            detail: self.detail.clone(),
            hint: self.hint.clone(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.problem()).unwrap_or_default();
        (
            self.kind.status(),
            [(header::CONTENT_TYPE, PROBLEM_CONTENT_TYPE)],
            body,
        )
            .into_response()
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        Self::new(ProblemType::InvalidParameter, r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        Self::new(ProblemType::InvalidParameter, r.body_text())
    }
}

/// A JSON body whose rejection is a [`Problem`]: 415 without `Content-Type: application/json`
/// (or `+json`), 400 when it is not JSON, 422 when it is not the request. A number with a
/// zero fraction (`60.0`) is the integer it equals, as in JSON Schema, where it is an
/// `integer`.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|m| m.trim().to_ascii_lowercase())
            .is_some_and(|m| m == "application/json" || m.ends_with("+json"));
        if !json {
            return Err(ApiError::new(
                ProblemType::UnsupportedMediaType,
                "expected a body with Content-Type: application/json",
            ));
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| ApiError::new(ProblemType::MalformedBody, e.body_text()))?;
        json_body(&bytes).map(Self)
    }
}

/// A request body read as JSON the way [`ApiJson`] reads it (400 `malformed-body` when it is
/// not JSON, 422 `invalid-body` when it is not a `T`; a number with a zero fraction is the
/// integer it equals), for routes that take the body themselves (the access routes).
pub fn json_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let mut value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(ProblemType::MalformedBody, format!("not JSON: {e}")))?;
    integral_floats(&mut value);
    T::deserialize(value).map_err(|e| ApiError::new(ProblemType::InvalidBody, e.to_string()))
}

/// Numbers with a zero fraction become integers (within the 64-bit range).
fn integral_floats(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Number(n) if n.is_f64() => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
            {
                // The casts are exact: f is whole and within the bounds checked.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                    *v = Value::from(f as u64);
                } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                    *v = Value::from(f as i64);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(integral_floats),
        Value::Object(m) => m.values_mut().for_each(integral_floats),
        _ => {}
    }
}

/// `axum::extract::Query` whose rejection is a [`Problem`].
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(v) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(Self(v))
    }
}

/// `axum::extract::Path` whose rejection is a [`Problem`].
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(v) =
            axum::extract::Path::<T>::from_request_parts(parts, state).await?;
        Ok(Self(v))
    }
}

/// The router's answer for a path no route has.
pub async fn no_route(uri: axum::http::Uri) -> ApiError {
    ApiError::new(ProblemType::NotFound, format!("no route {}", uri.path()))
        .hint("the routes are in docs/openapi.json (GET /v1/openapi.json)")
}

/// The router's answer for a method a route does not take.
pub async fn wrong_method(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        ProblemType::MethodNotAllowed,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_uri_and_slugs_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for k in ProblemType::ALL {
            assert!(seen.insert(k.slug()), "{} twice", k.slug());
            assert_eq!(ProblemType::from_uri(&k.uri()), Some(k));
            assert!(k.status().is_client_error() || k.status().is_server_error());
        }
        assert_eq!(ProblemType::from_uri("urn:gridlease:problem:nope"), None);
    }

    #[test]
    fn whole_floats_are_integers() {
        let mut v = serde_json::json!({"a": 60.0, "b": [1.5, -3.0], "c": 1e300});
        integral_floats(&mut v);
        assert_eq!(v, serde_json::json!({"a": 60, "b": [1.5, -3], "c": 1e300}));
    }

    #[test]
    fn the_body_is_rfc_9457_with_a_hint() {
        let e = ApiError::new(ProblemType::UnknownLease, "no lease ab on this node").hint("h");
        let v = serde_json::to_value(e.problem()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "type": "urn:gridlease:problem:unknown-lease",
                "title": "no such lease",
                "status": 404,
                "detail": "no lease ab on this node",
                "hint": "h",
            })
        );
    }
}
