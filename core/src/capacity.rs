//! Capacity model for `spec.admission.checkCapacity` (issue 11, part 4; NOT YET WIRED into the
//! scheduler, the CRD or the supervisor): do the pods a drain would evict fit on the remaining
//! schedulable nodes? CPU and memory requests against allocatable minus what is already requested
//! there, respecting nodeSelector and NoSchedule/NoExecute taints. First-fit decreasing: pods
//! sorted by size (CPU, then memory) go to the first node with room. Pure.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// CPU in millicores and memory in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord)]
pub struct Resources {
    pub cpu_milli: i64,
    pub memory_bytes: i64,
}

impl Resources {
    fn add(self, other: Resources) -> Resources {
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
            .fold(Resources::default(), Resources::add);
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
/// `Ok` with the node of each pod (in `pods` order), or the shortfall.
pub fn fit(pods: &[CapacityPod], nodes: &mut [CapacityNode]) -> Result<Vec<String>, Shortfall> {
    let mut order: Vec<usize> = (0..pods.len()).collect();
    order.sort_by(|a, b| {
        pods[*b]
            .requests
            .cmp(&pods[*a].requests)
            .then_with(|| pods[*a].key.cmp(&pods[*b].key))
    });
    let mut placed: Vec<Option<String>> = vec![None; pods.len()];
    let mut unplaceable = Vec::new();
    for index in order {
        let pod = &pods[index];
        let node = nodes.iter_mut().find(|node| {
            pod.may_run_on(node) && pod.requests.fits_in(node.allocatable.minus(node.requested))
        });
        match node {
            Some(node) => {
                node.requested = node.requested.add(pod.requests);
                placed[index] = Some(node.name.clone());
            }
            None => unplaceable.push((pod.key.clone(), pod.requests)),
        }
    }
    if unplaceable.is_empty() {
        return Ok(placed.into_iter().flatten().collect());
    }
    let demand = unplaceable
        .iter()
        .map(|(_, r)| *r)
        .fold(Resources::default(), Resources::add);
    let free = nodes
        .iter()
        .map(|n| n.allocatable.minus(n.requested))
        .fold(Resources::default(), Resources::add);
    Err(Shortfall {
        remaining_nodes: nodes.len(),
        unplaceable,
        missing: demand.minus(free),
    })
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
                        .fold(node.requested, Resources::add);
                    prop_assert!(added.fits_in(node.allocatable), "{node:?} gets {added:?}");
                }
            }
        }
    }
}
