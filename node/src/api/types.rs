//! JSON bodies of the control API, shared by the daemon and the CLI. Field names are stable:
//! scripts read them through `--json`.

use serde::{Deserialize, Serialize};

/// API version prefix.
pub const API_PREFIX: &str = "/v1";

/// The error body of every route: an RFC 9457 problem (see [`super::problem`]).
pub use super::problem::Problem;

/// `GET /v1/status`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StatusView {
    /// This node's peer id.
    pub peer_id: String,
    /// The address of its settlement wallet (`<home>/wallet.key`, EIP-55). No chain is
    /// configured yet: leases settle in GLU.
    #[serde(default)]
    pub wallet: String,
    /// The network it is on.
    pub network: String,
    /// Crate version.
    pub version: String,
    /// Seconds since the daemon started.
    pub uptime_s: u64,
    /// Addresses the node listens on.
    pub listen_addrs: Vec<String>,
    /// Peers connected now.
    pub connected_peers: usize,
    /// Offers in the local book.
    pub offers_known: usize,
    /// Stored offers still to be checked and restored into the book after a restart (the
    /// node answers meanwhile; searches see what is restored so far); null once done.
    #[serde(default)]
    pub offers_restoring: Option<u64>,
    /// Reachability as observed by AutoNAT v2 dial-backs (never what was configured):
    /// `public` (a server dialed one of its addresses back), `private` (every dial-back
    /// failed: behind a NAT or firewall; reached through a relay or a hole punch) or
    /// `unknown` (no verdict yet).
    pub nat_status: String,
    /// Addresses AutoNAT servers dialed back.
    #[serde(default)]
    pub reachable_addrs: Vec<String>,
    /// Addresses whose AutoNAT dial-back failed.
    #[serde(default)]
    pub unreachable_addrs: Vec<String>,
    /// Confirmed external addresses: configured ones, AutoNAT-confirmed ones, and the
    /// relayed (`/p2p-circuit`) addresses of accepted reservations.
    #[serde(default)]
    pub external_addrs: Vec<String>,
    /// Relays (peer ids) holding a reservation for this node.
    #[serde(default)]
    pub relays: Vec<String>,
    /// This node's own offer, if it provides.
    pub own_offer: Option<OwnOfferView>,
    /// Images pulled for leases and kept cached, with the cache's bounds.
    #[serde(default)]
    pub image_cache: ImageCacheView,
    /// The hours this node offers its GPUs (`provide --hours`), when it provides; absent
    /// before the first `provide`.
    #[serde(default)]
    pub schedule: Option<ScheduleView>,
    /// The volumes this node keeps for renters now (issue 47), soonest deleted first.
    #[serde(default)]
    pub kept_volumes: Vec<KeptVolumeView>,
}

/// A volume a provider keeps for a renter.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct KeptVolumeView {
    /// Its volume lease (64 hex digits).
    pub lease_id: String,
    /// The renter's name for it.
    pub name: String,
    /// The renter's peer id.
    pub renter: String,
    /// Size, GiB.
    pub size_gib: u32,
    /// Its state (`running`: kept).
    pub state: String,
    /// What the renter's receipts cover of the time kept, micro-units.
    pub paid: u64,
    /// What the renter has signed for, micro-units (ahead of the time kept when prepaid).
    pub authorised: u64,
    /// Seconds until its keep period ends and it is deleted.
    pub time_left_s: Option<u64>,
}

/// The provider's availability schedule now.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleView {
    /// The windows (`22:00-08:00,12:00-13:00`), or `always`.
    pub hours: String,
    /// The time zone they are in (an IANA name; the machine's zone unless `--tz` named one).
    pub tz: String,
    /// Whether now is inside the schedule (outside, the offer's free count is 0).
    pub offered: bool,
    /// When that next changes, unix ms; absent when it never does (`always`).
    pub until_ms: Option<u64>,
    /// The same in words: `offered until 08:00 Europe/Berlin`, `not offered until 22:00
    /// Europe/Berlin`, `offered always`.
    pub text: String,
}

/// The provider's cache of pulled images.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ImageCacheView {
    /// Images kept.
    pub images: u64,
    /// Their unpacked size, bytes.
    pub bytes: u64,
    /// Most images kept.
    pub max_images: u32,
    /// Most bytes kept.
    pub max_bytes: u64,
}

