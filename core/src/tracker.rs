//! The supervisor's memory of the requests it acts on, between what it did and what its cache
//! shows.
//!
//! The supervisor decides on its caches of requests and nodes, and the caches lag behind its own
//! writes: an admission is answered before the cache shows the request Scheduled, a Pending
//! message is written before the cache shows its version, a request actor finishes its cleanup before
//! the cache shows the finalizer off. Deciding on the cache alone would admit past the limits,
//! write the same object twice (the second write, guarded by the old version, only conflicts), or
//! start a second actor that cordons the node of a request already released.
//!
//! So the supervisor keeps, per request UID, a [`TrackedRequest`]: the admission in flight or
//! answered, the write in flight, how its actor ended, its admission retry and its actor's
//! restarts. Each round then reads:
//!
//! 1. observe: the caches as one [`Cache`];
//! 2. settle ([`Tracker::settle`]): forget what the cache has caught up with;
//! 3. schedule: the scheduler decides on the snapshot the tracker adjusted
//!    ([`Tracker::adjust`]: admissions in flight count as in maintenance, ended requests as
//!    released);
//! 4. execute: the supervisor writes and starts actors, telling the tracker first
//!    ([`Tracker::begin_admission`], [`Tracker::writes_sent`]) and hearing the answers back
//!    ([`Tracker::admission_answered`], [`Tracker::writes_answered`]).
//!
//! Nothing here is state of the request: a restart of the operator forgets it all and starts
//! from the objects, which is safe because every write is guarded by the version it was built on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use maintenance_crds::{NodeMaintenance, Phase};

use crate::actor_runs::{self, ActorAction, ActorRun, RunEnd};
use crate::lifecycle::{self, version_reached};
use crate::scheduler::{AdmissionRetry, RequestState, Snapshot};

mod pending;
pub use pending::{PendingWrite, pending_writes};

/// The caches of one round, indexed: requests by UID and by namespace and name, nodes by name.
pub struct Cache<'a> {
    by_uid: HashMap<&'a str, &'a Arc<NodeMaintenance>>,
    by_key: HashMap<(&'a str, &'a str), &'a Arc<NodeMaintenance>>,
    nodes: HashMap<&'a str, &'a Arc<Node>>,
}

impl<'a> Cache<'a> {
    pub fn new(requests: &'a [Arc<NodeMaintenance>], nodes: &'a [Arc<Node>]) -> Cache<'a> {
        let mut by_uid = HashMap::with_capacity(requests.len());
        let mut by_key = HashMap::with_capacity(requests.len());
        for request in requests {
            if let Some(uid) = request.metadata.uid.as_deref() {
                by_uid.insert(uid, request);
            }
            if let Some(name) = request.metadata.name.as_deref() {
                let namespace = request.metadata.namespace.as_deref().unwrap_or_default();
                by_key.insert((namespace, name), request);
            }
        }
        let nodes = nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
            .collect();
        Cache {
            by_uid,
            by_key,
            nodes,
        }
    }

    pub fn request(&self, uid: &str) -> Option<&'a Arc<NodeMaintenance>> {
        self.by_uid.get(uid).copied()
    }

    pub fn request_named(&self, namespace: &str, name: &str) -> Option<&'a Arc<NodeMaintenance>> {
        self.by_key.get(&(namespace, name)).copied()
    }

    pub fn node(&self, name: &str) -> Option<&'a Arc<Node>> {
        self.nodes.get(name).copied()
    }

    pub fn node_exists(&self, name: &str) -> bool {
        self.nodes.contains_key(name)
    }

    /// Whether `request` would get an actor on the cache alone (no admission of ours counted).
    fn needs_actor(&self, request: &NodeMaintenance, admitted: bool) -> bool {
        lifecycle::needs_actor(request, self.node_exists(&request.spec.node_name), admitted)
    }
}

/// A write of ours to one object, from the moment it is sent until the cache shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Sent, not answered yet.
    InFlight,
    /// Written at this resourceVersion, which the cache may not show yet.
    Written(String),
}

