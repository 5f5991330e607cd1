//! Sends the lifecycle notifications (`spec.notifications` of the config) to their webhooks.
//! `maintenance_core::notifications` decides what an event says, who gets it and what an answer
//! means; this only sends. Each receiver has a bounded queue and one task that POSTs its events
//! in order, retrying with back-off: enqueueing never waits, so a slow or dead receiver never
//! slows a request's lifecycle (a full queue drops the event, counted).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use backon::Retryable;
use bytes::Bytes;
use http_body_util::Full;
use maintenance_core::notifications::{
    self, DropReason, Facts, NotificationEvent, Target, Verdict,
};
use maintenance_crds::{NodeMaintenance, Notification};
use tokio::sync::{mpsc, watch};

use crate::http_client::{Https, Trust, error_chain, https_client, read_secret};
use crate::metrics::Metrics;
use crate::task::AbortOnDrop;

pub use maintenance_core::notifications::Detail;

/// The receivers of the config, as the supervisor last read it, and their queues.
pub struct Notifier {
    shared: Arc<Shared>,
    receivers: Mutex<HashMap<String, Receiver>>,
}

/// What every receiver's task uses.
struct Shared {
    client: kube::Client,
    /// The operator's namespace: where the Secrets of `secretRef` are read.
    namespace: String,
    source: String,
    metrics: Arc<Metrics>,
    /// `None` when the TLS set-up failed (logged once): every delivery then fails.
    http: Option<Https>,
}

struct Receiver {
    /// The receiver's settings; its task reads them at each attempt, so an edited URL, Secret
    /// or event list applies to the events already queued.
    settings: watch::Sender<Notification>,
    queue: mpsc::Sender<Delivery>,
    /// Stops the task (and drops what it still holds) when the receiver leaves the config.
    _task: AbortOnDrop,
}

struct Delivery {
    id: String,
    event: NotificationEvent,
    body: Bytes,
}

/// One failed attempt.
struct AttemptError {
    verdict: Verdict,
    what: String,
}

impl Notifier {
    pub fn new(client: kube::Client, namespace: String, metrics: Arc<Metrics>) -> Notifier {
        let http = match https_client(notifications::ATTEMPT_TIMEOUT, &Trust::default()) {
            Ok(http) => Some(http),
            Err(err) => {
                tracing::error!(%err, "cannot set up TLS for notifications; none will be sent");
                None
            }
        };
        Notifier {
            shared: Arc::new(Shared {
                source: notifications::source(&namespace),
                client,
                namespace,
                metrics,
                http,
            }),
            receivers: Mutex::new(HashMap::new()),
        }
    }

    /// Makes the receivers those of the config: new ones start, changed ones take their new
    /// settings (their queue is kept), removed ones stop and drop what they still hold. Runs
    /// inside the tokio runtime (it starts tasks).
    pub fn configure(&self, wanted: &[Notification]) {
        let Ok(mut receivers) = self.receivers.lock() else {
            return;
        };
        receivers.retain(|name, _| {
            let keep = wanted.iter().any(|w| &w.name == name);
            if !keep {
                tracing::info!(receiver = %name, "notification receiver removed");
                self.shared.metrics.notifications.forget_receiver(name);
            }
            keep
        });
        for spec in wanted {
            if let Some(receiver) = receivers.get(&spec.name) {
                receiver.settings.send_if_modified(|current| {
                    let changed = current != spec;
                    if changed {
                        tracing::info!(receiver = %spec.name, "notification receiver changed");
                        *current = spec.clone();
                    }
                    changed
                });
                continue;
            }
            tracing::info!(receiver = %spec.name, events = ?spec.events, "notification receiver added");
            self.shared
                .metrics
                .notifications
                .export_receiver(&spec.name);
            let (settings, settings_rx) = watch::channel(spec.clone());
            let (queue, queue_rx) = mpsc::channel(notifications::QUEUE_CAPACITY);
            let task = tokio::spawn(deliver_in_order(
                self.shared.clone(),
                spec.name.clone(),
                settings_rx,
                queue_rx,
            ));
            receivers.insert(
                spec.name.clone(),
                Receiver {
                    settings,
                    queue,
                    _task: AbortOnDrop(task),
                },
            );
        }
    }

