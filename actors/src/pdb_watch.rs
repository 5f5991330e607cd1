//! The cluster's PodDisruptionBudgets, from one watch shared by all request actors: the budgets that
//! cover a pod, and subscriptions to the budgets that block a drain right now. A PDB's status
//! change wakes the blocked evictions at once instead of at their next backoff; the evictor's
//! per-budget gate then decides how many of them call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
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
    /// Pods the disruption controller still counts as being evicted, with the time it stops
    /// counting each: an eviction it has not yet seen carried out. A StatefulSet's replacement
    /// has the evicted pod's name, and the controller keys this list by name, so it may hold a
    /// budget at zero until the entry expires (its `DeletionTimeout`, 2 minutes) although every
    /// pod is healthy.
    pub counted_as_evicted: Vec<(String, jiff::Timestamp)>,
}

/// The disruption controller's `DeletionTimeout` (pkg/controller/disruption/disruption.go): an
/// entry of `status.disruptedPods` older than this no longer counts.
const DISRUPTION_DELETION_TIMEOUT: jiff::SignedDuration = jiff::SignedDuration::from_secs(120);

impl PdbSummary {
    pub fn from_pdb(pdb: &PodDisruptionBudget) -> Option<PdbSummary> {
        let status = pdb.status.as_ref()?;
        let mut counted_as_evicted: Vec<(String, jiff::Timestamp)> = status
            .disrupted_pods
            .iter()
            .flatten()
            .filter_map(|(pod, since)| {
                Some((
                    pod.clone(),
                    since.0.checked_add(DISRUPTION_DELETION_TIMEOUT).ok()?,
                ))
            })
            .collect();
        counted_as_evicted.sort();
        Some(PdbSummary {
            current_healthy: status.current_healthy.unwrap_or(0),
            desired_healthy: status.desired_healthy.unwrap_or(0),
            disruptions_allowed: status.disruptions_allowed.unwrap_or(0),
            expected_pods: status.expected_pods.unwrap_or(0),
            counted_as_evicted,
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
        )?;
        if !self.counted_as_evicted.is_empty() {
            let pods: Vec<String> = self
                .counted_as_evicted
                .iter()
                .map(|(pod, until)| format!("{pod} until {}", until.strftime("%H:%M:%SZ")))
                .collect();
            write!(
                f,
                "; still counts as being evicted: {} (the disruption controller's 2-minute \
                 timeout for an eviction it has not seen carried out)",
                pods.join(", ")
            )?;
        }
        Ok(())
    }
}

/// The latest state of a watched PDB: `None` until seen, or once deleted.
pub type PdbState = Option<PdbSummary>;

type PdbKey = (String, String);
type WatchMap = Mutex<HashMap<PdbKey, Watched>>;

struct Watched {
    sender: watch::Sender<PdbState>,
    /// Live [`PdbSubscription`]s; the last one to drop removes the entry.
    subscribers: usize,
}

/// The cluster's PodDisruptionBudgets, from one watch shared by every request actor, and the
/// subscriptions of the actors waiting on some of them. One watch for all: a watch per blocking
/// PDB cost a LIST and a WATCH per PDB per drain (a quarter of a call per evicted pod), and
/// finding the budgets that cover a pod cost a LIST per pod.
pub struct PdbWatches {
    store: Store<PodDisruptionBudget>,
    /// Shared with the subscriptions, which remove their entry when the last one goes.
    watched: Arc<WatchMap>,
    _task: Option<AbortOnDrop>,
}

/// Interest in one PDB: changes whenever the PDB's counts change. Dropping the last subscription
/// of a PDB forgets it at once.
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
        // consistent, and releasing the entry matters more than the earlier panic.
        let mut watched = map.lock().unwrap_or_else(PoisonError::into_inner);
        let last = watched.get_mut(key).is_some_and(|w| {
            w.subscribers = w.subscribers.saturating_sub(1);
            w.subscribers == 0
        });
        if last {
            watched.remove(key);
        }
    }
}

fn key_of(pdb: &PodDisruptionBudget) -> PdbKey {
    (
        pdb.metadata.namespace.clone().unwrap_or_default(),
        pdb.metadata.name.clone().unwrap_or_default(),
    )
}

/// Tells the subscribers of `key`, if any, its new state; an unchanged state wakes nobody.
fn notify(watched: &WatchMap, key: &PdbKey, state: PdbState) {
    let Ok(watched) = watched.lock() else { return };
    if let Some(w) = watched.get(key) {
        w.sender.send_if_modified(|current| {
            let changed = *current != state;
            *current = state;
            changed
        });
    }
}

