//! The operator as users run it: the image of `make image` in containerd on a real kubelet node
//! (`testbed up --real-node`: containerd, runc, a CNI bridge and kube-proxy on this machine),
//! installed with helm as the README says, and a drain that meets real containers: a readiness
//! probe, a preStop hook, a grace period, a PodDisruptionBudget, and the leader killed half-way.
//!
//! What the checks read is what the node shows: processes in /proc, the container's mounts, the
//! pod's readiness as its probe reports it, the records a preStop hook and a SIGTERM handler
//! write on the host (the testbed's `podapp` image). The node runs as root and one per machine
//! ([`real_node_turn`]); stopping it must leave the host as it was, which the test checks too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use maintenance_crds::{NodeMaintenance, Phase};
use serde_json::{Value, json};
use support::chart::*;
use support::invariants::{InvariantMonitor, Scope};
use support::operator::{
    OPERATOR_NAMESPACE, OUR_LEASE, create_bound_service_account, service_account_token,
};
use support::*;

use crate::helm_chart::helm;
use crate::image::image_archive;
use crate::prometheus_server::{Prometheus, SecureScrape};

const MINUTE: Duration = Duration::from_secs(60);
/// containerd of the real node (tests/testbed/real-node.sh).
const CONTAINERD_SOCKET: &str = "/run/mo-real-node/containerd.sock";
/// The testbed's workload image, imported into the node's containerd by `testbed up`.
const PODAPP_IMAGE: &str = "localhost/maintenance-operator-testbed/podapp:1";
const OPERATOR_ACCOUNT: &str = "system:serviceaccount:maintenance-operator:maintenance-operator";
const OPERATOR_UID: u32 = 65532;

fn ctr() -> Command {
    let mut cmd = Command::new("ctr");
    cmd.args(["--address", CONTAINERD_SOCKET, "--namespace", "k8s.io"]);
    cmd
}

// ---------------------------------------------------------------------------------------------
// The host, before and after

/// What a real node could leave on the host, read independently of the testbed script.
#[derive(Debug, Default, PartialEq)]
struct HostTraces {
    /// Command lines of containerd, its shims, kubelet and kube-proxy, and the containers' own.
    processes: Vec<String>,
    /// Mount points of the node: its volumes, sandboxes, network namespaces.
    mounts: Vec<String>,
    /// iptables chains and rules of kube-proxy, the kubelet and CNI.
    iptables: Vec<String>,
    /// The node's cgroups.
    cgroups: Vec<String>,
    /// The CNI bridge and its veths.
    links: Vec<String>,
}

fn host_traces() -> Result<HostTraces> {
    let mut traces = HostTraces::default();
    for entry in std::fs::read_dir("/proc")? {
        let path = entry?.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let ours = [
            "/run/mo-real-node",
            "/real-node/",
            "podapp",
            "maintenance-operator run",
        ];
        if ours.iter().any(|needle| cmdline.contains(needle)) {
            traces.processes.push(cmdline.trim().to_string());
        }
    }
    for line in read(Path::new("/proc/self/mountinfo"))?.lines() {
        let point = line.split(' ').nth(4).unwrap_or_default();
        if ["/run/mo-real-node", "/real-node/", "/run/netns/cni-"]
            .iter()
            .any(|needle| point.contains(needle))
        {
            traces.mounts.push(point.to_string());
        }
    }
    let saved = run(&mut Command::new("iptables-save"))?;
    traces.iptables = saved
        .lines()
        .filter(|l| l.contains("KUBE-") || l.contains("CNI-"))
        .map(|l| l.split(" [").next().unwrap_or(l).to_string())
        .collect();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")? {
        let kubepods = hierarchy?.path().join("kubepods");
        if kubepods.exists() {
            traces.cgroups.push(kubepods.display().to_string());
        }
    }
    for line in run(Command::new("ip").args(["-o", "link", "show"]))?.lines() {
        let name = line.split(": ").nth(1).unwrap_or_default();
        let name = name.split('@').next().unwrap_or(name);
        if name == "mo-real0" || name.starts_with("veth") {
            traces.links.push(name.to_string());
        }
    }
    traces.processes.sort();
    Ok(traces)
}

