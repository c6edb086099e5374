//! One attempt of a task: one lease, driven through the node's own control API. Rent the
//! chosen offer with the task's command held back, copy the inputs and the task's last
//! checkpoint into `/workspace`, begin, follow (output into a local log, the checkpoint home
//! every `every`), and when the lease is over judge its end (`contracts::jobs::judge`) and
//! copy the outputs home. A node that restarts picks an attempt up where its row says.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gridlease_contracts::jobs::{AttemptEnd, Verdict, judge};
use gridlease_protocol::CloseReason;
use tokio::io::AsyncWriteExt;

use tokio_util::sync::CancellationToken;

use super::spec::Job;
use super::view::LiveCost;
use crate::api::client::ApiClient;
use crate::api::client::ClientError;
use crate::api::types::OfferRow;
use crate::lease::LeaseView;
use crate::output::Printer;
use crate::renter::RentRequest;
use crate::store::StoreHandle;
use crate::store::jobs::StoredAttempt;

/// How often a running attempt's lease and output are read.
const POLL: Duration = Duration::from_secs(1);
/// How often a starting lease is read.
const START_POLL: Duration = Duration::from_millis(250);
/// Seconds of use paid ahead, so a lease runs on while this node restarts (capped at the
/// lease's budget by the channel rules).
pub(super) const PREPAY_S: u32 = 300;
/// Most seconds a finished lease's outputs are asked to be kept for copying home.
const KEEP_OUTPUTS_S: u32 = 600;
/// Most seconds a created container is asked to be held for the uploads.
const HOLD_S: u32 = 600;
/// Most bytes of one attempt's output kept in its local log.
const MAX_LOCAL_LOG: u64 = 16 << 20;
/// Bytes of a failed task's output kept in its message.
const TAIL_BYTES: usize = 1500;
/// Longest a stopped lease is waited for to settle.
const SETTLE_WAIT: Duration = Duration::from_secs(90);

/// What a job's runner and its attempts work with.
#[derive(Clone)]
pub(super) struct Ctx {
    /// The node's home.
    pub home: PathBuf,
    /// The node's store.
    pub store: StoreHandle,
    /// The node's own control API.
    pub api: ApiClient,
    /// The node is stopping: leave everything as stored.
    pub shutdown: CancellationToken,
    /// The job is cancelled (also set by `shutdown`: check that first).
    pub cancel: CancellationToken,
    /// Live attempts' costs so far.
    pub live: LiveCost,
}

/// What an attempt shares with its job's runner.
pub(super) struct Shared {
    pub ctx: Ctx,
    pub job_id: String,
    pub job: Arc<Job>,
    pub out: PathBuf,
    /// Providers holding a created container of this job for its uploads: a provider holds
    /// one per renter at a time, so no second attempt is rented there meanwhile.
    pub holding: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// What the shared lease of an ended task does next (`tasks_per_lease` above 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LeaseAfter {
    /// It runs on, ready for another task: its time left and where its log ends.
    Reusable { time_left_s: u64, log_end: u64 },
    /// It runs on but should not be handed more (its outputs could not be copied home).
    Stop,
    /// It is over: what it cost, when known.
    Over { spent: Option<u64> },
}

/// An attempt that ended: its row (`ended`), the verdict, and the end of its output.
pub(super) struct Done {
    pub attempt: StoredAttempt,
    pub verdict: Verdict,
    pub tail: String,
    /// A lease that runs several tasks: what it does next (`None`: the attempt's own lease,
    /// its cost in the attempt's row).
    pub lease: Option<LeaseAfter>,
}

/// The local log of an attempt: `<home>/jobs/<job>/tasks/<task>/attempt-<n>.log`.
pub(super) fn log_path(home: &Path, job: &str, task: u32, attempt: u32) -> PathBuf {
    task_dir(home, job, task).join(format!("attempt-{attempt}.log"))
}

pub(super) fn task_dir(home: &Path, job: &str, task: u32) -> PathBuf {
    home.join("jobs")
        .join(job)
        .join("tasks")
        .join(task.to_string())
}

