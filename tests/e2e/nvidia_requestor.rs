//! NVIDIA's own requestor library drives the operator unchanged: `tests/nvidia-requestor` runs
//! `github.com/NVIDIA/k8s-operator-libs/pkg/upgrade` in requestor mode, as NVIDIA's GPU and
//! network operators do, and upgrades two stand-in driver DaemonSets on 20 KWOK nodes with
//! workloads under PodDisruptionBudgets and `maxParallelOperations: 5`.
//!
//! What the library does, in its code (`pkg/upgrade/upgrade_requestor.go`, `upgrade_state.go`,
//! `common_manager.go`):
//! - a driver pod out of date with its DaemonSet's latest ControllerRevision moves its node to
//!   `upgrade-required` (the node label `nvidia.com/<driver>-driver-upgrade-state`), then the
//!   library creates a NodeMaintenance `<prefix>-<node>` for every such node at once and moves it
//!   to `node-maintenance-required`: throttling is the maintenance operator's;
//! - once the request's `Ready` condition has reason `Ready`: `pod-restart-required` (it deletes
//!   the driver pod; the DaemonSet, `OnDelete`, makes a new one), `uncordon-required` when the new
//!   pod is Ready, then `upgrade-done` and the release: the owner deletes the request, another
//!   requestor removes its ID from `additionalRequestors` (a merge patch with an optimistic lock);
//! - a second requestor joins an existing request through `additionalRequestors` only under the
//!   default prefix, `nvidia-operator` (`createOrUpdateNodeMaintenance`).
//!
//! The two instances, `gpu` and `ofed` as the GPU and network operators name their drivers, use
//! different requestor IDs and that prefix, so the requests are shared. The second starts once
//! the first has created its requests: started together, both create `<prefix>-<node>` at once,
//! and the library treats the loser's AlreadyExists as success without joining the request.
//!
//! The library loses a release now and then: an additional requestor labels the node
//! `upgrade-done`, then removes its ID with a patch under an optimistic lock on the object it read
//! at the start of its round; when the owner's deletion lands in between, the patch conflicts and
//! is never retried. The test requires each request left behind to be such a logged loss, removes
//! the stale ID as a person would, and counts them (docs/compatibility.md, "NVIDIA's requestor
//! library").

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use maintenance_crds::NodeMaintenance;
use support::invariants::*;
use support::operator::*;
use support::*;

const NODES: usize = 20;
const MAX_PARALLEL: i32 = 5;
const OPERATOR_ACCOUNT: &str = "nvidia-requestor-operator";
/// The library's default prefix (`DefaultNodeMaintenanceNamePrefix`): the only one it shares under.
const PREFIX: &str = "nvidia-operator";
/// The whole upgrade, both drivers; a deadline, not a measurement.
const UPGRADE_DEADLINE: Duration = Duration::from_secs(420);
const WAIT: Duration = Duration::from_secs(120);

/// One driver and the instance of the library that upgrades it.
struct Driver {
    /// The library's driver name (`SetDriverName`): its node label is
    /// `nvidia.com/<name>-driver-upgrade-state`.
    name: &'static str,
    requestor: &'static str,
    daemonset: &'static str,
    app: &'static str,
}

const DRIVERS: [Driver; 2] = [
    Driver {
        name: "gpu",
        requestor: "gpu-operator.nvidia.com",
        daemonset: "nvidia-driver-daemonset",
        app: "nvidia-driver-daemonset",
    },
    Driver {
        name: "ofed",
        requestor: "network-operator.nvidia.com",
        daemonset: "mofed-ubuntu22.04-ds",
        app: "mofed-ubuntu22.04",
    },
];

impl Driver {
    fn state_label(&self) -> String {
        format!("nvidia.com/{}-driver-upgrade-state", self.name)
    }
}

/// The program, running until it exits or is dropped; its output in a file.
struct Requestor {
    child: Child,
    log: PathBuf,
    id: &'static str,
}

