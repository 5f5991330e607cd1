//! The scheduling algorithm's worked examples, ordering and config edits, reproduced on a live
//! control plane with the operator running as a process. Limits count every node of the cluster,
//! so each test has a control plane of its own.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use kube::Client;
use maintenance_crds::{MaintenanceOperatorConfigSpec, Phase};
use support::invariants::*;
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(60);

struct Cluster {
    testbed: Testbed,
    client: Client,
    nodes: Vec<String>,
    ns: String,
}

/// A control plane with `nodes` Ready nodes (the first `unavailable` cordoned), the CRDs and the
/// config; the operator is started by the test.
async fn cluster(
    nodes: usize,
    unavailable: usize,
    config: MaintenanceOperatorConfigSpec,
) -> Result<Cluster> {
    let (testbed, client, ns, nodes) = own_cluster("sched", nodes, Some(config)).await?;
    for node in nodes.iter().take(unavailable) {
        cordon_node(&client, node).await?;
    }
    Ok(Cluster {
        testbed,
        client,
        nodes,
        ns,
    })
}

/// The operator's ServiceAccount: the audit log tells its calls apart.
const OPERATOR_ACCOUNT: &str = "sched-operator";

/// The invariant monitor over the whole (own) cluster, limits included, started before the
/// operator and the first request.
async fn monitor(c: &Cluster) -> Result<InvariantMonitor> {
    monitor_as(&c.testbed, &c.ns, &c.nodes, OPERATOR_ACCOUNT).await
}

/// Creates one request per (name, node, requestor), in order.
async fn requests(c: &Cluster, specs: &[(&str, &str, &str)]) -> Result<()> {
    for (name, node, requestor) in specs {
        request_node(&c.client, &c.ns, name, node, requestor).await?;
    }
    Ok(())
}

/// Waits until exactly `expected` requests are past Pending and the operator has run further
/// rounds without admitting more; returns their names.
async fn admitted_settles_at(c: &Cluster, op: &Operator, expected: usize) -> Result<Vec<String>> {
    wait_for(
        &format!("{expected} requests past Pending"),
        WAIT,
        || async {
            let admitted = past_pending(&list_requests(&c.client, &c.ns).await?);
            anyhow::ensure!(
                admitted.len() <= expected,
                "more than {expected} admitted: {admitted:?}"
            );
            Ok((admitted.len() == expected).then_some(()))
        },
    )
    .await?;
    // Rounds triggered by the tick and by the status writes of admitted requests.
    wait_scheduler_rounds(op, 3).await?;
    let all = list_requests(&c.client, &c.ns).await?;
    let admitted = past_pending(&all);
    assert_eq!(
        admitted.len(),
        expected,
        "admitted after more rounds: {admitted:?}"
    );
    // Everything else says Pending, with a condition (the operator saw it).
    for r in &all {
        if r.phase() == Phase::Pending {
            assert!(
                r.condition("Ready").is_some(),
                "{} has no Ready condition",
                r.key()
            );
        }
    }
    Ok(admitted)
}

/// A worked example as the tests below run it: the monitor and the operator started, then one
/// request of `requestor` per `(name, node index)`, in order; returns once `expected` of them are
/// admitted and stay so.
struct Example {
    c: Cluster,
    op: Operator,
    monitor: InvariantMonitor,
    admitted: Vec<String>,
}

impl Example {
    async fn finish(self) -> Result<()> {
        self.monitor.finish().await?;
        Ok(())
    }
}

async fn example(
    c: Cluster,
    requestor: &str,
    on: &[(&str, usize)],
    expected: usize,
) -> Result<Example> {
    let monitor = monitor(&c).await?;
    let op = Operator::start_as(&c.testbed, OPERATOR_ACCOUNT, &[]).await?;
    for (name, node) in on {
        request_node(&c.client, &c.ns, name, &c.nodes[*node], requestor).await?;
    }
    let admitted = admitted_settles_at(&c, &op, expected).await?;
    Ok(Example {
        c,
        op,
        monitor,
        admitted,
    })
}

