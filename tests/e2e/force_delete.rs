//! The escalation deadline `drainSpec.forceDeleteAfterSeconds` on a live control plane: a pod
//! whose PodDisruptionBudget allows no disruption is deleted (not evicted) once the deadline has
//! passed since the drain began, and the request says so (status, Warning Events on the request
//! and on the pod, the metric); the same drain without the field stays blocked.
//!
//! Who deleted what and when comes from the API server's audit log (`tests/support/audit.rs`),
//! not from the operator's word: the shared operator runs as the testbed's admin, and nothing else
//! deletes pods as that user in the test's namespace.
//!
//! ```sh
//! PATH="$(tests/testbed/testbed bin-dir):$PATH" cargo test --test e2e force_delete::
//! ```

use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use maintenance_crds::{DrainSpec, NodeMaintenance, Phase, condition_type};
use support::audit::{AuditLog, seconds_between};
use support::invariants::*;
use support::operator::*;
use support::*;

/// Deadline of every wait for something the operator must do.
const WAIT: Duration = Duration::from_secs(60);
/// The escalation deadline of the test's request.
const DEADLINE_SECONDS: i32 = 5;
const REQUESTOR: &str = "force-delete.example.com";

fn drain_with_deadline(deadline: Option<i32>) -> Option<DrainSpec> {
    Some(DrainSpec {
        force_delete_after_seconds: deadline,
        ..DrainSpec::default()
    })
}

/// When the request's current phase began, as the operator reads it (the `Ready` condition's
/// `lastTransitionTime`, to the second).
fn phase_start(request: &NodeMaintenance) -> Result<jiff::Timestamp> {
    request
        .condition(condition_type::READY)
        .map(|c| c.last_transition_time.0)
        .with_context(|| format!("{} has no Ready condition", request.key()))
}

