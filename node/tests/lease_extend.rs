//! `extend` (issue 13): a running lease's signed amendment to a longer duration. Two real
//! nodes on loopback, real Docker with the probe image; the provider runs the deadline
//! watchdog of the real `gridlease` binary, so a watchdog that missed the new deadline would
//! stop the container at the old one.
//!
//! The container's times come from the Docker daemon's event stream (as in `lease_deadline`).
// Test helpers unwrap: a failed step is a test failure with its location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;
mod lease_support;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use gridlease_contracts::LeaseState;
use gridlease_node::lease::{ExtendError, ExtendRequest};
use gridlease_node::net::codec::{LeaseRpc, LeaseRpcResponse};
use gridlease_protocol::session::{SessionRequest, SessionResponse};
use gridlease_protocol::{AmendRefusal, LeaseAmendment, NodeKey, Signed};
use gridlease_sandbox::Sandbox;
use gridlease_sandbox::spec::LABEL_NODE;
use lease_support::*;

/// 1 s reports, 3 s pay-ahead window, 3 s grace (the renter's).
const INTERVAL_S: u32 = 1;
const WINDOW_S: u32 = 3;
const GRACE_S: u32 = 3;
/// Cost of one second of one GPU at [`PRICE`].
const PER_S: u64 = 1000;
/// How late after the deadline the container may be recorded dead (the node's bookkeeping and
/// the daemon's latency; see `lease_deadline`).
const SLACK_MS: f64 = 500.0;

/// The `gridlease` binary, whose hidden `__watchdog` the provider spawns per container.
const WATCHDOG_EXE: &str = env!("CARGO_BIN_EXE_gridlease");

/// One container event: what, when (daemon time, unix ms), its attributes.
#[derive(Debug, Clone)]
struct Event {
    action: String,
    at_ms: f64,
    attributes: HashMap<String, String>,
}

/// Follows the daemon's events for containers labelled with `node` until `stop` fires.
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

/// Docker, the probe image, a provider (offering `template`, with the real watchdog) and a
/// renter holding its offer; `None` when Docker is unreachable and not required.
async fn extend_setup(
    test: &str,
    template: gridlease_node::net::OfferTemplate,
) -> Option<(Setup, PathBuf)> {
    let sb = docker_or_skip(test).await?;
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let provider = provider_with(dir.path(), &sb, template, GRACE_S, |svc| {
        svc.watchdog = Some(PathBuf::from(WATCHDOG_EXE));
    })
    .await;
    let mut renter = party(
        dir.path(),
        "renter",
        common::config(),
        service_config(dir.path(), "renter", GRACE_S),
        None,
    )
    .await;
    let offer = connect_for_offer(&mut renter, &provider).await;
    let leases = dir.path().join("provider").join("leases");
    Some((
        Setup {
            sb,
            image,
            dir,
            provider,
            renter,
            offer,
        },
        leases,
    ))
}

fn seconds(s: u32) -> ExtendRequest {
    ExtendRequest {
        seconds: Some(s),
        ..ExtendRequest::default()
    }
}

