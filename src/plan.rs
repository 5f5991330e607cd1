//! `maintenance-operator plan`: a dry run of one scheduling round.
//!
//! For people asking "why is my request still Pending?": it runs the operator's own scheduler on
//! the live cluster, or on YAML (`kubectl get -o yaml` output or hand-written manifests), and shows
//! what would be admitted and why everything else waits. It never writes anything.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams};
use maintenance_actors::gates::GateAsker;
use maintenance_core::budgets::{BudgetStatus, WindowStatus};
use maintenance_core::plan_input::{DrainObservations, plan_objects_with};
pub use maintenance_core::plan_input::{PlanReport, plan_from_yaml};
use maintenance_core::scheduler::NodeGroupStatus;
use maintenance_crds::{DEFAULT_CONFIG_NAME, MaintenanceOperatorConfig, NodeMaintenance, Phase};

use crate::list_all;

/// Show what one scheduling round would admit now, and why every other Pending request waits.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// Read Nodes, NodeMaintenances and the MaintenanceOperatorConfig from this YAML file (several
    /// `---` documents, or a `kind: List` as `kubectl get -o yaml` writes it; `-` reads stdin)
    /// instead of the cluster.
    #[arg(long, value_name = "FILE")]
    pub from_file: Option<PathBuf>,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,

    /// Namespace of the operator: only the MaintenanceOperatorConfig named `default` there counts.
    #[arg(
        long,
        env = "OPERATOR_NAMESPACE",
        default_value = "maintenance-operator"
    )]
    pub namespace: String,

    /// Plan as if it were this time (RFC 3339, e.g. 2026-03-02T01:30:00+01:00): which
    /// maintenance windows are open. Default: now.
    #[arg(long, value_name = "TIME")]
    pub at: Option<jiff::Timestamp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// A readable summary and table.
    Table,
    /// One JSON object: availableSlots, canBecomeUnavailable, scheduled, waiting (each with its
    /// reason, cause, and the budget and group that hold it back), maintenanceWindows, budgets.
    Json,
}

/// Runs the `plan` command.
pub async fn run(args: PlanArgs) -> anyhow::Result<()> {
    let now = args.at.unwrap_or_else(jiff::Timestamp::now);
    let report = match &args.from_file {
        Some(path) => {
            let text = read_input(path)?;
            plan_from_yaml(&text, &args.namespace, now)
                .with_context(|| format!("cannot plan from {}", input_name(path)))?
        }
        None => plan_from_cluster(&args.namespace, now).await?,
    };
    for note in &report.notes {
        eprintln!("note: {note}");
    }
    match args.output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report.decision)?),
        OutputFormat::Table => print!("{}", render_table(&report)),
    }
    Ok(())
}

/// `-` stands for stdin, as with kubectl's `-f -`.
fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == "-"
}

fn input_name(path: &Path) -> String {
    if is_stdin(path) {
        "standard input".to_string()
    } else {
        path.display().to_string()
    }
}

fn read_input(path: &Path) -> anyhow::Result<String> {
    if is_stdin(path) {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the plan input from stdin")?;
        Ok(text)
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}: check the --from-file path", path.display()))
    }
}