impl Requestor {
    fn start(
        binary: &Path,
        testbed: &Testbed,
        driver: &Driver,
        driver_ns: &str,
        ns: &str,
    ) -> Result<Requestor> {
        let log = testbed
            .dir()
            .join(format!("nvidia-requestor-{}.log", driver.name));
        let out = std::fs::File::create(&log)?;
        // The library's own log, for a failure's post-mortem.
        let library_log = std::fs::File::create(log.with_extension("library.log"))?;
        let child = Command::new(binary)
            .args([
                "--driver",
                driver.name,
                "--namespace",
                driver_ns,
                "--labels",
                &format!("app={}", driver.app),
                "--max-parallel-upgrades",
                "0",
                "--deadline",
                &format!("{}s", UPGRADE_DEADLINE.as_secs()),
                "-v",
            ])
            .env("KUBECONFIG", testbed.kubeconfig_path())
            .env("MAINTENANCE_OPERATOR_ENABLED", "true")
            .env("MAINTENANCE_OPERATOR_REQUESTOR_ID", driver.requestor)
            .env("MAINTENANCE_OPERATOR_REQUESTOR_NAMESPACE", ns)
            .env("MAINTENANCE_OPERATOR_NODE_MAINTENANCE_PREFIX", PREFIX)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(library_log)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        kill_when_this_process_exits(child.id())?;
        Ok(Requestor {
            child,
            log,
            id: driver.requestor,
        })
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The requests whose release by this (additional) requestor failed: the library labels the
    /// node upgrade-done first, then patches `additionalRequestors` with an optimistic lock, and
    /// never retries (`ProcessUncordonRequiredNodes`, `deleteOrUpdateNodeMaintenance`).
    fn lost_releases(&self) -> HashSet<String> {
        const NEEDLE: &str =
            "failed to remove requestor from additionalRequestors.failed to patch nodeMaintenance ";
        self.output()
            .lines()
            .filter_map(|l| l.split_once(NEEDLE))
            .filter_map(|(_, rest)| rest.split_once(". "))
            .filter_map(|(key, _)| key.rsplit_once('/'))
            .map(|(_, name)| name.to_string())
            .collect()
    }

    /// Its JSON lines that carry an error, and among them the optimistic-lock conflicts.
    fn errors(&self) -> (usize, usize) {
        let text = self.output();
        let errors: Vec<&str> = text.lines().filter(|l| l.contains("\"error\"")).collect();
        let conflicts = errors
            .iter()
            .filter(|l| l.contains("the object has been modified"))
            .count();
        (errors.len(), conflicts)
    }

    /// Waits for its exit; fails unless it exits 0, with the end of its output.
    async fn wait_success(&mut self) -> Result<()> {
        let status = wait_for(
            &format!("requestor {} to finish", self.id),
            UPGRADE_DEADLINE + Duration::from_secs(30),
            || {
                let status = self.child.try_wait();
                async move { Ok(status?) }
            },
        )
        .await;
        let tail = || {
            let text = self.output();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(15)..].join("\n")
        };
        match status {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => bail!("requestor {} exited with {s}:\n{}", self.id, tail()),
            Err(e) => Err(e.context(format!("requestor {}:\n{}", self.id, tail()))),
        }
    }
}

impl Drop for Requestor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Watches the requests of `ns` and records, per request (by UID), every requestor it named and
/// whether an additional requestor was seen to leave it.
#[derive(Default)]
struct Sharing {
    requestors: HashMap<String, HashSet<String>>,
    left: HashSet<String>,
    last_additional: HashMap<String, usize>,
}

fn watch_sharing(client: Client, ns: String) -> (Arc<Mutex<Sharing>>, tokio::task::JoinHandle<()>) {
    let sharing = Arc::new(Mutex::new(Sharing::default()));
    let seen = sharing.clone();
    let task = tokio::spawn(async move {
        let api: Api<NodeMaintenance> = Api::namespaced(client, &ns);
        let stream = watcher(api, watcher::Config::default()).touched_objects();
        futures::pin_mut!(stream);
        while let Some(Ok(request)) = stream.next().await {
            let uid = request.uid().unwrap_or_default();
            let additional = request.spec.additional_requestors();
            if let Ok(mut s) = seen.lock() {
                let ids = s.requestors.entry(uid.clone()).or_default();
                ids.insert(request.spec.requestor_id.clone());
                ids.extend(additional.iter().cloned());
                let before = s.last_additional.insert(uid.clone(), additional.len());
                if before.is_some_and(|n| n > additional.len()) {
                    s.left.insert(uid);
                }
            }
        }
    });
    (sharing, task)
}

/// The program, built by `tests/testbed/testbed build` into the testbed's binaries. Never a skip
/// when it is missing: the test is only worth something when it runs.
async fn requestor_binary() -> Result<PathBuf> {
    let binary = PathBuf::from(run_testbed(&["bin-dir"]).await?.trim()).join("nvidia-requestor");
    ensure!(
        binary.is_file(),
        "{} is missing: `tests/testbed/testbed build` builds it",
        binary.display()
    );
    Ok(binary)
}

