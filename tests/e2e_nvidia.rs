//! Drop-in for NVIDIA's Maintenance Operator, on a live control plane:
//! - garbage collection of requests Ready for longer than `maxNodeMaintenanceTimeSeconds`
//!   (NVIDIA's `internal/controller/garbage_collector_controller.go`), sparing those annotated
//!   `garbage-collector.ignore`;
//! - a Pending request for a node that does not exist is explained, then collected (with no
//!   webhook to refuse it), while one whose node appears in time goes on;
//! - the CRD's validation of `requestorID` and its `selectableFields`, as NVIDIA's CRD has them;
//! - adoption of every shape NVIDIA's controller leaves mid-flight
//!   (`internal/controller/nodemaintenance_controller.go`), written here exactly as it writes
//!   them, then handed to our operator: no early timeout, no second cordon, the uncordon owed.
//!
//! Assertions are on what the API server shows (requests, conditions, annotations, nodes, Events
//! and the audit log of the operator's writes), with deadlines.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use maintenance_crds::{
    ADMITTED_TIME_ANNOTATION, FINALIZER, GC_IGNORE_ANNOTATION, INITIAL_UNSCHEDULABLE_ANNOTATION,
    MaintenanceOperatorConfigSpec, NodeMaintenance, Phase, READY_TIME_ANNOTATION,
    WAIT_POD_COMPLETION_START_ANNOTATION, condition_type,
};
use serde_json::json;
use support::audit::AuditLog;
use support::invariants::*;
use support::operator::*;
use support::*;
use tokio::sync::OnceCell;

const WAIT: Duration = Duration::from_secs(60);
/// `maxNodeMaintenanceTimeSeconds` and `--missing-node-grace-seconds` of this binary's cluster.
const COLLECT_AFTER_SECONDS: u64 = 3;

// ---------------------------------------------------------------------------------------------
// The cluster of the collection and validation tests: short limits, a fast safety-net round.

struct CollectingCluster {
    testbed: &'static Testbed,
    operator: Operator,
}

async fn collecting_cluster() -> Result<&'static CollectingCluster> {
    static CLUSTER: OnceCell<CollectingCluster> = OnceCell::const_new();
    CLUSTER
        .get_or_try_init(|| async {
            let testbed = Testbed::shared().await?;
            let client = testbed.client().await?;
            let seconds = i32::try_from(COLLECT_AFTER_SECONDS)?;
            install(
                &client,
                Some(MaintenanceOperatorConfigSpec {
                    max_node_maintenance_time_seconds: Some(seconds),
                    ..limits(1000, None)
                }),
            )
            .await?;
            let grace = COLLECT_AFTER_SECONDS.to_string();
            let operator =
                Operator::start(testbed, &["--missing-node-grace-seconds", &grace]).await?;
            Ok(CollectingCluster { testbed, operator })
        })
        .await
}

async fn collecting_setup(prefix: &str, nodes: usize) -> Result<(Client, String, Vec<String>)> {
    let cluster = collecting_cluster().await?;
    let client = cluster.testbed.client().await?;
    let ns = unique_name(prefix);
    create_namespace(&client, &ns).await?;
    let names = create_nodes(&client, &unique_name(prefix), nodes, &[]).await?;
    wait_nodes_ready(&client, &names, WAIT).await?;
    Ok((client, ns, names))
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn annotation<'a>(r: &'a NodeMaintenance, key: &str) -> Option<&'a str> {
    r.annotations().get(key).map(String::as_str)
}

