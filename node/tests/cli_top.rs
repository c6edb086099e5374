//! `gridlease top` (issue 18): two real nodes, a real lease of the probe image, the renter's
//! `top` asking its node, which asks the provider over the lease's P2P connection.
//!
//! The provider's declared GPU is sampled from a scripted curves file (`--dev-gpu-samples`:
//! this machine has no GPU, and the screen says the values are not from a real one): in a
//! real terminal (tmux, 80x24) the screen shows the scripted values and changes with them,
//! `--json` streams them; without the curves file every GPU value is "n/a", never 0. Needs
//! Docker and tmux: with `GRIDLEASE_REQUIRE_DOCKER=1` (set by `.ci/run`) they fail when
//! either is missing, otherwise they skip with a note.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;
mod common;

use std::io::BufRead as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use cli_support::{
    Daemon, Tmux, bin, bin_path, cli, docker_required, json, lease_of, market_with,
    probe_image_or_skip, text, tmux_available, wait_for,
};
use serde_json::Value;

/// Utilisation alternates 17 / 83 %, with its VRAM, power, temperature and clock.
const CURVES: &str = r#"[{"util_percent":[17,83],"vram_used_mib":[1111,2222],
    "power_w":[150,250],"temp_c":[41,62],"sm_clock_mhz":[1500,2100]}]"#;

