//! The workloads, each on fresh control planes: requests without a drain (a), nodes full of pods
//! drained by the operator and by `kubectl drain` (b), every node of a cluster maintained (d),
//! and the operator's peak RSS at two cluster sizes (c).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{Container, Event, Pod, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use support::audit::{AuditLog, BENCH_OPERATOR_ACCOUNT};
use support::invariants::{InvariantMonitor, Scope};
use support::operator::*;
use support::*;

use crate::{POOL, RssOperator, Size, measurement::*, rss_drains};

pub async fn no_drain(size: &Size, progress: &Progress) -> Result<NoDrain> {
    let step = progress.begin("no-drain: control plane");
    let (testbed, client) = own_testbed(Some(limits(i32::try_from(size.parallel)?, None))).await?;
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

/// Pods labelled `app`: on nodes of the pool `pool` only, one per node; or (no pool) anywhere the
/// scheduler puts them.
pub fn app_template(app: &str, pool: Option<&str>) -> PodTemplateSpec {
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
pub async fn create_app(
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

pub fn app_selector(app: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([("app".to_string(), app.to_string())])),
        ..Default::default()
    }
}

/// A cluster ready to be drained: `drained` nodes holding `pods_per_node` workload pods each (one
/// per Deployment or StatefulSet, each under a PodDisruptionBudget) and a DaemonSet pod, and as
/// many spare nodes, where the replacements go (so that no pod is evicted twice).
pub struct DrainCluster {
    pub testbed: Testbed,
    pub client: Client,
    pub ns: String,
    pub drained: Vec<String>,
    pub pods: usize,
}

pub async fn drain_cluster(
    size: &Size,
    k: usize,
    who: &str,
    progress: &Progress,
) -> Result<DrainCluster> {
    let x = size.drain_nodes;
    let step = progress.begin(&format!("drain {who} K={k}: control plane"));
    let k32 = i32::try_from(k)?;
    let (testbed, client) = own_testbed(Some(limits(k32, k32))).await?;
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
    let settled = (apps.len(), replicas, 0);
    wait_pdbs_settled(&client, &ns, settled, size.wait(pods), |s| step.set(s)).await?;
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

pub fn evictions_summary(
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
pub struct RunShape {
    pub who: &'static str,
    pub nodes: usize,
    pub pods: usize,
    pub parallel: usize,
    pub seconds: f64,
    pub last_drained: f64,
}

/// A run's figures from the audit log: the evictions by `user` in `ns` from `from`, and (the
/// operator's runs, `operator_until` given) all its API calls until then.
pub fn drain_run(
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
        disruption_timeouts: 0,
    }
}

/// The `NotDeleted` Events of the disruption controller in `ns`, repeats included (see
/// [`DrainRun::disruption_timeouts`]).
pub async fn disruption_timeouts(client: &Client, ns: &str) -> Result<usize> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let not_deleted = events
        .list(&ListParams::default().fields("reason=NotDeleted"))
        .await
        .with_context(|| format!("listing the NotDeleted Events of namespace {ns}"))?;
    Ok(not_deleted
        .items
        .iter()
        .map(|e| usize::try_from(e.count.unwrap_or(1)).unwrap_or(1))
        .sum())
}

/// What the progress line adds when the disruption controller's timeout held a drain.
pub fn disruption_timeouts_note(n: usize) -> String {
    match n {
        0 => String::new(),
        n => format!(
            "; held by the disruption controller's 2-minute DeletionTimeout {n} time(s) \
             (NotDeleted Events)"
        ),
    }
}

/// The operator's side of a drain run: plays the requestor on `nodes` (each released once Ready)
/// while `op` drains them, then reads the run's figures and the operator's peak RSS. Returns the
/// run, the audit log and when the requests began (for the caller's own figures).
pub async fn operator_drain_run(
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

pub async fn drain_ours(size: &Size, k: usize, progress: &Progress) -> Result<DrainRun> {
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
    let mut run = run;
    run.disruption_timeouts = disruption_timeouts(&cluster.client, &cluster.ns).await?;
    let (seconds, last_ready) = (run.seconds, run.seconds_to_last_drained);
    let (evicted_pods, eviction_calls) = (run.evicted_pods, run.eviction_calls);
    let calls = run.api_calls.unwrap_or_default();
    step.end(&format!(
        "{seconds:.1}s (last Ready at {last_ready:.1}s); {evicted_pods} pods evicted with \
         {eviction_calls} eviction calls ({:.2}/pod), {calls} API calls ({:.2}/pod){}",
        run.eviction_calls_per_pod,
        ratio(calls, evicted_pods),
        disruption_timeouts_note(run.disruption_timeouts)
    ));
    ensure!(
        evicted_pods == cluster.pods,
        "the operator evicted {evicted_pods} pods, want {}",
        cluster.pods
    );
    Ok(run)
}

pub async fn kubectl_path() -> Result<PathBuf> {
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

pub async fn kubectl(kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> Result<()> {
    let mut command = tokio::process::Command::new(kubectl);
    run_async(command.arg("--kubeconfig").arg(kubeconfig).args(args)).await?;
    Ok(())
}

/// `kubectl drain --ignore-daemonsets` then `kubectl uncordon` of each node, `k` nodes at a time.
/// Returns (seconds until all are uncordoned, seconds until the last drain returned).
pub async fn kubectl_drain_each(
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

pub async fn drain_kubectl(size: &Size, k: usize, progress: &Progress) -> Result<DrainRun> {
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
    let mut run = drain_run(shape, &log, &cluster.ns, ADMIN_USER, from, None);
    run.disruption_timeouts = disruption_timeouts(&cluster.client, &cluster.ns).await?;
    let (evicted_pods, eviction_calls) = (run.evicted_pods, run.eviction_calls);
    step.end(&format!(
        "{seconds:.1}s (last drain returned at {last:.1}s); {evicted_pods} pods evicted with \
         {eviction_calls} eviction calls ({:.2}/pod){}",
        run.eviction_calls_per_pod,
        disruption_timeouts_note(run.disruption_timeouts)
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

pub struct FleetCluster {
    pub testbed: Testbed,
    pub client: Client,
    pub ns: String,
    pub nodes: Vec<String>,
    pub pods: usize,
    pub max_unavailable: IntOrString,
    /// Workloads under a budget that allows one disruption at a time.
    pub strict: HashSet<String>,
}

/// `fleet_nodes` nodes, about `fleet_pods_per_node` workload pods each: Deployments (every tenth
/// workload a StatefulSet) of `fleet_replicas` pods, each Deployment under a PDB (maxUnavailable
/// 1, 10%, minAvailable n-1 in turn), spread by the scheduler, and a DaemonSet on every node.
pub async fn fleet_cluster(size: &Size, who: &str, progress: &Progress) -> Result<FleetCluster> {
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
    let settled = (budgets, replicas32, 0);
    wait_pdbs_settled(&client, &ns, settled, size.wait(pods), |s| step.set(s)).await?;
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

pub fn int_or_string(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

pub async fn fleet_ours(size: &Size, progress: &Progress) -> Result<DrainRun> {
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
    run.disruption_timeouts = disruption_timeouts(&cluster.client, &cluster.ns).await?;
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

pub async fn fleet_kubectl(size: &Size, progress: &Progress) -> Result<DrainRun> {
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
    run.disruption_timeouts = disruption_timeouts(&cluster.client, &cluster.ns).await?;
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
pub async fn rss(size: &Size, progress: &Progress, points: &mut Vec<RssPoint>) -> Result<()> {
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
pub async fn rebalance(
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
pub fn rss_app(i: usize) -> String {
    format!("r{i:03}")
}

/// Sets `spec.replicas` of the RSS runs' first `apps` Deployments.
pub async fn scale_deployments(
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
pub async fn pods_on_nodes(client: &Client, ns: &str, nodes: &[String]) -> Result<usize> {
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
