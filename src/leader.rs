//! Leader election through a coordination.k8s.io Lease: only the holder admits and evicts.
//!
//! The decision is `maintenance_core::leader` (client-go's rules: a standby takes a lease only
//! once the record stayed unchanged for its lease duration on the standby's own monotonic clock,
//! so skewed clocks never matter). This shell reads and writes the Lease, in the shape client-go
//! writes it, so our replicas and NVIDIA's controller-runtime manager can share one Lease.
//!
//! The holder renews every `retry`; it gives up leadership (the process exits) when it could not
//! renew for `renew_deadline`, which is shorter than the lease duration, so a standby that takes
//! an expired lease never overlaps with a leader that still believes it leads. Every write
//! carries the resourceVersion just read: of two standbys racing for one lease, one gets 409.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ObjectMeta, PostParams};
use maintenance_actors::context::{api_status_code, is_conflict};
use maintenance_core::leader::{self, LeaseRecord, Observation, Verdict};

pub struct LeaderElector {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry: Duration,
    /// Origin of the monotonic instants handed to the core.
    origin: Instant,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    observed: Option<Observation>,
    /// When the last successful write of our record was sent: the record cannot have been
    /// observed by anyone earlier, so the renew deadline counts from here.
    renewed: Option<Instant>,
}

#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Leading,
    Following {
        holder: String,
        wait: Duration,
    },
    /// Someone wrote the lease between our read and our write; read it again.
    Conflict,
}

