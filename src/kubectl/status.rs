//! `kubectl maintenance status`: the table of requests, or live progress with `--watch`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use clap::Args;
use futures::StreamExt;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use maintenance_crds::{NodeMaintenance, Phase, condition_type};

use super::board::Board;
use super::view::{RequestView, render_columns, render_table};
use super::{GlobalArgs, Outcome, api_error, connect, human_duration, natural_cmp};

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Follow the requests live: a progress bar per node in progress and one overall (plain
    /// lines when stdout is not a terminal). Ends when every request is Ready, or on Ctrl-C.
    #[arg(short, long)]
    pub watch: bool,

    /// Requests of every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Only the requests of this requestor.
    #[arg(long, value_name = "ID")]
    pub requestor: Option<String>,
}

/// Pending requests shown with their reason, at most this many lines (then a count of the rest).
const MAX_PENDING_LINES: usize = 10;

/// A Pending request and why it waits: the operator's message on its `Ready` condition
/// (`budget zones: ...`, `no free slot: maxParallelOperations=...`, `outside the maintenance
/// windows; ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingReason {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub message: String,
}

/// Why `nm` waits, when it is Pending (not being deleted) and the operator said why. A request the
/// operator has not seen yet has no reason: the table's WAITING FOR column covers it.
fn pending_reason(nm: &NodeMaintenance) -> Option<PendingReason> {
    if nm.phase() != Phase::Pending || nm.is_deleting() {
        return None;
    }
    let ready = nm.condition(condition_type::READY)?;
    // One line, whatever the operator's message looks like.
    let message = ready
        .message
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    (!message.is_empty()).then(|| PendingReason {
        namespace: nm.metadata.namespace.clone().unwrap_or_default(),
        name: nm.metadata.name.clone().unwrap_or_default(),
        node: nm.spec.node_name.clone(),
        message,
    })
}

/// The reasons of the Pending requests among `requests`, in the table's order.
fn pending_reasons<'a>(
    requests: impl Iterator<Item = &'a NodeMaintenance>,
    requestor: Option<&str>,
) -> Vec<PendingReason> {
    let mut reasons: Vec<PendingReason> = requests
        .filter(|nm| requestor.is_none_or(|r| nm.spec.requestor_id == r))
        .filter_map(pending_reason)
        .collect();
    reasons.sort_by(|a, b| {
        a.namespace
            .cmp(&b.namespace)
            .then_with(|| natural_cmp(&a.node, &b.node))
            .then_with(|| a.name.cmp(&b.name))
    });
    reasons
}

/// `… and N more Pending` when more than `cap` reasons are left out.
fn more_line(reasons: &[PendingReason], cap: usize) -> Option<String> {
    (reasons.len() > cap).then(|| format!("… and {} more Pending", reasons.len() - cap))
}

/// The section below the `status` table: a line per Pending request (node, then why it waits),
/// at most `cap`, then how many more. Empty when no Pending request has a reason.
pub fn render_pending(reasons: &[PendingReason], cap: usize) -> String {
    if reasons.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = reasons
        .iter()
        .take(cap)
        .map(|r| vec![format!("  {}", r.node), r.message.clone()])
        .collect();
    let more = more_line(reasons, cap).map_or_else(String::new, |more| format!("  {more}\n"));
    format!("\nWhy Pending:\n{}{more}", render_columns(&rows))
}

/// The note lines of `status --watch`: `node-3 Pending: <why>`, at most `cap`, then how many more.
pub fn pending_notes(reasons: &[PendingReason], cap: usize) -> Vec<String> {
    let mut lines: Vec<String> = reasons
        .iter()
        .take(cap)
        .map(|r| format!("{} Pending: {}", r.node, r.message))
        .collect();
    lines.extend(more_line(reasons, cap));
    lines
}

fn sorted_views<'a>(
    requests: impl Iterator<Item = &'a NodeMaintenance>,
    requestor: Option<&str>,
) -> Vec<RequestView> {
    let mut views: Vec<RequestView> = requests
        .filter(|nm| requestor.is_none_or(|r| nm.spec.requestor_id == r))
        .map(RequestView::of)
        .collect();
    views.sort_by(|a, b| {
        a.namespace
            .cmp(&b.namespace)
            .then_with(|| natural_cmp(&a.node, &b.node))
            .then_with(|| a.name.cmp(&b.name))
    });
    views
}

