//! What a drain does to the pods of one node, decided purely from the spec and a pod snapshot.
//!
//! The rules follow `kubectl drain`, because that is what users already know:
//! - skipped: pods already terminating, the operator's own pods, mirror (static) pods, DaemonSet pods,
//!   pods outside `podSelector`, and pods outside `podEvictionFilters` when that list is non-empty;
//! - finished pods (phase Succeeded or Failed) are evicted without further checks: they hold no work
//!   and the API server lets a terminal pod go regardless of PodDisruptionBudgets;
//! - blocked until the user sets a flag: pods without a controller need `force`, pods with an
//!   emptyDir volume need `deleteEmptyDir`. A blocked pod is reported with the flag that would
//!   allow it, so the status can say so instead of the drain waiting silently;
//! - everything else is evicted.
//!
//! Deliberate differences from kubectl:
//! - every DaemonSet-owned pod is skipped, even with `force`. kubectl deletes a DaemonSet pod whose
//!   DaemonSet no longer exists when forced, but whether the owner exists cannot be known from the
//!   pod alone, and the DaemonSet controller ignores cordons anyway;
//! - pods already terminating are not evicted again (kubectl re-issues the delete). Whether the drain
//!   still waits for them to disappear is up to the caller: they are listed in `DrainPlan::skipped`
//!   with `SkipReason::Terminating`.
//!
//! Everything here is pure: the node actor calls it on every pod change, and a spec change (say,
//! `force` turned on) takes effect by building new `DrainRules`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use maintenance_crds::{BlockedPod, DrainSpec, WaitForPodCompletionSpec};
use regex::Regex;
use thiserror::Error;

use crate::label_selector::{ParsedSelector, SelectorParseError, matches_label_selector};

/// Annotation the kubelet puts on the API mirror of a static pod.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Label key that marks the operator's own pods (together with [`OPERATOR_NAME_LABEL_VALUE`]).
pub const OPERATOR_NAME_LABEL: &str = "app.kubernetes.io/name";
/// Label value that marks the operator's own pods.
pub const OPERATOR_NAME_LABEL_VALUE: &str = "maintenance-operator";

/// What the drain reads of a pod. The API's `Pod` answers it, and so does the node actor's cached
/// pod ([`crate::pod_view::CachedPod`]), which keeps nothing else: every decision here is made on
/// either, and the cache never has to be turned back into `Pod`s.
pub trait DrainPod {
    /// Identity, times, labels, owners, annotations.
    fn meta(&self) -> &ObjectMeta;
    /// `status.phase`.
    fn phase(&self) -> Option<&str>;
    /// Whether one of its volumes is an emptyDir.
    fn has_empty_dir(&self) -> bool;
    /// Whether a container or init container requests or limits a resource whose name `matches`.
    fn requests_resource(&self, matches: &dyn Fn(&str) -> bool) -> bool;
}

impl DrainPod for Pod {
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
            .filter_map(|c| c.resources.as_ref())
            .map(|r| [&r.requests, &r.limits]);
        names_a_resource(resources, matches)
    }
}

/// A container's requests or limits.
pub(crate) type ResourceMap = Option<BTreeMap<String, Quantity>>;

/// Whether any of these containers' `[requests, limits]` names a resource that `matches`.
pub(crate) fn names_a_resource<'a>(
    mut resources: impl Iterator<Item = [&'a ResourceMap; 2]>,
    matches: &dyn Fn(&str) -> bool,
) -> bool {
    resources.any(|maps| {
        maps.into_iter()
            .flatten()
            .any(|m| m.keys().any(|name| matches(name)))
    })
}

/// A pod behind a reference or an `Arc` (as a watch cache hands them out) reads as the pod.
macro_rules! drain_pod_through {
    ($($pointer:ty),*) => {$(
        impl<P: DrainPod + ?Sized> DrainPod for $pointer {
            fn meta(&self) -> &ObjectMeta {
                (**self).meta()
            }

            fn phase(&self) -> Option<&str> {
                (**self).phase()
            }

            fn has_empty_dir(&self) -> bool {
                (**self).has_empty_dir()
            }

            fn requests_resource(&self, matches: &dyn Fn(&str) -> bool) -> bool {
                (**self).requests_resource(matches)
            }
        }
    )*};
}

drain_pod_through!(Arc<P>, &P);

/// A spec value that cannot be used; the message names the field, the value, and what to change.
#[derive(Debug, Error)]
pub enum DrainPlanError {
    #[error(
        "{field}: {source}; write it as `kubectl get pods -l` accepts it, \
         e.g. \"app=web,tier in (a,b),!canary\", or leave it empty to select all pods"
    )]
    InvalidPodSelector {
        /// The spec field, e.g. `spec.drainSpec.podSelector`.
        field: &'static str,
        source: SelectorParseError,
    },
    #[error(
        "{field}: {value:?} is not a valid regular expression ({source}); \
         fix the expression, e.g. \"nvidia.com/gpu\" or \"^example.com/.*\""
    )]
    InvalidResourceNameRegex {
        /// The spec field including the list index, e.g.
        /// `spec.drainSpec.podEvictionFilters[1].byResourceNameRegex`.
        field: String,
        value: String,
        source: regex::Error,
    },
}

/// Who the operator is, so that a drain of its own node never evicts it.
///
/// The operator learns its namespace and pod name from the environment (`POD_NAMESPACE`,
/// `POD_NAME`, filled in by the downward API); reading them is the caller's job, to keep this
/// module free of I/O.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorIdentity {
    namespace: String,
    pod_name: Option<String>,
}

impl OperatorIdentity {
    /// `pod_name` is `None` when the operator does not run in a pod (e.g. on a developer machine);
    /// then only the label check applies.
    pub fn new(namespace: impl Into<String>, pod_name: Option<String>) -> Self {
        Self {
            namespace: namespace.into(),
            pod_name,
        }
    }

    /// True for the operator's own pod, and for any pod in the operator's namespace labelled
    /// `app.kubernetes.io/name=maintenance-operator`: with leader election the other replicas are
    /// operator pods too, and evicting a standby would only take away the failover.
    pub fn is_operator_pod(&self, pod: &impl DrainPod) -> bool {
        let meta = pod.meta();
        if meta.namespace.as_deref() != Some(self.namespace.as_str()) {
            return false;
        }
        let same_name = self.pod_name.is_some() && meta.name == self.pod_name;
        let labelled = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(OPERATOR_NAME_LABEL))
            .is_some_and(|v| v == OPERATOR_NAME_LABEL_VALUE);
        same_name || labelled
    }
}

