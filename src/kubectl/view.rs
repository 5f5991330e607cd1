//! What a person wants to know about one request, read from its status: the phase, the drain's
//! progress, and what it waits for right now.

use maintenance_crds::{NodeMaintenance, Phase, condition_type};

/// One request as the table and the progress bars show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestView {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub requestor: String,
    pub phase: Phase,
    /// The status of the `Ready` condition, `-` before the operator has seen the request.
    pub ready: String,
    /// The reason and message of the `Failed` condition, when the operator gave up a step.
    pub failed: Option<(String, String)>,
    pub deleting: bool,
    /// `(percent, evicted, to evict)` once a drain has started.
    pub drain: Option<(i32, i32, i32)>,
    /// What the request waits for now, `-` when nothing.
    pub waiting_for: String,
}

/// Shown when a list names more items than fit in a cell.
fn and_more(first: &str, total: usize) -> String {
    if total > 1 {
        format!("{first} (+{} more)", total - 1)
    } else {
        first.to_string()
    }
}

impl RequestView {
    pub fn of(nm: &NodeMaintenance) -> RequestView {
        let status = nm.status.as_ref();
        let drain = status.and_then(|s| s.drain.as_ref());
        let phase = nm.phase();
        let deleting = nm.is_deleting();
        let additional = nm.spec.additional_requestors();
        let waiting_for = if deleting {
            if additional.is_empty() {
                "release: the operator uncordons the node".to_string()
            } else {
                format!(
                    "release: additionalRequestors {} must be removed first",
                    additional.join(", ")
                )
            }
        } else {
            match phase {
                Phase::Pending => {
                    "admission (`kubectl maintenance plan` says why it waits)".to_string()
                }
                Phase::WaitForPodCompletion => match status {
                    Some(s) if !s.wait_for_completion.is_empty() => format!(
                        "{} to complete",
                        and_more(&s.wait_for_completion[0], s.wait_for_completion.len())
                    ),
                    _ => "pods to complete".to_string(),
                },
                Phase::Draining => match drain {
                    Some(d) if !d.blocked.is_empty() => {
                        let first = &d.blocked[0];
                        and_more(
                            &format!("{} ({})", first.pod, first.reason),
                            d.blocked.len(),
                        )
                    }
                    Some(d) if !d.wait_for_eviction.is_empty() => format!(
                        "eviction of {}",
                        and_more(&d.wait_for_eviction[0], d.wait_for_eviction.len())
                    ),
                    _ => "eviction".to_string(),
                },
                Phase::Scheduled | Phase::Cordon => "the operator".to_string(),
                Phase::Ready => "the requestor: the node is ready for maintenance".to_string(),
                Phase::RequestorFailed => "the requestor, who reported a failure".to_string(),
            }
        };
        RequestView {
            namespace: nm.metadata.namespace.clone().unwrap_or_default(),
            name: nm.metadata.name.clone().unwrap_or_default(),
            node: nm.spec.node_name.clone(),
            requestor: nm.spec.requestor_id.clone(),
            phase,
            ready: nm
                .condition(condition_type::READY)
                .map_or_else(|| "-".to_string(), |c| c.status.clone()),
            failed: nm
                .condition(condition_type::FAILED)
                .filter(|c| c.status == "True")
                .map(|c| (c.reason.clone(), c.message.clone())),
            deleting,
            drain: drain.map(|d| {
                let remaining = i32::try_from(d.wait_for_eviction.len()).unwrap_or(i32::MAX);
                (
                    d.drain_progress,
                    (d.eviction_pods - remaining).max(0),
                    d.eviction_pods,
                )
            }),
            waiting_for,
        }
    }

    /// Ready for the requestor's work: the `Ready` condition is True and nobody is deleting it.
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready && self.ready == "True" && !self.deleting
    }

    /// How far the request is, 0 to 100, for a progress bar: the drain fills most of it.
    pub fn percent(&self) -> u64 {
        let drain = self.drain.map_or(0, |(p, _, _)| p.clamp(0, 100)) as u64;
        match self.phase {
            Phase::Pending => 0,
            Phase::Scheduled => 5,
            Phase::Cordon => 10,
            Phase::WaitForPodCompletion => 15,
            Phase::Draining => 20 + drain * 79 / 100,
            Phase::Ready | Phase::RequestorFailed => 100,
        }
    }

    /// `40% 2/5`, or `-` before a drain.
    pub fn drain_cell(&self) -> String {
        match self.drain {
            Some((percent, evicted, total)) => format!("{percent}% {evicted}/{total}"),
            None => "-".to_string(),
        }
    }

    /// One line about the request's state, for a progress bar or a log line.
    pub fn summary(&self) -> String {
        let mut out = self.phase.to_string();
        if self.deleting {
            out = format!("{out}, releasing");
        }
        if let (Phase::Draining, Some((percent, evicted, total))) = (self.phase, self.drain) {
            out.push_str(&format!(" {percent}% ({evicted}/{total} pods)"));
        }
        if self.phase != Phase::Ready || self.deleting {
            out.push_str(&format!(": waiting for {}", self.waiting_for));
        }
        if let Some((reason, message)) = &self.failed {
            out.push_str(&format!(" [Failed: {reason}: {message}]"));
        }
        out
    }
}

