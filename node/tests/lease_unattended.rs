//! Unattended leases between two real nodes (separate processes) and a real container: the
//! renter's node is suspended (SIGSTOP) for more than three grace periods.
//! - `rent --prepay all`: the provider keeps the container running to its end while the renter
//!   is away; when the renter comes back (SIGCONT) it reconciles (asks for the reports it
//!   missed, checks each, learns the close) and both ledgers book the same amount: what the
//!   provider's last report says is due, not the whole prepaid budget.
//! - default (pay as you go): the same silence stops the lease (`renter_unreachable`), as
//!   before; the renter learns it when it comes back and both ledgers agree.
//!
//! Usage every 2 s, renter grace 4 s, so three graces are 12 s. Needs Docker: with
//! `GRIDLEASE_REQUIRE_DOCKER=1` (set by `.ci/run`) it fails when unreachable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::path::Path;
use std::time::{Duration, Instant};

use cli_support::{
    Daemon, Market, json, lease_of, market_configured, probe_image_or_skip, wait_for,
};

const GRACE_S: u64 = 4;

/// A provider reporting every 2 s and a renter with a 4 s grace, the offer in the renter's
/// book (dropped: both daemons killed, then the provider's containers removed).
fn market(dir: &Path) -> Market {
    market_configured(
        dir,
        &[],
        None,
        [
            "usage_interval_secs = 2\npay_ahead_secs = 20",
            &format!("renter_grace_secs = {GRACE_S}"),
        ],
    )
}

fn signal(d: &Daemon, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &d.0.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

/// Resumes a suspended daemon when dropped (a failing test must not leave it stopped).
struct Resume<'a>(&'a Daemon);
impl Drop for Resume<'_> {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

/// Suspends the renter's node until the provider has settled lease `id` (within `limit`) and
/// at least three grace periods have passed, then resumes it. Returns the provider's view and
/// how long after the suspension it had settled.
fn away(renter: &Daemon, ph: &Path, id: &str, limit: Duration) -> (serde_json::Value, Duration) {
    signal(renter, "-STOP");
    let _resume = Resume(renter);
    let stopped = Instant::now();
    wait_for(limit, "the provider to settle", || {
        lease_of(ph, id)["state"] == "settled"
    });
    let settled_after = stopped.elapsed();
    while stopped.elapsed() < Duration::from_secs(3 * GRACE_S + 2) {
        std::thread::sleep(Duration::from_millis(200));
    }
    (lease_of(ph, id), settled_after)
}

/// The co-signed completion record of lease `id` that the node at `home` holds (reputation).
fn completion(home: &Path, id: &str) -> Option<gridlease_protocol::completion::Completion> {
    let db = gridlease_node::home::Home::open(home).unwrap().db_path();
    let store = gridlease_node::store::Store::open(&db).unwrap();
    let lease: gridlease_protocol::LeaseId = id.parse().unwrap();
    store
        .completions(None, 100)
        .unwrap()
        .into_iter()
        .map(|r| r.completion)
        .find(|c| c.lease_id == lease)
}

fn ledger_total(home: &Path, key: &str) -> u64 {
    let l = json(home, &["ledger"]);
    assert_eq!(l["balanced"], true, "{l}");
    l[key].as_u64().unwrap()
}

/// Waits for the renter (back from its suspension) to settle, then checks that it closed for
/// `reason` like the provider, at the provider's amount, and that each ledger books exactly
/// that amount. Returns the renter's view.
fn settled_alike(rh: &Path, ph: &Path, id: &str, reason: &str) -> serde_json::Value {
    wait_for(
        Duration::from_secs(60),
        "the renter to reconcile and settle",
        || lease_of(rh, id)["state"] == "settled",
    );
    let (r, p) = (lease_of(rh, id), lease_of(ph, id));
    assert_eq!(r["close_reason"], reason, "{r}");
    assert_eq!(p["close_reason"], reason, "{p}");
    let settled = p["settled_total"].as_u64().unwrap();
    assert_eq!(r["settled_total"].as_u64(), Some(settled), "{r}\n{p}");
    assert_eq!(ledger_total(rh, "total_spent"), settled);
    assert_eq!(ledger_total(ph, "total_earned"), settled);
    r
}

/// Rents a 120 s lease whose container sleeps `sleep_s` then exits 0; returns its id once the
/// renter has paid something (a receipt reached the provider).
fn rent(rh: &Path, ph: &Path, offer: &str, image: &str, sleep_s: u32, prepay: &[&str]) -> String {
    let sleep = sleep_s.to_string();
    let mut args = vec![
        "rent",
        offer,
        "--seconds",
        "120",
        "--detach",
        "--image",
        image,
    ];
    args.extend_from_slice(prepay);
    args.extend_from_slice(&["--", "sleep", &sleep, "exit", "0"]);
    let rented = json(rh, &args);
    let id = rented["lease_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "a receipt at the provider", || {
        lease_of(ph, &id)["authorised"].as_u64().unwrap_or(0) > 0
    });
    id
}

