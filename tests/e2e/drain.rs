//! The drain engine on a live control plane: PodDisruptionBudgets that block and unblock a drain
//! (a rollout in progress, a single replica until the timeout, a pod under two budgets), the pod
//! selection of `kubectl drain` (DaemonSet, mirror, emptyDir, bare pods, podSelector,
//! podEvictionFilters, `force` turned on mid-drain), the global eviction rate limit as the API
//! server saw it, 20 nodes x 30 pods drained in parallel under watch for PDB and
//! maxUnavailable violations, and the pod watches of 40 nodes sharing one HTTP/2 connection.
//!
//! Eviction calls are counted and timed from the API server's audit log (`support::audit`), not
//! from the operator's own account.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, PodReadinessGate, PodSpec, ResourceRequirements};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use maintenance_crds::{
    BlockedPod, DrainSpec, DrainStatus, MaintenanceOperatorConfigSpec, NodeMaintenance, Phase,
    PodEvictionFilterEntry,
};
use support::audit::{AuditLog, EvictionCall, seconds_between};
use support::invariants::*;
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(90);
/// Node label that decides where the pods of a test may go (value: the test's namespace).
const POOL: &str = "drain-test.example.com/pool";
/// Readiness gate of the rollout test: the test plays the component that sets it.
const READINESS_GATE: &str = "example.com/ready";

// ---------------------------------------------------------------------------------------------
// Helpers

fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// A Deployment whose pods are labelled `app=<name>` and go to nodes labelled `POOL=<pool>`;
/// `customize` edits the pod spec.
fn deployment(
    ns: &str,
    name: &str,
    replicas: i32,
    pool: &str,
    customize: impl FnOnce(&mut PodSpec),
) -> Deployment {
    let on_pool = PodSpecOptions::on_nodes_labelled(POOL, pool);
    let mut deployment = deployment_object(ns, name, replicas, &[("app", name)], &on_pool);
    if let Some(spec) = deployment.spec.template.spec.as_mut() {
        customize(spec);
    }
    deployment
}

async fn create(client: &Client, deployment: &Deployment) -> Result<()> {
    create_object(client, deployment).await?;
    Ok(())
}

async fn scale(client: &Client, ns: &str, name: &str, replicas: i32) -> Result<()> {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}})),
        )
        .await
        .with_context(|| format!("scaling deployment {ns}/{name}"))?;
    Ok(())
}

/// Plays the kubelet of a pod with a readiness gate: the gate's condition and Ready follow
/// `ready`. (KWOK's pod-ready stage only handles Pending pods, so it does not undo this.)
async fn set_pod_ready(client: &Client, ns: &str, pod: &str, ready: bool) -> Result<()> {
    let status = if ready { "True" } else { "False" };
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(
            pod,
            &PatchParams::default(),
            &Patch::Strategic(serde_json::json!({"status": {"conditions": [
                {"type": READINESS_GATE, "status": status},
                {"type": "Ready", "status": status},
            ]}})),
        )
        .await
        .with_context(|| format!("setting Ready={status} on pod {ns}/{pod}"))?;
    Ok(())
}

async fn patch_drain_spec(
    client: &Client,
    ns: &str,
    name: &str,
    drain: serde_json::Value,
) -> Result<()> {
    patch_request(
        client,
        ns,
        name,
        serde_json::json!({"spec": {"drainSpec": drain}}),
    )
    .await?;
    Ok(())
}

fn drain(request: &NodeMaintenance) -> DrainStatus {
    request
        .status
        .as_ref()
        .and_then(|s| s.drain.clone())
        .unwrap_or_default()
}

fn blocked<'a>(request: &'a NodeMaintenance, pod_key: &str) -> Option<&'a BlockedPod> {
    request
        .status
        .as_ref()?
        .drain
        .as_ref()?
        .blocked
        .iter()
        .find(|b| b.pod == pod_key)
}

/// `status.drain` of a finished drain: `totalPods` are the pods on the node when the drain started
/// and `evictionPods` those it had to remove, including pods that were evicted and gone before
/// the operator's first (throttled) status write.
fn assert_drain_counts(d: &DrainStatus, total_pods: i32, eviction_pods: i32) {
    assert_eq!(
        (d.total_pods, d.eviction_pods, d.drain_progress),
        (total_pods, eviction_pods, 100),
        "status.drain (totalPods, evictionPods, drainProgress): {d:?}"
    );
}

/// The value of the sample of metric `name` whose labels include all of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(series, _)| {
            series
                .strip_prefix(name)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('{'))
                && labels
                    .iter()
                    .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|(_, value)| value.parse().ok())
}

/// The most of `times` (sorted) in any 1-second window [t, t + 1s); windows that start at one of
/// the times are enough, since moving a window's start up to the next time loses nothing.
fn busiest_second(times: &[Timestamp]) -> usize {
    times
        .iter()
        .enumerate()
        .map(|(i, start)| {
            times[i..]
                .iter()
                .take_while(|t| seconds_between(*start, **t) < 1.0)
                .count()
        })
        .max()
        .unwrap_or(0)
}

fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    (n > 0).then(|| {
        if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        }
    })
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted.get(rank.min(sorted.len() - 1)).copied()
}

// ---------------------------------------------------------------------------------------------
// PodDisruptionBudgets