// ---------------------------------------------------------------------------------------------
// Containers as the node runs them

/// The host pid of a running container (`containerd://<id>` in the pod's status).
fn container_pid(pod: &Pod) -> Result<u32> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.strip_prefix("containerd://"))
        .with_context(|| format!("pod {name} has no containerd container id"))?;
    let tasks = run(ctr().args(["tasks", "list"]))?;
    tasks
        .lines()
        .find(|l| l.starts_with(id))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|pid| pid.parse().ok())
        .with_context(|| format!("containerd runs no task {id} for pod {name}:\n{tasks}"))
}

/// The real uid of a process and whether its root file system is mounted read-only.
fn process_identity(pid: u32) -> Result<(u32, bool)> {
    let status = read(&PathBuf::from(format!("/proc/{pid}/status")))?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .with_context(|| format!("no Uid in /proc/{pid}/status"))?;
    let mounts = read(&PathBuf::from(format!("/proc/{pid}/mountinfo")))?;
    let root_read_only = mounts
        .lines()
        .find(|l| l.split(' ').nth(4) == Some("/"))
        .and_then(|l| l.split(' ').nth(5))
        .is_some_and(|options| options.split(',').any(|o| o == "ro"));
    Ok((uid, root_read_only))
}

fn operator_pods_api(client: &kube::Client) -> Api<Pod> {
    Api::namespaced(client.clone(), OPERATOR_NAMESPACE)
}

async fn operator_pods(client: &kube::Client) -> Result<Vec<Pod>> {
    let selector = "app.kubernetes.io/name=maintenance-operator";
    Ok(operator_pods_api(client)
        .list(&ListParams::default().labels(selector))
        .await?
        .items)
}

fn running_and_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && pod_is_ready(pod)
}

async fn lease_holder(client: &kube::Client) -> Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    Ok(leases
        .get_opt(OUR_LEASE)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

// ---------------------------------------------------------------------------------------------
// The install

/// `make image`'s archive in the node's containerd, under the name the chart refers to.
fn import_operator_image() -> Result<()> {
    let archive = image_archive()?;
    run(ctr()
        .args(["images", "import", "--snapshotter", "native"])
        .arg(&archive))?;
    let images = run(ctr().args(["images", "list", "--quiet"]))?;
    let want = format!(
        "ghcr.io/maintenance-operator/maintenance-operator:{}",
        env!("CARGO_PKG_VERSION")
    );
    ensure!(
        images.lines().any(|l| l == want),
        "importing {} gave no image {want}; containerd has:\n{images}",
        archive.display()
    );
    Ok(())
}

/// The namespace first, enforcing Pod Security `restricted`, then the chart into it: every pod
/// of the chart is admitted under that level.
fn install_chart(testbed: &Testbed) -> Result<()> {
    run(kubectl(testbed).args(["create", "namespace", OPERATOR_NAMESPACE]))?;
    run(kubectl(testbed).args([
        "label",
        "namespace",
        OPERATOR_NAMESPACE,
        "pod-security.kubernetes.io/enforce=restricted",
    ]))?;
    run(helm()?
        .arg("--kubeconfig")
        .arg(testbed.kubeconfig_path())
        .args(["install", "maintenance-operator"])
        .arg(chart_dir())
        .args([
            "--namespace",
            OPERATOR_NAMESPACE,
            "--set",
            "namespace.create=false",
        ])
        // Only the real node runs containers: a KWOK node would run the pods in name only.
        .args([
            "--set",
            "nodeSelector.type=real",
            "--wait",
            "--timeout",
            "3m",
        ]))?;
    Ok(())
}

/// Two operator pods Running and Ready on the node with real processes: the image's user, a
/// read-only root file system, both probes passing (Ready, and no restart by the liveness probe).
async fn check_operator_pods(client: &kube::Client) -> Result<Vec<String>> {
    let pods = wait_until(
        "two operator pods Running and Ready",
        3 * MINUTE,
        || async {
            let pods = operator_pods(client).await?;
            let ready: Vec<Pod> = pods
                .iter()
                .filter(|p| running_and_ready(p))
                .cloned()
                .collect();
            Ok(if ready.len() == 2 {
                Check::Done(ready)
            } else {
                Check::Pending(format!(
                    "{} of {} pods Running and Ready",
                    ready.len(),
                    pods.len()
                ))
            })
        },
    )
    .await?;
    let mut names = Vec::new();
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        ensure!(
            pod_node(pod) == Some(REAL_NODE),
            "{name} is not on {REAL_NODE}"
        );
        let pid = container_pid(pod)?;
        let (uid, read_only) = process_identity(pid)?;
        ensure!(
            uid == OPERATOR_UID,
            "{name}'s process {pid} runs as uid {uid}, not {OPERATOR_UID}"
        );
        ensure!(
            read_only,
            "{name}'s process {pid} has a writable root file system"
        );
        let restarts = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .map_or(0, |c| c.restart_count);
        ensure!(
            restarts == 0,
            "{name} restarted {restarts} times: a probe fails"
        );
        names.push(name);
    }
    Ok(names)
}

