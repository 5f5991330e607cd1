//! NodeMaintenance requests and the operator's config, as a requestor and an admin write them.

use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, ApiResource, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use maintenance_crds::{
    Admission, DrainSpec, MaintenanceOperatorConfig, MaintenanceOperatorConfigSpec,
    NodeMaintenance, NodeMaintenanceSpec, Phase,
};

use crate::operator::OPERATOR_NAMESPACE;
use crate::{Check, FIELD_MANAGER, wait_for, wait_until};

/// CRDs, the operator namespace and (when given) the `default` config: what the chart installs.
pub async fn install(client: &Client, config: Option<MaintenanceOperatorConfigSpec>) -> Result<()> {
    crate::apply_crds(client).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(OPERATOR_NAMESPACE).await?.is_none()
        && let Err(err) = crate::create_namespace(client, OPERATOR_NAMESPACE).await
    {
        // Tests sharing a control plane may both find it missing; the one whose create comes
        // second gets 409 AlreadyExists, and the namespace is there all the same.
        let lost_the_race = matches!(
            err.downcast_ref::<kube::Error>(),
            Some(kube::Error::Api(status)) if status.code == 409
        );
        if !lost_the_race {
            return Err(err);
        }
    }
    if let Some(spec) = config {
        set_config(client, spec).await?;
    }
    Ok(())
}

