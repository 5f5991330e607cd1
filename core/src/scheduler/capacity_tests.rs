//! `checkCapacity` in the scheduler: a request waits when its drain's pods do not fit on the nodes
//! left, and says by how much; room is never counted twice in one round; nodes in maintenance,
//! unavailable nodes and drains in progress are accounted; with the check off nothing changes.

use super::fleet_tests::{NAMESPACE, key};
use super::*;
use crate::capacity::{CapacityCheck, CapacityNode, CapacityObserver, CapacityPod, Resources};
use crate::fixtures::{at, owned_by, pod, with_phase};
use k8s_openapi::api::core::v1::{
    Container, Node, NodeSpec, NodeStatus, Pod, ResourceRequirements, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use maintenance_crds::{DrainSpec, NodeMaintenanceSpec, Phase};

const GI: i64 = 1 << 30;

fn cpu(milli: i64) -> Resources {
    Resources {
        cpu_milli: milli,
        memory_bytes: GI,
    }
}

/// A node with 4 CPU and 16Gi allocatable and `used_milli` CPU requested.
fn room(name: &str, used_milli: i64) -> CapacityNode {
    CapacityNode {
        name: name.to_string(),
        labels: BTreeMap::new(),
        taints: Vec::new(),
        allocatable: Resources {
            cpu_milli: 4000,
            memory_bytes: 16 * GI,
        },
        requested: cpu(used_milli),
    }
}

fn pods(prefix: &str, sizes: &[i64]) -> Vec<CapacityPod> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, milli)| CapacityPod {
            key: format!("app/{prefix}-{i}"),
            requests: cpu(*milli),
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
        })
        .collect()
}

fn check(nodes: Vec<CapacityNode>, evictions: &[(&str, Vec<CapacityPod>)]) -> CapacityCheck {
    CapacityCheck {
        enabled: true,
        nodes,
        evictions: evictions
            .iter()
            .map(|(name, pods)| (key(name), pods.clone()))
            .collect(),
        unscheduled: Vec::new(),
        unreadable: None,
    }
}

fn unlimited() -> Limits {
    Limits {
        max_parallel_operations: IntOrString::Int(100),
        ..Limits::default()
    }
}

fn run(snapshot: &Snapshot, capacity: &CapacityCheck) -> Decision {
    schedule_observed(
        snapshot,
        &unlimited(),
        &PreferDrainable::default(),
        capacity,
        at(60),
    )
    .unwrap()
}

fn three_nodes(requests: Vec<RequestState>) -> Snapshot {
    Snapshot {
        nodes: vec![
            NodeState::for_test("n1", false, &[]),
            NodeState::for_test("n2", false, &[]),
            NodeState::for_test("n3", false, &[]),
        ],
        requests,
    }
}

#[test]
fn a_drain_whose_pods_do_not_fit_waits_and_says_by_how_much() {
    let snapshot = three_nodes(vec![RequestState::for_test("a", "n1", Phase::Pending, 0)]);
    // n1's pods need 5 CPU; n2 and n3 have 1 CPU free each.
    let capacity = check(
        vec![room("n1", 0), room("n2", 3000), room("n3", 3000)],
        &[("a", pods("web", &[2500, 2500]))],
    );
    let decision = run(&snapshot, &capacity);
    assert!(decision.scheduled.is_empty());
    assert_eq!(decision.waiting[0].cause, WaitCause::InsufficientCapacity);
    assert_eq!(
        decision.waiting[0].reason,
        "pods of n1 need 3 CPU more than the 2 remaining schedulable nodes have free; largest unplaceable pod app/web-0 needs 2500m CPU and 1Gi"
    );
    let status = decision.capacity.expect("the round reports capacity");
    assert_eq!(status.schedulable_nodes, 3);
}

#[test]
fn room_is_not_counted_twice_in_one_round() {
    // Each drain needs 3 CPU; n3 has 3 CPU free, n1 and n2 are emptied by the drains.
    let snapshot = three_nodes(vec![
        RequestState::for_test("a", "n1", Phase::Pending, 0),
        RequestState::for_test("b", "n2", Phase::Pending, 10),
    ]);
    let capacity = check(
        vec![room("n1", 3000), room("n2", 3000), room("n3", 1000)],
        &[
            ("a", pods("a", &[1500, 1500])),
            ("b", pods("b", &[1500, 1500])),
        ],
    );
    let decision = run(&snapshot, &capacity);
    // a's pods go to n2 (first fit) and n3... and then b's node is full of a's pods: b waits.
    assert_eq!(decision.scheduled, vec![key("a")]);
    assert_eq!(decision.waiting[0].key, key("b"));
    assert_eq!(decision.waiting[0].cause, WaitCause::InsufficientCapacity);
}

