//! Idle-aware providing (issue 18): when the owner of a home provider's GPU starts using it
//! (a process on a GPU no lease holds), the node withdraws it from its offer at once, and
//! offers it again once it has been idle for `owner_idle_secs`. Real nodes on loopback; the
//! owner's process is scripted (`--dev-gpu-samples` with an `owner_file`: this machine has no
//! GPU), the renter's book is what shows it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::time::{Duration, Instant};

use cli_support::{cli, json, market_with, wait_for};

#[test]
fn an_owner_using_the_gpu_withdraws_the_offer_at_once_and_idle_brings_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let owner = dir.path().join("owner-at-the-keyboard");
    let curves = dir.path().join("curves.json");
    std::fs::write(
        &curves,
        format!(
            r#"[{{"util_percent":[0],"vram_used_mib":[300],"owner_file":{}}}]"#,
            serde_json::to_string(&owner).unwrap()
        ),
    )
    .unwrap();
    let log = dir.path().join("provider.log");
    let m = market_with(
        dir.path(),
        &[
            "--dev-gpu-samples",
            curves.to_str().unwrap(),
            "--owner-idle-secs",
            "3",
        ],
        Some(&log),
    );
    let rh = dir.path().join("renter");
    let listed = || json(&rh, &["search"]).as_array().unwrap().len();
    assert_eq!(listed(), 1, "offered while the GPU is idle");

    // The owner starts a process on the GPU: the renter's book shows the offer withdrawn
    // (no free GPU: `search` leaves it out) within 2 s.
    std::fs::write(&owner, b"").unwrap();
    let t0 = Instant::now();
    wait_for(Duration::from_secs(10), "the offer to be withdrawn", || {
        listed() == 0
    });
    let withdrawn = t0.elapsed();
    assert!(
        withdrawn <= Duration::from_secs(2),
        "withdrawn after {withdrawn:?}"
    );
    let all = json(&rh, &["search", "free>=0"]);
    assert_eq!(all[0]["free_gpus"], 0, "{all}");
    // Nobody can rent it meanwhile.
    let rent = cli(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "60",
            "--image",
            "x",
            "--detach",
        ],
    );
    assert!(!rent.status.success(), "rented a GPU its owner uses");

    // The owner stops: the GPU is offered again once it has been idle for 3 s, not before.
    std::fs::remove_file(&owner).unwrap();
    let t1 = Instant::now();
    wait_for(Duration::from_secs(15), "the offer to come back", || {
        listed() == 1
    });
    let back = t1.elapsed();
    assert!(
        back >= Duration::from_millis(2500) && back <= Duration::from_secs(6),
        "offered again {back:?} after the owner stopped (idle period 3 s)"
    );
    eprintln!("withdrawn after {withdrawn:?}, offered again {back:?} after the owner stopped");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("the owner is using this GPU"), "{text}");
    assert!(text.contains("GPU idle again"), "{text}");
}

#[test]
fn provide_hours_are_checked_shown_in_status_and_kept_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("provider");
    let node = cli_support::start(&home, &["--dev-gpus", "RTX 4090:24GiB:3.60"]);
    let refused = |args: &[&str], says: &str| {
        let out = cli(&home, args);
        let err = cli_support::text(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    };
    refused(
        &["provide", "--price", "0.40", "--hours", "25:00-08:00"],
        "the hour must be 00 to 23",
    );
    refused(
        &["provide", "--price", "0.40", "--hours", "10:00-10:00"],
        "is empty",
    );
    refused(
        &["provide", "--price", "0.40", "--hours", ""],
        "no hours given",
    );
    refused(
        &[
            "provide",
            "--price",
            "0.40",
            "--hours",
            "22:00-08:00",
            "--tz",
            "Mars/Olympus",
        ],
        "unknown time zone \"Mars/Olympus\"",
    );
    // Nothing changed: no provide settings yet.
    assert!(json(&home, &["status"])["schedule"].is_null());

    let out = cli(
        &home,
        &[
            "provide",
            "--price",
            "0.40",
            "--hours",
            "22:00-08:00,12:00-13:00",
            "--tz",
            "Europe/Berlin",
        ],
    );
    assert!(out.status.success(), "{}", cli_support::text(&out.stderr));
    let check = |s: &serde_json::Value| {
        let h = &s["schedule"];
        assert_eq!(h["hours"], "22:00-08:00,12:00-13:00", "{s}");
        assert_eq!(h["tz"], "Europe/Berlin", "{s}");
        let text = h["text"].as_str().unwrap();
        let expected = if h["offered"] == true {
            [
                "offered until 08:00 Europe/Berlin",
                "offered until 13:00 Europe/Berlin",
            ]
        } else {
            [
                "not offered until 22:00 Europe/Berlin",
                "not offered until 12:00 Europe/Berlin",
            ]
        };
        assert!(expected.contains(&text), "{text}");
    };
    check(&json(&home, &["status"]));
    let human = cli_support::text(&cli(&home, &["status"]).stdout);
    assert!(
        human.contains("hours        22:00-08:00,12:00-13:00 (Europe/Berlin): "),
        "{human}"
    );

    // A restarted daemon keeps them.
    drop(node);
    let node = cli_support::start_node(&home, &["--dev-gpus", "RTX 4090:24GiB:3.60"]);
    check(&json(&home, &["status"]));

    // `always` clears them.
    let out = cli(&home, &["provide", "--hours", "always"]);
    assert!(out.status.success(), "{}", cli_support::text(&out.stderr));
    let s = json(&home, &["status"]);
    assert_eq!(s["schedule"]["hours"], "always", "{s}");
    assert_eq!(s["schedule"]["text"], "offered always", "{s}");
    drop(node);
}

