//! Helpers for lease tests: a provider and a renter node on loopback, each with its lease
//! service, real Docker with the probe image.
//!
//! Docker unreachable: with `GRIDLEASE_REQUIRE_DOCKER=1` the test FAILS; otherwise it prints a
//! note and skips (as in `sandbox/tests/common`).
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stderr
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use gridlease_node::lease::{LeaseService, LeaseServiceConfig, RentRequest};
use gridlease_node::net::{NetworkEvent, NodeConfig, OfferTemplate};
use gridlease_protocol::OfferId;
use gridlease_sandbox::Sandbox;
use tokio_util::sync::CancellationToken;

use crate::common::*;

/// 3.60 per GPU-hour: exactly 1000 micro-units per GPU-second.
pub const PRICE: u64 = 3_600_000;

/// Connects to Docker, or skips / fails according to `GRIDLEASE_REQUIRE_DOCKER`.
pub async fn docker_or_skip(test: &str) -> Option<Sandbox> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
    match Sandbox::connect().await {
        Ok(sb) => Some(sb),
        Err(e) => {
            if std::env::var("GRIDLEASE_REQUIRE_DOCKER").as_deref() == Ok("1") {
                panic!("{test}: GRIDLEASE_REQUIRE_DOCKER=1 but Docker is unreachable: {e}");
            }
            eprintln!(
                "{test}: SKIPPED, Docker is unreachable ({e}); set GRIDLEASE_REQUIRE_DOCKER=1 to make this a failure"
            );
            None
        }
    }
}

/// The Docker runtime gVisor is registered under for tests
/// (`gridlease_sandbox::isolation::test_runtime`), or `None` (skip) when the daemon lacks it;
/// with `GRIDLEASE_REQUIRE_RUNSC=1` (set by `.ci/run`) a missing runtime fails the test.
pub async fn gvisor_or_skip(test: &str, sb: &Sandbox) -> Option<String> {
    match gridlease_sandbox::isolation::test_runtime(sb).await {
        Ok(name) => Some(name),
        Err(why) => {
            if std::env::var("GRIDLEASE_REQUIRE_RUNSC").as_deref() == Ok("1") {
                panic!("{test}: GRIDLEASE_REQUIRE_RUNSC=1 but {why}");
            }
            eprintln!(
                "{test}: SKIPPED under gVisor: {why}; set GRIDLEASE_REQUIRE_RUNSC=1 to make this a failure"
            );
            None
        }
    }
}

/// A provider template with short test intervals.
pub fn lease_template(gpus: u8, interval_s: u32, pay_ahead_s: u32) -> OfferTemplate {
    let mut t = template(gpus, PRICE);
    t.min_duration_s = 1;
    t.min_billed_s = 1;
    t.usage_interval_s = interval_s;
    t.pay_ahead_s = pay_ahead_s;
    t.per_gpu.cpu_millicores = 1000;
    t.per_gpu.ram_mib = 256;
    t.per_gpu.disk_gib = 1;
    t
}

pub struct Party {
    pub node: TestNode,
    pub leases: LeaseService,
    pub cancel: CancellationToken,
    /// A provider's containers and workspaces go when the test fails (its own clean-up at the
    /// end never runs then, and a leftover would hold Docker and loop devices for later runs).
    _cleanup: Option<CleanupOnPanic>,
}

/// Removes every container and workspace labelled with a node's id if it is dropped while
/// the thread panics (a failed assertion); does nothing otherwise.
struct CleanupOnPanic {
    node_id: String,
}

