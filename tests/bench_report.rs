//! `make bench`: performance workloads on real control planes (`tests/testbed/testbed`, KWOK
//! nodes), with progress lines while they run and a dated report: `report.md` (tables, the goals
//! in docs/performance.md marked met or missed), `report.json` and SVG charts.
//!
//! - no drain: N requests on M nodes (maxParallelOperations P), each released once Ready;
//!   requests/s and the operator's API calls per request by verb (from the audit log);
//! - drain: X nodes full of Deployment, StatefulSet and DaemonSet pods under PodDisruptionBudgets,
//!   maintained K at a time (maxParallelOperations = maxUnavailable = K), then the same nodes
//!   drained by `kubectl drain` K at a time on a fresh identical cluster: wall time, eviction calls
//!   per evicted pod and (ours) API requests per evicted pod, from the audit log;
//! - every node maintained: a cluster whose every node holds pods of Deployments and
//!   StatefulSets under PDBs, all maintained K at a time (maxParallelOperations K, maxUnavailable
//!   10%), under the invariant monitor, then by `kubectl drain` K at a time on a fresh identical
//!   cluster;
//! - the operator's peak RSS (VmHWM) at two cluster sizes, with a tenth of the nodes in
//!   maintenance and with a fixed number (`MO_BENCH_RSS_FIXED_DRAINS`, by default the smallest
//!   size's tenth); `MO_BENCH_RSS_OPERATORS` (`label=command;...`, e.g.
//!   `glibc=target/release/maintenance-operator;musl=target/x86_64-unknown-linux-musl/release/maintenance-operator`)
//!   compares builds on one cluster at the fixed number of drains (one size is then enough).
//!
//! Each workload runs on a fresh control plane, the operator as ServiceAccount `bench-operator`,
//! whose reads and writes the testbed's audit policy logs. Nothing is timed by a fixed sleep:
//! every wait has a deadline.
//!
//! A plain `cargo test` runs it at size `smoke` and only checks that the work got done. Sizes:
//! `MO_BENCH_SIZE=smoke|small|large`; overrides `MO_BENCH_NODES`, `MO_BENCH_REQUESTS`,
//! `MO_BENCH_PARALLEL` (no drain), `MO_BENCH_DRAIN_NODES`, `MO_BENCH_PODS_PER_NODE`,
//! `MO_BENCH_DRAIN_PARALLEL` (a list, e.g. `2,5`), `MO_BENCH_RSS_NODES` (two or more growing
//! sizes, e.g. `100,300`), `MO_BENCH_RSS_PODS_PER_NODE`, `MO_BENCH_RSS_FIXED_DRAINS`,
//! `MO_BENCH_FLEET_NODES` (K follows as a tenth), `MO_BENCH_FLEET_PODS_PER_NODE`,
//! `MO_BENCH_FLEET_REPLICAS`, `MO_BENCH_FLEET_PARALLEL`, `MO_BENCH_FLEET_TAINT_WAITING_NODES`
//! (`false`: ours without the taint on nodes waiting to be drained), `MO_BENCH_ONLY` (some of
//! `no-drain,drain,kubectl,rss,fleet,fleet-kubectl`). The report goes to
//! `$MO_BENCH_REPORT_DIR/<UTC date>-<size>/` (`make bench` sets `bench`), else to
//! `target/bench/<UTC date>-<size>/`.
//!
//! `MO_BENCH_SIZE=small make bench`, or `cargo test --release --test bench_report`.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Container, Node, Pod, PodSpec, PodTemplateSpec, TopologySpreadConstraint,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use maintenance_crds::{NodeMaintenance, Phase};
use serde::Serialize;
use support::audit::{AuditLog, BENCH_OPERATOR_ACCOUNT, WriteCall, seconds_between};
use support::invariants::{InvariantMonitor, Scope};
use support::operator::*;
use support::*;

/// Label that pins the benchmark's workload pods to a pool of nodes.
const POOL: &str = "bench.maintenance.nvidia.com/pool";

// ---------------------------------------------------------------------------------------------
// Sizes

#[derive(Clone, Debug, Default, Serialize)]
struct Size {
    name: String,
    /// No drain: nodes, requests, maxParallelOperations.
    nodes: usize,
    requests: usize,
    parallel: usize,
    /// Drain: nodes drained, workload pods per drained node, the K values (nodes at once).
    drain_nodes: usize,
    pods_per_node: usize,
    drain_parallel: Vec<usize>,
    /// Peak RSS: two cluster sizes (nodes) with this many pods per node; at each size one run
    /// drains a tenth of the nodes, another a fixed number, so that the report tells apart what
    /// RSS follows: the nodes in maintenance or the cluster.
    rss_nodes: Vec<usize>,
    rss_pods_per_node: usize,
    rss_fixed_drains: usize,
    /// Operator builds to compare (`MO_BENCH_RSS_OPERATORS`); empty: this build alone.
    rss_operators: Vec<RssOperator>,
    /// Every node maintained: a cluster of this many nodes with about this many pods per node
    /// (Deployments and StatefulSets of `fleet_replicas` pods under PDBs, a DaemonSet), all of
    /// them maintained `fleet_parallel` at a time (maxParallelOperations; maxUnavailable the
    /// same, written as 10% when it is a tenth), the replacements going wherever the scheduler
    /// puts them, maintained nodes included.
    fleet_nodes: usize,
    fleet_pods_per_node: usize,
    fleet_replicas: usize,
    fleet_parallel: usize,
    /// Ours with `admission.taintWaitingNodes` (the default); off with
    /// `MO_BENCH_FLEET_TAINT_WAITING_NODES=false`, to measure what the taint saves.
    fleet_taint_waiting_nodes: bool,
    /// The workloads to run (`MO_BENCH_ONLY`, e.g. `drain`): no-drain, drain, kubectl, rss,
    /// fleet, fleet-kubectl.
    only: Vec<String>,
}

/// Drains of the RSS run "a tenth of the nodes" (at least 2).
fn tenth(nodes: usize) -> usize {
    (nodes / 10).max(2)
}

/// The drains of the RSS runs at a cluster of `nodes`: a tenth of them, and the fixed number
/// (one run when they are the same).
fn rss_drains(size: &Size, nodes: usize) -> Vec<usize> {
    // Builds compared side by side: at one load, the fixed number.
    if !size.rss_operators.is_empty() && size.rss_fixed_drains > 0 {
        return vec![size.rss_fixed_drains.min(nodes)];
    }
    let mut drains = vec![tenth(nodes), size.rss_fixed_drains.min(nodes)];
    drains.sort_unstable();
    drains.dedup();
    drains
}

fn env_usize(name: &str) -> Result<Option<usize>> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => {
            Ok(Some(v.trim().parse().with_context(|| {
                format!("{name}={v:?} is not a number")
            })?))
        }
        _ => Ok(None),
    }
}

fn env_list(name: &str) -> Result<Option<Vec<usize>>> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Ok(Some(
            v.split(',')
                .map(|s| s.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("{name}={v:?} is not a list of numbers like 2,5"))?,
        )),
        _ => Ok(None),
    }
}

/// An operator build the RSS runs compare: a label for the report and the command that runs it,
/// up to (not including) `run`, e.g. `musl=target/x86_64-unknown-linux-musl/release/maintenance-operator`
/// or `arena2=env MALLOC_ARENA_MAX=2 target/release/maintenance-operator`.
#[derive(Clone, Debug, Serialize)]
struct RssOperator {
    label: String,
    command: Vec<String>,
}

impl RssOperator {
    /// `MO_BENCH_RSS_OPERATORS`: `label=command` entries separated by `;`.
    fn list_from_env() -> Result<Vec<RssOperator>> {
        let Ok(v) = std::env::var("MO_BENCH_RSS_OPERATORS") else {
            return Ok(vec![]);
        };
        let mut operators = Vec::new();
        for entry in v.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (label, command) = entry.split_once('=').with_context(|| {
                format!("MO_BENCH_RSS_OPERATORS entry {entry:?} is not label=command")
            })?;
            let command: Vec<String> = command.split_whitespace().map(String::from).collect();
            ensure!(
                !label.trim().is_empty() && !command.is_empty(),
                "MO_BENCH_RSS_OPERATORS entry {entry:?} wants a label and a command"
            );
            // A path that is not there fails now, not after the cluster has grown.
            let binary = command.iter().find(|word| word.contains('/'));
            if let Some(binary) = binary {
                ensure!(
                    Path::new(binary).is_file(),
                    "MO_BENCH_RSS_OPERATORS: {binary} (of {label:?}) is not a file"
                );
            }
            operators.push(RssOperator {
                label: label.trim().to_string(),
                command,
            });
        }
        Ok(operators)
    }

    fn launcher(&self) -> Vec<std::ffi::OsString> {
        self.command
            .iter()
            .map(Into::into)
            .chain(std::iter::once("run".into()))
            .collect()
    }
}

impl Size {
    fn from_env() -> Result<Size> {
        let name = std::env::var("MO_BENCH_SIZE")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| "smoke".into());
        let mut size = match name.as_str() {
            "smoke" => Size {
                name,
                nodes: 20,
                requests: 20,
                parallel: 10,
                drain_nodes: 4,
                pods_per_node: 3,
                drain_parallel: vec![2],
                rss_nodes: vec![10, 30],
                rss_pods_per_node: 2,
                rss_fixed_drains: 0,
                rss_operators: vec![],
                fleet_nodes: 20,
                fleet_pods_per_node: 2,
                fleet_replicas: 10,
                fleet_parallel: 2,
                fleet_taint_waiting_nodes: true,
                only: vec![],
            },
            "small" => Size {
                name,
                nodes: 200,
                requests: 200,
                parallel: 50,
                drain_nodes: 12,
                pods_per_node: 10,
                drain_parallel: vec![2, 4],
                rss_nodes: vec![100, 300],
                rss_pods_per_node: 5,
                rss_fixed_drains: 0,
                rss_operators: vec![],
                fleet_nodes: 100,
                fleet_pods_per_node: 5,
                fleet_replicas: 25,
                fleet_parallel: 10,
                fleet_taint_waiting_nodes: true,
                only: vec![],
            },
            "large" => Size {
                name,
                nodes: 1000,
                requests: 1000,
                parallel: 100,
                drain_nodes: 40,
                pods_per_node: 20,
                drain_parallel: vec![2, 5, 10, 20],
                rss_nodes: vec![250, 1000],
                rss_pods_per_node: 10,
                rss_fixed_drains: 0,
                rss_operators: vec![],
                fleet_nodes: 1000,
                fleet_pods_per_node: 20,
                fleet_replicas: 50,
                fleet_parallel: 100,
                fleet_taint_waiting_nodes: true,
                only: vec![],
            },
            other => bail!("MO_BENCH_SIZE={other:?}: want smoke, small or large"),
        };
        if let Some(v) = env_usize("MO_BENCH_NODES")? {
            size.nodes = v;
        }
        size.requests = env_usize("MO_BENCH_REQUESTS")?
            .unwrap_or(size.requests)
            .min(size.nodes);
        if let Some(v) = env_usize("MO_BENCH_PARALLEL")? {
            size.parallel = v;
        }
        if let Some(v) = env_usize("MO_BENCH_DRAIN_NODES")? {
            size.drain_nodes = v;
        }
        if let Some(v) = env_usize("MO_BENCH_PODS_PER_NODE")? {
            size.pods_per_node = v;
        }
        if let Some(v) = env_list("MO_BENCH_DRAIN_PARALLEL")? {
            size.drain_parallel = v;
        }
        size.rss_operators = RssOperator::list_from_env()?;
        if let Some(v) = env_list("MO_BENCH_RSS_NODES")? {
            // Builds compared side by side need one size only.
            let fewest = if size.rss_operators.is_empty() { 2 } else { 1 };
            ensure!(
                v.len() >= fewest && v.windows(2).all(|w| w[0] < w[1]),
                "MO_BENCH_RSS_NODES wants two or more growing sizes, e.g. 100,300 (one is \
                 enough with MO_BENCH_RSS_OPERATORS)"
            );
            size.rss_nodes = v;
        }
        if let Some(v) = env_usize("MO_BENCH_RSS_PODS_PER_NODE")? {
            size.rss_pods_per_node = v;
        }
        // By default the drains of the smallest size, held while the cluster grows.
        size.rss_fixed_drains = match env_usize("MO_BENCH_RSS_FIXED_DRAINS")? {
            Some(v) => v.max(1),
            None => tenth(size.rss_nodes.first().copied().unwrap_or(0)),
        };
        if let Some(v) = env_usize("MO_BENCH_FLEET_NODES")? {
            size.fleet_nodes = v;
            size.fleet_parallel = tenth(v);
        }
        if let Some(v) = env_usize("MO_BENCH_FLEET_PODS_PER_NODE")? {
            size.fleet_pods_per_node = v;
        }
        if let Some(v) = env_usize("MO_BENCH_FLEET_REPLICAS")? {
            size.fleet_replicas = v;
        }
        if let Some(v) = env_usize("MO_BENCH_FLEET_PARALLEL")? {
            size.fleet_parallel = v;
        }
        if let Ok(taint) = std::env::var("MO_BENCH_FLEET_TAINT_WAITING_NODES") {
            size.fleet_taint_waiting_nodes = taint.trim().parse().with_context(|| {
                format!("MO_BENCH_FLEET_TAINT_WAITING_NODES={taint:?}: want true or false")
            })?;
        }
        if let Ok(only) = std::env::var("MO_BENCH_ONLY") {
            size.only = only
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            const KNOWN: [&str; 6] = [
                "no-drain",
                "drain",
                "kubectl",
                "rss",
                "fleet",
                "fleet-kubectl",
            ];
            ensure!(
                size.only.iter().all(|w| KNOWN.contains(&w.as_str())),
                "MO_BENCH_ONLY={only:?}: want a list of {KNOWN:?}"
            );
        }
        ensure!(
            size.nodes > 0 && size.requests > 0 && size.parallel > 0,
            "no-drain sizes must be positive"
        );
        ensure!(
            size.drain_nodes > 0 && size.pods_per_node > 0,
            "drain sizes must be positive"
        );
        ensure!(
            size.fleet_nodes > 0
                && size.fleet_pods_per_node > 0
                && size.fleet_replicas > 0
                && size.fleet_parallel > 0,
            "fleet sizes must be positive"
        );
        ensure!(
            size.drain_parallel.iter().all(|&k| k > 0),
            "MO_BENCH_DRAIN_PARALLEL values must be positive"
        );
        Ok(size)
    }

    /// Whether workload `name` runs (all of them unless `MO_BENCH_ONLY` says otherwise).
    fn runs(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|w| w == name)
    }

    /// A deadline for waits that scales with the work.
    fn wait(&self, work: usize) -> Duration {
        Duration::from_secs(180 + work as u64 / 2)
    }
}

// ---------------------------------------------------------------------------------------------
// Progress: a spinner while a phase runs (on a terminal), and a line per phase with times.

struct Progress {
    started: Instant,
}

struct Step {
    bar: ProgressBar,
    name: String,
    started: Instant,
    run_started: Instant,
}

