//! The node lifecycle as one pure step: from a request, what the node actor observed (the node,
//! the pods on it, the PDBs that block them), the time, and the actor's eviction ledger, to the
//! [`Step`] the actor executes: API actions in order, and when to run again.
//!
//! Every rule about phases, deletion, timeouts and failures lives here, so each edge is a table
//! test, not an e2e run. The actor (`actors/src/node_actor.rs`) only gathers observations and
//! executes steps. State that must survive a restart is on the object (the `Ready` condition's
//! reason is the phase, its `lastTransitionTime` the phase start, the initial-state annotation,
//! the finalizer); the ledger only remembers what costs at most one extra call to lose.
//!
//! Behaviour shared with NVIDIA's controller is cited from
//! `internal/controller/nodemaintenance_controller.go` in github.com/Mellanox/maintenance-operator.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use maintenance_crds::{
    ADMITTED_TIME_ANNOTATION, ADMITTED_UID_ANNOTATION, BlockedPod, CORDON_REQUESTED_ANNOTATION,
    DrainSpec, DrainStatus, FINALIZER, ForceDeletedPod, INITIAL_UNSCHEDULABLE_ANNOTATION,
    NodeMaintenance, NodeMaintenanceStatus, Phase, READY_TIME_ANNOTATION, condition_type,
};

use crate::conditions;
use crate::drain_plan::{
    self, CompletionRules, DrainPod, DrainRules, OperatorIdentity, PodRef, SkipReason,
};
use crate::eviction::{DeleteOutcome, EvictionOutcome};
use crate::pod_view::CachedPod;

/// Drain progress is written at most this often, so a thousand evictions are not a thousand
/// writes: at 1 s a drain wrote about one status per evicted pod. NVIDIA's controller writes it
/// every 10 s (`drainReqeueTime`, internal/controller/nodemaintenance_controller.go). The first
/// drain status waits for the interval after the write that entered Draining, so a drain done
/// within it costs no progress write at all; a timeout, a bypassed budget and the phase change are
/// written at once all the same.
pub const STATUS_WRITE_INTERVAL: Duration = Duration::from_secs(5);
/// Retry cadence for a blocked eviction once the drain has timed out: slow, but it recovers.
pub const SLOW_RETRY: Duration = Duration::from_secs(30);
/// How soon an eviction the per-budget gate held back looks again (jittered).
pub const HELD_RECHECK: Duration = Duration::from_secs(2);
/// While draining, the step runs at least this often (progress metrics, timeout).
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// While waiting for pods to complete, the step looks again at least this often, whether or not
/// the pod watch said anything: a watch that re-lists after an outage does not report the pods
/// that ended meanwhile, and a wait without a timeout would otherwise never end.
pub const WAIT_RECHECK: Duration = Duration::from_secs(30);
/// Bounds of the per-pod eviction backoff.
pub const EVICTION_MIN_BACKOFF: Duration = Duration::from_millis(500);
pub const EVICTION_MAX_BACKOFF: Duration = Duration::from_secs(15);
/// How long a request stays Ready before NVIDIA's `ready-time` annotation is written (with the
/// time Ready began). The annotation only feeds garbage collection, an hour later by default, and
/// ours counts from the Ready condition without it; a requestor that was waiting for Ready
/// usually releases the request within this delay, which then costs no write at all, and the
/// status that shows Ready is not held back by a write before it.
pub const READY_TIME_DELAY: Duration = Duration::from_secs(5);
/// Deadlines are woken a little late, so the step that runs sees them passed.
const TIMER_SLACK: Duration = Duration::from_millis(100);

/// The Node as the actor saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeView {
    /// The Node object does not exist (confirmed by the API server, not only the cache).
    Missing,
    Present {
        unschedulable: bool,
    },
}

impl NodeView {
    pub fn of(node: Option<&Node>) -> NodeView {
        match node {
            None => NodeView::Missing,
            Some(node) => NodeView::Present {
                unschedulable: node
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
            },
        }
    }
}

/// What the node actor observed, for one step.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    pub node: NodeView,
    /// The pods bound to the node; `None` until the pod watch has listed them once.
    /// Shared with the node's pod cache, as cached (only what the drain reads): a step copies
    /// no pod.
    pub pods: Option<&'a [Arc<CachedPod>]>,
    /// The last known state of PDBs named in the ledger, `namespace/name` -> a summary such as
    /// `currentHealthy 9, desiredHealthy 9, disruptionsAllowed 0, expectedPods 10`.
    pub pdb_summaries: &'a BTreeMap<String, String>,
    /// The operator's own pods, never evicted.
    pub operator: &'a OperatorIdentity,
}

/// What the actor does, in order. A failed action ends the step; the next step recomputes from
/// the object, so every action is idempotent.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Record whether the node was unschedulable before we touched it (the annotation that
    /// decides whether cleanup uncordons).
    RecordInitialState {
        unschedulable: bool,
    },
    /// Put our finalizer on the request, so that its deletion waits for the cleanup.
    AddFinalizer,
    /// Mark a request that another operator (NVIDIA's) left mid-flight as ours from `at` (the
    /// `admitted-time` annotation): the timers of its current phase count from there.
    Adopt {
        at: Timestamp,
    },
    /// Record when the request became Ready (NVIDIA's `ready-time` annotation), from which
    /// garbage collection counts.
    RecordReadyTime {
        at: Timestamp,
    },
    Cordon,
    Uncordon,
    /// Start these eviction calls (each answer comes back through [`Ledger::record`]).
    Evict(Vec<EvictionOrder>),
    /// Delete these pods, bypassing the PodDisruptionBudget that kept refusing their eviction
    /// past `drainSpec.forceDeleteAfterSeconds` (each answer comes back through
    /// [`Ledger::record_force_delete`]).
    ForceDelete(Vec<ForceDeleteOrder>),
    WriteStatus(StatusWrite),
    Event(Event),
    /// Let the request go: the last thing a finished maintenance does.
    RemoveFinalizer {
        phase: Phase,
        in_phase_for: Option<Duration>,
    },
    /// The drain finished after this long (a histogram observation).
    DrainFinished {
        after: Duration,
    },
}

/// One eviction call to start.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionOrder {
    pub key: String,
    /// The pod as the actor's cache holds it, shared, not copied: an order waits for the rate
    /// limit (10,000 pods at 50 a second wait minutes), and a copy of each pod's labels per
    /// order was a tenth of the operator's memory with 500 nodes in maintenance.
    pub pod: Arc<CachedPod>,
    pub is_retry: bool,
}

impl EvictionOrder {
    pub fn namespace(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or_default()
    }

    /// The UID the eviction is conditioned on (a new pod under the old name is not evicted).
    pub fn uid(&self) -> Option<&str> {
        self.pod.metadata.uid.as_deref().filter(|u| !u.is_empty())
    }

    /// Which PodDisruptionBudget selects the pod ([`crate::eviction::TokenBook`]).
    pub fn labels(&self) -> &BTreeMap<String, String> {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        self.pod.metadata.labels.as_ref().unwrap_or(&NONE)
    }
}

/// One pod to delete past the escalation deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForceDeleteOrder {
    pub key: String,
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    /// The PodDisruptionBudget (in the pod's namespace) whose refusal the deletion bypasses.
    pub pdb: String,
    /// The note of the Warning Events (on the request and on the pod) once the API server has
    /// accepted the deletion: it names the pod, the budget, the request and the deadline.
    pub note: String,
}

/// The whole new status, and the phase change it makes if any.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusWrite {
    pub status: NodeMaintenanceStatus,
    pub transition: Option<Transition>,
}

/// A phase change, for metrics, logs and the phase Event.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// `None` for a request seen for the first time.
    pub from: Option<Phase>,
    pub to: Phase,
    pub message: String,
    /// How long the request was in `from`.
    pub in_phase_for: Option<Duration>,
}

/// Reasons of the Events the lifecycle emits besides phase changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventReason {
    Uncordon,
    InvalidSpec,
    DrainTimeout,
    WaitForPodCompletionTimeout,
    NodeGone,
    /// A request another operator left in progress was taken over.
    Adopted,
    /// The supervisor deleted a forgotten request (see [`crate::collection`]).
    GarbageCollected,
    /// A pod was deleted past `drainSpec.forceDeleteAfterSeconds`, bypassing its
    /// PodDisruptionBudget (a Warning on the request and on the pod).
    ForceDeleted,
    /// A call of a step failed and is retried (see [`crate::failed_step`]).
    StepFailed,
}

