//! Benchmarks on a real control plane. They print figures and assert only that the work got done
//! (they are not timed tests). CI runs them at a small size; set the environment to go bigger:
//! `MO_BENCH_RUNS` (latency samples, default 5), `MO_BENCH_NODES` and `MO_BENCH_REQUESTS`
//! (throughput run, default 50 and 50), `MO_BENCH_PARALLEL` (maxParallelOperations, default 25).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use maintenance_crds::{NodeMaintenance, Phase};
use support::operator::*;
use support::*;
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(300);

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// A watch on the requests of `ns` that reports (name, phase) the moment the API server shows a
/// new phase: timings come from events, not from polling.
fn phase_events(client: Client, ns: &str) -> mpsc::UnboundedReceiver<(String, Phase, Instant)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let api: Api<NodeMaintenance> = Api::namespaced(client, ns);
    tokio::spawn(async move {
        let mut last: HashMap<String, Phase> = HashMap::new();
        let stream = watcher(api, watcher::Config::default());
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let objects = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => vec![o],
                _ => continue,
            };
            for o in objects {
                if o.condition("Ready").is_none() {
                    continue;
                }
                let phase = o.phase();
                if last.insert(o.name_any(), phase) != Some(phase)
                    && tx.send((o.name_any(), phase, Instant::now())).is_err()
                {
                    return;
                }
            }
        }
    });
    rx
}

async fn wait_event(
    events: &mut mpsc::UnboundedReceiver<(String, Phase, Instant)>,
    name: &str,
    phase: Phase,
) -> Result<Instant> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let next = tokio::time::timeout_at(deadline, events.recv()).await;
        match next {
            Ok(Some((n, p, at))) if n == name && p == phase => return Ok(at),
            Ok(Some(_)) => {}
            Ok(None) => anyhow::bail!("the watch ended"),
            Err(_) => anyhow::bail!("timed out waiting for {name} to reach {phase}"),
        }
    }
}

/// Creation -> Ready of one request on an empty node of an idle cluster, and how long a freed
/// slot takes to be reused (delete a Ready request -> the next Pending one Scheduled).
#[tokio::test]
async fn latency_create_to_ready_and_slot_reuse() -> Result<()> {
    let _turn = large_scenario_turn().await;
    let runs = env_usize("MO_BENCH_RUNS", 5)?;
    let (testbed, client, ns, nodes) = own_cluster("lat", runs + 1, Some(limits(1, None))).await?;
    let _op = Operator::start(&testbed, &[]).await?;
    let mut events = phase_events(client.clone(), &ns);

    // Warm-up, not measured: the first write of a custom resource after its CRD was installed
    // includes the API server setting up that resource's storage.
    request_node(&client, &ns, "warm-up", &nodes[runs], "lat.example.com").await?;
    wait_event(&mut events, "warm-up", Phase::Ready).await?;
    release_request(&client, &ns, "warm-up", WAIT).await?;

    let mut to_ready = Vec::new();
    for (i, node) in nodes.iter().take(runs).enumerate() {
        let name = format!("solo-{i}");
        let started = Instant::now();
        request_node(&client, &ns, &name, node, "lat.example.com").await?;
        let ready = wait_event(&mut events, &name, Phase::Ready).await?;
        to_ready.push((ready - started).as_secs_f64() * 1000.0);
        release_request(&client, &ns, &name, WAIT).await?;
    }

    // Slot reuse: one Ready request holds the only slot, the next waits.
    let mut reuse = Vec::new();
    let mut holder = "hold-0".to_string();
    request_node(&client, &ns, &holder, &nodes[0], "lat.example.com").await?;
    wait_event(&mut events, &holder, Phase::Ready).await?;
    for i in 1..=runs {
        let next = format!("hold-{i}");
        let node = &nodes[i % nodes.len()];
        request_node(&client, &ns, &next, node, "lat.example.com").await?;
        wait_event(&mut events, &next, Phase::Pending).await?;
        let released = Instant::now();
        delete_request(&client, &ns, &holder).await?;
        let scheduled = wait_event(&mut events, &next, Phase::Scheduled).await?;
        reuse.push((scheduled - released).as_secs_f64() * 1000.0);
        wait_event(&mut events, &next, Phase::Ready).await?;
        wait_request_gone(&client, &ns, &holder, WAIT).await?;
        holder = next;
    }
    println!(
        "create -> Ready, one request, empty node, idle testbed: median {:.0} ms over {runs} runs ({:?})",
        median(to_ready.clone()),
        to_ready.iter().map(|v| v.round()).collect::<Vec<_>>()
    );
    println!(
        "freed slot reused (delete Ready request -> next Scheduled): median {:.0} ms over {runs} runs ({:?})",
        median(reuse.clone()),
        reuse.iter().map(|v| v.round()).collect::<Vec<_>>()
    );
    assert_eq!(to_ready.len(), runs);
    assert_eq!(reuse.len(), runs);
    Ok(())
}

/// Many requests at once (no drain): time until all are Ready, and the scheduler's cost.
#[tokio::test]
async fn throughput_many_requests_at_once() -> Result<()> {
    let _turn = large_scenario_turn().await;
    let node_count = env_usize("MO_BENCH_NODES", 50)?;
    let request_count = env_usize("MO_BENCH_REQUESTS", 50)?.min(node_count);
    let parallel = env_usize("MO_BENCH_PARALLEL", 25)?;
    let config = limits(i32::try_from(parallel).unwrap_or(i32::MAX), None);
    let (testbed, client, ns, nodes) = own_cluster("tp", node_count, Some(config)).await?;
    let op = Operator::start(&testbed, &[]).await?;

    let started = Instant::now();
    futures::stream::iter(nodes.iter().take(request_count).enumerate())
        .map(|(i, node)| {
            let client = client.clone();
            let ns = ns.clone();
            async move {
                request_node(&client, &ns, &format!("r{i}"), node, "tp.example.com")
                .await
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
    let created = started.elapsed();
    // Release each request as soon as it is Ready, as a requestor would after its work.
    let mut released = 0;
    wait_for("every request to be done", WAIT, || async {
        let all = list_requests(&client, &ns).await?;
        let mut newly = 0;
        for r in &all {
            if r.phase() == Phase::Ready && !r.is_deleting() {
                delete_request(&client, &ns, &r.name_any()).await?;
                newly += 1;
            }
        }
        Ok(all.is_empty().then_some(newly))
    })
    .await
    .map(|n| released += n)?;
    let total = started.elapsed();
    let runs = op
        .metric("maintenance_operator_scheduler_runs_total")
        .await?;
    let sum = op
        .metric("maintenance_operator_scheduler_run_duration_seconds_sum")
        .await?;
    println!(
        "{request_count} requests on {node_count} nodes, maxParallelOperations={parallel}: created in {:.1}s, all admitted, Ready and released in {:.1}s ({:.1} requests/s); {runs} scheduler rounds, mean {:.1} ms",
        created.as_secs_f64(),
        total.as_secs_f64(),
        request_count as f64 / total.as_secs_f64(),
        sum / runs.max(1.0) * 1000.0
    );
    Ok(())
}
