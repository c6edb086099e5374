//! The workspace seen from the host: every name is resolved beneath the workspace's root
//! directory with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)`, so no symbolic link (the tenant's or an upload's own) is ever followed,
//! nothing outside the workspace's filesystem is reached, and a tenant that swaps a directory
//! for a link while a copy runs makes the copy fail, not escape.
//!
//! [`Upload`] applies the entries of a [`TarReader`](super::TarReader) to the workspace;
//! [`download`] walks a path of it and writes the tar stream a download sends.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{
    AtFlags, Dir, FileType, Gid, Mode, OFlags, ResolveFlags, SeekFrom, Stat, Timespec, Timestamps,
    Uid,
};
use rustix::io::Errno;

use super::tar_in::{Entry, EntryKind, Event};
use super::tar_out::{self, OutKind};
use super::{MAX_ENTRIES, TransferError};

/// How every name is resolved.
pub(super) const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// Deepest directory a download descends into (below the copied path).
pub const MAX_DEPTH: usize = 128;
/// Bytes of tar a download hands on at a time.
pub const OUT_PIECE: usize = 512 * 1024;
/// A file with more data extents than this travels whole (holes as zeros).
pub const MAX_EXTENTS: usize = 65_536;
/// Alignment of the extents a download sends (a multiple of the tar block).
const EXTENT_ALIGN: u64 = 4096;

/// The root directory of a lease's workspace filesystem, opened on the host, and the owner
/// that files written into it get (the owner of that directory: the tenant's user).
#[derive(Debug)]
pub struct WorkspaceFs {
    pub(super) root: OwnedFd,
    pub(super) uid: Uid,
    pub(super) gid: Gid,
}

pub(super) fn errno_io(e: Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.raw_os_error())
}

/// An error of an operation on `path` (workspace-relative, as the renter names it).
fn fs_error(e: Errno, path: &Path) -> TransferError {
    let shown = path.display().to_string();
    let refuse = |problem: &str| TransferError::Refused {
        path: shown.clone(),
        problem: problem.to_string(),
    };
    match e {
        Errno::LOOP => refuse("a symbolic link is in its way (copies never follow links)"),
        Errno::NOTDIR => refuse("a part of its path is not a directory"),
        Errno::XDEV => refuse("its path leaves the workspace"),
        Errno::ISDIR => refuse("it is a directory"),
        Errno::NOENT => TransferError::Missing { path: shown },
        Errno::NOSPC | Errno::DQUOT => TransferError::Full { path: shown },
        Errno::NAMETOOLONG => refuse("its name is too long"),
        other => TransferError::Io(std::io::Error::other(format!(
            "{shown}: {}",
            errno_io(other)
        ))),
    }
}

pub(super) fn display(p: &Path) -> &Path {
    if p.as_os_str().is_empty() {
        Path::new(".")
    } else {
        p
    }
}

impl WorkspaceFs {
    /// Opens the workspace whose filesystem is mounted at `mount` (on the host).
    pub fn open(mount: &Path) -> std::io::Result<Self> {
        let root = rustix::fs::open(
            mount,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno_io)?;
        let st = rustix::fs::fstat(&root).map_err(errno_io)?;
        Ok(Self {
            root,
            uid: Uid::from_raw(st.st_uid),
            gid: Gid::from_raw(st.st_gid),
        })
    }

    /// Opens `rel` (workspace-relative) with `flags`, resolved beneath the root.
    pub(super) fn open_at(&self, rel: &Path, flags: OFlags) -> Result<OwnedFd, Errno> {
        rustix::fs::openat2(
            &self.root,
            display(rel),
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
    }

    /// The directory `rel`, made (with its missing parents, owned by the tenant) when
    /// `create`.
    fn dir(&self, rel: &Path, create: bool) -> Result<OwnedFd, TransferError> {
        let flags = OFlags::PATH | OFlags::DIRECTORY;
        match self.open_at(rel, flags) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) if create => {}
            Err(e) => return Err(fs_error(e, rel)),
        }
        let mut cur = self
            .open_at(Path::new(""), flags)
            .map_err(|e| fs_error(e, rel))?;
        let mut walked = PathBuf::new();
        for c in rel.components() {
            let Component::Normal(name) = c else {
                return Err(fs_error(Errno::XDEV, rel));
            };
            walked.push(name);
            cur = match rustix::fs::openat2(
                &cur,
                name,
                flags | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            ) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => self.make_dir(&cur, name, 0o755, &walked)?,
                Err(e) => return Err(fs_error(e, &walked)),
            };
        }
        Ok(cur)
    }

    /// Makes the directory `name` in `parent` (already there as a directory: fine), owned by
    /// the tenant with `mode`; returns it opened.
    fn make_dir(
        &self,
        parent: &OwnedFd,
        name: &OsStr,
        mode: u32,
        shown: &Path,
    ) -> Result<OwnedFd, TransferError> {
        match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(fs_error(e, shown)),
        }
        // Opened before it is changed, without following anything: a link put in its place
        // meanwhile fails here instead of redirecting the chown.
        let fd = rustix::fs::openat2(
            parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| fs_error(e, shown))?;
        rustix::fs::fchown(&fd, Some(self.uid), Some(self.gid)).map_err(|e| fs_error(e, shown))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o777))
            .map_err(|e| fs_error(e, shown))?;
        rustix::fs::openat2(
            parent,
            name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| fs_error(e, shown))
    }
}