impl Drop for CleanupOnPanic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let node_id = std::mem::take(&mut self.node_id);
        // Its own thread and runtime: the test's runtime is unwinding around this drop, and
        // a fresh Docker client carries no connection tied to that runtime.
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the clean-up");
            rt.block_on(async {
                let Ok(sb) = Sandbox::connect().await else {
                    return;
                };
                for (id, _) in sb.list_node_containers(&node_id).await.unwrap_or_default() {
                    let _ = sb.remove(&id).await;
                }
                match sb.remove_node_workspaces(&node_id).await {
                    Ok(leases) => eprintln!(
                        "test failed: removed the containers and {} workspace(s) of node {node_id}",
                        leases.len()
                    ),
                    Err(e) => eprintln!("test failed: workspaces of node {node_id} left: {e}"),
                }
            });
        });
        let _ = done.join();
    }
}

pub fn service_config(root: &Path, name: &str, grace_s: u32) -> LeaseServiceConfig {
    let mut c = LeaseServiceConfig::new(root.join(name).join("leases"));
    c.renter_grace_s = grace_s;
    c.start_allowance = Duration::from_secs(60);
    c.stop_grace = Duration::from_secs(1);
    c.rpc_timeout = Duration::from_secs(5);
    c
}

pub async fn party(
    root: &Path,
    name: &str,
    config: NodeConfig,
    svc: LeaseServiceConfig,
    sandbox: Option<Sandbox>,
) -> Party {
    serve(start(root, name, config).await, svc, sandbox).await
}

/// A party of `node` with a lease service configured by `svc`.
async fn serve(node: TestNode, svc: LeaseServiceConfig, sandbox: Option<Sandbox>) -> Party {
    let cancel = CancellationToken::new();
    let has_sandbox = sandbox.is_some();
    let leases = LeaseService::start(
        node.node.client.clone(),
        &node.node.events,
        svc,
        sandbox,
        cancel.clone(),
    )
    .await
    .unwrap();
    let cleanup = has_sandbox.then(|| CleanupOnPanic {
        node_id: node.node.client.peer_id().to_string(),
    });
    Party {
        node,
        leases,
        cancel,
        _cleanup: cleanup,
    }
}

/// A provider offering `template` with Docker, its lease service configured by `tweak`.
pub async fn provider_with(
    root: &Path,
    sb: &Sandbox,
    template: OfferTemplate,
    grace_s: u32,
    tweak: impl FnOnce(&mut LeaseServiceConfig),
) -> Party {
    let mut pc = config();
    let mut svc = service_config(root, "provider", grace_s);
    svc.base_template = Some(template.clone());
    tweak(&mut svc);
    pc.offer = Some(template);
    party(root, "provider", pc, svc, Some(sb.clone())).await
}

/// A provider started again from its home (after [`vanish`] or `common::stop`), offering
/// `template` with Docker, its lease service configured by `svc` (which gets `template`); the
/// service resumes the leases it stored.
pub async fn provider_from_home(
    home: &Path,
    sb: &Sandbox,
    template: OfferTemplate,
    mut svc: LeaseServiceConfig,
) -> Party {
    let mut pc = config();
    pc.offer = Some(template.clone());
    svc.base_template = Some(template);
    serve(start_from_home(home, pc).await, svc, Some(sb.clone())).await
}

/// Provider (with `template`) and renter, connected, the renter holding the provider's offer.
pub async fn market(
    root: &Path,
    sb: &Sandbox,
    template: OfferTemplate,
    grace_s: u32,
) -> (Party, Party, OfferId) {
    let provider = provider_with(root, sb, template, grace_s, |_| {}).await;
    let (renter, id) = renter_of(root, &provider, grace_s).await;
    (provider, renter, id)
}

/// What most lease tests start from: Docker, the probe image, a temporary root, and a provider
/// (offering `template`) and a renter, connected, the renter holding the provider's offer.
pub struct Setup {
    pub sb: Sandbox,
    pub image: String,
    pub dir: tempfile::TempDir,
    pub provider: Party,
    pub renter: Party,
    pub offer: OfferId,
}

