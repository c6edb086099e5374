//! Leases end to end (issue 5): the provider agent that runs the renter's container, per-second
//! metering, signed usage reports answered by signed cumulative receipts, the double-entry
//! ledger, and crash recovery.
//!
//! # Shape
//! [`LeaseService`] is a cloneable handle to one actor task (the *service*), spawned next to the
//! network client by [`LeaseService::start`]. The network loop forwards every lease-stream
//! request to the service ([`crate::net::InboundLease`]). The service owns:
//! - the provider's [`desk::Desk`]: deciding requests, GPU holds and the nonce index. An
//!   accepted lease is stored, then answered, then its session is spawned from the row in
//!   hand (no re-read, no rescan);
//! - one task per live lease (a *session*: [`provider`] or [`renter`]), the one in-memory owner
//!   of that lease's state. It routes inbound session messages to it over bounded channels.
//!   Each session publishes its [`LeaseView`] on a `watch` channel, so reading state never
//!   waits for a busy session; a provider session's end (container gone) releases its holds.
//!
//! Money rules come from `gridlease_contracts::channel` and `gridlease_contracts::billing`;
//! nothing here decides an amount. Time comes from [`LeaseServiceConfig::clock`].
//!
//! # API (what the control API calls)
//! - [`LeaseService::rent`]`(RentRequest) -> Result<LeaseId, RentError>`: negotiates with the
//!   offer's provider, stores the lease, starts the renter session, returns; the run proceeds in
//!   the background. A refusal is [`RentError::Rejected`] with the provider's `RejectReason`.
//! - [`LeaseService::leases`]`() -> Vec<LeaseView>`, [`LeaseService::lease`]`(id) ->
//!   Option<LeaseView>`.
//! - [`LeaseService::logs`]`(id, from_offset) -> Result<LogChunk, LeaseError>`: a renter
//!   fetches from the provider over the network; a provider reads locally. At most
//!   [`wire::MAX_LOG_CHUNK`] bytes per call, read from the file the lease's [`logs::LogWriter`]
//!   fills; neither way goes through the session.
//! - [`LeaseService::stop`]`(id)`: renter sends a signed `LeaseClose`; provider stops the
//!   container. Either way the lease settles at the last valid receipt.
//! - [`LeaseService::ledger`]`() -> Ledger`.
//! - [`LeaseService::provide`]`(ProvideSettings)`: what this node offers; republished at once.
//! - [`LeaseService::wait_closed`]`(id) -> Result<LeaseView, LeaseError>`: resolves when the
//!   lease is settled or failed (for `rent` without `--detach`).
//!
//! # Invariants
//! - Persist before act: a transition whose store write fails does not happen (the session
//!   does not advance in memory, no container starts, nothing is acknowledged).
//! - A GPU is held from the accept until its lease's container is gone.
//! - A receipt is persisted (with its ledger rows, in one transaction) before the renter sends
//!   it and before the provider counts it.
//! - A usage report is persisted by the provider before it is sent, so sequences never repeat
//!   after a crash.
//! - Final statement = last valid receipt, on both nodes.

mod capacity;
pub(crate) mod completion;
pub mod desk;
mod egress;
pub mod extend;
mod faults;
pub mod images;
pub mod logs;
mod outputs;
pub mod owner;
pub mod provider;
pub mod renter;
pub mod retention;
mod settings;
pub mod telemetry;
pub mod view;
pub mod watchdog;
pub mod wire;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gridlease_contracts::Money;
use gridlease_contracts::image::ImagePolicy;
use gridlease_protocol::{
    Digest, LeaseId, NetworkPolicy, OfferId, PeerId, PublicKey, RejectReason, Signed,
};
use gridlease_sandbox::Sandbox;
use gridlease_sandbox::spec::ProviderLimits;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use gridlease_protocol::session::LeaseRpcResponse;

use crate::clock::{self, SharedClock};
use crate::net::{
    Client, InboundLease, InboundRequest, NegotiationError, NegotiationOutcome, NetworkEvent,
    OfferTemplate,
};
use crate::renter::{offer_addrs, terms_for};
use crate::store::lease::SessionRecord;
use crate::store::{Role, StoreError, StoreHandle, StoredLease};

pub use extend::{ExtendError, ExtendRequest, Extended};
pub use faults::{BadReceipt, Faults};
pub use settings::{ProvideError, ProvideSettings};
pub use view::{FailureView, LeaseStatement, LeaseView, Ledger, PullView, UsageView};
pub use wire::{LogChunk, SessionRequest, SessionResponse};

/// Capacity of the service's command channel.
pub const SERVICE_QUEUE: usize = 64;
/// Capacity of the inbound session channel (network -> service).
pub const INBOUND_QUEUE: usize = 256;
/// Capacity of each session's inbox.
pub const SESSION_QUEUE: usize = 32;
/// Most bytes of a container's output kept by the provider: its first and its last 4 MiB
/// (`logs::Caps::split`), with a notice of what was cut between them.
pub const MAX_LOG_BYTES: u64 = 8 * 1024 * 1024;

/// Settings of the lease service.
#[derive(Clone, Debug)]
pub struct LeaseServiceConfig {
    /// Where finished leases' output is kept (`<home>/leases`).
    pub data_dir: PathBuf,
    /// Real GPU UUIDs by digest (NVML); declared dev GPUs have none and get no device request.
    pub gpu_uuids: BTreeMap<Digest, String>,
    /// Samples leased GPUs (utilization, VRAM, energy) alongside container stats; NVML in a
    /// daemon with real GPUs, none with declared ones.
    pub gpu_sampler: Option<SharedGpuSampler>,
    /// Where [`LeaseService::provide`] keeps its settings (`<home>/provide.json` in a daemon).
    pub provide_file: Option<PathBuf>,
    /// Provider-side sandbox limits.
    pub limits: ProviderLimits,
    /// What this node offers when [`LeaseService::provide`] enables it (GPUs, defaults).
    pub base_template: Option<OfferTemplate>,
    /// Renter: seconds the provider may wait for a silent renter (`grace_s` of the terms).
    pub renter_grace_s: u32,
    /// Provider: how long an offered GPU its owner used must stay idle before it is offered
    /// again ([`owner`]).
    pub owner_idle: Duration,
    /// Provider: utilisation of an unleased offered GPU that means its owner uses it, percent
    /// (0: only compute processes count; [`owner`]).
    pub owner_util_percent: u32,
    /// Renter: how long the provider may take from accept to the first usage report (image
    /// pull and start) before the renter gives up on it.
    pub start_allowance: Duration,
    /// Provider: an image pull whose progress stream is silent this long fails as stalled
    /// (a pull that keeps progressing is not cut by it).
    pub pull_stall: Duration,
    /// Provider: the longest image pull in all.
    pub pull_timeout: Duration,
    /// Provider: bounds of the cache of images pulled for leases (least recently used ones
    /// beyond it are removed when a lease ends).
    pub image_cache: gridlease_contracts::image::CacheLimits,
    /// Provider: SIGTERM-to-SIGKILL grace when stopping a container (at the end of a lease:
    /// SIGTERM at `deadline - stop_grace`, SIGKILL at the deadline).
    pub stop_grace: Duration,
    /// Provider: the executable that runs `__watchdog` (the `gridlease` binary: the daemon's
    /// own, `std::env::current_exe`), spawned per container so it stops at its deadline even
    /// if this node is killed ([`watchdog`]). `None`: no watchdog; the node alone stops
    /// containers, while it runs.
    pub watchdog: Option<PathBuf>,
    /// How long a session waits for an answer from the other side.
    pub rpc_timeout: Duration,
    /// Provider: how often finished leases' kept outputs are checked for removal
    /// (`outputs::SWEEP`, 10 s, in a daemon).
    pub outputs_sweep: Duration,
    /// How long, and how much of, finished leases' logs are kept ([`retention`]).
    pub log_retention: retention::LogRetention,
    /// How often finished leases' logs are swept ([`retention::SWEEP`] in a daemon).
    pub logs_sweep: Duration,
    /// What sessions, silence detection and holds read as "now" ([`clock::SystemClock`] in a
    /// daemon; a [`clock::ManualClock`] in tests of grace periods and expiry).
    pub clock: SharedClock,
    /// Deliberate misbehaviour, for tests of the other side's defences only. Always
    /// [`Faults::default`] (none) in the daemon.
    #[doc(hidden)]
    pub faults: Faults,
}

/// A GPU sampler shared by lease sessions, with the id it knows each offered GPU by.
#[derive(Clone)]
pub struct SharedGpuSampler {
    /// The sampler (NVML, or a scripted probe for declared GPUs).
    pub sampler: std::sync::Arc<dyn gridlease_sandbox::meter::GpuSampler>,
    /// The sampler's id (a UUID) of each offered GPU, by the digest offers carry. Separate
    /// from [`LeaseServiceConfig::gpu_uuids`], which are passed to containers as devices.
    pub ids: BTreeMap<Digest, String>,
    /// What telemetry says the values come from.
    pub source: gridlease_protocol::telemetry::TelemetrySource,
}

impl std::fmt::Debug for SharedGpuSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedGpuSampler")
    }
}

