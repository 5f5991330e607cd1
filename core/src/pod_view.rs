//! The part of a pod a node actor keeps in its cache: what the drain's decisions read, nothing
//! else.
//!
//! A pod as the API server sends it takes about 20 KiB once decoded (a `Container` alone is
//! 2.3 KiB before its strings: image, command, env, probes, mounts), and a node actor caches
//! every pod of its node for as long as the node is under maintenance: 500 nodes of 20 pods held
//! 200 MiB. The drain reads a few fields of each ([`crate::drain_plan`]), and even a `Pod` with
//! only those set is 2.5 KiB of empty fields. So the cache holds a [`CachedPod`], decoded
//! straight from the API server's JSON (what it does not name is skipped while parsing, never
//! allocated), and the drain's functions read it as it is, through
//! [`crate::drain_plan::DrainPod`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use crate::drain_plan::{DrainPod, MIRROR_POD_ANNOTATION, ResourceMap, names_a_resource};

/// A pod in a node actor's cache, with room for what the drain reads and nothing else:
/// - metadata: identity (name, namespace, UID, resourceVersion, creation and deletion times),
///   labels (podSelector, budgets, the operator's own pods), owner references (controller,
///   DaemonSet), finalizers, and of the annotations only the mirror-pod mark;
/// - spec: the node, the name and resources of each container that has any
///   (`podEvictionFilters`), the emptyDir volumes by name (`deleteEmptyDir`), the termination
///   grace period;
/// - status: the phase (finished pods, `waitForPodCompletion`).
///
/// It reads as a `v1` Pod (the watch decodes it from the pods' API), and every decision of
/// [`crate::drain_plan`] is the same on it as on the whole pod it came from (tested for every
/// kind of pod the drain tells apart).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct CachedPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<CachedSpec>,
    #[serde(default)]
    status: Option<CachedStatus>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct CachedSpec {
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    containers: Vec<CachedContainer>,
    #[serde(default)]
    init_containers: Option<Vec<CachedContainer>>,
    #[serde(default)]
    volumes: Option<Vec<CachedVolume>>,
    #[serde(default)]
    termination_grace_period_seconds: Option<i64>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
struct CachedContainer {
    name: String,
    #[serde(default)]
    resources: Option<CachedResources>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
struct CachedResources {
    #[serde(default)]
    requests: ResourceMap,
    #[serde(default)]
    limits: ResourceMap,
}

/// A volume by name; `empty_dir` says whether it is one (its settings are skipped).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct CachedVolume {
    name: String,
    #[serde(default)]
    empty_dir: Option<Present>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
struct CachedStatus {
    #[serde(default)]
    phase: Option<String>,
}

/// A field whose presence is all that matters: its value is skipped while parsing.
#[derive(Clone, Debug, Default, PartialEq)]
struct Present;

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer).map(|_| Present)
    }
}

impl k8s_openapi::Resource for CachedPod {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Pod as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for CachedPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl CachedPod {
    /// Drops what was decoded but is not kept: the metadata the drain does not read
    /// (managedFields, annotations but the mirror mark), the containers without resources, the
    /// volumes that are not emptyDirs. The watch applies it to each pod as it arrives.
    pub fn trim(&mut self) {
        self.metadata = trimmed_meta(std::mem::take(&mut self.metadata));
        if let Some(spec) = self.spec.as_mut() {
            spec.containers = cached_with_resources(std::mem::take(&mut spec.containers));
            spec.init_containers = spec.init_containers.take().map(cached_with_resources);
            spec.volumes = spec.volumes.take().map(|volumes| {
                compact(
                    volumes
                        .into_iter()
                        .filter(|v| v.empty_dir.is_some())
                        .collect(),
                )
            });
        }
    }

    /// `pod` as the node actor's watch caches it: encoded as the API server sends it, decoded
    /// as a `CachedPod`, trimmed.
    #[cfg(test)]
    pub(crate) fn cached(pod: &Pod) -> CachedPod {
        let json = serde_json::to_vec(pod).expect("a pod encodes");
        let mut cached: CachedPod = serde_json::from_slice(&json).expect("a pod decodes as cached");
        cached.trim();
        cached
    }
}

impl DrainPod for CachedPod {
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn phase(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| s.phase.as_deref())
    }

    fn has_empty_dir(&self) -> bool {
        self.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .any(|v| v.empty_dir.is_some())
    }

