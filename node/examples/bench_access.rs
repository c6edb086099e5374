//! Interactive access over the P2P link, measured in one run against like-for-like baselines:
//! port forwarding (`gridlease forward`) against a direct loopback TCP connection to the same
//! server, and `gridlease cp` of a 1 GiB tree against `docker cp` of the same tree into the
//! same container and against raw loopback TCP carrying the same bytes.
//!
//! `cargo build --release -p gridlease-node --bins --examples && sudo target/release/examples/bench_access [ROUNDS]`
//!
//! Two real `gridlease node` processes (the release binary next to this example) on loopback,
//! a lease running a from-scratch busybox image (`/bin/busybox`, Debian `busybox-static`)
//! whose command serves a 1 GiB file with `httpd` on port 8080 and echoes with `nc -ll -e cat`
//! on port 9000, and one `gridlease forward LEASE 0:8080 0:9000` process. The path forwarded:
//! client -> the forward process (loopback TCP) -> the renter daemon (control socket) ->
//! libp2p (TCP, noise, yamux) -> the provider daemon -> the container's loopback.
//! Direct: the same client code on a socket made inside the container's network namespace
//! (`setns`, as the provider does), so it reaches the same server on the same loopback.
//! Needs root (setns) and Docker.
//!
//! Measured, direct and forwarded interleaved: GET of the 1 GiB file (MB/s, median of ROUNDS);
//! 64-byte echo round trips on one open connection (p50/p99 of 2000); a 1 KiB GET on a new
//! connection each (p50/p99 of 200: connection set-up included).
//!
//! Copies (ROUNDS each, interleaved, median): a tree of 64 random 16 MiB files in 4
//! directories; `gridlease cp DIR LEASE:/workspace/gN` (the renter's CLI and node, libp2p,
//! the provider's node, Docker's archive API), `docker cp DIR CONTAINER:/workspace/dN` (the
//! Docker CLI straight to the daemon's archive API), each into the same workspace; the
//! download the same way back; and raw TCP: the same files read and sent over one
//! loopback TCP connection to a reader that discards them. Every timed copy starts after a
//! `sync`, so none pays for the writeback of the 1 GiB the copy before it left dirty. Then one
//! file of 1 GiB (random bytes) the same ways: up and down with `gridlease cp` and with
//! `docker cp` (issue 42 item 12: one large file, not only a tree).
//!
//! `BENCH_ACCESS_MIB` (default 1024, a multiple of 64) sets every size above: the file served,
//! the tree (64 files of MIB/64) and the single file. `.ci/run` runs the smallest (64, one
//! round) so the benchmark is known to work.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

mod bench_support;

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bench_support::{Kill, cli, daemon, gridlease_bin, wait};
use gridlease_sandbox::Sandbox;

/// Writes every dirty page back before a timed copy, so that no copy pays for the writeback
/// of the one before it (each copy puts 1 GiB in the page cache: the workspace's loop device
/// and its backing file, or the local destination).
fn settle() {
    assert!(Command::new("sync").status().unwrap().success(), "sync");
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Sends an HTTP/1.0 GET on `s` and reads the whole answer: bytes read.
fn get(mut s: TcpStream, path: &str) -> usize {
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut n = 0;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return n,
            Ok(k) => n += k,
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn echo_rounds(mut s: TcpStream, rounds: usize) -> Vec<Duration> {
    s.set_nodelay(true).unwrap();
    let msg = [7u8; 64];
    let mut back = [0u8; 64];
    let mut out = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        s.write_all(&msg).unwrap();
        s.read_exact(&mut back).unwrap();
        out.push(t.elapsed());
    }
    out.sort();
    out
}

fn run_ok(c: &mut Command) {
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Pseudo-random bytes (xorshift from `x`), the next state returned.
fn fill(buf: &mut [u8], mut x: u64) -> u64 {
    for chunk in buf.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
    x
}

/// 64 files of `mib`/64 MiB of pseudo-random bytes in 4 directories: total bytes.
fn random_tree(root: &Path, mib: u64) -> u64 {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let each = usize::try_from(mib / 64).unwrap() << 20;
    let mut buf = vec![0u8; each];
    for i in 0..64 {
        x = fill(&mut buf, x);
        let p = root.join(format!("d{}/f{i:02}.bin", i % 4));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &buf).unwrap();
    }
    64 * each as u64
}

/// One file of `mib` MiB of pseudo-random bytes, written 16 MiB at a time: its bytes.
fn random_file(path: &Path, mib: u64) -> u64 {
    let mut f = std::fs::File::create(path).unwrap();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..mib {
        x = fill(&mut buf, x);
        f.write_all(&buf).unwrap();
    }
    mib << 20
}

/// Reads every file under `root` and sends it over one loopback TCP connection to a thread
/// that discards it; returns once the reader has everything.
fn raw_tcp(root: &Path) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let sink = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 256 * 1024];
        let mut n = 0u64;
        loop {
            match s.read(&mut buf).unwrap() {
                0 => return n,
                k => n += k as u64,
            }
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let mut f = std::fs::File::open(&p).unwrap();
                std::io::copy(&mut f, &mut s).unwrap();
            }
        }
    }
    drop(s);
    sink.join().unwrap();
}

