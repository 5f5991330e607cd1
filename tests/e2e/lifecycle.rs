//! The whole life of a request on a live control plane: admission, cordon, drain, Ready, cleanup;
//! additional requestors, RequestorFailed, node deletion, and kill-and-restart resume.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use maintenance_core::cordon_mark;
use maintenance_crds::{
    FINALIZER, INITIAL_UNSCHEDULABLE_ANNOTATION, NodeMaintenance, Phase, WaitForPodCompletionSpec,
};
use support::invariants::*;
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test]
async fn full_lifecycle_cordons_drains_and_uncordons() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("life", 3).await?;
    let target = &nodes[0];
    let labels = [("app", "web")];
    // Pods start on the target only; the label then goes to the other nodes too, so that
    // replacements have somewhere to go (a label, not a template change: no rollout).
    set_node_label(&client, target, "pool", Some(&ns)).await?;
    create_deployment(
        &client,
        &ns,
        "web",
        4,
        &labels,
        &PodSpecOptions::on_nodes_labelled("pool", &ns),
    )
    .await?;
    wait_pods_ready(&client, &ns, "app=web", 4, WAIT).await?;
    for node in &nodes[1..] {
        set_node_label(&client, node, "pool", Some(&ns)).await?;
    }
    assert_eq!(pods_on_node(&client, &ns, target).await?.len(), 4);

    let mut spec = request_spec(target, "lifecycle.example.com");
    spec.drain_spec = drain_spec(false, 120);
    create_request(&client, &ns, "maint", spec).await?;
    let ready = wait_phase(&client, &ns, "maint", Phase::Ready, WAIT).await?;

    assert!(node_unschedulable(&client, target).await?, "node cordoned");
    assert!(ready.finalizers().iter().any(|f| f == FINALIZER));
    assert_eq!(
        ready
            .annotations()
            .get(INITIAL_UNSCHEDULABLE_ANNOTATION)
            .map(String::as_str),
        Some("false")
    );
    let condition = ready.condition("Ready").context("Ready condition")?;
    assert_eq!(condition.status, "True");
    let drain = ready
        .status
        .as_ref()
        .and_then(|s| s.drain.clone())
        .context("drain status")?;
    assert_eq!(drain.drain_progress, 100);
    assert!(drain.wait_for_eviction.is_empty());
    let left = pods_on_node(&client, &ns, target).await?;
    assert!(
        left.is_empty(),
        "pods left on the node: {:?}",
        left.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    );
    // The node is owner of the request, so deleting the node removes it.
    assert!(
        ready
            .owner_references()
            .iter()
            .any(|o| o.kind == "Node" && o.name == *target)
    );
    let reasons = wait_for("the phase events", WAIT, || async {
        let reasons = event_reasons(&client, &ns, "maint").await?;
        let all = ["Pending", "Scheduled", "Draining", "Ready"]
            .iter()
            .all(|r| reasons.iter().any(|x| x == r));
        Ok(all.then_some(reasons))
    })
    .await?;
    // Cordon is done by the Scheduled step, without a phase of its own.
    assert!(
        !reasons
            .iter()
            .any(|r| r == "WaitForPodCompletion" || r == "Cordon")
    );

    release_request(&client, &ns, "maint", WAIT).await?;
    assert!(
        !node_unschedulable(&client, target).await?,
        "node uncordoned"
    );
    monitor.held().await
}

#[tokio::test]
async fn cordon_false_leaves_the_node_schedulable() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("nocordon", 1).await?;
    let mut spec = request_spec(&nodes[0], "nocordon.example.com");
    spec.cordon = Some(false);
    create_request(&client, &ns, "m", spec).await?;
    let ready = wait_phase(&client, &ns, "m", Phase::Ready, WAIT).await?;
    // `cordon: false` survived the round trip through the API server and the operator.
    assert_eq!(ready.spec.cordon, Some(false));
    assert!(!node_unschedulable(&client, &nodes[0]).await?);
    release_request(&client, &ns, "m", WAIT).await?;
    monitor.held().await
}