impl LeaseServiceConfig {
    /// Defaults with output under `data_dir`.
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            gpu_uuids: BTreeMap::new(),
            gpu_sampler: None,
            provide_file: None,
            limits: ProviderLimits::from_host(),
            base_template: None,
            renter_grace_s: 30,
            owner_idle: Duration::from_secs(300),
            owner_util_percent: owner::BUSY_UTIL_PERCENT,
            start_allowance: Duration::from_secs(300),
            pull_stall: Duration::from_secs(120),
            pull_timeout: Duration::from_secs(1800),
            image_cache: gridlease_contracts::image::CacheLimits::default(),
            stop_grace: Duration::from_secs(2),
            watchdog: None,
            rpc_timeout: Duration::from_secs(10),
            outputs_sweep: outputs::SWEEP,
            log_retention: retention::LogRetention::default(),
            logs_sweep: retention::SWEEP,
            clock: clock::system(),
            faults: Faults::default(),
        }
    }
}

/// What a renter asks for: the one rent request, built by the CLI, sent as the body of
/// `POST /v1/leases`, and taken by [`LeaseService::rent`] (which fills in the rest of the
/// terms from the offer: [`crate::renter::terms_for`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct RentRequest {
    /// Offer id (64 hex digits), or a unique prefix of it as `gridlease search` shows: the
    /// control API resolves a prefix; [`LeaseService::rent`] needs the whole id.
    pub offer: String,
    /// GPUs wanted.
    pub gpus: u16,
    /// Seconds.
    pub duration_s: u32,
    /// Container image.
    pub image: String,
    /// Command and arguments; empty runs the image's own entrypoint/cmd.
    #[serde(default)]
    pub command: Vec<String>,
    /// Environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Budget cap (a decimal amount in JSON, e.g. `"1.5"`); default: the cost of the whole
    /// duration (or of the minimum billed time, if longer).
    #[serde(default, with = "decimal")]
    #[schema(value_type = Option<String>)]
    pub max_total: Option<Money>,
    /// Network for the container: `"none"` (default) or `"egress"` (internet, not the
    /// provider's LAN or host; the offer must allow it, or the provider refuses the lease).
    #[serde(default = "no_network", with = "network_text")]
    #[schema(value_type = String)]
    pub network: NetworkPolicy,
    /// Seconds the provider should keep the finished lease's container and `/workspace` for
    /// downloads (`gridlease cp`, `rent --download`); at most the offer's
    /// `output_retention_s`. 0 (default): removed when the lease ends.
    #[serde(default)]
    pub keep_outputs_s: u32,
    /// Seconds the provider should hold the created container before starting the command,
    /// for the renter's uploads into `/workspace` (`rent --upload`); at most the offer's
    /// `upload_hold_s`. The renter ends the hold sooner with [`LeaseService::begin`].
    /// 0 (default): started at once.
    #[serde(default)]
    pub upload_hold_s: u32,
    /// Seconds of use to pay ahead of the provider's reports, so the lease keeps running while
    /// this node is offline (an unattended lease; `rent --prepay`): each receipt pays what is
    /// due plus this much, capped at the budget. 0 (default): in arrears, and the provider
    /// stops the lease when this node is silent past the grace period. 4294967295 (`all`):
    /// the whole budget at the first report.
    #[serde(default)]
    pub prepay_s: u32,
}

fn no_network() -> NetworkPolicy {
    NetworkPolicy::None
}

/// [`NetworkPolicy`] as the CLI and `provide` write it: `"none"` or `"egress"`.
mod network_text {
    use gridlease_protocol::NetworkPolicy;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer>(n: &NetworkPolicy, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match n {
            NetworkPolicy::None => "none",
            NetworkPolicy::Egress => "egress",
        })
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<NetworkPolicy, D::Error> {
        match String::deserialize(d)?.as_str() {
            "none" => Ok(NetworkPolicy::None),
            "egress" => Ok(NetworkPolicy::Egress),
            other => Err(D::Error::custom(format!(
                "network {other:?} is not none or egress"
            ))),
        }
    }
}

/// `Option<Money>` as a decimal string (`"0.25"`), as people write amounts.
mod decimal {
    use gridlease_contracts::Money;
    use serde::{Deserialize, Deserializer, Serializer, de::Error};

    pub(super) fn serialize<S: Serializer>(m: &Option<Money>, s: S) -> Result<S::Ok, S::Error> {
        match m {
            Some(m) => s.serialize_some(&m.to_string()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Money>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|t| {
                t.parse::<Money>()
                    .map_err(|e| D::Error::custom(format!("max_total {t:?}: {e}")))
            })
            .transpose()
    }
}

/// Why renting failed.
#[derive(Debug, thiserror::Error)]
pub enum RentError {
    /// The offer id is not a whole offer id.
    #[error("{0:?} is not an offer id (64 hex digits)")]
    BadOffer(String),
    /// The offer is not in the local book.
    #[error("offer {0} is not known to this node; search again")]
    UnknownOffer(OfferId),
    /// The offer is this node's own.
    #[error("offer {0} is this node's own offer: a node does not rent from itself")]
    OwnOffer(OfferId),
    /// The provider refused.
    #[error("the provider refused: {0:?}")]
    Rejected(RejectReason),
    /// Negotiation failed.
    #[error(transparent)]
    Negotiation(#[from] NegotiationError),
    /// The budget computation overflowed.
    #[error("the price of this lease overflows")]
    Overflow,
    /// More output retention asked than the offer gives.
    #[error(
        "the provider keeps a finished lease's outputs for at most {most} s; {asked} s were asked"
    )]
    KeepOutputs {
        /// Asked for.
        asked: u32,
        /// The offer's most.
        most: u32,
    },
    /// The image is not one the offer allows (its registries, prefixes and local images, as
    /// the offer states them): refused before anything is signed.
    #[error("image {image}: {}; the offer runs {allowed}", gridlease_contracts::image::refusal_text(.refusal))]
    ImageNotOffered {
        /// The image asked for.
        image: String,
        /// Why the offer's policy refuses it.
        refusal: gridlease_protocol::ImageRefusal,
        /// What the offer runs, in words.
        allowed: String,
    },
    /// A longer upload hold asked than the offer gives.
    #[error(
        "the provider holds a container for uploads for at most {most} s; {asked} s were asked"
    )]
    UploadHold {
        /// Asked for.
        asked: u32,
        /// The offer's most.
        most: u32,
    },
    /// The lease service has stopped.
    #[error("the lease service has stopped")]
    Closed,
}

/// Why a lease operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// No such lease on this node.
    #[error("no lease {0} on this node")]
    Unknown(LeaseId),
    /// The lease is not running (it has not started here yet, or it is over).
    #[error("lease {0} is not running")]
    NotRunning(LeaseId),
    /// The provider could not be reached or answered something unexpected.
    #[error("lease {lease_id}: {detail}")]
    Remote {
        /// The lease.
        lease_id: LeaseId,
        /// Why.
        detail: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The network failed.
    #[error(transparent)]
    Network(#[from] NegotiationError),
    /// The lease service has stopped.
    #[error("the lease service has stopped")]
    Closed,
}

/// Where a session answers an inbound request (the network loop sends it to the peer).
#[derive(Debug)]
pub struct SessionReply(oneshot::Sender<LeaseRpcResponse>);

impl SessionReply {
    /// Answers the request; false when the network loop no longer waits for it.
    pub fn send(self, r: SessionResponse) -> bool {
        self.0.send(LeaseRpcResponse::Session(r)).is_ok()
    }
}

/// An inbound session request for one of this node's leases.
#[derive(Debug)]
pub struct InboundSession {
    /// The connected peer that sent it (the network authenticated it).
    pub peer: PeerId,
    /// The request.
    pub request: SessionRequest,
    /// Where to answer.
    pub reply: SessionReply,
}

/// Messages to a session task.
#[derive(Debug)]
pub(crate) enum SessionMsg {
    /// A request from the counterparty.
    Inbound(Box<InboundSession>),
    /// Stop the lease locally (renter: close; provider: stop the container).
    Stop(oneshot::Sender<()>),
    /// Provider: stop the lease because the owner takes its GPU back (an interruptible offer:
    /// [`owner`]); the same stop as [`SessionMsg::Stop`], closed `OwnerReclaimed`.
    Reclaim(oneshot::Sender<()>),
    /// Extend the lease (renter only; [`extend`]).
    Extend(Box<extend::ExtendAsk>),
}

/// Shared, immutable context of all sessions.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) client: Client,
    pub(crate) store: StoreHandle,
    pub(crate) config: LeaseServiceConfig,
    pub(crate) sandbox: Option<Sandbox>,
    pub(crate) node_id: String,
    pub(crate) cancel: CancellationToken,
    /// Bounds the tasks answering peers' log requests ([`logs::LOG_READERS`]).
    pub(crate) log_reads: Arc<tokio::sync::Semaphore>,
    /// Provider: the GPUs (UUID digests) leases hold now, as the desk last published them;
    /// [`capacity::run`] turns each change into the offer's free count.
    pub(crate) holds: watch::Sender<std::collections::BTreeSet<Digest>>,
    /// Provider: offered GPUs that are the owner's now ([`owner::run`]): in use by the owner
    /// (recently, or outside the offered hours: then all of them): not given to leases, not
    /// counted free.
    pub(crate) owner_busy: watch::Sender<std::collections::BTreeSet<Digest>>,
    /// Provider: the hours the GPUs are offered, as the last `provide` set them (or
    /// `<home>/provide.json` at start); [`owner::run`] withdraws the GPUs outside them.
    /// Written by [`LeaseService::provide`] only.
    pub(crate) hours: watch::Sender<Option<owner::Hours>>,
    /// Provider: a session whose GPUs are free says so here before it publishes its settled
    /// view, so that the desk has released them before anyone who saw the view can ask for
    /// them ([`Ctx::gpus_free`]). The session's end releases them too (idempotent).
    released: mpsc::Sender<LeaseId>,
    /// A lease ended: [`retention::run`] sweeps finished leases' logs now, not only on its
    /// period.
    pub(crate) log_sweep: tokio::sync::Notify,
}

