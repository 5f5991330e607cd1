//! Events go out in the background. An Event is one API call, best effort, and nothing waits for
//! it to be read back; sent inline, it would sit between a write and the next one of the same
//! request (the uncordon's Event between the uncordon and the finalizer's removal, the Pending
//! Event before the admission), one round trip each on every request's way through.
//!
//! Events of one object keep their order: each object goes to one of a few workers, chosen by its
//! UID (or name), and a worker sends one at a time. The workers side by side keep a burst of
//! phase changes across many requests from queueing behind one another.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use tokio::sync::{mpsc, oneshot};

use crate::metrics::Metrics;

/// Workers sending side by side.
const WORKERS: usize = 4;
/// Events one worker holds before new ones are dropped (and counted): a backlog this deep means
/// the API server refuses or crawls, and the lifecycle must not slow down for Events.
const QUEUE_PER_WORKER: usize = 4096;

enum Job {
    // Boxed: an Event and its reference are large next to a flush.
    Publish(Box<(Event, ObjectReference)>),
    /// Answered once every Event queued before it on this worker is sent.
    Flush(oneshot::Sender<()>),
}

/// The queue in front of the API server's Events; cheap to share (`&self` only).
pub struct EventQueue {
    workers: Vec<mpsc::Sender<Job>>,
    metrics: Arc<Metrics>,
}

impl EventQueue {
    /// Starts the workers on the current Tokio runtime.
    pub fn start(recorder: Recorder, metrics: Arc<Metrics>) -> EventQueue {
        let workers = (0..WORKERS)
            .map(|_| {
                let (tx, rx) = mpsc::channel(QUEUE_PER_WORKER);
                tokio::spawn(send_in_order(rx, recorder.clone(), metrics.clone()));
                tx
            })
            .collect();
        EventQueue { workers, metrics }
    }

    /// Queues `event` on `reference` and returns at once; a full queue drops it (logged, counted
    /// in `errors_total{step="event"}`).
    pub fn publish(&self, event: Event, reference: ObjectReference) {
        let worker = &self.workers[worker_of(&reference, self.workers.len())];
        let object = describe(&reference);
        if let Err(err) = worker.try_send(Job::Publish(Box::new((event, reference)))) {
            let why = match err {
                mpsc::error::TrySendError::Full(_) => "the event queue is full",
                mpsc::error::TrySendError::Closed(_) => "the event sender stopped",
            };
            tracing::warn!(%object, why, "event dropped");
            self.metrics
                .process
                .errors_total
                .with_label_values(&["event"])
                .inc();
        }
    }

    /// Waits (at most `timeout`) until every Event queued so far is sent: at shutdown, and in
    /// tests that read Events back. True if all were sent in time.
    pub async fn flush(&self, timeout: Duration) -> bool {
        let answers = self.workers.iter().map(|worker| async move {
            let (tx, rx) = oneshot::channel();
            worker.send(Job::Flush(tx)).await.is_ok() && rx.await.is_ok()
        });
        tokio::time::timeout(timeout, futures::future::join_all(answers))
            .await
            .is_ok_and(|sent| sent.into_iter().all(|ok| ok))
    }
}

async fn send_in_order(mut jobs: mpsc::Receiver<Job>, recorder: Recorder, metrics: Arc<Metrics>) {
    while let Some(job) = jobs.recv().await {
        match job {
            Job::Publish(job) => {
                let (event, reference) = *job;
                if let Err(err) = recorder.publish(&event, &reference).await {
                    tracing::warn!(object = %describe(&reference), %err, "could not publish event");
                    metrics
                        .process
                        .errors_total
                        .with_label_values(&["event"])
                        .inc();
                }
            }
            Job::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// The worker of an object: the same one for all its Events.
fn worker_of(reference: &ObjectReference, workers: usize) -> usize {
    let mut hasher = DefaultHasher::new();
    match &reference.uid {
        Some(uid) => uid.hash(&mut hasher),
        None => (&reference.namespace, &reference.name).hash(&mut hasher),
    }
    usize::try_from(hasher.finish() % workers.max(1) as u64).unwrap_or(0)
}

fn describe(reference: &ObjectReference) -> String {
    format!(
        "{} {}/{}",
        reference.kind.as_deref().unwrap_or_default(),
        reference.namespace.as_deref().unwrap_or_default(),
        reference.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(uid: Option<&str>, name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("NodeMaintenance".into()),
            namespace: Some("default".into()),
            name: Some(name.into()),
            uid: uid.map(str::to_string),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn every_event_of_one_object_goes_to_the_same_worker() {
        let a = reference(Some("uid-a"), "a");
        let renamed = reference(Some("uid-a"), "a-seen-elsewhere");
        assert_eq!(worker_of(&a, WORKERS), worker_of(&renamed, WORKERS));
        let no_uid = reference(None, "b");
        assert_eq!(worker_of(&no_uid, WORKERS), worker_of(&no_uid, WORKERS));
    }

    #[test]
    fn objects_spread_over_the_workers() {
        let used: std::collections::HashSet<usize> = (0..64)
            .map(|i| worker_of(&reference(Some(&format!("uid-{i}")), "x"), WORKERS))
            .collect();
        assert_eq!(used.len(), WORKERS, "64 objects should reach every worker");
    }
}