async fn plan_from_cluster(
    operator_namespace: &str,
    now: jiff::Timestamp,
) -> anyhow::Result<PlanReport> {
    let client = kube::Client::try_default().await.context(
        "cannot connect to the cluster (kubeconfig or in-cluster config); \
         use --from-file to plan from YAML instead",
    )?;
    let nodes: Vec<Node> = list_all(&Api::all(client.clone()), ListParams::default())
        .await
        .context("cannot list Nodes: check that your account may list nodes")?;
    let requests: Vec<NodeMaintenance> = list_all(&Api::all(client.clone()), ListParams::default())
        .await
        .context(
            "cannot list NodeMaintenances in all namespaces: is the CRD installed \
             (crds/crds.yaml) and may your account list them?",
        )?;
    let config = Api::<MaintenanceOperatorConfig>::namespaced(client.clone(), operator_namespace)
        .get_opt(DEFAULT_CONFIG_NAME)
        .await
        .with_context(|| {
            format!(
                "cannot read MaintenanceOperatorConfig {DEFAULT_CONFIG_NAME} in namespace \
                 {operator_namespace}: is the CRD installed (crds/crds.yaml)?"
            )
        })?;
    let spec = config.as_ref().map(|config| &config.spec);
    // preferDrainable: read the PDBs and the pods of the nodes of Pending requests, as the
    // operator does (by node, never all pods of the cluster).
    let mut pods: Vec<Pod> = Vec::new();
    let mut pdbs: Vec<PodDisruptionBudget> = Vec::new();
    let prefer = spec.is_some_and(|s| s.admission().prefer_drainable());
    let check_capacity = spec.is_some_and(|s| s.admission().check_capacity());
    if prefer {
        pdbs = list_all(&Api::all(client.clone()), ListParams::default())
            .await
            .context("cannot list PodDisruptionBudgets (admission.preferDrainable is on): check that your account may list them")?;
    }
    if check_capacity {
        // Every pod: what each node already has requested (finished pods request nothing).
        let params = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
        pods = list_all(&Api::all(client.clone()), params)
            .await
            .context("cannot list pods (admission.checkCapacity is on): check that your account may list pods in all namespaces")?;
    } else if prefer {
        let pending_nodes: BTreeSet<&str> = requests
            .iter()
            .filter(|r| r.phase() == Phase::Pending && r.spec.drain_spec.is_some())
            .map(|r| r.spec.node_name.as_str())
            .collect();
        for node in pending_nodes {
            let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
            pods.extend(
                list_all::<Pod>(&Api::all(client.clone()), params)
                    .await
                    .with_context(|| format!("cannot list the pods of node {node} (admission.preferDrainable is on): check that your account may list pods"))?,
            );
        }
    }
    // The alert gates, asked as the operator asks them (its Secrets read with this account).
    let asker = GateAsker::new(Some(client.clone()), operator_namespace.to_string());
    let gates = spec.map(|s| s.gates()).unwrap_or_default();
    let answers = futures::future::join_all(gates.iter().map(|gate| asker.ask(gate))).await;
    Ok(plan_objects_with(
        &nodes,
        &requests,
        spec,
        (prefer || check_capacity).then_some(DrainObservations {
            pods: &pods,
            pdbs: &pdbs,
        }),
        Some(&answers),
        operator_namespace,
        now,
    )?)
}

