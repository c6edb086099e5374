//! Container lifecycle: ensure image, create, start, wait, logs, deadline stop, remove, and crash
//! reconciliation. Every tenant container comes from [`crate::spec::build_create_body`].
//!
//! Lifecycle per lease: `ensure_image` -> `create` -> `start` -> (`wait` | `enforce_stop`)
//! -> `remove`. `reconcile` runs once at node start-up, before any new lease.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bollard::Docker;
use bollard::models::{ContainerInspectResponse, NetworkCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
};
use futures_util::StreamExt;
use gridlease_contracts::StopSchedule;
use gridlease_protocol::{LeaseId, Timestamp};

use crate::spec::{self, LABEL_LEASE, LABEL_NODE, SandboxSpec, SpecError};

/// A Docker operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The spec or the image was refused before anything was created.
    #[error("sandbox spec refused for lease {lease_id}: {source}")]
    Spec {
        /// The lease.
        lease_id: LeaseId,
        /// Why.
        #[source]
        source: SpecError,
    },
    /// The image was refused (it sets `LD_PRELOAD`).
    #[error("image refused: {source}")]
    Image {
        /// Why.
        #[source]
        source: SpecError,
    },
    /// A Docker API call failed.
    #[error("docker {op} failed for {target}: {source}")]
    Docker {
        /// Which call.
        op: &'static str,
        /// Container, image or network it was about.
        target: String,
        /// What the daemon said.
        #[source]
        source: bollard::errors::Error,
    },
    /// Pulling an image reported an error in its progress stream.
    #[error("pulling {image} failed: {message}")]
    Pull {
        /// The image.
        image: String,
        /// The daemon's message.
        message: String,
    },
    /// A pull made no progress for the stall limit.
    #[error("pulling {image} stalled: no progress for {secs} s")]
    PullStalled {
        /// The image.
        image: String,
        /// The stall limit, seconds.
        secs: u64,
    },
    /// A pull ran past its overall limit.
    #[error("pulling {image} took longer than {secs} s")]
    PullTimeout {
        /// The image.
        image: String,
        /// The limit, seconds.
        secs: u64,
    },
    /// The image unpacks to more than the limit: the pull was stopped (or the pulled image
    /// removed), nothing of it kept.
    #[error(
        "{image} unpacks to more than {max} bytes (at least {unpacked} seen); the pull was stopped and what it wrote removed"
    )]
    PullTooLarge {
        /// The image.
        image: String,
        /// What was seen unpacked when it stopped.
        unpacked: u64,
        /// The limit, bytes.
        max: u64,
    },
    /// The daemon answered something the call cannot use.
    #[error("docker {op}: {message}")]
    Unexpected {
        /// Which call.
        op: &'static str,
        /// What came back.
        message: String,
    },
    /// Building an image reported an error.
    #[error("building {image} failed: {message}")]
    Build {
        /// The image.
        image: String,
        /// The daemon's message.
        message: String,
    },
}

pub(crate) fn docker_err(
    op: &'static str,
    target: &str,
) -> impl FnOnce(bollard::errors::Error) -> SandboxError {
    let target = target.to_string();
    move |source| SandboxError::Docker { op, target, source }
}

/// One progress event while pulling an image, for the CLI to render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullProgress {
    /// Layer id, if the event is about a layer.
    pub layer: Option<String>,
    /// Status text (`Downloading`, `Pull complete`, ...).
    pub status: String,
    /// Bytes done, if known.
    pub current: Option<i64>,
    /// Bytes total, if known.
    pub total: Option<i64>,
}

/// Whether [`Sandbox::ensure_image_within`] pulled the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// It was there already.
    Present,
    /// This call pulled it; its unpacked size.
    Pulled {
        /// Bytes.
        bytes: u64,
    },
}

/// Limits on one image pull.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PullLimits {
    /// Longest silence of the daemon's progress stream (Docker reports layer bytes about
    /// every half second while data arrives).
    pub stall: Duration,
    /// Longest pull in all.
    pub total: Duration,
    /// Most bytes the image may take unpacked: the pull is stopped once it has unpacked more
    /// ([`crate::unpack::UnpackGauge`]), and a pulled image larger than this is removed.
    pub max_unpacked: Option<u64>,
}

