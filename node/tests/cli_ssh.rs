//! OpenSSH tools on a lease (issue 45): two real `gridlease node` processes, the real Docker
//! daemon, and Debian's own OpenSSH client (`ssh`, `scp`, `sftp`) and `rsync`, reaching the
//! lease's container through `gridlease ssh-config` entries and `gridlease ssh-proxy`. The
//! image has no sshd: busybox, with the host's `rsync` and `bash` and the libraries they load
//! copied in ([`ToolsImage`]).
//!
//! - `ssh gl-X 'exit 7'` returns 7; a million bytes piped into `wc -c` are counted; stdin EOF
//!   reaches the command.
//! - A pty session in tmux: `stty size` follows a resize, Ctrl-C interrupts `sleep`.
//! - `scp -p` of a 64 MiB file both ways: checksums, mode and mtime kept.
//! - `sftp -b`: put, get, ls, rename, rm.
//! - `rsync -a -e ssh` of 1,000 small files both ways, then a second run that moves nothing.
//! - `ssh -L` to busybox httpd in the container: 32 parallel fetches.
//! - What VS Code Remote-SSH runs: `ssh gl-X 'bash -s' < script` (platform, `$HOME`, a
//!   server left running in the background, reached afterwards through `ssh -L`).
//! - Refusals: the provider's own node and a stranger's node are told why; the provider
//!   refuses a stranger's SFTP stream; after the lease ends, `ssh` fails at once saying the
//!   lease is not running.
//!
//! Need Docker, tmux, OpenSSH's client, rsync and busybox-static: with
//! `GRIDLEASE_REQUIRE_DOCKER=1` (`.ci/run` installs them) they fail when one is missing,
//! otherwise they skip with a note.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;
mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use cli_support::{
    ContainersGuard, Tmux, bin, busybox_market, cli, docker_required, http_get, json, lease_of,
    metric, running_lease, scrape, text, tmux_available, wait_for,
};
use sha2::Digest as _;

/// Whether `tool` runs (`-V`/`--version`); fails when Docker is required.
fn have(tool: &str, arg: &str, test: &str) -> bool {
    let ok = Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        assert!(
            !docker_required(),
            "{test}: GRIDLEASE_REQUIRE_DOCKER=1 but {tool} is not installed"
        );
        eprintln!("{test}: SKIPPED, {tool} is not installed");
    }
    ok
}

/// A from-scratch image: Debian's static busybox and its applets, plus the host's own `rsync`
/// and `bash` with every library `ldd` says they load (the image is self-contained: no
/// package manager, no sshd). Removed when dropped.
struct ToolsImage {
    tag: String,
}

/// The file at `path` (symlinks followed) and the libraries it loads, as `(path, bytes)`.
fn with_libraries(path: &str) -> Vec<(String, Vec<u8>)> {
    let out = Command::new("ldd").arg(path).output().unwrap();
    assert!(out.status.success(), "ldd {path}: {}", text(&out.stderr));
    let mut files = vec![(path.to_string(), std::fs::read(path).unwrap())];
    for line in text(&out.stdout).lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or `/lib64/ld-linux... (0x...)`
        let lib = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(lib) = lib.filter(|l| l.starts_with('/')) {
            files.push((lib.to_string(), std::fs::read(lib).unwrap()));
        }
    }
    files
}

