//! Test support shared by the integration tests (`mod support;` in each test file).
//!
//! Tests run against a real control plane (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler and KWOK) started by `tests/testbed/testbed`; nothing here fakes the API server.
//! Every wait has a deadline and polls the cluster: tests never sleep for a fixed time.

// Each test binary includes this module and uses only part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, Deployment, DeploymentSpec, DeploymentStrategy,
    RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, Namespace, Node, NodeSpec, NodeStatus, Pod, PodSpec,
    PodTemplateSpec, ResourceRequirements, ServiceAccount, Taint, Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::Deserialize;
use tokio::process::Command;
use tokio::sync::OnceCell;

/// The Events about object `name` in `ns` (they outlive it), oldest first.
pub async fn events_about(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Vec<k8s_openapi::api::events::v1::Event>> {
    let lp = ListParams::default().fields(&format!("regarding.name={name}"));
    let mut events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .with_context(|| format!("listing the events about {ns}/{name}"))?
        .items;
    events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    Ok(events)
}

/// The phase an Event announces (reason `ConditionChanged`, as NVIDIA's, with the phase as the
/// action and at the start of the note), or the Event's own reason for every other Event.
pub fn phase_or_reason(event: &k8s_openapi::api::events::v1::Event) -> Option<String> {
    let reason = event.reason.clone()?;
    if reason != "ConditionChanged" {
        return Some(reason);
    }
    let phase = event.action.clone()?;
    let note = event.note.as_deref().unwrap_or_default();
    // The note agrees with the action, or the Event would mislead `kubectl get events` readers.
    note.starts_with(&phase).then_some(phase)
}

/// Image for every container: KWOK runs nothing, so it is never pulled.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// Annotation that makes the testbed's KWOK manage a node.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// Label set on every node made by [`create_nodes`], with the prefix as value.
pub const NODE_PREFIX_LABEL: &str = "testbed.maintenance.nvidia.com/prefix";
/// Grace period of pods made here unless told otherwise: long enough to see pods terminate,
/// short enough to keep tests fast. KWOK removes a terminating pod when its grace period ends.
pub const DEFAULT_GRACE_SECONDS: i64 = 1;
/// How often `wait_for` polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// Field manager of the server-side applies made here.
pub const FIELD_MANAGER: &str = "maintenance-operator-tests";
/// The identity of the testbed's admin kubeconfig, which the shared operator (and the tests) use:
/// in the audit log, its pod deletions in a test's namespace are the operator's.
pub const ADMIN_USER: &str = "testbed-admin";

const UNREADY_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

// ---------------------------------------------------------------------------------------------
// The control plane

/// A control plane started by `tests/testbed/testbed up`.
pub struct Testbed {
    dir: PathBuf,
    kubeconfig: PathBuf,
    /// Started by this process: stopped (and its directory removed) on drop.
    owned: bool,
    /// Started for one test (`Testbed::start`), not shared by the tests of the binary.
    exclusive: bool,
}

fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `testbed` script.
pub fn testbed_script() -> PathBuf {
    repo_root().join("tests/testbed/testbed")
}

/// The CRD manifests the operator installs.
pub fn crds_path() -> PathBuf {
    repo_root().join("crds/crds.yaml")
}

fn keep_dirs() -> bool {
    std::env::var_os("MO_TESTBED_KEEP").is_some_and(|v| !v.is_empty() && v != "0")
}

async fn run_testbed(args: &[&str]) -> Result<String> {
    let script = testbed_script();
    let out = Command::new(&script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!(
            "`testbed {}` failed ({}):\n{stdout}{stderr}",
            args.join(" "),
            out.status
        );
    }
    if !stderr.trim().is_empty() {
        eprint!("{stderr}");
    }
    Ok(stdout)
}

impl Testbed {
    /// Starts a control plane of its own in a new temporary directory. It stops when this value
    /// is dropped, or when this process exits in any way (the script watches our pid).
    /// `MO_TESTBED_KEEP=1` keeps the directory (logs, kubeconfig) for a post-mortem.
    pub async fn start() -> Result<Testbed> {
        run_testbed(&["build"]).await?;
        let dir = tempfile::Builder::new()
            .prefix("mo-testbed-")
            .tempdir()
            .context("creating the testbed directory")?
            .keep();
        let dir_arg = dir.to_string_lossy().into_owned();
        let pid = std::process::id().to_string();
        let mut args = vec!["up", "--dir", &dir_arg, "--watch-pid", &pid];
        if !keep_dirs() {
            args.push("--rm-dir-on-exit");
        }
        let out = match run_testbed(&args).await {
            Ok(out) => out,
            Err(e) => {
                if !keep_dirs() {
                    let _ = std::fs::remove_dir_all(&dir);
                }
                return Err(e);
            }
        };
        eprint!("{out}");
        Ok(Testbed {
            kubeconfig: dir.join("kubeconfig"),
            dir,
            owned: true,
            exclusive: true,
        })
    }

    /// The testbed of this test binary, started on first use and shared by its tests (each test
    /// isolates itself with its own namespace and nodes). With `MO_TESTBED_DIR` naming the
    /// directory of a running testbed (`testbed up --dir ...`), that one is used instead.
    pub async fn shared() -> Result<&'static Testbed> {
        static SHARED: OnceCell<Testbed> = OnceCell::const_new();
        SHARED
            .get_or_try_init(|| async {
                if let Some(dir) = std::env::var_os("MO_TESTBED_DIR").filter(|d| !d.is_empty()) {
                    let dir = PathBuf::from(dir);
                    let dir_arg = dir.to_string_lossy().into_owned();
                    match run_testbed(&["status", "--dir", &dir_arg]).await {
                        Ok(_) => {
                            return Ok(Testbed {
                                kubeconfig: dir.join("kubeconfig"),
                                dir,
                                owned: false,
                                exclusive: false,
                            });
                        }
                        Err(e) => eprintln!(
                            "MO_TESTBED_DIR={dir_arg} holds no running testbed ({e:#}); starting one"
                        ),
                    }
                }
                let mut testbed = Testbed::start().await?;
                testbed.exclusive = false;
                Ok(testbed)
            })
            .await
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Started for one test (`Testbed::start`), not shared with the other tests of the binary.
    pub fn is_exclusive(&self) -> bool {
        self.exclusive
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Client configuration read from this testbed's kubeconfig (never from the environment).
    pub async fn config(&self) -> Result<Config> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("reading {}", self.kubeconfig.display()))?;
        Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    /// A client for this testbed. Make one per test: a client lives on the runtime it was made on.
    pub async fn client(&self) -> Result<Client> {
        Ok(Client::try_from(self.config().await?)?)
    }

    /// A client that does not retry 429/503/504 by itself, so a test sees the API server's answer
    /// (for instance an eviction refused by a PodDisruptionBudget).
    pub async fn client_without_retry(&self) -> Result<Client> {
        let mut config = self.config().await?;
        config.default_retry = false;
        Ok(Client::try_from(config)?)
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let status = std::process::Command::new(testbed_script())
            .arg("down")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--quiet")
            .stdin(Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!(
                "testbed down --dir {} failed: {status:?}",
                self.dir.display()
            );
        }
        if keep_dirs() {
            eprintln!("kept testbed directory {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Names and waiting

/// A DNS-1123 label `<prefix>-<tag>-<n>`: `tag` differs between processes (so tests sharing a
/// testbed through `MO_TESTBED_DIR` do not collide) and `n` between calls.
pub fn unique_name(prefix: &str) -> String {
    static TAG: OnceLock<String> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let tag = TAG.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u64 ^ d.as_secs())
            .unwrap_or_default();
        base36((u64::from(std::process::id()) << 20 ^ nanos) % 36u64.pow(5))
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut head: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let tail = format!("-{tag}-{}", base36(n));
    head.truncate(63 - tail.len());
    let head = head.trim_matches('-');
    let head = if head.is_empty() { "t" } else { head };
    format!("{head}{tail}")
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// Outcome of one look at the cluster for [`wait_until`].
pub enum Check<T> {
    Done(T),
    /// Not there yet; the text says what was seen, for the timeout error.
    Pending(String),
}

/// Polls `f` every [`POLL_INTERVAL`] until it returns `Some`; errors from `f` count as "not yet".
/// After `timeout` it fails naming `what` and the last error.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    wait_until(what, timeout, move || {
        let fut = f();
        async move {
            Ok(match fut.await? {
                Some(v) => Check::Done(v),
                None => Check::Pending("condition not met".into()),
            })
        }
    })
    .await
}

/// Like [`wait_for`], with the last observed state in the timeout error.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Check<T>>>,
{
    let start = Instant::now();
    let deadline = start + timeout;
    let mut last: String;
    loop {
        match f().await {
            Ok(Check::Done(v)) => return Ok(v),
            Ok(Check::Pending(state)) => last = state,
            Err(e) => last = format!("error: {e:#}"),
        }
        if Instant::now() >= deadline {
            bail!(
                "timed out after {:.1}s waiting for {what}; last seen: {last}",
                start.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

fn labels_map(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `k=v,k2=v2`, for list calls.
pub fn selector_string(labels: &[(&str, &str)]) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

// ---------------------------------------------------------------------------------------------
// Namespaces

/// Creates a namespace and waits for its `default` ServiceAccount (pods are refused before).
pub async fn create_namespace(client: &Client, name: &str) -> Result<Namespace> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    let ns = api
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    wait_for(
        &format!("the default ServiceAccount of namespace {name}"),
        Duration::from_secs(60),
        || {
            let sas = sas.clone();
            async move { Ok(sas.get_opt("default").await?.map(|_| ())) }
        },
    )
    .await?;
    Ok(ns)
}

// ---------------------------------------------------------------------------------------------
// Nodes

/// How [`create_nodes_with`] makes KWOK nodes.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub cpu: String,
    pub memory: String,
    pub pods: String,
}

impl Default for NodeOptions {
    fn default() -> Self {
        NodeOptions {
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            taints: Vec::new(),
            unschedulable: false,
            cpu: "32".into(),
            memory: "256Gi".into(),
            pods: "110".into(),
        }
    }
}

/// Creates `count` KWOK nodes `<prefix>-0 .. <prefix>-<count-1>` with the given extra labels and
/// returns their names. Use a [`unique_name`] as prefix.
pub async fn create_nodes(
    client: &Client,
    prefix: &str,
    count: usize,
    labels: &[(&str, &str)],
) -> Result<Vec<String>> {
    let opts = NodeOptions {
        labels: labels_map(labels),
        ..Default::default()
    };
    create_nodes_with(client, prefix, count, &opts).await
}

pub fn node_object(name: &str, prefix: &str, opts: &NodeOptions) -> Node {
    let mut labels = BTreeMap::from([
        ("type".to_string(), "kwok".to_string()),
        ("kubernetes.io/hostname".to_string(), name.to_string()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), "amd64".to_string()),
        (NODE_PREFIX_LABEL.to_string(), prefix.to_string()),
    ]);
    labels.extend(opts.labels.clone());
    let mut annotations = opts.annotations.clone();
    annotations.insert(KWOK_NODE_ANNOTATION.to_string(), "fake".to_string());
    let resources = BTreeMap::from([
        ("cpu".to_string(), Quantity(opts.cpu.clone())),
        ("memory".to_string(), Quantity(opts.memory.clone())),
        ("pods".to_string(), Quantity(opts.pods.clone())),
    ]);
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!opts.taints.is_empty()).then(|| opts.taints.clone()),
            unschedulable: opts.unschedulable.then_some(true),
            ..Default::default()
        }),
        // A kubelet registers its node with capacity in the status; KWOK keeps what is there.
        status: Some(NodeStatus {
            allocatable: Some(resources.clone()),
            capacity: Some(resources),
            ..Default::default()
        }),
    }
}

