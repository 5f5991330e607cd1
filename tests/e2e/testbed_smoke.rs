//! The testbed is a real control plane: nodes become Ready, controllers and the scheduler act,
//! the API server enforces PodDisruptionBudgets and CRD schemas.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ApiResource, DynamicObject, EvictParams, ListParams, PostParams};
use support::*;

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn fifty_nodes_become_ready() -> Result<()> {
    let client = Testbed::shared().await?.client().await?;
    let prefix = unique_name("smoke50");
    let names = create_nodes(&client, &prefix, 50, &[]).await?;
    wait_nodes_ready(&client, &names, 2 * MINUTE).await?;

    let nodes = Api::<Node>::all(client)
        .list(&ListParams::default().labels(&format!("{NODE_PREFIX_LABEL}={prefix}")))
        .await?
        .items;
    ensure!(nodes.len() == 50, "listed {} nodes, want 50", nodes.len());
    for node in &nodes {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        ensure!(
            node_is_ready(node),
            "node {name} is not Ready: {:?}",
            node.status
        );
        let cpu = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("cpu"))
            .map(|q| q.0.as_str());
        ensure!(
            cpu == Some("32"),
            "node {name} allocatable cpu {cpu:?}, want 32"
        );
    }
    Ok(())
}

/// 10 replicas behind `minAvailable: 9`: one eviction at a time is accepted, a second one while
/// the first pod's replacement cannot run is refused with 429, and the replacement lands on
/// another node once there is room.
#[tokio::test]
async fn pdb_limits_evictions_and_replacements_move() -> Result<()> {
    let testbed = Testbed::shared().await?;
    let client = testbed.client().await?;
    // The client retries 429 by itself; this test needs to see it.
    let no_retry = testbed.client_without_retry().await?;

    let ns = unique_name("pdb");
    create_namespace(&client, &ns).await?;
    let prefix = unique_name("pdbnode");
    let nodes = create_nodes(&client, &prefix, 12, &[]).await?;
    wait_nodes_ready(&client, &nodes, 2 * MINUTE).await?;

    let labels = [("app", "web")];
    create_deployment(
        &client,
        &ns,
        "web",
        10,
        &labels,
        &PodSpecOptions::on_nodes_with_prefix(&prefix),
    )
    .await?;
    create_pdb_min_available(&client, &ns, "web", &labels, IntOrString::Int(9)).await?;

    let pods = wait_pods_ready(&client, &ns, "app=web", 10, 2 * MINUTE).await?;
    let pdb = wait_pdb_disruptions_allowed(&client, &ns, "web", 1, 2 * MINUTE).await?;
    let status = pdb.status.context("PDB without status")?;
    ensure!(
        (
            status.current_healthy,
            status.desired_healthy,
            status.expected_pods
        ) == (Some(10), Some(9), Some(10)),
        "PDB status {status:?}"
    );
    for pod in &pods {
        let node = pod_node(pod).unwrap_or_default();
        ensure!(
            nodes.iter().any(|n| n == node),
            "pod placed on foreign node {node}"
        );
    }

    // With every node cordoned the first pod's replacement stays Pending, so the budget stays
    // exhausted for as long as the test needs.
    for node in &nodes {
        cordon_node(&client, node).await?;
    }
    let evict = Api::<Pod>::namespaced(no_retry, &ns);
    let (first, second) = (&pods[0], &pods[1]);
    let first_name = first.metadata.name.clone().context("pod without name")?;
    let second_name = second.metadata.name.clone().context("pod without name")?;
    let first_node = pod_node(first).context("pod without node")?.to_string();

    evict
        .evict(&first_name, &EvictParams::default())
        .await
        .context("the first eviction should be accepted")?;
    wait_pod_gone(
        &client,
        &ns,
        &first_name,
        first.metadata.uid.as_deref(),
        MINUTE,
    )
    .await?;

    match evict.evict(&second_name, &EvictParams::default()).await {
        Ok(status) => bail!("a second eviction under minAvailable 9 was accepted: {status:?}"),
        Err(err) => match api_error(&err) {
            Some((429, message)) if message.contains("disruption budget") => {}
            _ => bail!("want 429 naming the disruption budget, got {err:?}"),
        },
    }
    let second_now = Api::<Pod>::namespaced(client.clone(), &ns)
        .get(&second_name)
        .await?;
    ensure!(
        second_now.metadata.deletion_timestamp.is_none(),
        "the refused eviction still deleted {second_name}"
    );

    // Room everywhere but on the evicted pod's node.
    for node in nodes.iter().filter(|n| **n != first_node) {
        uncordon_node(&client, node).await?;
    }
    let before: BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let after = wait_pods_ready(&client, &ns, "app=web", 10, 2 * MINUTE).await?;
    let replacements: Vec<&Pod> = after
        .iter()
        .filter(|p| {
            p.metadata
                .name
                .as_ref()
                .is_some_and(|name| !before.contains(name))
        })
        .collect();
    ensure!(
        replacements.len() == 1,
        "want exactly one replacement pod, got {}",
        replacements.len()
    );
    let replacement_node = pod_node(replacements[0]).unwrap_or_default();
    ensure!(
        replacement_node != first_node && nodes.iter().any(|n| n == replacement_node),
        "replacement runs on {replacement_node}, evicted pod ran on {first_node}"
    );
    wait_pdb_disruptions_allowed(&client, &ns, "web", 1, 2 * MINUTE).await?;

    // The budget is back, so the eviction refused before goes through now.
    evict
        .evict(&second_name, &EvictParams::default())
        .await
        .context("an eviction within the restored budget should be accepted")?;
    wait_pod_gone(
        &client,
        &ns,
        &second_name,
        second.metadata.uid.as_deref(),
        MINUTE,
    )
    .await?;
    wait_pods_ready(&client, &ns, "app=web", 10, 2 * MINUTE).await?;
    Ok(())
}

