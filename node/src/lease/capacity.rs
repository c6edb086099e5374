//! Provider: the offer says how many of its GPUs are free (`Offer::free_gpus`). The desk owns
//! the holds; whenever they change the actor publishes them ([`super::Ctx::holds`]), and this
//! task counts the free GPUs of the offer the node advertises now and hands the count to the
//! network loop, which re-signs and announces the offer at once when it differs. So a fully
//! rented offer says `0` within a round trip on loopback, and renters' searches leave it out;
//! a release puts it back. A `watch` keeps only the latest holds: quick changes coalesce, and
//! an older count never overwrites a newer one. The kept volumes' GiB (issue 47) and the kept
//! outputs' ([`super::outputs`]) go the same way: the offer's disk per GPU is what is left of
//! the host's after them.

use std::sync::Arc;

use super::ctx::Ctx;

/// How soon the count is tried again when the node had no offer yet.
const NO_OFFER_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// Runs until the service stops.
pub(crate) async fn run(ctx: Arc<Ctx>) {
    let mut holds = ctx.holds.subscribe();
    let mut owner = ctx.owner_busy.subscribe();
    let mut volumes = ctx.volume_gib.subscribe();
    let mut outputs = ctx.kept_outputs_gib.subscribe();
    holds.mark_changed();
    // Set when there was no offer to count against: the node signs its first one after it
    // starts (and has none while providing is off). Without looking again, holds restored at
    // a restart and counted before the first offer existed would never reach it, and the
    // offer would advertise a running lease's GPU as free.
    let mut no_offer = false;
    loop {
        tokio::select! {
            () = ctx.cancel.cancelled() => return,
            () = tokio::time::sleep(NO_OFFER_RETRY), if no_offer => {}
            changed = holds.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            changed = owner.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            changed = volumes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            changed = outputs.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let kept_gib = volumes
            .borrow_and_update()
            .saturating_add(*outputs.borrow_and_update());
        // GPUs the owner uses (`super::owner`) are not free either.
        let mut held = holds.borrow_and_update().clone();
        held.extend(owner.borrow_and_update().iter().copied());
        let own = match ctx.client.own_offer().await {
            Ok(Some(o)) => o,
            Ok(None) => {
                no_offer = true;
                continue;
            }
            Err(_) => return,
        };
        no_offer = false;
        let free = own
            .offer
            .gpus
            .iter()
            .filter(|g| !held.contains(&g.spec.uuid_digest))
            .count();
        let free = u16::try_from(free).unwrap_or(u16::MAX);
        if own.offer.free_gpus != free {
            tracing::debug!(free, "offer re-signed with its free GPUs");
        }
        if ctx.client.set_capacity(free, kept_gib).await.is_err() {
            return;
        }
    }
}