/// The node's own offer.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OwnOfferView {
    /// Offer id (hex).
    pub id: String,
    /// Sequence.
    pub seq: u64,
    /// GPUs offered.
    pub gpus: usize,
    /// Price per GPU-hour, decimal.
    pub price_per_gpu_hour: String,
    /// Expiry (unix ms).
    pub expires_at_ms: u64,
    /// RAM each GPU comes with, MiB (the host minus the reserve, divided by the GPUs).
    #[serde(default)]
    pub ram_mib_per_gpu: u32,
    /// CPU each GPU comes with, millicores.
    #[serde(default)]
    pub cpu_millicores_per_gpu: u32,
    /// Scratch disk each GPU comes with, GiB.
    #[serde(default)]
    pub disk_gib_per_gpu: u32,
    /// This provider's network reputation as this node computes it from the co-signed
    /// completion records it holds (what renters' nodes holding the same records compute too);
    /// 0.5 while none is known.
    #[serde(default)]
    pub rep: f64,
    /// Its completed leases among those records.
    #[serde(default)]
    pub completed: u32,
    /// A running lease may be stopped when the owner wants the GPU back (`provide
    /// --interruptible`).
    #[serde(default)]
    pub interruptible: bool,
}

/// `GET /v1/peers`: one connected peer.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PeerView {
    /// Peer id.
    pub peer_id: String,
    /// Gossipsub score, when known.
    pub score: Option<f64>,
    /// In this node's offer-topic mesh.
    pub in_mesh: bool,
    /// The open connections to the peer.
    #[serde(default)]
    pub connections: Vec<ConnectionView>,
}

/// One open connection to a peer.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ConnectionView {
    /// The peer's address on it (a relayed one has `/p2p-circuit`); for a relayed connection
    /// the peer opened, this node's relayed address it came through (naming the relay).
    pub remote_addr: String,
    /// Through a relay (else direct: dialed, or hole punched).
    pub relayed: bool,
}

/// `GET /v1/offers`: one row of a search.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OfferRow {
    /// Offer id (hex, 64 digits): this signature of the offer, which changes whenever the
    /// provider re-signs it; any unique prefix is accepted by `rent`.
    pub id: String,
    /// The offer's stable handle, `<provider key, 64 hex digits>/0`: the same across re-signs
    /// and restarts; `rent` and `offer` take it (or its provider part's first digits, `/0`).
    #[serde(default)]
    pub handle: String,
    /// Provider peer id.
    pub provider: String,
    /// GPU model(s), e.g. `NVIDIA GeForce RTX 4090`.
    pub gpu: String,
    /// GPUs in the offer.
    pub gpus: u32,
    /// Of those, free when the provider last signed it (leases hold the others).
    #[serde(default)]
    pub free_gpus: u32,
    /// Smallest VRAM, GiB (one decimal).
    pub vram_gib: f64,
    /// Smallest fp16 rate, TFLOPS.
    pub fp16_tflops: f64,
    /// Smallest fp32 rate, TFLOPS.
    pub fp32_tflops: f64,
    /// Price per GPU-hour, decimal.
    pub price_per_gpu_hour: String,
    /// Price per GPU-hour per fp16 TFLOPS, decimal (null without a benchmark).
    pub price_per_tflop: Option<String>,
    /// True when every GPU's benchmark was measured by the provider's node; declared GPUs
    /// (`--dev-gpus`) are not (search `measured=true`).
    #[serde(default)]
    pub measured: bool,
    /// The provider's passed GPU checks (proof of GPU): co-signed completion records this node
    /// holds whose check passed (a plain count, like `completed`; search `verified>=N`).
    #[serde(default)]
    pub verified: u32,
    /// The GPU check the offer grants each lease at its start.
    #[serde(default)]
    pub gpu_check: GpuCheckPolicy,
    /// Seconds of the unbilled verification window the offer grants each lease for the check
    /// (0: none).
    #[serde(default)]
    pub verify_window_s: u32,
    /// Seconds since the offer was signed.
    pub age_s: u64,
    /// Region label.
    pub region: String,
    /// Minimum billed seconds of any lease of this offer (billing is per second, at least this
    /// long).
    #[serde(default)]
    pub min_billed_s: u32,
    /// Shortest lease, seconds.
    #[serde(default)]
    pub min_duration_s: u32,
    /// Longest lease, seconds (also the most an extension may reach).
    #[serde(default)]
    pub max_duration_s: u32,
    /// Interactive access the offer allows while a lease runs (`shell`, `exec`, `forward`).
    #[serde(default)]
    pub access: gridlease_protocol::access::AccessPolicy,
    /// The runtime tenants run under: `runc` or `gvisor`.
    #[serde(default)]
    pub isolation: gridlease_protocol::Isolation,
    /// Most seconds a finished lease's outputs are kept for downloads, if the renter asks.
    #[serde(default)]
    pub output_retention_s: u32,
    /// Most seconds a created container is held for uploads before its command starts.
    #[serde(default)]
    pub upload_hold_s: u32,
    /// The provider's network reputation, 0 to 1 (0.5 while no completion of it is known),
    /// as this node computes it from the co-signed completion records it holds.
    #[serde(default)]
    pub rep: f64,
    /// The provider's completed leases among those records.
    #[serde(default)]
    pub completed: u32,
    /// A running lease may be stopped when the provider's owner takes the GPU back (close
    /// reason `owner_reclaimed`, billed to the second it stopped).
    #[serde(default)]
    pub interruptible: bool,
}

