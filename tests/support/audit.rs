//! The testbed's API-server audit log (`DIR/logs/audit.log`, policy in
//! `tests/testbed/audit-policy.yaml`): eviction calls, pod deletions, PodDisruptionBudget
//! status writes, every write of an operator running as a ServiceAccount of the operator's
//! namespace, and every read of the benchmark's operator (ServiceAccount `bench-operator`, see
//! [`BENCH_OPERATOR_ACCOUNT`]), as the API server saw them, with its own timestamps. Tests count and time calls
//! here rather than trusting the operator's word (its logs or metrics).
//!
//! The API server writes an event before it answers (blocking mode), so once a client has its
//! answer, the entry is in the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use jiff::Timestamp;
use serde::Deserialize;

use super::Testbed;

/// One call to a pod's `eviction` subresource.
#[derive(Clone, Debug)]
pub struct EvictionCall {
    /// When the API server received the call (`requestReceivedTimestamp`).
    pub received: Timestamp,
    /// When it answered (`stageTimestamp` of the ResponseComplete stage).
    pub completed: Timestamp,
    pub namespace: String,
    pub pod: String,
    /// 201 evicted, 429 refused (a PodDisruptionBudget), 500 several budgets, 404 gone, ...
    pub code: u16,
    pub user: String,
    pub user_agent: String,
}

impl EvictionCall {
    /// `namespace/name` of the pod.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.pod)
    }
}

/// One `delete` of a pod (not an eviction): the kubelet's final delete, the garbage collector, or
/// someone bypassing PodDisruptionBudgets.
#[derive(Clone, Debug)]
pub struct PodDeletion {
    pub received: Timestamp,
    pub namespace: String,
    /// Empty for a `deletecollection`.
    pub pod: String,
    pub code: u16,
    pub user: String,
}

/// One write of a PodDisruptionBudget's status: by the disruption controller, or by the API server
/// itself when it charges an accepted eviction to the budget.
#[derive(Clone, Debug)]
pub struct PdbStatusWrite {
    pub received: Timestamp,
    pub completed: Timestamp,
    pub namespace: String,
    pub name: String,
    /// The resourceVersion the write was based on (optimistic concurrency): a successful write
    /// turns exactly this version into the next one.
    pub based_on: Option<String>,
    pub code: u16,
    pub user: String,
    /// The status being written.
    pub disruptions_allowed: Option<i32>,
    pub current_healthy: Option<i32>,
    pub desired_healthy: Option<i32>,
    pub expected_pods: Option<i32>,
    /// Pods whose eviction was charged to the budget and which are not gone yet.
    pub disrupted_pods: Vec<String>,
}

/// One call: a write (create, change, delete) of anyone, or a read of
/// [`BENCH_OPERATOR_ACCOUNT`] (the only reads the policy logs).
#[derive(Clone, Debug)]
pub struct ApiCall {
    /// When the API server received the call.
    pub received: Timestamp,
    /// `create`, `update`, `patch`, `delete`, `deletecollection`; `get`, `list`, `watch`.
    pub verb: String,
    /// The resource's plural, e.g. `leases`, `nodemaintenances`.
    pub resource: String,
    /// E.g. `status` or `eviction`; empty for the object itself.
    pub subresource: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
    /// The answer's status; a watch is recorded when its response starts (it may stay open).
    pub code: u16,
    pub user: String,
    pub user_agent: String,
    /// The resourceVersion an update was based on (optimistic concurrency), as the API server
    /// read it from the request body; `None` for an unconditional write and for reads.
    pub based_on: Option<String>,
}

pub type WriteCall = ApiCall;
pub type ReadCall = ApiCall;

impl ApiCall {
    /// `verb resource[/subresource] namespace/name -> code`, for failure messages.
    pub fn describe(&self) -> String {
        let resource = if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        };
        format!(
            "{} {} {} {}/{} -> {}",
            self.received, self.verb, resource, self.namespace, self.name, self.code
        )
    }
}

/// The first 20 of `writes`, one a line, and how many there are: for failure messages.
pub fn describe_writes(writes: &[&WriteCall]) -> String {
    if writes.is_empty() {
        return "none".into();
    }
    let shown: Vec<String> = writes.iter().take(20).map(|w| w.describe()).collect();
    format!("{} writes:\n{}", writes.len(), shown.join("\n"))
}