fn rfc3339(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn ago(seconds: i64) -> jiff::Timestamp {
    jiff::Timestamp::now() - jiff::SignedDuration::from_secs(seconds)
}

// ---------------------------------------------------------------------------------------------
// Garbage collection

#[tokio::test]
async fn garbage_collection_deletes_an_old_ready_request_and_spares_an_ignored_one() -> Result<()> {
    let (client, ns, nodes) = collecting_setup("gc", 2).await?;
    let monitor =
        InvariantMonitor::start(Testbed::shared().await?, Scope::new(&ns, &nodes)).await?;
    let cluster = collecting_cluster().await?;
    let api: Api<NodeMaintenance> = Api::namespaced(client.clone(), &ns);
    request_node(&client, &ns, "forgotten", &nodes[0], "gc.example.com").await?;
    let mut kept = NodeMaintenance::new("kept", request_spec(&nodes[1], "gc.example.com"));
    kept.annotations_mut()
        .insert(GC_IGNORE_ANNOTATION.into(), "true".into());
    api.create(&PostParams::default(), &kept).await?;

    // Both become Ready and get NVIDIA's ready-time annotation; then the forgotten one goes.
    let kept = wait_request(&client, &ns, "kept", "Ready with ready-time", WAIT, |r| {
        r.phase() == Phase::Ready && annotation(r, READY_TIME_ANNOTATION).is_some()
    })
    .await?;
    wait_request_gone(&client, &ns, "forgotten", WAIT).await?;
    let collected_at = jiff::Timestamp::now();
    ensure!(
        !node_unschedulable(&client, &nodes[0]).await?,
        "the collected request's node must be uncordoned by its cleanup"
    );
    let note = wait_event(&client, &ns, "forgotten", "GarbageCollected", WAIT)
        .await?
        .note
        .unwrap_or_default();
    ensure!(
        note.contains("maxNodeMaintenanceTimeSeconds=3") && note.contains(GC_IGNORE_ANNOTATION),
        "the Event says why and how to keep a request: {note}"
    );
    let collected = cluster
        .operator
        .metric("maintenance_operator_requests_garbage_collected_total{cause=\"ready_too_long\"}")
        .await?;
    ensure!(collected >= 1.0, "the collection counter shows {collected}");

    // The ignored one stays Ready, cordoned, well past its own deadline.
    let ready_time: jiff::Timestamp = annotation(&kept, READY_TIME_ANNOTATION)
        .context("ready-time")?
        .parse()?;
    let deadline = ready_time + jiff::SignedDuration::from_secs(3 * COLLECT_AFTER_SECONDS as i64);
    wait_for("the ignored request's deadline to pass", WAIT, || async {
        Ok((jiff::Timestamp::now() > deadline).then_some(()))
    })
    .await?;
    wait_scheduler_rounds(&cluster.operator, 3).await?;
    let kept = get_request(&client, &ns, "kept")
        .await?
        .context("the request annotated garbage-collector.ignore was deleted")?;
    ensure!(
        kept.phase() == Phase::Ready && !kept.is_deleting(),
        "{}",
        describe(&kept)
    );
    ensure!(node_unschedulable(&client, &nodes[1]).await?);
    eprintln!("collected at {collected_at}; the ignored request is still Ready");
    release_request(&client, &ns, "kept", WAIT).await?;
    ensure!(!node_unschedulable(&client, &nodes[1]).await?);
    monitor.held().await
}

#[tokio::test]
async fn a_request_for_a_missing_node_is_explained_then_collected() -> Result<()> {
    let (client, ns, _) = collecting_setup("ghost", 0).await?;
    let monitor = InvariantMonitor::start(Testbed::shared().await?, Scope::new(&ns, &[])).await?;
    let cluster = collecting_cluster().await?;
    let ghost = unique_name("ghost-node");
    let late_prefix = unique_name("late-node");
    let late = format!("{late_prefix}-0");
    let created = Instant::now();
    request_node(&client, &ns, "ghost", &ghost, "gc.example.com").await?;
    // `late`'s node is created after the request, within the grace: that request goes on as
    // usual (kept from collection once Ready: this cluster collects Ready requests after 3 s).
    let mut late_request = NodeMaintenance::new("late", request_spec(&late, "gc.example.com"));
    late_request
        .annotations_mut()
        .insert(GC_IGNORE_ANNOTATION.into(), "true".into());
    Api::<NodeMaintenance>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &late_request)
        .await?;
    let late_nodes = create_nodes(&client, &late_prefix, 1, &[]).await?;
    ensure!(late_nodes == [late.clone()], "node names {late_nodes:?}");

    let pending = wait_request(
        &client,
        &ns,
        "ghost",
        "the missing node explained",
        WAIT,
        |r| {
            r.condition(condition_type::READY).is_some_and(|c| {
                c.message.contains("not found") && c.message.contains("deleted at")
            })
        },
    )
    .await?;
    ensure!(pending.phase() == Phase::Pending, "{}", describe(&pending));
    wait_request_gone(&client, &ns, "ghost", WAIT).await?;
    let waited = created.elapsed();
    // The grace counts from creationTimestamp, which the API server keeps in whole seconds: up
    // to a second before our clock's creation.
    ensure!(
        waited + Duration::from_secs(1) >= Duration::from_secs(COLLECT_AFTER_SECONDS),
        "collected after {waited:?}, before the grace of {COLLECT_AFTER_SECONDS}s"
    );
    let note = wait_event(&client, &ns, "ghost", "GarbageCollected", WAIT)
        .await?
        .note
        .unwrap_or_default();
    ensure!(note.contains(&ghost), "the Event names the node: {note}");
    let collected = cluster
        .operator
        .metric("maintenance_operator_requests_garbage_collected_total{cause=\"node_not_found\"}")
        .await?;
    ensure!(collected >= 1.0);

    wait_nodes_ready(&client, &late_nodes, WAIT).await?;
    wait_phase(&client, &ns, "late", Phase::Ready, WAIT).await?;
    release_request(&client, &ns, "late", WAIT).await?;
    monitor.held().await
}