/// The rolling-update story: two replicas behind `minAvailable: 1`, the new one not Ready yet.
/// Draining the node of the Ready one must wait (the status says which PDB), and finish by itself
/// when the other replica becomes Ready, without anyone touching the request.
#[tokio::test]
async fn a_rollout_in_progress_holds_the_drain_until_the_new_replica_is_ready() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("rollout", 3).await?;
    let target = &nodes[0];
    set_node_label(&client, target, POOL, Some(&ns)).await?;
    let web = deployment(&ns, "web", 1, &ns, |spec| {
        spec.readiness_gates = Some(vec![PodReadinessGate {
            condition_type: READINESS_GATE.into(),
        }]);
    });
    create(&client, &web).await?;
    wait_pods_ready(&client, &ns, "app=web", 1, WAIT).await?;
    // The second replica goes elsewhere: only the other nodes carry the label now (a label, not a
    // template change: no rollout of the Deployment).
    set_node_label(&client, target, POOL, None).await?;
    for node in &nodes[1..] {
        set_node_label(&client, node, POOL, Some(&ns)).await?;
    }
    scale(&client, &ns, "web", 2).await?;
    let pods = wait_pods_ready(&client, &ns, "app=web", 2, WAIT).await?;
    let serving = pods
        .iter()
        .find(|p| pod_node(p) == Some(target.as_str()))
        .context("a replica on the target node")?
        .clone();
    let rolling = pods
        .iter()
        .find(|p| pod_node(p) != Some(target.as_str()))
        .context("a replica on another node")?
        .name_any();
    // The rollout is in progress: the new replica is not Ready yet.
    set_pod_ready(&client, &ns, &rolling, false).await?;
    create_app_pdb(&client, &ns, "web", 1).await?;
    wait_pdb_disruptions_allowed(&client, &ns, "web", 0, WAIT).await?;

    let mut spec = request_spec(target, "rollout.example.com");
    spec.drain_spec = drain_spec(false, 0);
    create_request(&client, &ns, "maint", spec).await?;
    let key = format!("{ns}/{}", serving.name_any());
    let waiting = wait_request(
        &client,
        &ns,
        "maint",
        "the drain to report the PDB that blocks it",
        WAIT,
        |r| {
            r.phase() == Phase::Draining
                && blocked(r, &key).is_some_and(|b| b.reason == "PDB" && b.message.contains("web"))
        },
    )
    .await?;
    assert_eq!(drain(&waiting).wait_for_eviction, vec![key.clone()]);
    // It keeps waiting without asking: the per-budget gate holds the eviction back while the
    // budget allows no disruption, and says so.
    let operator = &shared_cluster().await?.operator;
    let held_before = operator
        .metric("maintenance_operator_evictions_held_total")
        .await?;
    wait_request(
        &client,
        &ns,
        "maint",
        "the drain to say the gate holds the eviction without a call",
        WAIT,
        |r| blocked(r, &key).is_some_and(|b| b.message.contains("no call was made")),
    )
    .await?;
    wait_for("the gate to hold the eviction again", WAIT, || async {
        let held = operator
            .metric("maintenance_operator_evictions_held_total")
            .await?;
        Ok((held >= held_before + 3.0).then_some(()))
    })
    .await?;
    let testbed = shared_cluster().await?.testbed;
    let calls: Vec<EvictionCall> = AuditLog::read(testbed)?
        .evictions_of(&ns, &serving.name_any())
        .into_iter()
        .cloned()
        .collect();
    // At most one: the gate's PDB cache may not have seen the brand-new budget at the first try.
    assert!(
        calls.len() <= 1 && calls.iter().all(|c| c.code == 429),
        "eviction calls while the PDB allows no disruption, as the API server saw them: {calls:?}"
    );
    let pod = Api::<Pod>::namespaced(client.clone(), &ns)
        .get(&serving.name_any())
        .await?;
    assert_eq!(
        uid(&pod),
        uid(&serving),
        "the serving replica is still there"
    );
    assert!(pod.metadata.deletion_timestamp.is_none());
    assert_eq!(
        get_request(&client, &ns, "maint")
            .await?
            .context("request")?
            .phase(),
        Phase::Draining
    );
    let metrics = shared_cluster().await?.operator.metrics().await?;
    assert_eq!(
        sample(
            &metrics,
            "maintenance_operator_pods_blocked_by_pdb",
            &[("namespace", &ns), ("pdb", "web")]
        ),
        Some(1.0),
        "pods_blocked_by_pdb for {ns}/web"
    );

    // The new replica becomes Ready: nobody touches the request, the drain finishes.
    let unblocked = Timestamp::now();
    set_pod_ready(&client, &ns, &rolling, true).await?;
    let ready = wait_phase(&client, &ns, "maint", Phase::Ready, WAIT).await?;
    wait_pod_gone(
        &client,
        &ns,
        &serving.name_any(),
        Some(&uid(&serving)),
        WAIT,
    )
    .await?;
    assert!(ready.condition("Failed").is_none());
    assert_eq!(drain(&ready).drain_progress, 100);
    let metrics = shared_cluster().await?.operator.metrics().await?;
    let still_blocked = sample(
        &metrics,
        "maintenance_operator_pods_blocked_by_pdb",
        &[("namespace", &ns), ("pdb", "web")],
    );
    assert!(
        still_blocked.is_none_or(|v| v == 0.0),
        "pods_blocked_by_pdb for {ns}/web after the drain: {still_blocked:?}"
    );
    let audit = AuditLog::read(testbed)?;
    let accepted: Vec<&EvictionCall> = audit
        .evictions_of(&ns, &serving.name_any())
        .into_iter()
        .filter(|c| c.code == 201)
        .collect();
    assert_eq!(accepted.len(), 1, "one accepted eviction: {accepted:?}");
    assert!(accepted[0].received > unblocked);
    println!(
        "rollout: evicted {:.2}s after the new replica became Ready",
        seconds_between(unblocked, accepted[0].received)
    );
    wait_pods_ready(&client, &ns, "app=web", 2, WAIT).await?;
    release_request(&client, &ns, "maint", WAIT).await?;
    monitor.held().await
}

/// One replica behind `minAvailable: 1` cannot move: at the timeout the request says so
/// (`Failed`/`DrainTimeout` naming the PDB, a Warning event) and keeps trying; two replicas
/// unblock it.
#[tokio::test]
async fn a_single_replica_times_out_naming_the_pdb_then_recovers_when_scaled() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("solo", 2).await?;
    let target = &nodes[0];
    set_node_label(&client, target, POOL, Some(&ns)).await?;
    create(&client, &deployment(&ns, "solo", 1, &ns, |_| {})).await?;
    let pod = wait_pods_ready(&client, &ns, "app=solo", 1, WAIT).await?[0].clone();
    set_node_label(&client, &nodes[1], POOL, Some(&ns)).await?;
    create_app_pdb(&client, &ns, "solo", 1).await?;
    wait_pdb_disruptions_allowed(&client, &ns, "solo", 0, WAIT).await?;

    let mut spec = request_spec(target, "solo.example.com");
    spec.drain_spec = drain_spec(false, 5);
    create_request(&client, &ns, "maint", spec).await?;
    let key = format!("{ns}/{}", pod.name_any());
    let failed = wait_request(
        &client,
        &ns,
        "maint",
        "Failed=True with reason DrainTimeout",
        WAIT,
        |r| {
            r.condition("Failed")
                .is_some_and(|c| c.status == "True" && c.reason == "DrainTimeout")
        },
    )
    .await?;
    let condition = failed.condition("Failed").context("Failed condition")?;
    assert!(
        condition.message.contains(&key) && condition.message.contains("solo"),
        "the timeout names the pod and its PDB: {}",
        condition.message
    );
    assert_eq!(failed.phase(), Phase::Draining, "not Ready after a timeout");
    assert!(
        blocked(&failed, &key).is_some_and(|b| b.reason == "PDB" && b.message.contains("solo")),
        "status.drain.blocked: {:?}",
        drain(&failed).blocked
    );
    let still = Api::<Pod>::namespaced(client.clone(), &ns)
        .get(&pod.name_any())
        .await?;
    assert!(still.metadata.deletion_timestamp.is_none());
    let warning = wait_for("a Warning event DrainTimeout", WAIT, || async {
        Ok(events_about(&client, &ns, "maint")
            .await?
            .into_iter()
            .find(|e| {
                e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some("DrainTimeout")
            }))
    })
    .await?;
    let note = warning.note.unwrap_or_default();
    assert!(
        note.contains(&key) && note.contains("solo"),
        "the event names the pod and its PDB: {note}"
    );

    // The owner adds a replica: the PDB allows one disruption and the drain recovers by itself.
    let scaled = Instant::now();
    scale(&client, &ns, "solo", 2).await?;
    let ready = wait_phase(&client, &ns, "maint", Phase::Ready, WAIT).await?;
    println!(
        "single replica: Ready {:.1}s after scaling to 2",
        scaled.elapsed().as_secs_f64()
    );
    assert!(
        ready.condition("Failed").is_none(),
        "Failed is cleared once the drain finishes: {:?}",
        ready.status
    );
    wait_pod_gone(&client, &ns, &pod.name_any(), Some(&uid(&pod)), WAIT).await?;
    release_request(&client, &ns, "maint", WAIT).await?;
    monitor.held().await
}

