//! `gridlease job run|status|logs|cancel|list`: batches of tasks over many providers
//! (issue 46, `docs/jobs.md`). The node runs the job (`crate::jobs`); these commands submit
//! its spec, follow it with a progress line, and show it.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::api::client::ApiClient;
use crate::jobs::view::TaskView;
use crate::jobs::{JobSubmit, JobView};
use crate::output::{Printer, money, short};

/// Arguments of `gridlease job`.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: JobCommand,
}

/// `gridlease job` subcommands.
#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Run a job spec (YAML, `docs/jobs.md`): checked whole before anything is rented, then
    /// followed with a progress line until it is over.
    ///
    /// Exits 0 when every task succeeded, 1 when some failed, 8 when the budget stopped the
    /// launches (the tasks not started are listed). Ctrl-C cancels the job (its leases are
    /// stopped and settle); a second Ctrl-C leaves it running (exit 130 either way).
    Run(RunArgs),
    /// A job's tasks and attempts (the newest job without JOB).
    Status(StatusArgs),
    /// A task's output, as this node kept it (`-f` to follow).
    Logs(LogsArgs),
    /// Cancel a running job: every lease of it is stopped and settles.
    Cancel(CancelArgs),
    /// This node's jobs, newest first.
    List,
}

/// Arguments of `gridlease job run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The spec file.
    #[arg(value_name = "SPEC")]
    pub spec: std::path::PathBuf,
    /// Print the job id and return; follow later with `gridlease job status JOB`.
    #[arg(long)]
    pub detach: bool,
    /// Where outputs land, as OUT/<task>/<path> (default: ./<job name> in the current
    /// directory).
    #[arg(long, value_name = "DIR")]
    pub out: Option<std::path::PathBuf>,
}

/// Arguments of `gridlease job status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Job id or its first digits (default: the newest job).
    #[arg(value_name = "JOB")]
    pub job: Option<String>,
}

/// Arguments of `gridlease job logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Job id or its first digits.
    #[arg(value_name = "JOB")]
    pub job: String,
    /// Task index (from 0; default 0).
    #[arg(value_name = "TASK", default_value_t = 0)]
    pub task: u32,
    /// Attempt (1-based; default: the task's last).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub attempt: Option<u32>,
    /// Follow the output until the attempt ends.
    #[arg(long, short)]
    pub follow: bool,
}

/// Arguments of `gridlease job cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// Job id or its first digits.
    #[arg(value_name = "JOB")]
    pub job: String,
}

/// Exit code of `job run` when the budget stopped the launches.
pub const EXIT_BUDGET: u8 = 8;

/// Runs `gridlease job ...`.
pub async fn run(api: &ApiClient, out: &Printer, args: &JobArgs) -> anyhow::Result<u8> {
    match &args.command {
        JobCommand::Run(a) => run_job(api, out, a).await,
        JobCommand::Status(a) => {
            let id = match &a.job {
                Some(j) => j.clone(),
                None => {
                    let jobs: Vec<JobView> = api.get("/v1/jobs").await?;
                    jobs.first()
                        .map(|j| j.job_id.clone())
                        .context("this node has no job yet: `gridlease job run SPEC` starts one")?
                }
            };
            let j: JobView = api.get(&format!("/v1/jobs/{id}")).await?;
            out.emit(&j, |p| print_job(p, &j));
            Ok(0)
        }
        JobCommand::Logs(a) => logs(api, out, a).await,
        JobCommand::Cancel(a) => {
            let j: JobView = api
                .post(
                    &format!("/v1/jobs/{}/cancel", a.job),
                    &serde_json::json!({}),
                )
                .await?;
            out.emit(&j, |p| {
                p.line(&format!(
                    "job {} cancelling: its leases are stopped and settle (`gridlease job status {}`)",
                    j.job_id,
                    short(&j.job_id)
                ))
            });
            Ok(0)
        }
        JobCommand::List => {
            let jobs: Vec<JobView> = api.get("/v1/jobs").await?;
            out.emit(&jobs, |p| {
                if jobs.is_empty() {
                    p.line("no jobs yet: `gridlease job run SPEC` starts one");
                    return;
                }
                let rows = jobs
                    .iter()
                    .map(|j| {
                        vec![
                            j.job_id.clone(),
                            j.name.clone(),
                            j.state.clone(),
                            format!("{}/{}", j.succeeded, j.tasks_total),
                            j.failed.to_string(),
                            money(j.spent),
                        ]
                    })
                    .collect();
                p.table(
                    &["job", "name", "state", "done", "failed", "spent"],
                    rows,
                    &[4, 1],
                    false,
                );
            });
            Ok(0)
        }
    }
}

async fn run_job(api: &ApiClient, out: &Printer, a: &RunArgs) -> anyhow::Result<u8> {
    let text = std::fs::read_to_string(&a.spec)
        .with_context(|| format!("cannot read the spec {}", a.spec.display()))?;
    let spec_path = std::path::absolute(&a.spec)?;
    let dir = spec_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| "/".into());
    let out_dir = match &a.out {
        Some(o) => std::path::absolute(o)?,
        None => {
            // The name only: the node checks the whole spec.
            let name = crate::jobs::spec::parse(&text)
                .map(|s| s.name)
                .map_err(|e| anyhow::anyhow!("{}: {e}", a.spec.display()))?;
            std::env::current_dir()?.join(name)
        }
    };
    let body = JobSubmit {
        spec: text,
        dir: dir.display().to_string(),
        out: out_dir.display().to_string(),
    };
    let j: JobView = api
        .post("/v1/jobs", &body)
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.spec.display()))?;
    if a.detach {
        out.emit(&j, |p| {
            p.line(&format!(
                "job {} started: {} task(s), outputs in {}; follow it with `gridlease job status {}`",
                j.job_id,
                j.tasks_total,
                j.out_dir,
                short(&j.job_id)
            ))
        });
        return Ok(0);
    }
    out.note(&format!(
        "job {} started: {} task(s), outputs in {}",
        j.job_id, j.tasks_total, j.out_dir
    ));
    follow(api, out, &j.job_id).await
}

