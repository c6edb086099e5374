//! A real EVM for the node's chain tests: `settlement/rpc_harness.py` (py-evm through
//! eth-tester, served as standard JSON-RPC on 127.0.0.1) with the test token and the channel
//! contract deployed, started per test and killed when dropped.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

/// The repository's root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The settlement venv's python, or `None` (skip) where it is missing and not required
/// (`GRIDLEASE_REQUIRE_DOCKER=1`, set by `.ci/run`, which makes the venv).
pub fn python_or_skip(test: &str) -> Option<PathBuf> {
    let py = workspace().join("target/settlement-venv/bin/python");
    if py.exists() {
        return Some(py);
    }
    assert!(
        std::env::var("GRIDLEASE_REQUIRE_DOCKER").as_deref() != Ok("1"),
        "{} is missing: `.ci/run` makes it (settlement/requirements.txt)",
        py.display()
    );
    eprintln!("{test}: SKIPPED, no {}", py.display());
    None
}

/// A running harness with the channel contract deployed.
pub struct Harness {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its chain id.
    pub chain_id: u64,
    /// The test token (`0x..`).
    pub token: String,
    /// The channel contract (`0x..`).
    pub channel_contract: String,
}

impl Harness {
    /// Starts one whose channel contract has a challenge period of `challenge_s`.
    pub fn start(py: &Path, challenge_s: u64) -> Self {
        let mut child = Command::new(py)
            .arg(workspace().join("settlement/rpc_harness.py"))
            .args(["--deploy-test-channels", &challenge_s.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let deployed: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        let listening = lines.next().unwrap().unwrap();
        let url = listening
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("{listening}"))
            .to_string();
        Self {
            child,
            url,
            chain_id: deployed["chain_id"].as_u64().unwrap(),
            token: deployed["token"].as_str().unwrap().to_string(),
            channel_contract: deployed["channel_contract"].as_str().unwrap().to_string(),
        }
    }

    /// A JSON-RPC call (raw HTTP through curl); its `result`, or panics on an error.
    pub fn rpc(&self, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "60",
                "-H",
                "Content-Type: application/json",
            ])
            .args(["--data-binary", &body.to_string(), &self.url])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    /// Gives `address` ether for gas.
    pub fn fund(&self, address: &str) {
        self.rpc("harness_fund", json!([address, "0x56bc75e2d63100000"]));
    }

    /// Mints `amount` test tokens to `address`.
    pub fn mint(&self, address: &str, amount: u128) {
        self.rpc("harness_mint", json!([address, amount.to_string()]));
    }

    /// Moves the chain's clock `seconds` forward.
    pub fn travel(&self, seconds: u64) {
        self.rpc("harness_timeTravel", json!([seconds]));
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