impl ToolsImage {
    fn build_or_skip(test: &str) -> Option<Self> {
        for (tool, arg) in [
            ("ssh", "-V"),
            ("scp", "-h"),
            ("sftp", "-h"),
            ("rsync", "--version"),
        ] {
            if !have(tool, arg, test) {
                return None;
            }
        }
        let busybox = match std::fs::read("/bin/busybox") {
            Ok(b) => b,
            Err(e) => {
                assert!(!docker_required(), "{test}: /bin/busybox: {e}");
                eprintln!("{test}: SKIPPED, /bin/busybox is missing");
                return None;
            }
        };
        cli_support::probe_image_or_skip(test)?;
        let applets = Command::new("/bin/busybox").arg("--list").output().unwrap();
        let mut tar = tar::Builder::new(Vec::new());
        let mut dirs = std::collections::BTreeSet::new();
        let mut add = |tar: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]| {
            let rel = path.trim_start_matches('/');
            let mut parent = Path::new(rel).parent();
            let mut missing = Vec::new();
            while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
                if dirs.insert(p.to_path_buf()) {
                    missing.push(p.to_path_buf());
                }
                parent = p.parent();
            }
            for d in missing.into_iter().rev() {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                tar.append_data(&mut h, &d, &[][..]).unwrap();
            }
            let mut h = tar::Header::new_gnu();
            h.set_mode(mode);
            h.set_size(data.len() as u64);
            tar.append_data(&mut h, rel, data).unwrap();
        };
        add(&mut tar, "/bin/busybox", 0o755, &busybox);
        let mut files = std::collections::BTreeMap::new();
        for tool in ["/usr/bin/rsync", "/bin/bash"] {
            files.extend(with_libraries(tool));
        }
        for (path, bytes) in files {
            add(&mut tar, &path, 0o755, &bytes);
        }
        for applet in text(&applets.stdout).lines() {
            let applet = applet.trim();
            if applet.is_empty() || ["bash", "rsync", "busybox"].contains(&applet) {
                continue;
            }
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_mode(0o777);
            h.set_size(0);
            tar.append_link(&mut h, format!("bin/{applet}"), "busybox")
                .unwrap();
        }
        for (dir, mode) in [("tmp", 0o1777), ("workspace", 0o755)] {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(mode);
            h.set_size(0);
            tar.append_data(&mut h, dir, &[][..]).unwrap();
        }
        let rootfs = tar.into_inner().unwrap();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let tag = format!(
            "gridlease-test-tools-{}-{nanos}-{}:1",
            std::process::id(),
            test.replace('_', "-")
        );
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let sb = gridlease_sandbox::Sandbox::connect().await.unwrap();
            sb.import_image(&tag, rootfs, &["ENV PATH=/bin:/usr/bin", "CMD [\"sh\"]"])
                .await
                .unwrap();
        });
        Some(Self { tag })
    }
}

impl Drop for ToolsImage {
    fn drop(&mut self) {
        let Ok(rt) = tokio::runtime::Runtime::new() else {
            return;
        };
        rt.block_on(async {
            if let Ok(sb) = gridlease_sandbox::Sandbox::connect().await {
                let _ = sb
                    .docker()
                    .remove_image(
                        &self.tag,
                        None::<bollard::query_parameters::RemoveImageOptions>,
                        None,
                    )
                    .await;
            }
        });
    }
}

/// The SSH side of a test: the renter's home, a user home whose `.ssh/config` includes the
/// node's entries (`ssh-config` writes the Include there), and the host alias.
struct Ssh {
    config: PathBuf,
    host: String,
}

impl Ssh {
    /// `ssh-config` for the renter at `rh`, with `HOME` = `user_home`.
    fn configure(rh: &Path, user_home: &Path, lease: &str) -> Self {
        let out = bin()
            .arg("--home")
            .arg(rh)
            .args(["ssh-config"])
            .env("HOME", user_home)
            .output()
            .unwrap();
        assert!(out.status.success(), "ssh-config: {}", text(&out.stderr));
        let host = format!("gl-{}", &lease[..12]);
        assert!(text(&out.stdout).contains(&host), "{}", text(&out.stdout));
        // OpenSSH reads the passwd entry's ~/.ssh, not $HOME's: name the user config.
        Self {
            config: user_home.join(".ssh").join("config"),
            host,
        }
    }

    /// A command line (`ssh`, `scp`, `sftp`) that reads this config first.
    fn tool(&self, tool: &str) -> Command {
        let mut c = Command::new(tool);
        c.arg("-F").arg(&self.config);
        c
    }

    /// `ssh -F CONFIG HOST ARGS..` with `input` on stdin.
    fn ssh(&self, args: &[&str], input: &[u8]) -> Output {
        let mut child = self
            .tool("ssh")
            .arg(&self.host)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_vec();
        let feeder = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let out = child.wait_with_output().unwrap();
        feeder.join().unwrap();
        out
    }
}

