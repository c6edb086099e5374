//! `gridlease-sim merge`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use gridlease_sim::shards;

use crate::Printer;

pub(crate) fn merge(
    shards: &[PathBuf],
    out: &Path,
    plots: bool,
    allow_partial: bool,
    p: &Printer,
) -> Result<()> {
    let dirs: Vec<&Path> = shards.iter().map(PathBuf::as_path).collect();
    let set = shards::check(&dirs, allow_partial)?;
    let mut files = gridlease_sim::output::merge(&dirs, out, plots)?;
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
