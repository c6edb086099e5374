//! One SFTP session's open handles and its answer to each request. Blocking file I/O: the
//! packet loop runs [`Session::answer`] off the async runtime.

use std::collections::HashMap;
use std::path::PathBuf;

use gridlease_sandbox::files::{
    DirReader, FileStat, FsError, FsErrorKind, OpenFile, OpenHow, SetAttrs, WorkspaceFs,
};
use russh_sftp::protocol::{
    Attrs, Data, ExtendedReply, File, FileAttributes, Handle, Name, OpenFlags, Packet, Status,
    StatusCode,
};

use super::paths::{self, OUTSIDE};

/// Longest packet (after its length) a client may send: a write of [`MAX_WRITE`] bytes and its
/// header fit (OpenSSH's server takes 256 KiB; its client writes 32 KiB, or up to what
/// `limits@openssh.com` allows).
pub(super) const MAX_PACKET: usize = 256 * 1024 + 1024;
/// Most handles (files and directories) one session holds open.
pub(super) const MAX_HANDLES: usize = 64;
/// Most bytes one read returns (a larger request is answered with this many).
pub(super) const MAX_READ: u32 = 255 * 1024;
/// Most bytes of data one write carries (the packet cap bounds it; advertised to clients).
pub(super) const MAX_WRITE: u32 = 255 * 1024;
/// Entries one directory read returns.
const DIR_BATCH: usize = 100;
/// Longest client-supplied string in an extended request's data.
const MAX_EXT_STRING: usize = 8192;

/// A failed request: its status code and the message the renter sees.
#[derive(Debug)]
struct Fail(StatusCode, String);

impl From<FsError> for Fail {
    fn from(e: FsError) -> Self {
        let code = match e.kind {
            FsErrorKind::Missing => StatusCode::NoSuchFile,
            FsErrorKind::Denied => StatusCode::PermissionDenied,
            FsErrorKind::Exists | FsErrorKind::Full | FsErrorKind::Other => StatusCode::Failure,
        };
        Fail(code, e.message)
    }
}

/// A status reply.
pub(super) fn status(id: u32, code: StatusCode, message: impl Into<String>) -> Packet {
    Packet::Status(Status {
        id,
        status_code: code,
        error_message: message.into(),
        language_tag: "en".into(),
    })
}

fn ok(id: u32) -> Result<Packet, Fail> {
    Ok(status(id, StatusCode::Ok, "ok"))
}

/// The workspace-relative path a client's `path` names, or the refusal.
fn resolve(path: &str) -> Result<PathBuf, Fail> {
    paths::resolve(path).ok_or_else(|| Fail(StatusCode::PermissionDenied, OUTSIDE.into()))
}

fn secs(t: i64) -> u32 {
    u32::try_from(t.max(0)).unwrap_or(u32::MAX)
}

/// SFTP's attributes of `st` (its full mode: the type bits tell files from directories).
fn attrs(st: &FileStat) -> FileAttributes {
    FileAttributes {
        size: Some(st.size),
        uid: Some(st.uid),
        user: None,
        gid: Some(st.gid),
        group: None,
        permissions: Some(st.mode),
        atime: Some(secs(st.atime)),
        mtime: Some(secs(st.mtime)),
    }
}

/// What a SETSTAT changes; an owner other than the current one is refused (files in the
/// workspace are the tenant's).
fn changes(a: &FileAttributes, current: &FileStat) -> Result<SetAttrs, Fail> {
    if a.uid.is_some_and(|u| u != current.uid) || a.gid.is_some_and(|g| g != current.gid) {
        return Err(Fail(
            StatusCode::PermissionDenied,
            "files in the workspace belong to the lease's user; their owner cannot be changed"
                .into(),
        ));
    }
    Ok(SetAttrs {
        size: a.size,
        mode: a.permissions,
        times: a.atime.zip(a.mtime).map(|(at, mt)| (at.into(), mt.into())),
    })
}

/// One `string` (u32 length, bytes) from the front of `data`.
fn take_string(data: &mut &[u8]) -> Option<String> {
    let len = u32::from_be_bytes(data.get(..4)?.try_into().ok()?) as usize;
    if len > MAX_EXT_STRING {
        return None;
    }
    let s = data.get(4..4 + len)?;
    let out = String::from_utf8_lossy(s).into_owned();
    *data = &data[4 + len..];
    Some(out)
}

/// What a handle holds.
enum Opened {
    File(OpenFile),
    Dir(DirReader),
}

