//! Restart benchmark (issue 19): does a big stored book delay a restarted daemon's first API
//! answer? Two homes, alike but for the store: one holds N live offers of N providers (as
//! gossip would have stored them), one holds none. Each round starts the real `gridlease node`
//! on each home in turn and measures, from the spawn: the first `GET /v1/status` answered on
//! the control socket, and (for the full home) the status that no longer reports
//! `offers_restoring`; then the daemon's RSS with the book restored.
//!
//! ```text
//! cargo build --release -p gridlease-node --bins --example bench_restore
//! target/release/examples/bench_restore 100000 5      # OFFERS ROUNDS
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod bench_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bench_support::{api_status, rss_mib, spawn_daemon, store_offers};
use gridlease_node::home::Home;
use gridlease_protocol::NetworkId;

/// Starts the daemon on `home`; returns it with the time to the first status answer, the time
/// until the restore is reported finished, and the RSS then.
fn run(home: &Path) -> (Duration, Duration, f64, serde_json::Value) {
    let t0 = Instant::now();
    let d = spawn_daemon(home);
    let deadline = t0 + Duration::from_secs(120);
    let (first, mut st) = loop {
        if let Some(s) = api_status(home) {
            break (t0.elapsed(), s);
        }
        assert!(Instant::now() < deadline, "no status answer");
        std::thread::sleep(Duration::from_millis(1));
    };
    while !st["offers_restoring"].is_null() {
        assert!(Instant::now() < deadline, "restore not finished");
        std::thread::sleep(Duration::from_millis(5));
        st = api_status(home).unwrap();
    }
    let restored = t0.elapsed();
    let rss = rss_mib(d.0.id());
    drop(d);
    // The socket file is the daemon's; wait until it is gone or replaced on the next start.
    let _ = std::fs::remove_file(home.join(gridlease_node::api::SOCKET_FILE));
    (first, restored, rss, st)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(5);
    let dir = tempfile::tempdir().unwrap();
    // BENCH_RESTORE_DIR keeps the two homes there (to start a daemon on them by hand).
    let base = std::env::var_os("BENCH_RESTORE_DIR")
        .map_or_else(|| dir.path().to_path_buf(), PathBuf::from);
    let net = NetworkId::devnet();
    let full = base.join("full");
    let empty = base.join("empty");
    Home::init(&full, &net).unwrap();
    Home::init(&empty, &net).unwrap();
    store_offers(&full, &net, n);
    println!("{n} stored offers; {rounds} rounds, each: the empty home, then the full one");
    println!("round  empty: first answer | full: first answer  restored  held    RSS");
    let (mut fe, mut ff, mut fr, mut rss) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (e_first, _, _, _) = run(&empty);
        let (f_first, f_restored, f_rss, st) = run(&full);
        let held = st["offers_known"].as_u64().unwrap();
        assert_eq!(held, n as u64, "every stored offer restored");
        println!(
            "{r:>5}  {:>8.1} ms          | {:>8.1} ms  {:>8.1} ms  {held}  {f_rss:.0} MiB",
            e_first.as_secs_f64() * 1e3,
            f_first.as_secs_f64() * 1e3,
            f_restored.as_secs_f64() * 1e3,
        );
        fe.push(e_first.as_secs_f64() * 1e3);
        ff.push(f_first.as_secs_f64() * 1e3);
        fr.push(f_restored.as_secs_f64() * 1e3);
        rss.push(f_rss);
    }
    let (e, f) = (median(&mut fe), median(&mut ff));
    println!(
        "median first answer: empty {e:.1} ms, full {f:.1} ms, delay {:.1} ms; restored after \
         {:.0} ms; RSS {:.0} MiB",
        f - e,
        median(&mut fr),
        median(&mut rss)
    );
}
