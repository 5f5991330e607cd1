//! One scheduling round as a pure function: which Pending requests may start now.
//!
//! This is exactly the algorithm of docs/architecture.md, Scheduling algorithm, plus the config's optional
//! budgets ([`crate::budgets`]) and maintenance windows ([`crate::windows`]): a request is
//! admitted only when the cluster-wide limits, every budget that covers its node, and every window
//! that applies have room. Without budgets and windows the decision is the plain algorithm's. It
//! does no I/O and reads no clock (the time is an argument), so the supervisor can run it on every
//! change and `maintenance-operator plan` can show a person the very same decision the operator
//! would take.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use maintenance_crds::{DEFAULT_CONFIG_NAME, IntOrPercentError, Rounding, resolve_int_or_percent};
use serde::Serialize;

use crate::blackouts::{ActiveBlackout, BlackoutError, Blackouts};
use crate::budgets::{
    BudgetError, BudgetScope, BudgetStatus, Budgets, WindowStatus, outside_windows,
};
use crate::capacity::{CapacityCheck, CapacityPool, CapacityStatus};
use crate::drainability::PreferDrainable;
use crate::windows::{Window, WindowError, WindowState, Windows};

mod groups;
pub mod model;

pub use groups::NodeGroupStatus;
pub use model::*;

/// Spec field names, used in messages so that a user knows what to edit.
const MAX_PARALLEL_OPERATIONS_FIELD: &str = "maxParallelOperations";
const MAX_UNAVAILABLE_FIELD: &str = "maxUnavailable";

/// Rounds that follow one another closely (a busy fleet sends events faster than rounds run)
/// are spaced so that the supervisor spends at most a fifth of its time in them: the next one
/// waits four times as long as the last one took, at most [`MAX_ROUND_GAP`]. A round of a small
/// cluster (well under a millisecond) is not held back noticeably; one of thousands of nodes
/// gathers the events of its gap into one round instead of running once per event. The cap is
/// well above what rounds take: at 20 ms, the 11 ms rounds of a 1,000-node rolling maintenance
/// on a busy machine ran every 31 ms, a third of the time rather than a fifth, on the cores the
/// control plane needed.
pub fn round_gap(last_round_took: Duration) -> Duration {
    (last_round_took * ROUND_GAP_FACTOR).min(MAX_ROUND_GAP)
}

const ROUND_GAP_FACTOR: u32 = 4;
/// The longest a change waits for its round because of [`round_gap`].
pub const MAX_ROUND_GAP: Duration = Duration::from_millis(100);

/// The outcome of one scheduling round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Slots free before this round admitted anything.
    pub available_slots: u32,
    /// Nodes that may still become unavailable before this round; `None` when maxUnavailable is unset.
    pub can_become_unavailable: Option<u32>,
    /// Admitted requests, in admission order.
    pub scheduled: Vec<RequestKey>,
    /// Every other Pending request, in the order the scheduler considered them.
    pub waiting: Vec<Waiting>,
    /// The cluster-wide windows at this round; absent when none are set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maintenance_windows: Option<WindowStatus>,
    /// The blackout that holds every admission at this round; absent when none does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blackout: Option<ActiveBlackout>,
    /// Each budget before this round admitted anything; absent when none are set.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<BudgetStatus>,
    /// `checkCapacity`: the room for evicted pods before this round admitted anything; absent
    /// when the check is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityStatus>,
    /// The node groups with Pending requests, in the order they were considered; absent when
    /// there are none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub node_groups: Vec<NodeGroupStatus>,
    /// The earliest opening of a closed window (cluster-wide or a budget's) or end of a
    /// blackout: a round is due then.
    #[serde(skip)]
    pub next_window_opening: Option<jiff::Timestamp>,
    /// The earliest retry of a request that waits for [`WaitCause::AdmissionRetry`], end of a
    /// back-off of one that waits for [`WaitCause::YieldBackoff`], or end of the gathering of a
    /// node group that waits for [`WaitCause::GroupIncomplete`]: a round is due then.
    #[serde(skip)]
    pub next_admission_retry: Option<jiff::Timestamp>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error(
        "MaintenanceOperatorConfig {DEFAULT_CONFIG_NAME:?} (in the operator's namespace) has an invalid limit: {0}; fix it with `kubectl edit maintenanceoperatorconfig {DEFAULT_CONFIG_NAME}` in that namespace"
    )]
    InvalidLimit(IntOrPercentError),
    #[error(
        "MaintenanceOperatorConfig {DEFAULT_CONFIG_NAME:?} (in the operator's namespace) has an invalid window: {0}; fix it with `kubectl edit maintenanceoperatorconfig {DEFAULT_CONFIG_NAME}` in that namespace"
    )]
    InvalidWindow(WindowError),
    #[error(
        "MaintenanceOperatorConfig {DEFAULT_CONFIG_NAME:?} (in the operator's namespace) has an invalid {0}; fix it with `kubectl edit maintenanceoperatorconfig {DEFAULT_CONFIG_NAME}` in that namespace"
    )]
    InvalidBudget(BudgetError),
    #[error(
        "MaintenanceOperatorConfig {DEFAULT_CONFIG_NAME:?} (in the operator's namespace) has an invalid blackout: {0}; fix it with `kubectl edit maintenanceoperatorconfig {DEFAULT_CONFIG_NAME}` in that namespace"
    )]
    InvalidBlackout(BlackoutError),
}

impl ScheduleError {
    /// The problem alone, naming the field, without the advice on where to fix it: for a
    /// webhook's refusal, which names the object already.
    pub fn problem(&self) -> String {
        match self {
            ScheduleError::InvalidLimit(err) => err.to_string(),
            ScheduleError::InvalidWindow(err) => err.to_string(),
            ScheduleError::InvalidBudget(err) => err.to_string(),
            ScheduleError::InvalidBlackout(err) => err.to_string(),
        }
    }

    /// The field at fault, as a path in the config's spec.
    pub fn field(&self) -> String {
        match self {
            ScheduleError::InvalidLimit(IntOrPercentError::Malformed { field, .. }) => {
                (*field).to_string()
            }
            ScheduleError::InvalidWindow(err) => {
                format!("maintenanceWindows[{}].{}", err.index, err.field)
            }
            ScheduleError::InvalidBudget(err) => format!("budgets[name={}]", err.budget),
            ScheduleError::InvalidBlackout(err) => format!("blackouts[{}]", err.index),
        }
    }
}

/// Every value of the config that the scheduler cannot use, each naming its field: what the
/// webhook refuses when the config is written, and what would stop every round. A round stops at
/// the first; a person fixing the config wants them all.
pub fn config_problems(limits: &Limits) -> Vec<ScheduleError> {
    // Any node count shows a malformed value; 100 nodes is arbitrary.
    const ANY_NODE_COUNT: u32 = 100;
    let mut problems = Vec::new();
    let resolved = [
        (
            MAX_PARALLEL_OPERATIONS_FIELD,
            Some(&limits.max_parallel_operations),
            Rounding::Up,
        ),
        (
            MAX_UNAVAILABLE_FIELD,
            limits.max_unavailable.as_ref(),
            Rounding::Down,
        ),
    ];
    for (field, value, rounding) in resolved {
        if let Some(Err(err)) =
            value.map(|value| resolve_int_or_percent(field, value, ANY_NODE_COUNT, rounding))
        {
            problems.push(ScheduleError::InvalidLimit(err));
        }
    }
    for (index, window) in limits.maintenance_windows.iter().enumerate() {
        if let Err(err) = Window::parse(index, window) {
            problems.push(ScheduleError::InvalidWindow(err));
        }
    }
    let mut names = HashSet::new();
    for budget in &limits.budgets {
        let alone = Budgets::new(
            std::slice::from_ref(budget),
            &[],
            |_| false,
            |_| false,
            jiff::Timestamp::UNIX_EPOCH,
        );
        if let Err(err) = alone {
            problems.push(ScheduleError::InvalidBudget(err));
        } else if !names.insert(budget.name.as_str()) {
            problems.push(ScheduleError::InvalidBudget(BudgetError {
                budget: budget.name.clone(),
                problem: "the name is used by two budgets; give each a name of its own".into(),
            }));
        }
    }
    for (index, blackout) in limits.blackouts.iter().enumerate() {
        if let Err(mut err) = Blackouts::parse(std::slice::from_ref(blackout)) {
            err.index = index;
            problems.push(ScheduleError::InvalidBlackout(err));
        }
    }
    problems
}

/// Runs one scheduling round (docs/architecture.md, Scheduling algorithm); windows are read at `now`.
pub fn schedule(
    snapshot: &Snapshot,
    limits: &Limits,
    now: jiff::Timestamp,
) -> Result<Decision, ScheduleError> {
    schedule_with(snapshot, limits, &PreferDrainable::default(), now)
}

/// [`schedule`] with `preferDrainable`: requests whose drain would only wait on a
/// PodDisruptionBudget (and that have not yet aged past the bound) move behind all others, keeping
/// their order among themselves; everything else is the plain round. Moving back never refuses a
/// request: a slot left over after the drainable ones still goes to a blocked one.
pub fn schedule_with(
    snapshot: &Snapshot,
    limits: &Limits,
    prefer: &PreferDrainable,
    now: jiff::Timestamp,
) -> Result<Decision, ScheduleError> {
    schedule_observed(snapshot, limits, prefer, &CapacityCheck::default(), now)
}

