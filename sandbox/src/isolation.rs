//! The container runtime a provider's tenants run under, and the start-up check that it really
//! is what the provider asked for.
//!
//! runc (Docker's default) isolates with namespaces, cgroups and the project's seccomp profile;
//! the tenant's system calls reach the host kernel. gVisor (`runsc`) puts an application kernel
//! between them: the tenant talks to gVisor's Sentry, which reaches the host through a small
//! filtered set of calls. The provider picks one (`isolation` in the node's config); every
//! container of that node is created with it ([`crate::spec::SandboxSpec::runtime`]).
//!
//! [`check_runtime`] runs at the node's start: the runtime must be registered with the daemon
//! and a hardened probe container must start under it and see a kernel other than the host's
//! (for gVisor), so a misregistered runtime (say `runsc` pointing at runc) or a runsc that
//! cannot start containers on this kernel is a clear start-up error, not a silent downgrade or a
//! lease that fails later.

use gridlease_protocol::{Digest, Isolation, LeaseId, Timestamp};

use crate::runtime::{Sandbox, SandboxError};
use crate::spec::SandboxSpec;

/// The Docker runtime name gVisor is registered under by default.
pub const DEFAULT_GVISOR_RUNTIME: &str = "runsc";

/// The `daemon.json` entry that registers Debian's runsc for gridlease (also in
/// `docs/security-model.md`). `--network=host`: the sandbox uses the network namespace Docker
/// made for the container (none, or the egress bridge with its firewall) through the host
/// kernel's stack, because runsc's own stack refuses to start on kernels whose network sysctls
/// are per namespace (runsc 20221219 on Linux 6.x: "cannot run with network enabled in root
/// network namespace"), and because port forwarding enters that namespace. `--oci-seccomp`:
/// the project's seccomp profile also applies inside the sandbox.
pub const GVISOR_DAEMON_JSON: &str = r#"{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host", "--oci-seccomp"]}}}"#;

/// What [`check_runtime`] saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeCheck {
    /// The Docker runtime name (`None`: the daemon's default).
    pub runtime: Option<String>,
    /// The runtime's executable, as the daemon reports it.
    pub path: Option<String>,
    /// Its extra arguments, as the daemon reports them.
    pub args: Vec<String>,
    /// The kernel release a tenant sees (`uname(2)` in the probe).
    pub tenant_kernel: String,
    /// The host's kernel release.
    pub host_kernel: String,
}

/// Why a runtime cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The daemon has no runtime of that name.
    #[error(
        "Docker has no runtime named {name:?} (it has: {registered}); install runsc (Debian: apt-get install runsc), add it to /etc/docker/daemon.json as {GVISOR_DAEMON_JSON} and reload the daemon with `kill -HUP $(pidof dockerd)`"
    )]
    NotRegistered {
        /// The name asked for.
        name: String,
        /// The names the daemon has, comma-separated.
        registered: String,
    },
    /// The probe container did not run under it.
    #[error("a probe container does not run under runtime {name:?}: {message}")]
    ProbeFailed {
        /// The runtime.
        name: String,
        /// What failed.
        message: String,
    },
    /// The runtime runs containers on the host's own kernel, so it is not gVisor.
    #[error(
        "runtime {name:?} is not gVisor: its containers see the host's kernel {kernel} (is it registered with runc's path?)"
    )]
    NotGvisor {
        /// The runtime.
        name: String,
        /// The kernel release the probe saw.
        kernel: String,
    },
    /// A Docker call failed.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

/// The Docker runtime name for `isolation` (`gvisor_runtime` names gVisor's registration).
pub fn runtime_for(isolation: Isolation, gvisor_runtime: &str) -> Option<String> {
    match isolation {
        Isolation::Runc => None,
        Isolation::Gvisor => Some(gvisor_runtime.to_string()),
    }
}

