//! A lease that runs several of a job's tasks one after another (`tasks_per_lease` above 1).
//!
//! Its container runs [`WORKER`]: the job's `setup` once, then each task handed to it, one at
//! a time. A task is handed over as files in `/workspace/.gridlease/run/<task>-<attempt>/`:
//! its variables (`env`), its checkpoint (`checkpoint/`), and last `go`. The worker removes
//! the last task's outputs and checkpoint, puts the new checkpoint in place, runs the task,
//! writes its exit code to `exit` and says so in the lease's log. The provider needs nothing
//! new: uploads, downloads and the log carry it all. The task runs on in the container
//! whatever this node does, so a restarted node picks its attempt up by those files, and a
//! lease never runs two tasks at once.

use std::path::Path;
use std::time::{Duration, Instant};

use gridlease_contracts::jobs::AttemptEnd;
use gridlease_protocol::CloseReason;

use super::attempt::{
    self, Done, LeaseAfter, Shared, Start, checkpoint_dir, end, end_of_lease, log_path,
    pull_checkpoint, pull_log, pull_outputs, quiet, settled, spent_of, task_dir,
};
use super::spec::{Job, WORKER_DIR};
use crate::api::client::ClientError;
use crate::api::types::OfferRow;
use crate::store::jobs::StoredAttempt;

/// How often a running task's lease and output are read.
const POLL: Duration = Duration::from_millis(500);
/// How often a running task's exit file is looked for when its log has not said it ended
/// (the log is the fast path; the file is what counts).
const EXIT_POLL: Duration = Duration::from_secs(3);
/// Longest a begun lease is waited for to run before its first task is handed over.
const RUNNING_WAIT: Duration = Duration::from_secs(120);
/// Most reads of the log, after the exit file, waiting for the task's last line.
const LAST_LINES_TRIES: u32 = 5;

/// The container's command of a lease that runs several tasks: `/bin/sh -c WORKER
/// gridlease-worker PATHS..`, with the paths each task starts without (its outputs and
/// checkpoint) as arguments, and `GRIDLEASE_SETUP`, `GRIDLEASE_RUN` and
/// `GRIDLEASE_CHECKPOINT` in the environment.
pub(super) const WORKER: &str = r#"cd /workspace || exit 1
/bin/sh -ec "$GRIDLEASE_SETUP" || exit $?
mkdir -p .gridlease/run || exit 1
while :; do
  for d in .gridlease/run/*; do
    [ -f "$d/go" ] && [ ! -f "$d/exit" ] || continue
    for p in "$@"; do rm -rf "./$p"; done
    if [ -d "$d/checkpoint" ]; then
      { mkdir -p "./$GRIDLEASE_CHECKPOINT" && rmdir "./$GRIDLEASE_CHECKPOINT" &&
        mv "$d/checkpoint" "./$GRIDLEASE_CHECKPOINT"; } ||
        echo "[gridlease: the checkpoint could not be put in place]"
    fi
    ( . "./$d/env" && exec /bin/sh -c "$GRIDLEASE_RUN" )
    c=$?
    echo "$c" > "$d/exit.part" && mv "$d/exit.part" "$d/exit"
    echo "[gridlease: task attempt ${d##*/} exited with code $c]"
  done
  sleep 0.2 2>/dev/null || sleep 1
done
"#;

/// Runs (or, after a restart, resumes) attempt `a` of a job whose leases run several tasks:
/// on a new lease from `offer` (with its duration), or handed to the lease its row names, whose
/// first attempt is `owner`. `None` when the node is shutting down.
pub(super) async fn run(
    sh: std::sync::Arc<Shared>,
    a: StoredAttempt,
    offer: Option<(OfferRow, u32)>,
    owner: (u32, u32),
) -> Option<Done> {
    let owns = owner == (a.task, a.attempt);
    let hold = if owns {
        attempt::hold(&sh, &a.provider)
    } else {
        None
    };
    let (mut a, lease) = match attempt::open(&sh, a, offer, command(&sh.job)).await {
        Ok(x) => x,
        Err(done) => return done,
    };
    if a.phase == "starting" {
        let started = if owns {
            attempt::start(&sh, &lease, a.task).await
        } else {
            Ok(())
        };
        let started = match started {
            Ok(()) => match hand_over(&sh, &a, &lease).await {
                Ok(()) => Ok(()),
                Err(_) if sh.ctx.shutdown.is_cancelled() => Err(Start::Shutdown),
                Err(e) => Err(Start::Failed(e)),
            },
            other => other,
        };
        match started {
            Ok(()) => {
                a.phase = "running".into();
                a.run_at = Some(super::now_ms());
                sh.save(&a).await;
            }
            Err(Start::Shutdown) => return None,
            Err(Start::Failed(why)) => {
                return Some(attempt::start_failed(&sh, a, &lease, why).await);
            }
        }
    }
    drop(hold);
    follow(&sh, a, &lease, owner).await
}