/// `maxParallelOperations` resolved against the snapshot's nodes.
fn max_parallel_operations(snapshot: &Snapshot, limits: &Limits) -> Result<u32, ScheduleError> {
    resolve_int_or_percent(
        MAX_PARALLEL_OPERATIONS_FIELD,
        &limits.max_parallel_operations,
        count(snapshot.nodes.len()),
        Rounding::Up,
    )
    .map_err(ScheduleError::InvalidLimit)
}

/// Node -> the request holding it (the smallest key, so that reasons are stable). A request
/// whose Node is gone holds nothing: there is no node left to keep unavailable, and its node
/// actor only releases it (docs/architecture.md, Request lifecycle; NVIDIA's preSchedule in
/// internal/controller/nodemaintenancescheduler_controller.go counts only existing nodes). Nor
/// does a released one (deleted, our cleanup done): only its requestor's finalizer keeps it, for
/// as long as the requestor likes, and nothing of ours will change it again.
fn nodes_in_maintenance<'a>(
    snapshot: &'a Snapshot,
    existing_nodes: &HashMap<&str, &NodeState>,
) -> BTreeMap<&'a str, &'a RequestState> {
    let mut in_maintenance: BTreeMap<&str, &RequestState> = BTreeMap::new();
    for request in snapshot
        .requests
        .iter()
        .filter(|r| r.holds_its_node() && existing_nodes.contains_key(r.node_name.as_str()))
    {
        in_maintenance
            .entry(request.node_name.as_str())
            .and_modify(|holder| {
                if request.key() < holder.key() {
                    *holder = request;
                }
            })
            .or_insert(request);
    }
    in_maintenance
}

/// The slots `maxParallelOperations` leaves free, as [`schedule_observed`] counts them. With
/// none, a round admits nothing, whatever else it observes: the supervisor then skips the pod
/// reads of `checkCapacity` and `preferDrainable` ([`can_admit_any`]; a whole-cluster list, and
/// a list per Pending request's node), which used to run on every round of a rollout whose
/// slots are all taken.
pub fn free_slots(snapshot: &Snapshot, limits: &Limits) -> Result<u32, ScheduleError> {
    let existing_nodes: HashMap<&str, &NodeState> = snapshot
        .nodes
        .iter()
        .map(|node| (node.name.as_str(), node))
        .collect();
    let held = count(nodes_in_maintenance(snapshot, &existing_nodes).len());
    Ok(max_parallel_operations(snapshot, limits)?.saturating_sub(held))
}

/// Whether a round may admit anything: false only when every slot is taken (an invalid limit
/// counts as true, so that the round reports it). Without a free slot the pod reads of
/// `checkCapacity` and `preferDrainable` would be spent on nothing.
pub fn can_admit_any(snapshot: &Snapshot, limits: &Limits) -> bool {
    free_slots(snapshot, limits).map_or(true, |free| free > 0)
}

/// [`schedule_with`] and `checkCapacity`: a request that every limit admits is admitted only if
/// the pods its drain would evict fit on the nodes left ([`crate::capacity`]); otherwise it waits
/// with [`WaitCause::InsufficientCapacity`] and the shortfall. With the check off, this is
/// [`schedule_with`].
pub fn schedule_observed(
    snapshot: &Snapshot,
    limits: &Limits,
    prefer: &PreferDrainable,
    capacity: &CapacityCheck,
    now: jiff::Timestamp,
) -> Result<Decision, ScheduleError> {
    let mut round = Round::new(snapshot, limits, capacity, now)?;
    let pending = pending_in_order(snapshot, prefer, now);
    let groups = groups::NodeGroups::of(snapshot, &pending);

    let mut waiting = Vec::new();
    let mut node_groups = Vec::new();
    let mut next_admission_retry: Option<jiff::Timestamp> = None;
    for request in &pending {
        let holds = match groups.of_request(request) {
            // A group is decided at its first request's place, for all its requests.
            Some(group) if std::ptr::eq(group.members[0], *request) => {
                let (holds, status) = round.hold_group(group);
                node_groups.push(status);
                holds
            }
            Some(_) => continue,
            None => vec![(*request, round.hold(request))],
        };
        for (request, hold) in holds {
            let hold = hold.map(|hold| passed_over(hold, request, prefer, now));
            let due = match hold.as_ref().map(|hold| hold.cause) {
                Some(WaitCause::AdmissionRetry) => request.admission_retry.as_ref().map(|r| r.at),
                Some(WaitCause::YieldBackoff) => round.readmit_at(request),
                Some(WaitCause::GroupIncomplete) => groups
                    .of_request(request)
                    .and_then(|group| round.gathering(group))
                    .map(|(_, until)| until),
                _ => None,
            };
            if let Some(due) = due {
                next_admission_retry =
                    Some(next_admission_retry.map_or(due, |earliest| earliest.min(due)));
            }
            if let Some(hold) = hold {
                let reason = match &request.yielded {
                    Some(record) if hold.cause != WaitCause::YieldBackoff => {
                        crate::yielding::with_yield(&hold.reason, record)
                    }
                    _ => hold.reason,
                };
                waiting.push(Waiting {
                    key: request.key(),
                    reason,
                    cause: hold.cause,
                    budget: hold.budget,
                    group: hold.group,
                    node_group: hold.node_group,
                });
            }
        }
    }

    let cluster_opening = match &round.windows {
        WindowState::Closed {
            next_opening: Some(at),
        } => Some(at.timestamp()),
        _ => None,
    };
    Ok(Decision {
        available_slots: round.available_slots,
        can_become_unavailable: round.can_become_unavailable,
        scheduled: round.scheduled,
        waiting,
        maintenance_windows: WindowStatus::of(&round.windows),
        blackout: round.blackout.clone(),
        budgets: round.budget_status,
        capacity: round.capacity_status,
        node_groups,
        next_window_opening: cluster_opening
            .into_iter()
            .chain(round.budgets.next_window_opening())
            .chain(round.blackout.as_ref().map(|b| b.until))
            .min(),
        next_admission_retry,
    })
}

/// The admissions of `decision` to send now: each admitted request, but those of a node group
/// only if every one of the group can be sent (`can_send`: no write of ours to it in flight or
/// unseen), so that no part of a group is admitted while the rest waits for a later round.
pub fn admissions_to_send(
    decision: &Decision,
    can_send: impl Fn(&RequestKey) -> bool,
) -> Vec<&RequestKey> {
    let held: HashSet<&RequestKey> = decision
        .node_groups
        .iter()
        .filter(|group| group.admitted && !group.requests.iter().all(&can_send))
        .flat_map(|group| &group.requests)
        .collect();
    decision
        .scheduled
        .iter()
        .filter(|key| !held.contains(key))
        .collect()
}

/// One round of [`schedule_observed`]: the cluster as it stands before the round (limits
/// resolved, nodes held and unavailable, windows, budgets, room for evicted pods), and what the
/// round has admitted so far.
struct Round<'s> {
    now: jiff::Timestamp,
    /// The yield period, the base of a yielded request's back-off.
    yield_period: Option<Duration>,
    capacity: &'s CapacityCheck,
    existing_nodes: HashMap<&'s str, &'s NodeState>,
    in_maintenance: BTreeMap<&'s str, &'s RequestState>,
    unavailable_nodes: BTreeSet<&'s str>,
    windows: WindowState,
    blackout: Option<ActiveBlackout>,
    gate_hold: Option<&'s crate::gates::GateHold>,
    budgets: Budgets<'s>,
    budget_status: Vec<BudgetStatus>,
    capacity_pool: Option<CapacityPool>,
    capacity_status: Option<CapacityStatus>,
    nodes_in_maintenance: u32,
    /// The limits resolved against the cluster's nodes.
    max_parallel_operations: u32,
    max_unavailable: Option<u32>,
    available_slots: u32,
    can_become_unavailable: Option<u32>,
    limit_text: LimitText,
    /// Slots that node groups waiting ahead keep from the requests behind them.
    reservations: Vec<groups::Reservation>,
    scheduled: Vec<RequestKey>,
    /// Node -> the request admitted on it in this round.
    admitted_on_node: HashMap<&'s str, RequestKey>,
    newly_unavailable: u32,
}

impl<'s> Round<'s> {
    fn new(
        snapshot: &'s Snapshot,
        limits: &'s Limits,
        capacity: &'s CapacityCheck,
        now: jiff::Timestamp,
    ) -> Result<Round<'s>, ScheduleError> {
        let total_nodes = count(snapshot.nodes.len());
        let max_parallel_operations = max_parallel_operations(snapshot, limits)?;
        let max_unavailable = limits
            .max_unavailable
            .as_ref()
            .map(|value| {
                resolve_int_or_percent(MAX_UNAVAILABLE_FIELD, value, total_nodes, Rounding::Down)
            })
            .transpose()
            .map_err(ScheduleError::InvalidLimit)?;

        let existing_nodes: HashMap<&str, &NodeState> = snapshot
            .nodes
            .iter()
            .map(|node| (node.name.as_str(), node))
            .collect();
        let in_maintenance = nodes_in_maintenance(snapshot, &existing_nodes);
        // A set, so that a cordoned node under maintenance counts once.
        let unavailable_nodes: BTreeSet<&str> = in_maintenance
            .keys()
            .copied()
            .chain(
                snapshot
                    .nodes
                    .iter()
                    .filter(|node| node.unavailable)
                    .map(|node| node.name.as_str()),
            )
            .collect();

