//! gridlease probe: the test workload for sandbox tests, packed into a FROM-scratch image.
//!
//! Built by `sandbox/build.rs` as a static binary with no crate dependencies; the few libc
//! functions it needs are declared below. Arguments are a list of steps run in order:
//!
//!   burn N S        N threads, each burning S CPU-seconds (thread CPU clock, so the amount of
//!                   CPU is exact even when the host is busy)
//!   alloc M         allocate and touch M MiB, keep it
//!   write PATH      write a file; prints `WRITE path=PATH result=ok|<ERRNO>`
//!   sentinel TEXT   print `SENTINEL TEXT`
//!   bytes N         write N raw bytes to stdout, byte i = i mod 256 (every value: newlines,
//!                   NUL, invalid UTF-8), in 4 KiB writes, no trailing newline
//!   sleep S         sleep S seconds (fractions allowed)
//!   ignore-term     ignore SIGTERM from now on (to test kill after grace)
//!   forkbomb N      try N forks; prints `FORK ok=<n> failed=<n>`
//!   connect IP:PORT try a TCP connect (2 s timeout); prints `CONNECT addr=.. result=ok|<ERRNO>`
//!   send IP:PORT N  connect (2 s timeout) and write N bytes; prints `SEND addr=.. bytes=.. result=..`
//!   listen IP:PORT S  listen, print `LISTEN addr=.. result=ok|<ERRNO>`, then accept for S seconds,
//!                   one `ACCEPT addr=.. from=..` line per connection
//!   dns SERVER NAME one A query over UDP to SERVER:53 (2 s timeout); prints
//!                   `DNS name=.. result=ok addr=A.B.C.D|rcode-N|<ERRNO>`
//!   cat PATH        print `CAT path=.. value=<first line>|<ERRNO>`
//!   whoami          print `WHOAMI uid=.. euid=..`
//!   escape          try each escape, one `ESCAPE <name>=<outcome>` line per attempt
//!   iouring         raw `io_uring_setup(4, &params)`; prints `IOURING setup=ok|<ERRNO>`
//!   limits          print `LIMITS nofile_soft=.. nofile_hard=.. oom_score_adj=..`
//!   space PATH      statvfs; prints `SPACE path=.. avail_bytes=.. size_bytes=..`
//!   fill PATH M     write 1 MiB chunks to PATH until a write (or the final fsync) fails, at
//!                   most M MiB; prints `FILL path=.. bytes=.. result=<ERRNO>|limit-not-hit`
//!   workspace-job C S  a PyTorch-shaped job without PyTorch: reports user, HOME, cwd, the
//!                   mounts of /workspace, /tmp and /dev/shm and the mode and owner of /tmp and
//!                   /workspace (`WSJOB dirs /tmp=1777:0:0 ...`), writes a C MiB checkpoint to
//!                   /workspace (fsync), writes under $HOME, mmaps an S MiB file in /dev/shm and
//!                   touches every page, copies itself to /tmp, makes it executable and runs
//!                   it; one `WSJOB ...` line per part, `WSJOB done ok=true|false`, and exit 1
//!                   if any part failed
//!   exit C          exit with code C
//!
//! Every line is flushed immediately so logs show progress even if the process is killed.

use std::io::Write;
use std::time::{Duration, Instant};

#[allow(non_camel_case_types)]
type c_int = i32;
#[allow(non_camel_case_types)]
type c_long = i64;

#[repr(C)]
struct Timespec {
    tv_sec: c_long,
    tv_nsec: c_long,
}

unsafe extern "C" {
    fn mount(src: *const u8, target: *const u8, fstype: *const u8, flags: u64, data: *const u8)
    -> c_int;
    fn unshare(flags: c_int) -> c_int;
    fn syscall(num: c_long, ...) -> c_long;
    fn fork() -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn _exit(code: c_int) -> !;
    fn getuid() -> u32;
    fn geteuid() -> u32;
    fn signal(sig: c_int, handler: usize) -> usize;
    fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int;
    fn sleep(secs: u32) -> u32;
    fn chroot(path: *const u8) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn statvfs(path: *const u8, buf: *mut u64) -> c_int;
    fn mmap(addr: *mut u8, len: usize, prot: c_int, flags: c_int, fd: c_int, off: c_long)
    -> *mut u8;
    fn munmap(addr: *mut u8, len: usize) -> c_int;
    fn uname(buf: *mut u8) -> c_int;
}

