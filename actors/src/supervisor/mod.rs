//! The supervisor: one per operator (on the leader). It owns the caches of requests, nodes and the
//! config, alone admits requests (Pending -> Scheduled) through the pure scheduler, and runs one
//! linked [`RequestActor`] per request in progress, restarting failed ones with backoff.
//!
//! A round reads: observe (the caches, the config) -> settle (the tracker forgets what the cache
//! has caught up with) -> schedule (core decides on the snapshot the tracker adjusted) ->
//! execute (the writes in `crate::writes`, the actors). Every decision is core's; what the
//! supervisor knows beyond its caches is core's `tracker`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use maintenance_core::actor_runs::{ActorAction, RunEnd};
use maintenance_core::capacity::CapacityCheck;
use maintenance_core::config_health::ConfigHealth;
use maintenance_core::cordon_mark::{self, OrphanSightings};
use maintenance_core::drainability::{DrainBlocker, PreferDrainable};
use maintenance_core::explain::Explanations;
use maintenance_core::gc;
use maintenance_core::lifecycle;
use maintenance_core::node_view;
use maintenance_core::scheduler::{
    self, Decision, Limits, NodeStates, RequestKey, Snapshot, WaitCause, Waiting,
};
use maintenance_core::tracker::{AdmissionAnswer, Alarm, Cache, Tracker};
use maintenance_crds::{
    DEFAULT_CONFIG_NAME, MaintenanceOperatorConfig, MaintenanceOperatorConfigSpec, NodeMaintenance,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::time::Instant;

use crate::context::Context;
use crate::evictor::EvictionRate;
use crate::gates::{GateAsker, GateChecker};
use crate::request_actor::{RequestActor, RequestArgs, RequestMsg};
use crate::task::AbortOnDrop;
use crate::writes::{self, admission::AdmitOutcome};

pub enum SupervisorMsg {
    /// A watched object changed.
    Changed,
    /// The safety-net period passed.
    Tick,
    /// A maintenance window is due to open (see `wake_at`).
    WindowOpening,
    /// A request whose admission failed may be tried again (see `wake_at`).
    AdmissionRetryDue,
    /// A garbage-collection deadline is due (see `wake_at`).
    CollectionDue,
    /// An admission's writes (started by a round, not awaited by it) are answered.
    Admitted { uid: String, outcome: AdmitOutcome },
    /// A round held back by `scheduler::round_gap` is due.
    RoundDue,
    /// Pending writes (first status, owners, reasons) started by a round are answered, each
    /// with the resourceVersion it wrote (`None`: nothing written); the cache's events for them
    /// bring the next round.
    Written {
        written: Vec<(String, Option<String>)>,
    },
    /// Taint writes started by a round are answered, by node name (see `Written`).
    Tainted {
        written: Vec<(String, Option<String>)>,
    },
    /// Uncordons of orphaned cordons (`cordon_mark`) are answered, by node name.
    Uncordoned {
        written: Vec<(String, Option<String>)>,
    },
    /// An orphaned cordon's grace has passed.
    OrphanDue,
    /// An alert gate's answer changed what it says (`crate::gates`).
    GateAnswered,
    /// Requests wait and gates are set: time to ask the gates again (see `poll_gates`).
    GatePoll,
}

pub struct Supervisor;

/// A request actor at work, what it was given, and where it leaves how it ended.
struct RunningActor {
    actor: ActorRef<RequestMsg>,
    /// The newest version of its request it was given (only ever moves forward).
    request: Arc<NodeMaintenance>,
    end: Arc<OnceLock<RunEnd>>,
    /// Told that its request went without our cleanup (`RequestMsg::RequestGone`).
    told_gone: bool,
}

/// One timer at a time for each kind of due time that brings a round.
#[derive(Default)]
struct Wakes {
    window: Alarm<jiff::Timestamp>,
    retry: Alarm<jiff::Timestamp>,
    collection: Alarm<jiff::Timestamp>,
    orphan: Alarm<std::time::Instant>,
}

pub struct SupervisorState {
    ctx: Arc<Context>,
    requests: Store<NodeMaintenance>,
    nodes: Store<Node>,
    configs: Store<MaintenanceOperatorConfig>,
    _watches: Vec<AbortOnDrop>,
    /// One actor per request in progress, by request UID.
    actors: HashMap<String, RunningActor>,
    /// What the supervisor knows beyond its caches, by request UID and node name.
    tracker: Tracker,
    /// The scheduler's view of each node, read again only when the node changes.
    node_states: NodeStates,
    /// No round before this (`paced_round`); a held one is on its way when `round_held`.
    next_round_at: Instant,
    round_held: bool,
    /// Nodes cordoned by a request that went without our cleanup and that nothing of ours
    /// remembers: when each was first seen so (`cordon_mark::OrphanSightings`).
    orphans: OrphanSightings,
    /// preferDrainable's last observation of which Pending requests' drains would wait on a
    /// budget (reused while no slot is free).
    drain_blockers: BTreeMap<RequestKey, DrainBlocker>,
    change_queued: Arc<AtomicBool>,
    /// The config's logLevel last applied.
    log_level: Option<String>,
    /// When each waiting request's reason was last written, and under which limits.
    explanations: Explanations<String>,
    wakes: Wakes,
    /// The config problem last reported with an Event on the config.
    config_health: ConfigHealth,
    /// The alert gates' last answers, and their queries under way.
    gates: GateChecker,
    /// A `GatePoll` is on its way.
    gate_poll_armed: bool,
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = Arc<Context>;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        ctx: Arc<Context>,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let queued = Arc::new(AtomicBool::new(false));
        let client = ctx.client.clone();
        let (requests, w1) = crate::watches::spawn_watch(
            Api::<NodeMaintenance>::all(client.clone()),
            watcher::Config::default(),
            |o| o.managed_fields_mut().clear(),
            myself.clone(),
            queued.clone(),
        );
        // Nodes are many: keep only what decisions read (`node_view`).
        let (nodes, w2) = crate::watches::spawn_watch(
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            node_view::trim,
            myself.clone(),
            queued.clone(),
        );
        let (configs, w3) = crate::watches::spawn_watch(
            Api::<MaintenanceOperatorConfig>::namespaced(client.clone(), &ctx.namespace),
            watcher::Config::default().fields(&format!("metadata.name={DEFAULT_CONFIG_NAME}")),
            |o| o.managed_fields_mut().clear(),
            myself.clone(),
            queued.clone(),
        );
        for (what, ready) in [
            ("NodeMaintenances", requests.wait_until_ready().await),
            ("Nodes", nodes.wait_until_ready().await),
            (
                "MaintenanceOperatorConfig",
                configs.wait_until_ready().await,
            ),
        ] {
            ready.map_err(|_| format!("the {what} watch stopped before its first list"))?;
        }
        ctx.synced.store(true, Ordering::Relaxed);
        tracing::info!(namespace = %ctx.namespace, "caches synced; supervisor running");
        myself.send_after(ctx.tick, || SupervisorMsg::Tick);
        let _ = myself.cast(SupervisorMsg::Changed);
        Ok(SupervisorState {
            requests,
            nodes,
            configs,
            _watches: vec![w1, w2, w3],
            actors: HashMap::new(),
            tracker: Tracker::default(),
            node_states: NodeStates::default(),
            next_round_at: Instant::now(),
            round_held: false,
            orphans: OrphanSightings::default(),
            drain_blockers: BTreeMap::new(),
            change_queued: queued,
            log_level: None,
            explanations: Explanations::default(),
            wakes: Wakes::default(),
            config_health: ConfigHealth::default(),
            gates: GateChecker::new(
                GateAsker::new(Some(ctx.client.clone()), ctx.namespace.clone()),
                ctx.metrics.clone(),
            ),
            gate_poll_armed: false,
            ctx,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        msg: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SupervisorMsg::Changed => state.change_queued.store(false, Ordering::Release),
            // Re-armed each time, so a slow round never piles up ticks.
            SupervisorMsg::Tick => {
                myself.send_after(state.ctx.tick, || SupervisorMsg::Tick);
            }
            // This round arms the timer again for whatever is next (the same one, should the
            // timer have fired a moment early by the wall clock).
            SupervisorMsg::WindowOpening => state.wakes.window.fired(),
            SupervisorMsg::AdmissionRetryDue => state.wakes.retry.fired(),
            SupervisorMsg::CollectionDue => state.wakes.collection.fired(),
            SupervisorMsg::OrphanDue => state.wakes.orphan.fired(),
            SupervisorMsg::RoundDue => state.round_held = false,
            SupervisorMsg::GateAnswered => {}
            SupervisorMsg::GatePoll => state.gate_poll_armed = false,
            SupervisorMsg::Admitted { uid, outcome } => {
                // An admitted request's actor starts at once, without waiting for the cache.
                if admission_answered(&myself, state, uid, outcome).await {
                    return Ok(());
                }
            }
            SupervisorMsg::Written { written } => {
                state.tracker.writes_answered(written);
                return Ok(());
            }
            SupervisorMsg::Tainted { written } => {
                state.tracker.taints.answered(written);
                return Ok(());
            }
            SupervisorMsg::Uncordoned { written } => {
                state.tracker.uncordons.answered(written);
                return Ok(());
            }
        }
        paced_round(&myself, state).await;
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        // Never let one request's failure stop the supervisor (ractor's default would).
        match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                let Some(uid) = actor_uid(state, cell.get_id()) else {
                    return Ok(());
                };
                let Some(running) = state.actors.remove(&uid) else {
                    return Ok(());
                };
                tracing::debug!(%uid, ?reason, "request actor stopped");
                // Stopped by the supervisor (its request gone from the cache), it left nothing.
                if let Some(end) = running.end.get() {
                    let end = end
                        .clone()
                        .at_least(running.request.resource_version().as_deref());
                    state.tracker.actor_ended(&uid, end);
                    // Its slot is free now: a round gives it to the next request.
                    paced_round(&myself, state).await;
                }
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                let Some(uid) = actor_uid(state, cell.get_id()) else {
                    return Ok(());
                };
                // Forgotten: it starts again, from the version the cache shows then.
                state.actors.remove(&uid);
                let (failures, delay) = state.tracker.actor_failed(&uid, Instant::now().into_std());
                tracing::error!(%uid, %err, failures, restart_in = ?delay, "request actor failed; restarting");
                state.ctx.metrics.process.actor_restarts_total.inc();
                myself.send_after(delay, || SupervisorMsg::Changed);
            }
            _ => {}
        }
        Ok(())
    }
}

