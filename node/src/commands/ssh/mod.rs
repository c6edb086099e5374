//! OpenSSH on a lease (issue 45): `gridlease ssh-config`, `gridlease ssh` and
//! `gridlease ssh-proxy`. The user's own `ssh`, `scp`, `sftp`, `rsync -e ssh`, `ssh -L` and
//! VS Code Remote-SSH reach a running lease's container through a `Host gl-<lease>` entry
//! whose `ProxyCommand` is `gridlease ssh-proxy --fdpass LEASE`: it opens the node's SSH
//! server for the lease on the control socket and hands ssh that connection
//! (`ProxyUseFdpass`); the node maps each SSH channel onto one of the lease's access streams
//! ([`crate::access::ssh`]). No sshd in the image, no key to upload, no port open anywhere, no
//! host key prompt ([`config`]).

pub mod config;

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use gridlease_protocol::LeaseId;

use crate::api::client::ApiClient;
use crate::lease::LeaseView;
use crate::output::Printer;
use crate::store::Role;

/// Arguments of `gridlease ssh-config`.
#[derive(Debug, Args)]
pub struct SshConfigArgs {
    /// Leases to add or update (ids or unique prefixes); none: every running lease this node
    /// rents, and entries of other leases are dropped.
    #[arg(value_name = "LEASE")]
    pub leases: Vec<String>,
    /// Print the entries instead of writing any file.
    #[arg(long)]
    pub print: bool,
    /// Do not add the `Include` line to ~/.ssh/config (use `ssh -F <home>/ssh/config`).
    #[arg(long)]
    pub no_include: bool,
}

/// Arguments of `gridlease ssh`.
#[derive(Debug, Args)]
pub struct SshArgs {
    /// Lease id (or a unique prefix).
    #[arg(value_name = "LEASE")]
    pub lease: String,
    /// Command to run instead of a shell (after `--`); it runs under `/bin/sh -c`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Arguments of `gridlease ssh-proxy` (run by OpenSSH as a `ProxyCommand`).
#[derive(Debug, Args)]
pub struct SshProxyArgs {
    /// Lease id (or a unique prefix).
    #[arg(value_name = "LEASE")]
    pub lease: String,
    /// Hand ssh the node's connection and exit (stdout must be the socket OpenSSH's
    /// `ProxyUseFdpass yes` gives); without it, copy the connection to stdin and stdout.
    #[arg(long)]
    pub fdpass: bool,
}

/// The user's `~/.ssh/config`.
fn user_ssh_config() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os(crate::env_vars::HOME)
        .context("HOME is not set: cannot find ~/.ssh/config (use --no-include)")?;
    Ok(PathBuf::from(home).join(".ssh").join("config"))
}

/// The running gridlease binary and the node's home, both absolute (they go into the config).
fn exe_and_home(api: &ApiClient) -> anyhow::Result<(PathBuf, PathBuf)> {
    let exe = std::env::current_exe().context("cannot find the gridlease binary's path")?;
    let home = std::path::absolute(api.home())
        .with_context(|| format!("cannot make {} absolute", api.home().display()))?;
    Ok((exe, home))
}

/// A lease this node rents and that is not over: the one ssh may reach.
fn reachable(view: &LeaseView) -> anyhow::Result<LeaseId> {
    let short = view.lease_id.short();
    anyhow::ensure!(
        view.role == Role::Renter,
        "this node provides lease {short}: ssh reaches a lease from the node that rents it"
    );
    anyhow::ensure!(
        !view.is_terminal(),
        "lease {short} is not running (it is {}): ssh reaches a lease only while it runs",
        view.state.as_str()
    );
    Ok(view.lease_id)
}

/// `gridlease ssh-config [LEASE..] [--print] [--no-include]`.
pub async fn run_ssh_config(
    api: &ApiClient,
    out: &Printer,
    a: &SshConfigArgs,
) -> anyhow::Result<u8> {
    let (exe, home) = exe_and_home(api)?;
    let mut leases = BTreeSet::new();
    if a.leases.is_empty() {
        for v in api.leases().await? {
            if v.role == Role::Renter && !v.is_terminal() {
                leases.insert(v.lease_id);
            }
        }
    } else {
        for l in &a.leases {
            leases.insert(reachable(&api.lease(l).await?)?);
        }
    }
    if a.print {
        for (i, lease) in leases.iter().enumerate() {
            if i > 0 {
                out.line("");
            }
            out.line(config::entry(&exe, &home, lease)?.trim_end());
        }
        return Ok(0);
    }
    if !a.leases.is_empty() {
        leases.extend(config::listed(&home));
    }
    config::write(&exe, &home, &leases)?;
    let path = config::config_path(&home);
    let mut done = format!("{} SSH host(s) in {}", leases.len(), path.display());
    if !a.no_include {
        let user = user_ssh_config()?;
        if config::ensure_include(&user, &home)? {
            done.push_str(&format!("; added `Include` to {}", user.display()));
        }
    }
    out.line(&done);
    for lease in &leases {
        out.line(&format!("  ssh {}", config::alias(lease)));
    }
    if leases.is_empty() {
        out.line("no running lease rented by this node (rent one, then run this again)");
    }
    Ok(0)
}

