//! `gridlease-sim zi`: double-auction experiments (Gode & Sunder 1993) from scenario files, one
//! market per file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use gridlease_sim::output::{self, Table};
use gridlease_sim::plot;
use gridlease_sim::zi::experiment::{self, Experiment, Replication, Strategies};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::Printer;

/// `zi` arguments.
#[derive(Args, Debug)]
pub(crate) struct ZiArgs {
    /// Experiment file, e.g. `simulations/scenarios/gs-market1.toml`; give it once per market
    /// to compare several (`--scenario a.toml --scenario b.toml`).
    #[arg(long, required = true)]
    scenario: Vec<PathBuf>,
    /// Replications per treatment and period length (default: the file's).
    #[arg(long)]
    reps: Option<u32>,
    /// Trading periods per replication (default: the file's).
    #[arg(long)]
    periods: Option<u32>,
    /// Period lengths in shouts, comma-separated, e.g. `500,2000` (default: the file's; `0`
    /// alone: none).
    #[arg(long, value_delimiter = ',')]
    shouts: Vec<u32>,
    /// Timed period lengths in simulated seconds, comma-separated, e.g. `30,120` (default: the
    /// file's; `0` alone: none).
    #[arg(long, value_delimiter = ',')]
    seconds: Vec<u32>,
    /// Shouts per second of each trader with units left, in timed periods (default: the
    /// file's).
    #[arg(long)]
    shout_rate: Option<f64>,
    /// Base seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Rayon worker threads (default: all cores); results do not depend on it.
    #[arg(long)]
    threads: Option<usize>,
    /// Write the tables, manifest, a copy of the file and the figures here (one directory per
    /// market when there are several; default: print only).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Skip the figures.
    #[arg(long)]
    no_plots: bool,
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
    seconds_per_period: Vec<u32>,
    shout_rate: f64,
    files: Vec<String>,
}

/// `manifest.json` of a comparison of several markets (each market's own is in its directory).
#[derive(Serialize)]
struct MarketsManifest {
    version: &'static str,
    git_revision: Option<String>,
    command: Vec<String>,
    seed: u64,
    markets: Vec<String>,
    files: Vec<String>,
}

/// A length override: the values given, or none at all for a lone `0`.
fn lengths(given: &[u32]) -> Option<Vec<u32>> {
    match given {
        [] => None,
        [0] => Some(Vec::new()),
        v => Some(v.to_vec()),
    }
}

fn load(path: &Path, a: &ZiArgs) -> Result<Experiment> {
    let mut e = Experiment::load(path)?;
    if let Some(r) = a.reps {
        e.replications = r;
    }
    if let Some(n) = a.periods {
        e.periods = n;
    }
    if let Some(v) = lengths(&a.shouts) {
        e.shouts_per_period = v;
    }
    if let Some(v) = lengths(&a.seconds) {
        e.seconds_per_period = v;
    }
    if let Some(r) = a.shout_rate {
        e.shout_rate = r;
    }
    e.validate()
        .and_then(|()| e.sides(&Strategies::builtin()).map(drop))
        .with_context(|| format!("experiment {}", path.display()))?;
    Ok(e)
}

pub(crate) fn zi(a: ZiArgs, p: &Printer) -> Result<()> {
    // Every file is read and checked before anything runs or is written.
    let markets: Vec<Experiment> = a
        .scenario
        .iter()
        .map(|path| load(path, &a))
        .collect::<Result<_>>()?;
    let mut names: Vec<&str> = markets.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        bail!(
            "two experiments are named {:?}: each market needs its own name",
            w[0]
        );
    }
    let pool = {
        let mut b = rayon::ThreadPoolBuilder::new();
        if let Some(n) = a.threads {
            b = b.num_threads(n);
        }
        b.build()?
    };
    let several = markets.len() > 1;
    let mut compared = Vec::new();
    let mut table = markets_table();
    for (e, path) in markets.iter().zip(&a.scenario) {
        let reps = pool.install(|| experiment::run(e, a.seed))?;
        let cells = experiment::summaries(e, &reps, a.seed);
        report(p, e, &cells, a.seed);
        compared.push(plot::zi::MarketEfficiency::of(e, &reps));
        add_market(&mut table, e, &cells);
        if let Some(out) = &a.out {
            let dir = if several {
                out.join(&e.name)
            } else {
                out.clone()
            };
            write(&dir, &a, path, e, &reps, &cells)?;
        }
    }
    if let (Some(out), true) = (&a.out, several) {
        let mut files = vec!["markets.csv".to_string()];
        table.write(&out.join("markets.csv"))?;
        if !a.no_plots {
            files.extend(plot::zi::efficiency(out, &compared)?);
        }
        files.push("manifest.json".into());
        let m = MarketsManifest {
            version: env!("CARGO_PKG_VERSION"),
            git_revision: output::git_revision(),
            command: std::env::args().collect(),
            seed: a.seed,
            markets: markets.iter().map(|e| e.name.clone()).collect(),
            files,
        };
        let text = serde_json::to_string_pretty(&m)? + "\n";
        std::fs::write(out.join("manifest.json"), text).context("write manifest.json")?;
    }
    Ok(())
}

