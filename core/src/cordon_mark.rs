//! Which request cordoned a node, written on the node itself with the cordon (one patch), and
//! removed with the uncordon (one patch). The mark is what lets a node cordoned by a request that
//! is gone be found and uncordoned: the request's own record (its annotations, the request actor's
//! memory) goes with the request, but the mark stays on the node.
//!
//! A request goes without our cleanup when the API server deletes it under our finalizer (a
//! DELETE that raced the admission), when someone removes our finalizer by hand, or when either
//! happens while the operator is down or its request actor has failed. A running request actor undoes
//! the cordon itself (`lifecycle::on_request_gone`); once no actor remembers the request, the
//! supervisor finds the node by its mark: a node marked by a request that no actor runs for and
//! that the cache does not show in progress ([`orphaned_cordons`]) is an orphaned cordon. It is
//! held (no request is admitted on it: the admission would record our cordon as the node's
//! initial state, and nothing would ever uncordon it) and, once it has been seen orphaned for
//! [`ORPHAN_GRACE`], uncordoned by a write guarded by the node's resourceVersion.
//!
//! A request that does not cordon its node (`cordon: false`, or a node someone else cordoned)
//! still keeps the autoscalers off it; that write marks the node the same way under other keys
//! ([`PROTECTED_BY_UID_ANNOTATION`], [`MarkKind::Protection`]), and its release, or the sweep,
//! removes the annotations and leaves `spec.unschedulable` alone.
//!
//! The grace covers watches that lag one another: the cache of requests may briefly miss a
//! request that the cache of nodes already shows a mark of (a leader that just took over). The
//! guard covers a cache of nodes that lags: a mark the cache still shows after our own uncordon
//! (or a later request's cordon) is at an older version, and the write conflicts.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use maintenance_crds::{NodeMaintenance, Phase};
use serde_json::{Value, json};

use crate::scheduler::RequestState;

/// `namespace/name` of the request that cordoned the node (for a person reading the node).
pub const CORDONED_BY_ANNOTATION: &str = "maintenance.nvidia.com/cordoned-by";
/// The UID of that request: a request re-created under the same name is another request.
pub const CORDONED_BY_UID_ANNOTATION: &str = "maintenance.nvidia.com/cordoned-by-uid";
/// `namespace/name` of the request that keeps the autoscalers off a node it did not cordon
/// (`cordon: false`, or a node that was unschedulable before): the mark without the cordon.
pub const PROTECTED_BY_ANNOTATION: &str = "maintenance.nvidia.com/protected-by";
/// The UID of that request.
pub const PROTECTED_BY_UID_ANNOTATION: &str = "maintenance.nvidia.com/protected-by-uid";

/// cluster-autoscaler does not scale a node down while it carries this annotation.
pub const SCALE_DOWN_DISABLED_ANNOTATION: &str =
    "cluster-autoscaler.kubernetes.io/scale-down-disabled";
/// Karpenter does not disrupt (consolidate, drift, expire) a node that carries this annotation.
pub const DO_NOT_DISRUPT_ANNOTATION: &str = "karpenter.sh/do-not-disrupt";
/// What keeps the autoscalers off a node in maintenance
/// (`spec.admission.protectFromAutoscalers`): each set to `"true"` with the cordon.
pub const AUTOSCALER_ANNOTATIONS: [&str; 2] =
    [SCALE_DOWN_DISABLED_ANNOTATION, DO_NOT_DISRUPT_ANNOTATION];
/// Which of [`AUTOSCALER_ANNOTATIONS`] the cordon added (comma-separated), so that the uncordon
/// removes those and leaves alone one that was there before us, as it leaves a cordon that was.
pub const AUTOSCALER_ANNOTATIONS_ADDED: &str =
    "maintenance.nvidia.com/autoscaler-annotations-added";