/// The local copy of a task's checkpoint directory.
pub(super) fn checkpoint_dir(home: &Path, job: &str, task: u32) -> PathBuf {
    task_dir(home, job, task).join("checkpoint")
}

/// The quiet printer the copies run with (their progress is the job's, not a terminal's).
pub(super) fn quiet() -> Printer {
    Printer {
        json: false,
        quiet: true,
    }
}

impl Shared {
    /// Why `o` cannot run this job's tasks (besides the search's conditions), or `None`.
    pub(super) fn unfit(&self, o: &OfferRow) -> Option<String> {
        self.job.unfit(&super::spec::OfferTerms {
            min_duration_s: o.min_duration_s,
            max_duration_s: o.max_duration_s,
            upload_hold_s: o.upload_hold_s,
            output_retention_s: o.output_retention_s,
            verify_window_s: o.verify_window_s,
        })
    }

    pub(super) async fn save(&self, a: &StoredAttempt) {
        let (id, a) = (self.job_id.clone(), a.clone());
        if let Err(e) = self
            .ctx
            .store
            .call(move |s| s.put_attempt(&id, &a, None))
            .await
        {
            tracing::error!(job = %self.job_id, error = %e, "cannot store an attempt");
        }
    }

    fn stopping(&self) -> bool {
        self.ctx.cancel.is_cancelled()
    }

    /// How often the task's checkpoint is copied home while it runs.
    pub(super) fn checkpoint_every(&self) -> Option<Duration> {
        self.job
            .spec
            .checkpoint
            .as_ref()
            .map(|c| Duration::from_secs(u64::from(c.every.0)))
    }

    /// Whether `provider` holds a container of this job for uploads now.
    pub(super) fn is_holding(&self, provider: &str) -> bool {
        self.holds().contains(provider)
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<String>> {
        self.holding
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// While alive, the provider counts as holding one of the job's containers.
pub(super) struct Hold<'a>(&'a Shared, String);

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        self.0.holds().remove(&self.1);
    }
}

/// While alive, `provider` counts as holding a created container of this job for its uploads
/// (`None` when the job uploads nothing before its command).
pub(super) fn hold<'a>(sh: &'a Shared, provider: &str) -> Option<Hold<'a>> {
    sh.job.uploads_first().then(|| {
        sh.holds().insert(provider.to_string());
        Hold(sh, provider.to_string())
    })
}

/// Rents attempt `a`'s lease from `offer` (with the lease's duration) and container command,
/// or picks up the lease its row names: the attempt (`starting` once rented) and its lease.
/// `Err` when the attempt is over before it has a lease (`None`: the node is shutting down).
pub(super) async fn open(
    sh: &Shared,
    mut a: StoredAttempt,
    offer: Option<(OfferRow, u32)>,
    command: Vec<String>,
) -> Result<(StoredAttempt, String), Option<Done>> {
    match (a.lease_id.clone(), offer) {
        (Some(l), _) => Ok((a, l)),
        (None, Some((offer, lease_s))) => match rent(sh, &a, &offer, lease_s, command).await {
            Ok(l) => {
                a.lease_id = Some(l.clone());
                a.phase = "starting".into();
                sh.save(&a).await;
                Ok((a, l))
            }
            Err(Rent::Shutdown) => Err(None),
            Err(Rent::Refused(why)) => Err(Some(
                end(sh, a, AttemptEnd::NotRented, why, None, Some(0)).await,
            )),
        },
        (None, None) => {
            // The node stopped between choosing an offer and storing the lease it got: stop
            // any lease that may have come of it, so the task never runs twice at once.
            stop_orphans(sh, &a).await;
            let why = "this node stopped while renting; rented again".to_string();
            let end_of = AttemptEnd::Closed {
                reason: CloseReason::RenterUnreachable,
                exit_code: None,
            };
            Err(Some(end(sh, a, end_of, why, None, None).await))
        }
    }
}

