//! The edges of the node lifecycle (`core/src/lifecycle.rs`) on a live control plane: deletion in
//! each phase with and without additional requestors, the node deleted under a request, spec
//! fields removed mid-phase, `spec.cordon` turned off mid-maintenance, RequestorFailed before
//! Ready, a drain timeout after an earlier InvalidSpec, pods that arrive during a drain, a
//! `Ready` reason this operator does not know, and an uncordon the API server refuses.
//!
//! Every assertion is on what the API server shows (the node's `spec.unschedulable`, the request
//! and its conditions, pods), with deadlines. Tests that depend on `maxParallelOperations: 1`
//! start a control plane of their own (the limits count every node of the cluster); the others
//! share the binary's cluster, each in its own namespace on its own nodes.
//!
//! `MAINTENANCE_OPERATOR_BIN=<path>` runs them against another build of the operator, so that each
//! can be shown to fail without the fix it covers.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use maintenance_crds::{
    DrainSpec, FINALIZER, INITIAL_UNSCHEDULABLE_ANNOTATION, NodeMaintenance, Phase,
    WaitForPodCompletionSpec, condition_type,
};
use support::invariants::*;
use support::operator::*;
use support::policy::{NodeUpdatePolicy, Rule};
use support::*;

/// Deadline of every wait for something the operator must do.
const WAIT: Duration = Duration::from_secs(60);
/// Deadline for what must happen "at once" (no drain, no timer to wait for).
const AT_ONCE: Duration = Duration::from_secs(20);
/// A finalizer of the requestor's own, which keeps a released request visible.
const REQUESTOR_FINALIZER: &str = "decom.example.com/keep";

// ---------------------------------------------------------------------------------------------
// Helpers

fn failed_reason(r: &NodeMaintenance) -> Option<&str> {
    r.condition(condition_type::FAILED)
        .map(|c| c.reason.as_str())
}

/// A JSON merge patch of the request's spec.
async fn patch_spec(client: &Client, ns: &str, name: &str, spec: serde_json::Value) -> Result<()> {
    patch_request(client, ns, name, serde_json::json!({ "spec": spec })).await?;
    Ok(())
}

/// Plays the requestor: sets its `RequestorFailed` condition to True or False, keeping the other
/// conditions; conditional on the resourceVersion read, retried on conflict with the operator.
async fn set_requestor_failed(client: &Client, ns: &str, name: &str, failed: bool) -> Result<()> {
    let api: Api<NodeMaintenance> = Api::namespaced(client.clone(), ns);
    let what = format!("RequestorFailed={failed} written on NodeMaintenance {ns}/{name}");
    wait_for(&what, WAIT, || {
        let api = api.clone();
        async move {
            let current = api.get(name).await?;
            let mut conditions = current.status.clone().unwrap_or_default().conditions;
            conditions.retain(|c| c.type_ != condition_type::REQUESTOR_FAILED);
            conditions.push(Condition {
                type_: condition_type::REQUESTOR_FAILED.into(),
                status: if failed { "True" } else { "False" }.into(),
                reason: if failed {
                    "FirmwareUpdateFailed"
                } else {
                    "FirmwareUpdateRetried"
                }
                .into(),
                message: if failed {
                    "flashing failed"
                } else {
                    "retrying"
                }
                .into(),
                last_transition_time: Time(jiff::Timestamp::now()),
                observed_generation: None,
            });
            let patch = serde_json::json!({
                "metadata": {"resourceVersion": current.resource_version()},
                "status": {"conditions": conditions},
            });
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            Ok(Some(()))
        }
    })
    .await
}

