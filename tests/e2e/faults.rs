//! The operator behind real faults, each scenario on a control plane of its own with a 30-node
//! rollout under PodDisruptionBudgets (10 Deployments of 6 pods spread over the nodes, budgets of
//! maxUnavailable 1 and minAvailable 5 in turn, maxParallelOperations 5, maxUnavailable 5):
//!
//! - TCP faults from toxiproxy between the operator and the API server: latency spikes of 1 s on a
//!   bandwidth-limited link; every connection reset a few seconds after it opens;
//! - HTTP faults from the testbed's faultproxy: 5% of requests answered 500 (half of them after
//!   the API server did the work) or 429 with Retry-After, every watch cut every few seconds;
//!   and, on small clusters of their own, every admission applied but answered 500 while the
//!   operator's watches lag 1 s, requests deleted the moment they are admitted while the
//!   watches lag 1 s, and a request whose finalizer is removed by hand as it is deleted;
//! - kube-apiserver stopped for 20 s mid-drain and started again; etcd restarted mid-drain;
//! - the leader partitioned from the API server mid-drain: the standby takes over, and the audit
//!   log shows no write of the old leader after the new leader's first write.
//!
//! Every scenario must end with every request Ready and released, every node uncordoned, every
//! Deployment whole, and the invariant monitor clean (PDBs never below desired, limits held, no
//! two requests on a node, no pod deleted instead of evicted), checked against what the cluster
//! and the API server's audit log show.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use maintenance_crds::{FINALIZER, MaintenanceOperatorConfigSpec, NodeMaintenance, Phase};
use support::audit::{AuditLog, WriteCall, describe_writes, seconds_between};
use support::faults::{
    Component, FaultProxy, HttpFaults, Stream, Toxic, ToxicKind, ToxicProxy, Toxiproxy,
    start_component, stop_component,
};
use support::invariants::{InvariantMonitor, Scope, audit_breaches};
use support::operator::*;
use support::*;

const NODES: usize = 30;
const DEPLOYMENTS: usize = 10;
const REPLICAS: i32 = 6;
const MAX_PARALLEL: i32 = 5;
const MAX_UNAVAILABLE: i32 = 5;
const SETUP: Duration = Duration::from_secs(120);
/// The whole rollout, faults included.
const ROLLOUT: Duration = Duration::from_secs(240);
/// Longest time without a request finishing (an outage, then the operator's watches backing off).
const STALL: Duration = Duration::from_secs(90);
const REQUESTOR: &str = "faults.example.com";
/// The API server's outage of the restart scenario.
const API_SERVER_OUTAGE: Duration = Duration::from_secs(20);
/// Lease duration of the partition scenario (renew deadline 2/3 of it).
const LEASE_SECONDS: u64 = 4;

/// A control plane with 30 Ready nodes and the workloads, before the operator starts.
struct Cluster {
    testbed: Testbed,
    client: Client,
    ns: String,
    nodes: Vec<String>,
}

async fn prepare(name: &str) -> Result<Cluster> {
    let (testbed, client, ns, nodes) =
        own_cluster(name, NODES, Some(limits(MAX_PARALLEL, MAX_UNAVAILABLE))).await?;
    let apps: Vec<String> = (0..DEPLOYMENTS).map(|i| format!("app-{i}")).collect();
    for (i, app) in apps.iter().enumerate() {
        let labels = [("app", app.as_str())];
        create_deployment(
            &client,
            &ns,
            app,
            REPLICAS,
            &labels,
            &PodSpecOptions::on_nodes_with_prefix(name),
        )
        .await?;
        if i % 2 == 0 {
            create_pdb_max_unavailable(&client, &ns, app, &labels, IntOrString::Int(1)).await?;
        } else {
            create_pdb_min_available(&client, &ns, app, &labels, IntOrString::Int(REPLICAS - 1))
                .await?;
        }
    }
    for app in &apps {
        wait_deployment_ready(&client, &ns, app, SETUP).await?;
        wait_pdb_disruptions_allowed(&client, &ns, app, 1, SETUP)
            .await
            .context("precondition: every budget allows one disruption before the rollout")?;
    }
    Ok(Cluster {
        testbed,
        client,
        ns,
        nodes,
    })
}

/// ServiceAccount `account` of the operator's namespace (cluster-admin) and a kubeconfig with its
/// token straight to the API server; returns that kubeconfig and the user the audit log names.
async fn operator_account(testbed: &Testbed, account: &str) -> Result<(PathBuf, String)> {
    let client = testbed.client().await?;
    create_cluster_admin_service_account(&client, OPERATOR_NAMESPACE, account).await?;
    let path = testbed.dir().join(format!("operator-{account}.kubeconfig"));
    service_account_kubeconfig(testbed, OPERATOR_NAMESPACE, account, &path).await?;
    Ok((path, service_account_user(account)))
}

async fn monitor(cluster: &Cluster, operator_user: &str) -> Result<InvariantMonitor> {
    InvariantMonitor::start(
        &cluster.testbed,
        Scope::new(&cluster.ns, &cluster.nodes)
            .operator_user(operator_user)
            .check_limits(true),
    )
    .await
}