/// `admission.protectFromAutoscalers` (default on): from the admission to the release the node
/// carries cluster-autoscaler's `scale-down-disabled` and Karpenter's `do-not-disrupt`. On a node
/// we cordon they are written with the cordon and removed with the uncordon; on a node we do not
/// (`cordon: false`, or one someone cordoned before us) by writes of their own, marked
/// `protected-by`, which leave `spec.unschedulable` as it was. One the node carried before is
/// left alone.
#[tokio::test]
async fn the_autoscalers_are_kept_off_every_node_in_maintenance_until_the_release() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("autoscale", 4).await?;
    let (plain, kept, uncordoned, cordoned) = (&nodes[0], &nodes[1], &nodes[2], &nodes[3]);
    let nodes_api: Api<Node> = Api::all(client.clone());
    // Someone keeps Karpenter off `kept` on purpose, and cordons `cordoned` for reasons of theirs.
    let theirs = serde_json::json!({ "metadata": { "annotations": {
        cordon_mark::DO_NOT_DISRUPT_ANNOTATION: "true",
    } } });
    nodes_api
        .patch(kept, &PatchParams::default(), &Patch::Merge(&theirs))
        .await?;
    let cordon = serde_json::json!({ "spec": { "unschedulable": true } });
    nodes_api
        .patch(cordoned, &PatchParams::default(), &Patch::Merge(&cordon))
        .await?;
    let autoscaler_annotations = |node: &Node| -> BTreeMap<String, String> {
        node.annotations()
            .iter()
            .filter(|(key, _)| {
                cordon_mark::AUTOSCALER_ANNOTATIONS.contains(&key.as_str())
                    || key.as_str() == cordon_mark::AUTOSCALER_ANNOTATIONS_ADDED
            })
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    };
    let all = [plain, kept, uncordoned, cordoned];
    let mut before = Vec::new();
    for node in all {
        before.push(autoscaler_annotations(&nodes_api.get(node).await?));
    }

    let names = ["plain", "kept", "uncordoned", "cordoned"];
    for (name, node) in names.into_iter().zip(all) {
        let mut spec = request_spec(node, "autoscale.example.com");
        if name == "uncordoned" {
            spec.cordon = Some(false);
        }
        create_request(&client, &ns, name, spec).await?;
    }
    let mut ready = Vec::new();
    for name in names {
        ready.push(wait_phase(&client, &ns, name, Phase::Ready, WAIT).await?);
    }
    let (ca, karpenter, added) = (
        cordon_mark::SCALE_DOWN_DISABLED_ANNOTATION,
        cordon_mark::DO_NOT_DISRUPT_ANNOTATION,
        cordon_mark::AUTOSCALER_ANNOTATIONS_ADDED,
    );
    let both = BTreeMap::from([
        (ca.to_string(), "true".to_string()),
        (karpenter.to_string(), "true".to_string()),
        (added.to_string(), format!("{ca},{karpenter}")),
    ]);
    for (node, expected) in [
        (plain, both.clone()),
        (
            kept,
            BTreeMap::from([
                (ca.to_string(), "true".to_string()),
                (karpenter.to_string(), "true".to_string()),
                (added.to_string(), ca.to_string()),
            ]),
        ),
        (uncordoned, both.clone()),
        (cordoned, both),
    ] {
        let on_node = autoscaler_annotations(&nodes_api.get(node).await?);
        ensure!(on_node == expected, "{node} in maintenance: {on_node:?}");
    }
    // The nodes we did not cordon are as their owners left them, and marked by their request.
    ensure!(
        !node_unschedulable(&client, uncordoned).await?,
        "cordon: false, yet {uncordoned} is cordoned"
    );
    ensure!(
        node_unschedulable(&client, cordoned).await?,
        "{cordoned} lost the cordon someone else made"
    );
    for (node, request) in [(uncordoned, &ready[2]), (cordoned, &ready[3])] {
        let on_node = nodes_api.get(node).await?;
        let mark = on_node
            .annotations()
            .get(cordon_mark::PROTECTED_BY_UID_ANNOTATION);
        ensure!(
            mark == request.metadata.uid.as_ref(),
            "{node} is marked protected-by {mark:?}, not by its request"
        );
    }
    // The gauge counts them (other tests of the shared operator may add theirs).
    let operator = &shared_cluster().await?.operator;
    wait_for(
        "nodes_protected_from_autoscalers to count all four",
        WAIT,
        || async {
            let protected = operator
                .metric("maintenance_operator_nodes_protected_from_autoscalers")
                .await?;
            Ok((protected >= 4.0).then_some(()))
        },
    )
    .await?;

    for name in names {
        release_request(&client, &ns, name, WAIT).await?;
    }
    for (node, before) in all.into_iter().zip(before) {
        ensure!(
            node_unschedulable(&client, node).await? == (node == cordoned),
            "{node}'s cordon is not as it was before the request"
        );
        let on_node = nodes_api.get(node).await?;
        let after = autoscaler_annotations(&on_node);
        ensure!(
            after == before,
            "{node} after the release: {after:?}, before the request: {before:?}"
        );
        ensure!(
            on_node
                .annotations()
                .keys()
                .all(|key| !cordon_mark::is_mark(key)
                    || cordon_mark::AUTOSCALER_ANNOTATIONS.contains(&key.as_str())),
            "{node} keeps a mark after the release: {:?}",
            on_node.annotations()
        );
    }
    let uncordon = serde_json::json!({ "spec": { "unschedulable": false } });
    nodes_api
        .patch(cordoned, &PatchParams::default(), &Patch::Merge(&uncordon))
        .await?;
    monitor.held().await
}

