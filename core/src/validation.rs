//! What the validating admission webhook answers for a NodeMaintenance, decided from the object
//! and, on CREATE, from whether its node exists (the caller looks the node up).
//!
//! NVIDIA's operator refuses a CREATE whose node does not exist. We do the same, and also refuse
//! what the operator could never carry out: a `podSelector` that is no label selector and a
//! `byResourceNameRegex` that is no regular expression. Without the webhook such a request is
//! admitted by the API server and only later marked `Failed` with reason `InvalidSpec`; with it,
//! the requestor hears at once, with the same message.
//!
//! On UPDATE the node is not looked up (`spec.nodeName` is immutable), and a spec problem that
//! the stored object already had, unchanged, is only a warning: refusing it would block every
//! later edit of an object admitted before the webhook existed, including the requestor's own
//! release of it (removing `additionalRequestors`).

use std::fmt;

use maintenance_crds::{
    DEFAULT_CONFIG_NAME, DrainSpec, MaintenanceOperatorConfigSpec, NODE_GROUP_LABEL,
    NODE_GROUP_SIZE_ANNOTATION, NodeMaintenance, WaitForPodCompletionSpec,
};
use regex::Regex;

use crate::drain_plan::DrainPlanError;
use crate::label_selector::ParsedSelector;
use crate::scheduler::{Limits, config_problems};

/// The request under review, with what the caller observed for it.
#[derive(Clone, Copy, Debug)]
pub enum Review<'a> {
    /// A new request, and whether the node named by `spec.nodeName` exists.
    Create { node: NodePresence },
    /// A changed request and the stored object before the change (the API server always sends
    /// it on UPDATE; `None` only if it did not, and then nothing is ratcheted).
    Update { old: Option<&'a NodeMaintenance> },
}

impl Review<'_> {
    pub fn operation(&self) -> Operation {
        match self {
            Review::Create { .. } => Operation::Create,
            Review::Update { .. } => Operation::Update,
        }
    }
}

/// The operation of a review as the metric labels it. The webhook is registered for CREATE and
/// UPDATE only; anything else (a hand-edited registration) is `Other` and allowed unchecked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    Create,
    Update,
    Other,
}

impl Operation {
    pub const ALL: [Operation; 3] = [Operation::Create, Operation::Update, Operation::Other];

    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "create",
            Operation::Update => "update",
            Operation::Other => "other",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the node of a new request exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodePresence {
    Exists,
    Missing,
}

/// The answer to one review.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Admit it; the warnings are shown to the client (kubectl prints them).
    Allowed { warnings: Vec<String> },
    /// Refuse it. The message names the object and says what to fix.
    Denied { reason: DenyReason, message: String },
}

/// Why a request is refused: the `reason` of the API error and its HTTP code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyReason {
    /// `spec.nodeName` names no node (or is no valid node name).
    NodeNotFound,
    /// A field of the spec cannot be used.
    InvalidSpec,
}