/// Two PDBs select the pod: the API server answers 500, which the operator retries and reports;
/// removing one PDB lets the drain finish.
#[tokio::test]
async fn a_pod_under_two_pdbs_is_retried_and_reported_until_one_goes() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("twopdb", 2).await?;
    let target = &nodes[0];
    set_node_label(&client, target, POOL, Some(&ns)).await?;
    create(&client, &deployment(&ns, "api", 1, &ns, |_| {})).await?;
    let pod = wait_pods_ready(&client, &ns, "app=api", 1, WAIT).await?[0].clone();
    set_node_label(&client, &nodes[1], POOL, Some(&ns)).await?;
    for name in ["api-a", "api-b"] {
        create_pdb_max_unavailable(&client, &ns, name, &[("app", "api")], IntOrString::Int(1))
            .await?;
        wait_pdb_disruptions_allowed(&client, &ns, name, 1, WAIT).await?;
    }

    let mut spec = request_spec(target, "twopdb.example.com");
    spec.drain_spec = drain_spec(false, 0);
    create_request(&client, &ns, "maint", spec).await?;
    let key = format!("{ns}/{}", pod.name_any());
    let reported = wait_request(
        &client,
        &ns,
        "maint",
        "the drain to report both PDBs",
        WAIT,
        |r| {
            blocked(r, &key).is_some_and(|b| {
                b.reason == "MultiplePDBs"
                    && b.message.contains("api-a")
                    && b.message.contains("api-b")
            })
        },
    )
    .await?;
    assert_eq!(reported.phase(), Phase::Draining);
    let testbed = shared_cluster().await?.testbed;
    let calls = wait_for("the 500 to be retried", WAIT, || async {
        let audit = AuditLog::read(testbed)?;
        let calls: Vec<u16> = audit
            .evictions_of(&ns, &pod.name_any())
            .iter()
            .map(|c| c.code)
            .collect();
        Ok((calls.iter().filter(|c| **c == 500).count() >= 2).then_some(calls))
    })
    .await?;
    assert!(calls.iter().all(|c| *c == 500), "codes: {calls:?}");
    let still = Api::<Pod>::namespaced(client.clone(), &ns)
        .get(&pod.name_any())
        .await?;
    assert!(still.metadata.deletion_timestamp.is_none());

    Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns)
        .delete("api-b", &Default::default())
        .await?;
    let ready = wait_phase(&client, &ns, "maint", Phase::Ready, WAIT).await?;
    assert!(drain(&ready).blocked.is_empty());
    wait_pod_gone(&client, &ns, &pod.name_any(), Some(&uid(&pod)), WAIT).await?;
    let audit = AuditLog::read(testbed)?;
    let codes: Vec<u16> = audit
        .evictions_of(&ns, &pod.name_any())
        .iter()
        .map(|c| c.code)
        .collect();
    assert_eq!(codes.last(), Some(&201), "codes: {codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 201).count(), 1);
    release_request(&client, &ns, "maint", WAIT).await?;
    monitor.held().await
}

// ---------------------------------------------------------------------------------------------
// Pod selection

/// On one node: a DaemonSet pod and a mirror pod (never evicted), controller-owned pods (evicted),
/// an emptyDir pod (needs deleteEmptyDir), a bare pod (needs force) and a bare emptyDir pod (needs
/// both). The blocked ones are named in the status with the flag that would allow them; turning
/// the flags on in the spec during the drain lets them go, without a restart.
#[tokio::test]
async fn selection_skips_daemonset_and_mirror_pods_and_waits_for_force_and_delete_empty_dir()
-> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("select", 2).await?;
    let target = &nodes[0];
    set_node_label(&client, target, POOL, Some(&ns)).await?;
    create_daemonset(
        &client,
        &ns,
        "agent",
        &[("app", "agent")],
        &PodSpecOptions::on_node(target),
    )
    .await?;
    create(&client, &deployment(&ns, "plain", 2, &ns, |_| {})).await?;
    let scratch_opts = PodSpecOptions {
        empty_dir: true,
        ..PodSpecOptions::on_nodes_labelled(POOL, &ns)
    };
    create_app_deployment(&client, &ns, "scratch", 1, &scratch_opts).await?;
    let bare = |role: &str, empty_dir: bool, mirror: bool| BarePodOptions {
        labels: BTreeMap::from([("role".to_string(), role.to_string())]),
        annotations: if mirror {
            BTreeMap::from([(
                "kubernetes.io/config.mirror".to_string(),
                "0123456789abcdef".to_string(),
            )])
        } else {
            BTreeMap::new()
        },
        empty_dir,
        ..Default::default()
    };
    create_bare_pod(
        &client,
        &ns,
        "lonely",
        target,
        &bare("lonely", false, false),
    )
    .await?;
    create_bare_pod(
        &client,
        &ns,
        "lonely-scratch",
        target,
        &bare("lonely-scratch", true, false),
    )
    .await?;
    create_bare_pod(
        &client,
        &ns,
        "static-web",
        target,
        &bare("static", false, true),
    )
    .await?;
    // A finished bare pod with an emptyDir: finished pods go without force or deleteEmptyDir.
    create_bare_pod(
        &client,
        &ns,
        "finished",
        target,
        &bare("finished", true, false),
    )
    .await?;
    // The operator's own pod (as the chart labels it) is never evicted, not even with force.
    let operator_pod = unique_name("operator");
    let operator_labels = BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "maintenance-operator".to_string(),
        ),
        ("drain-test".to_string(), operator_pod.clone()),
    ]);
    create_bare_pod(
        &client,
        OPERATOR_NAMESPACE,
        &operator_pod,
        target,
        &BarePodOptions {
            labels: operator_labels,
            ..Default::default()
        },
    )
    .await?;
    for (selector, count) in [
        ("app=agent", 1),
        ("app=plain", 2),
        ("app=scratch", 1),
        ("role=lonely", 1),
        ("role=lonely-scratch", 1),
        ("role=static", 1),
        ("role=finished", 1),
    ] {
        wait_pods_ready(&client, &ns, selector, count, WAIT).await?;
    }
    let operator_pod_before = wait_pods_ready(
        &client,
        OPERATOR_NAMESPACE,
        &format!("drain-test={operator_pod}"),
        1,
        WAIT,
    )
    .await?
    .remove(0);
    Api::<Pod>::namespaced(client.clone(), &ns)
        .patch_status(
            "finished",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Succeeded"}})),
        )
        .await?;
    set_node_label(&client, &nodes[1], POOL, Some(&ns)).await?;
    let before: HashMap<String, Pod> = pods_on_node(&client, &ns, target)
        .await?
        .into_iter()
        .map(|p| (p.name_any(), p))
        .collect();
    assert_eq!(before.len(), 8, "pods on the node: {:?}", before.keys());
    let find = |prefix: &str| {
        before
            .values()
            .find(|p| p.name_any().starts_with(prefix))
            .cloned()
            .with_context(|| format!("a pod {prefix}* on the node"))
    };
    let agent = find("agent-")?;
    let mirror = find("static-web")?;
    let scratch = find("scratch-")?;
    let key = |name: &str| format!("{ns}/{name}");

    let mut spec = request_spec(target, "select.example.com");
    spec.drain_spec = Some(DrainSpec {
        force: Some(false),
        delete_empty_dir: Some(false),
        timeout_seconds: Some(0),
        ..Default::default()
    });
    create_request(&client, &ns, "maint", spec).await?;
    let scratch_key = key(&scratch.name_any());
    let (lonely_key, lonely_scratch_key) = (key("lonely"), key("lonely-scratch"));
    let held = wait_request(
        &client,
        &ns,
        "maint",
        "the controller-owned pods evicted and the others named with their flag",
        WAIT,
        |r| {
            let d = drain(r);
            let left: BTreeSet<&str> = d.wait_for_eviction.iter().map(String::as_str).collect();
            let expected: BTreeSet<&str> = [
                scratch_key.as_str(),
                lonely_key.as_str(),
                lonely_scratch_key.as_str(),
            ]
            .into();
            left == expected
                && blocked(r, &scratch_key).is_some_and(|b| b.reason == "NeedsDeleteEmptyDir")
                && blocked(r, &lonely_key).is_some_and(|b| b.reason == "NeedsForce")
                && blocked(r, &lonely_scratch_key)
                    .is_some_and(|b| b.reason == "NeedsForceAndDeleteEmptyDir")
        },
    )
    .await?;
    assert_eq!(held.phase(), Phase::Draining);
    let message = |k: &str| {
        blocked(&held, k)
            .map(|b| b.message.clone())
            .unwrap_or_default()
    };
    assert!(message(&scratch_key).contains("deleteEmptyDir"));
    assert!(message(&lonely_key).contains("force"));
    assert!(
        message(&lonely_scratch_key).contains("force")
            && message(&lonely_scratch_key).contains("deleteEmptyDir")
    );
    let plain_left: Vec<String> = pods_on_node(&client, &ns, target)
        .await?
        .iter()
        .filter(|p| p.name_any().starts_with("plain-"))
        .map(|p| p.name_any())
        .collect();
    assert!(plain_left.is_empty(), "plain pods left: {plain_left:?}");

    // deleteEmptyDir on, during the drain: the emptyDir pod goes, the bare ones still need force.
    patch_drain_spec(
        &client,
        &ns,
        "maint",
        serde_json::json!({"deleteEmptyDir": true}),
    )
    .await?;
    wait_pod_gone(
        &client,
        &ns,
        &scratch.name_any(),
        Some(&uid(&scratch)),
        WAIT,
    )
    .await?;
    wait_request(
        &client,
        &ns,
        "maint",
        "both bare pods to need force only",
        WAIT,
        |r| {
            blocked(r, &lonely_key).is_some_and(|b| b.reason == "NeedsForce")
                && blocked(r, &lonely_scratch_key).is_some_and(|b| b.reason == "NeedsForce")
                && blocked(r, &scratch_key).is_none()
        },
    )
    .await?;
    assert!(
        Api::<Pod>::namespaced(client.clone(), &ns)
            .get_opt("lonely")
            .await?
            .is_some_and(|p| p.metadata.deletion_timestamp.is_none())
    );

    // force on: the bare pods go and the drain finishes.
    patch_drain_spec(&client, &ns, "maint", serde_json::json!({"force": true})).await?;
    let ready = wait_phase(&client, &ns, "maint", Phase::Ready, WAIT).await?;
    let d = drain(&ready);
    assert_eq!(d.drain_progress, 100);
    assert!(d.wait_for_eviction.is_empty() && d.blocked.is_empty());
    let after: HashMap<String, Pod> = pods_on_node(&client, &ns, target)
        .await?
        .into_iter()
        .map(|p| (p.name_any(), p))
        .collect();
    let left: BTreeSet<&String> = after.keys().collect();
    assert_eq!(
        left,
        BTreeSet::from([&agent.name_any(), &mirror.name_any()]),
        "only the DaemonSet and mirror pods stay"
    );
    for kept in [&agent, &mirror] {
        let now = &after[&kept.name_any()];
        assert_eq!(uid(now), uid(kept), "{} untouched", kept.name_any());
        assert!(now.metadata.deletion_timestamp.is_none());
    }
    let audit = AuditLog::read(shared_cluster().await?.testbed)?.in_namespace(&ns);
    for kept in [&agent, &mirror] {
        assert!(
            audit.evictions_of(&ns, &kept.name_any()).is_empty(),
            "no eviction call for {}",
            kept.name_any()
        );
    }
    for name in before
        .keys()
        .filter(|n| **n != agent.name_any() && **n != mirror.name_any())
    {
        let codes: Vec<u16> = audit
            .evictions_of(&ns, name)
            .iter()
            .map(|c| c.code)
            .collect();
        assert_eq!(codes, vec![201], "one accepted eviction call for {name}");
    }
    let operator_pod_after = Api::<Pod>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .get(&operator_pod)
        .await?;
    assert_eq!(uid(&operator_pod_after), uid(&operator_pod_before));
    assert!(operator_pod_after.metadata.deletion_timestamp.is_none());
    assert!(
        AuditLog::read(shared_cluster().await?.testbed)?
            .evictions_of(OPERATOR_NAMESPACE, &operator_pod)
            .is_empty(),
        "no eviction call for the operator's pod"
    );
    Api::<Pod>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .delete(&operator_pod, &Default::default())
        .await?;
    release_request(&client, &ns, "maint", WAIT).await?;
    monitor.held().await
}

