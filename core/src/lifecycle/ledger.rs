//! The node actor's memory between steps: the eviction ledger (each pod's calls, their answers
//! and retries, deletions past the escalation deadline) and what throttles the drain status.
//!
//! The actor talks to it through one narrow interface: what it learns goes in as a
//! [`LedgerEvent`] ([`Ledger::observe`]), and what it must do about the ledger comes out as a
//! [`LedgerOutlook`] (on every [`super::Step`], and from [`Ledger::outlook`] before a step). The
//! step itself reads and updates the rest.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use maintenance_crds::ForceDeletedPod;

use super::{
    EVICTION_MAX_BACKOFF, EVICTION_MIN_BACKOFF, HELD_RECHECK, SLOW_RETRY, after, namespace_of,
};
use crate::eviction::{DeleteOutcome, EvictionOutcome};

/// Eviction bookkeeping for one pod (in memory only: losing it costs at most one extra call).
#[derive(Debug, Clone, PartialEq)]
pub struct PodEviction {
    pub uid: Option<String>,
    pub attempts: u32,
    pub in_flight: bool,
    /// The API server accepted the eviction: now we wait for the pod to be gone.
    pub accepted: bool,
    pub next_attempt: Timestamp,
    /// Retry at the slow cadence (the attempt was made after the drain timed out).
    pub slow: bool,
    pub last: Option<EvictionOutcome>,
    /// For a MultiplePdbs refusal: the PDBs that select the pod (looked up once by the actor).
    pub covering_pdbs: Vec<String>,
    /// Set once the escalation deadline turned this pod's evictions into a deletion: from then
    /// on it is deleted (retried after an error), never evicted again.
    pub force: Option<ForceDelete>,
}

impl PodEviction {
    /// A deletion past the deadline was sent (or is about to be) and its answer has not come.
    pub fn awaits_deletion_answer(&self) -> bool {
        self.in_flight && self.force.is_some()
    }
}

/// A pod being deleted past the escalation deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForceDelete {
    /// The PodDisruptionBudget whose refusal the deletion bypasses.
    pub pdb: String,
    /// Why the last deletion failed (retried with backoff), for `status.drain.blocked`.
    pub error: Option<String>,
}

/// What the actor remembers between steps: evictions per pod (`namespace/name`), and what it
/// needs to throttle status writes and measure progress. Only the lifecycle reads its fields; the
/// actor holds it, feeds it [`LedgerEvent`]s and hands it to [`super::step`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    pub(super) evictions: BTreeMap<String, PodEviction>,
    pub(super) last_status_write: Option<Timestamp>,
    /// Largest (totalPods, evictionPods) seen in this drain: the counts only grow.
    pub(super) drain_counts: (usize, usize),
    pub(super) last_progress: Option<Timestamp>,
    pub(super) last_remaining: Option<usize>,
    /// Deletions past the escalation deadline that the API server accepted in this drain, until
    /// they are in `status.drain.forceDeleted` (which a restarted actor reads back).
    pub(super) force_deleted: Vec<ForceDeletedPod>,
}

/// What the actor learns outside the step and tells the ledger ([`Ledger::observe`]).
#[derive(Debug, Clone, PartialEq)]
pub enum LedgerEvent {
    /// The answer to one eviction call. `jitter` in [0, 1), drawn by the actor, spreads the
    /// retries of many pods.
    EvictionAnswered {
        key: String,
        uid: Option<String>,
        outcome: EvictionOutcome,
        jitter: f64,
    },
    /// The answer to one deletion past the escalation deadline (`jitter` as above).
    ForceDeleteAnswered {
        key: String,
        uid: Option<String>,
        outcome: DeleteOutcome,
        jitter: f64,
    },
    /// A PDB that blocked some of our pods now allows a disruption (or is gone).
    PdbChanged { namespace: String, name: String },
    /// The PDBs that select a pod refused because several do, as the actor looked them up for
    /// [`LedgerOutlook::covering_pdbs_wanted`].
    CoveringPdbs { key: String, pdbs: Vec<String> },
    /// The calls (evictions, deletions, by pod key) the actor has running after a step's actions
    /// ran or one of them failed.
    CallsRunning { running: BTreeSet<String> },
    /// A status write went through: the next drain progress write counts from it.
    StatusWritten,
}

/// What the actor must do about the ledger: which PDBs to watch and show in its gauges, and which
/// pods' covering PDBs to look up. Every [`super::Step`] carries the one after it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerOutlook {
    /// How many of our pods each PDB, as (namespace, name), blocks now: the
    /// `pods_blocked_by_pdb` gauge.
    pub blocked_by_pdb: BTreeMap<(String, String), usize>,
    /// Pods (`namespace/name`) refused because several PDBs select them, whose PDBs the actor has
    /// not looked up (from the pod's labels in its cache; the API server's 500 does not name
    /// them). Each answer goes back as [`LedgerEvent::CoveringPdbs`].
    pub covering_pdbs_wanted: Vec<String>,
}

