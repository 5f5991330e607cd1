//! The validating admission webhook for NodeMaintenance, served over HTTPS by every replica (not
//! only the leader: the API server calls whichever pod its Service picks).
//!
//! What it decides is `maintenance_core::validation::review`; this module reads AdmissionReview v1
//! requests, looks up the node of a CREATE, and answers. The certificate comes from PEM files
//! (a mounted Secret, written by cert-manager or by the Helm chart) and is reloaded when they
//! change, so a rotation needs no restart.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum_server::tls_rustls::RustlsConfig;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, Operation,
};
use kube::core::{DynamicObject, Status};
use maintenance_actors::metrics::Metrics;
use maintenance_core::validation::{self, NodePresence, Outcome, Review, Verdict};
use maintenance_crds::NodeMaintenance;

/// The path NVIDIA's operator serves the same webhook on, so that existing registrations work.
pub const PATH: &str = "/validate-maintenance-nvidia-com-v1alpha1-nodemaintenance";
/// How often the certificate files are checked for a new certificate.
const RELOAD_PERIOD: Duration = Duration::from_secs(5);
/// Bound on the node lookup, well inside the API server's webhook timeout (10 s by default), so
/// that a slow lookup ends in our clear error rather than the API server's timeout.
const NODE_LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// An AdmissionReview of an UPDATE carries the object twice; objects reach 1.5 MiB in etcd.
const MAX_BODY_BYTES: usize = 8 << 20;

#[derive(clap::Args, Debug, Clone, Default)]
pub struct WebhookArgs {
    /// Serve the NodeMaintenance validating admission webhook over HTTPS on this address (e.g.
    /// 0.0.0.0:9443); no webhook when unset.
    #[arg(long, requires_all = ["webhook_cert_file", "webhook_key_file"])]
    pub webhook_addr: Option<SocketAddr>,
    /// PEM file of the webhook's serving certificate (with its chain); reloaded when it changes.
    #[arg(long, requires = "webhook_addr")]
    pub webhook_cert_file: Option<PathBuf>,
    /// PEM file of the private key of --webhook-cert-file; reloaded with it.
    #[arg(long, requires = "webhook_addr")]
    pub webhook_key_file: Option<PathBuf>,
}

/// The webhook, its certificate read and ready to serve.
pub struct Webhook {
    addr: SocketAddr,
    tls: RustlsConfig,
    files: CertFiles,
    loaded: Pem,
    state: Arc<Reviewer>,
}

/// Runs `http` (the metrics and probes server) and, when configured, the webhook beside it; ends
/// when either fails.
pub async fn serve_beside(
    http: impl Future<Output = anyhow::Result<()>>,
    webhook: Option<Webhook>,
) -> anyhow::Result<()> {
    match webhook {
        Some(webhook) => tokio::try_join!(http, webhook.serve()).map(|_| ()),
        None => http.await,
    }
}

impl Webhook {
    /// Reads the certificate and key named by `args`; `None` without `--webhook-addr`. A file
    /// that cannot be used now is an error: at start-up it is a mistake in the deployment, not a
    /// rotation in progress (the kubelet mounts a Secret before the container starts).
    pub async fn from_args(
        args: &WebhookArgs,
        client: kube::Client,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Option<Webhook>> {
        let (Some(addr), Some(cert), Some(key)) = (
            args.webhook_addr,
            args.webhook_cert_file.clone(),
            args.webhook_key_file.clone(),
        ) else {
            return Ok(None);
        };
        let files = CertFiles { cert, key };
        let loaded = files.read().await?;
        let tls = RustlsConfig::from_pem(loaded.cert.clone(), loaded.key.clone())
            .await
            .map_err(|err| files.unusable(&err))?;
        Ok(Some(Webhook {
            addr,
            tls,
            files,
            loaded,
            state: Arc::new(Reviewer {
                nodes: Api::all(client),
                metrics,
            }),
        }))
    }

    pub async fn serve(self) -> anyhow::Result<()> {
        let Webhook {
            addr,
            tls,
            files,
            loaded,
            state,
        } = self;
        let reload = tokio::spawn(keep_certificate_current(tls.clone(), files, loaded));
        let app = Router::new()
            .route(PATH, post(validate))
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(state);
        tracing::info!(%addr, path = PATH, "serving the NodeMaintenance admission webhook");
        let served = axum_server::bind_rustls(addr, tls)
            // A failed handshake (a client with another CA, a port scan) ends that connection
            // only; the API server reports a CA mismatch to the user itself.
            .accept_error_handler(|peer, err| {
                tracing::debug!(?peer, error = %err, "webhook connection failed");
            })
            .serve(app.into_make_service())
            .await;
        reload.abort();
        served.map_err(|err| {
            anyhow::anyhow!(
                "the admission webhook cannot serve on {addr}: {err}; choose another \
                 --webhook-addr"
            )
        })
    }
}

/// Where the certificate and its key are read from.
struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
}