/// A bare pod labelled `labels` on `node`, Ready.
async fn running_bare_pod(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    labels: &[(&str, &str)],
) -> Result<Pod> {
    let opts = BarePodOptions {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    create_bare_pod(client, ns, name, node, &opts).await?;
    let pods = wait_pods_ready(client, ns, &selector_string(labels), 1, WAIT).await?;
    pods.into_iter()
        .next()
        .with_context(|| format!("pod {ns}/{name} is not Ready"))
}

fn wait_for_pods(selector: &str) -> Option<WaitForPodCompletionSpec> {
    Some(WaitForPodCompletionSpec {
        pod_selector: Some(selector.into()),
        timeout_seconds: Some(0),
    })
}

fn drain_selected(selector: &str, timeout_seconds: i32, force: bool) -> Option<DrainSpec> {
    Some(DrainSpec {
        force: Some(force),
        pod_selector: Some(selector.into()),
        timeout_seconds: Some(timeout_seconds),
        ..DrainSpec::default()
    })
}

async fn delete_node(client: &Client, node: &str) -> Result<()> {
    Api::<Node>::all(client.clone())
        .delete(node, &Default::default())
        .await
        .with_context(|| format!("deleting node {node}"))?;
    Ok(())
}

fn owned_by_node(r: &NodeMaintenance, node: &str) -> bool {
    r.owner_references()
        .iter()
        .any(|o| o.kind == "Node" && o.name == node)
}

/// A control plane of its own with `maxParallelOperations: 1`, `count` Ready nodes and a
/// namespace; the operator is started by the test.
async fn limited_cluster(
    prefix: &str,
    count: usize,
) -> Result<(Testbed, Client, String, Vec<String>)> {
    own_cluster(prefix, count, Some(limits(1, None))).await
}

// ---------------------------------------------------------------------------------------------
// 1. Deletion and additional requestors

/// Deleted while `Draining`, a request with `additionalRequestors` is cleaned up at once (NVIDIA's
/// `handleDrainStateDelete` does not look at them); deleted in `Ready`, it waits until the list is
/// empty.
///
/// The second half ports "Full lifecycle of NodeMaintenance" of
/// `internal/controller/nodemaintenance_controller_test.go` (github.com/Mellanox/maintenance-operator):
/// waitForPodCompletion and drain with pod selectors, an additional requestor added while waiting,
/// the wait pod deleted -> Draining -> Ready, the node cordoned, the initial-state annotation
/// "false", the phase Events; deleted, the object stays and the node stays cordoned until the
/// additional requestors are removed, then the node is uncordoned and the object is gone.
#[tokio::test]
async fn deletion_while_draining_ignores_additional_requestors_but_deletion_when_ready_waits()
-> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("edge-addreq", 2).await?;
    let (client, ns) = (&client, ns.as_str());

    let while_draining = async {
        let node = &nodes[0];
        blocked_workload(client, ns, "held", node, 2, WAIT).await?;
        let mut spec = request_spec(node, "first.example.com");
        spec.additional_requestors = Some(vec!["other".into()]);
        spec.drain_spec = drain_selected("app=held", 0, false);
        create_request(client, ns, "draining", spec).await?;
        wait_phase(client, ns, "draining", Phase::Draining, WAIT).await?;
        ensure!(
            node_unschedulable(client, node).await?,
            "{node} not cordoned while draining"
        );
        delete_request(client, ns, "draining").await?;
        wait_request_gone(client, ns, "draining", AT_ONCE)
            .await
            .context(
                "a request deleted while Draining must go at once, additionalRequestors or not",
            )?;
        ensure!(
            !node_unschedulable(client, node).await?,
            "{node} left cordoned after the request deleted while Draining went away"
        );
        anyhow::Ok(())
    };

    let when_ready = async {
        let node = &nodes[1];
        let wait_pod =
            running_bare_pod(client, ns, "test-pod", node, &[("for", "wait-completion")]).await?;
        running_bare_pod(client, ns, "test-pod-2", node, &[("for", "drain")]).await?;
        let mut spec = request_spec(node, "some-operator.nvidia.com");
        spec.wait_for_pod_completion = wait_for_pods("for=wait-completion");
        spec.drain_spec = drain_selected("for=drain", 60, true);
        create_request(client, ns, "test-nm", spec).await?;
        wait_phase(client, ns, "test-nm", Phase::WaitForPodCompletion, WAIT).await?;

        patch_spec(
            client,
            ns,
            "test-nm",
            serde_json::json!({"additionalRequestors": ["another-requestor.nvidia.com"]}),
        )
        .await?;
        Api::<Pod>::namespaced(client.clone(), ns)
            .delete("test-pod", &Default::default())
            .await
            .context("deleting the pod waited for")?;
        wait_pod_gone(
            client,
            ns,
            "test-pod",
            wait_pod.metadata.uid.as_deref(),
            WAIT,
        )
        .await?;
        // Draining is short (one bare pod, forced): Ready is what must be reached.
        let ready = wait_phase(client, ns, "test-nm", Phase::Ready, WAIT).await?;
        ensure!(
            node_unschedulable(client, node).await?,
            "{node} not cordoned in Ready"
        );
        assert_eq!(
            ready
                .annotations()
                .get(INITIAL_UNSCHEDULABLE_ANNOTATION)
                .map(String::as_str),
            Some("false")
        );
        ensure!(
            pods_on_node(client, ns, node).await?.is_empty(),
            "the drained pod is still on {node}"
        );
        wait_for("the phase Events", WAIT, || async {
            let reasons = event_reasons(client, ns, "test-nm").await?;
            // No Cordon: the Scheduled step cordons and writes the next phase.
            let all = [
                "Pending",
                "Scheduled",
                "WaitForPodCompletion",
                "Draining",
                "Ready",
            ]
            .iter()
            .all(|want| reasons.iter().any(|r| r == want));
            Ok(all.then_some(()))
        })
        .await?;

        delete_request(client, ns, "test-nm").await?;
        let held = wait_request(
            client,
            ns,
            "test-nm",
            "deletion held, the Ready condition naming the additional requestor",
            WAIT,
            |r| {
                r.is_deleting()
                    && r.condition(condition_type::READY)
                        .is_some_and(|c| c.message.contains("another-requestor.nvidia.com"))
            },
        )
        .await?;
        assert_eq!(held.phase(), Phase::Ready);
        assert!(held.finalizers().iter().any(|f| f == FINALIZER));
        ensure!(
            node_unschedulable(client, node).await?,
            "{node} uncordoned while another requestor still holds it"
        );

        patch_spec(
            client,
            ns,
            "test-nm",
            serde_json::json!({"additionalRequestors": null}),
        )
        .await?;
        wait_request_gone(client, ns, "test-nm", AT_ONCE).await?;
        ensure!(
            !node_unschedulable(client, node).await?,
            "{node} left cordoned after the last requestor let go"
        );
        anyhow::Ok(())
    };

    tokio::try_join!(while_draining, when_ready)?;
    monitor.held().await
}

