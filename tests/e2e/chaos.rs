//! Chaos on a live control plane: the operator SIGKILLed at random moments of a rollout with
//! PodDisruptionBudgets, and the leader of two replicas killed again and again. Every request
//! completes, each is admitted once, no node is left cordoned, the limits and the budgets hold,
//! and (with two replicas) the API server's audit log never shows two of them writing at once.
//!
//! Sizes come from the environment; the defaults are the short variant that CI runs:
//! - `MO_CHAOS_NODES` (default 40): nodes in the rollout of the crash test;
//! - `MO_CHAOS_KILLS` (default 12): SIGKILLs during it;
//! - `MO_CHAOS_FAILOVERS` (default 3): leader kills during the two-replica rollout;
//! - `MO_CHAOS_SEED`: the seed of the random kill moments (printed by every run, for replay).
//!
//! `make soak` runs the long variant: 200 nodes, 100 kills, 10 failovers.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use maintenance_crds::{ADMITTED_TIME_ANNOTATION, NodeMaintenance, Phase};
use support::audit::{AuditLog, WriteCall};
use support::invariants::{MonitorReport, monitor_as};
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(120);
/// Label put on every node of one scenario, so the watchers see those nodes only.
const RUN_LABEL: &str = "chaos.maintenance.nvidia.com/run";
/// Nodes per pool: each pool runs one Deployment with a pod per node under one budget, which
/// lets one pod go at a time.
const POOL_SIZE: usize = 5;
const REQUESTOR: &str = "chaos.example.com";
const LEASE_SECONDS: &str = "4";

// ---------------------------------------------------------------------------------------------
// Settings and randomness

/// The seed of this run: `MO_CHAOS_SEED`, else drawn from the clock.
fn seed() -> Result<u64> {
    Ok(env_number("MO_CHAOS_SEED")?.unwrap_or(Timestamp::now().as_nanosecond() as u64))
}

// ---------------------------------------------------------------------------------------------
// The fleet: pools of nodes, a Deployment and a PodDisruptionBudget on each

struct Fleet {
    ns: String,
    nodes: Vec<String>,
    /// The value of [`RUN_LABEL`] on every node of the fleet.
    run: String,
    /// `(deployment, replicas)` per pool; its budget has the same name.
    apps: Vec<(String, usize)>,
    /// maxParallelOperations and maxUnavailable of the config.
    limits: (usize, usize),
}

/// `count` Ready nodes in pools of [`POOL_SIZE`], each pool with a Deployment of one pod per node
/// and a budget that allows one disruption at a time (the three kinds of the scale tests).
async fn fleet(
    client: &Client,
    prefix: &str,
    count: usize,
    limits: (usize, usize),
) -> Result<Fleet> {
    ensure!(
        count >= 2,
        "a rollout needs at least 2 nodes, asked for {count}"
    );
    let ns = unique_name(prefix);
    create_namespace(client, &ns).await?;
    let run = unique_name(prefix);
    let pools = count.div_ceil(POOL_SIZE);
    let mut by_pool = Vec::new();
    let mut apps = Vec::new();
    for pool in 0..pools {
        let size = count / pools + usize::from(pool < count % pools);
        let pool_prefix = unique_name(&format!("{prefix}-p{pool}"));
        let pool_nodes = create_nodes(client, &pool_prefix, size, &[(RUN_LABEL, &run)]).await?;
        let app = format!("app-{pool}");
        let labels = [("app", app.as_str())];
        let pods = PodSpecOptions::on_nodes_with_prefix(&pool_prefix);
        create_deployment(client, &ns, &app, size as i32, &labels, &pods).await?;
        create_pdb_of_kind(client, &ns, &app, &labels, pool, size as i32).await?;
        by_pool.push(pool_nodes);
        apps.push((app, size));
    }
    // The operator admits requests created in the same second in node-name order: pool by pool,
    // so that several drains of a wave wait on one budget while the kills land.
    let nodes: Vec<String> = by_pool.into_iter().flatten().collect();
    wait_nodes_ready(
        client,
        &nodes,
        WAIT + Duration::from_millis(300 * count as u64),
    )
    .await?;
    for (app, size) in &apps {
        wait_pods_ready(client, &ns, &format!("app={app}"), *size, WAIT).await?;
        // Precondition: every drain must meet a budget that lets one pod go at a time.
        wait_pdb_disruptions_allowed(client, &ns, app, 1, WAIT)
            .await
            .with_context(|| format!("precondition: the budget of {app} must allow 1"))?;
    }
    Ok(Fleet {
        ns,
        nodes,
        run,
        apps,
        limits,
    })
}