impl Write {
    /// Whether the write still holds its object back, the cache showing the object at
    /// resourceVersion `shown` (`None`: the cache no longer shows the object).
    fn pending(&self, shown: Option<Option<&str>>) -> bool {
        match (shown, self) {
            (None, _) => false,
            (Some(_), Write::InFlight) => true,
            (Some(shown), Write::Written(version)) => !version_reached(shown, version),
        }
    }
}

/// Where a request's admission stands, as far as the supervisor knows beyond its cache.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Admission {
    #[default]
    None,
    /// Its admission's writes are in flight, built on this resourceVersion: it counts as in
    /// maintenance until they are answered, so rounds run on meanwhile without admitting past
    /// the limits.
    Admitting(Option<String>),
    /// Admitted by us; the cache still shows it Pending, and it counts as in maintenance.
    Admitted,
    /// Its admission met a newer object than the cache showed at this resourceVersion (or
    /// none): the same write would only fail the same way, so it keeps its turn without a write
    /// until the cache shows another version.
    Stale(String),
}

/// How an admission's writes were answered (the shell's outcome, without its objects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmissionAnswer {
    Admitted,
    /// The request changed or went away meanwhile (conflict, not found): the cache is behind.
    Changed,
    /// Refused, or its answer lost and the request read back unchanged: nothing was written.
    Failed {
        error: String,
    },
}

/// A failed actor's restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restarts {
    /// Failures in a row ([`actor_runs::restart_after_failure`]).
    pub failures: u32,
    /// It does not start again before this.
    pub not_before: Instant,
}

/// What the supervisor knows of one request beyond its cache.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrackedRequest {
    pub admission: Admission,
    /// A Pending write of ours (first status, owners, reason).
    pub write: Option<Write>,
    /// How its actor ended (cleanup done, node gone, request gone), while the cache still shows
    /// the request: it is released at once, and no version from before the end starts another
    /// actor ([`actor_runs`]).
    pub ended: Option<RunEnd>,
    /// Its last admission failed: not tried again before the retry, the next request taking the
    /// slot meanwhile.
    pub retry: Option<AdmissionRetry>,
    pub restarts: Option<Restarts>,
}

impl TrackedRequest {
    fn is_empty(&self) -> bool {
        *self == TrackedRequest::default()
    }

    /// Forgets what the cache, showing the request as `shown` (`None`: not at all), has caught
    /// up with.
    fn settle(&mut self, shown: Option<&NodeMaintenance>, cache: &Cache<'_>) {
        let pending = shown.is_some_and(|r| r.phase() == Phase::Pending);
        match &self.admission {
            // Answered whatever the cache shows; only the answer ends it.
            Admission::Admitting(_) => {}
            Admission::Admitted if pending => {}
            Admission::Stale(attempted)
                if shown.is_some_and(|r| {
                    r.metadata.resource_version.as_deref() == Some(attempted.as_str())
                }) => {}
            _ => self.admission = Admission::None,
        }
        let shown_version = shown.map(|r| r.metadata.resource_version.as_deref());
        if self
            .write
            .as_ref()
            .is_some_and(|w| !w.pending(shown_version))
        {
            self.write = None;
        }
        if shown.is_none() {
            self.ended = None;
        }
        // An actor that ended by giving the slot back (a yield) left its request Pending and
        // needing no actor: once the cache shows that version, the end is history, and kept it
        // would count the request's next admission as released.
        if let Some(RunEnd::Finished {
            version: Some(version),
            ..
        }) = &self.ended
            && pending
            && shown.is_some_and(|r| {
                !r.is_deleting() && version_reached(r.metadata.resource_version.as_deref(), version)
            })
        {
            self.ended = None;
        }
        if !(pending && shown.is_some_and(|r| !r.is_deleting())) {
            self.retry = None;
        }
        let admitted = self.admission == Admission::Admitted;
        if !shown.is_some_and(|r| cache.needs_actor(r, admitted)) {
            self.restarts = None;
        }
    }
}

