//! Bad input on a live control plane: NodeMaintenance and MaintenanceOperatorConfig manifests
//! sent as raw JSON or YAML (so that wrong types reach the API server), each with what the API
//! server must answer and what its refusal must say. Afterwards the shared operator is still
//! ready and still brings a valid request to Ready.
//!
//! Every refusal here comes from the CRD schema and its CEL rules: the shared operator runs
//! without the admission webhook (`--webhook-addr`), so nothing here depends on it.
//!
//! `PATH="$(tests/testbed/testbed bin-dir):$PATH" cargo test --test e2e bad_input::`

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use maintenance_crds::{MaintenanceOperatorConfig, NodeMaintenance, Phase};
use serde_json::{Value, json};
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(60);
const REQUESTOR: &str = "bad-input.example.com";
const API_VERSION: &str = "maintenance.nvidia.com/v1alpha1";
/// No node of the testbed has this name: accepted requests on it wait Pending ("not found"),
/// and nothing of the cluster is cordoned by them.
const MISSING_NODE: &str = "bad-input-missing-node";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Request,
    Config,
}

impl Kind {
    fn plural(self) -> &'static str {
        match self {
            Kind::Request => "nodemaintenances",
            Kind::Config => "maintenanceoperatorconfigs",
        }
    }
}

/// What goes over the wire.
enum Payload {
    Json(Value),
    /// Sent as `application/yaml`.
    Yaml(String),
    /// Sent as `application/json` byte for byte (duplicate keys, truncated documents).
    RawJson(String),
}

/// Looks at an accepted object as stored, with the API server's warnings.
type Inspect = fn(&Value, &[String]) -> Result<()>;

enum Expect {
    /// Refused with this HTTP status and a message holding every needle.
    Refused(u16, &'static [&'static str]),
    /// Stored; the check (if any) looks at the stored object and the API server's warnings.
    Accepted(Option<Inspect>),
}

struct Case {
    name: String,
    kind: Kind,
    payload: Payload,
    /// `?fieldValidation=Strict` (unknown and duplicate fields refused instead of dropped).
    strict: bool,
    /// After an accepted create: this merge patch, and what the API server must answer to it.
    update: Option<(Value, Expect)>,
    expect: Expect,
}

fn case(name: &str, kind: Kind, payload: Payload, expect: Expect) -> Case {
    Case {
        name: name.to_string(),
        kind,
        payload,
        strict: false,
        update: None,
        expect,
    }
}

fn refused(needles: &'static [&'static str]) -> Expect {
    Expect::Refused(422, needles)
}

/// A NodeMaintenance whose `spec` is `spec` merged into a valid one (null removes a field).
fn request(name: &str, spec: Value) -> Value {
    let mut base = json!({"requestorID": REQUESTOR, "nodeName": MISSING_NODE});
    merge(&mut base, spec);
    json!({"apiVersion": API_VERSION, "kind": "NodeMaintenance", "metadata": {"name": name}, "spec": base})
}

/// A MaintenanceOperatorConfig with this spec.
fn config(name: &str, spec: Value) -> Value {
    json!({"apiVersion": API_VERSION, "kind": "MaintenanceOperatorConfig", "metadata": {"name": name}, "spec": spec})
}

fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    base.remove(&key);
                } else {
                    merge(base.entry(key).or_insert(Value::Null), value);
                }
            }
        }
        (base, patch) => *base = patch,
    }
}

fn window(schedule: &str, duration: &str, time_zone: Option<&str>) -> Value {
    let mut w = json!({"schedule": schedule, "duration": duration});
    if let Some(tz) = time_zone {
        w["timeZone"] = json!(tz);
    }
    w
}

fn budget_with_window(w: Value) -> Value {
    json!({"budgets": [{"name": "w", "maintenanceWindows": [w]}]})
}

fn stored_spec_lacks_foo(stored: &Value, warnings: &[String]) -> Result<()> {
    ensure!(
        stored["spec"].get("foo").is_none(),
        "the unknown field was stored: {}",
        stored["spec"]
    );
    ensure!(
        warnings
            .iter()
            .any(|w| w.contains("unknown field") && w.contains("spec.foo")),
        "no warning about the dropped field: {warnings:?}"
    );
    Ok(())
}

