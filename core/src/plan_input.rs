//! The input of `maintenance-operator plan`: Nodes, NodeMaintenances and the
//! MaintenanceOperatorConfig read from YAML (several documents, or Lists as `kubectl get -o yaml`
//! writes them), checked, and planned with the operator's own scheduler. Pure: the command reads
//! the file or the cluster and prints the report.

use std::collections::HashMap;
use std::fmt;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use maintenance_crds::{
    DEFAULT_CONFIG_NAME, GROUP, MaintenanceOperatorConfigSpec, NodeMaintenance, VERSION,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::capacity::{CapacityCheck, CapacityObserver};
use crate::drainability::{PreferDrainable, blocked_requests};
use crate::gates::GateObservation;
use crate::scheduler::{Decision, Limits, ScheduleError, Snapshot, schedule_observed};

/// Where a NodeMaintenance without `metadata.namespace` would land with `kubectl apply`.
const DEFAULT_REQUEST_NAMESPACE: &str = "default";

/// The outcome of a dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanReport {
    pub decision: Decision,
    /// What the scheduler saw; the table takes each request's node and requestor from it.
    pub snapshot: Snapshot,
    /// Parts of the input that were ignored, and defaults that were assumed.
    pub notes: Vec<String>,
    /// The alert gate that holds every admission, if any (shown even with nothing Pending).
    pub gate_hold: Option<crate::gates::GateHold>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("{document}: {problem}")]
    InvalidDocument {
        document: DocumentRef,
        problem: String,
    },
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
}

/// Points a person at one object of the input: `document 3, item 2 (kind Node, name node-1)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentRef {
    /// 1-based, in the order of the `---` separated documents.
    pub document: usize,
    /// 1-based position inside a List document.
    pub item: Option<usize>,
    pub kind: Option<String>,
    pub name: Option<String>,
}

impl fmt::Display for DocumentRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(item) = self.item {
            write!(f, ", item {item}")?;
        }
        match (&self.kind, &self.name) {
            (Some(kind), Some(name)) => write!(f, " (kind {kind}, name {name})"),
            (Some(kind), None) => write!(f, " (kind {kind})"),
            (None, Some(name)) => write!(f, " (name {name})"),
            (None, None) => Ok(()),
        }
    }
}

impl DocumentRef {
    fn invalid(&self, problem: impl Into<String>) -> PlanError {
        PlanError::InvalidDocument {
            document: self.clone(),
            problem: problem.into(),
        }
    }
}
/// Plans one round at `now` from YAML: Nodes, NodeMaintenances and the `default`
/// MaintenanceOperatorConfig of `operator_namespace`, as several documents and/or Lists.
pub fn plan_from_yaml(
    text: &str,
    operator_namespace: &str,
    now: jiff::Timestamp,
) -> Result<PlanReport, PlanError> {
    let mut input = Input::new(operator_namespace);
    for (index, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let at = DocumentRef {
            document: index + 1,
            item: None,
            kind: None,
            name: None,
        };
        let value = Value::deserialize(document)
            .map_err(|error| at.invalid(format!("not valid YAML: {error}")))?;
        // `---` at the start or the end of a file makes an empty document.
        if !value.is_null() {
            input.add(value, at)?;
        }
    }
    input.plan(now)
}

/// What has been read so far, and where each object came from (for duplicate errors).
struct Input<'a> {
    operator_namespace: &'a str,
    nodes: Vec<Node>,
    node_documents: HashMap<String, DocumentRef>,
    requests: Vec<NodeMaintenance>,
    request_documents: HashMap<(String, String), DocumentRef>,
    config: Option<(DocumentRef, MaintenanceOperatorConfigSpec)>,
    notes: Vec<String>,
}