#[test]
fn a_prepaid_lease_runs_to_its_end_while_the_renter_is_away_and_both_ledgers_agree() {
    let Some(image) = probe_image_or_skip("unattended") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let m = market(dir.path());
    let (renter, offer) = (&m.renter, m.offer.clone());
    let id = rent(&rh, &ph, &offer, &image, 24, &["--prepay", "all"]);
    let seen = lease_of(&rh, &id);
    assert_eq!(seen["prepay_s"], u64::from(u32::MAX), "{seen}");
    // The whole budget was paid ahead at the first report.
    let max_total = seen["max_total"].as_u64().unwrap();
    assert_eq!(lease_of(&ph, &id)["authorised"].as_u64(), Some(max_total));

    // The container runs to its end (24 s of sleep) although the renter is silent: the
    // provider closes with the container's exit, never for the silence.
    let (p, _) = away(renter, &ph, &id, Duration::from_secs(90));
    assert_eq!(p["close_reason"], "container_exited", "{p}");
    assert_eq!(p["exit_code"], 0, "{p}");
    let r = settled_alike(&rh, &ph, &id, "container_exited");
    assert_eq!(r["exit_code"], 0, "{r}");
    // Both settle at what the provider's last report says is due: about 24 s of use, billed at
    // the 60 s minimum (1000 micro-units a second), not the prepaid 120 s budget; each ledger
    // books that (the unused prepay reversed).
    let settled = p["settled_total"].as_u64().unwrap();
    assert_eq!(settled, 60_000, "{p}");
    assert!(settled < max_total);
    // The renter was away when the lease settled: the record is co-signed once it is back
    // (reputation, issue 16), the same on both nodes, for what was paid.
    wait_for(Duration::from_secs(30), "the co-signed completion", || {
        completion(&rh, &id).is_some() && completion(&ph, &id).is_some()
    });
    let (rc, pc) = (completion(&rh, &id).unwrap(), completion(&ph, &id).unwrap());
    assert_eq!(rc, pc);
    assert_eq!(pc.paid, settled);
    assert_eq!(
        pc.outcome,
        gridlease_protocol::completion::CompletionOutcome::Completed
    );
}

#[test]
fn without_a_prepay_the_same_silence_stops_the_lease_and_the_renter_learns_it() {
    let Some(image) = probe_image_or_skip("unattended") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let m = market(dir.path());
    let (renter, offer) = (&m.renter, m.offer.clone());
    let id = rent(&rh, &ph, &offer, &image, 100, &[]);
    assert_eq!(lease_of(&rh, &id)["prepay_s"], 0);

    let (p, after) = away(renter, &ph, &id, Duration::from_secs(60));
    assert_eq!(p["close_reason"], "renter_unreachable", "{p}");
    assert!(
        after < Duration::from_secs(3 * GRACE_S + 30),
        "stopped only after {after:?}"
    );
    settled_alike(&rh, &ph, &id, "renter_unreachable");
}

/// Issue 42 item 1: `rent --prepay all --detach` returns only once the lease started and its
/// prepay was paid ahead, so the renter's node may die 3 s after it returns (before any usage
/// report): the lease runs to its deadline all the same, and the renter, started again much
/// later, learns how it ended at once: both sides agree on the reason and the amount.
#[test]
fn a_prepaid_lease_whose_renter_dies_right_after_rent_returns_runs_to_its_deadline() {
    let Some(image) = probe_image_or_skip("unattended_killed") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let mut m = market(dir.path());
    let rented = json(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "60",
            "--prepay",
            "all",
            "--detach",
            "--image",
            &image,
            "--",
            "sleep",
            "3600",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    // Returned: the provider already holds the prepaid receipt, before any usage report.
    let p = lease_of(&ph, &id);
    assert_eq!(p["state"], "running", "{p}");
    assert_eq!(p["authorised"], p["max_total"], "{p}");
    assert!(
        p["usage"].is_null(),
        "returned before any usage report: {p}"
    );
    std::thread::sleep(Duration::from_secs(3));
    signal(&m.renter, "-KILL");
    let _ = m.renter.0.wait();
    // The provider runs the lease to its deadline, never stopping it for the silence.
    wait_for(Duration::from_secs(120), "the provider to settle", || {
        lease_of(&ph, &id)["state"] == "settled"
    });
    let p = lease_of(&ph, &id);
    assert_eq!(p["close_reason"], "expired", "{p}");
    // The renter's node starts again: it asks where the lease stands at once.
    let addr = json(&ph, &["status"])["listen_addrs"][0]
        .as_str()
        .unwrap()
        .to_string();
    let started = Instant::now();
    m.renter = cli_support::start_node(&rh, &["--bootstrap", &addr]);
    settled_alike(&rh, &ph, &id, "expired");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the renter learnt the end only after {:?}",
        started.elapsed()
    );
}
