//! `gridlease cp` end to end (issue 13): two real `gridlease node` processes, the real Docker
//! daemon, a busybox image. A 1 GiB tree of random files is uploaded into a running lease's
//! workspace (the upload's command killed part way and run again: it resumes without sending
//! the completed files again), transformed in the container, and downloaded (also interrupted
//! and resumed); every file's SHA-256 matches, and the renter's node and `cp` process stay
//! under 100 MiB of RSS throughout.
//!
//! Needs Docker and busybox-static: with `GRIDLEASE_REQUIRE_DOCKER=1` (`.ci/run` installs it)
//! it fails when one is missing, otherwise it skips with a note.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cli_support::{
    BusyboxImage, ContainersGuard, bin, busybox_market, containers_labelled, json, lease_of, text,
    wait_for,
};
use sha2::Digest as _;

/// Files of the tree: 64 x 16 MiB in 4 directories = 1 GiB.
const FILES: usize = 64;
const FILE_BYTES: usize = 16 << 20;

fn random_tree(root: &Path) -> BTreeMap<String, String> {
    let mut sums = BTreeMap::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; FILE_BYTES];
    for i in 0..FILES {
        let rel = format!("d{}/f{i:02}.bin", i % 4);
        for chunk in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        let p = root.join(&rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::File::create(&p).unwrap().write_all(&buf).unwrap();
        sums.insert(rel, hex::encode(sha2::Sha256::digest(&buf)));
    }
    sums
}

fn sums_of(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.insert(
                    rel,
                    hex::encode(sha2::Sha256::digest(std::fs::read(&p).unwrap())),
                );
            }
        }
    }
    out
}

/// A `sha256sum` listing (`SUM  ./PATH` lines) as path -> sum.
fn sha256sum_output(file: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| {
            let (sum, path) = l.split_once("  ").unwrap();
            (path.trim_start_matches("./").to_string(), sum.to_string())
        })
        .collect()
}