/// A 6 s lease of a tenant that ignores SIGTERM, extended by 4 s a second or two into its run:
/// the container still runs at 6 s + 1 s (neither the session nor the watchdog stopped it at
/// the first deadline), is SIGKILLed at 10 s, and both ledgers book exactly 10 s of the price.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_extended_mid_run_runs_past_its_first_deadline_and_pays_every_second() {
    let Some((
        Setup {
            sb,
            image,
            dir: _dir,
            provider,
            renter,
            offer,
        },
        leases_dir,
    )) = extend_setup("extend_mid_run", lease_template(1, INTERVAL_S, WINDOW_S)).await
    else {
        return;
    };
    let stop_events = tokio_util::sync::CancellationToken::new();
    let mut events = follow_events(&sb, &provider.node.peer.to_string(), stop_events.clone());
    const D: u32 = 6;
    const E: u32 = 4;
    let req = probe_rent(
        offer,
        &image,
        D,
        &["ignore-term", "sentinel", "UP", "sleep", "120"],
    );
    let id = renter.leases.rent(req).await.unwrap();
    // The renter knows it runs from the provider's first report.
    let before = wait_view(&renter.leases, id, "running on the renter", |v| {
        v.state == LeaseState::Running
    })
    .await;
    assert_eq!((before.duration_s, before.extensions), (D, 0));
    assert_eq!(before.max_total, u64::from(D) * PER_S, "the default cap");
    // The watchdog holds the first deadline before the extension moves it: its process starts
    // with the container, and on a loaded machine it may take longer than the extension.
    let wlog_path = leases_dir.join(format!("{id}.watchdog.log"));
    let waiting = std::time::Instant::now();
    while !std::fs::read_to_string(&wlog_path)
        .unwrap_or_default()
        .contains("watchdog started")
    {
        assert!(
            waiting.elapsed() < Duration::from_secs(30),
            "the watchdog did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let x = renter.leases.extend(id, seconds(E)).await.unwrap();
    eprintln!("extended: {x:?}");
    assert_eq!(x.extensions, 1);
    assert_eq!(x.duration_s, D + E);
    assert_eq!(
        x.max_total,
        u64::from(D + E) * PER_S,
        "the cap rose by 4 s of cost"
    );
    let started = provider
        .leases
        .lease(id)
        .await
        .unwrap()
        .unwrap()
        .started_at
        .unwrap();
    assert_eq!(x.deadline_ms, started + u64::from(D + E) * 1000);
    // Both views show the new terms.
    for (who, svc) in [("renter", &renter.leases), ("provider", &provider.leases)] {
        let v = svc.lease(id).await.unwrap().unwrap();
        assert_eq!(
            (v.duration_s, v.extensions, v.max_total),
            (D + E, 1, u64::from(D + E) * PER_S),
            "{who}: {v:?}"
        );
    }
    // Still running one second after the first deadline.
    let past_first = started + u64::from(D) * 1000 + 1000;
    let now = gridlease_node::clock::now().0;
    tokio::time::sleep(Duration::from_millis(past_first.saturating_sub(now))).await;
    let running = sb
        .inspect(&format!("gridlease-{id}"))
        .await
        .unwrap()
        .state
        .and_then(|s| s.running);
    assert_eq!(running, Some(true), "stopped at the first deadline");

    let pdone = closed(&provider.leases, id, 60).await;
    let rdone = closed(&renter.leases, id, 30).await;
    stop_events.cancel();
    remove_container(&sb, id).await;
    let mut seen = Vec::new();
    while let Some(e) = events.recv().await {
        seen.push(e);
    }
    eprintln!("provider {pdone:#?}\nrenter {rdone:#?}");
    let at = |action: &str| {
        seen.iter()
            .find(|e| e.action == action)
            .unwrap_or_else(|| panic!("no {action} event"))
            .clone()
    };
    let (start, die) = (at("start"), at("die"));
    let ran_ms = die.at_ms - start.at_ms;
    let total_ms = f64::from(D + E) * 1000.0;
    eprintln!("ran {ran_ms:.1} ms for a lease extended to {total_ms} ms");
    assert_eq!(die.attributes["exitCode"], "137", "SIGKILLed");
    assert!(ran_ms >= total_ms, "stopped before the new deadline");
    assert!(
        ran_ms <= total_ms + SLACK_MS,
        "stopped {:.0} ms after the new deadline",
        ran_ms - total_ms
    );
    let kills: Vec<f64> = seen
        .iter()
        .filter(|e| e.action == "kill")
        .map(|e| e.at_ms - start.at_ms)
        .collect();
    assert!(
        kills.iter().all(|k| *k >= f64::from(D) * 1000.0),
        "signalled before the first deadline: {kills:?}"
    );

    // Paid exactly the extended lease: price x 10 s, in both ledgers.
    let lease_cost = u64::from(D + E) * PER_S;
    assert_eq!(pdone.state, LeaseState::Settled);
    assert_eq!(rdone.state, LeaseState::Settled);
    assert_eq!(pdone.close_reason.as_deref(), Some("expired"));
    assert_eq!(
        pdone.usage.as_ref().unwrap().wall_ms,
        u64::from(D + E) * 1000
    );
    assert_eq!(pdone.settled_total, Some(lease_cost));
    assert_eq!(rdone.settled_total, Some(lease_cost));
    assert_eq!((pdone.extensions, rdone.extensions), (1, 1));
    let pl = provider.leases.ledger().await.unwrap();
    let rl = renter.leases.ledger().await.unwrap();
    assert_eq!(pl.total_earned, lease_cost);
    assert_eq!(rl.total_spent, lease_cost);
    // Both sides' statements verify with the amendment, owing exactly the extended lease.
    for side in [&provider, &renter] {
        let st = side.leases.statement(id).await.unwrap();
        let v = gridlease_contracts::statement::verify(&st).expect("the statement verifies");
        assert_eq!(v.amendments, 1);
        assert_eq!(v.terms.duration_s, D + E);
        assert_eq!(v.owed.micros(), lease_cost);
    }
    // The watchdog learned the new deadline (and did not act on the old one).
    let wlog = std::fs::read_to_string(leases_dir.join(format!("{id}.watchdog.log"))).unwrap();
    eprintln!("watchdog log:\n{wlog}");
    assert!(wlog.contains("deadline moved later"), "{wlog}");
    assert!(!container_exists(&sb, id).await, "container removed");
    provider.cancel.cancel();
    renter.cancel.cancel();
}

/// Refusals: beyond the offer's longest lease, a replayed or skipped sequence, a signature not
/// the renter's, and a lease that is over: each with its reason, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_extensions_say_why_and_change_nothing() {
    let mut template = lease_template(1, INTERVAL_S, WINDOW_S);
    template.max_duration_s = 40;
    let Some((
        Setup {
            sb,
            image,
            dir: _dir,
            provider,
            renter,
            offer,
        },
        _,
    )) = extend_setup("extend_refused", template).await
    else {
        return;
    };
    let id = renter
        .leases
        .rent(probe_rent(offer, &image, 30, &["sleep", "120"]))
        .await
        .unwrap();
    let before = wait_view(&renter.leases, id, "running on the renter", |v| {
        v.state == LeaseState::Running
    })
    .await;
    let unchanged = |v: &gridlease_node::lease::LeaseView| {
        (v.duration_s, v.max_total, v.extensions) == (30, 30 * PER_S, 0)
    };
    assert!(unchanged(&before), "{before:?}");

    // Beyond the offer's max duration (40 s): the provider's refusal, with its reason.
    match renter.leases.extend(id, seconds(11)).await {
        Err(ExtendError::Refused(AmendRefusal::BeyondMaxDuration { max_s: 40 })) => {}
        other => panic!("{other:?}"),
    }
    // A lower cap is refused here already, with the provider's rule.
    let lower = ExtendRequest {
        seconds: Some(5),
        max_total: Some(gridlease_contracts::Money::from_micros(1)),
        ..ExtendRequest::default()
    };
    assert!(matches!(
        renter.leases.extend(id, lower).await,
        Err(ExtendError::Refused(AmendRefusal::BudgetLowered { .. }))
    ));
    // The provider cannot extend what it provides.
    assert!(matches!(
        provider.leases.extend(id, seconds(5)).await,
        Err(ExtendError::NotRenter(_))
    ));

    // Raw amendments over the renter's connection: a skipped sequence, then one signed by
    // another key.
    let client = &renter.node.node.client;
    let provider_peer = provider.node.peer;
    let send = |signed: Signed<LeaseAmendment>| async move {
        let rpc = LeaseRpc::Session(SessionRequest::Extend(signed));
        match client
            .lease_rpc(provider_peer, Vec::new(), rpc)
            .await
            .unwrap()
        {
            LeaseRpcResponse::Session(r) => r,
            other => panic!("{other:?}"),
        }
    };
    let a = LeaseAmendment {
        lease_id: id,
        seq: 2,
        duration_s: 35,
        max_total: 35 * PER_S,
        created_at: gridlease_node::clock::now(),
    };
    let net = client.network().clone();
    match send(Signed::sign(client.key(), &net, &a).unwrap()).await {
        SessionResponse::ExtendRefused(AmendRefusal::BadSequence { expected: 1 }) => {}
        other => panic!("{other:?}"),
    }
    let stranger = NodeKey::from_secret([77; 32]);
    let forged = LeaseAmendment {
        seq: 1,
        ..a.clone()
    };
    match send(Signed::sign(&stranger, &net, &forged).unwrap()).await {
        SessionResponse::ExtendRefused(AmendRefusal::BadSignature) => {}
        other => panic!("{other:?}"),
    }
    for (who, svc) in [("renter", &renter.leases), ("provider", &provider.leases)] {
        let v = svc.lease(id).await.unwrap().unwrap();
        assert!(unchanged(&v), "{who}: {v:?}");
    }

    // Within the offer: accepted; then, once the lease is over, refused as not running.
    let x = renter.leases.extend(id, seconds(10)).await.unwrap();
    assert_eq!((x.extensions, x.duration_s), (1, 40));
    renter.leases.stop(id).await.unwrap();
    let rdone = closed(&renter.leases, id, 30).await;
    let pdone = closed(&provider.leases, id, 30).await;
    match renter.leases.extend(id, seconds(1)).await {
        Err(ExtendError::Refused(AmendRefusal::NotRunning { state })) => {
            assert_eq!(state, "settled")
        }
        other => panic!("{other:?}"),
    }
    // The settled statements agree and keep the one accepted extension.
    assert_eq!(rdone.settled_total, pdone.settled_total);
    assert_eq!((rdone.extensions, pdone.extensions), (1, 1));
    assert_eq!(rdone.duration_s, 40);
    remove_container(&sb, id).await;
    provider.cancel.cancel();
    renter.cancel.cancel();
}

