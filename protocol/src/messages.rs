//! Every wire message. All travel inside a [`crate::envelope::Signed`] envelope.
//!
//! Rules for this module: no floats (rates are integers in stated units), maps are `BTreeMap`,
//! amounts are integer micro-units (1 unit = 1_000_000 micro-units), times are
//! [`Timestamp`] (unix ms). Every message that could be replayed carries a lease id plus a
//! sequence number, or a nonce plus an expiry. Each message has a byte cap (`MAX_*_BYTES`) and a
//! shape check ([`Shape::check_shape`]) for counts and string lengths; market rules (prices,
//! expiry, monotonicity) live in `gridlease-contracts`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::envelope::{MessageKind, NetworkId, wire_message};
use crate::identity::PublicKey;
pub use crate::shape::{Shape, ShapeError};
use crate::shape::{max_count, max_len, non_empty, non_zero};
use crate::types::{Digest, LeaseId, OfferId, Timestamp};

/// Cap on an encoded [`Offer`].
pub const MAX_OFFER_BYTES: usize = 16 * 1024;
/// Cap on an encoded [`LeaseRequest`].
pub const MAX_LEASE_REQUEST_BYTES: usize = 48 * 1024;
/// Cap on an encoded [`LeaseAccept`] (the terms plus GPU assignment).
pub const MAX_LEASE_ACCEPT_BYTES: usize = 49 * 1024;
/// Cap on an encoded [`LeaseReject`].
pub const MAX_LEASE_REJECT_BYTES: usize = 1024;
/// Cap on an encoded [`UsageReport`].
pub const MAX_USAGE_REPORT_BYTES: usize = 1024;
/// Cap on an encoded [`PaymentReceipt`].
pub const MAX_PAYMENT_RECEIPT_BYTES: usize = 512;
/// Cap on an encoded [`LeaseClose`].
pub const MAX_LEASE_CLOSE_BYTES: usize = 1024;
/// Longest human sentence carried in a refusal or a start failure.
pub const MAX_DETAIL_LEN: usize = 256;
/// Cap on an encoded [`BenchReport`].
pub const MAX_BENCH_REPORT_BYTES: usize = 1024;
/// Cap on an encoded [`LeaseAmendment`] (at most 65 bytes: a 32-byte lease id and four
/// varints).
pub const MAX_LEASE_AMENDMENT_BYTES: usize = 256;
/// Cap on an encoded [`AmendAccept`] (at most 83 bytes: the amendment plus two times).
pub const MAX_AMEND_ACCEPT_BYTES: usize = 512;

/// Most GPUs one offer may list.
pub const MAX_GPUS_PER_OFFER: usize = 16;
/// Longest GPU model name.
pub const MAX_MODEL_LEN: usize = 64;
/// Longest driver / CUDA / tool version string.
pub const MAX_VERSION_LEN: usize = 32;
/// Longest region label.
pub const MAX_REGION_LEN: usize = 32;
/// Most dialable addresses in an offer.
pub const MAX_OFFER_ADDRS: usize = 8;
/// Longest address (a multiaddr in text form).
pub const MAX_ADDR_LEN: usize = 256;
/// Most image prefixes in a sandbox allow-list.
pub const MAX_IMAGE_PREFIXES: usize = 16;
/// Most registry hosts an offer names.
pub const MAX_OFFER_REGISTRIES: usize = 8;
/// Longest registry host (`host[:port]`) an offer names.
pub const MAX_REGISTRY_LEN: usize = 128;
/// Most local images an offer names.
pub const MAX_OFFER_LOCAL_IMAGES: usize = 8;
/// Longest image reference.
pub const MAX_IMAGE_LEN: usize = 256;
/// Most command arguments.
pub const MAX_ARGS: usize = 128;
/// Most bytes over all command arguments.
pub const MAX_COMMAND_BYTES: usize = 16 * 1024;
/// Most environment variables.
pub const MAX_ENV: usize = 64;
/// Most bytes over all environment keys and values.
pub const MAX_ENV_BYTES: usize = 16 * 1024;
/// Most GPU digests in an accept.
pub const MAX_ASSIGNED_GPUS: usize = MAX_GPUS_PER_OFFER;
/// Longest volume name.
pub const MAX_VOLUME_NAME_LEN: usize = 64;
/// Largest volume, GiB (the largest workspace a node makes: 64 TiB).
pub const MAX_VOLUME_GIB: u32 = 65_535;
/// Most volumes mounted into one lease.
pub const MAX_MOUNTS: usize = 4;
/// Longest mount path.
pub const MAX_MOUNT_PATH_LEN: usize = 128;

/// CUDA compute capability, e.g. 8.9 for Ada.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ComputeCapability {
    /// Major version.
    pub major: u8,
    /// Minor version.
    pub minor: u8,
}

/// One physical GPU as the provider describes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSpec {
    /// Marketing name, e.g. `NVIDIA GeForce RTX 4090`.
    pub model: String,
    /// Total memory in MiB.
    pub vram_mib: u32,
    /// SHA-256 of the NVML UUID: stable per card without revealing the UUID.
    pub uuid_digest: Digest,
    /// CUDA compute capability.
    pub compute_capability: ComputeCapability,
    /// Driver version string.
    pub driver_version: String,
    /// Highest CUDA version the driver supports.
    pub cuda_version: String,
    /// PCIe generation of the link.
    pub pcie_gen: u8,
    /// PCIe lanes.
    pub pcie_width: u8,
    /// Enforced power limit in watts.
    pub power_limit_w: u32,
}

impl Shape for GpuSpec {
    fn check_shape(&self) -> Result<(), ShapeError> {
        non_empty("gpu.model", &self.model)?;
        max_len("gpu.model", &self.model, MAX_MODEL_LEN)?;
        max_len("gpu.driver_version", &self.driver_version, MAX_VERSION_LEN)?;
        max_len("gpu.cuda_version", &self.cuda_version, MAX_VERSION_LEN)?;
        non_zero("gpu.vram_mib", u64::from(self.vram_mib))
    }
}

/// Whether benchmark numbers were measured by this node's benchmark or merely declared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Attestation {
    /// Produced by the node's own GPU benchmark (still self-reported: renters can re-measure).
    Measured,
    /// Typed in by the operator (`--dev-gpus`); shown to users as "unverified".
    Declared,
}

/// GPU benchmark results. Rates are integers: GFLOP/s and MB/s.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BenchReport {
    /// Dense fp32 GEMM, GFLOP/s (1 TFLOPS = 1000).
    pub fp32_gflops: u32,
    /// Dense fp16 GEMM with fp32 accumulate, GFLOP/s.
    pub fp16_gflops: u32,
    /// Device memory bandwidth (read + write), MB/s.
    pub device_mem_mbps: u32,
    /// Pinned host-to-device bandwidth, MB/s.
    pub h2d_mbps: u32,
    /// Name and version of the tool that produced the numbers.
    pub tool_version: String,
    /// When it ran.
    pub measured_at: Timestamp,
    /// Measured or declared.
    pub attestation: Attestation,
}

