//! ValidatingAdmissionPolicies that make the API server refuse one kind of node update, for the
//! tests of what the operator does when a call of its is refused.

use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// What a policy refuses: node UPDATEs for which the CEL `expression` (over `object` and
/// `oldObject`) is false, answered with `message`.
pub struct Rule<'a> {
    pub expression: &'a str,
    pub message: &'a str,
}

/// A policy, bound to the nodes that carry a label, that refuses the node UPDATEs for which a CEL
/// expression is false; deleted (in the background) on drop.
pub struct NodeUpdatePolicy {
    client: Client,
    name: String,
}

impl NodeUpdatePolicy {
    /// Refuses by `rule` the UPDATEs of nodes labelled `label`. The API server loads policies
    /// asynchronously: this returns once a dry run of the merge patch `probe` on `node` (which
    /// must carry the label) is refused with the rule's message, or fails after `timeout`.
    pub async fn create(
        client: &Client,
        name: &str,
        label: (&str, &str),
        rule: Rule<'_>,
        node: &str,
        probe: serde_json::Value,
        timeout: Duration,
    ) -> Result<NodeUpdatePolicy> {
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": { "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["UPDATE"], "resources": ["nodes"]
                }] },
                "validations": [{ "expression": rule.expression, "message": rule.message }]
            }
        }))?;
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": { "objectSelector": { "matchLabels": { label.0: label.1 } } }
            }
        }))?;
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .with_context(|| format!("creating the ValidatingAdmissionPolicy {name}"))?;
        let guard = NodeUpdatePolicy {
            client: client.clone(),
            name: name.to_string(),
        };
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .with_context(|| format!("creating the ValidatingAdmissionPolicyBinding {name}"))?;
        let nodes: Api<Node> = Api::all(client.clone());
        let dry_run = PatchParams {
            dry_run: true,
            ..Default::default()
        };
        super::wait_for(
            &format!("the policy {name} to refuse {probe} on {node}"),
            timeout,
            || async {
                match nodes.patch(node, &dry_run, &Patch::Merge(&probe)).await {
                    Ok(_) => Ok(None),
                    Err(err) => match super::api_error(&err) {
                        Some((_, answer)) if answer.contains(rule.message) => Ok(Some(())),
                        _ => Err(err.into()),
                    },
                }
            },
        )
        .await?;
        Ok(guard)
    }
}

impl Drop for NodeUpdatePolicy {
    fn drop(&mut self) {
        let (client, name) = (self.client.clone(), self.name.clone());
        // Best effort: a leftover policy binds only to its test's label.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
                    .delete(&name, &Default::default())
                    .await;
                let _ = Api::<ValidatingAdmissionPolicy>::all(client)
                    .delete(&name, &Default::default())
                    .await;
            });
        }
    }
}
