//! Egress leases through the lease service (issue 13, network): the provider installs the
//! host firewall rules before it starts an egress container, refuses to start one when it
//! cannot, and takes network and rules away at shutdown. What the rules block is shown in
//! `sandbox/tests/egress.rs`; here the one target is a listener on the egress bridge's
//! gateway (a host address), which a container on that bridge reaches without the rules
//! (`sandbox/tests/escape.rs`, `network_none_reaches_nothing`) and must not reach with them.
//!
//! Needs root (iptables) and Docker: with `GRIDLEASE_REQUIRE_DOCKER=1` either missing is a
//! failure, otherwise the tests skip with a note.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::net::TcpListener;
use std::time::Duration;

use gridlease_protocol::NetworkPolicy;
use gridlease_sandbox::Sandbox;
use gridlease_sandbox::firewall::Firewall;
use lease_support::*;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

async fn docker_and_root(test: &str) -> Option<Sandbox> {
    let sb = docker_or_skip(test).await?;
    if !is_root() {
        if std::env::var("GRIDLEASE_REQUIRE_DOCKER").as_deref() == Ok("1") {
            panic!("{test}: GRIDLEASE_REQUIRE_DOCKER=1 but the egress tests need root (iptables)");
        }
        eprintln!("{test}: SKIPPED, not root (iptables needs it)");
        return None;
    }
    Some(sb)
}

/// A per-run name.
fn prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("glen{:05x}", ((std::process::id() << 12) ^ nanos) & 0xfffff)
}

/// Removes, on drop (panics included), the provider's containers and workspaces, then the
/// test's network, its firewall rules and its image.
struct Guard {
    network: String,
    image: String,
    /// The provider's node id, once it runs.
    node: Option<String>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let (network, image, node) = (self.network.clone(), self.image.clone(), self.node.take());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(sb) = Sandbox::connect().await {
                    if let Some(node) = node {
                        for (c, _) in sb.list_node_containers(&node).await.unwrap_or_default() {
                            let _ = sb.remove(&c).await;
                        }
                        let _ = sb.remove_node_workspaces(&node).await;
                    }
                    let _ = sb.remove_network(&network).await;
                    let _ = sb.remove_image(&image).await;
                }
            });
            if let Ok(fw) = Firewall::detect() {
                let _ = fw.remove(&network);
            }
        })
        .join();
    }
}

/// This build's probe under a per-run tag.
async fn run_image(sb: &Sandbox, prefix: &str) -> String {
    let image = format!("{prefix}-probe:1");
    sb.import_image(
        &image,
        gridlease_sandbox::probe_image::rootfs_tar().unwrap(),
        &["ENTRYPOINT [\"/probe\"]"],
    )
    .await
    .unwrap();
    image
}

