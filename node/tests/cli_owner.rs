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
