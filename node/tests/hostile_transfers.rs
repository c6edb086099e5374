//! File copies as a hostile renter and a hostile tenant use them (issue 41, items 1, 2 and 8):
//! two real `gridlease node` processes, the real Docker daemon, a busybox image; the hostile
//! streams are written by this test itself (raw HTTP upgrades on the renter's control socket,
//! then transfer frames carrying tar archives built byte by byte), not by the CLI.
//!
//! - Item 2: uploads that go through a symlink (one the upload makes, or one the tenant made
//!   in `/workspace` pointing at `/etc`, `/tmp` or `/`) are refused; nothing outside
//!   `/workspace` changes (inside the container and in `docker diff`), the host's disk grows
//!   by less than the lease's disk, and a plain upload still lands with its mtime.
//! - Items 1 and 8: a tree with an absolute symlink and a 20 GiB sparse file downloads (the
//!   link left out with a warning, exit 6; the file sparse on the renter's disk); a download
//!   whose reader stops reading with the stream held open leaves Docker answering (`docker
//!   inspect` within 2 s); the lease still ends within 5 s of its deadline and both ledgers
//!   agree; `--max-size` leaves a file out.
//!
//! Needs Docker and busybox-static: with `GRIDLEASE_REQUIRE_DOCKER=1` (`.ci/run` installs it)
//! they fail when one is missing, otherwise they skip with a note.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cli_support::{BusyboxImage, Market, bin, busybox_market, cli, json, lease_of, text, wait_for};
use gridlease_protocol::transfer::{MAX_TRANSFER_FRAME, TransferFrame};

/// A market whose provider runs the busybox image with `extra` flags, and a running lease of
/// `seconds` that sleeps: the market and the lease id.
fn running_lease(dir: &Path, image: &str, seconds: u32, extra: &[&str]) -> (Market, String) {
    let m = busybox_market(dir, image, &dir.join("provider.log"), extra);
    let rented = json(
        &dir.join("renter"),
        &[
            "rent",
            &m.offer,
            "--seconds",
            &seconds.to_string(),
            "--detach",
            "--image",
            image,
            "--",
            "sleep",
            "3600",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "the lease to run", || {
        lease_of(&dir.join("provider"), &id)["state"] == "running"
    });
    (m, id)
}

/// `gridlease exec LEASE -- sh -c SCRIPT` on the renter: (exit code, stdout).
fn sh(rh: &Path, id: &str, script: &str) -> (i32, String) {
    let out = cli(rh, &["exec", id, "--", "sh", "-c", script]);
    (out.status.code().unwrap_or(-1), text(&out.stdout))
}

/// Opens `POST /v1/leases/{id}/{what}` with `body` as an HTTP upgrade on the renter's control
/// socket, by hand; the upgraded connection.
fn upgrade(rh: &Path, id: &str, what: &str, body: &str) -> UnixStream {
    let mut s = UnixStream::connect(rh.join("api.sock")).unwrap();
    write!(
        s,
        "POST /v1/leases/{id}/{what} HTTP/1.1\r\nHost: gridlease\r\nContent-Type: application/json\r\nConnection: upgrade\r\nUpgrade: gridlease-access\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "{}", text(&head));
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", text(&head));
    s
}

fn frame(f: &TransferFrame) -> Vec<u8> {
    gridlease_protocol::access::frame::<_, MAX_TRANSFER_FRAME>(f).unwrap()
}

/// Reads one transfer frame; `None` at the end of the stream.
fn read_frame(s: &mut UnixStream) -> Option<TransferFrame> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).ok()?;
    Some(gridlease_protocol::codec::decode::<TransferFrame, { MAX_TRANSFER_FRAME }>(&body).unwrap())
}

/// A raw tar header block, written byte by byte (a tar library refuses hostile ones).
fn header(name: &str, kind: u8, link: &str, size: u64, mtime: u64) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |field: &mut [u8], v: u64| {
        let s = format!("{v:0width$o}", width = field.len() - 1);
        field[..s.len()].copy_from_slice(s.as_bytes());
    };
    octal(&mut h[100..108], 0o644);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], mtime);
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    h.to_vec()
}

/// One entry of a hostile archive: (name, type byte, link target, data bytes (zeros)).
type Raw<'a> = (&'a str, u8, &'a str, u64);