impl OfferRow {
    /// How the GPUs' benchmark figures were obtained, for tables: `measured` or `declared`.
    pub fn bench(&self) -> &'static str {
        if self.measured {
            "measured"
        } else {
            "declared"
        }
    }

    /// The provider's passed GPU checks and the check the offer grants, for tables
    /// ([`GpuCheckPolicy::cell`]).
    pub fn checks(&self) -> String {
        self.gpu_check.cell(self.verified)
    }
}

/// The GPU check an offer grants each lease at its start (proof of GPU: the offer's
/// `ProofPolicy`), as the API and the CLI name it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum GpuCheckPolicy {
    /// The leased NVIDIA GPUs answer the challenge (cuBLASLt int8 GEMMs).
    #[serde(rename = "cuda")]
    Cuda,
    /// The provider's CPU answers it (a `--dev-gpus` provider): it proves the protocol, not a
    /// GPU.
    #[serde(rename = "cpu-reference: not a GPU")]
    CpuReference,
    /// No check is offered (no verification window).
    #[default]
    #[serde(rename = "none")]
    None,
}

impl GpuCheckPolicy {
    /// The check an offer with `policy` grants.
    pub fn of(policy: &gridlease_protocol::proof::ProofPolicy) -> Self {
        use gridlease_protocol::proof::ProofBackend as B;
        match (policy.window_s, policy.backend) {
            (0, _) | (_, None) => Self::None,
            (_, Some(B::Cuda)) => Self::Cuda,
            (_, Some(B::CpuReference)) => Self::CpuReference,
        }
    }

    /// The name the JSON carries (`cuda`, `cpu-reference: not a GPU`, `none`).
    pub fn label(self) -> &'static str {
        use gridlease_protocol::proof::ProofBackend as B;
        match self {
            Self::Cuda => B::Cuda.label(),
            Self::CpuReference => B::CpuReference.label(),
            Self::None => "none",
        }
    }

    /// The short name a table shows (`cuda`, `cpu`; `-` for none).
    pub fn short(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::CpuReference => "cpu",
            Self::None => "-",
        }
    }

    /// A table cell: `passed` (the provider's passed checks) and this check: `3 cpu`,
    /// `12 cuda`; `-` with no check offered and none passed, `2 none` with none offered now.
    pub fn cell(self, passed: u32) -> String {
        match (self, passed) {
            (Self::None, 0) => "-".into(),
            (Self::None, n) => format!("{n} none"),
            (check, n) => format!("{n} {}", check.short()),
        }
    }

    /// A sentence: this check, its window (`window_s`) and the provider's passed checks:
    /// `cpu-reference: not a GPU, 30 s unbilled window, 3 passed`, or `none offered`.
    pub fn line(self, window_s: u32, passed: u32) -> String {
        match (self, passed) {
            (Self::None, 0) => "none offered".into(),
            (Self::None, n) => format!("none offered now ({n} passed before)"),
            (check, n) => format!(
                "{}, {window_s} s unbilled window, {n} passed",
                check.label()
            ),
        }
    }
}