/// What the files held when last loaded.
#[derive(PartialEq, Eq)]
struct Pem {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl CertFiles {
    async fn read(&self) -> anyhow::Result<Pem> {
        let read = |path: &Path| {
            let path = path.to_path_buf();
            async move {
                tokio::fs::read(&path).await.map_err(|err| {
                    anyhow::anyhow!(
                        "cannot read {} for the admission webhook: {err}; mount the webhook's \
                         certificate Secret there or fix --webhook-cert-file/--webhook-key-file",
                        path.display()
                    )
                })
            }
        };
        Ok(Pem {
            cert: read(&self.cert).await?,
            key: read(&self.key).await?,
        })
    }

    fn unusable(&self, err: &std::io::Error) -> anyhow::Error {
        anyhow::anyhow!(
            "{} and {} hold no usable certificate and matching private key for the admission \
             webhook: {err}; they must be PEM (a certificate chain, and one PKCS#8, PKCS#1 or \
             SEC1 key)",
            self.cert.display(),
            self.key.display()
        )
    }
}

/// Reloads the certificate whenever the files hold something new. The contents are compared,
/// not the modification times: the kubelet updates a mounted Secret by swapping a symlink, and
/// the new files' times say nothing reliable. A pair that does not load (say, the key written
/// but not yet the certificate) keeps the current certificate and is tried again.
async fn keep_certificate_current(tls: RustlsConfig, files: CertFiles, mut loaded: Pem) {
    let mut ticker = tokio::time::interval(RELOAD_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Warn once per problem, not every period.
    let mut last_problem = String::new();
    loop {
        ticker.tick().await;
        let result = match files.read().await {
            Ok(pem) if pem == loaded => Ok(None),
            Ok(pem) => tls
                .reload_from_pem(pem.cert.clone(), pem.key.clone())
                .await
                .map(|()| Some(pem))
                .map_err(|err| files.unusable(&err)),
            Err(err) => Err(err),
        };
        match result {
            Ok(None) => {}
            Ok(Some(pem)) => {
                loaded = pem;
                last_problem.clear();
                tracing::info!(cert = %files.cert.display(), "reloaded the admission webhook's certificate");
            }
            Err(err) => {
                let problem = format!("{err:#}");
                if problem != last_problem {
                    tracing::warn!(error = %problem, "keeping the current webhook certificate");
                    last_problem = problem;
                }
            }
        }
    }
}

/// What a review needs: the node lookup and the metrics.
struct Reviewer {
    nodes: Api<Node>,
    metrics: Arc<Metrics>,
}

impl Reviewer {
    fn count(&self, operation: validation::Operation, outcome: Outcome) {
        self.metrics
            .process
            .admission_reviews_total
            .with_label_values(&[operation.as_str(), outcome.as_str()])
            .inc();
    }
}

/// An answer that is not an AdmissionReview: the body could not be read as one.
fn bad_request(problem: String) -> Response {
    (
        StatusCode::BAD_REQUEST,
        format!(
            "{problem}; this endpoint takes an admission.k8s.io/v1 AdmissionReview with a \
             request, as the API server sends it\n"
        ),
    )
        .into_response()
}

async fn validate(State(reviewer): State<Arc<Reviewer>>, body: Bytes) -> Response {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(&body) {
        Ok(review) => review,
        Err(err) => {
            reviewer.count(validation::Operation::Other, Outcome::Error);
            return bad_request(format!("the body is no AdmissionReview: {err}"));
        }
    };
    if review.types.api_version != META_API_VERSION_V1 {
        reviewer.count(validation::Operation::Other, Outcome::Error);
        return bad_request(format!(
            "AdmissionReview {:?} is not supported, only {META_API_VERSION_V1} (list only v1 in \
             admissionReviewVersions)",
            review.types.api_version
        ));
    }
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(_) => {
            reviewer.count(validation::Operation::Other, Outcome::Error);
            return bad_request("the AdmissionReview has no request".into());
        }
    };
    let (operation, answer) = answer(&reviewer, &request).await;
    let response = match answer {
        Answer::Verdict(verdict) => {
            reviewer.count(operation, verdict.outcome());
            respond(&request, verdict)
        }
        Answer::Unchecked => {
            reviewer.count(operation, Outcome::Allowed);
            AdmissionResponse::from(&request)
        }
        // Not a verdict: an HTTP error, so that the API server applies the webhook's
        // failurePolicy (refuse with Fail, admit with Ignore) and shows the message.
        Answer::Failed(status, message) => {
            reviewer.count(operation, Outcome::Error);
            tracing::warn!(uid = %request.uid, error = %message, "admission review failed");
            return (status, format!("{message}\n")).into_response();
        }
    };
    match serde_json::to_vec(&response.into_review()) {
        Ok(json) => (
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            json,
        )
            .into_response(),
        Err(err) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the AdmissionReview response: {err}\n"),
        )
            .into_response(),
    }
}

