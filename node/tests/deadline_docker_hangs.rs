//! The deadline holds when Docker stops answering (issue 41, item 1): the provider's node
//! (and with it the deadline watchdog it spawns) reaches Docker through a socket proxy this
//! test runs; once the lease runs, the proxy stops reading and forwarding, so every Docker call
//! of the node and the watchdog hangs. The container must still stop within 5 s of its
//! deadline: the watchdog kills its init process itself. When the proxy lets traffic through
//! again, the lease settles with both ledgers agreeing.
//!
//! Needs Docker and busybox-static: with `GRIDLEASE_REQUIRE_DOCKER=1` (`.ci/run` installs it)
//! it fails when one is missing, otherwise it skips with a note.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cli_support::{BusyboxImage, json, lease_of, market_env, text, wait_for};

/// A Unix-socket proxy to the Docker daemon that can be frozen: frozen, it reads nothing from
/// either side and forwards nothing (calls in flight and new ones hang). Stops when dropped.
struct Proxy {
    path: PathBuf,
    frozen: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

/// Copies `from` to `to` while not frozen, until either side ends or the proxy stops.
fn pump(mut from: UnixStream, mut to: UnixStream, frozen: Arc<AtomicBool>, stop: Arc<AtomicBool>) {
    from.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        if frozen.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

impl Proxy {
    fn start(dir: &Path) -> Self {
        let path = dir.join("docker-proxy.sock");
        let listener = UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let frozen = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, st) = (frozen.clone(), stop.clone());
        let accept = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let upstream = UnixStream::connect("/var/run/docker.sock").unwrap();
                        let (c2, u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                        for (a, b) in [(client, upstream), (u2, c2)] {
                            let (f, st) = (f.clone(), st.clone());
                            held.push(std::thread::spawn(move || pump(a, b, f, st)));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(_) => break,
                }
            }
            for h in held {
                let _ = h.join();
            }
        });
        Self {
            path,
            frozen,
            stop,
            accept: Some(accept),
        }
    }

    fn host(&self) -> String {
        format!("unix://{}", self.path.display())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn the_deadline_holds_while_docker_does_not_answer() {
    let test = "deadline_docker_hangs";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let proxy = Proxy::start(dir.path());
    let host = proxy.host();
    let locals = format!(
        "{},{}",
        gridlease_sandbox::probe_image::probe_image_tag(),
        image.tag
    );
    let m = market_env(
        dir.path(),
        &["--local-image", &locals],
        Some(&dir.path().join("provider.log")),
        ["", ""],
        &[("DOCKER_HOST", &host)],
    );
    let rented = json(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "60",
            "--detach",
            "--image",
            &image.tag,
            "--",
            "sleep",
            "3600",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "the lease to run", || {
        lease_of(&ph, &id)["state"] == "running"
    });
    let view = lease_of(&ph, &id);
    let deadline =
        view["started_at"].as_u64().unwrap() + 1000 * view["duration_s"].as_u64().unwrap();
    let container = cli_support::containers_of(&id)[0].0.clone();
    // The watchdog has asked Docker for the container's init by now (it starts with the
    // container); then Docker stops answering the node and the watchdog.
    wait_for(
        Duration::from_secs(20),
        "the watchdog to find the container's init",
        || {
            std::fs::read_to_string(
                dir.path()
                    .join("provider/leases")
                    .join(format!("{id}.watchdog.log")),
            )
            .is_ok_and(|l| l.contains("init process"))
        },
    );
    proxy.frozen.store(true, Ordering::Relaxed);
    let running = |c: &str| {
        let out = Command::new("docker")
            .args(["inspect", "--format", "{{.State.Running}}", c])
            .output()
            .unwrap();
        text(&out.stdout).trim() == "true"
    };
    assert!(running(&container));
    wait_for(Duration::from_secs(150), "the container to stop", || {
        !running(&container)
    });
    let late = now_ms().saturating_sub(deadline);
    assert!(
        late <= 5_000,
        "the container ran {late} ms past its deadline"
    );
    let log = std::fs::read_to_string(
        dir.path()
            .join("provider/leases")
            .join(format!("{id}.watchdog.log")),
    )
    .unwrap();
    assert!(log.contains("killed directly"), "{log}");
    // Docker answers again: the lease settles, both sides agreeing.
    proxy.frozen.store(false, Ordering::Relaxed);
    wait_for(Duration::from_secs(240), "both sides to settle", || {
        lease_of(&ph, &id)["state"] == "settled" && lease_of(&rh, &id)["state"] == "settled"
    });
    let (p, r) = (lease_of(&ph, &id), lease_of(&rh, &id));
    assert_eq!(p["settled_total"], r["settled_total"]);
    assert_eq!(p["close_reason"], r["close_reason"]);
    drop(m);
    drop(proxy);
}
