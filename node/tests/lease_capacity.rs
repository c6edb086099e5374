//! Offers track capacity (issue 21): real nodes on loopback, real Docker. When a lease takes
//! the provider's last free GPU, the provider re-signs its offer with `free_gpus` 0 and another
//! node's book shows it within a second; when the lease ends and its container is gone, the
//! GPU is free again and the offer says so.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::time::{Duration, Instant};

use gridlease_contracts::query::Query;
use lease_support::*;

/// The provider's offer as `observer`'s book holds it: its free GPUs.
async fn free_seen(observer: &Party, provider: &Party) -> Option<u16> {
    let all = observer
        .node
        .node
        .client
        .search(Query::parse("free>=0").unwrap(), 100)
        .await
        .unwrap();
    all.iter()
        .find(|e| e.offer.provider == provider.node.key_public)
        .map(|e| e.offer.free_gpus)
}

/// Waits (5 s at most) until `observer` sees `free` free GPUs in the provider's offer; returns
/// how long that took.
async fn until_free(observer: &Party, provider: &Party, free: u16) -> Duration {
    let t = Instant::now();
    while free_seen(observer, provider).await != Some(free) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the observer still sees {:?} free GPUs, not {free}",
            free_seen(observer, provider).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fully_rented_offer_says_so_within_a_second_and_is_free_again_after_release() {
    let Some(Setup {
        sb,
        image,
        dir,
        provider,
        renter,
        offer,
    }) = setup("lease_capacity", lease_template(1, 1, 10), 10).await
    else {
        return;
    };
    let mut observer = party(
        dir.path(),
        "observer",
        common::config(),
        service_config(dir.path(), "observer", 10),
        None,
    )
    .await;
    connect_for_offer(&mut observer, &provider).await;
    // The observer is in the provider's gossip mesh (so a republished offer reaches it at once).
    let (pc, op) = (provider.node.node.client.clone(), observer.node.peer);
    common::eventually("the observer in the provider's mesh", || {
        let pc = pc.clone();
        async move { pc.mesh_peers().await.unwrap().contains(&op) }
    })
    .await;
    assert_eq!(free_seen(&observer, &provider).await, Some(1));

    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 60, &["sleep", "60", "exit", "0"]))
        .await
        .unwrap();
    let taken = until_free(&observer, &provider, 0).await;
    eprintln!("the observer saw the offer fully rented {taken:?} after the lease was accepted");
    assert!(taken < Duration::from_secs(1), "{taken:?}");
    // A renter's search leaves a fully rented offer out (the API adds `free>=1`).
    let listed = observer
        .node
        .node
        .client
        .search(Query::parse("free>=1").unwrap(), 100)
        .await
        .unwrap();
    assert!(listed.is_empty(), "a fully rented offer is listed");

    renter.leases.stop(id).await.unwrap();
    closed(&provider.leases, id, 30).await;
    let back = until_free(&observer, &provider, 1).await;
    eprintln!("free again {back:?} after the provider settled");
    assert!(back < Duration::from_secs(1), "{back:?}");
    assert!(!container_exists(&sb, id).await);
    for p in [&provider, &renter, &observer] {
        p.cancel.cancel();
    }
}