impl Progress {
    fn begin(&self, name: &str) -> Step {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed:>4}] {prefix}: {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.set_prefix(name.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        Step {
            bar,
            name: name.to_string(),
            started: Instant::now(),
            run_started: self.started,
        }
    }
}

impl Step {
    fn set(&self, msg: impl Into<String>) {
        self.bar.set_message(msg.into());
    }

    fn end(self, summary: &str) -> f64 {
        self.bar.finish_and_clear();
        let secs = self.started.elapsed().as_secs_f64();
        println!(
            "[{:>7.1}s] {}: {summary} ({secs:.1}s)",
            self.run_started.elapsed().as_secs_f64(),
            self.name
        );
        secs
    }
}

// ---------------------------------------------------------------------------------------------
// Results

#[derive(Clone, Debug, Default, Serialize)]
struct NoDrain {
    nodes: usize,
    requests: usize,
    parallel: usize,
    seconds: f64,
    requests_per_second: f64,
    /// The operator's API calls in the window, by verb and by `verb resource[/subresource]`.
    calls_by_verb: BTreeMap<String, usize>,
    calls_by_resource: BTreeMap<String, usize>,
    calls_per_request: f64,
    scheduler_rounds: f64,
    /// Time the supervisor spent in its rounds (they run one at a time).
    scheduler_seconds: f64,
    rss_peak_mib: f64,
    /// The operator's CPU seconds over the measured requests, per request.
    cpu_seconds_per_request: f64,
    /// What the API server of the same control plane sustains with nothing but merge patches
    /// (see [`api_write_ceiling`]): divided by the calls per request, an upper bound of the
    /// throughput whatever the operator does.
    api_writes_per_second: f64,
    /// Events go out in the background: how long after the last request was gone the last of
    /// them reached the API server. The calls are counted until then.
    events_lag_seconds: f64,
    /// Where a slot's time goes: the segments of one request's lifecycle, from the audit log.
    timeline: Vec<Segment>,
    /// CPU seconds each process spent from the first create to the last request gone.
    cpu_during_run: BTreeMap<String, f64>,
    /// The machine's cores (what those CPU seconds are out of).
    cores: usize,
}

/// One segment of a request's lifecycle without a drain, between two of the operator's calls as
/// the API server received them, over all requests.
#[derive(Clone, Debug, Default, Serialize)]
struct Segment {
    name: String,
    /// What happens in it.
    covers: String,
    samples: usize,
    median_ms: f64,
    p90_ms: f64,
}

/// Splits each request's lifecycle at the operator's calls: admission (its metadata write),
/// cordon, Ready (the status write after the cordon), the requestor's deletion, uncordon,
/// finalizer removal, and from a
/// release to the admission that takes its slot (the k-th release frees the slot of the
/// (parallel + k)-th admission). `nodes[i]` is the node of request `r{i}`.
fn lifecycle_timeline(
    log: &AuditLog,
    ns: &str,
    nodes: &[String],
    parallel: usize,
    from: Timestamp,
    to: Timestamp,
) -> Vec<Segment> {
    let user = service_account_user(BENCH_OPERATOR_ACCOUNT);
    let ours: Vec<&WriteCall> = log
        .writes
        .iter()
        .filter(|w| w.user == user && w.received >= from && w.received <= to && w.code < 300)
        .collect();
    let mut segments: [Vec<f64>; 6] = Default::default();
    let mut admissions = Vec::new();
    let mut releases = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let name = format!("r{i}");
        let of_request: Vec<&&WriteCall> = ours
            .iter()
            .filter(|w| w.resource == "nodemaintenances" && w.namespace == ns && w.name == name)
            .collect();
        let metadata: Vec<Timestamp> = of_request
            .iter()
            .filter(|w| w.subresource.is_empty())
            .map(|w| w.received)
            .collect();
        let node_patches: Vec<Timestamp> = ours
            .iter()
            .filter(|w| w.resource == "nodes" && w.name == *node && w.verb == "patch")
            .map(|w| w.received)
            .collect();
        let (Some(&admitted), Some(&released), [cordon, uncordon, ..]) =
            (metadata.first(), metadata.last(), node_patches.as_slice())
        else {
            continue;
        };
        let Some(ready) = of_request
            .iter()
            .filter(|w| w.subresource == "status" && w.received > *cordon)
            .map(|w| w.received)
            .next()
        else {
            continue;
        };
        // The requestor's deletion (the audit policy logs every NodeMaintenance deletion).
        let Some(deleted) = log
            .writes
            .iter()
            .filter(|w| {
                w.verb == "delete"
                    && w.resource == "nodemaintenances"
                    && w.namespace == ns
                    && w.name == name
                    && w.received >= ready
            })
            .map(|w| w.received)
            .next()
        else {
            continue;
        };
        let points = [admitted, *cordon, ready, deleted, *uncordon, released];
        for (k, pair) in points.windows(2).enumerate() {
            segments[k].push(seconds_between(pair[0], pair[1]) * 1000.0);
        }
        admissions.push(admitted);
        releases.push(released);
    }
    admissions.sort();
    releases.sort();
    for (k, released) in releases.iter().enumerate() {
        if let Some(next) = admissions.get(parallel + k) {
            segments[5].push(seconds_between(*released, *next) * 1000.0);
        }
    }
    const NAMES: [(&str, &str); 6] = [
        (
            "admission -> cordon",
            "the admission's metadata write (no status write), the node actor's start",
        ),
        ("cordon -> Ready", "the cordon, then the Ready status write"),
        (
            "Ready -> deletion",
            "the requestor's watch shows Ready, it deletes the request",
        ),
        (
            "deletion -> uncordon",
            "the operator's watch shows the deletion, the node actor steps",
        ),
        (
            "uncordon -> finalizer off",
            "the uncordon, then the finalizer's removal",
        ),
        (
            "release -> next admission",
            "the object goes, the cache shows it, a round admits the next request",
        ),
    ];
    NAMES
        .iter()
        .zip(segments.iter_mut())
        .map(|((name, covers), samples)| {
            samples.sort_by(f64::total_cmp);
            Segment {
                name: name.to_string(),
                covers: covers.to_string(),
                samples: samples.len(),
                median_ms: quantile(samples, 0.5),
                p90_ms: quantile(samples, 0.9),
            }
        })
        .collect()
}

#[derive(Clone, Debug, Default, Serialize)]
struct DrainRun {
    /// `operator` or `kubectl`.
    who: String,
    nodes: usize,
    pods: usize,
    parallel: usize,
    /// Until every node was drained and given back (requests released, or uncordoned).
    seconds: f64,
    /// Until the last request was Ready (operator) or the last drain returned (kubectl).
    seconds_to_last_drained: f64,
    eviction_calls: usize,
    evicted_pods: usize,
    eviction_codes: BTreeMap<u16, usize>,
    eviction_calls_per_pod: f64,
    /// Operator only: all its API calls in the window, and per evicted pod.
    api_calls: Option<usize>,
    api_calls_per_pod: Option<f64>,
    calls_by_verb: BTreeMap<String, usize>,
    calls_by_resource: BTreeMap<String, usize>,
    rss_peak_mib: Option<f64>,
    /// Every node maintained, ours: what the invariant monitor saw.
    invariants: Option<FleetInvariants>,
    /// Every node maintained: the serial evictions of the budgets that allow one at a time.
    chains: Option<BudgetChains>,
    /// Every node maintained: kube-controller-manager's work queues during the run.
    controller_queues: Vec<ControllerQueue>,
    /// Every node maintained: CPU seconds each process spent during the run.
    cpu_during_run: BTreeMap<String, f64>,
    /// Every node maintained: the pods KWOK deleted (as a kubelet does once a pod's grace period
    /// ends), those of StatefulSets apart.
    simulator_deletions: Option<SimulatorDeletions>,
}

#[derive(Clone, Debug, Serialize)]
struct SimulatorDeletions {
    deployment_pods: usize,
    statefulset_pods: usize,
    /// StatefulSet pods deleted, each name counted once.
    statefulset_names: usize,
}

/// The user KWOK's client runs as (its certificate's CN, tests/testbed/testbed).
const KWOK_USER: &str = "kwok-controller";

/// KWOK's successful pod deletions in `ns` from `from`. A StatefulSet's pod is named
/// `<workload>-<ordinal>`, a Deployment's `<workload>-<hash>-<suffix>`.
fn simulator_deletions(log: &AuditLog, ns: &str, from: Timestamp) -> SimulatorDeletions {
    let mut names = HashSet::new();
    let (mut deployment_pods, mut statefulset_pods) = (0, 0);
    for d in log
        .pod_deletions
        .iter()
        .filter(|d| d.namespace == ns && d.user == KWOK_USER && d.code == 200 && d.received >= from)
    {
        if d.pod.matches('-').count() == 1 {
            statefulset_pods += 1;
            names.insert(d.pod.as_str());
        } else {
            deployment_pods += 1;
        }
    }
    SimulatorDeletions {
        deployment_pods,
        statefulset_pods,
        statefulset_names: names.len(),
    }
}

/// The work queues of kube-controller-manager a drain waits on: the disruption controller's (a
/// budget's status, which admits its next eviction) and those of the controllers that create
/// the replacements.
const WATCHED_QUEUES: [&str; 3] = ["disruption", "replicaset", "statefulset"];

/// One work queue over a run, from kube-controller-manager's `workqueue_*` metrics.
#[derive(Clone, Debug, Serialize)]
struct ControllerQueue {
    queue: String,
    syncs: f64,
    /// Mean time an item waited in the queue before a worker took it.
    mean_wait_ms: f64,
    /// Mean time a worker spent on an item.
    mean_work_ms: f64,
}

/// Cumulative `workqueue_*` figures of kube-controller-manager, by queue: (items taken, seconds
/// they waited, items worked, seconds worked).
type QueueTotals = BTreeMap<String, [f64; 4]>;

/// Reads kube-controller-manager's /metrics (its port from the testbed's `ports` file; the
/// testbed's admin may read it).
async fn controller_queue_totals(testbed: &Testbed) -> Result<QueueTotals> {
    let ports_file = testbed.dir().join("ports");
    let ports = std::fs::read_to_string(&ports_file)
        .with_context(|| format!("reading {}", ports_file.display()))?;
    let port = ports
        .lines()
        .find_map(|l| l.strip_prefix("kube-controller-manager="))
        .with_context(|| {
            format!(
                "{} names no kube-controller-manager port",
                ports_file.display()
            )
        })?;
    let mut config = testbed.config().await?;
    config.cluster_url = format!("https://127.0.0.1:{port}").parse()?;
    // The controller manager serves a certificate of its own, not one of the testbed's CA.
    config.accept_invalid_certs = true;
    let client = Client::try_from(config)?;
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(request)
        .await
        .context("reading kube-controller-manager's /metrics")?;
    let mut totals = QueueTotals::new();
    for line in text.lines() {
        let Some((series, value)) = line.split_once(' ') else {
            continue;
        };
        let Some((metric, labels)) = series.split_once('{') else {
            continue;
        };
        let slot = match metric {
            "workqueue_queue_duration_seconds_count" => 0,
            "workqueue_queue_duration_seconds_sum" => 1,
            "workqueue_work_duration_seconds_count" => 2,
            "workqueue_work_duration_seconds_sum" => 3,
            _ => continue,
        };
        let Some(queue) = labels
            .strip_prefix("name=\"")
            .and_then(|l| l.split('"').next())
            .filter(|q| WATCHED_QUEUES.contains(q))
        else {
            continue;
        };
        if let Ok(v) = value.trim().parse::<f64>() {
            totals.entry(queue.to_string()).or_default()[slot] = v;
        }
    }
    Ok(totals)
}

/// What each watched queue did between two readings.
fn queues_between(before: &QueueTotals, after: &QueueTotals) -> Vec<ControllerQueue> {
    WATCHED_QUEUES
        .iter()
        .filter_map(|&queue| {
            let a = after.get(queue)?;
            let b = before.get(queue).copied().unwrap_or_default();
            let d: Vec<f64> = a.iter().zip(b).map(|(a, b)| a - b).collect();
            let mean_ms = |sum: f64, n: f64| if n > 0.0 { sum / n * 1000.0 } else { 0.0 };
            Some(ControllerQueue {
                queue: queue.to_string(),
                syncs: d[2],
                mean_wait_ms: mean_ms(d[1], d[0]),
                mean_work_ms: mean_ms(d[3], d[2]),
            })
        })
        .collect()
}

/// CPU seconds each process spent between two readings of [`cpu_by_process`].
fn cpu_between(
    before: &BTreeMap<String, f64>,
    after: BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .into_iter()
        .map(|(name, after)| {
            let before = before.get(&name).copied().unwrap_or(0.0);
            (name, after - before)
        })
        .collect()
}

/// A budget that allows one disruption at a time makes its workload's evictions a chain: the
/// next is admitted only once the replacement of the last is Ready and the disruption controller
/// said so. The longest chain bounds the run from below.
#[derive(Clone, Debug, Serialize)]
struct BudgetChains {
    /// Workloads under a one-at-a-time budget.
    workloads: usize,
    /// The one whose evictions spanned the longest: its name, evictions, first to last (s).
    longest: String,
    longest_evictions: usize,
    longest_span_seconds: f64,
    /// Gaps between successive successful evictions of one such workload, over all of them.
    median_gap_ms: f64,
    p90_gap_ms: f64,
}

/// The chains of `strict` (workloads under one-at-a-time budgets) in the audit log: each
/// workload's successful evictions by `user` in `ns` from `from`, a pod's workload being its
/// name up to the first `-`.
fn budget_chains(
    log: &AuditLog,
    ns: &str,
    user: &str,
    from: Timestamp,
    strict: &HashSet<String>,
) -> Option<BudgetChains> {
    let mut by_app: BTreeMap<&str, Vec<Timestamp>> = BTreeMap::new();
    for e in log
        .evictions
        .iter()
        .filter(|e| e.namespace == ns && e.user == user && e.received >= from && e.code == 201)
    {
        let app = e.pod.split('-').next().unwrap_or_default();
        if strict.contains(app) {
            by_app.entry(app).or_default().push(e.received);
        }
    }
    let mut gaps = Vec::new();
    let mut longest: Option<(&str, usize, f64)> = None;
    for (app, times) in &mut by_app {
        times.sort();
        gaps.extend(
            times
                .windows(2)
                .map(|w| seconds_between(w[0], w[1]) * 1000.0),
        );
        let span = match (times.first(), times.last()) {
            (Some(a), Some(b)) => seconds_between(*a, *b),
            _ => 0.0,
        };
        if longest.is_none_or(|(_, _, s)| span > s) {
            longest = Some((app, times.len(), span));
        }
    }
    let (app, evictions, span) = longest?;
    gaps.sort_by(f64::total_cmp);
    Some(BudgetChains {
        workloads: by_app.len(),
        longest: app.to_string(),
        longest_evictions: evictions,
        longest_span_seconds: span,
        median_gap_ms: quantile(&gaps, 0.5),
        p90_gap_ms: quantile(&gaps, 0.9),
    })
}

