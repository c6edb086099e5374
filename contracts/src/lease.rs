//! The lease lifecycle: an enum with guards, and transitions that take `now` and say who
//! caused them.
//!
//! ```text
//!  Proposed --accept(P)--> Accepted --begin_start(P)--> Starting --started(P)--> Running
//!     |                       |                            |                       |
//!  reject(P)                close(R|P)               close(R|P) / fail(P)     close(R|P)
//!     v                       v                            v                       v
//!  Rejected                Closing <-----------------------+-----------------------+
//!                             |
//!                          settle(R|P) --> Settled
//!  any non-terminal --fail(P|L)--> Failed
//! ```
//! P = provider, R = renter, L = the local node itself (e.g. reconciliation after a crash).
//! Each node keeps its own copy of the machine and applies the transitions it observes.

use gridlease_protocol::{CloseReason, LeaseId, LeaseTerms, Timestamp};
use serde::{Deserialize, Serialize};

use crate::money::Money;

/// Where a lease is in its life. Serializes as its [`as_str`](Self::as_str) name (`"running"`),
/// which the control API's JSON and scripts rely on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum LeaseState {
    /// The renter sent the request; no answer yet.
    Proposed,
    /// Both have signed the terms; nothing runs yet.
    Accepted,
    /// The provider is preparing the image and creating the container.
    Starting,
    /// The container runs; usage is metered and paid.
    Running,
    /// The lease is over; the final statement is being agreed.
    Closing,
    /// Final statement booked. Terminal.
    Settled,
    /// The provider refused. Terminal.
    Rejected,
    /// Broke before it could be settled normally (start failure, lost container). Terminal.
    Failed,
}

impl LeaseState {
    /// Every state, in lifecycle order.
    pub const ALL: [Self; 8] = [
        Self::Proposed,
        Self::Accepted,
        Self::Starting,
        Self::Running,
        Self::Closing,
        Self::Settled,
        Self::Rejected,
        Self::Failed,
    ];

    /// Accepting is legal only for a proposal.
    pub fn can_accept(self) -> bool {
        self == Self::Proposed
    }
    /// Starting the container is legal only once accepted.
    pub fn can_begin_start(self) -> bool {
        self == Self::Accepted
    }
    /// Marking it running is legal only while starting.
    pub fn can_mark_running(self) -> bool {
        self == Self::Starting
    }
    /// Closing is legal while accepted, starting or running.
    pub fn can_close(self) -> bool {
        matches!(self, Self::Accepted | Self::Starting | Self::Running)
    }
    /// Amending the terms (a longer duration, `gridlease extend`) is legal only while running.
    pub fn can_amend(self) -> bool {
        self == Self::Running
    }
    /// Settling is legal only while closing.
    pub fn can_settle(self) -> bool {
        self == Self::Closing
    }
    /// Nothing leaves a terminal state.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Settled | Self::Rejected | Self::Failed)
    }
    /// The container may be running in this state (reconciliation keeps it).
    pub fn wants_container(self) -> bool {
        matches!(self, Self::Starting | Self::Running)
    }
    /// Lower-case name for tables and the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Proposed => "proposed",
            Self::Accepted => "accepted",
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Closing => "closing",
            Self::Settled => "settled",
            Self::Rejected => "rejected",
            Self::Failed => "failed",
        }
    }
}

impl std::str::FromStr for LeaseState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "proposed" => Self::Proposed,
            "accepted" => Self::Accepted,
            "starting" => Self::Starting,
            "running" => Self::Running,
            "closing" => Self::Closing,
            "settled" => Self::Settled,
            "rejected" => Self::Rejected,
            "failed" => Self::Failed,
            other => return Err(format!("unknown lease state {other:?}")),
        })
    }
}

/// Who causes a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Actor {
    /// The renter (by a signed message, or locally on the renter's node).
    Renter,
    /// The provider (by a signed message, or locally on the provider's node).
    Provider,
    /// The local node on its own authority (crash reconciliation).
    Local,
}

/// What happened to a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseEvent {
    /// The provider signed the terms. By: provider.
    Accept,
    /// The provider refused. By: provider.
    Reject,
    /// The provider began preparing the container. By: provider.
    BeginStart,
    /// The container is running; the lease clock starts. By: provider.
    Started,
    /// The lease ends. By: renter or provider.
    Close(CloseReason),
    /// The final statement is booked. By: renter or provider, each for its own ledger.
    Settle {
        /// The final amount (the last valid receipt).
        total: Money,
    },
    /// Broke irrecoverably. By: provider or the local node.
    Fail(CloseReason),
}