/// One request per node, each with a drain.
async fn request_every_node(cluster: &Cluster) -> Result<()> {
    for (i, node) in cluster.nodes.iter().enumerate() {
        let spec = maintenance_crds::NodeMaintenanceSpec {
            drain_spec: drain_spec(false, 300),
            ..request_spec(node, REQUESTOR)
        };
        create_request(&cluster.client, &cluster.ns, &format!("m{i}"), spec).await?;
    }
    Ok(())
}

/// Waits until a drain is under way (a request in phase Draining).
async fn wait_mid_drain(cluster: &Cluster) -> Result<()> {
    wait_until("a request in phase Draining", ROLLOUT, || async {
        let requests = list_requests(&cluster.client, &cluster.ns).await?;
        if requests.iter().any(|r| r.phase() == Phase::Draining) {
            return Ok(Check::Done(()));
        }
        let phases: Vec<String> = requests.iter().map(|r| r.phase().to_string()).collect();
        Ok(Check::Pending(format!("phases {phases:?}")))
    })
    .await
}

/// Name, node, phase and conditions, and for a drain the pods it still waits for and why.
fn describe_with_drain(r: &maintenance_crds::NodeMaintenance) -> String {
    let blocked: Vec<String> = r
        .status
        .iter()
        .filter_map(|s| s.drain.as_ref())
        .flat_map(|d| d.blocked.iter())
        .take(3)
        .map(|b| format!("{} {}: {}", b.pod, b.reason, b.message))
        .collect();
    format!(
        "{} on {}: {}{}",
        r.name_any(),
        r.spec.node_name,
        describe(r),
        if blocked.is_empty() {
            String::new()
        } else {
            format!("; blocked: [{}]", blocked.join("; "))
        }
    )
}

/// Plays the requestor until every request is Ready and released (gone). Fails when no request
/// finished for [`STALL`] (a stuck request, named with its conditions) or after [`ROLLOUT`].
async fn release_everything(cluster: &Cluster) -> Result<()> {
    let started = Instant::now();
    let mut remaining = usize::MAX;
    let mut last_progress = Instant::now();
    let mut left = String::from("(not listed yet)");
    let mut last_error = String::new();
    loop {
        // A failed call (the API server may be restarting) is tried again at the next round.
        match list_requests(&cluster.client, &cluster.ns).await {
            Ok(requests) if requests.is_empty() => return Ok(()),
            Ok(requests) => {
                for r in &requests {
                    if r.phase() == Phase::Ready && !r.is_deleting() {
                        let _ = delete_request(&cluster.client, &cluster.ns, &r.name_any()).await;
                    }
                }
                if requests.len() < remaining {
                    remaining = requests.len();
                    last_progress = Instant::now();
                }
                let lines: Vec<String> = requests.iter().map(describe_with_drain).collect();
                left = format!("{} left:\n{}", lines.len(), lines.join("\n"));
            }
            Err(e) => last_error = format!(" (the last listing failed: {e:#})"),
        }
        let why = if last_progress.elapsed() > STALL {
            format!("no request finished for {}s", STALL.as_secs())
        } else if started.elapsed() > ROLLOUT {
            format!("the rollout took more than {}s", ROLLOUT.as_secs())
        } else {
            tokio::time::sleep(POLL_INTERVAL).await;
            continue;
        };
        anyhow::bail!(
            "every request must become Ready and be released under the faults, but {why}; \
             {left}{last_error}"
        );
    }
}

/// `earlier_admissions`: admissions an earlier monitor of the same rollout saw.
async fn ensure_all_done(
    cluster: &Cluster,
    monitor: InvariantMonitor,
    operator_users: &[&str],
    earlier_admissions: Option<usize>,
) -> Result<()> {
    for node in &cluster.nodes {
        ensure!(
            !node_unschedulable(&cluster.client, node).await?,
            "node {node} is still cordoned after every request was released"
        );
    }
    for i in 0..DEPLOYMENTS {
        wait_deployment_ready(&cluster.client, &cluster.ns, &format!("app-{i}"), SETUP).await?;
    }
    let report = monitor.finish().await?;
    // With two monitors, requests admitted between the first one's end and the second one's
    // start are seen by neither: only one monitor's count is exact.
    if earlier_admissions.is_none() {
        ensure!(
            report.admissions >= NODES,
            "the monitor saw {} admissions for {NODES} requests",
            report.admissions
        );
    }

    let audit = AuditLog::read(&cluster.testbed)?.in_namespace(&cluster.ns);
    let evicted: BTreeSet<String> = audit
        .evictions
        .iter()
        .filter(|e| operator_users.contains(&e.user.as_str()) && (200..300).contains(&e.code))
        .map(|e| e.key())
        .collect();
    let pods = DEPLOYMENTS * usize::try_from(REPLICAS)?;
    // Every node was drained, so every pod of the start was evicted (at least).
    ensure!(
        evicted.len() >= pods,
        "the audit log shows {} pods evicted by the operator ({operator_users:?}); every one of \
         the {pods} pods of the start sat on a node that was drained",
        evicted.len()
    );
    // Pods go away through the Eviction API only: whoever deleted a pod (KWOK's final delete
    // after the grace period), an eviction of that pod had been accepted before.
    let all_evicted: BTreeSet<String> = audit
        .evictions
        .iter()
        .filter(|e| (200..300).contains(&e.code))
        .map(|e| e.key())
        .collect();
    let unevicted: Vec<String> = audit
        .pod_deletions
        .iter()
        .filter(|d| (200..300).contains(&d.code))
        .map(|d| format!("{}/{}", d.namespace, d.pod))
        .filter(|key| !all_evicted.contains(key))
        .collect();
    ensure!(
        unevicted.is_empty(),
        "pods deleted without an eviction: {unevicted:?}"
    );
    println!(
        "{}: {} pods evicted, peak {} nodes in maintenance, {} unavailable, lowest PDB margin {:?}",
        cluster.ns,
        evicted.len(),
        report.peak_in_maintenance,
        report.peak_unavailable,
        report.lowest_pdb_margin
    );
    Ok(())
}

