//! RFC 3339 timestamps as Docker writes them (`2026-11-30T00:05:01.123456789Z`), parsed by
//! [`jiff`].

/// Parses an RFC 3339 UTC or offset timestamp into unix nanoseconds. `None` if malformed.
/// Docker's zero time (`0001-01-01T00:00:00Z`) parses to a negative value.
pub fn parse_rfc3339_ns(s: &str) -> Option<i128> {
    s.parse::<jiff::Timestamp>()
        .ok()
        .map(jiff::Timestamp::as_nanosecond)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_docker_timestamps() {
        assert_eq!(parse_rfc3339_ns("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ns("2026-11-30T00:05:01.123456789Z"),
            Some(1_795_997_101_123_456_789)
        );
        assert_eq!(
            parse_rfc3339_ns("2026-11-30T01:05:01.5+01:00"),
            Some(1_795_997_101_500_000_000)
        );
        assert!(parse_rfc3339_ns("0001-01-01T00:00:00Z").is_some_and(|v| v < 0));
        assert_eq!(parse_rfc3339_ns("garbage"), None);
    }

    /// What the hand-written parser this replaced also read: a lower-case `z`, a space for
    /// the `T`, negative offsets, fewer fraction digits; and what it refused.
    #[test]
    fn parses_offsets_and_fractions_and_refuses_what_has_no_offset() {
        let at = 1_795_997_101_000_000_000;
        assert_eq!(parse_rfc3339_ns("2026-11-30T00:05:01z"), Some(at));
        assert_eq!(parse_rfc3339_ns("2026-11-30 00:05:01Z"), Some(at));
        assert_eq!(parse_rfc3339_ns("2026-11-29T22:35:01-01:30"), Some(at));
        assert_eq!(
            parse_rfc3339_ns("2026-11-30T00:05:01.12Z"),
            Some(at + 120_000_000)
        );
        // Docker's own fraction: nine digits, then an offset rather than `Z`.
        assert_eq!(
            parse_rfc3339_ns("2026-11-30T02:05:01.000000007+02:00"),
            Some(at + 7)
        );
        assert_eq!(parse_rfc3339_ns("2026-11-30T00:05:01"), None, "no offset");
        assert_eq!(
            parse_rfc3339_ns("2026-11-30T00:05:01.Z"),
            None,
            "empty fraction"
        );
        assert_eq!(parse_rfc3339_ns("2026-13-30T00:05:01Z"), None, "month 13");
        assert_eq!(parse_rfc3339_ns(""), None);
    }
}
