//! The lease's disk-backed `/workspace` against the real Docker daemon: a PyTorch-shaped job
//! (checkpoint to the workspace, a big `/dev/shm` mapping, an executable written to `/tmp`)
//! runs as nobody; writing past the quota fails with ENOSPC inside the container while the
//! provider's disk loses at most the workspace's image; start-up reconciliation removes
//! orphan workspaces.
//!
//! Needs root (loop devices) and e2fsprogs, like a provider node. Every name carries a per-run
//! prefix, and a `Cleanup` guard removes containers, workspaces and directories even when a
//! test fails.
// Test code: a panic is a test failure with a clear location.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Cleanup, run_to_exit};
use gridlease_protocol::{Digest, NodeKey, OfferId, ResourcesPerGpu, Timestamp, fixtures};
use gridlease_sandbox::host::disk_space;
use gridlease_sandbox::spec::ProviderLimits;
use gridlease_sandbox::workspace::{self, attached_loops, max_image_bytes};
use gridlease_sandbox::{Sandbox, SandboxSpec};

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// A fresh directory under the system temp dir (on the host's disk), removed by `cleanup`.
fn test_dir(cleanup: &mut Cleanup, tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(common::unique(tag));
    std::fs::create_dir_all(&d).unwrap();
    cleanup.dirs.push(d.clone());
    d
}

/// Bytes the file takes on its filesystem (not its length: the images are sparse).
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

/// The `key=value` fields of the first line starting with `prefix`.
fn fields<'a>(logs: &'a str, prefix: &str) -> std::collections::BTreeMap<&'a str, &'a str> {
    let line = logs
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{logs}"));
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .collect()
}

/// Asserts every part of the workspace is gone: volume, loop devices, image file.
async fn assert_gone(sb: &Sandbox, dir: &Path, lease: &gridlease_protocol::LeaseId) {
    let volume = workspace::volume_name(lease);
    assert!(
        sb.docker().inspect_volume(&volume).await.is_err(),
        "volume {volume} still exists"
    );
    let image = workspace::image_path(&std::fs::canonicalize(dir).unwrap(), lease);
    assert!(!image.exists(), "{} still exists", image.display());
    assert!(
        !attached_loops().iter().any(|(_, b)| *b == image),
        "a loop device still backs {}",
        image.display()
    );
}

/// The probe in an image whose own `/tmp` is root's 0755 (as some images ship it), so the test
/// shows the tenant's `/tmp` is 1777 because the spec says so, not because the image did.
async fn probe_with_closed_tmp(sb: &Sandbox, cleanup: &mut Cleanup) -> String {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, mode, kind, data) in [
        ("tmp/", 0o755, tar::EntryType::Directory, &[][..]),
        (
            "probe",
            0o755,
            tar::EntryType::Regular,
            gridlease_sandbox::probe_image::PROBE_BINARY,
        ),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        tar.append_data(&mut h, path, data).unwrap();
    }
    let tag = format!("{}:1", common::unique("gridlease-ws-probe"));
    sb.import_image(
        &tag,
        tar.into_inner().unwrap(),
        &["ENTRYPOINT [\"/probe\"]"],
    )
    .await
    .unwrap();
    cleanup.images.push(tag.clone());
    tag
}