impl PullLimits {
    /// No limits in practice (a year each).
    pub const NONE: Self = Self {
        stall: Duration::from_secs(365 * 86_400),
        total: Duration::from_secs(365 * 86_400),
        max_unpacked: None,
    };
}

/// How often a pull's unpacked bytes are measured against [`PullLimits::max_unpacked`].
const UNPACK_CHECK: Duration = Duration::from_millis(250);

/// How a container ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code (137 after SIGKILL, including the OOM killer).
    pub exit_code: i64,
    /// Whether the kernel OOM killer killed a process in the container.
    pub oom_killed: bool,
    /// Container run time from the daemon's `StartedAt`/`FinishedAt`, if both parse.
    pub run_ms: Option<u64>,
    /// `FinishedAt` as unix milliseconds, if it parses.
    pub finished_at: Option<Timestamp>,
}

/// What [`Sandbox::reconcile`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Containers removed because their lease is not live: (container id, lease label).
    pub removed: Vec<(String, String)>,
    /// Live leases that have no container: the node marks them failed.
    pub missing: Vec<LeaseId>,
    /// Containers kept because their lease is live.
    pub kept: Vec<(String, LeaseId)>,
}

/// Pure planning step of reconciliation: given `(container id, lease label)` pairs found for
/// this node and the live lease set, which containers to remove and which leases are missing.
pub fn plan_reconcile(
    found: &[(String, Option<String>)],
    live: &BTreeSet<LeaseId>,
) -> ReconcileReport {
    let mut report = ReconcileReport::default();
    let mut seen = BTreeSet::new();
    for (id, label) in found {
        let lease = label.as_deref().and_then(|l| l.parse::<LeaseId>().ok());
        match lease {
            Some(l) if live.contains(&l) => {
                seen.insert(l);
                report.kept.push((id.clone(), l));
            }
            _ => report
                .removed
                .push((id.clone(), label.clone().unwrap_or_default())),
        }
    }
    report.missing = live.iter().filter(|l| !seen.contains(l)).copied().collect();
    report
}

/// Unix milliseconds now (edge code only; pure code takes `now` as a parameter).
pub fn now_ms() -> Timestamp {
    Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    )
}

/// The sandbox: a negotiated Docker client plus the operations the node needs.
#[derive(Clone, Debug)]
pub struct Sandbox {
    docker: Docker,
}

impl Sandbox {
    /// Wraps an already negotiated client (see [`crate::docker::connect`]).
    pub fn new(docker: Docker) -> Self {
        Self { docker }
    }

    /// Connects to the local daemon and negotiates the API version.
    pub async fn connect() -> Result<Self, crate::docker::ConnectError> {
        Ok(Self::new(crate::docker::connect().await?))
    }

    /// The underlying client.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// Makes sure `image` is present (pulling it if needed, reporting progress) and refuses it
    /// if its config sets `LD_PRELOAD`. No pull limits (tests and tools); leases use
    /// [`Sandbox::ensure_image_within`].
    pub async fn ensure_image(
        &self,
        image: &str,
        on_progress: impl FnMut(PullProgress),
    ) -> Result<(), SandboxError> {
        self.ensure_image_within(image, PullLimits::NONE, on_progress)
            .await
            .map(|_| ())
    }