fn actor_uid(state: &SupervisorState, id: ractor::ActorId) -> Option<String> {
    state
        .actors
        .iter()
        .find(|(_, running)| running.actor.get_id() == id)
        .map(|(uid, _)| uid.clone())
}

/// Records an admission's answer. An admitted request's actor starts now, from the version the
/// admission wrote, rather than once the cache shows it (a watch hop on every slot's turn); the
/// cache's event for the admission brings the next round. Returns whether that is all; a stale
/// or failed admission needs a round now, which admits the next request in its place.
async fn admission_answered(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    uid: String,
    outcome: AdmitOutcome,
) -> bool {
    let answer = match &outcome {
        AdmitOutcome::Done(_) => AdmissionAnswer::Admitted,
        AdmitOutcome::Changed => AdmissionAnswer::Changed,
        AdmitOutcome::Failed { error } => AdmissionAnswer::Failed {
            error: error.clone(),
        },
    };
    let failed = matches!(answer, AdmissionAnswer::Failed { .. });
    let retry = state
        .tracker
        .admission_answered(&uid, answer, jiff::Timestamp::now());
    if let (true, Some(retry)) = (failed, retry) {
        tracing::info!(%uid, failures = retry.failures, retry_at = %retry.at, "admission backs off");
    }
    let AdmitOutcome::Done(written) = outcome else {
        return false;
    };
    state.ctx.metrics.request.requests_admitted_total.inc();
    let node_exists = state
        .nodes
        .get(&reflector::ObjectRef::new(&written.spec.node_name))
        .is_some();
    if lifecycle::needs_actor(&written, node_exists, true) {
        ensure_actor(myself, state, &written, node_exists).await;
    }
    true
}

