//! Starting a provider lease: the image pulled (progress to the renter), the workspace and
//! the container created, the upload hold, the container started and `Running` stored.

use std::sync::Arc;
use std::time::Duration;

use gridlease_contracts::{Actor, LeaseEvent, LeaseState, ProviderChannel};
use gridlease_protocol::{LeaseId, PeerId, StartFailure, StartFailureKind};
use gridlease_sandbox::runtime::SandboxError;
use gridlease_sandbox::{Sandbox, SandboxSpec};
use tokio::sync::{mpsc, watch};

use super::finish::remove_container;
use super::on_msg;
use super::{Halt, Session};
use crate::lease::config::MAX_LOG_BYTES;
use crate::lease::ctx::Ctx;
use crate::lease::logs::{self, LogWriter};
use crate::lease::rpc::session_rpc;
use crate::lease::session::SessionMsg;
use crate::lease::wire::{SessionRequest, SessionResponse};
use crate::store::lease::SessionPatch;

/// Ensure image, create and start the container. Persist before act: `Starting` is stored
/// before anything is pulled or created, `Running` (with the start time: the lease clock's
/// zero, and the container id) right after the start; a write that fails stops the start,
/// and a container already created is removed. A container left by an interrupted start has
/// the lease's name (`container_name`), so a start resumed after a restart (`Starting`
/// stored) removes it by name first; its id needs no write of its own. With an upload hold in
/// the terms, the created container waits for the renter between create and start ([`hold`]),
/// and its id is stored before that wait (a restart during the hold finds it).
pub(super) async fn start(
    s: &mut Session,
    inbox: &mut mpsc::Receiver<SessionMsg>,
) -> Result<(), Halt> {
    let ctx = s.ctx.clone();
    let (sb, resumed) = begin(s).await?;
    let terms = s.lease.terms.clone();
    pull_image(s, &sb, &terms.image).await?;
    // Egress only behind the host firewall: no rules, no container.
    crate::lease::egress::ensure(&ctx, &sb, terms.network_policy).await?;
    let spec = container_spec(s, &terms);
    let id = create_container(s, &sb, spec, resumed).await?;
    run_container(s, &sb, id, inbox).await
}

/// The sandbox (none: the start fails) and `Starting` stored, unless it was already (a lease's
/// and a volume's start share it).
pub(super) async fn sandbox_and_starting(s: &mut Session) -> Result<Sandbox, StartFailure> {
    let Some(sb) = s.ctx.sandbox.clone() else {
        tracing::error!("no Docker: cannot start the container");
        return Err(StartFailure::new(
            StartFailureKind::NoSandbox,
            "the provider's node has no container runtime (Docker is unreachable)",
        ));
    };
    if s.lease.state == LeaseState::Accepted
        && !s
            .transition(
                LeaseEvent::BeginStart,
                Actor::Provider,
                SessionPatch::default(),
            )
            .await
    {
        return Err(internal("cannot record the start"));
    }
    Ok(sb)
}

/// The start's first step: the sandbox and `Starting` stored ([`sandbox_and_starting`]);
/// `resumed` when it was stored already (this node stopped during an earlier start).
async fn begin(s: &mut Session) -> Result<(Sandbox, bool), Halt> {
    // Stored as `Starting` already: this node stopped during an earlier start of the lease.
    let resumed = s.lease.state == LeaseState::Starting;
    let sb = sandbox_and_starting(s).await?;
    #[cfg(feature = "faults")]
    if let Some(d) = s.ctx.config.faults.slow_start {
        tokio::time::sleep(d).await;
    }
    if s.lease.terms.upload_hold_s > 0 && s.container.is_some() {
        // This node stopped while the container was held: the workspace is made afresh below,
        // so what the renter uploaded (and its copy journal says is there) would be gone.
        remove_container(s).await;
        return Err(internal(
            "the provider's node restarted while the container was held for uploads; rent again",
        )
        .into());
    }
    Ok((sb, resumed))
}

