//! `kubectl maintenance request`: one NodeMaintenance per node, created idempotently.

use std::collections::BTreeMap;

use anyhow::{Context as _, bail};
use clap::Args;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use maintenance_core::label_selector::ParsedSelector;
use maintenance_crds::{DrainSpec, NodeMaintenance, NodeMaintenanceSpec, WaitForPodCompletionSpec};

use super::names::{check_prefix, default_prefix, request_name};
use super::{GlobalArgs, Outcome, api_error, connect, is_conflict};

pub const AFTER_HELP: &str = "\
Each request is named <prefix>-<node>, the prefix being --name-prefix or the requestor ID made
into a name (`--requestor upgrade.example.com` and node-7 give upgrade.example.com-node-7).
Running the same command again is fine: a request that exists with the same spec is left alone;
one with a different spec is an error (delete it first, or choose another --name-prefix).

Examples:
  kubectl maintenance request node-7 --requestor upgrade.example.com --drain --force
  kubectl maintenance request node-1 node-2 --requestor fw.example.com --drain --timeout 600 \\
      --pod-selector 'app!=agent' --wait-for-pods 'job-name'
  kubectl maintenance status --watch";

/// What the operator should do on each node: the spec flags shared by `request` and `rollout`.
#[derive(Debug, Clone, Default, Args)]
pub struct MaintenanceFlags {
    /// Drain the node: evict its pods through the Eviction API, honouring PodDisruptionBudgets.
    /// Every other drain flag implies it.
    #[arg(long)]
    pub drain: bool,

    /// Also evict pods that no controller recreates (they are gone for good). Implies --drain.
    #[arg(long)]
    pub force: bool,

    /// Also evict pods with emptyDir volumes (their data is lost). Implies --drain.
    #[arg(long = "delete-emptydir")]
    pub delete_empty_dir: bool,

    /// Bound on the whole drain, in seconds (0 waits forever) [default: 300]. At the bound the
    /// request gets a Failed condition naming the blockers, and the operator keeps retrying
    /// slowly. Implies --drain.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(i32).range(0..))]
    pub timeout: Option<i32>,

    /// Evict only the pods this label selector matches (kubectl -l syntax). Implies --drain.
    #[arg(long, value_name = "SELECTOR")]
    pub pod_selector: Option<String>,

    /// This many seconds after the drain began, DELETE the pods whose eviction a
    /// PodDisruptionBudget still refuses, bypassing the budget (drainSpec.forceDeleteAfterSeconds;
    /// the workload may drop below what its owner declared). Implies --drain.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(i32).range(1..))]
    pub force_delete_after: Option<i32>,

    /// Before draining, wait until the pods this selector matches have completed (`''` waits for
    /// every pod on the node).
    #[arg(long, value_name = "SELECTOR")]
    pub wait_for_pods: Option<String>,

    /// Give up waiting for --wait-for-pods after this many seconds [default: 0, forever].
    #[arg(long, value_name = "SECONDS", requires = "wait_for_pods",
          value_parser = clap::value_parser!(i32).range(0..))]
    pub wait_timeout: Option<i32>,

    /// Leave the node schedulable (the operator cordons it by default).
    #[arg(long)]
    pub no_cordon: bool,

    /// Name the requests <PREFIX>-<node> [default: the requestor ID made into a name].
    #[arg(long, value_name = "PREFIX")]
    pub name_prefix: Option<String>,
}

impl MaintenanceFlags {
    /// Whether the flags ask for a drain (explicitly or through a drain option).
    pub fn drains(&self) -> bool {
        self.drain
            || self.force
            || self.delete_empty_dir
            || self.timeout.is_some()
            || self.pod_selector.is_some()
            || self.force_delete_after.is_some()
    }

