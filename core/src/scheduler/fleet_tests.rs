//! Budgets and maintenance windows in the scheduler: a test per rule, and properties (no budget
//! is ever exceeded; without budgets and windows the decision is the old scheduler's).

use super::legacy::legacy_schedule;
use super::*;
use crate::budgets::{GroupCount, GroupStatus};
use crate::drainability::{DrainBlocker, PreferDrainable};
use crate::fixtures::{at, time, waiting};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use maintenance_crds::{Budget, MaintenanceWindow, Phase};

pub(super) const NAMESPACE: &str = "team";
const ZONE: &str = "topology.kubernetes.io/zone";
const POOL: &str = "pool";

pub(super) fn key(name: &str) -> RequestKey {
    RequestKey {
        namespace: NAMESPACE.to_string(),
        name: name.to_string(),
    }
}

fn keys(names: &[&str]) -> Vec<RequestKey> {
    names.iter().map(|n| key(n)).collect()
}

fn int(value: i32) -> IntOrString {
    IntOrString::Int(value)
}

fn percent(value: &str) -> IntOrString {
    IntOrString::String(value.to_string())
}

fn unlimited() -> Limits {
    Limits {
        max_parallel_operations: int(100),
        ..Limits::default()
    }
}

fn budget(name: &str) -> Budget {
    Budget {
        name: name.to_string(),
        ..Budget::default()
    }
}

fn match_labels(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        match_expressions: None,
    })
}

fn window(schedule: &str, duration: &str, time_zone: Option<&str>) -> MaintenanceWindow {
    MaintenanceWindow {
        schedule: Some(schedule.to_string()),
        duration: Some(duration.to_string()),
        time_zone: time_zone.map(str::to_string),
        ..MaintenanceWindow::default()
    }
}

/// Zones a (n0-n2) and b (n3-n5), all healthy.
fn two_zones() -> Vec<NodeState> {
    (0..6)
        .map(|i| {
            NodeState::for_test(
                &format!("n{i}"),
                false,
                &[(ZONE, if i < 3 { "a" } else { "b" })],
            )
        })
        .collect()
}

fn one_zone_at_a_time(limit_field: fn(&mut Budget)) -> Limits {
    let mut zones = budget("zones");
    zones.group_by_label = Some(ZONE.to_string());
    limit_field(&mut zones);
    Limits {
        budgets: vec![zones],
        ..unlimited()
    }
}

fn decide(nodes: Vec<NodeState>, requests: Vec<RequestState>, limits: &Limits) -> Decision {
    schedule(&Snapshot { nodes, requests }, limits, at(0)).unwrap()
}

#[test]
fn one_zone_unavailable_at_a_time_admits_only_the_first_zone() {
    let limits = one_zone_at_a_time(|b| b.max_unavailable_groups = Some(1));
    // Interleaved zones, oldest first: n0 (a), n3 (b), n1 (a), n4 (b).
    let requests = vec![
        RequestState::for_test("a0", "n0", Phase::Pending, 0),
        RequestState::for_test("b3", "n3", Phase::Pending, 1),
        RequestState::for_test("a1", "n1", Phase::Pending, 2),
        RequestState::for_test("b4", "n4", Phase::Pending, 3),
    ];
    let decision = decide(two_zones(), requests, &limits);
    assert_eq!(decision.scheduled, keys(&["a0", "a1"]));
    let held = waiting(&decision, "b3");
    assert_eq!(held.cause, WaitCause::MaxUnavailableGroups);
    assert_eq!(held.budget.as_deref(), Some("zones"));
    assert_eq!(held.group.as_deref(), Some("b"));
    assert_eq!(
        held.reason,
        "maxUnavailableGroups of budget zones reached: node n3 is in topology.kubernetes.io/zone=b, \
         but maxUnavailableGroups=1 and 1 group has unavailable nodes (a)"
    );
}

#[test]
fn zone_b_goes_once_zone_a_is_released() {
    let limits = one_zone_at_a_time(|b| b.max_unavailable_groups = Some(1));
    // Zone a still in maintenance: zone b waits.
    let busy = vec![
        RequestState::for_test("a0", "n0", Phase::Ready, 0),
        RequestState::for_test("b3", "n3", Phase::Pending, 1),
    ];
    let decision = decide(two_zones(), busy, &limits);
    assert!(decision.scheduled.is_empty());
    assert_eq!(
        waiting(&decision, "b3").cause,
        WaitCause::MaxUnavailableGroups
    );
    // Released (the request is gone, the node uncordoned): zone b goes.
    let released = vec![RequestState::for_test("b3", "n3", Phase::Pending, 1)];
    assert_eq!(
        decide(two_zones(), released, &limits).scheduled,
        keys(&["b3"])
    );
}

#[test]
fn a_broken_node_makes_its_zone_unavailable_but_not_in_maintenance() {
    let mut nodes = two_zones();
    nodes[1].unavailable = true; // n1 in zone a is cordoned by someone else
    let requests = vec![
        RequestState::for_test("b3", "n3", Phase::Pending, 0),
        RequestState::for_test("a0", "n0", Phase::Pending, 1),
    ];
    // Unavailable groups: zone a already is, so zone b must wait and zone a may go.
    let decision = decide(
        nodes.clone(),
        requests.clone(),
        &one_zone_at_a_time(|b| b.max_unavailable_groups = Some(1)),
    );
    assert_eq!(decision.scheduled, keys(&["a0"]));
    assert_eq!(
        waiting(&decision, "b3").cause,
        WaitCause::MaxUnavailableGroups
    );
    // Groups in maintenance: the broken node is no maintenance, so the oldest request goes.
    let decision = decide(
        nodes,
        requests,
        &one_zone_at_a_time(|b| b.max_groups_in_maintenance = Some(1)),
    );
    assert_eq!(decision.scheduled, keys(&["b3"]));
    let held = waiting(&decision, "a0");
    assert_eq!(held.cause, WaitCause::MaxGroupsInMaintenance);
    assert_eq!(
        held.reason,
        "maxGroupsInMaintenance of budget zones reached: node n0 is in topology.kubernetes.io/zone=a, \
         but maxGroupsInMaintenance=1 and 1 group has nodes in maintenance (b)"
    );
}

