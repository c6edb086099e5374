//! The hardened container spec: a pure function from a [`SandboxSpec`] to the Docker create body.
//!
//! Invariant: every tenant container is created from [`build_create_body`]; nothing else in the
//! crate builds a `HostConfig`. See `docs/security-model.md` for why each setting is there.

use std::collections::{BTreeMap, HashMap};

use bollard::models::{
    ContainerCreateBody, DeviceRequest, HostConfig, HostConfigLogConfig, ImageConfig, Mount,
    MountType, MountVolumeOptions, MountVolumeOptionsDriverConfig, ResourcesUlimits,
};
use gridlease_protocol::{Isolation, LeaseId, NetworkPolicy, Timestamp};

/// Label carrying the lease id (hex).
pub const LABEL_LEASE: &str = "gridlease.lease_id";
/// Label carrying the node id that owns the container.
pub const LABEL_NODE: &str = "gridlease.node";
/// Label carrying the lease expiry, unix milliseconds.
pub const LABEL_EXPIRES: &str = "gridlease.expires_at";
/// The unprivileged user tenants run as (`nobody:nogroup`).
pub const NOBODY: &str = "65534:65534";
/// Where the writable, size-limited scratch tmpfs is mounted.
pub const SCRATCH_PATH: &str = "/tmp";
/// Mount options of the `/tmp` tmpfs (size appended): writable by every user with the sticky
/// bit (mode 1777, like a host's `/tmp`), executables allowed (Triton and `torch.compile` load
/// the kernels they compile from there), no setuid and no device nodes.
///
/// The tmpfs is an anonymous `local` volume of type tmpfs, not `HostConfig.Tmpfs`: for a
/// tmpfs mount runc (1.1, under Docker 20.10) chmods the mount point back to the mode of the
/// image's own directory, whatever `mode=` says (observed: an image with a root 0755 `/tmp`
/// gave the tenant a 0755 `/tmp` it could not write). A volume is bind-mounted, which runc
/// leaves as the daemon mounted it. Its pages are still charged to the memory cgroup of the
/// process that writes them (tested: filling it past the memory limit is an OOM kill), and it
/// goes with the container (`remove` passes `v`).
pub const SCRATCH_OPTIONS: &str = "nosuid,nodev,exec,mode=1777";
/// Where the lease's disk-backed workspace volume is mounted; also `HOME` (unless the renter
/// sets `HOME`) and the working directory. See [`crate::workspace`].
pub const WORKSPACE_PATH: &str = "/workspace";
/// `/dev/shm` gets the lease's memory divided by this by default (half): PyTorch DataLoader
/// workers and NCCL pass tensors through it (Docker's 64 MiB default breaks them). Its pages are
/// charged to the container's memory cgroup like any other memory, so it never adds to the
/// limit.
pub const SHM_DIVISOR: u32 = 2;
/// The tenant's Docker log driver: `local` keeps the output's bytes exactly (`json-file`, a
/// common daemon default, stores JSON strings and replaces invalid UTF-8 with U+FFFD).
pub const LOG_DRIVER: &str = "local";
/// The tenant's Docker log retention: at most this many files (the oldest is dropped) of
/// [`log_file_mib`] each, so the daemon keeps a bounded amount of a tenant's output whatever
/// its own defaults (a stock install keeps everything).
pub const LOG_MAX_FILE: u32 = 3;
/// The smallest log file size, MiB: 3 files keep 20-30 MiB, well above the node's 4 MiB head
/// (see the resume rule in the node's `lease::logs`).
pub const LOG_FILE_MIB_MIN: u32 = 10;
/// The largest log file size, MiB (3 files: at most 300 MiB of a provider's disk).
pub const LOG_FILE_MIB_MAX: u32 = 100;

/// The size of each of a lease's Docker log files, from the lease's disk: 1/512 of its
/// workspace (0.6% for the 3 files), within [`LOG_FILE_MIB_MIN`]..=[`LOG_FILE_MIB_MAX`]. A
/// lease that rents more disk keeps more of its output on the daemon's side; none costs the
/// provider more than 300 MiB.
pub fn log_file_mib(workspace_bytes: u64) -> u32 {
    let mib = workspace_bytes / (1024 * 1024) / 512;
    u32::try_from(mib)
        .unwrap_or(u32::MAX)
        .clamp(LOG_FILE_MIB_MIN, LOG_FILE_MIB_MAX)
}
/// The tenant's `oom_score_adj` (-1000..=1000, higher dies first): positive, so when the host
/// runs out of memory the kernel's OOM killer picks a tenant before the node, dockerd or the
/// provider's own programs (which run at 0). A lease that overruns its own limit is killed by
/// its cgroup's OOM killer regardless.
pub const TENANT_OOM_SCORE_ADJ: i64 = 500;
/// Default open-file limit (`nofile`, soft = hard) of a tenant: generous for data loaders and
/// NCCL, and far below the host's `fs.file-max`, so a tenant cannot exhaust the host's file
/// table (the daemon's own, often 1048576, would otherwise be inherited). Lowered to the
/// node's own hard limit where that is lower ([`crate::host::tenant_nofile`]).
pub const DEFAULT_NOFILE: u32 = 65_536;