/// The operator through toxiproxy, as ServiceAccount `account`.
async fn operator_through_toxiproxy(
    cluster: &Cluster,
    account: &str,
    extra: &[&str],
) -> Result<(Toxiproxy, ToxicProxy, Operator, String)> {
    let (direct, user) = operator_account(&cluster.testbed, account).await?;
    let mut toxiproxy = Toxiproxy::start(&cluster.testbed).await?;
    let proxy = toxiproxy
        .proxy_to_api_server(&cluster.testbed, account)
        .await?;
    let kubeconfig = cluster
        .testbed
        .dir()
        .join(format!("operator-{account}-via-toxiproxy.kubeconfig"));
    proxy.write_kubeconfig(&direct, &kubeconfig)?;
    let operator =
        Operator::start_with_kubeconfig(&kubeconfig, cluster.testbed.dir(), extra).await?;
    Ok((toxiproxy, proxy, operator, user))
}

/// Puts `kinds` (each on both streams) on the proxy for `on`, off for `off`, again and again;
/// counts the pulses in `pulses`. Returns only on an error: race it against the rollout.
async fn pulse(
    proxy: &ToxicProxy,
    kinds: &[(&str, ToxicKind)],
    on: Duration,
    off: Duration,
    pulses: &AtomicU32,
) -> Result<()> {
    let streams = [Stream::Upstream, Stream::Downstream];
    loop {
        for (name, kind) in kinds {
            for stream in streams {
                proxy
                    .add(&Toxic::new(&format!("{name}-{stream:?}"), *kind, stream))
                    .await?;
            }
        }
        pulses.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(on).await;
        for (name, _) in kinds {
            for stream in streams {
                proxy.remove(&format!("{name}-{stream:?}")).await?;
            }
        }
        tokio::time::sleep(off).await;
    }
}

/// Releases every request while `kinds` pulse on the proxy (see [`pulse`]); then takes every
/// toxic off and fails if fewer than `at_least` pulses came during the rollout. Returns the pulses.
async fn release_everything_while_pulsing(
    cluster: &Cluster,
    proxy: &ToxicProxy,
    kinds: &[(&str, ToxicKind)],
    (on, off): (Duration, Duration),
    at_least: u32,
) -> Result<u32> {
    let pulses = AtomicU32::new(0);
    tokio::select! {
        done = release_everything(cluster) => done?,
        failed = pulse(proxy, kinds, on, off, &pulses) => {
            failed?;
            bail!("the pulses stopped before the rollout ended");
        }
    }
    proxy.remove_all().await?;
    let pulses = pulses.load(Ordering::SeqCst);
    ensure!(
        pulses >= at_least,
        "only {pulses} pulses of {kinds:?} during the rollout, want {at_least} or more"
    );
    Ok(pulses)
}

fn report_time(scenario: &str, started: Instant) {
    println!(
        "scenario {scenario}: {:.1}s wall time (control plane, setup and rollout)",
        started.elapsed().as_secs_f64()
    );
}

#[tokio::test]
async fn latency_spikes_and_a_bandwidth_limit_during_the_drains() -> Result<()> {
    let _turn = large_scenario_turn().await;
    let started = Instant::now();
    let cluster = prepare("lat").await?;
    let (_toxiproxy, proxy, _operator, user) =
        operator_through_toxiproxy(&cluster, "faulty-operator", &[]).await?;
    let monitor = monitor(&cluster, &user).await?;

    proxy
        .add(&Toxic::new(
            "bandwidth",
            ToxicKind::Bandwidth { rate_kb_per_s: 64 },
            Stream::Downstream,
        ))
        .await?;
    request_every_node(&cluster).await?;
    // Spikes of 1 s each way, 2 s on and 3 s off, for as long as the rollout runs.
    let latency = ToxicKind::Latency {
        latency_ms: 1000,
        jitter_ms: 100,
    };
    let spikes = release_everything_while_pulsing(
        &cluster,
        &proxy,
        &[("spike", latency)],
        (Duration::from_secs(2), Duration::from_secs(3)),
        2,
    )
    .await?;
    println!("{spikes} latency spikes of 1s under a 64 KB/s limit");
    monitor.check()?;
    ensure_all_done(&cluster, monitor, &[&user], None).await?;
    report_time("latency spikes and bandwidth limit", started);
    Ok(())
}

