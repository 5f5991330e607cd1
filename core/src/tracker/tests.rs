//! The supervisor's bookkeeping through the races the end-to-end runs found, each as the
//! sequence of what the supervisor did and what its cache showed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use maintenance_crds::ADMITTED_UID_ANNOTATION;

use super::*;
use crate::fixtures::{RequestBuilder, node, request};

const NODE: &str = "n1";

/// A request for [`NODE`] as the cache shows it: Pending, named after its UID, at `version`.
fn pending(uid: &str, version: &str) -> NodeMaintenance {
    pending_builder(uid, version).build()
}

fn pending_builder(uid: &str, version: &str) -> RequestBuilder {
    request(uid)
        .namespace("team")
        .node(NODE)
        .requestor("example.com")
        .uid(uid)
        .version(version)
}

/// The same request as its admission wrote it: our finalizer and UID annotation (Scheduled).
fn admitted(uid: &str, version: &str) -> NodeMaintenance {
    pending_builder(uid, version)
        .finalizer()
        .annotation(ADMITTED_UID_ANNOTATION, uid)
        .build()
}

/// Deleted, with our finalizer still on (`finalizer`) or taken off by the cleanup.
fn deleted(mut request: NodeMaintenance, version: &str, finalizer: bool) -> NodeMaintenance {
    request.metadata.resource_version = Some(version.into());
    request.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    if !finalizer {
        request.metadata.finalizers = None;
    }
    request
}

/// What the cache shows in one round.
struct Shown {
    requests: Vec<Arc<NodeMaintenance>>,
    nodes: Vec<Arc<Node>>,
}

fn shown(requests: &[NodeMaintenance]) -> Shown {
    Shown {
        requests: requests.iter().cloned().map(Arc::new).collect(),
        nodes: vec![Arc::new(node(NODE).version("1").build())],
    }
}

impl Shown {
    fn without_node(mut self) -> Shown {
        self.nodes.clear();
        self
    }

    fn cache(&self) -> Cache<'_> {
        Cache::new(&self.requests, &self.nodes)
    }

    /// The scheduler's view of this cache, as the tracker adjusts it: each request's phase and
    /// whether it is released.
    fn snapshot(&self, tracker: &Tracker) -> Vec<(String, Phase, bool)> {
        let mut snapshot = Snapshot::from_objects(
            self.nodes.iter().map(|n| &**n),
            self.requests.iter().map(|r| &**r),
        );
        tracker.adjust(&mut snapshot, &self.cache());
        snapshot
            .requests
            .into_iter()
            .map(|r| (r.name, r.phase, r.released))
            .collect()
    }
}

fn round(tracker: &mut Tracker, shown: &Shown) {
    tracker.settle(&shown.cache());
}

fn now() -> Timestamp {
    Timestamp::from_second(1_700_000_000).expect("a valid time")
}

#[test]
fn an_admission_in_flight_holds_its_slot_until_the_cache_shows_it_admitted() {
    let mut tracker = Tracker::default();
    let before = shown(&[pending("a", "3")]);
    round(&mut tracker, &before);
    assert!(tracker.begin_admission("a", Some("3")));
    assert!(
        !tracker.begin_admission("a", Some("3")),
        "a second round must not send the same admission again"
    );
    // Rounds go on while the writes are in flight: the request counts as in maintenance.
    for _ in 0..3 {
        round(&mut tracker, &before);
        assert_eq!(
            before.snapshot(&tracker),
            [("a".into(), Phase::Scheduled, false)]
        );
        assert!(tracker.is_being_admitted("a"));
    }
    tracker.admission_answered("a", AdmissionAnswer::Admitted, now());
    // The cache is behind: still Pending there, still Scheduled for the scheduler.
    round(&mut tracker, &before);
    assert_eq!(
        before.snapshot(&tracker),
        [("a".into(), Phase::Scheduled, false)]
    );
    assert!(tracker.is_admitted("a"));
    // The cache shows the admission: nothing left to remember.
    let after = shown(&[admitted("a", "4")]);
    round(&mut tracker, &after);
    assert_eq!(tracker.get("a"), None);
    assert_eq!(
        after.snapshot(&tracker),
        [("a".into(), Phase::Scheduled, false)]
    );
}

