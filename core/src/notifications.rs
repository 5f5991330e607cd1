//! Notifications of a request's lifecycle events to webhooks (`spec.notifications` of the
//! config): which events a status write makes, what an event says (a CloudEvents 1.0 JSON
//! document in structured mode, with a one-line `text` for Slack and Teams), who gets it, where it
//! goes, and what a receiver's answer means for the delivery. The actors only send.

use std::time::Duration;

use jiff::Timestamp;
use maintenance_crds::{NodeMaintenance, NodeMaintenanceStatus, Notification, condition_type};
use serde_json::{Value, json};

use crate::lifecycle::StatusWrite;

pub use maintenance_crds::NotificationEvent;

/// The HTTP `Content-Type` of a structured-mode CloudEvent.
pub const CONTENT_TYPE: &str = "application/cloudevents+json";

/// Every event's `type` is this prefix, a dot, and the event's name in lower case
/// (`com.github.maintenance-operator.nodemaintenance.garbagecollected`).
pub const TYPE_PREFIX: &str = "com.github.maintenance-operator.nodemaintenance";

/// Events a receiver's queue holds before the next one is dropped (counted as `queueFull`).
pub const QUEUE_CAPACITY: usize = 256;
/// The first retry waits about this long; each next one twice as long (with jitter) ...
pub const FIRST_RETRY_DELAY: Duration = Duration::from_secs(1);
/// ... up to this long between two attempts ...
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);
/// ... for at most this many retries (16 attempts in all) ...
pub const MAX_RETRIES: usize = 15;
/// ... and this long in all: an event older than that is of little use to a person, and a
/// receiver down that long should not hold back the events queued behind it for longer.
pub const MAX_RETRY_TIME: Duration = Duration::from_secs(600);
/// How long one attempt (connection, TLS, request and answer) may take.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);

/// The `type` attribute of an event.
pub fn event_type(event: NotificationEvent) -> String {
    format!("{TYPE_PREFIX}.{}", event.as_str().to_ascii_lowercase())
}

/// The `source` attribute: this operator, by the namespace it runs in.
pub fn source(operator_namespace: &str) -> String {
    format!("/maintenance-operator/namespaces/{operator_namespace}")
}

/// What one event tells, besides the request itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Detail {
    /// A machine-readable word (the Failed condition's reason, the garbage collection's cause).
    pub reason: Option<String>,
    /// For a person.
    pub message: Option<String>,
}

impl Detail {
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Detail {
        Detail {
            reason: Some(reason.into()),
            message: Some(message.into()),
        }
    }
}

/// One lifecycle event of one request, ready to be written as a CloudEvent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub event: NotificationEvent,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    pub requestor_id: String,
    /// The request's phase as the event leaves it.
    pub phase: String,
    pub detail: Detail,
}

impl Facts {
    pub fn of(event: NotificationEvent, request: &NodeMaintenance, detail: Detail) -> Facts {
        Facts {
            event,
            namespace: request.metadata.namespace.clone().unwrap_or_default(),
            name: request.metadata.name.clone().unwrap_or_default(),
            uid: request.metadata.uid.clone().unwrap_or_default(),
            node: request.spec.node_name.clone(),
            requestor_id: request.spec.requestor_id.clone(),
            phase: request.phase().as_str().to_string(),
            detail,
        }
    }

    /// One line for a person, as a chat incoming webhook shows it.
    pub fn text(&self) -> String {
        let request = format!("{}/{}", self.namespace, self.name);
        let node = &self.node;
        let requestor = &self.requestor_id;
        let why = self
            .detail
            .message
            .as_deref()
            .or(self.detail.reason.as_deref())
            .map(|m| format!(": {}", one_line(m)))
            .unwrap_or_default();
        match self.event {
            NotificationEvent::Admitted => {
                format!(
                    "Maintenance of node {node} admitted (request {request}, requestor {requestor})."
                )
            }
            NotificationEvent::Ready => format!(
                "Node {node} is cordoned and drained, ready for maintenance (request {request}, requestor {requestor})."
            ),
            NotificationEvent::Released => {
                format!("Node {node} released after maintenance{why} (request {request}).")
            }
            NotificationEvent::Failed => {
                format!("Maintenance of node {node} failed{why} (request {request}).")
            }
            NotificationEvent::Yielded => {
                format!("Maintenance of node {node} yielded its slot{why} (request {request}).")
            }
            NotificationEvent::GarbageCollected => {
                format!("Request {request} for node {node} was garbage collected{why}.")
            }
        }
    }