/// `provide --interruptible true` is in the signed offer: other nodes' `search` shows and
/// filters it, `status` says it, and `rent` notes it before the lease runs.
#[test]
fn an_interruptible_offer_shows_in_search_status_and_rent() {
    let Some(image) = cli_support::probe_image_or_skip("interruptible_offer") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = market_with(dir.path(), &[], None);
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let out = cli(
        &ph,
        &["provide", "--price", "3.60", "--interruptible", "true"],
    );
    assert!(out.status.success(), "{}", cli_support::text(&out.stderr));
    wait_for(
        Duration::from_secs(10),
        "the interruptible offer in the renter's book",
        || {
            json(&rh, &["search", "interruptible=true"])
                .as_array()
                .unwrap()
                .len()
                == 1
        },
    );
    assert!(
        json(&rh, &["search", "interruptible=false"])
            .as_array()
            .unwrap()
            .is_empty()
    );
    let row = json(&rh, &["search"])[0].clone();
    assert_eq!(row["interruptible"], true, "{row}");
    let wide = cli_support::text(&cli(&rh, &["search", "--wide"]).stdout);
    assert!(wide.contains("interruptible"), "{wide}");
    let human = cli_support::text(&cli(&ph, &["status"]).stdout);
    assert!(
        human.contains(
            "interrupt    a running lease may be stopped when the owner wants the GPU back"
        ),
        "{human}"
    );
    let offer = &row["id"].as_str().unwrap()[..12];
    let out = cli(
        &rh,
        &[
            "rent",
            offer,
            "--seconds",
            "60",
            "--image",
            &image,
            "--detach",
            "--",
            "exit",
            "0",
        ],
    );
    let err = cli_support::text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("this offer is interruptible"), "{err}");
    drop(m);
}

/// Real daemons and Docker: the owner's process appears on the GPU of an interruptible lease;
/// the provider stops it within 2 s, the renter's `leases` says why in a sentence, and both
/// ledgers agree.
#[test]
fn the_owner_takes_back_the_gpu_of_an_interruptible_lease() {
    let Some(image) = cli_support::probe_image_or_skip("owner_takes_back") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let owner = dir.path().join("owner-at-the-keyboard");
    let curves = dir.path().join("curves.json");
    std::fs::write(
        &curves,
        format!(
            r#"[{{"util_percent":[0],"vram_used_mib":[300],"owner_file":{}}}]"#,
            serde_json::to_string(&owner).unwrap()
        ),
    )
    .unwrap();
    let m = market_with(
        dir.path(),
        &["--dev-gpu-samples", curves.to_str().unwrap()],
        Some(&dir.path().join("provider.log")),
    );
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let out = cli(
        &ph,
        &["provide", "--price", "3.60", "--interruptible", "true"],
    );
    assert!(out.status.success(), "{}", cli_support::text(&out.stderr));
    let mut offer = String::new();
    wait_for(Duration::from_secs(10), "the interruptible offer", || {
        let rows = json(&rh, &["search", "interruptible=true"]);
        match rows.as_array().unwrap().first() {
            Some(r) => {
                offer = r["id"].as_str().unwrap()[..12].to_string();
                true
            }
            None => false,
        }
    });
    let out = cli(
        &rh,
        &[
            "rent",
            &offer,
            "--seconds",
            "120",
            "--image",
            &image,
            "--detach",
            "--",
            "sleep",
            "120",
        ],
    );
    assert!(out.status.success(), "{}", cli_support::text(&out.stderr));
    let id = cli_support::text(&out.stdout).trim().to_string();
    wait_for(Duration::from_secs(90), "the lease to run", || {
        cli_support::lease_of(&ph, &id)["state"] == "running"
    });
    std::thread::sleep(Duration::from_secs(2));

    std::fs::write(&owner, b"").unwrap();
    let t0 = Instant::now();
    wait_for(Duration::from_secs(10), "the provider to stop it", || {
        !cli_support::lease_of(&ph, &id)["closed_at"].is_null()
    });
    let stopped = t0.elapsed();
    assert!(
        stopped <= Duration::from_secs(2),
        "stopped after {stopped:?}"
    );
    wait_for(Duration::from_secs(30), "both sides to settle", || {
        cli_support::lease_of(&rh, &id)["state"] == "settled"
            && cli_support::lease_of(&ph, &id)["state"] == "settled"
    });
    let (r, p) = (
        cli_support::lease_of(&rh, &id),
        cli_support::lease_of(&ph, &id),
    );
    assert_eq!(r["close_reason"], "owner_reclaimed", "{r}");
    assert_eq!(p["close_reason"], "owner_reclaimed", "{p}");
    assert_eq!(r["settled_total"], p["settled_total"], "{r}\n{p}");
    let spent = json(&rh, &["ledger"]);
    let earned = json(&ph, &["ledger"]);
    assert_eq!(spent["total_spent"], earned["total_earned"]);
    assert_eq!(spent["total_spent"], r["settled_total"]);
    let human = cli_support::text(&cli(&rh, &["leases", "--all"]).stdout);
    assert!(
        human.contains("the provider's owner took the GPU back"),
        "{human}"
    );
    eprintln!("stopped {stopped:?} after the owner's process appeared");
    drop(m);
}