// ---------------------------------------------------------------------------------------------
// The CRD: requestorID validation and selectable fields, as NVIDIA's CRD

#[tokio::test]
async fn the_api_server_refuses_a_requestor_id_nvidia_refuses() -> Result<()> {
    let (client, ns, nodes) = collecting_setup("rid", 1).await?;
    let monitor =
        InvariantMonitor::start(Testbed::shared().await?, Scope::new(&ns, &nodes)).await?;
    let api: Api<NodeMaintenance> = Api::namespaced(client.clone(), &ns);
    let cases = [
        ("x", "at least 2"),
        ("-starts-with-dash", "should match"),
        ("has_underscore", "should match"),
        (&*"a".repeat(64), "more than 63"),
    ];
    for (i, (requestor, expected)) in cases.iter().enumerate() {
        let nm = NodeMaintenance::new(&format!("bad-{i}"), request_spec(&nodes[0], requestor));
        match api.create(&PostParams::default(), &nm).await {
            Ok(_) => bail!("requestorID {requestor:?} was accepted"),
            Err(err) => {
                let (code, message) = api_error(&err).context("an API error")?;
                ensure!(code == 422, "requestorID {requestor:?}: {code} {message}");
                ensure!(
                    message.contains("requestorID") && message.contains(expected),
                    "requestorID {requestor:?}: {message}"
                );
            }
        }
    }
    for requestor in ["network.nvidia.com", "A1", &"b".repeat(63)] {
        let mut nm = NodeMaintenance::new(
            &format!("ok-{}", requestor.len()),
            request_spec(&nodes[0], requestor),
        );
        nm.annotations_mut()
            .insert(GC_IGNORE_ANNOTATION.into(), "true".into());
        api.create(&PostParams::default(), &nm)
            .await
            .with_context(|| format!("requestorID {requestor:?} must be accepted"))?;
        release_request(&client, &ns, &nm.name_any(), WAIT).await?;
    }
    // Deleted at once, a request may race its admission: the API server's DELETE, which found no
    // finalizer, can go through after the admission added ours, so the request vanishes while its
    // actor cordons. The actor then undoes the cordon (`lifecycle::on_request_gone`), a moment
    // after the request is gone rather than before: waited for, with a deadline.
    wait_for(
        &format!(
            "{} to be schedulable once every request on it is gone",
            nodes[0]
        ),
        Duration::from_secs(10),
        || async { Ok((!node_unschedulable(&client, &nodes[0]).await?).then_some(())) },
    )
    .await?;
    monitor.held().await
}

