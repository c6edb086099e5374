//! The lease stream (`/gridlease/lease/1`): what travels on it, with byte caps. Framing (a
//! 4-byte big-endian length, checked against the direction's cap before the body is
//! allocated) is done by the node's transport codec; this module is the message layer.
//!
//! | request (from)                 | response                                               |
//! |--------------------------------|--------------------------------------------------------|
//! | `Propose` (renter)             | `Accepted` (stored before sent) or `Rejected`          |
//! | `Session(Usage)` (provider)    | `Receipt` (persisted before sent), `NothingDue`, `Refused` |
//! | `Session(Close)` (either side) | `Closed` with the responder's last receipt             |
//! | `Session(Logs)` (renter)       | `Logs` (at most [`MAX_LOG_CHUNK`] bytes)                |
//! | `Session(Extend)` (renter)     | `Extended` (stored before sent) or `ExtendRefused`      |
//! | `Session(Telemetry)` (renter)  | `Telemetry` (at most [`MAX_TELEMETRY_SAMPLES`] samples) |
//! | `Session(Reports)` (renter)    | `Reports` (at most [`MAX_REPORTS_PER_BATCH`] reports, then the close) |
//! | `Session(ProofChallenge)` (renter) | `ProofCommit` or `Refused` ([`crate::proof`])       |
//! | `Session(ProofOpen)` (renter)  | `ProofOpening` or `Refused`                             |
//! | `Session(ProofReport)` (renter) | `ProofAck` (a pass) or `NothingDue`                    |
//!
//! Signed payloads inside are verified by their receiver, never by the codec.

use serde::{Deserialize, Serialize};

use crate::envelope::{ENVELOPE_OVERHEAD, Signed, WireMessage};
use crate::messages::{
    AmendAccept, AmendRefusal, CloseReason, LeaseAccept, LeaseAmendment, LeaseClose, LeaseReject,
    LeaseRequest, MAX_LEASE_ACCEPT_BYTES, MAX_LEASE_REQUEST_BYTES, PaymentReceipt, UsageReport,
};
#[cfg(doc)]
use crate::telemetry::MAX_TELEMETRY_SAMPLES;
use crate::telemetry::TelemetryBatch;
pub use crate::text::truncated;
use crate::types::{LeaseId, Timestamp};

/// Largest log chunk in one response, bytes: 1023 KiB (with its framing the response stays
/// under the codec's 1 MiB frame cap), so following a big log is a few hundred requests (at
/// 32 KiB a 200 MiB log took 6,400, and the per-peer rate limit of 40 requests a second held a
/// reader to 1.25 MiB/s). A renter asks for at most this; a provider answers with at most what
/// was asked, so either side of an older version still works (32 KiB).
pub const MAX_LOG_CHUNK: u32 = 1023 * 1024;
/// Longest free-text detail in a refusal, bytes.
pub const MAX_DETAIL: usize = 200;
/// Cap on a request frame body: the largest request envelope plus the enum tag.
pub const MAX_REQUEST_FRAME: usize = MAX_LEASE_REQUEST_BYTES + ENVELOPE_OVERHEAD + 16;
/// Cap on a response frame body: the largest response envelope plus the enum tag.
pub const MAX_RESPONSE_FRAME: usize = {
    let accept = MAX_LEASE_ACCEPT_BYTES + ENVELOPE_OVERHEAD + 16;
    // A log chunk: its bytes, the offset, eof, exit code and the enum tags.
    let logs = MAX_LOG_CHUNK as usize + 64;
    if accept > logs { accept } else { logs }
};
const _: () = assert!(MAX_RESPONSE_FRAME <= crate::codec::MAX_FRAME_BYTES);
// The GPU check's openings fit a response frame.
const _: () =
    assert!(crate::proof::MAX_PROOF_OPENING_BYTES + ENVELOPE_OVERHEAD + 16 <= MAX_RESPONSE_FRAME);
// Its report fits a request frame.
const _: () =
    assert!(crate::proof::MAX_PROOF_REPORT_BYTES + ENVELOPE_OVERHEAD + 16 <= MAX_REQUEST_FRAME);