/// A round now, or once the gap after the last one has passed (`scheduler::round_gap`): a change
/// that comes within the gap is held, and one round then serves every change held.
async fn paced_round(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState) {
    let now = Instant::now();
    if let Some(wait) = state
        .next_round_at
        .checked_duration_since(now)
        .filter(|w| !w.is_zero())
    {
        if !state.round_held {
            state.round_held = true;
            myself.send_after(wait, || SupervisorMsg::RoundDue);
        }
        return;
    }
    // A held round may still be on its way; this one serves its changes already.
    state.round_held = false;
    round(myself, state).await;
    state.next_round_at = Instant::now() + scheduler::round_gap(now.elapsed());
}

/// One scheduling round: observe -> settle -> schedule -> execute.
async fn round(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState) {
    let started = Instant::now();
    let ctx = state.ctx.clone();
    // Observe.
    let requests = state.requests.state();
    let nodes = state.nodes.state();
    let config_object = state
        .configs
        .get(&reflector::ObjectRef::new(DEFAULT_CONFIG_NAME).within(&ctx.namespace));
    let config = config_object.as_ref().map(|c| c.spec.clone());
    apply_config(state, config.as_ref());
    let cache = Cache::new(&requests, &nodes);
    // Settle.
    state.tracker.settle(&cache);
    // Schedule and execute.
    let now = jiff::Timestamp::now();
    let policy = collection_policy(&ctx, config.as_ref());
    collect_garbage(myself, state, &requests, &cache, &policy, now).await;
    let snapshot = snapshot(myself, state, &requests, &nodes, &cache);
    ctx.metrics.count_phases(requests.iter().map(|r| r.phase()));
    let mut limits = Limits::from_config(config.as_ref());
    let gates = config.as_ref().map(|c| c.gates()).unwrap_or_default();
    let observations = {
        let myself = myself.clone();
        state.gates.observe(gates, now, move || {
            let _ = myself.cast(SupervisorMsg::GateAnswered);
        })
    };
    limits.gate_hold = maintenance_core::gates::hold(gates, &observations);
    let (prefer, capacity) = observe_for_admission(
        state,
        &snapshot,
        &limits,
        config.as_ref(),
        &requests,
        &nodes,
        &cache,
    )
    .await;
    let reasons = match scheduler::schedule_observed(&snapshot, &limits, &prefer, &capacity, now) {
        Ok(decision) => {
            report_config(state, config_object.as_deref(), None);
            poll_gates(
                myself,
                state,
                !gates.is_empty() && !decision.waiting.is_empty(),
            );
            execute(myself, state, decision, &cache, &limits, &policy, now)
        }
        // Every waiting request says so, in place of a reason that no longer holds.
        Err(err) => {
            tracing::error!(%err, "cannot schedule: fix the MaintenanceOperatorConfig");
            ctx.error("schedule");
            report_config(state, config_object.as_deref(), Some(&err));
            let waiting = scheduler::waiting_on_config_error(&snapshot, &err);
            ctx.metrics.set_waiting(waiting.iter().map(|w| w.cause));
            explain(myself, state, waiting, &cache, &limits, &policy)
        }
    };
    // After admission: a request admitted in its first round gets no Pending write (it would make
    // the admission's guarded patch conflict and cost a round; the admission reports Pending);
    // the others get Pending with their reason in their first write.
    let explained = writes::pending::prepare_pending_requests(
        myself,
        &ctx,
        &requests,
        &cache,
        &mut state.tracker,
        &reasons,
    );
    for (uid, cause) in explained {
        state.explanations.written(uid, cause, now);
    }
    let taint_waiting_nodes = config.as_ref().is_none_or(|c| c.taint_waiting_nodes());
    writes::nodes::reconcile_pending_taints(
        myself,
        &ctx,
        &mut state.tracker,
        &requests,
        &nodes,
        taint_waiting_nodes,
    );
    sync_actors(myself, state, &requests, &cache).await;
    ctx.metrics.scheduler.scheduler_runs_total.inc();
    ctx.metrics
        .scheduler
        .scheduler_run_duration_seconds
        .observe(started.elapsed().as_secs_f64());
}

