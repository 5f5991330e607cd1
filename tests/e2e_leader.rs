//! Two operator processes against one control plane: only the leader acts; when it is killed the
//! other takes over within the lease duration, finishes the work, and the limits hold throughout.
//! Plus the product's troubleshooting command, run verbatim with kubectl.

mod support;

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use maintenance_crds::Phase;
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(90);
const LEASE_SECONDS: u64 = 4;

async fn lease_holder(client: &Client) -> Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    Ok(leases
        .get_opt("maintenance-operator")
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

#[tokio::test]
async fn standby_takes_over_when_the_leader_dies_and_limits_hold() -> Result<()> {
    let testbed = Testbed::start().await?;
    let client = testbed.client().await?;
    install(&client, Some(limits(2, None))).await?;
    let nodes = create_nodes(&client, "le", 6, &[]).await?;
    wait_nodes_ready(&client, &nodes, WAIT).await?;
    let ns = unique_name("leader");
    create_namespace(&client, &ns).await?;
    let lease = LEASE_SECONDS.to_string();
    let args = |name: &'static str| {
        [
            "--leader-elect",
            "--lease-duration-seconds",
            lease.as_str(),
            "--pod-name",
            name,
        ]
    };
    let mut first = Operator::start(&testbed, &args("replica-a")).await?;
    wait_for("replica-a to lead", WAIT, || async {
        Ok(lease_holder(&client)
            .await?
            .filter(|h| h == "replica-a")
            .map(|_| ()))
    })
    .await?;
    let second = Operator::start(&testbed, &args("replica-b")).await?;
    assert_eq!(second.metric("maintenance_operator_leader").await?, 0.0);
    assert_eq!(first.metric("maintenance_operator_leader").await?, 1.0);

    let (max_seen, checker) = track_max_in_maintenance(client.clone(), ns.clone());
    for (i, node) in nodes.iter().enumerate() {
        create_request(
            &client,
            &ns,
            &format!("m{i}"),
            request_spec(node, "le.example.com"),
        )
        .await?;
    }
    // The leader admits two; the standby neither admits nor evicts.
    wait_for("two requests Ready", WAIT, || async {
        let ready = list_requests(&client, &ns)
            .await?
            .iter()
            .filter(|r| r.phase() == Phase::Ready)
            .count();
        Ok((ready == 2).then_some(()))
    })
    .await?;
    assert_eq!(
        second
            .metric("maintenance_operator_requests_admitted_total")
            .await?,
        0.0,
        "the standby admitted requests"
    );

    // Kill the leader; the standby takes over within the lease duration (plus its retry period).
    first.kill();
    let killed = Instant::now();
    wait_for("replica-b to lead", WAIT, || async {
        Ok(lease_holder(&client)
            .await?
            .filter(|h| h == "replica-b")
            .map(|_| ()))
    })
    .await?;
    let takeover = killed.elapsed();
    ensure!(
        takeover <= Duration::from_secs(LEASE_SECONDS * 2 + 2),
        "takeover took {takeover:?} with a {LEASE_SECONDS}s lease"
    );
    wait_for("replica-b to report leadership", WAIT, || async {
        Ok((second.metric("maintenance_operator_leader").await? == 1.0).then_some(()))
    })
    .await?;
    println!(
        "takeover after the leader was killed: {:.1}s",
        takeover.as_secs_f64()
    );

    // The new leader finishes everything, releasing each request when Ready.
    release_all_when_ready(&client, &ns, WAIT).await?;
    checker.abort();
    let max = max_seen.load(Ordering::SeqCst);
    ensure!(
        max <= 2,
        "{max} nodes in maintenance at once with maxParallelOperations=2"
    );
    for node in &nodes {
        ensure!(
            !node_unschedulable(&client, node).await?,
            "{node} left cordoned"
        );
    }
    Ok(())
}

/// `kubectl ... patch ... '{"spec": {"maxUnavailable": 0}}'` exactly as the product documents
/// it: new nodes stop becoming unavailable, requests on already-unavailable nodes go on.
#[tokio::test]
async fn troubleshooting_patch_max_unavailable_zero_works_verbatim() -> Result<()> {
    let testbed = Testbed::start().await?;
    let client = testbed.client().await?;
    install(&client, Some(limits(10, None))).await?;
    let nodes = create_nodes(&client, "ts", 6, &[]).await?;
    wait_nodes_ready(&client, &nodes, WAIT).await?;
    cordon_node(&client, &nodes[0]).await?;
    let ns = unique_name("ts");
    create_namespace(&client, &ns).await?;
    let op = Operator::start(&testbed, &[]).await?;

    let status = Command::new("kubectl")
        .args([
            "-n",
            "maintenance-operator",
            "patch",
            "maintenanceoperatorconfigs.maintenance.nvidia.com",
            "default",
            "--type",
            "merge",
            "--patch",
            r#"{"spec": {"maxUnavailable": 0}}"#,
        ])
        .env("KUBECONFIG", testbed.kubeconfig_path())
        .status()
        .context("running kubectl")?;
    ensure!(status.success(), "kubectl patch failed: {status}");
    wait_scheduler_rounds(&op, 2).await?;

    create_request(
        &client,
        &ns,
        "on-cordoned",
        request_spec(&nodes[0], "ts.example.com"),
    )
    .await?;
    create_request(
        &client,
        &ns,
        "on-healthy",
        request_spec(&nodes[1], "ts.example.com"),
    )
    .await?;
    wait_phase(&client, &ns, "on-cordoned", Phase::Ready, WAIT).await?;
    wait_scheduler_rounds(&op, 3).await?;
    let healthy = get_request(&client, &ns, "on-healthy")
        .await?
        .context("request on-healthy")?;
    assert_eq!(healthy.phase(), Phase::Pending);
    assert!(!node_unschedulable(&client, &nodes[1]).await?);
    Ok(())
}