impl Ctx {
    /// An empty telemetry ring for a provider lease of `gpus` (digests, in the lease's order):
    /// their model names from the node's offer template, the source from its sampler.
    fn telemetry_ring(&self, gpus: &[Digest]) -> telemetry::Ring {
        use gridlease_protocol::telemetry::TelemetrySource;
        let offered = self
            .config
            .base_template
            .as_ref()
            .map(|t| t.gpus.as_slice())
            .unwrap_or_default();
        let models = gpus
            .iter()
            .map(|d| {
                offered
                    .iter()
                    .find(|g| g.spec.uuid_digest == *d)
                    .map_or_else(|| "GPU".to_string(), |g| g.spec.model.clone())
            })
            .collect();
        let source = self
            .config
            .gpu_sampler
            .as_ref()
            .map_or(TelemetrySource::None, |s| s.source);
        telemetry::Ring::new(source, models)
    }

    /// The stored lease `id`, or [`LeaseError::Unknown`].
    async fn stored_lease(&self, id: LeaseId) -> Result<StoredLease, LeaseError> {
        self.store
            .call(move |s| s.lease(&id))
            .await?
            .ok_or(LeaseError::Unknown(id))
    }
}

impl Ctx {
    pub(crate) fn log_path(&self, id: &LeaseId) -> PathBuf {
        self.config.data_dir.join(format!("{id}.log"))
    }

    /// Where the leases' workspace images live (`gridlease_sandbox::workspace`).
    pub(crate) fn workspace_dir(&self) -> PathBuf {
        gridlease_sandbox::workspace::dir(&self.config.data_dir)
    }

    /// Now, by the service's clock.
    pub(crate) fn now(&self) -> gridlease_protocol::Timestamp {
        self.config.clock.now()
    }

    /// Provider session: the lease's GPUs are free (its container is gone or stopped). Never
    /// waits: a full queue leaves the release to the session's end.
    pub(crate) fn gpus_free(&self, id: LeaseId) {
        let _ = self.released.try_send(id);
    }
}

enum Cmd {
    /// A renter lease negotiated and stored by this node: start its session.
    /// A lease just made here as the renter, and whether its offer declared its GPUs.
    Register(Box<StoredLease>, bool, oneshot::Sender<()>),
    Views(oneshot::Sender<Vec<LeaseView>>),
    Watch(LeaseId, oneshot::Sender<Option<watch::Receiver<LeaseView>>>),
    ToSession(LeaseId, Box<SessionMsg>, oneshot::Sender<bool>),
    /// A provider lease's telemetry ring, while its session runs.
    Telemetry(LeaseId, oneshot::Sender<Option<telemetry::Ring>>),
}

/// The cloneable handle to the lease service.
#[derive(Clone, Debug)]
pub struct LeaseService {
    tx: mpsc::Sender<Cmd>,
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cmd")
    }
}

struct Entry {
    inbox: mpsc::Sender<SessionMsg>,
    view: watch::Receiver<LeaseView>,
    /// Provider: the lease's renter and its live telemetry (`None` on the renter side).
    telemetry: Option<(Option<PeerId>, telemetry::Ring)>,
    /// Provider: the terms hold the container for the renter's uploads before its command.
    upload_hold: bool,
}

impl LeaseService {
    /// Now, by the service's clock (what its sessions and holds read).
    pub fn now(&self) -> gridlease_protocol::Timestamp {
        self.ctx.now()
    }