#[tokio::test]
async fn a_pytorch_shaped_job_runs_as_nobody_in_a_disk_workspace() {
    let sb = docker_or_skip!("a_pytorch_shaped_job_runs_as_nobody_in_a_disk_workspace");
    let mut cleanup = Cleanup::default();
    let image = probe_with_closed_tmp(&sb, &mut cleanup).await;
    let dir = test_dir(&mut cleanup, "gridlease-ws-job").join("workspaces");

    // A lease as the node builds it: one GPU's worth (no real GPU here) of 2 GiB disk and
    // 1.5 GiB RAM, so /dev/shm gets half the RAM (768 MiB) and the 512 MiB mapping fits in
    // the memory limit next to the job itself.
    let provider = NodeKey::from_secret([1; 32]).public();
    let renter = NodeKey::from_secret([2; 32]).public();
    let offer = fixtures::offer(provider, 1, 1, 1000);
    let mut terms = fixtures::terms(OfferId(Digest::of("t", b"ws")), &offer, renter, 1, 600);
    terms.per_gpu = ResourcesPerGpu {
        cpu_millicores: 1000,
        ram_mib: 1536,
        disk_gib: 2,
        net_mbps: 0,
    };
    terms.image = image;
    terms.command = ["workspace-job", "1024", "512"].map(String::from).to_vec();
    terms.env.clear();
    let node = common::unique("ws-node");
    let mut spec = SandboxSpec::from_terms(
        common::lease("ws-job"),
        &terms,
        &node,
        Timestamp(u64::MAX / 2),
        vec![],
        &ProviderLimits::from_host(),
    );
    assert_eq!(spec.workspace_bytes, 2 * GIB);
    assert_eq!(spec.shm_mib, 768);

    let ws = sb.create_workspace(&dir, &spec).await.unwrap();
    cleanup.workspaces.push((dir.clone(), spec.lease_id));
    assert!(ws.usable_bytes >= 2 * GIB, "{ws:?}");
    assert!(ws.image_bytes <= max_image_bytes(2 * GIB), "{ws:?}");
    let fresh = allocated(&ws.image);
    assert!(
        fresh < 32 * MIB,
        "a new workspace takes {fresh} bytes on the host"
    );
    spec.workspace = Some(ws.volume.clone());

    let (id, exit, logs) = run_to_exit(&sb, &spec, &mut cleanup).await;
    eprintln!("{logs}");
    assert_eq!(exit.exit_code, 0, "{logs}");
    assert!(!exit.oom_killed);
    assert!(logs.contains("WSJOB done ok=true"), "{logs}");

    let user = fields(&logs, "WSJOB user");
    assert_eq!(
        (user["uid"], user["euid"], user["home"], user["cwd"]),
        ("65534", "65534", "/workspace", "/workspace")
    );
    let m = fields(&logs, "WSJOB mount path=/workspace");
    assert_eq!(m["type"], "ext4", "{logs}");
    let opts: BTreeSet<&str> = m["options"].split(',').collect();
    assert!(opts.contains("rw") && opts.contains("nosuid") && opts.contains("nodev"));
    let m = fields(&logs, "WSJOB mount path=/tmp");
    let opts: BTreeSet<&str> = m["options"].split(',').collect();
    assert_eq!(m["type"], "tmpfs");
    assert!(
        opts.contains("rw") && opts.contains("nosuid") && opts.contains("nodev"),
        "{opts:?}"
    );
    assert!(
        !opts.contains("noexec"),
        "/tmp must allow executables: {opts:?}"
    );
    // tmpfs shows no mode in the mount table when it is 1777; the probe stats the directories.
    let dirs = fields(&logs, "WSJOB dirs");
    assert_eq!(
        dirs["/tmp"], "1777:0:0",
        "a /tmp every user may write to, sticky"
    );
    assert_eq!(
        dirs["/workspace"], "755:65534:65534",
        "the tenant owns its workspace"
    );
    let m = fields(&logs, "WSJOB mount path=/dev/shm");
    assert_eq!(m["type"], "tmpfs");
    assert!(
        m["options"].split(',').any(|o| o == "size=786432k"),
        "/dev/shm is half the lease's 1536 MiB: {}",
        m["options"]
    );
    let space = fields(&logs, "WSJOB space");
    let avail: u64 = space["avail_bytes"].parse().unwrap();
    assert_eq!(avail, ws.usable_bytes, "the superblock predicts df");
    assert!(
        avail >= 2 * GIB,
        "the tenant sees at least the lease's disk free"
    );
    assert_eq!(fields(&logs, "WSJOB checkpoint")["bytes"], "1073741824");
    assert_eq!(fields(&logs, "WSJOB shm")["pages"], "131072");
    assert_eq!(fields(&logs, "WSJOB tmp_exec")["result"], "ok");
    assert_eq!(fields(&logs, "WSJOB home_write")["result"], "ok");

    // The checkpoint is on the provider's disk (in the image file), not in memory.
    let used = allocated(&ws.image);
    assert!(
        (GIB..=ws.image_bytes).contains(&used),
        "image takes {used} bytes"
    );

    sb.remove(&id).await.unwrap();
    sb.remove_workspace(&dir, &spec.lease_id).await.unwrap();
    assert_gone(&sb, &dir, &spec.lease_id).await;
}

