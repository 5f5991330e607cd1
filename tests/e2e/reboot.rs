//! A node rebooted while its request holds it, as nic-configuration-operator does: it waits for
//! its NodeMaintenance to be Ready, then reboots the node with the request still in place
//! (nic-configuration-operator's `internal/controller/nicdevice_controller.go` takes the request,
//! reboots, and releases it after). The node is NotReady for a while, then Ready again.
//!
//! The request must stay Ready through it: not failed, not drained again, not collected early;
//! and the limits must count the node once, as in maintenance, not again as unavailable. Here
//! `maxUnavailable: 2` lets exactly one more node in while the rebooted one is NotReady: counted
//! twice, the second request would wait.

use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use maintenance_crds::{NodeMaintenance, Phase, condition_type};
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(60);
const REQUESTOR: &str = "nic-configuration.example.com";

/// The status of `node`'s Ready condition, as the API server shows it.
async fn node_ready(client: &Client, node: &str) -> Result<Option<String>> {
    let node = Api::<Node>::all(client.clone()).get(node).await?;
    Ok(node
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status))
}

/// The kubelet of `node` goes away, as in a reboot: KWOK stops playing it (it manages only nodes
/// with its annotation) and the node reports NotReady.
async fn reboot_begins(client: &Client, node: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let unmanaged = serde_json::json!({ "metadata": { "annotations": {
        KWOK_NODE_ANNOTATION: null,
    } } });
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&unmanaged))
        .await?;
    let now = jiff::Timestamp::now().to_string();
    let not_ready = serde_json::json!({ "status": { "conditions": [{
        "type": "Ready",
        "status": "False",
        "reason": "KubeletNotReady",
        "message": "the node is rebooting",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }] } });
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&not_ready))
        .await?;
    Ok(())
}

/// The kubelet is back: KWOK plays it again and makes the node Ready.
async fn reboot_ends(client: &Client, node: &str) -> Result<()> {
    let managed = serde_json::json!({ "metadata": { "annotations": {
        KWOK_NODE_ANNOTATION: "fake",
    } } });
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&managed))
        .await?;
    Ok(())
}

/// What of a Ready request must not move while its node reboots: the phase, the Ready condition
/// (status, reason, message, transition time), no Failed condition, the drain's counts.
fn ready_fingerprint(request: &NodeMaintenance) -> Result<String> {
    ensure!(
        request.phase() == Phase::Ready,
        "{} is {}, not Ready",
        request.name_any(),
        request.phase()
    );
    let ready = request
        .condition(condition_type::READY)
        .map(|c| (&c.status, &c.reason, &c.message, &c.last_transition_time));
    ensure!(
        request.condition(condition_type::FAILED).is_none(),
        "{} has a Failed condition: {:?}",
        request.name_any(),
        request.condition(condition_type::FAILED)
    );
    let drain = request.status.as_ref().and_then(|s| s.drain.as_ref());
    Ok(format!("{ready:?} {drain:?}"))
}

#[tokio::test]
async fn a_ready_request_holds_its_node_through_a_reboot_and_counts_it_once() -> Result<()> {
    let (testbed, client, ns, nodes) = own_cluster("reboot", 3, Some(limits(3, 2))).await?;
    let (rebooted, second, third) = (&nodes[0], &nodes[1], &nodes[2]);
    let _operator = Operator::start(&testbed, &[]).await?;

    request_node(&client, &ns, "rebooted", rebooted, REQUESTOR).await?;
    let held = wait_phase(&client, &ns, "rebooted", Phase::Ready, WAIT).await?;
    let before = ready_fingerprint(&held)?;

    reboot_begins(&client, rebooted).await?;
    wait_for("the rebooting node to be NotReady", WAIT, || async {
        Ok((node_ready(&client, rebooted).await?.as_deref() != Some("True")).then_some(()))
    })
    .await?;

    // One more node may become unavailable: the rebooted node counts once.
    request_node(&client, &ns, "second", second, REQUESTOR).await?;
    wait_phase(&client, &ns, "second", Phase::Ready, WAIT).await?;
    request_node(&client, &ns, "third", third, REQUESTOR).await?;
    let waiting = wait_for(
        "the third request to wait for maxUnavailable",
        WAIT,
        || async {
            let request = get_request(&client, &ns, "third").await?;
            Ok(request.filter(|r| {
                r.phase() == Phase::Pending
                    && pending_message(r).is_some_and(|m| m.contains("maxUnavailable"))
            }))
        },
    )
    .await?;
    ensure!(
        node_ready(&client, rebooted).await?.as_deref() != Some("True"),
        "precondition: {rebooted} came back before the third request was explained"
    );
    let during = get_request(&client, &ns, "rebooted")
        .await?
        .ok_or_else(|| anyhow::anyhow!("the rebooted node's request is gone"))?;
    ensure!(
        ready_fingerprint(&during)? == before,
        "the request changed while its node was NotReady: {} then {}",
        before,
        ready_fingerprint(&during)?
    );
    ensure!(
        node_unschedulable(&client, rebooted).await?,
        "{rebooted} lost its cordon"
    );

    reboot_ends(&client, rebooted).await?;
    wait_for("the rebooted node to be Ready again", WAIT, || async {
        Ok((node_ready(&client, rebooted).await?.as_deref() == Some("True")).then_some(()))
    })
    .await?;
    // The third still waits for a slot of maxUnavailable, now that both nodes are back, until the
    // second request is released.
    release_request(&client, &ns, "second", WAIT).await?;
    wait_phase(&client, &ns, "third", Phase::Ready, WAIT).await?;
    let after = get_request(&client, &ns, "rebooted")
        .await?
        .ok_or_else(|| anyhow::anyhow!("the rebooted node's request is gone"))?;
    ensure!(
        ready_fingerprint(&after)? == before,
        "the request changed after its node came back: {} then {}",
        before,
        ready_fingerprint(&after)?
    );
    println!(
        "rebooted node held Ready through NotReady; the third request waited with: {}",
        pending_message(&waiting).unwrap_or_default()
    );

    for name in ["rebooted", "third"] {
        release_request(&client, &ns, name, WAIT).await?;
    }
    for node in [rebooted, second, third] {
        ensure!(
            !node_unschedulable(&client, node).await?,
            "{node} left cordoned"
        );
    }
    Ok(())
}
