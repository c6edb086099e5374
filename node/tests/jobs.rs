//! Jobs (issue 46) with real nodes and real Docker: four providers (`--dev-gpus`, different
//! prices) and a renter that runs job specs over them. Outputs come home with their
//! checksums, the cheapest offers go first, a provider killed mid-task has its task resume
//! elsewhere from its checkpoint, user errors are not retried unless listed, a renter restart
//! loses nothing and runs nothing twice, and a budget stops launches before it is passed.

mod cli_support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use cli_support::{
    BusyboxImage, ContainersGuard, Daemon, cli, init, json, start_node_logged, text, wait_for,
};
use serde_json::Value;
use sha2::Digest as _;

/// One provider of the test market.
struct Provider {
    home: PathBuf,
    daemon: Option<Daemon>,
    peer: String,
    price: &'static str,
}

/// Four providers at different prices and a renter, all bootstrapped from the first
/// provider; every daemon killed and every container removed when dropped.
struct JobMarket {
    dir: PathBuf,
    providers: Vec<Provider>,
    renter: Option<Daemon>,
    bootstrap: String,
    _guards: Vec<ContainersGuard>,
}

impl Drop for JobMarket {
    fn drop(&mut self) {
        self.renter.take();
        for p in &mut self.providers {
            p.daemon.take();
        }
    }
}

const PRICES: [&str; 4] = ["0.40", "0.50", "0.60", "0.70"];

impl JobMarket {
    fn start(dir: &Path, image: &str) -> Self {
        let locals = format!(
            "{},{image}",
            gridlease_sandbox::probe_image::probe_image_tag()
        );
        let mut providers: Vec<Provider> = Vec::new();
        let mut guards = Vec::new();
        let mut bootstrap = String::new();
        for (i, price) in PRICES.iter().enumerate() {
            let home = dir.join(format!("p{i}"));
            init(&home);
            let gpus = format!("RTX 4090:24GiB:{price}");
            let mut args = vec!["--dev-gpus", &gpus, "--local-image", &locals];
            if i > 0 {
                args.extend(["--bootstrap", &bootstrap]);
            }
            let log = dir.join(format!("p{i}.log"));
            let daemon = start_node_logged(&home, &args, Some(&log));
            let status = json(&home, &["status"]);
            if i == 0 {
                bootstrap = status["listen_addrs"][0].as_str().unwrap().to_string();
            }
            let peer = status["peer_id"].as_str().unwrap().to_string();
            guards.push(ContainersGuard(peer.clone()));
            providers.push(Provider {
                home,
                daemon: Some(daemon),
                peer,
                price,
            });
        }
        let rh = dir.join("renter");
        init(&rh);
        let mut m = Self {
            dir: dir.to_path_buf(),
            providers,
            renter: None,
            bootstrap,
            _guards: guards,
        };
        m.start_renter();
        wait_for(Duration::from_secs(60), "four offers at the renter", || {
            json(&rh, &["search", "gpu~4090"])
                .as_array()
                .is_some_and(|a| a.len() == 4)
        });
        m
    }

    fn renter_home(&self) -> PathBuf {
        self.dir.join("renter")
    }

    fn start_renter(&mut self) {
        let log = self.dir.join("renter.log");
        let log = if log.exists() {
            self.dir.join("renter-2.log")
        } else {
            log
        };
        self.renter = Some(start_node_logged(
            &self.renter_home(),
            &["--bootstrap", &self.bootstrap],
            Some(&log),
        ));
    }

    fn kill_renter(&mut self) {
        if let Some(mut d) = self.renter.take() {
            // SIGKILL: nothing is flushed or said to anyone.
            let _ = d.0.kill();
            let _ = d.0.wait();
        }
    }

