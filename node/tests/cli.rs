//! The `gridlease` binary: `init`, errors, and two real `gridlease node` processes on loopback.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gridlease"));
    c.env_remove("GRIDLEASE_HOME").env("RUST_LOG", "info");
    // As `cli_support::bin`: no disk reserve, so a small temporary directory backs the offer.
    c.env("GRIDLEASE_RESERVE_DISK_GIB", "0");
    c
}

fn init(home: &Path) {
    let out = bin().args(["init", "--home"]).arg(home).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn init_twice_refuses_to_overwrite_the_identity() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("h");
    let out = bin()
        .args(["init", "--network", "testnet", "--home"])
        .arg(&home)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("network testnet"), "{stdout}");
    assert!(stdout.contains("peer id 12D3"), "{stdout}");
    // The settlement wallet: its address printed, its key private.
    let address = stdout
        .lines()
        .find_map(|l| l.strip_prefix("wallet  "))
        .unwrap_or_else(|| panic!("no wallet line: {stdout}"));
    assert!(
        address.starts_with("0x") && address.len() == 42,
        "{address}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(home.join("wallet.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let key = std::fs::read(home.join("identity.key")).unwrap();
    let wallet = std::fs::read(home.join("wallet.key")).unwrap();

    let out = bin().args(["init", "--home"]).arg(&home).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refusing to overwrite"), "{stderr}");
    assert_eq!(std::fs::read(home.join("identity.key")).unwrap(), key);
    assert_eq!(std::fs::read(home.join("wallet.key")).unwrap(), wallet);
}

#[test]
fn gridlease_home_works_like_home_and_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("env-home");
    let out = bin()
        .arg("init")
        .env("GRIDLEASE_HOME", &home)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(home.join("identity.key").exists());

    let out = bin()
        .args(["node", "--no-mdns", "--dev-gpus", "RTX 4090:24GiB"])
        .env("GRIDLEASE_HOME", &home)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--dev-gpus entry \"RTX 4090:24GiB\""),
        "{stderr}"
    );

    let out = bin()
        .args(["node", "--home"])
        .arg(dir.path().join("nothing"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("run `gridlease init"), "{stderr}");
}

/// A child process whose stderr lines arrive on a bounded channel.
struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    fn spawn(cmd: &mut Command) -> Self {
        let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::sync_channel(1024);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Waits for a stderr line containing `needle`.
    fn wait_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(e) => panic!("no line containing {needle:?}: {e}"),
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn two_node_processes_bootstrap_and_share_an_offer() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    init(&a);
    init(&b);
    let provider = Proc::spawn(
        bin()
            .args([
                "node",
                "--listen",
                "/ip4/127.0.0.1/tcp/0",
                "--no-mdns",
                // Far longer than the test: the renter can only learn the offer by syncing
                // the provider's book when it connects, not from a re-announcement.
                "--announce-secs",
                "600",
                "--dev-gpus",
                "RTX 4090:24GiB:0.40,RTX 3090:24GiB:0.25",
                "--home",
            ])
            .arg(&a),
    );
    let line = provider.wait_line("listening");
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .expect("listening line names the address")
        .to_string();
    assert!(addr.contains("/p2p/12D3"), "{line}");
    let renter = Proc::spawn(
        bin()
            .args([
                "node",
                "--listen",
                "/ip4/127.0.0.1/tcp/0",
                "--no-mdns",
                "--bootstrap",
                &addr,
                "--home",
            ])
            .arg(&b),
    );
    let t = Instant::now();
    renter.wait_line("offer learned");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    // The late joiner's first search shows the offer.
    let out = bin()
        .args(["--json", "search", "--home"])
        .arg(&b)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
}