/// A pod as the drain tracks it. The UID tells a pod that is gone from a new pod with the same name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// Empty only for pods that have not been stored by the API server (test fixtures).
    pub uid: String,
}

impl PodRef {
    pub fn from_pod(pod: &impl DrainPod) -> Self {
        let meta = pod.meta();
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
        }
    }

    /// `namespace/name`, the form status lists and messages use.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why the drain leaves a pod alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// The pod already has a deletionTimestamp.
    Terminating,
    /// The pod is the operator itself (or another replica of it).
    OperatorPod,
    /// A static pod's mirror: the kubelet owns it and the API cannot remove it.
    MirrorPod,
    /// Controlled by a DaemonSet, which would recreate it on the node at once.
    DaemonSet,
    /// Outside `spec.drainSpec.podSelector`.
    NotSelected,
    /// No container requests a resource matched by `spec.drainSpec.podEvictionFilters`.
    NoEvictionFilterMatch,
}

impl SkipReason {
    /// A short machine-readable cause, for logs and metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            SkipReason::Terminating => "Terminating",
            SkipReason::OperatorPod => "OperatorPod",
            SkipReason::MirrorPod => "MirrorPod",
            SkipReason::DaemonSet => "DaemonSet",
            SkipReason::NotSelected => "NotSelectedByPodSelector",
            SkipReason::NoEvictionFilterMatch => "NoPodEvictionFilterMatch",
        }
    }
}

/// Why the drain may not evict a pod until the user changes `spec.drainSpec`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockReason {
    /// No controller would recreate the pod; needs `force`.
    NeedsForce,
    /// The pod's emptyDir data would be lost; needs `deleteEmptyDir`.
    NeedsDeleteEmptyDir,
    /// Both at once. Reported together so that the user fixes the spec in one edit, not two.
    NeedsForceAndDeleteEmptyDir,
}

impl BlockReason {
    /// The reason for a pod that needs these flags, `None` when it needs neither.
    fn from_needs(needs_force: bool, needs_delete_empty_dir: bool) -> Option<Self> {
        match (needs_force, needs_delete_empty_dir) {
            (false, false) => None,
            (true, false) => Some(BlockReason::NeedsForce),
            (false, true) => Some(BlockReason::NeedsDeleteEmptyDir),
            (true, true) => Some(BlockReason::NeedsForceAndDeleteEmptyDir),
        }
    }

    /// Whether `force` is (one of) the flag(s) that would let the pod go.
    pub fn needs_force(&self) -> bool {
        matches!(
            self,
            BlockReason::NeedsForce | BlockReason::NeedsForceAndDeleteEmptyDir
        )
    }

    /// Whether `deleteEmptyDir` is (one of) the flag(s) that would let the pod go.
    pub fn needs_delete_empty_dir(&self) -> bool {
        matches!(
            self,
            BlockReason::NeedsDeleteEmptyDir | BlockReason::NeedsForceAndDeleteEmptyDir
        )
    }

    /// The `reason` of the pod's entry in `status.drain.blocked`.
    pub fn reason(&self) -> &'static str {
        match self {
            BlockReason::NeedsForce => "NeedsForce",
            BlockReason::NeedsDeleteEmptyDir => "NeedsDeleteEmptyDir",
            BlockReason::NeedsForceAndDeleteEmptyDir => "NeedsForceAndDeleteEmptyDir",
        }
    }

    /// What a person needs to know: the pod, why it is held back, and the flag that would allow it.
    pub fn message(&self, pod_key: &str) -> String {
        const NO_CONTROLLER: &str = "has no controller and would not be recreated";
        const EMPTY_DIR: &str = "uses an emptyDir volume whose data would be lost";
        match self {
            BlockReason::NeedsForce => {
                format!("pod {pod_key} {NO_CONTROLLER}; set spec.drainSpec.force: true to evict it")
            }
            BlockReason::NeedsDeleteEmptyDir => format!(
                "pod {pod_key} {EMPTY_DIR}; set spec.drainSpec.deleteEmptyDir: true to evict it"
            ),
            BlockReason::NeedsForceAndDeleteEmptyDir => format!(
                "pod {pod_key} {NO_CONTROLLER} and {EMPTY_DIR}; set spec.drainSpec.force: true \
                 and spec.drainSpec.deleteEmptyDir: true to evict it"
            ),
        }
    }

    /// The entry for `status.drain.blocked`.
    pub fn to_blocked_pod(&self, pod: &PodRef) -> BlockedPod {
        let key = pod.key();
        BlockedPod {
            message: self.message(&key),
            reason: self.reason().to_owned(),
            pod: key,
        }
    }
}

/// What the drain does with one pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodDisposition {
    Evict,
    Skip(SkipReason),
    Blocked(BlockReason),
}

/// A `DrainSpec` compiled once: the selector parsed and the regexes built, so that classifying a
/// pod costs no parsing and a bad spec is reported once, up front.
#[derive(Clone, Debug)]
pub struct DrainRules {
    force: bool,
    delete_empty_dir: bool,
    pod_selector: ParsedSelector,
    /// `None` when `podEvictionFilters` is empty (no filtering). Entries without a regex are left
    /// out: they match nothing, so a list of only such entries selects no pod.
    resource_filters: Option<Vec<Regex>>,
    operator: Option<OperatorIdentity>,
}

impl DrainRules {
    pub fn new(
        spec: &DrainSpec,
        operator: Option<OperatorIdentity>,
    ) -> Result<Self, DrainPlanError> {
        let pod_selector = parse_selector("spec.drainSpec.podSelector", &spec.pod_selector)?;
        let entries = spec.pod_eviction_filters();
        let resource_filters = if entries.is_empty() {
            None
        } else {
            let mut regexes = Vec::with_capacity(entries.len());
            for (i, entry) in entries.iter().enumerate() {
                let Some(pattern) = &entry.by_resource_name_regex else {
                    continue;
                };
                let regex =
                    Regex::new(pattern).map_err(|e| DrainPlanError::InvalidResourceNameRegex {
                        field: format!(
                            "spec.drainSpec.podEvictionFilters[{i}].byResourceNameRegex"
                        ),
                        value: pattern.clone(),
                        source: e,
                    })?;
                regexes.push(regex);
            }
            Some(regexes)
        };
        Ok(Self {
            force: spec.force(),
            delete_empty_dir: spec.delete_empty_dir(),
            pod_selector,
            resource_filters,
            operator,
        })
    }

