//! The runner of one job: launches attempts on the cheapest eligible offers, up to
//! `concurrency` at once and never past the budget, and decides after each attempt what its
//! task does next (`contracts::jobs::next`). Every decision is stored before it is acted on,
//! so a restarted node resumes the job where it stood.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use gridlease_contracts::Money;
use gridlease_contracts::jobs::{Next, Verdict, exposure, may_launch, next};
use tokio::sync::mpsc;

use super::attempt::{self, Ctx, Done, Shared};
use super::spec::Job;
use super::view::spend;
use crate::api::types::OfferRow;
use crate::store::jobs::{StoredAttempt, StoredTask};

/// How long a job with nothing running waits for an eligible offer before its pending tasks
/// fail.
pub(super) const OFFER_WAIT: Duration = Duration::from_secs(300);
/// How often the runner looks again at the book and its tasks when nothing happened.
const TICK: Duration = Duration::from_secs(1);
/// Most offers one search reads.
const SEARCH_LIMIT: u32 = 200;

struct Runner {
    id: String,
    shared: Arc<Shared>,
    tasks: Vec<StoredTask>,
    attempts: Vec<StoredAttempt>,
    excluded: HashSet<String>,
    /// Task -> its attempt in flight.
    live: HashMap<u32, StoredAttempt>,
    done_tx: mpsc::Sender<Done>,
    budget_hit: bool,
    no_offer_since: Option<Instant>,
}

/// Runs job `id` until it is over or the node stops.
pub(super) async fn run(ctx: Ctx, id: &str) -> anyhow::Result<()> {
    let jid = id.to_string();
    let (row, tasks, attempts, excluded) = ctx
        .store
        .call(move |s| {
            Ok((
                s.job(&jid)?,
                s.job_tasks(&jid)?,
                s.job_attempts(&jid)?,
                s.excluded_providers(&jid)?,
            ))
        })
        .await?;
    let row = row.context("the job is not in the store")?;
    let job: Job = serde_json::from_str(&row.spec).context("the stored job does not parse")?;
    let concurrency = job.spec.concurrency.max(1) as usize;
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        job_id: id.to_string(),
        job: Arc::new(job),
        out: PathBuf::from(&row.out_dir),
        holding: Default::default(),
    });
    // At most `concurrency` attempts are live, each sends one `Done`.
    let (done_tx, mut done_rx) = mpsc::channel(concurrency + 1);
    let mut r = Runner {
        id: id.to_string(),
        shared,
        tasks,
        attempts,
        excluded: excluded.into_iter().map(|(p, _)| p).collect(),
        live: HashMap::new(),
        done_tx,
        budget_hit: false,
        no_offer_since: None,
    };
    // Attempts in flight when the node stopped: pick each up where its row says.
    let open: Vec<StoredAttempt> = r
        .attempts
        .iter()
        .filter(|a| a.phase != "ended")
        .cloned()
        .collect();
    for a in open {
        tracing::info!(job = %r.id, task = a.task, attempt = a.attempt, phase = %a.phase, "resuming attempt");
        r.spawn(a, None);
    }
    // A task left `running` with no attempt in flight (cannot happen with the transactional
    // writes, but never leave one stuck) waits again.
    for t in r.tasks.iter_mut() {
        if t.state == "running" && !r.live.contains_key(&t.task) {
            t.state = "pending".into();
        }
    }
    let mut cancelling = false;
    loop {
        if ctx.shutdown.is_cancelled() {
            return Ok(());
        }
        if ctx.cancel.is_cancelled() {
            cancelling = true;
        }
        if !cancelling {
            r.launch(concurrency).await;
        }
        if r.live.is_empty() && r.finish(cancelling).await? {
            return Ok(());
        }
        tokio::select! {
            Some(done) = done_rx.recv() => r.settle(done).await?,
            _ = tokio::time::sleep(TICK) => {}
            _ = ctx.cancel.cancelled(), if !cancelling => {}
        }
    }
}

impl Runner {
    fn spawn(&mut self, a: StoredAttempt, offer: Option<OfferRow>) {
        self.live.insert(a.task, a.clone());
        let (sh, tx) = (self.shared.clone(), self.done_tx.clone());
        tokio::task::spawn_local(async move {
            if let Some(done) = attempt::run(sh, a, offer).await {
                let _ = tx.send(done).await;
            }
        });
    }