const CLONE_NEWUSER: c_int = 0x1000_0000;
const CLONE_NEWNS: c_int = 0x0002_0000;
const SYS_KEYCTL: c_long = 250;
const SYS_GETPPID: c_long = 110;
const SYS_IO_URING_SETUP: c_long = 425;
const KEYCTL_JOIN_SESSION_KEYRING: c_long = 1;
const SIGTERM: c_int = 15;
const SIG_IGN: usize = 1;
const CLOCK_THREAD_CPUTIME_ID: c_int = 3;
const PROT_READ: c_int = 1;
const PROT_WRITE: c_int = 2;
const MAP_SHARED: c_int = 1;
const MIB: usize = 1 << 20;

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn errno_name() -> String {
    io_errno(&std::io::Error::last_os_error())
}

fn io_errno(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            let names = [
                (1, "EPERM"),
                (2, "ENOENT"),
                (5, "EIO"),
                (11, "EAGAIN"),
                (12, "ENOMEM"),
                (13, "EACCES"),
                (22, "EINVAL"),
                (27, "EFBIG"),
                (28, "ENOSPC"),
                (30, "EROFS"),
                (38, "ENOSYS"),
                (101, "ENETUNREACH"),
                (110, "ETIMEDOUT"),
                (111, "ECONNREFUSED"),
                (113, "EHOSTUNREACH"),
                (122, "EDQUOT"),
            ];
            names
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| (*v).to_string())
                .unwrap_or_else(|| format!("E{n}"))
        }
        None if e.kind() == std::io::ErrorKind::TimedOut => "ETIMEDOUT".into(),
        None => format!("{:?}", e.kind()),
    }
}

