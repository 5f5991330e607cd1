//! Table tests of the lifecycle step: every phase against the events that can meet it (spec
//! edits, RequestorFailed set and cleared, deletion with and without additionalRequestors, the
//! node gone, timeouts, a restart with the state only on the object).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use maintenance_crds::{
    ADMITTED_TIME_ANNOTATION, ADMITTED_UID_ANNOTATION, CORDON_REQUESTED_ANNOTATION, DrainSpec,
    DrainStatus, ForceDeletedPod, INITIAL_UNSCHEDULABLE_ANNOTATION, NodeMaintenance,
    NodeMaintenanceStatus, Phase, READY_TIME_ANNOTATION, WAIT_POD_COMPLETION_START_ANNOTATION,
    WaitForPodCompletionSpec, condition_type,
};

use super::*;
use crate::drain_plan;
use crate::eviction::{DeleteOutcome, EvictionOutcome};
use crate::fixtures::{self, at, bare, created_at, owned_by, pod, terminating, with_phase};

const SCHEDULABLE: NodeView = NodeView::Present {
    unschedulable: false,
};
const CORDONED: NodeView = NodeView::Present {
    unschedulable: true,
};

/// A request in `phase` since `at(0)`, with our finalizer and the node recorded schedulable
/// (the state of a request we admitted and cordoned).
fn request(phase: Phase) -> NodeMaintenance {
    let mut nm = fixtures::request("maintenance")
        .namespace("default")
        .node("node-1")
        .requestor("upgrade")
        .uid("uid-1")
        .version("10")
        .finalizer()
        .phase(phase, at(0))
        .build();
    if phase != Phase::Pending {
        nm = with_initial_state(nm, Some(false));
        nm = with_annotation(nm, ADMITTED_TIME_ANNOTATION, Some(at(0)));
    }
    nm
}

fn with_annotation(mut nm: NodeMaintenance, key: &str, time: Option<Timestamp>) -> NodeMaintenance {
    let annotations = nm.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match time {
        Some(time) => annotations.insert(key.into(), conditions::annotation_value(time)),
        None => annotations.remove(key),
    };
    nm
}

fn with_initial_state(mut nm: NodeMaintenance, unschedulable: Option<bool>) -> NodeMaintenance {
    let annotations = nm.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match unschedulable {
        Some(value) => {
            annotations.insert(INITIAL_UNSCHEDULABLE_ANNOTATION.into(), value.to_string());
        }
        None => {
            annotations.remove(INITIAL_UNSCHEDULABLE_ANNOTATION);
        }
    }
    nm
}

fn deleting(mut nm: NodeMaintenance) -> NodeMaintenance {
    nm.metadata.deletion_timestamp = Some(Time(at(1)));
    nm
}

fn without_finalizer(mut nm: NodeMaintenance) -> NodeMaintenance {
    nm.metadata.finalizers = None;
    nm
}

fn with_additional(mut nm: NodeMaintenance, others: &[&str]) -> NodeMaintenance {
    nm.spec.additional_requestors = Some(others.iter().map(|s| s.to_string()).collect());
    nm
}

fn with_wait(mut nm: NodeMaintenance, timeout_seconds: i32) -> NodeMaintenance {
    nm.spec.wait_for_pod_completion = Some(WaitForPodCompletionSpec {
        pod_selector: None,
        timeout_seconds: Some(timeout_seconds),
    });
    nm
}

fn with_drain(mut nm: NodeMaintenance, timeout_seconds: i32) -> NodeMaintenance {
    nm.spec.drain_spec = Some(DrainSpec {
        timeout_seconds: Some(timeout_seconds),
        ..DrainSpec::default()
    });
    nm
}

fn with_condition(
    mut nm: NodeMaintenance,
    type_: &str,
    status: bool,
    reason: &str,
) -> NodeMaintenance {
    let conditions = &mut nm.status.get_or_insert_with(Default::default).conditions;
    conditions::upsert_condition(conditions, type_, status, reason, "", at(0), None);
    nm
}

fn requestor_failed(nm: NodeMaintenance, failed: bool) -> NodeMaintenance {
    with_condition(nm, condition_type::REQUESTOR_FAILED, failed, "Failed")
}

fn run_with(
    nm: &NodeMaintenance,
    node: NodeView,
    pods: Option<&[Pod]>,
    now: Timestamp,
    ledger: &mut Ledger,
) -> Step {
    run_observing(nm, node, false, pods, now, ledger)
}

/// As [`run_with`], `request_gone` as the actor observed it.
fn run_observing(
    nm: &NodeMaintenance,
    node: NodeView,
    request_gone: bool,
    pods: Option<&[Pod]>,
    now: Timestamp,
    ledger: &mut Ledger,
) -> Step {
    let summaries = BTreeMap::new();
    let operator = OperatorIdentity::new("maintenance-operator", None);
    // As the node actor's watch caches them.
    let pods: Option<Vec<Arc<CachedPod>>> = pods.map(|pods| {
        pods.iter()
            .map(|p| Arc::new(CachedPod::cached(p)))
            .collect()
    });
    let observed = Observed {
        node,
        request_gone,
        pods: pods.as_deref(),
        pdb_summaries: &summaries,
        operator: &operator,
        yield_after: None,
        pool: None,
    };
    step(nm, &observed, now, ledger)
}

fn run(nm: &NodeMaintenance, node: NodeView, pods: Option<&[Pod]>, now: Timestamp) -> Step {
    run_with(nm, node, pods, now, &mut Ledger::default())
}

fn status_writes(step: &Step) -> Vec<&StatusWrite> {
    step.actions
        .iter()
        .filter_map(|a| match a {
            Action::WriteStatus(w) => Some(w),
            _ => None,
        })
        .collect()
}

fn moved_to(step: &Step) -> Option<Phase> {
    step.transition().map(|t| t.to)
}

fn has(step: &Step, wanted: &Action) -> bool {
    step.actions.contains(wanted)
}

fn removes_finalizer(step: &Step) -> bool {
    step.actions
        .iter()
        .any(|a| matches!(a, Action::RemoveFinalizer { .. }))
}

fn evicted(step: &Step) -> Vec<String> {
    step.actions
        .iter()
        .flat_map(|a| match a {
            Action::Evict(orders) => orders.iter().map(|o| o.key.clone()).collect(),
            _ => Vec::new(),
        })
        .collect()
}

fn events(step: &Step) -> Vec<EventReason> {
    step.actions
        .iter()
        .filter_map(|a| match a {
            Action::Event(e) => Some(e.reason),
            _ => None,
        })
        .collect()
}

fn failed_reason(write: &StatusWrite) -> Option<&str> {
    write
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition_type::FAILED)
        .map(|c| c.reason.as_str())
}

fn ready_condition(write: &StatusWrite) -> &Condition {
    write
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition_type::READY)
        .expect("a Ready condition")
}

// ---- deletion ----

/// Deletion in every phase, with and without additionalRequestors: before Ready it cleans up at
/// once; in Ready and RequestorFailed additionalRequestors hold it (NVIDIA's
/// `handleTerminalState`). This is the edge that froze a request deleted while Draining.
#[test]
fn deletion_in_every_phase_with_and_without_additional_requestors() {
    use Phase::*;
    // (phase, additional requestors, expect cleanup now, expect uncordon)
    let table = [
        (Pending, false, true, false),
        (Pending, true, true, false),
        // The Scheduled step cordons before it writes the next phase: a deletion between the two
        // must uncordon.
        (Scheduled, false, true, true),
        (Scheduled, true, true, true),
        (Cordon, false, true, true),
        (Cordon, true, true, true),
        (WaitForPodCompletion, false, true, true),
        (WaitForPodCompletion, true, true, true),
        (Draining, false, true, true),
        (Draining, true, true, true),
        (Ready, false, true, true),
        (Ready, true, false, false),
        (RequestorFailed, false, true, true),
        (RequestorFailed, true, false, false),
    ];
    for (phase, additional, cleanup, uncordon) in table {
        let mut nm = deleting(request(phase));
        if additional {
            nm = with_additional(nm, &["firmware"]);
        }
        let step = run(&nm, CORDONED, None, at(5));
        let case = format!("{phase} additional={additional}: {step:?}");
        assert_eq!(removes_finalizer(&step), cleanup, "{case}");
        assert_eq!(step.finished, cleanup, "{case}");
        assert_eq!(has(&step, &Action::Uncordon), uncordon, "{case}");
        assert!(!step.watch_pods, "{case}");
        if !cleanup {
            let writes = status_writes(&step);
            assert_eq!(writes.len(), 1, "{case}");
            assert!(
                ready_condition(writes[0]).message.contains("firmware"),
                "{case}"
            );
            assert!(writes[0].transition.is_none(), "{case}");
        }
    }
}

#[test]
fn deletion_waiting_for_additional_requestors_writes_its_message_once() {
    let nm = with_additional(deleting(request(Phase::Ready)), &["firmware"]);
    let first = run(&nm, CORDONED, None, at(5));
    let written = status_writes(&first)[0].status.clone();
    let mut again = nm.clone();
    again.status = Some(written);
    assert_eq!(run(&again, CORDONED, None, at(6)), Step::default());
    // The list emptied: cleanup goes ahead.
    let mut released = again.clone();
    released.spec.additional_requestors = Some(Vec::new());
    let step = run(&released, CORDONED, None, at(7));
    assert!(has(&step, &Action::Uncordon) && removes_finalizer(&step));
}

#[test]
fn deletion_uncordons_only_a_node_we_cordoned() {
    // The node was unschedulable before us: leave it so.
    let step = run(
        &with_initial_state(deleting(request(Phase::Draining)), Some(true)),
        CORDONED,
        None,
        at(5),
    );
    assert!(!has(&step, &Action::Uncordon) && removes_finalizer(&step));
    // cordon: false: we never cordoned.
    let mut nm = deleting(request(Phase::Ready));
    nm.spec.cordon = Some(false);
    let step = run(&nm, SCHEDULABLE, None, at(5));
    assert!(!has(&step, &Action::Uncordon) && removes_finalizer(&step));
    assert_eq!(
        step.actions[0],
        Action::UnprotectFromAutoscalers,
        "the autoscaler annotations of a node we did not cordon go before the finalizer"
    );
    // No initial state recorded: we cannot have cordoned.
    let step = run(
        &with_initial_state(deleting(request(Phase::Cordon)), None),
        CORDONED,
        None,
        at(5),
    );
    assert!(!has(&step, &Action::Uncordon) && removes_finalizer(&step));
}

/// Events come after the writes they report: a write that conflicts runs the step again, and an
/// Event sent before it would be sent once per attempt.
#[test]
fn events_follow_the_writes_they_report() {
    let kinds = |step: &Step| -> Vec<&'static str> {
        step.actions
            .iter()
            .map(|a| match a {
                Action::Uncordon => "uncordon",
                Action::RemoveFinalizer { .. } => "finalizer",
                Action::WriteStatus(_) => "status",
                Action::Event(_) => "event",
                _ => "other",
            })
            .collect()
    };
    let deletion = run(&deleting(request(Phase::Draining)), CORDONED, None, at(5));
    assert_eq!(kinds(&deletion), ["uncordon", "finalizer", "event"]);
    let gone = run(&request(Phase::Draining), NodeView::Missing, None, at(5));
    assert_eq!(kinds(&gone), ["status", "finalizer", "event"]);
    let drain = with_drain(request(Phase::Draining), 60);
    let timed_out = run(&drain, CORDONED, Some(&[bare("app", "lonely")]), at(61));
    assert_eq!(kinds(&timed_out), ["status", "event"], "{timed_out:?}");
    let wait = with_wait(request(Phase::WaitForPodCompletion), 60);
    let waited = run(&wait, CORDONED, Some(&[pod("app", "job-1")]), at(61));
    assert_eq!(kinds(&waited), ["status", "event"], "{waited:?}");
}

