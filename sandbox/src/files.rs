//! Files into and out of a tenant's `/workspace` through Docker's archive API (never through
//! a host path): uploads are rewritten by [`rewrite`] before Docker extracts them, so only
//! plain files, directories and symlinks owned by the tenant's user land in the workspace.
//!
//! Docker resolves archive paths inside the container's root (symlinks included), and the
//! container's root is read-only, so an upload can only write into the workspace volume; the
//! workspace's size limit holds for uploads as for the tenant's own writes (ENOSPC ends the
//! upload with that error).

use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_tar::{Archive, Builder, EntryType, Header};

use crate::runtime::{Sandbox, SandboxError, docker_err};

/// The tenant's user and group (see `spec::NOBODY`).
pub const TENANT_ID: u64 = 65534;
/// Most entries one upload may hold.
pub const MAX_ENTRIES: u64 = 1_000_000;
/// Buffer on each side of [`rewrite`], bytes.
pub const COPY_BUFFER: usize = 256 * 1024;
/// Longest symlink target accepted, bytes.
pub const MAX_LINK: usize = 4096;

/// Why a tar stream was refused while being rewritten.
#[derive(Debug, thiserror::Error)]
pub enum SanitizeError {
    /// Reading or writing failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// An entry broke a rule.
    #[error("archive entry {path:?}: {problem}")]
    Refused {
        /// The entry's path as sent.
        path: String,
        /// What is wrong.
        problem: String,
    },
}

/// Checks and joins an entry path below `prefix`: relative, no `..`, no root or prefix parts.
fn entry_path(prefix: &str, raw: &Path) -> Result<PathBuf, String> {
    let mut out = PathBuf::from(prefix);
    for c in raw.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            _ => return Err("the path leaves the destination".into()),
        }
    }
    Ok(out)
}

/// How [`rewrite`] treats a stream.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    /// Put every entry below this path (relative to the workspace).
    pub prefix: String,
    /// Drop each entry's first path component (Docker names a downloaded path's entries after
    /// its last component); a directory root entry itself is then left out, a file root
    /// keeps its name.
    pub strip_first: bool,
    /// Leave out entries whose (rewritten) path is in this set (a resumed download).
    pub skip: std::collections::HashSet<String>,
    /// Leave out entries that are not files, directories or symlinks (a download) instead of
    /// refusing the stream (an upload).
    pub skip_others: bool,
}

/// What [`rewrite`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rewritten {
    /// Entries written.
    pub entries: u64,
    /// With `strip_first`: whether the root entry was a directory (`None`: no root seen).
    pub root_is_dir: Option<bool>,
}

