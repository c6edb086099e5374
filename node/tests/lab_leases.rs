//! Leases across real networks (issue 15): `gridlease` daemons in network namespaces behind
//! home routers that NAT (`lab_support`), relays on the "internet", real Docker and the probe
//! image. Each scenario asserts the NAT status the nodes observe (AutoNAT v2), how the lease's
//! connection runs (hole punched and direct, or relayed), and that both ledgers agree.
//!
//! Needs root, iproute2, iptables, nftables and Docker: with `GRIDLEASE_REQUIRE_DOCKER=1` (set by
//! `.ci/run`) a missing one fails the test, otherwise it skips with a note.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;
mod lab_support;

use std::time::{Duration, Instant};

use cli_support::{lease_of, probe_image_or_skip};
use lab_support::*;

/// How long a node may take to report its NAT status (AutoNAT probes every 5 s once a
/// server is connected).
const NAT_LIMIT: Duration = Duration::from_secs(60);

/// The lab and Docker, or `None` (skip) when they cannot run and are not required.
fn ready(test: &str) -> Option<String> {
    if !lab_or_skip(test, &[]) {
        return None;
    }
    probe_image_or_skip(test)
}

/// The probe for `secs` seconds: prints a sentinel, burns a little CPU, sleeps.
fn probe(secs: u32) -> Vec<String> {
    ["sentinel", "LAB", "burn", "1", "1", "sleep"]
        .iter()
        .map(|s| s.to_string())
        .chain([secs.to_string(), "exit".into(), "0".into()])
        .collect()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Waits (at most `limit`) until `f` holds for the renter's connections to the provider.
fn wait_connections(
    m: &Market,
    what: &str,
    limit: Duration,
    f: impl Fn(&[(String, bool)]) -> bool,
) -> Vec<(String, bool)> {
    let deadline = Instant::now() + limit;
    loop {
        let c = connections_to(&m.renter.home, &m.provider.peer);
        if f(&c) {
            return c;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not seen within {limit:?}: {c:?}\nprovider log:\n{}\nrenter log:\n{}",
            m.provider.log_tail(40),
            m.renter.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The provider's view of the lease's paid amount.
fn paid(m: &Market, id: &str) -> u64 {
    lease_of(&m.provider.home, id)["authorised"]
        .as_u64()
        .unwrap_or(0)
}

/// Waits until the provider has booked more than `above` for the lease.
fn wait_paid_above(m: &Market, id: &str, above: u64, limit: Duration) -> u64 {
    let deadline = Instant::now() + limit;
    loop {
        let p = paid(m, id);
        if p > above {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "the provider booked nothing above {above} within {limit:?}: {:#}",
            lease_of(&m.provider.home, id)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Only direct connections, at least one, from the provider's router's address (what the
/// hole punch or connection reversal gives).
fn direct_from(c: &[(String, bool)], ip: std::net::Ipv4Addr) -> bool {
    !c.is_empty()
        && c.iter().all(|(_, relayed)| !relayed)
        && c.iter().any(|(a, _)| a.contains(&format!("/ip4/{ip}/")))
}

/// (a) Provider behind a cone NAT, renter public: the provider observes `private`, the renter
/// `public`; the provider holds a relay reservation and advertises the relayed address; the
/// renter reaches it through the relay, DCUtR upgrades (a direct connection from the
/// provider's router), and the lease runs and settles with both ledgers equal.
#[test]
fn a_provider_behind_a_cone_nat_serves_a_public_renter() {
    let Some(image) = ready("lab_cone_public") else {
        return;
    };
    let m = market(Place::Behind(Nat::Cone), Place::Public, 1, 0);
    let site = m.provider_site.clone().unwrap();
    let ps = wait_nat(&m.provider.home, "private", NAT_LIMIT);
    wait_nat(&m.renter.home, "public", NAT_LIMIT);
    assert!(
        ps["relays"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == m.relays[0].peer.as_str()),
        "the provider holds a reservation on the relay: {ps:#}"
    );
    let id = m.rent(&image, &args(&probe(8)));
    wait_connections(&m, "a direct connection", Duration::from_secs(30), |c| {
        direct_from(c, site.wan_ip)
    });
    let (p, r) = m.settled(&id, Duration::from_secs(60));
    assert_eq!(p["close_reason"], "container_exited", "{p:#}");
    assert_eq!(p["settled_total"], r["settled_total"]);
    assert!(m.ledgers_agree() >= 60_000, "60 s minimum billed at 3.60/h");
}

/// (b) Both behind cone NATs: neither can be dialed; the renter reaches the provider through
/// the relay and DCUtR punches a hole: the connection that carries the lease is direct (its
/// remote address is the provider's router), the relayed one is closed, and the lease
/// survives the switch (receipts keep being booked after it) and settles.
#[test]
fn both_behind_cone_nats_the_lease_runs_on_a_hole_punched_connection() {
    let Some(image) = ready("lab_cone_cone") else {
        return;
    };
    let m = market(Place::Behind(Nat::Cone), Place::Behind(Nat::Cone), 1, 0);
    let site = m.provider_site.clone().unwrap();
    wait_nat(&m.provider.home, "private", NAT_LIMIT);
    wait_nat(&m.renter.home, "private", NAT_LIMIT);
    let id = m.rent(&image, &args(&probe(10)));
    let direct = wait_connections(
        &m,
        "a hole-punched connection only",
        Duration::from_secs(30),
        |c| direct_from(c, site.wan_ip),
    );
    eprintln!("renter's connections to the provider: {direct:?}");
    assert!(
        log_line(&m.renter.log, "closing the relayed one").is_some()
            || log_line(&m.provider.log, "closing the relayed one").is_some(),
        "a relayed connection was retired"
    );
    // Receipts after the switch: the lease goes on over the direct connection.
    let before = paid(&m, &id);
    wait_paid_above(&m, &id, before, Duration::from_secs(10));
    let (p, _) = m.settled(&id, Duration::from_secs(60));
    assert_eq!(p["close_reason"], "container_exited", "{p:#}");
    // Nothing but the direct connection carried it: still no relayed connection.
    let after = connections_to(&m.renter.home, &m.provider.peer);
    assert!(after.iter().all(|(_, relayed)| !relayed), "{after:?}");
    m.ledgers_agree();
}

/// (c) Provider behind a symmetric NAT, renter behind a cone NAT: the port the provider's
/// router uses towards the renter is not the one anyone observed, so no hole punch works; the
/// relay carries the whole lease and megabytes of its logs (the relay limits are sized for
/// leases: the libp2p default of 128 KiB per circuit would cut it), which settles normally.
#[test]
fn behind_a_symmetric_nat_the_relay_carries_the_lease() {
    let Some(image) = ready("lab_symmetric") else {
        return;
    };
    let m = market(
        Place::Behind(Nat::Symmetric),
        Place::Behind(Nat::Cone),
        1,
        0,
    );
    wait_nat(&m.provider.home, "private", NAT_LIMIT);
    wait_nat(&m.renter.home, "private", NAT_LIMIT);
    // 800,000 bytes of output first (a fixed amount: how much a timed flood prints depends
    // on the machine's load): reading them back crosses the relay (libp2p's default circuit
    // limit, 128 KiB, would cut the connection halfway).
    let mut cmd = vec!["lines".to_string(), "20000".into(), "40".into()];
    cmd.extend(probe(10));
    let id = m.rent(&image, &args(&cmd));
    let c = wait_connections(&m, "a relayed connection", Duration::from_secs(30), |c| {
        !c.is_empty()
    });
    assert!(c.iter().all(|(_, relayed)| *relayed), "{c:?}");
    let (p, _) = m.settled(&id, Duration::from_secs(60));
    assert_eq!(p["close_reason"], "container_exited", "{p:#}");
    let out = cli_support::cli(&m.renter.home, &["logs", &id]);
    assert!(out.status.success(), "{}", cli_support::text(&out.stderr));
    let logs = out.stdout.len();
    eprintln!("{logs} bytes of logs read through the relay");
    assert!(
        logs > 512 << 10 && cli_support::text(&out.stdout).contains("SENTINEL LAB"),
        "{logs} bytes of logs"
    );
    let c = connections_to(&m.renter.home, &m.provider.peer);
    assert!(
        !c.is_empty() && c.iter().all(|(_, relayed)| *relayed),
        "still relayed only: {c:?}"
    );
    m.ledgers_agree();
}

/// Cost of one GPU-second at the lab's price (3.60 per GPU-hour), micro-units.
const PER_S: u64 = 1000;

/// Waits (at most `limit`) until the lease's container no longer runs.
fn container_stopped(m: &Market, id: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let c = cli_support::containers_of(id);
        if c.iter().all(|(_, state)| state != "running") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the provider did not stop the container within {limit:?}: {c:?}\nprovider log:\n{}",
            m.provider.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Milliseconds since the epoch.
fn now_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Partition for twice the grace: the provider's router drops everything while a lease runs.
/// The provider stops the container within the cut (its renter silent: receipts behind by
/// more than the pay-ahead window, or no word for the grace, whichever comes first), the
/// usage it ran unpaid is at most one pay-ahead window plus the report interval it is checked
/// at, and after the heal both sides are settled with equal ledgers.
#[test]
fn a_partition_for_twice_the_grace_stops_the_container_within_one_window() {
    let Some(image) = ready("lab_partition_long") else {
        return;
    };
    let w = SHORT;
    let m = market(Place::Behind(Nat::Cone), Place::Public, 1, 0);
    let site = m.provider_site.clone().unwrap();
    let id = m.rent(&image, &args(&probe(60)));
    wait_paid_above(&m, &id, 2 * PER_S, Duration::from_secs(30));
    m.lab.cut(&site);
    let (cut_at, cut_ms) = (Instant::now(), now_ms());
    let cut_for = Duration::from_secs(u64::from(2 * w.grace));
    container_stopped(&m, &id, cut_for);
    let stopped_after = cut_at.elapsed();
    std::thread::sleep(cut_for.saturating_sub(cut_at.elapsed()));
    m.lab.heal(&site);
    let (p, r) = m.settled(&id, Duration::from_secs(60));
    let reason = p["close_reason"].as_str().unwrap_or_default().to_string();
    assert!(
        reason == "payment_lagging" || reason == "renter_unreachable",
        "stopped for a silent renter: {p:#}"
    );
    eprintln!("container stopped {stopped_after:?} into the cut");
    let closed_after = p["closed_at"].as_u64().unwrap().saturating_sub(cut_ms);
    // Its record closes once the last report and the close could be tried (after the heal);
    // the container stopped within the cut (above).
    eprintln!(
        "provider closed ({reason}), settled {closed_after} ms after the cut began; renter: {}",
        r["close_reason"]
    );
    assert!(
        cli_support::containers_of(&id)
            .iter()
            .all(|(_, state)| state != "running"),
        "the container is stopped"
    );
    let ran_ms = p["usage"]["wall_ms"].as_u64().unwrap();
    let unpaid = (ran_ms * PER_S / 1000).saturating_sub(p["authorised"].as_u64().unwrap());
    // docs/billing.md: one window plus one step at the decision; the container then runs
    // until SIGTERM ends it (the probe exits at once; 1 s allowed for the stop).
    let bound = u64::from(w.window + w.interval + 1) * PER_S;
    eprintln!("usage run unpaid {unpaid} micro-units (bound {bound})");
    assert!(
        unpaid <= bound,
        "unpaid usage {unpaid} > one window + one interval + the stop {bound}"
    );
    assert_eq!(p["settled_total"], r["settled_total"], "{p:#}\n{r:#}");
    m.ledgers_agree();
}

/// Partition shorter than the grace (and than the renter's limit for a silent provider, two
/// intervals + 2 s): the lease goes on after the heal (receipts are booked again) and ends
/// normally when the container exits; both ledgers agree.
#[test]
fn a_partition_shorter_than_the_grace_leaves_the_lease_running() {
    let Some(image) = ready("lab_partition_short") else {
        return;
    };
    // 3 s reports: the renter gives up on a silent provider after 8 s, the provider on a
    // silent renter after 9 s; a 4 s cut (TCP retransmits back off: the first one after the
    // heal may come ~2 s later) stays well within both, and within the 12 s window.
    let w = Windows {
        interval: 3,
        window: 12,
        grace: 9,
    };
    let m = market_with(Place::Behind(Nat::Cone), Place::Public, 1, 0, w, 0);
    let site = m.provider_site.clone().unwrap();
    let id = m.rent(&image, &args(&probe(20)));
    let before = wait_paid_above(&m, &id, 0, Duration::from_secs(30));
    m.lab.cut(&site);
    std::thread::sleep(Duration::from_secs(4));
    m.lab.heal(&site);
    let after = wait_paid_above(&m, &id, before, Duration::from_secs(15));
    eprintln!("paid {before} before the cut, {after} after the heal");
    assert_eq!(lease_of(&m.provider.home, &id)["state"], "running");
    let (p, r) = m.settled(&id, Duration::from_secs(60));
    assert_eq!(p["close_reason"], "container_exited", "{p:#}");
    assert_eq!(r["close_reason"], "container_exited", "{r:#}");
    assert_eq!(p["settled_total"], r["settled_total"]);
    m.ledgers_agree();
}

/// (c) with two relays, the one carrying the lease killed mid-lease: the provider holds a
/// reservation on both and advertises both relayed addresses, so the lease's next exchange
/// goes through the other relay; the lease runs to its end and both ledgers agree.
#[test]
fn a_relay_killed_mid_lease_the_lease_reroutes_through_the_other() {
    let Some(image) = ready("lab_relay_killed") else {
        return;
    };
    let w = Windows {
        interval: 2,
        window: 10,
        grace: 10,
    };
    let mut m = market_with(
        Place::Behind(Nat::Symmetric),
        Place::Behind(Nat::Cone),
        2,
        0,
        w,
        0,
    );
    cli_support::wait_for(
        Duration::from_secs(30),
        "reservations on both relays",
        || {
            status(&m.provider.home)["relays"]
                .as_array()
                .is_some_and(|r| r.len() == 2)
        },
    );
    let id = m.rent(&image, &args(&probe(25)));
    let c = wait_connections(&m, "a relayed connection", Duration::from_secs(30), |c| {
        !c.is_empty()
    });
    let before = wait_paid_above(&m, &id, 0, Duration::from_secs(30));
    let carrying = m
        .relays
        .iter()
        .position(|r| c.iter().any(|(a, _)| a.contains(&r.peer)))
        .expect("the connection goes through one of the relays");
    eprintln!("killing relay {carrying}: {c:?}");
    m.relays[carrying].kill();
    let (killed, other) = (&m.relays[carrying].peer, &m.relays[1 - carrying].peer);
    let c = wait_connections(
        &m,
        "a connection through the other relay",
        Duration::from_secs(30),
        |c| {
            !c.is_empty()
                && c.iter()
                    .all(|(a, relayed)| *relayed && !a.contains(killed.as_str()))
        },
    );
    assert!(c.iter().any(|(a, _)| a.contains(other.as_str())), "{c:?}");
    let after = wait_paid_above(&m, &id, before, Duration::from_secs(30));
    eprintln!("paid {before} before, {after} after the relay died");
    let (p, r) = m.settled(&id, Duration::from_secs(60));
    assert_eq!(p["close_reason"], "container_exited", "{p:#}");
    assert_eq!(p["settled_total"], r["settled_total"]);
    m.ledgers_agree();
}

/// (c) with its only relay killed mid-lease: no path is left, both sides close the lease with
/// their documented reason (the provider `payment_lagging` or `renter_unreachable`, whichever
/// of the window and the grace runs out first; the renter `provider_unreachable`), and both
/// ledgers agree.
#[test]
fn the_only_relay_killed_mid_lease_both_sides_close_with_a_reason() {
    let Some(image) = ready("lab_relay_only") else {
        return;
    };
    let mut m = market(
        Place::Behind(Nat::Symmetric),
        Place::Behind(Nat::Cone),
        1,
        0,
    );
    let id = m.rent(&image, &args(&probe(60)));
    wait_paid_above(&m, &id, 2 * PER_S, Duration::from_secs(30));
    m.relays[0].kill();
    let (p, r) = m.settled(&id, Duration::from_secs(60));
    eprintln!("provider {p:#}\nrenter {r:#}");
    let reason = p["close_reason"].as_str().unwrap_or_default();
    assert!(
        reason == "payment_lagging" || reason == "renter_unreachable",
        "the provider stopped for a silent renter: {p:#}"
    );
    assert_eq!(r["close_reason"], "provider_unreachable", "{r:#}");
    assert_eq!(p["settled_total"], r["settled_total"]);
    m.ledgers_agree();
}

/// Both behind cone NATs across a lossy, slow internet: 100 ms RTT (the lab's delay switch;
/// this kernel has no `sch_netem`) and 5% of the frames dropped at each end of every internet
/// link. The lease runs to its end (`container_exited` on both sides, not a lagging or silence
/// stop: the windows are 10 s, reports every 2 s), what the renter paid is what the provider
/// booked, and the provider's unpaid usage stays within one window.
#[test]
fn a_lease_across_loss_and_latency_settles_and_ledgers_agree() {
    let Some(image) = ready("lab_lossy") else {
        return;
    };
    if !lab_or_skip("lab_lossy", &["ethtool", "python3"]) {
        return;
    }
    let w = Windows {
        interval: 2,
        window: 10,
        grace: 10,
    };
    let m = market_with(
        Place::Behind(Nat::Cone),
        Place::Behind(Nat::Cone),
        1,
        5,
        w,
        50,
    );
    let id = m.rent(&image, &args(&probe(12)));
    let (p, r) = m.settled(&id, Duration::from_secs(90));
    eprintln!(
        "over 5% loss and 100 ms RTT: provider {} paid {} of {}, renter {}; connections {:?}",
        p["close_reason"],
        p["paid"],
        p["cost_so_far"],
        r["close_reason"],
        connections_to(&m.renter.home, &m.provider.peer)
    );
    assert_eq!(p["close_reason"], "container_exited", "{p:#}");
    assert_eq!(r["close_reason"], "container_exited", "{r:#}");
    let ran_ms = p["usage"]["wall_ms"].as_u64().unwrap();
    let unpaid = (ran_ms * PER_S / 1000).saturating_sub(p["authorised"].as_u64().unwrap());
    assert!(
        unpaid <= u64::from(w.window + w.interval) * PER_S,
        "unpaid usage {unpaid}"
    );
    assert_eq!(p["settled_total"], r["settled_total"]);
    m.ledgers_agree();
}
