//! What a drain reports: its `status.drain` (the pods that hold it and why, those it still waits
//! for, the counts, the deletions past the deadline) and the texts of its Events and conditions.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use maintenance_crds::{BlockedPod, DrainStatus, ForceDeletedPod, NodeMaintenance};

use super::draining::Drain;
use super::{Ledger, PodEviction, WaitReason, namespace_of};
use crate::drain_plan::{self, PodRef, SkipReason};
use crate::eviction::EvictionOutcome;

/// The drain as `status.drain` shows it, and what the step's decisions read of it.
pub(super) struct DrainReport {
    pub(super) status: DrainStatus,
    pub(super) blocked: Vec<BlockedPod>,
    /// The pods the drain still waits for (`status.drain.waitForEviction`).
    pub(super) remaining: Vec<String>,
    pub(super) force_deleted: Vec<ForceDeletedPod>,
    /// How many of `force_deleted` the object recorded already.
    pub(super) force_deleted_before: usize,
}

impl Drain<'_> {
    /// The drain status: the pods that block it and why, the pods it still waits for, the counts
    /// (which only grow, in the ledger), and the deletions past the deadline. The ledger's
    /// progress moves on when fewer pods remain.
    pub(super) fn report(
        &self,
        deletions_unanswered: Vec<String>,
        ledger: &mut Ledger,
    ) -> DrainReport {
        let (request, plan, arrived_later, now) =
            (self.request, &self.plan, &self.arrived_later, self.now);
        let force_after = self.clock.force_after;
        let terminating: BTreeSet<String> = plan
            .skipped
            .iter()
            .filter(|(_, why)| *why == SkipReason::Terminating)
            .map(|(p, _)| p.key())
            .collect();
        let previous = request.status.as_ref().and_then(|s| s.drain.clone());
        // Deletions past the deadline: those on the object (written before a restart) and those
        // accepted since, once each.
        let mut force_deleted = previous
            .as_ref()
            .map(|d| d.force_deleted.clone())
            .unwrap_or_default();
        let force_deleted_before = force_deleted.len();
        for deleted in &ledger.force_deleted {
            if !force_deleted.contains(deleted) {
                force_deleted.push(deleted.clone());
            }
        }
        let mut blocked: Vec<BlockedPod> = plan
            .blocked
            .iter()
            .map(|(pod, reason)| reason.to_blocked_pod(pod))
            .collect();
        for (key, entry) in &ledger.evictions {
            if !terminating.contains(key)
                && let Some(b) = blocked_entry(self.pdb_summaries, key, entry, force_after)
            {
                blocked.push(b);
            }
        }
        // Terminating pods (evicted by us, even before a restart, or by anyone) are waited for until
        // their object is gone: the node is not drained while they still run.
        for key in &terminating {
            let message = match force_deleted.iter().rev().find(|f| &f.pod == key) {
                Some(f) => format!(
                    "deleted past drainSpec.forceDeleteAfterSeconds, bypassing PodDisruptionBudget \
                 {}/{}; waiting for the pod to terminate",
                    namespace_of(key),
                    f.pdb
                ),
                None => "evicted; waiting for the pod to terminate".to_string(),
            };
            blocked.push(BlockedPod {
                pod: key.clone(),
                reason: WaitReason::Terminating.as_str().to_string(),
                message,
            });
        }
        blocked.retain(|b| !arrived_later.contains(&b.pod));
        blocked.sort_by(|a, b| a.pod.cmp(&b.pod));
        let mut remaining: Vec<String> = plan
            .to_evict
            .iter()
            .map(PodRef::key)
            .chain(plan.blocked.iter().map(|(p, _)| p.key()))
            .chain(terminating.iter().cloned())
            .chain(deletions_unanswered)
            .filter(|key| !arrived_later.contains(key))
            .collect();
        remaining.sort();

        // The counts only grow during a drain: remembered between throttled status writes, and read
        // back from the status after a restart.
        let eviction_pods = previous
            .as_ref()
            .map_or(0, |d| usize::try_from(d.eviction_pods).unwrap_or(0))
            .max(ledger.drain_counts.1)
            .max(remaining.len());
        let total_pods = previous
            .as_ref()
            .map_or(0, |d| usize::try_from(d.total_pods).unwrap_or(0))
            .max(ledger.drain_counts.0)
            .max(plan.total_pods);
        ledger.drain_counts = (total_pods, eviction_pods);
        let drain_status = DrainStatus {
            total_pods: i32::try_from(total_pods).unwrap_or(i32::MAX),
            eviction_pods: i32::try_from(eviction_pods).unwrap_or(i32::MAX),
            drain_progress: drain_plan::drain_progress(eviction_pods, remaining.len()),
            wait_for_eviction: remaining.clone(),
            blocked: blocked.clone(),
            force_deleted: force_deleted.clone(),
        };
        if ledger.last_remaining != Some(remaining.len()) {
            ledger.last_remaining = Some(remaining.len());
            ledger.last_progress = Some(now);
        }
        DrainReport {
            status: drain_status,
            blocked,
            remaining,
            force_deleted,
            force_deleted_before,
        }
    }
}

