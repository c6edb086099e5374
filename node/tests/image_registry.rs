//! Images from a real registry (issue 12 image policy, issue 13 failures explained): Debian's
//! `docker-registry` on loopback, images pushed by the real daemon, real nodes, real Docker.
//! Refusals happen before the provider signs (no lease is stored on either side); a pull
//! that stalls mid-layer fails the lease with that reason, on the renter's side too, and costs
//! the renter the minimum billed duration on both ledgers.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;
mod registry_support;

use std::time::Duration;

use gridlease_node::lease::RentError;
use gridlease_protocol::{ImageRefusal, ImageSize, RejectReason};
use lease_support::*;
use registry_support::*;

const GRACE_S: u32 = 3;

/// A provider whose template pulls only from `registry` (its lease service adjusted by
/// `provider`) and a renter (adjusted by `renter`) holding its offer.
async fn registry_market(
    root: &std::path::Path,
    sb: &gridlease_sandbox::Sandbox,
    registry: &str,
    provider: impl FnOnce(&mut gridlease_node::lease::LeaseServiceConfig),
    renter: impl FnOnce(&mut gridlease_node::lease::LeaseServiceConfig),
) -> (Party, Party, gridlease_protocol::OfferId) {
    let mut template = lease_template(1, 1, 3);
    template.images.registries = vec![registry.to_string()];
    let p = provider_with(root, sb, template, GRACE_S, provider).await;
    let mut rc = service_config(root, "renter", GRACE_S);
    renter(&mut rc);
    let mut r = party(root, "renter", common::config(), rc, None).await;
    let offer = connect_for_offer(&mut r, &p).await;
    (p, r, offer)
}

/// The lease was refused before signing: neither side stored it.
async fn nothing_stored(provider: &Party, renter: &Party) {
    assert!(provider.leases.leases().await.unwrap().is_empty());
    assert!(renter.leases.leases().await.unwrap().is_empty());
}

/// Rents once the provider's GPU is free again (see [`refused`]).
async fn rent_when_free(
    renter: &Party,
    req: gridlease_node::lease::RentRequest,
) -> gridlease_protocol::LeaseId {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match renter.leases.rent(req.clone()).await {
            Ok(id) => return id,
            Err(RentError::Rejected(RejectReason::NoCapacity { .. }))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("rent: {e:?}"),
        }
    }
}

/// Rents and returns the image refusal; waits out `NoCapacity` (the GPU of a lease that just
/// ended is held until its session has removed the container).
async fn refused(renter: &Party, req: gridlease_node::lease::RentRequest) -> ImageRefusal {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match renter.leases.rent(req.clone()).await {
            Err(RentError::Rejected(RejectReason::ImageRefused { refusal })) => return refusal,
            Err(RentError::Rejected(RejectReason::NoCapacity { .. }))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("not an image refusal: {other:?}"),
        }
    }
}