fn last_duplicate_wins(stored: &Value, warnings: &[String]) -> Result<()> {
    ensure!(
        stored["spec"]["nodeName"] == json!(MISSING_NODE),
        "{}",
        stored["spec"]
    );
    ensure!(
        warnings.iter().any(|w| w.contains("duplicate field")),
        "no warning about the duplicate field: {warnings:?}"
    );
    Ok(())
}

fn thousands_of_requestors_kept(stored: &Value, _: &[String]) -> Result<()> {
    let n = stored["spec"]["additionalRequestors"]
        .as_array()
        .map_or(0, Vec::len);
    ensure!(
        n == ADDITIONAL_REQUESTORS,
        "stored {n} additionalRequestors"
    );
    Ok(())
}

fn unicode_annotation_kept(stored: &Value, _: &[String]) -> Result<()> {
    ensure!(
        stored["metadata"]["annotations"]["note"] == json!(UNICODE),
        "{}",
        stored["metadata"]
    );
    Ok(())
}

const UNICODE: &str = "Wartung ü 维护 🛠️ — ok";
const ADDITIONAL_REQUESTORS: usize = 5000;

fn cases() -> Vec<Case> {
    use Kind::{Config, Request};
    use Payload::{Json, RawJson, Yaml};
    let long_253 = {
        // DNS subdomain of exactly 253 characters: labels of 63 joined by dots.
        let label = "a".repeat(63);
        let name = format!("{label}.{label}.{label}.{}", "b".repeat(61));
        assert_eq!(name.len(), 253);
        name
    };
    let mut cases = vec![
        // Wrong types.
        case(
            "nm-timeout-string",
            Request,
            Json(request("x", json!({"drainSpec": {"timeoutSeconds": "30"}}))),
            refused(&["spec.drainSpec.timeoutSeconds", "must be of type integer"]),
        ),
        case(
            "nm-cordon-string",
            Request,
            Json(request("x", json!({"cordon": "yes"}))),
            refused(&["spec.cordon", "must be of type boolean"]),
        ),
        case(
            "nm-yaml-timeout-word",
            Request,
            Yaml(format!(
                "apiVersion: {API_VERSION}\nkind: NodeMaintenance\nmetadata:\n  name: x\nspec:\n  \
                 requestorID: {REQUESTOR}\n  nodeName: {MISSING_NODE}\n  waitForPodCompletion:\n    \
                 timeoutSeconds: thirty\n"
            )),
            refused(&[
                "spec.waitForPodCompletion.timeoutSeconds",
                "must be of type integer",
            ]),
        ),
        case(
            "nm-additional-requestors-string",
            Request,
            Json(request(
                "x",
                json!({"additionalRequestors": "a.example.com"}),
            )),
            refused(&["spec.additionalRequestors", "must be of type array"]),
        ),
        case(
            "nm-filters-object",
            Request,
            Json(request(
                "x",
                json!({"drainSpec": {"podEvictionFilters": {"byResourceNameRegex": "gpu"}}}),
            )),
            refused(&["spec.drainSpec.podEvictionFilters", "must be of type array"]),
        ),
        case(
            "nm-spec-list",
            Request,
            Json(
                json!({"apiVersion": API_VERSION, "kind": "NodeMaintenance", "metadata": {"name": "x"}, "spec": []}),
            ),
            refused(&["spec", "must be of type object"]),
        ),
        // Out of range, and integers beyond int32.
        case(
            "nm-drain-timeout-negative",
            Request,
            Json(request("x", json!({"drainSpec": {"timeoutSeconds": -5}}))),
            refused(&[
                "spec.drainSpec.timeoutSeconds",
                "should be greater than or equal to 0",
            ]),
        ),
        case(
            "nm-wait-timeout-negative",
            Request,
            Json(request(
                "x",
                json!({"waitForPodCompletion": {"timeoutSeconds": -1}}),
            )),
            refused(&[
                "spec.waitForPodCompletion.timeoutSeconds",
                "should be greater than or equal to 0",
            ]),
        ),
        case(
            "nm-force-delete-zero",
            Request,
            Json(request(
                "x",
                json!({"drainSpec": {"forceDeleteAfterSeconds": 0}}),
            )),
            refused(&[
                "spec.drainSpec.forceDeleteAfterSeconds",
                "should be greater than or equal to 1",
            ]),
        ),
        case(
            "nm-timeout-int32-overflow",
            Request,
            Json(request(
                "x",
                json!({"drainSpec": {"timeoutSeconds": 2_147_483_648_i64}}),
            )),
            refused(&["spec.drainSpec.timeoutSeconds", "format int32"]),
        ),
        case(
            "nm-timeout-beyond-int64",
            Request,
            RawJson(format!(
                r#"{{"apiVersion":"{API_VERSION}","kind":"NodeMaintenance","metadata":{{"name":"x"}},"spec":{{"requestorID":"{REQUESTOR}","nodeName":"{MISSING_NODE}","drainSpec":{{"timeoutSeconds":99999999999999999999999}}}}}}"#
            )),
            refused(&["spec.drainSpec.timeoutSeconds", "int32"]),
        ),
        case(
            "nm-timeout-fraction",
            Request,
            Json(request("x", json!({"drainSpec": {"timeoutSeconds": 1.5}}))),
            refused(&["spec.drainSpec.timeoutSeconds", "int32"]),
        ),
        // Missing required fields.
        case(
            "nm-missing-requestor",
            Request,
            Json(request("x", json!({"requestorID": null}))),
            refused(&["spec.requestorID", "Required value"]),
        ),
        case(
            "nm-missing-node",
            Request,
            Json(request("x", json!({"nodeName": null}))),
            refused(&["spec.nodeName", "Required value"]),
        ),
        case(
            "nm-missing-spec",
            Request,
            Json(
                json!({"apiVersion": API_VERSION, "kind": "NodeMaintenance", "metadata": {"name": "x"}}),
            ),
            refused(&["spec", "Required value"]),
        ),
        case(
            "nm-empty-node",
            Request,
            Json(request("x", json!({"nodeName": ""}))),
            refused(&["spec.nodeName", "should be at least 1 chars long"]),
        ),
        // requestorID: length and pattern.
        case(
            "nm-requestor-one-char",
            Request,
            Json(request("x", json!({"requestorID": "x"}))),
            refused(&["spec.requestorID", "should be at least 2 chars long"]),
        ),
        case(
            "nm-requestor-64-chars",
            Request,
            Json(request("x", json!({"requestorID": "r".repeat(64)}))),
            refused(&["spec.requestorID", "Too long", "63"]),
        ),
        case(
            "nm-requestor-underscore",
            Request,
            Json(request(
                "x",
                json!({"requestorID": "bad_input.example.com"}),
            )),
            refused(&["spec.requestorID", "should match"]),
        ),
        case(
            "nm-requestor-double-dot",
            Request,
            Json(request("x", json!({"requestorID": "a..example.com"}))),
            refused(&["spec.requestorID", "should match"]),
        ),
        case(
            "nm-requestor-unicode",
            Request,
            Json(request("x", json!({"requestorID": "über.example.com"}))),
            refused(&["spec.requestorID", "should match"]),
        ),
        case(
            "nm-additional-requestors-duplicate",
            Request,
            Json(request(
                "x",
                json!({"additionalRequestors": ["a.example.com", "a.example.com"]}),
            )),
            refused(&["spec.additionalRequestors[1]", "Duplicate value"]),
        ),
        // Unknown and duplicate fields: dropped with a warning by default, refused when strict.
        case(
            "nm-unknown-field",
            Request,
            Json(request("nm-unknown-field", json!({"foo": 1}))),
            Expect::Accepted(Some(stored_spec_lacks_foo)),
        ),
        Case {
            strict: true,
            ..case(
                "nm-unknown-field-strict",
                Request,
                Json(request("x", json!({"foo": 1}))),
                Expect::Refused(
                    400,
                    &["strict decoding error", "unknown field \"spec.foo\""],
                ),
            )
        },
        case(
            "nm-duplicate-field",
            Request,
            RawJson(format!(
                r#"{{"apiVersion":"{API_VERSION}","kind":"NodeMaintenance","metadata":{{"name":"nm-duplicate-field"}},"spec":{{"requestorID":"{REQUESTOR}","nodeName":"elsewhere","nodeName":"{MISSING_NODE}"}}}}"#
            )),
            Expect::Accepted(Some(last_duplicate_wins)),
        ),
        Case {
            strict: true,
            ..case(
                "nm-duplicate-field-strict",
                Request,
                RawJson(format!(
                    r#"{{"apiVersion":"{API_VERSION}","kind":"NodeMaintenance","metadata":{{"name":"x"}},"spec":{{"requestorID":"{REQUESTOR}","nodeName":"elsewhere","nodeName":"{MISSING_NODE}"}}}}"#
                )),
                Expect::Refused(
                    400,
                    &["strict decoding error", "duplicate field \"spec.nodeName\""],
                ),
            )
        },
        case(
            "nm-truncated-json",
            Request,
            RawJson(format!(
                r#"{{"apiVersion":"{API_VERSION}","kind":"NodeMaintenance","metadata":{{"name":"x"}},"spec":{{"nodeName":"#
            )),
            Expect::Refused(400, &[]),
        ),
        // Names, labels, annotations.
        case(
            "nm-name-253-chars",
            Request,
            Json(request(&long_253, json!({}))),
            Expect::Accepted(None),
        ),
        case(
            "nm-name-254-chars",
            Request,
            Json(request(&format!("{long_253}c"), json!({}))),
            refused(&["metadata.name", "must be no more than 253 characters"]),
        ),
        case(
            "nm-name-uppercase",
            Request,
            Json(request("Bad_Name", json!({}))),
            refused(&["metadata.name", "RFC 1123 subdomain"]),
        ),
        case(
            "nm-label-unicode",
            Request,
            Json({
                let mut r = request("x", json!({}));
                r["metadata"]["labels"] = json!({"team": "grün"});
                r
            }),
            refused(&["metadata.labels", "a valid label must be"]),
        ),
        case(
            "nm-annotation-unicode",
            Request,
            Json({
                let mut r = request("nm-annotation-unicode", json!({}));
                r["metadata"]["annotations"] = json!({"note": UNICODE});
                r
            }),
            Expect::Accepted(Some(unicode_annotation_kept)),
        ),
        case(
            "nm-node-unicode",
            Request,
            Json(request("nm-node-unicode", json!({"nodeName": "nœud-ü"}))),
            Expect::Accepted(None),
        ),
        // Huge values.
        case(
            "nm-node-40k-chars",
            Request,
            Json(request(
                "nm-node-40k-chars",
                json!({"nodeName": "n".repeat(40_000)}),
            )),
            Expect::Accepted(None),
        ),
        case(
            "nm-annotation-300k",
            Request,
            Json({
                let mut r = request("x", json!({}));
                r["metadata"]["annotations"] = json!({"big": "x".repeat(300 * 1024)});
                r
            }),
            refused(&["metadata.annotations", "Too long", "262144"]),
        ),
        case(
            "nm-body-10mb",
            Request,
            Json(request(
                "x",
                json!({"drainSpec": {"podSelector": "x".repeat(10 << 20)}}),
            )),
            Expect::Refused(413, &["too large"]),
        ),
        case(
            "nm-additional-requestors-thousands",
            Request,
            Json(request(
                "nm-additional-requestors-thousands",
                json!({"additionalRequestors": (0..ADDITIONAL_REQUESTORS)
                    .map(|i| format!("requestor-{i}.example.com"))
                    .collect::<Vec<_>>()}),
            )),
            Expect::Accepted(Some(thousands_of_requestors_kept)),
        ),
        // Immutability (CEL `self == oldSelf`), and a mutable field for contrast.
        Case {
            update: Some((
                json!({"spec": {"requestorID": "other.example.com"}}),
                refused(&[
                    "spec.requestorID",
                    "requestorID is immutable: create a new NodeMaintenance instead",
                ]),
            )),
            ..case(
                "nm-requestor-immutable",
                Request,
                Json(request("nm-requestor-immutable", json!({}))),
                Expect::Accepted(None),
            )
        },
        Case {
            update: Some((
                json!({"spec": {"nodeName": "another-node"}}),
                refused(&[
                    "spec.nodeName",
                    "nodeName is immutable: create a new NodeMaintenance instead",
                ]),
            )),
            ..case(
                "nm-node-immutable",
                Request,
                Json(request("nm-node-immutable", json!({}))),
                Expect::Accepted(None),
            )
        },
        Case {
            update: Some((
                json!({"spec": {"additionalRequestors": ["late.example.com"], "cordon": false}}),
                Expect::Accepted(None),
            )),
            ..case(
                "nm-mutable-fields",
                Request,
                Json(request("nm-mutable-fields", json!({}))),
                Expect::Accepted(None),
            )
        },
        // MaintenanceOperatorConfig: int-or-percent limits.
        case(
            "cfg-parallel-abc-percent",
            Config,
            Json(config("x", json!({"maxParallelOperations": "abc%"}))),
            refused(&[
                "spec.maxParallelOperations",
                "a percentage between 0% and 100%",
            ]),
        ),
        case(
            "cfg-parallel-150-percent",
            Config,
            Json(config("x", json!({"maxParallelOperations": "150%"}))),
            refused(&[
                "spec.maxParallelOperations",
                "a percentage between 0% and 100%",
            ]),
        ),
        case(
            "cfg-parallel-negative",
            Config,
            Json(config("x", json!({"maxParallelOperations": -1}))),
            refused(&["spec.maxParallelOperations", "non-negative integer"]),
        ),
        case(
            "cfg-unavailable-negative-percent",
            Config,
            Json(config("x", json!({"maxUnavailable": "-5%"}))),
            refused(&["spec.maxUnavailable", "a percentage between 0% and 100%"]),
        ),
        case(
            "cfg-unavailable-number-as-string",
            Config,
            Json(config("x", json!({"maxUnavailable": "5"}))),
            refused(&["spec.maxUnavailable", "a percentage between 0% and 100%"]),
        ),
        case(
            "cfg-parallel-bool",
            Config,
            Json(config("x", json!({"maxParallelOperations": true}))),
            refused(&["spec.maxParallelOperations", "must be of type"]),
        ),
        // An int-or-percent limit has no int32 format (it is int-or-string), so the CEL rule bounds
        // it: 2^32 would be stored, and the operator, which reads it as an int32, could not decode
        // the config and would never become ready.
        case(
            "cfg-parallel-int32-overflow",
            Config,
            Json(config(
                "x",
                json!({"maxParallelOperations": 4_294_967_296_i64}),
            )),
            refused(&["spec.maxParallelOperations", "at most 2147483647"]),
        ),
        case(
            "cfg-unavailable-int32-overflow",
            Config,
            Json(config("x", json!({"maxUnavailable": 2_147_483_648_i64}))),
            refused(&["spec.maxUnavailable", "at most 2147483647"]),
        ),
        // Other ranges, enums, types.
        case(
            "cfg-max-time-negative",
            Config,
            Json(config("x", json!({"maxNodeMaintenanceTimeSeconds": -1}))),
            refused(&[
                "spec.maxNodeMaintenanceTimeSeconds",
                "should be greater than or equal to 0",
            ]),
        ),
        case(
            "cfg-evictions-per-second-zero",
            Config,
            Json(config("x", json!({"evictionsPerSecond": 0}))),
            refused(&[
                "spec.evictionsPerSecond",
                "should be greater than or equal to 1",
            ]),
        ),
        case(
            "cfg-eviction-burst-overflow",
            Config,
            Json(config("x", json!({"evictionBurst": 2_147_483_648_i64}))),
            refused(&["spec.evictionBurst", "format int32"]),
        ),
        case(
            "cfg-log-level-verbose",
            Config,
            Json(config("x", json!({"logLevel": "verbose"}))),
            refused(&["spec.logLevel", "Unsupported value", "\"debug\""]),
        ),
        case(
            "cfg-admission-string",
            Config,
            Json(config(
                "x",
                json!({"admission": {"preferDrainable": "true"}}),
            )),
            refused(&["spec.admission.preferDrainable", "must be of type boolean"]),
        ),
        // Budgets.
        case(
            "cfg-budget-duplicate-names",
            Config,
            Json(config(
                "x",
                json!({"budgets": [{"name": "zones", "maxParallelOperations": 1}, {"name": "zones", "maxUnavailable": 2}]}),
            )),
            refused(&["spec.budgets[1]", "Duplicate value"]),
        ),
        case(
            "cfg-budget-without-name",
            Config,
            Json(config(
                "x",
                json!({"budgets": [{"maxParallelOperations": 1}]}),
            )),
            refused(&["spec.budgets[0].name", "Required value"]),
        ),
        case(
            "cfg-budget-33",
            Config,
            Json(config(
                "x",
                json!({"budgets": (0..33).map(|i| json!({"name": format!("b{i}")})).collect::<Vec<_>>()}),
            )),
            refused(&["spec.budgets", "must have at most 32 items"]),
        ),
        case(
            "cfg-budget-percent-too-long",
            Config,
            Json(config(
                "x",
                json!({"budgets": [{"name": "p", "maxParallelOperations": "1000%"}]}),
            )),
            refused(&["spec.budgets[0].maxParallelOperations", "Too long"]),
        ),
        case(
            "cfg-budget-groups-without-label",
            Config,
            Json(config(
                "x",
                json!({"budgets": [{"name": "g", "maxGroupsInMaintenance": 1}]}),
            )),
            refused(&["spec.budgets[0]", "set groupByLabel too"]),
        ),
        case(
            "cfg-budget-group-label-space",
            Config,
            Json(config(
                "x",
                json!({"budgets": [{"name": "g", "groupByLabel": "my zone"}]}),
            )),
            refused(&["spec.budgets[0].groupByLabel", "should match"]),
        ),
        // Windows: cron, durations, time zones.
        case(
            "cfg-window-cron-words",
            Config,
            Json(config(
                "x",
                budget_with_window(window("every night", "1h", None)),
            )),
            refused(&[
                "spec.budgets[0].maintenanceWindows[0].schedule",
                "should match",
            ]),
        ),
        case(
            "cfg-window-cron-six-fields",
            Config,
            Json(config(
                "x",
                json!({"maintenanceWindows": [window("0 0 1 * * *", "1h", None)]}),
            )),
            refused(&["spec.maintenanceWindows[0].schedule", "should match"]),
        ),
        case(
            "cfg-window-zero-duration",
            Config,
            Json(config(
                "x",
                json!({"maintenanceWindows": [window("0 1 * * *", "0m", None)]}),
            )),
            refused(&[
                "spec.maintenanceWindows[0].duration",
                "must be longer than zero",
            ]),
        ),
        case(
            "cfg-window-duration-words",
            Config,
            Json(config(
                "x",
                json!({"maintenanceWindows": [window("0 1 * * *", "2 hours", None)]}),
            )),
            refused(&["spec.maintenanceWindows[0].duration", "should match"]),
        ),
        case(
            "cfg-window-no-duration",
            Config,
            Json(config(
                "x",
                json!({"maintenanceWindows": [{"schedule": "@daily"}]}),
            )),
            refused(&[
                "spec.maintenanceWindows[0]",
                "set schedule and duration (a recurring window), or notBefore and notAfter",
            ]),
        ),
        case(
            "cfg-window-bounds-reversed",
            Config,
            Json(config(
                "x",
                json!({"maintenanceWindows": [{"notBefore": "2026-12-12T06:00:00Z", "notAfter": "2026-12-12T02:00:00Z"}]}),
            )),
            refused(&[
                "spec.maintenanceWindows[0]",
                "notAfter must be after notBefore",
            ]),
        ),
        case(
            "cfg-blackout-reversed",
            Config,
            Json(config(
                "x",
                json!({"blackouts": [{"start": "2026-12-12T06:00:00Z", "end": "2026-12-12T02:00:00Z", "reason": "freeze"}]}),
            )),
            refused(&["spec.blackouts[0]", "end must be after start"]),
        ),
        case(
            "cfg-blackout-no-reason",
            Config,
            Json(config(
                "x",
                json!({"blackouts": [{"start": "2026-12-12T02:00:00Z", "end": "2026-12-12T06:00:00Z"}]}),
            )),
            refused(&["spec.blackouts[0].reason", "Required value"]),
        ),
        case(
            "cfg-window-zone-space",
            Config,
            Json(config(
                "x",
                json!({"maintenanceWindows": [window("0 1 * * *", "1h", Some("Europe Berlin"))]}),
            )),
            refused(&["spec.maintenanceWindows[0].timeZone", "should match"]),
        ),
        case(
            "cfg-windows-17",
            Config,
            Json(config(
                "x",
                json!({"maintenanceWindows": (0..17).map(|_| window("@daily", "1h", None)).collect::<Vec<_>>()}),
            )),
            refused(&["spec.maintenanceWindows", "must have at most 16 items"]),
        ),
        // Shaped right, but only the operator can tell that they mean nothing: the API server
        // takes them (README: "A schedule or time zone the operator cannot use stops admission
        // with an error in its log naming the field").
        case(
            "cfg-window-cron-out-of-range",
            Config,
            Json(config(
                "cfg-window-cron-out-of-range",
                json!({"maintenanceWindows": [window("99 99 * * *", "1h", None)]}),
            )),
            Expect::Accepted(None),
        ),
        case(
            "cfg-window-unknown-zone",
            Config,
            Json(config(
                "cfg-window-unknown-zone",
                json!({"maintenanceWindows": [window("0 1 * * *", "1h", Some("Mars/Olympus_Mons"))]}),
            )),
            Expect::Accepted(None),
        ),
        // Unknown fields in a config.
        case(
            "cfg-unknown-field",
            Config,
            Json(config(
                "cfg-unknown-field",
                json!({"foo": "bar", "maxParallelOperations": 2}),
            )),
            Expect::Accepted(Some(stored_spec_lacks_foo)),
        ),
        Case {
            strict: true,
            ..case(
                "cfg-unknown-field-strict",
                Config,
                Yaml(format!(
                    "apiVersion: {API_VERSION}\nkind: MaintenanceOperatorConfig\nmetadata:\n  name: x\nspec:\n  foo: bar\n"
                )),
                Expect::Refused(
                    400,
                    &["strict decoding error", "unknown field \"spec.foo\""],
                ),
            )
        },
        // The config `default` in a namespace other than the operator's: stored, and (checked
        // below) ignored; if the operator read it, nothing would be admitted any more.
        case(
            "cfg-default-elsewhere",
            Config,
            Json(config(
                "default",
                json!({"maxParallelOperations": 0, "maintenanceWindows": [window("0 0 30 2 *", "1s", None)]}),
            )),
            Expect::Accepted(None),
        ),
    ];
    // Every refused case but the truncated document names the object as `x`; give each its own.
    for c in &mut cases {
        if let Payload::Json(v) = &mut c.payload
            && v["metadata"]["name"] == "x"
        {
            v["metadata"]["name"] = json!(c.name);
        }
    }
    cases
}

