//! Time from `rent` to the container running (image already local), against a bare
//! `docker run -d` of the same image on the same machine; and (issue 42 item 3) how long after
//! the provider's view the renter's says `running`, and `rent` to the command's first output at
//! the renter (less the negotiation) against an attached `docker run` printing the same line.
//!
//! `cargo run --release -p gridlease-node --example bench_lease_start -- [ROUNDS]`
//!
//! One process holds a provider and a renter on loopback, each with its lease service. Each
//! round: `LeaseService::rent` (sign, negotiate, both sides persist) -> provider session: begin
//! start (persisted), image check, hardened create, start, running (persisted). The time is
//! taken when the provider's view shows `running` (its session's watch). The baseline is
//! `docker run -d --rm --network none IMAGE sleep 3` (the CLI returns once the container
//! started; `--network none` like a lease with network policy `None`: a bridge network adds
//! ~100 ms of veth setup here), timed the
//! same number of rounds, interleaved, and a plain create + start through the Docker API (what
//! the node itself calls, without the hardened spec) as a second, stricter baseline; and, like
//! for like, what the provider's session itself does without the lease around it: the same
//! hardened spec through `Sandbox::create` with its disk-backed workspace created first.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use gridlease_node::home::Home;
use gridlease_node::lease::{LeaseService, LeaseServiceConfig, RentRequest};
use gridlease_node::net::{NetworkEvent, Node, NodeConfig, OfferTemplate};
use gridlease_node::store::{Store, StoreHandle};
use gridlease_protocol::{NetworkId, fixtures};
use gridlease_sandbox::{Sandbox, SandboxSpec};
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
        .unwrap_or(10);
    let sb = Sandbox::connect().await.expect("Docker is needed");
    let image = sb.ensure_probe_image().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let net = NetworkId::devnet();
    let mut t = OfferTemplate::new((0..16).map(fixtures::gpu).collect(), 3_600_000);
    t.min_duration_s = 1;
    t.min_billed_s = 1;
    t.per_gpu.cpu_millicores = 1000;
    t.per_gpu.ram_mib = 256;
    t.per_gpu.disk_gib = 1;
    t.images.local_images = vec![gridlease_sandbox::probe_image::probe_image_tag()];
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
    let pl = LeaseService::start(
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
    let mut lease_ms = Vec::new();
    let mut docker_ms = Vec::new();
    let mut api_ms = Vec::new();
    let mut same_ms = Vec::new();
    let mut notice_ms = Vec::new();
    let mut output_ratio = Vec::new();
    for i in 0..rounds + 1 {
        // The provider re-signs its offer as it nears expiry: rent the newest one.
        while let Ok(e) = ev.try_recv() {
            if let NetworkEvent::OfferAdmitted { id, .. } = e {
                offer = id;
            }
        }
        let t0 = Instant::now();
        let id = rl
            .rent(RentRequest {
                volumes: Vec::new(),
                mounts: Vec::new(),
                volume: None,
                verify: true,
                offer: offer.to_string(),
                gpus: 1,
                duration_s: 10,
                image: image.clone(),
                command: vec![
                    "sentinel".into(),
                    "FIRST".into(),
                    "sleep".into(),
                    "3".into(),
                ],
                env: Default::default(),
                max_total: None,
                network: gridlease_protocol::NetworkPolicy::None,
                keep_outputs_s: 0,
                upload_hold_s: 0,
                prepay_s: 0,
            })
            .await
            .unwrap();
        let negotiated = t0.elapsed();
        // The provider's session publishes its view on a watch: the time is taken when it
        // says `running` (polling every 1 ms, as before, added up to a millisecond and asked
        // the lease actor a thousand times a second while the session worked).
        let mut view = pl
            .watch(id)
            .await
            .unwrap()
            .expect("the provider runs the lease's session");
        while view.borrow_and_update().state != gridlease_contracts::LeaseState::Running {
            view.changed()
                .await
                .expect("the session ended before running");
        }
        let running = t0.elapsed();
        // The renter's own view: how long after the provider's it says `running` (the
        // provider's start notice), and when the command's first output reaches the renter
        // the way `gridlease rent` asks for it (every 50 ms until it comes).
        let mut rview = rl.watch(id).await.unwrap().expect("the renter's session");
        while rview.borrow_and_update().state != gridlease_contracts::LeaseState::Running {
            rview.changed().await.expect("the renter's session ended");
        }
        let renter_running = t0.elapsed();
        let first_output = loop {
            let chunk = rl.logs(id, 0).await.unwrap();
            if String::from_utf8_lossy(&chunk.data).contains("FIRST") {
                break t0.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // Its baseline: `docker run` of the same image printing the same line, attached.
        let t4 = Instant::now();
        let out = tokio::process::Command::new("docker")
            .args([
                "run",
                "--rm",
                "--network",
                "none",
                &image,
                "sentinel",
                "FIRST",
            ])
            .output()
            .await
            .unwrap();
        let attached = t4.elapsed();
        assert!(String::from_utf8_lossy(&out.stdout).contains("FIRST"));
        let t1 = Instant::now();
        let out = tokio::process::Command::new("docker")
            .args([
                "run",
                "-d",
                "--rm",
                "--network",
                "none",
                &image,
                "sleep",
                "3",
            ])
            .output()
            .await
            .unwrap();
        let bare = t1.elapsed();
        assert!(out.status.success(), "docker run failed");
        // The same through the API the node uses: plain create + start, no hardening.
        let t2 = Instant::now();
        let body = bollard::models::ContainerCreateBody {
            image: Some(image.clone()),
            cmd: Some(vec!["sleep".into(), "3".into()]),
            host_config: Some(bollard::models::HostConfig {
                network_mode: Some("none".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let c = sb
            .docker()
            .create_container(
                None::<bollard::query_parameters::CreateContainerOptions>,
                body,
            )
            .await
            .unwrap();
        sb.start(&c.id).await.unwrap();
        let api = t2.elapsed();
        sb.remove(&c.id).await.unwrap();
        // Like for like: what the provider's session does to start the container, without
        // the lease (no negotiation, no persistence): the same hardened spec through the same
        // function (`build_create_body` inside `Sandbox::create`, image re-check included), its
        // disk-backed workspace created first (sparse file, mkfs.ext4, loop device, volume),
        // then start.
        let mut raw = [0xbe; 32];
        raw[..4].copy_from_slice(&std::process::id().to_le_bytes());
        raw[4..12].copy_from_slice(&(i as u64).to_le_bytes());
        let lease = gridlease_protocol::LeaseId(gridlease_protocol::Digest(raw));
        let mut spec =
            SandboxSpec::small_on_host(lease, "bench-lease-start", &image, &["sleep", "3"]);
        spec.memory_mib = 256;
        spec.workspace_bytes = 1 << 30;
        let ws_dir = dir.path().join("like-for-like-workspaces");
        let t3 = Instant::now();
        let ws = sb.create_workspace(&ws_dir, &spec).await.unwrap();
        spec.workspace = Some(ws.volume.clone());
        let cid = sb.create(&spec).await.unwrap();
        sb.start(&cid).await.unwrap();
        let same = t3.elapsed();
        sb.remove(&cid).await.unwrap();
        sb.remove_workspace(&ws_dir, &lease).await.unwrap();
        if i > 0 {
            // Round 0 warms caches on both paths.
            lease_ms.push(running.as_secs_f64() * 1e3);
            docker_ms.push(bare.as_secs_f64() * 1e3);
            api_ms.push(api.as_secs_f64() * 1e3);
            same_ms.push(same.as_secs_f64() * 1e3);
            notice_ms.push((renter_running - running).as_secs_f64() * 1e3);
            output_ratio.push((first_output - negotiated).as_secs_f64() / attached.as_secs_f64());
            println!(
                "round {i}: renter's view running {:.1} ms after the provider's; first output at the renter {:.1} ms after rent ({:.1} ms after negotiation), docker run attached {:.1} ms",
                (renter_running - running).as_secs_f64() * 1e3,
                first_output.as_secs_f64() * 1e3,
                (first_output - negotiated).as_secs_f64() * 1e3,
                attached.as_secs_f64() * 1e3
            );
            println!(
                "round {i}: rent->running {:.1} ms (negotiation {:.1} ms), docker run -d --network none {:.1} ms, API create+start {:.1} ms, same spec + workspace {:.1} ms",
                running.as_secs_f64() * 1e3,
                negotiated.as_secs_f64() * 1e3,
                bare.as_secs_f64() * 1e3,
                api.as_secs_f64() * 1e3,
                same.as_secs_f64() * 1e3
            );
        }
        let _ = rl.stop(id).await;
        let _ = pl.wait_closed(id).await;
    }
    let (l, d, a) = (
        median(&mut lease_ms),
        median(&mut docker_ms),
        median(&mut api_ms),
    );
    let w = median(&mut same_ms);
    println!(
        "median over {rounds} rounds: the renter's view says running {:.1} ms after the provider's; rent -> first output at the renter, less the negotiation, / docker run attached: ratio {:.2}",
        median(&mut notice_ms),
        median(&mut output_ratio)
    );
    println!(
        "median over {rounds} rounds: rent->running {l:.1} ms, docker run -d --network none {d:.1} ms (ratio {:.2}), API create+start {a:.1} ms (ratio {:.2}), like for like: same hardened spec + workspace through the API {w:.1} ms (ratio {:.2})",
        l / d,
        l / a,
        l / w
    );
}
