//! Sweeps: parsing `--param key=v1,v2,...` and building the cartesian product of points.
//!
//! Values are TOML (`30`, `"0.20"`, `{ strategy = "fixed", price = "0.30" }`, `[1, 2]`) or
//! bare text for a string field; the list is split at commas outside quotes, braces and
//! brackets, so inline tables and arrays are single values. Empty sweeps are refused: no key,
//! no value, an empty value, a value given twice, the same key in two `--param`s, a key that
//! addresses no field (checked when the points are built).

use crate::output::Point;
use crate::scenario::{Scenario, ScenarioError};

/// One swept key and its values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Axis {
    /// Dotted path (see [`Scenario::set_param`]).
    pub key: String,
    /// Values, each a TOML value or bare text.
    pub values: Vec<String>,
}

/// A `--param` that cannot be swept.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// No `=` or no key.
    #[error("--param {spec:?}: needs key=v1,v2,...")]
    Syntax {
        /// The argument.
        spec: String,
    },
    /// No values, or an empty one.
    #[error("--param {spec:?}: empty value; give at least one non-empty value (key=v1,v2)")]
    Empty {
        /// The argument.
        spec: String,
    },
    /// Quotes or brackets do not close.
    #[error("--param {spec:?}: unbalanced quotes or brackets in the values")]
    Unbalanced {
        /// The argument.
        spec: String,
    },
    /// A value twice in one list (two identical points).
    #[error("--param {key}: value {value} given twice")]
    Duplicate {
        /// The key.
        key: String,
        /// The repeated value.
        value: String,
    },
    /// The same key in two `--param`s.
    #[error("--param {key} given twice; list all its values in one --param")]
    RepeatedKey {
        /// The key.
        key: String,
    },
    /// The key or a value does not fit the scenario.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
}

/// Splits a value list at commas outside quotes, `{}` and `[]`; values are trimmed.
fn split_values(spec: &str, vs: &str) -> Result<Vec<String>, SweepError> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in vs.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' && q == '"' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' => quote = Some(c),
                '{' | '[' => depth += 1,
                '}' | ']' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(cur.trim().to_string());
                    cur.clear();
                    continue;
                }
                _ => {}
            },
        }
        if depth < 0 {
            return Err(SweepError::Unbalanced { spec: spec.into() });
        }
        cur.push(c);
    }
    if quote.is_some() || depth != 0 {
        return Err(SweepError::Unbalanced { spec: spec.into() });
    }
    out.push(cur.trim().to_string());
    Ok(out)
}

/// Parses one `--param key=v1,v2,...`.
pub fn parse_param(spec: &str) -> Result<Axis, SweepError> {
    let (k, vs) = spec
        .split_once('=')
        .ok_or_else(|| SweepError::Syntax { spec: spec.into() })?;
    let key = k.trim();
    if key.is_empty() {
        return Err(SweepError::Syntax { spec: spec.into() });
    }
    let values = split_values(spec, vs)?;
    if values.iter().any(String::is_empty) {
        return Err(SweepError::Empty { spec: spec.into() });
    }
    for (i, v) in values.iter().enumerate() {
        if values[..i].contains(v) {
            return Err(SweepError::Duplicate {
                key: key.into(),
                value: v.clone(),
            });
        }
    }
    Ok(Axis {
        key: key.into(),
        values,
    })
}

/// Parses every `--param`, refusing a key given twice.
pub fn parse_params(specs: &[String]) -> Result<Vec<Axis>, SweepError> {
    let mut axes: Vec<Axis> = Vec::new();
    for spec in specs {
        let axis = parse_param(spec)?;
        if axes.iter().any(|a| a.key == axis.key) {
            return Err(SweepError::RepeatedKey { key: axis.key });
        }
        axes.push(axis);
    }
    Ok(axes)
}

/// The cartesian product of the axes applied to `base`, first axis outermost.
pub fn points(base: &Scenario, axes: &[Axis]) -> Result<Vec<Point>, SweepError> {
    let mut combos: Vec<Vec<(String, String)>> = vec![Vec::new()];
    for a in axes {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                a.values.iter().map(move |v| {
                    let mut c = c.clone();
                    c.push((a.key.clone(), v.clone()));
                    c
                })
            })
            .collect();
    }
    combos.into_iter().map(|p| point(base, p)).collect()
}

/// `base` with `params` applied.
fn point(base: &Scenario, params: Vec<(String, String)>) -> Result<Point, SweepError> {
    let mut scenario = base.clone();
    for (k, v) in &params {
        scenario.set_param(k, v)?;
    }
    Ok(Point { params, scenario })
}

/// The points of a points file (`crate::design`), in its order: each row's values for
/// `keys` applied to `base`.
pub fn points_from_rows(
    base: &Scenario,
    keys: &[String],
    rows: &[Vec<String>],
) -> Result<Vec<Point>, SweepError> {
    rows.iter()
        .map(|row| {
            point(
                base,
                keys.iter().cloned().zip(row.iter().cloned()).collect(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_split_outside_tables_arrays_and_strings() {
        let a = parse_param(
            r#"provider.0.pricing={ strategy = "fixed", price = "0.3" }, { strategy = "fixed", price = "0.5" }"#,
        )
        .unwrap();
        assert_eq!(
            a.values,
            [
                r#"{ strategy = "fixed", price = "0.3" }"#,
                r#"{ strategy = "fixed", price = "0.5" }"#
            ]
        );
        assert_eq!(parse_param("k=[1, 2],3").unwrap().values, ["[1, 2]", "3"]);
        assert_eq!(
            parse_param(r#"k="a,b",'c'"#).unwrap().values,
            [r#""a,b""#, "'c'"]
        );
        assert_eq!(parse_param("k=1, 2").unwrap().values, ["1", "2"]);
    }

    #[test]
    fn empty_and_malformed_sweeps_are_refused() {
        for spec in ["k=", "k=1,,2", "k= ,", "=1", "k"] {
            assert!(parse_param(spec).is_err(), "{spec}");
        }
        assert!(matches!(
            parse_param("k={ a = 1"),
            Err(SweepError::Unbalanced { .. })
        ));
        assert!(matches!(
            parse_param("k=\"1,2"),
            Err(SweepError::Unbalanced { .. })
        ));
        assert!(matches!(
            parse_param("k=1,2,1"),
            Err(SweepError::Duplicate { .. })
        ));
        assert!(matches!(
            parse_params(&["k=1".into(), "k=2".into()]),
            Err(SweepError::RepeatedKey { .. })
        ));
    }
}
