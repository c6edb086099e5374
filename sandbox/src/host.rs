//! What the provider's host has to give tenants: RAM, CPUs and disk, measured from the kernel
//! and, when it answers, the Docker daemon that runs the containers.
//!
//! This module only measures. The rule that turns the facts into what an offer promises per
//! GPU is `gridlease_contracts::capacity::per_gpu_resources` (pure, host facts as parameters).
//!
//! Each fact is the smaller of the two views when both exist, so a node that sees more than
//! the daemon (or the other way round) never promises the larger one:
//! - RAM: `MemTotal` of `/proc/meminfo`, and the daemon's `MemTotal` (`docker info`);
//! - CPUs: [`std::thread::available_parallelism`] (affinity and cgroup quota of this process),
//!   and the daemon's `NCPU`;
//! - disk: `statvfs` of the daemon's `DockerRootDir` (images, container layers, logs), of the
//!   node's data directory (lease logs) and of its workspace directory (the leases' disk, see
//!   [`crate::workspace`]); the filesystem with less space available wins, and what it offers is
//!   the total of workspace quotas whose images fit in that space
//!   ([`crate::workspace::quota_within`]: ext4's own structures come out of it).

use std::path::{Path, PathBuf};

use gridlease_contracts::capacity::HostFacts;
use gridlease_protocol::LeaseId;

use crate::runtime::Sandbox;
use crate::spec::{ProviderLimits, SandboxSpec};

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// A host fact could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `/proc/meminfo` has no usable `MemTotal` line.
    #[error("{path} has no MemTotal line in kB")]
    NoMemTotal {
        /// The file.
        path: PathBuf,
    },
    /// No filesystem for container data could be measured.
    #[error("cannot measure free disk at {path}: {source}")]
    Disk {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Size and available space of one filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskSpace {
    /// Size, bytes.
    pub total_bytes: u64,
    /// Available to unprivileged users (`f_bavail`), bytes.
    pub free_bytes: u64,
}

/// What the Docker daemon reports about its host (`GET /info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonHost {
    /// CPUs the daemon sees.
    pub ncpu: Option<u64>,
    /// Its host's RAM, bytes.
    pub mem_total_bytes: Option<u64>,
    /// Where it keeps images, layers and logs.
    pub root_dir: Option<PathBuf>,
}

/// Where each fact came from, for the log line that explains an offer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostReading {
    /// The facts.
    pub facts: HostFacts,
    /// The daemon's view, if it answered.
    pub daemon: Option<DaemonHost>,
    /// The directory whose filesystem gave the disk figures.
    pub disk_path: PathBuf,
}

/// `MemTotal` in MiB from the text of `/proc/meminfo` (`MemTotal:   24684084 kB`).
pub fn parse_mem_total_mib(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix("MemTotal:")?;
        let mut words = rest.split_whitespace();
        let kb: u64 = words.next()?.parse().ok()?;
        (words.next() == Some("kB")).then_some(kb / 1024)
    })
}

/// The kernel's total RAM, MiB.
pub fn mem_total_mib() -> Result<u64, HostError> {
    let path = PathBuf::from("/proc/meminfo");
    let text = std::fs::read_to_string(&path).map_err(|source| HostError::Read {
        path: path.clone(),
        source,
    })?;
    parse_mem_total_mib(&text).ok_or(HostError::NoMemTotal { path })
}

/// CPUs this process may use (affinity and cgroup quota), millicores; 1000 when unknown.
pub fn cpu_millicores() -> u64 {
    std::thread::available_parallelism()
        .map(|n| u64::try_from(n.get()).unwrap_or(u64::MAX))
        .unwrap_or(1)
        .saturating_mul(1000)
}

/// Whether the kernel's clock is synchronised (NTP, chrony, systemd-timesyncd: whichever
/// disciplines it), from `ntp_adjtime(2)` asked to change nothing: `Some(false)` when the
/// kernel says it is unsynchronised (`TIME_ERROR` or `STA_UNSYNC`), `None` when it cannot be
/// asked. The answer is the host's kernel's, also inside a container.
#[allow(unsafe_code)]
pub fn kernel_clock_synced() -> Option<bool> {
    // SAFETY: `tx` is a valid, zeroed `timex`; with `modes == 0` the call only reads the
    // kernel's state into it.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    tx.modes = 0;
    // SAFETY: as above; `tx` outlives the call.
    let state = unsafe { libc::ntp_adjtime(&mut tx) };
    if state < 0 {
        return None;
    }
    Some(state != libc::TIME_ERROR && tx.status & libc::STA_UNSYNC == 0)
}

