//! One actor per NodeMaintenance in progress: it alone moves its request from Scheduled to Ready
//! (cordon, wait for pod completion, drain) and cleans up on deletion. Every step reads what is on
//! the objects and is idempotent, so a restarted actor (or operator) resumes where it was.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use maintenance_crds::{
    BlockedPod, DrainStatus, FINALIZER, INITIAL_UNSCHEDULABLE_ANNOTATION, NodeMaintenance,
    NodeMaintenanceStatus, Phase, condition_type,
};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;

use crate::conditions;
use crate::context::{Context, is_conflict, is_not_found};
use crate::drain_plan::{self, CompletionRules, DrainRules};
use crate::evictor::EvictionOutcome;
use crate::label_selector;
use crate::task::AbortOnDrop;

/// Drain progress is written at most this often, so a thousand evictions are not a thousand writes.
const STATUS_WRITE_INTERVAL: Duration = Duration::from_secs(1);
/// Retry cadence for a blocked eviction once the drain has timed out: slow, but it recovers.
const SLOW_RETRY: Duration = Duration::from_secs(30);
/// While draining, the state machine runs at least this often.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// Bounds of the per-pod eviction backoff.
const EVICTION_MIN_BACKOFF: Duration = Duration::from_millis(500);
const EVICTION_MAX_BACKOFF: Duration = Duration::from_secs(15);

pub enum NodeMsg {
    /// The supervisor saw a newer version of the request.
    Updated(Arc<NodeMaintenance>),
    /// Re-run the state machine (timers).
    Step,
    /// Pods on the node changed (coalesced: one in the mailbox stands for any number of events).
    PodsChanged,
    /// A PDB that blocked one of our pods now allows a disruption.
    PdbChanged { namespace: String, name: String },
    /// One eviction call finished.
    Evicted {
        key: String,
        uid: Option<String>,
        outcome: EvictionOutcome,
    },
}

pub struct NodeActor;

pub struct NodeArgs {
    pub ctx: Arc<Context>,
    pub request: Arc<NodeMaintenance>,
}

/// Eviction bookkeeping for one pod (in memory only: losing it costs at most one extra call).
struct PodEviction {
    uid: Option<String>,
    attempts: u32,
    in_flight: bool,
    /// The API server accepted the eviction: now we wait for the pod to be gone.
    accepted: bool,
    next_attempt: Instant,
    backoff: Box<dyn Iterator<Item = Duration> + Send + Sync>,
    last: Option<EvictionOutcome>,
    /// For a MultiplePdbs refusal: the PDBs that select the pod (looked up once).
    covering_pdbs: Vec<String>,
    labels: std::collections::BTreeMap<String, String>,
}

pub struct NodeState {
    ctx: Arc<Context>,
    request: Arc<NodeMaintenance>,
    pods: Option<PodWatch>,
    evictions: HashMap<String, PodEviction>,
    next_step_at: Option<Instant>,
    last_status_write: Option<Instant>,
    consecutive_errors: u32,
    last_progress: Instant,
    last_remaining: Option<usize>,
    /// Blocked pods per PDB reported in the metrics, so they can be cleared again.
    reported_pdbs: HashMap<(String, String), f64>,
    /// Subscriptions to the PDBs that block our pods now.
    pdb_watches: HashMap<(String, String), AbortOnDrop>,
    /// Largest (totalPods, evictionPods) seen in this drain.
    drain_counts: (usize, usize),
}

struct PodWatch {
    store: Store<Pod>,
    /// True while a PodsChanged waits in the mailbox; cleared when it is handled, so an event
    /// that arrives after the actor read the store always queues another.
    queued: Arc<AtomicBool>,
    /// Set once the first list arrived: before that an empty store means nothing.
    synced: Arc<AtomicBool>,
    _task: AbortOnDrop,
    _ready: AbortOnDrop,
}

impl NodeState {
    fn key(&self) -> String {
        self.request.key()
    }

    fn node(&self) -> &str {
        &self.request.spec.node_name
    }

    /// Runs the state machine again after `after`, keeping only the earliest pending timer.
    fn schedule_step(&mut self, myself: &ActorRef<NodeMsg>, after: Duration) {
        let at = Instant::now() + after;
        if self.next_step_at.is_some_and(|pending| pending <= at) {
            return;
        }
        self.next_step_at = Some(at);
        myself.send_after(after, || NodeMsg::Step);
    }
}

