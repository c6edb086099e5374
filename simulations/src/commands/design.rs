//! `gridlease-sim design`: writes a points file for `sweep --points` (`gridlease_sim::design`),
//! with the SALib problem beside it.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use gridlease_sim::design::{self, Method};

use crate::Printer;

/// The design methods.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum MethodArg {
    /// Latin hypercube: N points.
    Lhs,
    /// Saltelli's scheme over a Sobol sequence: N base rows, N x (keys + 2) points.
    Sobol,
    /// Morris trajectories: N trajectories, N x (keys + 1) points.
    Morris,
}

/// `design` arguments.
#[derive(Args, Debug)]
pub(crate) struct DesignArgs {
    /// The design.
    method: MethodArg,
    /// `KEY=LO..HI`, repeatable: a scenario key (as `sweep --param` takes) and its range.
    /// Whole-number ends give whole numbers; a decimal point gives decimals.
    #[arg(long = "param", required = true)]
    params: Vec<String>,
    /// Latin hypercube points, Sobol base rows, or Morris trajectories.
    #[arg(long)]
    n: usize,
    /// Morris grid levels (even).
    #[arg(long, default_value_t = 4)]
    levels: u32,
    /// Seed of the design's randomness (lhs strata, Sobol scrambling, Morris starts).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The points file to write (CSV); the SALib problem goes beside it as
    /// `<name>.problem.json`.
    #[arg(long, default_value = "points.csv")]
    out: PathBuf,
}

pub(crate) fn design(a: DesignArgs, p: &Printer) -> Result<()> {
    let ranges = design::parse_ranges(&a.params)?;
    let method = match a.method {
        MethodArg::Lhs => Method::Lhs,
        MethodArg::Sobol => Method::Sobol,
        MethodArg::Morris => Method::Morris { levels: a.levels },
    };
    let (header, rows) = design::design(method, &ranges, a.n, a.seed)?;
    design::write_points(&a.out, &header, &rows)
        .with_context(|| format!("write {}", a.out.display()))?;
    let name = format!("{:?}", a.method).to_lowercase();
    let problem = serde_json::json!({
        "method": name,
        "n": a.n,
        "levels": a.levels,
        "seed": a.seed,
        "points": rows.len(),
        "num_vars": ranges.len(),
        "names": ranges.iter().map(|r| r.key.clone()).collect::<Vec<_>>(),
        "bounds": ranges.iter().map(|r| [r.lo, r.hi]).collect::<Vec<_>>(),
    });
    let problem_path = a.out.with_extension("problem.json");
    std::fs::write(
        &problem_path,
        serde_json::to_string_pretty(&problem)? + "\n",
    )
    .with_context(|| format!("write {}", problem_path.display()))?;
    p.result(
        &format!(
            "{} design: {} points over {} keys in {} (SALib problem: {}); run them with \
             `gridlease-sim sweep SCENARIO --points {}`",
            name,
            rows.len(),
            ranges.len(),
            a.out.display(),
            problem_path.display(),
            a.out.display()
        ),
        &problem,
    );
    Ok(())
}
