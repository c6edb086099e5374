//! How much an image pull has unpacked so far, measured while Docker pulls, so a pull can be
//! stopped at the provider's cap on unpacked size (`max_unpacked_gib`). A registry states only
//! compressed sizes, and a layer of zeros compresses about 1000:1: a 4 MiB download can unpack
//! to 4 GiB on the provider's disk.
//!
//! Docker reports the bytes it downloads and extracts *compressed*, so the gauge looks at the
//! disk instead: the growth of the used space of the filesystem of Docker's root directory
//! since the pull began, less the growth of `<root>/tmp`, where Docker keeps the compressed
//! layers it is still extracting. What it measures is an upper bound of what the pull
//! unpacked: anything else written to that filesystem meanwhile (another pull, a tenant's
//! workspace on the same disk) counts too, so a pull may be stopped early on a busy disk, never
//! late. A daemon whose root directory this process cannot see (a remote `DOCKER_HOST`) gives
//! no gauge: its pulls are checked once complete, by the image's size.

use std::path::{Path, PathBuf};

use crate::runtime::Sandbox;

/// Bytes used on the filesystem at `path` (`statvfs`: blocks in use, by their fragment size).
fn used_bytes(path: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(path).ok()?;
    Some(
        st.f_blocks
            .saturating_sub(st.f_bfree)
            .saturating_mul(st.f_frsize),
    )
}

/// Bytes allocated to the files below `dir` (two levels: Docker's download files and their
/// directories), `0` when it is missing.
fn allocated_below(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack = vec![(dir.to_path_buf(), 0u8)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                if depth < 2 {
                    stack.push((e.path(), depth + 1));
                }
            } else {
                total = total.saturating_add(m.blocks().saturating_mul(512));
            }
        }
    }
    total
}

/// The gauge of one pull (see the module docs).
#[derive(Clone, Debug)]
pub struct UnpackGauge {
    root: PathBuf,
    used_at_start: u64,
    tmp_at_start: u64,
}

impl UnpackGauge {
    /// A gauge over Docker's root directory `root`, from now; `None` when this process cannot
    /// see it.
    pub fn over(root: &Path) -> Option<Self> {
        let used_at_start = used_bytes(root)?;
        Some(Self {
            root: root.to_path_buf(),
            used_at_start,
            tmp_at_start: allocated_below(&root.join("tmp")),
        })
    }

    /// Bytes unpacked since the gauge started, at most.
    pub fn unpacked(&self) -> u64 {
        let Some(used) = used_bytes(&self.root) else {
            return 0;
        };
        unpacked_between(
            (self.used_at_start, used),
            (self.tmp_at_start, allocated_below(&self.root.join("tmp"))),
        )
    }
}

/// The growth of the filesystem's used bytes (`used`: at the start, now) less the growth of
/// Docker's downloads (`tmp`: at the start, now).
pub fn unpacked_between(used: (u64, u64), tmp: (u64, u64)) -> u64 {
    used.1
        .saturating_sub(used.0)
        .saturating_sub(tmp.1.saturating_sub(tmp.0))
}

impl Sandbox {
    /// A gauge for a pull starting now on this daemon ([`UnpackGauge`]); `None` when the
    /// daemon does not say where its root is or this process cannot see it.
    pub async fn unpack_gauge(&self) -> Option<UnpackGauge> {
        let info = self.docker().info().await.ok()?;
        let root = PathBuf::from(info.docker_root_dir?);
        tokio::task::spawn_blocking(move || UnpackGauge::over(&root))
            .await
            .ok()
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_gauge_counts_what_is_written_but_not_the_downloads() {
        // 24 MiB more in use, 8 MiB of it downloads: 16 MiB unpacked.
        assert_eq!(
            unpacked_between((100 << 20, 124 << 20), (1 << 20, 9 << 20)),
            16 << 20
        );
        // Downloads removed after extraction (tmp shrank) count nothing back.
        assert_eq!(unpacked_between((100, 150), (40, 0)), 50);
        assert_eq!(unpacked_between((100, 90), (0, 0)), 0);
        // The downloads' directory is measured by allocated blocks.
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("tmp/sub")).unwrap();
        let mut f = std::fs::File::create(d.path().join("tmp/sub/GetImageBlob123")).unwrap();
        f.write_all(&vec![1u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        assert!(allocated_below(&d.path().join("tmp")) >= 1 << 20);
        assert_eq!(allocated_below(&d.path().join("missing")), 0);
        assert!(UnpackGauge::over(d.path()).is_some());
        assert!(UnpackGauge::over(Path::new("/nonexistent/x")).is_none());
    }
}