/// A session's state.
pub(super) struct Session {
    fs: WorkspaceFs,
    handles: HashMap<String, Opened>,
    next_handle: u64,
    /// File bytes sent to the renter.
    pub(super) bytes_read: u64,
    /// File bytes received from the renter.
    pub(super) bytes_written: u64,
}

impl Session {
    /// A session on `fs`, nothing open.
    pub(super) fn new(fs: WorkspaceFs) -> Self {
        Self {
            fs,
            handles: HashMap::new(),
            next_handle: 0,
            bytes_read: 0,
            bytes_written: 0,
        }
    }

    /// The reply to the request `packet`.
    pub(super) fn answer(&mut self, packet: Packet) -> Packet {
        let id = packet.get_request_id();
        self.dispatch(packet)
            .unwrap_or_else(|Fail(code, message)| status(id, code, message))
    }

    fn dispatch(&mut self, packet: Packet) -> Result<Packet, Fail> {
        match packet {
            Packet::Open(o) => {
                let rel = resolve(&o.filename)?;
                self.room()?;
                let f = o.pflags;
                let how = OpenHow {
                    read: f.contains(OpenFlags::READ),
                    write: f.contains(OpenFlags::WRITE),
                    append: f.contains(OpenFlags::APPEND),
                    create: f.contains(OpenFlags::CREATE),
                    truncate: f.contains(OpenFlags::TRUNCATE),
                    exclusive: f.contains(OpenFlags::EXCLUDE),
                    mode: o.attrs.permissions.unwrap_or(0o644),
                };
                let file = self.fs.open_file(&rel, &how)?;
                Ok(self.keep(o.id, Opened::File(file)))
            }
            Packet::Close(c) => match self.handles.remove(&c.handle) {
                Some(_) => ok(c.id),
                None => Err(no_handle()),
            },
            Packet::Read(r) => {
                let file = self.file(&r.handle)?;
                let len = r.len.min(MAX_READ) as usize;
                let data = file.read_at(r.offset, len)?;
                if data.is_empty() && len > 0 {
                    return Err(Fail(StatusCode::Eof, "end of file".into()));
                }
                self.bytes_read += data.len() as u64;
                Ok(Packet::Data(Data { id: r.id, data }))
            }
            Packet::Write(w) => {
                self.file(&w.handle)?.write_at(w.offset, &w.data)?;
                self.bytes_written += w.data.len() as u64;
                ok(w.id)
            }
            Packet::Lstat(s) => {
                let st = self.fs.lstat(&resolve(&s.path)?)?;
                Ok(Packet::Attrs(Attrs {
                    id: s.id,
                    attrs: attrs(&st),
                }))
            }
            Packet::Stat(s) => {
                let st = self.fs.stat(&resolve(&s.path)?)?;
                Ok(Packet::Attrs(Attrs {
                    id: s.id,
                    attrs: attrs(&st),
                }))
            }
            Packet::Fstat(s) => {
                let st = self.file(&s.handle)?.stat()?;
                Ok(Packet::Attrs(Attrs {
                    id: s.id,
                    attrs: attrs(&st),
                }))
            }
            Packet::SetStat(s) => {
                let rel = resolve(&s.path)?;
                let set = changes(&s.attrs, &self.fs.lstat(&rel)?)?;
                self.fs.set_attrs(&rel, &set)?;
                ok(s.id)
            }
            Packet::FSetStat(s) => {
                let file = self.file(&s.handle)?;
                file.set_attrs(&changes(&s.attrs, &file.stat()?)?)?;
                ok(s.id)
            }
            other => self.dispatch_names(other),
        }
    }