/// Requests on one node, each created the moment the one before is gone: the admission takes
/// the node's state from the cache when the cache shows it schedulable and reads it again when
/// the cache may still show the previous request's cordon, so every request records the node as
/// schedulable before it and the node ends schedulable. The test cannot make the cache lag (an
/// operator that trusts a cordoned cache passes it too, most runs): the rule is tested in core
/// (`the_admission_trusts_a_schedulable_cached_node_and_reads_a_cordoned_one_again`); this guards
/// the wiring.
#[tokio::test]
async fn back_to_back_requests_on_one_node_each_record_it_schedulable() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("backtoback", 1).await?;
    let node = &nodes[0];
    for i in 0..8 {
        let name = format!("m{i}");
        request_node(&client, &ns, &name, node, "backtoback.example.com").await?;
        let ready = wait_phase(&client, &ns, &name, Phase::Ready, WAIT).await?;
        let recorded = ready
            .annotations()
            .get(INITIAL_UNSCHEDULABLE_ANNOTATION)
            .map(String::as_str);
        anyhow::ensure!(
            recorded == Some("false"),
            "{ns}/{name} recorded {node}'s initial state as {recorded:?}, want \"false\": the \
             previous request's cordon was taken for the node's own"
        );
        anyhow::ensure!(
            node_unschedulable(&client, node).await?,
            "{node} not cordoned while {ns}/{name} is Ready"
        );
        release_request(&client, &ns, &name, WAIT).await?;
    }
    anyhow::ensure!(
        !node_unschedulable(&client, node).await?,
        "{node} left cordoned after the last request was gone"
    );
    monitor.held().await
}

#[tokio::test]
async fn additional_requestors_keep_the_node_until_they_let_go() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("shared", 1).await?;
    let mut spec = request_spec(&nodes[0], "first.example.com");
    spec.additional_requestors = Some(vec!["second.example.com".into()]);
    create_request(&client, &ns, "m", spec).await?;
    wait_phase(&client, &ns, "m", Phase::Ready, WAIT).await?;
    delete_request(&client, &ns, "m").await?;
    // Deleted, but held: the node stays cordoned while another requestor still works on it.
    let held = wait_for("the deletion to be held", WAIT, || async {
        Ok(get_request(&client, &ns, "m").await?.filter(|r| {
            r.is_deleting()
                && r.condition("Ready")
                    .is_some_and(|c| c.message.contains("additionalRequestors"))
        }))
    })
    .await?;
    assert!(held.finalizers().iter().any(|f| f == FINALIZER));
    assert!(node_unschedulable(&client, &nodes[0]).await?);
    // The second requestor lets go.
    let no_more = serde_json::json!({"spec": {"additionalRequestors": []}});
    patch_request(&client, &ns, "m", no_more).await?;
    wait_request_gone(&client, &ns, "m", WAIT).await?;
    assert!(!node_unschedulable(&client, &nodes[0]).await?);
    monitor.held().await
}