impl Actor for NodeActor {
    type Msg = NodeMsg;
    type State = NodeState;
    type Arguments = NodeArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<NodeMsg>,
        args: NodeArgs,
    ) -> Result<NodeState, ActorProcessingErr> {
        args.ctx.metrics.node_actors.inc();
        let _ = myself.cast(NodeMsg::Step);
        Ok(NodeState {
            ctx: args.ctx,
            request: args.request,
            pods: None,
            evictions: HashMap::new(),
            next_step_at: None,
            last_status_write: None,
            consecutive_errors: 0,
            last_progress: Instant::now(),
            last_remaining: None,
            reported_pdbs: HashMap::new(),
            pdb_watches: HashMap::new(),
            drain_counts: (0, 0),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<NodeMsg>,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        state.ctx.metrics.node_actors.dec();
        clear_metrics(state);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<NodeMsg>,
        msg: NodeMsg,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            NodeMsg::Updated(request) => {
                // Only move forward: the supervisor's cache may lag behind our own writes.
                if newer(&request, &state.request) {
                    state.request = request;
                }
            }
            NodeMsg::Step => {
                if state.next_step_at.is_some_and(|at| at <= Instant::now()) {
                    state.next_step_at = None;
                }
            }
            NodeMsg::PodsChanged => {
                if let Some(watch) = &state.pods {
                    watch.queued.store(false, Ordering::Release);
                }
            }
            NodeMsg::PdbChanged { namespace, name } => wake_blocked_by(state, &namespace, &name),
            NodeMsg::Evicted { key, uid, outcome } => record_eviction(state, key, uid, outcome),
        }
        let phase_before = (state.request.phase(), state.request.is_deleting());
        match reconcile(&myself, state).await {
            Ok(()) => {
                state.consecutive_errors = 0;
                // A new phase can usually start at once.
                if (state.request.phase(), state.request.is_deleting()) != phase_before {
                    let _ = myself.cast(NodeMsg::Step);
                }
            }
            Err(err) => {
                state.consecutive_errors += 1;
                let delay =
                    Duration::from_millis((250u64 << state.consecutive_errors.min(7)).min(30_000));
                if is_conflict(&err) {
                    // Someone else wrote the object: read it again and go on.
                    refresh(state).await;
                    state.schedule_step(&myself, Duration::ZERO);
                } else {
                    tracing::warn!(request = %state.key(), node = %state.node(), error = %err, retry_in = ?delay, "maintenance step failed; retrying");
                    state.ctx.error("node_step");
                    state.schedule_step(&myself, delay);
                }
            }
        }
        Ok(())
    }
}

/// Compares resourceVersions numerically when they are numbers (etcd's are), else accepts.
fn newer(candidate: &NodeMaintenance, current: &NodeMaintenance) -> bool {
    let parse = |o: &NodeMaintenance| o.resource_version().and_then(|v| v.parse::<u64>().ok());
    match (parse(candidate), parse(current)) {
        (Some(a), Some(b)) => a >= b,
        _ => true,
    }
}

async fn refresh(state: &mut NodeState) {
    let api: Api<NodeMaintenance> = Api::namespaced(
        state.ctx.client.clone(),
        &state.request.namespace().unwrap_or_default(),
    );
    match api.get_opt(&state.request.name_any()).await {
        Ok(Some(fresh)) => state.request = Arc::new(fresh),
        Ok(None) => {}
        Err(err) => tracing::warn!(request = %state.key(), %err, "could not re-read request"),
    }
}

async fn reconcile(myself: &ActorRef<NodeMsg>, state: &mut NodeState) -> Result<(), kube::Error> {
    tracing::trace!(request = %state.key(), phase = %state.request.phase(), deleting = state.request.is_deleting(), "reconcile");
    if state.request.is_deleting() {
        return cleanup(myself, state).await;
    }
    let phase = state.request.phase();
    let requestor_failed = conditions::requestor_failed(&state.request);
    if requestor_failed && phase != Phase::RequestorFailed && phase != Phase::Pending {
        state.pods = None;
        state.evictions.clear();
        return advance(
            state,
            Phase::RequestorFailed,
            "the requestor reported a failure",
        )
        .await;
    }
    match phase {
        // The supervisor owns admission; nothing to do until it is Scheduled.
        Phase::Pending => Ok(()),
        Phase::Scheduled => record_initial_state(state).await,
        Phase::Cordon => cordon(state).await,
        Phase::WaitForPodCompletion => wait_for_completion(myself, state).await,
        Phase::Draining => drain(myself, state).await,
        Phase::Ready => {
            // Nothing runs on a Ready node: stop watching its pods.
            state.pods = None;
            state.evictions.clear();
            clear_metrics(state);
            Ok(())
        }
        Phase::RequestorFailed => {
            if requestor_failed {
                Ok(())
            } else {
                // The requestor cleared its failure: run the preparation again (idempotent).
                advance(state, Phase::Cordon, "the requestor cleared its failure").await
            }
        }
    }
}