#[test]
fn capacity_added_later_admits_the_request() {
    let snapshot = three_nodes(vec![RequestState::for_test("a", "n1", Phase::Pending, 0)]);
    let mut capacity = check(
        vec![room("n1", 0), room("n2", 4000), room("n3", 4000)],
        &[("a", pods("web", &[1000]))],
    );
    assert!(run(&snapshot, &capacity).scheduled.is_empty());
    let mut grown = snapshot.clone();
    grown.nodes.push(NodeState::for_test("n4", false, &[]));
    capacity.nodes.push(room("n4", 0));
    assert_eq!(run(&grown, &capacity).scheduled, vec![key("a")]);
}

#[test]
fn nodes_in_maintenance_and_unavailable_nodes_take_no_pods() {
    let mut snapshot = three_nodes(vec![
        RequestState::for_test("busy", "n2", Phase::Draining, 0),
        RequestState::for_test("a", "n1", Phase::Pending, 10),
    ]);
    snapshot.nodes.push(NodeState::for_test("n4", true, &[])); // cordoned by someone else
    let capacity = check(
        vec![
            room("n1", 0),
            room("n2", 0),
            room("n3", 4000),
            room("n4", 0),
        ],
        &[("a", pods("web", &[1000]))],
    );
    let decision = run(&snapshot, &capacity);
    assert_eq!(decision.waiting[0].cause, WaitCause::InsufficientCapacity);
    assert_eq!(decision.capacity.map(|c| c.schedulable_nodes), Some(2));
}

#[test]
fn pods_that_drains_in_progress_will_evict_take_room_first() {
    let snapshot = three_nodes(vec![
        RequestState::for_test("busy", "n2", Phase::Draining, 0),
        RequestState::for_test("a", "n1", Phase::Pending, 10),
    ]);
    // n3 has 4 CPU free; busy's remaining 3 CPU of pods will land there first.
    let capacity = check(
        vec![room("n1", 0), room("n2", 3000), room("n3", 0)],
        &[("busy", pods("busy", &[3000])), ("a", pods("web", &[2000]))],
    );
    let decision = run(&snapshot, &capacity);
    assert_eq!(decision.waiting[0].cause, WaitCause::InsufficientCapacity);
    // Pods that fit nowhere take no room: they must not stall every admission.
    let capacity = check(
        vec![room("n1", 0), room("n2", 3000), room("n3", 0)],
        &[("busy", pods("busy", &[8000])), ("a", pods("web", &[2000]))],
    );
    let decision = run(&snapshot, &capacity);
    assert_eq!(decision.scheduled, vec![key("a")]);
    assert_eq!(decision.capacity.map(|c| c.unplaced_pods), Some(1));
}

#[test]
fn a_tainted_node_takes_only_tolerating_pods() {
    let snapshot = three_nodes(vec![RequestState::for_test("a", "n1", Phase::Pending, 0)]);
    let mut tainted = room("n2", 0);
    tainted.taints = vec![Taint {
        key: "dedicated".into(),
        effect: "NoSchedule".into(),
        ..Taint::default()
    }];
    let capacity = check(
        vec![room("n1", 0), tainted, room("n3", 4000)],
        &[("a", pods("web", &[100]))],
    );
    let decision = run(&snapshot, &capacity);
    assert_eq!(
        decision.waiting[0].reason,
        "pods of n1 do not fit on the 2 remaining schedulable nodes: no node they may run on has room; largest unplaceable pod app/web-0 needs 100m CPU and 1Gi"
    );
}

#[test]
fn unreadable_pods_fail_closed_and_say_why() {
    let snapshot = three_nodes(vec![RequestState::for_test("a", "n1", Phase::Pending, 0)]);
    let capacity = CapacityCheck::unreadable("cannot list pods (timeout)".to_string());
    let decision = run(&snapshot, &capacity);
    assert!(decision.scheduled.is_empty());
    assert_eq!(decision.waiting[0].cause, WaitCause::CapacityUnknown);
    assert_eq!(
        decision.waiting[0].reason,
        "checkCapacity could not check whether the pods of n1 fit: cannot list pods (timeout); the next round checks again"
    );
}

#[test]
fn with_the_check_off_capacity_is_not_looked_at() {
    let snapshot = three_nodes(vec![RequestState::for_test("a", "n1", Phase::Pending, 0)]);
    let mut capacity = check(
        vec![room("n1", 0), room("n2", 4000), room("n3", 4000)],
        &[("a", pods("web", &[1000]))],
    );
    capacity.enabled = false;
    let decision = run(&snapshot, &capacity);
    assert_eq!(decision.scheduled, vec![key("a")]);
    assert_eq!(decision.capacity, None);
    assert_eq!(decision, schedule(&snapshot, &unlimited(), at(60)).unwrap());
}

