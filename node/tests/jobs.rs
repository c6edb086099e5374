//! Jobs (issue 46) with real nodes and real Docker: four providers (`--dev-gpus`, different
//! prices) and a renter that runs job specs over them. Outputs come home with their
//! checksums, the cheapest offers go first, a provider killed mid-task has its task resume
//! elsewhere from its checkpoint, user errors are not retried unless listed, a renter restart
//! loses nothing and runs nothing twice, and a budget stops launches before it is passed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

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

/// The providers' prices: the first (the others' bootstrap peer) is the dearest, so the tests
/// that kill a provider never kill the one every node first connected to.
const PRICES: [&str; 4] = ["0.70", "0.40", "0.50", "0.60"];

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
            // Reports every 2 s: a silent provider is given up in seconds, not half a minute.
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(home.join("config.toml"))
                .and_then(|mut f| {
                    use std::io::Write;
                    writeln!(f, "usage_interval_secs = 2")
                })
                .unwrap();
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

    /// Asserts the renter's ledger and the running providers' agree lease by lease; the
    /// renter's ledger.
    fn assert_ledgers_agree(&self) -> Value {
        let mut provider_totals = std::collections::HashMap::new();
        for p in self.providers.iter().filter(|p| p.daemon.is_some()) {
            for s in json(&p.home, &["ledger"])["leases"].as_array().unwrap() {
                provider_totals.insert(
                    s["lease_id"].as_str().unwrap().to_string(),
                    s["total"].clone(),
                );
            }
        }
        let renter = json(&self.renter_home(), &["ledger"]);
        let leases = renter["leases"].as_array().unwrap();
        assert_eq!(leases.len(), provider_totals.len(), "{renter:#}");
        for s in leases {
            let id = s["lease_id"].as_str().unwrap();
            assert_eq!(Some(&s["total"]), provider_totals.get(id), "lease {id}");
        }
        renter
    }

    /// The renter's view of lease `id` (`leases --all`).
    fn renter_lease(&self, id: &str) -> Value {
        json(&self.renter_home(), &["leases", "--all"])
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["lease_id"] == id)
            .unwrap()
            .clone()
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
    // The worked example of docs/jobs.md, its image this run's.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/sweep");
    for f in ["train.sh", "lrs.txt"] {
        std::fs::copy(example.join(f), dir.path().join(f)).unwrap();
    }
    let yaml = std::fs::read_to_string(example.join("sweep.yaml")).unwrap();
    assert!(yaml.contains("image: gridlease-demo-busybox:1"));
    let spec = write_spec(
        dir.path(),
        "sweep",
        &yaml.replace("gridlease-demo-busybox:1", &image.tag),
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
    assert_eq!(status["name"], "lr-sweep");
    let job = status["job_id"].as_str().unwrap();
    let full = m.status(job);
    let lrs: Vec<String> = std::fs::read_to_string(example.join("lrs.txt"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lrs.len(), 12);
    for (t, lr) in lrs.iter().enumerate() {
        let data = std::fs::read(out.join(format!("{t}/out/metrics.json")))
            .unwrap_or_else(|e| panic!("task {t}'s output: {e}"));
        let metrics: Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(metrics["task"], t);
        assert_eq!(metrics["lr"], lr.as_str(), "task {t} got its own line");
        assert_eq!(metrics["steps"], 3);
        let sum = std::fs::read_to_string(out.join(format!("{t}/out/metrics.sha256"))).unwrap();
        let want = sum.split_whitespace().next().unwrap();
        assert_eq!(hex::encode(sha2::Sha256::digest(&data)), want, "task {t}");
        let log = m.job(&["logs", job, &t.to_string()]);
        assert!(
            text(&log.stdout).contains(&format!("task {t} done")),
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

/// The running attempt of task `task` (its provider's peer id), once its local checkpoint
/// copy says the task reached at least step `step`.
fn wait_checkpoint(m: &JobMarket, job: &str, task: u64, step: u32) -> String {
    let file = m
        .renter_home()
        .join(format!("jobs/{job}/tasks/{task}/checkpoint/step"));
    wait_for(Duration::from_secs(90), "a checkpoint copied home", || {
        std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .is_some_and(|s| s >= step)
    });
    let st = m.status(job);
    let running: Vec<(u64, Value)> = attempts(&st)
        .into_iter()
        .filter(|(t, a)| *t == task && a["phase"] == "running")
        .collect();
    assert_eq!(running.len(), 1, "{st:#}");
    running[0].1["provider"].as_str().unwrap().to_string()
}

/// A task that counts to `steps`, one step a second, keeping its step in `ckpt/step`, and
/// starting from the step a checkpoint carried in says.
fn counting_spec(image: &str, tasks: u32, steps: u32) -> String {
    format!(
        r#"name: count
image: {image}
run: |
  mkdir -p ckpt out
  step=0
  if [ -f ckpt/step ]; then step=$(cat ckpt/step); fi
  start=$step
  echo "task $TASK_INDEX attempt $GRIDLEASE_ATTEMPT starts at step $start"
  while [ $step -lt {steps} ]; do
    sleep 1
    step=$((step + 1))
    echo $step > ckpt/step.new && mv ckpt/step.new ckpt/step
  done
  echo "started at step $start, ended at step $step" > out/result.txt
tasks: {tasks}
outputs: [/workspace/out]
checkpoint:
  path: /workspace/ckpt
  every: 2s
retries:
  max: 3
concurrency: 1
timeout: 3m
"#
    )
}

#[test]
fn a_task_whose_provider_is_killed_resumes_elsewhere_from_its_checkpoint() {
    let Some(image) = image_or_skip("jobs_provider_dies") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut m = JobMarket::start(dir.path(), &image.tag);
    let spec = write_spec(dir.path(), "count", &counting_spec(&image.tag, 1, 14));
    let out = dir.path().join("OUT");
    let job = m.submit(&spec, &out);
    let victim = wait_checkpoint(&m, &job, 0, 4);
    assert_eq!(m.price_of(&victim), "0.40", "the cheapest went first");
    // kill -9 the provider running the task.
    let p = m.providers.iter_mut().find(|p| p.peer == victim).unwrap();
    let mut d = p.daemon.take().unwrap();
    d.0.kill().unwrap();
    d.0.wait().unwrap();
    let st = m.wait_over(&job, Duration::from_secs(180));
    assert_eq!(st["state"], "completed", "{st:#}");
    let tries = attempts(&st);
    assert_eq!(tries.len(), 2, "{st:#}");
    assert_eq!(tries[0].1["provider"], victim.as_str());
    assert_eq!(tries[0].1["verdict"], "provider_fault", "{st:#}");
    // The dead provider got nothing more, and is excluded for the job.
    assert!(
        tries[1..]
            .iter()
            .all(|(_, a)| a["provider"] != victim.as_str())
    );
    assert_eq!(st["excluded"][0]["provider"], victim.as_str(), "{st:#}");
    // The task's own output says it resumed past the start.
    let result = std::fs::read_to_string(out.join("0/out/result.txt")).unwrap();
    let start: u32 = result
        .strip_prefix("started at step ")
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{result:?}"));
    assert!(start >= 4, "resumed at step {start}: {result}");
    assert!(result.trim_end().ends_with("ended at step 14"), "{result}");
    let log = m.job(&["logs", &job, "0"]);
    assert!(
        text(&log.stdout).contains(&format!("attempt 2 starts at step {start}")),
        "{}",
        text(&log.stdout)
    );
}

#[test]
fn a_failing_task_is_not_retried_unless_its_exit_code_is_listed() {
    let Some(image) = image_or_skip("jobs_user_error") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = JobMarket::start(dir.path(), &image.tag);
    let spec = write_spec(
        dir.path(),
        "fails",
        &format!(
            r#"name: fails
image: {image}
run: |
  if [ "$TASK_INDEX" = 0 ]; then echo "cannot open the dataset" >&2; exit 1; fi
  if [ "$GRIDLEASE_ATTEMPT" = 1 ]; then echo "transient failure"; exit 3; fi
  echo "task $TASK_INDEX fine on attempt $GRIDLEASE_ATTEMPT"
tasks: 2
retries:
  max: 2
  on_exit_codes: [3]
concurrency: 2
timeout: 1m
"#,
            image = image.tag
        ),
    );
    let out = dir.path().join("OUT");
    let o = m.job(&[
        "run",
        spec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let shown = text(&o.stdout);
    assert!(shown.contains("1 task(s) failed"), "{shown}");
    assert!(
        shown.contains("cannot open the dataset"),
        "the log tail: {shown}"
    );
    let jobs = json(&m.renter_home(), &["job", "list"]);
    let st = m.status(jobs[0]["job_id"].as_str().unwrap());
    assert_eq!(st["state"], "failed");
    let t0 = &st["tasks"][0];
    assert_eq!(t0["state"], "failed", "{st:#}");
    assert_eq!(t0["exit_code"], 1);
    assert_eq!(
        t0["attempts"].as_array().unwrap().len(),
        1,
        "not retried: {st:#}"
    );
    assert!(
        t0["message"]
            .as_str()
            .unwrap()
            .contains("exited with code 1; last output:\ncannot open the dataset"),
        "{st:#}"
    );
    let t1 = &st["tasks"][1];
    assert_eq!(t1["state"], "succeeded", "{st:#}");
    let a = t1["attempts"].as_array().unwrap();
    assert_eq!(a.len(), 2, "retried once: {st:#}");
    assert_eq!(
        (a[0]["verdict"].as_str(), a[0]["exit_code"].as_i64()),
        (Some("exited"), Some(3))
    );
    // A user error excludes no provider.
    assert!(st["excluded"].as_array().unwrap().is_empty(), "{st:#}");
}

#[test]
fn a_budget_below_the_jobs_need_stops_launches_and_lists_what_did_not_start() {
    let Some(image) = image_or_skip("jobs_budget") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = JobMarket::start(dir.path(), &image.tag);
    // Each lease can cost 120 s at its price (its cap) and costs at least the offers' 60 s
    // minimum: at 0.40 a GPU-hour, 0.0133 capped and 0.00667 spent. 0.025 runs two, one at a
    // time, then neither fits.
    let spec = write_spec(
        dir.path(),
        "budget",
        &format!(
            r#"name: budget
image: {image}
run: echo "task $TASK_INDEX"
tasks: 6
concurrency: 3
timeout: 2m
budget:
  max_total: 0.025
"#,
            image = image.tag
        ),
    );
    let out = dir.path().join("OUT");
    let o = m.job(&[
        "--json",
        "run",
        spec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(8), "{}", text(&o.stderr));
    let st: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(st["state"], "budget_reached", "{st:#}");
    let budget = 25_000u64;
    assert!(st["spent"].as_u64().unwrap() <= budget, "{st:#}");
    assert!(st["exposure"].as_u64().unwrap() <= budget, "{st:#}");
    let started = st["succeeded"].as_u64().unwrap();
    assert!((1..6).contains(&started), "{st:#}");
    assert_eq!(st["not_started"].as_u64().unwrap(), 6 - started);
    let msg = st["message"].as_str().unwrap();
    assert!(
        msg.starts_with(&format!(
            "budget reached: {} task(s) not started: ",
            6 - started
        )),
        "{msg}"
    );
    // Never more than the budget in flight at once: one lease's cap fits, two do not.
    let full = m.status(st["job_id"].as_str().unwrap());
    let mut spans: Vec<(u64, u64)> = attempts(&full)
        .iter()
        .map(|(_, a)| {
            (
                a["started_at"].as_u64().unwrap(),
                a["ended_at"].as_u64().unwrap(),
            )
        })
        .collect();
    spans.sort();
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "{spans:?}");
}

#[test]
fn a_bad_spec_is_refused_before_anything_is_rented() {
    let Some(image) = image_or_skip("jobs_bad_spec") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = JobMarket::start(dir.path(), &image.tag);
    let good = format!(
        "name: ok\nimage: {}\ninputs:\n  /workspace/data: data\nrun: echo hi\ntasks: 2\ntimeout: 1m\n",
        image.tag
    );
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let cases = [
        (
            good.replace("tasks: 2", "tasks: 2\ncolour: blue"),
            "line 7: colour: unknown field `colour`",
        ),
        (
            good.replace("tasks: 2", "tasks: -1"),
            "line 6: tasks: -1 is not a number of tasks",
        ),
        (
            good.replace("data: data", "data: no-such-dir"),
            "line 4: inputs./workspace/data: the local path",
        ),
    ];
    for (body, says) in cases {
        let spec = write_spec(dir.path(), "bad", &body);
        let o = m.job(&["run", spec.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
        let err = text(&o.stderr);
        assert!(err.contains(says), "{says:?} in {err}");
    }
    // Nothing was rented, and no job was stored.
    assert_eq!(
        json(&m.renter_home(), &["leases", "--all"])
            .as_array()
            .unwrap()
            .len(),
        0
    );
    assert_eq!(
        json(&m.renter_home(), &["job", "list"])
            .as_array()
            .unwrap()
            .len(),
        0
    );
    // The good one runs.
    let spec = write_spec(dir.path(), "good", &good);
    let o = m.job(&[
        "run",
        spec.to_str().unwrap(),
        "--out",
        dir.path().join("o").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

#[test]
fn a_renter_killed_mid_job_resumes_it_with_no_task_run_twice_at_once_and_ledgers_agreeing() {
    let Some(image) = image_or_skip("jobs_renter_restart") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut m = JobMarket::start(dir.path(), &image.tag);
    let spec = write_spec(
        dir.path(),
        "restart",
        &format!(
            r#"name: restart
image: {image}
run: |
  echo "task $TASK_INDEX"
  sleep 5
  mkdir -p out && echo "done $TASK_INDEX" > out/done.txt
tasks: 6
outputs: [/workspace/out]
concurrency: 3
timeout: 2m
"#,
            image = image.tag
        ),
    );
    let out = dir.path().join("OUT");
    let job = m.submit(&spec, &out);
    wait_for(Duration::from_secs(60), "attempts running", || {
        attempts(&m.status(&job))
            .iter()
            .filter(|(_, a)| a["phase"] == "running")
            .count()
            >= 2
    });
    m.kill_renter();
    std::thread::sleep(Duration::from_secs(2));
    m.start_renter();
    let st = m.wait_over(&job, Duration::from_secs(180));
    assert_eq!(st["state"], "completed", "{st:#}");
    // The restarted node picked the attempts in flight up (it did not rent them again).
    let log = std::fs::read_to_string(dir.path().join("renter-2.log")).unwrap();
    assert!(log.contains("resuming attempt"), "{log}");
    for t in 0..6 {
        let done = std::fs::read_to_string(out.join(format!("{t}/out/done.txt"))).unwrap();
        assert_eq!(done.trim(), format!("done {t}"));
    }
    // The providers' own records: each lease's task (its first output line) and when it ran.
    // No two leases of one task overlap.
    let mut runs: Vec<(u64, u64, u64)> = Vec::new();
    for p in m.providers.iter().filter(|p| p.daemon.is_some()) {
        for l in json(&p.home, &["leases", "--all"]).as_array().unwrap() {
            let id = l["lease_id"].as_str().unwrap();
            let log = cli(&p.home, &["logs", id]);
            let first = text(&log.stdout).lines().next().unwrap_or("").to_string();
            let task: u64 = first
                .strip_prefix("task ")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("lease {id}'s output: {first:?}"));
            let started = l["started_at"].as_u64().unwrap();
            let closed = l["closed_at"].as_u64().unwrap_or(u64::MAX);
            runs.push((task, started, closed));
        }
    }
    runs.sort();
    for w in runs.windows(2) {
        if w[0].0 == w[1].0 {
            assert!(
                w[0].2 <= w[1].1,
                "task {} ran twice at once: {runs:?}",
                w[0].0
            );
        }
    }
    let tasks: std::collections::BTreeSet<u64> = runs.iter().map(|r| r.0).collect();
    assert_eq!(tasks.len(), 6, "{runs:?}");
    // Both sides' ledgers agree, lease by lease.
    m.assert_ledgers_agree();
}

/// `job cancel` stops every lease of the job (a lease per task, and shared leases) and each
/// settles as the renter's stop.
#[test]
fn a_cancelled_job_stops_and_settles_every_lease() {
    let Some(image) = image_or_skip("jobs_cancel") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = JobMarket::start(dir.path(), &image.tag);
    // A lease per task, then leases that would run three tasks each.
    for per_lease in [1, 3] {
        let spec = write_spec(
            dir.path(),
            &format!("long-{per_lease}"),
            &format!(
                "name: long\nimage: {}\nrun: echo started; sleep 600\ntasks: 5\nconcurrency: 2\ntasks_per_lease: {per_lease}\ntimeout: 15m\n",
                image.tag
            ),
        );
        let job = m.submit(&spec, &dir.path().join(format!("OUT-{per_lease}")));
        wait_for(Duration::from_secs(60), "two attempts running", || {
            attempts(&m.status(&job))
                .iter()
                .filter(|(_, a)| a["phase"] == "running")
                .count()
                == 2
        });
        let o = m.job(&["cancel", &job]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let st = m.wait_over(&job, Duration::from_secs(120));
        assert_eq!(st["state"], "cancelled", "{st:#}");
        assert_eq!(st["cancelled"], 5, "{st:#}");
        for (_, a) in attempts(&st) {
            assert_eq!(a["verdict"], "cancelled", "{st:#}");
            let l = m.renter_lease(a["lease_id"].as_str().unwrap());
            assert_eq!(l["state"], "settled", "{l:#}");
            assert_eq!(l["close_reason"], "renter_stop");
        }
        // Cancelling again says it is over.
        let o = m.job(&["cancel", &job]);
        assert_eq!(o.status.code(), Some(1));
        assert!(
            text(&o.stderr).contains("is over already"),
            "{}",
            text(&o.stderr)
        );
    }
}

/// `tasks_per_lease: 3`: six tasks over two leases at a time, each lease running its tasks one
/// after another in one workspace (its setup and inputs once), each task starting without the
/// last one's outputs and checkpoint. The renter is killed and restarted mid-job: the job
/// completes, no task ran twice (the providers' own logs), no lease ran two tasks at once, and
/// both sides' ledgers agree lease by lease.
#[test]
fn a_lease_runs_several_tasks_one_after_another_and_a_renter_restart_loses_none() {
    let Some(image) = image_or_skip("jobs_shared_leases") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut m = JobMarket::start(dir.path(), &image.tag);
    std::fs::write(dir.path().join("data.txt"), "hello\n").unwrap();
    let args: Vec<String> = (0..6).map(|i| format!("it's line {i}")).collect();
    std::fs::write(dir.path().join("tasks.txt"), args.join("\n")).unwrap();
    let spec = write_spec(
        dir.path(),
        "shared",
        &format!(
            r#"name: shared
image: {image}
inputs:
  /workspace/in/data.txt: data.txt
setup: echo "setup" >> /workspace/setups.txt
run: |
  [ ! -e busy ] || {{ echo "another task is running here"; exit 7; }}
  [ ! -e out ] && [ ! -e ckpt ] || {{ echo "the last task's files are still here"; exit 8; }}
  touch busy
  echo "begin $TASK_INDEX $(date +%s)"
  n=$(cat runs 2>/dev/null || echo 0); n=$((n + 1)); echo $n > runs
  mkdir -p out ckpt && echo 1 > ckpt/step
  sleep 3
  echo "task $TASK_INDEX run $n args [$TASK_ARGS] input $(cat in/data.txt) setups $(grep -c . setups.txt)" > out/result.txt
  rm busy
  echo "end $TASK_INDEX $(date +%s)"
tasks: tasks.txt
outputs: [/workspace/out]
checkpoint:
  path: /workspace/ckpt
  every: 2s
tasks_per_lease: 3
concurrency: 2
timeout: 1m
"#,
            image = image.tag
        ),
    );
    let out = dir.path().join("OUT");
    let job = m.submit(&spec, &out);
    wait_for(
        Duration::from_secs(120),
        "a task handed to a lease that ran one",
        || {
            let st = m.status(&job);
            st["succeeded"].as_u64().unwrap_or(0) >= 2
                && attempts(&st).iter().any(|(_, a)| a["phase"] == "running")
        },
    );
    m.kill_renter();
    std::thread::sleep(Duration::from_secs(2));
    m.start_renter();
    let st = m.wait_over(&job, Duration::from_secs(240));
    assert_eq!(st["state"], "completed", "{st:#}");
    assert_eq!(st["succeeded"], 6, "{st:#}");
    let log = std::fs::read_to_string(dir.path().join("renter-2.log")).unwrap();
    assert!(log.contains("resuming attempt"), "{log}");
    // Each task's output, home: its own arguments, the lease's input and one setup per lease.
    let mut runs: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
    let tries = attempts(&st);
    for (t, arg) in args.iter().enumerate() {
        let r = std::fs::read_to_string(out.join(format!("{t}/out/result.txt")))
            .unwrap_or_else(|e| panic!("task {t}'s output: {e}"));
        let rest = r
            .strip_prefix(&format!("task {t} run "))
            .unwrap_or_else(|| panic!("{r:?}"));
        let (n, rest) = rest.split_once(' ').unwrap();
        assert_eq!(
            rest.trim_end(),
            format!("args [{arg}] input hello setups 1"),
            "task {t}"
        );
        let won: Vec<&Value> = tries
            .iter()
            .filter(|(task, a)| *task == t as u64 && a["verdict"] == "succeeded")
            .map(|(_, a)| a)
            .collect();
        assert_eq!(won.len(), 1, "{st:#}");
        runs.entry(won[0]["lease_id"].as_str().unwrap().to_string())
            .or_default()
            .push(n.parse().unwrap());
    }
    // Fewer leases than tasks; on each, its tasks ran as its 1st, 2nd, 3rd... in one workspace.
    assert!(runs.len() <= 3, "{runs:?}");
    assert!(runs.values().any(|r| r.len() >= 2), "{runs:?}");
    for (lease, r) in &runs {
        let mut r = r.clone();
        r.sort();
        assert_eq!(
            r,
            (1..=r.len() as u32).collect::<Vec<_>>(),
            "{lease}: {runs:?}"
        );
    }
    // The providers' own records: every task began once, and a lease's tasks never overlapped.
    let mut began = std::collections::BTreeMap::new();
    for p in &m.providers {
        for l in json(&p.home, &["leases", "--all"]).as_array().unwrap() {
            let id = l["lease_id"].as_str().unwrap();
            let out = text(&cli(&p.home, &["logs", id]).stdout);
            let mut open: Option<u64> = None;
            for line in out.lines() {
                let w: Vec<&str> = line.split_whitespace().collect();
                match w.as_slice() {
                    ["begin", t, _] => {
                        assert!(open.is_none(), "two tasks at once on {id}:\n{out}");
                        open = Some(t.parse().unwrap());
                        *began.entry(t.parse::<u64>().unwrap()).or_insert(0) += 1;
                    }
                    ["end", t, _] => {
                        assert_eq!(open, Some(t.parse().unwrap()), "{id}:\n{out}");
                        open = None;
                    }
                    _ => {}
                }
            }
        }
    }
    assert_eq!(began.len(), 6, "{began:?}");
    assert!(
        began.values().all(|n| *n == 1),
        "a task ran twice: {began:?}"
    );
    let renter = m.assert_ledgers_agree();
    let leases = renter["leases"].as_array().unwrap();
    // What the job says it spent is what its leases settled at.
    let settled: u64 = leases.iter().map(|s| s["total"].as_u64().unwrap()).sum();
    assert_eq!(st["spent"].as_u64().unwrap(), settled, "{st:#}\n{renter:#}");
}

/// On a shared lease a user error fails its task alone (the lease is handed the next one), and
/// a task past its timeout has its lease stopped by the renter and is retried elsewhere.
#[test]
fn on_a_shared_lease_an_exit_fails_one_task_and_a_timeout_moves_it_elsewhere() {
    let Some(image) = image_or_skip("jobs_shared_faults") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = JobMarket::start(dir.path(), &image.tag);
    let spec = write_spec(
        dir.path(),
        "faults",
        &format!(
            r#"name: faults
image: {image}
run: |
  if [ "$TASK_INDEX" = 1 ]; then echo "bad input" >&2; exit 1; fi
  if [ "$TASK_INDEX" = 2 ] && [ "$GRIDLEASE_ATTEMPT" = 1 ]; then echo "hangs"; sleep 600; fi
  echo "task $TASK_INDEX fine"
tasks: 4
tasks_per_lease: 4
concurrency: 1
timeout: 20s
"#,
            image = image.tag
        ),
    );
    let o = m.job(&[
        "--json",
        "run",
        spec.to_str().unwrap(),
        "--out",
        dir.path().join("OUT").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    let st: Value = serde_json::from_slice(&o.stdout).unwrap();
    let st = m.status(st["job_id"].as_str().unwrap());
    assert_eq!(st["state"], "failed", "{st:#}");
    let task = |t: usize| st["tasks"][t].clone();
    let lease = |t: usize, a: usize| {
        task(t)["attempts"][a]["lease_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // Tasks 0, 1 and 2 went to one lease in turn; the exit failed task 1 alone.
    assert_eq!(task(0)["state"], "succeeded", "{st:#}");
    assert_eq!(task(1)["state"], "failed", "{st:#}");
    assert_eq!(task(1)["exit_code"], 1, "{st:#}");
    assert_eq!(task(1)["attempts"].as_array().unwrap().len(), 1, "{st:#}");
    assert!(
        task(1)["message"]
            .as_str()
            .unwrap()
            .ends_with("exited with code 1; last output:\nbad input"),
        "{st:#}"
    );
    assert_eq!(lease(1, 0), lease(0, 0), "{st:#}");
    assert_eq!(lease(2, 0), lease(0, 0), "{st:#}");
    // Task 2 hung past its timeout: a provider fault, its lease stopped, retried on another.
    let t2 = task(2)["attempts"].as_array().unwrap().clone();
    assert_eq!(t2.len(), 2, "{st:#}");
    assert_eq!(t2[0]["verdict"], "provider_fault", "{st:#}");
    assert!(
        t2[0]["reason"]
            .as_str()
            .unwrap()
            .contains("ran past its timeout of 20 s"),
        "{st:#}"
    );
    assert_eq!(t2[1]["verdict"], "succeeded", "{st:#}");
    assert_ne!(t2[1]["provider"], t2[0]["provider"], "{st:#}");
    assert_eq!(st["excluded"][0]["provider"], t2[0]["provider"], "{st:#}");
    assert_eq!(task(3)["state"], "succeeded", "{st:#}");
    // The first lease was stopped and settled; the job's spend is its leases' settlements.
    let first = m.renter_lease(&lease(0, 0));
    assert_eq!(first["state"], "settled", "{first:#}");
    assert_eq!(first["close_reason"], "renter_stop", "{first:#}");
    let ledger = json(&m.renter_home(), &["ledger"]);
    let settled: u64 = ledger["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["total"].as_u64().unwrap())
        .sum();
    assert_eq!(st["spent"].as_u64().unwrap(), settled, "{st:#}\n{ledger:#}");
}

#[test]
fn a_job_waits_for_offers_its_own_tasks_hold_and_says_why_it_waits_when_none_fits() {
    let Some(image) = image_or_skip("jobs_offer_wait") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = JobMarket::start(dir.path(), &image.tag);
    // Only the 0.40 provider fits, with one GPU: the second task waits for the first, which
    // runs longer than `offer_wait`, and then runs on the same provider. (The wait's clock
    // runs only while nothing of the job is in flight. Here the provider's new offer arrives
    // before the first lease has settled, so the old clock, which also ran while the job's own
    // task held the offer, passed this part too: it guards the behaviour, it does not tell
    // the two clocks apart.)
    let spec = write_spec(
        dir.path(),
        "held",
        &format!(
            r#"name: held
image: {image}
resources:
  max_price: 0.40
run: sleep 9; echo "task $TASK_INDEX done"
tasks: 2
concurrency: 2
timeout: 1m
offer_wait: 5s
"#,
            image = image.tag
        ),
    );
    let job = m.submit(&spec, &dir.path().join("OUT"));
    let st = m.wait_over(&job, Duration::from_secs(150));
    assert_eq!(st["state"], "completed", "{st:#}");
    let providers: Vec<Value> = attempts(&st)
        .iter()
        .map(|(_, a)| a["provider"].clone())
        .collect();
    assert_eq!(providers.len(), 2, "{st:#}");
    assert!(providers.iter().all(|p| p == &providers[0]), "{st:#}");

    // No offer fits at all: while it waits the job says why, then it ends saying so.
    let spec = write_spec(
        dir.path(),
        "none",
        &format!(
            r#"name: none
image: {image}
resources:
  max_price: 0.10
run: echo never
tasks: 1
timeout: 1m
offer_wait: 4s
"#,
            image = image.tag
        ),
    );
    let job = m.submit(&spec, &dir.path().join("OUT2"));
    let mut said = Value::Null;
    wait_for(
        Duration::from_secs(20),
        "the job to say why it waits",
        || {
            said = m.status(&job);
            said["state"] == "running"
                && said["message"].as_str().is_some_and(|s| {
                    s.starts_with("waiting for an eligible offer (no offer matches the search")
                })
        },
    );
    assert!(
        said["message"].as_str().unwrap().contains("within 4 s"),
        "{said:#}"
    );
    let st = m.wait_over(&job, Duration::from_secs(30));
    assert_eq!(st["state"], "failed", "{st:#}");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .starts_with("no eligible offer for 4 s (no offer matches the search"),
        "{st:#}"
    );
}