    /// [`Sandbox::ensure_image`] within `limits`: a pull whose progress stream is silent for
    /// `limits.stall` fails as stalled, one that runs past `limits.total` as timed out (a pull
    /// that keeps progressing is never cut by the stall limit). Dropping the stream closes the
    /// daemon connection, which cancels the daemon's pull.
    pub async fn ensure_image_within(
        &self,
        image: &str,
        limits: PullLimits,
        mut on_progress: impl FnMut(PullProgress),
    ) -> Result<Presence, SandboxError> {
        let mut pulled = false;
        let inspected = match self.docker.inspect_image(image).await {
            Ok(i) => i,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {
                tracing::info!(image, "pulling image");
                let (repo, tag) = split_reference(image);
                let opts = CreateImageOptionsBuilder::default()
                    .from_image(repo)
                    .tag(tag)
                    .build();
                let gauge = match limits.max_unpacked {
                    Some(_) => self.unpack_gauge().await,
                    None => None,
                };
                let mut stream = self.docker.create_image(Some(opts), None, None);
                let started = tokio::time::Instant::now();
                let mut check = tokio::time::interval(UNPACK_CHECK);
                let mut last_event = started;
                loop {
                    let left = limits.total.saturating_sub(started.elapsed());
                    if left.is_zero() {
                        return Err(SandboxError::PullTimeout {
                            image: image.to_string(),
                            secs: limits.total.as_secs(),
                        });
                    }
                    let stall_left = limits.stall.saturating_sub(last_event.elapsed());
                    let next = tokio::select! {
                        n = tokio::time::timeout(stall_left.min(left), stream.next()) => n,
                        _ = check.tick(), if gauge.is_some() => {
                            if let (Some(g), Some(max)) = (&gauge, limits.max_unpacked) {
                                let g = g.clone();
                                let unpacked = tokio::task::spawn_blocking(move || g.unpacked())
                                    .await
                                    .unwrap_or(0);
                                if unpacked > max {
                                    // Dropping the stream closes the connection, which cancels
                                    // the daemon's pull and the layer it was extracting.
                                    drop(stream);
                                    self.forget_partial_image(image).await;
                                    return Err(SandboxError::PullTooLarge {
                                        image: image.to_string(),
                                        unpacked,
                                        max,
                                    });
                                }
                            }
                            continue;
                        }
                    };
                    last_event = tokio::time::Instant::now();
                    let ev = match next {
                        Ok(Some(ev)) => ev,
                        Ok(None) => break,
                        Err(_) if stall_left <= left => {
                            return Err(SandboxError::PullStalled {
                                image: image.to_string(),
                                secs: limits.stall.as_secs(),
                            });
                        }
                        Err(_) => {
                            return Err(SandboxError::PullTimeout {
                                image: image.to_string(),
                                secs: limits.total.as_secs(),
                            });
                        }
                    };
                    let ev = ev.map_err(docker_err("pull", image))?;
                    if let Some(err) = ev.error_detail.and_then(|d| d.message) {
                        return Err(SandboxError::Pull {
                            image: image.to_string(),
                            message: err,
                        });
                    }
                    pulled = true;
                    on_progress(PullProgress {
                        layer: ev.id,
                        status: ev.status.unwrap_or_default(),
                        current: ev.progress_detail.as_ref().and_then(|p| p.current),
                        total: ev.progress_detail.as_ref().and_then(|p| p.total),
                    });
                }
                self.docker
                    .inspect_image(image)
                    .await
                    .map_err(docker_err("inspect_image", image))?
            }
            Err(e) => return Err(docker_err("inspect_image", image)(e)),
        };
        let size = inspected
            .size
            .and_then(|b| u64::try_from(b).ok())
            .unwrap_or(0);
        if pulled
            && let Some(max) = limits.max_unpacked
            && size > max
        {
            // Pulled whole before the gauge saw it (or with no gauge): removed all the same.
            self.forget_partial_image(image).await;
            return Err(SandboxError::PullTooLarge {
                image: image.to_string(),
                unpacked: size,
                max,
            });
        }
        spec::check_image_config(image, inspected.config.as_ref())
            .map_err(|source| SandboxError::Image { source })?;
        Ok(if pulled {
            Presence::Pulled { bytes: size }
        } else {
            Presence::Present
        })
    }

    /// Removes what a stopped or refused pull of `image` left: the image if it got that far
    /// (its layers go with it when no other image uses them). The daemon drops the layers of a
    /// cancelled pull itself.
    async fn forget_partial_image(&self, image: &str) {
        let opts = bollard::query_parameters::RemoveImageOptionsBuilder::default()
            .force(true)
            .build();
        // The cancelled pull may still be winding down: try a few times.
        for _ in 0..20 {
            match self
                .docker
                .remove_image(image, Some(opts.clone()), None)
                .await
            {
                Ok(_)
                | Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => {}
                Err(e) => tracing::debug!(image, error = %e, "removing a refused image"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            if matches!(
                self.docker.inspect_image(image).await,
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404,
                    ..
                })
            ) {
                return;
            }
        }
        tracing::warn!(
            image,
            "an image over the unpacked limit could not be removed"
        );
    }