/// `gridlease ssh LEASE [-- CMD..]`: the system `ssh` with the lease's entry (written first),
/// as this process (its exit code is ssh's: the command's, or 255 for ssh's own failures).
pub async fn run_ssh(api: &ApiClient, _out: &Printer, a: &SshArgs) -> anyhow::Result<u8> {
    let (exe, home) = exe_and_home(api)?;
    let lease = reachable(&api.lease(&a.lease).await?)?;
    let mut leases = config::listed(&home);
    leases.insert(lease);
    config::write(&exe, &home, &leases)?;
    let err = std::process::Command::new("ssh")
        .arg("-F")
        .arg(config::config_path(&home))
        .arg(config::alias(&lease))
        .args(&a.command)
        .exec();
    Err(if err.kind() == std::io::ErrorKind::NotFound {
        anyhow::anyhow!(
            "the OpenSSH client `ssh` is not installed (Debian: apt install openssh-client)"
        )
    } else {
        anyhow::anyhow!("cannot run ssh: {err}")
    })
}

/// `gridlease ssh-proxy [--fdpass] LEASE`: opens the node's SSH server for the lease (`POST
/// /v1/leases/{id}/ssh`), then hands ssh that connection (`--fdpass`: ssh speaks to the node
/// directly, this process exits) or copies it to stdin and stdout. Refuses before any SSH byte
/// when the lease is not one this node rents or is over, so `ssh` prints the reason at once.
pub async fn run_ssh_proxy(api: &ApiClient, a: &SshProxyArgs) -> anyhow::Result<u8> {
    let lease = reachable(&api.lease(&a.lease).await?)?;
    let path = format!("/v1/leases/{lease}/ssh");
    if a.fdpass {
        let socket = api.upgrade_socket(&path, &()).await?.into_std()?;
        pass_fd(&socket)?;
        return Ok(0);
    }
    let mut node = api.upgrade(&path, &()).await?;
    let mut io = stdio()?;
    // Either side's end ends the session (ssh closes its pipes; the node closes the socket).
    let _ = crate::access::splice(&mut io, &mut node).await;
    Ok(0)
}

/// Sends `socket` to ssh over stdout, as `ProxyUseFdpass` expects: one byte with the
/// descriptor attached (`SCM_RIGHTS`).
fn pass_fd(socket: &std::os::unix::net::UnixStream) -> anyhow::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    use std::os::fd::AsFd;
    // ssh uses the descriptor as it would a socket it connected itself: blocking.
    socket.set_nonblocking(false)?;
    let fds = [socket.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    anyhow::ensure!(
        control.push(SendAncillaryMessage::ScmRights(&fds)),
        "no room for the descriptor"
    );
    let stdout = std::io::stdout();
    sendmsg(
        stdout.as_fd(),
        &[std::io::IoSlice::new(&[0])],
        &mut control,
        SendFlags::empty(),
    )
    .map_err(|e| {
        anyhow::anyhow!(
            "cannot hand the connection to ssh ({e}): --fdpass needs `ProxyUseFdpass yes` (run `gridlease ssh-config` again)"
        )
    })?;
    Ok(())
}

/// This process's stdin and stdout as one async stream: non-blocking pipes when they are
/// pipes (what OpenSSH gives a ProxyCommand), tokio's blocking-thread stdio otherwise.
fn stdio()
-> anyhow::Result<impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    let dup = |fd: std::os::fd::BorrowedFd<'_>| -> anyhow::Result<std::fs::File> {
        Ok(std::fs::File::from(
            fd.try_clone_to_owned().context("dup stdio")?,
        ))
    };
    let reader: Box<dyn tokio::io::AsyncRead + Unpin + Send> =
        match pipe::Receiver::from_file(dup(std::io::stdin().as_fd())?) {
            Ok(r) => Box::new(r),
            Err(_) => Box::new(tokio::io::stdin()),
        };
    let writer: Box<dyn tokio::io::AsyncWrite + Unpin + Send> =
        match pipe::Sender::from_file(dup(std::io::stdout().as_fd())?) {
            Ok(w) => Box::new(w),
            Err(_) => Box::new(tokio::io::stdout()),
        };
    Ok(tokio::io::join(reader, writer))
}