/// The ServiceAccount (of [`super::operator::OPERATOR_NAMESPACE`]) whose reads the testbed's audit
/// policy logs as well as its writes: run an operator as it (`Operator::start_as`) to count every
/// API call it makes.
pub const BENCH_OPERATOR_ACCOUNT: &str = "bench-operator";

/// Verbs that read.
const READ_VERBS: [&str; 3] = ["get", "list", "watch"];

/// Verbs that change the cluster.
const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// What the audit log holds, each list in the order the API server received the calls.
#[derive(Clone, Debug, Default)]
pub struct AuditLog {
    pub evictions: Vec<EvictionCall>,
    pub pod_deletions: Vec<PodDeletion>,
    pub pdb_status_writes: Vec<PdbStatusWrite>,
    /// Every write the policy logs: the calls of the lists above, and each write of an operator
    /// that runs as a ServiceAccount of its namespace (see [`super::operator::OPERATOR_NAMESPACE`]).
    pub writes: Vec<WriteCall>,
    /// Every read the policy logs: those of [`BENCH_OPERATOR_ACCOUNT`].
    pub reads: Vec<ReadCall>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEvent {
    #[serde(default)]
    stage: String,
    #[serde(default)]
    verb: String,
    #[serde(default)]
    user: RawUser,
    #[serde(default)]
    user_agent: String,
    object_ref: Option<RawObjectRef>,
    response_status: Option<RawStatus>,
    request_object: Option<serde_json::Value>,
    request_received_timestamp: String,
    stage_timestamp: String,
}

#[derive(Deserialize, Default)]
struct RawUser {
    #[serde(default)]
    username: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    resource_version: Option<String>,
}

#[derive(Deserialize)]
struct RawStatus {
    #[serde(default)]
    code: u16,
}

/// The audit log files of the testbed in `dir`, oldest first (rotated files, then the live one).
pub fn audit_log_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let logs = dir.join("logs");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&logs)
        .with_context(|| format!("listing {}", logs.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("audit") && n.ends_with(".log"))
        })
        .collect();
    // Rotated files are `audit-<time>.log`, which sort before `audit.log` and among themselves
    // by time.
    files.sort();
    if files.is_empty() {
        bail!(
            "no audit log in {}: this testbed was started by a testbed script without \
             audit logging; start a new one",
            logs.display()
        );
    }
    Ok(files)
}

fn parse_time(s: &str) -> Result<Timestamp> {
    s.parse()
        .with_context(|| format!("audit timestamp {s:?} is not RFC 3339"))
}

fn int_at(value: &serde_json::Value, path: &str) -> Option<i32> {
    value
        .pointer(path)
        .and_then(serde_json::Value::as_i64)
        .and_then(|v| i32::try_from(v).ok())
}

impl AuditLog {
    /// Reads the audit log of `testbed`.
    pub fn read(testbed: &Testbed) -> Result<AuditLog> {
        AuditLog::read_dir(testbed.dir())
    }