    /// Removes an image (not forced: the daemon refuses one a container still uses, which is
    /// then kept). `Ok(false)`: it is in use; an image already gone counts as removed.
    pub async fn remove_image(&self, image: &str) -> Result<bool, SandboxError> {
        match self
            .docker
            .remove_image(
                image,
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(true),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            }) => Ok(false),
            Err(e) => Err(docker_err("remove_image", image)(e)),
        }
    }

    /// Creates the hardened container for `spec` (image must be present; see
    /// [`Sandbox::ensure_image`], which also applies the `LD_PRELOAD` check). Returns its id.
    pub async fn create(&self, spec: &SandboxSpec) -> Result<String, SandboxError> {
        let body = spec::build_create_body(spec).map_err(|source| SandboxError::Spec {
            lease_id: spec.lease_id,
            source,
        })?;
        // Re-check the image config right before create so a re-tagged image can't slip in.
        let img = self
            .docker
            .inspect_image(&spec.image)
            .await
            .map_err(docker_err("inspect_image", &spec.image))?;
        spec::check_image_config(&spec.image, img.config.as_ref())
            .map_err(|source| SandboxError::Image { source })?;
        let name = spec::container_name(spec);
        let opts = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = self
            .docker
            .create_container(Some(opts), body)
            .await
            .map_err(docker_err("create_container", &name))?;
        tracing::info!(lease = %spec.lease_id, container = %created.id, "container created");
        Ok(created.id)
    }

    /// Starts a created container.
    pub async fn start(&self, id: &str) -> Result<(), SandboxError> {
        self.docker
            .start_container(id, None)
            .await
            .map_err(docker_err("start_container", id))
    }

    /// Waits for the container to exit and reports exit code, OOM kill and run time.
    pub async fn wait(&self, id: &str) -> Result<ExitInfo, SandboxError> {
        let mut stream = self.docker.wait_container(id, None);
        // One item arrives when the container stops; a non-zero exit comes as an error.
        match stream.next().await {
            None | Some(Ok(_)) => {}
            Some(Err(bollard::errors::Error::DockerContainerWaitError { .. })) => {}
            Some(Err(e)) => return Err(docker_err("wait_container", id)(e)),
        }
        self.exit_info(id).await
    }

    /// Exit information from `inspect` (valid once the container has stopped).
    pub async fn exit_info(&self, id: &str) -> Result<ExitInfo, SandboxError> {
        let info = self.inspect(id).await?;
        let state = info.state.unwrap_or_default();
        let started = state
            .started_at
            .as_deref()
            .and_then(crate::time::parse_rfc3339_ns);
        let finished = state
            .finished_at
            .as_deref()
            .and_then(crate::time::parse_rfc3339_ns);
        let run_ms = match (started, finished) {
            (Some(s), Some(f)) if f >= s => Some(((f - s) / 1_000_000) as u64),
            _ => None,
        };
        Ok(ExitInfo {
            exit_code: state.exit_code.unwrap_or(-1),
            oom_killed: state.oom_killed.unwrap_or(false),
            run_ms,
            finished_at: finished
                .filter(|f| *f > 0)
                .map(|f| Timestamp((f / 1_000_000) as u64)),
        })
    }

    /// `docker inspect`.
    pub async fn inspect(&self, id: &str) -> Result<ContainerInspectResponse, SandboxError> {
        self.docker
            .inspect_container(id, None)
            .await
            .map_err(docker_err("inspect_container", id))
    }

    /// Collects stdout+stderr, following until the container exits or `max_bytes` have been
    /// read (the rest is dropped, so a chatty tenant cannot exhaust provider memory).
    pub async fn logs(
        &self,
        id: &str,
        follow: bool,
        max_bytes: usize,
    ) -> Result<String, SandboxError> {
        let mut out = Vec::new();
        self.logs_with(id, follow, max_bytes, |chunk| out.extend_from_slice(chunk))
            .await?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Streams stdout+stderr chunks to `on_chunk` (e.g. for the CLI to render live), following
    /// until the container exits if `follow`, and stopping after `max_bytes` in total. Returns
    /// the number of bytes delivered.
    pub async fn logs_with(
        &self,
        id: &str,
        follow: bool,
        max_bytes: usize,
        mut on_chunk: impl FnMut(&[u8]),
    ) -> Result<usize, SandboxError> {
        let stream = self.log_stream(id, follow);
        futures_util::pin_mut!(stream);
        let mut delivered = 0usize;
        while let Some(bytes) = stream.next().await {
            let bytes = bytes?;
            let room = max_bytes.saturating_sub(delivered);
            let take = bytes.len().min(room);
            on_chunk(&bytes[..take]);
            delivered += take;
            if delivered >= max_bytes {
                break;
            }
        }
        Ok(delivered)
    }

    /// The container's stdout+stderr from its first byte, as the daemon returns it (raw bytes,
    /// no UTF-8 conversion; exact when the log driver keeps bytes, as the `local` driver that
    /// [`crate::spec::build_create_body`] sets does). With `follow` the stream ends when the
    /// container has exited and everything was delivered (or when it is removed). Owns what it
    /// needs, so a task can hold it.
    pub fn log_stream(
        &self,
        id: &str,
        follow: bool,
    ) -> impl futures_util::Stream<Item = Result<bytes::Bytes, SandboxError>> + Send + 'static {
        let opts = LogsOptionsBuilder::default()
            .follow(follow)
            .stdout(true)
            .stderr(true)
            .build();
        let target = id.to_string();
        self.docker.logs(id, Some(opts)).map(move |chunk| {
            chunk
                .map(bollard::container::LogOutput::into_bytes)
                .map_err(docker_err("logs", &target))
        })
    }

    /// Deadline watcher: sends SIGTERM `grace` before `deadline`, then SIGKILL at `deadline` if
    /// the container still runs, so it is stopped by the deadline whatever the tenant does.
    /// Returns when the container is no longer running. By the wall clock, with no SIGTERM
    /// claim: [`Sandbox::enforce_stop`] is the general form.
    pub async fn enforce_deadline(
        &self,
        id: &str,
        deadline: Timestamp,
        grace: Duration,
    ) -> Result<(), SandboxError> {
        let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
        self.enforce_stop(
            id,
            StopSchedule::at_deadline(deadline, grace_ms),
            &now_ms,
            None,
        )
        .await
    }

    /// Stops a container on `schedule` ([`gridlease_contracts::deadline`]): SIGTERM at
    /// `term_at`, SIGKILL at `kill_at` if it still runs, each only while it runs; returns once
    /// it no longer runs (or no longer exists), early if it stops by itself. Times are read
    /// from `now` (the node's injected clock, or the wall clock in the watchdog); timers only
    /// pace the checks. With `once`, SIGTERM is sent only by whoever claims it first (the node
    /// and its watchdog both enforce the deadline; the tenant gets one SIGTERM, not two);
    /// SIGKILL needs no claim.
    pub async fn enforce_stop(
        &self,
        id: &str,
        schedule: StopSchedule,
        now: &(dyn Fn() -> Timestamp + Sync),
        once: Option<&TermClaim>,
    ) -> Result<(), SandboxError> {
        if !self.wait_stopped_until(id, schedule.term_at, now).await? {
            return Ok(());
        }
        if self.is_running(id).await? {
            if once.is_none_or(TermClaim::claim) {
                tracing::info!(container = id, at = %schedule.term_at, kill_at = %schedule.kill_at, "lease ending: SIGTERM");
                self.signal(id, "SIGTERM").await?;
            } else {
                tracing::debug!(container = id, "SIGTERM already sent for this container");
            }
        }
        if !self.wait_stopped_until(id, schedule.kill_at, now).await? {
            return Ok(());
        }
        if self.is_running(id).await? {
            tracing::info!(container = id, at = %schedule.kill_at, "lease ended: SIGKILL");
            self.signal(id, "SIGKILL").await?;
        }
        // Wait for the daemon to record the stop (a SIGKILL takes effect at once; a daemon that
        // does not answer is not waited on forever).
        if tokio::time::timeout(KILL_WAIT, self.stopped(id))
            .await
            .is_err()
        {
            tracing::warn!(
                container = id,
                "container still recorded as running after SIGKILL"
            );
        }
        Ok(())
    }

    /// Waits until `at` by `now`. Returns false if the container stopped (or is gone) first.
    async fn wait_stopped_until(
        &self,
        id: &str,
        at: Timestamp,
        now: &(dyn Fn() -> Timestamp + Sync),
    ) -> Result<bool, SandboxError> {
        tokio::select! {
            () = self.stopped(id) => Ok(false),
            () = sleep_until(at, now) => Ok(true),
        }
    }

    /// Resolves once the container is not running (stopped, or removed, or never there).
    async fn stopped(&self, id: &str) {
        loop {
            let mut stream = self.docker.wait_container(id, None);
            match stream.next().await {
                None | Some(Ok(_)) => return,
                Some(Err(
                    bollard::errors::Error::DockerContainerWaitError { .. }
                    | bollard::errors::Error::DockerResponseServerError {
                        status_code: 404, ..
                    },
                )) => return,
                Some(Err(e)) => {
                    // The connection broke (daemon restart?): ask again rather than guess.
                    tracing::debug!(container = id, error = %e, "waiting for the container failed");
                    if !self.is_running(id).await.unwrap_or(true) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Whether the container runs; a container that does not exist does not.
    async fn is_running(&self, id: &str) -> Result<bool, SandboxError> {
        match self.docker.inspect_container(id, None).await {
            Ok(info) => Ok(info.state.and_then(|s| s.running).unwrap_or(false)),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(false),
            Err(e) => Err(docker_err("inspect_container", id)(e)),
        }
    }

    async fn signal(&self, id: &str, signal: &str) -> Result<(), SandboxError> {
        let opts = KillContainerOptionsBuilder::default()
            .signal(signal)
            .build();
        match self.docker.kill_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            // 409: not running any more; that is the goal.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            }) => Ok(()),
            Err(e) => Err(docker_err("kill_container", id)(e)),
        }
    }

    /// Removes a container (forcefully: kills it if still running). Missing is not an error,
    /// and neither is a removal already in progress (someone else's `docker rm`, a watchdog):
    /// that waits, at most [`REMOVAL_WAIT`], until the container is gone.
    pub async fn remove(&self, id: &str) -> Result<(), SandboxError> {
        let opts = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(id, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409,
                message,
            }) if message.contains("already in progress") => {
                // The container is still listed (as running, until killed) meanwhile.
                let deadline = tokio::time::Instant::now() + REMOVAL_WAIT;
                loop {
                    match self.docker.inspect_container(id, None).await {
                        Err(bollard::errors::Error::DockerResponseServerError {
                            status_code: 404,
                            ..
                        }) => return Ok(()),
                        Err(e) => return Err(docker_err("inspect_container", id)(e)),
                        Ok(_) if tokio::time::Instant::now() >= deadline => {
                            let e = bollard::errors::Error::DockerResponseServerError {
                                status_code: 409,
                                message,
                            };
                            return Err(docker_err("remove_container", id)(e));
                        }
                        Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            }
            Err(e) => Err(docker_err("remove_container", id)(e)),
        }
    }

    /// Containers labelled with `gridlease.node=<node_id>`: (id, lease label).
    pub async fn list_node_containers(
        &self,
        node_id: &str,
    ) -> Result<Vec<(String, Option<String>)>, SandboxError> {
        let mut filters = HashMap::new();
        filters.insert("label", vec![format!("{LABEL_NODE}={node_id}")]);
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let list = self
            .docker
            .list_containers(Some(opts))
            .await
            .map_err(docker_err("list_containers", node_id))?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let lease = c.labels.as_ref().and_then(|l| l.get(LABEL_LEASE).cloned());
                c.id.map(|id| (id, lease))
            })
            .collect())
    }

    /// After a node crash: removes this node's containers whose lease is not live, and reports
    /// live leases without a container (to be marked failed).
    pub async fn reconcile(
        &self,
        node_id: &str,
        live: &BTreeSet<LeaseId>,
    ) -> Result<ReconcileReport, SandboxError> {
        let found = self.list_node_containers(node_id).await?;
        let report = plan_reconcile(&found, live);
        for (id, lease) in &report.removed {
            tracing::warn!(container = %id, lease = %lease, node = node_id, "removing orphan container");
            self.remove(id).await?;
        }
        for lease in &report.missing {
            tracing::warn!(lease = %lease, node = node_id, "live lease has no container");
        }
        Ok(report)
    }

    /// Creates (if missing) the egress bridge: inter-container traffic disabled
    /// (`enable_icc=false`). Returns its id. This is only the network: LAN, metadata and host
    /// blocking are host firewall rules, installed by [`Sandbox::ensure_egress`], which the node
    /// calls before every egress container (see docs/security-model.md).
    pub async fn ensure_egress_network(&self, name: &str) -> Result<String, SandboxError> {
        if let Ok(n) = self.docker.inspect_network(name, None).await {
            return Ok(n.id.unwrap_or_default());
        }
        let mut options = HashMap::new();
        options.insert(
            "com.docker.network.bridge.enable_icc".to_string(),
            "false".to_string(),
        );
        let mut labels = HashMap::new();
        labels.insert("gridlease.egress".to_string(), "true".to_string());
        let req = NetworkCreateRequest {
            name: name.to_string(),
            driver: Some("bridge".to_string()),
            internal: Some(false),
            attachable: Some(false),
            options: Some(options),
            labels: Some(labels),
            ..Default::default()
        };
        let created = self
            .docker
            .create_network(req)
            .await
            .map_err(docker_err("create_network", name))?;
        Ok(created.id)
    }

    /// Removes a network; missing is not an error.
    pub async fn remove_network(&self, name: &str) -> Result<(), SandboxError> {
        match self.docker.remove_network(name).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(e) => Err(docker_err("remove_network", name)(e)),
        }
    }
}

