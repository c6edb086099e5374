//! Provider: finished leases' kept outputs (`LeaseTerms::output_retention_s`). A lease whose
//! terms ask for it ends with its container stopped, not removed, and its workspace in place
//! (the session stores `outputs_until` with the close; [`super::provider`]), so the renter can
//! still download from `/workspace` (`gridlease cp`, `rent --download`; the access rules are
//! `crate::access::authorize`). This sweep removes them once their time is up: every
//! [`super::config::OUTPUTS_SWEEP`], and at start-up before containers are reconciled. It
//! reads only the kept rows (a partial index), never every lease.

use std::collections::BTreeSet;
use std::time::Duration;

use gridlease_protocol::LeaseId;

use super::ctx::Ctx;

/// Removes the kept outputs whose time is up; returns the leases whose outputs are still kept.
pub(crate) async fn sweep(ctx: &Ctx) -> BTreeSet<LeaseId> {
    let Some(sb) = &ctx.sandbox else {
        return BTreeSet::new();
    };
    let kept = match ctx.store.call(|s| s.kept_outputs()).await {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read kept outputs");
            return BTreeSet::new();
        }
    };
    let now = ctx.now();
    let mut still = BTreeSet::new();
    for (id, until) in kept {
        if until > now {
            still.insert(id);
            continue;
        }
        let name = gridlease_sandbox::spec::container_name_of(&id);
        if let Err(e) = sb.remove(&name).await
            && sb.inspect(&name).await.is_ok()
        {
            tracing::warn!(lease = %id.short(), error = %e, "kept container not removed; retrying later");
            continue;
        }
        if let Err(e) = sb.remove_workspace(&ctx.workspace_dir(), &id).await {
            tracing::warn!(lease = %id.short(), error = %e, "kept workspace not removed; retrying later");
            continue;
        }
        match ctx.store.call(move |s| s.outputs_removed(&id)).await {
            Ok(()) => tracing::info!(lease = %id.short(), "kept outputs removed: their time is up"),
            Err(e) => {
                tracing::warn!(lease = %id.short(), error = %e, "cannot record removed outputs")
            }
        }
    }
    // What the kept ones take: their images' allocated blocks (a stopped container's
    // workspace no longer grows), out of the offer's disk until they go.
    let dir = ctx.workspace_dir();
    let bytes: u64 = still
        .iter()
        .filter_map(|id| {
            let image = gridlease_sandbox::workspace::image_path(&dir, id);
            std::fs::metadata(image).ok()
        })
        .map(|m| std::os::unix::fs::MetadataExt::blocks(&m).saturating_mul(512))
        .sum();
    let gib = bytes.div_ceil(1 << 30);
    ctx.kept_outputs_gib.send_if_modified(|cur| {
        let changed = *cur != gib;
        *cur = gib;
        changed
    });
    still
}

/// Runs [`sweep`] every `every` ([`super::config::OUTPUTS_SWEEP`] in a daemon) until the
/// service stops.
pub(crate) async fn run(ctx: std::sync::Arc<Ctx>, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = ctx.cancel.cancelled() => return,
            _ = tick.tick() => {
                sweep(&ctx).await;
            }
        }
    }
}