    /// Starts the service: reconciles this node's containers with its stored leases, holds
    /// the GPUs of live provider leases, resumes every live lease, then takes inbound
    /// lease-stream requests from the network. Stops with `cancel`. (`events` is no longer
    /// needed: nothing is learned from network events; kept so callers need not change.)
    pub async fn start(
        client: Client,
        _events: &broadcast::Sender<NetworkEvent>,
        config: LeaseServiceConfig,
        sandbox: Option<Sandbox>,
        cancel: CancellationToken,
    ) -> Result<Self, LeaseError> {
        if let Err(e) = std::fs::create_dir_all(&config.data_dir) {
            tracing::warn!(dir = %config.data_dir.display(), error = %e, "cannot create the lease output directory");
        }
        let store = client.store().clone();
        let node_id = client.peer_id().to_string();
        let (released_tx, released) = mpsc::channel(SERVICE_QUEUE);
        let ctx = Arc::new(Ctx {
            client: client.clone(),
            store,
            config,
            sandbox,
            node_id,
            cancel: cancel.clone(),
            log_reads: Arc::new(tokio::sync::Semaphore::new(logs::LOG_READERS)),
            holds: watch::Sender::new(std::collections::BTreeSet::new()),
            owner_busy: watch::Sender::new(std::collections::BTreeSet::new()),
            hours: watch::Sender::new(None),
            released: released_tx,
            log_sweep: tokio::sync::Notify::new(),
        });
        // The hours a restarted provider offers in are those it last saved.
        if let Some(path) = &ctx.config.provide_file {
            match ProvideSettings::load(path) {
                Ok(Some(saved)) if saved.enabled => match owner::Hours::resolve(&saved) {
                    Ok(h) => {
                        ctx.hours.send_replace(Some(h));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "saved provide hours not applied: offering always");
                    }
                },
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "ignoring unreadable provide settings"),
            }
        }
        let (tx, rx) = mpsc::channel(SERVICE_QUEUE);
        let (in_tx, in_rx) = mpsc::channel(INBOUND_QUEUE);
        let mut actor = Actor {
            ctx: ctx.clone(),
            cmds: rx,
            inbound: in_rx,
            released,
            sessions: HashMap::new(),
            tasks: JoinSet::new(),
            desk: desk::Desk::new(),
            persists: JoinSet::new(),
            vets: JoinSet::new(),
            facts: images::FactsCache::default(),
            log_rate: crate::net::ratelimit::RateLimiter::new(logs::PEER_LOG_RATE, 1024),
            waiting: HashMap::new(),
        };
        actor.resume_all().await?;
        actor.publish_holds();
        tokio::spawn(capacity::run(ctx.clone()));
        if ctx.sandbox.is_some() {
            tokio::spawn(outputs::run(ctx.clone(), ctx.config.outputs_sweep));
        }
        tokio::spawn(retention::run(ctx.clone(), ctx.config.logs_sweep));
        client.set_lease_handler(in_tx).await?;
        let span = tracing::info_span!("leases", node = %ctx.client.peer_id());
        tokio::spawn(tracing::Instrument::instrument(actor.run(), span));
        let svc = Self { tx, ctx };
        tokio::spawn(owner::run(
            svc.clone(),
            svc.ctx.config.owner_idle,
            svc.ctx.config.owner_util_percent,
        ));
        Ok(svc)
    }

    /// Where this provider's lease workspaces live (`gridlease_sandbox::workspace`): what
    /// file copies open.
    pub fn workspace_dir(&self) -> PathBuf {
        self.ctx.workspace_dir()
    }

    /// The Docker sandbox this node runs leases in (`None`: Docker unreachable, renting only).
    pub fn sandbox(&self) -> Option<Sandbox> {
        self.ctx.sandbox.clone()
    }

    /// Resolves once the service has stopped (after its `cancel`) and finished its shutdown
    /// work (the egress teardown): the daemon waits for it before exiting.
    pub async fn stopped(&self) {
        self.tx.closed().await;
    }

    async fn ask<R>(&self, make: impl FnOnce(oneshot::Sender<R>) -> Cmd) -> Result<R, LeaseError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| LeaseError::Closed)?;
        rx.await.map_err(|_| LeaseError::Closed)
    }

    /// Rents from `req.offer`: returns once the lease is accepted and stored on both sides;
    /// the container starts and is paid for in the background.
    ///
    /// Cancel-safe: the negotiation and the session's registration run in their own task, so
    /// a caller that stops waiting (a dropped HTTP request, Ctrl-C) still leaves a lease that
    /// runs and settles, never one that is stored with no session.
    pub async fn rent(&self, req: RentRequest) -> Result<LeaseId, RentError> {
        let this = self.clone();
        tokio::spawn(async move { this.rent_inner(req).await })
            .await
            .map_err(|_| RentError::Closed)?
    }

    async fn rent_inner(&self, req: RentRequest) -> Result<LeaseId, RentError> {
        let client = &self.ctx.client;
        let id: OfferId = req
            .offer
            .parse()
            .map_err(|_| RentError::BadOffer(req.offer.clone()))?;
        let entry = match client.offer(id).await? {
            Some(e) => e,
            // Re-signed meanwhile (its expiry, addresses or free GPUs): the provider's current
            // offer, if it has the same GPUs at the same or a lower price.
            None => client
                .replaced_offers(id.to_string())
                .await?
                .into_iter()
                .find(|r| r.old == id && r.equivalent)
                .map(|r| r.current)
                .ok_or(RentError::UnknownOffer(id))?,
        };
        if entry.offer.provider == client.key().public() {
            return Err(RentError::OwnOffer(id));
        }
        // The offer states the provider's image rules: a name they refuse is said here, before
        // anything is signed, in the provider's own words.
        let sb = &entry.offer.sandbox;
        let policy = gridlease_contracts::image::ImagePolicy {
            registries: sb.registries.clone(),
            prefixes: sb.image_prefixes.clone(),
            local_images: sb.local_images.clone(),
            ..Default::default()
        };
        if let Err(refusal) = gridlease_contracts::image::check_reference(&policy, &req.image) {
            return Err(RentError::ImageNotOffered {
                image: req.image.clone(),
                refusal,
                allowed: gridlease_contracts::image::policy_text(
                    &sb.registries,
                    &sb.image_prefixes,
                    &sb.local_images,
                ),
            });
        }
        let most = entry.offer.sandbox.output_retention_s;
        if req.keep_outputs_s > most {
            return Err(RentError::KeepOutputs {
                asked: req.keep_outputs_s,
                most,
            });
        }
        let most = entry.offer.sandbox.upload_hold_s;
        if req.upload_hold_s > most {
            return Err(RentError::UploadHold {
                asked: req.upload_hold_s,
                most,
            });
        }
        let grace_s = self.ctx.config.renter_grace_s;
        let now = self.ctx.now();
        let terms = terms_for(
            client.network(),
            &entry,
            client.key().public(),
            &req,
            grace_s,
            fresh_nonce(),
            now,
        )
        .map_err(|_| RentError::Overflow)?;
        let outcome = client
            .negotiate(terms, now.plus_secs(30), offer_addrs(&entry))
            .await?;
        match outcome {
            NegotiationOutcome::Accepted {
                lease_id, stored, ..
            } => {
                // The offer the terms were made from, for the lease's statement.
                if stored.lease.terms.offer_id == entry.id
                    && let Ok(bytes) = entry.signed.to_bytes()
                    && let Err(e) = self
                        .ctx
                        .store
                        .call(move |s| s.put_lease_offer(&lease_id, &bytes))
                        .await
                {
                    tracing::warn!(lease = %lease_id, error = %e, "cannot keep the lease's offer: its statement will lack it");
                }
                let declared = entry
                    .offer
                    .gpus
                    .iter()
                    .any(gridlease_protocol::OfferedGpu::declared);
                self.ask(|r| Cmd::Register(stored, declared, r))
                    .await
                    .map_err(|_| RentError::Closed)?;
                Ok(lease_id)
            }
            NegotiationOutcome::Rejected { reason, .. } => Err(RentError::Rejected(reason)),
        }
    }

    /// Every lease this node knows, live ones with their current metering (one ask to the
    /// actor, one store call).
    pub async fn leases(&self) -> Result<Vec<LeaseView>, LeaseError> {
        let live: HashMap<LeaseId, LeaseView> = self
            .ask(Cmd::Views)
            .await?
            .into_iter()
            .map(|v| (v.lease_id, v))
            .collect();
        let stored = self.ctx.store.call(|s| s.leases_with_records()).await?;
        let now = self.ctx.now();
        Ok(stored
            .into_iter()
            .map(|(l, rec)| match live.get(&l.lease.id) {
                Some(v) => v.clone().at(now),
                None => view::from_store(&l, &rec, now),
            })
            .collect())
    }

    /// The leases with a session on this node now (live ones), from memory.
    pub async fn live_leases(&self) -> Result<Vec<LeaseView>, LeaseError> {
        let now = self.ctx.now();
        Ok(self
            .ask(Cmd::Views)
            .await?
            .into_iter()
            .map(|v| v.at(now))
            .collect())
    }

    /// The peers that may open access streams here now: the renters of this provider's live
    /// leases and of finished ones whose outputs are still kept. The access server admits no
    /// one else to a stream slot (`access::authorize` then decides each request).
    pub async fn access_peers(&self) -> Result<std::collections::HashSet<PeerId>, LeaseError> {
        let mut out = std::collections::HashSet::new();
        for v in self.ask(Cmd::Views).await? {
            if v.role == Role::Provider
                && let Ok(p) = v.counterparty.parse()
            {
                out.insert(p);
            }
        }
        let now = self.ctx.now();
        let kept = self
            .ctx
            .store
            .call(move |s| {
                let mut renters = Vec::new();
                for (id, until) in s.kept_outputs()? {
                    if until > now
                        && let Some(l) = s.lease(&id)?
                        && l.role == Role::Provider
                    {
                        renters.push(l.lease.terms.renter);
                    }
                }
                Ok(renters)
            })
            .await?;
        out.extend(kept.into_iter().filter_map(|k| k.peer_id().ok()));
        Ok(out)
    }

    /// Lease `id`'s statement (`gridlease statement`): what this node keeps of it, signed.
    pub async fn statement(
        &self,
        id: LeaseId,
    ) -> Result<gridlease_protocol::statement::Statement, LeaseError> {
        self.ctx
            .store
            .call(move |s| s.statement(&id))
            .await?
            .ok_or(LeaseError::Unknown(id))
    }

    /// Total earned and spent, micro-units (one aggregate query).
    pub async fn ledger_totals(&self) -> Result<(u64, u64), LeaseError> {
        Ok(self.ctx.store.call(|s| s.ledger_totals()).await?)
    }

    /// One lease.
    pub async fn lease(&self, id: LeaseId) -> Result<Option<LeaseView>, LeaseError> {
        if let Some(w) = self.ask(|r| Cmd::Watch(id, r)).await? {
            return Ok(Some(w.borrow().clone().at(self.ctx.now())));
        }
        let found = self
            .ctx
            .store
            .call(move |s| {
                s.lease(&id)?
                    .map(|l| Ok((s.session_record(&id)?, l)))
                    .transpose()
            })
            .await?;
        Ok(found.map(|(rec, l)| view::from_store(&l, &rec, self.ctx.now())))
    }

    /// The view of lease `id` as its session publishes it, each change as it happens; `None`
    /// when no session runs the lease here (not live, or not this node's).
    pub async fn watch(
        &self,
        id: LeaseId,
    ) -> Result<Option<watch::Receiver<LeaseView>>, LeaseError> {
        self.ask(|r| Cmd::Watch(id, r)).await
    }

    /// Who provides lease `id`: `None` when this node has no such lease, `Some(None)` when
    /// this node is its provider, else the provider's peer id (read from the signed terms).
    pub async fn provider_of(&self, id: LeaseId) -> Result<Option<Option<PeerId>>, LeaseError> {
        let Some(l) = self.ctx.store.call(move |s| s.lease(&id)).await? else {
            return Ok(None);
        };
        match l.role {
            Role::Provider => Ok(Some(None)),
            Role::Renter => l
                .lease
                .terms
                .provider
                .peer_id()
                .map(|p| Some(Some(p)))
                .map_err(|e| LeaseError::Remote {
                    lease_id: id,
                    detail: e.to_string(),
                }),
        }
    }

    /// Resolves when the lease is settled or failed, with its final view. A lease stored but
    /// not yet running a session here (a rent still registering it, a restart resuming it) is
    /// waited for too.
    pub async fn wait_closed(&self, id: LeaseId) -> Result<LeaseView, LeaseError> {
        loop {
            if let Some(mut w) = self.ask(|r| Cmd::Watch(id, r)).await? {
                loop {
                    if w.borrow().is_terminal() {
                        return Ok(w.borrow().clone());
                    }
                    if w.changed().await.is_err() {
                        break;
                    }
                }
            }
            // No session (any more): the store has the state.
            let v = self.lease(id).await?.ok_or(LeaseError::Unknown(id))?;
            if v.is_terminal() {
                return Ok(v);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The live telemetry of a running lease taken after `after` (provider's clock): a
    /// provider's from its own ring, a renter's asked of the provider and checked
    /// ([`TelemetryBatch::validate`]) before it is answered. [`LeaseError::NotRunning`] when
    /// the lease does not run (any more).
    ///
    /// [`TelemetryBatch::validate`]: gridlease_protocol::telemetry::TelemetryBatch::validate
    pub async fn telemetry(
        &self,
        id: LeaseId,
        after: gridlease_protocol::Timestamp,
    ) -> Result<gridlease_protocol::telemetry::TelemetryBatch, LeaseError> {
        let l = self.ctx.stored_lease(id).await?;
        if l.lease.state.is_terminal() {
            return Err(LeaseError::NotRunning(id));
        }
        match l.role {
            Role::Provider => match self.ask(|r| Cmd::Telemetry(id, r)).await? {
                Some(ring) => Ok(ring.after(after)),
                None => Err(LeaseError::NotRunning(id)),
            },
            Role::Renter => {
                let req = SessionRequest::Telemetry {
                    lease_id: id,
                    after,
                };
                match self.provider_rpc(&l, req).await? {
                    SessionResponse::Telemetry(b) => {
                        b.validate(usize::from(l.lease.terms.gpu_count))
                            .map_err(|e| LeaseError::Remote {
                                lease_id: id,
                                detail: format!("the provider's telemetry is refused: {e}"),
                            })?;
                        Ok(b)
                    }
                    SessionResponse::UnknownLease => Err(LeaseError::NotRunning(id)),
                    other => Err(unexpected(id, &other)),
                }
            }
        }
    }

    /// Container output from `from_offset`, at most [`wire::MAX_LOG_CHUNK`] bytes.
    pub async fn logs(&self, id: LeaseId, from_offset: u64) -> Result<LogChunk, LeaseError> {
        let max = wire::MAX_LOG_CHUNK;
        let live = self.ask(|r| Cmd::Watch(id, r)).await?;
        if let Some(l) = live.and_then(|w| logs::LiveLog::of(&w.borrow())) {
            return Ok(l.read(&self.ctx, &id, from_offset, max).await);
        }
        let l = self.ctx.stored_lease(id).await?;
        match l.role {
            Role::Provider => logs::logs_from_file(&self.ctx, &l, from_offset, max).await,
            Role::Renter => {
                let req = SessionRequest::Logs {
                    lease_id: id,
                    offset: from_offset,
                    max: wire::MAX_LOG_CHUNK,
                };
                match self.provider_rpc(&l, req).await? {
                    SessionResponse::Logs(chunk) => Ok(chunk),
                    other => Err(unexpected(id, &other)),
                }
            }
        }
    }

    /// Renter: tells the provider to start the command of a container held for uploads
    /// (`rent --upload`: the uploads are done). Also fine once it runs (the hold ran out).
    pub async fn begin(&self, id: LeaseId) -> Result<(), LeaseError> {
        let l = self.ctx.stored_lease(id).await?;
        if l.role != Role::Renter {
            return Err(LeaseError::Remote {
                lease_id: id,
                detail: "this node provides the lease; the renter begins it".into(),
            });
        }
        match self
            .provider_rpc(&l, SessionRequest::Begin { lease_id: id })
            .await?
        {
            SessionResponse::NothingDue => Ok(()),
            other => Err(unexpected(id, &other)),
        }
    }

    /// Renter: one session request to the provider of `l`; an unreachable provider (or a key
    /// that is no peer id) is [`LeaseError::Remote`].
    async fn provider_rpc(
        &self,
        l: &StoredLease,
        req: SessionRequest,
    ) -> Result<SessionResponse, LeaseError> {
        let remote = |detail: String| LeaseError::Remote {
            lease_id: l.lease.id,
            detail,
        };
        let peer = l
            .lease
            .terms
            .provider
            .peer_id()
            .map_err(|e| remote(e.to_string()))?;
        session_rpc(&self.ctx, peer, req).await.map_err(remote)
    }

    /// Stops a lease: a renter closes it (signed `LeaseClose`), a provider stops the container.
    pub async fn stop(&self, id: LeaseId) -> Result<(), LeaseError> {
        let (reply, rx) = oneshot::channel();
        if self
            .ask(|r| Cmd::ToSession(id, Box::new(SessionMsg::Stop(reply)), r))
            .await?
        {
            match rx.await {
                Ok(()) => Ok(()),
                // The session ended before it read the stop: the lease closed meanwhile (as
                // when it was already over); only a session that ended with the lease still
                // open (the node shutting down) leaves it unstopped.
                Err(_) => match self.ctx.store.call(move |s| s.lease(&id)).await? {
                    Some(l) if l.lease.state.is_terminal() => Ok(()),
                    Some(l) if l.lease.state == gridlease_contracts::LeaseState::Closing => Ok(()),
                    _ => Err(LeaseError::Closed),
                },
            }
        } else {
            match self.ctx.store.call(move |s| s.lease(&id)).await? {
                Some(_) => Ok(()), // already over
                None => Err(LeaseError::Unknown(id)),
            }
        }
    }

    /// Provider: stops a running lease because its owner takes the GPU back ([`owner`]; only
    /// for an interruptible offer). The same path as [`LeaseService::stop`], with close reason
    /// `OwnerReclaimed`; a lease already over is left as it is.
    pub(crate) async fn reclaim(&self, id: LeaseId) -> Result<(), LeaseError> {
        let (reply, rx) = oneshot::channel();
        if self
            .ask(|r| Cmd::ToSession(id, Box::new(SessionMsg::Reclaim(reply)), r))
            .await?
        {
            rx.await.map_err(|_| LeaseError::Closed)
        } else {
            Ok(())
        }
    }

    /// Extends a running lease this node rents ([`extend`]): answers once the provider has
    /// accepted (and both sides stored) the amendment, or with why not.
    pub async fn extend(&self, id: LeaseId, req: ExtendRequest) -> Result<Extended, ExtendError> {
        let add_s = req.added_s()?;
        let (reply, rx) = oneshot::channel();
        let ask = extend::ExtendAsk {
            add_s,
            max_total: req.max_total,
            reply,
        };
        let msg = Box::new(SessionMsg::Extend(Box::new(ask)));
        let sent = self
            .ask(|r| Cmd::ToSession(id, msg, r))
            .await
            .map_err(|_| ExtendError::Closed)?;
        if sent {
            return rx.await.map_err(|_| ExtendError::Closed)?;
        }
        // No session: the lease is over (or not this node's).
        match self.ctx.store.call(move |s| s.lease(&id)).await? {
            Some(l) if l.role == Role::Provider => Err(ExtendError::NotRenter(id)),
            Some(l) => Err(ExtendError::Refused(
                gridlease_protocol::AmendRefusal::NotRunning {
                    state: l.lease.state.as_str().to_string(),
                },
            )),
            None => Err(ExtendError::Unknown(id)),
        }
    }

    /// Co-signed completion records this node holds (its own and gossiped ones), newest
    /// first, at most `limit`: each record and the signed pair.
    pub async fn completions(
        &self,
        limit: usize,
    ) -> Vec<(
        gridlease_protocol::completion::Completion,
        gridlease_protocol::completion::CoSigned,
    )> {
        completion::list(&self.ctx, limit).await
    }

    /// The ledger: statements per lease and counterparty, totals earned and spent.
    pub async fn ledger(&self) -> Result<Ledger, LeaseError> {
        let rows = self.ctx.store.call(|s| s.ledger_rows()).await?;
        let leases = self.ctx.store.call(|s| s.leases(None)).await?;
        Ok(view::ledger(&rows, &leases))
    }

    /// Sets what this node offers and republishes it (withdraws it with `enabled: false`). A
    /// daemon keeps the settings in `<home>/provide.json`; `gridlease node` starts from them.
    pub async fn provide(&self, s: ProvideSettings) -> Result<(), ProvideError> {
        self.apply_provide(&s).await?;
        if let Some(path) = &self.ctx.config.provide_file
            && let Err(e) = s.save(path)
        {
            tracing::warn!(path = %path.display(), error = %e, "provide settings not saved: a restart will not keep them");
        }
        Ok(())
    }

    /// The settings last applied: from `<home>/provide.json` in a daemon (what `provide`
    /// saved), `None` before the first `provide`.
    pub fn provide_settings(&self) -> Option<ProvideSettings> {
        let path = self.ctx.config.provide_file.as_ref()?;
        match ProvideSettings::load(path) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "provide settings unreadable");
                None
            }
        }
    }

    /// The provider's schedule now (`None` when it does not provide): the hours, their zone,
    /// whether they offer the GPUs now and until when (by the service's clock).
    pub fn schedule(&self) -> Option<owner::ScheduleNow> {
        let now = self.ctx.now();
        self.ctx.hours.borrow().as_ref().map(|h| h.now(now))
    }

    /// The cache of images pulled for leases: what it holds and its bounds.
    pub async fn image_cache(
        &self,
    ) -> (images::CacheUsage, gridlease_contracts::image::CacheLimits) {
        (
            images::usage(&self.ctx.store).await,
            self.ctx.config.image_cache,
        )
    }

    /// The image rules of the node's start-up offer template (its configuration).
    pub fn base_images(&self) -> ImagePolicy {
        self.ctx
            .config
            .base_template
            .as_ref()
            .map(|t| t.images.clone())
            .unwrap_or_default()
    }

    async fn apply_provide(&self, s: &ProvideSettings) -> Result<(), ProvideError> {
        let t = s.template(self.ctx.config.base_template.as_ref())?;
        let hours = if s.enabled {
            Some(owner::Hours::resolve(s).map_err(ProvideError::Hours)?)
        } else {
            None
        };
        self.ctx.client.set_offer(t).await?;
        self.ctx.hours.send_replace(hours);
        // Other GPUs may be offered now: count the free ones again.
        self.ctx.holds.send_modify(|_| {});
        Ok(())
    }
}

