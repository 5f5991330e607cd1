//! The Helm chart (deploy/chart/maintenance-operator) and the plain manifests rendered from it.
//!
//! Static checks run `helm lint` and `helm template` (helm comes from deploy/install-helm.sh) and
//! inspect what is rendered. The e2e tests apply the rendered manifests to a real control plane
//! and run the operator with nothing but the chart's ServiceAccount token, so the ClusterRole and
//! Role are proven sufficient, and proven necessary by removing one verb.
//!
//! `MO_UPDATE_MANIFESTS=1 cargo test --test release helm_chart::` rewrites the generated files (the chart's
//! copy of the CRDs and deploy/manifests/maintenance-operator.yaml) instead of failing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplateSpec};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::chart::*;
use support::operator::Operator;
use support::*;

const NAMESPACE: &str = "maintenance-operator";
const NAME: &str = "maintenance-operator";
const RELEASE: &str = "maintenance-operator";
const MINUTE: Duration = Duration::from_secs(60);
const WEBHOOK_SERVICE: &str = "maintenance-operator-webhook";
const WEBHOOK_SECRET: &str = "maintenance-operator-webhook-cert";

// ---------------------------------------------------------------------------------------------
// Files and tools

fn updating() -> bool {
    std::env::var_os("MO_UPDATE_MANIFESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// helm, installed once per machine by deploy/install-helm.sh.
pub(crate) fn helm() -> Result<Command> {
    static HELM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let path = HELM.get_or_init(|| {
        run(&mut Command::new(repo().join("deploy/install-helm.sh")))
            .map(|out| PathBuf::from(out.trim()))
            .map_err(|e| format!("{e:#}"))
    });
    let path = path.as_ref().map_err(|e| anyhow!("installing helm: {e}"))?;
    Ok(Command::new(path))
}

/// `helm template` of the chart as the documentation shows it, plus `extra` arguments.
fn render_text(extra: &[&str]) -> Result<String> {
    run(helm()?
        .args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", NAMESPACE, "--include-crds"])
        .args(extra))
}

fn render(extra: &[&str]) -> Result<Vec<Value>> {
    parse_docs(&render_text(extra)?)
}

fn id(doc: &Value) -> (String, String, String) {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    (
        s(&doc["kind"]),
        s(&doc["metadata"]["namespace"]),
        s(&doc["metadata"]["name"]),
    )
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .ok_or_else(|| anyhow!("no {kind} {name} in the rendered chart"))
}

/// What the chart renders with default values, with a header for kubectl users. The admission
/// webhook is left out: its certificate would be generated into this file, and everyone who
/// applied it would share one private key (deploy/README.md shows how to add the webhook).
fn manifests_text() -> Result<String> {
    Ok(format!(
        "# maintenance-operator: the Helm chart deploy/chart/maintenance-operator rendered with its\n\
         # default values but without the admission webhook (webhook.enabled=false), for installing\n\
         # with kubectl (see deploy/README.md). Generated: do not edit; regenerate with\n\
         # `MO_UPDATE_MANIFESTS=1 cargo test --test release helm_chart::`.\n{}",
        render_text(&["--set", "webhook.enabled=false"])?
    ))
}

/// Compares a generated file with what it should hold, or rewrites it under MO_UPDATE_MANIFESTS.
fn check_generated(path: &Path, want: &str, from: &str) -> Result<()> {
    if updating() {
        std::fs::write(path, want).with_context(|| format!("writing {}", path.display()))?;
        return Ok(());
    }
    let have = read(path)?;
    if have != want {
        let line = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .map_or(have.lines().count().min(want.lines().count()) + 1, |i| {
                i + 1
            });
        bail!(
            "{} is out of date with {from} (first difference at line {line}); regenerate it with \
             `MO_UPDATE_MANIFESTS=1 cargo test --test release helm_chart::`",
            path.display()
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Static checks

#[test]
fn helm_lint_passes() -> Result<()> {
    run(helm()?.args(["lint", "--strict"]).arg(chart_dir()))?;
    // Every switch flipped away from its default renders too.
    run(helm()?.args(["lint", "--strict"]).arg(chart_dir()).args([
        "--set",
        "serviceMonitor.enabled=true,prometheusRule.enabled=true,namespace.create=false,\
             operatorConfig.create=false,podDisruptionBudget.enabled=false,\
             leaderElection.enabled=false,leaderElection.leaseNamespace=elsewhere,\
             replicaCount=1,priorityClassName=",
    ]))?;
    // Both sources of the webhook's certificate, and no webhook.
    for values in [
        "webhook.certManager.enabled=true",
        "webhook.certManager.enabled=false",
        "webhook.certManager.enabled=true,webhook.certManager.issuerRef.kind=ClusterIssuer,\
         webhook.certManager.issuerRef.name=company-ca",
        "webhook.enabled=false",
    ] {
        run(helm()?
            .args(["lint", "--strict"])
            .arg(chart_dir())
            .args(["--set", values]))?;
    }
    Ok(())
}

#[test]
fn default_render_holds_the_expected_objects() -> Result<()> {
    let docs = render(&[])?;
    let have: BTreeSet<(String, String, String)> = docs.iter().map(id).collect();
    ensure!(
        have.len() == docs.len(),
        "an object is rendered twice: {have:?}"
    );
    let s = |kind: &str, ns: &str, name: &str| (kind.to_string(), ns.to_string(), name.to_string());
    let want = BTreeSet::from([
        s(
            "CustomResourceDefinition",
            "",
            "nodemaintenances.maintenance.nvidia.com",
        ),
        s(
            "CustomResourceDefinition",
            "",
            "maintenanceoperatorconfigs.maintenance.nvidia.com",
        ),
        s("Namespace", "", NAMESPACE),
        s("ServiceAccount", NAMESPACE, NAME),
        s("ClusterRole", "", NAME),
        s("ClusterRoleBinding", "", NAME),
        s("ClusterRole", "", &format!("{NAME}-metrics-reader")),
        s("Role", NAMESPACE, NAME),
        s("RoleBinding", NAMESPACE, NAME),
        s("Service", NAMESPACE, NAME),
        s("Service", NAMESPACE, WEBHOOK_SERVICE),
        s("Secret", NAMESPACE, WEBHOOK_SECRET),
        s("ValidatingWebhookConfiguration", "", NAME),
        s("Deployment", NAMESPACE, NAME),
        s("PodDisruptionBudget", NAMESPACE, NAME),
        s("MaintenanceOperatorConfig", NAMESPACE, "default"),
    ]);
    ensure!(
        have == want,
        "rendered objects differ\n  extra: {:?}\n  missing: {:?}",
        have.difference(&want).collect::<Vec<_>>(),
        want.difference(&have).collect::<Vec<_>>()
    );

    // The release namespace is only the default: a value moves every namespaced object.
    let moved = render(&["--set", "namespace.name=ops"])?;
    for doc in &moved {
        let (kind, ns, name) = id(doc);
        if !ns.is_empty() {
            ensure!(ns == "ops", "{kind} {name} stayed in {ns}");
        }
    }
    ensure!(find(&moved, "Namespace", "ops").is_ok());
    let binding = find(&moved, "ClusterRoleBinding", NAME)?;
    ensure!(binding["subjects"][0]["namespace"] == "ops", "{binding}");
    Ok(())
}

#[test]
fn deployment_is_hardened_and_highly_available() -> Result<()> {
    let docs = render(&[])?;
    let deployment = find(&docs, "Deployment", NAME)?;
    let spec = &deployment["spec"];
    ensure!(spec["replicas"] == 2, "replicas {}", spec["replicas"]);
    let pod = &spec["template"]["spec"];
    let labels = &spec["template"]["metadata"]["labels"];
    ensure!(
        labels["app.kubernetes.io/name"] == NAME,
        "the operator recognises its own pods by app.kubernetes.io/name; labels {labels}"
    );
    // What a selector asks for, the pods carry.
    let selects_the_pods = |what: &str, selector: &Value| -> Result<()> {
        let selector = selector
            .as_object()
            .with_context(|| format!("{what}: no selector"))?;
        for (k, v) in selector {
            ensure!(
                &labels[k] == v,
                "{what} selects {k}={v}, the pods do not carry it"
            );
        }
        Ok(())
    };
    selects_the_pods("the Deployment", &spec["selector"]["matchLabels"])?;
    ensure!(pod["serviceAccountName"] == NAME);
    ensure!(pod["priorityClassName"] == "system-cluster-critical");

    let psc = &pod["securityContext"];
    ensure!(psc["runAsNonRoot"] == true, "pod securityContext {psc}");
    ensure!(psc["runAsUser"] == 65532, "pod securityContext {psc}");
    ensure!(
        psc["seccompProfile"]["type"] == "RuntimeDefault",
        "pod securityContext {psc}"
    );

    let tolerated: BTreeSet<&str> = pod["tolerations"]
        .as_array()
        .context("no tolerations")?
        .iter()
        .filter_map(|t| t["key"].as_str())
        .collect();
    for key in [
        "node-role.kubernetes.io/control-plane",
        "node-role.kubernetes.io/master",
    ] {
        ensure!(
            tolerated.contains(key),
            "no toleration for {key}: {tolerated:?}"
        );
    }

    let containers = pod["containers"].as_array().context("no containers")?;
    ensure!(containers.len() == 1, "{} containers", containers.len());
    let c = &containers[0];
    let sc = &c["securityContext"];
    ensure!(sc["readOnlyRootFilesystem"] == true, "securityContext {sc}");
    ensure!(
        sc["allowPrivilegeEscalation"] == false,
        "securityContext {sc}"
    );
    ensure!(
        sc["capabilities"]["drop"] == json!(["ALL"]),
        "securityContext {sc}"
    );
    ensure!(
        sc["capabilities"].get("add").is_none(),
        "securityContext {sc}"
    );

    let args: Vec<&str> = c["args"]
        .as_array()
        .context("no args")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    ensure!(args.first() == Some(&"run"), "args {args:?}");
    for want in [
        "--leader-elect",
        "--lease-name=maintenance-operator",
        "--metrics-addr=0.0.0.0:8443",
        "--health-addr=0.0.0.0:8081",
        // /metrics with the webhook's certificate, which names the metrics Service too.
        "--metrics-cert-file=/etc/maintenance-operator/webhook/tls.crt",
        "--metrics-key-file=/etc/maintenance-operator/webhook/tls.key",
    ] {
        ensure!(args.contains(&want), "args {args:?} lack {want}");
    }

    let env: BTreeMap<&str, &Value> = c["env"]
        .as_array()
        .context("no env")?
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?,
                &e["valueFrom"]["fieldRef"]["fieldPath"],
            ))
        })
        .collect();
    ensure!(
        env.get("POD_NAME") == Some(&&json!("metadata.name")),
        "env {env:?}"
    );
    ensure!(
        env.get("OPERATOR_NAMESPACE") == Some(&&json!("metadata.namespace")),
        "env {env:?}"
    );

    for kind in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            ensure!(
                c["resources"][kind][resource].is_string(),
                "no {kind}.{resource} in {}",
                c["resources"]
            );
        }
    }

    let port = c["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "metrics"))
        .context("no metrics port")?;
    ensure!(port["containerPort"] == 8443, "port {port}");
    ensure!(
        !args.contains(&"--metrics-insecure"),
        "/metrics must be secure by default: {args:?}"
    );
    let health = c["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "health"))
        .context("no health port")?;
    ensure!(health["containerPort"] == 8081, "port {health}");
    ensure!(c["livenessProbe"]["httpGet"]["path"] == "/healthz");
    ensure!(c["livenessProbe"]["httpGet"]["port"] == "health");
    ensure!(c["readinessProbe"]["httpGet"]["path"] == "/readyz");
    ensure!(c["readinessProbe"]["httpGet"]["port"] == "health");

    let service = find(&docs, "Service", NAME)?;
    selects_the_pods("the Service", &service["spec"]["selector"])?;
    ensure!(service["spec"]["ports"][0]["targetPort"] == "metrics");

    let namespace = find(&docs, "Namespace", NAMESPACE)?;
    ensure!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted",
        "{namespace}"
    );
    Ok(())
}

