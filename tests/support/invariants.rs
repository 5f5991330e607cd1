//! One invariant monitor for every e2e test: it watches Nodes, NodeMaintenances,
//! PodDisruptionBudgets and the `default` MaintenanceOperatorConfig, replays what it saw in
//! resourceVersion order (etcd revisions: one counter for every object, so the replay is the true
//! sequence of states, whatever order the separate watch streams delivered it in), and reports
//! every breach of the operator's promises:
//!
//! - **PDB below desired**: a budget of the scope's namespace, as the disruption controller
//!   reported it for its current generation, counts fewer healthy pods than it desires, after it
//!   had once been satisfied and while a request of the scope was in progress (before and outside
//!   maintenance, only the test itself takes pods away).
//! - **maxParallelOperations**: when a request is admitted (leaves Pending), more nodes are in
//!   maintenance than the limit allows.
//! - **maxUnavailable**: when a request on an available node is admitted, more nodes are
//!   unavailable than the limit allows.
//! - **two requests in progress on one node** (requests of the scope in maintenance, same node).
//! - **node left cordoned**: a node of the scope that we cordoned is still unschedulable at the
//!   end although its request is gone.
//! - **pod deleted instead of evicted**: the audit log shows a `delete` of a pod of the namespace
//!   by the operator's identity ([`Scope::operator_user`]).
//!
//! Definitions follow docs/architecture.md (Request lifecycle, Scheduling algorithm) and reuse the core's: a node is
//! *unavailable* when unschedulable or not Ready ([`NodeState::from_node`]) or in maintenance;
//! a node is *in maintenance* while a request on it is past Pending and the Node exists, a request
//! being deleted included until it is *released*: deleted past Pending with the operator's
//! finalizer off (its cleanup is done; another finalizer may keep the object), as
//! [`RequestState::from_request`] decides and the scheduler counts it. Limits given as
//! percentages are of **all the cluster's nodes** at that moment
//! (maxParallelOperations rounded up, maxUnavailable rounded down), as the operator computes
//! them; that is why the limit checks only mean something on a control plane the test owns, and
//! run only when [`Scope::check_limits`] says so (by default: when the testbed is the test's own).
//! At an admission the monitor holds the operator to the most permissive limits in force between
//! the request's last Pending version and its admission, and leaves out nodes that went down in
//! that interval: the operator decided on a snapshot somewhere in between.
//!
//! "Cordoned by us": the operator records the node's state before it cordons in the request's
//! annotation `maintenance.nvidia.com/node-initial-state.unschedulable` and cordons only when it
//! is `"false"` and `spec.cordon` is true (`we_cordon` in the core's lifecycle). The monitor
//! attributes a node's change from schedulable to unschedulable to a request of the scope when,
//! at that revision, the request was in progress on the node with `cordon` true and that
//! annotation `"false"`. A node the test cordoned before its request (annotation `"true"`), or
//! after the request was gone, is never reported.
//!
//! Tests share one control plane per binary, so everything is restricted to the scope: PDBs and
//! requests of its namespace (all namespaces when limits are checked, as the operator counts
//! them), nodes it names.
//!
//! The watches restart on their own (API server restarts, cut connections); a restarted watch
//! lists again, and what it knew and the new list lacks is marked gone ([`StreamMemory`]).
//! [`InvariantMonitor::finish`] lists every kind once more before the last replay, so the end
//! state is the API server's, whatever a stream had not delivered yet.
//!
//! ```ignore
//! let monitor = InvariantMonitor::start(&testbed, Scope::new(&ns, &nodes)).await?;
//! // ... the test ...
//! monitor.finish().await?;
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use maintenance_core::lifecycle::initial_state;
use maintenance_core::scheduler::{NodeState, RequestState};
use maintenance_crds::{
    DEFAULT_CONFIG_NAME, MaintenanceOperatorConfig, MaintenanceOperatorConfigSpec, NodeMaintenance,
    Phase, Rounding, resolve_int_or_percent,
};

use super::Testbed;
use super::audit::AuditLog;
use super::operator::OPERATOR_NAMESPACE;

/// What a monitor watches and judges.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// Namespace of the test's NodeMaintenances, pods and PDBs.
    pub namespace: String,
    /// The nodes the test owns (names); limits are checked over these.
    pub nodes: Vec<String>,
    /// The operator's identity in the audit log (user name), when the test started it with
    /// `Operator::start_as`; enables the audit-based checks (pod deleted instead of evicted).
    /// None: those checks are skipped and the report says so.
    pub operator_user: Option<String>,
    /// Check maxParallelOperations and maxUnavailable. `None`: when the testbed is the test's own
    /// (`Testbed::start`); on a shared one other tests' nodes and requests count too.
    pub check_limits: Option<bool>,
    /// Limits to hold the operator to instead of the config's (only the two limits are read).
    pub limits: Option<MaintenanceOperatorConfigSpec>,
    /// PDBs of the namespace the test disrupts on purpose, left out of the PDB check.
    pub excluded_pdbs: Vec<String>,
}

impl Scope {
    pub fn new(namespace: &str, nodes: &[String]) -> Scope {
        Scope {
            namespace: namespace.to_string(),
            nodes: nodes.to_vec(),
            ..Scope::default()
        }
    }

    /// With the audit checks for the operator running as `user`.
    pub fn operator_user(mut self, user: impl Into<String>) -> Scope {
        self.operator_user = Some(user.into());
        self
    }

    pub fn check_limits(mut self, check: bool) -> Scope {
        self.check_limits = Some(check);
        self
    }

    /// Leaves `pdb` out of the PDB check (the test disrupts it on purpose).
    pub fn excluding_pdb(mut self, pdb: &str) -> Scope {
        self.excluded_pdbs.push(pdb.to_string());
        self
    }
}

// ---------------------------------------------------------------------------------------------
// What the watches record

/// The limits of a config, not yet resolved against a node count.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigLimits {
    pub max_parallel_operations: IntOrString,
    /// `None`: no limit.
    pub max_unavailable: Option<IntOrString>,
}

impl ConfigLimits {
    /// The limits of a config spec; `None` (no `default` config): the defaults.
    pub fn of(spec: Option<&MaintenanceOperatorConfigSpec>) -> ConfigLimits {
        let default = MaintenanceOperatorConfigSpec::default();
        let spec = spec.unwrap_or(&default);
        ConfigLimits {
            max_parallel_operations: spec.max_parallel_operations(),
            max_unavailable: spec.max_unavailable.clone(),
        }
    }
}

/// One observed state of one object.
#[derive(Clone, Debug, PartialEq)]
pub enum Observed {
    Node {
        name: String,
        unschedulable: bool,
        /// Unschedulable or not Ready, as the scheduler defines it.
        unavailable: bool,
    },
    NodeGone {
        name: String,
    },
    Request {
        /// `namespace/name`.
        key: String,
        namespace: String,
        node: String,
        phase: Phase,
        cordon: bool,
        /// The annotation the operator writes before it cordons.
        initial_unschedulable: Option<bool>,
        /// Deleted and cleaned up (our finalizer off): holds its node no longer.
        released: bool,
    },
    RequestGone {
        key: String,
    },
    Pdb {
        /// `namespace/name`.
        key: String,
        namespace: String,
        name: String,
        /// The status is about the current generation.
        current: bool,
        current_healthy: i32,
        desired_healthy: i32,
        expected_pods: i32,
        disruptions_allowed: i32,
    },
    PdbGone {
        key: String,
    },
    Config(ConfigLimits),
}

