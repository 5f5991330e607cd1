//! Nodes that wait to be drained carry a `PreferNoSchedule` taint, so the pods evicted from the
//! nodes in maintenance now are placed elsewhere, not on a node whose own drain will evict them
//! again. In a rolling maintenance of the whole cluster that re-eviction is common (a quarter to
//! two fifths more evictions than pods, measured by `make bench`'s fleet run), and every one is
//! a pod restart the workload's owner sees and a turn of its PodDisruptionBudget.
//!
//! `PreferNoSchedule` is a preference of the kube-scheduler's scoring, never a refusal: when every
//! other node is full or tainted too, pods still land on a tainted node. The taint is ours alone
//! ([`PENDING_DRAIN_TAINT_KEY`]): a node carries it exactly while a request on it waits for
//! admission with a drain to do, and every round compares what the nodes carry with that, so a
//! request deleted while it waits, an operator restarted, or the feature turned off leaves no
//! taint behind.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Node, Taint};
use maintenance_crds::{NodeMaintenance, Phase};

/// The taint's key (its value is empty).
pub const PENDING_DRAIN_TAINT_KEY: &str = "maintenance.nvidia.com/drain-pending";
/// The taint's effect: scoring only, nothing is refused or evicted because of it.
pub const PENDING_DRAIN_TAINT_EFFECT: &str = "PreferNoSchedule";

/// Whether this request, as the round leaves it, makes its node worth avoiding: it waits for
/// admission (not being admitted now, not deleted) and its admission will evict pods.
pub fn waits_to_drain(request: &NodeMaintenance, being_admitted: bool) -> bool {
    !being_admitted
        && !request.is_deleting()
        && request.phase() == Phase::Pending
        && request.spec.drain_spec.is_some()
}

/// The nodes that should carry the taint: those of requests that [`waits_to_drain`]. None when
/// the feature is off, so that turning it off removes every taint.
pub fn wanted_nodes<'a>(
    enabled: bool,
    requests: impl IntoIterator<Item = (&'a NodeMaintenance, bool)>,
) -> HashSet<&'a str> {
    if !enabled {
        return HashSet::new();
    }
    requests
        .into_iter()
        .filter(|(request, being_admitted)| waits_to_drain(request, *being_admitted))
        .map(|(request, _)| request.spec.node_name.as_str())
        .collect()
}

/// Whether `node` carries our taint.
pub fn has_pending_drain_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| taints.iter().any(|t| t.key == PENDING_DRAIN_TAINT_KEY))
}

/// A node's taints to write, guarded by the resourceVersion they were computed from: the list is
/// replaced whole (a Node's taints have no merge key), so a write over a newer list would lose
/// the other taints' edits; it conflicts instead, and the next round computes it again.
#[derive(Debug, Clone, PartialEq)]
pub struct TaintWrite {
    pub node: String,
    pub resource_version: Option<String>,
    pub add: bool,
    pub taints: Vec<Taint>,
}

/// The writes that make the nodes carry the taint exactly where `wanted`, skipping nodes for
/// which `in_flight` says a write is on its way. Nodes that are gone need nothing.
pub fn taint_writes<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    wanted: &HashSet<&str>,
    in_flight: impl Fn(&Node) -> bool,
) -> Vec<TaintWrite> {
    let mut writes = Vec::new();
    for node in nodes {
        let Some(name) = node.metadata.name.as_deref() else {
            continue;
        };
        let has = has_pending_drain_taint(node);
        let want = wanted.contains(name);
        if has == want || in_flight(node) {
            continue;
        }
        let current = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let mut taints: Vec<Taint> = current
            .into_iter()
            .filter(|t| t.key != PENDING_DRAIN_TAINT_KEY)
            .collect();
        if want {
            taints.push(Taint {
                key: PENDING_DRAIN_TAINT_KEY.to_string(),
                effect: PENDING_DRAIN_TAINT_EFFECT.to_string(),
                ..Taint::default()
            });
        }
        writes.push(TaintWrite {
            node: name.to_string(),
            resource_version: node.metadata.resource_version.clone(),
            add: want,
            taints,
        });
    }
    writes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn request(node: &str, drain: bool) -> NodeMaintenance {
        fixtures::request(&format!("nm-{node}"))
            .node(node)
            .requestor("example.com")
            .uid(&format!("uid-{node}"))
            .drain(drain)
            .build()
    }

    fn admitted(mut r: NodeMaintenance) -> NodeMaintenance {
        let uid = r.metadata.uid.clone().unwrap_or_default();
        r.metadata.annotations =
            Some([(maintenance_crds::ADMITTED_UID_ANNOTATION.to_string(), uid)].into());
        r
    }

    #[test]
    fn only_a_request_that_waits_with_a_drain_to_do_wants_the_taint() {
        assert!(waits_to_drain(&request("a", true), false));
        assert!(!waits_to_drain(&request("a", false), false), "no drain");
        assert!(!waits_to_drain(&request("a", true), true), "being admitted");
        assert!(
            !waits_to_drain(&admitted(request("a", true)), false),
            "admitted"
        );
        let mut deleting = request("a", true);
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        assert!(!waits_to_drain(&deleting, false), "deleted while it waits");
    }

    #[test]
    fn turned_off_no_node_wants_it() {
        let r = request("a", true);
        assert_eq!(wanted_nodes(true, [(&r, false)]), HashSet::from(["a"]));
        assert!(wanted_nodes(false, [(&r, false)]).is_empty());
    }

    #[test]
    fn the_taint_is_added_beside_other_taints_and_removed_leaving_them() {
        let other = ("gpu", "NoSchedule");
        let plain = fixtures::node("a").version("7").taints(&[other]).build();
        let wanted = HashSet::from(["a"]);
        let writes = taint_writes([&plain], &wanted, |_| false);
        assert_eq!(writes.len(), 1);
        assert!(writes[0].add);
        assert_eq!(writes[0].resource_version.as_deref(), Some("7"));
        let keys: Vec<&str> = writes[0].taints.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["gpu", PENDING_DRAIN_TAINT_KEY]);
        assert_eq!(writes[0].taints[1].effect, "PreferNoSchedule");

        let tainted = fixtures::node("a")
            .version("7")
            .taints(&[other, (PENDING_DRAIN_TAINT_KEY, "PreferNoSchedule")])
            .build();
        assert!(
            taint_writes([&tainted], &wanted, |_| false).is_empty(),
            "already right"
        );
        let writes = taint_writes([&tainted], &HashSet::new(), |_| false);
        assert_eq!(writes.len(), 1);
        assert!(!writes[0].add);
        assert_eq!(writes[0].taints.len(), 1);
        assert_eq!(writes[0].taints[0].key, "gpu");
    }

    #[test]
    fn a_taint_left_by_a_request_deleted_while_it_waited_is_removed() {
        // The request is gone (a Pending request has no finalizer): nothing wants the taint.
        let tainted = fixtures::node("a")
            .version("7")
            .taints(&[(PENDING_DRAIN_TAINT_KEY, "PreferNoSchedule")])
            .build();
        let wanted = wanted_nodes(true, std::iter::empty());
        let writes = taint_writes([&tainted], &wanted, |_| false);
        assert_eq!(writes.len(), 1);
        assert!(writes[0].taints.is_empty());
    }

    #[test]
    fn a_node_with_a_write_in_flight_is_not_written_again() {
        let plain = fixtures::node("a").version("7").taints(&[]).build();
        let wanted = HashSet::from(["a"]);
        assert!(taint_writes([&plain], &wanted, |_| true).is_empty());
    }
}