pub async fn run(global: &GlobalArgs, args: StatusArgs) -> anyhow::Result<Outcome> {
    let (client, namespace) = connect(global).await?;
    let (api, scope): (Api<NodeMaintenance>, String) = if args.all_namespaces {
        (Api::all(client), "any namespace".to_string())
    } else {
        (
            Api::namespaced(client, &namespace),
            format!("namespace {namespace}"),
        )
    };
    let listed = api
        .list(&ListParams::default())
        .await
        .map_err(|err| api_error(err, &format!("list NodeMaintenances in {scope}")))?;
    let views = sorted_views(listed.items.iter(), args.requestor.as_deref());
    if views.is_empty() {
        println!("No NodeMaintenance requests in {scope}.");
        return Ok(Outcome::Success);
    }
    if !args.watch {
        print!("{}", render_table(&views, args.all_namespaces));
        let reasons = pending_reasons(listed.items.iter(), args.requestor.as_deref());
        print!("{}", render_pending(&reasons, MAX_PENDING_LINES));
        return Ok(Outcome::Success);
    }
    let nodes: Vec<String> = views.iter().map(|v| v.node.clone()).collect();
    watch(api, &scope, args.requestor.as_deref(), &nodes).await
}

/// Follows the requests until all are Ready (or none is left), or Ctrl-C.
async fn watch(
    api: Api<NodeMaintenance>,
    scope: &str,
    requestor: Option<&str>,
    nodes: &[String],
) -> anyhow::Result<Outcome> {
    let mut screen = WatchScreen::new(nodes);
    let mut watched = WatchedRequests::default();
    let mut last_error = String::new();
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = &mut ctrl_c => {
                screen.board.finish();
                println!("Stopped watching after {}.", human_duration(screen.started.elapsed()));
                return Ok(Outcome::Success);
            }
        };
        match event {
            None => anyhow::bail!("the watch of NodeMaintenances in {scope} ended; run it again"),
            Some(Err(err)) => {
                let text = err.to_string();
                if text != last_error {
                    screen.board.line(&format!(
                        "warning: watch of NodeMaintenances in {scope}: {text} (retrying)"
                    ));
                    last_error = text;
                }
                continue;
            }
            Some(Ok(event)) => watched.apply(event),
        }
        if !watched.synced {
            continue;
        }
        let views = sorted_views(watched.requests.values(), requestor);
        let Tally {
            ready,
            pending,
            active,
        } = screen.show(&views);
        screen.board.notes(&pending_notes(
            &pending_reasons(watched.requests.values(), requestor),
            MAX_PENDING_LINES,
        ));
        let total = views.len() as u64;
        screen.board.overall(
            ready,
            total,
            format!("Ready · {active} in progress · {pending} Pending"),
        );
        if ready == total {
            screen.board.finish();
            if total == 0 {
                println!("No NodeMaintenance requests left in {scope}.");
            } else {
                println!(
                    "All {total} requests Ready after {}.",
                    human_duration(screen.started.elapsed())
                );
            }
            return Ok(Outcome::Success);
        }
    }
}

/// The requests as the watch shows them, by `namespace/name`.
#[derive(Default)]
struct WatchedRequests {
    requests: BTreeMap<String, NodeMaintenance>,
    /// A relist under way: it replaces `requests` once complete.
    init: Option<BTreeMap<String, NodeMaintenance>>,
    /// The first list was complete: before that, `requests` says nothing.
    synced: bool,
}

impl WatchedRequests {
    fn apply(&mut self, event: watcher::Event<NodeMaintenance>) {
        match event {
            watcher::Event::Init => self.init = Some(BTreeMap::new()),
            watcher::Event::InitApply(nm) => {
                if let Some(buffer) = self.init.as_mut() {
                    buffer.insert(nm.key(), nm);
                }
            }
            watcher::Event::InitDone => {
                if let Some(buffer) = self.init.take() {
                    self.requests = buffer;
                }
                self.synced = true;
            }
            watcher::Event::Apply(nm) => {
                self.requests.insert(nm.key(), nm);
            }
            watcher::Event::Delete(nm) => {
                self.requests.remove(&nm.key());
            }
        }
    }
}

/// The requests of one `status --watch` event, by where they are.
struct Tally {
    ready: u64,
    pending: u64,
    active: u64,
}

/// What `status --watch` shows, and what it showed at the last event.
struct WatchScreen {
    board: Board,
    started: Instant,
    /// Requests whose Ready line was printed.
    reported_ready: BTreeSet<String>,
    /// Requests that had a bar (or line) at the last event.
    shown: BTreeSet<String>,
}

impl WatchScreen {
    fn new(nodes: &[String]) -> WatchScreen {
        WatchScreen {
            board: Board::new(0, nodes.iter().map(String::as_str)),
            started: Instant::now(),
            reported_ready: BTreeSet::new(),
            shown: BTreeSet::new(),
        }
    }