impl LeaderElector {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: String,
        lease_duration: Duration,
    ) -> LeaderElector {
        LeaderElector {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity,
            // client-go's proportions: renew deadline 2/3, retry 1/5 of the lease duration.
            renew_deadline: lease_duration * 2 / 3,
            retry: (lease_duration / 5).max(Duration::from_millis(200)),
            lease_duration,
            origin: Instant::now(),
            state: Mutex::new(State::default()),
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Returns once this process holds the lease.
    pub async fn acquire(&self) {
        let mut last_holder = String::new();
        loop {
            let started = Instant::now();
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => {
                    self.renewed(started);
                    tracing::info!(lease = %self.describe(), identity = %self.identity, "became leader");
                    return;
                }
                Ok(Attempt::Following { holder, wait }) => {
                    if holder != last_holder {
                        tracing::info!(
                            lease = %self.describe(),
                            %holder,
                            "waiting for the lease held by another replica; it is taken over \
                             once its record stays unchanged for its lease duration \
                             (at the soonest in {:.1}s)",
                            wait.as_secs_f64()
                        );
                        last_holder = holder;
                    }
                }
                Ok(Attempt::Conflict) => {
                    tracing::debug!(lease = %self.describe(), "another replica wrote the lease first");
                }
                Err(err) => tracing::warn!(
                    lease = %self.describe(),
                    %err,
                    "could not read or take the lease; retrying. {}",
                    hint(&err, &self.namespace)
                ),
            }
            tokio::time::sleep(self.retry).await;
        }
    }

    /// Renews the lease until it is lost; returns a message saying why.
    pub async fn hold(&self) -> String {
        loop {
            tokio::time::sleep(self.retry).await;
            let deadline = self.renewed_at() + self.renew_deadline;
            let started = Instant::now();
            // A hanging request must not keep us leading past the deadline.
            let attempt =
                tokio::time::timeout_at(deadline.into(), self.try_acquire_or_renew()).await;
            match attempt {
                Ok(Ok(Attempt::Leading)) => self.renewed(started),
                Ok(Ok(Attempt::Following { holder, .. })) => {
                    return format!("lease {} was taken by {holder}", self.describe());
                }
                Ok(Ok(Attempt::Conflict)) => {
                    tracing::warn!(lease = %self.describe(), "the lease changed while we renewed it; reading it again");
                }
                Ok(Err(err)) => {
                    tracing::warn!(lease = %self.describe(), %err, "could not renew the lease. {}", hint(&err, &self.namespace));
                }
                Err(_) => {
                    return format!(
                        "renewing lease {} did not complete within the renew deadline ({:?})",
                        self.describe(),
                        self.renew_deadline
                    );
                }
            }
            if self.renewed_at() + self.renew_deadline <= Instant::now() {
                return format!(
                    "could not renew lease {} for {:?} (the renew deadline); see the warnings above",
                    self.describe(),
                    self.renew_deadline
                );
            }
        }
    }

    /// Lets a standby take over at once after a clean shutdown.
    pub async fn release(&self) {
        let lease = match self.api.get_opt(&self.name).await {
            Ok(Some(lease)) => lease,
            Ok(None) => return,
            Err(err) => {
                tracing::warn!(lease = %self.describe(), %err, "could not release the lease; a standby takes over after the lease duration");
                return;
            }
        };
        let record = LeaseRecord::from_spec(lease.spec.as_ref());
        if record.holder != self.identity {
            return;
        }
        let mut lease = lease;
        lease.spec = Some(leader::released(&record, jiff::Timestamp::now()).to_spec());
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.describe(), "released the lease"),
            Err(err) => {
                tracing::warn!(lease = %self.describe(), %err, "could not release the lease; a standby takes over after the lease duration")
            }
        }
    }

    /// `namespace/name` of the Lease.
    pub fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is plain data: a panic elsewhere cannot leave it half-written.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn renewed(&self, at: Instant) {
        self.lock().renewed = Some(at);
    }

    fn renewed_at(&self) -> Instant {
        self.lock().renewed.unwrap_or(self.origin)
    }

    /// Remembers the record we just wrote as observed now (client-go's `setObservedRecord`).
    fn wrote(&self, record: LeaseRecord) {
        let now = self.now();
        self.lock().observed = Some(Observation { record, since: now });
    }

    async fn try_acquire_or_renew(&self) -> Result<Attempt, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let record = leader::claim(
                None,
                &self.identity,
                self.lease_duration,
                jiff::Timestamp::now(),
            );
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(record.to_spec()),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.wrote(record);
                    Ok(Attempt::Leading)
                }
                // Another candidate created it first.
                Err(err) if is_conflict(&err) => Ok(Attempt::Conflict),
                Err(err) => Err(err),
            };
        };
        let now = self.now();
        let observation = {
            let mut state = self.lock();
            let observation = Observation::observe(
                state.observed.take(),
                LeaseRecord::from_spec(lease.spec.as_ref()),
                now,
            );
            state.observed = Some(observation.clone());
            observation
        };
        match leader::decide(&observation, &self.identity, self.lease_duration, now) {
            Verdict::Follow { holder, until } => {
                return Ok(Attempt::Following {
                    holder,
                    wait: until.saturating_sub(now),
                });
            }
            Verdict::Leading | Verdict::MayTake => {}
        }
        let record = leader::claim(
            Some(&observation.record),
            &self.identity,
            self.lease_duration,
            jiff::Timestamp::now(),
        );
        lease.spec = Some(record.to_spec());
        // `lease` still carries the resourceVersion we read: if anyone wrote in between, the
        // API server refuses with 409 and nobody takes a lease on a stale reading.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => {
                self.wrote(record);
                Ok(Attempt::Leading)
            }
            Err(err) if is_conflict(&err) => Ok(Attempt::Conflict),
            Err(err) => Err(err),
        }
    }
}

/// What to do about an error of the Lease API.
fn hint(err: &kube::Error, namespace: &str) -> String {
    match api_status_code(err) {
        Some(403) => format!(
            "The operator's ServiceAccount needs get, update and create on Leases in namespace \
             {namespace} (the chart's Role grants them for leaderElection.leaseName and \
             leaderElection.leaseNamespace)."
        ),
        Some(404) => format!(
            "Does namespace {namespace} exist? Create it, or point --lease-namespace at an \
             existing one."
        ),
        _ => String::new(),
    }
}
