//! Book sync benchmark (issue 21): a node whose book holds N live offers (restored from its
//! store, verified at start), and a new node that connects to it. Measures the time from the
//! connection to the new node holding 99% (and 100%) of the offers, and the sync bytes it
//! received as a ratio to the size of the offers' envelopes.
//!
//! `cargo run --release -p gridlease-node --example bench_book_sync -- [OFFERS] [ROUNDS]`
//! (defaults 10000 and 3).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod bench_support;

use std::time::{Duration, Instant};

use bench_support::*;
use gridlease_node::home::Home;
use gridlease_protocol::NetworkId;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    let net = NetworkId::devnet();

    // The holder's book: N providers' offers, stored as gossip would have stored them.
    let home = dir.path().join("holder");
    let h = Home::init(&home, &net).unwrap();
    drop(h);
    let envelope_bytes = store_offers(&home, &net, n);
    let holder = start_from(&home, config(Duration::from_secs(600))).await;
    holder.node.client.restored().await;
    let held = holder.node.client.book_len().await.unwrap();
    assert_eq!(held, n, "the holder restored its book");
    println!(
        "holder: {n} offers, {envelope_bytes} envelope bytes ({} B each on average)",
        envelope_bytes / n
    );

    let mut t99 = Vec::new();
    let mut t100 = Vec::new();
    let mut ratio = Vec::new();
    for r in 0..rounds {
        let late = start(
            dir.path(),
            &format!("late{r}"),
            config(Duration::from_secs(600)),
        )
        .await;
        let t0 = Instant::now();
        connect(&late, &holder).await;
        let want99 = n * 99 / 100;
        let mut at99 = None;
        loop {
            let have = late.node.client.book_len().await.unwrap();
            if at99.is_none() && have >= want99 {
                at99 = Some(t0.elapsed());
            }
            if have >= n {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "sync stalled at {have}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let all = t0.elapsed();
        let st = late.node.client.sync_stats().await.unwrap();
        let rt = st.bytes_received as f64 / envelope_bytes as f64;
        println!(
            "round {r}: 99% after {:.3} s, 100% after {:.3} s; {} bytes received = {rt:.3}x the envelopes; {st:?}",
            at99.unwrap().as_secs_f64(),
            all.as_secs_f64(),
            st.bytes_received
        );
        t99.push(at99.unwrap().as_secs_f64());
        t100.push(all.as_secs_f64());
        ratio.push(rt);
        late.node.shutdown().await;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "median over {rounds} rounds: 99% after {:.3} s, 100% after {:.3} s, bytes {:.3}x the envelopes",
        median(&mut t99),
        median(&mut t100),
        median(&mut ratio)
    );
}
