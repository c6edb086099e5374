//! The deadline watchdog: one small process per tenant container that stops it at its deadline
//! even when the node is dead (issue 12).
//!
//! # Mechanism
//! Right after a container starts, and again when a restarted node resumes a running lease, the
//! provider's session runs [`ensure`]: it spawns the node's own executable as
//! `gridlease __watchdog --container ID --deadline-ms T --grace-ms G --term-marker PATH`
//! ([`WatchdogArgs`]) in its own process group (a `kill -9` of the node, or Ctrl-C in the
//! node's terminal, does not reach it), stdin and stdout on `/dev/null`, stderr appended to
//! `leases/<lease>.watchdog.log`. The watchdog ([`run`]) follows the same
//! [`StopSchedule::at_deadline`] as the node's session: SIGTERM at `deadline - grace`, SIGKILL
//! at the deadline, through the Docker API; it exits as soon as the container no longer runs
//! (stopped by itself or by the node, or removed: early, without signalling anything).
//!
//! **An extended lease** (`gridlease extend`) moves the deadline later. The watchdog learns it
//! from `leases/<lease>.deadline` (`--deadline-file`; unix ms, written atomically by the
//! provider's session *before* it accepts the extension: [`set_deadline`]). Until the SIGTERM
//! time it reads the file every [`DEADLINE_POLL`]; a later deadline replaces its schedule, an
//! earlier or unreadable one is ignored (it never stops a container before the deadline it was
//! started with). The provider accepts an extension only up to
//! `gridlease_contracts::amend::AMEND_MARGIN_MS` (1 s, four polls) before the SIGTERM time, so
//! the watchdog sees it before it acts; once SIGTERM is sent nothing moves the deadline.
//!
//! It is idempotent with the node's own enforcement: SIGKILL twice is SIGKILL once, and SIGTERM
//! goes through a [`TermClaim`] (`leases/<lease>.term`), so the tenant gets one SIGTERM whoever
//! sends it. It never removes the container: the node does, once it has settled the lease
//! (exit code, output and the final report come from the stopped container).
//!
//! A restarted node does not start a second watchdog for a container whose watchdog still runs:
//! the watchdog's pid is kept in `leases/<lease>.watchdog`, and a process with that pid whose
//! command line is `__watchdog` for this container counts as running (Linux `/proc`). Were the
//! check wrong, a second watchdog would be harmless (the claim, and SIGKILL being idempotent).
//!
//! # Why a process outside the container
//! It needs nothing outside the project (no systemd timer: not on every host, not in CI), and
//! it sits outside the tenant's reach. A deadline kept inside the container (its init) would
//! need a host binary mounted into every tenant container, which the sandbox never does
//! (`binds`, `mounts` never set), and it would run in the tenant's namespaces under the
//! tenant's uid.
//!
//! **A Docker daemon that does not answer** (blocked, overloaded) cannot stop the container.
//! At its start the watchdog asks Docker for the container's init process (its host PID and
//! the container's full id); [`DIRECT_AFTER`] past the deadline, if the container was not seen
//! to stop, it sends SIGKILL to that process itself through a pidfd, after checking that the
//! process still sits in the container's cgroup. The container's PID namespace dies with its
//! init, so every process of the tenant ends (`gridlease_sandbox::direct`); Docker records the
//! exit when it answers again.
//!
//! What it does not cover: a host that reboots (the containers are gone too), a Docker daemon
//! that did not answer even when the container started (then only Docker can stop it: the
//! watchdog keeps trying until [`GIVE_UP_AFTER`] after the deadline), and someone killing the
//! watchdog itself (then the node's own enforcement is all there is, while the node runs).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use gridlease_contracts::StopSchedule;
use gridlease_protocol::{LeaseId, Timestamp};
use gridlease_sandbox::Sandbox;
use gridlease_sandbox::direct::{InitProcess, Killed};
use gridlease_sandbox::runtime::{TermClaim, now_ms};

/// The hidden subcommand of the `gridlease` binary that runs a watchdog.
pub const SUBCOMMAND: &str = "__watchdog";

/// How long past the deadline a watchdog keeps trying when Docker does not answer.
pub const GIVE_UP_AFTER: Duration = Duration::from_secs(600);