/// The end of an attempt whose start failed: its lease stopped and (bounded) settled. A
/// shared lease's cost goes to its first attempt.
pub(super) async fn start_failed(sh: &Shared, a: StoredAttempt, lease: &str, why: String) -> Done {
    tracing::warn!(job = %sh.job_id, task = a.task, lease = %lease, why, "attempt start failed");
    let _ = sh.ctx.api.stop(lease).await;
    let v = settled(sh, lease).await;
    let spent = v.as_ref().map(spent_of);
    let failed = AttemptEnd::Closed {
        reason: CloseReason::StartFailed,
        exit_code: None,
    };
    if sh.job.shares_leases() {
        let mut done = end(sh, a, failed, why, None, None).await;
        done.lease = Some(LeaseAfter::Over { spent });
        return done;
    }
    end(sh, a, failed, why, v.as_ref(), spent).await
}

/// Runs (or, after a restart, resumes) attempt `a` on a lease of its own; `offer` is the offer
/// to rent for a new one, with the lease's duration. `None` when the node is shutting down:
/// the row stays as it is, for the next start.
pub(super) async fn run(
    sh: Arc<Shared>,
    a: StoredAttempt,
    offer: Option<(OfferRow, u32)>,
) -> Option<Done> {
    let hold = hold(&sh, &a.provider);
    let command = vec!["/bin/sh".into(), "-c".into(), SCRIPT.into()];
    let (mut a, lease) = match open(&sh, a, offer, command).await {
        Ok(x) => x,
        Err(done) => return done,
    };
    if a.phase == "starting" {
        match start(&sh, &lease, a.task).await {
            Ok(()) => {
                a.phase = "running".into();
                sh.save(&a).await;
            }
            Err(Start::Shutdown) => return None,
            Err(Start::Failed(why)) => return Some(start_failed(&sh, a, &lease, why).await),
        }
    }
    drop(hold);
    let view = match follow(&sh, &a, &lease).await? {
        Followed::Over(v) => *v,
        Followed::Lost(why) => {
            let end_of = if sh.stopping() {
                AttemptEnd::Cancelled
            } else {
                AttemptEnd::Closed {
                    reason: CloseReason::ProviderUnreachable,
                    exit_code: None,
                }
            };
            return Some(end(&sh, a, end_of, why, None, None).await);
        }
    };
    let reason = view
        .close_reason
        .as_deref()
        .and_then(crate::store::lease::parse_reason);
    let mut end_of = end_of_lease(&sh, &view);
    let mut why = describe(&view);
    if view.outputs_until.is_some() && matches!(reason, Some(CloseReason::ContainerExited)) {
        if let Some(rel) = &sh.job.checkpoint
            && let Err(e) = pull_checkpoint(&sh, a.task, &lease, rel).await
        {
            tracing::warn!(job = %sh.job_id, task = a.task, error = %format!("{e:#}"), "final checkpoint not copied home");
        }
        if judge(end_of, &sh.job.spec.retries.on_exit_codes) == Verdict::Succeeded
            && let Err(e) = pull_outputs(&sh, a.task, &lease).await
        {
            why = format!("its outputs could not be copied home: {e:#}");
            end_of = AttemptEnd::Closed {
                reason: CloseReason::ProviderUnreachable,
                exit_code: view.exit_code,
            };
        }
    } else if matches!(reason, Some(CloseReason::ContainerExited))
        && view.exit_code == Some(0)
        && !sh.job.outputs.is_empty()
    {
        why = "the provider did not keep the outputs to copy home".into();
        end_of = AttemptEnd::Closed {
            reason: CloseReason::ProviderUnreachable,
            exit_code: view.exit_code,
        };
    }
    let spent = view.is_terminal().then(|| spent_of(&view));
    Some(end(&sh, a, end_of, why, Some(&view), spent).await)
}

