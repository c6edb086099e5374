//! Files into and out of a tenant's `/workspace` through Docker's archive API (never through
//! a host path): uploads are rewritten by [`rewrite`] before Docker extracts them, so only
//! plain files, directories and symlinks owned by the tenant's user land in the workspace.
//!
//! Docker resolves archive paths inside the container's root (symlinks included), and the
//! container's root is read-only, so an upload can only write into the workspace volume; the
//! workspace's size limit holds for uploads as for the tenant's own writes (ENOSPC ends the
//! upload with that error).

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tar::EntryType;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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

/// Rewrites the tar stream `input` into `output` under `rules` (see [`TarFilter`], which does
/// the work): each entry's path below `prefix`, its owner the tenant's user, its mode kept to
/// the permission bits (no setuid, setgid or sticky bit); only regular files, directories and
/// symlinks pass (others, an absolute path or `..` refuse the whole stream, unless
/// `skip_others`). Streams: memory does not grow with the archive.
/// `on_root` (with `strip_first`) learns whether the root entry is a directory as soon as it
/// is read, before anything is written.
pub async fn rewrite<R, W>(
    mut input: R,
    mut output: W,
    rules: &Rules,
    mut on_root: Option<tokio::sync::oneshot::Sender<bool>>,
) -> Result<(Rewritten, W), SanitizeError>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut filter = TarFilter::new(rules.clone());
    let mut buf = bytes::BytesMut::new();
    let mut out = Vec::new();
    loop {
        buf.reserve(COPY_BUFFER);
        let n = input.read_buf(&mut buf).await?;
        if n == 0 {
            break;
        }
        filter.push(buf.split().freeze(), &mut out)?;
        if let Some(root) = filter.root_is_dir()
            && let Some(tx) = on_root.take()
        {
            let _ = tx.send(root);
        }
        for piece in out.drain(..) {
            output.write_all(&piece).await?;
        }
    }
    let done = filter.finish(&mut out)?;
    for piece in out.drain(..) {
        output.write_all(&piece).await?;
    }
    output.flush().await?;
    Ok((done, output))
}

/// Most bytes of a GNU long name or long link entry.
const MAX_LONG_NAME: u64 = 64 * 1024;
/// Most bytes of one PAX extended header (per entry or global).
const MAX_PAX: u64 = 1 << 20;
/// A tar block.
const BLOCK: usize = 512;
/// Zeros for padding and the end of an archive.
static ZEROS: [u8; 2 * BLOCK] = [0; 2 * BLOCK];

/// Where a [`TarFilter`] is in its input.
#[derive(Clone, Copy, Debug)]
enum State {
    /// Collecting a 512-byte header.
    Header,
    /// Collecting the data of an extension entry (GNU long name `L` or link `K`, PAX `x` or
    /// `g`) of `size` bytes.
    Extension { kind: u8, size: usize },
    /// Passing (`emit`) or dropping `left` bytes of an entry's data, then `pad` bytes of
    /// padding.
    Data { left: u64, pad: usize, emit: bool },
    /// Dropping `left` bytes of padding.
    Padding { left: usize },
    /// Past the end-of-archive block: the rest is ignored.
    End,
}

/// What extension entries said about the next entry.
#[derive(Debug, Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
}

/// The rule of [`rewrite`] as a push parser over pieces of a tar stream, without copying the
/// entries' data: [`push`](Self::push) hands out rebuilt headers and, for the data, slices of
/// the very buffers it was given. Feeding it what arrives from the network or from Docker
/// and handing the pieces straight on is how `gridlease cp` moves files without the copies
/// of a reader/writer pipeline. Headers are checked (checksum, size) and rebuilt from
/// scratch (GNU format; GNU long-name and long-link entries where a path or a link target
/// does not fit), so nothing of an input header but its path, link target, kind, size,
/// permission bits and mtime reaches the output. Memory is bounded: a header, or one
/// extension entry (at most 64 KiB for long names, 1 MiB for PAX headers).
#[derive(Debug)]
pub struct TarFilter {
    rules: Rules,
    state: State,
    /// A header or an extension's data, being collected.
    acc: bytes::BytesMut,
    pending: Pending,
    done: Rewritten,
    seen: u64,
}

impl TarFilter {
    /// A filter applying `rules`.
    pub fn new(rules: Rules) -> Self {
        TarFilter {
            rules,
            state: State::Header,
            acc: bytes::BytesMut::new(),
            pending: Pending::default(),
            done: Rewritten::default(),
            seen: 0,
        }
    }