/// [`Setup`] for `test`, or `None` when Docker is unreachable and not required.
pub async fn setup(test: &str, template: OfferTemplate, grace_s: u32) -> Option<Setup> {
    let sb = docker_or_skip(test).await?;
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (provider, renter, offer) = market(dir.path(), &sb, template, grace_s).await;
    Some(Setup {
        sb,
        image,
        dir,
        provider,
        renter,
        offer,
    })
}

/// A renter (with `grace_s`) connected to `provider`, holding its offer.
pub async fn renter_of(root: &Path, provider: &Party, grace_s: u32) -> (Party, OfferId) {
    let mut renter = party(
        root,
        "renter",
        config(),
        service_config(root, "renter", grace_s),
        None,
    )
    .await;
    let offer = connect_for_offer(&mut renter, provider).await;
    (renter, offer)
}

/// Connects the renter to the provider and waits until the renter holds the provider's offer.
pub async fn connect_for_offer(renter: &mut Party, provider: &Party) -> OfferId {
    connect(&renter.node, &provider.node).await;
    let p = provider.node.key_public;
    wait_event(&mut renter.node.events, |e| match e {
        NetworkEvent::OfferAdmitted { id, provider, .. } if *provider == p => Some(*id),
        _ => None,
    })
    .await
}

/// Waits at most `secs` for the lease to close on this party and returns its final view.
pub async fn closed(
    leases: &LeaseService,
    id: gridlease_protocol::LeaseId,
    secs: u64,
) -> gridlease_node::lease::LeaseView {
    tokio::time::timeout(Duration::from_secs(secs), leases.wait_closed(id))
        .await
        .expect("the lease did not close in time")
        .unwrap()
}

pub fn probe_rent(offer: OfferId, image: &str, duration_s: u32, args: &[&str]) -> RentRequest {
    RentRequest {
        volumes: Vec::new(),
        mounts: Vec::new(),
        volume: None,
        verify: true,
        offer: offer.to_string(),
        gpus: 1,
        duration_s,
        image: image.to_string(),
        command: args.iter().map(|s| s.to_string()).collect(),
        env: BTreeMap::new(),
        max_total: None,
        network: gridlease_protocol::NetworkPolicy::None,
        keep_outputs_s: 0,
        upload_hold_s: 0,
        prepay_s: 0,
    }
}

/// Reads the whole output of a lease through `svc` (following until eof).
pub async fn read_logs(
    svc: &LeaseService,
    id: gridlease_protocol::LeaseId,
) -> (Vec<u8>, Option<i32>) {
    let mut out = Vec::new();
    let mut offset = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match svc.logs(id, offset).await {
            Ok(chunk) => {
                out.extend_from_slice(&chunk.data);
                offset = chunk.next_offset;
                if chunk.eof {
                    return (out, chunk.exit_code);
                }
                if chunk.data.is_empty() {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "logs did not reach eof"
        );
    }
}

/// Removes a lease's container and then its workspace if a test left them behind.
pub async fn remove_container(sb: &Sandbox, id: gridlease_protocol::LeaseId) {
    let _ = sb.remove(&format!("gridlease-{id}")).await;
    let _ = sb.remove_lease_workspace(&id).await;
}

/// Polls the lease's view on `svc` until `cond` holds (60 s at most).
pub async fn wait_view(
    svc: &LeaseService,
    id: gridlease_protocol::LeaseId,
    what: &str,
    cond: impl Fn(&gridlease_node::lease::LeaseView) -> bool,
) -> gridlease_node::lease::LeaseView {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(v)) = svc.lease(id).await
            && cond(&v)
        {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills a party in process: its lease service and its network stop at once, nothing is
/// settled or said to the other side.
pub async fn vanish(p: Party) {
    p.cancel.cancel();
    stop(p.node).await;
}

/// Whether a lease's container still exists.
pub async fn container_exists(sb: &Sandbox, id: gridlease_protocol::LeaseId) -> bool {
    sb.inspect(&format!("gridlease-{id}")).await.is_ok()
}
