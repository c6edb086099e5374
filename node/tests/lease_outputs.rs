//! Kept outputs (issue 13, `LeaseTerms::output_retention_s`): real nodes, real Docker. A
//! finished lease that asked for it leaves its container stopped and its workspace in place,
//! both sides' views say until when, the lease's GPU is free at once for the next renter, and
//! once the time is up (the provider's injected clock advanced past it) the sweep removes the
//! container and the workspace. While they are kept, the disk they take comes out of the
//! offer's.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::time::Duration;

use gridlease_node::clock;
use lease_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kept_outputs_free_the_gpu_and_go_when_their_time_is_up() {
    let test = "lease_outputs";
    let Some(sb) = docker_or_skip(test).await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut template = lease_template(1, 1, 10);
    template.sandbox.output_retention_s = 120;
    template.per_gpu.disk_gib = 2;
    let clock = clock::ManualClock::new();
    let pclock = clock.clone();
    let provider = provider_with(root, &sb, template, 10, |svc| {
        svc.clock = pclock;
        svc.outputs_sweep = Duration::from_millis(100);
    })
    .await;
    let (renter, offer) = renter_of(root, &provider, 10).await;
    let client = provider.node.node.client.clone();
    let disk = || {
        let c = client.clone();
        async move { c.own_offer().await.unwrap().unwrap().offer.per_gpu.disk_gib }
    };
    let wait_disk = |want: u32, what: &'static str| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while disk().await != want {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_eq!(disk().await, 2);

    // More than the offer keeps is refused before anything is signed.
    let mut req = probe_rent(
        offer,
        &image,
        30,
        &["write", "/workspace/result", "exit", "0"],
    );
    req.keep_outputs_s = 121;
    let err = renter.leases.rent(req.clone()).await.unwrap_err();
    assert!(err.to_string().contains("at most 120 s"), "{err}");
    assert!(renter.leases.leases().await.unwrap().is_empty());

    req.keep_outputs_s = 60;
    let id = renter.leases.rent(req).await.unwrap();
    let done = closed(&renter.leases, id, 60).await;
    let pdone = closed(&provider.leases, id, 30).await;
    assert_eq!(
        done.close_reason.as_deref(),
        Some("container_exited"),
        "{done:#?}"
    );
    let until = pdone.outputs_until.expect("the provider keeps the outputs");
    assert_eq!(until, pdone.closed_at.unwrap() + 60_000);
    assert!(
        done.outputs_until.is_some(),
        "the renter's view says so too"
    );
    let name = format!("gridlease-{id}");
    let info = sb.inspect(&name).await.unwrap();
    assert_eq!(info.state.unwrap().running, Some(false), "kept, stopped");
    let volume = gridlease_sandbox::workspace::volume_name(&id);
    assert!(
        sb.docker().inspect_volume(&volume).await.is_ok(),
        "workspace kept"
    );
    // What it takes on disk (a few MiB, counted in whole GiB) is out of the offer's disk.
    wait_disk(1, "the offer's disk does not drop while outputs are kept").await;

    // The lease's one GPU is free again at once: the next lease is accepted.
    let next = renter
        .leases
        .rent(probe_rent(offer, &image, 30, &["exit", "0"]))
        .await
        .expect("the GPU of a lease with kept outputs is free");
    closed(&renter.leases, next, 60).await;

    // Past their time (by the provider's clock) the sweep removes them.
    clock.advance(61_000);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sb.inspect(&name).await.is_ok() || sb.docker().inspect_volume(&volume).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "kept outputs not removed after their time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_disk(
        2,
        "the offer's disk does not come back once the outputs are gone",
    )
    .await;
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
}