/// `GET /v1/gpus`: one local GPU.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GpuView {
    /// Index or UUID.
    pub id: String,
    /// Model.
    pub model: String,
    /// Memory, MiB.
    pub vram_mib: u32,
    /// `measured` (NVML) or `declared` (`--dev-gpus`, unverified).
    pub source: String,
}

/// `GET /v1/gpus` body.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GpusView {
    /// GPUs found or declared.
    pub gpus: Vec<GpuView>,
    /// Why there are none, when there are none.
    pub note: Option<String>,
}

/// Body of `POST /v1/leases`: the one rent request (see [`crate::lease::RentRequest`]).
pub use crate::lease::RentRequest;

/// Answer of `POST /v1/leases`.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RentedView {
    /// The new lease's id.
    pub lease_id: String,
    /// Something the renter should know, e.g. that the offer id given was replaced by an
    /// equivalent one and that one was rented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Minimum billed seconds of the lease (from the offer): it is billed per second, at least
    /// this long.
    #[serde(default)]
    pub min_billed_s: u32,
}

/// An offer's volumes (issue 47).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VolumeTermsView {
    /// Price per GiB-hour (a decimal amount); "0": the provider keeps no volumes.
    pub price_per_gib_hour: String,
    /// Largest volume, GiB.
    pub max_gib: u32,
    /// Longest keep period, seconds.
    pub max_keep_s: u32,
}

/// Body of `POST /v1/leases/{id}/extend` (see [`crate::lease::ExtendRequest`]).
pub use crate::lease::ExtendRequest;

/// Answer of `POST /v1/leases/{id}/extend` (see [`crate::lease::Extended`]).
pub use crate::lease::Extended;

/// Answer of `POST /v1/leases/{id}/stop`: the stop was taken in hand (the lease settles
/// shortly after; follow it with `GET /v1/leases/{id}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StoppingView {
    /// The lease, in full (the path may have named a prefix).
    pub lease_id: String,
    /// Always true: the lease is stopping or already over.
    pub stopping: bool,
}

/// Answer of `POST /v1/leases/{id}/begin`: the provider starts the held container's command
/// (or it already runs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BegunView {
    /// The lease, in full (the path may have named a prefix).
    pub lease_id: String,
    /// Always true.
    pub begun: bool,
}

/// What this node offers: the body of `PUT /v1/provide`, and the flags of `gridlease provide`.
/// Every field is optional: what a call leaves out stays as the last `provide` set it (the
/// first call starts from the node's configuration).
// Declared once for the CLI (clap), the wire (serde) and the document (utoipa, as
// `ProvideBody`); `lease::ProvideSettings` is the typed form the daemon applies and keeps.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::Args, utoipa::ToSchema,
)]
#[schema(as = ProvideBody)]
pub struct ProvideOptions {
    /// Price per GPU-hour, decimal, e.g. 0.40 (above 0). Needed the first time; later ones
    /// keep the last price unless given. Every setting left out stays as the last `provide`
    /// set it.
    #[arg(long, value_name = "AMOUNT")]
    #[serde(default)]
    pub price: Option<String>,
    /// GPUs to offer: `all`, or ids from `gridlease gpus` (UUIDs, or declared-N), separated by
    /// commas on the command line; absent the first time: all.
    #[arg(long, value_delimiter = ',')]
    #[serde(default)]
    #[schema(min_items = 1)]
    pub gpus: Option<Vec<String>>,
    /// Longest lease, hours (at least 1).
    #[arg(long, value_name = "H", value_parser = clap::value_parser!(u32).range(1..))]
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_hours: Option<u32>,
    /// Network access tenants may get: `none` (the default) or `egress`.
    #[arg(long, value_parser = ["none", "egress"])]
    #[serde(default)]
    pub network_policy: Option<String>,
    /// Registry hosts tenants' images may come from, comma-separated on the command line
    /// (replaces the list; default docker.io,nvcr.io,ghcr.io,quay.io,public.ecr.aws). A
    /// loopback, private or local-network host is allowed only when listed here exactly (with
    /// its port).
    #[arg(long, value_delimiter = ',', value_name = "HOST[:PORT]")]
    #[serde(default)]
    pub registries: Option<Vec<String>>,
    /// Only images whose canonical reference starts with one of these (e.g.
    /// docker.io/pytorch/,nvcr.io/nvidia/); an empty list (`--image-prefixes ''`) allows any.
    #[arg(long, value_delimiter = ',', value_name = "PREFIX")]
    #[serde(default)]
    pub image_prefixes: Option<Vec<String>>,
    /// Local images (built or imported here, never pulled) tenants may run, comma-separated on
    /// the command line; no other local-only image is rentable.
    #[arg(long, value_delimiter = ',', value_name = "IMAGE")]
    #[serde(default)]
    pub local_images: Option<Vec<String>>,
    /// Largest image a tenant may pull, compressed, GiB (default 20).
    #[arg(long, value_name = "GIB", value_parser = clap::value_parser!(u64).range(1..))]
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_image_gib: Option<u64>,
    /// Largest image unpacked on this disk, GiB (default 60).
    #[arg(long, value_name = "GIB", value_parser = clap::value_parser!(u64).range(1..))]
    #[serde(default)]
    #[schema(minimum = 1)]
    pub max_unpacked_gib: Option<u64>,
    /// Hours of the day the GPUs are offered, in `tz`: windows HH:MM-HH:MM separated by
    /// commas (`22:00-08:00,12:00-13:00`; a window may cross midnight), or `always` (the
    /// default). Outside them the offer says 0 free GPUs.
    #[arg(long, value_name = "WINDOWS")]
    #[serde(default)]
    #[schema(example = "22:00-08:00,12:00-13:00")]
    pub hours: Option<String>,
    /// Time zone of `hours`, an IANA name (Europe/Berlin), or `local`: the machine's zone (the
    /// default). Daylight saving time is followed.
    #[arg(long, value_name = "ZONE")]
    #[serde(default)]
    #[schema(example = "Europe/Berlin")]
    pub tz: Option<String>,
    /// Whether a running lease may be stopped when the owner wants the GPU back (the owner
    /// starts using it, or the offered hours end): it closes as `owner_reclaimed`, billed to
    /// the second. Stated in the offer; default false (only unleased GPUs are withdrawn).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    #[serde(default)]
    pub interruptible: Option<bool>,
    /// Stop offering.
    #[arg(long)]
    #[serde(default)]
    pub off: bool,
}