    /// With `strip_first`: whether the root entry is a directory, once it was read.
    pub fn root_is_dir(&self) -> Option<bool> {
        self.done.root_is_dir
    }

    /// Entries written so far.
    pub fn entries(&self) -> u64 {
        self.done.entries
    }

    /// Takes the next piece of the input stream; appends what it rewrote to `out` (headers,
    /// slices of `input`, padding). An error refuses the whole stream.
    pub fn push(&mut self, mut input: Bytes, out: &mut Vec<Bytes>) -> Result<(), SanitizeError> {
        while !input.is_empty() {
            match self.state {
                State::Header => {
                    if self.collect(&mut input, BLOCK) {
                        let block = self.acc.split().freeze();
                        self.header(&block, out)?;
                    }
                }
                State::Extension { kind, size } => {
                    if self.collect(&mut input, size) {
                        let data = self.acc.split().freeze();
                        self.extension(kind, &data)?;
                        self.state = State::Padding {
                            left: padding(size as u64),
                        };
                    }
                }
                State::Data { left, pad, emit } => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(input.len());
                    let piece = input.split_to(take);
                    if emit {
                        out.push(piece);
                    }
                    let left = left - take as u64;
                    if left > 0 {
                        self.state = State::Data { left, pad, emit };
                    } else {
                        if emit && pad > 0 {
                            out.push(Bytes::from_static(&ZEROS[..pad]));
                        }
                        self.state = State::Padding { left: pad };
                    }
                }
                State::Padding { left } => {
                    let take = left.min(input.len());
                    let _ = input.split_to(take);
                    self.state = if left > take {
                        State::Padding { left: left - take }
                    } else {
                        State::Header
                    };
                }
                State::End => return Ok(()),
            }
            if let State::Padding { left: 0 } = self.state {
                self.state = State::Header;
            }
        }
        Ok(())
    }

    /// The input ended: appends the end-of-archive blocks to `out` and says what was
    /// written. An input that ended inside an entry is refused (a truncated stream); one that
    /// ends between entries without an end block is accepted, as tar readers do.
    pub fn finish(self, out: &mut Vec<Bytes>) -> Result<Rewritten, SanitizeError> {
        let between_entries = matches!(self.state, State::Header)
            && self.acc.is_empty()
            && self.pending.path.is_none()
            && self.pending.link.is_none()
            && self.pending.size.is_none();
        if !(between_entries || matches!(self.state, State::End)) {
            return Err(truncated());
        }
        out.push(Bytes::from_static(&ZEROS));
        Ok(self.done)
    }

    /// Moves bytes from `input` into `acc` until it holds `want`; whether it does.
    fn collect(&mut self, input: &mut Bytes, want: usize) -> bool {
        let take = (want - self.acc.len()).min(input.len());
        self.acc.extend_from_slice(&input.split_to(take));
        self.acc.len() == want
    }

    fn extension(&mut self, kind: u8, data: &[u8]) -> Result<(), SanitizeError> {
        match kind {
            b'L' => self.pending.path = Some(until_nul(data).to_vec()),
            b'K' => self.pending.link = Some(until_nul(data).to_vec()),
            b'x' => {
                for ext in tar::PaxExtensions::new(data) {
                    let ext = ext.map_err(|e| bad_header(format!("a PAX header: {e}")))?;
                    match ext.key_bytes() {
                        b"path" => self.pending.path = Some(ext.value_bytes().to_vec()),
                        b"linkpath" => self.pending.link = Some(ext.value_bytes().to_vec()),
                        b"size" => {
                            let size = ext
                                .value()
                                .ok()
                                .and_then(|v| v.parse::<u64>().ok())
                                .ok_or_else(|| bad_header("a PAX size that is not a number"))?;
                            self.pending.size = Some(size);
                        }
                        _ => {}
                    }
                }
            }
            // A global PAX header carries nothing for us.
            _ => {}
        }
        Ok(())
    }

    fn header(&mut self, block: &[u8], out: &mut Vec<Bytes>) -> Result<(), SanitizeError> {
        if block.iter().all(|b| *b == 0) {
            self.state = State::End;
            return Ok(());
        }
        let h = tar::Header::from_byte_slice(block);
        let sum: u32 = block[..148]
            .iter()
            .chain(&[b' '; 8])
            .chain(&block[156..])
            .map(|b| u32::from(*b))
            .sum();
        if h.cksum().ok() != Some(sum) {
            return Err(bad_header("a header's checksum does not match"));
        }
        let kind = h.entry_type();
        let size = h.entry_size().map_err(|e| bad_header(e.to_string()))?;
        let cap = match kind.as_byte() {
            b'L' | b'K' => Some(MAX_LONG_NAME),
            b'x' | b'g' => Some(MAX_PAX),
            _ => None,
        };
        if let Some(cap) = cap {
            if size > cap {
                return Err(bad_header(format!(
                    "an extension header of {size} bytes (at most {cap})"
                )));
            }
            self.state = if size == 0 {
                State::Header
            } else {
                State::Extension {
                    kind: kind.as_byte(),
                    size: size as usize,
                }
            };
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let size = pending.size.unwrap_or(size);
        let raw_bytes = pending.path.unwrap_or_else(|| h.path_bytes().into_owned());
        let link = pending
            .link
            .or_else(|| h.link_name_bytes().map(|l| l.into_owned()));
        let pad = padding(size);
        // Whatever happens to the entry, its data is consumed.
        self.state = State::Data {
            left: size,
            pad,
            emit: false,
        };
        if size == 0 {
            self.state = State::Header;
        }
        let raw = Path::new(std::ffi::OsStr::from_bytes(&raw_bytes));
        let shown = raw.display().to_string();
        let refuse = |problem: String| SanitizeError::Refused {
            path: shown.clone(),
            problem,
        };
        self.seen += 1;
        if self.seen > MAX_ENTRIES {
            return Err(refuse(format!("more than {MAX_ENTRIES} entries")));
        }
        let relative = if self.rules.strip_first {
            let mut c = raw.components();
            c.next();
            let rest = c.as_path().to_path_buf();
            if rest.as_os_str().is_empty() {
                let dir = kind == EntryType::Directory;
                self.done.root_is_dir = Some(dir);
                if dir {
                    return Ok(());
                }
                // A file root keeps its name: the one entry of the stream.
                raw.to_path_buf()
            } else {
                rest
            }
        } else {
            raw.to_path_buf()
        };
        let path = entry_path(&self.rules.prefix, &relative).map_err(refuse)?;
        if self.rules.skip.contains(&path.display().to_string()) {
            return Ok(());
        }
        let mode = h.mode().unwrap_or(0o644) & 0o777;
        let mut nh = tar::Header::new_gnu();
        nh.set_uid(TENANT_ID);
        nh.set_gid(TENANT_ID);
        nh.set_mtime(h.mtime().unwrap_or(0));
        let mut emit = false;
        let mut long_link = None;
        match kind {
            EntryType::Regular | EntryType::Continuous => {
                nh.set_entry_type(EntryType::Regular);
                nh.set_mode(mode);
                nh.set_size(size);
                emit = true;
            }
            EntryType::Directory => {
                nh.set_entry_type(EntryType::Directory);
                nh.set_mode(mode | 0o700);
                nh.set_size(0);
            }
            EntryType::Symlink => {
                let target = link.ok_or_else(|| refuse("a symlink without a target".into()))?;
                if target.len() > MAX_LINK {
                    return Err(refuse("the symlink target is too long".into()));
                }
                nh.set_entry_type(EntryType::Symlink);
                nh.set_mode(0o777);
                nh.set_size(0);
                if nh.set_link_name_literal(&target).is_err() {
                    long_link = Some(target);
                }
            }
            _ if self.rules.skip_others => return Ok(()),
            other => {
                return Err(refuse(format!(
                    "{other:?} entries are not accepted (only files, directories and symlinks)"
                )));
            }
        }
        let path_bytes = path.as_os_str().as_bytes();
        if let Some(target) = long_link {
            out.push(long_entry(b'K', &target));
            let keep = nh.as_old().linkname.len();
            nh.as_old_mut().linkname.copy_from_slice(&target[..keep]);
        }
        if let Err(e) = nh.set_path(&path) {
            if path_bytes.len() <= nh.as_old().name.len() {
                return Err(refuse(format!("its path: {e}")));
            }
            out.push(long_entry(b'L', path_bytes));
            let keep = nh.as_old().name.len();
            nh.as_old_mut().name.copy_from_slice(&path_bytes[..keep]);
        }
        nh.set_cksum();
        out.push(Bytes::copy_from_slice(nh.as_bytes()));
        self.done.entries += 1;
        if emit && size > 0 {
            self.state = State::Data {
                left: size,
                pad,
                emit: true,
            };
        }
        Ok(())
    }
}