/// The requests of `ns`, for a failure's message.
async fn requests_left(client: &Client, ns: &str) -> Result<String> {
    let requests = list_requests(client, ns).await?;
    let lines: Vec<String> = requests
        .iter()
        .map(|r| {
            format!(
                "{} owner {} additional {:?}: {}",
                r.name_any(),
                r.spec.requestor_id,
                r.spec.additional_requestors(),
                describe(r)
            )
        })
        .collect();
    Ok(format!("requests left in {ns}:\n{}", lines.join("\n")))
}

/// A DaemonSet of the driver on the test's nodes, updated `OnDelete` as NVIDIA's drivers are.
async fn create_driver(client: &Client, ns: &str, driver: &Driver, prefix: &str) -> Result<()> {
    create_daemonset(
        client,
        ns,
        driver.daemonset,
        &[("app", driver.app)],
        &PodSpecOptions::on_nodes_with_prefix(prefix),
    )
    .await?;
    Api::<DaemonSet>::namespaced(client.clone(), ns)
        .patch(
            driver.daemonset,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"updateStrategy": {"type": "OnDelete"}}})),
        )
        .await?;
    Ok(())
}

/// A new driver version: a change of the pod template, so a new ControllerRevision. Waits until
/// the DaemonSet controller has seen it (the library compares the pods' hash to the latest
/// revision's).
async fn bump_driver(client: &Client, ns: &str, driver: &Driver) -> Result<()> {
    let api = Api::<DaemonSet>::namespaced(client.clone(), ns);
    let bumped = api
        .patch(
            driver.daemonset,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"template": {"metadata": {
                "annotations": {"driver.example.com/version": "2"}}}}})),
        )
        .await?;
    let generation = bumped.metadata.generation.unwrap_or_default();
    wait_for(
        &format!("daemonset {} to observe its new template", driver.daemonset),
        WAIT,
        || {
            let api = api.clone();
            async move {
                let ds = api.get(driver.daemonset).await?;
                let observed = ds.status.and_then(|s| s.observed_generation);
                Ok((observed >= Some(generation)).then_some(()))
            }
        },
    )
    .await
}

