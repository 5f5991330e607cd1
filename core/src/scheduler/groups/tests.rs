//! Node groups in the scheduler: all or nothing in one round, counted as their size against
//! every limit and budget, a group that can never fit said with the limit and by how much, and no
//! starvation by the requests behind a waiting group.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use maintenance_crds::{Budget, Phase};

use crate::fixtures::{admitted, at, waiting};
use crate::scheduler::model::NodeGroupLabel;
use crate::scheduler::*;

fn limits(parallel: i32) -> Limits {
    Limits {
        max_parallel_operations: IntOrString::Int(parallel),
        ..Limits::default()
    }
}

/// `name` on `node-<name>`, created at `created`, in the group `group` (if any).
fn request(name: &str, group: Option<&str>, phase: Phase, created: i64) -> RequestState {
    let mut request = RequestState::for_test(name, &format!("node-{name}"), phase, created);
    request.node_group = group.map(|g| NodeGroupLabel {
        name: g.to_string(),
        expected_size: None,
    });
    request
}

fn pending(name: &str, group: Option<&str>, created: i64) -> RequestState {
    request(name, group, Phase::Pending, created)
}

fn rack(names: &[&str], created: i64) -> Vec<RequestState> {
    names
        .iter()
        .map(|n| pending(n, Some("rack-a"), created))
        .collect()
}

/// Every request's node exists, with `labels` on each.
fn snapshot(requests: Vec<RequestState>, labels: &[(&str, &str)]) -> Snapshot {
    let nodes = requests
        .iter()
        .map(|r| NodeState::for_test(&r.node_name, false, labels))
        .collect();
    Snapshot { nodes, requests }
}

#[test]
fn a_group_that_fits_is_admitted_whole_in_one_round() {
    let mut requests = rack(&["g1", "g2", "g3"], 0);
    requests.push(pending("s", None, 10));
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(4), at(100)).expect("a decision");
    assert_eq!(admitted(&decision), ["g1", "g2", "g3", "s"]);
    assert_eq!(decision.node_groups.len(), 1);
    assert!(decision.node_groups[0].admitted);
    assert_eq!(decision.node_groups[0].pending, 3);
}

#[test]
fn a_group_with_fewer_free_slots_than_members_admits_none_and_keeps_the_slots() {
    // One slot of three is taken; the group of three waits and the single behind it does not
    // take the two free slots.
    let mut requests = vec![request("busy", None, Phase::Draining, 0)];
    requests.extend(rack(&["g1", "g2", "g3"], 10));
    requests.push(pending("s", None, 20));
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(3), at(100)).expect("a decision");
    assert!(admitted(&decision).is_empty(), "{decision:#?}");
    for name in ["g1", "g2", "g3"] {
        let w = waiting(&decision, name);
        assert_eq!(w.cause, WaitCause::MaxParallelOperations);
        assert_eq!(w.node_group.as_deref(), Some("rack-a"));
        assert!(
            w.reason.contains("needs 3 free slots at once and 2 are"),
            "{}",
            w.reason
        );
    }
    let s = waiting(&decision, "s");
    assert_eq!(s.cause, WaitCause::BehindGroup);
    assert!(s.reason.contains("\"rack-a\""), "{}", s.reason);
    assert_eq!(
        decision.node_groups[0].cause,
        Some(WaitCause::MaxParallelOperations)
    );

    // When the busy node is done, the whole group goes in the same round.
    let mut snap = snap;
    snap.requests.retain(|r| r.name != "busy");
    let decision = schedule(&snap, &limits(3), at(101)).expect("a decision");
    assert_eq!(admitted(&decision), ["g1", "g2", "g3"]);
    assert_eq!(
        waiting(&decision, "s").cause,
        WaitCause::MaxParallelOperations
    );
}