enum Answer {
    Verdict(Verdict),
    /// Not a NodeMaintenance CREATE or UPDATE: a registration that sends more than it should.
    Unchecked,
    Failed(StatusCode, String),
}

async fn answer(
    reviewer: &Reviewer,
    request: &AdmissionRequest<DynamicObject>,
) -> (validation::Operation, Answer) {
    let operation = match request.operation {
        Operation::Create => validation::Operation::Create,
        Operation::Update => validation::Operation::Update,
        Operation::Delete | Operation::Connect => validation::Operation::Other,
    };
    if operation == validation::Operation::Other || request.kind.kind != "NodeMaintenance" {
        tracing::warn!(
            kind = %request.kind.kind,
            operation = ?request.operation,
            "admission review of something else than a NodeMaintenance CREATE or UPDATE; \
             allowed unchecked (register the webhook for nodemaintenances CREATE and UPDATE only)"
        );
        return (operation, Answer::Unchecked);
    }
    let object = match decode(request, request.object.as_ref()) {
        Ok(Some(object)) => object,
        Ok(None) => {
            return (
                operation,
                Answer::Failed(
                    StatusCode::BAD_REQUEST,
                    format!("the AdmissionReview {} carries no object", request.uid),
                ),
            );
        }
        Err(err) => return (operation, Answer::Failed(StatusCode::BAD_REQUEST, err)),
    };
    let verdict = if operation == validation::Operation::Create {
        let node = match validation::node_to_look_up(&object) {
            Some(name) => match lookup(&reviewer.nodes, name).await {
                Ok(node) => node,
                Err(err) => {
                    return (
                        operation,
                        Answer::Failed(StatusCode::INTERNAL_SERVER_ERROR, err),
                    );
                }
            },
            // Not a node name: nothing to look up, the review refuses it.
            None => NodePresence::Missing,
        };
        validation::review(&object, Review::Create { node })
    } else {
        let old = match decode(request, request.old_object.as_ref()) {
            Ok(old) => old,
            Err(err) => return (operation, Answer::Failed(StatusCode::BAD_REQUEST, err)),
        };
        validation::review(&object, Review::Update { old: old.as_ref() })
    };
    if let Verdict::Denied { reason, message } = &verdict {
        tracing::info!(uid = %request.uid, %reason, %message, "refused a NodeMaintenance");
    }
    (operation, Answer::Verdict(verdict))
}

