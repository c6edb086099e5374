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

use super::attempt::{self, Ctx, Done, LeaseAfter, Shared};
use super::spec::Job;
use super::view::spend;
use super::worker;
use crate::api::types::OfferRow;
use crate::store::jobs::{StoredAttempt, StoredTask};

/// How often the runner looks again at the book and its tasks when nothing happened.
const TICK: Duration = Duration::from_secs(1);
/// Most offers one search reads.
const SEARCH_LIMIT: u32 = 200;
/// Seconds a shared lease must have left beyond a task's timeout to be handed it.
const HANDOVER_MARGIN_S: u64 = 30;

/// A shared lease (`tasks_per_lease` above 1) between two tasks.
enum Between {
    /// Ready for another task: its provider, price, time left and where its log ends.
    Idle {
        provider: String,
        price: u64,
        time_left_s: u64,
        log_end: u64,
    },
    /// Being stopped and settled.
    Stopping { provider: String },
}

impl Between {
    fn provider(&self) -> &str {
        match self {
            Self::Idle { provider, .. } | Self::Stopping { provider } => provider,
        }
    }
}

struct Runner {
    id: String,
    shared: Arc<Shared>,
    tasks: Vec<StoredTask>,
    attempts: Vec<StoredAttempt>,
    excluded: HashSet<String>,
    /// Task -> its attempt in flight.
    live: HashMap<u32, StoredAttempt>,
    done_tx: mpsc::Sender<Done>,
    /// Shared leases with no task in flight, by lease id.
    between: HashMap<String, Between>,
    /// Stopped shared leases settle here: the lease and what it cost, when known.
    released_tx: mpsc::Sender<(String, Option<u64>)>,
    budget_hit: bool,
    /// Since when no offer took a pending task while none of the job's tasks was in flight
    /// (its own tasks holding the offers is no reason to give up).
    no_offer_since: Option<Instant>,
    /// Why the last search gave no offer to launch on, in words (the job's message while it
    /// waits with nothing in flight).
    no_offer_why: String,
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
    // Each stopping shared lease sends one result (senders wait while it is full).
    let (released_tx, mut released_rx) = mpsc::channel(concurrency + 1);
    let mut r = Runner {
        id: id.to_string(),
        shared,
        tasks,
        attempts,
        excluded: excluded.into_iter().map(|(p, _)| p).collect(),
        live: HashMap::new(),
        done_tx,
        between: HashMap::new(),
        released_tx,
        budget_hit: false,
        no_offer_since: None,
        no_offer_why: String::new(),
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
        let owner = r.owner_of(&a);
        r.spawn(a, None, owner);
    }
    // Shared leases between tasks when the node stopped, not settled: stopped (the tasks
    // waiting go to leases this run sees start).
    if r.shared.job.shares_leases() {
        let unsettled: Vec<(String, String)> = r
            .attempts
            .iter()
            .filter(|a| a.phase == "ended" && a.spent.is_none())
            .filter_map(|a| Some((a.lease_id.clone()?, a.provider.clone())))
            .filter(|(l, _)| {
                !r.live
                    .values()
                    .any(|x| x.lease_id.as_deref() == Some(l.as_str()))
            })
            .collect();
        for (lease, provider) in unsettled {
            if !r.between.contains_key(&lease)
                && r.owner_of_lease(&lease).is_some_and(|o| o.spent.is_none())
            {
                r.release(lease, provider);
            }
        }
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
        r.release_idle();
        if r.live.is_empty() && r.between.is_empty() && r.finish(cancelling).await? {
            return Ok(());
        }
        tokio::select! {
            Some(done) = done_rx.recv() => r.settle(done).await?,
            Some((lease, spent)) = released_rx.recv() => r.lease_settled(&lease, spent).await,
            _ = tokio::time::sleep(TICK) => {}
            _ = ctx.cancel.cancelled(), if !cancelling => {}
        }
    }
}

impl Runner {
    fn spawn(&mut self, a: StoredAttempt, offer: Option<(OfferRow, u32)>, owner: (u32, u32)) {
        self.live.insert(a.task, a.clone());
        let (sh, tx) = (self.shared.clone(), self.done_tx.clone());
        tokio::task::spawn_local(async move {
            let done = if sh.job.shares_leases() {
                worker::run(sh, a, offer, owner).await
            } else {
                attempt::run(sh, a, offer).await
            };
            if let Some(done) = done {
                let _ = tx.send(done).await;
            }
        });
    }