/// The body of `PUT /v1/provide`: the provide options ([`ProvideOptions`]).
pub type ProvideBody = ProvideOptions;

/// Body of `POST /v1/leases/{id}/exec` (an HTTP upgrade: the connection then carries the
/// access protocol's exec frames, `gridlease_protocol::access::{ExecInput, ExecOutput}`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecBody {
    /// Program and arguments; empty runs the container's shell.
    #[serde(default)]
    pub argv: Vec<String>,
    /// `NAME=value` entries added to the command's environment.
    #[serde(default)]
    pub env: Vec<String>,
    /// Run on a PTY of this size (`gridlease shell`); pipes when absent (`gridlease exec`).
    #[serde(default)]
    pub tty: Option<gridlease_protocol::access::TermSize>,
}

/// Body of `POST /v1/settle` (`gridlease settle [LEASE]`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettleBody {
    /// Only this lease's voucher in the answer (an id or its first digits); the pass
    /// redeems every pending voucher either way.
    #[serde(default)]
    pub lease: Option<String>,
}

/// Body of `POST /v1/leases/{id}/listen/{port}` (`gridlease forward`: the node listens).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ListenBody {
    /// Local address to listen on (IPv4 or IPv6), e.g. `127.0.0.1`.
    #[schema(value_type = String, example = "127.0.0.1")]
    pub address: std::net::IpAddr,
    /// Local port (0: any free one; the node says which).
    pub port: u16,
}

/// Body of `POST /v1/leases/{id}/upload`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UploadBody {
    /// Where in `/workspace` the entries go (empty: `/workspace` itself).
    #[serde(default)]
    pub dest: String,
}

/// Body of `POST /v1/leases/{id}/download`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DownloadBody {
    /// The path inside `/workspace` to download.
    #[serde(default)]
    pub path: String,
}

/// The `Upgrade` protocol name of the access routes.
pub const ACCESS_UPGRADE: &str = "gridlease-access";

/// The `Upgrade` header an access route needs: `gridlease-access`, its one value.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub enum AccessUpgrade {
    /// `gridlease-access`.
    #[serde(rename = "gridlease-access")]
    GridleaseAccess,
}

/// The `Connection` header an access route needs: `upgrade`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub enum ConnectionUpgrade {
    /// `upgrade`.
    #[serde(rename = "upgrade")]
    Upgrade,
}