#[tokio::test]
async fn a_budget_is_bypassed_past_the_deadline_and_only_with_it() -> Result<()> {
    let (client, ns, nodes) = isolated_setup("force", 2).await?;
    let shared = shared_cluster().await?;
    // Bypassing budget `guarded` by a DELETE is what this test asks for: that budget is left out
    // of the PDB check, and the monitor's pod-deletion check is off (it would flag that DELETE):
    // it is done below from the audit log, exactly. Budget `held` stays checked.
    let monitor = InvariantMonitor::start(
        shared.testbed,
        Scope::new(&ns, &nodes).excluding_pdb("guarded"),
    )
    .await?;

    // 0 is refused: "at once" would ignore budgets altogether, and 0 means "forever" in the
    // sibling timeoutSeconds.
    let mut zero = request_spec(&nodes[0], REQUESTOR);
    zero.drain_spec = drain_with_deadline(Some(0));
    match Api::<NodeMaintenance>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &NodeMaintenance::new("zero", zero))
        .await
    {
        Ok(_) => bail!("the API server accepted forceDeleteAfterSeconds: 0"),
        Err(err) => match api_error(&err) {
            Some((422, message)) if message.contains("forceDeleteAfterSeconds") => {}
            _ => bail!("want 422 naming forceDeleteAfterSeconds, got {err:?}"),
        },
    }

    // One pod per node that its budget never lets go.
    let guarded = blocked_workload(&client, &ns, "guarded", &nodes[0], 1, WAIT).await?;
    let held = blocked_workload(&client, &ns, "held", &nodes[1], 1, WAIT).await?;
    let (guarded, held) = (guarded[0].name_any(), held[0].name_any());
    let mut spec = request_spec(&nodes[0], REQUESTOR);
    spec.drain_spec = drain_with_deadline(Some(DEADLINE_SECONDS));
    create_request(&client, &ns, "forced", spec).await?;
    let mut spec = request_spec(&nodes[1], REQUESTOR);
    spec.drain_spec = drain_with_deadline(None);
    create_request(&client, &ns, "control", spec).await?;

    let draining = wait_request(&client, &ns, "forced", "Draining", WAIT, |r| {
        r.phase() == Phase::Draining
    })
    .await?;
    let started = phase_start(&draining)?;
    let ready = wait_phase(&client, &ns, "forced", Phase::Ready, WAIT).await?;

    // The status names the pod and the budget it bypassed.
    let key = format!("{ns}/{guarded}");
    let drain = ready
        .status
        .as_ref()
        .and_then(|s| s.drain.clone())
        .context("no status.drain")?;
    ensure!(
        drain.force_deleted.len() == 1
            && drain.force_deleted[0].pod == key
            && drain.force_deleted[0].pdb == "guarded",
        "status.drain.forceDeleted: {:?}",
        drain.force_deleted
    );
    let message = &ready
        .condition(condition_type::READY)
        .context("no Ready condition")?
        .message;
    ensure!(
        message.contains(&key) && message.contains("guarded"),
        "the Ready message names the pod and the budget: {message}"
    );

    // A Warning Event on the request and one on the pod, each naming both.
    for about in ["forced", guarded.as_str()] {
        let event = wait_event(&client, &ns, about, "ForceDeleted", WAIT).await?;
        ensure!(
            event.type_.as_deref() == Some("Warning"),
            "the ForceDeleted Event about {about} is a {:?}",
            event.type_
        );
        let note = event.note.unwrap_or_default();
        ensure!(
            note.contains(&key) && note.contains(&format!("PodDisruptionBudget {ns}/guarded")),
            "the Event about {about} names the pod and the budget: {note}"
        );
    }

    // The API server's record: no eviction accepted (the per-budget gate holds them without a
    // call, or the budget refuses them), then one DELETE of the operator's,
    // no earlier than the deadline after the drain began; the pod then terminated through its own
    // grace period (KWOK, playing the kubelet, removed it, which a grace period of 0 would not
    // have left it to do).
    let audit = AuditLog::read(shared.testbed)?.in_namespace(&ns);
    let evictions = audit.evictions_of(&ns, &guarded);
    ensure!(
        evictions.iter().all(|e| e.code == 429),
        "no eviction may pass the budget: {:?}",
        evictions.iter().map(|e| e.code).collect::<Vec<_>>()
    );
    let deletions: Vec<_> = audit
        .pod_deletions
        .iter()
        .filter(|d| d.pod == guarded)
        .collect();
    let ours: Vec<_> = deletions
        .iter()
        .filter(|d| d.user == shared.operator_user)
        .collect();
    ensure!(
        ours.len() == 1 && ours[0].code == 200,
        "one DELETE by the operator: {deletions:?}"
    );
    let after = seconds_between(started, ours[0].received);
    println!(
        "the pod was deleted {after:.2}s after the drain began (deadline {DEADLINE_SECONDS}s)"
    );
    ensure!(
        after >= f64::from(DEADLINE_SECONDS),
        "deleted {after:.2}s after the drain began, before the {DEADLINE_SECONDS}s deadline"
    );
    ensure!(
        deletions
            .iter()
            .any(|d| d.user != shared.operator_user && d.received >= ours[0].received),
        "the pod was not left to terminate with its grace period: {deletions:?}"
    );

    let sample = format!(
        "maintenance_operator_pods_force_deleted_total{{namespace=\"{ns}\",pdb=\"guarded\"}}"
    );
    let counted = wait_for("the force-deletion metric", WAIT, || async {
        Ok(shared.operator.metric(&sample).await.ok())
    })
    .await?;
    ensure!(counted == 1.0, "{sample} = {counted}");

    // The control, past the same deadline: still draining, its pod never deleted.
    let control = wait_request(
        &client,
        &ns,
        "control",
        "Draining for longer than the deadline",
        WAIT,
        |r| {
            r.phase() == Phase::Draining
                && phase_start(r).is_ok_and(|at| {
                    seconds_between(at, jiff::Timestamp::now()) > f64::from(DEADLINE_SECONDS + 1)
                })
        },
    )
    .await?;
    let pod = Api::<Pod>::namespaced(client.clone(), &ns)
        .get(&held)
        .await
        .with_context(|| format!("the control's pod {ns}/{held}"))?;
    ensure!(
        pod.metadata.deletion_timestamp.is_none(),
        "the control's pod is terminating"
    );
    let blocked = control
        .status
        .as_ref()
        .and_then(|s| s.drain.as_ref())
        .map(|d| (d.blocked.clone(), d.force_deleted.clone()))
        .unwrap_or_default();
    ensure!(
        blocked.0.iter().any(|b| b.reason == "PDB") && blocked.1.is_empty(),
        "the control waits on its budget: {blocked:?}"
    );
    let audit = AuditLog::read(shared.testbed)?.in_namespace(&ns);
    ensure!(
        !audit.pod_deletions.iter().any(|d| d.pod == held),
        "the control's pod was deleted: {:?}",
        audit.pod_deletions
    );

    for name in ["forced", "control"] {
        release_request(&client, &ns, name, WAIT).await?;
    }
    monitor.held().await
}

