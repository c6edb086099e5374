//! Extending a running lease (`gridlease extend`, `POST /v1/leases/{id}/extend`): the renter's
//! session proposes a signed [`LeaseAmendment`] (the next sequence, a longer duration, the
//! budget cap raised by what the added time costs: `gridlease_contracts::amend`), the
//! provider's session decides it and answers with its signature over the same amendment.
//!
//! # The path of one extend
//! 1. The API hands an [`ExtendRequest`] to [`super::LeaseService::extend`], which sends it to
//!    the lease's renter session ([`super::session::SessionMsg::Extend`]).
//! 2. The renter session builds the amendment (`amend::propose`: refused locally with the
//!    provider's own reason when the lease does not run, the cap would go down, ...), signs it,
//!    stores it as *pending*, and sends `SessionRequest::Extend` ([`send`]).
//! 3. The provider's session (in its metering loop) verifies it, checks it
//!    (`amend::check_amendment`: running, next sequence, longer, within the offer's
//!    `max_duration_s`, its GPUs still offered, not within 1 s of the SIGTERM time), signs the
//!    [`AmendAccept`], writes the watchdog's deadline file, stores the amendment with its
//!    acceptance, and only then moves its own deadline (the session's `StopSchedule`), takes the
//!    new terms into its payment channel and answers.
//! 4. The renter verifies the acceptance (`amend::check_acceptance`), stores it, then takes the
//!    new terms (its channel accepts usage up to the new duration and cap).
//!
//! The deadline has one owner: the provider session's lease (`started_at + duration_s` of the
//! amended terms); the watchdog's file and the renter's view are copies written from it.
//!
//! # A lost answer
//! The provider's acceptance is idempotent (the same amendment again gets the same signed
//! acceptance). A renter whose answer was lost keeps the amendment pending and sends it again:
//! at the next `extend` (which then answers with the earlier extension, if it was accepted),
//! and before it refuses a usage report that only the pending amendment would make valid.

use gridlease_contracts::Money;
use gridlease_contracts::amend::{check_acceptance, refusal_text};
use gridlease_protocol::{
    AmendAccept, AmendRefusal, LeaseAmendment, LeaseId, PeerId, PublicKey, Signed, Timestamp,
};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::ctx::Ctx;
use super::error::SessionRpcError;
use super::rpc::session_rpc;
use super::wire::{SessionRequest, SessionResponse};
use crate::store::StoreError;

/// What a renter asks for: the body of `POST /v1/leases/{id}/extend`. Exactly one of
/// `minutes` and `seconds`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendRequest {
    /// Minutes to add to the lease's duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minutes: Option<u32>,
    /// Seconds to add to the lease's duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<u32>,
    /// The new budget cap (a decimal amount, e.g. `"1.5"`); default: the current cap plus the
    /// cost of the added time. Never below the current cap.
    #[serde(
        default,
        with = "crate::renter::decimal",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub max_total: Option<Money>,
}

impl ExtendRequest {
    /// Seconds to add, or why the request is not one.
    pub fn added_s(&self) -> Result<u32, ExtendError> {
        let s = match (self.minutes, self.seconds) {
            (Some(m), None) => m.checked_mul(60).ok_or_else(|| {
                ExtendError::BadRequest(format!("{m} minutes is too long an extension"))
            })?,
            (None, Some(s)) => s,
            _ => {
                return Err(ExtendError::BadRequest(
                    "give exactly one of minutes and seconds".into(),
                ));
            }
        };
        if s == 0 {
            return Err(ExtendError::BadRequest(
                "an extension adds at least one second".into(),
            ));
        }
        Ok(s)
    }
}

/// The answer of an accepted extension: the lease's terms now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Extended {
    /// The lease (64 hex digits).
    pub lease_id: String,
    /// Extensions accepted so far (this one's sequence).
    pub extensions: u64,
    /// The lease's duration now, seconds from its start.
    pub duration_s: u32,
    /// The budget cap now, micro-units.
    pub max_total: u64,
    /// The container is stopped at this time (unix ms, by the provider's clock).
    pub deadline_ms: u64,
    /// Seconds from now to that deadline.
    pub time_left_s: u64,
    /// Something the renter should know (an earlier pending extension was the one accepted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Extended {
    /// The answer for acceptance `accept` seen at `now`.
    pub(crate) fn of(accept: &AmendAccept, now: Timestamp) -> Self {
        let a = &accept.amendment;
        Self {
            lease_id: a.lease_id.to_string(),
            extensions: a.seq,
            duration_s: a.duration_s,
            max_total: a.max_total,
            deadline_ms: accept.deadline.0,
            time_left_s: accept.deadline.ms_since(now) / 1000,
            note: None,
        }
    }
}

