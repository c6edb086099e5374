//! A lease on a provider whose tenants run under gVisor (`isolation = "gvisor"`): real nodes,
//! real Docker, Debian's runsc. The offer says so, the container is created under the runtime,
//! the tenant sees gVisor's kernel, and the lease settles with agreeing ledgers.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use gridlease_protocol::Isolation;
use lease_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_under_gvisor_runs_there_and_settles_with_agreeing_ledgers() {
    let test = "lease_gvisor";
    let Some(sb) = docker_or_skip(test).await else {
        return;
    };
    let Some(runtime) = gvisor_or_skip(test, &sb).await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut template = lease_template(1, 1, 10);
    template.sandbox.isolation = Isolation::Gvisor;
    let rt = runtime.clone();
    let provider = provider_with(dir.path(), &sb, template, 10, move |svc| {
        svc.limits.runtime = Some(rt);
        svc.limits.isolation = Isolation::Gvisor;
    })
    .await;
    let (renter, offer) = renter_of(dir.path(), &provider, 10).await;
    let held = renter.node.node.client.offer(offer).await.unwrap().unwrap();
    assert_eq!(
        held.offer.sandbox.isolation,
        Isolation::Gvisor,
        "the renter's copy of the offer says gvisor"
    );
    let q = gridlease_contracts::query::Query::parse("gvisor=true").unwrap();
    assert_eq!(
        renter.node.node.client.search(q, 10).await.unwrap().len(),
        1
    );
    let id = renter
        .leases
        .rent(probe_rent(
            offer,
            &image,
            30,
            &["kernel", "sleep", "2", "exit", "0"],
        ))
        .await
        .unwrap();
    wait_view(&provider.leases, id, "running", |v| {
        v.state == gridlease_contracts::LeaseState::Running
    })
    .await;
    let info = sb.inspect(&format!("gridlease-{id}")).await.unwrap();
    assert_eq!(
        info.host_config.unwrap().runtime.as_deref(),
        Some(runtime.as_str()),
        "created under the provider's gVisor runtime"
    );
    let done = closed(&renter.leases, id, 60).await;
    let pdone = closed(&provider.leases, id, 30).await;
    assert_eq!(
        done.close_reason.as_deref(),
        Some("container_exited"),
        "{done:#?}"
    );
    assert_eq!(done.exit_code, Some(0));
    let (out, _) = read_logs(&renter.leases, id).await;
    let out = String::from_utf8_lossy(&out);
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let tenant = out
        .lines()
        .find_map(|l| l.strip_prefix("KERNEL release="))
        .expect("the probe printed its kernel");
    assert_ne!(
        tenant,
        host.trim(),
        "the tenant saw the host's kernel: {out}"
    );
    assert!(done.settled_total.unwrap() > 0, "{done:#?}");
    assert_eq!(done.settled_total, pdone.settled_total, "ledgers agree");
    assert!(!container_exists(&sb, id).await);
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
}