// ---------------------------------------------------------------------------------------------
// 2. Deletion while waiting for pods

/// Deleted in `WaitForPodCompletion` (a pod that never finishes, no timeout), the request is
/// cleaned up at once, although it names an additional requestor (only `Ready` and
/// `RequestorFailed` wait for them; NVIDIA's `handleWaitPodCompletionState` does not): the node
/// is uncordoned and the request is gone; the pod is left alone.
#[tokio::test]
async fn deletion_while_waiting_for_pod_completion_uncordons_and_releases_at_once() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("edge-waitdel", 1).await?;
    let node = &nodes[0];
    let pod = running_bare_pod(&client, &ns, "forever", node, &[("role", "batch")]).await?;
    let mut spec = request_spec(node, "wait.example.com");
    spec.additional_requestors = Some(vec!["other".into()]);
    spec.wait_for_pod_completion = wait_for_pods("role=batch");
    create_request(&client, &ns, "m", spec).await?;
    wait_request(
        &client,
        &ns,
        "m",
        "waiting for the running pod",
        WAIT,
        |r| {
            r.phase() == Phase::WaitForPodCompletion
                && r.status
                    .as_ref()
                    .is_some_and(|s| s.wait_for_completion == vec![format!("{ns}/forever")])
        },
    )
    .await?;
    ensure!(
        node_unschedulable(&client, node).await?,
        "{node} not cordoned"
    );

    delete_request(&client, &ns, "m").await?;
    wait_request_gone(&client, &ns, "m", AT_ONCE)
        .await
        .context("a request deleted in WaitForPodCompletion must go at once")?;
    ensure!(
        !node_unschedulable(&client, node).await?,
        "{node} left cordoned"
    );
    let still = pods_on_node(&client, &ns, node).await?;
    ensure!(
        still
            .iter()
            .any(|p| p.metadata.uid == pod.metadata.uid && p.metadata.deletion_timestamp.is_none()),
        "the pod waited for was touched by the cleanup"
    );
    monitor.held().await
}

/// `spec.cordon` turned off while Ready, then the request deleted: the node we cordoned is
/// uncordoned. NVIDIA's `handleTerminalState` (internal/controller/nodemaintenance_controller.go)
/// reads `spec.cordon` at deletion and would leave it cordoned; ours owes the uncordon from the
/// admission's `cordon-requested` annotation.
#[tokio::test]
async fn a_cordon_turned_off_mid_maintenance_is_still_undone() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("edge-cordonoff", 1).await?;
    let node = &nodes[0];
    request_node(&client, &ns, "m", node, "cordon.example.com").await?;
    wait_request(&client, &ns, "m", "Ready", WAIT, |r| {
        r.phase() == Phase::Ready
    })
    .await?;
    ensure!(
        node_unschedulable(&client, node).await?,
        "{node} not cordoned while Ready"
    );
    patch_spec(&client, &ns, "m", serde_json::json!({ "cordon": false })).await?;
    release_request(&client, &ns, "m", AT_ONCE).await?;
    ensure!(
        !node_unschedulable(&client, node).await?,
        "{node} left cordoned after spec.cordon was turned off and the request deleted"
    );
    monitor.held().await
}