/// The provider accepts an extension but its answer is lost (`Busy` instead): the renter keeps
/// the amendment pending and, when a report goes past the duration it holds, sends it again,
/// gets the same acceptance and takes the new terms; the lease runs to the new deadline and
/// both ledgers book it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_acceptance_is_recovered_before_a_report_is_refused() {
    let Some(sb) = docker_or_skip("extend_lost_answer").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let provider = provider_with(
        dir.path(),
        &sb,
        lease_template(1, INTERVAL_S, WINDOW_S),
        GRACE_S,
        |svc| {
            svc.watchdog = Some(PathBuf::from(WATCHDOG_EXE));
            svc.faults.lose_first_extend_answer = true;
        },
    )
    .await;
    let mut renter = party(
        dir.path(),
        "renter",
        common::config(),
        service_config(dir.path(), "renter", GRACE_S),
        None,
    )
    .await;
    let offer = connect_for_offer(&mut renter, &provider).await;
    const D: u32 = 4;
    const E: u32 = 3;
    let id = renter
        .leases
        .rent(probe_rent(
            offer,
            &image,
            D,
            &["ignore-term", "sleep", "120"],
        ))
        .await
        .unwrap();
    wait_view(&renter.leases, id, "running on the renter", |v| {
        v.state == LeaseState::Running
    })
    .await;
    match renter.leases.extend(id, seconds(E)).await {
        Err(e @ ExtendError::Remote { .. }) => eprintln!("as expected: {e}"),
        other => panic!("{other:?}"),
    }
    // The provider took it; the renter does not know yet.
    let p = provider.leases.lease(id).await.unwrap().unwrap();
    let r = renter.leases.lease(id).await.unwrap().unwrap();
    assert_eq!((p.duration_s, p.extensions), (D + E, 1));
    assert_eq!((r.duration_s, r.extensions), (D, 0));

    let pdone = closed(&provider.leases, id, 60).await;
    let rdone = closed(&renter.leases, id, 30).await;
    remove_container(&sb, id).await;
    eprintln!("provider {pdone:#?}\nrenter {rdone:#?}");
    let lease_cost = u64::from(D + E) * PER_S;
    assert_eq!(pdone.close_reason.as_deref(), Some("expired"));
    assert_eq!(
        rdone.close_reason.as_deref(),
        Some("expired"),
        "not implausible_usage"
    );
    assert_eq!((rdone.duration_s, rdone.extensions), (D + E, 1));
    assert_eq!(pdone.settled_total, Some(lease_cost));
    assert_eq!(rdone.settled_total, Some(lease_cost));
    assert_eq!(
        provider.leases.ledger().await.unwrap().total_earned,
        lease_cost
    );
    assert_eq!(
        renter.leases.ledger().await.unwrap().total_spent,
        lease_cost
    );
    provider.cancel.cancel();
    renter.cancel.cancel();
}

