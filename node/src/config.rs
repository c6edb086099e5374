//! Daemon configuration: documented defaults, then `<home>/config.toml`, then environment
//! variables, then command-line flags (each later source overrides the earlier ones).
//! Merged in one place ([`Config::resolve`]); `gridlease node --dump-config` prints the result.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::env_vars;

/// File name of the configuration inside the home.
pub const CONFIG_FILE: &str = "config.toml";

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (structured fields preserved).
    Json,
}

/// What `gridlease node` runs with. Every field has a documented default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Listen addresses. Default: TCP and QUIC on all interfaces, port 4001.
    pub listen: Vec<String>,
    /// Peers to dial at start (multiaddrs with `/p2p/<id>`). Default: none.
    pub bootstrap: Vec<String>,
    /// Publicly reachable addresses of this node. Default: none.
    pub external_addrs: Vec<String>,
    /// Serve as relay, AutoNAT server and DHT server. Default: false.
    pub relay_server: bool,
    /// mDNS LAN discovery. Default: true.
    pub mdns: bool,
    /// Seconds between checks of the own offer (re-signed and published when it changed or
    /// nears expiry; it lives 60 of these, at most 3,600 s) and book sweeps. Default: 60.
    pub announce_secs: u64,
    /// GPU classes (`rtx-4090`, `a100-sxm4-80gb`, ...: the model name lower-cased, vendor
    /// words dropped, `docs/protocol.md` 3c) whose offers this node follows: it subscribes to
    /// their gossip topics (and its own offer's), and its book, searches and book syncs hold
    /// only those. At most 16. Default: none, which follows every class (the whole book).
    pub follow: Vec<String>,
    /// Declared (unverified) GPUs to offer, e.g. `"RTX 4090:24GiB:0.40"`. Default: none.
    pub dev_gpus: Option<String>,
    /// A curves file that scripts the declared GPUs' samples (JSON, one object per declared
    /// GPU: `util_percent`, `vram_used_mib`, optional `power_w`, `temp_c`, `sm_clock_mhz`
    /// series), for development and tests of `gridlease top`: not a real GPU, and telemetry
    /// says so (`source: scripted`). Default: none (declared GPUs are not sampled: n/a).
    pub dev_gpu_samples: Option<PathBuf>,
    /// Address for the Prometheus metrics endpoint, e.g. `127.0.0.1:9464`. Default: off.
    pub metrics: Option<String>,
    /// Log format. Default: text.
    pub log_format: LogFormat,
    /// RAM kept back from offers for the OS, Docker and the node, MiB. Default: the larger of
    /// 2048 and 10% of the host's RAM.
    pub reserve_ram_mib: Option<u64>,
    /// CPU kept back from offers, millicores. Default: 1000 (one core).
    pub reserve_cpu_millicores: Option<u64>,
    /// Disk kept free, GiB. Default: 10.
    pub reserve_disk_gib: Option<u64>,
    /// RAM per offered GPU, MiB; can only lower what the host minus the reserve allows.
    /// Default: (host RAM - reserve) / offered GPUs.
    pub per_gpu_ram_mib: Option<u32>,
    /// CPU per offered GPU, millicores; can only lower the host-derived value. Default:
    /// (host CPUs - reserve) / offered GPUs.
    pub per_gpu_cpu_millicores: Option<u32>,
    /// Scratch disk per offered GPU, GiB; can only lower the host-derived value. Default:
    /// (free disk - reserve) / offered GPUs.
    pub per_gpu_disk_gib: Option<u32>,
    /// Registry hosts tenants' images may come from. Default: docker.io, nvcr.io, ghcr.io,
    /// quay.io, public.ecr.aws. A loopback, private or local-network registry must be listed
    /// exactly (with its port). `provide --registries` changes it later.
    pub image_registries: Vec<String>,
    /// Prefixes of canonical references images must start with. Default: none (any image of
    /// the allowed registries).
    pub image_prefixes: Vec<String>,
    /// Local images (built or imported on this host, never pulled) tenants may run. Default:
    /// none: a local-only image is not rentable.
    pub local_images: Vec<String>,
    /// Largest image tenants may pull, compressed, GiB. Default: 20.
    pub max_image_gib: u64,
    /// Largest image unpacked on this disk, GiB. Default: 60.
    pub max_unpacked_gib: u64,
    /// Most images pulled for leases kept cached (least recently used removed first when a
    /// lease ends). Default: 8.
    pub image_cache_images: u32,
    /// Most bytes of pulled images kept cached, GiB. Default: 100.
    pub image_cache_gib: u64,
    /// Renters may open a shell (`gridlease shell`) in their running container. Default: true.
    pub allow_shell: bool,
    /// Renters may run commands (`gridlease exec`) in their running container. Default: true.
    pub allow_exec: bool,
    /// Renters may forward TCP ports of their running container (`gridlease forward`).
    /// Default: true (offered only when the node can enter containers' network namespaces,
    /// i.e. runs as root).
    pub allow_forward: bool,
    /// The runtime tenants' containers run under: `runc` (Docker's default) or `gvisor`
    /// (runsc, an application kernel between tenant and host; checked at start, advertised in
    /// offers). Default: runc.
    pub isolation: gridlease_protocol::Isolation,
    /// The Docker runtime name gVisor is registered under in the daemon's `runtimes`.
    /// Default: runsc.
    pub gvisor_runtime: String,
    /// Most seconds a finished lease's stopped container and workspace are kept for the
    /// renter's downloads, when it asks (`rent --keep-outputs`, `--download`); advertised in
    /// offers. 0: never. Default: 3600 (they take this host's disk meanwhile, within the
    /// lease's workspace size).
    pub output_retention_secs: u32,
    /// Most seconds a lease's created container is held before its command starts, while the
    /// renter uploads (`rent --upload`); advertised in offers. 0: never. Default: 300. The
    /// GPUs are held meanwhile: one held container per renter at a time, and a renter that
    /// stops the lease before its command starts pays the minimum billed duration.
    pub upload_hold_secs: u32,
    /// Seconds of unbilled verification window a provider grants each lease for the
    /// renter's GPU check (proof of GPU, `docs/gpu.md`), between the container's creation
    /// and its command; advertised in offers when the node's prover passes its self-test at
    /// start. 0: no check offered. Default: 30.
    pub verify_window_secs: u32,
    /// Seconds between a provider's usage reports (each answered by a payment receipt);
    /// advertised in offers. Default: 10.
    pub usage_interval_secs: u32,
    /// Days a finished lease's logs (its output, its watchdog's) are kept after they were last
    /// written; 0: removed when the lease ends. Default: 7.
    pub lease_log_days: u32,
    /// Most GiB of lease logs kept in all: beyond it, finished leases' logs are removed oldest
    /// first. Kept back from the disk offers promise (with `reserve_disk_gib`). Default: 2.
    pub lease_logs_gib: u64,
    /// Seconds an offered GPU its owner used (a process on it, or utilisation, while no lease
    /// holds it) stays out of the offer after its last use. Default: 300.
    pub owner_idle_secs: u64,
    /// Utilisation (percent) of an offered GPU no lease holds that means its owner uses it;
    /// 0: only compute processes on it count. Default: 10.
    pub owner_util_percent: u32,
    /// The provider's pay-ahead window: the most seconds of usage it runs unpaid before it
    /// stops a lease (`PaymentLagging`); advertised in offers, at least one usage interval.
    /// Default: 60.
    pub pay_ahead_secs: u32,
    /// Renter: the most seconds a provider may keep a lease running while it hears nothing
    /// from this renter (`grace_s` of the terms; at least the offer's usage interval).
    /// Default: 30.
    pub renter_grace_secs: u32,
    /// Price per GiB-hour of the volumes this provider keeps for renters beyond their leases
    /// (`volume create`, issue 47), in GLU with at most 6 decimals, advertised in offers; "0":
    /// no volumes. Default: "0".
    pub volume_price: String,
    /// Largest volume, GiB (advertised). Default: 500.
    pub max_volume_gib: u32,
    /// Most volumes kept at once, every renter's together. Default: 16.
    pub max_volumes: u32,
    /// Longest keep period of a volume, days (advertised). Default: 30.
    pub max_volume_keep_days: u32,
    /// On-chain settlement (issue 50, `docs/billing.md`): the EIP-155 id of the chain leases
    /// settle on. With `token` and `channel_contract` it makes offers name the chain and
    /// receipts carry EIP-712 vouchers; all three or none. Default: none (GLU only).
    pub chain_id: Option<u64>,
    /// The ERC-20 token leases settle in (`0x` and 40 hex digits). Default: none.
    pub token: Option<String>,
    /// The token's decimals (its ERC-20 `decimals()`, 6 to 24): a micro-unit of a price is
    /// `10^(decimals - 6)` of its smallest units. Default: 6 (a USDC-like stablecoin).
    pub token_decimals: u8,
    /// The payment channel contract (`settlement/contracts/GridleaseChannels.vy`) on that
    /// chain. Default: none.
    pub channel_contract: Option<String>,
    /// The chain's JSON-RPC endpoint (`http://` or `https://`): with it the node redeems its
    /// settled leases' vouchers itself (`crate::settlement`). Needs `chain_id`, `token` and
    /// `channel_contract`. Default: none (vouchers are kept; `gridlease wallet` lists them).
    pub chain_rpc: Option<String>,
    /// Seconds between the settlement service's passes (queue settled leases, redeem, watch
    /// for closes). Default: 60.
    pub redeem_interval_secs: u64,
}