async fn advance(state: &mut NodeState, phase: Phase, message: &str) -> Result<(), kube::Error> {
    advance_with(state, phase, message, |_| {}).await
}

async fn advance_with(
    state: &mut NodeState,
    phase: Phase,
    message: &str,
    edit: impl FnOnce(&mut NodeMaintenanceStatus),
) -> Result<(), kube::Error> {
    let updated = state
        .ctx
        .transition(&state.request, phase, message, edit)
        .await?;
    state.request = Arc::new(updated);
    state.last_progress = Instant::now();
    state.last_status_write = Some(Instant::now());
    Ok(())
}

fn node_api(state: &NodeState) -> Api<Node> {
    Api::all(state.ctx.client.clone())
}

fn request_api(state: &NodeState) -> Api<NodeMaintenance> {
    Api::namespaced(
        state.ctx.client.clone(),
        &state.request.namespace().unwrap_or_default(),
    )
}

/// Scheduled: remember whether the node was already unschedulable, so cleanup uncordons only a
/// node that we cordoned.
async fn record_initial_state(state: &mut NodeState) -> Result<(), kube::Error> {
    if !state
        .request
        .annotations()
        .contains_key(INITIAL_UNSCHEDULABLE_ANNOTATION)
    {
        let Some(node) = node_api(state).get_opt(state.node()).await? else {
            return advance(
                state,
                Phase::Scheduled,
                &format!(
                    "node {} does not exist; delete this request or create the node",
                    state.node()
                ),
            )
            .await;
        };
        let unschedulable = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let patch = serde_json::json!({
            "metadata": {
                "resourceVersion": state.request.resource_version(),
                "annotations": { INITIAL_UNSCHEDULABLE_ANNOTATION: unschedulable.to_string() },
            }
        });
        let updated = request_api(state)
            .patch(
                &state.request.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        state.request = Arc::new(updated);
    }
    advance(state, Phase::Cordon, "").await
}

fn we_cordon(request: &NodeMaintenance) -> bool {
    request.spec.cordon()
        && request
            .annotations()
            .get(INITIAL_UNSCHEDULABLE_ANNOTATION)
            .is_some_and(|v| v == "false")
}

async fn set_unschedulable(state: &NodeState, unschedulable: bool) -> Result<(), kube::Error> {
    let patch = serde_json::json!({ "spec": { "unschedulable": unschedulable } });
    match node_api(state)
        .patch(state.node(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // A node that is gone needs neither cordon nor uncordon.
        Err(err) if is_not_found(&err) => Ok(()),
        Err(err) => Err(err),
    }
}

async fn cordon(state: &mut NodeState) -> Result<(), kube::Error> {
    if we_cordon(&state.request) {
        set_unschedulable(state, true).await?;
    }
    let spec = &state.request.spec;
    let (next, message) = if spec.wait_for_pod_completion.is_some() {
        (Phase::WaitForPodCompletion, "")
    } else if spec.drain_spec.is_some() {
        (Phase::Draining, "")
    } else {
        (Phase::Ready, "no drain requested")
    };
    advance(state, next, message).await
}

fn ensure_pod_watch(myself: &ActorRef<NodeMsg>, state: &mut NodeState) -> Option<Store<Pod>> {
    if let Some(watch) = &state.pods {
        return watch
            .synced
            .load(Ordering::Acquire)
            .then(|| watch.store.clone());
    }
    let api: Api<Pod> = Api::all(state.ctx.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", state.node()));
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, config).modify(|pod| {
            pod.managed_fields_mut().clear();
        }),
    )
    .default_backoff()
    .touched_objects();
    let actor = myself.clone();
    let node = state.node().to_string();
    let queued = Arc::new(AtomicBool::new(false));
    let queued_flag = queued.clone();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            if let Err(err) = event {
                tracing::debug!(%node, %err, "pod watch error; the watcher retries");
                continue;
            }
            // The reflector stored the event before yielding it, so the next read sees it.
            if !queued_flag.swap(true, Ordering::AcqRel) {
                let _ = actor.cast(NodeMsg::PodsChanged);
            }
        }
    });
    let ready_store = store.clone();
    let actor = myself.clone();
    let synced = Arc::new(AtomicBool::new(false));
    let synced_flag = synced.clone();
    let ready_task = tokio::spawn(async move {
        if ready_store.wait_until_ready().await.is_ok() {
            synced_flag.store(true, Ordering::Release);
            let _ = actor.cast(NodeMsg::PodsChanged);
        }
    });
    state.pods = Some(PodWatch {
        store,
        queued,
        synced,
        _task: AbortOnDrop(task),
        _ready: AbortOnDrop(ready_task),
    });
    None
}