/// Creates or replaces the `default` MaintenanceOperatorConfig.
pub async fn set_config(client: &Client, spec: MaintenanceOperatorConfigSpec) -> Result<()> {
    let api: Api<MaintenanceOperatorConfig> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let config = MaintenanceOperatorConfig {
        metadata: ObjectMeta {
            name: Some("default".into()),
            namespace: Some(OPERATOR_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    };
    api.patch(
        "default",
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&config),
    )
    .await
    .context("applying the default MaintenanceOperatorConfig")?;
    Ok(())
}

pub fn limits(
    max_parallel: impl Into<Option<i32>>,
    max_unavailable: impl Into<Option<i32>>,
) -> MaintenanceOperatorConfigSpec {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    MaintenanceOperatorConfigSpec {
        max_parallel_operations: max_parallel.into().map(IntOrString::Int),
        max_unavailable: max_unavailable.into().map(IntOrString::Int),
        ..MaintenanceOperatorConfigSpec::default()
    }
}

/// The API resource of NodeMaintenance, for objects sent and read as raw JSON (`DynamicObject`).
pub fn request_resource() -> ApiResource {
    ApiResource::erase::<NodeMaintenance>(&())
}

/// The API resource of MaintenanceOperatorConfig, as [`request_resource`].
pub fn config_resource() -> ApiResource {
    ApiResource::erase::<MaintenanceOperatorConfig>(&())
}

/// Creates, in `ns`, one MaintenanceOperatorConfig per case, named after it, with the case's
/// spec (raw JSON, so that the API server's schema judges it): a case without needles must be
/// accepted, one with needles refused with a message that contains each.
pub async fn check_config_cases(
    client: &Client,
    ns: &str,
    cases: Vec<(&str, serde_json::Value, Option<&[&str]>)>,
) -> Result<()> {
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &config_resource());
    for (name, spec, expected) in cases {
        let object: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "maintenance.nvidia.com/v1alpha1",
            "kind": "MaintenanceOperatorConfig",
            "metadata": {"name": name},
            "spec": spec,
        }))?;
        let result = api.create(&PostParams::default(), &object).await;
        match (expected, result) {
            (None, Ok(_)) => {}
            (None, Err(err)) => anyhow::bail!("{name}: refused: {err}"),
            (Some(needles), Ok(_)) => anyhow::bail!("{name}: accepted, want {needles:?}"),
            (Some(needles), Err(err)) => {
                let message = err.to_string();
                for needle in needles {
                    anyhow::ensure!(
                        message.contains(needle),
                        "{name}: {message:?} lacks {needle:?}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// `maxParallelOperations` and the admission options `set` sets, nothing else.
pub fn with_admission(
    max_parallel: i32,
    set: impl FnOnce(&mut Admission),
) -> MaintenanceOperatorConfigSpec {
    let mut admission = Admission::default();
    set(&mut admission);
    MaintenanceOperatorConfigSpec {
        admission: Some(admission),
        ..limits(max_parallel, None)
    }
}

pub fn request_spec(node: &str, requestor: &str) -> NodeMaintenanceSpec {
    NodeMaintenanceSpec {
        requestor_id: requestor.to_string(),
        node_name: node.to_string(),
        ..NodeMaintenanceSpec::default()
    }
}

/// Creates request `name` for `node` by `requestor`, with nothing else set.
pub async fn request_node(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    requestor: &str,
) -> Result<NodeMaintenance> {
    create_request(client, ns, name, request_spec(node, requestor)).await
}

pub fn drain_spec(force: bool, timeout_seconds: i32) -> Option<DrainSpec> {
    Some(DrainSpec {
        force: Some(force),
        timeout_seconds: Some(timeout_seconds),
        ..DrainSpec::default()
    })
}

pub async fn create_request(
    client: &Client,
    ns: &str,
    name: &str,
    spec: NodeMaintenanceSpec,
) -> Result<NodeMaintenance> {
    let api: Api<NodeMaintenance> = Api::namespaced(client.clone(), ns);
    let nm = NodeMaintenance::new(name, spec);
    api.create(&PostParams::default(), &nm)
        .await
        .with_context(|| format!("creating NodeMaintenance {ns}/{name}"))
}

pub async fn get_request(client: &Client, ns: &str, name: &str) -> Result<Option<NodeMaintenance>> {
    Ok(Api::<NodeMaintenance>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?)
}

pub async fn list_requests(client: &Client, ns: &str) -> Result<Vec<NodeMaintenance>> {
    Ok(Api::<NodeMaintenance>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await?
        .items)
}

pub async fn delete_request(client: &Client, ns: &str, name: &str) -> Result<()> {
    Api::<NodeMaintenance>::namespaced(client.clone(), ns)
        .delete(name, &Default::default())
        .await
        .with_context(|| format!("deleting NodeMaintenance {ns}/{name}"))?;
    Ok(())
}

/// A JSON merge patch of request `name`.
pub async fn patch_request(
    client: &Client,
    ns: &str,
    name: &str,
    patch: serde_json::Value,
) -> Result<NodeMaintenance> {
    Api::<NodeMaintenance>::namespaced(client.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("patching NodeMaintenance {ns}/{name} with {patch}"))
}

/// Request `name`, which must exist and show `phase` now; `why` says what it means otherwise.
pub async fn ensure_phase(
    client: &Client,
    ns: &str,
    name: &str,
    phase: Phase,
    why: &str,
) -> Result<NodeMaintenance> {
    let request = get_request(client, ns, name)
        .await?
        .with_context(|| format!("NodeMaintenance {ns}/{name} is gone"))?;
    anyhow::ensure!(request.phase() == phase, "{why}: {}", describe(&request));
    Ok(request)
}

/// Plays the requestor done with its maintenance: deletes request `name` and waits until it is
/// gone (the operator has let go of the node).
pub async fn release_request(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<()> {
    delete_request(client, ns, name).await?;
    wait_request_gone(client, ns, name, timeout).await
}

/// Waits until the request shows `phase` (the reason of its Ready condition).
pub async fn wait_phase(
    client: &Client,
    ns: &str,
    name: &str,
    phase: Phase,
    timeout: Duration,
) -> Result<NodeMaintenance> {
    // Pending must be written (not merely unseen); Scheduled may be the admission's alone.
    wait_request(client, ns, name, &format!("reach {phase}"), timeout, |nm| {
        nm.phase() == phase && (phase != Phase::Pending || nm.condition("Ready").is_some())
    })
    .await
}

pub async fn wait_request_gone(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<()> {
    let what = format!("NodeMaintenance {ns}/{name} to be deleted");
    wait_for(&what, timeout, || async {
        Ok(get_request(client, ns, name).await?.is_none().then_some(()))
    })
    .await
}

pub async fn node_unschedulable(client: &Client, node: &str) -> Result<bool> {
    let node: Node = Api::<Node>::all(client.clone()).get(node).await?;
    Ok(node.spec.and_then(|s| s.unschedulable).unwrap_or(false))
}

/// Requests of `ns` past Pending (admitted at some point and not yet gone).
pub fn past_pending(requests: &[NodeMaintenance]) -> Vec<String> {
    let mut names: Vec<String> = requests
        .iter()
        .filter(|r| r.phase() != Phase::Pending)
        .map(|r| r.name_any())
        .collect();
    names.sort();
    names
}

/// Plays the requestor: deletes each request of `ns` once it is Ready, until none is left.
pub async fn release_all_when_ready(client: &Client, ns: &str, timeout: Duration) -> Result<()> {
    wait_for("every request to finish", timeout, || async {
        let all = list_requests(client, ns).await?;
        for r in &all {
            if r.phase() == Phase::Ready && !r.is_deleting() {
                delete_request(client, ns, &r.name_any()).await?;
            }
        }
        Ok(all.is_empty().then_some(()))
    })
    .await
}

/// Watches the requests of `ns` and records the most nodes ever in maintenance (past Pending) at
/// once, as the API server showed them. Abort the task when done.
pub fn track_max_in_maintenance(
    client: Client,
    ns: String,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tokio::task::JoinHandle<()>,
) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let max = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = max.clone();
    let task = tokio::spawn(async move {
        let api: Api<NodeMaintenance> = Api::namespaced(client, &ns);
        let (reader, writer) = kube::runtime::reflector::store();
        let stream = kube::runtime::reflector(writer, watcher(api, watcher::Config::default()))
            .touched_objects();
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {
            let nodes: std::collections::HashSet<String> = reader
                .state()
                .iter()
                .filter(|r| r.phase() != Phase::Pending)
                .map(|r| r.spec.node_name.clone())
                .collect();
            seen.fetch_max(nodes.len(), std::sync::atomic::Ordering::SeqCst);
        }
    });
    (max, task)
}

/// Phase, conditions, deletion and finalizers: what a timeout error should show.
pub fn describe(r: &NodeMaintenance) -> String {
    let conditions: Vec<String> = r
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .map(|c| format!("{}={} {} {:?}", c.type_, c.status, c.reason, c.message))
        .collect();
    format!(
        "phase {}, conditions [{}], deleting {}, finalizers {:?}",
        r.phase(),
        conditions.join("; "),
        r.is_deleting(),
        r.finalizers()
    )
}

/// Waits until the request exists and `done` holds for it.
pub async fn wait_request(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    timeout: Duration,
    done: impl Fn(&NodeMaintenance) -> bool,
) -> Result<NodeMaintenance> {
    let done = &done;
    wait_until(
        &format!("NodeMaintenance {ns}/{name}: {what}"),
        timeout,
        || async move {
            Ok(match get_request(client, ns, name).await? {
                Some(r) if done(&r) => Check::Done(r),
                Some(r) => Check::Pending(describe(&r)),
                None => Check::Pending("the request is gone".into()),
            })
        },
    )
    .await
}

/// The message of a Pending request's `Ready` condition: why it waits.
pub fn pending_message(request: &NodeMaintenance) -> Option<&str> {
    (request.phase() == Phase::Pending)
        .then(|| request.condition("Ready").map(|c| c.message.as_str()))
        .flatten()
}