#[test]
fn without_the_label_the_same_requests_would_be_admitted_in_part() {
    // The control for the test above: the label is what keeps the group whole.
    let mut requests = vec![request("busy", None, Phase::Draining, 0)];
    requests.extend(["g1", "g2", "g3"].map(|n| pending(n, None, 10)));
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(3), at(100)).expect("a decision");
    assert_eq!(admitted(&decision), ["g1", "g2"]);
}

#[test]
fn a_group_larger_than_max_parallel_operations_says_by_how_much_and_blocks_nobody() {
    let mut requests = rack(&["g1", "g2", "g3", "g4", "g5"], 0);
    requests.push(pending("s", None, 10));
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(3), at(100)).expect("a decision");
    assert_eq!(admitted(&decision), ["s"]);
    let w = waiting(&decision, "g4");
    assert_eq!(w.cause, WaitCause::GroupCannotFit);
    assert!(
        w.reason.contains("can never be admitted together")
            && w.reason.contains("maxParallelOperations=3 allows 3 nodes in maintenance at once, 2 fewer than the group has"),
        "{}",
        w.reason
    );
}

#[test]
fn a_group_larger_than_max_unavailable_cannot_fit() {
    let snap = snapshot(rack(&["g1", "g2", "g3"], 0), &[]);
    let limits = Limits {
        max_unavailable: Some(IntOrString::Int(2)),
        ..limits(10)
    };
    let decision = schedule(&snap, &limits, at(100)).expect("a decision");
    let w = waiting(&decision, "g1");
    assert_eq!(w.cause, WaitCause::GroupCannotFit);
    assert!(
        w.reason
            .contains("maxUnavailable=2 allows 2 unavailable nodes at once, 1 fewer"),
        "{}",
        w.reason
    );
}

fn budget(spec: serde_json::Value) -> Budget {
    serde_json::from_value(spec).expect("a budget")
}

#[test]
fn a_budget_smaller_than_the_group_on_its_nodes_cannot_fit() {
    let snap = snapshot(rack(&["g1", "g2", "g3"], 0), &[("zone", "a")]);
    let limits = Limits {
        budgets: vec![budget(serde_json::json!({
            "name": "zone-a",
            "nodeSelector": {"matchLabels": {"zone": "a"}},
            "maxParallelOperations": 2
        }))],
        ..limits(10)
    };
    let decision = schedule(&snap, &limits, at(100)).expect("a decision");
    let w = waiting(&decision, "g1");
    assert_eq!(w.cause, WaitCause::GroupCannotFit);
    assert!(
        w.reason.contains("budget zone-a allows 2 nodes in maintenance at once (maxParallelOperations=2), 1 fewer than the node group needs"),
        "{}",
        w.reason
    );
}

#[test]
fn a_group_spanning_more_budget_groups_than_allowed_cannot_fit() {
    let mut requests = rack(&["g1", "g2"], 0);
    let mut nodes = vec![
        NodeState::for_test("node-g1", false, &[("zone", "a")]),
        NodeState::for_test("node-g2", false, &[("zone", "b")]),
    ];
    requests.push(pending("s", None, 10));
    nodes.push(NodeState::for_test("node-s", false, &[("zone", "c")]));
    let snap = Snapshot { nodes, requests };
    let limits = Limits {
        budgets: vec![budget(serde_json::json!({
            "name": "zones", "groupByLabel": "zone", "maxGroupsInMaintenance": 1
        }))],
        ..limits(10)
    };
    let decision = schedule(&snap, &limits, at(100)).expect("a decision");
    assert_eq!(admitted(&decision), ["s"]);
    let w = waiting(&decision, "g2");
    assert_eq!(w.cause, WaitCause::GroupCannotFit);
    assert!(
        w.reason.contains("maxGroupsInMaintenance=1") && w.reason.contains("1 fewer"),
        "{}",
        w.reason
    );
}