/// The API server enforces `restricted` on the namespace: the chart's own pod template passes,
/// the same template without its seccomp profile or with a capability added is refused.
async fn check_pod_security(client: &kube::Client) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let deployment = deployments.get("maintenance-operator").await?;
    let template = deployment.spec.template;
    let pod_of = |mutate: &dyn Fn(&mut Value)| -> Result<Pod> {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "pod-security-probe", "namespace": OPERATOR_NAMESPACE },
            "spec": serde_json::to_value(&template.spec)?,
        });
        mutate(&mut pod["spec"]);
        Ok(serde_json::from_value(pod)?)
    };
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let pods = operator_pods_api(client);
    pods.create(&dry_run, &pod_of(&|_| {})?)
        .await
        .context("the chart's pod template is refused in its own namespace")?;
    type Mutation<'a> = &'a dyn Fn(&mut Value);
    let variants: [(&str, Mutation); 2] = [
        ("without a seccomp profile", &|spec| {
            spec["securityContext"]
                .as_object_mut()
                .map(|c| c.remove("seccompProfile"));
        }),
        ("with NET_RAW added", &|spec| {
            spec["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["NET_RAW"]);
        }),
    ];
    for (what, mutate) in variants {
        match pods.create(&dry_run, &pod_of(mutate)?).await {
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("PodSecurity") => {}
            Err(e) => bail!("the pod {what} was refused, but not by Pod Security: {e}"),
            Ok(_) => bail!("the pod {what} was admitted into a namespace enforcing restricted"),
        }
    }
    Ok(())
}

/// The webhook answers through its Service (kube-proxy's rules, the chart's certificate): a
/// request for a node that does not exist is refused with the operator's reason.
async fn check_webhook(client: &kube::Client, ns: &str) -> Result<()> {
    let api: Api<NodeMaintenance> = Api::namespaced(client.clone(), ns);
    let request = NodeMaintenance::new(
        "no-such-node",
        request_spec("no-such-node-0", "real-node-test.maintenance.nvidia.com"),
    );
    match api.create(&PostParams::default(), &request).await {
        Err(kube::Error::Api(e))
            if e.message.contains("no-such-node-0") && e.message.contains("denied") =>
        {
            Ok(())
        }
        Err(e) => bail!("the request for a missing node was refused, but not by the webhook: {e}"),
        Ok(_) => bail!("the request for a missing node was admitted: the webhook did not answer"),
    }
}

