//! Shell completion of `kubectl maintenance`, in kubectl's plugin protocol (kubectl >= 1.26).
//!
//! On `kubectl maintenance <TAB>`, kubectl runs the executable `kubectl_complete-maintenance` from
//! `PATH` with the words typed after `kubectl maintenance`, the last one being the word to
//! complete (empty after a space). It reads one candidate a line (`value<TAB>description`), and a
//! last line `:<directive>` (cobra's ShellCompDirective). The candidates come from clap's own
//! completion engine over [`Cli`](super::Cli), so commands and flags never drift from the parser;
//! node names, requestor IDs and namespaces come from the cluster (the request names show as the
//! description of their node and requestor).

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use clap::CommandFactory as _;
use clap_complete::engine::{ArgValueCompleter, CompletionCandidate};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, ListParams};
use maintenance_crds::NodeMaintenance;

/// cobra's ShellCompDirectiveNoFileComp: the shell offers no file names instead.
const NO_FILE_COMPLETION: u8 = 4;
/// Completion must answer while the user waits: an unreachable cluster gives no names, quickly.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(5);

/// The completion output for the words kubectl passes (everything after `kubectl maintenance`).
pub fn complete(words: Vec<OsString>) -> String {
    let cluster = Arc::new(Cluster::new(&words));
    let mut cmd = command(&cluster);
    let mut args = vec![OsString::from("kubectl-maintenance")];
    args.extend(words);
    if args.len() == 1 {
        args.push(OsString::new());
    }
    let index = args.len() - 1;
    let candidates =
        clap_complete::engine::complete(&mut cmd, args, index, None).unwrap_or_default();
    let mut out = String::new();
    for candidate in candidates.iter().filter(|c| !c.is_hide_set()) {
        out.push_str(&candidate.get_value().to_string_lossy());
        if let Some(help) = candidate.get_help() {
            let help = help.to_string();
            if let Some(first) = help.lines().next().filter(|l| !l.is_empty()) {
                out.push('\t');
                out.push_str(first);
            }
        }
        out.push('\n');
    }
    out.push_str(&format!(":{NO_FILE_COMPLETION}\n"));
    out
}

/// The plugin's command line with completers for the values that name cluster objects.
fn command(cluster: &Arc<Cluster>) -> clap::Command {
    let nodes = completer(cluster, Cluster::nodes);
    let requestors = completer(cluster, Cluster::requestors);
    let namespaces = completer(cluster, Cluster::namespaces);
    super::Cli::command()
        .mut_arg("namespace", |a| a.add(namespaces.clone()))
        .mut_arg("operator_namespace", |a| a.add(namespaces))
        .mut_arg("kubeconfig", |a| {
            a.add(clap_complete::engine::ArgValueCompleter::new(
                clap_complete::engine::PathCompleter::file(),
            ))
        })
        .mut_subcommand("request", |c| {
            c.mut_arg("nodes", |a| a.add(nodes.clone()))
                .mut_arg("requestor", |a| a.add(requestors.clone()))
        })
        .mut_subcommand("preflight", |c| c.mut_arg("nodes", |a| a.add(nodes)))
        .mut_subcommand("status", |c| {
            c.mut_arg("requestor", |a| a.add(requestors.clone()))
        })
        .mut_subcommand("rollout", |c| c.mut_arg("requestor", |a| a.add(requestors)))
}

/// A value to offer, with its description.
type Value = (String, Option<String>);

fn completer(cluster: &Arc<Cluster>, values: fn(&Cluster) -> Vec<Value>) -> ArgValueCompleter {
    let cluster = Arc::clone(cluster);
    ArgValueCompleter::new(move |current: &OsStr| {
        let current = current.to_string_lossy();
        values(&cluster)
            .into_iter()
            .filter(|(value, _)| value.starts_with(current.as_ref()))
            .map(|(value, help)| CompletionCandidate::new(value).help(help.map(Into::into)))
            .collect::<Vec<_>>()
    })
}

/// What completion reads from the cluster, fetched on first use (completing a command or a flag
/// never touches the cluster).
struct Cluster {
    kubeconfig: Option<PathBuf>,
    namespace: Option<String>,
    facts: OnceLock<Facts>,
}

#[derive(Default)]
struct Facts {
    nodes: Vec<String>,
    namespaces: Vec<String>,
    /// (name, node, requestor, phase) of the requests in the namespace of requests.
    requests: Vec<(String, String, String, String)>,
}

impl Cluster {
    /// Takes `--kubeconfig` and `-n/--namespace` from the words typed so far.
    fn new(words: &[OsString]) -> Cluster {
        let words: Vec<String> = words
            .iter()
            .map(|w| w.to_string_lossy().into_owned())
            .collect();
        let value = |long: &str, short: Option<&str>| -> Option<String> {
            let mut found = None;
            for (i, word) in words.iter().enumerate() {
                if let Some(v) = word.strip_prefix(&format!("{long}=")) {
                    found = Some(v.to_string());
                } else if (word == long || Some(word.as_str()) == short) && i + 1 < words.len() {
                    found = Some(words[i + 1].clone());
                }
            }
            found.filter(|v| !v.is_empty())
        };
        Cluster {
            kubeconfig: value("--kubeconfig", None).map(PathBuf::from),
            namespace: value("--namespace", Some("-n")),
            facts: OnceLock::new(),
        }
    }

