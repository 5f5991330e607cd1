//! Pure edits of `status.conditions`: the phase lives in the `Ready` condition's reason, and its
//! `lastTransitionTime` marks when the phase was entered, so time-in-phase and timeouts are read
//! from the object itself and survive a restart.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use maintenance_crds::{
    ADMITTED_TIME_ANNOTATION, NodeMaintenance, Phase, WAIT_POD_COMPLETION_START_ANNOTATION,
    condition_type,
};

/// Sets (or replaces) a condition; `lastTransitionTime` moves only when status or reason change.
pub fn upsert_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: jiff::Timestamp,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" };
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if existing.status != status || existing.reason != reason {
            existing.last_transition_time = Time(now);
        }
        existing.status = status.to_string();
        existing.reason = reason.to_string();
        existing.message = message.to_string();
        existing.observed_generation = generation;
    } else {
        conditions.push(Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
            last_transition_time: Time(now),
            observed_generation: generation,
        });
    }
}

pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    before != conditions.len()
}

/// The `Ready` condition for a phase: True only in `Ready`.
pub fn set_phase(
    conditions: &mut Vec<Condition>,
    phase: Phase,
    message: &str,
    now: jiff::Timestamp,
    generation: Option<i64>,
) {
    upsert_condition(
        conditions,
        condition_type::READY,
        phase == Phase::Ready,
        phase.as_str(),
        message,
        now,
        generation,
    );
}

/// When the request entered its current phase: the `Ready` condition's `lastTransitionTime`,
/// which we move on every phase change.
///
/// A phase entered before we admitted or adopted the request (see [`admitted_time`]) was entered
/// under NVIDIA's operator, which moves `lastTransitionTime` only when the condition's status
/// changes (`meta.SetStatusCondition` in its internal/k8sutils/k8sutils.go), so that time is the
/// request's first Pending, not its phase start. Its timers count from NVIDIA's own record where
/// there is one (`wait-pod-completion-start-time`, internal/podcompletion/podcompletion.go) and
/// from the adoption otherwise: later, never earlier, so an adopted request never times out early.
///
/// Scheduled by the admission alone (no status shows it) was entered at the admission.
pub fn phase_since(nm: &NodeMaintenance) -> Option<jiff::Timestamp> {
    if nm.admitted_not_shown() {
        return admitted_time(nm);
    }
    let entered = nm
        .condition(condition_type::READY)
        .map(|c| c.last_transition_time.0)?;
    let Some(admitted) = admitted_time(nm) else {
        return Some(entered);
    };
    // A condition's time has whole seconds; the admission's has milliseconds.
    if entered >= whole_seconds(admitted) {
        return Some(entered);
    }
    let nvidia_wait_start = (nm.phase() == Phase::WaitForPodCompletion)
        .then(|| annotation_time(nm, WAIT_POD_COMPLETION_START_ANNOTATION))
        .flatten();
    Some(nvidia_wait_start.map_or(admitted, |start| start.min(admitted)))
}

/// When we admitted the request, or adopted it from another operator mid-flight.
pub fn admitted_time(nm: &NodeMaintenance) -> Option<jiff::Timestamp> {
    annotation_time(nm, ADMITTED_TIME_ANNOTATION)
}

/// An RFC 3339 time held in an annotation; `None` when absent or unreadable.
pub fn annotation_time(nm: &NodeMaintenance, key: &str) -> Option<jiff::Timestamp> {
    nm.metadata.annotations.as_ref()?.get(key)?.parse().ok()
}

/// An annotation value for a time: RFC 3339 in UTC with seconds, as NVIDIA's controller writes
/// (`time.Now().UTC().Format(time.RFC3339)`).
pub fn annotation_value(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The admission time's annotation value: RFC 3339 in UTC with milliseconds, since Scheduled's
/// duration (usually well under a second) is measured from it when no status shows the phase.
pub fn admitted_time_value(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

fn whole_seconds(at: jiff::Timestamp) -> jiff::Timestamp {
    jiff::Timestamp::from_second(at.as_second()).unwrap_or(at)
}

/// True when the requestor has reported that its own work on the node failed.
pub fn requestor_failed(nm: &NodeMaintenance) -> bool {
    nm.condition(condition_type::REQUESTOR_FAILED)
        .is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(secs).expect("valid timestamp")
    }

    #[test]
    fn transition_time_moves_only_on_change() {
        let mut conditions = Vec::new();
        set_phase(&mut conditions, Phase::Pending, "", ts(10), None);
        set_phase(&mut conditions, Phase::Pending, "still", ts(20), None);
        assert_eq!(conditions[0].last_transition_time.0, ts(10));
        assert_eq!(conditions[0].message, "still");
        set_phase(&mut conditions, Phase::Ready, "", ts(30), None);
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].status, "True");
        assert_eq!(conditions[0].reason, "Ready");
        assert_eq!(conditions[0].last_transition_time.0, ts(30));
    }

    #[test]
    fn other_conditions_are_kept() {
        let mut conditions = Vec::new();
        upsert_condition(
            &mut conditions,
            condition_type::REQUESTOR_FAILED,
            true,
            "Failed",
            "",
            ts(1),
            None,
        );
        set_phase(&mut conditions, Phase::Draining, "", ts(2), None);
        assert_eq!(conditions.len(), 2);
        assert!(remove_condition(
            &mut conditions,
            condition_type::REQUESTOR_FAILED
        ));
        assert_eq!(conditions.len(), 1);
    }
}
