//! Two real `gridlease node` processes with separate homes, driven only through the CLI:
//! `search`, `rent --detach`, `leases`, `logs`, `stop`, `ledger --json`; and `gridlease devnet`
//! run to completion. Both need Docker: with `GRIDLEASE_REQUIRE_DOCKER=1` (set by `.ci/run`)
//! they fail when it is unreachable, otherwise they skip with a note.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::time::Duration;

use cli_support::{
    Tmux, bin, bin_path, cli, docker_required, json, lease_of, market, probe_image_or_skip, text,
    tmux_available, wait_for,
};
use serde_json::Value;

#[test]
fn two_nodes_rent_follow_stop_and_agree_through_the_cli() {
    let Some(image) = probe_image_or_skip("two_nodes_rent_follow_stop") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let m = market(dir.path());
    let prefix = m.offer.clone();
    let row = &json(&rh, &["search", "gpu~4090"])[0];
    assert_eq!(row["measured"], false, "declared GPUs: {row}");
    assert_eq!(row["verified"], 0, "no GPU check passed yet: {row}");

    let rented = json(
        &rh,
        &[
            "rent",
            &prefix,
            "--seconds",
            "120",
            "--detach",
            "--image",
            &image,
            "--",
            "sentinel",
            "cli-test",
            "sleep",
            "60",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 64);

    let mut logs = String::new();
    wait_for(
        Duration::from_secs(60),
        "the sentinel in the renter's logs",
        || {
            let out = cli(&rh, &["logs", &id[..10]]);
            logs = String::from_utf8_lossy(&out.stdout).into_owned();
            logs.contains("SENTINEL cli-test")
        },
    );
    // The renter's `leases --json` shows the lease running, with the provider's start time
    // and a time left that goes down.
    let mut renter_view = Value::Null;
    wait_for(Duration::from_secs(30), "running on the renter", || {
        renter_view = lease_of(&rh, &id);
        renter_view["state"] == "running"
    });
    assert_eq!(renter_view["role"], "renter");
    let started = renter_view["started_at"].as_u64().expect("started_at");
    let left = renter_view["time_left_s"].as_u64().expect("time_left_s");
    assert!((100..=120).contains(&left), "{renter_view}");
    wait_for(Duration::from_secs(30), "the time left to go down", || {
        let v = lease_of(&rh, &id);
        assert_eq!(v["started_at"].as_u64(), Some(started), "{v}");
        v["time_left_s"].as_u64().is_some_and(|l| l + 2 <= left)
    });
    let provider_view = lease_of(&ph, &id);
    assert_eq!(provider_view["role"], "provider");
    assert_eq!(provider_view["gpus"], 1);

    let out = cli(&rh, &["stop", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(Duration::from_secs(60), "both sides to settle", || {
        lease_of(&rh, &id)["state"] == "settled" && lease_of(&ph, &id)["state"] == "settled"
    });
    assert_eq!(lease_of(&ph, &id)["close_reason"], "renter_stop");

    // At 80 columns every table row fits and no value is split across lines; --wide shows all.
    let at = |cols: &str, args: &[&str]| {
        let out = bin()
            .arg("--home")
            .arg(&rh)
            .args(args)
            .env("COLUMNS", cols)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // In a real terminal 80 columns wide (tmux, COLUMNS unset) the width comes from the
    // terminal itself: what a person sees. The output is what the pane shows between the typed
    // command line and the shell's `EXIT=` line (`capture` joins wrapped lines, so a row wider
    // than the pane shows as one line wider than 80).
    let tmux = tmux_available();
    assert!(
        tmux || !docker_required(),
        "GRIDLEASE_REQUIRE_DOCKER=1 but tmux is not installed"
    );
    if !tmux {
        eprintln!("cli_lease: the tmux half SKIPPED, tmux is not installed");
    }
    let in_tmux = |args: &[&str]| {
        let t = Tmux::start("cli_lease_80");
        t.resize(80, 50);
        t.run(&format!(
            "unset COLUMNS; {} --home {} {}",
            bin_path().display(),
            rh.display(),
            args.join(" ")
        ));
        let (screen, status) = t.wait_exit(Duration::from_secs(30));
        assert_eq!(status, "0", "{args:?} in tmux:\n{screen}");
        let lines: Vec<&str> = screen.lines().collect();
        // The last echo of the command: keys typed before the shell is ready are echoed twice
        // (by the terminal, then by the shell), and the first copy would count as output.
        let typed = lines.iter().rposition(|l| l.contains("EXIT=$?")).unwrap();
        let done = lines.iter().rposition(|l| l.trim() == "EXIT=0").unwrap();
        lines[typed + 1..done].join("\n")
    };
    // The settled lease's co-signed record reaches the renter's book (rescored each second):
    // its search then shows the provider with one completed lease, the figure the table must
    // keep whole.
    let mut offer = Value::Null;
    wait_for(
        Duration::from_secs(30),
        "the completed lease in search",
        || {
            offer = json(&rh, &["search"])[0].clone();
            offer["completed"] == 1
        },
    );
    let rep = format!("{:.2} (1)", offer["rep"].as_f64().unwrap());
    let view = lease_of(&rh, &id);
    let cost =
        gridlease_contracts::Money::from_micros(view["cost_so_far"].as_u64().unwrap()).to_string();
    // Each command's rows at 80 columns, and the columns they must keep there (the search's
    // `checks`: the provider's passed GPU checks and the check the offer grants).
    for (args, must_show, columns) in [
        (
            &["leases", "--all"][..],
            vec![&id[..12], "settled", cost.as_str()],
            vec!["state"],
        ),
        (
            &["search"][..],
            vec!["RTX 4090", "24 GiB", rep.as_str()],
            vec!["rep (done)", "checks"],
        ),
    ] {
        let narrow = at("80", args);
        let mut shown = vec![("COLUMNS=80", narrow.clone())];
        if tmux {
            shown.push(("tmux at 80 columns", in_tmux(args)));
        }
        for (how, out) in shown {
            for line in out.lines() {
                assert!(line.chars().count() <= 80, "{args:?}, {how}:\n{out}");
            }
            let data: Vec<&str> = out.lines().filter(|l| l.contains(must_show[0])).collect();
            assert_eq!(data.len(), 1, "one line per row, {how}:\n{out}");
            for v in &must_show {
                assert!(data[0].contains(v), "{v:?} whole on its row, {how}:\n{out}");
            }
            for c in &columns {
                assert!(
                    out.lines()
                        .any(|l| l.contains(c) && !l.contains(must_show[0])),
                    "the {c:?} column, {how}:\n{out}"
                );
            }
        }
        let mut wide_args = args.to_vec();
        wide_args.push("--wide");
        let wide = at("80", &wide_args);
        let widest = wide.lines().map(|l| l.chars().count()).max().unwrap_or(0);
        assert!(
            widest > 80 || wide == narrow,
            "--wide shows every column:\n{wide}"
        );
    }

    let spent = json(&rh, &["ledger"]);
    let earned = json(&ph, &["ledger"]);
    assert_eq!(spent["balanced"], true);
    assert_eq!(earned["balanced"], true);
    let total = spent["total_spent"].as_u64().unwrap();
    assert!(total > 0, "nothing was paid");
    assert_eq!(
        earned["total_earned"].as_u64(),
        Some(total),
        "ledgers disagree"
    );
    assert_eq!(spent["leases"][0]["lease_id"], id.as_str());
    assert_eq!(earned["leases"][0]["total"], spent["leases"][0]["total"]);
    // Minimum billed 60 s at 3.60/h = 0.06: the stop came after at least the sentinel.
    assert!(total >= 60_000, "{total}");

    // Reputation (issue 16): the lease's co-signed record reaches both books. The renter had
    // paid no other provider, so the record weighs only a newcomer's 0.02:
    // (0.02 + 1) / (0.02 + 2) = 0.505. The provider's `status` and the renter's `search` say so.
    wait_for(
        Duration::from_secs(30),
        "the record in the provider's status",
        || json(&ph, &["status"])["own_offer"]["completed"] == 1,
    );
    let own = json(&ph, &["status"])["own_offer"].clone();
    assert_eq!(own["rep"], 0.505, "{own}");
    let shown = text(&cli(&ph, &["status"]).stdout);
    assert!(shown.contains("(1 completed lease(s) on record"), "{shown}");
    wait_for(
        Duration::from_secs(30),
        "the record in the renter's search",
        || {
            json(&rh, &["search", "free>=0", "completed>=1"])
                .as_array()
                .is_some_and(|rows| rows.len() == 1 && rows[0]["rep"] == 0.505)
        },
    );
}

#[test]
fn devnet_runs_to_a_settled_lease() {
    if probe_image_or_skip("devnet_runs_to_a_settled_lease").is_none() {
        return;
    }
    let out = bin()
        .args(["devnet", "--providers", "2", "--burn-secs", "2", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "devnet failed: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ledgers_agree"], true);
    assert_eq!(v["renter"]["state"], "settled");
    assert_eq!(v["provider"]["state"], "settled");
    assert_eq!(v["offers"].as_array().unwrap().len(), 2);
    // The cheapest offer was taken.
    assert_eq!(v["offers"][0]["price_per_gpu_hour"], "0.25");
    assert!(v["renter_ledger"]["total_spent"].as_u64().unwrap() > 0);

    // The human output shows the same story.
    let out = bin()
        .args(["devnet", "--providers", "1", "--burn-secs", "1"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "offers seen by the renter",
        "SENTINEL devnet-done",
        "lease timeline",
        "metered usage",
        "both ledgers agree to the micro-unit",
        // The minimum billed time is named (the run is 1 s of burn), and times are dates.
        "the offer's minimum of 60 s applied",
        "  started at    20",
    ] {
        assert!(
            text.contains(needle),
            "devnet output lacks {needle:?}:\n{text}"
        );
    }
    assert!(!text.contains("unix s"), "{text}");
}

/// The `rent` client dies (SIGKILL, so its HTTP request to the daemon is dropped mid-call)
/// right after the provider accepted the lease: the renter's daemon still runs the lease to
/// its end, and both ledgers agree.
#[test]
fn a_rent_whose_client_is_killed_after_negotiation_still_settles() {
    let Some(image) = probe_image_or_skip("rent_client_killed") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let m = market(dir.path());
    let _containers = cli_support::ContainersGuard(m.provider_peer.clone());
    let mut client = bin()
        .arg("--home")
        .arg(&rh)
        .args([
            "rent",
            &m.offer,
            "--seconds",
            "60",
            "--image",
            &image,
            "--",
            "burn",
            "1",
            "2",
            "exit",
            "0",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill the client the moment the provider has the lease.
    let mut id = String::new();
    wait_for(Duration::from_secs(60), "the provider to accept", || {
        let all = json(&ph, &["leases", "--all"]);
        match all.as_array().and_then(|a| a.first()) {
            Some(l) => {
                id = l["lease_id"].as_str().unwrap().to_string();
                true
            }
            None => false,
        }
    });
    client.kill().unwrap();
    let status = client.wait().unwrap();
    assert!(!status.success(), "the client was killed, not finished");
    wait_for(Duration::from_secs(90), "both sides to settle", || {
        lease_of(&rh, &id)["state"] == "settled" && lease_of(&ph, &id)["state"] == "settled"
    });
    let (r, p) = (lease_of(&rh, &id), lease_of(&ph, &id));
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["settled_total"], p["settled_total"], "{r}\n{p}");
    let spent = json(&rh, &["ledger"]);
    let earned = json(&ph, &["ledger"]);
    assert_eq!(spent["total_spent"], earned["total_earned"]);
    assert!(spent["total_spent"].as_u64().unwrap() > 0);
}

/// Refusals reach the renter's `rent` as one sentence and exit status 4, before anything is
/// signed: an unlisted registry, a bare image id, environment the provider controls, and
/// network egress from an offer without it.
#[test]
fn rent_says_why_the_provider_refused_the_image_or_the_environment_or_that_the_offer_is_its_own() {
    let Some(image) = probe_image_or_skip("rent_says_why") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rh = dir.path().join("renter");
    let m = market(dir.path());
    let cases: [(&[&str], &str); 5] = [
        (
            &["--image", "registry.example.com/team/train:1"],
            "the provider does not pull from registry registry.example.com",
        ),
        (
            &[
                "--image",
                "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            ],
            "a bare image id names whatever the provider happens to hold",
        ),
        (
            &["--image", &image, "--env", "CUDA_VISIBLE_DEVICES=0"],
            "env CUDA_VISIBLE_DEVICES is set by the provider to the leased GPUs",
        ),
        (
            &["--image", "192.168.1.20:5000/x:1"],
            "registry 192.168.1.20:5000 is a loopback, private or local-network host",
        ),
        // The offer's network policy is `none`.
        (
            &["--image", &image, "--network", "egress"],
            "the provider's policy does not allow network access",
        ),
    ];
    for (args, sentence) in cases {
        let mut full = vec!["rent", m.offer.as_str(), "--seconds", "60"];
        full.extend_from_slice(args);
        full.extend(["--", "exit", "0"]);
        let out = cli(&rh, &full);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {stderr}");
        assert!(stderr.contains(sentence), "{args:?}: {stderr}");
    }
    let leases = json(&rh, &["leases"]);
    assert_eq!(leases.as_array().map(Vec::len), Some(0), "{leases}");

    // The provider renting its own offer is told so (it used to dial itself and print
    // "Failed to dial the requested peer"), exit 4, nothing recorded.
    let ph = dir.path().join("provider");
    let out = cli(
        &ph,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "60",
            "--image",
            &image,
            "--",
            "true",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("is this node's own offer: a node does not rent from itself"),
        "{stderr}"
    );
    assert!(stderr.contains("rent from another provider"), "{stderr}");
    let leases = json(&ph, &["leases"]);
    assert_eq!(leases.as_array().map(Vec::len), Some(0), "{leases}");
}

/// `logs` without `--follow` prints all the output the provider holds (not one 32 KiB chunk),
/// `--tail N` the last N lines, `--json` one object saying it is complete.
#[test]
fn logs_prints_everything_tails_and_speaks_json() {
    let Some(image) = probe_image_or_skip("logs_everything") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rh = dir.path().join("renter");
    let m = market(dir.path());
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
            "lines",
            "5000",
            "40",
            "exit",
            "0",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "the lease to settle", || {
        lease_of(&rh, &id)["state"] == "settled"
    });
    let line = |k: u32| {
        let t = format!("line {k} ");
        format!("{t}{}\n", ".".repeat(40 - t.len() - 1))
    };
    let all: String = (1..=5000).map(line).collect();
    let out = cli(&rh, &["logs", &id[..12]]);
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), 200_000, "every chunk, not just the first");
    assert!(out.stdout == all.as_bytes());
    let out = cli(&rh, &["logs", &id[..12], "--tail", "2"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        line(4999) + &line(5000)
    );
    let v = json(&rh, &["logs", &id[..12], "--tail", "1"]);
    assert_eq!(v["text"], line(5000));
    assert_eq!(v["complete"], true);
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["cut_bytes"], Value::Null);
}

/// Issue 42 item 7: "how did my job end?" A prepaid lease on declared GPUs whose command exits
/// 3: `logs -f` exits 3 (it used to exit 0); `leases` says it ended with `container_exited,
/// exit 3`, shows GPU utilization and VRAM as n/a (they used to read 0% and 0 MiB), and tells
/// what was paid (the 60 s minimum) from what was authorised (the whole prepaid lease).
#[test]
fn leases_says_how_a_lease_ended_what_was_paid_and_authorised_and_logs_f_exits_with_its_code() {
    let Some(image) = probe_image_or_skip("leases_says_how_it_ended") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rh = dir.path().join("renter");
    let m = market(dir.path());
    let rented = json(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "120",
            "--prepay",
            "all",
            "--detach",
            "--image",
            &image,
            "--",
            "sentinel",
            "STARTED",
            "sleep",
            "2",
            "exit",
            "3",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    let out = cli(&rh, &["logs", "-f", &id[..12]]);
    assert!(
        text(&out.stdout).contains("STARTED"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let out = cli(&rh, &["--json", "logs", "-f", &id[..12]]);
    assert_eq!(out.status.code(), Some(3), "logs -f --json exits the same");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["exit_code"], 3, "{v}");

    wait_for(Duration::from_secs(60), "the lease to settle", || {
        lease_of(&rh, &id)["state"] == "settled"
    });
    let v = lease_of(&rh, &id);
    // 120 s at 3.60 GLU/GPU-hour authorised ahead; the 60 s minimum paid.
    assert_eq!(v["authorised"], 120_000, "{v:#}");
    assert_eq!(v["paid"], 60_000, "{v:#}");
    assert_eq!(v["settled_total"], 60_000, "{v:#}");
    assert_eq!(v["gpus_declared"], true, "{v:#}");
    assert!(v["usage"]["gpu_util_permille"].is_null(), "{v:#}");
    assert!(v["usage"]["vram_peak_mib"].is_null(), "{v:#}");
    assert_eq!(v["close_reason"], "container_exited", "{v:#}");
    assert_eq!(v["exit_code"], 3, "{v:#}");

    let out = cli(&rh, &["leases", "--all", "--wide"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let header = table
        .lines()
        .find(|l| l.contains("role") && l.contains("state"))
        .unwrap_or_else(|| panic!("no header: {table}"));
    for col in ["gpu util", "vram", "paid GLU", "authorised GLU", "ended"] {
        assert!(header.contains(col), "no {col} column: {table}");
    }
    let row = table
        .lines()
        .find(|l| l.contains(&id[..12]))
        .unwrap_or_else(|| panic!("no row for {id}: {table}"));
    assert!(row.contains("container_exited, exit 3"), "{row}");
    assert_eq!(row.matches("n/a").count(), 2, "gpu util and vram: {row}");
    assert!(!row.contains("0%"), "{row}");
    assert!(
        row.contains(" 0.06 ") && row.contains(" 0.12 "),
        "paid 0.06, authorised 0.12: {row}"
    );
}

/// Issue 42 item 4: the offer carries its image rules (registries, prefixes, local images);
/// `offer` shows them, and a name that fits none of them is refused by the renter's own node
/// with that sentence, exit 4, before anything is signed or any registry is asked (it used to
/// reach the provider, which tried docker.io and answered with a network error).
#[test]
fn an_image_the_offer_does_not_run_is_refused_before_asking_and_offer_lists_what_it_runs() {
    let Some(image) = probe_image_or_skip("image_not_offered") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    // A registry on loopback nothing listens on: no test traffic leaves this machine.
    let m = cli_support::market_with(dir.path(), &["--image-registry", "127.0.0.1:9"], None);
    let shown = text(&cli(&rh, &["offer", &m.offer]).stdout);
    let line = shown
        .lines()
        .find(|l| l.starts_with("images"))
        .unwrap_or_else(|| panic!("no images line: {shown}"));
    assert!(line.contains("127.0.0.1:9"), "{line}");
    assert!(line.contains(&image), "the local image is listed: {line}");
    // Test providers offer no GPU check (`cli_support::NO_GPU_CHECK`).
    assert!(
        shown.lines().any(|l| l == "gpu check    none offered"),
        "{shown}"
    );
    let o = json(&rh, &["offer", &m.offer]);
    assert_eq!(o["gpu_check"], "none", "{o}");
    assert_eq!(
        (o["verify_window_s"].as_u64(), o["verified"].as_u64()),
        (Some(0), Some(0)),
        "{o}"
    );
    assert_eq!(o["registries"], serde_json::json!(["127.0.0.1:9"]), "{o}");
    assert_eq!(o["local_images"][0], image.as_str(), "{o}");

    let out = cli(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "60",
            "--image",
            "not-there:9",
            "--",
            "true",
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("image not-there:9: the provider does not pull from registry docker.io"),
        "{err}"
    );
    assert!(err.contains(&image), "names what the offer runs: {err}");
    assert!(!err.contains("error sending request"), "{err}");
    // Nothing was signed on either side.
    for h in [&ph, &rh] {
        let leases = json(h, &["leases", "--all"]);
        assert_eq!(leases.as_array().map(Vec::len), Some(0), "{leases}");
    }
}

/// Issue 42 item 8: an offer's handle (`<provider key>/0`, `search` shows its first 12 digits)
/// stays the same when the provider re-signs the offer (a lease taking and freeing its GPU)
/// and across a restart of the renter's node; `rent` and `offer` take it, with no "re-signed"
/// note, while the offer id (the evidence of the exact terms) changes.
#[test]
fn an_offer_handle_stays_the_same_across_re_signs_and_restarts() {
    let Some(image) = probe_image_or_skip("offer_handle") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let mut m = market(dir.path());
    let rows = json(&rh, &["search"]);
    let (id0, handle) = (
        rows[0]["id"].as_str().unwrap().to_string(),
        rows[0]["handle"].as_str().unwrap().to_string(),
    );
    assert_eq!(handle.len(), 66, "{rows}");
    let short = format!("{}/0", &handle[..12]);
    let table = text(&cli(&rh, &["search", "--wide"]).stdout);
    assert!(table.contains(&short), "search shows the handle: {table}");

    let rent = |rh: &std::path::Path| {
        let out = cli(
            rh,
            &[
                "rent",
                &short,
                "--seconds",
                "60",
                "--detach",
                "--image",
                &image,
                "--",
                "exit",
                "0",
            ],
        );
        let err = text(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(
            !err.contains("re-signed"),
            "no re-sign note for a handle: {err}"
        );
        let v: Value =
            serde_json::from_slice(&cli(rh, &["--json", "leases", "--all"]).stdout).unwrap();
        v.as_array().unwrap().len()
    };
    // The renter holds the provider's current offer (its own `status` says which), and it
    // has a free GPU. A stale offer the renter still holds (one signed before the last lease
    // took the GPU, say from a book restored after a restart) can show a free GPU the
    // provider no longer has.
    let current_and_free = |rh: &std::path::Path| {
        let own = json(&ph, &["status"])["own_offer"]["id"].clone();
        let seen = json(rh, &["offer", &short]);
        own.is_string() && seen["id"] == own && seen["free_gpus"] == 1
    };
    assert_eq!(rent(&rh), 1);
    // The lease took the GPU and gave it back: the provider re-signed its offer twice.
    wait_for(
        Duration::from_secs(60),
        "a re-signed offer with a free GPU",
        || {
            let rows = json(&rh, &["search"]);
            rows[0]["id"].as_str().is_some_and(|id| id != id0)
                && rows[0]["handle"] == *handle
                && current_and_free(&rh)
        },
    );
    assert_eq!(rent(&rh), 2, "the same handle rents the re-signed offer");

    // The renter's node restarts: the handle still resolves from the restored book.
    let addr = json(&ph, &["status"])["listen_addrs"][0]
        .as_str()
        .unwrap()
        .to_string();
    m.renter.0.kill().unwrap();
    m.renter.0.wait().unwrap();
    m.renter = cli_support::start_node(&rh, &["--bootstrap", &addr]);
    wait_for(Duration::from_secs(30), "the offer by its handle", || {
        cli(&rh, &["offer", &short]).status.success()
    });
    let shown = text(&cli(&rh, &["offer", &short]).stdout);
    assert!(shown.contains(&handle), "offer prints the handle: {shown}");
    wait_for(
        Duration::from_secs(60),
        "the provider's current offer, with its GPU free again",
        || current_and_free(&rh),
    );
    assert_eq!(rent(&rh), 3, "the handle rents after a restart");
}