/// While requests wait and gates are set, a round runs every
/// [`maintenance_core::gates::POLL_WHILE_PENDING`] (and asks the gates whose answer is old), so
/// that a gate that stops firing admits soon rather than at the safety-net tick.
fn poll_gates(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState, wanted: bool) {
    if wanted && !state.gate_poll_armed {
        state.gate_poll_armed = true;
        myself.send_after(maintenance_core::gates::POLL_WHILE_PENDING, || {
            SupervisorMsg::GatePoll
        });
    }
}

/// An Event on the config when a round finds a problem with it, or finds it fixed (once per
/// change: `ConfigHealth`), and the `config_invalid` gauge.
fn report_config(
    state: &mut SupervisorState,
    config: Option<&MaintenanceOperatorConfig>,
    problem: Option<&scheduler::ScheduleError>,
) {
    let event = state.config_health.observe(problem);
    state
        .ctx
        .metrics
        .scheduler
        .config_invalid
        .set(i64::from(state.config_health.invalid()));
    if let (Some(event), Some(config)) = (event, config) {
        state.ctx.event_on_with_action(
            config.object_ref(&()),
            event.reason.is_warning(),
            event.reason.as_str(),
            &event.action,
            event.note,
        );
    }
}

/// The config's log level, eviction rate and autoscaler protection, applied as the config says
/// now.
fn apply_config(state: &mut SupervisorState, config: Option<&MaintenanceOperatorConfigSpec>) {
    let log_level = config
        .and_then(|c| c.log_level.clone())
        .unwrap_or_else(|| "info".to_string());
    if state.log_level.as_ref() != Some(&log_level) {
        if let Some(set) = &state.ctx.set_log_level {
            set(&log_level);
        }
        state.log_level = Some(log_level);
    }
    state.ctx.protect_from_autoscalers.store(
        config.is_none_or(|c| c.protect_from_autoscalers()),
        std::sync::atomic::Ordering::Relaxed,
    );
    state
        .ctx
        .notifier
        .configure(config.map(|c| c.notifications()).unwrap_or_default());
    state.ctx.yield_blocked_drain_after_seconds.store(
        config
            .and_then(|c| c.yield_blocked_drain_after())
            .map_or(0, |d| d.as_secs()),
        std::sync::atomic::Ordering::Relaxed,
    );
    state
        .ctx
        .set_machine_config_pools(config.map(|c| c.machine_config_pools()).unwrap_or_default());
    state.ctx.evictor.set_rate(EvictionRate {
        per_second: config.map_or(maintenance_crds::DEFAULT_EVICTIONS_PER_SECOND, |c| {
            c.evictions_per_second()
        }),
        burst: config.map_or(maintenance_crds::DEFAULT_EVICTION_BURST, |c| {
            c.eviction_burst()
        }),
    });
}