impl<'a> Input<'a> {
    fn new(operator_namespace: &'a str) -> Input<'a> {
        Input {
            operator_namespace,
            nodes: Vec::new(),
            node_documents: HashMap::new(),
            requests: Vec::new(),
            request_documents: HashMap::new(),
            config: None,
            notes: Vec::new(),
        }
    }

    fn add(&mut self, value: Value, mut at: DocumentRef) -> Result<(), PlanError> {
        let Value::Object(object) = value else {
            return Err(at.invalid(
                "expected a Kubernetes object (a mapping with apiVersion, kind and metadata)",
            ));
        };
        at.name = object
            .get("metadata")
            .and_then(|metadata| metadata.get("name"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let kind = match object.get("kind") {
            Some(Value::String(kind)) => kind.clone(),
            _ => {
                return Err(at.invalid(
                    "no kind: every document must be a Kubernetes object with apiVersion and kind",
                ));
            }
        };
        at.kind = Some(kind.clone());
        let api_version = object.get("apiVersion").and_then(Value::as_str);
        // A missing apiVersion is accepted: hand-written files often omit it.
        let api_version_is = |expected: &str| api_version.is_none_or(|v| v == expected);
        let maintenance_api_version = format!("{GROUP}/{VERSION}");

        match kind.as_str() {
            "Node" if api_version_is("v1") => self.add_node(object, at),
            "NodeMaintenance" if api_version_is(&maintenance_api_version) => {
                self.add_request(object, at)
            }
            "MaintenanceOperatorConfig" if api_version_is(&maintenance_api_version) => {
                self.add_config(object, at)
            }
            _ if kind.ends_with("List") && object.contains_key("items") => {
                self.add_list(object, &kind, at)
            }
            _ => {
                self.notes.push(format!(
                    "{at}: ignored; plan reads only Nodes, NodeMaintenances and MaintenanceOperatorConfigs"
                ));
                Ok(())
            }
        }
    }

    fn add_list(
        &mut self,
        mut list: Map<String, Value>,
        kind: &str,
        at: DocumentRef,
    ) -> Result<(), PlanError> {
        let items = match list.remove("items") {
            Some(Value::Array(items)) => items,
            Some(Value::Null) => Vec::new(),
            _ => return Err(at.invalid("items must be a list of objects")),
        };
        // The API server's typed lists (NodeList, ...) leave kind and apiVersion out of their items.
        let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
        let item_api_version = list.get("apiVersion").cloned();
        for (index, mut item) in items.into_iter().enumerate() {
            if let (Some(item_kind), Value::Object(fields)) = (item_kind, &mut item) {
                fields
                    .entry("kind")
                    .or_insert_with(|| Value::String(item_kind.to_string()));
                if let Some(api_version) = &item_api_version {
                    fields
                        .entry("apiVersion")
                        .or_insert_with(|| api_version.clone());
                }
            }
            let item_at = DocumentRef {
                document: at.document,
                item: Some(index + 1),
                kind: None,
                name: None,
            };
            self.add(item, item_at)?;
        }
        Ok(())
    }

    fn add_node(
        &mut self,
        mut object: Map<String, Value>,
        at: DocumentRef,
    ) -> Result<(), PlanError> {
        let metadata = metadata_with_name(&mut object, &at)?;
        let node = Node {
            spec: part(&mut object, "spec", &at)?,
            status: part(&mut object, "status", &at)?,
            metadata,
        };
        let name = node.metadata.name.clone().unwrap_or_default();
        if let Some(first) = self.node_documents.get(&name) {
            return Err(at.invalid(format!(
                "Node {name} appears twice (first in {first}); keep one of them"
            )));
        }
        self.node_documents.insert(name, at);
        self.nodes.push(node);
        Ok(())
    }

    fn add_request(
        &mut self,
        mut object: Map<String, Value>,
        at: DocumentRef,
    ) -> Result<(), PlanError> {
        let mut metadata = metadata_with_name(&mut object, &at)?;
        let namespace = metadata
            .namespace
            .get_or_insert_with(|| DEFAULT_REQUEST_NAMESPACE.to_string())
            .clone();
        let spec: maintenance_crds::NodeMaintenanceSpec =
            part(&mut object, "spec", &at)?.ok_or_else(|| at.invalid("missing field spec"))?;
        for (field, value) in [
            ("spec.nodeName", &spec.node_name),
            ("spec.requestorID", &spec.requestor_id),
        ] {
            if value.is_empty() {
                return Err(at.invalid(format!("{field} is empty")));
            }
        }
        let request = NodeMaintenance {
            status: part(&mut object, "status", &at)?,
            metadata,
            spec,
        };
        let key = (namespace, request.metadata.name.clone().unwrap_or_default());
        if let Some(first) = self.request_documents.get(&key) {
            return Err(at.invalid(format!(
                "NodeMaintenance {}/{} appears twice (first in {first}); keep one of them",
                key.0, key.1
            )));
        }
        self.request_documents.insert(key, at);
        self.requests.push(request);
        Ok(())
    }

    fn add_config(
        &mut self,
        mut object: Map<String, Value>,
        at: DocumentRef,
    ) -> Result<(), PlanError> {
        let metadata = metadata_with_name(&mut object, &at)?;
        let name = metadata.name.as_deref().unwrap_or_default();
        if name != DEFAULT_CONFIG_NAME {
            self.notes.push(format!(
                "{at}: ignored; only the config named {DEFAULT_CONFIG_NAME:?} counts"
            ));
            return Ok(());
        }
        if let Some(namespace) = metadata
            .namespace
            .as_deref()
            .filter(|namespace| *namespace != self.operator_namespace)
        {
            self.notes.push(format!(
                "{at}: ignored; it is in namespace {namespace}, the operator's is {} (see --namespace)",
                self.operator_namespace
            ));
            return Ok(());
        }
        let spec: MaintenanceOperatorConfigSpec =
            part(&mut object, "spec", &at)?.unwrap_or_default();
        if let Some((first, _)) = &self.config {
            return Err(at.invalid(format!(
                "a second MaintenanceOperatorConfig {DEFAULT_CONFIG_NAME:?} (first in {first}); keep one of them"
            )));
        }
        self.config = Some((at, spec));
        Ok(())
    }

    fn plan(self, now: jiff::Timestamp) -> Result<PlanReport, PlanError> {
        let config = self.config.as_ref().map(|(_, spec)| spec);
        match plan_objects(
            &self.nodes,
            &self.requests,
            config,
            self.operator_namespace,
            now,
        ) {
            Ok(mut report) => {
                let mut notes = self.notes;
                notes.append(&mut report.notes);
                report.notes = notes;
                Ok(report)
            }
            // Only a config can hold a bad limit, window, budget or blackout: point at its
            // document rather than the cluster.
            Err(error) if self.config.is_some() => {
                let at = self.config.map(|(at, _)| at).unwrap_or(DocumentRef {
                    document: 0,
                    item: None,
                    kind: None,
                    name: None,
                });
                Err(match error {
                    ScheduleError::InvalidLimit(problem) => {
                        at.invalid(format!("invalid spec.{problem}"))
                    }
                    ScheduleError::InvalidWindow(problem) => {
                        at.invalid(format!("invalid spec.{problem}"))
                    }
                    ScheduleError::InvalidBudget(problem) => {
                        at.invalid(format!("invalid spec.budgets: {problem}"))
                    }
                    ScheduleError::InvalidBlackout(problem) => {
                        at.invalid(format!("invalid spec.{problem}"))
                    }
                })
            }
            Err(error) => Err(error.into()),
        }
    }
}

fn no_config_note(operator_namespace: &str) -> String {
    format!(
        "no MaintenanceOperatorConfig {DEFAULT_CONFIG_NAME:?} in namespace {operator_namespace}: \
         using the defaults (maxParallelOperations=1, no maxUnavailable)"
    )
}

fn metadata_with_name(
    object: &mut Map<String, Value>,
    at: &DocumentRef,
) -> Result<ObjectMeta, PlanError> {
    let metadata: ObjectMeta =
        part(object, "metadata", at)?.ok_or_else(|| at.invalid("missing field metadata.name"))?;
    if metadata.name.as_deref().is_none_or(str::is_empty) {
        return Err(at.invalid("missing field metadata.name"));
    }
    Ok(metadata)
}

/// Decodes one top-level part (metadata, spec, status) so that an error can say which part is wrong.
fn part<T: DeserializeOwned>(
    object: &mut Map<String, Value>,
    name: &str,
    at: &DocumentRef,
) -> Result<Option<T>, PlanError> {
    match object.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => serde_json::from_value(value).map(Some).map_err(|error| {
            let message = error.to_string();
            // serde names a missing field without its path; the fields that can be missing at
            // all sit directly in the part, so the path is `part.field`.
            let problem = match message
                .strip_prefix("missing field `")
                .and_then(|rest| rest.strip_suffix('`'))
            {
                Some(field) if name == "spec" => format!("missing field {name}.{field}"),
                _ => format!("{name}: {message}"),
            };
            at.invalid(problem)
        }),
    }
}

/// Plans one round at `now` from objects already read (from the cluster, or from YAML).
pub fn plan_objects(
    nodes: &[Node],
    requests: &[NodeMaintenance],
    config: Option<&MaintenanceOperatorConfigSpec>,
    operator_namespace: &str,
    now: jiff::Timestamp,
) -> Result<PlanReport, ScheduleError> {
    plan_objects_with(nodes, requests, config, None, None, operator_namespace, now)
}

/// The pods and the PodDisruptionBudgets that `preferDrainable` (the pods of the nodes of Pending
/// requests, at least) and `checkCapacity` (every pod of the cluster) look at.
pub struct DrainObservations<'a> {
    pub pods: &'a [Pod],
    pub pdbs: &'a [PodDisruptionBudget],
}

/// [`plan_objects`] with what `preferDrainable` needs and what the alert gates answered; `None`:
/// not read, not asked (then the plan says so).
pub fn plan_objects_with(
    nodes: &[Node],
    requests: &[NodeMaintenance],
    config: Option<&MaintenanceOperatorConfigSpec>,
    observed: Option<DrainObservations<'_>>,
    gates: Option<&[GateObservation]>,
    operator_namespace: &str,
    now: jiff::Timestamp,
) -> Result<PlanReport, ScheduleError> {
    let snapshot = Snapshot::from_objects(nodes, requests);
    let mut prefer = PreferDrainable::from_config(config);
    let mut notes = if config.is_none() {
        vec![no_config_note(operator_namespace)]
    } else {
        Vec::new()
    };
    let mut capacity = CapacityCheck::from_config(config);
    if capacity.enabled {
        match &observed {
            Some(observed) => {
                let mut observer = CapacityObserver::new(requests, None);
                for pod in observed.pods {
                    observer.add_pod(pod);
                }
                capacity = observer.finish(nodes);
            }
            None => {
                capacity.enabled = false;
                notes.push(
                    "admission.checkCapacity is on, but this plan read no pods (planning from a \
                     file): capacity is not checked"
                        .to_string(),
                );
            }
        }
    }
    if prefer.enabled {
        match observed {
            Some(observed) => {
                prefer.blocked = blocked_requests(requests, observed.pods, observed.pdbs, None);
            }
            None => notes.push(
                "admission.preferDrainable is on, but this plan read no pods or \
                 PodDisruptionBudgets (planning from a file): requests are shown in their plain \
                 order, without drain-aware reordering"
                    .to_string(),
            ),
        }
    }
    let mut limits = Limits::from_config(config);
    let gate_specs = config.map(|c| c.gates()).unwrap_or_default();
    match gates {
        Some(gates) => limits.gate_hold = crate::gates::hold(gate_specs, gates),
        None if !gate_specs.is_empty() => notes.push(
            "admission.gates are set, but this plan asked no Prometheus (planning from a file): \
             each gate counts as holding, as the operator counts a gate it has not asked yet"
                .to_string(),
        ),
        None => {}
    }
    let decision = schedule_observed(&snapshot, &limits, &prefer, &capacity, now)?;
    Ok(PlanReport {
        decision,
        snapshot,
        notes,
        gate_hold: limits.gate_hold,
    })
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests {
    use super::*;

    const OPERATOR_NAMESPACE: &str = "maintenance-operator";

    fn node_yaml(name: &str, ready: bool, unschedulable: bool) -> String {
        format!(
            "apiVersion: v1
kind: Node
metadata:
  name: {name}
spec:
  unschedulable: {unschedulable}
status:
  conditions:
  - type: Ready
    status: \"{}\"
    reason: KubeletReady
    lastTransitionTime: \"2025-01-01T00:00:00Z\"
",
            if ready { "True" } else { "False" }
        )
    }

    /// A NodeMaintenance; `phase` None leaves the status out (Pending).
    fn request_yaml(name: &str, node: &str, requestor: &str, phase: Option<&str>) -> String {
        let status = phase
            .map(|phase| {
                format!(
                    "status:
  conditions:
  - type: Ready
    status: \"False\"
    reason: {phase}
    message: \"\"
    lastTransitionTime: \"2025-01-01T00:00:00Z\"
"
                )
            })
            .unwrap_or_default();
        format!(
            "apiVersion: maintenance.nvidia.com/v1alpha1
kind: NodeMaintenance
metadata:
  name: {name}
  namespace: team
  creationTimestamp: \"2025-01-01T00:00:00Z\"
spec:
  requestorID: {requestor}
  nodeName: {node}
{status}"
        )
    }

    fn config_yaml(name: &str, namespace: &str, spec: &str) -> String {
        format!(
            "apiVersion: maintenance.nvidia.com/v1alpha1
kind: MaintenanceOperatorConfig
metadata:
  name: {name}
  namespace: {namespace}
spec:
{spec}"
        )
    }

    fn documents(parts: &[String]) -> String {
        parts
            .iter()
            .map(|part| format!("---\n{part}"))
            .collect::<String>()
    }

    /// A fixed time: these inputs have no windows, so any time gives the same plan.
    fn now() -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_800_000_000).unwrap()
    }

