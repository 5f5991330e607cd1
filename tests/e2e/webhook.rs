//! The admission webhooks on a live control plane: the API server calls the operator over HTTPS
//! (a CA and serving certificate made here), refuses a request for a node that does not exist, a
//! spec the operator could not use and a config the scheduler could not use, admits the rest, and
//! keeps calling it across a certificate rotation.
//!
//! The webhook is served by a standby replica (not the leader), as every replica serves it. The
//! registration is cluster-wide, so this test starts a control plane of its own.
//!
//!   PATH="$(tests/testbed/testbed bin-dir):$PATH" cargo test --test e2e webhook::

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use maintenance_crds::{
    DrainSpec, MaintenanceOperatorConfig, MaintenanceOperatorConfigSpec, MaintenanceWindow,
    NodeMaintenance, NodeMaintenanceSpec, Phase,
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use support::invariants::*;
use support::operator::*;
use support::*;

pub(crate) const WEBHOOK_PATH: &str = "/validate-maintenance-nvidia-com-v1alpha1-nodemaintenance";
const CONFIG_WEBHOOK_PATH: &str =
    "/validate-maintenance-nvidia-com-v1alpha1-maintenanceoperatorconfig";
const WAIT: Duration = Duration::from_secs(60);

/// A certificate authority of the test's own.
pub(crate) struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Result<Ca> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ok(Ca {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate()?)?,
        })
    }

    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A serving certificate for 127.0.0.1 and its key, both PEM.
    pub(crate) fn serving(&self) -> Result<(String, String)> {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "maintenance-operator-webhook");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

pub(crate) struct CertFiles {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

impl CertFiles {
    pub(crate) fn in_dir(dir: &Path) -> CertFiles {
        CertFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        }
    }

    /// Writes the key, then the certificate, in place: in between, the files hold a pair that
    /// does not match, which the operator must outlast.
    pub(crate) fn write(&self, (cert, key): &(String, String)) -> Result<()> {
        std::fs::write(&self.key, key).with_context(|| format!("writing {:?}", self.key))?;
        std::fs::write(&self.cert, cert).with_context(|| format!("writing {:?}", self.cert))?;
        Ok(())
    }
}

/// The registration the chart makes, pointed at a URL instead of a Service: `url` is the
/// NodeMaintenance webhook's; the config's is on the same server.
pub(crate) fn registration(name: &str, url: &str, ca_pem: &str) -> ValidatingWebhookConfiguration {
    let hook =
        |hook_name: &str, url: String, resource: &str, failure_policy: &str| ValidatingWebhook {
            name: hook_name.into(),
            admission_review_versions: vec!["v1".into()],
            client_config: WebhookClientConfig {
                url: Some(url),
                ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec())),
                service: None,
            },
            failure_policy: Some(failure_policy.into()),
            side_effects: "None".into(),
            timeout_seconds: Some(10),
            match_conditions: Some(vec![MatchCondition {
                name: "create-or-spec-change".into(),
                expression: "request.operation == 'CREATE' || object.spec != oldObject.spec".into(),
            }]),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec!["maintenance.nvidia.com".into()]),
                api_versions: Some(vec!["v1alpha1".into()]),
                operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                resources: Some(vec![resource.into()]),
                scope: Some("Namespaced".into()),
            }]),
            ..ValidatingWebhook::default()
        };
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![
            hook(
                "vnodemaintenance.kb.io",
                url.into(),
                "nodemaintenances",
                "Fail",
            ),
            hook(
                "vmaintenanceoperatorconfig.maintenance.nvidia.com",
                url.replace(WEBHOOK_PATH, CONFIG_WEBHOOK_PATH),
                "maintenanceoperatorconfigs",
                "Ignore",
            ),
        ]),
    }
}

pub(crate) async fn register(
    client: &Client,
    config: &ValidatingWebhookConfiguration,
) -> Result<()> {
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .patch(
            &config.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(config),
        )
        .await
        .context("registering the webhook")?;
    Ok(())
}

/// Deletes the registration (a test leaves none behind, whatever happened).
pub(crate) async fn unregister(client: &Client, name: &str) -> Result<()> {
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await
        .context("deleting the webhook registration")?;
    Ok(())
}

pub(crate) async fn try_create(
    client: &Client,
    ns: &str,
    name: &str,
    spec: NodeMaintenanceSpec,
    dry_run: bool,
) -> Result<NodeMaintenance, kube::Error> {
    Api::<NodeMaintenance>::namespaced(client.clone(), ns)
        .create(
            &PostParams {
                dry_run,
                ..PostParams::default()
            },
            &NodeMaintenance::new(name, spec),
        )
        .await
}

/// The API server's refusal of a call, as (code, message); fails if the call succeeded.
pub(crate) fn refusal<T>(result: Result<T, kube::Error>, what: &str) -> Result<(u16, String)> {
    match result {
        Ok(_) => bail!("{what} was admitted"),
        Err(err) => match api_error(&err) {
            Some((code, message)) => Ok((code, message.to_string())),
            None => bail!("{what} failed without an API error: {err}"),
        },
    }
}