impl EventReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::Uncordon => "Uncordon",
            EventReason::InvalidSpec => "InvalidSpec",
            EventReason::DrainTimeout => "DrainTimeout",
            EventReason::WaitForPodCompletionTimeout => "WaitForPodCompletionTimeout",
            EventReason::NodeGone => "NodeGone",
            EventReason::Adopted => "Adopted",
            EventReason::GarbageCollected => "GarbageCollected",
            EventReason::ForceDeleted => "ForceDeleted",
            EventReason::StepFailed => "StepFailed",
        }
    }
}

impl fmt::Display for EventReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reasons of the `Failed` condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedReason {
    /// A selector or regex of the spec cannot be used; removed when the spec is fixed.
    InvalidSpec,
    /// The drain did not finish within `timeoutSeconds`; removed when it finishes.
    DrainTimeout,
}

impl FailedReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FailedReason::InvalidSpec => "InvalidSpec",
            FailedReason::DrainTimeout => "DrainTimeout",
        }
    }

    fn event(self) -> EventReason {
        match self {
            FailedReason::InvalidSpec => EventReason::InvalidSpec,
            FailedReason::DrainTimeout => EventReason::DrainTimeout,
        }
    }
}

/// The `reason` of an entry of `status.drain.blocked` that the drain itself reports (pods held
/// back by the spec carry [`drain_plan::BlockReason`]'s reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    Pdb,
    MultiplePdbs,
    Error,
    Terminating,
}

impl WaitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Pdb => "PDB",
            WaitReason::MultiplePdbs => "MultiplePDBs",
            WaitReason::Error => "Error",
            WaitReason::Terminating => "Terminating",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub warning: bool,
    pub reason: EventReason,
    pub note: String,
}

/// What the actor does now and when it runs the step again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    pub actions: Vec<Action>,
    /// Run again at this time at the latest (events may run it sooner).
    pub wake_at: Option<Timestamp>,
    /// Keep a watch on the node's pods (dropped when false).
    pub watch_pods: bool,
    /// While draining: when the drain last made progress (the `seconds_since_progress` gauge,
    /// whose label set goes when this is `None`).
    pub last_progress: Option<Timestamp>,
    /// Nothing is left to do for this request: the actor stops after the actions.
    pub finished: bool,
}

impl Step {
    fn wake(&mut self, at: Timestamp) {
        self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
    }

    /// The phase this step moves the request to, if it does.
    pub fn transition(&self) -> Option<&Transition> {
        self.actions.iter().find_map(|a| match a {
            Action::WriteStatus(StatusWrite {
                transition: Some(t),
                ..
            }) => Some(t),
            _ => None,
        })
    }
}

/// Eviction bookkeeping for one pod (in memory only: losing it costs at most one extra call).
#[derive(Debug, Clone, PartialEq)]
pub struct PodEviction {
    pub uid: Option<String>,
    pub attempts: u32,
    pub in_flight: bool,
    /// The API server accepted the eviction: now we wait for the pod to be gone.
    pub accepted: bool,
    pub next_attempt: Timestamp,
    /// Retry at the slow cadence (the attempt was made after the drain timed out).
    pub slow: bool,
    pub last: Option<EvictionOutcome>,
    /// For a MultiplePdbs refusal: the PDBs that select the pod (looked up once by the actor).
    pub covering_pdbs: Vec<String>,
    /// Set once the escalation deadline turned this pod's evictions into a deletion: from then
    /// on it is deleted (retried after an error), never evicted again.
    pub force: Option<ForceDelete>,
}

impl PodEviction {
    /// A deletion past the deadline was sent (or is about to be) and its answer has not come.
    pub fn awaits_deletion_answer(&self) -> bool {
        self.in_flight && self.force.is_some()
    }
}

/// A pod being deleted past the escalation deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForceDelete {
    /// The PodDisruptionBudget whose refusal the deletion bypasses.
    pub pdb: String,
    /// Why the last deletion failed (retried with backoff), for `status.drain.blocked`.
    pub error: Option<String>,
}

/// What the actor remembers between steps: evictions per pod (`namespace/name`), and what it
/// needs to throttle status writes and measure progress.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    pub evictions: BTreeMap<String, PodEviction>,
    pub last_status_write: Option<Timestamp>,
    /// Largest (totalPods, evictionPods) seen in this drain: the counts only grow.
    pub drain_counts: (usize, usize),
    pub last_progress: Option<Timestamp>,
    last_remaining: Option<usize>,
    /// Deletions past the escalation deadline that the API server accepted in this drain, until
    /// they are in `status.drain.forceDeleted` (which a restarted actor reads back).
    pub force_deleted: Vec<ForceDeletedPod>,
}

impl Ledger {
    /// Forgets the drain (a phase without one, or the request ends).
    pub fn clear(&mut self) {
        *self = Ledger {
            last_status_write: self.last_status_write,
            ..Ledger::default()
        };
    }

    /// The answer to one eviction call. `jitter` in [0, 1) spreads retries of many pods.
    pub fn record(
        &mut self,
        key: &str,
        uid: Option<&str>,
        outcome: EvictionOutcome,
        now: Timestamp,
        jitter: f64,
    ) {
        let Some(entry) = self.evictions.get_mut(key) else {
            return;
        };
        if entry.uid.as_deref() != uid {
            return;
        }
        entry.in_flight = false;
        match &outcome {
            EvictionOutcome::Evicted | EvictionOutcome::Gone => {
                entry.accepted = true;
                self.last_progress = Some(now);
            }
            // Held by the per-budget gate: no call was made, so it is no attempt, and it looks
            // again soon (a look costs no call) in case the budget's change that wakes it was
            // seen before the gate's own cache caught up.
            EvictionOutcome::Refused { held: true, .. } => {
                entry.attempts = entry.attempts.saturating_sub(1);
                entry.next_attempt = after(now, HELD_RECHECK.mul_f64(0.5 + jitter.clamp(0.0, 1.0)));
            }
            EvictionOutcome::Refused { .. }
            | EvictionOutcome::MultiplePdbs { .. }
            | EvictionOutcome::Error { .. } => {
                let delay = if entry.slow {
                    SLOW_RETRY
                } else {
                    retry_delay(entry.attempts, jitter)
                };
                entry.next_attempt = after(now, delay);
            }
        }
        entry.last = Some(outcome);
    }

    /// The answer to one deletion past the escalation deadline. `jitter` as in [`Ledger::record`].
    pub fn record_force_delete(
        &mut self,
        key: &str,
        uid: Option<&str>,
        outcome: DeleteOutcome,
        now: Timestamp,
        jitter: f64,
    ) {
        let Some(entry) = self.evictions.get_mut(key) else {
            return;
        };
        if entry.uid.as_deref() != uid {
            return;
        }
        let Some(force) = entry.force.as_mut() else {
            return;
        };
        entry.in_flight = false;
        match outcome {
            DeleteOutcome::Deleted => {
                self.force_deleted.push(ForceDeletedPod {
                    pod: key.to_string(),
                    pdb: force.pdb.clone(),
                    // As the API server stores it, so the record on the object is the same one.
                    deleted_at: Time(whole_seconds(now)),
                });
                force.error = None;
                entry.accepted = true;
                // No longer waiting on the budget: not counted as blocked, not watched.
                entry.last = None;
                self.last_progress = Some(now);
            }
            DeleteOutcome::Gone => {
                force.error = None;
                entry.accepted = true;
                entry.last = None;
                self.last_progress = Some(now);
            }
            DeleteOutcome::Error { code, message } => {
                force.error = Some(match code {
                    Some(code) => format!("HTTP {code}: {message}"),
                    None => message,
                });
                entry.next_attempt = after(now, retry_delay(entry.attempts, jitter));
            }
        }
    }

    /// Squares the ledger with the calls (evictions, deletions) the actor has running, after a
    /// step's actions ran or one of them failed. An entry marked in flight whose call is not
    /// running never started (an action before it in the step failed): it is due again now, or
    /// it would wait for an answer that never comes and its pod would never be evicted. Returns
    /// the running calls the ledger no longer waits for (the drain stopped: the request was
    /// deleted, its requestor failed, the phase moved on, or the pod went away), which the actor
    /// cancels: one not sent yet never is, so nothing more is evicted for a drain that stopped.
    pub fn settle_calls(&mut self, running: &BTreeSet<String>, now: Timestamp) -> Vec<String> {
        for (key, entry) in self.evictions.iter_mut() {
            if entry.in_flight && !running.contains(key) {
                entry.in_flight = false;
                entry.attempts = entry.attempts.saturating_sub(1);
                entry.next_attempt = now;
            }
        }
        running
            .iter()
            .filter(|key| self.evictions.get(*key).is_none_or(|e| !e.in_flight))
            .cloned()
            .collect()
    }

