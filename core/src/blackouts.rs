//! Blackouts: periods in which nothing new is admitted (a change freeze, a holiday), whatever the
//! windows and limits say. Work already admitted goes on, as when a window closes.

use jiff::Timestamp;
use maintenance_crds::Blackout;
use serde::Serialize;

use crate::windows::describe_time;

/// A blackout of the config that cannot be used, and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("blackouts[{index}] {problem}")]
pub struct BlackoutError {
    pub index: usize,
    pub problem: String,
}

/// The blackouts of the config, parsed.
#[derive(Debug, Clone, Default)]
pub struct Blackouts {
    periods: Vec<Period>,
}

#[derive(Debug, Clone)]
struct Period {
    index: usize,
    start: Timestamp,
    end: Timestamp,
    reason: String,
}

/// A blackout in force: what the Pending messages and `plan` say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActiveBlackout {
    /// Its place in `blackouts`, so that a person finds it.
    pub index: usize,
    pub reason: String,
    /// When admission resumes: its end, or later when blackouts overlap or follow one another.
    #[serde(serialize_with = "crate::blackouts::rfc3339")]
    pub until: Timestamp,
}

fn rfc3339<S: serde::Serializer>(at: &Timestamp, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(at)
}

impl ActiveBlackout {
    /// For a request's Pending message.
    pub fn describe(&self) -> String {
        format!(
            "blackout {:?} (blackouts[{}]) holds every admission until {}",
            self.reason,
            self.index,
            describe_time(&self.until.to_zoned(jiff::tz::TimeZone::UTC))
        )
    }
}

impl Blackouts {
    pub fn parse(specs: &[Blackout]) -> Result<Blackouts, BlackoutError> {
        let mut periods = Vec::with_capacity(specs.len());
        for (index, spec) in specs.iter().enumerate() {
            let error = |problem: String| BlackoutError { index, problem };
            let (start, end) = (spec.start.0, spec.end.0);
            if end <= start {
                return Err(error(format!(
                    "ends ({end}) before it starts ({start}): end must be after start"
                )));
            }
            if spec.reason.trim().is_empty() {
                return Err(error(
                    "has no reason: say why, it is shown in every Pending message it holds back"
                        .to_string(),
                ));
            }
            periods.push(Period {
                index,
                start,
                end,
                reason: spec.reason.trim().to_string(),
            });
        }
        Ok(Blackouts { periods })
    }

    /// The blackout in force at `now` (the first listed, when several are), with the time
    /// admission resumes: the end of the run of blackouts that overlap or touch it.
    pub fn active(&self, now: Timestamp) -> Option<ActiveBlackout> {
        let first = self
            .periods
            .iter()
            .find(|p| p.start <= now && now < p.end)?;
        let mut until = first.end;
        // Extend through periods that begin before the run ends; each pass extends or stops.
        loop {
            let extended = self
                .periods
                .iter()
                .filter(|p| p.start <= until && p.end > until)
                .map(|p| p.end)
                .max();
            match extended {
                Some(end) => until = end,
                None => break,
            }
        }
        Some(ActiveBlackout {
            index: first.index,
            reason: first.reason.clone(),
            until,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::time;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn blackout(start: &str, end: &str, reason: &str) -> Blackout {
        Blackout {
            start: Time(time(start)),
            end: Time(time(end)),
            reason: reason.to_string(),
        }
    }

    #[test]
    fn a_blackout_holds_from_its_start_until_its_end() {
        let freeze = Blackouts::parse(&[blackout(
            "2026-11-26T00:00:00Z",
            "2026-11-30T00:00:00Z",
            "Black Friday freeze",
        )])
        .expect("valid");
        let cases = [
            ("2026-11-25T23:59:59Z", false),
            ("2026-11-26T00:00:00Z", true),
            ("2026-11-29T23:59:59Z", true),
            ("2026-11-30T00:00:00Z", false),
        ];
        for (now, held) in cases {
            assert_eq!(freeze.active(time(now)).is_some(), held, "{now}");
        }
        let active = freeze.active(time("2026-11-27T00:00:00Z")).expect("held");
        assert_eq!(
            active.describe(),
            "blackout \"Black Friday freeze\" (blackouts[0]) holds every admission until 2026-11-30 00:00 UTC"
        );
        assert!(
            Blackouts::default()
                .active(time("2026-11-27T00:00:00Z"))
                .is_none()
        );
    }

    #[test]
    fn overlapping_and_touching_blackouts_hold_until_the_last_ends() {
        let blackouts = Blackouts::parse(&[
            blackout("2026-12-20T00:00:00Z", "2026-12-27T00:00:00Z", "holidays"),
            blackout("2026-12-24T00:00:00Z", "2027-01-01T00:00:00Z", "year end"),
            blackout("2027-01-01T00:00:00Z", "2027-01-03T00:00:00Z", "new year"),
            blackout("2027-02-01T00:00:00Z", "2027-02-02T00:00:00Z", "audit"),
        ])
        .expect("valid");
        let active = blackouts
            .active(time("2026-12-21T00:00:00Z"))
            .expect("held");
        assert_eq!(
            (active.index, active.until),
            (0, time("2027-01-03T00:00:00Z"))
        );
        // The first listed one in force names the hold.
        let active = blackouts
            .active(time("2026-12-25T00:00:00Z"))
            .expect("held");
        assert_eq!(active.reason, "holidays");
        let active = blackouts
            .active(time("2026-12-28T00:00:00Z"))
            .expect("held");
        assert_eq!(
            (active.index, active.until),
            (1, time("2027-01-03T00:00:00Z"))
        );
    }

    #[test]
    fn a_blackout_that_ends_before_it_starts_or_says_nothing_is_an_error() {
        let err = Blackouts::parse(&[
            blackout("2026-12-20T00:00:00Z", "2026-12-27T00:00:00Z", "ok"),
            blackout("2026-12-20T00:00:00Z", "2026-12-20T00:00:00Z", "empty"),
        ])
        .expect_err("end not after start")
        .to_string();
        assert!(err.starts_with("blackouts[1] ends"), "{err}");
        assert!(err.ends_with("end must be after start"), "{err}");
        let err = Blackouts::parse(&[blackout(
            "2026-12-20T00:00:00Z",
            "2026-12-27T00:00:00Z",
            " ",
        )])
        .expect_err("no reason")
        .to_string();
        assert!(err.starts_with("blackouts[0] has no reason"), "{err}");
    }
}
