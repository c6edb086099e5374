//! The simulator's tables: text cells read from and written to CSV, shared by the outputs
//! ([`crate::output`]), the plots ([`crate::plot`]), the shard checks ([`crate::shards`]) and the
//! columnar conversion ([`crate::columnar`]).

use std::path::Path;

use anyhow::{Context, Result};

/// A table of text cells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// Column names.
    pub header: Vec<String>,
    /// Rows.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// Index of a column.
    pub fn col(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    /// Writes as CSV.
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut w =
            csv::Writer::from_path(path).with_context(|| format!("create {}", path.display()))?;
        w.write_record(&self.header)?;
        for r in &self.rows {
            w.write_record(r)?;
        }
        w.flush()?;
        Ok(())
    }

    /// Reads a CSV written by [`Table::write`].
    pub fn read(path: &Path) -> Result<Self> {
        let mut r =
            csv::Reader::from_path(path).with_context(|| format!("open {}", path.display()))?;
        let header = r.headers()?.iter().map(str::to_string).collect();
        let mut rows = Vec::new();
        for rec in r.records() {
            rows.push(rec?.iter().map(str::to_string).collect());
        }
        Ok(Self { header, rows })
    }
}
