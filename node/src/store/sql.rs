//! Conversions between the store's Rust values and SQL columns, and SQLite errors mapped to
//! [`StoreError`].

use std::path::Path;

use gridlease_contracts::{Actor, LeaseEvent};

use super::StoreError;

pub(super) fn i64_of(v: u64) -> i64 {
    // Timestamps, sequences and amounts are far below 2^63; saturate rather than wrap.
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn u64_of(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}
pub(super) fn actor_str(a: Actor) -> &'static str {
    match a {
        Actor::Renter => "renter",
        Actor::Provider => "provider",
        Actor::Local => "local",
    }
}

pub(super) fn event_str(e: &LeaseEvent) -> String {
    format!("{e:?}")
}

/// Maps SQLite's "not a database" / "corrupt" codes to [`StoreError::Corrupt`].
pub(super) fn classify(path: &Path, source: rusqlite::Error) -> StoreError {
    use rusqlite::ffi::ErrorCode;
    if let rusqlite::Error::SqliteFailure(f, msg) = &source
        && matches!(f.code, ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt)
    {
        return StoreError::Corrupt {
            path: path.to_path_buf(),
            detail: msg.clone().unwrap_or_else(|| f.to_string()),
        };
    }
    StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    }
}