/// The container command of a lease of `job` that runs several tasks.
fn command(job: &Job) -> Vec<String> {
    let mut c = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        WORKER.into(),
        "gridlease-worker".into(),
    ];
    c.extend(job.outputs.iter().cloned());
    c.extend(job.checkpoint.iter().cloned());
    c
}

/// An attempt's directory in the lease's workspace, relative to `/workspace`.
fn run_dir(a: &StoredAttempt) -> String {
    format!("{WORKER_DIR}/run/{}-{}", a.task, a.attempt)
}

/// `'text'` for `/bin/sh`, whatever the text holds.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The variables of task `a` on a shared lease, as a file the worker sources.
fn env_file(job: &Job, a: &StoredAttempt) -> String {
    let args = job
        .task_args
        .get(a.task as usize)
        .map_or("", String::as_str);
    format!(
        "TASK_INDEX={}\nTASK_ARGS={}\nGRIDLEASE_ATTEMPT={}\nexport TASK_INDEX TASK_ARGS GRIDLEASE_ATTEMPT\n",
        sh_quote(&a.task.to_string()),
        sh_quote(args),
        sh_quote(&a.attempt.to_string()),
    )
}

/// Hands task `a` to the lease: its variables and checkpoint, then `go`. Done again after a
/// restart it changes nothing (the worker runs a task once, and skips one with an `exit`).
async fn hand_over(sh: &Shared, a: &StoredAttempt, lease: &str) -> Result<(), String> {
    let api = &sh.ctx.api;
    // A lease just begun is `starting` a moment: files go in once it runs.
    let until = Instant::now() + RUNNING_WAIT;
    loop {
        match api.lease(lease).await {
            Ok(v) if v.is_terminal() => {
                return Err(format!(
                    "the lease ended before its task: {}",
                    super::attempt::describe(&v)
                ));
            }
            Ok(v)
                if v.state == gridlease_contracts::LeaseState::Running
                    && v.upload_until.is_none() =>
            {
                break;
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(lease, error = %e, "lease not readable yet"),
        }
        if Instant::now() >= until {
            return Err(format!(
                "the lease did not run within {} s",
                RUNNING_WAIT.as_secs()
            ));
        }
        if sh.ctx.shutdown.is_cancelled() || sh.ctx.cancel.is_cancelled() {
            return Err("the job is stopping".into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let stage = task_dir(&sh.ctx.home, &sh.job_id, a.task).join(format!("handover-{}", a.attempt));
    let files = stage.join("files");
    let go = stage.join("go");
    let env = env_file(&sh.job, a);
    let prepared = {
        let (files, go) = (files.clone(), go.clone());
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            std::fs::create_dir_all(&files)?;
            std::fs::write(files.join("env"), env)?;
            std::fs::write(go, b"")
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|r| r)
    };
    if let Err(e) = prepared {
        return Err(format!("the task's files could not be written here: {e}"));
    }
    let dir = format!("/workspace/{}", run_dir(a));
    crate::commands::cp::upload(api, &quiet(), &files, lease, &dir)
        .await
        .map_err(|e| format!("the task could not be handed to the lease: {e:#}"))?;
    if sh.job.checkpoint.is_some() {
        let local = checkpoint_dir(&sh.ctx.home, &sh.job_id, a.task);
        let has_any = std::fs::read_dir(&local).is_ok_and(|mut d| d.next().is_some());
        if has_any {
            crate::commands::cp::upload(api, &quiet(), &local, lease, &format!("{dir}/checkpoint"))
                .await
                .map_err(|e| format!("checkpoint not copied in: {e:#}"))?;
            tracing::info!(job = %sh.job_id, task = a.task, lease, "checkpoint handed to the lease");
        }
    }
    crate::commands::cp::upload(api, &quiet(), &go, lease, &format!("{dir}/go"))
        .await
        .map_err(|e| format!("the task could not be started on the lease: {e:#}"))?;
    let _ = tokio::fs::remove_dir_all(&stage).await;
    Ok(())
}

/// The task's exit code, once the worker wrote it.
async fn exit_code(sh: &Shared, a: &StoredAttempt, lease: &str) -> Option<i32> {
    let local =
        task_dir(&sh.ctx.home, &sh.job_id, a.task).join(format!("attempt-{}.exit", a.attempt));
    let _ = tokio::fs::remove_file(&local).await;
    let remote = format!("/workspace/{}/exit", run_dir(a));
    crate::commands::cp::download(&sh.ctx.api, &quiet(), lease, &remote, &local, Some(64))
        .await
        .ok()?;
    let code = tokio::fs::read_to_string(&local).await.ok()?;
    let _ = tokio::fs::remove_file(&local).await;
    code.trim().parse().ok()
}

/// Whether the last bytes of `log` hold `needle`.
fn log_says(log: &Path, needle: &str) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(log) else {
        return false;
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let from = len.saturating_sub(4096);
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(from)).is_err() || f.read_to_end(&mut buf).is_err() {
        return false;
    }
    String::from_utf8_lossy(&buf).contains(needle)
}

/// Follows task `a`, handed to `lease` (whose first attempt `owner` carries its cost), until
/// it exits, times out, or the lease ends. `None` on shutdown.
async fn follow(sh: &Shared, a: StoredAttempt, lease: &str, owner: (u32, u32)) -> Option<Done> {
    let api = &sh.ctx.api;
    let log = log_path(&sh.ctx.home, &sh.job_id, a.task, a.attempt);
    if let Some(p) = log.parent() {
        let _ = tokio::fs::create_dir_all(p).await;
    }
    let mut offset = a.log_from + tokio::fs::metadata(&log).await.map_or(0, |m| m.len());
    let sentinel = format!(
        "[gridlease: task attempt {}-{} exited with code",
        a.task, a.attempt
    );
    let timeout_ms = u64::from(sh.job.spec.timeout.0) * 1000;
    let run_at = a.run_at.unwrap_or(a.started_at);
    let every = sh.checkpoint_every();
    let mut last_ckpt = Instant::now();
    let mut last_exit_poll: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = sh.ctx.cancel.cancelled() => {}
        }
        if sh.ctx.shutdown.is_cancelled() {
            return None;
        }
        if sh.ctx.cancel.is_cancelled() {
            let spent = release(sh, lease).await;
            let _ = pull_log(sh, lease, &log, offset).await;
            let why = "the job was cancelled".to_string();
            return Some(over(sh, a, AttemptEnd::Cancelled, why, spent).await);
        }
        let before = offset;
        offset = pull_log(sh, lease, &log, offset).await;
        let view = match api.lease(lease).await {
            Ok(v) => v,
            Err(ClientError::NoNode { .. }) => return None,
            Err(ClientError::Api { status: 404, .. }) => {
                let why = "this node no longer knows the lease".to_string();
                let end_of = AttemptEnd::Closed {
                    reason: CloseReason::ProviderUnreachable,
                    exit_code: None,
                };
                return Some(over(sh, a, end_of, why, None).await);
            }
            Err(e) => {
                tracing::debug!(lease, error = %e, "lease not readable");
                continue;
            }
        };
        sh.ctx
            .live
            .set(owner.0, owner.1, view.cost_so_far.max(view.paid));
        if view.is_terminal() {
            let _ = pull_log(sh, lease, &log, offset).await;
            let why = super::attempt::describe(&view);
            let end_of = end_of_lease(sh, &view);
            return Some(over(sh, a, end_of, why, Some(spent_of(&view))).await);
        }
        let said = offset > before && log_says(&log, &sentinel);
        if said || last_exit_poll.is_none_or(|t| t.elapsed() >= EXIT_POLL) {
            last_exit_poll = Some(Instant::now());
            if let Some(code) = exit_code(sh, &a, lease).await {
                // The task's last lines, up to the worker's line after them.
                for _ in 0..LAST_LINES_TRIES {
                    offset = pull_log(sh, lease, &log, offset).await;
                    if log_says(&log, &sentinel) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                return Some(exited(sh, a, lease, code, view.time_left_s, offset).await);
            }
        }
        if super::now_ms().saturating_sub(run_at) > timeout_ms {
            tracing::warn!(job = %sh.job_id, task = a.task, lease, "task ran past its timeout; stopping its lease");
            let spent = release(sh, lease).await;
            let why = format!(
                "the task ran past its timeout of {} s",
                sh.job.spec.timeout.0
            );
            let end_of = AttemptEnd::Closed {
                reason: CloseReason::Expired,
                exit_code: None,
            };
            return Some(over(sh, a, end_of, why, spent).await);
        }
        if let (Some(every), Some(rel)) = (every, &sh.job.checkpoint)
            && last_ckpt.elapsed() >= every
        {
            last_ckpt = Instant::now();
            if let Err(e) = pull_checkpoint(sh, a.task, lease, rel).await {
                tracing::warn!(job = %sh.job_id, task = a.task, error = %format!("{e:#}"), "checkpoint not copied home this time");
            }
        }
    }
}

/// The end of a task whose lease is over (or cannot be read): what the lease cost goes to its
/// first attempt.
async fn over(
    sh: &Shared,
    a: StoredAttempt,
    end_of: AttemptEnd,
    why: String,
    spent: Option<u64>,
) -> Done {
    let mut done = end(sh, a, end_of, why, None, None).await;
    done.lease = Some(LeaseAfter::Over { spent });
    done
}

/// The end of a task that exited on a lease that runs on: its checkpoint and (if it
/// succeeded) its outputs home before the next task clears them.
async fn exited(
    sh: &Shared,
    a: StoredAttempt,
    lease: &str,
    code: i32,
    time_left_s: Option<u64>,
    log_end: u64,
) -> Done {
    if let Some(rel) = &sh.job.checkpoint
        && let Err(e) = pull_checkpoint(sh, a.task, lease, rel).await
    {
        tracing::warn!(job = %sh.job_id, task = a.task, error = %format!("{e:#}"), "final checkpoint not copied home");
    }
    let mut end_of = AttemptEnd::Closed {
        reason: CloseReason::ContainerExited,
        exit_code: Some(code),
    };
    let mut why = format!("task_exited, exit code {code}");
    let mut after = LeaseAfter::Reusable {
        time_left_s: time_left_s.unwrap_or(0),
        log_end,
    };
    if code == 0
        && let Err(e) = pull_outputs(sh, a.task, lease).await
    {
        why = format!("its outputs could not be copied home: {e:#}");
        end_of = AttemptEnd::Closed {
            reason: CloseReason::ProviderUnreachable,
            exit_code: Some(code),
        };
        after = LeaseAfter::Stop;
    }
    let mut done = end(sh, a, end_of, why, None, None).await;
    done.lease = Some(after);
    done.tail = without_worker_lines(&done.tail);
    done
}

/// A task's output without the worker's own lines (its end, a checkpoint not put in place).
fn without_worker_lines(tail: &str) -> String {
    tail.lines()
        .filter(|l| {
            !l.starts_with("[gridlease: task attempt ") || !l.contains(" exited with code ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Stops a lease between tasks and waits (bounded) for it to settle: what it cost, when known.
pub(super) async fn release(sh: &Shared, lease: &str) -> Option<u64> {
    if let Err(e) = sh.ctx.api.stop(lease).await {
        tracing::debug!(lease, error = %e, "stopping a lease between tasks");
    }
    settled(sh, lease).await.as_ref().map(spent_of)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workers_end_line_is_not_part_of_a_tasks_output() {
        let tail = "bad input\n[gridlease: task attempt 1-1 exited with code 1]";
        assert_eq!(without_worker_lines(tail), "bad input");
        assert_eq!(without_worker_lines("a\nb"), "a\nb");
    }

    #[test]
    fn quoted_text_comes_back_the_same_from_the_shell() {
        let odd = "it's a \"test\" $HOME `id` \\ ; done";
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("X={}; printf %s \"$X\"", sh_quote(odd)))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), odd);
    }
}
