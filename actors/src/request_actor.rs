//! One actor per NodeMaintenance in progress: the I/O shell around the pure lifecycle step
//! (`maintenance_core::lifecycle`). It observes the node, the pods on it and the PDBs that block
//! them, asks the step what to do, and executes it: cordon, evictions, status, events, the
//! finalizer. It holds no lifecycle decision of its own; what it remembers (the eviction ledger)
//! costs at most one extra call to lose, so a restarted actor (or operator) resumes from the
//! object. It tells the ledger what it learns as `LedgerEvent`s, and does what the ledger's
//! outlook asks (the PDBs to watch, the covering PDBs to look up, the calls to cancel).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use maintenance_core::actor_runs::RunEnd;
use maintenance_core::conditions::annotation_value;
use maintenance_core::cordon_mark;
use maintenance_core::drain_plan;
use maintenance_core::eviction::{DeleteOutcome, EvictionOutcome};
use maintenance_core::failed_step::{self, StepCall};
use maintenance_core::lifecycle::{
    self, Action, EventReason, EvictionOrder, ForceDeleteOrder, Ledger, LedgerEvent, LedgerOutlook,
    NodeView, Observed, Step,
};
use maintenance_core::machine_config_pool::{self as mcp, PoolObservation};
use maintenance_core::notifications::{Detail, NotificationEvent};
use maintenance_core::pod_view::CachedPod;
use maintenance_crds::{
    ADMITTED_TIME_ANNOTATION, FINALIZER, INITIAL_UNSCHEDULABLE_ANNOTATION, NodeMaintenance,
    READY_TIME_ANNOTATION,
};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;

use crate::context::{Context, api_message, api_status_code, is_conflict, is_not_found};
use crate::evictor::QueuedEviction;
use crate::openshift;
use crate::task::AbortOnDrop;
use crate::watch_connections::WatchSlot;
use tokio_util::sync::{CancellationToken, DropGuard};

/// The reason a request actor stops with when its request needs nothing more (cleanup done): the
/// supervisor releases the request's slot on it, without waiting for the cache.
pub const MAINTENANCE_FINISHED: &str = "maintenance finished";

pub enum RequestMsg {
    /// The supervisor saw a newer version of the request.
    Updated(Arc<NodeMaintenance>),
    /// Run the step again (timers).
    Step,
    /// Pods on the node changed (coalesced: one in the mailbox stands for any number of events).
    PodsChanged,
    /// A PDB that blocked one of our pods now allows a disruption.
    PdbChanged { namespace: String, name: String },
    /// One eviction call finished (`call` numbers the calls the actor keeps in flight).
    Evicted {
        key: String,
        uid: Option<String>,
        call: u64,
        outcome: EvictionOutcome,
    },
    /// One deletion past the escalation deadline finished.
    ForceDeleted {
        key: String,
        uid: Option<String>,
        call: u64,
        outcome: DeleteOutcome,
    },
    /// The supervisor's cache no longer shows the request (or shows it without our finalizer)
    /// while this actor still runs: the request went without our cleanup.
    RequestGone,
}

pub struct RequestActor;

pub struct RequestArgs {
    pub ctx: Arc<Context>,
    pub request: Arc<NodeMaintenance>,
    /// The supervisor's node cache (read-only here).
    pub nodes: Store<Node>,
    /// Where the actor leaves how its run ended before it stops itself, for the supervisor to
    /// read (`actor_runs`): which versions of the request may start another actor.
    pub end: Arc<OnceLock<RunEnd>>,
}

/// The actor's gauges go when its state does: on a stop, and also on a panic, after which ractor
/// runs no `post_stop` (the node-actor count and the request's series would stay for good).
impl Drop for RequestActorState {
    fn drop(&mut self) {
        self.ctx.metrics.process.node_actors.dec();
        // An actor that is gone blocks nothing and watches no progress.
        report_metrics(self, BTreeMap::new(), None);
    }
}

pub struct RequestActorState {
    ctx: Arc<Context>,
    request: Arc<NodeMaintenance>,
    nodes: Store<Node>,
    end: Arc<OnceLock<RunEnd>>,
    /// The request went without our cleanup (see `lifecycle::on_request_gone`): what it did to
    /// the node is undone, then the actor stops.
    gone: bool,
    pods: Option<PodWatch>,
    ledger: Ledger,
    next_step_at: Option<Instant>,
    consecutive_errors: u32,
    /// Pods per blocking PDB this actor added to the shared gauge, so it can take them back.
    reported_pdbs: BTreeMap<(String, String), usize>,
    /// Subscriptions to the PDBs that block our pods now.
    pdb_watches: HashMap<(String, String), AbortOnDrop>,
    /// The node whose progress gauge this actor set.
    progress_reported: bool,
    /// Eviction and deletion calls running, by pod key; dropping one cancels it if it has not
    /// been sent yet (and so does stopping the actor).
    calls: HashMap<String, RunningCall>,
    next_call: u64,
    /// The pools lock (`Context::pools_lock`), while a step that read its node's pool executes.
    pool_lock: Option<tokio::sync::OwnedMutexGuard<()>>,
}

