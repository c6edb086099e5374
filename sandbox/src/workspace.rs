//! The lease's writable, disk-backed `/workspace`, its size enforced by a filesystem.
//!
//! Mechanism: a sparse file `<dir>/<lease>.img` (`dir` is `<data dir>/workspaces`, mode 0700,
//! owned by the node) formatted ext4 (`mkfs.ext4 -m 0`, its root directory owned by the
//! tenant's user), attached to a loop device by the node (`losetup`), and exposed to Docker as
//! a named volume of the `local` driver (`type=ext4`, `device=/dev/loopN`,
//! `o=nosuid,nodev,noinit_itable`). The daemon mounts it when the container starts and
//! unmounts it when the container stops; the container sees it at
//! [`crate::spec::WORKSPACE_PATH`]. A write past its size fails inside the container with
//! `ENOSPC` (the filesystem is full), and on the host the file never takes more than its size
//! (it takes only the blocks written: sparse, no reserved blocks, inode tables and journal
//! left unwritten until used).
//!
//! Why this and not the storage driver: `--storage-opt size` needs overlay2 on xfs with project
//! quotas (this host runs fuse-overlayfs), and a quota on the container layer would not help a
//! read-only rootfs anyway. Why the node attaches the loop device: the `local` driver of Docker
//! 20.10 calls mount(2) itself, which knows no `loop` option (`o=loop` with `device=<file>` is
//! refused with EINVAL, observed on this host); given a block device it mounts it as any other.
//!
//! Requirements: the node runs as root (or with `CAP_SYS_ADMIN` and access to
//! `/dev/loop-control` and `/dev/loop*`) on the daemon's own host (the device path is the
//! host's), with e2fsprogs (`mkfs.ext4`, 1.42 or later for `root_owner`) and util-linux
//! (`losetup`). Without them [`Sandbox::create_workspace`] fails and the lease does not start.
//!
//! Sizing: the tenant gets at least the lease's disk as free space (`df /workspace`): the image
//! is grown by ext4's own overhead (journal, inode tables, the kernel's reserve), measured from
//! the superblock mkfs wrote ([`Ext4Stats`]), never beyond [`max_image_bytes`].
//!
//! Lifecycle: [`Sandbox::create_workspace`] before the container, [`Sandbox::remove_workspace`]
//! after the container is gone (volume, then loop device, then file; a volume still in use is
//! an error and the loop device stays attached, so a volume never names a loop device that
//! could be reused for another lease), [`Sandbox::reconcile_workspaces`] at node start-up
//! (whatever of this node's belongs to no live lease is removed).

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use bollard::models::VolumeCreateRequest;
use bollard::query_parameters::{ListVolumesOptionsBuilder, RemoveVolumeOptionsBuilder};
use gridlease_protocol::LeaseId;

use crate::runtime::Sandbox;
use crate::spec::{LABEL_LEASE, LABEL_NODE, NOBODY, SandboxSpec};

const MIB: u64 = 1024 * 1024;

/// The directory under the node's data directory that holds the workspace images.
pub const WORKSPACE_DIR: &str = "workspaces";
/// Label marking a volume as a gridlease workspace.
pub const LABEL_WORKSPACE: &str = "gridlease.workspace";
/// Label carrying the path of the volume's image file (so a workspace can be removed knowing
/// only its lease or its node, see [`Sandbox::remove_node_workspaces`]).
pub const LABEL_WORKSPACE_IMAGE: &str = "gridlease.workspace.image";
/// Options of the ext4 mount: no setuid programs, no device nodes (executables are allowed:
/// the tenant's own scripts and builds live here), and no background zeroing of the inode
/// tables (which would write about 1.6% of the size to the host for nothing: the file is new,
/// so it reads as zeros already).
pub const MOUNT_OPTIONS: &str = "nosuid,nodev,noinit_itable";
/// Fixed part of the most ext4 may add to a workspace (see [`max_image_bytes`]).
pub const MAX_FIXED_OVERHEAD: u64 = 64 * MIB;
/// Proportional part: at most `1 / OVERHEAD_DIVISOR` of the quota (measured: 5.8% at 2 GiB,
/// 2.2% at 50 GiB, with the default 16 KiB per inode and ext4's default journal).
pub const OVERHEAD_DIVISOR: u64 = 16;
/// Most mkfs rounds to reach the quota ([`next_image_size`]); two suffice in practice.
const MAX_ROUNDS: usize = 6;
/// Largest workspace the node makes (a sanity bound far above any offer).
pub const MAX_QUOTA: u64 = 64 * 1024 * 1024 * MIB;

