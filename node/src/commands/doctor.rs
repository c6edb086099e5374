//! `gridlease doctor`: checks what a provider's machine needs before the first renter arrives
//! and says, for each item, ok / warn / fail and one line on how to fix it. The node runs the
//! local checks at start ([`local_checks`]) and logs what is not ok.
//!
//! Exit code: 0 when every check is ok (or skipped: not applicable here), 1 with warnings,
//! 2 with failures.

use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use crate::api::client::ApiClient;
use crate::config::Config;
use crate::output::Printer;

/// Arguments of `gridlease doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The configuration file the node reads, if not `<home>/config.toml` (as `node --config`).
    #[arg(long, value_name = "FILE", env = crate::env_vars::GRIDLEASE_CONFIG)]
    pub config: Option<PathBuf>,
}

/// How one check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Fine.
    Ok,
    /// Not applicable on this machine or configuration (not counted).
    Skip,
    /// Works, but something a provider should know or fix.
    Warn,
    /// Leases will fail (or the node will not start) until it is fixed.
    Fail,
}

impl Level {
    fn word(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Skip => "skip",
            Self::Warn => "warn",
            Self::Fail => "fail",
        }
    }
}

/// One check's result.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What was checked (`docker`, `disk-quota`, ...).
    pub item: &'static str,
    /// How it came out.
    pub level: Level,
    /// What was found, in words.
    pub detail: String,
    /// How to fix it (empty when ok).
    pub fix: String,
}

impl Check {
    fn ok(item: &'static str, detail: impl Into<String>) -> Self {
        Self {
            item,
            level: Level::Ok,
            detail: detail.into(),
            fix: String::new(),
        }
    }

    fn bad(
        item: &'static str,
        level: Level,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            item,
            level,
            detail: detail.into(),
            fix: fix.into(),
        }
    }
}

/// What `doctor --json` prints.
#[derive(Debug, Serialize)]
pub struct DoctorView {
    /// Every check, in order.
    pub checks: Vec<Check>,
    /// The worst level found (`skip` counts as ok).
    pub worst: Level,
}

/// The exit code for the worst level: 0 ok, 1 warn, 2 fail.
pub fn exit_code(worst: Level) -> u8 {
    match worst {
        Level::Ok | Level::Skip => 0,
        Level::Warn => 1,
        Level::Fail => 2,
    }
}

const DOCKER_FIX: &str = "install Docker (`apt install docker.io`), start it (`systemctl start docker`), and run gridlease as root or as a member of the docker group; DOCKER_HOST, when set, must name the daemon's socket";

/// The checks that need no running node: Docker, disk quotas, cgroups, the NVIDIA driver and
/// container toolkit, the configured runtime, free disk, the clock, the listen ports (when
/// `ports` is true: not while the node itself holds them) and the home's permissions.
pub async fn local_checks(home: &Path, config: &Config, ports: bool) -> Vec<Check> {
    let mut out = Vec::new();
    let mut daemon = None;
    let info = match gridlease_sandbox::docker::connect().await {
        Err(e) => {
            out.push(Check::bad(
                "docker",
                Level::Fail,
                format!("{e:#}"),
                DOCKER_FIX,
            ));
            None
        }
        Ok(docker) => match (docker.version().await, docker.info().await) {
            (Ok(v), Ok(info)) => {
                let api = docker.client_version();
                out.push(Check::ok(
                    "docker",
                    format!(
                        "Docker {} at {}, API {}.{} (the daemon's highest: {})",
                        v.version.unwrap_or_default(),
                        gridlease_sandbox::docker::docker_host(),
                        api.major_version,
                        api.minor_version,
                        v.api_version.unwrap_or_default()
                    ),
                ));
                daemon = Some(docker);
                Some(info)
            }
            (Err(e), _) | (_, Err(e)) => {
                out.push(Check::bad("docker", Level::Fail, e.to_string(), DOCKER_FIX));
                None
            }
        },
    };
    out.push(disk_quota(home, info.as_ref()).await);
    out.push(cgroups(info.as_ref()));
    out.extend(nvidia(info.as_ref(), daemon).await);
    out.push(runtime(config, info.as_ref()));
    out.push(free_disk(home, config));
    out.push(clock());
    if ports {
        out.push(listen_ports(config));
    }
    out.push(home_permissions(home));
    out
}

