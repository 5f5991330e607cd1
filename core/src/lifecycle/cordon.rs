//! Scheduled (and NVIDIA's Cordon): the cordon, and the phase that follows it.

use jiff::Timestamp;
use maintenance_crds::{NodeMaintenance, Phase, condition_type};

use super::{Action, Event, EventReason, NodeView, Observed, Step, after, enter, initial_state};
use crate::machine_config_pool::{
    self as mcp, BUSY_RECHECK, PauseVerdict, PoolObservation, busy_message, labelled_pool,
};

/// We cordon only a node that was schedulable before, and only when asked to.
fn we_cordon(request: &NodeMaintenance) -> bool {
    request.spec.cordon() && initial_state(request) == Some(false)
}

fn phase_after_cordon(request: &NodeMaintenance) -> (Phase, &'static str) {
    if request.spec.wait_for_pod_completion.is_some() {
        (Phase::WaitForPodCompletion, "")
    } else {
        phase_after_wait(request)
    }
}

pub(super) fn phase_after_wait(request: &NodeMaintenance) -> (Phase, &'static str) {
    if request.spec.drain_spec.is_some() {
        (Phase::Draining, "")
    } else {
        (Phase::Ready, "no drain requested")
    }
}

pub(super) fn on_cordon(
    request: &NodeMaintenance,
    observed: &Observed<'_>,
    now: Timestamp,
) -> Step {
    let mut actions = Vec::new();
    // The node's MachineConfigPool first (NVIDIA's `handleScheduledState` pauses it before the
    // Cordon phase): paused by us, or paused now, or the cordon waits.
    if let Some(pool) = observed.pool {
        match pool_gate(request, pool, now) {
            PoolGate::GoOn(pool_actions) => actions.extend(pool_actions),
            PoolGate::Wait(step) => return step,
        }
    }
    let mut cordon = we_cordon(request);
    // An object that reached Cordon without the annotation (written by another operator)
    // records it now, from the live node.
    if let (None, NodeView::Present { unschedulable }) = (initial_state(request), observed.node) {
        actions.push(Action::RecordInitialState { unschedulable });
        cordon = request.spec.cordon() && !unschedulable;
    }
    // A node already cordoned in Cordon (by NVIDIA's operator before we adopted the request, or
    // by our step before a restart) is not cordoned twice; the uncordon is still owed by the
    // annotation. In Scheduled the view comes from the shared cache, which may still show the
    // cordon of a request released a moment ago (the admission read the node fresh, the cache
    // did not): the cordon is written whatever the cache says.
    let already_cordoned = request.phase() == Phase::Cordon
        && observed.node
            == NodeView::Present {
                unschedulable: true,
            };
    if cordon && !already_cordoned {
        actions.push(Action::Cordon);
    } else if !cordon {
        actions.push(Action::ProtectFromAutoscalers);
    }
    let (next, message) = phase_after_cordon(request);
    actions.push(enter(request, next, message, now, |_| {}));
    Step {
        actions,
        ..Step::default()
    }
}

/// What the pool of the node lets the Scheduled step do.
enum PoolGate {
    /// Go on to the cordon after these actions (label the request, pause the pool).
    GoOn(Vec<Action>),
    /// Wait, without cordoning: the whole step.
    Wait(Step),
}

fn pool_gate(request: &NodeMaintenance, pool: &PoolObservation, now: Timestamp) -> PoolGate {
    let node = &request.spec.node_name;
    let view = match pool {
        PoolObservation::Unresolved(why) => {
            return PoolGate::Wait(pool_wait(request, Vec::new(), why.message(node), now));
        }
        PoolObservation::Seen(view) => view,
    };
    let mut actions = Vec::new();
    // The label goes first, busy or not (as NVIDIA's `PauseMCP`), so that the pool's releases
    // count this request as a holder from the moment it may pause it.
    if labelled_pool(request) != Some(view.name.as_str()) {
        actions.push(Action::LabelPool {
            pool: view.name.clone(),
        });
    }
    match mcp::pause_verdict(view) {
        PauseVerdict::GoOn => PoolGate::GoOn(actions),
        PauseVerdict::Pause => {
            actions.push(Action::PausePool(view.clone()));
            actions.push(Action::Event(Event {
                warning: false,
                reason: EventReason::MachineConfigPoolPaused,
                note: format!(
                    "paused MachineConfigPool {} before cordoning node {node}",
                    view.name
                ),
            }));
            PoolGate::GoOn(actions)
        }
        PauseVerdict::Busy(cause) => PoolGate::Wait(pool_wait(
            request,
            actions,
            busy_message(&view.name, &cause),
            now,
        )),
    }
}

/// The step of a request whose pool is busy: it stays in its phase, says why (status and a
/// Normal Event, once per message), and looks again in [`BUSY_RECHECK`] (NVIDIA requeues after
/// `pauseMCPRequeueTime`).
fn pool_wait(
    request: &NodeMaintenance,
    mut actions: Vec<Action>,
    message: String,
    now: Timestamp,
) -> Step {
    let shown = request
        .condition(condition_type::READY)
        .is_some_and(|c| c.message == message);
    if !shown {
        actions.push(enter(request, request.phase(), &message, now, |_| {}));
        actions.push(Action::Event(Event {
            warning: false,
            reason: EventReason::MachineConfigPoolBusy,
            note: message,
        }));
    }
    Step {
        actions,
        wake_at: Some(after(now, BUSY_RECHECK)),
        ..Step::default()
    }
}
