//! Lifecycle against the real Docker daemon: deadline enforcement, crash reconciliation, and
//! the unreachable-daemon error.

// Helpers outside #[test] fns: a panic is a test failure with a clear location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Cleanup, lease, probe_spec, unique};
use gridlease_contracts::StopSchedule;
use gridlease_protocol::Timestamp;
use gridlease_sandbox::runtime::{TermClaim, now_ms};

/// A probe that ignores SIGTERM and would sleep 60 s is stopped by the deadline watcher
/// (SIGTERM at deadline - grace, SIGKILL at the deadline) within 1 s of the deadline.
#[tokio::test]
async fn container_past_lease_end_is_stopped_within_one_second() {
    let Some(sb) = common::sandbox_or_skip("deadline").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let mut cleanup = Cleanup::default();
    let mut spec = probe_spec(&image, &unique("node"), &["ignore-term", "sleep", "60"]);
    let id = sb.create(&spec).await.unwrap();
    cleanup.containers.push(id.clone());
    sb.start(&id).await.unwrap();
    let deadline = Timestamp(now_ms().0 + 2500);
    spec.expires_at = deadline;
    sb.enforce_deadline(&id, deadline, Duration::from_secs(1))
        .await
        .unwrap();
    let exit = sb.exit_info(&id).await.unwrap();
    let finished = exit.finished_at.expect("finished_at");
    let late_ms = finished.0 as i64 - deadline.0 as i64;
    println!("exit={exit:?} deadline={deadline} finished={finished} late_ms={late_ms}");
    assert!(late_ms <= 1000, "stopped {late_ms} ms after the deadline");
    assert!(
        late_ms >= -1500,
        "stopped {late_ms} ms before deadline (before SIGTERM time)"
    );
    assert_eq!(
        exit.exit_code, 137,
        "SIGTERM is ignored, so SIGKILL must have stopped it"
    );
}

/// The node and its watchdog enforce the same deadline with one [`TermClaim`]: the tenant (which
/// ignores SIGTERM) gets exactly one SIGTERM, at deadline - grace, and SIGKILL at the deadline;
/// Docker's event log counts the kill calls. An enforcer that comes after the stop (a restarted
/// node) and one for a container that does not exist return at once and send nothing.
#[tokio::test]
async fn node_and_watchdog_with_one_claim_send_one_sigterm() {
    let Some(sb) = common::sandbox_or_skip("deadline-claim").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let mut cleanup = Cleanup::default();
    let spec = probe_spec(&image, &unique("node"), &["ignore-term", "sleep", "60"]);
    let id = sb.create(&spec).await.unwrap();
    cleanup.containers.push(id.clone());
    sb.start(&id).await.unwrap();
    let marker = std::env::temp_dir().join(unique("gridlease-term"));
    let claim = TermClaim::new(marker.clone());
    let since = now_ms();
    let deadline = Timestamp(since.0 + 2500);
    let schedule = StopSchedule::at_deadline(deadline, 1000);
    let (a, b) = tokio::join!(
        sb.enforce_stop(&id, schedule, &now_ms, Some(&claim)),
        sb.enforce_stop(&id, schedule, &now_ms, Some(&claim)),
    );
    a.unwrap();
    b.unwrap();
    let exit = sb.exit_info(&id).await.unwrap();
    let finished = exit.finished_at.unwrap();
    println!("exit={exit:?} deadline={deadline}");
    assert_eq!(exit.exit_code, 137, "killed, not terminated");
    assert!(finished >= deadline, "killed before the deadline: {exit:?}");
    assert!(
        finished.0 <= deadline.0 + 500,
        "killed {} ms after the deadline",
        finished.0 - deadline.0
    );
    // Late enforcers: nothing to do.
    let t = std::time::Instant::now();
    sb.enforce_stop(&id, schedule, &now_ms, Some(&claim))
        .await
        .unwrap();
    sb.enforce_stop("gridlease-no-such-container", schedule, &now_ms, None)
        .await
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let signals = common::kill_signals(&sb, &id, since).await;
    println!("signals sent: {signals:?}");
    assert_eq!(
        signals.iter().filter(|s| *s == "15").count(),
        1,
        "one SIGTERM: {signals:?}"
    );
    assert!(signals.iter().any(|s| s == "9"), "SIGKILL: {signals:?}");
    assert!(claim.taken());
    let _ = std::fs::remove_file(marker);
}

/// A cooperative container stops at SIGTERM, before the deadline.
#[tokio::test]
async fn cooperative_container_stops_on_sigterm_before_deadline() {
    let Some(sb) = common::sandbox_or_skip("deadline-term").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let mut cleanup = Cleanup::default();
    let spec = probe_spec(&image, &unique("node"), &["sleep", "60"]);
    let id = sb.create(&spec).await.unwrap();
    cleanup.containers.push(id.clone());
    sb.start(&id).await.unwrap();
    let deadline = Timestamp(now_ms().0 + 2000);
    sb.enforce_deadline(&id, deadline, Duration::from_secs(1))
        .await
        .unwrap();
    let exit = sb.exit_info(&id).await.unwrap();
    let finished = exit.finished_at.unwrap();
    assert!(finished <= Timestamp(deadline.0 + 200), "{exit:?}");
    assert_eq!(exit.exit_code, 143, "terminated by SIGTERM (via tini)");
}

