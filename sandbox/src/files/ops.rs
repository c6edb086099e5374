//! Single file operations on the workspace, by name or on an open file, for a file protocol
//! served from the host (the node's SFTP server): stat, directory listings, open, read and
//! write at offsets, permissions and times, rename, make and remove, links.
//!
//! Like uploads and downloads ([`super::host`]), every name is resolved beneath the workspace's
//! root with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)`: no symbolic link is ever followed, not in the middle of a path and not
//! as its last component. [`WorkspaceFs::stat`] is therefore [`WorkspaceFs::lstat`] that
//! refuses a link: it never reports what a link points to (which could be outside the
//! workspace), it says that the name is a link. Operations that act on a name itself (rename,
//! remove, readlink, lstat) act on a link as on any other entry.
//!
//! Files and directories made here belong to the tenant (the owner of the workspace's root)
//! and get permission bits only (`mode & 0o777`: never setuid, setgid or sticky). Only
//! regular files are opened for data: a FIFO or a device made by the tenant is refused, and
//! opens never block on one (`O_NONBLOCK`). Blocking I/O: run all of it off the async runtime.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, RenameFlags, Stat, Timespec, Timestamps};
use rustix::io::Errno;

use super::host::{RESOLVE, WorkspaceFs, display, errno_io};
use super::{MAX_LINK, link_stays_inside};

/// Permission bits a file or directory may get (no setuid, setgid or sticky bit).
pub const PERMISSION_BITS: u32 = 0o777;

/// What kind of failure an [`FsError`] is, for a protocol's status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsErrorKind {
    /// The name does not exist.
    Missing,
    /// Not allowed: a link in the way, a path leaving the workspace, a permission.
    Denied,
    /// The name exists already.
    Exists,
    /// The workspace's filesystem is full.
    Full,
    /// Anything else (the message says what).
    Other,
}

/// Why an operation failed, with a message meant for the renter.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FsError {
    /// Its kind.
    pub kind: FsErrorKind,
    /// What happened, naming the path as the container sees it (`/workspace/...`).
    pub message: String,
}

impl FsError {
    fn new(kind: FsErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// `rel` as the container names it.
fn shown(rel: &Path) -> String {
    let s = rel.display().to_string();
    if s.is_empty() {
        gridlease_protocol::transfer::WORKSPACE.to_string()
    } else {
        format!("{}/{s}", gridlease_protocol::transfer::WORKSPACE)
    }
}

/// The error `e` of an operation on `rel`.
fn op_error(e: Errno, rel: &Path) -> FsError {
    use FsErrorKind::*;
    let p = shown(rel);
    let (kind, message) = match e {
        Errno::LOOP => (
            Denied,
            format!(
                "{p}: a symbolic link is in its way (links in the workspace are never followed from outside the container: name what it points to)"
            ),
        ),
        Errno::XDEV => (Denied, format!("{p}: its path leaves the workspace")),
        Errno::ACCESS | Errno::PERM => (Denied, format!("{p}: permission denied")),
        Errno::NOENT => (Missing, format!("{p} does not exist")),
        Errno::EXIST => (Exists, format!("{p} already exists")),
        Errno::NOSPC | Errno::DQUOT => (
            Full,
            format!(
                "the lease's workspace is full (writing {p}); free space in it or rent a larger disk"
            ),
        ),
        Errno::NOTDIR => (Other, format!("{p}: a part of its path is not a directory")),
        Errno::ISDIR => (Other, format!("{p}: it is a directory")),
        Errno::NOTEMPTY => (Other, format!("{p}: the directory is not empty")),
        Errno::NAMETOOLONG => (Other, format!("{p}: its name is too long")),
        Errno::BADF => (
            Other,
            format!("{p}: it is not open for that (reading or writing)"),
        ),
        other => (Other, format!("{p}: {}", errno_io(other))),
    };
    FsError::new(kind, message)
}

/// A workspace-relative path made only of names (no root, no `.` or `..`).
fn checked(rel: &Path) -> Result<&Path, FsError> {
    if rel.components().all(|c| matches!(c, Component::Normal(_))) {
        Ok(rel)
    } else {
        Err(op_error(Errno::XDEV, rel))
    }
}

/// The attributes of a file, directory or link (never of what a link points to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    /// `st_mode`: the type bits and the permission bits.
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard links.
    pub nlink: u64,
    /// Last access, seconds since the epoch.
    pub atime: i64,
    /// Last modification, seconds since the epoch.
    pub mtime: i64,
}

impl FileStat {
    fn of(st: &Stat) -> Self {
        Self {
            mode: st.st_mode,
            size: u64::try_from(st.st_size).unwrap_or(0),
            uid: st.st_uid,
            gid: st.st_gid,
            nlink: st.st_nlink,
            atime: st.st_atime,
            mtime: st.st_mtime,
        }
    }

