//! Fleet policy on a live control plane, with the operator running as a process: budgets per
//! zone ("one zone at a time"), a maintenance window that opens during the test, and the API
//! server's validation of both.
//!
//! `PATH="$(tests/testbed/testbed bin-dir):$PATH" cargo test --test e2e fleet::`

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use jiff::{SignedDuration, Timestamp, ToSpan, Unit};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};
use maintenance_crds::{
    ADMITTED_TIME_ANNOTATION, Budget, MaintenanceOperatorConfig, MaintenanceOperatorConfigSpec,
    MaintenanceWindow, NodeMaintenance, Phase,
};
use support::invariants::*;
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(60);
const ZONE: &str = "topology.kubernetes.io/zone";
const REQUESTOR: &str = "fleet.example.com";

/// The README's two-zone example: at most one zone with unavailable nodes, two nodes at a time
/// within it.
fn one_zone_at_a_time() -> MaintenanceOperatorConfigSpec {
    MaintenanceOperatorConfigSpec {
        max_parallel_operations: Some(IntOrString::Int(10)),
        budgets: Some(vec![Budget {
            name: "zones".into(),
            group_by_label: Some(ZONE.into()),
            max_parallel_operations: Some(IntOrString::Int(2)),
            max_unavailable_groups: Some(1),
            ..Budget::default()
        }]),
        ..MaintenanceOperatorConfigSpec::default()
    }
}

/// Records the most zones ever holding a request past Pending at once, as the API server showed
/// the requests of `ns`. Abort the task when done.
fn track_max_zones_in_maintenance(
    client: Client,
    ns: &str,
    zone_of: HashMap<String, String>,
) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let max = Arc::new(AtomicUsize::new(0));
    let seen = max.clone();
    let api: Api<NodeMaintenance> = Api::namespaced(client, ns);
    let task = tokio::spawn(async move {
        let (reader, writer) = reflector::store();
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
            .touched_objects();
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {
            let zones: BTreeSet<&String> = reader
                .state()
                .iter()
                .filter(|r| r.phase() != Phase::Pending)
                .filter_map(|r| zone_of.get(&r.spec.node_name))
                .collect();
            seen.fetch_max(zones.len(), Ordering::SeqCst);
        }
    });
    (max, task)
}

#[tokio::test]
async fn two_zones_one_zone_at_a_time() -> Result<()> {
    let (testbed, client) = own_testbed(Some(one_zone_at_a_time())).await?;
    let zone_a = create_nodes(&client, "zone-a", 3, &[(ZONE, "a")]).await?;
    let zone_b = create_nodes(&client, "zone-b", 3, &[(ZONE, "b")]).await?;
    let all: Vec<String> = zone_a.iter().chain(&zone_b).cloned().collect();
    wait_nodes_ready(&client, &all, WAIT).await?;
    let ns = unique_name("zones");
    create_namespace(&client, &ns).await?;
    let monitor = InvariantMonitor::start(&testbed, Scope::new(&ns, &all)).await?;
    let op = Operator::start(&testbed, &[]).await?;

    let zone_of: HashMap<String, String> = zone_a
        .iter()
        .map(|n| (n.clone(), "a".to_string()))
        .chain(zone_b.iter().map(|n| (n.clone(), "b".to_string())))
        .collect();
    let (max_zones, tracker) = track_max_zones_in_maintenance(client.clone(), &ns, zone_of);

    // Interleaved; zone a's node names sort first, so zone a is first in line.
    for (name, node) in [
        ("a0", &zone_a[0]),
        ("b0", &zone_b[0]),
        ("a1", &zone_a[1]),
        ("b1", &zone_b[1]),
    ] {
        request_node(&client, &ns, name, node, REQUESTOR).await?;
    }
    wait_for("zone a admitted, zone b held back", WAIT, || async {
        let requests = list_requests(&client, &ns).await?;
        let admitted = past_pending(&requests);
        ensure!(
            admitted.iter().all(|n| n.starts_with('a')),
            "zone b admitted while zone a is in maintenance: {admitted:?}"
        );
        let held = requests
            .iter()
            .filter(|r| r.name_any().starts_with('b'))
            .all(|r| {
                pending_message(r).is_some_and(|m| {
                    m.starts_with("maxUnavailableGroups of budget zones reached")
                        && m.contains("topology.kubernetes.io/zone=b")
                })
            });
        Ok((admitted == ["a0", "a1"] && held).then_some(()))
    })
    .await?;
    // More rounds (the tick, the status writes of zone a) admit nothing in zone b.
    wait_scheduler_rounds(&op, 3).await?;
    ensure!(
        past_pending(&list_requests(&client, &ns).await?) == ["a0", "a1"],
        "zone b was admitted while zone a is in maintenance"
    );

    // The budget's figures are exported per zone, and `plan` names the budget and the zone.
    wait_for("the budget gauges", WAIT, || async {
        let slots = |zone: &str| {
            format!(
                "maintenance_operator_budget_available_slots{{budget=\"zones\",group=\"{zone}\"}}"
            )
        };
        Ok(
            (op.metric(&slots("a")).await? == 0.0 && op.metric(&slots("b")).await? == 2.0)
                .then_some(()),
        )
    })
    .await?;
    let plan = plan_json(&testbed)?;
    let b0 = plan["waiting"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["name"] == format!("{ns}/b0")))
        .with_context(|| format!("b0 is not waiting in the plan: {plan:#}"))?;
    ensure!(
        b0["cause"] == "maxUnavailableGroups" && b0["budget"] == "zones" && b0["group"] == "b",
        "plan: {b0:#}"
    );

    // Zone a is done and released: zone b goes.
    for name in ["a0", "a1"] {
        wait_phase(&client, &ns, name, Phase::Ready, WAIT).await?;
        delete_request(&client, &ns, name).await?;
    }
    wait_for("zone b admitted after zone a's release", WAIT, || async {
        let admitted = past_pending(&list_requests(&client, &ns).await?);
        Ok((admitted == ["b0", "b1"]).then_some(()))
    })
    .await?;
    tracker.abort();
    ensure!(
        max_zones.load(Ordering::SeqCst) == 1,
        "both zones were in maintenance at once"
    );
    monitor.held().await
}

