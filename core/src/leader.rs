//! Leader election over a coordination.k8s.io Lease, judged the way client-go's leaderelection
//! judges it (k8s.io/client-go/tools/leaderelection, `tryAcquireOrRenew`), so that our replicas and
//! a controller-runtime manager (NVIDIA's operator) can share one Lease.
//!
//! A candidate never compares the holder's `renewTime` with its own clock: clocks of different
//! machines disagree. It remembers when *it* first saw the current record, on its own monotonic
//! clock, and takes the lease only once the record stayed unchanged for the record's lease
//! duration. A holder dated an hour ahead is therefore not immortal, and a live holder dated an
//! hour behind is not dead: only whether the record keeps changing counts.
//!
//! Monotonic instants are `Duration`s since an origin the caller picks (e.g. its start).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

/// The fields of a Lease that client-go's `LeaderElectionRecord` carries. Any difference between
/// two records is a change: a holder that renews changes `renew_time`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseRecord {
    /// Empty when nobody holds the lease (released, or never held).
    pub holder: String,
    pub lease_duration_seconds: Option<i32>,
    pub acquire_time: Option<Timestamp>,
    pub renew_time: Option<Timestamp>,
    pub lease_transitions: Option<i32>,
    pub preferred_holder: Option<String>,
    pub strategy: Option<String>,
}

impl LeaseRecord {
    /// The record a Lease's spec holds (an absent spec is an empty record).
    pub fn from_spec(spec: Option<&LeaseSpec>) -> LeaseRecord {
        let Some(spec) = spec else {
            return LeaseRecord::default();
        };
        LeaseRecord {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            lease_duration_seconds: spec.lease_duration_seconds,
            acquire_time: spec.acquire_time.as_ref().map(|t| t.0),
            renew_time: spec.renew_time.as_ref().map(|t| t.0),
            lease_transitions: spec.lease_transitions,
            preferred_holder: spec.preferred_holder.clone(),
            strategy: spec.strategy.clone(),
        }
    }

    /// The spec to write, in the shape client-go's `LeaderElectionRecordToLeaseSpec` writes: the
    /// holder (even when empty), duration, acquire and renew time and transitions always set.
    pub fn to_spec(&self) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.holder.clone()),
            lease_duration_seconds: self.lease_duration_seconds,
            acquire_time: self.acquire_time.map(MicroTime),
            renew_time: self.renew_time.map(MicroTime),
            lease_transitions: self.lease_transitions,
            preferred_holder: self.preferred_holder.clone(),
            strategy: self.strategy.clone(),
        }
    }
}

/// The record as this process last read it, and since when it has been reading exactly this
/// record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub record: LeaseRecord,
    /// Monotonic instant at which this record was first seen (or written by us).
    pub since: Duration,
}

impl Observation {
    /// What is known after reading `record` at `now`: an unchanged record keeps its age, any
    /// change starts it again.
    pub fn observe(
        previous: Option<Observation>,
        record: LeaseRecord,
        now: Duration,
    ) -> Observation {
        match previous {
            Some(previous) if previous.record == record => previous,
            _ => Observation { record, since: now },
        }
    }
}

/// What a candidate does with the lease it just read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The record names this process: renew it.
    Leading,
    /// Another holder's record changed less than a lease duration ago: wait. If the record is
    /// still the same at the monotonic instant `until`, it may be taken then.
    Follow { holder: String, until: Duration },
    /// Nobody holds the lease, or the holder's record stayed unchanged for a whole lease
    /// duration as this process saw it: take it.
    MayTake,
}

