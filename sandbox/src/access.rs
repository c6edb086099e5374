//! Interactive access into a running tenant container: commands through Docker's exec API
//! (on a PTY for a shell, with pipes otherwise) and TCP connections made *inside* the
//! container's network namespace.
//!
//! # Why connections are made in the container's namespace
//! A forwarded port is reached on the container's own loopback: the node opens a socket on a
//! short-lived thread that has entered the container's network namespace (`setns(2)` on
//! `/proc/<pid>/ns/net`), connects to `127.0.0.1:PORT`, and the thread ends (the socket keeps
//! the namespace it was made in). So a tenant needs no network at all (`--network none`
//! containers have only loopback), nothing on the host or the LAN is ever connected to (the
//! only address dialled is 127.0.0.1 inside the tenant's namespace, refused if that namespace
//! is the host's), no port is published, and no firewall rule is involved. A server bound to
//! 127.0.0.1 in the container (Jupyter's default) is reachable too. Entering a namespace needs
//! `CAP_SYS_ADMIN` (a node run as root, as the egress firewall needs too): [`can_enter_netns`]
//! tells the node whether to offer forwarding.

use std::fs::File;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::pin::Pin;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use futures_util::Stream;
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
use tokio::io::AsyncWrite;

use crate::runtime::{Sandbox, SandboxError, docker_err};

/// The shell `gridlease shell` runs when no command is given: bash if the image has it,
/// else sh.
pub const DEFAULT_SHELL: [&str; 3] = [
    "/bin/sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi",
];

/// A command to run in a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecSpec {
    /// Program and arguments (non-empty).
    pub argv: Vec<String>,
    /// `NAME=value` entries added to the container's environment.
    pub env: Vec<String>,
    /// Run on a PTY of this size (columns, rows); pipes otherwise.
    pub tty: Option<(u16, u16)>,
}

/// A started command: its output (stdout and stderr frames, or console bytes on a PTY) and
/// its stdin. Shut `input` down to close the command's stdin.
pub struct Exec {
    /// Docker's exec id (for [`Sandbox::resize_exec`] and [`Sandbox::exec_exit_code`]).
    pub id: String,
    /// What the command writes, in order.
    pub output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    /// The command's stdin.
    pub input: Pin<Box<dyn AsyncWrite + Send>>,
}

impl std::fmt::Debug for Exec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exec").field("id", &self.id).finish()
    }
}

/// A TCP connection into a container failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Nothing listens on the port (connection refused).
    #[error("nothing listens on port {0} in the container")]
    Refused(u16),
    /// The container is not running (no process to take the namespace from).
    #[error("the container is not running")]
    NotRunning,
    /// The container shares the node's own network namespace: refused, so the host's ports
    /// are never reachable this way.
    #[error("the container shares the host's network namespace; refusing to connect")]
    HostNamespace,
    /// This process may not enter another network namespace (needs `CAP_SYS_ADMIN`).
    #[error(
        "this node may not enter the container's network namespace (it needs CAP_SYS_ADMIN: run the provider node as root): {0}"
    )]
    NotPermitted(std::io::Error),
    /// Inspecting the container failed.
    #[error(transparent)]
    Docker(#[from] SandboxError),
    /// Anything else.
    #[error("connecting inside the container: {0}")]
    Io(std::io::Error),
}

/// The network namespace of a running container, held open: connections made through it
/// reach only that namespace, even if the container's process is gone and its pid reused.
#[derive(Debug)]
pub struct ContainerNetns {
    ns: File,
}

fn netns_inode(path: &str) -> std::io::Result<(u64, u64)> {
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

impl ContainerNetns {
    /// Opens the network namespace of process `pid` (a container's init), refusing the
    /// node's own namespace.
    pub fn of_pid(pid: u32) -> Result<Self, ConnectError> {
        let path = format!("/proc/{pid}/ns/net");
        let ns = File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ConnectError::NotRunning,
            _ => ConnectError::Io(e),
        })?;
        let theirs = ns.metadata().map_err(ConnectError::Io)?;
        let ours = netns_inode("/proc/self/ns/net").map_err(ConnectError::Io)?;
        if (theirs.dev(), theirs.ino()) == ours {
            return Err(ConnectError::HostNamespace);
        }
        Ok(Self { ns })
    }

    /// Connects to `127.0.0.1:port` inside the namespace, within `timeout`. Runs on its own
    /// short-lived thread (the only thread that ever enters the namespace).
    pub async fn connect(&self, port: u16, timeout: Duration) -> Result<TcpStream, ConnectError> {
        let ns = self.ns.try_clone().map_err(ConnectError::Io)?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("gl-netns-connect".into())
            .spawn(move || {
                let r = (|| {
                    move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network))
                        .map_err(|e| ConnectError::NotPermitted(e.into()))?;
                    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                    let s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| {
                        if e.kind() == std::io::ErrorKind::ConnectionRefused {
                            ConnectError::Refused(port)
                        } else {
                            ConnectError::Io(e)
                        }
                    })?;
                    s.set_nodelay(true).map_err(ConnectError::Io)?;
                    s.set_nonblocking(true).map_err(ConnectError::Io)?;
                    Ok(s)
                })();
                let _ = tx.send(r);
            })
            .map_err(ConnectError::Io)?;
        rx.await
            .map_err(|_| ConnectError::Io(std::io::Error::other("connect thread panicked")))?
    }
}