pub async fn create_nodes_with(
    client: &Client,
    prefix: &str,
    count: usize,
    opts: &NodeOptions,
) -> Result<Vec<String>> {
    if prefix.len() > 50 {
        bail!("node prefix {prefix:?} is longer than 50 characters");
    }
    let api: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    futures::stream::iter(names.iter().map(|name| {
        let api = api.clone();
        let node = node_object(name, prefix, opts);
        async move {
            api.create(&PostParams::default(), &node)
                .await
                .with_context(|| format!("creating node {name}"))
        }
    }))
    .buffer_unordered(16)
    .try_collect::<Vec<Node>>()
    .await?;
    Ok(names)
}

/// Ready as the scheduler sees it: condition Ready=True and no not-ready/unreachable taint.
pub fn node_is_ready(node: &Node) -> bool {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| UNREADY_TAINTS.contains(&t.key.as_str())));
    ready && !tainted
}

/// Waits until every named node is Ready (see [`node_is_ready`]).
pub async fn wait_nodes_ready(client: &Client, names: &[String], timeout: Duration) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let wanted: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    wait_until(
        &format!("{} nodes to become Ready", names.len()),
        timeout,
        || {
            let api = api.clone();
            let wanted = wanted.clone();
            async move {
                let nodes = api.list(&ListParams::default().match_any()).await?;
                let ready: BTreeSet<&str> = nodes
                    .items
                    .iter()
                    .filter(|n| node_is_ready(n))
                    .filter_map(|n| n.metadata.name.as_deref())
                    .filter(|n| wanted.contains(n))
                    .collect();
                if ready.len() == wanted.len() {
                    return Ok(Check::Done(()));
                }
                let missing: Vec<&&str> = wanted.difference(&ready).take(5).collect();
                Ok(Check::Pending(format!(
                    "{} of {} Ready, not yet: {missing:?}...",
                    ready.len(),
                    wanted.len()
                )))
            }
        },
    )
    .await
}

