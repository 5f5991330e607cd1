//! Node groups in a round: requests labelled `maintenance.nvidia.com/group` with one value (in one
//! namespace) are admitted all together or not at all.
//!
//! A group takes the place of its first request in the admission order. Its requests are tried
//! one after another, each against every limit with the ones before it counted; if one is held,
//! what the others took is given back and they all wait, saying why. A group larger than a limit
//! waits with [`WaitCause::GroupCannotFit`] instead, and keeps nothing back from the requests
//! behind it. A group that waits for free slots keeps them: the requests behind it that would
//! take one wait with [`WaitCause::BehindGroup`], so singles do not pass it for ever.

use std::collections::{HashMap, HashSet};

use maintenance_crds::NODE_GROUP_SIZE_ANNOTATION;
use serde::Serialize;

use super::{Hold, Round, count};
use crate::budgets::{BudgetScope, Covering};
use crate::capacity::CapacityPool;
use crate::scheduler::model::{RequestKey, RequestState, Snapshot, WaitCause, nodes_are};

/// How long a node group waits for the requests its `group-size` annotation announces, from its
/// oldest Pending request's creation. Requestors create a group's requests within seconds; a
/// minute covers a slow one, and bounds the wait of a group that lost a request.
pub const GROUP_GATHERING: std::time::Duration = std::time::Duration::from_secs(60);

/// The Pending requests of one node group, as a round sees them.
pub(super) struct NodeGroup<'s> {
    pub(super) name: &'s str,
    pub(super) namespace: &'s str,
    /// The Pending requests not being deleted, in admission order.
    pub(super) members: Vec<&'s RequestState>,
    /// Its requests in any phase that still hold or wait for a node.
    existing: u32,
    /// Some of its requests are past Pending: the group has started, and its Pending rest (an
    /// admission that failed, a yield) waits for no one.
    started: bool,
    /// The largest `group-size` its requests announce.
    expected_size: Option<u32>,
    /// When its oldest Pending request was created: the group waits for its missing requests
    /// [`GROUP_GATHERING`] from then at most.
    oldest: Option<jiff::Timestamp>,
}

impl NodeGroup<'_> {
    fn header(&self) -> String {
        format!(
            "node group {:?} ({}, admitted together)",
            self.name,
            requests(self.members.len())
        )
    }

    fn status(&self, admitted: bool, cause: Option<WaitCause>) -> NodeGroupStatus {
        NodeGroupStatus {
            namespace: self.namespace.to_string(),
            name: self.name.to_string(),
            pending: count(self.members.len()),
            requests: self.members.iter().map(|m| m.key()).collect(),
            expected_size: self.expected_size,
            admitted,
            cause,
        }
    }
}

/// The node groups of a snapshot's Pending requests, by namespace and name.
pub(super) struct NodeGroups<'s> {
    by_key: HashMap<(&'s str, &'s str), NodeGroup<'s>>,
}

impl<'s> NodeGroups<'s> {
    /// `pending` in admission order (so members keep it).
    pub(super) fn of(snapshot: &'s Snapshot, pending: &[&'s RequestState]) -> NodeGroups<'s> {
        let mut by_key: HashMap<(&str, &str), NodeGroup> = HashMap::new();
        let key = |r: &'s RequestState| {
            r.node_group
                .as_ref()
                .map(|g| (r.namespace.as_str(), g.name.as_str()))
        };
        for request in pending.iter().filter(|r| !r.deleting) {
            let Some((namespace, name)) = key(request) else {
                continue;
            };
            by_key
                .entry((namespace, name))
                .or_insert_with(|| NodeGroup {
                    name,
                    namespace,
                    members: Vec::new(),
                    existing: 0,
                    started: false,
                    expected_size: None,
                    oldest: None,
                })
                .members
                .push(request);
        }
        for group in by_key.values_mut() {
            group.oldest = group.members.iter().filter_map(|m| m.created).min();
        }
        for request in snapshot.requests.iter().filter(|r| !r.released) {
            let Some(group) = key(request).and_then(|k| by_key.get_mut(&k)) else {
                continue;
            };
            group.existing += 1;
            group.started |= !request.is_pending();
            let announced = request.node_group.as_ref().and_then(|g| g.expected_size);
            group.expected_size = group.expected_size.max(announced);
        }
        NodeGroups { by_key }
    }

    /// The group `request` is in; `None` for a request without one or being deleted.
    pub(super) fn of_request(&self, request: &'s RequestState) -> Option<&NodeGroup<'s>> {
        if request.deleting {
            return None;
        }
        let group = request.node_group.as_ref()?;
        self.by_key
            .get(&(request.namespace.as_str(), group.name.as_str()))
    }
}

/// A node group as a round found it, for `plan -o json` and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupStatus {
    pub namespace: String,
    pub name: String,
    /// Its Pending requests this round.
    pub pending: u32,
    /// Those requests, in admission order: what is admitted together.
    pub requests: Vec<RequestKey>,
    /// What its `group-size` annotation announces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_size: Option<u32>,
    /// Admitted in this round.
    pub admitted: bool,
    /// Why it waits; absent when admitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<WaitCause>,
}

