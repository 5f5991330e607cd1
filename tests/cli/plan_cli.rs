//! `maintenance-operator plan --from-file` as a user runs it: the built binary, a file, stdout/stderr.

use std::io::Write;
use std::process::{Command, Output};

const NODES_AND_REQUESTS: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: node-a
  status:
    conditions:
    - type: Ready
      status: "True"
      lastTransitionTime: "2025-01-01T00:00:00Z"
- apiVersion: v1
  kind: Node
  metadata:
    name: node-b
  status:
    conditions:
    - type: Ready
      status: "True"
      lastTransitionTime: "2025-01-01T00:00:00Z"
- apiVersion: maintenance.nvidia.com/v1alpha1
  kind: NodeMaintenance
  metadata:
    name: first
    namespace: team
    creationTimestamp: "2025-01-01T00:00:00Z"
  spec:
    requestorID: fw.example.com
    nodeName: node-a
- apiVersion: maintenance.nvidia.com/v1alpha1
  kind: NodeMaintenance
  metadata:
    name: second
    namespace: team
    creationTimestamp: "2025-01-01T00:01:00Z"
  spec:
    requestorID: fw.example.com
    nodeName: node-b
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: unrelated
---
apiVersion: maintenance.nvidia.com/v1alpha1
kind: MaintenanceOperatorConfig
metadata:
  name: default
  namespace: maintenance-operator
spec:
  maxParallelOperations: 1
  maxUnavailable: "50%"
"#;

fn plan_from(yaml: &str, extra_args: &[&str]) -> Output {
    let mut file = tempfile::NamedTempFile::new().expect("create a temporary file");
    file.write_all(yaml.as_bytes()).expect("write the input");
    Command::new(env!("CARGO_BIN_EXE_maintenance-operator"))
        .arg("plan")
        .arg("--from-file")
        .arg(file.path())
        .args(extra_args)
        .env_remove("OPERATOR_NAMESPACE")
        .output()
        .expect("run maintenance-operator")
}

#[test]
fn json_output_is_one_object_with_the_decision() {
    let output = plan_from(NODES_AND_REQUESTS, &["-o", "json"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "stderr: {stderr}");
    let json: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("stdout is exactly one JSON value");
    assert_eq!(
        json,
        serde_json::json!({
            "availableSlots": 1,
            "canBecomeUnavailable": 1,
            "scheduled": ["team/first"],
            "waiting": [{
                "name": "team/second",
                "reason": "no free slot: maxParallelOperations=1 and 0 nodes are in maintenance, 1 more admitted in this round",
                "cause": "maxParallelOperations",
            }],
        })
    );
    assert!(
        stderr.contains("document 2 (kind ConfigMap, name unrelated): ignored"),
        "stderr: {stderr}"
    );
}

#[test]
fn table_output_is_the_default() {
    let output = plan_from(NODES_AND_REQUESTS, &[]);
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.starts_with("Available slots:         1\n"),
        "{stdout}"
    );
    assert!(stdout.contains("team/first"), "{stdout}");
    assert!(stdout.contains("no free slot"), "{stdout}");
}

#[test]
fn the_namespace_flag_selects_the_config() {
    // The config lives in maintenance-operator; elsewhere the defaults apply (no maxUnavailable).
    let output = plan_from(NODES_AND_REQUESTS, &["-o", "json", "--namespace", "other"]);
    assert!(output.status.success());
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(json["canBecomeUnavailable"], serde_json::Value::Null);
    assert!(String::from_utf8_lossy(&output.stderr).contains("namespace maintenance-operator"));
}

#[test]
fn a_bad_document_fails_and_is_named() {
    let bad = "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-a\n---\n\
               apiVersion: maintenance.nvidia.com/v1alpha1\nkind: NodeMaintenance\n\
               metadata:\n  name: foo\n  namespace: team\nspec:\n  requestorID: fw\n";
    let output = plan_from(bad, &["-o", "json"]);
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "nothing on stdout on error");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("document 2 (kind NodeMaintenance, name foo): missing field spec.nodeName"),
        "stderr: {stderr}"
    );
}

#[test]
fn a_missing_file_fails_with_its_name() {
    let output = Command::new(env!("CARGO_BIN_EXE_maintenance-operator"))
        .args(["plan", "--from-file", "no-such-plan-input.yaml"])
        .output()
        .expect("run maintenance-operator");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("no-such-plan-input.yaml"));
}

/// Two zones with one node each, a request on each, "one zone at a time" and a nightly window
/// in Berlin for zone b.
const ZONES: &str = r#"
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: a}}
status: {conditions: [{type: Ready, status: "True"}]}
---
kind: Node
metadata: {name: node-b, labels: {topology.kubernetes.io/zone: b}}
status: {conditions: [{type: Ready, status: "True"}]}
---
kind: NodeMaintenance
metadata: {name: on-a, namespace: team, creationTimestamp: "2026-01-15T00:00:00Z"}
spec: {nodeName: node-a, requestorID: fw.example.com}
---
kind: NodeMaintenance
metadata: {name: on-b, namespace: team, creationTimestamp: "2026-01-15T00:00:01Z"}
spec: {nodeName: node-b, requestorID: fw.example.com}
---
kind: MaintenanceOperatorConfig
metadata: {name: default, namespace: maintenance-operator}
spec:
  maxParallelOperations: 10
  budgets:
  - name: zones
    groupByLabel: topology.kubernetes.io/zone
    maxUnavailableGroups: 1
  - name: zone-b-nights
    nodeSelector: {matchLabels: {topology.kubernetes.io/zone: b}}
    maintenanceWindows: [{schedule: "0 1 * * *", duration: 3h, timeZone: Europe/Berlin}]
"#;

#[test]
fn plan_names_the_budget_and_the_next_window_at_a_given_time() {
    // Noon in Berlin: zone b's window is closed.
    let noon = ["--at", "2026-01-15T12:00:00+01:00"];
    let output = plan_from(ZONES, &[&["-o", "json"][..], &noon[..]].concat());
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(json["scheduled"], serde_json::json!(["team/on-a"]));
    assert_eq!(
        json["waiting"][0],
        serde_json::json!({
            "name": "team/on-b",
            "reason": "outside the maintenance windows of budget zone-b-nights: the next opens at 2026-01-16 01:00 CET (Europe/Berlin)",
            "cause": "maintenanceWindows",
            "budget": "zone-b-nights",
        })
    );
    assert_eq!(
        json["budgets"][0]["groups"][1],
        serde_json::json!({"group": "b", "nodes": 1, "inMaintenance": 0, "unavailable": 0})
    );
    assert_eq!(
        json["budgets"][1]["maintenanceWindows"],
        serde_json::json!({"open": false, "nextOpening": "2026-01-16T01:00:00+01:00[Europe/Berlin]"})
    );

    // At night the window is open, and "one zone at a time" holds zone b back instead.
    let night = ["--at", "2026-01-16T01:30:00+01:00"];
    let output = plan_from(ZONES, &night);
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        table.contains("zones           topology.kubernetes.io/zone=b   1"),
        "{table}"
    );
    assert!(
        table.contains(
            "Budget zones: 0 of at most 1 groups with unavailable nodes (maxUnavailableGroups)"
        ),
        "{table}"
    );
    assert!(
        table.contains("Budget zone-b-nights: maintenance windows open"),
        "{table}"
    );
    assert!(
        table.contains("maxUnavailableGroups of budget zones reached: node node-b is in topology.kubernetes.io/zone=b"),
        "{table}"
    );
}