/// The daemon's settings of its lease service (from its configuration).
#[derive(Clone, Debug)]
pub struct DaemonLeaseSettings {
    /// Bounds of the cache of pulled images.
    pub image_cache: gridlease_contracts::image::CacheLimits,
    /// The isolation tenants run under, and the Docker runtime that gives it.
    pub runtime: (gridlease_protocol::Isolation, Option<String>),
    /// As a renter: the grace the terms give a provider for this node's silence.
    pub renter_grace_s: u32,
    /// As a provider: seconds an owner-used GPU stays out of the offer after its last use.
    pub owner_idle_s: u64,
    /// As a provider: utilisation that means the owner uses a GPU (0: processes only).
    pub owner_util_percent: u32,
    /// As a provider: how long, and how much of, finished leases' logs are kept.
    pub log_retention: retention::LogRetention,
}

/// Starts the lease service of a daemon: output under `<home>/leases`, Docker if reachable
/// (without it, leases this node provides fail to start with `StartFailed`; renting works).
pub async fn start_for_daemon(
    node: &crate::net::Node,
    home: &std::path::Path,
    base_template: Option<OfferTemplate>,
    gpu_uuids: BTreeMap<Digest, String>,
    gpu_sampler: Option<SharedGpuSampler>,
    settings: DaemonLeaseSettings,
) -> Result<LeaseService, LeaseError> {
    let mut config = LeaseServiceConfig::new(home.join("leases"));
    config.renter_grace_s = settings.renter_grace_s;
    config.owner_idle = Duration::from_secs(settings.owner_idle_s);
    config.owner_util_percent = settings.owner_util_percent;
    config.log_retention = settings.log_retention;
    config.image_cache = settings.image_cache;
    (config.limits.isolation, config.limits.runtime) = settings.runtime;
    config.base_template = base_template;
    config.gpu_uuids = gpu_uuids;
    config.gpu_sampler = gpu_sampler;
    config.provide_file = Some(ProvideSettings::path(home));
    // The daemon is the `gridlease` binary, which runs `__watchdog`.
    config.watchdog = std::env::current_exe().ok();
    let sandbox = match Sandbox::connect().await {
        Ok(sb) => Some(sb),
        Err(e) => {
            tracing::warn!(error = %e, "Docker is unreachable: this node cannot run leases");
            None
        }
    };
    LeaseService::start(
        node.client.clone(),
        &node.events,
        config,
        sandbox,
        node.cancel.child_token(),
    )
    .await
}