/// An uncordon the API server refuses (here a ValidatingAdmissionPolicy: the node must stay
/// cordoned) holds the deletion, as it must: the finalizer stays until the node is uncordoned.
/// The request's Events say so, naming the call, the node and the API server's answer (Warning
/// `StepFailed`; before, only the operator's log did); once the policy no longer applies, the
/// retried step uncordons the node and the request goes.
#[tokio::test]
async fn a_refused_uncordon_holds_the_deletion_and_the_events_say_why() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("edge-refused", 1).await?;
    let node = &nodes[0];
    request_node(&client, &ns, "m", node, "refused.example.com").await?;
    wait_request(&client, &ns, "m", "Ready", WAIT, |r| {
        r.phase() == Phase::Ready
    })
    .await?;
    let label = (
        "edge-refused.maintenance.nvidia.com/stay-cordoned",
        ns.as_str(),
    );
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": { label.0: label.1 } } })),
        )
        .await?;
    let _policy = NodeUpdatePolicy::create(
        &client,
        &ns,
        label,
        Rule {
            expression: "!(has(oldObject.spec.unschedulable) && oldObject.spec.unschedulable) \
                         || (has(object.spec.unschedulable) && object.spec.unschedulable)",
            message: "this node must stay cordoned",
        },
        node,
        serde_json::json!({ "spec": { "unschedulable": false } }),
        WAIT,
    )
    .await?;
    delete_request(&client, &ns, "m").await?;
    let note = wait_for(
        "a StepFailed Event about the refused uncordon",
        WAIT,
        || async {
            Ok(events_about(&client, &ns, "m")
                .await?
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("StepFailed"))
                .and_then(|e| e.note))
        },
    )
    .await?;
    let named = format!("could not uncordon node {node}");
    ensure!(
        note.contains(&named) && note.contains("must stay cordoned"),
        "the StepFailed Event names neither the call nor the answer: {note:?}"
    );
    let held = get_request(&client, &ns, "m")
        .await?
        .context("the request went although its node is still cordoned")?;
    ensure!(
        held.finalizers().iter().any(|f| f == FINALIZER),
        "the deletion went on although {node} is still cordoned: {}",
        describe(&held)
    );
    ensure!(
        node_unschedulable(&client, node).await?,
        "{node} uncordoned in spite of the policy"
    );
    // The policy's binding selects the node by this label: without it, the uncordon goes through.
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": { label.0: null } } })),
        )
        .await?;
    // The backoff of a failing step is 30 s at most.
    wait_request_gone(&client, &ns, "m", WAIT).await?;
    ensure!(
        !node_unschedulable(&client, node).await?,
        "{node} still cordoned after the request went"
    );
    monitor.held().await
}

// ---------------------------------------------------------------------------------------------
// 3. The node is deleted