/// The API server's answer to a raw create.
struct Answer {
    code: u16,
    /// The object as stored, or the Status of a refusal.
    body: Value,
    /// `Warning` headers (dropped or duplicate fields).
    warnings: Vec<String>,
}

impl Answer {
    fn message(&self) -> String {
        self.body["message"]
            .as_str()
            .map_or_else(|| self.body.to_string(), str::to_string)
    }
}

async fn create_raw(
    client: &Client,
    ns: &str,
    kind: Kind,
    payload: &Payload,
    strict: bool,
) -> Result<Answer> {
    let path = format!(
        "/apis/maintenance.nvidia.com/v1alpha1/namespaces/{ns}/{}",
        kind.plural()
    );
    let (bytes, content_type) = match payload {
        Payload::Json(v) => (serde_json::to_vec(v)?, "application/json"),
        Payload::Yaml(text) => (text.clone().into_bytes(), "application/yaml"),
        Payload::RawJson(text) => (text.clone().into_bytes(), "application/json"),
    };
    let mut req = kube::core::Request::new(path).create(&PostParams::default(), bytes)?;
    if strict {
        let uri = req.uri().to_string();
        let sep = if uri.ends_with('?') { "" } else { "&" };
        *req.uri_mut() = format!("{uri}{sep}fieldValidation=Strict").parse()?;
    }
    req.headers_mut()
        .insert("content-type", content_type.parse()?);
    let response = client.send(req.map(kube::client::Body::from)).await?;
    let code = response.status().as_u16();
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|w| String::from_utf8_lossy(w.as_bytes()).into_owned())
        .collect();
    let bytes = response.into_body().collect_bytes().await?;
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    Ok(Answer {
        code,
        body,
        warnings,
    })
}

