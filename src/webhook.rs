//! The validating admission webhook for NodeMaintenance, served over HTTPS by every replica (not
//! only the leader: the API server calls whichever pod its Service picks).
//!
//! What it decides is `maintenance_core::validation::review`; this module reads AdmissionReview v1
//! requests, looks up the node of a CREATE, and answers. The certificate comes from PEM files
//! (a mounted Secret, written by cert-manager or by the Helm chart) and is reloaded when they
//! change, so a rotation needs no restart.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, Operation,
};
use kube::core::{DynamicObject, Status};
use maintenance_actors::metrics::Metrics;
use maintenance_core::validation::{self, NodePresence, Outcome, Review, Verdict};
use maintenance_crds::{MaintenanceOperatorConfigSpec, NodeMaintenance};

use crate::serve::{Certificate, Limits, Server};

/// The path NVIDIA's operator serves the same webhook on, so that existing registrations work.
pub const PATH: &str = "/validate-maintenance-nvidia-com-v1alpha1-nodemaintenance";
/// The path of the MaintenanceOperatorConfig review (ours: NVIDIA's operator has none).
pub const CONFIG_PATH: &str = "/validate-maintenance-nvidia-com-v1alpha1-maintenanceoperatorconfig";
/// Bound on the node lookup, well inside the API server's webhook timeout (10 s by default), so
/// that a slow lookup ends in our clear error rather than the API server's timeout.
const NODE_LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// kube-apiserver's own bound on a request body (3 MiB): a NodeMaintenance is a few KiB, and no
/// object larger than the API server accepts can reach a review. A larger body is answered 413
/// without being read.
pub const MAX_BODY_BYTES: usize = 3 << 20;

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
    certificate: Certificate,
    state: Arc<Reviewer>,
}

impl Webhook {
    /// Reads the certificate and key named by `args`; `None` without `--webhook-addr`.
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
        Ok(Some(Webhook {
            addr,
            certificate: Certificate::from_files(cert, key, Server::Webhook).await?,
            state: Arc::new(Reviewer {
                nodes: Api::all(client),
                metrics,
            }),
        }))
    }

    pub async fn serve(self, max_connections: usize) -> anyhow::Result<()> {
        let Webhook {
            addr,
            certificate,
            state,
        } = self;
        let refused = state
            .metrics
            .process
            .connections_refused_total
            .with_label_values(&[Server::Webhook.as_str()]);
        // One handler: a review names its kind, so either path answers either kind.
        let app = Router::new()
            .route(PATH, post(validate))
            .route(CONFIG_PATH, post(validate))
            .with_state(state);
        tracing::info!(%addr, path = PATH, config_path = CONFIG_PATH, "serving the admission webhooks");
        let limits = Limits {
            max_connections,
            max_body_bytes: MAX_BODY_BYTES,
        };
        crate::serve::serve(
            addr,
            Server::Webhook,
            Some(certificate),
            app,
            limits,
            refused,
        )
        .await
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

/// The request of an AdmissionReview body, or why the body is none: a pure function of the
/// bytes (fuzzed in the tests below), so that no body can make the webhook panic.
fn read_review(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, String> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)
        .map_err(|err| format!("the body is no AdmissionReview: {err}"))?;
    if review.types.api_version != META_API_VERSION_V1 {
        return Err(format!(
            "AdmissionReview {:?} is not supported, only {META_API_VERSION_V1} (list only v1 in \
             admissionReviewVersions)",
            review.types.api_version
        ));
    }
    review
        .try_into()
        .map_err(|_| "the AdmissionReview has no request".to_string())
}

