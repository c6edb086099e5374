//! Provider: idle-aware providing. A home provider's GPUs are also its owner's: when the owner
//! starts using one (a process on a GPU that no lease holds, or utilisation there), the node
//! takes that GPU out of its offer at once, and offers it again only after it has been idle
//! for `owner_idle` (node setting `owner_idle_secs`, default 300 s).
//!
//! This task samples the offered GPUs that no lease holds every [`PERIOD`] (the sampler the
//! node meters with: NVML, or a scripted probe) and publishes the GPUs the owner uses
//! ([`super::Ctx::owner_busy`]); the desk never gives them to a lease and [`super::capacity`]
//! leaves them out of the offer's free count, which the network loop re-signs and announces
//! at once. GPUs a lease holds are not watched here (their processes are the tenant's; a
//! lease's GPU is not interrupted for the owner).
//!
//! The owner's availability schedule (`provide --hours 22:00-08:00 --tz Europe/Berlin`,
//! [`super::hours::Hours`]) takes the same path: outside its windows (by the service's clock, the rule is
//! `gridlease_contracts::schedule`) every offered GPU is published in the same set, so the
//! offer says 0 free GPUs and renters' searches leave it out; at the window's start (the next
//! round, within [`PERIOD`]) they are free again. A node without a sampler still follows its
//! schedule.
//!
//! With an interruptible offer (`provide --interruptible true`, `Offer::interruptible`) the
//! leased GPUs are watched too, and a lease is stopped for the owner
//! (the `reclaim` the service passes in: [`super::LeaseService::reclaim`], the provider's stop
//! path, close reason
//! `owner_reclaimed`, billed to the second it stopped) when a compute process outside any
//! container appears on one of its GPUs (`GpuSample::host_processes`: the tenant's processes
//! run in its container; utilisation is not used on a leased GPU, since it cannot be told
//! apart from the tenant's), or when the offered hours end. Without it a running lease runs
//! to its end and only the unleased GPUs are withdrawn.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use std::future::Future;
use std::sync::Arc;

use gridlease_protocol::{Digest, LeaseId};
use gridlease_sandbox::meter::GpuSample;

use super::ctx::Ctx;
use super::error::LeaseError;
use crate::store::Role;

/// How often the unleased offered GPUs are sampled.
pub const PERIOD: Duration = Duration::from_millis(500);
pub use super::config::BUSY_UTIL_PERCENT;

/// Whether a sample of a GPU a lease holds shows its owner using it: a compute process outside
/// any container (the tenant's run in its container).
pub fn owner_uses_leased(s: &GpuSample) -> bool {
    s.host_processes.is_some_and(|p| p > 0)
}

/// Whether a sample of a GPU no lease holds shows its owner using it: a compute process on it,
/// or utilisation of at least `util_percent` (0: utilisation does not count).
pub fn owner_uses(s: &GpuSample, util_percent: u32) -> bool {
    s.processes.is_some_and(|p| p > 0) || (util_percent > 0 && s.util_percent >= util_percent)
}

/// Which GPUs count as the owner's, from when each was last seen in use: those seen within
/// `idle` of `now` (a GPU the owner stopped using is offered again after `idle`).
pub fn busy(
    last_used: &BTreeMap<Digest, Instant>,
    now: Instant,
    idle: Duration,
) -> BTreeSet<Digest> {
    last_used
        .iter()
        .filter(|(_, t)| now.saturating_duration_since(**t) < idle)
        .map(|(d, _)| *d)
        .collect()
}

