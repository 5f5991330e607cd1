//! Failures: the `Failed` condition a step sets and clears (an invalid spec, a drain timeout),
//! and what the actor does after a step whose calls failed.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use maintenance_crds::{NodeMaintenance, NodeMaintenanceStatus, Phase, condition_type};

use super::{Action, Event, FailedReason, StatusWrite, Step, enter_phase};
use crate::conditions;

/// A spec the operator cannot act on (bad selector or regex): say so in the `Failed` condition,
/// once; the step runs again when the spec changes.
pub(super) fn invalid_spec(request: &NodeMaintenance, message: &str, now: Timestamp) -> Step {
    let mut step = Step {
        watch_pods: true,
        ..Step::default()
    };
    if failed_with(request, FailedReason::InvalidSpec)
        .is_some_and(|reported| reported.message == message)
    {
        return step;
    }
    step.actions.extend(report_failure(
        request,
        FailedReason::InvalidSpec,
        message,
        now,
    ));
    step
}

/// The `Failed` condition of this reason, if the request has one.
pub(super) fn failed_with(request: &NodeMaintenance, reason: FailedReason) -> Option<&Condition> {
    request
        .condition(condition_type::FAILED)
        .filter(|c| c.reason == reason.as_str())
}

/// The status write that sets `Failed` (this reason and message) without a phase change, then
/// its Warning Event (after the write it reports).
pub(super) fn report_failure(
    request: &NodeMaintenance,
    reason: FailedReason,
    message: &str,
    now: Timestamp,
) -> [Action; 2] {
    let mut status = request.status.clone().unwrap_or_default();
    set_failed(&mut status, request, reason, message, now);
    [
        Action::WriteStatus(StatusWrite {
            status,
            transition: None,
        }),
        Action::Event(Event {
            warning: true,
            reason: reason.event(),
            note: message.to_string(),
        }),
    ]
}

pub(super) fn set_failed(
    status: &mut NodeMaintenanceStatus,
    request: &NodeMaintenance,
    reason: FailedReason,
    message: &str,
    now: Timestamp,
) {
    conditions::upsert_condition(
        &mut status.conditions,
        condition_type::FAILED,
        true,
        reason.as_str(),
        message,
        now,
        request.metadata.generation,
    );
}

/// Removes a `Failed` condition of this reason (its cause is gone); true if there was one.
pub(super) fn clear_failed(status: &mut NodeMaintenanceStatus, reason: FailedReason) -> bool {
    let has = status
        .conditions
        .iter()
        .any(|c| c.type_ == condition_type::FAILED && c.reason == reason.as_str());
    if has {
        conditions::remove_condition(&mut status.conditions, condition_type::FAILED);
    }
    has
}

/// After a failed step: a request that only its admission shows Scheduled gets Scheduled written
/// with the failure (`failed_step::message`), or its status would stay blank (or keep the reason
/// it waited for) while the step is retried. Any other status is left as it is: the step writes
/// its own, and the failure goes to a Warning Event.
pub fn status_after_failed_step(
    request: &NodeMaintenance,
    failure: &str,
    now: Timestamp,
) -> Option<StatusWrite> {
    if !request.admitted_not_shown() || request.is_deleting() {
        return None;
    }
    let message = format!("admitted; {failure}");
    Some(enter_phase(
        request,
        Phase::Scheduled,
        &message,
        now,
        |_| {},
    ))
}

/// How long a node actor waits before it runs a step again after `consecutive` failed steps in
/// a row (1 for the first). A conflict means someone else wrote the object (a not-found, that
/// the request or its node is gone): the actor reads it again and goes on at once, but only
/// twice in a row; a writer that keeps changing it (another
/// controller left running during a migration) gets the same backoff as any other error, 0.25 s
/// doubling to 30 s, instead of a tight loop of reads and writes.
pub fn retry_after_failed_step(conflict: bool, consecutive: u32) -> Duration {
    const AT_ONCE_CONFLICTS: u32 = 2;
    if conflict && consecutive <= AT_ONCE_CONFLICTS {
        return Duration::ZERO;
    }
    let doublings = if conflict {
        consecutive - AT_ONCE_CONFLICTS
    } else {
        consecutive
    };
    Duration::from_millis((250u64 << doublings.min(7)).min(30_000))
}
