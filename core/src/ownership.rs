//! Which owner references a NodeMaintenance should carry: its Node owns it from the first
//! reconcile, so deleting the Node garbage-collects the request even while it is still Pending
//! (NVIDIA sets it at the top of every reconcile: `Reconcile` in
//! internal/controller/nodemaintenance_controller.go).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// How long a request may wait for admission before its Node is written as its owner in a write
/// of its own. The admission writes the owner with the finalizer anyway, so a request admitted
/// sooner (most of them, in a rolling maintenance) never pays that write; one that waits longer
/// gets it at the next round (a tick at the latest). Until then a Pending request whose node is
/// deleted is collected by our garbage collection (`missing_node_grace`) instead of the
/// cluster's.
pub const PENDING_OWNER_DELAY: Duration = Duration::from_secs(30);

/// Whether a Pending request created at `created` gets its owner references written now, when the
/// round leaves it waiting (see [`PENDING_OWNER_DELAY`]). A request with no creation time (never
/// from the API server) or a clock that went back is not held back.
pub fn pending_owner_due(created: Option<jiff::Timestamp>, now: jiff::Timestamp) -> bool {
    created.is_none_or(|created| {
        jiff::SignedDuration::try_from(PENDING_OWNER_DELAY)
            .is_ok_and(|delay| now.duration_since(created) >= delay)
    })
}

/// The Node a request names, as far as ownership needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeIdentity<'a> {
    pub name: &'a str,
    pub uid: &'a str,
}

impl<'a> NodeIdentity<'a> {
    /// The node as ownership needs it; `None` while it has no name or UID (not yet created).
    pub fn of(node: &'a k8s_openapi::api::core::v1::Node) -> Option<NodeIdentity<'a>> {
        Some(NodeIdentity {
            name: node.metadata.name.as_deref()?,
            uid: node.metadata.uid.as_deref()?,
        })
    }
}

/// The owner references the request should have given its node, or `None` when `current`
/// already is right (or the node is unknown), so the caller writes nothing.
pub fn owner_references(
    current: &[OwnerReference],
    node: Option<NodeIdentity<'_>>,
) -> Option<Vec<OwnerReference>> {
    let node = node?;
    if current.iter().any(|o| o.uid == node.uid) {
        return None;
    }
    // An owner, not a controller: the node does not manage the request, and deleting the node
    // must not wait for the request's cleanup.
    let wanted = OwnerReference {
        api_version: "v1".to_string(),
        kind: "Node".to_string(),
        name: node.name.to_string(),
        uid: node.uid.to_string(),
        controller: None,
        block_owner_deletion: None,
    };
    let mut owners = current.to_vec();
    // A reference to an earlier Node of the same name (deleted and created again) is replaced
    // in place, as NVIDIA's controllerutil.SetOwnerReference does: the request names the node,
    // so it belongs to the node that exists now.
    match owners
        .iter_mut()
        .find(|o| o.kind == "Node" && o.api_version == "v1" && o.name == node.name)
    {
        Some(earlier) => *earlier = wanted,
        None => owners.push(wanted),
    }
    Some(owners)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: NodeIdentity<'static> = NodeIdentity {
        name: "node-a",
        uid: "uid-a",
    };

    fn node_ref(name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "v1".to_string(),
            kind: "Node".to_string(),
            name: name.to_string(),
            uid: uid.to_string(),
            controller: None,
            block_owner_deletion: None,
        }
    }

    fn other_owner() -> OwnerReference {
        OwnerReference {
            api_version: "apps/v1".to_string(),
            kind: "Deployment".to_string(),
            name: "upgrader".to_string(),
            uid: "uid-deploy".to_string(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn a_waiting_request_gets_its_owner_written_only_after_the_delay() {
        let created = jiff::Timestamp::from_second(1_000).expect("valid");
        let at = |seconds: i64| jiff::Timestamp::from_second(1_000 + seconds).expect("valid");
        let delay = i64::try_from(PENDING_OWNER_DELAY.as_secs()).expect("small");
        assert!(!pending_owner_due(Some(created), at(0)));
        assert!(!pending_owner_due(Some(created), at(delay - 1)));
        assert!(pending_owner_due(Some(created), at(delay)));
        // A clock behind the creation time waits rather than writes.
        assert!(!pending_owner_due(Some(created), at(-5)));
        assert!(pending_owner_due(None, at(0)));
    }

    #[test]
    fn a_request_without_owners_gets_its_node_as_a_plain_owner() {
        let owners = owner_references(&[], Some(NODE)).expect("a write is needed");
        assert_eq!(owners, [node_ref("node-a", "uid-a")]);
        // An owner, not a controller: the node does not manage the request, and deleting the
        // node must not wait for the request.
        assert_eq!(owners[0].controller, None);
        assert_eq!(owners[0].block_owner_deletion, None);
    }

    #[test]
    fn other_owners_are_kept_and_the_node_is_added() {
        let owners = owner_references(&[other_owner()], Some(NODE)).expect("a write is needed");
        assert_eq!(owners, [other_owner(), node_ref("node-a", "uid-a")]);
    }

    #[test]
    fn nothing_to_write_when_the_node_already_owns_it() {
        let current = [other_owner(), node_ref("node-a", "uid-a")];
        assert_eq!(owner_references(&current, Some(NODE)), None);
    }

    #[test]
    fn nothing_to_write_when_the_node_is_unknown() {
        assert_eq!(owner_references(&[], None), None);
        assert_eq!(owner_references(&[other_owner()], None), None);
    }

    #[test]
    fn a_reference_to_an_earlier_node_of_the_same_name_is_replaced() {
        // The Node was deleted and created again under the same name: like NVIDIA's
        // controllerutil.SetOwnerReference, the reference follows the node that exists now.
        let current = [node_ref("node-a", "old-uid"), other_owner()];
        let owners = owner_references(&current, Some(NODE)).expect("a write is needed");
        assert_eq!(owners, [node_ref("node-a", "uid-a"), other_owner()]);
    }

    #[test]
    fn references_to_other_nodes_are_left_alone() {
        let current = [node_ref("node-b", "uid-b")];
        let owners = owner_references(&current, Some(NODE)).expect("a write is needed");
        assert_eq!(
            owners,
            [node_ref("node-b", "uid-b"), node_ref("node-a", "uid-a")]
        );
    }
}
