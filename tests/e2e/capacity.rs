//! Capacity-aware admission (`spec.admission.checkCapacity`) on a live control plane: a node
//! whose pods would not fit on the other nodes is not admitted, its Pending message, `plan` and
//! the metrics say what is missing and by how much; once a node is added it is admitted, drained,
//! and its pod runs on the new node. While every slot is taken, neither `checkCapacity` nor
//! `preferDrainable` reads a pod. On testbeds of their own: capacity counts every node.
//!
//! `PATH="$(tests/testbed/testbed bin-dir):$PATH" cargo test --test e2e capacity::`

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use maintenance_crds::Phase;
use support::audit::{AuditLog, BENCH_OPERATOR_ACCOUNT};
use support::invariants::*;
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(60);
const REQUESTOR: &str = "capacity.example.com";

#[tokio::test]
async fn a_node_whose_pods_do_not_fit_waits_until_capacity_is_added() -> Result<()> {
    let config = with_admission(10, |a| a.check_capacity = Some(true));
    let (testbed, client) = own_testbed(Some(config)).await?;
    // Two nodes of 2 CPU; one 1500m pod on each: neither node has room for the other's pod.
    let prefix = unique_name("cap");
    let nodes = create_nodes_with(&client, &prefix, 2, &NodeOptions::sized("2", "4Gi")).await?;
    wait_nodes_ready(&client, &nodes, WAIT).await?;
    let ns = unique_name("capacity");
    create_namespace(&client, &ns).await?;
    let pod = PodSpecOptions::on_nodes_with_prefix(&prefix).requesting("1500m", "1Gi");
    create_app_deployment(&client, &ns, "web", 2, &pod).await?;
    let pods = wait_pods_ready(&client, &ns, "app=web", 2, WAIT).await?;
    let on_first: Vec<String> = pods
        .iter()
        .filter(|p| pod_node(p) == Some(nodes[0].as_str()))
        .map(|p| format!("{ns}/{}", p.name_any()))
        .collect();
    ensure!(
        on_first.len() == 1,
        "precondition: one pod on each node, got {on_first:?} on {}",
        nodes[0]
    );
    let account = "capacity-operator";
    let monitor = monitor_as(&testbed, &ns, &nodes, account).await?;
    let op = Operator::start_as(&testbed, account, &[]).await?;

    let mut spec = request_spec(&nodes[0], REQUESTOR);
    spec.drain_spec = drain_spec(false, 0);
    create_request(&client, &ns, "first", spec).await?;
    let expected = format!(
        "pods of {} need 1 CPU more than the 1 remaining schedulable nodes have free; largest unplaceable pod {} needs 1500m CPU and 1Gi",
        nodes[0], on_first[0]
    );
    wait_for("the request held back for capacity", WAIT, || async {
        let request = get_request(&client, &ns, "first")
            .await?
            .context("request gone")?;
        Ok((pending_message(&request) == Some(expected.as_str())).then_some(()))
    })
    .await?;
    // More rounds admit nothing, and the node stays schedulable.
    wait_scheduler_rounds(&op, 3).await?;
    ensure_phase(
        &client,
        &ns,
        "first",
        Phase::Pending,
        "admitted without room",
    )
    .await?;
    ensure!(
        !node_unschedulable(&client, &nodes[0]).await?,
        "{} was cordoned although its pods do not fit",
        nodes[0]
    );
    ensure!(
        op.metric("maintenance_operator_requests_waiting{cause=\"insufficientCapacity\"}")
            .await?
            == 1.0,
        "the waiting-requests metric does not count the request"
    );
    let plan = plan_json(&testbed)?;
    let waiting = &plan["waiting"][0];
    ensure!(
        waiting["cause"] == "insufficientCapacity" && waiting["reason"] == expected.as_str(),
        "plan does not say what does not fit: {plan}"
    );
    ensure!(
        plan["capacity"]["schedulableNodes"] == 2,
        "plan's capacity: {plan}"
    );

    // Capacity is added: the request is admitted, drained, and its pod runs on the new node.
    let extra = format!("{prefix}-extra");
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &node_object(&extra, &prefix, &NodeOptions::sized("2", "4Gi")),
        )
        .await
        .context("creating the extra node")?;
    wait_nodes_ready(&client, std::slice::from_ref(&extra), WAIT).await?;
    wait_phase(&client, &ns, "first", Phase::Ready, WAIT).await?;
    ensure!(
        node_unschedulable(&client, &nodes[0]).await?,
        "{} is Ready but not cordoned",
        nodes[0]
    );
    let pods = wait_pods_ready(&client, &ns, "app=web", 2, WAIT).await?;
    let placement: Vec<Option<&str>> = pods.iter().map(pod_node).collect();
    ensure!(
        placement.contains(&Some(extra.as_str())) && !placement.contains(&Some(nodes[0].as_str())),
        "the evicted pod should run on the new node: {placement:?}"
    );
    let left: Vec<Pod> = Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", nodes[0])))
        .await?
        .items;
    ensure!(
        left.is_empty(),
        "pods left on the drained node: {}",
        left.len()
    );
    monitor.held().await
}