/// The end of an attempt whose lease is over, by its close reason.
pub(super) fn end_of_lease(sh: &Shared, view: &LeaseView) -> AttemptEnd {
    let reason = view
        .close_reason
        .as_deref()
        .and_then(crate::store::lease::parse_reason);
    match (sh.stopping(), reason) {
        (true, _) | (_, Some(CloseReason::RenterStop)) => AttemptEnd::Cancelled,
        (false, Some(reason)) => AttemptEnd::Closed {
            reason,
            exit_code: view.exit_code,
        },
        (false, None) => AttemptEnd::Closed {
            reason: CloseReason::ProviderUnreachable,
            exit_code: None,
        },
    }
}

/// What a settled lease cost.
pub(super) fn spent_of(v: &LeaseView) -> u64 {
    v.settled_total.unwrap_or(v.paid)
}

/// The end of an attempt, in words: the close reason, and the provider's sentence.
pub(super) fn describe(v: &LeaseView) -> String {
    let mut s = v
        .close_reason
        .clone()
        .unwrap_or_else(|| format!("lease {:?}", v.state).to_lowercase());
    if let Some(code) = v.exit_code {
        s.push_str(&format!(", exit code {code}"));
    }
    if let Some(f) = &v.failure {
        s.push_str(&format!(": {} ({})", f.message, f.kind));
    }
    if let Some(c) = &v.gpu_check
        && c.state == "failed"
    {
        s.push_str(&format!(": GPU check failed: {}", c.summary));
    }
    s
}

/// Marks `a` ended and judges it.
pub(super) async fn end(
    sh: &Shared,
    mut a: StoredAttempt,
    end_of: AttemptEnd,
    why: String,
    view: Option<&LeaseView>,
    spent: Option<u64>,
) -> Done {
    let verdict = judge(end_of, &sh.job.spec.retries.on_exit_codes);
    a.phase = "ended".into();
    a.ended_at = Some(super::now_ms());
    a.verdict = Some(
        match verdict {
            Verdict::Succeeded => "succeeded",
            Verdict::Exited { .. } => "exited",
            Verdict::ProviderFault => "provider_fault",
            Verdict::RenterSide => "renter_side",
            Verdict::Cancelled => "cancelled",
        }
        .into(),
    );
    a.reason = Some(why);
    a.exit_code = match end_of {
        AttemptEnd::Closed {
            exit_code: Some(c), ..
        } => Some(c),
        _ => view.and_then(|v| v.exit_code),
    };
    a.spent = spent;
    if !sh.job.shares_leases() {
        // A shared lease's cost so far stays on its first attempt until the lease settles.
        sh.ctx.live.remove(a.task, a.attempt);
    }
    let tail = tail_of(&log_path(&sh.ctx.home, &sh.job_id, a.task, a.attempt));
    tracing::info!(job = %sh.job_id, task = a.task, attempt = a.attempt, verdict = ?verdict, reason = a.reason.as_deref().unwrap_or(""), "attempt ended");
    Done {
        attempt: a,
        verdict,
        tail,
        lease: None,
    }
}

/// The last bytes of a log, as text.
fn tail_of(path: &Path) -> String {
    let Ok(data) = std::fs::read(path) else {
        return String::new();
    };
    let from = data.len().saturating_sub(TAIL_BYTES);
    String::from_utf8_lossy(&data[from..])
        .trim_end()
        .to_string()
}

enum Rent {
    Shutdown,
    Refused(String),
}