        let windows = Windows::parse(&limits.maintenance_windows)
            .map_err(ScheduleError::InvalidWindow)?
            .state(now);
        let blackout = Blackouts::parse(&limits.blackouts)
            .map_err(ScheduleError::InvalidBlackout)?
            .active(now);
        let budgets = Budgets::new(
            &limits.budgets,
            &snapshot.nodes,
            |node| in_maintenance.contains_key(node),
            |node| unavailable_nodes.contains(node),
            now,
        )
        .map_err(ScheduleError::InvalidBudget)?;
        let budget_status = budgets.status();
        // Nodes in maintenance and unavailable nodes take no pods; drains in progress need room.
        let capacity_pool = capacity.enabled.then(|| {
            let takes_pods =
                |node: &str| !unavailable_nodes.contains(node) && existing_nodes.contains_key(node);
            // A released request's drain has stopped: its pods are going nowhere.
            let in_progress: Vec<RequestKey> = snapshot
                .requests
                .iter()
                .filter(|r| r.holds_its_node())
                .map(RequestState::key)
                .collect();
            CapacityPool::new(capacity, takes_pods, &in_progress)
        });
        let capacity_status = capacity_pool.as_ref().map(CapacityPool::status);

        let nodes_in_maintenance = count(in_maintenance.len());
        let available_slots = max_parallel_operations.saturating_sub(nodes_in_maintenance);
        let can_become_unavailable =
            max_unavailable.map(|limit| limit.saturating_sub(count(unavailable_nodes.len())));

        let limit_text = LimitText {
            max_parallel_operations: describe_limit(
                &limits.max_parallel_operations,
                max_parallel_operations,
                total_nodes,
            ),
            max_unavailable: limits
                .max_unavailable
                .as_ref()
                .zip(max_unavailable)
                .map(|(value, resolved)| describe_limit(value, resolved, total_nodes))
                .unwrap_or_default(),
        };

        Ok(Round {
            now,
            yield_period: limits.yield_blocked_drain_after,
            capacity,
            existing_nodes,
            in_maintenance,
            unavailable_nodes,
            windows,
            blackout,
            gate_hold: limits.gate_hold.as_ref(),
            budgets,
            budget_status,
            capacity_pool,
            capacity_status,
            nodes_in_maintenance,
            max_parallel_operations,
            max_unavailable,
            available_slots,
            can_become_unavailable,
            limit_text,
            reservations: Vec::new(),
            scheduled: Vec::new(),
            admitted_on_node: HashMap::new(),
            newly_unavailable: 0,
        })
    }

    /// When a request that yielded may be admitted again; `None`: it never yielded, or yields
    /// are off (turning them off ends every back-off).
    fn readmit_at(&self, request: &RequestState) -> Option<jiff::Timestamp> {
        let period = self.yield_period?;
        Some(request.yielded.as_ref()?.readmit_at(period))
    }

    /// Why `request` waits this round, or `None`: it is admitted, and counted against every
    /// limit for the requests after it.
    fn hold(&mut self, request: &'s RequestState) -> Option<Hold> {
        let node = request.node_name.as_str();
        let cluster_wide =
            |cause: WaitCause, reason: String| Some(Hold::cluster_wide(cause, reason));
        if request.deleting {
            cluster_wide(WaitCause::Deleting, "being deleted".to_string())
        } else if let Some(holder) = self.in_maintenance.get(node) {
            cluster_wide(
                WaitCause::NodeInMaintenance,
                format!("node {node} is under maintenance by {}", holder.key()),
            )
        } else if let Some(node_state) = self.existing_nodes.get(node) {
            let covering = self.budgets.covering(node_state);
            if let Some(winner) = self.admitted_on_node.get(node) {
                cluster_wide(
                    WaitCause::NodeAdmittedThisRound,
                    format!("node already has a request being admitted: {winner}"),
                )
            } else if let Some(retry) = request.admission_retry.as_ref().filter(|r| r.at > self.now)
            {
                // Before the limits: the failure is what a person must look at (a webhook that
                // denies the write), and the slot goes to the next request meanwhile rather
                // than to the same doomed write again (rule 6's skip).
                cluster_wide(WaitCause::AdmissionRetry, retry.describe())
            } else if let (Some(record), Some(period)) = (
                request
                    .yielded
                    .as_ref()
                    .filter(|_| self.readmit_at(request).is_some_and(|at| at > self.now)),
                self.yield_period,
            ) {
                // Like a failed admission: the slot goes to the next request meanwhile.
                cluster_wide(WaitCause::YieldBackoff, record.backoff_reason(period))
            } else if let Some(blackout) = &self.blackout {
                cluster_wide(WaitCause::Blackout, blackout.describe())
            } else if let Some(gate) = self.gate_hold {
                cluster_wide(WaitCause::Gate, gate.describe())
            } else if let WindowState::Closed { next_opening } = &self.windows {
                cluster_wide(
                    WaitCause::MaintenanceWindows,
                    outside_windows(None, next_opening.as_ref()),
                )
            } else if let Some(hold) = self.budgets.window_hold(&covering) {
                Some(hold.into())
            } else if let Some(ahead) = self.reservations.iter().find_map(|r| r.holds(&covering)) {
                cluster_wide(WaitCause::BehindGroup, ahead.to_string())
            } else if count(self.scheduled.len()) >= self.available_slots {
                cluster_wide(
                    WaitCause::MaxParallelOperations,
                    format!(
                        "no free slot: maxParallelOperations={} and {} in maintenance{}",
                        self.limit_text.max_parallel_operations,
                        nodes_are(self.nodes_in_maintenance),
                        more_in_this_round(count(self.scheduled.len()), "admitted"),
                    ),
                )
            } else if !node_state.unavailable
                && self
                    .can_become_unavailable
                    .is_some_and(|budget| self.newly_unavailable >= budget)
            {
                cluster_wide(
                    WaitCause::MaxUnavailable,
                    format!(
                        "maxUnavailable reached: node {node} would become unavailable, but maxUnavailable={} and {} unavailable{}",
                        self.limit_text.max_unavailable,
                        nodes_are(count(self.unavailable_nodes.len())),
                        more_in_this_round(self.newly_unavailable, "becoming unavailable"),
                    ),
                )
            } else if let Some(hold) =
                self.budgets
                    .limit_hold(&covering, node, node_state.unavailable)
            {
                Some(hold.into())
            } else if let Some(problem) = self
                .capacity
                .enabled
                .then_some(())
                .and(self.capacity.unreadable.as_ref())
            {
                cluster_wide(
                    WaitCause::CapacityUnknown,
                    format!(
                        "checkCapacity could not check whether the pods of {node} fit: {problem}; the next round checks again"
                    ),
                )
            } else if let Some(shortfall) = self.capacity_pool.as_mut().and_then(|pool| {
                // Last: on success the pool keeps the placement, as the request is admitted.
                pool.admit(node, self.capacity.evictions_of(&request.key()))
                    .err()
            }) {
                cluster_wide(WaitCause::InsufficientCapacity, shortfall.describe(node))
            } else {
                if !node_state.unavailable {
                    self.newly_unavailable += 1;
                }
                self.budgets.admit(&covering, node_state.unavailable);
                self.admitted_on_node.insert(node, request.key());
                self.scheduled.push(request.key());
                None
            }
        } else {
            cluster_wide(WaitCause::NodeNotFound, format!("node {node} not found"))
        }
    }
}

/// Every Pending request, in admission order, waiting on a config the scheduler cannot use:
/// nothing is admitted, and each says why in its Pending message, in place of a reason that no
/// longer holds (a slot count under limits that cannot be read).
pub fn waiting_on_config_error(snapshot: &Snapshot, error: &ScheduleError) -> Vec<Waiting> {
    let reason = format!("nothing is admitted until the config is fixed: {error}");
    pending_in_order(
        snapshot,
        &PreferDrainable::default(),
        jiff::Timestamp::UNIX_EPOCH,
    )
    .into_iter()
    .filter(|r| !r.deleting)
    .map(|r| Waiting {
        key: r.key(),
        reason: reason.clone(),
        cause: WaitCause::ConfigError,
        budget: None,
        group: None,
        node_group: r.node_group.as_ref().map(|g| g.name.clone()),
    })
    .collect()
}

/// The Pending requests in admission order ([`Ordering`]); with `preferDrainable`, those whose
/// drain would wait on a budget move behind the others.
fn pending_in_order<'s>(
    snapshot: &'s Snapshot,
    prefer: &PreferDrainable,
    now: jiff::Timestamp,
) -> Vec<&'s RequestState> {
    let order = Ordering::new(&snapshot.requests);
    let mut pending: Vec<&RequestState> = snapshot
        .requests
        .iter()
        .filter(|r| r.is_pending())
        .collect();
    pending.sort_by(|a, b| order.compare(a, b));
    if prefer.enabled {
        // A stable sort: false (keeps its place) before true (moved back).
        pending.sort_by_key(|r| prefer.pass_over(r, now).is_some());
    }
    crate::yielding::order_after_yields(pending)
}