/// The provider's node dies right after it accepted an extension and comes back from its home:
/// its watchdog (a separate process) keeps the container running past the first deadline, the
/// resumed session has the amended terms from its database, and the lease ends and is paid at
/// the new deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_restarted_after_an_extension_keeps_the_new_deadline() {
    let Some(sb) = docker_or_skip("extend_restart").await else {
        return;
    };
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let template = lease_template(1, INTERVAL_S, WINDOW_S);
    let with_watchdog = |svc: &mut gridlease_node::lease::LeaseServiceConfig| {
        svc.watchdog = Some(PathBuf::from(WATCHDOG_EXE));
    };
    let provider = provider_with(dir.path(), &sb, template.clone(), GRACE_S, with_watchdog).await;
    let mut renter = party(
        dir.path(),
        "renter",
        common::config(),
        service_config(dir.path(), "renter", GRACE_S),
        None,
    )
    .await;
    let offer = connect_for_offer(&mut renter, &provider).await;
    const D: u32 = 5;
    const E: u32 = 5;
    let id = renter
        .leases
        .rent(probe_rent(
            offer,
            &image,
            D,
            &["ignore-term", "sleep", "120"],
        ))
        .await
        .unwrap();
    wait_view(&renter.leases, id, "running on the renter", |v| {
        v.state == LeaseState::Running
    })
    .await;
    let x = renter.leases.extend(id, seconds(E)).await.unwrap();
    let started = x.deadline_ms - u64::from(D + E) * 1000;
    // Gone at once (nothing settled, nothing said), back from the same home.
    vanish(provider).await;
    let mut svc = service_config(dir.path(), "provider", GRACE_S);
    with_watchdog(&mut svc);
    let provider =
        provider_from_home(&dir.path().join("provider"), &sb, template.clone(), svc).await;
    common::connect(&renter.node, &provider.node).await;
    let v = provider.leases.lease(id).await.unwrap().unwrap();
    assert_eq!((v.duration_s, v.extensions), (D + E, 1), "{v:?}");

    let past_first = started + u64::from(D) * 1000 + 1000;
    let now = gridlease_node::clock::now().0;
    tokio::time::sleep(Duration::from_millis(past_first.saturating_sub(now))).await;
    let state = sb.inspect(&format!("gridlease-{id}")).await.unwrap().state;
    assert_eq!(
        state.and_then(|s| s.running),
        Some(true),
        "stopped at the first deadline"
    );
    let pdone = closed(&provider.leases, id, 60).await;
    let rdone = closed(&renter.leases, id, 30).await;
    remove_container(&sb, id).await;
    eprintln!("provider {pdone:#?}\nrenter {rdone:#?}");
    let lease_cost = u64::from(D + E) * PER_S;
    assert_eq!(pdone.close_reason.as_deref(), Some("expired"));
    assert_eq!(
        pdone.usage.as_ref().unwrap().wall_ms,
        u64::from(D + E) * 1000
    );
    assert_eq!(pdone.settled_total, Some(lease_cost));
    assert_eq!(rdone.settled_total, Some(lease_cost));
    provider.cancel.cancel();
    renter.cancel.cancel();
}
