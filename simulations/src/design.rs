//! Designs for sensitivity analysis: `gridlease-sim design lhs|sobol|morris --param
//! KEY=LO..HI ... --n N` writes a points file that `sweep --points FILE` runs.
//!
//! A points file is CSV: a header of scenario keys (as `sweep --param` takes them), then one
//! row per point with a value for each key (TOML or bare text, as `--param` values). Points
//! run in file order and keep their row's index as `point` in every table, so an analysis can
//! join its outputs back to the design.
//!
//! - **lhs**: a Latin hypercube of N points: each key's range cut into N equal strata, one
//!   point in each, the strata paired at random.
//! - **sobol**: Saltelli's scheme for first- and total-order Sobol indices (SALib's
//!   `sobol.analyze(..., calc_second_order=False)`): N base rows of an Owen-scrambled Sobol
//!   sequence in 2D dimensions (matrices A and B), written per base row as A, then A with
//!   column i from B for each key i, then B: N x (D + 2) points.
//! - **morris**: N Morris trajectories on a `levels`-level grid (SALib's `morris.analyze` with
//!   `num_levels=levels`): D + 1 points each, every step moving one key by
//!   levels / (2 (levels - 1)) of its range, keys in a random order.
//!
//! A range written with whole numbers (`count=10..60`) gives whole numbers (rounded: exact
//! only for lhs; Morris steps and Sobol points move to the nearest whole number); one with a
//! decimal point (`rate=0.5..2.0`) gives decimals (six places).

use std::path::Path;

use rand::Rng as _;
use rand::SeedableRng as _;
use rand::seq::SliceRandom as _;

/// Most points a design or points file holds.
pub const MAX_POINTS: usize = 100_000;
/// Most base rows of a Sobol design (the sequence's length).
pub const MAX_SOBOL_N: usize = 1 << 16;

/// A design method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Latin hypercube.
    Lhs,
    /// Saltelli's scheme over a Sobol sequence (first- and total-order indices).
    Sobol,
    /// Morris trajectories on a grid of this many levels (even, at least 2).
    Morris {
        /// Grid levels.
        levels: u32,
    },
}

/// One key's range.
#[derive(Clone, Debug, PartialEq)]
pub struct Range {
    /// Dotted scenario key.
    pub key: String,
    /// Low end.
    pub lo: f64,
    /// High end.
    pub hi: f64,
    /// Whole numbers only (both ends written without a decimal point).
    pub integer: bool,
}

/// A design or points file that cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum DesignError {
    /// Not `KEY=LO..HI` with numbers, LO < HI.
    #[error("--param {spec:?}: needs KEY=LO..HI with numbers LO < HI")]
    Range {
        /// The argument.
        spec: String,
    },
    /// A key twice.
    #[error("key {key} given twice")]
    RepeatedKey {
        /// The key.
        key: String,
    },
    /// A design size out of bounds.
    #[error("{0}")]
    Size(String),
    /// The points file is malformed.
    #[error("points file {path}: {message}")]
    File {
        /// The file.
        path: String,
        /// What is wrong, with the line.
        message: String,
    },
}

/// Parses `KEY=LO..HI`.
pub fn parse_range(spec: &str) -> Result<Range, DesignError> {
    let bad = || DesignError::Range { spec: spec.into() };
    let (k, r) = spec.split_once('=').ok_or_else(bad)?;
    let (lo, hi) = r.split_once("..").ok_or_else(bad)?;
    let (lo, hi) = (lo.trim(), hi.trim());
    let key = k.trim();
    let num = |s: &str| s.parse::<f64>().ok().filter(|v| v.is_finite());
    let (l, h) = (num(lo).ok_or_else(bad)?, num(hi).ok_or_else(bad)?);
    if key.is_empty() || l >= h {
        return Err(bad());
    }
    let whole = |s: &str| !s.contains(['.', 'e', 'E']);
    Ok(Range {
        key: key.into(),
        lo: l,
        hi: h,
        integer: whole(lo) && whole(hi),
    })
}

/// Parses every `--param`, refusing a key given twice.
pub fn parse_ranges(specs: &[String]) -> Result<Vec<Range>, DesignError> {
    let mut out: Vec<Range> = Vec::new();
    for s in specs {
        let r = parse_range(s)?;
        if out.iter().any(|x| x.key == r.key) {
            return Err(DesignError::RepeatedKey { key: r.key });
        }
        out.push(r);
    }
    Ok(out)
}

