//! The wall clock, read only at the edges (network loop, CLI); rules take `now` as a parameter.

use std::time::{SystemTime, UNIX_EPOCH};

use gridlease_protocol::Timestamp;

/// Unix time in milliseconds.
pub fn now() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    Timestamp(u64::try_from(ms).unwrap_or(u64::MAX))
}