/// The invariant monitor's figures over a run in which every node was maintained (it fails the
/// run on any breach: a PDB below desired, a limit exceeded, a node left cordoned, a pod deleted).
#[derive(Clone, Debug, Serialize)]
struct FleetInvariants {
    max_parallel: usize,
    /// As written in the configuration, e.g. `10%`.
    max_unavailable: String,
    peak_in_maintenance: usize,
    peak_unavailable: usize,
    lowest_pdb_margin: Option<i32>,
    events: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
struct RssPoint {
    /// The build, when several are compared (`MO_BENCH_RSS_OPERATORS`).
    operator: Option<String>,
    /// Workload pods on the nodes drained, when the run started (the rebalancing between
    /// compared builds keeps them alike).
    pods_drained: usize,
    nodes: usize,
    pods: usize,
    requests: usize,
    rss_peak_mib: f64,
    rss_now_mib: f64,
    seconds: f64,
    /// The operator's CPU seconds from its start to the end of the drains, per request.
    cpu_seconds_per_request: f64,
    /// Seconds to grow the cluster to this size (nodes Ready, then every pod Ready).
    setup_seconds: f64,
    /// VmRSS (MiB) of each control-plane component at the end, by name (what limits the size).
    control_plane_rss_mib: BTreeMap<String, f64>,
}

/// The RSS runs of the first build listed (or of this build): the goal, the growth and the
/// chart read these; the other builds show in the table next to them.
fn first_build_rss(report: &Report) -> impl Iterator<Item = &RssPoint> {
    let first = report.rss.first().and_then(|r| r.operator.clone());
    report.rss.iter().filter(move |r| r.operator == first)
}

#[derive(Clone, Debug, Default, Serialize)]
struct Report {
    size: Option<Size>,
    started: String,
    machine: BTreeMap<String, String>,
    commit: String,
    no_drain: Option<NoDrain>,
    drains: Vec<DrainRun>,
    /// Every node maintained: ours and kubectl's.
    fleet: Vec<DrainRun>,
    rss: Vec<RssPoint>,
    /// Why the RSS workload stopped before its largest size, if it did.
    rss_stopped: Option<String>,
    goals: Vec<Goal>,
}

#[derive(Clone, Debug, Serialize)]
struct Goal {
    what: String,
    target: String,
    measured: Option<f64>,
    met: Option<bool>,
    verdict: String,
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// The `q` quantile of sorted `samples` (NaN when empty).
fn quantile(samples: &[f64], q: f64) -> f64 {
    samples
        .get(((samples.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

fn mib_from_status(status: &str, key: &str) -> Option<f64> {
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kb: f64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb / 1024.0)
    })
}

/// (VmHWM, VmRSS) of a process in MiB.
fn rss_of(pid: u32) -> Result<(f64, f64)> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let hwm = mib_from_status(&status, "VmHWM").context("no VmHWM in /proc/PID/status")?;
    let rss = mib_from_status(&status, "VmRSS").context("no VmRSS in /proc/PID/status")?;
    Ok((hwm, rss))
}

/// The control plane's components and their pids, from the testbed's `pids` file (name, pid,
/// start time per line).
fn testbed_pids(testbed: &Testbed) -> Result<Vec<(String, u32)>> {
    let path = testbed.dir().join("pids");
    let pids = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the testbed's {}", path.display()))?;
    Ok(pids
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next()?;
            let pid = fields.next()?.parse().ok()?;
            Some((name.to_string(), pid))
        })
        .collect())
}

/// VmRSS (MiB) of each running control-plane component of `testbed`; a component that cannot be
/// read is left out.
fn control_plane_rss(testbed: &Testbed) -> BTreeMap<String, f64> {
    testbed_pids(testbed)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(name, pid)| Some((name, rss_of(pid).ok()?.1)))
        .collect()
}

fn operator_rss(op: &Operator) -> Result<(f64, f64)> {
    rss_of(op.pid().context("the operator is not running")?)
}

/// CPU seconds (user + system) the operator process has used so far, from /proc/PID/stat.
fn operator_cpu_seconds(op: &Operator) -> Result<f64> {
    cpu_seconds_of(&op.pid().context("the operator is not running")?.to_string())
}

/// CPU seconds used so far by each process the run depends on: the control plane's components
/// (the testbed's `pids` file), the operator, and this process (the requestor and the bench).
fn cpu_by_process(testbed: &Testbed, op: Option<&Operator>) -> Result<BTreeMap<String, f64>> {
    let mut cpu = BTreeMap::new();
    for (name, pid) in testbed_pids(testbed)? {
        cpu.insert(name, cpu_seconds_of(&pid.to_string())?);
    }
    if let Some(op) = op {
        cpu.insert("operator".to_string(), operator_cpu_seconds(op)?);
    }
    cpu.insert("bench (requestor)".to_string(), cpu_seconds_of("self")?);
    Ok(cpu)
}

/// CPU seconds (user + system) of process `pid` (a number, or `self`), from /proc/PID/stat.
fn cpu_seconds_of(pid: &str) -> Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // The command name (field 2) may hold spaces: count the fields after its closing ')'.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("no ')' in stat")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = |i: usize| -> Result<f64> {
        Ok(fields
            .get(i)
            .with_context(|| format!("{path} has no field {}", i + 3))?
            .parse::<f64>()?)
    };
    // USER_HZ is 100 on every Linux this runs on (the proc(5) default).
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

/// Waits until the Events in `ns` stop growing (no new one for 2 s), at most `timeout`; returns
/// the seconds from `since` to the last new Event seen.
async fn wait_events_settled(
    client: &Client,
    ns: &str,
    since: Instant,
    timeout: Duration,
) -> Result<f64> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + timeout;
    let mut last_count = None;
    let mut last_change = since;
    loop {
        let count = events.list(&ListParams::default()).await?.items.len();
        if last_count != Some(count) {
            last_count = Some(count);
            last_change = Instant::now();
        } else if last_change.elapsed() >= Duration::from_secs(2) {
            return Ok(last_change.duration_since(since).as_secs_f64());
        }
        ensure!(
            Instant::now() < deadline,
            "the operator's Events in {ns} were still growing after {timeout:?} ({count} so far)"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn operator_calls(
    log: &AuditLog,
    from: Timestamp,
    to: Timestamp,
) -> (usize, BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let user = service_account_user(BENCH_OPERATOR_ACCOUNT);
    let mut by_verb = BTreeMap::new();
    let mut by_resource = BTreeMap::new();
    let mut total = 0;
    let calls = log
        .reads
        .iter()
        .map(|r| (&r.user, r.received, &r.verb, &r.resource, &r.subresource))
        .chain(
            log.writes
                .iter()
                .map(|w| (&w.user, w.received, &w.verb, &w.resource, &w.subresource)),
        );
    for (who, received, verb, resource, sub) in calls {
        if *who != user || received < from || received > to {
            continue;
        }
        total += 1;
        *by_verb.entry(verb.clone()).or_default() += 1;
        let resource = if sub.is_empty() {
            resource.clone()
        } else {
            format!("{resource}/{sub}")
        };
        *by_resource.entry(format!("{verb} {resource}")).or_default() += 1;
    }
    (total, by_verb, by_resource)
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        f64::NAN
    } else {
        a as f64 / b as f64
    }
}

async fn set_node_label(client: &Client, node: &str, key: &str, value: Option<&str>) -> Result<()> {
    let patch = serde_json::json!({ "metadata": { "labels": { key: value } } });
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("labelling node {node}"))?;
    Ok(())
}

async fn count_ready_pods(client: &Client, ns: &str) -> Result<(usize, usize)> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?
        .items;
    let ready = pods.iter().filter(|p| pod_is_ready(p)).count();
    Ok((ready, pods.len()))
}

/// Waits until the `apps` Deployments r000.. of `ns` each have `replicas` pods, all Ready and
/// up to date, as their status says: listing 100,000 pods every poll would load the API server
/// more than the operator under test does.
async fn wait_deployments(
    client: &Client,
    ns: &str,
    apps: usize,
    replicas: i32,
    timeout: Duration,
    step: &Step,
) -> Result<()> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let want = usize::try_from(replicas)? * apps;
    wait_until(
        &format!("{apps} Deployments of {replicas} Ready pods in {ns}"),
        timeout,
        || async {
            let deployments = api.list(&ListParams::default()).await?.items;
            let mut ready = 0;
            let mut done = 0;
            for d in &deployments {
                let st = d.status.clone().unwrap_or_default();
                let r = st.ready_replicas.unwrap_or(0);
                ready += usize::try_from(r).unwrap_or(0);
                if st.observed_generation >= d.metadata.generation
                    && r == replicas
                    && st.updated_replicas.unwrap_or(0) == replicas
                    && st.replicas.unwrap_or(0) == replicas
                {
                    done += 1;
                }
            }
            step.set(format!("{ready}/{want} pods Ready"));
            Ok(if done == apps && deployments.len() == apps {
                Check::Done(())
            } else {
                Check::Pending(format!(
                    "{ready} of {want} pods Ready, {done} of {apps} Deployments done"
                ))
            })
        },
    )
    .await
}

async fn wait_pods(
    client: &Client,
    ns: &str,
    want: usize,
    timeout: Duration,
    step: &Step,
) -> Result<()> {
    wait_until(&format!("{want} Ready pods in {ns}"), timeout, || async {
        let (ready, all) = count_ready_pods(client, ns).await?;
        step.set(format!("{ready}/{want} pods Ready ({all} exist)"));
        Ok(if ready == want && all == want {
            Check::Done(())
        } else {
            Check::Pending(format!("{ready} Ready of {all}, want {want}"))
        })
    })
    .await
}

