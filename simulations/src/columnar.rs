//! Parquet copies of the output tables (`<name>.parquet` beside each `<name>.csv`), for
//! analysis tools that read columnar files (pandas, polars, DuckDB, R arrow).
//!
//! Built with the crate feature `parquet` (arrow and parquet crates; on by default). Each file
//! holds one row group with the CSV's columns in the same order and the same rows. An empty
//! cell (a value the CSV leaves out: NaN, or an interval a summary does not give) is null; a
//! column whose every other cell is an integer is `Int64`, one whose every other cell is a
//! number (`inf` included) is `Float64` (money in GLU as well: exact to the micro-unit below
//! 2^53 micro-units), anything else `Utf8`. A column with no value at all is `Float64`, all
//! null (the summary's intervals below 5 replications), except the text columns of
//! [`TEXT_COLUMNS`]. Snappy-compressed.

use std::path::Path;

use anyhow::{Context, Result};

use crate::output::Table;

/// Whether this build can write Parquet.
pub const AVAILABLE: bool = cfg!(feature = "parquet");

/// Columns that hold text even when every cell is empty (the summary's `note`).
pub const TEXT_COLUMNS: [&str; 1] = ["note"];

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
        // Empty cells are nulls; the others decide the type.
        let ints: Option<Vec<Option<i64>>> = cells().map(nullable).collect();
        let floats: Option<Vec<Option<f64>>> = cells().map(nullable).collect();
        let any_value = cells().any(|s| !s.is_empty());
        let text = TEXT_COLUMNS.contains(&name.as_str()) || t.rows.is_empty();
        let (dt, col): (DataType, ArrayRef) = match (ints, floats) {
            (Some(v), _) if !text && any_value => (DataType::Int64, Arc::new(Int64Array::from(v))),
            (_, Some(v)) if !text => (DataType::Float64, Arc::new(Float64Array::from(v))),
            _ => (
                DataType::Utf8,
                Arc::new(StringArray::from_iter_values(cells())),
            ),
        };
        // Numbers may be null (one schema whatever the data); text never is.
        let nullable = dt != DataType::Utf8;
        fields.push(Field::new(name, dt, nullable));
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

/// A cell as a number of type `T`: `Some(None)` when empty (a null), `None` when it is not one.
#[cfg(feature = "parquet")]
fn nullable<T: std::str::FromStr>(s: &str) -> Option<Option<T>> {
    if s.is_empty() {
        Some(None)
    } else {
        s.parse().ok().map(Some)
    }
}

#[cfg(not(feature = "parquet"))]
fn write(_t: &Table, _path: &Path) -> Result<()> {
    anyhow::bail!(
        "this gridlease-sim was built without Parquet support; rebuild with \
         `cargo build --release -p gridlease-sim --features parquet`"
    )
}