/// `forceDeleteAfterSeconds` never fires early. For deadlines of 1 s and 10 s, five requests each
/// (at once, on nodes of their own, each with a pod its budget never lets go): every pod's DELETE,
/// as the API server recorded it, comes at least the deadline after the test's clock read just
/// before the request was created, a lower bound of when its drain began. The previous rule
/// counted from the whole second of the Draining condition: a 10 s deadline deleted 9.08-9.74 s
/// after the drain began, and a 1 s one could delete almost at once.
#[tokio::test]
async fn the_escalation_deadline_never_fires_early() -> Result<()> {
    const RUNS: usize = 5;
    const DEADLINES: [i32; 2] = [1, 10];
    let (client, ns, nodes) = isolated_setup("force-early", RUNS * DEADLINES.len()).await?;
    let shared = shared_cluster().await?;
    let runs: Vec<(usize, i32)> = DEADLINES
        .iter()
        .flat_map(|&deadline| (0..RUNS).map(move |_| deadline))
        .enumerate()
        .collect();
    // The DELETE past the deadline is what this test asks for: those budgets are left out of the
    // monitor's PDB check, and its pod-deletion check is done below from the audit log.
    let scope = runs.iter().fold(Scope::new(&ns, &nodes), |scope, (i, _)| {
        scope.excluding_pdb(&format!("early-{i}"))
    });
    let monitor = InvariantMonitor::start(shared.testbed, scope).await?;
    let mut pods = Vec::new();
    for (i, _) in &runs {
        let pod =
            blocked_workload(&client, &ns, &format!("early-{i}"), &nodes[*i], 1, WAIT).await?;
        pods.push(pod[0].name_any());
    }
    let mut created = Vec::new();
    for (i, deadline) in &runs {
        let mut spec = request_spec(&nodes[*i], REQUESTOR);
        spec.drain_spec = drain_with_deadline(Some(*deadline));
        let before = jiff::Timestamp::now();
        create_request(&client, &ns, &format!("early-{i}"), spec).await?;
        created.push(before);
    }
    for (i, _) in &runs {
        wait_phase(&client, &ns, &format!("early-{i}"), Phase::Ready, WAIT).await?;
    }

    let audit = AuditLog::read(shared.testbed)?.in_namespace(&ns);
    let mut earliest: std::collections::BTreeMap<i32, f64> = Default::default();
    for ((i, deadline), (pod, before)) in runs.iter().zip(pods.iter().zip(&created)) {
        let deleted = audit
            .pod_deletions
            .iter()
            .find(|d| &d.pod == pod && d.user == shared.operator_user && d.code == 200)
            .with_context(|| {
                format!("no DELETE of {ns}/{pod} (request early-{i}) by the operator")
            })?;
        let after = seconds_between(*before, deleted.received);
        ensure!(
            after >= f64::from(*deadline),
            "request early-{i}: its pod was deleted {after:.3}s after the request was created, \
             before its {deadline}s deadline"
        );
        let least = earliest.entry(*deadline).or_insert(f64::MAX);
        *least = least.min(after);
    }
    for (deadline, after) in &earliest {
        println!(
            "forceDeleteAfterSeconds {deadline}: earliest DELETE {after:.3}s after the request was \
             created ({RUNS} runs)"
        );
    }
    for (i, _) in &runs {
        release_request(&client, &ns, &format!("early-{i}"), WAIT).await?;
    }
    monitor.held().await
}