/// An admission whose answer was lost is read back before it is answered (the shell's `admit`):
/// until then it holds its slot whatever the cache shows, even a request gone from it.
#[test]
fn an_admission_whose_answer_was_lost_holds_its_slot_until_answered() {
    let mut tracker = Tracker::default();
    round(&mut tracker, &shown(&[pending("a", "3")]));
    assert!(tracker.begin_admission("a", Some("3")));
    round(&mut tracker, &shown(&[]));
    assert!(
        tracker.is_being_admitted("a"),
        "an admission in flight is forgotten only when answered"
    );
    let back = shown(&[pending("a", "3")]);
    round(&mut tracker, &back);
    assert_eq!(
        back.snapshot(&tracker),
        [("a".into(), Phase::Scheduled, false)]
    );
    // Read back applied: admitted.
    tracker.admission_answered("a", AdmissionAnswer::Admitted, now());
    round(&mut tracker, &back);
    assert_eq!(
        back.snapshot(&tracker),
        [("a".into(), Phase::Scheduled, false)]
    );
}

#[test]
fn a_refused_admission_backs_off_and_gives_its_slot_to_the_next() {
    let mut tracker = Tracker::default();
    let cache = shown(&[pending("a", "3")]);
    assert!(tracker.begin_admission("a", Some("3")));
    let retry = tracker
        .admission_answered(
            "a",
            AdmissionAnswer::Failed {
                error: "denied".into(),
            },
            now(),
        )
        .cloned()
        .expect("a failed admission waits for a retry");
    assert_eq!(retry.failures, 1);
    round(&mut tracker, &cache);
    assert_eq!(
        cache.snapshot(&tracker),
        [("a".into(), Phase::Pending, false)]
    );
    let mut snapshot = Snapshot::from_objects(
        cache.nodes.iter().map(|n| &**n),
        cache.requests.iter().map(|r| &**r),
    );
    tracker.adjust(&mut snapshot, &cache.cache());
    assert_eq!(snapshot.requests[0].admission_retry, Some(retry.clone()));
    // It may be tried again; a second failure doubles the wait.
    assert!(tracker.begin_admission("a", Some("3")));
    let second = tracker
        .admission_answered(
            "a",
            AdmissionAnswer::Failed {
                error: "denied".into(),
            },
            now(),
        )
        .cloned()
        .expect("retry");
    assert_eq!(second.failures, 2);
    assert!(second.at > retry.at);
    // Admitted at last: the retry is forgotten.
    assert!(tracker.begin_admission("a", Some("3")));
    tracker.admission_answered("a", AdmissionAnswer::Admitted, now());
    assert_eq!(tracker.get("a").and_then(|t| t.retry.clone()), None);
}

#[test]
fn a_retry_is_forgotten_once_the_request_is_deleted_or_gone() {
    for cache in [shown(&[deleted(pending("a", "3"), "4", false)]), shown(&[])] {
        let mut tracker = Tracker::default();
        tracker.begin_admission("a", Some("3"));
        tracker.admission_answered("a", AdmissionAnswer::Failed { error: "x".into() }, now());
        round(&mut tracker, &cache);
        assert_eq!(tracker.get("a"), None);
    }
}

