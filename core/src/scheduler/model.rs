//! The scheduler's vocabulary: what a round reads of nodes and requests (the snapshot and the
//! limits) and how it names why a request waits. Budgets, windows, `checkCapacity` and
//! `preferDrainable` speak it too, so they depend on this module and not on the round itself.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use maintenance_crds::{
    Blackout, Budget, MaintenanceOperatorConfigSpec, MaintenanceWindow, NODE_GROUP_LABEL,
    NODE_GROUP_SIZE_ANNOTATION, NodeMaintenance, Phase,
};
use serde::{Serialize, Serializer};

use crate::yielding::YieldRecord;

/// What the scheduler needs to know about a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    pub name: String,
    /// Unschedulable or not Ready: the node already serves no (new) workloads.
    pub unavailable: bool,
    /// The node's labels, which budgets select and group by; shared, so that a round's snapshot
    /// of an unchanged node copies no label (see [`NodeStates`]).
    pub labels: Arc<BTreeMap<String, String>>,
}

impl NodeState {
    pub fn from_node(node: &Node) -> NodeState {
        let unschedulable = node
            .spec
            .as_ref()
            .and_then(|spec| spec.unschedulable)
            .unwrap_or(false);
        // A node without a Ready condition has never reported in: the kubelet is not serving it.
        let ready = node
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_ref())
            .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|ready| ready.status == "True");
        NodeState {
            name: node.metadata.name.clone().unwrap_or_default(),
            unavailable: unschedulable || !ready,
            labels: Arc::new(node.metadata.labels.clone().unwrap_or_default()),
        }
    }
}

/// The scheduler's view of each node, kept between rounds: a node whose resourceVersion has not
/// changed is not read again. At 1,000 nodes, reading every node's labels anew made up most of
/// a round's allocations, and rounds most of the operator's CPU.
#[derive(Debug, Default)]
pub struct NodeStates {
    pub(super) by_name: HashMap<String, KnownNode>,
    /// Which call this is: a node not seen in the latest one is gone.
    call: u64,
}

#[derive(Debug)]
pub(super) struct KnownNode {
    version: Option<String>,
    state: NodeState,
    seen_in: u64,
}

impl NodeStates {
    /// The states of `nodes` (all that exist now): unchanged ones from the last call, the others
    /// read again; nodes no longer given are forgotten.
    pub fn observe<'a>(&mut self, nodes: impl IntoIterator<Item = &'a Node>) -> Vec<NodeState> {
        self.call += 1;
        let call = self.call;
        let mut states = Vec::with_capacity(self.by_name.len());
        for node in nodes {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            let version = node.metadata.resource_version.as_ref();
            match self.by_name.get_mut(name) {
                Some(known) if version.is_some() && known.version.as_ref() == version => {
                    known.seen_in = call;
                    states.push(known.state.clone());
                }
                _ => {
                    let state = NodeState::from_node(node);
                    states.push(state.clone());
                    self.by_name.insert(
                        name.to_string(),
                        KnownNode {
                            version: version.cloned(),
                            state,
                            seen_in: call,
                        },
                    );
                }
            }
        }
        self.by_name.retain(|_, known| known.seen_in == call);
        states
    }
}

/// What the scheduler needs to know about a NodeMaintenance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestState {
    pub namespace: String,
    pub name: String,
    pub node_name: String,
    pub requestor_id: String,
    pub phase: Phase,
    pub created: Option<jiff::Timestamp>,
    pub deleting: bool,
    /// Deleted past Pending and our finalizer is off: the node actor has undone everything
    /// (uncordoned, stopped the drain) and nothing of ours will touch the request again. Another
    /// finalizer (the requestor's) may keep the object for as long as it likes; it holds no slot
    /// and no node meanwhile.
    pub released: bool,
    /// Its last admission writes failed: it is not admitted again before this retry. `None`
    /// from the objects; the supervisor, which saw the failure, sets it.
    pub admission_retry: Option<AdmissionRetry>,
    /// Pending after it gave its slot back ([`crate::yielding`]): its back-off and its place
    /// behind the requests that waited then. From the object's annotations.
    pub yielded: Option<YieldRecord>,
    /// Its node group ([`maintenance_crds::NODE_GROUP_LABEL`]): admitted with the group's other
    /// Pending requests in one round, or not at all.
    pub node_group: Option<NodeGroupLabel>,
}

/// A request's node group as its label and annotation give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGroupLabel {
    pub name: String,
    /// [`maintenance_crds::NODE_GROUP_SIZE_ANNOTATION`]: the group waits until it has this many
    /// requests; `None` when absent or not a positive number (the webhook refuses those).
    pub expected_size: Option<u32>,
}

