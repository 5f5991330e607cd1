//! The supervisor: one per operator (on the leader). It owns the caches of requests, nodes and the
//! config, alone admits requests (Pending -> Scheduled) through the pure scheduler, and runs one
//! linked [`NodeActor`] per request in progress, restarting failed ones with backoff.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use maintenance_crds::{
    DEFAULT_CONFIG_NAME, FINALIZER, MaintenanceOperatorConfig, MaintenanceOperatorConfigSpec,
    NodeMaintenance, Phase, condition_type,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::time::Instant;

use maintenance_core::lifecycle;

use crate::context::{Context, api_message, api_status_code, is_conflict, is_not_found};
use crate::evictor::EvictionRate;
use crate::metrics::BudgetSample;
use crate::node_actor::{NodeActor, NodeArgs, NodeMsg};
use crate::task::AbortOnDrop;
use maintenance_core::actor_runs::{self, ActorAction, ActorRun, RunEnd};
use maintenance_core::capacity::CapacityCheck;
use maintenance_core::collection::{self, Cause};
use maintenance_core::cordon_mark::{self, CordonMark, OrphanSightings};
use maintenance_core::drainability::{DrainBlocker, PreferDrainable};
use maintenance_core::explain::{Explanations, Observed};
use maintenance_core::lifecycle::EventReason;
use maintenance_core::node_view;
use maintenance_core::ownership::{self, NodeIdentity};
use maintenance_core::pending_taint;
use maintenance_core::scheduler::{self, Limits, NodeStates, RequestKey, Snapshot, WaitCause};

/// Writes (initial Pending status, owner references, admissions, reasons) made concurrently in
/// one round.
const PARALLEL_WRITES: usize = 16;

pub enum SupervisorMsg {
    /// A watched object changed.
    Changed,
    /// The safety-net period passed.
    Tick,
    /// A maintenance window is due to open (see `wake_at`).
    WindowOpening,
    /// A request whose admission failed may be tried again (see `wake_at`).
    AdmissionRetryDue,
    /// An admission's writes (started by a round, not awaited by it) are answered; `attempted`
    /// is the resourceVersion they were built on.
    Admitted {
        uid: String,
        attempted: Option<String>,
        outcome: AdmitOutcome,
    },
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
    /// An orphaned cordon's grace has passed (see `undo_orphaned_cordons`).
    OrphanDue,
}

/// How an admission's writes ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AdmitOutcome {
    /// Admitted: the request as the admission's last write returned it.
    Done(Arc<NodeMaintenance>),
    /// The request changed or went away meanwhile (conflict, not found): the cache is behind,
    /// and a round decides again once it shows the request's next version.
    Changed,
    /// Refused, or its answer lost and the request read back unchanged: nothing was written.
    /// The error (logged and counted) is quoted in the request's Pending message; the request
    /// backs off ([`scheduler::admission_retry_delay`]) and the next one takes its slot.
    Failed { error: String },
}

pub struct Supervisor;

/// A node actor at work, what it was given, and where it leaves how it ended.
struct RunningActor {
    actor: ActorRef<NodeMsg>,
    /// The newest version of its request it was given (only ever moves forward).
    request: Arc<NodeMaintenance>,
    end: Arc<OnceLock<RunEnd>>,
    /// Told that its request went without our cleanup (`NodeMsg::RequestGone`).
    told_gone: bool,
}

pub struct SupervisorState {
    ctx: Arc<Context>,
    requests: Store<NodeMaintenance>,
    nodes: Store<Node>,
    configs: Store<MaintenanceOperatorConfig>,
    _watches: Vec<AbortOnDrop>,
    /// One actor per request in progress, by request UID.
    actors: HashMap<String, RunningActor>,
    /// The scheduler's view of each node, read again only when the node changes.
    node_states: NodeStates,
    /// No round before this (`paced_round`); a held one is on its way when `round_held`.
    next_round_at: Instant,
    round_held: bool,
    /// Requests we admitted whose admission the cache has not shown yet: counted as in
    /// maintenance so a fast second round never admits past the limits.
    admitted: HashSet<String>,
    /// Requests whose node actor ended (cleanup done: node uncordoned, our finalizer off; the
    /// node gone; the request gone), and how, while the cache may still show them held: released
    /// at once, so the slot goes to the next request without waiting for the cache to show the
    /// object gone; and no version the cache shows from before the end starts another actor
    /// (`actor_runs`).
    ended: HashMap<String, RunEnd>,
    /// Requests whose admission writes are in flight: counted as in maintenance too, so rounds
    /// run on without waiting for them and never admit past the limits meanwhile.
    admitting: HashSet<String>,
    /// Pending requests with a write of ours in flight (`None`: first status, owners, reason),
    /// or written at a resourceVersion the cache does not show yet: a round neither waits for
    /// the write nor writes them again, nor admits them, until the cache shows it (a write
    /// guarded by the version the cache shows would only conflict).
    writing: HashMap<String, Option<String>>,
    /// Nodes with a taint write of ours in flight, or written at a resourceVersion the cache does
    /// not show yet (as `writing`, by node name).
    tainting: HashMap<String, Option<String>>,
    /// Nodes cordoned by a request that went without our cleanup and that no actor remembers:
    /// when each was first seen so (`cordon_mark::OrphanSightings`).
    orphans: OrphanSightings,
    /// Orphaned cordons with an uncordon of ours in flight, or written at a resourceVersion the
    /// cache does not show yet (as `tainting`).
    uncordoning: HashMap<String, Option<String>>,
    /// When a round is already due for the next orphaned cordon's grace.
    orphan_wake: Option<std::time::Instant>,
    /// Pending requests whose last admission failed, and when they may be tried again; the
    /// scheduler lets the next request take the slot meanwhile. Cleared on success and when the
    /// request is gone, deleted or past Pending.
    admission_retries: HashMap<String, scheduler::AdmissionRetry>,
    /// Pending requests whose admission met a newer object than the cache showed (or none), with
    /// the resourceVersion it was built on: not tried again until the cache shows another
    /// version (or drops the request), as the same write would only fail the same way.
    stale_admissions: HashMap<String, String>,
    /// preferDrainable's last observation of which Pending requests' drains would wait on a
    /// budget (reused while no slot is free).
    drain_blockers: BTreeMap<RequestKey, DrainBlocker>,
    /// Failed actors: their failures in a row, and when they may start again.
    restarts: HashMap<String, (u32, Instant)>,
    change_queued: Arc<AtomicBool>,
    /// The config's logLevel last applied.
    log_level: Option<String>,
    /// When each waiting request's reason was last written, and under which limits.
    explanations: Explanations<String>,
    /// When a round is already due for the next garbage-collection deadline.
    collection_wake: Option<jiff::Timestamp>,
    /// When a round is already due for the next opening of a maintenance window.
    window_wake: Option<jiff::Timestamp>,
    /// When a round is already due for the next admission retry.
    retry_wake: Option<jiff::Timestamp>,
}

fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    strip: impl FnMut(&mut K) + Send + 'static,
    supervisor: ActorRef<SupervisorMsg>,
    queued: Arc<AtomicBool>,
) -> (Store<K>, AbortOnDrop)
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).modify(strip))
        .backoff(crate::task::watch_backoff())
        .touched_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => {
                    // Coalesce: one Changed in the mailbox stands for any number of events.
                    if !queued.swap(true, Ordering::AcqRel) {
                        let _ = supervisor.cast(SupervisorMsg::Changed);
                    }
                }
                Err(err) => tracing::warn!(%err, "watch error; retrying with backoff"),
            }
        }
    });
    (store, AbortOnDrop(task))
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
        let (requests, w1) = spawn_watch(
            Api::<NodeMaintenance>::all(client.clone()),
            watcher::Config::default(),
            |o| o.managed_fields_mut().clear(),
            myself.clone(),
            queued.clone(),
        );
        // Nodes are many: keep only what decisions read (`node_view`).
        let (nodes, w2) = spawn_watch(
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            node_view::trim,
            myself.clone(),
            queued.clone(),
        );
        let (configs, w3) = spawn_watch(
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
            ctx,
            requests,
            nodes,
            configs,
            _watches: vec![w1, w2, w3],
            actors: HashMap::new(),
            node_states: NodeStates::default(),
            next_round_at: Instant::now(),
            round_held: false,
            admitted: HashSet::new(),
            ended: HashMap::new(),
            admitting: HashSet::new(),
            writing: HashMap::new(),
            tainting: HashMap::new(),
            orphans: OrphanSightings::default(),
            uncordoning: HashMap::new(),
            orphan_wake: None,
            admission_retries: HashMap::new(),
            stale_admissions: HashMap::new(),
            drain_blockers: BTreeMap::new(),
            restarts: HashMap::new(),
            change_queued: queued,
            log_level: None,
            explanations: Explanations::default(),
            collection_wake: None,
            window_wake: None,
            retry_wake: None,
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
            // This round arms the timer again for whatever opening is next (the same one, should
            // the timer have fired a moment early by the wall clock).
            SupervisorMsg::WindowOpening => state.window_wake = None,
            SupervisorMsg::AdmissionRetryDue => state.retry_wake = None,
            SupervisorMsg::RoundDue => state.round_held = false,
            SupervisorMsg::Admitted {
                uid,
                attempted,
                outcome,
            } => {
                state.admitting.remove(&uid);
                match outcome {
                    AdmitOutcome::Done(written) => {
                        state.admission_retries.remove(&uid);
                        state.admitted.insert(uid);
                        state.ctx.metrics.requests_admitted_total.inc();
                        // The node actor starts now, from the version the admission wrote,
                        // rather than once the cache shows it (a watch hop on every slot's
                        // turn). The cache's event for the admission brings the next
                        // round.
                        let node_exists = state
                            .nodes
                            .get(&reflector::ObjectRef::new(&written.spec.node_name))
                            .is_some();
                        if lifecycle::needs_actor(&written, node_exists, true) {
                            ensure_actor(&myself, state, &written, node_exists).await;
                        }
                        return Ok(());
                    }
                    // No time backoff: the request did nothing wrong, the cache is only behind,
                    // and a wait would hand its slot to the next request (with
                    // maxParallelOperations=1, for a whole maintenance) over a label edit. It
                    // keeps its turn instead, without a write, until the cache shows its next
                    // version (the event that brings that round is on its way); so a retry is
                    // never the same write again, and the round below cannot spin.
                    AdmitOutcome::Changed => {
                        if let Some(version) = attempted {
                            state.stale_admissions.insert(uid, version);
                        }
                    }
                    // The round below admits the next request in its place.
                    AdmitOutcome::Failed { error } => {
                        let retry = scheduler::AdmissionRetry::after_failure(
                            state.admission_retries.get(&uid),
                            error,
                            jiff::Timestamp::now(),
                        );
                        tracing::info!(%uid, failures = retry.failures, retry_at = %retry.at, "admission backs off");
                        state.admission_retries.insert(uid, retry);
                    }
                }
            }
            SupervisorMsg::Written { written } => {
                record_written(&mut state.writing, written);
                return Ok(());
            }
            SupervisorMsg::Tainted { written } => {
                record_written(&mut state.tainting, written);
                return Ok(());
            }
            SupervisorMsg::Uncordoned { written } => {
                record_written(&mut state.uncordoning, written);
                return Ok(());
            }
            SupervisorMsg::OrphanDue => state.orphan_wake = None,
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
                let id = cell.get_id();
                let mut ended = Vec::new();
                state.actors.retain(|uid, running| {
                    let gone = running.actor.get_id() == id;
                    if gone {
                        tracing::debug!(%uid, ?reason, "node actor stopped");
                        // Stopped by the supervisor (its request gone from the cache), it left
                        // nothing.
                        if let Some(end) = running.end.get() {
                            ended.push((
                                uid.clone(),
                                end.clone()
                                    .at_least(running.request.resource_version().as_deref()),
                            ));
                        }
                    }
                    !gone
                });
                // Its slot is free now: a round gives it to the next request.
                if !ended.is_empty() {
                    state.ended.extend(ended);
                    paced_round(&myself, state).await;
                }
            }
            SupervisionEvent::ActorFailed(cell, err) => {
                let id = cell.get_id();
                let failed: Vec<String> = state
                    .actors
                    .iter()
                    .filter(|(_, running)| running.actor.get_id() == id)
                    .map(|(uid, _)| uid.clone())
                    .collect();
                for uid in failed {
                    // Forgotten: it starts again, from the version the cache shows then.
                    state.actors.remove(&uid);
                    let now = Instant::now();
                    let previous = state
                        .restarts
                        .get(&uid)
                        .map(|(n, started)| (*n, now.saturating_duration_since(*started)));
                    let (failures, delay) = actor_runs::restart_after_failure(previous);
                    tracing::error!(%uid, %err, failures, restart_in = ?delay, "node actor failed; restarting");
                    state.ctx.metrics.actor_restarts_total.inc();
                    state.restarts.insert(uid, (failures, now + delay));
                    myself.send_after(delay, || SupervisorMsg::Changed);
                }
            }
            _ => {}
        }
        Ok(())
    }
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

