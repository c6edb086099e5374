//! `gridlease-sim`: the market simulator's command line. Parses, dispatches, prints; the
//! simulation itself lives in the library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc: the hot loop allocates and frees lease terms, strings and history vectors; with
/// glibc malloc that was ~12 % of a run. Allocation never influences results (no address is
/// used for ordering), so outputs stay byte-identical.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod commands;

/// Deterministic agent-based simulator of the gridlease GPU market.
#[derive(Parser, Debug)]
#[command(name = "gridlease-sim", version, about)]
struct Cli {
    /// Print results as JSON.
    #[arg(long, global = true)]
    json: bool,
    /// Print nothing but errors; no progress bar.
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a scenario for several replications.
    Run(commands::run::RunArgs),
    /// Run a scenario over the cartesian product of parameter values, or over the points of
    /// a points file (`--points`).
    Sweep(commands::run::SweepArgs),
    /// Write a points file for sensitivity analysis (Latin hypercube, Sobol/Saltelli, Morris)
    /// that `sweep --points` runs.
    Design(commands::design::DesignArgs),
    /// Merge shard output directories into one (tables, summary, plots).
    Merge {
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Skip plots.
        #[arg(long)]
        no_plots: bool,
        /// Also write each merged table as Parquet; needs the `parquet` feature (the default).
        #[arg(long)]
        parquet: bool,
        /// Merge even if shards are missing; the manifest lists the missing shards and
        /// replications (`coverage`).
        #[arg(long)]
        allow_partial: bool,
        /// Shard directories.
        #[arg(required = true)]
        shards: Vec<PathBuf>,
    },
    /// A zero-intelligence double-auction experiment (Gode & Sunder 1993) from a file:
    /// efficiency, volume and prices per period and replication, with intervals.
    Zi(commands::zi::ZiArgs),
}

/// All output goes through here: knows `--json` and `--quiet`; a closed pipe is not an error.
pub(crate) struct Printer {
    json: bool,
    quiet: bool,
}

impl Printer {
    /// Prints a human line, or the JSON value in JSON mode.
    pub(crate) fn result(&self, human: &str, json: &serde_json::Value) {
        if self.quiet {
            return;
        }
        let mut out = std::io::stdout().lock();
        let _ = if self.json {
            writeln!(out, "{json}")
        } else {
            writeln!(out, "{human}")
        };
    }

    /// Prints a warning on stderr (`warning: ...`), also in JSON mode; not with `--quiet`.
    pub(crate) fn warn(&self, message: &str) {
        if self.quiet {
            return;
        }
        let _ = writeln!(std::io::stderr().lock(), "warning: {message}");
    }

    /// Whether a progress bar may be drawn.
    pub(crate) fn progress(&self) -> bool {
        !self.quiet && !self.json
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let printer = Printer {
        json: cli.json,
        quiet: cli.quiet,
    };
    let res = match cli.command {
        Command::Run(a) => commands::run::run(a, &printer),
        Command::Sweep(a) => commands::run::sweep(a, &printer),
        Command::Design(a) => commands::design::design(a, &printer),
        Command::Merge {
            out,
            no_plots,
            parquet,
            allow_partial,
            shards,
        } => commands::merge::merge(
            &shards,
            &out,
            commands::merge::Options {
                plots: !no_plots,
                parquet,
                allow_partial,
            },
            &printer,
        ),
        Command::Zi(a) => commands::zi::zi(a, &printer),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("error: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}
