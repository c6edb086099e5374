//! Checking a set of shard outputs before `merge`: one study (same scenario, seed,
//! replications, sweep, binary), one split (`i/n` with the same n; an unsharded output counts
//! as `0/1`), each shard once, each holding exactly its tasks, and -- unless a partial merge is
//! asked for -- every shard present. A partial merge's manifest lists the missing shards and
//! the (point, replication) tasks they would have held.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use crate::manifest::{Coverage, Task};
use crate::output::{Manifest, tasks};
use crate::table::Table;

/// Why a shard set cannot be merged.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// No directories given.
    #[error("no shard directories given")]
    NoShards,
    /// A manifest could not be read or parsed.
    #[error("cannot read the manifest of {dir}: {reason}")]
    Manifest {
        /// The shard directory.
        dir: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A `shard` field that is not `i/n` with i < n.
    #[error("{dir}: shard {shard:?} is not i/n with 0 <= i < n")]
    BadShard {
        /// The shard directory.
        dir: PathBuf,
        /// The field's text.
        shard: String,
    },
    /// Shards of different studies or binaries.
    #[error(
        "{dir}: {field} is {found}, but {first} has {expected}; shards of different runs cannot be merged"
    )]
    Mismatch {
        /// The manifest field.
        field: &'static str,
        /// The first shard's directory.
        first: PathBuf,
        /// Its value.
        expected: String,
        /// The offending directory.
        dir: PathBuf,
        /// Its value.
        found: String,
    },
    /// Shards of different splits (`i/3` with `j/4`, or a sharded with an unsharded output).
    #[error(
        "{dir} is shard {shard} but {first} is shard {first_shard}: mixed splits cannot be merged"
    )]
    MixedSplits {
        /// The first shard's directory.
        first: PathBuf,
        /// Its shard.
        first_shard: String,
        /// The offending directory.
        dir: PathBuf,
        /// Its shard.
        shard: String,
    },
    /// The same shard given twice.
    #[error("shard {index}/{of} given twice: {a} and {b}")]
    Duplicate {
        /// Shard index.
        index: u64,
        /// Shard count.
        of: u64,
        /// First directory.
        a: PathBuf,
        /// Second directory.
        b: PathBuf,
    },
    /// A shard's runs.csv does not hold exactly the tasks of its shard.
    #[error(
        "{dir}: runs.csv holds {found} of the {expected} replications shard {shard} should have ({detail})"
    )]
    Contents {
        /// The shard directory.
        dir: PathBuf,
        /// Its shard.
        shard: String,
        /// Tasks it should hold.
        expected: usize,
        /// Matching rows found.
        found: usize,
        /// First difference.
        detail: String,
    },
    /// A table of a shard is damaged, missing, or not in its manifest.
    #[error("{dir}: {table} {problem}; this shard cannot be merged (run it again)")]
    Table {
        /// The shard directory.
        dir: PathBuf,
        /// The table's file name.
        table: String,
        /// What is wrong, in words.
        problem: String,
    },
    /// Shards are missing and no partial merge was asked for.
    #[error(
        "incomplete shard set: missing shard(s) {missing:?} of {of} ({tasks} of {total} replications); pass --allow-partial to merge anyway with the gaps listed in the manifest"
    )]
    Incomplete {
        /// Missing shard indices.
        missing: Vec<u64>,
        /// Shard count.
        of: u64,
        /// Tasks the missing shards hold.
        tasks: usize,
        /// All tasks of the study.
        total: usize,
    },
}

/// The shards' manifests, checked; the first shard's manifest is the template of the merged one.
#[derive(Debug)]
pub struct ShardSet {
    /// Manifests in the order given.
    pub manifests: Vec<Manifest>,
    /// Coverage.
    pub coverage: Coverage,
}

fn parse_shard(s: Option<&str>) -> Option<(u64, u64)> {
    let Some(s) = s else {
        return Some((0, 1));
    };
    let (i, n) = s.split_once('/')?;
    let (i, n): (u64, u64) = (i.trim().parse().ok()?, n.trim().parse().ok()?);
    (n > 0 && i < n).then_some((i, n))
}

fn shard_text((i, n): (u64, u64)) -> String {
    format!("{i}/{n}")
}