/// Rents `offer` for `lease_s` for attempt `a`, running `command`: held back for the uploads
/// when there are any. A shared lease runs the worker, which is handed each task's variables.
async fn rent(
    sh: &Shared,
    a: &StoredAttempt,
    offer: &OfferRow,
    lease_s: u32,
    command: Vec<String>,
) -> Result<String, Rent> {
    let job = &sh.job;
    let shares = job.shares_leases();
    let mut env = job.spec.envs.clone();
    env.insert("TASK_COUNT".into(), job.task_count().to_string());
    env.insert("GRIDLEASE_JOB".into(), sh.job_id.clone());
    if shares {
        env.insert(
            "GRIDLEASE_CHECKPOINT".into(),
            job.checkpoint.clone().unwrap_or_default(),
        );
    } else {
        env.insert("TASK_INDEX".into(), a.task.to_string());
        env.insert(
            "TASK_ARGS".into(),
            job.task_args
                .get(a.task as usize)
                .cloned()
                .unwrap_or_default(),
        );
        env.insert("GRIDLEASE_ATTEMPT".into(), a.attempt.to_string());
    }
    env.insert(
        "GRIDLEASE_SETUP".into(),
        job.spec.setup.clone().unwrap_or_default(),
    );
    env.insert("GRIDLEASE_RUN".into(), job.spec.run.clone());
    let body = RentRequest {
        volumes: Vec::new(),
        mounts: Vec::new(),
        volume: None,
        offer: offer.id.clone(),
        gpus: job.gpus(),
        duration_s: lease_s,
        image: job.spec.image.clone(),
        command,
        env,
        max_total: Some(gridlease_contracts::Money::from_micros(a.cap)),
        network: gridlease_protocol::NetworkPolicy::None,
        keep_outputs_s: if sh.job.copies_after_lease() {
            offer.output_retention_s.min(KEEP_OUTPUTS_S)
        } else {
            0
        },
        upload_hold_s: if sh.job.uploads_first() {
            offer.upload_hold_s.min(HOLD_S)
        } else {
            0
        },
        prepay_s: PREPAY_S,
        verify: true,
    };
    match sh.ctx.api.rent(&body).await {
        Ok(r) => Ok(r.lease_id),
        Err(ClientError::NoNode { .. }) => Err(Rent::Shutdown),
        Err(_) if sh.ctx.shutdown.is_cancelled() => Err(Rent::Shutdown),
        Err(e) => Err(Rent::Refused(format!("not rented: {e}"))),
    }
}

/// The command every task's container runs: setup (stopping at its first failure), then the
/// task's `run`, in `/workspace`, both from the environment (no quoting to get wrong).
const SCRIPT: &str = "cd /workspace || exit 1\n\
    /bin/sh -ec \"$GRIDLEASE_SETUP\" || exit $?\n\
    exec /bin/sh -c \"$GRIDLEASE_RUN\"\n";

pub(super) enum Start {
    Shutdown,
    Failed(String),
}

/// Waits for the container (held, or already running), copies the inputs and the task's
/// checkpoint in, and begins the command.
pub(super) async fn start(sh: &Shared, lease: &str, task: u32) -> Result<(), Start> {
    let api = &sh.ctx.api;
    let held = loop {
        if sh.ctx.shutdown.is_cancelled() {
            return Err(Start::Shutdown);
        }
        if sh.stopping() {
            return Err(Start::Failed("the job was cancelled".into()));
        }
        match api.lease(lease).await {
            Ok(v) if v.is_terminal() => return Ok(()),
            Ok(v) if v.upload_until.is_some() => break true,
            Ok(v) if v.state == gridlease_contracts::LeaseState::Running => break false,
            Ok(_) => {}
            Err(ClientError::NoNode { .. }) => return Err(Start::Shutdown),
            Err(e) => tracing::debug!(error = %e, "lease not readable yet"),
        }
        tokio::time::sleep(START_POLL).await;
    };
    if !held && sh.job.uploads_first() {
        return Err(Start::Failed(
            "the provider started the command before the uploads (its hold ran out)".into(),
        ));
    }
    for (src, dest) in &sh.job.inputs {
        crate::commands::cp::upload(api, &quiet(), src, lease, dest)
            .await
            .map_err(|e| Start::Failed(format!("input {} not copied in: {e:#}", src.display())))?;
    }
    if let Some(rel) = &sh.job.checkpoint
        && !sh.job.shares_leases()
    {
        let local = checkpoint_dir(&sh.ctx.home, &sh.job_id, task);
        let has_any = std::fs::read_dir(&local).is_ok_and(|mut d| d.next().is_some());
        if has_any {
            crate::commands::cp::upload(api, &quiet(), &local, lease, rel)
                .await
                .map_err(|e| Start::Failed(format!("checkpoint not copied in: {e:#}")))?;
            tracing::info!(job = %sh.job_id, task, lease, "checkpoint copied into the new attempt");
        }
    }
    if held {
        match api.begin(lease).await {
            Ok(_) => {}
            Err(ClientError::NoNode { .. }) => return Err(Start::Shutdown),
            Err(e) => {
                return Err(Start::Failed(format!(
                    "the command could not be begun: {e}"
                )));
            }
        }
    }
    Ok(())
}