/// A real Prometheus scrapes the operator's pods behind the metrics Service, as a ServiceMonitor
/// has it do (each endpoint of the Service's port named `metrics`): two targets up, exactly one of
/// them the leader. Debian's Prometheus is built without Kubernetes service discovery, so the
/// test reads the Service's EndpointSlices itself and hands Prometheus the addresses.
async fn check_metrics_scrape(client: &kube::Client, dir: &Path) -> Result<()> {
    let targets = wait_until("the metrics Service's two endpoints", MINUTE, || async {
        let targets = service_endpoints(client, "maintenance-operator", "metrics").await?;
        Ok(if targets.len() == 2 {
            Check::Done(targets)
        } else {
            Check::Pending(format!("endpoints {targets:?}"))
        })
    })
    .await?;
    // As the chart's ServiceMonitor: HTTPS with a token of a ServiceAccount bound to the chart's
    // metrics-reader ClusterRole, the certificate verified against the webhook's CA when the
    // chart has one (the plain manifests have no webhook: a self-signed certificate).
    let reader = "prometheus";
    create_bound_service_account(
        client,
        OPERATOR_NAMESPACE,
        reader,
        "maintenance-operator-metrics-reader",
    )
    .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let verify = match secrets.get_opt("maintenance-operator-webhook-cert").await? {
        Some(secret) => {
            let ca = secret
                .data
                .and_then(|mut data| data.remove("ca.crt"))
                .context("the webhook's Secret has no ca.crt")?;
            Some((
                String::from_utf8(ca.0)?,
                format!("maintenance-operator.{OPERATOR_NAMESPACE}.svc"),
            ))
        }
        None => None,
    };
    let scrape = SecureScrape {
        token: service_account_token(client, OPERATOR_NAMESPACE, reader).await?,
        verify,
    };
    let prometheus = Prometheus::start(dir, &targets, Some(&scrape), &[])?;
    wait_until(
        "Prometheus to scrape both operator pods",
        2 * MINUTE,
        || async {
            prometheus.ensure_running()?;
            let up = prometheus.values("up").await?;
            let leader = prometheus.values("maintenance_operator_leader").await?;
            Ok(
                if up == [1.0, 1.0] && leader.len() == 2 && leader.iter().sum::<f64>() == 1.0 {
                    Check::Done(())
                } else {
                    Check::Pending(format!("up {up:?}, maintenance_operator_leader {leader:?}"))
                },
            )
        },
    )
    .await
}

/// `address:port` of each ready endpoint of a Service's named port, from its EndpointSlices.
async fn service_endpoints(
    client: &kube::Client,
    service: &str,
    port_name: &str,
) -> Result<Vec<String>> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let selector = format!("kubernetes.io/service-name={service}");
    let mut targets = Vec::new();
    for slice in slices
        .list(&ListParams::default().labels(&selector))
        .await?
    {
        let Some(port) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(port_name))
            .and_then(|p| p.port)
        else {
            continue;
        };
        for endpoint in slice.endpoints.iter().flatten() {
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(false);
            if ready {
                targets.extend(endpoint.addresses.iter().map(|a| format!("{a}:{port}")));
            }
        }
    }
    targets.sort();
    Ok(targets)
}

// ---------------------------------------------------------------------------------------------
// The drain

const REPLICAS: usize = 4;
/// What the workload's containers do (podapp): Ready this long after they start, then on
/// SIGTERM they keep serving for TERM_DELAY; the preStop hook takes PRESTOP_DELAY. Both fit in
/// the grace period, so every container ends by itself: an "exit" record proves it.
const READY_AFTER: &str = "3s";
const PRESTOP_DELAY_MS: i64 = 1000;
const TERM_DELAY_MS: i64 = 3000;
const GRACE_SECONDS: i64 = 15;