/// The design's points in the unit cube `[0, 1]^d`, in file order.
pub fn unit_points(
    method: Method,
    d: usize,
    n: usize,
    seed: u64,
) -> Result<Vec<Vec<f64>>, DesignError> {
    if d == 0 || n == 0 {
        return Err(DesignError::Size(
            "a design needs at least one key and --n 1".into(),
        ));
    }
    let total = match method {
        Method::Lhs => Some(n),
        Method::Sobol => n.checked_mul(d + 2),
        Method::Morris { .. } => n.checked_mul(d + 1),
    };
    if total.is_none_or(|t| t > MAX_POINTS) {
        return Err(DesignError::Size(format!(
            "{n} x {d} keys is more than {MAX_POINTS} points"
        )));
    }
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
    Ok(match method {
        Method::Lhs => {
            let mut cols: Vec<Vec<f64>> = Vec::with_capacity(d);
            for _ in 0..d {
                let mut strata: Vec<usize> = (0..n).collect();
                strata.shuffle(&mut rng);
                cols.push(
                    strata
                        .into_iter()
                        .map(|s| (s as f64 + rng.random::<f64>()) / n as f64)
                        .collect(),
                );
            }
            (0..n)
                .map(|i| cols.iter().map(|c| c[i]).collect())
                .collect()
        }
        Method::Sobol => {
            if n > MAX_SOBOL_N || 2 * d > sobol_burley::NUM_DIMENSIONS as usize {
                return Err(DesignError::Size(format!(
                    "sobol: at most {MAX_SOBOL_N} base rows and {} keys",
                    sobol_burley::NUM_DIMENSIONS / 2
                )));
            }
            let s = (seed ^ (seed >> 32)) as u32;
            let mut out = Vec::with_capacity(n * (d + 2));
            for j in 0..n as u32 {
                let a: Vec<f64> = (0..d as u32)
                    .map(|i| f64::from(sobol_burley::sample(j, i, s)))
                    .collect();
                let b: Vec<f64> = (0..d as u32)
                    .map(|i| f64::from(sobol_burley::sample(j, d as u32 + i, s)))
                    .collect();
                out.push(a.clone());
                for i in 0..d {
                    let mut ab = a.clone();
                    ab[i] = b[i];
                    out.push(ab);
                }
                out.push(b);
            }
            out
        }
        Method::Morris { levels } => {
            if levels < 2 || levels % 2 != 0 {
                return Err(DesignError::Size(format!(
                    "morris: {levels} levels; an even number, at least 2"
                )));
            }
            let p = levels as usize;
            let half = p / 2;
            let at = |level: usize| level as f64 / (p - 1) as f64;
            let mut out = Vec::with_capacity(n * (d + 1));
            for _ in 0..n {
                // Each key moves once, between level b and b + p/2, up or down.
                let base: Vec<usize> = (0..d).map(|_| rng.random_range(0..half)).collect();
                let up: Vec<bool> = (0..d).map(|_| rng.random::<bool>()).collect();
                let mut cur: Vec<usize> = (0..d)
                    .map(|i| if up[i] { base[i] } else { base[i] + half })
                    .collect();
                let mut order: Vec<usize> = (0..d).collect();
                order.shuffle(&mut rng);
                out.push(cur.iter().map(|&l| at(l)).collect());
                for i in order {
                    cur[i] = if up[i] { base[i] + half } else { base[i] };
                    out.push(cur.iter().map(|&l| at(l)).collect());
                }
            }
            out
        }
    })
}

/// A value of `r` at `u` in `[0, 1]`, as text.
fn value(r: &Range, u: f64) -> String {
    let v = r.lo + u.clamp(0.0, 1.0) * (r.hi - r.lo);
    if r.integer {
        format!("{}", v.round() as i64)
    } else {
        let s = format!("{v:.6}");
        let s = s.trim_end_matches('0');
        s.strip_suffix('.').unwrap_or(s).to_string()
    }
}

/// The design as a points file's header and rows.
pub fn design(
    method: Method,
    ranges: &[Range],
    n: usize,
    seed: u64,
) -> Result<(Vec<String>, Vec<Vec<String>>), DesignError> {
    let unit = unit_points(method, ranges.len(), n, seed)?;
    let header = ranges.iter().map(|r| r.key.clone()).collect();
    let rows = unit
        .iter()
        .map(|p| ranges.iter().zip(p).map(|(r, &u)| value(r, u)).collect())
        .collect();
    Ok((header, rows))
}

/// Writes a points file.
pub fn write_points(path: &Path, header: &[String], rows: &[Vec<String>]) -> std::io::Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    w.write_record(header)?;
    for r in rows {
        w.write_record(r)?;
    }
    w.flush()
}