/// Reads and checks the shard directories' manifests and runs.csv.
pub fn check(dirs: &[&Path], allow_partial: bool) -> Result<ShardSet, MergeError> {
    let first_dir = dirs.first().ok_or(MergeError::NoShards)?.to_path_buf();
    let mut manifests = Vec::new();
    for dir in dirs {
        let path = dir.join("manifest.json");
        let m: Manifest = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
            .map_err(|reason| MergeError::Manifest {
                dir: dir.to_path_buf(),
                reason,
            })?;
        manifests.push(m);
    }
    let first = &manifests[0];
    for (dir, m) in dirs.iter().zip(&manifests).skip(1) {
        let fields: [(&'static str, String, String); 7] = [
            (
                "scenario_hash",
                show(&first.scenario_hash),
                show(&m.scenario_hash),
            ),
            ("seed", show(&first.seed), show(&m.seed)),
            (
                "replications",
                show(&first.replications),
                show(&m.replications),
            ),
            ("sweep", show(&first.sweep), show(&m.sweep)),
            ("points", show(&first.points), show(&m.points)),
            ("version", show(&first.version), show(&m.version)),
            (
                "git_revision",
                show(&first.git_revision),
                show(&m.git_revision),
            ),
        ];
        for (field, expected, found) in fields {
            if expected != found {
                return Err(MergeError::Mismatch {
                    field,
                    first: first_dir.clone(),
                    expected,
                    dir: dir.to_path_buf(),
                    found,
                });
            }
        }
    }
    let mut split: Option<(u64, u64)> = None;
    let mut seen: BTreeMap<u64, PathBuf> = BTreeMap::new();
    for (dir, m) in dirs.iter().zip(&manifests) {
        let shard = parse_shard(m.shard.as_deref()).ok_or_else(|| MergeError::BadShard {
            dir: dir.to_path_buf(),
            shard: m.shard.clone().unwrap_or_default(),
        })?;
        match split {
            Some(f) if f.1 != shard.1 => {
                return Err(MergeError::MixedSplits {
                    first: first_dir.clone(),
                    first_shard: shard_text(f),
                    dir: dir.to_path_buf(),
                    shard: shard_text(shard),
                });
            }
            Some(_) => {}
            None => split = Some(shard),
        }
        if let Some(a) = seen.insert(shard.0, dir.to_path_buf()) {
            return Err(MergeError::Duplicate {
                index: shard.0,
                of: shard.1,
                a,
                b: dir.to_path_buf(),
            });
        }
        check_contents(dir, m, shard)?;
        check_tables(dir, m)?;
    }
    let n = split.map_or(1, |s| s.1);
    let missing_shards: Vec<u64> = (0..n).filter(|i| !seen.contains_key(i)).collect();
    let missing_replications: Vec<Task> = missing_shards
        .iter()
        .flat_map(|&i| tasks(first.points, first.replications, Some((i, n))))
        .map(|(point, replication)| Task { point, replication })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !missing_shards.is_empty() && !allow_partial {
        return Err(MergeError::Incomplete {
            tasks: missing_replications.len(),
            total: first.points * first.replications as usize,
            missing: missing_shards,
            of: n,
        });
    }
    Ok(ShardSet {
        coverage: Coverage {
            partial: !missing_shards.is_empty(),
            shards: n,
            missing_shards,
            missing_replications,
        },
        manifests,
    })
}

/// The shard's runs.csv must hold exactly the tasks of `shard`, once each.
fn check_contents(dir: &Path, m: &Manifest, shard: (u64, u64)) -> Result<(), MergeError> {
    let want: Vec<(usize, u64)> = tasks(m.points, m.replications, Some(shard));
    let bad = |found: usize, detail: String| MergeError::Contents {
        dir: dir.to_path_buf(),
        shard: shard_text(shard),
        expected: want.len(),
        found,
        detail,
    };
    let runs = Table::read(&dir.join("runs.csv")).map_err(|e| bad(0, format!("{e:#}")))?;
    let rep = runs
        .col("replication")
        .ok_or_else(|| bad(0, "no replication column".into()))?;
    let mut got: Vec<(usize, u64)> = runs
        .rows
        .iter()
        .filter_map(|r| Some((r.first()?.parse().ok()?, r.get(rep)?.parse().ok()?)))
        .collect();
    got.sort_unstable();
    let mut want_sorted = want.clone();
    want_sorted.sort_unstable();
    if got != want_sorted {
        let found = got
            .iter()
            .filter(|t| want_sorted.binary_search(t).is_ok())
            .count();
        let detail = match want_sorted.iter().find(|t| got.binary_search(t).is_err()) {
            Some((p, r)) => format!("point {p} replication {r} is missing"),
            None => format!("{} rows, {} expected", got.len(), want.len()),
        };
        return Err(bad(found, detail));
    }
    if m.runs != want.len() {
        return Err(bad(m.runs, format!("its manifest says runs = {}", m.runs)));
    }
    Ok(())
}

/// Every table the manifest lists must be there with its BLAKE3, and every table in the
/// directory must be listed (one left by another run would be merged with this one's).
fn check_tables(dir: &Path, m: &Manifest) -> Result<(), MergeError> {
    let bad = |table: &str, problem: String| MergeError::Table {
        dir: dir.to_path_buf(),
        table: table.to_string(),
        problem,
    };
    if m.tables.is_empty() {
        return Err(bad(
            "manifest.json",
            "lists no table checksums (written by an older gridlease-sim?)".into(),
        ));
    }
    for (table, want) in &m.tables {
        match crate::manifest::blake3_of(&dir.join(table)) {
            Ok(got) if &got == want => {}
            Ok(got) => {
                return Err(bad(
                    table,
                    format!("is damaged: its BLAKE3 is {got}, the manifest says {want}"),
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(bad(table, "is missing (the manifest lists it)".into()));
            }
            Err(e) => return Err(bad(table, format!("cannot be read: {e}"))),
        }
    }
    let entries = std::fs::read_dir(dir).map_err(|e| bad(".", format!("cannot be listed: {e}")))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if crate::manifest::is_table(&name) && !m.tables.contains_key(&name) {
            return Err(bad(&name, "is not in the manifest (an extra table)".into()));
        }
    }
    Ok(())
}

/// JSON text of a manifest field, for mismatch messages.
fn show<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}
