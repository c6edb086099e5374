//! The SFTP server against raw packets on an in-memory stream, a temp dir as the workspace.

use std::os::unix::fs::MetadataExt;

use bytes::Bytes;
use russh_sftp::protocol::{
    Close, Extended, FileAttributes, Init, Lstat, MkDir, Open, OpenDir, OpenFlags, Packet, Read,
    ReadDir, ReadLink, RealPath, Remove, Rename, RmDir, SetStat, Stat, StatusCode, Symlink, Write,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::session::{MAX_HANDLES, MAX_READ};
use super::*;

struct Client {
    io: DuplexStream,
    server: tokio::task::JoinHandle<Tally>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

fn start(root: &Path) -> Client {
    let fs = WorkspaceFs::open(root).unwrap();
    let (io, theirs) = tokio::io::duplex(1 << 20);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_fs(fs, theirs, async move {
        // Ends when the test says so, not when the client is dropped.
        if stopped.await.is_err() {
            std::future::pending::<()>().await
        }
    }));
    Client {
        io,
        server,
        stop: Some(stop),
    }
}

impl Client {
    async fn raw(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.unwrap();
    }

    async fn recv(&mut self) -> Packet {
        let len = self.io.read_u32().await.unwrap();
        let mut body = vec![0u8; len as usize];
        self.io.read_exact(&mut body).await.unwrap();
        Packet::try_from(&mut Bytes::from(body)).unwrap()
    }

    async fn call(&mut self, p: impl Into<Packet>) -> Packet {
        let bytes = Bytes::try_from(p.into()).unwrap();
        self.raw(&bytes).await;
        self.recv().await
    }

    async fn init(root: &Path) -> Self {
        let mut c = start(root);
        match c.call(Init::new()).await {
            Packet::Version(v) => {
                assert_eq!(v.version, 3);
                assert!(v.extensions.contains_key("posix-rename@openssh.com"));
            }
            other => panic!("{other:?}"),
        }
        c
    }

    /// The server's tally once the session is over.
    async fn end(self) -> Tally {
        drop(self.io);
        tokio::time::timeout(Duration::from_secs(10), self.server)
            .await
            .unwrap()
            .unwrap()
    }

    async fn open(&mut self, id: u32, path: &str, flags: OpenFlags, mode: Option<u32>) -> Packet {
        let mut attrs = FileAttributes::empty();
        attrs.permissions = mode;
        self.call(Open {
            id,
            filename: path.into(),
            pflags: flags,
            attrs,
        })
        .await
    }
}

fn code(p: &Packet) -> (StatusCode, String) {
    match p {
        Packet::Status(s) => (s.status_code, s.error_message.clone()),
        other => panic!("not a status: {other:?}"),
    }
}

fn handle(p: Packet) -> String {
    match p {
        Packet::Handle(h) => h.handle,
        other => panic!("not a handle: {other:?}"),
    }
}

fn ok(p: &Packet) {
    assert_eq!(code(p).0, StatusCode::Ok, "{p:?}");
}

fn no_attrs() -> FileAttributes {
    FileAttributes::empty()
}

#[tokio::test]
async fn files_go_in_and_out_of_the_workspace() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    let mut c = Client::init(root).await;
    match c
        .call(RealPath {
            id: 1,
            path: ".".into(),
        })
        .await
    {
        Packet::Name(n) => assert_eq!(n.files[0].filename, "/workspace"),
        other => panic!("{other:?}"),
    }
    let mut mkdir_attrs = no_attrs();
    mkdir_attrs.permissions = Some(0o2750);
    ok(&c
        .call(MkDir {
            id: 2,
            path: "d".into(),
            attrs: mkdir_attrs,
        })
        .await);
    assert_eq!(
        std::fs::metadata(root.join("d")).unwrap().mode() & 0o7777,
        0o750
    );
    let create = OpenFlags::WRITE | OpenFlags::CREATE | OpenFlags::TRUNCATE;
    let h = handle(c.open(3, "/workspace/d/f", create, Some(0o4644)).await);
    ok(&c
        .call(Write {
            id: 4,
            handle: h.clone(),
            offset: 0,
            data: b"hello ".to_vec(),
        })
        .await);
    ok(&c
        .call(Write {
            id: 5,
            handle: h.clone(),
            offset: 6,
            data: b"world".to_vec(),
        })
        .await);
    ok(&c
        .call(Close {
            id: 6,
            handle: h.clone(),
        })
        .await);
    assert_eq!(
        code(&c.call(Close { id: 7, handle: h }).await).0,
        StatusCode::Failure
    );
    let m = std::fs::metadata(root.join("d/f")).unwrap();
    assert_eq!((m.len(), m.mode() & 0o7777), (11, 0o644));
    match c
        .call(Stat {
            id: 8,
            path: "d/f".into(),
        })
        .await
    {
        Packet::Attrs(a) => assert_eq!(
            (a.attrs.size, a.attrs.permissions),
            (Some(11), Some(0o100644))
        ),
        other => panic!("{other:?}"),
    }
    // Mode (setuid dropped) and times.
    let mut set = no_attrs();
    set.permissions = Some(0o4600);
    set.atime = Some(1_600_000_000);
    set.mtime = Some(1_700_000_000);
    ok(&c
        .call(SetStat {
            id: 9,
            path: "d/f".into(),
            attrs: set,
        })
        .await);
    let m = std::fs::metadata(root.join("d/f")).unwrap();
    assert_eq!((m.mode() & 0o7777, m.mtime()), (0o600, 1_700_000_000));
    let mut chown = no_attrs();
    chown.uid = Some(0);
    chown.gid = Some(12345);
    assert_eq!(
        code(
            &c.call(SetStat {
                id: 10,
                path: "d/f".into(),
                attrs: chown
            })
            .await
        )
        .0,
        StatusCode::PermissionDenied
    );
    // A listing: the entries, long names, then EOF.
    let h = handle(
        c.call(OpenDir {
            id: 11,
            path: "d".into(),
        })
        .await,
    );
    match c
        .call(ReadDir {
            id: 12,
            handle: h.clone(),
        })
        .await
    {
        Packet::Name(n) => {
            assert_eq!(n.files.len(), 1);
            assert_eq!(n.files[0].filename, "f");
            assert!(
                n.files[0].longname.starts_with("-rw-------"),
                "{}",
                n.files[0].longname
            );
            assert!(n.files[0].longname.ends_with(" f"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        code(
            &c.call(ReadDir {
                id: 13,
                handle: h.clone()
            })
            .await
        )
        .0,
        StatusCode::Eof
    );
    ok(&c.call(Close { id: 14, handle: h }).await);
    let t = c.end().await;
    assert_eq!((t.requests, t.bytes_written), (15, 11));
    assert!(t.end.contains("closed"), "{}", t.end);
}

#[tokio::test]
async fn renames_and_reads_back_capped() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("d/f"), b"hello world").unwrap();
    let mut c = Client::init(root).await;
    // Rename: SFTP's fails onto an existing name, posix-rename replaces it.
    ok(&c
        .call(Rename {
            id: 15,
            oldpath: "d/f".into(),
            newpath: "d/g".into(),
        })
        .await);
    std::fs::write(root.join("d/other"), b"x").unwrap();
    assert_eq!(
        code(
            &c.call(Rename {
                id: 16,
                oldpath: "d/g".into(),
                newpath: "d/other".into()
            })
            .await
        )
        .0,
        StatusCode::Failure
    );
    let mut data = Vec::new();
    for s in ["/workspace/d/g", "d/other"] {
        data.extend_from_slice(&(s.len() as u32).to_be_bytes());
        data.extend_from_slice(s.as_bytes());
    }
    ok(&c
        .call(Extended {
            id: 17,
            request: "posix-rename@openssh.com".into(),
            data,
        })
        .await);
    assert_eq!(std::fs::read(root.join("d/other")).unwrap(), b"hello world");
    // Read back, a 4 GiB request capped; EOF past the end.
    let big = vec![7u8; 300 * 1024];
    std::fs::write(root.join("big"), &big).unwrap();
    let h = handle(c.open(18, "big", OpenFlags::READ, None).await);
    match c
        .call(Read {
            id: 19,
            handle: h.clone(),
            offset: 0,
            len: u32::MAX,
        })
        .await
    {
        Packet::Data(data) => assert_eq!(data.data.len(), MAX_READ as usize),
        other => panic!("{other:?}"),
    }
    match c
        .call(Read {
            id: 20,
            handle: h.clone(),
            offset: u64::from(MAX_READ),
            len: u32::MAX,
        })
        .await
    {
        Packet::Data(data) => assert_eq!(data.data.len(), big.len() - MAX_READ as usize),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        code(
            &c.call(Read {
                id: 21,
                handle: h.clone(),
                offset: big.len() as u64,
                len: 10
            })
            .await
        )
        .0,
        StatusCode::Eof
    );
    ok(&c.call(Close { id: 22, handle: h }).await);
    assert_eq!(c.end().await.bytes_read, big.len() as u64);
}

#[tokio::test]
async fn links_removal_and_extensions() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("d/other"), b"hello world").unwrap();
    let mut c = Client::init(root).await;
    // Links inside the workspace; readlink; lstat of the link itself.
    ok(&c
        .call(Symlink {
            id: 23,
            linkpath: "other".into(),
            targetpath: "d/link".into(),
        })
        .await);
    match c
        .call(ReadLink {
            id: 24,
            path: "d/link".into(),
        })
        .await
    {
        Packet::Name(n) => assert_eq!(n.files[0].filename, "other"),
        other => panic!("{other:?}"),
    }
    match c
        .call(Lstat {
            id: 25,
            path: "d/link".into(),
        })
        .await
    {
        Packet::Attrs(a) => assert_eq!(a.attrs.permissions.unwrap() & 0o170000, 0o120000),
        other => panic!("{other:?}"),
    }
    // Remove and rmdir.
    assert_eq!(
        code(
            &c.call(RmDir {
                id: 26,
                path: "d".into()
            })
            .await
        )
        .0,
        StatusCode::Failure
    );
    for (id, name) in [(27, "d/link"), (28, "d/other")] {
        ok(&c
            .call(Remove {
                id,
                filename: name.into(),
            })
            .await);
    }
    ok(&c
        .call(RmDir {
            id: 29,
            path: "/workspace/d".into(),
        })
        .await);
    assert!(!root.join("d").exists());
    assert_eq!(
        code(
            &c.call(Remove {
                id: 30,
                filename: "d".into()
            })
            .await
        )
        .0,
        StatusCode::NoSuchFile
    );
    // Extensions: limits answered, others unsupported.
    match c
        .call(Extended {
            id: 31,
            request: "limits@openssh.com".into(),
            data: Vec::new(),
        })
        .await
    {
        Packet::ExtendedReply(r) => assert_eq!(r.data.len(), 32),
        other => panic!("{other:?}"),
    }
    let unsupported = Extended {
        id: 32,
        request: "statvfs@openssh.com".into(),
        data: Vec::new(),
    };
    assert_eq!(
        code(&c.call(unsupported).await).0,
        StatusCode::OpUnsupported
    );
    assert_eq!(c.end().await.requests, 11);
}