/// The NodeMaintenance of a review, with its namespace and name from the request when the
/// object does not carry them.
fn decode(
    request: &AdmissionRequest<DynamicObject>,
    object: Option<&DynamicObject>,
) -> Result<Option<NodeMaintenance>, String> {
    let Some(object) = object else {
        return Ok(None);
    };
    let namespace = request.namespace.clone().unwrap_or_default();
    let mut nm: NodeMaintenance = serde_json::to_value(object)
        .and_then(serde_json::from_value)
        .map_err(|err| {
            format!(
                "NodeMaintenance {namespace}/{} in AdmissionReview {} cannot be read: {err}",
                request.name, request.uid
            )
        })?;
    if nm.metadata.namespace.is_none() {
        nm.metadata.namespace = request.namespace.clone();
    }
    if nm.metadata.name.is_none() && !request.name.is_empty() {
        nm.metadata.name = Some(request.name.clone());
    }
    Ok(Some(nm))
}

async fn lookup(nodes: &Api<Node>, name: &str) -> Result<NodePresence, String> {
    // Metadata only: existence is all the review needs.
    match tokio::time::timeout(NODE_LOOKUP_TIMEOUT, nodes.get_metadata_opt(name)).await {
        Ok(Ok(Some(_))) => Ok(NodePresence::Exists),
        Ok(Ok(None)) => Ok(NodePresence::Missing),
        Ok(Err(err)) => Err(format!(
            "cannot check that node {name:?} exists: {err}; try again (the operator's \
             ServiceAccount needs get on nodes)"
        )),
        Err(_) => Err(format!(
            "cannot check that node {name:?} exists: the API server did not answer within \
             {NODE_LOOKUP_TIMEOUT:?}; try again"
        )),
    }
}