async fn set_unschedulable(client: &Client, name: &str, unschedulable: bool) -> Result<Node> {
    let api: Api<Node> = Api::all(client.clone());
    let patch = serde_json::json!({ "spec": { "unschedulable": unschedulable } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("setting unschedulable={unschedulable} on node {name}"))
}

pub async fn cordon_node(client: &Client, name: &str) -> Result<Node> {
    set_unschedulable(client, name, true).await
}

pub async fn uncordon_node(client: &Client, name: &str) -> Result<Node> {
    set_unschedulable(client, name, false).await
}

// ---------------------------------------------------------------------------------------------
// Workloads

/// Pod template settings shared by Deployments and DaemonSets.
#[derive(Clone, Debug, Default)]
pub struct PodSpecOptions {
    /// `spec.nodeSelector`, e.g. from [`PodSpecOptions::on_node`] or a node group label.
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    /// Resource requests of the single container, e.g. `[("cpu", "500m")]`.
    pub requests: BTreeMap<String, String>,
    /// Mount an emptyDir volume (drains treat such pods as holding local data).
    pub empty_dir: bool,
    /// `None`: [`DEFAULT_GRACE_SECONDS`].
    pub termination_grace_period_seconds: Option<i64>,
    pub annotations: BTreeMap<String, String>,
}

impl PodSpecOptions {
    /// Pods go to this node only (nodeSelector on `kubernetes.io/hostname`).
    pub fn on_node(node: &str) -> Self {
        Self::on_nodes_labelled("kubernetes.io/hostname", node)
    }

    /// Pods go to nodes carrying this label only.
    pub fn on_nodes_labelled(key: &str, value: &str) -> Self {
        PodSpecOptions {
            node_selector: BTreeMap::from([(key.to_string(), value.to_string())]),
            ..Default::default()
        }
    }

    /// Pods go to nodes made by [`create_nodes`] with this prefix.
    pub fn on_nodes_with_prefix(prefix: &str) -> Self {
        Self::on_nodes_labelled(NODE_PREFIX_LABEL, prefix)
    }
}

fn quantities(map: &BTreeMap<String, String>) -> Option<BTreeMap<String, Quantity>> {
    (!map.is_empty()).then(|| {
        map.iter()
            .map(|(k, v)| (k.clone(), Quantity(v.clone())))
            .collect()
    })
}

fn pod_spec(
    node_name: Option<&str>,
    node_selector: &BTreeMap<String, String>,
    tolerations: &[Toleration],
    requests: &BTreeMap<String, String>,
    empty_dir: bool,
    grace: Option<i64>,
) -> PodSpec {
    PodSpec {
        node_name: node_name.map(str::to_string),
        node_selector: (!node_selector.is_empty()).then(|| node_selector.clone()),
        tolerations: (!tolerations.is_empty()).then(|| tolerations.to_vec()),
        termination_grace_period_seconds: Some(grace.unwrap_or(DEFAULT_GRACE_SECONDS)),
        containers: vec![Container {
            name: "main".into(),
            image: Some(PAUSE_IMAGE.into()),
            resources: quantities(requests).map(|r| ResourceRequirements {
                requests: Some(r),
                ..Default::default()
            }),
            volume_mounts: empty_dir.then(|| {
                vec![VolumeMount {
                    name: "scratch".into(),
                    mount_path: "/scratch".into(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }],
        volumes: empty_dir.then(|| {
            vec![Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            }]
        }),
        ..Default::default()
    }
}

fn template(labels: &BTreeMap<String, String>, pod: &PodSpecOptions) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels.clone()),
            annotations: (!pod.annotations.is_empty()).then(|| pod.annotations.clone()),
            ..Default::default()
        }),
        spec: Some(pod_spec(
            None,
            &pod.node_selector,
            &pod.tolerations,
            &pod.requests,
            pod.empty_dir,
            pod.termination_grace_period_seconds,
        )),
    }
}