/// The human-readable output: the two cluster-wide figures, windows and budgets when set, then
/// one row per Pending request.
fn render_table(report: &PlanReport) -> String {
    let decision = &report.decision;
    let mut out = format!("Available slots:         {}\n", decision.available_slots);
    match decision.can_become_unavailable {
        Some(count) => out.push_str(&format!("Can become unavailable:  {count}\n")),
        None => out.push_str("Can become unavailable:  no limit (maxUnavailable is unset)\n"),
    }
    if let Some(windows) = &decision.maintenance_windows {
        out.push_str(&format!(
            "Maintenance windows:     {}\n",
            describe_windows(windows)
        ));
    }
    if let Some(blackout) = &decision.blackout {
        out.push_str(&format!(
            "Blackout:                {:?} (blackouts[{}]) until {}\n",
            blackout.reason, blackout.index, blackout.until
        ));
    }
    if let Some(gate) = &report.gate_hold {
        out.push_str(&format!("Alert gate:              {}\n", gate.describe()));
    }
    if let Some(capacity) = &decision.capacity {
        out.push_str(&format!("Capacity for evictions: {capacity}\n"));
    }
    out.push('\n');
    if !decision.budgets.is_empty() {
        out.push_str(&render_budgets(&decision.budgets));
        out.push('\n');
    }
    if !decision.node_groups.is_empty() {
        out.push_str(&render_node_groups(&decision.node_groups));
        out.push('\n');
    }
    if decision.scheduled.is_empty() && decision.waiting.is_empty() {
        out.push_str("No Pending requests: nothing to schedule.\n");
        return out;
    }

    let requests: HashMap<String, (&str, &str)> = report
        .snapshot
        .requests
        .iter()
        .map(|r| {
            (
                r.key().to_string(),
                (r.node_name.as_str(), r.requestor_id.as_str()),
            )
        })
        .collect();
    let mut rows = vec![[
        "REQUEST".to_string(),
        "NODE".to_string(),
        "REQUESTOR".to_string(),
        "DECISION".to_string(),
        "REASON".to_string(),
    ]];
    let decided = decision
        .scheduled
        .iter()
        .map(|key| (key, "Scheduled", ""))
        .chain(
            decision
                .waiting
                .iter()
                .map(|w| (&w.key, "Waiting", w.reason.as_str())),
        );
    for (key, outcome, reason) in decided {
        let key = key.to_string();
        let (node, requestor) = requests.get(&key).copied().unwrap_or_default();
        rows.push([
            key.clone(),
            node.to_string(),
            requestor.to_string(),
            outcome.to_string(),
            reason.to_string(),
        ]);
    }
    out.push_str(&columns(&rows));
    out
}

fn describe_windows(windows: &WindowStatus) -> String {
    match (&windows.open, &windows.next_opening) {
        (true, _) => "open".to_string(),
        (false, Some(next)) => format!("closed; the next opens at {next}"),
        (false, None) => "closed; no schedule fires again".to_string(),
    }
}

/// One line per node group with Pending requests: admitted now, or what it waits for.
fn render_node_groups(groups: &[NodeGroupStatus]) -> String {
    let mut out = String::from("Node groups:\n");
    for group in groups {
        let size = group
            .expected_size
            .map(|size| format!(", group-size {size}"))
            .unwrap_or_default();
        let outcome = match group.cause {
            None => "admitted together".to_string(),
            Some(cause) => format!("waiting ({})", cause.as_str()),
        };
        out.push_str(&format!(
            "  {}/{}: {} pending{size}, {outcome}\n",
            group.namespace, group.name, group.pending
        ));
    }
    out
}

/// One line per budget, then one per group: what is used and what is left.
fn render_budgets(budgets: &[BudgetStatus]) -> String {
    let unlimited = |value: Option<u32>| value.map_or_else(|| "-".to_string(), |v| v.to_string());
    let mut rows = vec![[
        "BUDGET".to_string(),
        "GROUP".to_string(),
        "NODES".to_string(),
        "IN MAINTENANCE".to_string(),
        "UNAVAILABLE".to_string(),
        "SLOTS".to_string(),
        "CAN BECOME UNAVAILABLE".to_string(),
    ]];
    let mut notes = Vec::new();
    for budget in budgets {
        for group in &budget.groups {
            let group_name = match (&budget.group_by_label, &group.group) {
                (Some(label), Some(value)) if value.is_empty() => format!("{label}=<none>"),
                (Some(label), Some(value)) => format!("{label}={value}"),
                _ => "(all)".to_string(),
            };
            rows.push([
                budget.name.clone(),
                group_name,
                group.nodes.to_string(),
                group.in_maintenance.to_string(),
                group.unavailable.to_string(),
                unlimited(group.available_slots),
                unlimited(group.can_become_unavailable),
            ]);
        }
        if budget.groups.is_empty() {
            rows.push([
                budget.name.clone(),
                "(selects no node)".to_string(),
                "0".to_string(),
                "0".to_string(),
                "0".to_string(),
                "-".to_string(),
                "-".to_string(),
            ]);
        }
        if let Some(count) = &budget.groups_in_maintenance {
            notes.push(format!(
                "Budget {}: {} of at most {} groups in maintenance (maxGroupsInMaintenance)",
                budget.name, count.count, count.limit
            ));
        }
        if let Some(count) = &budget.unavailable_groups {
            notes.push(format!(
                "Budget {}: {} of at most {} groups with unavailable nodes (maxUnavailableGroups)",
                budget.name, count.count, count.limit
            ));
        }
        if let Some(windows) = &budget.maintenance_windows {
            notes.push(format!(
                "Budget {}: maintenance windows {}",
                budget.name,
                describe_windows(windows)
            ));
        }
    }
    let mut out = columns(&rows);
    for note in notes {
        out.push_str(&note);
        out.push('\n');
    }
    out
}

