//! Builders of the objects that unit tests of the core feed to its decisions, the instant they
//! run at, and the strategies the scheduler's properties share.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, Node, NodeCondition, NodeSpec, NodeStatus, Pod, PodSpec, PodStatus, Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use maintenance_crds::{
    DrainSpec, FINALIZER, NodeMaintenance, NodeMaintenanceSpec, NodeMaintenanceStatus, Phase,
};
use proptest::prelude::*;

use crate::conditions;
use crate::scheduler::{Decision, NodeState, RequestState, Waiting};

/// A running pod owned by a ReplicaSet: the ordinary case, evicted with default flags.
pub fn pod(ns: &str, name: &str) -> Pod {
    owned_by(bare(ns, name), "ReplicaSet")
}

/// A running pod without a controller.
pub fn bare(ns: &str, name: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{ns}-{name}")),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            ..PodStatus::default()
        }),
    }
}

pub fn owned_by(mut p: Pod, kind: &str) -> Pod {
    p.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: kind.into(),
        name: "owner".into(),
        uid: "owner-uid".into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    p
}

pub fn with_label(mut p: Pod, k: &str, v: &str) -> Pod {
    insert(&mut p.metadata.labels, k, v);
    p
}

/// Adds `key: value` to labels or annotations, made if there were none.
fn insert(map: &mut Option<BTreeMap<String, String>>, key: &str, value: &str) {
    map.get_or_insert_with(BTreeMap::new)
        .insert(key.into(), value.into());
}

pub fn with_phase(mut p: Pod, phase: &str) -> Pod {
    p.status = Some(PodStatus {
        phase: Some(phase.into()),
        ..PodStatus::default()
    });
    p
}

pub fn terminating(mut p: Pod) -> Pod {
    p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    p
}

pub fn created_at(mut p: Pod, at: Timestamp) -> Pod {
    p.metadata.creation_timestamp = Some(Time(at));
    p
}

/// The instant tests count from, `seconds` later (`at(0)` is 2023-11-14T22:13:20Z): every test
/// runs at a fixed "now".
pub fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + seconds).expect("a valid time")
}

/// An RFC 3339 time, for tests that read a wall clock (windows, time zones).
pub fn time(text: &str) -> Timestamp {
    text.parse().expect("an RFC 3339 time")
}

/// A NodeMaintenance named `name` with nothing else set (no namespace, node or requestor): each
/// method sets one thing, [`RequestBuilder::build`] gives the object.
pub fn request(name: &str) -> RequestBuilder {
    RequestBuilder(NodeMaintenance::new(name, NodeMaintenanceSpec::default()))
}

pub struct RequestBuilder(NodeMaintenance);

impl RequestBuilder {
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.into());
        self
    }

    pub fn node(mut self, node: &str) -> Self {
        self.0.spec.node_name = node.into();
        self
    }

    pub fn requestor(mut self, requestor: &str) -> Self {
        self.0.spec.requestor_id = requestor.into();
        self
    }

    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }

    pub fn version(mut self, resource_version: &str) -> Self {
        self.0.metadata.resource_version = Some(resource_version.into());
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }

    /// Our finalizer, as the admission puts it on.
    pub fn finalizer(mut self) -> Self {
        self.0.metadata.finalizers = Some(vec![FINALIZER.into()]);
        self
    }

    /// A default `drainSpec` when `drain`.
    pub fn drain(mut self, drain: bool) -> Self {
        self.0.spec.drain_spec = drain.then(DrainSpec::default);
        self
    }

    pub fn created(mut self, at: Timestamp) -> Self {
        self.0.metadata.creation_timestamp = Some(Time(at));
        self
    }

    /// A status whose `Ready` condition shows `phase` since `since`.
    pub fn phase(mut self, phase: Phase, since: Timestamp) -> Self {
        let mut status = NodeMaintenanceStatus::default();
        conditions::set_phase(&mut status.conditions, phase, "", since, None);
        self.0.status = Some(status);
        self
    }

    pub fn build(self) -> NodeMaintenance {
        self.0
    }
}

/// A Node named `name` with nothing else set: each method sets one thing, [`NodeBuilder::build`]
/// gives the object.
pub fn node(name: &str) -> NodeBuilder {
    NodeBuilder(Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    })
}