/// A call started by this actor: `id` tells its answer from a later call's for the same pod.
struct RunningCall {
    id: u64,
    _cancel: DropGuard,
}

struct PodWatch {
    store: Store<CachedPod>,
    /// True while a PodsChanged waits in the mailbox; cleared when it is handled, so an event
    /// that arrives after the actor read the store always queues another.
    queued: Arc<AtomicBool>,
    /// Set once the first list arrived: before that an empty store means nothing.
    synced: Arc<AtomicBool>,
    _task: AbortOnDrop,
    _ready: AbortOnDrop,
    /// The watch's place on its connection.
    _slot: WatchSlot,
}

impl RequestActorState {
    /// A fresh actor's state; counted in the node-actor gauge until it is dropped.
    fn new(args: RequestArgs) -> Self {
        args.ctx.metrics.process.node_actors.inc();
        RequestActorState {
            ctx: args.ctx,
            request: args.request,
            nodes: args.nodes,
            end: args.end,
            gone: false,
            pods: None,
            ledger: Ledger::default(),
            next_step_at: None,
            consecutive_errors: 0,
            reported_pdbs: BTreeMap::new(),
            pdb_watches: HashMap::new(),
            progress_reported: false,
            calls: HashMap::new(),
            next_call: 0,
            pool_lock: None,
        }
    }

    fn key(&self) -> String {
        self.request.key()
    }

    fn node(&self) -> &str {
        &self.request.spec.node_name
    }

    /// Registers a new call for `key`: its id, and the token that cancels it.
    fn start_call(&mut self, key: &str) -> (u64, CancellationToken) {
        self.next_call += 1;
        let token = CancellationToken::new();
        self.calls.insert(
            key.to_string(),
            RunningCall {
                id: self.next_call,
                _cancel: token.clone().drop_guard(),
            },
        );
        (self.next_call, token)
    }

    /// The answer of call `id` for `key` arrived: it no longer runs.
    fn call_answered(&mut self, key: &str, id: u64) {
        if self.calls.get(key).is_some_and(|call| call.id == id) {
            self.calls.remove(key);
        }
    }

    /// Runs the step again after `after`, keeping only the earliest pending timer.
    fn schedule_step(&mut self, myself: &ActorRef<RequestMsg>, after: Duration) {
        let at = Instant::now() + after;
        if self.next_step_at.is_some_and(|pending| pending <= at) {
            return;
        }
        self.next_step_at = Some(at);
        myself.send_after(after, || RequestMsg::Step);
    }

    /// Takes in what a message says; every message is followed by a step, which acts on it.
    fn take_in(&mut self, msg: RequestMsg, now: jiff::Timestamp) {
        let learned = match msg {
            RequestMsg::Updated(request) => {
                if lifecycle::is_newer_version(&request, &self.request) {
                    self.request = request;
                }
                None
            }
            RequestMsg::Step => {
                if self.next_step_at.is_some_and(|at| at <= Instant::now()) {
                    self.next_step_at = None;
                }
                None
            }
            RequestMsg::PodsChanged => {
                if let Some(watch) = &self.pods {
                    watch.queued.store(false, Ordering::Release);
                }
                None
            }
            RequestMsg::PdbChanged { namespace, name } => {
                Some(LedgerEvent::PdbChanged { namespace, name })
            }
            RequestMsg::Evicted {
                key,
                uid,
                call,
                outcome,
            } => {
                tracing::debug!(pod = %key, outcome = ?outcome, "eviction answered");
                self.call_answered(&key, call);
                Some(LedgerEvent::EvictionAnswered {
                    key,
                    uid,
                    outcome,
                    jitter: rand::random::<f64>(),
                })
            }
            RequestMsg::RequestGone => {
                self.gone = true;
                None
            }
            RequestMsg::ForceDeleted {
                key,
                uid,
                call,
                outcome,
            } => {
                tracing::debug!(pod = %key, outcome = ?outcome, "deletion past the deadline answered");
                self.call_answered(&key, call);
                Some(LedgerEvent::ForceDeleteAnswered {
                    key,
                    uid,
                    outcome,
                    jitter: rand::random::<f64>(),
                })
            }
        };
        if let Some(event) = learned {
            // No answer or budget change names a call to cancel; the step after it settles them.
            self.ledger.observe(event, now);
        }
    }
}

impl Actor for RequestActor {
    type Msg = RequestMsg;
    type State = RequestActorState;
    type Arguments = RequestArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RequestMsg>,
        args: RequestArgs,
    ) -> Result<RequestActorState, ActorProcessingErr> {
        let state = RequestActorState::new(args);
        let _ = myself.cast(RequestMsg::Step);
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<RequestMsg>,
        msg: RequestMsg,
        state: &mut RequestActorState,
    ) -> Result<(), ActorProcessingErr> {
        let now = jiff::Timestamp::now();
        state.take_in(msg, now);
        match run_step(&myself, state).await {
            Ok(()) => state.consecutive_errors = 0,
            Err(failed) => retry_failed_step(&myself, state, failed, now).await,
        }
        Ok(())
    }
}