type Grant = (String, String, String, String);

/// Every (apiGroup, resource, verb, resourceName) a role grants; "" for "any name".
fn grants(role: &Value) -> Result<BTreeSet<Grant>> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().context("role without rules")? {
        ensure!(
            rule.get("nonResourceURLs").is_none(),
            "non-resource rule {rule}"
        );
        let names = match strings(&rule["resourceNames"]) {
            names if names.is_empty() => vec![String::new()],
            names => names,
        };
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    for name in &names {
                        let verb = verb.clone();
                        ensure!(
                            [&group, &resource, &verb, name].iter().all(|s| *s != "*"),
                            "wildcard in rule {rule}"
                        );
                        out.insert((group.clone(), resource.clone(), verb, name.clone()));
                    }
                }
            }
        }
    }
    Ok(out)
}

fn expand(list: &[(&str, &str, &[&str], &str)]) -> BTreeSet<Grant> {
    list.iter()
        .flat_map(|(group, resource, verbs, name)| {
            verbs.iter().map(move |verb| {
                (
                    group.to_string(),
                    resource.to_string(),
                    verb.to_string(),
                    name.to_string(),
                )
            })
        })
        .collect()
}

fn diff(have: &BTreeSet<Grant>, want: &BTreeSet<Grant>) -> String {
    format!(
        "granted but not needed: {:?}; needed but not granted: {:?}",
        have.difference(want).collect::<Vec<_>>(),
        want.difference(have).collect::<Vec<_>>()
    )
}

