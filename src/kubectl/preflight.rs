//! `kubectl maintenance preflight`: whether nodes can be drained, checked live before anyone
//! starts. The pod selection, the flags a pod needs and which PodDisruptionBudgets guard it are
//! the operator's own rules (`maintenance_core::drain_plan`, the rules of `kubectl drain`); on
//! top of them come the checks a drain cannot do for you: PodDisruptionBudgets that allow
//! nothing, workloads with a single replica or all replicas on the node.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod, ReplicationController};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use maintenance_core::capacity::{CapacityNode, CapacityPod, Resources, Shortfall, fit};
use maintenance_core::drain_plan::{
    DrainRules, OperatorIdentity, PodDisposition, PodRef, classify, controller_ref, covering_pdbs,
    is_finished, required_flags,
};
use maintenance_core::scheduler::NodeState;
use maintenance_crds::DrainSpec;
use serde::Serialize;

use super::request::check_nodes_exist;
use super::view::render_columns;
use super::{GlobalArgs, Outcome, api_error, connect, natural_cmp};
use crate::list_all;

pub const AFTER_HELP: &str = "\
What is checked, for every pod a drain of the node would evict:
  BLOCK  PDBNeverAllows     its PodDisruptionBudget can never allow an eviction (minAvailable equal
                            to the expected pods or 100%, or maxUnavailable 0)
  BLOCK  PDBAllowsNone      its PodDisruptionBudget allows 0 disruptions right now
  BLOCK  MultiplePDBs       several PodDisruptionBudgets select it (the Eviction API refuses it)
  BLOCK  NeedsForce         no controller would recreate it: needs --force
  BLOCK  NeedsDeleteEmptyDir  it has an emptyDir volume: needs --delete-emptydir
  warn   SingleReplica      its Deployment/StatefulSet/ReplicaSet has 1 replica: down until rescheduled
  warn   AllReplicasOnNode  every replica runs on this node and no PodDisruptionBudget paces them
  warn   NoController       with --force: deleted for good
  warn   EmptyDirDataLoss   with --delete-emptydir: the emptyDir data is lost
  warn   InsufficientCapacity  the pods to evict from all the checked nodes together do not fit
                            (CPU and memory requests, nodeSelector, NoSchedule/NoExecute taints)
                            on the other schedulable nodes (Ready, not cordoned) next to what their
                            pods already request: they would stay Pending. BLOCK with
                            --check-capacity; --skip-capacity skips it
DaemonSet pods, mirror pods, finished and terminating pods, the operator's own pods and pods
outside --pod-selector are not evicted by a drain and not checked. Pass the drain flags you will
use with `request` or `rollout` (--force, --delete-emptydir, --pod-selector).
The capacity check lists the pods of the whole cluster (paged) for what is already requested on
each node; it is an estimate (first fit, largest pods first, as the operator's checkCapacity
admission): affinity, topology spread, pod counts and other resources are not counted.

Exit code 0 when nothing blocks (warnings allowed), 1 when some node would block a drain, 2 on
errors.

Examples:
  kubectl maintenance preflight node-1 node-2
  kubectl maintenance preflight --selector pool=gpu --force --delete-emptydir -o json
  kubectl maintenance preflight --selector pool=gpu --check-capacity";

/// Above this many nodes, the pods of the whole cluster are listed once instead of per node (the
/// capacity check always lists them once: it needs what every node's pods request).
const PER_NODE_LIST_LIMIT: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// A section per node with a line per finding.
    Table,
    /// One JSON object: {"nodes": [{node, verdict, podsToEvict, findings}], "blocked": N,
    /// "capacity": {podsToPlace, remainingNodes, fits, unplaceable, message} or null}.
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct PreflightArgs {
    /// Nodes to check [default: every node, or those of --selector].
    #[arg(value_name = "NODE", conflicts_with = "selector")]
    pub nodes: Vec<String>,

    /// Check the nodes this label selector matches (kubectl -l syntax).
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,

    /// Check as for a drain with --force (pods without controller are deleted).
    #[arg(long)]
    pub force: bool,

    /// Check as for a drain with --delete-emptydir (emptyDir data is lost).
    #[arg(long = "delete-emptydir")]
    pub delete_empty_dir: bool,

    /// Check as for a drain with this --pod-selector (only matching pods are evicted).
    #[arg(long, value_name = "SELECTOR")]
    pub pod_selector: Option<String>,

    /// Make InsufficientCapacity block (exit 1) instead of warn: the pods to evict from the
    /// checked nodes must fit on the other schedulable nodes.
    #[arg(long, conflicts_with = "skip_capacity")]
    pub check_capacity: bool,

    /// Skip the capacity check (it lists the pods of the whole cluster).
    #[arg(long)]
    pub skip_capacity: bool,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The drain would wait (or need a flag): the maintenance does not finish by itself.
    Block,
    /// The drain finishes, at the price of downtime or lost data.
    Warn,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// `namespace/name` of the pod.
    pub pod: String,
    pub severity: Severity,
    /// A short name of the check, e.g. `PDBNeverAllows`.
    pub check: &'static str,
    /// What is wrong and what to do about it.
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    pub node: String,
    /// `blocked`, `warnings` or `ok`.
    pub verdict: &'static str,
    /// Pods a drain would evict (blocked ones included).
    pub pods_to_evict: usize,
    pub findings: Vec<Finding>,
}

/// The workload behind a pod's controller, as far as replicas go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// `Deployment`, `StatefulSet`, `ReplicaSet` or `ReplicationController`.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub replicas: i32,
}