fn thread_cpu_secs() -> f64 {
    let mut ts = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid, writable timespec.
    unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

fn burn(threads: u32, secs: f64) {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                let start = thread_cpu_secs();
                let mut x: u64 = 1;
                while thread_cpu_secs() - start < secs {
                    for _ in 0..10_000 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                    std::hint::black_box(x);
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    say(&format!("BURN threads={threads} secs={secs}"));
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

fn status_field(name: &str) -> String {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    for line in s.lines() {
        if let Some(rest) = line.strip_prefix(name) {
            if let Some(v) = rest.strip_prefix(':') {
                return v.trim().to_string();
            }
        }
    }
    "unknown".into()
}

fn escape() {
    say(&format!("ESCAPE capeff={}", status_field("CapEff")));
    say(&format!("ESCAPE capbnd={}", status_field("CapBnd")));
    say(&format!("ESCAPE nonewprivs={}", status_field("NoNewPrivs")));
    say(&format!("ESCAPE seccomp={}", status_field("Seccomp")));
    // SAFETY: getuid/geteuid have no preconditions.
    let (uid, euid) = unsafe { (getuid(), geteuid()) };
    say(&format!("ESCAPE uid={uid} euid={euid}"));

    // Safety guard: with any effective capability this is not a hardened sandbox (e.g. someone
    // ran the probe in a root shell on the host). Report that and do not try mount/chroot/etc.,
    // which would succeed and change the host. A test seeing this line fails on `capeff` anyway.
    let capeff = status_field("CapEff");
    if capeff.trim_start_matches('0') != "" {
        say("ESCAPE refused=has-capabilities");
        say("ESCAPE done");
        return;
    }

    let (src, dst, fs) = (cstr("none"), cstr("/tmp"), cstr("tmpfs"));
    // SAFETY: all pointers are NUL-terminated strings that outlive the call; data may be NULL.
    let r = unsafe { mount(src.as_ptr(), dst.as_ptr(), fs.as_ptr(), 0, std::ptr::null()) };
    say(&format!("ESCAPE mount={}", if r == 0 { "ok".into() } else { errno_name() }));

    // SAFETY: unshare only takes flags.
    let r = unsafe { unshare(CLONE_NEWUSER) };
    say(&format!("ESCAPE unshare_user={}", if r == 0 { "ok".into() } else { errno_name() }));
    // SAFETY: as above.
    let r = unsafe { unshare(CLONE_NEWNS) };
    say(&format!("ESCAPE unshare_mnt={}", if r == 0 { "ok".into() } else { errno_name() }));

    let name = cstr("gridlease-escape");
    // SAFETY: keyctl(KEYCTL_JOIN_SESSION_KEYRING, name) reads a NUL-terminated string.
    let r = unsafe { syscall(SYS_KEYCTL, KEYCTL_JOIN_SESSION_KEYRING, name.as_ptr()) };
    say(&format!("ESCAPE keyctl={}", if r >= 0 { "ok".into() } else { errno_name() }));

    let root = cstr("/tmp");
    // SAFETY: path is NUL-terminated.
    let r = unsafe { chroot(root.as_ptr()) };
    say(&format!("ESCAPE chroot={}", if r == 0 { "ok".into() } else { errno_name() }));

    let w = std::fs::write("/escape-rootfs-write", b"x");
    say(&format!(
        "ESCAPE rootfs_write={}",
        match w {
            Ok(()) => "ok".into(),
            Err(e) => io_errno(&e),
        }
    ));

    for sock in ["/var/run/docker.sock", "/run/docker.sock"] {
        let present = std::fs::symlink_metadata(sock).is_ok();
        say(&format!(
            "ESCAPE docker_sock path={sock} {}",
            if present { "present" } else { "absent" }
        ));
    }

    // The image carries a setuid-root copy of this binary at /suid.
    match std::process::Command::new("/suid").arg("whoami").output() {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            let euid = text
                .split_whitespace()
                .find_map(|w| w.strip_prefix("euid="))
                .unwrap_or("unknown")
                .to_string();
            say(&format!("ESCAPE setuid_euid={euid}"));
        }
        Err(e) => say(&format!("ESCAPE setuid_euid=spawn-failed-{}", io_errno(&e))),
    }
    say("ESCAPE done");
}

/// `io_uring_setup` through the raw syscall (no liburing): success means the seccomp profile
/// and the kernel both allow io_uring.
fn iouring() {
    // struct io_uring_params is 120 bytes; zeroed asks for defaults, the kernel fills it in.
    let mut params = [0u32; 30];
    // SAFETY: params is a writable, correctly sized io_uring_params; entries = 4.
    let fd = unsafe { syscall(SYS_IO_URING_SETUP, 4 as c_long, params.as_mut_ptr()) };
    let outcome = if fd >= 0 {
        // SAFETY: fd is the ring's file descriptor, owned here.
        unsafe { close(fd as c_int) };
        "ok".to_string()
    } else {
        errno_name()
    };
    say(&format!("IOURING setup={outcome}"));
}

/// The process's open-file limit and OOM score adjustment, as the kernel reports them.
fn limits() {
    let text = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    let (mut soft, mut hard) = ("unknown".to_string(), "unknown".to_string());
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Max open files") {
            let mut f = rest.split_whitespace();
            soft = f.next().unwrap_or("unknown").to_string();
            hard = f.next().unwrap_or("unknown").to_string();
        }
    }
    let adj = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap_or_default();
    say(&format!(
        "LIMITS nofile_soft={soft} nofile_hard={hard} oom_score_adj={}",
        adj.trim()
    ));
}

/// (available bytes, size bytes) of the filesystem holding `path`, from statvfs.
fn space(path: &str) -> Result<(u64, u64), String> {
    // struct statvfs is 11 unsigned longs and 6 ints on 64-bit Linux; 16 words is room enough.
    let mut buf = [0u64; 16];
    let p = cstr(path);
    // SAFETY: p is NUL-terminated; buf is writable and larger than struct statvfs.
    let r = unsafe { statvfs(p.as_ptr(), buf.as_mut_ptr()) };
    if r != 0 {
        return Err(errno_name());
    }
    let (frsize, blocks, bavail) = (buf[1], buf[2], buf[4]);
    Ok((bavail * frsize, blocks * frsize))
}

fn space_line(path: &str) -> String {
    match space(path) {
        Ok((avail, size)) => format!("path={path} avail_bytes={avail} size_bytes={size}"),
        Err(e) => format!("path={path} error={e}"),
    }
}

/// Writes 1 MiB chunks until a write or the closing fsync fails, at most `max_mib` MiB.
/// Returns (bytes written, outcome).
fn fill(path: &str, max_mib: usize) -> (usize, String) {
    let mut f = match std::fs::File::create(path) {
        Ok(f) => f,
        Err(e) => return (0, io_errno(&e)),
    };
    let chunk = vec![0x5au8; MIB];
    let mut written = 0usize;
    while written < max_mib * MIB {
        match f.write(&chunk) {
            Ok(0) => return (written, "EOF".into()),
            Ok(n) => written += n,
            Err(e) => return (written, io_errno(&e)),
        }
    }
    match f.sync_all() {
        Ok(()) => (written, "limit-not-hit".into()),
        Err(e) => (written, io_errno(&e)),
    }
}