impl Shape for BenchReport {
    fn check_shape(&self) -> Result<(), ShapeError> {
        max_len("bench.tool_version", &self.tool_version, MAX_VERSION_LEN)
    }
}

/// A GPU in an offer, with its benchmark.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OfferedGpu {
    /// What the card is.
    pub spec: GpuSpec,
    /// How fast it is, and whether that was measured.
    pub bench: BenchReport,
}

impl OfferedGpu {
    /// Its numbers were typed in (`--dev-gpus`), not measured: no driver reports on it.
    pub fn declared(&self) -> bool {
        self.bench.attestation == Attestation::Declared
    }
}

/// Host resources that come with each leased GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ResourcesPerGpu {
    /// CPU in millicores (1000 = one core).
    pub cpu_millicores: u32,
    /// Memory in MiB.
    pub ram_mib: u32,
    /// Writable scratch disk in GiB.
    pub disk_gib: u32,
    /// Network bandwidth in Mbit/s (0 with network policy `None`).
    pub net_mbps: u32,
}

impl ResourcesPerGpu {
    /// True when every field is at most `other`'s.
    pub fn fits_within(&self, other: &Self) -> bool {
        self.cpu_millicores <= other.cpu_millicores
            && self.ram_mib <= other.ram_mib
            && self.disk_gib <= other.disk_gib
            && self.net_mbps <= other.net_mbps
    }
}

/// What network a tenant container gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum NetworkPolicy {
    /// No network at all.
    None,
    /// Outbound internet through a dedicated bridge; no LAN, no inter-container traffic.
    Egress,
}

/// The container runtime that isolates a provider's tenants.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Isolation {
    /// Docker's default runtime (runc): Linux namespaces, cgroups, seccomp; the tenant's
    /// system calls reach the host kernel (filtered by the seccomp profile).
    #[default]
    Runc,
    /// gVisor (`runsc`): an application kernel in user space answers the tenant's system
    /// calls; only a small filtered set reaches the host kernel.
    Gvisor,
}

impl Isolation {
    /// The name used in configuration, tables and query filters.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Gvisor => "gvisor",
        }
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Isolation {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "runc" => Ok(Self::Runc),
            "gvisor" | "runsc" => Ok(Self::Gvisor),
            other => Err(format!("unknown isolation {other:?} (runc or gvisor)")),
        }
    }
}

/// The provider's sandbox rules.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPolicy {
    /// Most network a lease may ask for.
    pub network: NetworkPolicy,
    /// Images allowed, as prefixes of the canonical reference (`docker.io/pytorch/`, see
    /// `gridlease_contracts::image`); empty means any image the provider's registries serve.
    pub image_prefixes: Vec<String>,
    /// Interactive access the renter may open while the lease runs (shell, exec, port
    /// forwarding over the lease's libp2p connection: [`crate::access`]).
    pub access: crate::access::AccessPolicy,
    /// The runtime tenants' containers run under.
    pub isolation: Isolation,
    /// Most seconds the provider keeps a finished lease's container (stopped) and
    /// `/workspace` when the renter asks (`LeaseTerms::output_retention_s`), so its outputs
    /// can still be downloaded (`gridlease cp`, `rent --download`); 0: never kept. Free.
    pub output_retention_s: u32,
    /// Most seconds the provider holds a lease's created container before starting its
    /// command, while the renter uploads into `/workspace` (`LeaseTerms::upload_hold_s`,
    /// `rent --upload`); 0: never held. Not billed: the lease clock starts with the command.
    pub upload_hold_s: u32,
    /// Registry hosts (`host[:port]`) the provider pulls tenants' images from. With
    /// `image_prefixes` and `local_images` it is the whole image policy a renter's node checks
    /// a name against before it asks (`gridlease_contracts::image::check_reference`).
    pub registries: Vec<String>,
    /// Images on the provider's machine (built or imported there, never pulled) tenants may
    /// run, as references.
    pub local_images: Vec<String>,
    /// Volumes this provider keeps for renters beyond any one lease ([`VolumeTerms`]).
    pub volumes: VolumePolicy,
}

/// What a provider offers in volumes: storage kept for a renter beyond any one lease, billed
/// per GiB-hour (issue 47).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumePolicy {
    /// Price per GiB-hour of a kept volume, micro-units; 0: this provider keeps no volumes.
    pub price_per_gib_hour: u64,
    /// Largest volume, GiB.
    pub max_gib: u32,
    /// Longest keep period of one volume lease (extensions included), seconds.
    pub max_keep_s: u32,
}

impl VolumePolicy {
    /// Whether the provider keeps volumes at all.
    pub fn offered(&self) -> bool {
        self.price_per_gib_hour > 0 && self.max_gib > 0 && self.max_keep_s > 0
    }
}

/// The volume a *volume lease* keeps (issue 47): storage on the provider that outlives any
/// one lease, billed per GiB-hour. A volume lease's terms have `volume: Some(..)`, no GPUs,
/// no image, command or environment; `duration_s` is the keep period (the volume is deleted
/// at its end, or when the renter stops paying), and the tariff counts `size_gib` where a
/// lease counts GPUs (`gridlease_contracts::billing::Tariff`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeTerms {
    /// The renter's name for it: 1-64 of `a-z`, `0-9`, `-`, `_`, `.`, not starting with a
    /// `-` or `.`; unique among the renter's live volumes on this provider.
    pub name: String,
    /// Size, GiB (1..=[`MAX_VOLUME_GIB`], at most the offer's `max_gib`).
    pub size_gib: u32,
    /// Price per GiB-hour, micro-units (at least the offer's).
    pub price_per_gib_hour: u64,
    /// A running lease of the same renter on this provider whose own `/workspace` becomes
    /// this volume (`gridlease stop LEASE --keep-disk`): that lease ends (the renter's stop,
    /// settled) and its workspace image is handed over before the volume's billing starts;
    /// `size_gib` is that workspace's size. `None`: a new, empty volume.
    pub adopts: Option<LeaseId>,
}

/// A volume mounted into a lease's container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// The volume lease (the same renter's, on the same provider, running).
    pub volume: LeaseId,
    /// Where the container sees it: an absolute, normalised path; `/workspace` puts it in
    /// place of the lease's own workspace (a lease resumed on its kept disk).
    pub path: String,
}

