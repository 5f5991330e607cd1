//! What every actor shares: clients, the eviction executor, metrics, the event queue, and the
//! few API writes that several actors make (status, events).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt};
use maintenance_core::machine_config_pool::Detection;
use maintenance_crds::{MachineConfigPools, NodeMaintenance, NodeMaintenanceStatus, Phase};

use crate::events::EventQueue;
use crate::evictor::Evictor;
use crate::metrics::Metrics;
use crate::notifier::{Detail, Notifier};
use crate::pdb_watch::PdbWatches;
use crate::watch_connections::WatchConnections;
use maintenance_core::drain_plan::OperatorIdentity;
use maintenance_core::lifecycle::{self, StatusWrite, Transition};
use maintenance_core::notifications::{self, NotificationEvent};

/// Applies a `logLevel` from the config (debug, info, error).
pub type LogLevelSetter = Box<dyn Fn(&str) + Send + Sync>;

/// Reason of the Event on every phase change, as NVIDIA's controller emits it; the note is the new
/// phase, then `: ` and why when there is a message.
pub const CONDITION_CHANGED_EVENT_REASON: &str = "ConditionChanged";

/// Name of this controller in Events and field managers.
pub const CONTROLLER_NAME: &str = "maintenance-operator";

pub struct Context {
    pub client: kube::Client,
    /// The clients of the request actors' pod watches (HTTP/2: many watches on a connection).
    pub pod_watches: WatchConnections,
    pub evictor: Evictor,
    /// Watches of the PDBs that block drains now.
    pub pdbs: PdbWatches,
    pub metrics: Arc<Metrics>,
    /// Events, sent in the background.
    pub events: EventQueue,
    /// Where the operator runs: its config `default` lives here.
    pub namespace: String,
    /// The operator's own pods, never evicted.
    pub identity: OperatorIdentity,
    /// Safety-net period of the supervisor's scheduling round.
    pub tick: Duration,
    /// Set once the supervisor's caches are synced (for `/readyz`).
    pub synced: AtomicBool,
    /// Set while this process holds the leader lease (or runs without election).
    pub leading: AtomicBool,
    /// Applies the config's `logLevel` (absent when the environment pins the log filter).
    pub set_log_level: Option<LogLevelSetter>,
    /// How long a Pending request may wait for a node that does not exist before it is deleted.
    pub missing_node_grace: Duration,
    /// The config's `admission.protectFromAutoscalers`, as the supervisor last read it: whether
    /// a cordon also keeps the autoscalers off the node.
    pub protect_from_autoscalers: AtomicBool,
    /// The lifecycle notifications to the config's webhooks, sent in the background.
    pub notifier: Notifier,
    /// The config's `admission.yieldBlockedDrainAfterSeconds` as the supervisor last read it, in
    /// seconds; 0: unset (a drain that budgets block keeps its slot).
    pub yield_blocked_drain_after_seconds: AtomicU64,
    /// The config's `openshift.machineConfigPools`, as the supervisor last read it.
    machine_config_pools: std::sync::Mutex<MachineConfigPools>,
    /// The last automatic detection of OpenShift, and when it was made; forgotten when the
    /// setting changes (`machine_config_pool::pools_on` says when it is made again).
    pub openshift_detection: std::sync::Mutex<Option<(Detection, jiff::Timestamp)>>,
    /// Held by a request actor from reading its node's pool to writing it, and by a release from
    /// reading a pool and its holders to unpausing it: a pause and a release never interleave
    /// (NVIDIA's `mcpManager` holds a mutex the same way, internal/openshift/mcp.go).
    pub pools_lock: Arc<tokio::sync::Mutex<()>>,
}

/// Default of [`Context::missing_node_grace`]: long enough for a node being provisioned to
/// register, short enough that a typo does not linger.
pub const DEFAULT_MISSING_NODE_GRACE: Duration = Duration::from_secs(300);

