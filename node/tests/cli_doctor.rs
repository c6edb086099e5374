//! `gridlease doctor` on this machine: what it has is ok (Docker, quota'd workspaces on loop
//! devices, cgroup accounting, free disk, the listen port, the home); an unreachable Docker
//! socket (a wrong `DOCKER_HOST`), a world-readable home and a port in use are named with
//! their fix and the exit code says so; the node logs the same checks at start.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::path::Path;
use std::time::Duration;

use cli_support::{bin, docker_required, init, start_node_logged, text, wait_for};
use serde_json::Value;

/// `doctor --json` with more environment: (exit code, the checks by item).
fn doctor(home: &Path, env: &[(&str, &str)]) -> (i32, Value) {
    let out = bin()
        .arg("--home")
        .arg(home)
        .args(["--json", "doctor"])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)));
    let mut by_item = serde_json::Map::new();
    for c in v["checks"].as_array().unwrap() {
        by_item.insert(c["item"].as_str().unwrap().to_string(), c.clone());
    }
    by_item.insert("worst".into(), v["worst"].clone());
    (out.status.code().unwrap(), Value::Object(by_item))
}

fn level(v: &Value, item: &str) -> String {
    v[item]["level"].as_str().unwrap_or("missing").to_string()
}

/// The exit code the worst level gives: 0 ok, 1 warn, 2 fail.
fn code_of(v: &Value) -> i32 {
    match v["worst"].as_str().unwrap() {
        "ok" | "skip" => 0,
        "warn" => 1,
        _ => 2,
    }
}

#[test]
fn doctor_says_what_this_machine_has_and_names_each_fault_with_its_fix() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    init(&home);
    // A port nobody holds, then held by this test.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        home.join("config.toml"),
        format!("listen = [\"/ip4/127.0.0.1/tcp/{port}\"]\n"),
    )
    .unwrap();

    let (code, v) = doctor(&home, &[]);
    for item in [
        "docker",
        "disk-quota",
        "cgroups",
        "free-disk",
        "listen-ports",
        "home",
    ] {
        if item == "docker" && !docker_required() && level(&v, item) != "ok" {
            eprintln!("cli_doctor: Docker unreachable and not required: docker items not asserted");
            return;
        }
        assert_eq!(level(&v, item), "ok", "{item}: {}", v[item]);
        assert_eq!(v[item]["fix"], "", "{item}");
    }
    assert!(
        v["docker"]["detail"].as_str().unwrap().contains("API 1."),
        "{}",
        v["docker"]
    );
    // Not applicable or not present here: skipped or warned, never silently ok.
    assert_eq!(level(&v, "runtime"), "skip");
    assert_eq!(level(&v, "reachability"), "skip");
    for item in ["nvidia-driver", "nvidia-toolkit", "clock"] {
        let l = level(&v, item);
        assert!(["ok", "warn", "fail"].contains(&l.as_str()), "{item}: {l}");
        if l != "ok" {
            assert!(!v[item]["fix"].as_str().unwrap().is_empty(), "{item}");
        }
    }
    assert_eq!(code, code_of(&v), "{v}");
    // Nothing of the quota probe is left: no image, no loop device backed by one.
    let left: Vec<_> = std::fs::read_dir(&home)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".doctor") || n == "leases")
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let loops = std::fs::read_dir("/sys/block").unwrap();
    for l in loops.flatten() {
        let backing =
            std::fs::read_to_string(l.path().join("loop/backing_file")).unwrap_or_default();
        assert!(!backing.contains(home.to_str().unwrap()), "{backing}");
    }

    // A wrong DOCKER_HOST: docker fails, naming the variable in its fix; exit 2.
    let (code, v) = doctor(&home, &[("DOCKER_HOST", "unix:///nonexistent/docker.sock")]);
    assert_eq!(level(&v, "docker"), "fail", "{}", v["docker"]);
    assert!(
        v["docker"]["detail"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/docker.sock"),
        "{}",
        v["docker"]
    );
    assert!(v["docker"]["fix"].as_str().unwrap().contains("DOCKER_HOST"));
    assert_eq!(code, 2);

    // The listen port held by another program: named, with the fix; exit 2.
    let held = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let (code, v) = doctor(&home, &[]);
    assert_eq!(level(&v, "listen-ports"), "fail", "{}", v["listen-ports"]);
    assert!(
        v["listen-ports"]["detail"]
            .as_str()
            .unwrap()
            .contains(&port.to_string())
    );
    assert_eq!(code, 2);
    drop(held);

    // A world-readable home: fail, with the chmod that fixes it; exit 2. The human output
    // says the same on its lines.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, v) = doctor(&home, &[]);
    assert_eq!(level(&v, "home"), "fail");
    assert!(v["home"]["detail"].as_str().unwrap().contains("755"));
    assert_eq!(
        v["home"]["fix"].as_str().unwrap(),
        format!("chmod 700 {}", home.display())
    );
    assert_eq!(code, 2);
    let out = bin()
        .arg("--home")
        .arg(&home)
        .arg("doctor")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let said = text(&out.stdout);
    assert!(
        said.lines()
            .any(|l| l.starts_with("fail") && l.contains("home")),
        "{said}"
    );
    assert!(
        said.contains(&format!("fix: chmod 700 {}", home.display())),
        "{said}"
    );
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();

    // The node runs the same checks at start and logs what is not ok, with the fix; while it
    // runs, doctor asks it about reachability instead of skipping.
    let log = dir.path().join("node.log");
    let _node = start_node_logged(&home, &[], Some(&log));
    wait_for(
        Duration::from_secs(20),
        "the start-up checks in the log",
        || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("check=")
        },
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    let (_, v) = doctor(&home, &[]);
    for item in ["nvidia-driver", "nvidia-toolkit", "clock"] {
        if level(&v, item) == "warn" {
            assert!(
                logged
                    .lines()
                    .any(|l| l.contains(&format!("check=\"{item}\""))
                        || l.contains(&format!("check={item}"))),
                "{item} not logged:\n{logged}"
            );
        }
    }
    assert_ne!(level(&v, "reachability"), "skip", "{}", v["reachability"]);
    assert!(
        v.get("listen-ports").is_none(),
        "the node holds its own ports: {v}"
    );
}