/// The system's own top directories: no volume is mounted at or beneath them.
pub const RESERVED_MOUNT_ROOTS: [&str; 15] = [
    "proc", "sys", "dev", "etc", "usr", "bin", "sbin", "lib", "lib32", "lib64", "tmp", "run",
    "var", "boot", "root",
];

/// [`mount_path_problem`]'s rule as an ECMA-262 pattern (for the control API's document:
/// it has a lookahead, which Rust's `regex` lacks), without the length bound.
pub fn mount_path_pattern() -> String {
    format!(
        "^/(?!(?:{})(?:/|$))[A-Za-z0-9_-][A-Za-z0-9._-]*(?:/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$",
        RESERVED_MOUNT_ROOTS.join("|")
    )
}

/// Whether `name` is a valid volume name (see [`VolumeTerms::name`]).
pub fn valid_volume_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_VOLUME_NAME_LEN
        && !name.starts_with(['-', '.'])
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
        })
}

/// Why a mount path is refused, if it is: it must be absolute and normalised (no empty or
/// trailing components, none starting with `.`: so no `.` or `..`), at most
/// [`MAX_MOUNT_PATH_LEN`] bytes, of `[A-Za-z0-9._-]` components, and not `/` or beneath the
/// system's own directories (`/proc`, `/sys`, `/dev`,
/// `/etc`, `/usr`, `/bin`, `/sbin`, `/lib*`, `/tmp`, `/run`, `/var`, `/boot`, `/root`).
pub fn mount_path_problem(path: &str) -> Option<String> {
    if path.len() > MAX_MOUNT_PATH_LEN {
        return Some(format!("longer than {MAX_MOUNT_PATH_LEN} bytes"));
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Some("not an absolute path".into());
    };
    if rest.is_empty() {
        return Some("the container's root cannot be a volume".into());
    }
    let parts: Vec<&str> = rest.split('/').collect();
    for c in &parts {
        if c.is_empty() || c.starts_with('.') {
            return Some(
                "not a normalised path (empty components, or ones starting with `.`)".into(),
            );
        }
        if !c
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Some(format!("{c:?}: only letters, digits, '.', '_' and '-'"));
        }
    }
    if RESERVED_MOUNT_ROOTS.contains(&parts[0]) {
        return Some(format!("/{} is the system's own", parts[0]));
    }
    None
}

impl SandboxPolicy {
    /// True when the canonical reference `image` is within the advertised prefixes.
    pub fn allows_image(&self, image: &str) -> bool {
        self.image_prefixes.is_empty() || self.image_prefixes.iter().any(|p| image.starts_with(p))
    }

    /// True when a lease asking for `wanted` is allowed.
    pub fn allows_network(&self, wanted: NetworkPolicy) -> bool {
        wanted <= self.network
    }
}

/// A provider's signed offer, gossiped to the whole network.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offer {
    /// The provider; must equal the envelope's signer.
    pub provider: PublicKey,
    /// Strictly increasing per provider; a higher sequence replaces every lower one.
    pub seq: u64,
    /// When it was signed.
    pub created_at: Timestamp,
    /// After this the offer is dead; providers re-announce before it.
    pub expires_at: Timestamp,
    /// The GPUs offered (1..=16); a lease takes some of them.
    pub gpus: Vec<OfferedGpu>,
    /// Host resources per leased GPU.
    pub per_gpu: ResourcesPerGpu,
    /// Asking price per GPU-hour, micro-units.
    pub price_per_gpu_hour: u64,
    /// Shortest lease accepted, seconds.
    pub min_duration_s: u32,
    /// Longest lease accepted, seconds.
    pub max_duration_s: u32,
    /// Minimum billed seconds of any lease.
    pub min_billed_s: u32,
    /// Seconds between usage reports.
    pub usage_interval_s: u32,
    /// Most seconds of usage the renter may owe before the provider stops the lease.
    pub pay_ahead_s: u32,
    /// Sandbox rules.
    pub sandbox: SandboxPolicy,
    /// Where to reach the provider (multiaddrs), possibly via a relay.
    pub addrs: Vec<String>,
    /// Free-form region label, e.g. `eu-west`.
    pub region: String,
    /// How many of `gpus` no lease held when this was signed: the provider re-signs its offer
    /// when a lease takes or frees one, so renters see what is free (0: fully rented). At
    /// most `gpus.len()`.
    pub free_gpus: u16,
    /// Whether a running lease may be stopped when the owner takes a leased GPU back (uses it,
    /// or the provider's offered hours end). Such a lease closes with reason `OwnerReclaimed`
    /// and is billed to the second it stopped. `false`: a running lease runs to its end.
    pub interruptible: bool,
    /// Proof of GPU: the unbilled verification window this provider grants, the backend that
    /// answers, its claimed rate (`crate::proof`).
    pub proof: crate::types::ProofPolicy,
    /// On-chain settlement (issue 50): the chain, token and channel contract this provider
    /// is paid through, and its wallet. `None`: GLU only.
    pub settlement: Option<crate::wallet::OfferSettlement>,
}

impl Shape for Offer {
    fn check_shape(&self) -> Result<(), ShapeError> {
        if self.gpus.is_empty() {
            return Err(ShapeError {
                field: "gpus",
                problem: "an offer lists at least one GPU".into(),
            });
        }
        max_count("gpus", self.gpus.len(), MAX_GPUS_PER_OFFER)?;
        for g in &self.gpus {
            g.spec.check_shape()?;
            g.bench.check_shape()?;
        }
        max_count(
            "sandbox.image_prefixes",
            self.sandbox.image_prefixes.len(),
            MAX_IMAGE_PREFIXES,
        )?;
        for p in &self.sandbox.image_prefixes {
            max_len("sandbox.image_prefixes", p, MAX_IMAGE_LEN)?;
        }
        max_count(
            "sandbox.registries",
            self.sandbox.registries.len(),
            MAX_OFFER_REGISTRIES,
        )?;
        for r in &self.sandbox.registries {
            max_len("sandbox.registries", r, MAX_REGISTRY_LEN)?;
        }
        max_count(
            "sandbox.local_images",
            self.sandbox.local_images.len(),
            MAX_OFFER_LOCAL_IMAGES,
        )?;
        for l in &self.sandbox.local_images {
            max_len("sandbox.local_images", l, MAX_IMAGE_LEN)?;
        }
        max_count("addrs", self.addrs.len(), MAX_OFFER_ADDRS)?;
        for a in &self.addrs {
            max_len("addrs", a, MAX_ADDR_LEN)?;
        }
        max_len("region", &self.region, MAX_REGION_LEN)?;
        if let Some(st) = &self.settlement {
            st.check_shape()?;
        }
        non_zero("usage_interval_s", u64::from(self.usage_interval_s))?;
        non_zero("max_duration_s", u64::from(self.max_duration_s))
    }
}

