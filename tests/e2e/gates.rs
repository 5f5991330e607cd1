//! Alert gates (`admission.gates`) against a real Prometheus: it scrapes a gauge the test flips,
//! and a rule fires an alert while the gauge is 1. While the alert fires a new request stays
//! Pending naming the gate; once it resolves the request is admitted. A gate whose Prometheus
//! cannot be reached holds (fail closed) and says so. Over HTTPS, a gate trusts the CA of its
//! Secret (`ca.crt`), and without it refuses the certificate and holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use axum::extract::State;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use maintenance_crds::{Gate, MaintenanceOperatorConfigSpec, Phase, PrometheusGate};
use serde_json::{Value, json};
use support::operator::*;
use support::prometheus_server::{Prometheus, ServingCert};
use support::*;

const WAIT: Duration = Duration::from_secs(60);
const ALERT: &str = "MaintenanceGateTest";
const GATE: &str = "node-alerts";

/// A scrape target of the test's own: `gate_test_flag` is what the test sets.
async fn start_flag(flag: Arc<AtomicU8>) -> Result<String> {
    async fn metrics(State(flag): State<Arc<AtomicU8>>) -> String {
        format!(
            "# TYPE gate_test_flag gauge\ngate_test_flag {}\n",
            flag.load(Ordering::Relaxed)
        )
    }
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .with_state(flag);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?.to_string();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(address)
}

fn gated(url: &str) -> MaintenanceOperatorConfigSpec {
    with_admission(2, |admission| {
        admission.gates = Some(vec![Gate {
            name: GATE.into(),
            prometheus: PrometheusGate {
                url: url.into(),
                query: format!("ALERTS{{alertname=\"{ALERT}\",alertstate=\"firing\"}}"),
                ..PrometheusGate::default()
            },
            timeout_seconds: Some(2),
        }]);
    })
}

async fn firing_series(prometheus: &Prometheus) -> Result<usize> {
    Ok(prometheus
        .query(&format!(
            "ALERTS{{alertname=\"{ALERT}\",alertstate=\"firing\"}}"
        ))
        .await?
        .len())
}

async fn pending_message_of(client: &kube::Client, ns: &str, name: &str) -> Result<String> {
    let request = get_request(client, ns, name)
        .await?
        .with_context(|| format!("NodeMaintenance {ns}/{name} is gone"))?;
    Ok(pending_message(&request).unwrap_or_default().to_string())
}

