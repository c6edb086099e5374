//! `gridlease-sim merge`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::Printer;

pub(crate) fn merge(shards: &[PathBuf], out: &Path, plots: bool, p: &Printer) -> Result<()> {
    let dirs: Vec<&Path> = shards.iter().map(PathBuf::as_path).collect();
    let manifest = merged_manifest(&dirs)?;
    let mut files = gridlease_sim::output::merge(&dirs, out, plots)?;
    files.push("manifest.json".into());
    let mut manifest = manifest;
    manifest["files"] = Value::from(files.clone());
    let text = serde_json::to_string_pretty(&manifest)? + "\n";
    std::fs::write(out.join("manifest.json"), text).context("write manifest.json")?;
    p.result(
        &format!(
            "merged {} shards into {}: {}",
            dirs.len(),
            out.display(),
            files.join(", ")
        ),
        &serde_json::json!({ "out": out, "files": files }),
    );
    Ok(())
}

/// The shards' manifests combined: they must agree on scenario hash, seed, replications and
/// sweep; runs, events and wall seconds are summed; `shard` becomes null and `merged_from`
/// lists the shard directories.
fn merged_manifest(dirs: &[&Path]) -> Result<Value> {
    let mut merged: Option<Value> = None;
    let (mut runs, mut events, mut wall) = (0u64, 0u64, 0.0f64);
    for dir in dirs {
        let path = dir.join("manifest.json");
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        let m: Value =
            serde_json::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
        runs += m["runs"].as_u64().unwrap_or(0);
        events += m["events"].as_u64().unwrap_or(0);
        wall += m["wall_seconds"].as_f64().unwrap_or(0.0);
        if let Some(first) = &merged {
            for key in ["scenario_hash", "seed", "replications", "sweep"] {
                if first[key] != m[key] {
                    bail!("{}: {key} differs from the first shard's", path.display());
                }
            }
        } else {
            merged = Some(m);
        }
    }
    let mut m = merged.context("no shards")?;
    m["runs"] = Value::from(runs);
    m["events"] = Value::from(events);
    m["wall_seconds"] = Value::from(wall);
    m["events_per_second"] = Value::from(if wall > 0.0 {
        events as f64 / wall
    } else {
        0.0
    });
    m["shard"] = Value::Null;
    m["merged_from"] = Value::from(
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>(),
    );
    Ok(m)
}
