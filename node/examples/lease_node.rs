//! Test harness (not a user tool): one node with its lease service as a real process, so tests
//! can `kill -9` it and restart it from the same home. Used by `node/tests/lease_recovery.rs`
//! until the `gridlease rent` CLI (issue 6) exists.
//!
//! ```text
//! cargo run -p gridlease-node --example lease_node -- --home DIR [--listen ADDR]
//!     [--bootstrap ADDR].. [--provide] [--interval S] [--window S] [--grace S]
//!     [--watchdog-exe PATH] [--rent-image IMG --rent-duration S -- CMD..]
//! ```
//! Creates the home if missing. Prints `LISTEN <addr>` once listening, `LEASE <id>` after a
//! rent is accepted, `SETTLED <id> <total micro-units>` when a lease it takes part in settles.
//! A provider offers one declared GPU at 3.60/h (1000 micro-units per second) with the given
//! report interval and pay-ahead window. With `--watchdog-exe` (the `gridlease` binary) a
//! provider spawns a deadline watchdog per container, as the daemon does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use gridlease_node::home::Home;
use gridlease_node::lease::{LeaseService, LeaseServiceConfig, RentRequest};
use gridlease_node::net::{NetworkEvent, Node, NodeConfig, OfferTemplate};
use gridlease_node::store::StoreHandle;
use gridlease_protocol::{NetworkId, fixtures};
use libp2p::Multiaddr;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Args {
    #[arg(long)]
    home: PathBuf,
    #[arg(long)]
    listen: Option<Multiaddr>,
    #[arg(long)]
    bootstrap: Vec<Multiaddr>,
    #[arg(long)]
    provide: bool,
    #[arg(long, default_value_t = 2)]
    interval: u32,
    #[arg(long, default_value_t = 6)]
    window: u32,
    #[arg(long, default_value_t = 10)]
    grace: u32,
    #[arg(long)]
    watchdog_exe: Option<PathBuf>,
    #[arg(long)]
    rent_image: Option<String>,
    #[arg(long, default_value_t = 30)]
    rent_duration: u32,
    #[arg(last = true)]
    cmd: Vec<String>,
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let net = NetworkId::devnet();
    let h = if args.home.join(gridlease_node::home::IDENTITY_FILE).exists() {
        Home::open(&args.home).unwrap()
    } else {
        Home::init(&args.home, &net).unwrap()
    };
    let mut config = NodeConfig::local(net, Duration::from_secs(1));
    if let Some(l) = args.listen {
        config.listen = vec![l];
    }
    config.bootstrap = args.bootstrap.clone();
    let template = args.provide.then(|| {
        let mut t = OfferTemplate::new(vec![fixtures::gpu(0)], 3_600_000);
        t.min_duration_s = 1;
        t.min_billed_s = 1;
        t.usage_interval_s = args.interval;
        t.pay_ahead_s = args.window;
        t.per_gpu.cpu_millicores = 1000;
        t.per_gpu.ram_mib = 256;
        t.per_gpu.disk_gib = 1;
        // The probe image is local (imported here, never pulled): offered explicitly.
        t.images.local_images = vec![gridlease_sandbox::probe_image::probe_image_tag()];
        t
    });
    config.offer = template.clone();
    let store = StoreHandle::spawn(h.open_store().unwrap());
    let node = Node::start(h.key, config, store).await.unwrap();
    let mut events = node.events.subscribe();
    let addrs = node.client.listen_addrs().await.unwrap();
    say(&format!("LISTEN {}", addrs[0]));
    let mut svc = LeaseServiceConfig::new(args.home.join("leases"));
    svc.base_template = template;
    svc.renter_grace_s = args.grace;
    svc.start_allowance = Duration::from_secs(60);
    svc.stop_grace = Duration::from_secs(1);
    svc.watchdog = args.watchdog_exe.clone();
    svc.rpc_timeout = Duration::from_secs(5);
    let sandbox = if args.provide {
        Some(gridlease_sandbox::Sandbox::connect().await.unwrap())
    } else {
        None
    };
    let cancel = CancellationToken::new();
    let leases = LeaseService::start(node.client.clone(), &node.events, svc, sandbox, cancel)
        .await
        .unwrap();
    if let Some(image) = args.rent_image {
        let offer = loop {
            match events.recv().await {
                Ok(NetworkEvent::OfferAdmitted { id, .. }) => break id,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            }
        };
        let id = leases
            .rent(RentRequest {
                volumes: Vec::new(),
                mounts: Vec::new(),
                volume: None,
                verify: true,
                offer: offer.to_string(),
                gpus: 1,
                duration_s: args.rent_duration,
                image,
                command: args.cmd.clone(),
                env: Default::default(),
                max_total: None,
                network: gridlease_protocol::NetworkPolicy::None,
                keep_outputs_s: 0,
                upload_hold_s: 0,
                prepay_s: 0,
            })
            .await
            .unwrap();
        say(&format!("LEASE {id}"));
    }
    // Report settlements of every lease this node takes part in.
    let watcher = leases.clone();
    tokio::spawn(async move { report_settled(watcher).await });
    let _ = tokio::signal::ctrl_c().await;
}

async fn report_settled(leases: LeaseService) {
    let mut seen = std::collections::BTreeSet::new();
    loop {
        if let Ok(all) = leases.leases().await {
            for v in all {
                if v.state == gridlease_contracts::LeaseState::Settled && seen.insert(v.lease_id) {
                    say(&format!(
                        "SETTLED {} {}",
                        v.lease_id,
                        v.settled_total.unwrap_or(0)
                    ));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
