//! Observations for `spec.admission.preferDrainable`: which Pending requests' drains would only
//! wait on a PodDisruptionBudget right now (the decision is `maintenance_core::drainability`).
//!
//! Memory: no pod cache. Each round that can admit (a free slot: `scheduler::can_admit_any`;
//! rounds are coalesced, so at most one runs at a time) lists only the pods of the nodes of
//! Pending requests, paged and by field selector `spec.nodeName`,
//! and the PDBs of the cluster in one paged list (PDBs are few, and a listed copy lives only for
//! the round). A cluster-wide pod reflector would cost memory for every pod of the cluster all
//! the time, to serve a preference that looks at a handful of nodes. Nothing is read when the
//! feature is off or no request is Pending.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use maintenance_core::drain_plan::DrainRules;
use maintenance_core::drainability::{DrainBlocker, drain_blocker};
use maintenance_core::scheduler::RequestKey;
use maintenance_crds::{NodeMaintenance, Phase};

use crate::context::Context;

/// Page size of the lists: bounds one response's memory on large nodes and clusters.
const PAGE: u32 = 500;

/// Lists everything `api` has under `params`, page by page.
async fn list_all<K>(api: &Api<K>, params: ListParams) -> Result<Vec<K>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = params.limit(PAGE);
    let mut items = Vec::new();
    loop {
        let page = api.list(&params).await?;
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(items),
        }
    }
}

/// The Pending requests (among `requests`, on existing nodes, not being deleted, with a
/// drainSpec) whose drain could not make progress now. A request whose pods or the PDBs cannot
/// be read counts as drainable: the preference then falls back to the plain order.
pub async fn observe_blockers(
    ctx: &Context,
    requests: &[Arc<NodeMaintenance>],
    node_exists: impl Fn(&str) -> bool,
) -> BTreeMap<RequestKey, DrainBlocker> {
    let candidates: Vec<&Arc<NodeMaintenance>> = requests
        .iter()
        .filter(|r| r.phase() == Phase::Pending && !r.is_deleting())
        .filter(|r| node_exists(&r.spec.node_name))
        .collect();
    let mut blocked = BTreeMap::new();
    // Nothing to order: read nothing. (One candidate is still observed, so that its Pending
    // message keeps naming the budget it waits on while others hold the slots.)
    if candidates.is_empty() {
        return blocked;
    }
    // From the shared cache once it is filled (no call per round); the API server before that.
    let pdbs: Vec<PodDisruptionBudget> = match ctx.pdbs.ready_store() {
        Some(store) => store.state().iter().map(|pdb| (**pdb).clone()).collect(),
        None => match list_all(&Api::all(ctx.client.clone()), ListParams::default()).await {
            Ok(pdbs) => pdbs,
            Err(err) => {
                tracing::warn!(%err, "preferDrainable: cannot list PodDisruptionBudgets; admitting in the plain order");
                return blocked;
            }
        },
    };
    if pdbs.is_empty() {
        return blocked;
    }
    let pods_api: Api<Pod> = Api::all(ctx.client.clone());
    for request in candidates {
        // Without a drainSpec nothing is evicted: always drainable.
        let Some(spec) = &request.spec.drain_spec else {
            continue;
        };
        let key = RequestKey {
            namespace: request.namespace().unwrap_or_default(),
            name: request.name_any(),
        };
        let rules = match DrainRules::new(spec, Some(ctx.identity.clone())) {
            Ok(rules) => rules,
            // The request actor reports a bad drainSpec on the request; here it just keeps its place.
            Err(_) => continue,
        };
        let node = &request.spec.node_name;
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        match list_all(&pods_api, params).await {
            Ok(pods) => {
                if let Some(blocker) = drain_blocker(&rules, &pods, &pdbs) {
                    blocked.insert(key, blocker);
                }
            }
            Err(err) => {
                tracing::warn!(request = %key, %node, %err, "preferDrainable: cannot list the node's pods; the request keeps its place");
            }
        }
    }
    blocked
}
