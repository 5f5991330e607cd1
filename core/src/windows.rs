//! Maintenance windows: when new requests may be admitted.
//!
//! A window opens each time its crontab `schedule` fires, read in its IANA `timeZone`, and stays
//! open for `duration` (elapsed time). A level (the cluster, or one budget) with windows is open
//! while any of its windows is; a level without windows is always open. Only admissions wait for
//! a window: work in progress goes on when a window closes.
//!
//! Cron parsing and matching is `croner`'s, time zones are `jiff`'s. The time zone database is
//! the copy bundled into the binary (`jiff`'s `tzdb-bundle-always`), not the system's: the
//! operator's image has no `/usr/share/zoneinfo`, and `plan` on a laptop must decide exactly
//! as the operator in the cluster does.

use std::str::FromStr;
use std::sync::LazyLock;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::tz::{TimeZone, TimeZoneDatabase};
use jiff::{SignedDuration, Timestamp, Zoned};
use maintenance_crds::MaintenanceWindow;

/// The bundled IANA database; loaded once, its zones cached by jiff.
static TIME_ZONES: LazyLock<TimeZoneDatabase> = LazyLock::new(TimeZoneDatabase::bundled);

/// A window of the config that cannot be used, and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("maintenanceWindows[{index}].{field} {value:?} {problem}")]
pub struct WindowError {
    pub index: usize,
    pub field: &'static str,
    pub value: String,
    pub problem: String,
}

/// One window, parsed.
#[derive(Debug, Clone)]
pub struct Window {
    /// The recurring part; `None` for an absolute window (open between its bounds).
    recurring: Option<Recurring>,
    not_before: Option<Timestamp>,
    not_after: Option<Timestamp>,
}

#[derive(Debug, Clone)]
struct Recurring {
    schedule: Cron,
    duration: SignedDuration,
    time_zone: TimeZone,
}

/// A schedule fires at least once in this many years or never: crontab has no year field, so
/// any date it names recurs within 28 years (the Gregorian calendar's weekday cycle).
const NEVER_FIRES_SEARCH_START: &str = "2000-01-01T00:00:00Z";

impl Window {
    /// Parses the window at `index` of a `maintenanceWindows` list.
    pub fn parse(index: usize, spec: &MaintenanceWindow) -> Result<Window, WindowError> {
        let error = |field: &'static str, value: &str, problem: String| WindowError {
            index,
            field,
            value: value.to_string(),
            problem,
        };
        let not_before = spec.not_before.as_ref().map(|t| t.0);
        let not_after = spec.not_after.as_ref().map(|t| t.0);
        if let (Some(from), Some(until)) = (not_before, not_after)
            && until <= from
        {
            return Err(error(
                "notAfter",
                &until.to_string(),
                format!("must be after notBefore ({from})"),
            ));
        }
        let recurring = match (&spec.schedule, &spec.duration) {
            (Some(schedule), Some(duration)) => Some(Recurring::parse(
                schedule,
                duration,
                spec.time_zone(),
                &error,
            )?),
            (None, None) if not_before.is_some() && not_after.is_some() => None,
            (Some(_), None) => {
                return Err(error(
                    "duration",
                    "",
                    "is missing: a window with a schedule stays open for a duration, like \"2h\""
                        .to_string(),
                ));
            }
            (None, Some(duration)) => {
                return Err(error(
                    "schedule",
                    "",
                    format!(
                        "is missing: a duration ({duration:?}) counts from each time a schedule fires; \
                         for a single period set notBefore and notAfter instead"
                    ),
                ));
            }
            (None, None) => {
                return Err(error(
                    "schedule",
                    "",
                    "is missing: set schedule and duration (a recurring window), or notBefore \
                     and notAfter (an absolute window)"
                        .to_string(),
                ));
            }
        };
        Ok(Window {
            recurring,
            not_before,
            not_after,
        })
    }

    fn within_bounds(&self, now: Timestamp) -> bool {
        self.not_before.is_none_or(|from| from <= now) && self.not_after.is_none_or(|to| now < to)
    }

    /// Whether the window is open at `now`: within its bounds and, for a recurring window, some
    /// opening `f` has `f <= now < f + duration`.
    pub fn is_open(&self, now: Timestamp) -> bool {
        self.within_bounds(now) && self.recurring.as_ref().is_none_or(|r| r.is_open(now))
    }

    /// The first opening after `now`, in the window's time zone (UTC for an absolute window);
    /// `None` when it never opens again (past `notAfter`, or a schedule that no longer fires
    /// before it).
    pub fn next_opening(&self, now: Timestamp) -> Option<Zoned> {
        let zone = self
            .recurring
            .as_ref()
            .map_or(TimeZone::UTC, |r| r.time_zone.clone());
        let opening = match (&self.recurring, self.not_before) {
            // Before the bounds: open at notBefore if the recurring window is open then.
            (None, Some(from)) if now < from => Some(from),
            (None, _) => None,
            (Some(recurring), Some(from)) if now < from => {
                if recurring.is_open(from) {
                    Some(from)
                } else {
                    recurring.next_opening(from)
                }
            }
            (Some(recurring), _) => recurring.next_opening(now),
        }?;
        self.not_after
            .is_none_or(|to| opening < to)
            .then(|| opening.to_zoned(zone))
    }
}

