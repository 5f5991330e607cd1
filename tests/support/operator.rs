//! The operator as a real process against a testbed, and helpers for NodeMaintenance objects.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::Kubeconfig;
use maintenance_crds::MaintenanceOperatorConfigSpec;

use crate::{Testbed, install, limits, wait_for};

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

/// Waits until `holder` holds our Lease.
pub async fn wait_holder(client: &Client, holder: &str, timeout: Duration) -> Result<()> {
    crate::wait_until(&format!("{holder} to hold the Lease"), timeout, || async {
        Ok(
            match lease_holder(client, OPERATOR_NAMESPACE, OUR_LEASE).await? {
                Some(h) if h == holder => crate::Check::Done(()),
                other => crate::Check::Pending(format!("holder {other:?}")),
            },
        )
    })
    .await
}

/// The operator binary, running until dropped (or killed).
pub struct Operator {
    child: Option<Child>,
    /// `/metrics`: plain HTTP unless the test passes `--metrics-insecure=false`.
    pub metrics_port: u16,
    /// `/healthz` and `/readyz`.
    pub health_port: u16,
    pub log: PathBuf,
    args: Vec<String>,
    kubeconfig: PathBuf,
    /// The command up to and including `run` (e.g. the image's entrypoint in a chroot); the
    /// operator binary of this build when `None`.
    launcher: Option<Vec<std::ffi::OsString>>,
}

/// How many times an operator is started on new ports when one was taken meanwhile.
const PORT_ATTEMPTS: u32 = 3;

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
            health_port: 0,
            log: log_dir.join(format!("operator-{}.log", crate::unique_name("op"))),
            args: extra.iter().map(|s| s.to_string()).collect(),
            kubeconfig: kubeconfig.to_path_buf(),
            launcher,
        };
        op.spawn_until_ready().await?;
        Ok(op)
    }

    /// Spawns the process and waits until it is ready. A port [`free_port`] found free may be
    /// taken by another process before the operator binds it (the API servers and operators of
    /// other tests pick ports too): the operator then exits at once saying so, and is started
    /// again on new ports, at most [`PORT_ATTEMPTS`] times.
    async fn spawn_until_ready(&mut self) -> Result<()> {
        let mut attempt = 1;
        loop {
            self.spawn()?;
            match self.wait_ready().await {
                Err(err)
                    if attempt < PORT_ATTEMPTS
                        && self
                            .child
                            .as_mut()
                            .is_some_and(|c| c.try_wait().is_ok_and(|s| s.is_some()))
                        && err.to_string().contains("Address already in use") =>
                {
                    eprintln!(
                        "operator port taken meanwhile (attempt {attempt}); starting it on new ports"
                    );
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn spawn(&mut self) -> Result<()> {
        self.metrics_port = free_port()?;
        self.health_port = free_port()?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        // `MAINTENANCE_OPERATOR_BIN` runs another build (e.g. an older commit) against the tests.
        let binary = std::env::var_os("MAINTENANCE_OPERATOR_BIN")
            .unwrap_or_else(|| crate::built_binary("maintenance-operator").into_os_string());
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
        // Plain /metrics for the tests' scrapes unless the test asks for the secure one.
        if !self
            .args
            .iter()
            .any(|a| a.starts_with("--metrics-insecure"))
        {
            command.arg("--metrics-insecure");
        }
        let child = command
            .arg("--namespace")
            .arg(OPERATOR_NAMESPACE)
            .arg("--metrics-addr")
            .arg(format!("127.0.0.1:{}", self.metrics_port))
            .arg("--health-addr")
            .arg(format!("127.0.0.1:{}", self.health_port))
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
        let url = format!("http://127.0.0.1:{}/readyz", self.health_port);
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
        self.spawn_until_ready().await
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

/// A helper process (a proxy, a Prometheus, the operator run by hand) with its output in a log
/// file; killed when dropped or when this process exits.
pub struct Helper {
    child: Child,
    name: &'static str,
    log: PathBuf,
}

impl Helper {
    pub fn spawn(name: &'static str, command: &mut Command, log: PathBuf) -> Result<Helper> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {name}: {command:?}"))?;
        kill_when_this_process_exits(child.id())?;
        Ok(Helper { child, name, log })
    }

    /// Fails (with the end of its log) when the process has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        if let Ok(Some(status)) = self.child.try_wait() {
            bail!(
                "{} exited with {status}; last lines of {}:\n{}",
                self.name,
                self.log.display(),
                self.log_tail(40)
            );
        }
        Ok(())
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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

/// `GET https://127.0.0.1:<port>/metrics` with `token` as its bearer token (none: anonymous),
/// the server's certificate verified against the CA in file `ca` (none: not verified, as the
/// operator's own self-signed one cannot be): status and body. Through curl, which speaks TLS.
pub fn https_scrape(port: u16, token: Option<&str>, ca: Option<&Path>) -> Result<(u16, String)> {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"]);
    match ca {
        Some(ca) => curl.arg("--cacert").arg(ca),
        None => curl.arg("--insecure"),
    };
    if let Some(token) = token {
        // On the command line, visible in ps: fine for a test's short-lived token.
        curl.arg("-H").arg(format!("Authorization: Bearer {token}"));
    }
    let out = curl
        .arg(format!("https://127.0.0.1:{port}/metrics"))
        .stdin(Stdio::null())
        .output()
        .context("running curl (Debian: curl)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').with_context(|| {
        format!(
            "curl printed no status: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let code = code.trim().parse().with_context(|| {
        format!(
            "curl printed no status: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok((code, body.to_string()))
}

/// A GET with [`http_call`].
pub async fn http_get(url: &str) -> Result<(u16, String)> {
    http_call("GET", url, None).await
}

/// One HTTP/1.0 call on loopback (probes, metrics, the control APIs of the fault proxies):
/// status and body.
pub async fn http_call(method: &str, url: &str, body: Option<&str>) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("{url}: only http:// URLs"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(host))
            .await
            .with_context(|| format!("{method} {url}: connect timed out"))?
            .with_context(|| format!("{method} {url}: connect"))?;
    let body = body.unwrap_or_default();
    let request = format!(
        "{method} /{path} HTTP/1.0\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf))
        .await
        .with_context(|| format!("{method} {url}: no answer in 10s"))??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("{method} {url}: malformed HTTP answer {head:?}"))?;
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
    create_bound_service_account(client, namespace, name, "cluster-admin").await
}

/// The ClusterRole of the tests that read the secure `/metrics`: the rule of the chart's
/// `metrics-reader` ClusterRole (get on the non-resource URL /metrics), created if missing.
pub async fn metrics_reader_role(client: &Client) -> Result<&'static str> {
    const NAME: &str = "maintenance-operator-tests-metrics-reader";
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": { "name": NAME },
        "rules": [{ "nonResourceURLs": ["/metrics"], "verbs": ["get"] }],
    }))?;
    match Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
    {
        Err(err) if crate::api_error(&err).is_none_or(|(c, _)| c != 409) => {
            Err(err).with_context(|| format!("creating ClusterRole {NAME}"))
        }
        _ => Ok(NAME),
    }
}

/// A token (valid for an hour) of ServiceAccount `namespace/name`.
pub async fn service_account_token(client: &Client, namespace: &str, name: &str) -> Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for ServiceAccount {namespace}/{name}"))?
        .status
        .and_then(|status| status.token)
        .with_context(|| format!("the TokenRequest of {namespace}/{name} returned no token"))
}

/// Creates ServiceAccount `namespace/name` bound to ClusterRole `role` (either may exist already).
pub async fn create_bound_service_account(
    client: &Client,
    namespace: &str,
    name: &str,
    role: &str,
) -> Result<()> {
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    let binding_name = format!("{namespace}-{name}-{role}");
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(binding_name.clone()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(namespace.into()),
            ..Subject::default()
        }]),
    };
    let already_there = |err: &kube::Error| crate::api_error(err).is_some_and(|(c, _)| c == 409);
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
    let token = service_account_token(&testbed.client().await?, namespace, name).await?;
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