#[test]
fn ten_percent_of_each_pool_rounds_up_per_pool() {
    // gpu: 20 nodes -> 2 at a time; cpu: 5 nodes -> 10% of 5 rounds up to 1.
    let mut nodes: Vec<NodeState> = (0..20)
        .map(|i| NodeState::for_test(&format!("gpu-{i:02}"), false, &[(POOL, "gpu")]))
        .collect();
    nodes.extend((0..5).map(|i| NodeState::for_test(&format!("cpu-{i}"), false, &[(POOL, "cpu")])));
    let mut pools = budget("pools");
    pools.group_by_label = Some(POOL.to_string());
    pools.max_parallel_operations = Some(percent("10%"));
    let limits = Limits {
        budgets: vec![pools],
        ..unlimited()
    };
    let mut requests: Vec<RequestState> = (0..4)
        .map(|i| {
            RequestState::for_test(&format!("g{i}"), &format!("gpu-{i:02}"), Phase::Pending, i)
        })
        .collect();
    requests.extend((0..3).map(|i| {
        RequestState::for_test(
            &format!("c{i}"),
            &format!("cpu-{i}"),
            Phase::Pending,
            10 + i,
        )
    }));
    let decision = decide(nodes, requests, &limits);
    assert_eq!(decision.scheduled, keys(&["g0", "g1", "c0"]));
    let held = waiting(&decision, "g2");
    assert_eq!(held.cause, WaitCause::MaxParallelOperations);
    assert_eq!(held.group.as_deref(), Some("gpu"));
    assert_eq!(
        held.reason,
        "no free slot in budget pools (pool=gpu): maxParallelOperations=10% (2 of 20 nodes) and \
         0 nodes are in maintenance, 2 more admitted in this round"
    );
    assert_eq!(waiting(&decision, "c1").group.as_deref(), Some("cpu"));
    assert_eq!(
        decision.budgets[0].groups,
        [
            GroupStatus {
                group: Some("cpu".to_string()),
                nodes: 5,
                in_maintenance: 0,
                unavailable: 0,
                available_slots: Some(1),
                can_become_unavailable: None,
            },
            GroupStatus {
                group: Some("gpu".to_string()),
                nodes: 20,
                in_maintenance: 0,
                unavailable: 0,
                available_slots: Some(2),
                can_become_unavailable: None,
            },
        ]
    );
}

#[test]
fn a_budget_limits_only_the_nodes_it_selects() {
    let nodes = vec![
        NodeState::for_test("gpu-0", false, &[(POOL, "gpu")]),
        NodeState::for_test("gpu-1", false, &[(POOL, "gpu")]),
        NodeState::for_test("cpu-0", false, &[(POOL, "cpu")]),
        NodeState::for_test("cpu-1", false, &[(POOL, "cpu")]),
    ];
    let mut gpu = budget("gpu");
    gpu.node_selector = match_labels(&[(POOL, "gpu")]);
    gpu.max_parallel_operations = Some(int(1));
    let limits = Limits {
        budgets: vec![gpu],
        ..unlimited()
    };
    let requests = ["gpu-0", "gpu-1", "cpu-0", "cpu-1"]
        .iter()
        .zip(0..)
        .map(|(n, i)| RequestState::for_test(n, n, Phase::Pending, i))
        .collect();
    let decision = decide(nodes, requests, &limits);
    assert_eq!(decision.scheduled, keys(&["gpu-0", "cpu-0", "cpu-1"]));
    let held = waiting(&decision, "gpu-1");
    assert_eq!(held.budget.as_deref(), Some("gpu"));
    assert_eq!(
        held.group, None,
        "a budget without groupByLabel has no group"
    );
    assert_eq!(
        held.reason,
        "no free slot in budget gpu: maxParallelOperations=1 and 0 nodes are in maintenance, 1 more admitted in this round"
    );
}

#[test]
fn budget_max_unavailable_counts_its_own_unavailable_nodes_and_rounds_down() {
    // 9 gpu nodes, one cordoned; maxUnavailable 25% of 9 = 2 (rounded down): one more may go.
    let mut nodes: Vec<NodeState> = (0..9)
        .map(|i| NodeState::for_test(&format!("gpu-{i}"), i == 8, &[(POOL, "gpu")]))
        .collect();
    // A cordoned node outside the budget does not count against it.
    nodes.push(NodeState::for_test("cpu-0", true, &[(POOL, "cpu")]));
    let mut gpu = budget("gpu");
    gpu.node_selector = match_labels(&[(POOL, "gpu")]);
    gpu.max_unavailable = Some(percent("25%"));
    let limits = Limits {
        budgets: vec![gpu],
        ..unlimited()
    };
    let requests = vec![
        RequestState::for_test("a", "gpu-0", Phase::Pending, 0),
        RequestState::for_test("b", "gpu-1", Phase::Pending, 1),
        // On the already-unavailable node: uses no room.
        RequestState::for_test("c", "gpu-8", Phase::Pending, 2),
    ];
    let decision = decide(nodes, requests, &limits);
    assert_eq!(decision.scheduled, keys(&["a", "c"]));
    let held = waiting(&decision, "b");
    assert_eq!(held.cause, WaitCause::MaxUnavailable);
    assert_eq!(
        held.reason,
        "maxUnavailable of budget gpu reached: node gpu-1 would become unavailable, but \
         maxUnavailable=25% (2 of 9 nodes) and 1 node is unavailable, 1 more becoming unavailable in this round"
    );
}