/// Exactly the calls the operator makes, cluster-wide.
fn cluster_grants() -> BTreeSet<Grant> {
    expand(&[
        (
            "maintenance.nvidia.com",
            "nodemaintenances",
            &["get", "list", "watch", "patch", "update", "delete"],
            "",
        ),
        (
            "maintenance.nvidia.com",
            "nodemaintenances/status",
            &["get", "patch", "update"],
            "",
        ),
        ("", "nodes", &["get", "list", "watch", "patch"], ""),
        ("", "pods", &["get", "list", "watch"], ""),
        ("", "pods/eviction", &["create"], ""),
        (
            "policy",
            "poddisruptionbudgets",
            &["get", "list", "watch"],
            "",
        ),
        ("events.k8s.io", "events", &["create", "patch"], ""),
        // OpenShift MachineConfigPool pausing: detection, a node's pool, the pause.
        ("config.openshift.io", "infrastructures", &["get"], ""),
        (
            "machineconfiguration.openshift.io",
            "machineconfigs",
            &["get"],
            "",
        ),
        (
            "machineconfiguration.openshift.io",
            "machineconfigpools",
            &["get", "patch"],
            "",
        ),
        // The secure /metrics: TokenReview and SubjectAccessReview of each scraper.
        ("authentication.k8s.io", "tokenreviews", &["create"], ""),
        (
            "authorization.k8s.io",
            "subjectaccessreviews",
            &["create"],
            "",
        ),
    ])
}

/// In the operator's namespace: its config and its Lease.
fn namespace_grants() -> BTreeSet<Grant> {
    expand(&[
        (
            "maintenance.nvidia.com",
            "maintenanceoperatorconfigs",
            &["get", "list", "watch"],
            "default",
        ),
        // The Secrets of notification receivers (spec.notifications[].secretRef).
        ("", "secrets", &["get"], ""),
        ("coordination.k8s.io", "leases", &["create"], ""),
        (
            "coordination.k8s.io",
            "leases",
            &["get", "update"],
            "maintenance-operator",
        ),
    ])
}