#[test]
fn a_group_held_by_a_budget_keeps_that_budget_only() {
    // zone a allows 2 at once and has one in maintenance: the group of two waits; the single in
    // zone a waits behind it, the one in zone b goes on.
    let mut requests = vec![request("busy", None, Phase::Draining, 0)];
    requests.extend(rack(&["g1", "g2"], 10));
    requests.push(pending("sa", None, 20));
    requests.push(pending("sb", None, 30));
    let zone = |name: &str, z: &str| NodeState::for_test(name, false, &[("zone", z)]);
    let nodes = vec![
        zone("node-busy", "a"),
        zone("node-g1", "a"),
        zone("node-g2", "a"),
        zone("node-sa", "a"),
        zone("node-sb", "b"),
    ];
    let snap = Snapshot { nodes, requests };
    let limits = Limits {
        budgets: vec![budget(serde_json::json!({
            "name": "zones", "groupByLabel": "zone", "maxParallelOperations": 2
        }))],
        ..limits(10)
    };
    let decision = schedule(&snap, &limits, at(100)).expect("a decision");
    assert_eq!(admitted(&decision), ["sb"]);
    let g = waiting(&decision, "g1");
    assert_eq!(g.cause, WaitCause::MaxParallelOperations);
    assert_eq!(g.budget.as_deref(), Some("zones"));
    assert!(g.reason.contains("node group \"rack-a\""), "{}", g.reason);
    assert_eq!(waiting(&decision, "sa").cause, WaitCause::BehindGroup);
}

#[test]
fn a_group_waiting_for_a_member_node_held_by_another_request_keeps_nothing() {
    let mut requests = vec![request("other", None, Phase::Draining, 0)];
    requests[0].node_name = "node-g2".to_string();
    requests.extend(rack(&["g1", "g2"], 10));
    requests.push(pending("s", None, 20));
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(5), at(100)).expect("a decision");
    assert_eq!(admitted(&decision), ["s"]);
    let g1 = waiting(&decision, "g1");
    assert_eq!(g1.cause, WaitCause::NodeInMaintenance);
    assert!(
        g1.reason
            .contains("waits for its request team/g2: node node-g2 is under maintenance"),
        "{}",
        g1.reason
    );
}

#[test]
fn a_group_waits_for_the_requests_its_size_annotation_announces() {
    let mut requests = rack(&["g1", "g2"], 0);
    for r in &mut requests {
        r.node_group.as_mut().expect("grouped").expected_size = Some(3);
    }
    let snap = snapshot(requests.clone(), &[]);
    let decision = schedule(&snap, &limits(5), at(30)).expect("a decision");
    assert!(admitted(&decision).is_empty());
    let w = waiting(&decision, "g1");
    assert_eq!(w.cause, WaitCause::GroupIncomplete);
    assert!(w.reason.contains("has 2 of the 3 requests"), "{}", w.reason);
    // The gathering ends a minute after the oldest request: a round is due then.
    assert!(
        w.reason.contains(&format!("until {:.0}", at(60))),
        "{}",
        w.reason
    );
    assert_eq!(decision.next_admission_retry, Some(at(60)));

    requests.push(pending("g3", Some("rack-a"), 5));
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(5), at(31)).expect("a decision");
    assert_eq!(admitted(&decision), ["g1", "g2", "g3"]);
}

#[test]
fn a_group_that_lacks_requests_goes_without_them_once_its_gathering_ends() {
    let mut requests = rack(&["g1", "g2"], 0);
    for r in &mut requests {
        r.node_group.as_mut().expect("grouped").expected_size = Some(3);
    }
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(5), at(59)).expect("a decision");
    assert!(admitted(&decision).is_empty());
    let decision = schedule(&snap, &limits(5), at(60)).expect("a decision");
    assert_eq!(admitted(&decision), ["g1", "g2"]);
}

