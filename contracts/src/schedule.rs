//! A provider's availability schedule (`gridlease provide --hours 22:00-08:00 --tz Europe/Berlin`):
//! the hours of the day, in the owner's time zone, during which the node offers its GPUs.
//!
//! The rule is [`Schedule::at`]: is the instant `now` inside the schedule, and when does that
//! next change. Windows are wall-clock times in the zone, so they move with daylight saving
//! time: a window starting in a skipped hour (spring forward) opens when the clocks jump past
//! its start, and a window edge in a repeated hour (fall back) is crossed twice; both times
//! count. The zone is a parameter (the caller resolves it from its name or the machine's zone);
//! nothing here reads the clock or the system.

use std::fmt;
use std::str::FromStr;

use gridlease_protocol::Timestamp;
use jiff::tz::TimeZone;

/// Most windows in one schedule.
pub const MAX_WINDOWS: usize = 24;

/// One daily window: from `start` (inclusive) to `end` (exclusive), minutes after local
/// midnight. `end < start` crosses midnight (`22:00-08:00`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Window {
    /// First minute inside, 0..1440.
    pub start_min: u16,
    /// First minute after, 0..1440, never equal to `start_min`.
    pub end_min: u16,
}

impl Window {
    /// Whether local minute-of-day `m` is inside.
    pub fn contains(&self, m: u16) -> bool {
        if self.start_min < self.end_min {
            self.start_min <= m && m < self.end_min
        } else {
            m >= self.start_min || m < self.end_min
        }
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", hhmm(self.start_min), hhmm(self.end_min))
    }
}

/// `HH:MM` of a minute of the day.
pub fn hhmm(m: u16) -> String {
    format!("{:02}:{:02}", m / 60, m % 60)
}

/// The daily windows during which a provider offers its GPUs; none: always.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Schedule {
    windows: Vec<Window>,
}

/// Whether the GPUs are offered at an instant, and until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Availability {
    /// Inside the schedule.
    pub offered: bool,
    /// The next instant at which `offered` flips; `None`: never (always offered, or windows
    /// that cover the whole day).
    pub until: Option<Timestamp>,
}

/// A schedule that does not parse, in words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// Nothing given.
    #[error(
        "no hours given: name windows such as 22:00-08:00 (several separated by commas), or `always`"
    )]
    Empty,
    /// A window that is not `HH:MM-HH:MM`.
    #[error("{window:?} is not a window: write it as HH:MM-HH:MM, e.g. 22:00-08:00")]
    NotAWindow {
        /// The text.
        window: String,
    },
    /// A time that is not `HH:MM` of a day.
    #[error("{time:?} is not a time of day: {why}")]
    BadTime {
        /// The text.
        time: String,
        /// What is wrong.
        why: &'static str,
    },
    /// Start equals end.
    #[error("{window:?} is empty (it starts when it ends); use `always` to offer all day")]
    EmptyWindow {
        /// The text.
        window: String,
    },
    /// Too many windows.
    #[error("{n} windows, at most {MAX_WINDOWS}")]
    TooMany {
        /// How many were given.
        n: usize,
    },
}

fn parse_time(t: &str) -> Result<u16, ScheduleError> {
    let bad = |why| ScheduleError::BadTime {
        time: t.to_string(),
        why,
    };
    let (h, m) = t.split_once(':').ok_or(bad("write it as HH:MM"))?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(h) || h.len() > 2 || !digits(m) || m.len() != 2 {
        return Err(bad("write it as HH:MM"));
    }
    let (h, m): (u16, u16) = (
        h.parse().map_err(|_| bad("write it as HH:MM"))?,
        m.parse().map_err(|_| bad("write it as HH:MM"))?,
    );
    if h > 23 {
        return Err(bad("the hour must be 00 to 23 (midnight is 00:00)"));
    }
    if m > 59 {
        return Err(bad("the minutes must be 00 to 59"));
    }
    Ok(h * 60 + m)
}

impl FromStr for Schedule {
    type Err = ScheduleError;