/// Everything the sandbox needs to run one lease's container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxSpec {
    /// The lease this container belongs to.
    pub lease_id: LeaseId,
    /// The node that owns the container (its peer id as text).
    pub node_id: String,
    /// When the lease ends; the container is stopped by then.
    pub expires_at: Timestamp,
    /// Image reference.
    pub image: String,
    /// Command (replaces the image's `CMD`; empty keeps it).
    pub command: Vec<String>,
    /// Renter environment; may not touch `LD_PRELOAD` or `NVIDIA_*`.
    pub env: BTreeMap<String, String>,
    /// Leased GPU UUIDs (NVML form, `GPU-…`); empty for CPU-only.
    pub gpu_uuids: Vec<String>,
    /// CPU quota in millicores (1000 = one core).
    pub cpu_millicores: u32,
    /// Memory limit in MiB; swap is disabled (memory == memory+swap).
    pub memory_mib: u32,
    /// Most processes/threads in the container.
    pub pids_limit: u32,
    /// Size of the writable `/tmp` scratch tmpfs in MiB. tmpfs pages are charged to the
    /// container's memory cgroup, so scratch counts against `memory_mib`; the mounted size is
    /// never above `memory_mib` (see [`build_create_body`]).
    pub scratch_mib: u32,
    /// Size of `/dev/shm` in MiB (Docker's `ShmSize`); counts against `memory_mib` like
    /// scratch, and is never mounted larger than it.
    pub shm_mib: u32,
    /// Size of the lease's workspace in bytes: what the tenant can write to `/workspace` (the
    /// lease's disk). The node creates the volume ([`crate::workspace`]) and sets `workspace`.
    pub workspace_bytes: u64,
    /// The Docker volume mounted at [`WORKSPACE_PATH`] (a provider-made name, see
    /// [`crate::workspace::volume_name`]); `None` mounts nothing there (tests and the GPU
    /// benchmark container; the node always sets one for a lease).
    pub workspace: Option<String>,
    /// More named volumes the node created (the renter's kept volumes, issue 47), each with
    /// the path the container sees it at: (volume name, absolute path).
    pub volumes: Vec<(String, String)>,
    /// Open-file limit (`nofile`, soft = hard).
    pub nofile: u32,
    /// Network policy.
    pub network: NetworkPolicy,
    /// Bridge network name for [`NetworkPolicy::Egress`]; ignored for `None`.
    pub egress_network: String,
    /// Run as root inside the container (still no capabilities, no-new-privileges). Off by
    /// default; some images need it to write to their own paths. Providers may refuse it.
    pub run_as_root: bool,
    /// Size of each Docker log file, MiB ([`LOG_MAX_FILE`] of them; [`log_file_mib`] of the
    /// lease's disk).
    pub log_file_mib: u32,
    /// The Docker runtime to run under (`HostConfig.Runtime`, a name registered in the
    /// daemon's `runtimes`, e.g. `runsc` for gVisor); `None` is the daemon's default (runc).
    pub runtime: Option<String>,
    /// What that runtime is (it picks the seccomp profile's variant,
    /// [`crate::seccomp::profile_for`]); [`Isolation::Gvisor`] needs a `runtime` name.
    pub isolation: Isolation,
}

/// Provider-side limits that are not part of the lease terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderLimits {
    /// Most processes/threads per container.
    pub pids_limit: u32,
    /// Largest `/tmp` scratch in MiB (tmpfs pages count against the memory limit anyway).
    pub max_scratch_mib: u32,
    /// Name of the egress bridge (see `Sandbox::ensure_egress_network`).
    pub egress_network: String,
    /// Open-file limit per container (default [`DEFAULT_NOFILE`]; a node runs with
    /// [`ProviderLimits::from_host`]'s, lowered to its own hard limit: `crate::host::tenant_nofile`).
    pub nofile: u32,
    /// The Docker runtime tenants run under (see [`SandboxSpec::runtime`]); `None`: runc.
    pub runtime: Option<String>,
    /// What that runtime is ([`SandboxSpec::isolation`]).
    pub isolation: Isolation,
}

impl Default for ProviderLimits {
    fn default() -> Self {
        Self {
            pids_limit: 1024,
            max_scratch_mib: 16 * 1024,
            egress_network: "gridlease-egress".to_string(),
            nofile: DEFAULT_NOFILE,
            runtime: None,
            isolation: Isolation::Runc,
        }
    }
}