impl Workload {
    fn describe(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// `(namespace, kind, name)` of a pod's controller.
type ControllerKey = (String, String, String);

/// What the checks need to know beyond a node's pods.
#[derive(Debug, Clone, Default)]
pub struct PreflightFacts {
    pub pdbs: Vec<PodDisruptionBudget>,
    /// The workload of each pod controller (a ReplicaSet maps to its Deployment).
    pub workloads: HashMap<ControllerKey, Workload>,
}

fn pod_key(pod: &Pod) -> String {
    PodRef::from_pod(pod).key()
}

fn controller_key(pod: &Pod) -> Option<ControllerKey> {
    let owner = controller_ref(pod)?;
    Some((
        pod.metadata.namespace.clone().unwrap_or_default(),
        owner.kind.clone(),
        owner.name.clone(),
    ))
}

fn pdb_key(pdb: &PodDisruptionBudget) -> String {
    format!(
        "{}/{}",
        pdb.metadata.namespace.as_deref().unwrap_or_default(),
        pdb.name_any()
    )
}

fn int_or_string(value: &IntOrString) -> String {
    match value {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// Why `pdb` can never allow an eviction, if it cannot: a property of its spec, not of the moment.
fn never_allows(pdb: &PodDisruptionBudget, workload: Option<&Workload>) -> Option<String> {
    let spec = pdb.spec.as_ref()?;
    if let Some(max) = &spec.max_unavailable {
        let zero = match max {
            IntOrString::Int(n) => *n <= 0,
            IntOrString::String(s) => s.trim_end_matches('%').trim().parse::<f64>() == Ok(0.0),
        };
        return zero.then(|| {
            format!(
                "maxUnavailable {} never allows an eviction",
                int_or_string(max)
            )
        });
    }
    let min = spec.min_available.as_ref()?;
    let expected = pdb
        .status
        .as_ref()
        .and_then(|s| s.expected_pods)
        .filter(|&n| n > 0)
        .or(workload.map(|w| w.replicas));
    match min {
        IntOrString::Int(n) => {
            let expected = expected?;
            (*n >= expected).then(|| {
                format!(
                    "minAvailable {n} with {expected} expected pod{} never allows an eviction",
                    if expected == 1 { "" } else { "s" }
                )
            })
        }
        IntOrString::String(s) => {
            let percent = s.trim_end_matches('%').trim().parse::<f64>().ok()?;
            (percent >= 100.0).then(|| format!("minAvailable {s} never allows an eviction"))
        }
    }
}

/// The checks of one node. `pods` are the pods bound to it; `rules` are the drain's.
pub fn check_node(
    node: &str,
    pods: &[Pod],
    rules: &DrainRules,
    facts: &PreflightFacts,
) -> NodeReport {
    let mut findings = Vec::new();
    let mut to_evict = 0;
    // Evicted pods per workload, for the all-replicas check.
    let mut per_workload: BTreeMap<String, EvictedReplicas> = BTreeMap::new();
    let mut sorted: Vec<&Pod> = pods.iter().collect();
    sorted.sort_by_key(|pod| pod_key(pod));
    for pod in sorted {
        let key = pod_key(pod);
        let disposition = classify(rules, pod);
        // A finished pod holds no work and no budget applies to it: nothing to check.
        if matches!(disposition, PodDisposition::Skip(_)) || is_finished(pod) {
            continue;
        }
        to_evict += 1;
        let controller = controller_key(pod);
        let workload = controller.as_ref().and_then(|c| facts.workloads.get(c));
        let covering = covering_pdbs(pod, &facts.pdbs);
        let checks = flag_checks(&disposition, pod)
            .into_iter()
            .chain(pdb_check(&covering, workload))
            .chain(workload.and_then(single_replica_check));
        findings.extend(checks.map(|(severity, check, message)| Finding {
            pod: key.clone(),
            severity,
            check,
            message,
        }));
        if let Some(workload) = workload {
            let evicted = per_workload
                .entry(workload.describe())
                .or_insert_with(|| EvictedReplicas::of(workload));
            evicted.pods.push(key.clone());
            evicted.paced |= !covering.is_empty();
        }
    }
    findings.extend(per_workload.into_values().filter_map(all_replicas_check));

    findings.sort_by(|a, b| a.pod.cmp(&b.pod).then(a.severity.cmp(&b.severity)));
    NodeReport {
        node: node.to_string(),
        verdict: verdict(&findings),
        pods_to_evict: to_evict,
        findings,
    }
}

/// What a check found about a pod: severity, the check's name and the message.
type Check = (Severity, &'static str, String);

/// The pods a node's drain evicts of one workload.
struct EvictedReplicas {
    workload: Workload,
    pods: Vec<String>,
    /// Some PodDisruptionBudget selects one of them.
    paced: bool,
}

impl EvictedReplicas {
    fn of(workload: &Workload) -> Self {
        EvictedReplicas {
            workload: workload.clone(),
            pods: Vec::new(),
            paced: false,
        }
    }
}

/// The drain flags a pod needs: without them the drain waits (Block), with them the pod's data
/// or its only copy is lost (Warn).
fn flag_checks(disposition: &PodDisposition, pod: &Pod) -> Vec<Check> {
    let mut checks = Vec::new();
    match disposition {
        PodDisposition::Blocked(reason) => {
            if reason.needs_force() {
                checks.push((
                    Severity::Block,
                    "NeedsForce",
                    "no controller would recreate it: a drain waits for --force (with which \
                     the pod is deleted for good)"
                        .to_string(),
                ));
            }
            if reason.needs_delete_empty_dir() {
                checks.push((
                    Severity::Block,
                    "NeedsDeleteEmptyDir",
                    "it has an emptyDir volume: a drain waits for --delete-emptydir (with \
                     which its data is lost)"
                        .to_string(),
                ));
            }
        }
        // Evicted thanks to the flags given: say what they cost.
        _ => {
            let flags = required_flags(pod);
            if flags.is_some_and(|f| f.needs_force()) {
                checks.push((
                    Severity::Warn,
                    "NoController",
                    "no controller would recreate it: --force deletes it for good".to_string(),
                ));
            }
            if flags.is_some_and(|f| f.needs_delete_empty_dir()) {
                checks.push((
                    Severity::Warn,
                    "EmptyDirDataLoss",
                    "--delete-emptydir evicts it and the data of its emptyDir volume is lost"
                        .to_string(),
                ));
            }
        }
    }
    checks
}

/// Whether the PodDisruptionBudgets that select a pod (`covering`) let the Eviction API evict it:
/// never, not now, or not at all when several select it.
fn pdb_check(covering: &[&PodDisruptionBudget], workload: Option<&Workload>) -> Option<Check> {
    match covering {
        [] => None,
        [pdb] => {
            let status = pdb.status.as_ref();
            if let Some(why) = never_allows(pdb, workload) {
                let fix = match workload {
                    Some(w) => format!(
                        "lower its minAvailable (or allow maxUnavailable 1), or scale {} up",
                        w.describe()
                    ),
                    None => "lower its minAvailable (or allow maxUnavailable 1)".to_string(),
                };
                Some((
                    Severity::Block,
                    "PDBNeverAllows",
                    format!("PodDisruptionBudget {}: {why}; {fix}", pdb_key(pdb)),
                ))
            } else if let Some(status) =
                status.filter(|s| s.disruptions_allowed.is_some_and(|n| n <= 0))
            {
                Some((
                    Severity::Block,
                    "PDBAllowsNone",
                    format!(
                        "PodDisruptionBudget {} allows 0 disruptions now (currentHealthy {}, \
                         desiredHealthy {}, expectedPods {}): a drain waits until more of \
                         its pods are healthy",
                        pdb_key(pdb),
                        status.current_healthy.unwrap_or_default(),
                        status.desired_healthy.unwrap_or_default(),
                        status.expected_pods.unwrap_or_default()
                    ),
                ))
            } else {
                None
            }
        }
        several => {
            let names: Vec<String> = several.iter().map(|pdb| pdb_key(pdb)).collect();
            Some((
                Severity::Block,
                "MultiplePDBs",
                format!(
                    "selected by {} PodDisruptionBudgets ({}): the Eviction API refuses to \
                     evict it; make exactly one select the pod",
                    names.len(),
                    names.join(", ")
                ),
            ))
        }
    }
}

/// A workload of one replica is down from the eviction until its replacement runs.
fn single_replica_check(workload: &Workload) -> Option<Check> {
    (workload.replicas == 1).then(|| {
        (
            Severity::Warn,
            "SingleReplica",
            format!(
                "{} has 1 replica: it is down from the eviction until its replacement \
                 runs elsewhere; scale it to 2 or more",
                workload.describe()
            ),
        )
    })
}

/// A workload whose replicas all run on the node, with no budget to pace their eviction, is
/// down until they run elsewhere. The finding goes to its first pod.
fn all_replicas_check(evicted: EvictedReplicas) -> Option<Finding> {
    let EvictedReplicas {
        workload,
        pods,
        paced,
    } = evicted;
    let count = i32::try_from(pods.len()).unwrap_or(i32::MAX);
    if workload.replicas <= 1 || count < workload.replicas || paced {
        return None;
    }
    Some(Finding {
        pod: pods[0].clone(),
        severity: Severity::Warn,
        check: "AllReplicasOnNode",
        message: format!(
            "all {} replicas of {} run on this node and no PodDisruptionBudget paces \
             their eviction: it is down until they run elsewhere; spread them \
             (topologySpreadConstraints) or add a PodDisruptionBudget",
            workload.replicas,
            workload.describe()
        ),
    })
}

fn verdict(findings: &[Finding]) -> &'static str {
    if findings.iter().any(|f| f.severity == Severity::Block) {
        "blocked"
    } else if findings.is_empty() {
        "ok"
    } else {
        "warnings"
    }
}

/// What the capacity check found, for the report's last line and `-o json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityReport {
    /// Pods the drains of all checked nodes would evict.
    pub pods_to_place: usize,
    /// Other nodes that could take them (schedulable, Ready, not checked).
    pub remaining_nodes: usize,
    pub fits: bool,
    /// `namespace/name` of the pods that found no room, largest first.
    pub unplaceable: Vec<String>,
    /// The shortfall, for a person; `None` when the pods fit.
    pub message: Option<String>,
}

/// Whether a node can take pods: not cordoned, and Ready (the scheduler's own test).
fn takes_pods(node: &Node) -> bool {
    !NodeState::from_node(node).unavailable
}

/// Adds what `pod` requests to its node's sum, unless it is finished or not bound.
fn add_requested(requested: &mut HashMap<String, Resources>, pod: &Pod) {
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()) else {
        return;
    };
    if is_finished(pod) {
        return;
    }
    let add = CapacityPod::from_pod(pod).requests;
    let sum = requested.entry(node.clone()).or_default();
    sum.cpu_milli = sum.cpu_milli.saturating_add(add.cpu_milli);
    sum.memory_bytes = sum.memory_bytes.saturating_add(add.memory_bytes);
}

/// The capacity check of the `checked` nodes together: do the pods their drains would evict
/// (`pods` maps each checked node to its pods) fit on the other schedulable `nodes`, next to what
/// is `requested` there already? Adds an InsufficientCapacity finding (of `severity`) to the
/// report of each checked node with a pod that finds no room.
pub fn check_capacity(
    reports: &mut [NodeReport],
    pods: &HashMap<String, Vec<Pod>>,
    rules: &DrainRules,
    nodes: &[Node],
    requested: &HashMap<String, Resources>,
    severity: Severity,
) -> CapacityReport {
    let checked: BTreeSet<&str> = reports.iter().map(|r| r.node.as_str()).collect();
    // Pod key -> its node, for the findings.
    let mut home: HashMap<String, String> = HashMap::new();
    let mut to_place = Vec::new();
    for report in reports.iter() {
        for pod in pods.get(&report.node).into_iter().flatten() {
            if matches!(classify(rules, pod), PodDisposition::Evict) && !is_finished(pod) {
                let pod = CapacityPod::from_pod(pod);
                home.insert(pod.key.clone(), report.node.clone());
                to_place.push(pod);
            }
        }
    }
    let mut remaining: Vec<CapacityNode> = nodes
        .iter()
        .filter(|n| takes_pods(n) && !checked.contains(n.name_any().as_str()))
        .map(|n| {
            let requested = requested.get(&n.name_any()).copied().unwrap_or_default();
            CapacityNode::from_node(n, requested)
        })
        .collect();
    // First fit depends on the order of the nodes: make it the same on every run.
    remaining.sort_by(|a, b| natural_cmp(&a.name, &b.name));
    let remaining_nodes = remaining.len();
    // Pods that may run on none of the other nodes at all (nodeSelector, taints), room or not.
    let pinned: BTreeSet<String> = to_place
        .iter()
        .filter(|pod| !remaining.iter().any(|node| pod.may_run_on(node)))
        .map(|pod| pod.key.clone())
        .collect();
    let shortfall: Shortfall = match fit(&to_place, &mut remaining) {
        Ok(_) => {
            return CapacityReport {
                pods_to_place: to_place.len(),
                remaining_nodes,
                fits: true,
                unplaceable: Vec::new(),
                message: None,
            };
        }
        Err(shortfall) => shortfall,
    };
    let label = match &*reports {
        [one] => one.node.clone(),
        many => format!("the {} checked nodes together", many.len()),
    };
    let pinned = match pinned.len() {
        0 => String::new(),
        1 => {
            "; 1 unplaceable pod may run on no other node at all (nodeSelector, taints)".to_string()
        }
        n => {
            format!("; {n} unplaceable pods may run on no other node at all (nodeSelector, taints)")
        }
    };
    let message = format!(
        "{}{pinned}: the pods left over stay Pending; make room (more or larger nodes) or \
         maintain fewer nodes at once",
        shortfall.describe(&label)
    );
    for report in reports.iter_mut() {
        // `unplaceable` is largest first: the first of this node's names it.
        let largest = shortfall
            .unplaceable
            .iter()
            .find(|(pod, _)| home.get(pod) == Some(&report.node));
        if let Some((pod, _)) = largest {
            report.findings.push(Finding {
                pod: pod.clone(),
                severity,
                check: "InsufficientCapacity",
                message: message.clone(),
            });
            report
                .findings
                .sort_by(|a, b| a.pod.cmp(&b.pod).then(a.severity.cmp(&b.severity)));
            report.verdict = verdict(&report.findings);
        }
    }
    CapacityReport {
        pods_to_place: to_place.len(),
        remaining_nodes,
        fits: false,
        unplaceable: shortfall
            .unplaceable
            .into_iter()
            .map(|(pod, _)| pod)
            .collect(),
        message: Some(message),
    }
}

/// The human-readable report; `capacity` adds its line at the end.
fn render(reports: &[NodeReport], capacity: Option<&CapacityReport>) -> String {
    let mut out = String::new();
    for report in reports {
        let blocks = report
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Block)
            .count();
        let warnings = report.findings.len() - blocks;
        let pods = match report.pods_to_evict {
            1 => "1 pod to evict".to_string(),
            n => format!("{n} pods to evict"),
        };
        let headline = match report.verdict {
            "blocked" => format!(
                "BLOCKED: {blocks} finding{} would block a drain, {warnings} warning{} ({pods})",
                if blocks == 1 { "" } else { "s" },
                if warnings == 1 { "" } else { "s" }
            ),
            "warnings" => format!(
                "can be drained, with {warnings} warning{} ({pods})",
                if warnings == 1 { "" } else { "s" }
            ),
            _ => format!("ok ({pods}, nothing blocks)"),
        };
        out.push_str(&format!("{}: {headline}\n", report.node));
        let rows: Vec<Vec<String>> = report
            .findings
            .iter()
            .map(|f| {
                vec![
                    match f.severity {
                        Severity::Block => "  BLOCK".to_string(),
                        Severity::Warn => "  warn".to_string(),
                    },
                    f.pod.clone(),
                    f.check.to_string(),
                    f.message.clone(),
                ]
            })
            .collect();
        out.push_str(&render_columns(&rows));
    }
    let count = |verdict: &str| reports.iter().filter(|r| r.verdict == verdict).count();
    out.push_str(&format!(
        "\n{} node{} checked: {} would block a drain, {} with warnings only, {} ok.\n",
        reports.len(),
        if reports.len() == 1 { "" } else { "s" },
        count("blocked"),
        count("warnings"),
        count("ok"),
    ));
    if let Some(capacity) = capacity {
        let pods = match capacity.pods_to_place {
            1 => "the 1 pod to evict".to_string(),
            n => format!("the {n} pods to evict"),
        };
        let nodes = match capacity.remaining_nodes {
            1 => "the 1 other schedulable node".to_string(),
            n => format!("the {n} other schedulable nodes"),
        };
        out.push_str(&if capacity.fits {
            format!("Capacity: {pods} fit on {nodes}.\n")
        } else {
            format!(
                "Capacity: {} of {pods} do not fit on {nodes} (InsufficientCapacity).\n",
                capacity.unplaceable.len()
            )
        });
    }
    out
}

/// The names of the nodes to check: the ones named, those of the selector, or all.
async fn select_nodes(client: &Client, args: &PreflightArgs) -> anyhow::Result<Vec<String>> {
    if !args.nodes.is_empty() {
        let mut nodes = args.nodes.clone();
        let mut seen = BTreeSet::new();
        nodes.retain(|n| seen.insert(n.clone()));
        check_nodes_exist(client, &nodes).await?;
        return Ok(nodes);
    }
    let mut params = ListParams::default();
    if let Some(selector) = &args.selector {
        params = params.labels(selector);
    }
    let api: Api<Node> = Api::all(client.clone());
    let mut names: Vec<String> = list_all(&api, params)
        .await
        .map_err(|err| api_error(err, "list nodes"))?
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    if names.is_empty() {
        match &args.selector {
            Some(selector) => bail!(
                "no node matches --selector {selector:?}: `kubectl get nodes -l '{selector}'` \
                 shows what it selects"
            ),
            None => bail!("the cluster has no nodes"),
        }
    }
    names.sort_by(|a, b| natural_cmp(a, b));
    Ok(names)
}

/// The pods bound to each node.
async fn pods_by_node(
    client: &Client,
    nodes: &[String],
) -> anyhow::Result<HashMap<String, Vec<Pod>>> {
    let api: Api<Pod> = Api::all(client.clone());
    let mut by_node: HashMap<String, Vec<Pod>> =
        nodes.iter().map(|n| (n.clone(), Vec::new())).collect();
    if nodes.len() > PER_NODE_LIST_LIMIT {
        return Ok(cluster_pods(client, nodes).await?.0);
    }
    let lists: Vec<(String, Vec<Pod>)> = futures::stream::iter(nodes.iter().cloned())
        .map(|node| {
            let api = api.clone();
            async move {
                let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
                list_all(&api, params)
                    .await
                    .map(|pods| (node.clone(), pods))
                    .map_err(|err| api_error(err, &format!("list the pods of node {node}")))
            }
        })
        .buffer_unordered(8)
        .try_collect()
        .await?;
    by_node.extend(lists);
    Ok(by_node)
}

/// The pods bound to each of `nodes`, and what the pods of every node request (finished pods
/// left out): one paged list of the pods of the whole cluster, folded page by page so that only
/// the pods of `nodes` are kept.
async fn cluster_pods(
    client: &Client,
    nodes: &[String],
) -> anyhow::Result<(HashMap<String, Vec<Pod>>, HashMap<String, Resources>)> {
    let api: Api<Pod> = Api::all(client.clone());
    let mut by_node: HashMap<String, Vec<Pod>> =
        nodes.iter().map(|n| (n.clone(), Vec::new())).collect();
    let mut requested: HashMap<String, Resources> = HashMap::new();
    // Pages as `list_all`'s.
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|err| api_error(err, "list pods in all namespaces"))?;
        for pod in page.items {
            add_requested(&mut requested, &pod);
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            if let Some(list) = node.and_then(|n| by_node.get_mut(&n)) {
                list.push(pod);
            }
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok((by_node, requested)),
        }
    }
}