fn check(case: &str, expect: &Expect, answer: &Answer) -> Result<()> {
    match expect {
        Expect::Refused(code, needles) => {
            let message = answer.message();
            ensure!(
                answer.code == *code,
                "{case}: want {code}, got {}: {message}",
                answer.code
            );
            let missing: Vec<&&str> = needles.iter().filter(|n| !message.contains(**n)).collect();
            ensure!(
                missing.is_empty(),
                "{case}: the refusal does not say {missing:?}: {message}"
            );
            ensure!(!message.trim().is_empty(), "{case}: empty refusal");
        }
        Expect::Accepted(inspect) => {
            ensure!(
                answer.code == 201 || answer.code == 200,
                "{case}: want accepted, got {}: {}",
                answer.code,
                answer.message()
            );
            if let Some(inspect) = inspect {
                inspect(&answer.body, &answer.warnings).with_context(|| case.to_string())?;
            }
        }
    }
    Ok(())
}

async fn update(
    client: &Client,
    ns: &str,
    kind: Kind,
    name: &str,
    patch: &Value,
) -> Result<Answer> {
    let resource = match kind {
        Kind::Request => ApiResource::erase::<NodeMaintenance>(&()),
        Kind::Config => ApiResource::erase::<MaintenanceOperatorConfig>(&()),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(object) => Ok(Answer {
            code: 200,
            body: serde_json::to_value(object)?,
            warnings: Vec::new(),
        }),
        Err(kube::Error::Api(status)) => Ok(Answer {
            code: status.code,
            body: json!({"message": status.message}),
            warnings: Vec::new(),
        }),
        Err(other) => Err(other.into()),
    }
}

