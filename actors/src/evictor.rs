//! The one eviction executor shared by every request actor: per-budget admission of eviction calls
//! (no more calls in flight for a PodDisruptionBudget than it allows, decided by
//! `maintenance_core::eviction::TokenBook` over one cluster-wide PDB cache), a global rate limit
//! on Eviction API calls (protecting the API server) and a precise reading of each answer.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, RwLock};

use futures::FutureExt;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, EvictParams, Preconditions};
use kube::runtime::reflector::Store;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use maintenance_core::drain_plan::pdb_selects;
use maintenance_core::eviction::{
    DeleteOutcome, EvictionOutcome, GateVerdict, Lane, PdbAllowance, TokenBook,
};
use maintenance_core::lifecycle::EvictionOrder;

use crate::metrics::Metrics;

/// The tokens of each PodDisruptionBudget, over the operator's one cluster-wide PDB cache
/// ([`crate::pdb_watch::PdbWatches`], watched from the start: budgets are few and small, and a
/// replica that becomes leader needs them at once).
struct PdbGate {
    pdbs: Store<PodDisruptionBudget>,
    book: Mutex<TokenBook>,
}

impl PdbGate {
    /// The cache once it holds the cluster's budgets; never waits: until then calls go ungated
    /// (the API server still enforces every budget).
    fn store(&self) -> Option<&Store<PodDisruptionBudget>> {
        self.pdbs.wait_until_ready().now_or_never()?.ok()?;
        Some(&self.pdbs)
    }

    /// May the eviction of a pod of `namespace` with `labels` be called now? With the budget
    /// whose disruption the call claimed, if any (see [`PdbGate::release`]).
    fn admit(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> (GateVerdict, Option<PdbAllowance>) {
        let Some(store) = self.store() else {
            return (GateVerdict::Call, None);
        };
        let pdbs = store.state();
        let covering: Vec<PdbAllowance> = pdbs
            .iter()
            .filter(|pdb| pdb_selects(pdb, namespace, labels))
            .map(|pdb| PdbAllowance {
                key: (
                    namespace.to_string(),
                    pdb.metadata.name.clone().unwrap_or_default(),
                ),
                resource_version: pdb.metadata.resource_version.clone().unwrap_or_default(),
                disruptions_allowed: pdb
                    .status
                    .as_ref()
                    .and_then(|s| s.disruptions_allowed)
                    .unwrap_or(0),
            })
            .collect();
        let Ok(mut book) = self.book.lock() else {
            return (GateVerdict::Call, None);
        };
        if book.len() > pdbs.len() {
            book.retain(|(ns, name)| {
                pdbs.iter().any(|p| {
                    p.metadata.namespace.as_deref() == Some(ns.as_str())
                        && p.metadata.name.as_deref() == Some(name.as_str())
                })
            });
        }
        let verdict = book.admit(&covering, jiff::Timestamp::now());
        let claimed = match (&verdict, covering.as_slice()) {
            (GateVerdict::Call, [pdb]) => Some(pdb.clone()),
            _ => None,
        };
        (verdict, claimed)
    }

    /// The call made under `claimed` used no disruption: give it back.
    fn release(&self, claimed: &PdbAllowance) {
        if let Ok(mut book) = self.book.lock() {
            book.release(claimed);
        }
    }
}

/// The eviction rate in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictionRate {
    pub per_second: u32,
    pub burst: u32,
}

/// Tells a request actor how its eviction went. Not called when the eviction was cancelled before
/// its call was sent.
pub type EvictionAnswer = Box<dyn FnOnce(EvictionOrder, EvictionOutcome) + Send>;

/// One pod's eviction, waiting in the evictor's queue for its turn.
pub struct QueuedEviction {
    pub order: EvictionOrder,
    /// Fired (the request went, the pod left the plan) before the call is sent: the call is
    /// never sent and `answer` never called.
    pub cancel: CancellationToken,
    pub answer: EvictionAnswer,
}

