//! `gridlease-sim merge`.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::Printer;

pub(crate) fn merge(shards: &[PathBuf], out: &Path, plots: bool, p: &Printer) -> Result<()> {
    let dirs: Vec<&Path> = shards.iter().map(PathBuf::as_path).collect();
    let files = gridlease_sim::output::merge(&dirs, out, plots)?;
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
