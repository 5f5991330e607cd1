//! The end of a request: its deletion (after `additionalRequestors`), its node gone, or the
//! request gone without our cleanup, and the uncordon each owes.

use jiff::Timestamp;
use maintenance_crds::{CORDON_REQUESTED_ANNOTATION, NodeMaintenance, Phase, condition_type};

use super::{
    Action, Event, EventReason, NodeView, Observed, Step, enter, has_finalizer, in_phase_for,
    initial_state, needs_actor,
};

/// Deletion: in `Ready` and `RequestorFailed` it waits for `additionalRequestors` to be empty; in
/// every earlier phase it stops the work and cleans up at once (NVIDIA: `handleTerminalState`
/// waits, `handleCordonState`/`handleWaitPodCompletionState`/`handleDrainStateDelete` do not).
/// The request vanished while its actor still held the node: the API server deleted it under our
/// finalizer (a deletion that raced the admission's finalizer write: the DELETE found no finalizer
/// and went through after the admission had added ours), or someone removed our finalizer by
/// hand. Nothing else will undo what the request did to the node, so the actor undoes it now, as
/// the deletion would have, from the last version it saw: the uncordon if we owe it, or the
/// autoscaler annotations (`node_release`). There is no object left to write.
pub fn on_request_gone(last: &NodeMaintenance, node: NodeView) -> Step {
    let mut step = Step {
        finished: true,
        ..Step::default()
    };
    let release = node_release(last, node);
    let uncordon = release == Some(Action::Uncordon);
    step.actions.extend(release);
    step.actions.extend(pool_release(last));
    if uncordon {
        step.actions.push(Action::Event(Event {
            warning: true,
            reason: EventReason::Uncordon,
            note: format!(
                "uncordoned {}: the request went without our cleanup (deleted under our \
                 finalizer, or the finalizer was removed by hand)",
                last.spec.node_name
            ),
        }));
    }
    step
}

/// Whether an actor whose request went without our cleanup, last seen as `last`, owes the node an
/// uncordon ([`on_request_gone`]): until it is done, the node stays held, and no other request is
/// admitted there (its admission would record our cordon as the node's initial state, and our
/// uncordon would then land under it).
pub fn owes_uncordon_once_gone(last: &NodeMaintenance) -> bool {
    last.phase() != Phase::Pending && owes_uncordon(last)
}

/// Whether a running actor still holds its node although the request, as the cache shows it
/// (`cached`, `None`: gone), needs no actor any more ([`needs_actor`]): the request went without
/// our cleanup, and the actor has an uncordon to do ([`owes_uncordon_once_gone`]).
pub fn actor_holds_node_of_gone_request(
    last: &NodeMaintenance,
    cached: Option<&NodeMaintenance>,
    node_exists: bool,
    admitted: bool,
) -> bool {
    let gone = cached.is_none_or(|r| {
        r.metadata.uid != last.metadata.uid || !needs_actor(r, node_exists, admitted)
    });
    gone && node_exists && owes_uncordon_once_gone(last)
}

pub(super) fn on_deletion(
    request: &NodeMaintenance,
    observed: &Observed<'_>,
    now: Timestamp,
) -> Step {
    if !has_finalizer(request) {
        return Step {
            finished: true,
            ..Step::default()
        };
    }
    let phase = request.phase();
    let others = request.spec.additional_requestors();
    if matches!(phase, Phase::Ready | Phase::RequestorFailed) && !others.is_empty() {
        let message = format!(
            "deletion waits for additionalRequestors to be removed: {}",
            others.join(", ")
        );
        let mut step = Step::default();
        if request
            .condition(condition_type::READY)
            .is_none_or(|c| c.message != message)
        {
            step.actions
                .push(enter(request, phase, &message, now, |_| {}));
        }
        return step;
    }
    let mut actions = Vec::new();
    // Only a node we cordoned is uncordoned, and only once the cordon may have happened: from
    // Scheduled on, since the Scheduled step cordons before it writes the next phase (a deletion
    // between the two must not leave the node cordoned). An uncordon we turn out not to owe sets
    // `unschedulable: false` on a node that already has it.
    let release = node_release(request, observed.node);
    let uncordon = release == Some(Action::Uncordon);
    actions.extend(release);
    actions.extend(pool_release(request));
    actions.push(Action::RemoveFinalizer {
        phase,
        in_phase_for: in_phase_for(request, now),
    });
    // Events follow the writes they report: a write that conflicts runs the step again, and an
    // Event sent before it would be sent twice.
    if uncordon {
        actions.push(Action::Event(Event {
            warning: false,
            reason: EventReason::Uncordon,
            note: format!("uncordoned {}", request.spec.node_name),
        }));
    }
    Step {
        actions,
        finished: true,
        ..Step::default()
    }
}

