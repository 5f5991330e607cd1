//! Deadlines that protect workloads never fire early.
//!
//! Every phase timer (`drainSpec.timeoutSeconds`, `forceDeleteAfterSeconds`,
//! `waitForPodCompletion.timeoutSeconds`, garbage collection's `maxNodeMaintenanceTimeSeconds`,
//! the missing-node grace) counts from a time recorded on the object. Most such times have whole
//! seconds (a condition's `lastTransitionTime`, a `creationTimestamp`, NVIDIA's RFC 3339
//! annotations): the event happened somewhere within that second, so counting from the second's
//! start fires up to one second early, and with `forceDeleteAfterSeconds: 1` a pod its budget
//! protects could be deleted almost at once. So a whole-second time is read as the end of its
//! second. A time with sub-second digits is our own record (the admission's millisecond
//! annotation) and is the start as it is. A deadline so counted fires up to one second late,
//! never early. Every timer goes through [`deadline`].

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

/// The earliest time a deadline may count from, given the time the object records for its start:
/// the end of its second when it has whole seconds, itself otherwise.
pub fn counted_from(recorded: Timestamp) -> Timestamp {
    if recorded.subsec_nanosecond() == 0 {
        recorded
            .checked_add(SignedDuration::from_secs(1))
            .unwrap_or(Timestamp::MAX)
    } else {
        recorded
    }
}

/// When a deadline of `limit` after the recorded start `recorded` falls due.
pub fn deadline(recorded: Timestamp, limit: Duration) -> Timestamp {
    SignedDuration::try_from(limit)
        .ok()
        .and_then(|limit| counted_from(recorded).checked_add(limit).ok())
        .unwrap_or(Timestamp::MAX)
}

/// Whether the deadline of `limit` after `recorded` has come at `now` (at the deadline itself, so
/// that a timer set for it finds it due).
pub fn is_due(recorded: Timestamp, limit: Duration, now: Timestamp) -> bool {
    now >= deadline(recorded, limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(text: &str) -> Timestamp {
        text.parse().expect("a valid time in the test")
    }

    const MS: SignedDuration = SignedDuration::from_millis(1);

    /// The run: Draining entered at 22:25:54.450, recorded as 22:25:54; with
    /// forceDeleteAfterSeconds 10 the deletion came at 22:26:04.104, before it was due.
    #[test]
    fn a_whole_second_start_counts_from_the_end_of_its_second() {
        let recorded = time("2026-12-06T22:25:54Z");
        let real_start = time("2026-12-06T22:25:54.450Z");
        let due = deadline(recorded, Duration::from_secs(10));
        assert_eq!(due, time("2026-12-06T22:26:05Z"));
        assert!(due >= real_start + SignedDuration::from_secs(10));
        assert!(!is_due(
            recorded,
            Duration::from_secs(10),
            time("2026-12-06T22:26:04.104Z")
        ));
    }

    #[test]
    fn deadlines_fire_at_their_time_and_not_a_millisecond_before() {
        let table = [
            // (recorded start, limit in seconds, when it is due)
            ("2026-12-06T10:00:00Z", 1, "2026-12-06T10:00:02Z"),
            ("2026-12-06T10:00:00Z", 10, "2026-12-06T10:00:11Z"),
            ("2026-12-06T10:00:00Z", 0, "2026-12-06T10:00:01Z"),
            // Our own millisecond record is the start as it is.
            ("2026-12-06T10:00:00.250Z", 1, "2026-12-06T10:00:01.250Z"),
            ("2026-12-06T10:00:00.250Z", 300, "2026-12-06T10:05:00.250Z"),
        ];
        for (recorded, seconds, due) in table {
            let (recorded, due) = (time(recorded), time(due));
            let limit = Duration::from_secs(seconds);
            assert_eq!(deadline(recorded, limit), due, "{recorded} + {seconds}s");
            assert!(!is_due(recorded, limit, due - MS), "1 ms before {due}");
            assert!(is_due(recorded, limit, due), "at {due}");
        }
    }

    #[test]
    fn a_deadline_past_the_end_of_time_never_comes() {
        assert_eq!(
            deadline(Timestamp::MAX, Duration::from_secs(1)),
            Timestamp::MAX
        );
        assert_eq!(
            deadline(Timestamp::UNIX_EPOCH, Duration::MAX),
            Timestamp::MAX
        );
    }
}