#[test]
fn the_pending_rest_of_a_started_group_waits_for_no_one() {
    // g1 was admitted with the group; g2's admission failed and it is Pending again. When g1 is
    // done and gone, g2 is still admitted: it does not wait for a third request for ever.
    let mut requests = rack(&["g1", "g2"], 0);
    requests[0].phase = Phase::Draining;
    for r in &mut requests {
        r.node_group.as_mut().expect("grouped").expected_size = Some(2);
    }
    let snap = snapshot(requests.clone(), &[]);
    let decision = schedule(&snap, &limits(5), at(1)).expect("a decision");
    assert_eq!(admitted(&decision), ["g2"]);
    let snap = snapshot(requests[1..].to_vec(), &[]);
    let decision = schedule(&snap, &limits(5), at(70)).expect("a decision");
    assert_eq!(admitted(&decision), ["g2"]);
}

#[test]
fn two_requests_of_a_group_on_one_node_cannot_fit() {
    let mut requests = rack(&["g1", "g2"], 0);
    requests[1].node_name = "node-g1".to_string();
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(5), at(100)).expect("a decision");
    let w = waiting(&decision, "g2");
    assert_eq!(w.cause, WaitCause::GroupCannotFit);
    assert!(
        w.reason
            .contains("two of its requests are for node node-g1"),
        "{}",
        w.reason
    );
}

#[test]
fn groups_and_singles_keep_their_order() {
    // s1 (oldest), the group, then s2: with 3 slots s1 and the group take them all.
    let mut requests = vec![pending("s1", None, 0)];
    requests.extend(rack(&["g1", "g2"], 10));
    requests.push(pending("s2", None, 20));
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(3), at(100)).expect("a decision");
    assert_eq!(admitted(&decision), ["s1", "g1", "g2"]);
    assert_eq!(
        waiting(&decision, "s2").cause,
        WaitCause::MaxParallelOperations
    );
}

#[test]
fn groups_of_the_same_name_in_two_namespaces_are_two_groups() {
    let mut requests = rack(&["g1", "g2"], 0);
    requests[1].namespace = "other".to_string();
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(1), at(100)).expect("a decision");
    assert_eq!(admitted(&decision), ["g1"]);
    assert_eq!(decision.node_groups.len(), 2);
}

#[test]
fn the_rest_of_a_group_is_admitted_together_after_one_of_it_yielded_or_failed() {
    // Members already in maintenance do not hold the Pending rest back.
    let mut requests = rack(&["g1", "g2", "g3"], 0);
    requests[0].phase = Phase::Draining;
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(3), at(100)).expect("a decision");
    assert_eq!(admitted(&decision), ["g2", "g3"]);
}

#[test]
fn a_node_group_is_in_the_plan_json() {
    let mut requests = vec![request("busy", None, Phase::Draining, 0)];
    requests.extend(rack(&["g1", "g2"], 10));
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(2), at(100)).expect("a decision");
    let json = serde_json::to_value(&decision).expect("json");
    assert_eq!(
        json["nodeGroups"],
        serde_json::json!([{
            "namespace": "team", "name": "rack-a", "pending": 2,
            "requests": ["team/g1", "team/g2"],
            "admitted": false, "cause": "maxParallelOperations"
        }])
    );
    assert_eq!(json["waiting"][0]["nodeGroup"], "rack-a");
    assert_eq!(json["waiting"][0]["cause"], "maxParallelOperations");
}

#[test]
fn a_group_is_sent_whole_or_not_at_all() {
    let mut requests = rack(&["g1", "g2"], 0);
    requests.push(pending("s", None, 10));
    let snap = snapshot(requests, &[]);
    let decision = schedule(&snap, &limits(5), at(100)).expect("a decision");
    assert_eq!(admitted(&decision), ["g1", "g2", "s"]);
    let names =
        |keys: Vec<&RequestKey>| -> Vec<String> { keys.iter().map(|k| k.name.clone()).collect() };
    assert_eq!(
        names(admissions_to_send(&decision, |_| true)),
        ["g1", "g2", "s"]
    );
    // A write of ours to g2 is not seen yet: neither g1 nor g2 is sent this round.
    assert_eq!(
        names(admissions_to_send(&decision, |k| k.name != "g2")),
        ["s"]
    );
}