#[test]
fn rbac_is_exactly_what_the_operator_uses() -> Result<()> {
    let docs = render(&[])?;
    let have = grants(find(&docs, "ClusterRole", NAME)?)?;
    let want = cluster_grants();
    ensure!(have == want, "ClusterRole: {}", diff(&have, &want));
    let have = grants(find(&docs, "Role", NAME)?)?;
    let want = namespace_grants();
    ensure!(have == want, "Role: {}", diff(&have, &want));

    for (kind, role_kind) in [
        ("ClusterRoleBinding", "ClusterRole"),
        ("RoleBinding", "Role"),
    ] {
        let binding = find(&docs, kind, NAME)?;
        ensure!(
            binding["roleRef"]
                == json!({"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": NAME}),
            "{kind} roleRef {}",
            binding["roleRef"]
        );
        ensure!(
            binding["subjects"]
                == json!([{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]),
            "{kind} subjects {}",
            binding["subjects"]
        );
    }
    // No other object grants anything.
    let roles = docs
        .iter()
        .filter(|d| d["kind"].as_str().is_some_and(|k| k.contains("Role")))
        .count();
    // The metrics-reader ClusterRole grants `get /metrics` and nothing else, to no one until
    // rbac.metricsReaderSubjects names someone.
    let reader = find(&docs, "ClusterRole", &format!("{NAME}-metrics-reader"))?;
    ensure!(
        reader["rules"] == json!([{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]),
        "metrics-reader rules {}",
        reader["rules"]
    );
    ensure!(roles == 5, "{roles} roles and bindings rendered, want 5");
    Ok(())
}

/// `drainSpec.forceDeleteAfterSeconds` needs `delete` on pods: granted only on request, and then
/// that alone.
#[test]
fn rbac_force_delete_adds_only_the_deletion_of_pods() -> Result<()> {
    let docs = render(&["--set", "rbac.forceDelete=true"])?;
    let have = grants(find(&docs, "ClusterRole", NAME)?)?;
    let mut want = cluster_grants();
    want.extend(expand(&[("", "pods", &["delete"], "")]));
    ensure!(have == want, "ClusterRole: {}", diff(&have, &want));
    Ok(())
}

/// The Lease calls of leader election, on the Lease named `name`.
fn lease_grants(name: &str) -> BTreeSet<Grant> {
    expand(&[
        ("coordination.k8s.io", "leases", &["create"], ""),
        ("coordination.k8s.io", "leases", &["get", "update"], name),
    ])
}

/// Migrating from NVIDIA's operator, ours competes for NVIDIA's Lease in NVIDIA's namespace: a
/// Role there grants exactly the Lease calls, and the Role of the operator's namespace no longer
/// grants any.
#[test]
fn a_lease_in_another_namespace_gets_a_role_of_its_own() -> Result<()> {
    const LEASE_NS: &str = "nvidia-maintenance";
    const LEASE: &str = "a9620a8f.nvidia.com";
    let args_of =
        |docs: &[Value]| -> Result<Vec<String>> {
            Ok(find(docs, "Deployment", NAME)?["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .context("no args")?
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect())
        };
    let default_args = args_of(&render(&[])?)?;
    ensure!(
        !default_args
            .iter()
            .any(|a| a.starts_with("--lease-namespace")),
        "by default the Lease is in the operator's namespace: {default_args:?}"
    );

    let docs = render(&[
        "--set",
        &format!("leaderElection.leaseNamespace={LEASE_NS},leaderElection.leaseName={LEASE}"),
    ])?;
    let args = args_of(&docs)?;
    for want in [
        format!("--lease-namespace={LEASE_NS}"),
        format!("--lease-name={LEASE}"),
    ] {
        ensure!(args.contains(&want), "args {args:?} lack {want}");
    }
    let own = grants(find(&docs, "Role", NAME)?)?;
    let want: BTreeSet<Grant> = namespace_grants()
        .difference(&lease_grants("maintenance-operator"))
        .cloned()
        .collect();
    ensure!(own == want, "Role {NAME}: {}", diff(&own, &want));

    let lease_name = format!("{NAME}-lease");
    let role = find(&docs, "Role", &lease_name)?;
    ensure!(role["metadata"]["namespace"] == LEASE_NS, "{role}");
    let have = grants(role)?;
    ensure!(
        have == lease_grants(LEASE),
        "Role {lease_name}: {}",
        diff(&have, &lease_grants(LEASE))
    );
    let binding = find(&docs, "RoleBinding", &lease_name)?;
    ensure!(binding["metadata"]["namespace"] == LEASE_NS, "{binding}");
    ensure!(
        binding["roleRef"]
            == json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": lease_name}),
        "roleRef {}",
        binding["roleRef"]
    );
    ensure!(
        binding["subjects"]
            == json!([{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]),
        "subjects {}",
        binding["subjects"]
    );

    // Naming the operator's own namespace changes nothing.
    let same = render(&[
        "--set",
        &format!("leaderElection.leaseNamespace={NAMESPACE}"),
    ])?;
    let have = grants(find(&same, "Role", NAME)?)?;
    ensure!(
        have == namespace_grants(),
        "Role: {}",
        diff(&have, &namespace_grants())
    );
    ensure!(find(&same, "Role", &lease_name).is_err());
    Ok(())
}

/// The MaintenanceOperatorConfig spec fields the CRD defines.
fn config_crd_fields() -> Result<BTreeSet<String>> {
    let crds = parse_docs(&read(&repo().join("crds/crds.yaml"))?)?;
    let crd = find(
        &crds,
        "CustomResourceDefinition",
        "maintenanceoperatorconfigs.maintenance.nvidia.com",
    )?;
    let props = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    Ok(props
        .as_object()
        .context("the config CRD has no spec properties")?
        .keys()
        .cloned()
        .collect())
}

#[test]
fn operator_config_renders_every_field() -> Result<()> {
    let fields = config_crd_fields()?;
    let values: Value = serde_norway::from_str(&read(&chart_dir().join("values.yaml"))?)?;
    let documented: BTreeSet<String> = values["operatorConfig"]
        .as_object()
        .context("values.yaml has no operatorConfig")?
        .keys()
        .filter(|k| *k != "create")
        .cloned()
        .collect();
    ensure!(
        documented == fields,
        "values.yaml operatorConfig has {documented:?}, the CRD {fields:?}"
    );

    let docs = render(&[])?;
    let config = find(&docs, "MaintenanceOperatorConfig", "default")?;
    ensure!(config["metadata"]["namespace"] == NAMESPACE);
    ensure!(
        config["spec"]
            == json!({
                "maxParallelOperations": 1,
                "logLevel": "info",
                "maxNodeMaintenanceTimeSeconds": 3600,
                "evictionsPerSecond": 50,
                "evictionBurst": 100,
            }),
        "default spec {}",
        config["spec"]
    );

    // 0 is a limit, not "unset"; percentages stay strings.
    let docs = render(&[
        "--set",
        "operatorConfig.maxUnavailable=0,operatorConfig.logLevel=debug",
        "--set-string",
        "operatorConfig.maxParallelOperations=10%",
    ])?;
    let spec = &find(&docs, "MaintenanceOperatorConfig", "default")?["spec"];
    ensure!(spec["maxUnavailable"] == 0, "spec {spec}");
    ensure!(spec["maxParallelOperations"] == "10%", "spec {spec}");
    ensure!(spec["logLevel"] == "debug", "spec {spec}");

    let docs = render(&["--set", "operatorConfig.create=false"])?;
    ensure!(find(&docs, "MaintenanceOperatorConfig", "default").is_err());
    Ok(())
}

#[test]
fn monitoring_objects_are_switchable() -> Result<()> {
    let docs = render(&[
        "--set",
        "serviceMonitor.enabled=true,prometheusRule.enabled=true",
    ])?;
    let monitor = find(&docs, "ServiceMonitor", NAME)?;
    let endpoint = &monitor["spec"]["endpoints"][0];
    ensure!(endpoint["port"] == "metrics", "{monitor}");
    // Over TLS, verified against the webhook's CA (whose certificate names the metrics Service),
    // with Prometheus's ServiceAccount token.
    ensure!(endpoint["scheme"] == "https", "{endpoint}");
    ensure!(
        endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "{endpoint}"
    );
    ensure!(
        endpoint["tlsConfig"]
            == json!({
                "serverName": format!("{NAME}.{NAMESPACE}.svc"),
                "ca": {"secret": {"name": WEBHOOK_SECRET, "key": "ca.crt"}},
            }),
        "{endpoint}"
    );
    // Without the webhook: a self-signed certificate made at start, nothing to verify against.
    let plain = render(&["--set", "serviceMonitor.enabled=true,webhook.enabled=false"])?;
    let endpoint = &find(&plain, "ServiceMonitor", NAME)?["spec"]["endpoints"][0];
    ensure!(
        endpoint["tlsConfig"] == json!({"insecureSkipVerify": true}),
        "{endpoint}"
    );
    let insecure = render(&["--set", "serviceMonitor.enabled=true,metricsInsecure=true"])?;
    let endpoint = &find(&insecure, "ServiceMonitor", NAME)?["spec"]["endpoints"][0];
    ensure!(
        endpoint.get("scheme").is_none() && endpoint.get("tlsConfig").is_none(),
        "{endpoint}"
    );
    let service = find(&docs, "Service", NAME)?;
    ensure!(
        monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .context("ServiceMonitor without selector")?
            .iter()
            .all(|(k, v)| &service["metadata"]["labels"][k] == v),
        "the ServiceMonitor does not select the Service"
    );

    // The rules are grafana/alerts.yaml itself, read by the chart through its files/grafana link.
    let rule = find(&docs, "PrometheusRule", NAME)?;
    let alerts: Value = serde_norway::from_str(&read(&repo().join("grafana/alerts.yaml"))?)?;
    ensure!(
        alerts["groups"].as_array().is_some_and(|g| !g.is_empty()),
        "grafana/alerts.yaml holds no rule groups"
    );
    ensure!(
        rule["spec"]["groups"] == alerts["groups"],
        "the PrometheusRule differs from grafana/alerts.yaml"
    );
    let link = chart_dir().join("files/grafana");
    ensure!(
        std::fs::symlink_metadata(&link)?.file_type().is_symlink(),
        "{} should link to the repository's grafana/, not copy it",
        link.display()
    );

    let docs = render(&[])?;
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        ensure!(
            !docs.iter().any(|d| d["kind"] == kind),
            "{kind} rendered by default"
        );
    }
    Ok(())
}

/// The container port named `name` of the operator's Deployment.
fn container_port(docs: &[Value], name: &str) -> Result<Value> {
    operator_container(docs)?["ports"]
        .as_array()
        .and_then(|ports| ports.iter().find(|p| p["name"] == name))
        .map(|p| p["containerPort"].clone())
        .with_context(|| format!("the operator's container has no port {name}"))
}

/// The NetworkPolicy (off by default) selects the operator's pods and admits ingress only on the
/// webhook port, from anywhere, and on the metrics port, from the chosen namespaces; the API
/// server's validation accepts it. Whether a CNI enforces it is not tested: the testbed has none
/// that implements NetworkPolicy.
#[tokio::test]
async fn network_policy_admits_only_the_webhook_and_the_metrics_port() -> Result<()> {
    ensure!(
        !render(&[])?.iter().any(|d| d["kind"] == "NetworkPolicy"),
        "a NetworkPolicy is rendered by default"
    );
    let docs = render(&[
        "--set",
        "networkPolicy.enabled=true,networkPolicy.metrics.podSelector.app=prometheus",
    ])?;
    let policy = find(&docs, "NetworkPolicy", NAME)?;
    let deployment = find(&docs, "Deployment", NAME)?;
    ensure!(
        policy["spec"]["podSelector"]["matchLabels"]
            == deployment["spec"]["selector"]["matchLabels"],
        "the policy does not select the operator's pods: {policy}"
    );
    ensure!(
        policy["spec"]["policyTypes"] == json!(["Ingress"]),
        "egress must stay open (the API server): {policy}"
    );
    let webhook = json!({
        "ports": [{ "protocol": "TCP", "port": container_port(&docs, "webhook")? }],
    });
    let metrics = json!({
        "from": [{
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": "monitoring" } },
            "podSelector": { "app": "prometheus" },
        }],
        "ports": [{ "protocol": "TCP", "port": container_port(&docs, "metrics")? }],
    });
    ensure!(
        policy["spec"]["ingress"] == json!([webhook, metrics]),
        "ingress rules: {}",
        policy["spec"]["ingress"]
    );

    // Without the webhook, only the metrics port is open.
    let no_webhook = render(&["--set", "networkPolicy.enabled=true,webhook.enabled=false"])?;
    let rules = &find(&no_webhook, "NetworkPolicy", NAME)?["spec"]["ingress"];
    ensure!(
        rules.as_array().map(Vec::len) == Some(1) && rules[0]["ports"] == metrics["ports"],
        "ingress rules without the webhook: {rules}"
    );

    // The API server validates it (a dry run in a namespace of its own).
    let client = Testbed::shared().await?.client().await?;
    let ns = unique_name("netpol");
    create_namespace(&client, &ns).await?;
    let mut object: NetworkPolicy = serde_json::from_value(policy.clone())?;
    object.metadata.namespace = Some(ns.clone());
    Api::<NetworkPolicy>::namespaced(client, &ns)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &object,
        )
        .await
        .context("the API server refused the chart's NetworkPolicy")?;
    Ok(())
}

#[test]
fn chart_crds_equal_the_generated_crds() -> Result<()> {
    check_generated(
        &chart_dir().join("crds/crds.yaml"),
        &read(&repo().join("crds/crds.yaml"))?,
        "crds/crds.yaml",
    )
}

#[test]
fn checked_in_manifests_are_up_to_date() -> Result<()> {
    check_generated(&manifests_path(), &manifests_text()?, "the chart")
}

// ---------------------------------------------------------------------------------------------
// The admission webhook

const WEBHOOK_PATH: &str = "/validate-maintenance-nvidia-com-v1alpha1-nodemaintenance";
const CONFIG_WEBHOOK_PATH: &str =
    "/validate-maintenance-nvidia-com-v1alpha1-maintenanceoperatorconfig";
const WEBHOOK_MOUNT: &str = "/etc/maintenance-operator/webhook";

fn operator_container(docs: &[Value]) -> Result<&Value> {
    Ok(&find(docs, "Deployment", NAME)?["spec"]["template"]["spec"]["containers"][0])
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The webhooks of the chart's registration: NodeMaintenance's (NVIDIA's), then the config's.
fn webhook_entries(docs: &[Value]) -> Result<(&Value, &Value)> {
    let config = find(docs, "ValidatingWebhookConfiguration", NAME)?;
    let hooks = config["webhooks"]
        .as_array()
        .context("a registration without webhooks")?;
    ensure!(hooks.len() == 2, "{} webhooks registered", hooks.len());
    Ok((&hooks[0], &hooks[1]))
}

/// The NodeMaintenance webhook of the chart's registration.
fn webhook_entry(docs: &[Value]) -> Result<&Value> {
    Ok(webhook_entries(docs)?.0)
}

/// The config's webhook: same Service, its own path, `Ignore` so that a config can be fixed
/// while the operator is down, only CREATE and spec changes.
fn check_config_webhook(docs: &[Value]) -> Result<()> {
    let (nodes, hook) = webhook_entries(docs)?;
    ensure!(
        hook["name"] == "vmaintenanceoperatorconfig.maintenance.nvidia.com",
        "{hook}"
    );
    ensure!(
        hook["clientConfig"]["service"]
            == json!({
                "name": WEBHOOK_SERVICE, "namespace": NAMESPACE, "path": CONFIG_WEBHOOK_PATH, "port": 443,
            }),
        "{hook}"
    );
    ensure!(
        hook["clientConfig"].get("caBundle") == nodes["clientConfig"].get("caBundle"),
        "both webhooks trust the same CA: {hook}"
    );
    ensure!(hook["failurePolicy"] == "Ignore", "{hook}");
    ensure!(hook["sideEffects"] == "None", "{hook}");
    ensure!(
        hook["rules"][0]["resources"] == json!(["maintenanceoperatorconfigs"])
            && hook["rules"][0]["operations"] == json!(["CREATE", "UPDATE"]),
        "{hook}"
    );
    ensure!(
        hook["matchConditions"] == nodes["matchConditions"],
        "metadata-only updates must not depend on the webhook: {hook}"
    );
    Ok(())
}

/// What both certificate sources share: NVIDIA's name and path, CREATE and UPDATE of
/// nodemaintenances, a Service that reaches the pods' webhook port, and a Deployment that
/// serves it from the mounted Secret.
fn check_webhook_wiring(docs: &[Value]) -> Result<()> {
    check_config_webhook(docs)?;
    let hook = webhook_entry(docs)?;
    ensure!(hook["name"] == "vnodemaintenance.kb.io", "{hook}");
    ensure!(
        hook["clientConfig"]["service"]
            == json!({
                "name": WEBHOOK_SERVICE, "namespace": NAMESPACE, "path": WEBHOOK_PATH, "port": 443,
            }),
        "{hook}"
    );
    ensure!(hook["clientConfig"].get("url").is_none(), "{hook}");
    ensure!(hook["failurePolicy"] == "Fail", "{hook}");
    ensure!(hook["sideEffects"] == "None", "{hook}");
    ensure!(hook["admissionReviewVersions"] == json!(["v1"]), "{hook}");
    ensure!(hook["timeoutSeconds"] == 10, "{hook}");
    ensure!(
        hook["rules"]
            == json!([{
                "apiGroups": ["maintenance.nvidia.com"],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["nodemaintenances"],
                "scope": "Namespaced",
            }]),
        "{hook}"
    );
    ensure!(
        hook["matchConditions"][0]["expression"]
            == "request.operation == 'CREATE' || object.spec != oldObject.spec",
        "metadata-only updates must not depend on the webhook: {hook}"
    );

    let deployment = find(docs, "Deployment", NAME)?;
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let service = find(docs, "Service", WEBHOOK_SERVICE)?;
    for (k, v) in service["spec"]["selector"]
        .as_object()
        .context("the webhook Service has no selector")?
    {
        ensure!(&labels[k] == v, "the webhook Service selects {k}={v}");
    }
    ensure!(
        service["spec"]["ports"]
            == json!([{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]),
        "{service}"
    );

    let c = operator_container(docs)?;
    ensure!(
        c["ports"].as_array().is_some_and(|ps| ps
            .iter()
            .any(|p| p["name"] == "webhook" && p["containerPort"] == 9443)),
        "no webhook port 9443: {}",
        c["ports"]
    );
    let args = strings(&c["args"]);
    for want in [
        "--webhook-addr=0.0.0.0:9443".to_string(),
        format!("--webhook-cert-file={WEBHOOK_MOUNT}/tls.crt"),
        format!("--webhook-key-file={WEBHOOK_MOUNT}/tls.key"),
    ] {
        ensure!(args.contains(&want.as_str()), "args {args:?} lack {want}");
    }
    ensure!(
        c["volumeMounts"]
            == json!([{"name": "webhook-cert", "mountPath": WEBHOOK_MOUNT, "readOnly": true}]),
        "{}",
        c["volumeMounts"]
    );
    let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
    ensure!(
        volumes == &json!([{"name": "webhook-cert", "secret": {"secretName": WEBHOOK_SECRET}}]),
        "{volumes}"
    );
    // Readiness does not wait for the webhook.
    ensure!(c["readinessProbe"]["httpGet"]["path"] == "/readyz");
    Ok(())
}

/// Decodes a base64 Secret or caBundle value.
fn base64(value: &Value) -> Result<Vec<u8>> {
    let bytes: k8s_openapi::ByteString =
        serde_json::from_value(value.clone()).with_context(|| format!("base64 {value}"))?;
    Ok(bytes.0)
}

/// Checks, as the API server will, that `cert` is a serving certificate for `dns_name` issued by
/// `ca`, and that `key` is its private key.
fn verify_serving_certificate(ca: &[u8], cert: &[u8], key: &[u8], dns_name: &str) -> Result<()> {
    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca).context("the caBundle is no PEM certificate")?)?;
    let verifier =
        WebPkiServerVerifier::builder_with_provider(std::sync::Arc::new(roots), provider.clone())
            .build()?;
    let leaf = CertificateDer::from_pem_slice(cert).context("tls.crt is no PEM certificate")?;
    verifier
        .verify_server_cert(
            &leaf,
            &[],
            &ServerName::try_from(dns_name.to_string())?,
            &[],
            UnixTime::now(),
        )
        .with_context(|| format!("tls.crt is not valid for {dns_name} under the caBundle"))?;
    let key = PrivateKeyDer::from_pem_slice(key).context("tls.key is no PEM private key")?;
    rustls::sign::CertifiedKey::from_der(vec![leaf], key, &provider)
        .context("tls.key does not belong to tls.crt")?;
    Ok(())
}

fn cert_manager_objects(docs: &[Value]) -> Vec<(String, String, String)> {
    docs.iter()
        .filter(|d| {
            d["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("cert-manager.io/"))
        })
        .map(id)
        .collect()
}

#[test]
fn webhook_certificate_generated_by_helm() -> Result<()> {
    // `auto` without cert-manager in the cluster, and `false`.
    for extra in [&[][..], &["--set", "webhook.certManager.enabled=false"]] {
        let docs = render(extra)?;
        check_webhook_wiring(&docs)?;
        let managed = cert_manager_objects(&docs);
        ensure!(
            managed.is_empty(),
            "cert-manager objects rendered: {managed:?}"
        );
        let config = find(&docs, "ValidatingWebhookConfiguration", NAME)?;
        ensure!(
            config["metadata"].get("annotations").is_none(),
            "{}",
            config["metadata"]
        );

        let secret = find(&docs, "Secret", WEBHOOK_SECRET)?;
        ensure!(secret["type"] == "kubernetes.io/tls", "{}", secret["type"]);
        let data = &secret["data"];
        let hook = webhook_entry(&docs)?;
        ensure!(
            hook["clientConfig"]["caBundle"] == data["ca.crt"],
            "the caBundle is not the Secret's CA"
        );
        verify_serving_certificate(
            &base64(&data["ca.crt"])?,
            &base64(&data["tls.crt"])?,
            &base64(&data["tls.key"])?,
            &format!("{WEBHOOK_SERVICE}.{NAMESPACE}.svc"),
        )?;
        // /metrics is served with the same certificate: it names the metrics Service too.
        verify_serving_certificate(
            &base64(&data["ca.crt"])?,
            &base64(&data["tls.crt"])?,
            &base64(&data["tls.key"])?,
            &format!("{NAME}.{NAMESPACE}.svc"),
        )?;
    }
    Ok(())
}

#[test]
fn webhook_certificate_from_cert_manager() -> Result<()> {
    // `true`, and `auto` in a cluster that serves cert-manager.io/v1.
    for extra in [
        &["--set", "webhook.certManager.enabled=true"][..],
        &["--api-versions", "cert-manager.io/v1"],
    ] {
        let docs = render(extra)?;
        check_webhook_wiring(&docs)?;
        ensure!(
            find(&docs, "Secret", WEBHOOK_SECRET).is_err(),
            "cert-manager writes the Secret; the chart must not"
        );
        let config = find(&docs, "ValidatingWebhookConfiguration", NAME)?;
        ensure!(
            config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
                == format!("{NAMESPACE}/{WEBHOOK_SERVICE}"),
            "{}",
            config["metadata"]
        );
        let hook = webhook_entry(&docs)?;
        ensure!(
            hook["clientConfig"].get("caBundle").is_none(),
            "the cainjector fills the caBundle: {hook}"
        );

        let serving = find(&docs, "Certificate", WEBHOOK_SERVICE)?;
        let spec = &serving["spec"];
        ensure!(spec["secretName"] == WEBHOOK_SECRET, "{spec}");
        // The webhook's Service, and the metrics Service (/metrics uses this certificate too).
        for service in [WEBHOOK_SERVICE, NAME] {
            ensure!(
                strings(&spec["dnsNames"]).contains(&format!("{service}.{NAMESPACE}.svc").as_str()),
                "{spec}"
            );
        }
        ensure!(strings(&spec["usages"]).contains(&"server auth"), "{spec}");
        // Issued by a CA of the chart's own (renewals keep it), rooted in a self-signed Issuer.
        let ca_issuer_name = spec["issuerRef"]["name"].as_str().context("no issuerRef")?;
        ensure!(spec["issuerRef"]["kind"] == "Issuer", "{spec}");
        let ca_issuer = find(&docs, "Issuer", ca_issuer_name)?;
        let ca_secret = &ca_issuer["spec"]["ca"]["secretName"];
        let ca = docs
            .iter()
            .find(|d| d["kind"] == "Certificate" && &d["spec"]["secretName"] == ca_secret)
            .context("no Certificate writes the CA Issuer's Secret")?;
        ensure!(ca["spec"]["isCA"] == true, "{ca}");
        let root_name = ca["spec"]["issuerRef"]["name"]
            .as_str()
            .context("no issuerRef")?;
        let root = find(&docs, "Issuer", root_name)?;
        ensure!(root["spec"]["selfSigned"] == json!({}), "{root}");
    }

    // A CA issuer of the company's replaces the chart's own.
    let docs = render(&[
        "--set",
        "webhook.certManager.enabled=true,webhook.certManager.issuerRef.kind=ClusterIssuer,\
         webhook.certManager.issuerRef.name=company-ca",
    ])?;
    check_webhook_wiring(&docs)?;
    let serving = find(&docs, "Certificate", WEBHOOK_SERVICE)?;
    ensure!(
        serving["spec"]["issuerRef"] == json!({"kind": "ClusterIssuer", "name": "company-ca"}),
        "{serving}"
    );
    let managed = cert_manager_objects(&docs);
    ensure!(
        managed.len() == 1,
        "only the serving Certificate is wanted: {managed:?}"
    );
    Ok(())
}

#[test]
fn webhook_can_be_turned_off_and_tuned() -> Result<()> {
    let docs = render(&["--set", "webhook.enabled=false"])?;
    for (kind, name) in [
        ("ValidatingWebhookConfiguration", NAME),
        ("Service", WEBHOOK_SERVICE),
        ("Secret", WEBHOOK_SECRET),
    ] {
        ensure!(find(&docs, kind, name).is_err(), "{kind} {name} rendered");
    }
    ensure!(cert_manager_objects(&docs).is_empty());
    let c = operator_container(&docs)?;
    let args = strings(&c["args"]);
    ensure!(
        !args.iter().any(|a| a.starts_with("--webhook")),
        "args {args:?}"
    );
    ensure!(c.get("volumeMounts").is_none(), "{c}");

    let docs = render(&[
        "--set",
        "webhook.failurePolicy=Ignore,webhook.timeoutSeconds=5,webhook.port=10443",
    ])?;
    let hook = webhook_entry(&docs)?;
    ensure!(hook["failurePolicy"] == "Ignore", "{hook}");
    ensure!(hook["timeoutSeconds"] == 5, "{hook}");
    let args = strings(&operator_container(&docs)?["args"]);
    ensure!(
        args.contains(&"--webhook-addr=0.0.0.0:10443"),
        "args {args:?}"
    );

    let err = render(&["--set", "webhook.certManager.enabled=yes"])
        .err()
        .context("webhook.certManager.enabled=yes rendered")?;
    ensure!(
        format!("{err:#}").contains("set true, false or auto"),
        "{err:#}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// e2e on the testbed

#[tokio::test]
async fn rendered_manifests_apply_to_a_real_control_plane() -> Result<()> {
    let chart = ChartOnTestbed::install().await?;
    let (testbed, client, dir, docs) = (chart.testbed, &chart.client, &chart.dir, &chart.docs);

    // Every object is there as applied.
    let listed: Value = serde_json::from_str(&run(kubectl(testbed)
        .args(["get", "-o", "json", "-f"])
        .arg(dir.path().join("maintenance-operator.yaml")))?)?;
    let have: BTreeSet<_> = listed["items"]
        .as_array()
        .context("kubectl get returned no items")?
        .iter()
        .map(id)
        .collect();
    let want: BTreeSet<_> = docs.iter().map(id).collect();
    ensure!(
        have == want,
        "objects missing after apply: {:?}",
        want.difference(&have).collect::<Vec<_>>()
    );

    let configs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &config_resource());
    let config = configs.get("default").await.context("the default config")?;
    ensure!(
        config.data["spec"]["maxParallelOperations"] == 1,
        "stored config {:?}",
        config.data
    );
    let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get(NAME)
        .await?;
    ensure!(
        deployment.spec.replicas == Some(0),
        "the Deployment was applied with replicas {:?}, want 0",
        deployment.spec.replicas
    );

    // The pod the Deployment would make passes admission: the ServiceAccount and priority class
    // exist, and the namespace's `restricted` Pod Security level accepts it.
    let template: PodTemplateSpec =
        serde_json::from_value(find(docs, "Deployment", NAME)?["spec"]["template"].clone())?;
    let mut pod = Pod {
        metadata: template.metadata.unwrap_or_default(),
        spec: template.spec,
        ..Default::default()
    };
    pod.metadata.name = Some("admission-check".into());
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &pod,
        )
        .await
        .context("the operator's pod was refused")?;
    Ok(())
}

/// Helm's generated webhook certificate survives an upgrade: with the cluster in reach, the chart
/// reads the Secret it made before (`lookup`) instead of generating a new CA, which would break
/// the registration's trust in the pods still serving the old certificate.
#[tokio::test]
async fn generated_webhook_certificate_is_kept_across_upgrades() -> Result<()> {
    let _one = chart_turn().await;
    let testbed = Testbed::shared().await?;
    let client = testbed.client().await?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    if namespaces.get_opt(NAMESPACE).await?.is_none() {
        create_namespace(&client, NAMESPACE).await?;
    }
    let kubeconfig = testbed.kubeconfig_path().to_string_lossy().into_owned();
    // What `helm install` and `helm upgrade` render: lookup sees the cluster.
    let render_live = || {
        render(&[
            "--dry-run=server",
            "--kubeconfig",
            &kubeconfig,
            "--show-only",
            "templates/webhook.yaml",
        ])
    };
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), NAMESPACE);
    let _ = secrets
        .delete(WEBHOOK_SECRET, &DeleteParams::default())
        .await;

    let first = render_live()?;
    let secret = find(&first, "Secret", WEBHOOK_SECRET)?;
    // Only the Secret: a registration without a serving pod would refuse other tests' requests.
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(secret.clone())?,
        )
        .await
        .context("creating the generated Secret")?;
    let result = async {
        let second = render_live()?;
        ensure!(
            find(&second, "Secret", WEBHOOK_SECRET)?["data"] == secret["data"],
            "a second render generated a new certificate although the Secret exists"
        );
        ensure!(
            webhook_entry(&second)?["clientConfig"]["caBundle"] == secret["data"]["ca.crt"],
            "the registration does not trust the kept CA"
        );
        // A Secret of an older chart, whose certificate was made for other names (before
        // /metrics used it): made anew, for the names of today.
        let stale = json!({"metadata": {"annotations": {
            "maintenance.nvidia.com/certificate-dns-names": format!("{WEBHOOK_SERVICE}.{NAMESPACE}.svc"),
        }}});
        secrets
            .patch(WEBHOOK_SECRET, &PatchParams::default(), &Patch::Merge(&stale))
            .await?;
        let upgraded = render_live()?;
        let renewed = &find(&upgraded, "Secret", WEBHOOK_SECRET)?["data"];
        ensure!(
            renewed["ca.crt"] != secret["data"]["ca.crt"],
            "the certificate of an older chart was kept"
        );
        verify_serving_certificate(
            &base64(&renewed["ca.crt"])?,
            &base64(&renewed["tls.crt"])?,
            &base64(&renewed["tls.key"])?,
            &format!("{NAME}.{NAMESPACE}.svc"),
        )?;
        // Without the Secret (say, deleted to renew), a new certificate is generated.
        secrets
            .delete(WEBHOOK_SECRET, &DeleteParams::default())
            .await?;
        let third = render_live()?;
        ensure!(
            find(&third, "Secret", WEBHOOK_SECRET)?["data"]["ca.crt"] != secret["data"]["ca.crt"],
            "the CA was not renewed after the Secret was deleted"
        );
        Ok(())
    }
    .await;
    let _ = secrets
        .delete(WEBHOOK_SECRET, &DeleteParams::default())
        .await;
    result
}

/// The last lines of the operator's log, for a failure message.
fn log_tail(operator: &Operator) -> String {
    let text = std::fs::read_to_string(&operator.log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Sum of the samples of a metric whose labels contain `label`.
async fn metric_sum(operator: &Operator, name: &str, label: &str) -> Result<f64> {
    let prefix = format!("{name}{{");
    Ok(operator
        .metrics()
        .await?
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum())
}

/// The Ready condition of a NodeMaintenance as (status, reason).
fn ready_condition(request: &DynamicObject) -> Option<(String, String)> {
    request.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
            )
        })
}

fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Names of the pods of `ns` bound to `node`, terminating or not.
async fn pods_on(client: &kube::Client, ns: &str, node: &str) -> Result<Vec<String>> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect())
}

/// NodeMaintenances of one namespace, written as a requestor with kubectl would.
struct Requests {
    client: kube::Client,
    api: Api<DynamicObject>,
    nodes: Api<Node>,
    ns: String,
}

impl Requests {
    async fn create(&self, name: &str, node: &str) -> Result<()> {
        let mut request = DynamicObject::new(name, &request_resource());
        request.data = json!({"spec": {
            "requestorID": "helm-chart-test.maintenance.nvidia.com",
            "nodeName": node,
            "drainSpec": {"force": true},
        }});
        self.api
            .create(&PostParams::default(), &request)
            .await
            .with_context(|| format!("creating NodeMaintenance {name} for {node}"))?;
        Ok(())
    }

    /// Ready=True with reason Ready, the node cordoned and its pods gone.
    async fn wait_ready(&self, name: &str, node: &str, timeout: Duration) -> Result<()> {
        wait_until(
            &format!("NodeMaintenance {name} to be Ready"),
            timeout,
            || async move {
                let request = self.api.get(name).await?;
                Ok(match ready_condition(&request) {
                    Some((status, reason)) if status == "True" && reason == "Ready" => {
                        Check::Done(())
                    }
                    other => Check::Pending(format!(
                        "Ready condition {other:?}; status {}; pods on {node}: {:?}",
                        request.data["status"],
                        pods_on(&self.client, &self.ns, node).await?
                    )),
                })
            },
        )
        .await?;
        ensure!(
            unschedulable(&self.nodes.get(node).await?),
            "{node} is not cordoned although its maintenance is Ready"
        );
        let left = pods_on(&self.client, &self.ns, node).await?;
        ensure!(
            left.is_empty(),
            "{node} still runs {left:?} although its maintenance is Ready"
        );
        Ok(())
    }

