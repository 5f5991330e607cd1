//! Garbage collection of requests: which ones the supervisor deletes, and when to look again.
//!
//! Two kinds of request are forgotten rather than finished:
//! - one **Ready for longer than `maxNodeMaintenanceTimeSeconds`**, counted from NVIDIA's
//!   `maintenance.nvidia.com/ready-time` annotation, unless annotated
//!   `maintenance.nvidia.com/garbage-collector.ignore: "true"` (NVIDIA's
//!   `internal/controller/garbage_collector_controller.go`). Its deletion runs the usual cleanup:
//!   the node is uncordoned. NVIDIA looks every 5 minutes; we act at the deadline.
//! - one **Pending for a node that does not exist**, once `missing_node_grace` has passed since it
//!   was created. NVIDIA's webhook refuses such a request at creation; with our webhook off (or
//!   the request created while no replica served it) it would otherwise wait forever.
//!
//! Unlike NVIDIA's collector, a `RequestorFailed` request is kept: NVIDIA's API documents that
//! "garbage collection will not occur if this reason is set" (api/v1alpha1/nodemaintenance_types.go)
//! although its collector only looks at the annotation; a failed maintenance keeps its node
//! cordoned until a person or the requestor decides.

use std::time::Duration;

use jiff::Timestamp;
use maintenance_crds::{
    GC_IGNORE_ANNOTATION, NodeMaintenance, Phase, READY_TIME_ANNOTATION, condition_type,
};

use crate::conditions;
use crate::deadline::deadline;

/// The limits garbage collection applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// `maxNodeMaintenanceTimeSeconds`: how long a request may stay Ready.
    pub max_ready: Duration,
    /// How long a Pending request may wait for a node that does not exist.
    pub missing_node_grace: Duration,
}

/// Why a request is collected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// Ready since `since`, longer than `limit`.
    ReadyTooLong { since: Timestamp, limit: Duration },
    /// Pending since `since` for a node that does not exist, longer than `grace`.
    NodeNotFound { since: Timestamp, grace: Duration },
}

impl Cause {
    /// Every value of [`Cause::metric_label`], to export each counter at 0 from the start.
    pub const METRIC_LABELS: [&'static str; 2] = ["ready_too_long", "node_not_found"];

    /// The `cause` label of the collection counter.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Cause::ReadyTooLong { .. } => Self::METRIC_LABELS[0],
            Cause::NodeNotFound { .. } => Self::METRIC_LABELS[1],
        }
    }

    /// The note of the Event on the request, which says what to do next time.
    pub fn describe(&self, request: &NodeMaintenance) -> String {
        match self {
            Cause::ReadyTooLong { since, limit } => format!(
                "deleted by garbage collection: Ready since {since}, longer than \
                 maxNodeMaintenanceTimeSeconds={}; annotate {GC_IGNORE_ANNOTATION}=\"true\" to \
                 keep a request, or raise the limit in the MaintenanceOperatorConfig",
                limit.as_secs()
            ),
            Cause::NodeNotFound { since, grace } => format!(
                "deleted by garbage collection: node {} did not exist for {}s after the request \
                 was created at {since}; create the request for an existing node",
                request.spec.node_name,
                grace.as_secs()
            ),
        }
    }
}

/// What to do with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not a candidate now; look again at `recheck_at` if set.
    Keep {
        recheck_at: Option<Timestamp>,
    },
    Collect(Cause),
}

const KEEP: Verdict = Verdict::Keep { recheck_at: None };

/// The verdict for one request, given whether its node exists (in the operator's cache).
pub fn verdict(
    request: &NodeMaintenance,
    node_exists: bool,
    policy: &Policy,
    now: Timestamp,
) -> Verdict {
    if request.is_deleting() {
        return KEEP;
    }
    match request.phase() {
        Phase::Pending if !node_exists => {
            let Some(created) = request.metadata.creation_timestamp.as_ref().map(|t| t.0) else {
                return KEEP;
            };
            due(created, policy.missing_node_grace, now, |since| {
                Cause::NodeNotFound {
                    since,
                    grace: policy.missing_node_grace,
                }
            })
        }
        Phase::Ready if !ignored(request) => {
            let Some(since) = ready_since(request) else {
                return KEEP;
            };
            due(since, policy.max_ready, now, |since| Cause::ReadyTooLong {
                since,
                limit: policy.max_ready,
            })
        }
        _ => KEEP,
    }
}

