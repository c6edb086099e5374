//! The lease service's settings: [`LeaseServiceConfig`] (what tests and the daemon set),
//! [`SharedGpuSampler`] and the service's queue bounds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use gridlease_protocol::Digest;
use gridlease_sandbox::spec::ProviderLimits;

#[cfg(feature = "faults")]
use super::faults::Faults;
use crate::clock::{self, SharedClock};
use crate::net::OfferTemplate;

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
    /// again ([`super::owner`]).
    pub owner_idle: Duration,
    /// Provider: utilisation of an unleased offered GPU that means its owner uses it, percent
    /// (0: only compute processes count; [`super::owner`]).
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
    /// if this node is killed ([`super::watchdog`]). `None`: no watchdog; the node alone stops
    /// containers, while it runs.
    pub watchdog: Option<PathBuf>,
    /// How long a session waits for an answer from the other side.
    pub rpc_timeout: Duration,
    /// Provider: what answers renters' GPU checks (`None`: the offer has no verification
    /// window, and a lease with one fails its check).
    pub prover: Option<super::prover::SharedProver>,
    /// Provider: how often finished leases' kept outputs are checked for removal
    /// ([`OUTPUTS_SWEEP`], 10 s, in a daemon).
    pub outputs_sweep: Duration,
    /// How long, and how much of, finished leases' logs are kept ([`super::retention`]).
    pub log_retention: LogRetention,
    /// How often finished leases' logs are swept ([`super::retention::SWEEP`] in a daemon).
    pub logs_sweep: Duration,
    /// Provider: what volumes (issue 47) may take of this host.
    pub volumes: VolumeLimits,
    /// On-chain settlement (issue 50): the chain this node settles on and its wallet. A
    /// renter proposes it on offers naming the same chain and signs each receipt's voucher
    /// with the wallet; `None`: GLU only. (A provider advertises its chain in its offer
    /// template; it needs no key to check vouchers.)
    pub settlement: Option<ChainSettlement>,
    /// What sessions, silence detection and holds read as "now" ([`clock::SystemClock`] in a
    /// daemon; a [`clock::ManualClock`] in tests of grace periods and expiry).
    pub clock: SharedClock,
    /// Deliberate misbehaviour, for tests of the other side's defences only. Always
    /// [`Faults::default`] (none) in the daemon.
    /// Only with the `faults` feature (the tests'); a release build has no fault hooks.
    #[cfg(feature = "faults")]
    #[doc(hidden)]
    pub faults: Faults,
}

/// This node's on-chain settlement: the chain, its wallet's binding to the node's identity
/// (the possession signature over the node's key on its network) and the wallet key.
#[derive(Clone, Debug)]
pub struct ChainSettlement {
    /// The chain, token and contract.
    pub chain: gridlease_protocol::wallet::ChainTerms,
    /// The wallet's binding to this node.
    pub binding: gridlease_protocol::wallet::WalletBinding,
    /// The wallet key that signs vouchers.
    pub wallet: std::sync::Arc<gridlease_protocol::wallet::WalletKey>,
    /// The chain's JSON-RPC endpoint (`chain_rpc`): with it a renter opens or tops up its
    /// channel before a lease and reads the channel's epoch.
    pub rpc: Option<String>,
}

impl ChainSettlement {
    /// The settlement of `key`'s node on `network` with `wallet` on `chain`.
    pub fn new(
        chain: gridlease_protocol::wallet::ChainTerms,
        key: &gridlease_protocol::NodeKey,
        network: &gridlease_protocol::NetworkId,
        wallet: gridlease_protocol::wallet::WalletKey,
    ) -> Self {
        Self {
            chain,
            binding: gridlease_protocol::wallet::WalletBinding::possession(
                &key.public(),
                &wallet,
                network,
            ),
            wallet: std::sync::Arc::new(wallet),
            rpc: None,
        }
    }

    /// What a provider's offer says of it.
    pub fn offer(&self) -> gridlease_protocol::wallet::OfferSettlement {
        gridlease_protocol::wallet::OfferSettlement {
            chain: self.chain,
            wallet: self.binding.clone(),
        }
    }
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
            renter_grace_s: RENTER_GRACE_S,
            owner_idle: Duration::from_secs(OWNER_IDLE_S),
            owner_util_percent: BUSY_UTIL_PERCENT,
            start_allowance: Duration::from_secs(300),
            pull_stall: Duration::from_secs(120),
            pull_timeout: Duration::from_secs(1800),
            image_cache: gridlease_contracts::image::CacheLimits::default(),
            stop_grace: Duration::from_secs(2),
            watchdog: None,
            rpc_timeout: Duration::from_secs(10),
            prover: None,
            outputs_sweep: OUTPUTS_SWEEP,
            log_retention: LogRetention::default(),
            logs_sweep: LOGS_SWEEP,
            volumes: VolumeLimits::default(),
            settlement: None,
            clock: clock::system(),
            #[cfg(feature = "faults")]
            faults: Faults::default(),
        }
    }
}

/// What volumes may take of a provider's host (daemon settings `max_volumes`,
/// `reserve_disk_gib`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeLimits {
    /// Most volume leases at once.
    pub max_volumes: u32,
    /// GiB of disk never promised to volumes (the host's reserve and the lease logs').
    pub reserve_disk_gib: u64,
}

impl Default for VolumeLimits {
    fn default() -> Self {
        Self {
            max_volumes: 16,
            reserve_disk_gib: 10,
        }
    }
}

/// How often finished leases' logs are swept ([`super::retention`]).
pub const LOGS_SWEEP: Duration = Duration::from_secs(600);

/// How long finished leases' logs are kept, and how much of them at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRetention {
    /// A finished lease's logs go once they were last written this long ago.
    pub keep_for: Duration,
    /// Most bytes of all leases' logs; beyond it, finished leases' logs go, oldest first.
    pub max_bytes: u64,
}

impl Default for LogRetention {
    fn default() -> Self {
        Self {
            keep_for: Duration::from_secs(7 * 86_400),
            max_bytes: 2 << 30,
        }
    }
}

/// How often kept outputs are checked for removal (their time is stated to the second; they
/// may stay up to this much longer).
pub(crate) const OUTPUTS_SWEEP: Duration = Duration::from_secs(10);

/// Default utilisation at or above which a GPU no lease holds counts as in use by its owner,
/// percent (node setting `owner_util_percent`; 0: only compute processes count).
pub const BUSY_UTIL_PERCENT: u32 = 10;

/// The default of [`LeaseServiceConfig::renter_grace_s`] (and of the daemon's
/// `renter_grace_secs`): seconds a provider waits for a silent renter.
pub const RENTER_GRACE_S: u32 = 30;

/// The default of [`LeaseServiceConfig::owner_idle`], seconds (and of the daemon's
/// `owner_idle_secs`).
pub const OWNER_IDLE_S: u64 = 300;
