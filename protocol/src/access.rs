//! Interactive access to a running lease (`/gridlease/access/3`): a shell, a command, or a
//! TCP connection to a port of the tenant's container, carried on a libp2p stream from the
//! renter's node to the provider's.
//!
//! Every stream opens with one [`AccessRequest`] frame (renter -> provider) answered by one
//! [`AccessReply`] frame. A frame is a 4-byte big-endian length, checked against the
//! direction's cap before the body is allocated, then a bincode body
//! ([`crate::codec`]). After [`AccessReply::Granted`]:
//!
//! | request            | then, renter -> provider        | provider -> renter                  |
//! |--------------------|---------------------------------|-------------------------------------|
//! | `Exec` (shell too) | [`ExecInput`] frames            | [`ExecOutput`] frames, `Exit` last   |
//! | `Forward`          | raw bytes (the TCP payload)     | raw bytes                            |
//! | `Sftp`             | SFTP v3 requests                | SFTP v3 replies                      |
//!
//! A forwarded connection's half-close travels as the stream's half-close. The provider
//! grants only the lease's renter (the peer whose key signed the lease), only while the
//! lease runs, and only what its offer allows ([`AccessPolicy`]).

use serde::{Deserialize, Serialize};

use crate::codec::{self, CodecError};
use crate::types::LeaseId;

/// The stream protocol name (version 3: a download says the most bytes it takes and is told
/// which entries were left out; version 2: transfers end with a BLAKE3 hash; see
/// [`crate::transfer`]).
pub const ACCESS_PROTOCOL: &str = "/gridlease/access/3";
/// Most arguments of one command.
pub const MAX_ARGS: usize = 256;
/// Most bytes of all arguments of one command together.
pub const MAX_ARGV_BYTES: usize = 32 * 1024;
/// Most environment variables set for one command.
pub const MAX_ENV: usize = 64;
/// Cap on the opening request frame's body.
pub const MAX_REQUEST_FRAME: usize = MAX_ARGV_BYTES + 16 * 1024;
/// Cap on the reply frame's body.
pub const MAX_REPLY_FRAME: usize = 1024;
/// Most bytes of stdin, stdout or stderr in one [`ExecInput`]/[`ExecOutput`] frame.
pub const MAX_EXEC_CHUNK: usize = 32 * 1024;
/// Cap on one exec data frame's body: a chunk plus the tag and length.
pub const MAX_EXEC_FRAME: usize = MAX_EXEC_CHUNK + 16;
/// Longest free-text message in a refusal or an exec error, bytes.
pub const MAX_MESSAGE: usize = 400;

/// Which kinds of access an offer allows. A provider may turn each off in its config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AccessPolicy {
    /// `gridlease shell`: an interactive terminal (a PTY) in the container.
    pub shell: bool,
    /// `gridlease exec`: a command with piped stdin, stdout and stderr.
    pub exec: bool,
    /// `gridlease forward`: TCP connections to ports inside the container.
    pub forward: bool,
}

impl AccessPolicy {
    /// Everything allowed (the default of a provider's config).
    pub const ALL: Self = Self {
        shell: true,
        exec: true,
        forward: true,
    };
    /// Nothing allowed.
    pub const NONE: Self = Self {
        shell: false,
        exec: false,
        forward: false,
    };

    /// Whether `kind` is allowed.
    pub fn allows(&self, kind: AccessKind) -> bool {
        match kind {
            AccessKind::Shell => self.shell,
            AccessKind::Exec => self.exec,
            AccessKind::Forward => self.forward,
            AccessKind::Files => true,
        }
    }

    /// The allowed kinds as people read them (`shell, exec, forward`, or `none`).
    pub fn describe(&self) -> String {
        let kinds: Vec<&str> = [AccessKind::Shell, AccessKind::Exec, AccessKind::Forward]
            .into_iter()
            .filter(|k| self.allows(*k))
            .map(AccessKind::name)
            .collect();
        if kinds.is_empty() {
            "none".into()
        } else {
            kinds.join(", ")
        }
    }
}

impl Default for AccessPolicy {
    fn default() -> Self {
        Self::ALL
    }
}

/// A kind of access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AccessKind {
    /// A command on a PTY.
    Shell,
    /// A command with pipes.
    Exec,
    /// A TCP connection into the container.
    Forward,
    /// Files into or out of the lease's `/workspace` (`gridlease cp`; always allowed to the
    /// lease's renter: the workspace is theirs).
    Files,
}

impl AccessKind {
    /// Lower-case name (`shell`, `exec`, `forward`), as in metrics and the config.
    pub fn name(self) -> &'static str {
        match self {
            Self::Shell => "shell",
            Self::Exec => "exec",
            Self::Forward => "forward",
            Self::Files => "files",
        }
    }
}

