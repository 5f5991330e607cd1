//! Draining: the evictions (and past the escalation deadline, the deletions) a drain step
//! starts, and the status write that shows its progress, its timeout and its end.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use maintenance_crds::{DrainSpec, NodeMaintenance, Phase};

use super::drain_status::{DrainReport, force_delete_note, force_deleted_summary, timeout_message};
use super::failure::{clear_failed, failed_with, invalid_spec, report_failure, set_failed};
use super::yielding::{YieldVerdict, yield_step, yield_verdict};
use super::{
    Action, Event, EvictionOrder, FailedReason, ForceDelete, ForceDeleteOrder, HEARTBEAT, Ledger,
    Observed, PodEviction, STATUS_WRITE_INTERVAL, StatusWrite, Step, TIMER_SLACK, after, elapsed,
    enter, namespace_of,
};
use crate::conditions;
use crate::deadline;
use crate::drain_plan::{self, DrainPlan, DrainPod, DrainRules, PodRef};
use crate::eviction::EvictionOutcome;
use crate::pod_view::CachedPod;
use crate::yielding::YieldBlocker;

fn creation_time(pod: &impl DrainPod) -> Option<Timestamp> {
    pod.meta().creation_timestamp.as_ref().map(|t| t.0)
}

/// Draining. Pods that arrive on the node after the drain began (created later than the phase
/// start; kubectl drain would not see them, as it lists once) are evicted too, but never hold
/// the drain open: a controller that keeps binding pods to the node, or `cordon: false` with a
/// busy scheduler, cannot keep a drain alive forever.
pub(super) fn on_draining(
    request: &NodeMaintenance,
    spec: &DrainSpec,
    observed: &Observed<'_>,
    now: Timestamp,
    ledger: &mut Ledger,
) -> Step {
    let mut step = Step {
        watch_pods: true,
        ..Step::default()
    };
    let Some(pods) = observed.pods else {
        return pods_never_listed(request, spec, now, step);
    };
    let rules = match DrainRules::new(spec, Some(observed.operator.clone())) {
        Ok(rules) => rules,
        Err(err) => {
            ledger.clear();
            return invalid_spec(request, &err.to_string(), now);
        }
    };
    let plan = drain_plan::plan(&rules, pods);
    let started = conditions::phase_since(request).unwrap_or(now);
    let arrived_later: BTreeSet<String> = pods
        .iter()
        .filter(|p| creation_time(p).is_some_and(|created| created > started))
        .map(|p| PodRef::from_pod(p).key())
        .collect();

    // Pods we evicted that still exist with the same UID are still terminating: wait for them.
    let live: BTreeMap<String, &Arc<CachedPod>> = pods
        .iter()
        .map(|p| (PodRef::from_pod(p).key(), p))
        .collect();
    // A deletion past the deadline whose answer is still due is kept even if its pod has left the
    // cache: the answer carries the record of the budget bypassed, and the drain waits for it.
    ledger.evictions.retain(|key, e| {
        e.awaits_deletion_answer()
            || live
                .get(key)
                .is_some_and(|p| p.metadata.uid.as_deref() == e.uid.as_deref())
    });
    let deletions_unanswered: Vec<String> = ledger
        .evictions
        .iter()
        .filter(|(key, e)| e.awaits_deletion_answer() && !live.contains_key(*key))
        .map(|(key, _)| key.clone())
        .collect();
    if ledger.last_progress.is_none() {
        ledger.last_progress = Some(now);
    }

    let timeout = Duration::from_secs(u64::from(spec.timeout_seconds()));
    // The escalation deadline counts from the same phase clock as the timeout, independently of
    // it: a timeout reports and retries slowly, the deadline stops waiting for budgets.
    let force_after = spec.force_delete_after();
    let drain = Drain {
        request,
        pdb_summaries: observed.pdb_summaries,
        plan,
        arrived_later,
        clock: DrainClock {
            started,
            timeout,
            timed_out: !timeout.is_zero() && deadline::is_due(started, timeout, now),
            force_after,
            force_due: force_after.is_some_and(|d| deadline::is_due(started, d, now)),
        },
        now,
    };
    drain.start_calls(&live, ledger, &mut step);
    let report = drain.report(deletions_unanswered, ledger);
    if report.remaining.is_empty() {
        return drain.finish(report, ledger, step);
    }
    // The yield counts from the last progress the ledger saw. The ledger is memory only: an
    // actor (re)started mid-drain counts from its first step, so a restart delays a yield, never
    // hastens it.
    let blocker = pdb_blocker(ledger, &report.remaining);
    let quiet_since = ledger.last_progress.map_or(started, |p| p.max(started));
    match yield_verdict(
        observed.yield_after,
        force_after,
        !blocker.is_empty(),
        quiet_since,
        now,
    ) {
        YieldVerdict::Yield => {
            // The evictions this step ordered are dropped with the ledger: never sent.
            ledger.clear();
            let period = observed.yield_after.unwrap_or_default();
            return yield_step(request, observed.node, period, &blocker, now);
        }
        YieldVerdict::Progressing { due } => step.wake(after(due, TIMER_SLACK)),
        YieldVerdict::Off | YieldVerdict::Escalates | YieldVerdict::NotBlockedByPdb => {}
    }
    step.last_progress = ledger.last_progress;
    drain.write_status(report, ledger, step)
}