fn sha256(path: &Path) -> String {
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

#[test]
fn ssh_exec_exit_codes_stdin_and_a_terminal() {
    let test = "cli_ssh_exec";
    if !tmux_available() {
        assert!(!docker_required(), "{test}: tmux is not installed");
        eprintln!("{test}: SKIPPED, tmux is not installed");
        return;
    }
    let Some(image) = ToolsImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("provider.log");
    let (m, id) = running_lease(dir.path(), &image.tag, &log, &[]);
    let _guard = ContainersGuard(m.provider_peer.clone());
    let rh = dir.path().join("renter");
    let user = dir.path().join("user");
    let s = Ssh::configure(&rh, &user, &id);

    // The entry asks for AES-GCM (AES-NI), and ssh-proxy offers it.
    let out = s.ssh(&["-v", "true"], b"");
    assert!(
        text(&out.stderr).contains("cipher: aes128-gcm@openssh.com"),
        "{}",
        text(&out.stderr)
    );
    // The exit code comes back.
    let out = s.ssh(&["exit 7"], b"");
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    // A million bytes on stdin, then EOF: all counted.
    let out = s.ssh(&["wc -c"], &vec![b'x'; 1_000_000]);
    assert_eq!(text(&out.stdout).trim(), "1000000", "{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    // stdout and stderr stay apart.
    let out = s.ssh(&["echo out; echo err >&2; exit 3"], b"");
    assert_eq!(
        (out.status.code(), text(&out.stdout), text(&out.stderr)),
        (Some(3), "out\n".to_string(), "err\n".to_string())
    );
    // Without `ProxyUseFdpass` (an entry written by an older gridlease, or typed by hand),
    // ssh-proxy copies the node's connection to its stdio: the same server answers.
    let proxy = format!(
        "ProxyCommand '{}' --home '{}' ssh-proxy {id}",
        assert_cmd::cargo::cargo_bin("gridlease").display(),
        rh.display()
    );
    let out = s.ssh(
        &[
            "-v",
            "-o",
            "ProxyUseFdpass=no",
            "-o",
            &proxy,
            "echo piped; exit 9",
        ],
        b"",
    );
    let said = text(&out.stderr);
    assert!(
        said.contains(&format!("ssh-proxy {id}")) && !said.contains("--fdpass"),
        "{said}"
    );
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(9), "piped\n".to_string()),
        "{}",
        text(&out.stderr)
    );

    // A terminal: ssh allocates a pty (tmux is one).
    let t = Tmux::start("ssh");
    t.run(&format!("ssh -F '{}' {}", s.config.display(), s.host));
    t.type_line("echo hel''lo-over-ssh; id -u");
    t.wait_until(Duration::from_secs(30), "the command's output", |screen| {
        let lines: Vec<&str> = screen.lines().map(str::trim).collect();
        lines.windows(2).any(|w| w == ["hello-over-ssh", "65534"])
    });
    t.type_line("stty size");
    t.wait_until(Duration::from_secs(10), "stty size 50 200", |s| {
        s.lines().any(|l| l.trim() == "50 200")
    });
    t.resize(120, 40);
    std::thread::sleep(Duration::from_millis(300));
    t.type_line("stty size");
    t.wait_until(Duration::from_secs(10), "stty size 40 120", |s| {
        s.lines().any(|l| l.trim() == "40 120")
    });
    t.type_line("sleep 100");
    wait_for(Duration::from_secs(20), "the sleep to run", || {
        let out = s.ssh(&["ps"], b"");
        text(&out.stdout)
            .lines()
            .any(|l| l.trim_end().ends_with("sleep 100"))
    });
    let pressed = Instant::now();
    t.send(&["C-c"]);
    t.type_line("echo slept-$?");
    t.wait_until(Duration::from_secs(10), "slept-130", |s| {
        s.lines().any(|l| l.trim() == "slept-130")
    });
    assert!(pressed.elapsed() < Duration::from_secs(10));
    t.type_line("exit 5");
    let (screen, status) = t.wait_exit(Duration::from_secs(20));
    assert_eq!(status, "5", "{screen}");
    drop(m);
}

/// A tree of `n` small files (distinct contents) under `root`, in 10 directories.
fn small_tree(root: &Path, n: usize) {
    for i in 0..n {
        let d = root.join(format!("d{}", i % 10));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(format!("f{i}.txt")),
            format!("file {i}\n").repeat(i % 7 + 1),
        )
        .unwrap();
    }
}

