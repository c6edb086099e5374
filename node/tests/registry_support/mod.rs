//! A real image registry for tests: Debian's `docker-registry` (the CNCF distribution
//! registry) serving a temporary directory on a free loopback port, images pushed to it by the
//! real Docker daemon, and a TCP proxy that stalls a pull mid-layer. Everything is removed when
//! dropped, also when a test fails. Nothing listens beyond 127.0.0.1.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr
)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use gridlease_sandbox::Sandbox;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The registry binary (Debian package `docker-registry`, installed by `.ci/run`).
pub const REGISTRY_BIN: &str = "docker-registry";

/// A running registry.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub host: String,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Registry {
    /// Starts one, or `None` (the test skips) when the binary is missing and
    /// `GRIDLEASE_REQUIRE_DOCKER` is not set; with it set, a missing binary fails the test.
    pub fn start(test: &str) -> Option<Self> {
        let found = Command::new(REGISTRY_BIN)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            if std::env::var_os("GRIDLEASE_REQUIRE_DOCKER").is_some() {
                panic!("{test}: {REGISTRY_BIN} is not installed (apt-get install docker-registry)");
            }
            eprintln!("{test}: SKIPPED, {REGISTRY_BIN} is not installed");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let host = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        let storage = dir.path().join("storage");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
                storage.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let r = Self {
            child,
            host,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&r.host).is_err() {
            assert!(Instant::now() < deadline, "the registry did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(r)
    }

    /// The registry's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("registry.log")).unwrap_or_default()
    }
}

/// Images whose references start with a prefix, removed (forced) when dropped.
pub struct ImagesGuard(pub Vec<String>);

impl Drop for ImagesGuard {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = Command::new("docker")
                .args(["rmi", "-f", image])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The probe's root filesystem plus `/pad`: `pad` bytes of deterministic noise from `seed`
/// (incompressible, so the layer's compressed size is about its size).
pub fn probe_rootfs_with_pad(pad: usize, seed: u64) -> Vec<u8> {
    let base = gridlease_sandbox::probe_image::rootfs_tar().unwrap();
    let mut ar = tar::Archive::new(&base[..]);
    let mut out = tar::Builder::new(Vec::new());
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let mut h = e.header().clone();
        let path = e.path().unwrap().into_owned();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data).unwrap();
        out.append_data(&mut h, path, &data[..]).unwrap();
    }
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let noise: Vec<u8> = (0..pad)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(noise.len() as u64);
    out.append_data(&mut h, "pad", &noise[..]).unwrap();
    out.into_inner().unwrap()
}

/// Imports a probe image with `pad` bytes of noise as `reference` (in `registry`), pushes it,
/// and removes the local copy, so a lease has to pull it. `changes` are Dockerfile-style
/// (`ENV CUDA_VERSION=99.0`).
pub async fn push_probe(sb: &Sandbox, reference: &str, pad: usize, seed: u64, changes: &[&str]) {
    let mut all = vec!["ENTRYPOINT [\"/probe\"]"];
    all.extend_from_slice(changes);
    sb.import_image(reference, probe_rootfs_with_pad(pad, seed), &all)
        .await
        .unwrap();
    let (repo, tag) = reference.rsplit_once(':').unwrap();
    let opts = bollard::query_parameters::PushImageOptionsBuilder::default()
        .tag(tag)
        .build();
    let mut s = sb.docker().push_image(repo, Some(opts), None);
    while let Some(ev) = s.next().await {
        let ev = ev.unwrap();
        if let Some(d) = ev.error_detail.and_then(|d| d.message) {
            panic!("push {reference}: {d}");
        }
    }
    let opts = bollard::query_parameters::RemoveImageOptionsBuilder::default()
        .force(true)
        .build();
    sb.docker()
        .remove_image(reference, Some(opts), None)
        .await
        .unwrap();
}

/// A TCP proxy in front of `upstream` that forwards every connection, but stops forwarding
/// the answer of any connection after `pass` bytes (keeping both ends open): a registry that
/// stalls in the middle of a layer. Manifests and configs are far smaller than `pass`.
pub struct StallProxy {
    /// `127.0.0.1:PORT`.
    pub host: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StallProxy {
    /// A proxy that forwards answers at most `bytes_per_s` (in 100 ms steps): a slow link.
    pub async fn throttled(upstream: String, bytes_per_s: usize) -> Self {
        Self::start_with(upstream, usize::MAX, bytes_per_s).await
    }

    pub async fn start(upstream: String, pass: usize) -> Self {
        Self::start_with(upstream, pass, usize::MAX).await
    }

    async fn start_with(upstream: String, pass: usize, bytes_per_s: usize) -> Self {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = l.local_addr().unwrap().to_string();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            // Bounded: a pull opens a handful of connections.
            for _ in 0..64 {
                let Ok((client, _)) = l.accept().await else {
                    return;
                };
                let upstream = upstream.clone();
                conns.spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    });
                    let mut sent = 0usize;
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let room = pass.saturating_sub(sent);
                        if room == 0 {
                            // Stall: hold the connection open, forward nothing more.
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            break;
                        }
                        let want = room.min(buf.len());
                        let n = match sr.read(&mut buf[..want]).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        sent += n;
                        if bytes_per_s != usize::MAX {
                            let ms = (n as u64).saturating_mul(1000) / bytes_per_s.max(1) as u64;
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                    }
                    up.abort();
                });
            }
            while conns.join_next().await.is_some() {}
        });
        Self { host, task }
    }
}

/// A unique prefix for this test run's image names.
pub fn run_prefix(test: &str) -> String {
    format!("glt-{}-{}", std::process::id(), test.replace('_', "-"))
}