#[tokio::test]
async fn requests_can_be_selected_by_node_name_and_requestor_id() -> Result<()> {
    let (client, ns, nodes) = collecting_setup("sel", 3).await?;
    let monitor =
        InvariantMonitor::start(Testbed::shared().await?, Scope::new(&ns, &nodes)).await?;
    let cluster = collecting_cluster().await?;
    let api: Api<NodeMaintenance> = Api::namespaced(client.clone(), &ns);
    for (i, (node, requestor)) in [
        (&nodes[0], "network.example.com"),
        (&nodes[1], "network.example.com"),
        (&nodes[2], "gpu.example.com"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut nm = NodeMaintenance::new(&format!("nm-{i}"), request_spec(node, requestor));
        nm.annotations_mut()
            .insert(GC_IGNORE_ANNOTATION.into(), "true".into());
        api.create(&PostParams::default(), &nm).await?;
    }
    let names = |items: Vec<NodeMaintenance>| {
        let mut names: Vec<String> = items.iter().map(|r| r.name_any()).collect();
        names.sort();
        names
    };
    let by_node = api
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", nodes[1])))
        .await?;
    ensure!(names(by_node.items) == ["nm-1"]);
    let by_requestor = api
        .list(&ListParams::default().fields("spec.requestorID=network.example.com"))
        .await?;
    ensure!(names(by_requestor.items) == ["nm-0", "nm-1"]);

    // The documented command, verbatim.
    let out = support::chart::run(
        support::chart::kubectl(cluster.testbed)
            .args(["get", "nm", "-n", &ns, "--field-selector"])
            .arg(format!("spec.nodeName={}", nodes[2]))
            .args(["-o", "name"]),
    )?;
    ensure!(
        out.trim() == "nodemaintenance.maintenance.nvidia.com/nm-2",
        "kubectl printed {out:?}"
    );
    release_all_when_ready(&client, &ns, WAIT).await?;
    monitor.held().await
}

// ---------------------------------------------------------------------------------------------
// Adoption of what NVIDIA's operator left mid-flight

/// Writes a NodeMaintenance the way NVIDIA's controller leaves it in `reason`: its finalizer, the
/// Node as owner, the annotations it writes by then, and a `Ready` condition whose
/// `lastTransitionTime` is the first Pending (`pending_since`), because `meta.SetStatusCondition`
/// moves it only when the status changes (False for every phase before Ready).
struct NvidiaShape<'a> {
    name: &'a str,
    node: &'a str,
    reason: Phase,
    spec: serde_json::Value,
    annotations: BTreeMap<&'a str, String>,
    status_extra: serde_json::Value,
}