/// With `maxParallelOperations: 1`: the node of a `Draining` request is deleted; the request is
/// released (our finalizer removed, the object deleted by the garbage collector as the Node was
/// its owner) and the slot goes to the next request at once. The request also carries a
/// finalizer of its requestor's, so it stays visible after the release: a request whose node is
/// gone takes no slot even while its object remains. A request held `Pending` carries its node as
/// owner too, and goes away with its node.
#[tokio::test]
async fn a_deleted_node_releases_its_request_and_frees_the_slot() -> Result<()> {
    let (testbed, client, ns, nodes) = limited_cluster("edge-gone", 3).await?;
    let monitor = InvariantMonitor::start(&testbed, Scope::new(&ns, &nodes)).await?;
    let (client, ns) = (&client, ns.as_str());
    blocked_workload(client, ns, "held", &nodes[0], 2, WAIT).await?;
    let operator = Operator::start(&testbed, &[]).await?;

    let mut spec = request_spec(&nodes[0], "decom.example.com");
    spec.drain_spec = drain_selected("app=held", 0, false);
    let mut draining = NodeMaintenance::new("draining", spec);
    draining.metadata.finalizers = Some(vec![REQUESTOR_FINALIZER.into()]);
    let requests: Api<NodeMaintenance> = Api::namespaced(client.clone(), ns);
    requests
        .create(&PostParams::default(), &draining)
        .await
        .context("creating NodeMaintenance draining")?;
    wait_phase(client, ns, "draining", Phase::Draining, WAIT).await?;
    // Older first: `next` is admitted before `last` once a slot is free.
    request_node(client, ns, "next", &nodes[1], "b.example.com").await?;
    request_node(client, ns, "last", &nodes[2], "c.example.com").await?;
    for name in ["next", "last"] {
        wait_request(
            client,
            ns,
            name,
            "Pending, seen by the operator",
            WAIT,
            |r| r.phase() == Phase::Pending && r.condition(condition_type::READY).is_some(),
        )
        .await?;
    }
    wait_scheduler_rounds(&operator, 2).await?;
    let why = "precondition: the slot is taken by the draining request, yet next is not Pending";
    ensure_phase(client, ns, "next", Phase::Pending, why).await?;

    delete_node(client, &nodes[0]).await?;
    let released = wait_request(
        client,
        ns,
        "draining",
        "released: our finalizer removed, deleted by the garbage collector",
        WAIT,
        |r| r.is_deleting() && !r.finalizers().iter().any(|f| f == FINALIZER),
    )
    .await?;
    assert_eq!(released.finalizers(), [REQUESTOR_FINALIZER.to_string()]);
    wait_phase(client, ns, "next", Phase::Ready, WAIT)
        .await
        .context("the slot of the deleted node must go to the next request")?;
    // The requestor lets go of its object.
    let no_finalizers = serde_json::json!({"metadata": {"finalizers": null}});
    patch_request(client, ns, "draining", no_finalizers).await?;
    wait_request_gone(client, ns, "draining", WAIT).await?;
    ensure!(
        node_unschedulable(client, &nodes[1]).await?,
        "{} not cordoned",
        nodes[1]
    );

    // `last` waits behind `next`; its node goes away.
    wait_request(
        client,
        ns,
        "last",
        "Pending with its node as owner",
        WAIT,
        |r| r.phase() == Phase::Pending && owned_by_node(r, &nodes[2]),
    )
    .await?;
    delete_node(client, &nodes[2]).await?;
    wait_request_gone(client, ns, "last", WAIT)
        .await
        .context("a Pending request must go away with its node")?;

    // A Ready request whose deletion waits for additionalRequestors is released too when its
    // node goes: nothing is left to hand back.
    requests
        .patch(
            "next",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"additionalRequestors": ["fw.example.com"]}}),
            ),
        )
        .await
        .context("adding an additional requestor to next")?;
    delete_request(client, ns, "next").await?;
    wait_request(
        client,
        ns,
        "next",
        "deletion held by the additional requestor",
        WAIT,
        |r| {
            r.is_deleting()
                && r.condition(condition_type::READY)
                    .is_some_and(|c| c.message.contains("fw.example.com"))
        },
    )
    .await?;
    delete_node(client, &nodes[1]).await?;
    wait_request_gone(client, ns, "next", WAIT)
        .await
        .context("a held deletion must be released when the node is gone")?;
    monitor.held().await
}

// ---------------------------------------------------------------------------------------------
// 4. Spec fields removed mid-phase