#[test]
fn deletion_without_our_finalizer_only_stops() {
    let step = run(
        &without_finalizer(deleting(request(Phase::Draining))),
        CORDONED,
        None,
        at(5),
    );
    assert_eq!(
        step,
        Step {
            finished: true,
            ..Step::default()
        }
    );
}

#[test]
fn deletion_forgets_the_drain() {
    let mut ledger = Ledger::default();
    let nm = with_drain(request(Phase::Draining), 0);
    let pods = [pod("app", "web-1")];
    let step = run_with(&nm, CORDONED, Some(&pods), at(2), &mut ledger);
    assert_eq!(evicted(&step), vec!["app/web-1"]);
    let step = run_with(&deleting(nm), CORDONED, Some(&pods), at(3), &mut ledger);
    assert!(evicted(&step).is_empty() && step.finished);
    assert!(ledger.evictions.is_empty());
}

// ---- the node is gone ----

/// A gone node releases its request at once in every phase, deleted or not, even when
/// additionalRequestors would hold a deletion (NVIDIA's `Reconcile` removes the finalizer as soon
/// as the node is not found, before looking at the phase).
#[test]
fn a_gone_node_releases_the_request_in_every_phase() {
    for phase in Phase::ALL {
        for deleted in [false, true] {
            let mut nm = with_additional(with_drain(request(phase), 0), &["firmware"]);
            if deleted {
                nm = deleting(nm);
            }
            let step = run(&nm, NodeView::Missing, None, at(5));
            let case = format!("{phase} deleting={deleted}: {step:?}");
            assert!(removes_finalizer(&step), "{case}");
            assert!(step.finished, "{case}");
            assert!(!has(&step, &Action::Uncordon), "{case}");
            assert!(!has(&step, &Action::Cordon), "{case}");
            assert!(evicted(&step).is_empty(), "{case}");
            assert_eq!(events(&step), vec![EventReason::NodeGone], "{case}");
            assert_eq!(moved_to(&step), None, "the phase stays: {case}");
        }
    }
}

/// Work past Pending needs our finalizer first, or a deletion would skip the uncordon: an object
/// that reached a later phase without it (another tool wrote the phase) gets it before anything
/// else happens.
#[test]
fn work_past_pending_adds_our_finalizer_first() {
    for phase in Phase::ALL {
        let nm = without_finalizer(with_initial_state(request(phase), None));
        let step = run(&nm, SCHEDULABLE, Some(&[]), at(5));
        let adds = step.actions.first() == Some(&Action::AddFinalizer);
        assert_eq!(adds, phase != Phase::Pending, "{phase}: {step:?}");
        let with_ours = run(&request(phase), SCHEDULABLE, Some(&[]), at(5));
        assert!(!has(&with_ours, &Action::AddFinalizer), "{phase}");
    }
}

#[test]
fn a_released_request_needs_no_actor() {
    let nm = without_finalizer(request(Phase::Draining));
    assert!(!needs_actor(&nm, false, false), "gone node, finalizer off");
    assert!(needs_actor(&nm, true, false), "in progress on a live node");
    assert!(
        needs_actor(&request(Phase::Draining), false, false),
        "finalizer to remove"
    );
    let pending = without_finalizer(request(Phase::Pending));
    assert!(!needs_actor(&pending, true, false));
    assert!(
        needs_actor(&pending, true, true),
        "admitted, cache not caught up"
    );
    assert!(!needs_actor(
        &deleting(without_finalizer(request(Phase::Ready))),
        true,
        false
    ));
}

#[test]
fn a_write_is_shown_once_the_cache_reaches_its_version() {
    let mut nm = request(Phase::Pending);
    nm.metadata.resource_version = Some("10".into());
    assert!(!shows_version(&nm, "11"), "the cache is behind our write");
    assert!(shows_version(&nm, "10"));
    assert!(shows_version(&nm, "9"), "and past it");
    // Numbers compare as numbers, not text ("9" < "10").
    nm.metadata.resource_version = Some("9".into());
    assert!(!shows_version(&nm, "10"));
    // A version that is not a number never holds anything back.
    assert!(shows_version(&nm, "abc"));
}

// ---- the happy path, phase by phase ----

/// The admission records the initial state; the Scheduled step then cordons and writes the phase
/// after the cordon, with no Cordon phase of its own (a status write and an Event fewer).
#[test]
fn scheduled_cordons_and_moves_on_in_one_write() {
    let nm = request(Phase::Scheduled);
    assert!(!needs_fresh_node(&nm));
    let step = run(&nm, SCHEDULABLE, None, at(1));
    assert_eq!(step.actions[0], Action::Cordon);
    assert_eq!(moved_to(&step), Some(Phase::Ready));
    assert_eq!(status_writes(&step).len(), 1);
    let step = run(&with_drain(nm.clone(), 0), SCHEDULABLE, None, at(1));
    assert!(has(&step, &Action::Cordon));
    assert_eq!(moved_to(&step), Some(Phase::Draining));
    // The cache may still show the cordon of a request released a moment ago; the admission
    // read the node fresh and found it schedulable: the cordon is written all the same.
    let step = run(&nm, CORDONED, None, at(1));
    assert!(has(&step, &Action::Cordon), "{step:?}");
    // The node was unschedulable before us: no cordon, and none to undo later.
    let step = run(&with_initial_state(nm, Some(true)), CORDONED, None, at(1));
    assert!(!has(&step, &Action::Cordon));
    assert_eq!(moved_to(&step), Some(Phase::Ready));
}

/// An object that reached Scheduled without the initial state (written by another operator, or
/// admitted by an older version of ours) records it from a fresh read before the cordon.
#[test]
fn scheduled_without_an_initial_state_records_it_before_the_cordon() {
    let nm = with_initial_state(request(Phase::Scheduled), None);
    assert!(needs_fresh_node(&nm));
    let step = run(&nm, SCHEDULABLE, None, at(1));
    assert_eq!(
        step.actions[..2],
        [
            Action::RecordInitialState {
                unschedulable: false
            },
            Action::Cordon
        ]
    );
    assert_eq!(moved_to(&step), Some(Phase::Ready));
    let step = run(&nm, CORDONED, None, at(1));
    assert_eq!(
        step.actions[0],
        Action::RecordInitialState {
            unschedulable: true
        }
    );
    assert!(!has(&step, &Action::Cordon));
}

#[test]
fn admission_records_the_admission_time_and_the_fresh_initial_state() {
    let pending = request(Phase::Pending);
    let annotations = admission_annotations(&pending, CORDONED, at(7));
    assert_eq!(
        annotations.get(ADMITTED_TIME_ANNOTATION),
        Some(&"2023-11-14T22:13:27.000Z".to_string())
    );
    assert_eq!(
        annotations.get(ADMITTED_UID_ANNOTATION),
        pending.metadata.uid.as_ref()
    );
    assert_eq!(
        annotations
            .get(INITIAL_UNSCHEDULABLE_ANNOTATION)
            .map(String::as_str),
        Some("true")
    );
    // A node that is gone has no state to record; an initial state already recorded (a request
    // that went back to Pending) is never overwritten.
    assert_eq!(
        annotations
            .get(CORDON_REQUESTED_ANNOTATION)
            .map(String::as_str),
        Some("true")
    );
    assert!(
        !admission_annotations(&pending, NodeView::Missing, at(7))
            .contains_key(INITIAL_UNSCHEDULABLE_ANNOTATION)
    );
    let recorded = with_initial_state(pending.clone(), Some(false));
    assert!(
        !admission_annotations(&recorded, CORDONED, at(7))
            .contains_key(INITIAL_UNSCHEDULABLE_ANNOTATION)
    );
    // cordon: false records nothing about the cordon.
    let mut no_cordon = pending;
    no_cordon.spec.cordon = Some(false);
    assert!(
        !admission_annotations(&no_cordon, SCHEDULABLE, at(7))
            .contains_key(CORDON_REQUESTED_ANNOTATION)
    );
}

/// A request as the admission leaves it: never given a status (admitted in its first round),
/// with our finalizer and the admission's annotations, written at `admitted`.
fn admitted_by_metadata(admitted: Timestamp) -> NodeMaintenance {
    let mut nm = request(Phase::Pending);
    nm.status = None;
    nm.metadata.annotations = Some(admission_annotations(&nm, SCHEDULABLE, admitted));
    nm
}

/// The admission writes no status: its metadata alone makes the request Scheduled, and the
/// Scheduled step cordons and writes Ready, the request's first status write, reporting the
/// time spent in Scheduled from the admission's time (milliseconds).
#[test]
fn a_request_admitted_by_its_metadata_write_is_cordoned_and_made_ready_in_one_step() {
    let admitted = at(7)
        .checked_add(jiff::SignedDuration::from_millis(250))
        .expect("time");
    let nm = admitted_by_metadata(admitted);
    assert_eq!(nm.phase(), Phase::Scheduled);
    assert_eq!(conditions::phase_since(&nm), Some(admitted));
    let now = at(8);
    let step = run(&nm, SCHEDULABLE, None, now);
    assert_eq!(step.actions[0], Action::Cordon);
    let writes = status_writes(&step);
    assert_eq!(writes.len(), 1, "{step:?}");
    assert_eq!(
        writes[0].transition,
        Some(Transition {
            from: Some(Phase::Scheduled),
            to: Phase::Ready,
            message: "no drain requested".into(),
            in_phase_for: Some(Duration::from_millis(750)),
        })
    );
    // A copy of it (another UID) was never admitted: it waits for the scheduler.
    let mut copy = nm;
    copy.metadata.uid = Some("uid-2".into());
    assert_eq!(copy.phase(), Phase::Pending);
    assert!(run(&copy, SCHEDULABLE, None, now).actions.is_empty());
}

/// Deleted after its admission but before any status shows it, the request may already have
/// its cordon: it is undone.
#[test]
fn deleting_a_request_admitted_but_still_shown_pending_uncordons_its_node() {
    for shown_pending in [false, true] {
        let mut nm = admitted_by_metadata(at(7));
        if shown_pending {
            let mut status = NodeMaintenanceStatus::default();
            conditions::set_phase(&mut status.conditions, Phase::Pending, "", at(0), None);
            nm.status = Some(status);
        }
        let step = run(&deleting(nm), SCHEDULABLE, None, at(8));
        assert_eq!(step.actions[0], Action::Uncordon, "{step:?}");
        assert!(removes_finalizer(&step));
    }
}