/// The terms of a lease. Proposed by the renter in a [`LeaseRequest`]; the provider signs the
/// identical terms in a [`LeaseAccept`]. Both signatures over the same terms make the lease;
/// its id is the hash of the canonical encoding of these terms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseTerms {
    /// Network the lease lives on.
    pub network: NetworkId,
    /// The offer taken.
    pub offer_id: OfferId,
    /// That offer's sequence number.
    pub offer_seq: u64,
    /// Who runs the container.
    pub provider: PublicKey,
    /// Who pays.
    pub renter: PublicKey,
    /// How many of the offer's GPUs.
    pub gpu_count: u16,
    /// Host resources per GPU asked for (at most the offer's).
    pub per_gpu: ResourcesPerGpu,
    /// Price per GPU-hour in micro-units (at least the offer's ask).
    pub price_per_gpu_hour: u64,
    /// Requested duration, seconds: the container is stopped at start + this.
    pub duration_s: u32,
    /// Minimum billed seconds (from the offer).
    pub min_billed_s: u32,
    /// Seconds between usage reports (from the offer).
    pub usage_interval_s: u32,
    /// Pay-ahead window, seconds: the most unpaid usage the provider tolerates.
    pub pay_ahead_s: u32,
    /// Seconds the provider waits for a silent renter before stopping.
    pub grace_s: u32,
    /// Most the renter will pay in total, micro-units; the provider stops at this.
    pub max_total: u64,
    /// Network access for the container.
    pub network_policy: NetworkPolicy,
    /// Container image reference.
    pub image: String,
    /// Command and arguments; empty runs the image's own entrypoint/cmd.
    pub command: Vec<String>,
    /// Environment variables.
    pub env: BTreeMap<String, String>,
    /// Renter's nonce; a request is idempotent by (renter, nonce).
    pub nonce: u64,
    /// When the renter made the request.
    pub created_at: Timestamp,
    /// Seconds the provider keeps the finished lease's container and workspace for the
    /// renter to download from (at most the offer's `output_retention_s`; 0: removed at the
    /// end). Signed by both: a promise.
    pub output_retention_s: u32,
    /// Seconds the provider holds the created container, its `/workspace` open to the
    /// renter's uploads, before it starts the command: until the renter says to begin
    /// ([`crate::SessionRequest::Begin`]) or this runs out (at most the offer's
    /// `upload_hold_s`; 0: started at once).
    pub upload_hold_s: u32,
    /// Seconds of usage the renter pays ahead of the provider's reports (an unattended
    /// lease): each receipt pays what is due plus this many seconds, capped at `max_total`, so
    /// the provider keeps running while the renter is offline until the prepaid time is used
    /// up. 0: in arrears (the provider carries at most `pay_ahead_s` on credit and stops a
    /// renter silent past `grace_s`); [`PREPAY_ALL`] or any value of at least `duration_s`:
    /// the whole budget at the first report.
    pub prepay_s: u32,
    /// Seconds of unbilled verification between the container's creation and its command,
    /// in which the renter runs its GPU check (`crate::proof`); at most the offer's
    /// `proof.window_s`. 0: no check (`rent --no-verify`, or a provider without one).
    pub verify_window_s: u32,
    /// `Some`: this is a volume lease (issue 47): it keeps this volume for `duration_s`, runs
    /// no container and holds no GPU (see [`VolumeTerms`]).
    pub volume: Option<VolumeTerms>,
    /// The renter's volumes on this provider mounted into this lease's container (at most
    /// [`MAX_MOUNTS`], distinct volumes and paths; none in a volume lease).
    pub mounts: Vec<VolumeMount>,
    /// On-chain settlement (issue 50), when the offer has it and the renter settles on the
    /// same chain, token and contract: every receipt then carries the renter's EIP-712
    /// voucher for its total. `None`: GLU only.
    pub settlement: Option<crate::wallet::LeaseSettlement>,
}

/// [`LeaseTerms::prepay_s`] for "the whole lease": the first receipt pays `max_total`.
pub const PREPAY_ALL: u32 = u32::MAX;

impl Shape for LeaseTerms {
    fn check_shape(&self) -> Result<(), ShapeError> {
        non_zero("duration_s", u64::from(self.duration_s))?;
        non_zero("usage_interval_s", u64::from(self.usage_interval_s))?;
        if let Some(st) = &self.settlement {
            st.check_shape()?;
        }
        if let Some(v) = &self.volume {
            return self.check_volume_shape(v);
        }
        non_zero("gpu_count", u64::from(self.gpu_count))?;
        max_count("gpu_count", usize::from(self.gpu_count), MAX_GPUS_PER_OFFER)?;
        max_count("mounts", self.mounts.len(), MAX_MOUNTS)?;
        for (i, m) in self.mounts.iter().enumerate() {
            if let Some(problem) = mount_path_problem(&m.path) {
                return Err(ShapeError {
                    field: "mounts",
                    problem: format!("{:?}: {problem}", m.path),
                });
            }
            if self.mounts[..i]
                .iter()
                .any(|o| o.volume == m.volume || o.path == m.path)
            {
                return Err(ShapeError {
                    field: "mounts",
                    problem: "a volume or a path is named twice".into(),
                });
            }
        }
        non_empty("image", &self.image)?;
        max_len("image", &self.image, MAX_IMAGE_LEN)?;
        max_count("command", self.command.len(), MAX_ARGS)?;
        let cmd_bytes: usize = self.command.iter().map(String::len).sum();
        if cmd_bytes > MAX_COMMAND_BYTES {
            return Err(ShapeError {
                field: "command",
                problem: format!("{cmd_bytes} bytes, at most {MAX_COMMAND_BYTES} allowed"),
            });
        }
        max_count("env", self.env.len(), MAX_ENV)?;
        let env_bytes: usize = self.env.iter().map(|(k, v)| k.len() + v.len()).sum();
        if env_bytes > MAX_ENV_BYTES {
            return Err(ShapeError {
                field: "env",
                problem: format!("{env_bytes} bytes, at most {MAX_ENV_BYTES} allowed"),
            });
        }
        for k in self.env.keys() {
            let valid = !k.is_empty()
                && !k.as_bytes()[0].is_ascii_digit()
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                return Err(ShapeError {
                    field: "env",
                    problem: format!("{k:?} is not a valid variable name"),
                });
            }
        }
        Ok(())
    }
}