/// How following a lease ended.
enum Followed {
    /// It is over (or, stopped, did not settle in time): its last view.
    Over(Box<LeaseView>),
    /// This node no longer knows it, or cannot read it: why.
    Lost(String),
}

/// Follows a running attempt until its lease is over (settled): its output into the local
/// log, its checkpoint home every `every`, its cost into the live costs; stops the lease when
/// the job is cancelled. `None` on shutdown.
async fn follow(sh: &Shared, a: &StoredAttempt, lease: &str) -> Option<Followed> {
    let api = &sh.ctx.api;
    let log = log_path(&sh.ctx.home, &sh.job_id, a.task, a.attempt);
    if let Some(p) = log.parent() {
        let _ = tokio::fs::create_dir_all(p).await;
    }
    let mut offset = tokio::fs::metadata(&log).await.map_or(0, |m| m.len());
    let every = sh.checkpoint_every();
    let mut last_ckpt = Instant::now();
    let mut stop_sent = false;
    let mut stop_at: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = sh.ctx.cancel.cancelled(), if !stop_sent => {}
        }
        if sh.ctx.shutdown.is_cancelled() {
            return None;
        }
        if sh.stopping() && !stop_sent {
            stop_sent = true;
            stop_at = Some(Instant::now());
            if let Err(e) = api.stop(lease).await {
                tracing::warn!(lease, error = %e, "cannot stop a cancelled job's lease");
            }
        }
        offset = pull_log(sh, lease, &log, offset).await;
        let view = match api.lease(lease).await {
            Ok(v) => v,
            Err(ClientError::NoNode { .. }) => return None,
            Err(ClientError::Api { status: 404, .. }) => {
                return Some(Followed::Lost("this node no longer knows the lease".into()));
            }
            Err(e) => {
                tracing::debug!(lease, error = %e, "lease not readable");
                if stop_at.is_some_and(|t| t.elapsed() > SETTLE_WAIT) {
                    return Some(Followed::Lost(format!("the lease could not be read: {e}")));
                }
                continue;
            }
        };
        sh.ctx
            .live
            .set(a.task, a.attempt, view.cost_so_far.max(view.paid));
        if view.is_terminal() {
            // What the container wrote last.
            let _ = pull_log(sh, lease, &log, offset).await;
            return Some(Followed::Over(Box::new(view)));
        }
        if let (Some(every), Some(rel)) = (every, &sh.job.checkpoint)
            && last_ckpt.elapsed() >= every
            && view.state == gridlease_contracts::LeaseState::Running
            && !stop_sent
        {
            last_ckpt = Instant::now();
            if let Err(e) = pull_checkpoint(sh, a.task, lease, rel).await {
                tracing::warn!(job = %sh.job_id, task = a.task, error = %format!("{e:#}"), "checkpoint not copied home this time");
            }
        }
        if stop_at.is_some_and(|t| t.elapsed() > SETTLE_WAIT) {
            tracing::warn!(lease, "a stopped lease did not settle; leaving it");
            return Some(Followed::Over(Box::new(view)));
        }
    }
}