/// Whether a node annotation is part of the mark, or one the mark decides about (the operator's
/// cache of nodes keeps these and drops the others).
pub fn is_mark(key: &str) -> bool {
    key == CORDONED_BY_ANNOTATION
        || key == CORDONED_BY_UID_ANNOTATION
        || key == PROTECTED_BY_ANNOTATION
        || key == PROTECTED_BY_UID_ANNOTATION
        || key == AUTOSCALER_ANNOTATIONS_ADDED
        || AUTOSCALER_ANNOTATIONS.contains(&key)
}

/// The autoscaler annotations a cordon writes as ours on a node that carries `annotations` now:
/// with `protect`, each of [`AUTOSCALER_ANNOTATIONS`] the node does not carry yet (whatever its
/// value: someone else's setting is theirs to keep), and those it carries because our cordon
/// added them (a cordon written again after a lost answer lists them again).
pub fn autoscaler_annotations_to_add(
    annotations: Option<&BTreeMap<String, String>>,
    protect: bool,
) -> Vec<&'static str> {
    if !protect {
        return Vec::new();
    }
    let ours = autoscaler_annotations_added(annotations);
    AUTOSCALER_ANNOTATIONS
        .into_iter()
        .filter(|key| {
            annotations.is_none_or(|a| !a.contains_key(*key)) || ours.iter().any(|o| o == key)
        })
        .collect()
}

/// The autoscaler annotations our cordon added to a node with `annotations`, which its uncordon
/// removes.
pub fn autoscaler_annotations_added(annotations: Option<&BTreeMap<String, String>>) -> Vec<String> {
    annotations
        .and_then(|a| a.get(AUTOSCALER_ANNOTATIONS_ADDED))
        .map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|key| AUTOSCALER_ANNOTATIONS.contains(key))
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// How long a node must be seen orphaned before it is uncordoned.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(10);