/// Every file under `root` with its contents, relative paths sorted.
fn tree_contents(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.strip_prefix(root).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// `rsync -a --stats -e 'ssh -F CONFIG' SRC DST`: the number of regular files it transferred.
fn rsync(s: &Ssh, src: &str, dst: &str) -> u64 {
    let out = Command::new("rsync")
        .args(["-a", "--stats", "-e"])
        .arg(format!("ssh -F '{}'", s.config.display()))
        .args([src, dst])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rsync {src} {dst}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let stats = text(&out.stdout);
    stats
        .lines()
        .find_map(|l| {
            l.strip_prefix("Number of regular files transferred: ")
                .map(|n| n.trim().replace(',', "").parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no transfer count in\n{stats}"))
}

/// `ssh -N -L 127.0.0.1:PORT:localhost:REMOTE HOST` in the background, once the port listens.
struct Tunnel(std::process::Child, u16);

impl Tunnel {
    fn open(s: &Ssh, remote: u16) -> Self {
        let port = common::free_port();
        let child = s
            .tool("ssh")
            .args(["-N", "-o", "ExitOnForwardFailure=yes", "-L"])
            .arg(format!("127.0.0.1:{port}:localhost:{remote}"))
            .arg(&s.host)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        wait_for(Duration::from_secs(20), "ssh -L to listen", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Self(child, port)
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn rsync_ssh_l_and_what_vscode_runs() {
    let test = "cli_ssh_rsync";
    let Some(image) = ToolsImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("provider.log");
    let (m, id) = running_lease(dir.path(), &image.tag, &log, &[]);
    let _guard = ContainersGuard(m.provider_peer.clone());
    let rh = dir.path().join("renter");
    let s = Ssh::configure(&rh, &dir.path().join("user"), &id);

    // rsync both ways over ssh (rsync --server runs in the container), then again: nothing.
    let src = dir.path().join("tree");
    small_tree(&src, 1000);
    let remote = format!("{}:/workspace/tree/", s.host);
    assert_eq!(rsync(&s, &format!("{}/", src.display()), &remote), 1000);
    assert_eq!(rsync(&s, &format!("{}/", src.display()), &remote), 0);
    let back = dir.path().join("back");
    assert_eq!(rsync(&s, &remote, &format!("{}/", back.display())), 1000);
    assert_eq!(rsync(&s, &remote, &format!("{}/", back.display())), 0);
    assert_eq!(tree_contents(&src), tree_contents(&back));

    // ssh -L to busybox httpd in the container: 32 fetches at once.
    let page: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("page.bin"), &page).unwrap();
    let out = s.ssh(
        &["mkdir -p /workspace/www && cat > /workspace/www/page.bin"],
        &page,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = s.ssh(&["httpd -p 127.0.0.1:8080 -h /workspace/www"], b"");
    assert!(out.status.success(), "httpd: {}", text(&out.stderr));
    let tunnel = Tunnel::open(&s, 8080);
    let port = tunnel.1;
    let fetches: Vec<_> = (0..32)
        .map(|_| std::thread::spawn(move || http_get(port, "/page.bin")))
        .collect();
    for f in fetches {
        assert!(f.join().unwrap() == page, "a fetch through ssh -L differs");
    }
    drop(tunnel);

    // What VS Code Remote-SSH does: a script on `bash -s` finds the platform and $HOME,
    // installs its server under $HOME and leaves it running in the background, printing
    // where it listens; the client then reaches it with a forward.
    let script = r#"
set -e
echo "platform=$(uname -sm)"
echo "home=$HOME"
mkdir -p "$HOME/.vscode-server/bin/test"
printf 'server-up\n' > "$HOME/.vscode-server/bin/test/index.html"
httpd -f -p 127.0.0.1:8123 -h "$HOME/.vscode-server/bin/test" > /tmp/server.log 2>&1 < /dev/null &
echo "pid=$!"
disown
for i in $(seq 1 50); do
  if wget -q -O /dev/null http://127.0.0.1:8123/index.html 2>/dev/null; then echo listeningOn=8123; exit 0; fi
  sleep 0.1
done
echo never-listened; cat /tmp/server.log; exit 1
"#;
    let out = s.ssh(&["bash -s"], script.as_bytes());
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(said.contains("platform=Linux x86_64"), "{said}");
    assert!(said.contains("home=/workspace\n"), "{said}");
    assert!(said.contains("listeningOn=8123"), "{said}");
    // The server outlived the ssh session that started it.
    let tunnel = Tunnel::open(&s, 8123);
    assert_eq!(http_get(tunnel.1, "/index.html"), b"server-up\n");
    drop(tunnel);
    drop(m);
}

/// What a stranger (an in-process node that holds no lease) is told when it asks `provider`
/// for an SFTP session on `lease`.
fn stranger_asks_sftp(provider_addr: &str, provider: &str, lease: &str) -> String {
    use gridlease_node::access::{OpenError, open_to};
    use gridlease_protocol::access::{AccessRefusal, AccessRequest};
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let root = tempfile::tempdir().unwrap();
        let n = common::start(root.path(), "stranger", common::config()).await;
        n.node
            .client
            .dial(provider_addr.parse().unwrap())
            .await
            .unwrap()
            .unwrap();
        let req = AccessRequest::Sftp {
            lease_id: lease.parse().unwrap(),
        };
        let told = match open_to(&n.node.client, provider.parse().unwrap(), req).await {
            Err(OpenError::Refused(r @ AccessRefusal::NotRenter)) => r.to_string(),
            Err(e) => panic!("a stranger got {e} instead of not-the-renter"),
            Ok(_) => panic!("a stranger was granted an SFTP session"),
        };
        common::stop(n).await;
        told
    })
}

#[test]
fn only_the_renter_gets_in_and_only_while_the_lease_runs() {
    let test = "cli_ssh_refusals";
    let Some(image) = ToolsImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("provider.log");
    let metrics = common::free_port();
    let m = busybox_market(
        dir.path(),
        &image.tag,
        &log,
        &["--metrics", &format!("127.0.0.1:{metrics}")],
    );
    let _guard = ContainersGuard(m.provider_peer.clone());
    let (ph, rh) = (dir.path().join("provider"), dir.path().join("renter"));
    let rented = json(
        &rh,
        &[
            "rent",
            &m.offer,
            "--seconds",
            "300",
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
    let s = Ssh::configure(&rh, &dir.path().join("user"), &id);
    let out = s.ssh(&["true"], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));

    // The provider's own node: told it provides the lease, before any SSH byte.
    let out = cli(&ph, &["ssh-proxy", &id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("this node provides lease"),
        "{}",
        text(&out.stderr)
    );
    let out = cli(&ph, &["ssh-config", &id]);
    assert!(!out.status.success());

    // A stranger's node, through ssh and ssh-proxy: the same entry, its own home.
    let sh = dir.path().join("stranger");
    let _stranger = cli_support::start(&sh, &[]);
    let theirs = dir.path().join("stranger.config");
    let ours = std::fs::read_to_string(rh.join("ssh").join("config")).unwrap();
    std::fs::write(
        &theirs,
        ours.replace(
            &format!("--home '{}'", rh.display()),
            &format!("--home '{}'", sh.display()),
        ),
    )
    .unwrap();
    let started = Instant::now();
    let out = Command::new("ssh")
        .arg("-F")
        .arg(&theirs)
        .args([&s.host, "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("no lease {id} on this node")),
        "{}",
        text(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    // A stranger asking the provider itself for an SFTP session is refused and logged.
    let addr = json(&ph, &["status"])["listen_addrs"][0]
        .as_str()
        .unwrap()
        .to_string();
    let told = stranger_asks_sftp(&addr, &m.provider_peer, &id);
    assert!(told.contains("not the lease's renter"), "{told}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged
            .lines()
            .any(|l| l.contains("access refused") && l.contains("kind=\"files\"")),
        "{logged}"
    );

    // Every SSH channel was one access stream, counted by kind.
    let counted = scrape(metrics);
    assert!(
        metric(
            &counted,
            "gridlease_access_streams_granted_total{kind=\"exec\"}"
        ) >= 1,
        "{counted}"
    );
    assert_eq!(
        metric(
            &counted,
            "gridlease_access_streams_refused_total{kind=\"files\"}"
        ),
        1,
        "{counted}"
    );

    // After the lease ends: ssh fails at once, saying why.
    let out = cli(&rh, &["stop", &id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for(Duration::from_secs(60), "the lease to settle", || {
        lease_of(&ph, &id)["state"] == "settled"
    });
    let started = Instant::now();
    let out = s.ssh(&["true"], b"");
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("is not running (it is settled)"),
        "{}",
        text(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let out = cli(&rh, &["ssh", &id, "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not running"),
        "{}",
        text(&out.stderr)
    );
    drop(m);
}

/// `stat`-like mode bits and mtime (seconds) of a local file.
fn mode_and_mtime(path: &Path) -> (u32, i64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap();
    (m.mode() & 0o7777, m.mtime())
}

#[test]
fn scp_and_sftp_through_the_providers_sftp_server() {
    let test = "cli_ssh_scp";
    let Some(image) = ToolsImage::build_or_skip(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("provider.log");
    let (m, id) = running_lease(dir.path(), &image.tag, &log, &[]);
    let _guard = ContainersGuard(m.provider_peer.clone());
    let rh = dir.path().join("renter");
    let s = Ssh::configure(&rh, &dir.path().join("user"), &id);

    // 64 MiB of varied bytes, mode 640, an mtime in 2020.
    let big = dir.path().join("big.bin");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let bytes: Vec<u8> = (0..64 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&big, &bytes).unwrap();
    drop(bytes);
    std::fs::set_permissions(&big, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    let touched = Command::new("touch")
        .args(["-m", "-d", "@1577836800"])
        .arg(&big)
        .status()
        .unwrap();
    assert!(touched.success());
    let want = sha256(&big);

    // Up, with -p: the container sees the same bytes, mode and mtime.
    let out = s
        .tool("scp")
        .args(["-p"])
        .arg(&big)
        .arg(format!("{}:/workspace/big.bin", s.host))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scp up: {}\n{}",
        text(&out.stderr),
        std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("sftp"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let out = s.ssh(
        &["sha256sum /workspace/big.bin; stat -c '%a %Y' /workspace/big.bin"],
        b"",
    );
    let said = text(&out.stdout);
    assert!(said.starts_with(&want), "{said}");
    assert!(said.contains("\n640 1577836800\n"), "{said}");

    // Down, with -p, into another name: the same bytes, mode and mtime here.
    let back = dir.path().join("back.bin");
    let out = s
        .tool("scp")
        .args(["-q", "-p"])
        .arg(format!("{}:big.bin", s.host))
        .arg(&back)
        .output()
        .unwrap();
    assert!(out.status.success(), "scp down: {}", text(&out.stderr));
    assert_eq!(sha256(&back), want);
    assert_eq!(mode_and_mtime(&back), (0o640, 1_577_836_800));

    // sftp -b: put, get, ls, rename, rm, mkdir, rmdir.
    std::fs::write(dir.path().join("note.txt"), b"a note\n").unwrap();
    let batch = dir.path().join("batch");
    std::fs::write(
        &batch,
        "cd /workspace\nput note.txt up.txt\nget up.txt got.txt\nls -l\nrename up.txt moved.txt\nls\nrm moved.txt\nmkdir d\nrmdir d\n",
    )
    .unwrap();
    let out = s
        .tool("sftp")
        .arg("-b")
        .arg(&batch)
        .arg(&s.host)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let said = text(&out.stdout);
    assert!(out.status.success(), "sftp: {said}{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(dir.path().join("got.txt")).unwrap(),
        b"a note\n"
    );
    assert!(
        said.contains("up.txt") && said.contains("moved.txt"),
        "{said}"
    );
    let out = s.ssh(&["ls -a /workspace"], b"");
    let listed = text(&out.stdout);
    assert!(
        !listed.contains("moved.txt") && !listed.contains("up.txt"),
        "{listed}"
    );
    assert!(listed.contains("big.bin"), "{listed}");

    // Outside /workspace: refused, saying why; nothing written.
    std::fs::write(&batch, "put note.txt /tmp/escape.txt\n").unwrap();
    let out = s
        .tool("sftp")
        .arg("-b")
        .arg(&batch)
        .arg(&s.host)
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(said.contains("Permission denied"), "{said}");
    let out = s.ssh(
        &["test -e /tmp/escape.txt && echo there || echo absent"],
        b"",
    );
    assert_eq!(text(&out.stdout).trim(), "absent");
    drop(m);
}