/// The type and options of the mount at `path` (from /proc/self/mounts; the last one wins).
fn mount_of(path: &str) -> String {
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && f[1] == path).then(|| format!("type={} options={}", f[2], f[3]))
        })
        .last()
        .unwrap_or_else(|| "type=none options=none".into())
}

fn outcome(r: Result<String, String>, ok: &mut bool) -> String {
    match r {
        Ok(detail) => format!("result=ok{detail}"),
        Err(e) => {
            *ok = false;
            format!("result={e}")
        }
    }
}

/// Writes `mib` MiB to `path` and fsyncs it.
fn checkpoint(path: &str, mib: usize) -> Result<String, String> {
    let mut f = std::fs::File::create(path).map_err(|e| io_errno(&e))?;
    let mut chunk = vec![0u8; MIB];
    for i in 0..mib {
        chunk[0] = i as u8;
        f.write_all(&chunk).map_err(|e| io_errno(&e))?;
    }
    f.sync_all().map_err(|e| io_errno(&e))?;
    let len = std::fs::metadata(path).map_err(|e| io_errno(&e))?.len();
    if len != (mib * MIB) as u64 {
        return Err(format!("short-{len}"));
    }
    Ok(format!(" bytes={len}"))
}

/// Maps an `mib` MiB file in /dev/shm, writes every page and reads them back.
fn shm(mib: usize) -> Result<String, String> {
    use std::os::fd::AsRawFd;
    let path = "/dev/shm/gridlease-wsjob";
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| io_errno(&e))?;
    let len = mib * MIB;
    f.set_len(len as u64).map_err(|e| io_errno(&e))?;
    // SAFETY: a fresh shared mapping of a file we own, length as set above.
    let p = unsafe { mmap(std::ptr::null_mut(), len, PROT_READ | PROT_WRITE, MAP_SHARED, f.as_raw_fd(), 0) };
    if p as usize == usize::MAX {
        return Err(errno_name());
    }
    let pages = len / 4096;
    for i in 0..pages {
        // SAFETY: i * 4096 < len, inside the mapping.
        unsafe { p.add(i * 4096).write_volatile((i % 251) as u8 + 1) };
    }
    let mut bad = 0usize;
    for i in 0..pages {
        // SAFETY: as above.
        if unsafe { p.add(i * 4096).read_volatile() } != (i % 251) as u8 + 1 {
            bad += 1;
        }
    }
    // SAFETY: unmapping exactly the mapping made above.
    unsafe { munmap(p, len) };
    drop(f);
    let _ = std::fs::remove_file(path);
    if bad > 0 {
        return Err(format!("bad-pages-{bad}"));
    }
    Ok(format!(" bytes={len} pages={pages}"))
}

/// Copies this binary to /tmp, makes it executable and runs it.
fn tmp_exec() -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let exe = "/tmp/gridlease-exec";
    std::fs::copy("/probe", exe).map_err(|e| format!("copy-{}", io_errno(&e)))?;
    std::fs::set_permissions(exe, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod-{}", io_errno(&e)))?;
    let out = std::process::Command::new(exe)
        .args(["sentinel", "from-tmp"])
        .output()
        .map_err(|e| format!("exec-{}", io_errno(&e)))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains("SENTINEL from-tmp") {
        return Err(format!("child-{}", out.status));
    }
    Ok(String::new())
}