/// A pod already terminating (here held by a finalizer) is not evicted again: the drain waits for
/// it, says so in the status, and finishes once it is gone.
#[tokio::test]
async fn a_terminating_pod_is_waited_for_and_not_evicted() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("terminating", 1).await?;
    let target = &nodes[0];
    let held = BarePodOptions {
        labels: BTreeMap::from([("role".to_string(), "held".to_string())]),
        finalizers: vec!["example.com/hold".to_string()],
        ..Default::default()
    };
    create_bare_pod(&client, &ns, "held", target, &held).await?;
    wait_pods_ready(&client, &ns, "role=held", 1, WAIT).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.delete("held", &Default::default()).await?;
    wait_for("the pod to be terminating", WAIT, || async {
        Ok(pods
            .get("held")
            .await?
            .metadata
            .deletion_timestamp
            .map(|_| ()))
    })
    .await?;

    let mut spec = request_spec(target, "terminating.example.com");
    spec.drain_spec = drain_spec(true, 0);
    create_request(&client, &ns, "maint", spec).await?;
    let key = format!("{ns}/held");
    wait_request(
        &client,
        &ns,
        "maint",
        "the drain to wait for the terminating pod",
        WAIT,
        |r| {
            r.phase() == Phase::Draining
                && drain(r).wait_for_eviction == vec![key.clone()]
                && blocked(r, &key).is_some_and(|b| b.reason == "Terminating")
        },
    )
    .await?;
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    let ready = wait_phase(&client, &ns, "maint", Phase::Ready, WAIT).await?;
    assert!(drain(&ready).wait_for_eviction.is_empty());
    let audit = AuditLog::read(shared_cluster().await?.testbed)?;
    assert!(
        audit.evictions_of(&ns, "held").is_empty(),
        "a terminating pod is not evicted again"
    );
    release_request(&client, &ns, "maint", WAIT).await?;
    monitor.held().await
}

/// `status.drain` after a drain counts every pod it removed, also pods that were evicted and gone
/// before the operator's first drain status write (throttled to one write per second): pods with
/// `terminationGracePeriodSeconds: 0` are gone within milliseconds of their eviction.
#[tokio::test]
async fn drain_status_counts_pods_gone_before_the_first_status_write() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("counts", 2).await?;
    let target = &nodes[0];
    set_node_label(&client, target, POOL, Some(&ns)).await?;
    create_daemonset(
        &client,
        &ns,
        "agent",
        &[("app", "agent")],
        &PodSpecOptions::on_node(target),
    )
    .await?;
    create(
        &client,
        &deployment(&ns, "quick", 3, &ns, |spec| {
            spec.termination_grace_period_seconds = Some(0);
        }),
    )
    .await?;
    wait_pods_ready(&client, &ns, "app=agent", 1, WAIT).await?;
    wait_pods_ready(&client, &ns, "app=quick", 3, WAIT).await?;
    set_node_label(&client, &nodes[1], POOL, Some(&ns)).await?;

    let mut spec = request_spec(target, "counts.example.com");
    spec.drain_spec = drain_spec(false, 0);
    create_request(&client, &ns, "maint", spec).await?;
    let ready = wait_phase(&client, &ns, "maint", Phase::Ready, WAIT).await?;
    let left: Vec<String> = pods_on_node(&client, &ns, target)
        .await?
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert!(
        left.len() == 1 && left[0].starts_with("agent-"),
        "only the DaemonSet pod stays: {left:?}"
    );
    let audit = AuditLog::read(shared_cluster().await?.testbed)?.in_namespace(&ns);
    assert_eq!(audit.eviction_codes(), BTreeMap::from([(201, 3)]));
    // Four pods on the node when the drain started, three of them removed by it.
    assert_drain_counts(&drain(&ready), 4, 3);
    release_request(&client, &ns, "maint", WAIT).await?;
    monitor.held().await
}