/// CPU seconds used so far, by process: every process's user + system time from
/// `/proc/PID/stat` (clock ticks of 1/100 s), keyed by its name, the two daemons by role, and
/// the children this bench waited for (the CLIs) as `cli`. `BENCH_ACCESS_CPU=1` prints, for
/// each copy, the difference between two snapshots: where the cores went.
fn cpu_snapshot(daemons: &[(u32, &str)]) -> std::collections::BTreeMap<String, f64> {
    let mut m = std::collections::BTreeMap::new();
    let ticks = |fields: &[&str], a: usize, b: usize| -> f64 {
        (fields[a].parse::<f64>().unwrap_or(0.0) + fields[b].parse::<f64>().unwrap_or(0.0)) / 100.0
    };
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        // Fields after the name: state is [0]; utime [11], stime [12], cutime [13], cstime [14].
        let f: Vec<&str> = stat[close + 2..].split(' ').collect();
        if f.len() < 15 {
            continue;
        }
        let name = daemons
            .iter()
            .find(|(p, _)| *p == pid)
            .map_or_else(|| comm.to_string(), |(_, n)| (*n).to_string());
        *m.entry(name).or_insert(0.0) += ticks(&f, 11, 12);
        if pid == std::process::id() {
            *m.entry("cli (children)".into()).or_insert(0.0) += ticks(&f, 13, 14);
        }
    }
    m
}