/// A step failed: it runs again after a delay that grows with the failures in a row. A stale
/// request is read again first; any other failure is reported.
async fn retry_failed_step(
    myself: &ActorRef<RequestMsg>,
    state: &mut RequestActorState,
    failed: StepError,
    now: jiff::Timestamp,
) {
    let StepError { call, err } = failed;
    state.consecutive_errors += 1;
    // A conflict: someone else wrote the object. Not found: the request (or its node) is gone.
    // Either way the request is read again.
    let stale = is_conflict(&err) || is_not_found(&err);
    let delay = lifecycle::retry_after_failed_step(stale, state.consecutive_errors);
    if stale {
        // Read it again and go on; a request that is gone meanwhile (our finalizer was the last)
        // needs nothing more.
        if !refresh(state).await {
            state.gone = true;
        }
    } else {
        report_failed_step(state, call, &err, delay, now).await;
    }
    state.schedule_step(myself, delay);
}

/// Tells of a failed step: in the log and the error metric always, in a Warning Event once it
/// keeps failing, and in the request's status when the lifecycle says so.
async fn report_failed_step(
    state: &mut RequestActorState,
    call: Option<StepCall>,
    err: &kube::Error,
    delay: Duration,
    now: jiff::Timestamp,
) {
    let failure = failed_step::message(
        call,
        state.node(),
        api_status_code(err),
        &api_message(err),
        delay,
    );
    tracing::warn!(request = %state.key(), node = %state.node(), %failure, "maintenance step failed; retrying");
    state.ctx.error("node_step");
    if failed_step::reported(state.consecutive_errors) {
        let request = state.request.clone();
        state.ctx.event(
            &request,
            true,
            EventReason::StepFailed.as_str(),
            failure.clone(),
        );
    }
    if let Some(write) = lifecycle::status_after_failed_step(&state.request, &failure, now) {
        match state.ctx.apply_status_write(&state.request, &write).await {
            Ok(updated) => state.request = Arc::new(updated),
            Err(err) => {
                tracing::warn!(request = %state.key(), %err, "could not show the failed step in the status");
            }
        }
    }
}

/// Reads the request again; false when it no longer exists.
async fn refresh(state: &mut RequestActorState) -> bool {
    match request_api(state).get_opt(&state.request.name_any()).await {
        // A request re-created under the same name is another request, with its own actor.
        Ok(Some(fresh)) if fresh.uid() == state.request.uid() => {
            state.request = Arc::new(fresh);
            true
        }
        Ok(_) => false,
        Err(err) => {
            tracing::warn!(request = %state.key(), %err, "could not re-read request");
            true
        }
    }
}

fn node_api(state: &RequestActorState) -> Api<Node> {
    Api::all(state.ctx.client.clone())
}

fn request_api(state: &RequestActorState) -> Api<NodeMaintenance> {
    Api::namespaced(
        state.ctx.client.clone(),
        &state.request.namespace().unwrap_or_default(),
    )
}

/// The node from the shared cache, or from the API server when the step needs it fresh or the
/// cache says it is gone (releasing a request is not decided on a lagging cache).
async fn observe_node(state: &RequestActorState) -> Result<NodeView, kube::Error> {
    if !lifecycle::needs_fresh_node(&state.request)
        && let Some(node) = state.nodes.get(&ObjectRef::new(state.node()))
    {
        return Ok(NodeView::of(Some(&node)));
    }
    let node = node_api(state).get_opt(state.node()).await?;
    Ok(NodeView::of(node.as_ref()))
}

/// Whether MachineConfigPools are paused: the config's setting, and for `Auto` the detection,
/// made again when [`mcp::pools_on`] says so (NVIDIA detects once, at start, in
/// cmd/maintenance-manager/main.go).
async fn pools_enabled(state: &RequestActorState) -> Result<bool, StepError> {
    let ctx = &state.ctx;
    let now = jiff::Timestamp::now();
    let last = *ctx
        .openshift_detection
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match mcp::pools_on(ctx.machine_config_pools(), last, now) {
        mcp::PoolsOn::Yes => Ok(true),
        mcp::PoolsOn::No => Ok(false),
        mcp::PoolsOn::Detect => {
            let found = openshift::detect(&ctx.client)
                .await
                .map_err(|err| StepError {
                    call: Some(StepCall::DetectOpenShift),
                    err,
                })?;
            let on = found == mcp::Detection::OpenShift;
            if last.map(|(before, _)| before) != Some(found) {
                tracing::info!(cluster = %found, machine_config_pools = on, "detected the cluster type (openshift.machineConfigPools: Auto)");
            }
            *ctx.openshift_detection
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((found, now));
            Ok(on)
        }
    }
}

/// The pool of the node, from the node as the API server has it (the cache keeps no
/// annotations).
async fn observe_pool(state: &RequestActorState) -> Result<PoolObservation, kube::Error> {
    match node_api(state).get_opt(state.node()).await? {
        Some(node) => openshift::observe_pool(&state.ctx.client, &node).await,
        None => Ok(PoolObservation::Unresolved(
            mcp::Unresolved::NoDesiredConfig,
        )),
    }
}

