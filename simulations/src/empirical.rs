//! Empirical distributions from data: a column of a CSV file that a scenario names in place of
//! a parametric distribution (a renter group's job durations, valuations or inter-arrival
//! times). Sampling draws one of the column's values uniformly -- the empirical distribution
//! itself, resampled -- with one draw from the caller's stream.
//!
//! A scenario records the file's BLAKE3, so its hash (and every manifest's `scenario_hash`)
//! covers the data: a changed file is a different study, and `merge` refuses to mix them. A
//! scenario may pin the hash itself (`blake3 = "..."`); loading then refuses a file that
//! differs.

use std::path::Path;
use std::sync::Arc;

use rand::RngCore;
use serde::{Deserialize, Serialize};

/// Largest data file read, bytes.
pub const MAX_FILE_BYTES: u64 = 256 << 20;
/// Most values a column may hold.
pub const MAX_ROWS: usize = 10_000_000;

/// A column of a CSV file as a distribution (`{ file = "data/durations.csv", column =
/// "minutes" }`). `file` is relative to the scenario file.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Empirical {
    /// The CSV file (with a header row), relative to the scenario file's directory.
    pub file: String,
    /// The column's name in the header.
    pub column: String,
    /// BLAKE3 (hex) of the file's bytes: filled in when the file is read; when the scenario
    /// gives it, the file must match it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub blake3: String,
    /// The column's values, in file order (read from the file, never written).
    #[serde(skip)]
    pub values: Arc<Vec<f64>>,
}

impl PartialEq for Empirical {
    /// Two distributions are equal when they name the same column of the same bytes.
    fn eq(&self, other: &Self) -> bool {
        self.file == other.file && self.column == other.column && self.blake3 == other.blake3
    }
}

impl Empirical {
    /// Whether the file has been read.
    pub fn loaded(&self) -> bool {
        !self.values.is_empty()
    }

    /// Reads the file (relative to `dir`): every value of the column must be a finite number
    /// above 0. `what` names the field in errors.
    pub fn load(&mut self, dir: &Path, what: &str) -> Result<(), String> {
        let path = dir.join(&self.file);
        let shown = path.display();
        let size = std::fs::metadata(&path)
            .map_err(|e| format!("{what}: cannot read {shown}: {e}"))?
            .len();
        if size > MAX_FILE_BYTES {
            return Err(format!(
                "{what}: {shown} is {size} bytes, more than {MAX_FILE_BYTES}"
            ));
        }
        let bytes =
            std::fs::read(&path).map_err(|e| format!("{what}: cannot read {shown}: {e}"))?;
        let hash = blake3::hash(&bytes).to_hex().to_string();
        if !self.blake3.is_empty() && self.blake3 != hash {
            return Err(format!(
                "{what}: {shown} has BLAKE3 {hash}, but the scenario pins {}",
                self.blake3
            ));
        }
        let mut r = csv::Reader::from_reader(bytes.as_slice());
        let header = r
            .headers()
            .map_err(|e| format!("{what}: {shown}: no header row: {e}"))?;
        let Some(col) = header.iter().position(|h| h.trim() == self.column) else {
            let have: Vec<&str> = header.iter().collect();
            return Err(format!(
                "{what}: {shown} has no column {:?} (columns: {})",
                self.column,
                have.join(", ")
            ));
        };
        let mut values = Vec::new();
        for (i, rec) in r.records().enumerate() {
            let line = i + 2;
            let rec = rec.map_err(|e| format!("{what}: {shown} line {line}: {e}"))?;
            let cell = rec.get(col).unwrap_or("").trim();
            let v: f64 = cell
                .parse()
                .map_err(|_| format!("{what}: {shown} line {line}: {cell:?} is not a number"))?;
            if !(v.is_finite() && v > 0.0) {
                return Err(format!(
                    "{what}: {shown} line {line}: {v} is not a positive number"
                ));
            }
            if values.len() == MAX_ROWS {
                return Err(format!("{what}: {shown} has more than {MAX_ROWS} rows"));
            }
            values.push(v);
        }
        if values.is_empty() {
            return Err(format!(
                "{what}: {shown} has no values in {:?}",
                self.column
            ));
        }
        self.blake3 = hash;
        self.values = Arc::new(values);
        Ok(())
    }