/// Whether symlink `target`, placed at `link` (workspace-relative), resolves inside the
/// workspace: an absolute target must name `/workspace` or a path below it, a relative one
/// must not climb above the workspace's root from the link's directory. Lexical: what the
/// target names later does not matter, as nothing on the host ever follows it.
pub fn link_stays_inside(link: &Path, target: &[u8]) -> bool {
    let target = Path::new(OsStr::from_bytes(target));
    let (mut depth, rest) = if target.is_absolute() {
        match target.strip_prefix(gridlease_protocol::transfer::WORKSPACE) {
            Ok(rest) => (0usize, rest),
            Err(_) => return false,
        }
    } else {
        let parent = link.parent().unwrap_or(Path::new(""));
        (parent.components().count(), target)
    };
    for c in rest.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// The file being written by an [`Upload`].
#[derive(Debug)]
struct Open {
    file: std::fs::File,
    left: u64,
    path: PathBuf,
    mode: u32,
    mtime: u64,
}

/// An upload into the workspace: [`apply`](Self::apply) each event of a
/// [`TarReader`](super::TarReader), then [`finish`](Self::finish). Blocking I/O: run it off the
/// async runtime. Files, directories and symlinks only; every entry becomes the tenant's, with
/// its permission bits (never setuid, setgid or sticky) and modification time; a file in the
/// way is replaced (never written through), a directory in the way of a file or link refuses
/// the upload, as does a symlink whose target leaves the workspace
/// ([`link_stays_inside`]) and any entry below a symlink.
#[derive(Debug)]
pub struct Upload<'a> {
    fs: &'a WorkspaceFs,
    prefix: PathBuf,
    open: Option<Open>,
    /// The parent directory of the last entry, kept for the next one.
    parent: Option<(PathBuf, OwnedFd)>,
    entries: u64,
}

impl<'a> Upload<'a> {
    /// An upload into `prefix` (workspace-relative; made if missing).
    pub fn new(fs: &'a WorkspaceFs, prefix: &Path) -> Result<Self, TransferError> {
        let dir = fs.dir(prefix, true)?;
        Ok(Self {
            fs,
            prefix: prefix.to_path_buf(),
            open: None,
            parent: Some((prefix.to_path_buf(), dir)),
            entries: 0,
        })
    }

    /// Entries made so far.
    pub fn entries(&self) -> u64 {
        self.entries
    }

    /// Applies one event.
    pub fn apply(&mut self, event: Event) -> Result<(), TransferError> {
        match event {
            Event::Data(bytes) => {
                let Some(open) = self.open.as_mut() else {
                    return Err(TransferError::Io(std::io::Error::other(
                        "file data without a file",
                    )));
                };
                if bytes.len() as u64 > open.left {
                    return Err(TransferError::Io(std::io::Error::other(
                        "more file data than its header said",
                    )));
                }
                open.left -= bytes.len() as u64;
                if let Err(e) = open.file.write_all(&bytes) {
                    return Err(match e.raw_os_error().map(Errno::from_raw_os_error) {
                        Some(errno) => fs_error(errno, &open.path),
                        None => TransferError::Io(e),
                    });
                }
                if open.left == 0 {
                    self.close()?;
                }
                Ok(())
            }
            Event::Entry(entry) => {
                if self.open.is_some() {
                    return Err(TransferError::Io(std::io::Error::other(
                        "an entry began before the previous file's data ended",
                    )));
                }
                self.entry(entry)
            }
        }
    }

    /// The stream ended: every file must be complete.
    pub fn finish(self) -> Result<u64, TransferError> {
        if let Some(open) = &self.open {
            return Err(TransferError::Refused {
                path: open.path.display().to_string(),
                problem: "the archive ended inside it".into(),
            });
        }
        Ok(self.entries)
    }