/// The release of a request that labelled `pool` (NVIDIA's `UnpauseMCP`): the pool and the
/// requests that hold it are read under the pools lock, and the pool is unpaused when the core
/// says so.
async fn release_pool(state: &RequestActorState, pool: &str) -> Result<(), kube::Error> {
    let _lock = match state.pool_lock {
        Some(_) => None,
        None => Some(state.ctx.pools_lock.clone().lock_owned().await),
    };
    let client = &state.ctx.client;
    let view = openshift::read_pool(client, pool).await?;
    let holders = match &view {
        Some(view) if view.paused_by_us => openshift::holders(client, pool).await?,
        _ => Vec::new(),
    };
    let me = state.request.metadata.uid.as_deref();
    match (mcp::release_verdict(view.as_ref(), me, &holders), &view) {
        (mcp::ReleaseVerdict::Unpause, Some(view)) => {
            openshift::set_paused(client, view, false).await?;
            tracing::info!(request = %state.key(), %pool, "unpaused the MachineConfigPool: its last request ended");
            let request = state.request.clone();
            state.ctx.event(
                &request,
                false,
                EventReason::MachineConfigPoolUnpaused.as_str(),
                format!("unpaused MachineConfigPool {pool}: its last request ended"),
            );
        }
        (verdict, _) => {
            tracing::debug!(request = %state.key(), %pool, ?verdict, "the MachineConfigPool stays as it is");
        }
    }
    Ok(())
}

/// A call of a step failed.
struct StepError {
    /// Which (`None`: one that names no call).
    call: Option<StepCall>,
    err: kube::Error,
}

/// One step: observe, decide (pure), execute.
async fn run_step(
    myself: &ActorRef<RequestMsg>,
    state: &mut RequestActorState,
) -> Result<(), StepError> {
    let node = observe_node(state).await.map_err(|err| StepError {
        call: Some(StepCall::ReadNode),
        err,
    })?;
    // The node's MachineConfigPool, for the step that cordons, when pools are paused; the pools
    // lock is held from this read to the step's writes.
    let mut pool_lock = None;
    let pool = if !state.gone
        && node != NodeView::Missing
        && lifecycle::observes_pool(&state.request)
        && pools_enabled(state).await?
    {
        pool_lock = Some(state.ctx.pools_lock.clone().lock_owned().await);
        Some(observe_pool(state).await.map_err(|err| StepError {
            call: Some(StepCall::ReadPool),
            err,
        })?)
    } else {
        None
    };
    look_up_covering_pdbs(state).await;
    // The drain reads the cached pods as they are (shared, not copied).
    let pods = cached_pods(state);
    let pdb_summaries = pdb_summaries(state);
    let observed = Observed {
        node,
        request_gone: state.gone,
        pods: pods.as_deref(),
        pdb_summaries: &pdb_summaries,
        operator: &state.ctx.identity,
        yield_after: state.ctx.yield_blocked_drain_after(),
        pool: pool.as_ref(),
    };
    let now = jiff::Timestamp::now();
    let step = lifecycle::step(&state.request, &observed, now, &mut state.ledger);
    tracing::trace!(request = %state.key(), phase = %state.request.phase(), actions = step.actions.len(), "step");
    // The snapshot goes before the calls: held across them, a pod that changes meanwhile would
    // be kept twice (the snapshot's version and the cache's) by every actor waiting for the API.
    drop(pods);

    if step.watch_pods {
        ensure_pod_watch(myself, state);
    } else {
        state.pods = None;
    }
    let moved = step.transition().is_some();
    state.pool_lock = pool_lock;
    let executed = execute(myself, state, &step).await;
    state.pool_lock = None;
    // Whether or not every action ran: orders that never started are due again, and calls the
    // ledger no longer waits for are cancelled.
    settle_calls(state);
    // The gauges too: a step that keeps failing must show its drain's lack of progress.
    sync_pdb_subscriptions(myself, state, &step.ledger_outlook);
    report_metrics(
        state,
        step.ledger_outlook.blocked_by_pdb,
        step.last_progress,
    );
    executed?;
    if step.finished {
        finish(myself, state, node);
        return Ok(());
    }
    if let Some(at) = step.wake_at {
        let wait =
            Duration::try_from(at.duration_since(jiff::Timestamp::now())).unwrap_or_default();
        state.schedule_step(myself, wait);
    }
    // A new phase can usually start at once.
    if moved {
        let _ = myself.cast(RequestMsg::Step);
    }
    Ok(())
}