    /// Turns documents into one `kind: List` with each object indented as an item.
    fn list(parts: &[String]) -> String {
        let mut out =
            "apiVersion: v1\nkind: List\nmetadata:\n  resourceVersion: \"\"\nitems:\n".to_string();
        for part in parts {
            for (index, line) in part.lines().enumerate() {
                let prefix = if index == 0 { "- " } else { "  " };
                out.push_str(&format!("{prefix}{line}\n"));
            }
        }
        out
    }

    /// n healthy nodes `node-0` .. and a Pending request `r<i>` on each of the first `pending`.
    fn cluster(node_count: usize, unavailable: &[usize], pending: &[usize]) -> Vec<String> {
        let mut parts: Vec<String> = (0..node_count)
            .map(|i| node_yaml(&format!("node-{i}"), !unavailable.contains(&i), false))
            .collect();
        parts.extend(
            pending
                .iter()
                .map(|i| request_yaml(&format!("r{i}"), &format!("node-{i}"), "fw", None)),
        );
        parts
    }

    fn limits_config(max_parallel: &str, max_unavailable: &str) -> String {
        config_yaml(
            "default",
            OPERATOR_NAMESPACE,
            &format!(
                "  maxParallelOperations: {max_parallel}\n  maxUnavailable: {max_unavailable}\n"
            ),
        )
    }

