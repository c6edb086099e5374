//! `gridlease shell`, `gridlease exec` and `gridlease forward`: interactive access to a running
//! lease this node rents. Each talks to the local daemon with an HTTP upgrade on the control
//! socket (`/v1/leases/{id}/exec`, `/v1/leases/{id}/forward/{port}`); the daemon carries the
//! bytes over a libp2p stream to the provider (see `crate::access`).
//!
//! Exit codes: `shell` and `exec` exit with the remote command's exit code (0..=255; a
//! signal's 128+N as the shell reports it); 4 when the provider refused (the reason is
//! printed), 3 when no node runs, 1 when the connection was lost before the command ended.

use std::io::{IsTerminal, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use gridlease_protocol::access::{ExecInput, ExecOutput, MAX_EXEC_CHUNK, MAX_EXEC_FRAME, TermSize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use crate::access::frames;
use crate::api::client::{ApiClient, ClientError};
use crate::api::types::ExecBody;
use crate::output::Printer;

/// Exit code when the connection to the command was lost before it ended.
pub const EXIT_LOST: u8 = 1;

/// Arguments of `gridlease shell`.
#[derive(Debug, Args)]
pub struct ShellArgs {
    /// Lease id (or a unique prefix).
    #[arg(value_name = "LEASE")]
    pub lease: String,
    /// Program to run on the terminal instead of the container's shell (after `--`).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Arguments of `gridlease exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Lease id (or a unique prefix).
    #[arg(value_name = "LEASE")]
    pub lease: String,
    /// Environment variable for the command (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Command and arguments (after `--`).
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Arguments of `gridlease forward`.
#[derive(Debug, Args)]
pub struct ForwardArgs {
    /// Lease id (or a unique prefix).
    #[arg(value_name = "LEASE")]
    pub lease: String,
    /// Ports: `REMOTE` (listen on the same local port) or `LOCAL:REMOTE`; local 0 picks a
    /// free port.
    #[arg(required = true, value_name = "[LOCAL:]REMOTE")]
    pub ports: Vec<PortSpec>,
    /// Local address to listen on.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST), value_name = "ADDR")]
    pub bind: IpAddr,
}

/// A forwarded port: where to listen locally, which container port to reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortSpec {
    /// Local port (0: any free one).
    pub local: u16,
    /// Port inside the container.
    pub remote: u16,
}

impl std::str::FromStr for PortSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let port = |p: &str| {
            p.parse::<u16>()
                .map_err(|_| format!("{p:?} is not a port (0-65535)"))
        };
        let (local, remote) = match s.split_once(':') {
            Some((l, r)) => (port(l)?, port(r)?),
            None => {
                let p = port(s)?;
                (p, p)
            }
        };
        if remote == 0 {
            return Err("the container port cannot be 0".into());
        }
        Ok(Self { local, remote })
    }
}

/// `gridlease shell LEASE [-- CMD..]`.
pub async fn run_shell(api: &ApiClient, _out: &Printer, a: &ShellArgs) -> anyhow::Result<u8> {
    let interactive = std::io::stdin().is_terminal();
    let size = terminal_size();
    let body = ExecBody {
        argv: a.command.clone(),
        env: vec![format!(
            "TERM={}",
            std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into())
        )],
        tty: Some(size),
    };
    let io = api
        .upgrade(&format!("/v1/leases/{}/exec", a.lease), &body)
        .await?;
    // Raw mode from here to the end: keys (Ctrl-C, Ctrl-D too) go to the remote terminal.
    let _raw = interactive.then(RawMode::enable).transpose()?;
    exec_session(io, true).await
}

/// `gridlease exec LEASE [-e K=V].. -- CMD ARGS..`.
pub async fn run_exec(api: &ApiClient, _out: &Printer, a: &ExecArgs) -> anyhow::Result<u8> {
    let body = ExecBody {
        argv: a.command.clone(),
        env: a.env.clone(),
        tty: None,
    };
    let io = api
        .upgrade(&format!("/v1/leases/{}/exec", a.lease), &body)
        .await?;
    exec_session(io, false).await
}

/// The terminal's size, or 80x24 when there is none.
fn terminal_size() -> TermSize {
    match crossterm::terminal::size() {
        Ok((cols, rows)) if cols > 0 && rows > 0 => TermSize { cols, rows },
        _ => TermSize { cols: 80, rows: 24 },
    }
}

/// Puts the terminal in raw mode; restores it when dropped.
struct RawMode;