const _: () = assert!(crate::telemetry::MAX_TELEMETRY_BYTES + 16 <= MAX_RESPONSE_FRAME);
// A full report batch (and its close) fits a response frame.
const _: () = assert!(
    MAX_REPORTS_PER_BATCH * (crate::messages::MAX_USAGE_REPORT_BYTES + ENVELOPE_OVERHEAD + 8)
        + crate::messages::MAX_LEASE_CLOSE_BYTES
        + ENVELOPE_OVERHEAD
        + 64
        <= MAX_RESPONSE_FRAME
);

/// What a renter sends to a provider (and, for lease sessions, either side to the other).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum LeaseRpc {
    /// A signed lease request.
    Propose(Signed<LeaseRequest>),
    /// A message of a running lease (usage, close, logs).
    Session(SessionRequest),
}

/// What the provider answers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum LeaseRpcResponse {
    /// The provider's signature over the requested terms.
    Accepted(Signed<LeaseAccept>),
    /// A signed refusal with a reason.
    Rejected(Signed<LeaseReject>),
    /// The answer to a [`LeaseRpc::Session`] request.
    Session(SessionResponse),
}

/// A session request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum SessionRequest {
    /// Provider -> renter: cumulative usage; answered with a receipt.
    Usage(Signed<UsageReport>),
    /// Either side: the lease is over (for the given reason, with the exit code if known).
    Close(Signed<LeaseClose>),
    /// Provider -> renter: the lease's image is being pulled (bytes of its layers so far, of
    /// those known); answered `NothingDue`. Tells the renter the start is progressing, so a
    /// long pull is not taken for a silent provider.
    Starting {
        /// The lease.
        lease_id: LeaseId,
        /// Bytes pulled so far.
        pulled: u64,
        /// Bytes of the layers known so far (grows as the daemon learns of layers).
        total: u64,
    },
    /// Renter -> provider: container output from `offset`.
    Logs {
        /// The lease.
        lease_id: LeaseId,
        /// Byte offset into the output.
        offset: u64,
        /// Most bytes wanted (capped at [`MAX_LOG_CHUNK`]).
        max: u32,
    },
    /// Renter -> provider: a signed amendment of the lease's terms (a longer duration);
    /// answered with [`SessionResponse::Extended`] or [`SessionResponse::ExtendRefused`].
    Extend(Signed<LeaseAmendment>),
    /// Provider -> renter: the lease's container is created and held, its `/workspace` open to
    /// the renter's uploads, until the renter sends [`Self::Begin`] or `until` (the terms'
    /// `upload_hold_s`); answered `NothingDue`.
    Held {
        /// The lease.
        lease_id: LeaseId,
        /// When the provider starts the command anyway.
        until: Timestamp,
    },
    /// Renter -> provider: start the held container's command now (uploads are done);
    /// answered `NothingDue` (also when it already runs).
    Begin {
        /// The lease.
        lease_id: LeaseId,
    },
    /// Renter -> provider: the live telemetry samples taken after `after` (`gridlease top`);
    /// answered [`SessionResponse::Telemetry`], or `UnknownLease` when the lease does not run
    /// here or is not the caller's.
    Telemetry {
        /// The lease.
        lease_id: LeaseId,
        /// Only samples taken after this (provider's clock; 0 for all it keeps).
        after: Timestamp,
    },
    /// Renter -> provider: the provider's signed usage reports with a sequence above
    /// `after_seq`, oldest first, and its close once the lease is over: how a renter that was
    /// away (suspended, restarted, offline during an unattended lease) reconciles. Answered
    /// [`SessionResponse::Reports`] (at most [`MAX_REPORTS_PER_BATCH`] reports), or
    /// `UnknownLease` when the lease is not the caller's.
    Reports {
        /// The lease.
        lease_id: LeaseId,
        /// Only reports after this sequence (0 for all).
        after_seq: u64,
    },
    /// Provider -> renter, after the close: the provider's signed record of the settled lease
    /// (reputation, issue 16). Answered [`SessionResponse::Completion`] with the renter's
    /// signature over the record it agrees with (the same one, or the same with outcome
    /// `Disputed` when the two sides' closes disagree), or `UnknownLease`.
    Complete(Signed<crate::completion::Completion>),
    /// Provider -> renter, as soon as the lease's command runs: when it started (the
    /// provider's clock; the lease clock's zero). The renter's view says `running` at once,
    /// not at the first usage report. Answered with [`SessionResponse::Receipt`] paying ahead
    /// what the terms' `prepay_s` says (so an unattended lease holds from its first second,
    /// whatever becomes of the renter's node after), else `NothingDue`.
    Started {
        /// The lease.
        lease_id: LeaseId,
        /// When its command started.
        started_at: Timestamp,
    },
    /// Provider -> renter: the lease's container is created and its verification window
    /// (`LeaseTerms::verify_window_s`, unbilled) is open until `until`; the renter runs its
    /// GPU check ([`crate::proof`]) and then reports. Answered `NothingDue`.
    Verifying {
        /// The lease.
        lease_id: LeaseId,
        /// When the provider closes the window (and the lease, unless a check passed).
        until: Timestamp,
    },
    /// Renter -> provider: an empty request, answered `NothingDue` at once: the round trip
    /// the check subtracts from the commitment's time.
    ProofPing {
        /// The lease.
        lease_id: LeaseId,
    },
    /// Renter -> provider: the GPU check's challenge; answered
    /// [`SessionResponse::ProofCommit`] (or `Refused` with a reason).
    ProofChallenge(Signed<crate::proof::ProofChallenge>),
    /// Renter -> provider: the reveal that picks the openings; answered
    /// [`SessionResponse::ProofOpening`].
    ProofOpen {
        /// The lease.
        lease_id: LeaseId,
        /// The secret whose hash the challenge carried.
        reveal: [u8; 32],
    },
    /// Renter -> provider: the renter's signed report of the check; a pass is answered
    /// [`SessionResponse::ProofAck`] (the provider's co-signature) and the command starts; a
    /// failure is answered `NothingDue` and the renter closes the lease.
    ProofReport(Signed<crate::proof::ProofReport>),
}