    /// The requests on names and directories.
    fn dispatch_names(&mut self, packet: Packet) -> Result<Packet, Fail> {
        match packet {
            Packet::OpenDir(o) => {
                let rel = resolve(&o.path)?;
                self.room()?;
                let dir = self.fs.read_dir(&rel)?;
                Ok(self.keep(o.id, Opened::Dir(dir)))
            }
            Packet::ReadDir(r) => {
                let Some(Opened::Dir(dir)) = self.handles.get_mut(&r.handle) else {
                    return Err(no_handle());
                };
                let batch = dir.next_batch(DIR_BATCH)?;
                if batch.is_empty() {
                    return Err(Fail(StatusCode::Eof, "no more entries".into()));
                }
                let now = jiff::Timestamp::now().as_second();
                let files = batch
                    .iter()
                    .map(|e| {
                        let name = e.name.to_string_lossy().into_owned();
                        File {
                            longname: paths::longname(&name, &e.stat, now),
                            filename: name,
                            attrs: attrs(&e.stat),
                        }
                    })
                    .collect();
                Ok(Packet::Name(Name { id: r.id, files }))
            }
            Packet::Remove(r) => {
                self.fs.unlink(&resolve(&r.filename)?)?;
                ok(r.id)
            }
            Packet::MkDir(m) => {
                let mode = m.attrs.permissions.unwrap_or(0o755);
                self.fs.mkdir(&resolve(&m.path)?, mode)?;
                ok(m.id)
            }
            Packet::RmDir(r) => {
                self.fs.rmdir(&resolve(&r.path)?)?;
                ok(r.id)
            }
            Packet::RealPath(r) => {
                let path = paths::absolute(&resolve(&r.path)?);
                Ok(name_reply(r.id, path))
            }
            Packet::Rename(r) => {
                self.fs
                    .rename(&resolve(&r.oldpath)?, &resolve(&r.newpath)?, false)?;
                ok(r.id)
            }
            Packet::ReadLink(r) => {
                let target = self.fs.readlink(&resolve(&r.path)?)?;
                Ok(name_reply(
                    r.id,
                    String::from_utf8_lossy(&target).into_owned(),
                ))
            }
            // OpenSSH sends the link's target first and the new link's path second (the
            // reverse of the draft); every common client follows it.
            Packet::Symlink(s) => {
                let link = resolve(&s.targetpath)?;
                self.fs.symlink(&link, s.linkpath.as_bytes())?;
                ok(s.id)
            }
            Packet::Extended(e) => self.extended(e.id, &e.request, &e.data),
            Packet::Init(_) => Err(Fail(
                StatusCode::BadMessage,
                "the session is already initialised".into(),
            )),
            _ => Err(Fail(StatusCode::BadMessage, "not a request".into())),
        }
    }

    /// The extensions advertised in the version reply.
    fn extended(&mut self, id: u32, request: &str, data: &[u8]) -> Result<Packet, Fail> {
        let mut data = data;
        let malformed = || Fail(StatusCode::BadMessage, format!("a malformed {request}"));
        match request {
            "posix-rename@openssh.com" => {
                let from = take_string(&mut data).ok_or_else(malformed)?;
                let to = take_string(&mut data).ok_or_else(malformed)?;
                self.fs.rename(&resolve(&from)?, &resolve(&to)?, true)?;
                ok(id)
            }
            "fsync@openssh.com" => {
                let handle = take_string(&mut data).ok_or_else(malformed)?;
                self.file(&handle)?.sync()?;
                ok(id)
            }
            "limits@openssh.com" => {
                let mut out = Vec::with_capacity(32);
                for v in [
                    MAX_PACKET as u64,
                    MAX_READ.into(),
                    MAX_WRITE.into(),
                    MAX_HANDLES as u64,
                ] {
                    out.extend_from_slice(&v.to_be_bytes());
                }
                Ok(Packet::ExtendedReply(ExtendedReply { id, data: out }))
            }
            other => Err(Fail(
                StatusCode::OpUnsupported,
                format!("{other} is not supported by this server"),
            )),
        }
    }

    /// Refuses a new handle when [`MAX_HANDLES`] are open.
    fn room(&self) -> Result<(), Fail> {
        if self.handles.len() >= MAX_HANDLES {
            return Err(Fail(
                StatusCode::Failure,
                format!("too many open files and directories (at most {MAX_HANDLES}); close some"),
            ));
        }
        Ok(())
    }

    /// Keeps `opened` under a new handle; the reply that names it.
    fn keep(&mut self, id: u32, opened: Opened) -> Packet {
        self.next_handle += 1;
        let handle = format!("h{}", self.next_handle);
        self.handles.insert(handle.clone(), opened);
        Packet::Handle(Handle { id, handle })
    }

    fn file(&self, handle: &str) -> Result<&OpenFile, Fail> {
        match self.handles.get(handle) {
            Some(Opened::File(f)) => Ok(f),
            Some(Opened::Dir(_)) => Err(Fail(
                StatusCode::Failure,
                "the handle is a directory's, not a file's".into(),
            )),
            None => Err(no_handle()),
        }
    }
}

fn no_handle() -> Fail {
    Fail(
        StatusCode::Failure,
        "no such handle (never opened, or closed)".into(),
    )
}

/// A NAME reply of one path.
fn name_reply(id: u32, filename: String) -> Packet {
    Packet::Name(Name {
        id,
        files: vec![File {
            filename,
            longname: String::new(),
            attrs: FileAttributes::empty(),
        }],
    })
}