/// Longest nap while waiting for a time: the clock is read again at least this often, so a
/// clock that jumps (a test's manual clock, a suspended host) is followed.
const MAX_NAP: Duration = Duration::from_secs(1);

/// How long [`Sandbox::enforce_stop`] waits for the daemon to record a SIGKILLed container as
/// stopped.
const KILL_WAIT: Duration = Duration::from_secs(30);

/// How long [`Sandbox::remove`] waits for someone else's removal of the same container.
const REMOVAL_WAIT: Duration = Duration::from_secs(30);

async fn sleep_until(at: Timestamp, now: &(dyn Fn() -> Timestamp + Sync)) {
    loop {
        let n = now();
        if n >= at {
            return;
        }
        tokio::time::sleep(Duration::from_millis(at.ms_since(n)).min(MAX_NAP)).await;
    }
}

/// The right to send a container's one SIGTERM, held in a marker file: whoever creates it
/// first (the node's session or the watchdog, see [`Sandbox::enforce_stop`]) sends SIGTERM,
/// the other does not. The file outlives both processes, so a restarted node does not send a
/// second SIGTERM either.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TermClaim {
    path: PathBuf,
}

impl TermClaim {
    /// The claim kept in the marker file `path` (its directory must exist).
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// The marker file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the claim: true if this call created the marker. A marker that cannot be
    /// written (a missing or read-only directory) does not stop the SIGTERM: true, and a
    /// warning (a tenant told twice is better than a tenant never told).
    pub fn claim(&self) -> bool {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&self.path)
        {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot write the SIGTERM marker; sending SIGTERM anyway");
                true
            }
        }
    }

    /// Whether the claim was taken.
    pub fn taken(&self) -> bool {
        self.path.exists()
    }
}