#[test]
fn every_covering_budget_must_have_room_and_the_first_full_one_is_named() {
    let nodes = two_zones();
    let mut all = budget("all");
    all.max_parallel_operations = Some(int(5));
    let mut zone_a = budget("zone-a");
    zone_a.node_selector = match_labels(&[(ZONE, "a")]);
    zone_a.max_parallel_operations = Some(int(1));
    let limits = Limits {
        budgets: vec![all, zone_a],
        ..unlimited()
    };
    let requests = vec![
        RequestState::for_test("a0", "n0", Phase::Pending, 0),
        RequestState::for_test("a1", "n1", Phase::Pending, 1),
        RequestState::for_test("b3", "n3", Phase::Pending, 2),
    ];
    let decision = decide(nodes, requests, &limits);
    assert_eq!(decision.scheduled, keys(&["a0", "b3"]));
    assert_eq!(waiting(&decision, "a1").budget.as_deref(), Some("zone-a"));
}

#[test]
fn the_cluster_wide_limits_still_apply_and_are_named_first() {
    let limits = Limits {
        max_parallel_operations: int(1),
        ..one_zone_at_a_time(|b| b.max_unavailable_groups = Some(1))
    };
    let requests = vec![
        RequestState::for_test("a0", "n0", Phase::Pending, 0),
        RequestState::for_test("a1", "n1", Phase::Pending, 1),
    ];
    let decision = decide(two_zones(), requests, &limits);
    assert_eq!(decision.scheduled, keys(&["a0"]));
    let held = waiting(&decision, "a1");
    assert_eq!(held.cause, WaitCause::MaxParallelOperations);
    assert_eq!(held.budget, None);
}

#[test]
fn covered_nodes_without_the_label_form_a_group_of_their_own() {
    let mut nodes = two_zones();
    nodes.push(NodeState::for_test("bare", false, &[]));
    let limits = one_zone_at_a_time(|b| b.max_groups_in_maintenance = Some(1));
    let requests = vec![
        RequestState::for_test("bare", "bare", Phase::Pending, 0),
        RequestState::for_test("a0", "n0", Phase::Pending, 1),
    ];
    let decision = decide(nodes, requests, &limits);
    assert_eq!(decision.scheduled, keys(&["bare"]));
    let held = waiting(&decision, "a0");
    assert!(
        held.reason
            .ends_with("1 group has nodes in maintenance (<none>)"),
        "{}",
        held.reason
    );
    assert_eq!(
        decision.budgets[0].groups_in_maintenance,
        Some(GroupCount { count: 0, limit: 1 })
    );
    assert_eq!(
        decision.budgets[0].groups[0].group.as_deref(),
        Some(""),
        "the unlabelled group"
    );
}

#[test]
fn a_reason_names_a_few_groups_not_all() {
    let zones = ["a", "b", "c", "d", "e", "f"];
    let nodes: Vec<NodeState> = zones
        .iter()
        .map(|z| NodeState::for_test(&format!("n-{z}"), false, &[(ZONE, z)]))
        .collect();
    let mut requests: Vec<RequestState> = zones[..5]
        .iter()
        .map(|z| RequestState::for_test(z, &format!("n-{z}"), Phase::Draining, 0))
        .collect();
    requests.push(RequestState::for_test("f", "n-f", Phase::Pending, 0));
    let decision = decide(
        nodes,
        requests,
        &one_zone_at_a_time(|b| b.max_groups_in_maintenance = Some(2)),
    );
    assert!(
        waiting(&decision, "f").reason.ends_with(
            "maxGroupsInMaintenance=2 and 5 groups have nodes in maintenance (a, b, c and 2 more)"
        ),
        "{:?}",
        waiting(&decision, "f")
    );
}

#[test]
fn outside_the_cluster_windows_nothing_is_admitted_and_the_next_opening_is_named() {
    let limits = Limits {
        maintenance_windows: vec![window("0 1 * * *", "2h", Some("Europe/Berlin"))],
        ..unlimited()
    };
    let nodes = two_zones();
    let requests = vec![
        RequestState::for_test("a0", "n0", Phase::Pending, 0),
        // Work in progress is no admission: it stays as it is.
        RequestState::for_test("b3", "n3", Phase::Draining, 0),
    ];
    let snapshot = Snapshot { nodes, requests };
    let noon = schedule(&snapshot, &limits, time("2026-01-15T12:00:00Z")).unwrap();
    assert!(noon.scheduled.is_empty());
    let held = waiting(&noon, "a0");
    assert_eq!(held.cause, WaitCause::MaintenanceWindows);
    assert_eq!(held.budget, None);
    assert_eq!(
        held.reason,
        "outside the maintenance windows: the next opens at 2026-01-16 01:00 CET (Europe/Berlin)"
    );
    assert_eq!(noon.next_window_opening, Some(time("2026-01-16T00:00:00Z")));
    assert_eq!(
        noon.maintenance_windows,
        Some(WindowStatus {
            open: false,
            next_opening: Some("2026-01-16T01:00:00+01:00[Europe/Berlin]".to_string()),
        })
    );
    let night = schedule(&snapshot, &limits, time("2026-01-16T00:30:00Z")).unwrap();
    assert_eq!(night.scheduled, keys(&["a0"]));
    assert_eq!(night.next_window_opening, None);
}