/// One scheduling round: initial status for new requests, admission, and node actors in step
/// with the requests.
async fn round(myself: &ActorRef<SupervisorMsg>, state: &mut SupervisorState) {
    let started = Instant::now();
    let ctx = state.ctx.clone();
    let requests = state.requests.state();
    let nodes = state.nodes.state();
    let config = state
        .configs
        .get(&reflector::ObjectRef::new(DEFAULT_CONFIG_NAME).within(&ctx.namespace));
    let config_spec = config.as_ref().map(|c| c.spec.clone());
    let log_level = config_spec
        .as_ref()
        .and_then(|c| c.log_level.clone())
        .unwrap_or_else(|| "info".to_string());
    if state.log_level.as_ref() != Some(&log_level) {
        if let Some(set) = &ctx.set_log_level {
            set(&log_level);
        }
        state.log_level = Some(log_level);
    }

    ctx.evictor.set_rate(EvictionRate {
        per_second: config_spec
            .as_ref()
            .map_or(maintenance_crds::DEFAULT_EVICTIONS_PER_SECOND, |c| {
                c.evictions_per_second()
            }),
        burst: config_spec
            .as_ref()
            .map_or(maintenance_crds::DEFAULT_EVICTION_BURST, |c| {
                c.eviction_burst()
            }),
    });

    // Borrowed keys: a round allocates nothing per request to find one.
    let by_key: HashMap<(&str, &str), &Arc<NodeMaintenance>> = requests
        .iter()
        .filter_map(|r| {
            let namespace = r.metadata.namespace.as_deref().unwrap_or_default();
            Some(((namespace, r.metadata.name.as_deref()?), r))
        })
        .collect();
    // The cache has caught up with admissions it now shows past Pending (or gone).
    let pending_uids: HashSet<&str> = requests
        .iter()
        .filter(|r| r.phase() == Phase::Pending)
        .filter_map(|r| r.metadata.uid.as_deref())
        .collect();
    state
        .admitted
        .retain(|uid| pending_uids.contains(uid.as_str()));
    // Writes the cache now shows (or whose request is gone) no longer hold their request back.
    let cached: HashMap<&str, &NodeMaintenance> = requests
        .iter()
        .filter_map(|r| Some((r.metadata.uid.as_deref()?, &**r)))
        .collect();
    // Ended requests the cache no longer shows need no memory.
    state
        .ended
        .retain(|uid, _| cached.contains_key(uid.as_str()));
    state
        .writing
        .retain(|uid, written| match (cached.get(uid.as_str()), written) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(request), Some(version)) => !lifecycle::shows_version(request, version),
        });
    state.admission_retries.retain(|uid, _| {
        cached
            .get(uid.as_str())
            .is_some_and(|r| r.phase() == Phase::Pending && !r.is_deleting())
    });
    state.stale_admissions.retain(|uid, attempted| {
        cached
            .get(uid.as_str())
            .is_some_and(|r| r.resource_version().as_deref() == Some(attempted.as_str()))
    });

    let nodes_by_name: HashMap<&str, &Arc<Node>> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
        .collect();
    for writing in [&mut state.tainting, &mut state.uncordoning] {
        writing.retain(
            |node, written| match (nodes_by_name.get(node.as_str()), written) {
                (None, _) => false,
                (Some(_), None) => true,
                (Some(shown), Some(version)) => {
                    !lifecycle::version_reached(shown.metadata.resource_version.as_deref(), version)
                }
            },
        );
    }
    let policy = collection_policy(&ctx, config_spec.as_ref());
    collect_garbage(myself, state, &requests, &nodes_by_name, &policy).await;

    let limits = Limits::from_config(config_spec.as_ref());
    let mut snapshot = Snapshot::from_states(
        state.node_states.observe(nodes.iter().map(|n| &**n)),
        requests.iter().map(|r| &**r),
    );
    for request in &mut snapshot.requests {
        let key = (request.namespace.as_str(), request.name.as_str());
        let Some(uid) = by_key.get(&key).and_then(|r| r.metadata.uid.as_deref()) else {
            continue;
        };
        if state.admitted.contains(uid) || state.admitting.contains(uid) {
            request.phase = Phase::Scheduled;
        }
        if state.ended.contains_key(uid) {
            request.released = true;
        }
        request.admission_retry = state.admission_retries.get(uid).cloned();
    }
    gone_holders(state, &mut snapshot, &cached, &nodes_by_name);
    undo_orphaned_cordons(
        myself,
        state,
        &mut snapshot,
        &nodes,
        &cached,
        &nodes_by_name,
    );
    update_phase_gauge(&ctx, &requests);
    // With every slot taken nothing is admitted: the pod reads below would be spent on nothing
    // (a rollout spends most of its rounds so). preferDrainable keeps its last observation, which
    // only words the Pending messages until a slot frees.
    let can_admit = scheduler::can_admit_any(&snapshot, &limits);
    let mut prefer = PreferDrainable::from_config(config_spec.as_ref());
    if !prefer.enabled {
        state.drain_blockers.clear();
    } else if !can_admit {
        prefer.blocked = state.drain_blockers.clone();
    } else {
        let unadmitted: Vec<Arc<NodeMaintenance>> = requests
            .iter()
            .filter(|r| {
                r.metadata.uid.as_deref().is_none_or(|uid| {
                    !state.admitted.contains(uid) && !state.admitting.contains(uid)
                })
            })
            .cloned()
            .collect();
        prefer.blocked = crate::drainability::observe_blockers(&ctx, &unadmitted, |node| {
            nodes_by_name.contains_key(node)
        })
        .await;
        state.drain_blockers = prefer.blocked.clone();
    }
    let mut capacity = CapacityCheck::from_config(config_spec.as_ref());
    if capacity.enabled && can_admit {
        // All requests, not only Pending ones: drains in progress need room too.
        capacity = crate::capacity::observe_capacity(&ctx, &requests, &nodes, |node| {
            nodes_by_name.contains_key(node)
        })
        .await
        .unwrap_or_default();
    }
    let now = jiff::Timestamp::now();
    let mut first_reasons: HashMap<(String, String), (String, WaitCause)> = HashMap::new();
    match scheduler::schedule_observed(&snapshot, &limits, &prefer, &capacity, now) {
        Ok(decision) => {
            ctx.metrics
                .available_slots
                .set(i64::from(decision.available_slots));
            ctx.metrics
                .can_become_unavailable
                .set(decision.can_become_unavailable.map_or(-1, i64::from));
            let samples: Vec<BudgetSample<'_>> = decision
                .budgets
                .iter()
                .flat_map(|budget| {
                    budget.groups.iter().map(|group| BudgetSample {
                        budget: &budget.name,
                        group: group.group.as_deref().unwrap_or_default(),
                        available_slots: group.available_slots,
                        can_become_unavailable: group.can_become_unavailable,
                    })
                })
                .collect();
            ctx.metrics.set_budgets(&samples);
            ctx.metrics
                .set_waiting(decision.waiting.iter().map(|w| w.cause));
            wake_at(
                myself,
                &mut state.window_wake,
                decision.next_window_opening,
                now,
                || SupervisorMsg::WindowOpening,
            );
            wake_at(
                myself,
                &mut state.retry_wake,
                decision.next_admission_retry,
                now,
                || SupervisorMsg::AdmissionRetryDue,
            );
            let to_admit: Vec<Arc<NodeMaintenance>> = decision
                .scheduled
                .iter()
                .filter_map(|key| {
                    by_key
                        .get(&(key.namespace.as_str(), key.name.as_str()))
                        .map(|r| Arc::clone(r))
                })
                .collect();
            // The decision is made; its writes are independent of each other, and the round does
            // not wait for them: the requests count as in maintenance until they are answered.
            // A stale one keeps the place the decision gave it, without a write.
            for request in to_admit {
                let Some(uid) = request.uid() else { continue };
                if state.writing.contains_key(&uid)
                    || state.stale_admissions.contains_key(&uid)
                    || !state.admitting.insert(uid.clone())
                {
                    continue;
                }
                let attempted = request.resource_version();
                let ctx = ctx.clone();
                let node = nodes_by_name
                    .get(request.spec.node_name.as_str())
                    .map(|n| Arc::clone(n));
                let supervisor = myself.clone();
                let version = attempted.clone();
                let writes = tokio::spawn(async move {
                    let outcome = admit(&ctx, &request, node.as_ref(), version.as_deref()).await;
                    if let AdmitOutcome::Done(admitted) = &outcome {
                        for transition in
                            lifecycle::admission_transitions(&request, jiff::Timestamp::now())
                        {
                            ctx.record_transition(admitted, &transition);
                        }
                    }
                    outcome
                });
                // Answered whatever happens to the writes (even a panic), or the request would
                // hold its slot for good.
                tokio::spawn(async move {
                    let outcome = writes.await.unwrap_or_else(|_| AdmitOutcome::Failed {
                        error: "the admission stopped unexpectedly (see the operator's log)"
                            .to_string(),
                    });
                    let _ = supervisor.cast(SupervisorMsg::Admitted {
                        uid,
                        attempted,
                        outcome,
                    });
                });
            }
            // A request for a node that does not exist says when it will be collected.
            let mut waiting = decision.waiting;
            for entry in &mut waiting {
                let key = (entry.key.namespace.as_str(), entry.key.name.as_str());
                if let Some(request) = by_key.get(&key)
                    && !nodes_by_name.contains_key(request.spec.node_name.as_str())
                {
                    entry.reason = collection::node_not_found_message(request, &policy);
                }
            }
            explain_waiting(
                myself,
                &ctx,
                &mut state.explanations,
                &mut state.writing,
                &limits,
                &by_key,
                &waiting,
            );
            first_reasons = waiting
                .into_iter()
                .map(|w| ((w.key.namespace, w.key.name), (w.reason, w.cause)))
                .collect();
        }
        Err(err) => {
            tracing::error!(%err, "cannot schedule: fix the MaintenanceOperatorConfig");
            ctx.error("schedule");
        }
    }
    // After admission: a request admitted in its first round gets no Pending write (it would make
    // the admission's guarded patch conflict and cost a round; the admission reports Pending);
    // the others get Pending with their reason in their first write.
    let busy: HashSet<String> = state
        .admitted
        .iter()
        .chain(&state.admitting)
        .chain(state.stale_admissions.keys())
        .cloned()
        .collect();
    let explained = prepare_pending_requests(
        myself,
        &ctx,
        &requests,
        &nodes_by_name,
        &busy,
        &mut state.writing,
        &first_reasons,
    );
    for (uid, cause) in explained {
        state.explanations.written(uid, cause, now);
    }
    let taint_waiting_nodes = config_spec.as_ref().is_none_or(|c| c.taint_waiting_nodes());
    reconcile_pending_taints(myself, state, &requests, &nodes, taint_waiting_nodes, &busy);

    sync_actors(myself, state, &requests).await;
    ctx.metrics.scheduler_runs_total.inc();
    ctx.metrics
        .scheduler_run_duration_seconds
        .observe(started.elapsed().as_secs_f64());
}