    /// The CloudEvent (specversion 1.0, structured mode), with the `text` extension attribute.
    /// `id` is unique per event (the same for every receiver and every retry, so a receiver can
    /// drop duplicates).
    pub fn cloud_event(&self, id: &str, source: &str, time: Timestamp) -> Value {
        let mut data = json!({
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
            "node": self.node,
            "requestorID": self.requestor_id,
            "phase": self.phase,
        });
        if let Some(map) = data.as_object_mut() {
            if let Some(reason) = &self.detail.reason {
                map.insert("reason".into(), Value::String(reason.clone()));
            }
            if let Some(message) = &self.detail.message {
                map.insert("message".into(), Value::String(message.clone()));
            }
        }
        json!({
            "specversion": "1.0",
            "id": id,
            "source": source,
            "type": event_type(self.event),
            "subject": self.node,
            "time": time.to_string(),
            "datacontenttype": "application/json",
            "text": self.text(),
            "data": data,
        })
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The receivers subscribed to `event`, in the config's order.
pub fn recipients(receivers: &[Notification], event: NotificationEvent) -> Vec<&Notification> {
    receivers
        .iter()
        .filter(|r| r.events.contains(&event))
        .collect()
}

/// The events a status write makes: Ready when it enters Ready, Failed when it sets the Failed
/// condition (or reports another failure in it). `before` is the status the write replaces.
pub fn status_write_events(
    before: Option<&NodeMaintenanceStatus>,
    write: &StatusWrite,
) -> Vec<(NotificationEvent, Detail)> {
    let mut events = Vec::new();
    if let Some(transition) = &write.transition
        && transition.to == maintenance_crds::Phase::Ready
        && transition.from != Some(maintenance_crds::Phase::Ready)
    {
        let message = (!transition.message.is_empty()).then(|| transition.message.clone());
        events.push((
            NotificationEvent::Ready,
            Detail {
                reason: None,
                message,
            },
        ));
    }
    let failed = |status: Option<&NodeMaintenanceStatus>| {
        status.and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == condition_type::FAILED && c.status == "True")
                .map(|c| (c.reason.clone(), c.message.clone()))
        })
    };
    if let Some((reason, message)) = failed(Some(&write.status))
        && failed(before) != Some((reason.clone(), message.clone()))
    {
        events.push((NotificationEvent::Failed, Detail::new(reason, message)));
    }
    events
}

/// The Released event's detail, once our finalizer is off: a deletion completed, or (on a request
/// not being deleted) its node gone.
pub fn released(request: &NodeMaintenance) -> Detail {
    if request.metadata.deletion_timestamp.is_none() {
        Detail::new(
            "NodeGone",
            format!(
                "node {} no longer exists; the request is released",
                request.spec.node_name
            ),
        )
    } else {
        Detail::new(
            "Deleted",
            "the request was deleted; the node is uncordoned if the operator cordoned it",
        )
    }
}

/// What a receiver's answer means: `status` is the HTTP status, `None` when there was none (the
/// connection failed or timed out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Delivered,
    /// Try again later: the receiver is down or busy (5xx, 429, no answer).
    Retry,
    /// The receiver refused the event (another 4xx, a redirect): the same event would be
    /// refused again.
    Rejected,
}