impl LeaseTerms {
    /// A volume lease's shape: its volume valid, and nothing of a container.
    fn check_volume_shape(&self, v: &VolumeTerms) -> Result<(), ShapeError> {
        if !valid_volume_name(&v.name) {
            return Err(ShapeError {
                field: "volume.name",
                problem: format!(
                    "{:?}: 1-{MAX_VOLUME_NAME_LEN} of a-z, 0-9, '-', '_', '.', not starting with '-' or '.'",
                    v.name
                        .chars()
                        .take(MAX_VOLUME_NAME_LEN + 1)
                        .collect::<String>()
                ),
            });
        }
        if v.size_gib == 0 || v.size_gib > MAX_VOLUME_GIB {
            return Err(ShapeError {
                field: "volume.size_gib",
                problem: format!("{} GiB; 1 to {MAX_VOLUME_GIB}", v.size_gib),
            });
        }
        non_zero("volume.price_per_gib_hour", v.price_per_gib_hour)?;
        let container_free = self.gpu_count == 0
            && self.image.is_empty()
            && self.command.is_empty()
            && self.env.is_empty()
            && self.mounts.is_empty()
            && self.price_per_gpu_hour == 0
            && self.verify_window_s == 0
            && self.upload_hold_s == 0
            && self.output_retention_s == 0;
        if !container_free {
            return Err(ShapeError {
                field: "volume",
                problem: "a volume lease has no GPUs, image, command, environment, mounts, GPU check, upload hold or kept outputs".into(),
            });
        }
        Ok(())
    }

    /// Whether this is a volume lease.
    pub fn is_volume(&self) -> bool {
        self.volume.is_some()
    }
}

/// A renter's request: the proposed terms, valid until `expires_at`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRequest {
    /// The proposed terms.
    pub terms: LeaseTerms,
    /// The provider must not accept after this.
    pub expires_at: Timestamp,
}

impl Shape for LeaseRequest {
    fn check_shape(&self) -> Result<(), ShapeError> {
        self.terms.check_shape()
    }
}

/// The provider's acceptance: its signature over the same terms.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseAccept {
    /// Hash of the terms.
    pub lease_id: LeaseId,
    /// The terms, identical to the request's.
    pub terms: LeaseTerms,
    /// Which GPUs (UUID digests) the lease gets.
    pub gpus: Vec<Digest>,
    /// When the provider accepted; the lease clock starts when the container runs.
    pub accepted_at: Timestamp,
}

impl Shape for LeaseAccept {
    fn check_shape(&self) -> Result<(), ShapeError> {
        self.terms.check_shape()?;
        max_count("gpus", self.gpus.len(), MAX_ASSIGNED_GPUS)
    }
}

/// Which size of an image a cap is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageSize {
    /// The layers as stored in the registry (what a pull downloads).
    Compressed,
    /// The layers unpacked on the provider's disk.
    Unpacked,
}

/// Why a provider refuses an image. Decided before anything is signed, from the reference,
/// the provider's image policy and what the registry (or the local daemon) says about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageRefusal {
    /// The reference does not follow the image reference grammar.
    BadReference {
        /// What is wrong.
        detail: String,
    },
    /// A bare image id or digest: it names whatever the provider happens to hold.
    BareId,
    /// The registry is not one the provider allows.
    RegistryNotAllowed {
        /// The registry host (with port).
        registry: String,
    },
    /// A loopback, private, link-local or local-name registry host the provider did not list:
    /// the provider's Docker daemon would otherwise be made to connect into its own network.
    PrivateRegistry {
        /// The registry host (with port).
        registry: String,
    },
    /// The image is outside the repository prefixes the provider allows.
    NotListed,
    /// A local image that never came from a registry and that the provider did not list.
    LocalOnly,
    /// The image is larger than the provider's cap.
    TooLarge {
        /// Which size.
        size: ImageSize,
        /// Its size, bytes.
        bytes: u64,
        /// The cap, bytes.
        max: u64,
    },
    /// The image's own config sets `LD_PRELOAD` or `LD_AUDIT`.
    Preload,
    /// The image needs a newer CUDA than the provider's driver supports.
    CudaTooNew {
        /// What the image needs (`12.8`).
        needs: String,
        /// What the driver supports (`12.4`).
        host: String,
    },
    /// The registry does not have the image, or could not be asked.
    Unavailable {
        /// What the registry (or the connection) said.
        detail: String,
    },
}

impl ImageRefusal {
    fn check_shape(&self) -> Result<(), ShapeError> {
        match self {
            Self::BadReference { detail: d }
            | Self::RegistryNotAllowed { registry: d }
            | Self::PrivateRegistry { registry: d }
            | Self::Unavailable { detail: d } => max_len("refusal", d, MAX_DETAIL_LEN),
            Self::CudaTooNew { needs, host } => {
                max_len("refusal.needs", needs, MAX_VERSION_LEN)?;
                max_len("refusal.host", host, MAX_VERSION_LEN)
            }
            _ => Ok(()),
        }
    }
}

/// What went wrong when the provider tried to start an accepted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StartFailureKind {
    /// The provider has no container runtime.
    NoSandbox,
    /// The image pull failed (the registry's or the daemon's message follows).
    ImagePull,
    /// The pull made no progress for the provider's stall limit.
    PullStalled,
    /// The pull ran past the provider's pull timeout.
    PullTimeout,
    /// The image was refused once pulled (size, config).
    ImageRefused,
    /// The container could not be created.
    Create,
    /// The container could not be started.
    Start,
    /// The provider's own bookkeeping failed (its database).
    Internal,
}

/// A start failure: its kind and one human sentence (bounded), for the renter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartFailure {
    /// What failed.
    pub kind: StartFailureKind,
    /// What the provider saw, in words (at most [`MAX_DETAIL_LEN`] bytes).
    pub message: String,
}

impl StartFailure {
    /// A failure whose message is cut to [`MAX_DETAIL_LEN`] bytes at a character boundary.
    pub fn new(kind: StartFailureKind, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if message.len() > MAX_DETAIL_LEN {
            let mut end = MAX_DETAIL_LEN - 3;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push_str("...");
        }
        Self { kind, message }
    }
}