/// Why an extension did not happen. Nothing changed on either side, except with
/// [`ExtendError::Remote`], where the amendment stays pending (it is sent again).
#[derive(Debug, thiserror::Error)]
pub enum ExtendError {
    /// Refused, by the provider or already by this node with the provider's rule.
    #[error("{}", refusal_text(.0))]
    Refused(AmendRefusal),
    /// This node is the lease's provider: only its renter extends it.
    #[error("this node provides lease {0}; only its renter can extend it")]
    NotRenter(LeaseId),
    /// No such lease on this node.
    #[error("no lease {0} on this node")]
    Unknown(LeaseId),
    /// The request is not a valid extension.
    #[error("{0}")]
    BadRequest(String),
    /// The provider could not be reached or answered something unusable; the amendment is
    /// pending and is sent again.
    #[error(
        "lease {lease_id}: the provider did not accept the extension ({detail}); it is kept and sent again with the next `extend`"
    )]
    Remote {
        /// The lease.
        lease_id: LeaseId,
        /// Why.
        #[source]
        detail: Box<ExtendFailure>,
    },
    /// This node could not store the amendment; nothing was sent or applied.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The lease service has stopped.
    #[error("the lease service has stopped")]
    Closed,
}

/// An extension asked of a session.
#[derive(Debug)]
pub(crate) struct ExtendAsk {
    /// Seconds to add.
    pub(crate) add_s: u32,
    /// The cap asked for (`None`: raised by the added time's cost).
    pub(crate) max_total: Option<Money>,
    /// Where the session answers.
    pub(crate) reply: oneshot::Sender<Result<Extended, ExtendError>>,
}

/// What the provider answered to an amendment.
pub(crate) enum Answer {
    /// Accepted: its signed acceptance (verified, of exactly this amendment).
    Accepted(Signed<AmendAccept>, AmendAccept),
    /// Refused, with the reason.
    Refused(AmendRefusal),
    /// No usable answer.
    Failed(ExtendFailure),
}

/// Why the provider's answer to an amendment is unusable ([`ExtendError::Remote`]).
#[derive(Debug, thiserror::Error)]
pub enum ExtendFailure {
    /// The provider's key in the terms is no peer id.
    #[error("the provider has no peer id")]
    NoPeer,
    /// The request got no answer.
    #[error(transparent)]
    Rpc(#[from] SessionRpcError),
    /// The acceptance does not verify.
    #[error("its acceptance does not verify: {0}")]
    Signature(#[from] gridlease_protocol::EnvelopeError),
    /// The acceptance is not of this amendment, or not the provider's.
    #[error(transparent)]
    Acceptance(#[from] gridlease_contracts::amend::AmendAcceptError),
    /// An answer that does not fit the request.
    #[error("the provider answered {0:?}")]
    Unexpected(Box<SessionResponse>),
}

/// Sends the signed amendment `signed` (of `proposed`) to the provider `provider` at `peer`
/// and checks its answer.
pub(crate) async fn send(
    ctx: &Ctx,
    peer: PeerId,
    provider: &PublicKey,
    signed: &Signed<LeaseAmendment>,
    proposed: &LeaseAmendment,
) -> Answer {
    match session_rpc(ctx, peer, SessionRequest::Extend(signed.clone())).await {
        Ok(SessionResponse::Extended(sa)) => match sa.verify(ctx.client.network()) {
            Ok(v) => match check_acceptance(proposed, &v.message, &v.signer, provider) {
                Ok(()) => Answer::Accepted(sa, v.message),
                Err(e) => Answer::Failed(e.into()),
            },
            Err(e) => Answer::Failed(e.into()),
        },
        Ok(SessionResponse::ExtendRefused(r)) => Answer::Refused(r),
        Ok(SessionResponse::UnknownLease) => Answer::Refused(AmendRefusal::NotRunning {
            state: "over at the provider".into(),
        }),
        Ok(other) => Answer::Failed(ExtendFailure::Unexpected(Box::new(other))),
        Err(e) => Answer::Failed(e.into()),
    }
}

/// Decodes a stored signed amendment (verified before it was stored).
pub(crate) fn decode_proposal(bytes: &[u8]) -> Option<(Signed<LeaseAmendment>, LeaseAmendment)> {
    let s = Signed::<LeaseAmendment>::from_bytes(bytes).ok()?;
    let m = gridlease_protocol::WireMessage::decode_payload(&s.envelope().payload).ok()?;
    Some((s, m))
}

/// Decodes a stored signed acceptance.
pub(crate) fn decode_acceptance(bytes: &[u8]) -> Option<(Signed<AmendAccept>, AmendAccept)> {
    let s = Signed::<AmendAccept>::from_bytes(bytes).ok()?;
    let m = gridlease_protocol::WireMessage::decode_payload(&s.envelope().payload).ok()?;
    Some((s, m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_adds_minutes_or_seconds_never_both_or_none() {
        let r = |minutes, seconds| ExtendRequest {
            minutes,
            seconds,
            max_total: None,
        };
        assert_eq!(r(Some(5), None).added_s().unwrap(), 300);
        assert_eq!(r(None, Some(7)).added_s().unwrap(), 7);
        for bad in [r(None, None), r(Some(1), Some(1)), r(None, Some(0))] {
            assert!(matches!(bad.added_s(), Err(ExtendError::BadRequest(_))));
        }
        assert!(r(Some(u32::MAX), None).added_s().is_err());
        let json: ExtendRequest =
            serde_json::from_str(r#"{"minutes":10,"max_total":"1.5"}"#).unwrap();
        assert_eq!(json.added_s().unwrap(), 600);
        assert_eq!(json.max_total, Some(Money::from_micros(1_500_000)));
        assert!(serde_json::from_str::<ExtendRequest>(r#"{"hours":1}"#).is_err());
    }
}