pub fn verdict(status: Option<u16>) -> Verdict {
    match status {
        None | Some(429 | 500..=599) => Verdict::Retry,
        Some(200..=299) => Verdict::Delivered,
        // Redirects are not followed: a POST would be replayed as a GET. 1xx never ends an
        // exchange; a receiver that sends one as final is broken.
        Some(_) => Verdict::Rejected,
    }
}

/// Why an event was dropped (the `reason` label of `notifications_dropped_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The receiver's queue was full (it has been down or slow for a while).
    QueueFull,
    /// Every attempt failed with an error worth retrying, within the retry bounds.
    RetriesExhausted,
    /// The receiver refused it (4xx but 429), or it could not be sent at all (no URL).
    Rejected,
}

impl DropReason {
    pub const ALL: [DropReason; 3] = [
        DropReason::QueueFull,
        DropReason::RetriesExhausted,
        DropReason::Rejected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queueFull",
            DropReason::RetriesExhausted => "retriesExhausted",
            DropReason::Rejected => "rejected",
        }
    }
}

/// Where a receiver's events go, once its Secret (if any) is read.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    pub url: String,
    /// Sent as `Authorization: Bearer <token>`.
    pub token: Option<String>,
}

// The URL and token may be secrets: neither is ever printed.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

/// Why a receiver has no usable target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error(
        "notification receiver {receiver}: no URL: set spec.notifications[].url, or a key `url` in Secret {secret}"
    )]
    NoUrl { receiver: String, secret: String },
    #[error(
        "notification receiver {receiver}: the URL {from} is not an http:// or https:// URL with a host; fix it"
    )]
    BadUrl { receiver: String, from: String },
}

/// The receiver's URL and token: the Secret's keys `url` and `token` (given when the receiver
/// names a Secret and it has them) over the receiver's own `url`.
pub fn target(
    receiver: &Notification,
    secret_url: Option<&str>,
    secret_token: Option<&str>,
) -> Result<Target, TargetError> {
    let secret = receiver
        .secret_ref
        .as_ref()
        .map_or_else(|| "(none named)".to_string(), |s| s.name.clone());
    let secret_url = secret_url.map(str::trim).filter(|u| !u.is_empty());
    let (url, from) = match (secret_url, receiver.url.as_deref()) {
        (Some(url), _) => (url, format!("in key `url` of Secret {secret}")),
        (None, Some(url)) => (url, "in spec.notifications[].url".to_string()),
        (None, None) => {
            return Err(TargetError::NoUrl {
                receiver: receiver.name.clone(),
                secret,
            });
        }
    };
    if !is_http_url(url) {
        return Err(TargetError::BadUrl {
            receiver: receiver.name.clone(),
            from,
        });
    }
    Ok(Target {
        url: url.to_string(),
        token: secret_token
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_string),
    })
}