fn workload(ns: &str, records: &Path) -> Result<Deployment> {
    let container = json!({
        "name": "app",
        "image": PODAPP_IMAGE,
        "imagePullPolicy": "Never",
        "env": [
            { "name": "READY_AFTER", "value": READY_AFTER },
            { "name": "PRESTOP_DELAY", "value": format!("{PRESTOP_DELAY_MS}ms") },
            { "name": "TERM_DELAY", "value": format!("{TERM_DELAY_MS}ms") },
            { "name": "RECORD_FILE", "value": "/records/events" },
            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
        ],
        "ports": [{ "containerPort": 8080 }],
        "readinessProbe": { "httpGet": { "path": "/ready", "port": 8080 }, "periodSeconds": 1 },
        "lifecycle": { "preStop": { "exec": { "command": ["/podapp", "prestop"] } } },
        "volumeMounts": [{ "name": "records", "mountPath": "/records" }],
    });
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": { "name": "web", "namespace": ns },
        "spec": {
            "replicas": REPLICAS,
            "selector": { "matchLabels": { "app": "web" } },
            "template": {
                "metadata": { "labels": { "app": "web" } },
                "spec": {
                    "terminationGracePeriodSeconds": GRACE_SECONDS,
                    "containers": [container],
                    "volumes": [{ "name": "records",
                        "hostPath": { "path": records.display().to_string(), "type": "Directory" } }],
                },
            },
        },
    }))?)
}

/// One line a container wrote: "<event> <pod> <unix ms>".
#[derive(Debug)]
struct Record {
    event: String,
    pod: String,
    at_ms: i64,
}

fn read_records(file: &Path) -> Result<Vec<Record>> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .map(|line| {
            let mut parts = line.split(' ');
            let (Some(event), Some(pod), Some(at)) = (parts.next(), parts.next(), parts.next())
            else {
                bail!("malformed record {line:?} in {}", file.display());
            };
            Ok(Record {
                event: event.to_string(),
                pod: pod.to_string(),
                at_ms: at.parse().with_context(|| format!("record {line:?}"))?,
            })
        })
        .collect()
}

/// The drained pods' containers ran their preStop hook, then got SIGTERM, then ended by
/// themselves within the grace period; and each pod object stayed until its container ended.
fn check_graceful_ends(
    records: &[Record],
    drained: &BTreeMap<String, i64>,
) -> Result<Vec<(i64, i64, i64)>> {
    let mut ends = Vec::new();
    for (pod, gone_ms) in drained {
        let at = |event: &str| {
            records
                .iter()
                .find(|r| &r.pod == pod && r.event == event)
                .map(|r| r.at_ms)
        };
        let (Some(prestop), Some(term), Some(exit)) = (at("prestop"), at("term"), at("exit"))
        else {
            bail!(
                "pod {pod} did not end gracefully (prestop, term, exit): {:?}",
                records.iter().filter(|r| &r.pod == pod).collect::<Vec<_>>()
            );
        };
        ensure!(
            term - prestop >= PRESTOP_DELAY_MS - 50,
            "pod {pod}: SIGTERM came {} ms after the preStop hook began, before it ended",
            term - prestop
        );
        ensure!(
            exit - term >= TERM_DELAY_MS - 50,
            "pod {pod}: the container ended {} ms after SIGTERM, before its own {TERM_DELAY_MS} ms",
            exit - term
        );
        ensure!(
            *gone_ms + 100 >= exit,
            "pod {pod} was gone from the API at {gone_ms}, before its container ended at {exit}"
        );
        ends.push((term - prestop, exit - term, gone_ms - exit));
    }
    Ok(ends)
}

fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// What the test saw of the drain of the real node.
struct DrainSeen {
    /// When each workload pod on the node disappeared from the API (ms since the epoch).
    gone: BTreeMap<String, i64>,
    /// The fewest Ready workload pods (by their readiness probes) at any moment.
    fewest_ready: usize,
    /// What the test did to the operator meanwhile.
    kills: Vec<String>,
}

