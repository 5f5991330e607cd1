//! OpenShift MachineConfigPool pausing in the lifecycle (NVIDIA: `PauseMCP` in
//! `handleScheduledState`, `UnpauseMCP` on every deletion, internal/controller/
//! nodemaintenance_controller.go and internal/openshift/mcp.go): the pool is paused before the
//! cordon, a busy pool makes the Scheduled step wait without cordoning and say why, and every way
//! a request ends looks at the pool it labelled.

use super::*;
use crate::machine_config_pool::{POOL_LABEL, PoolObservation, Unresolved, test_pool};

fn worker(paused: bool, ours: bool, current: &str, target: &str) -> PoolObservation {
    PoolObservation::Seen(test_pool(paused, ours, current, target))
}

fn labelled(mut nm: NodeMaintenance, pool: &str) -> NodeMaintenance {
    nm.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(POOL_LABEL.into(), pool.into());
    nm
}

fn run_pool(
    nm: &NodeMaintenance,
    node: NodeView,
    pool: Option<&PoolObservation>,
    now: Timestamp,
) -> Step {
    let summaries = BTreeMap::new();
    let operator = OperatorIdentity::new("maintenance-operator", None);
    let observed = Observed {
        node,
        request_gone: false,
        pods: None,
        pdb_summaries: &summaries,
        operator: &operator,
        yield_after: None,
        pool,
    };
    step(nm, &observed, now, &mut Ledger::default())
}

fn position(step: &Step, wanted: impl Fn(&Action) -> bool) -> Option<usize> {
    step.actions.iter().position(wanted)
}

/// Scheduled with a pool free: label, pause, then the cordon, in that order, in one step.
#[test]
fn scheduled_labels_and_pauses_the_pool_before_the_cordon() {
    let nm = request(Phase::Scheduled);
    let pool = worker(false, false, "rendered-worker-1", "rendered-worker-1");
    let step = run_pool(&nm, SCHEDULABLE, Some(&pool), at(1));
    let label = position(
        &step,
        |a| matches!(a, Action::LabelPool { pool } if pool == "worker"),
    );
    let pause = position(
        &step,
        |a| matches!(a, Action::PausePool(v) if v.name == "worker"),
    );
    let cordon = position(&step, |a| *a == Action::Cordon);
    assert!(
        label < pause && pause < cordon && label.is_some(),
        "{step:?}"
    );
    assert_eq!(moved_to(&step), Some(Phase::Ready));
    assert!(events(&step).contains(&EventReason::MachineConfigPoolPaused));
}

/// Paused by us already (another request of the pool): no second pause; a labelled request is not
/// labelled again.
#[test]
fn a_pool_paused_by_us_is_not_paused_again() {
    let nm = labelled(request(Phase::Scheduled), "worker");
    let pool = worker(true, true, "rendered-worker-1", "rendered-worker-1");
    let step = run_pool(&nm, SCHEDULABLE, Some(&pool), at(1));
    assert!(
        !step
            .actions
            .iter()
            .any(|a| matches!(a, Action::PausePool(_) | Action::LabelPool { .. })),
        "{step:?}"
    );
    assert!(has(&step, &Action::Cordon));
}