impl SandboxSpec {
    /// A small hardened spec for a container that is no lease's (the runtime check at start-up,
    /// benchmarks, tests): 1 CPU, 128 MiB, 64 processes, 16 MiB `/tmp`, 64 MiB `/dev/shm`, no
    /// workspace, no network, no deadline, under the daemon's default runtime, [`DEFAULT_NOFILE`]
    /// open files (no I/O here: a container started on this host takes
    /// [`SandboxSpec::small_on_host`], whose limit is lowered to the node's own). Callers adjust
    /// fields.
    pub fn small(lease_id: LeaseId, node_id: &str, image: &str, command: &[&str]) -> Self {
        Self {
            lease_id,
            node_id: node_id.to_string(),
            expires_at: Timestamp(u64::MAX / 2),
            image: image.to_string(),
            command: command.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::new(),
            gpu_uuids: Vec::new(),
            cpu_millicores: 1000,
            memory_mib: 128,
            pids_limit: 64,
            scratch_mib: 16,
            shm_mib: 64,
            workspace_bytes: 0,
            workspace: None,
            volumes: Vec::new(),
            nofile: DEFAULT_NOFILE,
            network: NetworkPolicy::None,
            egress_network: String::new(),
            run_as_root: false,
            log_file_mib: LOG_FILE_MIB_MIN,
            runtime: None,
            isolation: Isolation::Runc,
        }
    }

    /// The spec for an accepted lease: resources are `per_gpu x gpu_count` (at least one
    /// unit for CPU-only leases). The lease's disk is its workspace (`workspace_bytes`; the
    /// volume itself is created by the node, see [`crate::workspace`]); `/tmp` may take up to
    /// the lease's memory (capped by the provider's maximum) and `/dev/shm` up to
    /// `memory / SHM_DIVISOR`: both are tmpfs, whose pages count against the memory limit.
    pub fn from_terms(
        lease_id: LeaseId,
        terms: &gridlease_protocol::LeaseTerms,
        node_id: &str,
        expires_at: Timestamp,
        gpu_uuids: Vec<String>,
        limits: &ProviderLimits,
    ) -> Self {
        let units = u32::from(terms.gpu_count.max(1));
        let memory_mib = terms.per_gpu.ram_mib.saturating_mul(units);
        let scratch_mib = memory_mib.min(limits.max_scratch_mib).max(1);
        let shm_mib = (memory_mib / SHM_DIVISOR).max(1);
        let workspace_bytes = terms.workspace_bytes();
        Self {
            lease_id,
            node_id: node_id.to_string(),
            expires_at,
            image: terms.image.clone(),
            command: terms.command.clone(),
            env: terms.env.clone(),
            gpu_uuids,
            cpu_millicores: terms.per_gpu.cpu_millicores.saturating_mul(units),
            memory_mib,
            pids_limit: limits.pids_limit,
            scratch_mib,
            shm_mib,
            workspace_bytes,
            workspace: None,
            volumes: Vec::new(),
            nofile: limits.nofile,
            network: terms.network_policy,
            egress_network: limits.egress_network.clone(),
            run_as_root: false,
            log_file_mib: log_file_mib(workspace_bytes),
            runtime: limits.runtime.clone(),
            isolation: limits.isolation,
        }
    }
}

/// Why a spec or image was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// The renter tried to set a variable that controls GPU or loader behaviour.
    #[error("environment variable {name} may not be set by the renter")]
    ForbiddenEnv {
        /// The variable.
        name: String,
    },
    /// A variable name is empty or contains `=` or NUL.
    #[error("invalid environment variable name {name:?}")]
    BadEnvName {
        /// The variable.
        name: String,
    },
    /// The image's own config sets `LD_PRELOAD` (CVE-2024-0132 / CVE-2025-23266 pattern).
    #[error("image {image} sets LD_PRELOAD in its config; refused")]
    ImagePreload {
        /// The image.
        image: String,
    },
    /// A limit is zero or too large for Docker.
    #[error("limit {field} = {value} is out of range")]
    BadLimit {
        /// Which limit.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// A GPU UUID does not look like an NVML UUID.
    #[error("gpu uuid {uuid:?} is not of the form GPU-<hex and dashes>")]
    BadGpuUuid {
        /// The UUID.
        uuid: String,
    },
    /// Egress requested without a network name.
    #[error("network policy egress needs a bridge network name")]
    NoEgressNetwork,
    /// The runtime name is empty or not a plain name.
    #[error("runtime name {name:?} is not a plain name")]
    BadRuntime {
        /// The name.
        name: String,
    },
    /// The workspace volume name is empty or not a plain Docker volume name.
    #[error("workspace volume name {name:?} is not a plain volume name")]
    BadWorkspace {
        /// The name.
        name: String,
    },
}

/// A plain Docker object name (`[A-Za-z0-9][A-Za-z0-9_.-]*`), as volume and runtime names must
/// be: never a path, so a mount can only be a named volume, never a host directory.
pub fn valid_docker_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// True for names the renter may not set ([`gridlease_contracts::terms::is_forbidden_env`],
/// the same rule the provider applies at negotiation).
pub fn is_forbidden_env(name: &str) -> bool {
    gridlease_contracts::terms::is_forbidden_env(name)
}

/// Checks the renter environment.
pub fn validate_env(env: &BTreeMap<String, String>) -> Result<(), SpecError> {
    for name in env.keys() {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(SpecError::BadEnvName { name: name.clone() });
        }
        if is_forbidden_env(name) {
            return Err(SpecError::ForbiddenEnv { name: name.clone() });
        }
    }
    Ok(())
}