/// The one eviction executor. Evictions wait in two queues, as data (64 bytes and a 16-byte
/// answer each) rather than as tasks: 500 nodes of 20 pods put 10,000 evictions in line at once,
/// and as tasks each held a future, a timer and its share of the rate limiter's wake-ups (every
/// waiter woke whenever a call was let through). First attempts wait in one queue and retries
/// (pods refused or held before, whose budget may have room now) in the other, and the
/// dispatcher takes from them in turns ([`Lane::next_order`]), first queued first called within
/// each: a retry no longer waits behind every first attempt queued after it was refused. It
/// takes a call slot, then the budget's gate, then the rate limit, then makes the call in a task
/// of its own that lives as long as the call.
pub struct Evictor {
    calls: Arc<Calls>,
    first_attempts: mpsc::UnboundedSender<QueuedEviction>,
    retries: mpsc::UnboundedSender<QueuedEviction>,
    /// Taken by the first eviction queued, which starts the dispatcher (a runtime is needed).
    dispatcher: Mutex<Option<Queues>>,
}

/// The receiving ends of the two lanes.
struct Queues {
    first_attempts: mpsc::UnboundedReceiver<QueuedEviction>,
    retries: mpsc::UnboundedReceiver<QueuedEviction>,
}

impl Queues {
    /// The next eviction, from the lane whose turn it is when both hold one; `None` once the
    /// evictor is gone.
    async fn next(&mut self, last: Option<Lane>) -> Option<(Lane, QueuedEviction)> {
        let take = |lane: Lane, eviction: Option<QueuedEviction>| eviction.map(|e| (lane, e));
        match Lane::next_order(last) {
            [Lane::Retry, _] => tokio::select! {
                biased;
                Some(e) = self.retries.recv() => Some((Lane::Retry, e)),
                e = self.first_attempts.recv() => take(Lane::FirstAttempt, e),
            },
            _ => tokio::select! {
                biased;
                Some(e) = self.first_attempts.recv() => Some((Lane::FirstAttempt, e)),
                e = self.retries.recv() => take(Lane::Retry, e),
            },
        }
    }
}

/// What the dispatcher and the calls it starts share.
struct Calls {
    /// Must be built with `default_retry = false`: kube's own retry of 429s would hide a PDB's
    /// refusal inside the client for minutes instead of letting us back off per pod.
    client: kube::Client,
    limiter: RwLock<(EvictionRate, Arc<DefaultDirectRateLimiter>)>,
    metrics: Arc<Metrics>,
    gate: PdbGate,
    /// Eviction calls in flight, at most the client's bound: past it a call would wait inside
    /// the client with its request built.
    slots: Arc<Semaphore>,
}

fn limiter_for(rate: EvictionRate) -> Arc<DefaultDirectRateLimiter> {
    let per_second = NonZeroU32::new(rate.per_second).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(rate.burst).unwrap_or(NonZeroU32::MIN);
    Arc::new(RateLimiter::direct(
        Quota::per_second(per_second).allow_burst(burst),
    ))
}

impl Evictor {
    /// `pdbs`: the store of the operator's PDB cache ([`crate::pdb_watch::PdbWatches::store`]);
    /// `max_in_flight`: the bound on calls in flight of `client`.
    pub fn new(
        client: kube::Client,
        rate: EvictionRate,
        metrics: Arc<Metrics>,
        pdbs: Store<PodDisruptionBudget>,
        max_in_flight: usize,
    ) -> Evictor {
        let (first_attempts, first_attempts_rx) = mpsc::unbounded_channel();
        let (retries, retries_rx) = mpsc::unbounded_channel();
        Evictor {
            calls: Arc::new(Calls {
                gate: PdbGate {
                    pdbs,
                    book: Mutex::new(TokenBook::default()),
                },
                client,
                limiter: RwLock::new((rate, limiter_for(rate))),
                metrics,
                slots: Arc::new(Semaphore::new(max_in_flight.max(1))),
            }),
            first_attempts,
            retries,
            dispatcher: Mutex::new(Some(Queues {
                first_attempts: first_attempts_rx,
                retries: retries_rx,
            })),
        }
    }

