//! Lifecycle notifications (`spec.notifications` of the config) on a live control plane: a
//! webhook receiver in this test that refuses the first POSTs (503) gets every event of a request
//! once, in order, as a CloudEvent; a second receiver that nobody listens for never holds the
//! request back; and the API server refuses bad receivers with a message that says what to fix.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};
use maintenance_crds::{Notification, NotificationEvent, Phase, SecretRef};
use serde_json::{Value, json};
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(90);
/// How many POSTs the receiver refuses with 503 before it accepts.
const REFUSED_FIRST: usize = 2;
const TOKEN: &str = "t0ken-for-the-test";

/// What the test's receiver saw.
#[derive(Default)]
struct Inbox {
    posts: usize,
    /// The events it accepted (200), with their Content-Type and Authorization headers.
    accepted: Vec<(String, String, Value)>,
}

async fn receive(
    State(inbox): State<Arc<Mutex<Inbox>>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let Ok(mut inbox) = inbox.lock() else {
        return StatusCode::INTERNAL_SERVER_ERROR;
    };
    inbox.posts += 1;
    if inbox.posts <= REFUSED_FIRST {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let event = serde_json::from_slice(&body).unwrap_or(Value::Null);
    inbox
        .accepted
        .push((header("content-type"), header("authorization"), event));
    StatusCode::OK
}

/// A receiver on a loopback port of its own: its URL and what it saw.
async fn start_receiver() -> Result<(String, Arc<Mutex<Inbox>>)> {
    let inbox = Arc::new(Mutex::new(Inbox::default()));
    let app = axum::Router::new()
        .route("/events", axum::routing::post(receive))
        .with_state(inbox.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/events", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, inbox))
}

fn accepted(inbox: &Mutex<Inbox>) -> Vec<(String, String, Value)> {
    inbox.lock().map(|i| i.accepted.clone()).unwrap_or_default()
}

#[tokio::test]
async fn a_request_s_events_reach_the_receiver_once_in_order() -> Result<()> {
    let (url, inbox) = start_receiver().await?;
    // Nobody listens there: every attempt fails to connect, and is retried.
    let dead = format!("http://127.0.0.1:{}/", free_port()?);
    let mut config = limits(1, None);
    config.notifications = Some(vec![
        Notification {
            name: "hook".into(),
            url: Some(url),
            events: vec![
                NotificationEvent::Admitted,
                NotificationEvent::Ready,
                NotificationEvent::Released,
            ],
            // Its key `token` is the bearer token; it has no `url`, so the receiver's stays.
            secret_ref: Some(SecretRef {
                name: "hook-token".into(),
            }),
        },
        Notification {
            name: "dead".into(),
            url: Some(dead),
            events: NotificationEvent::ALL.to_vec(),
            secret_ref: None,
        },
    ]);
    let (testbed, client, ns, nodes) = own_cluster("notify", 1, Some(config)).await?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("hook-token".into()),
            namespace: Some(OPERATOR_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "token".to_string(),
            ByteString(TOKEN.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await?;
    let operator = Operator::start(&testbed, &[]).await?;
    let node = &nodes[0];

    // The dead receiver never holds the request back: it reaches Ready within the usual deadline.
    let started = Instant::now();
    create_request(
        &client,
        &ns,
        "maint",
        request_spec(node, "notify.example.com"),
    )
    .await?;
    let ready = wait_phase(&client, &ns, "maint", Phase::Ready, WAIT).await?;
    let to_ready = started.elapsed();
    let uid = ready.uid().context("the request has no UID")?;
    release_request(&client, &ns, "maint", WAIT).await?;

    // Every event delivered (counted once the receiver said 200) ...
    let sample = r#"maintenance_operator_notifications_sent_total{receiver="hook"}"#;
    wait_for("three notifications delivered to hook", WAIT, || async {
        Ok((operator.metric(sample).await? >= 3.0).then_some(()))
    })
    .await?;
    // ... and nothing more: the receiver holds exactly the three, in order.
    let events = accepted(&inbox);
    let types: Vec<&str> = events
        .iter()
        .map(|(_, _, e)| e["type"].as_str().unwrap_or_default())
        .collect();
    ensure!(
        types
            == [
                "com.github.maintenance-operator.nodemaintenance.admitted",
                "com.github.maintenance-operator.nodemaintenance.ready",
                "com.github.maintenance-operator.nodemaintenance.released",
            ],
        "events in the order received: {types:?}"
    );
    let mut ids = Vec::new();
    for (content_type, authorization, event) in &events {
        ensure!(
            content_type == "application/cloudevents+json",
            "Content-Type {content_type}"
        );
        ensure!(
            authorization == &format!("Bearer {TOKEN}"),
            "Authorization {authorization:?}"
        );
        ensure!(event["specversion"] == "1.0", "{event}");
        ensure!(event["subject"] == node.as_str(), "{event}");
        ensure!(
            event["source"] == format!("/maintenance-operator/namespaces/{OPERATOR_NAMESPACE}"),
            "{event}"
        );
        ensure!(event["datacontenttype"] == "application/json", "{event}");
        ensure!(
            event["time"]
                .as_str()
                .is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok()),
            "{event}"
        );
        let data = &event["data"];
        ensure!(data["namespace"] == ns.as_str(), "{event}");
        ensure!(data["name"] == "maint", "{event}");
        ensure!(data["uid"] == uid.as_str(), "{event}");
        ensure!(data["node"] == node.as_str(), "{event}");
        ensure!(data["requestorID"] == "notify.example.com", "{event}");
        let text = event["text"].as_str().unwrap_or_default();
        ensure!(
            text.contains(node.as_str()) && !text.contains('\n'),
            "text {text:?}"
        );
        ids.push(event["id"].as_str().unwrap_or_default().to_string());
    }
    ensure!(events[1].2["data"]["phase"] == "Ready", "{}", events[1].2);
    ensure!(
        events[2].2["data"]["reason"] == "Deleted",
        "{}",
        events[2].2
    );
    ids.sort();
    ids.dedup();
    ensure!(
        ids.len() == 3 && ids.iter().all(|id| !id.is_empty()),
        "ids {ids:?}"
    );

    // The refusals were failed attempts, retried; the dead receiver's attempts failed too.
    let metrics = operator.metrics().await?;
    let value = |sample: &str| metric_value(&metrics, sample).unwrap_or(-1.0);
    let hook_failed = value(r#"maintenance_operator_notifications_failed_total{receiver="hook"}"#);
    ensure!(
        hook_failed >= REFUSED_FIRST as f64,
        "hook failed {hook_failed}"
    );
    ensure!(
        value(r#"maintenance_operator_notifications_sent_total{receiver="hook"}"#) == 3.0,
        "{metrics}"
    );
    ensure!(
        value(r#"maintenance_operator_notifications_failed_total{receiver="dead"}"#) > 0.0,
        "{metrics}"
    );
    ensure!(
        value(r#"maintenance_operator_notifications_sent_total{receiver="dead"}"#) == 0.0,
        "{metrics}"
    );
    ensure!(
        value(
            r#"maintenance_operator_notifications_dropped_total{reason="rejected",receiver="hook"}"#
        ) == 0.0,
        "{metrics}"
    );
    eprintln!(
        "Ready after {:.1}s; hook: 3 sent, {hook_failed} failed attempts",
        to_ready.as_secs_f64()
    );

    // A receiver removed from the config stops, and its series go.
    let mut config = limits(1, None);
    config.notifications = Some(vec![]);
    set_config(&client, config).await?;
    wait_for("the removed receivers' series to go", WAIT, || async {
        let text = operator.metrics().await?;
        Ok((!text.contains("receiver=\"dead\"")).then_some(()))
    })
    .await?;
    drop(operator);
    testbed.stop().await
}

/// Bad receivers are refused by the API server, each with a message that says what to fix.
#[tokio::test]
async fn bad_receivers_are_refused_with_what_to_fix() -> Result<()> {
    let testbed = Testbed::shared().await?;
    let client = testbed.client().await?;
    install(&client, None).await?;
    let ns = unique_name("notify-bad");
    create_namespace(&client, &ns).await?;
    let receiver = |overrides: Value| {
        let mut r =
            json!({"name": "ops", "url": "https://hooks.example.com/x", "events": ["Ready"]});
        if let (Some(r), Some(o)) = (r.as_object_mut(), overrides.as_object()) {
            for (k, v) in o {
                if v.is_null() {
                    r.remove(k);
                } else {
                    r.insert(k.clone(), v.clone());
                }
            }
        }
        r
    };
    let cases: Vec<(&str, Value, Option<&[&str]>)> = vec![
        ("good", json!([receiver(json!({}))]), None),
        (
            "secret-only",
            json!([receiver(
                json!({"url": null, "secretRef": {"name": "slack-hook"}})
            )]),
            None,
        ),
        (
            "bad-name",
            json!([receiver(json!({"name": "Ops_Slack"}))]),
            Some(&["spec.notifications[0].name", "must be a DNS label"]),
        ),
        (
            "duplicate-name",
            json!([receiver(json!({})), receiver(json!({}))]),
            Some(&["spec.notifications[1]", "Duplicate value"]),
        ),
        (
            "ftp-url",
            json!([receiver(json!({"url": "ftp://hooks.example.com/x"}))]),
            Some(&["spec.notifications[0].url", "http:// or https:// URL"]),
        ),
        (
            "no-url",
            json!([receiver(json!({"url": null}))]),
            Some(&["spec.notifications[0]", "set url, or secretRef"]),
        ),
        (
            "unknown-event",
            json!([receiver(json!({"events": ["Deleted"]}))]),
            Some(&[
                "spec.notifications[0].events[0]",
                "Unsupported value",
                "Released",
            ]),
        ),
        (
            "no-events",
            json!([receiver(json!({"events": []}))]),
            Some(&["spec.notifications[0].events", "at least 1"]),
        ),
        (
            "too-many",
            Value::Array(
                (0..17)
                    .map(|i| receiver(json!({"name": format!("r{i}")})))
                    .collect(),
            ),
            Some(&["spec.notifications", "must have at most 16 items"]),
        ),
    ];
    let cases = cases
        .into_iter()
        .map(|(name, notifications, expected)| {
            (name, json!({"notifications": notifications}), expected)
        })
        .collect();
    check_config_cases(&client, &ns, cases).await
}