impl LedgerOutlook {
    /// The PDBs our pods wait on now, as (namespace, name): the actor subscribes to exactly these
    /// and summarises them for the status.
    pub fn pdbs_to_watch(&self) -> impl Iterator<Item = &(String, String)> {
        self.blocked_by_pdb.keys()
    }

    /// Whether our pods wait on this PDB (namespace, name) now.
    pub fn watches(&self, pdb: &(String, String)) -> bool {
        self.blocked_by_pdb.contains_key(pdb)
    }
}

impl Ledger {
    /// Takes in one thing the actor learned at `now`. Returns the running calls the ledger no
    /// longer waits for, which the actor cancels: only [`LedgerEvent::CallsRunning`] names any.
    pub fn observe(&mut self, event: LedgerEvent, now: Timestamp) -> Vec<String> {
        match event {
            LedgerEvent::EvictionAnswered {
                key,
                uid,
                outcome,
                jitter,
            } => self.record(&key, uid.as_deref(), outcome, now, jitter),
            LedgerEvent::ForceDeleteAnswered {
                key,
                uid,
                outcome,
                jitter,
            } => self.record_force_delete(&key, uid.as_deref(), outcome, now, jitter),
            LedgerEvent::PdbChanged { namespace, name } => {
                self.wake_blocked_by(&namespace, &name, now);
            }
            LedgerEvent::CoveringPdbs { key, pdbs } => self.set_covering_pdbs(&key, pdbs),
            LedgerEvent::CallsRunning { running } => return self.settle_calls(&running, now),
            LedgerEvent::StatusWritten => self.last_status_write = Some(now),
        }
        Vec::new()
    }

    /// What the actor must do about the ledger as it stands: before a step, the covering PDBs to
    /// look up and the PDBs whose state the step reads.
    pub fn outlook(&self) -> LedgerOutlook {
        LedgerOutlook {
            blocked_by_pdb: self.blocked_by_pdb(),
            covering_pdbs_wanted: self.needs_covering_pdbs(),
        }
    }

    /// Forgets the drain (a phase without one, or the request ends).
    pub(super) fn clear(&mut self) {
        *self = Ledger {
            last_status_write: self.last_status_write,
            ..Ledger::default()
        };
    }

    /// The answer to one eviction call. `jitter` in [0, 1) spreads retries of many pods.
    pub(super) fn record(
        &mut self,
        key: &str,
        uid: Option<&str>,
        outcome: EvictionOutcome,
        now: Timestamp,
        jitter: f64,
    ) {
        let Some(entry) = self.evictions.get_mut(key) else {
            return;
        };
        if entry.uid.as_deref() != uid {
            return;
        }
        entry.in_flight = false;
        match &outcome {
            EvictionOutcome::Evicted | EvictionOutcome::Gone => {
                entry.accepted = true;
                self.last_progress = Some(now);
            }
            // Held by the per-budget gate: no call was made, so it is no attempt, and it looks
            // again soon (a look costs no call) in case the budget's change that wakes it was
            // seen before the gate's own cache caught up.
            EvictionOutcome::Refused { held: true, .. } => {
                entry.attempts = entry.attempts.saturating_sub(1);
                entry.next_attempt = after(now, HELD_RECHECK.mul_f64(0.5 + jitter.clamp(0.0, 1.0)));
            }
            EvictionOutcome::Refused { .. }
            | EvictionOutcome::MultiplePdbs { .. }
            | EvictionOutcome::Error { .. } => {
                let delay = if entry.slow {
                    SLOW_RETRY
                } else {
                    retry_delay(entry.attempts, jitter)
                };
                entry.next_attempt = after(now, delay);
            }
        }
        entry.last = Some(outcome);
    }

    /// The answer to one deletion past the escalation deadline. `jitter` as in [`Ledger::record`].
    pub(super) fn record_force_delete(
        &mut self,
        key: &str,
        uid: Option<&str>,
        outcome: DeleteOutcome,
        now: Timestamp,
        jitter: f64,
    ) {
        let Some(entry) = self.evictions.get_mut(key) else {
            return;
        };
        if entry.uid.as_deref() != uid {
            return;
        }
        let Some(force) = entry.force.as_mut() else {
            return;
        };
        entry.in_flight = false;
        match outcome {
            DeleteOutcome::Deleted => {
                self.force_deleted.push(ForceDeletedPod {
                    pod: key.to_string(),
                    pdb: force.pdb.clone(),
                    // As the API server stores it, so the record on the object is the same one.
                    deleted_at: Time(whole_seconds(now)),
                });
                force.error = None;
                entry.accepted = true;
                // No longer waiting on the budget: not counted as blocked, not watched.
                entry.last = None;
                self.last_progress = Some(now);
            }
            DeleteOutcome::Gone => {
                force.error = None;
                entry.accepted = true;
                entry.last = None;
                self.last_progress = Some(now);
            }
            DeleteOutcome::Error { code, message } => {
                force.error = Some(match code {
                    Some(code) => format!("HTTP {code}: {message}"),
                    None => message,
                });
                entry.next_attempt = after(now, retry_delay(entry.attempts, jitter));
            }
        }
    }