/// A Deployment whose pods carry `labels` (also its selector).
pub async fn create_deployment(
    client: &Client,
    ns: &str,
    name: &str,
    replicas: i32,
    labels: &[(&str, &str)],
    pod: &PodSpecOptions,
) -> Result<Deployment> {
    let labels = labels_map(labels);
    let deployment = Deployment {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: DeploymentSpec {
            replicas: Some(replicas),
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment::default()),
            }),
            template: template(&labels, pod),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &deployment)
        .await
        .with_context(|| format!("creating deployment {ns}/{name}"))
}

/// A DaemonSet whose pods carry `labels`; it places a pod on every node that
/// `pod.node_selector` allows (restrict it, or it covers every node of the testbed).
pub async fn create_daemonset(
    client: &Client,
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
    pod: &PodSpecOptions,
) -> Result<DaemonSet> {
    let labels = labels_map(labels);
    let ds = DaemonSet {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            labels: Some(labels.clone()),
            ..Default::default()
        },
        spec: DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                ..Default::default()
            },
            template: template(&labels, pod),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<DaemonSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &ds)
        .await
        .with_context(|| format!("creating daemonset {ns}/{name}"))
}

async fn create_pdb(
    client: &Client,
    ns: &str,
    name: &str,
    match_labels: &[(&str, &str)],
    min_available: Option<IntOrString>,
    max_unavailable: Option<IntOrString>,
) -> Result<PodDisruptionBudget> {
    let pdb = PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(LabelSelector {
                match_labels: Some(labels_map(match_labels)),
                ..Default::default()
            }),
            min_available,
            max_unavailable,
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<PodDisruptionBudget>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pdb)
        .await
        .with_context(|| format!("creating PodDisruptionBudget {ns}/{name}"))
}