fn elapsed_in_phase(request: &NodeMaintenance) -> Duration {
    conditions::phase_since(request)
        .map(|since| {
            let secs = jiff::Timestamp::now().duration_since(since).as_secs_f64();
            Duration::from_secs_f64(secs.max(0.0))
        })
        .unwrap_or_default()
}

fn phase_after_wait(request: &NodeMaintenance) -> Phase {
    if request.spec.drain_spec.is_some() {
        Phase::Draining
    } else {
        Phase::Ready
    }
}

async fn wait_for_completion(
    myself: &ActorRef<NodeMsg>,
    state: &mut NodeState,
) -> Result<(), kube::Error> {
    let Some(store) = ensure_pod_watch(myself, state) else {
        return Ok(());
    };
    let spec = state
        .request
        .spec
        .wait_for_pod_completion
        .clone()
        .unwrap_or_default();
    let rules = match CompletionRules::new(&spec) {
        Ok(rules) => rules,
        Err(err) => {
            return report_spec_error(state, &err.to_string()).await;
        }
    };
    let pods: Vec<Pod> = store.state().iter().map(|p| (**p).clone()).collect();
    let waiting: Vec<String> = drain_plan::pods_to_wait_for(&rules, &pods)
        .iter()
        .map(|p| p.key())
        .collect();
    let next = phase_after_wait(&state.request);
    if waiting.is_empty() {
        return advance_with(state, next, "", |s| s.wait_for_completion.clear()).await;
    }
    let timeout = spec.timeout_seconds();
    let elapsed = elapsed_in_phase(&state.request);
    if timeout > 0 && elapsed >= Duration::from_secs(u64::from(timeout)) {
        let note = format!(
            "waited {timeout}s for pod completion; {} pod(s) still running ({}); moving on",
            waiting.len(),
            waiting.join(", ")
        );
        state
            .ctx
            .event(&state.request, true, "WaitForPodCompletionTimeout", note)
            .await;
        return advance_with(state, next, "wait for pod completion timed out", |s| {
            s.wait_for_completion.clear()
        })
        .await;
    }
    if timeout > 0 {
        let left = Duration::from_secs(u64::from(timeout)).saturating_sub(elapsed);
        state.schedule_step(myself, left + Duration::from_millis(100));
    }
    let current = state
        .request
        .status
        .as_ref()
        .map(|s| s.wait_for_completion.clone())
        .unwrap_or_default();
    if current != waiting {
        let mut status = state.request.status.clone().unwrap_or_default();
        status.wait_for_completion = waiting;
        write_status(state, status).await?;
    }
    Ok(())
}

/// A spec the operator cannot act on (bad selector or regex): say so in the Failed condition.
async fn report_spec_error(state: &mut NodeState, message: &str) -> Result<(), kube::Error> {
    if state
        .request
        .condition(condition_type::FAILED)
        .is_some_and(|c| c.message == message)
    {
        return Ok(());
    }
    let mut status = state.request.status.clone().unwrap_or_default();
    conditions::upsert_condition(
        &mut status.conditions,
        condition_type::FAILED,
        true,
        "InvalidSpec",
        message,
        jiff::Timestamp::now(),
        state.request.metadata.generation,
    );
    let request = state.request.clone();
    state
        .ctx
        .event(&request, true, "InvalidSpec", message.to_string())
        .await;
    write_status(state, status).await
}

async fn write_status(
    state: &mut NodeState,
    status: NodeMaintenanceStatus,
) -> Result<(), kube::Error> {
    let updated = state.ctx.write_status(&state.request, &status).await?;
    state.request = Arc::new(updated);
    state.last_status_write = Some(Instant::now());
    Ok(())
}

