//! Interactive access to running leases (issue 14): `gridlease shell`, `exec` and `forward`,
//! carried on libp2p streams (`/gridlease/access/3`, [`gridlease_protocol::access`]) over the
//! connection the two nodes already share (direct, hole-punched or relayed), so neither side
//! needs a public address and the provider publishes no port.
//!
//! - Provider ([`serve`]): accepts access streams, checks each against the lease (only its
//!   renter, only while it runs, only what the offer allows: [`authorize`]), then runs the
//!   command through Docker's exec API or connects inside the container's network namespace
//!   ([`gridlease_sandbox::access`]). Refusals are logged with the asking peer and counted.
//! - Renter ([`open`]): opens a stream to the lease's provider, sends the request, and hands
//!   the granted stream to the control API, which splices it to the CLI's connection.
//!
//! Bounds: only the renters of this provider's leases hold stream slots (a stranger's stream
//! is answered `NotRenter` off the accept loop, holding one of a few vetting permits, never a
//! slot); at most [`MAX_STREAMS`] access streams at once on a provider,
//! [`MAX_STREAMS_PER_PEER`] per peer and [`MAX_STREAMS_PER_LEASE`] per lease; a stream whose
//! request does not come within [`REQUEST_TIMEOUT`] is closed; log lines about refusals are
//! rate-limited; every frame is capped; byte copies use fixed buffers (back-pressure is the
//! transports' own: yamux windows, TCP, Docker's hijacked connection).
//!
//! Depends on `net` (streams) and `lease` (what a lease is and whether it runs); the control
//! API depends on it.

mod files;
pub mod frames;
mod serve;
mod sftp;
pub mod ssh;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use gridlease_contracts::LeaseState;
use gridlease_protocol::access::{
    ACCESS_PROTOCOL, AccessKind, AccessPolicy, AccessRefusal, AccessReply, AccessRequest,
    MAX_REPLY_FRAME, MAX_REQUEST_FRAME,
};
use gridlease_protocol::{LeaseId, PeerId};
use libp2p::StreamProtocol;

use crate::lease::{LeaseService, LeaseView};
use crate::net::Client;
use crate::store::Role;

pub use serve::serve;

/// How the opening of an access stream is tried again when the provider could not be
/// reached (a fresh libp2p stream sometimes fails with `connection is closed`): twice more,
/// after 200 ms and 400 ms. The CLI's opening through the control API and the node's own (a
/// `listen`ed connection) follow it alike.
pub fn open_retries() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(200))
        .with_max_times(2)
}

/// Most access streams a provider serves at once (all leases).
pub const MAX_STREAMS: usize = 512;
/// Most access streams open at once for one lease.
pub const MAX_STREAMS_PER_LEASE: usize = 128;
/// Most access streams one peer holds at once (all its leases).
pub const MAX_STREAMS_PER_PEER: usize = 128;
/// Copy buffer, each way, where the renter's node splices a CLI connection to a stream.
pub const SPLICE_BUFFER: usize = 256 * 1024;
/// Copies bytes both ways between `a` and `b` until both directions ended, each direction's
/// end passed on as a half-close, with [`SPLICE_BUFFER`] each way: how the renter's node (and
/// `ssh-proxy`) carries a byte stream onto another.
pub async fn splice<A, B>(a: &mut A, b: &mut B) -> std::io::Result<(u64, u64)>
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + ?Sized,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + ?Sized,
{
    tokio::io::copy_bidirectional_with_sizes(a, b, SPLICE_BUFFER, SPLICE_BUFFER).await
}

/// How long a provider waits for the opening request of a stream (the renter's node sends it
/// as it opens the stream).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a renter waits for the provider's answer (creating an exec can take a while on a
/// loaded host).
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// The stream protocol.
pub fn protocol() -> StreamProtocol {
    StreamProtocol::new(ACCESS_PROTOCOL)
}

/// Counters of access streams, by kind (provider side: granted and refused; renter side:
/// opened), and the bytes forwarded through ports.
#[derive(Debug, Default)]
pub struct AccessStats {
    granted: [AtomicU64; 4],
    refused: [AtomicU64; 4],
    forwarded_bytes: AtomicU64,
}

fn slot(kind: AccessKind) -> usize {
    match kind {
        AccessKind::Shell => 0,
        AccessKind::Exec => 1,
        AccessKind::Forward => 2,
        AccessKind::Files => 3,
    }
}

