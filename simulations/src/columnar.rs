//! Parquet copies of the output tables (`<name>.parquet` beside each `<name>.csv`), for
//! analysis tools that read columnar files (pandas, polars, DuckDB, R arrow).
//!
//! Built only with the crate feature `parquet` (arrow and parquet crates; off by default
//! because they add build time). Each file holds one row group with the CSV's columns in the
//! same order and the same rows; a column whose every cell is an integer is `Int64`, one whose
//! every cell is a number (`inf` included) is `Float64` (money in GLU as well: exact to the
//! micro-unit below 2^53 micro-units), anything else `Utf8`. Snappy-compressed.

use std::path::Path;

use anyhow::{Context, Result};

use crate::output::Table;

/// Whether this build can write Parquet.
pub const AVAILABLE: bool = cfg!(feature = "parquet");

/// Writes `<stem>.parquet` for each `<stem>.csv` in `csvs` (files in `dir`); returns the names
/// written.
pub fn convert(dir: &Path, csvs: &[&str]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for name in csvs {
        let stem = name.strip_suffix(".csv").unwrap_or(name);
        let table = Table::read(&dir.join(name))?;
        let file = format!("{stem}.parquet");
        write(&table, &dir.join(&file)).with_context(|| format!("write {file}"))?;
        out.push(file);
    }
    Ok(out)
}

#[cfg(feature = "parquet")]
fn write(t: &Table, path: &Path) -> Result<()> {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::properties::WriterProperties;

    let mut fields = Vec::with_capacity(t.header.len());
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(t.header.len());
    for (c, name) in t.header.iter().enumerate() {
        let cells = || t.rows.iter().map(move |r| r[c].as_str());
        let ints: Option<Vec<i64>> = cells().map(|s| s.parse().ok()).collect();
        let floats: Option<Vec<f64>> = cells().map(|s| s.parse().ok()).collect();
        let (dt, col): (DataType, ArrayRef) = match (ints, floats) {
            (Some(v), _) if !t.rows.is_empty() => (DataType::Int64, Arc::new(Int64Array::from(v))),
            (_, Some(v)) if !t.rows.is_empty() => {
                (DataType::Float64, Arc::new(Float64Array::from(v)))
            }
            _ => (
                DataType::Utf8,
                Arc::new(StringArray::from_iter_values(cells())),
            ),
        };
        fields.push(Field::new(name, dt, false));
        columns.push(col);
    }
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns)?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let file = std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?;
    let mut w = ArrowWriter::try_new(file, schema, Some(props))?;
    w.write(&batch)?;
    w.close()?;
    Ok(())
}

#[cfg(not(feature = "parquet"))]
fn write(_t: &Table, _path: &Path) -> Result<()> {
    anyhow::bail!(
        "this gridlease-sim was built without Parquet support; rebuild with \
         `cargo build --release -p gridlease-sim --features parquet`"
    )
}