#[tokio::test]
async fn requestor_failed_is_mirrored_into_the_phase() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("reqfail", 1).await?;
    request_node(&client, &ns, "m", &nodes[0], "flaky.example.com").await?;
    let ready = wait_phase(&client, &ns, "m", Phase::Ready, WAIT).await?;
    let mut conditions = ready.status.clone().unwrap_or_default().conditions;
    conditions.push(k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: "RequestorFailed".into(),
        status: "True".into(),
        reason: "FirmwareUpdateFailed".into(),
        message: "flashing failed".into(),
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ),
        observed_generation: None,
    });
    Api::<NodeMaintenance>::namespaced(client.clone(), &ns)
        .patch_status(
            "m",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"conditions": conditions}})),
        )
        .await?;
    let failed = wait_phase(&client, &ns, "m", Phase::RequestorFailed, WAIT).await?;
    assert_eq!(
        failed.condition("Ready").map(|c| c.status.as_str()),
        Some("False")
    );
    // The requestor's own condition is kept.
    assert!(failed.condition("RequestorFailed").is_some());
    assert!(node_unschedulable(&client, &nodes[0]).await?);
    release_request(&client, &ns, "m", WAIT).await?;
    assert!(!node_unschedulable(&client, &nodes[0]).await?);
    monitor.held().await
}

#[tokio::test]
async fn deleting_the_node_removes_its_requests() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("nodegone", 1).await?;
    request_node(&client, &ns, "m", &nodes[0], "decom.example.com").await?;
    wait_phase(&client, &ns, "m", Phase::Ready, WAIT).await?;
    Api::<Node>::all(client.clone())
        .delete(&nodes[0], &Default::default())
        .await?;
    wait_request_gone(&client, &ns, "m", WAIT).await?;
    monitor.held().await
}

#[tokio::test]
async fn wait_for_pod_completion_times_out_and_moves_on() -> Result<()> {
    let (client, ns, nodes, monitor) = monitored_setup("waitpods", 1).await?;
    let labels = BTreeMap::from([("role".to_string(), "batch".to_string())]);
    create_bare_pod(
        &client,
        &ns,
        "job-like",
        &nodes[0],
        &BarePodOptions {
            labels,
            ..Default::default()
        },
    )
    .await?;
    wait_pods_ready(&client, &ns, "role=batch", 1, WAIT).await?;
    let mut spec = request_spec(&nodes[0], "wait.example.com");
    spec.wait_for_pod_completion = Some(WaitForPodCompletionSpec {
        pod_selector: Some("role=batch".into()),
        timeout_seconds: Some(3),
    });
    create_request(&client, &ns, "m", spec).await?;
    let waiting = wait_for("the status to list the running pod", WAIT, || async {
        Ok(get_request(&client, &ns, "m").await?.filter(|r| {
            r.phase() == Phase::WaitForPodCompletion
                && r.status
                    .as_ref()
                    .is_some_and(|s| s.wait_for_completion == vec![format!("{ns}/job-like")])
        }))
    })
    .await?;
    assert!(node_unschedulable(&client, &nodes[0]).await?);
    drop(waiting);
    // No drain: after the timeout it goes to Ready, with a Warning event saying so.
    let ready = wait_phase(&client, &ns, "m", Phase::Ready, WAIT).await?;
    assert!(
        ready
            .status
            .as_ref()
            .is_some_and(|s| s.wait_for_completion.is_empty())
    );
    wait_for("the timeout event", WAIT, || async {
        let reasons = event_reasons(&client, &ns, "m").await?;
        Ok(reasons
            .iter()
            .any(|r| r == "WaitForPodCompletionTimeout")
            .then_some(()))
    })
    .await?;
    monitor.held().await
}

