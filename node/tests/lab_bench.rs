//! Measurements over the network lab (issue 15), not run by CI (`#[ignore]`: they take
//! minutes and their numbers go to `docs/benchmarks.md` and `docs/networking.md`):
//!
//! ```text
//! cargo test -p gridlease-node --test lab_bench -- --ignored --nocapture --test-threads 1
//! ```
//!
//! - `gossip_over_nated_sites`: 20 nodes across 4 NATed sites (two cone, two symmetric) and 2
//!   relays, 100 ms RTT between any two internet endpoints (`delay_switch.py`: this kernel has
//!   no `sch_netem`): how long an offer takes to reach 99% of the nodes.
//! - `hole_punch_per_nat_type`: repeated connections between a provider and a fresh renter
//!   behind NATs of each kind, 100 ms RTT (`LAB_RTT_MS`), `LAB_TRIALS` (5) per kind: how often
//!   DCUtR gives a direct connection, and how long after the relayed one (`LAB_PAIRINGS`, e.g.
//!   `cone/cone`, runs only some; the logs of a trial that stayed relayed are kept under
//!   `target/test-artifacts/hole-punch/`).
//! - `forward_through_a_relay` (issue 14): `gridlease forward` to an HTTP server in a lease
//!   whose provider sits behind a symmetric NAT and renter behind a cone NAT (no hole punch
//!   works: the relay carries every byte, asserted) and, for
//!   comparison, one whose provider and renter are both on the internet (a direct
//!   connection), each against a direct loopback connection to the same server in the same
//!   run: GET of 256 MiB (MB/s) and 64-byte request round trips on one connection (p50/p99).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;
mod lab_support;

use std::path::Path;
use std::time::{Duration, Instant};

use cli_support::{json, probe_image_or_skip};
use lab_support::*;

/// Milliseconds since midnight (UTC) of a tracing JSON timestamp `...THH:MM:SS.ffffffZ`.
fn ms_of_day(ts: &str) -> Option<u64> {
    let t = ts.split('T').nth(1)?.trim_end_matches('Z');
    let mut parts = t.split(':');
    let h: u64 = parts.next()?.parse().ok()?;
    let m: u64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some((h * 3600 + m * 60) * 1000 + (s * 1000.0) as u64)
}

