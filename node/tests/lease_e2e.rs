//! Leases end to end on loopback with real Docker and the probe image (issue 5).
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::time::{Duration, Instant};

use gridlease_contracts::{Money, cost};
use lease_support::*;

/// Provider with dev GPUs; renter rents 30 s of the probe burning 1 CPU for 15 s, printing a
/// sentinel and exiting 0. Both ledgers agree with each other, with the last receipt and with
/// price x GPUs x billed seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn happy_path_logs_exit_code_and_agreeing_ledgers() {
    let Some(sb) = docker_or_skip("happy_path").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let interval_s = 2;
    let (provider, renter, offer) =
        market(dir.path(), &sb, lease_template(2, interval_s, 10), 10).await;

    let t0 = Instant::now();
    let id = renter
        .leases
        .rent(probe_rent(
            offer,
            &image,
            30,
            &[
                "space",
                "/workspace",
                "burn",
                "1",
                "15",
                "sentinel",
                "LEASE-DONE",
                "exit",
                "0",
            ],
        ))
        .await
        .unwrap();
    let rented = t0.elapsed();

    let done = tokio::time::timeout(Duration::from_secs(90), renter.leases.wait_closed(id))
        .await
        .expect("lease did not settle in time")
        .unwrap();
    let elapsed = t0.elapsed();
    let pdone = tokio::time::timeout(Duration::from_secs(30), provider.leases.wait_closed(id))
        .await
        .unwrap()
        .unwrap();
    eprintln!("renter view: {done:#?}\nprovider view: {pdone:#?}");

    assert_eq!(done.state, gridlease_contracts::LeaseState::Settled);
    assert_eq!(pdone.state, gridlease_contracts::LeaseState::Settled);
    assert_eq!(done.exit_code, Some(0));
    assert_eq!(pdone.exit_code, Some(0));
    assert_eq!(done.close_reason.as_deref(), Some("container_exited"));

    let (logs, exit) = read_logs(&renter.leases, id).await;
    let text = String::from_utf8_lossy(&logs);
    assert!(text.contains("SENTINEL LEASE-DONE"), "logs: {text}");
    assert_eq!(exit, Some(0));
    // The lease ran with its disk as /workspace (1 GiB per GPU in the template), and the
    // workspace is gone once the lease settled.
    let avail: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("SPACE path=/workspace avail_bytes="))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no workspace in the logs: {text}"));
    assert!(
        avail >= 1 << 30,
        "workspace of {avail} bytes for a 1 GiB lease"
    );
    let volume = gridlease_sandbox::workspace::volume_name(&id);
    assert!(
        sb.docker().inspect_volume(&volume).await.is_err(),
        "the workspace volume outlived the lease"
    );
    let images = gridlease_sandbox::workspace::dir(&dir.path().join("provider").join("leases"));
    let left: Vec<_> = std::fs::read_dir(&images)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "workspace images left: {left:?}");

    // Billing: the final report's wall time is the daemon's run time of the container.
    let usage = done.usage.clone().expect("usage reported");
    let wall_ms = usage.wall_ms;
    assert!(wall_ms >= 15_000, "burned 15 CPU-s, wall {wall_ms} ms");
    assert!(
        wall_ms <= elapsed.as_millis() as u64 + u64::from(interval_s) * 1000,
        "wall {wall_ms} ms longer than the test saw ({elapsed:?}, rent took {rented:?})"
    );
    assert!(usage.cpu_ms >= 14_000, "cpu {} ms", usage.cpu_ms);
    let billed_s = (wall_ms / 1000).max(1);
    let expected = cost(billed_s, 1, Money::from_micros(PRICE))
        .unwrap()
        .micros();
    assert_eq!(expected, billed_s * 1000);

    let total = done.settled_total.unwrap();
    assert_eq!(total, expected, "renter statement");
    assert_eq!(pdone.settled_total, Some(expected), "provider statement");
    assert_eq!(done.paid, expected);

    let rl = renter.leases.ledger().await.unwrap();
    let pl = provider.leases.ledger().await.unwrap();
    assert!(rl.balanced && pl.balanced);
    assert_eq!(rl.total_spent, expected);
    assert_eq!(pl.total_earned, expected);
    assert_eq!(rl.leases.len(), 1);
    assert_eq!(pl.leases.len(), 1);
    assert_eq!(rl.leases[0].total, pl.leases[0].total);
    eprintln!(
        "rent() took {rented:?}; wall {wall_ms} ms; billed {billed_s} s; total {}",
        Money::from_micros(total)
    );

    // Reputation (issue 16): both nodes hold the same co-signed completion record: this
    // lease, both keys, what was paid, the GPU-seconds paid for, completed.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mine, theirs) = loop {
        let (p, r) = (
            provider.leases.completions(10).await,
            renter.leases.completions(10).await,
        );
        if (!p.is_empty() && !r.is_empty()) || Instant::now() > deadline {
            break (p, r);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(mine.len(), 1, "provider's completions: {mine:?}");
    assert_eq!(theirs.len(), 1, "renter's completions: {theirs:?}");
    assert_eq!(mine[0].1, theirs[0].1, "the same signed pair on both nodes");
    let record = mine[0]
        .1
        .verify(&gridlease_protocol::NetworkId::devnet())
        .expect("the pair verifies");
    assert_eq!(record, mine[0].0);
    assert_eq!(record.lease_id, id);
    assert_eq!(record.paid, expected);
    assert_eq!(
        record.gpu_seconds,
        wall_ms / 1000,
        "one GPU, paid to the last report"
    );
    assert_eq!(
        record.outcome,
        gridlease_protocol::completion::CompletionOutcome::Completed
    );
    // The offer has no verification window: no GPU check ran.
    assert_eq!(
        record.gpu_check,
        gridlease_protocol::completion::GpuCheck::NotRun
    );
    assert_eq!(record.provider, provider.node.node.client.key().public());
    assert_ne!(record.provider, record.renter);

    renter.cancel.cancel();
    provider.cancel.cancel();
    remove_container(&sb, id).await;
}
