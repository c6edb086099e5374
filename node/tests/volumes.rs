//! Volumes (issue 47) with real nodes and the real Docker daemon: a volume made on a provider
//! outlives the lease that wrote it (100 MiB with its checksum), a second lease mounts it and
//! reads the same checksum, `volume cp` gets it home with no lease running, a write past its
//! size fails inside the container with ENOSPC, a renter that does not own it cannot name it,
//! the offer's volume terms are shown, and a volume whose keep period ends is deleted (its
//! loop device and image file gone) with both ledgers agreeing on storage billed per second.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::path::Path;
use std::time::Duration;

use cli_support::{
    BusyboxImage, ContainersGuard, bin, busybox_market, init, json, lease_of, start_node, text,
    wait_for,
};
use serde_json::Value;
use sha2::Digest as _;

/// `gridlease --home HOME ARGS..` with its output; asserted to succeed unless `ok` is false.
fn run(home: &Path, args: &[&str]) -> std::process::Output {
    bin().arg("--home").arg(home).args(args).output().unwrap()
}

/// The volume named `name` in `volume ls --json`.
fn volume(home: &Path, name: &str) -> Value {
    json(home, &["volume", "ls"])
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["volume"]["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Whether a loop device is backed by a file whose path contains `part`.
fn loop_backed_by(part: &str) -> bool {
    std::fs::read_dir("/sys/block").unwrap().flatten().any(|e| {
        std::fs::read_to_string(e.path().join("loop/backing_file")).is_ok_and(|b| b.contains(part))
    })
}

/// Rents `offer` for a command in `image` with `volume` mounted, follows it to its end, and
/// returns its output (the exit code asserted to be 0).
fn rent_with(rh: &Path, offer: &str, image: &str, mount: &str, script: &str) -> String {
    let out = run(
        rh,
        &[
            "rent",
            offer,
            "--seconds",
            "120",
            "--no-verify",
            "--image",
            image,
            "--volume",
            mount,
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    assert!(
        out.status.success(),
        "rent --volume {mount}: {}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The two sha256 sums of `file` in `out` (the file's now, and the one written with it),
/// asserted equal: the lease read the bytes that were written.
fn same_sums<'a>(out: &'a str, file: &str) -> Vec<&'a str> {
    let sums: Vec<&str> = out
        .lines()
        .filter(|l| l.contains(file))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(sums.len(), 2, "{out}");
    assert_eq!(sums[0], sums[1], "the lease read other bytes: {out}");
    sums
}

#[test]
fn a_volume_outlives_its_lease_is_mounted_again_copied_home_and_named_only_by_its_renter() {
    let test = "volumes";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = busybox_market(
        dir.path(),
        &image.tag,
        &dir.path().join("provider.log"),
        &["--volume-price", "0.01", "--usage-interval-secs", "1"],
    );
    let _guard = ContainersGuard(m.provider_peer.clone());
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));

    // The offer says what volumes cost.
    let offer = json(&rh, &["offer", &m.offer]);
    assert_eq!(offer["volumes"]["price_per_gib_hour"], "0.01", "{offer}");
    assert_eq!(offer["volumes"]["max_gib"], 500, "{offer}");

    // The disk the offer promises per GPU, before: it drops by the volume's size while the
    // volume is kept (one GPU here).
    let handle = json(&rh, &["search"])[0]["handle"]
        .as_str()
        .unwrap()
        .to_string();
    let disk = || {
        json(&rh, &["offer", &handle])["per_gpu"]["disk_gib"]
            .as_u64()
            .unwrap()
    };
    let disk_before = disk();

    let made = run(
        &rh,
        &[
            "--json", "volume", "create", "data", "--offer", &m.offer, "--size", "1GiB", "--keep",
            "10m",
        ],
    );
    assert!(made.status.success(), "{}", text(&made.stderr));
    wait_for(Duration::from_secs(30), "the volume to be kept", || {
        volume(&rh, "data")["state"] == "running" && volume(&ph, "data")["state"] == "running"
    });
    let v = volume(&rh, "data");
    let vid = v["lease_id"].as_str().unwrap().to_string();
    wait_for(
        Duration::from_secs(30),
        "the offer's disk to drop by 1 GiB",
        || disk() == disk_before - 1,
    );
    // The provider's status lists it with its renter, size, payment and time left.
    let kept = json(&ph, &["status"])["kept_volumes"].clone();
    assert_eq!(kept[0]["lease_id"], vid.as_str(), "{kept}");
    assert_eq!(kept[0]["name"], "data", "{kept}");
    assert_eq!(kept[0]["size_gib"], 1, "{kept}");
    assert_eq!(
        kept[0]["renter"],
        json(&rh, &["status"])["peer_id"],
        "{kept}"
    );
    assert!(kept[0]["time_left_s"].as_u64().unwrap() > 500, "{kept}");
    let said = text(&run(&ph, &["status"]).stdout);
    assert!(said.contains("volume       data (1 GiB)"), "{said}");
    assert_eq!(v["volume"]["size_gib"], 1, "{v}");
    assert_eq!(v["disk_bytes"], 1u64 << 30, "{v}");
    assert_eq!(v["volume"]["price_per_gib_hour"], 10_000, "{v}");
    // The same name twice is refused by the provider, with the reason.
    let again = run(
        &rh,
        &[
            "volume", "create", "data", "--offer", &m.offer, "--size", "1GiB", "--keep", "10m",
        ],
    );
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("a volume of this name"),
        "{}",
        text(&again.stderr)
    );

    // A lease writes 100 MiB and its checksum to /data and ends; a second one reads them back.
    rent_with(
        &rh,
        &m.offer,
        &image.tag,
        "data:/data",
        "dd if=/dev/urandom of=/data/blob bs=1M count=100 2>/dev/null && sha256sum /data/blob > /data/blob.sum && cat /data/blob.sum",
    );
    let second = rent_with(
        &rh,
        &m.offer,
        &image.tag,
        "data:/data",
        "sha256sum /data/blob; cat /data/blob.sum",
    );
    let sums = same_sums(&second, "/data/blob");

    // Home with no lease running.
    let home_copy = dir.path().join("home");
    let out = run(
        &rh,
        &["volume", "cp", "data:/blob", home_copy.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got = hex::encode(sha2::Sha256::digest(std::fs::read(&home_copy).unwrap()));
    assert_eq!(got, sums[0]);
    // And in: a file copied up is there for the next lease.
    let up = dir.path().join("note.txt");
    std::fs::write(&up, "kept\n").unwrap();
    let out = run(
        &rh,
        &["volume", "cp", up.to_str().unwrap(), "data:/note.txt"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Past its size: ENOSPC inside the container; the lease's own disk is untouched.
    let full = rent_with(
        &rh,
        &m.offer,
        &image.tag,
        "data:/data",
        "cat /data/note.txt; dd if=/dev/zero of=/data/fill bs=1M count=2000 2>&1; df -k /workspace | tail -1",
    );
    assert!(full.contains("kept"), "{full}");
    assert!(full.contains("No space left on device"), "{full}");
    // The lease's own /workspace took none of it (df: used KiB, third column).
    let used: u64 = full
        .lines()
        .find(|l| l.ends_with("/workspace"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|u| u.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(used < 10 * 1024, "{full}");
    // Nor the provider's disk beyond the volume: its image holds at most the volume and
    // ext4's own overhead.
    let image_file = ph.join("leases/workspaces").join(format!("{vid}.img"));
    let on_disk =
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&image_file).unwrap()) * 512;
    assert!(
        on_disk <= gridlease_sandbox::workspace::max_image_bytes(1 << 30),
        "{on_disk} bytes on the host"
    );

    // Another renter cannot name it: not to mount, not to copy.
    let stranger = dir.path().join("stranger");
    init(&stranger);
    let addr = json(&ph, &["status"])["listen_addrs"][0]
        .as_str()
        .unwrap()
        .to_string();
    let _s = start_node(&stranger, &["--bootstrap", &addr]);
    let mut theirs = String::new();
    wait_for(Duration::from_secs(30), "the offer at the stranger", || {
        let found = json(&stranger, &["search"]);
        theirs = found[0]["handle"].as_str().unwrap_or_default().to_string();
        !theirs.is_empty()
    });
    let by_id = format!("{}:/data", &vid[..16]);
    for args in [
        vec![
            "rent",
            &theirs,
            "--seconds",
            "60",
            "--image",
            &image.tag,
            "--volume",
            "data:/data",
            "--",
            "true",
        ],
        vec![
            "rent",
            &theirs,
            "--seconds",
            "60",
            "--image",
            &image.tag,
            "--volume",
            &by_id,
            "--",
            "true",
        ],
    ] {
        let out = run(&stranger, &args);
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains("no live volume"),
            "{}",
            text(&out.stderr)
        );
    }
    let out = run(
        &stranger,
        &[
            "cp",
            &format!("{vid}:/workspace/blob"),
            dir.path().join("x").to_str().unwrap(),
        ],
    );
    assert!(!out.status.success());
    assert!(!dir.path().join("x").exists());

    // Removed: settled on both sides at the same total, and deleted on the provider.
    // Kept longer: beyond the offer's longest lease (one day here), within its longest keep.
    let out = run(&rh, &["volume", "extend", "data", "--keep", "2d"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("volume data kept until"),
        "{}",
        text(&out.stdout)
    );
    let left = lease_of(&ph, &vid)["time_left_s"].as_u64().unwrap();
    assert!(left > 2 * 86_400, "{left}");
    let out = run(&rh, &["volume", "extend", "data", "--keep", "40d"]);
    assert!(
        !out.status.success(),
        "past the longest keep: {}",
        text(&out.stdout)
    );
    let out = run(&rh, &["volume", "rm", "data"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for(Duration::from_secs(30), "both sides to settle", || {
        lease_of(&rh, &vid)["state"] == "settled" && lease_of(&ph, &vid)["state"] == "settled"
    });
    let (r, p) = (lease_of(&rh, &vid), lease_of(&ph, &vid));
    assert_eq!(r["settled_total"], p["settled_total"], "{r}\n{p}");
    wait_for(
        Duration::from_secs(30),
        "the offer's disk to come back",
        || disk() == disk_before,
    );
    wait_for(
        Duration::from_secs(30),
        "the volume's image and loop device to go",
        || {
            !loop_backed_by(&vid)
                && !ph
                    .join("leases/workspaces")
                    .join(format!("{vid}.img"))
                    .exists()
        },
    );

    // Named by its provider (peer id) rather than an offer: the provider's current offer.
    let out = run(
        &rh,
        &[
            "volume",
            "create",
            "other",
            "--provider",
            &m.provider_peer,
            "--size",
            "1GiB",
            "--keep",
            "1m",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("volume other (1 GiB) agreed with"),
        "{}",
        text(&out.stdout)
    );
    let listed = text(&run(&rh, &["volume", "ls"]).stdout);
    assert!(
        listed.contains("other") && listed.contains("1 GiB"),
        "{listed}"
    );
    wait_for(
        Duration::from_secs(30),
        "the other volume to be kept",
        || volume(&ph, "other")["state"] == "running",
    );
    let other = volume(&rh, "other")["lease_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(run(&rh, &["volume", "rm", "other"]).status.success());
    // Gone before the test ends (a node killed mid-removal would leave its loop device).
    wait_for(
        Duration::from_secs(30),
        "the other volume to be deleted",
        || {
            !loop_backed_by(&other)
                && !ph
                    .join("leases/workspaces")
                    .join(format!("{other}.img"))
                    .exists()
        },
    );
}

/// The ledger row of lease `id` in `ledger --json`.
fn ledger_total(home: &Path, id: &str) -> Value {
    let l = json(home, &["ledger"]);
    assert_eq!(l["balanced"], true, "{l}");
    l["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["lease_id"] == id)
        .map_or(Value::Null, |r| r["total"].clone())
}

/// A provider killed with `kill -9` and restarted still keeps the volume and bills it: at the
/// end of its keep period it is deleted (loop device and image gone) and both ledgers hold the
/// same total, every second of its GiB at the agreed price. A volume whose renter stops paying
/// (its node gone, a short prepaid window used up) is deleted too.
#[test]
fn a_volume_survives_kill_9_then_expires_and_an_unpaid_one_is_deleted() {
    let test = "volumes_expiry";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("provider.log");
    let flags = ["--volume-price", "0.01", "--usage-interval-secs", "1"];
    let mut m = cli_support::market_configured(
        dir.path(),
        &[&["--local-image", &image.tag][..], &flags[..]].concat(),
        Some(&log),
        ["", "renter_grace_secs = 2"],
    );
    let _guard = ContainersGuard(m.provider_peer.clone());
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let create = |name: &str, keep: &str, prepay: Option<&str>| {
        let mut args = vec![
            "volume", "create", name, "--offer", &m.offer, "--size", "1GiB", "--keep", keep,
        ];
        if let Some(p) = prepay {
            args.extend(["--prepay", p]);
        }
        let out = run(&rh, &args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let mut id = String::new();
        wait_for(Duration::from_secs(30), "the volume to be kept", || {
            let v = volume(&ph, name);
            id = v["lease_id"].as_str().unwrap_or_default().to_string();
            v["state"] == "running"
        });
        id
    };
    let kept = create("kept", "25s", None);
    let note = dir.path().join("note.txt");
    std::fs::write(&note, "before the reboot\n").unwrap();
    let out = run(
        &rh,
        &["volume", "cp", note.to_str().unwrap(), "kept:/note.txt"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));

    // kill -9 and a restart with the same flags: the volume is still there, still billed.
    let before = lease_of(&ph, &kept)["cost_so_far"].as_u64().unwrap();
    let _ = m.provider.0.kill();
    let _ = m.provider.0.wait();
    assert!(loop_backed_by(&kept), "the kernel keeps the loop device");
    // And as after a reboot of the machine: its loop device and Docker volume gone, only
    // the image file left (the node's own mount for copies goes with the device).
    let image_file = ph.join("leases/workspaces").join(format!("{kept}.img"));
    let image_file = std::fs::canonicalize(&image_file).unwrap();
    let mount = image_file.with_extension("mnt");
    let _ = std::process::Command::new("umount")
        .arg("-l")
        .arg(&mount)
        .status();
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let backing =
            std::fs::read_to_string(e.path().join("loop/backing_file")).unwrap_or_default();
        if backing.trim_end() == image_file.to_str().unwrap() {
            let dev = format!("/dev/{}", e.file_name().to_str().unwrap());
            assert!(
                std::process::Command::new("losetup")
                    .args(["-d", &dev])
                    .status()
                    .unwrap()
                    .success()
            );
        }
    }
    let docker_volume = format!("gridlease-ws-{kept}");
    assert!(
        std::process::Command::new("docker")
            .args(["volume", "rm", &docker_volume])
            .output()
            .unwrap()
            .status
            .success()
    );
    wait_for(Duration::from_secs(10), "the loop device to go", || {
        !loop_backed_by(&kept)
    });
    let restart: Vec<&str> = [
        &[
            "--dev-gpus",
            "RTX 4090:24GiB:3.60",
            "--local-image",
            &image.tag,
        ][..],
        &flags[..],
    ]
    .concat();
    m.provider =
        cli_support::start_node_logged(&ph, &restart, Some(&dir.path().join("provider-2.log")));
    wait_for(
        Duration::from_secs(30),
        "billing to go on after the restart",
        || {
            let v = lease_of(&ph, &kept);
            v["state"] == "running" && v["cost_so_far"].as_u64().unwrap_or(0) > before
        },
    );
    // Attached again, with its files.
    assert!(loop_backed_by(&kept));
    let back = dir.path().join("back.txt");
    let out = run(
        &rh,
        &["volume", "cp", "kept:/note.txt", back.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(&back).unwrap(),
        "before the reboot\n"
    );

    // Its keep period ends: deleted, and settled alike on both sides at the price of every
    // second kept (10,000 micro-units per GiB-hour: 25 s of 1 GiB is 69).
    wait_for(
        Duration::from_secs(60),
        "the volume to expire and settle",
        || lease_of(&rh, &kept)["state"] == "settled" && lease_of(&ph, &kept)["state"] == "settled",
    );
    let (r, p) = (lease_of(&rh, &kept), lease_of(&ph, &kept));
    assert_eq!(p["close_reason"], "expired", "{p}");
    assert_eq!(r["settled_total"], p["settled_total"], "{r}\n{p}");
    assert_eq!(p["settled_total"], 69, "{p}");
    assert_eq!(ledger_total(&rh, &kept), ledger_total(&ph, &kept));
    assert_eq!(ledger_total(&ph, &kept), 69);
    wait_for(
        Duration::from_secs(30),
        "the expired volume to be deleted",
        || {
            !loop_backed_by(&kept)
                && !ph
                    .join("leases/workspaces")
                    .join(format!("{kept}.img"))
                    .exists()
        },
    );

    // Paid per window (1 s ahead), then the renter goes away for good: the provider stops
    // being paid and deletes the volume.
    let unpaid = create("unpaid", "10m", Some("1s"));
    let _ = m.renter.0.kill();
    let _ = m.renter.0.wait();
    wait_for(Duration::from_secs(90), "the unpaid volume to end", || {
        lease_of(&ph, &unpaid)["state"] == "settled"
    });
    let p = lease_of(&ph, &unpaid);
    assert!(
        ["renter_unreachable", "payment_lagging"].contains(&p["close_reason"].as_str().unwrap()),
        "{p}"
    );
    wait_for(
        Duration::from_secs(30),
        "the unpaid volume to be deleted",
        || {
            !loop_backed_by(&unpaid)
                && !ph
                    .join("leases/workspaces")
                    .join(format!("{unpaid}.img"))
                    .exists()
        },
    );
    let said = std::fs::read_to_string(&log).unwrap_or_default()
        + &std::fs::read_to_string(dir.path().join("provider-2.log")).unwrap_or_default();
    assert!(
        said.contains("volume ends: deleting it"),
        "the provider's log says nothing"
    );
    assert!(
        said.contains("volume will be deleted at the end of its keep period"),
        "the provider's log did not announce the expiry"
    );
}

/// `stop --keep-disk` then `rent --volume NAME:/workspace`: the running lease ends and settles
/// (the renter's stop), its `/workspace` becomes a volume of the same size whose billing starts
/// only once the lease's ended, a later lease on the same provider finds the files intact, and
/// the volume's storage is billed per second alike in both ledgers.
#[test]
fn a_stopped_lease_keeps_its_disk_as_a_volume_and_a_new_lease_resumes_on_it() {
    let test = "volumes_keep_disk";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = busybox_market(
        dir.path(),
        &image.tag,
        &dir.path().join("provider.log"),
        &[
            "--volume-price",
            "0.01",
            "--usage-interval-secs",
            "1",
            "--per-gpu-disk-gib",
            "2",
        ],
    );
    let _guard = ContainersGuard(m.provider_peer.clone());
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let rented = json(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "600",
            "--detach",
            "--no-verify",
            "--image",
            &image.tag,
            "--",
            "sh",
            "-c",
            "mkdir -p /workspace/run && dd if=/dev/urandom of=/workspace/run/ckpt bs=1M count=20 2>/dev/null && sha256sum /workspace/run/ckpt > /workspace/run/ckpt.sum && sleep 600",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    wait_for(
        Duration::from_secs(60),
        "the checkpoint to be written",
        || {
            let out = run(&rh, &["exec", &id, "--", "cat", "/workspace/run/ckpt.sum"]);
            out.status.success() && text(&out.stdout).contains("/workspace/run/ckpt")
        },
    );

    // The keep period is the renter's to agree: none given, nothing happens.
    let out = run(&rh, &["stop", &id, "--keep-disk"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(lease_of(&ph, &id)["state"], "running");

    let out = run(
        &rh,
        &[
            "--json",
            "stop",
            &id,
            "--keep-disk",
            "--keep",
            "10m",
            "--name",
            "ckpt",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let kept: Value = serde_json::from_slice(&out.stdout).unwrap();
    let vid = kept["volume"]["lease_id"].as_str().unwrap().to_string();
    assert_eq!(kept["lease"]["state"], "settled", "{kept}");
    assert_eq!(kept["lease"]["close_reason"], "renter_stop", "{kept}");
    assert_eq!(kept["volume"]["state"], "running", "{kept}");
    assert_eq!(kept["volume"]["volume"]["name"], "ckpt", "{kept}");
    assert_eq!(kept["volume"]["volume"]["size_gib"], 2, "{kept}");
    assert_eq!(
        kept["volume"]["volume"]["from_lease"],
        id.as_str(),
        "{kept}"
    );

    // The lease settled alike on both sides; the volume's billing started once it had ended.
    wait_for(Duration::from_secs(30), "the provider to settle", || {
        lease_of(&ph, &id)["state"] == "settled"
    });
    let (lr, lp) = (lease_of(&rh, &id), lease_of(&ph, &id));
    assert_eq!(lr["settled_total"], lp["settled_total"], "{lr}\n{lp}");
    let vp = lease_of(&ph, &vid);
    let (closed, started) = (
        lp["closed_at"].as_u64().unwrap(),
        vp["started_at"].as_u64().unwrap(),
    );
    assert!(
        closed <= started,
        "billing overlapped: lease closed {closed}, volume started {started}"
    );
    let ran = closed - lp["started_at"].as_u64().unwrap();
    assert!(
        lp["usage"]["wall_ms"].as_u64().unwrap() <= ran,
        "the lease billed past its stop: {lp}"
    );
    // The image moved to the volume: no copy, nothing left under the lease's name.
    let workspaces = ph.join("leases/workspaces");
    assert!(!workspaces.join(format!("{id}.img")).exists());
    assert!(workspaces.join(format!("{vid}.img")).exists());
    assert!(!loop_backed_by(&id) && loop_backed_by(&vid));
    // Only storage is billed meanwhile.
    wait_for(Duration::from_secs(30), "storage to be billed", || {
        lease_of(&rh, &vid)["cost_so_far"].as_u64().unwrap_or(0) > 0
    });

    // Resumed on the same provider: the files are intact.
    let handle = json(&rh, &["search"])[0]["handle"]
        .as_str()
        .unwrap()
        .to_string();
    let out = rent_with(
        &rh,
        &handle,
        &image.tag,
        "ckpt:/workspace",
        "sha256sum /workspace/run/ckpt; cat /workspace/run/ckpt.sum",
    );
    let sums = same_sums(&out, "/workspace/run/ckpt");

    // The provider stops offering GPUs: the volume's files still come home.
    let off = run(&ph, &["provide", "--off"]);
    assert!(off.status.success(), "{}", text(&off.stderr));
    assert!(json(&ph, &["status"])["own_offer"].is_null());
    let home_sum = dir.path().join("ckpt.sum");
    let out = run(
        &rh,
        &[
            "volume",
            "cp",
            "ckpt:/run/ckpt.sum",
            home_sum.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let got = std::fs::read_to_string(&home_sum).unwrap();
    assert!(got.starts_with(sums[0]), "{got}");

    // Removed: storage billed per second of its 2 GiB, alike in both ledgers.
    let out = run(&rh, &["volume", "rm", "ckpt"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for(
        Duration::from_secs(30),
        "both sides to settle the volume",
        || lease_of(&rh, &vid)["state"] == "settled" && lease_of(&ph, &vid)["state"] == "settled",
    );
    let (r, p) = (lease_of(&rh, &vid), lease_of(&ph, &vid));
    assert_eq!(r["settled_total"], p["settled_total"], "{r}\n{p}");
    let secs = p["usage"]["wall_ms"].as_u64().unwrap() / 1000;
    assert!(secs > 0, "{p}");
    assert_eq!(
        p["settled_total"].as_u64().unwrap(),
        10_000 * 2 * secs / 3600,
        "{p}"
    );
    assert_eq!(ledger_total(&rh, &vid), ledger_total(&ph, &vid));
    assert_eq!(ledger_total(&rh, &id), ledger_total(&ph, &id));
    wait_for(Duration::from_secs(30), "the volume to be deleted", || {
        !loop_backed_by(&vid) && !workspaces.join(format!("{vid}.img")).exists()
    });
}
