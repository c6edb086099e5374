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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gridlease_protocol::Digest;
use gridlease_sandbox::meter::GpuSample;

use super::Ctx;

/// How often the unleased offered GPUs are sampled.
pub const PERIOD: Duration = Duration::from_millis(500);
/// Default utilisation at or above which a GPU no lease holds counts as in use by its owner,
/// percent (node setting `owner_util_percent`; 0: only compute processes count).
pub const BUSY_UTIL_PERCENT: u32 = 10;

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

/// Runs until the service stops (at once when the node has no sampler: nothing to watch).
pub(crate) async fn run(ctx: Arc<Ctx>, idle: Duration, util_percent: u32) {
    let Some(sampler) = ctx.config.gpu_sampler.clone() else {
        return;
    };
    let offered: Vec<Digest> = ctx
        .config
        .base_template
        .as_ref()
        .map(|t| t.gpus.iter().map(|g| g.spec.uuid_digest).collect())
        .unwrap_or_default();
    let mut last_used: BTreeMap<Digest, Instant> = BTreeMap::new();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = ctx.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let held = ctx.holds.borrow().clone();
        let watch: Vec<(Digest, String)> = offered
            .iter()
            .filter(|d| !held.contains(d))
            .filter_map(|d| sampler.ids.get(d).map(|id| (*d, id.clone())))
            .collect();
        let s = sampler.sampler.clone();
        // NVML calls block; a scripted probe does not, but one path serves both.
        let Ok(seen) = tokio::task::spawn_blocking(move || {
            watch
                .into_iter()
                .filter_map(|(d, id)| {
                    s.sample(&id)
                        .ok()
                        .map(|g| (d, owner_uses(&g, util_percent)))
                })
                .collect::<Vec<_>>()
        })
        .await
        else {
            return;
        };
        let now = Instant::now();
        for (d, used) in seen {
            if used {
                // Said once: the GPU is published as busy at the end of this round.
                if !ctx.owner_busy.borrow().contains(&d) {
                    tracing::info!(gpu = %d.short(), "the owner is using this GPU: it is withdrawn from the offer");
                }
                last_used.insert(d, now);
            }
        }
        let busy_now = busy(&last_used, now, idle);
        last_used.retain(|d, _| busy_now.contains(d));
        ctx.owner_busy.send_if_modified(|cur| {
            if *cur == busy_now {
                return false;
            }
            for d in cur.difference(&busy_now) {
                tracing::info!(gpu = %d.short(), idle_s = idle.as_secs(), "GPU idle again: offered again");
            }
            *cur = busy_now;
            true
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
