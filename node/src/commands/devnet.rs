//! `gridlease devnet`: a whole local market in one command. A bootstrap node, N providers with
//! declared GPUs at different prices and one renter, each a real `gridlease node` process with
//! its own temporary home, on loopback. The renter searches, rents the cheapest offer, runs the
//! probe container on it, streams its output, and the offer table, lease timeline, metered
//! usage, receipts and both ledgers are printed at the end.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;

use gridlease_contracts::LeaseState;
use serde::Serialize;

use super::rent::{follow_logs, wait_terminal};
use crate::api::client::ApiClient;
use crate::api::types::{OfferRow, RentRequest, StatusView};
use crate::lease::{LeaseStatement, LeaseView, Ledger};
use crate::output::{Printer, money, short};

/// Arguments of `gridlease devnet`.
#[derive(Debug, Args)]
pub struct DevnetArgs {
    /// Provider nodes to start (1-8).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=8))]
    pub providers: u8,
    /// Seconds the probe burns one CPU in the rented container.
    #[arg(long, default_value_t = 25, value_name = "S")]
    pub burn_secs: u32,
    /// Keep the nodes' homes (and logs) instead of deleting them at the end.
    #[arg(long)]
    pub keep: bool,
}

/// The GPUs and prices of the devnet providers, in order.
const PROVIDERS: [&str; 8] = [
    "RTX 4090:24GiB:0.45",
    "RTX 3090:24GiB:0.25",
    "A100 80GB:80GiB:1.20",
    "RTX 4080:16GiB:0.30",
    "L40S:48GiB:0.90",
    "RTX 3080:10GiB:0.15",
    "H100 80GB:80GiB:2.10",
    "RTX 4070:12GiB:0.18",
];

/// What `devnet --json` prints. Fields in alphabetical order: the order this JSON had when it
/// was built as a `serde_json` map, which scripts may have come to rely on.
#[derive(Debug, Serialize)]
struct DevnetReport<'a> {
    lease_id: &'a str,
    ledgers_agree: bool,
    offers: &'a [OfferRow],
    provider: &'a LeaseView,
    provider_ledger: &'a Ledger,
    renter: &'a LeaseView,
    renter_ledger: &'a Ledger,
}

/// A node process; stopped (SIGTERM, then SIGKILL) when dropped.
struct NodeProc {
    name: String,
    home: PathBuf,
    child: Child,
}

