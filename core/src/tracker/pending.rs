//! Which Pending requests need a write of the supervisor this round: the first Pending condition
//! of a new request (with the round's reason), and the Node as owner of one that has waited
//! [`ownership::PENDING_OWNER_DELAY`].

use std::collections::HashMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use maintenance_crds::{NodeMaintenance, Phase};

use super::{Cache, Tracker};
use crate::lifecycle;
use crate::ownership::{self, NodeIdentity};
use crate::scheduler::WaitCause;

/// The reason a waiting request shows before the scheduler has given one.
pub const DEFAULT_PENDING_REASON: &str = "waiting for admission";

/// One Pending request's write.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingWrite {
    pub uid: String,
    pub request: Arc<NodeMaintenance>,
    /// Never marked Pending: its first Pending condition, with `reason`.
    pub first_mark: bool,
    /// The owner references to write (the Node added), when they change.
    pub owners: Option<Vec<OwnerReference>>,
    pub reason: String,
    /// The cause of `reason` when this write is the request's first explanation: the caller's
    /// memory of explanations records it as given.
    pub explains: Option<WaitCause>,
}

/// The writes Pending `requests` need now, given why each waits (`reasons`, by namespace and
/// name). None for a request being deleted or past Pending, nor for one whose admission is in
/// flight or that has a write in flight: either would make the other's guarded write conflict.
/// Requests admitted but still shown Pending by the cache are the admission's.
pub fn pending_writes(
    requests: &[Arc<NodeMaintenance>],
    cache: &Cache<'_>,
    tracker: &Tracker,
    reasons: &HashMap<(String, String), (String, WaitCause)>,
    now: Timestamp,
) -> Vec<PendingWrite> {
    requests
        .iter()
        .filter_map(|request| {
            let uid = request.metadata.uid.clone()?;
            if request.metadata.deletion_timestamp.is_some()
                || request.phase() != Phase::Pending
                || tracker.is_being_admitted(&uid)
                || tracker.has_write(&uid)
            {
                return None;
            }
            let first_mark = lifecycle::never_marked_pending(request);
            let created = request.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let owners = if ownership::pending_owner_due(created, now) {
                let node = cache.node(&request.spec.node_name);
                ownership::owner_references(
                    request
                        .metadata
                        .owner_references
                        .as_deref()
                        .unwrap_or_default(),
                    node.and_then(|n| NodeIdentity::of(n)),
                )
            } else {
                None
            };
            if !first_mark && owners.is_none() {
                return None;
            }
            let key = (
                request.metadata.namespace.clone().unwrap_or_default(),
                request.metadata.name.clone().unwrap_or_default(),
            );
            let (reason, cause) = match reasons.get(&key) {
                Some((reason, cause)) => (reason.clone(), Some(*cause)),
                None => (DEFAULT_PENDING_REASON.to_string(), None),
            };
            Some(PendingWrite {
                uid,
                request: Arc::clone(request),
                first_mark,
                owners,
                reason,
                explains: cause.filter(|_| first_mark),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{at, node, request};
    use crate::scheduler::WaitCause;

    const OWNER_DUE: i64 = ownership::PENDING_OWNER_DELAY.as_secs() as i64;

    fn reasons(
        entries: &[(&str, &str, WaitCause)],
    ) -> HashMap<(String, String), (String, WaitCause)> {
        entries
            .iter()
            .map(|(name, reason, cause)| {
                (
                    ("team".to_string(), name.to_string()),
                    (reason.to_string(), *cause),
                )
            })
            .collect()
    }

    fn pending(name: &str, created: i64) -> NodeMaintenance {
        request(name)
            .namespace("team")
            .node("n1")
            .uid(name)
            .version("1")
            .created(at(created))
            .build()
    }

    /// Created at 0 and marked Pending at 1.
    fn marked_pending(name: &str) -> NodeMaintenance {
        request(name)
            .namespace("team")
            .node("n1")
            .uid(name)
            .created(at(0))
            .phase(Phase::Pending, at(1))
            .build()
    }

    fn writes_for(
        requests: Vec<NodeMaintenance>,
        tracker: &Tracker,
        reasons: &HashMap<(String, String), (String, WaitCause)>,
        now: i64,
    ) -> Vec<PendingWrite> {
        let requests: Vec<Arc<NodeMaintenance>> = requests.into_iter().map(Arc::new).collect();
        let nodes = vec![Arc::new(node("n1").uid("node-uid").build())];
        let cache = Cache::new(&requests, &nodes);
        pending_writes(&requests, &cache, tracker, reasons, at(now))
    }

    #[test]
    fn a_new_request_is_marked_pending_with_the_rounds_reason_once() {
        let why = reasons(&[("a", "2 of 2 slots in use", WaitCause::MaxParallelOperations)]);
        let writes = writes_for(vec![pending("a", 0)], &Tracker::default(), &why, 1);
        assert_eq!(writes.len(), 1);
        let write = &writes[0];
        assert!(write.first_mark);
        assert_eq!(write.reason, "2 of 2 slots in use");
        assert_eq!(write.explains, Some(WaitCause::MaxParallelOperations));
        assert_eq!(write.owners, None, "the node becomes owner only later");

        // Marked Pending already: nothing to write until the owner is due.
        let marked = marked_pending("a");
        let writes = writes_for(vec![marked], &Tracker::default(), &why, 2);
        assert_eq!(writes, Vec::new());
    }

    #[test]
    fn without_a_reason_a_new_request_waits_for_admission_and_explains_nothing() {
        let writes = writes_for(vec![pending("a", 0)], &Tracker::default(), &reasons(&[]), 1);
        assert_eq!(writes[0].reason, DEFAULT_PENDING_REASON);
        assert_eq!(writes[0].explains, None);
    }

    #[test]
    fn the_node_becomes_owner_once_the_request_has_waited() {
        let marked = marked_pending("a");
        let writes = writes_for(vec![marked], &Tracker::default(), &reasons(&[]), OWNER_DUE);
        assert_eq!(writes.len(), 1);
        assert!(!writes[0].first_mark);
        assert_eq!(writes[0].explains, None, "only a first mark explains");
        let owners = writes[0].owners.as_deref().unwrap_or_default();
        assert_eq!(owners.len(), 1);
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].uid.as_str()),
            ("Node", "node-uid")
        );
    }

    #[test]
    fn nothing_for_requests_deleted_past_pending_or_with_writes_in_flight() {
        let mut deleting = pending("deleting", 0);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(1)));
        let ready = request("ready")
            .namespace("team")
            .node("n1")
            .uid("ready")
            .phase(Phase::Ready, at(1))
            .build();
        let mut tracker = Tracker::default();
        tracker.writes_sent(["written".to_string()]);
        assert!(tracker.begin_admission("admitting", Some("1")));
        let requests = vec![
            deleting,
            ready,
            pending("written", 0),
            pending("admitting", 0),
        ];
        assert_eq!(writes_for(requests, &tracker, &reasons(&[]), 1), Vec::new());
    }
}