    /// `always`, or windows `HH:MM-HH:MM` separated by commas (`22:00-08:00,12:00-13:00`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("always") {
            return Ok(Self::always());
        }
        if s.is_empty() {
            return Err(ScheduleError::Empty);
        }
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        if parts.len() > MAX_WINDOWS {
            return Err(ScheduleError::TooMany { n: parts.len() });
        }
        let mut windows = Vec::with_capacity(parts.len());
        for w in parts {
            if w.is_empty() {
                return Err(ScheduleError::Empty);
            }
            let (a, b) = w.split_once('-').ok_or_else(|| ScheduleError::NotAWindow {
                window: w.to_string(),
            })?;
            let (start_min, end_min) = (parse_time(a.trim())?, parse_time(b.trim())?);
            if start_min == end_min {
                return Err(ScheduleError::EmptyWindow {
                    window: w.to_string(),
                });
            }
            windows.push(Window { start_min, end_min });
        }
        Ok(Self { windows })
    }
}

impl fmt::Display for Schedule {
    /// The canonical text ([`Schedule::from_str`] reads it back).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.windows.is_empty() {
            return f.write_str("always");
        }
        for (i, w) in self.windows.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{w}")?;
        }
        Ok(())
    }
}

fn jiff_ts(t: Timestamp) -> jiff::Timestamp {
    let ms = i64::try_from(t.0).unwrap_or(i64::MAX);
    jiff::Timestamp::from_millisecond(ms).unwrap_or(jiff::Timestamp::MAX)
}

fn ms_of(t: jiff::Timestamp) -> Timestamp {
    Timestamp(u64::try_from(t.as_millisecond()).unwrap_or(0))
}

impl Schedule {
    /// Offered all day.
    pub fn always() -> Self {
        Self::default()
    }

    /// True for the schedule that offers all day (no windows).
    pub fn is_always(&self) -> bool {
        self.windows.is_empty()
    }

    /// The windows, as given.
    pub fn windows(&self) -> &[Window] {
        &self.windows
    }

    /// Whether the local time of `t` in `tz` is inside a window.
    fn inside(&self, tz: &TimeZone, t: jiff::Timestamp) -> bool {
        if self.windows.is_empty() {
            return true;
        }
        let dt = tz.to_datetime(t);
        let m =
            u16::try_from(dt.hour()).unwrap_or(0) * 60 + u16::try_from(dt.minute()).unwrap_or(0);
        self.windows.iter().any(|w| w.contains(m))
    }

