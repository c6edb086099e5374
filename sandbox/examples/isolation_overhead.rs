//! runc against gVisor (runsc), with the same hardened spec and the probe image: start latency
//! (create -> start -> exited -> removed, and create -> running), pure CPU work, and system
//! calls, timed inside the container. Runs alternate between the two runtimes so both see the
//! same machine load. Needs Docker with the runtime registered (`docs/security-model.md`).
//!
//! `cargo run --release -p gridlease-sandbox --example isolation_overhead -- [runs] [runtime]`
//! (defaults: 10 runs, runtime `runsc`).

// An example whose product is its printed output.
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    missing_docs
)]

use std::time::Instant;

use gridlease_protocol::{Digest, LeaseId};
use gridlease_sandbox::runtime::now_ms;
use gridlease_sandbox::{Sandbox, SandboxSpec};

fn spec(image: &str, i: usize, args: &[&str], runtime: Option<&str>) -> SandboxSpec {
    let mut s = SandboxSpec::small_on_host(
        LeaseId(Digest::of(
            "isolation-bench",
            format!("{}-{i}-{}", std::process::id(), now_ms().0).as_bytes(),
        )),
        &format!("isolation-bench-{}", std::process::id()),
        image,
        args,
    );
    s.memory_mib = 256;
    if let Some(r) = runtime {
        s.runtime = Some(r.to_string());
        s.isolation = gridlease_protocol::Isolation::Gvisor;
    }
    s
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The `ms=` value of the probe line starting with `prefix`.
fn inner_ms(logs: &str, prefix: &str) -> f64 {
    logs.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("ms=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} line in {logs}"))
}

#[derive(Default)]
struct Samples {
    running: Vec<f64>,
    total: Vec<f64>,
    spin: Vec<f64>,
    syscalls: Vec<f64>,
}

async fn one(sb: &Sandbox, image: &str, i: usize, runtime: Option<&str>, s: &mut Samples) {
    // Start latency: a container that exits at once.
    let t0 = Instant::now();
    let id = sb
        .create(&spec(image, i, &["exit", "0"], runtime))
        .await
        .unwrap();
    sb.start(&id).await.unwrap();
    let running = t0.elapsed();
    sb.wait(&id).await.unwrap();
    sb.remove(&id).await.unwrap();
    s.running.push(running.as_secs_f64() * 1e3);
    s.total.push(t0.elapsed().as_secs_f64() * 1e3);
    // Work, timed inside the container.
    let args = ["spin", "400", "syscalls", "200000", "exit", "0"];
    let id = sb
        .create(&spec(image, i + 1_000_000, &args, runtime))
        .await
        .unwrap();
    sb.start(&id).await.unwrap();
    let exit = sb.wait(&id).await.unwrap();
    let logs = sb.logs(&id, false, 1 << 16).await.unwrap();
    sb.remove(&id).await.unwrap();
    assert_eq!(exit.exit_code, 0, "{logs}");
    s.spin.push(inner_ms(&logs, "SPIN "));
    s.syscalls.push(inner_ms(&logs, "SYSCALLS "));
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let gvisor = args.next().unwrap_or_else(|| "runsc".to_string());
    let sb = Sandbox::connect().await.unwrap();
    let image = sb.ensure_probe_image().await.unwrap();
    let check = gridlease_sandbox::isolation::check_runtime(
        &sb,
        gridlease_protocol::Isolation::Gvisor,
        Some(&gvisor),
    )
    .await
    .unwrap();
    println!(
        "{gvisor}: {} {:?}, tenant kernel {} (host {})",
        check.path.unwrap_or_default(),
        check.args,
        check.tenant_kernel,
        check.host_kernel
    );
    let (mut runc, mut runsc) = (Samples::default(), Samples::default());
    // One warm-up each, then alternate.
    one(&sb, &image, 0, None, &mut Samples::default()).await;
    one(&sb, &image, 1, Some(&gvisor), &mut Samples::default()).await;
    for i in 0..runs {
        one(&sb, &image, 10 + 2 * i, None, &mut runc).await;
        one(&sb, &image, 11 + 2 * i, Some(&gvisor), &mut runsc).await;
    }
    println!("runs={runs}, medians (ms)     runc    {gvisor}   ratio");
    for (what, a, b) in [
        ("create -> running", &mut runc.running, &mut runsc.running),
        ("create -> removed", &mut runc.total, &mut runsc.total),
        ("spin 400M LCG steps", &mut runc.spin, &mut runsc.spin),
        ("200k getppid(2)", &mut runc.syscalls, &mut runsc.syscalls),
    ] {
        let (a, b) = (median(a), median(b));
        println!("{what:<22} {a:>8.1} {b:>8.1} {:>7.2}x", b / a);
    }
}