/// The PodDisruptionBudget kinds of the scale tests, in turn by `index`: maxUnavailable 1,
/// maxUnavailable 10%, minAvailable `replicas - 1`.
pub async fn create_pdb_of_kind(
    client: &Client,
    ns: &str,
    name: &str,
    selector: &[(&str, &str)],
    index: usize,
    replicas: i32,
) -> Result<()> {
    match index % 3 {
        0 => create_pdb_max_unavailable(client, ns, name, selector, IntOrString::Int(1)).await?,
        1 => {
            create_pdb_max_unavailable(
                client,
                ns,
                name,
                selector,
                IntOrString::String("10%".into()),
            )
            .await?
        }
        _ => {
            create_pdb_min_available(
                client,
                ns,
                name,
                selector,
                IntOrString::Int((replicas - 1).max(1)),
            )
            .await?
        }
    };
    Ok(())
}

pub async fn create_pdb_min_available(
    client: &Client,
    ns: &str,
    name: &str,
    match_labels: &[(&str, &str)],
    min_available: IntOrString,
) -> Result<PodDisruptionBudget> {
    create_pdb(client, ns, name, match_labels, Some(min_available), None).await
}

pub async fn create_pdb_max_unavailable(
    client: &Client,
    ns: &str,
    name: &str,
    match_labels: &[(&str, &str)],
    max_unavailable: IntOrString,
) -> Result<PodDisruptionBudget> {
    create_pdb(client, ns, name, match_labels, None, Some(max_unavailable)).await
}