    /// Checks the selectors and the prefix before anything is created.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (flag, selector) in [
            ("--pod-selector", &self.pod_selector),
            ("--wait-for-pods", &self.wait_for_pods),
        ] {
            if let Some(selector) = selector {
                ParsedSelector::parse(selector).with_context(|| {
                    format!(
                        "{flag}: write it as `kubectl get pods -l` accepts it, e.g. 'app=web,tier in (a,b)'"
                    )
                })?;
            }
        }
        if let Some(prefix) = &self.name_prefix {
            check_prefix(prefix).map_err(anyhow::Error::msg)?;
        }
        Ok(())
    }

    /// `<prefix>` of the request names.
    pub fn prefix(&self, requestor: &str) -> String {
        self.name_prefix
            .clone()
            .unwrap_or_else(|| default_prefix(requestor))
    }

    pub fn spec(
        &self,
        node: &str,
        requestor: &str,
        additional_requestors: &[String],
    ) -> NodeMaintenanceSpec {
        NodeMaintenanceSpec {
            requestor_id: requestor.to_string(),
            additional_requestors: (!additional_requestors.is_empty())
                .then(|| additional_requestors.to_vec()),
            node_name: node.to_string(),
            cordon: self.no_cordon.then_some(false),
            wait_for_pod_completion: self.wait_for_pods.as_ref().map(|selector| {
                WaitForPodCompletionSpec {
                    pod_selector: (!selector.is_empty()).then(|| selector.clone()),
                    timeout_seconds: self.wait_timeout,
                }
            }),
            drain_spec: self.drains().then(|| DrainSpec {
                force: Some(self.force),
                pod_selector: self.pod_selector.clone().filter(|s| !s.is_empty()),
                timeout_seconds: self.timeout,
                delete_empty_dir: Some(self.delete_empty_dir),
                pod_eviction_filters: None,
                force_delete_after_seconds: self.force_delete_after,
            }),
        }
    }
}

/// The CRD's rules for `requestorID`, checked before anything is sent.
pub fn parse_requestor_id(id: &str) -> Result<String, String> {
    match maintenance_crds::requestor_id_problem(id) {
        Some(problem) => Err(problem),
        None => Ok(id.to_string()),
    }
}

#[derive(Debug, Clone, Args)]
pub struct RequestArgs {
    /// The nodes to maintain.
    #[arg(value_name = "NODE", required = true)]
    pub nodes: Vec<String>,

    /// Who asks (e.g. upgrade.example.com); the operator orders admissions by requestor.
    #[arg(long, value_name = "ID", value_parser = parse_requestor_id)]
    pub requestor: String,

    /// Another requestor sharing the maintenance: deleting the request waits until the list of
    /// additional requestors is empty. Repeat for several.
    #[arg(long = "additional-requestor", value_name = "ID")]
    pub additional_requestors: Vec<String>,

    #[command(flatten)]
    pub flags: MaintenanceFlags,
}

/// A spec with the API server's defaults applied, so that a request read back compares equal to
/// the one that was sent.
#[derive(Debug, PartialEq)]
struct Effective {
    requestor: String,
    node: String,
    cordon: bool,
    additional_requestors: Vec<String>,
    wait: Option<(String, u32)>,
    drain: Option<(bool, bool, u32, String, usize, Option<i32>)>,
}

impl Effective {
    fn of(spec: &NodeMaintenanceSpec) -> Effective {
        let mut additional_requestors = spec.additional_requestors().to_vec();
        additional_requestors.sort();
        Effective {
            requestor: spec.requestor_id.clone(),
            node: spec.node_name.clone(),
            cordon: spec.cordon(),
            additional_requestors,
            wait: spec.wait_for_pod_completion.as_ref().map(|w| {
                (
                    w.pod_selector.clone().unwrap_or_default(),
                    w.timeout_seconds(),
                )
            }),
            drain: spec.drain_spec.as_ref().map(|d| {
                (
                    d.force(),
                    d.delete_empty_dir(),
                    d.timeout_seconds(),
                    d.pod_selector.clone().unwrap_or_default(),
                    d.pod_eviction_filters().len(),
                    d.force_delete_after_seconds,
                )
            }),
        }
    }

    /// The first field that differs, for the error message.
    fn difference(&self, other: &Effective) -> Option<&'static str> {
        if self.requestor != other.requestor {
            Some("spec.requestorID")
        } else if self.node != other.node {
            Some("spec.nodeName")
        } else if self.cordon != other.cordon {
            Some("spec.cordon")
        } else if self.additional_requestors != other.additional_requestors {
            Some("spec.additionalRequestors")
        } else if self.wait != other.wait {
            Some("spec.waitForPodCompletion")
        } else if self.drain != other.drain {
            Some("spec.drainSpec")
        } else {
            None
        }
    }
}

/// What [`ensure_request`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ensured {
    Created,
    Unchanged,
    /// The request exists with another spec (the field named); left alone.
    Differs(&'static str),
    /// The request exists and is being deleted.
    Deleting,
}

