//! Builders of the objects that unit tests of the core feed to its decisions.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

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
    p.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(k.into(), v.into());
    p
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