impl Recurring {
    fn parse(
        schedule_text: &str,
        duration_text: &str,
        zone_name: &str,
        error: &impl Fn(&'static str, &str, String) -> WindowError,
    ) -> Result<Recurring, WindowError> {
        // Five fields, as in a crontab: seconds and years would be a surprise to a person who
        // writes `0 1 * * *`.
        let schedule = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(schedule_text)
            .map_err(|err| {
                error(
                    "schedule",
                    schedule_text,
                    format!(
                        "is not a 5-field crontab expression (minute hour day-of-month month day-of-week, e.g. \"0 1 * * *\"): {err}"
                    ),
                )
            })?;
        let duration = parse_duration(duration_text).ok_or_else(|| {
            error(
                "duration",
                duration_text,
                "must be hours, minutes and seconds longer than zero, like \"2h\", \"90m\" or \"1h30m\""
                    .to_string(),
            )
        })?;
        let time_zone = TIME_ZONES.get(zone_name).map_err(|_| {
            error(
                "timeZone",
                zone_name,
                "is not an IANA time zone name (like \"Europe/Berlin\" or \"UTC\")".to_string(),
            )
        })?;
        let recurring = Recurring {
            schedule,
            duration,
            time_zone,
        };
        // A date that does not exist (the 31st of February) parses but never comes: the window
        // would hold every admission for good with nothing in the config looking wrong.
        let search_start = NEVER_FIRES_SEARCH_START
            .parse::<Timestamp>()
            .unwrap_or(Timestamp::UNIX_EPOCH);
        if recurring.next_opening(search_start).is_none() {
            return Err(error(
                "schedule",
                schedule_text,
                "never fires (no such date in any year): check the day of month against the month"
                    .to_string(),
            ));
        }
        Ok(recurring)
    }

    fn is_open(&self, now: Timestamp) -> bool {
        // The first opening after `now - duration` is the only candidate: any earlier one has
        // closed by `now`.
        let Ok(since) = now.checked_sub(self.duration) else {
            return false;
        };
        self.schedule
            .find_next_occurrence(&since.to_zoned(self.time_zone.clone()), false)
            .is_ok_and(|opening| opening.timestamp() <= now)
    }

    fn next_opening(&self, now: Timestamp) -> Option<Timestamp> {
        self.schedule
            .find_next_occurrence(&now.to_zoned(self.time_zone.clone()), false)
            .ok()
            .map(|opening| opening.timestamp())
    }
}

/// `2h`, `90m`, `1h30m`, `45s` (the CRD's pattern), read by jiff's duration parser.
fn parse_duration(text: &str) -> Option<SignedDuration> {
    let pattern_ok = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, 'h' | 'm' | 's'));
    if !pattern_ok {
        return None;
    }
    SignedDuration::from_str(text)
        .ok()
        .filter(|d| d.is_positive())
}

/// The windows of one level: the cluster's, or one budget's.
#[derive(Debug, Clone, Default)]
pub struct Windows {
    windows: Vec<Window>,
}

/// Whether a level admits now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowState {
    /// No windows are set: always open.
    Unrestricted,
    Open,
    /// Closed until `next_opening` (the earliest of its windows, in that window's time zone);
    /// `None` when no schedule fires again.
    Closed {
        next_opening: Option<Zoned>,
    },
}

impl WindowState {
    pub fn admits(&self) -> bool {
        !matches!(self, WindowState::Closed { .. })
    }
}

impl Windows {
    pub fn parse(specs: &[MaintenanceWindow]) -> Result<Windows, WindowError> {
        let windows = specs
            .iter()
            .enumerate()
            .map(|(index, spec)| Window::parse(index, spec))
            .collect::<Result<_, _>>()?;
        Ok(Windows { windows })
    }