/// An observation with the resourceVersion that made it true.
#[derive(Clone, Debug)]
pub struct Event {
    pub resource_version: u64,
    /// When the monitor received it (for messages only).
    pub seen: Timestamp,
    pub observed: Observed,
}

impl Event {
    pub fn new(resource_version: u64, observed: Observed) -> Event {
        Event {
            resource_version,
            seen: Timestamp::now(),
            observed,
        }
    }
}

fn resource_version(meta: &ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub fn observe_node(node: &Node) -> Event {
    let state = NodeState::from_node(node);
    Event::new(
        resource_version(&node.metadata),
        Observed::Node {
            unschedulable: node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            unavailable: state.unavailable,
            name: state.name,
        },
    )
}

pub fn observe_request(request: &NodeMaintenance) -> Event {
    Event::new(
        resource_version(&request.metadata),
        Observed::Request {
            key: request.key(),
            namespace: request.namespace().unwrap_or_default(),
            node: request.spec.node_name.clone(),
            phase: request.phase(),
            cordon: request.spec.cordon(),
            initial_unschedulable: initial_state(request),
            released: RequestState::from_request(request).released,
        },
    )
}

pub fn observe_pdb(pdb: &PodDisruptionBudget) -> Option<Event> {
    let status = pdb.status.as_ref()?;
    let namespace = pdb.namespace().unwrap_or_default();
    let name = pdb.name_any();
    Some(Event::new(
        resource_version(&pdb.metadata),
        Observed::Pdb {
            key: format!("{namespace}/{name}"),
            namespace,
            name,
            current: status.observed_generation >= pdb.metadata.generation,
            current_healthy: status.current_healthy.unwrap_or(0),
            desired_healthy: status.desired_healthy.unwrap_or(0),
            expected_pods: status.expected_pods.unwrap_or(0),
            disruptions_allowed: status.disruptions_allowed.unwrap_or(0),
        },
    ))
}

// ---------------------------------------------------------------------------------------------
// Judging

/// The kinds of breach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BreachKind {
    PdbBelowDesired,
    MaxParallelOperationsExceeded,
    MaxUnavailableExceeded,
    TwoRequestsInProgressOnOneNode,
    NodeLeftCordoned,
    PodDeletedInsteadOfEvicted,
}

impl fmt::Display for BreachKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BreachKind::PdbBelowDesired => "PDB healthy below desired",
            BreachKind::MaxParallelOperationsExceeded => "maxParallelOperations exceeded",
            BreachKind::MaxUnavailableExceeded => "maxUnavailable exceeded",
            BreachKind::TwoRequestsInProgressOnOneNode => "two requests in progress on one node",
            BreachKind::NodeLeftCordoned => "node left cordoned by the operator",
            BreachKind::PodDeletedInsteadOfEvicted => "pod deleted instead of evicted",
        })
    }
}

/// One breach: the object, when (resourceVersion, or the audit log's time) and the numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct Breach {
    pub kind: BreachKind,
    pub object: String,
    pub resource_version: Option<u64>,
    pub at: Timestamp,
    pub detail: String,
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} at {}", self.kind, self.object, self.at)?;
        if let Some(rv) = self.resource_version {
            write!(f, " (resourceVersion {rv})")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// What the replay judges, besides the events.
#[derive(Clone, Debug, Default)]
pub struct Rules {
    pub namespace: String,
    pub nodes: BTreeSet<String>,
    pub check_limits: bool,
    /// Limits that replace the config's.
    pub limits: Option<ConfigLimits>,
    pub excluded_pdbs: BTreeSet<String>,
}

/// What a replay found.
#[derive(Clone, Debug, Default)]
pub struct Judgement {
    pub breaches: Vec<Breach>,
    pub events: usize,
    /// Most nodes in maintenance at once (requests the monitor watched).
    pub peak_in_maintenance: usize,
    /// Most nodes unavailable at once (in maintenance, unschedulable or not Ready; all nodes).
    pub peak_unavailable: usize,
    /// The nodes of one moment with [`Judgement::peak_unavailable`] of them unavailable.
    pub peak_unavailable_nodes: BTreeSet<String>,
    /// Lowest currentHealthy - desiredHealthy of a checked PDB while it was judged.
    pub lowest_pdb_margin: Option<i32>,
    pub admissions: usize,
}

#[derive(Clone, Debug)]
struct RequestNow {
    namespace: String,
    node: String,
    /// Holds its node: past Pending and not released.
    in_progress: bool,
    cordon: bool,
    initial_unschedulable: Option<bool>,
    /// resourceVersion of its last Pending version (or of its first one seen).
    last_pending: u64,
}

#[derive(Clone, Copy, Debug)]
struct NodeNow {
    unschedulable: bool,
    unavailable: bool,
    /// resourceVersion at which it last became unavailable by itself.
    down_since: u64,
}

#[derive(Clone, Debug, Default)]
struct PdbNow {
    satisfied_once: bool,
    in_dip: bool,
}

struct Replay<'a> {
    rules: &'a Rules,
    nodes: BTreeMap<String, NodeNow>,
    requests: BTreeMap<String, RequestNow>,
    pdbs: HashMap<String, PdbNow>,
    /// Config limits in force, with the resourceVersion from which on.
    config_history: Vec<(u64, ConfigLimits)>,
    /// Node -> the request whose cordon made it unschedulable.
    cordoned_by: BTreeMap<String, String>,
    reported_pairs: BTreeSet<(String, Vec<String>)>,
    judgement: Judgement,
}

/// Replays `events` in resourceVersion order (ties keep their order) and judges every state.
pub fn judge(events: &[Event], rules: &Rules) -> Judgement {
    let mut ordered: Vec<&Event> = events.iter().collect();
    ordered.sort_by_key(|e| e.resource_version);
    let mut replay = Replay {
        rules,
        nodes: BTreeMap::new(),
        requests: BTreeMap::new(),
        pdbs: HashMap::new(),
        config_history: vec![(0, ConfigLimits::of(None))],
        cordoned_by: BTreeMap::new(),
        reported_pairs: BTreeSet::new(),
        judgement: Judgement {
            events: events.len(),
            ..Judgement::default()
        },
    };
    for event in ordered {
        replay.apply(event);
        replay.track_peaks();
    }
    replay.end_checks();
    replay.judgement
}

