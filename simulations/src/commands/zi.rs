//! `gridlease-sim zi`: a double-auction experiment (Gode & Sunder 1993) from a scenario file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use gridlease_sim::output;
use gridlease_sim::zi::experiment::{self, Experiment};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::Printer;

/// `zi` arguments.
#[derive(Args, Debug)]
pub(crate) struct ZiArgs {
    /// Experiment file, e.g. `simulations/scenarios/gs-market1.toml`.
    #[arg(long)]
    scenario: PathBuf,
    /// Replications per treatment and period length (default: the file's).
    #[arg(long)]
    reps: Option<u32>,
    /// Trading periods per replication (default: the file's).
    #[arg(long)]
    periods: Option<u32>,
    /// Period lengths in shouts, comma-separated, e.g. `500,2000` (default: the file's).
    #[arg(long, value_delimiter = ',')]
    shouts: Vec<u32>,
    /// Base seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write periods.csv, replications.csv, summary.csv, manifest.json and a copy of the file
    /// here (default: print only).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `manifest.json` of a `zi` output.
#[derive(Serialize)]
struct ZiManifest {
    version: &'static str,
    git_revision: Option<String>,
    command: Vec<String>,
    experiment: String,
    experiment_hash: String,
    seed: u64,
    replications: u32,
    periods: u32,
    shouts_per_period: Vec<u32>,
    files: Vec<String>,
}

pub(crate) fn zi(a: ZiArgs, p: &Printer) -> Result<()> {
    let mut e = Experiment::load(&a.scenario)?;
    if let Some(r) = a.reps {
        e.replications = r;
    }
    if let Some(n) = a.periods {
        e.periods = n;
    }
    if !a.shouts.is_empty() {
        e.shouts_per_period = a.shouts.clone();
    }
    e.validate()?;
    let eq = e.equilibrium();
    p.result(
        &format!(
            "{}: equilibrium {} units at {}..={}, maximum surplus {}; {} replications x {} periods, seed {}",
            e.name, eq.quantity, eq.price_low, eq.price_high, eq.max_surplus, e.replications,
            e.periods, a.seed
        ),
        &serde_json::json!({ "experiment": e.name, "equilibrium": eq,
            "replications": e.replications, "periods": e.periods, "seed": a.seed }),
    );
    if (e.replications as usize) < gridlease_sim::stats::MIN_N_FOR_INTERVAL {
        p.warn(&format!(
            "{} replications: fewer than {}, so no intervals are given; run at least {}",
            e.replications,
            gridlease_sim::stats::MIN_N_FOR_INTERVAL,
            gridlease_sim::stats::MIN_N_FOR_INTERVAL
        ));
    }
    let reps = experiment::run(&e, a.seed);
    let cells = experiment::summaries(&e, &reps, a.seed);
    for t in &e.treatments {
        for &shouts in &e.shouts_per_period {
            let get = |m| experiment::find(&cells, &t.name, shouts, m);
            let (Some(eff), Some(vol), Some(price)) =
                (get("efficiency"), get("volume"), get("mean_price"))
            else {
                continue;
            };
            let reported = e
                .reported_efficiency
                .get(&t.name)
                .map_or(String::new(), |r| format!(" (source reports {r:.1} %)"));
            // The recommended interval first: the bootstrap's, within the metric's bounds.
            let intervals = if eff.has_interval() {
                format!(
                    "99 % bootstrap [{:.2}, {:.2}], t [{:.2}, {:.2}]",
                    100.0 * eff.boot99.low,
                    100.0 * eff.boot99.high,
                    100.0 * eff.t99.low,
                    100.0 * eff.t99.high,
                )
            } else {
                eff.note.to_string()
            };
            p.result(
                &format!(
                    "{} {} shouts {shouts}: efficiency {:.2} % ({intervals}){reported}, volume {:.2}, mean price {:.2}",
                    e.name,
                    t.name,
                    100.0 * eff.mean,
                    vol.mean,
                    price.mean
                ),
                &serde_json::json!({ "experiment": e.name, "treatment": t.name, "shouts": shouts,
                    "n": eff.n, "efficiency": eff.mean,
                    "efficiency_boot99": [eff.boot99.low, eff.boot99.high],
                    "efficiency_t99": [eff.t99.low, eff.t99.high],
                    "reported_efficiency_percent": e.reported_efficiency.get(&t.name),
                    "volume": vol.mean, "mean_price": price.mean }),
            );
        }
    }
    if let Some(out) = &a.out {
        write(out, &a, &e, &reps, &cells)?;
    }
    Ok(())
}

fn write(
    out: &Path,
    a: &ZiArgs,
    e: &Experiment,
    reps: &[experiment::Replication],
    cells: &[experiment::CellSummary],
) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let mut files = Vec::new();
    for (name, t) in [
        ("periods.csv", experiment::periods_table(e, reps)),
        ("replications.csv", experiment::replications_table(e, reps)),
        ("summary.csv", experiment::summary_table(cells)),
    ] {
        t.write(&out.join(name))?;
        files.push(name.to_string());
    }
    std::fs::copy(&a.scenario, out.join("experiment.toml"))
        .with_context(|| format!("copy {}", a.scenario.display()))?;
    files.push("experiment.toml".into());
    files.push("manifest.json".into());
    let m = ZiManifest {
        version: env!("CARGO_PKG_VERSION"),
        git_revision: output::git_revision(),
        command: std::env::args().collect(),
        experiment: e.name.clone(),
        experiment_hash: hex::encode(Sha256::digest(e.to_toml().as_bytes())),
        seed: a.seed,
        replications: e.replications,
        periods: e.periods,
        shouts_per_period: e.shouts_per_period.clone(),
        files,
    };
    let text = serde_json::to_string_pretty(&m)? + "\n";
    std::fs::write(out.join("manifest.json"), text).context("write manifest.json")
}