/// A nonce unique per renter: the clock in nanoseconds (requests are idempotent by nonce, so
/// only uniqueness matters).
fn fresh_nonce() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(1)
}

/// A provider's answer that does not fit the request, as an error.
fn unexpected(lease_id: LeaseId, answer: &SessionResponse) -> LeaseError {
    let detail = match answer {
        // The provider's per-renter rate (logs::PEER_LOG_RATE) or its queues are full.
        SessionResponse::Busy => {
            "the provider is busy (this node asked it too often); retry in a second".into()
        }
        other => format!("provider answered {other:?}"),
    };
    LeaseError::Remote { lease_id, detail }
}

/// Sends one session request and returns the answer (or why there is none).
pub(crate) async fn session_rpc(
    ctx: &Ctx,
    peer: PeerId,
    req: SessionRequest,
) -> Result<SessionResponse, String> {
    use crate::net::codec::{LeaseRpc, LeaseRpcResponse};
    let call = ctx
        .client
        .lease_rpc(peer, Vec::new(), LeaseRpc::Session(req));
    match tokio::time::timeout(ctx.config.rpc_timeout, call).await {
        Err(_) => Err("timed out".into()),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(LeaseRpcResponse::Session(r))) => Ok(r),
        Ok(Ok(_)) => Err("answered with a negotiation message".into()),
    }
}

/// Why a transition did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TransitionFailed {
    /// The state machine refuses it in this state.
    #[error("refused by the lease state machine: {0}")]
    Refused(#[from] gridlease_contracts::lease::TransitionError),
    /// The store could not write it; the lease did not advance.
    #[error("not stored: {0}")]
    Store(#[from] StoreError),
}

/// Persist before act: computes the transition on a copy of `lease` at the service clock's
/// now, stores it with `patch`, and only once that committed advances `lease`. A refused
/// transition or a failed write leaves `lease` as it was.
pub(crate) async fn apply_and_persist(
    ctx: &Ctx,
    lease: &mut gridlease_contracts::Lease,
    event: gridlease_contracts::LeaseEvent,
    actor: gridlease_contracts::Actor,
    patch: crate::store::lease::SessionPatch,
) -> Result<(), TransitionFailed> {
    apply_and_persist_at(ctx, lease, event, actor, patch, ctx.now()).await
}

/// [`apply_and_persist`], logging a transition that did not happen; true when it did.
pub(crate) async fn transition(
    ctx: &Ctx,
    lease: &mut gridlease_contracts::Lease,
    event: gridlease_contracts::LeaseEvent,
    actor: gridlease_contracts::Actor,
    patch: crate::store::lease::SessionPatch,
) -> bool {
    match apply_and_persist(ctx, lease, event, actor, patch).await {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(?event, error = %e, "lease transition did not happen");
            false
        }
    }
}

/// [`apply_and_persist`] for an event that happened at `at` (e.g. a start the renter learns
/// of from the provider's report).
pub(crate) async fn apply_and_persist_at(
    ctx: &Ctx,
    lease: &mut gridlease_contracts::Lease,
    event: gridlease_contracts::LeaseEvent,
    actor: gridlease_contracts::Actor,
    patch: crate::store::lease::SessionPatch,
    at: gridlease_protocol::Timestamp,
) -> Result<(), TransitionFailed> {
    let mut next = lease.clone();
    next.apply(event, actor, at)?;
    let id = next.id;
    let t = next.history.last().copied();
    let state = next.state;
    ctx.store
        .call(move |s| s.lease_transition(&id, t.as_ref(), state, &patch))
        .await?;
    *lease = next;
    Ok(())
}

/// Signs a message with this node's key.
pub(crate) fn sign<T: gridlease_protocol::WireMessage>(ctx: &Ctx, msg: &T) -> Option<Signed<T>> {
    match Signed::sign(ctx.client.key(), ctx.client.network(), msg) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!(error = %e, "cannot sign a session message");
            None
        }
    }
}

/// A provider lease's store write, finished.
struct Persisted {
    stored: Box<StoredLease>,
    accept: Signed<gridlease_protocol::LeaseAccept>,
    result: Result<Option<StoredLease>, StoreError>,
}

/// Provider: what the daemon or the registry said about a request's image.
struct Vetted {
    proposal: Box<crate::net::Proposal>,
    reply: oneshot::Sender<LeaseRpcResponse>,
    image: gridlease_contracts::image::ImageRef,
    facts: Result<gridlease_contracts::image::ImageFacts, gridlease_protocol::ImageRefusal>,
}

/// How a session task ended.
struct SessionEnd {
    id: LeaseId,
    /// Provider: the container is gone (or never existed), so the GPUs are free.
    released: bool,
}

struct Actor {
    ctx: Arc<Ctx>,
    cmds: mpsc::Receiver<Cmd>,
    inbound: mpsc::Receiver<InboundLease>,
    /// Provider: sessions whose GPUs are free ([`Ctx::gpus_free`]).
    released: mpsc::Receiver<LeaseId>,
    sessions: HashMap<LeaseId, Entry>,
    tasks: JoinSet<SessionEnd>,
    /// Provider: decisions, GPU holds, nonces.
    desk: desk::Desk,
    /// Provider: accepted leases being stored.
    persists: JoinSet<Persisted>,
    /// Provider: requests whose image is being asked about (at most [`images::MAX_VETTING`]).
    vets: JoinSet<Vetted>,
    /// Provider: facts about images asked about recently.
    facts: images::FactsCache,
    /// Provider: log requests per peer ([`logs::PEER_LOG_RATE`]); over it a peer gets `Busy`.
    log_rate: crate::net::ratelimit::RateLimiter<gridlease_protocol::PeerId>,
    /// Provider: answers waiting for a lease's store write (the first request and identical
    /// retries that came meanwhile).
    waiting: HashMap<LeaseId, Vec<oneshot::Sender<LeaseRpcResponse>>>,
}

impl Actor {
    async fn run(mut self) {
        loop {
            tokio::select! {
                biased;
                () = self.ctx.cancel.cancelled() => break,
                Some(id) = self.released.recv() => {
                    self.desk.release(&id);
                    self.publish_holds();
                }
                Some(done) = self.vets.join_next(), if !self.vets.is_empty() => match done {
                    Ok(v) => self.on_vetted(v),
                    Err(e) => tracing::error!(error = %e, "image check task failed"),
                },
                Some(done) = self.persists.join_next(), if !self.persists.is_empty() => match done {
                    Ok(p) => {
                        self.on_persisted(p);
                        self.publish_holds();
                    }
                    Err(e) => tracing::error!(error = %e, "lease write task failed"),
                },
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => match done {
                    Ok(end) => self.on_session_end(end),
                    Err(e) => tracing::error!(error = %e, "lease session task failed"),
                },
                cmd = self.cmds.recv() => match cmd {
                    Some(cmd) => self.on_cmd(cmd).await,
                    None => break,
                },
                msg = self.inbound.recv() => match msg {
                    Some(m) => self.on_inbound(m),
                    None => break,
                },
            }
        }
        self.tasks.shutdown().await;
        // Containers of live leases keep running across a restart; the teardown keeps the
        // egress fence for them and removes it otherwise.
        if let Some(sb) = &self.ctx.sandbox {
            egress::teardown(&self.ctx, sb).await;
        }
    }