async fn disk_quota(home: &Path, info: Option<&bollard::models::SystemInfo>) -> Check {
    let driver = info
        .and_then(|i| i.driver.clone())
        .unwrap_or_else(|| "unknown".into());
    // A directory of its own in the home (the filesystem the node's workspaces use), removed
    // after: nothing the node makes later is created here by another user (`sudo doctor`).
    let dir = home.join(format!(".doctor-{}", std::process::id()));
    let tried = gridlease_sandbox::workspace::probe_quota(&dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    match tried {
        Ok(()) => Check::ok(
            "disk-quota",
            format!(
                "storage driver {driver}; each lease's /workspace is a quota'd ext4 image on a loop device (a 4 MiB test image was made in the home, attached and removed)"
            ),
        ),
        Err(e) => Check::bad(
            "disk-quota",
            Level::Fail,
            format!("storage driver {driver}; a test workspace image failed: {e}"),
            "run the node as root (or with CAP_SYS_ADMIN and access to /dev/loop-control and /dev/loop*), with e2fsprogs and util-linux installed (`apt install e2fsprogs util-linux`)",
        ),
    }
}

fn cgroups(info: Option<&bollard::models::SystemInfo>) -> Check {
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let version = info
        .and_then(|i| i.cgroup_version.as_ref())
        .map(|v| format!("v{}", format!("{v:?}").trim_start_matches('_')))
        .unwrap_or_else(|| if v2 { "v2".into() } else { "v1".into() });
    let mut missing = Vec::new();
    if let Some(i) = info {
        if i.memory_limit == Some(false) {
            missing.push("memory");
        }
        if i.pids_limit == Some(false) {
            missing.push("pids");
        }
    } else if v2 {
        let c = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default();
        for want in ["memory", "pids"] {
            if !c.split_whitespace().any(|x| x == want) {
                missing.push(want);
            }
        }
    } else {
        for want in ["memory", "pids"] {
            if !Path::new("/sys/fs/cgroup").join(want).exists() {
                missing.push(want);
            }
        }
    }
    if missing.is_empty() {
        Check::ok(
            "cgroups",
            format!("cgroup {version}, memory and pids accounting on"),
        )
    } else {
        Check::bad(
            "cgroups",
            Level::Fail,
            format!(
                "cgroup {version} without {} accounting: tenants' limits cannot be enforced",
                missing.join(" and ")
            ),
            "enable the controllers on the kernel command line (`cgroup_enable=memory swapaccount=1`, or `systemd.unified_cgroup_hierarchy=1` for cgroup v2) and reboot",
        )
    }
}

async fn nvidia(
    info: Option<&bollard::models::SystemInfo>,
    daemon: Option<bollard::Docker>,
) -> Vec<Check> {
    let gpus = gridlease_sandbox::gpu::NvmlProbe::new()
        .and_then(|p| gridlease_sandbox::gpu::GpuProbe::list(&p));
    let driver = match &gpus {
        Ok(g) if !g.is_empty() => Check::ok(
            "nvidia-driver",
            format!(
                "NVML lists {} GPU(s): {}",
                g.len(),
                g.iter()
                    .map(|x| x.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        Ok(_) => Check::bad(
            "nvidia-driver",
            Level::Warn,
            "the NVIDIA driver answers but lists no GPU",
            "check `nvidia-smi`; only declared GPUs (--dev-gpus, labelled as such) can be offered",
        ),
        Err(e) => Check::bad(
            "nvidia-driver",
            Level::Warn,
            format!("no NVIDIA driver (NVML): {e}"),
            "install the NVIDIA driver (`apt install nvidia-driver`, non-free) and check `nvidia-smi`; until then only declared GPUs (--dev-gpus) can be offered",
        ),
    };
    let has_gpu = matches!(&gpus, Ok(g) if !g.is_empty());
    let runtimes = info.and_then(|i| i.runtimes.clone()).unwrap_or_default();
    let cdi = info
        .and_then(|i| i.cdi_spec_dirs.clone())
        .is_some_and(|d| !d.is_empty());
    let toolkit_bin = [
        "nvidia-container-runtime-hook",
        "nvidia-ctk",
        "nvidia-container-cli",
    ]
    .iter()
    .find(|b| on_path(b));
    let toolkit = match (runtimes.contains_key("nvidia") || cdi, toolkit_bin) {
        (_, Some(b)) => Check::ok(
            "nvidia-toolkit",
            format!("the NVIDIA container toolkit is installed ({b})"),
        ),
        (true, None) => Check::ok("nvidia-toolkit", "Docker has the nvidia runtime"),
        (false, None) => Check::bad(
            "nvidia-toolkit",
            if has_gpu { Level::Fail } else { Level::Warn },
            "the NVIDIA container toolkit is not installed: containers cannot get GPUs (`--gpus`)",
            "install nvidia-container-toolkit (NVIDIA's apt repository), then `nvidia-ctk runtime configure --runtime=docker && systemctl restart docker`",
        ),
    };
    let mut checks = vec![driver];
    // With GPUs and the toolkit, a container given them the way a lease is (the probe image,
    // made locally, never pulled) must see their device nodes.
    match (&gpus, toolkit.level, daemon) {
        (Ok(g), Level::Ok, Some(docker)) if !g.is_empty() => {
            let uuids: Vec<String> = g.iter().map(|x| x.uuid.clone()).collect();
            checks.push(gpu_container(docker, &uuids).await);
        }
        _ => checks.push(toolkit),
    }
    checks
}

/// A probe container given `uuids` as a lease is: it must see an `nvidiaN` device.
async fn gpu_container(docker: bollard::Docker, uuids: &[String]) -> Check {
    let sb = gridlease_sandbox::runtime::Sandbox::new(docker);
    let is_gpu = |d: &String| {
        d.strip_prefix("nvidia")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    match gridlease_sandbox::isolation::check_gpu_container(&sb, uuids).await {
        Ok(devices) if devices.iter().any(is_gpu) => Check::ok(
            "nvidia-toolkit",
            format!(
                "a test container given the GPUs sees {}",
                devices.join(", ")
            ),
        ),
        Ok(devices) => Check::bad(
            "nvidia-toolkit",
            Level::Fail,
            format!(
                "a test container given the GPUs sees no GPU device ({})",
                if devices.is_empty() {
                    "none".to_string()
                } else {
                    devices.join(", ")
                }
            ),
            "check the toolkit's Docker configuration: `nvidia-ctk runtime configure --runtime=docker`, then `systemctl restart docker`",
        ),
        Err(e) => Check::bad(
            "nvidia-toolkit",
            Level::Fail,
            format!("a test container given the GPUs failed: {e}"),
            "check that `docker run --rm --gpus all debian nvidia-smi -L` works; reinstall or reconfigure nvidia-container-toolkit",
        ),
    }
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
        || ["/usr/bin", "/usr/sbin", "/usr/local/bin"]
            .iter()
            .any(|d| Path::new(d).join(name).is_file())
}

fn runtime(config: &Config, info: Option<&bollard::models::SystemInfo>) -> Check {
    let Some(name) = config.runtime() else {
        return Check {
            item: "runtime",
            level: Level::Skip,
            detail: "isolation runc (Docker's default runtime): gVisor not configured".into(),
            fix: String::new(),
        };
    };
    let runtimes = info.and_then(|i| i.runtimes.clone()).unwrap_or_default();
    if runtimes.contains_key(&name) {
        Check::ok("runtime", format!("Docker has the runtime {name} (gVisor)"))
    } else {
        Check::bad(
            "runtime",
            Level::Fail,
            format!("isolation gvisor is configured but Docker has no runtime {name:?}"),
            format!(
                "install runsc (gVisor) and register it: {}",
                gridlease_sandbox::isolation::GVISOR_DAEMON_JSON
            ),
        )
    }
}

fn free_disk(home: &Path, config: &Config) -> Check {
    let reserve_gib = config.host_reserve().disk_gib.unwrap_or(0);
    let at = home.ancestors().find(|p| p.is_dir()).unwrap_or(home);
    match gridlease_sandbox::host::disk_space(at) {
        Err(e) => Check::bad(
            "free-disk",
            Level::Warn,
            e.to_string(),
            "check the home's filesystem",
        ),
        Ok(d) => {
            let free_gib = d.free_bytes / (1 << 30);
            let detail = format!(
                "{free_gib} GiB free at {}; {reserve_gib} GiB kept back (reserve_disk_gib plus lease_logs_gib)",
                at.display()
            );
            if free_gib > reserve_gib {
                Check::ok(
                    "free-disk",
                    format!("{detail}: {} GiB to offer", free_gib - reserve_gib),
                )
            } else {
                Check::bad(
                    "free-disk",
                    Level::Warn,
                    format!("{detail}: nothing left to offer renters' /workspace"),
                    "free disk space, or lower reserve_disk_gib in the config",
                )
            }
        }
    }
}

fn clock() -> Check {
    const FIX: &str = "enable time sync (`timedatectl set-ntp true`, or install chrony or systemd-timesyncd): leases, offers and receipts carry timestamps peers check";
    match gridlease_sandbox::host::kernel_clock_synced() {
        Some(true) => Check::ok("clock", "synchronised (the kernel's NTP state)"),
        Some(false) => Check::bad(
            "clock",
            Level::Warn,
            "not synchronised (the kernel's NTP state says so)",
            FIX,
        ),
        None => Check::bad(
            "clock",
            Level::Warn,
            "cannot tell whether the clock is synchronised (ntp_adjtime refused)",
            FIX,
        ),
    }
}

/// TCP and UDP ports of the listen addresses, each tried by binding it (what the node will do).
fn listen_ports(config: &Config) -> Check {
    use libp2p::multiaddr::Protocol;
    let mut taken = Vec::new();
    let mut tried = Vec::new();
    for a in &config.listen {
        let Ok(m) = a.parse::<libp2p::Multiaddr>() else {
            continue;
        };
        let mut ip = None;
        for p in m.iter() {
            match p {
                Protocol::Ip4(v) => ip = Some(std::net::IpAddr::V4(v)),
                Protocol::Ip6(v) => ip = Some(std::net::IpAddr::V6(v)),
                Protocol::Tcp(port) | Protocol::Udp(port) if port != 0 => {
                    let Some(ip) = ip else { continue };
                    let addr = std::net::SocketAddr::new(ip, port);
                    let free = if matches!(p, Protocol::Tcp(_)) {
                        std::net::TcpListener::bind(addr).is_ok()
                    } else {
                        std::net::UdpSocket::bind(addr).is_ok()
                    };
                    tried.push(a.clone());
                    if !free {
                        taken.push(a.clone());
                    }
                }
                _ => {}
            }
        }
    }
    if !taken.is_empty() {
        return Check::bad(
            "listen-ports",
            Level::Fail,
            format!("in use by another program: {}", taken.join(", ")),
            "stop what holds them, or pick other ports with `listen` in the config (--listen)",
        );
    }
    Check::ok(
        "listen-ports",
        if tried.is_empty() {
            "listen addresses use ephemeral ports".to_string()
        } else {
            format!("free: {}", tried.join(", "))
        },
    )
}

fn home_permissions(home: &Path) -> Check {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::metadata(home) else {
        return Check::bad(
            "home",
            Level::Fail,
            format!("{} does not exist", home.display()),
            format!("create it: `gridlease --home {} init`", home.display()),
        );
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Check::bad(
            "home",
            Level::Fail,
            format!(
                "{} is mode {mode:03o}: other users can read it (the node's key, its database and API socket are there)",
                home.display()
            ),
            format!("chmod 700 {}", home.display()),
        );
    }
    let key = home.join(crate::home::IDENTITY_FILE);
    match std::fs::metadata(&key) {
        Err(_) => Check::bad(
            "home",
            Level::Fail,
            format!("{} has no identity", home.display()),
            format!("`gridlease --home {} init`", home.display()),
        ),
        Ok(m) if m.permissions().mode() & 0o077 != 0 => Check::bad(
            "home",
            Level::Fail,
            format!(
                "{} is mode {:03o}: other users can read the node's key",
                key.display(),
                m.permissions().mode() & 0o777
            ),
            format!("chmod 600 {}", key.display()),
        ),
        Ok(_) => Check::ok(
            "home",
            format!("{} is mode {mode:03o}, the key 600", home.display()),
        ),
    }
}

/// What the running node says about reachability (AutoNAT, relays), or a skip when it does
/// not run.
async fn reachability(api: &ApiClient) -> Check {
    let Ok(s) = api.status().await else {
        return Check {
            item: "reachability",
            level: Level::Skip,
            detail: "the node is not running here: start it to check NAT reachability".into(),
            fix: String::new(),
        };
    };
    match s.nat_status.as_str() {
        "public" => Check::ok(
            "reachability",
            format!("reachable from outside at {}", s.reachable_addrs.join(", ")),
        ),
        "private" if !s.relays.is_empty() => Check::ok(
            "reachability",
            format!(
                "behind a NAT, reached through the relay(s) {}",
                s.relays.join(", ")
            ),
        ),
        "private" => Check::bad(
            "reachability",
            Level::Warn,
            "behind a NAT or firewall and no relay holds a reservation: renters may not reach this node",
            "forward the listen port on the router (or enable UPnP), or bootstrap to peers that serve as relays",
        ),
        other => Check::bad(
            "reachability",
            Level::Warn,
            format!(
                "not known yet (AutoNAT: {other}); listening on {}",
                s.listen_addrs.join(", ")
            ),
            "wait for peers to probe this node (a minute after connecting), then run doctor again",
        ),
    }
}

/// Runs `gridlease doctor`.
pub async fn run(
    home: &Path,
    api: &ApiClient,
    out: &Printer,
    args: &DoctorArgs,
) -> anyhow::Result<u8> {
    let overrides = crate::config::Overrides::default();
    let config = match &args.config {
        Some(f) => Config::load_file(f, true, &overrides)?,
        None => Config::load(home, &overrides)?,
    };
    let running = api.status().await.is_ok();
    // The node's own ports are in use by the node itself while it runs.
    let mut checks = local_checks(home, &config, !running).await;
    checks.push(reachability(api).await);
    let worst = checks.iter().map(|c| c.level).max().unwrap_or(Level::Ok);
    let view = DoctorView { checks, worst };
    out.emit(&view, |p| {
        for c in &view.checks {
            p.line(&format!(
                "{:<4}  {:<15} {}",
                c.level.word(),
                c.item,
                c.detail
            ));
            if !c.fix.is_empty() {
                p.line(&format!("      {:<15} fix: {}", "", c.fix));
            }
        }
    });
    Ok(exit_code(worst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_worst_level() {
        assert_eq!(exit_code(Level::Ok), 0);
        assert_eq!(exit_code(Level::Skip), 0);
        assert_eq!(exit_code(Level::Warn), 1);
        assert_eq!(exit_code(Level::Fail), 2);
        assert!(Level::Fail > Level::Warn && Level::Warn > Level::Skip && Level::Skip > Level::Ok);
    }
}
