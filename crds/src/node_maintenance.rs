use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Finalizer the operator puts on every admitted request, so cleanup (uncordon) runs on deletion.
pub const FINALIZER: &str = "maintenance.nvidia.com/finalizer";
/// Annotation recording whether the node was unschedulable before we touched it ("true"/"false").
pub const INITIAL_UNSCHEDULABLE_ANNOTATION: &str =
    "maintenance.nvidia.com/node-initial-state.unschedulable";

/// `"true"` when `spec.cordon` was set at admission (ours, written with the admission). The
/// uncordon at the end is owed by what we did, not by the spec at the end: NVIDIA's
/// `handleTerminalState` reads `spec.cordon` at deletion, so turning it off mid-maintenance
/// leaves the node cordoned for good.
pub const CORDON_REQUESTED_ANNOTATION: &str = "maintenance.nvidia.com/cordon-requested";

/// When the request became Ready (RFC 3339), written once, as NVIDIA's controller does; garbage
/// collection counts `maxNodeMaintenanceTimeSeconds` from it.
pub const READY_TIME_ANNOTATION: &str = "maintenance.nvidia.com/ready-time";
/// `"true"` exempts a request from garbage collection (NVIDIA's annotation).
pub const GC_IGNORE_ANNOTATION: &str = "maintenance.nvidia.com/garbage-collector.ignore";
/// When NVIDIA's controller started waiting for pod completion (RFC 3339); read on adoption so
/// that the wait's timeout keeps counting from there.
pub const WAIT_POD_COMPLETION_START_ANNOTATION: &str =
    "maintenance.nvidia.com/wait-pod-completion-start-time";
/// When this operator admitted the request, or adopted it from another operator mid-flight
/// (RFC 3339). A phase entered before it was entered under the other operator, whose
/// `lastTransitionTime` does not mark phase starts: its timers count from here instead.
pub const ADMITTED_TIME_ANNOTATION: &str = "maintenance.nvidia.com/admitted-time";
/// The UID of the request this operator admitted (ours, written with the admission's finalizer).
/// The admission is that one metadata write: a request that carries its own UID here is
/// Scheduled even while its status still shows Pending (or nothing). A copy of an admitted object
/// (another UID) is not admitted.
pub const ADMITTED_UID_ANNOTATION: &str = "maintenance.nvidia.com/admitted-uid";

/// Requests that carry this label with the same value (in one namespace) form a node group: a
/// rack, a switch, a DGX pod. They are admitted all together in one round or not at all (ours).
pub const NODE_GROUP_LABEL: &str = "maintenance.nvidia.com/group";
/// How many requests the node group of [`NODE_GROUP_LABEL`] has (ours, optional): until that many
/// exist, the group waits, so that a requestor creating them one by one is not admitted in part.
pub const NODE_GROUP_SIZE_ANNOTATION: &str = "maintenance.nvidia.com/group-size";

/// What `spec.requestorID` must match: NVIDIA's kubebuilder pattern, verbatim.
pub const REQUESTOR_ID_PATTERN: &str =
    r"^([a-z0-9A-Z]([-a-z0-9A-Z]*[a-z0-9A-Z])?(\.[a-z0-9A-Z]([-a-z0-9A-Z]*[a-z0-9A-Z])?)*)$";

/// Why `id` is not a valid `spec.requestorID` (the CRD's rules, checked before a request is
/// sent), or `None` when it is.
pub fn requestor_id_problem(id: &str) -> Option<String> {
    // A constant pattern: it compiles (a unit test says so), not user input.
    #[allow(clippy::expect_used)]
    static PATTERN: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(REQUESTOR_ID_PATTERN).expect("the requestorID pattern compiles")
    });
    let length = id.len();
    if !(2..=63).contains(&length) {
        return Some(format!(
            "requestorID {id:?} has {length} characters; it must have 2 to 63"
        ));
    }
    if !PATTERN.is_match(id) {
        return Some(format!(
            "requestorID {id:?} must be alphanumerics, '-' and '.', starting and ending with an \
             alphanumeric, like a domain name (e.g. upgrade.example.com)"
        ));
    }
    None
}

/// Condition types used in `status.conditions`.
pub mod condition_type {
    /// Always present once the operator saw the request; its reason is the phase.
    pub const READY: &str = "Ready";
    /// Present (True) while the operator has given up a step, e.g. a drain timed out.
    pub const FAILED: &str = "Failed";
    /// Set by the requestor (never by us) when its own work on the node failed.
    pub const REQUESTOR_FAILED: &str = "RequestorFailed";
}