fn record_eviction(
    state: &mut NodeState,
    key: String,
    uid: Option<String>,
    outcome: EvictionOutcome,
) {
    let Some(entry) = state.evictions.get_mut(&key) else {
        return;
    };
    if entry.uid != uid {
        return;
    }
    entry.in_flight = false;
    tracing::debug!(pod = %key, attempt = entry.attempts, outcome = ?outcome, "eviction answered");
    match &outcome {
        EvictionOutcome::Evicted | EvictionOutcome::Gone => {
            entry.accepted = true;
            state.last_progress = Instant::now();
        }
        EvictionOutcome::Refused { .. }
        | EvictionOutcome::MultiplePdbs { .. }
        | EvictionOutcome::Error { .. } => {
            let delay = entry.backoff.next().unwrap_or(EVICTION_MAX_BACKOFF);
            entry.next_attempt = Instant::now() + delay;
        }
    }
    entry.last = Some(outcome);
}

fn new_backoff() -> Box<dyn Iterator<Item = Duration> + Send + Sync> {
    use backon::BackoffBuilder;
    Box::new(
        backon::ExponentialBuilder::default()
            .with_min_delay(EVICTION_MIN_BACKOFF)
            .with_max_delay(EVICTION_MAX_BACKOFF)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build(),
    )
}

fn blocked_entry(ctx: &Context, key: &str, entry: &PodEviction) -> Option<BlockedPod> {
    let namespace = key.split('/').next().unwrap_or_default();
    let describe = |pdb: &str| match ctx.pdbs.current(namespace, pdb) {
        Some(summary) => format!("PodDisruptionBudget {namespace}/{pdb} ({summary})"),
        None => format!("PodDisruptionBudget {namespace}/{pdb}"),
    };
    let (reason, message) = match entry.last.as_ref()? {
        EvictionOutcome::Refused { pdb, message } => (
            "PDB",
            match pdb {
                Some(pdb) => format!(
                    "{} allows no disruption now; retrying when it changes ({message})",
                    describe(pdb)
                ),
                None => format!("eviction refused: {message}"),
            },
        ),
        EvictionOutcome::MultiplePdbs { message } => (
            "MultiplePDBs",
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
            "Error",
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
        reason: reason.to_string(),
        message,
    })
}

/// The PDBs that select a pod (for the "several PDBs" case, which the API server does not name).
async fn covering_pdbs(
    ctx: &Context,
    namespace: &str,
    pod_labels: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<String>, kube::Error> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), namespace);
    let mut names: Vec<String> = api
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|pdb| {
            pdb.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|sel| label_selector::matches_label_selector(sel, pod_labels))
        })
        .map(|pdb| pdb.name_any())
        .collect();
    names.sort();
    Ok(names)
}

/// Keeps one PDB subscription per PDB that blocks one of our pods, and drops the others.
fn sync_pdb_subscriptions(myself: &ActorRef<NodeMsg>, state: &mut NodeState) {
    let mut wanted: HashSet<(String, String)> = HashSet::new();
    for (key, entry) in &state.evictions {
        let namespace = key.split('/').next().unwrap_or_default().to_string();
        match &entry.last {
            Some(EvictionOutcome::Refused { pdb: Some(pdb), .. }) => {
                wanted.insert((namespace, pdb.clone()));
            }
            Some(EvictionOutcome::MultiplePdbs { .. }) => {
                for pdb in &entry.covering_pdbs {
                    wanted.insert((namespace.clone(), pdb.clone()));
                }
            }
            _ => {}
        }
    }
    state.pdb_watches.retain(|key, _| wanted.contains(key));
    for (namespace, name) in wanted {
        if state
            .pdb_watches
            .contains_key(&(namespace.clone(), name.clone()))
        {
            continue;
        }
        let mut changes = state.ctx.pdbs.subscribe(&namespace, &name);
        // The PDB may have changed between the refusal and now: look at its current state first.
        changes.mark_changed();
        let actor = myself.clone();
        let (ns, pdb) = (namespace.clone(), name.clone());
        let task = tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let allows = changes
                    .borrow_and_update()
                    .as_ref()
                    .is_none_or(|s| s.disruptions_allowed > 0);
                if allows
                    && actor
                        .cast(NodeMsg::PdbChanged {
                            namespace: ns.clone(),
                            name: pdb.clone(),
                        })
                        .is_err()
                {
                    break;
                }
            }
        });
        state
            .pdb_watches
            .insert((namespace, name), AbortOnDrop(task));
    }
}