/// A name the offer's own image rules refuse (from the reference alone): the renter's node says
/// so before it asks (`RentError::ImageNotOffered`, nothing sent); the same request sent
/// straight to the provider, as a renter that skips that check would, is refused there too,
/// before signing, for the same reason. Returns the refusal.
async fn refused_by_both(
    renter: &Party,
    offer: gridlease_protocol::OfferId,
    image: &str,
) -> ImageRefusal {
    let req = probe_rent(offer, image, 30, &[]);
    let local = match renter.leases.rent(req.clone()).await {
        Err(RentError::ImageNotOffered { refusal, .. }) => refusal,
        other => panic!("not refused by the renter's node: {other:?}"),
    };
    let client = &renter.node.node.client;
    // The offer as the provider signs it now (a lease that came and went re-signed it).
    let entry = match client.offer(offer).await.unwrap() {
        Some(e) => e,
        None => {
            client
                .replaced_offers(offer.to_string())
                .await
                .unwrap()
                .into_iter()
                .find(|r| r.old == offer)
                .expect("the offer or its replacement")
                .current
        }
    };
    let now = gridlease_node::clock::now();
    let terms = gridlease_node::renter::terms_for(
        &common::net(),
        &entry,
        renter.node.key_public,
        &req,
        GRACE_S,
        now.0,
        now,
    )
    .unwrap();
    let addrs = gridlease_node::renter::offer_addrs(&entry);
    let clock = gridlease_node::clock::SystemClock;
    match gridlease_node::lease::negotiate(client, &clock, terms, now.plus_secs(60), addrs)
        .await
        .unwrap()
    {
        gridlease_node::lease::NegotiationOutcome::Rejected {
            reason: RejectReason::ImageRefused { refusal },
            ..
        } => assert_eq!(refusal, local, "the provider's reason is the renter's"),
        other => panic!("the provider did not refuse {image}: {other:?}"),
    }
    local
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn registry_images_pull_and_run_and_disallowed_ones_are_refused_before_signing() {
    let test = "registry_policy";
    let Some(sb) = docker_or_skip(test).await else {
        return;
    };
    let Some(registry) = Registry::start(test) else {
        return;
    };
    let prefix = run_prefix(test);
    let ok = format!("{}/{prefix}/probe:ok", registry.host);
    let big = format!("{}/{prefix}/probe:big", registry.host);
    let cuda = format!("{}/{prefix}/probe:cuda99", registry.host);
    let _images = ImagesGuard(vec![ok.clone(), big.clone(), cuda.clone()]);
    push_probe(&sb, &ok, 0, 1, &[]).await;
    push_probe(&sb, &big, 4 << 20, 2, &[]).await;
    push_probe(&sb, &cuda, 0, 3, &["ENV CUDA_VERSION=99.0.0"]).await;

    let mut template = lease_template(1, 1, 3);
    template.images.registries = vec![registry.host.clone()];
    // The probe is about 1.5 MiB compressed; `big` has 4 MiB of noise on top.
    template.images.max_compressed_bytes = 3 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (provider, renter, offer) = market(dir.path(), &sb, template, GRACE_S).await;

    // Allowed: pulled from the registry, run, settled with the probe's exit code.
    let id = renter
        .leases
        .rent(probe_rent(offer, &ok, 30, &["exit", "0"]))
        .await
        .unwrap();
    let v = closed(&renter.leases, id, 90).await;
    assert_eq!(v.exit_code, Some(0), "{v:#?}");
    assert!(v.failure.is_none(), "{v:#?}");
    assert!(
        sb.docker().inspect_image(&ok).await.is_ok(),
        "the image was pulled"
    );
    remove_container(&sb, id).await;
    let stored_before = provider.leases.leases().await.unwrap().len();

    // Over the compressed size cap, read from the registry's manifest.
    let e = refused(&renter, probe_rent(offer, &big, 30, &["exit", "0"])).await;
    match e {
        ImageRefusal::TooLarge {
            size: ImageSize::Compressed,
            bytes,
            max,
        } => assert!(bytes > max && max == 3 << 20, "{bytes} {max}"),
        other => panic!("{other:?}"),
    }
    // Newer CUDA than the offer's driver (the fixture GPUs' driver supports 12.4).
    let e = refused(&renter, probe_rent(offer, &cuda, 30, &["exit", "0"])).await;
    assert_eq!(
        e,
        ImageRefusal::CudaTooNew {
            needs: "99.0".into(),
            host: "12.4".into()
        }
    );
    // A registry the provider does not list (another loopback port): refused from the
    // reference alone, nothing is asked.
    let e = refused_by_both(&renter, offer, "127.0.0.1:1/x/probe:ok").await;
    assert_eq!(
        e,
        ImageRefusal::PrivateRegistry {
            registry: "127.0.0.1:1".into()
        }
    );
    let e = refused_by_both(&renter, offer, "registry.example.com/x:1").await;
    assert!(
        matches!(e, ImageRefusal::RegistryNotAllowed { .. }),
        "unlisted public registry"
    );
    // A bare image id.
    let inspected = sb.docker().inspect_image(&ok).await.unwrap();
    let bare = inspected.id.unwrap();
    let e = refused_by_both(&renter, offer, &bare).await;
    assert_eq!(e, ImageRefusal::BareId);
    // None of the refused ones was signed or stored.
    assert_eq!(
        provider.leases.leases().await.unwrap().len(),
        stored_before,
        "a refused lease was stored by the provider"
    );
    assert_eq!(renter.leases.leases().await.unwrap().len(), 1);
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
    drop(registry);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_local_image_the_provider_did_not_list_is_refused_as_local_only() {
    let test = "registry_local_only";
    let Some(sb) = docker_or_skip(test).await else {
        return;
    };
    let prefix = run_prefix(test);
    let local = format!("{prefix}-local:v1");
    let _images = ImagesGuard(vec![local.clone()]);
    sb.import_image(
        &local,
        gridlease_sandbox::probe_image::rootfs_tar().unwrap(),
        &["ENTRYPOINT [\"/probe\"]"],
    )
    .await
    .unwrap();
    // docker.io is allowed (the default list): the reference passes; the daemon says the image
    // was never pulled from there, and the provider did not list it.
    let template = lease_template(1, 1, 3);
    let dir = tempfile::tempdir().unwrap();
    let (provider, renter, offer) = market(dir.path(), &sb, template, GRACE_S).await;
    let e = refused(&renter, probe_rent(offer, &local, 30, &[])).await;
    assert_eq!(e, ImageRefusal::LocalOnly);
    nothing_stored(&provider, &renter).await;
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pull_that_stalls_mid_layer_fails_the_lease_with_that_reason_for_the_renter() {
    let test = "registry_stall";
    let Some(sb) = docker_or_skip(test).await else {
        return;
    };
    let Some(registry) = Registry::start(test) else {
        return;
    };
    let prefix = run_prefix(test);
    let direct = format!("{}/{prefix}/probe:stall", registry.host);
    // 8 MiB of noise: the layer is far larger than what the proxy lets through.
    push_probe(&sb, &direct, 8 << 20, 4, &[]).await;
    let proxy = StallProxy::start(registry.host.clone(), 1 << 20).await;
    let via_proxy = format!("{}/{prefix}/probe:stall", proxy.host);
    let _images = ImagesGuard(vec![direct.clone(), via_proxy.clone()]);

    let dir = tempfile::tempdir().unwrap();
    let (provider, renter, offer) = registry_market(
        dir.path(),
        &sb,
        &proxy.host,
        |svc| {
            svc.pull_stall = Duration::from_secs(3);
        },
        |_| {},
    )
    .await;
    let id = renter
        .leases
        .rent(probe_rent(offer, &via_proxy, 60, &["exit", "0"]))
        .await
        .unwrap();
    let v = closed(&renter.leases, id, 120).await;
    eprintln!("renter's view: {v:#?}");
    assert_eq!(v.close_reason.as_deref(), Some("start_failed"));
    let f = v.failure.clone().expect("the renter is told why");
    assert_eq!(f.kind, "pull_stalled");
    assert_eq!(f.message, "image pull stalled: no progress for 3 s");
    let pv = closed(&provider.leases, id, 30).await;
    assert_eq!(
        pv.failure.as_ref().map(|f| f.kind.as_str()),
        Some("pull_stalled")
    );
    assert!(!container_exists(&sb, id).await);
    // A start that failed on the renter's image costs the minimum billed duration, on both
    // ledgers alike (so a renter cannot make the provider pull for free, again and again).
    let fee = u64::from(v.min_billed_s) * v.price_per_gpu_hour * u64::from(v.gpus) / 3600;
    assert!(fee > 0, "{v:#?}");
    assert_eq!(
        v.settled_total,
        Some(fee),
        "the renter paid the fee: {v:#?}"
    );
    assert_eq!(
        pv.settled_total,
        Some(fee),
        "the provider was paid it: {pv:#?}"
    );
    assert_eq!((v.paid, pv.paid), (fee, fee));
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
    drop(proxy);
    drop(registry);
}

/// Bytes used on the filesystem of Docker's root directory.
fn docker_root_used(root: &std::path::Path) -> u64 {
    let st = rustix::fs::statvfs(root).unwrap();
    (st.f_blocks - st.f_bfree) * st.f_frsize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_image_that_unpacks_past_the_cap_is_stopped_mid_pull_and_nothing_of_it_stays() {
    let test = "registry_bomb";
    let Some(sb) = docker_or_skip(test).await else {
        return;
    };
    let Some(registry) = Registry::start(test) else {
        return;
    };
    // 3 GiB of zeros in a layer of about 3 MiB, written to the registry by hand.
    let repo = format!("{}/zeros", run_prefix(test));
    let reference = format!("{}/{repo}:1", registry.host);
    let _images = ImagesGuard(vec![reference.clone()]);
    let host = registry.host.clone();
    let compressed =
        tokio::task::spawn_blocking(move || push_zeros_bomb(&host, &repo, "1", 3 << 30))
            .await
            .unwrap();
    assert!(compressed < 8 << 20, "{compressed} bytes compressed");
    let cap: u64 = 1 << 30;
    let dir = tempfile::tempdir().unwrap();
    let mut template = lease_template(1, 1, 3);
    template.images.registries = vec![registry.host.clone()];
    template.images.max_unpacked_bytes = cap;
    let provider = provider_with(dir.path(), &sb, template, GRACE_S, |_| {}).await;
    let rc = service_config(dir.path(), "renter", GRACE_S);
    let mut renter = party(dir.path(), "renter", common::config(), rc, None).await;
    let offer = connect_for_offer(&mut renter, &provider).await;

    // The disk of Docker's root, sampled while the lease starts.
    let root = std::path::PathBuf::from(sb.docker().info().await.unwrap().docker_root_dir.unwrap());
    let before = docker_root_used(&root);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (stop, root) = (stop.clone(), root.clone());
        std::thread::spawn(move || {
            let mut peak = 0u64;
            let until = std::time::Instant::now() + Duration::from_secs(180);
            while !stop.load(std::sync::atomic::Ordering::Relaxed)
                && std::time::Instant::now() < until
            {
                peak = peak.max(docker_root_used(&root));
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        })
    };
    // The offer states only compressed sizes: this one passes at negotiation.
    let id = renter
        .leases
        .rent(probe_rent(offer, &reference, 60, &["exit", "0"]))
        .await
        .unwrap();
    let v = closed(&renter.leases, id, 180).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.join().unwrap();
    eprintln!("renter's view: {v:#?}");
    let grew = peak.saturating_sub(before);
    eprintln!(
        "Docker's disk grew by {} MiB at most during the pull",
        grew >> 20
    );
    assert_eq!(v.close_reason.as_deref(), Some("start_failed"));
    let f = v.failure.clone().expect("the renter is told why");
    assert_eq!(f.kind, "image_refused", "{f:?}");
    assert!(
        f.message
            .contains("unpacks to more than the provider's limit of 1.0 GiB"),
        "{}",
        f.message
    );
    // Stopped at the cap (plus what a quarter second of extraction writes), not at 3 GiB.
    assert!(grew < cap + (512 << 20), "the pull unpacked {grew} bytes");
    // Nothing of it stays: no image, and the disk back where it was.
    assert!(
        sb.docker().inspect_image(&reference).await.is_err(),
        "the image is still there"
    );
    let mut after = docker_root_used(&root);
    for _ in 0..50 {
        if after <= before + (64 << 20) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        after = docker_root_used(&root);
    }
    assert!(
        after <= before + (64 << 20),
        "{} MiB of the pull left on Docker's disk",
        after.saturating_sub(before) >> 20
    );
    // Refused on the renter's image: the failed-start fee, on both ledgers.
    let pv = closed(&provider.leases, id, 30).await;
    assert_eq!(v.settled_total, pv.settled_total);
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
    drop(registry);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_pulled_images_with_a_cache_of_two_leave_at_most_two() {
    let test = "registry_cache";
    let Some(sb) = docker_or_skip(test).await else {
        return;
    };
    let Some(registry) = Registry::start(test) else {
        return;
    };
    let prefix = run_prefix(test);
    let images: Vec<String> = (0..5)
        .map(|i| format!("{}/{prefix}/probe:v{i}", registry.host))
        .collect();
    let _guard = ImagesGuard(images.clone());
    for (i, image) in images.iter().enumerate() {
        // Distinct images: each has its own noise layer.
        push_probe(&sb, image, 64 << 10, 10 + i as u64, &[]).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let (provider, renter, offer) = registry_market(
        dir.path(),
        &sb,
        &registry.host,
        |svc| {
            svc.image_cache = gridlease_contracts::image::CacheLimits {
                max_images: 2,
                max_bytes: u64::MAX,
            };
        },
        |_| {},
    )
    .await;
    let present = || async {
        let mut n = Vec::new();
        for image in &images {
            if sb.docker().inspect_image(image).await.is_ok() {
                n.push(image.clone());
            }
        }
        n
    };
    for image in &images {
        let id = rent_when_free(&renter, probe_rent(offer, image, 30, &["exit", "0"])).await;
        let v = closed(&provider.leases, id, 90).await;
        assert_eq!(v.exit_code, Some(0), "{v:#?}");
        // The session ends (container removed) a moment after the settlement; the cache is
        // trimmed then.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let p = present().await;
            if p.len() <= 2 {
                assert!(p.contains(image), "the image just used is kept: {p:?}");
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "cache over 2 images: {p:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let p = present().await;
    assert_eq!(p, images[3..].to_vec(), "the two most recently used remain");
    // The cache forgets an image once Docker removed it (removal first, so a failed removal
    // stays tracked): the store may lag Docker by a moment.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let usage = loop {
        let (usage, _) = provider.leases.image_cache().await;
        if usage.images <= 2 || tokio::time::Instant::now() >= deadline {
            break usage;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(usage.images, 2);
    assert!(usage.bytes > 0);
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
    drop(registry);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_pull_that_keeps_progressing_outlasts_the_start_allowance_and_the_renter_sees_it() {
    let test = "registry_slow_pull";
    let Some(sb) = docker_or_skip(test).await else {
        return;
    };
    let Some(registry) = Registry::start(test) else {
        return;
    };
    let prefix = run_prefix(test);
    let direct = format!("{}/{prefix}/probe:slow", registry.host);
    // 6 MiB of noise at 1 MiB/s: a pull of about 7 s.
    push_probe(&sb, &direct, 6 << 20, 5, &[]).await;
    let proxy = StallProxy::throttled(registry.host.clone(), 1 << 20).await;
    let via_proxy = format!("{}/{prefix}/probe:slow", proxy.host);
    let _images = ImagesGuard(vec![direct.clone(), via_proxy.clone()]);
    let dir = tempfile::tempdir().unwrap();
    // The renter gives a provider 2 s (+ 2 intervals) to show a start: far less than the pull.
    let (provider, renter, offer) = registry_market(
        dir.path(),
        &sb,
        &proxy.host,
        |_| {},
        |rc| rc.start_allowance = Duration::from_secs(2),
    )
    .await;
    let id = renter
        .leases
        .rent(probe_rent(offer, &via_proxy, 30, &["exit", "0"]))
        .await
        .unwrap();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let v = loop {
        let v = renter.leases.lease(id).await.unwrap().unwrap();
        if let Some(p) = v.pull {
            seen.push(p);
        }
        if v.is_terminal() {
            break v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease did not end"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("pull progress seen by the renter: {:?}", seen.last());
    assert_eq!(v.exit_code, Some(0), "ran after the slow pull: {v:#?}");
    assert!(seen.len() >= 3, "progress reached the renter: {seen:?}");
    assert!(
        seen.windows(2)
            .any(|w| w[1].pulled_bytes > w[0].pulled_bytes),
        "the pulled bytes grew: {seen:?}"
    );
    assert!(seen.iter().any(|p| p.total_bytes >= 6 << 20), "{seen:?}");
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
    drop(proxy);
    drop(registry);
}