/// The node is gone: nothing to cordon, drain or uncordon. The request is released at once
/// (NVIDIA's `Reconcile` removes the finalizer when the node is not found), and the scheduler
/// no longer counts it; the node's owner reference lets the garbage collector delete it.
pub(super) fn on_node_gone(request: &NodeMaintenance, now: Timestamp) -> Step {
    let mut step = Step {
        finished: true,
        ..Step::default()
    };
    if !has_finalizer(request) {
        return step;
    }
    let phase = request.phase();
    let message = format!(
        "node {} no longer exists; the request is released",
        request.spec.node_name
    );
    step.actions.push(enter(request, phase, &message, now, |s| {
        s.wait_for_completion.clear();
    }));
    step.actions.extend(pool_release(request));
    step.actions.push(Action::RemoveFinalizer {
        phase,
        in_phase_for: in_phase_for(request, now),
    });
    // Last, after the writes it reports (see `on_deletion`).
    step.actions.push(Action::Event(Event {
        warning: true,
        reason: EventReason::NodeGone,
        note: message,
    }));
    step
}

/// What gives the node back at the end of `request` (its deletion, a yield, the request gone):
/// the uncordon if we owe it ([`owes_uncordon`]), which removes the autoscaler annotations with
/// the cordon; otherwise the autoscaler annotations an admission that did not cordon wrote. Only
/// once the cordon may have happened: from Scheduled on, since the Scheduled step cordons (or
/// protects) before it writes the next phase, and a deletion between the two must not leave the
/// node cordoned. An uncordon we turn out not to owe sets `unschedulable: false` on a node that
/// already has it.
pub(super) fn node_release(request: &NodeMaintenance, node: NodeView) -> Option<Action> {
    if request.phase() == Phase::Pending || !matches!(node, NodeView::Present { .. }) {
        return None;
    }
    Some(if owes_uncordon(request) {
        Action::Uncordon
    } else {
        Action::UnprotectFromAutoscalers
    })
}

/// The uncordon is owed when we may have cordoned: the node was schedulable before, and the
/// cordon was asked for now or at admission ([`CORDON_REQUESTED_ANNOTATION`]), so that
/// `spec.cordon` turned off mid-maintenance does not leave the node cordoned. (Turned on after
/// the cordon step, it owes an uncordon too: a no-op on a node we never cordoned.)
pub(super) fn owes_uncordon(request: &NodeMaintenance) -> bool {
    let requested_at_admission = request
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CORDON_REQUESTED_ANNOTATION))
        .is_some_and(|v| v == "true");
    (request.spec.cordon() || requested_at_admission) && initial_state(request) == Some(false)
}

/// The pool a request labelled is looked at on every way it ends (NVIDIA calls `UnpauseMCP` on
/// deletion in every phase, internal/controller/nodemaintenance_controller.go): unpaused if we
/// paused it and no other request holds it. Whatever the `openshift` setting says now, so that a
/// pool is never left paused by a request that is gone.
pub(super) fn pool_release(request: &NodeMaintenance) -> Option<Action> {
    crate::machine_config_pool::labelled_pool(request).map(|pool| Action::ReleasePool {
        pool: pool.to_string(),
    })
}
