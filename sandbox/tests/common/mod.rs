//! Shared helpers for the Docker-backed tests.
//!
//! Docker unreachable: with `GRIDLEASE_REQUIRE_DOCKER=1` (set by `.ci/run`) the test FAILS with
//! a clear message; otherwise it prints a note and skips. Every test uses unique names (pid +
//! time + counter) and a [`Cleanup`] guard that removes its containers and networks on drop,
//! also when the test panics, so tests can run in parallel processes.
#![allow(dead_code, unreachable_pub, missing_docs)]
// Test support code: a panic is a test failure with a clear location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use gridlease_protocol::{Digest, LeaseId, Timestamp};
use gridlease_sandbox::{ExitInfo, Sandbox, SandboxSpec};

/// Connects, or skips / fails according to `GRIDLEASE_REQUIRE_DOCKER`.
pub async fn sandbox_or_skip(test: &str) -> Option<Sandbox> {
    match Sandbox::connect().await {
        Ok(sb) => Some(sb),
        Err(e) => {
            if std::env::var("GRIDLEASE_REQUIRE_DOCKER").as_deref() == Ok("1") {
                panic!("{test}: GRIDLEASE_REQUIRE_DOCKER=1 but Docker is unreachable: {e}");
            }
            eprintln!(
                "{test}: SKIPPED, Docker is unreachable ({e}); set GRIDLEASE_REQUIRE_DOCKER=1 to make this a failure"
            );
            None
        }
    }
}

/// The Docker runtime gVisor is registered under for tests
/// ([`gridlease_sandbox::isolation::test_runtime`]). `None` (the test skips) when the daemon does
/// not have it, unless `GRIDLEASE_REQUIRE_RUNSC=1` (set by `.ci/run`, which installs and
/// registers runsc): then the test fails.
pub async fn gvisor_or_skip(test: &str) -> Option<&'static str> {
    let sb = sandbox_or_skip(test).await?;
    match gridlease_sandbox::isolation::test_runtime(&sb).await {
        Ok(name) => Some(Box::leak(name.into_boxed_str())),
        Err(why) => {
            if std::env::var("GRIDLEASE_REQUIRE_RUNSC").as_deref() == Ok("1") {
                panic!("{test}: GRIDLEASE_REQUIRE_RUNSC=1 but {why}");
            }
            eprintln!(
                "{test}: SKIPPED under gVisor: {why}; set GRIDLEASE_REQUIRE_RUNSC=1 to make this a failure"
            );
            None
        }
    }
}

/// Returns early from the test when Docker is unreachable and not required.
#[macro_export]
macro_rules! docker_or_skip {
    ($name:expr) => {
        match common::sandbox_or_skip($name).await {
            Some(sb) => sb,
            None => return,
        }
    };
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name unique across parallel test processes.
pub fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{nanos}-{n}", std::process::id())
}

pub fn lease(tag: &str) -> LeaseId {
    LeaseId(Digest::of("gridlease-test-lease", unique(tag).as_bytes()))
}

/// A probe spec with small limits; the caller adjusts fields.
pub fn probe_spec(image: &str, node: &str, args: &[&str]) -> SandboxSpec {
    SandboxSpec::small_on_host(lease("lease"), node, image, args)
}

/// Removes containers, workspaces (volume, loop device, image file), directories, networks and
/// images on drop (panic included), in that order, on its own runtime thread.
#[derive(Default)]
pub struct Cleanup {
    pub containers: Vec<String>,
    /// (workspace directory, lease) pairs made with `Sandbox::create_workspace`.
    pub workspaces: Vec<(std::path::PathBuf, LeaseId)>,
    /// Directories the test made (removed with everything in them, after the workspaces).
    pub dirs: Vec<std::path::PathBuf>,
    pub networks: Vec<String>,
    pub images: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let containers = std::mem::take(&mut self.containers);
        let workspaces = std::mem::take(&mut self.workspaces);
        let dirs = std::mem::take(&mut self.dirs);
        let networks = std::mem::take(&mut self.networks);
        let images = std::mem::take(&mut self.images);
        if containers.is_empty()
            && workspaces.is_empty()
            && dirs.is_empty()
            && networks.is_empty()
            && images.is_empty()
        {
            return;
        }
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(sb) = Sandbox::connect().await {
                    for c in &containers {
                        let _ = sb.remove(c).await;
                    }
                    for (dir, lease) in &workspaces {
                        if let Err(e) = sb.remove_workspace(dir, lease).await {
                            eprintln!("cleanup: workspace {lease} in {}: {e}", dir.display());
                        }
                    }
                    for d in &dirs {
                        let _ = std::fs::remove_dir_all(d);
                    }
                    for n in &networks {
                        let _ = sb.remove_network(n).await;
                    }
                    for i in &images {
                        let _ = sb
                            .docker()
                            .remove_image(
                                i,
                                None::<bollard::query_parameters::RemoveImageOptions>,
                                None,
                            )
                            .await;
                    }
                }
            });
        })
        .join();
    }
}

/// Creates, starts and waits for a probe container; returns (id, exit, logs).
pub async fn run_to_exit(
    sb: &Sandbox,
    spec: &SandboxSpec,
    cleanup: &mut Cleanup,
) -> (String, ExitInfo, String) {
    let id = sb.create(spec).await.unwrap();
    cleanup.containers.push(id.clone());
    sb.start(&id).await.unwrap();
    let exit = sb.wait(&id).await.unwrap();
    let logs = sb.logs(&id, false, 1 << 20).await.unwrap();
    (id, exit, logs)
}

/// The value of `ESCAPE <key>=<value>` in the probe output.
pub fn escape_value(logs: &str, key: &str) -> Option<String> {
    let prefix = format!("ESCAPE {key}=");
    logs.lines()
        .find_map(|l| l.trim().strip_prefix(&prefix).map(|v| v.trim().to_string()))
}

/// The signals sent to container `id` through the Docker API since `since` (unix ms), from the
/// daemon's own event log (one `kill` event per kill call, the signal number as its attribute).
pub async fn kill_signals(sb: &Sandbox, id: &str, since: Timestamp) -> Vec<String> {
    use futures_util::StreamExt;
    let mut filters = std::collections::HashMap::new();
    filters.insert("container", vec![id]);
    filters.insert("event", vec!["kill"]);
    let until = gridlease_sandbox::runtime::now_ms().0 + 1000;
    let opts = bollard::query_parameters::EventsOptionsBuilder::default()
        .since(&format!("{}.{:03}", since.0 / 1000, since.0 % 1000))
        .until(&format!("{}.{:03}", until / 1000, until % 1000))
        .filters(&filters)
        .build();
    let events: Vec<_> = sb.docker().events(Some(opts)).collect().await;
    events
        .into_iter()
        .map(|e| e.unwrap())
        .filter_map(|e| e.actor?.attributes?.get("signal").cloned())
        .collect()
}