    /// Squares the ledger with the calls (evictions, deletions) the actor has running, after a
    /// step's actions ran or one of them failed. An entry marked in flight whose call is not
    /// running never started (an action before it in the step failed): it is due again now, or
    /// it would wait for an answer that never comes and its pod would never be evicted. Returns
    /// the running calls the ledger no longer waits for (the drain stopped: the request was
    /// deleted, its requestor failed, the phase moved on, or the pod went away), which the actor
    /// cancels: one not sent yet never is, so nothing more is evicted for a drain that stopped.
    pub(super) fn settle_calls(
        &mut self,
        running: &BTreeSet<String>,
        now: Timestamp,
    ) -> Vec<String> {
        for (key, entry) in self.evictions.iter_mut() {
            if entry.in_flight && !running.contains(key) {
                entry.in_flight = false;
                entry.attempts = entry.attempts.saturating_sub(1);
                entry.next_attempt = now;
            }
        }
        running
            .iter()
            .filter(|key| self.evictions.get(*key).is_none_or(|e| !e.in_flight))
            .cloned()
            .collect()
    }

    /// A PDB changed (or is gone): the pods it blocked may retry at once. All of them are woken;
    /// the evictor's per-budget gate ([`crate::eviction::TokenBook`]) lets as many calls through as
    /// the budget allows and holds the rest back without a call.
    pub(super) fn wake_blocked_by(&mut self, namespace: &str, pdb: &str, now: Timestamp) {
        let prefix = format!("{namespace}/");
        for (key, entry) in self.evictions.iter_mut() {
            let waits_on_pdb = match &entry.last {
                Some(EvictionOutcome::Refused { pdb: Some(p), .. }) => p == pdb,
                Some(EvictionOutcome::MultiplePdbs { .. }) => {
                    entry.covering_pdbs.iter().any(|p| p == pdb)
                }
                _ => false,
            };
            if key.starts_with(&prefix)
                && waits_on_pdb
                && !entry.in_flight
                && entry.next_attempt > now
            {
                entry.next_attempt = now;
            }
        }
    }

    /// Pods refused because several PDBs select them whose PDBs are not known yet
    /// ([`LedgerOutlook::covering_pdbs_wanted`]).
    fn needs_covering_pdbs(&self) -> Vec<String> {
        self.evictions
            .iter()
            .filter(|(_, e)| {
                matches!(e.last, Some(EvictionOutcome::MultiplePdbs { .. }))
                    && e.covering_pdbs.is_empty()
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    fn set_covering_pdbs(&mut self, key: &str, pdbs: Vec<String>) {
        if let Some(entry) = self.evictions.get_mut(key) {
            entry.covering_pdbs = pdbs;
        }
    }

    /// How many of our pods each PDB blocks now ([`LedgerOutlook::blocked_by_pdb`]).
    pub(super) fn blocked_by_pdb(&self) -> BTreeMap<(String, String), usize> {
        let mut out: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (key, entry) in &self.evictions {
            let namespace = namespace_of(key).to_string();
            match &entry.last {
                Some(EvictionOutcome::Refused { pdb: Some(pdb), .. }) => {
                    *out.entry((namespace, pdb.clone())).or_default() += 1;
                }
                Some(EvictionOutcome::MultiplePdbs { .. }) => {
                    for pdb in &entry.covering_pdbs {
                        *out.entry((namespace.clone(), pdb.clone())).or_default() += 1;
                    }
                }
                _ => {}
            }
        }
        out
    }
}

/// Exponential backoff (×2 from [`EVICTION_MIN_BACKOFF`] up to [`EVICTION_MAX_BACKOFF`], backon's
/// schedule without its random jitter, which a pure step cannot draw) scaled by 0.5–1.5 from the
/// caller's `jitter`, so that pods refused together do not retry together.
pub fn retry_delay(attempts: u32, jitter: f64) -> Duration {
    use backon::BackoffBuilder;
    let base = backon::ExponentialBuilder::default()
        .with_min_delay(EVICTION_MIN_BACKOFF)
        .with_max_delay(EVICTION_MAX_BACKOFF)
        .with_factor(2.0)
        .without_max_times()
        .build()
        .nth(usize::try_from(attempts.saturating_sub(1).min(32)).unwrap_or(0))
        .unwrap_or(EVICTION_MAX_BACKOFF);
    base.mul_f64(0.5 + jitter.clamp(0.0, 1.0))
}

/// `at` without its fraction of a second: a `metav1.Time` on the wire has none.
fn whole_seconds(at: Timestamp) -> Timestamp {
    Timestamp::from_second(at.as_second()).unwrap_or(at)
}
