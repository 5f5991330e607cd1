//! The node lifecycle as one pure step: from a request, what the node actor observed (the node,
//! the pods on it, the PDBs that block them), the time, and the actor's eviction ledger, to the
//! [`Step`] the actor executes: API actions in order, when to run again, and what to do about the
//! ledger (which PDBs to watch).
//!
//! Every rule about phases, deletion, timeouts and failures lives here, so each edge is a table
//! test, not an e2e run. The actor (`actors/src/request_actor.rs`) only gathers observations and
//! executes steps. State that must survive a restart is on the object (the `Ready` condition's
//! reason is the phase, its `lastTransitionTime` the phase start, the initial-state annotation,
//! the finalizer); the ledger only remembers what costs at most one extra call to lose.
//!
//! Behaviour shared with NVIDIA's controller is cited from
//! `internal/controller/nodemaintenance_controller.go` in github.com/Mellanox/maintenance-operator.
//!
//! This file holds the vocabulary (what is observed, the actions, the step) and the dispatch by
//! phase; each phase's step, the eviction ledger and the supervisor's helpers have a file of
//! their own.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use maintenance_crds::{NodeMaintenance, NodeMaintenanceStatus, Phase, condition_type};

use crate::conditions;
use crate::drain_plan::OperatorIdentity;
use crate::machine_config_pool::{PoolObservation, PoolView};
use crate::pod_view::CachedPod;

mod admission;
mod completion;
mod cordon;
mod deletion;
mod drain_status;
mod draining;
mod failure;
mod ledger;
mod ready;
mod versions;
mod yielding;

pub use admission::{
    AdmissionFailure, AdmissionReadBack, admission_annotations, admission_failure,
    admission_node_view, admission_read_back, admission_transitions, has_finalizer, initial_state,
    needs_actor, needs_fresh_node, never_marked_pending,
};
pub use deletion::{actor_holds_node_of_gone_request, on_request_gone, owes_uncordon_once_gone};
pub use failure::{retry_after_failed_step, status_after_failed_step};
use ledger::{ForceDelete, PodEviction};
pub use ledger::{Ledger, LedgerEvent, LedgerOutlook, retry_delay};
pub use versions::{is_newer_version, shows_version, version_reached};
pub use yielding::{YieldVerdict, yield_message, yield_verdict};

use completion::on_wait_for_completion;
use cordon::on_cordon;
use deletion::{on_deletion, on_node_gone};
use draining::on_draining;
use ready::record_ready_time;

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
    /// The request went without our cleanup (deleted under our finalizer, or the finalizer
    /// removed by hand): only what it did to the node is undone ([`on_request_gone`]).
    pub request_gone: bool,
    /// The pods bound to the node; `None` until the pod watch has listed them once.
    /// Shared with the node's pod cache, as cached (only what the drain reads): a step copies
    /// no pod.
    pub pods: Option<&'a [Arc<CachedPod>]>,
    /// The last known state of PDBs named in the ledger, `namespace/name` -> a summary such as
    /// `currentHealthy 9, desiredHealthy 9, disruptionsAllowed 0, expectedPods 10`.
    pub pdb_summaries: &'a BTreeMap<String, String>,
    /// The operator's own pods, never evicted.
    pub operator: &'a OperatorIdentity,
    /// The config's `admission.yieldBlockedDrainAfterSeconds`: a drain that budgets block gives
    /// its slot back after this long without progress; `None`: never.
    pub yield_after: Option<Duration>,
    /// The MachineConfigPool of the node, observed only for the Scheduled (and Cordon) step
    /// when pools are paused ([`observes_pool`]); `None` otherwise.
    pub pool: Option<&'a PoolObservation>,
}

