//! Records the git revision this binary is built from, for `manifest.json`: a run names its own
//! source, not whatever repository the shell happens to be in. Sets
//! `GRIDLEASE_SIM_GIT_REVISION` to `git rev-parse HEAD`, with `-dirty` when tracked files of
//! the crates the simulator is built from (simulations, contracts, protocol, the workspace
//! manifest and lock file) differ from HEAD; unset outside a git checkout.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from) else {
        return;
    };
    // The sources the binary is built from: rerun when they change, so `-dirty` stays true.
    let sources = [
        "../simulations",
        "../contracts",
        "../protocol",
        "../Cargo.toml",
        "../Cargo.lock",
    ];
    for s in [
        "build.rs",
        "src",
        "Cargo.toml",
        "../contracts",
        "../protocol",
        "../Cargo.toml",
        "../Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={s}");
    }
    let Some(rev) = git(&dir, &["rev-parse", "HEAD"]) else {
        return;
    };
    // HEAD, the branch it points to, packed refs and the index: a commit or checkout changes one.
    if let Some(git_dir) = git(&dir, &["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
        println!("cargo:rerun-if-changed={git_dir}/index");
    }
    if let Some(common) = git(
        &dir,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    ) {
        println!("cargo:rerun-if-changed={common}/packed-refs");
        if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={common}/{branch}");
        }
    }
    let mut args = vec!["diff", "--quiet", "HEAD", "--"];
    args.extend(sources);
    let clean = Command::new("git")
        .arg("-C")
        .arg(&dir)
        .args(&args)
        .status()
        .map(|s| s.success())
        .unwrap_or(true);
    let rev = if clean { rev } else { format!("{rev}-dirty") };
    println!("cargo:rustc-env=GRIDLEASE_SIM_GIT_REVISION={rev}");
}
