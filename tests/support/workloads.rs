//! Pods, Deployments, DaemonSets and PodDisruptionBudgets on KWOK nodes, and waits on them.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, Deployment, DeploymentSpec, DeploymentStrategy,
    RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, Pod, PodSpec, PodTemplateSpec, ResourceRequirements,
    Toleration, TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};

use crate::{Check, NODE_PREFIX_LABEL, labels_map, selector_string, wait_until};

/// Image for every container: KWOK runs nothing, so it is never pulled.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// Grace period of pods made here unless told otherwise: long enough to see pods terminate,
/// short enough to keep tests fast. KWOK removes a terminating pod when its grace period ends.
pub const DEFAULT_GRACE_SECONDS: i64 = 1;

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

    /// The same, with resource requests of `cpu` and `memory`.
    pub fn requesting(self, cpu: &str, memory: &str) -> Self {
        let requests = [("cpu", cpu), ("memory", memory)];
        PodSpecOptions {
            requests: requests.map(|(k, v)| (k.to_string(), v.to_string())).into(),
            ..self
        }
    }

    /// Pods go to nodes made by [`create_nodes`](crate::create_nodes) with this prefix.
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

/// Metadata of object `ns/name`.
pub fn object_meta(ns: &str, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(ns.to_string()),
        ..Default::default()
    }
}

/// Selects what carries every one of `labels`.
pub fn label_selector(labels: &BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels.clone()),
        ..Default::default()
    }
}

/// Creates `object` in its namespace; an error names it.
pub async fn create_object<K>(client: &Client, object: &K) -> Result<K>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let ns = object.meta().namespace.clone().unwrap_or_default();
    let name = object.meta().name.clone().unwrap_or_default();
    Api::<K>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), object)
        .await
        .with_context(|| format!("creating {} {ns}/{name}", K::kind(&())))
}

/// A Deployment whose pods carry `labels` (also its selector).
pub fn deployment_object(
    ns: &str,
    name: &str,
    replicas: i32,
    labels: &[(&str, &str)],
    pod: &PodSpecOptions,
) -> Deployment {
    let labels = labels_map(labels);
    Deployment {
        metadata: ObjectMeta {
            labels: Some(labels.clone()),
            ..object_meta(ns, name)
        },
        spec: DeploymentSpec {
            replicas: Some(replicas),
            selector: label_selector(&labels),
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment::default()),
            }),
            template: template(&labels, pod),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Creates a [`deployment_object`].
pub async fn create_deployment(
    client: &Client,
    ns: &str,
    name: &str,
    replicas: i32,
    labels: &[(&str, &str)],
    pod: &PodSpecOptions,
) -> Result<Deployment> {
    create_object(client, &deployment_object(ns, name, replicas, labels, pod)).await
}

/// A Deployment `app` whose pods carry the label `app=<app>`.
pub async fn create_app_deployment(
    client: &Client,
    ns: &str,
    app: &str,
    replicas: i32,
    pod: &PodSpecOptions,
) -> Result<Deployment> {
    create_deployment(client, ns, app, replicas, &[("app", app)], pod).await
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
            labels: Some(labels.clone()),
            ..object_meta(ns, name)
        },
        spec: DaemonSetSpec {
            selector: label_selector(&labels),
            template: template(&labels, pod),
            ..Default::default()
        },
        ..Default::default()
    };
    create_object(client, &ds).await
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
        metadata: object_meta(ns, name),
        spec: Some(PodDisruptionBudgetSpec {
            selector: Some(label_selector(&labels_map(match_labels))),
            min_available,
            max_unavailable,
            ..Default::default()
        }),
        ..Default::default()
    };
    create_object(client, &pdb).await
}

/// A PodDisruptionBudget `app` over the pods labelled `app=<app>`, with `minAvailable`.
pub async fn create_app_pdb(
    client: &Client,
    ns: &str,
    app: &str,
    min_available: i32,
) -> Result<PodDisruptionBudget> {
    let min_available = IntOrString::Int(min_available);
    create_pdb_min_available(client, ns, app, &[("app", app)], min_available).await
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
            labels: (!opts.labels.is_empty()).then(|| opts.labels.clone()),
            annotations: (!opts.annotations.is_empty()).then(|| opts.annotations.clone()),
            owner_references: opts.owner.clone().map(|o| vec![o]),
            finalizers: (!opts.finalizers.is_empty()).then(|| opts.finalizers.clone()),
            ..object_meta(ns, name)
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
    create_object(client, &pod)
        .await
        .with_context(|| format!("on node {node_name}"))
}