/// Creates `count` requests (drain or not) on `nodes`, then plays the requestor: deletes each
/// request once Ready, until none is left. Returns (seconds to the last Ready, seconds to none
/// left), both from the first create.
async fn run_requests(
    client: &Client,
    ns: &str,
    nodes: &[String],
    drain: bool,
    timeout: Duration,
    step: &Step,
) -> Result<(f64, f64)> {
    use kube::runtime::watcher;
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let total = nodes.len();
    // The requestor: a watch on the requests, each deleted the moment it shows Ready, the
    // deletions concurrent, as a controller releasing its nodes would. Polling and deleting one
    // at a time would time the requestor, not the operator.
    let api: Api<NodeMaintenance> = Api::namespaced(client.clone(), ns);
    let events = watcher(api.clone(), watcher::Config::default());
    futures::pin_mut!(events);
    // The first event starts the watch: a request created before its list is in the list, one
    // created after comes through the watch, so no Ready is missed.
    match tokio::time::timeout_at(deadline, events.next()).await {
        Ok(Some(Ok(_))) => {}
        Ok(Some(Err(e))) => bail!("watching the requests of {ns}: {e}"),
        Ok(None) | Err(_) => bail!("the watch on the requests of {ns} did not start"),
    }
    futures::stream::iter(nodes.iter().enumerate())
        .map(|(i, node)| {
            let client = client.clone();
            let ns = ns.to_string();
            async move {
                let mut spec = request_spec(node, "bench.example.com");
                if drain {
                    spec.drain_spec = drain_spec(false, 0);
                }
                create_request(&client, &ns, &format!("r{i}"), spec).await
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    step.set(format!("{total} requests created"));
    let mut releasing: HashSet<String> = HashSet::new();
    // The requests the watch shows, rebuilt on a re-list (which may hide deletions).
    let mut present: HashSet<String> = HashSet::new();
    let mut relisting: Option<HashSet<String>> = None;
    let mut ever_seen: HashSet<String> = HashSet::new();
    let mut last_ready = 0.0;
    let mut deletions = tokio::task::JoinSet::new();
    loop {
        // Done when none is left; a request never seen (created and deleted while the watch was
        // re-listing) is looked up once rather than waited for.
        if present.is_empty()
            && relisting.is_none()
            && (ever_seen.len() == total
                || api.list(&ListParams::default()).await?.items.is_empty())
        {
            break;
        }
        let event = tokio::select! {
            event = events.next() => event,
            Some(done) = deletions.join_next() => {
                done.context("a deletion task failed")??;
                continue;
            }
            _ = tokio::time::sleep_until(deadline) => bail!(
                "timed out after {timeout:?}: {} of {total} requests left, {} released",
                present.len(),
                releasing.len()
            ),
        };
        let event = match event {
            Some(Ok(event)) => event,
            Some(Err(e)) => {
                // The watcher re-lists by itself after an error; say so and go on.
                step.set(format!("watch error (retrying): {e}"));
                continue;
            }
            None => bail!("the watch on the requests of {ns} ended"),
        };
        let ready = match event {
            watcher::Event::Apply(r) => {
                present.insert(r.name_any());
                Some(r)
            }
            watcher::Event::InitApply(r) => {
                relisting
                    .get_or_insert_with(HashSet::new)
                    .insert(r.name_any());
                Some(r)
            }
            watcher::Event::Delete(r) => {
                present.remove(&r.name_any());
                None
            }
            watcher::Event::Init => {
                relisting = Some(HashSet::new());
                None
            }
            watcher::Event::InitDone => {
                present = relisting.take().unwrap_or_default();
                None
            }
        };
        if let Some(r) = ready {
            ever_seen.insert(r.name_any());
            if r.phase() == Phase::Ready && !r.is_deleting() && releasing.insert(r.name_any()) {
                last_ready = started.elapsed().as_secs_f64();
                let (client, ns, name) = (client.clone(), ns.to_string(), r.name_any());
                deletions.spawn(async move { delete_request(&client, &ns, &name).await });
            }
        }
        step.set(format!(
            "{}/{total} released, {} left",
            releasing.len(),
            present.len()
        ));
    }
    while let Some(done) = deletions.join_next().await {
        done.context("a deletion task failed")??;
    }
    Ok((last_ready, started.elapsed().as_secs_f64()))
}

/// Merge patches per second the API server sustains: 32 writers, each patching an annotation of
/// its own ConfigMap as fast as the answers come, for 5 s. The audit policy, the etcd and the
/// machine are those the workloads run on, so this bounds what any client achieves here.
async fn api_write_ceiling(client: &Client, ns: &str, step: &Step) -> Result<f64> {
    use k8s_openapi::api::core::v1::ConfigMap;
    const WRITERS: usize = 32;
    const WINDOW: Duration = Duration::from_secs(5);
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    for i in 0..WRITERS {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("ceiling-{i}")),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &cm)
            .await
            .with_context(|| format!("creating ConfigMap {ns}/ceiling-{i}"))?;
    }
    step.set(format!("{WRITERS} writers for {WINDOW:?}"));
    let started = Instant::now();
    let counts = futures::future::try_join_all((0..WRITERS).map(|i| {
        let api = api.clone();
        async move {
            let mut done = 0usize;
            while started.elapsed() < WINDOW {
                let patch =
                    serde_json::json!({"metadata": {"annotations": {"n": done.to_string()}}});
                api.patch(
                    &format!("ceiling-{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .with_context(|| format!("patching ConfigMap ceiling-{i}"))?;
                done += 1;
            }
            anyhow::Ok(done)
        }
    }))
    .await?;
    Ok(counts.iter().sum::<usize>() as f64 / started.elapsed().as_secs_f64())
}

// ---------------------------------------------------------------------------------------------
// Workload a: no drain

async fn no_drain(size: &Size, progress: &Progress) -> Result<NoDrain> {
    let step = progress.begin("no-drain: control plane");
    let testbed = Testbed::start().await?;
    let client = testbed.client().await?;
    install(&client, Some(limits(i32::try_from(size.parallel)?, None))).await?;
    step.end("started");

    let step = progress.begin("no-drain: nodes");
    let nodes = create_nodes(&client, &unique_name("nd"), size.nodes + 1, &[]).await?;
    wait_nodes_ready(&client, &nodes, size.wait(size.nodes)).await?;
    let ns = unique_name("nd");
    create_namespace(&client, &ns).await?;
    let op = Operator::start_as(&testbed, BENCH_OPERATOR_ACCOUNT, &[]).await?;
    // Warm-up, not measured: the first write of a custom resource sets up its storage.
    let warm = progress.begin("no-drain: warm-up request");
    run_requests(
        &client,
        &ns,
        &nodes[size.nodes..],
        false,
        size.wait(0),
        &warm,
    )
    .await?;
    warm.end("done");
    step.end(&format!("{} nodes Ready, operator started", size.nodes));

    let step = progress.begin(&format!(
        "no-drain: {} requests, maxParallelOperations {}",
        size.requests, size.parallel
    ));
    let from = Timestamp::now();
    let cpu_before = operator_cpu_seconds(&op)?;
    let cpu_by_process_before = cpu_by_process(&testbed, Some(&op))?;
    let (_, seconds) = run_requests(
        &client,
        &ns,
        &nodes[..size.requests],
        false,
        size.wait(size.requests * 4),
        &step,
    )
    .await?;
    let requests_per_second = size.requests as f64 / seconds;
    let cpu_during_run = cpu_between(&cpu_by_process_before, cpu_by_process(&testbed, Some(&op))?);
    step.end(&format!(
        "all Ready and released in {seconds:.1}s, {requests_per_second:.1} requests/s"
    ));
    // The operator sends Events in the background: count its calls once they are all out.
    let released_at = Instant::now();
    let events_lag_seconds =
        wait_events_settled(&client, &ns, released_at, size.wait(size.requests)).await?;
    let to = Timestamp::now();
    println!(
        "    the last Event reached the API server {events_lag_seconds:.1}s after the last request was gone"
    );

    let cpu_seconds_per_request =
        (operator_cpu_seconds(&op)? - cpu_before) / size.requests.max(1) as f64;
    let (rss_peak_mib, _) = operator_rss(&op)?;
    let scheduler_rounds = op
        .metric("maintenance_operator_scheduler_runs_total")
        .await
        .unwrap_or(f64::NAN);
    let scheduler_seconds = op
        .metric("maintenance_operator_scheduler_run_duration_seconds_sum")
        .await
        .unwrap_or(f64::NAN);
    let log = AuditLog::read(&testbed)?;
    let (calls, calls_by_verb, calls_by_resource) = operator_calls(&log, from, to);
    let timeline = lifecycle_timeline(&log, &ns, &nodes[..size.requests], size.parallel, from, to);
    for segment in &timeline {
        println!(
            "    {}: median {:.0} ms, p90 {:.0} ms ({} requests)",
            segment.name, segment.median_ms, segment.p90_ms, segment.samples
        );
    }
    println!(
        "    operator API calls: {calls} ({:.2} per request), by verb {calls_by_verb:?}",
        ratio(calls, size.requests)
    );
    let ceiling = progress.begin("no-drain: the API server's write ceiling");
    let writes_per_second = api_write_ceiling(&client, &ns, &ceiling).await?;
    let bound = writes_per_second / ratio(calls, size.requests);
    ceiling.end(&format!(
        "{writes_per_second:.0} writes/s: at most {bound:.1} requests/s at this many calls per request"
    ));
    Ok(NoDrain {
        nodes: size.nodes,
        requests: size.requests,
        parallel: size.parallel,
        seconds,
        requests_per_second,
        calls_per_request: ratio(calls, size.requests),
        events_lag_seconds,
        timeline,
        calls_by_verb,
        calls_by_resource,
        scheduler_rounds,
        scheduler_seconds,
        rss_peak_mib,
        cpu_seconds_per_request,
        api_writes_per_second: writes_per_second,
        cpu_during_run,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
    })
}

// ---------------------------------------------------------------------------------------------
// Workload b: drain, ours and kubectl's

fn one_per_node(app: &str) -> TopologySpreadConstraint {
    TopologySpreadConstraint {
        max_skew: 1,
        topology_key: "kubernetes.io/hostname".into(),
        when_unsatisfiable: "DoNotSchedule".into(),
        label_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Pods labelled `app`: on nodes of the pool `pool` only, one per node; or (no pool) anywhere the
/// scheduler puts them.
fn app_template(app: &str, pool: Option<&str>) -> PodTemplateSpec {
    let labels = BTreeMap::from([("app".to_string(), app.to_string())]);
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            node_selector: pool.map(|pool| BTreeMap::from([(POOL.to_string(), pool.to_string())])),
            topology_spread_constraints: pool.map(|_| vec![one_per_node(app)]),
            termination_grace_period_seconds: Some(DEFAULT_GRACE_SECONDS),
            containers: vec![Container {
                name: "main".into(),
                image: Some(PAUSE_IMAGE.into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
    }
}

/// Creates workload `app`: a StatefulSet (pods created in parallel) or a Deployment of
/// `replicas` pods from `template`.
async fn create_app(
    client: &Client,
    ns: &str,
    app: &str,
    replicas: i32,
    template: PodTemplateSpec,
    stateful: bool,
) -> Result<()> {
    let meta = ObjectMeta {
        name: Some(app.to_string()),
        namespace: Some(ns.to_string()),
        ..Default::default()
    };
    if stateful {
        let sts = StatefulSet {
            metadata: meta,
            spec: StatefulSetSpec {
                replicas: Some(replicas),
                selector: app_selector(app),
                service_name: Some(app.to_string()),
                pod_management_policy: Some("Parallel".into()),
                template,
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<StatefulSet>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &sts)
            .await
            .with_context(|| format!("creating StatefulSet {ns}/{app}"))?;
    } else {
        let deployment = Deployment {
            metadata: meta,
            spec: DeploymentSpec {
                replicas: Some(replicas),
                selector: app_selector(app),
                template,
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Deployment>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &deployment)
            .await
            .with_context(|| format!("creating Deployment {ns}/{app}"))?;
    }
    Ok(())
}

fn app_selector(app: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
        ..Default::default()
    }
}

/// A cluster ready to be drained: `drained` nodes holding `pods_per_node` workload pods each (one
/// per Deployment or StatefulSet, each under a PodDisruptionBudget) and a DaemonSet pod, and as
/// many spare nodes, where the replacements go (so that no pod is evicted twice).
struct DrainCluster {
    testbed: Testbed,
    client: Client,
    ns: String,
    drained: Vec<String>,
    pods: usize,
}

async fn drain_cluster(
    size: &Size,
    k: usize,
    who: &str,
    progress: &Progress,
) -> Result<DrainCluster> {
    let x = size.drain_nodes;
    let step = progress.begin(&format!("drain {who} K={k}: control plane"));
    let testbed = Testbed::start().await?;
    let client = testbed.client().await?;
    let k32 = i32::try_from(k)?;
    install(&client, Some(limits(k32, k32))).await?;
    step.end("started");

    let step = progress.begin(&format!("drain {who} K={k}: workload"));
    let ns = unique_name("drain");
    create_namespace(&client, &ns).await?;
    let drained = create_nodes(&client, "drain", x, &[(POOL, ns.as_str())]).await?;
    let spares = create_nodes(&client, "spare", x, &[]).await?;
    step.set("nodes");
    wait_nodes_ready(&client, &drained, size.wait(x)).await?;
    wait_nodes_ready(&client, &spares, size.wait(x)).await?;
    let replicas = i32::try_from(x)?;
    // Workload i: one pod per drained node. The last one is a StatefulSet when there are two or
    // more; budgets: maxUnavailable 1, 10% (rounded up), minAvailable replicas - 1, in turn.
    let apps: Vec<String> = (0..size.pods_per_node)
        .map(|i| format!("w{i:03}"))
        .collect();
    for (i, app) in apps.iter().enumerate() {
        let stateful = i + 1 == apps.len() && apps.len() >= 2;
        create_app(
            &client,
            &ns,
            app,
            replicas,
            app_template(app, Some(&ns)),
            stateful,
        )
        .await?;
        let selector = [("app", app.as_str())];
        create_pdb_of_kind(&client, &ns, app, &selector, i, replicas).await?;
    }
    // A DaemonSet on every node: skipped by both drains.
    create_daemonset(
        &client,
        &ns,
        "node-agent",
        &[("app", "node-agent")],
        &PodSpecOptions::on_nodes_labelled("type", "kwok"),
    )
    .await?;
    let workload_pods = x * size.pods_per_node;
    let pods = workload_pods + 2 * x;
    wait_pods(&client, &ns, pods, size.wait(pods), &step).await?;
    // Replacements go to the spare nodes only.
    for node in &drained {
        set_node_label(&client, node, POOL, None).await?;
    }
    for node in &spares {
        set_node_label(&client, node, POOL, Some(&ns)).await?;
    }
    wait_pdbs_settled(&client, &ns, apps.len(), replicas, size.wait(pods), &step).await?;
    step.end(&format!(
        "{x} nodes x {} pods ({} PDBs) + a DaemonSet, {x} spare nodes",
        size.pods_per_node,
        apps.len()
    ));
    Ok(DrainCluster {
        testbed,
        client,
        ns,
        drained,
        pods: workload_pods,
    })
}

/// Waits until the `count` PDBs of `ns` count all `replicas` pods of their workload healthy, as
/// the disruption controller reported for their current generation.
async fn wait_pdbs_settled(
    client: &Client,
    ns: &str,
    count: usize,
    replicas: i32,
    timeout: Duration,
    step: &Step,
) -> Result<()> {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    wait_until(
        "every PDB to count all its pods healthy",
        timeout,
        || async {
            let list = pdbs.list(&ListParams::default()).await?.items;
            let unsettled = list
                .iter()
                .filter(|p| {
                    p.status.as_ref().is_none_or(|s| {
                        s.observed_generation < p.metadata.generation
                            || s.current_healthy != Some(replicas)
                            || s.expected_pods != Some(replicas)
                    })
                })
                .count();
            step.set(format!("{unsettled} of {} PDBs not settled", list.len()));
            Ok(if list.len() == count && unsettled == 0 {
                Check::Done(())
            } else {
                Check::Pending(format!("{} PDBs, {unsettled} unsettled", list.len()))
            })
        },
    )
    .await
}

fn evictions_summary(
    log: &AuditLog,
    ns: &str,
    user: &str,
    from: Timestamp,
) -> (usize, usize, BTreeMap<u16, usize>) {
    let mut codes = BTreeMap::new();
    let mut calls = 0;
    for e in log
        .evictions
        .iter()
        .filter(|e| e.namespace == ns && e.user == user && e.received >= from)
    {
        calls += 1;
        *codes.entry(e.code).or_default() += 1;
    }
    let evicted = codes.get(&201).copied().unwrap_or(0);
    (calls, evicted, codes)
}

/// What a drain run was: who, how many nodes and workload pods, how many at a time, and its two
/// times (seconds until every node was given back, and until the last was drained).
struct RunShape {
    who: &'static str,
    nodes: usize,
    pods: usize,
    parallel: usize,
    seconds: f64,
    last_drained: f64,
}

/// A run's figures from the audit log: the evictions by `user` in `ns` from `from`, and (the
/// operator's runs, `operator_until` given) all its API calls until then.
fn drain_run(
    shape: RunShape,
    log: &AuditLog,
    ns: &str,
    user: &str,
    from: Timestamp,
    operator_until: Option<Timestamp>,
) -> DrainRun {
    let (eviction_calls, evicted_pods, eviction_codes) = evictions_summary(log, ns, user, from);
    let (api_calls, calls_by_verb, calls_by_resource) = match operator_until {
        Some(to) => {
            let (calls, by_verb, by_resource) = operator_calls(log, from, to);
            (Some(calls), by_verb, by_resource)
        }
        None => (None, BTreeMap::new(), BTreeMap::new()),
    };
    DrainRun {
        who: shape.who.into(),
        nodes: shape.nodes,
        pods: shape.pods,
        parallel: shape.parallel,
        seconds: shape.seconds,
        seconds_to_last_drained: shape.last_drained,
        eviction_calls,
        evicted_pods,
        eviction_codes,
        eviction_calls_per_pod: ratio(eviction_calls, evicted_pods),
        api_calls,
        api_calls_per_pod: api_calls.map(|calls| ratio(calls, evicted_pods)),
        calls_by_verb,
        calls_by_resource,
        rss_peak_mib: None,
        invariants: None,
        chains: None,
        controller_queues: Vec::new(),
        cpu_during_run: BTreeMap::new(),
        simulator_deletions: None,
    }
}

/// The operator's side of a drain run: plays the requestor on `nodes` (each released once Ready)
/// while `op` drains them, then reads the run's figures and the operator's peak RSS. Returns the
/// run, the audit log and when the requests began (for the caller's own figures).
async fn operator_drain_run(
    testbed: &Testbed,
    client: &Client,
    ns: &str,
    nodes: &[String],
    (pods, parallel, timeout): (usize, usize, Duration),
    op: &Operator,
    step: &Step,
) -> Result<(DrainRun, AuditLog, Timestamp)> {
    let from = Timestamp::now();
    let (last_drained, seconds) = run_requests(client, ns, nodes, true, timeout, step).await?;
    let to = Timestamp::now();
    let (rss_peak, _) = operator_rss(op)?;
    let log = AuditLog::read(testbed)?;
    let shape = RunShape {
        who: "operator",
        nodes: nodes.len(),
        pods,
        parallel,
        seconds,
        last_drained,
    };
    let user = service_account_user(BENCH_OPERATOR_ACCOUNT);
    let mut run = drain_run(shape, &log, ns, &user, from, Some(to));
    run.rss_peak_mib = Some(rss_peak);
    Ok((run, log, from))
}

async fn drain_ours(size: &Size, k: usize, progress: &Progress) -> Result<DrainRun> {
    let cluster = drain_cluster(size, k, "operator", progress).await?;
    let x = cluster.drained.len();
    let op = Operator::start_as(&cluster.testbed, BENCH_OPERATOR_ACCOUNT, &[]).await?;
    let step = progress.begin(&format!(
        "drain operator K={k}: {x} nodes, maxParallelOperations=maxUnavailable={k}"
    ));
    let (run, _, _) = operator_drain_run(
        &cluster.testbed,
        &cluster.client,
        &cluster.ns,
        &cluster.drained,
        (cluster.pods, k, size.wait(cluster.pods * 4)),
        &op,
        &step,
    )
    .await?;
    let (seconds, last_ready) = (run.seconds, run.seconds_to_last_drained);
    let (evicted_pods, eviction_calls) = (run.evicted_pods, run.eviction_calls);
    let calls = run.api_calls.unwrap_or_default();
    step.end(&format!(
        "{seconds:.1}s (last Ready at {last_ready:.1}s); {evicted_pods} pods evicted with \
         {eviction_calls} eviction calls ({:.2}/pod), {calls} API calls ({:.2}/pod)",
        run.eviction_calls_per_pod,
        ratio(calls, evicted_pods)
    ));
    ensure!(
        evicted_pods == cluster.pods,
        "the operator evicted {evicted_pods} pods, want {}",
        cluster.pods
    );
    Ok(run)
}

async fn kubectl_path() -> Result<PathBuf> {
    let out = tokio::process::Command::new(testbed_script())
        .arg("bin-dir")
        .output()
        .await
        .context("running testbed bin-dir")?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let path = Path::new(&dir).join("kubectl");
    if out.status.success() && path.exists() {
        return Ok(path);
    }
    Ok(PathBuf::from("kubectl"))
}

async fn kubectl(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> Result<()> {
    let out = tokio::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {}", kubectl.display()))?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// `kubectl drain --ignore-daemonsets` then `kubectl uncordon` of each node, `k` nodes at a time.
/// Returns (seconds until all are uncordoned, seconds until the last drain returned).
async fn kubectl_drain_each(
    testbed: &Testbed,
    nodes: &[String],
    k: usize,
    timeout: Duration,
    step: &Step,
) -> Result<(f64, f64)> {
    let kubectl_bin = kubectl_path().await?;
    let kubeconfig = testbed.kubeconfig_path().to_path_buf();
    let x = nodes.len();
    let started = Instant::now();
    let timeout_arg = format!("--timeout={}s", timeout.as_secs());
    let done = std::sync::atomic::AtomicUsize::new(0);
    let last_drained = std::sync::Mutex::new(0.0f64);
    let results: Vec<Result<()>> = futures::stream::iter(nodes.iter())
        .map(|node| {
            let (kubectl_bin, kubeconfig, timeout_arg) = (&kubectl_bin, &kubeconfig, &timeout_arg);
            let (done, last_drained, step) = (&done, &last_drained, &step);
            async move {
                kubectl(
                    kubectl_bin,
                    kubeconfig,
                    &[
                        "drain",
                        node,
                        "--ignore-daemonsets",
                        "--delete-emptydir-data",
                        timeout_arg,
                    ],
                )
                .await?;
                if let Ok(mut t) = last_drained.lock() {
                    *t = started.elapsed().as_secs_f64();
                }
                kubectl(kubectl_bin, kubeconfig, &["uncordon", node]).await?;
                let n = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                step.set(format!("{n}/{x} nodes drained and uncordoned"));
                Ok(())
            }
        })
        .buffer_unordered(k)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<_>>>()?;
    let seconds = started.elapsed().as_secs_f64();
    let last = last_drained.lock().map(|t| *t).unwrap_or(f64::NAN);
    Ok((seconds, last))
}

async fn drain_kubectl(size: &Size, k: usize, progress: &Progress) -> Result<DrainRun> {
    let cluster = drain_cluster(size, k, "kubectl", progress).await?;
    let x = cluster.drained.len();
    let step = progress.begin(&format!("drain kubectl K={k}: {x} nodes, {k} at a time"));
    let from = Timestamp::now();
    let (seconds, last) = kubectl_drain_each(
        &cluster.testbed,
        &cluster.drained,
        k,
        size.wait(cluster.pods * 4),
        &step,
    )
    .await?;
    let log = AuditLog::read(&cluster.testbed)?;
    let shape = RunShape {
        who: "kubectl",
        nodes: x,
        pods: cluster.pods,
        parallel: k,
        seconds,
        last_drained: last,
    };
    let run = drain_run(shape, &log, &cluster.ns, ADMIN_USER, from, None);
    let (evicted_pods, eviction_calls) = (run.evicted_pods, run.eviction_calls);
    step.end(&format!(
        "{seconds:.1}s (last drain returned at {last:.1}s); {evicted_pods} pods evicted with \
         {eviction_calls} eviction calls ({:.2}/pod)",
        run.eviction_calls_per_pod
    ));
    ensure!(
        evicted_pods == cluster.pods,
        "kubectl evicted {evicted_pods} pods, want {}",
        cluster.pods
    );
    Ok(run)
}

// ---------------------------------------------------------------------------------------------
// Workload d: every node of the cluster maintained, ours and kubectl's

struct FleetCluster {
    testbed: Testbed,
    client: Client,
    ns: String,
    nodes: Vec<String>,
    pods: usize,
    max_unavailable: IntOrString,
    /// Workloads under a budget that allows one disruption at a time.
    strict: HashSet<String>,
}

/// `fleet_nodes` nodes, about `fleet_pods_per_node` workload pods each: Deployments (every tenth
/// workload a StatefulSet) of `fleet_replicas` pods, each Deployment under a PDB (maxUnavailable
/// 1, 10%, minAvailable n-1 in turn), spread by the scheduler, and a DaemonSet on every node.
async fn fleet_cluster(size: &Size, who: &str, progress: &Progress) -> Result<FleetCluster> {
    let (n, k) = (size.fleet_nodes, size.fleet_parallel);
    let step = progress.begin(&format!("fleet {who}: control plane"));
    let testbed = Testbed::start().await?;
    let client = testbed.client().await?;
    let k32 = i32::try_from(k)?;
    let max_unavailable = if k * 10 == n {
        IntOrString::String("10%".into())
    } else {
        IntOrString::Int(k32)
    };
    let mut config = limits(k32, None);
    config.max_unavailable = Some(max_unavailable.clone());
    if !size.fleet_taint_waiting_nodes {
        config.admission = Some(maintenance_crds::Admission {
            taint_waiting_nodes: Some(false),
            ..maintenance_crds::Admission::default()
        });
    }
    install(&client, Some(config)).await?;
    step.end("started");

    let step = progress.begin(&format!("fleet {who}: workload"));
    let ns = unique_name("fleet");
    create_namespace(&client, &ns).await?;
    let nodes = create_nodes(&client, "fleet", n, &[]).await?;
    step.set("nodes");
    wait_nodes_ready(&client, &nodes, size.wait(n)).await?;
    let replicas = size.fleet_replicas.min(n);
    let apps: Vec<String> = (0..(n * size.fleet_pods_per_node / replicas).max(1))
        .map(|i| format!("f{i:04}"))
        .collect();
    let replicas32 = i32::try_from(replicas)?;
    // StatefulSets go without a budget: one re-creates an evicted pod under the same name, and
    // when the disruption controller syncs only after that (as it does under this load), it keeps
    // the name in `disruptedPods` for its two-minute DeletionTimeout and allows nothing
    // meanwhile. With a budget on them both drains would measure that timeout.
    let mut budgets = 0;
    let mut strict = HashSet::new();
    for (i, app) in apps.iter().enumerate() {
        let stateful = i % 10 == 9;
        create_app(
            &client,
            &ns,
            app,
            replicas32,
            app_template(app, None),
            stateful,
        )
        .await?;
        if !stateful {
            let selector = [("app", app.as_str())];
            create_pdb_of_kind(&client, &ns, app, &selector, i, replicas32).await?;
            budgets += 1;
            // maxUnavailable 1 and minAvailable n-1 (kinds 0 and 2 of create_pdb_of_kind).
            if i % 3 != 1 {
                strict.insert(app.clone());
            }
        }
        step.set(format!("{}/{} workloads", i + 1, apps.len()));
    }
    create_daemonset(
        &client,
        &ns,
        "node-agent",
        &[("app", "node-agent")],
        &PodSpecOptions::on_nodes_labelled("type", "kwok"),
    )
    .await?;
    let workload_pods = apps.len() * replicas;
    let pods = workload_pods + n;
    wait_pods(&client, &ns, pods, size.wait(pods), &step).await?;
    wait_pdbs_settled(&client, &ns, budgets, replicas32, size.wait(pods), &step).await?;
    step.end(&format!(
        "{n} nodes, {workload_pods} workload pods ({} workloads of {replicas}, {budgets} PDBs) + \
         a DaemonSet",
        apps.len()
    ));
    Ok(FleetCluster {
        testbed,
        client,
        ns,
        nodes,
        pods: workload_pods,
        max_unavailable,
        strict,
    })
}

fn int_or_string(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

async fn fleet_ours(size: &Size, progress: &Progress) -> Result<DrainRun> {
    let cluster = fleet_cluster(size, "operator", progress).await?;
    let (n, k) = (cluster.nodes.len(), size.fleet_parallel);
    let user = service_account_user(BENCH_OPERATOR_ACCOUNT);
    let monitor = InvariantMonitor::start(
        &cluster.testbed,
        Scope::new(&cluster.ns, &cluster.nodes).operator_user(user.clone()),
    )
    .await?;
    let op = Operator::start_as(&cluster.testbed, BENCH_OPERATOR_ACCOUNT, &[]).await?;
    let max_unavailable = int_or_string(&cluster.max_unavailable);
    let step = progress.begin(&format!(
        "fleet operator: all {n} nodes, maxParallelOperations {k}, maxUnavailable {max_unavailable}"
    ));
    let queues_before = controller_queue_totals(&cluster.testbed).await?;
    let cpu_before = cpu_by_process(&cluster.testbed, Some(&op))?;
    let (mut run, log, from) = operator_drain_run(
        &cluster.testbed,
        &cluster.client,
        &cluster.ns,
        &cluster.nodes,
        (cluster.pods, k, size.wait(cluster.pods * 4)),
        &op,
        &step,
    )
    .await?;
    run.cpu_during_run = cpu_between(&cpu_before, cpu_by_process(&cluster.testbed, Some(&op))?);
    run.controller_queues = queues_between(
        &queues_before,
        &controller_queue_totals(&cluster.testbed).await?,
    );
    let (seconds, last_ready) = (run.seconds, run.seconds_to_last_drained);
    let seen = monitor.finish().await?;
    run.invariants = Some(FleetInvariants {
        max_parallel: k,
        max_unavailable,
        peak_in_maintenance: seen.peak_in_maintenance,
        peak_unavailable: seen.peak_unavailable,
        lowest_pdb_margin: seen.lowest_pdb_margin,
        events: seen.events,
    });
    run.chains = budget_chains(&log, &cluster.ns, &user, from, &cluster.strict);
    run.simulator_deletions = Some(simulator_deletions(&log, &cluster.ns, from));
    let (evicted_pods, eviction_calls) = (run.evicted_pods, run.eviction_calls);
    let calls = run.api_calls.unwrap_or_default();
    step.end(&format!(
        "{seconds:.1}s (last Ready at {last_ready:.1}s); {evicted_pods} evictions with \
         {eviction_calls} calls ({:.2}/pod), {calls} API calls ({:.2}/pod); {seen}",
        run.eviction_calls_per_pod,
        ratio(calls, evicted_pods)
    ));
    // Every pod is evicted once from its first node; replacements on nodes maintained later are
    // evicted again.
    ensure!(
        evicted_pods >= cluster.pods,
        "the operator evicted {evicted_pods} pods, want at least {}",
        cluster.pods
    );
    Ok(run)
}

async fn fleet_kubectl(size: &Size, progress: &Progress) -> Result<DrainRun> {
    let cluster = fleet_cluster(size, "kubectl", progress).await?;
    let (n, k) = (cluster.nodes.len(), size.fleet_parallel);
    let step = progress.begin(&format!("fleet kubectl: all {n} nodes, {k} at a time"));
    let queues_before = controller_queue_totals(&cluster.testbed).await?;
    let cpu_before = cpu_by_process(&cluster.testbed, None)?;
    let from = Timestamp::now();
    let (seconds, last) = kubectl_drain_each(
        &cluster.testbed,
        &cluster.nodes,
        k,
        size.wait(cluster.pods * 4),
        &step,
    )
    .await?;
    let log = AuditLog::read(&cluster.testbed)?;
    let shape = RunShape {
        who: "kubectl",
        nodes: n,
        pods: cluster.pods,
        parallel: k,
        seconds,
        last_drained: last,
    };
    let mut run = drain_run(shape, &log, &cluster.ns, ADMIN_USER, from, None);
    run.chains = budget_chains(&log, &cluster.ns, ADMIN_USER, from, &cluster.strict);
    run.simulator_deletions = Some(simulator_deletions(&log, &cluster.ns, from));
    // The bench process runs the kubectl processes' output readers only; kubectl itself is not
    // counted (many short processes).
    run.cpu_during_run = cpu_between(&cpu_before, cpu_by_process(&cluster.testbed, None)?);
    run.controller_queues = queues_between(
        &queues_before,
        &controller_queue_totals(&cluster.testbed).await?,
    );
    let (evicted_pods, eviction_calls) = (run.evicted_pods, run.eviction_calls);
    step.end(&format!(
        "{seconds:.1}s (last drain returned at {last:.1}s); {evicted_pods} evictions with \
         {eviction_calls} calls ({:.2}/pod)",
        run.eviction_calls_per_pod
    ));
    ensure!(
        evicted_pods >= cluster.pods,
        "kubectl evicted {evicted_pods} pods, want at least {}",
        cluster.pods
    );
    Ok(run)
}

// ---------------------------------------------------------------------------------------------
// Workload c: peak RSS at two cluster sizes

/// Measures into `points`, so that a size the testbed cannot reach leaves the smaller ones in
/// the report.
async fn rss(size: &Size, progress: &Progress, points: &mut Vec<RssPoint>) -> Result<()> {
    let step = progress.begin("rss: control plane");
    let testbed = Testbed::start().await?;
    let client = testbed.client().await?;
    step.end("started");
    let ns = unique_name("rss");
    let mut nodes: Vec<String> = Vec::new();
    let ppn = size.rss_pods_per_node;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    for (round, &want) in size.rss_nodes.iter().enumerate() {
        if round == 0 {
            create_namespace(&client, &ns).await?;
        }
        let step = progress.begin(&format!("rss: {want} nodes x {ppn} pods"));
        let setup_started = Instant::now();
        let more = want.saturating_sub(nodes.len());
        nodes.extend(create_nodes(&client, &format!("rss{round}"), more, &[]).await?);
        wait_nodes_ready(&client, &nodes, size.wait(want)).await?;
        let replicas = i32::try_from(nodes.len())?;
        if round == 0 {
            for app in (0..ppn).map(rss_app) {
                create_deployment(
                    &client,
                    &ns,
                    &app,
                    replicas,
                    &[("app", app.as_str())],
                    &PodSpecOptions::on_nodes_labelled("type", "kwok"),
                )
                .await?;
            }
        } else {
            scale_deployments(&deployments, ppn, replicas).await?;
        }
        let pods = nodes.len() * ppn;
        wait_deployments(&client, &ns, ppn, replicas, size.wait(pods), &step)
            .await
            .with_context(|| {
                format!(
                    "the testbed stopped growing at {} nodes x {ppn} pods; control plane RSS \
                     (MiB): {:?}",
                    nodes.len(),
                    control_plane_rss(&testbed)
                )
            })?;
        let setup_seconds = setup_started.elapsed().as_secs_f64();
        step.end(&format!("{} nodes, {pods} pods Ready", nodes.len()));

        // A fresh operator per run, all its requests under maintenance at once. Builds compared
        // side by side run one after the other, each on a rebalanced cluster: the run before
        // emptied its nodes onto the others.
        let operators: Vec<Option<&RssOperator>> = if size.rss_operators.is_empty() {
            vec![None]
        } else {
            size.rss_operators.iter().map(Some).collect()
        };
        for requests in rss_drains(size, nodes.len()) {
            for (i, operator) in operators.iter().enumerate() {
                if i > 0 {
                    let step = progress.begin(&format!("rss: rebalancing {pods} pods"));
                    rebalance(&client, &ns, ppn, replicas, size.wait(pods), &step).await?;
                    step.end("every pod replaced");
                }
                install(&client, Some(limits(i32::try_from(requests)?, None))).await?;
                let label = operator.map_or(String::new(), |o| format!(" ({})", o.label));
                let step = progress.begin(&format!(
                    "rss: operator{label} on {} nodes, {requests} drains",
                    nodes.len()
                ));
                let drained = &nodes[..requests];
                let pods_drained = pods_on_nodes(&client, &ns, drained).await?;
                let op = match operator {
                    None => Operator::start_as(&testbed, BENCH_OPERATOR_ACCOUNT, &[]).await?,
                    Some(o) => {
                        Operator::start_launched_as(
                            &testbed,
                            BENCH_OPERATOR_ACCOUNT,
                            o.launcher(),
                            &[],
                        )
                        .await?
                    }
                };
                let req_ns = unique_name("rss-req");
                create_namespace(&client, &req_ns).await?;
                let (_, seconds) = run_requests(
                    &client,
                    &req_ns,
                    drained,
                    true,
                    size.wait(requests * ppn * 4),
                    &step,
                )
                .await?;
                let (hwm, now) = operator_rss(&op)?;
                let cpu_seconds_per_request = operator_cpu_seconds(&op)? / requests.max(1) as f64;
                drop(op);
                step.end(&format!(
                    "peak RSS {hwm:.1} MiB (now {now:.1} MiB), {pods_drained} pods drained"
                ));
                points.push(RssPoint {
                    operator: operator.map(|o| o.label.clone()),
                    pods_drained,
                    nodes: nodes.len(),
                    pods,
                    requests,
                    rss_peak_mib: hwm,
                    rss_now_mib: now,
                    seconds,
                    cpu_seconds_per_request,
                    setup_seconds,
                    control_plane_rss_mib: control_plane_rss(&testbed),
                });
            }
        }
    }
    Ok(())
}

/// Puts the `apps` Deployments of `ns` back as the cluster's growth left them: scaled to 0
/// until no pod is left, then to `replicas` again, so that the scheduler spreads every pod over
/// a cluster as empty as at the first run. (A rollout restart is not enough: the nodes an
/// earlier run emptied draw more than their share of the new pods while the old ones still
/// stand.)
async fn rebalance(
    client: &Client,
    ns: &str,
    apps: usize,
    replicas: i32,
    timeout: Duration,
    step: &Step,
) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    scale_deployments(&deployments, apps, 0).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_until(&format!("no pod left in {ns}"), timeout, || async {
        let left = pods.list_metadata(&ListParams::default().limit(1)).await?;
        let count = left.items.len() + left.metadata.remaining_item_count.unwrap_or(0) as usize;
        step.set(format!("{count} pods left"));
        Ok(if left.items.is_empty() {
            Check::Done(())
        } else {
            Check::Pending(format!("{count} pods left"))
        })
    })
    .await?;
    scale_deployments(&deployments, apps, replicas).await?;
    wait_deployments(client, ns, apps, replicas, timeout, step).await
}

/// The name of the RSS runs' `i`th Deployment (one pod of each per node).
fn rss_app(i: usize) -> String {
    format!("r{i:03}")
}

/// Sets `spec.replicas` of the RSS runs' first `apps` Deployments.
async fn scale_deployments(
    deployments: &Api<Deployment>,
    apps: usize,
    replicas: i32,
) -> Result<()> {
    let patch = serde_json::json!({ "spec": { "replicas": replicas } });
    for app in (0..apps).map(rss_app) {
        deployments
            .patch(&app, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("scaling Deployment {app} to {replicas}"))?;
    }
    Ok(())
}

/// The pods of `ns` on `nodes` now.
async fn pods_on_nodes(client: &Client, ns: &str, nodes: &[String]) -> Result<usize> {
    let wanted: HashSet<&str> = nodes.iter().map(String::as_str).collect();
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut params = ListParams::default().limit(2000);
    let mut count = 0;
    loop {
        let page = api
            .list(&params)
            .await
            .with_context(|| format!("listing the pods of {ns}"))?;
        count += page
            .items
            .iter()
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .is_some_and(|n| wanted.contains(n))
            })
            .count();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(count),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The report

fn machine() -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    m.insert("nproc".into(), cpus.to_string());
    if let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo")
        && let Some(mib) = mib_from_status(&meminfo, "MemTotal")
    {
        m.insert("memory".into(), format!("{:.1} GiB", mib / 1024.0));
    }
    if let Ok(cpuinfo) = std::fs::read_to_string("/proc/cpuinfo")
        && let Some(model) = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')))
    {
        m.insert("cpu".into(), model.1.trim().to_string());
    }
    if let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        m.insert("kernel".into(), release.trim().to_string());
    }
    // The testbed's knobs (node lease, disruption workers) change what the control plane spends.
    for (key, value) in std::env::vars().filter(|(k, _)| k.starts_with("MO_TESTBED_")) {
        m.insert(key, value);
    }
    m.insert(
        "profile".into(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .into(),
    );
    m
}

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn commit() -> String {
    let head = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(s) if !s.is_empty() => format!("{head} (with uncommitted changes)"),
        _ => head,
    }
}

/// `value` against `target`: at most (`at_most`) or at least.
fn goal(what: &str, target: f64, at_most: bool, unit: &str, measured: Option<f64>) -> Goal {
    let sign = if at_most { "≤" } else { "≥" };
    let target_text = format!("{sign} {target}{unit}");
    let Some(v) = measured.filter(|v| v.is_finite()) else {
        return Goal {
            what: what.into(),
            target: target_text,
            measured: None,
            met: None,
            verdict: "not measured".into(),
        };
    };
    let met = if at_most { v <= target } else { v >= target };
    let off = (v - target).abs();
    let pct = off / target * 100.0;
    let verdict = if met {
        format!("**met**: {v:.2}{unit}, {off:.2}{unit} ({pct:.0}%) of margin")
    } else {
        format!("**missed** by {off:.2}{unit} ({pct:.0}%): {v:.2}{unit}")
    };
    Goal {
        what: what.into(),
        target: target_text,
        measured: Some(v),
        met: Some(met),
        verdict,
    }
}

fn max_of(values: impl Iterator<Item = f64>) -> Option<f64> {
    values.filter(|v| v.is_finite()).reduce(f64::max)
}

fn fleet_run<'a>(report: &'a Report, who: &str) -> Option<&'a DrainRun> {
    report.fleet.iter().find(|d| d.who == who)
}

/// Our wall time over kubectl's, every node maintained.
fn fleet_ratio(report: &Report) -> Option<f64> {
    let (ours, theirs) = (
        fleet_run(report, "operator")?,
        fleet_run(report, "kubectl")?,
    );
    (theirs.seconds > 0.0).then(|| ours.seconds / theirs.seconds)
}

fn goals(report: &Report) -> Vec<Goal> {
    let ours: Vec<&DrainRun> = report
        .drains
        .iter()
        .filter(|d| d.who == "operator")
        .collect();
    let time_ratio = max_of(ours.iter().filter_map(|o| {
        let theirs = report
            .drains
            .iter()
            .find(|d| d.who == "kubectl" && d.parallel == o.parallel)?;
        Some(o.seconds / theirs.seconds)
    }));
    vec![
        goal(
            "eviction calls per evicted pod (ours, worst K)",
            1.15,
            true,
            "",
            max_of(ours.iter().map(|d| d.eviction_calls_per_pod)),
        ),
        goal(
            "operator API requests per evicted pod (worst K)",
            2.5,
            true,
            "",
            max_of(ours.iter().filter_map(|d| d.api_calls_per_pod)),
        ),
        goal(
            "no-drain throughput",
            60.0,
            false,
            " req/s",
            report.no_drain.as_ref().map(|n| n.requests_per_second),
        ),
        goal(
            "our drain wall time / kubectl's (worst K)",
            0.4,
            true,
            "x",
            time_ratio,
        ),
        goal(
            "every node maintained: eviction calls per evicted pod (ours)",
            1.15,
            true,
            "",
            fleet_run(report, "operator").map(|d| d.eviction_calls_per_pod),
        ),
        goal(
            "every node maintained: our wall time / kubectl's",
            0.4,
            true,
            "x",
            fleet_ratio(report),
        ),
        goal(
            "operator peak RSS (largest cluster)",
            150.0,
            true,
            " MiB",
            max_of(first_build_rss(report).map(|r| r.rss_peak_mib)),
        ),
    ]
}

fn markdown(report: &Report, charts: &[(String, String)]) -> String {
    let mut md = String::new();
    let size = report.size.clone().unwrap_or_else(|| Size {
        name: "?".into(),
        ..Size::default()
    });
    let _ = writeln!(
        md,
        "# Benchmark report: {} ({})\n",
        report.started, size.name
    );
    let _ = writeln!(
        md,
        "Made by `make bench` (`tests/bench_report.rs`, `MO_BENCH_SIZE={}`) on real control \
         planes (`tests/testbed/testbed`, KWOK nodes), a fresh one per workload. API calls are \
         counted from the API server's audit log; the operator runs as ServiceAccount \
         `{BENCH_OPERATOR_ACCOUNT}`.\n",
        size.name
    );
    let _ = writeln!(md, "| Machine | |\n| --- | --- |");
    for (k, v) in &report.machine {
        let _ = writeln!(md, "| {k} | {v} |");
    }
    let _ = writeln!(md, "| git commit | {} |\n", report.commit);

    let _ = writeln!(
        md,
        "## Goals (docs/performance.md)\n\n| Goal | Target | Verdict |\n| --- | --- | --- |"
    );
    for g in &report.goals {
        let _ = writeln!(md, "| {} | {} | {} |", g.what, g.target, g.verdict);
    }

    if let Some(nd) = &report.no_drain {
        let _ = writeln!(
            md,
            "\n## No drain: throughput\n\n{} requests on {} nodes, maxParallelOperations {}, each \
             released (deleted) once Ready.\n\n| Figure | Value |\n| --- | --- |\n\
             | wall time, first create to last request gone | {:.1} s |\n\
             | throughput | {:.1} requests/s |\n\
             | operator API calls per request lifecycle | {:.2} |\n\
             | scheduler rounds (whole run) | {} |\n\
             | time in scheduler rounds (whole run; one at a time) | {:.1} s |\n\
             | operator CPU per request | {:.1} ms |\n\
             | the last Event (sent in the background) after the last request was gone | {:.1} s |\n\
             | the API server's ceiling: merge patches/s (32 writers, nothing else) | {:.0} |\n\
             | so at most, at these calls per request | {:.1} requests/s |\n\
             | operator peak RSS | {:.1} MiB |\n",
            nd.requests,
            nd.nodes,
            nd.parallel,
            nd.seconds,
            nd.requests_per_second,
            nd.calls_per_request,
            nd.scheduler_rounds,
            nd.scheduler_seconds,
            nd.cpu_seconds_per_request * 1000.0,
            nd.events_lag_seconds,
            nd.api_writes_per_second,
            nd.api_writes_per_second / nd.calls_per_request,
            nd.rss_peak_mib
        );
        let _ = writeln!(
            md,
            "Operator API calls per request lifecycle, by verb:\n\n| Verb | Calls | Per request |\n| --- | --- | --- |"
        );
        for (verb, n) in &nd.calls_by_verb {
            let _ = writeln!(md, "| {verb} | {n} | {:.2} |", ratio(*n, nd.requests));
        }
        let _ = writeln!(
            md,
            "\nBy verb and resource:\n\n| Call | Calls | Per request |\n| --- | --- | --- |"
        );
        for (call, n) in &nd.calls_by_resource {
            let _ = writeln!(md, "| {call} | {n} | {:.2} |", ratio(*n, nd.requests));
        }
        if !nd.timeline.is_empty() {
            let slot_ms = nd.seconds * nd.parallel as f64 / nd.requests.max(1) as f64 * 1000.0;
            let sum: f64 = nd.timeline.iter().map(|s| s.median_ms).sum();
            let _ = writeln!(
                md,
                "\nWhere a slot's time goes: each request's lifecycle cut at the operator's calls, \
                 as the API server received them (audit log). A slot serves a request every \
                 {slot_ms:.0} ms (wall time x maxParallelOperations / requests); the medians add \
                 up to {sum:.0} ms.\n\n| Segment | What happens in it | Requests | Median (ms) | \
                 p90 (ms) |\n| --- | --- | --- | --- | --- |"
            );
            for segment in &nd.timeline {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {:.0} | {:.0} |",
                    segment.name,
                    segment.covers,
                    segment.samples,
                    segment.median_ms,
                    segment.p90_ms
                );
            }
        }
        if !nd.cpu_during_run.is_empty() {
            let total: f64 = nd.cpu_during_run.values().sum();
            let available = nd.seconds * nd.cores as f64;
            let _ = writeln!(
                md,
                "\nWhere the machine's time goes: CPU seconds each process spent during the \
                 run ({:.1} s on {} cores, {available:.1} CPU seconds; these processes used \
                 {total:.1}, {:.0}%).\n\n| Process | CPU (s) | Share of the machine | \
                 Per request (ms) |\n| --- | --- | --- | --- |",
                nd.seconds,
                nd.cores,
                total / available * 100.0
            );
            let mut by_cost: Vec<(&String, &f64)> = nd.cpu_during_run.iter().collect();
            by_cost.sort_by(|a, b| b.1.total_cmp(a.1));
            for (process, seconds) in by_cost {
                let _ = writeln!(
                    md,
                    "| {process} | {seconds:.1} | {:.0}% | {:.1} |",
                    seconds / available * 100.0,
                    seconds / nd.requests.max(1) as f64 * 1000.0
                );
            }
        }
    }

    if !report.drains.is_empty() {
        let _ = writeln!(
            md,
            "\n## Drain: ours and `kubectl drain`\n\n{} nodes x {} pods (Deployments and a \
             StatefulSet, one pod per node each, PodDisruptionBudgets maxUnavailable 1, 10%, \
             minAvailable n-1 in turn; plus a DaemonSet, skipped), maintained K at a time: ours \
             with maxParallelOperations = maxUnavailable = K, each request released once Ready; \
             kubectl with K concurrent `kubectl drain --ignore-daemonsets` + `kubectl uncordon`. \
             Each run on a fresh, identical cluster; replacements go to as many spare nodes.\n\n\
             | Who | K | Wall time (s) | Last drained at (s) | Evicted pods | Eviction calls | \
             Calls/pod | Codes | API requests | Requests/evicted pod | Peak RSS (MiB) |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            size.drain_nodes, size.pods_per_node
        );
        for d in &report.drains {
            let codes: Vec<String> = d
                .eviction_codes
                .iter()
                .map(|(c, n)| format!("{c}: {n}"))
                .collect();
            let _ = writeln!(
                md,
                "| {} | {} | {:.1} | {:.1} | {} | {} | {:.2} | {} | {} | {} | {} |",
                d.who,
                d.parallel,
                d.seconds,
                d.seconds_to_last_drained,
                d.evicted_pods,
                d.eviction_calls,
                d.eviction_calls_per_pod,
                codes.join(", "),
                d.api_calls.map_or("-".into(), |n| n.to_string()),
                d.api_calls_per_pod
                    .map_or("-".into(), |v| format!("{v:.2}")),
                d.rss_peak_mib.map_or("-".into(), |v| format!("{v:.1}")),
            );
        }
        let _ = writeln!(
            md,
            "\nOur time / kubectl's:\n\n| K | Ratio |\n| --- | --- |"
        );
        for o in report.drains.iter().filter(|d| d.who == "operator") {
            if let Some(t) = report
                .drains
                .iter()
                .find(|d| d.who == "kubectl" && d.parallel == o.parallel)
            {
                let _ = writeln!(md, "| {} | {:.2}x |", o.parallel, o.seconds / t.seconds);
            }
        }
        let _ = writeln!(
            md,
            "\nOur API requests during the drains, by verb, then by verb and resource:\n\n| K | Call | Calls | Per evicted pod |\n| --- | --- | --- | --- |"
        );
        for o in report.drains.iter().filter(|d| d.who == "operator") {
            for (verb, n) in o.calls_by_verb.iter().chain(&o.calls_by_resource) {
                let _ = writeln!(
                    md,
                    "| {} | {verb} | {n} | {:.2} |",
                    o.parallel,
                    ratio(*n, o.evicted_pods)
                );
            }
        }
    }

    if !report.fleet.is_empty() {
        let any = &report.fleet[0];
        let _ = writeln!(
            md,
            "\n## Every node maintained: ours and `kubectl drain`\n\n{} nodes, {} workload pods \
             (Deployments, every tenth workload a StatefulSet, of {} pods each, each Deployment \
             under a PodDisruptionBudget: maxUnavailable 1, 10%, minAvailable n-1 in turn; the \
             scheduler spreads them) and a DaemonSet pod per node, skipped. The StatefulSets have \
             no budget: one re-creates an evicted pod under the same name, and under this load the \
             disruption controller then holds the name in `disruptedPods` for its two-minute \
             DeletionTimeout, allowing nothing; both drains would measure that timeout. Every node maintained {} at a \
             time: ours with maxParallelOperations {} and maxUnavailable as below, {}, each request \
             released once Ready, under the invariant monitor (`tests/support/invariants.rs`: any \
             PDB below desired, limit exceeded, node left cordoned or pod deleted fails the run); \
             kubectl with {} concurrent `kubectl drain --ignore-daemonsets` + `kubectl uncordon`. \
             Replacements land anywhere, maintained nodes included, so a pod can be evicted more \
             than once: evictions count every one.\n\n\
             | Who | Wall time (s) | Last drained at (s) | Evictions | Eviction calls | Calls/eviction \
             | Codes | API requests | Requests/eviction | Peak in maintenance | Peak unavailable | \
             Lowest PDB margin | Peak RSS (MiB) |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
            any.nodes,
            any.pods,
            size.fleet_replicas.min(any.nodes),
            any.parallel,
            any.parallel,
            if size.fleet_taint_waiting_nodes {
                "nodes waiting to be drained tainted PreferNoSchedule (`admission.taintWaitingNodes`, \
                 the default)"
            } else {
                "nodes waiting to be drained not tainted (`admission.taintWaitingNodes: false`)"
            },
            any.parallel
        );
        for d in &report.fleet {
            let codes: Vec<String> = d
                .eviction_codes
                .iter()
                .map(|(c, n)| format!("{c}: {n}"))
                .collect();
            let inv = d.invariants.as_ref();
            let _ = writeln!(
                md,
                "| {} | {:.1} | {:.1} | {} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {} |",
                d.who,
                d.seconds,
                d.seconds_to_last_drained,
                d.evicted_pods,
                d.eviction_calls,
                d.eviction_calls_per_pod,
                codes.join(", "),
                d.api_calls.map_or("-".into(), |n| n.to_string()),
                d.api_calls_per_pod
                    .map_or("-".into(), |v| format!("{v:.2}")),
                inv.map_or("-".into(), |i| format!(
                    "{} (limit {})",
                    i.peak_in_maintenance, i.max_parallel
                )),
                inv.map_or("-".into(), |i| format!(
                    "{} (limit {})",
                    i.peak_unavailable, i.max_unavailable
                )),
                inv.and_then(|i| i.lowest_pdb_margin)
                    .map_or("-".into(), |m| m.to_string()),
                d.rss_peak_mib.map_or("-".into(), |v| format!("{v:.1}")),
            );
        }
        if let Some(r) = fleet_ratio(report) {
            let _ = writeln!(md, "\nOur time / kubectl's: {r:.2}x.");
        }
        let _ = writeln!(
            md,
            "\nWhere the time goes: a budget that allows one disruption at a time (maxUnavailable \
             1, minAvailable n-1) makes its workload's evictions a chain, the next admitted only \
             once the last one's replacement is Ready and the disruption controller said so. The \
             longest chain bounds the run from below; the gap between two links is the control \
             plane's turn (replacement created, scheduled, Ready, budget updated) plus the \
             drainer's reaction (ours: the budget watch; kubectl: its 5 s retry).\n\n\
             | Who | One-at-a-time workloads | Longest chain | Its evictions | Its span (s) | \
             Median gap (ms) | p90 gap (ms) |\n| --- | --- | --- | --- | --- | --- | --- |"
        );
        for d in &report.fleet {
            if let Some(c) = &d.chains {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {:.1} | {:.0} | {:.0} |",
                    d.who,
                    c.workloads,
                    c.longest,
                    c.longest_evictions,
                    c.longest_span_seconds,
                    c.median_gap_ms,
                    c.p90_gap_ms
                );
            }
        }
        let _ = writeln!(
            md,
            "\nThe control plane's turn: kube-controller-manager's work queues during the run \
             (its `workqueue_*` metrics). A budget's next disruption waits in `disruption` (one \
             worker, `--concurrent-disruption-syncs`; each sync reads the budget's pods and \
             writes its status), a replacement pod in `replicaset` or `statefulset`. A wait of \
             seconds there is a wait no drainer can shorten.\n\n\
             | Who | Queue | Syncs | Mean wait in the queue (ms) | Mean sync (ms) |\n\
             | --- | --- | --- | --- | --- |"
        );
        for d in &report.fleet {
            for q in &d.controller_queues {
                let _ = writeln!(
                    md,
                    "| {} | {} | {:.0} | {:.0} | {:.0} |",
                    d.who, q.queue, q.syncs, q.mean_wait_ms, q.mean_work_ms
                );
            }
        }
        let _ = writeln!(
            md,
            "\nThe simulated kubelets: pods KWOK deleted once their grace period ended. A \
             StatefulSet's evicted pod comes back under the same name, and KWOK v0.8.0 has been \
             seen deleting that name again and again after one eviction (every 1-3 s for a \
             minute and more, each delete answered 200, so each time a new pod of that name \
             existed). It deletes by name, without the UID precondition a kubelet sends; likely a delete \
             still queued for the old pod removes the new one. Each such deletion is a pod \
             created, scheduled and made Ready again: control plane work no real kubelet \
             causes, which slows both drainers.\n\n\
             | Who | Evictions | Deployment pods deleted | StatefulSet pods deleted | \
             StatefulSet names |\n| --- | --- | --- | --- | --- |"
        );
        for d in &report.fleet {
            if let Some(k) = &d.simulator_deletions {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} |",
                    d.who,
                    d.evicted_pods,
                    k.deployment_pods,
                    k.statefulset_pods,
                    k.statefulset_names
                );
            }
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let _ = writeln!(
            md,
            "\nWhere the machine's time goes: CPU seconds each process spent during the run, \
             and its share of the machine's {cores} cores over the run (kubectl's own processes \
             are not counted).\n\n| Who | Process | CPU (s) | Share of the machine |\n\
             | --- | --- | --- | --- |"
        );
        for d in &report.fleet {
            let mut by_cost: Vec<(&String, &f64)> = d.cpu_during_run.iter().collect();
            by_cost.sort_by(|a, b| b.1.total_cmp(a.1));
            for (process, seconds) in by_cost {
                let _ = writeln!(
                    md,
                    "| {} | {process} | {seconds:.1} | {:.0}% |",
                    d.who,
                    seconds / (d.seconds * cores) * 100.0
                );
            }
        }
    }

    if !report.rss.is_empty() || report.rss_stopped.is_some() {
        let _ = writeln!(
            md,
            "\n## Operator memory\n\nA fresh operator process per run; peak RSS is VmHWM of \
             /proc/PID/status after it drained its nodes, all under maintenance at once \
             (maxParallelOperations = drains). At each size one run drains a tenth of the nodes \
             (at least 2) and one a fixed number, so that what RSS follows (the nodes in \
             maintenance or the cluster) can be told apart. Growing the cluster (nodes Ready, \
             then every pod Ready) and the control plane's memory at the end show where the \
             testbed stops. Builds compared side by side (`MO_BENCH_RSS_OPERATORS`) drain the \
             same nodes at one load, one after the other, the Deployments scaled to 0 and back \
             between two runs so that each finds the pods spread as the first did; the \
             goal, the growth and the chart read the first build.\n\n\
             | Build | Nodes | Pods | Drains | Pods drained | Peak RSS (MiB) | RSS at the end (MiB) | Time (s) | CPU per drain (ms) | Cluster growth (s) | kube-apiserver RSS (MiB) | etcd RSS (MiB) |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        let component = |r: &RssPoint, name: &str| {
            r.control_plane_rss_mib
                .get(name)
                .map_or("-".to_string(), |mib| format!("{mib:.0}"))
        };
        for r in &report.rss {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.0} | {:.0} | {} | {} |",
                r.operator.as_deref().unwrap_or("this build"),
                r.nodes,
                r.pods,
                r.requests,
                r.pods_drained,
                r.rss_peak_mib,
                r.rss_now_mib,
                r.seconds,
                r.cpu_seconds_per_request * 1000.0,
                r.setup_seconds,
                component(r, "kube-apiserver"),
                component(r, "etcd"),
            );
        }
        let fixed = report.size.as_ref().map_or(0, |s| s.rss_fixed_drains);
        let growth = |keep: &dyn Fn(&RssPoint) -> bool| {
            let series: Vec<&RssPoint> = first_build_rss(report).filter(|r| keep(r)).collect();
            match (series.first().copied(), series.last().copied()) {
                (Some(a), Some(b)) if b.nodes > a.nodes => Some((
                    a,
                    b,
                    (b.rss_peak_mib - a.rss_peak_mib) / (b.nodes - a.nodes) as f64 * 1000.0,
                )),
                _ => None,
            }
        };
        let _ = writeln!(md);
        if let Some((a, b, per_1000)) = growth(&|r| r.requests == fixed) {
            let _ = writeln!(
                md,
                "- {fixed} drains held, cluster from {} to {} nodes: peak RSS {:.1} -> {:.1} MiB, \
                 {per_1000:.1} MiB per 1,000 nodes (what the cluster's size costs).",
                a.nodes, b.nodes, a.rss_peak_mib, b.rss_peak_mib
            );
        }
        if let Some((a, b, per_1000)) = growth(&|r| r.requests == tenth(r.nodes)) {
            let _ = writeln!(
                md,
                "- A tenth in maintenance, {} to {} drains on {} to {} nodes: peak RSS {:.1} -> \
                 {:.1} MiB, {per_1000:.1} MiB per 1,000 nodes and 100 drains.",
                a.requests, b.requests, a.nodes, b.nodes, a.rss_peak_mib, b.rss_peak_mib
            );
        }
        if let Some(stopped) = &report.rss_stopped {
            let _ = writeln!(md, "- **Stopped before its largest size**: {stopped}");
        }
    }

    if !charts.is_empty() {
        let _ = writeln!(md, "\n## Charts\n");
        for (title, file) in charts {
            let _ = writeln!(md, "- [{title}]({file})\n\n  ![{title}]({file})\n");
        }
    }
    md
}

// ---------------------------------------------------------------------------------------------
// Charts (plotters, SVG; text is drawn by the viewer, no font is read here)

struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    color: plotters::style::RGBColor,
}