/// A moved-back request that waits for a slot says why it is behind: its drain would wait on a
/// budget (named), and when it takes its plain place again. The slot limit stays in the reason.
fn passed_over(
    hold: Hold,
    request: &RequestState,
    prefer: &PreferDrainable,
    now: jiff::Timestamp,
) -> Hold {
    let Some(blocker) = prefer.pass_over(request, now) else {
        return hold;
    };
    let slot_limit = matches!(
        hold.cause,
        WaitCause::MaxParallelOperations
            | WaitCause::MaxUnavailable
            | WaitCause::MaxGroupsInMaintenance
            | WaitCause::MaxUnavailableGroups
    );
    if !slot_limit {
        return hold;
    }
    let until = prefer
        .ages_at(request)
        .map(|at| format!(" until {at}"))
        .unwrap_or_default();
    Hold {
        cause: WaitCause::DrainBlocked,
        reason: format!(
            "passed over for nodes whose drain can proceed{until}: {blocker} ({})",
            hold.reason
        ),
        ..hold
    }
}

/// Why a request waits, before it is written into [`Waiting`].
#[derive(Clone)]
struct Hold {
    cause: WaitCause,
    reason: String,
    budget: Option<String>,
    group: Option<String>,
    /// The budget's part the hold is about; `None` for the cluster-wide limits.
    scope: Option<BudgetScope>,
    node_group: Option<String>,
}

impl Hold {
    fn cluster_wide(cause: WaitCause, reason: String) -> Hold {
        Hold {
            cause,
            reason,
            budget: None,
            group: None,
            scope: None,
            node_group: None,
        }
    }

    fn of_node_group(cause: WaitCause, reason: String, group: &groups::NodeGroup) -> Hold {
        Hold {
            node_group: Some(group.name.to_string()),
            ..Hold::cluster_wide(cause, reason)
        }
    }
}

impl From<crate::budgets::BudgetHold> for Hold {
    fn from(hold: crate::budgets::BudgetHold) -> Hold {
        Hold {
            cause: hold.cause,
            reason: hold.reason,
            budget: Some(hold.budget),
            group: hold.group,
            scope: Some(hold.scope),
            node_group: None,
        }
    }
}

/// The admission order of step 5: requestors with work in progress first, then requestors with
/// fewer pending requests, then older requests; node name and key make the order total.
struct Ordering<'a> {
    requestors_in_progress: HashSet<&'a str>,
    pending_per_requestor: HashMap<&'a str, usize>,
}

impl<'a> Ordering<'a> {
    fn new(requests: &'a [RequestState]) -> Ordering<'a> {
        let mut requestors_in_progress = HashSet::new();
        let mut pending_per_requestor = HashMap::new();
        for request in requests {
            if !request.is_pending() {
                requestors_in_progress.insert(request.requestor_id.as_str());
            } else if !request.deleting {
                // A request being deleted is going away; it should not push its requestor back.
                *pending_per_requestor
                    .entry(request.requestor_id.as_str())
                    .or_insert(0) += 1;
            }
        }
        Ordering {
            requestors_in_progress,
            pending_per_requestor,
        }
    }

    fn compare(&self, a: &RequestState, b: &RequestState) -> std::cmp::Ordering {
        self.priority(a).cmp(&self.priority(b))
    }

    fn priority<'r>(&self, request: &'r RequestState) -> Priority<'r> {
        let requestor = request.requestor_id.as_str();
        Priority {
            requestor_idle: !self.requestors_in_progress.contains(requestor),
            requestor_pending: self
                .pending_per_requestor
                .get(requestor)
                .copied()
                .unwrap_or(0),
            created_unknown: request.created.is_none(),
            created: request.created,
            node_name: &request.node_name,
            namespace: &request.namespace,
            name: &request.name,
        }
    }
}

/// Sorts ascending: the field order is the precedence of the ordering rules.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Priority<'r> {
    requestor_idle: bool,
    requestor_pending: usize,
    /// Requests without a creation timestamp go last.
    created_unknown: bool,
    created: Option<jiff::Timestamp>,
    node_name: &'r str,
    namespace: &'r str,
    name: &'r str,
}

/// The limits as written and as resolved, for reasons.
struct LimitText {
    max_parallel_operations: String,
    max_unavailable: String,
}