    fn facts(&self) -> &Facts {
        self.facts.get_or_init(|| {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return Facts::default();
            };
            runtime
                .block_on(async { tokio::time::timeout(CLUSTER_TIMEOUT, self.fetch()).await })
                .ok()
                .flatten()
                .unwrap_or_default()
        })
    }

    /// Lists what completion offers; `None` when the cluster cannot be reached. A list the user
    /// may not read stays empty: the others are still offered.
    async fn fetch(&self) -> Option<Facts> {
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = kube::config::Kubeconfig::read_from(path).ok()?;
                kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                    .await
                    .ok()?
            }
            None => kube::Config::infer().await.ok()?,
        };
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config).ok()?;
        let params = ListParams::default();
        let (node_api, namespace_api, request_api) = (
            Api::<Node>::all(client.clone()),
            Api::<Namespace>::all(client.clone()),
            Api::<NodeMaintenance>::namespaced(client, &namespace),
        );
        let (nodes, namespaces, requests) = futures::join!(
            node_api.list_metadata(&params),
            namespace_api.list_metadata(&params),
            request_api.list(&params),
        );
        let mut requests: Vec<_> = requests
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|r| {
                let phase = r.phase().as_str().to_string();
                Some((
                    r.metadata.name?,
                    r.spec.node_name,
                    r.spec.requestor_id,
                    phase,
                ))
            })
            .collect();
        requests.sort_by(|a, b| super::natural_cmp(&a.0, &b.0));
        Some(Facts {
            nodes: nodes.map(names).unwrap_or_default(),
            namespaces: namespaces.map(names).unwrap_or_default(),
            requests,
        })
    }

    /// Node names; a node under maintenance says by which request.
    fn nodes(&self) -> Vec<Value> {
        let facts = self.facts();
        facts
            .nodes
            .iter()
            .map(|node| {
                let on_node: Vec<String> = facts
                    .requests
                    .iter()
                    .filter(|(_, n, _, _)| n == node)
                    .map(|(name, _, _, phase)| format!("{name} ({phase})"))
                    .collect();
                let help =
                    (!on_node.is_empty()).then(|| format!("requested: {}", on_node.join(", ")));
                (node.clone(), help)
            })
            .collect()
    }

    /// Requestor IDs of the requests in the namespace, with the names of their requests.
    fn requestors(&self) -> Vec<Value> {
        let mut by_requestor: Vec<(String, Vec<String>)> = Vec::new();
        for (name, _, requestor, _) in &self.facts().requests {
            match by_requestor.iter_mut().find(|(r, _)| r == requestor) {
                Some((_, names)) => names.push(name.clone()),
                None => by_requestor.push((requestor.clone(), vec![name.clone()])),
            }
        }
        by_requestor.sort();
        by_requestor
            .into_iter()
            .map(|(requestor, names)| (requestor, Some(names.join(", "))))
            .collect()
    }

    fn namespaces(&self) -> Vec<Value> {
        self.facts()
            .namespaces
            .iter()
            .map(|ns| (ns.clone(), None))
            .collect()
    }
}

/// The names of listed objects, in natural order.
fn names<K: Clone>(list: kube::core::ObjectList<kube::core::PartialObjectMeta<K>>) -> Vec<String> {
    let mut names: Vec<String> = list
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect();
    names.sort_by(|a, b| super::natural_cmp(a, b));
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn commands_and_flags_complete_without_a_cluster() {
        let out = complete(words(&[""]));
        for command in ["request", "status", "plan", "preflight", "rollout"] {
            assert!(
                out.lines().any(|l| l.starts_with(&format!("{command}\t"))),
                "{out}"
            );
        }
        assert!(out.ends_with(":4\n"), "{out}");
        let out = complete(words(&["request", "--dr"]));
        assert!(out.lines().any(|l| l.starts_with("--drain")), "{out}");
        let out = complete(words(&["status", "--"]));
        assert!(
            out.lines().any(|l| l.starts_with("--all-namespaces")),
            "{out}"
        );
    }

    #[test]
    fn kubeconfig_and_namespace_are_read_from_the_words() {
        let cluster = Cluster::new(&words(&["-n", "team", "--kubeconfig=/k", "request", ""]));
        assert_eq!(cluster.namespace.as_deref(), Some("team"));
        assert_eq!(cluster.kubeconfig, Some(PathBuf::from("/k")));
        let cluster = Cluster::new(&words(&["request", "--namespace"]));
        assert_eq!(cluster.namespace, None);
    }
}