impl NodeProc {
    fn api(&self) -> ApiClient {
        ApiClient::new(&self.home)
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_node(exe: &Path, dir: &Path, name: &str, extra: &[String]) -> anyhow::Result<NodeProc> {
    let home = dir.join(name);
    let init = Command::new(exe)
        .args(["init", "--quiet", "--home"])
        .arg(&home)
        .output()
        .context("cannot run gridlease init")?;
    if !init.status.success() {
        bail!(
            "{name}: init failed: {}",
            String::from_utf8_lossy(&init.stderr)
        );
    }
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let child = Command::new(exe)
        .args([
            "node",
            "--no-mdns",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--announce-secs",
            "2",
        ])
        .args(extra)
        .arg("--home")
        .arg(&home)
        .env_remove(crate::env_vars::GRIDLEASE_HOME)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start node {name}"))?;
    Ok(NodeProc {
        name: name.to_string(),
        home,
        child,
    })
}

async fn wait_up(node: &NodeProc) -> anyhow::Result<StatusView> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(s) = node.api().status().await {
            return Ok(s);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "node {} did not come up; see {}.log",
                node.name,
                node.home.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the devnet.
pub async fn run(out: &Printer, args: &DevnetArgs) -> anyhow::Result<u8> {
    // Docker first: without it no lease can run, so say so before starting anything.
    let sandbox = match gridlease_sandbox::Sandbox::connect().await {
        Ok(s) => s,
        Err(e) => bail!(
            "devnet runs a real container and needs Docker: {e}\n\
             start the Docker daemon (e.g. `sudo systemctl start docker`) and try again"
        ),
    };
    out.line("building the probe image (once)...");
    let image = sandbox
        .ensure_probe_image()
        .await
        .context("cannot build the probe image")?;

    let tmp = tempfile::Builder::new()
        .prefix("gridlease-devnet-")
        .tempdir()?;
    let dir = tmp.path().to_path_buf();
    let exe = std::env::current_exe().context("cannot find the gridlease binary")?;
    out.line(&format!(
        "starting 1 bootstrap node, {} providers and 1 renter under {}",
        args.providers,
        dir.display()
    ));

    let boot = start_node(&exe, &dir, "bootstrap", &[])?;
    let boot_status = wait_up(&boot).await?;
    let boot_addr = boot_status
        .listen_addrs
        .first()
        .cloned()
        .context("the bootstrap node has no address")?;
    let bootstrap = vec!["--bootstrap".to_string(), boot_addr];
    let mut providers = Vec::new();
    for (i, gpus) in PROVIDERS
        .iter()
        .take(usize::from(args.providers))
        .enumerate()
    {
        let mut extra = bootstrap.clone();
        extra.extend(["--dev-gpus".to_string(), (*gpus).to_string()]);
        // The devnet's providers offer the probe image (imported here, never pulled).
        extra.extend(["--local-image".to_string(), image.clone()]);
        // The providers share one host and run a few seconds of burn: 1 GiB of /workspace
        // each and no reserve beyond the log budget, so a small temporary directory will do.
        extra.extend(["--reserve-disk-gib", "0", "--per-gpu-disk-gib", "1"].map(String::from));
        providers.push(start_node(
            &exe,
            &dir,
            &format!("provider-{}", i + 1),
            &extra,
        )?);
    }
    let renter = start_node(&exe, &dir, "renter", &bootstrap)?;
    for p in &providers {
        wait_up(p).await?;
    }
    wait_up(&renter).await?;

    // The renter learns every offer through gossip.
    let r = renter.api();
    let want = usize::from(args.providers);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let offers: Vec<OfferRow> = loop {
        let rows: Vec<OfferRow> = r.get(&super::search::path("", Some("price"), 50)).await?;
        if rows.len() >= want {
            break rows;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the renter learned {} of {want} offers in 60 s", rows.len());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    out.line("\noffers seen by the renter (cheapest first):");
    out.table(
        &["offer", "provider", "gpu", "vram", "price/h", "bench"],
        offers
            .iter()
            .map(|o| {
                vec![
                    short(&o.id),
                    short(&o.provider),
                    o.gpu.clone(),
                    format!("{:.0} GiB", o.vram_gib),
                    o.price_per_gpu_hour.clone(),
                    o.bench().into(),
                ]
            })
            .collect(),
        &[1, 5],
        false,
    );

    let cheapest = &offers[0];
    let mut provider = None;
    for p in &providers {
        if let Ok(s) = p.api().status().await
            && s.peer_id == cheapest.provider
        {
            provider = Some(p);
        }
    }
    let provider = provider.context("cannot find the cheapest offer's provider")?;
    let burn = args.burn_secs.max(1);
    let body = RentRequest {
        volumes: Vec::new(),
        mounts: Vec::new(),
        volume: None,
        verify: true,
        offer: cheapest.id.clone(),
        gpus: 1,
        // Offers accept leases of 60 s or more; the container exits when the probe is done.
        duration_s: (burn + 20).max(60),
        image,
        command: [
            "sentinel",
            "devnet-start",
            "burn",
            "1",
            &burn.to_string(),
            "sentinel",
            "devnet-done",
            "exit",
            "0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        env: Default::default(),
        max_total: None,
        network: gridlease_protocol::NetworkPolicy::None,
        keep_outputs_s: 0,
        upload_hold_s: 0,
        prepay_s: 0,
    };
    out.line(&format!(
        "\nrenting {} ({} at {} {}/GPU-hour) for {} s; the probe burns one CPU for {burn} s:",
        short(&cheapest.id),
        cheapest.gpu,
        cheapest.price_per_gpu_hour,
        gridlease_contracts::money::UNIT,
        body.duration_s
    ));
    let rented = r.rent(&body).await?;
    let exit = follow_logs(&r, out, &rented.lease_id, 0, true).await?;
    let renter_view = wait_terminal(&r, &rented.lease_id, Duration::from_secs(60)).await?;
    let provider_view =
        wait_terminal(&provider.api(), &rented.lease_id, Duration::from_secs(30)).await?;
    let renter_ledger = r.ledger().await?;
    let provider_ledger = provider.api().ledger().await?;

    // UTC, to the millisecond (RFC 3339).
    let ts = |ms: Option<u64>| {
        ms.and_then(|ms| i64::try_from(ms).ok())
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
            .map_or("-".into(), |t| format!("{t:.3}"))
    };
    out.line("\nlease timeline:");
    out.line(&format!("  lease id      {}", rented.lease_id));
    out.line(&format!(
        "  GPU check     {}",
        renter_view.gpu_check.as_ref().map_or_else(
            || "none (the offer has none)".to_string(),
            |c| match (c.took_ms, c.limit_ms) {
                (Some(t), Some(l)) => format!(
                    "{} ({}): {:.2} s, limit {:.2} s, before the start",
                    c.state,
                    c.backend,
                    t as f64 / 1000.0,
                    l as f64 / 1000.0
                ),
                _ => format!("{} ({})", c.state, c.backend),
            }
        )
    ));
    out.line(&format!("  started at    {}", ts(provider_view.started_at)));
    out.line(&format!("  closed at     {}", ts(provider_view.closed_at)));
    out.line(&format!(
        "  ended         {} (exit code {})",
        provider_view.close_reason.as_deref().unwrap_or("-"),
        exit.map_or("-".into(), |c| c.to_string())
    ));
    let ran_s = renter_view.usage.as_ref().map_or(0, |u| u.wall_ms) / 1000;
    out.line(&format!(
        "  billed        {} {} for {ran_s} s run{}",
        money(renter_view.paid),
        gridlease_contracts::money::UNIT,
        if super::rent::minimum_applied(&renter_view) {
            format!(
                ": the offer's minimum of {} s applied",
                renter_view.min_billed_s
            )
        } else {
            String::new()
        }
    ));
    out.line(&format!(
        "  state         renter: {}, provider: {}",
        renter_view.state.as_str(),
        provider_view.state.as_str()
    ));
    out.line("\nmetered usage (last signed usage report):");
    match &provider_view.usage {
        Some(u) => out.line(&format!(
            "  wall {} s, CPU {:.1} s, memory peak {} MiB, {} usage reports",
            u.wall_ms / 1000,
            u.cpu_ms as f64 / 1000.0,
            u.mem_peak_mib,
            u.seq
        )),
        None => out.line("  no usage report arrived"),
    }
    let stmt = |l: &'_ Ledger| -> Option<LeaseStatement> {
        l.leases
            .iter()
            .find(|s| s.lease_id == renter_view.lease_id)
            .cloned()
    };
    let (rs, ps) = (stmt(&renter_ledger), stmt(&provider_ledger));
    let total = |s: &Option<LeaseStatement>| s.as_ref().map_or("-".into(), |s| money(s.total));
    out.line("\nreceipts and ledgers:");
    out.line(&format!(
        "  receipts booked by the provider: {}",
        ps.as_ref().map_or("-".into(), |s| s.entries.to_string())
    ));
    out.line(&format!(
        "  renter ledger:   spent  {}  (balanced: {})",
        total(&rs),
        renter_ledger.balanced
    ));
    out.line(&format!(
        "  provider ledger: earned {}  (balanced: {})",
        total(&ps),
        provider_ledger.balanced
    ));
    let agree = matches!((&rs, &ps), (Some(r), Some(p)) if r.total == p.total);
    let settled =
        renter_view.state == LeaseState::Settled && provider_view.state == LeaseState::Settled;
    out.line(&format!(
        "  {}",
        if agree {
            "both ledgers agree to the micro-unit"
        } else {
            "THE LEDGERS DISAGREE"
        }
    ));
    out.emit(
        &DevnetReport {
            lease_id: &rented.lease_id,
            ledgers_agree: agree,
            offers: &offers,
            provider: &provider_view,
            provider_ledger: &provider_ledger,
            renter: &renter_view,
            renter_ledger: &renter_ledger,
        },
        |_| {},
    );

    drop(renter);
    drop(providers);
    drop(boot);
    if args.keep {
        let kept = tmp.keep();
        out.line(&format!("\nhomes and logs kept in {}", kept.display()));
    }
    Ok(if agree && settled { 0 } else { 1 })
}