    /// The current file's data is all written: owner, mode and time.
    fn close(&mut self) -> Result<(), TransferError> {
        let Some(open) = self.open.take() else {
            return Ok(());
        };
        let fail = |e: Errno| fs_error(e, &open.path);
        rustix::fs::fchown(&open.file, Some(self.fs.uid), Some(self.fs.gid)).map_err(fail)?;
        rustix::fs::fchmod(&open.file, Mode::from_raw_mode(open.mode & 0o777)).map_err(fail)?;
        let t = Timespec {
            tv_sec: i64::try_from(open.mtime).unwrap_or(i64::MAX),
            tv_nsec: 0,
        };
        rustix::fs::futimens(
            &open.file,
            &Timestamps {
                last_access: t,
                last_modification: t,
            },
        )
        .map_err(fail)?;
        Ok(())
    }

    /// The opened parent directory of `path` (workspace-relative), made if missing.
    fn parent_of(&mut self, path: &Path) -> Result<&OwnedFd, TransferError> {
        let parent = path.parent().unwrap_or(Path::new("")).to_path_buf();
        let cached = self.parent.as_ref().is_some_and(|(p, _)| *p == parent);
        if !cached {
            let fd = self.fs.dir(&parent, true)?;
            self.parent = Some((parent, fd));
        }
        Ok(&self.parent.as_ref().unwrap_or_else(|| unreachable!()).1)
    }

    fn entry(&mut self, entry: Entry) -> Result<(), TransferError> {
        let path = self.prefix.join(&entry.path);
        let Some(name) = path.file_name().map(OsStr::to_os_string) else {
            return Err(fs_error(Errno::XDEV, &path));
        };
        let shown = path.clone();
        let refuse = |problem: String| TransferError::Refused {
            path: shown.display().to_string(),
            problem,
        };
        match entry.kind {
            EntryKind::Dir => {
                let fs = self.fs;
                let parent = self.parent_of(&path)?;
                match rustix::fs::statat(parent, &name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
                    Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                        return Err(refuse(
                            "it is a symbolic link, and copies never follow links in the workspace"
                                .into(),
                        ));
                    }
                    Ok(_) => return Err(refuse("it exists and is not a directory".into())),
                    Err(Errno::NOENT) => {
                        fs.make_dir(parent, &name, entry.mode | 0o700, &path)?;
                    }
                    Err(e) => return Err(fs_error(e, &path)),
                }
            }
            EntryKind::File => {
                let parent = self.parent_of(&path)?;
                clear(parent, &name, &path)?;
                let fd = rustix::fs::openat2(
                    parent,
                    &name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                    RESOLVE,
                )
                .map_err(|e| match e {
                    Errno::EXIST => refuse("it changed while being replaced".into()),
                    e => fs_error(e, &path),
                })?;
                self.open = Some(Open {
                    file: std::fs::File::from(fd),
                    left: entry.size,
                    path,
                    mode: entry.mode,
                    mtime: entry.mtime,
                });
                if entry.size == 0 {
                    self.close()?;
                }
            }
            EntryKind::Symlink(target) => {
                if !link_stays_inside(&path, &target) {
                    return Err(refuse(format!(
                        "a symlink to {:?}, outside the workspace",
                        String::from_utf8_lossy(&target)
                    )));
                }
                let (uid, gid) = (self.fs.uid, self.fs.gid);
                let parent = self.parent_of(&path)?;
                clear(parent, &name, &path)?;
                rustix::fs::symlinkat(OsStr::from_bytes(&target), parent, &name)
                    .map_err(|e| fs_error(e, &path))?;
                rustix::fs::chownat(
                    parent,
                    &name,
                    Some(uid),
                    Some(gid),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(|e| fs_error(e, &path))?;
            }
            EntryKind::Other(kind) => {
                return Err(refuse(format!(
                    "{} entries are not accepted (only files, directories and symlinks)",
                    kind_name(kind)
                )));
            }
        }
        self.entries += 1;
        Ok(())
    }
}

/// Removes what is at `name` in `parent` unless it is a directory (then the entry is refused:
/// a file never replaces a directory).
fn clear(parent: &OwnedFd, name: &OsStr, shown: &Path) -> Result<(), TransferError> {
    match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            Err(TransferError::Refused {
                path: shown.display().to_string(),
                problem: "a directory is in the way".into(),
            })
        }
        Ok(_) => match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(fs_error(e, shown)),
        },
        Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(fs_error(e, shown)),
    }
}

fn kind_name(kind: u8) -> &'static str {
    match kind {
        b'1' => "hard link",
        b'3' => "character device",
        b'4' => "block device",
        b'6' => "FIFO",
        b'S' => "sparse file",
        _ => "special",
    }
}

/// What a download's walk hands on, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Out {
    /// First: whether the copied path is a directory (its entries follow, named relative to
    /// it) or a file (one entry follows).
    Root {
        /// A directory.
        directory: bool,
    },
    /// The next bytes of the tar stream.
    Tar(Vec<u8>),
    /// An entry that was left out, and why (the renter is told).
    Skipped {
        /// Its path, relative to the copied path.
        path: String,
        /// Why.
        reason: String,
    },
}