/// Kill the operator (SIGKILL) again and again while six drains run under maxParallelOperations=2:
/// a watcher checks every state the API server shows; never more than 2 nodes in maintenance,
/// and every request finishes.
#[tokio::test]
async fn kill_and_restart_resumes_every_request_within_the_limits() -> Result<()> {
    let (testbed, client, ns, nodes) = own_cluster("crash", 8, Some(limits(2, None))).await?;
    // Pods on the first six nodes so that every drain has work to do; the last two nodes
    // receive the replacements (labels added afterwards: no rollout).
    for (i, node) in nodes.iter().take(6).enumerate() {
        let name = format!("app-{i}");
        let pool = format!("pool-{name}");
        set_node_label(&client, node, &pool, Some("yes")).await?;
        let labels = [("app", name.as_str())];
        let pods = PodSpecOptions::on_nodes_labelled(&pool, "yes");
        create_deployment(&client, &ns, &name, 3, &labels, &pods).await?;
        wait_pods_ready(&client, &ns, &format!("app={name}"), 3, WAIT).await?;
        for spare in &nodes[6..] {
            set_node_label(&client, spare, &pool, Some("yes")).await?;
        }
    }
    // A PDB that blocks app-0's drain until the test raises its replicas.
    create_app_pdb(&client, &ns, "app-0", 3).await?;
    // The scenario needs app-0's drain held back by its budget; without that, the kills below
    // would not land while a drain waits on a PDB.
    wait_pdb_disruptions_allowed(&client, &ns, "app-0", 0, WAIT)
        .await
        .context("precondition: the PodDisruptionBudget of app-0 must allow no disruption")?;

    // The monitor checks every state the API server shows (maxParallelOperations at each
    // admission, PDBs, cordons) and, with the operator under its own identity, the audit log.
    let account = "crash-operator";
    let monitor = monitor_as(&testbed, &ns, &nodes, account).await?;

    let mut operator = Operator::start_as(&testbed, account, &[]).await?;
    for (i, node) in nodes.iter().take(6).enumerate() {
        let mut spec = request_spec(node, "crash.example.com");
        spec.drain_spec = drain_spec(true, 0);
        create_request(&client, &ns, &format!("m{i}"), spec).await?;
    }
    // Kill it again and again, each time after the cluster showed some progress since the last
    // kill (a phase change or a finished request), so the kills land in different phases.
    let signature = || async {
        let mut all: Vec<(String, Phase)> = list_requests(&client, &ns)
            .await?
            .iter()
            .map(|r| (r.name_any(), r.phase()))
            .collect();
        all.sort();
        anyhow::Ok(all)
    };
    let mut last = signature().await?;
    for round in 0..5 {
        last = wait_for("progress before the next kill", WAIT, || async {
            let now = signature().await?;
            Ok((now != last).then_some(now))
        })
        .await?;
        operator.kill();
        // Releasing finished requests while the operator is down: the restart must clean up.
        for r in list_requests(&client, &ns).await? {
            if r.phase() == Phase::Ready && !r.is_deleting() {
                delete_request(&client, &ns, &r.name_any()).await?;
            }
        }
        operator
            .restart()
            .await
            .with_context(|| format!("restart {round}"))?;
    }
    // Unblock app-0 and let everything finish; release each request once Ready.
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), &ns)
        .patch(
            "app-0",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 4}})),
        )
        .await?;
    release_all_when_ready(&client, &ns, Duration::from_secs(240)).await?;
    let report = monitor.finish().await?;
    let max = report.peak_in_maintenance;
    assert!(
        max <= 2,
        "{max} nodes were in maintenance at once with maxParallelOperations=2"
    );
    // Six requests and app-0 held back by its budget: the second slot must have been used too,
    // or the operator serialised what the limit allows in parallel.
    assert_eq!(
        max, 2,
        "never 2 nodes in maintenance at once with maxParallelOperations=2 and 6 requests"
    );
    for node in nodes.iter().take(6) {
        assert!(
            !node_unschedulable(&client, node).await?,
            "{node} left cordoned"
        );
    }
    Ok(())
}