/// Why a provider refused a request. Machine-readable; the CLI prints each one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RejectReason {
    /// The provider holds no such offer.
    UnknownOffer,
    /// The offer was replaced; the current sequence is given.
    StaleOffer {
        /// The provider's current sequence.
        current_seq: u64,
    },
    /// The offer expired.
    OfferExpired,
    /// The request itself expired before it was handled.
    RequestExpired,
    /// The terms name another provider.
    WrongProvider,
    /// The price is below the ask.
    PriceBelowAsk {
        /// The ask per GPU-hour, micro-units.
        ask: u64,
    },
    /// Not enough free GPUs.
    NoCapacity {
        /// GPUs free now.
        free: u16,
    },
    /// Duration outside the offer's bounds.
    DurationOutOfBounds {
        /// Shortest accepted.
        min_s: u32,
        /// Longest accepted.
        max_s: u32,
    },
    /// Terms that differ from the offer (interval, window, minimum billing, resources).
    TermsMismatch {
        /// The offending field.
        field: String,
    },
    /// The provider refuses the image (policy, size, CUDA, availability), before signing.
    ImageRefused {
        /// Why.
        refusal: ImageRefusal,
    },
    /// The renter set an environment variable the provider controls or forbids.
    EnvNotAllowed {
        /// The variable.
        name: String,
    },
    /// The sandbox policy does not allow this network access.
    NetworkNotAllowed,
    /// The budget cap cannot pay even the minimum billed time.
    BudgetTooSmall {
        /// The cost of the minimum billed time.
        needed: u64,
    },
    /// The renter reused a nonce for different terms.
    DuplicateNonce,
    /// The request is structurally invalid.
    Malformed {
        /// What is wrong.
        detail: String,
    },
    /// The provider failed internally; try another offer.
    Internal,
    /// The renter already has a container held for its uploads here (`upload_hold_s`) whose
    /// command has not started: one at a time per renter.
    HoldBusy,
    /// A volume lease, or a lease's volume mounts, refused (issue 47).
    VolumeRefused {
        /// Why.
        refusal: VolumeRefusal,
    },
}

/// Why a provider refuses a volume lease or a lease's volume mounts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeRefusal {
    /// This provider keeps no volumes (its offer's volume price is 0).
    NotOffered,
    /// Larger than the offer's largest volume.
    TooLarge {
        /// The largest, GiB.
        max_gib: u32,
    },
    /// A keep period longer than the offer allows.
    KeepTooLong {
        /// The longest, seconds.
        max_s: u32,
    },
    /// Not enough free disk for it now.
    NoSpace {
        /// GiB free for volumes now.
        free_gib: u64,
    },
    /// The provider keeps as many volumes as it will.
    TooMany {
        /// Its most.
        max: u32,
    },
    /// The renter has a live volume of this name here already.
    NameTaken,
    /// A mounted volume is not a running volume lease of this renter on this provider (or
    /// it is ending): the same answer whoever asks, so a stranger learns nothing.
    NotYours {
        /// The volume asked for.
        volume: LeaseId,
    },
    /// A mounted volume is mounted in another lease now.
    InUse {
        /// The volume.
        volume: LeaseId,
    },
    /// A mounted volume's keep period ends before this lease would.
    EndsTooSoon {
        /// The volume.
        volume: LeaseId,
    },
    /// The lease whose `/workspace` should become the volume (`VolumeTerms::adopts`) is not
    /// a running lease of this renter here with a workspace of its own (or another volume
    /// takes it already): the same answer whoever asks.
    NotAdoptable {
        /// The lease named.
        lease: LeaseId,
    },
}

/// The provider's refusal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseReject {
    /// The id the terms would have had.
    pub lease_id: LeaseId,
    /// The request's nonce, echoed.
    pub nonce: u64,
    /// Why.
    pub reason: RejectReason,
    /// When.
    pub at: Timestamp,
}

impl Shape for LeaseReject {
    fn check_shape(&self) -> Result<(), ShapeError> {
        match &self.reason {
            RejectReason::TermsMismatch { field: d }
            | RejectReason::Malformed { detail: d }
            | RejectReason::EnvNotAllowed { name: d } => max_len("reason", d, MAX_DETAIL_LEN),
            RejectReason::ImageRefused { refusal } => refusal.check_shape(),
            _ => Ok(()),
        }
    }
}

/// Provider-signed metered usage. Totals are cumulative since the container started, so a
/// lost report loses nothing; per-interval fields describe `[interval_start, interval_end)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageReport {
    /// The lease.
    pub lease_id: LeaseId,
    /// 1, 2, 3, ... strictly increasing.
    pub seq: u64,
    /// Start of the interval.
    pub interval_start: Timestamp,
    /// End of the interval.
    pub interval_end: Timestamp,
    /// Wall-clock milliseconds the container has run, cumulative.
    pub wall_ms: u64,
    /// GPU-milliseconds (wall x leased GPUs), cumulative.
    pub gpu_ms: u64,
    /// CPU-milliseconds consumed, cumulative.
    pub cpu_ms: u64,
    /// GPU energy in millijoules, cumulative.
    pub energy_mj: u64,
    /// Network bytes received, cumulative.
    pub net_rx_bytes: u64,
    /// Network bytes sent, cumulative.
    pub net_tx_bytes: u64,
    /// Mean GPU utilization over the interval, per mille.
    pub gpu_util_permille: u16,
    /// Peak VRAM used in the interval, MiB.
    pub vram_peak_mib: u32,
    /// Peak container memory in the interval, MiB.
    pub mem_peak_mib: u32,
    /// What the provider computes as due in total, micro-units; the renter recomputes it.
    pub amount_due: u64,
    /// Set once the container has exited.
    pub exit_code: Option<i32>,
}

impl Shape for UsageReport {
    fn check_shape(&self) -> Result<(), ShapeError> {
        non_zero("seq", self.seq)?;
        if self.interval_end < self.interval_start {
            return Err(ShapeError {
                field: "interval_end",
                problem: "before interval_start".into(),
            });
        }
        if self.gpu_util_permille > 1000 {
            return Err(ShapeError {
                field: "gpu_util_permille",
                problem: format!("{} is over 1000", self.gpu_util_permille),
            });
        }
        Ok(())
    }
}

/// Renter-signed, cumulative payment: "I owe you `total_paid` for this lease".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentReceipt {
    /// The lease.
    pub lease_id: LeaseId,
    /// 1, 2, 3, ... strictly increasing.
    pub seq: u64,
    /// Cumulative amount, micro-units; strictly increasing.
    pub total_paid: u64,
    /// Cumulative wall-clock milliseconds of usage this amount covers.
    pub covers_wall_ms: u64,
    /// The usage report this answers.
    pub usage_seq: u64,
    /// When the renter signed it.
    pub issued_at: Timestamp,
    /// On a lease settled on chain: the renter wallet's EIP-712 signature (65 bytes) of the
    /// voucher for `total_paid` ([`crate::wallet::LeaseSettlement::voucher`]), which the
    /// channel contract redeems. `None` on a GLU-only lease.
    #[serde(with = "serde_bytes")]
    pub voucher: Option<Vec<u8>>,
}

impl Shape for PaymentReceipt {
    fn check_shape(&self) -> Result<(), ShapeError> {
        if let Some(v) = &self.voucher
            && v.len() != crate::wallet::SIGNATURE_LEN
        {
            return Err(ShapeError {
                field: "voucher",
                problem: format!("{} bytes, a signature is 65", v.len()),
            });
        }
        non_zero("seq", self.seq)
    }
}