impl Replay<'_> {
    fn breach(&mut self, kind: BreachKind, object: String, event: &Event, detail: String) {
        self.judgement.breaches.push(Breach {
            kind,
            object,
            resource_version: Some(event.resource_version),
            at: event.seen,
            detail,
        });
    }

    /// Existing nodes held by a request past Pending (any namespace the monitor watched).
    fn in_maintenance(&self) -> BTreeMap<&str, Vec<&str>> {
        let mut held: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (key, r) in &self.requests {
            if r.in_progress && self.nodes.contains_key(&r.node) {
                held.entry(r.node.as_str()).or_default().push(key.as_str());
            }
        }
        held
    }

    fn unavailable(&self) -> BTreeSet<String> {
        let held = self.in_maintenance();
        self.nodes
            .iter()
            .filter(|(name, n)| n.unavailable || held.contains_key(name.as_str()))
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn track_peaks(&mut self) {
        let in_maintenance = self.in_maintenance().len();
        let unavailable = self.unavailable();
        let j = &mut self.judgement;
        j.peak_in_maintenance = j.peak_in_maintenance.max(in_maintenance);
        if unavailable.len() > j.peak_unavailable {
            j.peak_unavailable = unavailable.len();
            j.peak_unavailable_nodes = unavailable;
        }
    }

    /// The limits in force at any revision in `from..=to`: the configs' when not overridden.
    fn limits_between(&self, from: u64, to: u64) -> Vec<ConfigLimits> {
        if let Some(fixed) = &self.rules.limits {
            return vec![fixed.clone()];
        }
        let mut out = Vec::new();
        for (i, (since, limits)) in self.config_history.iter().enumerate() {
            let until = self
                .config_history
                .get(i + 1)
                .map_or(u64::MAX, |(next, _)| *next);
            if *since <= to && until > from {
                out.push(limits.clone());
            }
        }
        out
    }

    fn scope_request_in_progress(&self) -> bool {
        self.requests
            .values()
            .any(|r| r.in_progress && r.namespace == self.rules.namespace)
    }

    fn apply(&mut self, event: &Event) {
        let rv = event.resource_version;
        match &event.observed {
            Observed::Node {
                name,
                unschedulable,
                unavailable,
            } => {
                let before = self.nodes.get(name).copied();
                let down_since = match before {
                    Some(b) if b.unavailable => b.down_since,
                    _ => rv,
                };
                if before.is_some_and(|b| !b.unschedulable) && *unschedulable {
                    let ours = self.requests.iter().find(|(_, r)| {
                        r.node == *name
                            && r.in_progress
                            && r.namespace == self.rules.namespace
                            && r.cordon
                            && r.initial_unschedulable == Some(false)
                    });
                    match ours {
                        Some((key, _)) => {
                            self.cordoned_by.insert(name.clone(), key.clone());
                        }
                        None => {
                            self.cordoned_by.remove(name);
                        }
                    }
                }
                if !*unschedulable {
                    self.cordoned_by.remove(name);
                }
                self.nodes.insert(
                    name.clone(),
                    NodeNow {
                        unschedulable: *unschedulable,
                        unavailable: *unavailable,
                        down_since,
                    },
                );
            }
            Observed::NodeGone { name } => {
                self.nodes.remove(name);
                self.cordoned_by.remove(name);
            }
            Observed::Request {
                key,
                namespace,
                node,
                phase,
                cordon,
                initial_unschedulable,
                released,
            } => {
                // A released request is done for the operator as if it were gone: it leaves
                // maintenance here, and can never come back (a deleted object gets no new
                // finalizer).
                let in_progress = *phase != Phase::Pending && !*released;
                let before = self.requests.get(key).cloned();
                let last_pending = match &before {
                    _ if !in_progress => rv,
                    Some(b) => b.last_pending,
                    None => rv,
                };
                let admitted = in_progress && before.as_ref().is_none_or(|b| !b.in_progress);
                // The node's state just before this request took it.
                let node_was_available = self.nodes.get(node).is_some_and(|n| {
                    !n.unavailable && !self.in_maintenance().contains_key(node.as_str())
                });
                self.requests.insert(
                    key.clone(),
                    RequestNow {
                        namespace: namespace.clone(),
                        node: node.clone(),
                        in_progress,
                        cordon: *cordon,
                        initial_unschedulable: *initial_unschedulable,
                        last_pending,
                    },
                );
                if admitted {
                    self.judgement.admissions += 1;
                    if self.rules.check_limits && self.nodes.contains_key(node) {
                        self.check_limits_at_admission(
                            event,
                            key,
                            node,
                            last_pending,
                            node_was_available,
                        );
                    }
                }
                if in_progress && *namespace == self.rules.namespace {
                    self.check_one_per_node(event, node);
                }
            }
            Observed::RequestGone { key } => {
                self.requests.remove(key);
            }
            Observed::Pdb {
                key,
                namespace,
                name,
                current,
                current_healthy,
                desired_healthy,
                expected_pods,
                disruptions_allowed,
            } => {
                if *namespace != self.rules.namespace
                    || self.rules.excluded_pdbs.contains(name)
                    || !*current
                    || *expected_pods == 0
                {
                    return;
                }
                let maintenance = self.scope_request_in_progress();
                let state = self.pdbs.entry(key.clone()).or_default();
                let mut dipped = false;
                if current_healthy >= desired_healthy {
                    state.satisfied_once = true;
                    state.in_dip = false;
                } else if state.satisfied_once && !state.in_dip && maintenance {
                    state.in_dip = true;
                    dipped = true;
                }
                let judged = state.satisfied_once && maintenance;
                if dipped {
                    self.breach(
                        BreachKind::PdbBelowDesired,
                        format!("PodDisruptionBudget {key}"),
                        event,
                        format!(
                            "currentHealthy {current_healthy} < desiredHealthy {desired_healthy} \
                             (expectedPods {expected_pods}, disruptionsAllowed \
                             {disruptions_allowed}) while a request of {} was in progress",
                            self.rules.namespace
                        ),
                    );
                }
                if judged {
                    let margin = current_healthy - desired_healthy;
                    let lowest = &mut self.judgement.lowest_pdb_margin;
                    *lowest = Some(lowest.map_or(margin, |l| l.min(margin)));
                }
            }
            Observed::PdbGone { key } => {
                self.pdbs.remove(key);
            }
            Observed::Config(limits) => {
                self.config_history.push((rv, limits.clone()));
            }
        }
    }

    fn check_limits_at_admission(
        &mut self,
        event: &Event,
        key: &str,
        node: &str,
        last_pending: u64,
        node_was_available: bool,
    ) {
        let rv = event.resource_version;
        let total = u32::try_from(self.nodes.len()).unwrap_or(u32::MAX);
        let limits = self.limits_between(last_pending, rv);
        let held: BTreeSet<String> = self
            .in_maintenance()
            .keys()
            .map(|n| n.to_string())
            .collect();
        let in_maintenance: Vec<String> = held.iter().cloned().collect();
        let resolve = |field, value: &IntOrString, rounding| {
            resolve_int_or_percent(field, value, total, rounding).ok()
        };
        // The most permissive limit the operator may have read; an unreadable one is not judged.
        let max_parallel = limits
            .iter()
            .map(|l| {
                resolve(
                    "maxParallelOperations",
                    &l.max_parallel_operations,
                    Rounding::Up,
                )
            })
            .collect::<Option<Vec<u32>>>()
            .and_then(|v| v.into_iter().max());
        if let Some(limit) = max_parallel
            && in_maintenance.len() > limit as usize
        {
            self.breach(
                BreachKind::MaxParallelOperationsExceeded,
                format!("NodeMaintenance {key} (node {node})"),
                event,
                format!(
                    "admitted with {} nodes in maintenance, maxParallelOperations {} \
                     (configured {}, {total} nodes): {in_maintenance:?}",
                    in_maintenance.len(),
                    limit,
                    describe(limits.iter().map(|l| &l.max_parallel_operations)),
                ),
            );
        }
        if !node_was_available {
            return;
        }
        let max_unavailable = limits
            .iter()
            .map(|l| {
                l.max_unavailable
                    .as_ref()
                    .map(|v| resolve("maxUnavailable", v, Rounding::Down))
            })
            .collect::<Option<Option<Vec<u32>>>>();
        // Some(None): one of the limits was "no limit".
        let Some(Some(values)) = max_unavailable else {
            return;
        };
        let Some(limit) = values.into_iter().max() else {
            return;
        };
        // Nodes that went down by themselves after the request's last Pending version may not
        // have been in the operator's snapshot.
        let unavailable: BTreeSet<String> = self
            .unavailable()
            .into_iter()
            .filter(|n| {
                held.contains(n)
                    || self
                        .nodes
                        .get(n)
                        .is_some_and(|s| s.down_since <= last_pending)
            })
            .collect();
        if unavailable.len() > limit as usize {
            self.breach(
                BreachKind::MaxUnavailableExceeded,
                format!("NodeMaintenance {key} (node {node}, available before)"),
                event,
                format!(
                    "admitted with {} nodes unavailable, maxUnavailable {limit} (configured {}, \
                     {total} nodes): {unavailable:?}",
                    unavailable.len(),
                    describe(limits.iter().filter_map(|l| l.max_unavailable.as_ref())),
                ),
            );
        }
    }

    fn check_one_per_node(&mut self, event: &Event, node: &str) {
        let mut keys: Vec<String> = self
            .requests
            .iter()
            .filter(|(_, r)| r.in_progress && r.node == node && r.namespace == self.rules.namespace)
            .map(|(k, _)| k.clone())
            .collect();
        if keys.len() < 2 {
            return;
        }
        keys.sort();
        if self.reported_pairs.insert((node.to_string(), keys.clone())) {
            self.breach(
                BreachKind::TwoRequestsInProgressOnOneNode,
                format!("node {node}"),
                event,
                format!("{} requests past Pending at once: {keys:?}", keys.len()),
            );
        }
    }

    fn end_checks(&mut self) {
        let mut left = Vec::new();
        for (node, request) in &self.cordoned_by {
            let still = self.nodes.get(node).is_some_and(|n| n.unschedulable);
            let gone = !self.requests.contains_key(request);
            let held = self
                .requests
                .values()
                .any(|r| r.node == *node && r.in_progress);
            if still
                && gone
                && !held
                && (self.rules.nodes.is_empty() || self.rules.nodes.contains(node))
            {
                left.push((node.clone(), request.clone()));
            }
        }
        let last = Timestamp::now();
        for (node, request) in left {
            self.judgement.breaches.push(Breach {
                kind: BreachKind::NodeLeftCordoned,
                object: format!("node {node}"),
                resource_version: None,
                at: last,
                detail: format!(
                    "still unschedulable at the end; NodeMaintenance {request} cordoned it and is gone"
                ),
            });
        }
    }
}

