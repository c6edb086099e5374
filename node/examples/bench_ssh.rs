//! Port forwarding against `ssh -L` (issue 45): throughput both ways and echo latency of
//! `gridlease forward`, of `ssh -L` through a local OpenSSH sshd (aes128-gcm@openssh.com, then
//! chacha20-poly1305@openssh.com), of `ssh -L` through `gridlease ssh-proxy`, and of a direct
//! loopback connection, measured in one run with the paths alternated in every round.
//!
//! `cargo build --release -p gridlease-node --bins --examples && sudo target/release/examples/bench_ssh [ROUNDS]`
//!
//! Needs root (setns, nsenter), Docker, `/bin/busybox` (Debian `busybox-static`) and OpenSSH
//! (`apt-get install openssh-server openssh-client`). `BENCH_SSH_ROUNDS` (or the first
//! argument; default 9) and `BENCH_SSH_MIB` (default 256) set the rounds and the size of each
//! transfer. `BENCH_GRIDLEASE_BIN` runs another build's `gridlease` (to compare two builds
//! against the same ssh).
//!
//! Set-up: two real `gridlease node` processes on loopback (the release binary beside this
//! example), a lease of a from-scratch busybox image whose command serves a file of MIB MiB
//! with `httpd` on port 8080, echoes with `nc -ll -e cat` on 9000, and sinks uploads on 9100
//! (`nc -ll -e`, one `dd` per connection that reads exactly MIB MiB, then answers `ok`). The
//! servers are the same for every path; only the way to them differs:
//!
//! - **direct**: a socket made inside the container's network namespace (`setns`, as the
//!   provider does), to the servers on the container's loopback;
//! - **forward**: `gridlease forward LEASE 0:8080 0:9000 0:9100` on the renter;
//! - **ssh -L aes128-gcm / chacha20**: an OpenSSH `sshd` (its own config, host key and
//!   authorized key in a temporary directory, `-D -e`, on 127.0.0.1:2222) and an `ssh -N -L`
//!   client, both started in the container's network namespace with `nsenter --net`, so sshd
//!   reaches the same servers on the same loopback; the client's ports are reached through the
//!   namespace as well;
//! - **ssh -L via gridlease ssh-proxy**: `gridlease ssh-config LEASE` writes an ssh config whose
//!   host `gl-<12 hex digits>` has `gridlease ssh-proxy --fdpass` as its ProxyCommand (with
//!   `ProxyUseFdpass yes`: ssh speaks SSH to the renter's node over the control socket);
//!   `ssh -F CONFIG -N -L ...` on the host. Skipped, with a note, where `gridlease ssh-config`
//!   fails (a build without it);
//! - **the same on stdio**: the entry's ProxyCommand without `--fdpass` and `ProxyUseFdpass
//!   no` (`ssh-proxy` copies the node's connection to its stdin and stdout).
//!
//! Each round measures every path in turn (the first path rotates from round to round): a GET
//! of the file (download), MIB MiB sent into the sink (upload), and 200 round trips of 64
//! bytes on one open echo connection. Reported: medians of the rounds (MB/s), the echo p50 over
//! all rounds, each as a ratio to `ssh -L` with aes128-gcm (OpenSSH's fastest cipher here).

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

const HTTP: u16 = 8080;
const ECHO: u16 = 9000;
const SINK: u16 = 9100;
const SSHD_PORT: u16 = 2222;
const ECHO_PER_ROUND: usize = 200;

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn p50_ms(mut v: Vec<Duration>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
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

/// Sends `bytes` (of `chunk`, repeated) to the sink and waits for its `ok`: it has read all.
fn upload(mut s: TcpStream, chunk: &[u8], bytes: u64) {
    let mut left = bytes;
    while left > 0 {
        let k = left.min(chunk.len() as u64) as usize;
        s.write_all(&chunk[..k]).unwrap();
        left -= k as u64;
    }
    let mut ok = [0u8; 3];
    s.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"ok\n", "the sink's answer");
}

