//! Capacity-aware admission (`spec.admission.checkCapacity`): do the pods a drain would evict fit
//! on the remaining schedulable nodes? CPU and memory requests against allocatable minus what is
//! already requested there, respecting nodeSelector and NoSchedule/NoExecute taints. First-fit
//! decreasing: pods sorted by size (CPU, then memory) go to the first node with room.
//!
//! A round starts from the nodes that take pods (schedulable, Ready, not in maintenance). Pods
//! that need a node whatever the round decides (unscheduled pods, pods that drains in progress
//! will still evict) take room first. Then each request the other limits would admit has its
//! drain tried on the pool without its own node: if everything fits, the placement is kept and
//! the node leaves the pool, so the requests of one round never count the same room twice. This
//! is the kube-scheduler's arithmetic "at least roughly": no affinity, spread constraints, pod
//! count limits or extended resources. Pure.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use maintenance_crds::{MaintenanceOperatorConfigSpec, NodeMaintenance};
use serde::Serialize;

use crate::drain_plan::{DrainRules, OperatorIdentity, PodDisposition, classify, is_finished};
use crate::scheduler::model::{RequestKey, RequestState};

/// CPU in millicores and memory in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    pub cpu_milli: i64,
    pub memory_bytes: i64,
}

impl Resources {
    pub fn plus(self, other: Resources) -> Resources {
        Resources {
            cpu_milli: self.cpu_milli.saturating_add(other.cpu_milli),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
        }
    }
    fn fits_in(self, free: Resources) -> bool {
        self.cpu_milli <= free.cpu_milli && self.memory_bytes <= free.memory_bytes
    }
    /// What is left, never below zero.
    fn minus(self, other: Resources) -> Resources {
        Resources {
            cpu_milli: self.cpu_milli.saturating_sub(other.cpu_milli).max(0),
            memory_bytes: self.memory_bytes.saturating_sub(other.memory_bytes).max(0),
        }
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} CPU and {}",
            format_cpu(self.cpu_milli),
            format_memory(self.memory_bytes)
        )
    }
}

fn format_cpu(milli: i64) -> String {
    if milli % 1000 == 0 {
        format!("{}", milli / 1000)
    } else {
        format!("{milli}m")
    }
}

fn format_memory(bytes: i64) -> String {
    const GI: i64 = 1 << 30;
    const MI: i64 = 1 << 20;
    if bytes % GI == 0 {
        format!("{}Gi", bytes / GI)
    } else if bytes >= GI {
        format!("{:.1}Gi", bytes as f64 / GI as f64)
    } else {
        format!("{}Mi", (bytes + MI - 1) / MI)
    }
}

/// A quantity as a number of `1/scale` units (scale 1000 for millicores, 1 for bytes), rounded
/// up; `None` when it is no Kubernetes quantity.
pub fn parse_quantity(quantity: &str, scale: i64) -> Option<i64> {
    let text = quantity.trim();
    let split = text
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let factor: f64 = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "Pi" => 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let value: f64 = number.parse().ok()?;
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    let units = (value * factor * scale as f64).ceil();
    (units <= i64::MAX as f64).then_some(units as i64)
}

fn resources_of(map: Option<&BTreeMap<String, Quantity>>) -> Resources {
    let get = |name: &str, scale: i64| {
        map.and_then(|m| m.get(name))
            .and_then(|q| parse_quantity(&q.0, scale))
            .unwrap_or(0)
    };
    Resources {
        cpu_milli: get("cpu", 1000),
        memory_bytes: get("memory", 1),
    }
}

/// A node that could take pods: what it has and what is already requested on it.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub allocatable: Resources,
    pub requested: Resources,
}

impl CapacityNode {
    /// From a Node (with `status.allocatable`) and the requests of the pods already on it.
    pub fn from_node(node: &Node, requested: Resources) -> CapacityNode {
        CapacityNode {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
            allocatable: resources_of(node.status.as_ref().and_then(|s| s.allocatable.as_ref())),
            requested,
        }
    }
}