/// The Docker runtime name gVisor is registered under for tests: `GRIDLEASE_TEST_GVISOR_RUNTIME`
/// or [`DEFAULT_GVISOR_RUNTIME`], if the daemon has it. `Err` carries why not, for the test's
/// skip (or, with `GRIDLEASE_REQUIRE_RUNSC=1`, failure) message.
pub async fn test_runtime(sb: &Sandbox) -> Result<String, String> {
    let name = std::env::var("GRIDLEASE_TEST_GVISOR_RUNTIME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| DEFAULT_GVISOR_RUNTIME.to_string());
    let info = sb
        .docker()
        .info()
        .await
        .map_err(|e| format!("docker info failed: {e}"))?;
    if info.runtimes.unwrap_or_default().contains_key(&name) {
        Ok(name)
    } else {
        Err(format!(
            "Docker has no runtime {name:?}; register it: {GVISOR_DAEMON_JSON}"
        ))
    }
}

/// Checks that containers run under `runtime` (`None`: the daemon's default) with the
/// project's hardening, and for [`Isolation::Gvisor`] that they do not see the host's kernel.
/// Runs one probe container (about a second; removed afterwards).
pub async fn check_runtime(
    sb: &Sandbox,
    isolation: Isolation,
    runtime: Option<&str>,
) -> Result<RuntimeCheck, RuntimeError> {
    let info = sb
        .docker()
        .info()
        .await
        .map_err(crate::runtime::docker_err("info", "daemon"))?;
    let runtimes = info.runtimes.unwrap_or_default();
    let (path, args) = match runtime {
        Some(name) => {
            let Some(r) = runtimes.get(name) else {
                let mut names: Vec<&str> = runtimes.keys().map(String::as_str).collect();
                names.sort_unstable();
                return Err(RuntimeError::NotRegistered {
                    name: name.to_string(),
                    registered: names.join(", "),
                });
            };
            (r.path.clone(), r.runtime_args.clone().unwrap_or_default())
        }
        None => (None, Vec::new()),
    };
    // The host's release (the node runs on the host; gVisor's own procfs has no such file).
    let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let tenant_kernel = probe_kernel(sb, isolation, runtime).await?;
    if isolation == Isolation::Gvisor && tenant_kernel == host_kernel {
        return Err(RuntimeError::NotGvisor {
            name: runtime.unwrap_or("default").to_string(),
            kernel: tenant_kernel,
        });
    }
    Ok(RuntimeCheck {
        runtime: runtime.map(str::to_string),
        path,
        args,
        tenant_kernel,
        host_kernel,
    })
}

/// Runs the probe's `kernel` step in a hardened container under `runtime`; returns the
/// release it printed.
async fn probe_kernel(
    sb: &Sandbox,
    isolation: Isolation,
    runtime: Option<&str>,
) -> Result<String, RuntimeError> {
    let name = runtime.unwrap_or("default").to_string();
    let logs = run_probe(sb, &name, &["kernel"], |spec| {
        spec.runtime = runtime.map(str::to_string);
        // The seccomp variant follows the claim; a "gVisor" without a name is refused below.
        if runtime.is_some() {
            spec.isolation = isolation;
        }
    })
    .await?;
    logs.lines()
        .find_map(|l| l.trim().strip_prefix("KERNEL release="))
        .map(str::to_string)
        .ok_or_else(|| RuntimeError::ProbeFailed {
            name,
            message: format!("no kernel release in its output: {}", logs.trim()),
        })
}

/// Runs a hardened probe container given the GPUs `gpu_uuids` (as a lease's: the NVIDIA
/// container toolkit's `--gpus` request) and returns the NVIDIA device nodes it saw
/// (`nvidia0`, `nvidiactl`, ...). Empty: the request was granted without devices. An error:
/// the daemon refused the request or the container failed (no toolkit, a driver mismatch).
/// `gridlease doctor` runs it where the driver lists GPUs; nothing runs it on a machine
/// without one.
pub async fn check_gpu_container(
    sb: &Sandbox,
    gpu_uuids: &[String],
) -> Result<Vec<String>, RuntimeError> {
    let name = "default".to_string();
    let logs = run_probe(sb, &name, &["nvdev"], |spec| {
        spec.gpu_uuids = gpu_uuids.to_vec();
    })
    .await?;
    logs.lines()
        .find_map(|l| l.trim().strip_prefix("NVDEV devices="))
        .map(|d| {
            d.split(',')
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .collect()
        })
        .ok_or_else(|| RuntimeError::ProbeFailed {
            name,
            message: format!("no device list in its output: {}", logs.trim()),
        })
}

/// Runs the probe image with `args` in a small hardened container (`tweak` sets the runtime,
/// GPUs, ...), waits at most 60 s for it to exit 0, removes it, and returns its output.
async fn run_probe(
    sb: &Sandbox,
    name: &str,
    args: &[&str],
    tweak: impl FnOnce(&mut SandboxSpec),
) -> Result<String, RuntimeError> {
    let failed = |message: String| RuntimeError::ProbeFailed {
        name: name.to_string(),
        message,
    };
    let image = sb.ensure_probe_image().await?;
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut spec = SandboxSpec::small_on_host(
        LeaseId(Digest::of(
            "gridlease-runtime-check",
            format!("{}-{nonce}", std::process::id()).as_bytes(),
        )),
        "gridlease-runtime-check",
        &image,
        args,
    );
    spec.expires_at = Timestamp(crate::runtime::now_ms().0.saturating_add(60_000));
    spec.shm_mib = 16;
    tweak(&mut spec);
    let id = sb.create(&spec).await?;
    let result = async {
        sb.start(&id).await.map_err(|e| failed(format!("{e}")))?;
        let exit = tokio::time::timeout(std::time::Duration::from_secs(60), sb.wait(&id))
            .await
            .map_err(|_| failed("it did not exit within 60 s".to_string()))??;
        let logs = sb.logs(&id, false, 64 * 1024).await?;
        if exit.exit_code != 0 {
            return Err(failed(format!(
                "it exited with {}: {}",
                exit.exit_code,
                logs.trim()
            )));
        }
        Ok(logs)
    }
    .await;
    if let Err(e) = sb.remove(&id).await {
        tracing::warn!(container = %id, error = %e, "probe container not removed");
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_is_the_daemon_default_and_gvisor_names_its_registration() {
        assert_eq!(runtime_for(Isolation::Runc, "runsc"), None);
        assert_eq!(
            runtime_for(Isolation::Gvisor, "gridlease-runsc").as_deref(),
            Some("gridlease-runsc")
        );
    }

    #[test]
    fn the_daemon_json_snippet_is_json_with_the_documented_arguments() {
        let v: serde_json::Value = serde_json::from_str(GVISOR_DAEMON_JSON).unwrap();
        let args = &v["runtimes"][DEFAULT_GVISOR_RUNTIME]["runtimeArgs"];
        assert_eq!(args[0], "--network=host");
        assert_eq!(args[1], "--oci-seccomp");
    }
}