    /// The first attempt of lease `lease` (which carries its cap and cost).
    fn owner_of_lease(&self, lease: &str) -> Option<&StoredAttempt> {
        self.attempts
            .iter()
            .filter(|a| a.lease_id.as_deref() == Some(lease))
            .min_by_key(|a| (a.started_at, a.task, a.attempt))
    }

    /// The first attempt of `a`'s lease: `a` itself but for a later task on a shared lease.
    fn owner_of(&self, a: &StoredAttempt) -> (u32, u32) {
        a.lease_id
            .as_deref()
            .and_then(|l| self.owner_of_lease(l))
            .map_or((a.task, a.attempt), |o| (o.task, o.attempt))
    }

    /// Stops a shared lease between tasks; it settles into `lease_settled`.
    fn release(&mut self, lease: String, provider: String) {
        tracing::info!(job = %self.id, lease = %lease, "releasing a shared lease");
        self.between
            .insert(lease.clone(), Between::Stopping { provider });
        let (sh, tx) = (self.shared.clone(), self.released_tx.clone());
        tokio::task::spawn_local(async move {
            let spent = worker::release(&sh, &lease).await;
            let _ = tx.send((lease, spent)).await;
        });
    }

    /// Releases every idle shared lease (after `launch` handed out what it could).
    fn release_idle(&mut self) {
        let idle: Vec<(String, String)> = self
            .between
            .iter()
            .filter(|(_, b)| matches!(b, Between::Idle { .. }))
            .map(|(l, b)| (l.clone(), b.provider().to_string()))
            .collect();
        for (lease, provider) in idle {
            self.release(lease, provider);
        }
    }

    /// A shared lease is over: its cost goes on its first attempt, and it is forgotten.
    async fn lease_settled(&mut self, lease: &str, spent: Option<u64>) {
        self.between.remove(lease);
        let Some(owner) = self.owner_of_lease(lease).map(|o| (o.task, o.attempt)) else {
            return;
        };
        self.shared.ctx.live.remove(owner.0, owner.1);
        let Some(spent) = spent else {
            // Never known: its cap stays counted against the budget.
            return;
        };
        let Some(row) = self
            .attempts
            .iter_mut()
            .find(|a| (a.task, a.attempt) == owner)
        else {
            return;
        };
        row.spent = Some(spent);
        if row.phase != "ended" {
            // Written with its end.
            return;
        }
        let (id, row) = (self.id.clone(), row.clone());
        if let Err(e) = self
            .shared
            .ctx
            .store
            .call(move |s| s.put_attempt(&id, &row, None))
            .await
        {
            tracing::error!(job = %self.id, error = %e, "cannot store what a lease cost");
        }
    }

    /// The index of the first pending task with no attempt in flight.
    fn next_pending(&self) -> Option<usize> {
        self.tasks
            .iter()
            .position(|t| t.state == "pending" && !self.live.contains_key(&t.task))
    }

    /// Marks task `task` (its index) running with a new attempt, `make` filling in the lease
    /// fields of a blank one, and stores both before anything is rented or handed over. `None`
    /// (the task pending again) when the store fails.
    async fn new_attempt(
        &mut self,
        task: usize,
        make: impl FnOnce(StoredAttempt) -> StoredAttempt,
    ) -> Option<StoredAttempt> {
        let t = &mut self.tasks[task];
        t.state = "running".into();
        t.attempts += 1;
        let a = make(StoredAttempt {
            task: t.task,
            attempt: t.attempts,
            provider: String::new(),
            offer: String::new(),
            price: 0,
            cap: 0,
            lease_id: None,
            phase: "renting".into(),
            started_at: super::now_ms(),
            ended_at: None,
            verdict: None,
            reason: None,
            exit_code: None,
            spent: None,
            log_from: 0,
            run_at: None,
        });
        let (id, row, trow) = (self.id.clone(), a.clone(), t.clone());
        if let Err(e) = self
            .shared
            .ctx
            .store
            .call(move |s| s.put_attempt(&id, &row, Some(&trow)))
            .await
        {
            tracing::error!(job = %self.id, error = %e, "cannot store an attempt; not starting it");
            let t = &mut self.tasks[task];
            t.state = "pending".into();
            t.attempts -= 1;
            return None;
        }
        Some(a)
    }