/// The scheduler's snapshot: the objects as the tracker knows them, with the nodes held by
/// actors undoing a gone request and by orphaned cordons (whose uncordons are sent when due).
fn snapshot(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    requests: &[Arc<NodeMaintenance>],
    nodes: &[Arc<Node>],
    cache: &Cache<'_>,
) -> Snapshot {
    let mut snapshot = Snapshot::from_states(
        state.node_states.observe(nodes.iter().map(|n| &**n)),
        requests.iter().map(|r| &**r),
    );
    state.tracker.adjust(&mut snapshot, cache);
    let running = state
        .actors
        .iter()
        .map(|(uid, running)| (uid.as_str(), &*running.request));
    state
        .tracker
        .hold_nodes_of_gone_requests(&mut snapshot, running, cache);
    // An actor that ended has removed its mark with its uncordon; a cache of nodes that still
    // shows it is behind, and the node is not held for it.
    let marks = cordon_mark::marks(nodes.iter().map(|n| &**n));
    state
        .ctx
        .metrics
        .scheduler
        .nodes_protected_from_autoscalers
        .set(i64::try_from(cordon_mark::protected_from_autoscalers(&marks)).unwrap_or(i64::MAX));
    let orphans = cordon_mark::orphaned_cordons(&marks, |uid| {
        state
            .tracker
            .in_progress(uid, state.actors.contains_key(uid), cache)
    });
    let now = Instant::now().into_std();
    let orphans = state.orphans.observe(orphans, now);
    cordon_mark::hold_nodes(&mut snapshot, &orphans.held);
    if let Some(due) = orphans.next_due
        && state.wakes.orphan.arm(due, now)
    {
        // A little after, so that the round finds the grace passed.
        let delay = due.saturating_duration_since(now) + Duration::from_millis(100);
        myself.send_after(delay, || SupervisorMsg::OrphanDue);
    }
    writes::nodes::uncordon_orphans(myself, &state.ctx, &mut state.tracker, orphans.due);
    snapshot
}

