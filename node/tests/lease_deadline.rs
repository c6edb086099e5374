//! Deadline arithmetic (issue 12): SIGTERM at deadline - grace, SIGKILL at the deadline, and a
//! final report that never claims more than the lease. Two real nodes on loopback, real Docker
//! with the probe image.
//!
//! The container's times come from the Docker daemon's event stream (`start`, `kill` with its
//! signal, `die` with the exit code, each with the daemon's nanosecond time), followed live from
//! before the rent: the provider removes the container when the lease settles, so a
//! `docker inspect` afterwards has nothing to show, and the events are the daemon's own record
//! of the same moments (`die` is when `State.FinishedAt` is set).
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::collections::HashMap;

use futures::StreamExt;
use gridlease_contracts::LeaseState;
use gridlease_sandbox::Sandbox;
use gridlease_sandbox::spec::LABEL_NODE;
use lease_support::*;

/// 1 s reports, 3 s pay-ahead window, 3 s grace (the renter's).
const INTERVAL_S: u32 = 1;
const WINDOW_S: u32 = 3;
const GRACE_S: u32 = 3;
/// Cost of one second of one GPU at [`PRICE`].
const PER_S: u64 = 1000;
/// The provider's SIGTERM-to-SIGKILL grace (`service_config`).
const STOP_GRACE_MS: i64 = 1000;
/// How late after the deadline (by the daemon's clock, from its `start` event) SIGKILL may be
/// sent and the container may be recorded dead: the node's start bookkeeping and the daemon's
/// own latency (about 50 ms measured here), far below one grace.
const SLACK_MS: f64 = 500.0;

/// One container event: what, when (daemon time, unix ms with a fraction), its attributes.
#[derive(Debug, Clone)]
struct Event {
    action: String,
    at_ms: f64,
    attributes: HashMap<String, String>,
}

/// Follows the daemon's events for containers labelled with `node` until `stop` fires,
/// sending each to the returned channel (bounded; the test reads it afterwards).
fn follow_events(
    sb: &Sandbox,
    node: &str,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::sync::mpsc::Receiver<Event> {
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let docker = sb.docker().clone();
    let label = format!("{LABEL_NODE}={node}");
    tokio::spawn(async move {
        let mut filters = HashMap::new();
        filters.insert("type", vec!["container"]);
        filters.insert("label", vec![label.as_str()]);
        let opts = bollard::query_parameters::EventsOptionsBuilder::default()
            .filters(&filters)
            .build();
        let mut events = docker.events(Some(opts));
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                e = events.next() => match e {
                    Some(Ok(e)) => {
                        let ev = Event {
                            action: e.action.unwrap_or_default(),
                            at_ms: e.time_nano.unwrap_or(0) as f64 / 1e6,
                            attributes: e.actor.and_then(|a| a.attributes).unwrap_or_default(),
                        };
                        if tx.send(ev).await.is_err() {
                            return;
                        }
                    }
                    _ => return,
                },
            }
        }
    });
    rx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_ignoring_sigterm_is_killed_at_the_deadline_and_pays_exactly_the_lease() {
    let Some(Setup {
        sb,
        image,
        dir: _dir,
        provider,
        renter,
        offer,
    }) = setup(
        "deadline_arithmetic",
        lease_template(1, INTERVAL_S, WINDOW_S),
        GRACE_S,
    )
    .await
    else {
        return;
    };
    let stop_events = tokio_util::sync::CancellationToken::new();
    let mut events = follow_events(&sb, &provider.node.peer.to_string(), stop_events.clone());
    const DURATION_S: u32 = 5;
    let lease_cost = u64::from(DURATION_S) * PER_S;
    let mut req = probe_rent(
        offer,
        &image,
        DURATION_S,
        &["ignore-term", "sentinel", "UP", "sleep", "120"],
    );
    // A budget well above the lease: only the duration cap can hold the bill to the lease.
    req.max_total = Some(gridlease_contracts::Money::from_micros(10 * lease_cost));
    let id = renter.leases.rent(req).await.unwrap();
    let pdone = closed(&provider.leases, id, 60).await;
    let rdone = closed(&renter.leases, id, 30).await;
    stop_events.cancel();
    remove_container(&sb, id).await;
    let mut seen = Vec::new();
    while let Some(e) = events.recv().await {
        seen.push(e);
    }
    eprintln!("provider {pdone:#?}\nrenter {rdone:#?}");
    for e in &seen {
        eprintln!(
            "{:.3} {} {:?}",
            e.at_ms,
            e.action,
            e.attributes.get("signal")
        );
    }

    // Killed at the deadline: started, one SIGTERM (ignored) grace before the deadline, SIGKILL
    // at the deadline, died killed, all within the lease plus a little slack.
    let at = |action: &str| {
        seen.iter()
            .find(|e| e.action == action)
            .unwrap_or_else(|| panic!("no {action} event"))
            .clone()
    };
    let (start, die) = (at("start"), at("die"));
    let signals: Vec<_> = seen
        .iter()
        .filter(|e| e.action == "kill")
        .map(|e| (e.attributes["signal"].clone(), e.at_ms - start.at_ms))
        .collect();
    let ran_ms = die.at_ms - start.at_ms;
    let duration_ms = f64::from(DURATION_S) * 1000.0;
    eprintln!("ran {ran_ms:.1} ms for a {duration_ms} ms lease; signals {signals:?}");
    assert_eq!(die.attributes["exitCode"], "137", "SIGKILLed");
    assert!(ran_ms >= duration_ms, "stopped before the deadline");
    assert!(
        ran_ms <= duration_ms + SLACK_MS,
        "stopped {:.0} ms after the deadline",
        ran_ms - duration_ms
    );
    let terms: Vec<_> = signals.iter().filter(|(s, _)| s == "15").collect();
    assert_eq!(terms.len(), 1, "one SIGTERM: {signals:?}");
    let term_ms = terms[0].1;
    assert!(
        term_ms >= duration_ms - STOP_GRACE_MS as f64 && term_ms <= duration_ms - 500.0,
        "SIGTERM at {term_ms:.0} ms, expected about {} ms",
        duration_ms - STOP_GRACE_MS as f64
    );
    let kill = signals.iter().find(|(s, _)| s == "9").expect("a SIGKILL");
    assert!(
        kill.1 >= duration_ms && kill.1 <= duration_ms + SLACK_MS,
        "SIGKILL at {:.0} ms",
        kill.1
    );

    // Paid exactly the lease: the final report claims the duration, not the run time.
    assert_eq!(pdone.state, LeaseState::Settled);
    assert_eq!(rdone.state, LeaseState::Settled);
    assert_eq!(pdone.close_reason.as_deref(), Some("expired"));
    assert_eq!(pdone.exit_code, Some(137));
    let usage = pdone.usage.as_ref().unwrap();
    assert_eq!(usage.wall_ms, u64::from(DURATION_S) * 1000, "{usage:?}");
    assert_eq!(pdone.settled_total, Some(lease_cost));
    assert_eq!(rdone.settled_total, Some(lease_cost));
    let pl = provider.leases.ledger().await.unwrap();
    let rl = renter.leases.ledger().await.unwrap();
    assert_eq!(pl.total_earned, lease_cost);
    assert_eq!(rl.total_spent, lease_cost);
    assert!(!container_exists(&sb, id).await, "container removed");
    provider.cancel.cancel();
    renter.cancel.cancel();
}
