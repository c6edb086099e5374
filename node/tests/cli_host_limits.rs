//! Offers promise only what this host can give (issue 12): real `gridlease node` processes,
//! the real Docker daemon. The expected bounds are computed here from `/proc/meminfo` and the
//! CPU count with the documented default reserve (max(2 GiB, 10%) RAM, one core), not with the
//! node's own code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

mod cli_support;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use cli_support::{
    ContainersGuard, cli, containers_of, json, lease_of, probe_image_or_skip, start, wait_for,
};
use serde_json::Value;

/// Host RAM in MiB, read independently of the node.
fn host_ram_mib() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = text.lines().find(|l| l.starts_with("MemTotal:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb / 1024
}

/// Host RAM minus the documented default reserve, MiB.
fn ram_budget_mib() -> u64 {
    let total = host_ram_mib();
    total - (total / 100 * 10).max(2048)
}

/// CPUs minus the documented default reserve (one core), millicores.
fn cpu_budget_millicores() -> u64 {
    let cpus = std::thread::available_parallelism().unwrap().get() as u64;
    cpus * 1000 - 1000
}

fn own_offer(home: &Path) -> Value {
    let s = json(home, &["status"]);
    assert!(s["own_offer"].is_object(), "no own offer: {s}");
    s["own_offer"].clone()
}

#[test]
fn a_two_gpu_dev_offer_never_promises_more_than_the_host_minus_the_reserve() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("p");
    let _node = start(&home, &["--dev-gpus", "2x RTX 4090:24GiB:0.40"]);
    let o = own_offer(&home);
    assert_eq!(o["gpus"], 2);
    let ram = o["ram_mib_per_gpu"].as_u64().unwrap();
    let cpu = o["cpu_millicores_per_gpu"].as_u64().unwrap();
    eprintln!(
        "host {} MiB, budget {} MiB / {} millicores; per GPU {ram} MiB, {cpu} millicores, {} GiB",
        host_ram_mib(),
        ram_budget_mib(),
        cpu_budget_millicores(),
        o["disk_gib_per_gpu"]
    );
    assert!(ram > 0 && cpu > 0, "{o}");
    assert!(2 * ram <= ram_budget_mib(), "{o}");
    assert!(2 * cpu <= cpu_budget_millicores(), "{o}");
    // Whole MiB per GPU: the rounding loses less than one MiB per GPU.
    assert!(
        2 * ram + 2 > ram_budget_mib(),
        "the host is used, not a fixed figure: {o}"
    );

    // An explicit per-GPU value lowers it; asking for more than the host allows is capped.
    let low = dir.path().join("low");
    let _low = start(
        &low,
        &[
            "--dev-gpus",
            "2x RTX 4090:24GiB:0.40",
            "--per-gpu-ram-mib",
            "128",
            "--per-gpu-cpu-millicores",
            "1000000",
        ],
    );
    let o = own_offer(&low);
    assert_eq!(o["ram_mib_per_gpu"], 128);
    assert_eq!(
        o["cpu_millicores_per_gpu"].as_u64(),
        Some(cpu),
        "capped: {o}"
    );

    // A reserve that leaves nothing is refused at start with a reason, not offered.
    let none = dir.path().join("none");
    cli_support::init(&none);
    let out = cli(
        &none,
        &[
            "node",
            "--no-mdns",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--dev-gpus",
            "RTX 4090:24GiB:0.40",
            "--reserve-ram-mib",
            &host_ram_mib().to_string(),
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ram_mib") && err.contains("reserve"), "{err}");
}

/// Docker's view of a container: (HostConfig, State).
fn inspect(id: &str) -> (Value, Value) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let info = rt.block_on(async {
        let sb = gridlease_sandbox::Sandbox::connect().await.unwrap();
        sb.inspect(id).await.unwrap()
    });
    let v = serde_json::to_value(&info).unwrap();
    (v["HostConfig"].clone(), v["State"].clone())
}

/// The Docker events (action, attributes) of the containers labelled `gridlease.node=<peer>`
/// from now until the first `destroy` (or 90 s), delivered once on the returned channel.
fn container_events(
    peer: &str,
) -> std::sync::mpsc::Receiver<Vec<(String, HashMap<String, String>)>> {
    use futures::StreamExt;
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .saturating_sub(1);
    let filter = format!("{}={peer}", gridlease_sandbox::spec::LABEL_NODE);
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let seen = rt.block_on(async {
            let sb = gridlease_sandbox::Sandbox::connect().await.unwrap();
            let opts = bollard::query_parameters::EventsOptions {
                since: Some(since.to_string()),
                until: None,
                filters: Some(HashMap::from([
                    ("type".to_string(), vec!["container".to_string()]),
                    ("label".to_string(), vec![filter]),
                ])),
            };
            let mut stream = sb.docker().events(Some(opts));
            let mut seen = Vec::new();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
            while let Ok(Some(Ok(ev))) = tokio::time::timeout_at(deadline, stream.next()).await {
                let action = ev.action.unwrap_or_default();
                let attrs = ev.actor.and_then(|a| a.attributes).unwrap_or_default();
                let done = action == "destroy";
                seen.push((action, attrs));
                if done {
                    break;
                }
            }
            seen
        });
        let _ = tx.send(seen);
    });
    rx
}

