//! `--parquet` through the real binary. With the `parquet` feature (`cargo test -p
//! gridlease-sim --features parquet`): every table gets a Parquet copy with the CSV's columns,
//! rows and values, typed (Int64, Float64, Utf8), also after `merge`, and the files are
//! byte-identical across runs. Without it: `--parquet` is refused before anything runs.

// Helpers outside #[test] fns: a panic here is still a test failure with a location.
#![allow(clippy::unwrap_used, clippy::print_stdout)]

mod common;

use common::run as sim;

use std::path::{Path, PathBuf};

fn attack() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/attack.toml")
}

#[cfg(not(feature = "parquet"))]
#[test]
fn parquet_is_refused_without_the_feature() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("o");
    let o = sim(&[
        "run",
        attack().to_str().unwrap(),
        "--reps",
        "1",
        "--parquet",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert!(err.contains("--features parquet"), "{err}");
    assert!(!out.join("manifest.json").exists());
}

#[cfg(feature = "parquet")]
mod with_feature {
    use super::*;
    use arrow_array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
    use arrow_schema::DataType;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    fn read_parquet(path: &Path) -> Vec<RecordBatch> {
        let f = std::fs::File::open(path).unwrap();
        ParquetRecordBatchReaderBuilder::try_new(f)
            .unwrap()
            .build()
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    fn read_csv(path: &Path) -> (Vec<String>, Vec<Vec<String>>) {
        let mut r = csv::Reader::from_path(path).unwrap();
        let h = r.headers().unwrap().iter().map(str::to_string).collect();
        let rows = r
            .records()
            .map(|x| x.unwrap().iter().map(str::to_string).collect())
            .collect();
        (h, rows)
    }

    /// Every cell of the Parquet copy equals the CSV's (numbers parsed, text as is).
    fn same_table(dir: &Path, stem: &str) {
        let (header, rows) = read_csv(&dir.join(format!("{stem}.csv")));
        let batches = read_parquet(&dir.join(format!("{stem}.parquet")));
        let n: usize = batches.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(n, rows.len(), "{stem}: rows");
        let schema = batches[0].schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, header, "{stem}: columns");
        let mut row0 = 0;
        for b in &batches {
            for (c, field) in schema.fields().iter().enumerate() {
                let col = b.column(c);
                for i in 0..b.num_rows() {
                    let cell = &rows[row0 + i][c];
                    match field.data_type() {
                        // An empty cell is null in a number column.
                        DataType::Int64 | DataType::Float64 if cell.is_empty() => {
                            assert!(col.is_null(i), "{stem}.{}: empty, not null", field.name());
                        }
                        DataType::Int64 => {
                            let a = col.as_any().downcast_ref::<Int64Array>().unwrap();
                            assert_eq!(
                                a.value(i),
                                cell.parse::<i64>().unwrap(),
                                "{stem}.{}",
                                field.name()
                            );
                        }
                        DataType::Float64 => {
                            let a = col.as_any().downcast_ref::<Float64Array>().unwrap();
                            let (x, y) = (a.value(i), cell.parse::<f64>().unwrap());
                            assert!(
                                x == y || (x.is_nan() && y.is_nan()),
                                "{stem}.{}",
                                field.name()
                            );
                        }
                        DataType::Utf8 => {
                            let a = col.as_any().downcast_ref::<StringArray>().unwrap();
                            assert_eq!(a.value(i), cell, "{stem}.{}", field.name());
                        }
                        t => panic!("{stem}.{}: unexpected type {t}", field.name()),
                    }
                }
            }
            row0 += b.num_rows();
        }
    }

    fn type_of(dir: &Path, stem: &str, col: &str) -> DataType {
        let batches = read_parquet(&dir.join(format!("{stem}.parquet")));
        let schema = batches[0].schema();
        schema.field_with_name(col).unwrap().data_type().clone()
    }

    const STEMS: [&str; 6] = [
        "runs",
        "buckets",
        "waits",
        "summary",
        "providers",
        "renters",
    ];

    #[test]
    fn every_table_has_an_equal_typed_parquet_copy_also_after_merge() {
        let tmp = tempfile::tempdir().unwrap();
        let sc = attack();
        let mut dirs = Vec::new();
        for shard in ["0/2", "1/2"] {
            let d = tmp.path().join(shard.replace('/', "-"));
            let o = sim(&[
                "-q",
                "sweep",
                sc.to_str().unwrap(),
                "--param",
                "days=0.1",
                "--param",
                "renter_rate=0.5,1",
                "--reps",
                "2",
                "--shard",
                shard,
                "--no-plots",
                "--parquet",
                "--out",
                d.to_str().unwrap(),
            ]);
            assert!(o.status.success());
            for stem in STEMS {
                same_table(&d, stem);
            }
            dirs.push(d);
        }
        let merged = tmp.path().join("merged");
        let mut args = vec!["-q", "merge", "--no-plots", "--parquet", "--out"];
        args.push(merged.to_str().unwrap());
        args.extend(dirs.iter().map(|d| d.to_str().unwrap()));
        assert!(sim(&args).status.success());
        for stem in STEMS {
            same_table(&merged, stem);
        }
        assert_eq!(type_of(&merged, "runs", "jobs"), DataType::Int64);
        assert_eq!(type_of(&merged, "runs", "utilization"), DataType::Float64);
        assert_eq!(type_of(&merged, "runs", "money_at_risk"), DataType::Float64);
        assert_eq!(type_of(&merged, "providers", "group"), DataType::Utf8);
        assert_eq!(type_of(&merged, "waits", "bin_upper_s"), DataType::Float64);
        // Two replications: the summary gives no intervals, their columns are numbers, all
        // null (not text), and the note is text.
        assert_eq!(type_of(&merged, "summary", "boot95_low"), DataType::Float64);
        assert_eq!(type_of(&merged, "summary", "note"), DataType::Utf8);
        assert_eq!(type_of(&merged, "summary", "bounds"), DataType::Utf8);
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(merged.join("manifest.json")).unwrap()).unwrap();
        assert!(
            m["files"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f == "renters.parquet")
        );
    }

    #[test]
    fn the_trace_gets_a_parquet_copy() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("t");
        let o = sim(&[
            "-q",
            "run",
            attack().to_str().unwrap(),
            "--reps",
            "1",
            "--no-plots",
            "--parquet",
            "--trace",
            "--out",
            d.to_str().unwrap(),
        ]);
        assert!(o.status.success());
        same_table(&d, "trace");
        assert_eq!(type_of(&d, "trace", "t_s"), DataType::Float64);
        assert_eq!(type_of(&d, "trace", "kind"), DataType::Utf8);
    }

    #[test]
    fn parquet_files_are_byte_identical_across_runs() {
        let tmp = tempfile::tempdir().unwrap();
        let sc = attack();
        let run = |name: &str| {
            let d = tmp.path().join(name);
            let o = sim(&[
                "-q",
                "run",
                sc.to_str().unwrap(),
                "--reps",
                "2",
                "--threads",
                if name == "a" { "1" } else { "2" },
                "--no-plots",
                "--parquet",
                "--out",
                d.to_str().unwrap(),
            ]);
            assert!(o.status.success());
            d
        };
        let (a, b) = (run("a"), run("b"));
        for stem in STEMS {
            let f = format!("{stem}.parquet");
            assert_eq!(
                std::fs::read(a.join(&f)).unwrap(),
                std::fs::read(b.join(&f)).unwrap(),
                "{f}"
            );
        }
    }
}