/// Requests `names` become Ready, are released, and go.
async fn release_once_ready(c: &Cluster, names: &[&str]) -> Result<()> {
    for name in names {
        wait_phase(&c.client, &c.ns, name, Phase::Ready, WAIT).await?;
        release_request(&c.client, &c.ns, name, WAIT).await?;
    }
    Ok(())
}

#[tokio::test]
async fn example_one_max_parallel_limits_admission() -> Result<()> {
    // 10 nodes, maxParallelOperations=2, maxUnavailable=5, 5 pending -> 2 scheduled.
    let on = [("r0", 0), ("r1", 1), ("r2", 2), ("r3", 3), ("r4", 4)];
    let e = example(
        cluster(10, 0, limits(2, 5)).await?,
        "upgrade.example.com",
        &on,
        2,
    )
    .await?;
    // Each waiting request says why, in its Ready condition.
    wait_for(
        "the waiting requests to explain themselves",
        WAIT,
        || async {
            let all = list_requests(&e.c.client, &e.c.ns).await?;
            let explained = all.iter().filter(|r| r.phase() == Phase::Pending).all(|r| {
                r.condition("Ready")
                    .is_some_and(|c| c.message.contains("maxParallelOperations=2"))
            });
            Ok(explained.then_some(()))
        },
    )
    .await?;
    e.finish().await
}

#[tokio::test]
async fn example_two_max_unavailable_counts_unavailable_nodes() -> Result<()> {
    // 10 nodes of which 2 unavailable, maxParallelOperations=5, maxUnavailable=3,
    // 3 pending on available nodes -> 1 scheduled.
    let on = [("a", 2), ("b", 3), ("c", 4)];
    let c = cluster(10, 2, limits(5, 3)).await?;
    example(c, "fw.example.com", &on, 1).await?.finish().await
}

#[tokio::test]
async fn requests_on_unavailable_nodes_do_not_use_up_max_unavailable() -> Result<()> {
    // availableSlots=3 (maxParallelOperations=3), canBecomeUnavailable=1 (maxUnavailable=3 with 2
    // nodes cordoned): 2 requests on the unavailable nodes + 1 on an available node -> 3.
    let on = [
        ("on-cordoned-0", 0),
        ("on-cordoned-1", 1),
        ("on-available", 2),
    ];
    let e = example(
        cluster(10, 2, limits(3, 3)).await?,
        "os.example.com",
        &on,
        3,
    )
    .await?;
    // We did not cordon the nodes that were already cordoned, so we must not uncordon them.
    release_once_ready(&e.c, &["on-cordoned-0", "on-cordoned-1"]).await?;
    for node in &e.c.nodes[..2] {
        assert!(node_unschedulable(&e.c.client, node).await?);
    }
    e.finish().await
}

#[tokio::test]
async fn requests_on_available_nodes_are_bounded_by_can_become_unavailable() -> Result<()> {
    // Same limits, 3 requests on available nodes -> 1.
    let on = [("x", 2), ("y", 3), ("z", 4)];
    let c = cluster(10, 2, limits(3, 3)).await?;
    example(c, "os.example.com", &on, 1).await?.finish().await
}

#[tokio::test]
async fn max_unavailable_zero_only_lets_already_unavailable_nodes_proceed() -> Result<()> {
    let on = [("down-0", 0), ("down-1", 1), ("up-2", 2), ("up-3", 3)];
    let e = example(
        cluster(10, 2, limits(5, 0)).await?,
        "k8s.example.com",
        &on,
        2,
    )
    .await?;
    assert_eq!(e.admitted, vec!["down-0", "down-1"]);
    for name in ["down-0", "down-1"] {
        wait_phase(&e.c.client, &e.c.ns, name, Phase::Ready, WAIT).await?;
    }
    for node in &e.c.nodes[2..4] {
        assert!(!node_unschedulable(&e.c.client, node).await?);
    }
    // Lifting the limit lets the others go, without a restart.
    set_config(&e.c.client, limits(5, 4)).await?;
    admitted_settles_at(&e.c, &e.op, 4).await?;
    e.finish().await
}

