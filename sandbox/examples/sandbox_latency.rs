//! Measures hardened-container latency (create, start, wait, remove) with the probe image, and
//! the CPU cost of metering one container for a few seconds. Needs Docker.
//!
//! `cargo run --release -p gridlease-sandbox --example sandbox_latency -- [runs]`

// An example whose product is its printed output.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs
)]

use std::time::Instant;

use gridlease_protocol::{Digest, LeaseId};
use gridlease_sandbox::meter::{Meter, MeterControl, meter_run};
use gridlease_sandbox::runtime::now_ms;
use gridlease_sandbox::{Sandbox, SandboxSpec};

fn spec(image: &str, i: usize, args: &[&str]) -> SandboxSpec {
    SandboxSpec::small_on_host(
        LeaseId(Digest::of(
            "latency",
            format!("{}-{i}-{}", std::process::id(), now_ms().0).as_bytes(),
        )),
        &format!("latency-{}", std::process::id()),
        image,
        args,
    )
}

fn median_ms(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// utime + stime of this process, ms.
fn own_cpu_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    ticks * 10.0 // USER_HZ = 100
}

#[tokio::main]
async fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    let sb = Sandbox::connect().await.unwrap();
    let image = sb.ensure_probe_image().await.unwrap();
    let (mut create, mut start, mut wait, mut remove, mut total) =
        (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..runs {
        let s = spec(&image, i, &["exit", "0"]);
        let t0 = Instant::now();
        let id = sb.create(&s).await.unwrap();
        let t1 = Instant::now();
        sb.start(&id).await.unwrap();
        let t2 = Instant::now();
        sb.wait(&id).await.unwrap();
        let t3 = Instant::now();
        sb.remove(&id).await.unwrap();
        let t4 = Instant::now();
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        create.push(ms(t0, t1));
        start.push(ms(t1, t2));
        wait.push(ms(t2, t3));
        remove.push(ms(t3, t4));
        total.push(ms(t0, t4));
    }
    println!(
        "runs={runs} median ms: create={:.1} start={:.1} wait(exit 0)={:.1} remove={:.1} total={:.1}",
        median_ms(&mut create),
        median_ms(&mut start),
        median_ms(&mut wait),
        median_ms(&mut remove),
        median_ms(&mut total)
    );

    // Metering cost: this process's CPU while metering a container that sleeps 5 s.
    let s = spec(&image, runs, &["sleep", "5"]);
    let id = sb.create(&s).await.unwrap();
    sb.start(&id).await.unwrap();
    let cpu0 = own_cpu_ms();
    let t0 = Instant::now();
    let mut meter = Meter::new(now_ms(), 0);
    let (_, totals, samples) =
        meter_run(&sb, &id, &mut meter, &[], None, &mut MeterControl::idle())
            .await
            .unwrap();
    let wall = t0.elapsed().as_secs_f64();
    let cpu = own_cpu_ms() - cpu0;
    sb.remove(&id).await.unwrap();
    println!(
        "metering: {samples} samples over {wall:.1} s wall, provider CPU {cpu:.0} ms ({:.2}% of one core); metered wall_ms={}",
        cpu / (wall * 10.0),
        totals.wall_ms
    );
}