/// `podSelector` narrows the drain: only the selected pods leave the node.
#[tokio::test]
async fn pod_selector_evicts_only_the_selected_pods() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("podsel", 2).await?;
    let target = &nodes[0];
    set_node_label(&client, target, POOL, Some(&ns)).await?;
    create(&client, &deployment(&ns, "batch", 2, &ns, |_| {})).await?;
    create(&client, &deployment(&ns, "web", 2, &ns, |_| {})).await?;
    wait_pods_ready(&client, &ns, "app=batch", 2, WAIT).await?;
    let web = wait_pods_ready(&client, &ns, "app=web", 2, WAIT).await?;
    set_node_label(&client, &nodes[1], POOL, Some(&ns)).await?;

    let mut spec = request_spec(target, "podsel.example.com");
    spec.drain_spec = Some(DrainSpec {
        pod_selector: Some("app=batch".into()),
        timeout_seconds: Some(0),
        ..Default::default()
    });
    create_request(&client, &ns, "maint", spec).await?;
    let ready = wait_phase(&client, &ns, "maint", Phase::Ready, WAIT).await?;
    assert_eq!(drain(&ready).drain_progress, 100);
    assert!(drain(&ready).wait_for_eviction.is_empty());
    let on_node = pods_on_node(&client, &ns, target).await?;
    let left: BTreeSet<String> = on_node.iter().map(uid).collect();
    let web_uids: BTreeSet<String> = web.iter().map(uid).collect();
    assert_eq!(left, web_uids, "only the web pods stay");
    assert!(
        on_node
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_none())
    );
    wait_pods_ready(&client, &ns, "app=batch", 2, WAIT).await?;
    let audit = AuditLog::read(shared_cluster().await?.testbed)?;
    for pod in &web {
        assert!(audit.evictions_of(&ns, &pod.name_any()).is_empty());
    }
    release_request(&client, &ns, "maint", WAIT).await?;
    monitor.held().await
}

/// `podEvictionFilters` (OR-ed): only pods requesting a resource whose name matches leave.
#[tokio::test]
async fn pod_eviction_filters_evict_only_pods_requesting_a_matching_resource() -> Result<()> {
    let shared = shared_cluster().await?;
    let client = shared.testbed.client().await?;
    let ns = unique_name("filters");
    create_namespace(&client, &ns).await?;
    // Nodes that offer an extended resource, as a device plugin would report it.
    let prefix = unique_name("filters");
    let mut nodes = Vec::new();
    for i in 0..2 {
        let name = format!("{prefix}-{i}");
        let mut node = node_object(&name, &prefix, &NodeOptions::default());
        if let Some(status) = node.status.as_mut() {
            for list in [status.allocatable.as_mut(), status.capacity.as_mut()]
                .into_iter()
                .flatten()
            {
                list.insert("example.com/gpu".into(), Quantity("8".into()));
            }
        }
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await?;
        nodes.push(name);
    }
    wait_nodes_ready(&client, &nodes, WAIT).await?;
    let monitor = monitor_shared(&ns, &nodes).await?;
    let target = &nodes[0];
    set_node_label(&client, target, POOL, Some(&ns)).await?;
    let gpu = BTreeMap::from([("example.com/gpu".to_string(), Quantity("1".into()))]);
    create(
        &client,
        &deployment(&ns, "trainer", 2, &ns, |spec| {
            spec.containers[0].resources = Some(ResourceRequirements {
                requests: Some(gpu.clone()),
                limits: Some(gpu.clone()),
                ..Default::default()
            });
        }),
    )
    .await?;
    create(&client, &deployment(&ns, "frontend", 2, &ns, |_| {})).await?;
    wait_pods_ready(&client, &ns, "app=trainer", 2, WAIT).await?;
    let frontend = wait_pods_ready(&client, &ns, "app=frontend", 2, WAIT).await?;
    set_node_label(&client, &nodes[1], POOL, Some(&ns)).await?;

    let mut spec = request_spec(target, "filters.example.com");
    spec.drain_spec = Some(DrainSpec {
        timeout_seconds: Some(0),
        pod_eviction_filters: Some(vec![
            PodEvictionFilterEntry {
                by_resource_name_regex: Some("nvidia.com/gpu".into()),
            },
            PodEvictionFilterEntry {
                by_resource_name_regex: Some(r"^example\.com/gpu$".into()),
            },
        ]),
        ..Default::default()
    });
    create_request(&client, &ns, "maint", spec).await?;
    let ready = wait_phase(&client, &ns, "maint", Phase::Ready, WAIT).await?;
    assert_eq!(drain(&ready).drain_progress, 100);
    assert!(drain(&ready).wait_for_eviction.is_empty());
    let left: BTreeSet<String> = pods_on_node(&client, &ns, target)
        .await?
        .iter()
        .map(uid)
        .collect();
    let frontend_uids: BTreeSet<String> = frontend.iter().map(uid).collect();
    assert_eq!(left, frontend_uids, "only the pods without a GPU stay");
    let trainers = wait_pods_ready(&client, &ns, "app=trainer", 2, WAIT).await?;
    assert!(
        trainers
            .iter()
            .all(|p| pod_node(p) == Some(nodes[1].as_str()))
    );
    let audit = AuditLog::read(shared.testbed)?;
    for pod in &frontend {
        assert!(audit.evictions_of(&ns, &pod.name_any()).is_empty());
    }
    release_request(&client, &ns, "maint", WAIT).await?;
    monitor.held().await
}

// ---------------------------------------------------------------------------------------------
// The eviction rate limit