/// Settings of a pod made by [`create_bare_pod`].
#[derive(Clone, Debug, Default)]
pub struct BarePodOptions {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Mount an emptyDir volume.
    pub empty_dir: bool,
    /// Resource requests of the single container, e.g. `[("cpu", "500m")]`.
    pub requests: BTreeMap<String, String>,
    /// Controller reference. The garbage collector deletes pods whose owner does not exist, so
    /// point it at a real object.
    pub owner: Option<OwnerReference>,
    pub finalizers: Vec<String>,
    pub tolerations: Vec<Toleration>,
    /// `None`: [`DEFAULT_GRACE_SECONDS`].
    pub termination_grace_period_seconds: Option<i64>,
}

/// A pod bound to `node_name` directly (no scheduler), with no controller unless `opts.owner`.
pub async fn create_bare_pod(
    client: &Client,
    ns: &str,
    name: &str,
    node_name: &str,
    opts: &BarePodOptions,
) -> Result<Pod> {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(ns.to_string()),
            labels: (!opts.labels.is_empty()).then(|| opts.labels.clone()),
            annotations: (!opts.annotations.is_empty()).then(|| opts.annotations.clone()),
            owner_references: opts.owner.clone().map(|o| vec![o]),
            finalizers: (!opts.finalizers.is_empty()).then(|| opts.finalizers.clone()),
            ..Default::default()
        },
        spec: Some(pod_spec(
            Some(node_name),
            &BTreeMap::new(),
            &opts.tolerations,
            &opts.requests,
            opts.empty_dir,
            opts.termination_grace_period_seconds,
        )),
        ..Default::default()
    };
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating pod {ns}/{name} on {node_name}"))
}

// ---------------------------------------------------------------------------------------------
// Observing workloads

/// Condition Ready=True and not terminating.
pub fn pod_is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn pod_node(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
}

/// Waits until exactly `count` pods matching `selector` are Ready and no other non-terminating
/// pod matches; returns the Ready pods.
pub async fn wait_pods_ready(
    client: &Client,
    ns: &str,
    selector: &str,
    count: usize,
    timeout: Duration,
) -> Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(selector);
    wait_until(
        &format!("{count} Ready pods matching {selector} in {ns}"),
        timeout,
        || {
            let (api, lp) = (api.clone(), lp.clone());
            async move {
                let pods = api.list(&lp).await?.items;
                let live = pods
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .count();
                let ready: Vec<Pod> = pods.into_iter().filter(pod_is_ready).collect();
                if ready.len() == count && live == count {
                    return Ok(Check::Done(ready));
                }
                Ok(Check::Pending(format!(
                    "{} Ready of {live} not terminating",
                    ready.len()
                )))
            }
        },
    )
    .await
}