/// Names the budgets of the pods that several select, for the status. Only for that: a lookup
/// that fails must not hold the step (a deletion's uncordon, a gone node's release); the next
/// step looks again.
async fn look_up_covering_pdbs(state: &mut RequestActorState) {
    for key in state.ledger.outlook().covering_pdbs_wanted {
        let Some(pod) = state.pods.as_ref().and_then(|watch| {
            watch
                .store
                .find(|p| drain_plan::PodRef::from_pod(p).key() == key)
        }) else {
            continue;
        };
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        match covering_pdbs(&state.ctx, &namespace, &labels).await {
            Ok(pdbs) => {
                let learned = LedgerEvent::CoveringPdbs { key, pdbs };
                state.ledger.observe(learned, jiff::Timestamp::now());
            }
            Err(err) => {
                tracing::warn!(request = %state.key(), pod = %key, %err, "could not look up the PodDisruptionBudgets of a pod that several select");
                break;
            }
        }
    }
}

/// The pods on the node once the watch listed them all (before that, none says nothing).
fn cached_pods(state: &RequestActorState) -> Option<Vec<Arc<CachedPod>>> {
    state.pods.as_ref().and_then(|watch| {
        watch
            .synced
            .load(Ordering::Acquire)
            .then(|| watch.store.state())
    })
}

/// The current state of each budget the drain waits on, by `namespace/name`, for the status.
fn pdb_summaries(state: &RequestActorState) -> BTreeMap<String, String> {
    state
        .ledger
        .outlook()
        .pdbs_to_watch()
        .filter_map(|(namespace, name)| {
            let summary = state.ctx.pdbs.current(namespace, name)?;
            Some((format!("{namespace}/{name}"), summary.to_string()))
        })
        .collect()
}

/// Tells the ledger which calls still run; those it no longer waits for are cancelled.
fn settle_calls(state: &mut RequestActorState) {
    let running: BTreeSet<String> = state.calls.keys().cloned().collect();
    let learned = LedgerEvent::CallsRunning { running };
    for key in state.ledger.observe(learned, jiff::Timestamp::now()) {
        state.calls.remove(&key);
    }
}

/// The request needs nothing more: leaves how the run ended for the supervisor, and stops.
fn finish(myself: &ActorRef<RequestMsg>, state: &RequestActorState, node: NodeView) {
    let end = if state.gone {
        tracing::warn!(request = %state.key(), node = %state.node(), "the request went without our cleanup; what it did to the node is undone");
        RunEnd::RequestGone
    } else {
        tracing::info!(request = %state.key(), node = %state.node(), "maintenance finished");
        RunEnd::Finished {
            version: state.request.resource_version(),
            node_gone: node == NodeView::Missing,
        }
    };
    let _ = state.end.set(end);
    myself.stop(Some(MAINTENANCE_FINISHED.into()));
}

/// Sets one annotation, guarded by the resourceVersion the step saw, and keeps the new version.
async fn annotate(
    state: &mut RequestActorState,
    key: &str,
    value: String,
) -> Result<(), kube::Error> {
    set_metadata(state, "annotations", key, &value).await
}

/// Sets one entry of the request's `labels` or `annotations` (`map`), as [`annotate`].
async fn set_metadata(
    state: &mut RequestActorState,
    map: &str,
    key: &str,
    value: &str,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": state.request.resource_version(),
            map: { key: value },
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
    Ok(())
}

async fn execute(
    myself: &ActorRef<RequestMsg>,
    state: &mut RequestActorState,
    step: &Step,
) -> Result<(), StepError> {
    for action in &step.actions {
        execute_action(myself, state, action)
            .await
            .map_err(|err| StepError {
                call: StepCall::of(action),
                err,
            })?;
    }
    Ok(())
}