    fn requests_resource(&self, matches: &dyn Fn(&str) -> bool) -> bool {
        let resources = self
            .spec
            .iter()
            .flat_map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
            })
            .filter_map(CachedContainer::resource_maps);
        names_a_resource(resources, matches)
    }
}

impl CachedContainer {
    fn resource_maps(&self) -> Option<[&ResourceMap; 2]> {
        self.resources.as_ref().map(|r| [&r.requests, &r.limits])
    }

    /// Requests or limits any resource (the only containers `podEvictionFilters` can match).
    fn has_resources(&self) -> bool {
        names_a_resource(self.resource_maps().into_iter(), &|_| true)
    }
}

fn cached_with_resources(containers: Vec<CachedContainer>) -> Vec<CachedContainer> {
    compact(
        containers
            .into_iter()
            .filter(CachedContainer::has_resources)
            .collect(),
    )
}

/// Of the metadata, what the drain reads: identity, the times, labels, owners, finalizers, and
/// of the annotations only the mirror-pod mark.
fn trimmed_meta(meta: ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        resource_version: meta.resource_version,
        creation_timestamp: meta.creation_timestamp,
        deletion_timestamp: meta.deletion_timestamp,
        deletion_grace_period_seconds: meta.deletion_grace_period_seconds,
        labels: meta.labels,
        owner_references: meta.owner_references,
        finalizers: meta.finalizers,
        annotations: meta.annotations.and_then(|mut annotations| {
            let kept: BTreeMap<String, String> = annotations
                .remove_entry(MIRROR_POD_ANNOTATION)
                .into_iter()
                .collect();
            (!kept.is_empty()).then_some(kept)
        }),
        ..ObjectMeta::default()
    }
}

