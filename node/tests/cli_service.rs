//! `gridlease service install|status|uninstall` writes and removes a systemd unit that
//! `systemd-analyze verify` accepts (`.ci/run` installs systemd's tools when missing);
//! `completions` and `man` are generated from the CLI definition.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::process::Command;

use cli_support::{bin, init, json, text};

#[test]
fn service_install_writes_a_unit_systemd_accepts_and_uninstall_removes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (home, units) = (dir.path().join("home"), dir.path().join("units"));
    let unit = units.join("gridlease.service");
    let run = |args: &[&str]| {
        bin()
            .arg("--home")
            .arg(&home)
            .args(args)
            .arg("--unit-dir")
            .arg(&units)
            .output()
            .unwrap()
    };

    // No identity yet: refused before anything is written.
    let out = run(&["service", "install"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("init"), "{}", text(&out.stderr));
    assert!(!unit.exists());

    init(&home);
    let out = run(&["service", "install"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let body = std::fs::read_to_string(&unit).unwrap();
    let exe = cli_support::bin_path().canonicalize().unwrap();
    let home_abs = home.canonicalize().unwrap();
    assert!(
        body.contains(&format!(
            "ExecStart={} --home {} node\n",
            exe.display(),
            home_abs.display()
        )),
        "{body}"
    );
    for line in [
        "Restart=on-failure\n",
        "RestartSec=5\n",
        "KillSignal=SIGTERM\n",
        "WantedBy=default.target\n",
    ] {
        assert!(body.contains(line), "{line:?} missing: {body}");
    }
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("systemd-analyze (Debian's systemd; .ci/run installs it)");
    assert!(
        verify.status.success(),
        "systemd-analyze verify: {}",
        text(&verify.stderr)
    );

    let st = json(
        &home,
        &["service", "status", "--unit-dir", units.to_str().unwrap()],
    );
    assert_eq!(st["installed"], true, "{st}");
    let out = run(&["service", "uninstall"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!unit.exists());
    let st = json(
        &home,
        &["service", "status", "--unit-dir", units.to_str().unwrap()],
    );
    assert_eq!(st["installed"], false, "{st}");
}

#[test]
fn completions_and_man_pages_come_from_the_cli_definition() {
    for (shell, marker) in [
        ("bash", "_gridlease()"),
        ("zsh", "#compdef gridlease"),
        ("fish", "complete -c gridlease"),
    ] {
        let out = bin().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell}: {marker:?} missing");
        for sub in ["rent", "statement", "verify", "service"] {
            assert!(script.contains(sub), "{shell}: no {sub}");
        }
    }
    // bash loads its script and registers the completion.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("gridlease.bash");
    std::fs::write(
        &script,
        bin().args(["completions", "bash"]).output().unwrap().stdout,
    )
    .unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p gridlease",
            script.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("_gridlease"),
        "{}",
        text(&out.stdout)
    );

    let out = bin().arg("man").output().unwrap();
    let page = text(&out.stdout);
    assert!(page.contains(".TH gridlease 1"), "{page}");
    assert!(page.contains("peer\\-to\\-peer GPU market"), "{page}");
    let out = bin()
        .args(["man", "--out"])
        .arg(dir.path().join("man"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    for page in ["gridlease.1", "gridlease-rent.1", "gridlease-verify.1"] {
        assert!(dir.path().join("man").join(page).exists(), "{page}");
    }
}