    /// Deletes the request; waits until it is gone and the node schedulable again.
    async fn release(&self, name: &str, node: &str) -> Result<()> {
        self.api.delete(name, &DeleteParams::default()).await?;
        wait_until(
            &format!("NodeMaintenance {name} to be gone and {node} uncordoned"),
            MINUTE,
            || async move {
                let request = self.api.get_opt(name).await?;
                let cordoned = unschedulable(&self.nodes.get(node).await?);
                Ok(if request.is_none() && !cordoned {
                    Check::Done(())
                } else {
                    Check::Pending(format!(
                        "request present {}, node unschedulable {cordoned}",
                        request.is_some()
                    ))
                })
            },
        )
        .await
    }
}

#[tokio::test]
async fn operator_runs_with_only_the_chart_rbac() -> Result<()> {
    let chart = ChartOnTestbed::install().await?;
    let (testbed, client, dir) = (chart.testbed, &chart.client, &chart.dir);
    let kubeconfig = chart.service_account_kubeconfig().await?;
    let operator = Operator::start_with_kubeconfig(
        &kubeconfig,
        dir.path(),
        &[
            "--leader-elect",
            "--lease-name",
            "maintenance-operator",
            "--log-format",
            "text",
            // Garbage collection within the test: a request for a missing node goes at once.
            "--missing-node-grace-seconds",
            "1",
        ],
    )
    .await?;
    let result = rbac_lifecycle(client, &operator).await;
    if result.is_err() {
        eprintln!("operator log (last lines):\n{}", log_tail(&operator));
    }
    drop(operator);
    // Leave the chart's ClusterRole as the chart renders it, whatever happened.
    install_manifests(testbed, dir.path())?;
    result
}

