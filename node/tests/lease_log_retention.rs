//! Finished leases' logs do not pile up on the provider's disk (issue 41 item 7): real nodes,
//! real Docker. Four leases that each write 1 MiB of output run on a provider whose log budget
//! is 3 MiB (and a little for the watchdogs' logs): one runs on, three end one after the other.
//! The provider then keeps the live lease's log and the two newest finished ones, and removes
//! the oldest: the budget holds, oldest first, live logs never go, and `gridlease logs` still
//! serves what is kept. (The age rule, and the budget's place in the offered disk, are unit
//! tests: `lease::retention`, `config`.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::path::Path;
use std::time::Duration;

use gridlease_node::lease::retention::{LogRetention, lease_of_log};
use lease_support::*;

/// Bytes on disk of the lease logs in `dir`, and the leases they belong to.
fn logs_in(dir: &Path) -> (u64, Vec<gridlease_protocol::LeaseId>) {
    use std::os::unix::fs::MetadataExt;
    let mut bytes = 0;
    let mut leases = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(l) = lease_of_log(&name) {
            bytes += e.metadata().unwrap().blocks() * 512;
            leases.push(l);
        }
    }
    (bytes, leases)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finished_leases_logs_stay_within_the_budget_and_the_retention() {
    let test = "lease_log_retention";
    let Some(sb) = docker_or_skip(test).await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let retention = LogRetention {
        keep_for: Duration::from_secs(3600),
        max_bytes: (3 << 20) + (64 << 10),
    };
    let provider = provider_with(root, &sb, lease_template(2, 1, 10), 10, |svc| {
        svc.log_retention = retention;
        svc.logs_sweep = Duration::from_millis(200);
    })
    .await;
    let (renter, offer) = renter_of(root, &provider, 10).await;
    let data_dir = root.join("provider").join("leases");

    // A lease that runs on while the others end: its log is never removed.
    let live = renter
        .leases
        .rent(probe_rent(
            offer,
            &image,
            120,
            &["bytes", "1048576", "sleep", "100"],
        ))
        .await
        .unwrap();
    wait_view(&provider.leases, live, "the live lease to write", |v| {
        v.state == gridlease_contracts::LeaseState::Running
    })
    .await;
    let mut ended = Vec::new();
    for _ in 0..3 {
        let id = renter
            .leases
            .rent(probe_rent(
                offer,
                &image,
                60,
                &["bytes", "1048576", "exit", "0"],
            ))
            .await
            .unwrap();
        closed(&provider.leases, id, 60).await;
        ended.push(id);
    }
    // The sweep after each end: all the logs fit the budget again, the oldest finished one
    // removed.
    let mut last = (0, Vec::new());
    for _ in 0..50 {
        last = logs_in(&data_dir);
        if last.0 <= retention.max_bytes && last.1.contains(&ended[2]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (bytes, kept) = last;
    eprintln!("{bytes} bytes of lease logs kept, of leases {kept:?}");
    assert!(bytes <= retention.max_bytes, "{bytes} bytes kept");
    assert!(kept.contains(&live), "the live lease's log was removed");
    assert!(!kept.contains(&ended[0]), "the oldest goes first: {kept:?}");
    assert!(
        kept.contains(&ended[1]) && kept.contains(&ended[2]),
        "only as much as the budget needs goes: {kept:?}"
    );
    let (out, _) = read_logs(&renter.leases, ended[2]).await;
    assert_eq!(out.len(), 1 << 20, "a kept log is still served");
    for p in [&provider, &renter] {
        p.cancel.cancel();
    }
    remove_container(&sb, live).await;
}
