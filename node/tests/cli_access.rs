//! Interactive access end to end (issue 14): two real `gridlease node` processes, the real
//! Docker daemon, a busybox image, driven through the CLI.
//!
//! - `gridlease shell` in a real terminal (a tmux pane): a command's output, `stty size`
//!   following a window resize, Ctrl-C interrupting a `sleep` in the container, `exit 3`
//!   returning 3; `gridlease exec` with 1,000,000 bytes piped to `wc -c`.
//! - `gridlease forward`: busybox `httpd` in the container serves a 256 MiB file fetched with
//!   curl through the forwarded port (checksum compared), 32 concurrent half-closing
//!   connections all complete; a peer that is not the lease's renter is refused shell, exec and
//!   forward (and the provider logs it); after the lease ends, all three are refused.
//!
//! Need Docker, tmux, curl and busybox-static: with `GRIDLEASE_REQUIRE_DOCKER=1` (`.ci/run`
//! installs them) they fail when one is missing, otherwise they skip with a note.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;
mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use cli_support::{
    BusyboxImage, ContainersGuard, Tmux, bin, busybox_market, cli, docker_required, http_get, json,
    lease_of, metric, running_lease, scrape, text, tmux_available, wait_for,
};
use gridlease_node::access::{OpenError, open_to};
use gridlease_protocol::access::{AccessRefusal, AccessRequest, TermSize};
use sha2::Digest as _;

fn have(tool: &str, test: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            !docker_required(),
            "{test}: GRIDLEASE_REQUIRE_DOCKER=1 but {tool} is not installed"
        );
        eprintln!("{test}: SKIPPED, {tool} is not installed");
    }
    ok
}

/// `gridlease exec` on the renter, stdin from `input`: (exit code, stdout, stderr).
fn exec(rh: &Path, id: &str, argv: &[&str], input: &[u8]) -> (i32, String, String) {
    let mut child = bin()
        .arg("--home")
        .arg(rh)
        .args(["exec", id, "--"])
        .args(argv)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

#[test]
fn shell_in_a_terminal_and_exec_with_piped_stdin() {
    let test = "cli_access_shell";
    if !tmux_available() {
        assert!(!docker_required(), "{test}: tmux is not installed");
        eprintln!("{test}: SKIPPED, tmux is not installed");
        return;
    }
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("provider.log");
    let (m, id) = running_lease(dir.path(), &image.tag, &log, &[]);
    let _guard = ContainersGuard(m.provider_peer.clone());
    let rh = dir.path().join("renter");

    // exec: a million bytes through stdin, counted in the container; exit codes come back.
    let (code, stdout, stderr) = exec(&rh, &id[..12], &["wc", "-c"], &vec![b'x'; 1_000_000]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.trim(), "1000000", "{stderr}");
    let (code, stdout, stderr) = exec(
        &rh,
        &id,
        &["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 9"],
        b"",
    );
    assert_eq!(
        (code, stdout.as_str(), stderr.as_str()),
        (9, "to-stdout\n", "to-stderr\n")
    );

    // shell: a real terminal.
    let t = Tmux::start("shell");
    t.run(&format!(
        "'{}' --home '{}' shell {}",
        env!("CARGO_BIN_EXE_gridlease"),
        rh.display(),
        &id[..12],
    ));
    t.type_line("echo hel''lo-from-the-container; id -u");
    t.wait_until(Duration::from_secs(30), "the command's output", |screen| {
        let lines: Vec<&str> = screen.lines().map(str::trim).collect();
        lines
            .windows(2)
            .any(|w| w == ["hello-from-the-container", "65534"])
    });
    t.type_line("stty size");
    t.wait_until(Duration::from_secs(10), "stty size 50 200", |s| {
        s.lines().any(|l| l.trim() == "50 200")
    });
    t.resize(120, 40);
    std::thread::sleep(Duration::from_millis(300));
    t.type_line("stty size");
    t.wait_until(Duration::from_secs(10), "stty size 40 120", |s| {
        s.lines().any(|l| l.trim() == "40 120")
    });
    // Ctrl-C reaches the container's process (the terminal's interrupt character): the
    // 100 s sleep ends at once with 128 + SIGINT.
    t.type_line("sleep 100");
    // Pressed once the sleep runs in the container (seen through exec), not before.
    wait_for(Duration::from_secs(20), "the sleep to run", || {
        let (_, ps, _) = exec(&rh, &id, &["ps"], b"");
        ps.lines().any(|l| l.trim_end().ends_with("sleep 100"))
    });
    t.send(&["C-c"]);
    t.type_line("echo slept-$?");
    t.wait_until(Duration::from_secs(10), "slept-130", |s| {
        s.lines().any(|l| l.trim() == "slept-130")
    });
    t.type_line("exit 3");
    let (screen, status) = t.wait_exit(Duration::from_secs(20));
    assert_eq!(status, "3", "{screen}");
    drop(m);
}

/// What a stranger (an in-process node that holds no lease) gets for `req` from `provider`.
fn stranger_asks(provider_addr: &str, provider: &str, reqs: Vec<AccessRequest>) -> Vec<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let root = tempfile::tempdir().unwrap();
        let n = common::start(root.path(), "stranger", common::config()).await;
        n.node
            .client
            .dial(provider_addr.parse().unwrap())
            .await
            .unwrap()
            .unwrap();
        let peer = provider.parse().unwrap();
        let mut out = Vec::new();
        for r in reqs {
            match open_to(&n.node.client, peer, r).await {
                Err(OpenError::Refused(AccessRefusal::NotRenter)) => {
                    out.push(n.peer.to_string());
                }
                Err(e) => panic!("a stranger got {e} instead of not-the-renter"),
                Ok(_) => panic!("a stranger was granted access"),
            }
        }
        common::stop(n).await;
        out
    })
}