#[tokio::test]
async fn connections_reset_every_few_seconds() -> Result<()> {
    let _turn = large_scenario_turn().await;
    let started = Instant::now();
    let cluster = prepare("rst").await?;
    let (_toxiproxy, proxy, _operator, user) =
        operator_through_toxiproxy(&cluster, "faulty-operator", &[]).await?;
    let monitor = monitor(&cluster, &user).await?;

    request_every_node(&cluster).await?;
    // Every 1.5 s, each connection that carries a byte either way within 300 ms (watch events
    // included) is reset (TCP RST), and so is every connection opened in that window.
    // (toxiproxy's reset_peer drops the data it waits on, so it cannot stay on.) Every 3 s was
    // too seldom once the rollout took under 7 s: two rounds of resets, not three.
    let resets = release_everything_while_pulsing(
        &cluster,
        &proxy,
        &[("reset", ToxicKind::ResetPeer { after_ms: 0 })],
        (Duration::from_millis(300), Duration::from_millis(1200)),
        3,
    )
    .await?;
    println!("{resets} rounds of connection resets");
    ensure_all_done(&cluster, monitor, &[&user], None).await?;
    report_time("connections reset every 1.5s", started);
    Ok(())
}

/// 5% of the operator's calls answered 500 or 429 (half of them after the API server did the
/// work), watches cut every 3 s. The 429s matter most: one that is no budget's refusal (API
/// Priority and Fairness throttling, as injected here) must give back the disruption the
/// eviction gate let the call claim, or every later eviction of that budget's pods is held and
/// the drains wait forever (the test would fail after `STALL`, naming the blocked pods).
#[tokio::test]
async fn five_percent_500_and_429_and_watches_cut() -> Result<()> {
    let _turn = large_scenario_turn().await;
    let started = Instant::now();
    let cluster = prepare("http").await?;
    let (direct, user) = operator_account(&cluster.testbed, "faulty-operator").await?;
    let mut proxy = FaultProxy::start(&cluster.testbed, &direct).await?;
    let kubeconfig = cluster
        .testbed
        .dir()
        .join("operator-via-faultproxy.kubeconfig");
    proxy.write_kubeconfig(&direct, &kubeconfig)?;
    let _operator =
        Operator::start_with_kubeconfig(&kubeconfig, cluster.testbed.dir(), &[]).await?;
    let monitor = monitor(&cluster, &user).await?;

    proxy
        .set(&HttpFaults {
            error_rate: 0.05,
            codes: vec![500, 429],
            retry_after_seconds: 1,
            lost_answer_share: 0.5,
            cut_watches_every_ms: 3000,
            ..HttpFaults::default()
        })
        .await?;
    let before = proxy.stats().await?;
    request_every_node(&cluster).await?;
    release_everything(&cluster).await?;
    let stats = proxy.stats().await?;
    proxy.clear().await?;
    let injected =
        stats.injected(500) + stats.injected(429) - before.injected(500) - before.injected(429);
    println!(
        "faultproxy: {} requests, {} answered 500 ({} after the work was done), {} answered \
         429, {} watches cut",
        stats.requests - before.requests,
        stats.injected(500) - before.injected(500),
        stats.lost_answers - before.lost_answers,
        stats.injected(429) - before.injected(429),
        stats.watches_cut - before.watches_cut
    );
    ensure!(
        injected > 0 && stats.watches_cut > before.watches_cut,
        "the faults did not happen: {stats:?}"
    );
    ensure_all_done(&cluster, monitor, &[&user], None).await?;
    report_time("5% 500/429 and watches cut", started);
    Ok(())
}

/// After an outage of the control plane, the monitor's watches come back only when their
/// backoff says so (up to 30 s later) and learn of the deletions made meanwhile only at their
/// re-list, after the operator may have admitted other requests in the slots those freed: the
/// replay would count the gone requests at those admissions. So the outage is judged by one
/// monitor that finishes (with a fresh list) before the test deletes anything, and the rest of
/// the rollout by a new one. Returns the new monitor and what the first one saw admitted.
async fn judge_outage_and_watch_on(
    cluster: &Cluster,
    monitor: InvariantMonitor,
    operator_user: &str,
) -> Result<(InvariantMonitor, usize)> {
    let report = monitor
        .finish()
        .await
        .context("the invariants through the outage")?;
    let next = self::monitor(cluster, operator_user).await?;
    Ok((next, report.admissions))
}