/// Spreads the pods labelled `app=<app>` one per node (among the nodes their nodeSelector allows).
pub fn one_per_node(app: &str) -> TopologySpreadConstraint {
    TopologySpreadConstraint {
        max_skew: 1,
        topology_key: "kubernetes.io/hostname".into(),
        when_unsatisfiable: "DoNotSchedule".into(),
        label_selector: Some(label_selector(&labels_map(&[("app", app)]))),
        ..Default::default()
    }
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

/// The pods of `ns` bound to `node`, terminating ones included.
pub async fn pods_on_node(client: &Client, ns: &str, node: &str) -> Result<Vec<Pod>> {
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    Ok(Api::<Pod>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .with_context(|| format!("listing the pods of {ns} on {node}"))?
        .items)
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

/// Waits until `ready` says nothing is missing from object `name` of `api` (`Some(what)`: what
/// is, for the timeout error).
async fn wait_object<K>(
    api: Api<K>,
    name: &str,
    what: String,
    timeout: Duration,
    ready: impl Fn(&K) -> Option<String>,
) -> Result<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let ready = &ready;
    wait_until(&what, timeout, || {
        let api = api.clone();
        async move {
            let object = api.get(name).await?;
            Ok(match ready(&object) {
                None => Check::Done(object),
                Some(seen) => Check::Pending(seen),
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
    let what = format!("deployment {ns}/{name} to be ready");
    wait_object(
        Api::namespaced(client.clone(), ns),
        name,
        what,
        timeout,
        |d: &Deployment| {
            let want = d.spec.replicas.unwrap_or(1);
            let st = d.status.clone().unwrap_or_default();
            let ready = st.observed_generation >= d.metadata.generation
                && [st.ready_replicas, st.updated_replicas, st.replicas]
                    .iter()
                    .all(|n| n.unwrap_or(0) == want);
            (!ready).then(|| format!("status {st:?}"))
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
    let what = format!("daemonset {ns}/{name} to be ready");
    wait_object(
        Api::namespaced(client.clone(), ns),
        name,
        what,
        timeout,
        |ds: &DaemonSet| {
            let st = ds.status.clone().unwrap_or_default();
            let want = st.desired_number_scheduled;
            let ready = st.observed_generation >= ds.metadata.generation
                && want > 0
                && st.number_ready == want
                && st.current_number_scheduled == want;
            (!ready).then(|| format!("status {st:?}"))
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
    let what = format!("PodDisruptionBudget {ns}/{name} to allow {allowed} disruptions");
    let api = Api::namespaced(client.clone(), ns);
    wait_object(api, name, what, timeout, |pdb: &PodDisruptionBudget| {
        let Some(st) = pdb.status.as_ref() else {
            return Some("no status yet".into());
        };
        let ready = st.observed_generation >= pdb.metadata.generation
            && st.disruptions_allowed == Some(allowed);
        (!ready).then(|| {
            format!(
                "disruptionsAllowed {:?} currentHealthy {:?} desiredHealthy {:?} expectedPods {:?}",
                st.disruptions_allowed, st.current_healthy, st.desired_healthy, st.expected_pods
            )
        })
    })
    .await
}

/// Waits until the `count` PodDisruptionBudgets of `ns` count all `replicas` pods of their
/// workload healthy and allow `min_allowed` disruptions or more, as the disruption controller
/// reported for their current generation; `progress` hears how many are not there yet.
pub async fn wait_pdbs_settled(
    client: &Client,
    ns: &str,
    (count, replicas, min_allowed): (usize, i32, i32),
    timeout: Duration,
    progress: impl Fn(String),
) -> Result<()> {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let progress = &progress;
    wait_until(
        "every PDB to count all its pods healthy",
        timeout,
        || async {
            let list = pdbs.list(&ListParams::default()).await?.items;
            let unsettled: Vec<&str> = list
                .iter()
                .filter(|p| {
                    p.status.as_ref().is_none_or(|s| {
                        s.observed_generation < p.metadata.generation
                            || s.current_healthy != Some(replicas)
                            || s.expected_pods != Some(replicas)
                            || s.disruptions_allowed.unwrap_or(0) < min_allowed
                    })
                })
                .filter_map(|p| p.metadata.name.as_deref())
                .collect();
            progress(format!(
                "{} of {} PDBs not settled",
                unsettled.len(),
                list.len()
            ));
            Ok(if list.len() == count && unsettled.is_empty() {
                Check::Done(())
            } else {
                let first: Vec<&&str> = unsettled.iter().take(10).collect();
                Check::Pending(format!("{} PDBs, unsettled {first:?}...", list.len()))
            })
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