    /// A PDB changed (or is gone): the pods it blocked may retry at once. All of them are woken;
    /// the evictor's per-budget gate ([`crate::eviction::TokenBook`]) lets as many calls through as
    /// the budget allows and holds the rest back without a call.
    pub fn wake_blocked_by(&mut self, namespace: &str, pdb: &str, now: Timestamp) {
        let prefix = format!("{namespace}/");
        for (key, entry) in self.evictions.iter_mut() {
            let waits_on_pdb = match &entry.last {
                Some(EvictionOutcome::Refused { pdb: Some(p), .. }) => p == pdb,
                Some(EvictionOutcome::MultiplePdbs { .. }) => {
                    entry.covering_pdbs.iter().any(|p| p == pdb)
                }
                _ => false,
            };
            if key.starts_with(&prefix)
                && waits_on_pdb
                && !entry.in_flight
                && entry.next_attempt > now
            {
                entry.next_attempt = now;
            }
        }
    }

    /// Pods (`namespace/name`) refused because several PDBs select them, whose PDBs the actor
    /// has not looked up (from the pod's labels in its cache). The API server's 500 does not name
    /// them.
    pub fn needs_covering_pdbs(&self) -> Vec<String> {
        self.evictions
            .iter()
            .filter(|(_, e)| {
                matches!(e.last, Some(EvictionOutcome::MultiplePdbs { .. }))
                    && e.covering_pdbs.is_empty()
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    pub fn set_covering_pdbs(&mut self, key: &str, pdbs: Vec<String>) {
        if let Some(entry) = self.evictions.get_mut(key) {
            entry.covering_pdbs = pdbs;
        }
    }

    /// The PDBs our pods wait on now, as (namespace, name): the actor watches exactly these.
    pub fn pdbs_waited_on(&self) -> BTreeSet<(String, String)> {
        self.blocked_by_pdb().into_keys().collect()
    }

    /// How many of our pods each PDB blocks now (the `pods_blocked_by_pdb` gauge).
    pub fn blocked_by_pdb(&self) -> BTreeMap<(String, String), usize> {
        let mut out: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (key, entry) in &self.evictions {
            let namespace = namespace_of(key).to_string();
            match &entry.last {
                Some(EvictionOutcome::Refused { pdb: Some(pdb), .. }) => {
                    *out.entry((namespace, pdb.clone())).or_default() += 1;
                }
                Some(EvictionOutcome::MultiplePdbs { .. }) => {
                    for pdb in &entry.covering_pdbs {
                        *out.entry((namespace.clone(), pdb.clone())).or_default() += 1;
                    }
                }
                _ => {}
            }
        }
        out
    }
}

/// Exponential backoff (×2 from [`EVICTION_MIN_BACKOFF`] up to [`EVICTION_MAX_BACKOFF`], backon's
/// schedule without its random jitter, which a pure step cannot draw) scaled by 0.5–1.5 from the
/// caller's `jitter`, so that pods refused together do not retry together.
pub fn retry_delay(attempts: u32, jitter: f64) -> Duration {
    use backon::BackoffBuilder;
    let base = backon::ExponentialBuilder::default()
        .with_min_delay(EVICTION_MIN_BACKOFF)
        .with_max_delay(EVICTION_MAX_BACKOFF)
        .with_factor(2.0)
        .without_max_times()
        .build()
        .nth(usize::try_from(attempts.saturating_sub(1).min(32)).unwrap_or(0))
        .unwrap_or(EVICTION_MAX_BACKOFF);
    base.mul_f64(0.5 + jitter.clamp(0.0, 1.0))
}

/// How long a node actor waits before it runs a step again after `consecutive` failed steps in
/// a row (1 for the first). A conflict means someone else wrote the object (a not-found, that
/// the request or its node is gone): the actor reads it again and goes on at once, but only
/// twice in a row; a writer that keeps changing it (another
/// controller left running during a migration) gets the same backoff as any other error, 0.25 s
/// doubling to 30 s, instead of a tight loop of reads and writes.
pub fn retry_after_failed_step(conflict: bool, consecutive: u32) -> Duration {
    const AT_ONCE_CONFLICTS: u32 = 2;
    if conflict && consecutive <= AT_ONCE_CONFLICTS {
        return Duration::ZERO;
    }
    let doublings = if conflict {
        consecutive - AT_ONCE_CONFLICTS
    } else {
        consecutive
    };
    Duration::from_millis((250u64 << doublings.min(7)).min(30_000))
}

/// True when the actor must read the Node from the API server rather than the shared cache:
/// the initial state is recorded once and decides the uncordon, so a cache that lags behind a
/// previous request's uncordon must not decide it.
pub fn needs_fresh_node(request: &NodeMaintenance) -> bool {
    !request.is_deleting() && request.phase() != Phase::Pending && initial_state(request).is_none()
}

/// The node's state for the admission's initial-state record, from the shared cache when that is
/// safe; `None` when it must be read from the API server.
///
/// A cache that shows the node schedulable is used as it is. One that shows it cordoned, or not
/// at all, may lag behind the uncordon of a request on this node released a moment ago: recorded
/// as the initial state, that cordon would never be undone, so it is read again. A cache that
/// lags the other way (it misses a cordon someone made a moment ago) has that cordon undone at
/// the end, the same outcome as a cordon landing just after a fresh read, which no read prevents.
pub fn admission_node_view(cached: Option<&Node>) -> Option<NodeView> {
    match NodeView::of(cached) {
        schedulable @ NodeView::Present {
            unschedulable: false,
        } if cached.is_some() => Some(schedulable),
        _ => None,
    }
}

/// Whether the supervisor runs an actor for this request: while it is in progress on an existing
/// node, or while our finalizer waits for cleanup. A request whose node is gone and whose
/// finalizer is off needs nothing (and must not be restarted forever).
pub fn needs_actor(request: &NodeMaintenance, node_exists: bool, admitted: bool) -> bool {
    let in_progress = request.phase() != Phase::Pending || admitted;
    has_finalizer(request) || (in_progress && !request.is_deleting() && node_exists)
}

/// Compares resourceVersions numerically when they are numbers (etcd's are), else accepts: the
/// supervisor's cache may lag behind the actor's own writes, and the actor only moves forward.
pub fn is_newer_version(candidate: &NodeMaintenance, current: &NodeMaintenance) -> bool {
    let parse = |o: &NodeMaintenance| {
        o.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    match (parse(candidate), parse(current)) {
        (Some(a), Some(b)) => a >= b,
        _ => true,
    }
}

/// True when `request` (as a cache shows it) is at resourceVersion `version` or later: a write we
/// made has reached the cache. Versions compare as numbers, as etcd's are; anything else counts as
/// reached, so that nothing waits forever on a version it cannot compare.
pub fn shows_version(request: &NodeMaintenance, version: &str) -> bool {
    version_reached(request.metadata.resource_version.as_deref(), version)
}

/// True when an object a cache shows at resourceVersion `shown` is at `version` or later (see
/// [`shows_version`]).
pub fn version_reached(shown: Option<&str>, version: &str) -> bool {
    let shown = shown.and_then(|v| v.parse::<u64>().ok());
    match (shown, version.parse::<u64>()) {
        (Some(shown), Ok(written)) => shown >= written,
        _ => true,
    }
}

/// The node's recorded initial state: `Some(true)` if it was unschedulable before us.
pub fn initial_state(request: &NodeMaintenance) -> Option<bool> {
    request
        .metadata
        .annotations
        .as_ref()?
        .get(INITIAL_UNSCHEDULABLE_ANNOTATION)
        .map(|v| v == "true")
}

/// Whether our finalizer is on the request (the scheduler's `released` reads it too).
pub fn has_finalizer(request: &NodeMaintenance) -> bool {
    request
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

/// We cordon only a node that was schedulable before, and only when asked to.
fn we_cordon(request: &NodeMaintenance) -> bool {
    request.spec.cordon() && initial_state(request) == Some(false)
}

/// The uncordon is owed when we may have cordoned: the node was schedulable before, and the
/// cordon was asked for now or at admission ([`CORDON_REQUESTED_ANNOTATION`]), so that
/// `spec.cordon` turned off mid-maintenance does not leave the node cordoned. (Turned on after
/// the cordon step, it owes an uncordon too: a no-op on a node we never cordoned.)
fn owes_uncordon(request: &NodeMaintenance) -> bool {
    let requested_at_admission = request
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDON_REQUESTED_ANNOTATION))
        .is_some_and(|v| v == "true");
    (request.spec.cordon() || requested_at_admission) && initial_state(request) == Some(false)
}

fn namespace_of(key: &str) -> &str {
    key.split('/').next().unwrap_or_default()
}

fn after(now: Timestamp, delay: Duration) -> Timestamp {
    SignedDuration::try_from(delay)
        .ok()
        .and_then(|d| now.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// `at` without its fraction of a second: a `metav1.Time` on the wire has none.
fn whole_seconds(at: Timestamp) -> Timestamp {
    Timestamp::from_second(at.as_second()).unwrap_or(at)
}

fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or_default()
}

fn in_phase_for(request: &NodeMaintenance, now: Timestamp) -> Option<Duration> {
    conditions::phase_since(request).map(|since| elapsed(since, now))
}

/// The status after moving to `to`: the `Ready` condition's reason is the phase, and a `Failed`
/// condition goes with the phase whose step failed.
pub fn enter_phase(
    request: &NodeMaintenance,
    to: Phase,
    message: &str,
    now: Timestamp,
    edit: impl FnOnce(&mut NodeMaintenanceStatus),
) -> StatusWrite {
    // An admitted request is Scheduled even when its status does not show it yet.
    let from = (request.condition(condition_type::READY).is_some() || request.admitted_by_us())
        .then(|| request.phase());
    let mut status = request.status.clone().unwrap_or_default();
    conditions::set_phase(
        &mut status.conditions,
        to,
        message,
        now,
        request.metadata.generation,
    );
    if from != Some(to) {
        conditions::remove_condition(&mut status.conditions, condition_type::FAILED);
    }
    edit(&mut status);
    let transition = (from != Some(to)).then(|| Transition {
        from,
        to,
        message: message.to_string(),
        in_phase_for: from.and_then(|_| in_phase_for(request, now)),
    });
    StatusWrite { status, transition }
}

fn enter(
    request: &NodeMaintenance,
    to: Phase,
    message: &str,
    now: Timestamp,
    edit: impl FnOnce(&mut NodeMaintenanceStatus),
) -> Action {
    Action::WriteStatus(enter_phase(request, to, message, now, edit))
}

/// The next step of one request. `ledger` is the actor's memory: the step updates it (evictions
/// started, drain counts), and the actor feeds eviction answers back through [`Ledger::record`].
pub fn step(
    request: &NodeMaintenance,
    observed: &Observed<'_>,
    now: Timestamp,
    ledger: &mut Ledger,
) -> Step {
    // A gone node first: nothing is left to uncordon, and nothing may hold the release, not even
    // additionalRequestors (NVIDIA's `Reconcile` looks the node up before anything else).
    if observed.node == NodeView::Missing {
        ledger.clear();
        return on_node_gone(request, now);
    }
    if request.is_deleting() {
        ledger.clear();
        return on_deletion(request, observed, now);
    }
    let phase = request.phase();
    // A request past Pending that we never admitted was left mid-flight by another operator:
    // adopt it before any timer is read (the next step sees the annotation).
    let mut step = if phase != Phase::Pending && conditions::admitted_time(request).is_none() {
        Step {
            actions: vec![Action::Adopt { at: now }],
            watch_pods: matches!(phase, Phase::WaitForPodCompletion | Phase::Draining),
            ..Step::default()
        }
    } else {
        step_in_phase(request, observed, now, ledger)
    };
    // Work past Pending needs our finalizer, or a deletion would skip the uncordon. The
    // supervisor adds it at admission; an object whose phase another tool wrote gets it here.
    if phase != Phase::Pending && !has_finalizer(request) {
        step.actions.insert(0, Action::AddFinalizer);
    }
    step
}

fn step_in_phase(
    request: &NodeMaintenance,
    observed: &Observed<'_>,
    now: Timestamp,
    ledger: &mut Ledger,
) -> Step {
    let phase = request.phase();
    let requestor_failed = conditions::requestor_failed(request);
    // Unlike NVIDIA's controller, which looks at RequestorFailed only once Ready, a requestor may
    // give up in any phase: the drain stops and nothing more is evicted for it.
    if requestor_failed && !matches!(phase, Phase::Pending | Phase::RequestorFailed) {
        ledger.clear();
        let mut step = Step::default();
        // The initial state is recorded first, so a later cleanup or resume knows what to undo.
        if let (None, NodeView::Present { unschedulable }) = (initial_state(request), observed.node)
        {
            step.actions
                .push(Action::RecordInitialState { unschedulable });
        }
        step.actions.push(enter(
            request,
            Phase::RequestorFailed,
            "the requestor reported a failure",
            now,
            |_| {},
        ));
        return step;
    }
    match phase {
        // The supervisor alone admits.
        Phase::Pending => Step::default(),
        // Scheduled: cordon and move on in one write. NVIDIA's controller shows Cordon as a phase
        // of its own (`handleScheduledState`, then `handleCordonState`, in
        // internal/controller/nodemaintenance_controller.go); ours skips that status write and
        // its Event, as it skips WaitForPodCompletion and Draining when the spec asks for
        // neither. The admission recorded the node's initial state; an object that reached
        // Scheduled without it (another operator's) records it here first.
        Phase::Scheduled | Phase::Cordon => on_cordon(request, observed, now),
        Phase::WaitForPodCompletion => on_wait_for_completion(request, observed, now, ledger),
        Phase::Draining => match &request.spec.drain_spec {
            Some(spec) => on_draining(request, spec, observed, now, ledger),
            // drainSpec removed mid-drain: nothing more to drain (NVIDIA clears the drain status
            // and moves to Ready the same way).
            None => {
                ledger.clear();
                Step {
                    actions: vec![enter(
                        request,
                        Phase::Ready,
                        "drainSpec was removed",
                        now,
                        |s| s.drain = None,
                    )],
                    ..Step::default()
                }
            }
        },
        Phase::Ready => {
            ledger.clear();
            record_ready_time(request, now)
        }
        Phase::RequestorFailed if requestor_failed => {
            ledger.clear();
            Step::default()
        }
        // The requestor cleared its failure: run the preparation again (idempotent); with the
        // initial state known, from the cordon.
        Phase::RequestorFailed => {
            let resume_at = if initial_state(request).is_some() {
                Phase::Cordon
            } else {
                Phase::Scheduled
            };
            Step {
                actions: vec![enter(
                    request,
                    resume_at,
                    "the requestor cleared its failure",
                    now,
                    |_| {},
                )],
                ..Step::default()
            }
        }
    }
}

/// Deletion: in `Ready` and `RequestorFailed` it waits for `additionalRequestors` to be empty; in
/// every earlier phase it stops the work and cleans up at once (NVIDIA: `handleTerminalState`
/// waits, `handleCordonState`/`handleWaitPodCompletionState`/`handleDrainStateDelete` do not).
/// The request vanished while its actor still held the node: the API server deleted it under our
/// finalizer (a deletion that raced the admission's finalizer write: the DELETE found no finalizer
/// and went through after the admission had added ours), or someone removed our finalizer by
/// hand. Nothing else will undo what the request did to the node, so the actor undoes it now, as
/// the deletion would have, from the last version it saw: the uncordon, if we owe it (from
/// Scheduled on: the cordon may have happened). There is no object left to write.
pub fn on_request_gone(last: &NodeMaintenance, node: NodeView) -> Step {
    let mut step = Step {
        finished: true,
        ..Step::default()
    };
    if owes_uncordon_once_gone(last) && matches!(node, NodeView::Present { .. }) {
        step.actions.push(Action::Uncordon);
        step.actions.push(Action::Event(Event {
            warning: true,
            reason: EventReason::Uncordon,
            note: format!(
                "uncordoned {}: the request went without our cleanup (deleted under our \
                 finalizer, or the finalizer was removed by hand)",
                last.spec.node_name
            ),
        }));
    }
    step
}

/// Whether an actor whose request went without our cleanup, last seen as `last`, owes the node an
/// uncordon ([`on_request_gone`]): until it is done, the node stays held, and no other request is
/// admitted there (its admission would record our cordon as the node's initial state, and our
/// uncordon would then land under it).
pub fn owes_uncordon_once_gone(last: &NodeMaintenance) -> bool {
    last.phase() != Phase::Pending && owes_uncordon(last)
}

/// Whether a running actor still holds its node although the request, as the cache shows it
/// (`cached`, `None`: gone), needs no actor any more ([`needs_actor`]): the request went without
/// our cleanup, and the actor has an uncordon to do ([`owes_uncordon_once_gone`]).
pub fn actor_holds_node_of_gone_request(
    last: &NodeMaintenance,
    cached: Option<&NodeMaintenance>,
    node_exists: bool,
    admitted: bool,
) -> bool {
    let gone = cached.is_none_or(|r| {
        r.metadata.uid != last.metadata.uid || !needs_actor(r, node_exists, admitted)
    });
    gone && node_exists && owes_uncordon_once_gone(last)
}

fn on_deletion(request: &NodeMaintenance, observed: &Observed<'_>, now: Timestamp) -> Step {
    if !has_finalizer(request) {
        return Step {
            finished: true,
            ..Step::default()
        };
    }
    let phase = request.phase();
    let others = request.spec.additional_requestors();
    if matches!(phase, Phase::Ready | Phase::RequestorFailed) && !others.is_empty() {
        let message = format!(
            "deletion waits for additionalRequestors to be removed: {}",
            others.join(", ")
        );
        let mut step = Step::default();
        if request
            .condition(condition_type::READY)
            .is_none_or(|c| c.message != message)
        {
            step.actions
                .push(enter(request, phase, &message, now, |_| {}));
        }
        return step;
    }
    let mut actions = Vec::new();
    // Only a node we cordoned is uncordoned, and only once the cordon may have happened: from
    // Scheduled on, since the Scheduled step cordons before it writes the next phase (a deletion
    // between the two must not leave the node cordoned). An uncordon we turn out not to owe sets
    // `unschedulable: false` on a node that already has it.
    let cordon_done = phase != Phase::Pending;
    let uncordon =
        cordon_done && owes_uncordon(request) && matches!(observed.node, NodeView::Present { .. });
    if uncordon {
        actions.push(Action::Uncordon);
    }
    actions.push(Action::RemoveFinalizer {
        phase,
        in_phase_for: in_phase_for(request, now),
    });
    // Events follow the writes they report: a write that conflicts runs the step again, and an
    // Event sent before it would be sent twice.
    if uncordon {
        actions.push(Action::Event(Event {
            warning: false,
            reason: EventReason::Uncordon,
            note: format!("uncordoned {}", request.spec.node_name),
        }));
    }
    Step {
        actions,
        finished: true,
        ..Step::default()
    }
}

/// The node is gone: nothing to cordon, drain or uncordon. The request is released at once
/// (NVIDIA's `Reconcile` removes the finalizer when the node is not found), and the scheduler
/// no longer counts it; the node's owner reference lets the garbage collector delete it.
fn on_node_gone(request: &NodeMaintenance, now: Timestamp) -> Step {
    let mut step = Step {
        finished: true,
        ..Step::default()
    };
    if !has_finalizer(request) {
        return step;
    }
    let phase = request.phase();
    let message = format!(
        "node {} no longer exists; the request is released",
        request.spec.node_name
    );
    step.actions.push(enter(request, phase, &message, now, |s| {
        s.wait_for_completion.clear();
    }));
    step.actions.push(Action::RemoveFinalizer {
        phase,
        in_phase_for: in_phase_for(request, now),
    });
    // Last, after the writes it reports (see `on_deletion`).
    step.actions.push(Action::Event(Event {
        warning: true,
        reason: EventReason::NodeGone,
        note: message,
    }));
    step
}

/// The annotations the admission writes with our finalizer, in one metadata write: the admission
/// time (from which our phase clocks count, see [`conditions::phase_since`]), whether the cordon
/// was asked for (see [`owes_uncordon`]) and, when the node is there, its initial state, so the
/// first step can cordon without a write of its own. `node` comes from [`admission_node_view`],
/// or from the API server when that says so.
pub fn admission_annotations(
    request: &NodeMaintenance,
    node: NodeView,
    now: Timestamp,
) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([(
        ADMITTED_TIME_ANNOTATION.to_string(),
        conditions::admitted_time_value(now),
    )]);
    // This makes the request Scheduled (`NodeMaintenance::phase`).
    if let Some(uid) = &request.metadata.uid {
        annotations.insert(ADMITTED_UID_ANNOTATION.to_string(), uid.clone());
    }
    if let (None, NodeView::Present { unschedulable }) = (initial_state(request), node) {
        annotations.insert(
            INITIAL_UNSCHEDULABLE_ANNOTATION.to_string(),
            unschedulable.to_string(),
        );
    }
    if request.spec.cordon() {
        annotations.insert(CORDON_REQUESTED_ANNOTATION.to_string(), "true".to_string());
    }
    annotations
}

/// No Ready condition, or NVIDIA's uninitialized empty reason: the request was never marked
/// Pending, so its first status write (or its admission) reports New -> Pending.
pub fn never_marked_pending(request: &NodeMaintenance) -> bool {
    request
        .condition(condition_type::READY)
        .is_none_or(|c| c.reason.is_empty())
}

/// The phase changes an admission reports (metrics, log, Events), though it writes no status:
/// its metadata write alone makes the request Scheduled. A request never marked Pending passes
/// through Pending first, as NVIDIA's operator shows every request (with its Event), at once.
pub fn admission_transitions(request: &NodeMaintenance, now: Timestamp) -> Vec<Transition> {
    let mut transitions = Vec::new();
    let mut pending = request.clone();
    if request.phase() == Phase::Pending && never_marked_pending(request) {
        let write = enter_phase(
            request,
            Phase::Pending,
            "waiting for admission",
            now,
            |_| {},
        );
        transitions.extend(write.transition);
        pending.status = Some(write.status);
    }
    transitions.extend(enter_phase(&pending, Phase::Scheduled, "admitted", now, |_| {}).transition);
    transitions
}

/// What an admission write that did not succeed leaves known. The supervisor counts a request as
/// in maintenance from its decision until this is settled: a write that may have been applied
/// must keep its slot, or the next request is admitted beside it and the limits are exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionFailure {
    /// The request changed or went away since the version the write was guarded by (409, 404):
    /// nothing was written, and the cache is behind.
    Stale,
    /// The API server refused the write (a webhook's denial, missing RBAC, throttling):
    /// nothing was written.
    Refused,
    /// No answer, a timeout or a server error: the API server may have applied the write and
    /// lost its answer. Read the request back before giving its slot away.
    OutcomeUnknown,
}

/// Classifies a failed admission write by the HTTP status the API server answered (`None`: no
/// answer, a transport error or a timeout).
pub fn admission_failure(status: Option<u16>) -> AdmissionFailure {
    match status {
        Some(404 | 409) => AdmissionFailure::Stale,
        // 408: the server gave up waiting, perhaps after the write was stored.
        Some(code) if (400..500).contains(&code) && code != 408 => AdmissionFailure::Refused,
        _ => AdmissionFailure::OutcomeUnknown,
    }
}

/// What reading a request back tells of an admission write whose outcome was unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionReadBack {
    /// Still at the version the write was guarded by: the write was not applied, and the
    /// request backs off like one whose write was refused.
    NotApplied,
    /// Admitted (by our write: only we admit): the read is the admitted request.
    Applied,
    /// Changed by another's write, or gone (an applied admission's finalizer would keep it):
    /// ours was not applied, and the cache is behind, as after a conflict.
    Stale,
}

/// `attempted`: the resourceVersion the admission's patch was guarded by; `read`: the request as
/// the API server shows it now (`None`: gone). The read follows the failed write, so the API
/// server has finished with the write by then (its own request timeout is shorter than ours).
pub fn admission_read_back(
    attempted: Option<&str>,
    read: Option<&NodeMaintenance>,
) -> AdmissionReadBack {
    let Some(read) = read else {
        return AdmissionReadBack::Stale;
    };
    if read.phase() != Phase::Pending {
        AdmissionReadBack::Applied
    } else if attempted.is_some() && read.metadata.resource_version.as_deref() == attempted {
        AdmissionReadBack::NotApplied
    } else {
        AdmissionReadBack::Stale
    }
}

/// After a failed step: a request that only its admission shows Scheduled gets Scheduled written
/// with the failure (`failed_step::message`), or its status would stay blank (or keep the reason
/// it waited for) while the step is retried. Any other status is left as it is: the step writes
/// its own, and the failure goes to a Warning Event.
pub fn status_after_failed_step(
    request: &NodeMaintenance,
    failure: &str,
    now: Timestamp,
) -> Option<StatusWrite> {
    if !request.admitted_not_shown() || request.is_deleting() {
        return None;
    }
    let message = format!("admitted; {failure}");
    Some(enter_phase(
        request,
        Phase::Scheduled,
        &message,
        now,
        |_| {},
    ))
}

/// Ready without NVIDIA's `ready-time` annotation gets it once it has been Ready for
/// [`READY_TIME_DELAY`], with the time the `Ready` condition turned True. NVIDIA's
/// `handleTerminalState` writes it in the reconcile after the one that set Ready (so it, too,
/// never holds Ready back, and may lose the race with a quick release). It is written once: a
/// request that is Ready again after a requestor's failure was cleared keeps counting from its
/// first Ready, as NVIDIA's. (NVIDIA also writes it in RequestorFailed, reachable there only from
/// Ready; ours can fail before Ready, and garbage collection spares RequestorFailed, so it is not
/// needed there.)
fn record_ready_time(request: &NodeMaintenance, now: Timestamp) -> Step {
    let mut step = Step::default();
    if conditions::annotation_time(request, READY_TIME_ANNOTATION).is_some() {
        return step;
    }
    let ready_since = request
        .condition(condition_type::READY)
        .filter(|c| c.status == "True")
        .map_or(now, |c| c.last_transition_time.0);
    let due = after(ready_since, READY_TIME_DELAY);
    if now >= due {
        step.actions
            .push(Action::RecordReadyTime { at: ready_since });
    } else {
        step.wake(after(due, TIMER_SLACK));
    }
    step
}

fn phase_after_cordon(request: &NodeMaintenance) -> (Phase, &'static str) {
    if request.spec.wait_for_pod_completion.is_some() {
        (Phase::WaitForPodCompletion, "")
    } else {
        phase_after_wait(request)
    }
}

fn phase_after_wait(request: &NodeMaintenance) -> (Phase, &'static str) {
    if request.spec.drain_spec.is_some() {
        (Phase::Draining, "")
    } else {
        (Phase::Ready, "no drain requested")
    }
}

fn on_cordon(request: &NodeMaintenance, observed: &Observed<'_>, now: Timestamp) -> Step {
    let mut actions = Vec::new();
    let mut cordon = we_cordon(request);
    // An object that reached Cordon without the annotation (written by another operator)
    // records it now, from the live node.
    if let (None, NodeView::Present { unschedulable }) = (initial_state(request), observed.node) {
        actions.push(Action::RecordInitialState { unschedulable });
        cordon = request.spec.cordon() && !unschedulable;
    }
    // A node already cordoned in Cordon (by NVIDIA's operator before we adopted the request, or
    // by our step before a restart) is not cordoned twice; the uncordon is still owed by the
    // annotation. In Scheduled the view comes from the shared cache, which may still show the
    // cordon of a request released a moment ago (the admission read the node fresh, the cache
    // did not): the cordon is written whatever the cache says.
    let already_cordoned = request.phase() == Phase::Cordon
        && observed.node
            == NodeView::Present {
                unschedulable: true,
            };
    if cordon && !already_cordoned {
        actions.push(Action::Cordon);
    }
    let (next, message) = phase_after_cordon(request);
    actions.push(enter(request, next, message, now, |_| {}));
    Step {
        actions,
        ..Step::default()
    }
}

/// A spec the operator cannot act on (bad selector or regex): say so in the `Failed` condition,
/// once; the step runs again when the spec changes.
fn invalid_spec(request: &NodeMaintenance, message: &str, now: Timestamp) -> Step {
    let mut step = Step {
        watch_pods: true,
        ..Step::default()
    };
    if failed_with(request, FailedReason::InvalidSpec)
        .is_some_and(|reported| reported.message == message)
    {
        return step;
    }
    step.actions.extend(report_failure(
        request,
        FailedReason::InvalidSpec,
        message,
        now,
    ));
    step
}

/// The `Failed` condition of this reason, if the request has one.
fn failed_with(request: &NodeMaintenance, reason: FailedReason) -> Option<&Condition> {
    request
        .condition(condition_type::FAILED)
        .filter(|c| c.reason == reason.as_str())
}

/// The status write that sets `Failed` (this reason and message) without a phase change, then
/// its Warning Event (after the write it reports).
fn report_failure(
    request: &NodeMaintenance,
    reason: FailedReason,
    message: &str,
    now: Timestamp,
) -> [Action; 2] {
    let mut status = request.status.clone().unwrap_or_default();
    set_failed(&mut status, request, reason, message, now);
    [
        Action::WriteStatus(StatusWrite {
            status,
            transition: None,
        }),
        Action::Event(Event {
            warning: true,
            reason: reason.event(),
            note: message.to_string(),
        }),
    ]
}

fn set_failed(
    status: &mut NodeMaintenanceStatus,
    request: &NodeMaintenance,
    reason: FailedReason,
    message: &str,
    now: Timestamp,
) {
    conditions::upsert_condition(
        &mut status.conditions,
        condition_type::FAILED,
        true,
        reason.as_str(),
        message,
        now,
        request.metadata.generation,
    );
}

/// Removes a `Failed` condition of this reason (its cause is gone); true if there was one.
fn clear_failed(status: &mut NodeMaintenanceStatus, reason: FailedReason) -> bool {
    let has = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition_type::FAILED && c.reason == reason.as_str());
    if has {
        conditions::remove_condition(&mut status.conditions, condition_type::FAILED);
    }
    has
}

