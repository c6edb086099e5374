//! Leases when a side vanishes or misbehaves (issue 5), real Docker and the probe image.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::time::Instant;

use gridlease_node::clock;
use gridlease_node::lease::{BadReceipt, Faults};
use lease_support::*;

/// 1 s reports, 3 s pay-ahead window, 3 s grace: short windows so the bounds are tested fast.
const INTERVAL_S: u32 = 1;
const WINDOW_S: u32 = 3;
const GRACE_S: u32 = 3;
/// Cost of one second of one GPU at [`PRICE`].
const PER_S: u64 = 1000;

/// The fault tests' [`Setup`]: one GPU on the short windows above.
async fn setup(test: &str) -> Option<Setup> {
    lease_support::setup(test, lease_template(1, INTERVAL_S, WINDOW_S), GRACE_S).await
}

/// A long-running probe: burns a little CPU, then sleeps.
const LONG: &[&str] = &[
    "burn", "1", "1", "sentinel", "UP", "sleep", "120", "exit", "0",
];

/// The provider's renter-silence detection runs on its injected clock: once the clock passes
/// the grace after the renter was last heard, the provider stops at its next look, without
/// waiting the grace in real time. The meter keeps real time (what the container used), so the
/// unpaid exposure is what really ran since the last receipt. The pay-ahead window is long
/// (30 s) so that only silence can stop it here.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renter_vanishes_provider_stops_after_the_grace_on_its_clock() {
    let Some(sb) = docker_or_skip("renter_vanishes").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let clock = clock::ManualClock::new();
    let pclock = clock.clone();
    let provider = provider_with(
        root,
        &sb,
        lease_template(1, INTERVAL_S, 30),
        GRACE_S,
        |svc| {
            svc.clock = pclock;
        },
    )
    .await;
    let (renter, offer) = renter_of(root, &provider, GRACE_S).await;
    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 120, LONG))
        .await
        .unwrap();
    // Paid for a few seconds: the channel works.
    wait_view(&provider.leases, id, "3 s paid", |v| v.paid >= 3 * PER_S).await;
    vanish(renter).await;
    let killed_at = clock::Clock::now(clock.as_ref());
    let t = Instant::now();
    clock.advance(u64::from(GRACE_S) * 1000 + 100);

    let done = closed(&provider.leases, id, 30).await;
    let real = t.elapsed();
    eprintln!("provider after renter vanished: {done:#?} (after {real:?} real time)");
    assert!(
        real < std::time::Duration::from_secs(3),
        "waited {real:?} in real time for a {GRACE_S} s grace"
    );
    assert_eq!(done.state, gridlease_contracts::LeaseState::Settled);
    assert_eq!(done.close_reason.as_deref(), Some("renter_unreachable"));
    // By its clock it stopped after the grace, and within one look (an interval) after it.
    let closed_after_ms = done.closed_at.unwrap() - killed_at.0;
    let real_ms = u64::try_from(real.as_millis()).unwrap();
    assert!(
        closed_after_ms > u64::from(GRACE_S) * 1000,
        "stopped {closed_after_ms} ms (its clock) after the renter vanished"
    );
    assert!(
        closed_after_ms <= u64::from(GRACE_S) * 1000 + 100 + real_ms + 500,
        "{closed_after_ms} ms"
    );
    assert!(!container_exists(&sb, id).await, "container removed");
    // Unpaid exposure: what the last report claims minus what was paid: the real seconds since
    // the last receipt (a report's interval and the time to stop), never the clock's jump.
    let unpaid = done.cost_so_far - done.paid;
    let bound = (real_ms / 1000 + u64::from(2 * INTERVAL_S) + 1) * PER_S;
    eprintln!("unpaid exposure {unpaid} micro-units, bound {bound}");
    assert!(unpaid <= bound, "unpaid {unpaid} > {bound}");
    assert_eq!(done.settled_total, Some(done.paid));
    provider.cancel.cancel();
    remove_container(&sb, id).await;
}