impl DenyReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::NodeNotFound => "NodeNotFound",
            DenyReason::InvalidSpec => "InvalidSpec",
        }
    }

    /// 403 as NVIDIA's webhook answers a missing node (requestors may expect it); 422 for an
    /// invalid spec, as the API server answers an object its schema refuses.
    pub fn http_code(self) -> u16 {
        match self {
            DenyReason::NodeNotFound => 403,
            DenyReason::InvalidSpec => 422,
        }
    }

    /// The API's own `StatusReason` for [`DenyReason::http_code`], so that clients testing for
    /// "forbidden" or "invalid" (client-go's `IsForbidden`, `IsInvalid`) recognise the refusal.
    pub fn status_reason(self) -> &'static str {
        match self {
            DenyReason::NodeNotFound => "Forbidden",
            DenyReason::InvalidSpec => "Invalid",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of a review as the metric counts it; `Error` is a review that could not be
/// answered (a malformed body, a failed node lookup).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Allowed,
    Denied,
    Error,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Allowed, Outcome::Denied, Outcome::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::Error => "error",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Verdict {
    pub fn outcome(&self) -> Outcome {
        match self {
            Verdict::Allowed { .. } => Outcome::Allowed,
            Verdict::Denied { .. } => Outcome::Denied,
        }
    }
}

/// The node a CREATE has to look up: `spec.nodeName` when it is a valid node name. `None` means
/// there is nothing to look up (the review refuses the name as it is), so that a name like
/// `a/proxy` never becomes a path of the caller's GET.
pub fn node_to_look_up(request: &NodeMaintenance) -> Option<&str> {
    let name = request.spec.node_name.as_str();
    is_dns_subdomain(name).then_some(name)
}

/// Decides one review. Pure: the node lookup, if any, happened before.
pub fn review(request: &NodeMaintenance, review: Review<'_>) -> Verdict {
    let mut problems: Vec<(DenyReason, String)> = Vec::new();
    let mut warnings = Vec::new();

    if let Review::Create { node } = review {
        let name = &request.spec.node_name;
        if !is_dns_subdomain(name) {
            problems.push((
                DenyReason::NodeNotFound,
                format!(
                    "spec.nodeName {name:?} is not a valid node name (lower-case letters, digits, \
                     '-' and '.', at most 253 characters); fix spec.nodeName"
                ),
            ));
        } else if node == NodePresence::Missing {
            problems.push((
                DenyReason::NodeNotFound,
                format!(
                    "node {name:?} does not exist; create the node first or fix spec.nodeName \
                     (`kubectl get nodes` lists them)"
                ),
            ));
        }
    }

    let old_problems = match review {
        Review::Update { old: Some(old) } => spec_problems(old),
        _ => Vec::new(),
    };
    for problem in spec_problems(request) {
        if old_problems.contains(&problem) {
            warnings.push(format!(
                "{} (already so before this change, so the change is admitted; the operator \
                 marks the request Failed with reason InvalidSpec until it is fixed)",
                problem.message
            ));
        } else {
            problems.push((DenyReason::InvalidSpec, problem.message));
        }
    }
    warnings.extend(spec_warnings(request));
    if let Some(problem) = group_size_problem(request) {
        match review {
            Review::Update { old: Some(old) } if group_size_problem(old).is_some() => {
                warnings.push(problem)
            }
            _ => problems.push((DenyReason::InvalidSpec, problem)),
        }
    }

    let Some((reason, _)) = problems.first() else {
        return Verdict::Allowed { warnings };
    };
    let reason = *reason;
    let object = object_name(request);
    let message = match problems.as_slice() {
        [(_, only)] => format!("NodeMaintenance {object}: {only}"),
        all => {
            let listed: Vec<String> = all
                .iter()
                .enumerate()
                .map(|(i, (_, p))| format!("({}) {p}", i + 1))
                .collect();
            format!(
                "NodeMaintenance {object} has {} problems: {}",
                all.len(),
                listed.join("; ")
            )
        }
    };
    Verdict::Denied { reason, message }
}

/// `namespace/name`, or `namespace/<generateName>…` for a name the API server has not generated
/// yet.
fn object_name(request: &NodeMaintenance) -> String {
    let meta = &request.metadata;
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    let name = match (&meta.name, &meta.generate_name) {
        (Some(name), _) if !name.is_empty() => name.clone(),
        (_, Some(prefix)) => format!("{prefix}…"),
        _ => String::new(),
    };
    format!("{namespace}/{name}")
}

/// A spec value the operator cannot use. Two are the same problem when field and value are.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SpecProblem {
    field: String,
    value: String,
    message: String,
}

/// Every unusable value of the spec, with the message the operator's `InvalidSpec` condition
/// would carry for it (the same error type builds both).
fn spec_problems(request: &NodeMaintenance) -> Vec<SpecProblem> {
    let mut out = Vec::new();
    if let Some(WaitForPodCompletionSpec {
        pod_selector: Some(selector),
        ..
    }) = &request.spec.wait_for_pod_completion
    {
        out.extend(selector_problem(
            "spec.waitForPodCompletion.podSelector",
            selector,
        ));
    }
    if let Some(drain) = &request.spec.drain_spec {
        if let Some(selector) = &drain.pod_selector {
            out.extend(selector_problem("spec.drainSpec.podSelector", selector));
        }
        for (i, entry) in drain.pod_eviction_filters().iter().enumerate() {
            let Some(pattern) = &entry.by_resource_name_regex else {
                continue;
            };
            if let Err(source) = Regex::new(pattern) {
                let field = format!("spec.drainSpec.podEvictionFilters[{i}].byResourceNameRegex");
                let message = DrainPlanError::InvalidResourceNameRegex {
                    field: field.clone(),
                    value: pattern.clone(),
                    source,
                }
                .to_string();
                out.push(SpecProblem {
                    field,
                    value: pattern.clone(),
                    message,
                });
            }
        }
    }
    out
}

