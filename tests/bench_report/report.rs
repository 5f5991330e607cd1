//! The report: `report.md` with its SVG charts and `report.json`, the goals marked met or missed,
//! and the README's performance table generated from it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, ensure};
use support::audit::BENCH_OPERATOR_ACCOUNT;
use support::*;

use crate::{Size, measurement::*, tenth};

pub fn machine() -> BTreeMap<String, String> {
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

pub fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub fn commit() -> String {
    let head = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(s) if !s.is_empty() => format!("{head} (with uncommitted changes)"),
        _ => head,
    }
}

/// `value` against `target`: at most (`at_most`) or at least.
pub fn goal(what: &str, target: f64, at_most: bool, unit: &str, measured: Option<f64>) -> Goal {
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

pub fn max_of(values: impl Iterator<Item = f64>) -> Option<f64> {
    values.filter(|v| v.is_finite()).reduce(f64::max)
}

pub fn fleet_run<'a>(report: &'a Report, who: &str) -> Option<&'a DrainRun> {
    report.fleet.iter().find(|d| d.who == who)
}

/// Our wall time over kubectl's, every node maintained.
pub fn fleet_ratio(report: &Report) -> Option<f64> {
    let (ours, theirs) = (
        fleet_run(report, "operator")?,
        fleet_run(report, "kubectl")?,
    );
    (theirs.seconds > 0.0).then(|| ours.seconds / theirs.seconds)
}

pub fn goals(report: &Report) -> Vec<Goal> {
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

pub fn markdown(report: &Report, charts: &[(String, String)]) -> String {
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
        "Made by `make bench` (`tests/bench_report`, `MO_BENCH_SIZE={}`) on real control \
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
             Each run on a fresh, identical cluster; replacements go to as many spare nodes. \
             DeletionTimeouts: the disruption controller's `NotDeleted` Events, each a budget \
             held at zero for up to two minutes because the StatefulSet re-created an evicted pod \
             under its name before the controller saw it go (upstream; whoever drains waits).\n\n\
             | Who | K | Wall time (s) | Last drained at (s) | Evicted pods | Eviction calls | \
             Calls/pod | Codes | API requests | Requests/evicted pod | Peak RSS (MiB) | \
             DeletionTimeouts |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
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
                "| {} | {} | {:.1} | {:.1} | {} | {} | {:.2} | {} | {} | {} | {} | {} |",
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
                d.disruption_timeouts,
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

pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub color: plotters::style::RGBColor,
}

/// Goal lines: dashed, across the whole chart.
pub const GOAL_COLORS: [plotters::style::RGBColor; 2] = [
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(148, 103, 189),
];

pub fn line_chart(
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

pub fn charts(report: &Report, dir: &Path) -> Result<Vec<(String, String)>> {
    use plotters::style::RGBColor;
    pub const OURS: RGBColor = RGBColor(31, 119, 180);
    pub const KUBECTL: RGBColor = RGBColor(255, 127, 14);
    pub const CALLS: RGBColor = RGBColor(44, 160, 44);
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

pub fn report_dir(size: &str, date: &str) -> PathBuf {
    let next_to_the_build = || {
        Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
            .join("bench")
    };
    report_base("MO_BENCH_REPORT_DIR", next_to_the_build).join(format!("{date}-{size}"))
}

// ---------------------------------------------------------------------------------------------
// README's performance table: generated from a report, checked against the latest one

pub const README_BEGIN: &str =
    "<!-- bench-table: begin (generated by make bench from bench/*/readme-table.md) -->";
pub const README_END: &str = "<!-- bench-table: end -->";

/// The README's performance table for `report`, written next to it as `readme-table.md`.
pub fn readme_table(report: &Report, dir_name: &str) -> String {
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
pub fn latest_readme_table(bench: &Path) -> Result<Option<(String, String)>> {
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
pub fn readme_with_table(readme: &str, table: &str) -> Result<String> {
    let (head, rest) = readme
        .split_once(README_BEGIN)
        .context("README.md has no generated performance table (its begin marker is missing)")?;
    let (_, tail) = rest
        .split_once(README_END)
        .context("README.md's performance table has no end marker")?;
    Ok(format!("{head}{README_BEGIN}\n{table}{README_END}{tail}"))
}

/// The README's performance table must be the one of the latest committed report.
pub fn check_readme_table() -> Result<()> {
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

pub fn write_report(report: &Report) -> Result<PathBuf> {
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
