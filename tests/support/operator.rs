//! The operator as a real process against a testbed, and helpers for NodeMaintenance objects.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::{Client, ResourceExt};
use maintenance_crds::{
    DrainSpec, MaintenanceOperatorConfig, MaintenanceOperatorConfigSpec, NodeMaintenance,
    NodeMaintenanceSpec, Phase,
};

use super::{Check, Testbed, wait_for, wait_until};

/// The namespace the operator runs in during tests (as the chart installs it).
pub const OPERATOR_NAMESPACE: &str = "maintenance-operator";

/// The Lease our replicas elect their leader with (the operator's default `--lease-name`).
pub const OUR_LEASE: &str = "maintenance-operator";

/// Who holds Lease `namespace/name` now; `None` when it is absent, or held by nobody.
pub async fn lease_holder(client: &Client, namespace: &str, name: &str) -> Result<Option<String>> {
    Ok(Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// The operator binary, running until dropped (or killed).
pub struct Operator {
    child: Option<Child>,
    pub metrics_port: u16,
    pub log: PathBuf,
    args: Vec<String>,
    kubeconfig: PathBuf,
    /// The command up to and including `run` (e.g. the image's entrypoint in a chroot); the
    /// operator binary of this build when `None`.
    launcher: Option<Vec<std::ffi::OsString>>,
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A kubeconfig of `service_account` (created if missing, bound to `cluster-admin`) in
/// [`OPERATOR_NAMESPACE`] of `testbed`.
async fn account_kubeconfig(testbed: &Testbed, service_account: &str) -> Result<PathBuf> {
    let client = testbed.client().await?;
    create_cluster_admin_service_account(&client, OPERATOR_NAMESPACE, service_account).await?;
    let kubeconfig = testbed
        .dir()
        .join(format!("operator-{service_account}.kubeconfig"));
    service_account_kubeconfig(testbed, OPERATOR_NAMESPACE, service_account, &kubeconfig).await?;
    Ok(kubeconfig)
}

impl Operator {
    /// Starts `maintenance-operator run` against `testbed`, with `extra` arguments, and waits
    /// until `/readyz` answers 200.
    pub async fn start(testbed: &Testbed, extra: &[&str]) -> Result<Operator> {
        Operator::start_with_kubeconfig(testbed.kubeconfig_path(), testbed.dir(), extra).await
    }

    /// Starts the operator (as [`Operator::start`]) with the credentials of a ServiceAccount of
    /// its own, `service_account` in [`OPERATOR_NAMESPACE`], bound to `cluster-admin`. The API
    /// server then knows this process by [`service_account_user`], so the audit log tells its
    /// calls apart from every other process's (the testbed's policy logs all their writes).
    pub async fn start_as(
        testbed: &Testbed,
        service_account: &str,
        extra: &[&str],
    ) -> Result<Operator> {
        let kubeconfig = account_kubeconfig(testbed, service_account).await?;
        Operator::start_with_kubeconfig(&kubeconfig, testbed.dir(), extra).await
    }

    /// [`Operator::start_as`] for another build: `launcher` as in [`Operator::start_launched`].
    pub async fn start_launched_as(
        testbed: &Testbed,
        service_account: &str,
        launcher: Vec<std::ffi::OsString>,
        extra: &[&str],
    ) -> Result<Operator> {
        let kubeconfig = account_kubeconfig(testbed, service_account).await?;
        Operator::start_launched(launcher, &kubeconfig, testbed.dir(), extra).await
    }

    pub async fn start_with_kubeconfig(
        kubeconfig: &Path,
        log_dir: &Path,
        extra: &[&str],
    ) -> Result<Operator> {
        Operator::launch(None, kubeconfig, log_dir, extra).await
    }

    /// Starts the operator with `launcher`: the program and its arguments up to and including
    /// `run` (the options of [`Operator::start`] and `extra` follow). The launcher decides where
    /// the process finds its credentials; KUBECONFIG is set to `kubeconfig` all the same.
    pub async fn start_launched(
        launcher: Vec<std::ffi::OsString>,
        kubeconfig: &Path,
        log_dir: &Path,
        extra: &[&str],
    ) -> Result<Operator> {
        Operator::launch(Some(launcher), kubeconfig, log_dir, extra).await
    }

    async fn launch(
        launcher: Option<Vec<std::ffi::OsString>>,
        kubeconfig: &Path,
        log_dir: &Path,
        extra: &[&str],
    ) -> Result<Operator> {
        let mut op = Operator {
            child: None,
            metrics_port: 0,
            log: log_dir.join(format!("operator-{}.log", super::unique_name("op"))),
            args: extra.iter().map(|s| s.to_string()).collect(),
            kubeconfig: kubeconfig.to_path_buf(),
            launcher,
        };
        op.spawn()?;
        op.wait_ready().await?;
        Ok(op)
    }

    fn spawn(&mut self) -> Result<()> {
        self.metrics_port = free_port()?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        // `MAINTENANCE_OPERATOR_BIN` runs another build (e.g. an older commit) against the tests.
        let binary = std::env::var_os("MAINTENANCE_OPERATOR_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_maintenance-operator").into());
        let mut command = match self.launcher.as_deref() {
            Some([program, args @ ..]) => {
                let mut command = Command::new(program);
                command.args(args);
                command
            }
            _ => {
                let mut command = Command::new(binary);
                command.arg("run");
                command
            }
        };
        // A fast safety-net tick unless the test sets its own (e.g. to show that something
        // other than the tick wakes the scheduler).
        if !self.args.iter().any(|a| a == "--tick-seconds") {
            command.args(["--tick-seconds", "2"]);
        }
        let child = command
            .arg("--namespace")
            .arg(OPERATOR_NAMESPACE)
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{}", self.metrics_port))
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info,maintenance_actors=trace,kube=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting the operator binary")?;
        stop_when_this_process_exits(child.id())?;
        self.child = Some(child);
        Ok(())
    }

    pub async fn wait_ready(&mut self) -> Result<()> {
        let url = format!("http://127.0.0.1:{}/readyz", self.metrics_port);
        let log = self.log.clone();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                bail!(
                    "the operator exited with {status} before becoming ready; log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if http_get(&url).await.is_ok_and(|(code, _)| code == 200) {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "the operator did not become ready in 60s; log: {}",
                    log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILL: no cleanup, as a crash or an OOM kill would do.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the same process again (after [`Operator::kill`]).
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()?;
        self.wait_ready().await
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub async fn metrics(&self) -> Result<String> {
        let (code, body) =
            http_get(&format!("http://127.0.0.1:{}/metrics", self.metrics_port)).await?;
        if code != 200 {
            bail!("/metrics answered {code}");
        }
        Ok(body)
    }

    /// The value of one sample (`name` with its labels as printed, e.g. `x{a="b"}`).
    pub async fn metric(&self, sample: &str) -> Result<f64> {
        let text = self.metrics().await?;
        metric_value(&text, sample).with_context(|| format!("no sample {sample} in /metrics"))
    }
}

pub fn metric_value(text: &str, sample: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == sample).then(|| value.parse().ok())?
    })
}

/// An operator kept in a static is never dropped, and would outlive the test binary: a small
/// watcher kills it once this process is gone (as the testbed's own watcher does for the control
/// plane).
fn stop_when_this_process_exits(pid: u32) -> Result<()> {
    Command::new("bash")
        .arg("-c")
        .arg(r#"while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 0.5; done; kill -9 "$2" 2>/dev/null; exit 0"#)
        .arg("operator-watcher")
        .arg(std::process::id().to_string())
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the watcher of the operator process")?;
    Ok(())
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills process `pid` once this test process is gone (for helpers a test starts next to the
/// operator, e.g. fault proxies).
pub fn kill_when_this_process_exits(pid: u32) -> Result<()> {
    stop_when_this_process_exits(pid)
}

impl Operator {
    /// How the process ended, if it has (it was not killed by [`Operator::kill`]).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }
}

/// A tiny HTTP/1.0 GET on loopback (no client crate needed for probes and metrics).
pub async fn http_get(url: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").context("only http:// URLs")?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(host))
            .await??;
    stream
        .write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("malformed HTTP answer")?;
    Ok((code, body.to_string()))
}

/// The user name the API server gives ServiceAccount `name` of [`OPERATOR_NAMESPACE`] (as the
/// audit log shows it).
pub fn service_account_user(name: &str) -> String {
    format!("system:serviceaccount:{OPERATOR_NAMESPACE}:{name}")
}

/// ServiceAccount `namespace/name`, allowed everything through a ClusterRoleBinding to
/// `cluster-admin`; both are left as they are when they exist already.
pub async fn create_cluster_admin_service_account(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<()> {
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    let binding_name = format!("{namespace}-{name}-cluster-admin");
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(binding_name.clone()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: "cluster-admin".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(namespace.into()),
            ..Subject::default()
        }]),
    };
    let already_there = |err: &kube::Error| super::api_error(err).is_some_and(|(c, _)| c == 409);
    match Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &account)
        .await
    {
        Err(err) if !already_there(&err) => {
            return Err(err).with_context(|| {
                format!(
                    "creating ServiceAccount {namespace}/{name} (does namespace {namespace} \
                     exist? `install` creates it)"
                )
            });
        }
        _ => {}
    }
    match Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
    {
        Err(err) if !already_there(&err) => {
            Err(err).with_context(|| format!("creating ClusterRoleBinding {binding_name}"))
        }
        _ => Ok(()),
    }
}

/// Writes to `path` a kubeconfig for the testbed whose only credential is a token of
/// ServiceAccount `namespace/name` (valid for an hour, longer than any test).
pub async fn service_account_kubeconfig(
    testbed: &Testbed,
    namespace: &str,
    name: &str,
    path: &Path,
) -> Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(testbed.client().await?, namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for ServiceAccount {namespace}/{name}"))?
        .status
        .context("TokenRequest without status")?
        .token;
    let admin = Kubeconfig::read_from(testbed.kubeconfig_path())
        .with_context(|| format!("reading {}", testbed.kubeconfig_path().display()))?;
    let cluster = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .context("the testbed kubeconfig names no cluster")?;
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testbed", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
        }}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "testbed", "user": name}}],
        "current-context": name,
    });
    std::fs::write(path, serde_norway::to_string(&config)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// CRDs, the operator namespace and (when given) the `default` config: what the chart installs.
pub async fn install(client: &Client, config: Option<MaintenanceOperatorConfigSpec>) -> Result<()> {
    super::apply_crds(client).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(OPERATOR_NAMESPACE).await?.is_none() {
        super::create_namespace(client, OPERATOR_NAMESPACE).await?;
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
        &PatchParams::apply(super::FIELD_MANAGER).force(),
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

pub fn request_spec(node: &str, requestor: &str) -> NodeMaintenanceSpec {
    NodeMaintenanceSpec {
        requestor_id: requestor.to_string(),
        node_name: node.to_string(),
        ..NodeMaintenanceSpec::default()
    }
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

/// Waits until the request shows `phase` (the reason of its Ready condition).
pub async fn wait_phase(
    client: &Client,
    ns: &str,
    name: &str,
    phase: Phase,
    timeout: Duration,
) -> Result<NodeMaintenance> {
    let what = format!("NodeMaintenance {ns}/{name} to reach {phase}");
    wait_for(&what, timeout, || async {
        Ok(get_request(client, ns, name)
            .await?
            // Pending must be written (not merely unseen); Scheduled may be the admission's alone.
            .filter(|nm| {
                nm.phase() == phase && (phase != Phase::Pending || nm.condition("Ready").is_some())
            }))
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

/// Waits until the operator has run at least `rounds` more scheduling rounds, so a test can say
/// "and nothing else was admitted" without sleeping.
pub async fn wait_scheduler_rounds(operator: &Operator, rounds: u32) -> Result<()> {
    let sample = "maintenance_operator_scheduler_runs_total";
    let start = operator.metric(sample).await?;
    wait_for(
        "the operator to run more scheduling rounds",
        Duration::from_secs(30),
        || async {
            Ok((operator.metric(sample).await? >= start + f64::from(rounds)).then_some(()))
        },
    )
    .await
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

/// One control plane and one operator per test binary, for tests that do not depend on the
/// cluster-wide limits (maxParallelOperations is effectively unlimited here).
pub struct SharedCluster {
    pub testbed: &'static Testbed,
    pub operator: Operator,
    /// The operator's identity in the audit log (a ServiceAccount of its own, so the audit log
    /// tells its calls from the tests').
    pub operator_user: String,
}

/// The ServiceAccount of the shared cluster's operator.
pub const SHARED_OPERATOR_ACCOUNT: &str = "shared-operator";

pub async fn shared_cluster() -> Result<&'static SharedCluster> {
    static SHARED: tokio::sync::OnceCell<SharedCluster> = tokio::sync::OnceCell::const_new();
    SHARED
        .get_or_try_init(|| async {
            let testbed = Testbed::shared().await?;
            let client = testbed.client().await?;
            install(&client, Some(limits(1000, None))).await?;
            let operator = Operator::start_as(testbed, SHARED_OPERATOR_ACCOUNT, &[]).await?;
            Ok(SharedCluster {
                testbed,
                operator,
                operator_user: service_account_user(SHARED_OPERATOR_ACCOUNT),
            })
        })
        .await
}

/// On the shared cluster: a namespace, `count` fresh Ready nodes, and a client of this test's
/// own runtime.
pub async fn isolated_setup(
    prefix: &str,
    count: usize,
    timeout: Duration,
) -> Result<(Client, String, Vec<String>)> {
    let shared = shared_cluster().await?;
    let client = shared.testbed.client().await?;
    let ns = super::unique_name(prefix);
    super::create_namespace(&client, &ns).await?;
    let nodes = super::create_nodes(&client, &super::unique_name(prefix), count, &[]).await?;
    super::wait_nodes_ready(&client, &nodes, timeout).await?;
    Ok((client, ns, nodes))
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

/// `maintenance-operator plan -o json` against the live cluster.
pub fn plan_json(testbed: &Testbed) -> Result<serde_json::Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_maintenance-operator"))
        .args(["plan", "-o", "json", "--namespace", OPERATOR_NAMESPACE])
        .env("KUBECONFIG", testbed.kubeconfig_path())
        .output()
        .context("running maintenance-operator plan")?;
    if !output.status.success() {
        bail!("plan failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    serde_json::from_slice(&output.stdout).context("plan -o json printed no JSON")
}

/// The message of a Pending request's `Ready` condition: why it waits.
pub fn pending_message(request: &NodeMaintenance) -> Option<&str> {
    (request.phase() == Phase::Pending)
        .then(|| request.condition("Ready").map(|c| c.message.as_str()))
        .flatten()
}