    /// Hands pending tasks to idle shared leases (cheapest first) that have tasks and time
    /// left for one more and whose provider is not excluded.
    async fn hand_over(&mut self, concurrency: usize) {
        let job = self.shared.job.clone();
        let mut idle: Vec<(u64, String)> = self
            .between
            .iter()
            .filter_map(|(l, b)| match b {
                Between::Idle { price, .. } => Some((*price, l.clone())),
                Between::Stopping { .. } => None,
            })
            .collect();
        idle.sort();
        for (_, lease) in idle {
            if self.live.len() >= concurrency {
                return;
            }
            let Some(Between::Idle {
                provider,
                price,
                time_left_s,
                log_end,
            }) = self.between.get(&lease)
            else {
                continue;
            };
            let ran = self
                .attempts
                .iter()
                .filter(|a| a.lease_id.as_deref() == Some(lease.as_str()))
                .count() as u32;
            let usable = ran < job.spec.tasks_per_lease
                && *time_left_s >= u64::from(job.spec.timeout.0) + HANDOVER_MARGIN_S
                && !self.excluded.contains(provider);
            if !usable {
                continue;
            }
            let Some(task) = self.next_pending() else {
                return;
            };
            let Some(owner) = self.owner_of_lease(&lease).cloned() else {
                continue;
            };
            let (provider, price, log_end) = (provider.clone(), *price, *log_end);
            let Some(a) = self
                .new_attempt(task, |t| StoredAttempt {
                    provider,
                    offer: owner.offer.clone(),
                    price,
                    // The lease's cap is its first attempt's.
                    cap: 0,
                    lease_id: Some(lease.clone()),
                    phase: "starting".into(),
                    log_from: log_end,
                    ..t
                })
                .await
            else {
                return;
            };
            tracing::info!(job = %self.id, task = a.task, attempt = a.attempt, lease = %lease, "handing a task to a shared lease");
            self.between.remove(&lease);
            self.attempts.push(a.clone());
            self.spawn(a, None, (owner.task, owner.attempt));
        }
    }

    /// The longest lease (seconds) worth renting for this job from `offer` whose cap fits the
    /// budget with `so_far` spent or committed, and that cap; `None` if not even one task's
    /// lease fits.
    fn lease_terms(&self, offer: &OfferRow, price: Money, so_far: Money) -> Option<(u32, Money)> {
        let job = &self.shared.job;
        let budget = job.spec.budget.as_ref().map(|b| b.max_total.0);
        let timeout = job.spec.timeout.0;
        let most = if job.shares_leases() {
            let pending = self.tasks.iter().filter(|t| t.state == "pending").count() as u32;
            job.spec.tasks_per_lease.min(pending.max(1))
        } else {
            1
        };
        (1..=most).rev().find_map(|n| {
            let want = timeout.saturating_mul(n);
            let lease_s = if job.shares_leases() {
                want.max(offer.min_duration_s).min(offer.max_duration_s)
            } else {
                want
            };
            if lease_s < want {
                return None;
            }
            let cap =
                gridlease_contracts::default_budget(lease_s, offer.min_billed_s, job.gpus(), price)
                    .ok()?;
            may_launch(budget, so_far, cap).then_some((lease_s, cap))
        })
    }

