//! Drain-aware admission (`spec.admission.preferDrainable`): whether a node's drain can make
//! progress now, and which Pending requests the scheduler may pass over for that reason.
//!
//! A drain can make progress when every pod it would evict is guarded by no PodDisruptionBudget
//! or only by budgets that allow a disruption now. A drain that would only wait on a budget holds
//! a slot for nothing, so the scheduler admits drainable nodes first. A passed-over request ages:
//! once it has waited `maxPassOverSeconds` (from its creation: a request is Pending from its
//! creation until admitted) it takes its plain place in the order again, so nothing starves.
//! Pure: the supervisor lists the pods and budgets, and passes the time in.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde::Serialize;

use maintenance_crds::{NodeMaintenance, Phase};

use crate::drain_plan::{
    DrainRules, OperatorIdentity, PodDisposition, PodRef, classify, covering_pdbs, is_finished,
};
use crate::scheduler::model::{RequestKey, RequestState};

/// The first pod (by namespace and name) whose eviction would wait on a budget, and that budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainBlocker {
    /// `namespace/name` of the pod.
    pub pod: String,
    /// `namespace/name` of the PodDisruptionBudget.
    pub pdb: String,
    /// The budget's `status.disruptionsAllowed` (0 when it has no status yet).
    pub disruptions_allowed: i32,
}

impl fmt::Display for DrainBlocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "evicting pod {} would wait on PodDisruptionBudget {} ({} disruptions allowed)",
            self.pod, self.pdb, self.disruptions_allowed
        )
    }
}

fn key(namespace: Option<&String>, name: Option<&String>) -> String {
    format!(
        "{}/{}",
        namespace.map_or("", String::as_str),
        name.map_or("", String::as_str)
    )
}

/// Why the drain of these `pods` (one node's) could not make progress now, or `None` when it can.
/// Only pods the drain evicts count (not skipped ones, and not pods it refuses for lack of
/// `force`/`deleteEmptyDir`: no budget decides about them). Finished pods pass any budget. A pod
/// guarded by two budgets is refused by the Eviction API whatever they allow, so it blocks too.
pub fn drain_blocker(
    rules: &DrainRules,
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
) -> Option<DrainBlocker> {
    let mut blockers: Vec<DrainBlocker> = pods
        .iter()
        .filter(|pod| classify(rules, pod) == PodDisposition::Evict && !is_finished(pod))
        .filter_map(|pod| {
            let covering = covering_pdbs(pod, pdbs);
            let allowed = |pdb: &PodDisruptionBudget| {
                pdb.status
                    .as_ref()
                    .and_then(|s| s.disruptions_allowed)
                    .unwrap_or(0)
            };
            let blocking = covering
                .iter()
                .find(|pdb| allowed(pdb) <= 0 || covering.len() > 1)?;
            let pod_ref = PodRef::from_pod(pod);
            Some(DrainBlocker {
                pod: pod_ref.key(),
                pdb: key(
                    blocking.metadata.namespace.as_ref(),
                    blocking.metadata.name.as_ref(),
                ),
                disruptions_allowed: allowed(blocking),
            })
        })
        .collect();
    blockers.sort_by(|a, b| a.pod.cmp(&b.pod));
    blockers.into_iter().next()
}

/// The Pending requests among `requests` whose drain could not make progress now, from the pods
/// of their nodes (`pods` may hold other nodes' pods too) and the cluster's budgets. Requests
/// without a drainSpec, or with one that does not parse, are drainable here (the node actor
/// reports a bad spec).
pub fn blocked_requests(
    requests: &[NodeMaintenance],
    pods: &[Pod],
    pdbs: &[PodDisruptionBudget],
    operator: Option<&OperatorIdentity>,
) -> BTreeMap<RequestKey, DrainBlocker> {
    let mut by_node: BTreeMap<&str, Vec<Pod>> = BTreeMap::new();
    for pod in pods {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            by_node.entry(node).or_default().push(pod.clone());
        }
    }
    requests
        .iter()
        .filter(|r| r.phase() == Phase::Pending && !r.is_deleting())
        .filter_map(|request| {
            let rules =
                DrainRules::new(request.spec.drain_spec.as_ref()?, operator.cloned()).ok()?;
            let node_pods = by_node.get(request.spec.node_name.as_str())?;
            let blocker = drain_blocker(&rules, node_pods, pdbs)?;
            let state = RequestState::from_request(request);
            Some((state.key(), blocker))
        })
        .collect()
}

/// What the scheduler needs for `preferDrainable`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreferDrainable {
    /// Off: the plain order, whatever `blocked` says.
    pub enabled: bool,
    /// A request older than this (from its creation) is no longer passed over.
    pub max_pass_over_seconds: i64,
    /// The Pending requests whose drain could not make progress now; others are drainable
    /// (including requests without a drainSpec, and nodes whose pods could not be read).
    pub blocked: BTreeMap<RequestKey, DrainBlocker>,
}

