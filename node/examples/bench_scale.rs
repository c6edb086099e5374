//! Scale harness, first version (issue 19): many real `gridlease node` processes on loopback,
//! fed by a load generator that signs and publishes offers for many synthetic providers at the
//! rate the default announce behaviour produces.
//!
//! ```text
//! cargo build --release -p gridlease-node --bins --example bench_scale
//! target/release/examples/bench_scale 100 100000 60        # DAEMONS PROVIDERS SECONDS [RATE]
//! ```
//!
//! - DAEMONS daemons (`gridlease node`, release build, loopback, no mDNS, JSON logs), each
//!   bootstrapped from up to 3 random earlier ones (seeded), so the graph is connected with a
//!   mean degree of about 6.
//! - The generator (an in-process node, connected to 3 daemons) publishes a new signed offer
//!   (a new sequence) of one of PROVIDERS synthetic providers, round robin, RATE times a second.
//!   Without RATE, the rate is what PROVIDERS providers send under the default announce
//!   behaviour (`docs/protocol.md` 3): a re-sign every 3,480 s and, as the design assumes, two
//!   capacity changes an hour, PROVIDERS x (1/3480 + 2/3600) a second (84/s at 100,000).
//! - Over SECONDS it reports, for each daemon, the CPU it used (share of one core, from
//!   `/proc/PID/stat`), its RSS at the end, and the TCP payload it received (the sum of
//!   `bytes_received` of its established sockets, from `ss -tinp`, end minus start); and, over
//!   every (publication, daemon) pair, the time from publication to the daemon's `offer learned`
//!   log line, and the share of pairs that arrived within 5 s of the end.
//!
//! With `BENCH_CLASSES=K` (K >= 1; `docs/protocol.md` 3c step 1) the providers are spread
//! evenly over K GPU classes (provider i's offers are of class i mod K: class 0 is the
//! fixtures' `rtx-4090`, class c > 0 `bench-class-c`), and daemon i follows class i mod K only
//! (`--follow`): it is bootstrapped from up to 3 earlier daemons of its class and one earlier
//! daemon of any class (the harness picks them: the daemons have no confirmed external
//! address, so step 4's DHT records, which need one, are not there to find). The generator follows every class and is connected to 2 daemons of each; it
//! publishes each offer on its class's topic and on the topic of every offer (which no daemon
//! follows here), as a provider does. Propagation pairs are (publication, daemon following its
//! class). Daemon 0 (class 0) starts with PROVIDERS / K restored `rtx-4090` offers of other
//! providers, the book of a node following one class; while the load runs, the harness
//! searches it through the API (`gpu~4090 vram>=24 price<=0.45 gpus>=2`, limit 20) every
//! 100 ms and reports the latencies. Without `BENCH_CLASSES` every daemon follows every class
//! (the one topic), as before. `BENCH_SEARCH_NICE=N` runs daemon 0 at nice N (`renice`; a
//! negative N, as root, puts it ahead of the other daemons for the cores, as a node alone on
//! its machine would be), and the harness's searching thread too.
//!
//! What it does not do: the daemons other than daemon 0 hold only what arrives in the window
//! (`bench_restore` measures a full book's RSS).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod bench_support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bench_support::*;
use gridlease_node::home::Home;
use gridlease_node::net::RawTopic;
use gridlease_protocol::{NetworkId, NodeKey, Signed, fixtures};

/// The model name of synthetic class `c` (class 0: the fixtures' RTX 4090).
fn class_model(c: usize) -> String {
    if c == 0 {
        fixtures::gpu(0).spec.model
    } else {
        format!("Bench Class {c}")
    }
}

/// The class name of synthetic class `c`.
fn class_name(c: usize) -> String {
    gridlease_protocol::class::class_of_model(&class_model(c))
}

/// Runs the calling thread at nice `nice` (`renice` on its thread id).
fn renice_this_thread(nice: &str) {
    let link = std::fs::read_link("/proc/thread-self").unwrap();
    let tid = link.file_name().unwrap().to_string_lossy().to_string();
    let ok = Command::new("renice")
        .args(["-n", nice, "-p", &tid])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "renice -n {nice} -p {tid} failed");
}

