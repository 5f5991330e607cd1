//! Cluster-wide objects: namespaces, KWOK nodes, the CRDs, and the API server's errors.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, NodeSpec, NodeStatus, ServiceAccount, Taint};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde::Deserialize;

use crate::{Check, FIELD_MANAGER, crds_path, labels_map, wait_for, wait_until};

/// Annotation that makes the testbed's KWOK manage a node.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// Label set on every node made by [`create_nodes`], with the prefix as value.
pub const NODE_PREFIX_LABEL: &str = "testbed.maintenance.nvidia.com/prefix";

const UNREADY_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

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

impl NodeOptions {
    /// Nodes of `cpu` and `memory` (allocatable and capacity alike).
    pub fn sized(cpu: &str, memory: &str) -> NodeOptions {
        NodeOptions {
            cpu: cpu.into(),
            memory: memory.into(),
            ..NodeOptions::default()
        }
    }
}

/// Creates `count` KWOK nodes `<prefix>-0 .. <prefix>-<count-1>` with the given extra labels and
/// returns their names. Use a [`unique_name`](crate::unique_name) as prefix.
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

/// Sets label `key` of `node` to `value`, or removes it (`None`).
pub async fn set_node_label(
    client: &Client,
    node: &str,
    key: &str,
    value: Option<&str>,
) -> Result<()> {
    let patch = serde_json::json!({ "metadata": { "labels": { key: value } } });
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("labelling node {node} {key}={value:?}"))?;
    Ok(())
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

/// A namespace on the shared testbed, with the CRDs applied, for the tests of what the API server
/// accepts; returns a client and the namespace.
pub async fn crd_namespace(prefix: &str) -> Result<(Client, String)> {
    let client = crate::Testbed::shared().await?.client().await?;
    apply_crds(&client).await?;
    let ns = crate::unique_name(prefix);
    create_namespace(&client, &ns).await?;
    Ok((client, ns))
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