/// Simulated node crash: containers exist for leases A (live) and B (gone), lease C is live
/// but has no container, and another node's container must not be touched.
#[tokio::test]
async fn reconciliation_removes_orphans_and_flags_missing() {
    let Some(sb) = common::sandbox_or_skip("reconcile").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let mut cleanup = Cleanup::default();
    let node = unique("node");
    let other_node = unique("other-node");

    let mut a = probe_spec(&image, &node, &["sleep", "60"]);
    a.lease_id = lease("a");
    let mut b = probe_spec(&image, &node, &["sleep", "60"]);
    b.lease_id = lease("b");
    let mut foreign = probe_spec(&image, &other_node, &["sleep", "60"]);
    foreign.lease_id = lease("foreign");
    let c = lease("c");

    let mut ids = Vec::new();
    for s in [&a, &b, &foreign] {
        let id = sb.create(s).await.unwrap();
        cleanup.containers.push(id.clone());
        sb.start(&id).await.unwrap();
        ids.push(id);
    }
    // "Crash": the node forgets everything except its live lease set.
    let live = BTreeSet::from([a.lease_id, c]);
    let report = sb.reconcile(&node, &live).await.unwrap();
    println!("{report:?}");

    assert_eq!(report.kept, vec![(ids[0].clone(), a.lease_id)]);
    assert_eq!(report.removed.len(), 1);
    assert_eq!(report.removed[0].0, ids[1]);
    assert_eq!(report.missing, vec![c]);
    let remaining = sb.list_node_containers(&node).await.unwrap();
    assert_eq!(remaining.len(), 1, "orphan still present: {remaining:?}");
    assert!(
        sb.inspect(&ids[1]).await.is_err(),
        "orphan B was not removed"
    );
    assert!(
        sb.inspect(&ids[2]).await.is_ok(),
        "another node's container was touched"
    );
}

/// Two removals of the same running container at once (the node's and an operator's `docker
/// rm`, or the watchdog's) both succeed: the one that finds the removal in progress (Docker's
/// 409) waits for it instead of reporting a container that will be gone a moment later (a
/// provider that believed it kept the lease's GPUs held until its next restart).
#[tokio::test]
async fn concurrent_removals_of_one_container_both_succeed() {
    let Some(sb) = common::sandbox_or_skip("remove-twice").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let mut cleanup = Cleanup::default();
    let node = unique("node");
    // Several rounds: a 409 needs the second call to arrive while the first is removing.
    for _ in 0..5 {
        let spec = probe_spec(&image, &node, &["ignore-term", "sleep", "60"]);
        let id = sb.create(&spec).await.unwrap();
        cleanup.containers.push(id.clone());
        sb.start(&id).await.unwrap();
        let (a, b) = tokio::join!(sb.remove(&id), sb.remove(&id));
        assert!(a.is_ok() && b.is_ok(), "{a:?} {b:?}");
        assert!(sb.inspect(&id).await.is_err(), "the container is gone");
    }
}

#[tokio::test]
async fn unreachable_daemon_error_says_how_to_fix_it() {
    let path = format!("/tmp/{}.sock", unique("gl-no-docker"));
    let err = gridlease_sandbox::docker::connect_unix(&path)
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("cannot reach the Docker daemon"), "{msg}");
    assert!(msg.contains("Is dockerd running"), "{msg}");
    assert!(msg.contains("/var/run/docker.sock"), "{msg}");
}

/// Logs follow a running container and are bounded.
#[tokio::test]
async fn logs_follow_until_exit_and_are_bounded() {
    let Some(sb) = common::sandbox_or_skip("logs").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let mut cleanup = Cleanup::default();
    let spec = probe_spec(
        &image,
        &unique("node"),
        &[
            "sentinel", "one", "sleep", "0.5", "sentinel", "two", "exit", "3",
        ],
    );
    let id = sb.create(&spec).await.unwrap();
    cleanup.containers.push(id.clone());
    sb.start(&id).await.unwrap();
    // Following from the start returns only once the container has exited.
    let all = sb.logs(&id, true, 1 << 16).await.unwrap();
    assert!(
        all.contains("SENTINEL one") && all.contains("SENTINEL two"),
        "{all}"
    );
    let exit = sb.wait(&id).await.unwrap();
    assert_eq!(exit.exit_code, 3);
    assert!(!exit.oom_killed);
    let mut chunks = Vec::new();
    let n = sb
        .logs_with(&id, false, 5, |c| chunks.extend_from_slice(c))
        .await
        .unwrap();
    assert_eq!(n, 5);
    assert_eq!(chunks, b"SENTI");
}

/// A pull that fails surfaces as an error (no panic, no hang). The "registry" is a listener
/// this test starts on loopback that closes every connection; nothing else is contacted.
#[tokio::test]
async fn failed_pull_is_an_error() {
    let Some(sb) = common::sandbox_or_skip("pull").await else {
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(20) {
            drop(conn);
        }
    });
    let image = format!("127.0.0.1:{port}/gridlease-test/{}:1", unique("img"));
    let mut events = 0usize;
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        sb.ensure_image(&image, |_| events += 1),
    )
    .await
    .expect("pull did not finish within 60 s");
    let err = result.unwrap_err();
    println!("events={events} err={err}");
    assert!(err.to_string().contains(&image), "{err}");
}