impl PdbWatches {
    /// Starts the watch when there is a runtime (always, in the operator); without one the cache
    /// stays empty and every caller falls back to reading the API server.
    pub fn new(client: kube::Client) -> PdbWatches {
        let (store, writer) = reflector::store();
        let watched: Arc<WatchMap> = Arc::new(Mutex::new(HashMap::new()));
        let task = tokio::runtime::Handle::try_current().is_ok().then(|| {
            let api: Api<PodDisruptionBudget> = Api::all(client);
            let stream = reflector::reflector(
                writer,
                watcher(api, watcher::Config::default())
                    .backoff(crate::task::watch_backoff())
                    .modify(|pdb| {
                        pdb.metadata.managed_fields = None;
                        pdb.metadata.annotations = None;
                    }),
            );
            let watched = Arc::clone(&watched);
            let store = store.clone();
            AbortOnDrop(tokio::spawn(async move {
                futures::pin_mut!(stream);
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(watcher::Event::Apply(pdb) | watcher::Event::InitApply(pdb)) => {
                            notify(&watched, &key_of(&pdb), PdbSummary::from_pdb(&pdb));
                        }
                        // Gone: nothing limits these pods any more.
                        Ok(watcher::Event::Delete(pdb)) => notify(&watched, &key_of(&pdb), None),
                        // After a re-list, a PDB deleted while the watch was down is gone too.
                        Ok(watcher::Event::InitDone) => {
                            let keys: Vec<PdbKey> = match watched.lock() {
                                Ok(w) => w.keys().cloned().collect(),
                                Err(_) => Vec::new(),
                            };
                            for key in keys {
                                let present =
                                    store.get(&ObjectRef::new(&key.1).within(&key.0)).is_some();
                                if !present {
                                    notify(&watched, &key, None);
                                }
                            }
                        }
                        Ok(watcher::Event::Init) => {}
                        Err(err) => {
                            tracing::debug!(%err, "PodDisruptionBudget watch error; retrying")
                        }
                    }
                }
            }))
        });
        PdbWatches {
            store,
            watched,
            _task: task,
        }
    }

    /// The cache, ready or not (for the evictor's per-budget gate, which shares it).
    pub fn store(&self) -> Store<PodDisruptionBudget> {
        self.store.clone()
    }

    /// The cache, once it holds the cluster's budgets; never waits.
    pub fn ready_store(&self) -> Option<&Store<PodDisruptionBudget>> {
        self.store.wait_until_ready().now_or_never()?.ok()?;
        Some(&self.store)
    }

    /// A subscription that changes whenever the PDB `namespace/name` changes. Drop it to lose
    /// interest.
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
        let (sender, receiver) = watch::channel(self.current(namespace, name));
        watched.insert(
            key,
            Watched {
                sender,
                subscribers: 1,
            },
        );
        PdbSubscription { receiver, entry }
    }

    /// The PDB's state in the cache (`None` while the cache is not ready), without subscribing.
    pub fn current(&self, namespace: &str, name: &str) -> PdbState {
        let store = self.ready_store()?;
        let pdb = store.get(&ObjectRef::new(name).within(namespace))?;
        PdbSummary::from_pdb(&pdb)
    }

    /// How many PDBs have subscribers now (for tests and debugging).
    pub fn watched(&self) -> usize {
        self.watched.lock().map(|w| w.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The watch task just retries with backoff against it, which is all these tests need.
    use crate::testing::offline_client as unreachable_client;

    #[tokio::test]
    async fn an_entry_ends_with_its_last_subscriber() {
        let watches = PdbWatches::new(unreachable_client());
        let first = watches.subscribe("team", "web");
        let second = watches.subscribe("team", "web");
        let other = watches.subscribe("team", "db");
        assert_eq!(
            watches.watched(),
            2,
            "one entry per PDB, however many subscribers"
        );

        drop(first);
        assert_eq!(watches.watched(), 2, "web still has a subscriber");
        drop(second);
        assert_eq!(
            watches.watched(),
            1,
            "web's entry ends with its last subscriber"
        );
        drop(other);
        assert_eq!(watches.watched(), 0);

        // Interest can come back: a new entry starts.
        let again = watches.subscribe("team", "web");
        assert_eq!(watches.watched(), 1);
        drop(again);
        assert_eq!(watches.watched(), 0);
    }

    fn summary(disruptions_allowed: i32) -> PdbState {
        Some(PdbSummary {
            current_healthy: 3,
            desired_healthy: 2,
            disruptions_allowed,
            expected_pods: 3,
            counted_as_evicted: Vec::new(),
        })
    }

    /// The shared watch brings every update of every budget; a subscriber wakes only when the
    /// counts of its own budget change, not at every resync or unrelated edit.
    #[tokio::test]
    async fn subscribers_wake_only_when_their_budget_changes() {
        let watches = PdbWatches::new(unreachable_client());
        let mut web = watches.subscribe("team", "web");
        let key = ("team".to_string(), "web".to_string());
        notify(&watches.watched, &key, summary(0));
        assert!(web.receiver.has_changed().unwrap_or(false));
        assert_eq!(*web.borrow_and_update(), summary(0));
        notify(&watches.watched, &key, summary(0));
        assert!(!web.receiver.has_changed().unwrap_or(true), "same counts");
        notify(
            &watches.watched,
            &("team".to_string(), "db".to_string()),
            summary(1),
        );
        assert!(
            !web.receiver.has_changed().unwrap_or(true),
            "another budget"
        );
        notify(&watches.watched, &key, None);
        assert!(web.receiver.has_changed().unwrap_or(false), "deleted");
    }

    /// A budget held at zero by an eviction the controller has not seen carried out (a
    /// StatefulSet pod re-created under its name) says which pod and until when.
    #[test]
    fn a_budget_held_by_a_disrupted_pod_entry_says_which_and_until_when() {
        use k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let since: jiff::Timestamp = "2026-12-01T06:10:18Z".parse().expect("a time");
        let pdb = PodDisruptionBudget {
            status: Some(PodDisruptionBudgetStatus {
                current_healthy: Some(11),
                desired_healthy: Some(11),
                disruptions_allowed: Some(0),
                expected_pods: Some(12),
                disrupted_pods: Some(std::collections::BTreeMap::from([(
                    "w009-9".to_string(),
                    Time(since),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let summary = PdbSummary::from_pdb(&pdb).expect("a status");
        assert_eq!(
            summary.to_string(),
            "currentHealthy=11 desiredHealthy=11 disruptionsAllowed=0 expectedPods=12; still \
             counts as being evicted: w009-9 until 06:12:18Z (the disruption controller's \
             2-minute timeout for an eviction it has not seen carried out)"
        );
    }
}