/// The renter's silence detection runs on its injected clock: once the clock passes the limit
/// (two intervals + 2 s after the last report), the renter gives up at its next look, without
/// waiting those seconds in real time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn provider_vanishes_renter_stops_paying_within_one_interval() {
    let Some(sb) = docker_or_skip("provider_vanishes").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let provider = provider_with(
        root,
        &sb,
        lease_template(1, INTERVAL_S, WINDOW_S),
        GRACE_S,
        |_| {},
    )
    .await;
    let clock = gridlease_node::clock::ManualClock::new();
    let mut rsvc = service_config(root, "renter", GRACE_S);
    rsvc.clock = clock.clone();
    let mut renter = party(root, "renter", common::config(), rsvc, None).await;
    let offer = connect_for_offer(&mut renter, &provider).await;
    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 120, LONG))
        .await
        .unwrap();
    let before = wait_view(&renter.leases, id, "3 s paid", |v| v.paid >= 3 * PER_S).await;
    let killed_at = gridlease_node::clock::Clock::now(clock.as_ref());
    vanish(provider).await;
    // The vanished provider left its container (a restart would resume it); clean up.
    remove_container(&sb, id).await;

    let limit_ms = u64::from(2 * INTERVAL_S) * 1000 + 2000;
    let t = Instant::now();
    clock.advance(limit_ms + 100);
    let done = closed(&renter.leases, id, 10).await;
    let real = t.elapsed();
    eprintln!("renter after provider vanished: {done:#?} (after {real:?} real time)");
    assert!(
        real < std::time::Duration::from_secs(3),
        "waited {real:?} in real time"
    );
    assert_eq!(done.state, gridlease_contracts::LeaseState::Settled);
    assert_eq!(done.close_reason.as_deref(), Some("provider_unreachable"));
    // Paid nothing after the provider vanished beyond at most one report already in flight.
    assert!(
        done.paid <= before.paid + u64::from(INTERVAL_S) * PER_S,
        "paid {} after vanish, {} before",
        done.paid,
        before.paid
    );
    // Loss bounded by the prepaid window: the renter pays in arrears, never beyond shown usage.
    let shown = done.usage.as_ref().unwrap().wall_ms / 1000 * PER_S;
    assert!(done.paid <= shown, "paid {} for {shown} shown", done.paid);
    assert_eq!(done.settled_total, Some(done.paid));
    let gave_up_ms = done.closed_at.unwrap() - killed_at.0;
    eprintln!("renter gave up {gave_up_ms} ms (its clock) after the provider vanished");
    assert!(gave_up_ms >= limit_ms, "gave up early: {gave_up_ms} ms");
    let real_ms = u64::try_from(real.as_millis()).unwrap();
    assert!(
        gave_up_ms <= limit_ms + 100 + real_ms + 500,
        "{gave_up_ms} ms"
    );
    renter.cancel.cancel();
}

