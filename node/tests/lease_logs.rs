//! Container output of a lease (issue 11), real Docker and the probe image: a renter following
//! the output while the container runs gets it byte for byte (every byte value, invalid UTF-8
//! included), and output past the provider's cap is dropped.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::time::Duration;

use gridlease_node::lease::MAX_LOG_BYTES;
use lease_support::*;

/// What the probe's `bytes N` step writes: byte i is i mod 256.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 256) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_gets_byte_exact_output_while_the_container_runs() {
    let Some(sb) = docker_or_skip("follower_byte_exact").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (provider, renter, offer) = market(dir.path(), &sb, lease_template(1, 1, 10), 10).await;
    // The probe pauses 12 s between the two parts, so that even on a loaded machine (the whole
    // suite on 2 cores) the follower has read the first part while the container still runs.
    let (first, second) = (100_000, 150_000);
    let (a, b) = (first.to_string(), second.to_string());
    let id = renter
        .leases
        .rent(probe_rent(
            offer,
            &image,
            60,
            &[
                "bytes", &a, "sleep", "12", "bytes", &b, "sentinel", "END", "exit", "3",
            ],
        ))
        .await
        .unwrap();
    let mut expected = pattern(first);
    expected.extend_from_slice(&pattern(second));
    expected.extend_from_slice(b"SENTINEL END\n");
    assert!(std::str::from_utf8(&expected).is_err(), "not valid UTF-8");

    // Follow as `gridlease logs -f` does, from the renter over the network.
    let mut out = Vec::new();
    let mut offset = 0;
    let mut seen_while_running = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let exit = loop {
        assert!(tokio::time::Instant::now() < deadline, "no eof in time");
        let chunk = match renter.leases.logs(id, offset).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("logs: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        assert_eq!(chunk.next_offset, offset + chunk.data.len() as u64);
        assert!(chunk.data.len() <= 32 * 1024);
        out.extend_from_slice(&chunk.data);
        offset = chunk.next_offset;
        if seen_while_running.is_none() && out.len() >= first {
            let v = provider.leases.lease(id).await.unwrap().unwrap();
            seen_while_running = Some((v.state, v.exit_code));
        }
        if chunk.eof {
            break chunk.exit_code;
        }
        if chunk.data.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    // The first bytes arrived while the container ran (the provider may not have recorded
    // `running` yet when the first output is already there: the log is followed from start).
    let (state, exit_code) = seen_while_running.unwrap();
    assert!(
        matches!(
            state,
            gridlease_contracts::LeaseState::Starting | gridlease_contracts::LeaseState::Running
        ) && exit_code.is_none(),
        "the first bytes arrived while the container ran: {state:?} {exit_code:?}"
    );
    assert_eq!(out.len(), expected.len());
    assert!(
        out == expected,
        "the output differs from what the probe wrote"
    );
    assert_eq!(exit, Some(3));

    // The provider's own copy and its local reads agree.
    let file = dir
        .path()
        .join("provider")
        .join("leases")
        .join(format!("{id}.log"));
    assert!(std::fs::read(&file).unwrap() == expected);
    let (local, exit) = read_logs(&provider.leases, id).await;
    assert!(local == expected);
    assert_eq!(exit, Some(3));
    closed(&renter.leases, id, 30).await;
    remove_container(&sb, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn output_past_the_cap_is_dropped() {
    let Some(sb) = docker_or_skip("output_cap").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (provider, renter, offer) = market(dir.path(), &sb, lease_template(1, 1, 10), 10).await;
    let cap = usize::try_from(MAX_LOG_BYTES).unwrap();
    let n = (cap + cap / 4).to_string();
    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 60, &["bytes", &n, "exit", "0"]))
        .await
        .unwrap();
    let v = closed(&provider.leases, id, 60).await;
    assert_eq!(v.state, gridlease_contracts::LeaseState::Settled);
    let (local, exit) = read_logs(&provider.leases, id).await;
    assert_eq!(local.len(), cap, "kept exactly the cap");
    assert!(local == pattern(cap), "the first bytes, exactly");
    assert_eq!(exit, Some(0));
    closed(&renter.leases, id, 30).await;
    remove_container(&sb, id).await;
}
