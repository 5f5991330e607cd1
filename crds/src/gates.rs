//! `spec.admission.gates` of the config: Prometheus queries that hold new admissions while they
//! return anything (an alert firing). What a result means is decided in `maintenance_core::gates`.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::SecretRef;

/// Default for a gate's `timeoutSeconds`.
pub const DEFAULT_GATE_TIMEOUT_SECONDS: i32 = 10;
/// Most gates in `spec.admission.gates` (the schema's `maxItems`).
pub const MAX_GATES: usize = 16;

/// One alert gate: while its query returns a non-empty result, nothing new is admitted.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Gate {
    /// Names the gate in Pending messages, `plan` and metrics; unique among the gates.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(DNS_LABEL_RULE).message(DNS_LABEL_MESSAGE))]
    pub name: String,

    /// The Prometheus instant query that holds admissions while it returns anything.
    pub prometheus: PrometheusGate,

    /// How long one query may take before it counts as failed (and holds admissions), in
    /// seconds. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 10), range(min = 1, max = 60))]
    pub timeout_seconds: Option<i32>,
}

impl Gate {
    pub fn timeout(&self) -> std::time::Duration {
        let seconds = self
            .timeout_seconds
            .unwrap_or(DEFAULT_GATE_TIMEOUT_SECONDS)
            .clamp(1, 60);
        std::time::Duration::from_secs(u64::from(seconds.unsigned_abs()))
    }
}

/// Where and what to ask Prometheus (or anything serving its HTTP API, such as Thanos).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusGate {
    /// The base URL of the Prometheus HTTP API, like `http://prometheus.monitoring:9090`; the
    /// query goes to `<url>/api/v1/query`.
    #[schemars(length(min = 8, max = 2048))]
    #[x_kube(validation = Rule::new(URL_RULE).message(URL_MESSAGE))]
    pub url: String,

    /// A PromQL instant query, like `ALERTS{alertname="KubeNodeNotReady",alertstate="firing"}`:
    /// any series it returns holds admissions.
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = Rule::new("self.trim() != ''").message("must be a PromQL query, like ALERTS{alertstate=\"firing\"}"))]
    pub query: String,

    /// A Secret in the operator's namespace: its key `token` is sent as `Authorization: Bearer
    /// <token>`, its key `ca.crt` (PEM) is trusted for https besides the public roots. Read at
    /// each query, so a rotation applies at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,

    /// Accept any certificate from an https URL (a self-signed one). Default false; prefer
    /// `ca.crt` in `secretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_tls_verify: Option<bool>,
}

const DNS_LABEL_RULE: &str = "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')";
const DNS_LABEL_MESSAGE: &str = "must be a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit, like \"node-alerts\"";
const URL_RULE: &str = "self.matches('^https?://[^/?#\\\\s]+([/?#]\\\\S*)?$')";
const URL_MESSAGE: &str =
    "must be an http:// or https:// URL with a host, like \"http://prometheus.monitoring:9090\"";