/// The arguments of replica `name` of several, which elect their leader with a lease of
/// `lease_seconds`.
pub fn replica_args<'a>(name: &'a str, lease_seconds: &'a str) -> [&'a str; 5] {
    [
        "--leader-elect",
        "--lease-duration-seconds",
        lease_seconds,
        "--pod-name",
        name,
    ]
}

/// A control plane of one test's own with `config` installed (see [`install`]), and a client of
/// it: for tests that depend on cluster-wide state (the limits count every node, there is one
/// config, one leader).
pub async fn own_testbed(
    config: Option<MaintenanceOperatorConfigSpec>,
) -> Result<(Testbed, Client)> {
    let testbed = Testbed::start().await?;
    let client = testbed.client().await?;
    install(&client, config).await?;
    Ok((testbed, client))
}

/// [`own_testbed`] with `count` Ready nodes `<prefix>-<i>` and a namespace: the testbed, a
/// client, the namespace and the nodes.
pub async fn own_cluster(
    prefix: &str,
    count: usize,
    config: Option<MaintenanceOperatorConfigSpec>,
) -> Result<(Testbed, Client, String, Vec<String>)> {
    let (testbed, client) = own_testbed(config).await?;
    let nodes = crate::create_nodes(&client, prefix, count, &[]).await?;
    // A deadline for the set-up, not a measurement: 30 nodes take about 20 s on 2 cores.
    crate::wait_nodes_ready(&client, &nodes, Duration::from_secs(180)).await?;
    let ns = crate::unique_name(prefix);
    crate::create_namespace(&client, &ns).await?;
    Ok((testbed, client, ns, nodes))
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
pub async fn isolated_setup(prefix: &str, count: usize) -> Result<(Client, String, Vec<String>)> {
    let shared = shared_cluster().await?;
    let client = shared.testbed.client().await?;
    let ns = crate::unique_name(prefix);
    crate::create_namespace(&client, &ns).await?;
    let nodes = crate::create_nodes(&client, &crate::unique_name(prefix), count, &[]).await?;
    crate::wait_nodes_ready(&client, &nodes, Duration::from_secs(90)).await?;
    Ok((client, ns, nodes))
}

/// `maintenance-operator plan -o json` against the live cluster.
pub fn plan_json(testbed: &Testbed) -> Result<serde_json::Value> {
    let output = Command::new(crate::built_binary("maintenance-operator"))
        .args(["plan", "-o", "json", "--namespace", OPERATOR_NAMESPACE])
        .env("KUBECONFIG", testbed.kubeconfig_path())
        .output()
        .context("running maintenance-operator plan")?;
    if !output.status.success() {
        bail!("plan failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    serde_json::from_slice(&output.stdout).context("plan -o json printed no JSON")
}