/// Most usage reports in one [`SessionResponse::Reports`].
pub const MAX_REPORTS_PER_BATCH: usize = 64;

/// The provider's usage reports of a lease after a sequence, and its close.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReportBatch {
    /// Signed usage reports, by ascending sequence (at most [`MAX_REPORTS_PER_BATCH`]).
    pub reports: Vec<Signed<UsageReport>>,
    /// More reports follow: ask again after the last one here.
    pub more: bool,
    /// The provider's signed close, when the lease is over there and no reports follow.
    pub close: Option<Signed<LeaseClose>>,
}

impl ReportBatch {
    /// Checks the shape a receiver relies on: at most [`MAX_REPORTS_PER_BATCH`] reports.
    /// (Each report's signature and sequence are checked by the receiver.)
    pub fn validate(&self) -> Result<(), String> {
        if self.reports.len() > MAX_REPORTS_PER_BATCH {
            return Err(format!(
                "{} reports in one batch, at most {MAX_REPORTS_PER_BATCH}",
                self.reports.len()
            ));
        }
        Ok(())
    }
}

impl SessionRequest {
    /// The lease the request is about, without verifying anything (for routing only).
    pub fn lease_hint(&self) -> Option<LeaseId> {
        match self {
            Self::Usage(s) => UsageReport::decode_payload(&s.envelope().payload)
                .ok()
                .map(|u| u.lease_id),
            Self::Close(s) => LeaseClose::decode_payload(&s.envelope().payload)
                .ok()
                .map(|c| c.lease_id),
            Self::Logs { lease_id, .. }
            | Self::Starting { lease_id, .. }
            | Self::Held { lease_id, .. }
            | Self::Started { lease_id, .. }
            | Self::Telemetry { lease_id, .. }
            | Self::Reports { lease_id, .. }
            | Self::Verifying { lease_id, .. }
            | Self::ProofPing { lease_id }
            | Self::ProofOpen { lease_id, .. }
            | Self::Begin { lease_id } => Some(*lease_id),
            Self::ProofChallenge(s) => {
                crate::proof::ProofChallenge::decode_payload(&s.envelope().payload)
                    .ok()
                    .map(|c| c.lease_id)
            }
            Self::ProofReport(s) => {
                crate::proof::ProofReport::decode_payload(&s.envelope().payload)
                    .ok()
                    .map(|r| r.lease_id)
            }
            Self::Extend(s) => LeaseAmendment::decode_payload(&s.envelope().payload)
                .ok()
                .map(|a| a.lease_id),
            Self::Complete(s) => {
                crate::completion::Completion::decode_payload(&s.envelope().payload)
                    .ok()
                    .map(|c| c.lease_id)
            }
        }
    }
}

