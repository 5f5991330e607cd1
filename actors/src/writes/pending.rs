//! Pending requests' writes: the first Pending condition, the node as owner, and the reason why
//! each waits, rewritten as core's `explain` chooses.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use maintenance_core::explain::{Explanations, Observed};
use maintenance_core::scheduler::{Limits, WaitCause, Waiting};
use maintenance_core::tracker::{Cache, PendingWrite, Tracker, pending_writes};
use maintenance_crds::{NodeMaintenance, Phase, condition_type};
use ractor::ActorRef;

use super::{spawn_writes, version_written};
use crate::context::Context;
use crate::supervisor::SupervisorMsg;

/// A waiting request's Pending condition says why it waits (the scheduler's reason), so that
/// `kubectl describe nm` answers "why is my request still Pending?". Which ones are rewritten now
/// (throttled per request, but at once after a change of the limits) is decided in core.
pub(crate) fn explain_waiting(
    myself: &ActorRef<SupervisorMsg>,
    ctx: &Arc<Context>,
    explanations: &mut Explanations<String>,
    tracker: &mut Tracker,
    limits: &Limits,
    cache: &Cache<'_>,
    waiting: &[Waiting],
) {
    let mut observed: Vec<Observed<'_, String>> = Vec::new();
    let mut by_uid: HashMap<String, (&Arc<NodeMaintenance>, &str)> = HashMap::new();
    for entry in waiting {
        let Some(request) = cache.request_named(&entry.key.namespace, &entry.key.name) else {
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
            Some(c) if c.reason != Phase::Pending.as_str() => continue,
            // With a write of ours on its way, the message the request will show is not known
            // yet: remembered, not a candidate. Chosen now, it would be recorded as explained
            // with this round's cause but left unwritten, and its message would stay stale for
            // the interval of an unchanged cause.
            _ if tracker.has_write(&uid) => None,
            None => None,
            Some(c) => Some(c.message.as_str()),
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
    // them and explain them again at once), as requests with no message yet.
    let chosen = explanations.round(limits, &observed, jiff::Timestamp::now());
    let writes: Vec<(String, (Arc<NodeMaintenance>, String))> = chosen
        .iter()
        .filter(|uid| !tracker.has_write(uid))
        .filter_map(|uid| Some((uid.clone(), by_uid.get(uid)?)))
        .map(|(uid, (request, reason))| (uid, (Arc::clone(request), reason.to_string())))
        .collect();
    tracker.writes_sent(writes.iter().map(|(uid, _)| uid.clone()));
    spawn_writes(
        myself,
        writes,
        |ctx, (request, reason)| async move {
            let result = ctx
                .transition(&request, Phase::Pending, &reason, |_| {})
                .await;
            version_written(result, &ctx, "pending", |err| {
                tracing::warn!(request = %request.key(), %err, "could not explain why it waits");
            })
        },
        |written| SupervisorMsg::Written { written },
        ctx,
    );
}

/// New requests that the round did not admit get a Pending condition with the round's reason, so
/// `kubectl get nm` shows them as waiting and why, and a Pending request that has waited
/// `ownership::PENDING_OWNER_DELAY` gets its Node as owner, so deleting the node
/// garbage-collects requests that never started (the admission writes it for the others).
/// Requests admitted but still shown Pending by the cache are left to `admit`.
pub(crate) fn prepare_pending_requests(
    myself: &ActorRef<SupervisorMsg>,
    ctx: &Arc<Context>,
    requests: &[Arc<NodeMaintenance>],
    cache: &Cache<'_>,
    tracker: &mut Tracker,
    reasons: &HashMap<(String, String), (String, WaitCause)>,
) -> Vec<(String, WaitCause)> {
    let writes = pending_writes(requests, cache, tracker, reasons, jiff::Timestamp::now());
    let explained = writes
        .iter()
        .filter_map(|w| Some((w.uid.clone(), w.explains?)))
        .collect();
    let work: Vec<(String, PendingWrite)> =
        writes.into_iter().map(|w| (w.uid.clone(), w)).collect();
    tracker.writes_sent(work.iter().map(|(uid, _)| uid.clone()));
    spawn_writes(
        myself,
        work,
        |ctx, write| async move {
            let PendingWrite {
                request,
                first_mark,
                owners,
                reason,
                ..
            } = write;
            let result = async {
                let mut request = match owners {
                    Some(owners) => set_owners(&ctx, &request, &owners).await?,
                    None => (*request).clone(),
                };
                if first_mark {
                    request = ctx
                        .transition(&request, Phase::Pending, &reason, |_| {})
                        .await?;
                }
                Ok::<NodeMaintenance, kube::Error>(request)
            }
            .await;
            version_written(result, &ctx, "pending", |err| {
                tracing::warn!(request = %request.key(), %err, "could not set Pending or the node as owner");
            })
        },
        |written| SupervisorMsg::Written { written },
        ctx,
    );
    explained
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