/// Why a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CloseReason {
    /// The requested duration ran out.
    Expired,
    /// The renter asked to stop.
    RenterStop,
    /// The provider's operator stopped it.
    ProviderStop,
    /// The container exited by itself.
    ContainerExited,
    /// Receipts fell behind usage by more than the pay-ahead window.
    PaymentLagging,
    /// The renter stopped answering for longer than the grace period.
    RenterUnreachable,
    /// The provider stopped reporting usage.
    ProviderUnreachable,
    /// The provider reported usage the renter found implausible.
    ImplausibleUsage,
    /// The renter sent an invalid receipt.
    BadReceipt,
    /// The renter's budget cap was reached.
    BudgetExhausted,
    /// The container could not be started.
    StartFailed,
    /// The provider's owner took a leased GPU back (started using it, or the offered hours
    /// ended) and the offer said leases are interruptible (`Offer::interruptible`). Billed to
    /// the second it stopped, like any stop.
    OwnerReclaimed,
    /// The renter's GPU check (`crate::proof`) failed in the unbilled verification window:
    /// nothing is billed, and it is the provider's fault.
    GpuCheckFailed,
}

impl CloseReason {
    /// Every reason, in declaration order.
    pub const ALL: [Self; 13] = [
        Self::Expired,
        Self::RenterStop,
        Self::ProviderStop,
        Self::ContainerExited,
        Self::PaymentLagging,
        Self::RenterUnreachable,
        Self::ProviderUnreachable,
        Self::ImplausibleUsage,
        Self::BadReceipt,
        Self::BudgetExhausted,
        Self::StartFailed,
        Self::OwnerReclaimed,
        Self::GpuCheckFailed,
    ];
}

/// Either side closing a lease. Idempotent: closing a closed lease changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseClose {
    /// The lease.
    pub lease_id: LeaseId,
    /// Why.
    pub reason: CloseReason,
    /// When.
    pub at: Timestamp,
    /// The container's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Why the start failed, with `reason` [`CloseReason::StartFailed`].
    pub failure: Option<StartFailure>,
}

impl Shape for LeaseClose {
    fn check_shape(&self) -> Result<(), ShapeError> {
        match &self.failure {
            Some(f) => max_len("failure.message", &f.message, MAX_DETAIL_LEN),
            None => Ok(()),
        }
    }
}

/// A renter's proposed amendment of a running lease's terms: a longer duration, and the budget
/// cap that goes with it. Everything else in the terms stays; the lease id stays the hash of
/// the original terms. Amendments of one lease are numbered 1, 2, ...; the provider accepts
/// each by signing the identical amendment in an [`AmendAccept`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseAmendment {
    /// The lease.
    pub lease_id: LeaseId,
    /// 1 for the first amendment of the lease, then 2, 3, ...
    pub seq: u64,
    /// The new duration, seconds from the container's start (longer than the current one).
    pub duration_s: u32,
    /// The new budget cap, micro-units (not below the current one).
    pub max_total: u64,
    /// When the renter made it.
    pub created_at: Timestamp,
}

impl Shape for LeaseAmendment {
    fn check_shape(&self) -> Result<(), ShapeError> {
        non_zero("seq", self.seq)?;
        non_zero("duration_s", u64::from(self.duration_s))
    }
}

/// The provider's acceptance of an amendment: its signature over the identical amendment, and
/// the container's new deadline by its clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AmendAccept {
    /// The amendment, identical to the renter's.
    pub amendment: LeaseAmendment,
    /// The container is stopped at this time now (its start + the new duration).
    pub deadline: Timestamp,
    /// When the provider accepted.
    pub accepted_at: Timestamp,
}

impl Shape for AmendAccept {
    fn check_shape(&self) -> Result<(), ShapeError> {
        self.amendment.check_shape()
    }
}

/// Why a provider refuses an amendment. Nothing changed on either side when one is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AmendRefusal {
    /// The lease is not running (not started yet, or over): only a running lease is extended.
    NotRunning {
        /// Its state, in words (`starting`, `closing`, ...; at most 32 bytes).
        state: String,
    },
    /// The deadline is too close: the container is already being stopped.
    TooLate {
        /// The current deadline.
        deadline: Timestamp,
    },
    /// The sequence is not the next one (a replayed or skipped amendment).
    BadSequence {
        /// The sequence the next amendment must have.
        expected: u64,
    },
    /// The new duration is not longer than the current one.
    NotLonger {
        /// The current duration, seconds.
        current_s: u32,
    },
    /// The new duration is beyond what the provider offers.
    BeyondMaxDuration {
        /// The longest lease the provider's offer allows, seconds.
        max_s: u32,
    },
    /// The new budget cap is below the current one.
    BudgetLowered {
        /// The current cap, micro-units.
        current: u64,
    },
    /// The provider no longer offers the lease's GPUs, so it does not commit them for longer.
    NotOffered,
    /// The amendment's signature does not verify, or it is not signed by the lease's renter.
    BadSignature,
    /// The amendment is structurally invalid.
    Malformed {
        /// What is wrong (at most [`MAX_DETAIL_LEN`] bytes).
        detail: String,
    },
    /// The provider could not record the amendment; nothing changed.
    Internal,
}

impl Shape for AmendRefusal {
    fn check_shape(&self) -> Result<(), ShapeError> {
        match self {
            Self::NotRunning { state } => max_len("refusal.state", state, 32),
            Self::Malformed { detail } => max_len("refusal.detail", detail, MAX_DETAIL_LEN),
            _ => Ok(()),
        }
    }
}

wire_message!(Offer, MessageKind::Offer, MAX_OFFER_BYTES);
wire_message!(
    LeaseRequest,
    MessageKind::LeaseRequest,
    MAX_LEASE_REQUEST_BYTES
);
wire_message!(
    LeaseAccept,
    MessageKind::LeaseAccept,
    MAX_LEASE_ACCEPT_BYTES
);
wire_message!(
    LeaseReject,
    MessageKind::LeaseReject,
    MAX_LEASE_REJECT_BYTES
);
wire_message!(
    UsageReport,
    MessageKind::UsageReport,
    MAX_USAGE_REPORT_BYTES
);
wire_message!(
    PaymentReceipt,
    MessageKind::PaymentReceipt,
    MAX_PAYMENT_RECEIPT_BYTES
);
wire_message!(LeaseClose, MessageKind::LeaseClose, MAX_LEASE_CLOSE_BYTES);
wire_message!(
    BenchReport,
    MessageKind::BenchReport,
    MAX_BENCH_REPORT_BYTES
);
wire_message!(
    LeaseAmendment,
    MessageKind::LeaseAmendment,
    MAX_LEASE_AMENDMENT_BYTES
);
wire_message!(
    AmendAccept,
    MessageKind::AmendAccept,
    MAX_AMEND_ACCEPT_BYTES
);