/// An admission that met a newer object keeps its turn without a write until the cache shows
/// another version: the same write, guarded by the same version, would only conflict again.
#[test]
fn a_stale_admission_waits_for_the_cache_to_show_another_version() {
    let mut tracker = Tracker::default();
    let behind = shown(&[pending("a", "3")]);
    assert!(tracker.begin_admission("a", Some("3")));
    tracker.admission_answered("a", AdmissionAnswer::Changed, now());
    round(&mut tracker, &behind);
    assert!(
        !tracker.begin_admission("a", Some("3")),
        "no write at the same version"
    );
    assert!(
        tracker.is_being_admitted("a"),
        "no Pending write or taint change meanwhile"
    );
    assert_eq!(
        behind.snapshot(&tracker),
        [("a".into(), Phase::Pending, false)],
        "no slot held: nothing was written"
    );
    round(&mut tracker, &shown(&[pending("a", "5")]));
    assert_eq!(tracker.get("a"), None);
    assert!(tracker.begin_admission("a", Some("5")));
}

/// A Pending write answered at a version the cache does not show yet holds the request back:
/// neither written again nor admitted (its guarded write would conflict) until the cache shows
/// the version.
#[test]
fn a_write_in_flight_seen_late_holds_its_request_until_the_cache_shows_it() {
    let mut tracker = Tracker::default();
    tracker.writes_sent(["a".to_string()]);
    round(&mut tracker, &shown(&[pending("a", "3")]));
    assert!(tracker.has_write("a"));
    assert!(!tracker.begin_admission("a", Some("3")));
    tracker.writes_answered(vec![("a".into(), Some("10".into()))]);
    for version in ["3", "9"] {
        round(&mut tracker, &shown(&[pending("a", version)]));
        assert!(
            tracker.has_write("a"),
            "the cache at {version} is behind the write at 10"
        );
        assert!(!tracker.begin_admission("a", Some(version)));
    }
    round(&mut tracker, &shown(&[pending("a", "10")]));
    assert!(!tracker.has_write("a"));
    assert!(tracker.begin_admission("a", Some("10")));
}

#[test]
fn a_write_that_wrote_nothing_frees_its_request_at_once() {
    let mut tracker = Tracker::default();
    tracker.writes_sent(["a".to_string(), "b".to_string()]);
    tracker.writes_answered(vec![("a".into(), None), ("b".into(), Some("4".into()))]);
    assert!(!tracker.has_write("a"));
    assert!(tracker.has_write("b"));
    round(&mut tracker, &shown(&[]));
    assert!(
        !tracker.has_write("b"),
        "a request gone from the cache needs no memory"
    );
}

/// The sequence that left a node cordoned: the admission writes version 5 and its actor starts
/// from it; the requestor deletes the request (7), the actor's cleanup takes our finalizer off
/// (8) and it ends; the cache, behind, shows 3, then 5, then 7. None of those may start another
/// actor, and the request is released at once, so its slot goes to the next request.
#[test]
fn a_deletion_right_after_the_admission_releases_the_slot_and_starts_nothing() {
    let mut tracker = Tracker::default();
    let later = Instant::now();
    assert!(tracker.begin_admission("a", Some("3")));
    tracker.admission_answered("a", AdmissionAnswer::Admitted, now());
    assert_eq!(
        tracker.actor_action("a", None, Some("5"), true, later),
        ActorAction::Start
    );
    tracker.actor_started("a");
    assert_eq!(
        tracker.actor_action("a", Some(Some("5")), Some("3"), true, later),
        ActorAction::Nothing,
        "an older cached version is not news to the running actor"
    );
    tracker.actor_ended(
        "a",
        RunEnd::Finished {
            version: Some("8".into()),
            node_gone: false,
        },
    );
    for (cached, request) in [
        ("3", pending("a", "3")),
        ("5", admitted("a", "5")),
        ("7", deleted(admitted("a", "5"), "7", true)),
    ] {
        let cache = shown(&[request, pending("b", "2")]);
        round(&mut tracker, &cache);
        assert_eq!(
            tracker.actor_action("a", None, Some(cached), true, later),
            ActorAction::Nothing,
            "version {cached}, from before the cleanup's last write, must not start an actor"
        );
        let snapshot = cache.snapshot(&tracker);
        assert!(snapshot[0].2, "{cached}: released at once: {snapshot:?}");
        assert!(tracker.in_progress("a", false, &cache.cache()));
    }
    round(&mut tracker, &shown(&[pending("b", "2")]));
    assert_eq!(tracker.get("a"), None, "gone from the cache: forgotten");
}

