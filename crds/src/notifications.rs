//! `spec.notifications` of the config: webhooks told of each request's lifecycle events. What an
//! event says and who gets it is decided in `maintenance_core::notifications`.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One receiver: a URL (or a Secret holding it) and the events it subscribes to.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.url) || has(self.secretRef)").message("set url, or secretRef naming a Secret whose key `url` holds the webhook's URL"))]
pub struct Notification {
    /// Names the receiver in logs and metrics; unique among the receivers.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(DNS_LABEL_RULE).message(DNS_LABEL_MESSAGE))]
    pub name: String,

    /// Where the events are POSTed: an `http://` or `https://` URL. A key `url` of `secretRef`
    /// overrides it (a Slack or Teams incoming-webhook URL is itself a secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 8, max = 2048))]
    #[x_kube(validation = Rule::new(URL_RULE).message(URL_MESSAGE))]
    pub url: Option<String>,

    /// The events this receiver gets, each at most once in the list.
    #[schemars(length(min = 1, max = 6), extend("x-kubernetes-list-type" = "set"))]
    pub events: Vec<NotificationEvent>,

    /// A Secret in the operator's namespace: its key `url` replaces `url`, its key `token` is
    /// sent as `Authorization: Bearer <token>`. Read at each delivery, so a rotation applies at
    /// once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
}

/// A Secret in the operator's namespace, by name.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN_RULE).message(DNS_SUBDOMAIN_MESSAGE))]
    pub name: String,
}

/// A lifecycle event of a request.
// Plain comments on the variants: doc comments would make the schema a `oneOf`, not an `enum`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotificationEvent {
    // The scheduler admitted the request (Pending -> Scheduled).
    Admitted,
    // The node is cordoned and drained: the requestor may start its work.
    Ready,
    // The request was deleted and the operator let go of the node: uncordoned (if it cordoned
    // it) and its finalizer removed.
    Released,
    // The operator set the request's `Failed` condition (a drain timed out, an invalid spec).
    Failed,
    // The request gave up its slot to let other requests through.
    Yielded,
    // Garbage collection deleted the request (Ready too long, or its node gone).
    GarbageCollected,
}

impl NotificationEvent {
    pub const ALL: [NotificationEvent; 6] = [
        NotificationEvent::Admitted,
        NotificationEvent::Ready,
        NotificationEvent::Released,
        NotificationEvent::Failed,
        NotificationEvent::Yielded,
        NotificationEvent::GarbageCollected,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NotificationEvent::Admitted => "Admitted",
            NotificationEvent::Ready => "Ready",
            NotificationEvent::Released => "Released",
            NotificationEvent::Failed => "Failed",
            NotificationEvent::Yielded => "Yielded",
            NotificationEvent::GarbageCollected => "GarbageCollected",
        }
    }
}

impl std::fmt::Display for NotificationEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Most receivers in `spec.notifications` (the schema's `maxItems`).
pub const MAX_NOTIFICATION_RECEIVERS: usize = 16;

const DNS_LABEL_RULE: &str = "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')";
const DNS_LABEL_MESSAGE: &str = "must be a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit, like \"ops-slack\"";
// The host part is required; the rest is the receiver's business.
const URL_RULE: &str = "self.matches('^https?://[^/?#\\\\s]+([/?#]\\\\S*)?$')";
const URL_MESSAGE: &str =
    "must be an http:// or https:// URL with a host, like \"https://hooks.slack.com/services/...\"";
const DNS_SUBDOMAIN_RULE: &str =
    "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')";
const DNS_SUBDOMAIN_MESSAGE: &str = "must be the name of a Secret in the operator's namespace: lowercase letters, digits, '-' and '.'";