    /// Queues `event` of `request` for every receiver subscribed to it; never waits. This is
    /// what each lifecycle step calls (Yielded included).
    pub fn notify(&self, event: NotificationEvent, request: &NodeMaintenance, detail: Detail) {
        let Ok(receivers) = self.receivers.lock() else {
            return;
        };
        let specs: Vec<Notification> = receivers
            .values()
            .map(|r| r.settings.borrow().clone())
            .collect();
        let recipients = notifications::recipients(&specs, event);
        if recipients.is_empty() {
            return;
        }
        let facts = Facts::of(event, request, detail);
        let id = event_id();
        let body = Bytes::from(
            facts
                .cloud_event(&id, &self.shared.source, jiff::Timestamp::now())
                .to_string(),
        );
        for spec in recipients {
            let Some(receiver) = receivers.get(&spec.name) else {
                continue;
            };
            let delivery = Delivery {
                id: id.clone(),
                event,
                body: body.clone(),
            };
            match receiver.queue.try_send(delivery) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(receiver = %spec.name, %event, request = %request.key(), "notification dropped: the receiver's queue is full (it has been failing or slow)");
                    self.shared
                        .metrics
                        .notifications
                        .dropped(&spec.name, DropReason::QueueFull);
                }
                // The task ended: the receiver is being removed.
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        }
    }
}

/// A random 128-bit id, in hex: unique per event, the same for each receiver and retry.
fn event_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// A receiver's task: its events one after the other, in the order they were queued (a retry
/// holds back the events behind it, so a receiver never sees Ready before Admitted).
async fn deliver_in_order(
    shared: Arc<Shared>,
    name: String,
    settings: watch::Receiver<Notification>,
    mut queue: mpsc::Receiver<Delivery>,
) {
    while let Some(delivery) = queue.recv().await {
        let schedule = backon::ExponentialBuilder::default()
            .with_min_delay(notifications::FIRST_RETRY_DELAY)
            .with_max_delay(notifications::MAX_RETRY_DELAY)
            .with_factor(2.0)
            .with_jitter()
            .with_max_times(notifications::MAX_RETRIES)
            .with_total_delay(Some(notifications::MAX_RETRY_TIME));
        let result = (|| attempt(&shared, &name, &settings, &delivery))
            .retry(schedule)
            .sleep(tokio::time::sleep)
            .when(|err: &AttemptError| err.verdict == Verdict::Retry)
            .notify(|err, after| {
                tracing::debug!(receiver = %name, id = %delivery.id, event = %delivery.event, error = %err.what, retry_in = ?after, "notification not delivered; will retry");
            })
            .await;
        match result {
            Ok(()) => {
                tracing::debug!(receiver = %name, id = %delivery.id, event = %delivery.event, "notification delivered");
                shared.metrics.notifications.sent(&name);
            }
            Err(err) => {
                let reason = if err.verdict == Verdict::Retry {
                    DropReason::RetriesExhausted
                } else {
                    DropReason::Rejected
                };
                tracing::warn!(receiver = %name, id = %delivery.id, event = %delivery.event, error = %err.what, reason = reason.as_str(), "notification dropped; check the receiver and spec.notifications of the MaintenanceOperatorConfig");
                shared.metrics.notifications.dropped(&name, reason);
            }
        }
    }
}

/// One POST of `delivery` with the receiver's current settings; every failure is counted.
async fn attempt(
    shared: &Shared,
    name: &str,
    settings: &watch::Receiver<Notification>,
    delivery: &Delivery,
) -> Result<(), AttemptError> {
    let spec = settings.borrow().clone();
    let result = match tokio::time::timeout(
        notifications::ATTEMPT_TIMEOUT,
        post(shared, &spec, delivery),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(AttemptError {
            verdict: Verdict::Retry,
            what: format!(
                "no answer within {}s",
                notifications::ATTEMPT_TIMEOUT.as_secs()
            ),
        }),
    };
    if result.is_err() {
        shared.metrics.notifications.failed(name);
    }
    result
}