fn echo_rounds(mut s: TcpStream, rounds: usize, out: &mut Vec<Duration>) {
    s.set_nodelay(true).unwrap();
    let msg = [7u8; 64];
    let mut back = [0u8; 64];
    for _ in 0..rounds {
        let t = Instant::now();
        s.write_all(&msg).unwrap();
        s.read_exact(&mut back).unwrap();
        out.push(t.elapsed());
    }
}

/// Pseudo-random bytes (xorshift), so no path can compress them.
fn random_chunk(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut v = vec![0u8; len];
    for c in v.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes());
    }
    v
}

/// How a path is reached: ports for the file, the echo and the sink, on the host's loopback
/// or inside the container's namespace.
struct Route {
    name: String,
    in_netns: bool,
    ports: [u16; 3],
    dl: Vec<f64>,
    ul: Vec<f64>,
    echo: Vec<Duration>,
}

impl Route {
    fn new(name: &str, in_netns: bool, ports: [u16; 3]) -> Self {
        Self {
            name: name.into(),
            in_netns,
            ports,
            dl: Vec::new(),
            ul: Vec::new(),
            echo: Vec::new(),
        }
    }
}

/// Waits until `port` accepts connections (in the namespace or on the host).
fn wait_port(connect: &dyn Fn(bool, u16) -> std::io::Result<TcpStream>, netns: bool, port: u16) {
    wait(Duration::from_secs(30), || connect(netns, port).is_ok());
}