fn count(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod capacity_tests;
#[cfg(test)]
mod fleet_tests;
#[cfg(test)]
mod legacy;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::fixtures::{at, node};
    use k8s_openapi::api::core::v1::{Node, NodeCondition};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use maintenance_crds::{NodeMaintenance, NodeMaintenanceSpec, Phase};

    const NAMESPACE: &str = "team";

    fn node_name(index: usize) -> String {
        format!("node-{index:02}")
    }

    /// `count` nodes; those whose index is in `unavailable` are cordoned or not Ready.
    fn nodes(count: usize, unavailable: &[usize]) -> Vec<NodeState> {
        (0..count)
            .map(|index| NodeState::for_test(&node_name(index), unavailable.contains(&index), &[]))
            .collect()
    }

    fn request(name: &str, node: usize, requestor: &str, phase: Phase) -> RequestState {
        RequestState {
            requestor_id: requestor.to_string(),
            ..RequestState::for_test(name, &node_name(node), phase, 0)
        }
    }

    fn pending(name: &str, node: usize) -> RequestState {
        request(name, node, "upgrade.example.com", Phase::Pending)
    }

    fn limits(
        max_parallel_operations: IntOrString,
        max_unavailable: Option<IntOrString>,
    ) -> Limits {
        Limits {
            max_parallel_operations,
            max_unavailable,
            ..Limits::default()
        }
    }

    fn int(value: i32) -> IntOrString {
        IntOrString::Int(value)
    }

    fn percent(value: &str) -> IntOrString {
        IntOrString::String(value.to_string())
    }

    fn key(name: &str) -> RequestKey {
        RequestKey {
            namespace: NAMESPACE.to_string(),
            name: name.to_string(),
        }
    }

    fn keys(names: &[&str]) -> Vec<RequestKey> {
        names.iter().map(|name| key(name)).collect()
    }

    fn reason_of<'d>(decision: &'d Decision, name: &str) -> &'d str {
        decision
            .waiting
            .iter()
            .find(|w| w.key == key(name))
            .map(|w| w.reason.as_str())
            .unwrap_or_else(|| panic!("{name} is not waiting: {decision:#?}"))
    }

    fn run(nodes: Vec<NodeState>, requests: Vec<RequestState>, limits: &Limits) -> Decision {
        schedule(&Snapshot { nodes, requests }, limits, at(0)).unwrap()
    }

    #[test]
    fn ten_nodes_two_parallel_five_pending_schedules_two() {
        let requests = (0..5).map(|i| pending(&format!("r{i}"), i)).collect();
        let decision = run(nodes(10, &[]), requests, &limits(int(2), Some(int(5))));
        assert_eq!(decision.available_slots, 2);
        assert_eq!(decision.can_become_unavailable, Some(5));
        assert_eq!(decision.scheduled, keys(&["r0", "r1"]));
        assert_eq!(decision.waiting.len(), 3);
        assert_eq!(
            reason_of(&decision, "r2"),
            "no free slot: maxParallelOperations=2 and 0 nodes are in maintenance, 2 more admitted in this round"
        );
    }

    #[test]
    fn two_unavailable_of_ten_leave_room_for_one_more() {
        let requests = (2..5).map(|i| pending(&format!("r{i}"), i)).collect();
        let decision = run(nodes(10, &[0, 1]), requests, &limits(int(5), Some(int(3))));
        assert_eq!(decision.available_slots, 5);
        assert_eq!(decision.can_become_unavailable, Some(1));
        assert_eq!(decision.scheduled, keys(&["r2"]));
        assert_eq!(
            reason_of(&decision, "r3"),
            "maxUnavailable reached: node node-03 would become unavailable, but maxUnavailable=3 \
             and 2 nodes are unavailable, 1 more becoming unavailable in this round"
        );
    }

    #[test]
    fn requests_on_unavailable_nodes_do_not_use_the_unavailable_budget() {
        // Nodes 0 and 1 are unavailable, so maxUnavailable=3 leaves canBecomeUnavailable=1.
        let limits = limits(int(3), Some(int(3)));
        let two_unavailable_one_available = vec![pending("a", 0), pending("b", 1), pending("c", 2)];
        let decision = run(nodes(10, &[0, 1]), two_unavailable_one_available, &limits);
        assert_eq!(decision.available_slots, 3);
        assert_eq!(decision.can_become_unavailable, Some(1));
        assert_eq!(decision.scheduled, keys(&["a", "b", "c"]));

        let three_available = vec![pending("c", 2), pending("d", 3), pending("e", 4)];
        let decision = run(nodes(10, &[0, 1]), three_available, &limits);
        assert_eq!(decision.available_slots, 3);
        assert_eq!(decision.can_become_unavailable, Some(1));
        assert_eq!(decision.scheduled, keys(&["c"]));
        assert_eq!(decision.waiting.len(), 2);
    }

    #[test]
    fn max_unavailable_zero_only_lets_already_unavailable_nodes_proceed() {
        let requests = vec![
            request("in-progress", 1, "fw", Phase::Draining),
            pending("on-cordoned-node", 0),
            pending("on-healthy-node", 2),
        ];
        let decision = run(nodes(4, &[0]), requests, &limits(int(5), Some(int(0))));
        assert_eq!(decision.available_slots, 4);
        assert_eq!(decision.can_become_unavailable, Some(0));
        assert_eq!(decision.scheduled, keys(&["on-cordoned-node"]));
        assert!(
            reason_of(&decision, "on-healthy-node").starts_with("maxUnavailable reached"),
            "{decision:#?}"
        );
    }

    #[test]
    fn percentages_round_up_for_parallel_operations_and_down_for_unavailable() {
        let decision = run(
            nodes(10, &[]),
            vec![],
            &limits(percent("15%"), Some(percent("15%"))),
        );
        assert_eq!(decision.available_slots, 2);
        assert_eq!(decision.can_become_unavailable, Some(1));
    }

    #[test]
    fn percentage_reasons_show_the_resolved_count() {
        let requests = (0..3).map(|i| pending(&format!("r{i}"), i)).collect();
        let decision = run(nodes(10, &[]), requests, &limits(percent("15%"), None));
        assert_eq!(decision.can_become_unavailable, None);
        assert_eq!(
            reason_of(&decision, "r2"),
            "no free slot: maxParallelOperations=15% (2 of 10 nodes) and 0 nodes are in maintenance, \
             2 more admitted in this round"
        );
    }

    #[test]
    fn defaults_allow_one_operation_and_no_unavailable_limit() {
        let defaults = Limits::from_config(None);
        assert_eq!(defaults, limits(int(1), None));
        let requests = vec![pending("a", 0), pending("b", 1)];
        let decision = run(nodes(3, &[]), requests, &defaults);
        assert_eq!(decision.scheduled, keys(&["a"]));
    }

    #[test]
    fn slots_count_nodes_in_maintenance_not_requests() {
        let requests = vec![
            request("first", 0, "a", Phase::Ready),
            request("second", 0, "b", Phase::Cordon),
            pending("next", 1),
        ];
        let decision = run(nodes(3, &[]), requests, &limits(int(2), None));
        assert_eq!(decision.available_slots, 1);
        assert_eq!(decision.scheduled, keys(&["next"]));
    }

    #[test]
    fn a_node_under_maintenance_counts_once_as_unavailable() {
        // Node 0 is cordoned because it is under maintenance: one unavailable node, not two.
        let requests = vec![request("busy", 0, "a", Phase::Ready), pending("next", 1)];
        let decision = run(nodes(3, &[0]), requests, &limits(int(3), Some(int(2))));
        assert_eq!(decision.can_become_unavailable, Some(1));
        assert_eq!(decision.scheduled, keys(&["next"]));
    }

    #[test]
    fn limits_already_exceeded_give_zero_not_an_underflow() {
        let requests = vec![
            request("a", 0, "x", Phase::Ready),
            request("b", 1, "x", Phase::Ready),
            pending("c", 2),
        ];
        let decision = run(nodes(3, &[]), requests, &limits(int(1), Some(int(1))));
        assert_eq!(decision.available_slots, 0);
        assert_eq!(decision.can_become_unavailable, Some(0));
        assert!(decision.scheduled.is_empty());
    }

    #[test]
    fn one_request_per_node_and_the_highest_ordered_wins() {
        let mut older = pending("older", 0);
        older.created = Some(at(-10));
        let decision = run(
            nodes(2, &[]),
            vec![pending("newer", 0), older],
            &limits(int(2), None),
        );
        assert_eq!(decision.scheduled, keys(&["older"]));
        assert_eq!(
            reason_of(&decision, "newer"),
            "node already has a request being admitted: team/older"
        );
    }

    #[test]
    fn requests_whose_node_is_gone_take_no_slot_and_make_nothing_unavailable() {
        struct Case {
            name: &'static str,
            node_count: usize,
            unavailable: &'static [usize],
            requests: Vec<RequestState>,
            limits: Limits,
            available_slots: u32,
            can_become_unavailable: Option<u32>,
            scheduled: &'static [&'static str],
        }
        // Node indexes 7 and 8 are never among the nodes below: their requests point at nothing.
        let cases = [
            Case {
                name: "a request in progress on a gone node frees its slot",
                node_count: 3,
                unavailable: &[],
                requests: vec![
                    request("orphan", 7, "a", Phase::Draining),
                    pending("next", 0),
                ],
                limits: limits(int(1), None),
                available_slots: 1,
                can_become_unavailable: None,
                scheduled: &["next"],
            },
            Case {
                name: "a request in progress on a gone node is not unavailable",
                node_count: 3,
                unavailable: &[],
                requests: vec![request("orphan", 7, "a", Phase::Ready), pending("next", 0)],
                limits: limits(int(5), Some(int(1))),
                available_slots: 5,
                can_become_unavailable: Some(1),
                scheduled: &["next"],
            },
            Case {
                name: "several gone nodes count for nothing",
                node_count: 4,
                unavailable: &[],
                requests: vec![
                    request("orphan-1", 7, "a", Phase::Cordon),
                    request("orphan-2", 8, "a", Phase::RequestorFailed),
                    pending("first", 0),
                    pending("second", 1),
                ],
                limits: limits(int(2), Some(int(2))),
                available_slots: 2,
                can_become_unavailable: Some(2),
                scheduled: &["first", "second"],
            },
            Case {
                name: "a request on an existing node still counts beside one on a gone node",
                node_count: 3,
                unavailable: &[],
                requests: vec![
                    request("orphan", 7, "a", Phase::Draining),
                    request("holder", 1, "a", Phase::Draining),
                    pending("next", 0),
                ],
                limits: limits(int(1), Some(int(1))),
                available_slots: 0,
                can_become_unavailable: Some(0),
                scheduled: &[],
            },
            Case {
                name: "percentages resolve against existing nodes only",
                node_count: 10,
                unavailable: &[],
                requests: vec![
                    request("orphan", 17, "a", Phase::Draining),
                    pending("next", 0),
                ],
                limits: limits(percent("10%"), Some(percent("10%"))),
                available_slots: 1,
                can_become_unavailable: Some(1),
                scheduled: &["next"],
            },
        ];
        for case in cases {
            let decision = run(
                nodes(case.node_count, case.unavailable),
                case.requests,
                &case.limits,
            );
            assert_eq!(
                decision.available_slots, case.available_slots,
                "{}",
                case.name
            );
            assert_eq!(
                decision.can_become_unavailable, case.can_become_unavailable,
                "{}",
                case.name
            );
            assert_eq!(decision.scheduled, keys(case.scheduled), "{}", case.name);
        }
    }

    #[test]
    fn a_pending_request_behind_one_on_a_gone_node_says_the_node_is_gone() {
        let requests = vec![
            request("orphan", 7, "a", Phase::Draining),
            pending("behind", 7),
        ];
        let decision = run(nodes(3, &[]), requests, &limits(int(5), None));
        assert_eq!(reason_of(&decision, "behind"), "node node-07 not found");
    }

    #[test]
    fn rounds_are_spaced_by_four_times_their_cost_up_to_a_cap() {
        assert_eq!(round_gap(Duration::ZERO), Duration::ZERO);
        assert_eq!(
            round_gap(Duration::from_micros(100)),
            Duration::from_micros(400)
        );
        assert_eq!(
            round_gap(Duration::from_millis(3)),
            Duration::from_millis(12)
        );
        // A slow round of a big fleet is followed by four times its cost, too.
        assert_eq!(
            round_gap(Duration::from_millis(11)),
            Duration::from_millis(44)
        );
        assert_eq!(round_gap(Duration::from_millis(40)), MAX_ROUND_GAP);
    }

    /// A round reads again only the nodes that changed: an unchanged one keeps its labels (the
    /// same allocation), a new resourceVersion is read again, and a node gone is forgotten.
    #[test]
    fn node_states_are_read_again_only_when_the_node_changes() {
        let node = |name: &str, version: &str, pool: &str| {
            node(name).version(version).label("pool", pool).build()
        };
        let mut states = NodeStates::default();
        let first = states.observe(&[node("a", "1", "cpu"), node("b", "1", "cpu")]);
        let again = states.observe(&[node("a", "1", "cpu"), node("b", "2", "gpu")]);
        assert!(Arc::ptr_eq(&first[0].labels, &again[0].labels));
        assert_eq!(again[1].labels.get("pool").map(String::as_str), Some("gpu"));
        let cordoned = Node {
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                unschedulable: Some(true),
                ..Default::default()
            }),
            ..node("a", "3", "cpu")
        };
        let changed = states.observe(&[cordoned]);
        assert_eq!(changed.len(), 1);
        assert!(changed[0].unavailable);
        assert_eq!(states.by_name.len(), 1, "b is gone");
    }

    #[test]
    fn a_request_with_an_unknown_ready_reason_or_admitted_on_the_object_takes_a_slot() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        use maintenance_crds::{NodeMaintenanceSpec, NodeMaintenanceStatus};
        let object = |name: &str, node: &str, reason: Option<&str>| NodeMaintenance {
            metadata: ObjectMeta {
                namespace: Some(NAMESPACE.to_string()),
                name: Some(name.to_string()),
                creation_timestamp: Some(Time(at(0))),
                ..ObjectMeta::default()
            },
            spec: NodeMaintenanceSpec {
                requestor_id: "fw.example.com".to_string(),
                node_name: node.to_string(),
                ..NodeMaintenanceSpec::default()
            },
            status: reason.map(|reason| NodeMaintenanceStatus {
                conditions: vec![Condition {
                    type_: "Ready".to_string(),
                    status: "False".to_string(),
                    reason: reason.to_string(),
                    message: String::new(),
                    last_transition_time: Time(at(0)),
                    observed_generation: None,
                }],
                ..NodeMaintenanceStatus::default()
            }),
        };
        let from_a_newer_operator = object("unknown", &node_name(0), Some("Rebooting"));
        let next = object("next", &node_name(1), Some("Pending"));
        let node_objects: Vec<Node> = nodes(2, &[])
            .into_iter()
            .map(|n| Node {
                metadata: ObjectMeta {
                    name: Some(n.name),
                    ..ObjectMeta::default()
                },
                spec: None,
                status: Some(k8s_openapi::api::core::v1::NodeStatus {
                    conditions: Some(vec![NodeCondition {
                        type_: "Ready".to_string(),
                        status: "True".to_string(),
                        ..NodeCondition::default()
                    }]),
                    ..k8s_openapi::api::core::v1::NodeStatus::default()
                }),
            })
            .collect();
        // Admitted by its metadata write alone (no status yet), as after a restart that came
        // between the admission and the first status write.
        let mut admitted_on_the_object = object("admitted", &node_name(0), None);
        admitted_on_the_object.metadata.uid = Some("uid-a".to_string());
        admitted_on_the_object.metadata.finalizers =
            Some(vec![maintenance_crds::FINALIZER.to_string()]);
        admitted_on_the_object.metadata.annotations = Some(
            [(
                maintenance_crds::ADMITTED_UID_ANNOTATION.to_string(),
                "uid-a".to_string(),
            )]
            .into_iter()
            .collect(),
        );
        // Its cleanup done (deleted, finalizer off), it holds nothing.
        let mut released = admitted_on_the_object.clone();
        released.metadata.deletion_timestamp = Some(Time(at(0)));
        released.metadata.finalizers = None;
        let snapshot = Snapshot::from_objects(&node_objects, [&released, &next]);
        let decision = schedule(&snapshot, &limits(int(1), Some(int(1))), at(0)).unwrap();
        assert_eq!(decision.scheduled.len(), 1, "{decision:#?}");
        for holder in [&from_a_newer_operator, &admitted_on_the_object] {
            let snapshot = Snapshot::from_objects(&node_objects, [holder, &next]);
            let decision = schedule(&snapshot, &limits(int(1), Some(int(1))), at(0)).unwrap();
            assert_eq!(decision.available_slots, 0);
            assert_eq!(decision.can_become_unavailable, Some(0));
            assert!(decision.scheduled.is_empty(), "{decision:#?}");
            assert!(
                reason_of(&decision, "next").starts_with("no free slot"),
                "{decision:#?}"
            );
        }
    }

    #[test]
    fn requests_that_cannot_start_say_why() {
        let mut deleting = pending("deleting", 2);
        deleting.deleting = true;
        let requests = vec![
            request("holder", 0, "a", Phase::WaitForPodCompletion),
            pending("behind-holder", 0),
            pending("lost", 7),
            deleting,
        ];
        let decision = run(nodes(3, &[]), requests, &limits(int(5), None));
        assert!(decision.scheduled.is_empty());
        assert_eq!(
            reason_of(&decision, "behind-holder"),
            "node node-00 is under maintenance by team/holder"
        );
        assert_eq!(reason_of(&decision, "lost"), "node node-07 not found");
        assert_eq!(reason_of(&decision, "deleting"), "being deleted");
        assert_eq!(decision.waiting.len(), 3, "only Pending requests wait");
    }

    #[test]
    fn a_request_whose_admission_failed_waits_and_the_next_takes_the_slot() {
        // A is ahead of B in the order; its last admission failed and retries at at(5).
        let mut first = pending("a", 0);
        first.created = Some(at(-10));
        first.admission_retry = Some(AdmissionRetry {
            failures: 2,
            at: at(5),
            error: "admission webhook \"freeze.example.com\" denied the request: frozen"
                .to_string(),
        });
        let snapshot = Snapshot {
            nodes: nodes(2, &[]),
            requests: vec![first, pending("b", 1)],
        };
        let one_slot = limits(int(1), None);

        let before = schedule(&snapshot, &one_slot, at(0)).unwrap();
        assert_eq!(before.scheduled, keys(&["b"]), "{before:#?}");
        let waiting = &before.waiting[0];
        assert_eq!(waiting.key, key("a"));
        assert_eq!(waiting.cause, WaitCause::AdmissionRetry);
        assert_eq!(
            waiting.reason,
            "admission failed 2 times in a row: admission webhook \"freeze.example.com\" \
             denied the request: frozen; next attempt at 2023-11-14T22:13:25Z"
        );
        assert_eq!(before.next_admission_retry, Some(at(5)));

        for retry_time in [at(5), at(6)] {
            let after = schedule(&snapshot, &one_slot, retry_time).unwrap();
            assert_eq!(after.scheduled, keys(&["a"]), "{after:#?}");
            assert_eq!(after.next_admission_retry, None);
        }
    }

    #[test]
    fn a_request_waiting_for_its_retry_behind_a_held_node_sets_no_wake() {
        // Nothing is due at its retry time: the holder's change brings the next round.
        let mut behind = pending("behind", 0);
        behind.admission_retry = Some(AdmissionRetry {
            failures: 1,
            at: at(5),
            error: "boom".to_string(),
        });
        let requests = vec![request("holder", 0, "fw", Phase::Draining), behind];
        let decision = run(nodes(2, &[]), requests, &limits(int(5), None));
        assert_eq!(decision.waiting[0].cause, WaitCause::NodeInMaintenance);
        assert_eq!(decision.next_admission_retry, None);
    }

    #[test]
    fn admission_retries_back_off_from_one_second_to_a_minute() {
        let table = [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 4),
            (4, 8),
            (5, 16),
            (6, 32),
            (7, 60),
            (8, 60),
            (u32::MAX, 60),
        ];
        for (failures, seconds) in table {
            assert_eq!(
                admission_retry_delay(failures),
                Duration::from_secs(seconds),
                "after {failures} failures"
            );
        }
        let first = AdmissionRetry::after_failure(None, "denied".to_string(), at(0));
        assert_eq!((first.failures, first.at), (1, at(1)));
        let third = AdmissionRetry::after_failure(
            Some(&AdmissionRetry::after_failure(
                Some(&first),
                "denied".to_string(),
                at(1),
            )),
            "denied again".to_string(),
            at(3),
        );
        assert_eq!((third.failures, third.at), (3, at(7)));
        assert_eq!(third.error, "denied again");
        assert!(
            third
                .describe()
                .starts_with("admission failed 3 times in a row: denied again;"),
            "{}",
            third.describe()
        );
        let long_winded = AdmissionRetry {
            error: "é".repeat(ADMISSION_ERROR_SHOWN_CHARS + 1),
            ..third
        };
        let shown = format!("{}…;", "é".repeat(ADMISSION_ERROR_SHOWN_CHARS));
        assert!(
            long_winded.describe().contains(&shown),
            "{}",
            long_winded.describe()
        );
    }

    #[test]
    fn a_deleted_request_whose_cleanup_is_done_holds_no_slot() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        use maintenance_crds::{FINALIZER, NodeMaintenanceStatus};
        let object = |name: &str, node: usize, phase: Phase, finalizers: &[&str]| NodeMaintenance {
            metadata: ObjectMeta {
                namespace: Some(NAMESPACE.to_string()),
                name: Some(name.to_string()),
                creation_timestamp: Some(Time(at(0))),
                deletion_timestamp: Some(Time(at(1))),
                finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
                ..ObjectMeta::default()
            },
            spec: NodeMaintenanceSpec {
                requestor_id: "fw.example.com".to_string(),
                node_name: node_name(node),
                ..NodeMaintenanceSpec::default()
            },
            status: Some(NodeMaintenanceStatus {
                conditions: vec![Condition {
                    type_: "Ready".to_string(),
                    status: "False".to_string(),
                    reason: phase.as_str().to_string(),
                    message: String::new(),
                    last_transition_time: Time(at(0)),
                    observed_generation: None,
                }],
                ..NodeMaintenanceStatus::default()
            }),
        };
        const REQUESTORS: &str = "fw.example.com/hold";
        // Deleted while Draining; the node actor uncordoned the node and took our finalizer off,
        // the requestor's keeps the object.
        let done = RequestState::from_request(&object("done", 0, Phase::Draining, &[REQUESTORS]));
        assert!(done.released, "{done:#?}");
        // Still ours to clean up: it holds its node until then.
        let cleaning = RequestState::from_request(&object(
            "cleaning",
            0,
            Phase::Draining,
            &[REQUESTORS, FINALIZER],
        ));
        assert!(!cleaning.released);
        // A deleted Pending request never held anything and is not "released" either.
        assert!(!RequestState::from_request(&object("gone", 1, Phase::Pending, &[])).released);

        let one_slot_none_unavailable = limits(int(1), Some(int(1)));
        let decision = run(
            nodes(2, &[]),
            vec![done, pending("next", 0)],
            &one_slot_none_unavailable,
        );
        assert_eq!(decision.available_slots, 1);
        assert_eq!(decision.can_become_unavailable, Some(1));
        assert_eq!(decision.scheduled, keys(&["next"]), "{decision:#?}");

        let decision = run(
            nodes(2, &[]),
            vec![cleaning, pending("next", 0)],
            &one_slot_none_unavailable,
        );
        assert_eq!(decision.available_slots, 0);
        assert_eq!(decision.waiting[0].cause, WaitCause::NodeInMaintenance);
    }

    #[test]
    fn requestors_with_maintenance_in_progress_go_first() {
        let mut old_idle = request("old-idle", 1, "idle", Phase::Pending);
        old_idle.created = Some(at(-100));
        let requests = vec![
            request("busy-running", 0, "busy", Phase::Ready),
            old_idle,
            request("busy-next", 2, "busy", Phase::Pending),
        ];
        let decision = run(nodes(3, &[]), requests, &limits(int(2), None));
        assert_eq!(decision.scheduled, keys(&["busy-next"]));
        assert!(reason_of(&decision, "old-idle").starts_with("no free slot"));
    }

    #[test]
    fn requestors_with_fewer_pending_requests_go_next() {
        let mut many_1 = request("many-1", 0, "many", Phase::Pending);
        let mut many_2 = request("many-2", 1, "many", Phase::Pending);
        many_1.created = Some(at(-100));
        many_2.created = Some(at(-100));
        let few = request("few", 2, "few", Phase::Pending);
        let decision = run(
            nodes(3, &[]),
            vec![many_1, many_2, few],
            &limits(int(2), None),
        );
        assert_eq!(decision.scheduled, keys(&["few", "many-1"]));
    }

    #[test]
    fn older_requests_go_next_then_node_name_then_name() {
        let mut newest = pending("newest", 0);
        newest.created = Some(at(30));
        let mut oldest = pending("oldest", 4);
        oldest.created = Some(at(-30));
        let mut undated = pending("undated", 1);
        undated.created = None;
        let tie_on_node_3 = pending("a-tie", 3);
        let tie_on_node_2 = pending("z-tie", 2);
        let requests = vec![newest, undated, tie_on_node_3, oldest, tie_on_node_2];
        let decision = run(nodes(5, &[]), requests, &limits(int(5), None));
        assert_eq!(
            decision.scheduled,
            keys(&["oldest", "z-tie", "a-tie", "newest", "undated"])
        );
    }

    #[test]
    fn same_node_name_ties_break_on_namespace_then_name() {
        let mut other_namespace = pending("a", 0);
        other_namespace.namespace = "zz".to_string();
        let decision = run(
            nodes(1, &[]),
            vec![other_namespace, pending("b", 0), pending("a", 0)],
            &limits(int(1), None),
        );
        assert_eq!(decision.scheduled, keys(&["a"]));
        let waiting: Vec<String> = decision.waiting.iter().map(|w| w.key.to_string()).collect();
        assert_eq!(waiting, ["team/b", "zz/a"]);
    }

    #[test]
    fn an_invalid_limit_names_the_field_and_the_config() {
        let error =
            schedule(&Snapshot::default(), &limits(percent("lots"), None), at(0)).unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("MaintenanceOperatorConfig \"default\""),
            "{message}"
        );
        assert!(
            message.contains("maxParallelOperations: \"lots\""),
            "{message}"
        );

        let error =
            schedule(&Snapshot::default(), &limits(int(1), Some(int(-1))), at(0)).unwrap_err();
        assert!(
            error.to_string().contains("maxUnavailable: \"-1\""),
            "{error}"
        );
    }

    #[test]
    fn snapshot_reads_unschedulable_and_ready_from_nodes() {
        let node = |name: &str, unschedulable: Option<bool>, ready: Option<&str>| {
            node(name).unschedulable(unschedulable).ready(ready).build()
        };
        let request = NodeMaintenance {
            metadata: ObjectMeta {
                namespace: Some("ns".to_string()),
                name: Some("fw".to_string()),
                creation_timestamp: Some(Time(at(5))),
                ..ObjectMeta::default()
            },
            spec: NodeMaintenanceSpec {
                requestor_id: "fw.example.com".to_string(),
                node_name: "healthy".to_string(),
                ..NodeMaintenanceSpec::default()
            },
            status: None,
        };
        let nodes = [
            node("healthy", None, Some("True")),
            node("cordoned", Some(true), Some("True")),
            node("not-ready", Some(false), Some("False")),
            node("never-reported", None, None),
        ];
        let snapshot = Snapshot::from_objects(&nodes, [&request]);
        let unavailable: Vec<bool> = snapshot.nodes.iter().map(|n| n.unavailable).collect();
        assert_eq!(unavailable, [false, true, true, true]);
        assert_eq!(
            snapshot.requests,
            [RequestState {
                namespace: "ns".to_string(),
                name: "fw".to_string(),
                node_name: "healthy".to_string(),
                requestor_id: "fw.example.com".to_string(),
                phase: Phase::Pending,
                created: Some(at(5)),
                deleting: false,
                released: false,
                admission_retry: None,
                yielded: None,
                node_group: None,
            }]
        );
    }

    /// A config the scheduler cannot use replaces every waiting request's reason, in order; the
    /// ones being deleted and those past Pending say nothing.
    #[test]
    fn a_config_error_is_every_waiting_requests_reason() {
        let mut deleting = pending("deleting", 2);
        deleting.deleting = true;
        let snapshot = Snapshot {
            nodes: nodes(4, &[]),
            requests: vec![
                pending("b", 1),
                pending("a", 0),
                request("draining", 3, "upgrade.example.com", Phase::Draining),
                deleting,
            ],
        };
        let bad = limits(percent("lots"), None);
        let err = schedule(&snapshot, &bad, at(0)).expect_err("an unreadable limit");
        let waiting = waiting_on_config_error(&snapshot, &err);
        let names: Vec<&str> = waiting.iter().map(|w| w.key.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        for entry in &waiting {
            assert_eq!(entry.cause, WaitCause::ConfigError);
            assert!(
                entry.reason.contains("invalid limit") && entry.reason.contains("lots"),
                "{}",
                entry.reason
            );
        }
    }

    #[test]
    fn wait_cause_labels_are_the_plan_json_names() {
        let labels: BTreeSet<&str> = WaitCause::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            labels.len(),
            WaitCause::ALL.len(),
            "a cause is listed twice"
        );
        for cause in WaitCause::ALL {
            assert_eq!(serde_json::to_value(cause).unwrap(), cause.as_str());
        }
    }

    #[test]
    fn decision_serializes_as_the_plan_json() {
        let decision = Decision {
            available_slots: 1,
            can_become_unavailable: None,
            scheduled: keys(&["a"]),
            waiting: vec![
                Waiting {
                    key: key("b"),
                    reason: "being deleted".to_string(),
                    cause: WaitCause::Deleting,
                    budget: None,
                    group: None,
                    node_group: None,
                },
                Waiting {
                    key: key("c"),
                    reason: "maxGroupsInMaintenance of budget zones reached: ...".to_string(),
                    cause: WaitCause::MaxGroupsInMaintenance,
                    budget: Some("zones".to_string()),
                    group: Some("b".to_string()),
                    node_group: None,
                },
            ],
            maintenance_windows: None,
            blackout: None,
            budgets: Vec::new(),
            capacity: None,
            node_groups: Vec::new(),
            next_window_opening: Some(at(60)),
            next_admission_retry: Some(at(30)),
        };
        assert_eq!(
            serde_json::to_value(&decision).unwrap(),
            serde_json::json!({
                "availableSlots": 1,
                "canBecomeUnavailable": null,
                "scheduled": ["team/a"],
                "waiting": [
                    {"name": "team/b", "reason": "being deleted", "cause": "deleting"},
                    {
                        "name": "team/c",
                        "reason": "maxGroupsInMaintenance of budget zones reached: ...",
                        "cause": "maxGroupsInMaintenance",
                        "budget": "zones",
                        "group": "b",
                    },
                ],
            })
        );
    }

    mod properties {
        use super::*;
        use crate::fixtures::{arb_phase, int_or_percent, resolve_limit};
        use proptest::prelude::*;

        /// The limits and node sets, worked out independently of `schedule`.
        struct Expected {
            available_slots: u32,
            can_become_unavailable: Option<u32>,
            in_maintenance: BTreeSet<String>,
            unavailable: BTreeSet<String>,
            existing: BTreeSet<String>,
        }

        impl Expected {
            fn new(snapshot: &Snapshot, limits: &Limits) -> Expected {
                let total = snapshot.nodes.len() as u64;
                let resolve =
                    |value: &IntOrString, round_up: bool| resolve_limit(value, total, round_up);
                let existing: BTreeSet<String> =
                    snapshot.nodes.iter().map(|n| n.name.clone()).collect();
                let in_maintenance: BTreeSet<String> = snapshot
                    .requests
                    .iter()
                    .filter(|r| {
                        r.phase != Phase::Pending && !r.released && existing.contains(&r.node_name)
                    })
                    .map(|r| r.node_name.clone())
                    .collect();
                let mut unavailable = in_maintenance.clone();
                unavailable.extend(
                    snapshot
                        .nodes
                        .iter()
                        .filter(|n| n.unavailable)
                        .map(|n| n.name.clone()),
                );
                let parallel = resolve(&limits.max_parallel_operations, true);
                let available_slots = parallel.saturating_sub(in_maintenance.len() as u64);
                let can_become_unavailable = limits.max_unavailable.as_ref().map(|value| {
                    resolve(value, false).saturating_sub(unavailable.len() as u64) as u32
                });
                Expected {
                    available_slots: available_slots as u32,
                    can_become_unavailable,
                    in_maintenance,
                    unavailable,
                    existing,
                }
            }

            /// Could the scheduler admit this request at all (at `at(0)`, when the properties
            /// run it), limits aside?
            fn eligible(&self, request: &RequestState) -> bool {
                request.phase == Phase::Pending
                    && !request.deleting
                    && request
                        .admission_retry
                        .as_ref()
                        .is_none_or(|r| r.at <= at(0))
                    && self.existing.contains(&request.node_name)
                    && !self.in_maintenance.contains(&request.node_name)
            }

            /// Would admitting exactly this set respect every limit and one request per node?
            fn fits(&self, admitted: &[&RequestState]) -> bool {
                let nodes: BTreeSet<&str> = admitted.iter().map(|r| r.node_name.as_str()).collect();
                let newly_unavailable = nodes
                    .iter()
                    .filter(|node| !self.unavailable.contains(**node))
                    .count() as u32;
                nodes.len() == admitted.len()
                    && admitted.len() as u32 <= self.available_slots
                    && self
                        .can_become_unavailable
                        .is_none_or(|budget| newly_unavailable <= budget)
                    && admitted.iter().all(|r| self.eligible(r))
            }
        }

        /// The order of step 5, written out again so that the scheduler's own is checked.
        fn priority(
            snapshot: &Snapshot,
            request: &RequestState,
        ) -> (
            bool,
            usize,
            bool,
            Option<jiff::Timestamp>,
            String,
            String,
            String,
        ) {
            let in_progress = snapshot
                .requests
                .iter()
                .any(|r| r.requestor_id == request.requestor_id && r.phase != Phase::Pending);
            let pending = snapshot
                .requests
                .iter()
                .filter(|r| {
                    r.requestor_id == request.requestor_id
                        && r.phase == Phase::Pending
                        && !r.deleting
                })
                .count();
            (
                !in_progress,
                pending,
                request.created.is_none(),
                request.created,
                request.node_name.clone(),
                request.namespace.clone(),
                request.name.clone(),
            )
        }

        fn arb_limits() -> impl Strategy<Value = Limits> {
            (int_or_percent(8), proptest::option::of(int_or_percent(8))).prop_map(
                |(max_parallel_operations, max_unavailable)| Limits {
                    max_parallel_operations,
                    max_unavailable,
                    ..Limits::default()
                },
            )
        }

        fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
            (0usize..10).prop_flat_map(|node_count| {
                let nodes = proptest::collection::vec(proptest::bool::weighted(0.25), node_count);
                // Some requests point at nodes that do not exist; few timestamps, so ties happen.
                let request = (
                    0..node_count + 2,
                    0..3usize,
                    arb_phase(),
                    proptest::option::weighted(0.8, 0..4i64),
                    proptest::bool::weighted(0.1),
                    0..2usize,
                    proptest::bool::ANY,
                    proptest::option::weighted(0.2, -2..3i64),
                );
                let requests = proptest::collection::vec(request, 0..16);
                (nodes, requests).prop_map(|(unavailable, requests)| Snapshot {
                    nodes: unavailable
                        .into_iter()
                        .enumerate()
                        .map(|(index, unavailable)| {
                            NodeState::for_test(&node_name(index), unavailable, &[])
                        })
                        .collect(),
                    requests: requests
                        .into_iter()
                        .enumerate()
                        .map(
                            |(
                                index,
                                (
                                    node,
                                    requestor,
                                    phase,
                                    created,
                                    deleting,
                                    namespace,
                                    cleanup_done,
                                    retry,
                                ),
                            )| {
                                RequestState {
                                    namespace: format!("ns{namespace}"),
                                    name: format!("r{index}"),
                                    node_name: node_name(node),
                                    requestor_id: format!("requestor-{requestor}"),
                                    phase,
                                    created: created.map(at),
                                    deleting,
                                    // As `from_request` can give it: only deleted past Pending.
                                    released: deleting && phase != Phase::Pending && cleanup_done,
                                    admission_retry: retry.map(|seconds| AdmissionRetry {
                                        failures: 1,
                                        at: at(seconds),
                                        error: "denied".to_string(),
                                    }),
                                    yielded: None,
                                    node_group: None,
                                }
                            },
                        )
                        .collect(),
                })
            })
        }

        fn find<'s>(snapshot: &'s Snapshot, key: &RequestKey) -> &'s RequestState {
            snapshot.requests.iter().find(|r| r.key() == *key).unwrap()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            #[test]
            fn admissions_respect_every_limit(snapshot in arb_snapshot(), limits in arb_limits()) {
                let decision = schedule(&snapshot, &limits, at(0)).unwrap();
                let expected = Expected::new(&snapshot, &limits);
                prop_assert_eq!(decision.available_slots, expected.available_slots);
                prop_assert_eq!(free_slots(&snapshot, &limits).unwrap(), decision.available_slots);
                if decision.available_slots == 0 {
                    prop_assert!(decision.scheduled.is_empty(), "no free slot, yet admitted");
                }
                prop_assert_eq!(decision.can_become_unavailable, expected.can_become_unavailable);

                let admitted: Vec<&RequestState> =
                    decision.scheduled.iter().map(|k| find(&snapshot, k)).collect();
                prop_assert!(admitted.len() as u32 <= decision.available_slots);
                let admitted_nodes: BTreeSet<&str> =
                    admitted.iter().map(|r| r.node_name.as_str()).collect();
                prop_assert_eq!(admitted_nodes.len(), admitted.len(), "one request per node");
                let newly_unavailable =
                    admitted_nodes.iter().filter(|n| !expected.unavailable.contains(**n)).count();
                if let Some(budget) = decision.can_become_unavailable {
                    prop_assert!(newly_unavailable as u32 <= budget);
                }
                for request in &admitted {
                    prop_assert_eq!(request.phase, Phase::Pending);
                    prop_assert!(!request.deleting);
                    prop_assert!(!expected.in_maintenance.contains(&request.node_name));
                    prop_assert!(expected.existing.contains(&request.node_name));
                }
            }

            #[test]
            fn every_pending_request_is_scheduled_or_waiting_exactly_once(
                snapshot in arb_snapshot(),
                limits in arb_limits(),
            ) {
                let decision = schedule(&snapshot, &limits, at(0)).unwrap();
                let mut reported: Vec<&RequestKey> = decision
                    .scheduled
                    .iter()
                    .chain(decision.waiting.iter().map(|w| &w.key))
                    .collect();
                reported.sort();
                let mut pending: Vec<RequestKey> = snapshot
                    .requests
                    .iter()
                    .filter(|r| r.phase == Phase::Pending)
                    .map(RequestState::key)
                    .collect();
                pending.sort();
                prop_assert_eq!(reported, pending.iter().collect::<Vec<_>>());
                for waiting in &decision.waiting {
                    prop_assert!(!waiting.reason.is_empty());
                }
            }

            #[test]
            fn admission_follows_the_order(snapshot in arb_snapshot(), limits in arb_limits()) {
                let decision = schedule(&snapshot, &limits, at(0)).unwrap();
                let expected = Expected::new(&snapshot, &limits);
                let admitted: Vec<&RequestState> =
                    decision.scheduled.iter().map(|k| find(&snapshot, k)).collect();
                for pair in admitted.windows(2) {
                    prop_assert!(priority(&snapshot, pair[0]) < priority(&snapshot, pair[1]));
                }
                // A skipped request ordered before an admitted one must have lost for a reason
                // that swapping the two would not cure: the swapped set breaks a limit.
                for waiting in &decision.waiting {
                    let skipped = find(&snapshot, &waiting.key);
                    if !expected.eligible(skipped) {
                        continue;
                    }
                    for later in admitted
                        .iter()
                        .filter(|a| priority(&snapshot, a) > priority(&snapshot, skipped))
                    {
                        let swapped: Vec<&RequestState> = admitted
                            .iter()
                            .copied()
                            .filter(|a| a.key() != later.key())
                            .chain([skipped])
                            .collect();
                        prop_assert!(
                            !expected.fits(&swapped),
                            "{} ({}) was skipped for the later {}", waiting.key, waiting.reason, later.key()
                        );
                    }
                }
            }

            #[test]
            fn nothing_that_fits_is_left_waiting(snapshot in arb_snapshot(), limits in arb_limits()) {
                let decision = schedule(&snapshot, &limits, at(0)).unwrap();
                let expected = Expected::new(&snapshot, &limits);
                let admitted: Vec<&RequestState> =
                    decision.scheduled.iter().map(|k| find(&snapshot, k)).collect();
                prop_assert!(expected.fits(&admitted));
                for waiting in &decision.waiting {
                    let skipped = find(&snapshot, &waiting.key);
                    let mut more = admitted.clone();
                    more.push(skipped);
                    prop_assert!(
                        !expected.fits(&more),
                        "{} waits ({}) although it fits", waiting.key, waiting.reason
                    );
                }
            }
        }
    }
}
#[cfg(test)]
mod yield_tests;
