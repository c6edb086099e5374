//! `gridlease node`: the daemon.

use std::path::Path;

use anyhow::Context;
use clap::Args;
use libp2p::Multiaddr;

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::api::ApiState;
use crate::api::types::{GpuView, GpusView};
use crate::config::{Config, Overrides};
use crate::home::Home;
use crate::lease::{ProvideSettings, SharedGpuSampler};
use crate::net::{NetworkEvent, Node, NodeConfig, OfferTemplate};
use crate::provider_gpus::{BenchCache, ProviderGpus, bench_program};
use crate::store::StoreHandle;
use gridlease_contracts::capacity::per_gpu_resources;
use gridlease_protocol::ResourcesPerGpu;
use gridlease_sandbox::dev_gpus::DevGpus;
use gridlease_sandbox::gpu::{GpuProbe, NvmlProbe};
use gridlease_sandbox::meter::GpuSampler;

/// Arguments of `gridlease node`. Each setting overrides `<home>/config.toml`; its environment
/// variable counts as the flag (see `docs/cli.md`, "Configuration").
#[derive(Debug, Args)]
pub struct NodeArgs {
    /// The settings (each also read from its `GRIDLEASE_*` environment variable).
    #[command(flatten)]
    pub settings: Overrides,
    /// The configuration file to read instead of `<home>/config.toml` (the Debian package's
    /// unit passes `/etc/gridlease/config.toml`). It must exist when given.
    #[arg(long, value_name = "FILE", env = crate::env_vars::GRIDLEASE_CONFIG)]
    pub config: Option<std::path::PathBuf>,
    /// Print the merged configuration (defaults < config.toml < environment < flags) and exit.
    #[arg(long)]
    pub dump_config: bool,
}

fn addrs(list: &[String]) -> anyhow::Result<Vec<Multiaddr>> {
    list.iter()
        .map(|a| a.parse::<Multiaddr>().map_err(anyhow::Error::from))
        .collect()
}

/// The GPUs this node shows in `gridlease gpus`: declared ones, or the local NVML inventory.
fn gpu_view(dev: Option<&DevGpus>) -> GpusView {
    match dev {
        Some(d) => GpusView {
            gpus: d
                .groups()
                .iter()
                .flat_map(|g| {
                    (0..g.count).map(move |i| GpuView {
                        id: format!("declared-{i}"),
                        model: g.model.clone(),
                        vram_mib: g.vram_mib,
                        source: "declared".into(),
                    })
                })
                .collect(),
            note: None,
        },
        None => crate::commands::gpus::local_inventory(),
    }
}

/// The driver's GPUs with their (cached or freshly run) benchmarks, and the NVML probe that
/// samples them; `None` when NVML answers but lists no GPU.
async fn driver_gpus(home: &Path) -> anyhow::Result<Option<(ProviderGpus, Arc<dyn GpuSampler>)>> {
    let home = home.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let probe = NvmlProbe::new()?;
        let gpus = probe.list()?;
        if gpus.is_empty() {
            return Ok(None);
        }
        let now = crate::clock::now();
        let mut cache = BenchCache::load(&home);
        match bench_program() {
            Some(program) => {
                if cache.fill(&gpus, &program, now) > 0
                    && let Err(e) = cache.save(&home)
                {
                    tracing::warn!(error = %e, "benchmark results not cached");
                }
            }
            None => tracing::warn!(
                "gridlease-gpu-bench is not installed next to gridlease: GPUs without a cached benchmark are offered as unverified"
            ),
        }
        let offered = ProviderGpus::from_inventory(&gpus, &cache, now);
        tracing::info!(gpus = gpus.len(), "GPUs found by the driver");
        let sampler: Arc<dyn GpuSampler> = Arc::new(probe);
        Ok(Some((offered, sampler)))
    })
    .await?
}