/// `waitForPodCompletion` removed while waiting moves the request on: to `Ready` without a
/// drain spec, to `Draining` with one; `drainSpec` removed while draining (blocked by a PDB)
/// moves it to `Ready`. The pods waited for, and the pod the PDB protects, stay.
#[tokio::test]
async fn removing_wait_for_pod_completion_or_drain_spec_mid_phase_moves_on() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("edge-specrm", 2).await?;
    let (client, ns) = (&client, ns.as_str());

    let wait_then_ready = async {
        let node = &nodes[0];
        let pod = running_bare_pod(client, ns, "batch-0", node, &[("role", "batch-0")]).await?;
        let mut spec = request_spec(node, "specrm.example.com");
        spec.wait_for_pod_completion = wait_for_pods("role=batch-0");
        create_request(client, ns, "no-drain", spec).await?;
        wait_phase(client, ns, "no-drain", Phase::WaitForPodCompletion, WAIT).await?;
        patch_spec(
            client,
            ns,
            "no-drain",
            serde_json::json!({"waitForPodCompletion": null}),
        )
        .await?;
        let ready = wait_phase(client, ns, "no-drain", Phase::Ready, AT_ONCE)
            .await
            .context("without waitForPodCompletion nor drainSpec, the request must be Ready")?;
        ensure!(
            ready
                .status
                .as_ref()
                .is_some_and(|s| s.wait_for_completion.is_empty()),
            "waitForCompletion still listed: {ready:?}"
        );
        ensure!(
            node_unschedulable(client, node).await?,
            "{node} not cordoned"
        );
        ensure!(
            pods_on_node(client, ns, node)
                .await?
                .iter()
                .any(|p| p.metadata.uid == pod.metadata.uid),
            "the pod waited for is gone: Ready did not come from the spec change"
        );
        anyhow::Ok(())
    };

    let wait_then_drain_then_ready = async {
        let node = &nodes[1];
        running_bare_pod(client, ns, "batch-1", node, &[("role", "batch-1")]).await?;
        let protected = blocked_workload(client, ns, "held", node, 1, WAIT).await?;
        let mut spec = request_spec(node, "specrm.example.com");
        spec.wait_for_pod_completion = wait_for_pods("role=batch-1");
        spec.drain_spec = drain_selected("app=held", 0, false);
        create_request(client, ns, "with-drain", spec).await?;
        wait_phase(client, ns, "with-drain", Phase::WaitForPodCompletion, WAIT).await?;
        patch_spec(
            client,
            ns,
            "with-drain",
            serde_json::json!({"waitForPodCompletion": null}),
        )
        .await?;
        wait_request(
            client,
            ns,
            "with-drain",
            "Draining, the eviction refused by the PDB",
            AT_ONCE,
            |r| {
                r.phase() == Phase::Draining
                    && r.status
                        .as_ref()
                        .and_then(|s| s.drain.as_ref())
                        .is_some_and(|d| d.blocked.iter().any(|b| b.reason == "PDB"))
            },
        )
        .await
        .context("without waitForPodCompletion, the request must move on to Draining")?;
        patch_spec(
            client,
            ns,
            "with-drain",
            serde_json::json!({"drainSpec": null}),
        )
        .await?;
        let ready = wait_phase(client, ns, "with-drain", Phase::Ready, AT_ONCE)
            .await
            .context("without drainSpec, a draining request must be Ready")?;
        ensure!(
            ready.status.as_ref().is_some_and(|s| s.drain.is_none()),
            "drain status kept after drainSpec was removed: {ready:?}"
        );
        ensure!(
            node_unschedulable(client, node).await?,
            "{node} not cordoned"
        );
        let uids: BTreeSet<Option<String>> = pods_on_node(client, ns, node)
            .await?
            .into_iter()
            .map(|p| p.metadata.uid)
            .collect();
        ensure!(
            protected.iter().all(|p| uids.contains(&p.metadata.uid)),
            "the pod protected by the PDB was evicted"
        );
        anyhow::Ok(())
    };

    tokio::try_join!(wait_then_ready, wait_then_drain_then_ready)?;
    monitor.held().await
}

// ---------------------------------------------------------------------------------------------
// 5. RequestorFailed before Ready