/// A PDB now allows a disruption (or is gone): retry the pods it blocked at once, as many as
/// the shared tokens allow (the other waiters keep their backoff).
fn wake_blocked_by(state: &mut NodeState, namespace: &str, name: &str) {
    let now = Instant::now();
    let prefix = format!("{namespace}/");
    let mut waiting: Vec<&String> = state
        .evictions
        .iter()
        .filter(|(key, entry)| {
            key.starts_with(&prefix)
                && !entry.in_flight
                && entry.next_attempt > now
                && match &entry.last {
                    Some(EvictionOutcome::Refused { pdb: Some(pdb), .. }) => pdb == name,
                    Some(EvictionOutcome::MultiplePdbs { .. }) => {
                        entry.covering_pdbs.iter().any(|p| p == name)
                    }
                    _ => false,
                }
        })
        .map(|(key, _)| key)
        .collect();
    waiting.sort();
    let woken: Vec<String> = waiting
        .into_iter()
        .take_while(|_| state.ctx.pdbs.claim(namespace, name))
        .cloned()
        .collect();
    for key in woken {
        if let Some(entry) = state.evictions.get_mut(&key) {
            entry.next_attempt = now;
        }
    }
}

async fn drain(myself: &ActorRef<NodeMsg>, state: &mut NodeState) -> Result<(), kube::Error> {
    let Some(store) = ensure_pod_watch(myself, state) else {
        return Ok(());
    };
    let spec = state.request.spec.drain_spec.clone().unwrap_or_default();
    let rules = match DrainRules::new(&spec, Some(state.ctx.identity.clone())) {
        Ok(rules) => rules,
        Err(err) => return report_spec_error(state, &err.to_string()).await,
    };
    let pods: Vec<Pod> = store.state().iter().map(|p| (**p).clone()).collect();
    let plan = drain_plan::plan(&rules, &pods);

    // Pods we evicted that still exist with the same UID are still terminating: wait for them.
    let live: HashMap<String, Option<String>> = pods
        .iter()
        .map(|p| {
            (
                format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
                p.uid(),
            )
        })
        .collect();
    state
        .evictions
        .retain(|key, e| live.get(key).is_some_and(|uid| *uid == e.uid));

    let now = Instant::now();
    let mut wake_at: Option<Instant> = None;
    let timed_out = timed_out(&state.request, &spec);
    for pod in &plan.to_evict {
        let key = pod.key();
        let entry = state
            .evictions
            .entry(key.clone())
            .or_insert_with(|| PodEviction {
                uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
                attempts: 0,
                in_flight: false,
                accepted: false,
                next_attempt: now,
                backoff: new_backoff(),
                last: None,
                covering_pdbs: Vec::new(),
                labels: pods
                    .iter()
                    .find(|p| p.uid().as_deref() == Some(pod.uid.as_str()))
                    .and_then(|p| p.metadata.labels.clone())
                    .unwrap_or_default(),
            });
        if entry.in_flight || entry.accepted {
            continue;
        }
        if entry.next_attempt > now {
            wake_at = Some(wake_at.map_or(entry.next_attempt, |w| w.min(entry.next_attempt)));
            continue;
        }
        entry.in_flight = true;
        let is_retry = entry.attempts > 0;
        entry.attempts += 1;
        if timed_out {
            // After the timeout keep trying, slowly, so the request recovers by itself.
            entry.backoff = Box::new(std::iter::repeat(SLOW_RETRY));
        }
        let ctx = state.ctx.clone();
        let actor = myself.clone();
        let (namespace, name, uid) = (pod.namespace.clone(), pod.name.clone(), entry.uid.clone());
        tokio::spawn(async move {
            let outcome = ctx
                .evictor
                .evict(&namespace, &name, uid.as_deref(), is_retry)
                .await;
            let _ = actor.cast(NodeMsg::Evicted { key, uid, outcome });
        });
    }
    if let Some(at) = wake_at {
        state.schedule_step(myself, at.saturating_duration_since(now));
    }

    // The API server's 500 does not name the PDBs: look them up once per pod.
    for (key, entry) in state.evictions.iter_mut() {
        if matches!(entry.last, Some(EvictionOutcome::MultiplePdbs { .. }))
            && entry.covering_pdbs.is_empty()
        {
            let namespace = key.split('/').next().unwrap_or_default();
            entry.covering_pdbs = covering_pdbs(&state.ctx, namespace, &entry.labels).await?;
        }
    }
    sync_pdb_subscriptions(myself, state);

    let mut blocked: Vec<BlockedPod> = plan
        .blocked
        .iter()
        .map(|(pod, reason)| reason.to_blocked_pod(pod))
        .collect();
    // Terminating pods (evicted by us, even before a restart, or by anyone) are waited for
    // until their object is gone: the node is not drained while they still run.
    let terminating: Vec<String> = plan
        .skipped
        .iter()
        .filter(|(_, why)| matches!(why, drain_plan::SkipReason::Terminating))
        .map(|(p, _)| p.key())
        .collect();
    let mut remaining: Vec<String> = plan
        .to_evict
        .iter()
        .map(|p| p.key())
        .chain(plan.blocked.iter().map(|(p, _)| p.key()))
        .chain(terminating.iter().cloned())
        .collect();
    for (key, entry) in &state.evictions {
        if let Some(b) = blocked_entry(&state.ctx, key, entry)
            && !terminating.contains(key)
        {
            blocked.push(b);
        }
    }
    for key in &terminating {
        blocked.push(BlockedPod {
            pod: key.clone(),
            reason: "Terminating".to_string(),
            message: "evicted; waiting for the pod to terminate".to_string(),
        });
    }
    remaining.sort();
    blocked.sort_by(|a, b| a.pod.cmp(&b.pod));
    tracing::debug!(
        request = %state.key(),
        pods = pods.len(),
        to_evict = plan.to_evict.len(),
        blocked = plan.blocked.len(),
        terminating = terminating.len(),
        "drain step"
    );
    update_pdb_metrics(state);

    let previous = state.request.status.as_ref().and_then(|s| s.drain.clone());
    // The counts only grow during a drain: remembered here between throttled status writes, and
    // read back from the status after a restart.
    let eviction_pods = previous
        .as_ref()
        .map_or(0, |d| usize::try_from(d.eviction_pods).unwrap_or(0))
        .max(state.drain_counts.1)
        .max(remaining.len());
    let total_pods = previous
        .as_ref()
        .map_or(0, |d| usize::try_from(d.total_pods).unwrap_or(0))
        .max(state.drain_counts.0)
        .max(plan.total_pods);
    state.drain_counts = (total_pods, eviction_pods);
    // The first drain status goes out at once, before pods start to disappear.
    if previous.is_none() {
        state.last_status_write = None;
    }
    let drain_status = DrainStatus {
        total_pods: i32::try_from(total_pods).unwrap_or(i32::MAX),
        eviction_pods: i32::try_from(eviction_pods).unwrap_or(i32::MAX),
        drain_progress: drain_plan::drain_progress(eviction_pods, remaining.len()),
        wait_for_eviction: remaining.clone(),
        blocked: blocked.clone(),
    };
    if state.last_remaining != Some(remaining.len()) {
        state.last_remaining = Some(remaining.len());
        state.last_progress = Instant::now();
    }
    state
        .ctx
        .metrics
        .seconds_since_progress
        .with_label_values(&[state.node()])
        .set(state.last_progress.elapsed().as_secs_f64());

    if remaining.is_empty() {
        let drained_for = elapsed_in_phase(&state.request);
        state
            .ctx
            .metrics
            .drain_duration_seconds
            .observe(drained_for.as_secs_f64());
        clear_metrics(state);
        return advance_with(state, Phase::Ready, "", |s| {
            s.drain = Some(drain_status);
            conditions::remove_condition(&mut s.conditions, condition_type::FAILED);
        })
        .await;
    }

    let mut status = state.request.status.clone().unwrap_or_default();
    let mut changed = status.drain.as_ref() != Some(&drain_status);
    status.drain = Some(drain_status);
    if timed_out && state.request.condition(condition_type::FAILED).is_none() {
        let message = timeout_message(&spec, &blocked, &remaining);
        conditions::upsert_condition(
            &mut status.conditions,
            condition_type::FAILED,
            true,
            "DrainTimeout",
            &message,
            jiff::Timestamp::now(),
            state.request.metadata.generation,
        );
        let request = state.request.clone();
        state
            .ctx
            .event(&request, true, "DrainTimeout", message)
            .await;
        changed = true;
        // A timeout is worth writing at once.
        state.last_status_write = None;
    }
    // A heartbeat keeps seconds_since_progress and the timeout current when nothing else happens.
    state.schedule_step(myself, HEARTBEAT);
    if !timed_out && spec.timeout_seconds() > 0 {
        let left = Duration::from_secs(u64::from(spec.timeout_seconds()))
            .saturating_sub(elapsed_in_phase(&state.request));
        state.schedule_step(myself, left + Duration::from_millis(100));
    }
    if changed {
        let since_write = state.last_status_write.map(|t| t.elapsed());
        match since_write {
            Some(since) if since < STATUS_WRITE_INTERVAL => {
                state.schedule_step(myself, STATUS_WRITE_INTERVAL - since);
            }
            _ => write_status(state, status).await?,
        }
    }
    Ok(())
}

