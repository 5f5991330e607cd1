//! `admission.yieldBlockedDrainAfterSeconds` on a live control plane: with one slot, a request
//! whose drain a PodDisruptionBudget blocks gives the slot back (its node uncordoned, the request
//! Pending with a message naming the budget and the pod, a Warning Event `Yielded`, the yield
//! counted on the object and in `/metrics`), the next request takes the slot and becomes Ready,
//! and the yielded request is admitted again later and finishes once the budget relents. Without
//! the feature the first request would hold the slot for good and the second never start.
//!
//! The config is cluster-wide and the limit counts every node: the test has a control plane of its
//! own.
//!
//! ```sh
//! PATH="$(tests/testbed/testbed bin-dir):$PATH" cargo test --test e2e yield_drain::
//! ```

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use maintenance_crds::{Admission, DrainSpec, FINALIZER, NodeMaintenance, Phase};
use support::invariants::*;
use support::operator::*;
use support::*;

/// Deadline of every wait for something the operator must do.
const WAIT: Duration = Duration::from_secs(60);
/// The yield period of the test's config.
const YIELD_SECONDS: i32 = 5;
const REQUESTOR: &str = "yield.example.com";
const OPERATOR_ACCOUNT: &str = "yield-operator";
const YIELD_COUNT: &str = "maintenance.nvidia.com/yield-count";
const YIELDED_METRIC: &str = "maintenance_operator_requests_yielded_total";

fn annotation<'r>(request: &'r NodeMaintenance, key: &str) -> Option<&'r str> {
    request.annotations().get(key).map(String::as_str)
}

fn draining_request(node: &str) -> maintenance_crds::NodeMaintenanceSpec {
    let mut spec = request_spec(node, REQUESTOR);
    spec.drain_spec = Some(DrainSpec::default());
    spec
}

#[tokio::test]
async fn a_drain_blocked_by_a_budget_gives_its_slot_to_the_next_request() -> Result<()> {
    let mut config = limits(1, None);
    config.admission = Some(Admission {
        yield_blocked_drain_after_seconds: Some(YIELD_SECONDS),
        ..Admission::default()
    });
    let (testbed, client, ns, nodes) = own_cluster("yield", 2, Some(config)).await?;
    let (node_a, node_b) = (&nodes[0], &nodes[1]);

    // Node A: one pod whose budget allows no disruption; node B: an ordinary pod.
    let labels = [("app", "guarded")];
    create_deployment(
        &client,
        &ns,
        "guarded",
        1,
        &labels,
        &PodSpecOptions::on_node(node_a),
    )
    .await?;
    let guarded = wait_pods_ready(&client, &ns, "app=guarded", 1, WAIT).await?;
    let guarded = format!("{ns}/{}", guarded[0].name_any());
    create_pdb_max_unavailable(&client, &ns, "guarded", &labels, IntOrString::Int(0)).await?;
    wait_pdb_disruptions_allowed(&client, &ns, "guarded", 0, WAIT)
        .await
        .context("precondition: the PodDisruptionBudget must allow no disruption")?;
    create_app_deployment(&client, &ns, "plain", 1, &PodSpecOptions::on_node(node_b)).await?;
    wait_pods_ready(&client, &ns, "app=plain", 1, WAIT).await?;

    let monitor = monitor_as(&testbed, &ns, &nodes, OPERATOR_ACCOUNT).await?;
    let op = Operator::start_as(&testbed, OPERATOR_ACCOUNT, &[]).await?;

    // A first, and admitted; then B, which waits for the one slot.
    create_request(&client, &ns, "a", draining_request(node_a)).await?;
    wait_phase(&client, &ns, "a", Phase::Draining, WAIT).await?;
    ensure!(
        node_unschedulable(&client, node_a).await?,
        "{node_a} is not cordoned while its drain runs"
    );
    create_request(&client, &ns, "b", draining_request(node_b)).await?;
    let draining_since = std::time::Instant::now();

    // A yields: Pending again, with its yield recorded and the budget and the pod named.
    let yielded = wait_request(&client, &ns, "a", "Pending after a yield", WAIT, |r| {
        r.phase() == Phase::Pending && annotation(r, YIELD_COUNT) == Some("1")
    })
    .await?;
    println!(
        "a yielded {:.1}s after b was created (yield period {YIELD_SECONDS}s)",
        draining_since.elapsed().as_secs_f64()
    );
    ensure!(
        !yielded.finalizers().iter().any(|f| f == FINALIZER),
        "a yielded request keeps no finalizer of ours: {:?}",
        yielded.finalizers()
    );
    ensure!(
        !yielded.admitted_by_us(),
        "a yielded request no longer carries its admission"
    );
    let message = pending_message(&yielded).unwrap_or_default().to_string();
    let budget = format!("PodDisruptionBudget {ns}/guarded");
    ensure!(
        message.contains(&budget) && message.contains(&guarded),
        "the Pending message names the budget and the pod: {message}"
    );
    ensure!(
        !node_unschedulable(&client, node_a).await?,
        "{node_a} is still cordoned after its request yielded"
    );
    let event = wait_event(&client, &ns, "a", "Yielded", WAIT).await?;
    ensure!(
        event.type_.as_deref() == Some("Warning"),
        "the Yielded Event is a {:?}",
        event.type_
    );
    let note = event.note.unwrap_or_default();
    ensure!(
        note.contains(&budget) && note.contains(&guarded),
        "the Yielded Event names the budget and the pod: {note}"
    );
    let counted = wait_for("the yield in /metrics", WAIT, || async {
        Ok(op.metric(YIELDED_METRIC).await.ok().filter(|v| *v >= 1.0))
    })
    .await?;
    ensure!(counted == 1.0, "{YIELDED_METRIC} = {counted}");

    // B takes the slot and finishes; A waits meanwhile (its back-off, then B's slot).
    wait_phase(&client, &ns, "b", Phase::Ready, WAIT).await?;
    let a = get_request(&client, &ns, "a")
        .await?
        .context("request a is gone")?;
    ensure!(
        a.phase() == Phase::Pending,
        "a was admitted again beside b: {}",
        describe(&a)
    );

    // The budget relents and B is released: A is admitted again and finishes.
    Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns)
        .patch(
            "guarded",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "maxUnavailable": 1 } })),
        )
        .await
        .context("relaxing PodDisruptionBudget guarded")?;
    release_request(&client, &ns, "b", WAIT).await?;
    let ready = wait_phase(&client, &ns, "a", Phase::Ready, WAIT).await?;
    println!(
        "a is Ready after {} yield(s)",
        annotation(&ready, YIELD_COUNT).unwrap_or("?")
    );
    ensure!(
        ready.admitted_by_us(),
        "a became Ready without being admitted again"
    );
    release_request(&client, &ns, "a", WAIT).await?;
    ensure!(
        !node_unschedulable(&client, node_a).await?,
        "{node_a} is left cordoned after a was released"
    );

    monitor.held().await?;
    drop(op);
    testbed.stop().await
}