/// A small ext4 filesystem of the test's own, mounted on a directory the test made: the
/// provider's disk for the quota test, so its free space moves only with what the test does
/// (the host's own disk has other writers). Unmounted and removed on drop.
struct ProviderDisk {
    root: PathBuf,
    mnt: PathBuf,
    device: String,
}

impl ProviderDisk {
    fn new(size: u64) -> Self {
        let root = std::env::temp_dir().join(common::unique("gridlease-ws-pdisk"));
        let mnt = root.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let img = root.join("disk.img");
        std::fs::File::create(&img).unwrap().set_len(size).unwrap();
        let run = |cmd: &mut Command| {
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{cmd:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&img));
        let device = run(Command::new("losetup").args(["--find", "--show"]).arg(&img));
        let disk = Self { root, mnt, device };
        run(Command::new("mount").arg(&disk.device).arg(&disk.mnt));
        disk
    }
}

impl Drop for ProviderDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[tokio::test]
async fn writes_past_the_quota_fail_with_enospc_and_the_provider_disk_keeps_the_rest() {
    let sb = docker_or_skip!(
        "writes_past_the_quota_fail_with_enospc_and_the_provider_disk_keeps_the_rest"
    );
    let image = sb.ensure_probe_image().await.unwrap();
    // Declared before the cleanup guard, so it is unmounted after the workspace is removed.
    let disk = ProviderDisk::new(GIB);
    let mut cleanup = Cleanup::default();
    let dir = disk.mnt.join("workspaces");

    let quota = 256 * MIB;
    // The tenant tries to write twice its quota (bounded, so even a broken limit cannot fill
    // the host).
    let try_mib = (2 * quota / MIB).to_string();
    let node = common::unique("ws-node");
    let mut spec = common::probe_spec(
        &image,
        &node,
        &[
            "fill",
            "/workspace/fill.bin",
            &try_mib,
            "space",
            "/workspace",
        ],
    );
    spec.memory_mib = 256;
    spec.workspace_bytes = quota;

    let before = disk_space(&disk.mnt).unwrap().free_bytes;
    let ws = sb.create_workspace(&dir, &spec).await.unwrap();
    cleanup.workspaces.push((dir.clone(), spec.lease_id));
    spec.workspace = Some(ws.volume.clone());
    let (id, exit, logs) = run_to_exit(&sb, &spec, &mut cleanup).await;
    eprintln!("{logs}");
    assert_eq!(exit.exit_code, 0, "{logs}");

    let fill = fields(&logs, "FILL");
    assert_eq!(fill["result"], "ENOSPC", "{logs}");
    let wrote: u64 = fill["bytes"].parse().unwrap();
    assert!(
        wrote >= quota - 4 * MIB && wrote <= ws.usable_bytes,
        "wrote {wrote} bytes of a {quota}-byte quota ({ws:?})"
    );
    let left: u64 = fields(&logs, "SPACE")["avail_bytes"].parse().unwrap();
    assert!(left < MIB, "the workspace is full: {left} bytes left");

    // While full, the provider's disk lost at most the image (the quota plus ext4's own
    // structures), however much the tenant tried to write.
    let full = disk_space(&disk.mnt).unwrap().free_bytes;
    let lost = before.saturating_sub(full);
    let slack = ws.image_bytes - quota;
    eprintln!(
        "provider disk: {before} free before, {full} with the workspace full: lost {lost} \
         (quota {quota}, image {} = quota + {slack}, image allocated {})",
        ws.image_bytes,
        allocated(&ws.image)
    );
    assert!(
        lost <= ws.image_bytes + MIB,
        "the provider's disk lost {lost} bytes for a {quota}-byte workspace"
    );
    assert!(ws.image_bytes <= max_image_bytes(quota));
    assert!(allocated(&ws.image) <= ws.image_bytes);

    sb.remove(&id).await.unwrap();
    sb.remove_workspace(&dir, &spec.lease_id).await.unwrap();
    assert_gone(&sb, &dir, &spec.lease_id).await;
    let after = disk_space(&disk.mnt).unwrap().free_bytes;
    assert!(
        after + MIB >= before,
        "removing the workspace gave the disk back: {before} before, {after} after"
    );
    drop(cleanup);
    drop(disk);
}