#[test]
fn a_budget_window_holds_only_the_nodes_it_covers() {
    let mut zone_b = budget("zone-b-nights");
    zone_b.node_selector = match_labels(&[(ZONE, "b")]);
    zone_b.maintenance_windows = Some(vec![window("0 22 * * *", "4h", None)]);
    let limits = Limits {
        budgets: vec![zone_b],
        ..unlimited()
    };
    let requests = vec![
        RequestState::for_test("a0", "n0", Phase::Pending, 0),
        RequestState::for_test("b3", "n3", Phase::Pending, 1),
    ];
    let snapshot = Snapshot {
        nodes: two_zones(),
        requests,
    };
    let day = schedule(&snapshot, &limits, time("2026-01-15T12:00:00Z")).unwrap();
    assert_eq!(day.scheduled, keys(&["a0"]));
    let held = waiting(&day, "b3");
    assert_eq!(held.budget.as_deref(), Some("zone-b-nights"));
    assert_eq!(
        held.reason,
        "outside the maintenance windows of budget zone-b-nights: the next opens at 2026-01-15 22:00 UTC"
    );
    assert_eq!(day.next_window_opening, Some(time("2026-01-15T22:00:00Z")));
    let night = schedule(&snapshot, &limits, time("2026-01-16T01:00:00Z")).unwrap();
    assert_eq!(night.scheduled, keys(&["a0", "b3"]));
}

#[test]
fn both_levels_must_be_open() {
    let mut zone_b = budget("zone-b");
    zone_b.node_selector = match_labels(&[(ZONE, "b")]);
    zone_b.maintenance_windows = Some(vec![window("0 22 * * *", "1h", None)]);
    let limits = Limits {
        budgets: vec![zone_b],
        maintenance_windows: vec![window("0 12 * * *", "1h", None)],
        ..unlimited()
    };
    let snapshot = Snapshot {
        nodes: two_zones(),
        requests: vec![RequestState::for_test("b3", "n3", Phase::Pending, 0)],
    };
    for now in ["2026-01-15T12:30:00Z", "2026-01-15T22:30:00Z"] {
        let decision = schedule(&snapshot, &limits, time(now)).unwrap();
        assert!(decision.scheduled.is_empty(), "{now}");
    }
}

#[test]
fn an_unusable_budget_or_window_stops_admission_and_says_what_to_fix() {
    let snapshot = Snapshot {
        nodes: two_zones(),
        requests: vec![RequestState::for_test("a0", "n0", Phase::Pending, 0)],
    };
    let mut bad_selector = budget("gpu");
    bad_selector.node_selector = Some(LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: POOL.to_string(),
            operator: "In".to_string(),
            values: None,
        }]),
    });
    let mut ungrouped = budget("zones");
    ungrouped.max_unavailable_groups = Some(1);
    let mut bad_percent = budget("pools");
    bad_percent.max_unavailable = Some(percent("lots"));
    let mut bad_window = budget("nights");
    bad_window.maintenance_windows = Some(vec![window("0 1 * * *", "1h", Some("Mars/Olympus"))]);
    let cases = [
        (
            vec![bad_selector],
            vec![],
            "invalid budget \"gpu\": nodeSelector: matchExpressions[0]: operator In needs at least one value",
        ),
        (
            vec![ungrouped],
            vec![],
            "invalid budget \"zones\": maxGroupsInMaintenance and maxUnavailableGroups count groups: set groupByLabel too",
        ),
        (
            vec![bad_percent],
            vec![],
            "invalid budget \"pools\": maxUnavailable: \"lots\" is neither",
        ),
        (
            vec![bad_window],
            vec![],
            "invalid budget \"nights\": maintenanceWindows[0].timeZone \"Mars/Olympus\" is not an IANA time zone",
        ),
        (
            vec![budget("twice"), budget("twice")],
            vec![],
            "invalid budget \"twice\": the name is used by two budgets",
        ),
        (
            vec![],
            vec![window("every night", "1h", None)],
            "invalid window: maintenanceWindows[0].schedule \"every night\" is not a 5-field crontab expression",
        ),
    ];
    for (budgets, maintenance_windows, expected) in cases {
        let limits = Limits {
            budgets,
            maintenance_windows,
            ..unlimited()
        };
        let error = schedule(&snapshot, &limits, at(0)).unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
        assert!(
            error.contains("kubectl edit maintenanceoperatorconfig default"),
            "{error}"
        );
    }
}

fn blocker(pdb: &str) -> DrainBlocker {
    DrainBlocker {
        pod: "app/web-1".to_string(),
        pdb: pdb.to_string(),
        disruptions_allowed: 0,
    }
}

fn prefer(blocked: &[(&str, &str)]) -> PreferDrainable {
    PreferDrainable {
        enabled: true,
        max_pass_over_seconds: 600,
        blocked: blocked
            .iter()
            .map(|(name, pdb)| (key(name), blocker(pdb)))
            .collect(),
    }
}

#[test]
fn prefer_drainable_admits_a_drainable_node_before_an_older_blocked_one() {
    let snapshot = Snapshot {
        nodes: vec![
            NodeState::for_test("n1", false, &[]),
            NodeState::for_test("n2", false, &[]),
        ],
        requests: vec![
            RequestState::for_test("old", "n1", Phase::Pending, 0),
            RequestState::for_test("new", "n2", Phase::Pending, 10),
        ],
    };
    let limits = Limits {
        max_parallel_operations: int(1),
        ..Limits::default()
    };
    let decision =
        schedule_with(&snapshot, &limits, &prefer(&[("old", "app/web")]), at(60)).unwrap();
    assert_eq!(decision.scheduled, keys(&["new"]));
    assert_eq!(decision.waiting.len(), 1);
    let waiting = &decision.waiting[0];
    assert_eq!(waiting.cause, WaitCause::DrainBlocked);
    assert!(
        waiting.reason.starts_with(
            "passed over for nodes whose drain can proceed until 2023-11-14T22:23:20Z: evicting pod app/web-1 would wait on PodDisruptionBudget app/web (0 disruptions allowed) (no free slot: maxParallelOperations=1"
        ),
        "{}",
        waiting.reason
    );
    assert!(
        waiting
            .reason
            .contains("(no free slot: maxParallelOperations=1"),
        "{}",
        waiting.reason
    );

    // Off: the plain order.
    let off = PreferDrainable {
        enabled: false,
        ..prefer(&[("old", "app/web")])
    };
    let decision = schedule_with(&snapshot, &limits, &off, at(60)).unwrap();
    assert_eq!(decision.scheduled, keys(&["old"]));
}