#[tokio::test]
async fn nothing_outside_the_workspace_is_reachable() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    std::os::unix::fs::symlink("/", root.join("link")).unwrap();
    std::fs::write(d.path().join("secret"), b"s").unwrap();
    let mut c = Client::init(&root).await;
    for (id, path) in [
        (1, "/etc/passwd"),
        (2, "/workspace/../etc/passwd"),
        (3, "../secret"),
        (4, "/"),
    ] {
        let (code, msg) = code(&c.open(id, path, OpenFlags::READ, None).await);
        assert_eq!(code, StatusCode::PermissionDenied, "{path}");
        assert!(msg.contains("only /workspace is reachable"), "{msg}");
        let (code, _) = code_of(
            c.call(Stat {
                id,
                path: path.into(),
            })
            .await,
        );
        assert_eq!(code, StatusCode::PermissionDenied, "{path}");
    }
    // Through the tenant's link to /: refused, never followed.
    for path in ["link/etc/passwd", "/workspace/link/etc/passwd"] {
        let (code, msg) = code(&c.open(5, path, OpenFlags::READ, None).await);
        assert_eq!(code, StatusCode::PermissionDenied, "{path}: {msg}");
        assert!(msg.contains("symbolic link"), "{msg}");
        let create = OpenFlags::WRITE | OpenFlags::CREATE;
        assert_ne!(
            code_of(c.open(6, path, create, None).await).0,
            StatusCode::Ok
        );
    }
    assert_eq!(
        code(
            &c.call(Stat {
                id: 7,
                path: "link".into()
            })
            .await
        )
        .0,
        StatusCode::PermissionDenied
    );
    assert_eq!(
        code(
            &c.call(OpenDir {
                id: 8,
                path: "link".into()
            })
            .await
        )
        .0,
        StatusCode::PermissionDenied
    );
    // A link out cannot be made either.
    let out = Symlink {
        id: 9,
        linkpath: "/etc".into(),
        targetpath: "l2".into(),
    };
    assert_eq!(code(&c.call(out).await).0, StatusCode::PermissionDenied);
    let ren = Rename {
        id: 10,
        oldpath: "x".into(),
        newpath: "/tmp/x".into(),
    };
    assert_eq!(code(&c.call(ren).await).0, StatusCode::PermissionDenied);
    assert!(!root.join("l2").exists());
    c.end().await;
}