impl NodeGroupLabel {
    pub fn of(request: &NodeMaintenance) -> Option<NodeGroupLabel> {
        let name = request
            .metadata
            .labels
            .as_ref()?
            .get(NODE_GROUP_LABEL)
            .filter(|name| !name.is_empty())?;
        let expected_size = request
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NODE_GROUP_SIZE_ANNOTATION))
            .and_then(|size| size.trim().parse::<u32>().ok())
            .filter(|size| *size > 0);
        Some(NodeGroupLabel {
            name: name.clone(),
            expected_size,
        })
    }
}

impl RequestState {
    pub fn from_request(request: &NodeMaintenance) -> RequestState {
        let phase = request.phase();
        let deleting = request.is_deleting();
        RequestState {
            namespace: request.metadata.namespace.clone().unwrap_or_default(),
            name: request.metadata.name.clone().unwrap_or_default(),
            node_name: request.spec.node_name.clone(),
            requestor_id: request.spec.requestor_id.clone(),
            phase,
            created: request.metadata.creation_timestamp.as_ref().map(|t| t.0),
            deleting,
            // A Pending request never had our finalizer: it is not released but simply waits
            // (and, being deleted, is never admitted).
            released: deleting
                && phase != Phase::Pending
                && !crate::lifecycle::has_finalizer(request),
            admission_retry: None,
            // Read only while it waits: once admitted again the record is history.
            yielded: (phase == Phase::Pending)
                .then(|| YieldRecord::of(request))
                .flatten(),
            node_group: NodeGroupLabel::of(request),
        }
    }

    pub fn key(&self) -> RequestKey {
        RequestKey {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    pub(super) fn is_pending(&self) -> bool {
        self.phase == Phase::Pending
    }

    /// Past Pending and not yet released: it holds its node (and a slot) for now.
    pub(super) fn holds_its_node(&self) -> bool {
        !self.is_pending() && !self.released
    }
}

/// First wait after a failed admission; it doubles with every further failure in a row.
pub const ADMISSION_RETRY_MIN: Duration = Duration::from_secs(1);

/// Longest wait between two admission attempts: a write that keeps failing (a webhook that
/// denies it, missing RBAC) is still tried every minute, so it goes through soon after the cause
/// is fixed, at the cost of one node read and one write a minute.
pub const ADMISSION_RETRY_MAX: Duration = Duration::from_secs(60);

/// The wait before the next admission attempt after `failures` failures in a row (1 s, 2 s,
/// 4 s, ... up to [`ADMISSION_RETRY_MAX`]; 0 counts as 1). backon's schedule without jitter:
/// one request is retried by one supervisor, so there is no herd to spread.
pub fn admission_retry_delay(failures: u32) -> Duration {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(ADMISSION_RETRY_MIN)
        .with_max_delay(ADMISSION_RETRY_MAX)
        .with_factor(2.0)
        .without_max_times()
        .build()
        .nth(usize::try_from(failures.saturating_sub(1).min(32)).unwrap_or(0))
        .unwrap_or(ADMISSION_RETRY_MAX)
}

/// Most characters of an admission error quoted in a Pending message: webhooks may answer at
/// length, and the message is read in `kubectl get`/`describe` (the log has it whole).
pub const ADMISSION_ERROR_SHOWN_CHARS: usize = 300;

/// A request whose admission writes failed, and when it may be admitted again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionRetry {
    /// Failed attempts in a row.
    pub failures: u32,
    /// Not admitted before this time; the next request takes its slot meanwhile.
    pub at: jiff::Timestamp,
    /// The last failure as the API server put it, for the request's Pending message.
    pub error: String,
}

impl AdmissionRetry {
    /// The retry after one more failure (`error`) at `now`, following `previous` if the one
    /// before failed too.
    pub fn after_failure(
        previous: Option<&AdmissionRetry>,
        error: String,
        now: jiff::Timestamp,
    ) -> AdmissionRetry {
        let failures = previous.map_or(0, |p| p.failures).saturating_add(1);
        let at = jiff::SignedDuration::try_from(admission_retry_delay(failures))
            .ok()
            .and_then(|delay| now.checked_add(delay).ok())
            .unwrap_or(jiff::Timestamp::MAX);
        AdmissionRetry {
            failures,
            at,
            error,
        }
    }