/// An illegal transition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The event is not legal in the current state.
    #[error("lease {lease}: cannot {event:?} while {state:?}")]
    IllegalInState {
        /// The lease.
        lease: LeaseId,
        /// Its state.
        state: LeaseState,
        /// The attempted event.
        event: LeaseEvent,
    },
    /// This actor may not cause this event.
    #[error("lease {lease}: {actor:?} may not cause {event:?}")]
    NotAllowed {
        /// The lease.
        lease: LeaseId,
        /// Who tried.
        actor: Actor,
        /// The attempted event.
        event: LeaseEvent,
    },
}

/// One entry of a lease's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// When.
    pub at: Timestamp,
    /// Who.
    pub actor: Actor,
    /// What.
    pub event: LeaseEvent,
    /// The state it led to.
    pub to: LeaseState,
}

/// A lease as one node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Hash of the original terms (amendments do not change it).
    pub id: LeaseId,
    /// The agreed terms, as amended by the accepted amendments (their duration and budget cap:
    /// [`crate::amend::amended_terms`]); the original terms are the signed request's.
    pub terms: LeaseTerms,
    /// Accepted amendments (extensions): the sequence of the last one, 0 for none.
    pub extensions: u64,
    /// Current state.
    pub state: LeaseState,
    /// When the container started (the lease clock's zero).
    pub started_at: Option<Timestamp>,
    /// When it closed.
    pub closed_at: Option<Timestamp>,
    /// Why it closed or failed.
    pub close_reason: Option<CloseReason>,
    /// The settled amount.
    pub settled_total: Option<Money>,
    /// Every transition, in order.
    pub history: Vec<Transition>,
}

impl Lease {
    /// A new proposal.
    pub fn propose(id: LeaseId, terms: LeaseTerms) -> Self {
        Self {
            id,
            terms,
            state: LeaseState::Proposed,
            extensions: 0,
            started_at: None,
            closed_at: None,
            close_reason: None,
            settled_total: None,
            history: Vec::new(),
        }
    }

    /// When the container must be stopped: start + requested duration.
    pub fn deadline(&self) -> Option<Timestamp> {
        self.started_at
            .map(|s| s.plus_secs(u64::from(self.terms.duration_s)))
    }

    /// Whether `actor` may cause `event` at all (independent of state).
    pub fn allowed(actor: Actor, event: &LeaseEvent) -> bool {
        match event {
            LeaseEvent::Accept
            | LeaseEvent::Reject
            | LeaseEvent::BeginStart
            | LeaseEvent::Started => actor == Actor::Provider,
            LeaseEvent::Close(_) | LeaseEvent::Settle { .. } => {
                matches!(actor, Actor::Renter | Actor::Provider)
            }
            LeaseEvent::Fail(_) => matches!(actor, Actor::Provider | Actor::Local),
        }
    }