/// Writes of ours to nodes (the pending-drain taint, the uncordon of an orphaned cordon), by
/// node name: a node is not written again until the cache shows the last write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeWrites {
    writes: HashMap<String, Write>,
}

impl NodeWrites {
    pub fn contains(&self, node: &str) -> bool {
        self.writes.contains_key(node)
    }

    pub fn sent(&mut self, nodes: impl IntoIterator<Item = String>) {
        for node in nodes {
            self.writes.insert(node, Write::InFlight);
        }
    }

    /// The answers: each node with the resourceVersion written (`None`: nothing was).
    pub fn answered(&mut self, written: Vec<(String, Option<String>)>) {
        for (node, version) in written {
            match version {
                Some(version) => self.writes.insert(node, Write::Written(version)),
                None => self.writes.remove(&node),
            };
        }
    }

    fn settle(&mut self, cache: &Cache<'_>) {
        self.writes.retain(|node, write| {
            write.pending(
                cache
                    .node(node)
                    .map(|n| n.metadata.resource_version.as_deref()),
            )
        });
    }
}

/// One timer at a time for the next due time of one kind (a window's opening, an admission
/// retry, a collection deadline, an orphaned cordon's grace): a later due time waits for the
/// armed timer's round, an earlier one arms another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alarm<T> {
    armed: Option<T>,
}

impl<T> Default for Alarm<T> {
    fn default() -> Self {
        Alarm { armed: None }
    }
}

impl<T: Ord + Copy> Alarm<T> {
    /// Whether a timer must be set for `due`: none is armed, the armed one is past (`now`), or
    /// `due` is earlier. Records `due` as armed when so.
    pub fn arm(&mut self, due: T, now: T) -> bool {
        if self.armed.is_none_or(|armed| armed <= now || due < armed) {
            self.armed = Some(due);
            true
        } else {
            false
        }
    }

    /// The armed timer fired.
    pub fn fired(&mut self) {
        self.armed = None;
    }
}

/// The supervisor's memory of every request it acts on, by UID, and of its writes to nodes.
#[derive(Debug, Default)]
pub struct Tracker {
    requests: HashMap<String, TrackedRequest>,
    pub taints: NodeWrites,
    pub uncordons: NodeWrites,
}

impl Tracker {
    pub fn get(&self, uid: &str) -> Option<&TrackedRequest> {
        self.requests.get(uid)
    }

    fn entry(&mut self, uid: &str) -> &mut TrackedRequest {
        self.requests.entry(uid.to_string()).or_default()
    }

    /// Forgets what the cache has caught up with: admissions it shows past Pending, writes it
    /// shows, stale admissions it shows at another version, ends and retries of requests it no
    /// longer shows (or shows past Pending), restarts of requests that need no actor.
    pub fn settle(&mut self, cache: &Cache<'_>) {
        self.requests.retain(|uid, tracked| {
            tracked.settle(cache.request(uid).map(|r| &**r), cache);
            !tracked.is_empty()
        });
        self.taints.settle(cache);
        self.uncordons.settle(cache);
    }

    /// The scheduler's snapshot as the supervisor knows it: a request whose admission is in
    /// flight or answered counts as in maintenance, one whose actor ended as released, and one
    /// whose admission failed waits for its retry.
    pub fn adjust(&self, snapshot: &mut Snapshot, cache: &Cache<'_>) {
        for request in &mut snapshot.requests {
            let Some(tracked) = cache
                .request_named(&request.namespace, &request.name)
                .and_then(|r| r.metadata.uid.as_deref())
                .and_then(|uid| self.requests.get(uid))
            else {
                continue;
            };
            if matches!(
                tracked.admission,
                Admission::Admitting(_) | Admission::Admitted
            ) {
                request.phase = Phase::Scheduled;
            }
            if tracked.ended.is_some() {
                request.released = true;
            }
            request.admission_retry = tracked.retry.clone();
        }
    }