    pub(super) fn describe(&self) -> String {
        let times = if self.failures == 1 {
            "once".to_string()
        } else {
            format!("{} times in a row", self.failures)
        };
        let error = match self.error.char_indices().nth(ADMISSION_ERROR_SHOWN_CHARS) {
            Some((cut, _)) => format!("{}…", &self.error[..cut]),
            None => self.error.clone(),
        };
        // Whole seconds: the retry is a person's "about when", not a clock reading.
        format!(
            "admission failed {times}: {error}; next attempt at {:.0}",
            self.at
        )
    }
}

/// The cluster as one scheduling round sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub nodes: Vec<NodeState>,
    pub requests: Vec<RequestState>,
}

impl Snapshot {
    /// The snapshot of `nodes` (as [`NodeStates::observe`] gives them) and `requests`.
    pub fn from_states<'a>(
        nodes: Vec<NodeState>,
        requests: impl IntoIterator<Item = &'a NodeMaintenance>,
    ) -> Snapshot {
        Snapshot {
            nodes,
            requests: requests
                .into_iter()
                .map(RequestState::from_request)
                .collect(),
        }
    }

    pub fn from_objects<'a>(
        nodes: impl IntoIterator<Item = &'a Node>,
        requests: impl IntoIterator<Item = &'a NodeMaintenance>,
    ) -> Snapshot {
        Snapshot::from_states(
            nodes.into_iter().map(NodeState::from_node).collect(),
            requests,
        )
    }
}

/// What limits admission in `MaintenanceOperatorConfig`, not yet resolved against a node count.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Limits {
    /// Absolute, or a percentage of all nodes rounded up.
    pub max_parallel_operations: IntOrString,
    /// Absolute, or a percentage of all nodes rounded down; `None` means no limit.
    pub max_unavailable: Option<IntOrString>,
    /// Limits for the nodes each budget selects; empty: none.
    pub budgets: Vec<Budget>,
    /// Cluster-wide windows for new admissions; empty: always open.
    pub maintenance_windows: Vec<MaintenanceWindow>,
    /// Periods in which nothing is admitted; empty: none.
    pub blackouts: Vec<Blackout>,
    /// `admission.yieldBlockedDrainAfterSeconds`: the base of a yielded request's back-off;
    /// `None`: no yields, and a request that yielded before waits for nothing more.
    pub yield_blocked_drain_after: Option<Duration>,
    /// `admission.gates`: the gate that holds every admission, over what the shell last observed
    /// ([`crate::gates::hold`]); `None`: no gates, or all open. From a config alone, a gate
    /// not asked yet holds (fail closed).
    pub gate_hold: Option<crate::gates::GateHold>,
}

impl Limits {
    /// The limits of a config spec; `None` (no `default` config) gives the defaults.
    pub fn from_config(spec: Option<&MaintenanceOperatorConfigSpec>) -> Limits {
        match spec {
            Some(spec) => Limits {
                max_parallel_operations: spec.max_parallel_operations(),
                max_unavailable: spec.max_unavailable.clone(),
                budgets: spec.budgets().to_vec(),
                maintenance_windows: spec.maintenance_windows().to_vec(),
                blackouts: spec.blackouts().to_vec(),
                yield_blocked_drain_after: spec.yield_blocked_drain_after(),
                gate_hold: crate::gates::hold(spec.gates(), &[]),
            },
            None => Limits {
                max_parallel_operations: MaintenanceOperatorConfigSpec::default()
                    .max_parallel_operations(),
                ..Limits::default()
            },
        }
    }
}

/// Identifies a NodeMaintenance; shown (and serialized) as `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for RequestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl Serialize for RequestKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// What holds a Pending request back. The limits are named by their config field; with
/// [`Waiting::budget`] set, the field is that budget's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum WaitCause {
    /// The request is being deleted.
    Deleting,
    /// Another request holds the node.
    NodeInMaintenance,
    /// A request ordered before it on the same node is admitted in this round.
    NodeAdmittedThisRound,
    NodeNotFound,
    /// No window is open (cluster-wide, or the budget's).
    MaintenanceWindows,
    /// A blackout (`blackouts`) holds every admission; the reason names it and its end.
    Blackout,
    /// An alert gate (`admission.gates`) holds every admission: its query returned series, or
    /// it could not be asked; the reason names the gate and what it returned.
    Gate,
    MaxParallelOperations,
    MaxUnavailable,
    MaxGroupsInMaintenance,
    MaxUnavailableGroups,
    /// `preferDrainable`: passed over for requests whose drain can make progress now, because
    /// this one's would wait on a PodDisruptionBudget (named in the reason).
    DrainBlocked,
    /// `checkCapacity`: the pods its drain would evict do not fit on the remaining schedulable
    /// nodes (the reason says what is missing).
    InsufficientCapacity,
    /// `checkCapacity`: the pods could not be read this round, so the check fails closed.
    CapacityUnknown,
    /// Its admission writes failed; it waits for the retry (the reason has the error and the
    /// time) while the next request takes the slot.
    AdmissionRetry,
    /// The MaintenanceOperatorConfig cannot be used (a limit, window, time zone or budget
    /// selector the operator cannot read): nothing is admitted until it is fixed, and the
    /// reason names the field.
    ConfigError,
    /// It gave its slot back because budgets blocked its drain, and waits out its back-off (the
    /// reason names what blocked it and when it may be admitted again).
    YieldBackoff,
    /// Its node group can never be admitted together under the config's limits (the reason
    /// names the limit and by how much the group is over it).
    GroupCannotFit,
    /// Its node group has fewer requests than its `group-size` annotation says; it waits for
    /// the rest.
    GroupIncomplete,
    /// A node group ahead of it waits for free slots, which it keeps: requests behind it do not
    /// take them, so the group is not starved.
    BehindGroup,
}