/// What a download leaves out.
#[derive(Clone, Debug, Default)]
pub struct DownloadRules {
    /// Files (paths relative to the copied path) the renter already has.
    pub skip: HashSet<String>,
    /// Files the renter has with this size and modification time (unix seconds): left out
    /// while both are still the same.
    pub same: std::collections::HashMap<String, (u64, i64)>,
    /// Most bytes of file data to send; a file that would pass it is left out (`None`: no
    /// limit).
    pub max_bytes: Option<u64>,
}

/// What a download sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DownloadSummary {
    /// Entries sent.
    pub entries: u64,
    /// Bytes of file data sent (holes not counted).
    pub data_bytes: u64,
    /// Entries left out ([`Out::Skipped`]).
    pub skipped: u64,
}

/// Walks `rel` (workspace-relative) and hands the tar stream of it to `send` in pieces of
/// about [`OUT_PIECE`] bytes, after an [`Out::Root`]; `send` returns false when nobody reads
/// any more (the walk then stops). Blocking I/O: run it off the async runtime.
///
/// Directories first, then what is in them, depth first; files with holes as GNU sparse
/// entries (only their data travels); symlinks as links, except those that leave the copied
/// tree or are absolute (the renter's side would refuse them), which are left out with a
/// reason, as are FIFOs, sockets, devices and directories below [`MAX_DEPTH`]. Nothing is
/// followed: a symlink named as the copied path is refused. A file that changes while it is
/// read is sent with the size it had when it was opened (shorter: the rest as zeros).
pub fn download(
    fs: &WorkspaceFs,
    rel: &Path,
    rules: &DownloadRules,
    send: &mut dyn FnMut(Out) -> bool,
) -> Result<DownloadSummary, TransferError> {
    let root = fs
        .open_at(rel, OFlags::PATH | OFlags::NOFOLLOW)
        .map_err(|e| fs_error(e, rel))?;
    let st = rustix::fs::fstat(&root).map_err(|e| fs_error(e, rel))?;
    let mut w = TarWriter {
        send,
        buf: Vec::with_capacity(OUT_PIECE + 64 * 1024),
        rules,
        summary: DownloadSummary::default(),
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => {
            w.emit(Out::Root { directory: true })?;
            let dir = fs
                .open_at(rel, OFlags::RDONLY | OFlags::DIRECTORY)
                .map_err(|e| fs_error(e, rel))?;
            w.tree(dir)?;
        }
        FileType::RegularFile => {
            w.emit(Out::Root { directory: false })?;
            let name = rel.file_name().map(PathBuf::from).unwrap_or_default();
            let file = fs
                .open_at(rel, OFlags::RDONLY)
                .map_err(|e| fs_error(e, rel))?;
            w.file(&name, file)?;
        }
        FileType::Symlink => {
            return Err(TransferError::Refused {
                path: rel.display().to_string(),
                problem:
                    "it is a symbolic link (copies never follow links: name what it points to)"
                        .into(),
            });
        }
        _ => {
            return Err(TransferError::Refused {
                path: rel.display().to_string(),
                problem: "it is not a file or a directory".into(),
            });
        }
    }
    tar_out::end(&mut w.buf);
    w.flush()?;
    Ok(w.summary)
}

struct TarWriter<'s> {
    send: &'s mut dyn FnMut(Out) -> bool,
    buf: Vec<u8>,
    rules: &'s DownloadRules,
    summary: DownloadSummary,
}

fn gone() -> TransferError {
    TransferError::Io(std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        "nobody reads the download any more",
    ))
}