/// `GET /v1/offers/{id}`: one offer whole (`gridlease offer OFFER`).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OfferDetail {
    /// Offer id (64 hex digits).
    pub id: String,
    /// The offer's stable handle (`<provider key hex>/0`; see [`OfferRow::handle`]).
    #[serde(default)]
    pub handle: String,
    /// Provider peer id.
    pub provider: String,
    /// Sequence (a higher one replaces it).
    pub seq: u64,
    /// Signed at, ms since the epoch.
    pub created_at_ms: u64,
    /// Dead after, ms since the epoch.
    pub expires_at_ms: u64,
    /// The GPUs, each with its spec and benchmark.
    pub gpus: Vec<OfferGpu>,
    /// Of those, how many no lease held when the offer was signed (the provider re-signs it
    /// when that changes).
    pub free_gpus: u16,
    /// Host resources per leased GPU.
    pub per_gpu: gridlease_protocol::ResourcesPerGpu,
    /// Price per GPU-hour (decimal GLU).
    pub price_per_gpu_hour: String,
    /// Shortest lease, seconds.
    pub min_duration_s: u32,
    /// Longest lease, seconds.
    pub max_duration_s: u32,
    /// Minimum billed seconds.
    pub min_billed_s: u32,
    /// Seconds between usage reports.
    pub usage_interval_s: u32,
    /// Seconds of usage a renter may owe before the provider stops.
    pub pay_ahead_s: u32,
    /// `none` or `egress`.
    pub network: String,
    /// Image prefixes allowed (empty: any image of the provider's registries).
    pub image_prefixes: Vec<String>,
    /// Registry hosts the provider pulls images from.
    #[serde(default)]
    pub registries: Vec<String>,
    /// Images on the provider's machine (never pulled) tenants may run.
    #[serde(default)]
    pub local_images: Vec<String>,
    /// Interactive access allowed while a lease runs.
    pub access: gridlease_protocol::access::AccessPolicy,
    /// The runtime tenants run under: `runc` or `gvisor`.
    pub isolation: gridlease_protocol::Isolation,
    /// Most seconds a finished lease's outputs are kept for downloads, if the renter asks
    /// (`rent --keep-outputs`, `--download`); 0: never.
    pub output_retention_s: u32,
    /// Most seconds the provider holds a lease's created container before starting its
    /// command, for uploads (`rent --upload`); 0: never.
    #[serde(default)]
    pub upload_hold_s: u32,
    /// A running lease may be stopped when the provider's owner takes the GPU back.
    #[serde(default)]
    pub interruptible: bool,
    /// The GPU check the offer grants each lease at its start.
    #[serde(default)]
    pub gpu_check: GpuCheckPolicy,
    /// Seconds of the unbilled verification window the offer grants each lease for the check
    /// (0: none).
    #[serde(default)]
    pub verify_window_s: u32,
    /// Volumes the provider keeps for renters beyond any lease (issue 47; `volume create`).
    #[serde(default)]
    pub volumes: VolumeTermsView,
    /// The provider's passed GPU checks among the co-signed completion records this node
    /// holds (a plain count; search `verified>=N`).
    #[serde(default)]
    pub verified: u32,
    /// Where to reach the provider.
    pub addrs: Vec<String>,
    /// Region label.
    pub region: String,
}

/// One GPU of an [`OfferDetail`].
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OfferGpu {
    /// Model name.
    pub model: String,
    /// VRAM, MiB.
    pub vram_mib: u32,
    /// Driver version.
    pub driver_version: String,
    /// Highest CUDA version the driver supports.
    pub cuda_version: String,
    /// Compute capability, `major.minor`.
    pub compute_capability: String,
    /// PCIe generation and width.
    pub pcie: String,
    /// Power limit, W.
    pub power_limit_w: u32,
    /// fp32 GEMM, GFLOP/s.
    pub fp32_gflops: u32,
    /// fp16 GEMM, GFLOP/s.
    pub fp16_gflops: u32,
    /// Device memory bandwidth, MB/s.
    pub device_mem_mbps: u32,
    /// Host-to-device bandwidth, MB/s.
    pub h2d_mbps: u32,
    /// `measured` (by the node's benchmark) or `declared` (unverified).
    pub attestation: String,
}