/// Rewrites the tar stream `input` into `output` under `rules`: each entry's path below
/// `prefix`, its owner the tenant's user, its mode kept to the permission bits (no setuid,
/// setgid or sticky bit); only regular files, directories and symlinks pass (others, an
/// absolute path or `..` refuse the whole stream, unless `skip_others`). Streams: memory does
/// not grow with the archive.
/// `on_root` (with `strip_first`) learns whether the root entry is a directory as soon as it
/// is read, before anything is written. `input` is read in small steps (512-byte headers,
/// 8 KiB of data): give it a buffered reader, not a bare pipe or socket.
pub async fn rewrite<R, W>(
    input: R,
    output: W,
    rules: &Rules,
    mut on_root: Option<tokio::sync::oneshot::Sender<bool>>,
) -> Result<(Rewritten, W), SanitizeError>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    // The output is buffered: the tar code copies in 8 KiB steps, and each step on a pipe or
    // a socket would be a wake-up (measured: most of an upload's CPU before this buffer). The
    // input should come buffered (a `StreamReader` of chunks is), see the doc above.
    let mut archive = Archive::new(input);
    let mut entries = archive.entries()?;
    let mut builder = Builder::new(tokio::io::BufWriter::with_capacity(COPY_BUFFER, output));
    let mut done = Rewritten::default();
    let mut seen = 0u64;
    while let Some(entry) = entries.next().await {
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        let shown = raw.display().to_string();
        let refuse = |problem: String| SanitizeError::Refused {
            path: shown.clone(),
            problem,
        };
        seen += 1;
        if seen > MAX_ENTRIES {
            return Err(refuse(format!("more than {MAX_ENTRIES} entries")));
        }
        let kind = entry.header().entry_type();
        let relative = if rules.strip_first {
            let mut c = raw.components();
            c.next();
            let rest = c.as_path().to_path_buf();
            if rest.as_os_str().is_empty() {
                done.root_is_dir = Some(kind == EntryType::Directory);
                if let Some(tx) = on_root.take() {
                    let _ = tx.send(kind == EntryType::Directory);
                }
                if kind == EntryType::Directory {
                    continue;
                }
                // A file root keeps its name: the one entry of the stream.
                raw.clone()
            } else {
                rest
            }
        } else {
            raw.clone()
        };
        let path = entry_path(&rules.prefix, &relative).map_err(refuse)?;
        if rules.skip.contains(&path.display().to_string()) {
            continue;
        }
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        let mut h = Header::new_gnu();
        h.set_uid(TENANT_ID);
        h.set_gid(TENANT_ID);
        h.set_mtime(entry.header().mtime().unwrap_or(0));
        match kind {
            EntryType::Regular | EntryType::Continuous => {
                h.set_entry_type(EntryType::Regular);
                h.set_mode(mode);
                h.set_size(entry.effective_size());
                builder.append_data(&mut h, &path, &mut entry).await?;
            }
            EntryType::Directory => {
                h.set_entry_type(EntryType::Directory);
                h.set_mode(mode | 0o700);
                h.set_size(0);
                builder
                    .append_data(&mut h, &path, tokio::io::empty())
                    .await?;
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name()?
                    .ok_or_else(|| refuse("a symlink without a target".into()))?
                    .into_owned();
                if target.as_os_str().len() > MAX_LINK {
                    return Err(refuse("the symlink target is too long".into()));
                }
                h.set_entry_type(EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                h.set_link_name(&target)
                    .map_err(|e| refuse(format!("symlink target: {e}")))?;
                builder
                    .append_data(&mut h, &path, tokio::io::empty())
                    .await?;
            }
            // A global PAX header carries nothing for us (per-entry ones are read by the
            // reader itself).
            EntryType::XGlobalHeader => continue,
            _ if rules.skip_others => continue,
            other => {
                return Err(refuse(format!(
                    "{other:?} entries are not accepted (only files, directories and symlinks)"
                )));
            }
        }
        done.entries += 1;
    }
    let mut output = builder.into_inner().await?;
    output.flush().await?;
    Ok((done, output.into_inner()))
}

impl Sandbox {
    /// Extracts the tar stream `body` at the workspace (`/workspace`) of `container`. `body`
    /// should come from [`rewrite`].
    pub async fn put_workspace_archive(
        &self,
        container: &str,
        body: impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    ) -> Result<(), SandboxError> {
        let opts = bollard::query_parameters::UploadToContainerOptionsBuilder::default()
            .path(gridlease_protocol::transfer::WORKSPACE)
            .no_overwrite_dir_non_dir("true")
            .build();
        self.docker()
            .upload_to_container(container, Some(opts), bollard::body_try_stream(body))
            .await
            .map_err(docker_err("upload_to_container", container))
    }