/// A filtered `Vec` collected in place keeps the capacity of the one it came from: the
/// containers and volumes dropped above would still take their room.
fn compact<T>(mut items: Vec<T>) -> Vec<T> {
    items.shrink_to_fit();
    items
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain_plan::{
        CompletionRules, DrainRules, OperatorIdentity, classify, plan, pods_to_wait_for,
        required_flags,
    };
    use crate::fixtures::*;
    use k8s_openapi::api::core::v1::{
        Container, ContainerStatus, EmptyDirVolumeSource, EnvVar, PodCondition, Probe,
        ResourceRequirements, SecretVolumeSource, Volume, VolumeMount,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use maintenance_crds::{DrainSpec, PodEvictionFilterEntry, WaitForPodCompletionSpec};

    /// A pod as a Deployment's ReplicaSet makes it and a kubelet reports it: the fields the drain
    /// does not read are the bulk of it.
    fn as_the_api_server_sends_it(mut p: Pod) -> Pod {
        p.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                "kubectl.kubernetes.io/restartedAt".into(),
                "2026-12-05".into(),
            );
        p.metadata.generate_name = Some("web-5d8f7-".into());
        p.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kube-controller-manager".into()),
            operation: Some("Update".into()),
            ..ManagedFieldsEntry::default()
        }]);
        if let Some(spec) = p.spec.as_mut() {
            for c in &mut spec.containers {
                c.image = Some("registry.example.com/web:1.2.3".into());
                c.command = Some(vec!["/bin/web".into(), "--port=8080".into()]);
                c.env = Some(
                    (0..20)
                        .map(|i| EnvVar {
                            name: format!("SETTING_{i}"),
                            value: Some(format!("value-{i}")),
                            ..EnvVar::default()
                        })
                        .collect(),
                );
                c.liveness_probe = Some(Probe::default());
                c.readiness_probe = Some(Probe::default());
                c.volume_mounts = Some(vec![VolumeMount {
                    name: "data".into(),
                    mount_path: "/data".into(),
                    ..VolumeMount::default()
                }]);
            }
            // The ServiceAccount token every pod mounts, and a sidecar without resources.
            spec.volumes.get_or_insert_with(Vec::new).push(Volume {
                name: "token".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some("web-token".into()),
                    ..SecretVolumeSource::default()
                }),
                ..Volume::default()
            });
            spec.containers.push(Container {
                name: "proxy".into(),
                image: Some("registry.example.com/proxy:2".into()),
                ..Container::default()
            });
            spec.service_account_name = Some("web".into());
            spec.scheduler_name = Some("default-scheduler".into());
        }
        if let Some(status) = p.status.as_mut() {
            status.conditions = Some(
                ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
                    .into_iter()
                    .map(|t| PodCondition {
                        type_: t.into(),
                        status: "True".into(),
                        ..PodCondition::default()
                    })
                    .collect(),
            );
            status.container_statuses = Some(vec![ContainerStatus {
                name: "main".into(),
                image: "registry.example.com/web:1.2.3".into(),
                ready: true,
                ..ContainerStatus::default()
            }]);
            status.pod_ip = Some("10.128.0.12".into());
            status.host_ip = Some("10.0.0.3".into());
        }
        p
    }

    fn with_gpu(mut p: Pod) -> Pod {
        if let Some(spec) = p.spec.as_mut() {
            spec.containers[0].resources = Some(ResourceRequirements {
                limits: Some(BTreeMap::from([(
                    "nvidia.com/gpu".to_string(),
                    Quantity("1".into()),
                )])),
                ..ResourceRequirements::default()
            });
        }
        p
    }

    fn with_empty_dir(mut p: Pod) -> Pod {
        if let Some(spec) = p.spec.as_mut() {
            spec.volumes = Some(vec![Volume {
                name: "data".into(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".into()),
                    ..EmptyDirVolumeSource::default()
                }),
                ..Volume::default()
            }]);
        }
        p
    }

    /// An init container that requests a GPU, and one that requests nothing.
    fn with_init_containers(mut p: Pod) -> Pod {
        if let Some(spec) = p.spec.as_mut() {
            spec.init_containers = Some(vec![
                Container {
                    name: "setup".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(BTreeMap::from([(
                            "nvidia.com/gpu".to_string(),
                            Quantity("1".into()),
                        )])),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                },
                Container {
                    name: "wait".into(),
                    image: Some("busybox".into()),
                    ..Container::default()
                },
            ]);
        }
        p
    }

    fn mirror(mut p: Pod) -> Pod {
        p.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(MIRROR_POD_ANNOTATION.into(), "hash".into());
        p
    }

    /// One pod of every kind the drain tells apart.
    fn every_kind() -> Vec<Pod> {
        [
            pod("ns", "web"),
            bare("ns", "bare"),
            owned_by(bare("ns", "ds"), "DaemonSet"),
            with_empty_dir(pod("ns", "cache")),
            with_gpu(pod("ns", "gpu")),
            with_init_containers(pod("ns", "init")),
            with_label(pod("ns", "labelled"), "tier", "batch"),
            with_phase(pod("ns", "done"), "Succeeded"),
            with_phase(bare("ns", "job"), "Running"),
            terminating(pod("ns", "going")),
            mirror(bare("kube-system", "static")),
            with_label(
                pod("maintenance", "operator"),
                crate::drain_plan::OPERATOR_NAME_LABEL,
                crate::drain_plan::OPERATOR_NAME_LABEL_VALUE,
            ),
        ]
        .into_iter()
        .map(as_the_api_server_sends_it)
        .collect()
    }

    fn cached(p: &Pod) -> CachedPod {
        CachedPod::cached(p)
    }

    /// Specs that exercise every rule that reads the pod: flags, selectors, resource filters.
    fn drain_specs() -> Vec<DrainSpec> {
        let base = DrainSpec::default();
        vec![
            base.clone(),
            DrainSpec {
                force: Some(true),
                delete_empty_dir: Some(true),
                ..base.clone()
            },
            DrainSpec {
                pod_selector: Some("tier=batch".into()),
                ..base.clone()
            },
            DrainSpec {
                pod_eviction_filters: Some(vec![PodEvictionFilterEntry {
                    by_resource_name_regex: Some("nvidia.com/gpu".into()),
                }]),
                ..base
            },
        ]
    }

    /// The drain reads the cache as it is: for every kind of pod and every rule that reads a pod,
    /// it decides on the cached pod what it decides on the whole one.
    #[test]
    fn every_drain_decision_is_the_same_on_the_cached_pod() {
        let identity = Some(OperatorIdentity::new("maintenance", None));
        let pods = every_kind();
        let small: Vec<CachedPod> = pods.iter().map(cached).collect();
        for spec in drain_specs() {
            let rules = DrainRules::new(&spec, identity.clone()).expect("valid spec");
            for (whole, cached) in pods.iter().zip(&small) {
                assert_eq!(
                    classify(&rules, whole),
                    classify(&rules, cached),
                    "{:?} under {spec:?}",
                    whole.metadata.name
                );
                assert_eq!(required_flags(whole), required_flags(cached));
            }
            assert_eq!(plan(&rules, &pods), plan(&rules, &small));
        }
        let waits = CompletionRules::new(&WaitForPodCompletionSpec::default()).expect("valid");
        assert_eq!(
            pods_to_wait_for(&waits, &pods),
            pods_to_wait_for(&waits, &small)
        );
        // The rules above tell these kinds apart: the comparison is not between two blanks.
        let rules = DrainRules::new(&DrainSpec::default(), identity).expect("valid spec");
        let decided = plan(&rules, &small);
        assert!(!decided.to_evict.is_empty() && !decided.blocked.is_empty());
        assert_eq!(decided.skipped.len(), 4, "{decided:?}");
    }

    #[test]
    fn what_the_drain_does_not_read_is_dropped() {
        let whole = as_the_api_server_sends_it(with_empty_dir(with_gpu(pod("ns", "web"))));
        let small = cached(&whole);
        let spec = small.spec.as_ref().expect("spec kept");
        assert_eq!(spec.containers.len(), 1, "the sidecar has no resources");
        let volumes: Vec<&str> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(volumes, ["data"], "the emptyDir, not the token");
        // The room of what was dropped is given back, not only the elements.
        assert_eq!(spec.containers.capacity(), spec.containers.len());
        let kept_volumes = spec.volumes.as_ref().expect("the emptyDir");
        assert_eq!(kept_volumes.capacity(), kept_volumes.len());
        let container = &spec.containers[0];
        assert_eq!(container.name, "main");
        assert!(container.has_resources());
        assert_eq!(small.phase(), Some("Running"));
        assert_eq!(small.metadata.annotations, None);
        assert_eq!(small.metadata.managed_fields, None);
        assert_eq!(small.metadata.generate_name, None);
        assert_eq!(small.metadata.uid, whole.metadata.uid);
        assert_eq!(
            small.metadata.owner_references,
            whole.metadata.owner_references
        );
        assert_eq!(small.metadata.labels, whole.metadata.labels);
    }

    #[test]
    fn the_mirror_pod_mark_is_the_annotation_kept() {
        let small = cached(&as_the_api_server_sends_it(mirror(bare(
            "kube-system",
            "etcd",
        ))));
        let annotations = small.metadata.annotations.expect("mark kept");
        assert_eq!(annotations.len(), 1);
        assert!(annotations.contains_key(MIRROR_POD_ANNOTATION));
    }

    /// A pod with no spec or status (a tombstone's shape) decodes, and reads as a pod with
    /// nothing in it.
    #[test]
    fn a_pod_without_spec_or_status_decodes() {
        let empty: CachedPod =
            serde_json::from_str(r#"{"metadata":{"name":"p"}}"#).expect("decodes");
        assert_eq!(empty.metadata.name.as_deref(), Some("p"));
        assert_eq!(empty.phase(), None);
        assert!(!empty.has_empty_dir() && !empty.requests_resource(&|_| true));
    }

    /// Room in the cache: the cached pod holds none of the 2.5 KiB of empty fields a trimmed
    /// `Pod` carries, and a container with resources keeps its name and quantities, not the
    /// 2.3 KiB of a `Container`.
    #[test]
    fn a_cached_pod_takes_a_fraction_of_a_trimmed_one() {
        let (cached_size, pod_size) = (size_of::<CachedPod>(), size_of::<Pod>());
        println!(
            "inline: CachedPod {cached_size} bytes, Pod {pod_size}; CachedContainer {}, Container {}",
            size_of::<CachedContainer>(),
            size_of::<Container>()
        );
        assert!(
            cached_size * 3 < pod_size,
            "a CachedPod is {cached_size} bytes inline, a Pod {pod_size}"
        );
        assert!(size_of::<CachedContainer>() * 10 < size_of::<Container>());
        let whole = as_the_api_server_sends_it(with_empty_dir(with_gpu(pod("ns", "web"))));
        let small = cached(&whole);
        let spec = small.spec.as_ref().expect("spec kept");
        assert_eq!(spec.containers.len(), 1, "the sidecar has no resources");
        assert_eq!(spec.containers.capacity(), 1, "and its room is given back");
        let volumes = spec.volumes.as_ref().expect("the emptyDir");
        assert_eq!((volumes.len(), volumes.capacity()), (1, 1), "not the token");
        assert_eq!(small.metadata.managed_fields, None);
    }
}