pub struct NodeBuilder(Node);

impl NodeBuilder {
    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }

    pub fn version(mut self, resource_version: &str) -> Self {
        self.0.metadata.resource_version = Some(resource_version.into());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.0.metadata.labels, key, value);
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.0.metadata.annotations, key, value);
        self
    }

    /// `spec.unschedulable` as given (`None`: a spec without the field).
    pub fn unschedulable(mut self, unschedulable: Option<bool>) -> Self {
        self.0
            .spec
            .get_or_insert_with(NodeSpec::default)
            .unschedulable = unschedulable;
        self
    }

    /// These taints (`key`, `effect`) in the spec; none: a spec without the field.
    pub fn taints(mut self, taints: &[(&str, &str)]) -> Self {
        self.0.spec.get_or_insert_with(NodeSpec::default).taints =
            (!taints.is_empty()).then(|| {
                taints
                    .iter()
                    .map(|(key, effect)| Taint {
                        key: (*key).into(),
                        effect: (*effect).into(),
                        ..Taint::default()
                    })
                    .collect()
            });
        self
    }

    /// A status whose only condition is `Ready` with this status (`None`: no conditions).
    pub fn ready(mut self, status: Option<&str>) -> Self {
        self.0
            .status
            .get_or_insert_with(NodeStatus::default)
            .conditions = status.map(|status| {
            vec![NodeCondition {
                type_: "Ready".into(),
                status: status.into(),
                ..NodeCondition::default()
            }]
        });
        self
    }

    pub fn build(self) -> Node {
        self.0
    }
}

/// The names of the requests a round admitted, in order.
pub fn admitted(decision: &Decision) -> Vec<&str> {
    decision.scheduled.iter().map(|k| k.name.as_str()).collect()
}

/// The waiting entry of request `name` (any namespace); panics, showing the decision, if it
/// does not wait.
pub fn waiting<'d>(decision: &'d Decision, name: &str) -> &'d Waiting {
    decision
        .waiting
        .iter()
        .find(|w| w.key.name == name)
        .unwrap_or_else(|| panic!("{name} is not waiting: {decision:#?}"))
}

impl RequestState {
    /// A request `team/<name>` on `node` by `fw.example.com`, in `phase`, created `created`
    /// seconds after [`at`]`(0)`.
    pub fn for_test(name: &str, node: &str, phase: Phase, created: i64) -> RequestState {
        RequestState {
            namespace: "team".to_string(),
            name: name.to_string(),
            node_name: node.to_string(),
            requestor_id: "fw.example.com".to_string(),
            phase,
            created: Some(at(created)),
            deleting: false,
            released: false,
            admission_retry: None,
            yielded: None,
            node_group: None,
        }
    }
}

impl NodeState {
    /// A node named `name` with these labels, `unavailable` (cordoned or not Ready) or not.
    pub fn for_test(name: &str, unavailable: bool, labels: &[(&str, &str)]) -> NodeState {
        NodeState {
            name: name.to_string(),
            unavailable,
            labels: Arc::new(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
        }
    }
}

/// A limit of the scheduler's properties: a number up to `max_int`, or a percentage.
pub fn int_or_percent(max_int: i32) -> impl Strategy<Value = IntOrString> {
    prop_oneof![
        (0..=max_int).prop_map(IntOrString::Int),
        (0..=100u32).prop_map(|p| IntOrString::String(format!("{p}%"))),
    ]
}

/// A phase for the scheduler's properties: mostly Pending, so that rounds have work.
pub fn arb_phase() -> impl Strategy<Value = Phase> {
    prop_oneof![
        3 => Just(Phase::Pending),
        1 => proptest::sample::select(Phase::ALL.to_vec()),
    ]
}

/// The oracle's reading of a limit against `total` nodes, written apart from the scheduler's: a
/// number as it is, a percentage rounded up or down.
pub fn resolve_limit(value: &IntOrString, total: u64, round_up: bool) -> u64 {
    match value {
        IntOrString::Int(i) => u64::try_from(*i).unwrap(),
        IntOrString::String(s) => {
            let p: u64 = s.trim_end_matches('%').parse().unwrap();
            if round_up {
                (p * total).div_ceil(100)
            } else {
                p * total / 100
            }
        }
    }
}