/// Waits until the pod is gone (a pod of the same name with another uid counts as gone).
pub async fn wait_pod_gone(
    client: &Client,
    ns: &str,
    name: &str,
    uid: Option<&str>,
    timeout: Duration,
) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_until(&format!("pod {ns}/{name} to go away"), timeout, || {
        let api = api.clone();
        async move {
            Ok(match api.get_opt(name).await? {
                Some(p) if uid.is_none() || p.metadata.uid.as_deref() == uid => Check::Pending(
                    format!("still there, phase {:?}", p.status.and_then(|s| s.phase)),
                ),
                _ => Check::Done(()),
            })
        }
    })
    .await
}

pub async fn wait_deployment_ready(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<Deployment> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    wait_until(
        &format!("deployment {ns}/{name} to be ready"),
        timeout,
        || {
            let api = api.clone();
            async move {
                let d = api.get(name).await?;
                let want = d.spec.replicas.unwrap_or(1);
                let st = d.status.clone().unwrap_or_default();
                let observed = st.observed_generation >= d.metadata.generation;
                if observed
                    && st.ready_replicas.unwrap_or(0) == want
                    && st.updated_replicas.unwrap_or(0) == want
                    && st.replicas.unwrap_or(0) == want
                {
                    return Ok(Check::Done(d));
                }
                Ok(Check::Pending(format!("status {st:?}")))
            }
        },
    )
    .await
}

pub async fn wait_daemonset_ready(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<DaemonSet> {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    wait_until(
        &format!("daemonset {ns}/{name} to be ready"),
        timeout,
        || {
            let api = api.clone();
            async move {
                let ds = api.get(name).await?;
                let st = ds.status.clone().unwrap_or_default();
                let observed = st.observed_generation >= ds.metadata.generation;
                if observed
                    && st.desired_number_scheduled > 0
                    && st.number_ready == st.desired_number_scheduled
                    && st.current_number_scheduled == st.desired_number_scheduled
                {
                    return Ok(Check::Done(ds));
                }
                Ok(Check::Pending(format!("status {st:?}")))
            }
        },
    )
    .await
}

/// Waits until the disruption controller has observed the PDB's current generation and reports
/// `disruptionsAllowed == allowed`.
pub async fn wait_pdb_disruptions_allowed(
    client: &Client,
    ns: &str,
    name: &str,
    allowed: i32,
    timeout: Duration,
) -> Result<PodDisruptionBudget> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    wait_until(
        &format!("PodDisruptionBudget {ns}/{name} to allow {allowed} disruptions"),
        timeout,
        || {
            let api = api.clone();
            async move {
                let pdb = api.get(name).await?;
                let Some(st) = pdb.status.clone() else {
                    return Ok(Check::Pending("no status yet".into()));
                };
                if st.observed_generation >= pdb.metadata.generation
                    && st.disruptions_allowed == Some(allowed)
                {
                    return Ok(Check::Done(pdb));
                }
                Ok(Check::Pending(format!(
                    "disruptionsAllowed {:?} currentHealthy {:?} desiredHealthy {:?} expectedPods {:?}",
                    st.disruptions_allowed, st.current_healthy, st.desired_healthy, st.expected_pods
                )))
            }
        },
    )
    .await
}

/// A Deployment of `replicas` pods labelled `app=<app>` on `node` only, and a PDB with
/// minAvailable = replicas: every eviction is refused. Waits until the budget allows nothing.
pub async fn blocked_workload(
    client: &Client,
    ns: &str,
    app: &str,
    node: &str,
    replicas: i32,
    timeout: Duration,
) -> Result<Vec<Pod>> {
    let labels = [("app", app)];
    create_deployment(
        client,
        ns,
        app,
        replicas,
        &labels,
        &PodSpecOptions::on_node(node),
    )
    .await?;
    let pods = wait_pods_ready(
        client,
        ns,
        &selector_string(&labels),
        usize::try_from(replicas)?,
        timeout,
    )
    .await?;
    create_pdb_min_available(client, ns, app, &labels, IntOrString::Int(replicas)).await?;
    wait_pdb_disruptions_allowed(client, ns, app, 0, timeout)
        .await
        .context("precondition: the PodDisruptionBudget must allow no disruption")?;
    Ok(pods)
}