/// Admission starts when a window opens or an admission's backoff ends, not at the next
/// safety-net tick: a round is arranged (by `message`) just after `due`, the earliest such time
/// the decision names. One timer at a time per `armed`; an earlier time (a config edit, a newer
/// failure) arms another.
fn wake_at(
    myself: &ActorRef<SupervisorMsg>,
    armed: &mut Option<jiff::Timestamp>,
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
    if armed.is_none_or(|fires| at < fires) {
        *armed = Some(at);
        let delay = Duration::try_from(at.duration_since(now)).unwrap_or_default();
        myself.send_after(delay, message);
    }
}

fn collection_policy(
    ctx: &Context,
    config: Option<&MaintenanceOperatorConfigSpec>,
) -> collection::Policy {
    collection::Policy {
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
    nodes_by_name: &HashMap<&str, &Arc<Node>>,
    policy: &collection::Policy,
) {
    let ctx = state.ctx.clone();
    let now = jiff::Timestamp::now();
    let sweep = collection::sweep(
        requests.iter().map(|r| &**r),
        |node| nodes_by_name.contains_key(node),
        policy,
        now,
    );
    if let Some(at) = sweep.next_check
        && state
            .collection_wake
            .is_none_or(|armed| armed <= now || at < armed)
    {
        state.collection_wake = Some(at);
        let delay = Duration::try_from(at.duration_since(now)).unwrap_or_default();
        myself.send_after(delay, || SupervisorMsg::Changed);
    }
    for (request, cause) in sweep.collect {
        match collect(&ctx, request, &cause).await {
            Ok(true) => {
                ctx.metrics
                    .requests_garbage_collected_total
                    .with_label_values(&[cause.metric_label()])
                    .inc();
            }
            Ok(false) => {}
            Err(err) if is_conflict(&err) || is_not_found(&err) => {}
            Err(err) => {
                tracing::warn!(request = %request.key(), %err, "could not garbage-collect request; will retry");
                ctx.error("garbage_collect");
            }
        }
    }
}

/// Deletes one request, guarded by the UID and resourceVersion the decision saw (a request
/// annotated `garbage-collector.ignore` meanwhile is kept). A node that the cache lacks is looked
/// up first: the cache may not show a node created a moment ago. Returns whether it deleted.
async fn collect(
    ctx: &Context,
    request: &NodeMaintenance,
    cause: &Cause,
) -> Result<bool, kube::Error> {
    if matches!(cause, Cause::NodeNotFound { .. }) {
        let nodes: Api<Node> = Api::all(ctx.client.clone());
        if nodes
            .get_metadata_opt(&request.spec.node_name)
            .await?
            .is_some()
        {
            return Ok(false);
        }
    }
    let api: Api<NodeMaintenance> =
        Api::namespaced(ctx.client.clone(), &request.namespace().unwrap_or_default());
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: request.uid(),
            resource_version: request.resource_version(),
        }),
        ..DeleteParams::default()
    };
    api.delete(&request.name_any(), &params).await?;
    // After the deletion, so that a refused one says nothing; the Event outlives the request.
    let note = cause.describe(request);
    tracing::info!(request = %request.key(), cause = cause.metric_label(), "{note}");
    ctx.event(request, true, EventReason::GarbageCollected.as_str(), note);
    Ok(true)
}

