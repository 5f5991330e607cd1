//! A drain that budgets block gives its slot back (`admission.yieldBlockedDrainAfterSeconds`):
//! the verdict at its boundary, no yield when unset, while progressing, when blocked by anything
//! but a budget or with an escalation deadline; the step of a yield (uncordon if owed, the
//! metadata patch, Pending, the Event) and the finish of one cut short.

use super::*;
use crate::yielding::{
    YIELD_BLOCKED_BY_ANNOTATION, YIELD_COUNT_ANNOTATION, YIELDED_AT_ANNOTATION, YieldBlocker,
};

const PERIOD: Duration = Duration::from_secs(5);

fn run_yielding(
    nm: &NodeMaintenance,
    pods: &[Pod],
    now: Timestamp,
    ledger: &mut Ledger,
    yield_after: Option<Duration>,
) -> Step {
    let summaries = BTreeMap::new();
    let operator = OperatorIdentity::new("maintenance-operator", None);
    let pods: Vec<Arc<CachedPod>> = pods
        .iter()
        .map(|p| Arc::new(CachedPod::cached(p)))
        .collect();
    let observed = Observed {
        node: CORDONED,
        request_gone: false,
        pods: Some(&pods),
        pdb_summaries: &summaries,
        operator: &operator,
        yield_after,
        pool: None,
    };
    step(nm, &observed, now, ledger)
}

/// Draining since at(0) with pods web-0 (refused by budget `web` at(1)) and api-0 (evicted
/// at(1), still terminating); the ledger as the actor holds it after those answers.
fn blocked_drain(nm: &NodeMaintenance) -> (Vec<Pod>, Ledger) {
    let pods = vec![pod("app", "web-0")];
    let mut ledger = Ledger::default();
    let first = run_yielding(nm, &pods, at(1), &mut ledger, Some(PERIOD));
    assert_eq!(evicted(&first), ["app/web-0"]);
    answer(&mut ledger, "app/web-0", refused_by(Some("web")), at(1));
    (pods, ledger)
}

fn yield_patch_of(step: &Step) -> Option<&serde_json::Value> {
    step.actions.iter().find_map(|a| match a {
        Action::Yield { patch, .. } => Some(patch),
        _ => None,
    })
}

#[test]
fn the_verdict_at_its_boundary() {
    let blocked = true;
    // A whole-second start counts from the end of its second: due at(16), never early.
    let since = at(10);
    let table = [
        (None, None, blocked, at(1000), YieldVerdict::Off),
        (
            Some(PERIOD),
            Some(Duration::from_secs(60)),
            blocked,
            at(1000),
            YieldVerdict::Escalates,
        ),
        (
            Some(PERIOD),
            None,
            false,
            at(1000),
            YieldVerdict::NotBlockedByPdb,
        ),
        (
            Some(PERIOD),
            None,
            blocked,
            at(15),
            YieldVerdict::Progressing { due: at(16) },
        ),
        (
            Some(PERIOD),
            None,
            blocked,
            at(16) - jiff::SignedDuration::from_millis(1),
            YieldVerdict::Progressing { due: at(16) },
        ),
        (Some(PERIOD), None, blocked, at(16), YieldVerdict::Yield),
        (Some(PERIOD), None, blocked, at(17), YieldVerdict::Yield),
    ];
    for (period, force, blocked, now, expected) in table {
        assert_eq!(
            yield_verdict(period, force, blocked, since, now),
            expected,
            "{period:?} {force:?} {blocked} {now}"
        );
    }
    // A time of ours with milliseconds counts as it is.
    let precise = at(10) + jiff::SignedDuration::from_millis(250);
    assert_eq!(
        yield_verdict(Some(PERIOD), None, true, precise, at(15)),
        YieldVerdict::Progressing {
            due: at(15) + jiff::SignedDuration::from_millis(250)
        }
    );
}