/// A GNU long-name (`L`) or long-link (`K`) entry carrying `value`, as GNU tar writes it.
fn long_entry(kind: u8, value: &[u8]) -> Bytes {
    let mut h = tar::Header::new_gnu();
    let name = b"././@LongLink";
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(value.len() as u64 + 1);
    h.set_entry_type(EntryType::new(kind));
    h.set_cksum();
    let mut b = bytes::BytesMut::with_capacity(2 * BLOCK + value.len());
    b.extend_from_slice(h.as_bytes());
    b.extend_from_slice(value);
    b.extend_from_slice(&[0]);
    b.extend_from_slice(&ZEROS[..padding(value.len() as u64 + 1)]);
    b.freeze()
}

/// Padding after `size` bytes of data, to the next block.
fn padding(size: u64) -> usize {
    ((BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64) as usize
}

fn until_nul(data: &[u8]) -> &[u8] {
    data.iter()
        .position(|b| *b == 0)
        .map_or(data, |n| &data[..n])
}

fn bad_header(problem: impl Into<String>) -> SanitizeError {
    SanitizeError::Io(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        problem.into(),
    ))
}

fn truncated() -> SanitizeError {
    SanitizeError::Io(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "the archive ended inside an entry",
    ))
}

/// How long one Docker archive request may take. bollard times a request as a whole until
/// the answer's headers, its body included (two minutes by default, what every other
/// request keeps): an upload streamed from a renter's home link (1 GiB at 20 Mbit/s is about
/// 7 minutes), or a download while a loaded daemon prepares a large tree, takes longer. A
/// transfer that stops is ended by its stream instead: the renter's connection closing ends
/// the request body (an upload) or the reader (a download).
pub const ARCHIVE_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