#[tokio::test]
async fn reconciliation_removes_orphan_workspaces_of_this_node_only() {
    let sb = docker_or_skip!("reconciliation_removes_orphan_workspaces_of_this_node_only");
    let mut cleanup = Cleanup::default();
    let root = test_dir(&mut cleanup, "gridlease-ws-reconcile");
    let (mine, theirs) = (root.join("mine"), root.join("theirs"));
    let node = common::unique("ws-node");
    let other = common::unique("ws-other");
    let make = |node: &str, tag: &str| {
        let mut s = common::probe_spec("unused", node, &[]);
        s.lease_id = common::lease(tag);
        s.workspace_bytes = 64 * MIB;
        s
    };
    let (live, orphan, foreign) = (
        make(&node, "live"),
        make(&node, "orphan"),
        make(&other, "x"),
    );
    for (dir, s) in [(&mine, &live), (&mine, &orphan), (&theirs, &foreign)] {
        sb.create_workspace(dir, s).await.unwrap();
        cleanup.workspaces.push((dir.clone(), s.lease_id));
    }
    let found = sb.list_workspaces(&mine, &node).await.unwrap();
    assert_eq!(found, BTreeSet::from([live.lease_id, orphan.lease_id]));

    let r = sb
        .reconcile_workspaces(&mine, &node, &BTreeSet::from([live.lease_id]))
        .await
        .unwrap();
    assert_eq!(r.removed, vec![orphan.lease_id]);
    assert_eq!(r.kept, vec![live.lease_id]);
    assert_gone(&sb, &mine, &orphan.lease_id).await;
    for (dir, s) in [(&mine, &live), (&theirs, &foreign)] {
        let img = workspace::image_path(&std::fs::canonicalize(dir).unwrap(), &s.lease_id);
        assert!(img.exists(), "{} was removed", img.display());
        assert!(attached_loops().iter().any(|(_, b)| *b == img));
        let v = sb
            .docker()
            .inspect_volume(&workspace::volume_name(&s.lease_id))
            .await
            .unwrap();
        assert_eq!(v.options["type"], "ext4");
    }

    // As after a host reboot: the live lease's loop device is gone (detached by hand here).
    // Its volume would name a device that may back someone else's image: reconciliation
    // removes the volume and keeps the image; a later pass without the lease removes the rest.
    let img = workspace::image_path(&std::fs::canonicalize(&mine).unwrap(), &live.lease_id);
    for (dev, _) in attached_loops().into_iter().filter(|(_, b)| *b == img) {
        let st = Command::new("losetup")
            .arg("-d")
            .arg(&dev)
            .status()
            .unwrap();
        assert!(st.success());
    }
    let r = sb
        .reconcile_workspaces(&mine, &node, &BTreeSet::from([live.lease_id]))
        .await
        .unwrap();
    assert_eq!(r.kept, vec![live.lease_id]);
    assert!(
        sb.docker()
            .inspect_volume(&workspace::volume_name(&live.lease_id))
            .await
            .is_err(),
        "a volume naming a detached loop device was kept"
    );
    assert!(img.exists());
    let r = sb
        .reconcile_workspaces(&mine, &node, &BTreeSet::new())
        .await
        .unwrap();
    assert_eq!(r.removed, vec![live.lease_id]);
    assert_gone(&sb, &mine, &live.lease_id).await;

    // Knowing only the node (a test's clean-up guard) finds the image through the volume.
    let removed = sb.remove_node_workspaces(&other).await.unwrap();
    assert_eq!(removed, vec![foreign.lease_id]);
    assert_gone(&sb, &theirs, &foreign.lease_id).await;
}