/// Prints where the CPU went between two snapshots (`BENCH_ACCESS_CPU=1`).
fn cpu_report(
    what: &str,
    seconds: f64,
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) {
    let mut d: Vec<(String, f64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v >= 0.05)
        .collect();
    d.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = d.iter().map(|(_, v)| v).sum();
    let parts: Vec<String> = d.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
    eprintln!(
        "cpu {what}: {seconds:.2} s wall, {total:.2} core-s ({:.0}% of 2 cores): {}",
        100.0 * total / seconds / 2.0,
        parts.join(", ")
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let mib: u64 = std::env::var("BENCH_ACCESS_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1024);
    assert!(
        mib >= 64 && mib.is_multiple_of(64),
        "BENCH_ACCESS_MIB is a multiple of 64"
    );
    // Every copy of every round stays in the workspace (docker cp's files are root's): the
    // tree and the file, up both ways, per round, and the served file.
    let disk_gib = (mib * (4 * rounds as u64 + 1)).div_ceil(1024) + 1;
    let sb = Sandbox::connect().await.expect("Docker is needed");
    sb.ensure_probe_image().await.unwrap();
    let busybox = std::fs::read("/bin/busybox").expect("/bin/busybox (busybox-static)");
    let tag = format!("gridlease-bench-busybox-{}:1", std::process::id());
    sb.import_busybox_image(&tag, &busybox).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("p"), dir.path().join("r"));
    let provider = daemon(
        &ph,
        &[
            "--dev-gpus",
            "RTX 4090:24GiB:3.60",
            "--local-image",
            &tag,
            "--per-gpu-disk-gib",
            &disk_gib.to_string(),
        ],
    );
    let status = cli(&ph, &["status"]);
    let addr = status["listen_addrs"][0].as_str().unwrap().to_string();
    let provider_peer = status["peer_id"].as_str().unwrap().to_string();
    let renter = daemon(&rh, &["--bootstrap", &addr]);
    let mut offer = String::new();
    wait(Duration::from_secs(30), || {
        let rows = cli(&rh, &["search"]);
        if let Some(id) = rows[0]["id"].as_str() {
            offer = id.to_string();
        }
        !offer.is_empty()
    });
    let rented = cli(
        &rh,
        &[
            "rent",
            &offer,
            "--minutes",
            "30",
            "--detach",
            "--image",
            &tag,
            "--",
            "sh",
            "-c",
            &format!(
                "cd /workspace && dd if=/dev/zero of=big bs=1M count={mib} 2>/dev/null && \
                 dd if=/dev/zero of=small bs=1k count=1 2>/dev/null && \
                 httpd -p 8080 -h /workspace && exec nc -ll -p 9000 -e cat"
            ),
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    wait(Duration::from_secs(120), || {
        let all = cli(&ph, &["leases"]);
        all.as_array().is_some_and(|a| {
            a.iter()
                .any(|l| l["lease_id"] == *id && l["state"] == "running")
        })
    });
    let ns = sb
        .container_netns(&gridlease_sandbox::spec::container_name_of(
            &id.parse().unwrap(),
        ))
        .await
        .unwrap();
    let direct = |port: u16| -> TcpStream {
        let rt = tokio::runtime::Handle::current();
        let s =
            tokio::task::block_in_place(|| rt.block_on(ns.connect(port, Duration::from_secs(5))))
                .unwrap();
        s.set_nonblocking(false).unwrap();
        s
    };
    // The files are written by the lease's command: wait for the servers.
    wait(Duration::from_secs(60), || {
        let rt = tokio::runtime::Handle::current();
        tokio::task::block_in_place(|| rt.block_on(ns.connect(9000, Duration::from_secs(1))))
            .is_ok()
    });
    let mut fwd = Command::new(gridlease_bin())
        .arg("--home")
        .arg(&rh)
        .args(["forward", &id, "0:8080", "0:9000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(fwd.stdout.take().unwrap()).lines();
    let mut port = || -> u16 {
        let l = lines.next().unwrap().unwrap();
        l.strip_prefix("forwarding 127.0.0.1:")
            .and_then(|r| r.split(' ').next())
            .and_then(|p| p.parse().ok())
            .unwrap()
    };
    let (http_port, echo_port) = (port(), port());
    let _fwd = Kill(fwd);
    let forwarded = |port: u16| -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_nodelay(true).unwrap();
        s
    };

    // `BENCH_ACCESS_ONLY=forward|cp` runs one part (to profile it); both by default.
    let only = std::env::var("BENCH_ACCESS_ONLY").unwrap_or_default();
    let (fwd_rounds, cp_rounds) = match only.as_str() {
        "forward" => (rounds, 0),
        "cp" => (0, rounds),
        _ => (rounds, rounds),
    };
    // Throughput: 1 GiB GET.
    let (mut d_mbs, mut f_mbs) = (Vec::new(), Vec::new());
    for _ in 0..fwd_rounds {
        for (which, out) in [(0, &mut d_mbs), (1, &mut f_mbs)] {
            let s = if which == 0 {
                direct(8080)
            } else {
                forwarded(http_port)
            };
            let t = Instant::now();
            let n = get(s, "/big");
            assert!(n as u64 > mib << 20, "short read: {n}");
            out.push(n as f64 / t.elapsed().as_secs_f64() / 1e6);
        }
    }
    // Echo latency on one connection.
    let d_echo = echo_rounds(direct(9000), 2000);
    let f_echo = echo_rounds(forwarded(echo_port), 2000);
    // New connection per small GET.
    let (mut d_new, mut f_new) = (Vec::new(), Vec::new());
    for _ in 0..200 {
        let t = Instant::now();
        get(direct(8080), "/small");
        d_new.push(t.elapsed());
        let t = Instant::now();
        get(forwarded(http_port), "/small");
        f_new.push(t.elapsed());
    }
    d_new.sort();
    f_new.sort();

    // Copies.
    let tree = dir.path().join("tree");
    let tree_bytes = random_tree(&tree, mib);
    let one = dir.path().join("one.bin");
    let one_bytes = random_file(&one, mib);
    let (mut g1_up, mut d1_up, mut g1_down, mut d1_down) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let container = gridlease_sandbox::spec::container_name_of(&id.parse().unwrap());
    let (mut g_up, mut d_up, mut g_down, mut d_down, mut raw) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let show_cpu = std::env::var("BENCH_ACCESS_CPU").is_ok_and(|v| v == "1");
    let daemons = [
        (provider.0.id(), "provider node"),
        (renter.0.id(), "renter node"),
    ];
    let mut snap = cpu_snapshot(&daemons);
    let mut phase = |what: &str, t: Instant| {
        if show_cpu {
            let now = cpu_snapshot(&daemons);
            cpu_report(what, t.elapsed().as_secs_f64(), &snap, &now);
            snap = now;
        }
    };
    for r in 0..cp_rounds {
        let mbs = |t: Instant| tree_bytes as f64 / t.elapsed().as_secs_f64() / 1e6;
        settle();
        let t = Instant::now();
        run_ok(Command::new(gridlease_bin()).arg("--home").arg(&rh).args([
            "-q",
            "cp",
            &tree.display().to_string(),
            &format!("{}:/workspace/g{r}", &id[..12]),
        ]));
        g_up.push(mbs(t));
        phase("gridlease cp upload", t);
        settle();
        let t = Instant::now();
        run_ok(Command::new("docker").args([
            "cp",
            &tree.display().to_string(),
            &format!("{container}:/workspace/d{r}"),
        ]));
        d_up.push(mbs(t));
        phase("docker cp upload", t);
        let back = dir.path().join(format!("back-g{r}"));
        settle();
        let t = Instant::now();
        run_ok(Command::new(gridlease_bin()).arg("--home").arg(&rh).args([
            "-q",
            "cp",
            &format!("{}:/workspace/g{r}", &id[..12]),
            &back.display().to_string(),
        ]));
        g_down.push(mbs(t));
        phase("gridlease cp download", t);
        let back_d = dir.path().join(format!("back-d{r}"));
        settle();
        let t = Instant::now();
        run_ok(Command::new("docker").args([
            "cp",
            &format!("{container}:/workspace/d{r}"),
            &back_d.display().to_string(),
        ]));
        d_down.push(mbs(t));
        phase("docker cp download", t);
        settle();
        let t = Instant::now();
        raw_tcp(&tree);
        raw.push(mbs(t));
        phase("raw TCP", t);
        let _ = std::fs::remove_dir_all(&back);
        let _ = std::fs::remove_dir_all(&back_d);

        // One large file, the same four ways.
        let mbs1 = |t: Instant| one_bytes as f64 / t.elapsed().as_secs_f64() / 1e6;
        let (g1, d1) = (format!("g1-{r}.bin"), format!("d1-{r}.bin"));
        settle();
        let t = Instant::now();
        run_ok(Command::new(gridlease_bin()).arg("--home").arg(&rh).args([
            "-q",
            "cp",
            &one.display().to_string(),
            &format!("{}:/workspace/{g1}", &id[..12]),
        ]));
        g1_up.push(mbs1(t));
        phase("gridlease cp upload, one file", t);
        settle();
        let t = Instant::now();
        run_ok(Command::new("docker").args([
            "cp",
            &one.display().to_string(),
            &format!("{container}:/workspace/{d1}"),
        ]));
        d1_up.push(mbs1(t));
        phase("docker cp upload, one file", t);
        let back1 = dir.path().join(format!("back1-g{r}.bin"));
        settle();
        let t = Instant::now();
        run_ok(Command::new(gridlease_bin()).arg("--home").arg(&rh).args([
            "-q",
            "cp",
            &format!("{}:/workspace/{g1}", &id[..12]),
            &back1.display().to_string(),
        ]));
        g1_down.push(mbs1(t));
        phase("gridlease cp download, one file", t);
        let back1_d = dir.path().join(format!("back1-d{r}.bin"));
        settle();
        let t = Instant::now();
        run_ok(Command::new("docker").args([
            "cp",
            &format!("{container}:/workspace/{d1}"),
            &back1_d.display().to_string(),
        ]));
        d1_down.push(mbs1(t));
        phase("docker cp download, one file", t);
        let _ = std::fs::remove_file(&back1);
        let _ = std::fs::remove_file(&back1_d);
        // The copies stay (docker cp's files belong to root, which the tenant cannot remove):
        // the workspace is sized for all rounds.
    }

    let (dm, fm) = (median(d_mbs), median(f_mbs));
    println!("| measure | direct loopback | forwarded | ratio / added |");
    println!("|---|---|---|---|");
    println!(
        "| GET {mib} MiB, MB/s (median of {rounds}) | {dm:.0} | {fm:.0} | {:.2}x |",
        fm / dm
    );
    for (name, d, f) in [
        ("64 B echo round trip, open connection", &d_echo, &f_echo),
        ("1 KiB GET, new connection each", &d_new, &f_new),
    ] {
        println!(
            "| {name}, p50 ms | {:.3} | {:.3} | +{:.3} ms |",
            pct(d, 0.5),
            pct(f, 0.5),
            pct(f, 0.5) - pct(d, 0.5)
        );
        println!(
            "| {name}, p99 ms | {:.3} | {:.3} | +{:.3} ms |",
            pct(d, 0.99),
            pct(f, 0.99),
            pct(f, 0.99) - pct(d, 0.99)
        );
    }

    let (gu, du, gd, dd, rt) = (
        median(g_up),
        median(d_up),
        median(g_down),
        median(d_down),
        median(raw),
    );
    println!();
    println!(
        "| copy of a {mib} MiB tree (64 x {} MiB), MB/s, median of {rounds} | gridlease cp | docker cp | raw loopback TCP | cp / docker cp | cp / raw TCP |",
        mib / 64
    );
    println!("|---|---|---|---|---|---|");
    println!(
        "| upload | {gu:.0} | {du:.0} | {rt:.0} | {:.2}x | {:.2}x |",
        gu / du,
        gu / rt
    );
    println!(
        "| download | {gd:.0} | {dd:.0} | {rt:.0} | {:.2}x | {:.2}x |",
        gd / dd,
        gd / rt
    );
    let (gu1, du1, gd1, dd1) = (
        median(g1_up),
        median(d1_up),
        median(g1_down),
        median(d1_down),
    );
    println!();
    println!(
        "| copy of one {mib} MiB file, MB/s, median of {rounds} | gridlease cp | docker cp | cp / docker cp |"
    );
    println!("|---|---|---|---|");
    println!("| upload | {gu1:.0} | {du1:.0} | {:.2}x |", gu1 / du1);
    println!("| download | {gd1:.0} | {dd1:.0} | {:.2}x |", gd1 / dd1);

    let _ = Command::new(gridlease_bin())
        .arg("--home")
        .arg(&rh)
        .args(["stop", &id])
        .output();
    drop(renter);
    drop(provider);
    // The provider is gone: remove its container and workspace, then the image.
    let name = gridlease_sandbox::spec::container_name_of(&id.parse().unwrap());
    let _ = sb.remove(&name).await;
    let _ = sb.remove_node_workspaces(&provider_peer).await;
    let _ = sb.remove_image(&tag).await;
}