// ---------------------------------------------------------------------------------------------
// CRDs

/// Applies `crds/crds.yaml` with server-side apply and waits until every CRD is Established.
pub async fn apply_crds(client: &Client) -> Result<Vec<CustomResourceDefinition>> {
    let path = crds_path();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let value = serde_json::Value::deserialize(doc)
            .with_context(|| format!("parsing {}", path.display()))?;
        if value.is_null() {
            continue;
        }
        let crd: CustomResourceDefinition = serde_json::from_value(value)
            .with_context(|| format!("{} holds something else than a CRD", path.display()))?;
        let name = crd
            .metadata
            .name
            .clone()
            .ok_or_else(|| anyhow!("a CRD in {} has no name", path.display()))?;
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("applying CRD {name}"))?;
        names.push(name);
    }
    let mut crds = Vec::new();
    for name in names {
        let crd = wait_until(
            &format!("CRD {name} to be Established"),
            Duration::from_secs(60),
            || {
                let api = api.clone();
                let name = name.clone();
                async move {
                    let crd = api.get(&name).await?;
                    let conditions = crd
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.clone())
                        .unwrap_or_default();
                    if conditions
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                    {
                        return Ok(Check::Done(crd));
                    }
                    Ok(Check::Pending(format!("conditions {conditions:?}")))
                }
            },
        )
        .await?;
        crds.push(crd);
    }
    Ok(crds)
}

/// Creating `obj` must fail with 422 (the CRD schema or a CEL rule refused it) and a message
/// containing every one of `needles`.
pub async fn expect_invalid<K>(api: &Api<K>, obj: &K, needles: &[&str]) -> Result<()>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(created) => bail!("the API server accepted an invalid object: {created:?}"),
        Err(err) => match api_error(&err) {
            Some((422, message)) if needles.iter().all(|n| message.contains(n)) => Ok(()),
            _ => bail!("want 422 mentioning {needles:?}, got {err:?}"),
        },
    }
}

/// The HTTP status and message of an API error, if `err` is one.
pub fn api_error(err: &kube::Error) -> Option<(u16, &str)> {
    match err {
        kube::Error::Api(status) => Some((status.code, status.message.as_str())),
        _ => None,
    }
}
// ---------------------------------------------------------------------------------------------
// Test binaries with a `main` of their own (`harness = false`: bench_report, soak)

/// Runs `run` as the one test `name` of a `harness = false` test binary. `cargo test` passes the
/// libtest options and filters on to every test binary: `--list` is answered, and the test runs
/// only when no filter (or `--skip`) excludes it. Prints libtest's closing line.
pub fn run_as_test<F>(name: &str, run: impl FnOnce() -> F) -> std::process::ExitCode
where
    F: std::future::Future<Output = Result<()>>,
{
    use std::process::ExitCode;
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("{name}: test");
        return ExitCode::SUCCESS;
    }
    let mut filters = Vec::new();
    let mut skipped = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--skip" => skipped |= rest.next().is_some_and(|p| name.contains(p.as_str())),
            a if a.starts_with('-') => {}
            a => filters.push(a),
        }
    }
    if skipped || (!filters.is_empty() && !filters.iter().any(|f| name.contains(f))) {
        println!("{name}: 0 passed, 0 failed, 1 filtered out");
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => {
            println!("{name}: 1 passed, 0 failed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{name} failed: {e:#}");
            println!("{name}: 0 passed, 1 failed");
            ExitCode::FAILURE
        }
    }
}

/// Sets label `key=value` on `node` (a merge patch).
pub async fn add_node_label(client: &Client, node: &str, key: &str, value: &str) -> Result<()> {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": { key: value } } })),
        )
        .await
        .with_context(|| format!("labelling node {node} {key}={value}"))?;
    Ok(())
}

pub mod audit;
pub mod chart;
pub mod faults;
pub mod invariants;
pub mod operator;
pub mod policy;