pub(super) fn timeout_message(
    timeout: Duration,
    blocked: &[BlockedPod],
    remaining: &[String],
) -> String {
    let mut parts: Vec<String> = blocked
        .iter()
        .map(|b| format!("{}: {}", b.pod, b.message))
        .collect();
    for pod in remaining {
        if !blocked.iter().any(|b| &b.pod == pod) {
            parts.push(format!("{pod}: not evicted yet"));
        }
    }
    format!(
        "drain did not finish within {}s; {} pod(s) remain: {}",
        timeout.as_secs(),
        remaining.len(),
        parts.join("; ")
    )
}

/// `PodDisruptionBudget ns/name`, with its counts when the actor watches it.
pub(super) fn describe_pdb(
    pdb_summaries: &BTreeMap<String, String>,
    namespace: &str,
    pdb: &str,
) -> String {
    let name = format!("{namespace}/{pdb}");
    match pdb_summaries.get(&name) {
        Some(summary) => format!("PodDisruptionBudget {name} ({summary})"),
        None => format!("PodDisruptionBudget {name}"),
    }
}

/// The note of the Warning Events of one deletion past the deadline.
pub(super) fn force_delete_note(
    request: &NodeMaintenance,
    key: &str,
    namespace: &str,
    pdb: &str,
    pdb_summaries: &BTreeMap<String, String>,
    deadline: Duration,
) -> String {
    format!(
        "deleted pod {key} instead of evicting it: {} still refused its eviction {}s after the \
         drain of node {} began (drainSpec.forceDeleteAfterSeconds of NodeMaintenance {}); the \
         budget was bypassed",
        describe_pdb(pdb_summaries, namespace, pdb),
        deadline.as_secs(),
        request.spec.node_name,
        request.key()
    )
}

/// The `Ready` message of a drain that deleted pods past its deadline; empty otherwise.
pub(super) fn force_deleted_summary(force_deleted: &[ForceDeletedPod]) -> String {
    if force_deleted.is_empty() {
        return String::new();
    }
    let pods: Vec<String> = force_deleted
        .iter()
        .map(|f| format!("{} (PodDisruptionBudget {})", f.pod, f.pdb))
        .collect();
    format!(
        "{} pod(s) deleted past drainSpec.forceDeleteAfterSeconds, bypassing their \
         PodDisruptionBudgets: {}",
        force_deleted.len(),
        pods.join(", ")
    )
}

/// Why an eviction of ours waits, for `status.drain.blocked`.
pub(super) fn blocked_entry(
    pdb_summaries: &BTreeMap<String, String>,
    key: &str,
    entry: &PodEviction,
    force_after: Option<Duration>,
) -> Option<BlockedPod> {
    let namespace = namespace_of(key);
    let describe = |pdb: &str| describe_pdb(pdb_summaries, namespace, pdb);
    if let Some(force) = &entry.force {
        let deadline = force_after.unwrap_or_default().as_secs();
        return Some(match &force.error {
            Some(error) => BlockedPod {
                pod: key.to_string(),
                reason: WaitReason::Error.as_str().to_string(),
                message: format!(
                    "deleting the pod past drainSpec.forceDeleteAfterSeconds ({deadline}s), \
                     bypassing {}, failed: {error}; retrying (a 403 means the operator may not \
                     delete pods: grant it `delete` on pods, chart value rbac.forceDelete=true)",
                    describe(&force.pdb)
                ),
            },
            None => BlockedPod {
                pod: key.to_string(),
                reason: WaitReason::Pdb.as_str().to_string(),
                message: format!(
                    "{} still refused the eviction {deadline}s after the drain began \
                     (drainSpec.forceDeleteAfterSeconds): deleting the pod, bypassing the budget",
                    describe(&force.pdb)
                ),
            },
        });
    }
    let (reason, message) = match entry.last.as_ref()? {
        EvictionOutcome::Refused { pdb, message, .. } => (
            WaitReason::Pdb,
            match pdb {
                Some(pdb) => format!(
                    "{} allows no disruption now; retrying when it changes ({message})",
                    describe(pdb)
                ),
                None => format!("eviction refused: {message}"),
            },
        ),
        EvictionOutcome::MultiplePdbs { message } => (
            WaitReason::MultiplePdbs,
            if entry.covering_pdbs.is_empty() {
                format!("{message}; make exactly one PodDisruptionBudget select the pod")
            } else {
                let names: Vec<String> = entry.covering_pdbs.iter().map(|p| describe(p)).collect();
                format!(
                    "covered by {} PodDisruptionBudgets: {}; the Eviction API refuses pods with more than one, make exactly one select the pod",
                    names.len(),
                    names.join(", ")
                )
            },
        ),
        EvictionOutcome::Error { code, message } => (
            WaitReason::Error,
            match code {
                Some(code) => format!("eviction failed with HTTP {code}: {message}"),
                None => format!("eviction failed: {message}"),
            },
        ),
        // Evicted pods still present are listed as Terminating from the pod itself.
        EvictionOutcome::Evicted | EvictionOutcome::Gone => return None,
    };
    Some(BlockedPod {
        pod: key.to_string(),
        reason: reason.as_str().to_string(),
        message,
    })
}