/// `http://` or `https://`, a host, no white space (what the CRD's rule checks for `url`).
fn is_http_url(url: &str) -> bool {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"));
    rest.is_some_and(|rest| {
        let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
        !host.is_empty() && !url.chars().any(char::is_whitespace)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{at, request};
    use crate::lifecycle::{StatusWrite, Transition, enter_phase};
    use maintenance_crds::{Phase, SecretRef};

    fn receiver(name: &str, events: &[NotificationEvent]) -> Notification {
        Notification {
            name: name.into(),
            url: Some(format!("https://{name}.example/hook")),
            events: events.to_vec(),
            secret_ref: None,
        }
    }

    fn sample() -> NodeMaintenance {
        request("nm-1")
            .namespace("team-a")
            .node("node-7")
            .requestor("fw.example.com")
            .uid("u-1")
            .phase(Phase::Ready, at(0))
            .build()
    }

    #[test]
    fn event_types_follow_one_scheme() {
        let table = [
            (NotificationEvent::Admitted, "admitted"),
            (NotificationEvent::Ready, "ready"),
            (NotificationEvent::Released, "released"),
            (NotificationEvent::Failed, "failed"),
            (NotificationEvent::Yielded, "yielded"),
            (NotificationEvent::GarbageCollected, "garbagecollected"),
        ];
        assert_eq!(table.len(), NotificationEvent::ALL.len());
        for (event, suffix) in table {
            assert_eq!(
                event_type(event),
                format!("com.github.maintenance-operator.nodemaintenance.{suffix}")
            );
        }
    }

    #[test]
    fn the_cloud_event_has_every_attribute() {
        let facts = Facts::of(
            NotificationEvent::Failed,
            &sample(),
            Detail::new("DrainTimeout", "drain did not finish\nin 600s"),
        );
        let event = facts.cloud_event("id-1", &source("ops"), at(90));
        assert_eq!(
            event,
            json!({
                "specversion": "1.0",
                "id": "id-1",
                "source": "/maintenance-operator/namespaces/ops",
                "type": "com.github.maintenance-operator.nodemaintenance.failed",
                "subject": "node-7",
                "time": at(90).to_string(),
                "datacontenttype": "application/json",
                "text": "Maintenance of node node-7 failed: drain did not finish in 600s (request team-a/nm-1).",
                "data": {
                    "namespace": "team-a",
                    "name": "nm-1",
                    "uid": "u-1",
                    "node": "node-7",
                    "requestorID": "fw.example.com",
                    "phase": "Ready",
                    "reason": "DrainTimeout",
                    "message": "drain did not finish\nin 600s",
                },
            })
        );
        // No reason or message: the keys are left out, not null.
        let plain = Facts::of(NotificationEvent::Admitted, &sample(), Detail::default())
            .cloud_event("id-2", "s", at(0));
        assert!(plain["data"].get("reason").is_none());
        assert!(plain["data"].get("message").is_none());
    }

    #[test]
    fn every_text_is_one_line_naming_node_and_request() {
        for event in NotificationEvent::ALL {
            let text = Facts::of(event, &sample(), Detail::new("R", "two\nlines")).text();
            assert!(!text.contains('\n'), "{text}");
            assert!(text.contains("node-7"), "{text}");
            assert!(text.contains("team-a/nm-1"), "{text}");
        }
    }

    #[test]
    fn recipients_are_the_subscribers_in_order() {
        use NotificationEvent::*;
        let receivers = [
            receiver("a", &[Ready, Failed]),
            receiver("b", &[Admitted]),
            receiver("c", &[Failed]),
        ];
        let table: [(NotificationEvent, &[&str]); 4] = [
            (Ready, &["a"]),
            (Failed, &["a", "c"]),
            (Admitted, &["b"]),
            (Yielded, &[]),
        ];
        for (event, expected) in table {
            let names: Vec<&str> = recipients(&receivers, event)
                .iter()
                .map(|r| r.name.as_str())
                .collect();
            assert_eq!(names, expected, "{event}");
        }
    }

    #[test]
    fn verdicts_by_status() {
        let table = [
            (None, Verdict::Retry),
            (Some(200), Verdict::Delivered),
            (Some(202), Verdict::Delivered),
            (Some(204), Verdict::Delivered),
            (Some(301), Verdict::Rejected),
            (Some(400), Verdict::Rejected),
            (Some(401), Verdict::Rejected),
            (Some(404), Verdict::Rejected),
            (Some(408), Verdict::Rejected),
            (Some(429), Verdict::Retry),
            (Some(500), Verdict::Retry),
            (Some(503), Verdict::Retry),
            (Some(599), Verdict::Retry),
        ];
        for (status, expected) in table {
            assert_eq!(verdict(status), expected, "{status:?}");
        }
    }

    #[test]
    fn drop_reasons_are_camel_case_labels() {
        let labels: Vec<&str> = DropReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(labels, ["queueFull", "retriesExhausted", "rejected"]);
    }

    #[test]
    fn status_writes_make_ready_and_failed_once() {
        let scheduled = request("nm-1")
            .node("n")
            .phase(Phase::Draining, at(0))
            .build();
        // Entering Ready notifies; a Ready message rewritten does not.
        let ready = enter_phase(&scheduled, Phase::Ready, "", at(10), |_| {});
        let events = status_write_events(scheduled.status.as_ref(), &ready);
        assert_eq!(events, [(NotificationEvent::Ready, Detail::default())]);
        let mut is_ready = scheduled.clone();
        is_ready.status = Some(ready.status.clone());
        let again = enter_phase(&is_ready, Phase::Ready, "waits for x", at(20), |_| {});
        assert!(status_write_events(is_ready.status.as_ref(), &again).is_empty());

        // Setting Failed notifies; the same failure written again does not; another one does.
        let mut failing = ready.status.clone();
        crate::conditions::upsert_condition(
            &mut failing.conditions,
            condition_type::FAILED,
            true,
            "DrainTimeout",
            "too slow",
            at(30),
            None,
        );
        let write = StatusWrite {
            status: failing.clone(),
            transition: None,
        };
        assert_eq!(
            status_write_events(Some(&ready.status), &write),
            [(
                NotificationEvent::Failed,
                Detail::new("DrainTimeout", "too slow")
            )]
        );
        assert!(status_write_events(Some(&failing), &write).is_empty());
        let mut other = failing.clone();
        crate::conditions::upsert_condition(
            &mut other.conditions,
            condition_type::FAILED,
            true,
            "InvalidSpec",
            "bad regex",
            at(40),
            None,
        );
        let write = StatusWrite {
            status: other,
            transition: Some(Transition {
                from: Some(Phase::Ready),
                to: Phase::Ready,
                message: String::new(),
                in_phase_for: None,
            }),
        };
        assert_eq!(
            status_write_events(Some(&failing), &write),
            [(
                NotificationEvent::Failed,
                Detail::new("InvalidSpec", "bad regex")
            )]
        );
    }

    #[test]
    fn targets_prefer_the_secret() {
        let mut with_secret = receiver("r", &[NotificationEvent::Ready]);
        with_secret.secret_ref = Some(SecretRef {
            name: "hook".into(),
        });
        let no_url = Notification {
            url: None,
            ..with_secret.clone()
        };
        type Case<'a> = (
            &'a Notification,
            Option<&'a str>,
            Option<&'a str>,
            Result<(&'a str, Option<&'a str>), ()>,
        );
        let table: [Case<'_>; 7] = [
            (
                &with_secret,
                None,
                None,
                Ok(("https://r.example/hook", None)),
            ),
            (
                &with_secret,
                Some("https://hooks.slack.com/x"),
                Some(" t0k \n"),
                Ok(("https://hooks.slack.com/x", Some("t0k"))),
            ),
            (
                &with_secret,
                Some("  "),
                Some(""),
                Ok(("https://r.example/hook", None)),
            ),
            (&no_url, None, Some("t"), Err(())),
            (&no_url, Some("ftp://x"), None, Err(())),
            (&no_url, Some("https://"), None, Err(())),
            (
                &no_url,
                Some("http://10.0.0.1:8080"),
                None,
                Ok(("http://10.0.0.1:8080", None)),
            ),
        ];
        for (receiver, url, token, expected) in table {
            let got = target(receiver, url, token);
            match expected {
                Ok((url, token)) => {
                    let got = got.expect("a target");
                    assert_eq!(got.url, url);
                    assert_eq!(got.token.as_deref(), token);
                }
                Err(()) => assert!(got.is_err(), "{url:?}"),
            }
        }
        let err = target(&no_url, None, None).expect_err("no URL");
        assert!(err.to_string().contains("Secret hook"), "{err}");
        // A URL from a Secret is never printed.
        let err = target(&no_url, Some("ftp://secret-path"), None).expect_err("bad URL");
        assert!(!err.to_string().contains("secret-path"), "{err}");
    }

    #[test]
    fn released_says_why() {
        let mut r = sample();
        assert_eq!(released(&r).reason.as_deref(), Some("NodeGone"));
        r.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(5)));
        assert_eq!(released(&r).reason.as_deref(), Some("Deleted"));
    }
}