/// The budgets that refused the last eviction of a pod the drain still waits for, with those pods.
/// Only a refusal that names its budget counts (a 429 that names none may be the API server's own
/// throttling), and not a pod being deleted past the escalation deadline.
fn pdb_blocker(ledger: &Ledger, remaining: &[String]) -> YieldBlocker {
    let mut blocker = YieldBlocker::default();
    for key in remaining {
        let Some(entry) = ledger.evictions.get(key) else {
            continue;
        };
        if entry.accepted || entry.force.is_some() {
            continue;
        }
        if let Some(EvictionOutcome::Refused { pdb: Some(pdb), .. }) = &entry.last {
            blocker
                .pods_by_pdb
                .entry(format!("{}/{pdb}", namespace_of(key)))
                .or_default()
                .push(key.clone());
        }
    }
    blocker
}

/// One drain step's view of the node: what its calls, its status and its status write are made
/// of.
pub(super) struct Drain<'a> {
    pub(super) request: &'a NodeMaintenance,
    pub(super) pdb_summaries: &'a BTreeMap<String, String>,
    pub(super) plan: DrainPlan,
    /// Pods created after the drain began: evicted, but they never hold the drain open.
    pub(super) arrived_later: BTreeSet<String>,
    pub(super) clock: DrainClock,
    pub(super) now: Timestamp,
}

/// The drain's timeout and escalation deadline, both counted from the phase start.
#[derive(Debug, Clone, Copy)]
pub(super) struct DrainClock {
    pub(super) started: Timestamp,
    pub(super) timeout: Duration,
    pub(super) timed_out: bool,
    pub(super) force_after: Option<Duration>,
    pub(super) force_due: bool,
}