/// Slots a waiting node group keeps from the requests behind it.
pub(super) struct Reservation {
    scope: ReservedScope,
    reason: String,
}

enum ReservedScope {
    /// The cluster-wide `maxParallelOperations` or `maxUnavailable`.
    Cluster,
    Budget(BudgetScope),
}

impl Reservation {
    /// The reason a request on a node with `covering` waits behind it, if it does.
    pub(super) fn holds(&self, covering: &Covering) -> Option<&str> {
        let applies = match &self.scope {
            ReservedScope::Cluster => true,
            ReservedScope::Budget(scope) => covering.includes(scope),
        };
        applies.then_some(self.reason.as_str())
    }
}

/// What a round gives back when a node group does not fit as a whole.
struct Checkpoint {
    scheduled: usize,
    newly_unavailable: u32,
    capacity_pool: Option<CapacityPool>,
}

/// Each member of a group with why it waits; `None`: admitted.
pub(super) type MemberHolds<'s> = Vec<(&'s RequestState, Option<Hold>)>;

impl<'s> Round<'s> {
    /// Admits every member of `group` or none; each member with why it waits.
    pub(super) fn hold_group(
        &mut self,
        group: &NodeGroup<'s>,
    ) -> (MemberHolds<'s>, NodeGroupStatus) {
        let every_member = |cause: WaitCause, reason: &str| -> MemberHolds<'s> {
            group
                .members
                .iter()
                .map(|m| {
                    (
                        *m,
                        Some(Hold::of_node_group(cause, reason.to_string(), group)),
                    )
                })
                .collect()
        };
        if let Some((expected, until)) = self.gathering(group) {
            let reason = format!(
                "node group {:?} has {} of the {expected} requests its {NODE_GROUP_SIZE_ANNOTATION} annotation announces; it waits for the other {} until {until:.0} at most, then goes without them",
                group.name,
                group.existing,
                expected - group.existing
            );
            let cause = WaitCause::GroupIncomplete;
            return (
                every_member(cause, &reason),
                group.status(false, Some(cause)),
            );
        }
        if let Some(problem) = self.group_cannot_fit(group) {
            let reason = format!(
                "node group {:?} ({}) can never be admitted together: {problem}; raise the limit or split the group",
                group.name,
                requests(group.members.len())
            );
            let cause = WaitCause::GroupCannotFit;
            return (
                every_member(cause, &reason),
                group.status(false, Some(cause)),
            );
        }