impl PreferDrainable {
    /// The feature as configured; `blocked` is filled in by whoever can read pods.
    pub fn from_config(spec: Option<&maintenance_crds::MaintenanceOperatorConfigSpec>) -> Self {
        let admission = spec.map(|s| s.admission()).unwrap_or_default();
        PreferDrainable {
            enabled: admission.prefer_drainable(),
            max_pass_over_seconds: admission.max_pass_over_seconds(),
            blocked: BTreeMap::new(),
        }
    }

    /// When `request` stops being passed over: its creation plus the bound. `None` (no
    /// creation time) counts as already aged, so an unknown age never starves a request.
    pub fn ages_at(&self, request: &RequestState) -> Option<jiff::Timestamp> {
        request.created.and_then(|created| {
            created
                .checked_add(jiff::SignedDuration::from_secs(self.max_pass_over_seconds))
                .ok()
        })
    }

    /// The blocker for which `request` may be passed over at `now`; `None`: keep its place.
    pub fn pass_over(&self, request: &RequestState, now: jiff::Timestamp) -> Option<&DrainBlocker> {
        if !self.enabled {
            return None;
        }
        let blocker = self.blocked.get(&request.key())?;
        self.ages_at(request).filter(|at| now < *at)?;
        Some(blocker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, bare, pod, with_label, with_phase};
    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use maintenance_crds::DrainSpec;

    fn pdb(ns: &str, name: &str, app: &str, allowed: i32) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector {
                    match_labels: Some([("app".to_string(), app.to_string())].into()),
                    ..LabelSelector::default()
                }),
                ..PodDisruptionBudgetSpec::default()
            }),
            status: Some(PodDisruptionBudgetStatus {
                disruptions_allowed: Some(allowed),
                ..PodDisruptionBudgetStatus::default()
            }),
        }
    }

    fn rules() -> DrainRules {
        DrainRules::new(&DrainSpec::default(), None).unwrap()
    }

    #[test]
    fn a_pod_behind_a_budget_without_disruptions_blocks() {
        let pods = [
            with_label(pod("app", "web-1"), "app", "web"),
            with_label(pod("app", "db-1"), "app", "db"),
        ];
        let pdbs = [pdb("app", "web", "web", 1), pdb("app", "db", "db", 0)];
        let blocker = drain_blocker(&rules(), &pods, &pdbs).unwrap();
        assert_eq!(blocker.pod, "app/db-1");
        assert_eq!(blocker.pdb, "app/db");
        assert_eq!(
            blocker.to_string(),
            "evicting pod app/db-1 would wait on PodDisruptionBudget app/db (0 disruptions allowed)"
        );
    }

    #[test]
    fn budgets_that_allow_a_disruption_and_unguarded_pods_do_not_block() {
        let pods = [
            with_label(pod("app", "web-1"), "app", "web"),
            pod("app", "plain"),
        ];
        let pdbs = [pdb("app", "web", "web", 1), pdb("other", "web", "web", 0)];
        assert_eq!(drain_blocker(&rules(), &pods, &pdbs), None);
    }

    #[test]
    fn pods_the_drain_does_not_evict_do_not_block() {
        // Finished: passes any budget. Bare without force: refused by the drain, not by a budget.
        let pods = [
            with_phase(with_label(pod("app", "done"), "app", "db"), "Succeeded"),
            with_label(bare("app", "bare"), "app", "db"),
        ];
        let pdbs = [pdb("app", "db", "db", 0)];
        assert_eq!(drain_blocker(&rules(), &pods, &pdbs), None);
    }

    fn request(name: &str, node: &str, drain: bool) -> NodeMaintenance {
        fixtures::request(name)
            .namespace("team")
            .node(node)
            .requestor("test")
            .drain(drain)
            .build()
    }

    fn on_node(mut p: Pod, node: &str) -> Pod {
        if let Some(spec) = p.spec.as_mut() {
            spec.node_name = Some(node.into());
        }
        p
    }

    #[test]
    fn only_pending_requests_with_a_drain_spec_on_a_guarded_node_are_blocked() {
        let pods = [
            on_node(with_label(pod("app", "db-1"), "app", "db"), "n1"),
            on_node(with_label(pod("app", "db-2"), "app", "db"), "n2"),
        ];
        let pdbs = [pdb("app", "db", "db", 0)];
        let requests = [
            request("guarded", "n1", true),
            request("no-drain", "n2", false),
            request("empty-node", "n3", true),
        ];
        let blocked = blocked_requests(&requests, &pods, &pdbs, None);
        let names: Vec<&str> = blocked.keys().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["guarded"]);
        assert_eq!(
            blocked.values().next().map(|b| b.pod.as_str()),
            Some("app/db-1")
        );
    }

    #[test]
    fn two_budgets_on_one_pod_block_whatever_they_allow() {
        let pods = [with_label(pod("app", "web-1"), "app", "web")];
        let pdbs = [pdb("app", "a", "web", 1), pdb("app", "b", "web", 1)];
        assert_eq!(
            drain_blocker(&rules(), &pods, &pdbs).map(|b| b.pdb),
            Some("app/a".to_string())
        );
    }
}