#[tokio::test]
async fn ordering_prefers_requestors_in_progress_then_fewer_pending_then_older() -> Result<()> {
    let c = cluster(7, 0, limits(2, None)).await?;
    let monitor = monitor(&c).await?;
    let op = Operator::start_as(&c.testbed, OPERATOR_ACCOUNT, &[]).await?;
    let n = &c.nodes;
    // A and X take both slots; A's stays in progress throughout.
    requests(
        &c,
        &[
            ("a-1", &n[0], "a.example.com"),
            ("x-1", &n[1], "x.example.com"),
        ],
    )
    .await?;
    wait_phase(&c.client, &c.ns, "a-1", Phase::Ready, WAIT).await?;
    wait_phase(&c.client, &c.ns, "x-1", Phase::Ready, WAIT).await?;
    // Then, oldest first: B (2 pending), C (1 pending), A's second.
    requests(
        &c,
        &[
            ("b-1", &n[2], "b.example.com"),
            ("b-2", &n[3], "b.example.com"),
            ("c-1", &n[4], "c.example.com"),
            ("a-2", &n[5], "a.example.com"),
        ],
    )
    .await?;
    wait_scheduler_rounds(&op, 2).await?;
    let mut order = Vec::new();
    let mut previous = "x-1".to_string();
    for _ in 0..4 {
        release_request(&c.client, &c.ns, &previous, WAIT).await?;
        let next = wait_for("the next admission", WAIT, || async {
            let admitted: Vec<String> = past_pending(&list_requests(&c.client, &c.ns).await?)
                .into_iter()
                .filter(|name| name != "a-1")
                .collect();
            Ok(admitted.into_iter().next())
        })
        .await?;
        wait_phase(&c.client, &c.ns, &next, Phase::Ready, WAIT).await?;
        let admitted = past_pending(&list_requests(&c.client, &c.ns).await?);
        assert_eq!(
            admitted.len(),
            2,
            "one slot freed, one admitted: {admitted:?}"
        );
        order.push(next.clone());
        previous = next;
    }
    // a-2: its requestor has a maintenance in progress; c-1: fewer pending than B; then B by age.
    assert_eq!(order, vec!["a-2", "c-1", "b-1", "b-2"]);
    monitor.held().await
}

#[tokio::test]
async fn config_edits_apply_without_restart_and_deleting_it_restores_defaults() -> Result<()> {
    let on = [("r0", 0), ("r1", 1), ("r2", 2), ("r3", 3), ("r4", 4)];
    let e = example(
        cluster(6, 0, limits(1, None)).await?,
        "cfg.example.com",
        &on,
        1,
    )
    .await?;
    let (c, op) = (&e.c, &e.op);
    set_config(&c.client, limits(3, None)).await?;
    admitted_settles_at(c, op, 3).await?;
    // Without a config the default (maxParallelOperations 1) applies: 3 in progress, none more.
    kube::Api::<maintenance_crds::MaintenanceOperatorConfig>::namespaced(
        c.client.clone(),
        OPERATOR_NAMESPACE,
    )
    .delete("default", &Default::default())
    .await?;
    let admitted = admitted_settles_at(c, op, 3).await?;
    for name in &admitted {
        delete_request(&c.client, &c.ns, name).await?;
    }
    // With all three released, the default admits exactly one more.
    admitted_settles_at(c, op, 1).await?;
    e.finish().await
}

