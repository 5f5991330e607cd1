//! Node groups (`maintenance.nvidia.com/group`): the requests of a rack are admitted all
//! together in one round or not at all, the free slots a waiting group needs are kept from the
//! requests behind it, and a group larger than a limit says so and by how much.
//!
//! Without node groups, the first scenario admits the rack's first two requests as soon as they
//! are created, and the single request behind them takes the next slot: the test fails on the
//! first check of the nodes.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use maintenance_crds::{NODE_GROUP_LABEL, NODE_GROUP_SIZE_ANNOTATION, NodeMaintenance, Phase};
use support::invariants::*;
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(60);
const OPERATOR_ACCOUNT: &str = "groups-operator";
const REQUESTOR: &str = "racks.example.com";

/// Creates request `name` for `node`, in node group `group` of `size` requests.
async fn grouped_request(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    (group, size): (&str, usize),
) -> Result<NodeMaintenance> {
    let mut request = NodeMaintenance::new(name, request_spec(node, REQUESTOR));
    request.metadata.labels = Some(BTreeMap::from([(
        NODE_GROUP_LABEL.to_string(),
        group.to_string(),
    )]));
    request.metadata.annotations = Some(BTreeMap::from([(
        NODE_GROUP_SIZE_ANNOTATION.to_string(),
        size.to_string(),
    )]));
    Ok(Api::<NodeMaintenance>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &request)
        .await?)
}

