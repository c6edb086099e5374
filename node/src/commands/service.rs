//! `gridlease service install|uninstall|status`: the node as a systemd service (a user unit by
//! default, a system unit with `--system`); `gridlease completions SHELL` and `gridlease man`:
//! shell completions and man pages generated from the CLI definition (clap_complete,
//! clap_mangen), so they never drift from the commands.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command as Process;

use anyhow::Context as _;
use clap::{Args, CommandFactory, Subcommand, ValueEnum};
use serde::Serialize;

use crate::output::Printer;

/// The unit's file name.
pub const UNIT_NAME: &str = "gridlease.service";

/// Arguments of `gridlease service`.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: ServiceAction,
}

/// `gridlease service` actions.
#[derive(Debug, Subcommand)]
pub enum ServiceAction {
    /// Write the unit (and, where systemd runs, enable and start it).
    Install(UnitArgs),
    /// Stop, disable and remove the unit.
    Uninstall(UnitArgs),
    /// Whether the unit is installed (and, where systemd runs, active).
    Status(UnitArgs),
}

/// Where the unit lives and how systemd is told.
#[derive(Debug, Args)]
pub struct UnitArgs {
    /// A system unit (/etc/systemd/system, run as root) instead of a user unit
    /// (~/.config/systemd/user).
    #[arg(long)]
    pub system: bool,
    /// Write into this directory instead (packaging, tests); systemd is not told.
    #[arg(long, value_name = "DIR")]
    pub unit_dir: Option<PathBuf>,
    /// Write or remove the unit only: do not run systemctl.
    #[arg(long)]
    pub no_systemctl: bool,
}

/// What `service` did or found.
#[derive(Debug, Serialize)]
pub struct ServiceView {
    /// The unit file.
    pub unit: String,
    /// Whether the file exists now.
    pub installed: bool,
    /// `systemctl is-active` where systemd was asked (`None`: not asked).
    pub active: Option<String>,
    /// What was done, in words.
    pub done: String,
}

/// The unit's text: `exe --home HOME node`, restarted on failure (at most 5 times in 5
/// minutes), stopped with SIGTERM (the node leaves running containers for its restart and
/// waits for its lease service), its open files raised for many peers and leases.
pub fn unit_text(exe: &Path, home: &Path, system: bool) -> String {
    let (after, wanted_by) = if system {
        ("network-online.target docker.service", "multi-user.target")
    } else {
        ("network-online.target", "default.target")
    };
    format!(
        "# Written by `gridlease service install`; `gridlease service uninstall` removes it.\n\
         [Unit]\n\
         Description=gridlease node (peer-to-peer GPU market)\n\
         Wants=network-online.target\n\
         After={after}\n\
         StartLimitIntervalSec=300\n\
         StartLimitBurst=5\n\
         \n\
         [Service]\n\
         Type=simple\n\
         ExecStart={exe} --home {home} node\n\
         Restart=on-failure\n\
         RestartSec=5\n\
         KillSignal=SIGTERM\n\
         TimeoutStopSec=60\n\
         LimitNOFILE=65536\n\
         Environment=RUST_LOG=info\n\
         \n\
         [Install]\n\
         WantedBy={wanted_by}\n",
        exe = quote(exe),
        home = quote(home),
    )
}

/// A path as one systemd command-line word (quoted when it has spaces or quotes).
fn quote(p: &Path) -> String {
    let s = p.display().to_string();
    if s.chars()
        .any(|c| c.is_whitespace() || c == '"' || c == '\\' || c == '\'')
    {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        s
    }
}

fn unit_dir(a: &UnitArgs) -> anyhow::Result<PathBuf> {
    if let Some(d) = &a.unit_dir {
        return Ok(d.clone());
    }
    if a.system {
        return Ok(PathBuf::from("/etc/systemd/system"));
    }
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .context("neither XDG_CONFIG_HOME nor HOME is set: pass --unit-dir")?;
    Ok(config.join("systemd").join("user"))
}

/// Whether systemctl should be run: not asked otherwise, and systemd runs on this machine.
fn use_systemctl(a: &UnitArgs) -> bool {
    !a.no_systemctl && a.unit_dir.is_none() && Path::new("/run/systemd/system").exists()
}