fn describe<'a>(values: impl Iterator<Item = &'a IntOrString>) -> String {
    let texts: Vec<String> = values
        .map(|v| match v {
            IntOrString::Int(i) => i.to_string(),
            IntOrString::String(s) => s.clone(),
        })
        .collect();
    texts.join(" or ")
}

/// Breaches from the audit log: deletes of pods of `namespace` by `operator_user` since `since`.
pub fn audit_breaches(
    audit: &AuditLog,
    namespace: &str,
    operator_user: &str,
    since: Timestamp,
) -> Vec<Breach> {
    audit
        .pod_deletions
        .iter()
        .filter(|d| {
            d.namespace == namespace
                && d.user == operator_user
                && d.received >= since
                && (200..300).contains(&d.code)
        })
        .map(|d| Breach {
            kind: BreachKind::PodDeletedInsteadOfEvicted,
            object: if d.pod.is_empty() {
                format!("pods of {namespace} (deletecollection)")
            } else {
                format!("pod {namespace}/{}", d.pod)
            },
            resource_version: None,
            at: d.received,
            detail: format!(
                "{operator_user} deleted it (HTTP {}) instead of calling the Eviction API",
                d.code
            ),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The monitor

/// What a clean run saw.
#[derive(Clone, Debug)]
pub struct MonitorReport {
    pub events: usize,
    pub admissions: usize,
    pub peak_in_maintenance: usize,
    pub peak_unavailable: usize,
    pub peak_unavailable_nodes: BTreeSet<String>,
    pub lowest_pdb_margin: Option<i32>,
    pub limits_checked: bool,
    pub audit_checked: bool,
    /// Every PDB status the monitor saw (for tests that relate audit entries to versions).
    pub pdb_states: Vec<Event>,
    pub watch_errors: usize,
}

impl fmt::Display for MonitorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invariants held over {} events ({} admissions): at most {} nodes in maintenance, \
             {} unavailable; lowest PDB healthy margin {}; limits {}; audit checks {}; {} watch errors",
            self.events,
            self.admissions,
            self.peak_in_maintenance,
            self.peak_unavailable,
            self.lowest_pdb_margin
                .map_or("-".to_string(), |m| m.to_string()),
            if self.limits_checked {
                "checked"
            } else {
                "not checked (shared testbed)"
            },
            if self.audit_checked {
                "run"
            } else {
                "skipped (no operator identity)"
            },
            self.watch_errors,
        )
    }
}

#[derive(Default)]
struct Recorded {
    events: Vec<Event>,
    /// Initial lists complete, per stream.
    listed: BTreeSet<&'static str>,
    errors: usize,
}

/// Watches the scope and judges it; see the module comment.
pub struct InvariantMonitor {
    scope: Scope,
    rules: Rules,
    client: Client,
    audit_dir: std::path::PathBuf,
    started: Timestamp,
    recorded: Arc<Mutex<Recorded>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

const STREAMS: [&str; 4] = [
    "nodes",
    "nodemaintenances",
    "poddisruptionbudgets",
    "config",
];

fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    stream_name: &'static str,
    recorded: Arc<Mutex<Recorded>>,
    observe: fn(&K) -> Option<Event>,
    gone: fn(&K) -> Event,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + fmt::Debug + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let stream = watcher(api, config).default_backoff();
        futures::pin_mut!(stream);
        let mut memory = StreamMemory::default();
        let key = |o: &K| format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any());
        while let Some(event) = stream.next().await {
            let Ok(mut recorded) = recorded.lock() else {
                return;
            };
            match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                    memory.seen(key(&o), gone(&o).observed);
                    recorded.events.extend(observe(&o));
                }
                Ok(watcher::Event::Delete(o)) => {
                    memory.deleted(&key(&o));
                    recorded.events.push(gone(&o));
                }
                Ok(watcher::Event::Init) => memory.relist_started(),
                Ok(watcher::Event::InitDone) => {
                    // At the newest revision seen: the objects were gone by then at the latest.
                    let latest = recorded
                        .events
                        .iter()
                        .map(|e| e.resource_version)
                        .max()
                        .unwrap_or(0);
                    for observed in memory.relist_done() {
                        recorded.events.push(Event::new(latest, observed));
                    }
                    recorded.listed.insert(stream_name);
                }
                Err(_) => recorded.errors += 1,
            }
        }
    })
}

