//! `gridlease node`: the daemon.

use std::path::Path;

use anyhow::Context;
use clap::Args;
use libp2p::Multiaddr;

use crate::dev_gpus::DevGpus;
use crate::home::Home;
use crate::net::{NetworkEvent, Node, NodeConfig, OfferTemplate};
use crate::store::StoreHandle;

/// Arguments of `gridlease node`.
#[derive(Debug, Args)]
pub struct NodeArgs {
    /// Listen address (repeatable). Default: TCP and QUIC on all interfaces, port 4001.
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<Multiaddr>,
    /// Peer to dial at start, with its /p2p/<id> (repeatable).
    #[arg(long = "bootstrap", value_name = "MULTIADDR")]
    pub bootstrap: Vec<Multiaddr>,
    /// Also serve as relay, AutoNAT server and DHT server (for public bootstrap nodes).
    #[arg(long)]
    pub relay_server: bool,
    /// Publicly reachable address of this node (repeatable); relays need one to serve.
    #[arg(long = "external-addr", value_name = "ADDR")]
    pub external_addrs: Vec<Multiaddr>,
    /// Advertise declared (unverified) GPUs: "[Nx]MODEL:VRAM:PRICE,..." e.g.
    /// "RTX 4090:24GiB:0.40,RTX 3090:24GiB:0.25".
    #[arg(long, value_name = "SPEC")]
    pub dev_gpus: Option<String>,
    /// Disable mDNS LAN discovery.
    #[arg(long)]
    pub no_mdns: bool,
    /// Seconds between offer re-announcements.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub announce_secs: u64,
}

/// Runs the node until Ctrl-C or SIGTERM.
pub async fn run(home: &Path, args: NodeArgs) -> anyhow::Result<()> {
    let h = Home::open(home)?;
    let store = h.open_store()?;
    let mut config = NodeConfig::new(h.network.clone());
    config.listen = if args.listen.is_empty() {
        vec![
            "/ip4/0.0.0.0/tcp/4001".parse()?,
            "/ip4/0.0.0.0/udp/4001/quic-v1".parse()?,
        ]
    } else {
        args.listen
    };
    config.bootstrap = args.bootstrap;
    config.relay_server = args.relay_server;
    config.external_addrs = args.external_addrs;
    config.mdns = !args.no_mdns;
    config.announce_period = std::time::Duration::from_secs(args.announce_secs.max(1));
    config.offer_ttl = NodeConfig::ttl_for(config.announce_period);
    if let Some(spec) = &args.dev_gpus {
        let gpus = DevGpus::parse(spec)?;
        let groups = gpus.groups();
        if let Some(first) = groups.first() {
            let offered = first.offered(&h.key.public(), crate::clock::now());
            config.offer = Some(OfferTemplate::new(offered, first.price.micros()));
            for skipped in groups.iter().skip(1) {
                tracing::warn!(
                    model = %skipped.model,
                    price = %skipped.price,
                    "one offer per node: this GPU group is not advertised; run another node for it"
                );
            }
        }
    }
    let network = h.network.clone();
    let base_template = config.offer.clone();
    let node = Node::start(h.key, config, StoreHandle::spawn(store))
        .await
        .context("cannot start the network")?;
    tracing::info!(peer = %node.client.peer_id(), %network, "node running");
    let _leases = crate::lease::start_for_daemon(&node, &h.dir, base_template)
        .await
        .context("cannot start the lease service")?;
    let mut events = node.events.subscribe();
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
                Ok(NetworkEvent::LeaseAccepted { lease_id, .. }) => {
                    tracing::info!(lease = %lease_id.short(), "lease accepted");
                }
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    }
    tracing::info!("shutting down");
    node.shutdown().await;
    Ok(())
}