impl Config {
    /// The interactive access these settings allow (before checking the node can forward).
    pub fn access_policy(&self) -> gridlease_protocol::access::AccessPolicy {
        gridlease_protocol::access::AccessPolicy {
            shell: self.allow_shell,
            exec: self.allow_exec,
            forward: self.allow_forward,
        }
    }

    /// The Docker runtime tenants run under (`None`: the daemon's default, runc).
    pub fn runtime(&self) -> Option<String> {
        gridlease_sandbox::isolation::runtime_for(self.isolation, &self.gvisor_runtime)
    }

    /// The bounds of the cache of pulled images.
    pub fn image_cache(&self) -> gridlease_contracts::image::CacheLimits {
        gridlease_contracts::image::CacheLimits {
            max_images: self.image_cache_images,
            max_bytes: self.image_cache_gib.saturating_mul(1 << 30),
        }
    }

    /// The image policy these settings give offers until `provide` changes it.
    pub fn image_policy(&self) -> gridlease_contracts::image::ImagePolicy {
        gridlease_contracts::image::ImagePolicy {
            registries: self.image_registries.clone(),
            prefixes: self.image_prefixes.clone(),
            local_images: self.local_images.clone(),
            max_compressed_bytes: self.max_image_gib.saturating_mul(1 << 30),
            max_unpacked_bytes: self.max_unpacked_gib.saturating_mul(1 << 30),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: vec![
                "/ip4/0.0.0.0/tcp/4001".to_string(),
                "/ip4/0.0.0.0/udp/4001/quic-v1".to_string(),
            ],
            bootstrap: Vec::new(),
            external_addrs: Vec::new(),
            relay_server: false,
            mdns: true,
            announce_secs: 60,
            follow: Vec::new(),
            dev_gpus: None,
            dev_gpu_samples: None,
            metrics: None,
            log_format: LogFormat::Text,
            reserve_ram_mib: None,
            reserve_cpu_millicores: None,
            reserve_disk_gib: None,
            per_gpu_ram_mib: None,
            per_gpu_cpu_millicores: None,
            per_gpu_disk_gib: None,
            image_registries: gridlease_contracts::image::DEFAULT_REGISTRIES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            image_prefixes: Vec::new(),
            local_images: Vec::new(),
            max_image_gib: gridlease_contracts::image::DEFAULT_MAX_COMPRESSED_BYTES >> 30,
            max_unpacked_gib: gridlease_contracts::image::DEFAULT_MAX_UNPACKED_BYTES >> 30,
            image_cache_images: 8,
            image_cache_gib: 100,
            allow_shell: true,
            allow_exec: true,
            allow_forward: true,
            isolation: gridlease_protocol::Isolation::Runc,
            gvisor_runtime: gridlease_sandbox::isolation::DEFAULT_GVISOR_RUNTIME.to_string(),
            output_retention_secs: 3600,
            upload_hold_secs: 300,
            verify_window_secs: 30,
            usage_interval_secs: 10,
            lease_log_days: 7,
            lease_logs_gib: 2,
            owner_idle_secs: crate::lease::OWNER_IDLE_S,
            owner_util_percent: crate::lease::BUSY_UTIL_PERCENT,
            pay_ahead_secs: 60,
            renter_grace_secs: crate::lease::RENTER_GRACE_S,
            volume_price: "0".into(),
            max_volume_gib: 500,
            max_volumes: 16,
            max_volume_keep_days: 30,
            chain_id: None,
            token: None,
            token_decimals: 6,
            channel_contract: None,
            chain_rpc: None,
            redeem_interval_secs: 60,
        }
    }
}