impl LeaseTerms {
    /// The lease's disk (its `/workspace`), bytes: the per-GPU disk times the GPUs (one unit
    /// for a CPU-only lease); a volume lease's: the volume's size.
    pub fn workspace_bytes(&self) -> u64 {
        if let Some(v) = &self.volume {
            return u64::from(v.size_gib).saturating_mul(1 << 30);
        }
        u64::from(self.per_gpu.disk_gib)
            .saturating_mul(u64::from(self.gpu_count.max(1)))
            .saturating_mul(1 << 30)
    }

    /// The canonical encoding: what the lease id hashes.
    pub fn canonical_bytes(&self) -> Result<Vec<u8>, crate::codec::CodecError> {
        crate::codec::encode::<Self, MAX_LEASE_REQUEST_BYTES>(self)
    }

    /// The lease id: SHA-256 over the domain tag and the canonical term bytes.
    pub fn lease_id(&self) -> Result<LeaseId, crate::codec::CodecError> {
        Ok(LeaseId(Digest::of(
            "gridlease/v1/lease-terms",
            &self.canonical_bytes()?,
        )))
    }
}

#[cfg(test)]
mod close_reason_tests {
    use super::CloseReason;

    /// Each reason's place in [`CloseReason::ALL`]; a new variant fails to compile here until
    /// it is placed, and the test below then fails until `ALL` lists it.
    fn place(r: CloseReason) -> usize {
        use CloseReason as R;
        match r {
            R::Expired => 0,
            R::RenterStop => 1,
            R::ProviderStop => 2,
            R::ContainerExited => 3,
            R::PaymentLagging => 4,
            R::RenterUnreachable => 5,
            R::ProviderUnreachable => 6,
            R::ImplausibleUsage => 7,
            R::BadReceipt => 8,
            R::BudgetExhausted => 9,
            R::StartFailed => 10,
            R::OwnerReclaimed => 11,
            R::GpuCheckFailed => 12,
        }
    }

    #[test]
    fn all_lists_every_reason_once_in_order() {
        for (i, r) in CloseReason::ALL.into_iter().enumerate() {
            assert_eq!(place(r), i, "{r:?}");
        }
    }
}

#[cfg(test)]
mod volume_tests {
    use super::*;

    #[test]
    fn volume_names_are_plain_lowercase_words() {
        for ok in ["data", "ckpt-2", "a.b_c", "0"] {
            assert!(valid_volume_name(ok), "{ok}");
        }
        let long = "a".repeat(MAX_VOLUME_NAME_LEN + 1);
        for bad in ["", "Data", "-x", ".x", "a/b", "a b", long.as_str()] {
            assert!(!valid_volume_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn mount_paths_are_absolute_normalised_and_not_the_systems() {
        for ok in ["/data", "/workspace", "/mnt/ckpt", "/home/user/x-1.d"] {
            assert_eq!(mount_path_problem(ok), None, "{ok}");
        }
        for bad in [
            "", "data", "/", "/data/", "/a//b", "/a/../b", "/./a", "/.cache", "/proc", "/proc/x",
            "/etc", "/dev/shm", "/usr/lib", "/tmp", "/a b", "/a\0b", "/lib64/x",
        ] {
            assert!(mount_path_problem(bad).is_some(), "{bad:?}");
        }
        let long = format!("/{}", "a".repeat(MAX_MOUNT_PATH_LEN));
        assert!(mount_path_problem(&long).is_some());
    }

    #[test]
    fn a_lease_mounts_each_volume_once_at_distinct_paths() {
        let key = crate::NodeKey::from_secret([3; 32]);
        let offer = crate::fixtures::offer(key.public(), 1, 1, 1);
        let mut t =
            crate::fixtures::terms(crate::OfferId(Digest([0; 32])), &offer, key.public(), 1, 60);
        let (a, b) = (LeaseId(Digest([1; 32])), LeaseId(Digest([2; 32])));
        let m = |volume, path: &str| VolumeMount {
            volume,
            path: path.into(),
        };
        t.mounts = vec![m(a, "/data"), m(b, "/workspace")];
        assert!(t.check_shape().is_ok());
        t.mounts = vec![m(a, "/data"), m(a, "/other")];
        assert!(t.check_shape().is_err());
        t.mounts = vec![m(a, "/data"), m(b, "/data")];
        assert!(t.check_shape().is_err());
        t.mounts = vec![m(a, "/etc/x")];
        assert!(t.check_shape().is_err());
        t.mounts = (0..=MAX_MOUNTS as u8)
            .map(|i| m(LeaseId(Digest([i; 32])), &format!("/v{i}")))
            .collect();
        assert!(t.check_shape().is_err());
    }
}

#[cfg(test)]
mod mount_pattern_tests {
    use super::*;

    /// The pattern without its lookahead, and the lookahead's names: together the rule.
    #[test]
    fn the_mount_path_pattern_states_the_rule() {
        let p = mount_path_pattern();
        let look = format!("(?!(?:{})(?:/|$))", RESERVED_MOUNT_ROOTS.join("|"));
        assert!(p.contains(&look), "{p}");
        let rest = p.replace(&look, "");
        let plain = regex_lite_free(&rest);
        for path in [
            "/data",
            "/workspace",
            "/mnt/x",
            "/a_b/c-d.e",
            "/",
            "",
            "data",
            "/data/",
            "/a//b",
            "/.x",
            "/a/..",
            "/a b",
            "/etc",
            "/etc/x",
            "/etcetera",
            "/proc",
            "/x/proc",
        ] {
            let reserved = path
                .strip_prefix('/')
                .and_then(|r| r.split('/').next())
                .is_some_and(|c| RESERVED_MOUNT_ROOTS.contains(&c));
            assert_eq!(
                mount_path_problem(path).is_none(),
                plain(path) && !reserved,
                "{path:?}"
            );
        }
    }

    /// A matcher of `^/C(?:/C)*$` with `C = [A-Za-z0-9_-][A-Za-z0-9._-]*`, the pattern's shape
    /// (checked to be exactly that), written out (the protocol crate has no regex engine).
    fn regex_lite_free(p: &str) -> impl Fn(&str) -> bool {
        assert_eq!(
            p,
            "^/[A-Za-z0-9_-][A-Za-z0-9._-]*(?:/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$"
        );
        |s: &str| {
            let Some(rest) = s.strip_prefix('/') else {
                return false;
            };
            rest.split('/').all(|c| {
                let mut b = c.bytes();
                matches!(b.next(), Some(f) if f.is_ascii_alphanumeric() || f == b'_' || f == b'-')
                    && b.all(|x| x.is_ascii_alphanumeric() || matches!(x, b'.' | b'_' | b'-'))
            })
        }
    }
}
