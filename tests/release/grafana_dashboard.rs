//! `grafana/dashboard.json` and `grafana/alerts.yaml` are tested against the metrics the operator
//! really exports:
//!
//! - every metric a dashboard query or an alert expression names is exported by
//!   [`maintenance_actors::metrics::Metrics`] (histograms through their `_bucket`, `_sum` and
//!   `_count` series), and every exported family is on the dashboard;
//! - `promtool check rules` accepts the rules, and `promtool test rules` shows each alert firing on
//!   the situation it describes and staying quiet otherwise;
//! - end to end: a real Prometheus scrapes the operator running against the testbed while it
//!   drains nodes, hits a PodDisruptionBudget and a refused cordon, and releases a node; every
//!   dashboard query and every selector of the alert expressions then returns data through
//!   Prometheus's HTTP API, and Prometheus evaluates the rules.
//!
//! Prometheus and promtool come from Debian's `prometheus` package. Without them the tests that
//! need them fail, naming the missing tool and how to install it: a skipped check passes silently.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::prometheus_server::{Prometheus, SecureScrape, required_tool};
use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, PostParams};
use maintenance_actors::metrics::Metrics;
use maintenance_crds::{
    Budget, DrainSpec, MaintenanceOperatorConfig, MaintenanceOperatorConfigSpec, NodeMaintenance,
    NodeMaintenanceSpec, Phase, condition_type,
};
use prometheus::proto::MetricType;
use serde_json::{Value, json};
use support::operator::{
    Helper, create_bound_service_account, free_port, http_get, metrics_reader_role,
    service_account_token,
};
use support::policy::{NodeUpdatePolicy, Rule};
use support::*;

const PREFIX: &str = "maintenance_operator_";
/// Values Grafana gives its built-in interval variables, for evaluating queries outside Grafana.
const BUILTIN_VARIABLES: [(&str, &str); 6] = [
    ("__rate_interval", "1m"),
    ("__interval", "15s"),
    ("__interval_ms", "15000"),
    ("__range", "5m"),
    ("__range_s", "300"),
    ("__range_ms", "300000"),
];
/// The alerts the on-call runbook (grafana/README.md) relies on.
const REQUIRED_ALERTS: [&str; 5] = [
    "MaintenanceStuck",
    "DrainFailed",
    "SchedulerStalled",
    "MaintenanceOperatorDown",
    "MaintenanceOperatorNoLeader",
];
const MINUTE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Reading the dashboard and the rules

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn alerts_path() -> PathBuf {
    repo_path("grafana/alerts.yaml")
}

fn dashboard() -> Value {
    let path = repo_path("grafana/dashboard.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn alert_rules_file() -> Value {
    let path = alerts_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{} is not YAML: {e}", path.display()))
}

/// A PromQL expression and where it comes from (for messages).
#[derive(Clone, Debug)]
struct Query {
    source: String,
    expr: String,
}

/// Every panel of the dashboard, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in list.as_array().into_iter().flatten() {
            out.push(panel);
            if let Some(nested) = panel.get("panels") {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

fn dashboard_queries(dashboard: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push(Query {
                    source: format!(
                        "panel {title:?} query {}",
                        target["refId"].as_str().unwrap_or("?")
                    ),
                    expr: expr.to_string(),
                });
            }
        }
    }
    out
}

/// `(group, rule)` of every alerting rule.
fn alert_rules(rules: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    for group in rules["groups"].as_array().into_iter().flatten() {
        let name = group["name"].as_str().unwrap_or_default().to_string();
        for rule in group["rules"].as_array().into_iter().flatten() {
            if rule.get("alert").is_some() {
                out.push((name.clone(), rule));
            }
        }
    }
    out
}