async fn execute_action(
    myself: &ActorRef<RequestMsg>,
    state: &mut RequestActorState,
    action: &Action,
) -> Result<(), kube::Error> {
    match action {
        Action::RecordInitialState { unschedulable } => {
            annotate(
                state,
                INITIAL_UNSCHEDULABLE_ANNOTATION,
                unschedulable.to_string(),
            )
            .await?;
        }
        Action::Adopt { at } => {
            annotate(state, ADMITTED_TIME_ANNOTATION, annotation_value(*at)).await?;
            let phase = state.request.phase();
            tracing::info!(
                request = %state.request.key(),
                %phase,
                "adopted a request another operator left in progress"
            );
            state.ctx.metrics.request.requests_adopted_total.inc();
            let note = format!(
                "adopted in phase {phase} from another operator; the phase's timeouts count from {}",
                maintenance_core::conditions::phase_since(&state.request).unwrap_or(*at)
            );
            state
                .ctx
                .event(&state.request, false, EventReason::Adopted.as_str(), note);
            // The adopted version is stepped at once, not when the watch brings it back.
            let _ = myself.cast(RequestMsg::Step);
        }
        Action::RecordReadyTime { at } => {
            annotate(state, READY_TIME_ANNOTATION, annotation_value(*at)).await?;
        }
        Action::AddFinalizer => {
            let mut finalizers = state.request.finalizers().to_vec();
            finalizers.push(FINALIZER.to_string());
            state.request = Arc::new(patch_finalizers(state, finalizers).await?);
        }
        Action::Cordon
        | Action::Uncordon
        | Action::ProtectFromAutoscalers
        | Action::UnprotectFromAutoscalers => write_node(state, action).await?,
        Action::Evict(orders) => {
            for order in orders {
                start_eviction(myself, state, order.clone());
            }
        }
        Action::ForceDelete(orders) => {
            for order in orders {
                start_force_delete(myself, state, order.clone());
            }
        }
        Action::WriteStatus(write) => {
            let updated = state.ctx.apply_status_write(&state.request, write).await?;
            state.request = Arc::new(updated);
            state
                .ledger
                .observe(LedgerEvent::StatusWritten, jiff::Timestamp::now());
        }
        Action::Event(event) => {
            let request = state.request.clone();
            state.ctx.event(
                &request,
                event.warning,
                event.reason.as_str(),
                event.note.clone(),
            );
        }
        Action::RemoveFinalizer {
            phase,
            in_phase_for,
        } => {
            remove_finalizer(state).await?;
            let request = state.request.clone();
            state.ctx.notify(
                NotificationEvent::Released,
                &request,
                maintenance_core::notifications::released(&request),
            );
            if let Some(spent) = in_phase_for {
                state
                    .ctx
                    .metrics
                    .request
                    .phase_duration_seconds
                    .with_label_values(&[phase.as_str()])
                    .observe(spent.as_secs_f64());
            }
        }
        Action::DrainFinished { after } => state
            .ctx
            .metrics
            .drain
            .drain_duration_seconds
            .observe(after.as_secs_f64()),
        Action::LabelPool { pool } => {
            set_metadata(state, "labels", mcp::POOL_LABEL, pool).await?;
        }
        Action::PausePool(pool) => {
            openshift::set_paused(&state.ctx.client, pool, true).await?;
            tracing::info!(request = %state.key(), pool = %pool.name, "paused the MachineConfigPool before the cordon");
        }
        Action::ReleasePool { pool } => release_pool(state, pool).await?,
        Action::Yield { patch, message } => {
            let updated = request_api(state)
                .patch(
                    &state.request.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                )
                .await?;
            state.request = Arc::new(updated);
            tracing::warn!(request = %state.key(), node = %state.node(), "a drain that PodDisruptionBudgets block gave its slot back");
            state.ctx.metrics.request.requests_yielded_total.inc();
            state.ctx.notify(
                NotificationEvent::Yielded,
                &state.request,
                Detail::new(EventReason::Yielded.as_str(), message),
            );
        }
    }
    Ok(())
}

fn start_eviction(
    myself: &ActorRef<RequestMsg>,
    state: &mut RequestActorState,
    order: EvictionOrder,
) {
    let actor = myself.clone();
    let (call, cancel) = state.start_call(&order.key);
    state.ctx.evictor.submit(QueuedEviction {
        order,
        cancel,
        answer: Box::new(move |order, outcome| {
            let uid = order.uid().map(str::to_string);
            let _ = actor.cast(RequestMsg::Evicted {
                key: order.key,
                uid,
                call,
                outcome,
            });
        }),
    });
}

/// Deletes one pod past the escalation deadline; once the API server accepted it, the Warning
/// Events (on the request and the pod) and the metric say which budget was bypassed.
fn start_force_delete(
    myself: &ActorRef<RequestMsg>,
    state: &mut RequestActorState,
    order: ForceDeleteOrder,
) {
    let ctx = state.ctx.clone();
    let request = state.request.clone();
    let actor = myself.clone();
    let (call, cancel) = state.start_call(&order.key);
    tokio::spawn(async move {
        let outcome = ctx
            .evictor
            .force_delete(&order.namespace, &order.name, order.uid.as_deref(), &cancel)
            .await;
        // Cancelled before it was sent: no pod was deleted, nobody waits for an answer.
        let Some(outcome) = outcome else { return };
        match &outcome {
            DeleteOutcome::Deleted => {
                tracing::warn!(
                    request = %request.key(),
                    pod = %order.key,
                    pdb = %order.pdb,
                    "deleted a pod past forceDeleteAfterSeconds, bypassing its PodDisruptionBudget"
                );
                ctx.metrics
                    .drain
                    .pods_force_deleted_total
                    .with_label_values(&[order.namespace.as_str(), order.pdb.as_str()])
                    .inc();
                let pod = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    namespace: Some(order.namespace.clone()),
                    name: Some(order.name.clone()),
                    uid: order.uid.clone(),
                    ..ObjectReference::default()
                };
                ctx.force_deleted_events(
                    &request,
                    &pod,
                    EventReason::ForceDeleted.as_str(),
                    order.note.clone(),
                );
            }
            DeleteOutcome::Gone => {}
            DeleteOutcome::Error { code, message } => {
                tracing::warn!(
                    request = %request.key(),
                    pod = %order.key,
                    code = ?code,
                    %message,
                    "deleting a pod past forceDeleteAfterSeconds failed; retrying"
                );
                ctx.error("force_delete");
            }
        }
        let _ = actor.cast(RequestMsg::ForceDeleted {
            key: order.key,
            uid: order.uid,
            call,
            outcome,
        });
    });
}