/// The first whole minute at least `lead` from now: cron fires on minutes.
fn next_minute_after(lead: SignedDuration) -> Result<Timestamp> {
    let earliest = Timestamp::now() + lead;
    let rounded = earliest.round(Unit::Minute)?;
    Ok(if rounded < earliest {
        rounded + 1.minute()
    } else {
        rounded
    })
}

#[tokio::test]
async fn a_window_that_opens_during_the_test() -> Result<()> {
    let (testbed, client, ns, nodes) = own_cluster("window", 2, Some(limits(10, None))).await?;
    let monitor = InvariantMonitor::start(&testbed, Scope::new(&ns, &nodes)).await?;
    // No safety-net tick during the test: admission must start because the window opened.
    let op = Operator::start(&testbed, &["--tick-seconds", "600"]).await?;

    // A nightly-style window in Berlin whose opening is the next whole minute at least 12 s away
    // (12-72 s): time to set it up and see that nothing is admitted before.
    let opening = next_minute_after(SignedDuration::from_secs(12))?;
    let local = opening.in_tz("Europe/Berlin")?;
    set_config(
        &client,
        MaintenanceOperatorConfigSpec {
            max_parallel_operations: Some(IntOrString::Int(10)),
            maintenance_windows: Some(vec![MaintenanceWindow {
                schedule: Some(format!("{} {} * * *", local.minute(), local.hour())),
                duration: Some("10m".into()),
                time_zone: Some("Europe/Berlin".into()),
                ..MaintenanceWindow::default()
            }]),
            ..MaintenanceOperatorConfigSpec::default()
        },
    )
    .await?;
    for (name, node) in [("r0", &nodes[0]), ("r1", &nodes[1])] {
        request_node(&client, &ns, name, node, REQUESTOR).await?;
    }
    let expected = format!(
        "outside the maintenance windows: the next opens at {} (Europe/Berlin)",
        local.strftime("%Y-%m-%d %H:%M %Z")
    );
    wait_for("the Pending messages to name the opening", WAIT, || async {
        let requests = list_requests(&client, &ns).await?;
        Ok((requests.len() == 2
            && requests
                .iter()
                .all(|r| pending_message(r) == Some(expected.as_str())))
        .then_some(()))
    })
    .await?;
    let plan = plan_json(&testbed)?;
    ensure!(
        plan["maintenanceWindows"]["open"] == false
            && plan["maintenanceWindows"]["nextOpening"] == local.to_string(),
        "plan: {plan:#}"
    );

    // Nothing is admitted before the opening...
    while Timestamp::now() < opening - SignedDuration::from_millis(500) {
        let admitted = past_pending(&list_requests(&client, &ns).await?);
        ensure!(
            admitted.is_empty(),
            "admitted before the window opened at {opening}: {admitted:?}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    // ...and both are, promptly, after it.
    let admitted = wait_for("admission once the window is open", WAIT, || async {
        let requests = list_requests(&client, &ns).await?;
        Ok((past_pending(&requests).len() == 2).then_some(requests))
    })
    .await?;
    let seen = Timestamp::now();
    eprintln!(
        "window opened at {opening}; both requests seen admitted {:.1}s later",
        seen.duration_since(opening).as_secs_f64()
    );
    for request in &admitted {
        let at: Timestamp = request
            .annotations()
            .get(ADMITTED_TIME_ANNOTATION)
            .with_context(|| format!("{} has no admitted-time", request.name_any()))?
            .parse()?;
        ensure!(
            at >= opening,
            "{} admitted at {at}, before the opening {opening}",
            request.name_any()
        );
    }
    ensure!(
        seen.duration_since(opening) < SignedDuration::from_secs(10),
        "admitted {} after the opening; the tick is 600 s, so the supervisor did not wake for it",
        seen.duration_since(opening)
    );
    drop(op);
    monitor.held().await
}

fn config(name: &str, spec: MaintenanceOperatorConfigSpec) -> MaintenanceOperatorConfig {
    MaintenanceOperatorConfig::new(name, spec)
}

fn with_budget(budget: Budget) -> MaintenanceOperatorConfigSpec {
    MaintenanceOperatorConfigSpec {
        budgets: Some(vec![budget]),
        ..MaintenanceOperatorConfigSpec::default()
    }
}

fn nightly_in_berlin() -> MaintenanceWindow {
    MaintenanceWindow {
        schedule: Some("0 1 * * *".into()),
        duration: Some("3h".into()),
        time_zone: Some("Europe/Berlin".into()),
        ..MaintenanceWindow::default()
    }
}

#[tokio::test]
async fn the_api_server_validates_budgets_and_windows() -> Result<()> {
    let (client, ns) = crd_namespace("fleet-crd").await?;
    let api: Api<MaintenanceOperatorConfig> = Api::namespaced(client.clone(), &ns);

    // The examples in docs/configuration.md are accepted.
    let pools = Budget {
        name: "pools".into(),
        node_selector: Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "node.example.com/pool".into(),
                operator: "Exists".into(),
                values: None,
            }]),
            match_labels: None,
        }),
        group_by_label: Some("node.example.com/pool".into()),
        max_parallel_operations: Some(IntOrString::String("10%".into())),
        ..Budget::default()
    };
    let gpu = Budget {
        name: "gpu".into(),
        node_selector: Some(LabelSelector {
            match_labels: Some([("node.example.com/pool".into(), "gpu".into())].into()),
            match_expressions: None,
        }),
        max_unavailable: Some(IntOrString::Int(1)),
        maintenance_windows: Some(vec![nightly_in_berlin()]),
        ..Budget::default()
    };
    let mut readme = one_zone_at_a_time();
    readme.budgets = Some([readme.budgets(), &[pools, gpu]].concat());
    readme.maintenance_windows = Some(vec![MaintenanceWindow {
        schedule: Some("0 22 * * 1-5".into()),
        duration: Some("8h".into()),
        time_zone: None,
        ..MaintenanceWindow::default()
    }]);
    api.create(&Default::default(), &config("readme", readme))
        .await
        .context("the examples of docs/configuration.md should be accepted")?;

    let zones = || one_zone_at_a_time().budgets().to_vec();
    let twice = MaintenanceOperatorConfigSpec {
        budgets: Some([zones(), zones()].concat()),
        ..MaintenanceOperatorConfigSpec::default()
    };
    let window = |schedule: &str, duration: &str, time_zone: Option<&str>| {
        with_budget(Budget {
            name: "w".into(),
            maintenance_windows: Some(vec![MaintenanceWindow {
                schedule: Some(schedule.into()),
                duration: Some(duration.into()),
                time_zone: time_zone.map(Into::into),
                ..MaintenanceWindow::default()
            }]),
            ..Budget::default()
        })
    };
    let cases: Vec<(&str, MaintenanceOperatorConfigSpec, &[&str])> = vec![
        ("twice", twice, &["spec.budgets[1]", "Duplicate value"]),
        (
            "bad-group",
            with_budget(Budget {
                name: "g".into(),
                group_by_label: Some("not a label".into()),
                ..Budget::default()
            }),
            &["spec.budgets[0].groupByLabel"],
        ),
        (
            "no-groups",
            with_budget(Budget {
                name: "g".into(),
                max_unavailable_groups: Some(1),
                ..Budget::default()
            }),
            &["set groupByLabel too"],
        ),
        (
            "bad-percent",
            with_budget(Budget {
                name: "p".into(),
                max_parallel_operations: Some(IntOrString::String("150%".into())),
                ..Budget::default()
            }),
            &[
                "spec.budgets[0].maxParallelOperations",
                "must be a non-negative integer or a percentage",
            ],
        ),
        (
            "bad-name",
            with_budget(Budget {
                name: "GPU Pool".into(),
                ..Budget::default()
            }),
            &["spec.budgets[0].name"],
        ),
        (
            "bad-schedule",
            window("every night", "1h", None),
            &["maintenanceWindows[0].schedule"],
        ),
        (
            "bad-duration",
            window("0 1 * * *", "2 hours", None),
            &["maintenanceWindows[0].duration"],
        ),
        (
            "zero-duration",
            window("0 1 * * *", "0m", None),
            &["must be longer than zero"],
        ),
        (
            "bad-zone",
            window("0 1 * * *", "1h", Some("Europe Berlin")),
            &["maintenanceWindows[0].timeZone"],
        ),
    ];
    for (name, spec, needles) in cases {
        expect_invalid(&api, &config(name, spec), needles)
            .await
            .with_context(|| format!("config {name}"))?;
    }
    Ok(())
}