/// Rows as left-aligned columns, three spaces apart.
fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|column| {
            rows.iter()
                .map(|row| row[column].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            line.push_str(&format!("{cell:<width$}   "));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use maintenance_core::scheduler::WaitCause;

    #[test]
    fn table_lists_every_pending_request() {
        let yaml = r#"
kind: Node
metadata: {name: node-0}
status: {conditions: [{type: Ready, status: "True"}]}
---
kind: Node
metadata: {name: node-1}
status: {conditions: [{type: Ready, status: "True"}]}
---
kind: NodeMaintenance
metadata: {name: r0, namespace: team, creationTimestamp: "2026-01-01T00:00:00Z"}
spec: {nodeName: node-0, requestorID: fw}
---
kind: NodeMaintenance
metadata: {name: r1, namespace: team, creationTimestamp: "2026-01-01T00:00:01Z"}
spec: {nodeName: node-1, requestorID: fw}
---
kind: MaintenanceOperatorConfig
metadata: {name: default, namespace: maintenance-operator}
spec: {maxParallelOperations: 1, maxUnavailable: 1}
"#;
        let report = plan_from_yaml(yaml, "maintenance-operator", jiff::Timestamp::now())
            .expect("valid input");
        let table = render_table(&report);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "Available slots:         1");
        assert_eq!(lines[1], "Can become unavailable:  1");
        assert!(lines[3].starts_with("REQUEST"), "{table}");
        assert!(
            lines[4].starts_with("team/r0   node-0   fw          Scheduled"),
            "{table}"
        );
        assert!(
            lines[5].contains("Waiting") && lines[5].contains("no free slot"),
            "{table}"
        );

        let empty = plan_from_yaml(
            "kind: Node\nmetadata: {name: n}\n",
            "maintenance-operator",
            jiff::Timestamp::now(),
        )
        .expect("valid input");
        let empty = render_table(&empty);
        assert!(empty.contains("No Pending requests"), "{empty}");
        assert!(empty.contains("no limit"), "{empty}");
    }

    #[test]
    fn a_node_group_that_cannot_fit_is_listed_with_its_cause() {
        let mut yaml = String::new();
        for i in 0..3 {
            yaml.push_str(&format!(
                "kind: Node\nmetadata: {{name: node-{i}}}\nstatus: {{conditions: [{{type: Ready, status: \"True\"}}]}}\n---\n\
                 kind: NodeMaintenance\nmetadata: {{name: r{i}, namespace: team, labels: {{maintenance.nvidia.com/group: rack-a}}}}\n\
                 spec: {{nodeName: node-{i}, requestorID: fw}}\n---\n"
            ));
        }
        yaml.push_str("kind: MaintenanceOperatorConfig\nmetadata: {name: default, namespace: maintenance-operator}\nspec: {maxParallelOperations: 2}\n");
        let report = plan_from_yaml(&yaml, "maintenance-operator", jiff::Timestamp::now())
            .expect("valid input");
        let table = render_table(&report);
        assert!(
            table.contains("Node groups:\n  team/rack-a: 3 pending, waiting (groupCannotFit)"),
            "{table}"
        );
        assert!(table.contains("1 fewer than the group has"), "{table}");
        let json = serde_json::to_value(&report.decision).expect("JSON");
        assert_eq!(json["waiting"][0]["cause"], "groupCannotFit");
        assert_eq!(json["nodeGroups"][0]["name"], "rack-a");
    }

    #[test]
    fn a_blackout_holds_every_request_at_the_time_asked_and_names_its_reason() {
        let yaml = r#"
kind: Node
metadata: {name: node-0}
status: {conditions: [{type: Ready, status: "True"}]}
---
kind: NodeMaintenance
metadata: {name: r0, namespace: team, creationTimestamp: "2026-11-01T00:00:00Z"}
spec: {nodeName: node-0, requestorID: fw}
---
kind: MaintenanceOperatorConfig
metadata: {name: default, namespace: maintenance-operator}
spec:
  maintenanceWindows: [{notBefore: "2026-11-20T00:00:00Z", notAfter: "2026-12-20T00:00:00Z"}]
  blackouts: [{start: "2026-11-26T00:00:00Z", end: "2026-11-30T00:00:00Z", reason: Black Friday}]
"#;
        let at = |t: &str| {
            plan_from_yaml(yaml, "maintenance-operator", t.parse().expect("a time"))
                .expect("valid input")
        };
        let held = at("2026-11-27T12:00:00Z");
        let waiting = &held.decision.waiting[0];
        assert_eq!(waiting.cause, WaitCause::Blackout);
        assert!(
            waiting.reason.contains("\"Black Friday\""),
            "{}",
            waiting.reason
        );
        let table = render_table(&held);
        assert!(
            table.contains(
                "Blackout:                \"Black Friday\" (blackouts[0]) until 2026-11-30T00:00:00Z"
            ),
            "{table}"
        );
        let json = serde_json::to_value(&held.decision).expect("JSON");
        assert_eq!(json["waiting"][0]["cause"], "blackout");
        assert_eq!(json["blackout"]["until"], "2026-11-30T00:00:00Z");
        // Before the absolute window, and after the blackout inside it.
        assert_eq!(
            at("2026-11-10T00:00:00Z").decision.waiting[0].cause,
            WaitCause::MaintenanceWindows
        );
        assert_eq!(at("2026-12-01T00:00:00Z").decision.scheduled.len(), 1);
        assert_eq!(
            at("2026-12-21T00:00:00Z").decision.waiting[0].cause,
            WaitCause::MaintenanceWindows
        );
    }

    #[test]
    fn a_plan_from_a_file_counts_a_gate_as_holding_and_says_it_asked_none() {
        let yaml = r#"
kind: Node
metadata: {name: node-0}
status: {conditions: [{type: Ready, status: "True"}]}
---
kind: NodeMaintenance
metadata: {name: r0, namespace: team, creationTimestamp: "2026-11-01T00:00:00Z"}
spec: {nodeName: node-0, requestorID: fw}
---
kind: MaintenanceOperatorConfig
metadata: {name: default, namespace: maintenance-operator}
spec:
  admission:
    gates: [{name: node-alerts, prometheus: {url: "http://prometheus:9090", query: ALERTS}}]
"#;
        let report = plan_from_yaml(yaml, "maintenance-operator", jiff::Timestamp::now())
            .expect("valid input");
        let waiting = &report.decision.waiting[0];
        assert_eq!(waiting.cause, WaitCause::Gate);
        assert!(
            waiting.reason.contains("alert gate \"node-alerts\""),
            "{}",
            waiting.reason
        );
        assert!(
            report
                .notes
                .iter()
                .any(|n| n.contains("asked no Prometheus")),
            "{:?}",
            report.notes
        );
        let json = serde_json::to_value(&report.decision).expect("JSON");
        assert_eq!(json["waiting"][0]["cause"], "gate");
        let table = render_table(&report);
        assert!(
            table.contains("Alert gate:              alert gate \"node-alerts\" holds every admission: not asked yet"),
            "{table}"
        );
    }
}
