//! A drain that PodDisruptionBudgets block gives its slot back
//! (`spec.admission.yieldBlockedDrainAfterSeconds`, see [`crate::yielding`] for the scheduler's
//! side): whether it yields now, and the step that does it.
//!
//! The yield is three writes, in this order, each idempotent: the uncordon (if owed), the
//! request's metadata (our finalizer and the admission's annotations off, the yield recorded),
//! then the status (`Ready` back to reason Pending). A step that fails between the last two finds
//! a request past Pending that is no longer admitted but has just yielded, and only writes the
//! status ([`finish_interrupted_yield`]).

use std::time::Duration;

use jiff::Timestamp;
use maintenance_crds::{NodeMaintenance, Phase};

use super::deletion::node_release;
use super::{Action, Event, EventReason, NodeView, Step, enter};
use crate::conditions;
use crate::deadline;
use crate::yielding::{YieldBlocker, YieldRecord, yield_patch};

/// Whether a drain gives its slot back now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum YieldVerdict {
    /// `yieldBlockedDrainAfterSeconds` is unset.
    Off,
    /// `drainSpec.forceDeleteAfterSeconds` is set: its deadline settles the budgets, and a yield
    /// would restart its clock at every admission, so it would never come.
    Escalates,
    /// No pod waits on a budget (it waits for pods that terminate, for `force`, for an error):
    /// another admission would not go better.
    NotBlockedByPdb,
    /// Budgets block it, but it made progress within the period: it yields at `due` if nothing
    /// moves by then.
    Progressing { due: Timestamp },
    /// It yields now.
    Yield,
}

/// The verdict at `now`. `quiet_since` is when the drain last made progress: the later of its
/// start (the phase clock) and its last accepted eviction or pod gone.
pub fn yield_verdict(
    period: Option<Duration>,
    force_delete_after: Option<Duration>,
    blocked_by_pdb: bool,
    quiet_since: Timestamp,
    now: Timestamp,
) -> YieldVerdict {
    let Some(period) = period else {
        return YieldVerdict::Off;
    };
    if force_delete_after.is_some() {
        return YieldVerdict::Escalates;
    }
    if !blocked_by_pdb {
        return YieldVerdict::NotBlockedByPdb;
    }
    // Never early: a whole-second phase start counts from the end of its second.
    let due = deadline::deadline(quiet_since, period);
    if now >= due {
        YieldVerdict::Yield
    } else {
        YieldVerdict::Progressing { due }
    }
}

/// The message of the yield: the Pending message it leaves, and the note of its Event.
pub fn yield_message(
    request: &NodeMaintenance,
    period: Duration,
    blocker: &YieldBlocker,
    count: u32,
    uncordoned: bool,
) -> String {
    let node = &request.spec.node_name;
    let uncordon = if uncordoned {
        format!("; node {node} uncordoned")
    } else {
        String::new()
    };
    format!(
        "gave its slot back (yield {count}): the drain of node {node} evicted nothing for {}s \
         because {}{uncordon}; it waits behind the requests waiting now and is admitted again \
         after a back-off",
        period.as_secs(),
        blocker.describe()
    )
}

/// The step of a yield: uncordon if we owe it, the metadata patch, Pending, a Warning `Yielded`.
/// The actor ends after it: the request is Pending and no longer ours until admitted again.
pub(super) fn yield_step(
    request: &NodeMaintenance,
    node: NodeView,
    period: Duration,
    blocker: &YieldBlocker,
    now: Timestamp,
) -> Step {
    let count = YieldRecord::of(request)
        .map_or(0, |r| r.count)
        .saturating_add(1);
    let release = node_release(request, node);
    let uncordon = release == Some(Action::Uncordon);
    let message = yield_message(request, period, blocker, count, uncordon);
    let mut actions = Vec::new();
    // First, while the annotations still say whether the cordon is ours.
    actions.extend(release);
    actions.extend(super::deletion::pool_release(request));
    actions.push(Action::Yield {
        patch: yield_patch(request, count, now, &blocker.describe()),
        message: message.clone(),
    });
    actions.push(enter(request, Phase::Pending, &message, now, |s| {
        s.drain = None;
        s.wait_for_completion.clear();
    }));
    // Last, after the writes it reports.
    actions.push(Action::Event(Event {
        warning: true,
        reason: EventReason::Yielded,
        note: message,
    }));
    Step {
        actions,
        finished: true,
        ..Step::default()
    }
}

/// A yield whose status write did not happen (the step failed after the metadata patch, or the
/// operator stopped): the request shows a phase past Pending, is no longer admitted, and yielded
/// since that phase began. Only the status is left to write; nothing else is done to it.
pub(super) fn finish_interrupted_yield(request: &NodeMaintenance, now: Timestamp) -> Option<Step> {
    if request.phase() == Phase::Pending || request.admitted_by_us() || request.is_deleting() {
        return None;
    }
    let record = YieldRecord::of(request)?;
    let since = conditions::phase_since(request)?;
    // The condition's time has whole seconds, the yield's milliseconds.
    if record.at.as_second() < since.as_second() {
        return None;
    }
    let message = format!(
        "gave its slot back (yield {}): {}",
        record.count, record.blocked_by
    );
    Some(Step {
        actions: vec![enter(request, Phase::Pending, &message, now, |s| {
            s.drain = None;
            s.wait_for_completion.clear();
        })],
        finished: true,
        ..Step::default()
    })
}