    fn kind(&self) -> FileType {
        FileType::from_raw_mode(self.mode)
    }

    /// A directory.
    pub fn is_dir(&self) -> bool {
        self.kind() == FileType::Directory
    }

    /// A regular file.
    pub fn is_file(&self) -> bool {
        self.kind() == FileType::RegularFile
    }

    /// A symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.kind() == FileType::Symlink
    }
}

/// How [`WorkspaceFs::open_file`] opens a file (the flags of `open(2)` a file protocol has).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenHow {
    /// For reading.
    pub read: bool,
    /// For writing.
    pub write: bool,
    /// Every write at the end (implies `write`).
    pub append: bool,
    /// Made when missing (owned by the tenant, with `mode`).
    pub create: bool,
    /// Emptied when opened for writing.
    pub truncate: bool,
    /// With `create`: fails when the name exists.
    pub exclusive: bool,
    /// Permission bits of a file made (masked with [`PERMISSION_BITS`]).
    pub mode: u32,
}

/// Attributes to change; `None` leaves one as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttrs {
    /// New size (files only: truncated or extended with a hole).
    pub size: Option<u64>,
    /// Permission bits (masked with [`PERMISSION_BITS`]).
    pub mode: Option<u32>,
    /// Last access and last modification, seconds since the epoch.
    pub times: Option<(i64, i64)>,
}

fn timespec(secs: i64) -> Timespec {
    Timespec {
        tv_sec: secs,
        tv_nsec: 0,
    }
}

/// Applies `attrs` to the open `fd` (`rel` names it in errors); the size first, so that the
/// times set stay.
fn apply(fd: impl AsFd, attrs: &SetAttrs, rel: &Path) -> Result<(), FsError> {
    let fail = |e| op_error(e, rel);
    if let Some(size) = attrs.size {
        rustix::fs::ftruncate(&fd, size).map_err(fail)?;
    }
    if let Some(mode) = attrs.mode {
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & PERMISSION_BITS)).map_err(fail)?;
    }
    if let Some((atime, mtime)) = attrs.times {
        let t = Timestamps {
            last_access: timespec(atime),
            last_modification: timespec(mtime),
        };
        rustix::fs::futimens(&fd, &t).map_err(fail)?;
    }
    Ok(())
}

/// A regular file of the workspace, opened by [`WorkspaceFs::open_file`].
#[derive(Debug)]
pub struct OpenFile {
    file: File,
    rel: PathBuf,
}

impl OpenFile {
    /// Its workspace-relative path (as it was opened).
    pub fn path(&self) -> &Path {
        &self.rel
    }

    /// Up to `len` bytes from `offset`: fewer only at the end of the file (none past it).
    pub fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>, FsError> {
        let mut buf = vec![0u8; len];
        let mut done = 0;
        while done < len {
            match rustix::io::pread(&self.file, &mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(Errno::INTR) => {}
                Err(e) => return Err(op_error(e, &self.rel)),
            }
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// Writes all of `data` at `offset` (at the end when opened to append).
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), FsError> {
        let mut done = 0;
        while done < data.len() {
            match rustix::io::pwrite(&self.file, &data[done..], offset + done as u64) {
                Ok(0) => return Err(op_error(Errno::IO, &self.rel)),
                Ok(n) => done += n,
                Err(Errno::INTR) => {}
                Err(e) => return Err(op_error(e, &self.rel)),
            }
        }
        Ok(())
    }

    /// Its attributes now.
    pub fn stat(&self) -> Result<FileStat, FsError> {
        rustix::fs::fstat(&self.file)
            .map(|st| FileStat::of(&st))
            .map_err(|e| op_error(e, &self.rel))
    }

    /// Changes its size, permission bits or times.
    pub fn set_attrs(&self, attrs: &SetAttrs) -> Result<(), FsError> {
        apply(&self.file, attrs, &self.rel)
    }

    /// Flushes its data and metadata to the disk.
    pub fn sync(&self) -> Result<(), FsError> {
        self.file.sync_all().map_err(|e| {
            let errno = e.raw_os_error().map_or(Errno::IO, Errno::from_raw_os_error);
            op_error(errno, &self.rel)
        })
    }
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Its name (bytes, as stored).
    pub name: OsString,
    /// Its attributes (a link's own).
    pub stat: FileStat,
}

/// A directory of the workspace being listed, by [`WorkspaceFs::read_dir`].
pub struct DirReader {
    dir: Dir,
    fd: OwnedFd,
    rel: PathBuf,
}

impl std::fmt::Debug for DirReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirReader").field("rel", &self.rel).finish()
    }
}

