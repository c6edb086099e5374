//! `gridlease-sim run` and `gridlease-sim sweep`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use gridlease_sim::output::{self, Manifest, Point};
use gridlease_sim::scenario::Scenario;
use gridlease_sim::{columnar, sweep};
use indicatif::{ProgressBar, ProgressStyle};

use crate::Printer;

/// `run` arguments.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// Scenario TOML file.
    scenario: PathBuf,
    /// Replications.
    #[arg(long, default_value_t = 10)]
    reps: u64,
    /// Base seed; replication r uses streams derived from (seed, r, agent).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output directory.
    #[arg(long, default_value = "sim-out")]
    out: PathBuf,
    /// Run only shard i of n (tasks k with k mod n == i), e.g. `3/16`.
    #[arg(long)]
    shard: Option<String>,
    /// Skip plots.
    #[arg(long)]
    no_plots: bool,
    /// Also write each table as Parquet (`runs.parquet` beside `runs.csv`, ...); needs a build
    /// with the `parquet` feature (the default).
    #[arg(long)]
    parquet: bool,
    /// Rayon worker threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Also write `trace.csv`: one row per market event (arrival, resubmission, abandon,
    /// lease start and end, provider online/offline/crash/repair) of every run.
    #[arg(long)]
    trace: bool,
    /// Most rows `trace.csv` holds, over all runs of the study (each run keeps its first
    /// max / runs events; the manifest and a warning say how many were dropped); at most
    /// 20000000.
    #[arg(long, default_value_t = output::TRACE_ROWS_DEFAULT, requires = "trace")]
    trace_max_rows: usize,
}

/// `sweep` arguments.
#[derive(Args, Debug)]
pub(crate) struct SweepArgs {
    #[command(flatten)]
    run: RunArgs,
    /// `key=v1,v2,...`; repeatable; the sweep is the cartesian product. Keys are dotted
    /// scenario paths: `days`, `renter.0.jobs_per_day` (group by index),
    /// `providers.home-4090.count` (group by name), `provider.0.pricing.price` (a field of an
    /// inline table), `provider.count` (every group); shorthands `providers`, `renters`,
    /// `renter_rate`. Values are TOML; commas inside quotes, `{}` and `[]` do not split.
    #[arg(
        long = "param",
        required_unless_present = "points",
        conflicts_with = "points"
    )]
    params: Vec<String>,
    /// A points file (`gridlease-sim design`, or CSV written by hand: a header of keys, one
    /// row of values per point) run in its order instead of a grid.
    #[arg(long, value_name = "FILE")]
    points: Option<PathBuf>,
    #[command(flatten)]
    slurm: super::slurm::SlurmArgs,
}

fn parse_shard(s: &str) -> Result<(u64, u64)> {
    let (i, n) = s.split_once('/').context("--shard wants i/n")?;
    let (i, n): (u64, u64) = (i.parse()?, n.parse()?);
    if n == 0 || i >= n {
        bail!("--shard {s}: need 0 <= i < n");
    }
    Ok((i, n))
}

pub(crate) fn run(a: RunArgs, p: &Printer) -> Result<()> {
    let base = Scenario::load(&a.scenario)?;
    let points = vec![Point {
        params: Vec::new(),
        scenario: base.clone(),
    }];
    execute(&a, &base, points, Vec::new(), p)
}

pub(crate) fn sweep(a: SweepArgs, p: &Printer) -> Result<()> {
    let base = Scenario::load(&a.run.scenario)?;
    if a.slurm.slurm {
        return submit(&a, &base, p);
    }
    if let Some(file) = &a.points {
        let (keys, rows) = gridlease_sim::design::read_points(file)?;
        let points = sweep::points_from_rows(&base, &keys, &rows)
            .with_context(|| format!("points file {}", file.display()))?;
        // The manifest's `sweep`: each key with its value at every point, in point order.
        let columns = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), rows.iter().map(|r| r[i].clone()).collect()))
            .collect();
        return execute(&a.run, &base, points, columns, p);
    }
    let axes = sweep::parse_params(&a.params)?;
    let points = sweep::points(&base, &axes)?;
    let axes = axes.into_iter().map(|ax| (ax.key, ax.values)).collect();
    execute(&a.run, &base, points, axes, p)
}

/// `sweep --slurm`: the study is checked here as it would be run (scenario, parameters or
/// points, replications), then submitted.
fn submit(a: &SweepArgs, base: &Scenario, p: &Printer) -> Result<()> {
    if a.run.shard.is_some() {
        bail!("--shard and --slurm: --slurm shards the sweep itself (--shards N)");
    }
    if a.run.trace {
        bail!("--trace and --slurm: trace one shard by hand with --shard instead");
    }
    if a.run.reps == 0 {
        bail!("--reps 0: nothing to run (need at least 1 replication)");
    }
    let points = match &a.points {
        Some(file) => {
            let (keys, rows) = gridlease_sim::design::read_points(file)?;
            sweep::points_from_rows(base, &keys, &rows)
                .with_context(|| format!("points file {}", file.display()))?
                .len()
        }
        None => sweep::points(base, &sweep::parse_params(&a.params)?)?.len(),
    };
    let study = super::slurm::Study {
        scenario: &a.run.scenario,
        params: &a.params,
        points: a.points.as_deref(),
        reps: a.run.reps,
        seed: a.run.seed,
        threads: a.run.threads,
        parquet: a.run.parquet,
        plots: !a.run.no_plots,
        out: &a.run.out,
        runs: points as u64 * a.run.reps,
    };
    super::slurm::submit(&study, &a.slurm, p)
}