#[test]
fn a_drain_blocked_by_a_budget_gives_its_slot_back_after_the_period() {
    let nm = with_drain(request(Phase::Draining), 0);
    let (pods, mut ledger) = blocked_drain(&nm);
    // Quiet since at(1) (the actor's first step): due at(7).
    let before = run_yielding(&nm, &pods, at(6), &mut ledger, Some(PERIOD));
    assert_eq!(yield_patch_of(&before), None, "{before:?}");
    assert!(!before.finished);
    assert!(
        before
            .wake_at
            .is_some_and(|w| w <= after(at(7), TIMER_SLACK))
    );

    let step = run_yielding(&nm, &pods, at(7), &mut ledger, Some(PERIOD));
    assert!(step.finished, "{step:?}");
    assert!(!step.watch_pods);
    // In order: the uncordon (ours: the node was schedulable), the patch, Pending, the Event.
    assert!(matches!(step.actions[0], Action::Uncordon), "{step:?}");
    let patch = yield_patch_of(&step).expect("the yield's patch");
    let annotations = &patch["metadata"]["annotations"];
    assert_eq!(annotations[YIELD_COUNT_ANNOTATION], serde_json::json!("1"));
    assert_eq!(
        annotations[YIELDED_AT_ANNOTATION],
        serde_json::json!(conditions::admitted_time_value(at(7)))
    );
    assert_eq!(
        annotations[YIELD_BLOCKED_BY_ANNOTATION],
        serde_json::json!("PodDisruptionBudget app/web refused the eviction of pod app/web-0")
    );
    assert_eq!(
        annotations[ADMITTED_UID_ANNOTATION],
        serde_json::Value::Null
    );
    assert_eq!(patch["metadata"]["finalizers"], serde_json::json!([]));
    let write = status_writes(&step)[0];
    let transition = write.transition.as_ref().expect("a phase change");
    assert_eq!(
        (transition.from, transition.to),
        (Some(Phase::Draining), Phase::Pending)
    );
    assert!(write.status.drain.is_none());
    let message = &transition.message;
    for part in [
        "PodDisruptionBudget app/web",
        "app/web-0",
        "node-1 uncordoned",
        "5s",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    assert_eq!(events(&step), [EventReason::Yielded]);
    assert!(matches!(step.actions.last(), Some(Action::Event(e)) if e.warning));
    // The ledger is forgotten: the evictions still due are never sent.
    assert!(ledger.outlook().blocked_by_pdb.is_empty());
}

#[test]
fn no_yield_when_unset() {
    let nm = with_drain(request(Phase::Draining), 0);
    let (pods, mut ledger) = blocked_drain(&nm);
    let step = run_yielding(&nm, &pods, at(10_000), &mut ledger, None);
    assert_eq!(yield_patch_of(&step), None);
    assert!(!step.finished);
}

#[test]
fn no_yield_while_the_drain_makes_progress() {
    let nm = with_drain(request(Phase::Draining), 0);
    let pods = vec![pod("app", "web-0"), pod("app", "web-1")];
    let mut ledger = Ledger::default();
    run_yielding(&nm, &pods, at(1), &mut ledger, Some(PERIOD));
    answer(&mut ledger, "app/web-0", refused_by(Some("web")), at(1));
    // web-1 evicted at(5) (a whole second: counted from its end): quiet since then, due at(11).
    answer(&mut ledger, "app/web-1", EvictionOutcome::Evicted, at(5));
    let step = run_yielding(&nm, &pods, at(10), &mut ledger, Some(PERIOD));
    assert_eq!(yield_patch_of(&step), None, "{step:?}");
    let step = run_yielding(&nm, &pods, at(11), &mut ledger, Some(PERIOD));
    assert!(yield_patch_of(&step).is_some(), "{step:?}");
}

#[test]
fn no_yield_when_something_other_than_a_budget_blocks() {
    let nm = with_drain(request(Phase::Draining), 0);
    // A pod without a controller (NeedsForce), one that terminates, one throttled without a
    // budget named, one refused with an error: nothing waits on a budget.
    let pods = vec![
        bare("app", "manual"),
        terminating(pod("app", "leaving")),
        pod("app", "throttled"),
        pod("app", "flaky"),
    ];
    let mut ledger = Ledger::default();
    run_yielding(&nm, &pods, at(1), &mut ledger, Some(PERIOD));
    answer(&mut ledger, "app/throttled", refused_by(None), at(1));
    answer(
        &mut ledger,
        "app/flaky",
        EvictionOutcome::Error {
            code: Some(500),
            message: "etcd".into(),
        },
        at(1),
    );
    let step = run_yielding(&nm, &pods, at(1000), &mut ledger, Some(PERIOD));
    assert_eq!(yield_patch_of(&step), None, "{step:?}");
    assert!(!step.finished);
}

#[test]
fn no_yield_with_an_escalation_deadline() {
    let nm = with_force_delete_after(with_drain(request(Phase::Draining), 0), 3600);
    let (pods, mut ledger) = blocked_drain(&nm);
    let step = run_yielding(&nm, &pods, at(100), &mut ledger, Some(PERIOD));
    assert_eq!(yield_patch_of(&step), None, "{step:?}");
}

#[test]
fn a_node_that_was_cordoned_before_stays_cordoned_and_the_count_grows() {
    let mut nm = with_initial_state(with_drain(request(Phase::Draining), 0), Some(true));
    let annotations = nm.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(YIELD_COUNT_ANNOTATION.into(), "2".into());
    annotations.insert(
        YIELDED_AT_ANNOTATION.into(),
        conditions::admitted_time_value(at(-100)),
    );
    let (pods, mut ledger) = blocked_drain(&nm);
    let step = run_yielding(&nm, &pods, at(7), &mut ledger, Some(PERIOD));
    assert!(!has(&step, &Action::Uncordon), "{step:?}");
    assert_eq!(
        step.actions[0],
        Action::UnprotectFromAutoscalers,
        "the autoscaler annotations its admission wrote go with the slot"
    );
    let patch = yield_patch_of(&step).expect("a yield");
    assert_eq!(
        patch["metadata"]["annotations"][YIELD_COUNT_ANNOTATION],
        serde_json::json!("3")
    );
    let message = &status_writes(&step)[0]
        .transition
        .as_ref()
        .expect("a phase change")
        .message;
    assert!(
        message.contains("yield 3") && !message.contains("uncordoned"),
        "{message}"
    );
}

#[test]
fn a_yield_cut_short_after_its_metadata_write_only_writes_pending() {
    // What the patch left: Draining shown, no admission, no finalizer, the yield recorded.
    let mut nm = without_finalizer(with_drain(request(Phase::Draining), 0));
    let annotations = nm.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.remove(ADMITTED_TIME_ANNOTATION);
    annotations.remove(INITIAL_UNSCHEDULABLE_ANNOTATION);
    annotations.insert(YIELD_COUNT_ANNOTATION.into(), "1".into());
    annotations.insert(
        YIELDED_AT_ANNOTATION.into(),
        conditions::admitted_time_value(at(7)),
    );
    annotations.insert(
        YIELD_BLOCKED_BY_ANNOTATION.into(),
        "PodDisruptionBudget app/web".into(),
    );
    let step = run(&nm, CORDONED, Some(&[pod("app", "web-0")]), at(9));
    assert!(step.finished, "{step:?}");
    assert_eq!(step.actions.len(), 1, "{step:?}");
    assert_eq!(moved_to(&step), Some(Phase::Pending));
    assert!(!has(&step, &Action::AddFinalizer));
    // Once Pending, it needs no actor: the supervisor admits it again in its time.
    let pending = with_condition(nm, condition_type::READY, false, "Pending");
    assert!(!needs_actor(&pending, true, false));
}

#[test]
fn a_yield_names_every_budget_and_pod() {
    let nm = with_drain(request(Phase::Draining), 0);
    let blocker = YieldBlocker {
        pods_by_pdb: BTreeMap::from([
            (
                "app/web".into(),
                vec!["app/web-0".into(), "app/web-1".into()],
            ),
            ("app/db".into(), vec!["app/db-0".into()]),
        ]),
    };
    let message = yield_message(&nm, PERIOD, &blocker, 1, true);
    for part in ["app/web", "app/web-0", "app/web-1", "app/db", "app/db-0"] {
        assert!(message.contains(part), "{part}: {message}");
    }
}

/// A yield is a release too: the pool the request labelled is looked at before the patch, and
/// the patch removes the label (a Pending request holds no pool).
#[test]
fn a_yield_releases_the_pool_it_labelled() {
    let mut nm = with_drain(request(Phase::Draining), 0);
    nm.metadata.labels = Some(BTreeMap::from([(
        crate::machine_config_pool::POOL_LABEL.to_string(),
        "worker".to_string(),
    )]));
    let (pods, mut ledger) = blocked_drain(&nm);
    let step = run_yielding(&nm, &pods, at(7), &mut ledger, Some(PERIOD));
    let release = step
        .actions
        .iter()
        .position(|a| matches!(a, Action::ReleasePool { pool } if pool == "worker"));
    let patch = step
        .actions
        .iter()
        .position(|a| matches!(a, Action::Yield { .. }));
    assert!(release.is_some() && release < patch, "{step:?}");
    let labels = &yield_patch_of(&step).expect("the yield's patch")["metadata"]["labels"];
    assert_eq!(
        labels[crate::machine_config_pool::POOL_LABEL],
        serde_json::Value::Null
    );
}