/// Container output.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogChunk {
    /// Bytes from the requested offset.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// Offset to ask for next.
    pub next_offset: u64,
    /// No more output will ever come (the container has exited and everything was read).
    pub eof: bool,
    /// The container's exit code once it has exited.
    pub exit_code: Option<i32>,
}

/// A session response.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum SessionResponse {
    /// The renter's signed cumulative receipt for the report.
    Receipt(Signed<PaymentReceipt>),
    /// The report is valid but nothing new is due.
    NothingDue,
    /// The report was refused; the renter closes the lease for `reason`.
    Refused {
        /// Why.
        reason: CloseReason,
        /// Detail (at most [`MAX_DETAIL`] bytes).
        detail: String,
    },
    /// The close was recorded; the responder's last receipt for the lease, if any (a renter
    /// answering a provider's close returns its last receipt so both statements agree).
    Closed {
        /// The last receipt.
        last_receipt: Option<Signed<PaymentReceipt>>,
    },
    /// Container output.
    Logs(LogChunk),
    /// The amendment was accepted (and stored): the provider's signature over it.
    Extended(Signed<AmendAccept>),
    /// The amendment was refused; nothing changed.
    ExtendRefused(AmendRefusal),
    /// No such lease here, or not the caller's.
    UnknownLease,
    /// The responder is overloaded, not running, or could not store what it would answer;
    /// retry later (a provider's next cumulative report covers what this one did).
    Busy,
    /// Live telemetry of a running lease.
    Telemetry(TelemetryBatch),
    /// The provider's usage reports after a sequence, and its close.
    Reports(ReportBatch),
    /// The renter's signature over the completion record it agrees with.
    Completion(Signed<crate::completion::CompletionAck>),
    /// The provider's commitment to the GPU check's answer.
    ProofCommit(Signed<crate::proof::ProofCommit>),
    /// The provider's openings of that commitment.
    ProofOpening(Signed<crate::proof::ProofOpening>),
    /// The provider's co-signature of a passed check.
    ProofAck(Signed<crate::proof::ProofAck>),
}