async fn write_nvidia_shape(
    client: &Client,
    ns: &str,
    pending_since: jiff::Timestamp,
    shape: &NvidiaShape<'_>,
) -> Result<()> {
    let node: Node = Api::<Node>::all(client.clone()).get(shape.node).await?;
    let api: Api<NodeMaintenance> = Api::namespaced(client.clone(), ns);
    let mut spec =
        json!({"requestorID": "network.nvidia.com", "nodeName": shape.node, "cordon": true});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), shape.spec.as_object()) {
        spec.extend(extra.clone());
    }
    let object = json!({
        "apiVersion": "maintenance.nvidia.com/v1alpha1",
        "kind": "NodeMaintenance",
        "metadata": {
            "name": shape.name,
            "namespace": ns,
            "finalizers": [FINALIZER],
            "annotations": shape.annotations,
            // NVIDIA's Reconcile sets the Node as owner (k8sutils.SetOwnerRef).
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": shape.node,
                "uid": node.uid().context("node uid")?,
            }],
        },
        "spec": spec,
    });
    let created: NodeMaintenance = serde_json::from_value(object)?;
    let created = api.create(&PostParams::default(), &created).await?;
    let ready = shape.reason == Phase::Ready;
    let mut status = json!({
        "conditions": [{
            "type": condition_type::READY,
            "status": if ready { "True" } else { "False" },
            "reason": shape.reason.as_str(),
            "message": "",
            "observedGeneration": created.metadata.generation,
            // Ready is a status change, so NVIDIA's time moved there; every other phase keeps
            // the first Pending's.
            "lastTransitionTime": rfc3339(if ready { ago(60) } else { pending_since }),
        }],
    });
    if let (Some(status), Some(extra)) = (status.as_object_mut(), shape.status_extra.as_object()) {
        status.extend(extra.clone());
    }
    api.patch_status(
        shape.name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .with_context(|| format!("writing the status of {ns}/{}", shape.name))?;
    Ok(())
}

/// NVIDIA's `HandleCordon`: the initial state first, then the cordon.
fn cordoned_by_nvidia() -> BTreeMap<&'static str, String> {
    BTreeMap::from([(INITIAL_UNSCHEDULABLE_ANNOTATION, "false".to_string())])
}