/// A request that goes without our cleanup while the operator is down (its finalizer removed by
/// hand, then deleted) leaves a cordoned node that only the node's own mark remembers
/// (`cordon_mark`). The restarted operator finds the mark of a request that nothing of its holds,
/// keeps the node held (a request created on it meanwhile waits: admitted on the cordoned node, it
/// would record it unschedulable and never uncordon it), and uncordons it after
/// `cordon_mark::ORPHAN_GRACE`, with a Warning Event on the Node; the waiting request is then
/// admitted, records the node schedulable, and its own cleanup leaves the node unmarked. The
/// previous operator admitted the waiting request on the cordoned node at once: it recorded the
/// node unschedulable, and the node stayed cordoned for good.
#[tokio::test]
async fn a_cordon_whose_request_went_while_the_operator_was_down_is_undone() -> Result<()> {
    let (testbed, client, ns, nodes) = own_cluster("orphan", 2, Some(limits(2, None))).await?;
    let (node, uncordoned) = (&nodes[0], &nodes[1]);
    let _requests: Api<NodeMaintenance> = Api::namespaced(client.clone(), &ns);
    let mark_of = |node: Node| {
        node.annotations()
            .get(cordon_mark::CORDONED_BY_UID_ANNOTATION)
            .cloned()
    };
    let nodes_api: Api<Node> = Api::all(client.clone());

    let mut operator = Operator::start(&testbed, &[]).await?;
    request_node(&client, &ns, "gone", node, "orphan.example.com").await?;
    let ready = wait_phase(&client, &ns, "gone", Phase::Ready, WAIT).await?;
    ensure!(
        node_unschedulable(&client, node).await?,
        "precondition: {node} is not cordoned while Ready"
    );
    assert_eq!(
        mark_of(nodes_api.get(node).await?),
        ready.uid(),
        "the cordon marks {node} with its request"
    );

    // A request that does not cordon its node marks it for the autoscaler annotations only.
    let mut spec = request_spec(uncordoned, "orphan.example.com");
    spec.cordon = Some(false);
    create_request(&client, &ns, "gone-uncordoned", spec).await?;
    let protected = wait_phase(&client, &ns, "gone-uncordoned", Phase::Ready, WAIT).await?;
    ensure!(
        nodes_api
            .get(uncordoned)
            .await?
            .annotations()
            .get(cordon_mark::PROTECTED_BY_UID_ANNOTATION)
            == protected.metadata.uid.as_ref(),
        "precondition: {uncordoned} is not marked by the request that protects it"
    );

    operator.kill();
    let no_finalizers = serde_json::json!({ "metadata": { "finalizers": null } });
    for name in ["gone", "gone-uncordoned"] {
        patch_request(&client, &ns, name, no_finalizers.clone()).await?;
        delete_request(&client, &ns, name).await?;
        ensure!(
            get_request(&client, &ns, name).await?.is_none(),
            "precondition: the request {name} is still there"
        );
    }
    request_node(&client, &ns, "next", node, "orphan.example.com").await?;
    operator.restart().await?;

    // The uncordon and the next request's admission and cordon follow one another within
    // milliseconds: what the next request recorded of the node tells that the uncordon came first.
    let next = wait_phase(
        &client,
        &ns,
        "next",
        Phase::Ready,
        WAIT + cordon_mark::ORPHAN_GRACE,
    )
    .await?;
    assert_eq!(
        next.annotations()
            .get(INITIAL_UNSCHEDULABLE_ANNOTATION)
            .map(String::as_str),
        Some("false"),
        "the request that waited was admitted on the cordoned node: it records our orphaned \
         cordon as the node's own state, and its cleanup would leave the node cordoned"
    );
    assert!(
        node_unschedulable(&client, node).await?,
        "next cordons {node}"
    );
    assert_eq!(mark_of(nodes_api.get(node).await?), next.uid());
    let warnings = wait_for("the Warning Event on the node", WAIT, || async {
        let events = events_about(&client, "default", node).await?;
        let found: Vec<_> = events
            .into_iter()
            .filter(|e| {
                e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some("Uncordon")
            })
            .collect();
        Ok((!found.is_empty()).then_some(found))
    })
    .await?;
    let note = warnings[0].note.clone().unwrap_or_default();
    assert!(
        note.contains(&format!("{ns}/gone")),
        "the Event names the request that went: {note}"
    );

    release_request(&client, &ns, "next", WAIT).await?;
    let after = nodes_api.get(node).await?;
    assert!(
        !node_unschedulable(&client, node).await?,
        "{node} left cordoned"
    );
    assert!(
        after
            .annotations()
            .keys()
            .all(|key| !cordon_mark::is_mark(key)),
        "the uncordon removes the mark and the autoscaler annotations: {:?}",
        after.annotations()
    );
    assert_eq!(mark_of(after), None, "the uncordon removes the mark");
    // The orphaned protection is undone too, and the node it was on was never cordoned.
    wait_for(
        "the sweep to remove the protection's mark and annotations",
        WAIT,
        || async {
            let left = nodes_api.get(uncordoned).await?;
            Ok(left
                .annotations()
                .keys()
                .all(|key| !cordon_mark::is_mark(key))
                .then_some(()))
        },
    )
    .await?;
    assert!(!node_unschedulable(&client, uncordoned).await?);
    Ok(())
}