/// Pause between attempts when Docker does not answer.
const RETRY: Duration = Duration::from_secs(2);

/// How often a watchdog looks for a later deadline (an extended lease) before the SIGTERM
/// time; well below `gridlease_contracts::amend::AMEND_MARGIN_MS`.
pub const DEADLINE_POLL: Duration = Duration::from_millis(250);

/// What one watchdog enforces (the arguments of `gridlease __watchdog`).
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct WatchdogArgs {
    /// The container to stop (id or name).
    #[arg(long)]
    pub container: String,
    /// The lease's deadline, unix milliseconds: SIGKILL then, if it still runs.
    #[arg(long)]
    pub deadline_ms: u64,
    /// SIGTERM this many milliseconds before the deadline.
    #[arg(long)]
    pub grace_ms: u64,
    /// The SIGTERM claim shared with the node (a marker file; see `TermClaim`).
    #[arg(long)]
    pub term_marker: PathBuf,
    /// Where the provider writes a later deadline when the lease is extended (unix ms).
    #[arg(long)]
    pub deadline_file: Option<PathBuf>,
}

impl WatchdogArgs {
    /// The command line that runs this watchdog (after the executable).
    pub fn to_argv(&self) -> Vec<OsString> {
        let mut argv: Vec<OsString> = vec![
            SUBCOMMAND.into(),
            "--container".into(),
            self.container.clone().into(),
            "--deadline-ms".into(),
            self.deadline_ms.to_string().into(),
            "--grace-ms".into(),
            self.grace_ms.to_string().into(),
            "--term-marker".into(),
            self.term_marker.clone().into_os_string(),
        ];
        if let Some(f) = &self.deadline_file {
            argv.push("--deadline-file".into());
            argv.push(f.clone().into_os_string());
        }
        argv
    }

    /// When it signals the container, for the deadline it was started with.
    pub fn schedule(&self) -> StopSchedule {
        StopSchedule::at_deadline(Timestamp(self.deadline_ms), self.grace_ms)
    }

    /// The deadline now: the later of the one it was started with and the deadline file's.
    pub fn current_deadline(&self) -> Timestamp {
        let file = self
            .deadline_file
            .as_deref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(0);
        Timestamp(self.deadline_ms.max(file))
    }
}

/// Why a watchdog could not be started or could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    /// Its log file could not be opened.
    #[error("watchdog log {path} for lease {lease_id}: {source}")]
    Log {
        /// The lease.
        lease_id: LeaseId,
        /// The log file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The process could not be spawned.
    #[error("cannot spawn the watchdog {exe} for lease {lease_id}: {source}")]
    Spawn {
        /// The lease.
        lease_id: LeaseId,
        /// The executable.
        exe: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Docker did not let it stop the container until [`GIVE_UP_AFTER`] past the deadline.
    #[error("gave up on container {container}: {detail}")]
    GaveUp {
        /// The container.
        container: String,
        /// The last error.
        detail: String,
    },
}

/// The SIGTERM claim of a lease's container, shared by its session and its watchdog.
pub fn term_claim(data_dir: &Path, id: &LeaseId) -> TermClaim {
    TermClaim::new(data_dir.join(format!("{id}.term")))
}

fn pid_path(data_dir: &Path, id: &LeaseId) -> PathBuf {
    data_dir.join(format!("{id}.watchdog"))
}

fn log_path(data_dir: &Path, id: &LeaseId) -> PathBuf {
    data_dir.join(format!("{id}.watchdog.log"))
}

/// Where the provider tells a lease's watchdog its current deadline.
pub fn deadline_path(data_dir: &Path, id: &LeaseId) -> PathBuf {
    data_dir.join(format!("{id}.deadline"))
}

/// Tells the watchdog of lease `id` its deadline (after an extension): writes the unix ms to
/// [`deadline_path`] atomically (a temporary file renamed over it), so the watchdog reads the
/// old deadline or the new one, never part of one.
pub fn set_deadline(data_dir: &Path, id: &LeaseId, deadline: Timestamp) -> std::io::Result<()> {
    let path = deadline_path(data_dir, id);
    let tmp = path.with_extension("deadline.tmp");
    std::fs::write(&tmp, deadline.0.to_string())?;
    std::fs::rename(&tmp, &path)
}

/// What [`ensure`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ensured {
    /// Spawned a watchdog with this pid.
    Spawned(u32),
    /// The container's watchdog (this pid) still runs.
    Running(u32),
}