fn timed_out(request: &NodeMaintenance, spec: &maintenance_crds::DrainSpec) -> bool {
    let timeout = spec.timeout_seconds();
    timeout > 0 && elapsed_in_phase(request) >= Duration::from_secs(u64::from(timeout))
}

fn timeout_message(
    spec: &maintenance_crds::DrainSpec,
    blocked: &[BlockedPod],
    remaining: &[String],
) -> String {
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
        spec.timeout_seconds(),
        remaining.len(),
        parts.join("; ")
    )
}

fn update_pdb_metrics(state: &mut NodeState) {
    let mut now: HashMap<(String, String), f64> = HashMap::new();
    for (key, entry) in &state.evictions {
        if let Some(EvictionOutcome::Refused { pdb: Some(pdb), .. }) = &entry.last {
            let namespace = key.split('/').next().unwrap_or_default().to_string();
            *now.entry((namespace, pdb.clone())).or_default() += 1.0;
        }
    }
    let gauge = &state.ctx.metrics.pods_blocked_by_pdb;
    for ((ns, pdb), count) in &state.reported_pdbs {
        let new = now.get(&(ns.clone(), pdb.clone())).copied().unwrap_or(0.0);
        if new != *count {
            gauge.with_label_values(&[ns, pdb]).sub(count - new);
        }
    }
    for ((ns, pdb), count) in &now {
        if !state.reported_pdbs.contains_key(&(ns.clone(), pdb.clone())) {
            gauge.with_label_values(&[ns, pdb]).add(*count);
        }
    }
    state.reported_pdbs = now;
}

