//! The lease core (issue 11): GPU holds that follow the container, persist before act,
//! cancel-safe rent, the renter's running view (silence detection on the injected clock is in
//! `lease_faults.rs`). Real
//! nodes on loopback, real Docker with the probe image.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::time::Duration;

use gridlease_node::lease::{Faults, LeaseView, RentError};
use gridlease_node::store::Role;
use gridlease_protocol::RejectReason;
use lease_support::*;

/// 1 s reports, 3 s pay-ahead window, 3 s grace.
const INTERVAL_S: u32 = 1;
const WINDOW_S: u32 = 3;
const GRACE_S: u32 = 3;
/// Cost of one second of one GPU at [`PRICE`].
const PER_S: u64 = 1000;

/// A view's state as its JSON name.
fn state(v: &LeaseView) -> String {
    serde_json::to_value(v.state)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

/// A long-running probe.
const LONG: &[&str] = &["sentinel", "UP", "sleep", "120", "exit", "0"];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gpu_stays_held_while_a_slow_start_outlasts_the_lease_duration() {
    let Some(sb) = docker_or_skip("slow_start_holds").await else {
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
            // The image "pull" takes 4 s; the first lease lasts 2 s.
            svc.faults = Faults {
                slow_start: Some(Duration::from_secs(4)),
                ..Faults::default()
            };
        },
    )
    .await;
    let mut first = party(
        root,
        "first",
        common::config(),
        service_config(root, "first", GRACE_S),
        None,
    )
    .await;
    let mut second = party(
        root,
        "second",
        common::config(),
        service_config(root, "second", GRACE_S),
        None,
    )
    .await;
    let offer = connect_for_offer(&mut first, &provider).await;
    let offer2 = connect_for_offer(&mut second, &provider).await;
    assert_eq!(offer, offer2);

    let a = first
        .leases
        .rent(probe_rent(offer, &image, 2, &["exit", "0"]))
        .await
        .unwrap();
    // The first lease's duration passes long before its container exists; its GPU stays
    // held until the container is gone.
    let mut refused = 0u32;
    let b = loop {
        match second
            .leases
            .rent(probe_rent(offer, &image, 2, &["exit", "0"]))
            .await
        {
            Ok(b) => break b,
            Err(RentError::Rejected(RejectReason::NoCapacity { free: 0 })) => {
                refused += 1;
                let pa = provider.leases.lease(a).await.unwrap().unwrap();
                assert!(
                    !pa.is_terminal() || !container_exists(&sb, a).await,
                    "refused while the first lease is over: {pa:#?}"
                );
            }
            Err(e) => panic!("unexpected: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(refused < 300, "the second lease was never accepted");
    };
    // Accepted only once the first lease's container is gone.
    let pa = provider.leases.lease(a).await.unwrap().unwrap();
    eprintln!("first lease when the second was accepted: {pa:#?} (refused {refused} times)");
    assert!(pa.is_terminal(), "{pa:#?}");
    assert!(!container_exists(&sb, a).await);
    assert!(
        refused >= 10,
        "refused only {refused} times during a 4 s start"
    );
    let _ = closed(&provider.leases, b, 60).await;
    for p in [&provider, &first, &second] {
        p.cancel.cancel();
    }
    remove_container(&sb, a).await;
    remove_container(&sb, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_receipt_the_renter_cannot_store_is_not_sent_and_the_ledgers_still_agree() {
    let Some(sb) = docker_or_skip("store_fails").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // A window long enough that the provider keeps running while the renter cannot pay.
    let (provider, renter, offer) =
        market(dir.path(), &sb, lease_template(1, INTERVAL_S, 10), GRACE_S).await;
    let id = renter
        .leases
        .rent(probe_rent(
            offer,
            &image,
            8,
            &["sentinel", "UP", "sleep", "6", "exit", "0"],
        ))
        .await
        .unwrap();
    wait_view(&provider.leases, id, "2 s paid", |v| v.paid >= 2 * PER_S).await;
    // The renter's database refuses writes (as on a full disk).
    renter
        .node
        .store
        .call(|s| s.set_query_only(true))
        .await
        .unwrap();
    let paid_before = provider.leases.lease(id).await.unwrap().unwrap().paid;
    let rows_before = renter.leases.ledger().await.unwrap().leases[0].entries;
    // Two reports arrive meanwhile; neither is answered with a receipt.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let p = provider.leases.lease(id).await.unwrap().unwrap();
    let r = renter.leases.lease(id).await.unwrap().unwrap();
    assert!(
        p.usage.as_ref().unwrap().wall_ms >= 4_000,
        "reports kept coming: {p:#?}"
    );
    assert_eq!(p.paid, paid_before, "no receipt reached the provider");
    assert_eq!(
        r.paid, paid_before,
        "the renter did not count what it could not store"
    );
    assert_eq!(
        renter.leases.ledger().await.unwrap().leases[0].entries,
        rows_before
    );
    renter
        .node
        .store
        .call(|s| s.set_query_only(false))
        .await
        .unwrap();
    let pdone = closed(&provider.leases, id, 60).await;
    let rdone = closed(&renter.leases, id, 30).await;
    eprintln!("provider {pdone:#?}\nrenter {rdone:#?}");
    assert!(pdone.paid > paid_before, "receipts resumed after recovery");
    assert_eq!(pdone.settled_total, rdone.settled_total);
    let pl = provider.leases.ledger().await.unwrap();
    let rl = renter.leases.ledger().await.unwrap();
    assert_eq!(pl.total_earned, rl.total_spent);
    assert!(pl.balanced && rl.balanced);
    assert_eq!(state(&pdone), "settled");
    assert_eq!(state(&rdone), "settled");
    provider.cancel.cancel();
    renter.cancel.cancel();
    remove_container(&sb, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rent_dropped_right_after_negotiation_still_runs_and_settles() {
    let Some(Setup {
        sb,
        image,
        dir: _dir,
        provider,
        renter,
        offer,
    }) = setup(
        "rent_dropped",
        lease_template(1, INTERVAL_S, WINDOW_S),
        GRACE_S,
    )
    .await
    else {
        return;
    };
    // Drop the caller the moment the provider has stored the lease it accepts: the renter
    // is then still finishing the negotiation (verifying, storing its copy with an fsync,
    // registering its session). A rent that still won the race is stopped and tried again.
    let pstore = provider.node.store.clone();
    let mut stored = None;
    for _attempt in 0..3 {
        let seen = pstore
            .call(|s| s.leases(Some(Role::Provider)))
            .await
            .unwrap()
            .len();
        let mut rent = Box::pin(renter.leases.rent(probe_rent(
            offer,
            &image,
            3,
            &["burn", "1", "1", "exit", "0"],
        )));
        let dropped = loop {
            tokio::select! {
                r = &mut rent => {
                    let id = r.unwrap();
                    renter.leases.stop(id).await.unwrap();
                    let _ = closed(&provider.leases, id, 30).await;
                    break None;
                }
                () = tokio::time::sleep(Duration::from_micros(100)) => {
                    let all = pstore.call(|s| s.leases(Some(Role::Provider))).await.unwrap();
                    if all.len() > seen {
                        break all.last().map(|l| l.lease.id);
                    }
                }
            }
        };
        drop(rent);
        if dropped.is_some() {
            stored = dropped;
            break;
        }
    }
    let stored = stored.expect("three rents finished before the drop; cannot test it");
    // The dropped rent still finishes: the renter stores its copy and runs the session.
    let rstore = renter.node.store.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while rstore
        .call(move |s| s.lease(&stored))
        .await
        .unwrap()
        .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the renter never stored the lease its dropped rent negotiated"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rdone = closed(&renter.leases, stored, 60).await;
    let pdone = closed(&provider.leases, stored, 30).await;
    eprintln!("renter {rdone:#?}\nprovider {pdone:#?}");
    assert_eq!(state(&rdone), "settled");
    assert_eq!(state(&pdone), "settled");
    assert_eq!(rdone.exit_code, Some(0));
    assert_eq!(rdone.settled_total, pdone.settled_total);
    assert_eq!(
        renter.leases.ledger().await.unwrap().total_spent,
        provider.leases.ledger().await.unwrap().total_earned
    );
    provider.cancel.cancel();
    renter.cancel.cancel();
    remove_container(&sb, stored).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_renter_sees_running_with_a_start_time_and_a_decreasing_time_left() {
    let Some(Setup {
        sb,
        image,
        dir: _dir,
        provider,
        renter,
        offer,
    }) = setup(
        "renter_running",
        lease_template(1, INTERVAL_S, WINDOW_S),
        GRACE_S,
    )
    .await
    else {
        return;
    };
    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 60, LONG))
        .await
        .unwrap();
    let first = wait_view(&renter.leases, id, "running on the renter", |v| {
        state(v) == "running"
    })
    .await;
    let started = first.started_at.expect("a start time");
    let left = first.time_left_s.expect("time left");
    assert!((50..=60).contains(&left), "{first:#?}");
    let later = wait_view(&renter.leases, id, "time left to decrease", |v| {
        v.time_left_s.is_some_and(|l| l + 2 <= left)
    })
    .await;
    assert_eq!(state(&later), "running");
    assert_eq!(later.started_at, Some(started));
    assert!(later.cost_so_far > 0, "{later:#?}");
    // The provider's start and the renter's agree to within a report interval.
    let p = provider.leases.lease(id).await.unwrap().unwrap();
    let ps = p.started_at.unwrap();
    assert!(
        ps.abs_diff(started) <= 1500,
        "provider {ps} renter {started}"
    );
    renter.leases.stop(id).await.unwrap();
    let _ = closed(&renter.leases, id, 30).await;
    let _ = closed(&provider.leases, id, 30).await;
    provider.cancel.cancel();
    renter.cancel.cancel();
    remove_container(&sb, id).await;
}

/// A provider stopped between creating a lease's container and recording it running (the
/// container's id is written with `running`, not before) resumes the start when it comes
/// back: the container left behind, found by its name, is replaced by a new one that runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_start_stopped_after_create_is_resumed_with_a_fresh_container() {
    let Some(sb) = docker_or_skip("start_resumed_after_create").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let template = lease_template(1, INTERVAL_S, WINDOW_S);
    // A long grace: the renter waits out the provider's restart.
    let provider = provider_with(root, &sb, template.clone(), 30, |svc| {
        svc.faults = Faults {
            stop_after_create: true,
            ..Faults::default()
        };
    })
    .await;
    let mut renter = party(
        root,
        "renter",
        common::config(),
        service_config(root, "renter", 30),
        None,
    )
    .await;
    let offer = connect_for_offer(&mut renter, &provider).await;
    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 30, LONG))
        .await
        .unwrap();
    let name = format!("gridlease-{id}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let first = loop {
        if let Ok(c) = sb.inspect(&name).await {
            break c.id.unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no container created"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let v = provider.leases.lease(id).await.unwrap().unwrap();
    assert_eq!(state(&v), "starting", "{v:#?}");

    // The provider stops and comes back from its home, without the fault.
    provider.cancel.cancel();
    let home = common::stop(provider.node).await;
    let provider =
        provider_from_home(&home, &sb, template, service_config(root, "provider", 30)).await;
    let v = wait_view(&provider.leases, id, "the resumed lease running", |v| {
        state(v) == "running"
    })
    .await;
    let now = sb.inspect(&name).await.unwrap();
    assert_ne!(
        now.id.as_deref(),
        Some(first.as_str()),
        "the old container runs"
    );
    assert_eq!(now.state.and_then(|s| s.running), Some(true), "{v:#?}");
    provider.cancel.cancel();
    renter.cancel.cancel();
    remove_container(&sb, id).await;
}