/// How often [`ensure_request`] creates again when the request that held the name is gone by the
/// time it is read (it was being deleted): each round trip is a real race lost, not a loop.
const CREATE_ATTEMPTS: usize = 5;

/// After a create answered 409 (the name is taken), what the request of that name, as read
/// (`None`: gone meanwhile), makes of `wanted`: create again (the name came free), give up (it
/// came free `CREATE_ATTEMPTS` times), or how the existing one compares.
#[derive(Debug, PartialEq, Eq)]
enum AfterConflict {
    CreateAgain,
    GiveUp,
    Found(Ensured),
}

fn after_conflict(
    existing: Option<&NodeMaintenance>,
    wanted: &NodeMaintenance,
    attempt: usize,
) -> AfterConflict {
    let Some(existing) = existing else {
        return if attempt >= CREATE_ATTEMPTS {
            AfterConflict::GiveUp
        } else {
            AfterConflict::CreateAgain
        };
    };
    AfterConflict::Found(if existing.is_deleting() {
        Ensured::Deleting
    } else {
        match Effective::of(&existing.spec).difference(&Effective::of(&wanted.spec)) {
            Some(field) => Ensured::Differs(field),
            None => Ensured::Unchanged,
        }
    })
}

/// Creates the request unless it exists; reports how an existing one compares.
pub async fn ensure_request(
    api: &Api<NodeMaintenance>,
    nm: &NodeMaintenance,
) -> Result<(Ensured, NodeMaintenance), kube::Error> {
    let name = nm.metadata.name.clone().unwrap_or_default();
    let mut attempt = 1;
    loop {
        match api.create(&PostParams::default(), nm).await {
            Ok(created) => return Ok((Ensured::Created, created)),
            Err(err) if is_conflict(&err) => {
                let existing = api.get_opt(&name).await?;
                match (after_conflict(existing.as_ref(), nm, attempt), existing) {
                    (AfterConflict::Found(outcome), Some(existing)) => {
                        return Ok((outcome, existing));
                    }
                    (AfterConflict::CreateAgain, _) => attempt += 1,
                    _ => return Err(err),
                }
            }
            Err(err) => return Err(err),
        }
    }
}

/// Fails, naming every missing node, unless all exist.
pub async fn check_nodes_exist(client: &kube::Client, nodes: &[String]) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let mut missing = Vec::new();
    for node in nodes {
        match api.get_metadata_opt(node).await {
            Ok(Some(_)) => {}
            Ok(None) => missing.push(node.as_str()),
            Err(err) => return Err(api_error(err, &format!("read node {node}"))),
        }
    }
    if !missing.is_empty() {
        bail!(
            "no such node: {}; `kubectl get nodes` lists the nodes (nothing was created)",
            missing.join(", ")
        );
    }
    Ok(())
}