async fn rbac_lifecycle(client: &kube::Client, operator: &Operator) -> Result<()> {
    let (ns, first) = two_nodes_with_a_web_deployment(client, "rbac").await?;
    let requests = Requests {
        client: client.clone(),
        api: Api::namespaced_with(client.clone(), &ns, &request_resource()),
        nodes: Api::all(client.clone()),
        ns: ns.clone(),
    };

    // With the chart's roles: the whole lifecycle.
    requests.create("with-chart-rbac", &first).await?;
    requests
        .wait_ready("with-chart-rbac", &first, 2 * MINUTE)
        .await?;
    requests.release("with-chart-rbac", &first).await?;
    // Garbage collection deletes with the chart's roles: a request for a node that does not
    // exist is gone after --missing-node-grace-seconds.
    requests
        .create("for-a-missing-node", "no-such-node")
        .await?;
    wait_until(
        "the request for a missing node to be garbage-collected",
        MINUTE,
        || async {
            Ok(match requests.api.get_opt("for-a-missing-node").await? {
                None => Check::Done(()),
                Some(_) => Check::Pending("still there".into()),
            })
        },
    )
    .await?;
    // Events were written with the chart's roles too, and nothing was refused along the way.
    let events = Api::<Event>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await?;
    let regarding = |e: &&Event| e.regarding.as_ref().and_then(|r| r.name.clone());
    let on_request = events
        .items
        .iter()
        .filter(|e| regarding(e).as_deref() == Some("with-chart-rbac"))
        .count();
    ensure!(
        on_request > 0,
        "no Event on NodeMaintenance with-chart-rbac"
    );
    let log = std::fs::read_to_string(&operator.log)?;
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("forbidden")).collect();
    ensure!(
        refused.is_empty(),
        "the API server refused calls of the operator with the chart's roles:\n{}",
        refused.join("\n")
    );
    // The drained pods were replaced on the other node.
    let pods = wait_pods_ready(client, &ns, "app=web", 2, 2 * MINUTE).await?;
    let second = pod_node(&pods[0]).context("pod without node")?.to_string();

    // Without `pods/eviction create` the drain cannot finish: the test can fail.
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let role = roles.get(NAME).await?;
    let all_rules = role.rules.unwrap_or_default();
    let rules: Vec<_> = all_rules
        .iter()
        .filter(|r| {
            !r.resources
                .iter()
                .flatten()
                .any(|res| res == "pods/eviction")
        })
        .collect();
    ensure!(
        rules.len() + 1 == all_rules.len(),
        "the ClusterRole has no rule of its own for pods/eviction"
    );
    roles
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({ "rules": rules })),
        )
        .await?;

    requests.create("without-eviction", &second).await?;
    // For a while: never Ready, and the API server refuses the operator's evictions (403), so
    // the missing verb is what holds the request up.
    let window = Duration::from_secs(20);
    let start = Instant::now();
    let mut refused = 0.0;
    let mut status = Value::Null;
    while start.elapsed() < window {
        let request = requests.api.get("without-eviction").await?;
        status = request.data["status"].clone();
        if let Some((_, reason)) = ready_condition(&request).filter(|(cond, _)| cond == "True") {
            bail!("the request became Ready ({reason}) without pods/eviction; status {status}");
        }
        let sample = "maintenance_operator_eviction_requests_total";
        refused = metric_sum(operator, sample, "code=\"403\"").await?;
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    ensure!(
        refused > 0.0,
        "no eviction was refused with 403 within {window:?}: something else than RBAC held the \
         request up; status {status}"
    );
    ensure!(
        unschedulable(&requests.nodes.get(&second).await?),
        "{second} was not cordoned: the operator did not act on the request; status {status}"
    );
    let left = pods_on(client, &ns, &second).await?;
    ensure!(
        !left.is_empty(),
        "pods left {second} without the Eviction API"
    );
    Ok(())
}