/// `evictionsPerSecond: 5`, `evictionBurst: 1`, two nodes of 20 pods drained at once: as the API
/// server saw it, no 1-second window holds more than 5 + 1 eviction calls, the overall rate is at
/// most about 5/s, and both drains share the one limit: one queue for all nodes, first queued
/// first called, so the second node's calls follow the first's at the same pace.
#[tokio::test]
async fn the_eviction_rate_limit_holds_across_nodes() -> Result<()> {
    const PER_SECOND: i32 = 5;
    const BURST: i32 = 1;
    const PODS_PER_NODE: i32 = 20;
    let (testbed, client) = own_testbed(Some(MaintenanceOperatorConfigSpec {
        evictions_per_second: Some(PER_SECOND),
        eviction_burst: Some(BURST),
        ..limits(10, None)
    }))
    .await?;
    let nodes = create_nodes(&client, "rate", 3, &[]).await?;
    wait_nodes_ready(&client, &nodes, WAIT).await?;
    let ns = unique_name("rate");
    create_namespace(&client, &ns).await?;
    let (drained, spare) = (&nodes[..2], &nodes[2]);
    for node in drained {
        set_node_label(&client, node, POOL, Some(&ns)).await?;
    }
    create(
        &client,
        &deployment(&ns, "flood", 2 * PODS_PER_NODE, &ns, |spec| {
            spec.topology_spread_constraints = Some(vec![one_per_node("flood")]);
        }),
    )
    .await?;
    let pods = wait_pods_ready(
        &client,
        &ns,
        "app=flood",
        usize::try_from(2 * PODS_PER_NODE)?,
        WAIT,
    )
    .await?;
    let node_of: HashMap<String, String> = pods
        .iter()
        .map(|p| (p.name_any(), pod_node(p).unwrap_or_default().to_string()))
        .collect();
    for node in drained {
        set_node_label(&client, node, POOL, None).await?;
    }
    set_node_label(&client, spare, POOL, Some(&ns)).await?;

    let account = "rate-operator";
    let monitor = monitor_as(&testbed, &ns, &nodes, account).await?;
    let operator = Operator::start_as(&testbed, account, &[]).await?;
    for (i, node) in drained.iter().enumerate() {
        let mut spec = request_spec(node, "rate.example.com");
        spec.drain_spec = drain_spec(false, 0);
        create_request(&client, &ns, &format!("m{i}"), spec).await?;
    }
    for i in 0..drained.len() {
        wait_phase(&client, &ns, &format!("m{i}"), Phase::Ready, WAIT).await?;
    }

    let audit = AuditLog::read(&testbed)?.in_namespace(&ns);
    let calls = &audit.evictions;
    let codes = audit.eviction_codes();
    assert_eq!(
        codes,
        BTreeMap::from([(201, pods.len())]),
        "one accepted call per pod, no PDB here"
    );
    let evicted: BTreeSet<&str> = calls.iter().map(|c| c.pod.as_str()).collect();
    assert_eq!(evicted.len(), pods.len());
    let times: Vec<Timestamp> = calls.iter().map(|c| c.received).collect();
    let busiest = busiest_second(&times);
    let span = seconds_between(times[0], times[times.len() - 1]);
    let rate = (times.len() - 1) as f64 / span;
    println!(
        "rate limit {PER_SECOND}/s burst {BURST}: {} calls in {span:.2}s ({rate:.2}/s), \
         at most {busiest} in one second",
        times.len()
    );
    let limit = usize::try_from(PER_SECOND + BURST)?;
    assert!(
        busiest <= limit,
        "{busiest} eviction calls within one second; the limit allows {limit}"
    );
    // The spacing the limiter enforces makes the overall rate at most 5/s; the slack covers
    // calls that reach the API server late (a busy machine) and so bunch up with the next one.
    assert!(
        rate <= f64::from(PER_SECOND + BURST) + 0.25,
        "overall {rate:.2} eviction calls per second with a limit of {PER_SECOND}/s"
    );
    // One queue and one limiter for all nodes: each node queued its pods at once, the second
    // node's calls came after the first's, one rate interval later, not in a burst of their own.
    let window = |node: &str| {
        let mine: Vec<Timestamp> = calls
            .iter()
            .filter(|c| node_of.get(&c.pod).map(String::as_str) == Some(node))
            .map(|c| c.received)
            .collect();
        (mine.first().copied(), mine.last().copied())
    };
    let (a, b) = (window(&drained[0]), window(&drained[1]));
    let (Some(a0), Some(a1), Some(b0), Some(b1)) = (a.0, a.1, b.0, b.1) else {
        bail!("no eviction calls for one of the nodes: {a:?} {b:?}");
    };
    let ((_, first_end), (second_start, _)) = if a0 < b0 {
        ((a0, a1), (b0, b1))
    } else {
        ((b0, b1), (a0, a1))
    };
    assert!(
        first_end < second_start,
        "the two drains' calls interleaved: {a0}..{a1} and {b0}..{b1}; first queued is first called"
    );
    let gap = seconds_between(first_end, second_start);
    assert!(
        gap < 1.5,
        "{gap:.2}s between the first drain's last call and the second's first: the two drains \
         did not run at once, so this run says nothing about a shared limit"
    );
    let metrics = operator.metrics().await?;
    assert_eq!(
        sample(
            &metrics,
            "maintenance_operator_eviction_requests_total",
            &[("code", "201")]
        ),
        Some(pods.len() as f64),
        "the operator counts what the API server saw"
    );
    monitor.held().await
}

// ---------------------------------------------------------------------------------------------
// Many nodes at once, under watch