fn on_wait_for_completion(
    request: &NodeMaintenance,
    observed: &Observed<'_>,
    now: Timestamp,
    ledger: &mut Ledger,
) -> Step {
    ledger.clear();
    let (next, next_message) = phase_after_wait(request);
    // waitForPodCompletion removed mid-phase: nothing to wait for.
    let Some(spec) = &request.spec.wait_for_pod_completion else {
        return Step {
            actions: vec![enter(
                request,
                next,
                "waitForPodCompletion was removed",
                now,
                |s| s.wait_for_completion.clear(),
            )],
            ..Step::default()
        };
    };
    let mut step = Step {
        watch_pods: true,
        ..Step::default()
    };
    let Some(pods) = observed.pods else {
        return step;
    };
    let rules = match CompletionRules::new(spec) {
        Ok(rules) => rules,
        Err(err) => return invalid_spec(request, &err.to_string(), now),
    };
    let waiting: Vec<String> = drain_plan::pods_to_wait_for(&rules, pods)
        .iter()
        .map(PodRef::key)
        .collect();
    if waiting.is_empty() {
        step.watch_pods = next == Phase::Draining;
        step.actions
            .push(enter(request, next, next_message, now, |s| {
                s.wait_for_completion.clear()
            }));
        return step;
    }
    step.wake(after(now, WAIT_RECHECK));
    let timeout = Duration::from_secs(u64::from(spec.timeout_seconds()));
    let since = conditions::phase_since(request).unwrap_or(now);
    if !timeout.is_zero() {
        if elapsed(since, now) >= timeout {
            let note = format!(
                "waited {}s for pod completion; {} pod(s) still running ({}); moving on",
                timeout.as_secs(),
                waiting.len(),
                waiting.join(", ")
            );
            step.actions.push(enter(
                request,
                next,
                "wait for pod completion timed out",
                now,
                |s| s.wait_for_completion.clear(),
            ));
            step.actions.push(Action::Event(Event {
                warning: true,
                reason: EventReason::WaitForPodCompletionTimeout,
                note,
            }));
            return step;
        }
        step.wake(after(after(since, timeout), TIMER_SLACK));
    }
    let mut status = request.status.clone().unwrap_or_default();
    let fixed = clear_failed(&mut status, FailedReason::InvalidSpec);
    if fixed || status.wait_for_completion != waiting {
        status.wait_for_completion = waiting;
        step.actions.push(Action::WriteStatus(StatusWrite {
            status,
            transition: None,
        }));
    }
    step
}