fn respond(request: &AdmissionRequest<DynamicObject>, verdict: Verdict) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(request);
    match verdict {
        Verdict::Allowed { warnings } => {
            if !warnings.is_empty() {
                response.warnings = Some(warnings);
            }
        }
        Verdict::Denied { reason, message } => {
            response.allowed = false;
            response.result =
                Status::failure(&message, reason.status_reason()).with_code(reason.http_code());
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(operation: &str, object: serde_json::Value) -> AdmissionRequest<DynamicObject> {
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "maintenance.nvidia.com", "version": "v1alpha1", "kind": "NodeMaintenance"},
                "resource": {"group": "maintenance.nvidia.com", "version": "v1alpha1", "resource": "nodemaintenances"},
                "name": "fw",
                "namespace": "team-a",
                "operation": operation,
                "userInfo": {"username": "admin"},
                "object": object,
            }
        }))
        .expect("a valid review");
        review.try_into().expect("a request")
    }

    fn nm_object(node: &str) -> serde_json::Value {
        json!({
            "apiVersion": "maintenance.nvidia.com/v1alpha1",
            "kind": "NodeMaintenance",
            "metadata": {"name": "fw"},
            "spec": {"requestorID": "fw.example.com", "nodeName": node},
        })
    }

    #[test]
    fn decode_fills_the_namespace_from_the_request() {
        let request = request("CREATE", nm_object("node-7"));
        let nm = decode(&request, request.object.as_ref())
            .expect("decodes")
            .expect("has an object");
        assert_eq!(nm.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(nm.spec.node_name, "node-7");
    }

    #[test]
    fn an_undecodable_object_names_it() {
        let request = request("CREATE", json!({"metadata": {"name": "fw"}, "spec": 3}));
        let err = decode(&request, request.object.as_ref()).expect_err("refused");
        assert!(
            err.starts_with("NodeMaintenance team-a/fw in AdmissionReview"),
            "{err}"
        );
    }

    #[test]
    fn a_denial_echoes_the_uid_with_code_reason_and_message() {
        let request = request("CREATE", nm_object("node-7"));
        let response = respond(
            &request,
            Verdict::Denied {
                reason: validation::DenyReason::NodeNotFound,
                message: "NodeMaintenance team-a/fw: node \"node-7\" does not exist".into(),
            },
        );
        let review = serde_json::to_value(response.into_review()).expect("serializes");
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(review["kind"], "AdmissionReview");
        let response = &review["response"];
        assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(response["allowed"], false);
        assert_eq!(response["status"]["code"], 403);
        assert_eq!(response["status"]["reason"], "Forbidden");
        assert_eq!(
            response["status"]["message"],
            "NodeMaintenance team-a/fw: node \"node-7\" does not exist"
        );
    }

    async fn call(body: &[u8]) -> (StatusCode, String, Arc<Reviewer>) {
        // Never contacted: these reviews end before any node lookup.
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let client = kube::Client::try_from(config).expect("a client");
        let reviewer = Arc::new(Reviewer {
            nodes: Api::all(client),
            metrics: Arc::new(Metrics::new().expect("metrics")),
        });
        let response = validate(State(reviewer.clone()), Bytes::copy_from_slice(body)).await;
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("a body");
        (
            status,
            String::from_utf8_lossy(&body).into_owned(),
            reviewer,
        )
    }

    fn counted(reviewer: &Reviewer, operation: &str, verdict: &str) -> u64 {
        reviewer
            .metrics
            .process
            .admission_reviews_total
            .with_label_values(&[operation, verdict])
            .get()
    }

    #[tokio::test]
    async fn malformed_bodies_get_a_400_that_says_what_is_wrong() {
        for (body, says) in [
            (&b"not json"[..], "the body is no AdmissionReview"),
            (b"", "the body is no AdmissionReview"),
            (
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
                "has no request",
            ),
            (
                br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview"}"#,
                "only admission.k8s.io/v1",
            ),
            (
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":3}}"#,
                "the body is no AdmissionReview",
            ),
        ] {
            let (status, text, reviewer) = call(body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
            assert!(text.contains(says), "{text}");
            assert!(text.contains("admission.k8s.io/v1 AdmissionReview"), "{text}");
            assert_eq!(counted(&reviewer, "other", "error"), 1);
        }
    }

    #[tokio::test]
    async fn a_review_without_object_is_a_400_and_other_operations_pass() {
        let mut review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u1",
                "kind": {"group": "maintenance.nvidia.com", "version": "v1alpha1", "kind": "NodeMaintenance"},
                "resource": {"group": "maintenance.nvidia.com", "version": "v1alpha1", "resource": "nodemaintenances"},
                "name": "fw",
                "namespace": "team-a",
                "operation": "CREATE",
                "userInfo": {},
            }
        });
        let (status, text, reviewer) = call(review.to_string().as_bytes()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(text.contains("carries no object"), "{text}");
        assert_eq!(counted(&reviewer, "create", "error"), 1);

        review["request"]["operation"] = json!("DELETE");
        let (status, text, reviewer) = call(review.to_string().as_bytes()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let answer: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(answer["response"]["uid"], "u1");
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(counted(&reviewer, "other", "allowed"), 1);
    }

    #[tokio::test]
    async fn an_update_is_decided_without_a_lookup() {
        let mut object = nm_object("node-7");
        object["spec"]["drainSpec"] = json!({"podSelector": "app in (web"});
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u2",
                "kind": {"group": "maintenance.nvidia.com", "version": "v1alpha1", "kind": "NodeMaintenance"},
                "resource": {"group": "maintenance.nvidia.com", "version": "v1alpha1", "resource": "nodemaintenances"},
                "name": "fw",
                "namespace": "team-a",
                "operation": "UPDATE",
                "userInfo": {},
                "object": object,
                "oldObject": nm_object("node-7"),
            }
        });
        let (status, text, reviewer) = call(review.to_string().as_bytes()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let answer: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(answer["response"]["uid"], "u2");
        assert_eq!(answer["response"]["allowed"], false);
        assert_eq!(answer["response"]["status"]["code"], 422);
        let message = answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            message.starts_with("NodeMaintenance team-a/fw: spec.drainSpec.podSelector:"),
            "{message}"
        );
        assert_eq!(counted(&reviewer, "update", "denied"), 1);
    }

    #[test]
    fn an_admission_carries_its_warnings() {
        let request = request("UPDATE", nm_object("node-7"));
        let response = respond(
            &request,
            Verdict::Allowed {
                warnings: vec!["careful".into()],
            },
        );
        let review = serde_json::to_value(response.into_review()).expect("serializes");
        assert_eq!(review["response"]["allowed"], true);
        assert_eq!(review["response"]["warnings"], json!(["careful"]));
    }
}