/// A requestor that fails while its request waits for pods stops it: `RequestorFailed`, with the
/// node's initial state recorded; clearing the failure resumes it to `Ready` (node cordoned), and
/// deleting it then uncordons.
///
/// The same for a request whose requestor failed while it was still `Pending` (held behind the
/// first one on the same node): once admitted it goes to `RequestorFailed` with the node's
/// initial state recorded before anything else, so that clearing the failure cordons the node on
/// the way to `Ready`, and deleting it uncordons.
#[tokio::test]
async fn requestor_failed_while_waiting_for_pods_stops_then_resumes_to_ready() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("edge-reqfail", 1).await?;
    let node = &nodes[0];
    let pod = running_bare_pod(&client, &ns, "job", node, &[("role", "batch")]).await?;
    let mut spec = request_spec(node, "flaky.example.com");
    spec.wait_for_pod_completion = wait_for_pods("role=batch");
    create_request(&client, &ns, "m", spec).await?;
    wait_phase(&client, &ns, "m", Phase::WaitForPodCompletion, WAIT).await?;
    // A second requestor's request on the same node waits behind the first one, and fails.
    request_node(&client, &ns, "queued", node, "second.example.com").await?;
    wait_request(
        &client,
        &ns,
        "queued",
        "Pending behind the request in progress on its node",
        WAIT,
        |r| {
            r.phase() == Phase::Pending
                && r.condition(condition_type::READY)
                    .is_some_and(|c| c.message.contains("under maintenance"))
        },
    )
    .await?;
    set_requestor_failed(&client, &ns, "queued", true).await?;

    set_requestor_failed(&client, &ns, "m", true).await?;
    let failed = wait_phase(&client, &ns, "m", Phase::RequestorFailed, AT_ONCE)
        .await
        .context("RequestorFailed set during WaitForPodCompletion must stop the request")?;
    assert_eq!(
        failed
            .condition(condition_type::READY)
            .map(|c| c.status.as_str()),
        Some("False")
    );
    assert_eq!(
        failed
            .annotations()
            .get(INITIAL_UNSCHEDULABLE_ANNOTATION)
            .map(String::as_str),
        Some("false"),
        "the initial state of the node must be recorded"
    );
    ensure!(
        node_unschedulable(&client, node).await?,
        "{node} not cordoned"
    );

    // The pod finishes while the requestor is failed; then the requestor clears its failure.
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("job", &Default::default())
        .await
        .context("deleting the pod waited for")?;
    wait_pod_gone(&client, &ns, "job", pod.metadata.uid.as_deref(), WAIT).await?;
    set_requestor_failed(&client, &ns, "m", false).await?;
    wait_phase(&client, &ns, "m", Phase::Ready, WAIT)
        .await
        .context("clearing RequestorFailed must resume the request")?;
    ensure!(
        node_unschedulable(&client, node).await?,
        "{node} not cordoned in Ready"
    );

    release_request(&client, &ns, "m", AT_ONCE).await?;

    // Now the queued request is admitted, and stops at once; the node was schedulable then.
    let failed = wait_phase(&client, &ns, "queued", Phase::RequestorFailed, WAIT)
        .await
        .context("a request whose requestor failed while Pending must stop once admitted")?;
    assert_eq!(
        failed
            .annotations()
            .get(INITIAL_UNSCHEDULABLE_ANNOTATION)
            .map(String::as_str),
        Some("false"),
        "the initial state of the node must be recorded before RequestorFailed"
    );
    ensure!(
        !node_unschedulable(&client, node).await?,
        "{node} left cordoned by the first request"
    );
    set_requestor_failed(&client, &ns, "queued", false).await?;
    wait_phase(&client, &ns, "queued", Phase::Ready, WAIT)
        .await
        .context("clearing RequestorFailed must resume the request")?;
    ensure!(
        node_unschedulable(&client, node).await?,
        "{node} not cordoned when the resumed request is Ready"
    );
    release_request(&client, &ns, "queued", AT_ONCE).await?;
    ensure!(
        !node_unschedulable(&client, node).await?,
        "{node} left cordoned"
    );
    monitor.held().await
}

// ---------------------------------------------------------------------------------------------
// 6. Drain timeout after an InvalidSpec

/// An invalid drain podSelector sets `Failed`/`InvalidSpec`; once fixed, a drain blocked by a PDB
/// past its `timeoutSeconds` reports `Failed`/`DrainTimeout` naming the budget: the earlier
/// failure does not hide the timeout.
#[tokio::test]
async fn drain_timeout_is_reported_after_an_invalid_spec_was_fixed() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("edge-timeout", 1).await?;
    let node = &nodes[0];
    blocked_workload(&client, &ns, "held", node, 1, WAIT).await?;
    let mut spec = request_spec(node, "timeout.example.com");
    spec.drain_spec = drain_selected("a in (b", 5, false);
    create_request(&client, &ns, "m", spec).await?;
    wait_request(&client, &ns, "m", "Failed/InvalidSpec", WAIT, |r| {
        r.phase() == Phase::Draining && failed_reason(r) == Some("InvalidSpec")
    })
    .await?;

    patch_spec(
        &client,
        &ns,
        "m",
        serde_json::json!({"drainSpec": {"podSelector": "app=held"}}),
    )
    .await?;
    let timed_out = wait_request(&client, &ns, "m", "Failed/DrainTimeout", WAIT, |r| {
        r.phase() == Phase::Draining && failed_reason(r) == Some("DrainTimeout")
    })
    .await
    .context("the drain timeout must be reported once the spec is fixed")?;
    let message = timed_out
        .condition(condition_type::FAILED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    ensure!(
        message.contains(&format!("{ns}/held")),
        "the DrainTimeout message does not name the PDB: {message}"
    );
    delete_request(&client, &ns, "m").await?;
    monitor.held().await
}

// ---------------------------------------------------------------------------------------------
// 7. Pods that arrive during the drain