/// Whether the step of `request` needs the pool of its node, when pools are paused: the step
/// that cordons (NVIDIA pauses in `handleScheduledState`, before the cordon).
pub fn observes_pool(request: &NodeMaintenance) -> bool {
    !request.is_deleting()
        && matches!(request.phase(), Phase::Scheduled | Phase::Cordon)
        && !conditions::requestor_failed(request)
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
    /// Keep the autoscalers off a node the admission does not cordon (`cordon: false`, or a node
    /// cordoned before us), if `admission.protectFromAutoscalers` says so
    /// ([`crate::cordon_mark::protect_patch`]); the cordon does it in its own patch.
    ProtectFromAutoscalers,
    /// Give the autoscalers back a node this request protected without cordoning it
    /// ([`crate::cordon_mark::unprotect_patch`]; a no-op when it did not).
    UnprotectFromAutoscalers,
    /// Start these eviction calls (each answer comes back as
    /// [`LedgerEvent::EvictionAnswered`]).
    Evict(Vec<EvictionOrder>),
    /// Delete these pods, bypassing the PodDisruptionBudget that kept refusing their eviction
    /// past `drainSpec.forceDeleteAfterSeconds` (each answer comes back as
    /// [`LedgerEvent::ForceDeleteAnswered`]).
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
    /// Label the request with the pool of its node ([`crate::machine_config_pool::POOL_LABEL`]),
    /// before the pool is paused, so that a release sees it as a holder.
    LabelPool {
        pool: String,
    },
    /// Pause the pool, with our annotation, guarded by the version observed
    /// ([`crate::machine_config_pool::pause_patch`]).
    PausePool(PoolView),
    /// At the release of a request that labelled `pool`: read the pool and its holders, and
    /// unpause it if [`crate::machine_config_pool::release_verdict`] says so.
    ReleasePool {
        pool: String,
    },
    /// Give the slot back (a drain that budgets block): this merge patch of the request's
    /// metadata, guarded by its resourceVersion, removes our finalizer and the admission's
    /// annotations and records the yield (`crate::yielding::yield_patch`).
    Yield {
        patch: serde_json::Value,
        /// Why, as the Pending message and the Event say it (for the `Yielded` notification).
        message: String,
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
    /// The supervisor deleted a forgotten request (see [`crate::gc`]).
    GarbageCollected,
    /// A pod was deleted past `drainSpec.forceDeleteAfterSeconds`, bypassing its
    /// PodDisruptionBudget (a Warning on the request and on the pod).
    ForceDeleted,
    /// A call of a step failed and is retried (see [`crate::failed_step`]).
    StepFailed,
    /// A drain that budgets blocked gave its slot back: the request is Pending again.
    Yielded,
    /// The node's MachineConfigPool was paused before its cordon.
    MachineConfigPoolPaused,
    /// The pool's last request ended: it was unpaused.
    MachineConfigPoolUnpaused,
    /// The pool cannot be paused now (paused by someone else, configuring, not found): the
    /// cordon waits.
    MachineConfigPoolBusy,
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
            EventReason::Yielded => "Yielded",
            EventReason::MachineConfigPoolPaused => "MachineConfigPoolPaused",
            EventReason::MachineConfigPoolUnpaused => "MachineConfigPoolUnpaused",
            EventReason::MachineConfigPoolBusy => "MachineConfigPoolBusy",
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
/// back by the spec carry [`crate::drain_plan::BlockReason`]'s reasons).
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
    /// What the actor does about the ledger once the actions ran: the PDBs to watch, the gauges
    /// of pods they block. Set by [`step`] from the ledger as the step left it.
    pub ledger_outlook: LedgerOutlook,
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

fn namespace_of(key: &str) -> &str {
    key.split('/').next().unwrap_or_default()
}

fn after(now: Timestamp, delay: Duration) -> Timestamp {
    SignedDuration::try_from(delay)
        .ok()
        .and_then(|d| now.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
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
/// started, drain counts), and the actor feeds what it learns in between back through
/// [`Ledger::observe`]. The step's [`Step::ledger_outlook`] says what to do about the ledger after.
pub fn step(
    request: &NodeMaintenance,
    observed: &Observed<'_>,
    now: Timestamp,
    ledger: &mut Ledger,
) -> Step {
    let mut step = decide(request, observed, now, ledger);
    step.ledger_outlook = ledger.outlook();
    step
}

fn decide(
    request: &NodeMaintenance,
    observed: &Observed<'_>,
    now: Timestamp,
    ledger: &mut Ledger,
) -> Step {
    // A request gone without our cleanup: there is no object left, only the node to undo.
    if observed.request_gone {
        ledger.clear();
        return on_request_gone(request, observed.node);
    }
    // Then a gone node: nothing is left to uncordon, and nothing may hold the release, not even
    // additionalRequestors (NVIDIA's `Reconcile` looks the node up before anything else).
    if observed.node == NodeView::Missing {
        ledger.clear();
        return on_node_gone(request, now);
    }
    if request.is_deleting() {
        ledger.clear();
        return on_deletion(request, observed, now);
    }
    // A yield cut short after its metadata write: finish it, do not adopt it.
    if let Some(step) = yielding::finish_interrupted_yield(request, now) {
        ledger.clear();
        return step;
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

#[cfg(test)]
mod tests;