impl WaitCause {
    pub const ALL: [WaitCause; 20] = [
        WaitCause::Deleting,
        WaitCause::NodeInMaintenance,
        WaitCause::NodeAdmittedThisRound,
        WaitCause::NodeNotFound,
        WaitCause::MaintenanceWindows,
        WaitCause::Blackout,
        WaitCause::Gate,
        WaitCause::MaxParallelOperations,
        WaitCause::MaxUnavailable,
        WaitCause::MaxGroupsInMaintenance,
        WaitCause::MaxUnavailableGroups,
        WaitCause::DrainBlocked,
        WaitCause::InsufficientCapacity,
        WaitCause::CapacityUnknown,
        WaitCause::AdmissionRetry,
        WaitCause::ConfigError,
        WaitCause::YieldBackoff,
        WaitCause::GroupCannotFit,
        WaitCause::GroupIncomplete,
        WaitCause::BehindGroup,
    ];

    /// As in `plan -o json` and the `cause` label of the waiting-requests metric.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitCause::Deleting => "deleting",
            WaitCause::NodeInMaintenance => "nodeInMaintenance",
            WaitCause::NodeAdmittedThisRound => "nodeAdmittedThisRound",
            WaitCause::NodeNotFound => "nodeNotFound",
            WaitCause::MaintenanceWindows => "maintenanceWindows",
            WaitCause::Blackout => "blackout",
            WaitCause::Gate => "gate",
            WaitCause::MaxParallelOperations => "maxParallelOperations",
            WaitCause::MaxUnavailable => "maxUnavailable",
            WaitCause::MaxGroupsInMaintenance => "maxGroupsInMaintenance",
            WaitCause::MaxUnavailableGroups => "maxUnavailableGroups",
            WaitCause::DrainBlocked => "drainBlocked",
            WaitCause::InsufficientCapacity => "insufficientCapacity",
            WaitCause::CapacityUnknown => "capacityUnknown",
            WaitCause::AdmissionRetry => "admissionRetry",
            WaitCause::ConfigError => "configError",
            WaitCause::YieldBackoff => "yieldBackoff",
            WaitCause::GroupCannotFit => "groupCannotFit",
            WaitCause::GroupIncomplete => "groupIncomplete",
            WaitCause::BehindGroup => "behindGroup",
        }
    }
}

/// A Pending request that this round does not admit, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Waiting {
    #[serde(rename = "name")]
    pub key: RequestKey,
    /// For a person (the request's Pending message).
    pub reason: String,
    pub cause: WaitCause,
    /// The budget that holds it back; absent for the cluster-wide limits and windows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<String>,
    /// The budget's group (the node's `groupByLabel` value) that holds it back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The request's node group ([`maintenance_crds::NODE_GROUP_LABEL`]), which waits with it.
    #[serde(rename = "nodeGroup", skip_serializing_if = "Option::is_none")]
    pub node_group: Option<String>,
}

/// `2`, or `15% (2 of 10 nodes)` for a percentage.
pub(crate) fn describe_limit(value: &IntOrString, resolved: u32, total_nodes: u32) -> String {
    match value {
        IntOrString::Int(_) => resolved.to_string(),
        IntOrString::String(text) => format!("{text} ({resolved} of {total_nodes} nodes)"),
    }
}

pub(crate) fn nodes_are(n: u32) -> String {
    if n == 1 {
        "1 node is".to_string()
    } else {
        format!("{n} nodes are")
    }
}

pub(crate) fn more_in_this_round(n: u32, what: &str) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(", {n} more {what} in this round")
    }
}