/// Nodes whose request waits for admission with a drain to do carry our PreferNoSchedule taint,
/// so the pods the first drain evicts land on the free node rather than on nodes that will be
/// drained next; a request deleted while it waits, an admission and `taintWaitingNodes: false`
/// each remove it (core: `pending_taint`).
#[tokio::test]
async fn nodes_waiting_to_drain_are_tainted_so_evicted_pods_go_elsewhere() -> Result<()> {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, ListParams, Patch, PatchParams};
    use maintenance_core::pending_taint::{PENDING_DRAIN_TAINT_KEY, has_pending_drain_taint};

    let c = cluster(4, 0, limits(1, None)).await?;
    let n = &c.nodes;
    let nodes_api: Api<Node> = Api::all(c.client.clone());
    let pool = "taint-test.example.com/pool";
    let label = |node: &str| {
        let nodes_api = nodes_api.clone();
        let node = node.to_string();
        async move {
            nodes_api
                .patch(
                    &node,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"labels": {pool: "yes"}}})),
                )
                .await
                .with_context(|| format!("labelling node {node}"))
        }
    };
    // Both pods start on the node maintained first; every node takes them afterwards.
    label(&n[0]).await?;
    create_app_deployment(
        &c.client,
        &c.ns,
        "web",
        2,
        &PodSpecOptions::on_nodes_labelled(pool, "yes"),
    )
    .await?;
    wait_pods_ready(&c.client, &c.ns, "app=web", 2, WAIT).await?;
    // The budget holds the first drain until the waiting nodes are seen tainted.
    create_pdb_min_available(
        &c.client,
        &c.ns,
        "web",
        &[("app", "web")],
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2),
    )
    .await?;
    wait_pdb_disruptions_allowed(&c.client, &c.ns, "web", 0, WAIT).await?;
    for node in &n[1..] {
        label(node).await?;
    }
    let monitor = monitor(&c).await?;
    let _op = Operator::start_as(&c.testbed, OPERATOR_ACCOUNT, &[]).await?;
    for (i, node) in n.iter().take(3).enumerate() {
        let mut spec = request_spec(node, "taint.example.com");
        spec.drain_spec = drain_spec(false, 60);
        create_request(&c.client, &c.ns, &format!("r{i}"), spec).await?;
        if i == 0 {
            wait_for("r0 admitted", WAIT, || async {
                let r = get_request(&c.client, &c.ns, "r0").await?;
                Ok(r.filter(|r| r.phase() != Phase::Pending))
            })
            .await?;
        }
    }
    let tainted = |names: &[&String], expected: bool| {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let nodes_api = nodes_api.clone();
        async move {
            wait_for(
                &format!("{names:?} tainted {PENDING_DRAIN_TAINT_KEY}: {expected}"),
                WAIT,
                || async {
                    for name in &names {
                        if has_pending_drain_taint(&nodes_api.get(name).await?) != expected {
                            return Ok(None);
                        }
                    }
                    Ok(Some(()))
                },
            )
            .await
        }
    };
    tainted(&[&n[1], &n[2]], true).await?;
    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(c.client.clone(), &c.ns)
        .delete("web", &Default::default())
        .await?;
    wait_phase(&c.client, &c.ns, "r0", Phase::Ready, WAIT).await?;
    for node in [&n[0], &n[3]] {
        ensure!(
            !has_pending_drain_taint(&nodes_api.get(node).await?),
            "{node} has no request waiting, yet it carries the taint"
        );
    }
    let pods = wait_pods_ready(&c.client, &c.ns, "app=web", 2, WAIT).await?;
    let placed: Vec<String> = pods
        .iter()
        .map(|p: &Pod| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default()
        })
        .collect();
    ensure!(
        placed.iter().all(|node| node == &n[3]),
        "the evicted pods went to {placed:?}: only {} has no maintenance to come",
        n[3]
    );

    // Deleted while it waits (no finalizer yet): its node loses the taint.
    delete_request(&c.client, &c.ns, "r2").await?;
    tainted(&[&n[2]], false).await?;
    // Turned off, then on again.
    let mut config = limits(1, None);
    config.admission = Some(maintenance_crds::Admission {
        taint_waiting_nodes: Some(false),
        ..maintenance_crds::Admission::default()
    });
    set_config(&c.client, config).await?;
    tainted(&[&n[1]], false).await?;
    set_config(&c.client, limits(1, None)).await?;
    tainted(&[&n[1]], true).await?;
    // Admitted: the cordon takes over and the taint goes.
    release_request(&c.client, &c.ns, "r0", WAIT).await?;
    wait_phase(&c.client, &c.ns, "r1", Phase::Ready, WAIT).await?;
    tainted(&[&n[1]], false).await?;
    release_request(&c.client, &c.ns, "r1", WAIT).await?;
    let left = nodes_api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(has_pending_drain_taint)
        .count();
    ensure!(left == 0, "{left} nodes still carry the taint");
    monitor.held().await
}