impl DirReader {
    /// Its workspace-relative path.
    pub fn path(&self) -> &Path {
        &self.rel
    }

    /// The next at most `max` entries, with their attributes; empty at the end. `.` and `..`
    /// are left out, as are entries removed while the listing runs.
    pub fn next_batch(&mut self, max: usize) -> Result<Vec<DirEntry>, FsError> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(next) = self.dir.read() else { break };
            let entry = next.map_err(|e| op_error(e, &self.rel))?;
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => out.push(DirEntry {
                    name: name.to_os_string(),
                    stat: FileStat::of(&st),
                }),
                Err(Errno::NOENT) => {}
                Err(e) => return Err(op_error(e, &self.rel.join(name))),
            }
        }
        Ok(out)
    }
}

impl WorkspaceFs {
    /// Opens `rel` beneath the root with `flags` (never following a link).
    fn beneath(&self, rel: &Path, flags: OFlags, mode: u32) -> Result<OwnedFd, FsError> {
        let rel = checked(rel)?;
        rustix::fs::openat2(
            &self.root,
            display(rel),
            flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(mode),
            RESOLVE,
        )
        .map_err(|e| match e {
            // A link as the last name of a directory reads as "not a directory": say it is
            // a link.
            Errno::NOTDIR if flags.contains(OFlags::DIRECTORY) && self.is_link(rel) => {
                op_error(Errno::LOOP, rel)
            }
            e => op_error(e, rel),
        })
    }

