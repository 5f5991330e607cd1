//! WaitForPodCompletion: waiting for the pods the spec names to finish, up to its timeout.

use std::time::Duration;

use jiff::Timestamp;
use maintenance_crds::{NodeMaintenance, Phase};

use super::cordon::phase_after_wait;
use super::failure::{clear_failed, invalid_spec};
use super::{
    Action, Event, EventReason, FailedReason, Ledger, Observed, StatusWrite, Step, TIMER_SLACK,
    WAIT_RECHECK, after, enter,
};
use crate::conditions;
use crate::deadline;
use crate::drain_plan::{self, CompletionRules, PodRef};

pub(super) fn on_wait_for_completion(
    request: &NodeMaintenance,
    observed: &Observed<'_>,
    now: Timestamp,
    ledger: &mut Ledger,
) -> Step {
    ledger.clear();
    let (next, next_message) = phase_after_wait(request);
    // waitForPodCompletion removed mid-phase: nothing to wait for.
    let Some(spec) = &request.spec.wait_for_pod_completion else {
        return Step {
            actions: vec![enter(
                request,
                next,
                "waitForPodCompletion was removed",
                now,
                |s| s.wait_for_completion.clear(),
            )],
            ..Step::default()
        };
    };
    let mut step = Step {
        watch_pods: true,
        ..Step::default()
    };
    let Some(pods) = observed.pods else {
        return step;
    };
    let rules = match CompletionRules::new(spec) {
        Ok(rules) => rules,
        Err(err) => return invalid_spec(request, &err.to_string(), now),
    };
    let waiting: Vec<String> = drain_plan::pods_to_wait_for(&rules, pods)
        .iter()
        .map(PodRef::key)
        .collect();
    if waiting.is_empty() {
        step.watch_pods = next == Phase::Draining;
        step.actions
            .push(enter(request, next, next_message, now, |s| {
                s.wait_for_completion.clear()
            }));
        return step;
    }
    step.wake(after(now, WAIT_RECHECK));
    let timeout = Duration::from_secs(u64::from(spec.timeout_seconds()));
    let since = conditions::phase_since(request).unwrap_or(now);
    if !timeout.is_zero() {
        if deadline::is_due(since, timeout, now) {
            let note = format!(
                "waited {}s for pod completion; {} pod(s) still running ({}); moving on",
                timeout.as_secs(),
                waiting.len(),
                waiting.join(", ")
            );
            step.actions.push(enter(
                request,
                next,
                "wait for pod completion timed out",
                now,
                |s| s.wait_for_completion.clear(),
            ));
            step.actions.push(Action::Event(Event {
                warning: true,
                reason: EventReason::WaitForPodCompletionTimeout,
                note,
            }));
            return step;
        }
        step.wake(after(deadline::deadline(since, timeout), TIMER_SLACK));
    }
    let mut status = request.status.clone().unwrap_or_default();
    let fixed = clear_failed(&mut status, FailedReason::InvalidSpec);
    if fixed || status.wait_for_completion != waiting {
        status.wait_for_completion = waiting;
        step.actions.push(Action::WriteStatus(StatusWrite {
            status,
            transition: None,
        }));
    }
    step
}