/// The only container of lease `id`, once it exists.
fn container_of(id: &str) -> String {
    let mut found = Vec::new();
    wait_for(Duration::from_secs(60), "the lease's container", || {
        found = containers_of(id);
        !found.is_empty()
    });
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].0.clone()
}

fn rent(renter: &Path, offer: &str, gpus: &str, image: &str, cmd: &[&str]) -> String {
    let mut args = vec![
        "rent",
        offer,
        "--gpus",
        gpus,
        "--seconds",
        "120",
        "--detach",
        "--image",
        image,
        "--",
    ];
    args.extend_from_slice(cmd);
    let v = json(renter, &args);
    v["lease_id"].as_str().unwrap().to_string()
}

/// A 2-GPU lease from a node offering host-derived resources gets a memory limit within the
/// host minus the reserve, `OomScoreAdj` 500 and a `nofile` limit. A tenant of a second
/// provider (128 MiB per GPU) allocating past its limit is OOM-killed alone: the 2-GPU
/// tenant keeps running and both provider nodes and the renter keep answering.
#[test]
fn lease_limits_fit_the_host_and_an_overrun_is_oom_killed_alone() {
    let Some(image) = probe_image_or_skip("lease_limits_fit_the_host") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (big, small, rh) = (
        dir.path().join("big"),
        dir.path().join("small"),
        dir.path().join("renter"),
    );
    let mut big_node = start(&big, &["--dev-gpus", "2x RTX 4090:24GiB:3.60"]);
    let big_status = json(&big, &["status"]);
    let big_peer = big_status["peer_id"].as_str().unwrap().to_string();
    let _big_guard = ContainersGuard(big_peer.clone());
    let addr = big_status["listen_addrs"][0].as_str().unwrap().to_string();
    let mut small_node = start(
        &small,
        &[
            "--bootstrap",
            &addr,
            "--dev-gpus",
            "RTX 4090:24GiB:3.60",
            "--per-gpu-ram-mib",
            "128",
        ],
    );
    let small_peer = json(&small, &["status"])["peer_id"]
        .as_str()
        .unwrap()
        .to_string();
    let _small_guard = ContainersGuard(small_peer.clone());
    let mut renter_node = start(&rh, &["--bootstrap", &addr]);
    let mut offers = Value::Null;
    wait_for(Duration::from_secs(60), "both offers at the renter", || {
        offers = json(&rh, &["search", "gpu~4090"]);
        offers.as_array().is_some_and(|a| a.len() == 2)
    });
    let offer_of = |peer: &str| -> String {
        let row = offers
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["provider"] == peer)
            .unwrap();
        row["id"].as_str().unwrap()[..12].to_string()
    };

    // The 2-GPU lease, running while the other tenant overruns its memory.
    let per = own_offer(&big);
    let big_lease = rent(
        &rh,
        &offer_of(&big_peer),
        "2",
        &image,
        &["sentinel", "up", "sleep", "90"],
    );
    let big_container = container_of(&big_lease);
    // The container exists from its create; wait until it has started.
    let started = std::time::Instant::now();
    let (hc, state) = loop {
        let (hc, state) = inspect(&big_container);
        if state["Running"] == true {
            break (hc, state);
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the 2-GPU tenant never ran: {state}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let memory = hc["Memory"].as_u64().unwrap();
    let per_ram = per["ram_mib_per_gpu"].as_u64().unwrap();
    assert_eq!(memory, 2 * per_ram * 1024 * 1024, "{hc}");
    assert!(
        memory <= ram_budget_mib() * 1024 * 1024,
        "2-GPU lease limit {memory} B exceeds host minus reserve {} MiB",
        ram_budget_mib()
    );
    assert_eq!(hc["MemorySwap"], hc["Memory"], "no swap");
    let nano = hc["NanoCpus"].as_u64().unwrap();
    assert!(nano <= cpu_budget_millicores() * 1_000_000, "{nano}");
    assert_eq!(hc["OomScoreAdj"], 500, "{hc}");
    let nofile = u64::from(gridlease_sandbox::host::tenant_nofile());
    let ulimits = hc["Ulimits"].as_array().unwrap();
    assert_eq!(ulimits.len(), 1, "{hc}");
    assert_eq!(ulimits[0]["Name"], "nofile");
    assert_eq!(ulimits[0]["Soft"].as_u64(), Some(nofile));
    assert_eq!(ulimits[0]["Hard"].as_u64(), Some(nofile));
    // /tmp is a tmpfs volume (sandbox::spec::SCRATCH_OPTIONS); its options as sent.
    let tmp = hc["Mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["Target"] == "/tmp")
        .and_then(|m| m["VolumeOptions"]["DriverConfig"]["Options"]["o"].as_str())
        .unwrap_or_else(|| panic!("no /tmp volume: {hc}"));
    let shm = hc["ShmSize"].as_u64().unwrap();
    assert!(shm <= memory, "/dev/shm {shm} B over the memory limit");
    let size_mib: u64 = tmp
        .split(',')
        .find_map(|o| o.strip_prefix("size="))
        .and_then(|s| s.strip_suffix('m'))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        size_mib * 1024 * 1024 <= memory,
        "scratch {tmp} over the memory limit"
    );
    assert_eq!(state["Running"], true, "{state}");

    // The overrun: 128 MiB limit, 512 MiB allocated. The provider removes the container as
    // soon as it has its exit, so the daemon's own record of the kill is read from its event
    // stream (`oom`, then `die` with the exit code), subscribed to before the lease starts.
    let events = container_events(&small_peer);
    let small_lease = rent(
        &rh,
        &offer_of(&small_peer),
        "1",
        &image,
        &[
            "sentinel",
            "allocating",
            "alloc",
            "512",
            "sentinel",
            "survived",
            "sleep",
            "60",
        ],
    );
    wait_for(Duration::from_secs(60), "the OOM lease to close", || {
        lease_of(&small, &small_lease)["state"] == "settled"
    });
    let v = lease_of(&small, &small_lease);
    assert_eq!(v["close_reason"], "container_exited", "{v}");
    assert_eq!(v["exit_code"], 137, "{v}");
    let seen = events.recv_timeout(Duration::from_secs(100)).unwrap();
    let actions: Vec<&str> = seen.iter().map(|(a, _)| a.as_str()).collect();
    eprintln!("daemon events of the overrunning container: {actions:?}");
    assert!(
        seen.iter().any(|(a, _)| a == "oom"),
        "no oom event: {seen:?}"
    );
    let die = seen.iter().find(|(a, _)| a == "die").expect("no die event");
    assert_eq!(
        die.1.get("exitCode").map(String::as_str),
        Some("137"),
        "{die:?}"
    );

    // Killed alone: the other tenant still runs, every node still answers.
    let (_, big_state) = inspect(&big_container);
    assert_eq!(big_state["Running"], true, "{big_state}");
    assert_eq!(big_state["OOMKilled"], false);
    for (name, node) in [
        ("big provider", &mut big_node),
        ("small provider", &mut small_node),
        ("renter", &mut renter_node),
    ] {
        assert!(
            node.0.try_wait().unwrap().is_none(),
            "the {name} node exited"
        );
    }
    for home in [&big, &small, &rh] {
        assert!(cli(home, &["status"]).status.success());
    }
    assert_eq!(lease_of(&big, &big_lease)["state"], "running");

    let out = cli(&rh, &["stop", &big_lease]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for(Duration::from_secs(60), "the 2-GPU lease to settle", || {
        lease_of(&big, &big_lease)["state"] == "settled"
    });
}

/// `--isolation gvisor`: with a runtime the daemon lacks the node refuses to start and says
/// how to register it; with Debian's runsc registered (as `.ci/run` does) it starts and its
/// offer says `gvisor`.
#[test]
fn isolation_gvisor_is_checked_at_start_and_advertised() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    cli_support::init(&missing);
    let name = format!("gridlease-missing-runtime-{}", std::process::id());
    let out = cli(
        &missing,
        &[
            "node",
            "--no-mdns",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--dev-gpus",
            "RTX 4090:24GiB:0.40",
            "--isolation",
            "gvisor",
            "--gvisor-runtime",
            &name,
        ],
    );
    assert!(!out.status.success(), "started without its runtime");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("gvisor") && err.contains(&name) && err.contains("daemon.json"),
        "{err}"
    );
    // A bad value is refused by the flag parser, naming the choices.
    let out = cli(&missing, &["node", "--isolation", "kata"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("runc or gvisor"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    if std::env::var("GRIDLEASE_REQUIRE_RUNSC").as_deref() != Ok("1")
        && !std::path::Path::new("/usr/bin/runsc").exists()
    {
        eprintln!("isolation_gvisor: SKIPPED the runsc half, runsc is not installed");
        return;
    }
    let home = dir.path().join("gvisor");
    let _node = start(
        &home,
        &["--dev-gpus", "RTX 4090:24GiB:0.40", "--isolation", "gvisor"],
    );
    let id = own_offer(&home)["id"].as_str().unwrap().to_string();
    let offer = json(&home, &["offer", &id]);
    assert_eq!(offer["isolation"], "gvisor", "{offer}");
}
