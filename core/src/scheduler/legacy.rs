//! The scheduler as it was before budgets and maintenance windows, verbatim but for its name and
//! return type: the oracle for "with none of the new fields set, decisions equal today's".
//! Do not edit it to follow changes of the scheduler: it is the old behaviour on purpose.

use super::*;

/// The old `Decision`: waiting requests had a reason only.
#[derive(Debug, PartialEq, Eq)]
pub struct LegacyDecision {
    pub available_slots: u32,
    pub can_become_unavailable: Option<u32>,
    pub scheduled: Vec<RequestKey>,
    pub waiting: Vec<(RequestKey, String)>,
}

pub fn legacy_schedule(
    snapshot: &Snapshot,
    limits: &Limits,
) -> Result<LegacyDecision, ScheduleError> {
    let total_nodes = count(snapshot.nodes.len());
    let max_parallel_operations = resolve_int_or_percent(
        MAX_PARALLEL_OPERATIONS_FIELD,
        &limits.max_parallel_operations,
        total_nodes,
        Rounding::Up,
    )
    .map_err(ScheduleError::InvalidLimit)?;
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
    // Node -> the request holding it (the smallest key, so that reasons are stable). A request
    // whose Node is gone holds nothing: there is no node left to keep unavailable, and its node
    // actor only releases it (docs/architecture.md, Request lifecycle; NVIDIA's preSchedule in
    // internal/controller/nodemaintenancescheduler_controller.go counts only existing nodes).
    let mut in_maintenance: BTreeMap<&str, &RequestState> = BTreeMap::new();
    for request in snapshot
        .requests
        .iter()
        .filter(|r| !r.is_pending() && existing_nodes.contains_key(r.node_name.as_str()))
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

    let nodes_in_maintenance = count(in_maintenance.len());
    let available_slots = max_parallel_operations.saturating_sub(nodes_in_maintenance);
    let can_become_unavailable =
        max_unavailable.map(|limit| limit.saturating_sub(count(unavailable_nodes.len())));

    let order = Ordering::new(&snapshot.requests);
    let mut pending: Vec<&RequestState> = snapshot
        .requests
        .iter()
        .filter(|r| r.is_pending())
        .collect();
    pending.sort_by(|a, b| order.compare(a, b));

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

    let mut scheduled = Vec::new();
    let mut waiting = Vec::new();
    // Node -> the request admitted on it in this round.
    let mut admitted_on_node: HashMap<&str, RequestKey> = HashMap::new();
    let mut newly_unavailable: u32 = 0;
    for request in pending {
        let node = request.node_name.as_str();
        let reason = if request.deleting {
            Some("being deleted".to_string())
        } else if let Some(holder) = in_maintenance.get(node) {
            Some(format!(
                "node {node} is under maintenance by {}",
                holder.key()
            ))
        } else if let Some(node_state) = existing_nodes.get(node) {
            if let Some(winner) = admitted_on_node.get(node) {
                Some(format!(
                    "node already has a request being admitted: {winner}"
                ))
            } else if count(scheduled.len()) >= available_slots {
                Some(format!(
                    "no free slot: maxParallelOperations={} and {} in maintenance{}",
                    limit_text.max_parallel_operations,
                    nodes_are(nodes_in_maintenance),
                    more_in_this_round(count(scheduled.len()), "admitted"),
                ))
            } else if !node_state.unavailable
                && can_become_unavailable.is_some_and(|budget| newly_unavailable >= budget)
            {
                Some(format!(
                    "maxUnavailable reached: node {node} would become unavailable, but maxUnavailable={} and {} unavailable{}",
                    limit_text.max_unavailable,
                    nodes_are(count(unavailable_nodes.len())),
                    more_in_this_round(newly_unavailable, "becoming unavailable"),
                ))
            } else {
                if !node_state.unavailable {
                    newly_unavailable += 1;
                }
                admitted_on_node.insert(node, request.key());
                scheduled.push(request.key());
                None
            }
        } else {
            Some(format!("node {node} not found"))
        };
        if let Some(reason) = reason {
            waiting.push((request.key(), reason));
        }
    }

    Ok(LegacyDecision {
        available_slots,
        can_become_unavailable,
        scheduled,
        waiting,
    })
}
