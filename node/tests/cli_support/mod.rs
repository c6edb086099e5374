//! Shared helpers for tests that drive the real `gridlease` binary: daemons, `--json`
//! answers, the probe image, a tmux pane (a real terminal), the Docker containers of a lease.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::print_stderr
)]

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

/// The binary, with every `GRIDLEASE_*` variable of the test's environment removed.
pub fn bin() -> Command {
    clean(Command::cargo_bin("gridlease").unwrap())
}

/// `c` without the test's `GRIDLEASE_*` variables, logging at `warn`, keeping no disk reserve.
fn clean(mut c: Command) -> Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("GRIDLEASE_") {
            c.env_remove(k);
        }
    }
    c.env("RUST_LOG", "warn");
    // Test homes live under the temporary directory, which may be small (CI's machines): the
    // default 10 GiB reserve plus the 2 GiB log budget could leave a provider node no disk to
    // offer, and it would refuse to start. A test may set it back (`.env`, or a flag).
    c.env(DISK_RESERVE.0, DISK_RESERVE.1);
    // Test providers offer no GPU check: its CPU-reference work, timed, would slow every
    // rent and race the other tests for the CPU. `node/tests/gpu_check.rs` turns it on.
    c.env(NO_GPU_CHECK.0, NO_GPU_CHECK.1);
    c
}

/// Test nodes' verification window ([`bin`]): none.
pub const NO_GPU_CHECK: (&str, &str) = ("GRIDLEASE_VERIFY_WINDOW_SECS", "0");

/// The disk reserve test nodes keep ([`bin`]), as an environment variable.
pub const DISK_RESERVE: (&str, &str) = ("GRIDLEASE_RESERVE_DISK_GIB", "0");

/// The binary's path (what [`bin`] runs).
pub fn bin_path() -> std::path::PathBuf {
    assert_cmd::cargo::cargo_bin("gridlease")
}

/// Runs `gridlease --home HOME ARGS..` (global flags first: everything after `rent ... --`
/// is the container's command).
pub fn cli(home: &Path, args: &[&str]) -> Output {
    bin().arg("--home").arg(home).args(args).output().unwrap()
}