/// Size and available space of the filesystem holding `path`.
pub fn disk_space(path: &Path) -> Result<DiskSpace, HostError> {
    let st = rustix::fs::statvfs(path).map_err(|e| HostError::Disk {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    Ok(DiskSpace {
        total_bytes: st.f_blocks.saturating_mul(st.f_frsize),
        free_bytes: st.f_bavail.saturating_mul(st.f_frsize),
    })
}

/// The open-file limit (`nofile`) tenants get by default: [`crate::spec::DEFAULT_NOFILE`], or
/// this process's own hard limit where that is lower. Raising a container's hard limit above
/// the one the container runtime inherited needs `CAP_SYS_RESOURCE`, which some hosts' daemons
/// lack (runc then refuses to start the container); the node normally runs with at most the
/// daemon's limits, so its own hard limit is a value the daemon can grant.
pub fn tenant_nofile() -> u32 {
    let hard = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
    nofile_within(hard)
}

impl ProviderLimits {
    /// The defaults with this host's tenant open-file limit ([`tenant_nofile`]): the limits a
    /// node runs with. Reads this process's `getrlimit`, the I/O that the pure
    /// [`ProviderLimits::default`] leaves out.
    pub fn from_host() -> Self {
        Self {
            nofile: tenant_nofile(),
            ..Self::default()
        }
    }
}

impl SandboxSpec {
    /// [`SandboxSpec::small`] with this host's tenant open-file limit ([`tenant_nofile`]), for
    /// a container started on this host (the runtime check, benchmarks, tests).
    pub fn small_on_host(lease_id: LeaseId, node_id: &str, image: &str, command: &[&str]) -> Self {
        Self {
            nofile: tenant_nofile(),
            ..SandboxSpec::small(lease_id, node_id, image, command)
        }
    }
}

/// Most descriptors the node asks for when its hard limit is unlimited.
pub const NOFILE_CEILING: u64 = 1 << 20;

/// Raises this process's soft open-file limit to its hard one (a node started from a
/// terminal gets a soft limit of 1,024 and a hard one far above: each peer connection, access
/// stream and Docker call takes a descriptor). Returns the soft limit in force afterwards.
pub fn raise_nofile() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    let want = now.maximum.unwrap_or(NOFILE_CEILING).min(NOFILE_CEILING);
    let current = now.current.unwrap_or(NOFILE_CEILING);
    if current >= want {
        return current;
    }
    match setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(want),
            maximum: now.maximum,
        },
    ) {
        Ok(()) => want,
        Err(_) => current,
    }
}

/// [`crate::spec::DEFAULT_NOFILE`] lowered to `hard` (`None`: unlimited), at least 1024.
pub fn nofile_within(hard: Option<u64>) -> u32 {
    let default = u64::from(crate::spec::DEFAULT_NOFILE);
    let n = hard.map_or(default, |h| h.min(default)).max(1024);
    u32::try_from(n).unwrap_or(crate::spec::DEFAULT_NOFILE)
}

/// The nearest existing directory at or above `path` (a data directory may not exist yet).
fn existing_ancestor(path: &Path) -> Option<&Path> {
    path.ancestors().find(|p| p.is_dir())
}

impl Sandbox {
    /// What the daemon says about its host.
    pub async fn daemon_host(&self) -> Result<DaemonHost, bollard::errors::Error> {
        let info = self.docker().info().await?;
        Ok(DaemonHost {
            ncpu: info.ncpu.and_then(|n| u64::try_from(n).ok()),
            mem_total_bytes: info.mem_total.and_then(|n| u64::try_from(n).ok()),
            root_dir: info.docker_root_dir.map(PathBuf::from),
        })
    }
}

/// Combines the kernel's and the daemon's views (see the module docs): the smaller of each.
/// `disks` are the measured filesystems; the one with the least space available counts, as
/// the workspace quotas it can hold ([`crate::workspace::quota_within`]).
pub fn combine(
    mem_total_mib: u64,
    cpu_millicores: u64,
    daemon: Option<&DaemonHost>,
    disks: &[(PathBuf, DiskSpace)],
) -> Option<(HostFacts, PathBuf)> {
    let ram_mib = match daemon.and_then(|d| d.mem_total_bytes) {
        Some(b) => mem_total_mib.min(b / MIB),
        None => mem_total_mib,
    };
    let cpu = match daemon.and_then(|d| d.ncpu) {
        Some(n) => cpu_millicores.min(n.saturating_mul(1000)),
        None => cpu_millicores,
    };
    let (path, disk) = disks.iter().min_by_key(|(_, d)| d.free_bytes)?;
    Some((
        HostFacts {
            ram_mib,
            cpu_millicores: cpu,
            disk_free_gib: crate::workspace::quota_within(disk.free_bytes) / GIB,
        },
        path.clone(),
    ))
}