/// Goal lines: dashed, across the whole chart.
const GOAL_COLORS: [plotters::style::RGBColor; 2] = [
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(148, 103, 189),
];

fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    goals: &[(&str, f64)],
) -> Result<()> {
    use plotters::prelude::*;
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (x_min, x_max) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    });
    let y_max = ys.chain(goals.iter().map(|g| g.1)).fold(0.0f64, f64::max);
    ensure!(
        x_min.is_finite() && x_max.is_finite(),
        "nothing to chart in {title}"
    );
    let pad = ((x_max - x_min) * 0.1).max(1.0);
    let (x0, x1) = ((x_min - pad).max(0.0), x_max + pad);
    // Headroom above the data for the legend (upper left).
    let y1 = if y_max > 0.0 { y_max * 1.6 } else { 1.0 };
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, 0.0..y1)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    // Whole numbers on the x axis (K, nodes): one label per unit when the range is small.
    let x_labels = if x1 - x0 <= 12.0 {
        (x1 - x0).round() as usize + 1
    } else {
        10
    };
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_labels(x_labels)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    for s in series {
        let color = s.color;
        let style = ShapeStyle::from(&color).stroke_width(2);
        let points = s.points.clone();
        chart
            .draw_series(LineSeries::new(points.clone(), style))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    for (i, (name, y)) in goals.iter().enumerate() {
        let color = GOAL_COLORS[i % GOAL_COLORS.len()];
        let style = ShapeStyle::from(&color).stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new(vec![(x0, *y), (x1, *y)], 8, 6, style))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .label(name.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}

fn charts(report: &Report, dir: &Path) -> Result<Vec<(String, String)>> {
    use plotters::style::RGBColor;
    const OURS: RGBColor = RGBColor(31, 119, 180);
    const KUBECTL: RGBColor = RGBColor(255, 127, 14);
    const CALLS: RGBColor = RGBColor(44, 160, 44);
    let mut made = Vec::new();
    let points = |who: &str, f: &dyn Fn(&DrainRun) -> Option<f64>| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = report
            .drains
            .iter()
            .filter(|d| d.who == who)
            .filter_map(|d| Some((d.parallel as f64, f(d)?)))
            .filter(|p| p.1.is_finite())
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    if !report.drains.is_empty() {
        let series = vec![
            Series {
                name: "ours".into(),
                points: points("operator", &|d| Some(d.seconds)),
                color: OURS,
            },
            Series {
                name: "kubectl drain".into(),
                points: points("kubectl", &|d| Some(d.seconds)),
                color: KUBECTL,
            },
            Series {
                name: "goal: 0.4 x kubectl drain".into(),
                points: points("kubectl", &|d| Some(d.seconds * 0.4)),
                color: GOAL_COLORS[0],
            },
        ];
        let title = "Drain wall time vs nodes in maintenance at once";
        line_chart(
            &dir.join("drain-wall-time.svg"),
            title,
            "nodes in maintenance at once (K)",
            "seconds until all nodes drained and back",
            &series,
            &[],
        )?;
        made.push((title.to_string(), "drain-wall-time.svg".to_string()));

        let series = vec![
            Series {
                name: "eviction calls/pod, ours".into(),
                points: points("operator", &|d| Some(d.eviction_calls_per_pod)),
                color: OURS,
            },
            Series {
                name: "eviction calls/pod, kubectl".into(),
                points: points("kubectl", &|d| Some(d.eviction_calls_per_pod)),
                color: KUBECTL,
            },
            Series {
                name: "API requests/evicted pod, ours".into(),
                points: points("operator", &|d| d.api_calls_per_pod),
                color: CALLS,
            },
        ];
        let title = "Calls per evicted pod";
        line_chart(
            &dir.join("calls-per-evicted-pod.svg"),
            title,
            "nodes in maintenance at once (K)",
            "calls per evicted pod",
            &series,
            &[
                ("goal: 1.15 eviction calls/pod", 1.15),
                ("goal: 2.5 API requests/evicted pod", 2.5),
            ],
        )?;
        made.push((title.to_string(), "calls-per-evicted-pod.svg".to_string()));
    }
    if !report.rss.is_empty() {
        let fixed = report.size.as_ref().map_or(0, |s| s.rss_fixed_drains);
        let series = vec![
            Series {
                name: "a tenth of the nodes in maintenance".into(),
                points: first_build_rss(report)
                    .filter(|r| r.requests == tenth(r.nodes))
                    .map(|r| (r.nodes as f64, r.rss_peak_mib))
                    .collect(),
                color: OURS,
            },
            Series {
                name: format!("{fixed} nodes in maintenance"),
                points: first_build_rss(report)
                    .filter(|r| r.requests == fixed)
                    .map(|r| (r.nodes as f64, r.rss_peak_mib))
                    .collect(),
                color: KUBECTL,
            },
        ];
        let title = "Operator peak RSS vs cluster size";
        line_chart(
            &dir.join("rss.svg"),
            title,
            "nodes in the cluster",
            "MiB (VmHWM)",
            &series,
            &[("goal: 150 MiB", 150.0)],
        )?;
        made.push((title.to_string(), "rss.svg".to_string()));
    }
    Ok(made)
}

fn report_dir(size: &str, date: &str) -> PathBuf {
    let base = match std::env::var_os("MO_BENCH_REPORT_DIR").filter(|d| !d.is_empty()) {
        Some(d) => {
            let d = PathBuf::from(d);
            if d.is_absolute() {
                d
            } else {
                Path::new(env!("CARGO_MANIFEST_DIR")).join(d)
            }
        }
        // Never in the work tree unless asked: next to the build.
        None => Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
            .join("bench"),
    };
    base.join(format!("{date}-{size}"))
}

// ---------------------------------------------------------------------------------------------
// README's performance table: generated from a report, checked against the latest one

const README_BEGIN: &str =
    "<!-- bench-table: begin (generated by make bench from bench/*/readme-table.md) -->";
const README_END: &str = "<!-- bench-table: end -->";

/// The README's performance table for `report`, written next to it as `readme-table.md`.
fn readme_table(report: &Report, dir_name: &str) -> String {
    let mut t = String::new();
    let size = report.size.as_ref().map_or("?", |s| s.name.as_str());
    let _ = writeln!(
        t,
        "From [bench/{dir_name}](bench/{dir_name}/report.md) (`make bench`, size {size}, {} profile, \
         {} cores, commit {}):\n",
        report.machine.get("profile").map_or("?", String::as_str),
        report.machine.get("nproc").map_or("?", String::as_str),
        report.commit
    );
    let _ = writeln!(t, "| What | Ours | `kubectl drain` |");
    let _ = writeln!(t, "| --- | --- | --- |");
    if let Some(nd) = &report.no_drain {
        let _ = writeln!(
            t,
            "| {} requests on {} nodes, maxParallelOperations {}, released when Ready (no drain) | \
             {:.1} s, {:.1} requests/s, {:.2} API calls per request, {:.1} ms of operator CPU \
             per request (this API server's ceiling, {:.0} writes/s, allows at most {:.1} \
             requests/s at that many calls) | – |",
            nd.requests,
            nd.nodes,
            nd.parallel,
            nd.seconds,
            nd.requests_per_second,
            nd.calls_per_request,
            nd.cpu_seconds_per_request * 1000.0,
            nd.api_writes_per_second,
            nd.api_writes_per_second / nd.calls_per_request
        );
    }
    let mut ks: Vec<usize> = report.drains.iter().map(|d| d.parallel).collect();
    ks.sort_unstable();
    ks.dedup();
    for k in ks {
        let run = |who: &str| {
            report
                .drains
                .iter()
                .find(|d| d.who == who && d.parallel == k)
        };
        let (ours, theirs) = (run("operator"), run("kubectl"));
        let Some(any) = ours.or(theirs) else { continue };
        let cell = |d: Option<&DrainRun>, api: bool| match d {
            Some(d) => {
                let mut c = format!(
                    "{:.1} s, {:.2} eviction calls per evicted pod",
                    d.seconds, d.eviction_calls_per_pod
                );
                if api && let Some(per_pod) = d.api_calls_per_pod {
                    let _ = write!(c, ", {per_pod:.2} API calls per evicted pod");
                }
                c
            }
            None => "not run".into(),
        };
        let ratio = match (ours, theirs) {
            (Some(o), Some(k)) if k.seconds > 0.0 => {
                format!(" ({:.2}x kubectl's time)", o.seconds / k.seconds)
            }
            _ => String::new(),
        };
        let _ = writeln!(
            t,
            "| Drain {} nodes ({} pods, PDBs), {k} at a time | {}{ratio} | {} |",
            any.nodes,
            any.pods,
            cell(ours, true),
            cell(theirs, false)
        );
    }
    let (ours, theirs) = (fleet_run(report, "operator"), fleet_run(report, "kubectl"));
    if let Some(any) = ours.or(theirs) {
        let cell = |d: Option<&DrainRun>| match d {
            Some(d) => format!(
                "{:.1} s, {} evictions, {:.2} eviction calls per eviction",
                d.seconds, d.evicted_pods, d.eviction_calls_per_pod
            ),
            None => "not run".into(),
        };
        let mut our_cell = cell(ours);
        if let Some(inv) = ours.and_then(|d| d.invariants.as_ref()) {
            let _ = write!(
                our_cell,
                ", at most {} in maintenance and {} unavailable, no invariant broken",
                inv.peak_in_maintenance, inv.peak_unavailable
            );
        }
        if let Some(r) = fleet_ratio(report) {
            let _ = write!(our_cell, " ({r:.2}x kubectl's time)");
        }
        let _ = writeln!(
            t,
            "| Maintain all {} nodes ({} pods, PDBs), {} at a time | {our_cell} | {} |",
            any.nodes,
            any.pods,
            any.parallel,
            cell(theirs)
        );
    }
    if let Some(largest) = first_build_rss(report).max_by_key(|r| (r.nodes, r.requests)) {
        let _ = writeln!(
            t,
            "| Operator peak RSS, {} nodes / {} pods, {} drains | {:.1} MiB | – |",
            largest.nodes, largest.pods, largest.requests, largest.rss_peak_mib
        );
    }
    t
}

/// The newest report directory under `bench/` that has a README table (dated names sort in time).
fn latest_readme_table(bench: &Path) -> Result<Option<(String, String)>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(bench)
        .with_context(|| format!("reading {}", bench.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("readme-table.md").is_file())
        .collect();
    dirs.sort();
    let Some(dir) = dirs.pop() else {
        return Ok(None);
    };
    let table = std::fs::read_to_string(dir.join("readme-table.md"))
        .with_context(|| format!("reading {}/readme-table.md", dir.display()))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Some((name, table)))
}

