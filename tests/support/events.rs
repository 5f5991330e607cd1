//! The Events the operator writes about requests and nodes.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams};

use crate::wait_for;

/// The Events about object `name` in `ns` (they outlive it), oldest first.
pub async fn events_about(client: &Client, ns: &str, name: &str) -> Result<Vec<Event>> {
    let lp = ListParams::default().fields(&format!("regarding.name={name}"));
    let mut events = Api::<Event>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .with_context(|| format!("listing the events about {ns}/{name}"))?
        .items;
    events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    Ok(events)
}

/// The phase an Event announces (reason `ConditionChanged`, as NVIDIA's, with the phase as the
/// action and at the start of the note), or the Event's own reason for every other Event.
pub fn phase_or_reason(event: &Event) -> Option<String> {
    let reason = event.reason.clone()?;
    if reason != "ConditionChanged" {
        return Some(reason);
    }
    let phase = event.action.clone()?;
    let note = event.note.as_deref().unwrap_or_default();
    // The note agrees with the action, or the Event would mislead `kubectl get events` readers.
    note.starts_with(&phase).then_some(phase)
}

/// What the Events about request `name` announce (see [`phase_or_reason`]), oldest first.
pub async fn event_reasons(client: &Client, ns: &str, name: &str) -> Result<Vec<String>> {
    Ok(events_about(client, ns, name)
        .await?
        .iter()
        .filter_map(phase_or_reason)
        .collect())
}

/// Waits for the first Event with `reason` about object `name` in `ns`.
pub async fn wait_event(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
    timeout: Duration,
) -> Result<Event> {
    let what = format!("an Event {reason} about {ns}/{name}");
    wait_for(&what, timeout, || async {
        Ok(events_about(client, ns, name)
            .await?
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason)))
    })
    .await
}