    /// Publishes the desk's held GPUs (to [`capacity::run`]) when they changed.
    fn publish_holds(&self) {
        let held = self.desk.held_gpus();
        self.ctx.holds.send_if_modified(|cur| {
            let changed = *cur != held;
            *cur = held;
            changed
        });
    }

    fn on_session_end(&mut self, end: SessionEnd) {
        self.sessions.remove(&end.id);
        self.ctx.log_sweep.notify_one();
        if end.released {
            self.desk.release(&end.id);
            self.publish_holds();
            self.evict_images();
        } else if self.desk.holds(&end.id) && !self.ctx.cancel.is_cancelled() {
            tracing::error!(lease = %end.id, "the lease's container could not be removed: its GPUs stay held until the next start reconciles it");
        }
    }

    /// Provider: trims the image cache in the background, sparing the live leases' images.
    fn evict_images(&mut self) {
        let Some(sb) = self.ctx.sandbox.clone() else {
            return;
        };
        let in_use: std::collections::BTreeSet<String> = self
            .sessions
            .values()
            .map(|e| images::canonical(&e.view.borrow().image))
            .collect();
        let (store, limits) = (self.ctx.store.clone(), self.ctx.config.image_cache);
        tokio::spawn(async move {
            images::evict(&store, &sb, limits, &in_use).await;
        });
    }

