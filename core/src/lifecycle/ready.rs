//! Ready: NVIDIA's `ready-time` annotation, written once the request has been Ready a while.

use jiff::Timestamp;
use maintenance_crds::{NodeMaintenance, READY_TIME_ANNOTATION, condition_type};

use super::{Action, READY_TIME_DELAY, Step, TIMER_SLACK, after};
use crate::conditions;

/// Ready without NVIDIA's `ready-time` annotation gets it once it has been Ready for
/// [`READY_TIME_DELAY`], with the time the `Ready` condition turned True. NVIDIA's
/// `handleTerminalState` writes it in the reconcile after the one that set Ready (so it, too,
/// never holds Ready back, and may lose the race with a quick release). It is written once: a
/// request that is Ready again after a requestor's failure was cleared keeps counting from its
/// first Ready, as NVIDIA's. (NVIDIA also writes it in RequestorFailed, reachable there only from
/// Ready; ours can fail before Ready, and garbage collection spares RequestorFailed, so it is not
/// needed there.)
pub(super) fn record_ready_time(request: &NodeMaintenance, now: Timestamp) -> Step {
    let mut step = Step::default();
    if conditions::annotation_time(request, READY_TIME_ANNOTATION).is_some() {
        return step;
    }
    let ready_since = request
        .condition(condition_type::READY)
        .filter(|c| c.status == "True")
        .map_or(now, |c| c.last_transition_time.0);
    let due = after(ready_since, READY_TIME_DELAY);
    if now >= due {
        step.actions
            .push(Action::RecordReadyTime { at: ready_since });
    } else {
        step.wake(after(due, TIMER_SLACK));
    }
    step
}
