//! Drain-aware admission (`spec.admission.preferDrainable`) on a live control plane, with the
//! operator running as a process: a request whose drain would only wait on a PodDisruptionBudget
//! is passed over for a drainable one, and says which budget holds it back.
//!
//! `PATH="$(tests/testbed/testbed bin-dir):$PATH" cargo test --test e2e admission::`

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use maintenance_crds::{Admission, MaintenanceOperatorConfig, MaintenanceOperatorConfigSpec};
use support::invariants::*;
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(60);
const REQUESTOR: &str = "admission.example.com";

#[tokio::test]
async fn prefer_drainable_passes_over_a_blocked_drain() -> Result<()> {
    let config = with_admission(1, |a| a.prefer_drainable = Some(true));
    let (testbed, client, ns, nodes) = own_cluster("drainable", 2, Some(config)).await?;
    let account = "admission-operator";
    let monitor = monitor_as(&testbed, &ns, &nodes, account).await?;
    // nodes[0] carries a pod behind a budget that allows no disruption; nodes[1] is empty.
    blocked_workload(&client, &ns, "guarded", &nodes[0], 1, WAIT).await?;

    // The blocked request is older: the plain order would admit it first.
    let drain = drain_spec(false, 300);
    create_request(
        &client,
        &ns,
        "blocked",
        maintenance_crds::NodeMaintenanceSpec {
            drain_spec: drain.clone(),
            ..request_spec(&nodes[0], REQUESTOR)
        },
    )
    .await?;
    // Creation timestamps have second resolution.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    create_request(
        &client,
        &ns,
        "drainable",
        maintenance_crds::NodeMaintenanceSpec {
            drain_spec: drain,
            ..request_spec(&nodes[1], REQUESTOR)
        },
    )
    .await?;
    let _op = Operator::start_as(&testbed, account, &[]).await?;

    let pdb = format!("PodDisruptionBudget {ns}/guarded");
    wait_until(
        "the drainable request admitted and the blocked one waiting on the budget",
        WAIT,
        || async {
            let requests = list_requests(&client, &ns).await?;
            let admitted = past_pending(&requests);
            ensure!(
                !admitted.iter().any(|n| n == "blocked"),
                "the blocked request was admitted: {admitted:?}"
            );
            let message = requests
                .iter()
                .find(|r| r.name_any() == "blocked")
                .and_then(pending_message)
                .unwrap_or_default()
                .to_string();
            Ok(
                if admitted == ["drainable"]
                    && message.contains("passed over for nodes whose drain can proceed")
                    && message.contains(&pdb)
                {
                    Check::Done(())
                } else {
                    Check::Pending(format!("admitted {admitted:?}; blocked says {message:?}"))
                },
            )
        },
    )
    .await?;

    // `plan` reads the pods and budgets too, and says the same.
    let plan = plan_json(&testbed)?;
    let waiting = plan["waiting"]
        .as_array()
        .context("plan -o json has no waiting list")?;
    let blocked = waiting
        .iter()
        .find(|w| w["name"] == format!("{ns}/blocked"))
        .with_context(|| format!("plan does not list {ns}/blocked as waiting: {plan}"))?;
    ensure!(blocked["cause"] == "drainBlocked", "{blocked}");
    ensure!(
        blocked["reason"].as_str().is_some_and(|r| r.contains(&pdb)),
        "{blocked}"
    );
    monitor.held().await
}

#[tokio::test]
async fn the_api_server_validates_admission() -> Result<()> {
    let (client, ns) = crd_namespace("admission-crd").await?;
    let api: kube::Api<MaintenanceOperatorConfig> = kube::Api::namespaced(client.clone(), &ns);
    let with = |name: &str, max_pass_over_seconds: i32| {
        MaintenanceOperatorConfig::new(
            name,
            MaintenanceOperatorConfigSpec {
                max_parallel_operations: Some(IntOrString::Int(2)),
                admission: Some(Admission {
                    prefer_drainable: Some(true),
                    max_pass_over_seconds: Some(max_pass_over_seconds),
                    ..Admission::default()
                }),
                ..MaintenanceOperatorConfigSpec::default()
            },
        )
    };
    // The example in docs/configuration.md is accepted.
    api.create(&Default::default(), &with("readme", 900))
        .await
        .context("the admission example of docs/configuration.md should be accepted")?;
    expect_invalid(
        &api,
        &with("negative", -1),
        &["spec.admission.maxPassOverSeconds"],
    )
    .await
}