impl Context {
    /// `pdbs` is the PDB cache `evictor` was built with (one watch for both).
    pub fn new(
        client: kube::Client,
        evictor: Evictor,
        pdbs: PdbWatches,
        metrics: Arc<Metrics>,
        namespace: String,
        pod_name: Option<String>,
        tick: Duration,
    ) -> Context {
        let reporter = Reporter {
            controller: CONTROLLER_NAME.to_string(),
            instance: pod_name.clone(),
        };
        let identity = OperatorIdentity::new(namespace.clone(), pod_name);
        Context {
            events: EventQueue::start(Recorder::new(client.clone(), reporter), metrics.clone()),
            notifier: Notifier::new(client.clone(), namespace.clone(), metrics.clone()),
            pdbs,
            pod_watches: WatchConnections::shared(client.clone()),
            client,
            evictor,
            metrics,
            namespace,
            identity,
            tick,
            synced: AtomicBool::new(false),
            leading: AtomicBool::new(false),
            set_log_level: None,
            missing_node_grace: DEFAULT_MISSING_NODE_GRACE,
            protect_from_autoscalers: AtomicBool::new(true),
            yield_blocked_drain_after_seconds: AtomicU64::new(0),
            machine_config_pools: std::sync::Mutex::new(MachineConfigPools::Auto),
            openshift_detection: std::sync::Mutex::new(None),
            pools_lock: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// The config's `openshift.machineConfigPools`.
    pub fn machine_config_pools(&self) -> MachineConfigPools {
        *self
            .machine_config_pools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Applies the config's `openshift.machineConfigPools`; a change forgets the detection, so
    /// that the next request that needs it detects again.
    pub fn set_machine_config_pools(&self, setting: MachineConfigPools) {
        let mut current = self
            .machine_config_pools
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *current != setting {
            *current = setting;
            *self
                .openshift_detection
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        }
    }

    /// How long a drain that budgets block keeps its slot; `None`: for good.
    pub fn yield_blocked_drain_after(&self) -> Option<Duration> {
        match self
            .yield_blocked_drain_after_seconds
            .load(Ordering::Relaxed)
        {
            0 => None,
            seconds => Some(Duration::from_secs(seconds)),
        }
    }

    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    pub fn is_leading(&self) -> bool {
        self.leading.load(Ordering::Relaxed)
    }

    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::Relaxed);
    }

    /// Queues a lifecycle notification of `request` for the receivers subscribed to `event`
    /// (never waits; see [`Notifier`]).
    pub fn notify(&self, event: NotificationEvent, request: &NodeMaintenance, detail: Detail) {
        self.notifier.notify(event, request, detail);
    }

    pub fn error(&self, step: &str) {
        self.metrics
            .process
            .errors_total
            .with_label_values(&[step])
            .inc();
    }

    /// Queues an Event on the request (see [`EventQueue`]: sent in the background, best effort).
    pub fn event(&self, nm: &NodeMaintenance, warning: bool, reason: &str, note: String) {
        self.event_with_action(nm, warning, reason, reason, note);
    }

    /// An Event whose `action` differs from its reason. kube's recorder folds Events of the same
    /// reason and action on one object into a series that keeps the first note, so the phase
    /// changes, which share NVIDIA's reason, carry the phase as action to stay apart.
    pub fn event_with_action(
        &self,
        nm: &NodeMaintenance,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let reference: ObjectReference = nm.object_ref(&());
        self.publish(reference, warning, reason, action, note, None);
    }

    /// Queues an Event on any object (a Node whose orphaned cordon was undone).
    pub fn event_on(&self, reference: ObjectReference, warning: bool, reason: &str, note: String) {
        self.publish(reference, warning, reason, reason, note, None);
    }

    /// Queues an Event on any object, with an action of its own (see [`Context::event_with_action`]).
    pub fn event_on_with_action(
        &self,
        reference: ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.publish(reference, warning, reason, action, note, None);
    }

    /// The Warning Events of a pod deleted past `drainSpec.forceDeleteAfterSeconds`: one on the
    /// request (its `related` object is the pod, which also keeps the Events of several pods
    /// apart: the recorder folds Events by reason, action and related object), and one on the
    /// pod, where the workload's owner looks (its `related` object is the request).
    pub fn force_deleted_events(
        &self,
        nm: &NodeMaintenance,
        pod: &ObjectReference,
        reason: &str,
        note: String,
    ) {
        let request: ObjectReference = nm.object_ref(&());
        self.publish(
            request.clone(),
            true,
            reason,
            reason,
            note.clone(),
            Some(pod.clone()),
        );
        self.publish(pod.clone(), true, reason, reason, note, Some(request));
    }

    fn publish(
        &self,
        reference: ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
        secondary: Option<ObjectReference>,
    ) {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(note),
            action: action.to_string(),
            secondary,
        };
        self.events.publish(event, reference);
    }