/// Lossy text of an output stream.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `gridlease init` into `home`.
pub fn init(home: &Path) {
    let out = cli(home, &["init"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A node process, killed when dropped.
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `f` until it holds, failing the test after `limit`.
pub fn wait_for(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts `gridlease node` on an ephemeral loopback port and waits for its API.
pub fn start_node(home: &Path, extra: &[&str]) -> Daemon {
    start_node_logged(home, extra, None)
}

/// [`start_node`], its log (at `info`) written to `log` when given.
pub fn start_node_logged(home: &Path, extra: &[&str], log: Option<&Path>) -> Daemon {
    start_node_env(home, extra, log, &[])
}

/// How a test launches a node beyond its flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct Launch<'a> {
    /// More environment variables (`DOCKER_HOST`...).
    pub env: &'a [(&'a str, &'a str)],
    /// The open-file limit, soft and hard, the node starts with.
    pub nofile: Option<u64>,
}

/// [`start_node_logged`] with more environment variables for the node (`DOCKER_HOST`...).
pub fn start_node_env(
    home: &Path,
    extra: &[&str],
    log: Option<&Path>,
    env: &[(&str, &str)],
) -> Daemon {
    start_node_launched(home, extra, log, Launch { env, nofile: None })
}

/// [`start_node_logged`], launched as `launch` says.
pub fn start_node_launched(
    home: &Path,
    extra: &[&str],
    log: Option<&Path>,
    launch: Launch<'_>,
) -> Daemon {
    let env = launch.env;
    // util-linux's `prlimit` runs the node with the given open-file limit.
    let mut cmd = match launch.nofile {
        Some(n) => {
            let mut c = clean(Command::new("prlimit"));
            c.arg(format!("--nofile={n}:{n}")).arg("--").arg(bin_path());
            c
        }
        None => bin(),
    };
    let stderr = match log {
        Some(p) => Stdio::from(std::fs::File::create(p).unwrap()),
        None => Stdio::null(),
    };
    if log.is_some() {
        cmd.env("RUST_LOG", "info");
    }
    cmd.arg("--home")
        .arg(home)
        .args([
            "node",
            "--no-mdns",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--announce-secs",
            "1",
        ])
        // Test providers offer the probe image (local-only: imported here, never pulled).
        .env(
            gridlease_node::env_vars::GRIDLEASE_LOCAL_IMAGES,
            gridlease_sandbox::probe_image::probe_image_tag(),
        )
        .args(extra)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(stderr);
    let child = cmd.spawn().unwrap();
    let d = Daemon(child);
    wait_for(Duration::from_secs(30), "the node's API", || {
        cli(home, &["status"]).status.success()
    });
    d
}

/// `gridlease init` then `gridlease node`.
pub fn start(home: &Path, extra: &[&str]) -> Daemon {
    init(home);
    start_node(home, extra)
}

/// `gridlease --home HOME --json ARGS..`, parsed (the command must succeed).
pub fn json(home: &Path, args: &[&str]) -> Value {
    let out = bin()
        .arg("--home")
        .arg(home)
        .arg("--json")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gridlease {args:?} failed: {}",
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The lease `id` as `leases --all --json` shows it on `home` (null when absent).
pub fn lease_of(home: &Path, id: &str) -> Value {
    let all = json(home, &["leases", "--all"]);
    all.as_array()
        .unwrap()
        .iter()
        .find(|l| l["lease_id"] == id)
        .cloned()
        .unwrap_or(Value::Null)
}

/// True when Docker-backed tests must run (`.ci/run` sets `GRIDLEASE_REQUIRE_DOCKER=1`).
pub fn docker_required() -> bool {
    std::env::var("GRIDLEASE_REQUIRE_DOCKER").as_deref() == Ok("1")
}

/// The probe image tag, built if missing; `None` (skip) only when Docker is unreachable and
/// not required.
pub fn probe_image_or_skip(test: &str) -> Option<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        match gridlease_sandbox::Sandbox::connect().await {
            Ok(sb) => Some(sb.ensure_probe_image().await.unwrap()),
            Err(e) => {
                if docker_required() {
                    panic!("{test}: GRIDLEASE_REQUIRE_DOCKER=1 but Docker is unreachable: {e}");
                }
                eprintln!("{test}: SKIPPED, Docker is unreachable ({e})");
                None
            }
        }
    })
}

/// A provider (with a declared GPU) and a renter bootstrapped from it, homes `provider` and
/// `renter` under a directory, with the provider's offer in the renter's book.
pub struct Market {
    /// The provider's daemon.
    pub provider: Daemon,
    /// The renter's daemon.
    pub renter: Daemon,
    /// The provider's peer id (its containers' `gridlease.node` label).
    pub provider_peer: String,
    /// The first digits of the provider's offer id.
    pub offer: String,
}

/// Dropped (also while a failing test unwinds): both daemons are killed first, then every
/// container and workspace the provider made is removed, so nothing is left behind and no
/// live daemon can recreate anything meanwhile.
impl Drop for Market {
    fn drop(&mut self) {
        for d in [&mut self.provider, &mut self.renter] {
            let _ = d.0.kill();
            let _ = d.0.wait();
        }
        drop(ContainersGuard(self.provider_peer.clone()));
    }
}

/// Starts a [`Market`] under `dir`.
pub fn market(dir: &Path) -> Market {
    market_with(dir, &[], None)
}

/// [`market`] with more provider flags (`extra`), the provider's log written to `log`.
pub fn market_with(dir: &Path, extra: &[&str], log: Option<&Path>) -> Market {
    market_configured(dir, extra, log, ["", ""])
}

/// [`market_with`], with lines added to the provider's and the renter's `config.toml`
/// (`[provider, renter]`, TOML) before they start.
pub fn market_configured(
    dir: &Path,
    extra: &[&str],
    log: Option<&Path>,
    config: [&str; 2],
) -> Market {
    market_env(dir, extra, log, config, &[])
}

/// [`market_configured`], with more environment variables for the provider's node.
pub fn market_env(
    dir: &Path,
    extra: &[&str],
    log: Option<&Path>,
    config: [&str; 2],
    provider_env: &[(&str, &str)],
) -> Market {
    market_launched(
        dir,
        extra,
        log,
        config,
        Launch {
            env: provider_env,
            nofile: None,
        },
    )
}

/// [`market_configured`], the provider's node launched as `launch` says.
pub fn market_launched(
    dir: &Path,
    extra: &[&str],
    log: Option<&Path>,
    config: [&str; 2],
    launch: Launch<'_>,
) -> Market {
    use std::io::Write;
    let (ph, rh) = (dir.join("provider"), dir.join("renter"));
    for (home, lines) in [(&ph, config[0]), (&rh, config[1])] {
        init(home);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(home.join("config.toml"))
            .unwrap();
        writeln!(f, "{lines}").unwrap();
    }
    let mut args = vec!["--dev-gpus", "RTX 4090:24GiB:3.60"];
    args.extend_from_slice(extra);
    let provider = start_node_launched(&ph, &args, log, launch);
    let status = json(&ph, &["status"]);
    let addr = status["listen_addrs"][0].as_str().unwrap().to_string();
    let renter = start_node(&rh, &["--bootstrap", &addr]);
    let mut offers = Value::Null;
    wait_for(
        Duration::from_secs(30),
        "the offer to reach the renter",
        || {
            offers = json(&rh, &["search", "gpu~4090"]);
            offers.as_array().is_some_and(|a| a.len() == 1)
        },
    );
    Market {
        provider,
        renter,
        provider_peer: status["peer_id"].as_str().unwrap().to_string(),
        offer: offers[0]["id"].as_str().unwrap()[..12].to_string(),
    }
}

/// A market whose provider (more flags: `extra`) may run `image` (besides the probe image)
/// and logs to `log`.
pub fn busybox_market(dir: &Path, image: &str, log: &Path, extra: &[&str]) -> Market {
    let locals = format!(
        "{},{image}",
        gridlease_sandbox::probe_image::probe_image_tag()
    );
    let mut args = vec!["--local-image", &locals];
    args.extend_from_slice(extra);
    market_with(dir, &args, Some(log))
}

/// Docker containers (also stopped ones) with the label `key=value`: `(container id, state)`
/// (`running`, `exited`..).
pub fn containers_labelled(key: &str, value: &str) -> Vec<(String, String)> {
    use bollard::query_parameters::ListContainersOptionsBuilder;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let sb = gridlease_sandbox::Sandbox::connect().await.unwrap();
        let mut filters = std::collections::HashMap::new();
        filters.insert("label", vec![format!("{key}={value}")]);
        let opts = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        sb.docker()
            .list_containers(Some(opts))
            .await
            .unwrap()
            .into_iter()
            .map(|c| {
                let state = c.state.map(|s| s.to_string()).unwrap_or_default();
                (c.id.unwrap_or_default(), state)
            })
            .collect()
    })
}