/// Largest RSS (KiB) seen of each pid while sampling; stop with the flag.
fn sample_rss(
    pids: Vec<u32>,
    stop: Arc<AtomicBool>,
) -> (Arc<AtomicU64>, std::thread::JoinHandle<()>) {
    let max = Arc::new(AtomicU64::new(0));
    let m = max.clone();
    let h = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            for pid in &pids {
                if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    && let Some(kb) = s
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
                {
                    m.fetch_max(kb, Ordering::Relaxed);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    (max, h)
}

/// The journal files of `home`'s interrupted copies and their line counts.
fn journal_lines(home: &Path) -> usize {
    std::fs::read_dir(home.join("transfers"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| {
                    std::fs::read_to_string(e.path())
                        .unwrap_or_default()
                        .lines()
                        .count()
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Runs `gridlease cp` and kills it once its journal holds `kill_at` lines; answers whether it
/// was killed (false: it finished first).
fn cp_killed_part_way(rh: &Path, src: &str, dst: &str, kill_at: usize) -> bool {
    let mut child = bin()
        .arg("--home")
        .arg(rh)
        .args(["cp", src, dst])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "the first cp failed on its own");
            return false;
        }
        if journal_lines(rh) >= kill_at {
            child.kill().unwrap();
            child.wait().unwrap();
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The resident set of `pid`, KiB (0 when it cannot be read).
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// `gridlease --json cp SRC DST`, with the RSS of the renter's node and of `cp` sampled: the
/// most either reached, less the node's own before the copy (what the copy itself holds: a
/// debug build's node is about 75 MiB idle, and its size is not what the bound is about).
fn cp_measured(rh: &Path, renter_pid: u32, src: &str, dst: &str) -> (serde_json::Value, u64) {
    let idle = rss_kib(renter_pid);
    let child = bin()
        .arg("--home")
        .arg(rh)
        .args(["--json", "cp", src, dst])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (max, sampler) = sample_rss(vec![renter_pid, child.id()], stop.clone());
    let out = child.wait_with_output().unwrap();
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    assert!(
        out.status.success(),
        "cp {src} {dst}: {}",
        text(&out.stderr)
    );
    let max = max.load(Ordering::Relaxed);
    eprintln!("RSS: node {idle} KiB before the copy, most of node or cp during it {max} KiB");
    (
        serde_json::from_slice(&out.stdout).unwrap(),
        max.saturating_sub(idle),
    )
}

#[test]
fn a_1_gib_tree_goes_in_and_out_resumed_after_interruptions_with_checksums_matching() {
    let test = "cli_cp";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let sums = random_tree(&data);
    let m = busybox_market(
        dir.path(),
        &image.tag,
        &dir.path().join("provider.log"),
        &["--per-gpu-disk-gib", "4"],
    );
    let _guard = ContainersGuard(m.provider_peer.clone());
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let renter_pid = m.renter.0.id();
    let rented = json(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "600",
            "--detach",
            "--image",
            &image.tag,
            "--",
            "sleep",
            "600",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "the lease to run", || {
        lease_of(&ph, &id)["state"] == "running"
    });
    let remote = |p: &str| format!("{}:{p}", &id[..12]);

    // Upload, killed once a few batches are in (the journal also lists directories).
    let src = data.display().to_string();
    assert!(
        cp_killed_part_way(&rh, &src, &remote("/workspace/data"), 12),
        "the upload finished before it could be interrupted"
    );
    let (up, rss) = cp_measured(&rh, renter_pid, &src, &remote("/workspace/data"));
    eprintln!("upload resumed: {up}, {rss} KiB above the idle node");
    let skipped = up["skipped"].as_u64().unwrap();
    assert!(skipped >= 4, "completed files were sent again: {up}");
    assert_eq!(
        skipped + up["files"].as_u64().unwrap(),
        FILES as u64,
        "{up}"
    );
    assert!(
        up["bytes"].as_u64().unwrap() < (FILES * FILE_BYTES) as u64,
        "{up}"
    );
    assert!(
        rss < 64 * 1024,
        "the upload took {rss} KiB more than the idle node"
    );

    // Transformed in the container: a copy of the tree plus its checksums, as the tenant.
    let exec = bin()
        .arg("--home")
        .arg(&rh)
        .args([
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "cd /workspace && cp -r data out && cd data && find . -type f | sort | xargs sha256sum > ../out/SUMS",
        ])
        .output()
        .unwrap();
    assert!(exec.status.success(), "{}", text(&exec.stderr));

    // Download, interrupted and resumed too.
    let back = dir.path().join("back");
    let back_s = back.display().to_string();
    assert!(
        cp_killed_part_way(&rh, &remote("/workspace/out"), &back_s, 8),
        "the download finished before it could be interrupted"
    );
    let (down, rss) = cp_measured(&rh, renter_pid, &remote("/workspace/out"), &back_s);
    eprintln!("download resumed: {down}, {rss} KiB above the idle node");
    assert!(down["skipped"].as_u64().unwrap() >= 8, "{down}");
    assert!(
        rss < 64 * 1024,
        "the download took {rss} KiB more than the idle node"
    );

    // Every file came back as it went in, and the container saw the same bytes.
    let mut got = sums_of(&back);
    let listed = got.remove("SUMS").expect("the container's checksums");
    assert_eq!(got, sums);
    assert_eq!(sha256sum_output(&back.join("SUMS")), sums, "{listed}");
    // No journal is left once a copy completed.
    assert_eq!(journal_lines(&rh), 0);
    drop(m);
}

/// `rent --download` (issue 13): the command writes its results in `/workspace`, exits, and
/// `rent` brings them home; the provider keeps the stopped container and workspace (the terms'
/// output retention), so `cp` still downloads after the lease has settled, while an upload is
/// refused; the renter's view says until when.
#[test]
fn rent_download_brings_the_outputs_home_and_they_stay_for_cp_after_the_lease() {
    let test = "cli_rent_download";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let m = busybox_market(
        dir.path(),
        &image.tag,
        &dir.path().join("provider.log"),
        &["--per-gpu-disk-gib", "1", "--output-retention-secs", "900"],
    );
    let _guard = ContainersGuard(m.provider_peer.clone());
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let here = dir.path().join("here");
    std::fs::create_dir_all(&here).unwrap();
    let out = bin()
        .current_dir(&here)
        .arg("--home")
        .arg(&rh)
        .args([
            "rent",
            &m.offer,
            "--seconds",
            "120",
            "--image",
            &image.tag,
            "--download",
            "out:got",
            "--",
            "sh",
            "-c",
            "mkdir -p out/sub && seq 1 200000 > out/sub/numbers && echo done > out/flag",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    eprintln!("rent: {stdout}\n{stderr}");
    assert!(out.status.success(), "rent failed: {stdout} {stderr}");
    assert!(
        stdout.contains("downloaded out -> got: 2 file(s)"),
        "{stdout}"
    );
    let numbers = std::fs::read_to_string(here.join("got/sub/numbers")).unwrap();
    let expected: String = (1..=200_000).map(|i| format!("{i}\n")).collect();
    assert!(numbers == expected, "the numbers file differs");
    assert_eq!(
        std::fs::read_to_string(here.join("got/flag")).unwrap(),
        "done\n"
    );

    // Settled on both sides; the renter's view says until when the outputs are kept.
    let leases = json(&rh, &["leases", "--all"]);
    let id = leases[0]["lease_id"].as_str().unwrap().to_string();
    let v = lease_of(&rh, &id);
    assert_eq!(v["state"], "settled", "{v}");
    let until = v["outputs_until"].as_u64().expect("outputs kept");
    let closed = v["closed_at"].as_u64().unwrap();
    assert!(
        until > closed && until <= closed + 600_000,
        "kept for --download's 10 minutes: {v}"
    );
    assert_eq!(lease_of(&ph, &id)["state"], "settled");
    // The provider keeps the container, stopped.
    let kept = containers_labelled("gridlease.lease_id", &id);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].1, "exited", "{kept:?}");

    // `cp` after the lease: a download works, an upload is refused.
    let again = dir.path().join("again");
    let out = bin()
        .arg("--home")
        .arg(&rh)
        .args(["cp", &format!("{}:/workspace/out/flag", &id[..12])])
        .arg(&again)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&again).unwrap(), "done\n");
    let out = bin()
        .arg("--home")
        .arg(&rh)
        .arg("cp")
        .arg(&again)
        .arg(format!("{}:/workspace/back", &id[..12]))
        .output()
        .unwrap();
    assert!(!out.status.success(), "an upload into a finished lease");
    let err = text(&out.stderr);
    assert!(err.contains("not running"), "{err}");
}

/// `rent --upload ./data --upload ./train.sh --download out -- ./train.sh` (issue 13): the
/// provider holds the created container while a 1 GiB random tree and the script go in
/// (checksummed; the renter's node and `rent` stay under 100 MiB of RSS), then the command
/// runs on them (its checksums of the uploaded files are its output), and `--download` brings
/// that home; every checksum matches the local files, and nothing was billed for the hold.
#[test]
fn rent_upload_runs_the_command_on_the_uploaded_tree_and_download_brings_its_output_home() {
    let test = "cli_rent_upload";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let here = dir.path().join("here");
    let sums = random_tree(&here.join("data"));
    let script = here.join("train.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nset -e\nmkdir -p out\ncd data\nfind . -type f | sort | xargs sha256sum > ../out/sums.txt\necho trained\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let m = busybox_market(
        dir.path(),
        &image.tag,
        &dir.path().join("provider.log"),
        &["--per-gpu-disk-gib", "2", "--upload-hold-secs", "300"],
    );
    let _guard = ContainersGuard(m.provider_peer.clone());
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let offer = text(
        &bin()
            .arg("--home")
            .arg(&rh)
            .args(["offer", &m.offer])
            .output()
            .unwrap()
            .stdout,
    );
    assert!(
        offer.contains("held up to 300 s (rent --upload), one per renter at a time"),
        "the offer says how long it holds: {offer}"
    );
    let idle = rss_kib(m.renter.0.id());
    let child = bin()
        .current_dir(&here)
        .arg("--home")
        .arg(&rh)
        .args([
            "rent",
            &m.offer,
            "--seconds",
            "300",
            "--image",
            &image.tag,
            "--upload",
            "./data",
            "--upload",
            "./train.sh",
            "--download",
            "out",
            "--",
            "./train.sh",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (max_rss, sampler) = sample_rss(vec![m.renter.0.id(), child.id()], stop.clone());
    let out = child.wait_with_output().unwrap();
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    eprintln!("rent: {stdout}\n{stderr}");
    assert!(out.status.success(), "rent failed: {stdout} {stderr}");
    assert!(
        stdout.contains("uploaded ./data -> /workspace/data: 64 file(s), 1024.0 MiB"),
        "{stdout}"
    );
    assert!(stdout.contains("trained"), "the command's output: {stdout}");
    assert!(
        stdout.contains("downloaded out -> out: 1 file(s)"),
        "{stdout}"
    );
    // What the copies held: the most the node or `rent` reached, less the idle node (a debug
    // build's node alone is 75-90 MiB).
    let max_rss = max_rss.load(Ordering::Relaxed).saturating_sub(idle);
    assert!(
        max_rss < 64 * 1024,
        "renter node or rent took {max_rss} KiB more than the idle node"
    );

    // The command saw every uploaded byte: its checksums are the local files'.
    assert_eq!(
        sha256sum_output(&here.join("out/sums.txt")),
        sums,
        "checksums in the container = local ones"
    );

    // Billed from the command's start, not the hold's: at most its run plus the minimum.
    let leases = json(&rh, &["leases", "--all"]);
    let id = leases[0]["lease_id"].as_str().unwrap().to_string();
    let v = lease_of(&rh, &id);
    assert_eq!(v["state"], "settled", "{v}");
    let p = lease_of(&ph, &id);
    assert_eq!(p["settled_total"], v["settled_total"], "ledgers agree");
    let started = v["started_at"].as_u64().unwrap();
    let closed = v["closed_at"].as_u64().unwrap();
    let wall_ms = v["usage"]["wall_ms"].as_u64().unwrap();
    assert!(
        wall_ms <= closed - started + 1000,
        "billed time is the command's: {v}"
    );
    let log = std::fs::read_to_string(dir.path().join("provider.log")).unwrap();
    let held = log
        .find("container held for the renter's uploads")
        .expect("held");
    let begun = log
        .find("the renter's uploads are done; starting")
        .expect("begun");
    assert!(held < begun, "held, then begun by the renter");
}

/// A market whose provider offers `image`, and a running lease of it whose command is `cmd`
/// (5 minutes, detached): the market (dropped last: it removes the provider's containers), the
/// guard, the renter's home and the lease id.
fn running_lease(
    dir: &Path,
    image: &BusyboxImage,
    cmd: &[&str],
) -> (
    cli_support::Market,
    ContainersGuard,
    std::path::PathBuf,
    String,
) {
    let m = busybox_market(dir, &image.tag, &dir.join("provider.log"), &[]);
    let guard = ContainersGuard(m.provider_peer.clone());
    let (ph, rh) = (dir.join("provider"), dir.join("renter"));
    let mut args = vec![
        "rent",
        &m.offer,
        "--seconds",
        "300",
        "--detach",
        "--image",
        &image.tag,
        "--",
    ];
    args.extend_from_slice(cmd);
    let id = json(&rh, &args)["lease_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "the lease to run", || {
        lease_of(&ph, &id)["state"] == "running"
    });
    (m, guard, rh, id)
}

/// Issue 42 item 6: `cp` errors say what is wrong, never "run the same `gridlease cp` again"
/// when running it again cannot help, and never a raw Docker error.
/// - a missing remote path: named as missing, exit 1, no resume advice;
/// - a tree with an absolute symlink: the link is left out and named (exit 6), the rest comes;
/// - an upload into a directory that is a symlink (to `/etc`): refused with a sentence, and
///   nothing lands outside `/workspace`.
#[test]
fn cp_errors_say_what_is_wrong_and_never_advise_a_retry_that_cannot_help() {
    let test = "cp_errors";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_m, _guard, rh, id) = running_lease(
        dir.path(),
        &image,
        &[
            "sh",
            "-c",
            "mkdir -p /workspace/out/sub && echo data > /workspace/out/sub/f && \
             ln -s /etc/passwd /workspace/out/abs && ln -s /etc /workspace/etc-link && \
             touch /workspace/ready && sleep 300",
        ],
    );
    let remote = |p: &str| format!("{}:{p}", &id[..12]);
    let cp = |args: &[&str]| {
        bin()
            .arg("--home")
            .arg(&rh)
            .arg("cp")
            .args(args)
            .output()
            .unwrap()
    };
    wait_for(Duration::from_secs(30), "the tenant's files", || {
        cp(&[
            &remote("/workspace/ready"),
            dir.path().join("ready").to_str().unwrap(),
        ])
        .status
        .success()
    });

    let out = cp(&[
        &remote("/workspace/not-there"),
        dir.path().join("x").to_str().unwrap(),
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("not-there"), "names the path: {err}");
    assert!(
        err.contains("no such file or directory") || err.contains("does not exist"),
        "says it is missing: {err}"
    );
    eprintln!("missing: {err}");
    assert!(!err.contains("run the same"), "no retry advice: {err}");

    let dst = dir.path().join("out");
    let out = cp(&[&remote("/workspace/out"), dst.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "a left-out entry: {err}");
    assert!(err.contains("abs"), "names the link: {err}");
    assert!(!err.contains("run the same"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dst.join("sub/f")).unwrap(),
        "data\n"
    );
    assert!(std::fs::symlink_metadata(dst.join("abs")).is_err());

    let src = dir.path().join("evil.txt");
    std::fs::write(&src, "owned\n").unwrap();
    let out = cp(&[
        src.to_str().unwrap(),
        &remote("/workspace/etc-link/evil.txt"),
    ]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        !err.contains("Docker responded"),
        "no raw Docker error: {err}"
    );
    eprintln!("into a link: {err}");
    assert!(err.contains("etc-link"), "names the link: {err}");
    assert!(err.contains("symbolic link"), "says what it is: {err}");
    assert!(!err.contains("run the same"), "{err}");
    let exec = bin()
        .arg("--home")
        .arg(&rh)
        .args([
            "exec",
            &id[..12],
            "--",
            "sh",
            "-c",
            "test ! -e /etc/evil.txt && echo clean",
        ])
        .output()
        .unwrap();
    assert_eq!(text(&exec.stdout).trim(), "clean", "{}", text(&exec.stderr));
}

/// Issue 42 item 2: an upload keeps each file's mode and modification time (they used to be
/// 1970-01-01, so Python took a changed module of the same size for its stale bytecode): a
/// file changed in place (same size, newer mtime) and copied again is seen as changed.
#[test]
fn an_upload_keeps_each_files_mode_and_mtime() {
    let test = "cp_mtime";
    let Some(image) = BusyboxImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_m, _guard, rh, id) = running_lease(dir.path(), &image, &["sleep", "300"]);
    let src = dir.path().join("mod.py");
    let stat_in_lease = || {
        let out = bin()
            .arg("--home")
            .arg(&rh)
            .args([
                "exec",
                &id[..12],
                "--",
                "/bin/busybox",
                "stat",
                "-c",
                "%Y %a",
                "/workspace/mod.py",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} {}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout).trim().to_string()
    };
    let upload = || {
        let out = bin()
            .arg("--home")
            .arg(&rh)
            .args([
                "cp",
                src.to_str().unwrap(),
                &format!("{}:/workspace/mod.py", &id[..12]),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    };
    let set = |content: &str, mtime: i64, mode: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(&src, content).unwrap();
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(mode)).unwrap();
        let f = std::fs::File::options().write(true).open(&src).unwrap();
        let t = std::time::UNIX_EPOCH + Duration::from_secs(u64::try_from(mtime).unwrap());
        f.set_modified(t).unwrap();
    };
    set("X = 1\n", 1_700_000_000, 0o640);
    upload();
    assert_eq!(stat_in_lease(), "1700000000 640");
    // Changed in place: the same size, a later mtime, another mode.
    set("X = 2\n", 1_700_000_100, 0o755);
    upload();
    assert_eq!(stat_in_lease(), "1700000100 755");
}