/// Runs until the service stops. Without a sampler only the schedule is followed.
/// `reclaim` stops one provider lease for the owner (the service's
/// [`super::LeaseService::reclaim`]).
pub(crate) async fn run<R, F>(ctx: Arc<Ctx>, idle: Duration, util_percent: u32, reclaim: R)
where
    R: Fn(LeaseId) -> F + Clone + Send + 'static,
    F: Future<Output = Result<(), LeaseError>> + Send + 'static,
{
    // Leases already asked to stop for the owner (asked once).
    let mut reclaimed: BTreeSet<LeaseId> = BTreeSet::new();
    let sampler = ctx.config.gpu_sampler.clone();
    let mut hours = ctx.hours.subscribe();
    let mut closed = false;
    let offered: Vec<Digest> = ctx
        .config
        .base_template
        .as_ref()
        .map(|t| t.gpus.iter().map(|g| g.spec.uuid_digest).collect())
        .unwrap_or_default();
    let mut last_used: BTreeMap<Digest, Instant> = BTreeMap::new();
    // The GPUs the owner used as of the last round (to say when one is idle again).
    let mut used: BTreeSet<Digest> = BTreeSet::new();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = ctx.cancel.cancelled() => return,
            // New hours take effect at once, not at the next tick.
            changed = hours.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
        }
        let interruptible = hours.borrow().as_ref().is_some_and(|h| h.interruptible);
        let held = ctx.holds.borrow().clone();
        let seen = match &sampler {
            Some(sampler) => {
                // Leased GPUs only when their leases may be stopped for the owner.
                let watch: Vec<(Digest, String, bool)> = offered
                    .iter()
                    .filter(|d| interruptible || !held.contains(d))
                    .filter_map(|d| {
                        sampler
                            .ids
                            .get(d)
                            .map(|id| (*d, id.clone(), held.contains(d)))
                    })
                    .collect();
                let s = sampler.sampler.clone();
                // NVML calls block; a scripted probe does not, but one path serves both.
                let Ok(seen) = tokio::task::spawn_blocking(move || {
                    watch
                        .into_iter()
                        .filter_map(|(d, id, leased)| {
                            s.sample(&id).ok().map(|g| {
                                let used = if leased {
                                    owner_uses_leased(&g)
                                } else {
                                    owner_uses(&g, util_percent)
                                };
                                (d, used)
                            })
                        })
                        .collect::<Vec<_>>()
                })
                .await
                else {
                    return;
                };
                seen
            }
            None => Vec::new(),
        };
        let schedule = hours.borrow_and_update().as_ref().map(|h| h.now(ctx.now()));
        let outside = schedule.as_ref().is_some_and(|s| !s.availability.offered);
        if outside != closed {
            closed = outside;
            let next = schedule.as_ref().map(|s| s.sentence()).unwrap_or_default();
            if closed {
                tracing::info!(next = %next, "outside the offered hours: GPUs withdrawn from the offer");
            } else {
                tracing::info!(next = %next, "offered hours begin: GPUs offered again");
            }
        }
        // Interruptible: the leases on GPUs the owner takes back, or all of them once the
        // offered hours end.
        let mut taken: BTreeSet<Digest> = seen
            .iter()
            .filter(|(d, used)| *used && held.contains(d))
            .map(|(d, _)| *d)
            .collect();
        if interruptible && closed {
            taken.extend(held.iter().copied());
        }
        if interruptible && !taken.is_empty() {
            stop_for_owner(&ctx, &reclaim, &taken, &mut reclaimed, closed).await;
        }
        let now = Instant::now();
        for (d, in_use) in seen {
            if in_use {
                // Said once: the GPU is published as busy at the end of this round.
                if !used.contains(&d) {
                    tracing::info!(gpu = %d.short(), "the owner is using this GPU: it is withdrawn from the offer");
                }
                last_used.insert(d, now);
            }
        }
        let used_now = busy(&last_used, now, idle);
        last_used.retain(|d, _| used_now.contains(d));
        for d in used.difference(&used_now) {
            tracing::info!(gpu = %d.short(), idle_s = idle.as_secs(), "GPU idle again: offered again");
        }
        let mut busy_now = used_now.clone();
        used = used_now;
        if closed {
            busy_now.extend(offered.iter().copied());
        }
        ctx.owner_busy.send_if_modified(|cur| {
            if *cur == busy_now {
                return false;
            }
            *cur = busy_now;
            true
        });
    }
}

/// Stops (once each) the running provider leases that hold any of `gpus`, for the owner.
async fn stop_for_owner<R, F>(
    ctx: &Ctx,
    reclaim: &R,
    gpus: &BTreeSet<Digest>,
    reclaimed: &mut BTreeSet<LeaseId>,
    hours_ended: bool,
) where
    R: Fn(LeaseId) -> F + Clone + Send + 'static,
    F: Future<Output = Result<(), LeaseError>> + Send + 'static,
{
    let Ok(live) = ctx.store.call(|s| s.live_leases()).await else {
        return;
    };
    reclaimed.retain(|id| live.iter().any(|(l, _)| l.lease.id == *id));
    for (l, _) in live {
        let id = l.lease.id;
        if l.role != Role::Provider
            || reclaimed.contains(&id)
            || !l.gpus.iter().any(|g| gpus.contains(g))
        {
            continue;
        }
        reclaimed.insert(id);
        let why = if hours_ended {
            "the offered hours ended"
        } else {
            "the owner is using its GPU"
        };
        tracing::info!(lease = %id, why, "stopping an interruptible lease for the owner");
        let stop = reclaim(id);
        tokio::spawn(async move {
            if let Err(e) = stop.await {
                tracing::warn!(lease = %id, error = %e, "could not stop the lease for the owner");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_or_utilisation_mean_the_owner_and_idle_time_brings_a_gpu_back() {
        let s = |util, processes| GpuSample {
            util_percent: util,
            processes,
            ..Default::default()
        };
        let u = BUSY_UTIL_PERCENT;
        assert!(owner_uses(&s(0, Some(1)), u));
        assert!(owner_uses(&s(u, None), u));
        assert!(!owner_uses(&s(u - 1, Some(0)), u));
        assert!(!owner_uses(&s(0, None), u));
        assert!(
            !owner_uses(&s(100, Some(0)), 0),
            "0: utilisation does not count"
        );
        assert!(owner_uses(&s(0, Some(2)), 0));

        let (a, b) = (Digest::of("t", b"a"), Digest::of("t", b"b"));
        let t0 = Instant::now();
        let idle = Duration::from_secs(300);
        let last = BTreeMap::from([(a, t0), (b, t0 + Duration::from_secs(200))]);
        let at = |s| busy(&last, t0 + Duration::from_secs(s), idle);
        assert_eq!(at(299), BTreeSet::from([a, b]));
        assert_eq!(at(300), BTreeSet::from([b]), "idle for 300 s: back");
        assert_eq!(at(500), BTreeSet::new());
    }
}