/// When the request became Ready: NVIDIA's annotation, or the time the `Ready` condition last
/// turned True when that is later. The annotation is written once; a request that was Ready,
/// failed at the requestor's, was prepared again and is Ready anew must not count from its first
/// Ready, or it would be collected the moment it is usable again.
pub fn ready_since(request: &NodeMaintenance) -> Option<Timestamp> {
    let annotated = conditions::annotation_time(request, READY_TIME_ANNOTATION);
    let condition = request
        .condition(condition_type::READY)
        .filter(|c| c.status == "True")
        .map(|c| c.last_transition_time.0);
    annotated.max(condition)
}

/// `garbage-collector.ignore: "true"`, exactly as NVIDIA compares it.
pub fn ignored(request: &NodeMaintenance) -> bool {
    request
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(GC_IGNORE_ANNOTATION))
        .is_some_and(|v| v == "true")
}

/// When a Pending request for a node that does not exist will be collected, for its message.
pub fn node_not_found_deadline(request: &NodeMaintenance, policy: &Policy) -> Option<Timestamp> {
    let created = request.metadata.creation_timestamp.as_ref()?.0;
    Some(deadline(created, policy.missing_node_grace))
}

/// The Pending message of a request whose node does not exist.
pub fn node_not_found_message(request: &NodeMaintenance, policy: &Policy) -> String {
    let node = &request.spec.node_name;
    match node_not_found_deadline(request, policy) {
        Some(at) => format!(
            "node {node} not found: create the node or fix spec.nodeName; this request is \
             deleted at {at} if the node does not exist by then"
        ),
        None => format!("node {node} not found: create the node or fix spec.nodeName"),
    }
}

/// One pass over all requests: what to delete now, and when the next one falls due.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Sweep<'a> {
    pub collect: Vec<(&'a NodeMaintenance, Cause)>,
    pub next_check: Option<Timestamp>,
}

pub fn sweep<'a>(
    requests: impl IntoIterator<Item = &'a NodeMaintenance>,
    node_exists: impl Fn(&str) -> bool,
    policy: &Policy,
    now: Timestamp,
) -> Sweep<'a> {
    let mut result = Sweep::default();
    for request in requests {
        match verdict(request, node_exists(&request.spec.node_name), policy, now) {
            Verdict::Collect(cause) => result.collect.push((request, cause)),
            Verdict::Keep {
                recheck_at: Some(at),
            } => {
                result.next_check = Some(result.next_check.map_or(at, |t| t.min(at)));
            }
            Verdict::Keep { recheck_at: None } => {}
        }
    }
    result
}