/// A pod to place: its requests and where it may go.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityPod {
    /// `namespace/name`.
    pub key: String,
    pub requests: Resources,
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
}

impl CapacityPod {
    /// The pod's effective requests: the sum over its containers, or the largest init container
    /// if that is more (as the kube-scheduler counts them, without overhead).
    pub fn from_pod(pod: &Pod) -> CapacityPod {
        let spec = pod.spec.as_ref();
        let sum = spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .map(|c| resources_of(c.resources.as_ref().and_then(|r| r.requests.as_ref())))
            .fold(Resources::default(), Resources::plus);
        let init = spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .map(|c| resources_of(c.resources.as_ref().and_then(|r| r.requests.as_ref())))
            .fold(Resources::default(), |a, b| Resources {
                cpu_milli: a.cpu_milli.max(b.cpu_milli),
                memory_bytes: a.memory_bytes.max(b.memory_bytes),
            });
        CapacityPod {
            key: format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default()
            ),
            requests: Resources {
                cpu_milli: sum.cpu_milli.max(init.cpu_milli),
                memory_bytes: sum.memory_bytes.max(init.memory_bytes),
            },
            node_selector: spec
                .and_then(|s| s.node_selector.clone())
                .unwrap_or_default(),
            tolerations: spec.and_then(|s| s.tolerations.clone()).unwrap_or_default(),
        }
    }

    /// nodeSelector matches and every NoSchedule/NoExecute taint is tolerated.
    pub fn may_run_on(&self, node: &CapacityNode) -> bool {
        self.node_selector
            .iter()
            .all(|(k, v)| node.labels.get(k) == Some(v))
            && node
                .taints
                .iter()
                .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                .all(|taint| self.tolerations.iter().any(|t| tolerates(t, taint)))
    }
}

fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = toleration.key.as_deref().unwrap_or_default();
    match toleration.operator.as_deref() {
        Some("Exists") => effect_ok && (key.is_empty() || key == taint.key),
        _ => {
            effect_ok
                && key == taint.key
                && toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
    }
}

/// Why the pods do not fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    /// How many nodes were left to take the pods.
    pub remaining_nodes: usize,
    /// The pods that found no node, largest first.
    pub unplaceable: Vec<(String, Resources)>,
    /// Their requests together, minus what the remaining nodes have free: how much is missing.
    pub missing: Resources,
}

impl Shortfall {
    /// For a person: "pods of node-3 need 6 CPU and 12Gi more than ...".
    pub fn describe(&self, node: &str) -> String {
        let largest = self
            .unplaceable
            .first()
            .map(|(pod, r)| format!("; largest unplaceable pod {pod} needs {r}"))
            .unwrap_or_default();
        let mut parts = Vec::new();
        if self.missing.cpu_milli > 0 {
            parts.push(format!("{} CPU", format_cpu(self.missing.cpu_milli)));
        }
        if self.missing.memory_bytes > 0 {
            parts.push(format_memory(self.missing.memory_bytes));
        }
        let remaining = self.remaining_nodes;
        if parts.is_empty() {
            // Enough in total, but not where the pods may go (selectors, taints, fragments).
            format!(
                "pods of {node} do not fit on the {remaining} remaining schedulable nodes: no node they may run on has room{largest}"
            )
        } else {
            format!(
                "pods of {node} need {} more than the {remaining} remaining schedulable nodes have free{largest}",
                parts.join(" and ")
            )
        }
    }
}

/// First-fit decreasing: places `pods` on `nodes` (whose `requested` grows as pods are placed).
/// `Ok` with the node of each pod (in `pods` order), or the shortfall; pods that fit are placed
/// either way.
pub fn fit(pods: &[CapacityPod], nodes: &mut [CapacityNode]) -> Result<Vec<String>, Shortfall> {
    let (placed, result) = place(pods, nodes, None);
    result.map(|()| placed.into_iter().flatten().collect())
}