    /// Applies a new rate from the config; a no-op when it did not change.
    pub fn set_rate(&self, rate: EvictionRate) {
        let Ok(mut guard) = self.calls.limiter.write() else {
            return;
        };
        if guard.0 != rate {
            tracing::info!(
                per_second = rate.per_second,
                burst = rate.burst,
                "eviction rate changed"
            );
            *guard = (rate, limiter_for(rate));
        }
    }

    pub fn rate(&self) -> Option<EvictionRate> {
        self.calls.limiter.read().ok().map(|g| g.0)
    }

    /// Puts one pod's eviction in line. Its answer comes through `eviction.answer`: a refusal by
    /// the pod's PodDisruptionBudget without a call when the budget's disruptions are all spoken
    /// for, else what the API server said. The pod's UID guards against evicting a new pod that
    /// took the old one's name. A call sent is never abandoned: the API server may act on it,
    /// and its answer frees the budget's claim.
    pub fn submit(&self, eviction: QueuedEviction) {
        if let Ok(mut dispatcher) = self.dispatcher.lock()
            && let Some(queue) = dispatcher.take()
        {
            tokio::spawn(dispatch(self.calls.clone(), queue));
        }
        self.calls.metrics.drain.evictions_queued.inc();
        let queue = match Lane::of(eviction.order.is_retry) {
            Lane::FirstAttempt => &self.first_attempts,
            Lane::Retry => &self.retries,
        };
        if queue.send(eviction).is_err() {
            // Only when the dispatcher is gone, which it never is while the evictor lives.
            self.calls.metrics.drain.evictions_queued.dec();
        }
    }

    /// Deletes one pod past `drainSpec.forceDeleteAfterSeconds`, under the same rate limit as
    /// evictions (not in their queue: a pod past its deadline has waited long enough). No grace
    /// period is given, so the pod keeps its own `terminationGracePeriodSeconds` (as an eviction
    /// would): only the budget is bypassed, not the workload's shutdown (preStop hooks,
    /// connection draining); a grace period of 0 would also remove the object before the kubelet
    /// confirms the containers stopped. `uid` guards against deleting a new pod that took the
    /// old one's name. `None` when `cancel` fired before the call was sent.
    pub async fn force_delete(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        cancel: &CancellationToken,
    ) -> Option<DeleteOutcome> {
        if !self.calls.wait_for_rate(cancel).await {
            return None;
        }
        let pods: Api<Pod> = Api::namespaced(self.calls.client.clone(), namespace);
        let params = DeleteParams {
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        Some(classify_delete(
            Box::pin(pods.delete(name, &params)).await.map(|_| ()),
        ))
    }
}

/// Takes the queued evictions in turn until the evictor is dropped.
async fn dispatch(calls: Arc<Calls>, mut queues: Queues) {
    let mut last = None;
    while let Some((lane, eviction)) = queues.next(last).await {
        last = Some(lane);
        let QueuedEviction {
            order,
            cancel,
            answer,
        } = eviction;
        calls.metrics.drain.evictions_queued.dec();
        if cancel.is_cancelled() {
            continue;
        }
        // A slot first, so that no budget is claimed while the calls in flight are at the bound.
        let slot = tokio::select! {
            biased;
            _ = cancel.cancelled() => continue,
            slot = calls.slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return,
            },
        };
        let (verdict, claimed) = calls.gate.admit(order.namespace(), order.labels());
        if let GateVerdict::Hold {
            pdb,
            disruptions_allowed,
        } = verdict
        {
            calls.metrics.drain.evictions_held_total.inc();
            answer(order, GateVerdict::hold_outcome(&pdb, disruptions_allowed));
            continue;
        }
        // Cancelled while it waits for the rate limit (its request was deleted), the call never
        // goes out: its claim goes back at once, not after the claim's time-to-live. Once the
        // call is sent the API server may act on it, and the claim stays until its answer.
        if !calls.wait_for_rate(&cancel).await {
            if let Some(claimed) = &claimed {
                calls.gate.release(claimed);
            }
            continue;
        }
        let calls = calls.clone();
        tokio::spawn(async move {
            let outcome = calls.evict(&order, claimed.as_ref()).await;
            answer(order, outcome);
            // Freed once the actor is told: with one slot, answers come in the order of the calls.
            drop(slot);
        });
    }
}

