//! Requests that gave their slot back (`admission.yieldBlockedDrainAfterSeconds`) in the
//! scheduler: they wait out a back-off that grows with each yield (cause `yieldBackoff`, with a
//! round due when it ends), then take their place behind the requests that waited when they
//! yielded; with yields turned off they wait for nothing more.

use std::time::Duration;

use super::*;
use crate::fixtures::{admitted, at, waiting};
use crate::yielding::YieldRecord;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use maintenance_crds::Phase;

const PERIOD: Duration = Duration::from_secs(5);

fn limits(yield_after: Option<Duration>) -> Limits {
    Limits {
        max_parallel_operations: IntOrString::Int(1),
        yield_blocked_drain_after: yield_after,
        ..Limits::default()
    }
}

fn snapshot(requests: Vec<RequestState>) -> Snapshot {
    let nodes = requests
        .iter()
        .map(|r| NodeState::for_test(&r.node_name, false, &[]))
        .collect();
    Snapshot { nodes, requests }
}

/// `a`, created first, yielded (for the `count`th time) at(100); `b` and `c` came at 50 and 150.
fn yielded_a(count: u32) -> Vec<RequestState> {
    let mut a = RequestState::for_test("a", "node-a", Phase::Pending, 0);
    a.yielded = Some(YieldRecord {
        count,
        at: at(100),
        blocked_by: "PodDisruptionBudget app/web refused the eviction of pod app/web-0".into(),
    });
    vec![
        a,
        RequestState::for_test("b", "node-b", Phase::Pending, 50),
        RequestState::for_test("c", "node-c", Phase::Pending, 150),
    ]
}

#[test]
fn a_request_in_its_back_off_waits_names_its_blocker_and_wakes_a_round_at_the_end() {
    // The second yield: a back-off of twice the period, until at(110).
    let snap = snapshot(yielded_a(2));
    let decision = schedule(&snap, &limits(Some(PERIOD)), at(109)).expect("a decision");
    assert_eq!(admitted(&decision), ["b"]);
    let a = waiting(&decision, "a");
    assert_eq!(a.cause, WaitCause::YieldBackoff);
    assert!(
        a.reason.contains("PodDisruptionBudget app/web"),
        "{}",
        a.reason
    );
    assert!(a.reason.contains("app/web-0"), "{}", a.reason);
    assert!(
        a.reason.contains(&format!("{:.0}", at(110))),
        "{}",
        a.reason
    );
    assert_eq!(decision.next_admission_retry, Some(at(110)));
    // At the end of the back-off it competes again: behind b, which waited when it yielded.
    let decision = schedule(&snap, &limits(Some(PERIOD)), at(110)).expect("a decision");
    assert_eq!(admitted(&decision), ["b"]);
    let a = waiting(&decision, "a");
    assert_eq!(a.cause, WaitCause::MaxParallelOperations);
    // Still says why it is Pending again.
    assert!(a.reason.contains("gave its slot back"), "{}", a.reason);
    assert!(a.reason.contains("app/web-0"), "{}", a.reason);
    assert_eq!(decision.next_admission_retry, None);
}

#[test]
fn after_its_back_off_it_goes_behind_what_waited_and_ahead_of_what_came_later() {
    let mut requests = yielded_a(1);
    let decision =
        schedule(&snapshot(requests.clone()), &limits(Some(PERIOD)), at(200)).expect("a decision");
    assert_eq!(admitted(&decision), ["b"]);
    // b admitted and gone: a is next, before c, which came after the yield.
    requests.retain(|r| r.name != "b");
    let decision =
        schedule(&snapshot(requests), &limits(Some(PERIOD)), at(200)).expect("a decision");
    assert_eq!(admitted(&decision), ["a"]);
}

#[test]
fn with_yields_turned_off_a_request_that_yielded_waits_for_no_back_off() {
    let mut requests = yielded_a(3);
    requests.retain(|r| r.name == "a");
    let decision = schedule(&snapshot(requests), &limits(None), at(101)).expect("a decision");
    assert_eq!(admitted(&decision), ["a"]);
}

#[test]
fn the_back_off_grows_with_each_yield() {
    let mut requests = yielded_a(1);
    requests.retain(|r| r.name == "a");
    for (count, free_at) in [(1, 105), (2, 110), (3, 120), (4, 140)] {
        if let Some(y) = requests[0].yielded.as_mut() {
            y.count = count;
        }
        let snap = snapshot(requests.clone());
        let before = schedule(&snap, &limits(Some(PERIOD)), at(free_at - 1)).expect("decision");
        assert_eq!(admitted(&before), Vec::<&str>::new(), "yield {count}");
        assert_eq!(
            before.next_admission_retry,
            Some(at(free_at)),
            "yield {count}"
        );
        let after = schedule(&snap, &limits(Some(PERIOD)), at(free_at)).expect("decision");
        assert_eq!(admitted(&after), ["a"], "yield {count}");
    }
}

#[test]
fn the_record_is_read_only_while_the_request_is_pending() {
    use crate::yielding::{YIELD_COUNT_ANNOTATION, YIELDED_AT_ANNOTATION};
    let when = crate::conditions::admitted_time_value(at(100));
    let pending = crate::fixtures::request("a")
        .annotation(YIELD_COUNT_ANNOTATION, "1")
        .annotation(YIELDED_AT_ANNOTATION, &when)
        .build();
    assert!(RequestState::from_request(&pending).yielded.is_some());
    let draining = crate::fixtures::request("a")
        .annotation(YIELD_COUNT_ANNOTATION, "1")
        .annotation(YIELDED_AT_ANNOTATION, &when)
        .phase(Phase::Draining, at(200))
        .build();
    assert_eq!(RequestState::from_request(&draining).yielded, None);
}
