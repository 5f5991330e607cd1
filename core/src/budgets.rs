//! Budgets (`spec.budgets` of the config): limits for the nodes a label selector picks, on top of
//! the cluster-wide ones, as a whole or per group of nodes that share a label's value.
//!
//! Within a budget (or each of its groups) `maxParallelOperations` and `maxUnavailable` mean what
//! the cluster-wide fields mean, counted over the budget's (group's) nodes only, percentages of
//! those nodes, rounded alike. Across groups, `maxGroupsInMaintenance` bounds the groups with a
//! node in maintenance and `maxUnavailableGroups` the groups with an unavailable node: "one zone
//! at a time". Covered nodes without the `groupByLabel` label form one group of their own, so that
//! a missing label never takes a node out of a budget. Each budget may have maintenance windows
//! of its own (see [`crate::windows`]).

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use maintenance_crds::{Budget, Rounding, resolve_int_or_percent};
use serde::Serialize;

use crate::label_selector::{ParsedSelector, validate_key};
use crate::scheduler::model::{
    NodeState, WaitCause, describe_limit, more_in_this_round, nodes_are,
};
use crate::windows::{WindowState, Windows, describe_time};

/// A budget of the config that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("budget {budget:?}: {problem}")]
pub struct BudgetError {
    pub budget: String,
    pub problem: String,
}

/// Why a budget holds a request back: what the scheduler reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetHold {
    pub cause: WaitCause,
    pub budget: String,
    pub group: Option<String>,
    pub reason: String,
    /// What the hold is about, for a node group that keeps it ([`BudgetScope`]).
    pub scope: BudgetScope,
}

/// The part of a budget a limit counts: one group's nodes (`maxParallelOperations`,
/// `maxUnavailable`; the whole budget without `groupByLabel`), or all its groups
/// (`maxGroupsInMaintenance`, `maxUnavailableGroups`, windows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetScope {
    /// The budget's index in the config.
    pub budget: usize,
    /// The group's key; `None`: every group of the budget.
    pub group: Option<String>,
}

/// One budget's counts as a round found them (before it admitted anything), for `plan` and
/// metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetStatus {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_by_label: Option<String>,
    /// Absent when the budget has no windows of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maintenance_windows: Option<WindowStatus>,
    /// Groups with a node in maintenance, and the limit (`maxGroupsInMaintenance`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups_in_maintenance: Option<GroupCount>,
    /// Groups with an unavailable node, and the limit (`maxUnavailableGroups`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable_groups: Option<GroupCount>,
    /// One entry per group (one for the whole budget without `groupByLabel`), by value.
    pub groups: Vec<GroupStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupCount {
    pub count: u32,
    pub limit: u32,
}

/// Whether a level's windows admit now, and when they open next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowStatus {
    pub open: bool,
    /// When closed: the next opening in RFC 9557 form, e.g.
    /// `2026-03-02T01:00:00+01:00[Europe/Berlin]`; absent when no schedule fires again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_opening: Option<String>,
}