/// A workspace operation failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The lease has no disk (or more than [`MAX_QUOTA`]).
    #[error("lease {lease_id} asks for a workspace of {bytes} bytes; need 1 MiB to 64 TiB")]
    BadQuota {
        /// The lease.
        lease_id: LeaseId,
        /// Its disk.
        bytes: u64,
    },
    /// A file or directory operation failed.
    #[error("workspace file {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A helper program could not be run.
    #[error("cannot run {program} (e2fsprogs / util-linux installed? running as root?): {source}")]
    Spawn {
        /// The program.
        program: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A helper program failed.
    #[error("{program} failed for {target} ({status}): {stderr}")]
    Tool {
        /// The program.
        program: &'static str,
        /// The file or device it worked on.
        target: String,
        /// Its exit status.
        status: String,
        /// The start of its error output.
        stderr: String,
    },
    /// The image does not carry the ext4 superblock mkfs should have written.
    #[error("{path} has no ext4 superblock")]
    BadImage {
        /// The image.
        path: PathBuf,
    },
    /// ext4 needs more room than [`max_image_bytes`] allows.
    #[error("a workspace of {quota} bytes would need an image above {max} bytes")]
    Overhead {
        /// The quota.
        quota: u64,
        /// The largest image allowed.
        max: u64,
    },
    /// `losetup` printed no device.
    #[error("losetup attached {path} but printed no device")]
    NoDevice {
        /// The image.
        path: PathBuf,
    },
    /// The workspace's image has no loop device (the workspace was removed).
    #[error("the workspace of lease {lease_id} is gone")]
    Gone {
        /// The lease.
        lease_id: LeaseId,
    },
    /// Mounting the workspace on the host failed.
    #[error("cannot mount the workspace {device} at {path}: {source}")]
    Mount {
        /// The loop device.
        device: PathBuf,
        /// The mount point.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A Docker volume call failed.
    #[error("docker {op} failed for volume {volume}: {source}")]
    Docker {
        /// Which call.
        op: &'static str,
        /// The volume.
        volume: String,
        /// What the daemon said.
        #[source]
        source: bollard::errors::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> WorkspaceError {
    let path = path.to_path_buf();
    move |source| WorkspaceError::Io { path, source }
}

/// The workspace directory for a node whose lease data lives in `data_dir`.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join(WORKSPACE_DIR)
}

/// The Docker volume name of a lease's workspace.
pub fn volume_name(lease: &LeaseId) -> String {
    format!("gridlease-ws-{lease}")
}

/// The image file of a lease's workspace in `dir`.
pub fn image_path(dir: &Path, lease: &LeaseId) -> PathBuf {
    dir.join(format!("{lease}.img"))
}

/// Where the node mounts a lease's workspace for its own copies into and out of it
/// ([`open_workspace_fs`]).
pub fn mount_path(dir: &Path, lease: &LeaseId) -> PathBuf {
    dir.join(format!("{lease}.mnt"))
}

/// The lease whose image file is called `file_name`, if it is one.
pub fn lease_of_image(file_name: &str) -> Option<LeaseId> {
    file_name.strip_suffix(".img")?.parse().ok()
}

/// The most bytes the image of a `quota`-byte workspace may have (and so the most it takes on
/// the host's disk): the quota, plus at most 1/16 of it and 64 MiB for ext4's own structures.
pub fn max_image_bytes(quota: u64) -> u64 {
    quota
        .saturating_add(quota / OVERHEAD_DIVISOR)
        .saturating_add(MAX_FIXED_OVERHEAD)
}

/// The largest total of workspace quotas whose images fit in `free_bytes` (the inverse of
/// [`max_image_bytes`], rounded down): what a filesystem with that much free space can promise.
pub fn quota_within(free_bytes: u64) -> u64 {
    let room = u128::from(free_bytes.saturating_sub(MAX_FIXED_OVERHEAD));
    let d = u128::from(OVERHEAD_DIVISOR);
    u64::try_from(room * d / (d + 1)).unwrap_or(u64::MAX)
}

/// The figures of an ext4 superblock that decide the free space a tenant sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ext4Stats {
    /// Block size, bytes.
    pub block_size: u64,
    /// Blocks in the filesystem.
    pub blocks: u64,
    /// Free blocks.
    pub free_blocks: u64,
    /// Blocks reserved for root (`-m`).
    pub reserved_blocks: u64,
    /// Whether the filesystem uses extents (then the kernel also keeps back a reserve).
    pub extents: bool,
}

impl Ext4Stats {
    /// Where the superblock starts in the image.
    pub const OFFSET: u64 = 1024;
    /// Its size.
    pub const LEN: usize = 1024;

    /// Parses the superblock (the [`Ext4Stats::LEN`] bytes at [`Ext4Stats::OFFSET`]); `None`
    /// unless it carries the ext4 magic and a sane block size.
    pub fn parse(sb: &[u8]) -> Option<Self> {
        let u32_at = |off: usize| -> Option<u64> {
            let b = sb.get(off..off + 4)?;
            Some(u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        };
        let magic = sb.get(0x38..0x3a)?;
        if magic != [0x53, 0xef] {
            return None;
        }
        let log_block = u32_at(0x18)?;
        if log_block > 6 {
            return None;
        }
        let incompat = u32_at(0x60)?;
        let wide = incompat & 0x80 != 0; // INCOMPAT_64BIT
        let join = |lo: usize, hi: usize| -> Option<u64> {
            let hi = if wide { u32_at(hi)? } else { 0 };
            Some((hi << 32) | u32_at(lo)?)
        };
        Some(Self {
            block_size: 1024 << log_block,
            blocks: join(0x04, 0x150)?,
            reserved_blocks: join(0x08, 0x154)?,
            free_blocks: join(0x0c, 0x158)?,
            extents: incompat & 0x40 != 0, // INCOMPAT_EXTENTS
        })
    }

    /// The image's size, bytes.
    pub fn size_bytes(&self) -> u64 {
        self.blocks.saturating_mul(self.block_size)
    }

    /// What an unprivileged writer can use right after mkfs, as `statvfs` reports it
    /// (`f_bavail`): free blocks minus root's reserve and minus the kernel's own reserve for
    /// delayed allocation, 2% of the blocks or 4096 blocks, whichever is smaller (fs/ext4
    /// `ext4_calculate_resv_clusters`, without bigalloc).
    pub fn usable_bytes(&self) -> u64 {
        let kernel_reserve = if self.extents {
            (self.blocks / 50).min(4096)
        } else {
            0
        };
        self.free_blocks
            .saturating_sub(self.reserved_blocks)
            .saturating_sub(kernel_reserve)
            .saturating_mul(self.block_size)
    }
}

/// The next image size to try when an image of `size` bytes leaves `usable` bytes for a
/// `quota`: `size` itself when it is enough, else grown by the shortfall and an eighth more
/// (ext4's overhead grows with the size), rounded up to a whole MiB.
pub fn next_image_size(size: u64, quota: u64, usable: u64) -> u64 {
    if usable >= quota {
        return size;
    }
    let short = quota - usable;
    let grown = size.saturating_add(short).saturating_add(short / 8);
    grown.div_ceil(MIB).saturating_mul(MIB)
}

/// The `mkfs.ext4` arguments for an image whose root directory belongs to `owner` (`uid:gid`):
/// 4 KiB blocks, 256-byte inodes, one inode per 16 KiB (fixed, so the result does not depend
/// on the host's `mke2fs.conf`), no blocks reserved for root, nothing written that need not be.
pub fn mkfs_args(image: &Path, owner: &str) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "-q",
        "-F",
        "-t",
        "ext4",
        "-b",
        "4096",
        "-I",
        "256",
        "-i",
        "16384",
        "-m",
        "0",
        "-L",
        "gridlease-ws",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    args.push("-E".into());
    args.push(
        format!("root_owner={owner},lazy_itable_init=1,lazy_journal_init=1,nodiscard").into(),
    );
    args.push(image.into());
    args
}

/// The loop devices (of `loops`: device, backing file) whose backing file is `image`.
pub fn loops_backed_by<'a>(
    loops: &'a [(PathBuf, PathBuf)],
    image: &'a Path,
) -> impl Iterator<Item = &'a PathBuf> + 'a {
    loops
        .iter()
        .filter(move |(_, backing)| backing == image)
        .map(|(dev, _)| dev)
}

