//! A lease's GPU check as the control API shows it ([`GpuCheckView`]): read off a kept record
//! (`gridlease_protocol::proof::ProofRecord`), shared by the lease views, the sessions and the
//! renter's check (`super::gpu_check`).

use gridlease_contracts::proof;
use gridlease_protocol::WireMessage;
use gridlease_protocol::proof::{ProofChallenge, ProofRecord, ProofReport};
use serde::{Deserialize, Serialize};

/// A lease's GPU check as the control API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GpuCheckView {
    /// `verifying`, `passed` or `failed`.
    pub state: String,
    /// What answered: `cuda`, or `cpu-reference: not a GPU`.
    pub backend: String,
    /// One sentence: what passed, or which part failed and by how much.
    pub summary: String,
    /// Seed-to-commitment time less the round trip, milliseconds (once measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took_ms: Option<u64>,
    /// The limit for the advertised GPUs, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_ms: Option<u64>,
    /// The renter's CPU time checking the openings, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_cpu_ms: Option<u64>,
    /// The provider co-signed the pass.
    #[serde(default)]
    pub cosigned: bool,
}

impl GpuCheckView {
    /// While the check runs.
    pub fn verifying() -> Self {
        Self {
            state: "verifying".into(),
            backend: String::new(),
            summary: "checking the leased GPUs".into(),
            took_ms: None,
            limit_ms: None,
            check_cpu_ms: None,
            cosigned: false,
        }
    }

    /// The view of a kept record (its messages were verified before it was kept).
    pub fn of(r: &ProofRecord) -> Option<Self> {
        let c = ProofChallenge::decode_payload(&r.challenge.envelope().payload).ok()?;
        let rep = ProofReport::decode_payload(&r.report.envelope().payload).ok()?;
        let took = rep.timing.commit_ms.saturating_sub(rep.timing.rtt_ms);
        Some(Self {
            state: if rep.verdict.passed() {
                "passed"
            } else {
                "failed"
            }
            .into(),
            backend: c.backend.label().into(),
            summary: proof::explain(&rep.verdict, c.backend),
            took_ms: (rep.commit.is_some()).then_some(took),
            limit_ms: Some(c.params.limit_ms),
            check_cpu_ms: Some(rep.timing.check_cpu_ms),
            cosigned: r.ack.is_some(),
        })
    }
}
