//! Jobs (issue 46): the renter node's scheduler over leases. One spec file
//! ([`spec`]) fans a batch of tasks over many providers: the cheapest eligible offers first, up
//! to `concurrency` leases at once; a provider fault is retried on another provider with that
//! one excluded, a non-zero exit only when its code is listed (the rules: `contracts::jobs`);
//! each task's checkpoint directory is copied home while it runs and into its next attempt;
//! and no lease is rented that could take the job past its budget.
//!
//! The runner lives in the daemon and drives leases through the node's own control API (the
//! same routes and copy code as `rent`, `cp` and `stop`), so every lease a job rents is an
//! ordinary lease. Its state is in the store (`crate::store::jobs`): a restarted node resumes
//! every running job, reconciling the leases its attempts had in flight.

mod attempt;
mod runner;
pub mod spec;
pub mod view;
mod worker;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::api::client::ApiClient;
use crate::store::StoreHandle;
use crate::store::jobs::StoredJob;
pub use view::{JobView, LiveCost};

/// What went wrong with a job request.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The spec cannot run.
    #[error("{0}")]
    Spec(#[from] spec::SpecError),
    /// No job has that id (or prefix).
    #[error("no job {0}")]
    Unknown(String),
    /// The prefix names several jobs.
    #[error("{0:?} names several jobs: give more digits")]
    Ambiguous(String),
    /// The output directory cannot be used.
    #[error("{0}")]
    Out(String),
    /// The job is over already.
    #[error("job {0} is over already")]
    Over(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Most job starts queued for the runners' thread at once (each is taken at once; a node
/// resumes at most its running jobs together).
const MAX_STARTS_QUEUED: usize = 1024;

/// A job to submit: the spec file's text, the directory its relative paths are in, and where
/// its outputs land.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct JobSubmit {
    /// The spec file's text (YAML, `docs/jobs.md`).
    pub spec: String,
    /// The directory the spec's relative paths (inputs, a tasks file) are relative to:
    /// absolute.
    pub dir: String,
    /// Where outputs land, `OUT/<task>/...`: an absolute path (created when missing).
    pub out: String,
}

/// The job service: submits, lists, shows and cancels jobs, and runs each running job's
/// runner. Cloneable.
#[derive(Clone)]
pub struct JobService {
    inner: Arc<Inner>,
}

struct Inner {
    home: PathBuf,
    store: StoreHandle,
    api: ApiClient,
    shutdown: CancellationToken,
    /// Each running job's cancel token and live costs (the runner's, shown by views).
    running: Mutex<HashMap<String, Running>>,
    /// The runners' thread: jobs to start.
    starts: tokio::sync::mpsc::Sender<(String, Running)>,
}

#[derive(Clone)]
struct Running {
    cancel: CancellationToken,
    live: LiveCost,
}

impl std::fmt::Debug for JobService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobService")
            .field("home", &self.inner.home)
            .finish_non_exhaustive()
    }
}