impl Calls {
    /// Calls the Eviction API for the pod of `order`, `claimed` the budget's disruption the gate
    /// gave it.
    async fn evict(
        &self,
        order: &EvictionOrder,
        claimed: Option<&PdbAllowance>,
    ) -> EvictionOutcome {
        if order.is_retry {
            self.metrics.drain.eviction_retries_total.inc();
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), order.namespace());
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                preconditions: order.uid().map(|uid| Preconditions {
                    uid: Some(uid.to_string()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            }),
            ..EvictParams::default()
        };
        let outcome = classify(pods.evict(order.name(), &params).await);
        if let Some(claimed) = claimed
            && outcome.used_no_disruption()
        {
            self.gate.release(claimed);
        }
        let (result, code) = outcome.metric_labels();
        self.metrics
            .drain
            .eviction_requests_total
            .with_label_values(&[result, &code])
            .inc();
        outcome
    }

    fn current_limiter(&self) -> Option<Arc<DefaultDirectRateLimiter>> {
        self.limiter.read().ok().map(|g| g.1.clone())
    }

    /// Waits for the global rate limit; false when `cancel` fires first.
    async fn wait_for_rate(&self, cancel: &CancellationToken) -> bool {
        let Some(limiter) = self.current_limiter() else {
            return !cancel.is_cancelled();
        };
        tokio::select! {
            biased;
            _ = cancel.cancelled() => false,
            _ = limiter.until_ready() => true,
        }
    }
}

fn classify_delete(result: Result<(), kube::Error>) -> DeleteOutcome {
    match result {
        Ok(()) => DeleteOutcome::Deleted,
        Err(kube::Error::Api(status)) => match status.code {
            404 => DeleteOutcome::Gone,
            // The UID precondition failed: the pod we meant is gone and another took its name.
            409 if status.message.contains("UID") || status.message.contains("uid") => {
                DeleteOutcome::Gone
            }
            code => DeleteOutcome::Error {
                code: Some(code),
                message: status.message.clone(),
            },
        },
        Err(other) => DeleteOutcome::Error {
            code: None,
            message: other.to_string(),
        },
    }
}

fn classify(result: Result<kube::core::response::Status, kube::Error>) -> EvictionOutcome {
    match result {
        Ok(_) => EvictionOutcome::Evicted,
        Err(kube::Error::Api(status)) => match status.code {
            404 => EvictionOutcome::Gone,
            // The UID precondition failed: the pod we meant is gone and another took its name.
            409 if status.message.contains("UID") || status.message.contains("uid") => {
                EvictionOutcome::Gone
            }
            429 => EvictionOutcome::Refused {
                pdb: pdb_name_from_status(&status),
                message: refusal_message(&status),
                held: false,
            },
            500 if status.message.contains("more than one PodDisruptionBudget") => {
                EvictionOutcome::MultiplePdbs {
                    message: status.message.clone(),
                }
            }
            code => EvictionOutcome::Error {
                code: Some(code),
                message: status.message.clone(),
            },
        },
        Err(other) => EvictionOutcome::Error {
            code: None,
            message: other.to_string(),
        },
    }
}