/// Left-aligned columns separated by three spaces; the last column is not padded.
pub fn render_columns(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|row| row.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}   ", width = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The `status` table; `with_namespace` adds the NAMESPACE column (for `-A`).
pub fn render_table(views: &[RequestView], with_namespace: bool) -> String {
    let mut header = vec![
        "NAME",
        "NODE",
        "REQUESTOR",
        "PHASE",
        "READY",
        "FAILED",
        "DRAIN",
        "WAITING FOR",
    ];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    let mut rows = vec![header.into_iter().map(str::to_string).collect::<Vec<_>>()];
    for view in views {
        let phase = if view.deleting {
            format!("{} (releasing)", view.phase)
        } else {
            view.phase.to_string()
        };
        let mut row = vec![
            view.name.clone(),
            view.node.clone(),
            view.requestor.clone(),
            phase,
            view.ready.clone(),
            view.failed
                .as_ref()
                .map_or_else(|| "-".to_string(), |(reason, _)| reason.clone()),
            view.drain_cell(),
            if view.phase == Phase::Ready && !view.deleting {
                "-".to_string()
            } else {
                view.waiting_for.clone()
            },
        ];
        if with_namespace {
            row.insert(0, view.namespace.clone());
        }
        rows.push(row);
    }
    render_columns(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use maintenance_crds::{BlockedPod, DrainStatus, NodeMaintenanceSpec, NodeMaintenanceStatus};

    fn condition(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: "drain timed out: team/db-0 is blocked".into(),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    fn request(phase: Option<&str>, drain: Option<DrainStatus>) -> NodeMaintenance {
        let mut nm = NodeMaintenance::new(
            "fw-node-1",
            NodeMaintenanceSpec {
                requestor_id: "fw.example.com".into(),
                node_name: "node-1".into(),
                ..Default::default()
            },
        );
        nm.metadata.namespace = Some("default".into());
        nm.status = phase.map(|phase| NodeMaintenanceStatus {
            conditions: vec![condition(
                "Ready",
                if phase == "Ready" { "True" } else { "False" },
                phase,
            )],
            drain,
            ..Default::default()
        });
        nm
    }

    #[test]
    fn a_draining_request_names_its_first_blocked_pod() {
        let drain = DrainStatus {
            total_pods: 6,
            eviction_pods: 5,
            drain_progress: 40,
            wait_for_eviction: vec!["team/db-0".into(), "team/web-1".into(), "x/y".into()],
            blocked: vec![
                BlockedPod {
                    pod: "team/db-0".into(),
                    reason: "PDB".into(),
                    message: "PodDisruptionBudget team/db allows no disruption now".into(),
                },
                BlockedPod {
                    pod: "x/y".into(),
                    reason: "NeedsForce".into(),
                    message: String::new(),
                },
            ],
            ..DrainStatus::default()
        };
        let mut nm = request(Some("Draining"), Some(drain));
        if let Some(status) = nm.status.as_mut() {
            status
                .conditions
                .push(condition("Failed", "True", "DrainTimeout"));
        }
        let view = RequestView::of(&nm);
        assert_eq!(view.phase, Phase::Draining);
        assert_eq!(view.drain, Some((40, 2, 5)));
        assert_eq!(view.waiting_for, "team/db-0 (PDB) (+1 more)");
        assert_eq!(view.percent(), 20 + 40 * 79 / 100);
        assert_eq!(
            view.failed.as_ref().map(|f| f.0.as_str()),
            Some("DrainTimeout")
        );
        let table = render_table(std::slice::from_ref(&view), false);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with("NAME        NODE     REQUESTOR"),
            "{table}"
        );
        assert!(
            lines[1].contains("Draining")
                && lines[1].contains("DrainTimeout")
                && lines[1].contains("40% 2/5")
                && lines[1].ends_with("team/db-0 (PDB) (+1 more)"),
            "{table}"
        );
        assert!(view.summary().contains("Failed: DrainTimeout"));
    }

    #[test]
    fn phases_without_status_and_ready() {
        let pending = RequestView::of(&request(None, None));
        assert_eq!(pending.phase, Phase::Pending);
        assert_eq!(pending.ready, "-");
        assert!(pending.waiting_for.starts_with("admission"));
        assert_eq!(pending.percent(), 0);
        assert!(!pending.is_ready());

        let ready = RequestView::of(&request(Some("Ready"), None));
        assert!(ready.is_ready());
        assert_eq!(ready.percent(), 100);
        let table = render_table(&[ready], true);
        assert!(
            table
                .lines()
                .next()
                .unwrap_or_default()
                .starts_with("NAMESPACE")
        );
        assert!(table.lines().nth(1).unwrap_or_default().ends_with('-'));
    }

    #[test]
    fn a_request_being_deleted_is_not_ready() {
        let mut nm = request(Some("Ready"), None);
        nm.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        nm.spec.additional_requestors = Some(vec!["other.example.com".into()]);
        let view = RequestView::of(&nm);
        assert!(!view.is_ready());
        assert!(view.waiting_for.contains("other.example.com"));
        assert!(view.summary().contains("releasing"));
    }
}