fn update_phase_gauge(ctx: &Context, requests: &[Arc<NodeMaintenance>]) {
    let mut counts: HashMap<Phase, i64> = Phase::ALL.iter().map(|p| (*p, 0)).collect();
    for request in requests {
        *counts.entry(request.phase()).or_default() += 1;
    }
    for (phase, count) in counts {
        ctx.metrics
            .requests
            .with_label_values(&[phase.as_str()])
            .set(count);
    }
}

/// A waiting request's Pending condition says why it waits (the scheduler's reason), so that
/// `kubectl describe nm` answers "why is my request still Pending?". Which ones are rewritten now
/// (throttled per request, but at once after a change of the limits) is decided in core.
fn explain_waiting(
    myself: &ActorRef<SupervisorMsg>,
    ctx: &Arc<Context>,
    explanations: &mut Explanations<String>,
    writing: &mut HashMap<String, Option<String>>,
    limits: &Limits,
    by_key: &HashMap<(&str, &str), &Arc<NodeMaintenance>>,
    waiting: &[scheduler::Waiting],
) {
    let mut observed: Vec<Observed<'_, String>> = Vec::new();
    let mut by_uid: HashMap<String, (&Arc<NodeMaintenance>, &str)> = HashMap::new();
    for entry in waiting {
        let key = (entry.key.namespace.as_str(), entry.key.name.as_str());
        let Some(request) = by_key.get(&key) else {
            continue;
        };
        let Some(uid) = request.uid() else { continue };
        // One being deleted is going away. Only a Pending condition carries the reason: a new
        // request gets its first message from `prepare_pending_requests`, and is observed
        // without one until the cache shows it.
        if request.is_deleting() {
            continue;
        }
        let message = match request.condition(condition_type::READY) {
            None => None,
            Some(c) if c.reason == Phase::Pending.as_str() => Some(c.message.as_str()),
            Some(_) => continue,
        };
        observed.push(Observed {
            key: uid.clone(),
            reason: &entry.reason,
            cause: entry.cause,
            message,
        });
        by_uid.insert(uid, (request, &entry.reason));
    }
    // Requests with a write in flight stay in what the memory observes (or it would forget
    // them and explain them again at once); they are only left out of this round's writes.
    let chosen = explanations.round(limits, &observed, jiff::Timestamp::now());
    let writes: Vec<(String, (Arc<NodeMaintenance>, String))> = chosen
        .iter()
        .filter(|uid| !writing.contains_key(*uid))
        .filter_map(|uid| Some((uid.clone(), by_uid.get(uid)?)))
        .map(|(uid, (request, reason))| (uid, (Arc::clone(request), reason.to_string())))
        .collect();
    spawn_writes(
        myself,
        writing,
        writes,
        |ctx, (request, reason)| async move {
            match ctx
                .transition(&request, Phase::Pending, &reason, |_| {})
                .await
            {
                Ok(written) => written.resource_version(),
                Err(err) if is_conflict(&err) || is_not_found(&err) => None,
                Err(err) => {
                    tracing::warn!(request = %request.key(), %err, "could not explain why it waits");
                    ctx.error("pending");
                    None
                }
            }
        },
        |written| SupervisorMsg::Written { written },
        ctx,
    );
}

/// Runs `write` for each item, [`PARALLEL_WRITES`] at a time, in a task the round does not wait
/// for. Each item is keyed (a request's UID, a node's name) and its write returns the
/// resourceVersion it wrote, if any; the key counts as `writing` until the cache shows that
/// version (or, when nothing was written, until the supervisor hears so through `answer`, even if
/// the task panicked).
fn spawn_writes<T, F, Fut>(
    myself: &ActorRef<SupervisorMsg>,
    writing: &mut HashMap<String, Option<String>>,
    items: Vec<(String, T)>,
    write: F,
    answer: fn(Vec<(String, Option<String>)>) -> SupervisorMsg,
    ctx: &Arc<Context>,
) where
    T: Send + 'static,
    F: Fn(Arc<Context>, T) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Option<String>> + Send,
{
    if items.is_empty() {
        return;
    }
    let keys: Vec<String> = items.iter().map(|(key, _)| key.clone()).collect();
    for key in &keys {
        writing.insert(key.clone(), None);
    }
    let ctx = ctx.clone();
    let writes = tokio::spawn(async move {
        futures::stream::iter(items)
            .map(|(key, item)| {
                let written = write(ctx.clone(), item);
                async move { (key, written.await) }
            })
            .buffer_unordered(PARALLEL_WRITES)
            .collect::<Vec<(String, Option<String>)>>()
            .await
    });
    let supervisor = myself.clone();
    tokio::spawn(async move {
        let written = match writes.await {
            Ok(written) => written,
            // A panicked task wrote who knows what: release every key to the next round.
            Err(_) => keys.into_iter().map(|key| (key, None)).collect(),
        };
        let _ = supervisor.cast(answer(written));
    });
}

