//! The one eviction executor shared by every node actor: per-budget admission of eviction calls
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
use tokio_util::sync::CancellationToken;

use maintenance_core::drain_plan::pdb_selects;
use maintenance_core::eviction::{
    DeleteOutcome, EvictionOutcome, GateVerdict, PdbAllowance, TokenBook,
};

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
/// A budget claim whose eviction call has not been sent: dropped that way (the eviction was
/// cancelled), it is given back.
struct UnsentClaim<'a> {
    gate: &'a PdbGate,
    claimed: Option<&'a PdbAllowance>,
}

impl Drop for UnsentClaim<'_> {
    fn drop(&mut self) {
        if let Some(claimed) = self.claimed {
            self.gate.release(claimed);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictionRate {
    pub per_second: u32,
    pub burst: u32,
}

pub struct Evictor {
    /// Must be built with `default_retry = false`: kube's own retry of 429s would hide a PDB's
    /// refusal inside the client for minutes instead of letting us back off per pod.
    client: kube::Client,
    limiter: RwLock<(EvictionRate, Arc<DefaultDirectRateLimiter>)>,
    metrics: Arc<Metrics>,
    gate: PdbGate,
}

fn limiter_for(rate: EvictionRate) -> Arc<DefaultDirectRateLimiter> {
    let per_second = NonZeroU32::new(rate.per_second).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(rate.burst).unwrap_or(NonZeroU32::MIN);
    Arc::new(RateLimiter::direct(
        Quota::per_second(per_second).allow_burst(burst),
    ))
}

impl Evictor {
    /// `pdbs`: the store of the operator's PDB cache ([`crate::pdb_watch::PdbWatches::store`]).
    pub fn new(
        client: kube::Client,
        rate: EvictionRate,
        metrics: Arc<Metrics>,
        pdbs: Store<PodDisruptionBudget>,
    ) -> Evictor {
        Evictor {
            gate: PdbGate {
                pdbs,
                book: Mutex::new(TokenBook::default()),
            },
            client,
            limiter: RwLock::new((rate, limiter_for(rate))),
            metrics,
        }
    }

    /// Applies a new rate from the config; a no-op when it did not change.
    pub fn set_rate(&self, rate: EvictionRate) {
        let Ok(mut guard) = self.limiter.write() else {
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
        self.limiter.read().ok().map(|g| g.0)
    }

    fn current_limiter(&self) -> Option<Arc<DefaultDirectRateLimiter>> {
        self.limiter.read().ok().map(|g| g.1.clone())
    }

    /// Evicts one pod, unless its PodDisruptionBudget's disruptions are all spoken for (then the
    /// outcome is a refusal by that budget, without a call), waiting for the global rate limit
    /// first. `uid` guards against evicting a new pod that took the old one's name. `None` when
    /// `cancel` fired before the call was sent (a call sent is never abandoned: the API server
    /// may act on it, and its answer frees the budget's claim).
    pub async fn evict(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        labels: &BTreeMap<String, String>,
        is_retry: bool,
        cancel: &CancellationToken,
    ) -> Option<EvictionOutcome> {
        let (verdict, claimed) = self.gate.admit(namespace, labels);
        if let GateVerdict::Hold {
            pdb,
            disruptions_allowed,
        } = verdict
        {
            self.metrics.evictions_held_total.inc();
            return Some(GateVerdict::hold_outcome(&pdb, disruptions_allowed));
        }
        // Cancelled while it waits for the rate limit (its request was deleted), the call never
        // goes out: its claim goes back at once, not after the claim's time-to-live.
        let mut unsent = UnsentClaim {
            gate: &self.gate,
            claimed: claimed.as_ref(),
        };
        if !self.wait_for_rate(cancel).await {
            return None;
        }
        // From here the API server may act on the call: the claim stays until its answer.
        unsent.claimed = None;
        if is_retry {
            self.metrics.eviction_retries_total.inc();
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                preconditions: uid.map(|uid| Preconditions {
                    uid: Some(uid.to_string()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            }),
            ..EvictParams::default()
        };
        // Boxed: a task waits for the rate limit above holding only its arguments; the call's
        // larger state is allocated once it is sent.
        let outcome = classify(Box::pin(pods.evict(name, &params)).await);
        if let Some(claimed) = &claimed
            && outcome.used_no_disruption()
        {
            self.gate.release(claimed);
        }
        let (result, code) = outcome.metric_labels();
        self.metrics
            .eviction_requests_total
            .with_label_values(&[result, &code])
            .inc();
        Some(outcome)
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

    /// Deletes one pod past `drainSpec.forceDeleteAfterSeconds`, under the same rate limit as
    /// evictions. No grace period is given, so the pod keeps its own
    /// `terminationGracePeriodSeconds` (as an eviction would): only the budget is bypassed, not
    /// the workload's shutdown (preStop hooks, connection draining); a grace period of 0 would
    /// also remove the object before the kubelet confirms the containers stopped. `uid` guards
    /// against deleting a new pod that took the old one's name. `None` when `cancel` fired before
    /// the call was sent.
    pub async fn force_delete(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
        cancel: &CancellationToken,
    ) -> Option<DeleteOutcome> {
        if !self.wait_for_rate(cancel).await {
            return None;
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
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
mod waiting_size {
    use super::*;

    fn evictor() -> Evictor {
        // Never contacted: the futures below are measured, not run.
        let client = crate::testing::offline_client();
        let (pdbs, _writer) = kube::runtime::reflector::store();
        Evictor::new(
            client,
            EvictionRate {
                per_second: 1,
                burst: 1,
            },
            Arc::new(Metrics::new().expect("fresh metrics register")),
            pdbs,
        )
    }

    /// Every pod to evict is a task that first waits for the rate limit (10,000 of them when 500
    /// nodes of 20 pods drain at once). Waiting, it must hold its arguments, not room for the
    /// HTTP call it will make later: that call is boxed when it starts.
    #[tokio::test]
    async fn an_eviction_or_deletion_waiting_for_its_turn_is_small() {
        let evictor = evictor();
        let labels = BTreeMap::new();
        let cancel = CancellationToken::new();
        let eviction = evictor.evict("ns", "pod", None, &labels, false, &cancel);
        let deletion = evictor.force_delete("ns", "pod", None, &cancel);
        let (eviction, deletion) = (size_of_val(&eviction), size_of_val(&deletion));
        println!("eviction future: {eviction} bytes, deletion future: {deletion} bytes");
        assert!(
            eviction <= 768,
            "an eviction waiting for its turn takes {eviction} bytes"
        );
        assert!(
            deletion <= 768,
            "a deletion waiting for its turn takes {deletion} bytes"
        );
    }
}