/// The scripted sampler of the declared GPUs (`--dev-gpu-samples FILE`): every declared GPU's
/// curve from the file, the offered ones (`offered`, the first group's, in order) known by
/// the probe's synthetic UUIDs. Telemetry labels it `scripted`: no real GPU is sampled.
fn scripted_sampler(
    spec: Option<&str>,
    path: &Path,
    offered: &[gridlease_protocol::OfferedGpu],
) -> anyhow::Result<SharedGpuSampler> {
    let spec = spec.context("dev_gpu_samples needs dev_gpus")?;
    let mut probe = gridlease_sandbox::gpu::ScriptedProbe::from_dev_spec(spec)?;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the GPU curves file {}", path.display()))?;
    probe
        .set_curves_json(&text)
        .with_context(|| format!("GPU curves file {}", path.display()))?;
    let ids = offered
        .iter()
        .zip(GpuProbe::list(&probe)?)
        .map(|(o, g)| (o.spec.uuid_digest, g.uuid))
        .collect();
    tracing::warn!(file = %path.display(), "declared GPUs sample scripted curves: telemetry is not from a real GPU");
    Ok(SharedGpuSampler {
        sampler: Arc::new(probe),
        ids,
        source: gridlease_protocol::telemetry::TelemetrySource::Scripted,
    })
}

/// What each of `gpus` offered GPUs comes with: the host (RAM, CPUs, free disk of Docker's
/// root directory and of `data_dir`, see `gridlease_sandbox::host`) minus the configured
/// reserve, divided by the GPUs (`gridlease_contracts::capacity`), so all of them leased at
/// once fit the host.
async fn host_resources(
    config: &Config,
    data_dir: &Path,
    gpus: usize,
) -> anyhow::Result<ResourcesPerGpu> {
    let sandbox = gridlease_sandbox::Sandbox::connect().await.ok();
    let reading = gridlease_sandbox::host::read_host(sandbox.as_ref(), data_dir)
        .await
        .context("cannot measure this host's RAM, CPUs and disk")?;
    let reserve = config.host_reserve();
    let f = reading.facts;
    let per = per_gpu_resources(&f, &reserve, &config.per_gpu_limit(), gpus).context(
        "this host cannot back an offer: free disk, or lower reserve_ram_mib / reserve_cpu_millicores / reserve_disk_gib / lease_logs_gib, or offer fewer GPUs",
    )?;
    tracing::info!(
        gpus,
        ram_mib = per.ram_mib,
        cpu_millicores = per.cpu_millicores,
        disk_gib = per.disk_gib,
        host_ram_mib = f.ram_mib,
        host_cpu_millicores = f.cpu_millicores,
        host_disk_free_gib = f.disk_free_gib,
        reserve_ram_mib = reserve.ram_for(f.ram_mib),
        reserve_cpu_millicores = reserve.cpu(),
        reserve_disk_gib = reserve.disk(),
        disk = %reading.disk_path.display(),
        "resources per offered GPU, from the host minus the reserve"
    );
    Ok(per)
}

/// The interactive access this node offers: the config's, without forwarding when the node
/// cannot enter containers' network namespaces (not root).
fn access_policy(config: &Config) -> gridlease_protocol::access::AccessPolicy {
    let mut p = config.access_policy();
    if p.forward && !gridlease_sandbox::access::can_enter_netns() {
        tracing::warn!(
            "port forwarding is not offered: this node cannot enter containers' network namespaces (it needs CAP_SYS_ADMIN; run the provider node as root)"
        );
        p.forward = false;
    }
    p
}

/// The Docker runtime tenants run under, checked: for `isolation = "gvisor"` a probe container
/// must run under the registered runtime and see gVisor's kernel, or the node does not start
/// (a provider who asked for gVisor never silently gets runc). Without Docker there is nothing
/// to check (the node cannot run leases; the lease service says so).
async fn check_isolation(config: &Config) -> anyhow::Result<Option<String>> {
    let runtime = config.runtime();
    if config.isolation == gridlease_protocol::Isolation::Runc {
        return Ok(runtime);
    }
    let Ok(sb) = gridlease_sandbox::Sandbox::connect().await else {
        return Ok(runtime);
    };
    let seen =
        gridlease_sandbox::isolation::check_runtime(&sb, config.isolation, runtime.as_deref())
            .await
            .context("isolation = \"gvisor\" cannot be used")?;
    tracing::info!(
        runtime = ?seen.runtime,
        path = ?seen.path,
        args = ?seen.args,
        tenant_kernel = %seen.tenant_kernel,
        host_kernel = %seen.host_kernel,
        "tenants run under gVisor"
    );
    Ok(runtime)
}