/// Records the answers of [`spawn_writes`] in its `writing` map.
fn record_written(
    writing: &mut HashMap<String, Option<String>>,
    written: Vec<(String, Option<String>)>,
) {
    for (key, version) in written {
        match version {
            Some(version) => {
                writing.insert(key, Some(version));
            }
            None => {
                writing.remove(&key);
            }
        }
    }
}

/// Nodes carry the `PreferNoSchedule` taint of [`pending_taint`] exactly while a request on them
/// waits for admission with a drain to do (decided in core); the writes run in a task, and a node
/// is not written again until the cache shows the write (or it is answered as not written).
fn reconcile_pending_taints(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    requests: &[Arc<NodeMaintenance>],
    nodes: &[Arc<Node>],
    enabled: bool,
    busy: &HashSet<String>,
) {
    let wanted = pending_taint::wanted_nodes(
        enabled,
        requests.iter().map(|r| {
            let being_admitted = r
                .metadata
                .uid
                .as_deref()
                .is_some_and(|uid| busy.contains(uid));
            (&**r, being_admitted)
        }),
    );
    let tainting = &state.tainting;
    let writes = pending_taint::taint_writes(nodes.iter().map(|n| &**n), &wanted, |node| {
        node.metadata
            .name
            .as_deref()
            .is_some_and(|name| tainting.contains_key(name))
    });
    let items: Vec<(String, pending_taint::TaintWrite)> =
        writes.into_iter().map(|w| (w.node.clone(), w)).collect();
    let ctx = state.ctx.clone();
    spawn_writes(
        myself,
        &mut state.tainting,
        items,
        |ctx, write| async move {
            let patch = serde_json::json!({
                "metadata": { "resourceVersion": write.resource_version },
                "spec": { "taints": write.taints },
            });
            let nodes: Api<Node> = Api::all(ctx.client.clone());
            match nodes
                .patch(&write.node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(written) => {
                    tracing::debug!(node = %write.node, add = write.add, "pending-drain taint written");
                    written.resource_version()
                }
                Err(err) if is_conflict(&err) || is_not_found(&err) => None,
                Err(err) => {
                    let what = if write.add { "add" } else { "remove" };
                    tracing::warn!(node = %write.node, %err, "could not {what} the taint {}; the next round tries again", pending_taint::PENDING_DRAIN_TAINT_KEY);
                    ctx.error("taint");
                    None
                }
            }
        },
        |written| SupervisorMsg::Tainted { written },
        &ctx,
    );
}

/// New requests that the round did not admit get a Pending condition with the round's reason, so
/// `kubectl get nm` shows them as waiting and why, and a Pending request that has waited
/// [`ownership::PENDING_OWNER_DELAY`] gets its Node as owner, so deleting the node
/// garbage-collects requests that never started (the admission writes it for the others).
/// Requests admitted but still shown Pending by the cache are left to `admit`.
fn prepare_pending_requests(
    myself: &ActorRef<SupervisorMsg>,
    ctx: &Arc<Context>,
    requests: &[Arc<NodeMaintenance>],
    nodes_by_name: &HashMap<&str, &Arc<Node>>,
    admitted: &HashSet<String>,
    writing: &mut HashMap<String, Option<String>>,
    reasons: &HashMap<(String, String), (String, WaitCause)>,
) -> Vec<(String, WaitCause)> {
    let now = jiff::Timestamp::now();
    type Work = (bool, Option<Vec<OwnerReference>>, String);
    let mut explained = Vec::new();
    let mut work: Vec<(String, (Arc<NodeMaintenance>, Work))> = Vec::new();
    for request in requests {
        if request.is_deleting()
            || request.phase() != Phase::Pending
            || request
                .uid()
                .is_some_and(|uid| admitted.contains(&uid) || writing.contains_key(&uid))
        {
            continue;
        }
        let is_new = lifecycle::never_marked_pending(request);
        let created = request.metadata.creation_timestamp.as_ref().map(|t| t.0);
        let owners = ownership::pending_owner_due(created, now)
            .then(|| {
                ownership::owner_references(
                    request.owner_references(),
                    node_identity(nodes_by_name.get(request.spec.node_name.as_str()).copied()),
                )
            })
            .flatten();
        if is_new || owners.is_some() {
            let key = (request.namespace().unwrap_or_default(), request.name_any());
            let reason = reasons.get(&key);
            // The new ones get their first reason in this write: the caller records it as
            // explained.
            if let (true, Some((_, cause)), Some(uid)) = (is_new, reason, request.uid()) {
                explained.push((uid, *cause));
            }
            let reason = reason.map_or("waiting for admission", |(reason, _)| reason.as_str());
            if let Some(uid) = request.uid() {
                work.push((
                    uid,
                    (Arc::clone(request), (is_new, owners, reason.to_string())),
                ));
            }
        }
    }
    spawn_writes(
        myself,
        writing,
        work,
        |ctx, (request, (is_new, owners, reason))| async move {
            let result = async {
                let mut request = match owners {
                    Some(owners) => set_owners(&ctx, &request, &owners).await?,
                    None => (*request).clone(),
                };
                if is_new {
                    request = ctx
                        .transition(&request, Phase::Pending, &reason, |_| {})
                        .await?;
                }
                Ok::<NodeMaintenance, kube::Error>(request)
            }
            .await;
            match result {
                Ok(written) => written.resource_version(),
                Err(err) if is_conflict(&err) || is_not_found(&err) => None,
                Err(err) => {
                    tracing::warn!(request = %request.key(), %err, "could not set Pending or the node as owner");
                    ctx.error("pending");
                    None
                }
            }
        },
        |written| SupervisorMsg::Written { written },
        ctx,
    );
    explained
}

/// The node as ownership needs it; `None` while it is not in the cache (or has no UID yet).
fn node_identity(node: Option<&Arc<Node>>) -> Option<NodeIdentity<'_>> {
    let node = node?;
    Some(NodeIdentity {
        name: node.metadata.name.as_deref()?,
        uid: node.metadata.uid.as_deref()?,
    })
}

/// Writes the owner references, guarded by the resourceVersion we read (a merge patch replaces
/// the whole list, so a concurrent edit must fail rather than be overwritten).
async fn set_owners(
    ctx: &Context,
    request: &NodeMaintenance,
    owners: &[OwnerReference],
) -> Result<NodeMaintenance, kube::Error> {
    let api: Api<NodeMaintenance> =
        Api::namespaced(ctx.client.clone(), &request.namespace().unwrap_or_default());
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": request.resource_version(),
            "ownerReferences": owners,
        }
    });
    api.patch(
        &request.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}