fn creation_time(pod: &impl DrainPod) -> Option<Timestamp> {
    pod.meta().creation_timestamp.as_ref().map(|t| t.0)
}

/// Draining. Pods that arrive on the node after the drain began (created later than the phase
/// start; kubectl drain would not see them, as it lists once) are evicted too, but never hold
/// the drain open: a controller that keeps binding pods to the node, or `cordon: false` with a
/// busy scheduler, cannot keep a drain alive forever.
fn on_draining(
    request: &NodeMaintenance,
    spec: &DrainSpec,
    observed: &Observed<'_>,
    now: Timestamp,
    ledger: &mut Ledger,
) -> Step {
    let mut step = Step {
        watch_pods: true,
        ..Step::default()
    };
    let Some(pods) = observed.pods else {
        return pods_never_listed(request, spec, now, step);
    };
    let rules = match DrainRules::new(spec, Some(observed.operator.clone())) {
        Ok(rules) => rules,
        Err(err) => {
            ledger.clear();
            return invalid_spec(request, &err.to_string(), now);
        }
    };
    let plan = drain_plan::plan(&rules, pods);
    let started = conditions::phase_since(request).unwrap_or(now);
    let arrived_later: BTreeSet<String> = pods
        .iter()
        .filter(|p| creation_time(p).is_some_and(|created| created > started))
        .map(|p| PodRef::from_pod(p).key())
        .collect();

    // Pods we evicted that still exist with the same UID are still terminating: wait for them.
    let live: BTreeMap<String, &Arc<CachedPod>> = pods
        .iter()
        .map(|p| (PodRef::from_pod(p).key(), p))
        .collect();
    // A deletion past the deadline whose answer is still due is kept even if its pod has left the
    // cache: the answer carries the record of the budget bypassed, and the drain waits for it.
    ledger.evictions.retain(|key, e| {
        e.awaits_deletion_answer()
            || live
                .get(key)
                .is_some_and(|p| p.metadata.uid.as_deref() == e.uid.as_deref())
    });
    let deletions_unanswered: Vec<String> = ledger
        .evictions
        .iter()
        .filter(|(key, e)| e.awaits_deletion_answer() && !live.contains_key(*key))
        .map(|(key, _)| key.clone())
        .collect();
    if ledger.last_progress.is_none() {
        ledger.last_progress = Some(now);
    }

    let timeout = Duration::from_secs(u64::from(spec.timeout_seconds()));
    let timed_out = !timeout.is_zero() && elapsed(started, now) >= timeout;
    // The escalation deadline counts from the same phase clock as the timeout, independently of
    // it: a timeout reports and retries slowly, the deadline stops waiting for budgets.
    let force_after = spec.force_delete_after();
    let force_due = force_after.is_some_and(|d| elapsed(started, now) >= d);
    let mut orders = Vec::new();
    let mut deletes = Vec::new();
    for pod in &plan.to_evict {
        let key = pod.key();
        let entry = ledger
            .evictions
            .entry(key.clone())
            .or_insert_with(|| PodEviction {
                uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
                attempts: 0,
                in_flight: false,
                accepted: false,
                next_attempt: now,
                slow: false,
                last: None,
                covering_pdbs: Vec::new(),
                force: None,
            });
        if entry.in_flight || entry.accepted {
            continue;
        }
        // Past the deadline, a pod whose last eviction a named budget refused is deleted instead
        // (a 429 that names no budget may be the API server's own throttling: not bypassed).
        // Newcomers never hold the drain, so nothing justifies bypassing their budget.
        let bypass = match (&entry.force, &entry.last) {
            (Some(force), _) => Some(force.pdb.clone()),
            (None, Some(EvictionOutcome::Refused { pdb: Some(pdb), .. }))
                if force_due && !arrived_later.contains(&key) =>
            {
                Some(pdb.clone())
            }
            _ => None,
        };
        if let Some(pdb) = bypass {
            // A failed deletion is retried after its backoff; the first one goes at the deadline.
            if entry.force.is_some() && entry.next_attempt > now {
                step.wake(entry.next_attempt);
                continue;
            }
            entry.in_flight = true;
            entry.attempts += 1;
            let note = force_delete_note(
                request,
                &key,
                &pod.namespace,
                &pdb,
                observed.pdb_summaries,
                force_after.unwrap_or_default(),
            );
            if entry.force.is_none() {
                entry.force = Some(ForceDelete {
                    pdb: pdb.clone(),
                    error: None,
                });
            }
            deletes.push(ForceDeleteOrder {
                key,
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                uid: entry.uid.clone(),
                pdb,
                note,
            });
            continue;
        }
        if entry.next_attempt > now {
            step.wake(entry.next_attempt);
            continue;
        }
        // The plan is made of the cached pods: each is in `live`.
        let Some(&cached) = live.get(&key) else {
            continue;
        };
        entry.in_flight = true;
        // After the timeout keep trying, slowly, so the request recovers by itself.
        entry.slow = timed_out;
        orders.push(EvictionOrder {
            key,
            pod: Arc::clone(cached),
            is_retry: entry.attempts > 0,
        });
        entry.attempts += 1;
    }
    if !orders.is_empty() {
        step.actions.push(Action::Evict(orders));
    }
    if !deletes.is_empty() {
        step.actions.push(Action::ForceDelete(deletes));
    }

    let terminating: BTreeSet<String> = plan
        .skipped
        .iter()
        .filter(|(_, why)| *why == SkipReason::Terminating)
        .map(|(p, _)| p.key())
        .collect();
    let previous = request.status.as_ref().and_then(|s| s.drain.clone());
    // Deletions past the deadline: those on the object (written before a restart) and those
    // accepted since, once each.
    let mut force_deleted = previous
        .as_ref()
        .map(|d| d.force_deleted.clone())
        .unwrap_or_default();
    let force_deleted_before = force_deleted.len();
    for deleted in &ledger.force_deleted {
        if !force_deleted.contains(deleted) {
            force_deleted.push(deleted.clone());
        }
    }
    let mut blocked: Vec<BlockedPod> = plan
        .blocked
        .iter()
        .map(|(pod, reason)| reason.to_blocked_pod(pod))
        .collect();
    for (key, entry) in &ledger.evictions {
        if !terminating.contains(key)
            && let Some(b) = blocked_entry(observed.pdb_summaries, key, entry, force_after)
        {
            blocked.push(b);
        }
    }
    // Terminating pods (evicted by us, even before a restart, or by anyone) are waited for until
    // their object is gone: the node is not drained while they still run.
    for key in &terminating {
        let message = match force_deleted.iter().rev().find(|f| &f.pod == key) {
            Some(f) => format!(
                "deleted past drainSpec.forceDeleteAfterSeconds, bypassing PodDisruptionBudget \
                 {}/{}; waiting for the pod to terminate",
                namespace_of(key),
                f.pdb
            ),
            None => "evicted; waiting for the pod to terminate".to_string(),
        };
        blocked.push(BlockedPod {
            pod: key.clone(),
            reason: WaitReason::Terminating.as_str().to_string(),
            message,
        });
    }
    blocked.retain(|b| !arrived_later.contains(&b.pod));
    blocked.sort_by(|a, b| a.pod.cmp(&b.pod));
    let mut remaining: Vec<String> = plan
        .to_evict
        .iter()
        .map(PodRef::key)
        .chain(plan.blocked.iter().map(|(p, _)| p.key()))
        .chain(terminating.iter().cloned())
        .chain(deletions_unanswered)
        .filter(|key| !arrived_later.contains(key))
        .collect();
    remaining.sort();

    // The counts only grow during a drain: remembered between throttled status writes, and read
    // back from the status after a restart.
    let eviction_pods = previous
        .as_ref()
        .map_or(0, |d| usize::try_from(d.eviction_pods).unwrap_or(0))
        .max(ledger.drain_counts.1)
        .max(remaining.len());
    let total_pods = previous
        .as_ref()
        .map_or(0, |d| usize::try_from(d.total_pods).unwrap_or(0))
        .max(ledger.drain_counts.0)
        .max(plan.total_pods);
    ledger.drain_counts = (total_pods, eviction_pods);
    let drain_status = DrainStatus {
        total_pods: i32::try_from(total_pods).unwrap_or(i32::MAX),
        eviction_pods: i32::try_from(eviction_pods).unwrap_or(i32::MAX),
        drain_progress: drain_plan::drain_progress(eviction_pods, remaining.len()),
        wait_for_eviction: remaining.clone(),
        blocked: blocked.clone(),
        force_deleted: force_deleted.clone(),
    };
    if ledger.last_remaining != Some(remaining.len()) {
        ledger.last_remaining = Some(remaining.len());
        ledger.last_progress = Some(now);
    }

    if remaining.is_empty() {
        step.actions.push(Action::DrainFinished {
            after: elapsed(started, now),
        });
        // NVIDIA's Ready has no message; a drain that bypassed budgets says so where
        // `kubectl get nm` readers look first.
        let message = force_deleted_summary(&force_deleted);
        step.actions
            .push(enter(request, Phase::Ready, &message, now, |s| {
                s.drain = Some(drain_status)
            }));
        step.watch_pods = false;
        ledger.clear();
        return step;
    }
    step.last_progress = ledger.last_progress;

    let mut status = request.status.clone().unwrap_or_default();
    // The first drain status waits for the interval too: the write that entered Draining was
    // just made, and a drain that ends within the interval shows its counts in the Ready write.
    let mut write_now = false;
    let mut changed = status.drain.as_ref() != Some(&drain_status);
    status.drain = Some(drain_status);
    if clear_failed(&mut status, FailedReason::InvalidSpec) {
        changed = true;
        write_now = true;
    }
    // A bypassed budget is worth writing at once: a restart must not lose the record.
    if force_deleted.len() > force_deleted_before {
        write_now = true;
    }
    // An earlier Failed of another cause never hides the timeout.
    let timeout_reported = failed_with(request, FailedReason::DrainTimeout).is_some();
    let mut timeout_event = None;
    if timed_out && !timeout_reported {
        let message = timeout_message(timeout, &blocked, &remaining);
        set_failed(
            &mut status,
            request,
            FailedReason::DrainTimeout,
            &message,
            now,
        );
        timeout_event = Some(Action::Event(Event {
            warning: true,
            reason: FailedReason::DrainTimeout.event(),
            note: message,
        }));
        changed = true;
        // A timeout is worth writing at once.
        write_now = true;
    }
    // A heartbeat keeps the progress gauge and the timeout current when nothing else happens.
    step.wake(after(now, HEARTBEAT));
    if !timed_out && !timeout.is_zero() {
        step.wake(after(after(started, timeout), TIMER_SLACK));
    }
    // The deadline runs the step itself, not the next heartbeat after it.
    if let Some(deadline) = force_after.filter(|_| !force_due) {
        step.wake(after(after(started, deadline), TIMER_SLACK));
    }
    if changed {
        let next_write = ledger
            .last_status_write
            .map(|at| after(at, STATUS_WRITE_INTERVAL));
        match next_write {
            Some(at) if !write_now && at > now => step.wake(at),
            _ => step.actions.push(Action::WriteStatus(StatusWrite {
                status,
                transition: None,
            })),
        }
    }
    // After the write that records the timeout (always made at once), so a conflict that runs
    // the step again does not send it twice.
    step.actions.extend(timeout_event);
    step
}