/// Waits (at most 300 s, else panics with `what`) until the daemon on `home` holds at least
/// `n` offers and restores none.
fn wait_for_book(home: &Path, n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(300);
    while api_status(home).is_none_or(|s| {
        s["offers_known"].as_u64().unwrap_or(0) < n as u64 || !s["offers_restoring"].is_null()
    }) {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Search latencies on `home`'s API every 100 ms until `until`.
fn search_while(home: &Path, until: Instant) -> Vec<Duration> {
    if let Ok(nice) = std::env::var("BENCH_SEARCH_NICE") {
        // The searching client too: a renter's CLI on its own machine.
        renice_this_thread(&nice);
    }
    let path = "/v1/offers?q=gpu~4090%20vram%3E%3D24%20price%3C%3D0.45%20gpus%3E%3D2&limit=20";
    let mut out = Vec::new();
    while Instant::now() < until {
        let t = Instant::now();
        let (code, body) = api_get(home, path).expect("the daemon answers");
        out.push(t.elapsed());
        assert_eq!(code, 200, "{body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    out
}

/// TCP payload bytes received so far by each process, summed over its established sockets.
fn bytes_received_by_pid() -> HashMap<u32, u64> {
    let out = Command::new("ss")
        .args(["-tinpH", "state", "established"])
        .output()
        .expect("ss (iproute2) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut by_pid = HashMap::new();
    let mut pid = None;
    for line in text.lines() {
        if let Some(i) = line.find("pid=") {
            pid = line[i + 4..]
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|p| p.parse::<u32>().ok());
        }
        if let Some(i) = line.find("bytes_received:")
            && let Some(p) = pid
        {
            let n: u64 = line[i + 15..]
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            *by_pid.entry(p).or_insert(0) += n;
            pid = None;
        }
    }
    by_pid
}

struct Daemon {
    proc: Kill,
    log: PathBuf,
}

fn spawn(home: &Path, log: &Path, bootstrap: &[String], follow: Option<&str>) -> Kill {
    let mut cmd = daemon_command(home);
    cmd.args(["--log-format", "json"])
        .stderr(std::fs::File::create(log).unwrap());
    for b in bootstrap {
        cmd.args(["--bootstrap", b]);
    }
    if let Some(class) = follow {
        cmd.args(["--follow", class]);
    }
    Kill(cmd.spawn().unwrap())
}

/// `(seq, microseconds since the epoch)` of every `offer learned` line in a JSON log.
fn learned(log: &Path) -> Vec<(u64, i64)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("offer learned"))
        .filter_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            let seq = v["fields"]["seq"].as_u64()?;
            let ts: jiff::Timestamp = v["timestamp"].as_str()?.parse().ok()?;
            Some((seq, ts.as_microsecond()))
        })
        .collect()
}

fn now_us() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap()
}