#[tokio::test]
async fn an_alert_holds_admission_until_it_resolves_and_an_unreachable_gate_holds_too() -> Result<()>
{
    // Prometheus, scraping the flag, with the alert firing before the operator starts.
    let flag = Arc::new(AtomicU8::new(1));
    let target = start_flag(flag.clone()).await?;
    let dir = tempfile::tempdir()?;
    let rules = dir.path().join("rules.yml");
    std::fs::write(
        &rules,
        format!(
            "groups:\n- name: gates\n  rules:\n  - alert: {ALERT}\n    expr: gate_test_flag == 1\n    for: 0s\n"
        ),
    )?;
    let prometheus = Prometheus::start(dir.path(), &[target], None, &[rules])?;
    wait_for("the test alert to fire in Prometheus", WAIT, || async {
        prometheus.ensure_running()?;
        Ok((firing_series(&prometheus).await? == 1).then_some(()))
    })
    .await
    .with_context(|| prometheus.log_tail(20))?;

    let (testbed, client, ns, nodes) =
        own_cluster("gates", 2, Some(gated(&prometheus.url("")))).await?;
    // A safety-net tick far off: what admits after the alert resolves is the gates' own poll.
    let op = Operator::start(&testbed, &["--tick-seconds", "120"]).await?;
    let result = async {

        // While the alert fires: Pending, naming the gate and the series.
        request_node(&client, &ns, "held", &nodes[0], "gates.example.com").await?;
        let expected = format!(
            "alert gate \"{GATE}\" holds every admission: its query returned 1 series: ALERTS{{alertname=\"{ALERT}\",alertstate=\"firing\""
        );
        wait_for("the request to name the firing gate", WAIT, || async {
            let message = pending_message_of(&client, &ns, "held").await?;
            Ok(message.contains(&expected).then_some(message))
        })
        .await?;
        ensure!(
            op.metric("maintenance_operator_requests_waiting{cause=\"gate\"}")
                .await?
                == 1.0,
            "requests_waiting counts the gate"
        );
        ensure!(
            op.metric(&format!(
                "maintenance_operator_gate_open{{gate=\"{GATE}\"}}"
            ))
            .await?
                == 0.0,
            "gate_open is 0 while the alert fires"
        );
        ensure!(
            !node_unschedulable(&client, &nodes[0]).await?,
            "a held request's node is not cordoned"
        );
        // `plan` asks the gate as the operator does.
        let plan = tokio::process::Command::new(env!("CARGO_BIN_EXE_maintenance-operator"))
            .args(["plan", "-o", "json", "--namespace", OPERATOR_NAMESPACE])
            .env("KUBECONFIG", testbed.kubeconfig_path())
            .output()
            .await
            .context("running maintenance-operator plan")?;
        ensure!(
            plan.status.success(),
            "plan failed: {}",
            String::from_utf8_lossy(&plan.stderr)
        );
        let plan: Value = serde_json::from_slice(&plan.stdout).context("plan -o json")?;
        let waiting = &plan["waiting"][0];
        ensure!(
            waiting["cause"] == "gate"
                && waiting["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains(&expected)),
            "plan shows the gate: {plan}"
        );

        // The alert resolves: the request is admitted soon after, by the poll while requests wait
        // (every 5 s), not by the tick.
        flag.store(0, Ordering::Relaxed);
        let flipped = Instant::now();
        wait_for("the test alert to resolve in Prometheus", WAIT, || async {
            Ok((firing_series(&prometheus).await? == 0).then_some(()))
        })
        .await?;
        let resolved_after = flipped.elapsed();
        wait_request(
            &client,
            &ns,
            "held",
            "be admitted once the alert resolved",
            WAIT,
            |r| r.phase() != Phase::Pending,
        )
        .await?;
        let admitted_after = flipped.elapsed();
        eprintln!(
            "admitted {:.2} s after the gauge flipped to 0 (the alert had resolved in Prometheus by {:.2} s)",
            admitted_after.as_secs_f64(),
            resolved_after.as_secs_f64()
        );
        // Resolution (a scrape and an evaluation, 1 s each), a poll (5 s) and the query: well under
        // the 120 s tick.
        ensure!(
            admitted_after < Duration::from_secs(20),
            "admitted {admitted_after:?} after the alert resolved: the gates' poll did not run"
        );
        wait_for("the node to be cordoned", WAIT, || async {
            Ok(node_unschedulable(&client, &nodes[0]).await?.then_some(()))
        })
        .await?;
        ensure!(
            op.metric(&format!(
                "maintenance_operator_gate_open{{gate=\"{GATE}\"}}"
            ))
            .await?
                == 1.0,
            "gate_open is 1 once the alert resolved"
        );

        // Prometheus unreachable: held, saying so (fail closed).
        let dead = format!("http://127.0.0.1:{}", free_port()?);
        set_config(&client, gated(&dead)).await?;
        request_node(&client, &ns, "blind", &nodes[1], "gates.example.com").await?;
        let message = wait_for(
            "the request to say the gate is unreachable",
            WAIT,
            || async {
                let message = pending_message_of(&client, &ns, "blind").await?;
                Ok(message
                    .contains("could not be asked (unreachable:")
                    .then_some(message))
            },
        )
        .await?;
        ensure!(
            message.contains(&format!("alert gate \"{GATE}\"")) && message.contains(&dead),
            "the message names the gate and its URL: {message}"
        );
        ensure!(
            op.metric(&format!(
                "maintenance_operator_gate_queries_failed_total{{gate=\"{GATE}\"}}"
            ))
            .await?
                >= 1.0,
            "gate_queries_failed_total counts the failure"
        );
        ensure!(
            !node_unschedulable(&client, &nodes[1]).await?,
            "nothing admitted while the gate cannot be asked"
        );

        // The gate removed: admitted.
        set_config(&client, limits(2, None)).await?;
        wait_request(
            &client,
            &ns,
            "blind",
            "be admitted once the gate is gone",
            WAIT,
            |r| r.phase() != Phase::Pending,
        )
        .await?;
        ensure!(
            op.metric(&format!(
                "maintenance_operator_gate_open{{gate=\"{GATE}\"}}"
            ))
            .await
            .is_err(),
            "a removed gate's series is gone"
        );
        prometheus.ensure_running()
    }
    .await;
    if let Err(err) = &result {
        eprintln!(
            "FAILED: {err:#}\n--- operator log (tail) ---\n{}\n--- prometheus log (tail) ---\n{}",
            std::fs::read_to_string(&op.log)
                .map(|log| log
                    .lines()
                    .rev()
                    .take(80)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n"))
                .unwrap_or_default(),
            prometheus.log_tail(20)
        );
    }
    result
}

/// Bad gates are refused by the API server, each with a message that says what to fix.
#[tokio::test]
async fn bad_gates_are_refused_with_what_to_fix() -> Result<()> {
    let testbed = Testbed::shared().await?;
    let client = testbed.client().await?;
    install(&client, None).await?;
    let ns = unique_name("gates-bad");
    create_namespace(&client, &ns).await?;
    let gate = |name: &str, url: &str, query: &str| json!({"name": name, "prometheus": {"url": url, "query": query}});
    let good = |name: &str| gate(name, "http://prometheus.monitoring:9090", "ALERTS");
    let cases: Vec<(&str, Value, Option<&[&str]>)> = vec![
        ("good", json!([good("node-alerts")]), None),
        (
            "bad-name",
            json!([good("Node_Alerts")]),
            Some(&["spec.admission.gates[0].name", "must be a DNS label"]),
        ),
        (
            "empty-name",
            json!([good("")]),
            Some(&["spec.admission.gates[0].name"]),
        ),
        (
            "duplicate-name",
            json!([good("a"), good("a")]),
            Some(&["spec.admission.gates[1]", "Duplicate value"]),
        ),
        (
            "no-scheme",
            json!([gate("a", "prometheus.monitoring:9090", "ALERTS")]),
            Some(&[
                "spec.admission.gates[0].prometheus.url",
                "http:// or https:// URL",
            ]),
        ),
        (
            "blank-query",
            json!([gate("a", "http://prometheus:9090", "  ")]),
            Some(&[
                "spec.admission.gates[0].prometheus.query",
                "must be a PromQL query",
            ]),
        ),
        (
            "too-many",
            Value::Array((0..17).map(|i| good(&format!("g{i}"))).collect()),
            Some(&["spec.admission.gates", "must have at most 16 items"]),
        ),
    ];
    let cases = cases
        .into_iter()
        .map(|(name, gates, expected)| (name, json!({"admission": {"gates": gates}}), expected))
        .collect();
    check_config_cases(&client, &ns, cases).await
}

fn tls_gate(url: &str, secret: Option<&str>, skip_verify: bool) -> MaintenanceOperatorConfigSpec {
    with_admission(2, |admission| {
        admission.gates = Some(vec![Gate {
            name: "tls".into(),
            prometheus: PrometheusGate {
                url: url.into(),
                // Returns nothing: the gate is open once it can be asked.
                query: "vector(1) == 0".into(),
                secret_ref: secret.map(|name| maintenance_crds::SecretRef { name: name.into() }),
                insecure_skip_tls_verify: skip_verify.then_some(true),
            },
            timeout_seconds: Some(2),
        }]);
    })
}

/// A Prometheus serving HTTPS with a certificate of the test's own CA: a gate without that CA
/// refuses the certificate and holds (fail closed); with the CA in its Secret's `ca.crt` (and a
/// token beside it, which this Prometheus does not ask for) it is asked and admits; with
/// `insecureSkipTLSVerify` it admits without the CA.
#[tokio::test]
async fn a_gate_over_https_trusts_the_ca_of_its_secret() -> Result<()> {
    let ca = crate::webhook::Ca::new("gates-test-ca")?;
    let (cert_pem, key_pem) = ca.serving()?;
    let dir = tempfile::tempdir()?;
    let prometheus =
        Prometheus::start_tls(dir.path(), &[], &[], &ServingCert { cert_pem, key_pem })?;
    let url = prometheus.url("");
    ensure!(url.starts_with("https://"), "{url}");

    let (testbed, client, ns, nodes) =
        own_cluster("gates-tls", 2, Some(tls_gate(&url, None, false))).await?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("prometheus-reader".into()),
            namespace: Some(OPERATOR_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        data: Some(std::collections::BTreeMap::from([
            ("ca.crt".to_string(), ByteString(ca.pem().into_bytes())),
            ("token".to_string(), ByteString(b"reader-token".to_vec())),
        ])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await?;
    let _op = Operator::start(&testbed, &[]).await?;

    // Without the CA: the certificate is refused, and the gate holds.
    request_node(&client, &ns, "first", &nodes[0], "gates.example.com").await?;
    let message = wait_for(
        "the request to say the certificate is refused",
        WAIT,
        || async {
            prometheus.ensure_running()?;
            let message = pending_message_of(&client, &ns, "first").await?;
            Ok((message.contains("could not be asked (TLS failed:")
                && message.contains("UnknownIssuer")
                && message.contains("ca.crt"))
            .then_some(message))
        },
    )
    .await
    .with_context(|| prometheus.log_tail(20))?;
    eprintln!("without the CA: {message}");

    // With the CA of the Secret: asked, open, admitted.
    set_config(&client, tls_gate(&url, Some("prometheus-reader"), false)).await?;
    wait_request(
        &client,
        &ns,
        "first",
        "be admitted once the gate trusts the CA",
        WAIT,
        |r| r.phase() != Phase::Pending,
    )
    .await?;

    // insecureSkipTLSVerify, no Secret: admitted too.
    set_config(&client, tls_gate(&url, None, true)).await?;
    request_node(&client, &ns, "second", &nodes[1], "gates.example.com").await?;
    wait_request(
        &client,
        &ns,
        "second",
        "be admitted with insecureSkipTLSVerify",
        WAIT,
        |r| r.phase() != Phase::Pending,
    )
    .await?;
    prometheus.ensure_running()?;
    Ok(())
}