/// Runs the node until Ctrl-C or SIGTERM with an already resolved configuration.
pub async fn run(home: &Path, config: Config) -> anyhow::Result<()> {
    let h = Home::open(home)?;
    crate::api::ensure_not_running(home).await?;
    let wallet_key = h.wallet()?;
    let wallet = wallet_key.address();
    // On-chain settlement (issue 50): offers name the chain, renters sign vouchers.
    let settlement = config.chain()?.map(|chain| {
        let mut s =
            crate::lease::config::ChainSettlement::new(chain, &h.key, &h.network, wallet_key);
        s.rpc = config.chain_rpc.as_ref().map(|r| r.trim().to_string());
        s
    });
    if let Some(s) = &settlement {
        tracing::info!(wallet = %wallet, "settling on {}", s.chain);
    }
    let chain_wallet = settlement.as_ref().map(|s| (s.chain, s.wallet.clone()));
    let chain_rpc = config.chain_rpc.as_ref().map(|r| r.trim().to_string());
    let redeem_interval = std::time::Duration::from_secs(config.redeem_interval_secs);
    // `gridlease doctor`'s checks, in the background: what is not ok is logged with its fix.
    {
        let (home, config) = (home.to_path_buf(), config.clone());
        tokio::spawn(async move {
            for c in super::doctor::local_checks(&home, &config, false).await {
                match c.level {
                    super::doctor::Level::Fail => {
                        tracing::error!(check = c.item, fix = %c.fix, "{}", c.detail);
                    }
                    super::doctor::Level::Warn => {
                        tracing::warn!(check = c.item, fix = %c.fix, "{}", c.detail);
                    }
                    super::doctor::Level::Ok | super::doctor::Level::Skip => {}
                }
            }
        });
    }
    let store = h.open_store()?;
    let mut net = NodeConfig::new(h.network.clone());
    // Peer connections may take what descriptors leave after the node's own needs.
    let nofile = gridlease_sandbox::host::raise_nofile();
    net.connections = crate::net::ConnectionCaps::for_descriptors(nofile);
    tracing::info!(
        nofile,
        max_inbound_connections = net.connections.max_established_incoming,
        max_pending_handshakes = net.connections.max_pending_incoming,
        "descriptor budget"
    );
    net.listen = addrs(&config.listen)?;
    net.bootstrap = addrs(&config.bootstrap)?;
    net.relay_server = config.relay_server;
    net.external_addrs = addrs(&config.external_addrs)?;
    net.mdns = config.mdns;
    net.announce_period = std::time::Duration::from_secs(config.announce_secs.max(1));
    net.offer_ttl = NodeConfig::ttl_for(net.announce_period);
    net.offer_resync = NodeConfig::resync_for(net.announce_period);
    net.follow = (!config.follow.is_empty()).then(|| config.follow.clone());
    let dev = config.dev_gpus.as_deref().map(DevGpus::parse).transpose()?;
    let access = access_policy(&config);
    let runtime = (config.isolation, check_isolation(&config).await?);
    // GPUs from the driver when none are declared: offered after `gridlease provide --price`,
    // each leased one passed to its container by UUID, and sampled for metering.
    let mut driver_template = None;
    let mut gpu_uuids = std::collections::BTreeMap::new();
    let mut gpu_sampler = None;
    let mut prover = None;
    if dev.is_none() {
        match driver_gpus(home).await {
            Ok(Some((gpus, probe))) => {
                let mut t = OfferTemplate::new(gpus.offered, 0);
                t.images = config.image_policy();
                t.sandbox.access = access;
                t.sandbox.isolation = config.isolation;
                t.sandbox.output_retention_s = config.output_retention_secs;
                t.sandbox.upload_hold_s = config.upload_hold_secs;
                t.sandbox.volumes = config.volume_policy();
                t.usage_interval_s = config.usage_interval_secs;
                t.pay_ahead_s = config.pay_ahead_secs;
                // The GPU check: the CUDA prover, if it passes its self-test on these GPUs.
                let window_s = config.verify_window_secs;
                let uuids: Vec<String> = gpus.uuids.values().cloned().collect();
                let vram = t
                    .gpus
                    .iter()
                    .map(|g| u64::from(g.spec.vram_mib) << 20)
                    .min();
                prover = crate::provider_proof::advertise(&mut t, move || {
                    crate::provider_proof::cuda(window_s, uuids, vram.unwrap_or(0))
                })
                .await;
                match host_resources(&config, &h.dir.join("leases"), t.gpus.len()).await {
                    Ok(per) => {
                        t.per_gpu = per;
                        driver_template = Some(t);
                        gpu_uuids = gpus.uuids;
                        gpu_sampler = Some(SharedGpuSampler {
                            sampler: probe,
                            ids: gpu_uuids.clone(),
                            source: gridlease_protocol::telemetry::TelemetrySource::Driver,
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = format!("{e:#}"), "not offering the driver's GPUs")
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::info!(error = %e, "no GPUs from the driver: this node can rent, not provide")
            }
        }
    }
    if driver_template.is_some() && config.isolation == gridlease_protocol::Isolation::Gvisor {
        tracing::warn!(
            "gVisor and GPUs: a container reaches the GPU under runsc only through its nvproxy (gVisor 2023 or later, runsc --nvproxy; Debian 12's runsc 20221219 has none); untested by this project, which has no GPU in CI"
        );
    }
    if dev.is_none() && config.dev_gpu_samples.is_some() {
        anyhow::bail!("dev_gpu_samples scripts declared GPUs: it needs dev_gpus (--dev-gpus)");
    }
    if let Some(gpus) = &dev {
        let groups = gpus.groups();
        if let Some(first) = groups.first() {
            let offered = first.offered(&h.key.public(), crate::clock::now());
            let mut t = OfferTemplate::new(offered, first.price.micros());
            t.images = config.image_policy();
            t.sandbox.access = access;
            t.sandbox.isolation = config.isolation;
            t.sandbox.output_retention_s = config.output_retention_secs;
            t.sandbox.upload_hold_s = config.upload_hold_secs;
            t.sandbox.volumes = config.volume_policy();
            t.usage_interval_s = config.usage_interval_secs;
            t.pay_ahead_s = config.pay_ahead_secs;
            t.sandbox.image_prefixes = t.images.prefixes.clone();
            t.per_gpu = host_resources(&config, &h.dir.join("leases"), t.gpus.len()).await?;
            // Declared GPUs answer renters' GPU checks with the CPU reference, labelled so.
            let window_s = config.verify_window_secs;
            prover = crate::provider_proof::advertise(&mut t, move || {
                crate::provider_proof::cpu_reference(window_s)
            })
            .await;
            if let Some(path) = &config.dev_gpu_samples {
                gpu_sampler = Some(scripted_sampler(config.dev_gpus.as_deref(), path, &t.gpus)?);
            }
            net.offer = Some(t);
            for skipped in groups.iter().skip(1) {
                tracing::warn!(
                    model = %skipped.model,
                    price = %skipped.price,
                    "one offer per node: this GPU group is not advertised; run another node for it"
                );
            }
        }
    }
    // What the operator last asked for with `provide` wins over the start-up default, before
    // the first announcement.
    for t in [&mut net.offer, &mut driver_template].into_iter().flatten() {
        t.settlement = settlement.as_ref().map(|s| s.offer());
    }
    let base_template = net.offer.clone().or(driver_template);
    match ProvideSettings::load(&ProvideSettings::path(home)) {
        Ok(Some(saved)) => match saved.template(base_template.as_ref()) {
            Ok(t) => {
                tracing::info!(enabled = saved.enabled, price = %saved.price_per_gpu_hour, "provide settings restored");
                net.offer = t;
            }
            Err(e) => tracing::warn!(error = %e, "saved provide settings not applied"),
        },
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "ignoring unreadable provide settings"),
    }
    let gpus = Arc::new(gpu_view(dev.as_ref()));
    let metrics_addr = config.metrics.clone();
    // The lease service's settings: its defaults, with this daemon's configuration laid over.
    let mut lease_config = crate::lease::LeaseServiceConfig::new(h.dir.join("leases"));
    lease_config.renter_grace_s = config.renter_grace_secs;
    lease_config.owner_idle = std::time::Duration::from_secs(config.owner_idle_secs);
    lease_config.owner_util_percent = config.owner_util_percent;
    lease_config.log_retention = config.log_retention();
    lease_config.image_cache = config.image_cache();
    lease_config.volumes = crate::lease::config::VolumeLimits {
        max_volumes: config.max_volumes,
        reserve_disk_gib: config.host_reserve().disk_gib.unwrap_or(0),
    };
    (lease_config.limits.isolation, lease_config.limits.runtime) = runtime;
    lease_config.prover = prover;
    lease_config.settlement = settlement;
    let config = net;
    let network = h.network.clone();

    let node = Node::start(h.key, config, StoreHandle::spawn(store))
        .await
        .context("cannot start the network")?;
    tracing::info!(peer = %node.client.peer_id(), %network, "node running");
    // Subscribed before the (slower) lease service start-up, so offers learned meanwhile (a
    // book sync right after connecting to a bootstrap peer) are logged too.
    let mut events = node.events.subscribe();
    let leases = crate::lease::start_for_daemon(
        &node,
        &h.dir,
        lease_config,
        base_template,
        gpu_uuids,
        gpu_sampler,
    )
    .await
    .context("cannot start the lease service")?;
    let cancel = CancellationToken::new();
    let access_stats = crate::access::SharedStats::default();
    let access_task = match leases.sandbox() {
        Some(sb) => Some(crate::access::serve(
            &node.client,
            leases.clone(),
            sb,
            access,
            access_stats.clone(),
            cancel.clone(),
        )?),
        None => None,
    };
    let jobs = crate::jobs::JobService::new(home, node.client.store().clone(), cancel.clone());
    // On-chain settlement with an endpoint: the node redeems its own vouchers.
    let settlement_status = match (&chain_rpc, &chain_wallet) {
        (Some(rpc), Some((chain, key))) => {
            let (status, _task) = crate::settlement::spawn(
                crate::settlement::SettlementConfig {
                    rpc: rpc.clone(),
                    chain: *chain,
                    wallet: key.clone(),
                    interval: redeem_interval,
                },
                node.client.store().clone(),
                cancel.clone(),
            );
            Some(status)
        }
        _ => None,
    };
    let api_state = ApiState {
        client: node.client.clone(),
        started: Instant::now(),
        gpus,
        leases: leases.clone(),
        jobs: jobs.clone(),
        home: Arc::from(std::path::absolute(home).unwrap_or_else(|_| home.to_path_buf())),
        wallet,
        settlement: settlement_status,
    };
    // Metrics first: once the control API answers, everything the node serves is listening
    // (a client that waits for the API may scrape at once).
    let metrics_task = match metrics_addr {
        Some(addr) => Some(
            crate::metrics::serve(
                &addr,
                node.client.clone(),
                leases.clone(),
                access_stats.clone(),
                cancel.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let api_task = crate::api::serve(home, api_state, cancel.clone()).await?;
    tracing::info!(socket = %crate::api::socket_path(home).display(), "control API listening");
    // Jobs drive leases through the control API: resumed once it answers.
    match jobs.resume().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(jobs = n, "resumed running jobs"),
        Err(e) => tracing::error!(error = %e, "cannot resume jobs"),
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            ev = events.recv() => match ev {
                Ok(NetworkEvent::OfferAdmitted { id, seq, .. }) => {
                    tracing::info!(offer = %id.short(), seq, "offer learned");
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    }
    tracing::info!("shutting down");
    cancel.cancel();
    let _ = api_task.await;
    if let Some(t) = access_task {
        let _ = t.await;
    }
    if let Some(t) = metrics_task {
        let _ = t.await;
    }
    node.shutdown().await;
    // The lease service stops with the network; let it finish its teardown (bounded).
    if tokio::time::timeout(std::time::Duration::from_secs(15), leases.stopped())
        .await
        .is_err()
    {
        tracing::warn!("the lease service did not stop within 15 s");
    }
    Ok(())
}