/// What preferDrainable and checkCapacity observe of the pods. With every slot taken nothing is
/// admitted: the pod reads would be spent on nothing (a rollout spends most of its rounds so).
/// preferDrainable keeps its last observation, which only words the Pending messages until a
/// slot frees.
async fn observe_for_admission(
    state: &mut SupervisorState,
    snapshot: &Snapshot,
    limits: &Limits,
    config: Option<&MaintenanceOperatorConfigSpec>,
    requests: &[Arc<NodeMaintenance>],
    nodes: &[Arc<Node>],
    cache: &Cache<'_>,
) -> (PreferDrainable, CapacityCheck) {
    let node_exists = |node: &str| cache.node_exists(node);
    let can_admit = scheduler::can_admit_any(snapshot, limits);
    let mut prefer = PreferDrainable::from_config(config);
    if !prefer.enabled {
        state.drain_blockers.clear();
    } else if !can_admit {
        prefer.blocked = state.drain_blockers.clone();
    } else {
        let unadmitted: Vec<Arc<NodeMaintenance>> = requests
            .iter()
            .filter(|r| {
                r.metadata
                    .uid
                    .as_deref()
                    .is_none_or(|uid| !state.tracker.is_admitted_or_admitting(uid))
            })
            .cloned()
            .collect();
        prefer.blocked =
            crate::drainability::observe_blockers(&state.ctx, &unadmitted, node_exists).await;
        state.drain_blockers = prefer.blocked.clone();
    }
    let mut capacity = CapacityCheck::from_config(config);
    if capacity.enabled && can_admit {
        // All requests, not only Pending ones: drains in progress need room too.
        capacity = crate::capacity::observe_capacity(&state.ctx, requests, nodes, node_exists)
            .await
            .unwrap_or_default();
    }
    (prefer, capacity)
}

