//! The admission as the supervisor makes it: the annotations it writes with our finalizer (the
//! node's initial state among them), the transitions it reports, what a failed admission write
//! leaves known, and whether a request needs a node actor.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use maintenance_crds::{
    ADMITTED_TIME_ANNOTATION, ADMITTED_UID_ANNOTATION, CORDON_REQUESTED_ANNOTATION, FINALIZER,
    INITIAL_UNSCHEDULABLE_ANNOTATION, NodeMaintenance, Phase, condition_type,
};

use super::{NodeView, Transition, enter_phase};
use crate::conditions;

/// Whether the supervisor runs an actor for this request: while it is in progress on an existing
/// node, or while our finalizer waits for cleanup. A request whose node is gone and whose
/// finalizer is off needs nothing (and must not be restarted forever).
pub fn needs_actor(request: &NodeMaintenance, node_exists: bool, admitted: bool) -> bool {
    let in_progress = request.phase() != Phase::Pending || admitted;
    has_finalizer(request) || (in_progress && !request.is_deleting() && node_exists)
}

/// The node's recorded initial state: `Some(true)` if it was unschedulable before us.
pub fn initial_state(request: &NodeMaintenance) -> Option<bool> {
    request
        .metadata
        .annotations
        .as_ref()?
        .get(INITIAL_UNSCHEDULABLE_ANNOTATION)
        .map(|v| v == "true")
}

/// Whether our finalizer is on the request (the scheduler's `released` reads it too).
pub fn has_finalizer(request: &NodeMaintenance) -> bool {
    request
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

/// True when the actor must read the Node from the API server rather than the shared cache:
/// the initial state is recorded once and decides the uncordon, so a cache that lags behind a
/// previous request's uncordon must not decide it.
pub fn needs_fresh_node(request: &NodeMaintenance) -> bool {
    !request.is_deleting() && request.phase() != Phase::Pending && initial_state(request).is_none()
}

/// The node's state for the admission's initial-state record, from the shared cache when that is
/// safe; `None` when it must be read from the API server.
///
/// A cache that shows the node schedulable is used as it is. One that shows it cordoned, or not
/// at all, may lag behind the uncordon of a request on this node released a moment ago: recorded
/// as the initial state, that cordon would never be undone, so it is read again. A cache that
/// lags the other way (it misses a cordon someone made a moment ago) has that cordon undone at
/// the end, the same outcome as a cordon landing just after a fresh read, which no read prevents.
pub fn admission_node_view(cached: Option<&Node>) -> Option<NodeView> {
    match NodeView::of(cached) {
        schedulable @ NodeView::Present {
            unschedulable: false,
        } if cached.is_some() => Some(schedulable),
        _ => None,
    }
}

/// The annotations the admission writes with our finalizer, in one metadata write: the admission
/// time (from which our phase clocks count, see [`conditions::phase_since`]), whether the cordon
/// was asked for (see `owes_uncordon`, in the deletion step) and, when the node is there, its
/// initial state, so the first step can cordon without a write of its own. `node` comes from
/// [`admission_node_view`], or from the API server when that says so.
pub fn admission_annotations(
    request: &NodeMaintenance,
    node: NodeView,
    now: Timestamp,
) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::from([(
        ADMITTED_TIME_ANNOTATION.to_string(),
        conditions::admitted_time_value(now),
    )]);
    // This makes the request Scheduled (`NodeMaintenance::phase`).
    if let Some(uid) = &request.metadata.uid {
        annotations.insert(ADMITTED_UID_ANNOTATION.to_string(), uid.clone());
    }
    if let (None, NodeView::Present { unschedulable }) = (initial_state(request), node) {
        annotations.insert(
            INITIAL_UNSCHEDULABLE_ANNOTATION.to_string(),
            unschedulable.to_string(),
        );
    }
    if request.spec.cordon() {
        annotations.insert(CORDON_REQUESTED_ANNOTATION.to_string(), "true".to_string());
    }
    annotations
}

/// No Ready condition, or NVIDIA's uninitialized empty reason: the request was never marked
/// Pending, so its first status write (or its admission) reports New -> Pending.
pub fn never_marked_pending(request: &NodeMaintenance) -> bool {
    request
        .condition(condition_type::READY)
        .is_none_or(|c| c.reason.is_empty())
}

/// The phase changes an admission reports (metrics, log, Events), though it writes no status:
/// its metadata write alone makes the request Scheduled. A request never marked Pending passes
/// through Pending first, as NVIDIA's operator shows every request (with its Event), at once.
pub fn admission_transitions(request: &NodeMaintenance, now: Timestamp) -> Vec<Transition> {
    let mut transitions = Vec::new();
    let mut pending = request.clone();
    if request.phase() == Phase::Pending && never_marked_pending(request) {
        let write = enter_phase(
            request,
            Phase::Pending,
            "waiting for admission",
            now,
            |_| {},
        );
        transitions.extend(write.transition);
        pending.status = Some(write.status);
    }
    transitions.extend(enter_phase(&pending, Phase::Scheduled, "admitted", now, |_| {}).transition);
    transitions
}

/// What an admission write that did not succeed leaves known. The supervisor counts a request as
/// in maintenance from its decision until this is settled: a write that may have been applied
/// must keep its slot, or the next request is admitted beside it and the limits are exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionFailure {
    /// The request changed or went away since the version the write was guarded by (409, 404):
    /// nothing was written, and the cache is behind.
    Stale,
    /// The API server refused the write (a webhook's denial, missing RBAC, throttling):
    /// nothing was written.
    Refused,
    /// No answer, a timeout or a server error: the API server may have applied the write and
    /// lost its answer. Read the request back before giving its slot away.
    OutcomeUnknown,
}

/// Classifies a failed admission write by the HTTP status the API server answered (`None`: no
/// answer, a transport error or a timeout).
pub fn admission_failure(status: Option<u16>) -> AdmissionFailure {
    match status {
        Some(404 | 409) => AdmissionFailure::Stale,
        // 408: the server gave up waiting, perhaps after the write was stored.
        Some(code) if (400..500).contains(&code) && code != 408 => AdmissionFailure::Refused,
        _ => AdmissionFailure::OutcomeUnknown,
    }
}

/// What reading a request back tells of an admission write whose outcome was unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionReadBack {
    /// Still at the version the write was guarded by: the write was not applied, and the
    /// request backs off like one whose write was refused.
    NotApplied,
    /// Admitted (by our write: only we admit): the read is the admitted request.
    Applied,
    /// Changed by another's write, or gone (an applied admission's finalizer would keep it):
    /// ours was not applied, and the cache is behind, as after a conflict.
    Stale,
}

/// `attempted`: the resourceVersion the admission's patch was guarded by; `read`: the request as
/// the API server shows it now (`None`: gone). The read follows the failed write, so the API
/// server has finished with the write by then (its own request timeout is shorter than ours).
pub fn admission_read_back(
    attempted: Option<&str>,
    read: Option<&NodeMaintenance>,
) -> AdmissionReadBack {
    let Some(read) = read else {
        return AdmissionReadBack::Stale;
    };
    if read.phase() != Phase::Pending {
        AdmissionReadBack::Applied
    } else if attempted.is_some() && read.metadata.resource_version.as_deref() == attempted {
        AdmissionReadBack::NotApplied
    } else {
        AdmissionReadBack::Stale
    }
}