#[tokio::test]
async fn daemonset_covers_every_selected_node() -> Result<()> {
    let client = Testbed::shared().await?.client().await?;
    let ns = unique_name("ds");
    create_namespace(&client, &ns).await?;
    let prefix = unique_name("dsnode");
    let nodes = create_nodes(&client, &prefix, 5, &[]).await?;
    wait_nodes_ready(&client, &nodes, 2 * MINUTE).await?;

    let pod = PodSpecOptions {
        empty_dir: true,
        ..PodSpecOptions::on_nodes_with_prefix(&prefix)
    };
    create_daemonset(&client, &ns, "agent", &[("app", "agent")], &pod).await?;
    wait_daemonset_ready(&client, &ns, "agent", 2 * MINUTE).await?;
    let pods = wait_pods_ready(&client, &ns, "app=agent", 5, 2 * MINUTE).await?;
    let on: BTreeSet<&str> = pods.iter().filter_map(pod_node).collect();
    let want: BTreeSet<&str> = nodes.iter().map(String::as_str).collect();
    ensure!(on == want, "daemon pods on {on:?}, want {want:?}");

    let bare = create_bare_pod(
        &client,
        &ns,
        "bare",
        &nodes[0],
        &BarePodOptions {
            empty_dir: true,
            ..Default::default()
        },
    )
    .await?;
    ensure!(pod_node(&bare) == Some(nodes[0].as_str()));
    wait_pods_ready(&client, &ns, "!app", 1, MINUTE).await?;
    Ok(())
}

fn object(resource: &ApiResource, name: &str, spec: serde_json::Value) -> DynamicObject {
    let mut obj = DynamicObject::new(name, resource);
    obj.metadata = ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    };
    obj.data = serde_json::json!({ "spec": spec });
    obj
}

#[tokio::test]
async fn crds_apply_and_the_schema_is_enforced() -> Result<()> {
    let client = Testbed::shared().await?.client().await?;
    let crds = apply_crds(&client).await?;
    ensure!(crds.len() >= 2, "applied {} CRDs", crds.len());
    let ns = unique_name("crd");
    create_namespace(&client, &ns).await?;

    let nm = request_resource();
    let nms: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &nm);
    let valid = object(
        &nm,
        "valid",
        serde_json::json!({ "nodeName": "node-a", "requestorID": "smoke.example.com" }),
    );
    nms.create(&PostParams::default(), &valid)
        .await
        .context("a valid NodeMaintenance should be accepted")?;
    let stored = nms.get("valid").await?;
    ensure!(
        stored.data["spec"]["nodeName"] == "node-a",
        "stored {stored:?}"
    );

    let no_node = object(
        &nm,
        "no-node",
        serde_json::json!({ "requestorID": "smoke.example.com" }),
    );
    expect_invalid(&nms, &no_node, &["spec.nodeName", "Required value"]).await?;

    let cfg = config_resource();
    let configs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &cfg);
    let bad = object(
        &cfg,
        "bad",
        serde_json::json!({ "maxParallelOperations": "abc" }),
    );
    expect_invalid(
        &configs,
        &bad,
        &[
            "maxParallelOperations",
            "must be a non-negative integer or a percentage",
        ],
    )
    .await?;
    let good = object(
        &cfg,
        "good",
        serde_json::json!({ "maxParallelOperations": "10%" }),
    );
    configs
        .create(&PostParams::default(), &good)
        .await
        .context("maxParallelOperations \"10%\" should be accepted")?;
    Ok(())
}

/// A private testbed answers, and dropping it stops every process it started.
#[tokio::test]
async fn private_testbed_stops_on_drop() -> Result<()> {
    let testbed = Testbed::start().await?;
    let client = testbed.client().await?;
    let version = client.apiserver_version().await?;
    ensure!(version.git_version == "v1.37.2", "API server {version:?}");

    let pids: Vec<u32> = std::fs::read_to_string(testbed.dir().join("pids"))?
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect();
    ensure!(pids.len() >= 5, "pids file lists {pids:?}");
    let dir = testbed.dir().to_path_buf();
    drop(client);
    drop(testbed);

    // Exited processes may linger as zombies until whoever adopted them reaps them.
    let running: Vec<u32> = pids
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
                !matches!(state, Some(Some('Z' | 'X')))
            })
        })
        .collect();
    ensure!(running.is_empty(), "still running after drop: {running:?}");
    ensure!(!dir.exists(), "{} survived the drop", dir.display());
    Ok(())
}
