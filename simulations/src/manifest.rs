//! What `manifest.json` holds: written by `run`/`sweep` ([`crate::output`]), read back and
//! checked by `merge` ([`crate::shards`]), whose coverage of the study it then records. Plain
//! data: the outputs and the shard checks both use it, and the outputs need not know the checks.

use serde::{Deserialize, Serialize};

/// The manifest (`manifest.json`), written by `run`/`sweep` and read back by `merge`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// `gridlease-sim` version.
    pub version: String,
    /// The git revision the binary was built from ([`crate::output::git_revision`]).
    pub git_revision: Option<String>,
    /// Scenario name.
    pub scenario: String,
    /// SHA-256 of the base scenario's canonical TOML.
    pub scenario_hash: String,
    /// Base seed.
    pub seed: u64,
    /// Replications per point.
    pub replications: u64,
    /// Swept parameters and their values.
    pub sweep: Vec<(String, Vec<String>)>,
    /// Number of sweep points.
    pub points: usize,
    /// Shard `i/n`, if any.
    pub shard: Option<String>,
    /// Replications in this output.
    pub runs: usize,
    /// Files written.
    pub files: Vec<String>,
    /// BLAKE3 (hex) of every table written (`.csv` and `.parquet`), by file name: `merge`
    /// refuses a shard whose tables do not match, are missing, or are not listed.
    #[serde(default)]
    pub tables: std::collections::BTreeMap<String, String>,
    /// Events processed (all runs).
    pub events: u64,
    /// Wall-clock seconds (not reproducible, informational only).
    pub wall_seconds: f64,
    /// Events per wall-clock second.
    pub events_per_second: f64,
    /// `merge` only: the shard directories merged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged_from: Vec<String>,
    /// `merge` only: which shards and replications the merged output covers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coverage: Option<Coverage>,
    /// `--trace` only: what `trace.csv` holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceInfo>,
    /// The data files the scenario read (empirical distributions), each with its BLAKE3; the
    /// scenario hash covers them too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<crate::scenario::DataFile>,
}

/// Whether `name` is a table (what [`Manifest::tables`] covers): a `.csv` or `.parquet` file.
pub fn is_table(name: &str) -> bool {
    name.ends_with(".csv") || name.ends_with(".parquet")
}

/// BLAKE3 (hex) of a file.
pub fn blake3_of(path: &std::path::Path) -> std::io::Result<String> {
    let mut h = blake3::Hasher::new();
    h.update_reader(std::fs::File::open(path)?)?;
    Ok(h.finalize().to_hex().to_string())
}

/// The BLAKE3 of each table among `files` (names in `dir`), for [`Manifest::tables`].
pub fn table_checksums(
    dir: &std::path::Path,
    files: &[String],
) -> std::io::Result<std::collections::BTreeMap<String, String>> {
    files
        .iter()
        .filter(|f| is_table(f))
        .map(|f| Ok((f.clone(), blake3_of(&dir.join(f))?)))
        .collect()
}

/// What `trace.csv` holds (`manifest.json`, `--trace` only).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct TraceInfo {
    /// `--trace-max-rows`.
    pub max_rows: usize,
    /// Rows each run kept at most.
    pub rows_per_run: usize,
    /// Rows written.
    pub rows: usize,
    /// Events not written because a run reached its cap (0: the trace is complete).
    pub dropped: u64,
}

/// One (point, replication) task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Task {
    /// Sweep point.
    pub point: usize,
    /// Replication.
    pub replication: u64,
}

/// What the merge covers, for the merged manifest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// Whether some replications are missing.
    pub partial: bool,
    /// Shard count of the split merged.
    pub shards: u64,
    /// Shard indices missing.
    pub missing_shards: Vec<u64>,
    /// The replications missing, as (point, replication).
    pub missing_replications: Vec<Task>,
}
