//! Scheduled (and NVIDIA's Cordon): the cordon, and the phase that follows it.

use jiff::Timestamp;
use maintenance_crds::{NodeMaintenance, Phase};

use super::{Action, NodeView, Observed, Step, enter, initial_state};

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