/// Admits `request` (built on resourceVersion `attempted`) with [`write_admission`]. A write
/// whose answer was lost (a server error, no answer) may have been applied: the request is read
/// back before the outcome is told, and until it is told the request counts as admitted, so its
/// slot is never given to another request beside it. The caller reports the phase changes of a
/// `Done` (Events, metrics).
async fn admit(
    ctx: &Context,
    request: &NodeMaintenance,
    node: Option<&Arc<Node>>,
    attempted: Option<&str>,
) -> AdmitOutcome {
    let err = match write_admission(ctx, request, node).await {
        Ok(written) => return AdmitOutcome::Done(Arc::new(written)),
        Err(err) => err,
    };
    let failed = |ctx: &Context, err: &kube::Error| {
        tracing::warn!(request = %request.key(), %err, "could not admit request; will retry");
        ctx.error("admit");
        AdmitOutcome::Failed {
            error: api_message(err),
        }
    };
    match lifecycle::admission_failure(api_status_code(&err)) {
        lifecycle::AdmissionFailure::Stale => AdmitOutcome::Changed,
        lifecycle::AdmissionFailure::Refused => failed(ctx, &err),
        lifecycle::AdmissionFailure::OutcomeUnknown => {
            tracing::info!(request = %request.key(), %err, "the admission's answer was lost; reading the request back");
            let read = read_back(ctx, request).await;
            match lifecycle::admission_read_back(attempted, read.as_ref()) {
                lifecycle::AdmissionReadBack::NotApplied => failed(ctx, &err),
                lifecycle::AdmissionReadBack::Stale => AdmitOutcome::Changed,
                lifecycle::AdmissionReadBack::Applied => match read {
                    Some(admitted) => AdmitOutcome::Done(Arc::new(admitted)),
                    None => AdmitOutcome::Changed,
                },
            }
        }
    }
}

/// The request as the API server shows it now (`None`: gone), read until it answers: the
/// request keeps its slot meanwhile, which is safe, whereas a guess is not.
async fn read_back(ctx: &Context, request: &NodeMaintenance) -> Option<NodeMaintenance> {
    use backon::Retryable;
    let api: Api<NodeMaintenance> =
        Api::namespaced(ctx.client.clone(), &request.namespace().unwrap_or_default());
    let name = request.name_any();
    let schedule = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(5))
        .with_jitter()
        .without_max_times();
    (|| api.get_opt(&name))
        .retry(schedule)
        .notify(|err, after| {
            tracing::warn!(request = %request.key(), %err, retry_in = ?after, "cannot read the request back after its admission's answer was lost; it keeps its slot meanwhile");
        })
        .await
        .ok()
        .flatten()
}

/// Pending -> Scheduled in one metadata write, which is the admission: the finalizer, the node
/// as owner and the admission's annotations (the node's initial state and the request's UID
/// among them), so cleanup is guaranteed, deleting the node removes the request, and the first
/// step can cordon at once. No status write: the object shows the request Scheduled
/// (`NodeMaintenance::phase`), and the node actor's next phase is the first status it writes.
async fn write_admission(
    ctx: &Context,
    request: &NodeMaintenance,
    node: Option<&Arc<Node>>,
) -> Result<NodeMaintenance, kube::Error> {
    let api: Api<NodeMaintenance> =
        Api::namespaced(ctx.client.clone(), &request.namespace().unwrap_or_default());
    let mut finalizers: Vec<String> = request.finalizers().to_vec();
    if !finalizers.iter().any(|f| f == FINALIZER) {
        finalizers.push(FINALIZER.to_string());
    }
    // Usually already set while the request was Pending; the same rule either way.
    let owners = ownership::owner_references(request.owner_references(), node_identity(node))
        .unwrap_or_else(|| request.owner_references().to_vec());
    // The initial state decides the uncordon: a cached node is used only when it shows the node
    // schedulable (`admission_node_view`), else it is read from the API server, as the cache may
    // still show the cordon of a request on this node released a moment ago.
    let node_view = match (
        lifecycle::initial_state(request),
        lifecycle::admission_node_view(node.map(|n| n.as_ref())),
    ) {
        (Some(_), _) => lifecycle::NodeView::Missing,
        (None, Some(cached)) => cached,
        (None, None) => {
            let nodes: Api<Node> = Api::all(ctx.client.clone());
            lifecycle::NodeView::of(nodes.get_opt(&request.spec.node_name).await?.as_ref())
        }
    };
    let now = jiff::Timestamp::now();
    let annotations = lifecycle::admission_annotations(request, node_view, now);
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": request.resource_version(),
            "finalizers": finalizers,
            "ownerReferences": owners,
            "annotations": annotations,
        }
    });
    api.patch(
        &request.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}

/// Actors whose request went without our cleanup hold its node in the scheduler's view until
/// they have undone the cordon (`lifecycle::actor_holds_node_of_gone_request`): a request the
/// cache shows released (our finalizer removed by someone else) is not, and one it no longer
/// shows is counted from the actor's last version.
fn gone_holders(
    state: &SupervisorState,
    snapshot: &mut Snapshot,
    cached: &HashMap<&str, &NodeMaintenance>,
    nodes_by_name: &HashMap<&str, &Arc<Node>>,
) {
    for (uid, running) in &state.actors {
        let last = &running.request;
        let shown = cached.get(uid.as_str()).copied();
        let node_exists = nodes_by_name.contains_key(last.spec.node_name.as_str());
        if !lifecycle::actor_holds_node_of_gone_request(
            last,
            shown,
            node_exists,
            state.admitted.contains(uid),
        ) {
            continue;
        }
        let key = (
            last.metadata.namespace.as_deref().unwrap_or_default(),
            last.metadata.name.as_deref().unwrap_or_default(),
        );
        let same = shown.is_some_and(|r| r.metadata.uid == last.metadata.uid);
        match snapshot
            .requests
            .iter_mut()
            .find(|r| same && (r.namespace.as_str(), r.name.as_str()) == key)
        {
            Some(request) => request.released = false,
            None => {
                let mut holder = scheduler::RequestState::from_request(last);
                holder.released = false;
                snapshot.requests.push(holder);
            }
        }
    }
}