/// What one watch stream has seen. A watch that restarts (a lost connection, an expired
/// resourceVersion, an API server restart) lists again and says nothing of what was deleted
/// meanwhile: whatever the stream knew and the new list lacks is gone.
#[derive(Debug, Default)]
pub struct StreamMemory {
    /// Object key -> the observation that marks it gone.
    known: BTreeMap<String, Observed>,
    /// Keys of the list in progress.
    relisted: Option<BTreeSet<String>>,
}

impl StreamMemory {
    pub fn seen(&mut self, key: String, gone: Observed) {
        if let Some(listed) = self.relisted.as_mut() {
            listed.insert(key.clone());
        }
        self.known.insert(key, gone);
    }

    pub fn deleted(&mut self, key: &str) {
        self.known.remove(key);
    }

    pub fn relist_started(&mut self) {
        self.relisted = Some(BTreeSet::new());
    }

    /// The gone-observations of the objects the finished list lacks.
    pub fn relist_done(&mut self) -> Vec<Observed> {
        let listed = self.relisted.take().unwrap_or_default();
        let vanished: Vec<String> = self
            .known
            .keys()
            .filter(|k| !listed.contains(*k))
            .cloned()
            .collect();
        vanished
            .iter()
            .filter_map(|k| self.known.remove(k))
            .collect()
    }
}

fn node_gone(node: &Node) -> Event {
    Event::new(
        resource_version(&node.metadata),
        Observed::NodeGone {
            name: node.name_any(),
        },
    )
}

fn request_gone(request: &NodeMaintenance) -> Event {
    Event::new(
        resource_version(&request.metadata),
        Observed::RequestGone { key: request.key() },
    )
}

fn pdb_gone(pdb: &PodDisruptionBudget) -> Event {
    Event::new(
        resource_version(&pdb.metadata),
        Observed::PdbGone {
            key: format!("{}/{}", pdb.namespace().unwrap_or_default(), pdb.name_any()),
        },
    )
}

fn observe_config(config: &MaintenanceOperatorConfig) -> Option<Event> {
    Some(Event::new(
        resource_version(&config.metadata),
        Observed::Config(ConfigLimits::of(Some(&config.spec))),
    ))
}

fn config_gone(config: &MaintenanceOperatorConfig) -> Event {
    Event::new(
        resource_version(&config.metadata),
        Observed::Config(ConfigLimits::of(None)),
    )
}

impl InvariantMonitor {
    /// Starts watching (reads the MaintenanceOperatorConfig `default` in namespace
    /// `maintenance-operator` and follows its edits); returns once every watch has its initial
    /// list, so that everything the test does next is seen.
    pub async fn start(testbed: &Testbed, scope: Scope) -> Result<InvariantMonitor> {
        let client = testbed.client().await?;
        let check_limits = scope.check_limits.unwrap_or(testbed.is_exclusive());
        let rules = Rules {
            namespace: scope.namespace.clone(),
            nodes: scope.nodes.iter().cloned().collect(),
            check_limits,
            limits: scope.limits.as_ref().map(|s| ConfigLimits::of(Some(s))),
            excluded_pdbs: scope.excluded_pdbs.iter().cloned().collect(),
        };
        let recorded = Arc::new(Mutex::new(Recorded::default()));
        let requests: Api<NodeMaintenance> = if check_limits {
            Api::all(client.clone())
        } else {
            Api::namespaced(client.clone(), &scope.namespace)
        };
        let tasks = vec![
            spawn_watch(
                Api::<Node>::all(client.clone()),
                watcher::Config::default(),
                "nodes",
                recorded.clone(),
                |n| Some(observe_node(n)),
                node_gone,
            ),
            spawn_watch(
                requests,
                watcher::Config::default(),
                "nodemaintenances",
                recorded.clone(),
                |r| Some(observe_request(r)),
                request_gone,
            ),
            spawn_watch(
                Api::<PodDisruptionBudget>::namespaced(client.clone(), &scope.namespace),
                watcher::Config::default(),
                "poddisruptionbudgets",
                recorded.clone(),
                observe_pdb,
                pdb_gone,
            ),
            spawn_watch(
                Api::<MaintenanceOperatorConfig>::namespaced(client.clone(), OPERATOR_NAMESPACE),
                watcher::Config::default().fields(&format!("metadata.name={DEFAULT_CONFIG_NAME}")),
                "config",
                recorded.clone(),
                observe_config,
                config_gone,
            ),
        ];
        let monitor = InvariantMonitor {
            audit_dir: testbed.dir().to_path_buf(),
            scope,
            rules,
            client,
            started: Timestamp::now(),
            recorded,
            tasks,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let listed = monitor
                .recorded
                .lock()
                .map(|r| r.listed.clone())
                .unwrap_or_default();
            if STREAMS.iter().all(|s| listed.contains(s)) {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "the invariant monitor's watches did not list in 60s (listed: {listed:?}); \
                     are the CRDs installed (`operator::install`)?"
                );
            }
            tokio::time::sleep(super::POLL_INTERVAL).await;
        }
        Ok(monitor)
    }

    fn events(&self) -> Vec<Event> {
        self.recorded
            .lock()
            .map(|r| r.events.clone())
            .unwrap_or_default()
    }

    /// Breaches seen so far (Err naming each with the object, the time/resourceVersion and the
    /// numbers). The watches are separate streams, so a state may still lack a change another
    /// stream has not delivered yet; [`InvariantMonitor::finish`] has the last word.
    pub fn check(&self) -> Result<()> {
        let mut judgement = judge(&self.events(), &self.rules);
        // The end-of-test check does not apply in the middle of a test.
        judgement
            .breaches
            .retain(|b| b.kind != BreachKind::NodeLeftCordoned);
        fail_on(&judgement.breaches, &self.scope)
    }

    /// [`finish`](Self::finish) for a test that needs no figures: fails on a breach.
    pub async fn held(self) -> Result<()> {
        self.finish().await.map(drop)
    }

    /// Stops the watches, adds the final state of every watched object, runs the end-of-test
    /// checks (no node of the scope left cordoned by the operator once its request is gone; the
    /// audit checks) and returns Err listing every breach; Ok carries a short report.
    pub async fn finish(self) -> Result<MonitorReport> {
        let mut events = self.final_state().await?;
        for task in &self.tasks {
            task.abort();
        }
        let (recorded, watch_errors) = self
            .recorded
            .lock()
            .map(|r| (r.events.clone(), r.errors))
            .unwrap_or_default();
        events.splice(0..0, recorded);
        let judgement = judge(&events, &self.rules);
        let mut breaches = judgement.breaches.clone();
        let audit_checked = match &self.scope.operator_user {
            Some(user) => {
                let audit = AuditLog::read_dir(&self.audit_dir)?;
                breaches.extend(audit_breaches(
                    &audit,
                    &self.scope.namespace,
                    user,
                    self.started,
                ));
                true
            }
            None => false,
        };
        fail_on(&breaches, &self.scope)?;
        let report = MonitorReport {
            events: judgement.events,
            admissions: judgement.admissions,
            peak_in_maintenance: judgement.peak_in_maintenance,
            peak_unavailable: judgement.peak_unavailable,
            peak_unavailable_nodes: judgement.peak_unavailable_nodes,
            lowest_pdb_margin: judgement.lowest_pdb_margin,
            limits_checked: self.rules.check_limits,
            audit_checked,
            pdb_states: events
                .into_iter()
                .filter(|e| matches!(e.observed, Observed::Pdb { .. }))
                .collect(),
            watch_errors,
        };
        println!("monitor {}: {report}", self.scope.namespace);
        Ok(report)
    }

    /// Lists every watched kind once more: the last changes reach the replay even if a stream
    /// had not delivered them, and objects gone since are marked gone at the list's revision.
    async fn final_state(&self) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        let seen: BTreeSet<String> = self
            .events()
            .iter()
            .filter_map(|e| match &e.observed {
                Observed::Node { name, .. } => Some(format!("node {name}")),
                Observed::Request { key, .. } => Some(format!("request {key}")),
                Observed::Pdb { key, .. } => Some(format!("pdb {key}")),
                _ => None,
            })
            .collect();
        let lp = ListParams::default();
        // Requests before nodes: the operator uncordons a node before it removes its finalizer,
        // so a request this list shows gone has its uncordon in the node list taken after it.
        // Listed the other way round, a node listed still cordoned whose request is gone by the
        // second list reads as "left cordoned" whenever the node watch lags behind (CI saw it).
        let requests_api: Api<NodeMaintenance> = if self.rules.check_limits {
            Api::all(self.client.clone())
        } else {
            Api::namespaced(self.client.clone(), &self.scope.namespace)
        };
        let requests = requests_api
            .list(&lp)
            .await
            .context("the invariant monitor listing NodeMaintenances")?;
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&lp)
            .await
            .context("the invariant monitor listing nodes")?;
        let pdbs =
            Api::<PodDisruptionBudget>::namespaced(self.client.clone(), &self.scope.namespace)
                .list(&lp)
                .await
                .context("the invariant monitor listing PodDisruptionBudgets")?;
        let list_rv = |meta: &kube::api::ListMeta| {
            meta.resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let mut present = BTreeSet::new();
        for n in &nodes.items {
            present.insert(format!("node {}", n.name_any()));
            events.push(observe_node(n));
        }
        for r in &requests.items {
            present.insert(format!("request {}", r.key()));
            events.push(observe_request(r));
        }
        for p in &pdbs.items {
            present.insert(format!(
                "pdb {}/{}",
                p.namespace().unwrap_or_default(),
                p.name_any()
            ));
            events.extend(observe_pdb(p));
        }
        for gone in seen.difference(&present) {
            let (kind, name) = gone.split_once(' ').unwrap_or_default();
            let (rv, observed) = match kind {
                "node" => (
                    list_rv(&nodes.metadata),
                    Observed::NodeGone { name: name.into() },
                ),
                "request" => (
                    list_rv(&requests.metadata),
                    Observed::RequestGone { key: name.into() },
                ),
                _ => (
                    list_rv(&pdbs.metadata),
                    Observed::PdbGone { key: name.into() },
                ),
            };
            events.push(Event::new(rv, observed));
        }
        Ok(events)
    }
}