    /// Whether any container or init container requests (in `requests` or `limits`) a resource
    /// whose name one of the filters matches. As in the NVIDIA operator, a regex matches
    /// anywhere in the name unless anchored with `^`/`$`.
    fn passes_eviction_filters(&self, pod: &impl DrainPod) -> bool {
        let Some(filters) = &self.resource_filters else {
            return true;
        };
        pod.requests_resource(&|name| filters.iter().any(|re| re.is_match(name)))
    }
}

fn parse_selector(
    field: &'static str,
    selector: &Option<String>,
) -> Result<ParsedSelector, DrainPlanError> {
    ParsedSelector::parse(selector.as_deref().unwrap_or_default())
        .map_err(|source| DrainPlanError::InvalidPodSelector { field, source })
}

fn is_terminating(pod: &impl DrainPod) -> bool {
    pod.meta().deletion_timestamp.is_some()
}

/// A pod in phase Succeeded or Failed: it holds no work, and the API server lets it go whatever
/// its PodDisruptionBudgets say.
pub fn is_finished(pod: &impl DrainPod) -> bool {
    matches!(pod.phase(), Some("Succeeded" | "Failed"))
}

fn is_mirror(pod: &impl DrainPod) -> bool {
    pod.meta()
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
}

/// The owner reference of the pod's controller (the one marked `controller: true`), the object
/// that would recreate the pod after an eviction.
pub fn controller_ref(pod: &impl DrainPod) -> Option<&OwnerReference> {
    pod.meta()
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

fn controller_kind(pod: &impl DrainPod) -> Option<&str> {
    controller_ref(pod).map(|o| o.kind.as_str())
}

/// The flags evicting `pod` depends on, whatever the spec sets: `force` for a pod without a
/// controller, `deleteEmptyDir` for a pod with an emptyDir volume. With the flags set the pod is
/// evicted all the same, at that price (gone for good, data lost), which is what a check before
/// a drain warns about.
pub fn required_flags(pod: &impl DrainPod) -> Option<BlockReason> {
    BlockReason::from_needs(controller_ref(pod).is_none(), pod.has_empty_dir())
}

/// Whether `pdb` guards a pod of this namespace with these labels, as the Eviction API decides
/// it: a budget of the same namespace whose selector matches. A budget without selector guards
/// nothing; an empty selector guards every pod of its namespace (policy/v1).
pub fn pdb_selects(
    pdb: &PodDisruptionBudget,
    pod_namespace: &str,
    pod_labels: &BTreeMap<String, String>,
) -> bool {
    pdb.metadata.namespace.as_deref().unwrap_or_default() == pod_namespace
        && pdb
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .is_some_and(|selector| matches_label_selector(selector, pod_labels))
}

/// The budgets among `pdbs` that guard `pod`, in the order given. More than one makes the
/// Eviction API refuse the pod (500) until only one is left.
pub fn covering_pdbs<'a>(
    pod: &impl DrainPod,
    pdbs: &'a [PodDisruptionBudget],
) -> Vec<&'a PodDisruptionBudget> {
    let no_labels = BTreeMap::new();
    let labels = pod.meta().labels.as_ref().unwrap_or(&no_labels);
    let namespace = pod.meta().namespace.as_deref().unwrap_or_default();
    pdbs.iter()
        .filter(|pdb| pdb_selects(pdb, namespace, labels))
        .collect()
}

/// Decides what the drain does with `pod`. The first matching rule wins, in this order: terminating,
/// operator pod, mirror, DaemonSet, podSelector, podEvictionFilters, finished, force, deleteEmptyDir.
pub fn classify(rules: &DrainRules, pod: &impl DrainPod) -> PodDisposition {
    if is_terminating(pod) {
        return PodDisposition::Skip(SkipReason::Terminating);
    }
    if rules
        .operator
        .as_ref()
        .is_some_and(|op| op.is_operator_pod(pod))
    {
        return PodDisposition::Skip(SkipReason::OperatorPod);
    }
    if is_mirror(pod) {
        return PodDisposition::Skip(SkipReason::MirrorPod);
    }
    let controller = controller_kind(pod);
    if controller == Some("DaemonSet") {
        return PodDisposition::Skip(SkipReason::DaemonSet);
    }
    if !rules.pod_selector.matches(pod.meta().labels.as_ref()) {
        return PodDisposition::Skip(SkipReason::NotSelected);
    }
    if !rules.passes_eviction_filters(pod) {
        return PodDisposition::Skip(SkipReason::NoEvictionFilterMatch);
    }
    if is_finished(pod) {
        return PodDisposition::Evict;
    }
    let needs_force = controller.is_none() && !rules.force;
    let needs_empty_dir = !rules.delete_empty_dir && pod.has_empty_dir();
    match BlockReason::from_needs(needs_force, needs_empty_dir) {
        None => PodDisposition::Evict,
        Some(reason) => PodDisposition::Blocked(reason),
    }
}

/// The drain of one node, from a snapshot of its pods. Each list is sorted by namespace and name so
/// that the status does not reorder between snapshots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainPlan {
    /// All pods in the snapshot, whatever happens to them (`status.drain.totalPods`).
    pub total_pods: usize,
    pub to_evict: Vec<PodRef>,
    pub blocked: Vec<(PodRef, BlockReason)>,
    pub skipped: Vec<(PodRef, SkipReason)>,
}