/// A `group-size` annotation the scheduler cannot read would let its node group be admitted in
/// part, as if it had none.
fn group_size_problem(request: &NodeMaintenance) -> Option<String> {
    let value = request
        .metadata
        .annotations
        .as_ref()?
        .get(NODE_GROUP_SIZE_ANNOTATION)?;
    if value.trim().parse::<u32>().is_ok_and(|size| size > 0) {
        return None;
    }
    Some(format!(
        "annotation {NODE_GROUP_SIZE_ANNOTATION} is {value:?}: it must be the number of requests in the node group (label {NODE_GROUP_LABEL}), a whole number above 0; the scheduler reads the request as if it had none"
    ))
}

fn selector_problem(field: &'static str, selector: &str) -> Option<SpecProblem> {
    let source = ParsedSelector::parse(selector).err()?;
    Some(SpecProblem {
        field: field.to_owned(),
        value: selector.to_owned(),
        message: DrainPlanError::InvalidPodSelector { field, source }.to_string(),
    })
}

/// Valid but probably not what the requestor meant.
fn spec_warnings(request: &NodeMaintenance) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(wait) = &request.spec.wait_for_pod_completion {
        let all_pods = wait
            .pod_selector
            .as_deref()
            .is_none_or(|s| ParsedSelector::parse(s).is_ok_and(|p| p.selects_all()));
        if all_pods && wait.timeout_seconds() == 0 {
            out.push(
                "spec.waitForPodCompletion selects every pod and has no timeout: the request \
                 waits until every pod on the node has finished, which pods of Deployments and \
                 StatefulSets never do; set a podSelector or timeoutSeconds"
                    .to_owned(),
            );
        }
    }
    if let Some(drain) = &request.spec.drain_spec {
        out.extend(filter_warnings(drain));
    }
    out
}

fn filter_warnings(drain: &DrainSpec) -> Vec<String> {
    drain
        .pod_eviction_filters()
        .iter()
        .enumerate()
        .filter(|(_, entry)| entry.by_resource_name_regex.is_none())
        .map(|(i, _)| {
            format!(
                "spec.drainSpec.podEvictionFilters[{i}] has no byResourceNameRegex and matches \
                 no pod; set one or remove the entry"
            )
        })
        .collect()
}

/// A DNS-1123 subdomain, which every node name is (the API server refuses other names).
fn is_dns_subdomain(name: &str) -> bool {
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            let bytes = label.as_bytes();
            match (bytes.first(), bytes.last()) {
                (Some(&first), Some(&last)) => {
                    alnum(first) && alnum(last) && bytes.iter().all(|&c| alnum(c) || c == b'-')
                }
                _ => false,
            }
        })
}