    /// Shows `views`: a bar per request in progress, a line once per request that became Ready;
    /// requests gone or Pending lose their bar.
    fn show(&mut self, views: &[RequestView]) -> Tally {
        let keys: BTreeSet<String> = views
            .iter()
            .map(|v| format!("{}/{}", v.namespace, v.name))
            .collect();
        // Requests gone since the last event lose their bar.
        for key in self.shown.difference(&keys) {
            self.board.node_finished(key, None);
        }
        self.reported_ready.retain(|key| keys.contains(key));
        let mut tally = Tally {
            ready: 0,
            pending: 0,
            active: 0,
        };
        for view in views {
            let key = format!("{}/{}", view.namespace, view.name);
            if view.is_ready() {
                tally.ready += 1;
                if !self.reported_ready.contains(&key) {
                    let line = format!(
                        "✓ {} Ready ({}, after {})",
                        view.node,
                        key,
                        human_duration(self.started.elapsed())
                    );
                    self.board.node_finished(&key, Some(&line));
                    self.reported_ready.insert(key);
                }
                continue;
            }
            self.reported_ready.remove(&key);
            if view.phase == Phase::Pending && !view.deleting {
                tally.pending += 1;
                self.board.node_finished(&key, None);
            } else {
                tally.active += 1;
                self.board
                    .node(&key, &view.node, view.percent(), view.summary());
            }
        }
        self.shown = keys;
        tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use maintenance_crds::{NodeMaintenanceSpec, NodeMaintenanceStatus};

    fn request(node: &str, reason: Option<(&str, &str)>) -> NodeMaintenance {
        let mut nm = NodeMaintenance::new(
            &format!("fw-{node}"),
            NodeMaintenanceSpec {
                requestor_id: "fw.example.com".into(),
                node_name: node.into(),
                ..Default::default()
            },
        );
        nm.metadata.namespace = Some("default".into());
        nm.status = reason.map(|(reason, message)| NodeMaintenanceStatus {
            conditions: vec![Condition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: reason.into(),
                message: message.into(),
                last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..Default::default()
        });
        nm
    }

    #[test]
    fn only_pending_requests_with_a_message_have_a_reason() {
        let mut deleting = request("node-5", Some(("Pending", "no free slot")));
        deleting.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let requests = [
            request(
                "node-10",
                Some(("Pending", "no free slot: maxParallelOperations=2")),
            ),
            request(
                "node-2",
                Some(("Pending", "budget zones: zone-a\n  allows 0 now")),
            ),
            request("node-3", None),
            request("node-4", Some(("Draining", "evicting"))),
            request("node-6", Some(("Pending", ""))),
            deleting,
        ];
        let reasons = pending_reasons(requests.iter(), None);
        let summary: Vec<(&str, &str)> = reasons
            .iter()
            .map(|r| (r.node.as_str(), r.message.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                ("node-2", "budget zones: zone-a allows 0 now"),
                ("node-10", "no free slot: maxParallelOperations=2"),
            ]
        );
        assert!(pending_reasons(requests.iter(), Some("other.example.com")).is_empty());
    }

    #[test]
    fn the_pending_section_names_node_and_reason_and_caps_the_lines() {
        assert_eq!(render_pending(&[], MAX_PENDING_LINES), "");
        let requests: Vec<NodeMaintenance> = (1..=13)
            .map(|i| {
                request(
                    &format!("node-{i}"),
                    Some((
                        "Pending",
                        "outside the maintenance windows; next opens 2026-01-01T02:00:00Z",
                    )),
                )
            })
            .collect();
        let reasons = pending_reasons(requests.iter(), None);
        let section = render_pending(&reasons, 10);
        let lines: Vec<&str> = section.lines().collect();
        assert_eq!(lines[0], "");
        assert_eq!(lines[1], "Why Pending:");
        assert_eq!(
            lines[2],
            "  node-1    outside the maintenance windows; next opens 2026-01-01T02:00:00Z"
        );
        assert!(lines[11].starts_with("  node-10   outside"), "{section}");
        assert_eq!(lines[12], "  … and 3 more Pending");
        assert_eq!(lines.len(), 13, "{section}");

        let notes = pending_notes(&reasons[..2], 10);
        assert_eq!(
            notes,
            [
                "node-1 Pending: outside the maintenance windows; next opens 2026-01-01T02:00:00Z",
                "node-2 Pending: outside the maintenance windows; next opens 2026-01-01T02:00:00Z",
            ]
        );
        let capped = pending_notes(&reasons, 1);
        assert_eq!(capped.len(), 2);
        assert_eq!(capped[1], "… and 12 more Pending");
    }
}