    /// Starts attempts while there is room, a pending task, an eligible offer and budget.
    async fn launch(&mut self, concurrency: usize) {
        self.hand_over(concurrency).await;
        while self.live.len() < concurrency && !self.budget_hit {
            let Some(task) = self.next_pending() else {
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
                self.waiting_for_offers(&offers).await;
                return;
            };
            self.offers_found().await;
            let price: Money = match offer.price_per_gpu_hour.parse() {
                Ok(p) => p,
                Err(_) => return,
            };
            let so_far =
                exposure(self.attempts.iter().map(spend)).unwrap_or(Money::from_micros(u64::MAX));
            let Some((lease_s, cap)) = self.lease_terms(&offer, price, so_far) else {
                // A live lease that settles below its cap frees budget: wait for it. With none
                // in flight or settling, nothing will.
                if self.live.is_empty() && self.between.is_empty() {
                    tracing::info!(job = %self.id, exposure = %so_far, "budget reached: no more launches");
                    self.budget_hit = true;
                }
                return;
            };
            // Nothing is rented that is not stored first.
            let Some(a) = self
                .new_attempt(task, |t| StoredAttempt {
                    provider: offer.provider.clone(),
                    offer: offer.id.clone(),
                    price: price.micros(),
                    cap: cap.micros(),
                    lease_id: None,
                    phase: "renting".into(),
                    log_from: 0,
                    ..t
                })
                .await
            else {
                return;
            };
            tracing::info!(job = %self.id, task = a.task, attempt = a.attempt, provider = %a.provider, price = %price, lease_s, "launching attempt");
            self.attempts.push(a.clone());
            let owner = (a.task, a.attempt);
            self.spawn(a, Some((offer, lease_s)), owner);
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
            .filter(|o| self.shared.unfit(o).is_none())
            .filter(|o| !self.shared.is_holding(&o.provider))
            .find(|o| {
                let mine = (self
                    .live
                    .values()
                    .filter(|a| a.provider == o.provider)
                    .count()
                    + self
                        .between
                        .values()
                        .filter(|b| b.provider() == o.provider)
                        .count()) as u32;
                o.free_gpus >= g && (mine + 1) * g <= o.gpus
            })
            .cloned()
    }

    /// No offer took a pending task. With some of the job's tasks in flight it waits for
    /// them (they hold the offers, and free them as they end); with none, the wait is timed
    /// (`offer_wait`) and the job's message says why it waits.
    async fn waiting_for_offers(&mut self, offers: &[OfferRow]) {
        if !self.live.is_empty() || !self.between.is_empty() {
            self.no_offer_since = None;
            return;
        }
        self.no_offer_since.get_or_insert_with(Instant::now);
        // Said only while it matters (nothing in flight), not on every pick while tasks run.
        let why = self.why_none(offers);
        if why != self.no_offer_why {
            let message = format!(
                "waiting for an eligible offer ({why}); the job ends if none comes within {} s",
                self.shared.job.spec.offer_wait.0
            );
            self.no_offer_why = why;
            self.set_running_message(Some(message)).await;
        }
    }

    /// An offer took a task: the wait (if any) is over and its message gone.
    async fn offers_found(&mut self) {
        self.no_offer_since = None;
        if !self.no_offer_why.is_empty() {
            self.no_offer_why.clear();
            self.set_running_message(None).await;
        }
    }

    /// The message of the running job (what `job status` shows beside its state).
    async fn set_running_message(&self, message: Option<String>) {
        let id = self.id.clone();
        let stored = self
            .shared
            .ctx
            .store
            .call(move |s| s.set_job_state(&id, "running", None, message.as_deref()))
            .await;
        if let Err(e) = stored {
            tracing::warn!(job = %self.id, error = %e, "cannot store the job's message");
        }
    }

    /// Why none of `offers` (a search's answer) takes a task now, in words.
    fn why_none(&self, offers: &[OfferRow]) -> String {
        if offers.is_empty() {
            return format!("no offer matches the search `{}`", self.shared.job.query());
        }
        let mut why: std::collections::BTreeMap<String, usize> = Default::default();
        for o in offers {
            let r = if self.excluded.contains(&o.provider) {
                "are excluded for this job".to_string()
            } else if let Some(r) = self.shared.unfit(o) {
                r
            } else if self.shared.is_holding(&o.provider) {
                "hold a container of this job for its uploads".to_string()
            } else {
                "have no GPU free for another task".to_string()
            };
            *why.entry(r).or_default() += 1;
        }
        let parts: Vec<String> = why.iter().map(|(r, n)| format!("{n} {r}")).collect();
        format!(
            "{} offer(s) match the search; {}",
            offers.len(),
            parts.join(", ")
        )
    }

    /// Decides what an ended attempt's task does next, and stores it with the attempt.
    async fn settle(&mut self, done: Done) -> anyhow::Result<()> {
        let a = done.attempt;
        self.live.remove(&a.task);
        let lease = a.lease_id.clone();
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
        if let (Some(after), Some(lease)) = (done.lease, lease) {
            match after {
                LeaseAfter::Reusable {
                    time_left_s,
                    log_end,
                } => {
                    self.between.insert(
                        lease,
                        Between::Idle {
                            provider: a.provider.clone(),
                            price: a.price,
                            time_left_s,
                            log_end,
                        },
                    );
                }
                LeaseAfter::Stop => self.release(lease, a.provider.clone()),
                LeaseAfter::Over { spent } => self.lease_settled(&lease, spent).await,
            }
        }
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
        let wait = std::time::Duration::from_secs(u64::from(self.shared.job.spec.offer_wait.0));
        let waited_out = self.no_offer_since.is_some_and(|t| t.elapsed() >= wait);
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
                    "no eligible offer for {} s ({}): {} task(s) not run: {}",
                    wait.as_secs(),
                    self.no_offer_why,
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