#[tokio::test]
async fn nvidia_requestor_library_upgrades_every_node_through_shared_requests() -> Result<()> {
    let binary = requestor_binary().await?;
    let _turn = large_scenario_turn().await;
    let (testbed, client, ns, nodes) =
        own_cluster("nvreq", NODES, Some(limits(MAX_PARALLEL, None))).await?;
    let prefix = nodes[0]
        .rsplit_once('-')
        .map(|(p, _)| p.to_string())
        .unwrap_or_default();
    let monitor = monitor_as(&testbed, &ns, &nodes, OPERATOR_ACCOUNT).await?;
    let _operator = Operator::start_as(&testbed, OPERATOR_ACCOUNT, &[]).await?;

    // Workloads under budgets: one pod a node that may go one at a time, and a smaller one.
    let on_nodes = PodSpecOptions::on_nodes_with_prefix(&prefix);
    create_app_deployment(&client, &ns, "web", NODES as i32, &on_nodes).await?;
    create_pdb_max_unavailable(
        &client,
        &ns,
        "web",
        &[("app", "web")],
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(2),
    )
    .await?;
    create_app_deployment(&client, &ns, "db", 6, &on_nodes).await?;
    create_app_pdb(&client, &ns, "db", 5).await?;
    wait_deployment_ready(&client, &ns, "web", WAIT).await?;
    wait_deployment_ready(&client, &ns, "db", WAIT).await?;

    // The drivers in a namespace of their own, as the operators install them.
    let driver_ns = unique_name("nvidia-drivers");
    create_namespace(&client, &driver_ns).await?;
    for driver in &DRIVERS {
        create_driver(&client, &driver_ns, driver, &prefix).await?;
    }
    for driver in &DRIVERS {
        wait_daemonset_ready(&client, &driver_ns, driver.daemonset, WAIT).await?;
        bump_driver(&client, &driver_ns, driver).await?;
    }
    wait_pdb_disruptions_allowed(&client, &ns, "web", 2, WAIT).await?;
    wait_pdb_disruptions_allowed(&client, &ns, "db", 1, WAIT).await?;

    let (max_in_maintenance, max_task) = track_max_in_maintenance(client.clone(), ns.clone());
    let (sharing, sharing_task) = watch_sharing(client.clone(), ns.clone());
    let started = Instant::now();
    let mut first = Requestor::start(&binary, &testbed, &DRIVERS[0], &driver_ns, &ns)?;
    // The first instance creates a request for every node at once (ProcessUpgradeRequiredNodes).
    let api = Api::<NodeMaintenance>::namespaced(client.clone(), &ns);
    wait_for("the first requestor's requests", WAIT, || {
        let api = api.clone();
        async move {
            let n = api.list(&ListParams::default()).await?.items.len();
            Ok((n == NODES).then_some(()))
        }
    })
    .await
    .with_context(|| first.output())?;
    let mut second = Requestor::start(&binary, &testbed, &DRIVERS[1], &driver_ns, &ns)?;
    for requestor in [&mut first, &mut second] {
        if let Err(err) = requestor.wait_success().await {
            return Err(err.context(requests_left(&client, &ns).await?));
        }
    }
    let elapsed = started.elapsed();

    // What the cluster shows.
    let node_api = Api::<Node>::all(client.clone());
    for node in &nodes {
        let labels = node_api.get(node).await?.labels().clone();
        for driver in &DRIVERS {
            let state = labels.get(&driver.state_label()).map(String::as_str);
            ensure!(
                state == Some("upgrade-done"),
                "node {node}: {} is {state:?}",
                driver.state_label()
            );
        }
    }
    let released = sharing
        .lock()
        .map_err(|_| anyhow::anyhow!("sharing poisoned"))?
        .left
        .len();
    // A request left behind must be one whose release the library lost (it logged the failed
    // patch): deleted by its owner and held by that additional requestor, as our operator must.
    // It is released here as a person would, by removing the stale requestor.
    let lost: HashSet<String> = [&first, &second]
        .iter()
        .flat_map(|r| r.lost_releases())
        .collect();
    let left_behind = list_requests(&client, &ns).await?;
    for request in &left_behind {
        let name = request.name_any();
        ensure!(
            lost.contains(&name) && request.metadata.deletion_timestamp.is_some(),
            "request {name} left behind without a lost release: {}",
            describe(request)
        );
        api.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"additionalRequestors": null}})),
        )
        .await?;
    }
    wait_for("no NodeMaintenance left", WAIT, || {
        let api = api.clone();
        async move {
            Ok(api
                .list(&ListParams::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        }
    })
    .await?;
    wait_for("every node uncordoned", WAIT, || {
        let client = client.clone();
        let nodes = nodes.clone();
        async move {
            for node in &nodes {
                if node_unschedulable(&client, node).await? {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        }
    })
    .await?;
    max_task.abort();
    sharing_task.abort();
    let report = monitor.finish().await?;
    let max = max_in_maintenance.load(std::sync::atomic::Ordering::SeqCst);
    ensure!(
        max <= MAX_PARALLEL as usize,
        "{max} nodes in maintenance at once, above maxParallelOperations {MAX_PARALLEL}"
    );

    let (requests, shared) = {
        let s = sharing
            .lock()
            .map_err(|_| anyhow::anyhow!("sharing poisoned"))?;
        let shared = s.requestors.values().filter(|ids| ids.len() > 1).count();
        (s.requestors.len(), shared)
    };
    let lost = left_behind.len();
    // Requests the first instance had not released yet when the second started are shared: at
    // least every request behind the first round of five.
    ensure!(
        shared >= NODES - MAX_PARALLEL as usize,
        "{shared} of {requests} requests shared through additionalRequestors"
    );
    ensure!(
        released + lost == shared,
        "{shared} requests shared, {released} seen released by their additional requestor, \
         {lost} releases lost"
    );
    let errors: BTreeMap<&str, (usize, usize)> =
        [&first, &second].map(|r| (r.id, r.errors())).into();
    println!(
        "nvidia requestor: {NODES} nodes x {} drivers upgrade-done in {:.1}s; {requests} requests, \
         {shared} shared, {released} released by both, {lost} left behind by a lost release; at most {max} nodes in maintenance at once \
         (limit {MAX_PARALLEL}); rounds with an error, (all, optimistic-lock conflicts): \
         {errors:?}; monitor: {} events, {} admissions, lowest PDB margin {:?}",
        DRIVERS.len(),
        elapsed.as_secs_f64(),
        report.events,
        report.admissions,
        report.lowest_pdb_margin,
    );
    Ok(())
}