/// Nodes cordoned by a request that nothing of ours holds any more (gone without our cleanup
/// while no actor remembered it: the operator down, the actor failed): held in the scheduler's
/// view from the first sighting, uncordoned once seen so for `cordon_mark::ORPHAN_GRACE`, by a
/// write guarded by the node's resourceVersion (a cache that still shows a mark we removed is
/// behind, and the write conflicts).
fn undo_orphaned_cordons(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    snapshot: &mut Snapshot,
    nodes: &[Arc<Node>],
    cached: &HashMap<&str, &NodeMaintenance>,
    nodes_by_name: &HashMap<&str, &Arc<Node>>,
) {
    // An actor that ended has removed its mark with its uncordon; a cache of nodes that still
    // shows it is behind, and the node is not held for it.
    let in_progress = |uid: &str| {
        state.actors.contains_key(uid)
            || state.ended.contains_key(uid)
            || state.admitted.contains(uid)
            || state.admitting.contains(uid)
            || cached.get(uid).is_some_and(|r| {
                let node_exists = nodes_by_name.contains_key(r.spec.node_name.as_str());
                lifecycle::needs_actor(r, node_exists, false)
            })
    };
    let orphans = cordon_mark::orphaned_cordons(nodes.iter().map(|n| &**n), in_progress);
    let now = Instant::now().into_std();
    let round = state.orphans.observe(orphans, now);
    for mark in &round.held {
        match snapshot.requests.iter_mut().find(|r| {
            (r.namespace.as_str(), r.name.as_str()) == (mark.namespace.as_str(), mark.name.as_str())
                && r.node_name == mark.node
                && r.phase != Phase::Pending
        }) {
            Some(request) => request.released = false,
            None => snapshot.requests.push(mark.holder()),
        }
    }
    if let Some(due) = round.next_due
        && state.orphan_wake.is_none_or(|armed| due < armed)
    {
        state.orphan_wake = Some(due);
        // A little after, so that the round finds the grace passed.
        let delay = due.saturating_duration_since(now) + Duration::from_millis(100);
        myself.send_after(delay, || SupervisorMsg::OrphanDue);
    }
    let uncordoning = &state.uncordoning;
    let due: Vec<(String, CordonMark)> = round
        .due
        .into_iter()
        .filter(|mark| !uncordoning.contains_key(&mark.node))
        .map(|mark| (mark.node.clone(), mark))
        .collect();
    let ctx = state.ctx.clone();
    spawn_writes(
        myself,
        &mut state.uncordoning,
        due,
        |ctx, mark| async move {
            let patch = cordon_mark::uncordon_patch(mark.resource_version.as_deref());
            let nodes: Api<Node> = Api::all(ctx.client.clone());
            let request = format!("{}/{} (uid {})", mark.namespace, mark.name, mark.uid);
            match nodes
                .patch(&mark.node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(written) => {
                    let note = format!(
                        "uncordoned {}: its request {request} went without our cleanup (deleted \
                         under our finalizer, or the finalizer removed by hand) while no node \
                         actor remembered it",
                        mark.node
                    );
                    tracing::warn!(node = %mark.node, %request, "orphaned cordon undone");
                    ctx.event_on(
                        kube::Resource::object_ref(&written, &()),
                        true,
                        EventReason::Uncordon.as_str(),
                        note,
                    );
                    written.resource_version()
                }
                // The cache was behind (our own uncordon, another request's cordon): the next
                // round decides on the node as it is now.
                Err(err) if is_conflict(&err) || is_not_found(&err) => None,
                Err(err) => {
                    tracing::warn!(node = %mark.node, %request, %err, "could not uncordon the node of a request that is gone; the next round tries again");
                    ctx.error("uncordon_orphan");
                    None
                }
            }
        },
        |written| SupervisorMsg::Uncordoned { written },
        &ctx,
    );
}

/// Keeps one node actor per request in progress and forwards each new version to it.
async fn sync_actors(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    requests: &[Arc<NodeMaintenance>],
) {
    let mut live: HashSet<String> = HashSet::new();
    for request in requests {
        let Some(uid) = request.uid() else { continue };
        let node_exists = state
            .nodes
            .get(&reflector::ObjectRef::new(&request.spec.node_name))
            .is_some();
        if !lifecycle::needs_actor(request, node_exists, state.admitted.contains(&uid)) {
            continue;
        }
        live.insert(uid.clone());
        ensure_actor(myself, state, request, node_exists).await;
    }
    // Requests that went without our cleanup (gone, or our finalizer removed by someone else):
    // their actors undo what the request did to the node (`lifecycle::on_request_gone`), then
    // stop; until then they hold the node (`gone_holders`).
    for (uid, running) in &mut state.actors {
        if !live.contains(uid) && !running.told_gone {
            running.told_gone = true;
            let _ = running.actor.cast(NodeMsg::RequestGone);
        }
    }
    state.restarts.retain(|uid, _| live.contains(uid));
}

/// Forwards `request` to its node actor, or starts one for it (`actor_runs::next_action`).
async fn ensure_actor(
    myself: &ActorRef<SupervisorMsg>,
    state: &mut SupervisorState,
    request: &Arc<NodeMaintenance>,
    node_exists: bool,
) {
    let Some(uid) = request.uid() else { return };
    let version = request.resource_version();
    let forwarded = state.actors.get(&uid).map(|r| r.request.resource_version());
    let run = match (&forwarded, state.ended.get(&uid)) {
        (Some(forwarded), _) => ActorRun::Running {
            forwarded: forwarded.as_deref(),
        },
        (None, Some(end)) => ActorRun::Ended(end),
        (None, None) => ActorRun::Never,
    };
    match actor_runs::next_action(run, version.as_deref(), node_exists) {
        ActorAction::Nothing => {}
        ActorAction::Forward => {
            if let Some(running) = state.actors.get_mut(&uid) {
                running.request = request.clone();
                let _ = running.actor.cast(NodeMsg::Updated(request.clone()));
            }
        }
        ActorAction::Step => {
            if let Some(running) = state.actors.get(&uid) {
                let _ = running.actor.cast(NodeMsg::Step);
            }
        }
        ActorAction::Start => {
            if state
                .restarts
                .get(&uid)
                .is_some_and(|(_, not_before)| *not_before > Instant::now())
            {
                return;
            }
            let end = Arc::new(OnceLock::new());
            let args = NodeArgs {
                ctx: state.ctx.clone(),
                request: request.clone(),
                nodes: state.nodes.clone(),
                end: end.clone(),
            };
            // Actor names are global: the UID keeps them unique across namespaces and
            // re-creations.
            let name = format!("node-maintenance-{uid}");
            match Actor::spawn_linked(Some(name), NodeActor, args, myself.get_cell()).await {
                Ok((actor, _)) => {
                    // Work again (a node back under its old name): the request holds its slot.
                    state.ended.remove(&uid);
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
                    tracing::error!(request = %request.key(), %err, "could not start node actor");
                    state.ctx.error("spawn");
                }
            }
        }
    }
}