/// The containers of lease `id`: `(container id, state)`.
pub fn containers_of(id: &str) -> Vec<(String, String)> {
    containers_labelled(gridlease_sandbox::spec::LABEL_LEASE, id)
}

/// Removes, when dropped, every container a provider node (by peer id) created, so a test
/// that fails anywhere leaves none behind.
pub struct ContainersGuard(pub String);

impl Drop for ContainersGuard {
    fn drop(&mut self) {
        let left = containers_labelled(gridlease_sandbox::spec::LABEL_NODE, &self.0);
        let Ok(rt) = tokio::runtime::Runtime::new() else {
            return;
        };
        rt.block_on(async {
            if let Ok(sb) = gridlease_sandbox::Sandbox::connect().await {
                for (cid, _) in left {
                    let _ = sb.remove(&cid).await;
                }
                // Then their workspaces (volume, loop device, image file).
                let _ = sb.remove_node_workspaces(&self.0).await;
            }
        });
    }
}

/// Whether `tmux` can be run here.
pub fn tmux_available() -> bool {
    Command::new("tmux")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// An interactive `bash` in a tmux pane: a real terminal, so Ctrl-C reaches the foreground
/// process group as it does for a person. Each one has its own tmux server (socket in a
/// temporary directory) and a session named uniquely for this run; the server is killed when
/// dropped, also when the test fails.
pub struct Tmux {
    /// Session name: `gridlease-test-<pid>-<ns>-<test>`.
    name: String,
    /// Holds the server's socket (`tmux -S`).
    dir: tempfile::TempDir,
}

impl Tmux {
    /// Starts the server and the pane (200x50, so long lines do not wrap). The server starts
    /// without the test's `GRIDLEASE_*` variables.
    pub fn start(test: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let name = format!("gridlease-test-{}-{nanos}-{test}", std::process::id());
        let dir = tempfile::Builder::new()
            .prefix("gridlease-tmux-")
            .tempdir()
            .unwrap();
        let t = Self { name, dir };
        let mut c = t.tmux();
        for (k, _) in std::env::vars() {
            if k.starts_with("GRIDLEASE_") {
                c.env_remove(k);
            }
        }
        let out = c
            .env("RUST_LOG", "warn")
            .env("PS1", "$ ")
            .env("HISTFILE", "/dev/null")
            .args(["new-session", "-d", "-s", &t.name, "-x", "200", "-y", "50"])
            .args(["bash", "--norc", "--noprofile", "-i"])
            .output()
            .unwrap();
        assert!(out.status.success(), "tmux: {}", text(&out.stderr));
        t
    }

    fn tmux(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(self.dir.path().join("socket"));
        c
    }

    /// Resizes the window (and its one pane) to `cols` x `rows`.
    pub fn resize(&self, cols: u16, rows: u16) {
        let out = self
            .tmux()
            .args(["resize-window", "-t", &self.name])
            .args(["-x", &cols.to_string(), "-y", &rows.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "resize-window: {}", text(&out.stderr));
    }

    /// Types `line` into the pane and presses Enter.
    pub fn type_line(&self, line: &str) {
        self.send(&["-l", line]);
        self.send(&["Enter"]);
    }

    /// `tmux send-keys KEYS..` (e.g. `C-c`).
    pub fn send(&self, keys: &[&str]) {
        let out = self
            .tmux()
            .args(["send-keys", "-t", &self.name])
            .args(keys)
            .output()
            .unwrap();
        assert!(out.status.success(), "send-keys: {}", text(&out.stderr));
    }

    /// What the pane shows, with its scrollback, wrapped lines joined.
    pub fn capture(&self) -> String {
        let out = self
            .tmux()
            .args(["capture-pane", "-p", "-J", "-S", "-", "-t", &self.name])
            .output()
            .unwrap();
        assert!(out.status.success(), "capture-pane: {}", text(&out.stderr));
        text(&out.stdout)
    }

    /// Waits until the pane shows `needle`; answers the pane's text.
    pub fn wait_for_text(&self, limit: Duration, needle: &str) -> String {
        self.wait_until(limit, &format!("{needle:?}"), |screen| {
            screen.contains(needle)
        })
    }

    /// Waits until `done` holds for the pane's text; answers the text.
    pub fn wait_until(&self, limit: Duration, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let screen = self.capture();
            if done(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} in the pane:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Types `command; echo "EXIT=$?"` (see [`Tmux::wait_exit`]).
    pub fn run(&self, command: &str) {
        self.type_line(&format!("{command}; echo \"EXIT=$?\""));
    }

    /// Waits for the `EXIT=<status>` line the shell prints once the command typed by
    /// [`Tmux::run`] ended (the typed line itself shows `EXIT=$?`, not a number): answers the
    /// pane's text and the status.
    pub fn wait_exit(&self, limit: Duration) -> (String, String) {
        let screen = self.wait_until(limit, "the command to end", |s| exit_status(s).is_some());
        let status = exit_status(&screen).unwrap();
        (screen, status)
    }
}

/// The status in a line `EXIT=<digits>`, if the text has one.
fn exit_status(screen: &str) -> Option<String> {
    screen.lines().find_map(|l| {
        let n = l.trim().strip_prefix("EXIT=")?;
        (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then(|| n.to_string())
    })
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self
            .tmux()
            .arg("kill-server")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A from-scratch image with Debian's static busybox (`busybox-static`, installed by
/// `.ci/run`) as `/bin/busybox` and its applets (`sh`, `stty`, `sleep`, `wc`, `httpd`, ...)
/// linked to it, under a tag unique to this run and test; removed when dropped.
pub struct BusyboxImage {
    /// The tag.
    pub tag: String,
}

impl BusyboxImage {
    /// Imports the image, or `None` (skip) when Docker is unreachable and not required.
    pub fn build_or_skip(test: &str) -> Option<Self> {
        let busybox = match std::fs::read("/bin/busybox") {
            Ok(b) => b,
            Err(e) => {
                assert!(
                    !docker_required(),
                    "{test}: /bin/busybox is missing ({e}); `.ci/run` installs busybox-static"
                );
                eprintln!("{test}: SKIPPED, /bin/busybox is missing");
                return None;
            }
        };
        probe_image_or_skip(test)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let tag = format!(
            "gridlease-test-busybox-{}-{nanos}-{}:1",
            std::process::id(),
            test.replace('_', "-")
        );
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let sb = gridlease_sandbox::Sandbox::connect().await.unwrap();
            sb.import_busybox_image(&tag, &busybox).await.unwrap();
        });
        Some(Self { tag })
    }
}

impl Drop for BusyboxImage {
    fn drop(&mut self) {
        let Ok(rt) = tokio::runtime::Runtime::new() else {
            return;
        };
        rt.block_on(async {
            if let Ok(sb) = gridlease_sandbox::Sandbox::connect().await {
                let _ = sb.remove_image(&self.tag).await;
            }
        });
    }
}

/// A market whose provider may run `image` (and logs to `log`), and a running lease of it
/// (`sleep 600`): the market and the lease id.
pub fn running_lease(dir: &Path, image: &str, log: &Path, extra: &[&str]) -> (Market, String) {
    let m = busybox_market(dir, image, log, extra);
    let rh = dir.join("renter");
    let rented = json(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "300",
            "--detach",
            "--image",
            image,
            "--",
            "sleep",
            "600",
        ],
    );
    let id = rented["lease_id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "the lease to run", || {
        lease_of(&dir.join("provider"), &id)["state"] == "running"
    });
    (m, id)
}

/// `GET /metrics` of a node's metrics endpoint.
pub fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The value of the metric line that starts with `series`.
pub fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// A raw HTTP/1.0 GET on a new connection that half-closes after the request: the body.
pub fn http_get(port: u16, path: &str) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let at = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("an HTTP answer");
    assert!(
        all.starts_with(b"HTTP/1.1 200") || all.starts_with(b"HTTP/1.0 200"),
        "{}",
        text(&all[..at])
    );
    all.split_off(at + 4)
}

/// `rent OFFER --seconds 60 --detach --image IMAGE -- sleep SLEEP` on `renter`: its answer.
pub fn rent_sleep(renter: &Path, offer: &str, image: &str, sleep: &str) -> Value {
    json(
        renter,
        &[
            "rent",
            offer,
            "--seconds",
            "60",
            "--detach",
            "--image",
            image,
            "--",
            "sleep",
            sleep,
        ],
    )
}

/// Waits until both sides settled lease `id`; the settled total (micro-units), the same on
/// both sides and above 0.
pub fn wait_settled(renter: &Path, provider: &Path, id: &str) -> u64 {
    wait_for(Duration::from_secs(90), "the lease to settle", || {
        lease_of(renter, id)["state"] == "settled" && lease_of(provider, id)["state"] == "settled"
    });
    let settled = lease_of(provider, id)["settled_total"].as_u64().unwrap();
    assert!(settled > 0);
    assert_eq!(
        lease_of(renter, id)["settled_total"].as_u64(),
        Some(settled)
    );
    settled
}
