//! What a requestor's watch sees of our writes. NVIDIA's requestor library (k8s-operator-libs
//! `pkg/upgrade/upgrade_requestor.go`, `ConditionChangedPredicate`) reconciles on every update of
//! a NodeMaintenance whose conditions differ, compared deeply (message and times included): each
//! such update wakes every requestor of the cluster. So the conditions change only with the
//! phase; the drain's progress lives in `status.drain`, never in a condition's message.
//!
//! The one exception is ours on purpose: a Pending request says why it waits, and the message
//! is rewritten when the cause changes, or at most once a minute when only its counts moved
//! (`core/src/explain.rs`). The test counts those separately and prints them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use maintenance_crds::{NodeMaintenance, Phase};
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(120);
const NODES: usize = 20;
const MAX_PARALLEL: i32 = 5;

/// What the predicate compares: the conditions, sorted by type.
fn conditions_of(request: &NodeMaintenance) -> String {
    let mut conditions = request
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    serde_json::to_string(&conditions).unwrap_or_default()
}

/// Per request: the updates whose conditions changed, split by what changed with them.
#[derive(Debug, Default, Clone, Copy)]
struct Fires {
    /// The phase changed: what a requestor must see.
    with_phase: u32,
    /// The phase stayed Pending and the message said why it waits, anew.
    pending_explained: u32,
    /// The phase stayed past Pending, and the conditions changed anyway: drain progress or
    /// another message in a condition.
    without_phase: u32,
    /// Updates of the object whose conditions did not change (the predicate drops them).
    quiet: u32,
}

fn watch_fires(client: Client, ns: &str) -> Arc<Mutex<BTreeMap<String, Fires>>> {
    let fires: Arc<Mutex<BTreeMap<String, Fires>>> = Arc::default();
    let seen = fires.clone();
    let api: Api<NodeMaintenance> = Api::namespaced(client, ns);
    tokio::spawn(async move {
        let mut last: BTreeMap<String, (Phase, String)> = BTreeMap::new();
        let stream = watcher(api, watcher::Config::default());
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let request = match event {
                Ok(watcher::Event::Apply(r) | watcher::Event::InitApply(r)) => r,
                _ => continue,
            };
            let (phase, conditions) = (request.phase(), conditions_of(&request));
            let previous = last.insert(request.name_any(), (phase, conditions.clone()));
            let Ok(mut fires) = seen.lock() else { return };
            let entry = fires.entry(request.name_any()).or_default();
            match previous {
                // Created: the requestor's own write.
                None => {}
                Some((_, before)) if before == conditions => entry.quiet += 1,
                Some((before, _)) if before != phase => entry.with_phase += 1,
                Some(_) if phase == Phase::Pending => entry.pending_explained += 1,
                Some(_) => entry.without_phase += 1,
            }
        }
    });
    fires
}

/// What a watch task recorded, at the end of the run.
fn what_the_watch_saw<T: Clone>(record: &Mutex<T>) -> Result<T> {
    Ok(record
        .lock()
        .map_err(|_| anyhow::anyhow!("the watch task panicked"))?
        .clone())
}

/// A rolling maintenance: each request of `ns` released as soon as it is Ready, so the rest go
/// on; returns once none is left.
async fn release_each_once_ready(client: &Client, ns: &str) -> Result<()> {
    let api: Api<NodeMaintenance> = Api::namespaced(client.clone(), ns);
    wait_for("every request to be Ready and released", WAIT, || async {
        let requests = api.list(&Default::default()).await?.items;
        for request in &requests {
            if request.phase() == Phase::Ready && request.metadata.deletion_timestamp.is_none() {
                delete_request(client, ns, &request.name_any()).await?;
            }
        }
        Ok(requests.is_empty().then_some(()))
    })
    .await
}

#[tokio::test]
async fn conditions_change_only_with_the_phase_so_requestors_wake_only_then() -> Result<()> {
    let (testbed, client, ns, nodes) =
        own_cluster("watch", NODES, Some(limits(MAX_PARALLEL, None))).await?;
    let _operator = Operator::start(&testbed, &[]).await?;
    // Pods on every node, so that each drain evicts and reports progress in status.drain.
    create_app_deployment(&client, &ns, "web", 40, &PodSpecOptions::default()).await?;
    wait_deployment_ready(&client, &ns, "web", WAIT).await?;
    let fires = watch_fires(client.clone(), &ns);

    let started = Instant::now();
    for (i, node) in nodes.iter().enumerate() {
        let mut spec = request_spec(node, "watch.example.com");
        spec.drain_spec = drain_spec(false, 0);
        create_request(&client, &ns, &format!("m-{i}"), spec).await?;
    }
    release_each_once_ready(&client, &ns).await?;
    let took = started.elapsed();

    let fires = what_the_watch_saw(&fires)?;
    ensure!(
        fires.len() == NODES,
        "the watch saw {} of {NODES} requests",
        fires.len()
    );
    let total = |f: fn(&Fires) -> u32| fires.values().map(f).sum::<u32>();
    let per_request = |n: u32| f64::from(n) / NODES as f64;
    println!(
        "{NODES} requests, maxParallelOperations={MAX_PARALLEL}, {:.1} s: condition changes per \
         request {:.2} with the phase, {:.2} explaining a wait, {:.2} otherwise; {:.2} updates \
         without a condition change",
        took.as_secs_f64(),
        per_request(total(|f| f.with_phase)),
        per_request(total(|f| f.pending_explained)),
        per_request(total(|f| f.without_phase)),
        per_request(total(|f| f.quiet)),
    );
    let noisy: Vec<_> = fires.iter().filter(|(_, f)| f.without_phase > 0).collect();
    ensure!(
        noisy.is_empty(),
        "conditions changed without a phase change past Pending: {noisy:?}"
    );
    ensure!(
        total(|f| f.quiet) > 0,
        "precondition: no update without a condition change (no drain progress written)"
    );
    Ok(())
}