/// The messages of the Pending requests of `c`, once every one has a condition.
async fn pending_messages(c: &Cluster) -> Result<Vec<String>> {
    let all = list_requests(&c.client, &c.ns).await?;
    Ok(all
        .iter()
        .filter(|r| r.phase() == Phase::Pending)
        .map(|r| pending_message(r).unwrap_or_default().to_string())
        .collect())
}

/// A config the operator cannot use (a window in a time zone that does not exist: the CRD cannot
/// refuse it) replaces every waiting request's reason at once, naming the field; the fixed config
/// puts the real reason back. With the previous binary the requests kept saying "no free slot:
/// maxParallelOperations=1" and the cause was only in the log.
#[tokio::test]
async fn a_config_error_replaces_every_waiting_reason_at_once() -> Result<()> {
    let on = [("r0", 0), ("r1", 1), ("r2", 2)];
    let e = example(
        cluster(4, 0, limits(1, None)).await?,
        "cfg-error.example.com",
        &on,
        1,
    )
    .await?;
    let c = &e.c;
    let says_no_slot = |messages: &[String]| {
        messages.len() == 2
            && messages
                .iter()
                .all(|m| m.contains("maxParallelOperations=1"))
    };
    wait_for("both waiting requests to say why", WAIT, || async {
        Ok(says_no_slot(&pending_messages(c).await?).then_some(()))
    })
    .await?;

    let mut broken = limits(1, None);
    broken.maintenance_windows = Some(vec![maintenance_crds::MaintenanceWindow {
        schedule: Some("0 1 * * *".into()),
        duration: Some("1h".into()),
        time_zone: Some("Mars/Olympus_Mons".into()),
        ..maintenance_crds::MaintenanceWindow::default()
    }]);
    let edited = std::time::Instant::now();
    set_config(&c.client, broken).await?;
    // Rounds run on every change; 5 s leaves room for a loaded machine (a round takes ms).
    wait_for(
        "every waiting request to name the config error",
        Duration::from_secs(5),
        || async {
            let messages = pending_messages(c).await?;
            Ok((messages.len() == 2
                && messages
                    .iter()
                    .all(|m| m.contains("Mars/Olympus_Mons") && m.contains("config")))
            .then_some(()))
        },
    )
    .await?;
    eprintln!(
        "config error shown on every waiting request {:.2} s after the edit",
        edited.elapsed().as_secs_f64()
    );
    let past = past_pending(&list_requests(&c.client, &c.ns).await?);
    ensure!(
        past == e.admitted,
        "nothing is admitted while the config is broken: {past:?}"
    );
    // Where an administrator looks: the config's Events and the gauge.
    let warning = wait_event(
        &c.client,
        OPERATOR_NAMESPACE,
        "default",
        "InvalidConfig",
        Duration::from_secs(10),
    )
    .await?;
    let note = warning.note.clone().unwrap_or_default();
    ensure!(
        warning.type_.as_deref() == Some("Warning")
            && warning.action.as_deref() == Some("maintenanceWindows[0].timeZone")
            && note.contains("Mars/Olympus_Mons"),
        "the config's Warning names the field: {warning:?}"
    );
    ensure!(
        e.op.metric("maintenance_operator_config_invalid").await? == 1.0,
        "config_invalid is 1 while the config is broken"
    );

    let fixed = std::time::Instant::now();
    set_config(&c.client, limits(1, None)).await?;
    wait_for(
        "the real reason back on every waiting request",
        Duration::from_secs(5),
        || async { Ok(says_no_slot(&pending_messages(c).await?).then_some(())) },
    )
    .await?;
    eprintln!(
        "real reason back {:.2} s after the fix",
        fixed.elapsed().as_secs_f64()
    );
    wait_event(
        &c.client,
        OPERATOR_NAMESPACE,
        "default",
        "ConfigFixed",
        Duration::from_secs(10),
    )
    .await?;
    ensure!(
        e.op.metric("maintenance_operator_config_invalid").await? == 0.0,
        "config_invalid is 0 once the config is fixed"
    );
    e.finish().await
}