fn pct_f(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let daemons: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100);
    let providers: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let seconds: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(60);
    let default_rate = providers as f64 * (1.0 / 3480.0 + 2.0 / 3600.0);
    let rate: f64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_rate);
    let classes: usize = std::env::var("BENCH_CLASSES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let class_of = |i: usize| (classes > 0).then(|| i % classes);
    // BENCH_KEEP: the daemons' homes and logs stay for a look afterwards (a panic included).
    let keep = std::env::var_os("BENCH_KEEP").is_some();
    let dir = tempfile::Builder::new()
        .disable_cleanup(keep)
        .tempdir()
        .unwrap();
    if keep {
        println!("daemon homes and logs kept in {}", dir.path().display());
    }
    let net = NetworkId::devnet();
    let mut rng = Rng(0x5eed_5ca1e);
    let search_home = dir.path().join("d0");
    // The offers of one class: daemon 0's stored book.
    let class_book = providers.checked_div(classes);
    if let Some(n) = class_book {
        Home::init(&search_home, &net).unwrap();
        store_offers(&search_home, &net, n);
        println!(
            "daemon 0 starts with {n} stored offers of class {}",
            class_name(0)
        );
    }

    // The daemons, each bootstrapped from up to 3 random earlier ones (of its class, and one
    // of any class, with BENCH_CLASSES).
    let started = Instant::now();
    let mut nodes: Vec<Daemon> = Vec::new();
    let mut addrs: Vec<String> = Vec::new();
    for i in 0..daemons {
        let home = dir.path().join(format!("d{i}"));
        if !home.exists() {
            Home::init(&home, &net).unwrap();
        }
        let log = dir.path().join(format!("d{i}.log"));
        let mut boot = Vec::new();
        if class_book.is_some() && i > 0 && class_of(i) == Some(0) {
            // Class 0's daemons sync daemon 0's whole book when they connect (a peer that is
            // itself still syncing would give part of it, the rest only at the anti-entropy
            // round, 600 s later).
            boot.push(addrs[0].clone());
        }
        let peers: Vec<usize> = (0..i).filter(|&j| class_of(j) == class_of(i)).collect();
        // (Daemon 0, when pushed above, is one of `peers`.)
        while boot.len() < peers.len().min(3) {
            let a = addrs[peers[rng.below(peers.len())]].clone();
            if !boot.contains(&a) {
                boot.push(a);
            }
        }
        if classes > 0 && i > 0 {
            let a = addrs[rng.below(i)].clone();
            if !boot.contains(&a) {
                boot.push(a);
            }
        }
        let follow = class_of(i).map(class_name);
        let proc = spawn(&home, &log, &boot, follow.as_deref());
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = api_status(&home)
                && s["listen_addrs"].as_array().is_some_and(|a| !a.is_empty())
            {
                break s;
            }
            assert!(Instant::now() < deadline, "daemon {i} did not start");
            std::thread::sleep(Duration::from_millis(20));
        };
        let addr = format!(
            "{}/p2p/{}",
            status["listen_addrs"][0].as_str().unwrap(),
            status["peer_id"].as_str().unwrap()
        );
        addrs.push(addr);
        nodes.push(Daemon { proc, log });
        if let Some(nice) = std::env::var("BENCH_SEARCH_NICE").ok().filter(|_| i == 0) {
            // Daemon 0 ahead of the others in the CPU queue: the share of its machine a node
            // has when it runs alone there, while 99 others share these cores.
            // Every thread: on Linux a nice value is a thread's, and `renice -p PID` changes
            // only the main thread's (tokio's workers kept nice 0 in the first runs). Threads
            // started later inherit it from the (reniced) thread that starts them.
            let pid = nodes[0].proc.0.id();
            let tids: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            let ok = Command::new("renice")
                .args(["-n", &nice, "-p"])
                .args(&tids)
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "renice -n {nice} -p {tids:?} failed");
            println!("daemon 0 runs at nice {nice} ({} threads)", tids.len());
        }
        if let Some(n) = class_book.filter(|_| i == 0) {
            // Its book restored before the others connect, so they sync all of it.
            wait_for_book(&home, n, "daemon 0 did not restore its book");
        }
    }
    println!(
        "{daemons} daemons started in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if let Some(n) = class_book {
        // Class 0's daemons sync daemon 0's stored offers when they connect: let that end
        // before the measurement.
        let synced = Instant::now();
        for i in (0..daemons).step_by(classes) {
            let home = dir.path().join(format!("d{i}"));
            wait_for_book(&home, n, &format!("daemon {i} did not sync class 0's book"));
        }
        println!(
            "class 0's {} daemons hold its {n} offers after {:.1} s more",
            daemons.div_ceil(classes),
            synced.elapsed().as_secs_f64()
        );
    }

    // The generator, connected to 3 daemons (to 2 of each class, following every class).
    let mut gen_config = config(Duration::from_secs(600));
    if classes > 0 {
        gen_config.follow = Some((0..classes).map(class_name).collect());
    }
    let generator = start(dir.path(), "generator", gen_config).await;
    let mut dialed = Vec::new();
    let groups: Vec<Vec<usize>> = match classes {
        0 => vec![(0..daemons).collect()],
        k => (0..k)
            .map(|c| (0..daemons).filter(|&i| i % k == c).collect())
            .collect(),
    };
    let per_group = if classes > 0 { 2 } else { 3 };
    for group in &groups {
        let mut mine = Vec::new();
        while mine.len() < group.len().min(per_group) {
            let d = group[rng.below(group.len())];
            if !mine.contains(&d) {
                mine.push(d);
                generator
                    .node
                    .client
                    .dial(addrs[d].parse().unwrap())
                    .await
                    .unwrap()
                    .unwrap();
            }
        }
        dialed.extend(mine);
    }
    // Meshes form on the 1 s heartbeat; give them a few.
    let deadline = Instant::now() + Duration::from_secs(60);
    while generator.node.client.mesh_peers().await.unwrap().len() < dialed.len() {
        assert!(
            Instant::now() < deadline,
            "the generator's meshes hold {} of the {} daemons it dialed",
            generator.node.client.mesh_peers().await.unwrap().len(),
            dialed.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Each publication: one provider's next offer, a sequence unique across the run.
    let base_seq = gridlease_node::clock::now().0;
    let key_of = |i: usize| {
        let mut secret = [0u8; 32];
        secret[0] = 7;
        secret[8..16].copy_from_slice(&(i as u64 + 1).to_be_bytes());
        NodeKey::from_secret(secret)
    };
    let pids: Vec<u32> = nodes.iter().map(|d| d.proc.0.id()).collect();
    let cpu0: Vec<f64> = pids.iter().map(|&p| cpu_s(p)).collect();
    let bytes0 = bytes_received_by_pid();
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(seconds);
    let mut published: HashMap<u64, (i64, Option<usize>)> = HashMap::new();
    let searcher = (classes > 0).then(|| {
        let home = search_home.clone();
        std::thread::spawn(move || search_while(&home, until))
    });
    let period = Duration::from_secs_f64(1.0 / rate.max(0.001));
    let mut next = Instant::now();
    let mut n = 0usize;
    while Instant::now() < until {
        let key = key_of(n % providers);
        let seq = base_seq + n as u64;
        let now = gridlease_node::clock::now();
        let mut offer = fixtures::offer(key.public(), seq, 1 + (n % 4) as u8, 350_000);
        offer.created_at = now;
        offer.expires_at = now.plus_secs(3600);
        let class = class_of(n % providers);
        if let Some(c) = class {
            for g in &mut offer.gpus {
                g.spec.model = class_model(c);
            }
        }
        let bytes = Signed::sign(&key, &net, &offer)
            .unwrap()
            .to_bytes()
            .unwrap();
        published.insert(seq, (now_us(), class));
        let c = &generator.node.client;
        match class {
            None => {
                let _ = c.publish_raw(bytes).await;
            }
            Some(k) => {
                let _ = c
                    .publish_raw_on(RawTopic::Class(class_name(k)), bytes.clone())
                    .await;
                let _ = c.publish_raw_on(RawTopic::Every, bytes).await;
            }
        }
        n += 1;
        next += period;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu: Vec<f64> = pids
        .iter()
        .zip(&cpu0)
        .map(|(&p, c0)| (cpu_s(p) - c0) / elapsed)
        .collect();
    let bytes1 = bytes_received_by_pid();
    let rss: Vec<f64> = pids.iter().map(|&p| rss_mib(p)).collect();
    // Let the last publications arrive.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let inbound: Vec<f64> = pids
        .iter()
        .map(|p| {
            let b = bytes1.get(p).copied().unwrap_or(0) as f64
                - bytes0.get(p).copied().unwrap_or(0) as f64;
            b / elapsed / 1000.0
        })
        .collect();
    let mut delays = Vec::new();
    let mut arrived = 0usize;
    for (i, d) in nodes.iter().enumerate() {
        for (seq, at) in learned(&d.log) {
            if let Some((sent, class)) = published.get(&seq) {
                assert_eq!(
                    *class,
                    class_of(i),
                    "daemon {i} learned another class's offer"
                );
                delays.push((at - sent) as f64 / 1000.0);
                arrived += 1;
            }
        }
    }
    delays.sort_by(f64::total_cmp);
    let mut cpu_sorted = cpu.clone();
    cpu_sorted.sort_by(f64::total_cmp);
    let mut in_sorted = inbound.clone();
    in_sorted.sort_by(f64::total_cmp);
    let mut rss_sorted = rss.clone();
    rss_sorted.sort_by(f64::total_cmp);
    // (publication, daemon that follows its class) pairs.
    let pairs: usize = published
        .values()
        .map(|(_, class)| (0..daemons).filter(|&i| class_of(i) == *class).count())
        .sum();
    println!(
        "{n} offers of {providers} providers published in {elapsed:.1} s ({:.1}/s), to {daemons} daemons",
        n as f64 / elapsed
    );
    println!(
        "per daemon, p50 / p90 / max: CPU {:.2} / {:.2} / {:.2} % of a core; inbound TCP {:.1} / {:.1} / {:.1} KB/s; RSS {:.0} / {:.0} / {:.0} MiB",
        pct_f(&cpu_sorted, 0.5) * 100.0,
        pct_f(&cpu_sorted, 0.9) * 100.0,
        cpu_sorted.last().unwrap() * 100.0,
        pct_f(&in_sorted, 0.5),
        pct_f(&in_sorted, 0.9),
        in_sorted.last().unwrap(),
        pct_f(&rss_sorted, 0.5),
        pct_f(&rss_sorted, 0.9),
        rss_sorted.last().unwrap(),
    );
    println!(
        "publication -> daemon's `offer learned`: {arrived} of {pairs} pairs ({:.2} %); p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        arrived as f64 * 100.0 / pairs.max(1) as f64,
        pct_f(&delays, 0.5),
        pct_f(&delays, 0.99),
        delays.last().copied().unwrap_or(f64::NAN)
    );
    if let Some(s) = searcher {
        let mut lat = s.join().unwrap();
        lat.sort();
        println!(
            "daemon 0 ({} offers held at the end) searched through the API while the load ran: {}",
            api_status(&search_home).map_or(-1, |s| s["offers_known"].as_i64().unwrap_or(-1)),
            report("search", lat)
        );
    }
    if classes > 0 {
        println!(
            "{classes} classes, each daemon follows one ({:.1} % of the offers)",
            100.0 / classes as f64
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at the end: {}", load.trim());
    generator.node.shutdown().await;
    drop(nodes);
}