impl WindowStatus {
    /// `None` for a level without windows.
    pub fn of(state: &WindowState) -> Option<WindowStatus> {
        match state {
            WindowState::Unrestricted => None,
            WindowState::Open => Some(WindowStatus {
                open: true,
                next_opening: None,
            }),
            WindowState::Closed { next_opening } => Some(WindowStatus {
                open: false,
                next_opening: next_opening.as_ref().map(ToString::to_string),
            }),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupStatus {
    /// The `groupByLabel` value ("" for nodes without the label); absent without `groupByLabel`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub nodes: u32,
    pub in_maintenance: u32,
    pub unavailable: u32,
    /// maxParallelOperations minus nodes in maintenance; absent when the budget sets no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_slots: Option<u32>,
    /// maxUnavailable minus unavailable nodes; absent when the budget sets no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub can_become_unavailable: Option<u32>,
}

/// Counts of one group (or of a whole budget without `groupByLabel`).
#[derive(Debug, Clone, Default)]
struct Group {
    nodes: u32,
    in_maintenance: u32,
    unavailable: u32,
    /// Admitted in this round.
    admitted: u32,
    /// Admitted in this round on nodes that were available.
    newly_unavailable: u32,
    max_parallel_operations: Option<u32>,
    max_unavailable: Option<u32>,
}

impl Group {
    fn has_maintenance(&self) -> bool {
        self.in_maintenance + self.admitted > 0
    }
    fn has_unavailable(&self) -> bool {
        self.unavailable + self.newly_unavailable > 0
    }
}

struct Book<'a> {
    spec: &'a Budget,
    selector: ParsedSelector,
    windows: WindowState,
    max_groups_in_maintenance: Option<u32>,
    max_unavailable_groups: Option<u32>,
    /// By `groupByLabel` value; the single key "" without `groupByLabel`.
    groups: BTreeMap<String, Group>,
}

impl Book<'_> {
    fn name(&self) -> &str {
        &self.spec.name
    }

    fn group_by(&self) -> Option<&str> {
        self.spec.group_by_label.as_deref()
    }

    /// The group a covered node belongs to.
    fn group_of(&self, node: &NodeState) -> String {
        self.group_by()
            .and_then(|label| node.labels.get(label))
            .cloned()
            .unwrap_or_default()
    }

    /// ` (topology.kubernetes.io/zone=a)`, or nothing without `groupByLabel`.
    fn group_suffix(&self, group: &str) -> String {
        self.group_by()
            .map(|label| format!(" ({})", group_text(label, group)))
            .unwrap_or_default()
    }

    fn group_field(&self, group: &str) -> Option<String> {
        self.group_by().map(|_| group.to_string())
    }

    fn groups_where(&self, has: impl Fn(&Group) -> bool) -> Vec<&str> {
        self.groups
            .iter()
            .filter(|(_, g)| has(g))
            .map(|(name, _)| name.as_str())
            .collect()
    }

    fn hold(&self, index: usize, cause: WaitCause, group: &str, reason: String) -> BudgetHold {
        let one_group = matches!(
            cause,
            WaitCause::MaxParallelOperations | WaitCause::MaxUnavailable
        );
        BudgetHold {
            cause,
            budget: self.name().to_string(),
            group: self.group_field(group),
            reason,
            scope: BudgetScope {
                budget: index,
                group: one_group.then(|| group.to_string()),
            },
        }
    }
}

/// `topology.kubernetes.io/zone=a`; `<none>` stands for nodes without the label.
fn group_text(label: &str, group: &str) -> String {
    if group.is_empty() {
        format!("{label}=<none>")
    } else {
        format!("{label}={group}")
    }
}

/// ` (a, b and 3 more)`: the groups named in a reason, bounded so a message stays short; nothing
/// for no group.
fn list_groups(groups: &[&str]) -> String {
    const SHOWN: usize = 3;
    if groups.is_empty() {
        return String::new();
    }
    let shown: Vec<&str> = groups
        .iter()
        .take(SHOWN)
        .map(|g| if g.is_empty() { "<none>" } else { g })
        .collect();
    let mut text = shown.join(", ");
    if groups.len() > SHOWN {
        text.push_str(&format!(" and {} more", groups.len() - SHOWN));
    }
    format!(" ({text})")
}

fn groups_have(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 group has {what}")
    } else {
        format!("{n} groups have {what}")
    }
}

/// The budgets of one round: who covers which node, what is used, and what each admission uses.
pub struct Budgets<'a> {
    books: Vec<Book<'a>>,
}

/// The budgets and groups that cover one node: indexes into the round's budgets.
pub struct Covering(Vec<(usize, String)>);

impl Covering {
    /// Whether this node counts against `scope`.
    pub fn includes(&self, scope: &BudgetScope) -> bool {
        self.0.iter().any(|(index, key)| {
            *index == scope.budget && scope.group.as_ref().is_none_or(|group| group == key)
        })
    }
}