impl TarWriter<'_> {
    fn emit(&mut self, out: Out) -> Result<(), TransferError> {
        if (self.send)(out) {
            Ok(())
        } else {
            Err(gone())
        }
    }

    fn flush(&mut self) -> Result<(), TransferError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let piece = std::mem::replace(&mut self.buf, Vec::with_capacity(OUT_PIECE + 64 * 1024));
        self.emit(Out::Tar(piece))
    }

    fn maybe_flush(&mut self) -> Result<(), TransferError> {
        if self.buf.len() >= OUT_PIECE {
            self.flush()?;
        }
        Ok(())
    }

    fn skipped(&mut self, path: &Path, reason: impl Into<String>) -> Result<(), TransferError> {
        self.summary.skipped += 1;
        self.flush()?;
        self.emit(Out::Skipped {
            path: path.display().to_string(),
            reason: reason.into(),
        })
    }

    fn counted(&mut self) -> Result<(), TransferError> {
        self.summary.entries += 1;
        if self.summary.entries > MAX_ENTRIES {
            return Err(TransferError::Refused {
                path: ".".into(),
                problem: format!("more than {MAX_ENTRIES} entries"),
            });
        }
        Ok(())
    }

    /// Everything below the directory `dir`, depth first.
    fn tree(&mut self, dir: OwnedFd) -> Result<(), TransferError> {
        let mut stack: Vec<(Dir, OwnedFd, PathBuf)> = Vec::new();
        let d = Dir::read_from(&dir).map_err(|e| fs_error(e, Path::new(".")))?;
        stack.push((d, dir, PathBuf::new()));
        while let Some((iter, fd, prefix)) = stack.last_mut() {
            let Some(next) = iter.read() else {
                stack.pop();
                continue;
            };
            let entry = next.map_err(|e| fs_error(e, prefix))?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let path = prefix.join(name);
            let name = name.to_os_string();
            let st = match rustix::fs::statat(&*fd, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                // Removed meanwhile: nothing to send.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(fs_error(e, &path)),
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => {
                    if stack.len() > MAX_DEPTH {
                        self.skipped(&path, format!("deeper than {MAX_DEPTH} directories"))?;
                        continue;
                    }
                    let parent = &stack.last().unwrap_or_else(|| unreachable!()).1;
                    let child = match rustix::fs::openat2(
                        parent,
                        &name,
                        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                        Mode::empty(),
                        RESOLVE,
                    ) {
                        Ok(fd) => fd,
                        Err(Errno::NOENT) => continue,
                        Err(e) => {
                            self.skipped(&path, format!("cannot open it: {}", errno_io(e)))?;
                            continue;
                        }
                    };
                    let st = rustix::fs::fstat(&child).map_err(|e| fs_error(e, &path))?;
                    self.counted()?;
                    tar_out::header(&mut self.buf, &path, OutKind::Dir, st.st_mode, mtime(&st));
                    self.maybe_flush()?;
                    let d = Dir::read_from(&child).map_err(|e| fs_error(e, &path))?;
                    stack.push((d, child, path));
                }
                FileType::RegularFile => {
                    if self.rules.skip.contains(&path.display().to_string()) {
                        continue;
                    }
                    let parent = &stack.last().unwrap_or_else(|| unreachable!()).1;
                    match rustix::fs::openat2(
                        parent,
                        &name,
                        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                        RESOLVE,
                    ) {
                        Ok(file) => {
                            if let Some(&(size, time)) =
                                self.rules.same.get(&path.display().to_string())
                            {
                                let st =
                                    rustix::fs::fstat(&file).map_err(|e| fs_error(e, &path))?;
                                if u64::try_from(st.st_size).ok() == Some(size)
                                    && st.st_mtime == time
                                {
                                    continue;
                                }
                            }
                            self.file(&path, file)?
                        }
                        Err(Errno::NOENT) => continue,
                        Err(e) => {
                            self.skipped(&path, format!("cannot open it: {}", errno_io(e)))?
                        }
                    }
                }
                FileType::Symlink => {
                    let parent = &stack.last().unwrap_or_else(|| unreachable!()).1;
                    let target = match rustix::fs::readlinkat(parent, &name, Vec::new()) {
                        Ok(t) => t.into_bytes(),
                        Err(Errno::NOENT) => continue,
                        Err(e) => return Err(fs_error(e, &path)),
                    };
                    if Path::new(OsStr::from_bytes(&target)).is_absolute() {
                        let shown = String::from_utf8_lossy(&target).into_owned();
                        self.skipped(&path, format!("a symlink to the absolute path {shown:?}"))?;
                    } else if !link_stays_inside(&path, &target) {
                        let shown = String::from_utf8_lossy(&target).into_owned();
                        self.skipped(
                            &path,
                            format!("a symlink to {shown:?}, outside the copied tree"),
                        )?;
                    } else {
                        self.counted()?;
                        tar_out::header(
                            &mut self.buf,
                            &path,
                            OutKind::Symlink(&target),
                            0o777,
                            mtime(&st),
                        );
                        self.maybe_flush()?;
                    }
                }
                FileType::Fifo => self.skipped(&path, "a FIFO (not copied)")?,
                FileType::Socket => self.skipped(&path, "a socket (not copied)")?,
                _ => self.skipped(&path, "a device (not copied)")?,
            }
        }
        Ok(())
    }

    /// A regular file, opened: its header, then its data (only its data extents when it has
    /// holes).
    fn file(&mut self, path: &Path, file: OwnedFd) -> Result<(), TransferError> {
        let st = rustix::fs::fstat(&file).map_err(|e| fs_error(e, path))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return self.skipped(path, "it changed into something else while being copied");
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        let allocated = u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512);
        let extents = if allocated < size {
            data_extents(&file, size).map_err(|e| fs_error(e, path))?
        } else {
            None
        };
        let stored = extents
            .as_ref()
            .map_or(size, |x| x.iter().map(|(_, l)| l).sum());
        if let Some(max) = self.rules.max_bytes
            && self.summary.data_bytes.saturating_add(stored) > max
        {
            return self.skipped(
                path,
                format!(
                    "its {stored} bytes would pass the download's limit of {max} bytes (gridlease cp --max-size)"
                ),
            );
        }
        self.counted()?;
        let kind = match &extents {
            Some(x) => OutKind::Sparse { size, extents: x },
            None => OutKind::File { size },
        };
        tar_out::header(&mut self.buf, path, kind, st.st_mode, mtime(&st));
        let whole = [(0, size)];
        for &(off, len) in extents.as_deref().unwrap_or(&whole) {
            self.copy(&file, path, off, len)?;
        }
        tar_out::pad(&mut self.buf, stored);
        self.summary.data_bytes += stored;
        self.maybe_flush()
    }

    /// `len` bytes of `file` from `off` into the stream (zeros past its current end).
    fn copy(
        &mut self,
        file: &OwnedFd,
        path: &Path,
        off: u64,
        len: u64,
    ) -> Result<(), TransferError> {
        let mut done = 0u64;
        while done < len {
            let room = OUT_PIECE.saturating_sub(self.buf.len()).max(64 * 1024);
            let want = usize::try_from(len - done).unwrap_or(usize::MAX).min(room);
            let at = self.buf.len();
            self.buf.resize(at + want, 0);
            let n = match rustix::io::pread(file, &mut self.buf[at..], off + done) {
                Ok(n) => n,
                Err(Errno::INTR) => 0,
                Err(e) => {
                    self.buf.truncate(at);
                    return Err(fs_error(e, path));
                }
            };
            if n == 0 {
                // The file shrank: the rest as the zeros already in place.
                done += want as u64;
            } else {
                self.buf.truncate(at + n);
                done += n as u64;
            }
            self.maybe_flush()?;
        }
        Ok(())
    }
}