/// Reads a points file: its keys and rows, each row a value for every key.
pub fn read_points(path: &Path) -> Result<(Vec<String>, Vec<Vec<String>>), DesignError> {
    let err = |message: String| DesignError::File {
        path: path.display().to_string(),
        message,
    };
    let mut r = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(false)
        .trim(csv::Trim::All)
        .from_path(path)
        .map_err(|e| err(e.to_string()))?;
    let header: Vec<String> = r
        .headers()
        .map_err(|e| err(e.to_string()))?
        .iter()
        .map(str::to_string)
        .collect();
    if header.is_empty() || header.iter().any(String::is_empty) {
        return Err(err("line 1: the header needs a key in every column".into()));
    }
    for (i, k) in header.iter().enumerate() {
        if header[..i].contains(k) {
            return Err(err(format!("line 1: key {k} given twice")));
        }
    }
    let mut rows = Vec::new();
    for (i, rec) in r.records().enumerate() {
        let rec = rec.map_err(|e| err(e.to_string()))?;
        let line = i + 2;
        if rows.len() == MAX_POINTS {
            return Err(err(format!("more than {MAX_POINTS} points")));
        }
        if let Some(c) = rec.iter().position(str::is_empty) {
            return Err(err(format!("line {line}: no value for {}", header[c])));
        }
        rows.push(rec.iter().map(str::to_string).collect());
    }
    if rows.is_empty() {
        return Err(err("no points (a header and at least one row)".into()));
    }
    Ok((header, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_latin_hypercube_puts_one_point_in_every_stratum_of_every_key() {
        let n = 20;
        let pts = unit_points(Method::Lhs, 3, n, 7).unwrap();
        assert_eq!(pts.len(), n);
        for k in 0..3 {
            let mut strata: Vec<usize> = pts.iter().map(|p| (p[k] * n as f64) as usize).collect();
            strata.sort();
            assert_eq!(strata, (0..n).collect::<Vec<_>>());
        }
        assert_eq!(pts, unit_points(Method::Lhs, 3, n, 7).unwrap());
        assert_ne!(pts, unit_points(Method::Lhs, 3, n, 8).unwrap());
    }

    #[test]
    fn a_sobol_design_is_a_then_each_mixed_row_then_b() {
        let (d, n) = (3, 8);
        let pts = unit_points(Method::Sobol, d, n, 1).unwrap();
        assert_eq!(pts.len(), n * (d + 2));
        for row in pts.chunks(d + 2) {
            let (a, b) = (&row[0], &row[d + 1]);
            for i in 0..d {
                for k in 0..d {
                    let want = if k == i { b[k] } else { a[k] };
                    assert_eq!(row[1 + i][k], want);
                }
            }
        }
    }

    #[test]
    fn a_morris_trajectory_moves_one_key_a_fixed_step_at_a_time() {
        let (d, n, levels) = (4, 10, 4);
        let pts = unit_points(Method::Morris { levels }, d, n, 3).unwrap();
        assert_eq!(pts.len(), n * (d + 1));
        let delta = f64::from(levels) / (2.0 * f64::from(levels - 1));
        for t in pts.chunks(d + 1) {
            let mut moved = Vec::new();
            for w in t.windows(2) {
                let diff: Vec<usize> = (0..d).filter(|&k| w[0][k] != w[1][k]).collect();
                assert_eq!(diff.len(), 1, "{t:?}");
                assert!(((w[1][diff[0]] - w[0][diff[0]]).abs() - delta).abs() < 1e-12);
                moved.push(diff[0]);
            }
            moved.sort();
            assert_eq!(moved, (0..d).collect::<Vec<_>>());
            assert!(t.iter().flatten().all(|v| (0.0..=1.0).contains(v)));
        }
    }

    #[test]
    fn ranges_parse_whole_or_decimal_and_bad_ones_are_refused() {
        let r = parse_range("providers.home-4090.count=10..60").unwrap();
        assert!(r.integer && r.lo == 10.0 && r.hi == 60.0);
        let r = parse_range("renter_rate=0.5..2.0").unwrap();
        assert!(!r.integer);
        assert_eq!(value(&r, 0.5), "1.25");
        assert_eq!(value(&parse_range("n=10..60").unwrap(), 0.51), "36");
        for bad in ["x", "x=1", "x=2..1", "x=a..b", "=1..2", "x=1..inf"] {
            assert!(parse_range(bad).is_err(), "{bad}");
        }
        assert!(parse_ranges(&["a=1..2".into(), "a=3..4".into()]).is_err());
        assert!(unit_points(Method::Morris { levels: 3 }, 2, 2, 0).is_err());
        assert!(unit_points(Method::Lhs, 2, MAX_POINTS + 1, 0).is_err());
    }

    #[test]
    fn a_points_file_reads_back_and_a_bad_one_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("points.csv");
        let (h, rows) = design(
            Method::Lhs,
            &parse_ranges(&["a=1..9".into(), "b=0.1..0.2".into()]).unwrap(),
            5,
            0,
        )
        .unwrap();
        write_points(&p, &h, &rows).unwrap();
        assert_eq!(read_points(&p).unwrap(), (h, rows));
        std::fs::write(&p, "a,b\n1,2\n3,\n").unwrap();
        let e = read_points(&p).unwrap_err().to_string();
        assert!(e.contains("line 3: no value for b"), "{e}");
        std::fs::write(&p, "a,b\n1,2\n3\n").unwrap();
        assert!(read_points(&p).is_err());
        std::fs::write(&p, "a,a\n1,2\n").unwrap();
        assert!(
            read_points(&p)
                .unwrap_err()
                .to_string()
                .contains("given twice")
        );
        std::fs::write(&p, "a\n").unwrap();
        assert!(
            read_points(&p)
                .unwrap_err()
                .to_string()
                .contains("no points")
        );
    }
}
