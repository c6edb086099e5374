//! Jobs (issue 46): the scheduling overhead of one task against one `rent` of the same image,
//! and the wall time of a 100-task job of short tasks over four local providers.
//!
//! `cargo build --release -p gridlease-node --bins --examples && sudo target/release/examples/bench_jobs [ROUNDS] [TASKS]`
//!
//! Needs Docker and `/bin/busybox` (Debian `busybox-static`). `BENCH_JOBS_VERIFY_WINDOW=S`
//! passes `--verify-window-secs S` to the providers (0: they offer no GPU check; unset: the
//! node's default, so every lease runs the check, as the published numbers did).
//!
//! Set-up: four real `gridlease node` providers (`--dev-gpus`, prices 0.40 to 0.70, usage
//! reports every 2 s) and a renter
//! on loopback, all bootstrapped from the first; a from-scratch busybox image imported under a
//! per-run tag and removed at the end.
//!
//! - **overhead** (ROUNDS rounds, default 9; each round one of each, the order alternated):
//!   *rent*: `POST /v1/leases` of the cheapest offer with `true`, timed from the request to
//!   the container's start (`started_at` of the lease); *job*: `POST /v1/jobs` of a one-task
//!   job running `true`, timed from the submission to its attempt's lease's `started_at`. The
//!   same image, command and providers; each waits until its lease settled before the next.
//!   Reported: the medians and their ratio.
//! - **100 tasks** (TASKS, default 100): one job of TASKS tasks running `true`,
//!   `concurrency: 4`, timed from the submission until it is over; every task must succeed.
//!   Run twice: a lease per task, then `tasks_per_lease: TASKS / 4` (each lease runs a
//!   quarter of the tasks in turn); reported with the leases used and the ratio.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::print_stderr
)]

mod bench_support;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bench_support::{Kill, cli, daemon, wait};
use gridlease_sandbox::Sandbox;
use serde_json::Value;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Waits for lease `id` at the renter to be over; its view.
fn settled(home: &Path, id: &str) -> Value {
    let mut v = Value::Null;
    wait(Duration::from_secs(120), || {
        v = cli(home, &["leases", "--all"])
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["lease_id"] == id)
            .cloned()
            .unwrap_or(Value::Null);
        matches!(v["state"].as_str(), Some("settled" | "failed" | "rejected"))
    });
    v
}

/// Waits for job `id` to be over; its status.
fn job_over(home: &Path, id: &str, limit: Duration) -> Value {
    let mut v = Value::Null;
    wait(limit, || {
        v = cli(home, &["job", "status", id]);
        v["state"] != "running"
    });
    v
}

fn spec(
    dir: &Path,
    name: &str,
    image: &str,
    tasks: u32,
    concurrency: u32,
    per_lease: u32,
) -> std::path::PathBuf {
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &p,
        format!(
            "name: {name}\nimage: {image}\nrun: \"true\"\ntasks: {tasks}\nconcurrency: {concurrency}\ntasks_per_lease: {per_lease}\ntimeout: 2m\n"
        ),
    )
    .unwrap();
    p
}