/// Makes sure a watchdog runs for `container` of lease `id` (deadline and grace as given):
/// spawns `exe __watchdog ..` unless the one recorded for this lease still runs.
pub fn ensure(
    exe: &Path,
    data_dir: &Path,
    id: &LeaseId,
    container: &str,
    deadline: Timestamp,
    grace: Duration,
) -> Result<Ensured, WatchdogError> {
    let pids = pid_path(data_dir, id);
    if let Some(pid) = running_watchdog(&pids, container) {
        return Ok(Ensured::Running(pid));
    }
    let args = WatchdogArgs {
        container: container.to_string(),
        deadline_ms: deadline.0,
        grace_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
        term_marker: term_claim(data_dir, id).path().to_path_buf(),
        deadline_file: Some(deadline_path(data_dir, id)),
    };
    let log = log_path(data_dir, id);
    let log_err = |source| WatchdogError::Log {
        lease_id: *id,
        path: log.clone(),
        source,
    };
    std::fs::create_dir_all(data_dir).map_err(log_err)?;
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(log_err)?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(args.to_argv())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        // Its own process group: a signal to the node's (Ctrl-C, a service manager stopping
        // the node's group) does not reach it; a SIGKILL of the node never does.
        .process_group(0)
        .kill_on_drop(false);
    // The child is not waited on here: dropped, tokio reaps it when it exits.
    let child = cmd.spawn().map_err(|source| WatchdogError::Spawn {
        lease_id: *id,
        exe: exe.to_path_buf(),
        source,
    })?;
    let pid = child.id().unwrap_or(0);
    if let Err(e) = std::fs::write(&pids, pid.to_string()) {
        // Only the duplicate check needs it; a second watchdog would be harmless.
        tracing::warn!(path = %pids.display(), error = %e, "cannot record the watchdog's pid");
    }
    Ok(Ensured::Spawned(pid))
}

/// The pid recorded in `pid_file`, if that process is a watchdog of `container`.
fn running_watchdog(pid_file: &Path, container: &str) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(pid_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args = cmdline.split(|b| *b == 0);
    let ours =
        args.clone().any(|a| a == SUBCOMMAND.as_bytes()) && args.any(|a| a == container.as_bytes());
    ours.then_some(pid)
}

/// Removes a settled lease's watchdog files (its pid, the SIGTERM claim and the deadline file;
/// the log stays).
pub fn forget(data_dir: &Path, id: &LeaseId) {
    for p in [
        pid_path(data_dir, id),
        term_claim(data_dir, id).path().to_path_buf(),
        deadline_path(data_dir, id),
    ] {
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %p.display(), error = %e, "cannot remove"),
        }
    }
}

/// How long past the deadline the watchdog waits for Docker to have stopped the container
/// before it kills the container's processes itself ([`gridlease_sandbox::direct`]).
pub const DIRECT_AFTER: Duration = Duration::from_secs(2);

/// Longest the watchdog waits for Docker to name the container's init process at its start.
const FIND_INIT: Duration = Duration::from_secs(10);