    /// Whether `now` is inside the schedule in `tz`, and the next instant that changes.
    pub fn at(&self, tz: &TimeZone, now: Timestamp) -> Availability {
        let t = jiff_ts(now);
        let offered = self.inside(tz, t);
        if self.windows.is_empty() {
            return Availability {
                offered,
                until: None,
            };
        }
        // The state only changes where the local time crosses a window edge (each wall-clock
        // edge time of the days around `now`: both instants when the hour repeats) or jumps
        // (the zone's transitions). The first such instant after `now` with the other state is
        // the next change.
        let horizon = t
            .checked_add(jiff::SignedDuration::from_hours(24 * 4))
            .unwrap_or(jiff::Timestamp::MAX);
        let today = tz.to_datetime(t).date();
        let mut candidates: Vec<jiff::Timestamp> = Vec::new();
        for day in -1i64..=3 {
            let Ok(date) = today.checked_add(jiff::Span::new().days(day)) else {
                continue;
            };
            for w in &self.windows {
                for m in [w.start_min, w.end_min] {
                    let (h, mi) = (i8::try_from(m / 60), i8::try_from(m % 60));
                    let (Ok(h), Ok(mi)) = (h, mi) else { continue };
                    let amb = tz.to_ambiguous_timestamp(date.at(h, mi, 0, 0));
                    candidates.extend(amb.earlier().ok());
                    candidates.extend(amb.later().ok());
                }
            }
        }
        candidates.extend(
            tz.following(t)
                .map(|tr| tr.timestamp())
                .take_while(|ts| *ts <= horizon),
        );
        candidates.retain(|c| *c > t && *c <= horizon);
        candidates.sort_unstable();
        candidates.dedup();
        let until = candidates
            .into_iter()
            .find(|c| self.inside(tz, *c) != offered)
            .map(ms_of);
        Availability { offered, until }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    /// Minutes in a day.
    const DAY_MIN: u16 = 24 * 60;

    fn utc(s: &str) -> Timestamp {
        ms_of(s.parse::<jiff::Timestamp>().unwrap())
    }

    fn berlin() -> TimeZone {
        TimeZone::get("Europe/Berlin").unwrap()
    }

    fn sched(s: &str) -> Schedule {
        s.parse().unwrap()
    }

    #[test]
    fn parses_windows_and_says_what_is_wrong() {
        assert_eq!(sched("22:00-08:00").to_string(), "22:00-08:00");
        assert_eq!(
            sched(" 22:00-8:00 , 12:00-13:30").to_string(),
            "22:00-08:00,12:00-13:30"
        );
        assert!(sched("always").is_always());
        assert!(sched("ALWAYS").is_always());
        let err = |s: &str| s.parse::<Schedule>().unwrap_err().to_string();
        assert!(
            err("25:00-08:00").contains("the hour must be 00 to 23"),
            "{}",
            err("25:00-08:00")
        );
        assert!(err("22:60-08:00").contains("minutes must be 00 to 59"));
        assert!(err("10:00-10:00").contains("is empty"));
        assert!(err("").contains("no hours given"));
        assert!(err("22:00-08:00,").contains("no hours given"));
        assert!(err("22:00").contains("not a window"));
        assert!(err("2200-0800").contains("HH:MM"));
        assert!(err("-1:00-08:00").contains("not a"));
        let many = vec!["01:00-02:00"; MAX_WINDOWS + 1].join(",");
        assert!(err(&many).contains("at most 24"));
    }

    #[test]
    fn a_window_across_midnight_in_winter_berlin() {
        let s = sched("22:00-08:00");
        let tz = berlin();
        // 20:59 UTC = 21:59 CET: not offered until 22:00 CET.
        let a = s.at(&tz, utc("2026-01-10T20:59:00Z"));
        assert_eq!(
            a,
            Availability {
                offered: false,
                until: Some(utc("2026-01-10T21:00:00Z"))
            }
        );
        // 22:00 CET sharp: offered until 08:00 CET next morning.
        let b = s.at(&tz, utc("2026-01-10T21:00:00Z"));
        assert_eq!(
            b,
            Availability {
                offered: true,
                until: Some(utc("2026-01-11T07:00:00Z"))
            }
        );
        // 07:59:59.999 CET still inside; 08:00 CET outside until 22:00.
        assert!(s.at(&tz, utc("2026-01-11T06:59:59.999Z")).offered);
        assert_eq!(
            s.at(&tz, utc("2026-01-11T07:00:00Z")),
            Availability {
                offered: false,
                until: Some(utc("2026-01-11T21:00:00Z"))
            }
        );
    }

    #[test]
    fn several_windows_and_summer_time() {
        let s = sched("22:00-08:00,12:00-13:00");
        let tz = berlin();
        // 10:00 UTC = 12:00 CEST.
        assert_eq!(
            s.at(&tz, utc("2026-07-01T09:30:00Z")),
            Availability {
                offered: false,
                until: Some(utc("2026-07-01T10:00:00Z"))
            }
        );
        assert_eq!(
            s.at(&tz, utc("2026-07-01T10:00:00Z")).until,
            Some(utc("2026-07-01T11:00:00Z"))
        );
        assert_eq!(
            s.at(&tz, utc("2026-07-01T11:00:00Z")).until,
            Some(utc("2026-07-01T20:00:00Z"))
        );
    }

    #[test]
    fn a_window_that_starts_in_the_skipped_hour_opens_when_the_clocks_jump() {
        // 2026-03-29: Berlin jumps from 02:00 CET to 03:00 CEST at 01:00 UTC.
        let s = sched("02:30-05:00");
        let tz = berlin();
        assert_eq!(
            s.at(&tz, utc("2026-03-29T00:59:00Z")),
            Availability {
                offered: false,
                until: Some(utc("2026-03-29T01:00:00Z"))
            }
        );
        // 05:00 CEST = 03:00 UTC.
        assert_eq!(
            s.at(&tz, utc("2026-03-29T01:00:00Z")),
            Availability {
                offered: true,
                until: Some(utc("2026-03-29T03:00:00Z"))
            }
        );
        // A night window over the change is one hour shorter in UTC: 22:00 CET to 08:00 CEST.
        let night = sched("22:00-08:00");
        assert_eq!(
            night.at(&tz, utc("2026-03-28T21:00:00Z")).until,
            Some(utc("2026-03-29T06:00:00Z"))
        );
    }

    #[test]
    fn an_edge_in_the_repeated_hour_is_crossed_twice() {
        // 2026-10-25: Berlin goes back from 03:00 CEST to 02:00 CET at 01:00 UTC; 02:00-03:00
        // local happens twice.
        let s = sched("22:00-02:30");
        let tz = berlin();
        // 01:00 CEST: inside until 02:30 CEST (00:30 UTC).
        let a = s.at(&tz, utc("2026-10-24T23:00:00Z"));
        assert_eq!(
            a,
            Availability {
                offered: true,
                until: Some(utc("2026-10-25T00:30:00Z"))
            }
        );
        // 02:30 CEST: out; at 03:00 CEST the clocks go back to 02:00 CET: inside again.
        assert_eq!(
            s.at(&tz, utc("2026-10-25T00:30:00Z")),
            Availability {
                offered: false,
                until: Some(utc("2026-10-25T01:00:00Z"))
            }
        );
        // ... until 02:30 CET (01:30 UTC), then out until 22:00 CET (21:00 UTC).
        assert_eq!(
            s.at(&tz, utc("2026-10-25T01:00:00Z")),
            Availability {
                offered: true,
                until: Some(utc("2026-10-25T01:30:00Z"))
            }
        );
        assert_eq!(
            s.at(&tz, utc("2026-10-25T01:30:00Z")),
            Availability {
                offered: false,
                until: Some(utc("2026-10-25T21:00:00Z"))
            }
        );
    }

    #[test]
    fn always_and_whole_day_schedules_never_change() {
        let tz = berlin();
        let t = utc("2026-05-05T05:05:00Z");
        assert_eq!(
            Schedule::always().at(&tz, t),
            Availability {
                offered: true,
                until: None
            }
        );
        assert_eq!(
            sched("00:00-12:00,12:00-00:00").at(&tz, t),
            Availability {
                offered: true,
                until: None
            }
        );
    }

    fn arb_schedule() -> impl Strategy<Value = Schedule> {
        proptest::collection::vec((0u16..DAY_MIN, 1u16..DAY_MIN), 1..4).prop_map(|ws| Schedule {
            windows: ws
                .into_iter()
                .map(|(s, len)| Window {
                    start_min: s,
                    end_min: (s + len) % DAY_MIN,
                })
                .collect(),
        })
    }

    fn arb_zone() -> impl Strategy<Value = TimeZone> {
        prop_oneof![
            Just(TimeZone::UTC),
            Just(berlin()),
            Just(TimeZone::get("America/New_York").unwrap()),
            Just(TimeZone::get("Australia/Lord_Howe").unwrap()),
            Just(TimeZone::get("Asia/Kolkata").unwrap()),
        ]
    }

    proptest! {
        // 2025-01-01 .. 2028-01-01 in ms: several DST changes of each zone.
        #[test]
        fn the_next_change_flips_the_state_and_nothing_changes_before_it(
            s in arb_schedule(),
            tz in arb_zone(),
            now in 1_735_689_600_000u64..1_830_297_600_000,
            probes in proptest::collection::vec(0u64..1_000_000, 8),
        ) {
            let a = s.at(&tz, Timestamp(now));
            match a.until {
                Some(until) => {
                    prop_assert!(until > Timestamp(now));
                    prop_assert!(until.ms_since(Timestamp(now)) <= 2 * 86_400_000);
                    prop_assert_eq!(s.at(&tz, until).offered, !a.offered);
                    // Constant on [now, until): probes spread over it, and its last ms.
                    let span = until.ms_since(Timestamp(now));
                    for p in probes {
                        let t = Timestamp(now + p * span / 1_000_000);
                        prop_assert_eq!(s.at(&tz, t).offered, a.offered);
                    }
                    prop_assert_eq!(s.at(&tz, Timestamp(until.0 - 1)).offered, a.offered);
                }
                None => {
                    for p in probes {
                        let t = Timestamp(now + p * 172_800);
                        prop_assert_eq!(s.at(&tz, t).offered, a.offered);
                    }
                }
            }
        }

        #[test]
        fn in_utc_offered_is_the_minute_of_the_day_in_a_window(
            s in arb_schedule(),
            now in 0u64..4_000_000_000_000,
        ) {
            let m = u16::try_from((now / 60_000) % 1440).unwrap();
            let inside = s.windows().iter().any(|w| w.contains(m));
            prop_assert_eq!(s.at(&TimeZone::UTC, Timestamp(now)).offered, inside);
        }

        #[test]
        fn the_text_form_reads_back(s in arb_schedule()) {
            prop_assert_eq!(s.to_string().parse::<Schedule>().unwrap(), s);
        }
    }
}
