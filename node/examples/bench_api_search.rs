//! Search through the control API, idle and under gossip load (issue 19).
//!
//! The real daemon (`gridlease node`) holds N offers (restored from its store); the benchmark
//! times `GET /v1/offers?q=QUERY&limit=20` on its control socket, one request per connection,
//! first with the daemon idle, then while an in-process publisher node connected to it gossips
//! new offers of new providers at RATE per second. It also reports the daemon's CPU during the
//! load and how many of the published offers it admitted.
//!
//! ```text
//! cargo build --release -p gridlease-node --bins --example bench_api_search
//! target/release/examples/bench_api_search 100000 400 10 300   # OFFERS RATE SECONDS SEARCHES
//! ```
//!
//! The daemon takes at most `peer_rate` (500) offer messages a second from one peer, so a RATE
//! above that measures the rate limit, not the book.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod bench_support;

use std::path::Path;
use std::time::{Duration, Instant};

use bench_support::*;
use gridlease_node::home::Home;
use gridlease_protocol::NetworkId;

/// The example query of `docs/search.md`, URL-encoded.
const QUERY: &str = "gpu~4090%20vram%3E%3D24%20price%3C%3D0.45%20gpus%3E%3D2";

/// `count` searches one after another (or until `until`): their latencies.
fn searches(home: &Path, count: usize, until: Option<Instant>) -> Vec<Duration> {
    let path = format!("/v1/offers?q={QUERY}&limit=20");
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        if until.is_some_and(|u| Instant::now() >= u) {
            break;
        }
        let t = Instant::now();
        let (code, body) = api_get(home, &path).expect("the daemon answers");
        out.push(t.elapsed());
        assert_eq!(code, 200, "{body}");
    }
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mut arg = |d: usize| args.next().and_then(|s| s.parse().ok()).unwrap_or(d);
    let (n, rate, seconds, count) = (arg(100_000), arg(400), arg(10), arg(300));
    let dir = tempfile::tempdir().unwrap();
    let net = NetworkId::devnet();
    let home = dir.path().join("daemon");
    Home::init(&home, &net).unwrap();
    store_offers(&home, &net, n);
    let daemon = spawn_daemon(&home);
    let pid = daemon.0.id();
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = api_status(&home)
            && s["offers_restoring"].is_null()
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon did not restore its book"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status["offers_known"].as_u64(), Some(n as u64));
    let addr: libp2p::Multiaddr = status["listen_addrs"][0].as_str().unwrap().parse().unwrap();

    let h = home.clone();
    let idle = tokio::task::spawn_blocking(move || searches(&h, count, None))
        .await
        .unwrap();
    println!("{}", report(&format!("API search, idle, {n} offers"), idle));

    // The publisher: its offers are new providers' (tag 1), signed before the clock starts.
    let total = rate * seconds;
    let now = gridlease_node::clock::now();
    let load: Vec<Vec<u8>> = signed_offers(&net, 1, total + 1, now)
        .into_iter()
        .map(|(_, s, _)| s.to_bytes().unwrap())
        .collect();
    let publisher = start(dir.path(), "publisher", config(Duration::from_secs(600))).await;
    publisher.node.client.dial(addr).await.unwrap().unwrap();
    // Gossip flows once the first offer arrives.
    let mut load = load.into_iter();
    let probe = load.next().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let _ = publisher.node.client.publish_raw(probe.clone()).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let known = api_status(&home).unwrap()["offers_known"].as_u64().unwrap();
        if known > n as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "gossip to the daemon did not start"
        );
    }
    let before = api_status(&home).unwrap()["offers_known"].as_u64().unwrap();

    let h = home.clone();
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(seconds as u64);
    let cpu0 = cpu_s(pid);
    let searcher = tokio::task::spawn_blocking(move || searches(&h, count, Some(until)));
    // RATE a second, in 10 ms ticks.
    let per_tick = (rate / 100).max(1);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut sent = 0;
    'publish: while Instant::now() < until {
        tick.tick().await;
        for _ in 0..per_tick {
            let Some(bytes) = load.next() else {
                break 'publish;
            };
            let _ = publisher.node.client.publish_raw(bytes).await;
            sent += 1;
        }
    }
    let busy = searcher.await.unwrap();
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = (cpu_s(pid) - cpu0) / elapsed;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = api_status(&home).unwrap()["offers_known"].as_u64().unwrap();
    let searched = busy.len();
    println!(
        "{}",
        report(
            &format!(
                "API search, {sent} offers gossiped at {:.0}/s over {elapsed:.1} s",
                sent as f64 / elapsed
            ),
            busy
        )
    );
    println!(
        "{searched} searches during the load; daemon CPU {:.0}% of a core; {} of {sent} offers \
         admitted within 2 s of the end; daemon RSS {:.0} MiB",
        cpu * 100.0,
        after - before,
        rss_mib(pid)
    );
    publisher.node.shutdown().await;
    drop(daemon);
}