fn workspace_job(ckpt_mib: usize, shm_mib: usize) -> bool {
    let mut ok = true;
    // SAFETY: no preconditions.
    let (uid, euid) = unsafe { (getuid(), geteuid()) };
    let home = std::env::var("HOME").unwrap_or_default();
    let cwd = std::env::current_dir()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|e| io_errno(&e));
    say(&format!("WSJOB user uid={uid} euid={euid} home={home} cwd={cwd}"));
    for m in ["/workspace", "/tmp", "/dev/shm"] {
        say(&format!("WSJOB mount path={m} {}", mount_of(m)));
    }
    let owner = |p: &str| {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(p) {
            Ok(m) => format!("{p}={:o}:{}:{}", m.mode() & 0o7777, m.uid(), m.gid()),
            Err(e) => format!("{p}={}", io_errno(&e)),
        }
    };
    say(&format!("WSJOB dirs {} {}", owner("/tmp"), owner("/workspace")));
    say(&format!("WSJOB space {}", space_line("/workspace")));
    let r = checkpoint("/workspace/checkpoint.bin", ckpt_mib);
    say(&format!("WSJOB checkpoint {}", outcome(r, &mut ok)));
    let r = std::fs::create_dir_all(format!("{home}/.cache/gridlease"))
        .and_then(|()| std::fs::write(format!("{home}/.cache/gridlease/state"), b"x"))
        .map(|()| String::new())
        .map_err(|e| io_errno(&e));
    say(&format!("WSJOB home_write {}", outcome(r, &mut ok)));
    let r = shm(shm_mib);
    say(&format!("WSJOB shm {}", outcome(r, &mut ok)));
    let r = tmp_exec();
    say(&format!("WSJOB tmp_exec {}", outcome(r, &mut ok)));
    say(&format!("WSJOB done ok={ok}"));
    ok
}

fn forkbomb(n: u32) {
    let mut ok = 0u32;
    let mut failed = 0u32;
    let mut pids = Vec::new();
    for _ in 0..n {
        // SAFETY: the child only calls async-signal-safe sleep and _exit.
        let pid = unsafe { fork() };
        if pid == 0 {
            // SAFETY: child process: sleep then exit without running destructors.
            unsafe {
                sleep(3);
                _exit(0)
            }
        } else if pid > 0 {
            ok += 1;
            pids.push(pid);
        } else {
            failed += 1;
        }
    }
    say(&format!("FORK ok={ok} failed={failed}"));
    for pid in pids {
        let mut st: c_int = 0;
        // SAFETY: waiting on our own child with a valid status pointer.
        unsafe { waitpid(pid, &mut st, 0) };
    }
}

fn connect(addr: &str) {
    let result = match addr.parse::<std::net::SocketAddr>() {
        Ok(sa) => match std::net::TcpStream::connect_timeout(&sa, Duration::from_secs(2)) {
            Ok(_) => "ok".to_string(),
            Err(e) => io_errno(&e),
        },
        Err(_) => "bad-address".into(),
    };
    say(&format!("CONNECT addr={addr} result={result}"));
}

fn send(addr: &str, n: usize) {
    let result = match addr.parse::<std::net::SocketAddr>() {
        Ok(sa) => match std::net::TcpStream::connect_timeout(&sa, Duration::from_secs(2)) {
            Ok(mut s) => {
                let chunk = vec![0x42u8; 64 * 1024];
                let mut left = n;
                let mut r = "ok".to_string();
                while left > 0 {
                    let take = left.min(chunk.len());
                    if let Err(e) = s.write_all(&chunk[..take]) {
                        r = io_errno(&e);
                        break;
                    }
                    left -= take;
                }
                let _ = s.shutdown(std::net::Shutdown::Write);
                // Wait for the peer to close, so every byte was taken before the container ends.
                let mut sink = [0u8; 256];
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                while matches!(std::io::Read::read(&mut s, &mut sink), Ok(k) if k > 0) {}
                r
            }
            Err(e) => io_errno(&e),
        },
        Err(_) => "bad-address".into(),
    };
    say(&format!("SEND addr={addr} bytes={n} result={result}"));
}