/// Collected once `limit` has passed since `since` (NVIDIA: `timeNow.After(readyTime.Add(max))`,
/// so a limit of 0 collects at once; counted from the end of the recorded second, never early).
/// At the deadline itself, so that waking there collects.
fn due(
    since: Timestamp,
    limit: Duration,
    now: Timestamp,
    cause: impl FnOnce(Timestamp) -> Cause,
) -> Verdict {
    // Never early: a whole-second record counts from the end of its second.
    let at = deadline(since, limit);
    if now >= at {
        Verdict::Collect(cause(since))
    } else {
        Verdict::Keep {
            recheck_at: Some(at),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::fixtures::{self, at};

    const HOUR: Duration = Duration::from_secs(3600);
    const POLICY: Policy = Policy {
        max_ready: HOUR,
        missing_node_grace: Duration::from_secs(300),
    };

    /// A request in `phase` since `at(entered)`.
    fn request(phase: Phase, entered: i64) -> NodeMaintenance {
        fixtures::request("nm")
            .namespace("default")
            .node("node-1")
            .requestor("upgrade")
            .created(at(0))
            .phase(phase, at(entered))
            .build()
    }

    fn annotated(mut nm: NodeMaintenance, key: &str, value: &str) -> NodeMaintenance {
        nm.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        nm
    }

    fn ready_at(seconds: i64) -> NodeMaintenance {
        annotated(
            request(Phase::Ready, seconds),
            READY_TIME_ANNOTATION,
            &conditions::annotation_value(at(seconds)),
        )
    }

    #[test]
    fn a_ready_request_is_collected_after_the_limit_counted_from_ready_time() {
        let nm = ready_at(100);
        assert_eq!(
            verdict(&nm, true, &POLICY, at(3700)),
            Verdict::Keep {
                recheck_at: Some(at(3701))
            }
        );
        assert_eq!(
            verdict(&nm, true, &POLICY, at(3701)),
            Verdict::Collect(Cause::ReadyTooLong {
                since: at(100),
                limit: HOUR
            })
        );
    }

    #[test]
    fn the_annotation_counts_when_later_than_the_condition() {
        // Ready condition at 50 (NVIDIA's status write), annotation written at 100.
        let nm = annotated(
            request(Phase::Ready, 50),
            READY_TIME_ANNOTATION,
            &conditions::annotation_value(at(100)),
        );
        assert_eq!(ready_since(&nm), Some(at(100)));
        assert!(matches!(
            verdict(&nm, true, &POLICY, at(3701)),
            Verdict::Collect(_)
        ));
    }

    #[test]
    fn a_request_ready_again_counts_from_its_latest_ready() {
        // First Ready at 0 (annotated), Ready again at 5000 after a cleared RequestorFailed.
        let nm = annotated(
            request(Phase::Ready, 5000),
            READY_TIME_ANNOTATION,
            &conditions::annotation_value(at(0)),
        );
        assert_eq!(ready_since(&nm), Some(at(5000)));
        assert_eq!(
            verdict(&nm, true, &POLICY, at(5001)),
            Verdict::Keep {
                recheck_at: Some(at(8601))
            }
        );
    }

    #[test]
    fn without_the_annotation_the_ready_condition_counts() {
        let nm = request(Phase::Ready, 100);
        assert_eq!(ready_since(&nm), Some(at(100)));
        let garbled = annotated(
            request(Phase::Ready, 100),
            READY_TIME_ANNOTATION,
            "yesterday",
        );
        assert_eq!(ready_since(&garbled), Some(at(100)));
    }

    #[test]
    fn the_ignore_annotation_spares_a_request_only_when_exactly_true() {
        let nm = annotated(ready_at(0), GC_IGNORE_ANNOTATION, "true");
        assert_eq!(verdict(&nm, true, &POLICY, at(99_999)), KEEP);
        let not_true = annotated(ready_at(0), GC_IGNORE_ANNOTATION, "yes");
        assert!(matches!(
            verdict(&not_true, true, &POLICY, at(99_999)),
            Verdict::Collect(_)
        ));
    }

    #[test]
    fn requestor_failed_and_phases_before_ready_are_never_collected_for_age() {
        for phase in [
            Phase::Scheduled,
            Phase::Cordon,
            Phase::WaitForPodCompletion,
            Phase::Draining,
            Phase::RequestorFailed,
        ] {
            let nm = annotated(
                request(phase, 0),
                READY_TIME_ANNOTATION,
                &conditions::annotation_value(at(0)),
            );
            assert_eq!(verdict(&nm, true, &POLICY, at(99_999)), KEEP, "{phase}");
        }
    }

    #[test]
    fn a_request_being_deleted_is_left_to_its_cleanup() {
        let mut nm = ready_at(0);
        nm.metadata.deletion_timestamp = Some(Time(at(5)));
        assert_eq!(verdict(&nm, true, &POLICY, at(99_999)), KEEP);
    }

    #[test]
    fn a_limit_of_zero_collects_within_the_second_after_ready() {
        let policy = Policy {
            max_ready: Duration::ZERO,
            ..POLICY
        };
        assert!(matches!(
            verdict(&ready_at(10), true, &policy, at(11)),
            Verdict::Collect(_)
        ));
    }

    #[test]
    fn a_pending_request_for_a_missing_node_is_collected_after_the_grace() {
        let nm = request(Phase::Pending, 0);
        assert_eq!(verdict(&nm, true, &POLICY, at(99_999)), KEEP, "node exists");
        assert_eq!(
            verdict(&nm, false, &POLICY, at(300)),
            Verdict::Keep {
                recheck_at: Some(at(301))
            }
        );
        assert_eq!(
            verdict(&nm, false, &POLICY, at(301)),
            Verdict::Collect(Cause::NodeNotFound {
                since: at(0),
                grace: Duration::from_secs(300)
            })
        );
        // Past Pending, a missing node is the lifecycle's business (release), not collection's.
        let scheduled = request(Phase::Scheduled, 0);
        assert_eq!(verdict(&scheduled, false, &POLICY, at(99_999)), KEEP);
    }

    #[test]
    fn the_message_of_a_missing_node_names_the_deadline() {
        let message = node_not_found_message(&request(Phase::Pending, 0), &POLICY);
        assert!(message.contains("node node-1 not found"), "{message}");
        assert!(message.contains(&at(301).to_string()), "{message}");
    }

    #[test]
    fn a_sweep_collects_the_due_and_wakes_at_the_earliest_deadline() {
        let old = ready_at(0);
        let young = ready_at(1000);
        let younger = ready_at(2000);
        let requests = [old.clone(), young, younger];
        let sweep = sweep(&requests, |_| true, &POLICY, at(3601));
        assert_eq!(sweep.collect.len(), 1);
        assert_eq!(sweep.collect[0].0, &old);
        assert_eq!(sweep.next_check, Some(at(4601)));
    }
}
