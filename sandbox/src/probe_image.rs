//! The probe image: a static test binary in a from-scratch image created from an in-memory
//! tar, so tests and `devnet` need no registry.
//!
//! Image layout: `/probe` (0755, the entrypoint), `/suid` (the same binary, setuid root, mode
//! 04755, for the setuid escape test) and an empty `/tmp`.
//!
//! Why the import API (`POST /images/create?fromSrc=-`, i.e. `docker import`) and not
//! `build_image`: a `FROM scratch` + `COPY` build through the legacy builder works, but on this
//! engine (20.10, API 1.41) it dropped the setuid bit from `/suid` (observed: mode 0755 in the
//! built image), which would make the setuid escape test pass vacuously. Import keeps the tar
//! headers' mode bits exactly; the entrypoint is set with a `changes` instruction.

use bollard::query_parameters::CreateImageOptionsBuilder;
use futures_util::StreamExt;

use crate::runtime::{Sandbox, SandboxError};

/// The static probe binary compiled by `build.rs` from `probe/main.rs`.
pub static PROBE_BINARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gridlease-probe"));

/// Label on the probe image: a hash of the probe's source (`probe/main.rs`), so an image left
/// by an older probe under the same tag (same crate version, fewer steps) is replaced instead of
/// silently reused. The source, not the binary: the binary embeds the checkout's path.
pub const PROBE_SOURCE_LABEL: &str = "gridlease.probe.source";

/// The value of [`PROBE_SOURCE_LABEL`] for the probe embedded in this build (FNV-1a 64, hex).
pub fn probe_source_hash() -> String {
    const SOURCE: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/probe/main.rs"));
    const HASH: u64 = {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut i = 0;
        while i < SOURCE.len() {
            h = (h ^ SOURCE[i] as u64).wrapping_mul(0x0000_0100_0000_01b3);
            i += 1;
        }
        h
    };
    format!("{HASH:016x}")
}

/// Applets linked to `/bin/busybox` in [`Sandbox::import_busybox_image`].
pub const BUSYBOX_APPLETS: &[&str] = &[
    "sh",
    "echo",
    "sleep",
    "stty",
    "wc",
    "cat",
    "httpd",
    "nc",
    "dd",
    "sha256sum",
    "ls",
    "env",
    "id",
    "head",
    "true",
    "false",
    "printf",
    "seq",
    "kill",
    "ps",
    "mkdir",
    "rm",
    "mv",
    "touch",
    "tail",
    "date",
];

fn busybox_rootfs(busybox: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    append(&mut tar, "bin/", 0o755, tar::EntryType::Directory, &[])?;
    append(&mut tar, "tmp/", 0o1777, tar::EntryType::Directory, &[])?;
    append(
        &mut tar,
        "workspace/",
        0o755,
        tar::EntryType::Directory,
        &[],
    )?;
    append(
        &mut tar,
        "bin/busybox",
        0o755,
        tar::EntryType::Regular,
        busybox,
    )?;
    for applet in BUSYBOX_APPLETS {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        h.set_mtime(0);
        tar.append_link(&mut h, format!("bin/{applet}"), "busybox")?;
    }
    tar.into_inner()
}

/// Image tag: `gridlease-probe:<crate version>`.
pub fn probe_image_tag() -> String {
    format!("gridlease-probe:{}", env!("CARGO_PKG_VERSION"))
}

fn append(
    tar: &mut tar::Builder<Vec<u8>>,
    path: &str,
    mode: u32,
    kind: tar::EntryType,
    data: &[u8],
) -> std::io::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(data.len() as u64);
    tar.append_data(&mut h, path, data)
}

/// The image root filesystem as an in-memory tar. Mode bits (including setuid on `/suid`) and
/// root ownership are set in the tar headers.
pub fn rootfs_tar() -> std::io::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    append(&mut tar, "tmp/", 0o1777, tar::EntryType::Directory, &[])?;
    append(
        &mut tar,
        "probe",
        0o755,
        tar::EntryType::Regular,
        PROBE_BINARY,
    )?;
    append(
        &mut tar,
        "suid",
        0o4755,
        tar::EntryType::Regular,
        PROBE_BINARY,
    )?;
    tar.into_inner()
}

