//! `gridlease-sim merge`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use gridlease_sim::{columnar, shards};

use crate::Printer;

/// What `merge` writes besides the tables.
pub(crate) struct Options {
    /// Draw plots.
    pub(crate) plots: bool,
    /// Parquet copies of the tables.
    pub(crate) parquet: bool,
    /// Merge an incomplete set.
    pub(crate) allow_partial: bool,
}

pub(crate) fn merge(shards: &[PathBuf], out: &Path, o: Options, p: &Printer) -> Result<()> {
    if o.parquet && !columnar::AVAILABLE {
        bail!(
            "--parquet: this gridlease-sim was built without Parquet support; rebuild with \
             `cargo build --release -p gridlease-sim --features parquet`"
        );
    }
    let dirs: Vec<&Path> = shards.iter().map(PathBuf::as_path).collect();
    let set = shards::check(&dirs, o.allow_partial)?;
    let mut files = gridlease_sim::output::merge(&dirs, out, o.plots)?;
    if o.parquet {
        files.extend(columnar::convert(out, &gridlease_sim::output::TABLES)?);
    }
    if set.manifests[0].replications < gridlease_sim::stats::MIN_N_FOR_INTERVAL as u64 {
        p.warn(&format!(
            "{} replications per point: fewer than {}, so summary.csv and the plots have no \
             intervals",
            set.manifests[0].replications,
            gridlease_sim::stats::MIN_N_FOR_INTERVAL
        ));
    }
    files.push("manifest.json".into());
    // The first shard's manifest, with runs, events and wall seconds summed over the shards,
    // `shard` null, the directories merged and the coverage (what is missing, if anything).
    let mut m = set.manifests[0].clone();
    m.runs = set.manifests.iter().map(|s| s.runs).sum();
    m.events = set.manifests.iter().map(|s| s.events).sum();
    m.wall_seconds = set.manifests.iter().map(|s| s.wall_seconds).sum();
    m.events_per_second = if m.wall_seconds > 0.0 {
        m.events as f64 / m.wall_seconds
    } else {
        0.0
    };
    m.shard = None;
    m.merged_from = dirs.iter().map(|d| d.display().to_string()).collect();
    m.coverage = Some(set.coverage.clone());
    // Traces are not merged (each shard's trace.csv stays in its directory).
    m.trace = None;
    m.tables = gridlease_sim::manifest::table_checksums(out, &files)
        .context("checksum the merged tables")?;
    m.files = files.clone();
    let text = serde_json::to_string_pretty(&m)? + "\n";
    std::fs::write(out.join("manifest.json"), text).context("write manifest.json")?;
    let gaps = if set.coverage.partial {
        format!(
            " -- PARTIAL: shard(s) {:?} of {} missing, {} replications absent (listed in manifest.json)",
            set.coverage.missing_shards,
            set.coverage.shards,
            set.coverage.missing_replications.len()
        )
    } else {
        String::new()
    };
    p.result(
        &format!(
            "merged {} shards ({} runs) into {}: {}{gaps}",
            dirs.len(),
            m.runs,
            out.display(),
            files.join(", ")
        ),
        &serde_json::json!({ "out": out, "files": files, "runs": m.runs,
            "coverage": set.coverage }),
    );
    Ok(())
}
