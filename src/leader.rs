//! Leader election through a coordination.k8s.io Lease: only the holder admits and evicts.
//!
//! The holder renews every `retry`; it gives up leadership (the process exits) when it could not
//! renew for `renew_deadline`, which is shorter than the lease duration, so a standby that takes
//! an expired lease never overlaps with a leader that still believes it leads.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, PostParams};

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
    renew_deadline: Duration,
    retry: Duration,
}

#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Leading,
    Following { holder: String },
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
            name: name.to_string(),
            identity,
            // client-go's proportions: renew deadline 2/3, retry 1/5 of the lease duration.
            renew_deadline: lease_duration * 2 / 3,
            retry: (lease_duration / 5).max(Duration::from_millis(200)),
            lease_duration,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Returns once this process holds the lease.
    pub async fn acquire(&self) {
        let mut last_holder = String::new();
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "became leader");
                    return;
                }
                Ok(Attempt::Following { holder }) => {
                    if holder != last_holder {
                        tracing::info!(lease = %self.name, %holder, "waiting for the lease held by another replica");
                        last_holder = holder;
                    }
                }
                Err(err) => {
                    tracing::warn!(lease = %self.name, %err, "could not read or take the lease; retrying")
                }
            }
            tokio::time::sleep(self.retry).await;
        }
    }

    /// Renews the lease until it is lost; returns a message saying why.
    pub async fn hold(&self) -> String {
        let mut last_renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.retry).await;
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Leading) => last_renewed = tokio::time::Instant::now(),
                Ok(Attempt::Following { holder }) => {
                    return format!("lease {} was taken by {holder}", self.name);
                }
                Err(err) => {
                    tracing::warn!(lease = %self.name, %err, "could not renew the lease");
                }
            }
            if last_renewed.elapsed() > self.renew_deadline {
                return format!(
                    "could not renew lease {} for {:?}",
                    self.name, self.renew_deadline
                );
            }
        }
    }

    /// Lets a standby take over at once after a clean shutdown.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() == Some(self.identity.as_str()) {
                spec.holder_identity = None;
                spec.renew_time = None;
                spec.acquire_time = None;
                let _ = self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await;
            }
        }
    }

    async fn try_acquire_or_renew(&self) -> Result<Attempt, kube::Error> {
        let now = MicroTime(jiff::Timestamp::now());
        let seconds = i32::try_from(self.lease_duration.as_secs())
            .unwrap_or(i32::MAX)
            .max(1);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Leading),
                // Another replica created it first.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Following {
                    holder: "another replica".into(),
                }),
                Err(err) => Err(err),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.identity;
        if !mine && !holder.is_empty() && !expired(spec, &now) {
            return Ok(Attempt::Following { holder });
        }
        if !mine {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(seconds);
        // replace carries the resourceVersion we read: two replicas racing for an expired lease
        // cannot both win.
        match self
            .api
            .replace(&lease.name_any(), &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Leading),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::Following {
                holder: "another replica".into(),
            }),
            Err(err) => Err(err),
        }
    }
}

fn expired(spec: &LeaseSpec, now: &MicroTime) -> bool {
    let Some(renewed) = spec.renew_time.as_ref() else {
        return true;
    };
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    now.0.as_second() - renewed.0.as_second() > duration
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> MicroTime {
        MicroTime(jiff::Timestamp::from_second(secs).expect("valid timestamp"))
    }

    #[test]
    fn a_lease_expires_after_its_duration() {
        let spec = LeaseSpec {
            renew_time: Some(at(100)),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        };
        assert!(!expired(&spec, &at(110)));
        assert!(!expired(&spec, &at(115)));
        assert!(expired(&spec, &at(116)));
        assert!(expired(&LeaseSpec::default(), &at(0)));
    }
}