/// Follows a job with a progress line until it is over; Ctrl-C cancels it, a second leaves.
async fn follow(api: &ApiClient, out: &Printer, id: &str) -> anyhow::Result<u8> {
    let bar = indicatif::ProgressBar::new(0);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}") {
        bar.set_style(style);
    }
    if out.quiet || out.json {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut interrupts = 0u8;
    let mut ctrl_c = Box::pin(tokio::signal::ctrl_c());
    loop {
        let j: JobView = api.get(&format!("/v1/jobs/{id}")).await?;
        bar.set_length(u64::from(j.tasks_total));
        bar.set_position(u64::from(j.succeeded + j.failed));
        bar.set_message(progress_text(&j));
        if j.state != "running" {
            bar.finish_and_clear();
            out.emit(&j, |p| print_job(p, &j));
            return Ok(if interrupts > 0 {
                130
            } else {
                match j.state.as_str() {
                    "completed" => 0,
                    "budget_reached" => EXIT_BUDGET,
                    _ => 1,
                }
            });
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = &mut ctrl_c => {
                interrupts += 1;
                ctrl_c = Box::pin(tokio::signal::ctrl_c());
                if interrupts == 1 {
                    bar.suspend(|| out.status("cancelling the job: its leases are stopped and settle (Ctrl-C again to leave it running)"));
                    let _: JobView = api
                        .post(&format!("/v1/jobs/{id}/cancel"), &serde_json::json!({}))
                        .await?;
                } else {
                    bar.finish_and_clear();
                    out.status(&format!("left job {id}; `gridlease job status {}` shows it", short(id)));
                    return Ok(130);
                }
            }
        }
    }
}

/// The progress line: tasks done, running, failed; cost; estimated time left.
fn progress_text(j: &JobView) -> String {
    let mut s = format!(
        "done · {} running · {} failed · spent {}",
        j.running,
        j.failed,
        money(j.spent)
    );
    if let Some(b) = j.budget {
        s.push_str(&format!(" of {}", money(b)));
    }
    if let Some(eta) = j.eta_s {
        s.push_str(&format!(
            " · ~{} left",
            humantime::format_duration(Duration::from_secs(eta))
        ));
    }
    s
}

fn print_job(p: &Printer, j: &JobView) {
    p.line(&format!(
        "job {} ({}): {}{}",
        j.job_id,
        j.name,
        j.state,
        j.message
            .as_ref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    ));
    p.line(&format!(
        "tasks: {} succeeded, {} running, {} pending, {} failed, {} not started, {} cancelled (of {}); {} attempt(s)",
        j.succeeded, j.running, j.pending, j.failed, j.not_started, j.cancelled, j.tasks_total, j.attempts
    ));
    p.line(&format!(
        "spent {}{}; outputs in {}",
        money(j.spent),
        j.budget
            .map(|b| format!(" of a budget of {}", money(b)))
            .unwrap_or_default(),
        j.out_dir
    ));
    for e in &j.excluded {
        p.line(&format!(
            "excluded provider {}: {}",
            short(&e.provider),
            e.reason
        ));
    }
    if j.tasks.is_empty() {
        return;
    }
    let rows = j.tasks.iter().map(task_row).collect();
    p.table(
        &[
            "task", "state", "attempts", "provider", "exit", "spent", "last end",
        ],
        rows,
        &[6, 3, 5],
        false,
    );
    for t in j.tasks.iter().filter(|t| t.state == "failed") {
        if let Some(m) = &t.message {
            p.line(&format!("task {} {m}", t.task));
        }
    }
}

fn task_row(t: &TaskView) -> Vec<String> {
    let last = t.attempts.last();
    vec![
        t.task.to_string(),
        t.state.clone(),
        t.attempts.len().to_string(),
        last.map(|a| short(&a.provider)).unwrap_or_default(),
        t.exit_code.map(|c| c.to_string()).unwrap_or_default(),
        money(t.attempts.iter().map(|a| a.spent).sum()),
        last.and_then(|a| a.reason.clone()).unwrap_or_default(),
    ]
}

async fn logs(api: &ApiClient, out: &Printer, a: &LogsArgs) -> anyhow::Result<u8> {
    let mut from = 0u64;
    loop {
        let mut path = format!("/v1/jobs/{}/tasks/{}/logs?from={from}", a.job, a.task);
        if let Some(n) = a.attempt {
            path.push_str(&format!("&attempt={n}"));
        }
        let (headers, body) = api.get_raw(&path).await?;
        out.bytes(&body);
        from = headers
            .get(crate::api::NEXT_OFFSET_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(from + body.len() as u64);
        if headers.contains_key(crate::api::EOF_HEADER) {
            return Ok(0);
        }
        if body.is_empty() {
            if !a.follow {
                return Ok(0);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