/// Draining, but the node's pods were never listed (the pod watch gets no answer: RBAC, an
/// outage). Nothing can be evicted, but the timeout still holds: past it the request says why it
/// waits, instead of sitting in Draining with no sign of trouble.
fn pods_never_listed(
    request: &NodeMaintenance,
    spec: &DrainSpec,
    now: Timestamp,
    mut step: Step,
) -> Step {
    let timeout = Duration::from_secs(u64::from(spec.timeout_seconds()));
    if timeout.is_zero() {
        return step;
    }
    let started = conditions::phase_since(request).unwrap_or(now);
    let deadline = after(started, timeout);
    if now < deadline {
        step.wake(after(deadline, TIMER_SLACK));
        return step;
    }
    if failed_with(request, FailedReason::DrainTimeout).is_some() {
        return step;
    }
    let message = format!(
        "drain did not finish within {}s: the pods on node {} could not be listed (the \
         operator's pod watch gets no answer; check that it may list and watch pods, and its log)",
        timeout.as_secs(),
        request.spec.node_name
    );
    step.actions.extend(report_failure(
        request,
        FailedReason::DrainTimeout,
        &message,
        now,
    ));
    step
}

fn timeout_message(timeout: Duration, blocked: &[BlockedPod], remaining: &[String]) -> String {
    let mut parts: Vec<String> = blocked
        .iter()
        .map(|b| format!("{}: {}", b.pod, b.message))
        .collect();
    for pod in remaining {
        if !blocked.iter().any(|b| &b.pod == pod) {
            parts.push(format!("{pod}: not evicted yet"));
        }
    }
    format!(
        "drain did not finish within {}s; {} pod(s) remain: {}",
        timeout.as_secs(),
        remaining.len(),
        parts.join("; ")
    )
}

