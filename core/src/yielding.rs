//! A drain that PodDisruptionBudgets block gives its slot back
//! (`spec.admission.yieldBlockedDrainAfterSeconds`).
//!
//! One node whose pods cannot move must not stop a fleet's rollout: an admitted request whose
//! drain has evicted nothing for the configured period, because budgets refuse, is uncordoned and
//! returned to Pending (the request actor's step: `lifecycle::yielding`), and the scheduler admits
//! it again later, behind the requests that were waiting when it yielded and after a back-off that
//! grows with each yield. Everything the scheduler needs for that is on the object, in the
//! annotations below, so a restarted operator keeps the order and the back-off.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use maintenance_crds::{
    ADMITTED_TIME_ANNOTATION, ADMITTED_UID_ANNOTATION, CORDON_REQUESTED_ANNOTATION, FINALIZER,
    INITIAL_UNSCHEDULABLE_ANNOTATION, NodeMaintenance, READY_TIME_ANNOTATION,
};
use serde_json::{Value, json};

use crate::conditions;
use crate::scheduler::RequestState;

/// How many times the request gave its slot back (a positive integer).
pub const YIELD_COUNT_ANNOTATION: &str = "maintenance.nvidia.com/yield-count";
/// When it last did (RFC 3339): its back-off and its place in the order count from here.
pub const YIELDED_AT_ANNOTATION: &str = "maintenance.nvidia.com/yielded-at";
/// What blocked its drain then (the budgets and the pods), quoted in its Pending message.
pub const YIELD_BLOCKED_BY_ANNOTATION: &str = "maintenance.nvidia.com/yield-blocked-by";

/// The back-off doubles with each yield up to this (or up to the yield period, if longer): long
/// enough that a node whose budget never relents costs a cordon and an uncordon an hour, short
/// enough that it is tried again within a shift once the budget allows.
pub const YIELD_BACKOFF_MAX: Duration = Duration::from_secs(3600);

/// Most characters of the blocker kept in the annotation (a drain of hundreds of pods would
/// otherwise write them all into every message).
pub const BLOCKED_BY_MAX_CHARS: usize = 512;

/// The last yield of a request, as its annotations record it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YieldRecord {
    /// Yields so far, at least 1.
    pub count: u32,
    pub at: Timestamp,
    /// What blocked the drain (budgets and pods), for a person.
    pub blocked_by: String,
}

impl YieldRecord {
    /// The record on `request`; `None` when it never yielded (or the annotations are unreadable:
    /// then it is ordered and admitted as any other request).
    pub fn of(request: &NodeMaintenance) -> Option<YieldRecord> {
        let annotations = request.metadata.annotations.as_ref()?;
        let count = annotations
            .get(YIELD_COUNT_ANNOTATION)?
            .parse::<u32>()
            .ok()
            .filter(|c| *c > 0)?;
        let at = conditions::annotation_time(request, YIELDED_AT_ANNOTATION)?;
        Some(YieldRecord {
            count,
            at,
            blocked_by: annotations
                .get(YIELD_BLOCKED_BY_ANNOTATION)
                .cloned()
                .unwrap_or_default(),
        })
    }

    /// When it may be admitted again, `period` being the config's yield period.
    pub fn readmit_at(&self, period: Duration) -> Timestamp {
        SignedDuration::try_from(backoff(period, self.count))
            .ok()
            .and_then(|d| self.at.checked_add(d).ok())
            .unwrap_or(Timestamp::MAX)
    }

    /// The Pending message while it waits out its back-off.
    pub fn backoff_reason(&self, period: Duration) -> String {
        let blocked = if self.blocked_by.is_empty() {
            "its drain was blocked by PodDisruptionBudgets".to_string()
        } else {
            self.blocked_by.clone()
        };
        // Whole seconds: "about when", for a person.
        format!(
            "gave its slot back at {:.0} (yield {}) after its drain evicted nothing for {}s: {}; \
             may be admitted again at {:.0}",
            self.at,
            self.count,
            period.as_secs(),
            blocked,
            self.readmit_at(period)
        )
    }
}

/// A waiting request's reason for another cause than its back-off, with the yield that made it
/// Pending again (so "why is it Pending again?" keeps its answer).
pub fn with_yield(reason: &str, record: &YieldRecord) -> String {
    let blocked = if record.blocked_by.is_empty() {
        "its drain was blocked by PodDisruptionBudgets".to_string()
    } else {
        record.blocked_by.clone()
    };
    format!(
        "{reason} (it gave its slot back at {:.0}, yield {}: {blocked})",
        record.at, record.count
    )
}

/// The back-off after the `count`th yield: the yield period doubled per yield before it
/// (period, 2×, 4×, ...), capped at [`YIELD_BACKOFF_MAX`] or the period if that is longer.
pub fn backoff(period: Duration, count: u32) -> Duration {
    let cap = YIELD_BACKOFF_MAX.max(period);
    let doublings = count.saturating_sub(1).min(31);
    period.saturating_mul(1u32 << doublings).min(cap)
}