/// Pulls `image` if it is not here, within the offer's bounds, its progress forwarded to the
/// renter; records it in the cache of pulled images.
async fn pull_image(s: &Session, sb: &Sandbox, image: &str) -> Result<(), Halt> {
    let ctx = &s.ctx;
    // The cap on unpacked size is the offer's (a registry states only compressed sizes:
    // checked while the image is pulled, and the pull stopped at it).
    let max_unpacked = match ctx.client.own_offer().await {
        Ok(Some(own)) => own.images.max_unpacked_bytes,
        _ => gridlease_contracts::image::ImagePolicy::default().max_unpacked_bytes,
    };
    let limits = gridlease_sandbox::runtime::PullLimits {
        stall: ctx.config.pull_stall,
        total: ctx.config.pull_timeout,
        max_unpacked: Some(max_unpacked),
    };
    // Pull progress goes to the renter (at most once a second), so a long pull that keeps
    // progressing is not taken for a silent provider.
    let (progress_tx, forward) = pull_progress(ctx, s.lease.id, s.renter_peer);
    let mut layers: std::collections::HashMap<String, (u64, u64)> = Default::default();
    let pulled = sb
        .ensure_image_within(image, limits, |p| {
            let Some(layer) = p.layer else { return };
            let e = layers.entry(layer).or_default();
            match (p.status.as_str(), p.current, p.total) {
                ("Downloading", Some(c), Some(t)) => {
                    *e = (u64::try_from(c).unwrap_or(0), u64::try_from(t).unwrap_or(0));
                }
                ("Download complete" | "Pull complete" | "Already exists", _, _) => e.0 = e.1,
                _ => return,
            }
            let sum = layers
                .values()
                .fold((0u64, 0u64), |(a, b), (c, t)| (a + c, b + t));
            progress_tx.send_replace(sum);
        })
        .await;
    drop(progress_tx);
    if let Some(f) = forward {
        f.abort();
    }
    let presence = pulled.map_err(|e| {
        tracing::warn!(error = %e, image = %image, "image not available");
        pull_failure(&e)
    })?;
    // Pulled for a lease: tracked in the bounded cache (`images::evict`); used again: touched.
    let (reference, now) = (crate::lease::images::canonical(image), ctx.now());
    let bytes = match presence {
        gridlease_sandbox::runtime::Presence::Pulled { bytes } => Some(bytes),
        gridlease_sandbox::runtime::Presence::Present => None,
    };
    if let Err(e) = ctx
        .store
        .call(move |st| st.touch_pulled_image(&reference, bytes, now))
        .await
    {
        tracing::warn!(error = %e, "cannot record the image in the cache");
    }
    Ok(())
}

/// The container's spec from the terms: the leased GPUs, the deadline counted from now (after
/// the upload hold) at the latest, the CPU capped at the host's.
fn container_spec(s: &Session, terms: &gridlease_protocol::LeaseTerms) -> SandboxSpec {
    let ctx = &s.ctx;
    let uuids = super::leased_uuids(ctx, &s.gpus);
    // The deadline counts from now (after the upload hold) at the latest; the watcher uses
    // the real start below.
    let expires = ctx
        .now()
        .plus_secs(u64::from(terms.upload_hold_s))
        .plus_secs(u64::from(terms.duration_s));
    let mut spec = SandboxSpec::from_terms(
        s.lease.id,
        terms,
        &ctx.node_id,
        expires,
        uuids,
        &ctx.config.limits,
    );
    // Docker refuses a CPU quota above the host's CPUs; an offer that promises more than the
    // host has is capped here (with a warning) rather than failing the lease.
    let host_millicores = std::thread::available_parallelism()
        .map(|n| {
            u32::try_from(n.get())
                .unwrap_or(u32::MAX)
                .saturating_mul(1000)
        })
        .unwrap_or(1000);
    if spec.cpu_millicores > host_millicores {
        tracing::warn!(
            promised = spec.cpu_millicores,
            host = host_millicores,
            "offer promises more CPU than this host has; capping"
        );
        spec.cpu_millicores = host_millicores;
    }
    spec
}