/// Decides what `identity` does with the lease it observed, at monotonic instant `now`.
/// `default_duration` (our own lease duration) applies when the record names no positive
/// duration: client-go reads that as zero and takes at once, but a missing field is no sign
/// that the holder is gone, so we wait as long as our own leases last.
pub fn decide(
    observation: &Observation,
    identity: &str,
    default_duration: Duration,
    now: Duration,
) -> Verdict {
    let record = &observation.record;
    if record.holder.is_empty() {
        return Verdict::MayTake;
    }
    if record.holder == identity {
        return Verdict::Leading;
    }
    let duration = record
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(default_duration, Duration::from_secs);
    let until = observation.since.saturating_add(duration);
    if now < until {
        Verdict::Follow {
            holder: record.holder.clone(),
            until,
        }
    } else {
        Verdict::MayTake
    }
}

/// The record `identity` writes to hold the lease at wall-clock time `now`. Renewing our own
/// record keeps its acquire time and transitions; taking over starts a new term and counts one
/// more transition; a lease that does not exist yet starts at zero transitions (client-go's
/// arithmetic, so both implementations count the same terms).
pub fn claim(
    current: Option<&LeaseRecord>,
    identity: &str,
    lease_duration: Duration,
    now: Timestamp,
) -> LeaseRecord {
    let now = whole_microseconds(now);
    let (acquire_time, lease_transitions) = match current {
        Some(current) if current.holder == identity => (
            current.acquire_time.or(Some(now)),
            current.lease_transitions.or(Some(0)),
        ),
        Some(current) => (
            Some(now),
            Some(current.lease_transitions.unwrap_or(0).saturating_add(1)),
        ),
        None => (Some(now), Some(0)),
    };
    LeaseRecord {
        holder: identity.to_string(),
        lease_duration_seconds: Some(duration_seconds(lease_duration)),
        acquire_time,
        renew_time: Some(now),
        lease_transitions,
        preferred_holder: None,
        strategy: None,
    }
}

/// What a clean shutdown writes over our record (client-go's `release`): no holder and a
/// one-second duration, so any candidate takes over at once; the transitions stay.
pub fn released(current: &LeaseRecord, now: Timestamp) -> LeaseRecord {
    let now = whole_microseconds(now);
    LeaseRecord {
        holder: String::new(),
        lease_duration_seconds: Some(1),
        acquire_time: Some(now),
        renew_time: Some(now),
        lease_transitions: current.lease_transitions,
        preferred_holder: None,
        strategy: None,
    }
}

/// Whole seconds, at least one (the API server refuses zero).
pub fn duration_seconds(duration: Duration) -> i32 {
    i32::try_from(duration.as_secs()).unwrap_or(i32::MAX).max(1)
}

