//! Watches of the PodDisruptionBudgets that block a drain right now, shared by all node actors:
//! one watch per PDB however many nodes wait on it, started on first interest and stopped when
//! nobody waits any more. A PDB's status change wakes the blocked evictions at once instead of
//! at their next backoff.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;

use crate::task::AbortOnDrop;

/// What a person needs to know about a PDB that refuses an eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdbSummary {
    pub current_healthy: i32,
    pub desired_healthy: i32,
    pub disruptions_allowed: i32,
    pub expected_pods: i32,
}

impl PdbSummary {
    pub fn from_pdb(pdb: &PodDisruptionBudget) -> Option<PdbSummary> {
        let status = pdb.status.as_ref()?;
        Some(PdbSummary {
            current_healthy: status.current_healthy.unwrap_or(0),
            desired_healthy: status.desired_healthy.unwrap_or(0),
            disruptions_allowed: status.disruptions_allowed.unwrap_or(0),
            expected_pods: status.expected_pods.unwrap_or(0),
        })
    }
}

impl std::fmt::Display for PdbSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "currentHealthy={} desiredHealthy={} disruptionsAllowed={} expectedPods={}",
            self.current_healthy,
            self.desired_healthy,
            self.disruptions_allowed,
            self.expected_pods
        )
    }
}

/// The latest state of a watched PDB: `None` until seen, or once deleted.
pub type PdbState = Option<PdbSummary>;

struct Watched {
    sender: watch::Sender<PdbState>,
    /// Retries that may go now: reset to disruptionsAllowed on every change of the PDB, and
    /// claimed by the node actors, so one freed disruption wakes one pod, not every waiter.
    tokens: Arc<AtomicI32>,
    _task: AbortOnDrop,
}

pub struct PdbWatches {
    client: kube::Client,
    watched: Mutex<HashMap<(String, String), Watched>>,
}

impl PdbWatches {
    pub fn new(client: kube::Client) -> PdbWatches {
        PdbWatches {
            client,
            watched: Mutex::new(HashMap::new()),
        }
    }

    /// A receiver that changes whenever the PDB `namespace/name` changes. Drop it to lose
    /// interest; the watch stops when the last receiver is gone.
    pub fn subscribe(&self, namespace: &str, name: &str) -> watch::Receiver<PdbState> {
        let Ok(mut watched) = self.watched.lock() else {
            // A poisoned lock only happens after a panic elsewhere; a receiver that never
            // changes degrades to backoff-only retries, which is still correct.
            return watch::channel(None).1;
        };
        watched.retain(|_, w| w.sender.receiver_count() > 0);
        let key = (namespace.to_string(), name.to_string());
        if let Some(existing) = watched.get(&key) {
            return existing.sender.subscribe();
        }
        let (sender, receiver) = watch::channel(None);
        let tokens = Arc::new(AtomicI32::new(0));
        let task_tokens = tokens.clone();
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let tx = sender.clone();
        let task = tokio::spawn(async move {
            let stream = watcher(api, config).default_backoff();
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Apply(pdb) | watcher::Event::InitApply(pdb)) => {
                        let summary = PdbSummary::from_pdb(&pdb);
                        let allowed = summary.as_ref().map_or(0, |s| s.disruptions_allowed);
                        task_tokens.store(allowed.max(0), Ordering::Release);
                        tx.send_replace(summary);
                    }
                    Ok(watcher::Event::Delete(_)) => {
                        // Gone: nothing limits these pods any more.
                        task_tokens.store(i32::MAX, Ordering::Release);
                        tx.send_replace(None);
                    }
                    Ok(_) => {}
                    Err(err) => tracing::debug!(%err, "PDB watch error; retrying"),
                }
                if tx.receiver_count() == 0 {
                    break;
                }
            }
        });
        watched.insert(
            key,
            Watched {
                sender,
                tokens,
                _task: AbortOnDrop(task),
            },
        );
        receiver
    }

    /// The last known state, without subscribing.
    pub fn current(&self, namespace: &str, name: &str) -> PdbState {
        let watched = self.watched.lock().ok()?;
        watched
            .get(&(namespace.to_string(), name.to_string()))
            .and_then(|w| w.sender.borrow().clone())
    }

    /// Claims one retry that the PDB's current state allows; false when its disruptions are all
    /// spoken for (the waiter then waits for the next change, or its own backoff).
    pub fn claim(&self, namespace: &str, name: &str) -> bool {
        let Ok(watched) = self.watched.lock() else {
            return true;
        };
        let Some(w) = watched.get(&(namespace.to_string(), name.to_string())) else {
            return true;
        };
        w.tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                (t > 0).then(|| t - 1)
            })
            .is_ok()
    }

    /// How many PDBs are watched now (for tests and debugging).
    pub fn watched(&self) -> usize {
        self.watched
            .lock()
            .map(|w| w.values().filter(|w| w.sender.receiver_count() > 0).count())
            .unwrap_or(0)
    }
}
