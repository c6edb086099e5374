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

/// The unit name of the default home (`~/.gridlease`) and of any home named `gridlease`.
pub const UNIT_NAME: &str = "gridlease.service";

/// The unit's first lines name the home it runs (`# gridlease home: PATH`), so a second home
/// never takes over another's unit.
const HOME_MARK: &str = "# gridlease home: ";

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
    /// Write the unit and the home's config.toml with the node settings given (and, where
    /// systemd runs, enable and start it).
    ///
    /// Every `gridlease node` flag is accepted here and kept in <home>/config.toml, so the
    /// service runs with exactly what was given; the unit only names the binary and the home.
    Install(Box<InstallArgs>),
    /// Stop, disable and remove the unit.
    Uninstall(UnitArgs),
    /// Whether the unit is installed (and, where systemd runs, active).
    Status(UnitArgs),
}

/// Arguments of `service install`.
#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Where the unit goes.
    #[command(flatten)]
    pub unit: UnitArgs,
    /// The node's settings, as `gridlease node` takes them: written into the home's
    /// config.toml (over what it already holds, key by key).
    #[command(flatten)]
    pub settings: crate::config::Overrides,
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
    /// The unit's name (without `.service`). Default: `gridlease` for a home named
    /// `gridlease` or `.gridlease`, else `gridlease-<the home's directory name>`.
    #[arg(long, value_name = "NAME", value_parser = unit_stem)]
    pub name: Option<String>,
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
    /// The configuration file the service reads (install: written).
    pub config: Option<String>,
    /// What was done, in words.
    pub done: String,
    /// What the user still has to do, in words (install of a user unit: lingering).
    pub next: Vec<String>,
}

/// A unit name's stem: letters, digits, `-`, `_`, `.`, `@`-free, at most 200 bytes.
fn unit_stem(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 200
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(s.strip_suffix(".service").unwrap_or(s).to_string())
    } else {
        Err(format!(
            "{s:?} is not a unit name (letters, digits, '-', '_' and '.', not first)"
        ))
    }
}

/// The unit file name for `home` (canonical): `gridlease.service` for a home named
/// `gridlease` or `.gridlease`, else `gridlease-<name>.service` with the name's other
/// characters as `-`.
pub fn unit_name_for(home: &Path) -> String {
    let base = home
        .file_name()
        .map(|n| n.to_string_lossy().trim_start_matches('.').to_string())
        .unwrap_or_default();
    if base.is_empty() || base == "gridlease" {
        return UNIT_NAME.to_string();
    }
    let clean: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("gridlease-{clean}.service")
}

/// The home a unit file written by `service install` runs (its `# gridlease home:` line).
pub fn home_of_unit(text: &str) -> Option<PathBuf> {
    text.lines()
        .find_map(|l| l.strip_prefix(HOME_MARK))
        .map(PathBuf::from)
}