    pub fn state(&self, now: Timestamp) -> WindowState {
        if self.windows.is_empty() {
            return WindowState::Unrestricted;
        }
        if self.windows.iter().any(|w| w.is_open(now)) {
            return WindowState::Open;
        }
        let next_opening = self
            .windows
            .iter()
            .filter_map(|w| w.next_opening(now))
            .min_by_key(Zoned::timestamp);
        WindowState::Closed { next_opening }
    }
}

/// A time as a person reads it in the window's zone: `2026-03-02 01:00 CET (Europe/Berlin)`.
pub fn describe_time(time: &Zoned) -> String {
    let local = time.strftime("%Y-%m-%d %H:%M %Z").to_string();
    match time.time_zone().iana_name() {
        Some(name) if !local.ends_with(name) => format!("{local} ({name})"),
        _ => local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::time;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn window(schedule: &str, duration: &str, time_zone: Option<&str>) -> MaintenanceWindow {
        MaintenanceWindow {
            time_zone: time_zone.map(str::to_string),
            ..MaintenanceWindow::recurring(schedule, duration)
        }
    }

    fn parse(schedule: &str, duration: &str, time_zone: Option<&str>) -> Window {
        Window::parse(0, &window(schedule, duration, time_zone)).expect("valid window")
    }

    #[test]
    fn a_nightly_berlin_window_is_open_from_its_opening_for_its_duration() {
        // 01:00-03:00 in Berlin, which is UTC+1 in January.
        let nightly = parse("0 1 * * *", "2h", Some("Europe/Berlin"));
        assert!(!nightly.is_open(time("2026-01-14T23:59:59Z")));
        assert!(nightly.is_open(time("2026-01-15T00:00:00Z")));
        assert!(nightly.is_open(time("2026-01-15T01:59:59Z")));
        assert!(!nightly.is_open(time("2026-01-15T02:00:00Z")));
        let next = nightly
            .next_opening(time("2026-01-15T02:00:00Z"))
            .expect("fires daily");
        assert_eq!(next.timestamp(), time("2026-01-16T00:00:00Z"));
        assert_eq!(describe_time(&next), "2026-01-16 01:00 CET (Europe/Berlin)");
        // In July Berlin is UTC+2: the same local hour is an hour earlier in UTC.
        assert!(nightly.is_open(time("2026-07-15T23:30:00Z")));
        assert!(!nightly.is_open(time("2026-07-16T01:00:00Z")));
    }

    #[test]
    fn utc_is_the_default_and_not_repeated() {
        let hourly = parse("30 * * * *", "10m", None);
        assert!(hourly.is_open(time("2026-01-15T07:35:00Z")));
        assert!(!hourly.is_open(time("2026-01-15T07:45:00Z")));
        let next = hourly.next_opening(time("2026-01-15T07:45:00Z")).unwrap();
        assert_eq!(describe_time(&next), "2026-01-15 08:30 UTC");
    }

    #[test]
    fn a_window_longer_than_its_period_never_closes() {
        let always = parse("* * * * *", "5m", None);
        for minute in 0..120 {
            assert!(
                always.is_open(time("2026-01-15T07:00:30Z") + SignedDuration::from_mins(minute))
            );
        }
    }

    #[test]
    fn weekdays_and_shorthands_follow_crontab() {
        // 2026-01-17 is a Saturday.
        let weekdays = parse("0 22 * * 1-5", "4h", Some("UTC"));
        assert!(
            weekdays.is_open(time("2026-01-16T23:00:00Z")),
            "Friday night"
        );
        assert!(
            !weekdays.is_open(time("2026-01-17T23:00:00Z")),
            "Saturday night"
        );
        let daily = parse("@daily", "1h", None);
        assert!(daily.is_open(time("2026-01-17T00:30:00Z")));
        assert!(!daily.is_open(time("2026-01-17T01:30:00Z")));
    }

    #[test]
    fn day_of_month_and_day_of_week_are_or_ed_as_in_cron() {
        // The 1st of the month or a Monday: 2026-01-01 is a Thursday, 2026-01-05 a Monday.
        let either = parse("0 3 1 * 1", "1h", None);
        assert!(either.is_open(time("2026-01-01T03:30:00Z")));
        assert!(either.is_open(time("2026-01-05T03:30:00Z")));
        assert!(!either.is_open(time("2026-01-06T03:30:00Z")));
    }

    #[test]
    fn open_is_the_same_as_a_minute_by_minute_look_back() {
        // Independent of `find_next_occurrence`: walk back minute by minute over the duration
        // and ask croner whether each minute matches.
        let specs = [
            ("*/7 3-5 * * *", "25m", "Asia/Kolkata"),
            ("0 4 * * 0", "3h", "America/New_York"),
            ("15 1 1,15 * *", "90m", "Europe/Berlin"),
        ];
        for (schedule, duration, zone) in specs {
            let window = parse(schedule, duration, Some(zone));
            let cron = CronParser::builder()
                .seconds(Seconds::Disallowed)
                .build()
                .parse(schedule)
                .unwrap();
            let tz = TIME_ZONES.get(zone).unwrap();
            let minutes = parse_duration(duration).unwrap().as_mins();
            let mut now = time("2026-03-01T00:00:00Z");
            while now < time("2026-03-20T00:00:00Z") {
                let expected = (0..minutes).any(|back| {
                    let t = now - SignedDuration::from_mins(back);
                    cron.is_time_matching(&t.to_zoned(tz.clone())).unwrap()
                });
                assert_eq!(window.is_open(now), expected, "{schedule} {zone} at {now}");
                now += SignedDuration::from_mins(13);
            }
        }
    }

    #[test]
    fn an_opening_in_a_dst_gap_opens_when_the_gap_ends() {
        // 2026-03-08 02:00 does not exist in New York (02:00 EST -> 03:00 EDT): as with
        // vixie cron, the window opens at 03:00 EDT rather than skipping the night.
        let nightly = parse("0 2 * * *", "1h", Some("America/New_York"));
        let next = nightly.next_opening(time("2026-03-08T06:00:00Z")).unwrap();
        assert_eq!(
            describe_time(&next),
            "2026-03-08 03:00 EDT (America/New_York)"
        );
        assert!(nightly.is_open(time("2026-03-08T07:30:00Z")));
        assert!(!nightly.is_open(time("2026-03-08T08:00:00Z")));
    }

    #[test]
    fn a_level_is_open_when_any_window_is_and_names_the_earliest_opening() {
        let windows = Windows::parse(&[
            window("0 1 * * *", "1h", Some("Europe/Berlin")),
            window("0 12 * * *", "1h", Some("America/New_York")),
        ])
        .unwrap();
        assert_eq!(
            windows.state(time("2026-01-15T00:30:00Z")),
            WindowState::Open
        );
        let WindowState::Closed {
            next_opening: Some(next),
        } = windows.state(time("2026-01-15T03:00:00Z"))
        else {
            panic!("closed with a next opening");
        };
        assert_eq!(
            describe_time(&next),
            "2026-01-15 12:00 EST (America/New_York)"
        );
        assert_eq!(
            Windows::default().state(time("2026-01-15T03:00:00Z")),
            WindowState::Unrestricted
        );
    }

    #[test]
    fn a_schedule_that_never_fires_is_an_error_that_says_so() {
        for never in ["0 0 31 2 *", "0 0 30 2 *", "0 0 31 4,6,9,11 *"] {
            let err = Windows::parse(&[window(never, "1h", None)])
                .expect_err(never)
                .to_string();
            assert!(
                err.starts_with(&format!(
                    "maintenanceWindows[0].schedule {never:?} never fires"
                )),
                "{err}"
            );
        }
        // The 29th of February comes, if rarely.
        let leap =
            Windows::parse(&[window("0 0 29 2 *", "1h", None)]).expect("fires in leap years");
        let WindowState::Closed {
            next_opening: Some(next),
        } = leap.state(time("2026-03-01T00:00:00Z"))
        else {
            panic!("closed until the next leap day");
        };
        assert_eq!(next.timestamp(), time("2028-02-29T00:00:00Z"));
    }

    fn bounded(
        schedule: Option<(&str, &str)>,
        not_before: Option<&str>,
        not_after: Option<&str>,
    ) -> MaintenanceWindow {
        MaintenanceWindow {
            schedule: schedule.map(|(s, _)| s.to_string()),
            duration: schedule.map(|(_, d)| d.to_string()),
            not_before: not_before.map(|t| Time(time(t))),
            not_after: not_after.map(|t| Time(time(t))),
            ..MaintenanceWindow::default()
        }
    }

    #[test]
    fn an_absolute_window_is_open_between_its_bounds_and_never_again() {
        let once = Window::parse(
            0,
            &bounded(
                None,
                Some("2026-12-12T02:00:00Z"),
                Some("2026-12-12T06:00:00Z"),
            ),
        )
        .expect("valid");
        let cases = [
            ("2026-12-12T01:59:59Z", false, Some("2026-12-12T02:00:00Z")),
            ("2026-12-12T02:00:00Z", true, None),
            ("2026-12-12T05:59:59Z", true, None),
            ("2026-12-12T06:00:00Z", false, None),
            ("2027-01-01T00:00:00Z", false, None),
        ];
        for (now, open, next) in cases {
            assert_eq!(once.is_open(time(now)), open, "open at {now}");
            if !open {
                assert_eq!(
                    once.next_opening(time(now)).map(|z| z.timestamp()),
                    next.map(time),
                    "next opening at {now}"
                );
            }
        }
    }

    #[test]
    fn bounds_limit_a_recurring_window_to_their_period() {
        // Nightly 01:00-03:00, only in the week of 2026-12-07.
        let week = Window::parse(
            0,
            &bounded(
                Some(("0 1 * * *", "2h")),
                Some("2026-12-07T00:00:00Z"),
                Some("2026-12-14T02:00:00Z"),
            ),
        )
        .expect("valid");
        let cases = [
            // Before the bounds: the first night's opening.
            ("2026-12-01T01:30:00Z", false, Some("2026-12-07T01:00:00Z")),
            ("2026-12-07T01:30:00Z", true, None),
            ("2026-12-10T12:00:00Z", false, Some("2026-12-11T01:00:00Z")),
            // The last night is cut short by notAfter, and none follows.
            ("2026-12-14T01:59:00Z", true, None),
            ("2026-12-14T02:00:00Z", false, None),
        ];
        for (now, open, next) in cases {
            assert_eq!(week.is_open(time(now)), open, "open at {now}");
            if !open {
                assert_eq!(
                    week.next_opening(time(now)).map(|z| z.timestamp()),
                    next.map(time),
                    "next opening at {now}"
                );
            }
        }
        // notBefore inside a night's window: open from notBefore.
        let mid_night = Window::parse(
            0,
            &bounded(
                Some(("0 1 * * *", "2h")),
                Some("2026-12-07T02:00:00Z"),
                None,
            ),
        )
        .expect("valid");
        assert_eq!(
            mid_night
                .next_opening(time("2026-12-07T00:00:00Z"))
                .map(|z| z.timestamp()),
            Some(time("2026-12-07T02:00:00Z"))
        );
        assert!(mid_night.is_open(time("2026-12-07T02:30:00Z")));
    }

    #[test]
    fn a_window_of_the_wrong_shape_names_the_field() {
        let cases = [
            (
                bounded(None, Some("2026-12-12T02:00:00Z"), None),
                "maintenanceWindows[1].schedule \"\" is missing",
            ),
            (
                MaintenanceWindow {
                    schedule: Some("0 1 * * *".into()),
                    ..MaintenanceWindow::default()
                },
                "maintenanceWindows[1].duration \"\" is missing",
            ),
            (
                bounded(
                    None,
                    Some("2026-12-12T02:00:00Z"),
                    Some("2026-12-12T02:00:00Z"),
                ),
                "maintenanceWindows[1].notAfter \"2026-12-12T02:00:00Z\" must be after notBefore",
            ),
        ];
        for (spec, expected) in cases {
            let err = Window::parse(1, &spec).expect_err(expected).to_string();
            assert!(err.starts_with(expected), "{err}");
        }
    }

    #[test]
    fn durations_are_hours_minutes_and_seconds() {
        for (text, seconds) in [("2h", 7200), ("90m", 5400), ("1h30m", 5400), ("45s", 45)] {
            assert_eq!(
                parse_duration(text),
                Some(SignedDuration::from_secs(seconds)),
                "{text}"
            );
        }
        for bad in ["", "0m", "2 hours", "-1h", "1.5h", "PT2H", "h"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn errors_name_the_field_and_say_what_to_write() {
        let cases = [
            (
                window("0 1 * *", "1h", None),
                "maintenanceWindows[2].schedule \"0 1 * *\"",
            ),
            (
                window("0 0 1 * * *", "1h", None),
                "maintenanceWindows[2].schedule",
            ),
            (
                window("0 1 * * *", "2 hours", None),
                "maintenanceWindows[2].duration",
            ),
            (
                window("0 1 * * *", "1h", Some("Europe/Berln")),
                "maintenanceWindows[2].timeZone \"Europe/Berln\" is not an IANA time zone",
            ),
        ];
        for (spec, expected) in cases {
            let err = Window::parse(2, &spec).expect_err(expected).to_string();
            assert!(err.starts_with(expected), "{err}");
        }
    }

    #[test]
    fn the_bundled_database_answers_without_a_system_copy() {
        // The database is the bundled one, whatever the machine has in /usr/share/zoneinfo:
        // the same answer in the operator's image (which has none) and on a laptop.
        assert!(TIME_ZONES.get("Europe/Berlin").is_ok());
        assert!(TIME_ZONES.get("America/Argentina/Buenos_Aires").is_ok());
        assert!(!TIME_ZONES.is_definitively_empty());
    }
}
