//! Shared helpers for tests that drive the real `gridlease` binary.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::cargo::CommandCargoExt;

/// The binary, with every `GRIDLEASE_*` variable of the test's environment removed.
pub fn bin() -> Command {
    let mut c = Command::cargo_bin("gridlease").unwrap();
    for (k, _) in std::env::vars() {
        if k.starts_with("GRIDLEASE_") {
            c.env_remove(k);
        }
    }
    c.env("RUST_LOG", "warn");
    c
}

/// Runs `gridlease --home HOME ARGS..` (global flags first: everything after `rent ... --`
/// is the container's command).
pub fn cli(home: &Path, args: &[&str]) -> Output {
    bin().arg("--home").arg(home).args(args).output().unwrap()
}

/// Lossy text of an output stream.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `gridlease init` into `home`.
pub fn init(home: &Path) {
    let out = cli(home, &["init"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A node process, killed when dropped.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `f` until it holds, failing the test after `limit`.
pub fn wait_for(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts `gridlease node` on an ephemeral loopback port and waits for its API.
pub fn start_node(home: &Path, extra: &[&str]) -> Daemon {
    let child = bin()
        .arg("--home")
        .arg(home)
        .args([
            "node",
            "--no-mdns",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--announce-secs",
            "1",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let d = Daemon(child);
    wait_for(Duration::from_secs(30), "the node's API", || {
        cli(home, &["status"]).status.success()
    });
    d
}