/// The watchdog itself (`gridlease __watchdog`): stops the container on its schedule by the
/// wall clock, then returns; follows a later deadline from the deadline file until the SIGTERM
/// time; retries while Docker does not answer, until [`GIVE_UP_AFTER`] past the deadline.
///
/// Docker may not answer at all (a daemon blocked by a stuck stream): at its start the
/// watchdog asks Docker once for the container's init process, and [`DIRECT_AFTER`] past the
/// deadline, if the container was not seen to stop, it kills that process itself, which ends
/// every process of the container (`gridlease_sandbox::direct`).
pub async fn run(args: &WatchdogArgs) -> Result<(), WatchdogError> {
    let claim = TermClaim::new(args.term_marker.clone());
    let mut deadline = args.current_deadline();
    let first = StopSchedule::at_deadline(deadline, args.grace_ms);
    tracing::info!(container = %args.container, term_at = %first.term_at, kill_at = %first.kill_at, "watchdog started");
    let init = find_init(&args.container).await;
    let mut direct_tried = false;
    loop {
        let schedule = StopSchedule::at_deadline(deadline, args.grace_ms);
        let give_up = schedule
            .kill_at
            .plus_ms(u64::try_from(GIVE_UP_AFTER.as_millis()).unwrap_or(u64::MAX));
        let enforce = async {
            let r = match Sandbox::connect().await {
                Ok(sb) => sb
                    .enforce_stop(&args.container, schedule, &now_ms, Some(&claim))
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if r.is_err() && now_ms() <= give_up {
                tokio::time::sleep(RETRY).await;
            }
            r
        };
        let direct_at = schedule
            .kill_at
            .plus_ms(u64::try_from(DIRECT_AFTER.as_millis()).unwrap_or(u64::MAX));
        // Before the SIGTERM time nothing has been signalled: waiting for it may be cut short
        // by a later deadline.
        let attempt = tokio::select! {
            r = enforce => r,
            later = later_deadline(args, deadline, schedule.term_at) => {
                let s = StopSchedule::at_deadline(later, args.grace_ms);
                tracing::info!(container = %args.container, term_at = %s.term_at, kill_at = %s.kill_at, "deadline moved later (lease extended)");
                deadline = later;
                continue;
            }
            () = wall_sleep_until(direct_at), if init.is_some() && !direct_tried => {
                direct_tried = true;
                let Some(p) = &init else { continue };
                match p.kill() {
                    Ok(Killed::Killed) => {
                        tracing::warn!(container = %args.container, pid = p.pid, "Docker did not stop the container by its deadline: its processes were killed directly");
                        return Ok(());
                    }
                    Ok(Killed::Gone) => {
                        tracing::info!(container = %args.container, "the container's processes are gone; watchdog done");
                        return Ok(());
                    }
                    Err(e) => {
                        tracing::warn!(container = %args.container, error = %e, "cannot kill the container's processes directly; still asking Docker");
                        continue;
                    }
                }
            }
        };
        match attempt {
            Ok(()) => {
                tracing::info!(container = %args.container, "container not running; watchdog done");
                return Ok(());
            }
            Err(detail) if now_ms() > give_up => {
                return Err(WatchdogError::GaveUp {
                    container: args.container.clone(),
                    detail,
                });
            }
            Err(detail) => {
                tracing::warn!(container = %args.container, error = %detail, "watchdog: Docker failed; retrying");
            }
        }
    }
}

/// The container's init process, as Docker names it at the watchdog's start (`None`: Docker
/// did not answer within [`FIND_INIT`], or the container does not run: then only Docker can
/// stop it).
async fn find_init(container: &str) -> Option<InitProcess> {
    let asked = async {
        let sb = Sandbox::connect().await.map_err(|e| e.to_string())?;
        sb.init_process(container).await.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(FIND_INIT, asked).await {
        Ok(Ok(Some(p))) => {
            tracing::info!(
                container,
                pid = p.pid,
                "the container's init process, for a stop without Docker"
            );
            Some(p)
        }
        Ok(Ok(None)) => None,
        Ok(Err(e)) => {
            tracing::warn!(container, error = %e, "cannot find the container's init process: only Docker can stop it");
            None
        }
        Err(_) => {
            tracing::warn!(
                container,
                "Docker did not name the container's init process in time: only Docker can stop it"
            );
            None
        }
    }
}

/// Sleeps until `at` by the wall clock.
async fn wall_sleep_until(at: Timestamp) {
    loop {
        let left = at.0.saturating_sub(now_ms().0);
        if left == 0 {
            return;
        }
        // In steps: a wall clock that jumps is followed within a second.
        tokio::time::sleep(Duration::from_millis(left.min(1000))).await;
    }
}

/// Resolves with a deadline later than `current` once the deadline file says so; never once
/// the SIGTERM time `term_at` has come (then it stays pending).
async fn later_deadline(args: &WatchdogArgs, current: Timestamp, term_at: Timestamp) -> Timestamp {
    loop {
        tokio::time::sleep(DEADLINE_POLL).await;
        if now_ms() >= term_at {
            return std::future::pending().await;
        }
        let d = args.current_deadline();
        if d > current {
            return d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_spawned_command_line_parses_back_to_the_same_args() {
        let args = WatchdogArgs {
            container: "abc123".into(),
            deadline_ms: 1_700_000_012_345,
            grace_ms: 2_000,
            term_marker: PathBuf::from("/tmp/some dir/x.term"),
            deadline_file: Some(PathBuf::from("/tmp/some dir/x.deadline")),
        };
        let mut argv: Vec<OsString> = vec!["gridlease".into()];
        argv.extend(args.to_argv());
        let cli = crate::commands::Cli::try_parse_from(argv).unwrap();
        match cli.command {
            crate::commands::Command::Watchdog(parsed) => assert_eq!(parsed, args),
            other => panic!("parsed as {other:?}"),
        }
        assert_eq!(
            args.schedule(),
            StopSchedule {
                term_at: Timestamp(1_700_000_010_345),
                kill_at: Timestamp(1_700_000_012_345),
            }
        );
    }

    #[test]
    fn the_deadline_file_only_ever_moves_the_deadline_later() {
        let dir = tempfile::tempdir().unwrap();
        let id = LeaseId(gridlease_protocol::Digest::of("t", b"deadline"));
        let mut args = WatchdogArgs {
            container: "c".into(),
            deadline_ms: 10_000,
            grace_ms: 1_000,
            term_marker: dir.path().join("x.term"),
            deadline_file: Some(deadline_path(dir.path(), &id)),
        };
        assert_eq!(args.current_deadline(), Timestamp(10_000), "no file yet");
        set_deadline(dir.path(), &id, Timestamp(25_000)).unwrap();
        assert_eq!(args.current_deadline(), Timestamp(25_000));
        set_deadline(dir.path(), &id, Timestamp(5_000)).unwrap();
        assert_eq!(args.current_deadline(), Timestamp(10_000), "never earlier");
        std::fs::write(deadline_path(dir.path(), &id), "soon").unwrap();
        assert_eq!(
            args.current_deadline(),
            Timestamp(10_000),
            "garbage ignored"
        );
        args.deadline_file = None;
        assert_eq!(args.current_deadline(), Timestamp(10_000));
        set_deadline(dir.path(), &id, Timestamp(25_000)).unwrap();
        forget(dir.path(), &id);
        assert!(!deadline_path(dir.path(), &id).exists());
    }

    #[test]
    fn a_recorded_pid_counts_only_if_it_is_this_containers_watchdog() {
        let dir = tempfile::tempdir().unwrap();
        let id = LeaseId(gridlease_protocol::Digest::of("t", b"wd"));
        let pids = pid_path(dir.path(), &id);
        assert_eq!(running_watchdog(&pids, "c1"), None, "no pid file");
        // This test process is alive but is not a watchdog.
        std::fs::write(&pids, std::process::id().to_string()).unwrap();
        assert_eq!(running_watchdog(&pids, "c1"), None);
        // A live process whose command line is a watchdog's for c1: a shell waiting on its
        // stdin (`read` is a builtin: no grandchild); the arguments after the script are only
        // its positional parameters.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read x", SUBCOMMAND, "--container", "c1"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::fs::write(&pids, child.id().to_string()).unwrap();
        // Until the child has exec'd, its command line is still this test's (fork, then exec).
        let cmdline = format!("/proc/{}/cmdline", child.id());
        let started = std::time::Instant::now();
        while !std::fs::read(&cmdline).is_ok_and(|c| c.windows(6).any(|w| w == b"read x")) {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "sh never started"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let found = running_watchdog(&pids, "c1");
        let other = running_watchdog(&pids, "c2");
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(found, Some(child.id()));
        assert_eq!(other, None, "another container's watchdog");
        assert_eq!(running_watchdog(&pids, "c1"), None, "exited");
        std::fs::write(&pids, "../../etc").unwrap();
        assert_eq!(running_watchdog(&pids, "c1"), None, "not a pid");
        forget(dir.path(), &id);
        assert!(!pids.exists());
    }
}