/// The settings given on the command line or in the environment (`None` / empty: not given),
/// as `gridlease node` takes them. Each field is one config key: clap reads the flag and its
/// environment variable (the flag wins), and [`Config::resolve`] lays the given ones over the
/// file by key. Adding a setting is one [`Config`] field (with its default), one field here
/// and its variable's name in [`crate::env_vars`].
#[derive(Clone, Debug, Default, Serialize, clap::Args)]
pub struct Overrides {
    /// Listen address (repeatable; comma-separated in the environment). Default: TCP and QUIC
    /// on all interfaces, port 4001.
    #[arg(long = "listen", value_name = "ADDR", env = env_vars::GRIDLEASE_LISTEN, value_delimiter = ',', value_parser = multiaddr)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listen: Vec<String>,
    /// Peer to dial at start, with its /p2p/<id> (repeatable).
    #[arg(long = "bootstrap", value_name = "MULTIADDR", env = env_vars::GRIDLEASE_BOOTSTRAP, value_delimiter = ',', value_parser = multiaddr)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bootstrap: Vec<String>,
    /// Publicly reachable address of this node (repeatable). A relay server without one treats
    /// its listen addresses as public.
    #[arg(long = "external-addr", value_name = "ADDR", env = env_vars::GRIDLEASE_EXTERNAL_ADDRS, value_delimiter = ',', value_parser = multiaddr)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub external_addrs: Vec<String>,
    /// Also serve as relay, AutoNAT server and DHT server (for public bootstrap nodes).
    #[arg(long, value_name = "BOOL", env = env_vars::GRIDLEASE_RELAY_SERVER, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relay_server: Option<bool>,
    /// mDNS LAN discovery (default on).
    #[arg(long, value_name = "BOOL", env = env_vars::GRIDLEASE_MDNS, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mdns: Option<bool>,
    /// Let renters open a shell in their container (default true).
    #[arg(long, value_name = "BOOL", env = env_vars::GRIDLEASE_ALLOW_SHELL, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_shell: Option<bool>,
    /// Let renters run commands in their container (default true).
    #[arg(long, value_name = "BOOL", env = env_vars::GRIDLEASE_ALLOW_EXEC, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_exec: Option<bool>,
    /// Let renters forward TCP ports of their container (default true).
    #[arg(long, value_name = "BOOL", env = env_vars::GRIDLEASE_ALLOW_FORWARD, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_forward: Option<bool>,
    /// Runtime of tenants' containers: runc (default) or gvisor.
    #[arg(long, value_name = "RUNTIME", env = env_vars::GRIDLEASE_ISOLATION, value_parser = isolation)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolation: Option<gridlease_protocol::Isolation>,
    /// Docker runtime name gVisor is registered under (default runsc).
    #[arg(long, value_name = "NAME", env = env_vars::GRIDLEASE_GVISOR_RUNTIME)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gvisor_runtime: Option<String>,
    /// Most seconds finished leases' outputs are kept when renters ask (default 3600; 0: never).
    #[arg(long, value_name = "SECS", env = env_vars::GRIDLEASE_OUTPUT_RETENTION_SECS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_retention_secs: Option<u32>,
    /// Most seconds a lease's container is held for uploads before its command starts
    /// (default 300; 0: never).
    #[arg(long, value_name = "SECS", env = env_vars::GRIDLEASE_UPLOAD_HOLD_SECS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload_hold_secs: Option<u32>,
    /// Seconds of unbilled verification window for renters' GPU checks (default 30; 0: none).
    #[arg(long, value_name = "SECS", env = env_vars::GRIDLEASE_VERIFY_WINDOW_SECS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify_window_secs: Option<u32>,
    /// Seconds between this provider's usage reports (default 10; advertised).
    #[arg(long, value_name = "SECS", env = env_vars::GRIDLEASE_USAGE_INTERVAL_SECS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_interval_secs: Option<u32>,
    /// Days finished leases' logs are kept (default 7).
    #[arg(long, value_name = "DAYS", env = env_vars::GRIDLEASE_LEASE_LOG_DAYS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_log_days: Option<u32>,
    /// Most GiB of lease logs kept in all (default 2; kept back from offers' disk).
    #[arg(long, value_name = "GIB", env = env_vars::GRIDLEASE_LEASE_LOGS_GIB)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_logs_gib: Option<u64>,
    /// Seconds a GPU its owner used stays out of the offer after its last use (default 300).
    #[arg(long, value_name = "SECS", env = env_vars::GRIDLEASE_OWNER_IDLE_SECS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_idle_secs: Option<u64>,
    /// Utilisation (percent) of an unleased offered GPU that means its owner uses it (default
    /// 10; 0: only compute processes count).
    #[arg(long, value_name = "PERCENT", env = env_vars::GRIDLEASE_OWNER_UTIL_PERCENT)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner_util_percent: Option<u32>,
    /// Most seconds of usage this provider runs unpaid before it stops a lease (default 60;
    /// advertised).
    #[arg(long, value_name = "SECS", env = env_vars::GRIDLEASE_PAY_AHEAD_SECS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pay_ahead_secs: Option<u32>,
    /// Renter: most seconds a provider may run a lease while this renter is silent (default 30).
    #[arg(long, value_name = "SECS", env = env_vars::GRIDLEASE_RENTER_GRACE_SECS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renter_grace_secs: Option<u32>,
    /// Price per GiB-hour of kept volumes, GLU (default 0: no volumes; advertised).
    #[arg(long, value_name = "AMOUNT", env = env_vars::GRIDLEASE_VOLUME_PRICE)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_price: Option<String>,
    /// Largest volume, GiB (default 500).
    #[arg(long, value_name = "GIB", env = env_vars::GRIDLEASE_MAX_VOLUME_GIB)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_volume_gib: Option<u32>,
    /// Most volumes kept at once (default 16).
    #[arg(long, value_name = "N", env = env_vars::GRIDLEASE_MAX_VOLUMES)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_volumes: Option<u32>,
    /// Longest keep period of a volume, days (default 30).
    #[arg(long, value_name = "DAYS", env = env_vars::GRIDLEASE_MAX_VOLUME_KEEP_DAYS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_volume_keep_days: Option<u32>,
    /// Settle on this chain (EIP-155 id; with --token and --channel-contract).
    #[arg(long, value_name = "ID", env = env_vars::GRIDLEASE_CHAIN_ID)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain_id: Option<u64>,
    /// The ERC-20 token settled in (0x address).
    #[arg(long, value_name = "ADDRESS", env = env_vars::GRIDLEASE_TOKEN)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The token's decimals, 6 to 24 (default 6).
    #[arg(long, value_name = "N", env = env_vars::GRIDLEASE_TOKEN_DECIMALS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_decimals: Option<u8>,
    /// The payment channel contract (0x address).
    #[arg(long, value_name = "ADDRESS", env = env_vars::GRIDLEASE_CHANNEL_CONTRACT)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel_contract: Option<String>,
    /// The chain's JSON-RPC endpoint: the node redeems its vouchers itself.
    #[arg(long, value_name = "URL", env = env_vars::GRIDLEASE_CHAIN_RPC)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chain_rpc: Option<String>,
    /// Seconds between settlement passes (default 60).
    #[arg(long, value_name = "SECS", env = env_vars::GRIDLEASE_REDEEM_INTERVAL_SECS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redeem_interval_secs: Option<u64>,
    /// Disable mDNS LAN discovery (same as --mdns=false).
    #[arg(long, conflicts_with = "mdns")]
    #[serde(skip)]
    pub no_mdns: bool,
    /// Seconds between checks of the own offer and book sweeps; the offer lives 60 of these,
    /// at most 3,600 s, and is published when it changes or is re-signed (default 60).
    #[arg(long, value_name = "SECS", env = env_vars::GRIDLEASE_ANNOUNCE_SECS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub announce_secs: Option<u64>,
    /// Follow only the offers of these GPU classes (repeatable; comma-separated; a model
    /// name such as "RTX 4090" names its class, rtx-4090). Default: every class.
    #[arg(long = "follow", value_name = "CLASS", env = env_vars::GRIDLEASE_FOLLOW, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub follow: Vec<String>,
    /// Advertise declared (unverified) GPUs: "[Nx]MODEL:VRAM:PRICE,..." e.g.
    /// "RTX 4090:24GiB:0.40,RTX 3090:24GiB:0.25".
    #[arg(long, value_name = "SPEC", env = env_vars::GRIDLEASE_DEV_GPUS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev_gpus: Option<String>,
    /// Script the declared GPUs' samples from a curves file (JSON; for development and tests
    /// of `gridlease top`, labelled `scripted`, never a real GPU). Needs --dev-gpus.
    #[arg(long, value_name = "FILE", env = env_vars::GRIDLEASE_DEV_GPU_SAMPLES)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev_gpu_samples: Option<PathBuf>,
    /// Serve Prometheus metrics on this address, e.g. 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR", env = env_vars::GRIDLEASE_METRICS)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// Log format.
    #[arg(long, value_enum, value_name = "FORMAT", env = env_vars::GRIDLEASE_LOG_FORMAT)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
    /// RAM (MiB) offers keep back for the OS, Docker and the node (default max(2048, 10%)).
    #[arg(long, value_name = "MIB", env = env_vars::GRIDLEASE_RESERVE_RAM_MIB)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve_ram_mib: Option<u64>,
    /// CPU (millicores) offers keep back (default 1000).
    #[arg(long, value_name = "MILLICORES", env = env_vars::GRIDLEASE_RESERVE_CPU_MILLICORES)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve_cpu_millicores: Option<u64>,
    /// Disk (GiB) kept free (default 10).
    #[arg(long, value_name = "GIB", env = env_vars::GRIDLEASE_RESERVE_DISK_GIB)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve_disk_gib: Option<u64>,
    /// RAM per offered GPU (MiB), at most what the host minus the reserve allows.
    #[arg(long, value_name = "MIB", env = env_vars::GRIDLEASE_PER_GPU_RAM_MIB)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_gpu_ram_mib: Option<u32>,
    /// CPU per offered GPU (millicores), at most what the host minus the reserve allows.
    #[arg(long, value_name = "MILLICORES", env = env_vars::GRIDLEASE_PER_GPU_CPU_MILLICORES)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_gpu_cpu_millicores: Option<u32>,
    /// Scratch disk per offered GPU (GiB), at most what the host minus the reserve allows.
    #[arg(long, value_name = "GIB", env = env_vars::GRIDLEASE_PER_GPU_DISK_GIB)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_gpu_disk_gib: Option<u32>,
    /// Registry host tenants' images may come from (repeatable; comma-separated). Default:
    /// docker.io, nvcr.io, ghcr.io, quay.io, public.ecr.aws.
    #[arg(long = "image-registry", value_name = "HOST[:PORT]", env = env_vars::GRIDLEASE_IMAGE_REGISTRIES, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub image_registries: Vec<String>,
    /// Canonical reference prefix images must start with (repeatable). Default: any.
    #[arg(long = "image-prefix", value_name = "PREFIX", env = env_vars::GRIDLEASE_IMAGE_PREFIXES, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub image_prefixes: Vec<String>,
    /// Local image (never pulled) tenants may run (repeatable). Default: none.
    #[arg(long = "local-image", value_name = "IMAGE", env = env_vars::GRIDLEASE_LOCAL_IMAGES, value_delimiter = ',')]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub local_images: Vec<String>,
    /// Largest compressed image tenants may pull, GiB (default 20).
    #[arg(long, value_name = "GIB", env = env_vars::GRIDLEASE_MAX_IMAGE_GIB)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_image_gib: Option<u64>,
    /// Largest unpacked image, GiB (default 60).
    #[arg(long, value_name = "GIB", env = env_vars::GRIDLEASE_MAX_UNPACKED_GIB)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_unpacked_gib: Option<u64>,
    /// Most pulled images kept cached (default 8).
    #[arg(long, value_name = "N", env = env_vars::GRIDLEASE_IMAGE_CACHE_IMAGES)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_cache_images: Option<u32>,
    /// Most GiB of pulled images kept cached (default 100).
    #[arg(long, value_name = "GIB", env = env_vars::GRIDLEASE_IMAGE_CACHE_GIB)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_cache_gib: Option<u64>,
}

