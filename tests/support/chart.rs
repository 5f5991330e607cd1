//! The Helm chart's files and the checked-in manifests rendered from it, as the tests install them
//! (tests/release/helm_chart.rs, tests/release/image.rs).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Testbed;

/// The tests that install the chart's cluster-wide objects on a shared testbed, and run an
/// operator with them, take turns.
pub async fn chart_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

/// The chart's objects installed on the shared testbed, for one test at a time (its turn lasts as
/// long as this value).
pub struct ChartOnTestbed {
    _turn: tokio::sync::MutexGuard<'static, ()>,
    pub testbed: &'static Testbed,
    pub client: kube::Client,
    /// Scratch files of the test (the manifests applied, kubeconfigs, logs).
    pub dir: tempfile::TempDir,
    /// The objects applied.
    pub docs: Vec<Value>,
}

/// Requests an earlier turn left (one whose drain the test blocked on purpose, say) would hold
/// the chart config's one slot under this turn's operator: each turn starts without any. Their
/// finalizers go first, as no operator of theirs runs any more; their cordons are undone by this
/// turn's operator (the cordon mark of a request that is gone).
async fn forget_requests_of_earlier_turns(client: &kube::Client) -> Result<()> {
    use kube::ResourceExt;
    use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
    use maintenance_crds::NodeMaintenance;
    let all: Api<NodeMaintenance> = Api::all(client.clone());
    let requests = match all.list(&ListParams::default()).await {
        Ok(list) => list.items,
        // The first turn: the CRDs are not installed yet, so there is nothing to forget.
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(err) => return Err(err).context("listing the requests of earlier turns"),
    };
    for request in requests {
        let ns = request.namespace().unwrap_or_default();
        let api: Api<NodeMaintenance> = Api::namespaced(client.clone(), &ns);
        let name = request.name_any();
        let clear = json!({ "metadata": { "finalizers": null } });
        let _ = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&clear))
            .await;
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(err) => {
                return Err(err)
                    .with_context(|| format!("deleting {ns}/{name} of an earlier turn"));
            }
        }
    }
    Ok(())
}

impl ChartOnTestbed {
    pub async fn install() -> Result<ChartOnTestbed> {
        let turn = chart_turn().await;
        let testbed = Testbed::shared().await?;
        let client = testbed.client().await?;
        forget_requests_of_earlier_turns(&client).await?;
        let dir = tempfile::tempdir()?;
        let docs = install_manifests(testbed, dir.path())?;
        Ok(ChartOnTestbed {
            _turn: turn,
            testbed,
            client,
            dir,
            docs,
        })
    }

    /// A kubeconfig whose only credential is a token of the chart's ServiceAccount.
    pub async fn service_account_kubeconfig(&self) -> Result<PathBuf> {
        let path = self.dir.path().join("chart-sa.kubeconfig");
        crate::operator::service_account_kubeconfig(
            self.testbed,
            crate::operator::OPERATOR_NAMESPACE,
            "maintenance-operator",
            &path,
        )
        .await?;
        Ok(path)
    }
}

pub fn repo() -> &'static Path {
    crate::repo_root()
}

pub fn chart_dir() -> PathBuf {
    repo().join("deploy/chart/maintenance-operator")
}

pub fn manifests_path() -> PathBuf {
    repo().join("deploy/manifests/maintenance-operator.yaml")
}

pub fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Runs a command to completion; fails with its output unless it succeeds.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.stdin(Stdio::null()).output();
    crate::stdout_of(cmd, out)
}

pub fn parse_docs(text: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_norway::Deserializer::from_str(text) {
        let value = Value::deserialize(doc).context("parsing rendered YAML")?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

pub fn kubectl(testbed: &Testbed) -> Command {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig").arg(testbed.kubeconfig_path());
    cmd
}

/// Installs the checked-in manifests the way deploy/README.md tells kubectl users to, with the
/// Deployment scaled to 0 (the testbed runs no images). Returns the objects applied.
pub fn install_manifests(testbed: &Testbed, dir: &Path) -> Result<Vec<Value>> {
    let mut docs = parse_docs(&read(&manifests_path())?)?;
    for doc in &mut docs {
        if doc["kind"] == "Deployment" {
            doc["spec"]["replicas"] = json!(0);
        }
    }
    let file = dir.join("maintenance-operator.yaml");
    let text: Vec<String> = docs
        .iter()
        .map(serde_norway::to_string)
        .collect::<Result<_, _>>()?;
    std::fs::write(&file, text.join("---\n"))?;

    let crds = chart_dir().join("crds/crds.yaml");
    run(kubectl(testbed)
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(&crds))?;
    run(kubectl(testbed)
        .args([
            "wait",
            "--for",
            "condition=established",
            "--timeout",
            "60s",
            "-f",
        ])
        .arg(&crds))?;
    run(kubectl(testbed)
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(&file))?;
    Ok(docs)
}

/// A namespace and two fresh nodes running a two-replica Deployment `web` (label `app=web`) with
/// a short grace period: the workload of a full maintenance. Returns the namespace and the node
/// of one of the pods.
pub async fn two_nodes_with_a_web_deployment(
    client: &kube::Client,
    prefix: &str,
) -> anyhow::Result<(String, String)> {
    use anyhow::Context as _;
    let ns = super::unique_name(prefix);
    super::create_namespace(client, &ns).await?;
    let node_prefix = super::unique_name(&format!("{prefix}node"));
    let nodes = super::create_nodes(client, &node_prefix, 2, &[]).await?;
    let two_minutes = std::time::Duration::from_secs(120);
    super::wait_nodes_ready(client, &nodes, two_minutes).await?;
    let pod = super::PodSpecOptions {
        termination_grace_period_seconds: Some(1),
        ..super::PodSpecOptions::on_nodes_with_prefix(&node_prefix)
    };
    super::create_app_deployment(client, &ns, "web", 2, &pod).await?;
    let pods = super::wait_pods_ready(client, &ns, "app=web", 2, two_minutes).await?;
    let node = super::pod_node(&pods[0])
        .context("pod without node")?
        .to_string();
    Ok((ns, node))
}