/// Over pods, shared pods or cached pods (`Arc<CachedPod>` from a node actor's watch cache, not
/// copied for each step).
pub fn plan<P: DrainPod>(rules: &DrainRules, pods: &[P]) -> DrainPlan {
    let mut out = DrainPlan {
        total_pods: pods.len(),
        ..DrainPlan::default()
    };
    for pod in pods {
        let pod_ref = PodRef::from_pod(pod);
        match classify(rules, pod) {
            PodDisposition::Evict => out.to_evict.push(pod_ref),
            PodDisposition::Blocked(reason) => out.blocked.push((pod_ref, reason)),
            PodDisposition::Skip(reason) => out.skipped.push((pod_ref, reason)),
        }
    }
    out.to_evict.sort();
    out.blocked.sort_by(|a, b| a.0.cmp(&b.0));
    out.skipped.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `status.drain.drainProgress`: the percentage of the pods to evict that are gone, rounded down so
/// that 100 means all of them. Nothing to evict is complete.
pub fn drain_progress(eviction_pods: usize, remaining: usize) -> i32 {
    if eviction_pods == 0 {
        return 100;
    }
    let gone = eviction_pods.saturating_sub(remaining) as u128;
    let percent = gone * 100 / eviction_pods as u128;
    // At most 100 by construction.
    i32::try_from(percent).unwrap_or(100)
}

/// A `WaitForPodCompletionSpec` with its selector parsed once.
#[derive(Clone, Debug)]
pub struct CompletionRules {
    pod_selector: ParsedSelector,
}

impl CompletionRules {
    /// An empty or absent selector waits for every pod on the node.
    pub fn new(spec: &WaitForPodCompletionSpec) -> Result<Self, DrainPlanError> {
        Ok(Self {
            pod_selector: parse_selector(
                "spec.waitForPodCompletion.podSelector",
                &spec.pod_selector,
            )?,
        })
    }
}

/// The pods `waitForPodCompletion` still waits for, sorted by namespace and name: selected pods that
/// are neither finished (Succeeded/Failed) nor terminating.
///
/// DaemonSet and mirror pods are never waited for: they run for the life of the node, so waiting
/// would always end in the timeout (or forever with `timeoutSeconds: 0`), and the drain leaves them
/// in place anyway.
pub fn pods_to_wait_for<P: DrainPod>(rules: &CompletionRules, pods: &[P]) -> Vec<PodRef> {
    let mut out: Vec<PodRef> = pods
        .iter()
        .filter(|pod| {
            rules.pod_selector.matches(pod.meta().labels.as_ref())
                && !is_finished(pod)
                && !is_terminating(pod)
                && !is_mirror(pod)
                && controller_kind(pod) != Some("DaemonSet")
        })
        .map(PodRef::from_pod)
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, EmptyDirVolumeSource, ResourceRequirements, Volume,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use maintenance_crds::PodEvictionFilterEntry;

    use crate::fixtures::{bare, owned_by, pod, terminating, with_label, with_phase};

    // ---- fixtures ----

    fn mirror(mut p: Pod) -> Pod {
        p.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(MIRROR_POD_ANNOTATION.into(), "hash".into());
        p
    }

    fn with_empty_dir(mut p: Pod) -> Pod {
        if let Some(spec) = p.spec.as_mut() {
            spec.volumes.get_or_insert_with(Vec::new).push(Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            });
        }
        p
    }

    fn resources(names: &[&str]) -> Option<BTreeMap<String, Quantity>> {
        Some(
            names
                .iter()
                .map(|n| (n.to_string(), Quantity("1".into())))
                .collect(),
        )
    }

    #[derive(Clone, Copy)]
    enum Where {
        Requests,
        Limits,
    }

    fn with_container_resource(mut p: Pod, init: bool, place: Where, name: &str) -> Pod {
        let req = match place {
            Where::Requests => ResourceRequirements {
                requests: resources(&[name]),
                ..ResourceRequirements::default()
            },
            Where::Limits => ResourceRequirements {
                limits: resources(&[name]),
                ..ResourceRequirements::default()
            },
        };
        let c = Container {
            name: format!("c-{name}"),
            resources: Some(req),
            ..Container::default()
        };
        if let Some(spec) = p.spec.as_mut() {
            if init {
                spec.init_containers.get_or_insert_with(Vec::new).push(c);
            } else {
                spec.containers.push(c);
            }
        }
        p
    }

    fn spec() -> DrainSpec {
        DrainSpec::default()
    }

    fn rules(s: &DrainSpec) -> DrainRules {
        match DrainRules::new(s, None) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    fn filters(regexes: &[Option<&str>]) -> DrainSpec {
        DrainSpec {
            pod_eviction_filters: Some(
                regexes
                    .iter()
                    .map(|r| PodEvictionFilterEntry {
                        by_resource_name_regex: r.map(str::to_owned),
                    })
                    .collect(),
            ),
            ..spec()
        }
    }

    use PodDisposition::{Blocked, Evict, Skip};

    // ---- selection matrix ----

    #[test]
    fn controller_owned_pods_are_evicted() {
        for kind in [
            "ReplicaSet",
            "StatefulSet",
            "Job",
            "ReplicationController",
            "MyCrd",
        ] {
            let p = owned_by(bare("ns", "p"), kind);
            assert_eq!(classify(&rules(&spec()), &p), Evict, "{kind}");
        }
    }

    #[test]
    fn daemonset_pods_are_skipped_even_with_force() {
        let p = owned_by(bare("ns", "ds"), "DaemonSet");
        assert_eq!(classify(&rules(&spec()), &p), Skip(SkipReason::DaemonSet));
        let forced = DrainSpec {
            force: Some(true),
            delete_empty_dir: Some(true),
            ..spec()
        };
        assert_eq!(classify(&rules(&forced), &p), Skip(SkipReason::DaemonSet));
        // Finished DaemonSet pods are still the DaemonSet's business.
        let done = with_phase(p, "Failed");
        assert_eq!(
            classify(&rules(&spec()), &done),
            Skip(SkipReason::DaemonSet)
        );
    }

    #[test]
    fn a_non_controller_daemonset_owner_does_not_count() {
        let mut p = owned_by(bare("ns", "p"), "DaemonSet");
        if let Some(refs) = p.metadata.owner_references.as_mut() {
            refs[0].controller = Some(false);
        }
        assert_eq!(
            classify(&rules(&spec()), &p),
            Blocked(BlockReason::NeedsForce)
        );
    }

    #[test]
    fn mirror_pods_are_skipped() {
        let p = mirror(bare("kube-system", "etcd-node1"));
        let forced = DrainSpec {
            force: Some(true),
            ..spec()
        };
        assert_eq!(classify(&rules(&spec()), &p), Skip(SkipReason::MirrorPod));
        assert_eq!(classify(&rules(&forced), &p), Skip(SkipReason::MirrorPod));
    }

    #[test]
    fn terminating_pods_are_skipped() {
        let p = terminating(pod("ns", "p"));
        assert_eq!(classify(&rules(&spec()), &p), Skip(SkipReason::Terminating));
        let bare_terminating = terminating(with_empty_dir(bare("ns", "b")));
        assert_eq!(
            classify(&rules(&spec()), &bare_terminating),
            Skip(SkipReason::Terminating)
        );
    }

    #[test]
    fn finished_pods_are_evicted_without_flag_checks() {
        for phase in ["Succeeded", "Failed"] {
            let p = with_phase(with_empty_dir(bare("ns", "job")), phase);
            assert_eq!(classify(&rules(&spec()), &p), Evict, "{phase}");
        }
    }

    #[test]
    fn finished_pods_still_honour_selector_and_filters() {
        let p = with_phase(bare("ns", "done"), "Succeeded");
        let by_selector = DrainSpec {
            pod_selector: Some("app=web".into()),
            ..spec()
        };
        assert_eq!(
            classify(&rules(&by_selector), &p),
            Skip(SkipReason::NotSelected)
        );
        assert_eq!(
            classify(&rules(&filters(&[Some("gpu")])), &p),
            Skip(SkipReason::NoEvictionFilterMatch)
        );
    }

    #[test]
    fn pending_and_unknown_phase_pods_are_checked_like_running_ones() {
        for phase in ["Pending", "Unknown"] {
            let p = with_phase(bare("ns", "p"), phase);
            assert_eq!(
                classify(&rules(&spec()), &p),
                Blocked(BlockReason::NeedsForce),
                "{phase}"
            );
        }
        let mut no_status = bare("ns", "p");
        no_status.status = None;
        assert_eq!(
            classify(&rules(&spec()), &no_status),
            Blocked(BlockReason::NeedsForce)
        );
    }

    #[test]
    fn empty_dir_needs_delete_empty_dir() {
        let p = with_empty_dir(pod("ns", "cache"));
        assert_eq!(
            classify(&rules(&spec()), &p),
            Blocked(BlockReason::NeedsDeleteEmptyDir)
        );
        let allowed = DrainSpec {
            delete_empty_dir: Some(true),
            ..spec()
        };
        assert_eq!(classify(&rules(&allowed), &p), Evict);
        let explicit_false = DrainSpec {
            delete_empty_dir: Some(false),
            ..spec()
        };
        assert_eq!(
            classify(&rules(&explicit_false), &p),
            Blocked(BlockReason::NeedsDeleteEmptyDir)
        );
    }

    #[test]
    fn other_volumes_need_no_flag() {
        let mut p = pod("ns", "p");
        if let Some(spec) = p.spec.as_mut() {
            spec.volumes = Some(vec![Volume {
                name: "cfg".into(),
                config_map: Some(Default::default()),
                ..Volume::default()
            }]);
        }
        assert_eq!(classify(&rules(&spec()), &p), Evict);
    }

    #[test]
    fn bare_pod_needs_force() {
        let p = bare("ns", "bare");
        assert_eq!(
            classify(&rules(&spec()), &p),
            Blocked(BlockReason::NeedsForce)
        );
        let forced = DrainSpec {
            force: Some(true),
            ..spec()
        };
        assert_eq!(classify(&rules(&forced), &p), Evict);
    }

    #[test]
    fn bare_pod_with_empty_dir_reports_both_flags() {
        let p = with_empty_dir(bare("ns", "bare"));
        assert_eq!(
            classify(&rules(&spec()), &p),
            Blocked(BlockReason::NeedsForceAndDeleteEmptyDir)
        );
        let forced = DrainSpec {
            force: Some(true),
            ..spec()
        };
        assert_eq!(
            classify(&rules(&forced), &p),
            Blocked(BlockReason::NeedsDeleteEmptyDir)
        );
        let both = DrainSpec {
            force: Some(true),
            delete_empty_dir: Some(true),
            ..spec()
        };
        assert_eq!(classify(&rules(&both), &p), Evict);
    }

    #[test]
    fn pod_selector_narrows_the_set() {
        let s = DrainSpec {
            pod_selector: Some("app=web,tier notin (db)".into()),
            ..spec()
        };
        let r = rules(&s);
        assert_eq!(
            classify(&r, &with_label(pod("ns", "a"), "app", "web")),
            Evict
        );
        assert_eq!(
            classify(&r, &with_label(pod("ns", "b"), "app", "api")),
            Skip(SkipReason::NotSelected)
        );
        assert_eq!(classify(&r, &pod("ns", "c")), Skip(SkipReason::NotSelected));
        let db = with_label(with_label(pod("ns", "d"), "app", "web"), "tier", "db");
        assert_eq!(classify(&r, &db), Skip(SkipReason::NotSelected));
        // Selected pods still need their flags.
        let bare_web = with_label(bare("ns", "e"), "app", "web");
        assert_eq!(classify(&r, &bare_web), Blocked(BlockReason::NeedsForce));
    }

    #[test]
    fn empty_pod_selector_selects_all() {
        let s = DrainSpec {
            pod_selector: Some("  ".into()),
            ..spec()
        };
        assert_eq!(classify(&rules(&s), &pod("ns", "a")), Evict);
    }

    #[test]
    fn eviction_filter_matches_container_requests() {
        let r = rules(&filters(&[Some("nvidia.com/gpu")]));
        let p = with_container_resource(pod("ns", "a"), false, Where::Requests, "nvidia.com/gpu");
        assert_eq!(classify(&r, &p), Evict);
    }

    #[test]
    fn eviction_filter_matches_container_limits() {
        let r = rules(&filters(&[Some("nvidia.com/gpu")]));
        let p = with_container_resource(pod("ns", "a"), false, Where::Limits, "nvidia.com/gpu");
        assert_eq!(classify(&r, &p), Evict);
    }

    #[test]
    fn eviction_filter_matches_init_containers() {
        let r = rules(&filters(&[Some("nvidia.com/gpu")]));
        for place in [Where::Requests, Where::Limits] {
            let p = with_container_resource(pod("ns", "a"), true, place, "nvidia.com/gpu");
            assert_eq!(classify(&r, &p), Evict);
        }
    }

    #[test]
    fn eviction_filter_skips_pods_without_a_matching_resource() {
        let r = rules(&filters(&[Some("^nvidia.com/gpu$")]));
        let cpu_only = with_container_resource(pod("ns", "a"), false, Where::Requests, "cpu");
        assert_eq!(
            classify(&r, &cpu_only),
            Skip(SkipReason::NoEvictionFilterMatch)
        );
        assert_eq!(
            classify(&r, &pod("ns", "none")),
            Skip(SkipReason::NoEvictionFilterMatch)
        );
        let suffix =
            with_container_resource(pod("ns", "b"), false, Where::Requests, "nvidia.com/gpu-x");
        assert_eq!(
            classify(&r, &suffix),
            Skip(SkipReason::NoEvictionFilterMatch)
        );
    }

    #[test]
    fn eviction_filter_is_unanchored_by_default() {
        let r = rules(&filters(&[Some("gpu")]));
        let p = with_container_resource(pod("ns", "a"), false, Where::Requests, "nvidia.com/gpu");
        assert_eq!(classify(&r, &p), Evict);
    }

    /// NVIDIA's requestor library sends `podEvictionFilters: [{byResourceNameRegex:
    /// "nvidia.com/gpu-*"}]` (k8s-operator-libs `pkg/upgrade/upgrade_requestor.go`,
    /// `MaintenanceOPEvictionGPU`), meant as "the GPU resources" and matched by NVIDIA's operator
    /// with Go's `regexp.MatchString`: unanchored, `-*` any number of dashes, `.` any character.
    #[test]
    fn the_requestor_librarys_gpu_filter_matches_as_go_regexp_does() {
        let r = rules(&filters(&[Some("nvidia.com/gpu-*")]));
        assert_ne!(
            classify(&r, &pod("ns", "a")),
            Evict,
            "a pod without GPUs stays"
        );
        for (resource, evicted) in [
            ("nvidia.com/gpu", true),
            ("nvidia.com/gpu-mig-1g.5gb", true),
            ("nvidia.com/gpu.shared", true),
            ("example.nvidia.com/gpu", true),
            ("nvidiaXcom/gpu", true),
            ("nvidia.com/mig-1g.5gb", false),
            ("amd.com/gpu", false),
        ] {
            let p = with_container_resource(pod("ns", "a"), false, Where::Limits, resource);
            let expected = if evicted {
                Evict
            } else {
                classify(&r, &pod("ns", "a"))
            };
            assert_eq!(classify(&r, &p), expected, "{resource}");
        }
    }

    #[test]
    fn eviction_filter_entries_are_ored() {
        let r = rules(&filters(&[Some("^nvidia.com/gpu$"), Some("^rdma/")]));
        let gpu = with_container_resource(pod("ns", "a"), false, Where::Requests, "nvidia.com/gpu");
        let rdma = with_container_resource(pod("ns", "b"), false, Where::Limits, "rdma/hca");
        let cpu = with_container_resource(pod("ns", "c"), false, Where::Requests, "cpu");
        assert_eq!(classify(&r, &gpu), Evict);
        assert_eq!(classify(&r, &rdma), Evict);
        assert_eq!(classify(&r, &cpu), Skip(SkipReason::NoEvictionFilterMatch));
    }

    #[test]
    fn eviction_filter_entry_without_regex_matches_nothing() {
        let only_empty = rules(&filters(&[None]));
        let p = with_container_resource(pod("ns", "a"), false, Where::Requests, "nvidia.com/gpu");
        assert_eq!(
            classify(&only_empty, &p),
            Skip(SkipReason::NoEvictionFilterMatch)
        );
        let mixed = rules(&filters(&[None, Some("gpu")]));
        assert_eq!(classify(&mixed, &p), Evict);
    }

    #[test]
    fn eviction_filter_then_flags() {
        let r = rules(&filters(&[Some("gpu")]));
        let p = with_container_resource(bare("ns", "a"), false, Where::Requests, "nvidia.com/gpu");
        assert_eq!(classify(&r, &p), Blocked(BlockReason::NeedsForce));
    }

    #[test]
    fn operator_pod_is_never_evicted() {
        let identity = OperatorIdentity::new("maint", Some("op-abc".into()));
        let forced = DrainSpec {
            force: Some(true),
            delete_empty_dir: Some(true),
            ..spec()
        };
        let r = match DrainRules::new(&forced, Some(identity)) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        };
        // By name.
        assert_eq!(
            classify(&r, &pod("maint", "op-abc")),
            Skip(SkipReason::OperatorPod)
        );
        // By label: another replica.
        let replica = with_label(
            pod("maint", "op-xyz"),
            OPERATOR_NAME_LABEL,
            OPERATOR_NAME_LABEL_VALUE,
        );
        assert_eq!(classify(&r, &replica), Skip(SkipReason::OperatorPod));
        // Same name or label in another namespace is somebody else's pod.
        assert_eq!(classify(&r, &pod("other", "op-abc")), Evict);
        let elsewhere = with_label(
            pod("other", "x"),
            OPERATOR_NAME_LABEL,
            OPERATOR_NAME_LABEL_VALUE,
        );
        assert_eq!(classify(&r, &elsewhere), Evict);
        // Other pods in the operator namespace are drained normally.
        assert_eq!(classify(&r, &pod("maint", "worker")), Evict);
    }

    #[test]
    fn operator_identity_without_pod_name_uses_the_label_only() {
        let identity = OperatorIdentity::new("maint", None);
        assert!(!identity.is_operator_pod(&pod("maint", "anything")));
        let mut nameless = pod("maint", "x");
        nameless.metadata.name = None;
        assert!(!identity.is_operator_pod(&nameless));
        let labelled = with_label(
            pod("maint", "y"),
            OPERATOR_NAME_LABEL,
            OPERATOR_NAME_LABEL_VALUE,
        );
        assert!(identity.is_operator_pod(&labelled));
        let other_value = with_label(pod("maint", "z"), OPERATOR_NAME_LABEL, "something-else");
        assert!(!identity.is_operator_pod(&other_value));
    }

    // ---- plan ----

    #[test]
    fn plan_sorts_pods_into_lists() {
        let pods = vec![
            pod("b", "evict-2"),
            pod("a", "evict-1"),
            bare("a", "bare"),
            with_empty_dir(pod("a", "cache")),
            owned_by(bare("a", "ds"), "DaemonSet"),
            mirror(bare("kube-system", "static")),
            terminating(pod("a", "going")),
            with_phase(bare("a", "done"), "Succeeded"),
        ];
        let p = plan(&rules(&spec()), &pods);
        assert_eq!(p.total_pods, 8);
        let keys: Vec<String> = p.to_evict.iter().map(PodRef::key).collect();
        assert_eq!(keys, ["a/done", "a/evict-1", "b/evict-2"]);
        let blocked: Vec<(String, BlockReason)> =
            p.blocked.iter().map(|(r, b)| (r.key(), *b)).collect();
        assert_eq!(
            blocked,
            [
                ("a/bare".to_string(), BlockReason::NeedsForce),
                ("a/cache".to_string(), BlockReason::NeedsDeleteEmptyDir)
            ]
        );
        let skipped: Vec<(String, SkipReason)> =
            p.skipped.iter().map(|(r, s)| (r.key(), *s)).collect();
        assert_eq!(
            skipped,
            [
                ("a/ds".to_string(), SkipReason::DaemonSet),
                ("a/going".to_string(), SkipReason::Terminating),
                ("kube-system/static".to_string(), SkipReason::MirrorPod)
            ]
        );
        assert_eq!(p.to_evict[0].uid, "uid-a-done");
    }

    #[test]
    fn plan_of_no_pods_is_empty() {
        let p = plan::<Pod>(&rules(&spec()), &[]);
        assert_eq!(p, DrainPlan::default());
    }

    // ---- block reasons ----

    #[test]
    fn block_reasons_name_the_flag() {
        assert_eq!(BlockReason::NeedsForce.reason(), "NeedsForce");
        assert_eq!(
            BlockReason::NeedsDeleteEmptyDir.reason(),
            "NeedsDeleteEmptyDir"
        );
        assert_eq!(
            BlockReason::NeedsForceAndDeleteEmptyDir.reason(),
            "NeedsForceAndDeleteEmptyDir"
        );
        assert_eq!(
            BlockReason::NeedsForce.message("ns/p"),
            "pod ns/p has no controller and would not be recreated; \
             set spec.drainSpec.force: true to evict it"
        );
        let m = BlockReason::NeedsDeleteEmptyDir.message("ns/p");
        assert!(
            m.contains("ns/p") && m.contains("spec.drainSpec.deleteEmptyDir: true"),
            "{m}"
        );
        let m = BlockReason::NeedsForceAndDeleteEmptyDir.message("ns/p");
        assert!(
            m.contains("spec.drainSpec.force: true")
                && m.contains("spec.drainSpec.deleteEmptyDir: true"),
            "{m}"
        );
    }

    #[test]
    fn blocked_pod_entry_for_status() {
        let r = PodRef::from_pod(&bare("ns", "p"));
        let b = BlockReason::NeedsForce.to_blocked_pod(&r);
        assert_eq!(b.pod, "ns/p");
        assert_eq!(b.reason, "NeedsForce");
        assert_eq!(b.message, BlockReason::NeedsForce.message("ns/p"));
    }

    #[test]
    fn skip_reasons_have_distinct_names() {
        let all = [
            SkipReason::Terminating,
            SkipReason::OperatorPod,
            SkipReason::MirrorPod,
            SkipReason::DaemonSet,
            SkipReason::NotSelected,
            SkipReason::NoEvictionFilterMatch,
        ];
        let names: std::collections::BTreeSet<&str> = all.iter().map(SkipReason::reason).collect();
        assert_eq!(names.len(), all.len());
    }

    #[test]
    fn pod_ref_key_and_display() {
        let r = PodRef::from_pod(&pod("ns", "p"));
        assert_eq!(r.key(), "ns/p");
        assert_eq!(r.to_string(), "ns/p");
        assert_eq!(r.uid, "uid-ns-p");
    }

    // ---- spec errors ----

    #[test]
    fn bad_pod_selector_names_field_and_value() {
        let s = DrainSpec {
            pod_selector: Some("app in web".into()),
            ..spec()
        };
        let e = match DrainRules::new(&s, None) {
            Ok(_) => panic!("should fail"),
            Err(e) => e.to_string(),
        };
        assert!(e.starts_with("spec.drainSpec.podSelector: "), "{e}");
        assert!(e.contains("\"app in web\""), "{e}");
        assert!(e.contains("expected '('"), "{e}");
        assert!(e.contains("kubectl get pods -l"), "{e}");
    }

    #[test]
    fn bad_regex_names_field_index_and_value() {
        let e = match DrainRules::new(&filters(&[Some("ok"), Some("nvidia.com/(gpu")]), None) {
            Ok(_) => panic!("should fail"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.starts_with("spec.drainSpec.podEvictionFilters[1].byResourceNameRegex: "),
            "{e}"
        );
        assert!(e.contains("\"nvidia.com/(gpu\""), "{e}");
        assert!(e.contains("not a valid regular expression"), "{e}");
    }

    // ---- progress ----

    #[test]
    fn drain_progress_percentages() {
        assert_eq!(drain_progress(0, 0), 100);
        assert_eq!(drain_progress(0, 3), 100);
        assert_eq!(drain_progress(4, 4), 0);
        assert_eq!(drain_progress(4, 3), 25);
        assert_eq!(drain_progress(3, 1), 66);
        assert_eq!(drain_progress(3, 0), 100);
        assert_eq!(drain_progress(1000, 1), 99);
        // More remaining than planned (e.g. a spec change widened the set) is no progress, not negative.
        assert_eq!(drain_progress(2, 5), 0);
        assert_eq!(drain_progress(usize::MAX, 0), 100);
    }

    // ---- waitForPodCompletion ----

    fn completion(selector: Option<&str>) -> CompletionRules {
        let s = WaitForPodCompletionSpec {
            pod_selector: selector.map(str::to_owned),
            timeout_seconds: None,
        };
        match CompletionRules::new(&s) {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn completion_waits_for_running_selected_pods() {
        let r = completion(Some("app=train"));
        let pods = vec![
            with_label(pod("b", "run-2"), "app", "train"),
            with_label(with_phase(pod("a", "pending"), "Pending"), "app", "train"),
            with_label(pod("a", "run-1"), "app", "train"),
            with_label(pod("a", "other"), "app", "serve"),
            pod("a", "unlabelled"),
        ];
        let keys: Vec<String> = pods_to_wait_for(&r, &pods)
            .iter()
            .map(PodRef::key)
            .collect();
        assert_eq!(keys, ["a/pending", "a/run-1", "b/run-2"]);
    }

    #[test]
    fn completion_never_waits_for_finished_pods() {
        let r = completion(None);
        let pods = vec![
            with_phase(pod("a", "ok"), "Succeeded"),
            with_phase(pod("a", "bad"), "Failed"),
        ];
        assert!(pods_to_wait_for(&r, &pods).is_empty());
    }

    #[test]
    fn completion_skips_terminating_daemonset_and_mirror_pods() {
        let r = completion(Some(""));
        let pods = vec![
            terminating(pod("a", "going")),
            owned_by(bare("a", "ds"), "DaemonSet"),
            mirror(bare("kube-system", "static")),
            bare("a", "bare"),
        ];
        let keys: Vec<String> = pods_to_wait_for(&r, &pods)
            .iter()
            .map(PodRef::key)
            .collect();
        assert_eq!(keys, ["a/bare"]);
    }

    #[test]
    fn completion_empty_selector_waits_for_all() {
        let r = completion(None);
        let pods = vec![pod("a", "x"), with_label(pod("a", "y"), "k", "v")];
        assert_eq!(pods_to_wait_for(&r, &pods).len(), 2);
    }

    #[test]
    fn completion_bad_selector_names_field() {
        let s = WaitForPodCompletionSpec {
            pod_selector: Some("app=x,".into()),
            timeout_seconds: Some(10),
        };
        let e = match CompletionRules::new(&s) {
            Ok(_) => panic!("should fail"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.starts_with("spec.waitForPodCompletion.podSelector: "),
            "{e}"
        );
        assert!(e.contains("\"app=x,\""), "{e}");
    }
}

/// The helpers the `kubectl maintenance preflight` check shares with the drain.
#[cfg(test)]
mod shared_rule_tests {
    use super::*;
    use crate::fixtures::{bare, owned_by, pod, with_label, with_phase};
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Volume};
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

    fn with_scratch_volume(mut p: Pod) -> Pod {
        if let Some(spec) = p.spec.as_mut() {
            spec.volumes.get_or_insert_with(Vec::new).push(Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            });
        }
        p
    }

    fn budget(ns: &str, name: &str, selector: Option<&[(&str, &str)]>) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector: selector.map(|pairs| LabelSelector {
                    match_labels: Some(
                        pairs
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    ),
                    ..LabelSelector::default()
                }),
                ..PodDisruptionBudgetSpec::default()
            }),
            status: None,
        }
    }

    #[test]
    fn required_flags_name_what_evicting_the_pod_costs() {
        assert_eq!(required_flags(&pod("ns", "web")), None);
        assert_eq!(
            required_flags(&bare("ns", "bare")),
            Some(BlockReason::NeedsForce)
        );
        assert_eq!(
            required_flags(&with_scratch_volume(pod("ns", "cache"))),
            Some(BlockReason::NeedsDeleteEmptyDir)
        );
        assert_eq!(
            required_flags(&with_scratch_volume(bare("ns", "both"))),
            Some(BlockReason::NeedsForceAndDeleteEmptyDir)
        );
        // The flags do not change what it costs: a forced bare pod is still gone for good.
        let lenient = DrainRules::new(
            &DrainSpec {
                force: Some(true),
                delete_empty_dir: Some(true),
                ..DrainSpec::default()
            },
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let both = with_scratch_volume(bare("ns", "both"));
        assert_eq!(classify(&lenient, &both), PodDisposition::Evict);
        assert_eq!(
            required_flags(&both),
            Some(BlockReason::NeedsForceAndDeleteEmptyDir)
        );
    }

    #[test]
    fn required_flags_agree_with_classify_without_flags() {
        let strict = DrainRules::new(&DrainSpec::default(), None).unwrap_or_else(|e| panic!("{e}"));
        for p in [
            pod("ns", "a"),
            bare("ns", "b"),
            with_scratch_volume(pod("ns", "c")),
            with_scratch_volume(bare("ns", "d")),
        ] {
            let expected = match required_flags(&p) {
                None => PodDisposition::Evict,
                Some(reason) => PodDisposition::Blocked(reason),
            };
            assert_eq!(classify(&strict, &p), expected, "{:?}", p.metadata.name);
        }
    }

    #[test]
    fn block_reasons_name_their_flags() {
        assert!(BlockReason::NeedsForce.needs_force());
        assert!(!BlockReason::NeedsForce.needs_delete_empty_dir());
        assert!(!BlockReason::NeedsDeleteEmptyDir.needs_force());
        assert!(BlockReason::NeedsDeleteEmptyDir.needs_delete_empty_dir());
        assert!(BlockReason::NeedsForceAndDeleteEmptyDir.needs_force());
        assert!(BlockReason::NeedsForceAndDeleteEmptyDir.needs_delete_empty_dir());
    }

    #[test]
    fn finished_means_succeeded_or_failed() {
        assert!(is_finished(&with_phase(pod("ns", "a"), "Succeeded")));
        assert!(is_finished(&with_phase(pod("ns", "b"), "Failed")));
        assert!(!is_finished(&pod("ns", "c")));
        assert!(!is_finished(&with_phase(pod("ns", "d"), "Pending")));
    }

    #[test]
    fn controller_ref_is_the_controlling_owner_only() {
        let owned = owned_by(bare("ns", "a"), "StatefulSet");
        assert_eq!(
            controller_ref(&owned).map(|o| o.kind.as_str()),
            Some("StatefulSet")
        );
        let mut merely_owned = owned;
        if let Some(refs) = merely_owned.metadata.owner_references.as_mut() {
            refs[0].controller = None;
        }
        assert!(controller_ref(&merely_owned).is_none());
        assert!(controller_ref(&bare("ns", "b")).is_none());
    }

    #[test]
    fn a_budget_covers_matching_pods_of_its_namespace_only() {
        let web = with_label(pod("shop", "web-1"), "app", "web");
        let budgets = [
            budget("shop", "web", Some(&[("app", "web")])),
            budget("shop", "db", Some(&[("app", "db")])),
            budget("other", "web", Some(&[("app", "web")])),
            // No selector: guards nothing.
            budget("shop", "unset", None),
            // Empty selector: guards every pod of its namespace.
            budget("shop", "all", Some(&[])),
        ];
        let names: Vec<String> = covering_pdbs(&web, &budgets)
            .iter()
            .map(|b| {
                format!(
                    "{}/{}",
                    b.metadata.namespace.as_deref().unwrap_or_default(),
                    b.metadata.name.as_deref().unwrap_or_default()
                )
            })
            .collect();
        assert_eq!(names, ["shop/web", "shop/all"]);
        assert!(covering_pdbs(&bare("elsewhere", "x"), &budgets).is_empty());
    }
}