/// The API server keeps microseconds: a record we write compares equal to the one we read back.
fn whole_microseconds(t: Timestamp) -> Timestamp {
    Timestamp::from_microsecond(t.as_microsecond()).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "ours";
    const OTHER: &str = "nvidia-manager_0f3c";
    const DEFAULT: Duration = Duration::from_secs(15);

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn wall(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).expect("valid timestamp")
    }

    /// "Now" on the wall clock of this process; the records' dates are relative to it.
    const WALL_NOW: i64 = 1_750_000_000;

    fn held_by(holder: &str, renewed_at: i64, duration: Option<i32>) -> LeaseRecord {
        LeaseRecord {
            holder: holder.to_string(),
            lease_duration_seconds: duration,
            acquire_time: Some(wall(WALL_NOW - 600)),
            renew_time: Some(wall(renewed_at)),
            lease_transitions: Some(4),
            ..LeaseRecord::default()
        }
    }

    fn seen(record: LeaseRecord, since: f64) -> Observation {
        Observation {
            record,
            since: secs(since),
        }
    }

    #[test]
    fn only_the_observed_age_of_the_record_counts() {
        let hour = 3600;
        let follow = |until: f64| Verdict::Follow {
            holder: OTHER.to_string(),
            until: secs(until),
        };
        // (case, record, first seen at, now, verdict)
        let cases = [
            (
                "renewTime an hour ahead, just seen",
                held_by(OTHER, WALL_NOW + hour, Some(3)),
                10.0,
                10.0,
                follow(13.0),
            ),
            (
                "renewTime an hour ahead, unchanged for less than its duration",
                held_by(OTHER, WALL_NOW + hour, Some(3)),
                10.0,
                12.999,
                follow(13.0),
            ),
            (
                "renewTime an hour ahead, unchanged for its duration",
                held_by(OTHER, WALL_NOW + hour, Some(3)),
                10.0,
                13.0,
                Verdict::MayTake,
            ),
            (
                "renewTime an hour behind, freshly changed",
                held_by(OTHER, WALL_NOW - hour, Some(3)),
                10.0,
                10.5,
                follow(13.0),
            ),
            (
                "renewTime an hour behind, unchanged for its duration",
                held_by(OTHER, WALL_NOW - hour, Some(3)),
                10.0,
                13.5,
                Verdict::MayTake,
            ),
            (
                "renewTime now, unchanged for its duration",
                held_by(OTHER, WALL_NOW, Some(3)),
                10.0,
                13.0,
                Verdict::MayTake,
            ),
            (
                "the record's duration counts, not ours",
                held_by(OTHER, WALL_NOW, Some(40)),
                0.0,
                39.0,
                follow(40.0),
            ),
            (
                "no duration in the record: ours",
                held_by(OTHER, WALL_NOW, None),
                0.0,
                14.0,
                follow(15.0),
            ),
            (
                "a zero duration in the record: ours",
                held_by(OTHER, WALL_NOW, Some(0)),
                0.0,
                14.0,
                follow(15.0),
            ),
            (
                "released (no holder): at once",
                held_by("", WALL_NOW + hour, Some(1)),
                10.0,
                10.0,
                Verdict::MayTake,
            ),
            (
                "our own record: renew, however old",
                held_by(ME, WALL_NOW - hour, Some(3)),
                0.0,
                100.0,
                Verdict::Leading,
            ),
            (
                "our own record dated ahead: renew",
                held_by(ME, WALL_NOW + hour, Some(3)),
                0.0,
                0.0,
                Verdict::Leading,
            ),
        ];
        for (case, record, since, now, want) in cases {
            let got = decide(&seen(record, since), ME, DEFAULT, secs(now));
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn any_change_of_the_record_restarts_its_age() {
        let base = held_by(OTHER, WALL_NOW - 3600, Some(3));
        type Change = fn(&mut LeaseRecord);
        let changes: [(&str, Change); 7] = [
            ("holder", |r| r.holder = "someone-else".into()),
            ("renewTime", |r| {
                r.renew_time = Some(wall(WALL_NOW - 3599));
            }),
            ("renewTime backwards", |r| {
                r.renew_time = Some(wall(WALL_NOW - 7200));
            }),
            ("acquireTime", |r| r.acquire_time = None),
            ("leaseTransitions", |r| r.lease_transitions = Some(5)),
            ("leaseDurationSeconds", |r| {
                r.lease_duration_seconds = Some(4);
            }),
            ("preferredHolder", |r| r.preferred_holder = Some(ME.into())),
        ];
        let first = Observation::observe(None, base.clone(), secs(0.0));
        assert_eq!(first.since, secs(0.0));
        for (field, change) in changes {
            let mut changed = base.clone();
            change(&mut changed);
            let after = Observation::observe(Some(first.clone()), changed, secs(2.9));
            assert_eq!(after.since, secs(2.9), "a change of {field} is a change");
            assert!(
                matches!(
                    decide(&after, ME, DEFAULT, secs(3.5)),
                    Verdict::Follow { .. }
                ),
                "a change of {field} keeps the holder alive"
            );
        }
        // The same record read again keeps its age, and expires on time.
        let again = Observation::observe(Some(first.clone()), base, secs(2.9));
        assert_eq!(again, first);
        assert_eq!(decide(&again, ME, DEFAULT, secs(3.0)), Verdict::MayTake);
    }

    #[test]
    fn a_holder_that_keeps_renewing_is_never_taken() {
        // Renewed every second for a minute, each time dated an hour in the past, and observed
        // every 0.6 s: never takeable while it renews; takeable a duration after the last
        // renewal was seen.
        let mut observed = None;
        for tick in 0..120 {
            let now = f64::from(tick) * 0.6;
            let renewals = (now.floor() as i64).min(60);
            let record = held_by(OTHER, WALL_NOW - 3600 + renewals, Some(3));
            let observation = Observation::observe(observed.take(), record, secs(now));
            let verdict = decide(&observation, ME, DEFAULT, secs(now));
            if now < 63.0 {
                assert!(
                    matches!(verdict, Verdict::Follow { .. }),
                    "taken at {now}s while the holder renews: {verdict:?}"
                );
            }
            if now >= 64.0 {
                assert_eq!(verdict, Verdict::MayTake, "at {now}s");
            }
            observed = Some(observation);
        }
    }

    #[test]
    fn claims_have_the_shape_client_go_writes() {
        let now = wall(WALL_NOW);
        let created = claim(None, ME, DEFAULT, now);
        assert_eq!(
            created,
            LeaseRecord {
                holder: ME.into(),
                lease_duration_seconds: Some(15),
                acquire_time: Some(now),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..LeaseRecord::default()
            }
        );

        let theirs = held_by(OTHER, WALL_NOW + 3600, Some(3));
        let taken = claim(Some(&theirs), ME, DEFAULT, now);
        assert_eq!(taken.holder, ME);
        assert_eq!(
            taken.lease_transitions,
            Some(5),
            "a takeover is a transition"
        );
        assert_eq!(taken.acquire_time, Some(now), "a new term starts now");
        assert_eq!(taken.renew_time, Some(now));
        assert_eq!(taken.lease_duration_seconds, Some(15));

        let later = wall(WALL_NOW + 2);
        let renewed = claim(Some(&taken), ME, DEFAULT, later);
        assert_eq!(renewed.acquire_time, Some(now), "renewing keeps the term");
        assert_eq!(renewed.lease_transitions, Some(5));
        assert_eq!(renewed.renew_time, Some(later));

        let after_release = claim(Some(&released(&renewed, later)), ME, DEFAULT, later);
        assert_eq!(after_release.lease_transitions, Some(6));
    }

    #[test]
    fn a_release_lets_anyone_take_over_at_once() {
        let ours = claim(None, ME, DEFAULT, wall(WALL_NOW));
        let free = released(&ours, wall(WALL_NOW + 5));
        assert_eq!(free.holder, "");
        assert_eq!(free.lease_duration_seconds, Some(1));
        assert_eq!(free.lease_transitions, ours.lease_transitions);
        let observation = Observation::observe(None, free, secs(7.0));
        assert_eq!(
            decide(&observation, OTHER, DEFAULT, secs(7.0)),
            Verdict::MayTake
        );
    }

    #[test]
    fn a_written_record_reads_back_equal() {
        let now = Timestamp::from_nanosecond(1_750_000_000_123_456_789).expect("valid");
        let record = claim(None, ME, DEFAULT, now);
        assert_eq!(
            record.renew_time.map(|t| t.subsec_nanosecond()),
            Some(123_456_000),
            "the API server keeps microseconds"
        );
        let spec = record.to_spec();
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        let json = serde_json::to_value(&spec).expect("serializable");
        let back: LeaseSpec = serde_json::from_value(json).expect("deserializable");
        assert_eq!(LeaseRecord::from_spec(Some(&back)), record);
        // client-go writes an empty holder as "", not as a missing field.
        let free = released(&record, now).to_spec();
        assert_eq!(free.holder_identity.as_deref(), Some(""));
        assert_eq!(LeaseRecord::from_spec(None), LeaseRecord::default());
    }

    #[test]
    fn durations_are_whole_positive_seconds() {
        assert_eq!(duration_seconds(Duration::from_millis(500)), 1);
        assert_eq!(duration_seconds(Duration::from_secs(15)), 15);
        assert_eq!(duration_seconds(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