    /// Requests whose actor runs on after they went without our cleanup hold their node in the
    /// snapshot until the actor has undone the cordon (`lifecycle::actor_holds_node_of_gone_request`):
    /// one the cache shows released (our finalizer removed by someone else) is held again, and
    /// one it no longer shows is counted from the actor's last version. `running` is each
    /// running actor's UID and the last version it was given.
    pub fn hold_nodes_of_gone_requests<'r>(
        &self,
        snapshot: &mut Snapshot,
        running: impl IntoIterator<Item = (&'r str, &'r NodeMaintenance)>,
        cache: &Cache<'_>,
    ) {
        for (uid, last) in running {
            let shown = cache.request(uid).map(|r| &**r);
            if !lifecycle::actor_holds_node_of_gone_request(
                last,
                shown,
                cache.node_exists(&last.spec.node_name),
                self.is_admitted(uid),
            ) {
                continue;
            }
            let key = (
                last.metadata.namespace.as_deref().unwrap_or_default(),
                last.metadata.name.as_deref().unwrap_or_default(),
            );
            let same = shown.is_some_and(|r| r.metadata.uid == last.metadata.uid);
            match snapshot
                .requests
                .iter_mut()
                .find(|r| same && (r.namespace.as_str(), r.name.as_str()) == key)
            {
                Some(request) => request.released = false,
                None => {
                    let mut holder = RequestState::from_request(last);
                    holder.released = false;
                    snapshot.requests.push(holder);
                }
            }
        }
    }

    /// Whether anything of ours is at work on request `uid` (its cordon is not an orphan):
    /// an actor runs (`has_actor`) or ended, its admission is in flight or answered, or the
    /// cache shows it needing an actor.
    pub fn in_progress(&self, uid: &str, has_actor: bool, cache: &Cache<'_>) -> bool {
        let tracked = self.requests.get(uid);
        has_actor
            || tracked.is_some_and(|t| {
                t.ended.is_some()
                    || matches!(t.admission, Admission::Admitting(_) | Admission::Admitted)
            })
            || cache
                .request(uid)
                .is_some_and(|r| cache.needs_actor(r, false))
    }

    /// Admitted by us, the cache still showing it Pending.
    pub fn is_admitted(&self, uid: &str) -> bool {
        self.requests
            .get(uid)
            .is_some_and(|t| t.admission == Admission::Admitted)
    }

    /// Its admission is in flight or answered: it counts as in maintenance.
    pub fn is_admitted_or_admitting(&self, uid: &str) -> bool {
        self.requests
            .get(uid)
            .is_some_and(|t| matches!(t.admission, Admission::Admitting(_) | Admission::Admitted))
    }

    /// Its admission is in flight, answered, or stale: no Pending write and no taint change for
    /// it in this round (either would make the admission's guarded write conflict).
    pub fn is_being_admitted(&self, uid: &str) -> bool {
        self.requests
            .get(uid)
            .is_some_and(|t| t.admission != Admission::None)
    }

    pub fn has_write(&self, uid: &str) -> bool {
        self.requests.get(uid).is_some_and(|t| t.write.is_some())
    }

    /// The scheduler admits `uid`, shown at resourceVersion `attempted`: whether to send the
    /// admission's writes now. Not while a write of ours to it is in flight or unseen (a write
    /// guarded by the version the cache shows would only conflict), nor while its last attempt
    /// is stale or another is in flight: it keeps its place without a write.
    pub fn begin_admission(&mut self, uid: &str, attempted: Option<&str>) -> bool {
        if !self.can_begin_admission(uid) {
            return false;
        }
        self.entry(uid).admission = Admission::Admitting(attempted.map(str::to_string));
        true
    }

    /// Whether [`Tracker::begin_admission`] would send the admission of `uid` now.
    pub fn can_begin_admission(&self, uid: &str) -> bool {
        self.requests
            .get(uid)
            .is_none_or(|t| t.write.is_none() && t.admission == Admission::None)
    }

    /// The admission of `uid` was answered at `now`. Returns the retry it now waits for, if it
    /// failed.
    pub fn admission_answered(
        &mut self,
        uid: &str,
        answer: AdmissionAnswer,
        now: Timestamp,
    ) -> Option<&AdmissionRetry> {
        let tracked = self.entry(uid);
        let attempted = match std::mem::take(&mut tracked.admission) {
            Admission::Admitting(attempted) => attempted,
            _ => None,
        };
        match answer {
            AdmissionAnswer::Admitted => {
                tracked.admission = Admission::Admitted;
                tracked.retry = None;
            }
            // No time backoff: the request did nothing wrong, the cache is only behind, and a
            // wait would hand its slot to the next request over a label edit.
            AdmissionAnswer::Changed => {
                if let Some(version) = attempted {
                    tracked.admission = Admission::Stale(version);
                }
            }
            AdmissionAnswer::Failed { error } => {
                tracked.retry = Some(AdmissionRetry::after_failure(
                    tracked.retry.as_ref(),
                    error,
                    now,
                ));
            }
        }
        tracked.retry.as_ref()
    }

    /// Pending writes to these requests were sent.
    pub fn writes_sent(&mut self, uids: impl IntoIterator<Item = String>) {
        for uid in uids {
            self.entry(&uid).write = Some(Write::InFlight);
        }
    }

    /// The Pending writes were answered, each with the resourceVersion it wrote (`None`:
    /// nothing was written, and the request is free for the next round).
    pub fn writes_answered(&mut self, written: Vec<(String, Option<String>)>) {
        for (uid, version) in written {
            match version {
                Some(version) => self.entry(&uid).write = Some(Write::Written(version)),
                None => {
                    if let Some(tracked) = self.requests.get_mut(&uid) {
                        tracked.write = None;
                    }
                }
            }
        }
    }

    /// The actor of `uid` stopped and left how it ended.
    pub fn actor_ended(&mut self, uid: &str, end: RunEnd) {
        self.entry(uid).ended = Some(end);
    }

    /// An actor started for `uid`: work again (a node back under its old name), the request
    /// holds its slot.
    pub fn actor_started(&mut self, uid: &str) {
        if let Some(tracked) = self.requests.get_mut(uid) {
            tracked.ended = None;
        }
    }

    /// The actor of `uid` failed at `now`: it starts again after a backoff. Returns its
    /// failures in a row and the wait.
    pub fn actor_failed(&mut self, uid: &str, now: Instant) -> (u32, Duration) {
        let tracked = self.entry(uid);
        let previous = tracked
            .restarts
            .map(|r| (r.failures, now.saturating_duration_since(r.not_before)));
        let (failures, delay) = actor_runs::restart_after_failure(previous);
        tracked.restarts = Some(Restarts {
            failures,
            not_before: now + delay,
        });
        (failures, delay)
    }

    /// The supervisor's move for `uid`, a request that needs an actor (`lifecycle::needs_actor`)
    /// shown by the cache at resourceVersion `cached`: `forwarded` is the newest version its
    /// running actor was given (`None`: no actor runs). A failed actor does not start again
    /// before its backoff ends.
    pub fn actor_action(
        &self,
        uid: &str,
        forwarded: Option<Option<&str>>,
        cached: Option<&str>,
        node_exists: bool,
        now: Instant,
    ) -> ActorAction {
        let tracked = self.requests.get(uid);
        let run = match (forwarded, tracked.and_then(|t| t.ended.as_ref())) {
            (Some(forwarded), _) => ActorRun::Running { forwarded },
            (None, Some(end)) => ActorRun::Ended(end),
            (None, None) => ActorRun::Never,
        };
        match actor_runs::next_action(run, cached, node_exists) {
            ActorAction::Start
                if tracked
                    .and_then(|t| t.restarts)
                    .is_some_and(|r| r.not_before > now) =>
            {
                ActorAction::Nothing
            }
            action => action,
        }
    }
}

#[cfg(test)]
mod tests;