/// [`fit`] on every node but `skip`: the node of each pod that fit (in `pods` order), and the
/// shortfall if some did not.
fn place(
    pods: &[CapacityPod],
    nodes: &mut [CapacityNode],
    skip: Option<&str>,
) -> (Vec<Option<String>>, Result<(), Shortfall>) {
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.sort_by(|a, b| {
        pods[*b]
            .requests
            .cmp(&pods[*a].requests)
            .then_with(|| pods[*a].key.cmp(&pods[*b].key))
    });
    let takes = |node: &CapacityNode| skip != Some(node.name.as_str());
    let mut placed: Vec<Option<String>> = vec![None; pods.len()];
    let mut unplaceable = Vec::new();
    for index in order {
        let pod = &pods[index];
        let node = nodes.iter_mut().find(|node| {
            takes(node)
                && pod.may_run_on(node)
                && pod.requests.fits_in(node.allocatable.minus(node.requested))
        });
        match node {
            Some(node) => {
                node.requested = node.requested.plus(pod.requests);
                placed[index] = Some(node.name.clone());
            }
            None => unplaceable.push((pod.key.clone(), pod.requests)),
        }
    }
    if unplaceable.is_empty() {
        return (placed, Ok(()));
    }
    let demand = unplaceable
        .iter()
        .map(|(_, r)| *r)
        .fold(Resources::default(), Resources::plus);
    let free = nodes
        .iter()
        .filter(|n| takes(n))
        .map(|n| n.allocatable.minus(n.requested))
        .fold(Resources::default(), Resources::plus);
    let shortfall = Shortfall {
        remaining_nodes: nodes.iter().filter(|n| takes(n)).count(),
        unplaceable,
        missing: demand.minus(free),
    };
    (placed, Err(shortfall))
}

/// What the scheduler needs for `checkCapacity`, observed by whoever can read pods.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CapacityCheck {
    /// Off: capacity is not looked at, whatever the rest says.
    pub enabled: bool,
    /// Every node, with what the pods on it request.
    pub nodes: Vec<CapacityNode>,
    /// Per request (Pending ones, and those in progress): the pods its drain would still evict.
    /// A request without an entry evicts nothing.
    pub evictions: BTreeMap<RequestKey, Vec<CapacityPod>>,
    /// Pods that wait for a node (no `spec.nodeName` yet).
    pub unscheduled: Vec<CapacityPod>,
    /// Why the pods could not be read this round: the check then fails closed.
    pub unreadable: Option<String>,
}

impl CapacityCheck {
    /// The feature as configured; the observations are filled in by whoever can read pods.
    pub fn from_config(spec: Option<&MaintenanceOperatorConfigSpec>) -> CapacityCheck {
        CapacityCheck {
            enabled: spec.is_some_and(|s| s.admission().check_capacity()),
            ..CapacityCheck::default()
        }
    }

    /// The check could not observe the cluster: nothing it would have to check is admitted.
    pub fn unreadable(problem: String) -> CapacityCheck {
        CapacityCheck {
            enabled: true,
            unreadable: Some(problem),
            ..CapacityCheck::default()
        }
    }

    /// The pods `request`'s drain would still evict.
    pub fn evictions_of(&self, request: &RequestKey) -> &[CapacityPod] {
        self.evictions.get(request).map_or(&[], Vec::as_slice)
    }
}

/// The room a scheduling round has left for evicted pods.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityPool {
    nodes: Vec<CapacityNode>,
    /// Node -> the pods this round placed there: when that node is admitted in turn, they must
    /// move again.
    placed: BTreeMap<String, Vec<CapacityPod>>,
    /// Pods that needed a node before this round and found none.
    unplaced_before_round: usize,
}