fn execute(
    a: &RunArgs,
    base: &Scenario,
    points: Vec<Point>,
    axes: Vec<(String, Vec<String>)>,
    p: &Printer,
) -> Result<()> {
    if a.reps == 0 {
        bail!("--reps 0: nothing to run (need at least 1 replication)");
    }
    if a.parquet && !columnar::AVAILABLE {
        bail!(
            "--parquet: this gridlease-sim was built without Parquet support; rebuild with \
             `cargo build --release -p gridlease-sim --features parquet`"
        );
    }
    if a.trace && !(1..=output::TRACE_ROWS_LIMIT).contains(&a.trace_max_rows) {
        bail!(
            "--trace-max-rows {}: need 1..={} (a larger trace is better taken from shorter runs \
             or fewer replications)",
            a.trace_max_rows,
            output::TRACE_ROWS_LIMIT
        );
    }
    let shard = a.shard.as_deref().map(parse_shard).transpose()?;
    // Each run's share of the trace depends on the whole study, not on the shard or threads.
    let rows_per_run = output::trace_rows_per_run(a.trace_max_rows, points.len() * a.reps as usize);
    let tasks = output::tasks(points.len(), a.reps, shard);
    // Progress in simulated minutes over all runs of this invocation.
    let bar = if p.progress() {
        ProgressBar::new(output::total_minutes(&points, &tasks))
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {percent}% of simulated time ({len} min in {msg} runs), eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(tasks.len().to_string());
    let started = Instant::now();
    let tick = |ms: u64| bar.inc(ms / 60_000);
    let go = || {
        if a.trace {
            output::execute_traced(&points, &tasks, a.seed, &tick, rows_per_run)
        } else {
            output::execute(&points, &tasks, a.seed, &tick)
        }
    };
    let records = match a.threads {
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()?
            .install(go),
        None => go(),
    };
    bar.finish_and_clear();
    let wall = started.elapsed().as_secs_f64();
    let events: u64 = records.iter().map(|r| r.result.events).sum();
    let (runs, buckets, waits) = output::tables(&points, &records, a.seed);
    let mut files = output::write_all(&a.out, &runs, &buckets, &waits, !a.no_plots)?;
    let (providers, renters) = output::agent_tables(&points, &records);
    files.extend(output::write_agents(&a.out, &providers, &renters)?);
    if a.parquet {
        files.extend(columnar::convert(&a.out, &output::TABLES)?);
    }
    let trace = if a.trace {
        let (table, dropped) = output::trace_table(&points, &records);
        table.write(&a.out.join("trace.csv"))?;
        files.push("trace.csv".into());
        if a.parquet {
            files.extend(columnar::convert(&a.out, &["trace.csv"])?);
        }
        if dropped > 0 {
            p.warn(&format!(
                "trace.csv capped: each run kept its first {rows_per_run} events and {dropped} \
                 were dropped (--trace-max-rows {} over {} runs); trace fewer or shorter runs, \
                 or raise --trace-max-rows (at most {})",
                a.trace_max_rows,
                points.len() * a.reps as usize,
                output::TRACE_ROWS_LIMIT
            ));
        }
        Some(output::TraceInfo {
            max_rows: a.trace_max_rows,
            rows_per_run,
            rows: table.rows.len(),
            dropped,
        })
    } else {
        None
    };
    if a.reps < gridlease_sim::stats::MIN_N_FOR_INTERVAL as u64 {
        p.warn(&format!(
            "--reps {}: fewer than {} replications per point, so summary.csv and the plots have              no intervals; run at least {} for them",
            a.reps,
            gridlease_sim::stats::MIN_N_FOR_INTERVAL,
            gridlease_sim::stats::MIN_N_FOR_INTERVAL
        ));
    }
    files.push("manifest.json".into());
    let manifest = Manifest {
        version: env!("CARGO_PKG_VERSION").into(),
        git_revision: output::git_revision(),
        scenario: base.name.clone(),
        scenario_hash: output::scenario_hash(base),
        seed: a.seed,
        replications: a.reps,
        sweep: axes,
        points: points.len(),
        shard: a.shard.clone(),
        runs: records.len(),
        tables: gridlease_sim::manifest::table_checksums(&a.out, &files)
            .context("checksum the tables")?,
        files: files.clone(),
        events,
        wall_seconds: wall,
        events_per_second: events as f64 / wall.max(1e-9),
        merged_from: Vec::new(),
        coverage: None,
        trace,
        data: base.data_files(),
    };
    write_manifest(&a.out, &manifest)?;
    p.result(
        &format!(
            "{} runs of {:?} in {:.2} s: {} events ({:.0} events/s); wrote {} to {}",
            records.len(),
            base.name,
            wall,
            events,
            manifest.events_per_second,
            files.join(", "),
            a.out.display()
        ),
        &serde_json::to_value(&manifest)?,
    );
    Ok(())
}

fn write_manifest(dir: &Path, m: &Manifest) -> Result<()> {
    let text = serde_json::to_string_pretty(m)?;
    std::fs::write(dir.join("manifest.json"), text + "\n").context("write manifest.json")
}