    /// Whether `rel` itself is a symbolic link.
    fn is_link(&self, rel: &Path) -> bool {
        self.beneath(rel, OFlags::PATH, 0)
            .and_then(|fd| rustix::fs::fstat(&fd).map_err(|e| op_error(e, rel)))
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink)
    }

    /// The directory that holds `rel`, opened, and `rel`'s last name. The root itself has no
    /// parent here: it cannot be renamed or removed.
    fn parent(&self, rel: &Path) -> Result<(OwnedFd, OsString), FsError> {
        let rel = checked(rel)?;
        let Some(name) = rel.file_name() else {
            return Err(FsError::new(
                FsErrorKind::Denied,
                "the workspace itself cannot be changed that way",
            ));
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        let fd = self.beneath(parent, OFlags::PATH | OFlags::DIRECTORY, 0)?;
        Ok((fd, name.to_os_string()))
    }

    /// The attributes of `rel` itself (a link's own when it is a link).
    pub fn lstat(&self, rel: &Path) -> Result<FileStat, FsError> {
        let fd = self.beneath(rel, OFlags::PATH, 0)?;
        rustix::fs::fstat(&fd)
            .map(|st| FileStat::of(&st))
            .map_err(|e| op_error(e, rel))
    }

    /// The attributes of `rel`, which must not be a symbolic link (links are never followed:
    /// a link fails with a [`FsErrorKind::Denied`] that says so).
    pub fn stat(&self, rel: &Path) -> Result<FileStat, FsError> {
        let st = self.lstat(rel)?;
        if st.is_symlink() {
            return Err(op_error(Errno::LOOP, rel));
        }
        Ok(st)
    }

    /// Starts listing the directory `rel`.
    pub fn read_dir(&self, rel: &Path) -> Result<DirReader, FsError> {
        let fd = self.beneath(rel, OFlags::RDONLY | OFlags::DIRECTORY, 0)?;
        let dir = Dir::read_from(&fd).map_err(|e| op_error(e, rel))?;
        Ok(DirReader {
            dir,
            fd,
            rel: rel.to_path_buf(),
        })
    }

    /// Opens the regular file `rel` as `how` says. A file made belongs to the tenant, with
    /// `how.mode`'s permission bits; anything but a regular file is refused.
    pub fn open_file(&self, rel: &Path, how: &OpenHow) -> Result<OpenFile, FsError> {
        let mut flags = match (how.read, how.write || how.append) {
            (true, true) => OFlags::RDWR,
            (false, true) => OFlags::WRONLY,
            _ => OFlags::RDONLY,
        } | OFlags::NONBLOCK
            | OFlags::NOCTTY;
        if how.append {
            flags |= OFlags::APPEND;
        }
        if how.truncate {
            flags |= OFlags::TRUNC;
        }
        let made = |fd: OwnedFd| -> Result<OwnedFd, FsError> {
            rustix::fs::fchown(&fd, Some(self.uid), Some(self.gid))
                .and_then(|()| {
                    rustix::fs::fchmod(&fd, Mode::from_raw_mode(how.mode & PERMISSION_BITS))
                })
                .map_err(|e| op_error(e, rel))?;
            Ok(fd)
        };
        let fd = if !how.create {
            self.beneath(rel, flags, 0)?
        } else if how.exclusive {
            made(self.beneath(rel, flags | OFlags::CREATE | OFlags::EXCL, 0o600)?)?
        } else {
            // Opened without creating first, so that only a file made here is chowned; one
            // made by someone else meanwhile is opened as it is.
            match self.beneath(rel, flags, 0) {
                Err(e) if e.kind == FsErrorKind::Missing => {
                    match self.beneath(rel, flags | OFlags::CREATE | OFlags::EXCL, 0o600) {
                        Ok(fd) => made(fd)?,
                        Err(e) if e.kind == FsErrorKind::Exists => self.beneath(rel, flags, 0)?,
                        Err(e) => return Err(e),
                    }
                }
                other => other?,
            }
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| op_error(e, rel))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(FsError::new(
                FsErrorKind::Other,
                format!("{}: it is not a regular file", shown(rel)),
            ));
        }
        // Reads and writes of a regular file ignore O_NONBLOCK; it only kept the open itself
        // from waiting on a FIFO.
        Ok(OpenFile {
            file: File::from(fd),
            rel: rel.to_path_buf(),
        })
    }

    /// Changes the size, permission bits or times of `rel` (a file or directory; a link is
    /// refused, not followed).
    pub fn set_attrs(&self, rel: &Path, attrs: &SetAttrs) -> Result<(), FsError> {
        let flags = if attrs.size.is_some() {
            OFlags::WRONLY
        } else {
            OFlags::RDONLY
        } | OFlags::NONBLOCK
            | OFlags::NOCTTY;
        let fd = self.beneath(rel, flags, 0)?;
        let st = rustix::fs::fstat(&fd).map_err(|e| op_error(e, rel))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile | FileType::Directory => apply(&fd, attrs, rel),
            _ => Err(FsError::new(
                FsErrorKind::Other,
                format!("{}: it is not a file or a directory", shown(rel)),
            )),
        }
    }

    /// Renames `from` to `to` (both workspace-relative). With `replace` false it fails when
    /// `to` exists (SFTP's own rename); with it, an existing `to` is replaced (POSIX rename).
    pub fn rename(&self, from: &Path, to: &Path, replace: bool) -> Result<(), FsError> {
        let (from_dir, from_name) = self.parent(from)?;
        let (to_dir, to_name) = self.parent(to)?;
        let flags = if replace {
            RenameFlags::empty()
        } else {
            RenameFlags::NOREPLACE
        };
        match rustix::fs::renameat_with(&from_dir, &from_name, &to_dir, &to_name, flags) {
            Ok(()) => Ok(()),
            Err(Errno::EXIST) => Err(op_error(Errno::EXIST, to)),
            // A filesystem without RENAME_NOREPLACE: checked first instead (racy, but only
            // within the tenant's own files).
            Err(Errno::INVAL) if !replace => {
                match rustix::fs::statat(&to_dir, &to_name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(_) => Err(op_error(Errno::EXIST, to)),
                    Err(Errno::NOENT) => {
                        rustix::fs::renameat(&from_dir, &from_name, &to_dir, &to_name)
                            .map_err(|e| op_error(e, from))
                    }
                    Err(e) => Err(op_error(e, to)),
                }
            }
            Err(e) => Err(op_error(e, from)),
        }
    }

    /// Makes the directory `rel`, owned by the tenant, with `mode`'s permission bits.
    pub fn mkdir(&self, rel: &Path, mode: u32) -> Result<(), FsError> {
        let (dir, name) = self.parent(rel)?;
        rustix::fs::mkdirat(&dir, &name, Mode::from_raw_mode(0o700))
            .map_err(|e| op_error(e, rel))?;
        // Opened without following anything: a link swapped in meanwhile fails here instead
        // of redirecting the chown.
        let fd = rustix::fs::openat2(
            &dir,
            &name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(|e| op_error(e, rel))?;
        rustix::fs::fchown(&fd, Some(self.uid), Some(self.gid)).map_err(|e| op_error(e, rel))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & PERMISSION_BITS))
            .map_err(|e| op_error(e, rel))
    }

    /// Removes the empty directory `rel`.
    pub fn rmdir(&self, rel: &Path) -> Result<(), FsError> {
        let (dir, name) = self.parent(rel)?;
        rustix::fs::unlinkat(&dir, &name, AtFlags::REMOVEDIR).map_err(|e| op_error(e, rel))
    }

    /// Removes `rel`, anything but a directory (a link is removed, not what it points to).
    pub fn unlink(&self, rel: &Path) -> Result<(), FsError> {
        let (dir, name) = self.parent(rel)?;
        rustix::fs::unlinkat(&dir, &name, AtFlags::empty()).map_err(|e| op_error(e, rel))
    }

    /// The target of the symbolic link `rel`, as stored.
    pub fn readlink(&self, rel: &Path) -> Result<Vec<u8>, FsError> {
        let (dir, name) = self.parent(rel)?;
        rustix::fs::readlinkat(&dir, &name, Vec::new())
            .map(|t| t.into_bytes())
            .map_err(|e| op_error(e, rel))
    }

    /// Makes the symbolic link `rel` to `target`, owned by the tenant; only a target that
    /// stays inside the workspace ([`link_stays_inside`]) is accepted.
    pub fn symlink(&self, rel: &Path, target: &[u8]) -> Result<(), FsError> {
        if target.is_empty() || target.len() > MAX_LINK || target.contains(&0) {
            return Err(FsError::new(
                FsErrorKind::Other,
                format!("{}: an empty or too long link target", shown(rel)),
            ));
        }
        if !link_stays_inside(rel, target) {
            return Err(FsError::new(
                FsErrorKind::Denied,
                format!(
                    "{}: a symlink to {:?} would point outside the workspace",
                    shown(rel),
                    String::from_utf8_lossy(target)
                ),
            ));
        }
        let (dir, name) = self.parent(rel)?;
        rustix::fs::symlinkat(OsStr::from_bytes(target), &dir, &name)
            .map_err(|e| op_error(e, rel))?;
        rustix::fs::chownat(
            &dir,
            &name,
            Some(self.uid),
            Some(self.gid),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| op_error(e, rel))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, symlink};

    fn ws() -> (tempfile::TempDir, PathBuf, WorkspaceFs) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        let fs = WorkspaceFs::open(&root).unwrap();
        (d, root, fs)
    }

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    fn create(mode: u32) -> OpenHow {
        OpenHow {
            write: true,
            create: true,
            truncate: true,
            mode,
            ..OpenHow::default()
        }
    }

    #[test]
    fn nothing_outside_the_workspace_is_reached() {
        let (d, root, fs) = ws();
        let outside = d.path().join("etc");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("passwd"), b"secret").unwrap();
        symlink(&outside, root.join("etc")).unwrap();
        symlink("/", root.join("slash")).unwrap();
        for rel in [
            "../etc/passwd",
            "/etc/passwd",
            "etc/passwd",
            "slash/etc",
            "a/../../etc",
        ] {
            let e = fs.lstat(p(rel)).unwrap_err();
            assert_ne!(e.kind, FsErrorKind::Other, "{rel}: {e}");
            let e = fs.open_file(p(rel), &OpenHow::default()).unwrap_err();
            assert!(
                matches!(e.kind, FsErrorKind::Denied | FsErrorKind::Missing),
                "{rel}: {e}"
            );
            assert!(fs.open_file(p(rel), &create(0o644)).is_err(), "{rel}");
            assert!(fs.read_dir(p(rel)).is_err(), "{rel}");
            assert!(fs.mkdir(&Path::new(rel).join("x"), 0o755).is_err(), "{rel}");
            assert!(fs.unlink(p(rel)).is_err(), "{rel}");
        }
        // A link is its own entry: lstat sees it, stat refuses it, opening it fails.
        assert!(fs.lstat(p("etc")).unwrap().is_symlink());
        let e = fs.stat(p("etc")).unwrap_err();
        assert_eq!(e.kind, FsErrorKind::Denied);
        assert!(e.message.contains("symbolic link"), "{e}");
        assert_eq!(fs.read_dir(p("etc")).unwrap_err().kind, FsErrorKind::Denied);
        assert!(
            fs.set_attrs(
                p("etc"),
                &SetAttrs {
                    mode: Some(0o777),
                    ..SetAttrs::default()
                }
            )
            .is_err()
        );
        assert_eq!(
            fs.readlink(p("etc")).unwrap(),
            outside.as_os_str().as_bytes()
        );
        // Renaming into or out of a linked directory is refused; renaming the link is fine.
        std::fs::write(root.join("f"), b"x").unwrap();
        assert!(fs.rename(p("f"), p("etc/f"), false).is_err());
        assert!(fs.rename(p("etc/passwd"), p("stolen"), false).is_err());
        fs.rename(p("etc"), p("etc2"), false).unwrap();
        // Removing the link leaves its target.
        fs.unlink(p("etc2")).unwrap();
        assert_eq!(std::fs::read(outside.join("passwd")).unwrap(), b"secret");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
        // Links made here stay inside.
        assert_eq!(
            fs.symlink(p("l"), b"/etc").unwrap_err().kind,
            FsErrorKind::Denied
        );
        assert_eq!(
            fs.symlink(p("l"), b"../x").unwrap_err().kind,
            FsErrorKind::Denied
        );
        fs.symlink(p("l"), b"f").unwrap();
        fs.symlink(p("l2"), b"/workspace/f").unwrap();
        assert_eq!(fs.readlink(p("l")).unwrap(), b"f");
        // The root itself cannot be removed or renamed.
        assert!(fs.rmdir(p("")).is_err());
        assert!(fs.rename(p(""), p("x"), true).is_err());
    }

    #[test]
    fn a_directory_swapped_for_a_link_is_not_followed() {
        let (d, root, fs) = ws();
        let outside = d.path().join("out");
        std::fs::create_dir(&outside).unwrap();
        std::fs::create_dir(root.join("dir")).unwrap();
        fs.open_file(p("dir/a"), &create(0o644)).unwrap();
        std::fs::remove_file(root.join("dir/a")).unwrap();
        std::fs::remove_dir(root.join("dir")).unwrap();
        symlink(&outside, root.join("dir")).unwrap();
        for r in [
            fs.open_file(p("dir/a"), &create(0o644)).map(drop),
            fs.mkdir(p("dir/sub"), 0o755),
            fs.symlink(p("dir/l"), b"x"),
            fs.set_attrs(p("dir"), &SetAttrs::default()),
        ] {
            let e = r.unwrap_err();
            assert_eq!(e.kind, FsErrorKind::Denied, "{e}");
        }
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn files_are_made_the_tenants_with_permission_bits_only() {
        let (_d, root, fs) = ws();
        let f = fs.open_file(p("f"), &create(0o4755)).unwrap();
        f.write_at(0, b"hello world").unwrap();
        f.write_at(6, b"there").unwrap();
        let m = std::fs::metadata(root.join("f")).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o755, "setuid dropped");
        let owner = std::fs::metadata(&root).unwrap();
        assert_eq!((m.uid(), m.gid()), (owner.uid(), owner.gid()));
        assert_eq!(std::fs::read(root.join("f")).unwrap(), b"hello there");
        assert_eq!(
            f.read_at(6, 100).unwrap_err().kind,
            FsErrorKind::Other,
            "write-only"
        );
        drop(f);
        let r = fs
            .open_file(
                p("f"),
                &OpenHow {
                    read: true,
                    ..OpenHow::default()
                },
            )
            .unwrap();
        assert_eq!(r.read_at(6, 100).unwrap(), b"there");
        assert!(r.read_at(100, 10).unwrap().is_empty());
        assert_eq!(r.stat().unwrap().size, 11);
        // Exclusive create of an existing file fails; append writes at the end.
        let excl = OpenHow {
            exclusive: true,
            ..create(0o644)
        };
        assert_eq!(
            fs.open_file(p("f"), &excl).unwrap_err().kind,
            FsErrorKind::Exists
        );
        let a = fs
            .open_file(
                p("f"),
                &OpenHow {
                    append: true,
                    ..OpenHow::default()
                },
            )
            .unwrap();
        a.write_at(0, b"!").unwrap();
        assert_eq!(std::fs::read(root.join("f")).unwrap(), b"hello there!");
        // Directories too, and modes and times set later are masked.
        fs.mkdir(p("d"), 0o2775).unwrap();
        let m = std::fs::metadata(root.join("d")).unwrap();
        assert!(m.is_dir());
        assert_eq!(m.mode() & 0o7777, 0o775);
        assert_eq!(
            fs.mkdir(p("d"), 0o755).unwrap_err().kind,
            FsErrorKind::Exists
        );
        fs.set_attrs(
            p("d"),
            &SetAttrs {
                mode: Some(0o1700),
                times: Some((1_600_000_000, 1_700_000_000)),
                ..SetAttrs::default()
            },
        )
        .unwrap();
        let st = fs.stat(p("d")).unwrap();
        assert_eq!(
            (st.mode & 0o7777, st.atime, st.mtime),
            (0o700, 1_600_000_000, 1_700_000_000)
        );
        fs.set_attrs(
            p("f"),
            &SetAttrs {
                size: Some(5),
                mode: Some(0o6600),
                times: Some((1, 2)),
            },
        )
        .unwrap();
        let st = fs.stat(p("f")).unwrap();
        assert_eq!((st.size, st.mode & 0o7777, st.mtime), (5, 0o600, 2));
        a.set_attrs(&SetAttrs {
            mode: Some(0o4644),
            ..SetAttrs::default()
        })
        .unwrap();
        assert_eq!(a.stat().unwrap().mode & 0o7777, 0o644);
        // A FIFO is refused without blocking.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        for how in [
            OpenHow::default(),
            OpenHow {
                write: true,
                ..OpenHow::default()
            },
        ] {
            assert!(fs.open_file(p("fifo"), &how).is_err());
        }
    }

    #[test]
    fn rename_remove_and_list_in_batches() {
        let (_d, root, fs) = ws();
        fs.mkdir(p("d"), 0o755).unwrap();
        for i in 0..25 {
            fs.open_file(&Path::new("d").join(format!("f{i}")), &create(0o644))
                .unwrap();
        }
        symlink("/etc", root.join("d/link")).unwrap();
        let mut r = fs.read_dir(p("d")).unwrap();
        let mut names = Vec::new();
        loop {
            let batch = r.next_batch(10).unwrap();
            if batch.is_empty() {
                break;
            }
            assert!(batch.len() <= 10);
            for e in batch {
                if e.name == "link" {
                    assert!(e.stat.is_symlink());
                } else {
                    assert!(e.stat.is_file());
                }
                names.push(e.name);
            }
        }
        assert_eq!(names.len(), 26);
        assert!(!names.iter().any(|n| n == "." || n == ".."));
        // SFTP's rename does not replace; POSIX rename does.
        assert_eq!(
            fs.rename(p("d/f0"), p("d/f1"), false).unwrap_err().kind,
            FsErrorKind::Exists
        );
        fs.rename(p("d/f0"), p("d/f1"), true).unwrap();
        fs.rename(p("d/f1"), p("moved"), false).unwrap();
        assert!(root.join("moved").exists() && !root.join("d/f1").exists());
        assert_eq!(
            fs.rename(p("nope"), p("x"), false).unwrap_err().kind,
            FsErrorKind::Missing
        );
        // Remove: files and links with unlink, empty directories with rmdir.
        assert!(fs.unlink(p("d")).is_err());
        assert!(fs.rmdir(p("d")).is_err(), "not empty");
        fs.unlink(p("d/link")).unwrap();
        for i in 2..25 {
            fs.unlink(&Path::new("d").join(format!("f{i}"))).unwrap();
        }
        fs.rmdir(p("d")).unwrap();
        fs.unlink(p("moved")).unwrap();
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        assert_eq!(
            fs.unlink(p("moved")).unwrap_err().kind,
            FsErrorKind::Missing
        );
    }

    #[test]
    fn a_full_workspace_says_so() {
        let e = op_error(Errno::NOSPC, p("big"));
        assert_eq!(e.kind, FsErrorKind::Full);
        assert!(e.message.contains("the lease's workspace is full"), "{e}");
        assert!(e.message.contains("/workspace/big"), "{e}");
    }
}