/// One request per node, each draining its node.
async fn request_every_node(client: &Client, fleet: &Fleet) -> Result<()> {
    let creates = fleet.nodes.iter().enumerate().map(|(i, node)| async move {
        let mut spec = request_spec(node, REQUESTOR);
        spec.drain_spec = drain_spec(true, 0);
        create_request(client, &fleet.ns, &format!("m{i}"), spec).await
    });
    futures::stream::iter(creates)
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    Ok(())
}

/// Plays the requestor in the background: releases (deletes) each request once it is Ready,
/// whether or not an operator runs at that moment. Abort it when done.
fn requestor(client: Client, ns: String) -> tokio::task::JoinHandle<()> {
    requestor_holding(client, ns, None)
}

/// The requestor, keeping the last `hold.1` requests unreleased while `hold.0` is above zero:
/// the kills still to come then land on a rollout in progress however fast the operator gets
/// (a 40-node rollout once ended in 10 s, before half the kills).
fn requestor_holding(
    client: Client,
    ns: String,
    hold: Option<(Arc<AtomicUsize>, usize)>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Ok(all) = list_requests(&client, &ns).await {
                let mut unreleased = all.iter().filter(|r| !r.is_deleting()).count();
                for r in all {
                    if r.phase() == Phase::Ready && !r.is_deleting() {
                        let holding = hold.as_ref().is_some_and(|(left, keep)| {
                            left.load(Ordering::SeqCst) > 0 && unreleased <= *keep
                        });
                        if holding {
                            break;
                        }
                        // A failure (e.g. already gone) is retried on the next round.
                        if delete_request(&client, &ns, &r.name_any()).await.is_ok() {
                            unreleased -= 1;
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}

async fn remaining_requests(client: &Client, ns: &str) -> Result<Vec<NodeMaintenance>> {
    list_requests(client, ns).await
}

// ---------------------------------------------------------------------------------------------
// What the watchers saw

/// The requests and nodes of a scenario as a watch on the API server showed them.
#[derive(Default)]
struct Observed {
    /// Each request's phases in the order seen, consecutive repeats merged.
    phases: BTreeMap<String, Vec<Phase>>,
    /// Each request's admitted-time annotation values seen while it was past Pending: one per
    /// admission.
    admissions: BTreeMap<String, BTreeSet<String>>,
    /// The current phase of every live request, by name, with its node.
    live: BTreeMap<String, (String, Phase)>,
    /// The most nodes past Pending at once.
    max_in_maintenance: usize,
    /// Two requests past Pending on one node at the same time.
    doubled_nodes: BTreeSet<String>,
    /// Nodes of the fleet cordoned now, and the most at once.
    cordoned: BTreeSet<String>,
    max_cordoned: usize,
}

impl Observed {
    fn apply_request(&mut self, r: &NodeMaintenance) -> bool {
        let name = r.name_any();
        let phase = r.phase();
        let history = self.phases.entry(name.clone()).or_default();
        let changed = history.last() != Some(&phase);
        if changed {
            history.push(phase);
        }
        if phase != Phase::Pending
            && let Some(at) = r.annotations().get(ADMITTED_TIME_ANNOTATION)
        {
            self.admissions
                .entry(name.clone())
                .or_default()
                .insert(at.clone());
        }
        self.live.insert(name, (r.spec.node_name.clone(), phase));
        self.recount();
        changed
    }

    fn delete_request(&mut self, r: &NodeMaintenance) {
        self.live.remove(&r.name_any());
        self.recount();
    }

    fn recount(&mut self) {
        let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
        for (node, phase) in self.live.values() {
            if *phase != Phase::Pending {
                *per_node.entry(node).or_default() += 1;
            }
        }
        self.max_in_maintenance = self.max_in_maintenance.max(per_node.len());
        for (node, n) in per_node {
            if n > 1 {
                self.doubled_nodes.insert(node.to_string());
            }
        }
    }

    fn apply_node(&mut self, node: &Node) {
        let cordoned = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        if cordoned {
            self.cordoned.insert(node.name_any());
        } else {
            self.cordoned.remove(&node.name_any());
        }
        self.max_cordoned = self.max_cordoned.max(self.cordoned.len());
    }

    /// How many live requests are in each phase now: where a kill landed.
    fn phases_now(&self) -> BTreeMap<Phase, usize> {
        let mut counts = BTreeMap::new();
        for (_, phase) in self.live.values() {
            *counts.entry(*phase).or_default() += 1;
        }
        counts
    }

    /// Requests whose phase went backwards, or that were admitted more than once.
    fn breaches(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (name, history) in &self.phases {
            if history.windows(2).any(|w| w[1] < w[0]) {
                found.push(format!("{name}: phases went backwards: {history:?}"));
            }
        }
        for (name, values) in &self.admissions {
            if values.len() > 1 {
                found.push(format!(
                    "{name}: admitted {} times: {values:?}",
                    values.len()
                ));
            }
        }
        for node in &self.doubled_nodes {
            found.push(format!("{node}: two requests in progress at once"));
        }
        found
    }
}

/// Watches the requests of `ns` and the nodes labelled `run`; `phase_changes` counts every phase
/// change seen. Abort the tasks when done.
struct Watch {
    observed: Arc<Mutex<Observed>>,
    phase_changes: tokio::sync::watch::Receiver<u64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Watch {
    fn start(client: &Client, fleet: &Fleet) -> Watch {
        let observed = Arc::new(Mutex::new(Observed::default()));
        let (changes_tx, phase_changes) = tokio::sync::watch::channel(0u64);
        let requests: Api<NodeMaintenance> = Api::namespaced(client.clone(), &fleet.ns);
        let seen = observed.clone();
        let request_task = tokio::spawn(async move {
            let stream = watcher(requests, watcher::Config::default());
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                let mut changed = false;
                {
                    let Ok(mut seen) = seen.lock() else { return };
                    match event {
                        watcher::Event::Apply(r) | watcher::Event::InitApply(r) => {
                            changed = seen.apply_request(&r);
                        }
                        watcher::Event::Delete(r) => seen.delete_request(&r),
                        watcher::Event::Init | watcher::Event::InitDone => {}
                    }
                }
                if changed {
                    changes_tx.send_modify(|n| *n += 1);
                }
            }
        });
        let nodes: Api<Node> = Api::all(client.clone());
        let selector = format!("{RUN_LABEL}={}", fleet.run);
        let seen = observed.clone();
        let node_task = tokio::spawn(async move {
            let stream = watcher(nodes, watcher::Config::default().labels(&selector));
            futures::pin_mut!(stream);
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                let Ok(mut seen) = seen.lock() else { return };
                if let watcher::Event::Apply(n) | watcher::Event::InitApply(n) = event {
                    seen.apply_node(&n);
                }
            }
        });
        Watch {
            observed,
            phase_changes,
            tasks: vec![request_task, node_task],
        }
    }

    fn with<T>(&self, f: impl FnOnce(&Observed) -> T) -> Result<T> {
        let seen = self
            .observed
            .lock()
            .map_err(|_| anyhow::anyhow!("a watcher task panicked"))?;
        Ok(f(&seen))
    }

    fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// End checks shared by both scenarios

/// After the rollout: every request gone, every node uncordoned, each request admitted once, the
/// limits held (as the watchers saw them), no budget went below its desired healthy pods and no
/// pod was deleted instead of evicted (as the audit log shows).
async fn check_outcome(
    testbed: &Testbed,
    client: &Client,
    fleet: &Fleet,
    watch: &Watch,
    rollout_start: Timestamp,
    operator_users: &[String],
) -> Result<()> {
    let (max_parallel, max_unavailable) = fleet.limits;
    let left = remaining_requests(client, &fleet.ns).await?;
    ensure!(
        left.is_empty(),
        "{} requests left: {:?}",
        left.len(),
        left.iter()
            .map(|r| format!("{}: {}", r.name_any(), describe(r)))
            .collect::<Vec<_>>()
    );
    let mut cordoned = Vec::new();
    for node in &fleet.nodes {
        if node_unschedulable(client, node).await? {
            cordoned.push(node.clone());
        }
    }
    ensure!(cordoned.is_empty(), "nodes left cordoned: {cordoned:?}");

    let (breaches, phases, max_in, max_cordoned) = watch.with(|o| {
        (
            o.breaches(),
            o.phases.len(),
            o.max_in_maintenance,
            o.max_cordoned,
        )
    })?;
    ensure!(
        phases == fleet.nodes.len(),
        "the watch saw {phases} of {} requests: it cannot vouch for the others",
        fleet.nodes.len()
    );
    ensure!(breaches.is_empty(), "breaches: {breaches:#?}");
    ensure!(
        max_in <= max_parallel,
        "{max_in} nodes in maintenance at once with maxParallelOperations={max_parallel}"
    );
    ensure!(
        max_cordoned <= max_unavailable,
        "{max_cordoned} nodes cordoned at once with maxUnavailable={max_unavailable}"
    );

    let audit = AuditLog::read(testbed)?.in_namespace(&fleet.ns);
    let deleted: Vec<String> = audit
        .pod_deletions
        .iter()
        .filter(|d| operator_users.contains(&d.user))
        .map(|d| format!("{} {}/{} by {}", d.received, d.namespace, d.pod, d.user))
        .collect();
    ensure!(
        deleted.is_empty(),
        "pods deleted instead of evicted: {deleted:?}"
    );
    let evicted = audit
        .evictions
        .iter()
        .filter(|e| operator_users.contains(&e.user) && e.code == 201)
        .count();
    ensure!(
        evicted >= fleet.nodes.len() / 2,
        "the audit log shows only {evicted} evictions by the operator for {} drained nodes with \
         a pod each: is it logging them?",
        fleet.nodes.len()
    );
    for (app, _) in &fleet.apps {
        for w in audit.pdb_history(&fleet.ns, app) {
            if w.received < rollout_start {
                continue;
            }
            if let (Some(current), Some(desired)) = (w.current_healthy, w.desired_healthy) {
                ensure!(
                    current >= desired,
                    "budget {app} went below its desired healthy pods at {}: {current} < {desired}",
                    w.received
                );
            }
        }
    }
    Ok(())
}

/// The end checks and the invariant monitor's verdict together: every breach either found.
fn verdict(checked: Result<()>, monitored: Result<MonitorReport>) -> Result<()> {
    match (checked, monitored) {
        (Ok(()), Ok(report)) => {
            println!("{report}");
            Ok(())
        }
        (Err(e), Ok(report)) => Err(e.context(format!("(the invariant monitor: {report})"))),
        (Ok(()), Err(e)) => Err(e.context("the invariant monitor found breaches")),
        (Err(checked), Err(monitored)) => bail!(
            "end checks: {checked:#}\nand the invariant monitor found breaches: {monitored:#}"
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// 100 crashes

/// When a kill lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum KillMoment {
    /// After a random delay drawn over the expected rest of the rollout.
    Random,
    /// As soon as a request's phase changed (the operator is likely mid-step).
    AfterPhaseChange,
}

/// A control plane of its own with these limits, the fleet of `node_count` nodes, and the watch
/// of its requests and nodes.
async fn chaos_cluster(
    prefix: &str,
    node_count: usize,
    (max_parallel, max_unavailable): (usize, usize),
) -> Result<(Testbed, Client, Fleet, Watch)> {
    let config = limits(max_parallel as i32, max_unavailable as i32);
    let (testbed, client) = own_testbed(Some(config)).await?;
    let fleet = fleet(&client, prefix, node_count, (max_parallel, max_unavailable)).await?;
    let watch = Watch::start(&client, &fleet);
    Ok((testbed, client, fleet, watch))
}

#[tokio::test]
async fn crashes_at_random_moments_lose_nothing() -> Result<()> {
    let _turn = large_scenario_turn().await;
    let node_count = env_usize("MO_CHAOS_NODES", 40)?;
    let kill_count = env_usize("MO_CHAOS_KILLS", 12)?;
    let seed = seed()?;
    println!(
        "crashes: {node_count} nodes, {kill_count} kills, seed {seed} (MO_CHAOS_SEED={seed} \
         replays the kill moments)"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let max_parallel = (node_count / 8).clamp(2, 10);
    let max_unavailable = max_parallel;

    let test_start = Instant::now();
    let bounds = (max_parallel, max_unavailable);
    let (testbed, client, fleet, watch) = chaos_cluster("crash", node_count, bounds).await?;
    let operator_user = service_account_user("chaos-operator");
    let monitor = monitor_as(&testbed, &fleet.ns, &fleet.nodes, "chaos-operator").await?;
    let mut operator = Operator::start_as(&testbed, "chaos-operator", &[]).await?;
    println!(
        "setup {:.1}s; rollout of {node_count} nodes, maxParallelOperations={max_parallel}, \
         maxUnavailable={max_unavailable}",
        test_start.elapsed().as_secs_f64()
    );

    let rollout_start = Timestamp::now();
    let started = Instant::now();
    request_every_node(&client, &fleet).await?;
    let kills_left = Arc::new(AtomicUsize::new(kill_count));
    let releases = requestor_holding(
        client.clone(),
        fleet.ns.clone(),
        Some((kills_left.clone(), max_parallel)),
    );
    let mut phase_changes = watch.phase_changes.clone();
    let mut kills: Vec<(KillMoment, BTreeMap<Phase, usize>)> = Vec::new();
    while kills.len() < kill_count {
        let remaining = remaining_requests(&client, &fleet.ns).await?.len();
        if remaining == 0 {
            break;
        }
        // Spread the kills over the expected rest of the rollout, from its pace so far (a guess
        // of 3 s per wave of maxParallelOperations nodes before anything finished), aiming to
        // be done with them at 60% of it so that they all land before the end.
        let done = node_count - remaining;
        let per_request = if done == 0 {
            3.0 / max_parallel as f64
        } else {
            started.elapsed().as_secs_f64() / done as f64
        };
        let mean_gap = (per_request * remaining as f64 * 0.6 / (kill_count - kills.len()) as f64)
            .clamp(0.2, 20.0);
        let moment = if rng.random_bool(1.0 / 3.0) {
            KillMoment::AfterPhaseChange
        } else {
            KillMoment::Random
        };
        let delay = Duration::from_secs_f64(2.0 * mean_gap * rng.random::<f64>());
        match moment {
            KillMoment::Random => tokio::time::sleep(delay).await,
            KillMoment::AfterPhaseChange => {
                drop(phase_changes.borrow_and_update());
                // No change in time (e.g. everything waits on a budget): kill anyway.
                let _ =
                    tokio::time::timeout(delay + Duration::from_secs(5), phase_changes.changed())
                        .await;
            }
        }
        let phases = watch.with(Observed::phases_now)?;
        if phases.is_empty() {
            break;
        }
        operator.kill();
        kills.push((moment, phases));
        kills_left.store(kill_count - kills.len(), Ordering::SeqCst);
        // Sometimes stay down a moment: the requestor keeps releasing meanwhile.
        if rng.random_bool(0.3) {
            tokio::time::sleep(Duration::from_secs_f64(rng.random::<f64>())).await;
        }
        operator
            .restart()
            .await
            .with_context(|| format!("restart after kill {} (seed {seed})", kills.len()))?;
    }
    let kill_phase = |k: &BTreeMap<Phase, usize>| {
        k.iter()
            .filter(|(p, _)| **p != Phase::Pending)
            .map(|(p, n)| format!("{p}:{n}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let after_change = kills
        .iter()
        .filter(|(m, _)| *m == KillMoment::AfterPhaseChange)
        .count();
    println!(
        "{} kills in {:.1}s ({after_change} right after a phase change); requests past Pending at \
         each kill: {}",
        kills.len(),
        started.elapsed().as_secs_f64(),
        kills
            .iter()
            .map(|(_, k)| format!("[{}]", kill_phase(k)))
            .collect::<Vec<_>>()
            .join(" ")
    );
    ensure!(
        kills.len() == kill_count,
        "the rollout finished after only {} of {kill_count} kills (seed {seed}): the kills must \
         land while requests are in progress",
        kills.len()
    );

    // Past the kills, the rollout may still wait two minutes on a budget: a kill during an
    // eviction call can leave the pod charged to its budget (the API server writes the budget
    // before it deletes the pod) but not deleted, and the disruption controller forgets such a
    // pod only after 2 minutes (upstream behaviour, not the operator's).
    let finish = WAIT + Duration::from_secs(2 * node_count as u64);
    let outcome = wait_until(
        "every request to finish and be released",
        finish,
        || async {
            let left = remaining_requests(&client, &fleet.ns).await?;
            if left.is_empty() {
                return Ok(Check::Done(()));
            }
            Ok(Check::Pending(format!(
                "{} left, e.g. {}",
                left.len(),
                left.iter()
                    .take(3)
                    .map(|r| format!("{}: {}", r.name_any(), describe(r)))
                    .collect::<Vec<_>>()
                    .join(" | ")
            )))
        },
    )
    .await;
    releases.abort();
    outcome.with_context(|| format!("seed {seed}, operator log {}", operator.log.display()))?;
    println!(
        "rollout of {node_count} nodes with {} kills done in {:.1}s (test {:.1}s)",
        kills.len(),
        started.elapsed().as_secs_f64(),
        test_start.elapsed().as_secs_f64()
    );
    let users = [operator_user];
    let checked = check_outcome(&testbed, &client, &fleet, &watch, rollout_start, &users).await;
    watch.stop();
    verdict(checked, monitor.finish().await)
        .with_context(|| format!("seed {seed}, operator log {}", operator.log.display()))
}

// ---------------------------------------------------------------------------------------------
// Leader failovers

/// The writes of the replicas (by user) must come in turns: whenever another replica starts
/// writing, the one that wrote before had been killed by then. Returns the turns, in order.
fn leadership_turns(
    writes: &[&WriteCall],
    kills: &[(String, Timestamp)],
) -> Result<Vec<(String, usize)>> {
    let mut turns: Vec<(String, usize)> = Vec::new();
    for (i, w) in writes.iter().enumerate() {
        match turns.last_mut() {
            Some((user, n)) if *user == w.user => *n += 1,
            Some((user, _)) => {
                let previous_killed = kills
                    .iter()
                    .any(|(killed, at)| killed == user && *at <= w.received);
                if !previous_killed {
                    let around: Vec<String> = writes
                        [i.saturating_sub(5)..(i + 5).min(writes.len())]
                        .iter()
                        .map(|w| format!("{} by {}", w.describe(), w.user))
                        .collect();
                    bail!(
                        "{} wrote while {user} led and was still alive (no kill of it before \
                         {}): two replicas acting at once. Writes around it:\n{}",
                        w.user,
                        w.received,
                        around.join("\n")
                    );
                }
                turns.push((w.user.clone(), 1));
            }
            None => turns.push((w.user.clone(), 1)),
        }
    }
    Ok(turns)
}

#[tokio::test]
async fn leader_failovers_during_a_rollout() -> Result<()> {
    let _turn = large_scenario_turn().await;
    let failovers = env_usize("MO_CHAOS_FAILOVERS", 3)?;
    let node_count = 6 * (failovers + 1);
    let (max_parallel, max_unavailable) = (3, 3);
    let test_start = Instant::now();
    let bounds = (max_parallel, max_unavailable);
    let (testbed, client, fleet, watch) = chaos_cluster("failover", node_count, bounds).await?;
    // The monitor's audit check follows one identity; the checks below cover both.
    let monitor = monitor_as(&testbed, &fleet.ns, &fleet.nodes, "replica-a").await?;
    let names = ["replica-a", "replica-b"];
    let first =
        Operator::start_as(&testbed, names[0], &replica_args(names[0], LEASE_SECONDS)).await?;
    wait_holder(&client, names[0], WAIT).await?;
    let second =
        Operator::start_as(&testbed, names[1], &replica_args(names[1], LEASE_SECONDS)).await?;
    let mut replicas = [first, second];
    println!(
        "failovers: {failovers} during a rollout of {node_count} nodes; setup {:.1}s",
        test_start.elapsed().as_secs_f64()
    );

    let rollout_start = Timestamp::now();
    let started = Instant::now();
    request_every_node(&client, &fleet).await?;
    let releases = requestor(client.clone(), fleet.ns.clone());
    let mut kills: Vec<(String, Timestamp)> = Vec::new();
    // Run to the end even on a failure, so that the audit log is read either way: two replicas
    // acting at once often shows first as a takeover that never comes.
    let rollout: Result<()> = async {
        let mut leader = 0;
        for round in 0..failovers {
            // The leader must have moved the rollout on before it dies (so each turn has writes).
            let mut changes = watch.phase_changes.clone();
            let since = *changes.borrow_and_update();
            wait_for(
                &format!("3 phase changes under {} (failover {round})", names[leader]),
                WAIT,
                || {
                    let now = *changes.borrow();
                    async move { Ok((now >= since + 3).then_some(())) }
                },
            )
            .await?;
            ensure!(
                !remaining_requests(&client, &fleet.ns).await?.is_empty(),
                "the rollout finished after {round} of {failovers} failovers"
            );
            replicas[leader].kill();
            kills.push((service_account_user(names[leader]), Timestamp::now()));
            let standby = 1 - leader;
            let killed = Instant::now();
            wait_holder(&client, names[standby], WAIT).await?;
            println!(
                "failover {}: {} took over {:.1}s after {} was killed",
                round + 1,
                names[standby],
                killed.elapsed().as_secs_f64(),
                names[leader]
            );
            replicas[leader]
                .restart()
                .await
                .with_context(|| format!("restarting {} as a follower", names[leader]))?;
            leader = standby;
        }
        release_all_when_ready(&client, &fleet.ns, WAIT + Duration::from_secs(60)).await
    }
    .await;
    releases.abort();
    println!(
        "rollout with {failovers} failovers over after {:.1}s (test {:.1}s)",
        started.elapsed().as_secs_f64(),
        test_start.elapsed().as_secs_f64()
    );

    let users: Vec<String> = names.iter().map(|n| service_account_user(n)).collect();
    let audit = AuditLog::read(&testbed)?;
    let mut writes: Vec<&WriteCall> = audit
        .writes
        .iter()
        .filter(|w| users.contains(&w.user) && w.received >= rollout_start)
        .collect();
    writes.sort_by_key(|w| w.received);
    for user in &users {
        ensure!(
            writes
                .iter()
                .any(|w| &w.user == user && w.resource == "nodemaintenances"),
            "the audit log holds no NodeMaintenance write by {user}, which led part of the \
             rollout: is tests/testbed/audit-policy.yaml logging the operator's writes?"
        );
    }
    let turns = match (leadership_turns(&writes, &kills), rollout) {
        (Ok(turns), Ok(())) => turns,
        (Err(split), Ok(())) => return Err(split),
        (Err(split), Err(rollout)) => bail!("{split:#}\n(and the rollout failed: {rollout:#})"),
        (Ok(_), Err(rollout)) => return Err(rollout),
    };
    println!(
        "leadership turns from the audit log: {}",
        turns
            .iter()
            .map(|(u, n)| format!("{} ({n} writes)", u.rsplit(':').next().unwrap_or(u)))
            .collect::<Vec<_>>()
            .join(" -> ")
    );
    ensure!(
        turns.len() == failovers + 1,
        "{} turns of writes for {failovers} failovers: {turns:?}",
        turns.len()
    );
    let checked = check_outcome(&testbed, &client, &fleet, &watch, rollout_start, &users).await;
    watch.stop();
    verdict(checked, monitor.finish().await)
}