/// A step that fails on a request only its admission shows Scheduled (a refused cordon, say)
/// writes Scheduled with the error, so the status neither stays blank nor keeps the reason it
/// waited for; shown in any other phase, the status is left to the step.
#[test]
fn a_failed_first_step_after_the_admission_shows_scheduled_with_the_error() {
    let nm = admitted_by_metadata(at(7));
    let write = status_after_failed_step(&nm, "nodes \"node-1\" is forbidden", at(9))
        .expect("a status write");
    // No phase change: the admission reported Scheduled already.
    assert_eq!(write.transition, None);
    let ready = ready_condition(&write);
    assert_eq!(ready.reason, "Scheduled");
    assert!(ready.message.contains("is forbidden"), "{}", ready.message);
    // Once written, a second failure does not write again.
    let mut shown = nm.clone();
    shown.status = Some(write.status);
    assert_eq!(status_after_failed_step(&shown, "again", at(10)), None);
    assert_eq!(
        status_after_failed_step(&request(Phase::Draining), "e", at(9)),
        None
    );
    assert_eq!(
        status_after_failed_step(&request(Phase::Pending), "e", at(9)),
        None
    );
}

/// The admission reports Pending (for a request never shown Pending) and Scheduled, though it
/// writes no status.
#[test]
fn the_admission_reports_pending_first_for_a_new_request_then_scheduled() {
    let mut new = request(Phase::Pending);
    new.status = None;
    let phases = |t: &[Transition]| t.iter().map(|t| (t.from, t.to)).collect::<Vec<_>>();
    assert_eq!(
        phases(&admission_transitions(&new, at(5))),
        [
            (None, Phase::Pending),
            (Some(Phase::Pending), Phase::Scheduled)
        ]
    );
    // Pending since at(0): the time it waited is measured.
    let waited = admission_transitions(&request(Phase::Pending), at(5));
    assert_eq!(phases(&waited), [(Some(Phase::Pending), Phase::Scheduled)]);
    assert_eq!(waited[0].in_phase_for, Some(Duration::from_secs(5)));
}

/// "Never marked Pending" is one test for the admission's transitions and the supervisor's
/// first Pending write: no status, or NVIDIA's uninitialized Ready condition with no reason.
#[test]
fn a_request_with_no_ready_reason_was_never_marked_pending() {
    let mut new = request(Phase::Pending);
    new.status = None;
    assert!(never_marked_pending(&new));
    let mut uninitialized = request(Phase::Pending);
    for condition in &mut uninitialized.status.as_mut().expect("status").conditions {
        condition.reason.clear();
    }
    assert!(never_marked_pending(&uninitialized));
    assert!(!never_marked_pending(&request(Phase::Pending)));
    assert!(!never_marked_pending(&request(Phase::Draining)));
}

/// A 500 (or no answer) may come after the API server stored the admission: such a failure
/// must be read back, never taken as "not admitted" (the e2e_faults run with lost answers
/// admitted a sixth request beside five with maxParallelOperations 5). Refusals and conflicts
/// wrote nothing.
#[test]
fn an_admission_answered_with_a_server_error_or_nothing_may_have_been_applied() {
    for code in [500, 502, 503, 504, 408] {
        assert_eq!(
            admission_failure(Some(code)),
            AdmissionFailure::OutcomeUnknown,
            "{code}"
        );
    }
    assert_eq!(admission_failure(None), AdmissionFailure::OutcomeUnknown);
    for code in [400, 401, 403, 422, 429] {
        assert_eq!(
            admission_failure(Some(code)),
            AdmissionFailure::Refused,
            "{code}"
        );
    }
    for code in [404, 409] {
        assert_eq!(
            admission_failure(Some(code)),
            AdmissionFailure::Stale,
            "{code}"
        );
    }
}

/// Read back, a request past Pending was admitted by the write whose answer was lost; one still
/// at the guarded version was not; one changed by another write, or gone, is stale.
#[test]
fn a_request_read_back_after_a_lost_answer_says_whether_it_was_admitted() {
    let at_version = |mut nm: NodeMaintenance, version: &str| {
        nm.metadata.resource_version = Some(version.to_string());
        nm
    };
    let admitted = at_version(request(Phase::Scheduled), "8");
    assert_eq!(
        admission_read_back(Some("7"), Some(&admitted)),
        AdmissionReadBack::Applied
    );
    // The admission's own write: metadata only, the status still Pending.
    let mut admitted_by_metadata = at_version(request(Phase::Pending), "8");
    admitted_by_metadata
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(ADMITTED_UID_ANNOTATION.to_string(), "uid-1".to_string());
    assert_eq!(
        admission_read_back(Some("7"), Some(&admitted_by_metadata)),
        AdmissionReadBack::Applied
    );
    let untouched = at_version(request(Phase::Pending), "7");
    assert_eq!(
        admission_read_back(Some("7"), Some(&untouched)),
        AdmissionReadBack::NotApplied
    );
    let edited = at_version(request(Phase::Pending), "8");
    assert_eq!(
        admission_read_back(Some("7"), Some(&edited)),
        AdmissionReadBack::Stale
    );
    assert_eq!(
        admission_read_back(Some("7"), None),
        AdmissionReadBack::Stale
    );
    assert_eq!(
        admission_read_back(None, Some(&untouched)),
        AdmissionReadBack::Stale
    );
}

