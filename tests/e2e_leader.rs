//! Two operator processes against one control plane: only the leader acts (the API server's audit
//! log shows no write at all by the standby); when it is killed the other takes over within the
//! lease duration, finishes the work, and the limits hold throughout.
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
use support::audit::{AuditLog, WriteCall};
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

/// Whether `writes` hold a successful write of `resource` (its plural, e.g. `leases`).
fn wrote(writes: &[&WriteCall], resource: &str) -> bool {
    writes
        .iter()
        .any(|w| w.resource == resource && (200..300).contains(&w.code))
}

fn describe_writes(writes: &[&WriteCall]) -> String {
    if writes.is_empty() {
        return "none".into();
    }
    let shown: Vec<String> = writes.iter().take(20).map(|w| w.describe()).collect();
    format!("{} writes:\n{}", writes.len(), shown.join("\n"))
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
    // Each replica runs as a ServiceAccount of its own, so the audit log names who wrote what.
    let mut first = Operator::start_as(&testbed, "replica-a", &args("replica-a")).await?;
    wait_for("replica-a to lead", WAIT, || async {
        Ok(lease_holder(&client)
            .await?
            .filter(|h| h == "replica-a")
            .map(|_| ()))
    })
    .await?;
    let second = Operator::start_as(&testbed, "replica-b", &args("replica-b")).await?;
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
    // The leader admits two and brings them to Ready.
    wait_for("two requests Ready", WAIT, || async {
        let ready = list_requests(&client, &ns)
            .await?
            .iter()
            .filter(|r| r.phase() == Phase::Ready)
            .count();
        Ok((ready == 2).then_some(()))
    })
    .await?;

    // Kill the leader; the standby takes over within the lease duration (plus its retry period).
    // The API server's clock and ours are the same machine's: every write the audit log dates
    // before this instant happened before the failover.
    let failover = jiff::Timestamp::now();
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

    // Who wrote what, as the API server saw it.
    let audit = AuditLog::read(&testbed)?;
    let (leader, standby) = (
        service_account_user("replica-a"),
        service_account_user("replica-b"),
    );
    let leader_writes = audit.writes_by(&leader);
    let standby_writes = audit.writes_by(&standby);
    // The positive control: the log does hold the operator's writes, so an empty list for the
    // standby means it wrote nothing, not that nothing was logged.
    ensure!(
        wrote(&leader_writes, "leases") && wrote(&leader_writes, "nodemaintenances"),
        "the audit log holds no Lease and NodeMaintenance writes of the first leader ({leader}): \
         is tests/testbed/audit-policy.yaml logging the operator's writes? Its writes: {}",
        describe_writes(&leader_writes)
    );
    let before_failover: Vec<&WriteCall> = standby_writes
        .iter()
        .copied()
        .filter(|w| w.received < failover)
        .collect();
    ensure!(
        before_failover.is_empty(),
        "the standby ({standby}) wrote while the other replica led: {}",
        describe_writes(&before_failover)
    );
    ensure!(
        wrote(&standby_writes, "leases") && wrote(&standby_writes, "nodemaintenances"),
        "the new leader ({standby}) took the Lease and finished the requests, yet the audit log \
         shows none of its Lease and NodeMaintenance writes: {}",
        describe_writes(&standby_writes)
    );
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
