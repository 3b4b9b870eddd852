//! When scheduled work runs: a steady interval or a cron expression (in
//! UTC). A cron expression is checked where the configuration is loaded
//! (check-config, start, SIGHUP): it must fire within a year of that
//! moment, so one that never matches (`0 0 31 2 *`) is refused with its
//! key and line instead of being run at some fallback pace.

use std::time::Duration;

use serde::Deserialize;

use crate::config::{DefragSchedule, DrillSchedule, HumanDuration, MAX_DURATION, SnapshotSchedule};

/// How far ahead a cron expression's next firing may lie at load.
pub const CRON_HORIZON: Duration = Duration::from_secs(366 * 86400);

/// A parsed cron expression, with its text.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    /// The expression.
    pub cron: croner::Cron,
    /// As written.
    pub text: String,
}

impl<'de> Deserialize<'de> for CronSchedule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse::<croner::Cron>()
            .map(|cron| CronSchedule {
                cron,
                text: text.clone(),
            })
            .map_err(|e| serde::de::Error::custom(format!("{text:?}: {e}")))
    }
}

impl CronSchedule {
    /// How long from `now` until it next fires, if it ever does.
    pub fn next_after(&self, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
        let next = self.cron.find_next_occurrence(&now, false).ok()?;
        (next - now).to_std().ok()
    }

    /// Refuses an expression that does not fire within [`CRON_HORIZON`]
    /// of `now`, saying when it would (or that it never does).
    pub fn check(&self, now: chrono::DateTime<chrono::Utc>) -> Result<(), String> {
        match self.next_after(now) {
            Some(next) if next <= CRON_HORIZON => Ok(()),
            Some(next) => Err(format!(
                "{:?} fires next in {} days, more than a year from now: give a schedule that fires at least once a year",
                self.text,
                next.as_secs() / 86400
            )),
            None => Err(format!(
                "{:?} never fires: no date matches it (a day a month does not have, say)",
                self.text
            )),
        }
    }
}

/// When a scheduled task runs: a steady interval or a cron expression.
pub trait Cadence {
    /// The interval, if the schedule is one.
    fn interval(&self) -> Option<HumanDuration>;
    /// The cron expression, if the schedule is one.
    fn cron(&self) -> Option<&CronSchedule>;

    /// How long from now until the next run is due (at most
    /// [`MAX_DURATION`]); `None` when a cron expression has no next firing
    /// (refused at load, so only should the clock jump years ahead).
    fn until_next(&self) -> Option<Duration> {
        match (self.interval(), self.cron()) {
            (Some(interval), _) => Some(interval.0.min(MAX_DURATION)),
            (None, Some(cron)) => cron
                .next_after(chrono::Utc::now())
                .map(|d| d.min(MAX_DURATION)),
            (None, None) => None,
        }
    }
}

impl Cadence for SnapshotSchedule {
    fn interval(&self) -> Option<HumanDuration> {
        self.interval
    }
    fn cron(&self) -> Option<&CronSchedule> {
        self.cron.as_ref()
    }
}

impl Cadence for DefragSchedule {
    fn interval(&self) -> Option<HumanDuration> {
        self.interval
    }
    fn cron(&self) -> Option<&CronSchedule> {
        self.cron.as_ref()
    }
}

impl Cadence for DrillSchedule {
    fn interval(&self) -> Option<HumanDuration> {
        self.interval
    }
    fn cron(&self) -> Option<&CronSchedule> {
        self.cron.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone as _;

    fn cron(text: &str) -> CronSchedule {
        CronSchedule {
            cron: text.parse().unwrap(),
            text: text.into(),
        }
    }

    #[test]
    fn a_cron_that_never_fires_is_refused_and_has_no_next_time() {
        let now = chrono::Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap();
        let never = cron("0 0 31 2 *");
        assert_eq!(never.next_after(now), None);
        let e = never.check(now).unwrap_err();
        assert!(e.contains("never fires"), "{e}");
        // A leap day lies more than a year ahead from March 2026.
        let e = cron("0 0 29 2 *").check(now).unwrap_err();
        assert!(e.contains("more than a year"), "{e}");
        assert!(cron("0 3 * * 0").check(now).is_ok());
        assert!(cron("0 0 1 1 *").check(now).is_ok());
        let next = cron("*/5 * * * *").next_after(now).unwrap();
        assert!(next <= Duration::from_secs(300), "{next:?}");
    }
}