#[tokio::test]
async fn every_mid_flight_nvidia_shape_is_adopted_and_finishes_without_early_timeouts() -> Result<()>
{
    let (testbed, client, ns, nodes) = own_cluster("adopt", 8, Some(limits(100, None))).await?;
    let account = "adopter";
    let monitor = monitor_as(&testbed, &ns, &nodes, account).await?;
    let [
        scheduled,
        cordon,
        wait,
        wait_late,
        draining,
        ready,
        deleting,
        pending,
    ] = <[String; 8]>::try_from(nodes.clone()).map_err(|_| anyhow::anyhow!("8 nodes"))?;
    for node in [&cordon, &wait, &wait_late, &draining, &ready, &deleting] {
        cordon_node(&client, node).await?;
    }

    // Workloads: a job NVIDIA waits for, and a Deployment whose PDB allows no disruption on the
    // draining node.
    let job = |name: &str, node: &str| {
        let (client, ns, name, node) = (
            client.clone(),
            ns.clone(),
            name.to_string(),
            node.to_string(),
        );
        async move {
            let opts = BarePodOptions {
                labels: BTreeMap::from([("role".to_string(), "job".to_string())]),
                ..Default::default()
            };
            create_bare_pod(&client, &ns, &name, &node, &opts).await
        }
    };
    job("job-wait", &wait).await?;
    job("job-late", &wait_late).await?;
    let web = [("app", "web")];
    uncordon_node(&client, &draining).await?;
    create_deployment(
        &client,
        &ns,
        "web",
        2,
        &web,
        &PodSpecOptions::on_node(&draining),
    )
    .await?;
    let web_pods = wait_pods_ready(&client, &ns, &selector_string(&web), 2, WAIT).await?;
    cordon_node(&client, &draining).await?;
    create_pdb_min_available(&client, &ns, "web", &web, IntOrString::Int(2)).await?;
    wait_pdb_disruptions_allowed(&client, &ns, "web", 0, WAIT).await?;
    wait_pods_ready(&client, &ns, "role=job", 2, WAIT).await?;

    let pending_since = ago(3600);
    let wait_spec =
        json!({"waitForPodCompletion": {"podSelector": "role=job", "timeoutSeconds": 600}});
    let shapes = [
        NvidiaShape {
            name: "scheduled",
            node: &scheduled,
            reason: Phase::Scheduled,
            spec: json!({}),
            annotations: BTreeMap::new(),
            status_extra: json!({}),
        },
        NvidiaShape {
            name: "cordon",
            node: &cordon,
            reason: Phase::Cordon,
            spec: json!({}),
            annotations: cordoned_by_nvidia(),
            status_extra: json!({}),
        },
        // NVIDIA started waiting 10 s ago: 590 s are left.
        NvidiaShape {
            name: "wait",
            node: &wait,
            reason: Phase::WaitForPodCompletion,
            spec: wait_spec.clone(),
            annotations: {
                let mut a = cordoned_by_nvidia();
                a.insert(WAIT_POD_COMPLETION_START_ANNOTATION, rfc3339(ago(10)));
                a
            },
            status_extra: json!({"waitForCompletion": [format!("{ns}/job-wait")]}),
        },
        // NVIDIA started waiting 590 s ago: the timeout falls 10 s after the adoption.
        NvidiaShape {
            name: "wait-late",
            node: &wait_late,
            reason: Phase::WaitForPodCompletion,
            spec: wait_spec,
            annotations: {
                let mut a = cordoned_by_nvidia();
                a.insert(WAIT_POD_COMPLETION_START_ANNOTATION, rfc3339(ago(590)));
                a
            },
            status_extra: json!({"waitForCompletion": [format!("{ns}/job-late")]}),
        },
        NvidiaShape {
            name: "draining",
            node: &draining,
            reason: Phase::Draining,
            spec: json!({"drainSpec": {"force": false, "timeoutSeconds": 15, "deleteEmptyDir": false}}),
            annotations: cordoned_by_nvidia(),
            status_extra: json!({"drain": {
                "totalPods": 2, "evictionPods": 2, "drainProgress": 0,
                "waitForEviction": web_pods.iter().map(|p| format!("{ns}/{}", p.name_any())).collect::<Vec<_>>(),
            }}),
        },
        NvidiaShape {
            name: "ready",
            node: &ready,
            reason: Phase::Ready,
            spec: json!({}),
            annotations: {
                let mut a = cordoned_by_nvidia();
                a.insert(READY_TIME_ANNOTATION, rfc3339(ago(60)));
                a
            },
            status_extra: json!({}),
        },
        NvidiaShape {
            name: "deleting",
            node: &deleting,
            reason: Phase::Draining,
            spec: json!({"drainSpec": {"force": true, "timeoutSeconds": 300}}),
            annotations: cordoned_by_nvidia(),
            status_extra: json!({}),
        },
        // Pending under NVIDIA (its scheduler never admitted it): ours admits it.
        NvidiaShape {
            name: "pending",
            node: &pending,
            reason: Phase::Pending,
            spec: json!({}),
            annotations: BTreeMap::new(),
            status_extra: json!({}),
        },
    ];
    for shape in &shapes {
        write_nvidia_shape(&client, &ns, pending_since, shape).await?;
    }
    // NVIDIA had not finished cleaning up this one when it was stopped.
    Api::<NodeMaintenance>::namespaced(client.clone(), &ns)
        .delete("deleting", &DeleteParams::default())
        .await?;

    let mut operator = Operator::start_as(&testbed, account, &[]).await?;
    let adopted_from = jiff::Timestamp::now();

    // Deleting: cleaned up at once, node uncordoned.
    wait_request_gone(&client, &ns, "deleting", WAIT).await?;
    ensure!(
        !node_unschedulable(&client, &deleting).await?,
        "the uncordon owed on deletion"
    );

    // Every other shape past Pending is adopted (annotation, Event, counter).
    for name in [
        "scheduled",
        "cordon",
        "wait",
        "wait-late",
        "draining",
        "ready",
    ] {
        wait_request(&client, &ns, name, "adopted", WAIT, |r| {
            annotation(r, ADMITTED_TIME_ANNOTATION).is_some()
        })
        .await?;
    }
    wait_event(&client, &ns, "draining", "Adopted", WAIT).await?;

    // WaitForPodCompletion: counted from NVIDIA's start, not from its stale lastTransitionTime
    // (an hour ago, which would time out at once).
    let timed_out = wait_event(
        &client,
        &ns,
        "wait-late",
        "WaitForPodCompletionTimeout",
        WAIT,
    )
    .await?
    .note
    .unwrap_or_default();
    let after = jiff::Timestamp::now().duration_since(adopted_from);
    ensure!(
        after >= jiff::SignedDuration::from_secs(5),
        "wait-late timed out {after:?} after the adoption, before NVIDIA's 600 s were up: {timed_out}"
    );
    let why = "590 s of the wait are left";
    ensure_phase(&client, &ns, "wait", Phase::WaitForPodCompletion, why).await?;
    let reasons: Vec<String> = events_about(&client, &ns, "wait")
        .await?
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    ensure!(
        !reasons.iter().any(|r| r == "WaitForPodCompletionTimeout"),
        "{reasons:?}"
    );
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("job-wait", &DeleteParams::default().grace_period(0))
        .await?;
    wait_phase(&client, &ns, "wait", Phase::Ready, WAIT).await?;

    // Draining: the 15 s drain timeout counts from the adoption, not from an hour ago.
    let failed = wait_request(&client, &ns, "draining", "DrainTimeout", WAIT, |r| {
        r.condition(condition_type::FAILED).is_some()
    })
    .await?;
    let failed_at = failed
        .condition(condition_type::FAILED)
        .map(|c| c.last_transition_time.0)
        .context("Failed condition")?;
    let admitted: jiff::Timestamp = annotation(&failed, ADMITTED_TIME_ANNOTATION)
        .context("admitted-time")?
        .parse()?;
    ensure!(
        failed_at.duration_since(admitted) >= jiff::SignedDuration::from_secs(14),
        "the drain timed out at {failed_at}, less than 15 s after the adoption at {admitted}"
    );
    // Relax the budget: the drain finishes.
    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(client.clone(), &ns)
        .delete("web", &DeleteParams::default())
        .await?;
    wait_phase(&client, &ns, "draining", Phase::Ready, WAIT).await?;

    for name in ["scheduled", "cordon", "ready", "pending"] {
        wait_phase(&client, &ns, name, Phase::Ready, WAIT).await?;
    }
    for node in [&scheduled, &cordon, &wait, &draining, &ready, &pending] {
        ensure!(
            node_unschedulable(&client, node).await?,
            "{node} is cordoned while Ready"
        );
    }

    // The requestor releases everything: every node NVIDIA or we cordoned is uncordoned.
    release_all_when_ready(&client, &ns, WAIT).await?;
    for node in &nodes {
        if node != &wait_late {
            ensure!(
                !node_unschedulable(&client, node).await?,
                "{node} left cordoned"
            );
        }
    }

    // No second cordon: our operator wrote the nodes NVIDIA had cordoned only to uncordon them.
    let user = service_account_user(account);
    let node_writes = |log: &AuditLog, node: &str| -> usize {
        log.writes_by(&user)
            .iter()
            .filter(|w| w.resource == "nodes" && w.name == node && (200..300).contains(&w.code))
            .count()
    };
    let log = wait_for("the uncordons in the audit log", WAIT, || async {
        let log = AuditLog::read(&testbed)?;
        Ok((node_writes(&log, &cordon) >= 1 && node_writes(&log, &ready) >= 1).then_some(log))
    })
    .await?;
    for node in [&cordon, &wait, &draining, &ready, &deleting] {
        let writes: Vec<String> = log
            .writes_by(&user)
            .iter()
            .filter(|w| w.resource == "nodes" && w.name == *node)
            .map(|w| w.describe())
            .collect();
        ensure!(
            node_writes(&log, node) == 1,
            "{node}: expected only the uncordon by the operator, got {writes:#?}"
        );
    }
    ensure!(
        node_writes(&log, &scheduled) == 2,
        "scheduled: our cordon and uncordon"
    );
    let adopted = operator
        .metric("maintenance_operator_requests_adopted_total")
        .await?;
    ensure!(adopted >= 6.0, "adopted counter {adopted}");
    operator.kill();
    monitor.held().await
}
