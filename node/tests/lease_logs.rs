//! Container output of a lease (issue 11), real Docker and the probe image: a renter following
//! the output while the container runs gets it byte for byte (every byte value, invalid UTF-8
//! included), and output past the provider's cap is dropped.
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::time::Duration;

use gridlease_node::lease::MAX_LOG_BYTES;
use gridlease_node::lease::logs::cut_notice;
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
async fn output_past_the_cap_keeps_its_head_and_its_tail_and_says_what_was_cut() {
    let Some(sb) = docker_or_skip("output_cap").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (provider, renter, offer) = market(dir.path(), &sb, lease_template(1, 1, 10), 10).await;
    let cap = usize::try_from(MAX_LOG_BYTES).unwrap();
    let total = cap + cap / 4;
    let n = total.to_string();
    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 60, &["bytes", &n, "exit", "0"]))
        .await
        .unwrap();
    let v = closed(&provider.leases, id, 60).await;
    assert_eq!(v.state, gridlease_contracts::LeaseState::Settled);
    let (local, exit) = read_logs(&provider.leases, id).await;
    let (head, tail) = (cap / 2, cap - cap / 2);
    let all = pattern(total);
    let mut expected = all[..head].to_vec();
    expected.extend_from_slice(cut_notice((total - head - tail) as u64, tail).as_bytes());
    expected.extend_from_slice(&all[total - tail..]);
    assert_eq!(local.len(), expected.len(), "head, notice, tail");
    assert!(local == expected, "the first and the last bytes, exactly");
    assert_eq!(exit, Some(0));
    // The renter reads the same over the network.
    let (remote, _) = read_logs(&renter.leases, id).await;
    assert!(remote == expected);
    closed(&renter.leases, id, 30).await;
    remove_container(&sb, id).await;
}

/// A 300,000-line job of 40-byte lines (12 MB, past the 8 MiB the provider keeps): the saved
/// log starts with the first line, ends with the last one, and says how many bytes were cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_job_keeps_its_last_line() {
    let Some(sb) = docker_or_skip("long_job_last_line").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (provider, renter, offer) = market(dir.path(), &sb, lease_template(1, 1, 10), 10).await;
    let id = renter
        .leases
        .rent(probe_rent(
            offer,
            &image,
            60,
            &["lines", "300000", "40", "exit", "0"],
        ))
        .await
        .unwrap();
    closed(&provider.leases, id, 90).await;
    let (log, exit) = read_logs(&renter.leases, id).await;
    assert_eq!(exit, Some(0));
    let line = |k: u32| {
        let t = format!("line {k} ");
        format!("{t}{}\n", ".".repeat(40 - t.len() - 1))
    };
    let total = 300_000 * 40;
    let text = String::from_utf8(log).unwrap();
    assert!(text.starts_with(&(line(1) + &line(2))), "{}", &text[..80]);
    assert!(
        text.ends_with(&(line(299_999) + &line(300_000))),
        "the last line is kept: {}",
        &text[text.len() - 80..]
    );
    let cap = usize::try_from(MAX_LOG_BYTES).unwrap();
    let notice = cut_notice((total - cap) as u64, cap - cap / 2);
    assert!(text.contains(&notice), "the cut is stated");
    assert_eq!(text.len(), cap + notice.len());
    closed(&renter.leases, id, 30).await;
    remove_container(&sb, id).await;
}