    /// Reads the audit log of the testbed in `dir`.
    pub fn read_dir(dir: &Path) -> Result<AuditLog> {
        let mut log = AuditLog::default();
        for file in audit_log_files(dir)? {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let complete = text.ends_with('\n');
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<RawEvent>(line) {
                    Ok(event) => log.add(event)?,
                    // The API server may be writing the last line as we read.
                    Err(_) if i + 1 == lines.len() && !complete => {}
                    Err(e) => {
                        bail!("{} line {}: not an audit event: {e}", file.display(), i + 1)
                    }
                }
            }
        }
        log.evictions.sort_by_key(|e| e.received);
        log.pod_deletions.sort_by_key(|e| e.received);
        log.pdb_status_writes.sort_by_key(|e| e.received);
        log.writes.sort_by_key(|e| e.received);
        log.reads.sort_by_key(|e| e.received);
        Ok(log)
    }

    fn add(&mut self, event: RawEvent) -> Result<()> {
        // A watch is counted when its response starts: it may stay open until the end.
        let counted_stage = if event.verb == "watch" {
            "ResponseStarted"
        } else {
            "ResponseComplete"
        };
        if event.stage != counted_stage {
            return Ok(());
        }
        let Some(object) = event.object_ref else {
            return Ok(());
        };
        let received = parse_time(&event.request_received_timestamp)?;
        let completed = parse_time(&event.stage_timestamp)?;
        let code = event.response_status.map_or(0, |s| s.code);
        let read = READ_VERBS.contains(&event.verb.as_str());
        if read || WRITE_VERBS.contains(&event.verb.as_str()) {
            let call = ApiCall {
                received,
                verb: event.verb.clone(),
                resource: object.resource.clone(),
                subresource: object.subresource.clone(),
                namespace: object.namespace.clone(),
                name: object.name.clone(),
                code,
                user: event.user.username.clone(),
                user_agent: event.user_agent.clone(),
                based_on: object
                    .resource_version
                    .clone()
                    .filter(|v| !v.is_empty() && !read),
            };
            if read {
                self.reads.push(call);
            } else {
                self.writes.push(call);
            }
        }
        match (
            object.resource.as_str(),
            object.subresource.as_str(),
            event.verb.as_str(),
        ) {
            ("pods", "eviction", "create") => self.evictions.push(EvictionCall {
                received,
                completed,
                namespace: object.namespace,
                pod: object.name,
                code,
                user: event.user.username,
                user_agent: event.user_agent,
            }),
            ("pods", "", "delete" | "deletecollection") => self.pod_deletions.push(PodDeletion {
                received,
                namespace: object.namespace,
                pod: object.name,
                code,
                user: event.user.username,
            }),
            ("poddisruptionbudgets", "status", "update" | "patch") => {
                let body = event.request_object.unwrap_or_default();
                let disrupted_pods = body
                    .pointer("/status/disruptedPods")
                    .and_then(serde_json::Value::as_object)
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default();
                self.pdb_status_writes.push(PdbStatusWrite {
                    received,
                    completed,
                    namespace: object.namespace,
                    name: object.name,
                    based_on: object.resource_version,
                    code,
                    user: event.user.username,
                    disruptions_allowed: int_at(&body, "/status/disruptionsAllowed"),
                    current_healthy: int_at(&body, "/status/currentHealthy"),
                    desired_healthy: int_at(&body, "/status/desiredHealthy"),
                    expected_pods: int_at(&body, "/status/expectedPods"),
                    disrupted_pods,
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// Only what happened in namespace `ns`.
    pub fn in_namespace(&self, ns: &str) -> AuditLog {
        AuditLog {
            evictions: self
                .evictions
                .iter()
                .filter(|e| e.namespace == ns)
                .cloned()
                .collect(),
            pod_deletions: self
                .pod_deletions
                .iter()
                .filter(|e| e.namespace == ns)
                .cloned()
                .collect(),
            pdb_status_writes: self
                .pdb_status_writes
                .iter()
                .filter(|e| e.namespace == ns)
                .cloned()
                .collect(),
            writes: self
                .writes
                .iter()
                .filter(|e| e.namespace == ns)
                .cloned()
                .collect(),
            reads: self
                .reads
                .iter()
                .filter(|e| e.namespace == ns)
                .cloned()
                .collect(),
        }
    }

    /// The writes `user` made (a ServiceAccount is `system:serviceaccount:<namespace>:<name>`).
    pub fn writes_by(&self, user: &str) -> Vec<&WriteCall> {
        self.writes.iter().filter(|w| w.user == user).collect()
    }

    /// The eviction calls for one pod.
    pub fn evictions_of(&self, ns: &str, pod: &str) -> Vec<&EvictionCall> {
        self.evictions
            .iter()
            .filter(|e| e.namespace == ns && e.pod == pod)
            .collect()
    }

    /// How many eviction calls got each HTTP status code.
    pub fn eviction_codes(&self) -> BTreeMap<u16, usize> {
        let mut codes = BTreeMap::new();
        for e in &self.evictions {
            *codes.entry(e.code).or_default() += 1;
        }
        codes
    }

    /// The successful status writes of one PodDisruptionBudget in the order they took effect.
    /// Each successful write is based on the version the previous one produced, so a later one was
    /// sent after the earlier one had been answered: the order of answers is the order of commits.
    pub fn pdb_history(&self, ns: &str, name: &str) -> Vec<&PdbStatusWrite> {
        let mut writes: Vec<&PdbStatusWrite> = self
            .pdb_status_writes
            .iter()
            .filter(|w| w.namespace == ns && w.name == name && w.code == 200)
            .collect();
        writes.sort_by_key(|w| w.completed);
        writes
    }
}

/// Seconds from `a` to `b` (negative when `b` is earlier).
pub fn seconds_between(a: Timestamp, b: Timestamp) -> f64 {
    b.duration_since(a).as_secs_f64()
}