/// The kernel's loop devices with a backing file (`/sys/block/loop*/loop/backing_file`; a
/// deleted file is reported with its old path).
pub fn attached_loops() -> Vec<(PathBuf, PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(e.path().join("loop/backing_file")) else {
            continue;
        };
        let path = text.trim_end_matches('\n');
        let path = path.strip_suffix(" (deleted)").unwrap_or(path);
        out.push((PathBuf::from("/dev").join(name), PathBuf::from(path)));
    }
    out.sort();
    out
}

/// A lease's workspace, as created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workspace {
    /// The lease.
    pub lease_id: LeaseId,
    /// The Docker volume to mount at `/workspace` (set it as [`SandboxSpec::workspace`]).
    pub volume: String,
    /// The image file.
    pub image: PathBuf,
    /// The loop device it is attached to.
    pub device: PathBuf,
    /// The lease's disk, bytes.
    pub quota_bytes: u64,
    /// The image's size, bytes (at most [`max_image_bytes`] of the quota).
    pub image_bytes: u64,
    /// Free space the tenant starts with, bytes (at least the quota).
    pub usable_bytes: u64,
}

/// What [`Sandbox::reconcile_workspaces`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceReconcile {
    /// Workspaces removed: their lease is not live.
    pub removed: Vec<LeaseId>,
    /// Workspaces kept: their lease is live.
    pub kept: Vec<LeaseId>,
}

/// Pure planning step of workspace reconciliation: of the leases whose workspace parts were
/// found, which to remove (not live) and which to keep.
pub fn plan_reconcile(found: &BTreeSet<LeaseId>, live: &BTreeSet<LeaseId>) -> WorkspaceReconcile {
    let (kept, removed) = found.iter().partition(|l| live.contains(l));
    WorkspaceReconcile { removed, kept }
}

/// Finds a helper in the usual system directories first (a root service's `PATH` may lack
/// `sbin`), then on `PATH`.
fn program(name: &'static str) -> PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Runs a helper; its stdout on success.
async fn run_tool(
    name: &'static str,
    args: &[OsString],
    target: &Path,
) -> Result<String, WorkspaceError> {
    let out = tokio::process::Command::new(program(name))
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| WorkspaceError::Spawn {
            program: name,
            source,
        })?;
    if !out.status.success() {
        let stderr: String = String::from_utf8_lossy(&out.stderr)
            .trim()
            .chars()
            .take(500)
            .collect();
        return Err(WorkspaceError::Tool {
            program: name,
            target: target.display().to_string(),
            status: out.status.to_string(),
            stderr,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Reads the superblock of `image`.
fn read_stats(image: &Path) -> Result<Ext4Stats, WorkspaceError> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(image).map_err(io_err(image))?;
    let mut sb = vec![0u8; Ext4Stats::LEN];
    f.seek(SeekFrom::Start(Ext4Stats::OFFSET))
        .and_then(|_| f.read_exact(&mut sb))
        .map_err(io_err(image))?;
    Ext4Stats::parse(&sb).ok_or_else(|| WorkspaceError::BadImage {
        path: image.to_path_buf(),
    })
}

/// Creates the workspace directory (0700) and returns its canonical path (the kernel names
/// loop backing files by canonical path).
fn ensure_dir(dir: &Path) -> Result<PathBuf, WorkspaceError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))?;
    std::fs::canonicalize(dir).map_err(io_err(dir))
}

/// `dir` canonical if it exists, as given otherwise.
fn canonical_or_same(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())
}

/// Formats a new sparse image for `quota` usable bytes; returns its superblock figures.
async fn make_image(image: &Path, quota: u64, owner: &str) -> Result<Ext4Stats, WorkspaceError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(image)
        .map_err(io_err(image))?;
    let max = max_image_bytes(quota);
    let mut size = quota.div_ceil(MIB).saturating_mul(MIB);
    for _ in 0..MAX_ROUNDS {
        if size > max {
            break;
        }
        // A fresh, fully sparse file each round: nothing of an earlier format stays allocated.
        file.set_len(0)
            .and_then(|()| file.set_len(size))
            .map_err(io_err(image))?;
        run_tool("mkfs.ext4", &mkfs_args(image, owner), image).await?;
        let stats = read_stats(image)?;
        let next = next_image_size(size, quota, stats.usable_bytes());
        if next == size {
            return Ok(stats);
        }
        size = next;
    }
    Err(WorkspaceError::Overhead { quota, max })
}