/// The budgets that refused a drain, each with the pods (`namespace/name`) it held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct YieldBlocker {
    /// `namespace/name` of the budget -> the pods it held, sorted.
    pub pods_by_pdb: BTreeMap<String, Vec<String>>,
}

impl YieldBlocker {
    pub fn is_empty(&self) -> bool {
        self.pods_by_pdb.is_empty()
    }

    /// `PodDisruptionBudget app/web refused pods app/web-0, app/web-1`, for each budget, cut to
    /// [`BLOCKED_BY_MAX_CHARS`].
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self
            .pods_by_pdb
            .iter()
            .map(|(pdb, pods)| {
                let noun = if pods.len() == 1 { "pod" } else { "pods" };
                format!(
                    "PodDisruptionBudget {pdb} refused the eviction of {noun} {}",
                    pods.join(", ")
                )
            })
            .collect();
        let text = parts.join("; ");
        match text.char_indices().nth(BLOCKED_BY_MAX_CHARS) {
            Some((cut, _)) => format!("{}…", &text[..cut]),
            None => text,
        }
    }
}

/// The request's metadata patch of a yield, guarded by the resourceVersion the step decided on
/// (it replaces the finalizer list): our finalizer and the admission's annotations go, so it is
/// Pending as if never admitted, and the yield is recorded (`count`, `at`, `blocked_by`).
pub fn yield_patch(
    request: &NodeMaintenance,
    count: u32,
    at: Timestamp,
    blocked_by: &str,
) -> Value {
    let finalizers: Vec<&str> = request
        .metadata
        .finalizers
        .iter()
        .flatten()
        .map(String::as_str)
        .filter(|f| *f != FINALIZER)
        .collect();
    json!({
        "metadata": {
            "resourceVersion": request.metadata.resource_version,
            "finalizers": finalizers,
            "annotations": {
                ADMITTED_UID_ANNOTATION: null,
                ADMITTED_TIME_ANNOTATION: null,
                INITIAL_UNSCHEDULABLE_ANNOTATION: null,
                CORDON_REQUESTED_ANNOTATION: null,
                READY_TIME_ANNOTATION: null,
                YIELD_COUNT_ANNOTATION: count.to_string(),
                YIELDED_AT_ANNOTATION: conditions::admitted_time_value(at),
                YIELD_BLOCKED_BY_ANNOTATION: blocked_by,
            },
            // A Pending request holds no MachineConfigPool (the release looked at it first).
            "labels": { crate::machine_config_pool::POOL_LABEL: null },
        }
    })
}

/// The admission order with the yields applied: a request that yielded goes right behind the
/// last request that was already waiting when it yielded (created before, or yielded before),
/// and keeps ahead of those that came later. `pending` is in the plain order; requests that never
/// yielded keep it among themselves, and yielded ones are placed in the order of their yields.
pub fn order_after_yields(pending: Vec<&RequestState>) -> Vec<&RequestState> {
    let (mut yielded, mut order): (Vec<&RequestState>, Vec<&RequestState>) =
        pending.into_iter().partition(|r| r.yielded.is_some());
    if yielded.is_empty() {
        return order;
    }
    // A stable sort: equal yield times keep the plain order.
    yielded.sort_by_key(|r| r.yielded.as_ref().map(|y| y.at));
    for request in yielded {
        let at = request.yielded.as_ref().map(|y| y.at);
        // A request of unknown age counts as waiting already.
        let behind = order
            .iter()
            .rposition(|r| waiting_since(r).is_none_or(|since| Some(since) <= at))
            .map_or(0, |i| i + 1);
        order.insert(behind, request);
    }
    order
}