impl CapacityPool {
    /// The nodes of `check` that `takes_pods`, after the pods that need a node whatever this
    /// round decides (unscheduled ones, and the evictions of `in_progress` requests) took their
    /// room. Pods that fit nowhere take none: they must not stall every admission.
    pub fn new<'a>(
        check: &CapacityCheck,
        takes_pods: impl Fn(&str) -> bool,
        in_progress: impl IntoIterator<Item = &'a RequestKey>,
    ) -> CapacityPool {
        let mut nodes: Vec<CapacityNode> = check
            .nodes
            .iter()
            .filter(|n| takes_pods(&n.name))
            .cloned()
            .collect();
        // Stable whatever order the nodes were listed in.
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let mut committed: Vec<CapacityPod> = check.unscheduled.clone();
        for key in in_progress {
            committed.extend_from_slice(check.evictions_of(key));
        }
        let mut pool = CapacityPool {
            nodes,
            placed: BTreeMap::new(),
            unplaced_before_round: 0,
        };
        // What fits stays placed, even if some pods fit nowhere.
        let (targets, result) = place(&committed, &mut pool.nodes, None);
        pool.record(&committed, targets);
        pool.unplaced_before_round = result.err().map_or(0, |s| s.unplaceable.len());
        pool
    }

    fn record(&mut self, pods: &[CapacityPod], targets: Vec<Option<String>>) {
        for (pod, node) in pods.iter().zip(targets) {
            if let Some(node) = node {
                self.placed.entry(node).or_default().push(pod.clone());
            }
        }
    }

    /// Moves the pods of `node`'s drain (and any this round put there) onto the pool without
    /// `node`: when they all fit, the placement is kept and `node` leaves the pool; otherwise
    /// nothing changes.
    pub fn admit(&mut self, node: &str, pods: &[CapacityPod]) -> Result<(), Shortfall> {
        let before: Vec<Resources> = self.nodes.iter().map(|n| n.requested).collect();
        let mut moving = pods.to_vec();
        moving.extend(self.placed.get(node).into_iter().flatten().cloned());
        let (targets, result) = place(&moving, &mut self.nodes, Some(node));
        match result {
            Ok(()) => {
                self.placed.remove(node);
                self.record(&moving, targets);
                self.nodes.retain(|n| n.name != node);
                Ok(())
            }
            Err(shortfall) => {
                for (n, requested) in self.nodes.iter_mut().zip(before) {
                    n.requested = requested;
                }
                Err(shortfall)
            }
        }
    }

    /// For `plan`: the pool as it is now.
    pub fn status(&self) -> CapacityStatus {
        CapacityStatus {
            schedulable_nodes: self.nodes.len(),
            free: self
                .nodes
                .iter()
                .map(|n| n.allocatable.minus(n.requested))
                .fold(Resources::default(), Resources::plus),
            unplaced_pods: self.unplaced_before_round,
        }
    }
}

/// The room at the start of a round (after unscheduled pods and drains in progress), for `plan`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityStatus {
    /// Nodes that take pods: schedulable, Ready and not in maintenance.
    pub schedulable_nodes: usize,
    /// Their allocatable minus what is requested on them, together.
    pub free: Resources,
    /// Pods waiting for a node, or still to be evicted by drains in progress, that fit nowhere.
    pub unplaced_pods: usize,
}

impl fmt::Display for CapacityStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} schedulable nodes with {} free",
            self.schedulable_nodes, self.free
        )?;
        if self.unplaced_pods > 0 {
            write!(
                f,
                "; {} pods waiting for a node or being evicted fit nowhere",
                self.unplaced_pods
            )?;
        }
        Ok(())
    }
}

