//! `gridlease extend` end to end: two real `gridlease node` processes driven only through the
//! CLI. A running lease is extended (the new deadline and cap printed, both nodes' `leases
//! --json` showing the new duration), an extension beyond the offer and one of a settled lease
//! are refused with exit 4 and their reason; and minimum billing shows in `search --wide`, the
//! `rent` confirmation and the bill. Needs Docker: with `GRIDLEASE_REQUIRE_DOCKER=1` it fails
//! when Docker is unreachable, otherwise it skips with a note.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::time::Duration;

use cli_support::{
    ContainersGuard, cli, json, lease_of, market, probe_image_or_skip, text, wait_for,
};

#[test]
fn extend_through_the_cli_prints_the_new_deadline_and_refusals_exit_4() {
    let Some(image) = probe_image_or_skip("cli_extend") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let m = market(dir.path());
    let _guard = ContainersGuard(m.provider_peer.clone());

    // Minimum billing in the wide search table and in its JSON.
    let wide = cli(&rh, &["search", "--wide"]);
    assert!(wide.status.success(), "{}", text(&wide.stderr));
    let wide = text(&wide.stdout);
    assert!(wide.contains("min bill") && wide.contains("60 s"), "{wide}");
    let rows = json(&rh, &["search"]);
    assert_eq!(rows[0]["min_billed_s"], 60, "{rows}");

    let rented = json(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "60",
            "--detach",
            "--image",
            &image,
            "--",
            "sleep",
            "600",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    assert_eq!(rented["min_billed_s"], 60);
    wait_for(Duration::from_secs(60), "running on the renter", || {
        lease_of(&rh, &id)["state"] == "running"
    });
    let before = lease_of(&rh, &id);
    assert_eq!(before["duration_s"], 60);
    assert_eq!(before["extensions"], 0);

    // Extended by 30 s: the new deadline (a UTC date), the time left and the raised cap.
    let out = cli(&rh, &["extend", &id[..10], "--seconds", "30"]);
    let stdout = text(&out.stdout);
    eprintln!("{stdout}{}", text(&out.stderr));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("extended to 90 s (extension 1): new deadline ") && stdout.contains("GMT"),
        "{stdout}"
    );
    // 3.60/GPU-hour: 90 s cost 0.09.
    assert!(stdout.contains("budget cap 0.09"), "{stdout}");
    for home in [&rh, &ph] {
        let v = lease_of(home, &id);
        assert_eq!(v["duration_s"], 90, "{v}");
        assert_eq!(v["extensions"], 1, "{v}");
        assert_eq!(v["max_total"], 90_000, "{v}");
        assert!(v["time_left_s"].as_u64().unwrap() > 40, "{v}");
    }
    // --json answers the same terms.
    let x = json(&rh, &["extend", &id, "--minutes", "1"]);
    assert_eq!(x["extensions"], 2);
    assert_eq!(x["duration_s"], 150);
    let started = lease_of(&ph, &id)["started_at"].as_u64().unwrap();
    assert_eq!(x["deadline_ms"].as_u64().unwrap(), started + 150_000);

    // Beyond the offer's longest lease (24 h): refused, exit 4, the reason printed.
    let out = cli(&rh, &["extend", &id, "--minutes", "2000"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("at most 86400 s"), "{stderr}");
    assert_eq!(lease_of(&rh, &id)["duration_s"], 150, "nothing changed");
    // The provider cannot extend it: a usage error of this node (exit 1).
    let out = cli(&ph, &["extend", &id, "--seconds", "5"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("only its renter"),
        "{}",
        text(&out.stderr)
    );

    assert!(cli(&rh, &["stop", &id]).status.success());
    wait_for(Duration::from_secs(60), "both sides to settle", || {
        lease_of(&rh, &id)["state"] == "settled" && lease_of(&ph, &id)["state"] == "settled"
    });
    let out = cli(&rh, &["extend", &id, "--seconds", "5"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("not running (settled)"), "{stderr}");

    // A job that ends at once pays the minimum, and both the confirmation and the bill say so.
    let out = cli(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "60",
            "--image",
            &image,
            "--",
            "exit",
            "0",
        ],
    );
    let stdout = text(&out.stdout);
    eprintln!("{stdout}{}", text(&out.stderr));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("accepted; following its output (billed per second, at least 60 s)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("paid 0.06 GLU; minimum billing of 60 s applied"),
        "{stdout}"
    );
}