fn quantity(cpu: &str, memory: &str) -> Option<BTreeMap<String, Quantity>> {
    Some(
        [
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity(memory.into())),
        ]
        .into(),
    )
}

fn requesting(mut p: Pod, node: Option<&str>, cpu: &str) -> Pod {
    if let Some(spec) = p.spec.as_mut() {
        spec.node_name = node.map(str::to_string);
        spec.containers = vec![Container {
            name: "main".into(),
            resources: Some(ResourceRequirements {
                requests: quantity(cpu, "1Gi"),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }];
    }
    p
}

fn cluster_node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: quantity("4", "16Gi"),
            ..NodeStatus::default()
        }),
    }
}

#[test]
fn the_observer_sums_requests_per_node_and_keeps_only_what_drains_evict() {
    let mut maintenance = maintenance_crds::NodeMaintenance::new(
        "a",
        NodeMaintenanceSpec {
            node_name: "n1".into(),
            requestor_id: "fw.example.com".into(),
            drain_spec: Some(DrainSpec::default()),
            ..NodeMaintenanceSpec::default()
        },
    );
    maintenance.metadata.namespace = Some(NAMESPACE.into());
    let mut observer = CapacityObserver::new(&[maintenance], None);
    for p in [
        requesting(pod("app", "web"), Some("n1"), "500m"),
        // A DaemonSet pod is not evicted, but holds room on its node.
        requesting(
            owned_by(pod("app", "agent"), "DaemonSet"),
            Some("n1"),
            "100m",
        ),
        // Finished: requests nothing.
        with_phase(requesting(pod("app", "job"), Some("n2"), "2"), "Succeeded"),
        requesting(pod("app", "db"), Some("n2"), "1"),
        requesting(pod("app", "waiting"), None, "250m"),
    ] {
        observer.add_pod(&p);
    }
    let check = observer.finish(&[cluster_node("n1"), cluster_node("n2")]);
    let requested: Vec<(String, i64)> = check
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.requested.cpu_milli))
        .collect();
    assert_eq!(requested, [("n1".into(), 600), ("n2".into(), 1000)]);
    assert_eq!(check.nodes[0].allocatable.cpu_milli, 4000);
    let evicted: Vec<&str> = check
        .evictions_of(&key("a"))
        .iter()
        .map(|p| p.key.as_str())
        .collect();
    assert_eq!(evicted, ["app/web"]);
    assert_eq!(check.unscheduled.len(), 1);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the round admits, the pods of the admitted drains and of the drains in
        /// progress together need no more than the nodes left have free: admission never plans
        /// an overcommit. (Without selectors and taints the total is a placement-free bound.)
        #[test]
        fn admitted_drains_never_need_more_than_the_nodes_left_have_free(
            used in proptest::collection::vec(0i64..4000, 2..8),
            demands in proptest::collection::vec(proptest::collection::vec(0i64..3000, 0..4), 2..8),
            in_maintenance in proptest::collection::vec(proptest::bool::ANY, 2..8),
        ) {
            let n = used.len().min(demands.len()).min(in_maintenance.len());
            let name = |i: usize| format!("n{i}");
            let mut snapshot = Snapshot::default();
            let mut capacity = check(Vec::new(), &[]);
            for i in 0..n {
                snapshot.nodes.push(NodeState::for_test(&name(i), false, &[]));
                capacity.nodes.push(room(&name(i), used[i]));
                let phase = if in_maintenance[i] { Phase::Draining } else { Phase::Pending };
                let request = RequestState::for_test(&format!("r{i}"), &name(i), phase, i64::try_from(i).unwrap());
                capacity.evictions.insert(request.key(), pods(&format!("r{i}"), &demands[i]));
                snapshot.requests.push(request);
            }
            let decision = run(&snapshot, &capacity);
            let admitted: BTreeSet<String> = decision.scheduled.iter().map(|k| k.name.clone()).collect();
            let gone = |i: usize| in_maintenance[i] || admitted.contains(&format!("r{i}"));
            let demand: i64 = (0..n)
                .filter(|i| admitted.contains(&format!("r{i}")))
                .flat_map(|i| demands[i].iter().copied())
                .sum();
            let free: i64 = (0..n).filter(|i| !gone(*i)).map(|i| 4000 - used[i]).sum();
            // Drains in progress whose pods fit take room first; only admitted demand is bounded.
            prop_assert!(demand <= free, "admitted {admitted:?}: demand {demand} > free {free}");
            for waiting in &decision.waiting {
                prop_assert_eq!(waiting.cause, WaitCause::InsufficientCapacity);
            }
        }
    }
}
