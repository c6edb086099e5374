//! Peers that flood a provider (issue 41, items 4 and 5): a provider node started with an
//! open-file limit of 1,024 (soft and hard, as a terminal might give it) serves a running
//! lease while
//! - three strangers (in-process libp2p nodes of this test, holding no lease) open access
//!   streams as fast as they can and never send a request on them, keeping up to 300 each
//!   open (each is blocked once it has opened 32); and
//! - a raw TCP flooder keeps up to 1,500 connections to the provider's listening port open,
//!   never starting a handshake.
//!
//! Meanwhile the lease's renter still gets `exec` through within 2 s (every time), the
//! provider's control API answers `status` within 100 ms, and the provider's log grows by a
//! bounded number of lines. Every load loop here is bounded in count and time, and sends only
//! to 127.0.0.1.
//!
//! Needs Docker and busybox-static: with `GRIDLEASE_REQUIRE_DOCKER=1` (`.ci/run` installs it)
//! it fails when one is missing, otherwise it skips with a note.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;
mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cli_support::{BusyboxImage, Launch, cli, json, lease_of, market_launched, text, wait_for};

/// How long the floods run at most.
const FLOOD: Duration = Duration::from_secs(40);

/// `GET /v1/status` on a node's control socket, by hand: how long the answer took.
fn status_took(home: &Path) -> Duration {
    let started = Instant::now();
    let mut s = UnixStream::connect(home.join("api.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET /v1/status HTTP/1.1\r\nHost: gridlease\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    assert!(out.starts_with(b"HTTP/1.1 200"), "{}", text(&out));
    started.elapsed()
}

/// Keeps up to `hold` raw TCP connections to `port` open (replacing those the node closes)
/// until `stop` or [`FLOOD`]; counts the connections made.
fn tcp_flood(port: u16, hold: usize, stop: Arc<AtomicBool>, made: Arc<AtomicU64>) {
    let until = Instant::now() + FLOOD;
    let mut open: Vec<std::net::TcpStream> = Vec::new();
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        // Drop the ones the node closed.
        open.retain(|s| {
            let mut b = [0u8; 1];
            s.set_nonblocking(true).is_ok()
                && matches!(s.peek(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        });
        while open.len() < hold && Instant::now() < until {
            match std::net::TcpStream::connect_timeout(
                &([127, 0, 0, 1], port).into(),
                Duration::from_millis(200),
            ) {
                Ok(s) => {
                    made.fetch_add(1, Ordering::Relaxed);
                    open.push(s);
                }
                Err(_) => break,
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A stranger node that opens access streams to `provider` and sends nothing on them,
/// keeping the newest `hold` open, until `stop` or [`FLOOD`]; counts the streams opened.
async fn stream_flood(
    root: &Path,
    name: String,
    provider: libp2p::PeerId,
    addr: libp2p::Multiaddr,
    hold: usize,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicU64>,
) {
    let n = common::start(root, &name, common::config()).await;
    n.node.client.dial(addr).await.unwrap().unwrap();
    let mut control = n.node.client.streams();
    let until = Instant::now() + FLOOD;
    let mut held = std::collections::VecDeque::new();
    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
        match tokio::time::timeout(
            Duration::from_secs(2),
            control.open_stream(provider, gridlease_node::access::protocol()),
        )
        .await
        {
            Ok(Ok(s)) => {
                opened.fetch_add(1, Ordering::Relaxed);
                held.push_back(s);
                if held.len() > hold {
                    held.pop_front();
                }
            }
            Ok(Err(_)) | Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    drop(held);
    common::stop(n).await;
}

#[test]
fn a_flood_of_streams_and_connections_leaves_the_renter_and_the_api_served() {
    let test = "access_flood";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    // This test's own descriptors: 1,500 flood connections and the stranger nodes' streams.
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let log = dir.path().join("provider.log");
    let locals = format!(
        "{},{}",
        gridlease_sandbox::probe_image::probe_image_tag(),
        image.tag
    );
    let m = market_launched(
        dir.path(),
        &["--local-image", &locals],
        Some(&log),
        ["", ""],
        Launch {
            env: &[],
            nofile: Some(1024),
        },
    );
    let rented = json(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "600",
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
    let exec_ok = |rh: &Path| {
        let started = Instant::now();
        let out = cli(rh, &["exec", &id, "--", "echo", "still here"]);
        (
            out.status.success() && text(&out.stdout).contains("still here"),
            started.elapsed(),
            text(&out.stderr),
        )
    };
    let (ok, _, err) = exec_ok(&rh);
    assert!(ok, "{err}");

    let status = json(&ph, &["status"]);
    let addr: libp2p::Multiaddr = status["listen_addrs"][0].as_str().unwrap().parse().unwrap();
    let port = addr
        .iter()
        .find_map(|p| match p {
            libp2p::multiaddr::Protocol::Tcp(port) => Some(port),
            _ => None,
        })
        .unwrap();
    let provider: libp2p::PeerId = m.provider_peer.parse().unwrap();
    let lines_before = std::fs::read_to_string(&log).unwrap().lines().count();

    let stop = Arc::new(AtomicBool::new(false));
    let (made, opened) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let strangers = {
        let (stop, opened, root) = (stop.clone(), opened.clone(), dir.path().join("strangers"));
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let floods = (0..3).map(|i| {
                    stream_flood(
                        &root,
                        format!("s{i}"),
                        provider,
                        addr.clone(),
                        300,
                        stop.clone(),
                        opened.clone(),
                    )
                });
                futures::future::join_all(floods).await;
            });
        })
    };
    // The strangers connect first (a flood of handshakes holds the node's pending slots: new
    // connections from this machine wait while it lasts; remote hosts have slots of their
    // own per address), then the TCP flood joins; both fill what they can.
    wait_for(Duration::from_secs(30), "the strangers' streams", || {
        opened.load(Ordering::Relaxed) >= 96
    });
    let tcp = {
        let (stop, made) = (stop.clone(), made.clone());
        std::thread::spawn(move || tcp_flood(port, 1500, stop, made))
    };
    std::thread::sleep(Duration::from_secs(5));
    let mut worst_status = Duration::ZERO;
    let mut worst_exec = Duration::ZERO;
    for _ in 0..5 {
        for _ in 0..10 {
            worst_status = worst_status.max(status_took(&ph));
        }
        let (ok, took, err) = exec_ok(&rh);
        assert!(ok, "exec during the flood: {err}");
        worst_exec = worst_exec.max(took);
        std::thread::sleep(Duration::from_millis(500));
    }
    let (made_n, opened_n) = (made.load(Ordering::Relaxed), opened.load(Ordering::Relaxed));
    stop.store(true, Ordering::Relaxed);
    tcp.join().unwrap();
    strangers.join().unwrap();
    eprintln!(
        "{made_n} TCP connections and {opened_n} stranger streams opened; status at worst {worst_status:?}, exec at worst {worst_exec:?}"
    );
    assert!(
        made_n >= 1500,
        "the TCP flood made only {made_n} connections"
    );
    assert!(
        opened_n >= 96,
        "the strangers opened only {opened_n} streams"
    );
    assert!(
        worst_status <= Duration::from_millis(100),
        "status took {worst_status:?}"
    );
    assert!(
        worst_exec <= Duration::from_secs(2),
        "exec took {worst_exec:?}"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    // Each stranger was blocked once it had opened 32 streams without a lease.
    let blocked = logged
        .lines()
        .filter(|l| l.contains("peer blocked"))
        .count();
    assert_eq!(blocked, 3, "{logged}");
    let grew = logged.lines().count() - lines_before;
    assert!(
        grew <= 300,
        "the provider's log grew by {grew} lines:\n{}",
        logged.lines().rev().take(40).collect::<Vec<_>>().join("\n")
    );
    // And after it, everything as before.
    let (ok, _, err) = exec_ok(&rh);
    assert!(ok, "{err}");
    drop(m);
}