/// Resolves the controllers of the given pods into workloads with their replica counts.
async fn workloads(
    client: &Client,
    pods: impl Iterator<Item = &Pod>,
) -> anyhow::Result<HashMap<ControllerKey, Workload>> {
    let keys: BTreeSet<ControllerKey> = pods.filter_map(controller_key).collect();
    let mut out = HashMap::new();
    for key in keys {
        let (namespace, kind, name) = key.clone();
        let what = format!("read {kind} {namespace}/{name}");
        let workload = match kind.as_str() {
            "ReplicaSet" => {
                let rs = Api::<ReplicaSet>::namespaced(client.clone(), &namespace)
                    .get_opt(&name)
                    .await
                    .map_err(|err| api_error(err, &what))?;
                match rs {
                    None => None,
                    Some(rs) => {
                        let deployment = rs
                            .metadata
                            .owner_references
                            .iter()
                            .flatten()
                            .find(|o| o.controller == Some(true) && o.kind == "Deployment")
                            .map(|o| o.name.clone());
                        match deployment {
                            Some(deployment) => {
                                let what = format!("read Deployment {namespace}/{deployment}");
                                Api::<Deployment>::namespaced(client.clone(), &namespace)
                                    .get_opt(&deployment)
                                    .await
                                    .map_err(|err| api_error(err, &what))?
                                    .map(|d| Workload {
                                        kind: "Deployment".into(),
                                        namespace: namespace.clone(),
                                        name: deployment.clone(),
                                        replicas: d.spec.replicas.unwrap_or(1),
                                    })
                            }
                            None => Some(Workload {
                                kind,
                                namespace: namespace.clone(),
                                name: name.clone(),
                                replicas: rs.spec.replicas.unwrap_or(1),
                            }),
                        }
                    }
                }
            }
            "StatefulSet" => Api::<StatefulSet>::namespaced(client.clone(), &namespace)
                .get_opt(&name)
                .await
                .map_err(|err| api_error(err, &what))?
                .map(|s| Workload {
                    kind,
                    namespace: namespace.clone(),
                    name: name.clone(),
                    replicas: s.spec.replicas.unwrap_or(1),
                }),
            "ReplicationController" => {
                Api::<ReplicationController>::namespaced(client.clone(), &namespace)
                    .get_opt(&name)
                    .await
                    .map_err(|err| api_error(err, &what))?
                    .map(|rc| Workload {
                        kind,
                        namespace: namespace.clone(),
                        name: name.clone(),
                        replicas: rc.spec.and_then(|s| s.replicas).unwrap_or(1),
                    })
            }
            // Jobs, DaemonSets and custom controllers: replicas mean nothing general there.
            _ => None,
        };
        if let Some(workload) = workload {
            out.insert(key, workload);
        }
    }
    Ok(out)
}