/// Splits `repo[:tag]` (a registry port is not a tag); default tag `latest`.
pub fn split_reference(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (image, "latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::Digest;

    #[test]
    fn split_reference_handles_ports_and_tags() {
        assert_eq!(split_reference("ubuntu"), ("ubuntu", "latest"));
        assert_eq!(split_reference("ubuntu:22.04"), ("ubuntu", "22.04"));
        assert_eq!(split_reference("reg:5000/x/y"), ("reg:5000/x/y", "latest"));
        assert_eq!(split_reference("reg:5000/x/y:1"), ("reg:5000/x/y", "1"));
    }

    #[test]
    fn plan_reconcile_removes_orphans_and_flags_missing() {
        let a = LeaseId(Digest::of("t", b"a"));
        let b = LeaseId(Digest::of("t", b"b"));
        let c = LeaseId(Digest::of("t", b"c"));
        let found = vec![
            ("ca".to_string(), Some(a.to_string())),
            ("cb".to_string(), Some(b.to_string())),
            ("cx".to_string(), Some("garbage".to_string())),
            ("cn".to_string(), None),
        ];
        let live = BTreeSet::from([a, c]);
        let r = plan_reconcile(&found, &live);
        assert_eq!(r.kept, vec![("ca".to_string(), a)]);
        let removed: Vec<_> = r.removed.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(removed, vec!["cb", "cx", "cn"]);
        assert_eq!(r.missing, vec![c]);
    }
}