/// `ssh -N -L` for the three servers, through `args` (a destination and its options), with the
/// local ports `ports`; in the container's namespace where `pid` is given.
fn ssh_forward(pid: Option<&str>, ports: [u16; 3], args: &[&str]) -> Kill {
    let mut c = match pid {
        Some(pid) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/proc/{pid}/ns/net")).arg("ssh");
            c
        }
        None => Command::new("ssh"),
    };
    c.args([
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        "-o",
        "BatchMode=yes",
    ]);
    for (local, remote) in ports.iter().zip([HTTP, ECHO, SINK]) {
        c.arg("-L")
            .arg(format!("127.0.0.1:{local}:127.0.0.1:{remote}"));
    }
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    Kill(c.spawn().unwrap())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("BENCH_SSH_ROUNDS").ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(9);
    let mib: u64 = std::env::var("BENCH_SSH_MIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    let bytes = mib << 20;
    // Every tool is looked for before anything is started (a panic later would leave the
    // lease's container behind).
    let sshd_bin = ["/usr/sbin/sshd", "/usr/bin/sshd"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("sshd (apt-get install openssh-server)");
    let sb = Sandbox::connect().await.expect("Docker is needed");
    sb.ensure_probe_image().await.unwrap();
    let busybox = std::fs::read("/bin/busybox").expect("/bin/busybox (busybox-static)");
    let tag = format!("gridlease-bench-busybox-{}:1", std::process::id());
    sb.import_busybox_image(&tag, &busybox).await.unwrap();
    // Dropped last (declared before the daemons): removes what the run made, even on a panic.
    let mut leftovers = Leftovers {
        image: tag.clone(),
        provider: None,
    };
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
            &(mib.div_ceil(1024) + 1).to_string(),
        ],
    );
    let status = cli(&ph, &["status"]);
    let addr = status["listen_addrs"][0].as_str().unwrap().to_string();
    let provider_peer = status["peer_id"].as_str().unwrap().to_string();
    leftovers.provider = Some(provider_peer.clone());
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
            "60",
            "--detach",
            "--image",
            &tag,
            "--",
            "sh",
            "-c",
            &format!(
                "cd /workspace && dd if=/dev/zero of=big bs=1M count={mib} 2>/dev/null && \
                 printf 'dd of=/dev/null bs=65536 count={bytes} iflag=count_bytes,fullblock \
                 status=none\\necho ok\\n' > sink && \
                 httpd -p {HTTP} -h /workspace && \
                 {{ nc -ll -p {SINK} -e sh /workspace/sink & }} && \
                 exec nc -ll -p {ECHO} -e cat"
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
    let container = gridlease_sandbox::spec::container_name_of(&id.parse().unwrap());
    let ns = sb.container_netns(&container).await.unwrap();
    let connect = |in_netns: bool, port: u16| -> std::io::Result<TcpStream> {
        let s = if in_netns {
            let rt = tokio::runtime::Handle::current();
            let s = tokio::task::block_in_place(|| {
                rt.block_on(ns.connect(port, Duration::from_secs(5)))
            })
            .map_err(std::io::Error::other)?;
            s.set_nonblocking(false)?;
            s
        } else {
            TcpStream::connect(("127.0.0.1", port))?
        };
        s.set_nodelay(true)?;
        Ok(s)
    };
    // The lease's command writes the file first: wait for the servers.
    for p in [HTTP, ECHO, SINK] {
        wait_port(&connect, true, p);
    }
    let pid = String::from_utf8(
        Command::new("docker")
            .args(["inspect", "-f", "{{.State.Pid}}", &container])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();

    let mut routes = vec![Route::new("direct loopback", true, [HTTP, ECHO, SINK])];
    let mut keep: Vec<Kill> = Vec::new();

    // gridlease forward.
    let mut fwd = Command::new(gridlease_bin())
        .arg("--home")
        .arg(&rh)
        .args(["forward", &id, "0:8080", "0:9000", "0:9100"])
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
    let ports = [port(), port(), port()];
    keep.push(Kill(fwd));
    routes.push(Route::new("`gridlease forward`", false, ports));

    // OpenSSH: sshd and ssh in the container's namespace.
    let sshdir = dir.path().join("ssh");
    std::fs::create_dir_all(&sshdir).unwrap();
    for (key, comment) in [("host_key", "host"), ("id", "client")] {
        let k = sshdir.join(key);
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
            .arg(&k)
            .output()
            .unwrap();
        assert!(out.status.success(), "ssh-keygen");
    }
    std::fs::copy(sshdir.join("id.pub"), sshdir.join("authorized_keys")).unwrap();
    let cfg = sshdir.join("sshd_config");
    std::fs::write(
        &cfg,
        format!(
            "ListenAddress 127.0.0.1:{SSHD_PORT}\nHostKey {d}/host_key\n\
             AuthorizedKeysFile {d}/authorized_keys\nPidFile none\nUsePAM no\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             PermitRootLogin prohibit-password\nStrictModes no\nAllowTcpForwarding yes\n\
             Ciphers aes128-gcm@openssh.com,chacha20-poly1305@openssh.com\n\
             Compression no\nLogLevel ERROR\n",
            d = sshdir.display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let sshd = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args([sshd_bin, "-D", "-e", "-f"])
        .arg(&cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    keep.push(Kill(sshd));
    wait_port(&connect, true, SSHD_PORT);
    let id_file = sshdir.join("id").display().to_string();
    for (i, (cipher, name)) in [
        ("aes128-gcm@openssh.com", "`ssh -L`, aes128-gcm"),
        (
            "chacha20-poly1305@openssh.com",
            "`ssh -L`, chacha20-poly1305",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let base = 18000 + 1000 * i as u16;
        let ports = [base + 80, base + 90, base + 100];
        keep.push(ssh_forward(
            Some(&pid),
            ports,
            &[
                "-i",
                &id_file,
                "-c",
                cipher,
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
                "-p",
                &SSHD_PORT.to_string(),
                "root@127.0.0.1",
            ],
        ));
        for p in ports {
            wait_port(&connect, true, p);
        }
        routes.push(Route::new(name, true, ports));
    }

    // ssh -L through gridlease ssh-proxy, where this build has it.
    let ssh_config = Command::new(gridlease_bin())
        .arg("--home")
        .arg(&rh)
        .args(["ssh-config", "--no-include", &id])
        .output()
        .unwrap();
    if ssh_config.status.success() {
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let config = rh.join("ssh").join("config").display().to_string();
        let host = format!("gl-{}", &id[..12]);
        // As `ssh-config` writes the entry (ssh speaks to the node over the socket ssh-proxy
        // hands it), and without `ProxyUseFdpass` (ssh-proxy copies that socket to its stdio:
        // one process more on the path, what older entries do).
        let piped = format!(
            "ProxyCommand '{}' --home '{}' ssh-proxy {id}",
            gridlease_bin().display(),
            rh.display()
        );
        for (name, extra) in [
            ("`ssh -L` via `gridlease ssh-proxy`", vec![]),
            (
                "`ssh -L` via `gridlease ssh-proxy` on stdio (no fdpass)",
                vec!["-o", "ProxyUseFdpass=no", "-o", &piped],
            ),
        ] {
            let ports = [free(), free(), free()];
            let mut args = extra;
            args.extend(["-F", &config, &host]);
            keep.push(ssh_forward(None, ports, &args));
            for p in ports {
                wait_port(&connect, false, p);
            }
            routes.push(Route::new(name, false, ports));
        }
    } else {
        eprintln!(
            "note: `gridlease ssh-config` failed, so `ssh -L` through `gridlease ssh-proxy` is \
             not measured: {}",
            String::from_utf8_lossy(&ssh_config.stderr).trim()
        );
    }

    let chunk = random_chunk(256 * 1024);
    for r in 0..rounds {
        let n = routes.len();
        for k in 0..n {
            let route = &mut routes[(r + k) % n];
            let [http, echo, sink] = route.ports;
            let t = Instant::now();
            let got = get(connect(route.in_netns, http).unwrap(), "/big");
            assert!(got as u64 > bytes, "{}: short read: {got}", route.name);
            route.dl.push(got as f64 / t.elapsed().as_secs_f64() / 1e6);
            let t = Instant::now();
            upload(connect(route.in_netns, sink).unwrap(), &chunk, bytes);
            route
                .ul
                .push(bytes as f64 / t.elapsed().as_secs_f64() / 1e6);
            echo_rounds(
                connect(route.in_netns, echo).unwrap(),
                ECHO_PER_ROUND,
                &mut route.echo,
            );
        }
        eprintln!("round {} of {rounds} done", r + 1);
    }

    let summary: Vec<(String, f64, f64, f64)> = routes
        .into_iter()
        .map(|r| (r.name, median(r.dl), median(r.ul), p50_ms(r.echo)))
        .collect();
    let direct_p50 = summary[0].3;
    let ssh = summary
        .iter()
        .find(|s| s.0.contains("aes128-gcm"))
        .cloned()
        .unwrap();
    println!(
        "| path ({mib} MiB, medians of {rounds} rounds; echo p50 of {}) | download MB/s | upload MB/s | 64 B echo p50 ms (added) | download / ssh aes | upload / ssh aes | added p50 / ssh aes's |",
        rounds * ECHO_PER_ROUND
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, dl, ul, p50) in &summary {
        let added = p50 - direct_p50;
        let ssh_added = ssh.3 - direct_p50;
        println!(
            "| {name} | {dl:.0} | {ul:.0} | {p50:.3} (+{added:.3}) | {:.2}x | {:.2}x | {} |",
            dl / ssh.1,
            ul / ssh.2,
            if name == &summary[0].0 {
                "—".to_string()
            } else {
                format!("{:.2}x", added / ssh_added)
            }
        );
    }

    drop(keep);
    let _ = Command::new(gridlease_bin())
        .arg("--home")
        .arg(&rh)
        .args(["stop", &id])
        .output();
    drop(renter);
    drop(provider);
    drop(leftovers);
}

/// What a run leaves on the host: the provider's containers and workspaces, and the image.
/// Removed when dropped, on a panic too (on a thread of its own: the bench's runtime may be
/// unwinding).
struct Leftovers {
    image: String,
    provider: Option<String>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        let (image, provider) = (self.image.clone(), self.provider.take());
        let cleanup = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Runtime::new() else {
                return;
            };
            rt.block_on(async {
                let Ok(sb) = Sandbox::connect().await else {
                    return;
                };
                if let Some(peer) = provider {
                    let label = format!("label={}={peer}", gridlease_sandbox::spec::LABEL_NODE);
                    let ids = Command::new("docker")
                        .args(["ps", "-aq", "--filter", &label])
                        .output()
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_default();
                    for id in ids.split_whitespace() {
                        let _ = sb.remove(id).await;
                    }
                    let _ = sb.remove_node_workspaces(&peer).await;
                }
                let _ = sb.remove_image(&image).await;
            });
        });
        let _ = cleanup.join();
    }
}