/// The node writes of a step: the cordon marks the node with its request (and keeps the
/// autoscalers off it), the uncordon removes the mark and what the cordon added (`cordon_mark`:
/// what finds a node whose request went without our cleanup once no actor remembers it); on a
/// node the request does not cordon, the autoscaler annotations alone are written at the
/// admission and removed at the release while the node carries this request's mark (a write
/// guarded by the version read: a later request's mark written meanwhile conflicts, and the step
/// reads again). All read the node fresh: which autoscaler annotations were there before us, or
/// which we added, must not come from a cache that may still show the previous request's.
async fn write_node(state: &RequestActorState, action: &Action) -> Result<(), kube::Error> {
    let Some(node) = node_api(state).get_opt(state.node()).await? else {
        // A node that is gone needs neither cordon nor uncordon.
        return Ok(());
    };
    let annotations = node.metadata.annotations.as_ref();
    let protect = state
        .ctx
        .protect_from_autoscalers
        .load(std::sync::atomic::Ordering::Relaxed);
    let patch = match action {
        Action::Cordon => {
            let add = cordon_mark::autoscaler_annotations_to_add(annotations, protect);
            Some(cordon_mark::cordon_patch(&state.request, &add))
        }
        Action::Uncordon => Some(cordon_mark::uncordon_patch(
            None,
            &cordon_mark::autoscaler_annotations_added(annotations),
        )),
        Action::ProtectFromAutoscalers => {
            cordon_mark::protect_patch(&state.request, annotations, protect)
        }
        Action::UnprotectFromAutoscalers => {
            let uid = state.request.metadata.uid.as_deref().unwrap_or_default();
            cordon_mark::unprotect_patch(&node, uid)
        }
        _ => None,
    };
    let Some(patch) = patch else {
        return Ok(());
    };
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

async fn remove_finalizer(state: &RequestActorState) -> Result<(), kube::Error> {
    let finalizers: Vec<String> = state
        .request
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    match patch_finalizers(state, finalizers).await {
        Ok(_) => Ok(()),
        Err(err) if is_not_found(&err) => Ok(()),
        Err(err) => Err(err),
    }
}

/// Replaces the finalizer list, guarded by the resourceVersion we read: a merge patch replaces
/// the whole list, so a concurrent edit by the requestor must conflict, not be overwritten.
async fn patch_finalizers(
    state: &RequestActorState,
    finalizers: Vec<String>,
) -> Result<NodeMaintenance, kube::Error> {
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": state.request.resource_version(),
            "finalizers": finalizers,
        }
    });
    request_api(state)
        .patch(
            &state.request.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
}

fn ensure_pod_watch(myself: &ActorRef<RequestMsg>, state: &mut RequestActorState) {
    if state.pods.is_some() {
        return;
    }
    let (client, slot) = state.ctx.pod_watches.acquire();
    let api: Api<CachedPod> = Api::all(client);
    // One WATCH that starts with the current pods (sendInitialEvents) instead of a LIST and a
    // WATCH: a call less per drained node.
    let config = watcher::Config::default()
        .fields(&format!("spec.nodeName={}", state.node()))
        .streaming_lists();
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        // Only what the drain reads, decoded as such: a whole pod is about 20 KiB once decoded.
        watcher(api, config).modify(CachedPod::trim),
    )
    .default_backoff();
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
            // Every event, a re-list's end (InitDone) included: the store applied it before the
            // reflector yielded it, so the next read sees it. (Objects alone would say nothing
            // when a re-list after an outage finds that pods ended meanwhile.)
            if !queued_flag.swap(true, Ordering::AcqRel) {
                let _ = actor.cast(RequestMsg::PodsChanged);
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
            let _ = actor.cast(RequestMsg::PodsChanged);
        }
    });
    state.pods = Some(PodWatch {
        store,
        queued,
        synced,
        _task: AbortOnDrop(task),
        _ready: AbortOnDrop(ready_task),
        _slot: slot,
    });
}

/// Keeps the shared gauges in step with the ledger: pods blocked per PDB (`now`, as the step's
/// ledger outlook counts them), and while draining the seconds since the last progress. Label
/// sets go when the request no longer needs them.
fn report_metrics(
    state: &mut RequestActorState,
    now: BTreeMap<(String, String), usize>,
    last_progress: Option<jiff::Timestamp>,
) {
    let metrics = &state.ctx.metrics;
    // A budget that blocks a drain with a deadline gets its force-deletion series at 0 now, so
    // that Prometheus sees the first deletion as an increase (a counter born at 1 shows none).
    let has_deadline = state
        .request
        .spec
        .drain_spec
        .as_ref()
        .is_some_and(|d| d.force_delete_after().is_some());
    let keys: BTreeSet<&(String, String)> = now.keys().chain(state.reported_pdbs.keys()).collect();
    for key in keys {
        let before = state.reported_pdbs.get(key).copied().unwrap_or(0);
        let after = now.get(key).copied().unwrap_or(0);
        if has_deadline && before == 0 && after > 0 {
            metrics
                .drain
                .pods_force_deleted_total
                .with_label_values(&[key.0.as_str(), key.1.as_str()]);
        }
        if before != after {
            let delta = i64::try_from(after).unwrap_or(i64::MAX)
                - i64::try_from(before).unwrap_or(i64::MAX);
            metrics.add_pods_blocked_by_pdb(&key.0, &key.1, delta);
        }
    }
    state.reported_pdbs = now;
    let gauge = &metrics.drain.seconds_since_progress;
    match last_progress {
        Some(at) => {
            let seconds = jiff::Timestamp::now().duration_since(at).as_secs_f64();
            gauge
                .with_label_values(&[state.request.spec.node_name.as_str()])
                .set(seconds.max(0.0));
            state.progress_reported = true;
        }
        None if state.progress_reported => {
            let _ = gauge.remove_label_values(&[state.request.spec.node_name.as_str()]);
            state.progress_reported = false;
        }
        None => {}
    }
}

