//! Jobs as the control API shows them (`GET /v1/jobs`, `gridlease job status`): counts,
//! money, an estimate of the time left, and (in detail) every task and attempt.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gridlease_contracts::Money;
use gridlease_contracts::jobs::Spend;
use serde::{Deserialize, Serialize};

use crate::store::jobs::{StoredAttempt, StoredJob, StoredTask};

/// Most bytes of a task's log one call returns.
pub const MAX_LOG_CHUNK: usize = 1 << 20;

/// The cost so far of each live attempt's lease (`(task, attempt)` to micro-units), as the
/// runner last read it: shown by views, never stored.
#[derive(Clone, Debug, Default)]
pub struct LiveCost(Arc<Mutex<HashMap<(u32, u32), u64>>>);

impl LiveCost {
    /// Sets an attempt's cost so far.
    pub fn set(&self, task: u32, attempt: u32, micros: u64) {
        self.lock().insert((task, attempt), micros);
    }

    /// Forgets an attempt (it ended; its settled cost is stored).
    pub fn remove(&self, task: u32, attempt: u32) {
        self.lock().remove(&(task, attempt));
    }

    fn get(&self, task: u32, attempt: u32) -> Option<u64> {
        self.lock().get(&(task, attempt)).copied()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u32, u32), u64>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobView {
    /// Its id (16 hex digits; commands take a unique prefix).
    pub job_id: String,
    /// The spec's name.
    pub name: String,
    /// `running`, `completed` (every task succeeded), `failed` (some did not), `cancelled`
    /// or `budget_reached` (launching stopped before the budget; `not_started` lists what
    /// did not run).
    pub state: String,
    /// Why it ended, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Where outputs land (`OUT/<task>/`).
    pub out_dir: String,
    /// Unix ms.
    pub created_at: u64,
    /// Unix ms, once over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// Tasks in the job.
    pub tasks_total: u32,
    /// Tasks that succeeded.
    pub succeeded: u32,
    /// Tasks running now (an attempt in flight).
    pub running: u32,
    /// Tasks waiting for an attempt.
    pub pending: u32,
    /// Tasks that failed for good.
    pub failed: u32,
    /// Tasks never started because the budget was reached.
    pub not_started: u32,
    /// Tasks the job's cancel ended (running or waiting then).
    pub cancelled: u32,
    /// Attempts started, all tasks together.
    pub attempts: u32,
    /// Spent so far, micro-units: settled leases plus live ones' cost so far.
    pub spent: u64,
    /// The job's budget (`budget.max_total`), micro-units, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<u64>,
    /// The most the job's leases can cost as things stand (settled ones plus every live one's
    /// cap), micro-units: never above the budget.
    pub exposure: u64,
    /// A rough estimate of the seconds left (the mean succeeded attempt's time, over the
    /// tasks left, `concurrency` at a time); absent until a task succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_s: Option<u64>,
    /// The providers excluded for this job, and why.
    #[serde(default)]
    pub excluded: Vec<ExcludedView>,
    /// Each task (`GET /v1/jobs/{id}` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskView>,
}

/// A provider excluded for a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExcludedView {
    /// Its peer id.
    pub provider: String,
    /// Why (the attempt's end).
    pub reason: String,
}

/// A task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskView {
    /// Index, from 0 (`$TASK_INDEX`).
    pub task: u32,
    /// `pending`, `running`, `succeeded`, `failed`, `cancelled` or `not_started`.
    pub state: String,
    /// The last attempt's exit code, when its command exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it failed, with the end of its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Every attempt, in order.
    pub attempts: Vec<AttemptView>,
}

/// One attempt of a task: one lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AttemptView {
    /// 1-based.
    pub attempt: u32,
    /// The provider's peer id.
    pub provider: String,
    /// The lease, once rented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    /// `renting`, `starting`, `running` or `ended`.
    pub phase: String,
    /// Unix ms.
    pub started_at: u64,
    /// Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// `succeeded`, `exited`, `provider_fault`, `renter_side` or `cancelled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// Why it ended, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Exit code, when the command exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The lease's price per GPU-hour, micro-units.
    pub price: u64,
    /// The lease's cap, micro-units.
    pub cap: u64,
    /// Spent: settled, or the cost so far while it runs, micro-units.
    pub spent: u64,
}