/// `PodDisruptionBudget ns/name`, with its counts when the actor watches it.
fn describe_pdb(pdb_summaries: &BTreeMap<String, String>, namespace: &str, pdb: &str) -> String {
    let name = format!("{namespace}/{pdb}");
    match pdb_summaries.get(&name) {
        Some(summary) => format!("PodDisruptionBudget {name} ({summary})"),
        None => format!("PodDisruptionBudget {name}"),
    }
}

/// The note of the Warning Events of one deletion past the deadline.
fn force_delete_note(
    request: &NodeMaintenance,
    key: &str,
    namespace: &str,
    pdb: &str,
    pdb_summaries: &BTreeMap<String, String>,
    deadline: Duration,
) -> String {
    format!(
        "deleted pod {key} instead of evicting it: {} still refused its eviction {}s after the \
         drain of node {} began (drainSpec.forceDeleteAfterSeconds of NodeMaintenance {}); the \
         budget was bypassed",
        describe_pdb(pdb_summaries, namespace, pdb),
        deadline.as_secs(),
        request.spec.node_name,
        request.key()
    )
}

/// The `Ready` message of a drain that deleted pods past its deadline; empty otherwise.
fn force_deleted_summary(force_deleted: &[ForceDeletedPod]) -> String {
    if force_deleted.is_empty() {
        return String::new();
    }
    let pods: Vec<String> = force_deleted
        .iter()
        .map(|f| format!("{} (PodDisruptionBudget {})", f.pod, f.pdb))
        .collect();
    format!(
        "{} pod(s) deleted past drainSpec.forceDeleteAfterSeconds, bypassing their \
         PodDisruptionBudgets: {}",
        force_deleted.len(),
        pods.join(", ")
    )
}