/// Each Pending request's message, by name.
async fn pending_messages(client: &Client, ns: &str) -> Result<BTreeMap<String, String>> {
    Ok(list_requests(client, ns)
        .await?
        .iter()
        .filter(|r| r.phase() == Phase::Pending)
        .map(|r| {
            (
                r.name_any(),
                pending_message(r).unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// Waits until the Pending messages satisfy `holds`; on timeout, the error shows them.
async fn wait_messages(
    client: &Client,
    ns: &str,
    what: &str,
    holds: impl Fn(&BTreeMap<String, String>) -> bool,
) -> Result<()> {
    let seen = std::sync::Mutex::new(BTreeMap::new());
    let waited = wait_for(what, WAIT, || async {
        let messages = pending_messages(client, ns).await?;
        let done = holds(&messages);
        if let Ok(mut seen) = seen.lock() {
            *seen = messages;
        }
        Ok(done.then_some(()))
    })
    .await;
    match waited {
        Ok(()) => Ok(()),
        Err(err) => Err(err.context(format!("the Pending messages: {seen:#?}"))),
    }
}

/// Fails if any of `nodes` is cordoned: a group admitted in part.
async fn none_cordoned(client: &Client, nodes: &[String]) -> Result<()> {
    for node in nodes {
        ensure!(
            !node_unschedulable(client, node).await?,
            "node {node} is cordoned: its group was admitted in part"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_rack_is_admitted_whole_in_one_round_and_singles_do_not_pass_it() -> Result<()> {
    let (testbed, client, ns, nodes) = own_cluster("groups", 8, Some(limits(3, None))).await?;
    let monitor = monitor_as(&testbed, &ns, &nodes, OPERATOR_ACCOUNT).await?;
    let op = Operator::start_as(&testbed, OPERATOR_ACCOUNT, &[]).await?;

    // One slot of three is taken.
    request_node(&client, &ns, "busy", &nodes[0], REQUESTOR).await?;
    wait_phase(&client, &ns, "busy", Phase::Ready, WAIT).await?;
    // A rack of three, created one by one as requestors do: two of them wait for the third.
    let rack = &nodes[1..4];
    for (i, node) in rack.iter().take(2).enumerate() {
        grouped_request(&client, &ns, &format!("rack-a-{i}"), node, ("rack-a", 3)).await?;
    }
    wait_messages(
        &client,
        &ns,
        "the rack to wait for its third request",
        |messages| {
            messages.len() == 2
                && messages.values().all(|m| {
                    // A count that moved under the same cause is refreshed later (explain.rs).
                    m.contains(
                    "of the 3 requests its maintenance.nvidia.com/group-size annotation announces",
                )
                })
        },
    )
    .await?;
    none_cordoned(&client, rack).await?;
    grouped_request(&client, &ns, "rack-a-2", &rack[2], ("rack-a", 3)).await?;
    // Then a single request behind it.
    request_node(&client, &ns, "after", &nodes[4], REQUESTOR).await?;

    wait_messages(&client, &ns, "the rack and the single to say why they wait", |messages| {
        let rack_says = (0..3).all(|i| {
            messages.get(&format!("rack-a-{i}")).is_some_and(|m| {
                m.contains("node group \"rack-a\" (3 requests, admitted together) needs 3 free slots at once and 2 are")
            })
        });
        let after_says = messages
            .get("after")
            .is_some_and(|m| m.contains("waits ahead of it for free slots"));
        rack_says && after_says
    })
    .await?;
    // Over further rounds, nothing of the rack and not the single is admitted.
    wait_scheduler_rounds(&op, 3).await?;
    none_cordoned(&client, rack).await?;
    none_cordoned(&client, &nodes[4..5]).await?;
    ensure!(
        op.metric("maintenance_operator_requests_waiting{cause=\"behindGroup\"}")
            .await?
            == 1.0,
        "the single behind the rack is counted as behindGroup"
    );
    ensure!(
        op.metric("maintenance_operator_node_groups_waiting")
            .await?
            == 1.0,
        "one node group waits"
    );

    // The slot frees: the whole rack goes in one round, the single still waits.
    release_request(&client, &ns, "busy", WAIT).await?;
    wait_for("the whole rack to be admitted", WAIT, || async {
        let requests = list_requests(&client, &ns).await?;
        let admitted = past_pending(&requests);
        ensure!(
            !admitted.contains(&"after".to_string()),
            "the single passed the rack: {admitted:?}"
        );
        Ok((admitted.len() == 3).then_some(()))
    })
    .await?;
    let mut admitted_at = Vec::new();
    for node in rack {
        ensure!(node_unschedulable(&client, node).await?, "{node} cordoned");
    }
    for request in list_requests(&client, &ns).await? {
        if let Some(at) = request
            .annotations()
            .get(maintenance_crds::ADMITTED_TIME_ANNOTATION)
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        {
            admitted_at.push(at);
        }
    }
    ensure!(
        admitted_at.len() == 3,
        "three admission times: {admitted_at:?}"
    );
    let spread = admitted_at.iter().max().zip(admitted_at.iter().min());
    if let Some((last, first)) = spread {
        eprintln!(
            "rack-a: 3 requests admitted within {:.3} s of each other",
            (*last - *first).total(jiff::Unit::Second)?
        );
    }
    ensure!(
        op.metric("maintenance_operator_node_groups_admitted_total")
            .await?
            == 1.0,
        "one node group admitted"
    );

    // A rack of four under maxParallelOperations=3 can never fit: it says by how much and keeps
    // no slot from the single request.
    for i in 0..3 {
        release_request(&client, &ns, &format!("rack-a-{i}"), WAIT).await?;
    }
    wait_phase(&client, &ns, "after", Phase::Ready, WAIT).await?;
    let rack_b = [&nodes[0], &nodes[5], &nodes[6], &nodes[7]];
    for (i, node) in rack_b.iter().enumerate() {
        grouped_request(&client, &ns, &format!("rack-b-{i}"), node, ("rack-b", 4)).await?;
    }
    wait_messages(&client, &ns, "rack-b to say it can never fit", |messages| {
        (0..4).all(|i| {
            messages.get(&format!("rack-b-{i}")).is_some_and(|m| {
                m.contains("can never be admitted together: maxParallelOperations=3 allows 3 nodes in maintenance at once, 1 fewer than the group has")
            })
        })
    })
    .await?;
    ensure!(
        op.metric("maintenance_operator_requests_waiting{cause=\"groupCannotFit\"}")
            .await?
            == 4.0,
        "four requests counted as groupCannotFit"
    );
    // Raising the limit lets it in, once "after" gives its slot back.
    set_config(&client, limits(4, None)).await?;
    wait_messages(
        &client,
        &ns,
        "rack-b to wait for four free slots",
        |messages| {
            messages
                .get("rack-b-0")
                .is_some_and(|m| m.contains("needs 4 free slots at once and 3 are"))
        },
    )
    .await?;
    none_cordoned(&client, &nodes[5..8]).await?;
    release_request(&client, &ns, "after", WAIT).await?;
    for i in 0..4 {
        wait_phase(&client, &ns, &format!("rack-b-{i}"), Phase::Ready, WAIT).await?;
    }
    for i in 0..4 {
        release_request(&client, &ns, &format!("rack-b-{i}"), WAIT).await?;
    }
    none_cordoned(&client, &nodes).await?;
    monitor.finish().await?;
    Ok(())
}