/// The phase timers never fire early: `drainSpec.timeoutSeconds` (the `Failed`/`DrainTimeout`
/// condition) and `waitForPodCompletion.timeoutSeconds` (the move on to Ready), three requests
/// each, with pods that never finish and a budget that never lets go. Each is seen by this test,
/// polling, no sooner than the timeout after the test's clock read just before the request was
/// created, a lower bound of when its phase began. The previous rule counted from the whole
/// second of the phase's condition and fired up to a second early.
#[tokio::test]
async fn phase_timeouts_never_fire_early() -> Result<()> {
    const RUNS: usize = 3;
    const TIMEOUT: i32 = 2;
    let (client, ns, nodes) = isolated_setup("timers", 2 * RUNS).await?;
    let shared = shared_cluster().await?;
    let monitor = InvariantMonitor::start(shared.testbed, Scope::new(&ns, &nodes)).await?;
    let mut created = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let app = format!("timer-{i}");
        blocked_workload(&client, &ns, &app, node, 1, WAIT).await?;
        let mut spec = request_spec(node, "timers.example.com");
        if i < RUNS {
            spec.drain_spec = Some(maintenance_crds::DrainSpec {
                timeout_seconds: Some(TIMEOUT),
                ..Default::default()
            });
        } else {
            spec.wait_for_pod_completion = Some(maintenance_crds::WaitForPodCompletionSpec {
                pod_selector: Some(format!("app={app}")),
                timeout_seconds: Some(TIMEOUT),
            });
        }
        let before = jiff::Timestamp::now();
        create_request(&client, &ns, &app, spec).await?;
        created.push((app, before));
    }
    let mut earliest = [f64::MAX; 2];
    for (i, (name, before)) in created.iter().enumerate() {
        let drain = i < RUNS;
        let what = if drain {
            "Failed with DrainTimeout"
        } else {
            "past WaitForPodCompletion"
        };
        wait_request(&client, &ns, name, what, WAIT, |r| {
            if drain {
                r.condition(maintenance_crds::condition_type::FAILED)
                    .is_some_and(|c| c.reason == "DrainTimeout")
            } else {
                r.phase() == Phase::Ready
            }
        })
        .await?;
        let seen = jiff::Timestamp::now().duration_since(*before).as_secs_f64();
        ensure!(
            seen >= f64::from(TIMEOUT),
            "{name}: {what} {seen:.3}s after the request was created, before its {TIMEOUT}s timeout"
        );
        earliest[usize::from(!drain)] = earliest[usize::from(!drain)].min(seen);
    }
    println!(
        "timeoutSeconds {TIMEOUT}: drain timeout seen {:.3}s at the earliest, wait timeout {:.3}s \
         ({RUNS} runs each)",
        earliest[0], earliest[1]
    );
    for (name, _) in &created {
        release_request(&client, &ns, name, WAIT).await?;
    }
    monitor.held().await
}