/// README.md with its generated block replaced by `table`.
fn readme_with_table(readme: &str, table: &str) -> Result<String> {
    let (head, rest) = readme
        .split_once(README_BEGIN)
        .context("README.md has no generated performance table (its begin marker is missing)")?;
    let (_, tail) = rest
        .split_once(README_END)
        .context("README.md's performance table has no end marker")?;
    Ok(format!("{head}{README_BEGIN}\n{table}{README_END}{tail}"))
}

/// The README's performance table must be the one of the latest committed report.
fn check_readme_table() -> Result<()> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme_path = repo.join("README.md");
    let readme = std::fs::read_to_string(&readme_path).context("reading README.md")?;
    let (name, table) = latest_readme_table(&repo.join("bench"))?
        .context("no report under bench/ has a readme-table.md: run `make bench`")?;
    let want = readme_with_table(&readme, &table)?;
    ensure!(
        want == readme,
        "README.md's performance table differs from bench/{name}/readme-table.md, the latest \
         report's: run `make bench`, which rewrites it, or copy that file between the markers"
    );
    Ok(())
}

fn write_report(report: &Report) -> Result<PathBuf> {
    let size = report.size.as_ref().map_or("unknown", |s| s.name.as_str());
    let date = report.started.get(..10).unwrap_or("unknown-date");
    let dir = report_dir(size, date);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let made = charts(report, &dir)?;
    std::fs::write(dir.join("report.md"), markdown(report, &made))
        .with_context(|| format!("writing {}/report.md", dir.display()))?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(report)? + "\n",
    )
    .with_context(|| format!("writing {}/report.json", dir.display()))?;
    let dir_name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let table = readme_table(report, &dir_name);
    std::fs::write(dir.join("readme-table.md"), &table)
        .with_context(|| format!("writing {}/readme-table.md", dir.display()))?;
    // A report in the repository's bench/ (`make bench`) becomes the README's table.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    if dir.parent() == Some(repo.join("bench").as_path()) {
        let readme_path = repo.join("README.md");
        let readme = std::fs::read_to_string(&readme_path).context("reading README.md")?;
        std::fs::write(&readme_path, readme_with_table(&readme, &table)?)
            .context("writing README.md")?;
    }
    Ok(dir)
}

