//! Upload holds (issue 13, `rent --upload`, `LeaseTerms::upload_hold_s`): real nodes, real
//! Docker. A lease that asks for a hold gets its container created and not started; both
//! sides' views say until when; the command starts when the renter begins it, or when the
//! hold runs out (the provider's injected clock advanced past it); a stop during the hold
//! costs the renter the minimum billed duration, on both ledgers, and removes the container; a
//! second hold of the same renter while one is held is refused (issue 41 item 6); more hold than
//! the offer gives is refused before anything is signed.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use gridlease_contracts::LeaseState;
use gridlease_node::clock;
use gridlease_sandbox::Sandbox;
use lease_support::*;

/// The daemon's word for the container's state (`created`, `running`, `exited`).
async fn docker_state(sb: &Sandbox, id: gridlease_protocol::LeaseId) -> String {
    sb.inspect(&format!("gridlease-{id}"))
        .await
        .ok()
        .and_then(|i| i.state?.status)
        .map(|s| s.to_string())
        .unwrap_or_else(|| "gone".into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_held_container_starts_when_the_renter_begins_or_its_hold_runs_out() {
    let test = "lease_upload_hold";
    let Some(sb) = docker_or_skip(test).await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut template = lease_template(2, 1, 10);
    template.sandbox.upload_hold_s = 120;
    let clock = clock::ManualClock::new();
    let pclock = clock.clone();
    let provider = provider_with(root, &sb, template, 10, |svc| svc.clock = pclock).await;
    let (renter, offer) = renter_of(root, &provider, 10).await;

    // More hold than the offer gives is refused before anything is signed.
    let mut req = probe_rent(offer, &image, 30, &["sentinel", "RAN", "exit", "0"]);
    req.upload_hold_s = 121;
    let err = renter.leases.rent(req.clone()).await.unwrap_err();
    assert!(err.to_string().contains("at most 120 s"), "{err}");
    assert!(renter.leases.leases().await.unwrap().is_empty());

    // Held: created, not started, until the renter begins it.
    req.upload_hold_s = 120;
    let id = renter.leases.rent(req.clone()).await.unwrap();
    let held = wait_view(&provider.leases, id, "the hold (provider)", |v| {
        v.upload_until.is_some()
    })
    .await;
    assert_eq!(held.state, LeaseState::Starting, "{held:#?}");
    let until = held.upload_until.unwrap();
    let now = clock::now().0;
    assert!(
        until > now + 110_000 && until <= now + 120_000,
        "held for the terms' 120 s: {until} vs {now}"
    );
    let rheld = wait_view(&renter.leases, id, "the hold (renter)", |v| {
        v.upload_until.is_some()
    })
    .await;
    assert_eq!(
        rheld.upload_until,
        Some(until),
        "the renter is told until when"
    );
    assert_eq!(docker_state(&sb, id).await, "created");
    assert_eq!(rheld.paid, 0, "a hold is not billed while it lasts");
    // One held container per renter: a second is refused before anything is signed.
    let err = renter.leases.rent(req.clone()).await.unwrap_err();
    assert!(
        matches!(
            err,
            gridlease_node::lease::RentError::Rejected(gridlease_protocol::RejectReason::HoldBusy)
        ),
        "{err}"
    );
    renter.leases.begin(id).await.unwrap();
    let done = closed(&renter.leases, id, 60).await;
    assert_eq!(
        done.close_reason.as_deref(),
        Some("container_exited"),
        "{done:#?}"
    );
    assert_eq!(done.exit_code, Some(0));
    let (out, _) = read_logs(&renter.leases, id).await;
    assert!(
        String::from_utf8_lossy(&out).contains("RAN"),
        "the command ran"
    );
    assert!(done.upload_until.is_none(), "no hold once it ran");

    // Stopped during the hold: the renter pays the minimum billed duration, both sides
    // agree, the container is removed.
    let third = renter.leases.rent(req.clone()).await.unwrap();
    wait_view(&renter.leases, third, "the third hold", |v| {
        v.upload_until.is_some()
    })
    .await;
    renter.leases.stop(third).await.unwrap();
    let rdone = closed(&renter.leases, third, 60).await;
    let pdone = closed(&provider.leases, third, 30).await;
    assert_eq!(rdone.state, LeaseState::Settled, "{rdone:#?}");
    assert_eq!(pdone.state, LeaseState::Settled, "{pdone:#?}");
    let fee =
        u64::from(rdone.min_billed_s) * rdone.price_per_gpu_hour * u64::from(rdone.gpus) / 3600;
    assert!(fee > 0);
    assert_eq!(rdone.settled_total, Some(fee), "{rdone:#?}");
    assert_eq!(pdone.settled_total, Some(fee), "{pdone:#?}");
    assert_eq!(rdone.close_reason, pdone.close_reason);
    let (earned, _) = provider.leases.ledger_totals().await.unwrap();
    let (_, spent) = renter.leases.ledger_totals().await.unwrap();
    assert_eq!(earned, spent, "both ledgers record it");
    assert!(rdone.started_at.is_none(), "the command never ran");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while container_exists(&sb, third).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held container outlived the stop"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Nobody begins it: the command starts when the hold runs out (the provider's clock).
    // (Last: the advanced clock makes later requests look stale to the provider.)
    let second = renter.leases.rent(req).await.unwrap();
    wait_view(&provider.leases, second, "the second hold", |v| {
        v.upload_until.is_some()
    })
    .await;
    assert_eq!(docker_state(&sb, second).await, "created");
    clock.advance(121_000);
    let done = closed(&renter.leases, second, 60).await;
    assert_eq!(
        done.close_reason.as_deref(),
        Some("container_exited"),
        "started when the hold ran out: {done:#?}"
    );
    assert_eq!(done.exit_code, Some(0));
    // Nothing of the three leases is left once the provider has closed them.
    closed(&provider.leases, second, 30).await;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    for id in [id, third, second] {
        let volume = gridlease_sandbox::workspace::volume_name(&id);
        while container_exists(&sb, id).await || sb.docker().inspect_volume(&volume).await.is_ok() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "lease {id}'s container or workspace outlived it"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
}