async fn validate(State(reviewer): State<Arc<Reviewer>>, body: Bytes) -> Response {
    let request = match read_review(&body) {
        Ok(request) => request,
        Err(problem) => {
            reviewer.count(validation::Operation::Other, Outcome::Error);
            return bad_request(problem);
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
    let kind = request.kind.kind.as_str();
    if operation == validation::Operation::Other
        || !matches!(kind, "NodeMaintenance" | "MaintenanceOperatorConfig")
    {
        tracing::warn!(
            kind = %request.kind.kind,
            operation = ?request.operation,
            "admission review of something else than a NodeMaintenance or \
             MaintenanceOperatorConfig CREATE or UPDATE; allowed unchecked (register the \
             webhooks for CREATE and UPDATE of these only)"
        );
        return (operation, Answer::Unchecked);
    }
    if kind == "MaintenanceOperatorConfig" {
        return (operation, answer_config(request));
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

/// The review of a MaintenanceOperatorConfig: no lookup, the spec alone decides.
fn answer_config(request: &AdmissionRequest<DynamicObject>) -> Answer {
    let spec_of =
        |object: Option<&DynamicObject>| -> Result<Option<MaintenanceOperatorConfigSpec>, String> {
            let Some(object) = object else {
                return Ok(None);
            };
            let spec = object.data.get("spec").cloned().unwrap_or_default();
            // An absent spec is an empty one (every field optional).
            let spec = if spec.is_null() {
                serde_json::json!({})
            } else {
                spec
            };
            serde_json::from_value(spec).map(Some).map_err(|err| {
                format!(
                    "MaintenanceOperatorConfig {}/{} in AdmissionReview {} cannot be read: {err}",
                    request.namespace.as_deref().unwrap_or_default(),
                    request.name,
                    request.uid
                )
            })
        };
    let spec = match spec_of(request.object.as_ref()) {
        Ok(Some(spec)) => spec,
        Ok(None) => {
            return Answer::Failed(
                StatusCode::BAD_REQUEST,
                format!("the AdmissionReview {} carries no object", request.uid),
            );
        }
        Err(err) => return Answer::Failed(StatusCode::BAD_REQUEST, err),
    };
    let old = match spec_of(request.old_object.as_ref()) {
        Ok(old) => old,
        Err(err) => return Answer::Failed(StatusCode::BAD_REQUEST, err),
    };
    let verdict = validation::review_config(&request.name, &spec, old.as_ref());
    if let Verdict::Denied { reason, message } = &verdict {
        tracing::info!(uid = %request.uid, %reason, %message, "refused a MaintenanceOperatorConfig");
    }
    Answer::Verdict(verdict)
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

    /// An AdmissionReview of `operation` on the `kind` (`resource`) `namespace/name`, with no
    /// object; tests add `object` and `oldObject` as they need.
    fn review_of(
        (kind, resource): (&str, &str),
        (namespace, name): (&str, &str),
        uid: &str,
        operation: &str,
    ) -> serde_json::Value {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "maintenance.nvidia.com", "version": "v1alpha1", "kind": kind},
                "resource": {"group": "maintenance.nvidia.com", "version": "v1alpha1", "resource": resource},
                "name": name,
                "namespace": namespace,
                "operation": operation,
                "userInfo": {},
            }
        })
    }

    /// [`review_of`] the NodeMaintenance `team-a/fw`.
    fn nm_review(uid: &str, operation: &str) -> serde_json::Value {
        review_of(
            ("NodeMaintenance", "nodemaintenances"),
            ("team-a", "fw"),
            uid,
            operation,
        )
    }

    fn request(operation: &str, object: serde_json::Value) -> AdmissionRequest<DynamicObject> {
        let mut review = nm_review("705ab4f5-6393-11e8-b7cc-42010a800002", operation);
        review["request"]["userInfo"] = json!({"username": "admin"});
        review["request"]["object"] = object;
        let review: AdmissionReview<DynamicObject> =
            serde_json::from_value(review).expect("a valid review");
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
        let mut review = nm_review("u1", "CREATE");
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
    async fn a_config_review_refuses_what_the_scheduler_cannot_use() {
        let review = |spec: serde_json::Value| {
            let mut review = review_of(
                ("MaintenanceOperatorConfig", "maintenanceoperatorconfigs"),
                ("maintenance-operator", "default"),
                "c1",
                "CREATE",
            );
            review["request"]["object"] = json!({
                "apiVersion": "maintenance.nvidia.com/v1alpha1",
                "kind": "MaintenanceOperatorConfig",
                "metadata": {"name": "default", "namespace": "maintenance-operator"},
                "spec": spec,
            });
            review.to_string()
        };
        let never = json!({"maintenanceWindows": [{"schedule": "0 0 31 2 *", "duration": "1h"}]});
        let (status, text, reviewer) = call(review(never).as_bytes()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let answer: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(answer["response"]["allowed"], false);
        assert_eq!(answer["response"]["status"]["code"], 422);
        let message = answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            message.contains("maintenanceWindows[0].schedule \"0 0 31 2 *\" never fires"),
            "{message}"
        );
        assert_eq!(counted(&reviewer, "create", "denied"), 1);

        let fine = json!({"maxParallelOperations": "10%"});
        let (status, text, reviewer) = call(review(fine).as_bytes()).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let answer: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(counted(&reviewer, "create", "allowed"), 1);
    }

    #[tokio::test]
    async fn an_update_is_decided_without_a_lookup() {
        let mut object = nm_object("node-7");
        object["spec"]["drainSpec"] = json!({"podSelector": "app in (web"});
        let mut review = nm_review("u2", "UPDATE");
        review["request"]["object"] = object;
        review["request"]["oldObject"] = nm_object("node-7");
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

    /// Any JSON value, nested a few levels: what a bad client could put in any field.
    fn any_json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_map(|f| json!(f)),
            ".{0,12}".prop_map(serde_json::Value::from),
            // Names the review reads, so that the generated objects reach the decoding paths.
            prop::sample::select(vec![
                "CREATE",
                "UPDATE",
                "NodeMaintenance",
                "admission.k8s.io/v1",
                "node-7",
            ])
            .prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::btree_map(
                    prop::sample::select(vec![
                        "apiVersion",
                        "kind",
                        "metadata",
                        "name",
                        "namespace",
                        "spec",
                        "nodeName",
                        "requestorID",
                        "drainSpec",
                        "podSelector",
                        "uid",
                        "operation",
                        "object",
                        "oldObject",
                        "status",
                        "x",
                    ])
                    .prop_map(String::from),
                    inner,
                    0..5,
                )
                .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
            ]
        })
    }

    /// Everything the webhook does with a body short of the node lookup: read, decode, review.
    fn review_body(body: &[u8]) {
        let Ok(request) = read_review(body) else {
            return;
        };
        let Ok(Some(object)) = decode(&request, request.object.as_ref()) else {
            return;
        };
        let _ = validation::node_to_look_up(&object);
        let _ = validation::review(
            &object,
            Review::Create {
                node: NodePresence::Exists,
            },
        );
        let old = decode(&request, request.old_object.as_ref()).ok().flatten();
        let verdict = validation::review(&object, Review::Update { old: old.as_ref() });
        let _ = serde_json::to_vec(&respond(&request, verdict).into_review());
    }

    proptest::proptest! {
        // A bounded run in `make test`: malformed bodies of every kind end in an answer, never a
        // panic (a panic would drop the connection and the API server would apply its
        // failurePolicy without a message).
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        #[test]
        fn fuzz_arbitrary_bytes_never_panic(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            review_body(&body);
        }

        #[test]
        fn fuzz_reviews_with_any_fields_never_panic(
            request in any_json(),
            object in any_json(),
            old in any_json(),
            operation in proptest::sample::select(vec!["CREATE", "UPDATE", "DELETE", "CONNECT", "X"]),
        ) {
            let mut review = nm_review("u", operation);
            review["request"]["object"] = object;
            review["request"]["oldObject"] = old;
            // Sometimes the whole request is replaced by garbage too.
            if let (Some(extra), Some(target)) = (request.as_object(), review["request"].as_object_mut()) {
                for (key, value) in extra {
                    target.insert(key.clone(), value.clone());
                }
            }
            review_body(review.to_string().as_bytes());
        }

        #[test]
        fn fuzz_truncated_and_corrupted_reviews_never_panic(cut in 0usize..600, flip in 0usize..600, byte in proptest::prelude::any::<u8>()) {
            let mut review = nm_review("u", "UPDATE");
            review["request"]["object"] = nm_object("node-7");
            review["request"]["oldObject"] = nm_object("node-7");
            let mut body = review.to_string().into_bytes();
            if flip < body.len() {
                body[flip] = byte;
            }
            body.truncate(cut.min(body.len()));
            review_body(&body);
        }
    }
}