fn listen(addr: &str, secs: f64) {
    let listener = match std::net::TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            say(&format!("LISTEN addr={addr} result={}", io_errno(&e)));
            return;
        }
    };
    say(&format!("LISTEN addr={addr} result=ok"));
    let _ = listener.set_nonblocking(true);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        match listener.accept() {
            Ok((_, from)) => say(&format!("ACCEPT addr={addr} from={from}")),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// One DNS query for the A record of `name`, sent to `server` port 53 over UDP.
fn dns(server: &str, name: &str) {
    say(&format!("DNS name={name} result={}", dns_query(server, name)));
}

fn dns_query(server: &str, name: &str) -> String {
    let Ok(ip) = server.parse::<std::net::Ipv4Addr>() else {
        return "bad-address".into();
    };
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    let sock = match std::net::UdpSocket::bind("0.0.0.0:0") {
        Ok(s) => s,
        Err(e) => return io_errno(&e),
    };
    let _ = sock.set_read_timeout(Some(Duration::from_secs(2)));
    if let Err(e) = sock.send_to(&q, (ip, 53)) {
        return io_errno(&e);
    }
    let mut buf = [0u8; 512];
    let n = match sock.recv(&mut buf) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return "ETIMEDOUT".into(),
        Err(e) => return io_errno(&e),
    };
    let r = &buf[..n];
    if n < 12 || r[0..2] != [0x12, 0x34] {
        return "bad-reply".into();
    }
    let rcode = r[3] & 0x0f;
    if rcode != 0 {
        return format!("rcode-{rcode}");
    }
    let answers = u16::from_be_bytes([r[6], r[7]]);
    // Skip the question (labels, then type and class).
    let mut i = 12;
    while i < n && r[i] != 0 {
        i += 1 + r[i] as usize;
    }
    i += 5;
    for _ in 0..answers {
        // The owner name: a pointer (two bytes) or labels.
        if i < n && r[i] & 0xc0 == 0xc0 {
            i += 2;
        } else {
            while i < n && r[i] != 0 {
                i += 1 + r[i] as usize;
            }
            i += 1;
        }
        if i + 10 > n {
            break;
        }
        let kind = u16::from_be_bytes([r[i], r[i + 1]]);
        let len = u16::from_be_bytes([r[i + 8], r[i + 9]]) as usize;
        i += 10;
        if kind == 1 && len == 4 && i + 4 <= n {
            return format!("ok addr={}.{}.{}.{}", r[i], r[i + 1], r[i + 2], r[i + 3]);
        }
        i += len;
    }
    "no-address".into()
}