fn isolation(s: &str) -> Result<gridlease_protocol::Isolation, String> {
    s.parse()
}

fn multiaddr(s: &str) -> Result<String, String> {
    s.trim()
        .parse::<libp2p::Multiaddr>()
        .map(|a| a.to_string())
        .map_err(|e| format!("not a multiaddr ({e})"))
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (unknown keys included).
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// The parser's message (with line and column).
        message: String,
    },
    /// An environment variable has an invalid value.
    #[error("environment variable {name}={value:?}: {problem}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// A value that is not valid wherever it came from.
    #[error("{field}: {problem}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
}

impl Config {
    /// Lays the given settings (`flags`: command line and environment, already merged by
    /// clap) over the file text (if any) by key, fills the rest with the defaults, then
    /// validates. `file_name` only labels errors.
    pub fn resolve(file: Option<(&str, &str)>, flags: &Overrides) -> Result<Self, ConfigError> {
        let (name, mut table) = match file {
            Some((name, text)) => (
                name,
                toml::from_str::<toml::Table>(text).map_err(|e| ConfigError::Parse {
                    path: name.to_string(),
                    message: e.to_string().trim_end().to_string(),
                })?,
            ),
            None => ("the configuration", toml::Table::new()),
        };
        let mut flags = flags.clone();
        if flags.no_mdns {
            flags.mdns = Some(false);
        }
        let given = toml::Table::try_from(&flags).map_err(|e| ConfigError::Invalid {
            field: "flags",
            problem: e.to_string(),
        })?;
        table.extend(given);
        let mut c = Config::deserialize(table).map_err(|e| ConfigError::Parse {
            path: name.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        // Classes as the protocol writes them ("RTX 4090" -> rtx-4090), each once.
        let mut follow: Vec<String> = Vec::new();
        for given in &c.follow {
            let class = gridlease_protocol::class::class_of_model(given);
            if class == gridlease_protocol::class::UNKNOWN && given.trim() != class {
                return Err(ConfigError::Invalid {
                    field: "follow",
                    problem: format!("{given:?} names no GPU class (letters or digits needed)"),
                });
            }
            if !follow.contains(&class) {
                follow.push(class);
            }
        }
        c.follow = follow;
        c.validate()?;
        Ok(c)
    }

    /// Reads `<home>/config.toml` if present, the process environment and `flags`.
    pub fn load(home: &Path, flags: &Overrides) -> Result<Self, ConfigError> {
        Self::load_file(&home.join(CONFIG_FILE), false, flags)
    }

    /// Reads the configuration file `path` (an absent one is an error when `required`, the
    /// defaults otherwise), the process environment and `flags`.
    pub fn load_file(path: &Path, required: bool, flags: &Overrides) -> Result<Self, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => None,
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.display().to_string(),
                    source,
                });
            }
        };
        let name = path.display().to_string();
        Self::resolve(text.as_deref().map(|t| (name.as_str(), t)), flags)
    }

    /// The volumes this provider offers (`volume_price` and its bounds; checked by
    /// [`Config::resolve`], so the price parses).
    pub fn volume_policy(&self) -> gridlease_protocol::VolumePolicy {
        let price = self
            .volume_price
            .parse::<gridlease_contracts::Money>()
            .map_or(0, |m| m.micros());
        gridlease_protocol::VolumePolicy {
            price_per_gib_hour: price,
            max_gib: self.max_volume_gib.min(gridlease_protocol::MAX_VOLUME_GIB),
            max_keep_s: self.max_volume_keep_days.saturating_mul(86_400),
        }
    }

    /// The chain, token and contract this node settles on (`None`: GLU only), checked:
    /// all three of `chain_id`, `token` and `channel_contract` or none, addresses that parse,
    /// decimals in range.
    pub fn chain(&self) -> Result<Option<gridlease_protocol::wallet::ChainTerms>, ConfigError> {
        use gridlease_protocol::wallet::{
            Address, ChainTerms, MAX_TOKEN_DECIMALS, MIN_TOKEN_DECIMALS,
        };
        let (id, token, contract) = match (self.chain_id, &self.token, &self.channel_contract) {
            (None, None, None) => return Ok(None),
            (Some(id), Some(t), Some(c)) => (id, t, c),
            _ => {
                return Err(ConfigError::Invalid {
                    field: "chain_id, token, channel_contract",
                    problem: "on-chain settlement needs all three (or none: GLU only)".into(),
                });
            }
        };
        let address = |field, text: &str| {
            text.trim()
                .parse::<Address>()
                .map_err(|e| ConfigError::Invalid {
                    field,
                    problem: e.to_string(),
                })
        };
        let chain = ChainTerms {
            chain_id: id,
            token: address("token", token)?.0,
            token_decimals: self.token_decimals,
            channel_contract: address("channel_contract", contract)?.0,
        };
        if id == 0 {
            return Err(ConfigError::Invalid {
                field: "chain_id",
                problem: "0 is no chain".into(),
            });
        }
        if !(MIN_TOKEN_DECIMALS..=MAX_TOKEN_DECIMALS).contains(&self.token_decimals) {
            return Err(ConfigError::Invalid {
                field: "token_decimals",
                problem: format!(
                    "{} is not in {MIN_TOKEN_DECIMALS}..={MAX_TOKEN_DECIMALS}",
                    self.token_decimals
                ),
            });
        }
        Ok(Some(chain))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let chain = self.chain()?;
        if let Some(rpc) = &self.chain_rpc {
            if chain.is_none() {
                return Err(ConfigError::Invalid {
                    field: "chain_rpc",
                    problem: "needs chain_id, token and channel_contract".into(),
                });
            }
            let rpc = rpc.trim();
            if !(rpc.starts_with("http://") || rpc.starts_with("https://")) {
                return Err(ConfigError::Invalid {
                    field: "chain_rpc",
                    problem: "must be an http:// or https:// URL".into(),
                });
            }
        }
        if !(1..=86_400).contains(&self.redeem_interval_secs) {
            return Err(ConfigError::Invalid {
                field: "redeem_interval_secs",
                problem: format!("{} is not in 1..=86400", self.redeem_interval_secs),
            });
        }
        if let Err(e) = self.volume_price.parse::<gridlease_contracts::Money>() {
            return Err(ConfigError::Invalid {
                field: "volume_price",
                problem: format!("{:?}: {e}", self.volume_price),
            });
        }
        for (field, addrs) in [
            ("listen", &self.listen),
            ("bootstrap", &self.bootstrap),
            ("external_addrs", &self.external_addrs),
        ] {
            for a in addrs {
                a.parse::<libp2p::Multiaddr>()
                    .map_err(|e| ConfigError::Invalid {
                        field,
                        problem: format!("{a:?} is not a multiaddr ({e})"),
                    })?;
            }
        }
        gridlease_contracts::image::check_policy(&self.image_policy()).map_err(|problem| {
            ConfigError::Invalid {
                field: "image policy",
                problem,
            }
        })?;
        if self.listen.is_empty() {
            return Err(ConfigError::Invalid {
                field: "listen",
                problem: "at least one listen address is needed".into(),
            });
        }
        if self.follow.len() > gridlease_protocol::class::MAX_FOLLOWED_CLASSES {
            return Err(ConfigError::Invalid {
                field: "follow",
                problem: format!(
                    "{} classes; at most {} can be followed",
                    self.follow.len(),
                    gridlease_protocol::class::MAX_FOLLOWED_CLASSES
                ),
            });
        }
        if self.announce_secs == 0 || self.announce_secs > 3600 {
            return Err(ConfigError::Invalid {
                field: "announce_secs",
                problem: format!("{} is not in 1..=3600", self.announce_secs),
            });
        }
        let (lo, hi) = gridlease_contracts::terms::USAGE_INTERVAL_RANGE_S;
        if !(lo..=hi).contains(&self.usage_interval_secs) {
            return Err(ConfigError::Invalid {
                field: "usage_interval_secs",
                problem: format!("{} is not in {lo}..={hi}", self.usage_interval_secs),
            });
        }
        if !(1..=86_400).contains(&self.owner_idle_secs) {
            return Err(ConfigError::Invalid {
                field: "owner_idle_secs",
                problem: format!("{} is not in 1..=86400", self.owner_idle_secs),
            });
        }
        if self.lease_log_days > 3650 {
            return Err(ConfigError::Invalid {
                field: "lease_log_days",
                problem: format!("{} is not in 0..=3650", self.lease_log_days),
            });
        }
        if self.lease_logs_gib > 1024 {
            return Err(ConfigError::Invalid {
                field: "lease_logs_gib",
                problem: format!("{} is not in 0..=1024", self.lease_logs_gib),
            });
        }
        if self.owner_util_percent > 100 {
            return Err(ConfigError::Invalid {
                field: "owner_util_percent",
                problem: format!("{} is not in 0..=100", self.owner_util_percent),
            });
        }
        if self.pay_ahead_secs < self.usage_interval_secs {
            return Err(ConfigError::Invalid {
                field: "pay_ahead_secs",
                problem: format!(
                    "{} is shorter than one usage interval ({} s): every lease would stop at its first report",
                    self.pay_ahead_secs, self.usage_interval_secs
                ),
            });
        }
        let max_grace = gridlease_contracts::terms::MAX_GRACE_S;
        if !(1..=max_grace).contains(&self.renter_grace_secs) {
            return Err(ConfigError::Invalid {
                field: "renter_grace_secs",
                problem: format!("{} is not in 1..={max_grace}", self.renter_grace_secs),
            });
        }
        // The rule the sandbox applies to the name when it creates a container.
        if !gridlease_sandbox::spec::valid_docker_name(&self.gvisor_runtime) {
            return Err(ConfigError::Invalid {
                field: "gvisor_runtime",
                problem: format!(
                    "{:?} is not a Docker runtime name (letters, digits, _ . -)",
                    self.gvisor_runtime
                ),
            });
        }
        if let Some(m) = &self.metrics {
            m.parse::<std::net::SocketAddr>()
                .map_err(|_| ConfigError::Invalid {
                    field: "metrics",
                    problem: format!("{m:?} is not an IP:port address"),
                })?;
        }
        Ok(())
    }

    /// What offers keep back from the host (unset fields: the documented defaults).
    pub fn host_reserve(&self) -> gridlease_contracts::capacity::HostReserve {
        let disk = gridlease_contracts::capacity::HostReserve {
            disk_gib: self.reserve_disk_gib,
            ..Default::default()
        }
        .disk();
        gridlease_contracts::capacity::HostReserve {
            ram_mib: self.reserve_ram_mib,
            cpu_millicores: self.reserve_cpu_millicores,
            // The lease logs' budget is disk no offer may promise.
            disk_gib: Some(disk.saturating_add(self.lease_logs_gib)),
        }
    }

    /// How long, and how much of, finished leases' logs are kept.
    pub fn log_retention(&self) -> crate::lease::retention::LogRetention {
        crate::lease::retention::LogRetention {
            keep_for: std::time::Duration::from_secs(u64::from(self.lease_log_days) * 86_400),
            max_bytes: self.lease_logs_gib.saturating_mul(1 << 30),
        }
    }

    /// The explicit per-GPU values (each only lowers the host-derived one).
    pub fn per_gpu_limit(&self) -> gridlease_contracts::capacity::PerGpuLimit {
        gridlease_contracts::capacity::PerGpuLimit {
            ram_mib: self.per_gpu_ram_mib,
            cpu_millicores: self.per_gpu_cpu_millicores,
            disk_gib: self.per_gpu_disk_gib,
        }
    }

    /// The configuration as TOML (what `--dump-config` prints).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }

    /// The Debian package's `/etc/gridlease/config.toml`: every default, commented out
    /// (`packaging/deb/config.toml`, held to this by a test; `cargo run -p gridlease-node
    /// --example default_config` writes it).
    pub fn commented_defaults() -> String {
        let mut out = String::from(
            "# gridlease node configuration (read by `gridlease node --config /etc/gridlease/config.toml`).\n\
             # Every `gridlease node` flag has a key here (docs/cli.md, \"Configuration\"); a line\n\
             # left commented keeps its default, shown. Keys whose default depends on the host\n\
             # (reserve_ram_mib, per_gpu_*) are described in docs/cli.md.\n\
             # After a change: `systemctl restart gridlease`; check with `gridlease doctor --config\n\
             # /etc/gridlease/config.toml`.\n\n",
        );
        for line in Self::default().to_toml().lines() {
            if line.is_empty() {
                out.push('\n');
            } else {
                out.push_str("# ");
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

#[cfg(test)]
mod tests;
