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
use maintenance_core::drain_plan::{
    DrainRules, OperatorIdentity, PodDisposition, PodRef, classify, controller_ref, covering_pdbs,
    is_finished, required_flags,
};
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
DaemonSet pods, mirror pods, finished and terminating pods, the operator's own pods and pods
outside --pod-selector are not evicted by a drain and not checked. Pass the drain flags you will
use with `request` or `rollout` (--force, --delete-emptydir, --pod-selector).

Exit code 0 when nothing blocks (warnings allowed), 1 when some node would block a drain, 2 on
errors.

Examples:
  kubectl maintenance preflight node-1 node-2
  kubectl maintenance preflight --selector pool=gpu --force --delete-emptydir -o json";

/// Above this many nodes, the pods of the whole cluster are listed once instead of per node.
const PER_NODE_LIST_LIMIT: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// A section per node with a line per finding.
    Table,
    /// One JSON object: {"nodes": [{node, verdict, podsToEvict, findings}], "blocked": N}.
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
    // Evicted pods per workload, for the all-replicas check: (workload, pods, any PDB covers).
    let mut per_workload: BTreeMap<String, (Workload, Vec<String>, bool)> = BTreeMap::new();
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
        let mut finding = |severity, check, message: String| {
            findings.push(Finding {
                pod: key.clone(),
                severity,
                check,
                message,
            })
        };

        match disposition {
            PodDisposition::Blocked(reason) => {
                if reason.needs_force() {
                    finding(
                        Severity::Block,
                        "NeedsForce",
                        "no controller would recreate it: a drain waits for --force (with which \
                         the pod is deleted for good)"
                            .to_string(),
                    );
                }
                if reason.needs_delete_empty_dir() {
                    finding(
                        Severity::Block,
                        "NeedsDeleteEmptyDir",
                        "it has an emptyDir volume: a drain waits for --delete-emptydir (with \
                         which its data is lost)"
                            .to_string(),
                    );
                }
            }
            // Evicted thanks to the flags given: say what they cost.
            _ => {
                let flags = required_flags(pod);
                if flags.is_some_and(|f| f.needs_force()) {
                    finding(
                        Severity::Warn,
                        "NoController",
                        "no controller would recreate it: --force deletes it for good".to_string(),
                    );
                }
                if flags.is_some_and(|f| f.needs_delete_empty_dir()) {
                    finding(
                        Severity::Warn,
                        "EmptyDirDataLoss",
                        "--delete-emptydir evicts it and the data of its emptyDir volume is lost"
                            .to_string(),
                    );
                }
            }
        }

        let covering = covering_pdbs(pod, &facts.pdbs);
        match covering.as_slice() {
            [] => {}
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
                    finding(
                        Severity::Block,
                        "PDBNeverAllows",
                        format!("PodDisruptionBudget {}: {why}; {fix}", pdb_key(pdb)),
                    );
                } else if let Some(status) =
                    status.filter(|s| s.disruptions_allowed.is_some_and(|n| n <= 0))
                {
                    finding(
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
                    );
                }
            }
            several => {
                let names: Vec<String> = several.iter().map(|pdb| pdb_key(pdb)).collect();
                finding(
                    Severity::Block,
                    "MultiplePDBs",
                    format!(
                        "selected by {} PodDisruptionBudgets ({}): the Eviction API refuses to \
                         evict it; make exactly one select the pod",
                        names.len(),
                        names.join(", ")
                    ),
                );
            }
        }

        if let Some(workload) = workload {
            if workload.replicas == 1 {
                finding(
                    Severity::Warn,
                    "SingleReplica",
                    format!(
                        "{} has 1 replica: it is down from the eviction until its replacement \
                         runs elsewhere; scale it to 2 or more",
                        workload.describe()
                    ),
                );
            }
            let entry = per_workload
                .entry(workload.describe())
                .or_insert_with(|| (workload.clone(), Vec::new(), false));
            entry.1.push(key.clone());
            entry.2 |= !covering.is_empty();
        }
    }

    for (workload, pods, paced) in per_workload.into_values() {
        let count = i32::try_from(pods.len()).unwrap_or(i32::MAX);
        if workload.replicas > 1 && count >= workload.replicas && !paced {
            findings.push(Finding {
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
            });
        }
    }

    findings.sort_by(|a, b| a.pod.cmp(&b.pod).then(a.severity.cmp(&b.severity)));
    let verdict = if findings.iter().any(|f| f.severity == Severity::Block) {
        "blocked"
    } else if findings.is_empty() {
        "ok"
    } else {
        "warnings"
    };
    NodeReport {
        node: node.to_string(),
        verdict,
        pods_to_evict: to_evict,
        findings,
    }
}

/// The human-readable report.
fn render(reports: &[NodeReport]) -> String {
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
        let pods = list_all(&api, ListParams::default())
            .await
            .map_err(|err| api_error(err, "list pods in all namespaces"))?;
        for pod in pods {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            if let Some(list) = node.and_then(|n| by_node.get_mut(&n)) {
                list.push(pod);
            }
        }
        return Ok(by_node);
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
    let pods = pods_by_node(&client, &nodes).await?;
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
    let reports: Vec<NodeReport> = nodes
        .iter()
        .map(|node| {
            let node_pods = pods.get(node).map(Vec::as_slice).unwrap_or_default();
            check_node(node, node_pods, &rules, &facts)
        })
        .collect();
    let blocked = reports.iter().filter(|r| r.verdict == "blocked").count();
    match args.output {
        OutputFormat::Table => print!("{}", render(&reports)),
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "nodes": reports,
                "blocked": blocked,
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
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec, PodStatus, Volume};
    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
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
        assert!(render(&[report]).starts_with("n1: ok (2 pods to evict, nothing blocks)"));
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
}