/// Whether this process may enter other network namespaces (tried on a throwaway thread by
/// entering its own): false for a node without `CAP_SYS_ADMIN`.
pub fn can_enter_netns() -> bool {
    std::thread::spawn(|| {
        File::open("/proc/self/ns/net")
            .and_then(|f| {
                move_into_link_name_space(f.as_fd(), Some(LinkNameSpaceType::Network))
                    .map_err(Into::into)
            })
            .is_ok()
    })
    .join()
    .unwrap_or(false)
}

impl Sandbox {
    /// Starts `spec` in the running container `container` (name or id), attached. The command
    /// runs with the container's user, limits, seccomp profile and capabilities.
    pub async fn exec(&self, container: &str, spec: &ExecSpec) -> Result<Exec, SandboxError> {
        let created = self
            .docker()
            .create_exec(
                container,
                CreateExecOptions::<String> {
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(spec.tty.is_some()),
                    env: (!spec.env.is_empty()).then(|| spec.env.clone()),
                    cmd: Some(spec.argv.clone()),
                    ..Default::default()
                },
            )
            .await
            .map_err(docker_err("create_exec", container))?;
        let started = self
            .docker()
            .start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: spec.tty.is_some(),
                    output_capacity: Some(64 * 1024),
                }),
            )
            .await
            .map_err(docker_err("start_exec", container))?;
        if let Some((cols, rows)) = spec.tty {
            // Best effort: a PTY that stays at the default size is still a PTY.
            if let Err(e) = self.resize_exec(&created.id, cols, rows).await {
                tracing::debug!(error = %e, "initial exec resize failed");
            }
        }
        match started {
            StartExecResults::Attached { output, input } => Ok(Exec {
                id: created.id,
                output,
                input,
            }),
            StartExecResults::Detached => Err(SandboxError::Unexpected {
                op: "start_exec",
                message: "the command was started detached".into(),
            }),
        }
    }

    /// Resizes the PTY of exec `id`.
    pub async fn resize_exec(&self, id: &str, cols: u16, rows: u16) -> Result<(), SandboxError> {
        self.docker()
            .resize_exec(
                id,
                ResizeExecOptions {
                    height: rows,
                    width: cols,
                },
            )
            .await
            .map_err(docker_err("resize_exec", id))
    }

    /// The exit code of exec `id` once it has ended (waits up to 5 s for Docker to record it
    /// after its output closed); `None` if it still runs or Docker reports none.
    pub async fn exec_exit_code(&self, id: &str) -> Result<Option<i64>, SandboxError> {
        for _ in 0..100 {
            let i = self
                .docker()
                .inspect_exec(id)
                .await
                .map_err(docker_err("inspect_exec", id))?;
            if i.running != Some(true) {
                return Ok(i.exit_code);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(None)
    }

    /// The network namespace of the running container `container`.
    pub async fn container_netns(&self, container: &str) -> Result<ContainerNetns, ConnectError> {
        let info = self.inspect(container).await?;
        let state = info.state.unwrap_or_default();
        let pid = state.pid.unwrap_or(0);
        if state.running != Some(true) || pid <= 0 {
            return Err(ConnectError::NotRunning);
        }
        let pid = u32::try_from(pid).map_err(|_| ConnectError::NotRunning)?;
        ContainerNetns::of_pid(pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_namespace_is_refused() {
        let me = std::process::id();
        assert!(matches!(
            ContainerNetns::of_pid(me),
            Err(ConnectError::HostNamespace)
        ));
    }

    #[test]
    fn a_process_that_is_gone_is_not_running() {
        assert!(matches!(
            ContainerNetns::of_pid(u32::MAX - 1),
            Err(ConnectError::NotRunning)
        ));
    }
}