async fn bad_receipt(kind: BadReceipt) {
    let Some(sb) = docker_or_skip("bad_receipt").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let provider = provider_with(
        root,
        &sb,
        lease_template(1, INTERVAL_S, WINDOW_S),
        GRACE_S,
        |_| {},
    )
    .await;
    let mut rsvc = service_config(root, "renter", GRACE_S);
    rsvc.faults = Faults {
        bad_receipt_after: Some((3, kind)),
        ..Faults::default()
    };
    let mut renter = party(root, "renter", common::config(), rsvc, None).await;
    let offer = connect_for_offer(&mut renter, &provider).await;
    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 120, LONG))
        .await
        .unwrap();
    let pdone = closed(&provider.leases, id, 60).await;
    let rdone = closed(&renter.leases, id, 30).await;
    eprintln!("{kind:?}: provider {pdone:#?}\nrenter {rdone:#?}");
    assert_eq!(pdone.close_reason.as_deref(), Some("bad_receipt"));
    assert_eq!(pdone.state, gridlease_contracts::LeaseState::Settled);
    assert_eq!(rdone.state, gridlease_contracts::LeaseState::Settled);
    // Nothing booked from the bad receipt: both statements are the last good receipt (3rd).
    let pl = provider.leases.ledger().await.unwrap();
    let rl = renter.leases.ledger().await.unwrap();
    assert_eq!(pl.total_earned, rl.total_spent);
    assert_eq!(pdone.settled_total, rdone.settled_total);
    assert_eq!(
        pl.leases[0].entries, 3,
        "three receipts booked by the provider"
    );
    assert!(!container_exists(&sb, id).await);
    provider.cancel.cancel();
    renter.cancel.cancel();
    remove_container(&sb, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replayed_receipt_is_refused_and_closes_the_lease() {
    bad_receipt(BadReceipt::Replay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn decreasing_receipt_is_refused_and_closes_the_lease() {
    bad_receipt(BadReceipt::Decreasing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inflated_usage_is_refused_and_closes_the_lease() {
    let Some(sb) = docker_or_skip("inflated_usage").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let provider = provider_with(
        root,
        &sb,
        lease_template(1, INTERVAL_S, WINDOW_S),
        GRACE_S,
        |svc| {
            svc.faults = Faults {
                inflate_usage_from_seq: Some(4),
                ..Faults::default()
            };
        },
    )
    .await;
    let (renter, offer) = renter_of(root, &provider, GRACE_S).await;
    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 120, LONG))
        .await
        .unwrap();
    let rdone = closed(&renter.leases, id, 60).await;
    let pdone = closed(&provider.leases, id, 30).await;
    eprintln!("inflated: renter {rdone:#?}\nprovider {pdone:#?}");
    assert_eq!(rdone.close_reason.as_deref(), Some("implausible_usage"));
    assert_eq!(rdone.state, gridlease_contracts::LeaseState::Settled);
    assert_eq!(pdone.state, gridlease_contracts::LeaseState::Settled);
    // The renter's last accepted report is the 3rd; nothing was booked from the 4th.
    assert_eq!(rdone.usage.as_ref().unwrap().seq, 3);
    let rl = renter.leases.ledger().await.unwrap();
    let pl = provider.leases.ledger().await.unwrap();
    assert_eq!(rl.total_spent, pl.total_earned);
    assert_eq!(rdone.settled_total, pdone.settled_total);
    assert!(rl.leases[0].entries <= 3);
    assert!(!container_exists(&sb, id).await);
    provider.cancel.cancel();
    renter.cancel.cancel();
    remove_container(&sb, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn budget_cap_stops_the_lease_at_the_cap() {
    let Some(Setup {
        sb,
        image,
        dir: _dir,
        provider,
        renter,
        offer,
    }) = setup("budget_cap").await
    else {
        return;
    };
    let mut req = probe_rent(offer, &image, 120, LONG);
    // Five seconds' worth.
    req.max_total = Some(gridlease_contracts::Money::from_micros(5 * PER_S));
    let id = renter.leases.rent(req).await.unwrap();
    let pdone = closed(&provider.leases, id, 60).await;
    let rdone = closed(&renter.leases, id, 30).await;
    eprintln!("budget: provider {pdone:#?}\nrenter {rdone:#?}");
    assert_eq!(pdone.close_reason.as_deref(), Some("budget_exhausted"));
    assert_eq!(pdone.settled_total, Some(5 * PER_S));
    assert_eq!(rdone.settled_total, Some(5 * PER_S));
    let wall = pdone.usage.as_ref().unwrap().wall_ms;
    assert!(
        wall < 5_000 + 2 * u64::from(INTERVAL_S) * 1000 + 2000,
        "ran {wall} ms"
    );
    assert!(!container_exists(&sb, id).await);
    provider.cancel.cancel();
    renter.cancel.cancel();
    remove_container(&sb, id).await;
}