/// Appends the lease's output from `offset` to the local log; the next offset.
pub(super) async fn pull_log(sh: &Shared, lease: &str, log: &Path, offset: u64) -> u64 {
    let path = format!("/v1/leases/{lease}/logs?from={offset}");
    let Ok((headers, body)) = sh.ctx.api.get_raw(&path).await else {
        return offset;
    };
    let next = headers
        .get(crate::api::NEXT_OFFSET_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(offset + body.len() as u64);
    if body.is_empty() {
        return next;
    }
    let kept = tokio::fs::metadata(log).await.map_or(0, |m| m.len());
    if kept >= MAX_LOCAL_LOG {
        // The rest stays with the provider (`gridlease logs LEASE`); the job's disk does not
        // grow with a task's output.
        return next;
    }
    let room = usize::try_from(MAX_LOCAL_LOG - kept).unwrap_or(usize::MAX);
    let mut data = body.to_vec();
    if data.len() >= room {
        data.truncate(room);
        data.extend_from_slice(
            format!(
                "\n[gridlease: this attempt's output past {} MiB is not kept here; `gridlease logs {lease}` has the provider's copy]\n",
                MAX_LOCAL_LOG >> 20
            )
            .as_bytes(),
        );
    }
    let file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .await;
    match file {
        Ok(mut f) => match f.write_all(&data).await {
            Ok(()) => next,
            Err(_) => offset,
        },
        Err(_) => offset,
    }
}

/// Copies the task's checkpoint directory home (into its local copy).
pub(super) async fn pull_checkpoint(
    sh: &Shared,
    task: u32,
    lease: &str,
    rel: &str,
) -> anyhow::Result<()> {
    let local = checkpoint_dir(&sh.ctx.home, &sh.job_id, task);
    tokio::fs::create_dir_all(&local).await?;
    let path = format!("/workspace/{rel}");
    let api = &sh.ctx.api;
    if let Err(e) = crate::commands::cp::download_changed(api, &quiet(), lease, &path, &local).await
    {
        // A provider older than the by-size-and-time skip closes the stream: copy it whole.
        tracing::debug!(error = %format!("{e:#}"), "checkpoint copy of what changed failed; copying it whole");
        crate::commands::cp::download(api, &quiet(), lease, &path, &local, None).await?;
    }
    Ok(())
}

/// Copies the job's outputs of a finished lease into `OUT/<task>/`.
pub(super) async fn pull_outputs(sh: &Shared, task: u32, lease: &str) -> anyhow::Result<()> {
    let dir = sh.out.join(task.to_string());
    for rel in &sh.job.outputs {
        let dst = dir.join(rel);
        if let Some(p) = dst.parent() {
            tokio::fs::create_dir_all(p).await?;
        }
        crate::commands::cp::download(
            &sh.ctx.api,
            &quiet(),
            lease,
            &format!("/workspace/{rel}"),
            &dst,
            None,
        )
        .await
        .map_err(|e| e.context(format!("/workspace/{rel}")))?;
    }
    Ok(())
}

/// Waits (bounded) for a stopped lease to settle.
pub(super) async fn settled(sh: &Shared, lease: &str) -> Option<LeaseView> {
    let until = Instant::now() + SETTLE_WAIT;
    while Instant::now() < until {
        match sh.ctx.api.lease(lease).await {
            Ok(v) if v.is_terminal() => return Some(v),
            Ok(_) => {}
            Err(ClientError::Api { status: 404, .. }) => return None,
            Err(_) if sh.ctx.shutdown.is_cancelled() => return None,
            Err(_) => {}
        }
        tokio::time::sleep(START_POLL).await;
    }
    None
}

/// Stops this node's live leases with attempt `a`'s provider and the job's image that no
/// attempt of the job holds (one rented just before a crash).
async fn stop_orphans(sh: &Shared, a: &StoredAttempt) {
    let Ok(leases) = sh.ctx.api.leases().await else {
        return;
    };
    let id = sh.job_id.clone();
    let held: Vec<String> = sh
        .ctx
        .store
        .call(move |s| s.job_attempts(&id))
        .await
        .map(|v| v.into_iter().filter_map(|a| a.lease_id).collect())
        .unwrap_or_default();
    for l in leases {
        let lid = l.lease_id.to_string();
        if l.role == crate::store::Role::Renter
            && !l.is_terminal()
            && l.counterparty == a.provider
            && l.image == sh.job.spec.image
            && !held.contains(&lid)
        {
            tracing::warn!(job = %sh.job_id, lease = %lid, "stopping a lease rented just before this node stopped");
            let _ = sh.ctx.api.stop(&lid).await;
        }
    }
}
