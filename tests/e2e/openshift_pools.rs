//! OpenShift MachineConfigPool pausing, as NVIDIA's operator does it (`internal/openshift/mcp.go`,
//! `internal/openshift/utils.go` and the calls in `internal/controller/
//! nodemaintenance_controller.go` of github.com/Mellanox/maintenance-operator), on a control plane
//! of its own with minimal CRDs of `machineconfiguration.openshift.io/v1` (MachineConfigPool,
//! MachineConfig) and `config.openshift.io/v1` (Infrastructure): the config leaves
//! `openshift.machineConfigPools` unset (Auto), so the operator detects OpenShift from the
//! Infrastructure `cluster`.
//!
//! Checked on the cluster: the pool is paused (with our annotation) before any node of it is
//! cordoned (the API server's audit log orders the operator's writes); with two requests it stays
//! paused until the last ends, then is unpaused and the annotation removed; a pool paused by
//! someone else is left paused and the request waits with a message saying so, then proceeds once
//! they unpause; a configuring pool makes the request wait; a bad setting is refused.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use maintenance_actors::openshift::{
    infrastructure_resource, machine_config_resource, pool_resource,
};
use maintenance_core::machine_config_pool::{
    DESIRED_CONFIG_ANNOTATION, PAUSED_ANNOTATION, POOL_LABEL,
};
use maintenance_crds::{Admission, Phase, condition_type};
use serde_json::json;
use support::audit::AuditLog;
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(90);
const REQUESTOR: &str = "pools.example.com";
const ACCOUNT: &str = "pools-operator";
const POOL: &str = "worker";
const ROLE_LABEL: &str = "node-role.kubernetes.io/worker";

fn pools(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &pool_resource())
}

/// A cluster-scoped CRD that keeps whatever it is given; `status` as a subresource when asked
/// (a MachineConfigPool's status is one on OpenShift).
fn crd(group: &str, kind: &str, plural: &str, status: bool) -> Result<CustomResourceDefinition> {
    let mut version = json!({
        "name": "v1", "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
    });
    if status {
        version["subresources"] = json!({"status": {}});
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [version],
        },
    }))?)
}

async fn install_openshift_crds(client: &Client) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crds = [
        crd(
            "machineconfiguration.openshift.io",
            "MachineConfigPool",
            "machineconfigpools",
            true,
        )?,
        crd(
            "machineconfiguration.openshift.io",
            "MachineConfig",
            "machineconfigs",
            false,
        )?,
        crd(
            "config.openshift.io",
            "Infrastructure",
            "infrastructures",
            false,
        )?,
    ];
    for crd in &crds {
        api.create(&PostParams::default(), crd).await?;
    }
    for crd in &crds {
        let name = crd.name_any();
        wait_for(&format!("CRD {name} Established"), WAIT, || {
            let api = api.clone();
            let name = name.clone();
            async move {
                let crd = api.get(&name).await?;
                Ok(crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(()))
            }
        })
        .await?;
    }
    Ok(())
}

async fn create(
    client: &Client,
    resource: &ApiResource,
    object: serde_json::Value,
) -> Result<DynamicObject> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    let object: DynamicObject = serde_json::from_value(object)?;
    // A CRD just Established may not be served for a moment yet.
    wait_for("the object to be created", WAIT, || {
        let api = api.clone();
        let object = object.clone();
        async move { Ok(Some(api.create(&PostParams::default(), &object).await?)) }
    })
    .await
}

/// The pool as the test reads it: `spec.paused`, our annotation, the spec's and status's
/// configuration.
#[derive(Debug, PartialEq)]
struct Pool {
    paused: bool,
    ours: bool,
}

async fn pool(client: &Client) -> Result<Pool> {
    let pool = serde_json::to_value(pools(client).get(POOL).await?)?;
    Ok(Pool {
        paused: pool.pointer("/spec/paused").and_then(|v| v.as_bool()) == Some(true),
        ours: pool
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(PAUSED_ANNOTATION))
            .is_some(),
    })
}