/// `GET /v1/leases/{id}/telemetry`: live samples of a running lease (`gridlease top`).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TelemetryView {
    /// The lease.
    pub lease_id: String,
    /// Where the GPU values come from.
    pub source: TelemetrySourceView,
    /// The leased GPUs' model names, in the lease's order.
    pub gpus: Vec<String>,
    /// Oldest first.
    pub samples: Vec<TelemetrySampleView>,
}

/// Where a [`TelemetryView`]'s GPU values come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TelemetrySourceView {
    /// The NVIDIA driver (NVML) of the provider's machine.
    Driver,
    /// A scripted probe (development and tests): not a real GPU.
    Scripted,
    /// Nothing samples the GPUs (declared GPUs): every GPU value is null.
    None,
}

/// One sample of a [`TelemetryView`]; `null` where the provider cannot measure a value.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TelemetrySampleView {
    /// When it was taken, ms since the epoch (provider's clock).
    pub at_ms: u64,
    /// One entry per leased GPU, in the lease's order.
    pub gpus: Vec<GpuTelemetry>,
    /// Container CPU use since the previous sample, millicores (1000 = one core busy).
    pub cpu_millicores: Option<u32>,
    /// Container memory in use, MiB.
    pub mem_used_mib: Option<u32>,
    /// Container memory limit, MiB.
    pub mem_limit_mib: Option<u32>,
}

/// One GPU of a [`TelemetrySampleView`]: the protocol's sample as the provider sent it (its
/// schema is named `GpuTelemetryView` in the document).
pub use gridlease_protocol::telemetry::GpuTelemetry;

impl TelemetryView {
    /// The view of a provider's (checked) answer.
    pub fn of(
        id: gridlease_protocol::LeaseId,
        b: gridlease_protocol::telemetry::TelemetryBatch,
    ) -> Self {
        use gridlease_protocol::telemetry::TelemetrySource;
        Self {
            lease_id: id.to_string(),
            source: match b.source {
                TelemetrySource::Driver => TelemetrySourceView::Driver,
                TelemetrySource::Scripted => TelemetrySourceView::Scripted,
                TelemetrySource::None => TelemetrySourceView::None,
            },
            gpus: b.models,
            samples: b
                .samples
                .into_iter()
                .map(|s| TelemetrySampleView {
                    at_ms: s.at.0,
                    gpus: s.gpus,
                    cpu_millicores: s.cpu_millicores,
                    mem_used_mib: s.mem_used_mib,
                    mem_limit_mib: s.mem_limit_mib,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::GpuCheckPolicy;
    use gridlease_protocol::proof::{ProofBackend, ProofPolicy};

    #[test]
    fn the_gpu_check_is_named_from_the_offers_policy() {
        let policy = |window_s, backend| ProofPolicy {
            window_s,
            backend,
            claimed_mmacs: 1,
        };
        for (p, want, json, short) in [
            (
                policy(30, Some(ProofBackend::Cuda)),
                GpuCheckPolicy::Cuda,
                "cuda",
                "cuda",
            ),
            (
                policy(30, Some(ProofBackend::CpuReference)),
                GpuCheckPolicy::CpuReference,
                "cpu-reference: not a GPU",
                "cpu",
            ),
            (
                policy(0, Some(ProofBackend::Cuda)),
                GpuCheckPolicy::None,
                "none",
                "-",
            ),
            (policy(30, None), GpuCheckPolicy::None, "none", "-"),
        ] {
            let got = GpuCheckPolicy::of(&p);
            assert_eq!(got, want, "{p:?}");
            // The JSON name is the label the rest of the node shows.
            assert_eq!(serde_json::to_value(got).unwrap(), json);
            assert_eq!(got.label(), json);
            assert_eq!(got.short(), short);
        }
        let cpu = GpuCheckPolicy::CpuReference;
        assert_eq!(cpu.cell(3), "3 cpu");
        assert_eq!(GpuCheckPolicy::Cuda.cell(12), "12 cuda");
        assert_eq!(GpuCheckPolicy::None.cell(0), "-");
        assert_eq!(GpuCheckPolicy::None.cell(2), "2 none");
        assert_eq!(
            cpu.line(30, 3),
            "cpu-reference: not a GPU, 30 s unbilled window, 3 passed"
        );
        assert_eq!(GpuCheckPolicy::None.line(0, 0), "none offered");
    }
}