pub async fn run(global: &GlobalArgs, args: RequestArgs) -> anyhow::Result<Outcome> {
    args.flags.validate()?;
    if args.requestor.trim().is_empty() {
        bail!("--requestor must not be empty: name who asks, e.g. --requestor upgrade.example.com");
    }
    let mut nodes = args.nodes.clone();
    let mut seen = std::collections::BTreeSet::new();
    nodes.retain(|node| seen.insert(node.clone()));

    let (client, namespace) = connect(global).await?;
    check_nodes_exist(&client, &nodes).await?;
    let api: Api<NodeMaintenance> = Api::namespaced(client, &namespace);
    let prefix = args.flags.prefix(&args.requestor);
    let mut problems = BTreeMap::new();
    for node in &nodes {
        let name = request_name(&prefix, node);
        let nm = NodeMaintenance::new(
            &name,
            args.flags
                .spec(node, &args.requestor, &args.additional_requestors),
        );
        let (outcome, _) = ensure_request(&api, &nm).await.map_err(|err| {
            api_error(
                err,
                &format!("create NodeMaintenance {namespace}/{name} for node {node}"),
            )
        })?;
        match outcome {
            Ensured::Created => println!("nodemaintenance/{name} created (node {node})"),
            Ensured::Unchanged => println!("nodemaintenance/{name} unchanged (node {node})"),
            Ensured::Differs(field) => {
                problems.insert(
                    name.clone(),
                    format!(
                        "NodeMaintenance {namespace}/{name} exists with another {field}: delete it \
                         (`kubectl delete nodemaintenance -n {namespace} {name}`) or choose another \
                         --name-prefix"
                    ),
                );
            }
            Ensured::Deleting => {
                problems.insert(
                    name.clone(),
                    format!(
                        "NodeMaintenance {namespace}/{name} is being deleted (its maintenance is \
                         ending): run the command again once it is gone"
                    ),
                );
            }
        }
    }
    if problems.is_empty() {
        return Ok(Outcome::Success);
    }
    let list: Vec<String> = problems.into_values().collect();
    bail!("{}", list.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A create answered 409 and the request of that name, read just after, is: gone (the old
    /// one finished going away: create again, a few times at most), being deleted, the same, or
    /// different.
    #[test]
    fn after_a_taken_name_a_request_gone_meanwhile_is_created_again() {
        let wanted =
            NodeMaintenance::new("r", MaintenanceFlags::default().spec("n", "requestor", &[]));
        let mut deleting = wanted.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH),
        );
        let mut other = wanted.clone();
        other.spec.cordon = Some(!other.spec.cordon());
        let cases: [(Option<&NodeMaintenance>, usize, AfterConflict); 5] = [
            (None, 1, AfterConflict::CreateAgain),
            (None, CREATE_ATTEMPTS, AfterConflict::GiveUp),
            (Some(&deleting), 1, AfterConflict::Found(Ensured::Deleting)),
            (Some(&wanted), 1, AfterConflict::Found(Ensured::Unchanged)),
            (
                Some(&other),
                1,
                AfterConflict::Found(Ensured::Differs("spec.cordon")),
            ),
        ];
        for (existing, attempt, want) in cases {
            assert_eq!(
                after_conflict(existing, &wanted, attempt),
                want,
                "existing {:?}, attempt {attempt}",
                existing.map(|e| e.metadata.deletion_timestamp.is_some())
            );
        }
    }

    #[test]
    fn drain_options_imply_a_drain() {
        let none = MaintenanceFlags::default();
        assert!(none.spec("n", "r", &[]).drain_spec.is_none());
        let forced = MaintenanceFlags {
            force: true,
            ..Default::default()
        };
        let spec = forced.spec("n", "r", &[]);
        let drain = spec.drain_spec.unwrap_or_default();
        assert!(drain.force());
        assert!(!drain.delete_empty_dir());
        assert_eq!(drain.timeout_seconds(), 300);
        assert_eq!(spec.cordon, None);
        let deadline = MaintenanceFlags {
            force_delete_after: Some(600),
            ..Default::default()
        };
        let drain = deadline.spec("n", "r", &[]).drain_spec.unwrap_or_default();
        assert_eq!(drain.force_delete_after_seconds, Some(600));
        assert!(!drain.force());
    }

    #[test]
    fn defaults_of_the_api_server_compare_equal() {
        let flags = MaintenanceFlags {
            drain: true,
            wait_for_pods: Some(String::new()),
            ..Default::default()
        };
        let sent = flags.spec("n", "r", &["b".into(), "a".into()]);
        let mut stored = sent.clone();
        stored.cordon = Some(true);
        stored.additional_requestors = Some(vec!["a".into(), "b".into()]);
        if let Some(drain) = stored.drain_spec.as_mut() {
            drain.timeout_seconds = Some(300);
        }
        if let Some(wait) = stored.wait_for_pod_completion.as_mut() {
            wait.timeout_seconds = Some(0);
        }
        assert_eq!(
            Effective::of(&stored).difference(&Effective::of(&sent)),
            None
        );
        stored.cordon = Some(false);
        assert_eq!(
            Effective::of(&stored).difference(&Effective::of(&sent)),
            Some("spec.cordon")
        );
    }

    #[test]
    fn bad_selectors_and_prefixes_are_refused_up_front() {
        let flags = MaintenanceFlags {
            pod_selector: Some("app in (".into()),
            ..Default::default()
        };
        let error = format!("{:#}", flags.validate().unwrap_err());
        assert!(error.starts_with("--pod-selector"), "{error}");
        let flags = MaintenanceFlags {
            name_prefix: Some("Bad_Prefix".into()),
            ..Default::default()
        };
        assert!(flags.validate().is_err());
    }
}
