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

/// One HTTP/1.1 request to the registry at `host`, written by hand: (status, headers, body).
fn http(
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(host).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let at = out.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&out[..at]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head, out[at + 4..].to_vec())
}

/// Uploads a blob to `repo` on the registry; its digest.
fn put_blob(host: &str, repo: &str, data: &[u8]) -> String {
    use sha2::Digest as _;
    let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(data)));
    let (status, head, _) = http(
        host,
        "POST",
        &format!("/v2/{repo}/blobs/uploads/"),
        &[],
        b"",
    );
    assert_eq!(status, 202, "{head}");
    let location = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("Location: ")
                .or_else(|| l.strip_prefix("location: "))
        })
        .unwrap()
        .trim()
        .to_string();
    let path = location
        .strip_prefix(&format!("http://{host}"))
        .unwrap_or(&location)
        .to_string();
    let sep = if path.contains('?') { '&' } else { '?' };
    let (status, head, _) = http(
        host,
        "PUT",
        &format!("{path}{sep}digest={digest}"),
        &[("Content-Type", "application/octet-stream")],
        data,
    );
    assert_eq!(status, 201, "{head}");
    digest
}

/// Pushes `repo:tag` to the registry at `host`, written by hand over HTTP: one layer whose
/// tar holds `zeros` bytes of zeros in one file (a multiple of 1 MiB), gzip-compressed (as
/// concatenated gzip members, about 1 KiB per MiB: a decompression bomb). Returns the
/// layer's compressed size.
pub fn push_zeros_bomb(host: &str, repo: &str, tag: &str, zeros: u64) -> u64 {
    use sha2::Digest as _;
    use std::io::Write;
    const MIB: usize = 1 << 20;
    assert_eq!(zeros % MIB as u64, 0);
    let gz = |data: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    };
    let mut h = tar::Header::new_gnu();
    h.set_path("zeros").unwrap();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(zeros);
    h.set_cksum();
    let block = vec![0u8; MIB];
    let mut diff = sha2::Sha256::new();
    let mut layer = Vec::new();
    diff.update(h.as_bytes());
    layer.extend(gz(h.as_bytes()));
    let member = gz(&block);
    for _ in 0..zeros / MIB as u64 {
        diff.update(&block);
        layer.extend_from_slice(&member);
    }
    diff.update([0u8; 1024]);
    layer.extend(gz(&[0u8; 1024]));
    let diff_id = format!("sha256:{}", hex::encode(diff.finalize()));
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{"Entrypoint":["/zeros"]}},"rootfs":{{"type":"layers","diff_ids":["{diff_id}"]}}}}"#
    );
    let layer_digest = put_blob(host, repo, &layer);
    let config_digest = put_blob(host, repo, config.as_bytes());
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json","config":{{"mediaType":"application/vnd.docker.container.image.v1+json","size":{},"digest":"{config_digest}"}},"layers":[{{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","size":{},"digest":"{layer_digest}"}}]}}"#,
        config.len(),
        layer.len()
    );
    let (status, head, _) = http(
        host,
        "PUT",
        &format!("/v2/{repo}/manifests/{tag}"),
        &[(
            "Content-Type",
            "application/vnd.docker.distribution.manifest.v2+json",
        )],
        manifest.as_bytes(),
    );
    assert_eq!(status, 201, "{head}");
    layer.len() as u64
}