fn clear_metrics(state: &mut NodeState) {
    state.evictions.clear();
    state.pdb_watches.clear();
    update_pdb_metrics(state);
    let _ = state
        .ctx
        .metrics
        .seconds_since_progress
        .remove_label_values(&[state.node()]);
}

/// Deletion: wait for additional requestors, uncordon only if we cordoned, drop the finalizer.
async fn cleanup(myself: &ActorRef<NodeMsg>, state: &mut NodeState) -> Result<(), kube::Error> {
    state.pods = None;
    clear_metrics(state);
    if !state.request.finalizers().iter().any(|f| f == FINALIZER) {
        myself.stop(Some("request deleted".into()));
        return Ok(());
    }
    let others = state.request.spec.additional_requestors();
    if !others.is_empty() {
        // The node stays in maintenance until every requestor has let go.
        let message = format!(
            "deletion waits for additionalRequestors to be removed: {}",
            others.join(", ")
        );
        let current = state.request.condition(condition_type::READY);
        if current.is_none_or(|c| c.message != message) {
            let mut status = state.request.status.clone().unwrap_or_default();
            let phase = state.request.phase();
            conditions::set_phase(
                &mut status.conditions,
                phase,
                &message,
                jiff::Timestamp::now(),
                state.request.metadata.generation,
            );
            write_status(state, status).await?;
        }
        return Ok(());
    }
    if we_cordon(&state.request) {
        set_unschedulable(state, false).await?;
        let note = format!("uncordoned {}", state.node());
        let request = state.request.clone();
        state.ctx.event(&request, false, "Uncordon", note).await;
    }
    let finalizers: Vec<String> = state
        .request
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": state.request.resource_version(),
            "finalizers": finalizers,
        }
    });
    match request_api(state)
        .patch(
            &state.request.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {}
        Err(err) if is_not_found(&err) => {}
        Err(err) => return Err(err),
    }
    let phase = state.request.phase();
    if let Some(since) = conditions::phase_since(&state.request) {
        let seconds = jiff::Timestamp::now()
            .duration_since(since)
            .as_secs_f64()
            .max(0.0);
        state
            .ctx
            .metrics
            .phase_duration_seconds
            .with_label_values(&[phase.as_str()])
            .observe(seconds);
    }
    tracing::info!(request = %state.key(), node = %state.node(), "maintenance finished; finalizer removed");
    myself.stop(Some("maintenance finished".into()));
    Ok(())
}