    /// `path` (absolute, inside the container) of `container` as a tar stream.
    pub fn get_archive(
        &self,
        container: &str,
        path: &str,
    ) -> impl Stream<Item = Result<Bytes, SandboxError>> + Send + 'static {
        let opts = bollard::query_parameters::DownloadFromContainerOptionsBuilder::default()
            .path(path)
            .build();
        let target = container.to_string();
        self.docker()
            .download_from_container(container, Some(opts))
            .map(move |r| {
                r.map_err(|source| SandboxError::Docker {
                    op: "download_from_container",
                    target: target.clone(),
                    source,
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (path, kind, data, link target, mode)
    type Spec<'a> = (&'a str, EntryType, &'a [u8], Option<&'a str>, u32);

    async fn tar_of(entries: &[Spec<'_>]) -> Vec<u8> {
        let mut b = Builder::new(Vec::new());
        for (path, kind, data, link, mode) in entries {
            let mut h = Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(*mode);
            h.set_uid(0);
            h.set_size(data.len() as u64);
            if let Some(l) = link {
                h.set_link_name(l).unwrap();
            }
            b.append_data(&mut h, path, *data).await.unwrap();
        }
        b.into_inner().await.unwrap()
    }

    async fn read_back(tar: Vec<u8>) -> Vec<(String, EntryType, u64, u32, Vec<u8>)> {
        let mut a = Archive::new(tar.as_slice());
        let mut es = a.entries().unwrap();
        let mut out = Vec::new();
        while let Some(e) = es.next().await {
            let mut e = e.unwrap();
            let mut data = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut e, &mut data)
                .await
                .unwrap();
            out.push((
                e.path().unwrap().display().to_string(),
                e.header().entry_type(),
                e.header().uid().unwrap(),
                e.header().mode().unwrap(),
                data,
            ));
        }
        out
    }

    #[tokio::test]
    async fn entries_go_below_the_prefix_owned_by_the_tenant_without_special_bits() {
        let tar = tar_of(&[
            ("d", EntryType::Directory, b"", None, 0o755),
            ("d/f", EntryType::Regular, b"hello", None, 0o4755),
            ("d/l", EntryType::Symlink, b"", Some("f"), 0o777),
        ])
        .await;
        let rules = Rules {
            prefix: "data".into(),
            ..Rules::default()
        };
        let (n, out) = rewrite(tar.as_slice(), Vec::new(), &rules, None)
            .await
            .unwrap();
        assert_eq!(n.entries, 3);
        let back = read_back(out).await;
        assert_eq!(back[0].0, "data/d");
        assert_eq!(back[1].0, "data/d/f");
        assert_eq!(back[1].2, TENANT_ID);
        assert_eq!(back[1].3, 0o755, "setuid dropped");
        assert_eq!(back[1].4, b"hello");
        assert_eq!(back[2].1, EntryType::Symlink);
    }

    #[tokio::test]
    async fn a_download_drops_its_root_and_what_the_renter_has() {
        let tar = tar_of(&[
            ("out", EntryType::Directory, b"", None, 0o755),
            ("out/a", EntryType::Regular, b"aa", None, 0o644),
            ("out/b", EntryType::Regular, b"bb", None, 0o644),
        ])
        .await;
        let rules = Rules {
            strip_first: true,
            skip: ["a".to_string()].into(),
            skip_others: true,
            ..Rules::default()
        };
        let (r, out) = rewrite(tar.as_slice(), Vec::new(), &rules, None)
            .await
            .unwrap();
        assert_eq!(r.root_is_dir, Some(true));
        let back = read_back(out).await;
        assert_eq!(back.len(), 1);
        assert_eq!(
            (back[0].0.as_str(), back[0].4.as_slice()),
            ("b", &b"bb"[..])
        );
    }

    #[tokio::test]
    async fn devices_and_escaping_paths_refuse_the_stream() {
        for bad in [
            tar_of(&[("dev", EntryType::Char, b"", None, 0o666)]).await,
            tar_of(&[("fifo", EntryType::Fifo, b"", None, 0o666)]).await,
            tar_of(&[("hard", EntryType::Link, b"", Some("x"), 0o666)]).await,
        ] {
            assert!(matches!(
                rewrite(bad.as_slice(), Vec::new(), &Rules::default(), None).await,
                Err(SanitizeError::Refused { .. })
            ));
            // A download leaves them out instead.
            let rules = Rules {
                skip_others: true,
                ..Rules::default()
            };
            let (r, _) = rewrite(bad.as_slice(), Vec::new(), &rules, None)
                .await
                .unwrap();
            assert_eq!(r.entries, 0);
        }
        assert!(entry_path("", Path::new("../etc/passwd")).is_err());
        assert!(entry_path("", Path::new("/etc/passwd")).is_err());
        assert_eq!(
            entry_path("a", Path::new("./b/c")).unwrap(),
            PathBuf::from("a/b/c")
        );
    }
}