impl RawMode {
    fn enable() -> anyhow::Result<Self> {
        crossterm::terminal::enable_raw_mode().context("cannot put the terminal in raw mode")?;
        Ok(Self)
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

/// Reads stdin on a thread of its own (a blocked read must not hold the runtime at exit),
/// in chunks, into a small bounded channel: a slow remote holds stdin back.
fn stdin_chunks() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(4);
    let spawned = std::thread::Builder::new()
        .name("gl-stdin".into())
        .spawn(move || {
            use std::io::Read;
            let mut stdin = std::io::stdin().lock();
            let mut buf = vec![0u8; MAX_EXEC_CHUNK];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.blocking_send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
    if spawned.is_err() {
        // No thread: the command sees an empty stdin.
        let (_, rx) = mpsc::channel(1);
        return rx;
    }
    rx
}

/// Runs an exec session on the upgraded connection: stdin (and, on a terminal, resizes) go
/// out as frames, output frames come back to stdout/stderr, the remote exit code is returned.
async fn exec_session<S>(io: S, tty: bool) -> anyhow::Result<u8>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let mut input = stdin_chunks();
    let sender = tokio::spawn(async move {
        let mut winch = if tty {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok()
        } else {
            None
        };
        loop {
            let next = tokio::select! {
                chunk = input.recv() => match chunk {
                    Some(bytes) => ExecInput::Stdin(bytes),
                    None => ExecInput::Eof,
                },
                Some(()) = async {
                    match winch.as_mut() {
                        Some(w) => w.recv().await,
                        None => std::future::pending().await,
                    }
                } => ExecInput::Resize(terminal_size()),
            };
            let end = next == ExecInput::Eof;
            if frames::send::<_, MAX_EXEC_FRAME, _>(&mut wr, &next)
                .await
                .is_err()
                || end
            {
                break;
            }
        }
        // Keep the write half open after EOF (the output may still be coming); dropping it
        // would not close the connection anyway while the read half lives.
        std::future::pending::<()>().await;
    });
    let mut stdout = std::io::stdout();
    let mut stderr = std::io::stderr();
    let result = loop {
        match frames::read::<ExecOutput, MAX_EXEC_FRAME, _>(&mut rd).await {
            Ok(Some(ExecOutput::Stdout(b))) => {
                stdout.write_all(&b)?;
                stdout.flush()?;
            }
            Ok(Some(ExecOutput::Stderr(b))) => {
                stderr.write_all(&b)?;
                stderr.flush()?;
            }
            Ok(Some(ExecOutput::Exit(code))) => break Ok(exit_code(code)),
            Ok(Some(ExecOutput::Error(m))) => break Err(anyhow::anyhow!("remote command: {m}")),
            Ok(None) => {
                break Err(anyhow::anyhow!(
                    "the connection to the provider was lost before the command ended"
                ));
            }
            Err(e) => break Err(anyhow::anyhow!("the connection to the provider broke: {e}")),
        }
    };
    sender.abort();
    result
}

/// A remote exit code as this process's (0..=255).
fn exit_code(code: i64) -> u8 {
    u8::try_from(code.rem_euclid(256)).unwrap_or(1)
}

/// One listening forward: the node listens (`POST /v1/leases/{id}/listen/{port}`) while this
/// holds the connection that asked; dropping it stops the listener.
pub struct Forwarder {
    /// Where it listens.
    pub local: SocketAddr,
    /// The container port.
    pub remote: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Asks the node to listen on `bind:spec.local` and forward every connection to
/// `spec.remote` in `lease` until dropped. Problems with single connections, which the node
/// reports, are printed to stderr, prefixed with the port.
pub async fn start_forward(
    api: &ApiClient,
    lease: &str,
    bind: IpAddr,
    spec: PortSpec,
) -> anyhow::Result<Forwarder> {
    use tokio::io::AsyncBufReadExt;
    let path = format!("/v1/leases/{lease}/listen/{}", spec.remote);
    let body = crate::api::types::ListenBody {
        address: bind,
        port: spec.local,
    };
    let io = api.upgrade(&path, &body).await?;
    let mut lines = tokio::io::BufReader::new(io).lines();
    let first = lines
        .next_line()
        .await
        .context("the node did not say where it listens")?
        .unwrap_or_default();
    let local: SocketAddr = first
        .strip_prefix("listening ")
        .and_then(|a| a.parse().ok())
        .with_context(|| format!("the node answered {first:?} instead of where it listens"))?;
    let task = tokio::spawn(async move {
        // Held open (and read) for the listener's life: each line is a connection that failed.
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = writeln!(std::io::stderr(), "{line}");
        }
    });
    Ok(Forwarder {
        local,
        remote: spec.remote,
        task,
    })
}

/// `gridlease forward LEASE [LOCAL:]REMOTE..`: forwards until Ctrl-C or the lease ends.
pub async fn run_forward(api: &ApiClient, out: &Printer, a: &ForwardArgs) -> anyhow::Result<u8> {
    // The lease must exist here before anything listens.
    let view = api.lease(&a.lease).await?;
    let id = view.lease_id.to_string();
    let mut open = Vec::new();
    for spec in &a.ports {
        let f = start_forward(api, &id, a.bind, *spec).await?;
        out.line(&format!(
            "forwarding {} -> port {} of lease {} (Ctrl-C to stop)",
            f.local,
            f.remote,
            view.lease_id.short()
        ));
        open.push(f);
    }
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(0),
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
        match api.lease(&id).await {
            Ok(v) if v.is_terminal() => {
                out.line(&format!(
                    "lease {} is {}: forwarding stopped",
                    v.lease_id.short(),
                    v.state.as_str()
                ));
                return Ok(0);
            }
            Ok(_) => {}
            Err(e @ ClientError::NoNode { .. }) => return Err(e.into()),
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_specs_parse_and_refuse_nonsense() {
        assert_eq!(
            "8888".parse::<PortSpec>(),
            Ok(PortSpec {
                local: 8888,
                remote: 8888
            })
        );
        assert_eq!(
            "0:80".parse::<PortSpec>(),
            Ok(PortSpec {
                local: 0,
                remote: 80
            })
        );
        assert!("80:0".parse::<PortSpec>().is_err());
        assert!("http".parse::<PortSpec>().is_err());
        assert!("70000".parse::<PortSpec>().is_err());
    }

    #[test]
    fn exit_codes_fit_a_byte() {
        assert_eq!(exit_code(3), 3);
        assert_eq!(exit_code(130), 130);
        assert_eq!(exit_code(256), 0);
        assert_eq!(exit_code(-1), 255);
    }
}