fn submit(home: &Path, spec: &Path, out: &Path) -> (u64, String) {
    let t0 = now_ms();
    let v = cli(
        home,
        &[
            "job",
            "run",
            spec.to_str().unwrap(),
            "--detach",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    (t0, v["job_id"].as_str().unwrap().to_string())
}

#[tokio::main]
async fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(9);
    let tasks: u32 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100);
    let sb = Sandbox::connect().await.unwrap();
    let busybox = std::fs::read("/bin/busybox").expect("/bin/busybox (busybox-static)");
    let tag = format!("gridlease-bench-jobs-{}:1", std::process::id());
    sb.import_busybox_image(&tag, &busybox).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let locals = format!(
        "{},{tag}",
        gridlease_sandbox::probe_image::probe_image_tag()
    );
    let mut nodes: Vec<Kill> = Vec::new();
    let mut peers = Vec::new();
    let mut bootstrap = String::new();
    let window = std::env::var("BENCH_JOBS_VERIFY_WINDOW").ok();
    for (i, price) in ["0.40", "0.50", "0.60", "0.70"].iter().enumerate() {
        let home = dir.path().join(format!("p{i}"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(home.join("config.toml"), "usage_interval_secs = 2\n").unwrap();
        let gpus = format!("RTX 4090:24GiB:{price}");
        let mut args = vec!["--dev-gpus", &gpus, "--local-image", &locals];
        if let Some(w) = &window {
            args.extend(["--verify-window-secs", w]);
        }
        if i > 0 {
            args.extend(["--bootstrap", &bootstrap]);
        }
        nodes.push(daemon(&home, &args));
        let st = cli(&home, &["status"]);
        if i == 0 {
            bootstrap = st["listen_addrs"][0].as_str().unwrap().to_string();
        }
        peers.push(st["peer_id"].as_str().unwrap().to_string());
    }
    let rh = dir.path().join("r");
    nodes.push(daemon(&rh, &["--bootstrap", &bootstrap]));
    wait(Duration::from_secs(60), || {
        cli(&rh, &["search", "gpu~4090"])
            .as_array()
            .is_some_and(|a| a.len() == 4)
    });

    // Overhead: one rent against one one-task job, alternated.
    let one = spec(dir.path(), "one", &tag, 1, 1, 1);
    let (mut rent_ms, mut job_ms) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        for which in [round % 2, 1 - round % 2] {
            if which == 0 {
                let offers = cli(&rh, &["search", "gpu~4090", "--sort", "price"]);
                let offer = offers[0]["id"].as_str().unwrap().to_string();
                let t0 = now_ms();
                let r = cli(
                    &rh,
                    &[
                        "rent",
                        &offer,
                        "--seconds",
                        "120",
                        "--image",
                        &tag,
                        "--detach",
                        "--",
                        "true",
                    ],
                );
                let v = settled(&rh, r["lease_id"].as_str().unwrap());
                let started = v["started_at"].as_u64().expect("the lease ran");
                rent_ms.push((started - t0) as f64);
            } else {
                let out = dir.path().join(format!("out-{round}"));
                let (t0, id) = submit(&rh, &one, &out);
                let st = job_over(&rh, &id, Duration::from_secs(120));
                assert_eq!(st["state"], "completed", "{st:#}");
                let lease = st["tasks"][0]["attempts"][0]["lease_id"].as_str().unwrap();
                let v = settled(&rh, lease);
                job_ms.push((v["started_at"].as_u64().unwrap() - t0) as f64);
            }
        }
    }
    let (r, j) = (median(rent_ms.clone()), median(job_ms.clone()));
    println!("request -> command running, median of {rounds} (ms):");
    println!("  rent (POST /v1/leases)           {r:8.0}");
    println!(
        "  job task (POST /v1/jobs, 1 task) {j:8.0}   ratio {:.2}x",
        j / r
    );

    // A job of `tasks` short tasks over the four providers: a lease per task, then a quarter
    // of the tasks to a lease.
    let mut walls = Vec::new();
    for per_lease in [1, tasks.div_ceil(4)] {
        let name = format!("many-{per_lease}");
        let many = spec(dir.path(), &name, &tag, tasks, 4, per_lease);
        let started = Instant::now();
        let (_, id) = submit(&rh, &many, &dir.path().join(format!("out-{name}")));
        let st = job_over(&rh, &id, Duration::from_secs(1800));
        let wall = started.elapsed().as_secs_f64();
        assert_eq!(st["state"], "completed", "{st:#}");
        assert_eq!(st["succeeded"].as_u64(), Some(u64::from(tasks)));
        let leases: std::collections::BTreeSet<String> = st["tasks"]
            .as_array()
            .map(|t| {
                t.iter()
                    .flat_map(|t| t["attempts"].as_array().cloned().unwrap_or_default())
                    .filter_map(|a| a["lease_id"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        println!(
            "{tasks}-task job, concurrency 4, tasks_per_lease {per_lease}, 4 providers: {wall:.1} s wall ({:.2} tasks/s, {} attempts, {} leases)",
            f64::from(tasks) / wall,
            st["attempts"],
            leases.len()
        );
        walls.push(wall);
    }
    println!(
        "shared leases / a lease per task, wall time: {:.2}x",
        walls[1] / walls[0]
    );
    drop(nodes);
    for p in &peers {
        for (c, _) in sb.list_node_containers(p).await.unwrap_or_default() {
            let _ = sb.remove(&c).await;
        }
        let _ = sb.remove_node_workspaces(p).await;
    }
    let _ = sb.remove_image(&tag).await;
}