impl Sandbox {
    /// Creates `gridlease-probe:<version>` unless it is already present with this build's
    /// probe (label [`PROBE_SOURCE_LABEL`]; an older probe under the same tag is replaced).
    /// Returns the tag.
    ///
    /// Parallel test processes on one host would otherwise all import at once and leave
    /// dangling copies; a lock file (`create_new`, stale after 60 s) in the temp dir lets one
    /// process import while the others wait and re-check the tag.
    pub async fn ensure_probe_image(&self) -> Result<String, SandboxError> {
        let tag = probe_image_tag();
        let lock = std::env::temp_dir().join(format!(
            "gridlease-probe-{}.lock",
            env!("CARGO_PKG_VERSION")
        ));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            if self.has_current_probe(&tag).await {
                return Ok(tag);
            }
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&lock)
            {
                Ok(_) => {
                    let result = self.build_probe_image().await;
                    let _ = std::fs::remove_file(&lock);
                    result?;
                    return Ok(tag);
                }
                Err(_) if std::time::Instant::now() > deadline => {
                    // Give up waiting on someone else; import ourselves.
                    self.build_probe_image().await?;
                    return Ok(tag);
                }
                Err(_) => {
                    let stale = std::fs::metadata(&lock)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > std::time::Duration::from_secs(60));
                    if stale {
                        let _ = std::fs::remove_file(&lock);
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Whether `tag` exists and carries this build's probe.
    async fn has_current_probe(&self, tag: &str) -> bool {
        let Ok(image) = self.docker().inspect_image(tag).await else {
            return false;
        };
        image
            .config
            .and_then(|c| c.labels)
            .is_some_and(|l| l.get(PROBE_SOURCE_LABEL) == Some(&probe_source_hash()))
    }

    /// Creates (or re-creates) the probe image from [`rootfs_tar`].
    pub async fn build_probe_image(&self) -> Result<(), SandboxError> {
        let tag = probe_image_tag();
        let rootfs = rootfs_tar().map_err(|e| SandboxError::Build {
            image: tag.clone(),
            message: format!("building the rootfs tar: {e}"),
        })?;
        let label = format!("LABEL {PROBE_SOURCE_LABEL}={}", probe_source_hash());
        self.import_image(&tag, rootfs, &["ENTRYPOINT [\"/probe\"]", &label])
            .await?;
        tracing::info!(image = %tag, "probe image created");
        Ok(())
    }

    /// Imports `tag`: a from-scratch image of a static busybox (`busybox`: the binary, e.g.
    /// Debian's `busybox-static` `/bin/busybox`) as `/bin/busybox` with [`BUSYBOX_APPLETS`]
    /// linked to it, an empty 1777 `/tmp` and `/workspace`, `PATH=/bin`, `CMD ["sh"]`. For the
    /// interactive-access tests and benchmarks (a shell, `stty`, `httpd`, `nc`), no registry.
    pub async fn import_busybox_image(
        &self,
        tag: &str,
        busybox: &[u8],
    ) -> Result<(), SandboxError> {
        let rootfs = busybox_rootfs(busybox).map_err(|e| SandboxError::Build {
            image: tag.to_string(),
            message: format!("building the rootfs tar: {e}"),
        })?;
        self.import_image(tag, rootfs, &["ENV PATH=/bin", "CMD [\"sh\"]"])
            .await
    }

    /// Imports a root filesystem tar as image `tag`, applying Dockerfile-style `changes`
    /// (e.g. `ENTRYPOINT [...]`, `ENV K=V`). No registry, no build context.
    pub async fn import_image(
        &self,
        tag: &str,
        rootfs: Vec<u8>,
        changes: &[&str],
    ) -> Result<(), SandboxError> {
        let (repo, version) = crate::runtime::split_reference(tag);
        let opts = CreateImageOptionsBuilder::default()
            .from_src("-")
            .repo(repo)
            .tag(version)
            .changes(changes.iter().map(|c| c.to_string()).collect())
            .build();
        let mut stream = self.docker().create_image(
            Some(opts),
            Some(bollard::body_full(bytes::Bytes::from(rootfs))),
            None,
        );
        while let Some(ev) = stream.next().await {
            let ev = ev.map_err(|source| SandboxError::Docker {
                op: "import_image",
                target: tag.to_string(),
                source,
            })?;
            if let Some(msg) = ev.error_detail.and_then(|d| d.message) {
                return Err(SandboxError::Build {
                    image: tag.to_string(),
                    message: msg,
                });
            }
        }
        Ok(())
    }
}