/// Refuses images whose config sets `LD_PRELOAD` (or `LD_AUDIT`) in their environment.
pub fn check_image_config(image: &str, config: Option<&ImageConfig>) -> Result<(), SpecError> {
    let env = config.and_then(|c| c.env.as_ref());
    for kv in env.into_iter().flatten() {
        let name = kv
            .split('=')
            .next()
            .unwrap_or_default()
            .to_ascii_uppercase();
        if name == "LD_PRELOAD" || name == "LD_AUDIT" {
            return Err(SpecError::ImagePreload {
                image: image.to_string(),
            });
        }
    }
    Ok(())
}

fn valid_gpu_uuid(uuid: &str) -> bool {
    let Some(rest) = uuid
        .strip_prefix("GPU-")
        .or_else(|| uuid.strip_prefix("MIG-"))
    else {
        return false;
    };
    !rest.is_empty() && rest.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// The value forced into `NVIDIA_VISIBLE_DEVICES`: the leased UUIDs, or `void` for none, so the
/// image's own value can never widen access.
pub fn visible_devices(gpu_uuids: &[String]) -> String {
    if gpu_uuids.is_empty() {
        "void".to_string()
    } else {
        gpu_uuids.join(",")
    }
}

/// The container name for a lease (unique per lease and node).
pub fn container_name(spec: &SandboxSpec) -> String {
    container_name_of(&spec.lease_id)
}

/// The container name of lease `lease_id` (`gridlease-<lease id>`).
pub fn container_name_of(lease_id: &LeaseId) -> String {
    format!("gridlease-{lease_id}")
}

/// Builds the hardened create body. Pure: no Docker call, no clock.
pub fn build_create_body(spec: &SandboxSpec) -> Result<ContainerCreateBody, SpecError> {
    validate_env(&spec.env)?;
    for uuid in &spec.gpu_uuids {
        if !valid_gpu_uuid(uuid) {
            return Err(SpecError::BadGpuUuid { uuid: uuid.clone() });
        }
    }
    if spec.cpu_millicores == 0 {
        return Err(SpecError::BadLimit {
            field: "cpu_millicores",
            value: 0,
        });
    }
    if spec.memory_mib < 8 {
        return Err(SpecError::BadLimit {
            field: "memory_mib",
            value: u64::from(spec.memory_mib),
        });
    }
    if spec.pids_limit == 0 {
        return Err(SpecError::BadLimit {
            field: "pids_limit",
            value: 0,
        });
    }
    if spec.scratch_mib == 0 {
        return Err(SpecError::BadLimit {
            field: "scratch_mib",
            value: 0,
        });
    }
    if spec.nofile == 0 {
        return Err(SpecError::BadLimit {
            field: "nofile",
            value: 0,
        });
    }
    if spec.shm_mib == 0 {
        return Err(SpecError::BadLimit {
            field: "shm_mib",
            value: 0,
        });
    }
    if let Some(name) = &spec.workspace
        && !valid_docker_name(name)
    {
        return Err(SpecError::BadWorkspace { name: name.clone() });
    }
    if let Some(name) = &spec.runtime
        && !valid_docker_name(name)
    {
        return Err(SpecError::BadRuntime { name: name.clone() });
    }
    if spec.isolation == Isolation::Gvisor && spec.runtime.is_none() {
        return Err(SpecError::BadRuntime {
            name: String::new(),
        });
    }

    let memory_bytes = i64::from(spec.memory_mib) * 1024 * 1024;
    let nano_cpus = i64::from(spec.cpu_millicores) * 1_000_000;

    let mut env: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    // Forced last so they win over anything else (Docker applies create-time env over image env).
    env.push(format!(
        "NVIDIA_VISIBLE_DEVICES={}",
        visible_devices(&spec.gpu_uuids)
    ));
    if !spec.gpu_uuids.is_empty() {
        env.push("NVIDIA_DRIVER_CAPABILITIES=compute,utility".to_string());
    }
    // HOME is the workspace (an image's own HOME, often `/root`, is on the read-only rootfs),
    // unless the renter chose one: it steers only their own programs.
    if spec.workspace.is_some() && !spec.env.contains_key("HOME") {
        env.push(format!("HOME={WORKSPACE_PATH}"));
    }

    let device_requests = if spec.gpu_uuids.is_empty() {
        None
    } else {
        Some(vec![DeviceRequest {
            driver: Some("nvidia".to_string()),
            count: None,
            device_ids: Some(spec.gpu_uuids.clone()),
            capabilities: Some(vec![vec!["gpu".to_string()]]),
            options: None,
        }])
    };

    let network_mode = match spec.network {
        NetworkPolicy::None => "none".to_string(),
        NetworkPolicy::Egress => {
            if spec.egress_network.is_empty() || spec.egress_network == "host" {
                return Err(SpecError::NoEgressNetwork);
            }
            spec.egress_network.clone()
        }
    };

    // tmpfs pages are charged to the container's memory cgroup (memory == memory+swap, so
    // they cannot be swapped out either): a full /tmp or /dev/shm leaves that much less for
    // processes, and neither mount is larger than the whole limit.
    let scratch_mib = spec.scratch_mib.min(spec.memory_mib);
    let shm_bytes = i64::from(spec.shm_mib.min(spec.memory_mib)) * 1024 * 1024;
    // /tmp: see SCRATCH_OPTIONS for why a volume. `no_copy` everywhere: an image's own
    // content at a mount point is hidden, not copied in (a copy would take the tenant's quota
    // and hand the volume's root to the image's owner).
    let mut mounts = vec![Mount {
        target: Some(SCRATCH_PATH.to_string()),
        source: None,
        typ: Some(MountType::VOLUME),
        read_only: Some(false),
        volume_options: Some(MountVolumeOptions {
            no_copy: Some(true),
            driver_config: Some(MountVolumeOptionsDriverConfig {
                name: Some("local".to_string()),
                options: Some(HashMap::from([
                    ("type".to_string(), "tmpfs".to_string()),
                    ("device".to_string(), "tmpfs".to_string()),
                    (
                        "o".to_string(),
                        format!("{SCRATCH_OPTIONS},size={scratch_mib}m"),
                    ),
                ])),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }];
    // The workspace: a named volume the node created (an ext4 image on a loop device, see
    // crate::workspace), never a host path.
    // The renter's kept volumes (issue 47) the same way, at their paths.
    let named = |volume: &String, target: &str| Mount {
        target: Some(target.to_string()),
        source: Some(volume.clone()),
        typ: Some(MountType::VOLUME),
        read_only: Some(false),
        volume_options: Some(MountVolumeOptions {
            no_copy: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    if let Some(volume) = &spec.workspace {
        mounts.push(named(volume, WORKSPACE_PATH));
    }
    for (volume, path) in &spec.volumes {
        mounts.push(named(volume, path));
    }

    let host_config = HostConfig {
        privileged: Some(false),
        cap_drop: Some(vec!["ALL".to_string()]),
        cap_add: None,
        // The project's own seccomp profile, inline (crate::seccomp), whatever the daemon's
        // default is.
        security_opt: Some(vec![
            "no-new-privileges:true".to_string(),
            crate::seccomp::security_opt_for(spec.isolation),
        ]),
        readonly_rootfs: Some(true),
        tmpfs: None,
        shm_size: Some(shm_bytes),
        pids_limit: Some(i64::from(spec.pids_limit)),
        memory: Some(memory_bytes),
        memory_swap: Some(memory_bytes),
        nano_cpus: Some(nano_cpus),
        init: Some(true),
        network_mode: Some(network_mode),
        // Host namespaces: explicitly private.
        ipc_mode: Some("private".to_string()),
        pid_mode: Some(String::new()),
        uts_mode: Some(String::new()),
        userns_mode: Some(String::new()),
        // No host paths of any kind, ever (so never the Docker socket): the only mounts are
        // the lease's own volumes, /tmp and the workspace.
        binds: None,
        mounts: Some(mounts),
        volumes_from: None,
        devices: None,
        device_cgroup_rules: None,
        device_requests,
        publish_all_ports: Some(false),
        port_bindings: None,
        auto_remove: Some(false),
        oom_kill_disable: Some(false),
        oom_score_adj: Some(TENANT_OOM_SCORE_ADJ),
        runtime: spec.runtime.clone(),
        ulimits: Some(vec![ResourcesUlimits {
            name: Some("nofile".to_string()),
            soft: Some(i64::from(spec.nofile)),
            hard: Some(i64::from(spec.nofile)),
        }]),
        log_config: Some(HostConfigLogConfig {
            typ: Some(LOG_DRIVER.to_string()),
            config: Some(HashMap::from([
                (
                    "max-size".to_string(),
                    format!("{}m", spec.log_file_mib.clamp(1, LOG_FILE_MIB_MAX)),
                ),
                ("max-file".to_string(), LOG_MAX_FILE.to_string()),
            ])),
        }),
        ..Default::default()
    };

    let mut labels = HashMap::new();
    labels.insert(LABEL_LEASE.to_string(), spec.lease_id.to_string());
    labels.insert(LABEL_NODE.to_string(), spec.node_id.clone());
    labels.insert(LABEL_EXPIRES.to_string(), spec.expires_at.0.to_string());

    Ok(ContainerCreateBody {
        image: Some(spec.image.clone()),
        cmd: if spec.command.is_empty() {
            None
        } else {
            Some(spec.command.clone())
        },
        env: Some(env),
        working_dir: spec.workspace.as_ref().map(|_| WORKSPACE_PATH.to_string()),
        user: Some(if spec.run_as_root {
            "0:0".to_string()
        } else {
            NOBODY.to_string()
        }),
        labels: Some(labels),
        network_disabled: Some(spec.network == NetworkPolicy::None),
        attach_stdin: Some(false),
        open_stdin: Some(false),
        tty: Some(false),
        host_config: Some(host_config),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::Digest;

    fn spec() -> SandboxSpec {
        SandboxSpec {
            lease_id: LeaseId(Digest::of("test", b"lease")),
            node_id: "node-1".into(),
            volumes: Vec::new(),
            expires_at: Timestamp(1_700_000_000_000),
            image: "gridlease-probe:0.1.0".into(),
            command: vec!["sleep".into(), "1".into()],
            env: BTreeMap::from([("HELLO".to_string(), "world".to_string())]),
            gpu_uuids: vec![
                "GPU-11111111-2222-3333-4444-555555555555".into(),
                "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
            ],
            cpu_millicores: 1500,
            memory_mib: 256,
            pids_limit: 64,
            scratch_mib: 32,
            shm_mib: 128,
            workspace_bytes: 2 << 30,
            workspace: Some("gridlease-ws-test".into()),
            nofile: 4096,
            network: NetworkPolicy::None,
            egress_network: String::new(),
            run_as_root: false,
            log_file_mib: 10,
            runtime: None,
            isolation: Isolation::Runc,
        }
    }

    /// The anonymous tmpfs volume at /tmp with mount options `o`.
    fn tmp_mount(o: &str) -> Mount {
        Mount {
            target: Some("/tmp".into()),
            source: None,
            typ: Some(MountType::VOLUME),
            read_only: Some(false),
            volume_options: Some(MountVolumeOptions {
                no_copy: Some(true),
                driver_config: Some(MountVolumeOptionsDriverConfig {
                    name: Some("local".into()),
                    options: Some(HashMap::from([
                        ("type".to_string(), "tmpfs".to_string()),
                        ("device".to_string(), "tmpfs".to_string()),
                        ("o".to_string(), o.to_string()),
                    ])),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn gpu_device_request_is_exactly_the_leased_uuids() {
        let body = build_create_body(&spec()).unwrap();
        let hc = body.host_config.unwrap();
        let reqs = hc.device_requests.unwrap();
        assert_eq!(reqs.len(), 1);
        let r = &reqs[0];
        assert_eq!(r.driver.as_deref(), Some("nvidia"));
        assert_eq!(r.count, None, "count would grant GPUs beyond the UUID list");
        assert_eq!(
            r.device_ids.as_deref(),
            Some(
                &[
                    "GPU-11111111-2222-3333-4444-555555555555".to_string(),
                    "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".to_string()
                ][..]
            )
        );
        assert_eq!(r.capabilities, Some(vec![vec!["gpu".to_string()]]));
        assert!(r.options.is_none());
        assert!(hc.runtime.is_none(), "no nvidia runtime shortcut");
        assert!(hc.devices.is_none());
        let env = body.env.unwrap();
        let vis: Vec<_> = env
            .iter()
            .filter(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES="))
            .collect();
        assert_eq!(
            vis,
            vec![
                "NVIDIA_VISIBLE_DEVICES=GPU-11111111-2222-3333-4444-555555555555,GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
            ]
        );
    }

    #[test]
    fn no_gpus_means_no_device_request_and_void_visible_devices() {
        let mut s = spec();
        s.gpu_uuids.clear();
        let body = build_create_body(&s).unwrap();
        assert!(body.host_config.unwrap().device_requests.is_none());
        assert!(
            body.env
                .unwrap()
                .contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string())
        );
    }

    #[test]
    fn hardening_settings_are_all_present() {
        let body = build_create_body(&spec()).unwrap();
        assert_eq!(body.user.as_deref(), Some(NOBODY));
        let hc = body.host_config.unwrap();
        assert_eq!(hc.privileged, Some(false));
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert!(hc.cap_add.is_none());
        assert_eq!(
            hc.security_opt,
            Some(vec![
                "no-new-privileges:true".to_string(),
                crate::seccomp::security_opt()
            ])
        );
        assert_eq!(hc.readonly_rootfs, Some(true));
        assert!(
            hc.tmpfs.is_none(),
            "/tmp is a tmpfs volume (see SCRATCH_OPTIONS)"
        );
        assert_eq!(hc.shm_size, Some(128 * 1024 * 1024));
        assert_eq!(hc.oom_score_adj, Some(500));
        assert_eq!(
            hc.ulimits,
            Some(vec![ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(4096),
                hard: Some(4096)
            }])
        );
        assert_eq!(hc.pids_limit, Some(64));
        assert_eq!(hc.memory, Some(256 * 1024 * 1024));
        assert_eq!(hc.memory_swap, hc.memory);
        assert_eq!(hc.nano_cpus, Some(1_500_000_000));
        assert_eq!(hc.init, Some(true));
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert!(hc.binds.is_none() && hc.volumes_from.is_none());
        assert_eq!(
            hc.mounts,
            Some(vec![
                tmp_mount("nosuid,nodev,exec,mode=1777,size=32m"),
                Mount {
                    target: Some("/workspace".into()),
                    source: Some("gridlease-ws-test".into()),
                    typ: Some(MountType::VOLUME),
                    read_only: Some(false),
                    volume_options: Some(MountVolumeOptions {
                        no_copy: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            ]),
            "/tmp (an anonymous tmpfs volume: writable by the tenant, executables allowed, no \
             setuid or devices) and the lease's named workspace volume, nothing else"
        );
        assert_ne!(hc.pid_mode.as_deref(), Some("host"));
        assert_ne!(hc.ipc_mode.as_deref(), Some("host"));
        assert_ne!(hc.uts_mode.as_deref(), Some("host"));
        assert_ne!(hc.userns_mode.as_deref(), Some("host"));
        let log = hc.log_config.unwrap();
        assert_eq!(log.typ.as_deref(), Some("local"), "a byte-exact log driver");
        let log = log.config.unwrap();
        assert_eq!(
            (log["max-size"].as_str(), log["max-file"].as_str()),
            ("10m", "3")
        );
        assert_eq!(
            hc.runtime, None,
            "the daemon's default runtime unless one is set"
        );
        assert_eq!(body.working_dir.as_deref(), Some("/workspace"));
        assert!(body.env.unwrap().contains(&"HOME=/workspace".to_string()));
        let labels = body.labels.unwrap();
        assert_eq!(labels[LABEL_NODE], "node-1");
        assert_eq!(labels[LABEL_EXPIRES], "1700000000000");
        assert_eq!(labels[LABEL_LEASE].len(), 64);
    }

    #[test]
    fn renter_env_cannot_touch_preload_or_nvidia() {
        for bad in [
            "LD_PRELOAD",
            "ld_preload",
            "NVIDIA_VISIBLE_DEVICES",
            "NVIDIA_DRIVER_CAPABILITIES",
            "LD_LIBRARY_PATH",
        ] {
            let mut s = spec();
            s.env.insert(bad.to_string(), "x".into());
            assert_eq!(
                build_create_body(&s),
                Err(SpecError::ForbiddenEnv { name: bad.into() })
            );
        }
    }

    #[test]
    fn images_with_ld_preload_are_refused() {
        let cfg = ImageConfig {
            env: Some(vec!["PATH=/bin".into(), "LD_PRELOAD=/evil.so".into()]),
            ..Default::default()
        };
        assert!(matches!(
            check_image_config("evil:1", Some(&cfg)),
            Err(SpecError::ImagePreload { .. })
        ));
        let ok = ImageConfig {
            env: Some(vec!["PATH=/bin".into()]),
            ..Default::default()
        };
        assert!(check_image_config("ok:1", Some(&ok)).is_ok());
        assert!(check_image_config("ok:1", None).is_ok());
    }

    #[test]
    fn egress_uses_the_named_bridge_and_needs_one() {
        let mut s = spec();
        s.network = NetworkPolicy::Egress;
        assert_eq!(build_create_body(&s), Err(SpecError::NoEgressNetwork));
        s.egress_network = "gridlease-egress".into();
        let hc = build_create_body(&s).unwrap().host_config.unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("gridlease-egress"));
        s.egress_network = "host".into();
        assert_eq!(build_create_body(&s), Err(SpecError::NoEgressNetwork));
    }

    #[test]
    fn from_terms_scales_per_gpu_resources() {
        use gridlease_protocol::{NodeKey, OfferId, fixtures};
        let provider = NodeKey::from_secret([1; 32]).public();
        let renter = NodeKey::from_secret([2; 32]).public();
        let offer = fixtures::offer(provider, 1, 2, 400_000);
        let terms = fixtures::terms(OfferId(Digest::of("t", b"o")), &offer, renter, 2, 3600);
        let limits = ProviderLimits::default();
        let s = SandboxSpec::from_terms(
            LeaseId(Digest::of("t", b"x")),
            &terms,
            "node",
            Timestamp(9),
            vec![],
            &limits,
        );
        let units = u32::from(terms.gpu_count.max(1));
        assert_eq!(s.cpu_millicores, terms.per_gpu.cpu_millicores * units);
        assert_eq!(s.memory_mib, terms.per_gpu.ram_mib * units);
        assert!(s.scratch_mib <= s.memory_mib);
        assert_eq!(
            s.shm_mib,
            s.memory_mib / 2,
            "/dev/shm is half the lease's memory"
        );
        assert_eq!(
            s.workspace_bytes,
            (u64::from(terms.per_gpu.disk_gib) * u64::from(units)) << 30,
            "the workspace is the lease's disk"
        );
        assert_eq!(s.workspace, None, "the node creates the volume");
        assert_eq!(s.image, terms.image);
        assert_eq!(s.network, terms.network_policy);
        assert_eq!(s.pids_limit, limits.pids_limit);
        assert_eq!(s.nofile, limits.nofile);
    }

    #[test]
    fn scratch_is_never_larger_than_the_memory_limit() {
        let mut s = spec();
        s.memory_mib = 128;
        s.scratch_mib = 16 * 1024;
        let hc = build_create_body(&s).unwrap().host_config.unwrap();
        assert_eq!(
            hc.mounts.unwrap()[0],
            tmp_mount("nosuid,nodev,exec,mode=1777,size=128m")
        );
        assert_eq!(hc.memory, Some(128 * 1024 * 1024));
    }

    #[test]
    fn shm_is_never_larger_than_the_memory_limit() {
        let mut s = spec();
        s.memory_mib = 128;
        s.shm_mib = 1024;
        let hc = build_create_body(&s).unwrap().host_config.unwrap();
        assert_eq!(hc.shm_size, Some(128 * 1024 * 1024));
        s.shm_mib = 0;
        assert_eq!(
            build_create_body(&s),
            Err(SpecError::BadLimit {
                field: "shm_mib",
                value: 0
            })
        );
    }

    #[test]
    fn the_renter_may_choose_home_and_no_workspace_means_no_mount() {
        let mut s = spec();
        s.env.insert("HOME".into(), "/workspace/me".into());
        let env = build_create_body(&s).unwrap().env.unwrap();
        let homes: Vec<_> = env.iter().filter(|e| e.starts_with("HOME=")).collect();
        assert_eq!(homes, vec!["HOME=/workspace/me"]);

        let mut s = spec();
        s.workspace = None;
        let body = build_create_body(&s).unwrap();
        assert!(body.working_dir.is_none());
        assert!(!body.env.unwrap().iter().any(|e| e.starts_with("HOME=")));
        let hc = body.host_config.unwrap();
        assert_eq!(
            hc.mounts,
            Some(vec![tmp_mount("nosuid,nodev,exec,mode=1777,size=32m")])
        );
        assert!(hc.binds.is_none());
    }

    #[test]
    fn the_workspace_is_a_plain_volume_name_never_a_path() {
        for bad in [
            "",
            "/",
            "/var/run/docker.sock",
            "../etc",
            "a/b",
            ".hidden",
            "-x",
            "a b",
        ] {
            let mut s = spec();
            s.workspace = Some(bad.into());
            assert_eq!(
                build_create_body(&s),
                Err(SpecError::BadWorkspace { name: bad.into() }),
                "{bad:?}"
            );
        }
        let mut s = spec();
        s.workspace = Some(crate::workspace::volume_name(&s.lease_id));
        assert!(build_create_body(&s).is_ok());
    }

    #[test]
    fn bad_uuid_and_zero_limits_are_refused() {
        let mut s = spec();
        s.gpu_uuids = vec!["all".into()];
        assert!(matches!(
            build_create_body(&s),
            Err(SpecError::BadGpuUuid { .. })
        ));
        let mut s = spec();
        s.pids_limit = 0;
        assert!(matches!(
            build_create_body(&s),
            Err(SpecError::BadLimit { .. })
        ));
        let mut s = spec();
        s.nofile = 0;
        assert_eq!(
            build_create_body(&s),
            Err(SpecError::BadLimit {
                field: "nofile",
                value: 0
            })
        );
    }

    #[test]
    fn log_retention_follows_the_lease_disk_within_bounds() {
        assert_eq!(log_file_mib(0), LOG_FILE_MIB_MIN);
        assert_eq!(log_file_mib(1 << 30), LOG_FILE_MIB_MIN, "1 GiB: the floor");
        assert_eq!(log_file_mib(20 << 30), 40, "20 GiB: 1/512");
        assert_eq!(
            log_file_mib(50 << 30),
            LOG_FILE_MIB_MAX,
            "50 GiB: 100 MiB files"
        );
        assert_eq!(log_file_mib(u64::MAX), LOG_FILE_MIB_MAX);
        use gridlease_protocol::{NodeKey, OfferId, fixtures};
        let offer = fixtures::offer(NodeKey::from_secret([1; 32]).public(), 1, 1, 400_000);
        let renter = NodeKey::from_secret([2; 32]).public();
        let terms = fixtures::terms(OfferId(Digest::of("t", b"o")), &offer, renter, 1, 600);
        let limits = ProviderLimits {
            runtime: Some("runsc".into()),
            isolation: Isolation::Gvisor,
            ..Default::default()
        };
        let s = SandboxSpec::from_terms(
            LeaseId(Digest::of("test", b"lease")),
            &terms,
            "node",
            Timestamp(1),
            vec![],
            &limits,
        );
        assert_eq!(s.log_file_mib, log_file_mib(s.workspace_bytes));
        assert_eq!(
            s.runtime.as_deref(),
            Some("runsc"),
            "the provider's runtime"
        );
        assert_eq!(s.isolation, Isolation::Gvisor);
        let mut big = spec();
        big.log_file_mib = 40;
        let hc = build_create_body(&big).unwrap().host_config.unwrap();
        assert_eq!(hc.log_config.unwrap().config.unwrap()["max-size"], "40m");
    }

    #[test]
    fn the_runtime_is_passed_through_and_must_be_a_plain_name() {
        let mut s = spec();
        s.runtime = Some("runsc".into());
        s.isolation = Isolation::Gvisor;
        let hc = build_create_body(&s).unwrap().host_config.unwrap();
        assert_eq!(hc.runtime.as_deref(), Some("runsc"));
        assert_eq!(
            hc.security_opt.unwrap()[1],
            crate::seccomp::security_opt_for(Isolation::Gvisor),
            "gVisor's variant of the profile"
        );
        s.runtime = None;
        assert!(
            build_create_body(&s).is_err(),
            "gVisor without a runtime name"
        );
        for bad in ["", "/usr/bin/runsc", "run sc", "-x"] {
            s.runtime = Some(bad.into());
            assert_eq!(
                build_create_body(&s).unwrap_err(),
                SpecError::BadRuntime { name: bad.into() }
            );
        }
    }
}