    /// Writes the whole status, guarded by the resourceVersion we read, so a concurrent writer
    /// (the requestor setting RequestorFailed) is never overwritten: a conflict returns an error
    /// and the caller re-reads.
    pub async fn write_status(
        &self,
        nm: &NodeMaintenance,
        status: &NodeMaintenanceStatus,
    ) -> Result<NodeMaintenance, kube::Error> {
        let api: Api<NodeMaintenance> =
            Api::namespaced(self.client.clone(), &nm.namespace().unwrap_or_default());
        let patch = serde_json::json!({
            "metadata": { "resourceVersion": nm.resource_version() },
            "status": status_patch(status),
        });
        api.patch_status(
            &nm.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    }

    /// Moves a request to `phase` (keeping every other condition), records the metrics and
    /// publishes an Event. Returns the object as the API server now has it.
    pub async fn transition(
        &self,
        nm: &NodeMaintenance,
        phase: Phase,
        message: &str,
        edit: impl FnOnce(&mut NodeMaintenanceStatus),
    ) -> Result<NodeMaintenance, kube::Error> {
        let write = lifecycle::enter_phase(nm, phase, message, jiff::Timestamp::now(), edit);
        self.apply_status_write(nm, &write).await
    }

    /// Writes a status the lifecycle decided on; a phase change is measured, logged and
    /// published as an Event.
    pub async fn apply_status_write(
        &self,
        nm: &NodeMaintenance,
        write: &StatusWrite,
    ) -> Result<NodeMaintenance, kube::Error> {
        let updated = self.write_status(nm, &write.status).await?;
        if let Some(transition) = &write.transition {
            self.record_transition(&updated, transition);
        }
        for (event, detail) in notifications::status_write_events(nm.status.as_ref(), write) {
            self.notify(event, &updated, detail);
        }
        Ok(updated)
    }

    /// Measures, logs and publishes a phase change (an Event).
    pub fn record_transition(&self, nm: &NodeMaintenance, transition: &Transition) {
        let to = transition.to;
        if let (Some(from), Some(spent)) = (transition.from, transition.in_phase_for) {
            self.metrics
                .request
                .phase_duration_seconds
                .with_label_values(&[from.as_str()])
                .observe(spent.as_secs_f64());
        }
        // A request the operator sees for the first time comes from no phase at all.
        let from_label = transition.from.map_or("New", Phase::as_str);
        self.metrics
            .request
            .phase_transitions_total
            .with_label_values(&[from_label, to.as_str()])
            .inc();
        tracing::info!(request = %nm.key(), node = %nm.spec.node_name, from = from_label, to = %to, "phase changed");
        // NVIDIA's shape (api/v1alpha1/nodemaintenance_types.go, ConditionChangedEventType):
        // reason `ConditionChanged`, the note starting with the new phase.
        let note = if transition.message.is_empty() {
            to.as_str().to_string()
        } else {
            format!("{to}: {}", transition.message)
        };
        self.event_with_action(nm, false, CONDITION_CHANGED_EVENT_REASON, to.as_str(), note);
    }
}

/// The status as a merge patch that also clears what is now empty: serde skips empty lists and
/// `None`, and a merge patch leaves an omitted field as it was.
fn status_patch(status: &NodeMaintenanceStatus) -> serde_json::Value {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        for key in ["conditions", "waitForCompletion", "drain"] {
            map.entry(key).or_insert(serde_json::Value::Null);
        }
        if let Some(drain) = map.get_mut("drain").and_then(|d| d.as_object_mut()) {
            for key in ["waitForEviction", "blocked"] {
                drain.entry(key).or_insert(serde_json::Value::Null);
            }
        }
    }
    value
}

/// The HTTP status the API server answered with (`None`: no answer, a transport error).
pub fn api_status_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// What the API server said, without kube's wrapping: it is quoted in statuses and Events.
pub fn api_message(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}

/// True when a kube error is a 409 Conflict (our copy of the object was stale).
pub fn is_conflict(err: &kube::Error) -> bool {
    api_status_code(err) == Some(409)
}

/// True when a kube error is a 404 Not Found.
pub fn is_not_found(err: &kube::Error) -> bool {
    api_status_code(err) == Some(404)
}

#[cfg(test)]
mod tests {
    use maintenance_crds::{DrainStatus, NodeMaintenanceStatus};

    #[test]
    fn emptied_fields_are_cleared_by_the_patch() {
        let status = NodeMaintenanceStatus {
            drain: Some(DrainStatus::default()),
            ..NodeMaintenanceStatus::default()
        };
        let patch = super::status_patch(&status);
        assert!(patch["waitForCompletion"].is_null());
        assert!(patch["conditions"].is_null());
        assert!(patch["drain"]["blocked"].is_null());
        assert!(patch["drain"]["waitForEviction"].is_null());
        assert_eq!(patch["drain"]["drainProgress"], 0);
        let none = super::status_patch(&NodeMaintenanceStatus::default());
        assert!(none["drain"].is_null());
    }
}
