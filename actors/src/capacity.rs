//! Observations for `spec.admission.checkCapacity` (the decision is
//! `maintenance_core::capacity` inside the scheduling round).
//!
//! The check needs what every node already has requested, so it reads the pods of the whole
//! cluster: one paged list per round, and only while a request is Pending and a slot is free
//! (`scheduler::can_admit_any`; rounds are coalesced, so at most one runs at a time). Each page is folded into per-node sums and dropped; only the
//! pods that drains would evict are kept, so memory follows the nodes under maintenance, not the
//! cluster's pods. Nodes come from the supervisor's cache, which keeps `status.allocatable`.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use maintenance_core::capacity::{CapacityCheck, CapacityObserver};
use maintenance_crds::{NodeMaintenance, Phase};

use crate::context::Context;

/// Page size of the pod list: bounds one response's memory on large clusters.
const PAGE: u32 = 500;

/// The check for this round, or `None` when there is nothing to check (no Pending request on an
/// existing node). Unreadable pods fail closed: the check says so and this round admits nothing
/// that it would have had to check (the requests' Pending messages say why); the next round,
/// at the latest on the tick, reads again.
pub async fn observe_capacity(
    ctx: &Context,
    requests: &[Arc<NodeMaintenance>],
    nodes: &[Arc<Node>],
    node_exists: impl Fn(&str) -> bool,
) -> Option<CapacityCheck> {
    let candidates = requests
        .iter()
        .any(|r| r.phase() == Phase::Pending && !r.is_deleting() && node_exists(&r.spec.node_name));
    if !candidates {
        return None;
    }
    let owned: Vec<NodeMaintenance> = requests.iter().map(|r| (**r).clone()).collect();
    let mut observer = CapacityObserver::new(&owned, Some(&ctx.identity));
    drop(owned);
    let api: Api<Pod> = Api::all(ctx.client.clone());
    // Finished pods request nothing: the API server leaves them out.
    let mut params = ListParams::default()
        .fields("status.phase!=Succeeded,status.phase!=Failed")
        .limit(PAGE);
    loop {
        let page = match api.list(&params).await {
            Ok(page) => page,
            Err(err) => {
                tracing::warn!(%err, "checkCapacity: cannot list pods; admissions wait for the next round");
                ctx.error("capacity");
                return Some(CapacityCheck::unreadable(format!(
                    "cannot list pods ({err}); check the operator's RBAC (list pods) and the API server"
                )));
            }
        };
        for pod in &page.items {
            observer.add_pod(pod);
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }
    Some(observer.finish(nodes.iter().map(|n| &**n)))
}
