//! Interop (issue 21, "other implementations can join"): a py-libp2p peer (PyPI `libp2p`, not
//! rust-libp2p; `node/tests/interop/py_peer.py`) joins a real `gridlease node` over TCP, noise
//! and yamux, receives the provider's offer over gossipsub and verifies it with the signing
//! rules of docs/protocol.md alone (its own bincode reader and ed25519 check), then sends a
//! garbage frame on `/gridlease/lease/1` and must get the provider's signed `LeaseReject` with
//! reason `Malformed` before the stream closes; the provider logs the probe at INFO.
//!
//! Needs a Python with py-libp2p: `GRIDLEASE_PY_LIBP2P` names it (`.ci/run` makes a venv and
//! sets it, with `GRIDLEASE_REQUIRE_PY_INTEROP=1`, under which a missing one is a failure).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::{init, json, start_node_logged};
use gridlease_protocol::{PeerId, PublicKey, RejectReason};

/// The Python interpreter with py-libp2p, or `None` (skip) when none is set and none required.
fn python_or_skip(test: &str) -> Option<PathBuf> {
    match std::env::var_os("GRIDLEASE_PY_LIBP2P") {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            assert!(
                std::env::var("GRIDLEASE_REQUIRE_PY_INTEROP").as_deref() != Ok("1"),
                "{test}: GRIDLEASE_REQUIRE_PY_INTEROP=1 but GRIDLEASE_PY_LIBP2P is not set (.ci/run makes the venv)"
            );
            eprintln!("{test}: SKIPPED, set GRIDLEASE_PY_LIBP2P to a Python with py-libp2p");
            None
        }
    }
}

#[test]
fn a_py_libp2p_peer_verifies_a_gossiped_offer_and_gets_malformed_for_garbage() {
    let Some(python) = python_or_skip("interop_py") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ph = dir.path().join("provider");
    let log = dir.path().join("provider.log");
    init(&ph);
    let _node = start_node_logged(&ph, &["--dev-gpus", "RTX 4090:24GiB:3.60"], Some(&log));
    let status = json(&ph, &["status"]);
    let addr = status["listen_addrs"][0].as_str().unwrap().to_string();
    let peer: PeerId = status["peer_id"].as_str().unwrap().parse().unwrap();
    let key = hex::encode(PublicKey::from_peer_id(&peer).unwrap().0);
    // The variant index of `Malformed` in the codec, not a number copied into the script.
    let malformed = gridlease_protocol::codec::encode::<_, 64>(&RejectReason::Malformed {
        detail: String::new(),
    })
    .unwrap()[0];

    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/interop/py_peer.py");
    let mut child = Command::new(&python)
        .arg(&script)
        .args([&addr, "devnet", &malformed.to_string(), "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!(
        "py_peer stdout:\n{stdout}\npy_peer stderr (tail):\n{}",
        tail(&stderr, 4000)
    );
    assert!(out.status.success(), "the py-libp2p peer failed");
    assert!(
        stdout.contains(&format!("OFFER_OK {key}")),
        "verified the provider's offer: {stdout}"
    );
    assert!(stdout.contains("MALFORMED_OK"), "{stdout}");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("malformed request answered"),
        "the probe is logged at INFO"
    );
}

fn tail(s: &str, n: usize) -> &str {
    let mut at = s.len().saturating_sub(n);
    while !s.is_char_boundary(at) {
        at += 1;
    }
    &s[at..]
}
