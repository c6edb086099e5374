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
    // One unit per home, named after it.
    let unit = units.join("gridlease-home.service");
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
        "After=network-online.target docker.service\n",
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

/// Every node flag given to `service install` is kept in the home's config.toml (parsed back
/// and compared with what `node` resolves from the same flags), comments the user wrote stay,
/// and a second home whose unit name would be the same is refused: nothing of the first
/// is touched.
#[test]
fn service_install_keeps_every_flag_in_the_config_and_refuses_another_homes_unit() {
    let dir = tempfile::tempdir().unwrap();
    let units = dir.path().join("units");
    let home = dir.path().join("a").join("farm");
    init(&home);
    let config = home.join("config.toml");
    std::fs::write(&config, "# my own note\nannounce_secs = 30\n").unwrap();
    let flags = [
        "--dev-gpus",
        "RTX 4090:24GiB:0.40",
        "--bootstrap",
        "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNxvq3XkRXsNHcnzSjFyqDZ",
        "--listen",
        "/ip4/127.0.0.1/tcp/0",
        "--local-image",
        "gl-test:1",
        "--no-mdns",
    ];
    let out = bin()
        .arg("--home")
        .arg(&home)
        .args(["service", "install", "--unit-dir"])
        .arg(&units)
        .args(flags)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let unit = units.join("gridlease-farm.service");
    let body = std::fs::read_to_string(&unit).unwrap();
    assert!(
        body.contains(" node\n"),
        "the unit carries no setting: {body}"
    );
    // A user unit: the lingering advice (unless lingering is on for this user).
    let said = text(&out.stdout);
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    if !std::path::Path::new("/var/lib/systemd/linger")
        .join(&user)
        .exists()
    {
        assert!(said.contains("loginctl enable-linger"), "{said}");
    }

    // The file, parsed back, is what `node` resolves from the same flags over the old file.
    let written = std::fs::read_to_string(&config).unwrap();
    assert!(written.contains("# my own note"), "{written}");
    assert!(written.contains("announce_secs = 30"), "{written}");
    let dump = |home: &std::path::Path, extra: &[&str]| {
        let out = bin()
            .arg("--home")
            .arg(home)
            .args(["node", "--dump-config"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).parse::<toml::Table>().unwrap()
    };
    let from_file = dump(&home, &[]);
    let reference = dir.path().join("ref");
    init(&reference);
    std::fs::write(
        reference.join("config.toml"),
        "# my own note\nannounce_secs = 30\n",
    )
    .unwrap();
    let from_flags = dump(&reference, &flags);
    assert_eq!(from_file, from_flags);
    assert_eq!(from_file["mdns"].as_bool(), Some(false));
    assert_eq!(from_file["dev_gpus"].as_str(), Some("RTX 4090:24GiB:0.40"));
    // `node --config FILE` reads that file wherever it is.
    let elsewhere = dir.path().join("elsewhere.toml");
    std::fs::copy(&config, &elsewhere).unwrap();
    std::fs::remove_file(&config).unwrap();
    assert_eq!(
        dump(&home, &["--config", elsewhere.to_str().unwrap()]),
        from_flags
    );
    let missing = bin()
        .arg("--home")
        .arg(&home)
        .args(["node", "--dump-config", "--config"])
        .arg(dir.path().join("nope.toml"))
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("nope.toml"),
        "{}",
        text(&missing.stderr)
    );
    std::fs::copy(&elsewhere, &config).unwrap();

    // A second home also named `farm`: the same unit name, refused; the first unit is intact.
    let other = dir.path().join("b").join("farm");
    init(&other);
    let out = bin()
        .arg("--home")
        .arg(&other)
        .args(["service", "install", "--unit-dir"])
        .arg(&units)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("--name") && err.contains("a/farm"), "{err}");
    assert_eq!(std::fs::read_to_string(&unit).unwrap(), body);
    assert!(!other.join("config.toml").exists());
    // Its own name works; uninstall of the first leaves the second.
    let out = bin()
        .arg("--home")
        .arg(&other)
        .args(["service", "install", "--name", "farm-b", "--unit-dir"])
        .arg(&units)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(units.join("farm-b.service").exists());
    // A setting the node would refuse is refused before anything is written.
    let out = bin()
        .arg("--home")
        .arg(&home)
        .args(["service", "install", "--unit-dir"])
        .arg(&units)
        .args(["--local-image", "Not//An Image"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert_eq!(std::fs::read_to_string(&config).unwrap(), written);
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