    async fn on_cmd(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Register(stored, gpus_declared, reply) => {
                if !self.sessions.contains_key(&stored.lease.id) {
                    let rec = SessionRecord {
                        gpus_declared,
                        ..SessionRecord::default()
                    };
                    self.spawn(*stored, rec);
                }
                let _ = reply.send(());
            }
            Cmd::Views(reply) => {
                let v = self.sessions.values().map(|e| e.view.borrow().clone());
                let _ = reply.send(v.collect());
            }
            Cmd::Watch(id, reply) => {
                let _ = reply.send(self.sessions.get(&id).map(|e| e.view.clone()));
            }
            Cmd::Telemetry(id, reply) => {
                let ring = self.sessions.get(&id).and_then(|e| e.telemetry.as_ref());
                let _ = reply.send(ring.map(|(_, r)| r.clone()));
            }
            Cmd::ToSession(id, msg, reply) => {
                let ok = match self.sessions.get(&id) {
                    Some(e) => e.inbox.send(*msg).await.is_ok(),
                    None => false,
                };
                let _ = reply.send(ok);
            }
        }
    }

    fn on_inbound(&mut self, m: InboundLease) {
        let InboundLease {
            peer,
            request,
            reply,
        } = m;
        match request {
            InboundRequest::Propose(p) => self.on_propose(p, reply),
            InboundRequest::Session(request) => self.on_session(InboundSession {
                peer,
                request,
                reply: SessionReply(reply),
            }),
        }
    }

    /// Provider: a request arrived. Its image is checked first (before anything is signed):
    /// the reference against the offer's image rules, then what the daemon or the registry
    /// says about the image (cached, or asked in a bounded task); then the desk decides.
    fn on_propose(
        &mut self,
        p: Box<crate::net::Proposal>,
        reply: oneshot::Sender<LeaseRpcResponse>,
    ) {
        use gridlease_contracts::image::{admit, check_reference};
        let Some(cur) = p.offer.as_ref() else {
            return self.decide(&p, Ok(()), reply);
        };
        let terms = &p.verified.message.terms;
        let Ok(image) = check_reference(&cur.images, &terms.image) else {
            // The desk refuses it with the reference's own reason.
            return self.decide(&p, Ok(()), reply);
        };
        if let Some(f) = self.facts.get(&image.canonical()) {
            let cuda = images::host_cuda(&cur.offer, terms.gpu_count);
            let admitted = admit(&cur.images, &image, f, cuda.as_deref());
            return self.decide(&p, admitted, reply);
        }
        if self.vets.len() >= images::MAX_VETTING {
            let busy = gridlease_protocol::ImageRefusal::Unavailable {
                detail: "the provider is checking too many images now; try again shortly".into(),
            };
            return self.decide(&p, Err(busy), reply);
        }
        let (sandbox, policy) = (self.ctx.sandbox.clone(), cur.images.clone());
        self.vets.spawn(async move {
            let facts = images::facts(sandbox, image.clone(), &policy).await;
            Vetted {
                proposal: p,
                reply,
                image,
                facts,
            }
        });
    }

    fn on_vetted(&mut self, v: Vetted) {
        let Vetted {
            proposal,
            reply,
            image,
            facts,
        } = v;
        let admitted = match (&facts, proposal.offer.as_ref()) {
            (Ok(f), Some(cur)) => {
                let cuda = images::host_cuda(&cur.offer, proposal.verified.message.terms.gpu_count);
                gridlease_contracts::image::admit(&cur.images, &image, f, cuda.as_deref())
            }
            (Ok(_), None) => Ok(()),
            (Err(r), _) => Err(r.clone()),
        };
        if let Ok(f) = facts {
            self.facts.put(image.canonical(), f);
        }
        if let Err(r) = &admitted {
            tracing::info!(image = %image.canonical(), reason = ?r, "image refused before signing");
        }
        self.decide(&proposal, admitted, reply);
    }

    /// Provider: whether `renter` has a lease here whose container is (or is about to be) held
    /// for its uploads, its command not started.
    fn holds_uploads_for(&self, renter: &PublicKey) -> bool {
        let peer = renter.peer_id().ok();
        self.sessions.values().any(|e| {
            e.upload_hold
                && e.telemetry.as_ref().is_some_and(|(p, _)| *p == peer)
                && matches!(
                    e.view.borrow().state,
                    gridlease_contracts::LeaseState::Accepted
                        | gridlease_contracts::LeaseState::Starting
                )
        })
    }

    /// Provider: the desk decides; an accepted lease is stored before it is answered.
    fn decide(
        &mut self,
        p: &crate::net::Proposal,
        image: Result<(), gridlease_protocol::ImageRefusal>,
        reply: oneshot::Sender<LeaseRpcResponse>,
    ) {
        let (signed, verified, offer) = (&p.signed, &p.verified, p.offer.as_ref());
        let key = self.ctx.client.key();
        let network = self.ctx.client.network();
        let now = self.ctx.now();
        // One held container per renter: a held container keeps its GPUs from everyone, and
        // many of them from one renter would let it take the provider's GPUs for nothing.
        let terms = &verified.message.terms;
        if terms.upload_hold_s > 0 && self.holds_uploads_for(&verified.signer) {
            let lease_id = terms.lease_id().unwrap_or(LeaseId(Digest::default()));
            let _ = reply.send(crate::net::reject(
                key,
                network,
                lease_id,
                terms.nonce,
                gridlease_protocol::RejectReason::HoldBusy,
                now,
            ));
            return;
        }
        self.desk
            .set_owner_busy(self.ctx.owner_busy.borrow().clone());
        match self
            .desk
            .decide(key, network, offer, signed, verified, image, now)
        {
            desk::Decision::Respond(r) => {
                let _ = reply.send(r);
            }
            desk::Decision::Wait { lease_id } => {
                self.waiting.entry(lease_id).or_default().push(reply);
            }
            desk::Decision::Persist { stored, accept } => {
                self.waiting.entry(stored.lease.id).or_default().push(reply);
                let store = self.ctx.store.clone();
                // The offer the terms name, for the lease's statement: the one advertised now
                // (a request made from an earlier signature of it keeps none).
                let offer_bytes = offer
                    .filter(|o| o.id == stored.lease.terms.offer_id)
                    .and_then(|o| o.signed.to_bytes().ok());
                self.persists.spawn(async move {
                    let row = (*stored).clone();
                    // An identical lease already stored (a retry after a restart forgot its
                    // nonce) is answered with its stored acceptance, and not started again.
                    let result = store
                        .call(move |s| {
                            if s.insert_lease(&row)? {
                                if let Some(b) = &offer_bytes {
                                    s.put_lease_offer(&row.lease.id, b)?;
                                }
                                Ok(None)
                            } else {
                                s.lease(&row.lease.id)
                            }
                        })
                        .await;
                    Persisted {
                        stored,
                        accept,
                        result,
                    }
                });
            }
        }
    }

    fn on_persisted(&mut self, p: Persisted) {
        let Persisted {
            stored,
            accept,
            result,
        } = p;
        let id = stored.lease.id;
        let waiters = self.waiting.remove(&id).unwrap_or_default();
        let now = self.ctx.now();
        let (key, network) = (self.ctx.client.key(), self.ctx.client.network());
        let t = &stored.lease.terms;
        let response = match result {
            Ok(None) => {
                self.desk.persisted(&stored, accept.clone());
                tracing::info!(lease = %id.short(), gpus = stored.gpus.len(), "lease accepted");
                let rec = SessionRecord {
                    gpus_declared: self.ctx.config.base_template.as_ref().is_some_and(|t| {
                        t.gpus.iter().any(gridlease_protocol::OfferedGpu::declared)
                    }),
                    ..SessionRecord::default()
                };
                self.spawn(*stored, rec);
                LeaseRpcResponse::Accepted(accept)
            }
            Ok(Some(existing)) => {
                // Stored before: its own holds (if live) were restored at start.
                self.desk.persist_failed(&stored);
                match existing.accept.clone() {
                    Some(a) => {
                        if !existing.lease.state.is_terminal() {
                            self.desk.restore(&existing);
                        }
                        LeaseRpcResponse::Accepted(a)
                    }
                    None => {
                        crate::net::reject(key, network, id, t.nonce, RejectReason::Internal, now)
                    }
                }
            }
            Err(e) => {
                tracing::error!(lease = %id, error = %e, "cannot persist lease");
                self.desk.persist_failed(&stored);
                let reason = match e {
                    StoreError::NonceConflict { .. } => RejectReason::DuplicateNonce,
                    _ => RejectReason::Internal,
                };
                crate::net::reject(key, network, id, t.nonce, reason, now)
            }
        };
        for w in waiters {
            let _ = w.send(response.clone());
        }
    }

    fn on_session(&mut self, m: InboundSession) {
        if let SessionRequest::Telemetry { lease_id, after } = m.request {
            // Answered from the lease's ring, never by the session; only to its renter, while
            // it runs here; rate-limited with the log reads.
            if !self.log_rate.check(&m.peer, self.ctx.now()) {
                let _ = m.reply.send(SessionResponse::Busy);
                return;
            }
            let answer = match self
                .sessions
                .get(&lease_id)
                .and_then(|e| e.telemetry.as_ref())
            {
                Some((renter, ring)) if *renter == Some(m.peer) => {
                    SessionResponse::Telemetry(ring.after(after))
                }
                _ => SessionResponse::UnknownLease,
            };
            let _ = m.reply.send(answer);
            return;
        }
        if let SessionRequest::Logs {
            lease_id,
            offset,
            max,
        } = m.request
        {
            // Answered from the output file by a task of its own, never by the session; a
            // peer over its rate, or more readers than the pool, get `Busy` (renters retry).
            if !self.log_rate.check(&m.peer, self.ctx.now()) {
                let _ = m.reply.send(SessionResponse::Busy);
                return;
            }
            let Ok(permit) = self.ctx.log_reads.clone().try_acquire_owned() else {
                let _ = m.reply.send(SessionResponse::Busy);
                return;
            };
            let live = self
                .sessions
                .get(&lease_id)
                .map(|e| e.view.borrow().clone());
            let ctx = self.ctx.clone();
            tokio::spawn(async move {
                let r = logs::serve_renter(&ctx, live, m.peer, lease_id, offset, max).await;
                let _ = m.reply.send(r);
                drop(permit);
            });
            return;
        }
        if let SessionRequest::Complete(_) = m.request {
            // A settled lease's record: answered from the store, never by a session.
            if !self.log_rate.check(&m.peer, self.ctx.now()) {
                let _ = m.reply.send(SessionResponse::Busy);
                return;
            }
            let ctx = self.ctx.clone();
            tokio::spawn(async move {
                let r = completion::answer(&ctx, m.peer, &m.request).await;
                let _ = m.reply.send(r);
            });
            return;
        }
        let entry = m.request.lease_hint().and_then(|id| self.sessions.get(&id));
        if let (
            None,
            SessionRequest::Reports {
                lease_id,
                after_seq,
            },
        ) = (entry, &m.request)
        {
            // A finished lease's reports and close, from the store (a running one's session
            // answers, noting that its renter is back).
            if !self.log_rate.check(&m.peer, self.ctx.now()) {
                let _ = m.reply.send(SessionResponse::Busy);
                return;
            }
            let (ctx, lease_id, after_seq) = (self.ctx.clone(), *lease_id, *after_seq);
            tokio::spawn(async move {
                let r = provider::serve_reports(&ctx, m.peer, lease_id, after_seq).await;
                let over =
                    matches!(&r, SessionResponse::Reports(b) if b.close.is_some() && !b.more);
                let _ = m.reply.send(r);
                if over {
                    // A renter that was away at the settlement is back: the lease's record
                    // can be co-signed now (once).
                    completion::propose_stored(ctx, m.peer, lease_id).await;
                }
            });
            return;
        }
        match entry {
            Some(e) => {
                if let Err(mpsc::error::TrySendError::Full(SessionMsg::Inbound(m))) =
                    e.inbox.try_send(SessionMsg::Inbound(Box::new(m)))
                {
                    let _ = m.reply.send(SessionResponse::Busy);
                }
            }
            None => {
                if let SessionRequest::Close(_) = m.request {
                    // A renter that already settled (e.g. it gave up on a provider that then
                    // came back) still returns its last receipt, so both statements agree.
                    let ctx = self.ctx.clone();
                    tokio::spawn(async move {
                        let r = renter::answer_late_close(&ctx, m.peer, &m.request).await;
                        let _ = m.reply.send(r);
                    });
                } else {
                    let _ = m.reply.send(SessionResponse::UnknownLease);
                }
            }
        }
    }

    /// At start-up: reconciles containers with the live stored leases, holds the GPUs of the
    /// live provider leases and starts their sessions. Reads live leases only.
    async fn resume_all(&mut self) -> Result<(), LeaseError> {
        let live = self.ctx.store.call(|s| s.live_leases()).await?;
        if let Some(sb) = &self.ctx.sandbox {
            // Finished leases whose outputs are still kept stay too (expired ones go first).
            let mut keep = outputs::sweep(&self.ctx).await;
            keep.extend(
                live.iter()
                    .filter(|(l, _)| l.role == Role::Provider)
                    .map(|(l, _)| l.lease.id),
            );
            match sb.reconcile(&self.ctx.node_id, &keep).await {
                Ok(r) => tracing::info!(
                    removed = r.removed.len(),
                    kept = r.kept.len(),
                    missing = r.missing.len(),
                    "containers reconciled"
                ),
                Err(e) => tracing::warn!(error = %e, "container reconciliation failed"),
            }
            // After the containers: a workspace still mounted by one cannot be removed.
            let dir = self.ctx.workspace_dir();
            match sb
                .reconcile_workspaces(&dir, &self.ctx.node_id, &keep)
                .await
            {
                Ok(r) => tracing::info!(
                    removed = r.removed.len(),
                    kept = r.kept.len(),
                    "workspaces reconciled"
                ),
                Err(e) => tracing::warn!(error = %e, "workspace reconciliation failed"),
            }
            let egress = live.iter().any(|(l, _)| {
                l.role == Role::Provider && l.lease.terms.network_policy == NetworkPolicy::Egress
            });
            egress::reconcile(&self.ctx, sb, egress).await;
        }
        for (l, rec) in live {
            self.desk.restore(&l);
            self.spawn(l, rec);
        }
        Ok(())
    }

    fn spawn(&mut self, l: StoredLease, rec: SessionRecord) {
        let id = l.lease.id;
        let (inbox_tx, inbox) = mpsc::channel(SESSION_QUEUE);
        let initial = view::from_store(&l, &rec, self.ctx.now());
        let (view_tx, view_rx) = watch::channel(initial);
        let ctx = self.ctx.clone();
        let role = l.role;
        // A provider lease's telemetry: the session writes it, the service serves the renter.
        let ring = (role == Role::Provider).then(|| self.ctx.telemetry_ring(&l.gpus));
        let entry_ring = ring
            .clone()
            .map(|r| (l.lease.terms.renter.peer_id().ok(), r));
        let upload_hold_s = l.lease.terms.upload_hold_s;
        let span = tracing::info_span!("lease", lease = %id.short(), role = ?role);
        let fut = async move {
            // A ring exactly for provider leases.
            let released = match ring {
                Some(ring) => provider::run(ctx, l, rec, inbox, view_tx, ring).await,
                None => {
                    renter::run(ctx, l, rec, inbox, view_tx).await;
                    true
                }
            };
            SessionEnd { id, released }
        };
        self.tasks.spawn(tracing::Instrument::instrument(fut, span));
        let upload_hold = role == Role::Provider && upload_hold_s > 0;
        self.sessions.insert(
            id,
            Entry {
                inbox: inbox_tx,
                view: view_rx,
                telemetry: entry_ring,
                upload_hold,
            },
        );
    }
}

/// The counterparty's key of a lease seen from `role`.
pub(crate) fn counterparty(l: &StoredLease) -> PublicKey {
    match l.role {
        Role::Provider => l.lease.terms.renter,
        Role::Renter => l.lease.terms.provider,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rent_request_network_defaults_to_none_and_reads_lowercase_names() {
        let base = r#"{"offer":"x","gpus":1,"duration_s":60,"image":"i"}"#;
        let r: RentRequest = serde_json::from_str(base).unwrap();
        assert_eq!(r.network, NetworkPolicy::None);
        let with = |n: &str| base.replace('}', &format!(r#","network":"{n}"}}"#));
        let r: RentRequest = serde_json::from_str(&with("egress")).unwrap();
        assert_eq!(r.network, NetworkPolicy::Egress);
        let back = serde_json::to_value(&r).unwrap();
        assert_eq!(back["network"], "egress");
        let err = serde_json::from_str::<RentRequest>(&with("host")).unwrap_err();
        assert!(err.to_string().contains("not none or egress"), "{err}");
    }
}
