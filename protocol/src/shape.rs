//! The shape check every wire message has ([`Shape`]): counts and string lengths, nothing
//! market-specific; and its small helpers.

/// A message whose counts or string lengths are out of bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {problem}")]
pub struct ShapeError {
    /// The offending field.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

/// Structural bounds of a message: counts and string lengths, nothing market-specific.
pub trait Shape {
    /// Checks the bounds.
    fn check_shape(&self) -> Result<(), ShapeError>;
}

pub(crate) fn max_len(field: &'static str, s: &str, max: usize) -> Result<(), ShapeError> {
    if s.len() > max {
        return Err(ShapeError {
            field,
            problem: format!("{} bytes, at most {max} allowed", s.len()),
        });
    }
    Ok(())
}

pub(crate) fn non_empty(field: &'static str, s: &str) -> Result<(), ShapeError> {
    if s.trim().is_empty() {
        return Err(ShapeError {
            field,
            problem: "must not be empty".into(),
        });
    }
    Ok(())
}

pub(crate) fn max_count(field: &'static str, n: usize, max: usize) -> Result<(), ShapeError> {
    if n > max {
        return Err(ShapeError {
            field,
            problem: format!("{n} entries, at most {max} allowed"),
        });
    }
    Ok(())
}

pub(crate) fn non_zero(field: &'static str, v: u64) -> Result<(), ShapeError> {
    if v == 0 {
        return Err(ShapeError {
            field,
            problem: "must not be zero".into(),
        });
    }
    Ok(())
}