/// Executes a scheduling decision: its metrics and timers, the admissions (not awaited: the
/// requests count as in maintenance until they are answered; a stale one keeps the place the
/// decision gave it, without a write) and the Pending messages. Returns each waiting request's
/// reason, for the first Pending writes.
fn execute(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    decision: Decision,
    cache: &Cache<'_>,
    limits: &Limits,
    policy: &gc::Policy,
    now: jiff::Timestamp,
) -> HashMap<(String, String), (String, WaitCause)> {
    let ctx = state.ctx.clone();
    ctx.metrics.record_decision(&decision);
    wake_at(
        myself,
        &mut state.wakes.window,
        decision.next_window_opening,
        now,
        || SupervisorMsg::WindowOpening,
    );
    wake_at(
        myself,
        &mut state.wakes.retry,
        decision.next_admission_retry,
        now,
        || SupervisorMsg::AdmissionRetryDue,
    );
    // Each admitted request with its cached object, looked up once.
    let admitted: HashMap<&RequestKey, &Arc<NodeMaintenance>> = decision
        .scheduled
        .iter()
        .filter_map(|key| Some((key, cache.request_named(&key.namespace, &key.name)?)))
        .collect();
    let to_send: Vec<&RequestKey> = scheduler::admissions_to_send(&decision, |key| {
        admitted
            .get(key)
            .and_then(|r| r.metadata.uid.as_deref())
            .is_some_and(|uid| state.tracker.can_begin_admission(uid))
    });
    let sent: HashSet<&RequestKey> = to_send.iter().copied().collect();
    let groups_sent = decision
        .node_groups
        .iter()
        .filter(|g| g.admitted && g.requests.first().is_some_and(|k| sent.contains(k)))
        .count();
    ctx.metrics
        .scheduler
        .node_groups_admitted_total
        .inc_by(u64::try_from(groups_sent).unwrap_or(u64::MAX));
    for key in to_send {
        let Some(request) = admitted.get(key) else {
            continue;
        };
        let Some(uid) = request.metadata.uid.as_deref() else {
            continue;
        };
        if state
            .tracker
            .begin_admission(uid, request.metadata.resource_version.as_deref())
        {
            let node = cache.node(&request.spec.node_name).cloned();
            writes::admission::spawn_admission(myself, &ctx, Arc::clone(request), node);
        }
    }
    explain(myself, state, decision.waiting, cache, limits, policy)
}

/// The waiting requests' Pending messages (core's `explain` chooses which are rewritten now).
/// Returns each one's reason, for the first Pending writes.
fn explain(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    mut waiting: Vec<Waiting>,
    cache: &Cache<'_>,
    limits: &Limits,
    policy: &gc::Policy,
) -> HashMap<(String, String), (String, WaitCause)> {
    // A request for a node that does not exist says when it will be collected.
    for entry in &mut waiting {
        if entry.cause != WaitCause::ConfigError
            && let Some(request) = cache.request_named(&entry.key.namespace, &entry.key.name)
            && !cache.node_exists(&request.spec.node_name)
        {
            entry.reason = gc::node_not_found_message(request, policy);
        }
    }
    writes::pending::explain_waiting(
        myself,
        &state.ctx.clone(),
        &mut state.explanations,
        &mut state.tracker,
        limits,
        cache,
        &waiting,
    );
    waiting
        .into_iter()
        .map(|w| ((w.key.namespace, w.key.name), (w.reason, w.cause)))
        .collect()
}

/// A round is arranged (by `message`) just after `due` rather than at the next safety-net tick:
/// when a window opens, an admission's backoff ends, a request is due for collection.
fn wake_at(
    myself: &ActorRef<SupervisorMsg>,
    alarm: &mut Alarm<jiff::Timestamp>,
    due: Option<jiff::Timestamp>,
    now: jiff::Timestamp,
    message: fn() -> SupervisorMsg,
) {
    // A little after the time, so that the round reads the window as open (the retry as due)
    // even if the timer's clock and the wall clock differ by a few milliseconds.
    const MARGIN: jiff::SignedDuration = jiff::SignedDuration::from_millis(200);
    let Some(at) = due.and_then(|at| at.checked_add(MARGIN).ok()) else {
        return;
    };
    if alarm.arm(at, now) {
        let delay = Duration::try_from(at.duration_since(now)).unwrap_or_default();
        myself.send_after(delay, message);
    }
}

fn collection_policy(ctx: &Context, config: Option<&MaintenanceOperatorConfigSpec>) -> gc::Policy {
    gc::Policy {
        max_ready: config.map_or_else(
            || MaintenanceOperatorConfigSpec::default().max_node_maintenance_time(),
            MaintenanceOperatorConfigSpec::max_node_maintenance_time,
        ),
        missing_node_grace: ctx.missing_node_grace,
    }
}