fn code_of(p: Packet) -> (StatusCode, String) {
    match p {
        Packet::Handle(_) => (StatusCode::Ok, String::new()),
        other => code(&other),
    }
}

#[tokio::test]
async fn handles_are_bounded() {
    let d = tempfile::tempdir().unwrap();
    let mut c = Client::init(d.path()).await;
    let mut handles = Vec::new();
    for id in 0..MAX_HANDLES as u32 {
        handles.push(handle(
            c.call(OpenDir {
                id,
                path: ".".into(),
            })
            .await,
        ));
    }
    let (code, msg) = code(
        &c.call(OpenDir {
            id: 100,
            path: ".".into(),
        })
        .await,
    );
    assert_eq!(code, StatusCode::Failure);
    assert!(msg.contains("too many"), "{msg}");
    let create = OpenFlags::WRITE | OpenFlags::CREATE;
    assert_eq!(
        super::tests::code(&c.open(101, "f", create, None).await).0,
        StatusCode::Failure
    );
    ok(&c
        .call(Close {
            id: 102,
            handle: handles.pop().unwrap(),
        })
        .await);
    handle(c.open(103, "f", create, None).await);
    c.end().await;
}

#[tokio::test]
async fn hostile_packets_are_refused_or_end_the_session() {
    let d = tempfile::tempdir().unwrap();
    // The first packet must be INIT.
    let mut c = start(d.path());
    let bytes = Bytes::try_from(Packet::from(Stat {
        id: 1,
        path: ".".into(),
    }))
    .unwrap();
    c.raw(&bytes).await;
    assert!(c.end().await.end.contains("INIT"));
    // A length over the cap ends the session at once, before its body is read or allocated.
    let mut c = Client::init(d.path()).await;
    c.raw(&u32::MAX.to_be_bytes()).await;
    let t = tokio::time::timeout(Duration::from_secs(10), c.server)
        .await
        .unwrap()
        .unwrap();
    assert!(t.end.contains("4294967295 bytes"), "{}", t.end);
    // A garbage body with an id: a status, and the session goes on.
    let mut c = Client::init(d.path()).await;
    c.raw(&[0, 0, 0, 7, 3, 0, 0, 0, 9, 0xff, 0xff]).await;
    let (code, _) = code(&c.recv().await);
    assert_eq!(code, StatusCode::BadMessage);
    c.raw(&[0, 0, 0, 5, 99, 0, 0, 0, 10]).await;
    match c.recv().await {
        Packet::Status(s) => assert_eq!((s.id, s.status_code), (10, StatusCode::OpUnsupported)),
        other => panic!("{other:?}"),
    }
    // A reply type sent as a request.
    c.raw(&[0, 0, 0, 5, 102, 0, 0, 0, 11]).await;
    assert_eq!(
        super::tests::code(&c.recv().await).0,
        StatusCode::BadMessage
    );
    ok(&c
        .call(MkDir {
            id: 12,
            path: "still-here".into(),
            attrs: no_attrs(),
        })
        .await);
    // Too short to carry an id: the session ends.
    c.raw(&[0, 0, 0, 2, 3, 0]).await;
    let t = tokio::time::timeout(Duration::from_secs(10), c.server)
        .await
        .unwrap()
        .unwrap();
    assert!(t.end.contains("undecodable"), "{}", t.end);
}

#[tokio::test]
async fn the_session_ends_with_the_lease() {
    let d = tempfile::tempdir().unwrap();
    let mut c = Client::init(d.path()).await;
    c.stop.take().unwrap().send(()).unwrap();
    let t = tokio::time::timeout(Duration::from_secs(10), c.server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(t.end, "the lease stopped");
}