/// `namespace/name` of `request`, as a mark names it.
fn request_key(request: &NodeMaintenance) -> String {
    format!(
        "{}/{}",
        request.metadata.namespace.as_deref().unwrap_or_default(),
        request.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The node patch of the cordon: unschedulable, marked as cordoned by `request`, and carrying
/// the autoscaler annotations `protect` lists ([`autoscaler_annotations_to_add`]), recorded as
/// ours in the same write.
pub fn cordon_patch(request: &NodeMaintenance, protect: &[&str]) -> Value {
    let mut annotations = json!({
        CORDONED_BY_ANNOTATION: request_key(request),
        CORDONED_BY_UID_ANNOTATION: request.metadata.uid.as_deref().unwrap_or_default(),
    });
    add_autoscaler_annotations(&mut annotations, protect);
    json!({
        "metadata": { "annotations": annotations },
        "spec": { "unschedulable": true },
    })
}

fn add_autoscaler_annotations(annotations: &mut Value, protect: &[&str]) {
    for annotation in protect {
        annotations[*annotation] = json!("true");
    }
    if !protect.is_empty() {
        annotations[AUTOSCALER_ANNOTATIONS_ADDED] = json!(protect.join(","));
    }
}

/// The node patch that keeps the autoscalers off a node the admission of `request` does not
/// cordon (`cordon: false`, or a node someone else cordoned), for a node that carries
/// `annotations` now: the autoscaler annotations, recorded as ours and marked with the request
/// ([`PROTECTED_BY_ANNOTATION`]) so that an orphan is found as a cordon is. `None`: nothing to
/// add (protection off, or the node carries both annotations of someone else's).
pub fn protect_patch(
    request: &NodeMaintenance,
    annotations: Option<&BTreeMap<String, String>>,
    protect: bool,
) -> Option<Value> {
    let add = autoscaler_annotations_to_add(annotations, protect);
    if add.is_empty() {
        return None;
    }
    let mut annotations = json!({
        PROTECTED_BY_ANNOTATION: request_key(request),
        PROTECTED_BY_UID_ANNOTATION: request.metadata.uid.as_deref().unwrap_or_default(),
    });
    add_autoscaler_annotations(&mut annotations, &add);
    Some(json!({ "metadata": { "annotations": annotations } }))
}

/// The node patch that gives the autoscalers `node` back at the release of the request with
/// `uid`, when the request did not cordon it: the annotations of [`protect_patch`], removed only
/// if the node still carries that request's mark, and guarded by the node's resourceVersion (a
/// later request's mark written meanwhile conflicts). `None`: nothing of this request's is left.
pub fn unprotect_patch(node: &Node, uid: &str) -> Option<Value> {
    cordon_mark(node)
        .filter(|mark| mark.kind == MarkKind::Protection && mark.uid == uid)
        .map(|mark| mark.release_patch())
}

/// The node patch of the uncordon: schedulable, the mark removed, and the autoscaler
/// annotations the cordon added (`added`, [`autoscaler_annotations_added`]) with it.
/// `resource_version` guards it (the orphan sweep writes on what its cache showed); `None` writes
/// unconditionally (the request actor uncordons what its request cordoned).
pub fn uncordon_patch(resource_version: Option<&str>, added: &[String]) -> Value {
    let mut patch = remove_marks(resource_version, added);
    patch["spec"] = json!({ "unschedulable": false });
    patch
}

/// The metadata part of a release: every mark annotation, and the autoscaler annotations the
/// mark's write added.
fn remove_marks(resource_version: Option<&str>, added: &[String]) -> Value {
    let mut annotations = json!({
        CORDONED_BY_ANNOTATION: null,
        CORDONED_BY_UID_ANNOTATION: null,
        PROTECTED_BY_ANNOTATION: null,
        PROTECTED_BY_UID_ANNOTATION: null,
        AUTOSCALER_ANNOTATIONS_ADDED: null,
    });
    for annotation in added {
        annotations[annotation.as_str()] = Value::Null;
    }
    let mut metadata = json!({ "annotations": annotations });
    if let Some(version) = resource_version {
        metadata["resourceVersion"] = json!(version);
    }
    json!({ "metadata": metadata })
}

/// What a mark records that its request did to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkKind {
    /// The request cordoned the node ([`CORDONED_BY_UID_ANNOTATION`]): its release uncordons.
    Cordon,
    /// The request only kept the autoscalers off ([`PROTECTED_BY_UID_ANNOTATION`]): its release
    /// leaves `spec.unschedulable` as it is.
    Protection,
}

/// A node's mark, as the cache shows the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CordonMark {
    pub node: String,
    /// The node's resourceVersion, which guards the uncordon.
    pub resource_version: Option<String>,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub kind: MarkKind,
    /// The autoscaler annotations the mark's write added, which the release removes.
    pub autoscaler_annotations: Vec<String>,
}

impl CordonMark {
    /// The request that cordoned the node, as the scheduler counts it while the node is held:
    /// in maintenance, holding a slot, under its own name (so that a waiting request's message
    /// says who holds the node).
    pub fn holder(&self) -> RequestState {
        RequestState {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            node_name: self.node.clone(),
            requestor_id: String::new(),
            phase: Phase::Scheduled,
            created: None,
            deleting: true,
            released: false,
            admission_retry: None,
            yielded: None,
            node_group: None,
        }
    }

    /// The node patch that undoes what the mark's request did, guarded by the resourceVersion
    /// the mark was read at: the uncordon of a cordon, the autoscaler annotations of a
    /// protection.
    pub fn release_patch(&self) -> Value {
        let version = self.resource_version.as_deref();
        match self.kind {
            MarkKind::Cordon => uncordon_patch(version, &self.autoscaler_annotations),
            MarkKind::Protection => remove_marks(version, &self.autoscaler_annotations),
        }
    }
}

