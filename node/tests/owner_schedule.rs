//! The provider's availability schedule (issue 18, `provide --hours .. --tz ..`): real nodes on
//! loopback, no Docker (no lease runs). Outside the hours the provider's offer says 0 free GPUs
//! (another node's book shows it); at the window's start it is free again, at its end withdrawn
//! again. The provider's lease service runs on an injected clock that the test moves to the
//! window's edges instead of waiting for them.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::time::{Duration, Instant};

use gridlease_contracts::Money;
use gridlease_contracts::query::Query;
use gridlease_contracts::schedule::hhmm;
use gridlease_node::clock::{self, Clock as _};
use gridlease_node::lease::ProvideSettings;
use gridlease_protocol::NetworkPolicy;
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

/// Waits (5 s at most) until `observer` sees `free` free GPUs in the provider's offer.
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
async fn the_offer_is_withdrawn_outside_the_hours_and_back_at_the_window_start() {
    common::init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let clock = clock::ManualClock::new();
    let template = lease_template(2, 1, 10);
    let mut pc = common::config();
    let mut svc = service_config(root, "provider", 10);
    svc.base_template = Some(template.clone());
    svc.clock = clock.clone();
    svc.provide_file = Some(root.join("provide.json"));
    pc.offer = Some(template);
    let provider = party(root, "provider", pc, svc, None).await;
    let (observer, _) = renter_of(root, &provider, 10).await;
    assert_eq!(free_seen(&observer, &provider).await, Some(2));

    // A window of two minutes that starts two to three minutes from now (UTC, minutes).
    let now = clock.now().0;
    let minute = |ms: u64| u16::try_from((ms / 60_000) % 1440).unwrap();
    let start_ms = (now / 60_000 + 3) * 60_000;
    let end_ms = start_ms + 2 * 60_000;
    let hours = format!("{}-{}", hhmm(minute(start_ms)), hhmm(minute(end_ms)));
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
            interruptible: false,
            enabled: true,
        })
        .await
        .unwrap();
    let s = provider.leases.schedule().unwrap();
    assert!(!s.availability.offered);
    assert_eq!(s.availability.until.unwrap().0, start_ms);
    assert_eq!(
        s.sentence(),
        format!("not offered until {} UTC", hhmm(minute(start_ms)))
    );
    let out = until_free(&observer, &provider, 0).await;
    eprintln!("withdrawn {out:?} after the hours were set");

    // The window opens (the provider's clock jumps to 100 ms past its start).
    clock.advance(start_ms + 100 - clock.now().0);
    let back = until_free(&observer, &provider, 2).await;
    eprintln!("offered again {back:?} after the window's start");
    assert!(back < Duration::from_secs(2), "{back:?}");
    let s = provider.leases.schedule().unwrap();
    assert!(s.availability.offered);
    assert_eq!(
        s.sentence(),
        format!("offered until {} UTC", hhmm(minute(end_ms)))
    );

    // ... and closes.
    clock.advance(end_ms + 100 - clock.now().0);
    let gone = until_free(&observer, &provider, 0).await;
    eprintln!("withdrawn {gone:?} after the window's end");
    assert!(gone < Duration::from_secs(2), "{gone:?}");

    // The hours are kept where `provide` keeps its settings (a restart reads them).
    let saved = ProvideSettings::load(&root.join("provide.json"))
        .unwrap()
        .unwrap();
    assert_eq!(saved.hours.to_string(), hours);
    assert_eq!(saved.tz.as_deref(), Some("UTC"));

    // `always` clears them: offered at once.
    let mut always = saved.clone();
    always.hours = "always".parse().unwrap();
    provider.leases.provide(always).await.unwrap();
    until_free(&observer, &provider, 2).await;
    assert_eq!(
        provider.leases.schedule().unwrap().sentence(),
        "offered always"
    );
    for p in [&provider, &observer] {
        p.cancel.cancel();
    }
}
