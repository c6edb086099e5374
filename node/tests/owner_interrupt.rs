//! Interruptible offers (issue 18, `provide --interruptible`, `Offer::interruptible`): real
//! nodes on loopback, real Docker, the scripted GPU probe. When the owner's process appears on
//! a GPU an interruptible lease holds, the provider stops that lease (close reason
//! `owner_reclaimed`) within 2 s, and both ledgers equal the price times the seconds it ran;
//! a lease of a non-interruptible offer keeps running while the unleased GPU is withdrawn.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::path::Path;
use std::time::{Duration, Instant};

use gridlease_contracts::query::Query;
use gridlease_contracts::{Money, cost};
use gridlease_node::lease::{ProvideSettings, SharedGpuSampler};
use gridlease_protocol::{NetworkPolicy, OfferId};
use gridlease_sandbox::gpu::{GpuProbe as _, ScriptedProbe};
use lease_support::*;

/// A scripted sampler for the template's GPUs: one process (the owner's, on the host) on each
/// while `owner` exists.
fn scripted(template: &gridlease_node::net::OfferTemplate, owner: &Path) -> SharedGpuSampler {
    let n = template.gpus.len();
    let mut probe = ScriptedProbe::from_dev_spec(&format!("{n}x RTX 4090:24GiB:3.60")).unwrap();
    let curve = format!(
        r#"{{"util_percent":[0],"vram_used_mib":[300],"owner_file":{}}}"#,
        serde_json::to_string(owner).unwrap()
    );
    probe
        .set_curves_json(&format!("[{}]", vec![curve; n].join(",")))
        .unwrap();
    let uuids: Vec<String> = probe.list().unwrap().into_iter().map(|g| g.uuid).collect();
    SharedGpuSampler {
        ids: template
            .gpus
            .iter()
            .zip(uuids)
            .map(|(g, u)| (g.spec.uuid_digest, u))
            .collect(),
        sampler: std::sync::Arc::new(probe),
        source: gridlease_protocol::telemetry::TelemetrySource::Scripted,
    }
}

/// The provider's offer in `observer`'s book.
async fn seen(observer: &Party, provider: &Party) -> Option<(OfferId, u16, bool)> {
    let all = observer
        .node
        .node
        .client
        .search(Query::parse("free>=0").unwrap(), 100)
        .await
        .unwrap();
    all.iter()
        .find(|e| e.offer.provider == provider.node.key_public)
        .map(|e| (e.id, e.offer.free_gpus, e.offer.interruptible))
}