/// Reads the host: the kernel's view, the daemon's when `sandbox` answers, and the disks of
/// the daemon's root directory, of `data_dir` and of its workspace directory (each, or its
/// nearest existing parent). A daemon that does not answer, or a root directory this process
/// cannot reach (a remote daemon), is logged and left out; at least one filesystem must be
/// measurable.
pub async fn read_host(
    sandbox: Option<&Sandbox>,
    data_dir: &Path,
) -> Result<HostReading, HostError> {
    let mem = mem_total_mib()?;
    let cpu = cpu_millicores();
    let daemon = match sandbox {
        Some(sb) => match sb.daemon_host().await {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!(error = %e, "docker info failed: host limits from the kernel only");
                None
            }
        },
        None => None,
    };
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(root) = daemon.as_ref().and_then(|d| d.root_dir.clone()) {
        candidates.push(root);
    }
    let data = existing_ancestor(data_dir)
        .unwrap_or(data_dir)
        .to_path_buf();
    candidates.push(data.clone());
    // Usually the same filesystem as the data directory, unless the provider mounted a disk
    // of its own there.
    let workspaces = crate::workspace::dir(data_dir);
    if let Some(w) = existing_ancestor(&workspaces).filter(|w| *w != data.as_path()) {
        candidates.push(w.to_path_buf());
    }
    let mut disks = Vec::new();
    let mut last_err = None;
    for path in candidates {
        match disk_space(&path) {
            Ok(d) => disks.push((path, d)),
            Err(e) => {
                tracing::warn!(error = %e, "free disk not measured here");
                last_err = Some(e);
            }
        }
    }
    match combine(mem, cpu, daemon.as_ref(), &disks) {
        Some((facts, disk_path)) => Ok(HostReading {
            facts,
            daemon,
            disk_path,
        }),
        None => Err(last_err.unwrap_or(HostError::Disk {
            path: data,
            source: std::io::Error::other("no filesystem measured"),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_kib_and_reported_in_mib() {
        let text = "MemTotal:       24684084 kB\nMemFree:         5726576 kB\n";
        assert_eq!(parse_mem_total_mib(text), Some(24_105));
        assert_eq!(parse_mem_total_mib("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_total_mib("MemTotal: lots\n"), None);
        assert_eq!(parse_mem_total_mib("MemTotal: 1024 MB\n"), None);
    }

    #[test]
    fn the_smaller_view_wins_and_the_fullest_disk_counts() {
        let daemon = DaemonHost {
            ncpu: Some(8),
            mem_total_bytes: Some(16 * GIB),
            root_dir: Some("/var/lib/docker".into()),
        };
        let disks = [
            (
                PathBuf::from("/var/lib/docker"),
                DiskSpace {
                    total_bytes: 500 * GIB,
                    free_bytes: 40 * GIB,
                },
            ),
            (
                PathBuf::from("/home/p/.gridlease"),
                DiskSpace {
                    total_bytes: 100 * GIB,
                    free_bytes: 60 * GIB,
                },
            ),
        ];
        let (f, path) = combine(32 * 1024, 4000, Some(&daemon), &disks).unwrap();
        assert_eq!(f.ram_mib, 16 * 1024);
        assert_eq!(f.cpu_millicores, 4000);
        // 40 GiB free hold workspaces of 37 GiB in all (ext4's structures need the rest).
        assert_eq!(f.disk_free_gib, 37);
        assert!(crate::workspace::max_image_bytes(f.disk_free_gib * GIB) <= 40 * GIB);
        assert_eq!(path, PathBuf::from("/var/lib/docker"));
        let (f, _) = combine(8 * 1024, 16_000, Some(&daemon), &disks).unwrap();
        assert_eq!((f.ram_mib, f.cpu_millicores), (8 * 1024, 8000));
        let (f, _) = combine(8 * 1024, 16_000, None, &disks[1..]).unwrap();
        assert_eq!(
            (f.ram_mib, f.cpu_millicores, f.disk_free_gib),
            (8 * 1024, 16_000, 56)
        );
        assert!(combine(1, 1, None, &[]).is_none());
    }

    #[test]
    fn tenant_nofile_is_the_default_or_the_lower_hard_limit() {
        assert_eq!(nofile_within(None), 65_536);
        assert_eq!(nofile_within(Some(1_048_576)), 65_536);
        assert_eq!(nofile_within(Some(20_000)), 20_000);
        assert_eq!(nofile_within(Some(10)), 1024);
        let n = tenant_nofile();
        assert!((1024..=65_536).contains(&n), "{n}");
    }

    #[test]
    fn this_host_is_readable() {
        let mem = mem_total_mib().unwrap();
        assert!(mem > 0);
        assert!(cpu_millicores() >= 1000);
        let d = disk_space(&std::env::temp_dir()).unwrap();
        assert!(d.total_bytes >= d.free_bytes && d.total_bytes > 0);
        let missing = std::env::temp_dir().join("gridlease-no-such-dir/leases");
        assert_eq!(
            existing_ancestor(&missing),
            Some(std::env::temp_dir().as_path())
        );
    }
}