#[tokio::test]
async fn bad_input_is_refused_with_what_to_fix_and_the_operator_carries_on() -> Result<()> {
    let shared = shared_cluster().await?;
    let (client, ns, nodes) = isolated_setup("bad-input", 1).await?;
    let cases = cases();
    ensure!(cases.len() >= 30, "only {} cases", cases.len());
    let names: std::collections::BTreeSet<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    ensure!(names.len() == cases.len(), "two cases share a name");

    let mut failures = Vec::new();
    let mut accepted_requests = Vec::new();
    let mut timings = Vec::new();
    for c in &cases {
        let started = Instant::now();
        let answer = create_raw(&client, &ns, c.kind, &c.payload, c.strict)
            .await
            .with_context(|| format!("{}: sending", c.name))?;
        timings.push((c.name.clone(), started.elapsed(), answer.code));
        if let Err(e) = check(&c.name, &c.expect, &answer) {
            failures.push(format!("{e:#}"));
            continue;
        }
        let stored_name = answer.body["metadata"]["name"].as_str().map(str::to_string);
        if let (Some((patch, expect)), Some(name)) = (&c.update, &stored_name) {
            let answer = update(&client, &ns, c.kind, name, patch).await?;
            if let Err(e) = check(&format!("{} (update)", c.name), expect, &answer) {
                failures.push(format!("{e:#}"));
            }
        }
        if let (Kind::Request, Some(name), Expect::Accepted(_)) = (c.kind, stored_name, &c.expect) {
            accepted_requests.push(name);
        }
    }
    for (name, elapsed, code) in &timings {
        eprintln!("{name:40} {code} {:>7.1} ms", elapsed.as_secs_f64() * 1e3);
    }
    if !failures.is_empty() {
        bail!(
            "{} of {} cases failed:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
    }

    // The operator took every accepted request in its stride: each waits Pending for its
    // missing node and says so (the huge, unicode and 253-character ones included).
    for name in &accepted_requests {
        wait_request(
            &client,
            &ns,
            name,
            "Pending, saying that its node is not found",
            WAIT,
            |r| {
                r.phase() == Phase::Pending
                    && pending_message(r).is_some_and(|m| m.contains("not found"))
            },
        )
        .await?;
    }

    // Still healthy: ready, metrics served, no panic in its log.
    let (code, _) = http_get(&format!(
        "http://127.0.0.1:{}/readyz",
        shared.operator.health_port
    ))
    .await?;
    ensure!(code == 200, "the operator's /readyz answered {code}");
    shared
        .operator
        .metric("maintenance_operator_scheduler_runs_total")
        .await?;
    let log = std::fs::read_to_string(&shared.operator.log).unwrap_or_default();
    ensure!(
        !log.contains("panicked"),
        "the operator panicked; log: {}",
        shared.operator.log.display()
    );

    // And a valid request made now still goes all the way (the config `default` of this
    // namespace, which would admit nothing, is ignored).
    request_node(&client, &ns, "valid", &nodes[0], REQUESTOR).await?;
    wait_phase(&client, &ns, "valid", Phase::Ready, WAIT)
        .await
        .context("a valid request after the bad input")?;
    ensure!(node_unschedulable(&client, &nodes[0]).await?);
    Ok(())
}