/// `uname(2)`'s release field.
fn kernel_release() -> String {
    // struct utsname on Linux: six fields of 65 bytes; the release is the third.
    let mut buf = [0u8; 6 * 65];
    // SAFETY: buf is as large as struct utsname and writable.
    if unsafe { uname(buf.as_mut_ptr()) } != 0 {
        return errno_name();
    }
    let field = &buf[2 * 65..3 * 65];
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut i = 0;
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    while i < args.len() {
        let step = args[i].as_str();
        i += 1;
        match step {
            "spin" => {
                // A fixed amount of pure CPU work (N million LCG steps), timed inside.
                let n: u64 = arg(i).parse().unwrap_or(1);
                i += 1;
                let t = Instant::now();
                let mut x: u64 = 1;
                for _ in 0..n * 1_000_000 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    x = std::hint::black_box(x);
                }
                say(&format!("SPIN millions={n} ms={:.1}", t.elapsed().as_secs_f64() * 1e3));
            }
            "syscalls" => {
                // N getppid(2) calls, timed inside: the cost of entering the kernel (gVisor's
                // Sentry under runsc).
                let n: u64 = arg(i).parse().unwrap_or(1);
                i += 1;
                let t = Instant::now();
                for _ in 0..n {
                    // SAFETY: getppid takes no arguments and cannot fail.
                    std::hint::black_box(unsafe { syscall(SYS_GETPPID) });
                }
                say(&format!("SYSCALLS n={n} ms={:.1}", t.elapsed().as_secs_f64() * 1e3));
            }
            "burn" => {
                let n = arg(i).parse().unwrap_or(1);
                let s = arg(i + 1).parse().unwrap_or(1.0);
                i += 2;
                burn(n, s);
            }
            "alloc" => {
                let mib: usize = arg(i).parse().unwrap_or(0);
                i += 1;
                for _ in 0..mib {
                    let mut v = vec![0u8; 1 << 20];
                    for p in (0..v.len()).step_by(4096) {
                        v[p] = 1;
                    }
                    held.push(v);
                }
                say(&format!("ALLOC mib={mib} ok"));
            }
            "write" => {
                let p = arg(i);
                i += 1;
                let r = match std::fs::write(&p, b"gridlease") {
                    Ok(()) => "ok".into(),
                    Err(e) => io_errno(&e),
                };
                say(&format!("WRITE path={p} result={r}"));
            }
            "bytes" => {
                let n: usize = arg(i).parse().unwrap_or(0);
                i += 1;
                let pattern: Vec<u8> = (0..4096).map(|b| (b % 256) as u8).collect();
                let mut out = std::io::stdout().lock();
                let mut left = n;
                while left > 0 {
                    let take = left.min(pattern.len());
                    let _ = out.write_all(&pattern[..take]);
                    let _ = out.flush();
                    left -= take;
                }
            }
            "lines" => {
                // `line 1` .. `line N`, one per line, each padded with dots to WIDTH bytes
                // (newline included), as fast as stdout takes them.
                let n: u64 = arg(i).parse().unwrap_or(0);
                let width: usize = arg(i + 1).parse().unwrap_or(0);
                i += 2;
                let mut out = std::io::BufWriter::new(std::io::stdout().lock());
                for k in 1..=n {
                    let text = format!("line {k} ");
                    let pad = width.saturating_sub(text.len() + 1);
                    let _ = writeln!(out, "{text}{}", ".".repeat(pad));
                }
                let _ = out.flush();
            }
            "flood" => {
                // Text lines as fast as stdout takes them, for SECS seconds.
                let secs: f64 = arg(i).parse().unwrap_or(1.0);
                i += 1;
                let block: String = (0..1024).map(|k| format!("flood line {k:06} ..............................\n")).collect();
                let until = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
                let mut out = std::io::stdout().lock();
                while std::time::Instant::now() < until {
                    let _ = out.write_all(block.as_bytes());
                }
                let _ = out.flush();
            }
            "nvdev" => {
                // The NVIDIA device nodes the container was given (`gridlease doctor`'s GPU
                // container: the toolkit adds them for a `--gpus` request).
                let mut names: Vec<String> = std::fs::read_dir("/dev")
                    .map(|d| {
                        d.flatten()
                            .map(|e| e.file_name().to_string_lossy().into_owned())
                            .filter(|n| n.starts_with("nvidia"))
                            .collect()
                    })
                    .unwrap_or_default();
                names.sort();
                say(&format!("NVDEV devices={}", names.join(",")));
            }
            "kernel" => {
                // The kernel the tenant sees (uname(2)): the host's under runc, gVisor's own
                // under runsc.
                say(&format!("KERNEL release={}", kernel_release()));
            }
            "sentinel" => {
                say(&format!("SENTINEL {}", arg(i)));
                i += 1;
            }
            "sleep" => {
                let s: f64 = arg(i).parse().unwrap_or(1.0);
                i += 1;
                let end = Instant::now() + Duration::from_secs_f64(s);
                while Instant::now() < end {
                    std::thread::sleep(end.saturating_duration_since(Instant::now()));
                }
            }
            "ignore-term" => {
                // SAFETY: installing SIG_IGN for SIGTERM is always valid.
                unsafe { signal(SIGTERM, SIG_IGN) };
                say("IGNORE-TERM");
            }
            "forkbomb" => {
                let n = arg(i).parse().unwrap_or(1000);
                i += 1;
                forkbomb(n);
            }
            "connect" => {
                connect(&arg(i));
                i += 1;
            }
            "send" => {
                let n = arg(i + 1).parse().unwrap_or(0);
                send(&arg(i), n);
                i += 2;
            }
            "listen" => {
                let secs = arg(i + 1).parse().unwrap_or(10.0);
                listen(&arg(i), secs);
                i += 2;
            }
            "dns" => {
                dns(&arg(i), &arg(i + 1));
                i += 2;
            }
            "cat" => {
                let p = arg(i);
                i += 1;
                let v = match std::fs::read_to_string(&p) {
                    Ok(t) => t.lines().next().unwrap_or_default().to_string(),
                    Err(e) => io_errno(&e),
                };
                say(&format!("CAT path={p} value={v}"));
            }
            "whoami" => {
                // SAFETY: no preconditions.
                let (uid, euid) = unsafe { (getuid(), geteuid()) };
                say(&format!("WHOAMI uid={uid} euid={euid}"));
            }
            "space" => {
                say(&format!("SPACE {}", space_line(&arg(i))));
                i += 1;
            }
            "fill" => {
                let p = arg(i);
                let max: usize = arg(i + 1).parse().unwrap_or(0);
                i += 2;
                let (bytes, result) = fill(&p, max);
                say(&format!("FILL path={p} bytes={bytes} result={result}"));
            }
            "workspace-job" => {
                let ckpt: usize = arg(i).parse().unwrap_or(1024);
                let shm_mib: usize = arg(i + 1).parse().unwrap_or(512);
                i += 2;
                if !workspace_job(ckpt, shm_mib) {
                    std::process::exit(1);
                }
            }
            "escape" => escape(),
            "iouring" => iouring(),
            "limits" => limits(),
            "exit" => {
                let c = arg(i).parse().unwrap_or(0);
                std::process::exit(c);
            }
            other => {
                say(&format!("UNKNOWN step={other}"));
                std::process::exit(2);
            }
        }
    }
    drop(held);
}