fn alert_queries(rules: &Value) -> Vec<Query> {
    alert_rules(rules)
        .into_iter()
        .map(|(group, rule)| Query {
            source: format!(
                "alert {} (group {group})",
                rule["alert"].as_str().unwrap_or("?")
            ),
            expr: rule["expr"].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Metric names in PromQL

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Every `maintenance_operator_*` name in an expression, with its byte range.
fn metric_name_spans(expr: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut from = 0;
    while let Some(found) = expr[from..].find(PREFIX) {
        let start = from + found;
        let end = expr[start..]
            .find(|c: char| !is_name_char(c))
            .map_or(expr.len(), |n| start + n);
        let preceded_by_name = expr[..start].chars().next_back().is_some_and(is_name_char);
        if !preceded_by_name {
            spans.push((start, end));
        }
        from = end;
    }
    spans
}

fn metric_names_in(expr: &str) -> Vec<String> {
    metric_name_spans(expr)
        .into_iter()
        .map(|(start, end)| expr[start..end].to_string())
        .collect()
}

/// Every vector selector of the operator's metrics: the name and its `{...}` matchers, if any.
fn selectors_in(expr: &str) -> Vec<String> {
    metric_name_spans(expr)
        .into_iter()
        .map(|(start, end)| {
            let rest = &expr[end..];
            match rest.strip_prefix('{').and_then(|r| r.find('}')) {
                Some(close) => expr[start..end + close + 2].to_string(),
                None => expr[start..end].to_string(),
            }
        })
        .collect()
}

/// The metric families the operator exports, with their types. Labelled families appear in a
/// scrape only once a label set exists, as they do in a running operator; a family added to
/// `Metrics` with labels must get a label set here before the dashboard can use it.
fn exported_metrics() -> BTreeMap<String, MetricType> {
    let m = Metrics::new().expect("the operator's metrics register");
    m.request
        .phase_duration_seconds
        .with_label_values(&["Pending"]);
    m.request
        .phase_transitions_total
        .with_label_values(&["Pending", "Scheduled"]);
    m.drain
        .eviction_requests_total
        .with_label_values(&["evicted", "201"]);
    m.drain
        .pods_blocked_by_pdb
        .with_label_values(&["ns", "pdb"]);
    m.drain
        .pods_force_deleted_total
        .with_label_values(&["ns", "pdb"]);
    m.drain.seconds_since_progress.with_label_values(&["node"]);
    m.process.errors_total.with_label_values(&["node_step"]);
    m.scheduler
        .budget_available_slots
        .with_label_values(&["budget", "group"]);
    m.scheduler
        .budget_can_become_unavailable
        .with_label_values(&["budget", "group"]);
    m.notifications.export_receiver("receiver");
    m.gates.set_open("gate", true);
    let families: BTreeMap<String, MetricType> = m
        .registry
        .gather()
        .iter()
        .map(|f| (f.name().to_string(), f.get_field_type()))
        .collect();
    for name in m.metric_names() {
        assert!(
            families.contains_key(&name),
            "metric_names() lists {name}, which the registry does not export"
        );
    }
    families
}

/// The family a series name belongs to, if the operator exports that series. A histogram
/// exports `_bucket`, `_sum` and `_count` series only, never its bare name.
fn family_of(series: &str, exported: &BTreeMap<String, MetricType>) -> Option<String> {
    match exported.get(series) {
        Some(MetricType::HISTOGRAM) => None,
        Some(_) => Some(series.to_string()),
        None => ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            let base = series.strip_suffix(suffix)?;
            (exported.get(base) == Some(&MetricType::HISTOGRAM)).then(|| base.to_string())
        }),
    }
}

/// The check of every dashboard query and alert expression: fails naming each query that uses a
/// series the operator does not export.
fn check_metrics_exported(
    queries: &[Query],
    exported: &BTreeMap<String, MetricType>,
) -> std::result::Result<BTreeSet<String>, String> {
    let mut used = BTreeSet::new();
    let mut problems = Vec::new();
    for query in queries {
        let names = metric_names_in(&query.expr);
        if names.is_empty() {
            problems.push(format!(
                "{} names no {PREFIX}* metric: {}",
                query.source, query.expr
            ));
        }
        for name in names {
            match family_of(&name, exported) {
                Some(family) => {
                    used.insert(family);
                }
                None => problems.push(format!(
                    "{} uses {name}, which the operator does not export (histograms only as \
                     _bucket/_sum/_count): {}",
                    query.source, query.expr
                )),
            }
        }
    }
    if problems.is_empty() {
        Ok(used)
    } else {
        Err(format!(
            "{}\nexported: {:?}",
            problems.join("\n"),
            exported.keys().collect::<Vec<_>>()
        ))
    }
}

/// The expression as Prometheus sees it: Grafana's variables replaced by their values (built-in
/// intervals by [`BUILTIN_VARIABLES`], the dashboard's own by their current value).
fn substitute_variables(expr: &str, dashboard: &Value) -> String {
    let mut vars: Vec<(String, String)> = BUILTIN_VARIABLES
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        // "All" of a multi-value variable (its current value a list holding `$__all`) is the
        // variable's `allValue`, as Grafana substitutes it.
        let current = &var["current"]["value"];
        let all = current
            .as_array()
            .is_some_and(|values| values.iter().any(|v| v == "$__all"))
            || current == "$__all";
        let value = if all {
            var["allValue"].as_str()
        } else {
            current.as_str()
        };
        if let (Some(name), Some(value)) = (var["name"].as_str(), value) {
            vars.push((name.to_string(), value.to_string()));
        }
    }
    // Longest first, so `$__range_s` is not read as `$__range` followed by `_s`.
    vars.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let mut out = expr.to_string();
    for (name, value) in &vars {
        out = out.replace(&format!("${{{name}}}"), value);
        out = out.replace(&format!("${name}"), value);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Pure tests

#[test]
fn every_dashboard_query_uses_exported_metrics_and_every_metric_is_shown() {
    let dashboard = dashboard();
    let queries = dashboard_queries(&dashboard);
    assert!(
        queries.len() >= 15,
        "only {} queries on the dashboard",
        queries.len()
    );
    let exported = exported_metrics();
    let used = check_metrics_exported(&queries, &exported).unwrap_or_else(|e| panic!("{e}"));
    let unshown: Vec<&String> = exported.keys().filter(|f| !used.contains(*f)).collect();
    assert!(
        unshown.is_empty(),
        "exported metrics on no dashboard panel: {unshown:?}"
    );
    for query in &queries {
        let expr = substitute_variables(&query.expr, &dashboard);
        assert!(
            !expr.contains('$'),
            "{} uses an unknown variable: {expr}",
            query.source
        );
    }
}

#[test]
fn every_alert_expression_uses_exported_metrics() {
    let rules = alert_rules_file();
    let queries = alert_queries(&rules);
    let names: BTreeSet<&str> = alert_rules(&rules)
        .iter()
        .filter_map(|(_, r)| r["alert"].as_str())
        .collect();
    for required in REQUIRED_ALERTS {
        assert!(
            names.contains(required),
            "alert {required} missing; have {names:?}"
        );
    }
    check_metrics_exported(&queries, &exported_metrics()).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_metric_check_rejects_names_the_operator_does_not_export() {
    let exported = exported_metrics();
    let query = |expr: &str| {
        vec![Query {
            source: "panel \"fake\" query A".into(),
            expr: expr.into(),
        }]
    };
    // A plausible metric that does not exist.
    let err = check_metrics_exported(
        &query("sum(rate(maintenance_operator_drain_timeouts_total[5m]))"),
        &exported,
    )
    .expect_err("an unknown metric must fail the check");
    assert!(
        err.contains("maintenance_operator_drain_timeouts_total") && err.contains("fake"),
        "{err}"
    );
    // A typo among real names.
    check_metrics_exported(
        &query("maintenance_operator_leader + maintenance_operator_node_actor"),
        &exported,
    )
    .expect_err("a misspelt metric must fail the check");
    // A histogram has no series under its bare name, and a gauge has no buckets.
    check_metrics_exported(
        &query("maintenance_operator_drain_duration_seconds"),
        &exported,
    )
    .expect_err("a bare histogram name must fail the check");
    check_metrics_exported(
        &query("sum by (le) (maintenance_operator_requests_bucket)"),
        &exported,
    )
    .expect_err("_bucket of a gauge must fail the check");
    // An expression without any of the operator's metrics checks nothing.
    check_metrics_exported(&query("up"), &exported).expect_err("a query without metrics");
    // Real series pass, histograms through their suffixes.
    let used = check_metrics_exported(
        &query(
            "histogram_quantile(0.9, sum by (le) (rate(maintenance_operator_drain_duration_seconds_bucket[5m]))) \
             / maintenance_operator_drain_duration_seconds_count + maintenance_operator_errors_total",
        ),
        &exported,
    )
    .expect("exported series pass");
    assert_eq!(
        used.into_iter().collect::<Vec<_>>(),
        [
            "maintenance_operator_drain_duration_seconds",
            "maintenance_operator_errors_total"
        ]
    );
}

#[test]
fn metric_names_and_selectors_are_extracted_from_promql() {
    let expr = r#"sum(maintenance_operator_requests{phase="Pending"}) > 0 and on (job) rate(maintenance_operator_scheduler_runs_total[5m]) == 0 and not xmaintenance_operator_leader"#;
    assert_eq!(
        metric_names_in(expr),
        [
            "maintenance_operator_requests",
            "maintenance_operator_scheduler_runs_total"
        ]
    );
    assert_eq!(
        selectors_in(expr),
        [
            r#"maintenance_operator_requests{phase="Pending"}"#,
            "maintenance_operator_scheduler_runs_total"
        ]
    );
    let dashboard = json!({ "templating": { "list": [
        { "name": "window", "current": { "value": "1h" } }
    ] } });
    assert_eq!(
        substitute_variables(
            "rate(a[$__rate_interval]) + rate(b[${window}]) + rate(c[$window]) + d[$__range_s]",
            &dashboard
        ),
        "rate(a[1m]) + rate(b[1h]) + rate(c[1h]) + d[300]"
    );
}

#[test]
fn dashboard_is_importable_and_uses_the_templated_datasource() {
    let dashboard = dashboard();
    let schema = dashboard["schemaVersion"].as_u64().unwrap_or(0);
    assert!(schema >= 36, "schemaVersion {schema}");
    assert!(dashboard["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    let vars = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    assert!(
        vars.iter().any(|v| v["name"] == "DS_PROMETHEUS"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "no Prometheus datasource variable DS_PROMETHEUS: {vars:?}"
    );
    let mut ids = BTreeSet::new();
    let mut titles = BTreeSet::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or_default();
        let id = panel["id"].as_u64().expect("every panel has an id");
        assert!(ids.insert(id), "panel id {id} twice");
        let pos = &panel["gridPos"];
        assert!(
            ["h", "w", "x", "y"].iter().all(|k| pos[k].is_u64()),
            "panel {title:?} gridPos {pos}"
        );
        assert!(
            pos["x"].as_u64().unwrap_or(0) + pos["w"].as_u64().unwrap_or(0) <= 24,
            "panel {title:?} is wider than the dashboard"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert!(!title.is_empty(), "a panel without title: {panel}");
        assert!(titles.insert(title), "panel title {title:?} twice");
        assert!(
            panel["description"].as_str().is_some_and(|d| !d.is_empty()),
            "panel {title:?} has no description"
        );
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for ds in
            std::iter::once(&panel["datasource"]).chain(targets.iter().map(|t| &t["datasource"]))
        {
            assert_eq!(
                ds,
                &json!({ "type": "prometheus", "uid": "${DS_PROMETHEUS}" }),
                "panel {title:?} does not use the DS_PROMETHEUS variable"
            );
        }
    }
    // The panels the issue asks for, by the metrics they show.
    let queries = dashboard_queries(&dashboard);
    let shown = |needle: &str| queries.iter().any(|q| q.expr.contains(needle));
    for needle in [
        "sum by (phase) (maintenance_operator_requests",
        "maintenance_operator_available_slots",
        "maintenance_operator_can_become_unavailable",
        "sum by (le, phase) (rate(maintenance_operator_phase_duration_seconds_bucket",
        "maintenance_operator_drain_duration_seconds_bucket",
        "sum by (result, code) (rate(maintenance_operator_eviction_requests_total",
        "sum by (namespace, pdb) (maintenance_operator_pods_blocked_by_pdb",
        "sum by (namespace, pdb) (increase(maintenance_operator_pods_force_deleted_total",
        "topk(10, max by (node) (maintenance_operator_seconds_since_progress",
        "maintenance_operator_seconds_since_progress) > 300",
        "histogram_quantile(0.99, sum by (le) (rate(maintenance_operator_scheduler_run_duration_seconds_bucket",
        "rate(maintenance_operator_scheduler_runs_total",
        "maintenance_operator_node_actors",
        "maintenance_operator_actor_restarts_total",
        "sum by (step) (rate(maintenance_operator_errors_total",
        "maintenance_operator_leader",
        "sum by (cause) (maintenance_operator_requests_waiting",
        "maintenance_operator_budget_available_slots{budget=~\"$budget\"}",
        "min by (gate) (maintenance_operator_gate_open)",
    ] {
        assert!(shown(needle), "no dashboard query contains {needle:?}");
    }
}

#[test]
fn alerts_tell_on_call_what_to_look_at() {
    let rules = alert_rules_file();
    for (group, rule) in alert_rules(&rules) {
        let name = rule["alert"].as_str().unwrap_or_default();
        let summary = rule["annotations"]["summary"].as_str().unwrap_or_default();
        let description = rule["annotations"]["description"]
            .as_str()
            .unwrap_or_default();
        assert!(!summary.is_empty(), "{group}/{name}: no summary");
        assert!(
            description.contains("kubectl "),
            "{group}/{name}: the description names no kubectl command: {description}"
        );
        assert!(
            rule["labels"]["severity"].is_string(),
            "{group}/{name}: no severity label"
        );
        assert!(rule["for"].is_string(), "{group}/{name}: no `for`");
    }
    let by_name = |n: &str| {
        alert_rules(&rules)
            .into_iter()
            .find(|(_, r)| r["alert"] == n)
            .map(|(_, r)| r.clone())
            .unwrap_or_else(|| panic!("alert {n} missing"))
    };
    let stuck = by_name("MaintenanceStuck");
    assert_eq!(
        stuck["expr"].as_str().map(str::trim),
        Some("max by (node) (maintenance_operator_seconds_since_progress) > 900")
    );
    assert_eq!(stuck["for"], "5m");
    for (alert, needle) in [
        ("MaintenanceStuck", "kubectl describe nm"),
        ("DrainFailed", "kubectl get nm"),
        ("SchedulerStalled", "maintenance-operator plan"),
    ] {
        let description = by_name(alert)["annotations"]["description"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            description.contains(needle),
            "{alert} should mention `{needle}`"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// promtool

fn run_tool(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn promtool_checks_the_rules() {
    let promtool = required_tool("promtool");
    let (ok, out) = run_tool(
        Command::new(&promtool)
            .arg("check")
            .arg("rules")
            .arg(alerts_path()),
    );
    assert!(
        ok,
        "promtool check rules grafana/alerts.yaml failed:\n{out}"
    );
    let count = alert_rules(&alert_rules_file()).len();
    assert!(
        out.contains(&format!("SUCCESS: {count} rules found")),
        "promtool did not find the {count} rules:\n{out}"
    );

    // The same check fails on a broken rule file, so a pass means something.
    let dir = tempfile::tempdir().expect("tempdir");
    let broken = dir.path().join("broken.yaml");
    let text = std::fs::read_to_string(alerts_path())
        .expect("alerts.yaml")
        .replacen("> 900", "> > 900", 1);
    std::fs::write(&broken, text).expect("writing the broken copy");
    let (ok, out) = run_tool(
        Command::new(&promtool)
            .arg("check")
            .arg("rules")
            .arg(&broken),
    );
    assert!(!ok, "promtool accepted a broken expression:\n{out}");
}

/// The alert rules without annotations: promtool compares expected annotations verbatim, and
/// this test is about when alerts fire (their templates are checked by `promtool check rules`).
fn rules_without_annotations() -> String {
    let mut rules = alert_rules_file();
    for group in rules["groups"].as_array_mut().into_iter().flatten() {
        for rule in group["rules"].as_array_mut().into_iter().flatten() {
            if let Some(rule) = rule.as_object_mut() {
                rule.remove("annotations");
            }
        }
    }
    serde_norway::to_string(&rules).expect("rules serialize")
}

/// promtool unit tests: each alert fires on the situation it describes (after its `for`) and not
/// on the healthy neighbour of that situation.
fn alert_unit_tests(rule_file: &str) -> Value {
    let s = |series: &str, values: &str| json!({ "series": series, "values": values });
    let none =
        |alert: &str, at: &str| json!({ "eval_time": at, "alertname": alert, "exp_alerts": [] });
    let fires = |alert: &str, at: &str, labels: Value| json!({ "eval_time": at, "alertname": alert, "exp_alerts": [{ "exp_labels": labels }] });
    let op = r#"job="maintenance-operator", instance="10.0.0.1:8080""#;
    let standby = r#"job="maintenance-operator", instance="10.0.0.2:8080""#;
    json!({
        "rule_files": [rule_file],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    // No pod left node-a for 40 minutes; node-b progresses every minute.
                    s(&format!(r#"maintenance_operator_seconds_since_progress{{node="node-a", {op}}}"#), "0+60x40"),
                    s(&format!(r#"maintenance_operator_seconds_since_progress{{node="node-b", {op}}}"#), "0 60 0 60 0 60 0 60 0 60 0 60 0 60 0 60 0 60 0 60 0 60 0 60 0 60 0 60 0 60"),
                ],
                "alert_rule_test": [
                    none("MaintenanceStuck", "10m"),
                    // Above 900 s from minute 16, for 5 minutes: firing from minute 21.
                    none("MaintenanceStuck", "20m"),
                    fires("MaintenanceStuck", "25m", json!({ "node": "node-a", "severity": "warning" })),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    s(&format!(r#"maintenance_operator_pods_blocked_by_pdb{{namespace="shop", pdb="web", {op}}}"#), "0 0 1x60"),
                    // Blocked for 10 minutes only: the budget recovered.
                    s(&format!(r#"maintenance_operator_pods_blocked_by_pdb{{namespace="shop", pdb="cache", {op}}}"#), "2x10 0x50"),
                ],
                "alert_rule_test": [
                    none("DrainFailed", "31m"),
                    fires("DrainFailed", "40m", json!({ "namespace": "shop", "pdb": "web", "severity": "warning" })),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    // The leader's rounds stop at minute 10 while two requests wait.
                    s(&format!(r#"maintenance_operator_requests{{phase="Pending", {op}}}"#), "2x40"),
                    s(&format!(r#"maintenance_operator_scheduler_runs_total{{{op}}}"#), "0+6x10 60x30"),
                    s(&format!(r#"maintenance_operator_leader{{{op}}}"#), "1x40"),
                    // The standby never schedules and sees nothing pending.
                    s(&format!(r#"maintenance_operator_requests{{phase="Pending", {standby}}}"#), "0x40"),
                    s(&format!(r#"maintenance_operator_scheduler_runs_total{{{standby}}}"#), "0x40"),
                    s(&format!(r#"maintenance_operator_leader{{{standby}}}"#), "0x40"),
                ],
                "alert_rule_test": [
                    none("SchedulerStalled", "12m"),
                    fires("SchedulerStalled", "20m", json!({
                        "phase": "Pending", "job": "maintenance-operator",
                        "instance": "10.0.0.1:8080", "severity": "critical"
                    })),
                    none("MaintenanceOperatorDown", "20m"),
                    none("MaintenanceOperatorNoLeader", "20m"),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    // Rounds go on while requests wait: admission is merely full.
                    s(&format!(r#"maintenance_operator_requests{{phase="Pending", {op}}}"#), "5x40"),
                    s(&format!(r#"maintenance_operator_scheduler_runs_total{{{op}}}"#), "0+6x40"),
                    s(&format!(r#"maintenance_operator_leader{{{op}}}"#), "1x40"),
                ],
                "alert_rule_test": [ none("SchedulerStalled", "30m") ],
            },
            {
                "interval": "1m",
                "input_series": [
                    // The only operator disappears after 10 minutes.
                    s(&format!(r#"maintenance_operator_leader{{{op}}}"#), "1x10"),
                ],
                "alert_rule_test": [
                    none("MaintenanceOperatorDown", "12m"),
                    fires("MaintenanceOperatorDown", "30m", json!({ "severity": "critical" })),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    // The leader steps down at minute 6 and the standby never takes over.
                    s(&format!(r#"maintenance_operator_leader{{{op}}}"#), "1x5 0x30"),
                    s(&format!(r#"maintenance_operator_leader{{{standby}}}"#), "0x35"),
                ],
                "alert_rule_test": [
                    none("MaintenanceOperatorNoLeader", "8m"),
                    fires("MaintenanceOperatorNoLeader", "15m", json!({ "severity": "critical" })),
                    none("MaintenanceOperatorDown", "15m"),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    s(&format!(r#"maintenance_operator_leader{{{op}}}"#), "1x30"),
                    s(&format!(r#"maintenance_operator_leader{{{standby}}}"#), "0x5 1x25"),
                ],
                "alert_rule_test": [
                    none("MaintenanceOperatorTwoLeaders", "5m"),
                    fires("MaintenanceOperatorTwoLeaders", "10m", json!({ "severity": "critical" })),
                ],
            },
            {
                "interval": "1m",
                "input_series": [
                    s(&format!(r#"maintenance_operator_errors_total{{step="node_step", {op}}}"#), "0+3x40"),
                    // Old errors that stopped: no alert.
                    s(&format!(r#"maintenance_operator_errors_total{{step="admit", {op}}}"#), "7x40"),
                    s(&format!(r#"maintenance_operator_actor_restarts_total{{{op}}}"#), "0+1x40"),
                ],
                "alert_rule_test": [
                    none("MaintenanceOperatorErrors", "10m"),
                    fires("MaintenanceOperatorErrors", "20m", json!({ "step": "node_step", "severity": "warning" })),
                    none("MaintenanceNodeActorsRestarting", "2m"),
                    fires("MaintenanceNodeActorsRestarting", "20m", json!({
                        "job": "maintenance-operator", "instance": "10.0.0.1:8080", "severity": "warning"
                    })),
                ],
            },
        ],
    })
}

#[test]
fn promtool_unit_tests_show_when_each_alert_fires() {
    let promtool = required_tool("promtool");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("rules.yaml"), rules_without_annotations())
        .expect("writing rules");
    let tests = alert_unit_tests("rules.yaml");
    let covered: BTreeSet<&str> = tests["tests"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .filter(|t| t["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .filter_map(|t| t["alertname"].as_str())
        .collect();
    for (_, rule) in alert_rules(&alert_rules_file()) {
        let name = rule["alert"].as_str().unwrap_or_default();
        assert!(
            covered.contains(name),
            "no promtool test shows {name} firing"
        );
    }
    let test_file = dir.path().join("alerts_test.yaml");
    std::fs::write(
        &test_file,
        serde_norway::to_string(&tests).expect("tests serialize"),
    )
    .expect("writing tests");
    let (ok, out) = run_tool(
        Command::new(&promtool)
            .current_dir(dir.path())
            .arg("test")
            .arg("rules")
            .arg("alerts_test.yaml"),
    );
    assert!(ok, "promtool test rules failed:\n{out}");

    // An alert that fired too early would fail: the unit tests can fail.
    let mut wrong = tests.clone();
    wrong["tests"][0]["alert_rule_test"][1] = json!({
        "eval_time": "20m", "alertname": "MaintenanceStuck",
        "exp_alerts": [{ "exp_labels": { "node": "node-a", "severity": "warning" } }]
    });
    std::fs::write(
        &test_file,
        serde_norway::to_string(&wrong).expect("tests serialize"),
    )
    .expect("writing tests");
    let (ok, out) = run_tool(
        Command::new(&promtool)
            .current_dir(dir.path())
            .arg("test")
            .arg("rules")
            .arg("alerts_test.yaml"),
    );
    assert!(
        !ok,
        "promtool accepted MaintenanceStuck firing before its `for` ran out:\n{out}"
    );
}

// ---------------------------------------------------------------------------------------------
// End to end: a real Prometheus scraping the operator on the testbed

fn describe(samples: &[(Value, f64)]) -> String {
    if samples.is_empty() {
        return "empty result".into();
    }
    samples
        .iter()
        .take(6)
        .map(|(labels, v)| format!("{labels} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Data in the sense of a Grafana panel: at least one sample with a number (histogram_quantile
/// over a window without observations gives NaN, which a panel shows as nothing).
fn has_data(samples: &[(Value, f64)]) -> bool {
    samples.iter().any(|(_, v)| v.is_finite())
}

fn nodemaintenance(name: &str, node: &str) -> NodeMaintenance {
    NodeMaintenance::new(
        name,
        NodeMaintenanceSpec {
            requestor_id: "dashboard-test.maintenance.nvidia.com".into(),
            node_name: node.into(),
            drain_spec: Some(DrainSpec {
                force: Some(true),
                timeout_seconds: Some(5),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
}

/// Nodes carrying this label refuse to be cordoned (a ValidatingAdmissionPolicy), so the
/// operator's cordon step fails and `errors_total{step="node_step"}` counts real API errors.
const CORDON_FORBIDDEN_LABEL: (&str, &str) =
    ("dashboard-test.maintenance.nvidia.com/cordon", "forbidden");

#[tokio::test]
async fn every_dashboard_query_and_alert_selector_returns_data_on_a_real_prometheus() -> Result<()>
{
    let started = Instant::now();
    // Dropped last (locals drop in reverse order): the processes go before their directory, and
    // the control plane after everything that talks to it.
    let testbed = Testbed::start().await?;
    let work = tempfile::Builder::new().prefix("mo-grafana-").tempdir()?;
    let client = testbed.client().await?;
    apply_crds(&client).await?;

    // The operator's namespace and config: room for every request, a finite maxUnavailable so
    // canBecomeUnavailable is a real number, and a budget as wide as the cluster (so its gauges
    // exist) that changes no decision.
    let operator_ns = "maintenance-operator";
    create_namespace(&client, operator_ns).await?;
    let config = MaintenanceOperatorConfig::new(
        "default",
        MaintenanceOperatorConfigSpec {
            max_parallel_operations: Some(IntOrString::Int(10)),
            max_unavailable: Some(IntOrString::Int(5)),
            budgets: Some(vec![Budget {
                name: "everything".into(),
                max_parallel_operations: Some(IntOrString::Int(10)),
                ..Budget::default()
            }]),
            // A receiver nobody listens for: its notification series exist (and count failures).
            notifications: Some(vec![maintenance_crds::Notification {
                name: "nobody".into(),
                url: Some(format!("http://127.0.0.1:{}/", free_port()?)),
                events: maintenance_crds::NotificationEvent::ALL.to_vec(),
                secret_ref: None,
            }]),
            ..Default::default()
        },
    );
    Api::<MaintenanceOperatorConfig>::namespaced(client.clone(), operator_ns)
        .create(&PostParams::default(), &config)
        .await
        .context("creating the MaintenanceOperatorConfig")?;

    // Nodes: p-0 holds a pod its PodDisruptionBudget never lets go, p-1 and p-2 pods that drain,
    // p-3 is room, p-4 holds a pod whose budget the escalation deadline bypasses; q-0 refuses to
    // be cordoned.
    let prefix = unique_name("graf");
    let nodes = create_nodes(&client, &prefix, 5, &[]).await?;
    let locked_prefix = unique_name("grafq");
    let locked = create_nodes(&client, &locked_prefix, 1, &[CORDON_FORBIDDEN_LABEL]).await?;
    let all_nodes: Vec<String> = nodes.iter().chain(&locked).cloned().collect();
    wait_nodes_ready(&client, &all_nodes, 2 * MINUTE).await?;
    let _cordon_refused = NodeUpdatePolicy::create(
        &client,
        &unique_name("forbid-cordon"),
        CORDON_FORBIDDEN_LABEL,
        Rule {
            expression: "!has(object.spec.unschedulable) || !object.spec.unschedulable",
            message: "this node must stay schedulable",
        },
        &locked[0],
        json!({ "spec": { "unschedulable": true } }),
        MINUTE,
    )
    .await?;

    let ns = unique_name("shop");
    create_namespace(&client, &ns).await?;
    create_app_deployment(
        &client,
        &ns,
        "guarded",
        1,
        &PodSpecOptions::on_node(&nodes[0]),
    )
    .await?;
    create_app_pdb(&client, &ns, "guarded", 1).await?;
    for (name, node) in [("web-a", &nodes[1]), ("web-b", &nodes[2])] {
        create_app_deployment(&client, &ns, name, 2, &PodSpecOptions::on_node(node)).await?;
    }
    wait_pods_ready(&client, &ns, "app=guarded", 1, 2 * MINUTE).await?;
    wait_pods_ready(&client, &ns, "app=web-a", 2, 2 * MINUTE).await?;
    wait_pods_ready(&client, &ns, "app=web-b", 2, 2 * MINUTE).await?;
    wait_pdb_disruptions_allowed(&client, &ns, "guarded", 0, 2 * MINUTE).await?;
    blocked_workload(&client, &ns, "doomed", &nodes[4], 1, 2 * MINUTE).await?;

    // The operator, and a Prometheus scraping it every second with the alert rules loaded: over
    // HTTPS with a token allowed to read /metrics, as the chart's ServiceMonitor does.
    let reader = unique_name("prometheus");
    let role = metrics_reader_role(&client).await?;
    create_bound_service_account(&client, operator_ns, &reader, role).await?;
    let scrape = SecureScrape {
        token: service_account_token(&client, operator_ns, &reader).await?,
        verify: None,
    };
    let metrics_port = free_port()?;
    let mut operator = Helper::spawn(
        "maintenance-operator",
        Command::new(env!("CARGO_BIN_EXE_maintenance-operator"))
            .args(["run", "--metrics-addr"])
            .arg(format!("127.0.0.1:{metrics_port}"))
            .arg("--health-addr")
            .arg(format!("127.0.0.1:{}", free_port()?))
            .args([
                "--namespace",
                operator_ns,
                "--log-format",
                "text",
                "--tick-seconds",
                "2",
            ])
            .env("KUBECONFIG", testbed.kubeconfig_path())
            .env("RUST_LOG", "info,kube=warn")
            .env("NO_COLOR", "1"),
        work.path().join("operator.log"),
    )?;
    let targets = [format!("127.0.0.1:{metrics_port}")];
    let prom = Prometheus::start(work.path(), &targets, Some(&scrape), &[alerts_path()])?;
    // An alert gate asking this Prometheus a query that returns nothing: open, so its series
    // exist, and it holds nothing back.
    Api::<MaintenanceOperatorConfig>::namespaced(client.clone(), operator_ns)
        .patch(
            "default",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"admission": {"gates": [
                {"name": "quiet", "prometheus": {"url": prom.url(""), "query": "vector(1) == 0"}}
            ]}}})),
        )
        .await
        .context("adding an alert gate to the MaintenanceOperatorConfig")?;

    let result = scenario(&client, &prom, &mut operator, &ns, &nodes, &locked[0]).await;
    if let Err(err) = &result {
        eprintln!(
            "FAILED: {err:#}\n--- operator log (tail) ---\n{}\n--- prometheus log (tail) ---\n{}",
            operator.log_tail(80),
            prom.log_tail(30)
        );
    } else {
        eprintln!(
            "end-to-end dashboard test passed in {:.0}s",
            started.elapsed().as_secs_f64()
        );
    }
    result
}

async fn scenario(
    client: &kube::Client,
    prom: &Prometheus,
    operator: &mut Helper,
    ns: &str,
    nodes: &[String],
    locked: &str,
) -> Result<()> {
    wait_until("Prometheus to be ready", 2 * MINUTE, || {
        let running = prom.ensure_running();
        async move {
            running?;
            let (status, body) = http_get(&prom.url("/-/ready")).await?;
            Ok(if status == 200 {
                Check::Done(())
            } else {
                Check::Pending(format!("HTTP {status} {body}"))
            })
        }
    })
    .await?;
    wait_until(
        "Prometheus to scrape the operator's unlabelled families",
        2 * MINUTE,
        || {
            let running = operator.ensure_running();
            async move {
                running?;
                let up = prom.query(r#"up{job="maintenance-operator"} == 1"#).await?;
                if up.is_empty() {
                    return Ok(Check::Pending("target not up yet".into()));
                }
                let present: BTreeSet<String> = prom
                    .query(r#"count by (__name__) ({__name__=~"maintenance_operator_.+"})"#)
                    .await?
                    .into_iter()
                    .filter_map(|(labels, _)| labels["__name__"].as_str().map(String::from))
                    .collect();
                // Labelled families appear with their first label set, later in the scenario.
                let missing: Vec<&str> = [
                    "maintenance_operator_leader",
                    "maintenance_operator_requests",
                    "maintenance_operator_scheduler_runs_total",
                    "maintenance_operator_scheduler_run_duration_seconds_bucket",
                    "maintenance_operator_available_slots",
                    "maintenance_operator_drain_duration_seconds_count",
                ]
                .into_iter()
                .filter(|n| !present.contains(*n))
                .collect();
                Ok(if missing.is_empty() {
                    Check::Done(())
                } else {
                    Check::Pending(format!("missing {missing:?}"))
                })
            }
        },
    )
    .await?;

    // Wave one: a drain a PDB blocks, a drain that finishes, a cordon the API server refuses, a
    // drain that deletes its blocked pod past a deadline of one second.
    let nms: Api<NodeMaintenance> = Api::namespaced(client.clone(), ns);
    let nms_ref = &nms;
    for (name, node) in [
        ("blocked", nodes[0].as_str()),
        ("drained", nodes[1].as_str()),
        ("refused", locked),
    ] {
        nms.create(&PostParams::default(), &nodemaintenance(name, node))
            .await
            .with_context(|| format!("creating NodeMaintenance {name}"))?;
    }
    let mut forced = nodemaintenance("forced", &nodes[4]);
    if let Some(drain) = forced.spec.drain_spec.as_mut() {
        drain.force_delete_after_seconds = Some(1);
    }
    nms.create(&PostParams::default(), &forced)
        .await
        .context("creating NodeMaintenance forced")?;
    wait_phase(client, ns, "drained", Phase::Ready, 2 * MINUTE).await?;
    wait_phase(client, ns, "forced", Phase::Ready, 2 * MINUTE).await?;
    // Released at once: the phase panel counts one Ready request at the end.
    nms.delete("forced", &DeleteParams::default()).await?;
    let blocked = wait_until(
        "the blocked drain to time out (Failed=True, DrainTimeout)",
        2 * MINUTE,
        || async move {
            let nm = nms_ref.get("blocked").await?;
            let failed = nm.condition(condition_type::FAILED);
            if nm.phase() == Phase::Draining
                && failed.is_some_and(|c| c.status == "True" && c.reason == "DrainTimeout")
            {
                return Ok(Check::Done(nm));
            }
            Ok(Check::Pending(format!("status {:?}", nm.status)))
        },
    )
    .await?;
    let blocked_pods = blocked
        .status
        .as_ref()
        .and_then(|s| s.drain.as_ref())
        .map(|d| d.blocked.clone())
        .unwrap_or_default();
    ensure!(
        blocked_pods
            .iter()
            .any(|b| b.pod.starts_with(&format!("{ns}/guarded-"))),
        "the blocked drain should name the guarded pod: {blocked_pods:?} in {:?}",
        blocked.status
    );
    // The Scheduled step cordons before it moves on: a refused cordon holds it there.
    wait_phase(client, ns, "refused", Phase::Scheduled, MINUTE).await?;

    // Wave two, once Prometheus holds the series of wave one, so histograms and counters
    // labelled in wave one increase (rates and quantiles need two points).
    wait_until(
        "Prometheus to hold the phase and eviction series",
        MINUTE,
        || async move {
            let phases = prom
                .query("maintenance_operator_phase_duration_seconds_count")
                .await?;
            let evicted = prom
                .query(r#"maintenance_operator_eviction_requests_total{result="evicted"}"#)
                .await?;
            Ok(if !phases.is_empty() && !evicted.is_empty() {
                Check::Done(())
            } else {
                Check::Pending(format!(
                    "phase durations: {}; evictions: {}",
                    describe(&phases),
                    describe(&evicted)
                ))
            })
        },
    )
    .await?;
    nms.create(
        &PostParams::default(),
        &nodemaintenance("second", &nodes[2]),
    )
    .await
    .context("creating NodeMaintenance second")?;
    wait_phase(client, ns, "second", Phase::Ready, 2 * MINUTE).await?;

    // Releasing a Ready request: cleanup uncordons the node and drops the finalizer.
    nms.delete("drained", &DeleteParams::default()).await?;
    let node_api: Api<Node> = Api::all(client.clone());
    let released = nodes[1].clone();
    wait_until(
        "the released request to be gone and its node uncordoned",
        MINUTE,
        || {
            let (nms, node_api, released) = (nms.clone(), node_api.clone(), released.clone());
            async move {
                let gone = nms.get_opt("drained").await?.is_none();
                let node = node_api.get(&released).await?;
                let schedulable = !node
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false);
                Ok(if gone && schedulable {
                    Check::Done(())
                } else {
                    Check::Pending(format!(
                        "request gone: {gone}, node schedulable: {schedulable}"
                    ))
                })
            }
        },
    )
    .await?;
    operator.ensure_running()?;

    // Every dashboard query, as Grafana would send it, returns data. Rates and quantiles need
    // points on both sides of an event, so each query is polled until it has had data once.
    let dashboard = dashboard();
    let queries: Vec<Query> = dashboard_queries(&dashboard)
        .into_iter()
        .map(|q| Query {
            expr: substitute_variables(&q.expr, &dashboard),
            ..q
        })
        .collect();
    let rules = alert_rules_file();
    let selectors: BTreeSet<String> = alert_queries(&rules)
        .iter()
        .flat_map(|q| selectors_in(&q.expr))
        .collect();
    let mut satisfied: BTreeMap<String, Vec<(Value, f64)>> = BTreeMap::new();
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    let deadline = Instant::now() + 3 * MINUTE;
    loop {
        for query in &queries {
            if satisfied.contains_key(&query.source) {
                continue;
            }
            match prom.query(&query.expr).await {
                Ok(samples) if has_data(&samples) => {
                    satisfied.insert(query.source.clone(), samples);
                }
                Ok(samples) => {
                    last.insert(query.source.clone(), describe(&samples));
                }
                Err(err) => {
                    last.insert(query.source.clone(), format!("error: {err:#}"));
                }
            }
        }
        for selector in &selectors {
            let key = format!("alert selector {selector}");
            if satisfied.contains_key(&key) {
                continue;
            }
            match prom.query(selector).await {
                Ok(samples) if has_data(&samples) => {
                    satisfied.insert(key, samples);
                }
                Ok(samples) => {
                    last.insert(key, describe(&samples));
                }
                Err(err) => {
                    last.insert(key, format!("error: {err:#}"));
                }
            }
        }
        let pending: Vec<String> = queries
            .iter()
            .map(|q| q.source.clone())
            .chain(selectors.iter().map(|s| format!("alert selector {s}")))
            .filter(|k| !satisfied.contains_key(k))
            .collect();
        if pending.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            let detail: Vec<String> = pending
                .iter()
                .map(|k| {
                    let expr = queries
                        .iter()
                        .find(|q| &q.source == k)
                        .map_or("", |q| q.expr.as_str());
                    format!(
                        "{k}: {expr} -> {}",
                        last.get(k).map_or("never evaluated", String::as_str)
                    )
                })
                .collect();
            bail!(
                "{} queries never returned data:\n{}",
                pending.len(),
                detail.join("\n")
            );
        }
        operator.ensure_running()?;
        prom.ensure_running()?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The data is the scenario's, not just any data.
    let by_title = |title: &str| -> Vec<(Value, f64)> {
        satisfied
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("panel {title:?} ")))
            .flat_map(|(_, v)| v.clone())
            .collect()
    };
    let has = |samples: &[(Value, f64)], label: &str, value: &str| {
        samples
            .iter()
            .any(|(l, v)| l[label] == value && v.is_finite())
    };
    let pdb = by_title("Pods blocked by PodDisruptionBudget");
    ensure!(
        pdb.iter()
            .any(|(l, v)| l["namespace"] == ns && l["pdb"] == "guarded" && *v == 1.0),
        "pods blocked by PDB: {}",
        describe(&pdb)
    );
    let stalled = by_title("Nodes without progress (top 10)");
    ensure!(
        has(&stalled, "node", &nodes[0]),
        "nodes without progress: {}",
        describe(&stalled)
    );
    let evictions = by_title("Evictions by result and code");
    // The blocked drains' evictions are held by the per-budget gate (no 429 calls): the panel's
    // held series shows them.
    let held = prom
        .query("maintenance_operator_evictions_held_total > 0")
        .await?;
    ensure!(
        has(&evictions, "code", "201") && !held.is_empty(),
        "evictions: {}; held: {held:?}",
        describe(&evictions)
    );
    let errors = by_title("Errors by step");
    ensure!(
        has(&errors, "step", "node_step"),
        "errors by step: {}",
        describe(&errors)
    );
    let forced = by_title("Pods force-deleted past the deadline");
    ensure!(
        has(&forced, "pdb", "doomed"),
        "pods force-deleted: {}",
        describe(&forced)
    );
    // The phase gauge follows the scheduling rounds: wait for the round after the last change.
    let by_phase = queries
        .iter()
        .find(|q| q.source.starts_with("panel \"Requests by phase\""))
        .context("no Requests by phase panel")?
        .expr
        .clone();
    let by_phase = &by_phase;
    wait_until(
        "Requests by phase to show 1 Draining, 1 Scheduled, 1 Ready and nothing else",
        MINUTE,
        || async move {
            let samples = prom.query(by_phase).await?;
            let counts: BTreeMap<String, f64> = samples
                .iter()
                .filter(|(_, v)| *v != 0.0)
                .map(|(l, v)| (l["phase"].as_str().unwrap_or("?").to_string(), *v))
                .collect();
            let want: BTreeMap<String, f64> =
                [("Draining", 1.0), ("Ready", 1.0), ("Scheduled", 1.0)]
                    .into_iter()
                    .map(|(p, v)| (p.to_string(), v))
                    .collect();
            Ok(if counts == want {
                Check::Done(())
            } else {
                Check::Pending(describe(&samples))
            })
        },
    )
    .await?;
    let leader = prom.query("sum(maintenance_operator_leader)").await?;
    ensure!(
        leader.first().map(|(_, v)| *v) == Some(1.0),
        "leader: {}",
        describe(&leader)
    );

    // Prometheus loaded every rule of alerts.yaml and evaluates them without error, and each
    // full alert expression is valid PromQL against real data.
    let want: BTreeMap<String, BTreeSet<String>> = rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|g| {
            (
                g["name"].as_str().unwrap_or_default().to_string(),
                g["rules"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r["alert"].as_str().map(String::from))
                    .collect(),
            )
        })
        .collect();
    wait_until(
        "Prometheus to evaluate every rule of alerts.yaml with health ok",
        MINUTE,
        || {
            let want = want.clone();
            async move {
                let data = prom.api("rules").await?;
                let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
                let mut unhealthy = Vec::new();
                for group in data["groups"].as_array().into_iter().flatten() {
                    let names = seen
                        .entry(group["name"].as_str().unwrap_or_default().to_string())
                        .or_default();
                    for rule in group["rules"].as_array().into_iter().flatten() {
                        let name = rule["name"].as_str().unwrap_or_default();
                        names.insert(name.to_string());
                        if rule["health"] != "ok" {
                            unhealthy.push(format!(
                                "{name}: health {} {}",
                                rule["health"], rule["lastError"]
                            ));
                        }
                    }
                }
                if seen != want {
                    return Ok(Check::Pending(format!("groups {seen:?}, want {want:?}")));
                }
                if !unhealthy.is_empty() {
                    return Ok(Check::Pending(unhealthy.join("; ")));
                }
                Ok(Check::Done(()))
            }
        },
    )
    .await?;
    for query in alert_queries(&rules) {
        prom.query(&query.expr)
            .await
            .with_context(|| format!("evaluating {}", query.source))?;
    }
    // The situations of the scenario put the matching alerts in `pending` (their `for` is longer
    // than a test), and nothing reports the operator down or the scheduler stalled.
    let alerts = wait_until(
        "DrainFailed and MaintenanceOperatorErrors to be pending",
        MINUTE,
        || async move {
            let data = prom.api("alerts").await?;
            let alerts = data["alerts"].as_array().cloned().unwrap_or_default();
            let found = |name: &str, label: &str, value: &str| {
                alerts
                    .iter()
                    .any(|a| a["labels"]["alertname"] == name && a["labels"][label] == value)
            };
            Ok(
                if found("DrainFailed", "pdb", "guarded")
                    && found("MaintenanceOperatorErrors", "step", "node_step")
                {
                    Check::Done(alerts)
                } else {
                    Check::Pending(format!("alerts {alerts:?}"))
                },
            )
        },
    )
    .await?;
    for alert in &alerts {
        let name = alert["labels"]["alertname"].as_str().unwrap_or_default();
        ensure!(
            ![
                "MaintenanceOperatorDown",
                "MaintenanceOperatorNoLeader",
                "MaintenanceOperatorTwoLeaders",
                "SchedulerStalled"
            ]
            .contains(&name),
            "{name} is {} on a healthy operator: {alert}",
            alert["state"]
        );
    }
    Ok(())
}