/// Busy (paused by someone else, configuring) or not found: no cordon, the phase stays, the
/// status and a Normal Event say why once, and the step looks again in 10 s.
#[test]
fn a_busy_pool_makes_the_cordon_wait_and_say_why() {
    let rows = [
        (
            worker(true, false, "r1", "r1"),
            "MachineConfigPool worker is paused by someone else",
        ),
        (
            worker(false, false, "r1", "r2"),
            "MachineConfigPool worker is in the middle of a configuration change (from r1 to r2)",
        ),
        (
            PoolObservation::Unresolved(Unresolved::NoDesiredConfig),
            "node node-1 has no machineconfiguration.openshift.io/desiredConfig annotation",
        ),
    ];
    for (pool, says) in rows {
        let nm = request(Phase::Scheduled);
        let step = run_pool(&nm, SCHEDULABLE, Some(&pool), at(1));
        assert!(!has(&step, &Action::Cordon), "{step:?}");
        assert_eq!(moved_to(&step), None, "{step:?}");
        let writes = status_writes(&step);
        assert_eq!(writes.len(), 1, "{step:?}");
        let message = &ready_condition(writes[0]).message;
        assert!(message.contains(says), "{message}");
        assert_eq!(ready_condition(writes[0]).reason, Phase::Scheduled.as_str());
        assert_eq!(events(&step), vec![EventReason::MachineConfigPoolBusy]);
        assert_eq!(step.wake_at, Some(at(11)));
        // A found pool labels the request even while it waits (as NVIDIA's `PauseMCP`).
        let labels = matches!(pool, PoolObservation::Seen(_));
        assert_eq!(
            step.actions
                .iter()
                .any(|a| matches!(a, Action::LabelPool { .. })),
            labels
        );

        // Shown already: nothing is written again, the recheck stays.
        let mut shown = labelled(nm, "worker");
        let status = writes[0].status.clone();
        shown.status = Some(status);
        let again = run_pool(&shown, SCHEDULABLE, Some(&pool), at(11));
        assert!(
            status_writes(&again).is_empty() && events(&again).is_empty(),
            "{again:?}"
        );
        assert_eq!(again.wake_at, Some(at(21)));
    }
}

/// With pools off (nothing observed) the step is as before.
#[test]
fn without_a_pool_the_cordon_is_as_before() {
    let nm = request(Phase::Scheduled);
    assert_eq!(
        run_pool(&nm, SCHEDULABLE, None, at(1)),
        run(&nm, SCHEDULABLE, None, at(1))
    );
}

/// Every way a labelled request ends looks at its pool, before its finalizer goes; a request
/// without the label never does.
#[test]
fn every_release_of_a_labelled_request_looks_at_its_pool() {
    let release = Action::ReleasePool {
        pool: "worker".into(),
    };
    for phase in [
        Phase::Scheduled,
        Phase::Draining,
        Phase::Ready,
        Phase::RequestorFailed,
    ] {
        let nm = labelled(request(phase), "worker");
        let deletion = run(&deleting(nm.clone()), SCHEDULABLE, None, at(5));
        let gone_node = run(&nm, NodeView::Missing, None, at(5));
        let gone_request =
            run_observing(&nm, SCHEDULABLE, true, None, at(5), &mut Ledger::default());
        for step in [deletion, gone_node, gone_request] {
            let pool = position(&step, |a| *a == release);
            assert!(pool.is_some(), "{phase}: {step:?}");
            if let Some(finalizer) =
                position(&step, |a| matches!(a, Action::RemoveFinalizer { .. }))
            {
                assert!(pool < Some(finalizer), "{phase}: {step:?}");
            }
        }
        let unlabelled = run(&deleting(request(phase)), SCHEDULABLE, None, at(5));
        assert!(!has(&unlabelled, &release), "{unlabelled:?}");
    }
    // Waiting for additionalRequestors: not released yet.
    let waiting = with_additional(labelled(request(Phase::Ready), "worker"), &["other"]);
    assert!(!has(
        &run(&deleting(waiting), SCHEDULABLE, None, at(5)),
        &release
    ));
}

/// The step that pools observe: the cordon's, not a deletion's nor a failed requestor's.
#[test]
fn only_the_cordon_step_observes_the_pool() {
    assert!(observes_pool(&request(Phase::Scheduled)));
    assert!(observes_pool(&request(Phase::Cordon)));
    assert!(!observes_pool(&request(Phase::Pending)));
    assert!(!observes_pool(&request(Phase::Draining)));
    assert!(!observes_pool(&deleting(request(Phase::Scheduled))));
    assert!(!observes_pool(&requestor_failed(
        request(Phase::Scheduled),
        true
    )));
}
