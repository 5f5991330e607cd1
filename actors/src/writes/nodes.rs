//! Writes to nodes a round decides: the pending-drain taint (`pending_taint`) and the uncordon
//! of an orphaned cordon (`cordon_mark`). A node is not written again until the cache shows the
//! last write, or it is answered as not written (the tracker's `NodeWrites`).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use maintenance_core::cordon_mark::{CordonMark, MarkKind};
use maintenance_core::lifecycle::EventReason;
use maintenance_core::pending_taint;
use maintenance_core::tracker::Tracker;
use maintenance_crds::NodeMaintenance;
use ractor::ActorRef;

use super::{spawn_writes, version_written};
use crate::context::Context;
use crate::supervisor::SupervisorMsg;

/// Nodes carry the `PreferNoSchedule` taint of [`pending_taint`] exactly while a request on them
/// waits for admission with a drain to do (decided in core).
pub(crate) fn reconcile_pending_taints(
    myself: &ActorRef<SupervisorMsg>,
    ctx: &Arc<Context>,
    tracker: &mut Tracker,
    requests: &[Arc<NodeMaintenance>],
    nodes: &[Arc<Node>],
    enabled: bool,
) {
    let wanted = pending_taint::wanted_nodes(
        enabled,
        requests.iter().map(|r| {
            let being_admitted = r
                .metadata
                .uid
                .as_deref()
                .is_some_and(|uid| tracker.is_being_admitted(uid));
            (&**r, being_admitted)
        }),
    );
    let writes = pending_taint::taint_writes(nodes.iter().map(|n| &**n), &wanted, |node| {
        node.metadata
            .name
            .as_deref()
            .is_some_and(|name| tracker.taints.contains(name))
    });
    let items: Vec<(String, pending_taint::TaintWrite)> =
        writes.into_iter().map(|w| (w.node.clone(), w)).collect();
    tracker
        .taints
        .sent(items.iter().map(|(node, _)| node.clone()));
    spawn_writes(
        myself,
        items,
        |ctx, write| async move {
            let patch = serde_json::json!({
                "metadata": { "resourceVersion": write.resource_version },
                "spec": { "taints": write.taints },
            });
            let nodes: Api<Node> = Api::all(ctx.client.clone());
            let result = nodes
                .patch(&write.node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .inspect(|_| {
                    tracing::debug!(node = %write.node, add = write.add, "pending-drain taint written");
                });
            version_written(result, &ctx, "taint", |err| {
                let what = if write.add { "add" } else { "remove" };
                tracing::warn!(node = %write.node, %err, "could not {what} the taint {}; the next round tries again", pending_taint::PENDING_DRAIN_TAINT_KEY);
            })
        },
        |written| SupervisorMsg::Tainted { written },
        ctx,
    );
}

/// Uncordons the nodes of orphaned cordons whose grace has passed, each by a write guarded by
/// the node's resourceVersion (a cache that still shows a mark we removed is behind, and the
/// write conflicts), with a Warning Event on the node.
pub(crate) fn uncordon_orphans(
    myself: &ActorRef<SupervisorMsg>,
    ctx: &Arc<Context>,
    tracker: &mut Tracker,
    due: Vec<CordonMark>,
) {
    let due: Vec<(String, CordonMark)> = due
        .into_iter()
        .filter(|mark| !tracker.uncordons.contains(&mark.node))
        .map(|mark| (mark.node.clone(), mark))
        .collect();
    tracker
        .uncordons
        .sent(due.iter().map(|(node, _)| node.clone()));
    spawn_writes(
        myself,
        due,
        |ctx, mark| async move {
            let patch = mark.release_patch();
            let nodes: Api<Node> = Api::all(ctx.client.clone());
            let request = format!("{}/{} (uid {})", mark.namespace, mark.name, mark.uid);
            let result = nodes
                .patch(&mark.node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .inspect(|written| {
                    let undone = match mark.kind {
                        MarkKind::Cordon => format!("uncordoned {}", mark.node),
                        MarkKind::Protection => format!(
                            "removed our autoscaler annotations from {} (the request had not \
                             cordoned it)",
                            mark.node
                        ),
                    };
                    let note = format!(
                        "{undone}: its request {request} went without our cleanup (deleted \
                         under our finalizer, or the finalizer removed by hand) while no node \
                         actor remembered it"
                    );
                    tracing::warn!(node = %mark.node, %request, "orphaned cordon undone");
                    ctx.event_on(
                        kube::Resource::object_ref(written, &()),
                        true,
                        EventReason::Uncordon.as_str(),
                        note,
                    );
                });
            // A conflict: the cache was behind (our own uncordon, another request's cordon).
            version_written(result, &ctx, "uncordon_orphan", |err| {
                tracing::warn!(node = %mark.node, %request, %err, "could not uncordon the node of a request that is gone; the next round tries again");
            })
        },
        |written| SupervisorMsg::Uncordoned { written },
        ctx,
    );
}