async fn wait_seen(
    observer: &Party,
    provider: &Party,
    what: &str,
    f: impl Fn(OfferId, u16, bool) -> bool,
) -> OfferId {
    let t = Instant::now();
    loop {
        if let Some((id, free, i)) = seen(observer, provider).await
            && f(id, free, i)
        {
            return id;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}: {:?}",
            seen(observer, provider).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A provider of 2 GPUs whose owner is scripted by `owner`, offering with `interruptible`,
/// and a renter holding that offer.
async fn market_of(
    root: &Path,
    sb: &gridlease_sandbox::Sandbox,
    owner: &Path,
    interruptible: bool,
) -> (Party, Party, OfferId) {
    let mut template = lease_template(2, 1, 10);
    // A minimum longer than the leases run: a reclaimed lease must not pay it.
    template.min_billed_s = 60;
    let sampler = scripted(&template, owner);
    let provider = provider_with(root, sb, template, 10, |svc| {
        svc.gpu_sampler = Some(sampler);
        svc.owner_idle = Duration::from_secs(2);
    })
    .await;
    let (renter, first) = renter_of(root, &provider, 10).await;
    provider
        .leases
        .provide(ProvideSettings {
            price_per_gpu_hour: Money::from_micros(PRICE),
            gpus: None,
            max_hours: None,
            network_policy: NetworkPolicy::None,
            images: provider.leases.base_images(),
            hours: "always".parse().unwrap(),
            tz: None,
            interruptible,
            enabled: true,
        })
        .await
        .unwrap();
    let offer = wait_seen(&renter, &provider, "the re-signed offer", |id, free, i| {
        id != first && free == 2 && i == interruptible
    })
    .await;
    (provider, renter, offer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_interruptible_lease_is_stopped_for_the_owner_and_billed_to_the_second() {
    let Some(sb) = docker_or_skip("owner_interrupt").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let owner = dir.path().join("owner-at-the-keyboard");
    let (provider, renter, offer) = market_of(dir.path(), &sb, &owner, true).await;

    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 60, &["sleep", "60", "exit", "0"]))
        .await
        .unwrap();
    wait_view(&provider.leases, id, "the lease to run", |v| {
        v.started_at.is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;

    // The owner starts a process on the GPUs.
    let t0 = gridlease_node::clock::now();
    std::fs::write(&owner, b"").unwrap();
    let pdone = closed(&provider.leases, id, 30).await;
    let done = closed(&renter.leases, id, 30).await;
    let stopped_after = pdone.closed_at.unwrap().saturating_sub(t0.0);
    eprintln!("stopped {stopped_after} ms after the owner's process appeared");
    assert!(stopped_after <= 2000, "{stopped_after} ms");
    assert_eq!(pdone.close_reason.as_deref(), Some("owner_reclaimed"));
    assert_eq!(
        done.close_reason.as_deref(),
        Some("owner_reclaimed"),
        "{done:#?}"
    );
    assert!(!container_exists(&sb, id).await);

    // Billed exactly what ran: price x seconds, on both sides, although the offer's minimum
    // is 60 s (the owner, not the renter, ended it).
    let wall_ms = done.usage.as_ref().unwrap().wall_ms;
    let billed_s = (wall_ms / 1000).max(1);
    let expected = cost(billed_s, 1, Money::from_micros(PRICE))
        .unwrap()
        .micros();
    assert_eq!(expected, billed_s * 1000);
    let ran_ms = pdone.closed_at.unwrap() - pdone.started_at.unwrap();
    assert!(
        wall_ms <= ran_ms + 1000 && wall_ms + 2000 >= ran_ms,
        "wall {wall_ms} ms, ran {ran_ms} ms"
    );
    assert_eq!(done.settled_total, Some(expected), "renter statement");
    assert_eq!(pdone.settled_total, Some(expected), "provider statement");
    let (rl, pl) = (
        renter.leases.ledger().await.unwrap(),
        provider.leases.ledger().await.unwrap(),
    );
    assert!(rl.balanced && pl.balanced);
    assert_eq!(rl.total_spent, expected);
    assert_eq!(pl.total_earned, expected);

    // Both GPUs are the owner's now: the offer says so.
    wait_seen(&renter, &provider, "the offer withdrawn", |_, free, _| {
        free == 0
    })
    .await;
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_of_a_non_interruptible_offer_keeps_running_while_the_free_gpu_is_withdrawn() {
    let Some(sb) = docker_or_skip("owner_interrupt").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let owner = dir.path().join("owner-at-the-keyboard");
    let (provider, renter, offer) = market_of(dir.path(), &sb, &owner, false).await;

    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 60, &["sleep", "60", "exit", "0"]))
        .await
        .unwrap();
    wait_view(&provider.leases, id, "the lease to run", |v| {
        v.started_at.is_some()
    })
    .await;
    wait_seen(&renter, &provider, "one GPU free", |_, free, _| free == 1).await;

    // The owner uses both GPUs: the free one is withdrawn at once, the lease keeps running.
    std::fs::write(&owner, b"").unwrap();
    let t = Instant::now();
    wait_seen(
        &renter,
        &provider,
        "the free GPU withdrawn",
        |_, free, _| free == 0,
    )
    .await;
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let v = provider.leases.lease(id).await.unwrap().unwrap();
    assert!(v.closed_at.is_none(), "stopped: {v:#?}");
    assert!(container_exists(&sb, id).await);

    renter.leases.stop(id).await.unwrap();
    let done = closed(&renter.leases, id, 30).await;
    assert_eq!(done.close_reason.as_deref(), Some("renter_stop"));
    // The provider has closed it too, and removed its container, before the nodes stop (else
    // the test would leave a stopped container behind).
    closed(&provider.leases, id, 30).await;
    let sbc = sb.clone();
    common::eventually("the lease's container removed", || {
        let sb = sbc.clone();
        async move { !container_exists(&sb, id).await }
    })
    .await;
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_interruptible_lease_is_stopped_when_the_offered_hours_end() {
    let Some(sb) = docker_or_skip("owner_interrupt").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let clock = gridlease_node::clock::ManualClock::new();
    let pclock = clock.clone();
    let template = lease_template(1, 1, 10);
    let provider = provider_with(root, &sb, template, 10, |svc| {
        svc.clock = pclock;
    })
    .await;
    // A renter grace longer than the clock's jump: silence by the provider's clock does not
    // close the lease first.
    let (renter, first) = renter_of(root, &provider, 400).await;
    // Hours from now to two to three minutes from now (UTC).
    use gridlease_node::clock::Clock as _;
    let now = clock.now().0;
    let minute = |ms: u64| u16::try_from((ms / 60_000) % 1440).unwrap();
    let end_ms = (now / 60_000 + 3) * 60_000;
    let hours = format!(
        "{}-{}",
        gridlease_contracts::schedule::hhmm(minute(now)),
        gridlease_contracts::schedule::hhmm(minute(end_ms))
    );
    provider
        .leases
        .provide(ProvideSettings {
            price_per_gpu_hour: Money::from_micros(PRICE),
            gpus: None,
            max_hours: None,
            network_policy: NetworkPolicy::None,
            images: provider.leases.base_images(),
            hours: hours.parse().unwrap(),
            tz: Some("UTC".into()),
            interruptible: true,
            enabled: true,
        })
        .await
        .unwrap();
    let offer = wait_seen(&renter, &provider, "the re-signed offer", |id, free, i| {
        id != first && free == 1 && i
    })
    .await;
    let id = renter
        .leases
        .rent(probe_rent(
            offer,
            &image,
            600,
            &["sleep", "600", "exit", "0"],
        ))
        .await
        .unwrap();
    wait_view(&provider.leases, id, "the lease to run", |v| {
        v.started_at.is_some()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The hours end (the provider's clock jumps past them, well before the lease's own end):
    // the lease is stopped.
    clock.advance(end_ms + 100 - clock.now().0);
    let t = Instant::now();
    let pdone = closed(&provider.leases, id, 30).await;
    let done = closed(&renter.leases, id, 30).await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(pdone.close_reason.as_deref(), Some("owner_reclaimed"));
    assert_eq!(done.close_reason.as_deref(), Some("owner_reclaimed"));
    assert_eq!(done.settled_total, pdone.settled_total);
    assert!(done.settled_total.unwrap() > 0);
    wait_seen(&renter, &provider, "the offer withdrawn", |_, free, _| {
        free == 0
    })
    .await;
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
}