/// What the webhook answers for a MaintenanceOperatorConfig: refused when the scheduler could
/// not use one of its values (every such value named), as the operator would otherwise stop
/// admitting and say so only once it runs a round. The schema already refuses what it can (types,
/// patterns, ranges); this is what only the operator can judge: a cron schedule that is no
/// crontab or never fires, a time zone it does not know, a budget selector it cannot read. On
/// UPDATE, a problem the stored config already had is a warning, as for a NodeMaintenance.
pub fn review_config(
    name: &str,
    spec: &MaintenanceOperatorConfigSpec,
    old: Option<&MaintenanceOperatorConfigSpec>,
) -> Verdict {
    let problems_of = |spec: &MaintenanceOperatorConfigSpec| -> Vec<String> {
        config_problems(&Limits::from_config(Some(spec)))
            .iter()
            .map(|p| p.problem())
            .chain(crate::gates::config_problems(spec.gates()))
            .collect()
    };
    let old_problems = old.map(problems_of).unwrap_or_default();
    let (kept, new): (Vec<String>, Vec<String>) = problems_of(spec)
        .into_iter()
        .partition(|problem| old_problems.contains(problem));
    let mut warnings: Vec<String> = kept
        .into_iter()
        .map(|problem| {
            format!(
                "MaintenanceOperatorConfig {name:?}: {problem} (as before this change; nothing is \
                 admitted until it is fixed)"
            )
        })
        .collect();
    if name != DEFAULT_CONFIG_NAME {
        warnings.push(format!(
            "MaintenanceOperatorConfig {name:?} is not read: the operator reads only the one named \
             {DEFAULT_CONFIG_NAME:?} in its own namespace"
        ));
    }
    if new.is_empty() {
        return Verdict::Allowed { warnings };
    }
    Verdict::Denied {
        reason: DenyReason::InvalidSpec,
        message: format!(
            "MaintenanceOperatorConfig {name:?} cannot be used: {}; fix {} and apply it again",
            new.join("; "),
            if new.len() == 1 { "it" } else { "them" }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use maintenance_crds::PodEvictionFilterEntry;

    fn request(node: &str) -> NodeMaintenance {
        fixtures::request("fw-upgrade")
            .namespace("team-a")
            .node(node)
            .requestor("fw.example.com")
            .build()
    }

    fn with_drain_selector(mut nm: NodeMaintenance, selector: &str) -> NodeMaintenance {
        nm.spec.drain_spec = Some(DrainSpec {
            pod_selector: Some(selector.into()),
            ..DrainSpec::default()
        });
        nm
    }

    fn with_wait_selector(mut nm: NodeMaintenance, selector: &str) -> NodeMaintenance {
        nm.spec.wait_for_pod_completion = Some(WaitForPodCompletionSpec {
            pod_selector: Some(selector.into()),
            timeout_seconds: Some(60),
        });
        nm
    }

    fn with_filters(mut nm: NodeMaintenance, regexes: &[Option<&str>]) -> NodeMaintenance {
        nm.spec.drain_spec = Some(DrainSpec {
            pod_eviction_filters: Some(
                regexes
                    .iter()
                    .map(|r| PodEvictionFilterEntry {
                        by_resource_name_regex: r.map(str::to_owned),
                    })
                    .collect(),
            ),
            ..DrainSpec::default()
        });
        nm
    }

    const CREATE: Review<'static> = Review::Create {
        node: NodePresence::Exists,
    };
    const CREATE_MISSING: Review<'static> = Review::Create {
        node: NodePresence::Missing,
    };

    fn denied(verdict: Verdict) -> (DenyReason, String) {
        match verdict {
            Verdict::Denied { reason, message } => (reason, message),
            Verdict::Allowed { warnings } => panic!("allowed (warnings {warnings:?})"),
        }
    }

    fn warnings(verdict: &Verdict) -> &[String] {
        match verdict {
            Verdict::Allowed { warnings } => warnings,
            Verdict::Denied { message, .. } => panic!("denied: {message}"),
        }
    }

    #[test]
    fn create_on_an_existing_node_is_allowed_without_warnings() {
        let verdict = review(&request("node-7"), CREATE);
        assert_eq!(verdict, Verdict::Allowed { warnings: vec![] });
        assert_eq!(verdict.outcome(), Outcome::Allowed);
    }

    #[test]
    fn create_on_a_missing_node_is_denied_naming_object_node_and_fix() {
        let verdict = review(&request("node-7"), CREATE_MISSING);
        let (reason, message) = denied(verdict.clone());
        assert_eq!(reason, DenyReason::NodeNotFound);
        assert_eq!(reason.http_code(), 403);
        assert_eq!(reason.status_reason(), "Forbidden");
        assert_eq!(verdict.outcome(), Outcome::Denied);
        assert!(
            message.starts_with(
                "NodeMaintenance team-a/fw-upgrade: node \"node-7\" does not exist; create the \
                 node first or fix spec.nodeName"
            ),
            "{message}"
        );
    }

    #[test]
    fn update_never_checks_the_node() {
        let nm = request("node-7");
        assert_eq!(
            review(&nm, Review::Update { old: Some(&nm) }),
            Verdict::Allowed { warnings: vec![] }
        );
    }

    #[test]
    fn an_invalid_node_name_is_denied_and_never_looked_up() {
        for name in ["", "a/proxy", "Node-7", "-a", "a..b", &"a".repeat(254)] {
            let nm = request(name);
            assert_eq!(node_to_look_up(&nm), None, "{name:?}");
            // Even if a confused caller says it exists.
            let (reason, message) = denied(review(&nm, CREATE));
            assert_eq!(reason, DenyReason::NodeNotFound);
            assert!(message.contains("is not a valid node name"), "{message}");
        }
        for name in ["node-7", "ip-10-0-0-1.ec2.internal", "a", &"a".repeat(63)] {
            assert_eq!(node_to_look_up(&request(name)), Some(name));
        }
    }

    #[test]
    fn invalid_drain_selector_is_denied_on_create_with_the_operators_message() {
        let nm = with_drain_selector(request("node-7"), "app in (web");
        let (reason, message) = denied(review(&nm, CREATE));
        assert_eq!(reason, DenyReason::InvalidSpec);
        assert_eq!(reason.http_code(), 422);
        assert_eq!(reason.status_reason(), "Invalid");
        assert!(
            message.starts_with("NodeMaintenance team-a/fw-upgrade: spec.drainSpec.podSelector:"),
            "{message}"
        );
        assert!(message.contains("\"app in (web\""), "{message}");
        assert!(message.contains("kubectl get pods -l"), "{message}");
        // Word for word what the operator would put in its InvalidSpec condition.
        let Some(drain) = &nm.spec.drain_spec else {
            unreachable!()
        };
        let Err(operator_says) = crate::drain_plan::DrainRules::new(drain, None) else {
            panic!("the drain rules accepted the selector")
        };
        assert!(message.ends_with(&operator_says.to_string()), "{message}");
    }

    #[test]
    fn invalid_wait_selector_is_denied() {
        let nm = with_wait_selector(request("node-7"), "a=b,=c");
        let (reason, message) = denied(review(&nm, CREATE));
        assert_eq!(reason, DenyReason::InvalidSpec);
        assert!(
            message.contains("spec.waitForPodCompletion.podSelector:"),
            "{message}"
        );
    }

    #[test]
    fn valid_selectors_and_regexes_are_allowed() {
        let nm = with_drain_selector(request("node-7"), "app=web,tier in (a,b),!canary");
        assert_eq!(review(&nm, CREATE), Verdict::Allowed { warnings: vec![] });
        let nm = with_wait_selector(request("node-7"), "job-name");
        assert_eq!(review(&nm, CREATE), Verdict::Allowed { warnings: vec![] });
        let nm = with_filters(request("node-7"), &[Some("^nvidia.com/.*"), Some("gpu")]);
        assert_eq!(review(&nm, CREATE), Verdict::Allowed { warnings: vec![] });
        // Empty means "all pods", as with kubectl.
        let nm = with_drain_selector(request("node-7"), "");
        assert_eq!(review(&nm, CREATE), Verdict::Allowed { warnings: vec![] });
    }

    #[test]
    fn invalid_regex_is_denied_naming_its_index() {
        let nm = with_filters(request("node-7"), &[Some("gpu"), Some("nvidia.com/(gpu")]);
        let (reason, message) = denied(review(&nm, CREATE));
        assert_eq!(reason, DenyReason::InvalidSpec);
        assert!(
            message.contains(
                "spec.drainSpec.podEvictionFilters[1].byResourceNameRegex: \"nvidia.com/(gpu\" \
                 is not a valid regular expression"
            ),
            "{message}"
        );
    }

    #[test]
    fn every_problem_is_listed_missing_node_first() {
        let mut nm = with_filters(request("node-7"), &[Some("(")]);
        nm.spec.wait_for_pod_completion = Some(WaitForPodCompletionSpec {
            pod_selector: Some("a in".into()),
            timeout_seconds: None,
        });
        let (reason, message) = denied(review(&nm, CREATE_MISSING));
        assert_eq!(reason, DenyReason::NodeNotFound);
        assert!(
            message.starts_with("NodeMaintenance team-a/fw-upgrade has 3 problems: (1) node"),
            "{message}"
        );
        assert!(
            message.contains("; (2) spec.waitForPodCompletion.podSelector"),
            "{message}"
        );
        assert!(
            message.contains("; (3) spec.drainSpec.podEvictionFilters[0]"),
            "{message}"
        );
    }

    #[test]
    fn update_denies_a_new_invalid_value() {
        let old = with_drain_selector(request("node-7"), "app=web");
        let new = with_drain_selector(request("node-7"), "app in (web");
        let (reason, _) = denied(review(&new, Review::Update { old: Some(&old) }));
        assert_eq!(reason, DenyReason::InvalidSpec);
        // Without the old object nothing is ratcheted.
        let verdict = review(&new, Review::Update { old: None });
        assert_eq!(verdict.outcome(), Outcome::Denied);
    }

    #[test]
    fn update_keeping_an_old_invalid_value_is_allowed_with_a_warning() {
        let old = with_drain_selector(request("node-7"), "app in (web");
        let mut new = old.clone();
        new.spec.additional_requestors = Some(vec!["other.example.com".into()]);
        let verdict = review(&new, Review::Update { old: Some(&old) });
        let warned = warnings(&verdict);
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(
            warned[0].starts_with("spec.drainSpec.podSelector:"),
            "{warned:?}"
        );
        assert!(warned[0].contains("InvalidSpec"), "{warned:?}");

        // Changing it to another invalid value is refused.
        let other = with_drain_selector(request("node-7"), "=web");
        let verdict = review(&other, Review::Update { old: Some(&old) });
        assert_eq!(verdict.outcome(), Outcome::Denied);
        // And fixing it is allowed without a warning.
        let fixed = with_drain_selector(request("node-7"), "app=web");
        assert_eq!(
            review(&fixed, Review::Update { old: Some(&old) }),
            Verdict::Allowed { warnings: vec![] }
        );
    }

    #[test]
    fn a_group_size_that_is_not_a_positive_number_is_refused_and_an_old_one_warned() {
        for bad in ["three", "0", "-2", ""] {
            let nm = fixtures::request("fw-upgrade")
                .namespace("team-a")
                .node("node-1")
                .annotation(NODE_GROUP_SIZE_ANNOTATION, bad)
                .build();
            let (reason, message) = denied(review(&nm, CREATE));
            assert_eq!(reason, DenyReason::InvalidSpec);
            assert!(
                message.contains("NodeMaintenance team-a/fw-upgrade")
                    && message.contains(NODE_GROUP_SIZE_ANNOTATION)
                    && message.contains("a whole number above 0"),
                "{message}"
            );
            let update = review(&nm, Review::Update { old: Some(&nm) });
            assert!(warnings(&update)[0].contains(NODE_GROUP_SIZE_ANNOTATION));
        }
        let good = fixtures::request("fw-upgrade")
            .namespace("team-a")
            .node("node-1")
            .annotation(NODE_GROUP_SIZE_ANNOTATION, "4")
            .build();
        assert!(warnings(&review(&good, CREATE)).is_empty());
    }

    #[test]
    fn a_filter_without_regex_is_a_warning() {
        let nm = with_filters(request("node-7"), &[Some("gpu"), None]);
        let verdict = review(&nm, CREATE);
        assert_eq!(
            warnings(&verdict),
            [
                "spec.drainSpec.podEvictionFilters[1] has no byResourceNameRegex and matches no \
              pod; set one or remove the entry"
            ]
        );
    }

    #[test]
    fn waiting_for_every_pod_forever_is_a_warning() {
        let mut nm = request("node-7");
        nm.spec.wait_for_pod_completion = Some(WaitForPodCompletionSpec::default());
        let verdict = review(&nm, CREATE);
        let warned = warnings(&verdict);
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(warned[0].contains("no timeout"), "{warned:?}");

        // A selector or a timeout makes it deliberate.
        let nm = with_wait_selector(request("node-7"), "app=batch");
        assert_eq!(review(&nm, CREATE), Verdict::Allowed { warnings: vec![] });
        let mut nm = request("node-7");
        nm.spec.wait_for_pod_completion = Some(WaitForPodCompletionSpec {
            pod_selector: None,
            timeout_seconds: Some(600),
        });
        assert_eq!(review(&nm, CREATE), Verdict::Allowed { warnings: vec![] });
    }

    #[test]
    fn a_generated_name_is_shown_as_its_prefix() {
        let mut nm = request("node-7");
        nm.metadata.name = None;
        nm.metadata.generate_name = Some("fw-".into());
        let (_, message) = denied(review(&nm, CREATE_MISSING));
        assert!(
            message.starts_with("NodeMaintenance team-a/fw-…:"),
            "{message}"
        );
    }

    #[test]
    fn labels_are_stable() {
        assert_eq!(
            Outcome::ALL.map(Outcome::as_str),
            ["allowed", "denied", "error"]
        );
        assert_eq!(
            Operation::ALL.map(Operation::as_str),
            ["create", "update", "other"]
        );
        assert_eq!(CREATE.operation(), Operation::Create);
        assert_eq!(Review::Update { old: None }.operation(), Operation::Update);
        assert_eq!(DenyReason::NodeNotFound.to_string(), "NodeNotFound");
        assert_eq!(DenyReason::InvalidSpec.to_string(), "InvalidSpec");
    }

    fn config(windows: serde_json::Value) -> MaintenanceOperatorConfigSpec {
        serde_json::from_value(serde_json::json!({ "maintenanceWindows": windows }))
            .expect("a config spec")
    }

    #[test]
    fn a_config_the_scheduler_cannot_use_is_refused_with_every_field_named() {
        let broken: MaintenanceOperatorConfigSpec = serde_json::from_value(serde_json::json!({
            "maxParallelOperations": "lots",
            "maintenanceWindows": [
                {"schedule": "0 1 * * *", "duration": "1h"},
                {"schedule": "0 0 31 2 *", "duration": "1h"},
                {"schedule": "0 1 * * *", "duration": "1h", "timeZone": "Mars/Olympus_Mons"},
            ],
            "budgets": [{"name": "pool", "nodeSelector": {"matchExpressions": [
                {"key": "pool", "operator": "In"}]}}],
            "blackouts": [{"start": "2026-12-02T00:00:00Z", "end": "2026-12-01T00:00:00Z",
                           "reason": "freeze"}],
        }))
        .expect("a config spec");
        let Verdict::Denied { reason, message } = review_config("default", &broken, None) else {
            panic!("refused");
        };
        assert_eq!(reason, DenyReason::InvalidSpec);
        for field in [
            "maxParallelOperations: \"lots\"",
            "maintenanceWindows[1].schedule \"0 0 31 2 *\" never fires",
            "maintenanceWindows[2].timeZone \"Mars/Olympus_Mons\"",
            "budget \"pool\": nodeSelector",
            "blackouts[0] ends",
        ] {
            assert!(message.contains(field), "{field} in {message}");
        }
        assert!(!message.contains("maintenanceWindows[0]"), "{message}");
        assert!(
            message.ends_with("fix them and apply it again"),
            "{message}"
        );
    }

    #[test]
    fn a_config_with_bad_gates_is_refused_naming_each() {
        let spec: MaintenanceOperatorConfigSpec = serde_json::from_value(serde_json::json!({
            "admission": {"gates": [
                {"name": "alerts", "prometheus": {"url": "prometheus:9090", "query": "ALERTS"}},
                {"name": "alerts", "prometheus": {"url": "http://p:9090", "query": ""}},
            ]},
        }))
        .expect("a config spec");
        let Verdict::Denied { message, .. } = review_config("default", &spec, None) else {
            panic!("refused");
        };
        for field in [
            "admission.gates[0].prometheus.url \"prometheus:9090\" is not an http://",
            "admission.gates[1].name \"alerts\" is used by two gates",
            "admission.gates[1].prometheus.query is empty",
        ] {
            assert!(message.contains(field), "{field} in {message}");
        }
    }

    #[test]
    fn a_usable_config_is_allowed_and_one_not_read_gets_a_warning() {
        let nightly = config(serde_json::json!([{"schedule": "0 1 * * *", "duration": "1h"}]));
        assert_eq!(
            review_config("default", &nightly, None),
            Verdict::Allowed { warnings: vec![] }
        );
        let Verdict::Allowed { warnings } = review_config("staging", &nightly, None) else {
            panic!("allowed");
        };
        assert!(warnings[0].contains("is not read"), "{warnings:?}");
    }

    #[test]
    fn an_update_keeping_an_old_problem_is_warned_and_a_new_one_refused() {
        let old = config(serde_json::json!([{"schedule": "0 0 31 2 *", "duration": "1h"}]));
        let Verdict::Allowed { warnings } = review_config("default", &old, Some(&old)) else {
            panic!("allowed: the problem was there before");
        };
        assert!(warnings[0].contains("never fires"), "{warnings:?}");
        let worse = config(serde_json::json!([
            {"schedule": "0 0 31 2 *", "duration": "1h"},
            {"schedule": "0 1 * * *", "duration": "1h", "timeZone": "Nowhere/At_All"},
        ]));
        let Verdict::Denied { message, .. } = review_config("default", &worse, Some(&old)) else {
            panic!("refused: a new problem");
        };
        assert!(message.contains("Nowhere/At_All"), "{message}");
        assert!(!message.contains("never fires"), "{message}");
    }
}