    /// Applies `event` caused by `actor` at `now`, or explains why it is illegal.
    pub fn apply(
        &mut self,
        event: LeaseEvent,
        actor: Actor,
        now: Timestamp,
    ) -> Result<LeaseState, TransitionError> {
        if !Self::allowed(actor, &event) {
            return Err(TransitionError::NotAllowed {
                lease: self.id,
                actor,
                event,
            });
        }
        let s = self.state;
        let legal = match event {
            LeaseEvent::Accept | LeaseEvent::Reject => s.can_accept(),
            LeaseEvent::BeginStart => s.can_begin_start(),
            LeaseEvent::Started => s.can_mark_running(),
            LeaseEvent::Close(_) => s.can_close(),
            LeaseEvent::Settle { .. } => s.can_settle(),
            LeaseEvent::Fail(_) => !s.is_terminal(),
        };
        if !legal {
            return Err(TransitionError::IllegalInState {
                lease: self.id,
                state: s,
                event,
            });
        }
        let to = match event {
            LeaseEvent::Accept => LeaseState::Accepted,
            LeaseEvent::Reject => LeaseState::Rejected,
            LeaseEvent::BeginStart => LeaseState::Starting,
            LeaseEvent::Started => {
                self.started_at = Some(now);
                LeaseState::Running
            }
            LeaseEvent::Close(reason) => {
                self.closed_at = Some(now);
                self.close_reason = Some(reason);
                LeaseState::Closing
            }
            LeaseEvent::Settle { total } => {
                self.settled_total = Some(total);
                LeaseState::Settled
            }
            LeaseEvent::Fail(reason) => {
                self.closed_at.get_or_insert(now);
                self.close_reason.get_or_insert(reason);
                LeaseState::Failed
            }
        };
        self.state = to;
        self.history.push(Transition {
            at: now,
            actor,
            event,
            to,
        });
        Ok(to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::fixtures::{self, T0};
    use gridlease_protocol::{Digest, NodeKey, OfferId};

    fn lease() -> Lease {
        let p = NodeKey::from_secret([1; 32]);
        let r = NodeKey::from_secret([2; 32]);
        let offer = fixtures::offer(p.public(), 1, 2, 1_000_000);
        let terms = fixtures::terms(OfferId(Digest([3; 32])), &offer, r.public(), 1, 120);
        Lease::propose(terms.lease_id().unwrap(), terms)
    }

    #[test]
    fn happy_path_records_history_and_deadline() {
        let mut l = lease();
        l.apply(LeaseEvent::Accept, Actor::Provider, T0).unwrap();
        l.apply(LeaseEvent::BeginStart, Actor::Provider, T0.plus_ms(5))
            .unwrap();
        l.apply(LeaseEvent::Started, Actor::Provider, T0.plus_secs(1))
            .unwrap();
        assert_eq!(l.deadline(), Some(T0.plus_secs(121)));
        l.apply(
            LeaseEvent::Close(CloseReason::Expired),
            Actor::Provider,
            T0.plus_secs(121),
        )
        .unwrap();
        l.apply(
            LeaseEvent::Settle {
                total: Money::from_micros(5),
            },
            Actor::Renter,
            T0.plus_secs(122),
        )
        .unwrap();
        assert_eq!(l.state, LeaseState::Settled);
        assert_eq!(l.history.len(), 5);
        assert_eq!(l.settled_total, Some(Money::from_micros(5)));
    }

    #[test]
    fn renter_cannot_accept_or_start() {
        let mut l = lease();
        assert!(matches!(
            l.apply(LeaseEvent::Accept, Actor::Renter, T0),
            Err(TransitionError::NotAllowed { .. })
        ));
        l.apply(LeaseEvent::Accept, Actor::Provider, T0).unwrap();
        assert!(l.apply(LeaseEvent::BeginStart, Actor::Renter, T0).is_err());
        assert!(
            l.apply(
                LeaseEvent::Fail(CloseReason::StartFailed),
                Actor::Renter,
                T0
            )
            .is_err()
        );
    }

    #[test]
    fn terminal_states_are_final() {
        let mut l = lease();
        l.apply(LeaseEvent::Reject, Actor::Provider, T0).unwrap();
        for (e, a) in [
            (LeaseEvent::Accept, Actor::Provider),
            (LeaseEvent::Close(CloseReason::RenterStop), Actor::Renter),
            (LeaseEvent::Fail(CloseReason::StartFailed), Actor::Local),
        ] {
            assert!(matches!(
                l.apply(e, a, T0),
                Err(TransitionError::IllegalInState { .. })
            ));
        }
        assert_eq!(l.state, LeaseState::Rejected);
    }

    #[test]
    fn settle_only_after_close_and_close_only_once() {
        let mut l = lease();
        l.apply(LeaseEvent::Accept, Actor::Provider, T0).unwrap();
        assert!(
            l.apply(LeaseEvent::Settle { total: Money::ZERO }, Actor::Renter, T0)
                .is_err()
        );
        l.apply(
            LeaseEvent::Close(CloseReason::RenterStop),
            Actor::Renter,
            T0,
        )
        .unwrap();
        assert!(
            l.apply(LeaseEvent::Close(CloseReason::Expired), Actor::Provider, T0)
                .is_err()
        );
        assert_eq!(l.close_reason, Some(CloseReason::RenterStop));
    }

    #[test]
    fn states_round_trip_through_text() {
        for s in [
            LeaseState::Proposed,
            LeaseState::Accepted,
            LeaseState::Starting,
            LeaseState::Running,
            LeaseState::Closing,
            LeaseState::Settled,
            LeaseState::Rejected,
            LeaseState::Failed,
        ] {
            assert_eq!(s.as_str().parse::<LeaseState>().unwrap(), s);
            // serde reads the same names (node/src/lease/view.rs tests the JSON both ways).
            let de = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(s.as_str());
            assert_eq!(LeaseState::deserialize(de).unwrap(), s);
        }
        assert!("bogus".parse::<LeaseState>().is_err());
    }
}
