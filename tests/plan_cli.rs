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