fn rent(rh: &std::path::Path, offer: &str, image: &str) -> String {
    let rented = json(
        rh,
        &[
            "rent",
            offer,
            "--seconds",
            "120",
            "--detach",
            "--image",
            image,
            "--",
            "sleep",
            "100",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "the lease to run", || {
        lease_of(rh, &id)["state"] == "running"
    });
    id
}

#[test]
fn top_shows_scripted_gpu_curves_live_in_a_terminal_and_streams_json() {
    let Some(image) = probe_image_or_skip("cli_top") else {
        return;
    };
    assert!(
        tmux_available() || !docker_required(),
        "GRIDLEASE_REQUIRE_DOCKER=1 but tmux is not installed"
    );
    if !tmux_available() {
        eprintln!("cli_top: SKIPPED, tmux is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let curves = dir.path().join("curves.json");
    std::fs::write(&curves, CURVES).unwrap();
    let m = market_with(
        dir.path(),
        // The curve is the tenant's load, there from the start: only a process would mean
        // the owner (idle-aware providing would otherwise withdraw the busy-looking GPU).
        &[
            "--dev-gpu-samples",
            curves.to_str().unwrap(),
            "--owner-util-percent",
            "0",
        ],
        Some(&dir.path().join("provider.log")),
    );
    let rh = dir.path().join("renter");
    let id = rent(&rh, &m.offer, &image);

    // --json streams samples: the scripted values, labelled, one object per line.
    // Killed when dropped, also when the test fails.
    let mut stream = Daemon(
        bin()
            .arg("--home")
            .arg(&rh)
            .args(["--json", "top", &id, "--interval", "0.5"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Read on a thread of its own, so a stream that never prints fails the test, not hangs it.
    let (tx, lines) = std::sync::mpsc::sync_channel(64);
    let stdout = stream.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(stdout).lines() {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    let mut utils = std::collections::BTreeSet::new();
    let mut last_at = 0;
    for _ in 0..4 {
        let line = lines
            .recv_timeout(Duration::from_secs(20))
            .expect("a sample line within 20 s")
            .unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["lease_id"], id.as_str(), "{v}");
        assert_eq!(v["source"], "scripted", "{v}");
        assert_eq!(v["gpus"][0], "RTX 4090", "{v}");
        let g = &v["sample"]["gpus"][0];
        let u = g["util_percent"].as_u64().unwrap();
        assert!(u == 17 || u == 83, "{v}");
        utils.insert(u);
        let vram = g["vram_used_mib"].as_u64().unwrap();
        assert_eq!(vram, if u == 17 { 1111 } else { 2222 }, "{v}");
        assert_eq!(g["vram_total_mib"], 24 * 1024, "{v}");
        assert!(g["temp_c"] == 41 || g["temp_c"] == 62, "{v}");
        assert!(v["sample"]["mem_used_mib"].as_u64().is_some(), "{v}");
        let at = v["sample"]["at_ms"].as_u64().unwrap();
        assert!(at > last_at, "samples in time order, each once: {v}");
        last_at = at;
    }
    assert_eq!(
        utils.len(),
        2,
        "the values change with the curve: {utils:?}"
    );
    drop(stream);

    // The full-screen view in a real 80x24 terminal.
    let t = Tmux::start("cli_top");
    t.resize(80, 24);
    t.type_line(&format!(
        "{} --home {} top {}; echo \"EXIT=$?\"",
        bin_path().display(),
        rh.display(),
        &id[..12]
    ));
    let seen = |needle: &str| t.wait_until(Duration::from_secs(20), needle, |s| s.contains(needle));
    let first = seen("83 %");
    for want in [
        "gridlease top",
        "RTX 4090",
        "SCRIPTED",
        "2222 MiB / 24576 MiB",
        "250 W",
        "62 C",
        "2100 MHz",
        "(renter) running",
        "GLU",
    ] {
        assert!(first.contains(want), "{want:?} on the screen:\n{first}");
    }
    let second = seen("17 %");
    assert!(second.contains("1111 MiB / 24576 MiB"), "{second}");
    for line in second.lines() {
        assert!(
            line.chars().count() <= 80,
            "wider than the terminal:\n{second}"
        );
    }
    t.send(&["q"]);
    let (screen, status) = t.wait_exit(Duration::from_secs(10));
    assert_eq!(status, "0", "{screen}");
    assert!(
        screen.contains("(renter) running"),
        "the last headline stays: {screen}"
    );

    // The provider sees its own lease the same way.
    let ph = dir.path().join("provider");
    let once = cli(&ph, &["top", &id, "--once"]);
    assert!(once.status.success(), "{}", text(&once.stderr));
    let o = text(&once.stdout);
    assert!(
        o.contains("(provider) running") && o.contains("SCRIPTED"),
        "{o}"
    );

    // Another peer (no lease) asking the provider for this lease's telemetry gets nothing.
    let addr = json(&ph, &["status"])["listen_addrs"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        stranger_asks_telemetry(&addr, &m.provider_peer, &id),
        "UnknownLease"
    );

    // Once the lease is over there is nothing to show, and `top` says so.
    assert!(cli(&rh, &["stop", &id]).status.success());
    wait_for(Duration::from_secs(60), "the lease to settle", || {
        lease_of(&rh, &id)["state"] == "settled"
    });
    let after = cli(&rh, &["--json", "top", &id, "--once"]);
    assert_eq!(after.status.code(), Some(1), "{}", text(&after.stdout));
    assert!(
        text(&after.stderr).contains("is not running"),
        "{}",
        text(&after.stderr)
    );
}

#[test]
fn top_shows_na_for_declared_gpus_never_zero() {
    let Some(image) = probe_image_or_skip("cli_top_declared") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = market_with(dir.path(), &[], None);
    let rh = dir.path().join("renter");
    let id = rent(&rh, &m.offer, &image);
    // The container's own numbers are measured (Docker's stats) once samples come.
    let started = Instant::now();
    let screen = loop {
        let out = cli(&rh, &["top", "--once"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let s = text(&out.stdout);
        if s.contains("cores") || started.elapsed() > Duration::from_secs(90) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(screen.contains("declared GPUs"), "{screen}");
    let gpu: Vec<&str> = screen
        .lines()
        .filter(|l| l.contains("util") || l.contains("vram") || l.starts_with("GPU 0"))
        .collect();
    assert_eq!(gpu.len(), 3, "{screen}");
    for l in &gpu {
        assert!(l.contains("n/a"), "{l:?} in\n{screen}");
        assert!(!l.contains(" 0 %") && !l.contains(" 0 MiB"), "{l:?}");
    }
    assert!(
        screen.contains("cores"),
        "container CPU measured:\n{screen}"
    );
    let v = json(&rh, &["top", &id, "--once"]);
    assert_eq!(v["source"], "none", "{v}");
    let g = &v["samples"][0]["gpus"][0];
    assert!(
        g["util_percent"].is_null() && g["vram_used_mib"].is_null(),
        "{v}"
    );
    assert!(cli(&rh, &["stop", &id]).status.success());
}

/// What a stranger (an in-process node that holds no lease) gets when it asks `provider` for
/// the telemetry of lease `id` on the lease stream.
fn stranger_asks_telemetry(provider_addr: &str, provider: &str, id: &str) -> String {
    use gridlease_protocol::session::{
        LeaseRpc, LeaseRpcResponse, SessionRequest, SessionResponse,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let root = tempfile::tempdir().unwrap();
        let n = common::start(root.path(), "stranger", common::config()).await;
        let addr: libp2p::Multiaddr = provider_addr.parse().unwrap();
        n.node.client.dial(addr.clone()).await.unwrap().unwrap();
        let rpc = LeaseRpc::Session(SessionRequest::Telemetry {
            lease_id: id.parse().unwrap(),
            after: gridlease_protocol::Timestamp(0),
        });
        let answer = n
            .node
            .client
            .lease_rpc(provider.parse().unwrap(), vec![addr], rpc)
            .await
            .unwrap();
        common::stop(n).await;
        match answer {
            LeaseRpcResponse::Session(SessionResponse::UnknownLease) => "UnknownLease".into(),
            other => format!("{other:?}"),
        }
    })
}