/// The view of a job from its rows.
pub fn build(
    j: &StoredJob,
    tasks: &[StoredTask],
    attempts: &[StoredAttempt],
    excluded: &[(String, String)],
    live: &LiveCost,
    detail: bool,
) -> JobView {
    let count = |s: &str| tasks.iter().filter(|t| t.state == s).count() as u32;
    let spent_of = |a: &StoredAttempt| a.spent.or_else(|| live.get(a.task, a.attempt)).unwrap_or(0);
    let spent = attempts.iter().map(spent_of).sum();
    let exposure = gridlease_contracts::jobs::exposure(attempts.iter().map(spend))
        .map_or(u64::MAX, |m| m.micros());
    let parsed: Option<super::spec::Job> = serde_json::from_str(&j.spec).ok();
    let budget = parsed
        .as_ref()
        .and_then(|p| p.spec.budget.as_ref())
        .map(|b| b.max_total.0.micros());
    let concurrency = parsed.as_ref().map_or(1, |p| p.spec.concurrency.max(1));
    let done: Vec<u64> = attempts
        .iter()
        .filter(|a| a.verdict.as_deref() == Some("succeeded"))
        .filter_map(|a| Some(a.ended_at?.saturating_sub(a.started_at)))
        .collect();
    let left = count("pending") + count("running");
    let eta_s = (j.state == "running" && !done.is_empty()).then(|| {
        let mean_ms = done.iter().sum::<u64>() / done.len() as u64;
        let rounds = u64::from(left).div_ceil(u64::from(concurrency));
        rounds * mean_ms / 1000
    });
    JobView {
        job_id: j.id.clone(),
        name: j.name.clone(),
        state: j.state.clone(),
        message: j.message.clone(),
        out_dir: j.out_dir.clone(),
        created_at: j.created_at,
        ended_at: j.ended_at,
        tasks_total: tasks.len() as u32,
        succeeded: count("succeeded"),
        running: count("running"),
        pending: count("pending"),
        failed: count("failed"),
        not_started: count("not_started"),
        cancelled: count("cancelled"),
        attempts: attempts.len() as u32,
        spent,
        budget,
        exposure,
        eta_s,
        excluded: excluded
            .iter()
            .map(|(p, r)| ExcludedView {
                provider: p.clone(),
                reason: r.clone(),
            })
            .collect(),
        tasks: if detail {
            tasks
                .iter()
                .map(|t| TaskView {
                    task: t.task,
                    state: t.state.clone(),
                    exit_code: t.exit_code,
                    message: t.message.clone(),
                    attempts: attempts
                        .iter()
                        .filter(|a| a.task == t.task)
                        .map(|a| AttemptView {
                            attempt: a.attempt,
                            provider: a.provider.clone(),
                            lease_id: a.lease_id.clone(),
                            phase: a.phase.clone(),
                            started_at: a.started_at,
                            ended_at: a.ended_at,
                            verdict: a.verdict.clone(),
                            reason: a.reason.clone(),
                            exit_code: a.exit_code,
                            price: a.price,
                            cap: a.cap,
                            spent: spent_of(a),
                        })
                        .collect(),
                })
                .collect()
        } else {
            Vec::new()
        },
    }
}

/// What an attempt may cost, for the budget: an ended one what it settled at (the cap when
/// that is unknown), a live one its cap.
pub(super) fn spend(a: &StoredAttempt) -> Spend {
    match (a.phase.as_str(), a.spent) {
        ("ended", Some(total)) => Spend::Settled {
            total: Money::from_micros(total),
        },
        _ => Spend::Open {
            cap: Money::from_micros(a.cap),
        },
    }
}