pub async fn run(global: &GlobalArgs, args: PreflightArgs) -> anyhow::Result<Outcome> {
    let spec = DrainSpec {
        force: Some(args.force),
        delete_empty_dir: Some(args.delete_empty_dir),
        pod_selector: args.pod_selector.clone(),
        ..DrainSpec::default()
    };
    let rules = DrainRules::new(
        &spec,
        Some(OperatorIdentity::new(
            global.operator_namespace.clone(),
            None,
        )),
    )
    .map_err(|err| {
        anyhow::anyhow!(
            "{}",
            err.to_string()
                .replace("spec.drainSpec.podSelector", "--pod-selector")
        )
    })?;
    let (client, _) = connect(global).await?;
    let nodes = select_nodes(&client, &args).await?;
    // The capacity check needs what every node's pods request: one list of all pods serves both.
    let (pods, requested) = if args.skip_capacity {
        (pods_by_node(&client, &nodes).await?, None)
    } else {
        let (pods, requested) = cluster_pods(&client, &nodes).await?;
        (pods, Some(requested))
    };
    let pdbs = list_all(
        &Api::<PodDisruptionBudget>::all(client.clone()),
        ListParams::default(),
    )
    .await
    .map_err(|err| api_error(err, "list PodDisruptionBudgets in all namespaces"))?;
    let facts = PreflightFacts {
        pdbs,
        workloads: workloads(&client, pods.values().flatten()).await?,
    };
    let mut reports: Vec<NodeReport> = nodes
        .iter()
        .map(|node| {
            let node_pods = pods.get(node).map(Vec::as_slice).unwrap_or_default();
            check_node(node, node_pods, &rules, &facts)
        })
        .collect();
    let capacity = match requested {
        None => None,
        Some(requested) => {
            let all_nodes = list_all(&Api::<Node>::all(client.clone()), ListParams::default())
                .await
                .map_err(|err| api_error(err, "list nodes"))?;
            let severity = if args.check_capacity {
                Severity::Block
            } else {
                Severity::Warn
            };
            Some(check_capacity(
                &mut reports,
                &pods,
                &rules,
                &all_nodes,
                &requested,
                severity,
            ))
        }
    };
    let blocked = reports.iter().filter(|r| r.verdict == "blocked").count();
    match args.output {
        OutputFormat::Table => print!("{}", render(&reports, capacity.as_ref())),
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "nodes": reports,
                "blocked": blocked,
                "capacity": capacity,
            }))
            .context("cannot write the report as JSON")?
        ),
    }
    Ok(if blocked > 0 {
        Outcome::No
    } else {
        Outcome::Success
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Container, EmptyDirVolumeSource, NodeCondition, NodeSpec, NodeStatus, PodSpec, PodStatus,
        ResourceRequirements, Volume,
    };
    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelector, ObjectMeta, OwnerReference,
    };

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn pod(name: &str, app: &str, owner: Option<(&str, &str)>, empty_dir: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("team".into()),
                labels: Some(labels(&[("app", app)])),
                owner_references: owner.map(|(kind, name)| {
                    vec![OwnerReference {
                        kind: kind.into(),
                        name: name.into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            spec: Some(PodSpec {
                volumes: empty_dir.then(|| {
                    vec![Volume {
                        name: "scratch".into(),
                        empty_dir: Some(EmptyDirVolumeSource::default()),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
        }
    }

    fn pdb(
        name: &str,
        app: &str,
        min: Option<IntOrString>,
        max: Option<IntOrString>,
        allowed: i32,
        expected: i32,
    ) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("team".into()),
                ..Default::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector {
                    match_labels: Some(labels(&[("app", app)])),
                    ..Default::default()
                }),
                min_available: min,
                max_unavailable: max,
                ..Default::default()
            }),
            status: Some(PodDisruptionBudgetStatus {
                disruptions_allowed: Some(allowed),
                expected_pods: Some(expected),
                current_healthy: Some(expected),
                desired_healthy: Some(expected - allowed),
                ..Default::default()
            }),
        }
    }

    fn workload(kind: &str, name: &str, replicas: i32) -> Workload {
        Workload {
            kind: kind.into(),
            namespace: "team".into(),
            name: name.into(),
            replicas,
        }
    }

    fn rules(force: bool, delete_empty_dir: bool) -> DrainRules {
        let spec = DrainSpec {
            force: Some(force),
            delete_empty_dir: Some(delete_empty_dir),
            ..Default::default()
        };
        match DrainRules::new(&spec, None) {
            Ok(rules) => rules,
            Err(err) => panic!("{err}"),
        }
    }

    fn checks(report: &NodeReport) -> Vec<(String, Severity, &'static str)> {
        report
            .findings
            .iter()
            .map(|f| (f.pod.clone(), f.severity, f.check))
            .collect()
    }

    fn facts(
        pdbs: Vec<PodDisruptionBudget>,
        workloads: &[(&str, &str, Workload)],
    ) -> PreflightFacts {
        PreflightFacts {
            pdbs,
            workloads: workloads
                .iter()
                .map(|(kind, name, w)| {
                    (
                        ("team".to_string(), kind.to_string(), name.to_string()),
                        w.clone(),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn a_single_replica_behind_a_min_available_pdb_blocks() {
        let pods = [pod("db-abc", "db", Some(("ReplicaSet", "db-rs")), false)];
        let facts = facts(
            vec![pdb("db", "db", Some(IntOrString::Int(1)), None, 0, 1)],
            &[("ReplicaSet", "db-rs", workload("Deployment", "db", 1))],
        );
        let report = check_node("n1", &pods, &rules(false, false), &facts);
        assert_eq!(report.verdict, "blocked");
        assert_eq!(
            checks(&report),
            [
                ("team/db-abc".to_string(), Severity::Block, "PDBNeverAllows"),
                ("team/db-abc".to_string(), Severity::Warn, "SingleReplica"),
            ]
        );
        assert!(
            report.findings[0]
                .message
                .contains("minAvailable 1 with 1 expected pod never allows an eviction")
        );
        assert!(
            report.findings[0]
                .message
                .contains("scale Deployment team/db up")
        );
    }

    #[test]
    fn a_pdb_allowing_nothing_now_and_several_pdbs_block() {
        let pods = [
            pod("web-1", "web", Some(("ReplicaSet", "web-rs")), false),
            pod("api-1", "api", Some(("ReplicaSet", "api-rs")), false),
        ];
        let mut both = pdb("api-2", "api", None, Some(IntOrString::Int(1)), 1, 3);
        both.metadata.name = Some("api-extra".into());
        let facts = facts(
            vec![
                pdb("web", "web", Some(IntOrString::Int(2)), None, 0, 3),
                pdb("api", "api", None, Some(IntOrString::Int(1)), 1, 3),
                both,
            ],
            &[
                ("ReplicaSet", "web-rs", workload("Deployment", "web", 3)),
                ("ReplicaSet", "api-rs", workload("Deployment", "api", 3)),
            ],
        );
        let report = check_node("n1", &pods, &rules(false, false), &facts);
        assert_eq!(
            checks(&report),
            [
                ("team/api-1".to_string(), Severity::Block, "MultiplePDBs"),
                ("team/web-1".to_string(), Severity::Block, "PDBAllowsNone"),
            ]
        );
    }

    #[test]
    fn max_unavailable_zero_and_full_percentages_never_allow() {
        let w = workload("StatefulSet", "db", 3);
        for (min, max) in [
            (None, Some(IntOrString::Int(0))),
            (None, Some(IntOrString::String("0%".into()))),
            (Some(IntOrString::String("100%".into())), None),
            (Some(IntOrString::Int(3)), None),
        ] {
            let p = pdb("db", "db", min.clone(), max.clone(), 0, 3);
            assert!(never_allows(&p, Some(&w)).is_some(), "{min:?} {max:?}");
        }
        let p = pdb("db", "db", Some(IntOrString::Int(2)), None, 1, 3);
        assert!(never_allows(&p, Some(&w)).is_none());
    }

    #[test]
    fn bare_and_empty_dir_pods_need_flags_and_warn_with_them() {
        let pods = [
            pod("bare", "x", None, false),
            pod(
                "scratch-1",
                "scratch",
                Some(("ReplicaSet", "scratch-rs")),
                true,
            ),
        ];
        let facts = facts(
            vec![],
            &[(
                "ReplicaSet",
                "scratch-rs",
                workload("Deployment", "scratch", 2),
            )],
        );
        let strict = check_node("n1", &pods, &rules(false, false), &facts);
        assert_eq!(
            checks(&strict),
            [
                ("team/bare".to_string(), Severity::Block, "NeedsForce"),
                (
                    "team/scratch-1".to_string(),
                    Severity::Block,
                    "NeedsDeleteEmptyDir"
                ),
            ]
        );
        let lenient = check_node("n1", &pods, &rules(true, true), &facts);
        assert_eq!(lenient.verdict, "warnings");
        assert_eq!(
            checks(&lenient),
            [
                ("team/bare".to_string(), Severity::Warn, "NoController"),
                (
                    "team/scratch-1".to_string(),
                    Severity::Warn,
                    "EmptyDirDataLoss"
                ),
            ]
        );
    }

    #[test]
    fn all_replicas_on_the_node_warn_unless_a_pdb_paces_them() {
        let pods = [
            pod("web-1", "web", Some(("ReplicaSet", "web-rs")), false),
            pod("web-2", "web", Some(("ReplicaSet", "web-rs")), false),
        ];
        let workloads = [("ReplicaSet", "web-rs", workload("Deployment", "web", 2))];
        let unpaced = check_node(
            "n1",
            &pods,
            &rules(false, false),
            &facts(vec![], &workloads),
        );
        assert_eq!(
            checks(&unpaced),
            [(
                "team/web-1".to_string(),
                Severity::Warn,
                "AllReplicasOnNode"
            )]
        );
        let paced = facts(
            vec![pdb("web", "web", None, Some(IntOrString::Int(1)), 1, 2)],
            &workloads,
        );
        let report = check_node("n1", &pods, &rules(false, false), &paced);
        assert_eq!(report.verdict, "ok");
        assert_eq!(report.pods_to_evict, 2);
        assert!(render(&[report], None).starts_with("n1: ok (2 pods to evict, nothing blocks)"));
    }

    #[test]
    fn daemonset_and_finished_pods_are_not_checked() {
        let mut done = pod("job-1", "job", None, true);
        if let Some(status) = done.status.as_mut() {
            status.phase = Some("Succeeded".into());
        }
        let pods = [
            pod("agent-1", "agent", Some(("DaemonSet", "agent")), true),
            done,
        ];
        let report = check_node(
            "n1",
            &pods,
            &rules(false, false),
            &PreflightFacts::default(),
        );
        assert_eq!(report.verdict, "ok");
        assert_eq!(report.pods_to_evict, 0);
    }

    fn quantities(cpu: &str, memory: &str) -> BTreeMap<String, Quantity> {
        BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity(memory.into())),
        ])
    }

    /// A ReplicaSet pod on `node` requesting `cpu` and `memory`.
    fn sized_pod(name: &str, node: &str, cpu: &str, memory: &str) -> Pod {
        let mut pod = pod(name, name, Some(("ReplicaSet", "rs")), false);
        if let Some(spec) = pod.spec.as_mut() {
            spec.node_name = Some(node.into());
            spec.containers = vec![Container {
                name: "main".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(quantities(cpu, memory)),
                    ..Default::default()
                }),
                ..Default::default()
            }];
        }
        pod
    }

    fn node(name: &str, cpu: &str, memory: &str, ready: bool, cordoned: bool) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(cordoned),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                allocatable: Some(quantities(cpu, memory)),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn report(node: &str) -> NodeReport {
        NodeReport {
            node: node.into(),
            verdict: "ok",
            pods_to_evict: 0,
            findings: Vec::new(),
        }
    }

    #[test]
    fn requested_sums_leave_finished_and_unbound_pods_out() {
        let mut requested = HashMap::new();
        let mut done = sized_pod("done", "n2", "8", "8Gi");
        if let Some(status) = done.status.as_mut() {
            status.phase = Some("Succeeded".into());
        }
        let mut unbound = sized_pod("unbound", "n2", "8", "8Gi");
        if let Some(spec) = unbound.spec.as_mut() {
            spec.node_name = None;
        }
        for pod in [
            sized_pod("a", "n2", "500m", "1Gi"),
            sized_pod("b", "n2", "1", "512Mi"),
            done,
            unbound,
        ] {
            add_requested(&mut requested, &pod);
        }
        assert_eq!(
            requested.get("n2"),
            Some(&Resources {
                cpu_milli: 1500,
                memory_bytes: (1 << 30) + (512 << 20),
            })
        );
        assert_eq!(requested.len(), 1);
    }

    /// n1 and n2 are the nodes to check; n3 has 4 CPU with 1 requested; n4 is cordoned, n5 not
    /// Ready.
    struct CapacityCluster {
        pods: HashMap<String, Vec<Pod>>,
        nodes: Vec<Node>,
        requested: HashMap<String, Resources>,
    }

    impl CapacityCluster {
        fn new() -> Self {
            let pods = HashMap::from([
                (
                    "n1".to_string(),
                    vec![
                        sized_pod("web-1", "n1", "2", "1Gi"),
                        // Not evicted by a drain: not placed either.
                        pod("agent-1", "agent", Some(("DaemonSet", "agent")), false),
                    ],
                ),
                (
                    "n2".to_string(),
                    vec![sized_pod("web-2", "n2", "2500m", "1Gi")],
                ),
            ]);
            let nodes = vec![
                node("n1", "8", "8Gi", true, false),
                node("n2", "8", "8Gi", true, false),
                node("n3", "4", "8Gi", true, false),
                node("n4", "64", "64Gi", true, true),
                node("n5", "64", "64Gi", false, false),
            ];
            let requested = HashMap::from([(
                "n3".to_string(),
                Resources {
                    cpu_milli: 1000,
                    memory_bytes: 0,
                },
            )]);
            CapacityCluster {
                pods,
                nodes,
                requested,
            }
        }

        fn check(&self, reports: &mut [NodeReport], severity: Severity) -> CapacityReport {
            check_capacity(
                reports,
                &self.pods,
                &rules(false, false),
                &self.nodes,
                &self.requested,
                severity,
            )
        }
    }

    #[test]
    fn the_pods_of_one_node_fit_on_the_other_schedulable_nodes() {
        let mut one = [report("n1")];
        let capacity = CapacityCluster::new().check(&mut one, Severity::Warn);
        assert!(capacity.fits, "{capacity:?}");
        assert_eq!((capacity.pods_to_place, capacity.remaining_nodes), (1, 2));
        assert_eq!(one[0].verdict, "ok");
        assert!(
            render(&one, Some(&capacity))
                .ends_with("Capacity: the 1 pod to evict fit on the 2 other schedulable nodes.\n")
        );
    }

    #[test]
    fn evicted_pods_must_fit_on_the_other_schedulable_nodes() {
        // Both: 4.5 CPU for 3 free; the larger pod is placed first, web-1 is left over.
        let mut both = [report("n1"), report("n2")];
        let capacity = CapacityCluster::new().check(&mut both, Severity::Block);
        assert!(!capacity.fits);
        assert_eq!(capacity.remaining_nodes, 1);
        assert_eq!(capacity.unplaceable, ["team/web-1"]);
        assert_eq!(both[0].verdict, "blocked");
        assert_eq!(both[1].verdict, "ok");
        assert_eq!(
            checks(&both[0]),
            [(
                "team/web-1".to_string(),
                Severity::Block,
                "InsufficientCapacity"
            )]
        );
        assert_eq!(
            both[0].findings[0].message,
            "pods of the 2 checked nodes together need 1500m CPU more than the 1 remaining \
             schedulable nodes have free; largest unplaceable pod team/web-1 needs 2 CPU and 1Gi: \
             the pods left over stay Pending; make room (more or larger nodes) or maintain fewer \
             nodes at once"
        );
        let text = render(&both, Some(&capacity));
        assert!(
            text.contains("  BLOCK   team/web-1   InsufficientCapacity   pods of the 2 checked"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "Capacity: 1 of the 2 pods to evict do not fit on the 1 other schedulable node \
                 (InsufficientCapacity).\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn pods_that_do_not_fit_only_warn_without_check_capacity() {
        let mut warned = [report("n1"), report("n2")];
        CapacityCluster::new().check(&mut warned, Severity::Warn);
        assert_eq!(warned[0].verdict, "warnings");
    }

    #[test]
    fn pods_that_may_run_on_no_other_node_are_named_as_such() {
        let mut pinned = sized_pod("local-1", "n1", "1", "1Gi");
        if let Some(spec) = pinned.spec.as_mut() {
            spec.node_selector = Some(labels(&[("kubernetes.io/hostname", "n1")]));
        }
        let pods = HashMap::from([("n1".to_string(), vec![pinned])]);
        let nodes = [
            node("n1", "8", "8Gi", true, false),
            node("n2", "8", "8Gi", true, false),
        ];
        let mut reports = [report("n1")];
        let capacity = check_capacity(
            &mut reports,
            &pods,
            &rules(false, false),
            &nodes,
            &HashMap::new(),
            Severity::Warn,
        );
        assert_eq!(capacity.unplaceable, ["team/local-1"]);
        let message = capacity.message.unwrap_or_default();
        assert!(
            message.starts_with("pods of n1 do not fit on the 1 remaining schedulable nodes")
                && message.contains("; 1 unplaceable pod may run on no other node at all"),
            "{message}"
        );
        assert_eq!(reports[0].verdict, "warnings");
    }
}
