//! Measurement: progress lines while a phase runs, the results the workloads record, and what
//! they read from the cluster, the audit log and `/proc` (API calls, RSS, CPU, controller queues).

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use maintenance_crds::{NodeMaintenance, Phase};
use serde::Serialize;
use support::audit::{AuditLog, BENCH_OPERATOR_ACCOUNT, WriteCall, seconds_between};
use support::operator::*;
use support::*;

use crate::Size;

pub struct Progress {
    pub started: Instant,
}

pub struct Step {
    pub bar: ProgressBar,
    pub name: String,
    pub started: Instant,
    pub run_started: Instant,
}

impl Progress {
    pub fn begin(&self, name: &str) -> Step {
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
    pub fn set(&self, msg: impl Into<String>) {
        self.bar.set_message(msg.into());
    }

    pub fn end(self, summary: &str) -> f64 {
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
pub struct NoDrain {
    pub nodes: usize,
    pub requests: usize,
    pub parallel: usize,
    pub seconds: f64,
    pub requests_per_second: f64,
    /// The operator's API calls in the window, by verb and by `verb resource[/subresource]`.
    pub calls_by_verb: BTreeMap<String, usize>,
    pub calls_by_resource: BTreeMap<String, usize>,
    pub calls_per_request: f64,
    pub scheduler_rounds: f64,
    /// Time the supervisor spent in its rounds (they run one at a time).
    pub scheduler_seconds: f64,
    pub rss_peak_mib: f64,
    /// The operator's CPU seconds over the measured requests, per request.
    pub cpu_seconds_per_request: f64,
    /// What the API server of the same control plane sustains with nothing but merge patches
    /// (see [`api_write_ceiling`]): divided by the calls per request, an upper bound of the
    /// throughput whatever the operator does.
    pub api_writes_per_second: f64,
    /// Events go out in the background: how long after the last request was gone the last of
    /// them reached the API server. The calls are counted until then.
    pub events_lag_seconds: f64,
    /// Where a slot's time goes: the segments of one request's lifecycle, from the audit log.
    pub timeline: Vec<Segment>,
    /// CPU seconds each process spent from the first create to the last request gone.
    pub cpu_during_run: BTreeMap<String, f64>,
    /// The machine's cores (what those CPU seconds are out of).
    pub cores: usize,
}

/// One segment of a request's lifecycle without a drain, between two of the operator's calls as
/// the API server received them, over all requests.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Segment {
    pub name: String,
    /// What happens in it.
    pub covers: String,
    pub samples: usize,
    pub median_ms: f64,
    pub p90_ms: f64,
}

/// Splits each request's lifecycle at the operator's calls: admission (its metadata write),
/// cordon, Ready (the status write after the cordon), the requestor's deletion, uncordon,
/// finalizer removal, and from a
/// release to the admission that takes its slot (the k-th release frees the slot of the
/// (parallel + k)-th admission). `nodes[i]` is the node of request `r{i}`.
pub fn lifecycle_timeline(
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
    pub const NAMES: [(&str, &str); 6] = [
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
pub struct DrainRun {
    /// `operator` or `kubectl`.
    pub who: String,
    pub nodes: usize,
    pub pods: usize,
    pub parallel: usize,
    /// Until every node was drained and given back (requests released, or uncordoned).
    pub seconds: f64,
    /// Until the last request was Ready (operator) or the last drain returned (kubectl).
    pub seconds_to_last_drained: f64,
    pub eviction_calls: usize,
    pub evicted_pods: usize,
    pub eviction_codes: BTreeMap<u16, usize>,
    pub eviction_calls_per_pod: f64,
    /// Operator only: all its API calls in the window, and per evicted pod.
    pub api_calls: Option<usize>,
    pub api_calls_per_pod: Option<f64>,
    pub calls_by_verb: BTreeMap<String, usize>,
    pub calls_by_resource: BTreeMap<String, usize>,
    pub rss_peak_mib: Option<f64>,
    /// Every node maintained, ours: what the invariant monitor saw.
    pub invariants: Option<FleetInvariants>,
    /// Every node maintained: the serial evictions of the budgets that allow one at a time.
    pub chains: Option<BudgetChains>,
    /// Every node maintained: kube-controller-manager's work queues during the run.
    pub controller_queues: Vec<ControllerQueue>,
    /// Every node maintained: CPU seconds each process spent during the run.
    pub cpu_during_run: BTreeMap<String, f64>,
    /// Every node maintained: the pods KWOK deleted (as a kubelet does once a pod's grace period
    /// ends), those of StatefulSets apart.
    pub simulator_deletions: Option<SimulatorDeletions>,
    /// Pods the disruption controller still counted as disrupted when its two-minute
    /// `DeletionTimeout` ran out (its `NotDeleted` Events): a StatefulSet re-created an evicted
    /// pod under the same name before the controller saw the old one go, and the budget allowed
    /// nothing meanwhile. Each one is a stall of up to two minutes that no drain can avoid.
    pub disruption_timeouts: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct SimulatorDeletions {
    pub deployment_pods: usize,
    pub statefulset_pods: usize,
    /// StatefulSet pods deleted, each name counted once.
    pub statefulset_names: usize,
}

/// The user KWOK's client runs as (its certificate's CN, tests/testbed/testbed).
pub const KWOK_USER: &str = "kwok-controller";

/// KWOK's successful pod deletions in `ns` from `from`. A StatefulSet's pod is named
/// `<workload>-<ordinal>`, a Deployment's `<workload>-<hash>-<suffix>`.
pub fn simulator_deletions(log: &AuditLog, ns: &str, from: Timestamp) -> SimulatorDeletions {
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
pub const WATCHED_QUEUES: [&str; 3] = ["disruption", "replicaset", "statefulset"];

/// One work queue over a run, from kube-controller-manager's `workqueue_*` metrics.
#[derive(Clone, Debug, Serialize)]
pub struct ControllerQueue {
    pub queue: String,
    pub syncs: f64,
    /// Mean time an item waited in the queue before a worker took it.
    pub mean_wait_ms: f64,
    /// Mean time a worker spent on an item.
    pub mean_work_ms: f64,
}

/// Cumulative `workqueue_*` figures of kube-controller-manager, by queue: (items taken, seconds
/// they waited, items worked, seconds worked).
pub type QueueTotals = BTreeMap<String, [f64; 4]>;

/// Reads kube-controller-manager's /metrics (its port from the testbed's `ports` file; the
/// testbed's admin may read it).
pub async fn controller_queue_totals(testbed: &Testbed) -> Result<QueueTotals> {
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
pub fn queues_between(before: &QueueTotals, after: &QueueTotals) -> Vec<ControllerQueue> {
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
pub fn cpu_between(
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
pub struct BudgetChains {
    /// Workloads under a one-at-a-time budget.
    pub workloads: usize,
    /// The one whose evictions spanned the longest: its name, evictions, first to last (s).
    pub longest: String,
    pub longest_evictions: usize,
    pub longest_span_seconds: f64,
    /// Gaps between successive successful evictions of one such workload, over all of them.
    pub median_gap_ms: f64,
    pub p90_gap_ms: f64,
}

/// The chains of `strict` (workloads under one-at-a-time budgets) in the audit log: each
/// workload's successful evictions by `user` in `ns` from `from`, a pod's workload being its
/// name up to the first `-`.
pub fn budget_chains(
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
pub struct FleetInvariants {
    pub max_parallel: usize,
    /// As written in the configuration, e.g. `10%`.
    pub max_unavailable: String,
    pub peak_in_maintenance: usize,
    pub peak_unavailable: usize,
    pub lowest_pdb_margin: Option<i32>,
    pub events: usize,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RssPoint {
    /// The build, when several are compared (`MO_BENCH_RSS_OPERATORS`).
    pub operator: Option<String>,
    /// Workload pods on the nodes drained, when the run started (the rebalancing between
    /// compared builds keeps them alike).
    pub pods_drained: usize,
    pub nodes: usize,
    pub pods: usize,
    pub requests: usize,
    pub rss_peak_mib: f64,
    pub rss_now_mib: f64,
    pub seconds: f64,
    /// The operator's CPU seconds from its start to the end of the drains, per request.
    pub cpu_seconds_per_request: f64,
    /// Seconds to grow the cluster to this size (nodes Ready, then every pod Ready).
    pub setup_seconds: f64,
    /// VmRSS (MiB) of each control-plane component at the end, by name (what limits the size).
    pub control_plane_rss_mib: BTreeMap<String, f64>,
}

/// The RSS runs of the first build listed (or of this build): the goal, the growth and the
/// chart read these; the other builds show in the table next to them.
pub fn first_build_rss(report: &Report) -> impl Iterator<Item = &RssPoint> {
    let first = report.rss.first().and_then(|r| r.operator.clone());
    report.rss.iter().filter(move |r| r.operator == first)
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub size: Option<Size>,
    pub started: String,
    pub machine: BTreeMap<String, String>,
    pub commit: String,
    pub no_drain: Option<NoDrain>,
    pub drains: Vec<DrainRun>,
    /// Every node maintained: ours and kubectl's.
    pub fleet: Vec<DrainRun>,
    pub rss: Vec<RssPoint>,
    /// Why the RSS workload stopped before its largest size, if it did.
    pub rss_stopped: Option<String>,
    pub goals: Vec<Goal>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    pub what: String,
    pub target: String,
    pub measured: Option<f64>,
    pub met: Option<bool>,
    pub verdict: String,
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// The `q` quantile of sorted `samples` (NaN when empty).
pub fn quantile(samples: &[f64], q: f64) -> f64 {
    samples
        .get(((samples.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

pub fn mib_from_status(status: &str, key: &str) -> Option<f64> {
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let kb: f64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb / 1024.0)
    })
}

/// (VmHWM, VmRSS) of a process in MiB.
pub fn rss_of(pid: u32) -> Result<(f64, f64)> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let hwm = mib_from_status(&status, "VmHWM").context("no VmHWM in /proc/PID/status")?;
    let rss = mib_from_status(&status, "VmRSS").context("no VmRSS in /proc/PID/status")?;
    Ok((hwm, rss))
}

/// The control plane's components and their pids, from the testbed's `pids` file (name, pid,
/// start time per line).
pub fn testbed_pids(testbed: &Testbed) -> Result<Vec<(String, u32)>> {
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
pub fn control_plane_rss(testbed: &Testbed) -> BTreeMap<String, f64> {
    testbed_pids(testbed)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(name, pid)| Some((name, rss_of(pid).ok()?.1)))
        .collect()
}

pub fn operator_rss(op: &Operator) -> Result<(f64, f64)> {
    rss_of(op.pid().context("the operator is not running")?)
}

/// CPU seconds (user + system) the operator process has used so far, from /proc/PID/stat.
pub fn operator_cpu_seconds(op: &Operator) -> Result<f64> {
    cpu_seconds_of(&op.pid().context("the operator is not running")?.to_string())
}

/// CPU seconds used so far by each process the run depends on: the control plane's components
/// (the testbed's `pids` file), the operator, and this process (the requestor and the bench).
pub fn cpu_by_process(testbed: &Testbed, op: Option<&Operator>) -> Result<BTreeMap<String, f64>> {
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
pub fn cpu_seconds_of(pid: &str) -> Result<f64> {
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
pub async fn wait_events_settled(
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

pub fn operator_calls(
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

pub fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        f64::NAN
    } else {
        a as f64 / b as f64
    }
}

pub async fn count_ready_pods(client: &Client, ns: &str) -> Result<(usize, usize)> {
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
pub async fn wait_deployments(
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

pub async fn wait_pods(
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
pub async fn run_requests(
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
pub async fn api_write_ceiling(client: &Client, ns: &str, step: &Step) -> Result<f64> {
    use k8s_openapi::api::core::v1::ConfigMap;
    pub const WRITERS: usize = 32;
    pub const WINDOW: Duration = Duration::from_secs(5);
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