/// An egress lease: the node installs the rules itself (the network exists beforehand without
/// them, so the test knows its gateway), the container cannot reach the host, its network
/// bytes are metered, and the provider's shutdown leaves neither network nor rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_egress_lease_runs_behind_the_firewall_and_shutdown_removes_it() {
    let Some(sb) = docker_and_root("egress_lease").await else {
        return;
    };
    let p = prefix();
    let net = format!("{p}-egress");
    let image = run_image(&sb, &p).await;
    let mut guard = Guard {
        network: net.clone(),
        image: image.clone(),
        node: None,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut t = lease_template(1, 2, 10);
    t.sandbox.network = NetworkPolicy::Egress;
    t.images.local_images.push(image.clone());
    let provider = provider_with(dir.path(), &sb, t, 10, |svc| {
        svc.limits.egress_network = net.clone();
    })
    .await;
    guard.node = Some(provider.node.node.client.peer_id().to_string());
    // The bare network (no firewall yet; made after the provider's start-up, which removes an
    // unused egress network) and a listener on its gateway.
    sb.ensure_egress_network(&net).await.unwrap();
    let fw = Firewall::detect().unwrap();
    assert!(!fw.installed(&net).unwrap());
    let info = sb.docker().inspect_network(&net, None).await.unwrap();
    let gateway = info
        .ipam
        .and_then(|i| i.config)
        .and_then(|c| c.into_iter().find_map(|c| c.gateway))
        .unwrap();
    let listener = TcpListener::bind((gateway.as_str(), 0)).unwrap();
    let target = listener.local_addr().unwrap().to_string();

    let (renter, offer) = renter_of(dir.path(), &provider, 10).await;
    let mut req = probe_rent(
        offer,
        &image,
        30,
        &["connect", &target, "sleep", "2.5", "exit", "0"],
    );
    req.network = NetworkPolicy::Egress;
    let id = renter.leases.rent(req).await.unwrap();
    let running = wait_view(&provider.leases, id, "running", |v| {
        v.state == gridlease_contracts::LeaseState::Running
    })
    .await;
    assert!(running.failure.is_none(), "{running:#?}");
    assert!(fw.installed(&net).unwrap(), "the node installed the rules");
    let done = closed(&renter.leases, id, 60).await;
    let pdone = closed(&provider.leases, id, 30).await;
    assert_eq!(done.exit_code, Some(0), "{done:#?}");
    let (logs, _) = read_logs(&renter.leases, id).await;
    let logs = String::from_utf8_lossy(&logs);
    assert!(
        logs.contains(&format!("CONNECT addr={target} result=EHOSTUNREACH")),
        "the egress container reached the host: {logs}"
    );
    // Its network bytes (the refused SYN, the ICMP error) reach both views.
    let usage = pdone.usage.clone().unwrap();
    assert!(usage.net_tx_bytes > 0, "{pdone:#?}");
    assert_eq!(done.usage.unwrap().net_tx_bytes, usage.net_tx_bytes);

    // Shutdown: no container left on the network, so network and rules go.
    provider.cancel.cancel();
    tokio::time::timeout(Duration::from_secs(30), provider.leases.stopped())
        .await
        .expect("the provider's lease service did not stop");
    assert!(!fw.installed(&net).unwrap(), "{}", fw.listing().unwrap());
    assert!(!fw.listing().unwrap().contains(&net));
    assert!(sb.docker().inspect_network(&net, None).await.is_err());
    drop(listener);
}

/// A provider whose egress firewall cannot be set up (here: the configured egress network is
/// Docker's `none`, which has no bridge to fence) starts no egress container: the lease fails
/// with a typed `create` failure that says why, and the renter sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_that_cannot_install_the_rules_starts_no_egress_container() {
    let Some(sb) = docker_and_root("egress_refused").await else {
        return;
    };
    let p = prefix();
    let image = run_image(&sb, &p).await;
    let mut guard = Guard {
        network: format!("{p}-unused"),
        image: image.clone(),
        node: None,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut t = lease_template(1, 2, 10);
    t.sandbox.network = NetworkPolicy::Egress;
    t.images.local_images.push(image.clone());
    let provider = provider_with(dir.path(), &sb, t, 10, |svc| {
        svc.limits.egress_network = "none".into();
    })
    .await;
    guard.node = Some(provider.node.node.client.peer_id().to_string());
    let (renter, offer) = renter_of(dir.path(), &provider, 10).await;
    let mut req = probe_rent(offer, &image, 30, &["exit", "0"]);
    req.network = NetworkPolicy::Egress;
    let id = renter.leases.rent(req).await.unwrap();
    let done = closed(&renter.leases, id, 60).await;
    let pdone = closed(&provider.leases, id, 30).await;
    assert_eq!(
        done.close_reason.as_deref(),
        Some("start_failed"),
        "{done:#?}"
    );
    for v in [&done, &pdone] {
        let f = v.failure.clone().expect("the failure is explained");
        assert_eq!(f.kind, "create", "{f:?}");
        assert!(
            f.message.contains("could not install the firewall rules")
                && f.message.contains("does not exist"),
            "{f:?}"
        );
        // The provider's own failure: the renter pays nothing.
        assert_eq!(v.settled_total, Some(0), "{v:#?}");
    }
    assert!(
        remove_leftover(&sb, id).await,
        "no container may have been created"
    );
    provider.cancel.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), provider.leases.stopped()).await;
}

/// Whether the lease has no container (removing one if a broken run left it).
async fn remove_leftover(sb: &Sandbox, id: gridlease_protocol::LeaseId) -> bool {
    let name = format!("gridlease-{id}");
    let absent = sb.inspect(&name).await.is_err();
    remove_container(sb, id).await;
    absent
}