/// An actor restarted from a stale cached version would cordon again after the cleanup: the
/// end it left is the mark, and only a newer version (or its node back) starts another.
#[test]
fn an_ended_actor_restarts_only_from_a_newer_version() {
    let mut tracker = Tracker::default();
    let later = Instant::now();
    tracker.actor_ended(
        "a",
        RunEnd::Finished {
            version: Some("8".into()),
            node_gone: true,
        },
    );
    let table = [
        (Some("8"), false, ActorAction::Nothing),
        (Some("7"), true, ActorAction::Nothing),
        (Some("8"), true, ActorAction::Start),
        (Some("9"), false, ActorAction::Start),
    ];
    for (cached, node_exists, action) in table {
        assert_eq!(
            tracker.actor_action("a", None, cached, node_exists, later),
            action,
            "cached {cached:?}, node there: {node_exists}"
        );
    }
    tracker.actor_ended("b", RunEnd::RequestGone);
    assert_eq!(
        tracker.actor_action("b", None, Some("100"), true, later),
        ActorAction::Nothing
    );
}

#[test]
fn a_failed_actor_starts_again_after_its_backoff_and_is_forgotten_with_its_request() {
    let mut tracker = Tracker::default();
    let failed_at = Instant::now();
    let (failures, delay) = tracker.actor_failed("a", failed_at);
    assert_eq!((failures, delay), (1, actor_runs::RESTART_MIN));
    let before = failed_at + delay - Duration::from_millis(1);
    assert_eq!(
        tracker.actor_action("a", None, Some("5"), true, before),
        ActorAction::Nothing
    );
    assert_eq!(
        tracker.actor_action("a", None, Some("5"), true, failed_at + delay),
        ActorAction::Start
    );
    let (failures, delay) = tracker.actor_failed("a", failed_at + delay);
    assert_eq!((failures, delay), (2, actor_runs::RESTART_MIN * 2));
    // Still needs an actor: remembered.
    round(&mut tracker, &shown(&[admitted("a", "5")]));
    assert!(tracker.get("a").is_some_and(|t| t.restarts.is_some()));
    // Released (finalizer off, node gone): needs none, forgotten.
    round(
        &mut tracker,
        &shown(&[deleted(admitted("a", "5"), "9", false)]).without_node(),
    );
    assert_eq!(tracker.get("a"), None);
}

/// A request the cache shows released (our finalizer removed by someone else), or no longer
/// shows, holds its node while its actor undoes the cordon.
#[test]
fn an_actor_undoing_a_gone_request_holds_its_node() {
    let tracker = Tracker::default();
    let mut last = admitted("a", "5");
    last.metadata.annotations.get_or_insert_default().insert(
        maintenance_crds::INITIAL_UNSCHEDULABLE_ANNOTATION.into(),
        "false".into(),
    );
    for cache in [shown(&[]), shown(&[deleted(last.clone(), "9", false)])] {
        let mut snapshot = Snapshot::from_objects(
            cache.nodes.iter().map(|n| &**n),
            cache.requests.iter().map(|r| &**r),
        );
        tracker.hold_nodes_of_gone_requests(&mut snapshot, [("a", &last)], &cache.cache());
        assert_eq!(snapshot.requests.len(), 1);
        assert_eq!(snapshot.requests[0].node_name, NODE);
        assert!(!snapshot.requests[0].released, "the node is held");
    }
    // A request still in progress in the cache is the scheduler's as it is.
    let cache = shown(&[admitted("a", "6")]);
    let mut snapshot = Snapshot::from_objects(
        cache.nodes.iter().map(|n| &**n),
        cache.requests.iter().map(|r| &**r),
    );
    let before = snapshot.clone();
    tracker.hold_nodes_of_gone_requests(&mut snapshot, [("a", &last)], &cache.cache());
    assert_eq!(snapshot, before);
}

