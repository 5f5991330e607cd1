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
//!
//! Here: the sizes and the run; the workloads, their measurement and the report are modules.

mod measurement;
mod report;
mod workloads;

use std::future::Future;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::{measurement::*, report::*, workloads::*};
use anyhow::{Context as _, Result, bail, ensure};
use jiff::Timestamp;
use serde::Serialize;
use support::*;

/// Label that pins the benchmark's workload pods to a pool of nodes.
const POOL: &str = "bench.maintenance.nvidia.com/pool";

// ---------------------------------------------------------------------------------------------
// Sizes

#[derive(Clone, Debug, Default, Serialize)]
pub struct Size {
    pub name: String,
    /// No drain: nodes, requests, maxParallelOperations.
    pub nodes: usize,
    pub requests: usize,
    pub parallel: usize,
    /// Drain: nodes drained, workload pods per drained node, the K values (nodes at once).
    pub drain_nodes: usize,
    pub pods_per_node: usize,
    pub drain_parallel: Vec<usize>,
    /// Peak RSS: two cluster sizes (nodes) with this many pods per node; at each size one run
    /// drains a tenth of the nodes, another a fixed number, so that the report tells apart what
    /// RSS follows: the nodes in maintenance or the cluster.
    pub rss_nodes: Vec<usize>,
    pub rss_pods_per_node: usize,
    pub rss_fixed_drains: usize,
    /// Operator builds to compare (`MO_BENCH_RSS_OPERATORS`); empty: this build alone.
    pub rss_operators: Vec<RssOperator>,
    /// Every node maintained: a cluster of this many nodes with about this many pods per node
    /// (Deployments and StatefulSets of `fleet_replicas` pods under PDBs, a DaemonSet), all of
    /// them maintained `fleet_parallel` at a time (maxParallelOperations; maxUnavailable the
    /// same, written as 10% when it is a tenth), the replacements going wherever the scheduler
    /// puts them, maintained nodes included.
    pub fleet_nodes: usize,
    pub fleet_pods_per_node: usize,
    pub fleet_replicas: usize,
    pub fleet_parallel: usize,
    /// Ours with `admission.taintWaitingNodes` (the default); off with
    /// `MO_BENCH_FLEET_TAINT_WAITING_NODES=false`, to measure what the taint saves.
    pub fleet_taint_waiting_nodes: bool,
    /// The workloads to run (`MO_BENCH_ONLY`, e.g. `drain`): no-drain, drain, kubectl, rss,
    /// fleet, fleet-kubectl.
    pub only: Vec<String>,
}

/// Drains of the RSS run "a tenth of the nodes" (at least 2).
pub fn tenth(nodes: usize) -> usize {
    (nodes / 10).max(2)
}

/// The drains of the RSS runs at a cluster of `nodes`: a tenth of them, and the fixed number
/// (one run when they are the same).
pub fn rss_drains(size: &Size, nodes: usize) -> Vec<usize> {
    // Builds compared side by side: at one load, the fixed number.
    if !size.rss_operators.is_empty() && size.rss_fixed_drains > 0 {
        return vec![size.rss_fixed_drains.min(nodes)];
    }
    let mut drains = vec![tenth(nodes), size.rss_fixed_drains.min(nodes)];
    drains.sort_unstable();
    drains.dedup();
    drains
}

pub fn env_list(name: &str) -> Result<Option<Vec<usize>>> {
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
pub struct RssOperator {
    pub label: String,
    pub command: Vec<String>,
}

impl RssOperator {
    /// `MO_BENCH_RSS_OPERATORS`: `label=command` entries separated by `;`.
    pub fn list_from_env() -> Result<Vec<RssOperator>> {
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

    pub fn launcher(&self) -> Vec<std::ffi::OsString> {
        self.command
            .iter()
            .map(Into::into)
            .chain(std::iter::once("run".into()))
            .collect()
    }
}

impl Size {
    pub fn from_env() -> Result<Size> {
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
        if let Some(v) = env_number("MO_BENCH_NODES")? {
            size.nodes = v;
        }
        size.requests = env_number("MO_BENCH_REQUESTS")?
            .unwrap_or(size.requests)
            .min(size.nodes);
        if let Some(v) = env_number("MO_BENCH_PARALLEL")? {
            size.parallel = v;
        }
        if let Some(v) = env_number("MO_BENCH_DRAIN_NODES")? {
            size.drain_nodes = v;
        }
        if let Some(v) = env_number("MO_BENCH_PODS_PER_NODE")? {
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
        if let Some(v) = env_number("MO_BENCH_RSS_PODS_PER_NODE")? {
            size.rss_pods_per_node = v;
        }
        // By default the drains of the smallest size, held while the cluster grows.
        size.rss_fixed_drains = match env_number::<usize>("MO_BENCH_RSS_FIXED_DRAINS")? {
            Some(v) => v.max(1),
            None => tenth(size.rss_nodes.first().copied().unwrap_or(0)),
        };
        if let Some(v) = env_number("MO_BENCH_FLEET_NODES")? {
            size.fleet_nodes = v;
            size.fleet_parallel = tenth(v);
        }
        if let Some(v) = env_number("MO_BENCH_FLEET_PODS_PER_NODE")? {
            size.fleet_pods_per_node = v;
        }
        if let Some(v) = env_number("MO_BENCH_FLEET_REPLICAS")? {
            size.fleet_replicas = v;
        }
        if let Some(v) = env_number("MO_BENCH_FLEET_PARALLEL")? {
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
    pub fn runs(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|w| w == name)
    }

    /// A deadline for waits that scales with the work.
    pub fn wait(&self, work: usize) -> Duration {
        Duration::from_secs(180 + work as u64 / 2)
    }
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