fn our_missing_node_message(ns: &str, name: &str, node: &str) -> String {
    format!(
        "NodeMaintenance {ns}/{name}: node \"{node}\" does not exist; create the node first or \
         fix spec.nodeName"
    )
}

/// Waits until a dry-run CREATE for a missing node gets `want(code, message)`; returns the
/// last answer.
async fn wait_answer(
    client: &Client,
    ns: &str,
    what: &str,
    want: impl Fn(u16, &str) -> bool,
) -> Result<(u16, String)> {
    let want = &want;
    wait_until(what, WAIT, || async move {
        let spec = request_spec("no-such-node", "webhook.example.com");
        let answer = match try_create(client, ns, "probe", spec, true).await {
            Ok(_) => return Ok(Check::Pending("the dry-run CREATE was admitted".into())),
            Err(err) => match api_error(&err) {
                Some((code, message)) => (code, message.to_string()),
                None => return Ok(Check::Pending(format!("no API error: {err}"))),
            },
        };
        Ok(if want(answer.0, &answer.1) {
            Check::Done(answer)
        } else {
            Check::Pending(format!("{} {}", answer.0, answer.1))
        })
    })
    .await
}

/// Waits until the webhook refuses a request for a node that does not exist (`what` says why it
/// may not yet).
pub(crate) async fn wait_missing_node_refused(client: &Client, ns: &str, what: &str) -> Result<()> {
    wait_answer(client, ns, what, |code, message| {
        code == 403 && message.contains("does not exist")
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn webhook_refuses_what_the_operator_cannot_do_and_survives_a_rotation() -> Result<()> {
    let (testbed, client, ns, nodes) = own_cluster("webhook", 1, Some(limits(1000, None))).await?;
    let monitor = InvariantMonitor::start(&testbed, Scope::new(&ns, &nodes)).await?;
    let node = &nodes[0];

    let dir = tempfile::tempdir()?;
    let files = CertFiles::in_dir(dir.path());
    let first_ca = Ca::new("webhook test CA 1")?;
    files.write(&first_ca.serving()?)?;

    // A leader, then a standby that serves the webhook the API server calls.
    let cert = files.cert.to_string_lossy().into_owned();
    let key = files.key.to_string_lossy().into_owned();
    let start = |port: u16| {
        let (cert, key, testbed) = (cert.clone(), key.clone(), &testbed);
        async move {
            let addr = format!("127.0.0.1:{port}");
            let args = [
                "--leader-elect",
                "--lease-name",
                "webhook-test",
                "--webhook-addr",
                &addr,
                "--webhook-cert-file",
                &cert,
                "--webhook-key-file",
                &key,
            ];
            Operator::start(testbed, &args).await
        }
    };
    let leader = start(free_port()?).await?;
    wait_for("the first operator to lead", WAIT, || async {
        Ok((leader.metric("maintenance_operator_leader").await? == 1.0).then_some(()))
    })
    .await?;
    let port = free_port()?;
    let standby = start(port).await?;
    ensure!(
        standby.metric("maintenance_operator_leader").await? == 0.0,
        "the second operator leads; the test wants the webhook on a standby"
    );

    let config_name = unique_name("webhook");
    let url = format!("https://127.0.0.1:{port}{WEBHOOK_PATH}");
    register(&client, &registration(&config_name, &url, &first_ca.pem())).await?;
    let result = exercise(&client, &ns, node, &standby, &files, &config_name, &url).await;
    if result.is_err() {
        for (who, op) in [("leader", &leader), ("standby", &standby)] {
            eprintln!(
                "{who} log:\n{}",
                std::fs::read_to_string(&op.log).unwrap_or_default()
            );
        }
    }
    // Leave no registration behind, whatever happened.
    unregister(&client, &config_name).await?;
    result?;
    monitor.held().await
}

async fn exercise(
    client: &Client,
    ns: &str,
    node: &str,
    standby: &Operator,
    files: &CertFiles,
    config_name: &str,
    url: &str,
) -> Result<()> {
    // The API server picks the registration up within a moment.
    wait_missing_node_refused(client, ns, "the webhook to refuse a missing node").await?;

    // A missing node: refused with our message, naming the object and the fix.
    let (code, message) = refusal(
        try_create(
            client,
            ns,
            "missing-node",
            request_spec("no-such-node", "webhook.example.com"),
            false,
        )
        .await,
        "a request for a missing node",
    )?;
    ensure!(code == 403, "code {code}: {message}");
    ensure!(
        message.contains("admission webhook \"vnodemaintenance.kb.io\" denied the request"),
        "{message}"
    );
    ensure!(
        message.contains(&our_missing_node_message(
            ns,
            "missing-node",
            "no-such-node"
        )),
        "{message}"
    );
    ensure!(
        get_request(client, ns, "missing-node").await?.is_none(),
        "the refused request was stored"
    );

    // A request whose drain takes the pods `selector` selects.
    let selecting = |selector: &str| NodeMaintenanceSpec {
        drain_spec: Some(DrainSpec {
            pod_selector: Some(selector.into()),
            ..DrainSpec::default()
        }),
        ..request_spec(node, "webhook.example.com")
    };
    // An invalid podSelector: refused as invalid, with the operator's own wording.
    let (code, message) = refusal(
        try_create(client, ns, "bad-selector", selecting("app in (web"), false).await,
        "a request with an invalid podSelector",
    )?;
    ensure!(code == 422, "code {code}: {message}");
    ensure!(
        message.contains(&format!(
            "NodeMaintenance {ns}/bad-selector: spec.drainSpec.podSelector: label selector \
             \"app in (web\" is invalid"
        )),
        "{message}"
    );

    // An existing node: admitted, and the operator's own updates (finalizer, annotations) pass
    // while the webhook is registered, through to Ready and release.
    try_create(client, ns, "good", selecting("app=web"), false)
        .await
        .context("a valid request on an existing node was refused")?;
    wait_phase(client, ns, "good", Phase::Ready, WAIT).await?;

    // An UPDATE that breaks the spec is refused; one that keeps it valid passes.
    let requests = Api::<NodeMaintenance>::namespaced(client.clone(), ns);
    let (code, message) = refusal(
        requests
            .patch(
                "good",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"drainSpec": {"podSelector": "=web"}}})),
            )
            .await,
        "an update to an invalid podSelector",
    )?;
    ensure!(code == 422, "code {code}: {message}");
    ensure!(message.contains("spec.drainSpec.podSelector"), "{message}");
    for additional in [
        serde_json::json!(["other.example.com"]),
        serde_json::Value::Null,
    ] {
        let valid = serde_json::json!({"spec": {"additionalRequestors": additional}});
        patch_request(client, ns, "good", valid)
            .await
            .context("a valid update was refused")?;
    }
    release_request(client, ns, "good", WAIT).await?;
    ensure!(
        !node_unschedulable(client, node).await?,
        "{node} stayed cordoned after the release"
    );

    // A config the scheduler could not use: refused, every field named, the stored one kept.
    let configs = Api::<MaintenanceOperatorConfig>::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let before = configs.get("default").await?.spec;
    let mut broken = before.clone();
    broken.maintenance_windows = Some(vec![
        MaintenanceWindow::recurring("0 0 31 2 *", "1h"),
        MaintenanceWindow {
            time_zone: Some("Mars/Olympus_Mons".into()),
            ..MaintenanceWindow::recurring("0 1 * * *", "1h")
        },
    ]);
    let apply = |spec: MaintenanceOperatorConfigSpec| {
        let configs = configs.clone();
        async move {
            let config = MaintenanceOperatorConfig::new("default", spec);
            configs
                .patch(
                    "default",
                    &PatchParams::apply("webhook-test").force(),
                    &Patch::Apply(&config),
                )
                .await
        }
    };
    let (code, message) = refusal(apply(broken).await, "a config whose schedule never fires")?;
    ensure!(code == 422, "code {code}: {message}");
    for expected in [
        "admission webhook \"vmaintenanceoperatorconfig.maintenance.nvidia.com\" denied the request",
        "maintenanceWindows[0].schedule \"0 0 31 2 *\" never fires",
        "maintenanceWindows[1].timeZone \"Mars/Olympus_Mons\"",
    ] {
        ensure!(message.contains(expected), "{expected:?} in {message}");
    }
    ensure!(
        configs.get("default").await?.spec == before,
        "the refused config was stored"
    );
    // A usable one passes.
    let mut nightly = before.clone();
    nightly.maintenance_windows = Some(vec![MaintenanceWindow::recurring("* * * * *", "1h")]);
    apply(nightly)
        .await
        .context("a usable config was refused")?;
    apply(before).await?;

    // The standby counted what it decided.
    for (operation, verdict) in [
        ("create", "denied"),
        ("create", "allowed"),
        ("update", "denied"),
    ] {
        let sample = format!(
            "maintenance_operator_admission_reviews_total{{operation=\"{operation}\",verdict=\"{verdict}\"}}"
        );
        let count = standby.metric(&sample).await?;
        ensure!(count >= 1.0, "{sample} is {count}");
    }

    // Rotation to a new CA. First the registration: the API server, now trusting only the new
    // CA, opens new connections and fails to call the webhook, which still serves the old
    // certificate. (Replacing the files first would prove nothing: the API server keeps its
    // connections, whose handshake is done.)
    let second_ca = Ca::new("webhook test CA 2")?;
    register(client, &registration(config_name, url, &second_ca.pem())).await?;
    let (code, message) = wait_answer(
        client,
        ns,
        "the API server to distrust the old certificate",
        |_, message| message.contains("failed calling webhook"),
    )
    .await?;
    ensure!(
        message.contains("certificate") || message.contains("x509"),
        "expected a TLS verification failure, got {code}: {message}"
    );
    // Then the files: the operator picks the new certificate up without a restart, and the
    // refusals are ours again.
    files.write(&second_ca.serving()?)?;
    wait_missing_node_refused(client, ns, "the webhook to serve the new certificate").await?;
    try_create(
        client,
        ns,
        "after-rotation",
        request_spec(node, "webhook.example.com"),
        true,
    )
    .await
    .context("a valid request was refused after the rotation")?;
    Ok(())
}