    /// Starts attempts while there is room, a pending task, an eligible offer and budget.
    async fn launch(&mut self, concurrency: usize) {
        while self.live.len() < concurrency && !self.budget_hit {
            let Some(task) = self
                .tasks
                .iter()
                .position(|t| t.state == "pending" && !self.live.contains_key(&t.task))
            else {
                return;
            };
            let offers = match self.search().await {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!(job = %self.id, error = %e, "offer search failed");
                    return;
                }
            };
            let Some(offer) = self.pick(&offers) else {
                self.no_offer_since.get_or_insert_with(Instant::now);
                return;
            };
            self.no_offer_since = None;
            let job = &self.shared.job;
            let price: Money = match offer.price_per_gpu_hour.parse() {
                Ok(p) => p,
                Err(_) => return,
            };
            let cap = match gridlease_contracts::default_budget(
                job.spec.timeout.0,
                offer.min_billed_s,
                job.gpus(),
                price,
            ) {
                Ok(c) => c,
                Err(_) => return,
            };
            let so_far =
                exposure(self.attempts.iter().map(spend)).unwrap_or(Money::from_micros(u64::MAX));
            let budget = job.spec.budget.as_ref().map(|b| b.max_total.0);
            if !may_launch(budget, so_far, cap) {
                // A live lease that settles below its cap frees budget: wait for it. With none
                // in flight, nothing will.
                if self.live.is_empty() {
                    tracing::info!(job = %self.id, exposure = %so_far, cap = %cap, "budget reached: no more launches");
                    self.budget_hit = true;
                }
                return;
            }
            let t = &mut self.tasks[task];
            t.state = "running".into();
            t.attempts += 1;
            let a = StoredAttempt {
                task: t.task,
                attempt: t.attempts,
                provider: offer.provider.clone(),
                offer: offer.id.clone(),
                price: price.micros(),
                cap: cap.micros(),
                lease_id: None,
                phase: "renting".into(),
                started_at: super::now_ms(),
                ended_at: None,
                verdict: None,
                reason: None,
                exit_code: None,
                spent: None,
            };
            let (id, row, trow) = (self.id.clone(), a.clone(), t.clone());
            if let Err(e) = self
                .shared
                .ctx
                .store
                .call(move |s| s.put_attempt(&id, &row, Some(&trow)))
                .await
            {
                // Nothing is rented that is not stored first.
                tracing::error!(job = %self.id, error = %e, "cannot store an attempt; not launching");
                let t = &mut self.tasks[task];
                t.state = "pending".into();
                t.attempts -= 1;
                return;
            }
            tracing::info!(job = %self.id, task = a.task, attempt = a.attempt, provider = %a.provider, price = %price, "launching attempt");
            self.attempts.push(a.clone());
            self.spawn(a, Some(offer));
        }
    }

    /// The eligible offers, cheapest first.
    async fn search(&self) -> anyhow::Result<Vec<OfferRow>> {
        let q = self.shared.job.query();
        let path = crate::commands::search::path(&q, None, SEARCH_LIMIT);
        Ok(self.shared.ctx.api.get(&path).await?)
    }

    /// The cheapest offer not excluded, able to run the job, with room for one more of its
    /// tasks (a provider runs at most as many of this job's tasks at once as it has GPUs for).
    fn pick(&self, offers: &[OfferRow]) -> Option<OfferRow> {
        let g = u32::from(self.shared.job.gpus());
        offers
            .iter()
            .filter(|o| !self.excluded.contains(&o.provider))
            .filter(|o| self.shared.eligible(o))
            .filter(|o| !self.shared.is_holding(&o.provider))
            .find(|o| {
                let mine = self
                    .live
                    .values()
                    .filter(|a| a.provider == o.provider)
                    .count() as u32;
                o.free_gpus >= g && (mine + 1) * g <= o.gpus
            })
            .cloned()
    }

    /// Decides what an ended attempt's task does next, and stores it with the attempt.
    async fn settle(&mut self, done: Done) -> anyhow::Result<()> {
        let a = done.attempt;
        self.live.remove(&a.task);
        if let Some(slot) = self
            .attempts
            .iter_mut()
            .find(|x| x.task == a.task && x.attempt == a.attempt)
        {
            *slot = a.clone();
        }
        let max = self.shared.job.spec.retries.max;
        let Some(t) = self.tasks.iter_mut().find(|t| t.task == a.task) else {
            return Ok(());
        };
        let step = next(done.verdict, t.attempts, max);
        t.exit_code = a.exit_code;
        let reason = a.reason.clone().unwrap_or_default();
        match step {
            Next::Succeeded => {
                t.state = "succeeded".into();
                t.message = None;
            }
            Next::Failed => {
                t.state = "failed".into();
                let what = match done.verdict {
                    Verdict::Exited { code, .. } => format!("exited with code {code}"),
                    _ => format!("failed after {} attempt(s): {reason}", t.attempts),
                };
                t.message = Some(if done.tail.is_empty() {
                    what
                } else {
                    format!("{what}; last output:\n{}", done.tail)
                });
            }
            Next::Retry { exclude } => {
                t.state = "pending".into();
                t.message = Some(format!("attempt {} ended: {reason}; retrying", a.attempt));
                if exclude {
                    self.excluded.insert(a.provider.clone());
                }
            }
            Next::Cancelled => {
                t.state = "cancelled".into();
            }
        }
        let (id, row, trow) = (self.id.clone(), a.clone(), t.clone());
        let exclude = matches!(step, Next::Retry { exclude: true });
        self.shared
            .ctx
            .store
            .call(move |s| {
                s.put_attempt(&id, &row, Some(&trow))?;
                if exclude {
                    s.exclude_provider(
                        &id,
                        &row.provider,
                        row.reason.as_deref().unwrap_or("fault"),
                    )?;
                }
                Ok(())
            })
            .await?;
        tracing::info!(job = %self.id, task = a.task, next = ?step, "task decided");
        Ok(())
    }

    /// With nothing in flight: ends the job when nothing more will run. True when it ended.
    async fn finish(&mut self, cancelling: bool) -> anyhow::Result<bool> {
        let pending: Vec<u32> = self
            .tasks
            .iter()
            .filter(|t| t.state == "pending")
            .map(|t| t.task)
            .collect();
        let waited_out = self
            .no_offer_since
            .is_some_and(|t| t.elapsed() >= OFFER_WAIT);
        let (state, left_state, message) = if cancelling {
            ("cancelled", "cancelled", "cancelled".to_string())
        } else if pending.is_empty() {
            let failed = self.tasks.iter().filter(|t| t.state == "failed").count();
            if failed == 0 {
                (
                    "completed",
                    "",
                    format!("{} task(s) succeeded", self.tasks.len()),
                )
            } else {
                ("failed", "", format!("{failed} task(s) failed"))
            }
        } else if self.budget_hit {
            (
                "budget_reached",
                "not_started",
                format!(
                    "budget reached: {} task(s) not started: {}",
                    pending.len(),
                    list(&pending)
                ),
            )
        } else if waited_out {
            (
                "failed",
                "failed",
                format!(
                    "no eligible offer for {} s: {} task(s) not run: {}",
                    OFFER_WAIT.as_secs(),
                    pending.len(),
                    list(&pending)
                ),
            )
        } else {
            return Ok(false);
        };
        for t in self.tasks.iter_mut().filter(|t| t.state == "pending") {
            t.state = left_state.into();
            if left_state == "failed" {
                t.message = Some("no eligible offer".into());
            }
        }
        let (id, tasks, msg) = (self.id.clone(), self.tasks.clone(), message.clone());
        self.shared
            .ctx
            .store
            .call(move |s| {
                for t in tasks.iter().filter(|t| pending.contains(&t.task)) {
                    s.put_task(&id, t)?;
                }
                s.set_job_state(&id, state, Some(super::now_ms()), Some(&msg))
            })
            .await?;
        tracing::info!(job = %self.id, state, message, "job over");
        Ok(true)
    }
}

/// Task numbers, shortened past twenty.
fn list(tasks: &[u32]) -> String {
    let mut s: Vec<String> = tasks.iter().take(20).map(u32::to_string).collect();
    if tasks.len() > 20 {
        s.push(format!("and {} more", tasks.len() - 20));
    }
    s.join(", ")
}