/// Attaches `image` to a free loop device; returns the device.
async fn attach(image: &Path) -> Result<PathBuf, WorkspaceError> {
    let out = run_tool(
        "losetup",
        &["--find".into(), "--show".into(), image.into()],
        image,
    )
    .await?;
    let device = PathBuf::from(out.trim());
    if device.as_os_str().is_empty() {
        return Err(WorkspaceError::NoDevice {
            path: image.to_path_buf(),
        });
    }
    Ok(device)
}

/// Checks that this host can make workspaces in `dir` (`gridlease doctor`): a 4 MiB image
/// formatted as a workspace would be, attached to a loop device and detached again; nothing
/// is left behind. Needs no Docker. `Err` says which step failed.
pub async fn probe_quota(dir: &Path) -> Result<(), WorkspaceError> {
    if let Some(home) = dir.parent() {
        sweep_stale_probes(home).await;
    }
    let dir = ensure_dir(dir)?;
    let image = dir.join(format!("probe-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&image);
    let tried = async {
        make_image(&image, 4 * MIB, NOBODY).await?;
        let device = attach(&image).await?;
        run_tool("losetup", &["-d".into(), device.into()], &image)
            .await
            .map(|_| ())
    }
    .await;
    // Whatever the outcome, no loop device and no file stay.
    for (device, _) in attached_loops()
        .into_iter()
        .filter(|(_, backing)| backing == &image)
    {
        let _ = run_tool("losetup", &["-d".into(), device.into()], &image).await;
    }
    let _ = std::fs::remove_file(&image);
    tried
}

/// What a [`probe_quota`] in `home/.doctor-<pid>/` left when its process was killed mid-probe
/// (a node killed during its start-up checks): for every such pid no longer running, the loop
/// devices backed by its `probe-<pid>.img` are detached and the directory removed. The number
/// of loop devices detached.
pub async fn sweep_stale_probes(home: &Path) -> usize {
    let home = home.canonicalize().unwrap_or_else(|_| home.to_path_buf());
    let stale = |name: &str| {
        name.strip_prefix(".doctor-")
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(|pid| {
                pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
            })
    };
    let mut detached = 0;
    for (device, backing) in attached_loops() {
        let Some(dir) = backing.parent() else {
            continue;
        };
        let dir_name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let file = backing.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if dir.parent() != Some(home.as_path())
            || !stale(dir_name)
            || !(file.starts_with("probe-") && file.ends_with(".img"))
        {
            continue;
        }
        match run_tool("losetup", &["-d".into(), device.clone().into()], &backing).await {
            Ok(_) => {
                tracing::warn!(device = %device.display(), image = %backing.display(), "detached a loop device a killed disk-quota probe left");
                detached += 1;
            }
            Err(e) => {
                tracing::warn!(device = %device.display(), error = %e, "cannot detach a loop device a killed disk-quota probe left")
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(&home) {
        for e in entries.flatten() {
            if e.file_name().to_str().is_some_and(stale) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    detached
}

impl Sandbox {
    /// Creates the workspace of `spec`'s lease in `dir` (see the module docs): a fresh image
    /// of `spec.workspace_bytes` usable bytes whose root belongs to the tenant's user, a loop
    /// device, and the volume to mount. Whatever an earlier attempt left for this lease is
    /// removed first; on failure nothing is left behind.
    pub async fn create_workspace(
        &self,
        dir: &Path,
        spec: &SandboxSpec,
    ) -> Result<Workspace, WorkspaceError> {
        let lease_id = spec.lease_id;
        let quota = spec.workspace_bytes;
        if !(MIB..=MAX_QUOTA).contains(&quota) {
            return Err(WorkspaceError::BadQuota {
                lease_id,
                bytes: quota,
            });
        }
        self.remove_workspace(dir, &lease_id).await?;
        let dir = ensure_dir(dir)?;
        let image = image_path(&dir, &lease_id);
        let owner = if spec.run_as_root { "0:0" } else { NOBODY };
        let made = async {
            let stats = make_image(&image, quota, owner).await?;
            let device = attach(&image).await?;
            let volume = self
                .create_workspace_volume(&lease_id, &spec.node_id, &image, &device)
                .await?;
            Ok(Workspace {
                lease_id,
                volume,
                image: image.clone(),
                device,
                quota_bytes: quota,
                image_bytes: stats.size_bytes(),
                usable_bytes: stats.usable_bytes(),
            })
        }
        .await;
        match made {
            Ok(ws) => {
                tracing::info!(
                    lease = %lease_id,
                    volume = %ws.volume,
                    device = %ws.device.display(),
                    quota_bytes = ws.quota_bytes,
                    image_bytes = ws.image_bytes,
                    usable_bytes = ws.usable_bytes,
                    "workspace created"
                );
                Ok(ws)
            }
            Err(e) => {
                if let Err(cleanup) = self.remove_workspace(&dir, &lease_id).await {
                    tracing::warn!(lease = %lease_id, error = %cleanup, "cannot remove a half-made workspace");
                }
                Err(e)
            }
        }
    }

    /// The Docker volume of `lease`'s workspace: `device`, the loop device backed by `image`.
    async fn create_workspace_volume(
        &self,
        lease: &LeaseId,
        node_id: &str,
        image: &Path,
        device: &Path,
    ) -> Result<String, WorkspaceError> {
        let volume = volume_name(lease);
        let req = VolumeCreateRequest {
            name: Some(volume.clone()),
            driver: Some("local".to_string()),
            driver_opts: Some(HashMap::from([
                ("type".to_string(), "ext4".to_string()),
                ("device".to_string(), device.display().to_string()),
                ("o".to_string(), MOUNT_OPTIONS.to_string()),
            ])),
            labels: Some(HashMap::from([
                (LABEL_LEASE.to_string(), lease.to_string()),
                (LABEL_NODE.to_string(), node_id.to_string()),
                (LABEL_WORKSPACE.to_string(), "true".to_string()),
                (
                    LABEL_WORKSPACE_IMAGE.to_string(),
                    image.display().to_string(),
                ),
            ])),
            ..Default::default()
        };
        self.docker()
            .create_volume(req)
            .await
            .map_err(|source| WorkspaceError::Docker {
                op: "create_volume",
                volume: volume.clone(),
                source,
            })?;
        Ok(volume)
    }

    /// Opens the existing workspace of `spec`'s lease in `dir` again, keeping its files: its
    /// image attached to a loop device unless one backs it already, and its Docker volume
    /// made unless one names that device (after a host reboot both are gone and only the
    /// image stays; a volume naming another device is replaced). Fails with
    /// [`WorkspaceError::Gone`] when the image file is not there.
    pub async fn reattach_workspace(
        &self,
        dir: &Path,
        spec: &SandboxSpec,
    ) -> Result<Workspace, WorkspaceError> {
        let lease_id = spec.lease_id;
        let dir = canonical_or_same(dir);
        let image = image_path(&dir, &lease_id);
        let stats = match read_stats(&image) {
            Ok(s) => s,
            Err(WorkspaceError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Err(WorkspaceError::Gone { lease_id });
            }
            Err(e) => return Err(e),
        };
        // No removal detaches (and no copy mounts) the device meanwhile.
        let _mounts = MOUNTS.lock().await;
        let attached = loops_backed_by(&attached_loops(), &image).next().cloned();
        let changed = attached.is_none();
        let device = match attached {
            Some(d) => d,
            None => attach(&image).await?,
        };
        let volume = volume_name(&lease_id);
        let named = match self.docker().inspect_volume(&volume).await {
            Ok(v) => Some(v.options.get("device").map(PathBuf::from)),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => None,
            Err(source) => {
                return Err(WorkspaceError::Docker {
                    op: "inspect_volume",
                    volume,
                    source,
                });
            }
        };
        let changed = match named {
            Some(Some(d)) if d == device => changed,
            found => {
                if found.is_some() {
                    self.remove_volume(&volume).await?;
                }
                self.create_workspace_volume(&lease_id, &spec.node_id, &image, &device)
                    .await?;
                true
            }
        };
        if changed {
            tracing::info!(lease = %lease_id, volume = %volume, device = %device.display(), "workspace attached again");
        }
        Ok(Workspace {
            lease_id,
            volume,
            image,
            device,
            quota_bytes: spec.workspace_bytes,
            image_bytes: stats.size_bytes(),
            usable_bytes: stats.usable_bytes(),
        })
    }

    /// Hands the workspace of lease `from` in `dir`, with its files, to `spec`'s lease (a
    /// lease's `/workspace` kept as a volume): `from`'s Docker volume removed (its container
    /// must be gone: an error otherwise, and nothing changes), the node's own mount of it and
    /// its loop devices detached, its image renamed to the new lease's, which is then attached
    /// ([`Sandbox::reattach_workspace`]). Safe to repeat after an interruption at any step:
    /// once `from`'s image is renamed only the last step is left.
    pub async fn adopt_workspace(
        &self,
        dir: &Path,
        from: &LeaseId,
        spec: &SandboxSpec,
    ) -> Result<Workspace, WorkspaceError> {
        let dir = canonical_or_same(dir);
        let (old, new) = (image_path(&dir, from), image_path(&dir, &spec.lease_id));
        if old.exists() {
            self.remove_volume(&volume_name(from)).await?;
            {
                let _mounts = MOUNTS.lock().await;
                unmount_own(&mount_path(&dir, from));
                for device in loops_backed_by(&attached_loops(), &old) {
                    run_tool("losetup", &["-d".into(), device.clone().into()], device).await?;
                }
            }
            std::fs::rename(&old, &new).map_err(io_err(&old))?;
            tracing::info!(from = %from, to = %spec.lease_id, "workspace handed over");
        }
        self.reattach_workspace(&dir, spec).await
    }

    /// Removes a lease's workspace from `dir`: its volume (which must not be in use: remove
    /// the container first), then its loop devices, then its image file. Missing parts are not
    /// an error, so this is safe to repeat.
    pub async fn remove_workspace(
        &self,
        dir: &Path,
        lease: &LeaseId,
    ) -> Result<(), WorkspaceError> {
        let volume = volume_name(lease);
        self.remove_volume(&volume).await?;
        let image = image_path(&canonical_or_same(dir), lease);
        // The node's own mount goes first (lazily: a copy still reading keeps the filesystem
        // until it ends), and no copy mounts the device again while it is detached.
        let _mounts = MOUNTS.lock().await;
        unmount_own(&mount_path(&canonical_or_same(dir), lease));
        for device in loops_backed_by(&attached_loops(), &image) {
            run_tool("losetup", &["-d".into(), device.clone().into()], device).await?;
        }
        match std::fs::remove_file(&image) {
            Ok(()) => {
                tracing::info!(lease = %lease, "workspace removed");
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&image)(e)),
        }
    }

    async fn remove_volume(&self, volume: &str) -> Result<(), WorkspaceError> {
        let opts = RemoveVolumeOptionsBuilder::default().force(false).build();
        match self.docker().remove_volume(volume, Some(opts)).await {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(source) => Err(WorkspaceError::Docker {
                op: "remove_volume",
                volume: volume.to_string(),
                source,
            }),
        }
    }

    /// Removes the workspace of `lease` wherever its image is (read from its volume's
    /// [`LABEL_WORKSPACE_IMAGE`]); nothing to do if it has no volume.
    pub async fn remove_lease_workspace(&self, lease: &LeaseId) -> Result<(), WorkspaceError> {
        let volume = volume_name(lease);
        let v = match self.docker().inspect_volume(&volume).await {
            Ok(v) => v,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(()),
            Err(source) => {
                return Err(WorkspaceError::Docker {
                    op: "inspect_volume",
                    volume,
                    source,
                });
            }
        };
        match v
            .labels
            .get(LABEL_WORKSPACE_IMAGE)
            .and_then(|p| Path::new(p).parent())
        {
            Some(dir) => self.remove_workspace(dir, lease).await,
            None => self.remove_volume(&volume).await,
        }
    }

    /// Removes every workspace whose volume is labelled with `node_id` (wherever its image
    /// is); returns their leases. For test clean-up and for operators; the node itself uses
    /// [`Sandbox::reconcile_workspaces`].
    pub async fn remove_node_workspaces(
        &self,
        node_id: &str,
    ) -> Result<Vec<LeaseId>, WorkspaceError> {
        let mut removed = Vec::new();
        for lease in self.node_volume_leases(node_id).await? {
            self.remove_lease_workspace(&lease).await?;
            removed.push(lease);
        }
        Ok(removed)
    }

    /// The leases of the workspace volumes labelled with `node_id` (a workspace volume without
    /// a lease label is removed on sight).
    async fn node_volume_leases(&self, node_id: &str) -> Result<BTreeSet<LeaseId>, WorkspaceError> {
        let filters = HashMap::from([(
            "label",
            vec![
                format!("{LABEL_NODE}={node_id}"),
                LABEL_WORKSPACE.to_string(),
            ],
        )]);
        let opts = ListVolumesOptionsBuilder::default()
            .filters(&filters)
            .build();
        let listed = self
            .docker()
            .list_volumes(Some(opts))
            .await
            .map_err(|source| WorkspaceError::Docker {
                op: "list_volumes",
                volume: format!("{LABEL_NODE}={node_id}"),
                source,
            })?;
        let mut found = BTreeSet::new();
        for v in listed.volumes.unwrap_or_default() {
            match v.labels.get(LABEL_LEASE).and_then(|l| l.parse().ok()) {
                Some(lease) => {
                    found.insert(lease);
                }
                None => {
                    tracing::warn!(volume = %v.name, "removing a workspace volume without a lease label");
                    self.remove_volume(&v.name).await?;
                }
            }
        }
        Ok(found)
    }

    /// The leases that have any part of a workspace of this node: a volume labelled with
    /// `node_id`, an image file in `dir`, or a loop device backed by one.
    pub async fn list_workspaces(
        &self,
        dir: &Path,
        node_id: &str,
    ) -> Result<BTreeSet<LeaseId>, WorkspaceError> {
        let mut found = self.node_volume_leases(node_id).await?;
        let dir = canonical_or_same(dir);
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if let Some(lease) = e.file_name().to_str().and_then(lease_of_image) {
                    found.insert(lease);
                }
            }
        }
        for (_, backing) in attached_loops() {
            if backing.parent() == Some(dir.as_path())
                && let Some(lease) = backing
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(lease_of_image)
            {
                found.insert(lease);
            }
        }
        Ok(found)
    }

    /// At node start-up, after the containers were reconciled: removes every workspace of
    /// this node (in `dir`, or labelled with `node_id`) whose lease is not in `live`.
    pub async fn reconcile_workspaces(
        &self,
        dir: &Path,
        node_id: &str,
        live: &BTreeSet<LeaseId>,
    ) -> Result<WorkspaceReconcile, WorkspaceError> {
        let found = self.list_workspaces(dir, node_id).await?;
        let plan = plan_reconcile(&found, live);
        for lease in &plan.removed {
            tracing::warn!(lease = %lease, node = node_id, "removing orphan workspace");
            self.remove_workspace(dir, lease).await?;
        }
        // A kept lease's volume must still name a loop device backed by its own image (after
        // a host reboot the devices are gone and their numbers may be reused): if not, the
        // volume goes, so it can never mount another lease's data.
        let loops = attached_loops();
        let image_dir = canonical_or_same(dir);
        for lease in &plan.kept {
            let volume = volume_name(lease);
            let Ok(v) = self.docker().inspect_volume(&volume).await else {
                continue;
            };
            let device = v.options.get("device").map(PathBuf::from);
            if !volume_matches_image(device.as_deref(), &image_path(&image_dir, lease), &loops) {
                tracing::warn!(lease = %lease, volume = %volume, "workspace volume names a loop device that no longer backs its image; removing the volume");
                self.remove_volume(&volume).await?;
            }
        }
        Ok(plan)
    }
}

/// Serialises the node's own workspace mounts with the removal of workspaces (so a copy never
/// mounts a loop device that is being detached, and possibly reused for another lease).
static MOUNTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Removes the node's own mount of a workspace, if there is one, and its mount point.
fn unmount_own(mount: &Path) {
    match rustix::mount::unmount(mount, rustix::mount::UnmountFlags::DETACH) {
        Ok(()) => tracing::debug!(path = %mount.display(), "workspace unmounted"),
        Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => {}
        Err(e) => {
            tracing::warn!(path = %mount.display(), error = %e, "cannot unmount the workspace")
        }
    }
    let _ = std::fs::remove_dir(mount);
}

/// Opens the workspace of `lease` (its image in `dir`) on the host, for the node's copies into
/// and out of it ([`crate::files`]): mounts the lease's loop device at [`mount_path`]
/// (`nosuid,nodev,noexec`, in the node's mount namespace; the same filesystem the container
/// sees, whether or not it runs) unless that device is mounted there already, and opens the
/// mount's root. The mount stays until [`Sandbox::remove_workspace`]. Fails with
/// [`WorkspaceError::Gone`] when no loop device backs the lease's image any more.
pub async fn open_workspace_fs(
    dir: &Path,
    lease: &LeaseId,
) -> Result<crate::files::WorkspaceFs, WorkspaceError> {
    let _mounts = MOUNTS.lock().await;
    let dir = canonical_or_same(dir);
    let lease_id = *lease;
    tokio::task::spawn_blocking(move || mount_own(&dir, &lease_id))
        .await
        .map_err(|e| WorkspaceError::Io {
            path: PathBuf::from("."),
            source: std::io::Error::other(e),
        })?
}

fn mount_own(dir: &Path, lease: &LeaseId) -> Result<crate::files::WorkspaceFs, WorkspaceError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let image = image_path(dir, lease);
    let loops = attached_loops();
    let Some(device) = loops_backed_by(&loops, &image).next().cloned() else {
        return Err(WorkspaceError::Gone { lease_id: *lease });
    };
    let mount = mount_path(dir, lease);
    let mount_err = |source: std::io::Error| WorkspaceError::Mount {
        device: device.clone(),
        path: mount.clone(),
        source,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&mount) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(mount_err(e)),
    }
    let rdev = std::fs::metadata(&device).map_err(mount_err)?.rdev();
    let here = std::fs::symlink_metadata(&mount).map_err(mount_err)?.dev();
    if here != rdev {
        if here != std::fs::metadata(dir).map_err(mount_err)?.dev() {
            // Something else is mounted there (a device since reused): off it goes.
            unmount_own(&mount);
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&mount)
                .map_err(mount_err)?;
        }
        rustix::mount::mount(
            &device,
            &mount,
            "ext4",
            rustix::mount::MountFlags::NOSUID
                | rustix::mount::MountFlags::NODEV
                | rustix::mount::MountFlags::NOEXEC,
            c"noinit_itable",
        )
        .map_err(|e| mount_err(std::io::Error::from_raw_os_error(e.raw_os_error())))?;
        // The device is the lease's still (removal holds the same lock, so it cannot have
        // been detached and reused meanwhile; checked anyway).
        let still = loops_backed_by(&attached_loops(), &image).any(|d| *d == device);
        if !still {
            unmount_own(&mount);
            return Err(WorkspaceError::Gone { lease_id: *lease });
        }
        tracing::debug!(lease = %lease, device = %device.display(), "workspace mounted for copies");
    }
    crate::files::WorkspaceFs::open(&mount).map_err(mount_err)
}

/// Whether a workspace volume whose `device` option is `device` still reaches `image`: the
/// device is attached (in `loops`) to exactly that file.
pub fn volume_matches_image(
    device: Option<&Path>,
    image: &Path,
    loops: &[(PathBuf, PathBuf)],
) -> bool {
    device.is_some_and(|d| {
        loops
            .iter()
            .any(|(dev, backing)| dev == d && backing == image)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::Digest;

    const GIB: u64 = 1024 * MIB;

    fn superblock(log_block: u32, blocks: u64, free: u64, reserved: u64, incompat: u32) -> Vec<u8> {
        let mut sb = vec![0u8; Ext4Stats::LEN];
        let put = |sb: &mut Vec<u8>, off: usize, v: u32| {
            sb[off..off + 4].copy_from_slice(&v.to_le_bytes());
        };
        put(&mut sb, 0x04, blocks as u32);
        put(&mut sb, 0x08, reserved as u32);
        put(&mut sb, 0x0c, free as u32);
        put(&mut sb, 0x18, log_block);
        sb[0x38] = 0x53;
        sb[0x39] = 0xef;
        put(&mut sb, 0x60, incompat);
        put(&mut sb, 0x150, (blocks >> 32) as u32);
        put(&mut sb, 0x154, (reserved >> 32) as u32);
        put(&mut sb, 0x158, (free >> 32) as u32);
        sb
    }

    #[test]
    fn names_are_per_lease_and_round_trip() {
        let a = LeaseId(Digest::of("t", b"a"));
        let b = LeaseId(Digest::of("t", b"b"));
        assert_ne!(volume_name(&a), volume_name(&b));
        assert!(volume_name(&a).starts_with("gridlease-ws-"));
        let dir = dir(Path::new("/data/leases"));
        assert_eq!(dir, Path::new("/data/leases/workspaces"));
        let img = image_path(&dir, &a);
        assert_eq!(img.parent(), Some(dir.as_path()));
        let name = img.file_name().unwrap().to_str().unwrap();
        assert_eq!(lease_of_image(name), Some(a));
        assert_eq!(lease_of_image("x.img"), None);
        assert_eq!(lease_of_image(&format!("{a}.log")), None);
    }

    #[test]
    fn the_superblock_gives_what_statvfs_reports() {
        // Figures of a real 2 GiB image from `mkfs_args` (e2fsprogs 1.47): `stat -f` on its
        // mount reported bavail 494036 blocks of 4096 bytes.
        let sb = superblock(2, 524_288, 498_132, 0, 0x40 | 0x80 | 0x200 | 0x2);
        let s = Ext4Stats::parse(&sb).unwrap();
        assert_eq!(s.block_size, 4096);
        assert_eq!(s.size_bytes(), 2 * GIB);
        assert_eq!(s.usable_bytes(), 494_036 * 4096);
        // Small filesystems keep 2% back, not 4096 blocks; root's reserve counts too.
        let s = Ext4Stats::parse(&superblock(2, 100_000, 90_000, 1000, 0x40)).unwrap();
        assert_eq!(s.usable_bytes(), (90_000 - 1000 - 2000) * 4096);
        // Without extents the kernel keeps no reserve.
        let s = Ext4Stats::parse(&superblock(0, 1000, 900, 0, 0)).unwrap();
        assert_eq!((s.block_size, s.usable_bytes()), (1024, 900 * 1024));
        // 64-bit counts use the high words.
        let s = Ext4Stats::parse(&superblock(2, 5 << 32, 4 << 32, 0, 0x40 | 0x80)).unwrap();
        assert_eq!(s.blocks, 5 << 32);
        assert_eq!(s.free_blocks, 4 << 32);
        // Not ext4, or nonsense.
        let mut bad = sb.clone();
        bad[0x38] = 0;
        assert!(Ext4Stats::parse(&bad).is_none());
        assert!(Ext4Stats::parse(&superblock(40, 1, 1, 0, 0)).is_none());
        assert!(Ext4Stats::parse(&sb[..0x40]).is_none());
    }

    #[test]
    fn images_grow_until_the_quota_is_usable() {
        assert_eq!(next_image_size(2 * GIB, 2 * GIB, 2 * GIB), 2 * GIB);
        assert_eq!(next_image_size(3 * GIB, 2 * GIB, 2 * GIB + 1), 3 * GIB);
        let short = 118 * MIB;
        let next = next_image_size(2 * GIB, 2 * GIB, 2 * GIB - short);
        assert_eq!(next, (2 * GIB + short + short / 8).div_ceil(MIB) * MIB);
        assert!(next >= 2 * GIB + short + short / 8);
        assert_eq!(next % MIB, 0);
        assert!(next <= max_image_bytes(2 * GIB));
        assert_eq!(next_image_size(MIB, 2 * MIB, 0) % MIB, 0);
    }

    #[test]
    fn quota_within_inverts_max_image_bytes() {
        assert_eq!(max_image_bytes(0), MAX_FIXED_OVERHEAD);
        assert_eq!(max_image_bytes(16 * GIB), 17 * GIB + MAX_FIXED_OVERHEAD);
        assert_eq!(quota_within(0), 0);
        assert_eq!(quota_within(MAX_FIXED_OVERHEAD), 0);
        assert_eq!(quota_within(17 * GIB + MAX_FIXED_OVERHEAD), 16 * GIB);
        for free in [1, MIB, 100 * MIB, 40 * GIB, 12_345_678_901, u64::MAX / 2] {
            let q = quota_within(free);
            assert!(max_image_bytes(q) <= free.max(MAX_FIXED_OVERHEAD), "{free}");
            assert!(
                free < MAX_FIXED_OVERHEAD || max_image_bytes(q + 17) > free,
                "{free}"
            );
        }
    }

    #[test]
    fn mkfs_is_fixed_and_gives_the_root_to_the_owner() {
        let args = mkfs_args(Path::new("/w/x.img"), "65534:65534");
        let args: Vec<_> = args.iter().map(|a| a.to_str().unwrap()).collect();
        let after = |flag: &str| args[args.iter().position(|a| *a == flag).unwrap() + 1];
        assert_eq!(after("-m"), "0", "no blocks reserved for root");
        assert_eq!(after("-t"), "ext4");
        assert_eq!(after("-b"), "4096");
        assert!(after("-E").starts_with("root_owner=65534:65534,"));
        assert!(after("-E").contains("lazy_itable_init=1"));
        assert_eq!(args.last(), Some(&"/w/x.img"));
    }

    #[test]
    fn loops_are_matched_by_their_backing_file() {
        let loops = vec![
            (PathBuf::from("/dev/loop0"), PathBuf::from("/w/a.img")),
            (PathBuf::from("/dev/loop1"), PathBuf::from("/w/b.img")),
            (PathBuf::from("/dev/loop2"), PathBuf::from("/w/a.img")),
        ];
        let got: Vec<_> = loops_backed_by(&loops, Path::new("/w/a.img")).collect();
        assert_eq!(got, vec![Path::new("/dev/loop0"), Path::new("/dev/loop2")]);
        assert_eq!(loops_backed_by(&loops, Path::new("/w/c.img")).count(), 0);
    }

    #[test]
    fn a_volume_is_kept_only_while_its_device_backs_its_image() {
        let loops = vec![
            (PathBuf::from("/dev/loop0"), PathBuf::from("/w/a.img")),
            (PathBuf::from("/dev/loop1"), PathBuf::from("/w/b.img")),
        ];
        let a = Path::new("/w/a.img");
        assert!(volume_matches_image(
            Some(Path::new("/dev/loop0")),
            a,
            &loops
        ));
        // After a reboot loop1 may back another lease's image: that volume must go.
        assert!(!volume_matches_image(
            Some(Path::new("/dev/loop1")),
            a,
            &loops
        ));
        assert!(!volume_matches_image(
            Some(Path::new("/dev/loop7")),
            a,
            &loops
        ));
        assert!(!volume_matches_image(None, a, &loops));
    }

    #[test]
    fn reconcile_removes_what_is_not_live() {
        let a = LeaseId(Digest::of("t", b"a"));
        let b = LeaseId(Digest::of("t", b"b"));
        let c = LeaseId(Digest::of("t", b"c"));
        let r = plan_reconcile(&BTreeSet::from([a, b]), &BTreeSet::from([a, c]));
        assert_eq!(r.kept, vec![a]);
        assert_eq!(r.removed, vec![b]);
    }
}