fn mtime(st: &Stat) -> u64 {
    u64::try_from(st.st_mtime).unwrap_or(0)
}

/// The data extents of a file of `size` bytes with holes (`SEEK_DATA` / `SEEK_HOLE`), widened
/// to [`EXTENT_ALIGN`] and merged, so every extent but one that ends at the file's end is a
/// multiple of the tar block. `None` when there are more than [`MAX_EXTENTS`] (the file then
/// travels whole).
fn data_extents(file: &OwnedFd, size: u64) -> Result<Option<Vec<(u64, u64)>>, Errno> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut at = 0u64;
    while at < size {
        let data = match rustix::fs::seek(file.as_fd(), SeekFrom::Data(at)) {
            Ok(d) => d,
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e),
        };
        if data >= size {
            break;
        }
        let hole = rustix::fs::seek(file.as_fd(), SeekFrom::Hole(data))?.min(size);
        let start = data / EXTENT_ALIGN * EXTENT_ALIGN;
        let end = hole
            .div_ceil(EXTENT_ALIGN)
            .saturating_mul(EXTENT_ALIGN)
            .min(size);
        match out.last_mut() {
            Some((o, l)) if *o + *l >= start => *l = end.max(*o + *l) - *o,
            _ => out.push((start, end - start)),
        }
        if out.len() > MAX_EXTENTS {
            return Ok(None);
        }
        at = hole.max(data + 1);
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    use crate::files::tar_in::TarReader;

    fn fs_in(dir: &Path) -> WorkspaceFs {
        WorkspaceFs::open(dir).unwrap()
    }

    /// Applies `tar` to the workspace at `root` below `prefix`.
    fn upload(root: &Path, prefix: &str, tar: &[u8]) -> Result<u64, TransferError> {
        let fs = fs_in(root);
        let mut up = Upload::new(&fs, Path::new(prefix))?;
        let mut r = TarReader::new();
        let mut events = Vec::new();
        for piece in tar.chunks(1000) {
            r.push(Bytes::copy_from_slice(piece), &mut events)?;
            for e in events.drain(..) {
                up.apply(e)?;
            }
        }
        r.finish()?;
        up.finish()
    }

    /// A raw tar entry, written byte by byte (the tar crate refuses to write hostile ones).
    fn raw(name: &[u8], kind: u8, link: &[u8], data: &[u8], mode: u32) -> Vec<u8> {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(tar::EntryType::new(kind));
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
        out
    }

    fn archive(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut out = entries.concat();
        out.extend_from_slice(&[0; 1024]);
        out
    }

    #[test]
    fn an_upload_writes_files_dirs_and_inside_links_with_mode_and_time() {
        let d = tempfile::tempdir().unwrap();
        let tar = archive(&[
            raw(b"d/", b'5', b"", b"", 0o750),
            raw(b"d/f", b'0', b"", b"hello", 0o4755),
            raw(b"d/l", b'2', b"f", b"", 0o777),
            raw(b"d/abs", b'2', b"/workspace/d/f", b"", 0o777),
            raw(b"e/deep/g", b'0', b"", b"x", 0o600),
        ]);
        assert_eq!(upload(d.path(), "in", &tar).unwrap(), 5);
        let f = d.path().join("in/d/f");
        assert_eq!(std::fs::read(&f).unwrap(), b"hello");
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(&f).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o755, "setuid dropped");
        assert_eq!(m.mtime(), 1_700_000_000);
        assert_eq!(
            std::fs::read_link(d.path().join("in/d/l")).unwrap(),
            PathBuf::from("f")
        );
        assert_eq!(std::fs::read(d.path().join("in/e/deep/g")).unwrap(), b"x");
        // A file already there is replaced, never written through: a link in its place stays
        // a link to the untouched target.
        let outside = d.path().join("outside");
        std::fs::write(&outside, b"keep").unwrap();
        std::os::unix::fs::symlink(&outside, d.path().join("in/d/f2")).unwrap();
        upload(
            d.path(),
            "in",
            &archive(&[raw(b"d/f2", b'0', b"", b"new", 0o644)]),
        )
        .unwrap();
        assert_eq!(std::fs::read(&outside).unwrap(), b"keep");
        assert_eq!(std::fs::read(d.path().join("in/d/f2")).unwrap(), b"new");
    }

    #[test]
    fn uploads_never_follow_or_make_links_out_of_the_workspace() {
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        let outside = d.path().join("etc");
        std::fs::create_dir(&outside).unwrap();
        // A link out of the workspace, made by the tenant (not by an upload).
        std::os::unix::fs::symlink(&outside, ws.join("tenant-link")).unwrap();
        std::os::unix::fs::symlink("..", ws.join("up")).unwrap();
        for (tar, why) in [
            (
                archive(&[
                    raw(b"link", b'2', b"/", b"", 0o777),
                    raw(b"link/etc/big", b'0', b"", b"x", 0o644),
                ]),
                "outside",
            ),
            (
                archive(&[raw(b"rel", b'2', b"../../etc", b"", 0o777)]),
                "outside",
            ),
            (
                archive(&[raw(b"tenant-link/big", b'0', b"", b"x", 0o644)]),
                "symbolic link",
            ),
            (
                archive(&[raw(b"up/etc/x", b'0', b"", b"x", 0o644)]),
                "symbolic link",
            ),
            (
                archive(&[raw(b"hard", b'1', b"/etc/passwd", b"", 0o644)]),
                "hard link",
            ),
            (archive(&[raw(b"dev", b'3', b"", b"", 0o644)]), "device"),
            (archive(&[raw(b"../x", b'0', b"", b"x", 0o644)]), "leaves"),
        ] {
            let err = upload(&ws, "", &tar).unwrap_err();
            assert!(err.to_string().contains(why), "{why}: {err}");
        }
        // Into a destination below the tenant's link: refused too.
        let err = upload(
            &ws,
            "tenant-link/sub",
            &archive(&[raw(b"f", b'0', b"", b"x", 0o644)]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "nothing outside"
        );
        assert!(!d.path().join("x").exists());
    }

    #[test]
    fn links_are_judged_lexically_from_their_directory() {
        assert!(link_stays_inside(Path::new("a/b/l"), b"../c"));
        assert!(link_stays_inside(Path::new("a/l"), b"../x"));
        assert!(!link_stays_inside(Path::new("a/l"), b"../../x"));
        assert!(!link_stays_inside(Path::new("l"), b".."));
        assert!(link_stays_inside(Path::new("l"), b"/workspace"));
        assert!(link_stays_inside(Path::new("l"), b"/workspace/a/./b"));
        assert!(!link_stays_inside(Path::new("l"), b"/workspace/../etc"));
        assert!(!link_stays_inside(Path::new("l"), b"/workspacex"));
        assert!(!link_stays_inside(Path::new("l"), b"/etc"));
    }

    fn download_all(root: &Path, rel: &str, rules: &DownloadRules) -> (Vec<Out>, Vec<u8>) {
        let fs = fs_in(root);
        let mut outs = Vec::new();
        let mut tar = Vec::new();
        download(&fs, Path::new(rel), rules, &mut |o| {
            match o {
                Out::Tar(b) => tar.extend_from_slice(&b),
                other => outs.push(other),
            }
            true
        })
        .unwrap();
        (outs, tar)
    }

    /// The names of the files a tar stream carries.
    fn names_in(tar: &[u8]) -> Vec<String> {
        let mut a = tar::Archive::new(tar);
        let mut names: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .filter(|n| !n.ends_with('/'))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_download_leaves_out_the_files_the_renter_has_unchanged_and_only_those() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("ckpt/sub")).unwrap();
        for (f, body) in [("ckpt/a", "1"), ("ckpt/b", "22"), ("ckpt/sub/c", "333")] {
            std::fs::write(root.join(f), body).unwrap();
        }
        let meta = |f: &str| std::fs::metadata(root.join(f)).unwrap();
        let mut rules = DownloadRules::default();
        // `a` as the renter has it; `b` with another size; `sub/c` with another time.
        rules
            .same
            .insert("a".into(), (meta("ckpt/a").len(), meta("ckpt/a").mtime()));
        rules.same.insert("b".into(), (5, meta("ckpt/b").mtime()));
        rules
            .same
            .insert("sub/c".into(), (3, meta("ckpt/sub/c").mtime() - 1));
        let (_, tar) = download_all(root, "ckpt", &rules);
        assert_eq!(names_in(&tar), ["b", "sub/c"]);
        // Once `a` changes (same size, a later time), it travels again.
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(root.join("ckpt/a"))
            .unwrap()
            .set_modified(later)
            .unwrap();
        let (_, tar) = download_all(root, "ckpt", &rules);
        assert_eq!(names_in(&tar), ["a", "b", "sub/c"]);
    }

    #[test]
    fn a_download_keeps_holes_skips_links_out_and_reads_back_with_tar() {
        use std::io::{Read, Seek, SeekFrom as StdSeek};
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        std::fs::create_dir_all(root.join("out/sub")).unwrap();
        std::fs::write(root.join("out/sub/a"), b"aaa").unwrap();
        // 256 MiB with 4 KiB of data in the middle.
        let mut f = std::fs::File::create(root.join("out/sparse")).unwrap();
        f.set_len(256 << 20).unwrap();
        f.seek(StdSeek::Start(100 << 20)).unwrap();
        f.write_all(&[9u8; 4096]).unwrap();
        drop(f);
        std::os::unix::fs::symlink("/etc", root.join("out/a-link")).unwrap();
        std::os::unix::fs::symlink("../../x", root.join("out/sub/up")).unwrap();
        std::os::unix::fs::symlink("a", root.join("out/sub/ok")).unwrap();
        let (outs, tar) = download_all(root, "out", &DownloadRules::default());
        assert_eq!(outs[0], Out::Root { directory: true });
        let skipped: Vec<&str> = outs[1..]
            .iter()
            .map(|o| match o {
                Out::Skipped { path, .. } => path.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(skipped.len(), 2, "{skipped:?}");
        assert!(skipped.contains(&"a-link") && skipped.contains(&"sub/up"));
        assert!(
            tar.len() < 1 << 20,
            "holes do not travel: {} bytes",
            tar.len()
        );
        let mut a = tar::Archive::new(tar.as_slice());
        let mut seen = Vec::new();
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            if path == "sparse" {
                let mut buf = vec![0u8; 1 << 20];
                let mut total = 0u64;
                let mut nonzero = 0u64;
                loop {
                    let n = e.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    nonzero += buf[..n].iter().filter(|b| **b != 0).count() as u64;
                    total += n as u64;
                }
                assert_eq!((total, nonzero), (256 << 20, 4096));
            }
            seen.push(path);
        }
        seen.sort();
        assert_eq!(seen, ["sparse", "sub/", "sub/a", "sub/ok"]);
        // A limit leaves the big file's data out only if it would pass it.
        let rules = DownloadRules {
            max_bytes: Some(2),
            ..DownloadRules::default()
        };
        let (outs, _) = download_all(root, "out/sub", &rules);
        assert!(
            outs.iter()
                .any(|o| matches!(o, Out::Skipped { path, reason } if path == "a" && reason.contains("--max-size")))
        );
        // A symlink as the copied path, or a path through one, is refused.
        let fs = fs_in(root);
        for rel in ["out/a-link", "out/a-link/passwd"] {
            let err = download(&fs, Path::new(rel), &DownloadRules::default(), &mut |_| {
                true
            })
            .unwrap_err();
            assert!(err.to_string().contains("symbolic link"), "{rel}: {err}");
        }
        let err = download(
            &fs,
            Path::new("nope"),
            &DownloadRules::default(),
            &mut |_| true,
        )
        .unwrap_err();
        assert!(matches!(err, TransferError::Missing { .. }), "{err}");
        // A reader that goes away stops the walk.
        let err = download(
            &fs,
            Path::new("out"),
            &DownloadRules::default(),
            &mut |_| false,
        )
        .unwrap_err();
        assert!(err.to_string().contains("nobody reads"), "{err}");
    }
}