impl Drop for InvariantMonitor {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A monitor for a test on the shared cluster ([`super::operator::shared_cluster`]) with its
/// namespace and nodes. The shared operator runs as the testbed's admin, as the tests do, so the
/// audit checks are off; the limits are the whole cluster's, so they are not checked either.
pub async fn monitor_shared(namespace: &str, nodes: &[String]) -> Result<InvariantMonitor> {
    let shared = super::operator::shared_cluster().await?;
    InvariantMonitor::start(
        shared.testbed,
        Scope::new(namespace, nodes).operator_user(shared.operator_user.clone()),
    )
    .await
}

/// [`isolated_setup`](super::operator::isolated_setup) on the shared cluster, and a monitor of
/// the test's namespace and nodes: the client, the namespace, the nodes and the monitor.
pub async fn monitored_setup(
    prefix: &str,
    count: usize,
) -> Result<(Client, String, Vec<String>, InvariantMonitor)> {
    let (client, ns, nodes) = super::operator::isolated_setup(prefix, count).await?;
    let monitor = monitor_shared(&ns, &nodes).await?;
    Ok((client, ns, nodes, monitor))
}

/// A monitor of `namespace` and `nodes` on a testbed of the test's own, whose operator runs as
/// ServiceAccount `account` of the operator's namespace (the audit checks follow that identity).
pub async fn monitor_as(
    testbed: &Testbed,
    namespace: &str,
    nodes: &[String],
    account: &str,
) -> Result<InvariantMonitor> {
    let user = super::operator::service_account_user(account);
    InvariantMonitor::start(testbed, Scope::new(namespace, nodes).operator_user(user)).await
}

fn fail_on(breaches: &[Breach], scope: &Scope) -> Result<()> {
    if breaches.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = breaches.iter().map(|b| format!("  - {b}")).collect();
    bail!(
        "{} invariant breach(es) in namespace {}:\n{}",
        breaches.len(),
        scope.namespace,
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    // Replays of hand-written event sequences: each kind of breach with a case that holds and one
    // that breaks it.
    use super::*;

    const NS: &str = "t";

    fn node(rv: u64, name: &str, unschedulable: bool) -> Event {
        Event::new(
            rv,
            Observed::Node {
                name: name.into(),
                unschedulable,
                unavailable: unschedulable,
            },
        )
    }

    fn request(rv: u64, name: &str, node: &str, phase: Phase, initial: Option<bool>) -> Event {
        Event::new(
            rv,
            Observed::Request {
                key: format!("{NS}/{name}"),
                namespace: NS.into(),
                node: node.into(),
                phase,
                cordon: true,
                initial_unschedulable: initial,
                released: false,
            },
        )
    }

    /// Deleted in `phase` with our finalizer off: the operator's cleanup is done, another
    /// finalizer keeps the object.
    fn released(rv: u64, name: &str, node: &str, phase: Phase) -> Event {
        let mut event = request(rv, name, node, phase, Some(false));
        if let Observed::Request { released, .. } = &mut event.observed {
            *released = true;
        }
        event
    }

    fn gone(rv: u64, name: &str) -> Event {
        Event::new(
            rv,
            Observed::RequestGone {
                key: format!("{NS}/{name}"),
            },
        )
    }

    fn pdb(rv: u64, healthy: i32, desired: i32) -> Event {
        Event::new(
            rv,
            Observed::Pdb {
                key: format!("{NS}/web"),
                namespace: NS.into(),
                name: "web".into(),
                current: true,
                current_healthy: healthy,
                desired_healthy: desired,
                expected_pods: 3,
                disruptions_allowed: (healthy - desired).max(0),
            },
        )
    }

    fn config(rv: u64, parallel: i32, unavailable: Option<&str>) -> Event {
        Event::new(
            rv,
            Observed::Config(ConfigLimits {
                max_parallel_operations: IntOrString::Int(parallel),
                max_unavailable: unavailable.map(|u| match u.parse::<i32>() {
                    Ok(i) => IntOrString::Int(i),
                    Err(_) => IntOrString::String(u.into()),
                }),
            }),
        )
    }

    fn rules(check_limits: bool) -> Rules {
        Rules {
            namespace: NS.into(),
            nodes: ["a", "b", "c", "d"].iter().map(|n| n.to_string()).collect(),
            check_limits,
            ..Rules::default()
        }
    }

    fn four_nodes() -> Vec<Event> {
        ["a", "b", "c", "d"]
            .iter()
            .enumerate()
            .map(|(i, n)| node(i as u64 + 1, n, false))
            .collect()
    }

    fn kinds(events: &[Event], rules: &Rules) -> Vec<BreachKind> {
        judge(events, rules)
            .breaches
            .iter()
            .map(|b| b.kind)
            .collect()
    }

    #[test]
    fn pdb_below_desired_only_counts_during_maintenance_after_it_was_met() {
        let mut events = four_nodes();
        events.extend([
            // Pods starting: below desired before anything is in maintenance.
            pdb(10, 1, 2),
            pdb(11, 3, 2),
            request(12, "m1", "a", Phase::Pending, None),
            request(13, "m1", "a", Phase::Draining, Some(false)),
            pdb(14, 2, 2),
        ]);
        assert_eq!(kinds(&events, &rules(false)), vec![]);
        events.push(pdb(15, 1, 2));
        let judgement = judge(&events, &rules(false));
        assert_eq!(judgement.breaches.len(), 1, "{:?}", judgement.breaches);
        let breach = &judgement.breaches[0];
        assert_eq!(breach.kind, BreachKind::PdbBelowDesired);
        assert!(
            breach
                .to_string()
                .contains("currentHealthy 1 < desiredHealthy 2"),
            "{breach}"
        );
        assert_eq!(breach.resource_version, Some(15));
        // Excluded on purpose: not judged.
        let mut excluding = rules(false);
        excluding.excluded_pdbs.insert("web".into());
        assert_eq!(kinds(&events, &excluding), vec![]);
    }

    #[test]
    fn pdb_dip_after_the_maintenance_ended_is_the_tests_own() {
        let mut events = four_nodes();
        events.extend([
            pdb(10, 3, 2),
            request(12, "m1", "a", Phase::Pending, None),
            request(13, "m1", "a", Phase::Draining, Some(false)),
            gone(14, "m1"),
            pdb(15, 1, 2),
        ]);
        assert_eq!(kinds(&events, &rules(false)), vec![]);
    }

    #[test]
    fn max_parallel_operations_is_judged_at_admission_in_revision_order() {
        let mut events = four_nodes();
        events.extend([
            config(5, 2, None),
            request(10, "m1", "a", Phase::Pending, None),
            request(11, "m2", "b", Phase::Pending, None),
            request(12, "m3", "c", Phase::Pending, None),
            request(20, "m1", "a", Phase::Scheduled, None),
            request(21, "m2", "b", Phase::Scheduled, None),
            gone(22, "m1"),
        ]);
        // The third admission arrives first but happened after m1 was gone.
        let mut late = events.clone();
        late.insert(0, request(23, "m3", "c", Phase::Scheduled, None));
        assert_eq!(kinds(&late, &rules(true)), vec![]);
        events.push(request(19, "m3", "c", Phase::Scheduled, None));
        assert_eq!(
            kinds(&events, &rules(true)),
            vec![BreachKind::MaxParallelOperationsExceeded]
        );
        // Not judged on a shared control plane.
        assert_eq!(kinds(&events, &rules(false)), vec![]);
    }

    #[test]
    fn a_lowered_limit_counts_only_for_admissions_after_it() {
        let mut events = four_nodes();
        events.extend([
            config(5, 3, None),
            request(10, "m1", "a", Phase::Pending, None),
            request(11, "m2", "b", Phase::Pending, None),
            request(12, "m1", "a", Phase::Scheduled, None),
            // Lowered while m2 was Pending: the operator may have decided on the old limit.
            config(13, 1, None),
            request(14, "m2", "b", Phase::Scheduled, None),
        ]);
        assert_eq!(kinds(&events, &rules(true)), vec![]);
        events.extend([
            request(15, "m3", "c", Phase::Pending, None),
            request(16, "m3", "c", Phase::Scheduled, None),
        ]);
        assert_eq!(
            kinds(&events, &rules(true)),
            vec![BreachKind::MaxParallelOperationsExceeded]
        );
        // A monitor given its own, higher limits ignores the config.
        let mut own = rules(true);
        own.limits = Some(ConfigLimits::of(Some(&crate::limits(3, None))));
        assert_eq!(kinds(&events, &own), vec![]);
    }

    #[test]
    fn max_unavailable_counts_down_nodes_and_percentages_of_all_nodes() {
        let mut events = four_nodes();
        events.extend([
            // 50% of 4 nodes = 2.
            config(5, 4, Some("50%")),
            node(6, "d", true),
            request(10, "m1", "a", Phase::Pending, None),
            request(11, "m2", "b", Phase::Pending, None),
            request(12, "m1", "a", Phase::Scheduled, None),
        ]);
        assert_eq!(kinds(&events, &rules(true)), vec![]);
        events.push(request(13, "m2", "b", Phase::Scheduled, None));
        let judgement = judge(&events, &rules(true));
        assert_eq!(
            judgement
                .breaches
                .iter()
                .map(|b| b.kind)
                .collect::<Vec<_>>(),
            vec![BreachKind::MaxUnavailableExceeded]
        );
        assert!(
            judgement.breaches[0]
                .detail
                .contains("3 nodes unavailable, maxUnavailable 2 (configured 50%, 4"),
            "{}",
            judgement.breaches[0]
        );
        assert_eq!(judgement.peak_unavailable, 3);
    }

    #[test]
    fn max_unavailable_spares_requests_on_unavailable_nodes_and_nodes_down_since_pending() {
        let mut events = four_nodes();
        events.extend([
            config(5, 4, Some("1")),
            node(6, "d", true),
            // On a node that is down already: allowed over the limit.
            request(10, "m1", "d", Phase::Pending, None),
            request(11, "m1", "d", Phase::Scheduled, None),
            request(12, "m2", "a", Phase::Pending, None),
            gone(13, "m1"),
            node(14, "d", false),
            // c went down after m2's last Pending version: the operator may not have seen it.
            node(15, "c", true),
            request(16, "m2", "a", Phase::Scheduled, None),
        ]);
        assert_eq!(kinds(&events, &rules(true)), vec![]);
    }

    #[test]
    fn two_requests_in_progress_on_one_node_is_a_breach_once() {
        let mut events = four_nodes();
        events.extend([
            request(10, "m1", "a", Phase::Pending, None),
            request(11, "m2", "a", Phase::Pending, None),
            request(12, "m1", "a", Phase::Ready, None),
        ]);
        assert_eq!(kinds(&events, &rules(false)), vec![]);
        events.extend([
            request(13, "m2", "a", Phase::Scheduled, None),
            request(14, "m2", "a", Phase::Cordon, None),
        ]);
        assert_eq!(
            kinds(&events, &rules(false)),
            vec![BreachKind::TwoRequestsInProgressOnOneNode]
        );
    }

    #[test]
    fn a_deleted_request_whose_cleanup_is_done_holds_no_node_and_no_slot() {
        // m1 was deleted while Draining: uncordoned, our finalizer off at 14 (`cleaned`) or
        // still on (`not_yet`); the requestor's finalizer keeps it either way. Then m2 is
        // admitted on `m2_node`, with one slot and one node allowed down.
        let replay = |cleaned: bool, m2_node: &str| {
            let mut events = four_nodes();
            events.extend([
                config(5, 1, Some("1")),
                request(10, "m1", "a", Phase::Pending, None),
                request(11, "m1", "a", Phase::Draining, Some(false)),
                node(12, "a", true),
                node(13, "a", false),
                if cleaned {
                    released(14, "m1", "a", Phase::Draining)
                } else {
                    request(14, "m1", "a", Phase::Draining, Some(false))
                },
                request(15, "m2", m2_node, Phase::Pending, None),
                request(16, "m2", m2_node, Phase::Scheduled, Some(false)),
            ]);
            judge(&events, &rules(true))
        };
        for node in ["a", "b"] {
            let judgement = replay(true, node);
            assert_eq!(judgement.breaches, vec![], "m2 on {node}");
            assert_eq!(judgement.peak_in_maintenance, 1, "m2 on {node}");
        }
        let kinds_of = |judgement: Judgement| -> Vec<BreachKind> {
            judgement.breaches.iter().map(|b| b.kind).collect()
        };
        assert_eq!(
            kinds_of(replay(false, "a")),
            vec![BreachKind::TwoRequestsInProgressOnOneNode]
        );
        assert_eq!(
            kinds_of(replay(false, "b")),
            vec![
                BreachKind::MaxParallelOperationsExceeded,
                BreachKind::MaxUnavailableExceeded
            ]
        );
    }

    #[test]
    fn a_node_we_cordoned_must_be_uncordoned_before_its_request_is_gone() {
        let mut events = four_nodes();
        events.extend([
            request(10, "m1", "a", Phase::Pending, None),
            request(11, "m1", "a", Phase::Scheduled, Some(false)),
            node(12, "a", true),
            request(13, "m1", "a", Phase::Ready, Some(false)),
        ]);
        let mut uncordoned = events.clone();
        uncordoned.extend([node(14, "a", false), gone(15, "m1")]);
        assert_eq!(kinds(&uncordoned, &rules(false)), vec![]);
        events.push(gone(15, "m1"));
        let judgement = judge(&events, &rules(false));
        assert_eq!(
            judgement
                .breaches
                .iter()
                .map(|b| b.kind)
                .collect::<Vec<_>>(),
            vec![BreachKind::NodeLeftCordoned]
        );
        assert!(judgement.breaches[0].to_string().contains("t/m1"));
    }

    #[test]
    fn a_node_the_test_cordoned_is_not_ours_to_uncordon() {
        let mut events = four_nodes();
        events.extend([
            // Cordoned by the test before the request: the operator records "true".
            node(9, "b", true),
            request(10, "m1", "b", Phase::Pending, None),
            request(11, "m1", "b", Phase::Ready, Some(true)),
            gone(12, "m1"),
            // Cordoned by the test after the request was gone.
            request(13, "m2", "c", Phase::Pending, None),
            request(14, "m2", "c", Phase::Ready, Some(false)),
            node(15, "c", true),
            node(16, "c", false),
            gone(17, "m2"),
            node(18, "c", true),
        ]);
        assert_eq!(kinds(&events, &rules(false)), vec![]);
    }

    #[test]
    fn a_relisted_watch_marks_what_the_new_list_lacks_as_gone() {
        let mut memory = StreamMemory::default();
        let gone_request = |name: &str| Observed::RequestGone {
            key: format!("{NS}/{name}"),
        };
        memory.relist_started();
        memory.seen("t/m1".into(), gone_request("m1"));
        memory.seen("t/m2".into(), gone_request("m2"));
        memory.seen("t/m3".into(), gone_request("m3"));
        assert_eq!(memory.relist_done(), vec![]);
        memory.deleted("t/m3");
        // The watch restarts; m2 was deleted while it was down.
        memory.relist_started();
        memory.seen("t/m1".into(), gone_request("m1"));
        assert_eq!(memory.relist_done(), vec![gone_request("m2")]);
        // Replayed, the request no longer holds its node.
        let mut events = four_nodes();
        events.extend([
            request(10, "m2", "a", Phase::Pending, None),
            request(11, "m2", "a", Phase::Ready, None),
            Event::new(20, gone_request("m2")),
            request(21, "m4", "a", Phase::Pending, None),
            request(22, "m4", "a", Phase::Ready, None),
        ]);
        assert_eq!(kinds(&events, &rules(false)), vec![]);
        // Without it, the ghost and the new request would both hold the node.
        events.retain(|e| !matches!(e.observed, Observed::RequestGone { .. }));
        assert_eq!(
            kinds(&events, &rules(false)),
            vec![BreachKind::TwoRequestsInProgressOnOneNode]
        );
    }

    #[test]
    fn pod_deletions_by_the_operator_are_breaches_and_others_are_not() {
        use super::super::audit::PodDeletion;
        let start: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let later: Timestamp = "2026-01-01T00:00:05Z".parse().unwrap();
        let deletion = |user: &str, ns: &str, at: Timestamp| PodDeletion {
            received: at,
            namespace: ns.into(),
            pod: "web-1".into(),
            code: 200,
            user: user.into(),
        };
        let audit = AuditLog {
            pod_deletions: vec![
                deletion("system:serviceaccount:kube-system:kwok", NS, later),
                deletion("operator", "other", later),
                deletion("operator", NS, "2025-12-31T23:59:00Z".parse().unwrap()),
            ],
            ..AuditLog::default()
        };
        assert_eq!(audit_breaches(&audit, NS, "operator", start), vec![]);
        let mut audit = audit;
        audit.pod_deletions.push(deletion("operator", NS, later));
        let breaches = audit_breaches(&audit, NS, "operator", start);
        assert_eq!(breaches.len(), 1);
        assert_eq!(breaches[0].kind, BreachKind::PodDeletedInsteadOfEvicted);
        assert!(
            breaches[0].to_string().contains("pod t/web-1"),
            "{}",
            breaches[0]
        );
    }
}