impl JobService {
    /// The service of the node in `home`, whose control API answers at its socket. Resumes
    /// no job yet: [`JobService::resume`] does, once the API listens.
    pub fn new(home: &Path, store: StoreHandle, shutdown: CancellationToken) -> Self {
        let (starts, rx) = tokio::sync::mpsc::channel(MAX_STARTS_QUEUED);
        let this = Self {
            inner: Arc::new(Inner {
                home: home.to_path_buf(),
                store,
                api: ApiClient::new(home),
                shutdown,
                running: Mutex::new(HashMap::new()),
                starts,
            }),
        };
        let runners = this.clone();
        let spawned = std::thread::Builder::new()
            .name("gridlease-jobs".into())
            .spawn(move || runners.runners(rx));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the job runners' thread");
        }
        this
    }

    /// The runners' thread: a runtime of its own, on which each job's runner and its
    /// attempts run as local tasks. They are clients of the control API as the CLI is (the
    /// copy code of `cp` included, whose futures are not `Send`), and share nothing of the
    /// daemon's runtime but the socket.
    fn runners(&self, mut rx: tokio::sync::mpsc::Receiver<(String, Running)>) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "cannot build the job runners' runtime");
                return;
            }
        };
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async {
            let mut tasks = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    got = rx.recv() => match got {
                        Some((id, r)) => {
                            let this = self.clone();
                            tasks.spawn_local(async move { this.run_one(id, r).await });
                        }
                        None => break,
                    },
                    Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                    _ = self.inner.shutdown.cancelled() => break,
                }
            }
            // Each runner returns promptly on shutdown, its rows as they are for the next start.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while tasks.join_next().await.is_some() {}
            })
            .await;
        });
    }

    async fn run_one(&self, id: String, r: Running) {
        let ctx = attempt::Ctx {
            home: self.inner.home.clone(),
            store: self.inner.store.clone(),
            api: self.inner.api.clone(),
            shutdown: self.inner.shutdown.clone(),
            cancel: r.cancel.clone(),
            live: r.live.clone(),
        };
        if let Err(e) = runner::run(ctx, &id).await {
            tracing::error!(job = %id, error = %format!("{e:#}"), "job runner stopped");
        }
        self.inner
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
    }

    /// Starts the runner of every job the store says is running (after a restart).
    pub async fn resume(&self) -> Result<usize, JobError> {
        let jobs = self.inner.store.call(|s| s.jobs()).await?;
        let mut n = 0;
        for j in jobs.into_iter().filter(|j| j.state == "running") {
            tracing::info!(job = %j.id, name = %j.name, "resuming job");
            self.spawn(j.id);
            n += 1;
        }
        Ok(n)
    }

    /// Checks and stores a job, then starts its runner. Nothing is rented when the spec or
    /// its paths are wrong.
    pub async fn submit(&self, req: JobSubmit) -> Result<JobView, JobError> {
        let dir = PathBuf::from(&req.dir);
        if !dir.is_absolute() {
            return Err(JobError::Out(format!(
                "dir {:?} is not an absolute path",
                req.dir
            )));
        }
        let job = tokio::task::spawn_blocking(move || spec::load(&req.spec, &dir))
            .await
            .map_err(|e| JobError::Out(e.to_string()))??;
        let out = PathBuf::from(&req.out);
        if !out.is_absolute() {
            return Err(JobError::Out(format!(
                "out {:?} is not an absolute path",
                req.out
            )));
        }
        std::fs::create_dir_all(&out).map_err(|e| {
            JobError::Out(format!(
                "the output directory {} cannot be made: {e}",
                out.display()
            ))
        })?;
        let id = new_id();
        let row = StoredJob {
            id: id.clone(),
            name: job.spec.name.clone(),
            spec: serde_json::to_string(&job).map_err(|e| JobError::Out(e.to_string()))?,
            out_dir: out.display().to_string(),
            state: "running".into(),
            created_at: now_ms(),
            ended_at: None,
            message: None,
        };
        let tasks = job.task_count();
        self.inner
            .store
            .call(move |s| s.insert_job(&row, tasks))
            .await?;
        tracing::info!(job = %id, name = %job.spec.name, tasks, "job submitted");
        self.spawn(id.clone());
        self.get(&id).await
    }

    /// Every job, newest first.
    pub async fn list(&self) -> Result<Vec<JobView>, JobError> {
        let jobs = self.inner.store.call(|s| s.jobs()).await?;
        let mut out = Vec::with_capacity(jobs.len());
        for j in jobs {
            out.push(self.view(j, false).await?);
        }
        Ok(out)
    }

    /// One job (an id or a unique prefix), with its tasks and attempts.
    pub async fn get(&self, id: &str) -> Result<JobView, JobError> {
        let j = self.resolve(id).await?;
        self.view(j, true).await
    }

    /// Cancels a running job: its runner stops every lease (each settles) and leaves its
    /// pending tasks cancelled.
    pub async fn cancel(&self, id: &str) -> Result<JobView, JobError> {
        let j = self.resolve(id).await?;
        if j.state != "running" {
            return Err(JobError::Over(j.id));
        }
        let running = self.running(&j.id);
        match running {
            Some(r) => r.cancel.cancel(),
            None => {
                // No runner (it ended meanwhile): say it as the store has it.
                return Err(JobError::Over(j.id));
            }
        }
        self.get(&j.id).await
    }

    /// The local log of one attempt of a task (the last attempt when `attempt` is `None`),
    /// from byte `from`: the bytes, the next offset, and whether more may come.
    pub async fn logs(
        &self,
        id: &str,
        task: u32,
        attempt: Option<u32>,
        from: u64,
    ) -> Result<(Vec<u8>, u64, bool), JobError> {
        let j = self.resolve(id).await?;
        let jid = j.id.clone();
        let attempts = self.inner.store.call(move |s| s.job_attempts(&jid)).await?;
        let mine: Vec<_> = attempts.into_iter().filter(|a| a.task == task).collect();
        let a = match attempt {
            Some(n) => mine.iter().find(|a| a.attempt == n),
            None => mine.last(),
        };
        let Some(a) = a else {
            return Ok((Vec::new(), 0, j.state != "running"));
        };
        let path = attempt::log_path(&self.inner.home, &j.id, task, a.attempt);
        let more = a.phase != "ended";
        let data = read_from(&path, from, view::MAX_LOG_CHUNK)
            .map_err(|e| JobError::Out(format!("cannot read {}: {e}", path.display())))?;
        let next = from + data.len() as u64;
        Ok((data, next, more))
    }

    async fn resolve(&self, id: &str) -> Result<StoredJob, JobError> {
        let want = id.to_ascii_lowercase();
        if want.is_empty() || !want.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(JobError::Unknown(id.to_string()));
        }
        let jobs = self.inner.store.call(|s| s.jobs()).await?;
        let mut hits = jobs.into_iter().filter(|j| j.id.starts_with(&want));
        match (hits.next(), hits.next()) {
            (Some(j), None) => Ok(j),
            (None, _) => Err(JobError::Unknown(id.to_string())),
            (Some(_), Some(_)) => Err(JobError::Ambiguous(id.to_string())),
        }
    }

    async fn view(&self, j: StoredJob, detail: bool) -> Result<JobView, JobError> {
        let id = j.id.clone();
        let (tasks, attempts, excluded) = self
            .inner
            .store
            .call(move |s| {
                Ok((
                    s.job_tasks(&id)?,
                    s.job_attempts(&id)?,
                    s.excluded_providers(&id)?,
                ))
            })
            .await?;
        let live = self.running(&j.id).map(|r| r.live).unwrap_or_default();
        Ok(view::build(&j, &tasks, &attempts, &excluded, &live, detail))
    }

    fn running(&self, id: &str) -> Option<Running> {
        self.inner
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    fn spawn(&self, id: String) {
        let r = Running {
            cancel: self.inner.shutdown.child_token(),
            live: LiveCost::default(),
        };
        {
            let mut map = self
                .inner
                .running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if map.contains_key(&id) {
                return;
            }
            map.insert(id.clone(), r.clone());
        }
        if self.inner.starts.try_send((id.clone(), r)).is_err() {
            // Its row says running: the next start of the node resumes it.
            tracing::error!(job = %id, "the job runners' thread is gone or busy; the job runs from the next start");
            self.inner
                .running
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&id);
        }
    }
}

/// A new job id: 16 random hex digits (the time's when the OS gives no randomness).
fn new_id() -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        b = now_ms().to_be_bytes();
    }
    hex::encode(b)
}

/// Now, unix milliseconds.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// At most `max` bytes of `path` from `from` (nothing when it does not exist).
fn read_from(path: &Path, from: u64, max: usize) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek};
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    f.seek(std::io::SeekFrom::Start(from))?;
    let mut buf = Vec::new();
    f.take(max as u64).read_to_end(&mut buf)?;
    Ok(buf)
}
