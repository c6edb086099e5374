//! Every environment variable gridlease reads, in one place.

/// The node's home directory (same as `--home`).
pub const GRIDLEASE_HOME: &str = "GRIDLEASE_HOME";
/// The node's configuration file (same as `node --config`; default `<home>/config.toml`).
pub const GRIDLEASE_CONFIG: &str = "GRIDLEASE_CONFIG";
/// `tracing` filter directives, e.g. `info,gridlease_node=debug`.
pub const RUST_LOG: &str = "RUST_LOG";
/// The user's home; the default node home is `$HOME/.gridlease`.
pub const HOME: &str = "HOME";
/// Listen addresses, comma-separated (config key `listen`).
pub const GRIDLEASE_LISTEN: &str = "GRIDLEASE_LISTEN";
/// Bootstrap peers, comma-separated (config key `bootstrap`).
pub const GRIDLEASE_BOOTSTRAP: &str = "GRIDLEASE_BOOTSTRAP";
/// External addresses, comma-separated (config key `external_addrs`).
pub const GRIDLEASE_EXTERNAL_ADDRS: &str = "GRIDLEASE_EXTERNAL_ADDRS";
/// `true`/`false` (config key `relay_server`).
pub const GRIDLEASE_RELAY_SERVER: &str = "GRIDLEASE_RELAY_SERVER";
/// `true`/`false` (config key `mdns`).
pub const GRIDLEASE_MDNS: &str = "GRIDLEASE_MDNS";
/// `true`/`false` (config key `allow_shell`).
pub const GRIDLEASE_ALLOW_SHELL: &str = "GRIDLEASE_ALLOW_SHELL";
/// `true`/`false` (config key `allow_exec`).
pub const GRIDLEASE_ALLOW_EXEC: &str = "GRIDLEASE_ALLOW_EXEC";
/// `true`/`false` (config key `allow_forward`).
pub const GRIDLEASE_ALLOW_FORWARD: &str = "GRIDLEASE_ALLOW_FORWARD";
/// Seconds (config key `announce_secs`).
pub const GRIDLEASE_ANNOUNCE_SECS: &str = "GRIDLEASE_ANNOUNCE_SECS";
/// GPU classes to follow, comma-separated (config key `follow`).
pub const GRIDLEASE_FOLLOW: &str = "GRIDLEASE_FOLLOW";
/// Declared GPUs (config key `dev_gpus`).
pub const GRIDLEASE_DEV_GPUS: &str = "GRIDLEASE_DEV_GPUS";
/// Seconds an owner-used GPU stays out of the offer (config key `owner_idle_secs`).
pub const GRIDLEASE_OWNER_IDLE_SECS: &str = "GRIDLEASE_OWNER_IDLE_SECS";
/// Utilisation meaning the owner uses a GPU (config key `owner_util_percent`).
pub const GRIDLEASE_OWNER_UTIL_PERCENT: &str = "GRIDLEASE_OWNER_UTIL_PERCENT";
/// A curves file scripting declared GPUs' samples (config key `dev_gpu_samples`).
pub const GRIDLEASE_DEV_GPU_SAMPLES: &str = "GRIDLEASE_DEV_GPU_SAMPLES";
/// Prometheus endpoint address (config key `metrics`).
pub const GRIDLEASE_METRICS: &str = "GRIDLEASE_METRICS";
/// GLU per GiB-hour of kept volumes (config key `volume_price`).
pub const GRIDLEASE_VOLUME_PRICE: &str = "GRIDLEASE_VOLUME_PRICE";
/// Largest volume, GiB (config key `max_volume_gib`).
pub const GRIDLEASE_MAX_VOLUME_GIB: &str = "GRIDLEASE_MAX_VOLUME_GIB";
/// Most volumes kept at once (config key `max_volumes`).
pub const GRIDLEASE_MAX_VOLUMES: &str = "GRIDLEASE_MAX_VOLUMES";
/// Longest keep period of a volume, days (config key `max_volume_keep_days`).
pub const GRIDLEASE_MAX_VOLUME_KEEP_DAYS: &str = "GRIDLEASE_MAX_VOLUME_KEEP_DAYS";
/// `text` or `json` (config key `log_format`).
pub const GRIDLEASE_LOG_FORMAT: &str = "GRIDLEASE_LOG_FORMAT";
/// Terminal width in columns (set by shells and test harnesses); tables fit it.
pub const COLUMNS: &str = "COLUMNS";
/// MiB (config key `reserve_ram_mib`).
pub const GRIDLEASE_RESERVE_RAM_MIB: &str = "GRIDLEASE_RESERVE_RAM_MIB";
/// Millicores (config key `reserve_cpu_millicores`).
pub const GRIDLEASE_RESERVE_CPU_MILLICORES: &str = "GRIDLEASE_RESERVE_CPU_MILLICORES";
/// GiB (config key `reserve_disk_gib`).
pub const GRIDLEASE_RESERVE_DISK_GIB: &str = "GRIDLEASE_RESERVE_DISK_GIB";
/// MiB (config key `per_gpu_ram_mib`).
pub const GRIDLEASE_PER_GPU_RAM_MIB: &str = "GRIDLEASE_PER_GPU_RAM_MIB";
/// Millicores (config key `per_gpu_cpu_millicores`).
pub const GRIDLEASE_PER_GPU_CPU_MILLICORES: &str = "GRIDLEASE_PER_GPU_CPU_MILLICORES";
/// GiB (config key `per_gpu_disk_gib`).
pub const GRIDLEASE_PER_GPU_DISK_GIB: &str = "GRIDLEASE_PER_GPU_DISK_GIB";
/// Comma-separated registry hosts (config key `image_registries`).
pub const GRIDLEASE_IMAGE_REGISTRIES: &str = "GRIDLEASE_IMAGE_REGISTRIES";
/// Comma-separated canonical reference prefixes (config key `image_prefixes`).
pub const GRIDLEASE_IMAGE_PREFIXES: &str = "GRIDLEASE_IMAGE_PREFIXES";
/// Comma-separated rentable local images (config key `local_images`).
pub const GRIDLEASE_LOCAL_IMAGES: &str = "GRIDLEASE_LOCAL_IMAGES";
/// GiB (config key `max_image_gib`).
pub const GRIDLEASE_MAX_IMAGE_GIB: &str = "GRIDLEASE_MAX_IMAGE_GIB";
/// GiB (config key `max_unpacked_gib`).
pub const GRIDLEASE_MAX_UNPACKED_GIB: &str = "GRIDLEASE_MAX_UNPACKED_GIB";
/// Count (config key `image_cache_images`).
pub const GRIDLEASE_IMAGE_CACHE_IMAGES: &str = "GRIDLEASE_IMAGE_CACHE_IMAGES";
/// GiB (config key `image_cache_gib`).
pub const GRIDLEASE_IMAGE_CACHE_GIB: &str = "GRIDLEASE_IMAGE_CACHE_GIB";
/// `runc` or `gvisor` (config key `isolation`).
pub const GRIDLEASE_ISOLATION: &str = "GRIDLEASE_ISOLATION";
/// Seconds (config key `output_retention_secs`).
pub const GRIDLEASE_OUTPUT_RETENTION_SECS: &str = "GRIDLEASE_OUTPUT_RETENTION_SECS";
/// Seconds (config key `upload_hold_secs`).
pub const GRIDLEASE_UPLOAD_HOLD_SECS: &str = "GRIDLEASE_UPLOAD_HOLD_SECS";
/// Seconds (config key `verify_window_secs`).
pub const GRIDLEASE_VERIFY_WINDOW_SECS: &str = "GRIDLEASE_VERIFY_WINDOW_SECS";
/// Docker runtime name of gVisor (config key `gvisor_runtime`).
pub const GRIDLEASE_GVISOR_RUNTIME: &str = "GRIDLEASE_GVISOR_RUNTIME";
/// Seconds (config key `usage_interval_secs`).
pub const GRIDLEASE_USAGE_INTERVAL_SECS: &str = "GRIDLEASE_USAGE_INTERVAL_SECS";
/// Days (config key `lease_log_days`).
pub const GRIDLEASE_LEASE_LOG_DAYS: &str = "GRIDLEASE_LEASE_LOG_DAYS";
/// GiB (config key `lease_logs_gib`).
pub const GRIDLEASE_LEASE_LOGS_GIB: &str = "GRIDLEASE_LEASE_LOGS_GIB";
/// Seconds (config key `pay_ahead_secs`).
pub const GRIDLEASE_PAY_AHEAD_SECS: &str = "GRIDLEASE_PAY_AHEAD_SECS";
/// Seconds (config key `renter_grace_secs`).
pub const GRIDLEASE_RENTER_GRACE_SECS: &str = "GRIDLEASE_RENTER_GRACE_SECS";
/// EIP-155 chain id of on-chain settlement (config key `chain_id`).
pub const GRIDLEASE_CHAIN_ID: &str = "GRIDLEASE_CHAIN_ID";
/// ERC-20 token address settled in (config key `token`).
pub const GRIDLEASE_TOKEN: &str = "GRIDLEASE_TOKEN";
/// The token's decimals (config key `token_decimals`).
pub const GRIDLEASE_TOKEN_DECIMALS: &str = "GRIDLEASE_TOKEN_DECIMALS";
/// The payment channel contract's address (config key `channel_contract`).
pub const GRIDLEASE_CHANNEL_CONTRACT: &str = "GRIDLEASE_CHANNEL_CONTRACT";
/// The chain's JSON-RPC endpoint (config key `chain_rpc`).
pub const GRIDLEASE_CHAIN_RPC: &str = "GRIDLEASE_CHAIN_RPC";
/// Seconds between settlement passes (config key `redeem_interval_secs`).
pub const GRIDLEASE_REDEEM_INTERVAL_SECS: &str = "GRIDLEASE_REDEEM_INTERVAL_SECS";