/// A blackout holds every admission with its reason and releases them when it ends (a round runs
/// then, not at the next tick); an absolute window admits from its `notBefore`. Without
/// blackouts the first request would be admitted at once; without the wake-up at the end it
/// would wait for the safety-net tick.
#[tokio::test]
async fn a_blackout_holds_admission_until_it_ends_and_an_absolute_window_opens_on_time()
-> Result<()> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    // Whole seconds: the API server keeps no fraction of a second of a time.
    let whole_seconds = |t: jiff::Timestamp| jiff::Timestamp::from_second(t.as_second());
    let now = whole_seconds(jiff::Timestamp::now())?;
    let at = |seconds: i64| Time(now + jiff::SignedDuration::from_secs(seconds));
    // Long enough for the operator to start and write the Pending message first.
    const BLACKOUT_SECONDS: i64 = 25;
    let mut config = limits(2, None);
    config.blackouts = Some(vec![maintenance_crds::Blackout {
        start: at(-60),
        end: at(BLACKOUT_SECONDS),
        reason: "release freeze".into(),
    }]);
    let c = cluster(3, 0, config.clone()).await?;
    let monitor = monitor(&c).await?;
    let op = Operator::start_as(&c.testbed, OPERATOR_ACCOUNT, &[]).await?;
    request_node(
        &c.client,
        &c.ns,
        "frozen",
        &c.nodes[0],
        "blackout.example.com",
    )
    .await?;
    wait_for("the request to name the blackout", WAIT, || async {
        Ok(pending_messages(&c)
            .await?
            .iter()
            .any(|m| m.contains("blackout \"release freeze\" (blackouts[0])"))
            .then_some(()))
    })
    .await?;
    ensure!(
        op.metric("maintenance_operator_requests_waiting{cause=\"blackout\"}")
            .await?
            == 1.0,
        "requests_waiting counts the blackout"
    );
    let ends = std::time::SystemTime::from(now + jiff::SignedDuration::from_secs(BLACKOUT_SECONDS));
    wait_phase(&c.client, &c.ns, "frozen", Phase::Ready, WAIT * 2).await?;
    let late = std::time::SystemTime::now()
        .duration_since(ends)
        .map_err(|_| anyhow::anyhow!("admitted before the blackout ended"))?;
    eprintln!(
        "admitted {:.2} s after the blackout ended",
        late.as_secs_f64()
    );

    // An absolute window that opens in 10 s.
    let opens_in = 10;
    let opening =
        whole_seconds(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(opens_in))?;
    config.blackouts = None;
    config.maintenance_windows = Some(vec![maintenance_crds::MaintenanceWindow {
        not_before: Some(Time(opening)),
        not_after: Some(Time(opening + jiff::SignedDuration::from_hours(1))),
        ..maintenance_crds::MaintenanceWindow::default()
    }]);
    set_config(&c.client, config).await?;
    request_node(
        &c.client,
        &c.ns,
        "windowed",
        &c.nodes[1],
        "blackout.example.com",
    )
    .await?;
    wait_for("the request to wait for the window", WAIT, || async {
        Ok(pending_messages(&c)
            .await?
            .iter()
            .any(|m| m.contains("outside the maintenance windows: the next opens at"))
            .then_some(()))
    })
    .await?;
    wait_phase(&c.client, &c.ns, "windowed", Phase::Ready, WAIT * 2).await?;
    ensure!(
        jiff::Timestamp::now() >= opening,
        "admitted before the window opened"
    );
    monitor.finish().await?;
    Ok(())
}