/// Truncates a detail string to [`MAX_DETAIL`] bytes on a char boundary.
pub fn detail(s: impl std::fmt::Display) -> String {
    truncated(s, MAX_DETAIL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;
    use crate::types::Digest;
    use crate::{NetworkId, NodeKey};

    fn round_trip_response(r: SessionResponse) -> SessionResponse {
        let rpc = LeaseRpcResponse::Session(r);
        let bytes = codec::encode::<LeaseRpcResponse, MAX_RESPONSE_FRAME>(&rpc).unwrap();
        match codec::decode::<LeaseRpcResponse, MAX_RESPONSE_FRAME>(&bytes).unwrap() {
            LeaseRpcResponse::Session(r) => r,
            other => panic!("{other:?}"),
        }
    }

    fn amendment(lease_id: LeaseId) -> LeaseAmendment {
        LeaseAmendment {
            lease_id,
            seq: u64::MAX,
            duration_s: u32::MAX,
            max_total: u64::MAX,
            created_at: Timestamp(u64::MAX),
        }
    }

    #[test]
    fn amendments_and_their_answers_round_trip_within_their_caps() {
        use crate::envelope::WireMessage;
        use crate::messages::{MAX_AMEND_ACCEPT_BYTES, MAX_DETAIL_LEN, MAX_LEASE_AMENDMENT_BYTES};
        let key = NodeKey::from_secret([8; 32]);
        let net = NetworkId::devnet();
        let lease_id = LeaseId(Digest::of("t", b"lease"));
        // The largest values of every field fit the caps (varints at their longest).
        let a = amendment(lease_id);
        assert_eq!(a.encode_payload().unwrap().len(), 65);
        const { assert!(65 <= MAX_LEASE_AMENDMENT_BYTES) };
        let accept = AmendAccept {
            amendment: a.clone(),
            deadline: Timestamp(u64::MAX),
            accepted_at: Timestamp(u64::MAX),
        };
        assert_eq!(accept.encode_payload().unwrap().len(), 83);
        const { assert!(83 <= MAX_AMEND_ACCEPT_BYTES) };
        let signed = Signed::sign(&key, &net, &accept).unwrap();
        match round_trip_response(SessionResponse::Extended(signed)) {
            SessionResponse::Extended(got) => {
                let v = got.verify(&net).unwrap();
                assert_eq!(v.message, accept);
                assert_eq!(v.signer, key.public());
            }
            other => panic!("{other:?}"),
        }
        let refusal = AmendRefusal::Malformed {
            detail: "y".repeat(MAX_DETAIL_LEN),
        };
        match round_trip_response(SessionResponse::ExtendRefused(refusal.clone())) {
            SessionResponse::ExtendRefused(got) => assert_eq!(got, refusal),
            other => panic!("{other:?}"),
        }
        // An amendment signature is no acceptance: the kinds (and domain tags) differ.
        let proposal = Signed::sign(&key, &net, &a).unwrap();
        let bytes = proposal.to_bytes().unwrap();
        let forged = Signed::<AmendAccept>::from_bytes(&bytes).and_then(|s| s.verify(&net));
        assert!(forged.is_err(), "an amendment passed off as an acceptance");
    }

    #[test]
    fn largest_log_chunk_fits_the_response_frame() {
        let chunk = LogChunk {
            data: vec![0xab; MAX_LOG_CHUNK as usize],
            next_offset: u64::MAX,
            eof: true,
            exit_code: Some(-1),
        };
        match round_trip_response(SessionResponse::Logs(chunk.clone())) {
            SessionResponse::Logs(got) => assert_eq!(got, chunk),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn usage_and_close_requests_round_trip_and_name_their_lease() {
        let key = NodeKey::from_secret([7; 32]);
        let net = NetworkId::devnet();
        let lease_id = LeaseId(Digest::of("t", b"lease"));
        let report = UsageReport {
            lease_id,
            seq: 3,
            interval_start: Timestamp(1),
            interval_end: Timestamp(2),
            wall_ms: 10,
            gpu_ms: 10,
            cpu_ms: 5,
            energy_mj: 0,
            net_rx_bytes: 0,
            net_tx_bytes: 0,
            gpu_util_permille: 0,
            vram_peak_mib: 0,
            mem_peak_mib: 1,
            amount_due: 9,
            exit_code: None,
        };
        let close = LeaseClose {
            lease_id,
            reason: CloseReason::RenterStop,
            at: Timestamp(5),
            exit_code: None,
            failure: None,
        };
        for req in [
            SessionRequest::Usage(Signed::sign(&key, &net, &report).unwrap()),
            SessionRequest::Close(Signed::sign(&key, &net, &close).unwrap()),
            SessionRequest::Logs {
                lease_id,
                offset: 7,
                max: MAX_LOG_CHUNK,
            },
            SessionRequest::Extend(Signed::sign(&key, &net, &amendment(lease_id)).unwrap()),
            SessionRequest::Held {
                lease_id,
                until: Timestamp(9),
            },
            SessionRequest::Begin { lease_id },
            SessionRequest::Started {
                lease_id,
                started_at: Timestamp(11),
            },
        ] {
            assert_eq!(req.lease_hint(), Some(lease_id));
            let bytes =
                codec::encode::<LeaseRpc, MAX_REQUEST_FRAME>(&LeaseRpc::Session(req)).unwrap();
            match codec::decode::<LeaseRpc, MAX_REQUEST_FRAME>(&bytes).unwrap() {
                LeaseRpc::Session(got) => assert_eq!(got.lease_hint(), Some(lease_id)),
                other => panic!("{other:?}"),
            }
        }
        let refused = SessionResponse::Refused {
            reason: CloseReason::ImplausibleUsage,
            detail: detail("x".repeat(1000)),
        };
        match round_trip_response(refused) {
            SessionResponse::Refused { detail, .. } => assert_eq!(detail.len(), MAX_DETAIL),
            other => panic!("{other:?}"),
        }
    }
}