impl Sandbox {
    /// The Docker client for archive requests ([`ARCHIVE_REQUEST_TIMEOUT`]).
    fn archive_client(&self) -> bollard::Docker {
        self.docker().clone().with_timeout(ARCHIVE_REQUEST_TIMEOUT)
    }

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
        self.archive_client()
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
        self.archive_client()
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
    use tokio_tar::{Archive, Builder, EntryType, Header};

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

    /// An archive with what real ones carry: GNU long names and long link targets, PAX
    /// headers (a path, a size, an xattr), a file whose size is not a multiple of 512, an
    /// empty file, a directory with data, and a tail after the end blocks.
    /// (path, kind byte, data, link target)
    type Want = (String, u8, Vec<u8>, Option<String>);
    /// (path, kind byte, data, link target, uid, mode)
    type Got = (String, u8, Vec<u8>, Option<String>, u64, u32);

    fn awkward_tar() -> (Vec<u8>, Vec<Want>) {
        let long_dir = "d".repeat(120);
        let long_file = format!("{long_dir}/{}", "f".repeat(150));
        let long_target = format!("{}x", "t/".repeat(90));
        let big: Vec<u8> = (0..70_001u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut b = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        b.append_data(&mut dir.clone(), &long_dir, std::io::empty())
            .unwrap();
        let mut f = tar::Header::new_gnu();
        f.set_entry_type(tar::EntryType::Regular);
        f.set_mode(0o6755);
        f.set_size(big.len() as u64);
        b.append_data(&mut f.clone(), &long_file, big.as_slice())
            .unwrap();
        f.set_size(0);
        b.append_data(&mut f.clone(), "empty", std::io::empty())
            .unwrap();
        let mut l = tar::Header::new_gnu();
        l.set_entry_type(tar::EntryType::Symlink);
        l.set_size(0);
        b.append_link(&mut l, "link", &long_target).unwrap();
        // PAX: a path and an xattr for the next entry (as Docker writes them).
        b.append_pax_extensions([
            ("path", &b"pax/named"[..]),
            ("SCHILY.xattr.user.x", &b"v"[..]),
        ])
        .unwrap();
        f.set_size(5);
        b.append_data(&mut f.clone(), "ignored-name", &b"hello"[..])
            .unwrap();
        // A directory entry that (wrongly) carries data: the data is dropped.
        dir.set_size(3);
        dir.set_path("withdata").unwrap();
        dir.set_cksum();
        b.append(&dir, &b"xyz"[..]).unwrap();
        let mut tar = b.into_inner().unwrap();
        tar.extend_from_slice(&[7; 300]);
        let want = vec![
            (long_dir.clone(), b'5', vec![], None),
            (long_file, b'0', big, None),
            ("empty".into(), b'0', vec![], None),
            ("link".into(), b'2', vec![], Some(long_target)),
            ("pax/named".into(), b'0', b"hello".to_vec(), None),
            ("withdata".into(), b'5', vec![], None),
        ];
        (tar, want)
    }

    /// Reads a tar back with the `tar` crate: (path, kind, data, link, uid, mode).
    fn entries_of(tar: &[u8]) -> Vec<Got> {
        let mut a = tar::Archive::new(tar);
        a.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut data).unwrap();
                let h = e.header().clone();
                (
                    e.path().unwrap().display().to_string(),
                    h.entry_type().as_byte(),
                    data,
                    e.link_name().unwrap().map(|l| l.display().to_string()),
                    h.uid().unwrap(),
                    h.mode().unwrap(),
                )
            })
            .collect()
    }

    fn filter_in_pieces(
        tar: &[u8],
        piece: usize,
        rules: &Rules,
    ) -> Result<(Rewritten, Vec<u8>), SanitizeError> {
        let mut f = TarFilter::new(rules.clone());
        let mut out = Vec::new();
        for p in tar.chunks(piece) {
            f.push(Bytes::copy_from_slice(p), &mut out)?;
        }
        let r = f.finish(&mut out)?;
        Ok((r, out.concat()))
    }

    #[test]
    fn the_filter_gives_the_same_archive_however_the_input_is_cut() {
        let (tar, want) = awkward_tar();
        let rules = Rules {
            prefix: "in".into(),
            ..Rules::default()
        };
        let (whole_r, whole) = filter_in_pieces(&tar, tar.len(), &rules).unwrap();
        assert_eq!(whole_r.entries, want.len() as u64);
        let got = entries_of(&whole);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.0, format!("in/{}", w.0));
            assert_eq!((g.1, &g.2, &g.3), (w.1, &w.2, &w.3), "{}", w.0);
            assert_eq!(g.4, TENANT_ID);
            assert_eq!(g.5 & 0o7000, 0, "no special bits on {}", w.0);
        }
        for piece in [1, 2, 7, 100, 511, 512, 513, 1000, 4096, 65_536] {
            let (r, out) = filter_in_pieces(&tar, piece, &rules).unwrap();
            assert_eq!((r, &out), (whole_r, &whole), "pieces of {piece}");
        }
    }

    #[test]
    fn file_data_leaves_the_filter_as_slices_of_its_input() {
        let data = vec![5u8; 300_000];
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, "f", data.as_slice()).unwrap();
        let input = Bytes::from(b.into_inner().unwrap());
        let range = input.as_ptr() as usize..input.as_ptr() as usize + input.len();
        let mut f = TarFilter::new(Rules::default());
        let mut out = Vec::new();
        f.push(input.clone(), &mut out).unwrap();
        let biggest = out.iter().max_by_key(|p| p.len()).unwrap();
        assert_eq!(biggest.len(), data.len());
        assert!(range.contains(&(biggest.as_ptr() as usize)), "not copied");
    }

    #[test]
    fn damaged_truncated_or_oversized_archives_are_refused() {
        let (tar, _) = awkward_tar();
        let rules = Rules::default();
        // Cut inside the big file's data, inside a header, inside an extension.
        for cut in [700, 2000, 40_000, 512 + 100] {
            let err = filter_in_pieces(&tar[..cut], 4096, &rules).unwrap_err();
            assert!(err.to_string().contains("ended inside"), "{cut}: {err}");
        }
        // A flipped byte in the first header fails its checksum.
        let mut bad = tar.clone();
        bad[3] ^= 1;
        let err = filter_in_pieces(&bad, 4096, &rules).unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
        // A long name beyond the cap is refused before it is collected.
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_entry_type(tar::EntryType::new(b'L'));
        h.set_size(MAX_LONG_NAME + 1);
        h.set_cksum();
        let err = filter_in_pieces(h.as_bytes(), 512, &rules).unwrap_err();
        assert!(err.to_string().contains("extension header"), "{err}");
        // No entries and no end block: an empty archive, as tar readers take it.
        let (r, out) = filter_in_pieces(&[], 1, &rules).unwrap();
        assert_eq!((r.entries, out.len()), (0, 1024));
    }
}
