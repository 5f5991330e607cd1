//! Watches of the PodDisruptionBudgets that block a drain right now, shared by all node actors:
//! one watch per PDB however many nodes wait on it, started on first interest and stopped when
//! nobody waits any more. A PDB's status change wakes the blocked evictions at once instead of
//! at their next backoff; the evictor's per-budget gate then decides how many of them call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

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

type PdbKey = (String, String);
type WatchMap = Mutex<HashMap<PdbKey, Watched>>;

struct Watched {
    sender: watch::Sender<PdbState>,
    /// Live [`PdbSubscription`]s; the last one to drop removes the entry, which aborts the task.
    subscribers: usize,
    _task: AbortOnDrop,
}

pub struct PdbWatches {
    client: kube::Client,
    /// Shared with the subscriptions, which remove their entry when the last one goes.
    watched: Arc<WatchMap>,
}

/// Interest in one PDB: changes whenever the PDB changes. Dropping the last subscription of a
/// PDB ends its watch at once (not at the PDB's next event, which may never come).
pub struct PdbSubscription {
    receiver: watch::Receiver<PdbState>,
    /// The entry to release on drop; `None` for a detached subscription that never changes.
    entry: Option<(Weak<WatchMap>, PdbKey)>,
}

impl PdbSubscription {
    /// Waits for the next change of the PDB; an error means the watch is gone for good.
    pub async fn changed(&mut self) -> Result<(), watch::error::RecvError> {
        self.receiver.changed().await
    }

    /// The PDB's latest state, marking it seen.
    pub fn borrow_and_update(&mut self) -> watch::Ref<'_, PdbState> {
        self.receiver.borrow_and_update()
    }

    /// Makes the next `changed()` return at once, to look at the current state first.
    pub fn mark_changed(&mut self) {
        self.receiver.mark_changed();
    }
}

impl Drop for PdbSubscription {
    fn drop(&mut self) {
        let Some((map, key)) = &self.entry else {
            return;
        };
        let Some(map) = map.upgrade() else { return };
        // Every edit of the map is complete before it unlocks, so a poisoned map is still
        // consistent, and releasing the watch matters more than the earlier panic.
        let mut watched = map.lock().unwrap_or_else(PoisonError::into_inner);
        let last = watched.get_mut(key).is_some_and(|w| {
            w.subscribers = w.subscribers.saturating_sub(1);
            w.subscribers == 0
        });
        let removed = if last { watched.remove(key) } else { None };
        // Abort the task outside the lock.
        drop(watched);
        drop(removed);
    }
}

impl PdbWatches {
    pub fn new(client: kube::Client) -> PdbWatches {
        PdbWatches {
            client,
            watched: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// A subscription that changes whenever the PDB `namespace/name` changes. Drop it to lose
    /// interest; the watch stops when the last subscription is gone.
    pub fn subscribe(&self, namespace: &str, name: &str) -> PdbSubscription {
        let Ok(mut watched) = self.watched.lock() else {
            // A poisoned lock only happens after a panic elsewhere; a subscription that never
            // changes degrades to backoff-only retries, which is still correct.
            return PdbSubscription {
                receiver: watch::channel(None).1,
                entry: None,
            };
        };
        let key = (namespace.to_string(), name.to_string());
        let entry = Some((Arc::downgrade(&self.watched), key.clone()));
        if let Some(existing) = watched.get_mut(&key) {
            existing.subscribers += 1;
            return PdbSubscription {
                receiver: existing.sender.subscribe(),
                entry,
            };
        }
        let (sender, receiver) = watch::channel(None);
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let tx = sender.clone();
        let task = tokio::spawn(async move {
            let stream = watcher(api, config).default_backoff();
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Apply(pdb) | watcher::Event::InitApply(pdb)) => {
                        tx.send_replace(PdbSummary::from_pdb(&pdb));
                    }
                    Ok(watcher::Event::Delete(_)) => {
                        // Gone: nothing limits these pods any more.
                        tx.send_replace(None);
                    }
                    Ok(_) => {}
                    Err(err) => tracing::debug!(%err, "PDB watch error; retrying"),
                }
            }
        });
        watched.insert(
            key,
            Watched {
                sender,
                subscribers: 1,
                _task: AbortOnDrop(task),
            },
        );
        PdbSubscription { receiver, entry }
    }

    /// The last known state, without subscribing.
    pub fn current(&self, namespace: &str, name: &str) -> PdbState {
        let watched = self.watched.lock().ok()?;
        watched
            .get(&(namespace.to_string(), name.to_string()))
            .and_then(|w| w.sender.borrow().clone())
    }

    /// How many PDBs are watched now (for tests and debugging): the entries of the map, each of
    /// which owns a running watch task.
    pub fn watched(&self) -> usize {
        self.watched.lock().map(|w| w.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client whose every request fails at once (nothing listens on port 9 of localhost): the
    /// watch tasks just retry with backoff, which is all these tests need.
    fn unreachable_client() -> kube::Client {
        let url = "http://127.0.0.1:9".parse().expect("a valid URL");
        kube::Client::try_from(kube::Config::new(url)).expect("a client needs no connection")
    }

    #[tokio::test]
    async fn the_watch_ends_when_its_last_subscriber_goes() {
        let watches = PdbWatches::new(unreachable_client());
        let first = watches.subscribe("team", "web");
        let second = watches.subscribe("team", "web");
        let other = watches.subscribe("team", "db");
        assert_eq!(
            watches.watched(),
            2,
            "one watch per PDB, however many subscribers"
        );

        drop(first);
        assert_eq!(watches.watched(), 2, "web still has a subscriber");
        drop(second);
        assert_eq!(
            watches.watched(),
            1,
            "web's watch ends with its last subscriber"
        );
        drop(other);
        assert_eq!(watches.watched(), 0);

        // Interest can come back: a new watch starts.
        let again = watches.subscribe("team", "web");
        assert_eq!(watches.watched(), 1);
        drop(again);
        assert_eq!(watches.watched(), 0);
    }
}