async fn post(
    shared: &Shared,
    spec: &Notification,
    delivery: &Delivery,
) -> Result<(), AttemptError> {
    let Some(http) = &shared.http else {
        return Err(AttemptError {
            verdict: Verdict::Rejected,
            what: "TLS could not be set up (see the operator's log at start)".into(),
        });
    };
    let target = target(shared, spec).await?;
    let rejected = |what: String| AttemptError {
        verdict: Verdict::Rejected,
        what,
    };
    // Neither the URL nor the token is quoted: either may be a secret.
    let uri: http::Uri = target
        .url
        .parse()
        .map_err(|_| rejected("the receiver's URL does not parse; fix it".into()))?;
    let mut request = http::Request::post(uri)
        .header(http::header::CONTENT_TYPE, notifications::CONTENT_TYPE)
        .header(
            http::header::USER_AGENT,
            concat!("maintenance-operator/", env!("CARGO_PKG_VERSION")),
        );
    if let Some(token) = &target.token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(delivery.body.clone()))
        .map_err(|_| {
            rejected("the receiver's URL or token is not valid in an HTTP request; fix it".into())
        })?;
    let status = match http.request(request).await {
        Ok(response) => Some(response.status().as_u16()),
        Err(err) => {
            return Err(AttemptError {
                verdict: notifications::verdict(None),
                what: format!("cannot reach the receiver: {}", error_chain(&err)),
            });
        }
    };
    match notifications::verdict(status) {
        Verdict::Delivered => Ok(()),
        verdict => Err(AttemptError {
            verdict,
            what: format!("the receiver answered {}", status.unwrap_or_default()),
        }),
    }
}

/// The receiver's URL and token, its Secret (if any) read now, so a rotation applies at once.
async fn target(shared: &Shared, spec: &Notification) -> Result<Target, AttemptError> {
    let (mut url, mut token) = (None, None);
    if let Some(secret_ref) = &spec.secret_ref {
        // A missing or unreadable Secret may be created or allowed soon: retried.
        let keys = read_secret(&shared.client, &shared.namespace, &secret_ref.name)
            .await
            .map_err(|what| AttemptError {
                verdict: Verdict::Retry,
                what,
            })?;
        let key = |key: &str| {
            keys.get(key)
                .and_then(|v| String::from_utf8(v.clone()).ok())
        };
        url = key("url");
        token = key("token");
    }
    notifications::target(spec, url.as_deref(), token.as_deref()).map_err(|err| AttemptError {
        verdict: Verdict::Rejected,
        what: err.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use maintenance_core::notifications::{DropReason, NotificationEvent, QUEUE_CAPACITY};
    use maintenance_crds::{NodeMaintenance, NodeMaintenanceSpec, Notification};

    use super::{Detail, Notifier};
    use crate::metrics::Metrics;

    fn receiver(name: &str, events: &[NotificationEvent]) -> Notification {
        Notification {
            name: name.into(),
            // Port 9 of localhost: nobody listens, every attempt fails and is retried.
            url: Some("http://127.0.0.1:9/".into()),
            events: events.to_vec(),
            secret_ref: None,
        }
    }

    #[tokio::test]
    async fn a_full_queue_drops_without_waiting_and_receivers_follow_the_config() {
        let metrics = Arc::new(Metrics::new().expect("metrics register"));
        let notifier = Notifier::new(
            crate::testing::offline_client(),
            "ops".into(),
            metrics.clone(),
        );
        notifier.configure(&[
            receiver("down", &[NotificationEvent::Ready]),
            receiver("quiet", &[NotificationEvent::Failed]),
        ]);
        let request = NodeMaintenance::new("nm", NodeMaintenanceSpec::default());
        let extra = 20;
        for _ in 0..QUEUE_CAPACITY + 1 + extra {
            notifier.notify(NotificationEvent::Ready, &request, Detail::default());
        }
        let dropped = |name: &str| {
            metrics
                .notifications
                .dropped_total
                .with_label_values(&[name, DropReason::QueueFull.as_str()])
                .get()
        };
        // The task holds at most one event (being retried) besides the full queue.
        assert!(dropped("down") >= extra as u64, "{}", dropped("down"));
        assert_eq!(dropped("quiet"), 0);
        // Removed from the config: its series go.
        notifier.configure(&[receiver("quiet", &[NotificationEvent::Failed])]);
        assert!(!metrics.render().contains("receiver=\"down\""));
        assert!(metrics.render().contains("receiver=\"quiet\""));
    }
}