async fn patch_pool(client: &Client, patch: serde_json::Value, status: bool) -> Result<()> {
    let params = PatchParams::default();
    if status {
        pools(client)
            .patch_status(POOL, &params, &Patch::Merge(&patch))
            .await?;
    } else {
        pools(client)
            .patch(POOL, &params, &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

async fn wait_pool(client: &Client, what: &str, want: Pool) -> Result<()> {
    wait_until(what, WAIT, || async {
        let now = pool(client).await?;
        Ok(if now == want {
            Check::Done(())
        } else {
            Check::Pending(format!("{now:?}"))
        })
    })
    .await
}

/// The request waits in Scheduled, its node not cordoned, with a message that says `why`.
async fn wait_for_pool(client: &Client, ns: &str, name: &str, node: &str, why: &str) -> Result<()> {
    wait_until(&format!("{name} waiting: {why}"), WAIT, || async {
        let request = get_request(client, ns, name)
            .await?
            .context("the request")?;
        let message = request
            .condition(condition_type::READY)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        Ok(
            if request.phase() == Phase::Scheduled && message.contains(why) {
                Check::Done(())
            } else {
                Check::Pending(format!("{} says {message:?}", request.phase()))
            },
        )
    })
    .await?;
    ensure!(
        !node_unschedulable(client, node).await?,
        "{node} was cordoned while its pool was busy"
    );
    Ok(())
}

async fn end(client: &Client, ns: &str, name: &str) -> Result<()> {
    delete_request(client, ns, name).await?;
    wait_request_gone(client, ns, name, WAIT).await
}

#[tokio::test]
async fn pools_are_paused_and_unpaused_as_nvidias_mcp_go_does() -> Result<()> {
    let mut config = limits(3, None);
    // No drain-pending taint: the operator's only node writes are its cordons and uncordons, so
    // the audit log orders them against the pool's pause.
    config.admission = Some(Admission {
        taint_waiting_nodes: Some(false),
        ..Admission::default()
    });
    let (testbed, client, ns, nodes) = own_cluster("pools", 3, Some(config)).await?;
    install_openshift_crds(&client).await?;

    // A bad setting is refused by the API server (the CRD's enum).
    let configs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), OPERATOR_NAMESPACE, &config_resource());
    let bad = configs
        .patch(
            "default",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"openshift": {"machineConfigPools": "Sometimes"}}})),
        )
        .await;
    ensure!(
        matches!(&bad, Err(kube::Error::Api(status)) if status.code == 422),
        "a bad machineConfigPools was not refused: {bad:?}"
    );

    // OpenShift as the operator detects it (NVIDIA's `NewOpenshiftUtils`), a pool `worker` of the
    // three nodes, and the rendered config they run, owned by the pool.
    create(
        &client,
        &infrastructure_resource(),
        json!({"apiVersion": "config.openshift.io/v1", "kind": "Infrastructure",
               "metadata": {"name": "cluster"},
               "status": {"controlPlaneTopology": "HighlyAvailable"}}),
    )
    .await?;
    let pool_object = create(
        &client,
        &pool_resource(),
        json!({"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
               "metadata": {"name": POOL},
               "spec": {"paused": false,
                        "nodeSelector": {"matchLabels": {ROLE_LABEL: ""}},
                        "configuration": {"name": "rendered-worker-1"}}}),
    )
    .await?;
    patch_pool(
        &client,
        json!({"status": {"configuration": {"name": "rendered-worker-1"}}}),
        true,
    )
    .await?;
    create(
        &client,
        &machine_config_resource(),
        json!({"apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
               "metadata": {"name": "rendered-worker-1", "ownerReferences": [{
                   "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfigPool",
                   "name": POOL, "uid": pool_object.uid().context("the pool's uid")?,
                   "controller": true}]},
               "spec": {}}),
    )
    .await?;
    let node_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for node in &nodes {
        set_node_label(&client, node, ROLE_LABEL, Some("")).await?;
        node_api
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {DESIRED_CONFIG_ANNOTATION: "rendered-worker-1"}}})),
            )
            .await?;
    }
    let _operator = Operator::start_as(&testbed, ACCOUNT, &[]).await?;

    // Two requests of the pool: paused before either node is cordoned, and until the last ends.
    for (name, node) in [("first", &nodes[0]), ("second", &nodes[1])] {
        create_request(&client, &ns, name, request_spec(node, REQUESTOR)).await?;
    }
    for name in ["first", "second"] {
        let ready = wait_phase(&client, &ns, name, Phase::Ready, WAIT).await?;
        ensure!(
            ready.labels().get(POOL_LABEL).map(String::as_str) == Some(POOL),
            "{name} is not labelled with its pool: {:?}",
            ready.labels()
        );
    }
    ensure!(
        node_unschedulable(&client, &nodes[0]).await?
            && node_unschedulable(&client, &nodes[1]).await?
    );
    ensure!(
        pool(&client).await?
            == Pool {
                paused: true,
                ours: true
            }
    );
    let audit = AuditLog::read(&testbed)?;
    let writes = audit.writes_by(&service_account_user(ACCOUNT));
    let pause = writes
        .iter()
        .position(|w| w.resource == "machineconfigpools" && w.name == POOL && w.code < 300)
        .context("no pause of the pool in the audit log")?;
    for node in &nodes[..2] {
        let cordon = writes
            .iter()
            .position(|w| w.resource == "nodes" && w.name == *node)
            .with_context(|| format!("no cordon of {node} in the audit log"))?;
        ensure!(
            pause < cordon,
            "{node} was cordoned before the pool was paused:\n{}",
            support::audit::describe_writes(&writes)
        );
    }
    end(&client, &ns, "first").await?;
    ensure!(
        pool(&client).await?
            == Pool {
                paused: true,
                ours: true
            },
        "the pool was unpaused while `second` still holds it"
    );
    end(&client, &ns, "second").await?;
    wait_pool(
        &client,
        "the pool unpaused once its last request ended",
        Pool {
            paused: false,
            ours: false,
        },
    )
    .await?;

    // Paused by someone else: left paused, the request waits and says so, then goes on once they
    // unpause.
    patch_pool(&client, json!({"spec": {"paused": true}}), false).await?;
    create_request(&client, &ns, "third", request_spec(&nodes[2], REQUESTOR)).await?;
    wait_for_pool(
        &client,
        &ns,
        "third",
        &nodes[2],
        "MachineConfigPool worker is paused by someone else",
    )
    .await?;
    ensure!(
        pool(&client).await?
            == Pool {
                paused: true,
                ours: false
            }
    );
    patch_pool(&client, json!({"spec": {"paused": false}}), false).await?;
    // Retried within its bounded wake-up (10 s), not at the next event.
    wait_phase(&client, &ns, "third", Phase::Ready, WAIT).await?;
    ensure!(
        pool(&client).await?
            == Pool {
                paused: true,
                ours: true
            }
    );
    end(&client, &ns, "third").await?;
    wait_pool(
        &client,
        "the pool unpaused after `third`",
        Pool {
            paused: false,
            ours: false,
        },
    )
    .await?;

    // A request that ends while someone else's pause holds it leaves that pause alone.
    patch_pool(&client, json!({"spec": {"paused": true}}), false).await?;
    create_request(&client, &ns, "fourth", request_spec(&nodes[0], REQUESTOR)).await?;
    wait_for_pool(&client, &ns, "fourth", &nodes[0], "paused by someone else").await?;
    end(&client, &ns, "fourth").await?;
    ensure!(
        pool(&client).await?
            == Pool {
                paused: true,
                ours: false
            },
        "someone else's pause was undone"
    );
    patch_pool(&client, json!({"spec": {"paused": false}}), false).await?;

    // Configuring (spec and status name different rendered configs): the request waits, then goes
    // on once the pool is done.
    patch_pool(
        &client,
        json!({"spec": {"configuration": {"name": "rendered-worker-2"}}}),
        false,
    )
    .await?;
    create_request(&client, &ns, "fifth", request_spec(&nodes[1], REQUESTOR)).await?;
    wait_for_pool(
        &client,
        &ns,
        "fifth",
        &nodes[1],
        "MachineConfigPool worker is in the middle of a configuration change (from rendered-worker-1 to rendered-worker-2)",
    )
    .await?;
    ensure!(
        pool(&client).await?
            == Pool {
                paused: false,
                ours: false
            }
    );
    patch_pool(
        &client,
        json!({"status": {"configuration": {"name": "rendered-worker-2"}}}),
        true,
    )
    .await?;
    wait_phase(&client, &ns, "fifth", Phase::Ready, WAIT).await?;
    ensure!(
        pool(&client).await?
            == Pool {
                paused: true,
                ours: true
            }
    );
    ensure!(node_unschedulable(&client, &nodes[1]).await?);
    end(&client, &ns, "fifth").await?;
    wait_pool(
        &client,
        "the pool unpaused after `fifth`",
        Pool {
            paused: false,
            ours: false,
        },
    )
    .await?;
    ensure!(
        !node_unschedulable(&client, &nodes[1]).await?,
        "not uncordoned"
    );
    Ok(())
}
