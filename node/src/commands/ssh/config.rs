//! The files `gridlease ssh-config` writes under the node's home, and the one line it adds to
//! the user's `~/.ssh/config`:
//!
//! - `<home>/ssh/config`: one `Host gl-<short lease id>` entry per lease, each with a
//!   `ProxyCommand` that runs `gridlease ssh-proxy LEASE` and a `HostKeyAlias`, so OpenSSH
//!   checks the lease's host key against `<home>/ssh/known_hosts` and never asks;
//! - `<home>/ssh/known_hosts`: one line per entry, the lease's host key ([`host_key`]);
//! - `<home>/ssh/host-key.seed`: the secret every lease's host key is derived from
//!   ([`crate::access::ssh`], where the node's SSH server presents them).
//!
//! Both files are regenerated whole from the set of leases they hold (entries are marked with
//! `# lease <id>` lines), written to a temporary file and renamed.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use gridlease_protocol::LeaseId;

use crate::access::ssh::make_dir;
pub use crate::access::ssh::{host_key, ssh_dir};

/// `<home>/ssh/config`.
pub fn config_path(home: &Path) -> PathBuf {
    ssh_dir(home).join("config")
}

/// `<home>/ssh/known_hosts`.
pub fn known_hosts_path(home: &Path) -> PathBuf {
    ssh_dir(home).join("known_hosts")
}

/// The host name of a lease in SSH: `gl-` and the lease's short id (what tables show).
pub fn alias(lease: &LeaseId) -> String {
    format!("gl-{}", lease.short())
}

/// The ciphers an entry asks for, in order: the SSH connection runs between `ssh` and its
/// own child, so the cheapest authenticated cipher wins (AES-GCM with AES-NI), ChaCha20 where
/// the other is missing.
pub const CIPHERS: &str =
    "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com";
/// The marker line before each entry.
const MARK: &str = "# lease ";

/// The known_hosts line of `lease`.
pub fn known_hosts_line(home: &Path, lease: &LeaseId) -> anyhow::Result<String> {
    let key = host_key(home, lease)?;
    let public = key
        .public_key()
        .to_openssh()
        .map_err(|e| anyhow::anyhow!("encoding a host key: {e}"))?;
    Ok(format!("{} {public}", alias(lease)))
}

/// `s` quoted for the POSIX shell OpenSSH runs a `ProxyCommand` with, and with `%` doubled
/// (ssh expands `%` tokens in that line first).
fn shell_arg(s: &str) -> String {
    let quoted = format!("'{}'", s.replace('\'', "'\\''"));
    quoted.replace('%', "%%")
}

/// A path for an ssh_config file value: double-quoted, `%` doubled.
fn config_path_arg(p: &Path) -> anyhow::Result<String> {
    let s = p
        .to_str()
        .with_context(|| format!("{} is not UTF-8; ssh_config cannot name it", p.display()))?;
    anyhow::ensure!(
        !s.contains('"') && !s.contains('\n'),
        "{} contains a quote or a newline; ssh_config cannot name it",
        p.display()
    );
    Ok(format!("\"{}\"", s.replace('%', "%%")))
}

/// The `Host` entry of `lease`: `exe` is the gridlease binary, `home` the node's home (both
/// absolute).
pub fn entry(exe: &Path, home: &Path, lease: &LeaseId) -> anyhow::Result<String> {
    let name = alias(lease);
    let exe_s = exe
        .to_str()
        .with_context(|| format!("{} is not UTF-8", exe.display()))?;
    let home_s = home
        .to_str()
        .with_context(|| format!("{} is not UTF-8", home.display()))?;
    let known = config_path_arg(&known_hosts_path(home))?;
    Ok(format!(
        "{MARK}{lease}\n\
         Host {name}\n\
         \x20   HostName {name}\n\
         \x20   HostKeyAlias {name}\n\
         \x20   ProxyCommand {} --home {} ssh-proxy --fdpass {lease}\n\
         \x20   ProxyUseFdpass yes\n\
         \x20   UserKnownHostsFile {known}\n\
         \x20   StrictHostKeyChecking yes\n\
         \x20   Ciphers {CIPHERS}\n\
         \x20   CheckHostIP no\n\
         \x20   PubkeyAuthentication no\n\
         \x20   PasswordAuthentication no\n\
         \x20   KbdInteractiveAuthentication no\n\
         \x20   GSSAPIAuthentication no\n\
         \x20   ForwardAgent no\n\
         \x20   ForwardX11 no\n\
         \x20   ControlMaster no\n\
         \x20   ControlPath none\n",
        shell_arg(exe_s),
        shell_arg(home_s),
    ))
}

/// The leases `<home>/ssh/config` holds now (its `# lease` lines).
pub fn listed(home: &Path) -> BTreeSet<LeaseId> {
    let Ok(text) = std::fs::read_to_string(config_path(home)) else {
        return BTreeSet::new();
    };
    text.lines()
        .filter_map(|l| l.strip_prefix(MARK))
        .filter_map(|id| id.trim().parse().ok())
        .collect()
}