/// Creates the lease's workspace and container (replacing those of an interrupted start);
/// with an upload hold, stores the container's id before the hold. Returns the container id.
async fn create_container(
    s: &mut Session,
    sb: &Sandbox,
    mut spec: SandboxSpec,
    resumed: bool,
) -> Result<String, Halt> {
    let ctx = s.ctx.clone();
    // A container from an interrupted start (a stop between create and `Running`) is replaced.
    if resumed {
        let name = gridlease_sandbox::spec::container_name(&spec);
        let _ = sb.remove(&name).await;
    }
    // The renter's volumes (issue 47; the desk checked they are its own, running and free):
    // one mounted at /workspace takes the place of the lease's own workspace.
    for m in &s.lease.terms.mounts {
        let name = gridlease_sandbox::workspace::volume_name(&m.volume);
        if m.path == gridlease_sandbox::spec::WORKSPACE_PATH {
            spec.workspace = Some(name);
        } else {
            spec.volumes.push((name, m.path.clone()));
        }
    }
    // The lease's /workspace, before the container that mounts it (removed in `finish`).
    if spec.workspace.is_none() {
        let workspace = create_workspace(&ctx, sb, &spec).await;
        spec.workspace = Some(workspace.map_err(|e| {
            StartFailure::new(
                StartFailureKind::Create,
                format!("the lease's /workspace could not be created: {e}"),
            )
        })?);
    }
    let id = sb.create(&spec).await.map_err(|e| {
        tracing::warn!(error = %e, "cannot create the container");
        StartFailure::new(
            StartFailureKind::Create,
            format!("the container could not be created: {e}"),
        )
    })?;
    s.container = Some(id.clone());
    #[cfg(feature = "faults")]
    if ctx.config.faults.stop_after_create {
        tracing::info!(container = %id, "stopping after create (test fault)");
        return Err(Halt::Shutdown);
    }
    if s.lease.terms.upload_hold_s > 0 {
        // The hold may last minutes: a restart during it must find the container.
        let patch = SessionPatch {
            container_id: Some(id.clone()),
            ..SessionPatch::default()
        };
        let (lid, state) = (s.lease.id, s.lease.state);
        if let Err(e) = ctx
            .store
            .call(move |st| st.lease_transition(&lid, None, state, &patch))
            .await
        {
            tracing::error!(error = %e, "cannot store the container id; not starting it");
            remove_container(s).await;
            return Err(internal("cannot record the container").into());
        }
    }
    Ok(id)
}

/// The created container's verification window and upload hold, its start, its output's writer and `Running` stored
/// (the lease clock's zero); the container is removed if any of it fails.
async fn run_container(
    s: &mut Session,
    sb: &Sandbox,
    id: String,
    inbox: &mut mpsc::Receiver<SessionMsg>,
) -> Result<(), Halt> {
    let ctx = s.ctx.clone();
    let terms = s.lease.terms.clone();
    // The renter's GPU check (unbilled), then its uploads (unbilled), then the command.
    if let Err(halt) = super::verify::window(s, inbox).await {
        remove_container(s).await;
        return Err(halt);
    }
    if let Err(halt) = hold(s, inbox).await {
        remove_container(s).await;
        return Err(halt);
    }
    if let Err(e) = sb.start(&id).await {
        tracing::warn!(error = %e, "cannot start the container");
        remove_container(s).await;
        return Err(StartFailure::new(
            StartFailureKind::Start,
            format!("the container could not be started: {e}"),
        )
        .into());
    }
    s.logs = Some(LogWriter::spawn(
        sb.clone(),
        id.clone(),
        ctx.log_path(&s.lease.id),
        logs::Caps::split(MAX_LOG_BYTES),
    ));
    let now = ctx.now();
    s.channel = ProviderChannel::new(s.lease.id, &terms, now);
    let running = s
        .transition(
            LeaseEvent::Started,
            Actor::Provider,
            SessionPatch {
                started_at: Some(now),
                container_id: Some(id.clone()),
                ..SessionPatch::default()
            },
        )
        .await;
    if !running {
        // Not recorded as running: it must not run (or be billed) unrecorded.
        remove_container(s).await;
        return Err(internal("cannot record the running container").into());
    }
    tracing::info!(container = %id, "lease running");
    Ok(())
}

/// `rent --upload`: the created container waits, its `/workspace` open to the renter's copies
/// (`access::authorize` sees `upload_until` in the view), until the renter says to begin
/// (`SessionRequest::Begin`) or the terms' `upload_hold_s` runs out (then the command starts
/// anyway: the renter asked for that long). A stop or close meanwhile ends the lease; it was
/// not billed (the lease clock starts with the command). No hold in the terms: returns at once.
async fn hold(s: &mut Session, inbox: &mut mpsc::Receiver<SessionMsg>) -> Result<(), Halt> {
    let hold_s = s.lease.terms.upload_hold_s;
    if hold_s == 0 {
        return Ok(());
    }
    let ctx = s.ctx.clone();
    let until = ctx.now().plus_secs(u64::from(hold_s));
    s.held_until = Some(until);
    s.publish();
    tracing::info!(hold_s, "container held for the renter's uploads");
    if let Some(peer) = s.renter_peer {
        // Told once, off the loop: a renter that misses it sees the lease start at the end.
        let (ctx, lease_id) = (ctx.clone(), s.lease.id);
        tokio::spawn(async move {
            let req = SessionRequest::Held { lease_id, until };
            if let Err(e) = session_rpc(&ctx, peer, req).await {
                tracing::warn!(error = %e, "cannot tell the renter about the upload hold");
            }
        });
    }
    // Paces the look at the clock (a manual clock in tests moves without a timer).
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let ended = loop {
        tokio::select! {
            biased;
            () = ctx.cancel.cancelled() => break Err(Halt::Shutdown),
            msg = inbox.recv() => match msg {
                None => break Err(Halt::Shutdown),
                Some(SessionMsg::Inbound(m))
                    if matches!(m.request, SessionRequest::Begin { .. }) =>
                {
                    if Some(m.peer) == s.renter_peer {
                        let _ = m.reply.send(SessionResponse::NothingDue);
                        tracing::info!("the renter's uploads are done; starting");
                        break Ok(());
                    }
                    let _ = m.reply.send(SessionResponse::UnknownLease);
                }
                Some(SessionMsg::Inbound(m)) if matches!(m.request, SessionRequest::Extend(_)) => {
                    // Decided once the command runs (the deadline counts from then).
                    let _ = m.reply.send(SessionResponse::Busy);
                }
                Some(msg) => {
                    if let Some(reason) = on_msg(s, msg) {
                        break Err(Halt::Stopped(reason));
                    }
                }
            },
            _ = tick.tick() => {
                if ctx.now() >= until {
                    tracing::warn!(hold_s, "upload hold ran out; starting the command anyway");
                    break Ok(());
                }
            }
        }
    };
    s.held_until = None;
    s.publish();
    ended
}