/// The mark on `node`, if any (one without a UID is not ours to act on). A cordon's mark comes
/// first: a request that cordoned the node also owes what a protection mark would.
pub fn cordon_mark(node: &Node) -> Option<CordonMark> {
    let annotations = node.metadata.annotations.as_ref()?;
    let (kind, uid, by) = [
        (
            MarkKind::Cordon,
            CORDONED_BY_UID_ANNOTATION,
            CORDONED_BY_ANNOTATION,
        ),
        (
            MarkKind::Protection,
            PROTECTED_BY_UID_ANNOTATION,
            PROTECTED_BY_ANNOTATION,
        ),
    ]
    .into_iter()
    .find_map(|(kind, uid, by)| {
        let uid = annotations.get(uid).filter(|uid| !uid.is_empty())?;
        Some((kind, uid, by))
    })?;
    let by = annotations.get(by).map(String::as_str).unwrap_or_default();
    let (namespace, name) = by.split_once('/').unwrap_or(("", by));
    Some(CordonMark {
        node: node.metadata.name.clone()?,
        resource_version: node.metadata.resource_version.clone(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: uid.clone(),
        kind,
        autoscaler_annotations: autoscaler_annotations_added(Some(annotations)),
    })
}

/// The marks on `nodes`: one walk over the cache of nodes serves a round's orphans and gauge.
pub fn marks<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Vec<CordonMark> {
    nodes.into_iter().filter_map(cordon_mark).collect()
}

/// How many of the nodes with `marks` carry autoscaler annotations we added (with a cordon or
/// without): the nodes kept from cluster-autoscaler and Karpenter now (the
/// `nodes_protected_from_autoscalers` gauge). Our write adds them with the mark, always.
pub fn protected_from_autoscalers(marks: &[CordonMark]) -> usize {
    marks
        .iter()
        .filter(|mark| !mark.autoscaler_annotations.is_empty())
        .count()
}

/// The marks of requests that nothing of ours holds any more: `in_progress` says whether a UID
/// has a request actor running (or one that ended: it removed the mark, and a cache that shows it is
/// behind), an admission on its way, or a request the cache shows that needs an actor
/// (`lifecycle::needs_actor`).
pub fn orphaned_cordons(
    marks: &[CordonMark],
    in_progress: impl Fn(&str) -> bool,
) -> Vec<CordonMark> {
    marks
        .iter()
        .filter(|mark| !in_progress(&mark.uid))
        .cloned()
        .collect()
}

/// Holds the nodes of orphaned cordons in the scheduler's view: a request the snapshot shows past
/// Pending on the node is not released, and one it lacks is added as the holder.
pub fn hold_nodes(snapshot: &mut crate::scheduler::Snapshot, marks: &[CordonMark]) {
    for mark in marks {
        match snapshot.requests.iter_mut().find(|r| {
            (r.namespace.as_str(), r.name.as_str()) == (mark.namespace.as_str(), mark.name.as_str())
                && r.node_name == mark.node
                && r.phase != Phase::Pending
        }) {
            Some(request) => request.released = false,
            None => snapshot.requests.push(mark.holder()),
        }
    }
}

/// When each orphaned mark was first seen, across rounds (a grace timer, not state: a restart
/// only starts it again).
#[derive(Debug, Default)]
pub struct OrphanSightings {
    first_seen: HashMap<String, (String, Instant)>,
}

/// What a round does with the orphaned marks it found ([`OrphanSightings::observe`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OrphanRound {
    /// Every orphaned mark: its node is held this round.
    pub held: Vec<CordonMark>,
    /// Those seen orphaned for [`ORPHAN_GRACE`]: uncordon them now.
    pub due: Vec<CordonMark>,
    /// The earliest time one that is not due yet will be.
    pub next_due: Option<Instant>,
}