impl<'a> Budgets<'a> {
    /// Reads the budgets and counts, per group, the existing nodes, those in maintenance and
    /// those unavailable (in maintenance, unschedulable or not Ready).
    pub fn new(
        specs: &'a [Budget],
        nodes: &[NodeState],
        in_maintenance: impl Fn(&str) -> bool,
        unavailable: impl Fn(&str) -> bool,
        now: Timestamp,
    ) -> Result<Budgets<'a>, BudgetError> {
        let mut books = Vec::with_capacity(specs.len());
        for (index, spec) in specs.iter().enumerate() {
            let error = |problem: String| BudgetError {
                budget: spec.name.clone(),
                problem,
            };
            // The CRD keeps names unique; YAML given to `plan` is not checked by an API server.
            if specs[..index].iter().any(|other| other.name == spec.name) {
                return Err(error(
                    "the name is used by two budgets; give each a name of its own".into(),
                ));
            }
            let selector = match &spec.node_selector {
                Some(selector) => ParsedSelector::from_label_selector(selector)
                    .map_err(|problem| error(format!("nodeSelector: {problem}")))?,
                None => ParsedSelector::default(),
            };
            if let Some(label) = &spec.group_by_label {
                validate_key(label)
                    .map_err(|e| error(format!("groupByLabel: label key '{label}' {e}")))?;
            }
            let count = |field: &str, value: Option<i32>| {
                value
                    .map(|v| {
                        u32::try_from(v).map_err(|_| error(format!("{field}: {v} is negative")))
                    })
                    .transpose()
            };
            let max_groups_in_maintenance =
                count("maxGroupsInMaintenance", spec.max_groups_in_maintenance)?;
            let max_unavailable_groups =
                count("maxUnavailableGroups", spec.max_unavailable_groups)?;
            if spec.group_by_label.is_none()
                && (max_groups_in_maintenance.is_some() || max_unavailable_groups.is_some())
            {
                return Err(error(
                    "maxGroupsInMaintenance and maxUnavailableGroups count groups: set groupByLabel too"
                        .into(),
                ));
            }
            let windows = Windows::parse(spec.maintenance_windows.as_deref().unwrap_or_default())
                .map_err(|e| error(e.to_string()))?;
            // Resolved once against no nodes, so that a malformed value is reported even when
            // the budget selects nothing.
            resolve_limits(spec, 0).map_err(error)?;
            books.push(Book {
                spec,
                selector,
                windows: windows.state(now),
                max_groups_in_maintenance,
                max_unavailable_groups,
                groups: BTreeMap::new(),
            });
        }
        for node in nodes {
            let maintained = in_maintenance(&node.name);
            let down = maintained || unavailable(&node.name);
            for book in &mut books {
                if !book.selector.matches(Some(&node.labels)) {
                    continue;
                }
                let key = book.group_of(node);
                let group = book.groups.entry(key).or_default();
                group.nodes += 1;
                group.in_maintenance += u32::from(maintained);
                group.unavailable += u32::from(down);
            }
        }
        for book in &mut books {
            for group in book.groups.values_mut() {
                // Checked above against 0 nodes: the same values resolve for any count.
                let (parallel, unavailable) =
                    resolve_limits(book.spec, group.nodes).unwrap_or_default();
                group.max_parallel_operations = parallel;
                group.max_unavailable = unavailable;
            }
        }
        Ok(Budgets { books })
    }

    /// The budgets (and their groups) that select `node`.
    pub fn covering(&self, node: &NodeState) -> Covering {
        Covering(
            self.books
                .iter()
                .enumerate()
                .filter(|(_, book)| book.selector.matches(Some(&node.labels)))
                .map(|(index, book)| (index, book.group_of(node)))
                .collect(),
        )
    }

    /// The first covering budget whose windows are closed.
    pub fn window_hold(&self, covering: &Covering) -> Option<BudgetHold> {
        covering.0.iter().find_map(|(index, group)| {
            let book = &self.books[*index];
            match &book.windows {
                WindowState::Closed { next_opening } => Some(book.hold(
                    *index,
                    WaitCause::MaintenanceWindows,
                    group,
                    outside_windows(Some(book.name()), next_opening.as_ref()),
                )),
                _ => None,
            }
        })
    }

    /// The first limit of a covering budget that admitting a request on `node` would exceed.
    pub fn limit_hold(
        &self,
        covering: &Covering,
        node: &str,
        node_unavailable: bool,
    ) -> Option<BudgetHold> {
        covering.0.iter().find_map(|(index, key)| {
            let book = &self.books[*index];
            // Every covered node was counted into its group when the round began.
            let group = book.groups.get(key)?;
            let suffix = book.group_suffix(key);
            if let Some(max) = group.max_parallel_operations
                && group.in_maintenance + group.admitted >= max
            {
                return Some(book.hold(
                    *index,
                    WaitCause::MaxParallelOperations,
                    key,
                    format!(
                        "no free slot in budget {}{suffix}: maxParallelOperations={} and {} in maintenance{}",
                        book.name(),
                        limit_text(book.spec.max_parallel_operations.as_ref(), max, group.nodes),
                        nodes_are(group.in_maintenance),
                        more_in_this_round(group.admitted, "admitted"),
                    ),
                ));
            }
            if let Some(max) = group.max_unavailable
                && !node_unavailable
                && group.unavailable + group.newly_unavailable >= max
            {
                return Some(book.hold(
                    *index,
                    WaitCause::MaxUnavailable,
                    key,
                    format!(
                        "maxUnavailable of budget {}{suffix} reached: node {node} would become unavailable, but maxUnavailable={} and {} unavailable{}",
                        book.name(),
                        limit_text(book.spec.max_unavailable.as_ref(), max, group.nodes),
                        nodes_are(group.unavailable),
                        more_in_this_round(group.newly_unavailable, "becoming unavailable"),
                    ),
                ));
            }
            let label = book.group_by().unwrap_or_default();
            if let Some(max) = book.max_groups_in_maintenance
                && !group.has_maintenance()
            {
                let busy = book.groups_where(Group::has_maintenance);
                if busy.len() >= max as usize {
                    return Some(book.hold(
                        *index,
                        WaitCause::MaxGroupsInMaintenance,
                        key,
                        format!(
                            "maxGroupsInMaintenance of budget {} reached: node {node} is in {}, but maxGroupsInMaintenance={max} and {}{}",
                            book.name(),
                            group_text(label, key),
                            groups_have(busy.len(), "nodes in maintenance"),
                            list_groups(&busy),
                        ),
                    ));
                }
            }
            if let Some(max) = book.max_unavailable_groups
                && !node_unavailable
                && !group.has_unavailable()
            {
                let down = book.groups_where(Group::has_unavailable);
                if down.len() >= max as usize {
                    return Some(book.hold(
                        *index,
                        WaitCause::MaxUnavailableGroups,
                        key,
                        format!(
                            "maxUnavailableGroups of budget {} reached: node {node} is in {}, but maxUnavailableGroups={max} and {}{}",
                            book.name(),
                            group_text(label, key),
                            groups_have(down.len(), "unavailable nodes"),
                            list_groups(&down),
                        ),
                    ));
                }
            }
            None
        })
    }

    /// Records an admission on a node with this covering.
    pub fn admit(&mut self, covering: &Covering, node_unavailable: bool) {
        for (index, key) in &covering.0 {
            if let Some(group) = self.books[*index].groups.get_mut(key) {
                group.admitted += 1;
                group.newly_unavailable += u32::from(!node_unavailable);
            }
        }
    }

    /// Undoes [`Budgets::admit`]: a node group that did not fit as a whole gives back what its
    /// first requests took.
    pub fn unadmit(&mut self, covering: &Covering, node_unavailable: bool) {
        for (index, key) in &covering.0 {
            if let Some(group) = self.books[*index].groups.get_mut(key) {
                group.admitted = group.admitted.saturating_sub(1);
                group.newly_unavailable = group
                    .newly_unavailable
                    .saturating_sub(u32::from(!node_unavailable));
            }
        }
    }

    /// Why a node group whose nodes have these coverings can never be admitted together under
    /// the budgets, however many of their nodes are free: a limit smaller than the group's nodes
    /// it covers. `None` when every limit could hold the group.
    pub fn group_cannot_fit<'c>(
        &self,
        coverings: impl IntoIterator<Item = &'c Covering>,
    ) -> Option<String> {
        // Per budget: the group's nodes in each of the budget's groups.
        let mut per_budget: BTreeMap<usize, BTreeMap<&str, u32>> = BTreeMap::new();
        for covering in coverings {
            for (index, key) in &covering.0 {
                *per_budget
                    .entry(*index)
                    .or_default()
                    .entry(key.as_str())
                    .or_default() += 1;
            }
        }
        per_budget.into_iter().find_map(|(index, counts)| {
            let book = &self.books[index];
            let over = |limit: &str, allows: String, max: u32, needed: u32| {
                (needed > max).then(|| {
                    format!(
                        "budget {} allows {allows} ({limit}={max}), {} fewer than the node group needs",
                        book.name(),
                        needed - max
                    )
                })
            };
            let spanned = u32::try_from(counts.len()).unwrap_or(u32::MAX);
            counts
                .iter()
                .find_map(|(key, needed)| {
                    let group = book.groups.get(*key)?;
                    let suffix = book.group_suffix(key);
                    group
                        .max_parallel_operations
                        .and_then(|max| {
                            over(
                                "maxParallelOperations",
                                format!("{max} nodes{suffix} in maintenance at once"),
                                max,
                                *needed,
                            )
                        })
                        .or_else(|| {
                            group.max_unavailable.and_then(|max| {
                                over(
                                    "maxUnavailable",
                                    format!("{max} unavailable nodes{suffix}"),
                                    max,
                                    *needed,
                                )
                            })
                        })
                })
                .or_else(|| {
                    book.max_groups_in_maintenance.and_then(|max| {
                        over(
                            "maxGroupsInMaintenance",
                            format!("{max} of its groups in maintenance at once"),
                            max,
                            spanned,
                        )
                    })
                })
                .or_else(|| {
                    book.max_unavailable_groups.and_then(|max| {
                        over(
                            "maxUnavailableGroups",
                            format!("{max} of its groups with unavailable nodes"),
                            max,
                            spanned,
                        )
                    })
                })
        })
    }

    /// The earliest opening of a budget's closed windows.
    pub fn next_window_opening(&self) -> Option<Timestamp> {
        self.books
            .iter()
            .filter_map(|book| match &book.windows {
                WindowState::Closed {
                    next_opening: Some(at),
                } => Some(at.timestamp()),
                _ => None,
            })
            .min()
    }

    /// Every budget as the round found it, before admissions.
    pub fn status(&self) -> Vec<BudgetStatus> {
        self.books
            .iter()
            .map(|book| {
                let count_groups = |limit: Option<u32>, has: fn(&Group) -> bool| {
                    limit.map(|limit| GroupCount {
                        count: u32::try_from(book.groups.values().filter(|g| has(g)).count())
                            .unwrap_or(u32::MAX),
                        limit,
                    })
                };
                BudgetStatus {
                    name: book.name().to_string(),
                    group_by_label: book.spec.group_by_label.clone(),
                    maintenance_windows: WindowStatus::of(&book.windows),
                    groups_in_maintenance: count_groups(book.max_groups_in_maintenance, |g| {
                        g.in_maintenance > 0
                    }),
                    unavailable_groups: count_groups(book.max_unavailable_groups, |g| {
                        g.unavailable > 0
                    }),
                    groups: book
                        .groups
                        .iter()
                        .map(|(key, group)| GroupStatus {
                            group: book.group_field(key),
                            nodes: group.nodes,
                            in_maintenance: group.in_maintenance,
                            unavailable: group.unavailable,
                            available_slots: group
                                .max_parallel_operations
                                .map(|max| max.saturating_sub(group.in_maintenance)),
                            can_become_unavailable: group
                                .max_unavailable
                                .map(|max| max.saturating_sub(group.unavailable)),
                        })
                        .collect(),
                }
            })
            .collect()
    }
}

