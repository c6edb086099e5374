//! Compiles `probe/main.rs` into a static binary in `OUT_DIR` so the library can embed it with
//! `include_bytes!` and build the FROM-scratch probe image without any registry.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=probe/main.rs");
    println!("cargo:rerun-if-changed=build.rs");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let target = std::env::var("TARGET").unwrap_or_default();
    let out = out_dir.join("gridlease-probe");
    let mut cmd = Command::new(&rustc);
    cmd.arg("--edition=2024")
        .arg("-O")
        .arg("-C")
        .arg("target-feature=+crt-static")
        .arg("-C")
        .arg("debuginfo=0")
        .arg("-C")
        .arg("strip=symbols");
    if !target.is_empty() {
        cmd.arg("--target").arg(&target);
    }
    cmd.arg("-o").arg(&out).arg(manifest.join("probe/main.rs"));
    // Cargo's jobserver and wrapper variables are for the outer build; the probe build is plain.
    cmd.env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    let status = cmd.status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("compiling the probe with {rustc:?} failed: {s}"),
        Err(e) => panic!("could not run {rustc:?} to compile the probe: {e}"),
    }
}