/// With `cordon: false`, a Deployment pinned to the node puts every replacement back on it while
/// the drain runs (no drain timeout): the drain waits only for the pods there when it began, so
/// the request still reaches `Ready`.
#[tokio::test]
async fn pods_arriving_during_a_drain_do_not_hold_it() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("edge-arrive", 1).await?;
    let (client, ns) = (&client, ns.as_str());
    let node = &nodes[0];
    let labels = [("app", "sticky")];
    create_deployment(
        client,
        ns,
        "sticky",
        2,
        &labels,
        &PodSpecOptions::on_node(node),
    )
    .await?;
    let before: BTreeSet<Option<String>> = wait_pods_ready(client, ns, "app=sticky", 2, WAIT)
        .await?
        .into_iter()
        .map(|p| p.metadata.uid)
        .collect();

    let mut spec = request_spec(node, "arrive.example.com");
    spec.cordon = Some(false);
    spec.drain_spec = drain_spec(false, 0);
    create_request(client, ns, "m", spec).await?;
    // Pods seen on the node during the drain that were not there before it.
    let arrived = std::sync::Mutex::new(BTreeSet::new());
    let arrived = &arrived;
    let before = &before;
    wait_until(
        &format!("NodeMaintenance {ns}/m to reach Ready"),
        WAIT,
        || async move {
            let Some(r) = get_request(client, ns, "m").await? else {
                return Ok(Check::Pending("the request is gone".into()));
            };
            if r.phase() == Phase::Draining {
                for p in pods_on_node(client, ns, node).await? {
                    if !before.contains(&p.metadata.uid)
                        && let Ok(mut seen) = arrived.lock()
                    {
                        seen.insert(p.name_any());
                    }
                }
            }
            if r.phase() == Phase::Ready {
                return Ok(Check::Done(()));
            }
            Ok(Check::Pending(describe(&r)))
        },
    )
    .await
    .context("pods that arrive during a drain must not hold it")?;
    let arrived: Vec<String> = arrived
        .lock()
        .map(|s| s.iter().cloned().collect())
        .unwrap_or_default();
    ensure!(
        !arrived.is_empty(),
        "precondition: no pod arrived on {node} during the drain"
    );
    ensure!(
        !node_unschedulable(client, node).await?,
        "{node} cordoned despite cordon: false"
    );
    delete_request(client, ns, "m").await?;
    monitor.held().await
}

// ---------------------------------------------------------------------------------------------
// 8. A Ready reason this operator does not know

/// A request whose `Ready` condition carries a reason unknown to this operator (written by a newer
/// version, say) counts as in progress: with `maxParallelOperations: 1` an older Pending request
/// is not admitted while it exists, and is once it is gone.
#[tokio::test]
async fn a_request_with_an_unknown_ready_reason_holds_a_slot() -> Result<()> {
    let (testbed, client, ns, nodes) = limited_cluster("edge-unknown", 2).await?;
    let monitor = InvariantMonitor::start(&testbed, Scope::new(&ns, &nodes)).await?;
    let (client, ns) = (&client, ns.as_str());
    // The older request, on the first node: first in every tie-break of the admission order, so
    // the one admitted if the unknown one counted as Pending.
    request_node(client, ns, "older", &nodes[0], "b.example.com").await?;
    request_node(client, ns, "unknown", &nodes[1], "a.example.com").await?;
    let condition = Condition {
        type_: condition_type::READY.into(),
        status: "False".into(),
        reason: "SomethingNew".into(),
        message: "written by a newer operator".into(),
        last_transition_time: Time(jiff::Timestamp::now()),
        observed_generation: None,
    };
    Api::<NodeMaintenance>::namespaced(client.clone(), ns)
        .patch_status(
            "unknown",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"conditions": [condition]}})),
        )
        .await
        .context("writing the unknown Ready reason")?;

    let operator = Operator::start(&testbed, &[]).await?;
    wait_request(
        client,
        ns,
        "older",
        "Pending, seen by the operator",
        WAIT,
        |r| r.phase() == Phase::Pending && r.condition(condition_type::READY).is_some(),
    )
    .await?;
    wait_scheduler_rounds(&operator, 3).await?;
    let all = list_requests(client, ns).await?;
    let older = all
        .iter()
        .find(|r| r.name_any() == "older")
        .context("request older is gone")?;
    ensure!(
        older.phase() == Phase::Pending,
        "admitted while a request with an unknown Ready reason exists: {}",
        describe(older)
    );

    // It was taken up as in progress: cordoned, with our finalizer, so deleting it uncordons.
    wait_request(client, ns, "unknown", "carrying our finalizer", WAIT, |r| {
        r.finalizers().iter().any(|f| f == FINALIZER)
    })
    .await?;
    release_request(client, ns, "unknown", WAIT).await?;
    ensure!(
        !node_unschedulable(client, &nodes[1]).await?,
        "{} left cordoned after its request with an unknown reason was deleted",
        nodes[1]
    );
    wait_phase(client, ns, "older", Phase::Ready, WAIT)
        .await
        .context("the slot must be free once the unknown request is gone")?;
    monitor.held().await
}