#[test]
fn a_passed_over_request_ages_and_wins() {
    let snapshot = Snapshot {
        nodes: vec![
            NodeState::for_test("n1", false, &[]),
            NodeState::for_test("n2", false, &[]),
        ],
        requests: vec![
            RequestState::for_test("old", "n1", Phase::Pending, 0),
            RequestState::for_test("new", "n2", Phase::Pending, 10),
        ],
    };
    let limits = Limits {
        max_parallel_operations: int(1),
        ..Limits::default()
    };
    let prefer = prefer(&[("old", "app/web")]);
    let decision = schedule_with(&snapshot, &limits, &prefer, at(599)).unwrap();
    assert_eq!(decision.scheduled, keys(&["new"]));
    let decision = schedule_with(&snapshot, &limits, &prefer, at(600)).unwrap();
    assert_eq!(decision.scheduled, keys(&["old"]));
    assert_eq!(decision.waiting[0].cause, WaitCause::MaxParallelOperations);
}

#[test]
fn a_blocked_request_still_takes_a_slot_nobody_else_wants() {
    let snapshot = Snapshot {
        nodes: vec![
            NodeState::for_test("n1", false, &[]),
            NodeState::for_test("n2", false, &[]),
        ],
        requests: vec![
            RequestState::for_test("a", "n1", Phase::Pending, 0),
            RequestState::for_test("b", "n2", Phase::Pending, 10),
        ],
    };
    let limits = Limits {
        max_parallel_operations: int(2),
        ..Limits::default()
    };
    let decision = schedule_with(
        &snapshot,
        &limits,
        &prefer(&[("a", "app/web"), ("b", "app/db")]),
        at(0),
    )
    .unwrap();
    assert_eq!(decision.scheduled, keys(&["a", "b"]));
}

mod properties {
    use super::*;
    use crate::fixtures::{arb_phase, int_or_percent, resolve_limit};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// The node selectors the properties use, matched here without the scheduler's code.
    #[derive(Debug, Clone, Copy)]
    enum Select {
        All,
        Gpu,
        NotGpu,
        Zoned,
    }