/// Builds a [`CapacityCheck`] from pods read page by page: it keeps the requests summed per node
/// and, for the nodes of `requests`, the pods their drains would evict; a page can be dropped as
/// soon as it is added, so memory follows the nodes under maintenance, not the cluster's pods.
pub struct CapacityObserver {
    /// Node -> the requests on it whose drain evicts, with their rules.
    drains: BTreeMap<String, Vec<(RequestKey, DrainRules)>>,
    requested: BTreeMap<String, Resources>,
    evictions: BTreeMap<RequestKey, Vec<CapacityPod>>,
    unscheduled: Vec<CapacityPod>,
}

impl CapacityObserver {
    /// For `requests` (Pending ones and those in progress; a request without a drainSpec, or
    /// with one that does not parse, evicts nothing here: its node actor reports a bad spec).
    pub fn new(requests: &[NodeMaintenance], operator: Option<&OperatorIdentity>) -> Self {
        let mut drains: BTreeMap<String, Vec<(RequestKey, DrainRules)>> = BTreeMap::new();
        for request in requests.iter().filter(|r| !r.is_deleting()) {
            let Some(spec) = &request.spec.drain_spec else {
                continue;
            };
            let Ok(rules) = DrainRules::new(spec, operator.cloned()) else {
                continue;
            };
            drains
                .entry(request.spec.node_name.clone())
                .or_default()
                .push((RequestState::from_request(request).key(), rules));
        }
        CapacityObserver {
            drains,
            requested: BTreeMap::new(),
            evictions: BTreeMap::new(),
            unscheduled: Vec::new(),
        }
    }

    /// Counts one pod: finished pods request nothing; a terminating pod still holds its room.
    pub fn add_pod(&mut self, pod: &Pod) {
        if is_finished(pod) {
            return;
        }
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let Some(node) = node.filter(|n| !n.is_empty()) else {
            if pod.metadata.deletion_timestamp.is_none() {
                self.unscheduled.push(CapacityPod::from_pod(pod));
            }
            return;
        };
        let capacity_pod = CapacityPod::from_pod(pod);
        let sum = self.requested.entry(node.to_string()).or_default();
        *sum = sum.plus(capacity_pod.requests);
        for (key, rules) in self.drains.get(node).into_iter().flatten() {
            if classify(rules, pod) == PodDisposition::Evict {
                self.evictions
                    .entry(key.clone())
                    .or_default()
                    .push(capacity_pod.clone());
            }
        }
    }