/// Writes `<home>/ssh/config` and `<home>/ssh/known_hosts` holding exactly `leases`.
pub fn write(exe: &Path, home: &Path, leases: &BTreeSet<LeaseId>) -> anyhow::Result<()> {
    let mut config = format!(
        "# Written by `gridlease ssh-config` for the node at {}: regenerated, do not edit.\n\
         # One entry per lease; `ssh gl-<lease>` reaches its container through `gridlease ssh-proxy`.\n",
        home.display()
    );
    let mut known = String::new();
    for lease in leases {
        config.push('\n');
        config.push_str(&entry(exe, home, lease)?);
        known.push_str(&known_hosts_line(home, lease)?);
        known.push('\n');
    }
    let dir = ssh_dir(home);
    make_dir(&dir)?;
    replace(&known_hosts_path(home), known.as_bytes())?;
    replace(&config_path(home), config.as_bytes())
}

/// Adds `Include <home>/ssh/config` at the top of `user_config` (the user's
/// `~/.ssh/config`, made 0600 with its directory 0700 when missing) unless a line already
/// includes it. Returns whether it added the line. Never changes the user's own lines.
pub fn ensure_include(user_config: &Path, home: &Path) -> anyhow::Result<bool> {
    let ours = config_path_arg(&config_path(home))?;
    let line = format!("Include {ours}");
    let existing = match std::fs::read_to_string(user_config) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", user_config.display())),
    };
    let bare = ours.trim_matches('"');
    if existing.lines().any(|l| {
        let l = l.trim();
        l.split_whitespace()
            .next()
            .is_some_and(|k| k.eq_ignore_ascii_case("include"))
            && (l.contains(&ours) || l.contains(bare))
    }) {
        return Ok(false);
    }
    if let Some(dir) = user_config.parent() {
        make_dir(dir)?;
    }
    // An Include before the first Host block applies to every host; the user's own lines
    // follow unchanged.
    let text = format!(
        "# Added by `gridlease ssh-config`: the gl-* hosts of the gridlease node at {}.\n{line}\n\n{existing}",
        home.display()
    );
    let mode = std::fs::metadata(user_config)
        .map(|m| m.permissions().mode() & 0o777)
        .unwrap_or(0o600);
    replace_with_mode(user_config, text.as_bytes(), mode)?;
    Ok(true)
}

fn replace(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    replace_with_mode(path, bytes, 0o600)
}

/// Writes `path` whole through a temporary file in its directory and a rename.
fn replace_with_mode(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    tmp.persist(path)
        .map_err(|e| e.error)
        .with_context(|| format!("cannot replace {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::Digest;

    #[test]
    fn host_keys_are_per_lease_and_stable() {
        let home = tempfile::tempdir().unwrap();
        let a = LeaseId(Digest([1; 32]));
        let b = LeaseId(Digest([2; 32]));
        let ka = known_hosts_line(home.path(), &a).unwrap();
        assert_eq!(ka, known_hosts_line(home.path(), &a).unwrap());
        assert_ne!(ka, known_hosts_line(home.path(), &b).unwrap());
        assert!(
            ka.starts_with(&format!("gl-{} ssh-ed25519 ", a.short())),
            "{ka}"
        );
        let mode = std::fs::metadata(home.path().join("ssh").join(crate::access::ssh::SEED_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // Another home, another key for the same lease.
        let other = tempfile::tempdir().unwrap();
        assert_ne!(ka, known_hosts_line(other.path(), &a).unwrap());
    }

    #[test]
    fn entries_quote_for_the_shell_and_for_ssh_tokens() {
        assert_eq!(shell_arg("/a b/it's%"), "'/a b/it'\\''s%%'");
        let home = Path::new("/h o/me");
        let e = entry(
            Path::new("/usr/bin/gridlease"),
            home,
            &LeaseId(Digest([3; 32])),
        )
        .unwrap();
        assert!(e.contains(
            "ProxyCommand '/usr/bin/gridlease' --home '/h o/me' ssh-proxy --fdpass 0303"
        ));
        assert!(e.contains("ProxyUseFdpass yes"));
        assert!(e.contains("UserKnownHostsFile \"/h o/me/ssh/known_hosts\""));
        assert!(e.contains("StrictHostKeyChecking yes"));
    }

    #[test]
    fn the_include_is_added_once_above_the_users_lines() {
        let dir = tempfile::tempdir().unwrap();
        let user = dir.path().join("dot-ssh").join("config");
        let home = dir.path().join("gl");
        std::fs::create_dir_all(user.parent().unwrap()).unwrap();
        std::fs::write(&user, "Host box\n    User me\n").unwrap();
        assert!(ensure_include(&user, &home).unwrap());
        assert!(!ensure_include(&user, &home).unwrap());
        let text = std::fs::read_to_string(&user).unwrap();
        assert_eq!(text.matches("Include ").count(), 1);
        assert!(text.ends_with("Host box\n    User me\n"), "{text}");
        let include = text.lines().position(|l| l.starts_with("Include")).unwrap();
        let host = text
            .lines()
            .position(|l| l.starts_with("Host box"))
            .unwrap();
        assert!(include < host);
    }

    #[test]
    fn the_files_list_exactly_the_leases_written() {
        let home = tempfile::tempdir().unwrap();
        let exe = Path::new("/bin/gridlease");
        let set: BTreeSet<_> = [LeaseId(Digest([4; 32])), LeaseId(Digest([5; 32]))].into();
        write(exe, home.path(), &set).unwrap();
        assert_eq!(listed(home.path()), set);
        let known = std::fs::read_to_string(known_hosts_path(home.path())).unwrap();
        assert_eq!(known.lines().count(), 2);
        let one: BTreeSet<_> = [LeaseId(Digest([5; 32]))].into();
        write(exe, home.path(), &one).unwrap();
        assert_eq!(listed(home.path()), one);
    }
}
