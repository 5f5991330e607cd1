//! Garbage collection's deletions: core's `collection` decides which requests are forgotten,
//! these delete them, each guarded by the UID and resourceVersion the decision saw.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use maintenance_core::gc::Cause;
use maintenance_core::lifecycle::EventReason;
use maintenance_core::notifications::{Detail, NotificationEvent};
use maintenance_crds::NodeMaintenance;

use crate::context::{Context, is_conflict, is_not_found};

/// Deletes the requests a sweep (`gc::sweep`) chose, one after the other (they are few:
/// forgotten requests), and counts them.
pub(crate) async fn delete_collected(ctx: &Context, collect: Vec<(&NodeMaintenance, Cause)>) {
    for (request, cause) in collect {
        match collect_one(ctx, request, &cause).await {
            Ok(true) => {
                ctx.metrics
                    .request
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
async fn collect_one(
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
    ctx.notify(
        NotificationEvent::GarbageCollected,
        request,
        Detail::new(cause.metric_label(), note.clone()),
    );
    ctx.event(request, true, EventReason::GarbageCollected.as_str(), note);
    Ok(true)
}
