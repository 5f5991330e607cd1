//! What the operator keeps of a Node in its cluster-wide cache: what its decisions read, and
//! nothing else. The cache holds every node of the cluster (5,000 and more), so a field kept
//! for nothing costs per node, all the time.
//!
//! Read from a cached node:
//! - the scheduler ([`crate::scheduler::NodeState::from_node`]): name, labels,
//!   `spec.unschedulable`, the status of the `Ready` condition;
//! - the capacity check ([`crate::capacity::CapacityNode::from_node`]): name, labels,
//!   `spec.taints`, `status.allocatable`;
//! - the cordon mark ([`crate::cordon_mark::cordon_mark`]): the mark's annotations and the
//!   autoscaler annotations it decides about, the resourceVersion, `spec.unschedulable`;
//! - the pending-drain taint ([`crate::pending_taint::has_pending_drain_taint`]): `spec.taints`.

use k8s_openapi::api::core::v1::{Node, NodeCondition};

use crate::cordon_mark;

/// The one condition kept, and of it only its type and status.
const READY: &str = "Ready";

/// Drops from `node` what no decision reads: managed fields, annotations but the cordon mark,
/// the images, volumes, addresses, capacity, node info, and every condition but `Ready`'s type
/// and status (the others, and the messages and times of all, change with each heartbeat and are
/// read by nobody here). The node watch applies it to each node as it arrives.
pub fn trim(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(annotations) = node.metadata.annotations.as_mut() {
        annotations.retain(|key, _| cordon_mark::is_mark(key));
        if annotations.is_empty() {
            node.metadata.annotations = None;
        }
    }
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.node_info = None;
        status.capacity = None;
        status.addresses = None;
        status.daemon_endpoints = None;
        status.config = None;
        status.phase = None;
        status.conditions = status.conditions.take().map(|conditions| {
            conditions
                .into_iter()
                .filter(|c| c.type_ == READY)
                .map(|c| NodeCondition {
                    type_: c.type_,
                    status: c.status,
                    ..NodeCondition::default()
                })
                .collect()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        ContainerImage, NodeAddress, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};

    use crate::capacity::{CapacityNode, Resources};
    use crate::cordon_mark::cordon_mark;
    use crate::pending_taint::has_pending_drain_taint;
    use crate::scheduler::NodeState;

    fn condition(type_: &str, status: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(format!("Kubelet{type_}")),
            message: Some(format!("kubelet says {type_} is {status}")),
            last_heartbeat_time: None,
            last_transition_time: None,
        }
    }

    /// A node as a kubelet reports it, cordoned by a request (its mark), tainted.
    fn node(ready: Option<&str>, cordoned_by: Option<&NodeMaintenanceRef>) -> Node {
        let mut conditions = vec![
            condition("MemoryPressure", "False"),
            condition("DiskPressure", "False"),
        ];
        if let Some(status) = ready {
            conditions.push(condition(READY, status));
        }
        let mut node = Node {
            metadata: ObjectMeta {
                name: Some("node-1".into()),
                resource_version: Some("42".into()),
                labels: Some(BTreeMap::from([
                    ("kubernetes.io/hostname".into(), "node-1".into()),
                    ("zone".into(), "a".into()),
                ])),
                annotations: Some(BTreeMap::from([(
                    "node.alpha.kubernetes.io/ttl".into(),
                    "0".into(),
                )])),
                managed_fields: Some(vec![ManagedFieldsEntry::default()]),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(cordoned_by.is_some()),
                taints: Some(vec![Taint {
                    key: "gpu".into(),
                    effect: "NoSchedule".into(),
                    ..Taint::default()
                }]),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(conditions),
                allocatable: Some(BTreeMap::from([
                    ("cpu".into(), Quantity("8".into())),
                    ("memory".into(), Quantity("32Gi".into())),
                ])),
                capacity: Some(BTreeMap::from([("cpu".into(), Quantity("8".into()))])),
                images: Some(vec![ContainerImage {
                    names: Some(vec!["registry.example.com/big:1".into()]),
                    size_bytes: Some(1 << 30),
                }]),
                addresses: Some(vec![NodeAddress {
                    address: "10.0.0.1".into(),
                    type_: "InternalIP".into(),
                }]),
                node_info: Some(NodeSystemInfo::default()),
                ..NodeStatus::default()
            }),
        };
        if let Some(request) = cordoned_by {
            let patch = cordon_mark::cordon_patch(&request.0, &cordon_mark::AUTOSCALER_ANNOTATIONS);
            let annotations = patch["metadata"]["annotations"]
                .as_object()
                .expect("the cordon patch writes annotations");
            let mine = node.metadata.annotations.get_or_insert_with(BTreeMap::new);
            for (key, value) in annotations {
                mine.insert(key.clone(), value.as_str().unwrap_or_default().to_string());
            }
        }
        node
    }

    struct NodeMaintenanceRef(maintenance_crds::NodeMaintenance);

    fn trimmed(node: &Node) -> Node {
        let mut node = node.clone();
        trim(&mut node);
        node
    }

    /// Every decision reads the same from the trimmed node as from the whole one: ready, not
    /// ready, never reported, cordoned by a request or not.
    #[test]
    fn a_trimmed_node_decides_as_the_whole_one() {
        let request = NodeMaintenanceRef(
            fixtures::request("upgrade")
                .namespace("default")
                .node("node-1")
                .requestor("test")
                .uid("uid-1")
                .build(),
        );
        for ready in [Some("True"), Some("False"), Some("Unknown"), None] {
            for cordoned_by in [None, Some(&request)] {
                let whole = node(ready, cordoned_by);
                let kept = trimmed(&whole);
                let case = format!("ready {ready:?}, cordoned {}", cordoned_by.is_some());
                assert_eq!(
                    NodeState::from_node(&kept),
                    NodeState::from_node(&whole),
                    "{case}"
                );
                assert_eq!(
                    CapacityNode::from_node(&kept, Resources::default()),
                    CapacityNode::from_node(&whole, Resources::default()),
                    "{case}"
                );
                assert_eq!(cordon_mark(&kept), cordon_mark(&whole), "{case}");
                assert_eq!(
                    has_pending_drain_taint(&kept),
                    has_pending_drain_taint(&whole),
                    "{case}"
                );
            }
        }
        assert!(cordon_mark(&trimmed(&node(Some("True"), Some(&request)))).is_some());
    }

    /// What goes: the heartbeat's conditions and texts, images, addresses, managed fields,
    /// annotations that are not the mark.
    #[test]
    fn a_trimmed_node_keeps_only_the_ready_status() {
        let kept = trimmed(&node(Some("True"), None));
        let status = kept.status.as_ref().expect("status kept");
        assert_eq!(
            status.conditions,
            Some(vec![NodeCondition {
                type_: READY.into(),
                status: "True".into(),
                ..NodeCondition::default()
            }])
        );
        assert_eq!(status.images, None);
        assert_eq!(status.addresses, None);
        assert_eq!(status.capacity, None);
        assert_eq!(status.node_info, None);
        assert_eq!(kept.metadata.managed_fields, None);
        assert_eq!(kept.metadata.annotations, None);
        assert!(status.allocatable.is_some());
    }
}