    fn plan(text: &str) -> PlanReport {
        plan_from_yaml(text, OPERATOR_NAMESPACE, now()).unwrap_or_else(|error| panic!("{error}"))
    }

    fn scheduled(report: &PlanReport) -> Vec<String> {
        report
            .decision
            .scheduled
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn error_of(text: &str) -> String {
        match plan_from_yaml(text, OPERATOR_NAMESPACE, now()) {
            Ok(report) => panic!("expected an error, got {report:#?}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn prefer_drainable_from_a_file_says_that_it_read_no_pods() {
        let mut parts = cluster(2, &[], &[0, 1]);
        parts.push(config_yaml(
            "default",
            OPERATOR_NAMESPACE,
            "  admission:\n    preferDrainable: true\n",
        ));
        let report = plan(&documents(&parts));
        assert_eq!(scheduled(&report), ["team/r0"]);
        assert_eq!(report.notes.len(), 1, "{:?}", report.notes);
        assert!(
            report.notes[0].contains("read no pods or PodDisruptionBudgets"),
            "{:?}",
            report.notes
        );
    }

    #[test]
    fn reads_several_documents() {
        let mut parts = cluster(3, &[], &[0, 1]);
        parts.push(limits_config("2", "1"));
        let report = plan(&documents(&parts));
        assert_eq!(report.snapshot.nodes.len(), 3);
        assert_eq!(report.decision.available_slots, 2);
        assert_eq!(report.decision.can_become_unavailable, Some(1));
        assert_eq!(scheduled(&report), ["team/r0"]);
        assert!(
            report.decision.waiting[0]
                .reason
                .starts_with("maxUnavailable reached")
        );
        assert!(report.notes.is_empty(), "{:?}", report.notes);
    }

    #[test]
    fn reads_a_kubectl_list_of_mixed_kinds() {
        let mut parts = cluster(3, &[], &[0, 1]);
        parts.push(limits_config("2", "1"));
        let report = plan(&list(&parts));
        assert_eq!(report.snapshot.nodes.len(), 3);
        assert_eq!(report.snapshot.requests.len(), 2);
        assert_eq!(scheduled(&report), ["team/r0"]);
    }

    #[test]
    fn reads_typed_lists_whose_items_carry_no_kind() {
        let text = "apiVersion: v1
kind: NodeList
items:
- metadata:
    name: node-0
  status:
    conditions:
    - type: Ready
      status: \"True\"
      lastTransitionTime: \"2025-01-01T00:00:00Z\"
---
apiVersion: maintenance.nvidia.com/v1alpha1
kind: NodeMaintenanceList
items:
- metadata:
    name: r0
    namespace: team
  spec:
    requestorID: fw
    nodeName: node-0
";
        let report = plan(text);
        assert_eq!(scheduled(&report), ["team/r0"]);
    }

    #[test]
    fn json_has_exactly_the_documented_shape() {
        let mut parts = cluster(2, &[], &[0, 1]);
        parts.push(limits_config("1", "\"50%\""));
        let report = plan(&documents(&parts));
        let json = serde_json::to_value(&report.decision).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "availableSlots": 1,
                "canBecomeUnavailable": 1,
                "scheduled": ["team/r0"],
                "waiting": [{
                    "name": "team/r1",
                    "reason": "no free slot: maxParallelOperations=1 and 0 nodes are in maintenance, 1 more admitted in this round",
                    "cause": "maxParallelOperations",
                }],
            })
        );

        let unlimited = plan(&documents(&cluster(1, &[], &[])));
        let json = serde_json::to_value(&unlimited.decision).unwrap();
        assert_eq!(json["canBecomeUnavailable"], Value::Null);
        let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 4);
    }

    #[test]
    fn a_request_without_status_is_pending_and_one_with_status_holds_its_node() {
        let parts = vec![
            node_yaml("node-0", true, false),
            node_yaml("node-1", true, false),
            request_yaml("running", "node-0", "fw", Some("Draining")),
            request_yaml("new", "node-1", "fw", None),
        ];
        let report = plan(&documents(&parts));
        assert_eq!(report.decision.available_slots, 0);
        assert_eq!(report.decision.waiting.len(), 1);
        assert_eq!(report.decision.waiting[0].key.to_string(), "team/new");
    }

    #[test]
    fn a_bad_document_is_named_in_the_error() {
        let missing_node_name = "apiVersion: maintenance.nvidia.com/v1alpha1
kind: NodeMaintenance
metadata:
  name: foo
  namespace: team
spec:
  requestorID: fw
";
        let parts = vec![
            node_yaml("node-0", true, false),
            node_yaml("node-1", true, false),
            missing_node_name.to_string(),
        ];
        assert_eq!(
            error_of(&documents(&parts)),
            "document 3 (kind NodeMaintenance, name foo): missing field spec.nodeName"
        );
        assert_eq!(
            error_of(&list(&parts)),
            "document 1, item 3 (kind NodeMaintenance, name foo): missing field spec.nodeName"
        );
    }

    #[test]
    fn malformed_input_errors_instead_of_panicking() {
        let cases = [
            ("kind: Node\nmetadata: [", "document 1: not valid YAML"),
            ("just a string", "document 1: expected a Kubernetes object"),
            ("metadata:\n  name: x\n", "document 1 (name x): no kind"),
            (
                "kind: Node\nmetadata: {}\n",
                "document 1 (kind Node): missing field metadata.name",
            ),
            (
                "kind: Node\nmetadata:\n  name: n\nspec:\n  unschedulable: maybe\n",
                "document 1 (kind Node, name n): spec: invalid type",
            ),
            (
                "kind: NodeMaintenance\nmetadata:\n  name: m\n",
                "document 1 (kind NodeMaintenance, name m): missing field spec",
            ),
            (
                "kind: NodeMaintenance\nmetadata:\n  name: m\nspec:\n  nodeName: n\n  requestorID: \"\"\n",
                "document 1 (kind NodeMaintenance, name m): spec.requestorID is empty",
            ),
            (
                "kind: List\nitems: 3\n",
                "document 1 (kind List): items must be a list",
            ),
            (
                "kind: Node\nmetadata:\n  name: n\n---\nkind: Node\nmetadata:\n  name: n\n",
                "document 2 (kind Node, name n): Node n appears twice (first in document 1 (kind Node, name n))",
            ),
        ];
        for (text, expected) in cases {
            let error = error_of(text);
            assert!(error.starts_with(expected), "{text:?}: {error}");
        }
    }

    #[test]
    fn a_bad_limit_names_the_config_document() {
        let mut parts = cluster(2, &[], &[0]);
        parts.push(limits_config("\"many\"", "1"));
        let error = error_of(&documents(&parts));
        assert_eq!(
            error,
            "document 4 (kind MaintenanceOperatorConfig, name default): invalid \
             spec.maxParallelOperations: \"many\" is neither a non-negative integer nor a \
             percentage like \"10%\""
        );
    }

    #[test]
    fn other_kinds_and_other_configs_are_ignored_with_a_note() {
        let mut parts = cluster(2, &[], &[0, 1]);
        parts.push("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n".to_string());
        parts.push(
            "apiVersion: nodemaintenance.medik8s.io/v1beta1\nkind: NodeMaintenance\nmetadata:\n  name: other\n"
                .to_string(),
        );
        parts.push(config_yaml(
            "custom",
            OPERATOR_NAMESPACE,
            "  maxParallelOperations: 5\n",
        ));
        parts.push(config_yaml(
            "default",
            "elsewhere",
            "  maxParallelOperations: 5\n",
        ));
        let report = plan(&documents(&parts));
        // Neither config counts, so the default of one operation applies.
        assert_eq!(report.decision.available_slots, 1);
        assert_eq!(report.notes.len(), 5, "{:#?}", report.notes);
        assert!(report.notes[0].starts_with("document 5 (kind Pod, name web): ignored"));
        assert!(
            report.notes[1].starts_with("document 6 (kind NodeMaintenance, name other): ignored")
        );
        assert!(report.notes[3].contains("namespace elsewhere"));
        assert!(report.notes[4].contains("using the defaults"));
    }

    #[test]
    fn a_config_without_namespace_counts() {
        let mut parts = cluster(3, &[], &[0, 1, 2]);
        parts.push(
            "apiVersion: maintenance.nvidia.com/v1alpha1\nkind: MaintenanceOperatorConfig\n\
             metadata:\n  name: default\nspec:\n  maxParallelOperations: 3\n"
                .to_string(),
        );
        assert_eq!(plan(&documents(&parts)).decision.scheduled.len(), 3);
    }

    #[test]
    fn worked_example_two_parallel_five_pending() {
        let mut parts = cluster(10, &[], &[0, 1, 2, 3, 4]);
        parts.push(limits_config("2", "5"));
        let report = plan(&documents(&parts));
        assert_eq!(report.decision.scheduled.len(), 2);
        assert_eq!(report.decision.waiting.len(), 3);
    }

    #[test]
    fn worked_example_two_unavailable_leave_one() {
        let mut parts = cluster(10, &[0, 1], &[2, 3, 4]);
        parts.push(limits_config("5", "3"));
        let report = plan(&documents(&parts));
        assert_eq!(report.decision.can_become_unavailable, Some(1));
        assert_eq!(report.decision.scheduled.len(), 1);
    }

    #[test]
    fn worked_examples_three_slots_one_unavailable() {
        let mut on_unavailable = cluster(10, &[0, 1], &[0, 1, 2]);
        on_unavailable.push(limits_config("3", "3"));
        let report = plan(&documents(&on_unavailable));
        assert_eq!(report.decision.available_slots, 3);
        assert_eq!(report.decision.can_become_unavailable, Some(1));
        assert_eq!(report.decision.scheduled.len(), 3);

        let mut on_available = cluster(10, &[0, 1], &[2, 3, 4]);
        on_available.push(limits_config("3", "3"));
        assert_eq!(plan(&documents(&on_available)).decision.scheduled.len(), 1);
    }

    #[test]
    fn worked_example_max_unavailable_zero() {
        // node-0 is cordoned (but Ready): its request proceeds, node-2's does not.
        let mut parts = vec![
            node_yaml("node-0", true, true),
            node_yaml("node-1", true, false),
            node_yaml("node-2", true, false),
        ];
        parts.push(request_yaml("r0", "node-0", "fw", None));
        parts.push(request_yaml("r2", "node-2", "fw", None));
        parts.push(limits_config("5", "0"));
        let report = plan(&documents(&parts));
        assert_eq!(scheduled(&report), ["team/r0"]);
        assert!(
            report.decision.waiting[0]
                .reason
                .starts_with("maxUnavailable reached")
        );
    }

    #[test]
    fn worked_example_percentages() {
        let mut parts = cluster(10, &[], &[]);
        parts.push(limits_config("\"15%\"", "\"15%\""));
        let report = plan(&documents(&parts));
        assert_eq!(report.decision.available_slots, 2);
        assert_eq!(report.decision.can_become_unavailable, Some(1));
    }
}