/// The admission's initial state comes from the cache only when the cache shows the node
/// schedulable: a cordon in the cache may be a released request's, not yet uncordoned there, and
/// recorded as the initial state it would never be undone.
#[test]
fn the_admission_trusts_a_schedulable_cached_node_and_reads_a_cordoned_one_again() {
    let node = |unschedulable: Option<bool>| Node {
        spec: Some(NodeSpec {
            unschedulable,
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(admission_node_view(Some(&node(None))), Some(SCHEDULABLE));
    assert_eq!(
        admission_node_view(Some(&node(Some(false)))),
        Some(SCHEDULABLE)
    );
    assert_eq!(admission_node_view(Some(&node(Some(true)))), None);
    assert_eq!(admission_node_view(None), None);
}

/// `spec.cordon` turned off mid-maintenance: the node we cordoned is still uncordoned on
/// deletion. NVIDIA's `handleTerminalState` (internal/controller/nodemaintenance_controller.go)
/// reads `spec.cordon` at deletion and leaves such a node cordoned.
#[test]
fn a_cordon_turned_off_mid_maintenance_is_still_undone_on_deletion() {
    for phase in [Phase::Draining, Phase::Ready, Phase::RequestorFailed] {
        let mut nm = deleting(request(phase));
        nm.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(CORDON_REQUESTED_ANNOTATION.into(), "true".into());
        nm.spec.cordon = Some(false);
        let step = run(&nm, CORDONED, None, at(5));
        assert!(has(&step, &Action::Uncordon), "{phase}: {step:?}");
        assert!(removes_finalizer(&step), "{phase}");
        // The node was unschedulable before us: still left so.
        let step = run(&with_initial_state(nm, Some(true)), CORDONED, None, at(5));
        assert!(!has(&step, &Action::Uncordon), "{phase}: {step:?}");
    }
}

#[test]
fn cordon_cordons_a_schedulable_node_and_picks_the_next_phase() {
    // (wait, drain, cordon spec, initially unschedulable) -> (cordon action, next phase)
    let table = [
        (false, false, true, false, true, Phase::Ready),
        (true, false, true, false, true, Phase::WaitForPodCompletion),
        (false, true, true, false, true, Phase::Draining),
        (true, true, true, false, true, Phase::WaitForPodCompletion),
        (false, true, true, true, false, Phase::Draining),
        (false, true, false, false, false, Phase::Draining),
    ];
    for (wait, drain, cordon, initially, expect_cordon, next) in table {
        let mut nm = with_initial_state(request(Phase::Cordon), Some(initially));
        nm.spec.cordon = Some(cordon);
        if wait {
            nm = with_wait(nm, 0);
        }
        if drain {
            nm = with_drain(nm, 0);
        }
        let step = run(&nm, SCHEDULABLE, None, at(1));
        let case = format!("{wait} {drain} {cordon} {initially}: {step:?}");
        assert_eq!(has(&step, &Action::Cordon), expect_cordon, "{case}");
        // A node we do not cordon is kept from the autoscalers by a write of its own.
        assert_eq!(
            has(&step, &Action::ProtectFromAutoscalers),
            !expect_cordon,
            "{case}"
        );
        assert_eq!(moved_to(&step), Some(next), "{case}");
    }
}

/// A node we do not cordon is still kept from the autoscalers (`cordon: false`, or cordoned
/// before us), from the admission to the release; a node we cordon gets its annotations with the
/// cordon, and a Pending request never wrote any.
#[test]
fn a_node_we_do_not_cordon_is_protected_and_given_back_at_the_release() {
    let mut not_cordoned = with_initial_state(request(Phase::Scheduled), Some(false));
    not_cordoned.spec.cordon = Some(false);
    let cordoned_before = with_initial_state(request(Phase::Scheduled), Some(true));
    for nm in [&not_cordoned, &cordoned_before] {
        let step = run(nm, SCHEDULABLE, None, at(1));
        assert!(has(&step, &Action::ProtectFromAutoscalers), "{step:?}");
        assert!(!has(&step, &Action::Cordon), "{step:?}");
        let mut ready = nm.clone();
        ready.status = request(Phase::Ready).status;
        let step = run(&deleting(ready), SCHEDULABLE, None, at(5));
        assert_eq!(
            step.actions[0],
            Action::UnprotectFromAutoscalers,
            "{step:?}"
        );
        assert!(removes_finalizer(&step));
    }
    let ours = with_initial_state(request(Phase::Scheduled), Some(false));
    let step = run(&ours, SCHEDULABLE, None, at(1));
    assert!(has(&step, &Action::Cordon) && !has(&step, &Action::ProtectFromAutoscalers));
    let step = run(&deleting(request(Phase::Ready)), CORDONED, None, at(5));
    assert!(!has(&step, &Action::UnprotectFromAutoscalers), "{step:?}");
    let mut pending = deleting(request(Phase::Pending));
    pending.spec.cordon = Some(false);
    let step = run(&pending, SCHEDULABLE, None, at(5));
    assert!(!has(&step, &Action::UnprotectFromAutoscalers), "{step:?}");
}

#[test]
fn ready_does_nothing_and_drops_the_pod_watch() {
    let ready = with_annotation(request(Phase::Ready), READY_TIME_ANNOTATION, Some(at(0)));
    let step = run(&ready, CORDONED, None, at(100));
    assert_eq!(step, Step::default());
}

/// NVIDIA's `handleTerminalState` writes `ready-time` once; garbage collection counts from it.
#[test]
fn ready_records_its_ready_time_once() {
    let step = run(&request(Phase::Ready), CORDONED, None, at(100));
    assert_eq!(
        step.actions,
        vec![Action::RecordReadyTime { at: at(0) }],
        "the time the Ready condition turned True, not the time of the step"
    );
    let recorded = with_annotation(request(Phase::Ready), READY_TIME_ANNOTATION, Some(at(0)));
    assert!(run(&recorded, CORDONED, None, at(200)).actions.is_empty());
    // RequestorFailed is never collected, so it needs no ready-time.
    let failed = requestor_failed(request(Phase::RequestorFailed), true);
    assert!(run(&failed, CORDONED, None, at(200)).actions.is_empty());
}

/// Nothing is written between the cordon and the status that shows Ready (the requestor sees
/// Ready one write sooner), and a request released soon after Ready costs no `ready-time` write:
/// the annotation waits until the request has been Ready for READY_TIME_DELAY.
#[test]
fn ready_time_waits_until_the_request_has_stayed_ready() {
    let step = run(&request(Phase::Scheduled), SCHEDULABLE, None, at(4));
    assert_eq!(moved_to(&step), Some(Phase::Ready), "{step:?}");
    assert!(
        !step
            .actions
            .iter()
            .any(|a| matches!(a, Action::RecordReadyTime { .. })),
        "nothing before Ready: {step:?}"
    );
    // Ready since at(0): not yet at 4 s (the step wakes when it is due), then written with the
    // time Ready began.
    let delay = READY_TIME_DELAY.as_secs() as i64;
    let early = run(&request(Phase::Ready), CORDONED, None, at(delay - 1));
    assert!(early.actions.is_empty(), "{early:?}");
    let wake = early.wake_at.expect("a wake-up when the annotation is due");
    assert!(wake >= at(delay) && wake < at(delay + 1), "{wake}");
    let due = run(&request(Phase::Ready), CORDONED, None, at(delay));
    assert_eq!(due.actions, vec![Action::RecordReadyTime { at: at(0) }]);
    // Released before it was due: the deletion runs, no ready-time.
    let released = deleting(request(Phase::Ready));
    let step = run(&released, CORDONED, None, at(1));
    assert!(
        !step
            .actions
            .iter()
            .any(|a| matches!(a, Action::RecordReadyTime { .. })),
        "{step:?}"
    );
}

// ---- adoption of requests NVIDIA's operator left mid-flight ----

/// A request in `phase` written by NVIDIA's controller: its `Ready` condition's
/// `lastTransitionTime` is the first Pending (at(0)), since NVIDIA moves it only when the status
/// changes; it has NVIDIA's finalizer (the same as ours) and, once cordoned, the initial state.
fn nvidia_request(phase: Phase) -> NodeMaintenance {
    with_annotation(request(phase), ADMITTED_TIME_ANNOTATION, None)
}

#[test]
fn a_request_left_mid_flight_by_nvidia_is_adopted_before_anything_else() {
    for phase in [
        Phase::Scheduled,
        Phase::Cordon,
        Phase::WaitForPodCompletion,
        Phase::Draining,
        Phase::Ready,
        Phase::RequestorFailed,
    ] {
        let nm = with_drain(with_wait(nvidia_request(phase), 60), 60);
        let pods = [pod("app", "web-1")];
        let step = run(&nm, CORDONED, Some(&pods), at(5000));
        assert_eq!(
            step.actions,
            vec![Action::Adopt { at: at(5000) }],
            "{phase}: no timeout, cordon, eviction or status write before adoption"
        );
        let without_finalizer = without_finalizer(nm.clone());
        let step = run(&without_finalizer, CORDONED, Some(&pods), at(5000));
        assert_eq!(
            step.actions,
            vec![Action::AddFinalizer, Action::Adopt { at: at(5000) }],
            "{phase}"
        );
    }
    // A Pending request is admitted by the supervisor, which writes the annotation itself.
    assert!(
        run(&request(Phase::Pending), SCHEDULABLE, None, at(5000))
            .actions
            .is_empty()
    );
}

#[test]
fn a_request_being_deleted_or_on_a_gone_node_is_cleaned_up_without_adoption() {
    let nm = deleting(nvidia_request(Phase::Draining));
    let step = run(&nm, CORDONED, None, at(5000));
    assert!(
        has(&step, &Action::Uncordon),
        "the uncordon is still owed: {step:?}"
    );
    assert!(removes_finalizer(&step));
    let step = run(
        &nvidia_request(Phase::Draining),
        NodeView::Missing,
        None,
        at(5000),
    );
    assert!(removes_finalizer(&step));
}

/// NVIDIA recorded when its wait started (`wait-pod-completion-start-time`,
/// internal/podcompletion/podcompletion.go): the timeout keeps counting from there.
#[test]
fn an_adopted_wait_counts_from_nvidias_start_time() {
    let nm = with_annotation(
        with_wait(nvidia_request(Phase::WaitForPodCompletion), 600),
        WAIT_POD_COMPLETION_START_ANNOTATION,
        Some(at(1000)),
    );
    let adopted = with_annotation(nm, ADMITTED_TIME_ANNOTATION, Some(at(1500)));
    let pods = [pod("app", "job-1")];
    let step = run(&adopted, CORDONED, Some(&pods), at(1580));
    assert_eq!(
        moved_to(&step),
        None,
        "not timed out from the Pending time at(0)"
    );
    assert_eq!(step.wake_at, Some(after(at(1601), TIMER_SLACK)));
    let step = run(&adopted, CORDONED, Some(&pods), at(1601));
    assert_eq!(
        events(&step),
        vec![EventReason::WaitForPodCompletionTimeout],
        "600 s after NVIDIA's start, not after the adoption"
    );
}

#[test]
fn an_adopted_phase_without_nvidias_record_counts_from_the_adoption() {
    let pods = [pod("app", "job-1")];
    let wait = with_annotation(
        with_wait(nvidia_request(Phase::WaitForPodCompletion), 600),
        ADMITTED_TIME_ANNOTATION,
        Some(at(1500)),
    );
    let step = run(&wait, CORDONED, Some(&pods), at(2080));
    assert_eq!(moved_to(&step), None);
    assert_eq!(step.wake_at, Some(after(at(2101), TIMER_SLACK)));

    let drain = with_annotation(
        with_drain(nvidia_request(Phase::Draining), 300),
        ADMITTED_TIME_ANNOTATION,
        Some(at(1500)),
    );
    let blocked = [bare("app", "lonely")];
    let step = run(&drain, CORDONED, Some(&blocked), at(1800));
    assert!(
        !events(&step).contains(&EventReason::DrainTimeout),
        "the drain timeout counts from the adoption: {step:?}"
    );
    let step = run(&drain, CORDONED, Some(&blocked), at(1801));
    assert!(
        events(&step).contains(&EventReason::DrainTimeout),
        "{step:?}"
    );
}

#[test]
fn a_phase_entered_after_the_adoption_counts_from_its_own_start() {
    // Adopted at 1500 in WaitForPodCompletion, moved to Draining by us at 2000.
    let mut nm = with_annotation(
        with_drain(nvidia_request(Phase::WaitForPodCompletion), 300),
        ADMITTED_TIME_ANNOTATION,
        Some(at(1500)),
    );
    let status = nm.status.as_mut().expect("status");
    conditions::set_phase(&mut status.conditions, Phase::Draining, "", at(2000), None);
    assert_eq!(conditions::phase_since(&nm), Some(at(2000)));
    let blocked = [bare("app", "lonely")];
    let step = run(&nm, CORDONED, Some(&blocked), at(2300));
    assert!(!events(&step).contains(&EventReason::DrainTimeout));
    let step = run(&nm, CORDONED, Some(&blocked), at(2301));
    assert!(events(&step).contains(&EventReason::DrainTimeout));
}

/// NVIDIA cordoned the node (its annotation says it was schedulable before): no second cordon,
/// and the uncordon is still owed at deletion.
#[test]
fn an_adopted_cordon_is_not_repeated_and_the_uncordon_is_still_owed() {
    let nm = with_annotation(
        nvidia_request(Phase::Cordon),
        ADMITTED_TIME_ANNOTATION,
        Some(at(1500)),
    );
    let step = run(&nm, CORDONED, None, at(1500));
    assert!(!has(&step, &Action::Cordon), "{step:?}");
    assert_eq!(moved_to(&step), Some(Phase::Ready));
    // The same object, still schedulable (NVIDIA stopped between annotation and cordon).
    let step = run(&nm, SCHEDULABLE, None, at(1500));
    assert!(has(&step, &Action::Cordon), "{step:?}");
    let step = run(&deleting(nm), CORDONED, None, at(1600));
    assert!(has(&step, &Action::Uncordon), "{step:?}");
}

#[test]
fn pending_is_left_to_the_supervisor() {
    let step = run(&request(Phase::Pending), SCHEDULABLE, None, at(1));
    assert_eq!(step, Step::default());
}

// ---- RequestorFailed ----

#[test]
fn requestor_failed_in_every_phase() {
    for phase in Phase::ALL {
        let nm = requestor_failed(with_drain(request(phase), 0), true);
        let step = run(&nm, CORDONED, Some(&[]), at(3));
        let expected = match phase {
            Phase::Pending | Phase::RequestorFailed => None,
            _ => Some(Phase::RequestorFailed),
        };
        assert_eq!(moved_to(&step), expected, "{phase}: {step:?}");
        assert!(evicted(&step).is_empty(), "{phase}");
        assert!(!step.watch_pods, "{phase}");
    }
}

#[test]
fn requestor_failed_before_cordon_records_the_initial_state_first() {
    let nm = requestor_failed(with_initial_state(request(Phase::Scheduled), None), true);
    let step = run(&nm, SCHEDULABLE, None, at(3));
    assert_eq!(
        step.actions[0],
        Action::RecordInitialState {
            unschedulable: false
        }
    );
    assert_eq!(moved_to(&step), Some(Phase::RequestorFailed));
}

#[test]
fn clearing_requestor_failed_resumes_with_a_correct_cordon() {
    let cleared = requestor_failed(request(Phase::RequestorFailed), false);
    let step = run(&cleared, SCHEDULABLE, None, at(3));
    assert_eq!(moved_to(&step), Some(Phase::Cordon));
    // Then the cordon happens, because the node was schedulable before us.
    let step = run(&request(Phase::Cordon), SCHEDULABLE, None, at(4));
    assert!(has(&step, &Action::Cordon));
    // Without a recorded initial state the preparation starts over from Scheduled.
    let unknown = with_initial_state(cleared, None);
    assert_eq!(
        moved_to(&run(&unknown, SCHEDULABLE, None, at(3))),
        Some(Phase::Scheduled)
    );
}

// ---- spec edits mid-phase ----

#[test]
fn removing_wait_for_pod_completion_moves_on() {
    // The pods are still running: only the removed spec lets it go.
    let pods = [pod("app", "job-1")];
    let nm = request(Phase::WaitForPodCompletion);
    let step = run(&nm, CORDONED, Some(&pods), at(3));
    assert_eq!(moved_to(&step), Some(Phase::Ready));
    let step = run(&with_drain(nm, 0), CORDONED, Some(&pods), at(3));
    assert_eq!(moved_to(&step), Some(Phase::Draining));
    // Present, it waits.
    let waiting = with_wait(request(Phase::WaitForPodCompletion), 0);
    let step = run(&waiting, CORDONED, Some(&pods), at(3));
    assert_eq!(moved_to(&step), None);
    assert_eq!(
        status_writes(&step)[0].status.wait_for_completion,
        vec!["app/job-1"]
    );
}

#[test]
fn removing_drain_spec_mid_drain_moves_to_ready_without_evicting() {
    let mut nm = request(Phase::Draining);
    nm.status.as_mut().expect("status").drain = Some(DrainStatus::default());
    let pods = [pod("app", "web-1")];
    let step = run(&nm, CORDONED, Some(&pods), at(3));
    assert_eq!(moved_to(&step), Some(Phase::Ready));
    assert!(evicted(&step).is_empty());
    assert_eq!(status_writes(&step)[0].status.drain, None);
}

// ---- Failed conditions ----

#[test]
fn a_fixed_invalid_spec_clears_its_failed_condition() {
    let pods = [pod("app", "job-1")];
    let mut broken = with_wait(request(Phase::WaitForPodCompletion), 0);
    if let Some(w) = broken.spec.wait_for_pod_completion.as_mut() {
        w.pod_selector = Some("a in (b".into());
    }
    let step = run(&broken, CORDONED, Some(&pods), at(2));
    assert_eq!(failed_reason(status_writes(&step)[0]), Some("InvalidSpec"));
    assert_eq!(events(&step), vec![EventReason::InvalidSpec]);

    let fixed = with_condition(
        with_wait(request(Phase::WaitForPodCompletion), 0),
        condition_type::FAILED,
        true,
        "InvalidSpec",
    );
    let step = run(&fixed, CORDONED, Some(&pods), at(3));
    assert_eq!(failed_reason(status_writes(&step)[0]), None, "{step:?}");
    // Same in a drain.
    let fixed = with_condition(
        with_drain(request(Phase::Draining), 0),
        condition_type::FAILED,
        true,
        "InvalidSpec",
    );
    let step = run(&fixed, CORDONED, Some(&pods), at(3));
    assert_eq!(failed_reason(status_writes(&step)[0]), None, "{step:?}");
}

#[test]
fn a_finished_wait_leaves_no_failed_condition() {
    let nm = with_condition(
        with_wait(request(Phase::WaitForPodCompletion), 0),
        condition_type::FAILED,
        true,
        "InvalidSpec",
    );
    let done = [with_phase(pod("app", "job-1"), "Succeeded")];
    let step = run(&nm, CORDONED, Some(&done), at(3));
    assert_eq!(moved_to(&step), Some(Phase::Ready));
    assert_eq!(failed_reason(status_writes(&step)[0]), None);
}

#[test]
fn an_earlier_failed_never_hides_a_drain_timeout() {
    let nm = with_condition(
        with_drain(request(Phase::Draining), 10),
        condition_type::FAILED,
        true,
        "InvalidSpec",
    );
    let pods = [pod("app", "web-1")];
    let step = run(&nm, CORDONED, Some(&pods), at(11));
    assert_eq!(failed_reason(status_writes(&step)[0]), Some("DrainTimeout"));
    assert!(events(&step).contains(&EventReason::DrainTimeout));
    // Reported once: the next step does not report it again.
    let mut reported = nm.clone();
    reported.status = Some(status_writes(&step)[0].status.clone());
    let step = run(&reported, CORDONED, Some(&pods), at(12));
    assert!(!events(&step).contains(&EventReason::DrainTimeout));
}

#[test]
fn a_drain_that_finishes_after_its_timeout_clears_failed() {
    let nm = with_condition(
        with_drain(request(Phase::Draining), 10),
        condition_type::FAILED,
        true,
        "DrainTimeout",
    );
    let step = run(&nm, CORDONED, Some(&[]), at(100));
    assert_eq!(moved_to(&step), Some(Phase::Ready));
    assert_eq!(failed_reason(status_writes(&step)[0]), None);
}

// ---- timers ----

#[test]
fn wait_for_pod_completion_times_out_from_the_phase_start() {
    let nm = with_wait(request(Phase::WaitForPodCompletion), 60);
    let pods = [pod("app", "job-1")];
    let step = run(&nm, CORDONED, Some(&pods), at(50));
    assert_eq!(moved_to(&step), None);
    assert_eq!(
        step.wake_at,
        Some(after(at(61), Duration::from_millis(100)))
    );
    let step = run(&nm, CORDONED, Some(&pods), at(61));
    assert_eq!(moved_to(&step), Some(Phase::Ready));
    assert_eq!(
        events(&step),
        vec![EventReason::WaitForPodCompletionTimeout]
    );
    // timeoutSeconds 0 waits forever, without a timeout; the step still looks again every
    // WAIT_RECHECK, in case the pod watch missed the pods' end (a re-list tells nobody).
    let forever = with_wait(request(Phase::WaitForPodCompletion), 0);
    let step = run(&forever, CORDONED, Some(&pods), at(100_000));
    assert_eq!(
        (moved_to(&step), step.wake_at),
        (None, Some(after(at(100_000), WAIT_RECHECK)))
    );
}

#[test]
fn a_wait_needs_the_pod_list_first() {
    let nm = with_wait(request(Phase::WaitForPodCompletion), 0);
    let step = run(&nm, CORDONED, None, at(1));
    assert!(step.watch_pods && step.actions.is_empty());
    // An empty node (listed) is done.
    let step = run(&nm, CORDONED, Some(&[]), at(1));
    assert_eq!(moved_to(&step), Some(Phase::Ready));
}

#[test]
fn terminated_and_terminating_pods_never_block_the_wait() {
    let nm = with_wait(request(Phase::WaitForPodCompletion), 0);
    let pods = [
        with_phase(pod("app", "done"), "Failed"),
        terminating(pod("app", "going")),
    ];
    assert_eq!(
        moved_to(&run(&nm, CORDONED, Some(&pods), at(1))),
        Some(Phase::Ready)
    );
}

// ---- draining ----

#[test]
fn a_drain_evicts_once_and_waits_for_the_pod_to_go() {
    let nm = with_drain(request(Phase::Draining), 0);
    let mut ledger = Ledger::default();
    let pods = [pod("app", "web-1"), pod("app", "web-2")];
    let step = run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    assert_eq!(evicted(&step), vec!["app/web-1", "app/web-2"]);
    // The first drain status is written at once.
    assert_eq!(status_writes(&step).len(), 1);
    // In flight: no second call.
    let step = run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    assert!(evicted(&step).is_empty());
    ledger.record(
        "app/web-1",
        Some("uid-app-web-1"),
        EvictionOutcome::Evicted,
        at(1),
        0.5,
    );
    ledger.record(
        "app/web-2",
        Some("uid-app-web-2"),
        EvictionOutcome::Evicted,
        at(1),
        0.5,
    );
    // Accepted but still there (terminating): no call, not done.
    let going = [
        terminating(pod("app", "web-1")),
        terminating(pod("app", "web-2")),
    ];
    let step = run_with(&nm, CORDONED, Some(&going), at(2), &mut ledger);
    assert!(evicted(&step).is_empty());
    assert_eq!(moved_to(&step), None);
    // Gone: Ready.
    let step = run_with(&nm, CORDONED, Some(&[]), at(3), &mut ledger);
    assert_eq!(moved_to(&step), Some(Phase::Ready));
    assert!(
        step.actions
            .iter()
            .any(|a| matches!(a, Action::DrainFinished { .. }))
    );
    assert!(!step.watch_pods);
}

/// A refused eviction backs off, and the status names its budget. The budget's change wakes
/// exactly the pods it refused, in its own namespace: a pod another budget refused, or one refused
/// by a budget of the same name elsewhere, keeps its backoff. The step's outlook watches every
/// budget that blocks a pod, counting the pods it blocks.
#[test]
fn a_refused_eviction_backs_off_and_a_pdb_change_wakes_exactly_the_pods_it_refused() {
    let nm = with_drain(request(Phase::Draining), 0);
    let mut ledger = Ledger::default();
    let refusals = [
        ("app/web-1", "web"),
        ("app/web-2", "web"),
        ("app/db-1", "db"),
        ("other/web-1", "web"),
    ];
    let pods: Vec<Pod> = refusals
        .iter()
        .filter_map(|(key, _)| key.split_once('/'))
        .map(|(namespace, name)| pod(namespace, name))
        .collect();
    run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    for (key, pdb) in refusals {
        answer(&mut ledger, key, refused_by(Some(pdb)), at(1));
    }
    let step = run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    assert!(evicted(&step).is_empty(), "every pod backs off");
    assert_eq!(
        step.ledger_outlook.blocked_by_pdb,
        BTreeMap::from([
            (budget("app", "db"), 1),
            (budget("app", "web"), 2),
            (budget("other", "web"), 1),
        ])
    );
    let blocked = &written_drain(&step).blocked;
    assert_eq!(blocked.len(), 4);
    assert!(blocked.iter().all(|b| b.reason == "PDB"), "{blocked:?}");

    // The evictor's gate decides how many of the woken pods call.
    pdb_changed(&mut ledger, "app", "web", at(1));
    let step = run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    assert_eq!(evicted(&step), vec!["app/web-1", "app/web-2"]);
}

#[test]
fn a_held_eviction_is_no_attempt_and_looks_again_soon() {
    let nm = with_drain(request(Phase::Draining), 0);
    let mut ledger = Ledger::default();
    let pods = [pod("app", "web-1")];
    // Four real refusals: the backoff has grown to 4 s (at jitter 0.5).
    for second in [1, 2, 4, 8] {
        let step = run_with(&nm, CORDONED, Some(&pods), at(second), &mut ledger);
        assert_eq!(evicted(&step), vec!["app/web-1"], "at {second}s");
        ledger.record(
            "app/web-1",
            Some("uid-app-web-1"),
            refused_by(Some("web")),
            at(second),
            0.5,
        );
    }
    let backoff = ledger.evictions["app/web-1"].next_attempt;
    assert_eq!(backoff, at(8) + retry_delay(4, 0.5));
    // The gate holds the next one back: no attempt counted, and it looks again in 2 s, not 8.
    let step = run_with(&nm, CORDONED, Some(&pods), backoff, &mut ledger);
    assert_eq!(evicted(&step), vec!["app/web-1"]);
    ledger.record(
        "app/web-1",
        Some("uid-app-web-1"),
        crate::eviction::GateVerdict::hold_outcome("web", 0),
        backoff,
        0.5,
    );
    let entry = &ledger.evictions["app/web-1"];
    assert_eq!(entry.attempts, 4, "a hold is no attempt");
    assert_eq!(entry.next_attempt, backoff + HELD_RECHECK);
    // It is still shown as blocked by the budget, with the gate's words.
    assert_eq!(
        ledger.blocked_by_pdb(),
        BTreeMap::from([(("app".to_string(), "web".to_string()), 1)])
    );
}

#[test]
fn eviction_backoff_grows_and_is_bounded() {
    let min = retry_delay(1, 0.5);
    assert_eq!(min, EVICTION_MIN_BACKOFF);
    assert_eq!(retry_delay(2, 0.5), EVICTION_MIN_BACKOFF * 2);
    assert_eq!(retry_delay(40, 0.5), EVICTION_MAX_BACKOFF);
    assert!(retry_delay(1, 0.0) < retry_delay(1, 0.99));
}

#[test]
fn after_the_drain_timeout_retries_go_slow() {
    let nm = with_drain(request(Phase::Draining), 10);
    let mut ledger = Ledger::default();
    let pods = [pod("app", "web-1")];
    run_with(&nm, CORDONED, Some(&pods), at(20), &mut ledger);
    ledger.record(
        "app/web-1",
        Some("uid-app-web-1"),
        EvictionOutcome::Refused {
            pdb: Some("web".into()),
            message: "no".into(),
            held: false,
        },
        at(20),
        0.5,
    );
    assert_eq!(
        ledger.evictions["app/web-1"].next_attempt,
        after(at(20), SLOW_RETRY)
    );
}

#[test]
fn the_drain_timeout_wakes_the_step() {
    let nm = with_drain(request(Phase::Draining), 300);
    let pods = [pod("app", "web-1")];
    let step = run(&nm, CORDONED, Some(&pods), at(298));
    // The heartbeat (5 s) comes after the deadline here: the deadline wins.
    assert_eq!(
        step.wake_at,
        Some(after(at(301), Duration::from_millis(100)))
    );
}

#[test]
fn pods_that_arrive_during_the_drain_are_evicted_but_never_hold_it() {
    let nm = with_drain(request(Phase::Draining), 0);
    let mut ledger = Ledger::default();
    let old = created_at(pod("app", "old"), at(-60));
    let newcomer = created_at(pod("app", "rebound"), at(30));
    let step = run_with(
        &nm,
        CORDONED,
        Some(&[old.clone(), newcomer.clone()]),
        at(31),
        &mut ledger,
    );
    assert_eq!(evicted(&step), vec!["app/old", "app/rebound"]);
    let drain = status_writes(&step)[0].status.drain.clone().expect("drain");
    assert_eq!(drain.wait_for_eviction, vec!["app/old"]);
    // The pod present at the start is gone; a controller keeps re-binding the other: done.
    let again = created_at(pod("app", "rebound"), at(40));
    let step = run_with(&nm, CORDONED, Some(&[again]), at(41), &mut ledger);
    assert_eq!(moved_to(&step), Some(Phase::Ready), "{step:?}");
}

/// An order shares the pod the actor's cache holds (no copy while it waits for the rate limit)
/// and reads from it what the call needs; the ledger keeps no copy of the labels either.
#[test]
fn an_eviction_order_shares_the_cached_pod() {
    let nm = with_drain(request(Phase::Draining), 0);
    let mut web = pod("app", "web");
    web.metadata.labels = Some(BTreeMap::from([("app".into(), "web".into())]));
    let cached = vec![Arc::new(CachedPod::cached(&web))];
    let summaries = BTreeMap::new();
    let operator = OperatorIdentity::new("maintenance-operator", None);
    let observed = Observed {
        node: CORDONED,
        request_gone: false,
        pods: Some(&cached),
        pdb_summaries: &summaries,
        operator: &operator,
        yield_after: None,
        pool: None,
    };
    let mut ledger = Ledger::default();
    let step = step(&nm, &observed, at(1), &mut ledger);
    let orders: Vec<&EvictionOrder> = step
        .actions
        .iter()
        .flat_map(|a| match a {
            Action::Evict(orders) => orders.iter().collect(),
            _ => Vec::new(),
        })
        .collect();
    let [order] = orders.as_slice() else {
        panic!("one order: {step:?}");
    };
    assert!(
        Arc::ptr_eq(&order.pod, &cached[0]),
        "the cached pod, not a copy"
    );
    assert_eq!(
        (order.namespace(), order.name(), order.uid()),
        ("app", "web", Some("uid-app-web"))
    );
    assert_eq!(order.labels().get("app").map(String::as_str), Some("web"));
    assert_eq!(
        Arc::strong_count(&cached[0]),
        2,
        "the order's and the cache's"
    );
}

#[test]
fn a_restart_resumes_from_the_object() {
    // The status says 10 pods were to be evicted; a fresh ledger must not shrink the counts,
    // and a pod evicted before the restart (terminating) is waited for, not evicted again.
    let mut nm = with_drain(request(Phase::Draining), 0);
    nm.status.as_mut().expect("status").drain = Some(DrainStatus {
        total_pods: 12,
        eviction_pods: 10,
        drain_progress: 90,
        wait_for_eviction: vec!["app/web-1".into()],
        ..DrainStatus::default()
    });
    let pods = [terminating(pod("app", "web-1"))];
    let step = run(&nm, CORDONED, Some(&pods), at(50));
    assert!(evicted(&step).is_empty());
    assert_eq!(moved_to(&step), None);
    // Nothing changed since the status was written, except the blocked reason.
    let drain = status_writes(&step)[0].status.drain.clone().expect("drain");
    assert_eq!((drain.total_pods, drain.eviction_pods), (12, 10));
    assert_eq!(drain.blocked[0].reason, "Terminating");
}

/// Drain progress is written at most every interval, counted from the last status write the actor
/// told the ledger of; a ledger told of none writes at once.
#[test]
fn drain_status_writes_are_throttled_from_the_last_write_told() {
    let nm = with_drain(request(Phase::Draining), 0);
    let mut ledger = Ledger::default();
    let pods = [pod("app", "a"), pod("app", "b")];
    let first = run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    let mut written = nm.clone();
    written.status = Some(status_writes(&first)[0].status.clone());
    let mut untold = ledger.clone();
    assert!(ledger.observe(LedgerEvent::StatusWritten, at(1)).is_empty());
    // Progress half a second later: held back, woken when the interval has passed.
    let now = after(at(1), Duration::from_millis(500));
    let step = run_with(&written, CORDONED, Some(&pods[..1]), now, &mut ledger);
    assert!(status_writes(&step).is_empty());
    assert_eq!(step.wake_at, Some(after(at(1), STATUS_WRITE_INTERVAL)));
    let step = run_with(&written, CORDONED, Some(&pods[..1]), now, &mut untold);
    assert_eq!(status_writes(&step).len(), 1, "told of no write: {step:?}");
    // Once the interval has passed it is written.
    let due = after(at(1), STATUS_WRITE_INTERVAL);
    let step = run_with(&written, CORDONED, Some(&pods[..1]), due, &mut ledger);
    assert_eq!(status_writes(&step).len(), 1);
}

/// The write that entered Draining counts for the interval: the first drain status waits for it,
/// and a drain done sooner writes its counts only with Ready (one status write less per node).
#[test]
fn the_first_drain_status_waits_for_the_interval_after_entering_draining() {
    let nm = with_drain(request(Phase::Draining), 0);
    let mut ledger = Ledger {
        last_status_write: Some(at(0)),
        ..Ledger::default()
    };
    let pods = [pod("app", "a")];
    let step = run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    assert_eq!(evicted(&step), vec!["app/a"]);
    assert!(status_writes(&step).is_empty(), "{step:?}");
    assert!(step.wake_at <= Some(after(at(0), STATUS_WRITE_INTERVAL)));
    ledger.record(
        "app/a",
        Some("uid-app-a"),
        EvictionOutcome::Evicted,
        at(1),
        0.5,
    );
    let step = run_with(&nm, CORDONED, Some(&[]), at(2), &mut ledger);
    let writes = status_writes(&step);
    assert_eq!(writes.len(), 1, "{step:?}");
    assert_eq!(moved_to(&step), Some(Phase::Ready));
    let drain = writes[0]
        .status
        .drain
        .clone()
        .expect("the drain's counts go with Ready");
    assert_eq!((drain.total_pods, drain.eviction_pods), (1, 1));
}

#[test]
fn bare_pods_are_blocked_until_force() {
    let nm = with_drain(request(Phase::Draining), 0);
    let pods = [bare("app", "manual")];
    let step = run(&nm, CORDONED, Some(&pods), at(1));
    assert!(evicted(&step).is_empty());
    let drain = status_writes(&step)[0].status.drain.clone().expect("drain");
    assert_eq!(drain.blocked[0].reason, "NeedsForce");
    let mut forced = nm.clone();
    if let Some(d) = forced.spec.drain_spec.as_mut() {
        d.force = Some(true);
    }
    assert_eq!(
        evicted(&run(&forced, CORDONED, Some(&pods), at(2))),
        vec!["app/manual"]
    );
}

#[test]
fn the_progress_gauge_is_reported_only_while_draining() {
    let nm = with_drain(request(Phase::Draining), 0);
    let pods = [pod("app", "web-1")];
    assert_eq!(
        run(&nm, CORDONED, Some(&pods), at(1)).last_progress,
        Some(at(1))
    );
    assert_eq!(
        run(&request(Phase::Ready), CORDONED, None, at(1)).last_progress,
        None
    );
}

#[test]
fn newer_versions_only_move_forward() {
    let mut old = request(Phase::Draining);
    old.metadata.resource_version = Some("9".into());
    let current = request(Phase::Draining);
    assert!(!is_newer_version(&old, &current));
    assert!(is_newer_version(&current, &old));
}

// ---- the escalation deadline (drainSpec.forceDeleteAfterSeconds) ----

fn with_force_delete_after(mut nm: NodeMaintenance, seconds: i32) -> NodeMaintenance {
    if let Some(drain) = nm.spec.drain_spec.as_mut() {
        drain.force_delete_after_seconds = Some(seconds);
    }
    nm
}

/// The fixtures' UID of `namespace/name`.
fn uid_of(key: &str) -> String {
    format!("uid-{}", key.replace('/', "-"))
}

fn refused_by(pdb: Option<&str>) -> EvictionOutcome {
    EvictionOutcome::Refused {
        pdb: pdb.map(str::to_string),
        message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        held: false,
    }
}

/// The answer to the eviction of `key` (the fixtures' pod), as the actor tells the ledger.
fn answer(ledger: &mut Ledger, key: &str, outcome: EvictionOutcome, now: Timestamp) {
    let answered = LedgerEvent::EvictionAnswered {
        key: key.into(),
        uid: Some(uid_of(key)),
        outcome,
        jitter: 0.5,
    };
    assert!(ledger.observe(answered, now).is_empty());
}

/// The answer to the deletion past the deadline of `key`, as the actor tells the ledger.
fn answer_deletion(ledger: &mut Ledger, key: &str, outcome: DeleteOutcome, now: Timestamp) {
    let answered = LedgerEvent::ForceDeleteAnswered {
        key: key.into(),
        uid: Some(uid_of(key)),
        outcome,
        jitter: 0.5,
    };
    assert!(ledger.observe(answered, now).is_empty());
}

/// Tells the ledger which calls run; returns those to cancel.
fn calls_running(ledger: &mut Ledger, running: &[&str], now: Timestamp) -> Vec<String> {
    let running = running.iter().map(|key| key.to_string()).collect();
    ledger.observe(LedgerEvent::CallsRunning { running }, now)
}

/// (pod, PDB) of every deletion the step orders.
fn force_deleted(step: &Step) -> Vec<(String, String)> {
    step.actions
        .iter()
        .flat_map(|a| match a {
            Action::ForceDelete(orders) => orders
                .iter()
                .map(|o| (o.key.clone(), o.pdb.clone()))
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// A status after a round trip through the API server (JSON, times to the second).
fn on_the_wire(status: &NodeMaintenanceStatus) -> NodeMaintenanceStatus {
    serde_json::to_value(status)
        .and_then(serde_json::from_value)
        .expect("the status round-trips through JSON")
}

fn written_drain(step: &Step) -> DrainStatus {
    status_writes(step)
        .last()
        .and_then(|w| w.status.drain.clone())
        .expect("a drain status write")
}

/// Pods of every kind the drain meets, each eviction answered at(1).
fn drain_with_every_answer(nm: &NodeMaintenance) -> (Vec<Pod>, Ledger) {
    let mut mirror = pod("app", "static");
    mirror
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(drain_plan::MIRROR_POD_ANNOTATION.into(), "hash".into());
    let pods = vec![
        pod("app", "web-1"),
        pod("app", "web-2"),
        // 429 without a budget's name: the API server's own throttling, not a budget.
        pod("app", "throttled"),
        pod("app", "two-pdbs"),
        pod("app", "flaky"),
        pod("app", "leaving"),
        // Arrived after the drain began: evicted, but never holds the drain.
        created_at(pod("app", "newcomer"), at(1)),
        bare("app", "manual"),
        owned_by(bare("app", "agent"), "DaemonSet"),
        mirror,
    ];
    let mut ledger = Ledger::default();
    let step = run_with(nm, CORDONED, Some(&pods), at(1), &mut ledger);
    assert_eq!(
        evicted(&step),
        [
            "app/flaky",
            "app/leaving",
            "app/newcomer",
            "app/throttled",
            "app/two-pdbs",
            "app/web-1",
            "app/web-2"
        ]
    );
    for (key, outcome) in [
        ("app/web-1", refused_by(Some("web"))),
        ("app/web-2", refused_by(Some("web"))),
        ("app/throttled", refused_by(None)),
        (
            "app/two-pdbs",
            EvictionOutcome::MultiplePdbs {
                message: "This pod has more than one PodDisruptionBudget".into(),
            },
        ),
        (
            "app/flaky",
            EvictionOutcome::Error {
                code: Some(500),
                message: "etcd timeout".into(),
            },
        ),
        ("app/leaving", EvictionOutcome::Evicted),
        ("app/newcomer", refused_by(Some("web"))),
    ] {
        answer(&mut ledger, key, outcome, at(1));
    }
    (pods, ledger)
}

/// Before the deadline nothing is deleted and the step is woken at the deadline (not at the next
/// heartbeat); at the deadline exactly the pods a named budget refuses are deleted, with the
/// budget's name, instead of evicted again. Pods held back by the spec (no controller), refused
/// for another reason, newcomers, DaemonSet and mirror pods are left to the existing rules.
#[test]
fn the_deadline_deletes_exactly_the_pods_a_budget_refuses() {
    let nm = with_force_delete_after(with_drain(request(Phase::Draining), 300), 60);
    let (pods, ledger) = drain_with_every_answer(&nm);

    let mut early = ledger.clone();
    let step = run_with(&nm, CORDONED, Some(&pods), at(59), &mut early);
    assert!(force_deleted(&step).is_empty(), "{step:?}");
    // The heartbeat would come at 63 s: the deadline wins.
    assert_eq!(step.wake_at, Some(after(at(61), TIMER_SLACK)));

    let mut ledger = ledger;
    let step = run_with(&nm, CORDONED, Some(&pods), at(61), &mut ledger);
    assert_eq!(
        force_deleted(&step),
        [
            ("app/web-1".to_string(), "web".to_string()),
            ("app/web-2".to_string(), "web".to_string())
        ]
    );
    let evicted_now = evicted(&step);
    assert!(
        !evicted_now.iter().any(|k| k.starts_with("app/web-")),
        "deleted instead of evicted: {evicted_now:?}"
    );
    assert!(
        evicted_now.contains(&"app/newcomer".to_string()),
        "a newcomer is only evicted again: {evicted_now:?}"
    );
    let Some(Action::ForceDelete(orders)) = step
        .actions
        .iter()
        .find(|a| matches!(a, Action::ForceDelete(_)))
    else {
        panic!("no ForceDelete in {step:?}");
    };
    assert_eq!(orders[0].uid.as_deref(), Some("uid-app-web-1"));
    for needle in [
        "app/web-1",
        "PodDisruptionBudget app/web",
        "60s",
        "default/maintenance",
        "node-1",
    ] {
        assert!(
            orders[0].note.contains(needle),
            "{needle}: {}",
            orders[0].note
        );
    }
    let drain = written_drain(&step);
    let web = drain
        .blocked
        .iter()
        .find(|b| b.pod == "app/web-1")
        .expect("web-1 listed");
    assert!(web.message.contains("bypassing"), "{web:?}");
}

#[test]
fn without_the_field_no_pod_is_ever_deleted() {
    let nm = with_drain(request(Phase::Draining), 0);
    let (pods, mut ledger) = drain_with_every_answer(&nm);
    let step = run_with(&nm, CORDONED, Some(&pods), at(1_000_000), &mut ledger);
    assert!(force_deleted(&step).is_empty(), "{step:?}");
    assert!(evicted(&step).contains(&"app/web-1".to_string()));
    // No timer for a deadline that does not exist: the heartbeat only.
    assert_eq!(step.wake_at, Some(after(at(1_000_000), HEARTBEAT)));
}

/// `app/web-1`, refused by its budget at 1 s, is deleted at the deadline (5 s); the deletion's
/// answer has not come.
fn deleted_past_the_deadline() -> (NodeMaintenance, [Pod; 1], Ledger) {
    let nm = with_force_delete_after(with_drain(request(Phase::Draining), 300), 5);
    let pods = [pod("app", "web-1")];
    let mut ledger = Ledger::default();
    run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    answer(&mut ledger, "app/web-1", refused_by(Some("web")), at(1));
    let step = run_with(&nm, CORDONED, Some(&pods), at(6), &mut ledger);
    assert_eq!(force_deleted(&step).len(), 1);
    (nm, pods, ledger)
}

/// A deleted pod is terminating, then gone: never deleted twice, not after a restart either (the
/// record is on the object), and a 404 means there is nothing left to bypass.
#[test]
fn a_pod_deleted_past_the_deadline_is_deleted_once_and_recorded() {
    let (nm, pods, mut ledger) = deleted_past_the_deadline();
    // In flight: no second call.
    let step = run_with(&nm, CORDONED, Some(&pods), at(5), &mut ledger);
    assert!(force_deleted(&step).is_empty() && evicted(&step).is_empty());

    let mut gone_ledger = ledger.clone();
    answer_deletion(&mut gone_ledger, "app/web-1", DeleteOutcome::Gone, at(5));
    assert!(gone_ledger.force_deleted.is_empty(), "nothing was bypassed");

    answer_deletion(
        &mut ledger,
        "app/web-1",
        DeleteOutcome::Deleted,
        after(at(5), Duration::from_millis(300)),
    );
    assert_eq!(
        ledger.outlook(),
        LedgerOutlook::default(),
        "no longer waits on the budget"
    );
    let going = [terminating(pod("app", "web-1"))];
    let step = run_with(&nm, CORDONED, Some(&going), at(6), &mut ledger);
    assert!(force_deleted(&step).is_empty() && evicted(&step).is_empty());
    let drain = written_drain(&step);
    assert_eq!(
        drain.force_deleted,
        [ForceDeletedPod {
            pod: "app/web-1".into(),
            pdb: "web".into(),
            deleted_at: Time(at(5)),
        }]
    );
    assert_eq!(drain.blocked[0].reason, "Terminating");
    assert!(
        drain.blocked[0]
            .message
            .contains("bypassing PodDisruptionBudget app/web"),
        "{:?}",
        drain.blocked[0]
    );

    // The object as the API server keeps it (times to the second): the record is not repeated.
    let mut written = nm.clone();
    written.status = Some(on_the_wire(&status_writes(&step)[0].status));
    let step = run_with(&written, CORDONED, Some(&going), at(7), &mut ledger);
    assert!(status_writes(&step).is_empty(), "nothing changed: {step:?}");

    // A restart: the ledger is empty, the object remembers.
    let mut fresh = Ledger::default();
    let step = run_with(&written, CORDONED, Some(&going), at(7), &mut fresh);
    assert!(force_deleted(&step).is_empty() && evicted(&step).is_empty());
    let step = run_with(&written, CORDONED, Some(&[]), at(8), &mut fresh);
    assert_eq!(moved_to(&step), Some(Phase::Ready));
    let ready = status_writes(&step)[0];
    assert_eq!(
        ready.status.drain.as_ref().map(|d| d.force_deleted.len()),
        Some(1)
    );
    let message = &ready_condition(ready).message;
    assert!(
        message.contains("app/web-1") && message.contains("PodDisruptionBudget web"),
        "{message}"
    );
}

/// A pod deleted past the deadline can vanish from the pod cache before the deletion's answer
/// comes back (no grace period, a quick kubelet). The drain waits for the answer, which carries
/// the record of the budget bypassed: it used to forget the pod with the cache, finish, and never
/// write the record.
#[test]
fn a_deleted_pod_gone_before_the_answer_is_still_recorded() {
    let (nm, _, mut ledger) = deleted_past_the_deadline();

    let step = run_with(&nm, CORDONED, Some(&[]), at(5), &mut ledger);
    assert_eq!(
        moved_to(&step),
        None,
        "the drain finished before the deletion's answer: {step:?}"
    );
    answer_deletion(&mut ledger, "app/web-1", DeleteOutcome::Deleted, at(5));
    let step = run_with(&nm, CORDONED, Some(&[]), at(6), &mut ledger);
    assert_eq!(moved_to(&step), Some(Phase::Ready), "{step:?}");
    let ready = status_writes(&step)[0];
    assert_eq!(
        ready.status.drain.as_ref().map(|d| d.force_deleted.clone()),
        Some(vec![ForceDeletedPod {
            pod: "app/web-1".into(),
            pdb: "web".into(),
            deleted_at: Time(at(5)),
        }])
    );
}

/// A deletion the API server refuses (say, RBAC without `delete` on pods) is retried as a
/// deletion after its backoff, and the status says what to fix.
#[test]
fn a_failed_deletion_is_retried_as_a_deletion() {
    let nm = with_force_delete_after(with_drain(request(Phase::Draining), 0), 5);
    let pods = [pod("app", "web-1")];
    let mut ledger = Ledger::default();
    run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    answer(&mut ledger, "app/web-1", refused_by(Some("web")), at(1));
    run_with(&nm, CORDONED, Some(&pods), at(6), &mut ledger);
    answer_deletion(
        &mut ledger,
        "app/web-1",
        DeleteOutcome::Error {
            code: Some(403),
            message: "pods \"web-1\" is forbidden".into(),
        },
        at(6),
    );
    let step = run_with(&nm, CORDONED, Some(&pods), at(6), &mut ledger);
    assert!(force_deleted(&step).is_empty() && evicted(&step).is_empty());
    let retry_at = ledger.evictions["app/web-1"].next_attempt;
    assert!(retry_at > at(6));
    let blocked = &written_drain(&step).blocked[0];
    assert_eq!(blocked.reason, "Error");
    assert!(
        blocked.message.contains("HTTP 403") && blocked.message.contains("rbac.forceDelete"),
        "{blocked:?}"
    );
    let step = run_with(&nm, CORDONED, Some(&pods), retry_at, &mut ledger);
    assert_eq!(force_deleted(&step).len(), 1, "{step:?}");
    assert!(evicted(&step).is_empty());
}

/// A request adopted mid-drain counts from its phase clock (the adoption here), not from the
/// first Pending that NVIDIA's `lastTransitionTime` holds.
#[test]
fn the_deadline_of_an_adopted_request_counts_from_its_phase_clock() {
    let nm = with_annotation(
        with_force_delete_after(with_drain(nvidia_request(Phase::Draining), 0), 60),
        ADMITTED_TIME_ANNOTATION,
        Some(at(1500)),
    );
    let pods = [pod("app", "web-1")];
    let mut ledger = Ledger::default();
    run_with(&nm, CORDONED, Some(&pods), at(1500), &mut ledger);
    answer(&mut ledger, "app/web-1", refused_by(Some("web")), at(1500));
    let mut early = ledger.clone();
    let step = run_with(&nm, CORDONED, Some(&pods), at(1560), &mut early);
    assert!(force_deleted(&step).is_empty(), "{step:?}");
    assert_eq!(step.wake_at, Some(after(at(1561), TIMER_SLACK)));
    let step = run_with(&nm, CORDONED, Some(&pods), at(1561), &mut ledger);
    assert_eq!(force_deleted(&step).len(), 1, "{step:?}");
}

/// The drain timeout and the deadline are independent: a timeout before the deadline reports
/// and retries slowly, and the deadline deletes regardless of the slow retry's schedule.
#[test]
fn the_deadline_is_independent_of_the_drain_timeout() {
    let nm = with_force_delete_after(with_drain(request(Phase::Draining), 10), 100);
    let pods = [pod("app", "web-1")];
    let mut ledger = Ledger::default();
    let step = run_with(&nm, CORDONED, Some(&pods), at(11), &mut ledger);
    assert!(events(&step).contains(&EventReason::DrainTimeout));
    answer(&mut ledger, "app/web-1", refused_by(Some("web")), at(90));
    assert_eq!(
        ledger.evictions["app/web-1"].next_attempt,
        after(at(90), SLOW_RETRY)
    );
    let step = run_with(&nm, CORDONED, Some(&pods), at(101), &mut ledger);
    assert_eq!(force_deleted(&step).len(), 1, "{step:?}");
}

// ---- calls in flight ----

/// An eviction the step ordered whose call never started (the finalizer write before it in the
/// same step failed) is due again, instead of waiting forever for an answer.
#[test]
fn an_eviction_whose_call_never_started_is_ordered_again() {
    let mut nm = with_drain(request(Phase::Draining), 0);
    nm.metadata.finalizers = None;
    let mut ledger = Ledger::default();
    let pods = [pod("app", "web-1")];
    let step = run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    assert_eq!(step.actions.first(), Some(&Action::AddFinalizer));
    assert_eq!(evicted(&step), vec!["app/web-1"]);
    // The finalizer write failed: nothing was started.
    assert!(calls_running(&mut ledger, &[], at(1)).is_empty());
    let again = run_with(&nm, CORDONED, Some(&pods), at(2), &mut ledger);
    assert_eq!(evicted(&again), vec!["app/web-1"], "{again:?}");
    assert!(
        !again
            .actions
            .iter()
            .any(|a| matches!(a, Action::Evict(o) if o[0].is_retry))
    );
}

/// Deleted mid-drain, the request stops its work at once: the evictions still queued behind the
/// rate limit are cancelled, and one that is running is not started again.
#[test]
fn a_deletion_mid_drain_cancels_the_evictions_in_flight() {
    let nm = with_drain(request(Phase::Draining), 0);
    let mut ledger = Ledger::default();
    let pods = [pod("app", "web-1"), pod("app", "web-2")];
    let step = run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    assert_eq!(evicted(&step), vec!["app/web-1", "app/web-2"]);
    let running = ["app/web-1", "app/web-2"];
    assert!(
        calls_running(&mut ledger, &running, at(1)).is_empty(),
        "still wanted"
    );
    let step = run_with(&deleting(nm), CORDONED, Some(&pods), at(2), &mut ledger);
    assert!(step.finished);
    assert_eq!(calls_running(&mut ledger, &running, at(2)), running);
}

/// A drain whose pods could never be listed still times out, and says why, once.
#[test]
fn a_drain_whose_pods_are_never_listed_still_times_out() {
    let nm = with_drain(request(Phase::Draining), 60);
    let early = run(&nm, CORDONED, None, at(10));
    assert!(early.actions.is_empty() && early.watch_pods);
    assert_eq!(early.wake_at, Some(after(at(61), TIMER_SLACK)));
    let late = run(&nm, CORDONED, None, at(62));
    assert_eq!(events(&late), vec![EventReason::DrainTimeout]);
    let failed = status_writes(&late)[0]
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition_type::FAILED)
        .cloned()
        .expect("a Failed condition");
    assert!(
        failed.message.contains("could not be listed"),
        "{}",
        failed.message
    );
    let mut reported = nm.clone();
    reported.status = Some(status_writes(&late)[0].status.clone());
    assert!(run(&reported, CORDONED, None, at(90)).actions.is_empty());
}

#[test]
fn a_failed_step_backs_off_and_only_the_first_conflicts_retry_at_once() {
    let ms = |d: Duration| d.as_millis();
    assert_eq!(ms(retry_after_failed_step(true, 1)), 0);
    assert_eq!(ms(retry_after_failed_step(true, 2)), 0);
    assert_eq!(ms(retry_after_failed_step(true, 3)), 500);
    assert_eq!(ms(retry_after_failed_step(true, 50)), 30_000);
    assert_eq!(ms(retry_after_failed_step(false, 1)), 500);
    assert_eq!(ms(retry_after_failed_step(false, 2)), 1_000);
    assert_eq!(ms(retry_after_failed_step(false, 9)), 30_000);
}

/// A request that vanished under our finalizer (seen in e2e_nvidia: a DELETE that raced the
/// admission went through after the admission had added our finalizer; the actor had cordoned,
/// its status write met a 404) is cleaned up from the last version the actor saw: the node is
/// uncordoned if we owe it, and never if it was cordoned before us or the request never got past
/// Pending.
#[test]
fn a_request_gone_without_our_cleanup_has_its_cordon_undone() {
    for phase in [
        Phase::Scheduled,
        Phase::Cordon,
        Phase::Draining,
        Phase::Ready,
    ] {
        let step = on_request_gone(&request(phase), CORDONED);
        assert!(step.finished, "{phase}");
        assert_eq!(step.actions.first(), Some(&Action::Uncordon), "{phase}");
    }
    let admitted = admitted_by_metadata(at(7));
    assert_eq!(
        on_request_gone(&admitted, CORDONED).actions.first(),
        Some(&Action::Uncordon),
        "only its admission shows it Scheduled, and the first step cordons"
    );
    let before_us = with_initial_state(request(Phase::Ready), Some(true));
    assert_eq!(
        on_request_gone(&before_us, CORDONED).actions,
        [Action::UnprotectFromAutoscalers],
        "a node cordoned before us keeps its cordon and loses our autoscaler annotations"
    );
    assert!(
        on_request_gone(&request(Phase::Pending), CORDONED)
            .actions
            .is_empty()
    );
    let gone_node = on_request_gone(&request(Phase::Ready), NodeView::Missing);
    assert!(gone_node.finished && gone_node.actions.is_empty());
}

/// Until that uncordon is done the actor holds the node, so that no other request is admitted on
/// it; a request still in progress, or one whose cleanup owes nothing, holds nothing this way.
#[test]
fn an_actor_holds_the_node_of_its_gone_request_until_the_uncordon() {
    let last = request(Phase::Ready);
    assert!(actor_holds_node_of_gone_request(&last, None, true, false));
    let mut finalizer_removed_by_hand = last.clone();
    finalizer_removed_by_hand.metadata.finalizers = None;
    finalizer_removed_by_hand.metadata.deletion_timestamp = Some(Time(at(9)));
    assert!(actor_holds_node_of_gone_request(
        &last,
        Some(&finalizer_removed_by_hand),
        true,
        false
    ));
    let mut recreated = last.clone();
    recreated.metadata.uid = Some("uid-2".into());
    assert!(actor_holds_node_of_gone_request(
        &last,
        Some(&recreated),
        true,
        false
    ));
    assert!(
        !actor_holds_node_of_gone_request(&last, Some(&last), true, false),
        "still in progress"
    );
    assert!(
        !actor_holds_node_of_gone_request(&last, None, false, false),
        "node gone"
    );
    let before_us = with_initial_state(request(Phase::Ready), Some(true));
    assert!(!actor_holds_node_of_gone_request(
        &before_us, None, true, false
    ));
}

// ---- the ledger's interface: what the actor tells it, what it asks of the actor ----

fn budget(namespace: &str, name: &str) -> (String, String) {
    (namespace.into(), name.into())
}

fn pdb_changed(ledger: &mut Ledger, namespace: &str, name: &str, now: Timestamp) {
    let changed = LedgerEvent::PdbChanged {
        namespace: namespace.into(),
        name: name.into(),
    };
    assert!(ledger.observe(changed, now).is_empty());
}

/// A pod that several budgets select is asked about until the actor tells its budgets, once; then
/// the pod counts under each, both are watched, and a change of either wakes it.
#[test]
fn covering_pdbs_once_told_are_no_longer_asked_and_are_watched() {
    let nm = with_drain(request(Phase::Draining), 0);
    let mut ledger = Ledger::default();
    let pods = [pod("app", "two-pdbs")];
    run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    let several = EvictionOutcome::MultiplePdbs {
        message: "This pod has more than one PodDisruptionBudget".into(),
    };
    answer(&mut ledger, "app/two-pdbs", several, at(1));
    let asked = ledger.outlook();
    assert_eq!(asked.covering_pdbs_wanted, ["app/two-pdbs"]);
    assert!(asked.blocked_by_pdb.is_empty(), "no budget is known yet");

    let told = LedgerEvent::CoveringPdbs {
        key: "app/two-pdbs".into(),
        pdbs: vec!["a".into(), "b".into()],
    };
    assert!(ledger.observe(told, at(1)).is_empty());
    let step = run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    let outlook = &step.ledger_outlook;
    assert!(outlook.covering_pdbs_wanted.is_empty(), "{outlook:?}");
    assert_eq!(
        outlook.pdbs_to_watch().collect::<Vec<_>>(),
        [&budget("app", "a"), &budget("app", "b")]
    );
    assert!(outlook.watches(&budget("app", "b")) && !outlook.watches(&budget("other", "b")));
    assert_eq!(
        outlook,
        &ledger.outlook(),
        "the step's outlook is the ledger's"
    );
    assert!(
        written_drain(&step).blocked[0]
            .message
            .starts_with("covered by 2 PodDisruptionBudgets"),
        "{step:?}"
    );

    pdb_changed(&mut ledger, "app", "b", at(1));
    let step = run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    assert_eq!(evicted(&step), vec!["app/two-pdbs"]);
}

/// A request gone without our cleanup forgets its drain in the step, as a deletion does: the
/// step is the gone request's, and its outlook leaves nothing to watch or count.
#[test]
fn a_request_gone_without_our_cleanup_forgets_the_drain_and_its_budgets() {
    let nm = with_drain(request(Phase::Draining), 0);
    let mut ledger = Ledger::default();
    let pods = [pod("app", "web-1")];
    run_with(&nm, CORDONED, Some(&pods), at(1), &mut ledger);
    answer(&mut ledger, "app/web-1", refused_by(Some("web")), at(1));
    let step = run_with(&nm, CORDONED, Some(&pods), at(2), &mut ledger);
    assert_eq!(
        step.ledger_outlook.pdbs_to_watch().collect::<Vec<_>>(),
        [&budget("app", "web")]
    );

    let gone = run_observing(&nm, CORDONED, true, Some(&pods), at(3), &mut ledger);
    assert_eq!(gone, on_request_gone(&nm, CORDONED));
    assert_eq!(gone.ledger_outlook, LedgerOutlook::default());
    assert!(ledger.evictions.is_empty());
    assert_eq!(
        calls_running(&mut ledger, &["app/web-1"], at(3)),
        ["app/web-1"],
        "the eviction still queued is cancelled"
    );
}

mod pools;
mod yields;