/// Why an eviction of ours waits, for `status.drain.blocked`.
fn blocked_entry(
    pdb_summaries: &BTreeMap<String, String>,
    key: &str,
    entry: &PodEviction,
    force_after: Option<Duration>,
) -> Option<BlockedPod> {
    let namespace = namespace_of(key);
    let describe = |pdb: &str| describe_pdb(pdb_summaries, namespace, pdb);
    if let Some(force) = &entry.force {
        let deadline = force_after.unwrap_or_default().as_secs();
        return Some(match &force.error {
            Some(error) => BlockedPod {
                pod: key.to_string(),
                reason: WaitReason::Error.as_str().to_string(),
                message: format!(
                    "deleting the pod past drainSpec.forceDeleteAfterSeconds ({deadline}s), \
                     bypassing {}, failed: {error}; retrying (a 403 means the operator may not \
                     delete pods: grant it `delete` on pods, chart value rbac.forceDelete=true)",
                    describe(&force.pdb)
                ),
            },
            None => BlockedPod {
                pod: key.to_string(),
                reason: WaitReason::Pdb.as_str().to_string(),
                message: format!(
                    "{} still refused the eviction {deadline}s after the drain began \
                     (drainSpec.forceDeleteAfterSeconds): deleting the pod, bypassing the budget",
                    describe(&force.pdb)
                ),
            },
        });
    }
    let (reason, message) = match entry.last.as_ref()? {
        EvictionOutcome::Refused { pdb, message, .. } => (
            WaitReason::Pdb,
            match pdb {
                Some(pdb) => format!(
                    "{} allows no disruption now; retrying when it changes ({message})",
                    describe(pdb)
                ),
                None => format!("eviction refused: {message}"),
            },
        ),
        EvictionOutcome::MultiplePdbs { message } => (
            WaitReason::MultiplePdbs,
            if entry.covering_pdbs.is_empty() {
                format!("{message}; make exactly one PodDisruptionBudget select the pod")
            } else {
                let names: Vec<String> = entry.covering_pdbs.iter().map(|p| describe(p)).collect();
                format!(
                    "covered by {} PodDisruptionBudgets: {}; the Eviction API refuses pods with more than one, make exactly one select the pod",
                    names.len(),
                    names.join(", ")
                )
            },
        ),
        EvictionOutcome::Error { code, message } => (
            WaitReason::Error,
            match code {
                Some(code) => format!("eviction failed with HTTP {code}: {message}"),
                None => format!("eviction failed: {message}"),
            },
        ),
        // Evicted pods still present are listed as Terminating from the pod itself.
        EvictionOutcome::Evicted | EvictionOutcome::Gone => return None,
    };
    Some(BlockedPod {
        pod: key.to_string(),
        reason: reason.as_str().to_string(),
        message,
    })
}

#[cfg(test)]
mod tests;