/// The JSON log lines of `log` whose message is `message`: (ms of day, fields).
fn events(log: &Path, message: &str) -> Vec<(u64, serde_json::Value)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == message)
        .filter_map(|v| Some((ms_of_day(v["timestamp"].as_str()?)?, v["fields"].clone())))
        .collect()
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[test]
#[ignore = "benchmark: run by hand, numbers in docs/benchmarks.md"]
fn gossip_over_nated_sites() {
    if !lab_or_skip("lab_gossip", &["ethtool", "python3"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut lab = Lab::delayed();
    let relay_hosts: Vec<Host> = (0..2)
        .map(|i| lab.public_host(&format!("relay{i}")))
        .collect();
    let nats = [Nat::Cone, Nat::Cone, Nat::Symmetric, Nat::Symmetric];
    let mut hosts = Vec::new();
    for (s, nat) in nats.iter().enumerate() {
        let site = lab.site(&format!("s{s}"), *nat);
        for h in 0..5 {
            hosts.push(lab.site_host(&site, &format!("s{s}h{h}")));
        }
    }
    // 50 ms through the internet switch each way: 100 ms RTT between any two internet
    // endpoints (a site's router and a relay, two routers).
    lab.start_delay_switch(50, 0);
    let relays: Vec<Party> = relay_hosts
        .iter()
        .enumerate()
        .map(|(i, h)| relay(dir.path(), &format!("relay{i}"), h))
        .collect();
    let mut boot: Vec<String> = Vec::new();
    for r in &relays {
        boot.push("--bootstrap".into());
        boot.push(r.addr());
    }
    boot.push("--log-format".into());
    boot.push("json".into());
    let flags: Vec<&str> = boot.iter().map(String::as_str).collect();
    // 19 nodes first; the provider (the 20th, on site 0) once they are all up.
    let mut nodes: Vec<Party> = hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| Party::start(dir.path(), &format!("n{i}"), h, &flags))
        .collect();
    cli_support::wait_for(Duration::from_secs(60), "every node connected", || {
        nodes
            .iter()
            .all(|n| status(&n.home)["connected_peers"].as_u64().unwrap_or(0) >= 2)
    });
    std::thread::sleep(Duration::from_secs(5));
    let mut pflags = flags.clone();
    pflags.extend(["--dev-gpus", "RTX 4090:24GiB:3.60"]);
    let provider = Party::start(dir.path(), "provider", &hosts[0], &pflags);
    let learned = |n: &Party, seq: Option<u64>| {
        events(&n.log, "offer learned")
            .into_iter()
            .find(|(_, f)| seq.is_none() || f["seq"].as_u64() == seq)
            .map(|(t, _)| t)
    };
    let want = 19; // 99% of 20 nodes, the provider being one: all 19 others.
    // Phase 1: the provider's first offer reaches everyone (its connections come up meanwhile).
    cli_support::wait_for(
        Duration::from_secs(120),
        "the first offer everywhere",
        || nodes.iter().filter(|n| learned(n, None).is_some()).count() >= want,
    );
    // Phase 2, measured: a new sequence (a price change) over the mesh that formed.
    let before = status(&provider.home)["own_offer"]["seq"].as_u64().unwrap();
    let out = cli_support::cli(&provider.home, &["provide", "--price", "3.00"]);
    assert!(out.status.success(), "{}", cli_support::text(&out.stderr));
    let (seq, id) = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = status(&provider.home);
            let seq = s["own_offer"]["seq"].as_u64().unwrap_or(before);
            if seq != before {
                break (seq, s["own_offer"]["id"].as_str().unwrap().to_string());
            }
            assert!(Instant::now() < deadline, "no new offer sequence");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let created = json(&provider.home, &["offer", &id])["created_at_ms"]
        .as_u64()
        .unwrap();
    let start = Instant::now();
    let mut reached = Vec::new();
    while start.elapsed() < Duration::from_secs(60) {
        reached = nodes.iter().filter_map(|n| learned(n, Some(seq))).collect();
        if reached.len() >= want {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let day0 = created % 86_400_000;
    let mut delays: Vec<u64> = reached.iter().map(|t| t.saturating_sub(day0)).collect();
    delays.sort_unstable();
    eprintln!(
        "gossip over 4 NATed sites, 2 relays, 100 ms RTT: a new offer sequence reached {}/19 nodes; after its signing: p50 {} ms, p99 {} ms, max {} ms",
        delays.len(),
        percentile(&delays, 0.5),
        percentile(&delays, 0.99),
        delays.last().copied().unwrap_or(0)
    );
    assert!(delays.len() >= want, "reached {}/19", delays.len());
    drop(provider);
    nodes.clear();
    drop(relays);
}

/// One NAT pairing's trials: each a fresh lab (relay, provider, renter: new identities, new
/// NAT state) where the renter rents a lease that ends at once; a trial succeeds when a hole
/// punch gives a direct connection. (Reusing one relay and provider for successive renters ran
/// into "resource limit exceeded" answers for the circuits after a few trials; not chased.)
fn hole_punch_trials(image: &str, provider_nat: Nat, renter_nat: Nat, trials: usize, rtt_ms: u32) {
    let punched_msg = "hole punch succeeded: direct connection";
    let failed_msg = "hole punch failed: the relay carries the connection";
    let mut ok = Vec::new();
    let mut relayed = 0usize;
    for _ in 0..trials {
        let m = market_with(
            Place::Behind(provider_nat),
            Place::Behind(renter_nat),
            1,
            0,
            SHORT,
            rtt_ms / 2,
        );
        let id = m.rent(image, &["exit", "0"]);
        let (me, them) = (m.renter.peer.clone(), m.provider.peer.clone());
        let deadline = Instant::now() + Duration::from_secs(45);
        let outcome = loop {
            let start = text_events(&m.renter.log, "connected")
                .into_iter()
                .find(|l| l.contains(&format!("peer={them}")) && l.contains("relayed=true"))
                .and_then(|l| ms_of_day(l.split_whitespace().next()?));
            let ours = |msg: &str| {
                text_events(&m.renter.log, msg)
                    .into_iter()
                    .filter(|l| l.contains(&format!("peer={them}")))
                    .chain(
                        text_events(&m.provider.log, msg)
                            .into_iter()
                            .filter(|l| l.contains(&format!("peer={me}"))),
                    )
                    .filter_map(|l| ms_of_day(l.split_whitespace().next()?))
                    .min()
            };
            match (start, ours(punched_msg)) {
                (Some(s), Some(p)) => break Some(p.saturating_sub(s)),
                _ if ours(failed_msg).is_some() || Instant::now() > deadline => break None,
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        match outcome {
            Some(ms) => ok.push(ms),
            None => {
                relayed += 1;
                // Kept for a look at why: both nodes' logs of the trial.
                let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../target/test-artifacts/hole-punch")
                    .join(format!("{provider_nat:?}-{renter_nat:?}-{relayed}"));
                let _ = std::fs::create_dir_all(&dir);
                let _ = std::fs::copy(&m.renter.log, dir.join("renter.log"));
                let _ = std::fs::copy(&m.provider.log, dir.join("provider.log"));
                eprintln!("stayed relayed: logs in {}", dir.display());
            }
        }
        let _ = m.settled(&id, Duration::from_secs(60));
    }
    ok.sort_unstable();
    eprintln!(
        "hole punch, provider {provider_nat:?} / renter {renter_nat:?}, {rtt_ms} ms RTT: {}/{trials} direct; time from the relayed connection: p50 {} ms, max {} ms; {relayed} stayed relayed",
        ok.len(),
        percentile(&ok, 0.5),
        ok.last().copied().unwrap_or(0),
    );
}

/// The lines of a text log (`node_in`'s format) with `message` in them.
fn text_events(log: &Path, message: &str) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(message))
        .map(str::to_string)
        .collect()
}

#[test]
#[ignore = "benchmark: run by hand, numbers in docs/networking.md"]
fn hole_punch_per_nat_type() {
    if !lab_or_skip("lab_hole_punch", &["ethtool", "python3"]) {
        return;
    }
    let Some(image) = probe_image_or_skip("lab_hole_punch") else {
        return;
    };
    let trials = std::env::var("LAB_TRIALS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(5);
    let rtt = std::env::var("LAB_RTT_MS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(100);
    // `LAB_PAIRINGS=cone/cone,symmetric/cone` runs only those (provider NAT / renter NAT).
    let only = std::env::var("LAB_PAIRINGS").ok();
    for (p, r) in [
        (Nat::Cone, Nat::Cone),
        (Nat::Symmetric, Nat::Cone),
        (Nat::Symmetric, Nat::Symmetric),
    ] {
        let name = format!("{p:?}/{r:?}").to_lowercase();
        if only
            .as_ref()
            .is_none_or(|o| o.split(',').any(|x| x.trim() == name))
        {
            hole_punch_trials(&image, p, r, trials, rtt);
        }
    }
}

/// Sends an HTTP/1.0 GET on `s` and reads the whole answer: bytes read.
fn http_get(mut s: std::net::TcpStream, path: &str) -> usize {
    use std::io::{Read, Write};
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

/// p50 and p99 of 500 round trips of 64 bytes on one connection to an echo server, ms.
fn echo_ms(mut s: std::net::TcpStream) -> (f64, f64) {
    use std::io::{Read, Write};
    s.set_nodelay(true).unwrap();
    let (msg, mut back) = ([7u8; 64], [0u8; 64]);
    let mut t: Vec<u64> = (0..500)
        .map(|_| {
            let start = Instant::now();
            s.write_all(&msg).unwrap();
            s.read_exact(&mut back).unwrap();
            start.elapsed().as_micros() as u64
        })
        .collect();
    t.sort_unstable();
    (
        percentile(&t, 0.5) as f64 / 1e3,
        percentile(&t, 0.99) as f64 / 1e3,
    )
}

/// One market: a lease serving 256 MiB over HTTP (busybox httpd, port 8080) and an echo
/// server (port 9000), `gridlease forward` from the renter's node; GETs and echo round trips
/// through the forward and directly (a socket made in the container's namespace), interleaved.
fn forward_run(label: &str, provider_at: Place, renter_at: Place, rounds: usize) {
    let Some(image) = cli_support::BusyboxImage::build_or_skip("lab_forward") else {
        return;
    };
    let locals = format!(
        "{},{}",
        gridlease_sandbox::probe_image::probe_image_tag(),
        image.tag
    );
    let w = Windows {
        interval: 2,
        window: 20,
        grace: 10,
    };
    let m = market_full(
        provider_at,
        renter_at,
        1,
        0,
        w,
        0,
        &["--local-image", &locals, "--per-gpu-disk-gib", "2"],
    );
    let out = cli_support::bin()
        .arg("--home")
        .arg(&m.renter.home)
        .args([
            "--json",
            "rent",
            &m.offer,
            "--minutes",
            "10",
            "--detach",
            "--image",
            &image.tag,
            "--",
            "sh",
            "-c",
            "cd /workspace && dd if=/dev/zero of=big bs=1M count=256 2>/dev/null && \
             httpd -p 8080 -h /workspace && exec nc -ll -p 9000 -e cat",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", cli_support::text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v["lease_id"].as_str().unwrap().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ns = rt.block_on(async {
        let sb = gridlease_sandbox::Sandbox::connect().await.unwrap();
        let name = gridlease_sandbox::spec::container_name_of(&id.parse().unwrap());
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(ns) = sb.container_netns(&name).await
                && ns.connect(9000, Duration::from_secs(1)).await.is_ok()
            {
                break ns;
            }
            assert!(
                Instant::now() < deadline,
                "the lease's servers did not start"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    let direct = |port: u16| {
        let s = rt
            .block_on(ns.connect(port, Duration::from_secs(5)))
            .unwrap();
        s.set_nonblocking(false).unwrap();
        s
    };
    let mut fwd = cli_support::bin()
        .arg("--home")
        .arg(&m.renter.home)
        .args(["forward", &id, "0:8080", "0:9000"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(fwd.stdout.take().unwrap()));
    let mut port = || -> u16 {
        let l = lines.next().unwrap().unwrap();
        l.strip_prefix("forwarding 127.0.0.1:")
            .and_then(|r| r.split(' ').next())
            .and_then(|p| p.parse().ok())
            .unwrap()
    };
    let (http, echo) = (port(), port());
    let forwarded = |p: u16| std::net::TcpStream::connect(("127.0.0.1", p)).unwrap();
    let relayed = connections_to(&m.renter.home, &m.provider.peer);
    if provider_at != Place::Public && renter_at != Place::Public {
        assert!(
            !relayed.is_empty() && relayed.iter().all(|(_, r)| *r),
            "{label}: a connection is not relayed: {relayed:?}"
        );
    }
    let (mut d, mut f) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (which, out) in [(0, &mut d), (1, &mut f)] {
            let s = if which == 0 {
                direct(8080)
            } else {
                forwarded(http)
            };
            let t = Instant::now();
            let n = http_get(s, "/big");
            assert!(n > 256 << 20, "short read: {n}");
            out.push((n as f64 / t.elapsed().as_secs_f64() / 1e6) as u64);
        }
    }
    d.sort_unstable();
    f.sort_unstable();
    let (de50, de99) = echo_ms(direct(9000));
    let (fe50, fe99) = echo_ms(forwarded(echo));
    let _ = fwd.kill();
    let _ = fwd.wait();
    let (dm, fm) = (percentile(&d, 0.5), percentile(&f, 0.5));
    eprintln!(
        "forward, {label} (connections {relayed:?}): GET 256 MiB median of {rounds}: direct loopback {dm} MB/s, forwarded {fm} MB/s ({:.2}x); 64 B echo p50 {de50:.3} -> {fe50:.3} ms (+{:.3}), p99 {de99:.3} -> {fe99:.3} ms (+{:.3})",
        fm as f64 / dm as f64,
        fe50 - de50,
        fe99 - de99,
    );
    let _ = cli_support::cli(&m.renter.home, &["stop", &id]);
    let _ = m.settled(&id, Duration::from_secs(60));
}

#[test]
#[ignore = "benchmark: run by hand, numbers in docs/benchmarks.md"]
fn forward_through_a_relay() {
    if !lab_or_skip("lab_forward", &[]) {
        return;
    }
    let rounds = std::env::var("LAB_ROUNDS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(3);
    forward_run(
        "provider behind a symmetric NAT, renter behind a cone NAT: relayed only",
        Place::Behind(Nat::Symmetric),
        Place::Behind(Nat::Cone),
        rounds,
    );
    forward_run("both public, direct", Place::Public, Place::Public, rounds);
}