/// Deletes forgotten requests (core's `collection` decides which) and arranges a round at the
/// next deadline, so collection happens on time rather than at the next safety-net tick.
async fn collect_garbage(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    requests: &[Arc<NodeMaintenance>],
    cache: &Cache<'_>,
    policy: &gc::Policy,
    now: jiff::Timestamp,
) {
    let sweep = gc::sweep(
        requests.iter().map(|r| &**r),
        |node| cache.node_exists(node),
        policy,
        now,
    );
    wake_at(
        myself,
        &mut state.wakes.collection,
        sweep.next_check,
        now,
        || SupervisorMsg::CollectionDue,
    );
    writes::gc::delete_collected(&state.ctx, sweep.collect).await;
}

/// Keeps one request actor per request in progress and forwards each new version to it.
async fn sync_actors(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    requests: &[Arc<NodeMaintenance>],
    cache: &Cache<'_>,
) {
    let mut live: HashSet<String> = HashSet::new();
    for request in requests {
        let Some(uid) = request.uid() else { continue };
        let node_exists = cache.node_exists(&request.spec.node_name);
        if !lifecycle::needs_actor(request, node_exists, state.tracker.is_admitted(&uid)) {
            continue;
        }
        live.insert(uid);
        ensure_actor(myself, state, request, node_exists).await;
    }
    // Requests that went without our cleanup (gone, or our finalizer removed by someone else):
    // their actors undo what the request did to the node (`lifecycle::on_request_gone`), then
    // stop; until then they hold the node (`Tracker::hold_nodes_of_gone_requests`).
    for (uid, running) in &mut state.actors {
        if !live.contains(uid) && !running.told_gone {
            running.told_gone = true;
            let _ = running.actor.cast(RequestMsg::RequestGone);
        }
    }
}

/// Forwards `request` to its actor, or starts one for it (`Tracker::actor_action`).
async fn ensure_actor(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    request: &Arc<NodeMaintenance>,
    node_exists: bool,
) {
    let Some(uid) = request.uid() else { return };
    let version = request.resource_version();
    let forwarded = state
        .actors
        .get(&uid)
        .map(|r| r.request.metadata.resource_version.as_deref());
    let action = state.tracker.actor_action(
        &uid,
        forwarded,
        version.as_deref(),
        node_exists,
        Instant::now().into_std(),
    );
    match action {
        ActorAction::Nothing => {}
        ActorAction::Forward => {
            if let Some(running) = state.actors.get_mut(&uid) {
                running.request = request.clone();
                let _ = running.actor.cast(RequestMsg::Updated(request.clone()));
            }
        }
        ActorAction::Step => {
            if let Some(running) = state.actors.get(&uid) {
                let _ = running.actor.cast(RequestMsg::Step);
            }
        }
        ActorAction::Start => start_actor(myself, state, uid, request).await,
    }
}

async fn start_actor(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    uid: String,
    request: &Arc<NodeMaintenance>,
) {
    let end = Arc::new(OnceLock::new());
    let args = RequestArgs {
        ctx: state.ctx.clone(),
        request: request.clone(),
        nodes: state.nodes.clone(),
        end: end.clone(),
    };
    // Actor names are global: the UID keeps them unique across namespaces and re-creations.
    let name = format!("node-maintenance-{uid}");
    match Actor::spawn_linked(Some(name), RequestActor, args, myself.get_cell()).await {
        Ok((actor, _)) => {
            state.tracker.actor_started(&uid);
            state.actors.insert(
                uid,
                RunningActor {
                    actor,
                    request: request.clone(),
                    end,
                    told_gone: false,
                },
            );
        }
        Err(err) => {
            tracing::error!(request = %request.key(), %err, "could not start request actor");
            state.ctx.error("spawn");
        }
    }
}