/// A terminal's size in character cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TermSize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// The first frame of an access stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessRequest {
    /// Run a command in the lease's container. With `tty` it runs on a PTY of that size
    /// (`gridlease shell`, stdout and stderr merged); without, its stdin, stdout and stderr are
    /// pipes (`gridlease exec`).
    Exec {
        /// The lease.
        lease_id: LeaseId,
        /// Program and arguments; empty runs the container's shell.
        argv: Vec<String>,
        /// `NAME=value` pairs added to the command's environment (`TERM` for a shell).
        env: Vec<String>,
        /// The terminal, for a shell.
        tty: Option<TermSize>,
    },
    /// Connect to `port` on the container's own loopback (inside its network namespace).
    Forward {
        /// The lease.
        lease_id: LeaseId,
        /// The container port.
        port: u16,
    },
    /// Extract a tar stream into the workspace at `dest` (`crate::transfer`).
    Upload {
        /// The lease.
        lease_id: LeaseId,
        /// Where, inside `/workspace` ([`crate::transfer::workspace_relative`]).
        dest: String,
    },
    /// Send `path` of the workspace as a tar stream (`crate::transfer`).
    Download {
        /// The lease.
        lease_id: LeaseId,
        /// What, inside `/workspace`.
        path: String,
    },
    /// An SFTP version 3 session (draft-ietf-secsh-filexfer-02) on the lease's `/workspace`:
    /// after `Granted` the stream carries SFTP packets both ways, the provider serving them
    /// (`gridlease ssh-proxy` maps an SSH client's `sftp` subsystem onto it: sftp, scp).
    Sftp {
        /// The lease.
        lease_id: LeaseId,
    },
}

impl AccessRequest {
    /// The lease asked for.
    pub fn lease_id(&self) -> LeaseId {
        match self {
            Self::Exec { lease_id, .. }
            | Self::Forward { lease_id, .. }
            | Self::Upload { lease_id, .. }
            | Self::Download { lease_id, .. }
            | Self::Sftp { lease_id } => *lease_id,
        }
    }

    /// The kind of access asked for.
    pub fn kind(&self) -> AccessKind {
        match self {
            Self::Exec { tty: Some(_), .. } => AccessKind::Shell,
            Self::Exec { tty: None, .. } => AccessKind::Exec,
            Self::Forward { .. } => AccessKind::Forward,
            Self::Upload { .. } | Self::Download { .. } | Self::Sftp { .. } => AccessKind::Files,
        }
    }

    /// Checks the bounds a decoder cannot: argument counts and sizes, env shape, port.
    pub fn check(&self) -> Result<(), String> {
        match self {
            Self::Exec { argv, env, tty, .. } => {
                if argv.len() > MAX_ARGS {
                    return Err(format!(
                        "{} arguments; at most {MAX_ARGS} are allowed",
                        argv.len()
                    ));
                }
                let bytes: usize = argv.iter().map(String::len).sum();
                if bytes > MAX_ARGV_BYTES {
                    return Err(format!(
                        "the arguments are {bytes} bytes; at most {MAX_ARGV_BYTES} are allowed"
                    ));
                }
                if argv.iter().any(|a| a.contains('\0')) {
                    return Err("an argument contains a NUL byte".into());
                }
                if env.len() > MAX_ENV {
                    return Err(format!("{} env entries; at most {MAX_ENV}", env.len()));
                }
                for e in env {
                    let Some((name, _)) = e.split_once('=') else {
                        return Err(format!("env entry {e:?} is not NAME=value"));
                    };
                    if name.is_empty()
                        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        || e.contains('\0')
                    {
                        return Err(format!("env name {name:?} is not a valid variable name"));
                    }
                }
                if let Some(t) = tty
                    && (t.cols == 0 || t.rows == 0)
                {
                    return Err("a terminal has at least one row and one column".into());
                }
                Ok(())
            }
            Self::Forward { port, .. } => {
                if *port == 0 {
                    Err("port 0 is not a port".into())
                } else {
                    Ok(())
                }
            }
            Self::Upload { dest: path, .. } | Self::Download { path, .. } => {
                if path.len() > 4096 {
                    return Err("the path is longer than 4096 bytes".into());
                }
                crate::transfer::workspace_relative(path).map(|_| ())
            }
            Self::Sftp { .. } => Ok(()),
        }
    }
}

/// The provider's answer to an [`AccessRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessReply {
    /// Go ahead: the stream now carries the exec frames or the connection's bytes.
    Granted,
    /// Refused; the stream ends.
    Refused(AccessRefusal),
}

/// Why access was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessRefusal {
    /// The provider has no such lease.
    UnknownLease,
    /// The asking peer is not the lease's renter.
    NotRenter,
    /// The lease is not running (not started yet, or over): its state.
    NotRunning {
        /// The state, as `leases` shows it.
        state: String,
    },
    /// The provider's offer does not allow this kind of access.
    NotOffered {
        /// The kind refused.
        kind: AccessKind,
    },
    /// Nothing listens on that port inside the container.
    PortClosed {
        /// The port.
        port: u16,
    },
    /// The request broke a bound ([`AccessRequest::check`]).
    BadRequest {
        /// What.
        message: String,
    },
    /// Too many streams open for this lease right now.
    Busy,
    /// The provider could not do it (Docker failed, ...).
    Failed {
        /// What went wrong, at most [`MAX_MESSAGE`] bytes.
        message: String,
    },
}

