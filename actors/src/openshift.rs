//! The OpenShift objects that MachineConfigPool pausing reads and writes, through kube's dynamic
//! API (there are no typed OpenShift objects in our clients). Only calls: what they mean is
//! decided in `maintenance_core::machine_config_pool`.

use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use maintenance_core::machine_config_pool::{
    self as mcp, Detection, Holder, PoolObservation, PoolView, Unresolved,
};
use maintenance_crds::NodeMaintenance;

use crate::context::is_not_found;
use serde_json::Value;

fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural)
}

/// `machineconfiguration.openshift.io/v1` MachineConfigPool (cluster-scoped).
pub fn pool_resource() -> ApiResource {
    resource(
        "machineconfiguration.openshift.io",
        "MachineConfigPool",
        "machineconfigpools",
    )
}

/// `machineconfiguration.openshift.io/v1` MachineConfig (cluster-scoped).
pub fn machine_config_resource() -> ApiResource {
    resource(
        "machineconfiguration.openshift.io",
        "MachineConfig",
        "machineconfigs",
    )
}

/// `config.openshift.io/v1` Infrastructure (cluster-scoped).
pub fn infrastructure_resource() -> ApiResource {
    resource("config.openshift.io", "Infrastructure", "infrastructures")
}

fn pools(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &pool_resource())
}

fn machine_configs(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &machine_config_resource())
}

/// `get_opt`, with any 404 read as absent: a cluster without the resource type answers 404 with a
/// plain-text body ("404 page not found"), which kube does not read as `NotFound`; left as an
/// error, the step would take it for a stale request and retry silently for ever.
async fn get_or_none(
    api: &Api<DynamicObject>,
    name: &str,
) -> Result<Option<DynamicObject>, kube::Error> {
    match api.get_opt(name).await {
        Err(err) if is_not_found(&err) => Ok(None),
        other => other,
    }
}

fn as_json(object: &DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or(Value::Null)
}

/// NVIDIA's `NewOpenshiftUtils` (internal/openshift/utils.go): the Infrastructure `cluster`. A
/// cluster without the resource type answers 404, as one without the object.
pub async fn detect(client: &kube::Client) -> Result<Detection, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &infrastructure_resource());
    let infrastructure = get_or_none(&api, mcp::INFRASTRUCTURE_NAME).await?;
    Ok(Detection::of(infrastructure.as_ref().map(as_json).as_ref()))
}

/// NVIDIA's `getMCPName` (internal/openshift/mcp.go), then the pool: the owner
/// MachineConfigPool of the MachineConfig the node's desiredConfig annotation names.
pub async fn observe_pool(
    client: &kube::Client,
    node: &k8s_openapi::api::core::v1::Node,
) -> Result<PoolObservation, kube::Error> {
    let Some(desired) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(mcp::DESIRED_CONFIG_ANNOTATION))
    else {
        return Ok(PoolObservation::Unresolved(Unresolved::NoDesiredConfig));
    };
    let Some(machine_config) = get_or_none(&machine_configs(client), desired).await? else {
        return Ok(PoolObservation::Unresolved(Unresolved::NoMachineConfig(
            desired.clone(),
        )));
    };
    let Some(name) = mcp::owner_pool(&as_json(&machine_config)) else {
        return Ok(PoolObservation::Unresolved(Unresolved::NoOwner(
            desired.clone(),
        )));
    };
    Ok(match read_pool(client, &name).await? {
        Some(view) => PoolObservation::Seen(view),
        None => PoolObservation::Unresolved(Unresolved::NoPool(name)),
    })
}

pub async fn read_pool(client: &kube::Client, name: &str) -> Result<Option<PoolView>, kube::Error> {
    Ok(get_or_none(&pools(client), name)
        .await?
        .map(|pool| PoolView::of(name, &as_json(&pool))))
}

/// Pauses (with our annotation) or unpauses (removing it) the pool, guarded by the version read.
pub async fn set_paused(
    client: &kube::Client,
    pool: &PoolView,
    pause: bool,
) -> Result<(), kube::Error> {
    pools(client)
        .patch(
            &pool.name,
            &PatchParams::default(),
            &Patch::Merge(&mcp::pause_patch(pool, pause)),
        )
        .await?;
    Ok(())
}

/// The requests labelled with the pool, read from the API server (not a cache: a request that
/// labelled itself a moment ago must count).
pub async fn holders(client: &kube::Client, pool: &str) -> Result<Vec<Holder>, kube::Error> {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let list = api
        .list_metadata(&ListParams::default().labels(&format!("{}={pool}", mcp::POOL_LABEL)))
        .await?;
    Ok(list
        .items
        .iter()
        .map(|meta| Holder::of(&meta.metadata))
        .collect())
}