impl Drain<'_> {
    /// Starts the calls that are due: evictions, and past the escalation deadline deletions of
    /// the pods a named budget kept refusing. A call not due yet wakes the step at its time.
    fn start_calls(
        &self,
        live: &BTreeMap<String, &Arc<CachedPod>>,
        ledger: &mut Ledger,
        step: &mut Step,
    ) {
        let (request, plan, arrived_later, now) =
            (self.request, &self.plan, &self.arrived_later, self.now);
        let DrainClock {
            timed_out,
            force_after,
            force_due,
            ..
        } = self.clock;
        let mut orders = Vec::new();
        let mut deletes = Vec::new();
        for pod in &plan.to_evict {
            let key = pod.key();
            let entry = ledger
                .evictions
                .entry(key.clone())
                .or_insert_with(|| PodEviction {
                    uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
                    attempts: 0,
                    in_flight: false,
                    accepted: false,
                    next_attempt: now,
                    slow: false,
                    last: None,
                    covering_pdbs: Vec::new(),
                    force: None,
                });
            if entry.in_flight || entry.accepted {
                continue;
            }
            // Past the deadline, a pod whose last eviction a named budget refused is deleted instead
            // (a 429 that names no budget may be the API server's own throttling: not bypassed).
            // Newcomers never hold the drain, so nothing justifies bypassing their budget.
            let bypass = match (&entry.force, &entry.last) {
                (Some(force), _) => Some(force.pdb.clone()),
                (None, Some(EvictionOutcome::Refused { pdb: Some(pdb), .. }))
                    if force_due && !arrived_later.contains(&key) =>
                {
                    Some(pdb.clone())
                }
                _ => None,
            };
            if let Some(pdb) = bypass {
                // A failed deletion is retried after its backoff; the first one goes at the deadline.
                if entry.force.is_some() && entry.next_attempt > now {
                    step.wake(entry.next_attempt);
                    continue;
                }
                entry.in_flight = true;
                entry.attempts += 1;
                let note = force_delete_note(
                    request,
                    &key,
                    &pod.namespace,
                    &pdb,
                    self.pdb_summaries,
                    force_after.unwrap_or_default(),
                );
                if entry.force.is_none() {
                    entry.force = Some(ForceDelete {
                        pdb: pdb.clone(),
                        error: None,
                    });
                }
                deletes.push(ForceDeleteOrder {
                    key,
                    namespace: pod.namespace.clone(),
                    name: pod.name.clone(),
                    uid: entry.uid.clone(),
                    pdb,
                    note,
                });
                continue;
            }
            if entry.next_attempt > now {
                step.wake(entry.next_attempt);
                continue;
            }
            // The plan is made of the cached pods: each is in `live`.
            let Some(&cached) = live.get(&key) else {
                continue;
            };
            entry.in_flight = true;
            // After the timeout keep trying, slowly, so the request recovers by itself.
            entry.slow = timed_out;
            orders.push(EvictionOrder {
                key,
                pod: Arc::clone(cached),
                is_retry: entry.attempts > 0,
            });
            entry.attempts += 1;
        }
        if !orders.is_empty() {
            step.actions.push(Action::Evict(orders));
        }
        if !deletes.is_empty() {
            step.actions.push(Action::ForceDelete(deletes));
        }
    }

    /// The drain is done: Ready, with its last counts.
    fn finish(&self, report: DrainReport, ledger: &mut Ledger, mut step: Step) -> Step {
        let (request, now, started) = (self.request, self.now, self.clock.started);
        let DrainReport {
            status: drain_status,
            force_deleted,
            ..
        } = report;
        step.actions.push(Action::DrainFinished {
            after: elapsed(started, now),
        });
        // NVIDIA's Ready has no message; a drain that bypassed budgets says so where
        // `kubectl get nm` readers look first.
        let message = force_deleted_summary(&force_deleted);
        step.actions
            .push(enter(request, Phase::Ready, &message, now, |s| {
                s.drain = Some(drain_status)
            }));
        step.watch_pods = false;
        ledger.clear();
        step
    }

    /// The drain goes on: its status is written when due (a timeout and a bypassed budget at
    /// once, progress at most every [`STATUS_WRITE_INTERVAL`]), and the step wakes for the next
    /// deadline.
    fn write_status(&self, report: DrainReport, ledger: &Ledger, mut step: Step) -> Step {
        let (request, now) = (self.request, self.now);
        let DrainClock {
            started,
            timeout,
            timed_out,
            force_after,
            force_due,
        } = self.clock;
        let DrainReport {
            status: drain_status,
            blocked,
            remaining,
            force_deleted,
            force_deleted_before,
        } = report;
        let mut status = request.status.clone().unwrap_or_default();
        // The first drain status waits for the interval too: the write that entered Draining was
        // just made, and a drain that ends within the interval shows its counts in the Ready write.
        let mut write_now = false;
        let mut changed = status.drain.as_ref() != Some(&drain_status);
        status.drain = Some(drain_status);
        if clear_failed(&mut status, FailedReason::InvalidSpec) {
            changed = true;
            write_now = true;
        }
        // A bypassed budget is worth writing at once: a restart must not lose the record.
        if force_deleted.len() > force_deleted_before {
            write_now = true;
        }
        // An earlier Failed of another cause never hides the timeout.
        let timeout_reported = failed_with(request, FailedReason::DrainTimeout).is_some();
        let mut timeout_event = None;
        if timed_out && !timeout_reported {
            let message = timeout_message(timeout, &blocked, &remaining);
            set_failed(
                &mut status,
                request,
                FailedReason::DrainTimeout,
                &message,
                now,
            );
            timeout_event = Some(Action::Event(Event {
                warning: true,
                reason: FailedReason::DrainTimeout.event(),
                note: message,
            }));
            changed = true;
            // A timeout is worth writing at once.
            write_now = true;
        }
        // A heartbeat keeps the progress gauge and the timeout current when nothing else happens.
        step.wake(after(now, HEARTBEAT));
        if !timed_out && !timeout.is_zero() {
            step.wake(after(deadline::deadline(started, timeout), TIMER_SLACK));
        }
        // The deadline runs the step itself, not the next heartbeat after it.
        if let Some(force_after) = force_after.filter(|_| !force_due) {
            step.wake(after(deadline::deadline(started, force_after), TIMER_SLACK));
        }
        if changed {
            let next_write = ledger
                .last_status_write
                .map(|at| after(at, STATUS_WRITE_INTERVAL));
            match next_write {
                Some(at) if !write_now && at > now => step.wake(at),
                _ => step.actions.push(Action::WriteStatus(StatusWrite {
                    status,
                    transition: None,
                })),
            }
        }
        // After the write that records the timeout (always made at once), so a conflict that runs
        // the step again does not send it twice.
        step.actions.extend(timeout_event);
        step
    }
}

/// Draining, but the node's pods were never listed (the pod watch gets no answer: RBAC, an
/// outage). Nothing can be evicted, but the timeout still holds: past it the request says why it
/// waits, instead of sitting in Draining with no sign of trouble.
fn pods_never_listed(
    request: &NodeMaintenance,
    spec: &DrainSpec,
    now: Timestamp,
    mut step: Step,
) -> Step {
    let timeout = Duration::from_secs(u64::from(spec.timeout_seconds()));
    if timeout.is_zero() {
        return step;
    }
    let started = conditions::phase_since(request).unwrap_or(now);
    let due = deadline::deadline(started, timeout);
    if now < due {
        step.wake(after(due, TIMER_SLACK));
        return step;
    }
    if failed_with(request, FailedReason::DrainTimeout).is_some() {
        return step;
    }
    let message = format!(
        "drain did not finish within {}s: the pods on node {} could not be listed (the \
         operator's pod watch gets no answer; check that it may list and watch pods, and its log)",
        timeout.as_secs(),
        request.spec.node_name
    );
    step.actions.extend(report_failure(
        request,
        FailedReason::DrainTimeout,
        &message,
        now,
    ));
    step
}