/// Prints the equilibrium and, per treatment and period length, efficiency with its intervals,
/// volume, mean price, price RMSD and alpha.
fn report(p: &Printer, e: &Experiment, cells: &[experiment::CellSummary], seed: u64) {
    let eq = e.equilibrium();
    p.result(
        &format!(
            "{}: equilibrium {} units at {}..={}, maximum surplus {}; {} replications x {} periods, seed {seed}",
            e.name, eq.quantity, eq.price_low, eq.price_high, eq.max_surplus, e.replications,
            e.periods
        ),
        &serde_json::json!({ "experiment": e.name, "equilibrium": eq,
            "replications": e.replications, "periods": e.periods, "seed": seed }),
    );
    if (e.replications as usize) < gridlease_sim::stats::MIN_N_FOR_INTERVAL {
        p.warn(&format!(
            "{} replications: fewer than {}, so no intervals are given; run at least {}",
            e.replications,
            gridlease_sim::stats::MIN_N_FOR_INTERVAL,
            gridlease_sim::stats::MIN_N_FOR_INTERVAL
        ));
    }
    for t in &e.treatments {
        for l in e.lengths() {
            let get = |m| experiment::find(cells, &t.name, l, m);
            let (Some(eff), Some(vol), Some(price), Some(rmsd), Some(alpha)) = (
                get("efficiency"),
                get("volume"),
                get("mean_price"),
                get("price_rmsd"),
                get("alpha"),
            ) else {
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
            let label = experiment::length_label(l);
            p.result(
                &format!(
                    "{} {} {label}: efficiency {:.2} % ({intervals}){reported}, volume {:.2}, mean price {:.2}, price RMSD {:.2}, alpha {:.2} %",
                    e.name,
                    t.name,
                    100.0 * eff.mean,
                    vol.mean,
                    price.mean,
                    rmsd.mean,
                    alpha.mean
                ),
                &serde_json::json!({ "experiment": e.name, "treatment": t.name,
                    "length": experiment::length_cells(l)[0], "unit": experiment::length_cells(l)[1],
                    "n": eff.n, "efficiency": eff.mean,
                    "efficiency_boot99": [eff.boot99.low, eff.boot99.high],
                    "efficiency_t99": [eff.t99.low, eff.t99.high],
                    "reported_efficiency_percent": e.reported_efficiency.get(&t.name),
                    "volume": vol.mean, "mean_price": price.mean,
                    "price_rmsd": rmsd.mean, "alpha": alpha.mean }),
            );
        }
    }
}

/// `markets.csv` of a comparison: one row per (market, treatment, period length).
fn markets_table() -> Table {
    let mut header: Vec<String> = ["market", "treatment", "length", "unit", "metric"]
        .map(String::from)
        .to_vec();
    header.extend(
        gridlease_sim::stats::Summary::COLUMNS
            .iter()
            .map(|c| c.to_string()),
    );
    Table {
        header,
        rows: Vec::new(),
    }
}

fn add_market(t: &mut Table, e: &Experiment, cells: &[experiment::CellSummary]) {
    for c in cells.iter().filter(|c| c.period.is_none()) {
        let [length, unit] = experiment::length_cells(c.length);
        let mut row = vec![
            e.name.clone(),
            c.treatment.clone(),
            length,
            unit,
            c.metric.to_string(),
        ];
        row.extend(c.summary.cells());
        t.rows.push(row);
    }
}

fn write(
    out: &Path,
    a: &ZiArgs,
    path: &Path,
    e: &Experiment,
    reps: &[Replication],
    cells: &[experiment::CellSummary],
) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let mut files = Vec::new();
    for (name, t) in [
        ("periods.csv", experiment::periods_table(e, reps)),
        ("replications.csv", experiment::replications_table(e, reps)),
        ("summary.csv", experiment::summary_table(cells)),
        (
            "transactions.csv",
            experiment::transactions_table(e, reps, a.seed),
        ),
    ] {
        t.write(&out.join(name))?;
        files.push(name.to_string());
    }
    std::fs::copy(path, out.join("experiment.toml"))
        .with_context(|| format!("copy {}", path.display()))?;
    files.push("experiment.toml".into());
    if !a.no_plots {
        files.extend(plot::zi::prices(out, e, reps)?);
        files.extend(plot::zi::efficiency(
            out,
            &[plot::zi::MarketEfficiency::of(e, reps)],
        )?);
    }
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
        seconds_per_period: e.seconds_per_period.clone(),
        shout_rate: e.shout_rate,
        files,
    };
    let text = serde_json::to_string_pretty(&m)? + "\n";
    std::fs::write(out.join("manifest.json"), text).context("write manifest.json")
}