/// Since when a request has been waiting, for [`order_after_yields`]: its last yield, or its
/// creation.
fn waiting_since(request: &RequestState) -> Option<Timestamp> {
    match &request.yielded {
        Some(y) => Some(y.at),
        None => request.created,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{at, request};
    use maintenance_crds::Phase;

    fn yielded(name: &str, created: i64, count: u32, at_s: i64) -> RequestState {
        let mut r = RequestState::for_test(name, name, Phase::Pending, created);
        r.yielded = Some(YieldRecord {
            count,
            at: at(at_s),
            blocked_by: String::new(),
        });
        r
    }

    fn names(order: &[&RequestState]) -> Vec<String> {
        order.iter().map(|r| r.name.clone()).collect()
    }

    #[test]
    fn the_back_off_doubles_per_yield_and_is_capped() {
        let five = Duration::from_secs(5);
        let table = [
            (0, 5),
            (1, 5),
            (2, 10),
            (3, 20),
            (4, 40),
            (10, 2560),
            (11, 3600),
            (40, 3600),
            (u32::MAX, 3600),
        ];
        for (count, seconds) in table {
            assert_eq!(
                backoff(five, count),
                Duration::from_secs(seconds),
                "{count}"
            );
        }
        // A period longer than the cap is the back-off, never doubled past itself.
        let two_hours = Duration::from_secs(7200);
        assert_eq!(backoff(two_hours, 1), two_hours);
        assert_eq!(backoff(two_hours, 5), two_hours);
    }

    #[test]
    fn the_record_is_read_from_the_annotations_and_gives_the_readmission_time() {
        let nm = request("a")
            .annotation(YIELD_COUNT_ANNOTATION, "3")
            .annotation(
                YIELDED_AT_ANNOTATION,
                &conditions::admitted_time_value(at(100)),
            )
            .annotation(
                YIELD_BLOCKED_BY_ANNOTATION,
                "PodDisruptionBudget app/web ...",
            )
            .build();
        let record = YieldRecord::of(&nm).expect("a record");
        assert_eq!(record.count, 3);
        assert_eq!(record.at, at(100));
        assert_eq!(record.readmit_at(Duration::from_secs(5)), at(120));
        let reason = record.backoff_reason(Duration::from_secs(5));
        assert!(reason.contains("PodDisruptionBudget app/web"), "{reason}");
        assert!(reason.contains("yield 3"), "{reason}");
        assert!(reason.contains(&format!("{:.0}", at(120))), "{reason}");
        // Unreadable or absent: no record.
        let when = conditions::annotation_value(at(100));
        for (count, time) in [("0", when.as_str()), ("x", when.as_str()), ("1", "soon")] {
            let nm = request("a")
                .annotation(YIELD_COUNT_ANNOTATION, count)
                .annotation(YIELDED_AT_ANNOTATION, time)
                .build();
            assert_eq!(YieldRecord::of(&nm), None, "{count} {time}");
        }
        assert_eq!(YieldRecord::of(&request("a").build()), None);
    }

    #[test]
    fn the_patch_makes_it_look_never_admitted_and_records_the_yield() {
        let nm = request("a")
            .uid("u")
            .version("42")
            .finalizer()
            .annotation(ADMITTED_UID_ANNOTATION, "u")
            .annotation("requestor.example.com/keep", "yes")
            .build();
        let patch = yield_patch(&nm, 2, at(100), "PodDisruptionBudget app/web");
        let meta = &patch["metadata"];
        assert_eq!(meta["resourceVersion"], json!("42"));
        assert_eq!(meta["finalizers"], json!([]));
        let annotations = &meta["annotations"];
        for gone in [
            ADMITTED_UID_ANNOTATION,
            ADMITTED_TIME_ANNOTATION,
            INITIAL_UNSCHEDULABLE_ANNOTATION,
            CORDON_REQUESTED_ANNOTATION,
            READY_TIME_ANNOTATION,
        ] {
            assert_eq!(annotations[gone], Value::Null, "{gone}");
        }
        assert_eq!(annotations[YIELD_COUNT_ANNOTATION], json!("2"));
        assert_eq!(
            annotations[YIELDED_AT_ANNOTATION],
            json!(conditions::admitted_time_value(at(100)))
        );
        assert!(annotations.get("requestor.example.com/keep").is_none());
    }

    #[test]
    fn the_blocker_names_budgets_and_pods_and_is_bounded() {
        let blocker = YieldBlocker {
            pods_by_pdb: BTreeMap::from([
                (
                    "app/web".to_string(),
                    vec!["app/web-0".to_string(), "app/web-1".to_string()],
                ),
                ("db/pg".to_string(), vec!["db/pg-0".to_string()]),
            ]),
        };
        assert_eq!(
            blocker.describe(),
            "PodDisruptionBudget app/web refused the eviction of pods app/web-0, app/web-1; \
             PodDisruptionBudget db/pg refused the eviction of pod db/pg-0"
        );
        let many = YieldBlocker {
            pods_by_pdb: BTreeMap::from([(
                "app/web".to_string(),
                (0..200).map(|i| format!("app/web-{i}")).collect(),
            )]),
        };
        assert_eq!(many.describe().chars().count(), BLOCKED_BY_MAX_CHARS + 1);
    }

    #[test]
    fn a_yielded_request_goes_behind_those_waiting_when_it_yielded() {
        // Plain order: a (oldest), b, c; a yielded at 15, after b (10) was created and before c (20).
        let a = yielded("a", 0, 1, 15);
        let b = RequestState::for_test("b", "b", Phase::Pending, 10);
        let c = RequestState::for_test("c", "c", Phase::Pending, 20);
        assert_eq!(
            names(&order_after_yields(vec![&a, &b, &c])),
            ["b", "a", "c"]
        );
        // Yielded before anyone waited: it keeps its place.
        let early = yielded("a", 0, 1, 5);
        assert_eq!(
            names(&order_after_yields(vec![&early, &b, &c])),
            ["a", "b", "c"]
        );
        // Yielded after everyone came: last.
        let late = yielded("a", 0, 1, 30);
        assert_eq!(
            names(&order_after_yields(vec![&late, &b, &c])),
            ["b", "c", "a"]
        );
        // Two yields: in the order of their yields, each behind what waited then.
        let d = yielded("d", 1, 2, 25);
        assert_eq!(
            names(&order_after_yields(vec![&a, &d, &b, &c])),
            ["b", "a", "c", "d"]
        );
        // Nothing yielded: the plain order, untouched.
        assert_eq!(names(&order_after_yields(vec![&c, &b])), ["c", "b"]);
    }
}