/// A node killed in the middle of its disk-quota probe (`gridlease doctor`, also run at its
/// start) leaves the probe's image attached to a loop device. The next probe in that home
/// detaches it and removes the dead probe's directory; a live process's probe is left alone.
#[tokio::test]
async fn a_probe_killed_mid_way_leaves_nothing_after_the_next_one() {
    let _sb = docker_or_skip!("a_probe_killed_mid_way_leaves_nothing_after_the_next_one");
    let mut cleanup = Cleanup::default();
    let home = std::fs::canonicalize(test_dir(&mut cleanup, "gridlease-ws-probe")).unwrap();
    /// Detaches every loop device backed by a file under the home, even when the test fails.
    struct Loops(PathBuf);
    impl Drop for Loops {
        fn drop(&mut self) {
            for (dev, b) in attached_loops() {
                if b.starts_with(&self.0) {
                    let _ = Command::new("losetup").arg("-d").arg(&dev).status();
                }
            }
        }
    }
    let _loops = Loops(home.clone());
    // A pid that no longer runs, and one that does (a sleeping child).
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    /// The sleeping child, killed even when the test fails.
    struct Child(std::process::Child);
    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let alive = Child(Command::new("sleep").arg("60").spawn().unwrap());
    let attach = |pid: u32| {
        let dir = home.join(format!(".doctor-{pid}"));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join(format!("probe-{pid}.img"));
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(4 * MIB).unwrap();
        let st = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&img)
            .output()
            .unwrap();
        assert!(
            st.status.success(),
            "{}",
            String::from_utf8_lossy(&st.stderr)
        );
        img
    };
    let (dead_img, live_img) = (attach(dead), attach(alive.0.id()));
    // The killed probe's file may be gone already (it removes it last): the device stays.
    std::fs::remove_file(&dead_img).unwrap();
    assert!(attached_loops().iter().any(|(_, b)| *b == dead_img));
    let mine = home.join(format!(".doctor-{}", std::process::id()));
    workspace::probe_quota(&mine).await.unwrap();
    let _ = std::fs::remove_dir_all(&mine);
    let left = attached_loops();
    assert!(
        !left.iter().any(|(_, b)| *b == dead_img),
        "the dead probe's loop device is still attached"
    );
    assert!(!dead_img.parent().unwrap().exists());
    assert!(
        left.iter().any(|(_, b)| *b == live_img),
        "a live process's probe was detached"
    );
}

#[tokio::test]
async fn tmp_and_shm_count_against_the_memory_limit() {
    let sb = docker_or_skip!("tmp_and_shm_count_against_the_memory_limit");
    let image = sb.ensure_probe_image().await.unwrap();
    let mut cleanup = Cleanup::default();
    // Each tmpfs is as large as the whole 64 MiB limit: if its pages were not charged to the
    // container, filling it would end in ENOSPC at 64 MiB and exit 0; charged, the writer
    // (which needs some memory of its own) is OOM-killed first.
    for path in ["/tmp/fill.bin", "/dev/shm/fill.bin"] {
        let mut spec =
            common::probe_spec(&image, &common::unique("ws-node"), &["fill", path, "256"]);
        spec.memory_mib = 64;
        spec.scratch_mib = 64;
        spec.shm_mib = 64;
        let (_, exit, logs) = run_to_exit(&sb, &spec, &mut cleanup).await;
        // Killed by SIGKILL: only the OOM killer sends one here. Docker 20.10 does not always
        // set OOMKilled for it (seen in a CI run: exit 137, oom_killed false), so the exit code
        // decides; an ENOSPC would have ended in 0.
        assert_eq!(exit.exit_code, 137, "{path}: {exit:?}\n{logs}");
    }
}
