//! The admission of a request (Pending -> Scheduled): one metadata write guarded by the version
//! the scheduler decided on, and what to make of an answer that never came.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use maintenance_core::lifecycle;
use maintenance_core::ownership;
use maintenance_crds::{FINALIZER, NodeMaintenance};
use ractor::ActorRef;

use crate::context::{Context, api_message, api_status_code};
use crate::supervisor::SupervisorMsg;

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
    /// backs off ([`maintenance_core::scheduler::admission_retry_delay`]) and the next one takes its slot.
    Failed { error: String },
}

/// Sends the admission of `request` in a task the round does not wait for, and answers the
/// supervisor (`SupervisorMsg::Admitted`) whatever happens to the writes, even a panic, or the
/// request would hold its slot for good.
pub(crate) fn spawn_admission(
    myself: &ActorRef<SupervisorMsg>,
    ctx: &Arc<Context>,
    request: Arc<NodeMaintenance>,
    node: Option<Arc<Node>>,
) {
    let Some(uid) = request.uid() else { return };
    let ctx = ctx.clone();
    let writes = tokio::spawn(async move {
        let attempted = request.resource_version();
        let outcome = admit(&ctx, &request, node.as_ref(), attempted.as_deref()).await;
        if let AdmitOutcome::Done(admitted) = &outcome {
            for transition in lifecycle::admission_transitions(&request, jiff::Timestamp::now()) {
                ctx.record_transition(admitted, &transition);
            }
            ctx.notify(
                maintenance_core::notifications::NotificationEvent::Admitted,
                admitted,
                crate::notifier::Detail::default(),
            );
        }
        outcome
    });
    let supervisor = myself.clone();
    tokio::spawn(async move {
        let outcome = writes.await.unwrap_or_else(|_| AdmitOutcome::Failed {
            error: "the admission stopped unexpectedly (see the operator's log)".to_string(),
        });
        let _ = supervisor.cast(SupervisorMsg::Admitted { uid, outcome });
    });
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
/// (`NodeMaintenance::phase`), and the request actor's next phase is the first status it writes.
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
    let owners = ownership::owner_references(
        request.owner_references(),
        node.and_then(|n| ownership::NodeIdentity::of(n)),
    )
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