#[test]
fn node_writes_hold_their_node_until_the_cache_shows_them() {
    let mut tracker = Tracker::default();
    tracker.taints.sent([NODE.to_string()]);
    round(&mut tracker, &shown(&[]));
    assert!(tracker.taints.contains(NODE), "in flight");
    tracker
        .taints
        .answered(vec![(NODE.into(), Some("2".into()))]);
    round(&mut tracker, &shown(&[]));
    assert!(
        tracker.taints.contains(NODE),
        "the cache shows the node at 1, written at 2"
    );
    let mut caught_up = shown(&[]);
    caught_up.nodes = vec![Arc::new(node(NODE).version("2").build())];
    round(&mut tracker, &caught_up);
    assert!(!tracker.taints.contains(NODE));
    tracker.uncordons.sent([NODE.to_string()]);
    round(&mut tracker, &shown(&[]).without_node());
    assert!(
        !tracker.uncordons.contains(NODE),
        "a node gone needs no memory"
    );
}

#[test]
fn an_alarm_is_armed_again_only_for_an_earlier_time_or_once_it_passed() {
    let mut alarm = Alarm::default();
    let table = [
        // (due, now, arms)
        (10, 0, true),
        (12, 1, false),
        (8, 2, true),
        (9, 3, false),
        (9, 8, true),
    ];
    for (due, now, arms) in table {
        assert_eq!(alarm.arm(due, now), arms, "due {due} at {now}");
    }
    alarm.fired();
    assert!(alarm.arm(20, 9));
}

/// A request whose drain gave its slot back: its actor ended, the request is Pending again (no
/// finalizer, no admission). Once the cache shows that, nothing stale is left: it is admissible
/// again, and its next admission holds a slot (is not counted released), and starts an actor.
#[test]
fn a_request_that_yielded_is_admissible_again_without_stale_bookkeeping() {
    let mut tracker = Tracker::default();
    // Admitted and draining (the cache shows the admission at 4, the actor wrote 5..9).
    let draining = shown(&[admitted("a", "4")]);
    round(&mut tracker, &draining);
    // The yield: its actor ends at version 10, the status write that made it Pending.
    tracker.actor_ended(
        "a",
        RunEnd::Finished {
            version: Some("10".into()),
            node_gone: false,
        },
    );
    // The cache still shows an older version: the end is kept.
    round(&mut tracker, &draining);
    assert!(tracker.get("a").is_some_and(|t| t.ended.is_some()));
    // The cache shows the yield: Pending, and nothing is remembered of the old admission.
    let mut yielded = pending("a", "10");
    yielded.status = Some(Default::default());
    crate::conditions::set_phase(
        &mut yielded
            .status
            .get_or_insert_with(Default::default)
            .conditions,
        Phase::Pending,
        "gave its slot back",
        now(),
        None,
    );
    let after = shown(&[yielded.clone()]);
    round(&mut tracker, &after);
    assert_eq!(tracker.get("a"), None);
    assert_eq!(
        after.snapshot(&tracker),
        [("a".into(), Phase::Pending, false)]
    );
    assert!(!after.cache().needs_actor(&yielded, false));
    // Admitted again: it holds its slot while in flight and once answered, and gets an actor.
    assert!(tracker.begin_admission("a", Some("10")));
    assert_eq!(
        after.snapshot(&tracker),
        [("a".into(), Phase::Scheduled, false)]
    );
    tracker.admission_answered("a", AdmissionAnswer::Admitted, now());
    round(&mut tracker, &after);
    assert_eq!(
        after.snapshot(&tracker),
        [("a".into(), Phase::Scheduled, false)]
    );
    assert_eq!(
        tracker.actor_action("a", None, Some("11"), true, std::time::Instant::now()),
        ActorAction::Start
    );
}