// ---------------------------------------------------------------------------------------------
// main

async fn workload<T>(
    name: &str,
    errors: &mut Vec<String>,
    fut: impl Future<Output = Result<T>>,
) -> Option<T> {
    match fut.await {
        Ok(v) => Some(v),
        Err(e) => {
            println!("FAILED {name}: {e:#}");
            errors.push(format!("{name}: {e:#}"));
            None
        }
    }
}

async fn run() -> Result<()> {
    let size = Size::from_env()?;
    // Before anything runs: a stale README table fails at once, not after the workloads.
    check_readme_table()?;
    let progress = Progress {
        started: Instant::now(),
    };
    println!(
        "bench_report: size {} (no drain {} requests on {} nodes, P={}; drain {} nodes x {} pods, \
         K in {:?}; RSS at {:?} nodes x {} pods; every node maintained: {} nodes x {} pods, K={})",
        size.name,
        size.requests,
        size.nodes,
        size.parallel,
        size.drain_nodes,
        size.pods_per_node,
        size.drain_parallel,
        size.rss_nodes,
        size.rss_pods_per_node,
        size.fleet_nodes,
        size.fleet_pods_per_node,
        size.fleet_parallel
    );
    let mut report = Report {
        size: Some(size.clone()),
        started: Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        machine: machine(),
        commit: commit(),
        ..Report::default()
    };
    // A failed workload is reported and the others still run; the test fails at the end.
    let mut errors = Vec::new();
    if size.runs("no-drain") {
        report.no_drain = workload("no-drain", &mut errors, no_drain(&size, &progress)).await;
    }
    for &k in &size.drain_parallel {
        if size.runs("drain")
            && let Some(run) = workload(
                &format!("drain operator K={k}"),
                &mut errors,
                drain_ours(&size, k, &progress),
            )
            .await
        {
            report.drains.push(run);
        }
        if size.runs("kubectl")
            && let Some(run) = workload(
                &format!("drain kubectl K={k}"),
                &mut errors,
                drain_kubectl(&size, k, &progress),
            )
            .await
        {
            report.drains.push(run);
        }
    }
    if size.runs("fleet")
        && let Some(run) =
            workload("fleet operator", &mut errors, fleet_ours(&size, &progress)).await
    {
        report.fleet.push(run);
    }
    if size.runs("fleet-kubectl")
        && let Some(run) = workload(
            "fleet kubectl",
            &mut errors,
            fleet_kubectl(&size, &progress),
        )
        .await
    {
        report.fleet.push(run);
    }
    if size.runs("rss") {
        let mut points = Vec::new();
        if workload("rss", &mut errors, rss(&size, &progress, &mut points))
            .await
            .is_none()
        {
            report.rss_stopped = errors.last().cloned();
        }
        report.rss = points;
    }
    report.goals = goals(&report);
    println!("goals (docs/performance.md):");
    for g in &report.goals {
        println!(
            "  {}: {} -> {}",
            g.what,
            g.target,
            g.verdict.replace("**", "")
        );
    }
    let dir = write_report(&report)?;
    println!(
        "[{:>7.1}s] report: {}",
        progress.started.elapsed().as_secs_f64(),
        dir.join("report.md").display()
    );
    if !errors.is_empty() {
        bail!(
            "{} workload(s) failed:\n{}",
            errors.len(),
            errors.join("\n")
        );
    }
    // Smoke checks: the work got done (the figures are not judged here).
    if size.runs("no-drain") {
        let nd = report.no_drain.as_ref().context("no no-drain figures")?;
        ensure!(nd.requests_per_second > 0.0, "no request went through");
    }
    let runs = usize::from(size.runs("drain")) + usize::from(size.runs("kubectl"));
    ensure!(
        report.drains.len() == runs * size.drain_parallel.len(),
        "missing drain runs"
    );
    ensure!(
        report.fleet.len()
            == usize::from(size.runs("fleet")) + usize::from(size.runs("fleet-kubectl")),
        "missing fleet runs"
    );
    if size.runs("rss") {
        ensure!(
            report.rss.len()
                == size
                    .rss_nodes
                    .iter()
                    .map(|&n| rss_drains(&size, n).len())
                    .sum::<usize>()
                    * size.rss_operators.len().max(1)
                && report.rss.iter().all(|r| r.rss_peak_mib > 0.0),
            "missing RSS figures"
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    support::run_as_test("bench_report", run)
}