impl OrphanSightings {
    /// Records this round's orphaned marks at `now` and forgets the others (a mark removed, or
    /// its request back in progress, starts the grace anew if it is orphaned again; a mark of
    /// another request on the node too).
    pub fn observe(&mut self, orphans: Vec<CordonMark>, now: Instant) -> OrphanRound {
        let mut seen = HashMap::with_capacity(orphans.len());
        let mut round = OrphanRound::default();
        for mark in orphans {
            let since = match self.first_seen.get(&mark.node) {
                Some((uid, since)) if *uid == mark.uid => *since,
                _ => now,
            };
            let due_at = since + ORPHAN_GRACE;
            if due_at <= now {
                round.due.push(mark.clone());
            } else {
                round.next_due = Some(round.next_due.map_or(due_at, |t| t.min(due_at)));
            }
            seen.insert(mark.node.clone(), (mark.uid.clone(), since));
            round.held.push(mark);
        }
        self.first_seen = seen;
        round
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use std::collections::BTreeMap;

    #[test]
    fn nodes_count_as_protected_while_they_carry_annotations_our_cordon_added() {
        let plain = fixtures::node("a").build();
        let cordoned = patched(
            &fixtures::node("b").build(),
            &cordon_patch(&request(), &AUTOSCALER_ANNOTATIONS),
        );
        // Someone else's annotation, not ours: not counted.
        let theirs = fixtures::node("c")
            .annotation(SCALE_DOWN_DISABLED_ANNOTATION, "true")
            .build();
        let unprotected = patched(&fixtures::node("d").build(), &cordon_patch(&request(), &[]));
        assert_eq!(
            protected_from_autoscalers(&marks([&plain, &cordoned, &theirs, &unprotected])),
            1
        );
        let released = patched(
            &cordoned,
            &uncordon_patch(
                None,
                &autoscaler_annotations_added(cordoned.metadata.annotations.as_ref()),
            ),
        );
        assert_eq!(protected_from_autoscalers(&marks([&released])), 0);
    }

    fn request() -> NodeMaintenance {
        fixtures::request("m")
            .namespace("team")
            .node("n1")
            .requestor("example.com")
            .uid("uid-m")
            .build()
    }

    /// The node as the API server leaves it after applying `patch` (a merge patch: `null`
    /// removes a key).
    fn patched(node: &Node, patch: &Value) -> Node {
        let mut value = serde_json::to_value(node).unwrap_or_default();
        merge(&mut value, patch);
        serde_json::from_value(value).unwrap_or_default()
    }

    fn merge(target: &mut Value, patch: &Value) {
        match (target, patch) {
            (Value::Object(target), Value::Object(patch)) => {
                for (key, value) in patch {
                    if value.is_null() {
                        target.remove(key);
                    } else {
                        merge(target.entry(key.clone()).or_insert(Value::Null), value);
                    }
                }
            }
            (target, patch) => *target = patch.clone(),
        }
    }

    /// A node with an annotation of someone else's, which the mark must leave alone.
    fn node(name: &str, version: &str) -> Node {
        fixtures::node(name)
            .version(version)
            .annotation("other", "kept")
            .build()
    }

    #[test]
    fn the_cordon_marks_the_node_and_the_uncordon_removes_only_the_mark() {
        let cordoned = patched(&node("n1", "7"), &cordon_patch(&request(), &[]));
        assert_eq!(
            cordoned.spec.as_ref().and_then(|s| s.unschedulable),
            Some(true)
        );
        let mark = cordon_mark(&cordoned).expect("the cordon leaves a mark");
        assert_eq!(
            (
                mark.namespace.as_str(),
                mark.name.as_str(),
                mark.uid.as_str()
            ),
            ("team", "m", "uid-m")
        );

        let uncordoned = patched(
            &cordoned,
            &uncordon_patch(None, &mark.autoscaler_annotations),
        );
        assert_eq!(cordon_mark(&uncordoned), None);
        assert_eq!(
            uncordoned.spec.as_ref().and_then(|s| s.unschedulable),
            Some(false)
        );
        assert_eq!(
            uncordoned.metadata.annotations,
            Some(BTreeMap::from([("other".into(), "kept".into())]))
        );
    }

    fn annotations(node: &Node) -> BTreeMap<String, String> {
        node.metadata.annotations.clone().unwrap_or_default()
    }

    #[test]
    fn the_cordon_keeps_the_autoscalers_off_and_the_uncordon_gives_the_node_back() {
        let before = node("n1", "7");
        let add = autoscaler_annotations_to_add(before.metadata.annotations.as_ref(), true);
        assert_eq!(add, AUTOSCALER_ANNOTATIONS.to_vec());
        let cordoned = patched(&before, &cordon_patch(&request(), &add));
        let on_node = annotations(&cordoned);
        for key in AUTOSCALER_ANNOTATIONS {
            assert_eq!(on_node.get(key).map(String::as_str), Some("true"), "{key}");
        }
        let mark = cordon_mark(&cordoned).expect("a mark");
        assert_eq!(mark.autoscaler_annotations, AUTOSCALER_ANNOTATIONS.to_vec());

        // The request actor's uncordon and the orphan sweep's remove the same.
        for version in [None, Some("8")] {
            let uncordoned = patched(
                &cordoned,
                &uncordon_patch(version, &mark.autoscaler_annotations),
            );
            assert_eq!(annotations(&uncordoned), annotations(&before));
        }
    }

    #[test]
    fn an_autoscaler_annotation_that_was_there_before_is_left_alone() {
        // Someone keeps Karpenter off this node on purpose (even with another value).
        let before = fixtures::node("n1")
            .version("7")
            .annotation(DO_NOT_DISRUPT_ANNOTATION, "false")
            .build();
        let add = autoscaler_annotations_to_add(before.metadata.annotations.as_ref(), true);
        assert_eq!(add, vec![SCALE_DOWN_DISABLED_ANNOTATION]);
        let cordoned = patched(&before, &cordon_patch(&request(), &add));
        assert_eq!(
            annotations(&cordoned)
                .get(DO_NOT_DISRUPT_ANNOTATION)
                .map(String::as_str),
            Some("false"),
            "their value is theirs"
        );
        let added = autoscaler_annotations_added(cordoned.metadata.annotations.as_ref());
        assert_eq!(added, vec![SCALE_DOWN_DISABLED_ANNOTATION.to_string()]);
        let uncordoned = patched(&cordoned, &uncordon_patch(None, &added));
        assert_eq!(annotations(&uncordoned), annotations(&before));
    }

    #[test]
    fn a_cordon_written_again_keeps_its_autoscaler_annotations_ours() {
        // The first cordon went through but its answer was lost; the retry reads the node.
        let before = fixtures::node("n1")
            .version("7")
            .annotation(DO_NOT_DISRUPT_ANNOTATION, "true")
            .build();
        let first = autoscaler_annotations_to_add(before.metadata.annotations.as_ref(), true);
        let cordoned = patched(&before, &cordon_patch(&request(), &first));
        let again = autoscaler_annotations_to_add(cordoned.metadata.annotations.as_ref(), true);
        assert_eq!(again, first);
        let twice = patched(&cordoned, &cordon_patch(&request(), &again));
        let added = autoscaler_annotations_added(twice.metadata.annotations.as_ref());
        assert_eq!(added, vec![SCALE_DOWN_DISABLED_ANNOTATION.to_string()]);
        let uncordoned = patched(&twice, &uncordon_patch(None, &added));
        assert_eq!(annotations(&uncordoned), annotations(&before));
    }

    #[test]
    fn without_protection_the_cordon_adds_no_autoscaler_annotation() {
        let before = node("n1", "7");
        let add = autoscaler_annotations_to_add(before.metadata.annotations.as_ref(), false);
        assert!(add.is_empty());
        let cordoned = patched(&before, &cordon_patch(&request(), &add));
        let on_node = annotations(&cordoned);
        assert!(
            AUTOSCALER_ANNOTATIONS
                .iter()
                .all(|key| !on_node.contains_key(*key))
        );
        assert!(!on_node.contains_key(AUTOSCALER_ANNOTATIONS_ADDED));
        assert!(autoscaler_annotations_added(Some(&on_node)).is_empty());
    }

    #[test]
    fn a_node_we_do_not_cordon_is_protected_and_given_back_as_it_was() {
        // Someone keeps Karpenter off this node, and it may be cordoned by someone else.
        let before = fixtures::node("n1")
            .version("7")
            .unschedulable(Some(true))
            .annotation(DO_NOT_DISRUPT_ANNOTATION, "true")
            .build();
        let patch =
            protect_patch(&request(), before.metadata.annotations.as_ref(), true).expect("a patch");
        assert!(patch.get("spec").is_none(), "never touches the cordon");
        let protected = patched(&before, &patch);
        let mark = cordon_mark(&protected).expect("a mark");
        assert_eq!(mark.kind, MarkKind::Protection);
        assert_eq!((mark.name.as_str(), mark.uid.as_str()), ("m", "uid-m"));
        assert_eq!(
            mark.autoscaler_annotations,
            [SCALE_DOWN_DISABLED_ANNOTATION]
        );
        assert_eq!(protected_from_autoscalers(&marks([&protected])), 1);
        // Written again after a lost answer: the same.
        let again = protect_patch(&request(), protected.metadata.annotations.as_ref(), true);
        assert_eq!(again.as_ref(), Some(&patch));

        // Another request's release leaves it; ours, and the orphan sweep's, give it back.
        assert_eq!(unprotect_patch(&protected, "uid-other"), None);
        let release = unprotect_patch(&protected, "uid-m").expect("ours to remove");
        assert_eq!(release["metadata"]["resourceVersion"], json!("7"));
        assert!(release.get("spec").is_none(), "never uncordons");
        for patch in [release, mark.release_patch()] {
            let released = patched(&protected, &patch);
            assert_eq!(annotations(&released), annotations(&before));
            assert_eq!(released.spec, before.spec);
        }
        // Nothing to add: no write, no mark.
        assert_eq!(
            protect_patch(&request(), protected.metadata.annotations.as_ref(), false),
            None
        );
        let both_theirs = fixtures::node("n2")
            .annotation(DO_NOT_DISRUPT_ANNOTATION, "true")
            .annotation(SCALE_DOWN_DISABLED_ANNOTATION, "true")
            .build();
        assert_eq!(
            protect_patch(&request(), both_theirs.metadata.annotations.as_ref(), true),
            None
        );
    }

    #[test]
    fn a_cordon_over_a_protection_is_the_mark_and_its_uncordon_removes_both() {
        let protected = patched(
            &node("n1", "7"),
            &protect_patch(&request(), None, true).expect("a patch"),
        );
        let mut next = request();
        next.metadata.uid = Some("uid-next".into());
        let add = autoscaler_annotations_to_add(protected.metadata.annotations.as_ref(), true);
        let cordoned = patched(&protected, &cordon_patch(&next, &add));
        let mark = cordon_mark(&cordoned).expect("a mark");
        assert_eq!(
            (mark.kind, mark.uid.as_str()),
            (MarkKind::Cordon, "uid-next")
        );
        assert_eq!(
            unprotect_patch(&cordoned, "uid-m"),
            None,
            "no longer the first's"
        );
        let uncordoned = patched(&cordoned, &mark.release_patch());
        assert!(annotations(&uncordoned).keys().all(|key| !is_mark(key)));
    }

    #[test]
    fn only_known_autoscaler_annotations_are_removed() {
        // A hand-edited list never makes the uncordon remove something else.
        let annotations = BTreeMap::from([(
            AUTOSCALER_ANNOTATIONS_ADDED.to_string(),
            format!("{DO_NOT_DISRUPT_ANNOTATION}, other, ").to_string(),
        )]);
        assert_eq!(
            autoscaler_annotations_added(Some(&annotations)),
            vec![DO_NOT_DISRUPT_ANNOTATION.to_string()]
        );
    }

    #[test]
    fn the_sweep_writes_on_the_version_it_read() {
        let patch = uncordon_patch(Some("42"), &[]);
        assert_eq!(patch["metadata"]["resourceVersion"], json!("42"));
        assert!(
            uncordon_patch(None, &[])["metadata"]
                .get("resourceVersion")
                .is_none()
        );
    }

    #[test]
    fn only_marks_of_requests_nothing_holds_are_orphaned() {
        let marked = patched(&node("n1", "7"), &cordon_patch(&request(), &[]));
        let unmarked = node("n2", "8");
        let nodes = [marked, unmarked];
        let marks = marks(&nodes);
        assert!(orphaned_cordons(&marks, |uid| uid == "uid-m").is_empty());
        let orphans = orphaned_cordons(&marks, |_| false);
        assert_eq!(orphans.len(), 1);
        assert_eq!(orphans[0].node, "n1");
        assert_eq!(orphans[0].resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn a_mark_without_a_uid_is_not_ours_to_act_on() {
        let mut n = node("n1", "7");
        n.metadata.annotations = Some(BTreeMap::from([(
            CORDONED_BY_ANNOTATION.to_string(),
            "team/m".to_string(),
        )]));
        assert_eq!(cordon_mark(&n), None);
    }

    fn mark(node: &str, uid: &str) -> CordonMark {
        CordonMark {
            node: node.into(),
            resource_version: Some("7".into()),
            namespace: "team".into(),
            name: "m".into(),
            uid: uid.into(),
            kind: MarkKind::Cordon,
            autoscaler_annotations: Vec::new(),
        }
    }

    #[test]
    fn an_orphan_is_held_at_once_and_uncordoned_only_after_the_grace() {
        let start = Instant::now();
        let mut sightings = OrphanSightings::default();
        let first = sightings.observe(vec![mark("n1", "a")], start);
        assert_eq!(first.held, vec![mark("n1", "a")]);
        assert!(first.due.is_empty());
        assert_eq!(first.next_due, Some(start + ORPHAN_GRACE));

        let before = sightings.observe(vec![mark("n1", "a")], start + ORPHAN_GRACE / 2);
        assert!(before.due.is_empty());
        assert_eq!(before.next_due, Some(start + ORPHAN_GRACE));

        let after = sightings.observe(vec![mark("n1", "a")], start + ORPHAN_GRACE);
        assert_eq!(after.due, vec![mark("n1", "a")]);
        assert_eq!(after.next_due, None);
    }

    #[test]
    fn the_grace_starts_again_for_a_mark_that_was_not_orphaned_meanwhile() {
        let start = Instant::now();
        let mut sightings = OrphanSightings::default();
        sightings.observe(vec![mark("n1", "a")], start);
        // Seen in progress again (the request cache caught up): forgotten.
        sightings.observe(Vec::new(), start + ORPHAN_GRACE / 2);
        let later = sightings.observe(vec![mark("n1", "a")], start + ORPHAN_GRACE);
        assert!(later.due.is_empty());
        // Another request's mark on the same node is a new orphan too.
        let other = sightings.observe(vec![mark("n1", "b")], start + 2 * ORPHAN_GRACE);
        assert!(other.due.is_empty());
    }

    #[test]
    fn the_holder_holds_its_node_and_a_slot() {
        let holder = mark("n1", "a").holder();
        assert_eq!(holder.node_name, "n1");
        assert_eq!(
            (holder.namespace.as_str(), holder.name.as_str()),
            ("team", "m")
        );
        assert!(holder.phase != Phase::Pending && !holder.released);
    }
}