impl std::fmt::Display for AccessRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownLease => f.write_str("the provider has no such lease"),
            Self::NotRenter => f.write_str(
                "this node is not the lease's renter: only the peer that signed the lease may open a shell, exec or forward",
            ),
            Self::NotRunning { state } => write!(f, "the lease is not running (it is {state})"),
            Self::NotOffered { kind } => write!(
                f,
                "the provider's offer does not allow {} (see `gridlease offer` for what it allows)",
                kind.name()
            ),
            Self::PortClosed { port } => write!(
                f,
                "nothing listens on port {port} in the container (a server there must listen on 127.0.0.1 or 0.0.0.0)"
            ),
            Self::BadRequest { message } => write!(f, "bad request: {message}"),
            Self::Busy => f.write_str("too many shells, commands or connections are open for this lease; close some and retry"),
            Self::Failed { message } => write!(f, "the provider failed: {message}"),
        }
    }
}

/// Renter -> provider, after `Granted` for an `Exec`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecInput {
    /// Bytes for the command's stdin (at most [`MAX_EXEC_CHUNK`]).
    Stdin(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The renter's stdin ended: the command's stdin is closed.
    Eof,
    /// The renter's terminal was resized.
    Resize(TermSize),
}

/// Provider -> renter, after `Granted` for an `Exec`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecOutput {
    /// Bytes the command wrote to stdout (or to its terminal).
    Stdout(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Bytes the command wrote to stderr.
    Stderr(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The command ended with this exit code; the last frame.
    Exit(i64),
    /// The command could not be run or followed; the last frame.
    Error(String),
}

/// Encodes `value` as one frame (header and body), at most `MAX` bytes of body.
pub fn frame<T: Serialize, const MAX: usize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let body = codec::encode::<T, MAX>(value)?;
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&codec::frame_header(body.len(), MAX)?);
    out.extend_from_slice(&body);
    Ok(out)
}

/// Truncates a message to [`MAX_MESSAGE`] bytes on a char boundary.
pub fn message(s: impl std::fmt::Display) -> String {
    crate::text::truncated(s, MAX_MESSAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(argv: Vec<String>, env: Vec<String>) -> AccessRequest {
        AccessRequest::Exec {
            lease_id: LeaseId(crate::types::Digest([7; 32])),
            argv,
            env,
            tty: None,
        }
    }

    #[test]
    fn frames_round_trip_within_their_caps() {
        let req = exec(vec!["wc".into(), "-c".into()], vec!["TERM=xterm".into()]);
        let f = frame::<_, MAX_REQUEST_FRAME>(&req).unwrap();
        let len = codec::check_frame_header(f[..4].try_into().unwrap(), MAX_REQUEST_FRAME).unwrap();
        assert_eq!(len, f.len() - 4);
        let back: AccessRequest = codec::decode::<_, MAX_REQUEST_FRAME>(&f[4..]).unwrap();
        assert_eq!(back, req);
        let out = ExecOutput::Stdout(vec![1; MAX_EXEC_CHUNK]);
        let f = frame::<_, MAX_EXEC_FRAME>(&out).unwrap();
        let back: ExecOutput = codec::decode::<_, MAX_EXEC_FRAME>(&f[4..]).unwrap();
        assert_eq!(back, out);
        // One byte more than a chunk does not fit a frame.
        assert!(frame::<_, MAX_EXEC_FRAME>(&ExecOutput::Stdout(vec![1; MAX_EXEC_FRAME])).is_err());
    }

    #[test]
    fn checks_refuse_what_a_decoder_lets_through() {
        assert!(
            exec(vec!["a".repeat(MAX_ARGV_BYTES + 1)], vec![])
                .check()
                .is_err()
        );
        assert!(
            exec(vec!["x".into(); MAX_ARGS + 1], vec![])
                .check()
                .is_err()
        );
        assert!(exec(vec!["a\0b".into()], vec![]).check().is_err());
        assert!(exec(vec![], vec!["NOEQUALS".into()]).check().is_err());
        assert!(exec(vec![], vec!["BAD-NAME=1".into()]).check().is_err());
        assert!(
            exec(vec!["ls".into()], vec!["TERM=xterm-256color".into()])
                .check()
                .is_ok()
        );
        let zero = AccessRequest::Forward {
            lease_id: LeaseId(crate::types::Digest([1; 32])),
            port: 0,
        };
        assert!(zero.check().is_err());
    }

    #[test]
    fn kinds_follow_the_request_and_the_policy() {
        let mut shell = exec(vec![], vec![]);
        if let AccessRequest::Exec { tty, .. } = &mut shell {
            *tty = Some(TermSize { cols: 80, rows: 24 });
        }
        assert_eq!(shell.kind(), AccessKind::Shell);
        assert_eq!(exec(vec![], vec![]).kind(), AccessKind::Exec);
        let p = AccessPolicy {
            shell: false,
            ..AccessPolicy::ALL
        };
        assert!(!p.allows(AccessKind::Shell) && p.allows(AccessKind::Forward));
        assert_eq!(p.describe(), "exec, forward");
        assert_eq!(AccessPolicy::NONE.describe(), "none");
    }
}