#[test]
fn forward_serves_a_big_file_and_many_connections_and_only_the_renter_gets_in() {
    let test = "cli_access_forward";
    if !have("curl", test) {
        return;
    }
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("provider.log");
    let metrics = common::free_port();
    let metrics_addr = format!("127.0.0.1:{metrics}");
    let (m, id) = running_lease(dir.path(), &image.tag, &log, &["--metrics", &metrics_addr]);
    let _guard = ContainersGuard(m.provider_peer.clone());
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));

    // The files and the server, started in the container through exec.
    let (code, stdout, stderr) = exec(
        &rh,
        &id,
        &[
            "sh",
            "-c",
            "cd /workspace && dd if=/dev/urandom of=big bs=1M count=256 2>/dev/null \
             && dd if=/dev/urandom of=small bs=64k count=4 2>/dev/null \
             && sha256sum big small && httpd -p 8080 -h /workspace",
        ],
        b"",
    );
    assert_eq!(code, 0, "{stderr}");
    let sums: Vec<&str> = stdout
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(sums.len(), 2, "{stdout}");

    // `forward LEASE 0:8080 0:9`: free local ports, printed (nothing listens on 9).
    let mut child = bin()
        .arg("--home")
        .arg(&rh)
        .args(["forward", &id[..12], "0:8080", "0:9"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let mut local_port = |remote: u16| -> u16 {
        let line = lines.next().unwrap().unwrap();
        line.strip_prefix("forwarding 127.0.0.1:")
            .and_then(|r| r.split_once(&format!(" -> port {remote} of lease ")))
            .and_then(|(p, _)| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected line {line:?}"))
    };
    let port = local_port(8080);
    let closed_port = local_port(9);
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut fwd = Kill(child);

    // 256 MiB with curl, checksum compared.
    let out = Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "120"])
        .arg(format!("http://127.0.0.1:{port}/big"))
        .output()
        .unwrap();
    assert!(out.status.success(), "curl: {}", text(&out.stderr));
    assert_eq!(out.stdout.len(), 256 << 20);
    assert_eq!(hex::encode(sha2::Sha256::digest(&out.stdout)), sums[0]);

    // 32 connections open at once, each half-closed after its request, all complete.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(32));
    let handles: Vec<_> = (0..32)
        .map(|_| {
            let b = barrier.clone();
            std::thread::spawn(move || {
                b.wait();
                http_get(port, "/small")
            })
        })
        .collect();
    for h in handles {
        let body = h.join().unwrap();
        assert_eq!(hex::encode(sha2::Sha256::digest(&body)), sums[1]);
    }

    // A port nothing listens on in the container: the connection closes at once, and the
    // forwarder says why (read once it is stopped).
    let mut c = std::net::TcpStream::connect(("127.0.0.1", closed_port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = Vec::new();
    assert_eq!(c.read_to_end(&mut buf).map(|_| buf.len()).unwrap_or(0), 0);

    // A stranger is refused shell, exec and forward, and the provider logs each attempt.
    let status = json(&ph, &["status"]);
    let addr = status["listen_addrs"][0].as_str().unwrap();
    let lease_id = id.parse().unwrap();
    let stranger = stranger_asks(
        addr,
        &m.provider_peer,
        vec![
            AccessRequest::Exec {
                lease_id,
                argv: vec![],
                env: vec![],
                tty: Some(TermSize { cols: 80, rows: 24 }),
            },
            AccessRequest::Exec {
                lease_id,
                argv: vec!["id".into()],
                env: vec![],
                tty: None,
            },
            AccessRequest::Forward {
                lease_id,
                port: 8080,
            },
        ],
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    let refusals: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains("access refused") && l.contains(&stranger[0]))
        .collect();
    assert_eq!(refusals.len(), 3, "{logged}");
    for kind in ["shell", "exec", "forward"] {
        assert!(
            refusals
                .iter()
                .any(|l| l.contains(&format!("kind=\"{kind}\""))),
            "{refusals:?}"
        );
    }

    // Every stream was counted: 1 + 32 forwarded connections granted (the exec above too),
    // the closed port and the stranger's forward refused.
    let counted = scrape(metrics);
    assert_eq!(
        metric(
            &counted,
            "gridlease_access_streams_granted_total{kind=\"forward\"}"
        ),
        33,
        "{counted}"
    );
    assert_eq!(
        metric(
            &counted,
            "gridlease_access_streams_refused_total{kind=\"forward\"}"
        ),
        2
    );
    assert_eq!(
        metric(
            &counted,
            "gridlease_access_streams_refused_total{kind=\"shell\"}"
        ),
        1
    );
    assert!(
        metric(
            &counted,
            "gridlease_access_streams_granted_total{kind=\"exec\"}"
        ) >= 1
    );
    assert!(metric(&counted, "gridlease_access_forwarded_bytes_total") > 256 << 20);

    // After the lease ends, shell, exec and forward are all refused.
    let out = cli(&rh, &["stop", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for(Duration::from_secs(60), "the lease to settle", || {
        lease_of(&ph, &id)["state"] == "settled"
    });
    let (code, _, stderr) = exec(&rh, &id, &["id"], b"");
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("the lease is not running"), "{stderr}");
    let shell = cli(&rh, &["shell", &id]);
    assert_eq!(shell.status.code(), Some(4), "{}", text(&shell.stderr));
    assert!(
        text(&shell.stderr).contains("the lease is not running"),
        "{}",
        text(&shell.stderr)
    );
    // A forward asked of the renter's node now: the provider refuses it (409, the reason).
    let refused = Command::new("curl")
        .args(["-sS", "-X", "POST", "-w", "\n%{http_code}"])
        .arg("--unix-socket")
        .arg(rh.join("api.sock"))
        .args([
            "-H",
            "Connection: upgrade",
            "-H",
            "Upgrade: gridlease-access",
        ])
        .arg(format!("http://gridlease/v1/leases/{id}/forward/8080"))
        .output()
        .unwrap();
    let answer = text(&refused.stdout);
    assert!(
        answer.ends_with("\n409") && answer.contains("the lease is not running"),
        "{answer}"
    );
    // The forwarder stops by itself once it sees the lease over, and it had said why port 9
    // gave nothing.
    wait_for(Duration::from_secs(20), "the forwarder to stop", || {
        fwd.0.try_wait().unwrap().is_some()
    });
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(
        rest.iter()
            .any(|l| l.contains("is settled: forwarding stopped")),
        "{rest:?}"
    );
    let mut errors = String::new();
    fwd.0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut errors)
        .unwrap();
    assert!(
        errors.contains("-> 9: nothing listens on port 9 in the container"),
        "{errors}"
    );
    // Once the provider's access gate has dropped the renter (it refreshes every 5 s), the
    // renter of the ended lease is still told the lease's own reason, not "you are not the
    // renter", and is never blocked as a stranger would be.
    std::thread::sleep(Duration::from_secs(6));
    for _ in 0..3 {
        let (code, _, stderr) = exec(&rh, &id, &["id"], b"");
        assert_eq!(code, 4, "{stderr}");
        assert!(stderr.contains("the lease is not running"), "{stderr}");
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!logged.contains("peer blocked"), "{logged}");
    drop(m);
}

#[test]
fn rent_forward_opens_the_port_for_the_lease_life() {
    let test = "cli_access_rent_forward";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("provider.log");
    // The offer says what it allows, and a provider can turn each off.
    let m = busybox_market(dir.path(), &image.tag, &log, &["--allow-shell=false"]);
    let _guard = ContainersGuard(m.provider_peer.clone());
    let rh = dir.path().join("renter");
    let offer = json(&rh, &["offer", &m.offer]);
    assert_eq!(
        offer["access"],
        serde_json::json!({"shell": false, "exec": true, "forward": true}),
        "{offer}"
    );
    let gpus = offer["gpus"].as_array().unwrap().len();
    assert_eq!(offer["free_gpus"], gpus, "no lease yet: {offer}");
    let shown = cli(&rh, &["offer", &m.offer]);
    for line in [
        "access       exec, forward".to_string(),
        format!("gpus         {gpus} free of {gpus} when signed"),
    ] {
        assert!(
            text(&shown.stdout).contains(&line),
            "{line:?} in:\n{}",
            text(&shown.stdout)
        );
    }
    assert_eq!(json(&rh, &["search"])[0]["access"]["shell"], false);
    // A server as the lease's own command (as `jupyter lab` would be), its port forwarded.
    let mut rent = bin()
        .arg("--home")
        .arg(&rh)
        .args([
            "rent", &m.offer, "--seconds", "120", "--image", &image.tag, "--forward", "0:8000",
            "--", "sh", "-c",
            "echo served-through-the-p2p-link > /workspace/index.html && exec httpd -f -p 8000 -h /workspace",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufRead::lines(std::io::BufReader::new(rent.stderr.take().unwrap()));
    let line = err
        .find_map(|l| l.ok().filter(|l| l.contains("forwarding 127.0.0.1:")))
        .expect("the forwarding note");
    let port: u16 = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let mut body = String::new();
    wait_for(
        Duration::from_secs(60),
        "the forwarded server to answer",
        || {
            let out = Command::new("curl")
                .args(["-sS", "--fail", "--max-time", "5"])
                .arg(format!("http://127.0.0.1:{port}/"))
                .output()
                .unwrap();
            body = text(&out.stdout);
            out.status.success()
        },
    );
    assert_eq!(body, "served-through-the-p2p-link\n");
    // The lease ends (stopped): `rent` prints the bill and exits; the port is closed.
    let id = json(&rh, &["leases"])[0]["lease_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(cli(&rh, &["stop", &id]).status.success());
    let status = rent.wait().unwrap();
    assert!(status.code().is_some(), "rent ended by a signal");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the forwarded port outlived the rent"
    );
    // Shell was not offered: refused with that reason.
    let refused = cli(&rh, &["shell", &id]);
    assert_eq!(refused.status.code(), Some(4), "{}", text(&refused.stderr));
    drop(m);
}