/// The budget's two node limits resolved against `nodes` covered nodes.
fn resolve_limits(spec: &Budget, nodes: u32) -> Result<(Option<u32>, Option<u32>), String> {
    let resolve = |field: &'static str, value: Option<&IntOrString>, rounding| {
        value
            .map(|value| resolve_int_or_percent(field, value, nodes, rounding))
            .transpose()
            .map_err(|e| e.to_string())
    };
    Ok((
        resolve(
            "maxParallelOperations",
            spec.max_parallel_operations.as_ref(),
            Rounding::Up,
        )?,
        resolve(
            "maxUnavailable",
            spec.max_unavailable.as_ref(),
            Rounding::Down,
        )?,
    ))
}

fn limit_text(value: Option<&IntOrString>, resolved: u32, nodes: u32) -> String {
    match value {
        Some(value) => describe_limit(value, resolved, nodes),
        None => resolved.to_string(),
    }
}

/// Why a request waits for a window, cluster-wide (`budget` None) or a budget's.
pub fn outside_windows(budget: Option<&str>, next_opening: Option<&jiff::Zoned>) -> String {
    let whose = budget
        .map(|name| format!(" of budget {name}"))
        .unwrap_or_default();
    match next_opening {
        Some(at) => format!(
            "outside the maintenance windows{whose}: the next opens at {}",
            describe_time(at)
        ),
        None => format!(
            "outside the maintenance windows{whose}, and none of their schedules fires again: fix maintenanceWindows"
        ),
    }
}