/// Uploads the archive of `entries` (then the end blocks) on a raw stream and returns the
/// provider's answer (`None`: the stream ended without one). File data is zeros, sent in
/// chunks; the provider may answer and close while data is still being sent.
fn raw_upload(rh: &Path, id: &str, entries: &[Raw<'_>], mtime: u64) -> Option<TransferFrame> {
    let mut s = upgrade(rh, id, "upload", r#"{"dest":""}"#);
    let mut hash = blake3::Hasher::new();
    let mut sent = 0u64;
    let mut send = |s: &mut UnixStream, bytes: &[u8]| -> bool {
        for piece in bytes.chunks(256 * 1024) {
            if s.write_all(&frame(&TransferFrame::Chunk(piece.to_vec())))
                .is_err()
            {
                return false;
            }
            hash.update(piece);
            sent += piece.len() as u64;
        }
        true
    };
    let zeros = vec![0u8; 256 * 1024];
    let mut open = true;
    'entries: for (name, kind, link, size) in entries {
        if !send(&mut s, &header(name, *kind, link, *size, mtime)) {
            open = false;
            break;
        }
        let mut left = *size + (512 - size % 512) % 512;
        while left > 0 {
            let n = left.min(zeros.len() as u64) as usize;
            if !send(&mut s, &zeros[..n]) {
                open = false;
                break 'entries;
            }
            left -= n as u64;
        }
    }
    if open && send(&mut s, &[0u8; 1024]) {
        let end = TransferFrame::End {
            bytes: sent,
            blake3: *hash.finalize().as_bytes(),
        };
        let _ = s.write_all(&frame(&end));
    }
    read_frame(&mut s)
}

fn docker(args: &[&str]) -> (bool, String) {
    let out = Command::new("docker").args(args).output().unwrap();
    (out.status.success(), text(&out.stdout) + &text(&out.stderr))
}

/// Bytes used on the filesystem of Docker's root directory.
fn docker_root_used() -> u64 {
    let (_, root) = docker(&["info", "--format", "{{.DockerRootDir}}"]);
    let st = rustix::fs::statvfs(root.trim()).unwrap();
    (st.f_blocks - st.f_bfree) * st.f_frsize
}

#[test]
fn hostile_uploads_change_nothing_outside_the_workspace() {
    let test = "hostile_uploads";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rh = dir.path().join("renter");
    // A 1 GiB disk: the hostile upload below is larger.
    let (m, id) = running_lease(dir.path(), &image.tag, 600, &["--per-gpu-disk-gib", "1"]);
    // The tenant's own links out of its workspace.
    let (code, _) = sh(
        &rh,
        &id,
        "ln -s /etc /workspace/tenant-etc && ln -s /tmp /workspace/tenant-tmp && ln -s / /workspace/tenant-root",
    );
    assert_eq!(code, 0);
    let used_before = docker_root_used();
    let container = cli_support::containers_of(&id)[0].0.clone();
    let big = 1_280 << 20;
    for (entries, what) in [
        (
            vec![("link", b'2', "/", 0), ("link/etc/big", b'0', "", big)],
            "a symlink to / made by the upload",
        ),
        (
            vec![("tenant-root/big", b'0', "", big)],
            "the tenant's link to /",
        ),
        (
            vec![("tenant-etc/big", b'0', "", 8 << 20)],
            "the tenant's link to /etc",
        ),
        (
            vec![("tenant-tmp/big", b'0', "", 8 << 20)],
            "the tenant's link to /tmp",
        ),
        (vec![("../big", b'0', "", 4096)], "a path with .."),
        (vec![("/big", b'0', "", 4096)], "an absolute path"),
        (vec![("up", b'2', "../../", 0)], "a relative link out"),
        (vec![("hard", b'1', "/etc/passwd", 0)], "a hard link"),
    ] {
        match raw_upload(&rh, &id, &entries, 1_700_000_000) {
            Some(TransferFrame::Error(e)) => eprintln!("{what}: refused: {e}"),
            other => panic!("{what}: the provider answered {other:?}"),
        }
    }
    // Nothing landed outside /workspace: seen from inside, and in the container's layer.
    let (_, found) = sh(
        &rh,
        &id,
        "ls -d /big /etc/big /tmp/big /link /workspace/link 2>/dev/null; df -k /tmp | tail -1",
    );
    assert!(!found.contains("big"), "{found}");
    let (_, diff) = docker(&["diff", &container]);
    assert!(!diff.contains("big"), "docker diff: {diff}");
    let tmp_used: u64 = found
        .split_whitespace()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(tmp_used < 1024, "/tmp holds {tmp_used} KiB");
    let grew = docker_root_used().saturating_sub(used_before);
    assert!(grew < 1 << 30, "the host's disk grew by {grew} bytes");
    // A plain upload still lands, with its modification time.
    match raw_upload(
        &rh,
        &id,
        &[("data/", b'5', "", 0), ("data/ok", b'0', "", 4096)],
        1_700_000_123,
    ) {
        Some(TransferFrame::Done { entries, .. }) => assert_eq!(entries, 2),
        other => panic!("a plain upload: {other:?}"),
    }
    let (code, out) = sh(&rh, &id, "stat -c '%s %Y %u' /workspace/data/ok");
    assert_eq!((code, out.trim()), (0, "4096 1700000123 65534"));
    drop(m);
}

#[test]
fn a_download_that_meets_hostile_files_or_a_stalled_reader_never_holds_the_lease() {
    let test = "hostile_downloads";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let (m, id) = running_lease(dir.path(), &image.tag, 75, &["--per-gpu-disk-gib", "1"]);
    let (code, _) = sh(
        &rh,
        &id,
        "mkdir /workspace/out2 && ln -s /etc /workspace/out2/a-link && truncate -s 20G /workspace/out2/big && echo hello > /workspace/out2/small && head -c 8192 /dev/urandom > /workspace/out2/some",
    );
    assert_eq!(code, 0);
    let container = cli_support::containers_of(&id)[0].0.clone();
    let inspect_answers = || {
        let started = Instant::now();
        let out = Command::new("timeout")
            .args([
                "2",
                "docker",
                "inspect",
                "--format",
                "{{.State.Status}}",
                &container,
            ])
            .output()
            .unwrap();
        (out.status.success(), started.elapsed())
    };

    // A reader that asks for the tree, takes its first frame and stops reading, holding the
    // stream open.
    let mut stalled = upgrade(&rh, &id, "download", r#"{"path":"out2"}"#);
    stalled
        .write_all(&frame(&TransferFrame::Go { max_bytes: None }))
        .unwrap();
    assert!(matches!(
        read_frame(&mut stalled),
        Some(TransferFrame::Root { directory: true })
    ));
    std::thread::sleep(Duration::from_secs(3));
    let (ok, took) = inspect_answers();
    assert!(
        ok,
        "docker inspect failed or took over 2 s ({took:?}) while a download stalls"
    );

    // The CLI's download: the absolute link is left out with a warning, the rest lands, the
    // 20 GiB sparse file as a sparse file.
    let dl = dir.path().join("dl");
    let out = cli(
        &rh,
        &[
            "cp",
            &format!("{id}:/workspace/out2"),
            dl.join("out2").to_str().unwrap(),
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert!(stderr.contains("left out a-link"), "{stderr}");
    assert_eq!(std::fs::read(dl.join("out2/small")).unwrap(), b"hello\n");
    assert_eq!(std::fs::read(dl.join("out2/some")).unwrap().len(), 8192);
    use std::os::unix::fs::MetadataExt;
    let bigm = std::fs::metadata(dl.join("out2/big")).unwrap();
    assert_eq!(bigm.len(), 20 << 30);
    assert!(
        bigm.blocks() * 512 < 1 << 20,
        "{} blocks on the renter's disk",
        bigm.blocks()
    );
    assert!(!dl.join("out2/a-link").exists());
    // --max-size leaves out what would pass it.
    let out = cli(
        &rh,
        &[
            "cp",
            "--max-size",
            "4KiB",
            &format!("{id}:/workspace/out2"),
            dl.join("capped").to_str().unwrap(),
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert!(
        stderr.contains("left out some") && stderr.contains("--max-size"),
        "{stderr}"
    );
    assert!(!dl.join("capped/some").exists());
    let (ok, took) = inspect_answers();
    assert!(ok, "docker inspect after the downloads: {took:?}");

    // The deadline holds with the stalled reader still there, and both sides agree.
    let view = lease_of(&ph, &id);
    let deadline_ms =
        view["started_at"].as_u64().unwrap() + 1000 * view["duration_s"].as_u64().unwrap();
    wait_for(Duration::from_secs(120), "the container to stop", || {
        let (ok, state) = docker(&["inspect", "--format", "{{.State.Running}}", &container]);
        !ok || state.trim() == "false"
    });
    let stopped_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        stopped_ms <= deadline_ms + 5_000,
        "the container ran {} ms past its deadline",
        stopped_ms.saturating_sub(deadline_ms)
    );
    drop(stalled);
    wait_for(Duration::from_secs(60), "both sides to settle", || {
        lease_of(&ph, &id)["state"] == "settled" && lease_of(&rh, &id)["state"] == "settled"
    });
    let (p, r) = (lease_of(&ph, &id), lease_of(&rh, &id));
    assert_eq!(p["settled_total"], r["settled_total"]);
    assert_eq!(p["close_reason"], r["close_reason"]);
    let ledger = |home: &Path| json(home, &["ledger"]);
    assert_eq!(ledger(&ph)["total_earned"], ledger(&rh)["total_spent"]);
    let _ = bin();
    drop(m);
}