        let checkpoint = self.checkpoint();
        for (tried, member) in group.members.iter().enumerate() {
            let Some(hold) = self.hold(member) else {
                continue;
            };
            self.roll_back(checkpoint, &group.members[..tried]);
            let reason = self.group_hold_reason(group, member, &hold);
            // A limit that held the first member has no room to keep; one that held a later
            // member has room that the members before it took, and singles would take it.
            if let Some(scope) = reserved_scope(&hold).filter(|_| tried > 0) {
                self.reservations.push(Reservation {
                    scope,
                    reason: format!(
                        "{} waits ahead of it for free slots ({}), which requests behind a group do not take",
                        group.header(),
                        hold.cause.as_str()
                    ),
                });
            }
            let cause = hold.cause;
            let holds = group
                .members
                .iter()
                .map(|m| {
                    let hold = Hold {
                        reason: reason.clone(),
                        node_group: Some(group.name.to_string()),
                        ..hold.clone()
                    };
                    (*m, Some(hold))
                })
                .collect();
            return (holds, group.status(false, Some(cause)));
        }
        let admitted = group.members.iter().map(|m| (*m, None)).collect();
        (admitted, group.status(true, None))
    }

    /// While `group` waits for the requests its `group-size` announces: how many, and until
    /// when. Only before any of it is admitted (the rest of a started group waits for no one), and
    /// for [`GROUP_GATHERING`] at most, so that a request that never comes (or one of the group
    /// already done and gone) cannot hold the others for ever.
    pub(super) fn gathering(&self, group: &NodeGroup<'s>) -> Option<(u32, jiff::Timestamp)> {
        let expected = group.expected_size.filter(|e| group.existing < *e)?;
        if group.started {
            return None;
        }
        let until = group
            .oldest
            .unwrap_or(self.now)
            .checked_add(jiff::SignedDuration::try_from(GROUP_GATHERING).ok()?)
            .ok()?;
        (self.now < until).then_some((expected, until))
    }

    /// Why `group` cannot be admitted together under any state of the cluster: a limit smaller
    /// than the group, or two of its requests on one node.
    fn group_cannot_fit(&self, group: &NodeGroup<'s>) -> Option<String> {
        let mut nodes = HashSet::new();
        if let Some(twice) = group
            .members
            .iter()
            .find(|m| !nodes.insert(m.node_name.as_str()))
        {
            return Some(format!(
                "two of its requests are for node {}, and a node is maintained for one request at a time",
                twice.node_name
            ));
        }
        let size = count(group.members.len());
        let over = |limit: &str, text: &str, max: u32, what: &str| {
            (size > max).then(|| {
                format!(
                    "{limit}={text} allows {max} {what} at once, {} fewer than the group has",
                    size - max
                )
            })
        };
        over(
            "maxParallelOperations",
            &self.limit_text.max_parallel_operations,
            self.max_parallel_operations,
            "nodes in maintenance",
        )
        .or_else(|| {
            self.max_unavailable.and_then(|max| {
                over(
                    "maxUnavailable",
                    &self.limit_text.max_unavailable,
                    max,
                    "unavailable nodes",
                )
            })
        })
        .or_else(|| {
            let coverings: Vec<Covering> = group
                .members
                .iter()
                .filter_map(|m| self.existing_nodes.get(m.node_name.as_str()))
                .map(|node| self.budgets.covering(node))
                .collect();
            self.budgets.group_cannot_fit(&coverings)
        })
    }

    /// The reason every member of `group` waits when `member` was held by `hold`, with what the
    /// group took given back: a slot limit is said for the group as a whole.
    fn group_hold_reason(
        &self,
        group: &NodeGroup<'s>,
        member: &RequestState,
        hold: &Hold,
    ) -> String {
        let size = count(group.members.len());
        let free = self
            .available_slots
            .saturating_sub(count(self.scheduled.len()));
        match hold.cause {
            WaitCause::MaxParallelOperations if hold.budget.is_none() => format!(
                "{} needs {} at once and {free} {}: maxParallelOperations={} and {} in maintenance{}",
                group.header(),
                count_of(size, "free slot"),
                if free == 1 { "is" } else { "are" },
                self.limit_text.max_parallel_operations,
                nodes_are(self.nodes_in_maintenance),
                admitted_before(count(self.scheduled.len())),
            ),
            WaitCause::MaxUnavailable if hold.budget.is_none() => {
                let becoming = group
                    .members
                    .iter()
                    .filter(|m| {
                        self.existing_nodes
                            .get(m.node_name.as_str())
                            .is_some_and(|n| !n.unavailable)
                    })
                    .count();
                let room = self
                    .can_become_unavailable
                    .unwrap_or(u32::MAX)
                    .saturating_sub(self.newly_unavailable);
                format!(
                    "{} would make {} unavailable and {room} more may be: maxUnavailable={} and {} unavailable{}",
                    group.header(),
                    count_of(count(becoming), "node"),
                    self.limit_text.max_unavailable,
                    nodes_are(count(self.unavailable_nodes.len())),
                    admitted_before(self.newly_unavailable),
                )
            }
            _ => format!(
                "{} waits for its request {}: {}",
                group.header(),
                member.key(),
                hold.reason
            ),
        }
    }

    fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            scheduled: self.scheduled.len(),
            newly_unavailable: self.newly_unavailable,
            capacity_pool: self.capacity_pool.clone(),
        }
    }

    /// Gives back what `admitted` (the members admitted since `checkpoint`) took.
    fn roll_back(&mut self, checkpoint: Checkpoint, admitted: &[&'s RequestState]) {
        for request in admitted {
            let node = request.node_name.as_str();
            if let Some(state) = self.existing_nodes.get(node) {
                let covering = self.budgets.covering(state);
                self.budgets.unadmit(&covering, state.unavailable);
            }
            self.admitted_on_node.remove(node);
        }
        self.scheduled.truncate(checkpoint.scheduled);
        self.newly_unavailable = checkpoint.newly_unavailable;
        self.capacity_pool = checkpoint.capacity_pool;
    }
}

/// What a group held by `hold` keeps from the requests behind it: the slots of the limit that
/// held it. Nothing for a hold that more free slots would not end (a window, a node in
/// maintenance, a retry).
fn reserved_scope(hold: &Hold) -> Option<ReservedScope> {
    match hold.cause {
        WaitCause::MaxParallelOperations | WaitCause::MaxUnavailable if hold.budget.is_none() => {
            Some(ReservedScope::Cluster)
        }
        WaitCause::MaxParallelOperations
        | WaitCause::MaxUnavailable
        | WaitCause::MaxGroupsInMaintenance
        | WaitCause::MaxUnavailableGroups => hold.scope.clone().map(ReservedScope::Budget),
        _ => None,
    }
}

/// `1 request`, `3 requests`.
fn count_of(n: impl Into<u64>, one: &str) -> String {
    match n.into() {
        1 => format!("1 {one}"),
        n => format!("{n} {one}s"),
    }
}

fn requests(n: usize) -> String {
    count_of(count(n), "request")
}

fn admitted_before(n: u32) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(", {n} more admitted before it in this round")
    }
}

#[cfg(test)]
mod tests;