    /// One draw: a uniformly chosen value of the column (1.0 if the file was never read, which
    /// a validated scenario rules out).
    pub fn sample<R: RngCore + ?Sized>(&self, rng: &mut R) -> f64 {
        let n = self.values.len() as u64;
        if n == 0 {
            return 1.0;
        }
        let i = gridlease_contracts::pricing::uniform_inclusive(rng, 0, n - 1) as usize;
        self.values.get(i).copied().unwrap_or(1.0)
    }

    /// The column's median as an ask (GLU per GPU-hour -> micro-units): a data-priced group's
    /// first ask.
    pub fn median_ask(&self) -> gridlease_contracts::Money {
        gridlease_contracts::Money::from_micros((self.moments().1 * 1e6) as u64)
    }

    /// Mean and median of the values (NaN when not read; the median of an even count is the
    /// mean of the middle two).
    pub fn moments(&self) -> (f64, f64) {
        if self.values.is_empty() {
            return (f64::NAN, f64::NAN);
        }
        let mean = self.values.iter().sum::<f64>() / self.values.len() as f64;
        let mut s = self.values.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        (mean, median)
    }
}

/// As a provider's pricing strategy: each re-pricing (and auction bid) asks a value of the
/// column, GLU per GPU-hour, never below the cost floor.
impl gridlease_contracts::pricing::PricingStrategy for Empirical {
    fn quote(
        &self,
        input: &gridlease_contracts::pricing::PricingInput,
        rng: &mut dyn RngCore,
    ) -> gridlease_contracts::Money {
        let micros = (self.sample(rng) * 1e6).min(u64::MAX as f64 / 2.0) as u64;
        gridlease_contracts::Money::from_micros(micros).max(input.cost_floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{StreamKind, stream};

    fn file(dir: &Path, name: &str, text: &str) -> Empirical {
        std::fs::write(dir.join(name), text).unwrap();
        Empirical {
            file: name.into(),
            column: "minutes".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_column_loads_hashes_and_resamples_its_own_values() {
        let d = tempfile::tempdir().unwrap();
        let mut e = file(d.path(), "a.csv", "job,minutes\nx,10\ny,20.5\nz,30\n");
        e.load(d.path(), "t").unwrap();
        assert_eq!(*e.values, [10.0, 20.5, 30.0]);
        assert_eq!(
            e.blake3,
            blake3::hash(b"job,minutes\nx,10\ny,20.5\nz,30\n")
                .to_hex()
                .to_string()
        );
        let mut rng = stream(1, 0, StreamKind::Market, 0);
        let draws: Vec<f64> = (0..3000).map(|_| e.sample(&mut rng)).collect();
        for v in [10.0, 20.5, 30.0] {
            let n = draws.iter().filter(|&&x| x == v).count();
            assert!((900..1100).contains(&n), "{v}: {n} of 3000");
        }
        assert_eq!(e.moments(), (20.166666666666668, 20.5));
        // Pinned to its own hash it loads again; pinned to another it is refused.
        let mut pinned = e.clone();
        pinned.load(d.path(), "t").unwrap();
        pinned.blake3 = "00".repeat(32);
        assert!(pinned.load(d.path(), "t").unwrap_err().contains("pins"));
    }

    #[test]
    fn bad_files_are_refused_with_the_line() {
        let d = tempfile::tempdir().unwrap();
        for (text, needle) in [
            (
                "job,minutes\nx,10\ny,ten\n",
                "line 3: \"ten\" is not a number",
            ),
            (
                "job,minutes\nx,10\ny,-1\n",
                "line 3: -1 is not a positive number",
            ),
            (
                "job,minutes\nx,inf\n",
                "line 2: inf is not a positive number",
            ),
            (
                "job,hours\nx,1\n",
                "no column \"minutes\" (columns: job, hours)",
            ),
            ("job,minutes\n", "no values"),
        ] {
            let mut e = file(d.path(), "b.csv", text);
            let err = e.load(d.path(), "renter \"r\" duration_data").unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
            assert!(err.starts_with("renter \"r\" duration_data: "), "{err}");
        }
        let mut missing = Empirical {
            file: "none.csv".into(),
            column: "minutes".into(),
            ..Default::default()
        };
        assert!(
            missing
                .load(d.path(), "t")
                .unwrap_err()
                .contains("cannot read")
        );
    }
}
