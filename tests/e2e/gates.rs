//! Alert gates (`admission.gates`) against a real Prometheus: it scrapes a gauge the test flips,
//! and a rule fires an alert while the gauge is 1. While the alert fires a new request stays
//! Pending naming the gate; once it resolves the request is admitted. A gate whose Prometheus
//! cannot be reached holds (fail closed) and says so.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use axum::extract::State;
use maintenance_crds::{Gate, MaintenanceOperatorConfigSpec, Phase, PrometheusGate};
use support::operator::*;
use support::prometheus_server::Prometheus;
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
    let op = Operator::start(&testbed, &[]).await?;

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

    // The alert resolves: the request is admitted soon after.
    flag.store(0, Ordering::Relaxed);
    wait_for("the test alert to resolve in Prometheus", WAIT, || async {
        Ok((firing_series(&prometheus).await? == 0).then_some(()))
    })
    .await?;
    let resolved = Instant::now();
    wait_request(
        &client,
        &ns,
        "held",
        "be admitted once the alert resolved",
        WAIT,
        |r| r.phase() != Phase::Pending,
    )
    .await?;
    let admitted_after = resolved.elapsed();
    eprintln!(
        "admitted {:.2} s after the alert resolved in Prometheus",
        admitted_after.as_secs_f64()
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
    prometheus.ensure_running()?;
    Ok(())
}