/// A channel for pull progress (bytes pulled, bytes known) and the task that forwards its
/// latest value to the renter at most once a second (none without a renter peer).
fn pull_progress(
    ctx: &Arc<Ctx>,
    lease_id: LeaseId,
    peer: Option<PeerId>,
) -> (
    watch::Sender<(u64, u64)>,
    Option<tokio::task::JoinHandle<()>>,
) {
    let (tx, mut rx) = watch::channel((0u64, 0u64));
    let forward = peer.map(|peer| {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let (pulled, total) = *rx.borrow_and_update();
                let msg = SessionRequest::Starting {
                    lease_id,
                    pulled,
                    total,
                };
                if let Err(e) = session_rpc(&ctx, peer, msg).await {
                    tracing::debug!(error = %e, "pull progress not delivered");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    });
    (tx, forward)
}

/// The provider's own bookkeeping failed during a start.
fn internal(what: &str) -> StartFailure {
    StartFailure::new(
        StartFailureKind::Internal,
        format!("the provider's node failed: {what} (its database refused the write)"),
    )
}

/// A failed `ensure_image`, for the renter.
fn pull_failure(e: &SandboxError) -> StartFailure {
    match e {
        SandboxError::Pull { message, .. } => StartFailure::new(
            StartFailureKind::ImagePull,
            format!("image pull failed: {message}"),
        ),
        SandboxError::PullStalled { secs, .. } => StartFailure::new(
            StartFailureKind::PullStalled,
            format!("image pull stalled: no progress for {secs} s"),
        ),
        SandboxError::PullTimeout { secs, .. } => StartFailure::new(
            StartFailureKind::PullTimeout,
            format!("image pull took longer than the provider's limit of {secs} s"),
        ),
        SandboxError::PullTooLarge { max, .. } => StartFailure::new(
            StartFailureKind::ImageRefused,
            format!(
                "image refused: it unpacks to more than the provider's limit of {:.1} GiB (max_unpacked_gib); the pull was stopped and nothing of it kept",
                *max as f64 / f64::from(1u32 << 30)
            ),
        ),
        SandboxError::Image { source } | SandboxError::Spec { source, .. } => StartFailure::new(
            StartFailureKind::ImageRefused,
            format!("image refused: {source}"),
        ),
        SandboxError::Docker { source, .. } => StartFailure::new(
            StartFailureKind::ImagePull,
            format!("image pull failed: {}", docker_message(source)),
        ),
        SandboxError::Build { message, .. } | SandboxError::Unexpected { message, .. } => {
            StartFailure::new(
                StartFailureKind::ImagePull,
                format!("image pull failed: {message}"),
            )
        }
    }
}

/// The daemon's own message from a Docker error (without bollard's wrapping).
fn docker_message(e: &bollard::errors::Error) -> String {
    match e {
        bollard::errors::Error::DockerResponseServerError { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// Creates the lease's workspace volume (a fresh one; whatever an interrupted start left is
/// replaced) and returns its name.
async fn create_workspace(
    ctx: &Ctx,
    sb: &Sandbox,
    spec: &SandboxSpec,
) -> Result<String, gridlease_sandbox::WorkspaceError> {
    match sb.create_workspace(&ctx.workspace_dir(), spec).await {
        Ok(ws) => Ok(ws.volume),
        Err(e) => {
            tracing::warn!(error = %e, "cannot create the workspace");
            Err(e)
        }
    }
}