#[tokio::test]
async fn api_server_stopped_for_20s_mid_drain() -> Result<()> {
    let _turn = large_scenario_turn().await;
    let started = Instant::now();
    let cluster = prepare("apisrv").await?;
    let _operator = Operator::start_as(&cluster.testbed, "faulty-operator", &[]).await?;
    let user = service_account_user("faulty-operator");
    let monitor = monitor(&cluster, &user).await?;

    request_every_node(&cluster).await?;
    wait_mid_drain(&cluster).await?;
    let outage = Instant::now();
    stop_component(
        &cluster.testbed,
        Component::KubeApiServer,
        Duration::from_secs(2),
    )
    .await?;
    // The outage itself: a fixed length is the scenario, not a wait for a condition.
    tokio::time::sleep(API_SERVER_OUTAGE.saturating_sub(outage.elapsed())).await;
    start_component(&cluster.testbed, Component::KubeApiServer).await?;
    println!(
        "kube-apiserver unreachable for {:.1}s mid-drain",
        outage.elapsed().as_secs_f64()
    );
    let (monitor, admitted) = judge_outage_and_watch_on(&cluster, monitor, &user).await?;
    release_everything(&cluster).await?;
    ensure_all_done(&cluster, monitor, &[&user], Some(admitted)).await?;
    report_time("kube-apiserver stopped for 20s", started);
    Ok(())
}

#[tokio::test]
async fn etcd_restarted_mid_drain() -> Result<()> {
    let _turn = large_scenario_turn().await;
    let started = Instant::now();
    let cluster = prepare("etcd").await?;
    let _operator = Operator::start_as(&cluster.testbed, "faulty-operator", &[]).await?;
    let user = service_account_user("faulty-operator");
    let monitor = monitor(&cluster, &user).await?;

    request_every_node(&cluster).await?;
    wait_mid_drain(&cluster).await?;
    let outage = Instant::now();
    stop_component(&cluster.testbed, Component::Etcd, Duration::from_secs(2)).await?;
    start_component(&cluster.testbed, Component::Etcd).await?;
    println!(
        "etcd restarted mid-drain ({:.1}s down)",
        outage.elapsed().as_secs_f64()
    );
    let (monitor, admitted) = judge_outage_and_watch_on(&cluster, monitor, &user).await?;
    release_everything(&cluster).await?;
    ensure_all_done(&cluster, monitor, &[&user], Some(admitted)).await?;
    report_time("etcd restarted", started);
    Ok(())
}

#[tokio::test]
async fn leader_partitioned_from_the_api_server_stops_before_its_lease_is_taken() -> Result<()> {
    let _turn = large_scenario_turn().await;
    let started = Instant::now();
    let cluster = prepare("part").await?;
    let lease = LEASE_SECONDS.to_string();
    // The first replica reaches the API server through toxiproxy only, the second directly.
    let (_toxiproxy, proxy, mut first, first_user) =
        operator_through_toxiproxy(&cluster, "replica-a", &replica_args("replica-a", &lease))
            .await?;
    wait_holder(&cluster.client, "replica-a", SETUP).await?;
    let second = Operator::start_as(
        &cluster.testbed,
        "replica-b",
        &replica_args("replica-b", &lease),
    )
    .await?;
    let second_user = service_account_user("replica-b");
    let monitor = monitor(&cluster, &first_user).await?;
    let since = Timestamp::now();

    request_every_node(&cluster).await?;
    wait_mid_drain(&cluster).await?;
    // A partition: nothing gets through either way, connections stay open.
    for stream in [Stream::Upstream, Stream::Downstream] {
        proxy
            .add(&Toxic::new(
                &format!("partition-{stream:?}"),
                ToxicKind::Timeout { after_ms: 0 },
                stream,
            ))
            .await?;
    }
    let partitioned = Instant::now();
    wait_holder(&cluster.client, "replica-b", SETUP).await?;
    println!(
        "replica-b took the Lease {:.1}s after replica-a was partitioned",
        partitioned.elapsed().as_secs_f64()
    );
    // Heal the partition: a replica-a that still believed it led would write again now.
    proxy.remove_all().await?;
    if let Some(status) = first.exit_status() {
        println!("replica-a gave up leadership and exited ({status}); restarted as a standby");
        first.restart().await?;
    }
    // Two replicas acting at once may wedge the rollout: the audit log's verdict comes first.
    let rollout = release_everything(&cluster).await;
    drop(second);
    drop(first);

    let audit = AuditLog::read(&cluster.testbed)?;
    let first_writes = audit.writes_by(&first_user);
    let second_writes = audit.writes_by(&second_user);
    // Positive control: the log holds the first leader's work, so silence means silence.
    ensure!(
        first_writes
            .iter()
            .any(|w| w.resource == "nodemaintenances" && (200..300).contains(&w.code)),
        "the audit log holds no NodeMaintenance write of the first leader ({first_user}): {}",
        describe_writes(&first_writes)
    );
    let takeover = second_writes
        .iter()
        .filter(|w| (200..300).contains(&w.code))
        .map(|w| w.received)
        .min()
        .with_context(|| format!("the new leader ({second_user}) wrote nothing"))?;
    let late: Vec<&WriteCall> = first_writes
        .iter()
        .copied()
        .filter(|w| w.received >= takeover)
        .collect();
    ensure!(
        late.is_empty(),
        "the old leader ({first_user}) wrote after the new leader's first write at {takeover}: {}",
        describe_writes(&late)
    );
    if let Some(last) = first_writes.iter().map(|w| w.received).max() {
        println!(
            "the old leader's last write came {:.2}s before the new leader's first",
            seconds_between(last, takeover)
        );
    }
    rollout?;
    ensure!(
        lease_holder(&cluster.client, OPERATOR_NAMESPACE, OUR_LEASE)
            .await?
            .as_deref()
            == Some("replica-b"),
        "the Lease changed hands again after the takeover"
    );
    let deleted = audit_breaches(&audit, &cluster.ns, &second_user, since);
    ensure!(
        deleted.is_empty(),
        "the new leader deleted pods instead of evicting them: {deleted:?}"
    );
    ensure_all_done(&cluster, monitor, &[&first_user, &second_user], None).await?;
    report_time("leader partitioned", started);
    Ok(())
}