/// Follows the drain of the node (see [`DrainSeen`]). Kills the leader pod once the first pod
/// is gone, then the new leader's process once the second one is.
async fn follow_drain(client: &kube::Client, ns: &str, initial: &[String]) -> Result<DrainSeen> {
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut gone = BTreeMap::new();
    let mut fewest_ready = usize::MAX;
    let mut kills = Vec::new();
    let deadline = Instant::now() + 5 * MINUTE;
    while gone.len() < initial.len() {
        ensure!(
            Instant::now() < deadline,
            "the drain did not finish in 5 minutes: {} of {} pods gone",
            gone.len(),
            initial.len()
        );
        let pods = pods_api
            .list(&ListParams::default().labels("app=web"))
            .await?
            .items;
        let ready = pods.iter().filter(|p| pod_is_ready(p)).count();
        fewest_ready = fewest_ready.min(ready);
        for name in initial {
            if !gone.contains_key(name)
                && !pods
                    .iter()
                    .any(|p| p.metadata.name.as_deref() == Some(name))
            {
                gone.insert(name.clone(), now_ms());
            }
        }
        if !gone.is_empty() && kills.is_empty() {
            kills.push(delete_leader_pod(client).await?);
        }
        if gone.len() >= 2 && kills.len() == 1 {
            kills.push(kill_leader_process(client).await?);
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Ok(DrainSeen {
        gone,
        fewest_ready,
        kills,
    })
}

/// `kubectl delete pod` of the Lease holder.
async fn delete_leader_pod(client: &kube::Client) -> Result<String> {
    let holder = lease_holder(client)
        .await?
        .context("nobody holds the Lease")?;
    operator_pods_api(client)
        .delete(&holder, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting the leader pod {holder}"))?;
    Ok(format!("deleted the leader pod {holder}"))
}

/// SIGKILL of the process of whichever pod leads once the deleted one is gone.
async fn kill_leader_process(client: &kube::Client) -> Result<String> {
    let holder = wait_until(
        "another operator pod to take the Lease",
        2 * MINUTE,
        || async {
            let pods = operator_pods(client).await?;
            let holder = lease_holder(client).await?;
            Ok(
                match pods
                    .iter()
                    .find(|p| p.metadata.name == holder && running_and_ready(p))
                {
                    Some(pod) => Check::Done(pod.clone()),
                    None => Check::Pending(format!("Lease held by {holder:?}")),
                },
            )
        },
    )
    .await?;
    let name = holder.metadata.name.clone().unwrap_or_default();
    let pid = container_pid(&holder)?;
    run(Command::new("kill").args(["-KILL", &pid.to_string()]))?;
    Ok(format!(
        "SIGKILLed the process {pid} of the new leader {name}"
    ))
}

// ---------------------------------------------------------------------------------------------
// The scenario

/// Runs `scenario` on a testbed of its own with a real node, then stops it and checks that the
/// host shows nothing of the node any more.
async fn on_a_real_node(scenario: impl AsyncFnOnce(&Testbed) -> Result<()>) -> Result<()> {
    let _turn = real_node_turn().await;
    let before = host_traces()?;
    let testbed = Testbed::start_with_real_node().await?;
    let result = scenario(&testbed).await;
    if result.is_err() {
        eprintln!(
            "--- kubectl get pods -A -o wide ---\n{}",
            kubectl_out(&testbed, &["get", "pods", "-A", "-o", "wide"])
        );
    }
    let stopped = testbed.stop().await;
    result?;
    stopped.context("stopping the testbed with its real node")?;
    let after = host_traces()?;
    ensure!(
        after == before,
        "the real node left traces on the host:\nbefore: {before:#?}\nafter: {after:#?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_chart_on_a_real_node_drains_real_containers_and_leaves_the_host_clean() -> Result<()> {
    on_a_real_node(async |testbed| {
        let client = testbed.client().await?;
        import_operator_image()?;
        install_chart(testbed)?;
        check_install(&client).await?;
        let ns = unique_name("real");
        create_namespace(&client, &ns).await?;
        check_webhook(&client, &ns).await?;
        drain(testbed, &client, &ns).await
    })
    .await
}

/// deploy/README.md's plain manifests (no webhook): the CRDs, then the rest.
#[tokio::test]
async fn the_plain_manifests_run_on_a_real_node() -> Result<()> {
    on_a_real_node(async |testbed| {
        let client = testbed.client().await?;
        import_operator_image()?;
        let crds = chart_dir().join("crds/crds.yaml");
        for file in [crds, manifests_path()] {
            run(kubectl(testbed)
                .args(["apply", "--server-side", "-f"])
                .arg(&file))?;
            run(kubectl(testbed).args([
                "wait",
                "--for=condition=established",
                "--timeout=60s",
                "crd",
                "--all",
            ]))?;
        }
        check_install(&client).await
    })
    .await
}

/// What an install must show once its pods run: two real operator processes (the image's user,
/// read-only root, probes passing), one of them holding the Lease, Pod Security `restricted`
/// enforced on the namespace, and both pods' metrics scraped by a real Prometheus.
async fn check_install(client: &kube::Client) -> Result<()> {
    let work = tempfile::tempdir()?;
    let operator_pod_names = check_operator_pods(client).await?;
    let holder = lease_holder(client).await?;
    ensure!(
        holder
            .as_ref()
            .is_some_and(|h| operator_pod_names.contains(h)),
        "the Lease is held by {holder:?}, not by one of {operator_pod_names:?}"
    );
    check_pod_security(client).await?;
    check_metrics_scrape(client, work.path()).await?;
    check_liveness(client, &operator_pod_names).await
}

/// No liveness probe of the operator failed, once each pod has been probed a few times (the
/// chart's initial delay of 5 s and period of 10 s): the kubelet reports every failure as an
/// `Unhealthy` event, long before it restarts the container.
async fn check_liveness(client: &kube::Client, pods: &[String]) -> Result<()> {
    let pods_api = operator_pods_api(client);
    for name in pods {
        let pod = pods_api.get(name).await?;
        let started = pod
            .status
            .and_then(|s| s.start_time)
            .map(|t| t.0)
            .with_context(|| format!("{name} has no start time"))?;
        let probed_by = started + jiff::SignedDuration::from_secs(26);
        if let Ok(wait) = Duration::try_from(probed_by.duration_since(jiff::Timestamp::now())) {
            tokio::time::sleep(wait).await;
        }
        let failures: Vec<String> = events_about(client, OPERATOR_NAMESPACE, name)
            .await?
            .into_iter()
            .filter_map(|e| e.note)
            .filter(|note| note.contains("Liveness probe failed"))
            .collect();
        ensure!(failures.is_empty(), "{name}: {failures:?}");
    }
    Ok(())
}

/// The drain of the real node while the leader is killed, judged by the invariant monitor and by
/// what the containers recorded.
async fn drain(testbed: &Testbed, client: &kube::Client, ns: &str) -> Result<()> {
    // The workload, all of it on the real node (the only node so far), under a budget of one
    // disruption at a time; then KWOK nodes to take the replacements.
    let records = tempfile::Builder::new()
        .prefix("mo-real-records-")
        .tempdir()?;
    std::fs::set_permissions(
        records.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )?;
    create_object(client, &workload(ns, records.path())?).await?;
    create_pdb_max_unavailable(client, ns, "web", &[("app", "web")], IntOrString::Int(1)).await?;
    let pods = wait_pods_ready(client, ns, "app=web", REPLICAS, 2 * MINUTE).await?;
    let initial: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    ensure!(
        pods.iter().all(|p| pod_node(p) == Some(REAL_NODE)),
        "the workload is not all on {REAL_NODE}"
    );
    let dir = testbed.dir().to_string_lossy().into_owned();
    run_testbed(&["nodes", "--dir", &dir, "--count", "2", "--prefix", "spare"]).await?;

    let monitor = InvariantMonitor::start(
        testbed,
        Scope::new(ns, &[REAL_NODE.to_string()]).operator_user(OPERATOR_ACCOUNT),
    )
    .await?;
    let spec = maintenance_crds::NodeMaintenanceSpec {
        drain_spec: drain_spec(false, 300),
        ..request_spec(REAL_NODE, "real-node-test.maintenance.nvidia.com")
    };
    create_request(client, ns, REAL_NODE, spec).await?;
    let DrainSeen {
        gone,
        fewest_ready,
        kills,
    } = follow_drain(client, ns, &initial).await?;
    ensure!(
        fewest_ready >= REPLICAS - 1,
        "only {fewest_ready} of {REPLICAS} pods were Ready at one moment: the budget allows one down"
    );
    let records_file = records.path().join("events");
    let ends = check_graceful_ends(&read_records(&records_file)?, &gone)?;
    eprintln!(
        "drain of {REAL_NODE}: {kills:?}; fewest Ready pods {fewest_ready} of {REPLICAS}; \
         per pod (preStop to SIGTERM, SIGTERM to exit, exit to gone) in ms: {ends:?}"
    );
    wait_phase(client, ns, REAL_NODE, Phase::Ready, 3 * MINUTE).await?;
    // The operator's pods are never evicted: the one the test did not delete still runs there
    // (restarted by the kubelet after the SIGKILL).
    wait_until(
        "an operator pod Running and Ready on the drained node",
        2 * MINUTE,
        || async {
            let pods = operator_pods(client).await?;
            Ok(
                if pods
                    .iter()
                    .any(|p| running_and_ready(p) && pod_node(p) == Some(REAL_NODE))
                {
                    Check::Done(())
                } else {
                    Check::Pending(format!(
                        "{} operator pods, none Running and Ready on {REAL_NODE}",
                        pods.len()
                    ))
                },
            )
        },
    )
    .await?;

    delete_request(client, ns, REAL_NODE).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    wait_until("real-0 to be uncordoned", 2 * MINUTE, || async {
        let node = nodes.get(REAL_NODE).await?;
        let cordoned = node.spec.and_then(|s| s.unschedulable).unwrap_or(false);
        Ok(if cordoned {
            Check::Pending("unschedulable".into())
        } else {
            Check::Done(())
        })
    })
    .await?;
    monitor.held().await?;
    the_graceful_end_check_catches_a_force_deletion(client, ns, &records_file).await
}

/// The check can fail: a pod force-deleted (grace 0, as a drain that ignored its budget and its
/// hooks would) is not found to have ended gracefully.
async fn the_graceful_end_check_catches_a_force_deletion(
    client: &kube::Client,
    ns: &str,
    records_file: &Path,
) -> Result<()> {
    // Nothing moves back to the uncordoned node by itself: pin the workload to it.
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let patch = json!({ "spec": { "template": { "spec": {
        "nodeSelector": { "kubernetes.io/hostname": REAL_NODE } } } } });
    deployments
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let pod = wait_until(
        "a workload pod Ready on the real node",
        2 * MINUTE,
        || async {
            let pods = pods_api
                .list(&ListParams::default().labels("app=web"))
                .await?
                .items;
            let on_node = pods
                .into_iter()
                .find(|p| pod_node(p) == Some(REAL_NODE) && pod_is_ready(p));
            Ok(match on_node {
                Some(pod) => Check::Done(pod),
                None => Check::Pending("none yet".into()),
            })
        },
    )
    .await?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    pods_api.delete(&name, &force).await?;
    let gone = BTreeMap::from([(name.clone(), now_ms())]);
    wait_until(
        "the force-deleted pod's container to end",
        MINUTE,
        || async {
            Ok(match container_pid(&pod) {
                Err(_) => Check::Done(()),
                Ok(pid) => Check::Pending(format!("process {pid} runs")),
            })
        },
    )
    .await?;
    match check_graceful_ends(&read_records(records_file)?, &gone) {
        Err(_) => Ok(()),
        Ok(ends) => bail!("the force-deleted pod {name} passed the graceful-end check: {ends:?}"),
    }
}

fn kubectl_out(testbed: &Testbed, args: &[&str]) -> String {
    run(kubectl(testbed).args(args)).unwrap_or_else(|e| format!("{e:#}"))
}
