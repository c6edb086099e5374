//! Ctrl-C on a foreground `gridlease rent`, pressed in a real terminal (a tmux pane running an
//! interactive bash) against two real `gridlease node` processes and the real Docker daemon:
//! the first Ctrl-C stops the lease and the bill follows; a second one detaches and says how
//! to follow or stop the lease. Both exit 130 (`docs/cli.md`).
//!
//! Need Docker and tmux: with `GRIDLEASE_REQUIRE_DOCKER=1` (set by `.ci/run`, which also
//! installs tmux) they fail when either is missing, otherwise they skip with a note.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cli_support::{
    ContainersGuard, Tmux, cli, containers_of, docker_required, json, lease_of, market,
    probe_image_or_skip, text, tmux_available, wait_for,
};

/// The probe image, when Docker and tmux are both there (see the module docs).
fn prerequisites(test: &str) -> Option<String> {
    if !tmux_available() {
        assert!(
            !docker_required(),
            "{test}: GRIDLEASE_REQUIRE_DOCKER=1 but tmux is not installed"
        );
        eprintln!("{test}: SKIPPED, tmux is not installed");
        return None;
    }
    probe_image_or_skip(test)
}

/// Types a foreground `rent` of `prefix` into the pane (renter home `rh`); waits until the
/// container's first line has been followed to the pane and the provider (home `ph`) has the
/// lease running; answers the lease id.
fn rent_in_pane(
    t: &Tmux,
    (ph, rh): (&Path, &Path),
    prefix: &str,
    image: &str,
    sentinel: &str,
) -> String {
    t.run(&format!(
        "'{}' --home '{}' rent {prefix} --seconds 300 --image {image} -- sentinel {sentinel} sleep 120",
        env!("CARGO_BIN_EXE_gridlease"),
        rh.display(),
    ));
    let screen = t.wait_for_text(Duration::from_secs(60), &format!("SENTINEL {sentinel}"));
    let leases = json(rh, &["leases"]);
    let id = leases[0]["lease_id"].as_str().unwrap().to_string();
    assert!(
        screen.contains(&format!("lease {id} accepted; following its output")),
        "{screen}"
    );
    // The provider marks it running once the container started (the renter's copy stays
    // `accepted` until it closes).
    wait_for(
        Duration::from_secs(30),
        "the provider to have the lease running",
        || lease_of(ph, &id)["state"] == "running",
    );
    id
}

#[test]
fn first_ctrl_c_stops_the_lease_and_prints_the_bill() {
    let Some(image) = prerequisites("ctrl_c_stops") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let m = market(dir.path());
    let _containers = ContainersGuard(m.provider_peer.clone());
    let t = Tmux::start("stop");
    let id = rent_in_pane(&t, (&ph, &rh), &m.offer, &image, "ctrl-c-once");
    assert_eq!(containers_of(&id).len(), 1, "one container runs the lease");

    t.send(&["C-c"]);
    let (screen, status) = t.wait_exit(Duration::from_secs(60));
    assert_eq!(status, "130", "exit code:\n{screen}");
    assert!(
        screen.contains(&format!(
            "Ctrl-C: stopping lease {id}… (Ctrl-C again to detach)"
        )),
        "the stop is not announced:\n{screen}"
    );
    let short = &id[..12];
    assert!(
        screen.contains(&format!("lease {short}… settled: ran "))
            && screen.contains("(renter_stop)"),
        "no bill of a settled, renter-stopped lease:\n{screen}"
    );
    assert!(!screen.contains("detached"), "{screen}");

    wait_for(Duration::from_secs(30), "both nodes to settle", || {
        lease_of(&rh, &id)["state"] == "settled" && lease_of(&ph, &id)["state"] == "settled"
    });
    assert_eq!(lease_of(&rh, &id)["close_reason"], "renter_stop");
    wait_for(
        Duration::from_secs(30),
        "the provider to remove the container",
        || containers_of(&id).is_empty(),
    );
}

#[test]
fn second_ctrl_c_detaches_and_leaves_the_lease_to_stop_on_its_own() {
    let Some(image) = prerequisites("ctrl_c_twice_detaches") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let m = market(dir.path());
    let _containers = ContainersGuard(m.provider_peer.clone());
    let t = Tmux::start("detach");
    let id = rent_in_pane(&t, (&ph, &rh), &m.offer, &image, "ctrl-c-twice");

    // A second Ctrl-C is for a stop that takes long. Freeze the provider so that it does: the
    // renter's node takes the stop at once, but the container stays up until the provider
    // runs again, whatever the timing of this test.
    let provider_pid = m.provider.0.id().to_string();
    let _thaw = Thaw(provider_pid.clone());
    signal(&provider_pid, "-STOP");

    t.send(&["C-c"]);
    t.wait_for_text(
        Duration::from_secs(30),
        &format!("Ctrl-C: stopping lease {id}…"),
    );
    // The renter's node took the stop (the CLI has its answer a moment before this shows).
    wait_for(
        Duration::from_secs(30),
        "the renter to close the lease",
        || lease_of(&rh, &id)["state"] == "closing",
    );
    t.send(&["C-c"]);
    let (screen, status) = t.wait_exit(Duration::from_secs(30));
    assert_eq!(status, "130", "exit code:\n{screen}");
    let home = rh.display();
    for needle in [
        format!("Ctrl-C again: detached; lease {id} goes on stopping on its own"),
        format!("follow it: gridlease --home {home} logs -f {id}"),
        format!("stop it:   gridlease --home {home} stop {id}"),
    ] {
        assert!(
            screen.contains(&needle),
            "no {needle:?} in the pane:\n{screen}"
        );
    }
    assert!(
        !screen.contains("settled: ran"),
        "no bill after a detach:\n{screen}"
    );

    // Right after: the container still runs and the renter's lease is closing, not over.
    let running = containers_of(&id);
    assert!(
        running.len() == 1 && running[0].1 == "running",
        "the container should still run: {running:?}"
    );
    assert_eq!(lease_of(&rh, &id)["state"], "closing");

    // Let the provider go on, stop the lease as the hint says, and see it end everywhere.
    signal(&provider_pid, "-CONT");
    let out = cli(&rh, &["stop", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for(Duration::from_secs(60), "both nodes to settle", || {
        lease_of(&rh, &id)["state"] == "settled" && lease_of(&ph, &id)["state"] == "settled"
    });
    wait_for(
        Duration::from_secs(30),
        "the provider to remove the container",
        || containers_of(&id).is_empty(),
    );
}

/// `kill SIG PID`.
fn signal(pid: &str, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, pid])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid} failed");
}

/// Resumes a stopped process when dropped, so a failed test does not leave it frozen.
struct Thaw(String);

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.0]).status();
    }
}