/// A leader whose first sync takes longer than its renew deadline keeps its Lease: the renewal
/// runs from the moment the Lease is won, not from when the supervisor's caches are full (in a big
/// cluster the first lists of nodes and requests take seconds). Here every paged LIST waits 8 s in
/// the fault proxy, twice the lease duration; a renewal that began after the sync found its
/// deadline passed and the process exited with "lost leadership", again at every restart.
#[tokio::test]
async fn a_slow_first_sync_keeps_the_lease() -> Result<()> {
    const LIST_DELAY: Duration = Duration::from_secs(8);
    let _turn = large_scenario_turn().await;
    let (testbed, client, ns, nodes) = own_cluster("slow", 2, Some(limits(1, 1))).await?;
    let (direct, _user) = operator_account(&testbed, "slow-sync").await?;
    let mut proxy = FaultProxy::start(&testbed, &direct).await?;
    proxy
        .set(&HttpFaults {
            list_delay_ms: u64::try_from(LIST_DELAY.as_millis())?,
            ..HttpFaults::default()
        })
        .await?;
    let kubeconfig = testbed.dir().join("operator-slow-sync.kubeconfig");
    proxy.write_kubeconfig(&direct, &kubeconfig)?;
    let lease = LEASE_SECONDS.to_string();
    let started = Instant::now();
    let mut operator = Operator::start_with_kubeconfig(
        &kubeconfig,
        testbed.dir(),
        &replica_args("slow-sync", &lease),
    )
    .await?;
    // A replica is ready while it is a standby, so readiness alone may come before it leads (a
    // CI run saw it 0.1 s after the start). The Lease seen taken is not enough either: the
    // operator hears that its write went through a moment later, through the proxy. Its own
    // `leader` gauge is set once it knows; ready while it leads means synced.
    wait_for("the operator to know it leads", SETUP, || async {
        Ok((operator
            .metric("maintenance_operator_leader")
            .await
            .is_ok_and(|v| v == 1.0))
        .then_some(()))
    })
    .await?;
    let readyz = format!("http://127.0.0.1:{}/readyz", operator.health_port);
    wait_for("the leader's caches to sync", SETUP, || async {
        Ok((http_get(&readyz).await?.0 == 200).then_some(()))
    })
    .await?;
    let synced_after = started.elapsed();
    let delayed = proxy.stats().await?.delayed_lists;
    ensure!(
        delayed > 0 && synced_after >= LIST_DELAY,
        "precondition: the first sync was not slowed down ({delayed} lists delayed, ready after \
         {synced_after:?})"
    );
    // Three lease durations past the sync: a leader that could not renew would be gone by now.
    request_node(&client, &ns, "after-sync", &nodes[0], REQUESTOR).await?;
    wait_phase(&client, &ns, "after-sync", Phase::Ready, SETUP).await?;
    let hold_for = Duration::from_secs(3 * LEASE_SECONDS);
    let until = Instant::now() + hold_for;
    while Instant::now() < until {
        if let Some(status) = operator.exit_status() {
            bail!(
                "the operator exited {:?} after a slow first sync ({status})",
                started.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(
        lease_holder(&client, OPERATOR_NAMESPACE, OUR_LEASE)
            .await?
            .as_deref()
            == Some("slow-sync"),
        "the Lease is no longer held by the operator that synced slowly"
    );
    println!(
        "ready {:.1}s after the start ({delayed} lists held {LIST_DELAY:?} each); still leading \
         {hold_for:?} later",
        synced_after.as_secs_f64()
    );
    Ok(())
}

/// A small cluster of its own: `nodes` Ready nodes, a namespace, and the operator behind a
/// faultproxy set to `faults` from its start, watched by the invariant monitor (limits
/// included).
struct BehindProxy {
    testbed: Testbed,
    client: Client,
    ns: String,
    nodes: Vec<String>,
    proxy: FaultProxy,
    _operator: Operator,
    monitor: InvariantMonitor,
}

async fn behind_proxy(
    name: &str,
    nodes: usize,
    config: MaintenanceOperatorConfigSpec,
    faults: &HttpFaults,
) -> Result<BehindProxy> {
    let (testbed, client, ns, nodes) = own_cluster(name, nodes, Some(config)).await?;
    let (direct, user) = operator_account(&testbed, name).await?;
    let mut proxy = FaultProxy::start(&testbed, &direct).await?;
    proxy.set(faults).await?;
    let kubeconfig = testbed.dir().join(format!("operator-{name}.kubeconfig"));
    proxy.write_kubeconfig(&direct, &kubeconfig)?;
    let operator = Operator::start_with_kubeconfig(&kubeconfig, testbed.dir(), &[]).await?;
    let monitor = InvariantMonitor::start(
        &testbed,
        Scope::new(&ns, &nodes)
            .operator_user(&user)
            .check_limits(true),
    )
    .await?;
    Ok(BehindProxy {
        testbed,
        client,
        ns,
        nodes,
        proxy,
        _operator: operator,
        monitor,
    })
}

/// An admission whose answer is lost keeps its slot: the API server applied the write and
/// answered 500, and the operator's cache, a second behind, still shows the request Pending. The
/// supervisor took the 500 for "not admitted" and gave the slot to the next request, which was
/// admitted beside it (the five-percent run above saw six nodes in maintenance with
/// maxParallelOperations 5). Now the request is read back (`lifecycle::admission_read_back`) and
/// counts as admitted until it is. Here, with maxParallelOperations 1, one request holds the slot
/// while three wait (their Pending written and cached, so an admission is not refused as stale);
/// then every PATCH of a NodeMaintenance itself (not of its status) is applied and answered 500,
/// every watch of the operator lags 1 s, and the holder is released.
#[tokio::test]
async fn an_admission_whose_answer_is_lost_keeps_its_slot() -> Result<()> {
    const REQUESTS: usize = 4;
    let _turn = large_scenario_turn().await;
    let BehindProxy {
        testbed,
        client,
        ns,
        nodes,
        mut proxy,
        _operator,
        monitor,
    } = behind_proxy(
        "lost-answer",
        REQUESTS,
        limits(1, 1),
        &HttpFaults::default(),
    )
    .await?;
    let names: Vec<String> = (0..REQUESTS).map(|i| format!("m{i}")).collect();
    for (name, node) in names.iter().zip(&nodes) {
        request_node(&client, &ns, name, node, REQUESTOR).await?;
        if name == &names[0] {
            wait_phase(&client, &ns, name, Phase::Ready, SETUP).await?;
        }
    }
    for name in &names[1..] {
        wait_phase(&client, &ns, name, Phase::Pending, SETUP).await?;
    }

    proxy
        .set(&HttpFaults {
            error_rate: 1.0,
            codes: vec![500],
            lost_answer_share: 1.0,
            only_method: "PATCH".to_string(),
            only_path_matching: "/nodemaintenances/[^/]+$".to_string(),
            watch_delay_ms: 1000,
            ..HttpFaults::default()
        })
        .await?;
    // The watches opened again from here on lag.
    proxy.cut_watches().await?;
    delete_request(&client, &ns, &names[0]).await?;
    let next = wait_for("another request to become Ready", SETUP, || async {
        Ok(list_requests(&client, &ns)
            .await?
            .into_iter()
            .find(|r| r.phase() == Phase::Ready && r.name_any() != names[0]))
    })
    .await?;
    let stats = proxy.stats().await?;
    ensure!(
        stats.lost_answers > 0,
        "precondition: no admission's answer was lost ({stats:?})"
    );
    let requests = list_requests(&client, &ns).await?;
    let admitted: Vec<String> = requests
        .iter()
        .filter(|r| r.phase() != Phase::Pending && r.name_any() != names[0])
        .map(|r| format!("{}: {}", r.name_any(), describe(r)))
        .collect();
    ensure!(
        admitted.len() == 1,
        "maxParallelOperations is 1 and {} holds the slot, yet {} requests are past Pending: \
         {admitted:?}",
        next.name_any(),
        admitted.len()
    );
    monitor.check()?;

    proxy.clear().await?;
    let cluster = Cluster {
        testbed,
        client,
        ns,
        nodes,
    };
    release_everything(&cluster).await?;
    for node in &cluster.nodes {
        ensure!(
            !node_unschedulable(&cluster.client, node).await?,
            "node {node} is still cordoned after every request was released"
        );
    }
    let report = monitor.finish().await?;
    ensure!(
        report.admissions >= REQUESTS,
        "the monitor saw {} admissions for {REQUESTS} requests",
        report.admissions
    );
    Ok(())
}

/// A request that goes without our cleanup has its cordon undone all the same. Here the requestor
/// removes our finalizer from a Ready request by hand and deletes it at once, while the
/// operator's watches lag 1 s: the operator never sees the request deleting, only gone. (The API server can
/// do the same on its own: in e2e_nvidia, a DELETE that raced the admission went through after
/// the admission had added our finalizer.) The supervisor used to stop the request's actor, and
/// the node stayed cordoned; now the actor undoes the cordon first (`lifecycle::on_request_gone`)
/// and holds the node until it has.
#[tokio::test]
async fn a_request_gone_without_our_cleanup_has_its_cordon_undone() -> Result<()> {
    let _turn = large_scenario_turn().await;
    let faults = HttpFaults {
        watch_delay_ms: 1000,
        ..HttpFaults::default()
    };
    let cluster = behind_proxy("hand-removed", 1, limits(1, 1), &faults).await?;
    let (client, ns, node) = (&cluster.client, &cluster.ns, &cluster.nodes[0]);
    request_node(client, ns, "m", node, REQUESTOR).await?;
    wait_phase(client, ns, "m", Phase::Ready, SETUP).await?;
    ensure!(
        node_unschedulable(client, node).await?,
        "precondition: {node} is not cordoned while Ready"
    );
    // The finalizer first, then the deletion, which then goes through at once: the operator
    // never sees the request deleting.
    let no_finalizers = serde_json::json!({ "metadata": { "finalizers": null } });
    patch_request(client, ns, "m", no_finalizers).await?;
    delete_request(client, ns, "m").await?;
    ensure!(
        get_request(client, ns, "m").await?.is_none(),
        "precondition: the request is still there"
    );
    wait_for(
        &format!("{node} to be uncordoned after its request went"),
        Duration::from_secs(20),
        || async { Ok((!node_unschedulable(client, node).await?).then_some(())) },
    )
    .await?;
    cluster.monitor.finish().await?;
    Ok(())
}

/// A request deleted the moment its admission lands leaves its node schedulable. The node actor
/// starts from the version the admission wrote while the operator's cache, 1 s behind here, still
/// shows the request as created; the actor cordons (each node write takes 300 ms here, so the
/// deletion lands meanwhile), meets the deletion on a conflict, uncordons, takes its finalizer off
/// and finishes; then the cache shows the admission. The supervisor used
/// to start a new actor from that version, which cordoned the node again for a request about to
/// vanish, and nothing uncordoned it (found by e2e_nvidia's requestorID test in CI). Now an actor
/// that ended leaves the version it reached, and only a newer one starts another
/// (`actor_runs::next_action`). A watch of the test's own, without the lag, deletes each request
/// as soon as it shows our finalizer; then a last request on a node of its own, admitted only
/// once the operator's cache has seen every earlier event, goes Ready and is deleted, so any
/// actor started from a stale version has had its turn before the nodes are looked at.
#[tokio::test]
async fn a_request_deleted_as_soon_as_it_is_admitted_leaves_its_node_schedulable() -> Result<()> {
    const TARGETS: usize = 6;
    const ROUNDS: usize = 3;
    let _turn = large_scenario_turn().await;
    let faults = HttpFaults {
        watch_delay_ms: 1000,
        request_delay_ms: 300,
        only_method: "PATCH".to_string(),
        only_path_matching: "/nodemaintenances/[^/]+/status$".to_string(),
        ..HttpFaults::default()
    };
    let cluster = behind_proxy(
        "quick-delete",
        TARGETS + 1,
        limits(TARGETS as i32, TARGETS as i32),
        &faults,
    )
    .await?;
    let (client, ns, nodes) = (&cluster.client, &cluster.ns, &cluster.nodes);
    let (targets, last) = nodes.split_at(TARGETS);

    let deleted = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let deleter = {
        let api: Api<NodeMaintenance> = Api::namespaced(client.clone(), ns);
        let deleted = deleted.clone();
        tokio::spawn(async move {
            let stream = watcher(api.clone(), watcher::Config::default()).applied_objects();
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let Ok(request) = event else { continue };
                let admitted = request.finalizers().iter().any(|f| f == FINALIZER);
                if admitted
                    && request.metadata.deletion_timestamp.is_none()
                    && request.name_any().starts_with('r')
                    && api
                        .delete(&request.name_any(), &Default::default())
                        .await
                        .is_ok()
                    && let Ok(mut deleted) = deleted.lock()
                {
                    deleted.insert(request.name_any());
                }
            }
        })
    };
    for round in 0..ROUNDS {
        for (i, node) in targets.iter().enumerate() {
            request_node(client, ns, &format!("r{round}-{i}"), node, REQUESTOR).await?;
        }
        wait_for("every request of the round to be gone", SETUP, || async {
            Ok(list_requests(client, ns).await?.is_empty().then_some(()))
        })
        .await?;
    }
    deleter.abort();
    let deleted = deleted.lock().map_or(0, |d| d.len());
    ensure!(
        deleted == TARGETS * ROUNDS,
        "precondition: {deleted} of {} requests were deleted once admitted (the others went \
         before the operator admitted them)",
        TARGETS * ROUNDS
    );
    request_node(client, ns, "last", &last[0], REQUESTOR).await?;
    wait_phase(client, ns, "last", Phase::Ready, SETUP).await?;
    delete_request(client, ns, "last").await?;
    wait_for("the last request to be gone", SETUP, || async {
        Ok(list_requests(client, ns).await?.is_empty().then_some(()))
    })
    .await?;
    let mut cordoned = Vec::new();
    for node in nodes {
        if node_unschedulable(client, node).await? {
            cordoned.push(node.clone());
        }
    }
    ensure!(
        cordoned.is_empty(),
        "{cordoned:?} still cordoned once every request on them is gone"
    );
    let report = cluster.monitor.finish().await?;
    ensure!(
        report.admissions > TARGETS * ROUNDS,
        "the monitor saw {} admissions for {} requests",
        report.admissions,
        TARGETS * ROUNDS + 1
    );
    Ok(())
}