/// When each request was first seen, first seen explained (Pending with a message) and first
/// seen admitted.
#[derive(Debug, Clone, Copy)]
struct Seen {
    created: Instant,
    explained: Option<Instant>,
    admitted: Option<Instant>,
}

fn watch_admissions(client: Client, ns: &str) -> Arc<Mutex<BTreeMap<String, Seen>>> {
    let seen: Arc<Mutex<BTreeMap<String, Seen>>> = Arc::default();
    let record = seen.clone();
    let api: Api<NodeMaintenance> = Api::namespaced(client, ns);
    tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default());
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let request = match event {
                Ok(watcher::Event::Apply(r) | watcher::Event::InitApply(r)) => r,
                _ => continue,
            };
            let Ok(mut record) = record.lock() else {
                return;
            };
            let now = Instant::now();
            let entry = record.entry(request.name_any()).or_insert(Seen {
                created: now,
                explained: None,
                admitted: None,
            });
            if pending_message(&request).is_some_and(|m| !m.is_empty()) {
                entry.explained.get_or_insert(now);
            }
            if request.phase() != Phase::Pending || request.admitted_by_us() {
                entry.admitted.get_or_insert(now);
            }
        }
    });
    seen
}

/// NVIDIA's requestor library creates the requests of every node that needs an upgrade at once
/// and leaves the throttling to the operator. Each of the requests created in one burst that
/// waits is explained while it waits (the Pending messages go out 64 a round), and they are
/// admitted in the order of the ranking (one requestor: creation time, then node name): no
/// request is admitted a round before one ranked ahead of it that already existed.
#[tokio::test]
async fn hundreds_of_requests_created_at_once_are_explained_and_admitted_in_order() -> Result<()> {
    // A hundred keeps the suite short (the nodes cost more than the requests); 200 at 20 in
    // parallel took 20.9 s from the burst to the last release, every waiting request explained.
    const BURST: usize = 100;
    const PARALLEL: i32 = 10;
    let (testbed, client, ns, nodes) =
        own_cluster("burst", BURST, Some(limits(PARALLEL, None))).await?;
    let _operator = Operator::start(&testbed, &[]).await?;
    let seen = watch_admissions(client.clone(), &ns);

    let started = Instant::now();
    for (i, node) in nodes.iter().enumerate() {
        create_request(
            &client,
            &ns,
            &format!("m-{i:03}"),
            request_spec(node, "burst.example.com"),
        )
        .await?;
    }
    let created = started.elapsed();
    let api: Api<NodeMaintenance> = Api::namespaced(client.clone(), &ns);
    // The ranking, from what the API server recorded.
    let mut ranked: Vec<(String, String, String)> = api
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(|r| {
            let created = r
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            (created, r.spec.node_name.clone(), r.name_any())
        })
        .collect();
    ranked.sort();
    release_each_once_ready(&client, &ns).await?;
    let took = started.elapsed();

    let seen = what_the_watch_saw(&seen)?;
    // Writes of one round land in any order: within a second counts as together.
    let together = Duration::from_secs(1);
    let mut entries = Vec::new();
    for (_, _, name) in &ranked {
        let Some(entry) = seen.get(name).copied() else {
            anyhow::bail!("the watch never saw {name}");
        };
        let Some(admitted) = entry.admitted else {
            anyhow::bail!("{name} was never seen admitted");
        };
        entries.push((name, entry, admitted));
    }
    let waited = |entry: &Seen, admitted: Instant| admitted > entry.created + 2 * together;
    let unexplained: Vec<&String> = entries
        .iter()
        .filter(|(_, entry, admitted)| waited(entry, *admitted) && entry.explained.is_none())
        .map(|(name, _, _)| *name)
        .collect();
    let latest_explanation = entries
        .iter()
        .filter_map(|(_, entry, _)| entry.explained.map(|at| at.duration_since(started)))
        .max()
        .unwrap_or_default();
    // A request ranked behind another is not admitted before it, once both exist.
    let mut inversions = Vec::new();
    for (i, (ahead, ahead_seen, ahead_at)) in entries.iter().enumerate() {
        for (behind, _, behind_at) in &entries[i + 1..] {
            if ahead_seen.created + together < *behind_at && *behind_at + together < *ahead_at {
                inversions.push(format!("{behind} before {ahead}"));
            }
        }
    }
    println!(
        "{BURST} requests created in {:.1} s, maxParallelOperations={PARALLEL}: all Ready and \
         released in {:.1} s; {} of them explained while waiting, the last {:.1} s after the \
         burst began; {} admitted out of order",
        created.as_secs_f64(),
        took.as_secs_f64(),
        entries
            .iter()
            .filter(|(_, s, _)| s.explained.is_some())
            .count(),
        latest_explanation.as_secs_f64(),
        inversions.len(),
    );
    ensure!(
        unexplained.is_empty(),
        "{} requests were admitted without ever saying why they waited: {unexplained:?}",
        unexplained.len()
    );
    ensure!(
        inversions.is_empty(),
        "admitted out of ranking order: {:?}",
        &inversions[..inversions.len().min(10)]
    );
    Ok(())
}