    fn price_of(&self, peer: &str) -> &'static str {
        self.providers
            .iter()
            .find(|p| p.peer == peer)
            .map_or("?", |p| p.price)
    }

    /// `gridlease job ARGS..` at the renter.
    fn job(&self, args: &[&str]) -> Output {
        let mut all = vec!["job"];
        all.extend_from_slice(args);
        cli(&self.renter_home(), &all)
    }

    /// `gridlease --json job status JOB`.
    fn status(&self, job: &str) -> Value {
        json(&self.renter_home(), &["job", "status", job])
    }

    /// Submits a spec (`--detach`): the job id.
    fn submit(&self, spec: &Path, out: &Path) -> String {
        let o = cli(
            &self.renter_home(),
            &[
                "--json",
                "job",
                "run",
                spec.to_str().unwrap(),
                "--detach",
                "--out",
                out.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "job run: {}", text(&o.stderr));
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        v["job_id"].as_str().unwrap().to_string()
    }

    fn wait_over(&self, job: &str, limit: Duration) -> Value {
        let mut last = Value::Null;
        wait_for(limit, "the job to end", || {
            last = self.status(job);
            last["state"] != "running"
        });
        last
    }
}

fn write_spec(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(format!("{name}.yaml"));
    std::fs::write(&p, body).unwrap();
    p
}

/// Every attempt of a job's status, flattened: (task, attempt json).
fn attempts(status: &Value) -> Vec<(u64, Value)> {
    let mut out = Vec::new();
    for t in status["tasks"].as_array().unwrap() {
        for a in t["attempts"].as_array().unwrap() {
            out.push((t["task"].as_u64().unwrap(), a.clone()));
        }
    }
    out
}

fn image_or_skip(test: &str) -> Option<BusyboxImage> {
    BusyboxImage::build_or_skip(test)
}

#[test]
fn a_twelve_task_job_runs_over_four_providers_cheapest_first_with_its_outputs_home() {
    let Some(image) = image_or_skip("jobs_twelve") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = JobMarket::start(dir.path(), &image.tag);
    let spec = write_spec(
        dir.path(),
        "sweep",
        &format!(
            r#"name: sweep
resources:
  gpu: "4090"
  max_price: 1.00
image: {image}
run: |
  mkdir -p out
  echo "task $TASK_INDEX of $TASK_COUNT" > out/data.txt
  head -c 65536 /dev/urandom >> out/data.txt
  sha256sum out/data.txt > out/sum.txt
  echo "task $TASK_INDEX wrote its output"
tasks: 12
outputs: [/workspace/out]
concurrency: 3
timeout: 2m
"#,
            image = image.tag
        ),
    );
    let out = dir.path().join("OUT");
    // In the foreground: the command follows the job and exits 0 once every task succeeded.
    let o = cli(
        &m.renter_home(),
        &[
            "--json",
            "job",
            "run",
            spec.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let status: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} / {}", text(&o.stdout), text(&o.stderr)));
    assert_eq!(o.status.code(), Some(0), "{status:#}\n{}", text(&o.stderr));
    assert_eq!(status["state"], "completed", "{status:#}");
    assert_eq!(status["succeeded"], 12);
    let job = status["job_id"].as_str().unwrap();
    let full = m.status(job);
    for t in 0..12 {
        let data = std::fs::read(out.join(format!("{t}/out/data.txt")))
            .unwrap_or_else(|e| panic!("task {t}'s output: {e}"));
        assert!(data.starts_with(format!("task {t} of 12\n").as_bytes()));
        let sum = std::fs::read_to_string(out.join(format!("{t}/out/sum.txt"))).unwrap();
        let want = sum.split_whitespace().next().unwrap();
        assert_eq!(hex::encode(sha2::Sha256::digest(&data)), want, "task {t}");
        let log = m.job(&["logs", job, &t.to_string()]);
        assert!(
            text(&log.stdout).contains(&format!("task {t} wrote its output")),
            "task {t}'s log: {}",
            text(&log.stdout)
        );
    }
    // The first three launches went to the three cheapest offers.
    let mut all = attempts(&full);
    all.sort_by_key(|(_, a)| a["started_at"].as_u64().unwrap());
    let mut first: Vec<&str> = all[..3]
        .iter()
        .map(|(_, a)| m.price_of(a["provider"].as_str().unwrap()))
        .collect();
    first.sort();
    assert_eq!(first, vec!["0.40", "0.50", "0.60"], "{full:#}");
    // Spent is what the leases settled at, and each lease is in the renter's ledger.
    let spent: u64 = all.iter().map(|(_, a)| a["spent"].as_u64().unwrap()).sum();
    assert_eq!(full["spent"].as_u64().unwrap(), spent);
    assert!(spent > 0);
}