/// The API server names the PDB in a `DisruptionBudget` cause:
/// "The disruption budget web needs 9 healthy pods and has 9 currently".
fn pdb_name_from_status(status: &kube::core::response::Status) -> Option<String> {
    status
        .details
        .as_ref()?
        .causes
        .iter()
        .filter(|c| c.reason == "DisruptionBudget")
        .find_map(|c| pdb_name_from_message(&c.message))
}

fn pdb_name_from_message(message: &str) -> Option<String> {
    let rest = message.strip_prefix("The disruption budget ")?;
    rest.split_whitespace().next().map(str::to_string)
}

fn refusal_message(status: &kube::core::response::Status) -> String {
    let causes: Vec<&str> = status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .map(|c| c.message.as_str())
        .filter(|m| !m.is_empty())
        .collect();
    if causes.is_empty() {
        status.message.clone()
    } else {
        format!("{} ({})", status.message, causes.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::response::{Status, StatusCause, StatusDetails};

    fn api_error(code: u16, message: &str, causes: Vec<StatusCause>) -> kube::Error {
        kube::Error::Api(
            Status::failure(message, "")
                .with_code(code)
                .with_details(StatusDetails {
                    name: String::new(),
                    group: String::new(),
                    kind: String::new(),
                    uid: String::new(),
                    causes,
                    retry_after_seconds: 0,
                })
                .boxed(),
        )
    }

    #[test]
    fn a_pdb_refusal_names_the_budget() {
        let cause = StatusCause {
            reason: "DisruptionBudget".into(),
            message: "The disruption budget web needs 9 healthy pods and has 9 currently".into(),
            field: String::new(),
        };
        let outcome = classify(Err(api_error(
            429,
            "Cannot evict pod as it would violate the pod's disruption budget.",
            vec![cause],
        )));
        let EvictionOutcome::Refused { pdb, message, .. } = outcome else {
            panic!("expected a refusal, got {outcome:?}");
        };
        assert_eq!(pdb.as_deref(), Some("web"));
        assert!(message.contains("needs 9 healthy pods"), "{message}");
    }

    #[test]
    fn delete_codes_map_to_outcomes() {
        assert_eq!(classify_delete(Ok(())), DeleteOutcome::Deleted);
        assert_eq!(
            classify_delete(Err(api_error(404, "pods \"web-1\" not found", vec![]))),
            DeleteOutcome::Gone
        );
        assert_eq!(
            classify_delete(Err(api_error(
                409,
                "Precondition failed: UID in precondition: a, UID in object meta: b",
                vec![]
            ))),
            DeleteOutcome::Gone
        );
        assert!(matches!(
            classify_delete(Err(api_error(403, "forbidden", vec![]))),
            DeleteOutcome::Error {
                code: Some(403),
                ..
            }
        ));
    }

    #[test]
    fn codes_map_to_outcomes() {
        assert_eq!(
            classify(Err(api_error(404, "not found", vec![]))),
            EvictionOutcome::Gone
        );
        assert_eq!(
            classify(Err(api_error(
                409,
                "Precondition failed: UID in precondition: a, UID in object meta: b",
                vec![]
            ))),
            EvictionOutcome::Gone
        );
        assert!(matches!(
            classify(Err(api_error(
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                vec![]
            ))),
            EvictionOutcome::MultiplePdbs { .. }
        ));
        assert!(matches!(
            classify(Err(api_error(403, "forbidden", vec![]))),
            EvictionOutcome::Error {
                code: Some(403),
                ..
            }
        ));
    }
}

#[cfg(test)]
mod queue {
    use super::*;
    use std::sync::mpsc as answers;
    use std::time::Duration;

    use k8s_openapi::api::policy::v1::{PodDisruptionBudgetSpec, PodDisruptionBudgetStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use kube::runtime::watcher;
    use maintenance_core::pod_view::CachedPod;
    use prometheus::core::Collector;

    /// An evictor whose calls fail at once (nothing listens at its API server's address), with
    /// the PDB cache `pdbs`.
    fn evictor(pdbs: Store<PodDisruptionBudget>, max_in_flight: usize) -> Evictor {
        Evictor::new(
            crate::testing::offline_client(),
            EvictionRate {
                per_second: 1000,
                burst: 1000,
            },
            Arc::new(Metrics::new().expect("fresh metrics register")),
            pdbs,
            max_in_flight,
        )
    }

    /// A PDB cache that is ready and holds `pdbs`.
    fn pdb_cache(pdbs: Vec<PodDisruptionBudget>) -> Store<PodDisruptionBudget> {
        let (store, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for pdb in pdbs {
            writer.apply_watcher_event(&watcher::Event::InitApply(pdb));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        store
    }

    fn pdb_of_app(app: &str, disruptions_allowed: i32) -> PodDisruptionBudget {
        PodDisruptionBudget {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(app.into()),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([("app".into(), app.into())])),
                    ..LabelSelector::default()
                }),
                ..PodDisruptionBudgetSpec::default()
            }),
            status: Some(PodDisruptionBudgetStatus {
                disruptions_allowed: Some(disruptions_allowed),
                ..PodDisruptionBudgetStatus::default()
            }),
        }
    }

    fn order(name: &str, app: &str) -> EvictionOrder {
        let pod: CachedPod = serde_json::from_value(serde_json::json!({
            "metadata": {
                "namespace": "ns",
                "name": name,
                "uid": format!("uid-{name}"),
                "labels": { "app": app },
            }
        }))
        .expect("a pod decodes as cached");
        EvictionOrder {
            key: format!("ns/{name}"),
            pod: Arc::new(pod),
            is_retry: false,
        }
    }

    /// Queues `order`; its answer (the pod's name and outcome) goes to `answers`.
    fn queue(
        evictor: &Evictor,
        order: EvictionOrder,
        cancel: &CancellationToken,
        answered: &answers::Sender<(String, EvictionOutcome)>,
    ) {
        let answered = answered.clone();
        evictor.submit(QueuedEviction {
            order,
            cancel: cancel.clone(),
            answer: Box::new(move |order, outcome| {
                let _ = answered.send((order.name().to_string(), outcome));
            }),
        });
    }

    fn next_answer(
        answers: &answers::Receiver<(String, EvictionOutcome)>,
    ) -> (String, EvictionOutcome) {
        answers
            .recv_timeout(Duration::from_secs(10))
            .expect("an answer within 10 s")
    }

    /// 10,000 pods wait in line when 500 nodes of 20 pods drain at once: each must be a few
    /// words, not a task with a future and a timer (about 1.3 KiB each before).
    #[test]
    fn a_queued_eviction_is_small() {
        let size = size_of::<QueuedEviction>();
        println!("a queued eviction: {size} bytes");
        assert!(size <= 64, "a queued eviction takes {size} bytes");
    }

    /// One call at a time: the answers come in the order the evictions were queued, and the
    /// queue's gauge goes back to zero.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn evictions_are_called_first_queued_first_called() {
        let evictor = evictor(pdb_cache(Vec::new()), 1);
        let (answered, answers) = answers::channel();
        let cancel = CancellationToken::new();
        let names = ["a", "b", "c", "d", "e"];
        for name in names {
            queue(&evictor, order(name, "web"), &cancel, &answered);
        }
        let got: Vec<String> =
            tokio::task::block_in_place(|| names.iter().map(|_| next_answer(&answers).0).collect());
        assert_eq!(got, names);
        assert_eq!(evictor.calls.metrics.drain.evictions_queued.get(), 0);
        // The last call's slot comes back just after its answer.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while evictor.calls.slots.available_permits() != 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the call slot never came back"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A retry (a pod refused before, whose budget may have room now) queued behind many first
    /// attempts is called second, not last: the lanes take turns. The dispatcher runs only when
    /// the test awaits (one thread), so every eviction is in line before the first call.
    #[tokio::test(flavor = "current_thread")]
    async fn a_retry_is_not_queued_behind_the_first_attempts() {
        const FIRST_ATTEMPTS: usize = 200;
        let evictor = evictor(pdb_cache(Vec::new()), 1);
        let (answered, mut answers) = tokio::sync::mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let submit = |order: EvictionOrder| {
            let answered = answered.clone();
            evictor.submit(QueuedEviction {
                order,
                cancel: cancel.clone(),
                answer: Box::new(move |order, _| {
                    let _ = answered.send(order.name().to_string());
                }),
            });
        };
        for i in 0..FIRST_ATTEMPTS {
            submit(order(&format!("first-{i}"), "web"));
        }
        let mut retry = order("retry", "web");
        retry.is_retry = true;
        submit(retry);
        let mut position = 0;
        while let Some(name) = answers.recv().await {
            position += 1;
            if name == "retry" {
                break;
            }
        }
        println!("a retry queued behind {FIRST_ATTEMPTS} first attempts was called {position}th");
        assert_eq!(position, 2, "first-0, then the retry");
    }

    /// Cancelled while it waits (its request went), an eviction is neither called nor
    /// answered; the ones behind it go on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_eviction_is_never_called() {
        let evictor = evictor(pdb_cache(Vec::new()), 1);
        let (answered, answers) = answers::channel();
        let gone = CancellationToken::new();
        gone.cancel();
        let kept = CancellationToken::new();
        queue(&evictor, order("a", "web"), &gone, &answered);
        queue(&evictor, order("b", "web"), &kept, &answered);
        let (name, outcome) = tokio::task::block_in_place(|| next_answer(&answers));
        assert_eq!(name, "b");
        assert!(
            matches!(outcome, EvictionOutcome::Error { code: None, .. }),
            "{outcome:?}"
        );
        let calls: u64 = evictor
            .calls
            .metrics
            .drain
            .eviction_requests_total
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .map(|m| m.get_counter().get_value())
            .sum::<f64>() as u64;
        assert_eq!(calls, 1, "only the pod still wanted was called");
        assert!(
            answers.try_recv().is_err(),
            "the cancelled pod got an answer"
        );
    }

    /// A pod whose budget has no disruption left is answered without a call, in its turn; the
    /// failed call of a pod under a budget with room gives its claim back to the next pod.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pod_whose_budget_has_no_room_is_held_without_a_call() {
        let evictor = evictor(
            pdb_cache(vec![pdb_of_app("db", 0), pdb_of_app("web", 1)]),
            1,
        );
        let (answered, answers) = answers::channel();
        let cancel = CancellationToken::new();
        queue(&evictor, order("db-0", "db"), &cancel, &answered);
        queue(&evictor, order("web-0", "web"), &cancel, &answered);
        queue(&evictor, order("web-1", "web"), &cancel, &answered);
        let got = tokio::task::block_in_place(|| {
            (0..3).map(|_| next_answer(&answers)).collect::<Vec<_>>()
        });
        let [(db, held), (web0, failed0), (web1, failed1)] = got.as_slice() else {
            panic!("three answers: {got:?}");
        };
        assert_eq!([db, web0, web1], ["db-0", "web-0", "web-1"]);
        assert!(
            matches!(held, EvictionOutcome::Refused { held: true, pdb: Some(pdb), .. } if pdb == "db"),
            "{held:?}"
        );
        // web allows one disruption: web-0 claimed it, its call failed and gave it back, so
        // web-1 was called too rather than held.
        for failed in [failed0, failed1] {
            assert!(
                matches!(failed, EvictionOutcome::Error { code: None, .. }),
                "{failed:?}"
            );
        }
        assert_eq!(evictor.calls.metrics.drain.evictions_held_total.get(), 1);
    }
}