fn systemctl(a: &UnitArgs, args: &[&str]) -> anyhow::Result<String> {
    let mut c = Process::new("systemctl");
    if !a.system {
        c.arg("--user");
    }
    let out = c.args(args).output().context("cannot run systemctl")?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() && args[0] != "is-active" {
        anyhow::bail!(
            "systemctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(text)
}

/// Runs `gridlease service ...` for the node home `home`.
pub fn run(out: &Printer, home: &Path, args: &ServiceArgs) -> anyhow::Result<u8> {
    let (a, action) = match &args.action {
        ServiceAction::Install(a) => (a, "install"),
        ServiceAction::Uninstall(a) => (a, "uninstall"),
        ServiceAction::Status(a) => (a, "status"),
    };
    let dir = unit_dir(a)?;
    let path = dir.join(UNIT_NAME);
    let systemd = use_systemctl(a);
    let done = match action {
        "install" => {
            let exe = std::env::current_exe()
                .and_then(|e| e.canonicalize())
                .context("cannot find this program's path")?;
            // The service would fail at once without an identity: say so now.
            crate::home::Home::open(home)?;
            let home = home
                .canonicalize()
                .with_context(|| format!("cannot resolve {}", home.display()))?;
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            write_atomic(&path, unit_text(&exe, &home, a.system).as_bytes())?;
            if systemd {
                systemctl(a, &["daemon-reload"])?;
                systemctl(a, &["enable", "--now", UNIT_NAME])?;
                format!("installed, enabled and started {}", path.display())
            } else {
                let user = if a.system { "" } else { "--user " };
                format!(
                    "wrote {}; start it with `systemctl {user}daemon-reload && systemctl {user}enable --now {UNIT_NAME}`",
                    path.display()
                )
            }
        }
        "uninstall" => {
            if systemd && path.exists() {
                systemctl(a, &["disable", "--now", UNIT_NAME])?;
            }
            let existed = match std::fs::remove_file(&path) {
                Ok(()) => true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot remove {}", path.display()));
                }
            };
            if systemd && existed {
                systemctl(a, &["daemon-reload"])?;
            }
            if existed {
                format!("removed {}", path.display())
            } else {
                format!("{} was not installed", path.display())
            }
        }
        _ => {
            if path.exists() {
                format!("installed: {}", path.display())
            } else {
                format!("not installed ({} does not exist)", path.display())
            }
        }
    };
    let active = if systemd && path.exists() {
        systemctl(a, &["is-active", UNIT_NAME]).ok()
    } else {
        None
    };
    let view = ServiceView {
        unit: path.display().to_string(),
        installed: path.exists(),
        active,
        done,
    };
    out.emit(&view, |p| {
        p.line(&view.done);
        if let Some(a) = &view.active {
            p.line(&format!("systemd says: {a}"));
        }
    });
    Ok(0)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("service.tmp");
    let mut f =
        std::fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Shells `gridlease completions` writes for.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Shell {
    /// bash (source it, or put it in /etc/bash_completion.d/gridlease).
    Bash,
    /// zsh (put it on $fpath as _gridlease).
    Zsh,
    /// fish (~/.config/fish/completions/gridlease.fish).
    Fish,
    /// elvish.
    Elvish,
    /// PowerShell.
    Powershell,
}

/// Arguments of `gridlease completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Prints the completion script for a shell.
pub fn completions(args: &CompletionsArgs) -> anyhow::Result<u8> {
    use clap_complete::Shell as S;
    let shell = match args.shell {
        Shell::Bash => S::Bash,
        Shell::Zsh => S::Zsh,
        Shell::Fish => S::Fish,
        Shell::Elvish => S::Elvish,
        Shell::Powershell => S::PowerShell,
    };
    let mut cmd = super::Cli::command();
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut cmd, "gridlease", &mut buf);
    write_stdout(&buf)
}

/// Arguments of `gridlease man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write gridlease.1 and one page per command (gridlease-rent.1, ...) into this directory
    /// instead of printing gridlease.1.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// Prints the man page, or writes all of them into a directory.
pub fn man(out: &Printer, args: &ManArgs) -> anyhow::Result<u8> {
    let cmd = super::Cli::command();
    let Some(dir) = &args.out else {
        let mut buf = Vec::new();
        clap_mangen::Man::new(cmd).render(&mut buf)?;
        return write_stdout(&buf);
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    clap_mangen::generate_to(cmd, dir)
        .with_context(|| format!("cannot write the man pages into {}", dir.display()))?;
    out.line(&format!("wrote the man pages into {}", dir.display()));
    Ok(0)
}

fn write_stdout(bytes: &[u8]) -> anyhow::Result<u8> {
    let mut o = std::io::stdout().lock();
    match o.write_all(bytes).and_then(|()| o.flush()) {
        Ok(()) => Ok(0),
        // A closed pipe (`| head`) is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_runs_this_binary_on_this_home_and_restarts_on_failure() {
        let u = unit_text(
            Path::new("/usr/local/bin/gridlease"),
            Path::new("/home/a b/.gridlease"),
            false,
        );
        assert!(
            u.contains("ExecStart=/usr/local/bin/gridlease --home \"/home/a b/.gridlease\" node\n"),
            "{u}"
        );
        for line in [
            "Restart=on-failure\n",
            "KillSignal=SIGTERM\n",
            "WantedBy=default.target\n",
            "LimitNOFILE=65536\n",
        ] {
            assert!(u.contains(line), "{line}: {u}");
        }
        let s = unit_text(Path::new("/g"), Path::new("/var/lib/gridlease"), true);
        assert!(
            s.contains("After=network-online.target docker.service\n"),
            "{s}"
        );
        assert!(s.contains("WantedBy=multi-user.target\n"), "{s}");
    }
}