/// The phase of a request: the `reason` of its `Ready` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    Pending,
    Scheduled,
    Cordon,
    WaitForPodCompletion,
    Draining,
    Ready,
    RequestorFailed,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::Pending,
        Phase::Scheduled,
        Phase::Cordon,
        Phase::WaitForPodCompletion,
        Phase::Draining,
        Phase::Ready,
        Phase::RequestorFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Scheduled => "Scheduled",
            Phase::Cordon => "Cordon",
            Phase::WaitForPodCompletion => "WaitForPodCompletion",
            Phase::Draining => "Draining",
            Phase::Ready => "Ready",
            Phase::RequestorFailed => "RequestorFailed",
        }
    }

    pub fn parse(reason: &str) -> Option<Phase> {
        Phase::ALL.into_iter().find(|p| p.as_str() == reason)
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request to take one node out of service for maintenance.
// kube's printcolumn(...) repeats `type_` per column, which clippy mistakes for a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "maintenance.nvidia.com",
    version = "v1alpha1",
    kind = "NodeMaintenance",
    namespaced,
    status = "NodeMaintenanceStatus",
    shortname = "nm",
    // `kubectl get nm --field-selector spec.nodeName=node-7`, as NVIDIA's CRD allows
    // (config/crd/bases/maintenance.nvidia.com_nodemaintenances.yaml).
    selectable = ".spec.nodeName",
    selectable = ".spec.requestorID",
    derive = "PartialEq",
    derive = "Default",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Requestor", type_ = "string", json_path = ".spec.requestorID"),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].reason"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(
        name = "Failed",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Failed')].reason"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceSpec {
    /// Identifies the component that asked for the maintenance (e.g. "upgrade.example.com"): a
    /// domain-name-like string of 2 to 63 alphanumerics, dashes and dots, starting and ending with
    /// an alphanumeric (NVIDIA's api/v1alpha1/nodemaintenance_types.go).
    #[serde(rename = "requestorID")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("requestorID is immutable: create a new NodeMaintenance instead"))]
    #[schemars(length(min = 2, max = 63), regex(pattern = REQUESTOR_ID_PATTERN))]
    pub requestor_id: String,

    /// Other requestors sharing this maintenance; deletion waits until this list is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub additional_requestors: Option<Vec<String>>,

    /// The node to maintain.
    #[x_kube(validation = Rule::new("self == oldSelf").message("nodeName is immutable: create a new NodeMaintenance instead"))]
    #[schemars(length(min = 1))]
    pub node_name: String,

    /// Mark the node unschedulable before work starts (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = true))]
    pub cordon: Option<bool>,

    /// Wait for the selected pods to finish before draining; absent means no wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_pod_completion: Option<WaitForPodCompletionSpec>,

    /// Evict pods from the node; absent means no drain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_spec: Option<DrainSpec>,
}

impl NodeMaintenanceSpec {
    pub fn cordon(&self) -> bool {
        self.cordon.unwrap_or(true)
    }

    pub fn additional_requestors(&self) -> &[String] {
        self.additional_requestors.as_deref().unwrap_or_default()
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WaitForPodCompletionSpec {
    /// Label selector (as `kubectl -l` takes it) of the pods to wait for; empty means all pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<String>,
    /// How long to wait in seconds; 0 means forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 0), range(min = 0))]
    pub timeout_seconds: Option<i32>,
}

impl WaitForPodCompletionSpec {
    pub fn timeout_seconds(&self) -> u32 {
        self.timeout_seconds.unwrap_or(0).max(0).unsigned_abs()
    }
}

/// The default drain timeout in seconds.
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: i32 = 300;

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Also evict pods that have no controller (they will not come back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub force: Option<bool>,
    /// Label selector of the pods to evict; empty means all pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<String>,
    /// Bound on the whole drain in seconds (default 300); 0 means forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 300), range(min = 0))]
    pub timeout_seconds: Option<i32>,
    /// Also evict pods that use emptyDir volumes (their data is lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = false))]
    pub delete_empty_dir: Option<bool>,
    /// Evict only pods matching one of these filters (OR-ed); empty means no filtering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_eviction_filters: Option<Vec<PodEvictionFilterEntry>>,
    /// Our addition, opt-in: this many seconds after the drain began, pods whose eviction a
    /// PodDisruptionBudget still refuses are deleted instead (with their own grace period),
    /// bypassing the budget; each deletion is a Warning Event naming the pod and the budget.
    /// Absent means never. At least 1: there is no "at once" (that would ignore budgets
    /// altogether) and no 0 (which means "forever" in `timeoutSeconds`). Independent of
    /// `timeoutSeconds`, which only reports the failure and keeps retrying.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub force_delete_after_seconds: Option<i32>,
}

impl DrainSpec {
    pub fn force(&self) -> bool {
        self.force.unwrap_or(false)
    }
    pub fn delete_empty_dir(&self) -> bool {
        self.delete_empty_dir.unwrap_or(false)
    }
    pub fn timeout_seconds(&self) -> u32 {
        self.timeout_seconds
            .unwrap_or(DEFAULT_DRAIN_TIMEOUT_SECONDS)
            .max(0)
            .unsigned_abs()
    }
    pub fn pod_eviction_filters(&self) -> &[PodEvictionFilterEntry] {
        self.pod_eviction_filters.as_deref().unwrap_or_default()
    }
    /// The escalation deadline from the start of the drain; `None` (never) when absent. A value
    /// below 1, which the CRD refuses, counts as 1 rather than as never: the requestor asked
    /// for an escalation.
    pub fn force_delete_after(&self) -> Option<std::time::Duration> {
        self.force_delete_after_seconds
            .map(|s| std::time::Duration::from_secs(u64::from(s.max(1).unsigned_abs())))
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodEvictionFilterEntry {
    /// Matches a pod when one of its containers requests a resource whose name matches this regex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_resource_name_regex: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeMaintenanceStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Pods (namespace/name) that waitForPodCompletion is still waiting for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wait_for_completion: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainStatus>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DrainStatus {
    /// Pods on the node when the drain started.
    pub total_pods: i32,
    /// Pods the drain has to remove.
    pub eviction_pods: i32,
    /// Percent of `evictionPods` already gone.
    pub drain_progress: i32,
    /// Pods (namespace/name) still to be evicted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wait_for_eviction: Vec<String>,
    /// Why each remaining pod is still there (our addition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocked: Vec<BlockedPod>,
    /// Pods this drain deleted past `drainSpec.forceDeleteAfterSeconds`, bypassing the
    /// PodDisruptionBudget that refused their eviction (our addition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub force_deleted: Vec<ForceDeletedPod>,
}

/// A pod the drain cannot remove yet, and why.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct BlockedPod {
    /// namespace/name of the pod.
    pub pod: String,
    /// Short machine-readable cause: PDB, MultiplePDBs, NeedsForce, NeedsDeleteEmptyDir, Terminating, Error.
    pub reason: String,
    /// What a person needs to know, e.g. the PDB with its healthy counts.
    pub message: String,
}

/// A pod deleted instead of evicted, and the budget that deletion bypassed.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ForceDeletedPod {
    /// namespace/name of the pod.
    pub pod: String,
    /// Name of the PodDisruptionBudget (in the pod's namespace) whose refusal was bypassed.
    pub pdb: String,
    /// When the API server accepted the deletion.
    pub deleted_at: Time,
}

impl NodeMaintenance {
    /// `namespace/name`, for messages and logs.
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
    }

    /// The phase from the `Ready` condition.
    ///
    /// No `Ready` condition, or one with an empty reason, is Pending: NVIDIA calls that reason
    /// `ConditionReasonUninitialized` ("") and its `IsUnderMaintenance` counts it as not started
    /// (Mellanox/maintenance-operator, api/v1alpha1/nodemaintenance_types.go and
    /// internal/k8sutils/k8sutils.go). Any other reason we do not know (a newer operator's, or a
    /// hand edit) means someone started the work: it counts as in progress, so the scheduler
    /// never admits past the limits, and as Scheduled, from where the node actor resumes the
    /// preparation idempotently from the start. NVIDIA likewise counts every reason but "" and
    /// Pending as under maintenance.
    ///
    /// A request the status shows Pending (or not at all) that we admitted is Scheduled: see
    /// [`NodeMaintenance::admitted_not_shown`].
    pub fn phase(&self) -> Phase {
        match self.shown_phase() {
            Phase::Pending if self.admitted_by_us() => Phase::Scheduled,
            shown => shown,
        }
    }

    /// The phase the status shows, before the admission's metadata is read.
    fn shown_phase(&self) -> Phase {
        match self.condition(condition_type::READY) {
            None => Phase::Pending,
            Some(ready) if ready.reason.is_empty() => Phase::Pending,
            Some(ready) => Phase::parse(&ready.reason).unwrap_or(Phase::Scheduled),
        }
    }

    /// Admitted by this operator: its own UID in [`ADMITTED_UID_ANNOTATION`]. Our finalizer is
    /// written with it; one removed by hand is added again by the next step, as for any request
    /// past Pending, and a request whose cleanup removed it stays admitted (released, not
    /// waiting).
    pub fn admitted_by_us(&self) -> bool {
        self.metadata.uid.as_deref().is_some_and(|uid| {
            self.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ADMITTED_UID_ANNOTATION))
                .is_some_and(|admitted| admitted == uid)
        })
    }

    /// Scheduled by the admission's metadata write alone: the status does not show it (no
    /// status write is spent on Scheduled; the next phase's write is the first one).
    pub fn admitted_not_shown(&self) -> bool {
        self.shown_phase() == Phase::Pending && self.admitted_by_us()
    }

    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requestor_ids_follow_nvidias_rules() {
        for good in ["network.nvidia.com", "A1", "a-b.c-d", &"x".repeat(63)] {
            assert_eq!(requestor_id_problem(good), None, "{good}");
        }
        for bad in [
            "x",
            "",
            "-a",
            "a-",
            "a_b",
            "a..b",
            "a/b",
            "über",
            &"x".repeat(64),
        ] {
            assert!(requestor_id_problem(bad).is_some(), "{bad}");
        }
    }

    fn with_ready_reason(reason: Option<&str>) -> NodeMaintenance {
        NodeMaintenance {
            status: reason.map(|reason| NodeMaintenanceStatus {
                conditions: vec![Condition {
                    type_: condition_type::READY.to_string(),
                    status: "False".to_string(),
                    reason: reason.to_string(),
                    message: String::new(),
                    last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                    observed_generation: None,
                }],
                ..NodeMaintenanceStatus::default()
            }),
            ..NodeMaintenance::default()
        }
    }

    #[test]
    fn no_ready_condition_is_pending() {
        assert_eq!(with_ready_reason(None).phase(), Phase::Pending);
        let other_condition_only = NodeMaintenance {
            status: Some(NodeMaintenanceStatus {
                conditions: vec![Condition {
                    type_: condition_type::REQUESTOR_FAILED.to_string(),
                    status: "True".to_string(),
                    reason: "FailedMaintenance".to_string(),
                    message: String::new(),
                    last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                    observed_generation: None,
                }],
                ..NodeMaintenanceStatus::default()
            }),
            ..NodeMaintenance::default()
        };
        assert_eq!(other_condition_only.phase(), Phase::Pending);
    }

    #[test]
    fn every_known_reason_is_its_phase() {
        for phase in Phase::ALL {
            assert_eq!(with_ready_reason(Some(phase.as_str())).phase(), phase);
        }
    }

    #[test]
    fn an_empty_reason_is_pending_like_nvidias_uninitialized() {
        assert_eq!(with_ready_reason(Some("")).phase(), Phase::Pending);
    }

    #[test]
    fn an_unknown_reason_counts_as_in_progress() {
        for reason in ["Rebooting", "pending", "Drained"] {
            assert_eq!(
                with_ready_reason(Some(reason)).phase(),
                Phase::Scheduled,
                "{reason}"
            );
        }
    }

    fn admitted(
        nm: NodeMaintenance,
        uid: &str,
        admitted_uid: &str,
        finalizer: bool,
    ) -> NodeMaintenance {
        let mut nm = nm;
        nm.metadata.uid = Some(uid.to_string());
        nm.metadata.annotations = Some(
            [(
                ADMITTED_UID_ANNOTATION.to_string(),
                admitted_uid.to_string(),
            )]
            .into_iter()
            .collect(),
        );
        nm.metadata.finalizers = finalizer.then(|| vec![FINALIZER.to_string()]);
        nm
    }

    #[test]
    fn a_request_admitted_by_its_metadata_write_is_scheduled_while_its_status_shows_pending() {
        for shown in [None, Some(""), Some("Pending")] {
            let nm = admitted(with_ready_reason(shown), "u1", "u1", true);
            assert_eq!(nm.phase(), Phase::Scheduled, "{shown:?}");
            assert!(nm.admitted_not_shown(), "{shown:?}");
        }
        // A later phase the status shows is that phase.
        let draining = admitted(with_ready_reason(Some("Draining")), "u1", "u1", true);
        assert_eq!(draining.phase(), Phase::Draining);
        assert!(!draining.admitted_not_shown());
    }

    #[test]
    fn a_copy_of_an_admitted_request_is_pending_and_a_released_one_stays_admitted() {
        let copy = admitted(with_ready_reason(None), "u2", "u1", true);
        assert_eq!(copy.phase(), Phase::Pending);
        // Its cleanup removed our finalizer: it is not waiting again.
        let released = admitted(with_ready_reason(None), "u1", "u1", false);
        assert_eq!(released.phase(), Phase::Scheduled);
        let mut no_uid = admitted(with_ready_reason(None), "u1", "u1", true);
        no_uid.metadata.uid = None;
        assert_eq!(no_uid.phase(), Phase::Pending);
    }
}