/// `checkCapacity` lists every pod of the cluster, and `preferDrainable` the pods of each Pending
/// request's node; both used to do it on every scheduling round, also while every slot was taken
/// and nothing could be admitted (most rounds of a rollout: on a big fleet, a list of every pod
/// many times a second). Now those rounds read nothing (`scheduler::can_admit_any`), counted from
/// the API server's audit log, which logs the reads of this operator's account; once the slot
/// frees, the next request is admitted through both checks.
#[tokio::test]
async fn rounds_with_every_slot_taken_read_no_pods() -> Result<()> {
    const ROUNDS: u32 = 10;
    let config = with_admission(1, |a| {
        a.check_capacity = Some(true);
        a.prefer_drainable = Some(true);
    });
    let (testbed, client, ns, nodes) = own_cluster("capidle", 3, Some(config)).await?;
    let pod = PodSpecOptions::on_nodes_with_prefix("capidle");
    create_app_deployment(&client, &ns, "web", 3, &pod).await?;
    wait_pods_ready(&client, &ns, "app=web", 3, WAIT).await?;
    // preferDrainable reads the pods of waiting nodes only when some budget exists.
    create_pdb_max_unavailable(&client, &ns, "web", &[("app", "web")], IntOrString::Int(1)).await?;
    let monitor = monitor_as(&testbed, &ns, &nodes, BENCH_OPERATOR_ACCOUNT).await?;
    let op = Operator::start_as(&testbed, BENCH_OPERATOR_ACCOUNT, &[]).await?;

    // The holder takes the only slot and keeps it (Ready until deleted); two drains wait.
    request_node(&client, &ns, "holder", &nodes[0], REQUESTOR).await?;
    wait_phase(&client, &ns, "holder", Phase::Ready, WAIT).await?;
    for (name, node) in [("second", &nodes[1]), ("third", &nodes[2])] {
        let mut spec = request_spec(node, REQUESTOR);
        spec.drain_spec = drain_spec(false, 0);
        create_request(&client, &ns, name, spec).await?;
        wait_phase(&client, &ns, name, Phase::Pending, WAIT).await?;
    }
    wait_scheduler_rounds(&op, 1).await?;
    let since = jiff::Timestamp::now();
    // Each node change brings a round.
    for i in 0..ROUNDS {
        for node in &nodes {
            set_node_label(
                &client,
                node,
                "capidle.example.com/touch",
                Some(&i.to_string()),
            )
            .await?;
        }
    }
    wait_scheduler_rounds(&op, ROUNDS).await?;
    let audit = AuditLog::read(&testbed)?;
    let pod_lists: Vec<String> = audit
        .reads
        .iter()
        .filter(|r| {
            r.received > since
                && r.user == service_account_user(BENCH_OPERATOR_ACCOUNT)
                && r.verb == "list"
                && r.resource == "pods"
        })
        .map(|r| format!("{} {}", r.received, r.namespace))
        .collect();
    ensure!(
        pod_lists.is_empty(),
        "{} pod lists in {ROUNDS} or more rounds that could admit nothing: {pod_lists:?}",
        pod_lists.len()
    );

    // A slot frees: the next request is admitted, through both checks.
    release_request(&client, &ns, "holder", WAIT).await?;
    wait_for("the next request to be admitted", WAIT, || async {
        let admitted = list_requests(&client, &ns)
            .await?
            .into_iter()
            .any(|r| r.phase() != Phase::Pending);
        Ok(admitted.then_some(()))
    })
    .await?;
    let audit = AuditLog::read(&testbed)?;
    ensure!(
        audit.reads.iter().any(|r| r.received > since
            && r.user == service_account_user(BENCH_OPERATOR_ACCOUNT)
            && r.verb == "list"
            && r.resource == "pods"),
        "precondition: the round that admitted read no pods, so the checks were not on"
    );
    release_all_when_ready(&client, &ns, WAIT).await?;
    monitor.held().await
}