/// The unit's text: `exe --home HOME node` (the node reads `HOME/config.toml`), after Docker
/// (and wanting it), restarted on failure (at most 5 times in 5 minutes), stopped with
/// SIGTERM (the node leaves running containers for its restart and waits for its lease
/// service), its open files raised for many peers and leases.
pub fn unit_text(exe: &Path, home: &Path, system: bool) -> String {
    let wanted_by = if system {
        "multi-user.target"
    } else {
        "default.target"
    };
    format!(
        "# Written by `gridlease service install`; `gridlease service uninstall` removes it.\n\
         # The node's settings are in the home's config.toml, not here.\n\
         {HOME_MARK}{home_line}\n\
         [Unit]\n\
         Description=gridlease node (peer-to-peer GPU market) for {home_line}\n\
         Wants=network-online.target docker.service\n\
         After=network-online.target docker.service\n\
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
        home_line = home.display(),
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

/// The home as the unit names it (canonical when it exists).
fn canonical_home(home: &Path) -> PathBuf {
    home.canonicalize().unwrap_or_else(|_| home.to_path_buf())
}

/// Writes `settings` into the configuration file `path` key by key over what it holds
/// (comments and other keys kept), after checking that the node would accept the result.
/// Returns the keys written.
pub fn write_settings(
    path: &Path,
    settings: &crate::config::Overrides,
) -> anyhow::Result<Vec<String>> {
    let old = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let mut doc: toml_edit::DocumentMut = old
        .parse()
        .with_context(|| format!("{} is not valid TOML", path.display()))?;
    let mut flags = settings.clone();
    if flags.no_mdns {
        flags.mdns = Some(false);
        flags.no_mdns = false;
    }
    let given: toml_edit::DocumentMut = toml::to_string(&flags)
        .context("cannot render the settings")?
        .parse()
        .context("cannot render the settings")?;
    let mut keys = Vec::new();
    for (k, item) in given.iter() {
        doc[k] = item.clone();
        keys.push(k.to_string());
    }
    let text = doc.to_string();
    crate::config::Config::resolve(
        Some((&path.display().to_string(), &text)),
        &crate::config::Overrides::default(),
    )
    .with_context(|| format!("the settings given would make {} invalid", path.display()))?;
    if text != old {
        write_atomic(path, text.as_bytes())?;
    }
    Ok(keys)
}

/// Runs `gridlease service ...` for the node home `home`.
pub fn run(out: &Printer, home: &Path, args: &ServiceArgs) -> anyhow::Result<u8> {
    let a = match &args.action {
        ServiceAction::Install(i) => &i.unit,
        ServiceAction::Uninstall(a) | ServiceAction::Status(a) => a,
    };
    let dir = unit_dir(a)?;
    let home_abs = canonical_home(home);
    let name = match &a.name {
        Some(n) => format!("{n}.service"),
        None => unit_name_for(&home_abs),
    };
    let path = dir.join(&name);
    let systemd = use_systemctl(a);
    // Another home's unit of this name is never touched.
    if let Ok(existing) = std::fs::read_to_string(&path) {
        let theirs = home_of_unit(&existing);
        if theirs.as_deref() != Some(home_abs.as_path()) {
            let whose = theirs.map_or_else(
                || "a unit gridlease did not write".to_string(),
                |h| format!("the unit of the home {}", h.display()),
            );
            anyhow::bail!(
                "{} is {whose}, not of {}: pick another name for this home's unit with --name",
                path.display(),
                home_abs.display()
            );
        }
    }
    let mut config = None;
    let mut next = Vec::new();
    let done = match &args.action {
        ServiceAction::Install(i) => {
            let exe = std::env::current_exe()
                .and_then(|e| e.canonicalize())
                .context("cannot find this program's path")?;
            // The service would fail at once without an identity: say so now.
            crate::home::Home::open(home)?;
            let home = home
                .canonicalize()
                .with_context(|| format!("cannot resolve {}", home.display()))?;
            let config_path = home.join(crate::config::CONFIG_FILE);
            let keys = write_settings(&config_path, &i.settings)?;
            config = Some(config_path.display().to_string());
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            write_atomic(&path, unit_text(&exe, &home, a.system).as_bytes())?;
            let settings = if keys.is_empty() {
                String::new()
            } else {
                format!(" ({} set in {})", keys.join(", "), config_path.display())
            };
            if !a.system {
                next.extend(linger_advice());
            }
            if systemd {
                systemctl(a, &["daemon-reload"])?;
                systemctl(a, &["enable", "--now", &name])?;
                format!(
                    "installed, enabled and started {}{settings}",
                    path.display()
                )
            } else {
                let user = if a.system { "" } else { "--user " };
                format!(
                    "wrote {}{settings}; start it with `systemctl {user}daemon-reload && systemctl {user}enable --now {name}`",
                    path.display()
                )
            }
        }
        ServiceAction::Uninstall(_) => {
            if systemd && path.exists() {
                systemctl(a, &["disable", "--now", &name])?;
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
        ServiceAction::Status(_) => {
            if path.exists() {
                format!("installed: {}", path.display())
            } else {
                format!("not installed ({} does not exist)", path.display())
            }
        }
    };
    let active = if systemd && path.exists() {
        systemctl(a, &["is-active", &name]).ok()
    } else {
        None
    };
    let view = ServiceView {
        unit: path.display().to_string(),
        installed: path.exists(),
        active,
        config,
        done,
        next,
    };
    out.emit(&view, |p| {
        p.line(&view.done);
        if let Some(a) = &view.active {
            p.line(&format!("systemd says: {a}"));
        }
        for n in &view.next {
            p.line(n);
        }
    });
    Ok(0)
}

/// A user unit runs only while its user is logged in, unless lingering is on: the command
/// that turns it on, when it is off (`/var/lib/systemd/linger/<user>` absent).
fn linger_advice() -> Option<String> {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "$USER".into());
    if Path::new("/var/lib/systemd/linger").join(&user).exists() {
        return None;
    }
    Some(format!(
        "a user unit stops when {user} logs out: keep it running with `sudo loginctl enable-linger {user}` (or install a system unit with --system)"
    ))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
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
        for line in [
            "After=network-online.target docker.service\n",
            "Wants=network-online.target docker.service\n",
            "WantedBy=multi-user.target\n",
        ] {
            assert!(s.contains(line), "{line}: {s}");
        }
        assert_eq!(
            home_of_unit(&s).as_deref(),
            Some(Path::new("/var/lib/gridlease"))
        );
    }

    #[test]
    fn one_unit_name_per_home() {
        for (home, name) in [
            ("/home/a/.gridlease", "gridlease.service"),
            ("/var/lib/gridlease", "gridlease.service"),
            ("/srv/p1", "gridlease-p1.service"),
            ("/srv/my farm", "gridlease-my-farm.service"),
            ("/srv/.lab", "gridlease-lab.service"),
        ] {
            assert_eq!(unit_name_for(Path::new(home)), name, "{home}");
        }
        assert!(unit_stem("farm-2").is_ok());
        assert_eq!(unit_stem("farm.service").unwrap(), "farm");
        for bad in ["", ".x", "a/b", "a b", "x@y"] {
            assert!(unit_stem(bad).is_err(), "{bad:?}");
        }
    }
}