/// A snapshot of [`AccessStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessCounts {
    /// Streams granted: shell, exec, forward, files.
    pub granted: [u64; 4],
    /// Streams refused: shell, exec, forward, files.
    pub refused: [u64; 4],
    /// Bytes carried through forwarded ports, both ways.
    pub forwarded_bytes: u64,
}

impl AccessStats {
    pub(crate) fn grant(&self, kind: AccessKind) {
        self.granted[slot(kind)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn refuse(&self, kind: AccessKind) {
        self.refused[slot(kind)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn forwarded(&self, bytes: u64) {
        self.forwarded_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The current values.
    pub fn snapshot(&self) -> AccessCounts {
        let load = |a: &[AtomicU64; 4]| a.each_ref().map(|v| v.load(Ordering::Relaxed));
        AccessCounts {
            granted: load(&self.granted),
            refused: load(&self.refused),
            forwarded_bytes: self.forwarded_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Shared access counters.
pub type SharedStats = Arc<AccessStats>;

/// The provider's decision on a request from `peer`, given the lease's view (`None`: no such
/// lease here), what the provider allows and the time `now`. Pure: the one place the rules
/// live. Everything needs a running lease, except a download from a finished lease whose
/// outputs are still kept (`LeaseView::outputs_until` after `now`), and copies into and out
/// of a container held for uploads (`LeaseView::upload_until` after `now`).
///
/// The renter check comes first, so a stranger learns nothing about a lease's state.
pub fn authorize(
    peer: &PeerId,
    req: &AccessRequest,
    view: Option<&LeaseView>,
    policy: AccessPolicy,
    now: gridlease_protocol::Timestamp,
) -> Result<(), AccessRefusal> {
    req.check()
        .map_err(|message| AccessRefusal::BadRequest { message })?;
    let Some(v) = view.filter(|v| v.role == Role::Provider) else {
        return Err(AccessRefusal::UnknownLease);
    };
    if v.counterparty != peer.to_string() {
        return Err(AccessRefusal::NotRenter);
    }
    let copy = matches!(
        req,
        AccessRequest::Upload { .. } | AccessRequest::Download { .. } | AccessRequest::Sftp { .. }
    );
    // A volume (issue 47) has no container: its files are reached by copies only.
    if v.volume.is_some() && !copy {
        return Err(AccessRefusal::BadRequest {
            message: "a volume has no container: copy its files (volume cp), or mount it into a lease (rent --volume)".into(),
        });
    }
    if !policy.allows(req.kind()) {
        return Err(AccessRefusal::NotOffered { kind: req.kind() });
    }
    let kept_outputs = matches!(req, AccessRequest::Download { .. })
        && v.state.is_terminal()
        && v.outputs_until.is_some_and(|until| until > now.0);
    // A held container (created, its command not started: `rent --upload`) takes copies in
    // and out of its /workspace, nothing else.
    let held = matches!(
        req,
        AccessRequest::Upload { .. } | AccessRequest::Download { .. } | AccessRequest::Sftp { .. }
    ) && v.state == LeaseState::Starting
        && v.upload_until.is_some_and(|until| until > now.0);
    if v.state != LeaseState::Running && !kept_outputs && !held {
        return Err(AccessRefusal::NotRunning {
            state: v.state.as_str().to_string(),
        });
    }
    Ok(())
}

/// Why a renter could not open access to a lease.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// No such lease on this node.
    #[error("no lease {0} on this node")]
    Unknown(LeaseId),
    /// This node provides the lease; access is opened from the renter's node.
    #[error(
        "this node is the provider of lease {0}: shell, exec and forward are opened from the renter's node"
    )]
    NotRenter(LeaseId),
    /// The provider refused.
    #[error("{0}")]
    Refused(AccessRefusal),
    /// The provider's node does not speak the access protocol.
    #[error(
        "the provider's node does not serve shell, exec, forward or file copies (another version of the access protocol, or a node without Docker)"
    )]
    Unsupported,
    /// The provider could not be reached, or the stream broke before an answer.
    #[error("cannot reach the provider: {0}")]
    Unreachable(String),
    /// The lease service failed.
    #[error("{0}")]
    Lease(String),
}

/// Renter: opens an access stream for `req` to the provider of the lease, and returns it once
/// the provider granted it. Whether the lease runs is the provider's call (it knows).
pub async fn open(
    client: &Client,
    leases: &LeaseService,
    req: AccessRequest,
) -> Result<libp2p::Stream, OpenError> {
    let id = req.lease_id();
    let provider = leases
        .provider_of(id)
        .await
        .map_err(|e| OpenError::Lease(e.to_string()))?;
    let provider = match provider {
        None => return Err(OpenError::Unknown(id)),
        Some(None) => return Err(OpenError::NotRenter(id)),
        Some(Some(p)) => p,
    };
    open_to(client, provider, req).await
}

/// [`open`], tried again as [`open_retries`] says while the provider cannot be reached (a
/// refusal is final): what the node's own openings (a `listen`ed connection, an SSH channel)
/// use.
pub async fn open_retrying(
    client: &Client,
    leases: &LeaseService,
    req: AccessRequest,
) -> Result<libp2p::Stream, OpenError> {
    use backon::Retryable;
    (|| async { open(client, leases, req.clone()).await })
        .retry(open_retries())
        .when(|e| matches!(e, OpenError::Unreachable(_)))
        .await
}

/// Opens an access stream for `req` to `provider` and returns it once granted (the renter
/// check is the provider's: any peer may ask, only the lease's renter is granted).
pub async fn open_to(
    client: &Client,
    provider: PeerId,
    req: AccessRequest,
) -> Result<libp2p::Stream, OpenError> {
    let mut control = client.streams();
    let stream = tokio::time::timeout(REPLY_TIMEOUT, control.open_stream(provider, protocol()))
        .await
        .map_err(|_| OpenError::Unreachable("no stream within 30 s".into()))?
        .map_err(|e| match e {
            libp2p_stream::OpenStreamError::UnsupportedProtocol(_) => OpenError::Unsupported,
            other => OpenError::Unreachable(other.to_string()),
        })?;
    let mut io = tokio_util::compat::FuturesAsyncReadCompatExt::compat(stream);
    let unreachable = |e: std::io::Error| OpenError::Unreachable(e.to_string());
    frames::send::<_, MAX_REQUEST_FRAME, _>(&mut io, &req)
        .await
        .map_err(unreachable)?;
    let reply = tokio::time::timeout(
        REPLY_TIMEOUT,
        frames::read::<AccessReply, MAX_REPLY_FRAME, _>(&mut io),
    )
    .await
    .map_err(|_| OpenError::Unreachable("the provider did not answer within 30 s".into()))?
    .map_err(unreachable)?;
    match reply {
        Some(AccessReply::Granted) => Ok(io.into_inner()),
        Some(AccessReply::Refused(r)) => Err(OpenError::Refused(r)),
        None => Err(OpenError::Unreachable(
            "the provider closed the stream without an answer".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gridlease_protocol::Timestamp;

    const T: Timestamp = Timestamp(1_700_000_000_000);
    use gridlease_protocol::Digest;
    use gridlease_protocol::access::TermSize;

    fn view(role: Role, state: LeaseState, counterparty: &str) -> LeaseView {
        let mut v: LeaseView = serde_json::from_value(serde_json::json!({
            "lease_id": LeaseId(Digest([3; 32])).to_string(),
            "role": "provider", "state": "running", "counterparty": counterparty,
            "gpus": 1, "price_per_gpu_hour": 0, "duration_s": 60, "max_total": 0,
            "extensions": 0, "min_billed_s": 0, "image": "x", "started_at": null,
            "closed_at": null, "usage": null, "paid": 0, "cost_so_far": 0,
            "time_left_s": null, "exit_code": null, "close_reason": null,
            "settled_total": null,
        }))
        .unwrap();
        v.role = role;
        v.state = state;
        v
    }

    #[test]
    fn only_the_renter_of_a_running_lease_gets_what_the_offer_allows() {
        let renter = PeerId::random();
        let stranger = PeerId::random();
        let id = LeaseId(Digest([3; 32]));
        let shell = AccessRequest::Exec {
            lease_id: id,
            argv: vec![],
            env: vec![],
            tty: Some(TermSize { cols: 80, rows: 24 }),
        };
        let fwd = AccessRequest::Forward {
            lease_id: id,
            port: 8888,
        };
        let running = view(Role::Provider, LeaseState::Running, &renter.to_string());
        let all = AccessPolicy::ALL;
        assert_eq!(authorize(&renter, &shell, Some(&running), all, T), Ok(()));
        assert_eq!(
            authorize(&stranger, &shell, Some(&running), all, T),
            Err(AccessRefusal::NotRenter)
        );
        assert_eq!(
            authorize(&renter, &fwd, None, all, T),
            Err(AccessRefusal::UnknownLease)
        );
        let rented = view(Role::Renter, LeaseState::Running, &renter.to_string());
        assert_eq!(
            authorize(&renter, &fwd, Some(&rented), all, T),
            Err(AccessRefusal::UnknownLease)
        );
        let no_fwd = AccessPolicy {
            forward: false,
            ..all
        };
        assert_eq!(
            authorize(&renter, &fwd, Some(&running), no_fwd, T),
            Err(AccessRefusal::NotOffered {
                kind: AccessKind::Forward
            })
        );
        let settled = view(Role::Provider, LeaseState::Settled, &renter.to_string());
        assert!(matches!(
            authorize(&renter, &fwd, Some(&settled), all, T),
            Err(AccessRefusal::NotRunning { .. })
        ));
        // A stranger is told it is not the renter, not the lease's state.
        assert_eq!(
            authorize(&stranger, &fwd, Some(&settled), all, T),
            Err(AccessRefusal::NotRenter)
        );
        // Kept outputs: a download from the finished lease until then, nothing else.
        let mut kept = settled.clone();
        kept.outputs_until = Some(T.0 + 1000);
        let download = AccessRequest::Download {
            lease_id: id,
            path: "/workspace/out".into(),
        };
        assert_eq!(authorize(&renter, &download, Some(&kept), all, T), Ok(()));
        assert!(matches!(
            authorize(&renter, &download, Some(&settled), all, T),
            Err(AccessRefusal::NotRunning { .. })
        ));
        assert!(matches!(
            authorize(&renter, &download, Some(&kept), all, Timestamp(T.0 + 1000)),
            Err(AccessRefusal::NotRunning { .. })
        ));
        assert!(matches!(
            authorize(&renter, &shell, Some(&kept), all, T),
            Err(AccessRefusal::NotRunning { .. })
        ));
        assert_eq!(
            authorize(&stranger, &download, Some(&kept), all, T),
            Err(AccessRefusal::NotRenter)
        );
    }

    #[test]
    fn a_volume_takes_only_its_renters_copies_and_only_while_kept() {
        let renter = PeerId::random();
        let stranger = PeerId::random();
        let id = LeaseId(Digest([3; 32]));
        let mut volume = view(Role::Provider, LeaseState::Running, &renter.to_string());
        volume.volume = Some(crate::lease::view::VolumeView {
            name: "data".into(),
            size_gib: 1,
            price_per_gib_hour: 1,
            from_lease: None,
        });
        let all = AccessPolicy::ALL;
        let upload = AccessRequest::Upload {
            lease_id: id,
            dest: "/workspace/x".into(),
        };
        let sftp = AccessRequest::Sftp { lease_id: id };
        assert_eq!(authorize(&renter, &upload, Some(&volume), all, T), Ok(()));
        assert_eq!(authorize(&renter, &sftp, Some(&volume), all, T), Ok(()));
        // A stranger's copy in or out: refused, whatever it asks.
        for req in [&upload, &sftp] {
            assert_eq!(
                authorize(&stranger, req, Some(&volume), all, T),
                Err(AccessRefusal::NotRenter)
            );
        }
        // No container: exec and forward are refused, also to its renter.
        let exec = AccessRequest::Exec {
            lease_id: id,
            argv: vec!["sh".into()],
            env: vec![],
            tty: None,
        };
        let fwd = AccessRequest::Forward {
            lease_id: id,
            port: 22,
        };
        for req in [&exec, &fwd] {
            assert!(matches!(
                authorize(&renter, req, Some(&volume), all, T),
                Err(AccessRefusal::BadRequest { .. })
            ));
        }
        // Deleted (its lease over): nothing.
        volume.state = LeaseState::Settled;
        assert!(matches!(
            authorize(&renter, &upload, Some(&volume), all, T),
            Err(AccessRefusal::NotRunning { .. })
        ));
    }
}