    /// The check, with every node of `nodes` (their `status.allocatable` is needed).
    pub fn finish<'a>(self, nodes: impl IntoIterator<Item = &'a Node>) -> CapacityCheck {
        let nodes = nodes
            .into_iter()
            .map(|node| {
                let name = node.metadata.name.as_deref().unwrap_or_default();
                let requested = self.requested.get(name).copied().unwrap_or_default();
                CapacityNode::from_node(node, requested)
            })
            .collect();
        CapacityCheck {
            enabled: true,
            nodes,
            evictions: self.evictions,
            unscheduled: self.unscheduled,
            unreadable: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GI: i64 = 1 << 30;

    fn node(name: &str, cpu: i64, mem_gi: i64) -> CapacityNode {
        CapacityNode {
            name: name.into(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            allocatable: Resources {
                cpu_milli: cpu * 1000,
                memory_bytes: mem_gi * GI,
            },
            requested: Resources::default(),
        }
    }

    fn pod(key: &str, cpu_milli: i64, mem_gi: i64) -> CapacityPod {
        CapacityPod {
            key: key.into(),
            requests: Resources {
                cpu_milli,
                memory_bytes: mem_gi * GI,
            },
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
        }
    }

    #[test]
    fn parses_quantities() {
        assert_eq!(parse_quantity("500m", 1000), Some(500));
        assert_eq!(parse_quantity("2", 1000), Some(2000));
        assert_eq!(parse_quantity("0.1", 1000), Some(100));
        assert_eq!(parse_quantity("1Gi", 1), Some(GI));
        assert_eq!(parse_quantity("1G", 1), Some(1_000_000_000));
        assert_eq!(parse_quantity("128974848", 1), Some(128_974_848));
        assert_eq!(parse_quantity("1e3", 1), Some(1000));
        assert_eq!(parse_quantity("12X", 1), None);
        assert_eq!(parse_quantity("-1", 1), None);
    }

    #[test]
    fn first_fit_decreasing_places_the_big_pod_first() {
        let mut nodes = [node("a", 2, 4), node("b", 1, 4)];
        let pods = [pod("app/small", 1000, 1), pod("app/big", 2000, 1)];
        assert_eq!(fit(&pods, &mut nodes), Ok(vec!["b".into(), "a".into()]));
    }

    #[test]
    fn says_what_does_not_fit_and_by_how_much() {
        let mut nodes = [node("a", 2, 4)];
        let pods = [pod("app/web-1", 2000, 1), pod("app/web-2", 1500, 2)];
        let shortfall = fit(&pods, &mut nodes).unwrap_err();
        assert_eq!(
            shortfall.describe("node-3"),
            "pods of node-3 need 1500m CPU more than the 1 remaining schedulable nodes have free; largest unplaceable pod app/web-2 needs 1500m CPU and 2Gi"
        );
    }

    #[test]
    fn selectors_and_taints_are_respected() {
        let mut tainted = node("tainted", 8, 8);
        tainted.taints = vec![Taint {
            key: "gpu".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        }];
        let mut labelled = node("labelled", 8, 8);
        labelled.labels.insert("pool".into(), "cpu".into());
        let mut plain = pod("app/p", 100, 1);
        assert!(!plain.may_run_on(&tainted));
        assert!(plain.may_run_on(&labelled));
        plain.tolerations = vec![Toleration {
            key: Some("gpu".into()),
            operator: Some("Exists".into()),
            ..Toleration::default()
        }];
        assert!(plain.may_run_on(&tainted));
        plain.node_selector.insert("pool".into(), "gpu".into());
        assert!(!plain.may_run_on(&labelled));
    }

    proptest! {
        /// Whenever the pods fit, the placement respects every node's capacity, selector and
        /// taints.
        #[test]
        fn a_fit_never_overcommits_a_node(
            node_specs in proptest::collection::vec((0i64..8, 0i64..8, 0i64..4000, proptest::bool::ANY), 0..6),
            pod_specs in proptest::collection::vec((0i64..4000, 0i64..4, proptest::bool::ANY), 0..12),
        ) {
            let nodes: Vec<CapacityNode> = node_specs
                .iter()
                .enumerate()
                .map(|(i, (cpu, mem, used, gpu))| {
                    let mut n = node(&format!("n{i}"), *cpu, *mem);
                    n.requested.cpu_milli = (*used).min(cpu * 1000);
                    if *gpu {
                        n.labels.insert("pool".into(), "gpu".into());
                    }
                    n
                })
                .collect();
            let pods: Vec<CapacityPod> = pod_specs
                .iter()
                .enumerate()
                .map(|(i, (cpu, mem, gpu))| {
                    let mut p = pod(&format!("app/p{i}"), *cpu, *mem);
                    if *gpu {
                        p.node_selector.insert("pool".into(), "gpu".into());
                    }
                    p
                })
                .collect();
            let mut after = nodes.clone();
            if let Ok(placement) = fit(&pods, &mut after) {
                prop_assert_eq!(placement.len(), pods.len());
                for node in &nodes {
                    let added = pods
                        .iter()
                        .zip(&placement)
                        .filter(|(_, at)| **at == node.name)
                        .map(|(p, _)| {
                            prop_assert!(p.may_run_on(node));
                            Ok(p.requests)
                        })
                        .collect::<Result<Vec<_>, TestCaseError>>()?
                        .into_iter()
                        .fold(node.requested, Resources::plus);
                    prop_assert!(added.fits_in(node.allocatable), "{node:?} gets {added:?}");
                }
            }
        }
    }
}