/// `MO_DRAIN_SCALE_NODES` nodes (default 20) of `MO_DRAIN_SCALE_PODS` pods each (default 30)
/// drained in parallel under `maxUnavailable` = half of them, with 1.5 times as many spare nodes
/// to take the replacements. Every pod belongs to one of `MO_DRAIN_SCALE_PODS` Deployments with
/// one replica per drained node and a PodDisruptionBudget, so every budget is contended by every
/// node in maintenance at once. The requestor releases each node once Ready.
///
/// Checked over the whole run (the invariant monitor watches from before the first request): no
/// PDB's currentHealthy below its desiredHealthy while a node is in maintenance, every accepted
/// eviction charged to a budget that allowed it, no pod deleted behind the budgets' back, and
/// never more nodes unavailable than maxUnavailable. Printed: the wall time to all Ready, eviction
/// calls per evicted pod, and the delay between a budget allowing a disruption again and our next
/// eviction call for it.
#[tokio::test]
async fn many_nodes_drain_in_parallel_within_pdbs_and_max_unavailable() -> Result<()> {
    let _turn = large_scenario_turn().await;
    let drained_count = env_usize("MO_DRAIN_SCALE_NODES", 20)?;
    let pods_per_node = env_usize("MO_DRAIN_SCALE_PODS", 30)?;
    ensure!(
        drained_count > 0 && pods_per_node > 0,
        "MO_DRAIN_SCALE_NODES and MO_DRAIN_SCALE_PODS must be positive"
    );
    let spare_count = drained_count.div_ceil(2) * 3;
    let max_unavailable = drained_count.div_ceil(2);
    let replicas = i32::try_from(drained_count)?;
    let setup_wait = Duration::from_secs(120 + 2 * (drained_count * pods_per_node) as u64 / 10);
    let drain_wait = Duration::from_secs(300 + (drained_count * pods_per_node) as u64 / 2);
    println!(
        "scale: {drained_count} nodes x {pods_per_node} pods, {spare_count} spare nodes, \
         maxParallelOperations {drained_count}, maxUnavailable {max_unavailable}"
    );

    let (testbed, client) =
        own_testbed(Some(limits(replicas, i32::try_from(max_unavailable)?))).await?;
    let drained = create_nodes(&client, "drain", drained_count, &[]).await?;
    let spares = create_nodes(&client, "spare", spare_count, &[]).await?;
    wait_nodes_ready(&client, &drained, setup_wait).await?;
    wait_nodes_ready(&client, &spares, setup_wait).await?;
    let ns = unique_name("scale");
    create_namespace(&client, &ns).await?;
    for node in &drained {
        set_node_label(&client, node, POOL, Some(&ns)).await?;
    }
    // Deployment i has one replica per drained node. Its budget: maxUnavailable 1, a percentage
    // (10%, rounded up), or minAvailable replicas - 1, in turn.
    let apps: Vec<String> = (0..pods_per_node).map(|i| format!("w{i:03}")).collect();
    for (i, app) in apps.iter().enumerate() {
        create(
            &client,
            &deployment(&ns, app, replicas, &ns, |spec| {
                spec.topology_spread_constraints = Some(vec![one_per_node(app)]);
            }),
        )
        .await?;
        let selector = [("app", app.as_str())];
        create_pdb_of_kind(&client, &ns, app, &selector, i, replicas).await?;
    }
    let total = drained_count * pods_per_node;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait_until("every pod Ready", setup_wait, || async {
        let ready = pods_api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|p| pod_is_ready(p))
            .count();
        Ok(if ready == total {
            Check::Done(())
        } else {
            Check::Pending(format!("{ready} of {total} Ready"))
        })
    })
    .await?;
    let per_node: BTreeMap<String, usize> = pods_api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .fold(BTreeMap::new(), |mut m, p| {
            *m.entry(pod_node(p).unwrap_or_default().to_string())
                .or_default() += 1;
            m
        });
    ensure!(
        drained
            .iter()
            .all(|n| per_node.get(n) == Some(&pods_per_node)),
        "pods per node: {per_node:?}"
    );
    // Replacements go to the spare nodes only, so that no pod is evicted twice.
    for node in &drained {
        set_node_label(&client, node, POOL, None).await?;
    }
    for node in &spares {
        set_node_label(&client, node, POOL, Some(&ns)).await?;
    }
    let settled = (apps.len(), replicas, 1);
    wait_pdbs_settled(&client, &ns, settled, setup_wait, drop).await?;

    // The monitor has its initial lists before the first request exists.
    let account = "scale-operator";
    let monitor = monitor_as(&testbed, &ns, &drained, account).await?;
    let operator = Operator::start_as(&testbed, account, &[]).await?;

    let started = Instant::now();
    for (i, node) in drained.iter().enumerate() {
        let mut spec = request_spec(node, "scale.example.com");
        spec.drain_spec = drain_spec(false, 0);
        create_request(&client, &ns, &format!("m{i:03}"), spec).await?;
    }
    // The requestor: each node is released as soon as its request is Ready.
    let mut ready_after: BTreeMap<String, Duration> = BTreeMap::new();
    let deadline = Instant::now() + drain_wait;
    while ready_after.len() < drained.len() {
        for request in list_requests(&client, &ns).await? {
            let name = request.name_any();
            if request.phase() != Phase::Ready || ready_after.contains_key(&name) {
                continue;
            }
            let left = pods_on_node(&client, &ns, &request.spec.node_name).await?;
            ensure!(
                left.is_empty(),
                "{name} is Ready while {} still holds pods: {:?}",
                request.spec.node_name,
                left.iter().map(|p| p.name_any()).collect::<Vec<_>>()
            );
            ready_after.insert(name.clone(), started.elapsed());
            delete_request(&client, &ns, &name).await?;
        }
        if Instant::now() > deadline {
            let phases: Vec<(String, Phase)> = list_requests(&client, &ns)
                .await?
                .iter()
                .map(|r| (r.name_any(), r.phase()))
                .collect();
            bail!(
                "only {} of {} requests Ready after {drain_wait:?}; now: {phases:?}; operator log: {}",
                ready_after.len(),
                drained.len(),
                operator.log.display()
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let wall = ready_after.values().max().copied().unwrap_or_default();
    wait_for("every request released", WAIT, || async {
        Ok(list_requests(&client, &ns).await?.is_empty().then_some(()))
    })
    .await?;
    for node in &drained {
        ensure!(
            !node_unschedulable(&client, node).await?,
            "{node} left cordoned"
        );
    }
    // 1. A budget's healthy count never below its desired count (the monitor's check, while a
    //    request is in progress). In this test only our evictions take pods away: the test
    //    deletes none, KWOK never fails one, nothing rolls out, and the replicas (hence
    //    desiredHealthy) never change. The API server charges every accepted eviction to the
    //    budget at once (disruptionsAllowed - 1, the pod in disruptedPods), and the disruption
    //    controller leaves such pods out of currentHealthy, so a replacement that is slow to
    //    become Ready lowers nothing: it only delays the next disruptionsAllowed >= 1. Hence any
    //    currentHealthy < desiredHealthy came from a pod taken away without being charged to its
    //    budget — by us. The monitor also holds maxUnavailable at every admission, and finds no
    //    pod deleted by the operator's identity instead of evicted.
    let report = monitor.finish().await?;
    let audit = AuditLog::read(&testbed)?.in_namespace(&ns);
    let pdb_of = |pod: &str| pod.split('-').next().unwrap_or_default().to_string();

    // 2. Every accepted eviction was charged to the pod's budget, which allowed it: the API
    //    server's own status write for it names the pod in disruptedPods, and the version that
    //    write was based on (as the monitor saw it) had disruptionsAllowed >= 1. Comparing by
    //    resourceVersion rather than by time avoids a race: the operator may hear of a budget's
    //    change before the monitor does.
    let allowed_at: HashMap<(String, String), i32> = report
        .pdb_states
        .iter()
        .filter_map(|e| match &e.observed {
            Observed::Pdb {
                name,
                disruptions_allowed,
                ..
            } => Some((
                (name.clone(), e.resource_version.to_string()),
                *disruptions_allowed,
            )),
            _ => None,
        })
        .collect();
    let mut uncharged = Vec::new();
    let mut over_budget = Vec::new();
    let mut unverified = 0;
    let accepted: Vec<&EvictionCall> = audit.evictions.iter().filter(|c| c.code == 201).collect();
    for call in &accepted {
        let pdb = pdb_of(&call.pod);
        let charge = audit.pdb_status_writes.iter().find(|w| {
            w.name == pdb
                && w.code == 200
                && w.disrupted_pods.contains(&call.pod)
                && w.received >= call.received
                && w.received <= call.completed
        });
        let Some(charge) = charge else {
            uncharged.push(call.pod.clone());
            continue;
        };
        match charge
            .based_on
            .as_ref()
            .and_then(|rv| allowed_at.get(&(pdb.clone(), rv.clone())))
        {
            Some(allowed) if *allowed < 1 => {
                over_budget.push(format!("{} (PDB {pdb} allowed {allowed})", call.pod));
            }
            Some(_) => {}
            None => unverified += 1,
        }
    }
    // 3. maxUnavailable held over the whole run, not only at admissions.
    let (most, when) = (report.peak_unavailable, &report.peak_unavailable_nodes);

    // The figures.
    let calls = audit.evictions.len();
    let evicted: BTreeSet<&str> = accepted.iter().map(|c| c.pod.as_str()).collect();
    let mut delays = unblock_delays(&audit, &apps, &pdb_of);
    let delay_count = delays.len();
    let median_delay = median(&mut delays);
    let p90_delay = percentile(&delays, 90.0);
    let mut ready_times: Vec<f64> = ready_after.values().map(Duration::as_secs_f64).collect();
    let median_ready = median(&mut ready_times);
    println!(
        "scale {drained_count}x{pods_per_node}: all {} requests Ready after {:.1}s (median {:.1}s)",
        drained.len(),
        wall.as_secs_f64(),
        median_ready.unwrap_or_default()
    );
    println!(
        "scale: {calls} eviction calls for {} evicted pods = {:.2} calls per evicted pod; codes {:?}",
        evicted.len(),
        calls as f64 / evicted.len().max(1) as f64,
        audit.eviction_codes()
    );
    // The per-budget gate admits no more calls than a budget allows: refused calls are rare
    // (races between budget updates). Without it this run made 1.56-1.64 calls per pod; the
    // goal is 1.15, the guard leaves room for a slow machine's races.
    let calls_per_pod = calls as f64 / evicted.len().max(1) as f64;
    ensure!(
        calls_per_pod <= 1.25,
        "{calls_per_pod:.2} eviction calls per evicted pod: the per-budget gate lets refused calls through"
    );
    let times: Vec<Timestamp> = audit.evictions.iter().map(|c| c.received).collect();
    if let (Some(first), Some(last)) = (times.first(), times.last()) {
        let span = seconds_between(*first, *last);
        println!(
            "scale: eviction calls over {span:.1}s: {:.1}/s on average, at most {} in one second",
            calls as f64 / span.max(0.001),
            busiest_second(&times)
        );
    }
    println!(
        "scale: PDB allows a disruption again -> our next eviction call: median {} ms, p90 {} ms \
         over {delay_count} unblockings",
        median_delay.map_or("-".into(), |d| format!("{:.0}", d * 1000.0)),
        p90_delay.map_or("-".into(), |d| format!("{:.0}", d * 1000.0)),
    );
    println!(
        "scale: monitor saw {} PDB states (lowest currentHealthy - desiredHealthy {:?}), \
         at most {most} nodes unavailable at once (limit {max_unavailable}): {when:?}; \
         {unverified} accepted evictions without the budget version seen by the monitor",
        report.pdb_states.len(),
        report.lowest_pdb_margin,
    );

    assert_eq!(
        evicted.len(),
        total,
        "every pod of the drained nodes evicted exactly once"
    );
    assert_eq!(accepted.len(), total, "one accepted eviction per pod");
    assert!(
        uncharged.is_empty(),
        "accepted evictions not charged to a PDB: {uncharged:?}"
    );
    assert!(
        over_budget.is_empty(),
        "evictions accepted while the PDB allowed none: {over_budget:?}"
    );
    assert!(
        most <= max_unavailable,
        "{most} nodes unavailable at once with maxUnavailable {max_unavailable}: {when:?}"
    );
    assert_eq!(
        most,
        max_unavailable,
        "with {} requests the limit should have been reached",
        drained.len()
    );
    Ok(())
}

/// For each time a budget went from disruptionsAllowed 0 to >= 1 (the API server's answer to the
/// disruption controller's write) while one of its pods was waiting (refused and not yet
/// evicted): the seconds until our next eviction call for one of its pods.
fn unblock_delays(audit: &AuditLog, pdbs: &[String], pdb_of: &dyn Fn(&str) -> String) -> Vec<f64> {
    let mut delays = Vec::new();
    let ns = audit
        .evictions
        .first()
        .map(|c| c.namespace.clone())
        .unwrap_or_default();
    for pdb in pdbs {
        let calls: Vec<&EvictionCall> = audit
            .evictions
            .iter()
            .filter(|c| pdb_of(&c.pod) == *pdb)
            .collect();
        let mut previous: Option<i32> = None;
        for write in audit.pdb_history(&ns, pdb) {
            let allowed = write.disruptions_allowed.unwrap_or(0);
            if previous == Some(0) && allowed >= 1 {
                let at = write.completed;
                let refused: BTreeSet<&str> = calls
                    .iter()
                    .filter(|c| c.code == 429 && c.completed < at)
                    .map(|c| c.pod.as_str())
                    .collect();
                let evicted: BTreeSet<&str> = calls
                    .iter()
                    .filter(|c| c.code == 201 && c.received < at)
                    .map(|c| c.pod.as_str())
                    .collect();
                if refused.difference(&evicted).next().is_some()
                    && let Some(next) = calls.iter().find(|c| c.received > at)
                {
                    delays.push(seconds_between(at, next.received));
                }
            }
            previous = Some(allowed);
        }
    }
    delays
}

// ---------------------------------------------------------------------------------------------
// Connections

/// Nodes in maintenance at once in the connection test: well above the connections the
/// operator's other calls keep open.
const WATCHING_NODES: usize = 40;
/// The bound on calls in flight per client in the connection test.
const OTHER_CONNECTIONS: usize = 2;

/// The pod watches of nodes in maintenance share HTTP/2 connections (`src/api_calls.rs`,
/// `actors/src/watch_connections.rs`): 40 nodes waiting for a pod each hold 40 pod watches, over
/// one connection where HTTP/1.1 would take 40. Its own control plane: the connections of the
/// shared operator would count other tests' calls.
#[tokio::test]
async fn pod_watches_of_many_nodes_share_one_connection() -> Result<()> {
    let max = i32::try_from(WATCHING_NODES)?;
    let (testbed, client, ns, nodes) =
        own_cluster("watch", WATCHING_NODES, Some(limits(max, max))).await?;
    let opts = BarePodOptions {
        labels: BTreeMap::from([("app".to_string(), "job".to_string())]),
        ..BarePodOptions::default()
    };
    for (i, node) in nodes.iter().enumerate() {
        create_bare_pod(&client, &ns, &format!("job-{i}"), node, &opts).await?;
    }
    wait_pods_ready(&client, &ns, "app=job", WATCHING_NODES, WAIT).await?;
    let api_port = testbed
        .config()
        .await?
        .cluster_url
        .port_u16()
        .context("the testbed's API server URL names a port")?;
    // Few calls in flight, so that the connections of the other calls stay few (hyper keeps a
    // connection per call of a burst for 90 s).
    let operator = Operator::start(
        &testbed,
        &["--max-concurrent-api-calls", &OTHER_CONNECTIONS.to_string()],
    )
    .await?;
    let pid = operator.pid().context("the operator runs")?;

    // Every node waits for its pod (`waitForPodCompletion`, no timeout): its actor watches the
    // node's pods for as long as the pod runs.
    for (i, node) in nodes.iter().enumerate() {
        let mut spec = request_spec(node, "watch.example.com");
        spec.wait_for_pod_completion = Some(maintenance_crds::WaitForPodCompletionSpec {
            pod_selector: Some("app=job".into()),
            timeout_seconds: Some(0),
        });
        create_request(&client, &ns, &format!("m{i}"), spec).await?;
    }
    // A request lists the pods it waits for once its watch has listed them.
    let requests: Api<NodeMaintenance> = Api::namespaced(client.clone(), &ns);
    wait_until(
        &format!("{WATCHING_NODES} requests waiting for their pod"),
        WAIT,
        || async {
            let listed = requests.list(&ListParams::default()).await?.items;
            let waiting = listed
                .iter()
                .filter(|r| {
                    r.phase() == Phase::WaitForPodCompletion
                        && r.status
                            .as_ref()
                            .is_some_and(|s| !s.wait_for_completion.is_empty())
                })
                .count();
            Ok(if waiting == WATCHING_NODES {
                Check::Done(())
            } else {
                Check::Pending(format!("{waiting} waiting"))
            })
        },
    )
    .await?;
    let connections = connections_to(pid, api_port)?;
    println!(
        "{WATCHING_NODES} pod watches: the operator holds {connections} connections to the API server"
    );
    // Over HTTP/1.1: one per pod watch, plus the supervisor's watches and the calls in flight.
    // Shared: those others (about ten) and one for the pod watches.
    ensure!(
        connections < WATCHING_NODES / 2,
        "{WATCHING_NODES} nodes watched over {connections} connections to the API server: the \
         pod watches do not share connections"
    );
    let metrics = operator.metrics().await?;
    ensure!(
        sample(
            &metrics,
            "maintenance_operator_api_calls_in_flight",
            &[("client", "pod_watches")]
        )
        .is_some(),
        "the pod watches' client is not in /metrics"
    );
    Ok(())
}

/// The established TCP connections of process `pid` to local port `port` (the API server's).
fn connections_to(pid: u32, port: u16) -> Result<usize> {
    let inodes: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .with_context(|| format!("reading the descriptors of process {pid}"))?
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect();
    let mut count = 0;
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))
            .with_context(|| format!("reading /proc/{pid}/net/{table}"))?;
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(state), Some(inode)) =
                (fields.get(2), fields.get(3), fields.get(9))
            else {
                continue;
            };
            let remote_port = remote
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            // 01: ESTABLISHED.
            if *state == "01" && remote_port == Some(port) && inodes.contains(*inode) {
                count += 1;
            }
        }
    }
    Ok(count)
}
