//! What the GPU check (issue 44) adds to `rent` -> running, with the CPU reference backend
//! (a `--dev-gpus` provider; no GPU here): rounds with the check and without it
//! (`rent --no-verify`), interleaved, on one provider and one renter in this process; and the
//! renter's CPU time checking the openings (`GpuCheckView::check_cpu_ms`).
//!
//! `cargo run --release -p gridlease-node --example bench_gpu_check -- [ROUNDS]`
//!
//! The time is taken when the renter's view says `running` (the provider's start notice): the
//! check runs before the command, so it is all in there. The CPU reference claims half the
//! rate it measures (as a daemon does), so its challenge is sized to about 1 s at that rate.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use gridlease_node::home::Home;
use gridlease_node::lease::provider::SharedProver;
use gridlease_node::lease::{LeaseService, LeaseServiceConfig, RentRequest};
use gridlease_node::net::{NetworkEvent, Node, NodeConfig, OfferTemplate};
use gridlease_node::store::{Store, StoreHandle};
use gridlease_protocol::proof::{ProofBackend, ProofPolicy};
use gridlease_protocol::{NetworkId, fixtures};
use gridlease_sandbox::Sandbox;
use gridlease_sandbox::proof::{CpuReference, Prover};
use tokio_util::sync::CancellationToken;

async fn node(root: &std::path::Path, name: &str, config: NodeConfig) -> Node {
    let home = root.join(name);
    let h = Home::init(&home, &config.network).unwrap();
    let store = StoreHandle::spawn(Store::open(&h.db_path()).unwrap());
    Node::start(h.key, config, store).await.unwrap()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(9);
    let sb = Sandbox::connect().await.expect("Docker is needed");
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let net = NetworkId::devnet();
    let prover = CpuReference::all_cores();
    let rate = prover.measure(&[]).unwrap() * 0.5;
    let mut t = OfferTemplate::new((0..16).map(fixtures::gpu).collect(), 3_600_000);
    t.min_duration_s = 1;
    t.min_billed_s = 1;
    t.per_gpu.cpu_millicores = 1000;
    t.per_gpu.ram_mib = 256;
    t.per_gpu.disk_gib = 1;
    t.images.local_images = vec![gridlease_sandbox::probe_image::probe_image_tag()];
    t.proof = ProofPolicy {
        window_s: 30,
        backend: Some(ProofBackend::CpuReference),
        claimed_mmacs: (rate / 1e6) as u64,
    };
    let mut pc = NodeConfig::local(net.clone(), Duration::from_secs(1));
    pc.offer = Some(t.clone());
    let provider = node(dir.path(), "p", pc).await;
    let renter = node(
        dir.path(),
        "r",
        NodeConfig::local(net, Duration::from_secs(1)),
    )
    .await;
    let mut psvc = LeaseServiceConfig::new(dir.path().join("p/leases"));
    psvc.base_template = Some(t);
    psvc.prover = Some(SharedProver {
        prover: Arc::new(prover),
        macs_per_gpu: rate,
        vram_per_gpu: gridlease_contracts::proof::params::CPU_REFERENCE_FILL_CAP,
    });
    let _pl = LeaseService::start(
        provider.client.clone(),
        &provider.events,
        psvc,
        Some(sb.clone()),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let rl = LeaseService::start(
        renter.client.clone(),
        &renter.events,
        LeaseServiceConfig::new(dir.path().join("r/leases")),
        None,
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let mut ev = renter.events.subscribe();
    let paddr = provider.client.listen_addrs().await.unwrap()[0].clone();
    renter.client.dial(paddr).await.unwrap().unwrap();
    let mut offer = loop {
        if let Ok(NetworkEvent::OfferAdmitted { id, .. }) = ev.recv().await {
            break id;
        }
    };
    let (mut with, mut without, mut cpu, mut took) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // One warm-up round of each, then `rounds` of each, interleaved.
    for i in 0..(rounds + 1) * 2 {
        while let Ok(e) = ev.try_recv() {
            if let NetworkEvent::OfferAdmitted { id, .. } = e {
                offer = id;
            }
        }
        let verify = i % 2 == 0;
        let t0 = Instant::now();
        let id = rl
            .rent(RentRequest {
                volumes: Vec::new(),
                mounts: Vec::new(),
                volume: None,
                verify,
                offer: offer.to_string(),
                gpus: 1,
                duration_s: 10,
                image: image.clone(),
                command: vec!["sleep".into(), "1".into()],
                env: Default::default(),
                max_total: None,
                network: gridlease_protocol::NetworkPolicy::None,
                keep_outputs_s: 0,
                upload_hold_s: 0,
                prepay_s: 0,
            })
            .await
            .unwrap();
        let mut view = rl.watch(id).await.unwrap().expect("the renter's session");
        loop {
            let v = view.borrow_and_update().clone();
            if v.state == gridlease_contracts::LeaseState::Running {
                break;
            }
            assert!(!v.is_terminal(), "round {i}: {v:?}");
            view.changed().await.expect("the renter's session ended");
        }
        let running = t0.elapsed().as_secs_f64() * 1000.0;
        let v = rl.lease(id).await.unwrap().unwrap();
        if i >= 2 {
            if verify {
                let c = v.gpu_check.expect("checked");
                assert_eq!(c.state, "passed", "{c:?}");
                with.push(running);
                cpu.push(c.check_cpu_ms.unwrap_or(0) as f64);
                took.push(c.took_ms.unwrap_or(0) as f64);
            } else {
                assert!(v.gpu_check.is_none());
                without.push(running);
            }
        }
        rl.stop(id).await.unwrap();
        let _ = tokio::time::timeout(Duration::from_secs(30), rl.wait_closed(id)).await;
    }
    let (w, wo) = (median(&mut with), median(&mut without));
    println!(
        "rounds: {rounds} of each (CPU reference claiming {:.1} GMAC/s)",
        rate / 1e9
    );
    println!("rent -> running with the check:    {w:.0} ms (median)");
    println!("rent -> running without the check: {wo:.0} ms (median)");
    println!(
        "the check adds:                    {:.0} ms ({:.1}x)",
        w - wo,
        w / wo
    );
    println!(
        "  of which seed -> commitment:     {:.0} ms (median, less the round trip)",
        median(&mut took)
    );
    println!(
        "renter CPU checking the openings:  {:.0} ms (median)",
        median(&mut cpu)
    );
}