/// The PDBs that select a pod (for the "several PDBs" case, which the API server does not name).
async fn covering_pdbs(
    ctx: &Context,
    namespace: &str,
    pod_labels: &BTreeMap<String, String>,
) -> Result<Vec<String>, kube::Error> {
    let selected = |pdb: &PodDisruptionBudget| drain_plan::pdb_selects(pdb, namespace, pod_labels);
    // From the shared cache once it is filled; the API server only before that.
    let mut names: Vec<String> = match ctx.pdbs.ready_store() {
        Some(store) => store
            .state()
            .iter()
            .filter(|pdb| selected(pdb))
            .map(|pdb| pdb.name_any())
            .collect(),
        None => Api::<PodDisruptionBudget>::namespaced(ctx.client.clone(), namespace)
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter(|pdb| selected(pdb))
            .map(|pdb| pdb.name_any())
            .collect(),
    };
    names.sort();
    Ok(names)
}

/// Keeps one PDB subscription per PDB that the step's ledger outlook says blocks one of our pods,
/// and drops the others.
fn sync_pdb_subscriptions(
    myself: &ActorRef<RequestMsg>,
    state: &mut RequestActorState,
    outlook: &LedgerOutlook,
) {
    state.pdb_watches.retain(|key, _| outlook.watches(key));
    for key in outlook.pdbs_to_watch() {
        if state.pdb_watches.contains_key(key) {
            continue;
        }
        let (namespace, name) = key;
        let mut changes = state.ctx.pdbs.subscribe(namespace, name);
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
                        .cast(RequestMsg::PdbChanged {
                            namespace: ns.clone(),
                            name: pdb.clone(),
                        })
                        .is_err()
                {
                    break;
                }
            }
        });
        state.pdb_watches.insert(key.clone(), AbortOnDrop(task));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evictor::{EvictionRate, Evictor};
    use crate::metrics::Metrics;
    use crate::pdb_watch::PdbWatches;

    /// A context whose client is never contacted.
    fn context() -> Arc<Context> {
        let client = crate::testing::offline_client();
        let metrics = Arc::new(Metrics::new().expect("fresh metrics register"));
        let pdbs = PdbWatches::new(client.clone());
        let evictor = Evictor::new(
            client.clone(),
            EvictionRate {
                per_second: 1,
                burst: 1,
            },
            metrics.clone(),
            pdbs.store(),
            4,
        );
        Arc::new(Context::new(
            client,
            evictor,
            pdbs,
            metrics,
            "maintenance".into(),
            None,
            Duration::from_secs(10),
        ))
    }

    fn state(ctx: Arc<Context>) -> RequestActorState {
        let request = NodeMaintenance::new(
            "upgrade",
            maintenance_crds::NodeMaintenanceSpec {
                node_name: "node-1".into(),
                requestor_id: "test".into(),
                ..maintenance_crds::NodeMaintenanceSpec::default()
            },
        );
        let (nodes, _writer) = reflector::store();
        RequestActorState::new(RequestArgs {
            ctx,
            request: Arc::new(request),
            nodes,
            end: Arc::new(OnceLock::new()),
        })
    }

    /// ractor runs no `post_stop` after a panic, so the series an actor exported (the actor
    /// count, its node's progress, the pods its drain sees blocked by a budget) go when its state
    /// is dropped, however the actor ended; without that they would stay for good.
    #[tokio::test]
    async fn an_actors_series_go_with_its_state() {
        let ctx = context();
        let metrics = ctx.metrics.clone();
        let mut state = state(ctx);
        assert_eq!(metrics.process.node_actors.get(), 1);
        report_metrics(&mut state, BTreeMap::new(), Some(jiff::Timestamp::now()));
        metrics.add_pods_blocked_by_pdb("team", "db", 2);
        state
            .reported_pdbs
            .insert(("team".to_string(), "db".to_string()), 2);
        let before = metrics.render();
        assert!(before.contains("node=\"node-1\""), "{before}");
        assert!(before.contains("pdb=\"db\"} 2"), "{before}");

        drop(state);
        let after = metrics.render();
        assert_eq!(metrics.process.node_actors.get(), 0);
        assert!(!after.contains("node=\"node-1\""), "{after}");
        assert!(!after.contains("pdb=\"db\""), "{after}");
    }
}