    impl Select {
        fn label_selector(self) -> Option<LabelSelector> {
            let expression = |operator: &str, key: &str, values: &[&str]| LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: key.to_string(),
                    operator: operator.to_string(),
                    values: (!values.is_empty())
                        .then(|| values.iter().map(|v| v.to_string()).collect()),
                }]),
            };
            match self {
                Select::All => None,
                Select::Gpu => match_labels(&[(POOL, "gpu")]),
                Select::NotGpu => Some(expression("NotIn", POOL, &["gpu"])),
                Select::Zoned => Some(expression("Exists", ZONE, &[])),
            }
        }

        fn matches(self, node: &NodeState) -> bool {
            match self {
                Select::All => true,
                Select::Gpu => node.labels.get(POOL).is_some_and(|p| p == "gpu"),
                Select::NotGpu => node.labels.get(POOL).is_none_or(|p| p != "gpu"),
                Select::Zoned => node.labels.contains_key(ZONE),
            }
        }
    }

    /// Windows that are open or closed at any time the properties use.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Window {
        None,
        AlwaysOpen,
        Closed,
    }

    impl Window {
        fn specs(self) -> Vec<MaintenanceWindow> {
            match self {
                Window::None => Vec::new(),
                Window::AlwaysOpen => vec![window("* * * * *", "1h", None)],
                // New Year's first minute; `at(0)` is in November.
                Window::Closed => vec![window("0 0 1 1 *", "1m", Some("Europe/Berlin"))],
            }
        }
    }

    #[derive(Debug, Clone)]
    struct TestBudget {
        select: Select,
        group_by: Option<&'static str>,
        max_parallel_operations: Option<IntOrString>,
        max_unavailable: Option<IntOrString>,
        max_groups_in_maintenance: Option<i32>,
        max_unavailable_groups: Option<i32>,
        window: Window,
    }

    impl TestBudget {
        fn spec(&self, index: usize) -> Budget {
            Budget {
                name: format!("b{index}"),
                node_selector: self.select.label_selector(),
                group_by_label: self.group_by.map(str::to_string),
                max_parallel_operations: self.max_parallel_operations.clone(),
                max_unavailable: self.max_unavailable.clone(),
                max_groups_in_maintenance: self.max_groups_in_maintenance,
                max_unavailable_groups: self.max_unavailable_groups,
                maintenance_windows: Some(self.window.specs()),
            }
        }

        fn group(&self, node: &NodeState) -> String {
            self.group_by
                .and_then(|label| node.labels.get(label))
                .cloned()
                .unwrap_or_default()
        }
    }

    #[derive(Debug, Clone)]
    struct Case {
        snapshot: Snapshot,
        limits: Limits,
        budgets: Vec<TestBudget>,
        window: Window,
    }

    fn arb_budget() -> impl Strategy<Value = TestBudget> {
        let select = prop_oneof![
            Just(Select::All),
            Just(Select::Gpu),
            Just(Select::NotGpu),
            Just(Select::Zoned)
        ];
        let group_by = prop_oneof![Just(None), Just(Some(ZONE)), Just(Some(POOL))];
        let window = prop_oneof![
            4 => Just(Window::None),
            1 => Just(Window::AlwaysOpen),
            1 => Just(Window::Closed)
        ];
        (
            select,
            group_by,
            proptest::option::of(int_or_percent(4)),
            proptest::option::of(int_or_percent(4)),
            proptest::option::of(0..3i32),
            proptest::option::of(0..3i32),
            window,
        )
            .prop_map(
                |(select, group_by, parallel, unavailable, groups_busy, groups_down, window)| {
                    TestBudget {
                        select,
                        group_by,
                        max_parallel_operations: parallel,
                        max_unavailable: unavailable,
                        // Group counts need groups.
                        max_groups_in_maintenance: groups_busy.filter(|_| group_by.is_some()),
                        max_unavailable_groups: groups_down.filter(|_| group_by.is_some()),
                        window,
                    }
                },
            )
    }

    fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
        (0usize..12).prop_flat_map(|node_count| {
            let arb_node = (
                proptest::bool::weighted(0.2),
                proptest::sample::select(vec![None, Some("a"), Some("b"), Some("c")]),
                proptest::sample::select(vec![None, Some("gpu"), Some("cpu")]),
            );
            let nodes = proptest::collection::vec(arb_node, node_count);
            let request = (
                0..node_count + 2,
                0..3usize,
                arb_phase(),
                proptest::option::weighted(0.8, 0..4i64),
                proptest::bool::weighted(0.1),
            );
            let requests = proptest::collection::vec(request, 0..16);
            (nodes, requests).prop_map(|(nodes, requests)| Snapshot {
                nodes: nodes
                    .into_iter()
                    .enumerate()
                    .map(|(index, (unavailable, zone, pool))| {
                        let mut labels = Vec::new();
                        labels.extend(zone.map(|z| (ZONE, z)));
                        labels.extend(pool.map(|p| (POOL, p)));
                        NodeState::for_test(&format!("node-{index:02}"), unavailable, &labels)
                    })
                    .collect(),
                requests: requests
                    .into_iter()
                    .enumerate()
                    .map(
                        |(index, (node, requestor, phase, created, deleting))| RequestState {
                            namespace: NAMESPACE.to_string(),
                            name: format!("r{index}"),
                            node_name: format!("node-{node:02}"),
                            requestor_id: format!("requestor-{requestor}"),
                            phase,
                            created: created.map(at),
                            deleting,
                            // The legacy oracle predates both: left at what the objects give.
                            released: false,
                            admission_retry: None,
                            yielded: None,
                            node_group: None,
                        },
                    )
                    .collect(),
            })
        })
    }

    fn arb_case() -> impl Strategy<Value = Case> {
        (
            arb_snapshot(),
            int_or_percent(8),
            proptest::option::of(int_or_percent(8)),
            proptest::collection::vec(arb_budget(), 0..4),
            prop_oneof![
                4 => Just(Window::None),
                1 => Just(Window::AlwaysOpen),
                1 => Just(Window::Closed)
            ],
        )
            .prop_map(|(snapshot, parallel, unavailable, budgets, window)| Case {
                limits: Limits {
                    max_parallel_operations: parallel,
                    max_unavailable: unavailable,
                    budgets: budgets
                        .iter()
                        .enumerate()
                        .map(|(index, b)| b.spec(index))
                        .collect(),
                    maintenance_windows: window.specs(),
                    blackouts: Vec::new(),
                    yield_blocked_drain_after: None,
                    gate_hold: None,
                },
                snapshot,
                budgets,
                window,
            })
    }

    /// The cluster and every budget as the rules describe them, written independently of the
    /// scheduler: which sets of admissions are allowed.
    struct Rules<'c> {
        case: &'c Case,
        existing: BTreeSet<&'c str>,
        in_maintenance: BTreeSet<&'c str>,
        unavailable: BTreeSet<&'c str>,
    }

    impl<'c> Rules<'c> {
        fn new(case: &'c Case) -> Rules<'c> {
            let existing: BTreeSet<&str> = case
                .snapshot
                .nodes
                .iter()
                .map(|n| n.name.as_str())
                .collect();
            let in_maintenance: BTreeSet<&str> = case
                .snapshot
                .requests
                .iter()
                .filter(|r| r.phase != Phase::Pending && existing.contains(r.node_name.as_str()))
                .map(|r| r.node_name.as_str())
                .collect();
            let mut unavailable = in_maintenance.clone();
            unavailable.extend(
                case.snapshot
                    .nodes
                    .iter()
                    .filter(|n| n.unavailable)
                    .map(|n| n.name.as_str()),
            );
            Rules {
                case,
                existing,
                in_maintenance,
                unavailable,
            }
        }

        fn node(&self, name: &str) -> &'c NodeState {
            self.case
                .snapshot
                .nodes
                .iter()
                .find(|n| n.name == name)
                .unwrap()
        }

        fn eligible(&self, request: &RequestState) -> bool {
            request.phase == Phase::Pending
                && !request.deleting
                && self.existing.contains(request.node_name.as_str())
                && !self.in_maintenance.contains(request.node_name.as_str())
        }

        /// Whether admitting exactly `admitted` keeps every limit that had room, opens no node
        /// behind a closed window and takes one request per node.
        fn allows(&self, admitted: &[&RequestState]) -> Result<(), String> {
            let nodes: BTreeSet<&str> = admitted.iter().map(|r| r.node_name.as_str()).collect();
            if nodes.len() != admitted.len() {
                return Err("two requests on one node".into());
            }
            if let Some(bad) = admitted.iter().find(|r| !self.eligible(r)) {
                return Err(format!("{} is not eligible", bad.key()));
            }
            if !nodes.is_empty() && self.case.window == Window::Closed {
                return Err("admitted outside the cluster-wide windows".into());
            }
            let total = self.case.snapshot.nodes.len() as u64;
            let parallel = resolve_limit(&self.case.limits.max_parallel_operations, total, true);
            // Only the slots that were free may be used.
            if nodes.len() as u64 > parallel.saturating_sub(self.in_maintenance.len() as u64) {
                return Err("maxParallelOperations exceeded".into());
            }
            let newly: Vec<&str> = nodes
                .iter()
                .copied()
                .filter(|n| !self.unavailable.contains(n))
                .collect();
            if let Some(limit) = &self.case.limits.max_unavailable {
                let limit = resolve_limit(limit, total, false);
                if newly.len() as u64 > limit.saturating_sub(self.unavailable.len() as u64) {
                    return Err("maxUnavailable exceeded".into());
                }
            }
            for (index, budget) in self.case.budgets.iter().enumerate() {
                let covered: Vec<&NodeState> = self
                    .case
                    .snapshot
                    .nodes
                    .iter()
                    .filter(|n| budget.select.matches(n))
                    .collect();
                let admitted_here: Vec<&str> = nodes
                    .iter()
                    .copied()
                    .filter(|n| budget.select.matches(self.node(n)))
                    .collect();
                if !admitted_here.is_empty() && budget.window == Window::Closed {
                    return Err(format!("b{index}: admitted outside its windows"));
                }
                let mut groups: BTreeMap<String, Vec<&NodeState>> = BTreeMap::new();
                for node in &covered {
                    groups.entry(budget.group(node)).or_default().push(node);
                }
                let mut busy_before = 0;
                let mut busy_after = 0;
                let mut down_before = 0;
                let mut down_after = 0;
                for (group, members) in &groups {
                    let size = members.len() as u64;
                    let count = |set: &BTreeSet<&str>| {
                        members
                            .iter()
                            .filter(|n| set.contains(n.name.as_str()))
                            .count() as u64
                    };
                    let maintained = count(&self.in_maintenance);
                    let down = count(&self.unavailable);
                    let added: Vec<&str> = admitted_here
                        .iter()
                        .copied()
                        .filter(|n| budget.group(self.node(n)) == *group)
                        .collect();
                    let added_down = added
                        .iter()
                        .filter(|n| !self.unavailable.contains(**n))
                        .count() as u64;
                    if let Some(limit) = &budget.max_parallel_operations {
                        let limit = resolve_limit(limit, size, true);
                        if added.len() as u64 > limit.saturating_sub(maintained) {
                            return Err(format!(
                                "b{index} {group}: maxParallelOperations exceeded"
                            ));
                        }
                    }
                    if let Some(limit) = &budget.max_unavailable {
                        let limit = resolve_limit(limit, size, false);
                        if added_down > limit.saturating_sub(down) {
                            return Err(format!("b{index} {group}: maxUnavailable exceeded"));
                        }
                    }
                    busy_before += u64::from(maintained > 0);
                    busy_after += u64::from(maintained > 0 || !added.is_empty());
                    down_before += u64::from(down > 0);
                    down_after += u64::from(down > 0 || added_down > 0);
                }
                if let Some(limit) = budget.max_groups_in_maintenance {
                    let limit = u64::try_from(limit).unwrap();
                    if busy_after > busy_before && busy_after > limit {
                        return Err(format!("b{index}: maxGroupsInMaintenance exceeded"));
                    }
                }
                if let Some(limit) = budget.max_unavailable_groups {
                    let limit = u64::try_from(limit).unwrap();
                    if down_after > down_before && down_after > limit {
                        return Err(format!("b{index}: maxUnavailableGroups exceeded"));
                    }
                }
            }
            Ok(())
        }
    }

    fn find<'s>(snapshot: &'s Snapshot, key: &RequestKey) -> &'s RequestState {
        snapshot.requests.iter().find(|r| r.key() == *key).unwrap()
    }

    /// The round's decision for `case`, failing the case if what it admits breaks a rule.
    fn decide_within_rules(case: &Case) -> Result<Decision, TestCaseError> {
        let decision = schedule(&case.snapshot, &case.limits, at(0)).unwrap();
        let admitted: Vec<&RequestState> = decision
            .scheduled
            .iter()
            .map(|k| find(&case.snapshot, k))
            .collect();
        if let Err(broken) = Rules::new(case).allows(&admitted) {
            return Err(TestCaseError::fail(format!(
                "{broken}: {:?}",
                decision.scheduled
            )));
        }
        Ok(decision)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn no_budget_is_ever_exceeded(case in arb_case()) {
            decide_within_rules(&case)?;
        }

        #[test]
        fn nothing_that_fits_waits_and_the_order_is_kept(case in arb_case()) {
            let decision = schedule(&case.snapshot, &case.limits, at(0)).unwrap();
            let rules = Rules::new(&case);
            let admitted: Vec<&RequestState> =
                decision.scheduled.iter().map(|k| find(&case.snapshot, k)).collect();
            for waiting in &decision.waiting {
                let skipped = find(&case.snapshot, &waiting.key);
                let mut more = admitted.clone();
                more.push(skipped);
                prop_assert!(
                    rules.allows(&more).is_err(),
                    "{} waits ({}) although it fits", waiting.key, waiting.reason
                );
                // Every cause of a budget names the budget, and only those do.
                let by_budget = waiting.budget.is_some();
                let budget_cause = matches!(
                    waiting.cause,
                    WaitCause::MaxGroupsInMaintenance | WaitCause::MaxUnavailableGroups
                );
                prop_assert!(!budget_cause || by_budget, "{waiting:?}");
                if let Some(name) = &waiting.budget {
                    prop_assert!(waiting.reason.contains(&format!("budget {name}")), "{waiting:?}");
                }
            }
        }

        #[test]
        fn without_budgets_and_windows_the_decision_is_the_old_one(
            case in arb_case(),
            // Budgets that limit nothing and windows that are always open change nothing either.
            inert in proptest::bool::ANY,
            // preferDrainable off: blocked drains change nothing, however many there are.
            blocked_mask in proptest::num::u32::ANY,
        ) {
            let limits = Limits {
                budgets: if inert {
                    vec![Budget {
                        name: "inert".to_string(),
                        group_by_label: Some(ZONE.to_string()),
                        maintenance_windows: Some(Window::AlwaysOpen.specs()),
                        ..Budget::default()
                    }]
                } else {
                    Vec::new()
                },
                maintenance_windows: if inert { Window::AlwaysOpen.specs() } else { Vec::new() },
                ..case.limits.clone()
            };
            let prefer = PreferDrainable {
                enabled: false,
                max_pass_over_seconds: 600,
                blocked: blocked_by_mask(&case.snapshot, blocked_mask),
            };
            let new = schedule_with(&case.snapshot, &limits, &prefer, at(0)).unwrap();
            let old = legacy_schedule(&case.snapshot, &limits).unwrap();
            prop_assert_eq!(new.available_slots, old.available_slots);
            prop_assert_eq!(new.can_become_unavailable, old.can_become_unavailable);
            prop_assert_eq!(&new.scheduled, &old.scheduled);
            let reasons: Vec<(RequestKey, String)> = new
                .waiting
                .iter()
                .map(|w| (w.key.clone(), w.reason.clone()))
                .collect();
            prop_assert_eq!(reasons, old.waiting);
            prop_assert!(new.waiting.iter().all(|w| w.budget.is_none()));
            prop_assert_eq!(new.next_window_opening, None);
        }

        /// preferDrainable never passes over a request that has aged past the bound, and such a
        /// request is never worse off than in the plain order (with only the cluster-wide slot
        /// limit, it is admitted whenever the plain order admits it).
        #[test]
        fn no_request_is_passed_over_past_the_aging_bound(
            case in arb_case(),
            blocked_mask in proptest::num::u32::ANY,
            bound in 0i64..5,
            now in 0i64..8,
        ) {
            let prefer = PreferDrainable {
                enabled: true,
                max_pass_over_seconds: bound,
                blocked: blocked_by_mask(&case.snapshot, blocked_mask),
            };
            let now = at(now);
            let preferred = schedule_with(&case.snapshot, &case.limits, &prefer, now).unwrap();
            let plain = schedule(&case.snapshot, &case.limits, now).unwrap();
            // The same requests are decided, only the order may differ.
            prop_assert_eq!(
                preferred.scheduled.len() + preferred.waiting.len(),
                plain.scheduled.len() + plain.waiting.len()
            );
            for waiting in &preferred.waiting {
                let request = find(&case.snapshot, &waiting.key);
                if prefer.ages_at(request).is_none_or(|aged| now >= aged) {
                    prop_assert_ne!(waiting.cause, WaitCause::DrainBlocked, "{:?}", waiting);
                }
                if waiting.cause == WaitCause::DrainBlocked {
                    prop_assert!(prefer.blocked.contains_key(&waiting.key));
                    prop_assert!(waiting.reason.contains("PodDisruptionBudget"));
                }
            }
            let slots_only = Limits {
                max_parallel_operations: case.limits.max_parallel_operations.clone(),
                ..Limits::default()
            };
            let preferred = schedule_with(&case.snapshot, &slots_only, &prefer, now).unwrap();
            let plain = schedule(&case.snapshot, &slots_only, now).unwrap();
            prop_assert_eq!(preferred.scheduled.len(), plain.scheduled.len());
            for key in &plain.scheduled {
                let request = find(&case.snapshot, key);
                if prefer.pass_over(request, now).is_none() {
                    prop_assert!(preferred.scheduled.contains(key), "{key} lost its slot");
                }
            }
        }

        /// Node groups (`maintenance.nvidia.com/group`) break no limit or budget, are admitted
        /// whole or not at all, and each waiting request says why.
        #[test]
        fn node_groups_are_admitted_whole_and_break_no_limit(
            case in arb_case(),
            groups in proptest::collection::vec(proptest::option::weighted(0.6, 0..3u8), 16),
        ) {
            let mut case = case;
            for (request, group) in case.snapshot.requests.iter_mut().zip(&groups) {
                request.node_group = group.map(|g| NodeGroupLabel {
                    name: format!("rack-{g}"),
                    expected_size: None,
                });
            }
            let decision = decide_within_rules(&case)?;
            let mut members: BTreeMap<&str, Vec<RequestKey>> = BTreeMap::new();
            for request in case.snapshot.requests.iter().filter(|r| r.phase == Phase::Pending && !r.deleting) {
                if let Some(group) = &request.node_group {
                    members.entry(group.name.as_str()).or_default().push(request.key());
                }
            }
            for (group, keys) in &members {
                let taken = keys.iter().filter(|k| decision.scheduled.contains(k)).count();
                prop_assert!(taken == 0 || taken == keys.len(), "{group}: {taken} of {}", keys.len());
            }
            for waiting in &decision.waiting {
                let request = find(&case.snapshot, &waiting.key);
                if !request.deleting {
                    prop_assert_eq!(
                        waiting.node_group.as_deref(),
                        request.node_group.as_ref().map(|g| g.name.as_str())
                    );
                }
            }
        }
    }

    /// Marks Pending requests blocked by the bits of `mask`.
    fn blocked_by_mask(snapshot: &Snapshot, mask: u32) -> BTreeMap<RequestKey, DrainBlocker> {
        snapshot
            .requests
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << (i % 32)) != 0)
            .map(|(_, r)| {
                (
                    r.key(),
                    DrainBlocker {
                        pod: format!("app/{}-pod", r.name),
                        pdb: "app/pdb".to_string(),
                        disruptions_allowed: 0,
                    },
                )
            })
            .collect()
    }
}
