//! The `kubectl maintenance` plugin: request, watch, preflight and roll out node maintenance.
//!
//! The binary (`src/bin/kubectl-maintenance.rs`) only parses the command line and calls [`run`].
//! Everything the plugin knows lives on the cluster (requests, and a Node annotation per finished
//! node during a rollout), so every command can be interrupted and run again.

mod board;
pub mod complete;
mod names;
mod preflight;
mod request;
mod rollout;
mod status;
mod view;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use maintenance_actors::context::api_status_code;
pub(crate) use maintenance_actors::context::{is_conflict, is_not_found};

use crate::plan;

const EXIT_CODES: &str = "\
Exit codes:
  0    success
  1    the command ran but the answer is no: `preflight` found something that would block a
       drain, or `rollout` stopped because the command failed on a node
  2    an error: bad arguments, no cluster, the API server refused (the message says what to do)
  130  interrupted (Ctrl-C); `rollout` resumes when run again";

/// Request, watch, check and roll out node maintenance (maintenance.nvidia.com/v1alpha1).
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-maintenance",
    bin_name = "kubectl maintenance",
    version,
    after_help = EXIT_CODES
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Namespace of the NodeMaintenance requests to create or list [default: the namespace of the
    /// kubeconfig context, else `default`].
    #[arg(short, long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// The kubeconfig file to use [default: $KUBECONFIG, else ~/.kube/config, else in-cluster].
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// Namespace the operator runs in: its MaintenanceOperatorConfig `default` lives there, and
    /// its own pods are never drained.
    #[arg(
        long,
        global = true,
        env = "OPERATOR_NAMESPACE",
        default_value = "maintenance-operator",
        value_name = "NAMESPACE"
    )]
    pub operator_namespace: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a NodeMaintenance for each node (idempotent: an identical existing request is fine).
    #[command(after_help = request::AFTER_HELP)]
    Request(request::RequestArgs),
    /// Show the requests with phase, drain progress and what each waits for; --watch follows them.
    Status(status::StatusArgs),
    /// Dry-run one scheduling round: which Pending requests would be admitted now, and why not.
    Plan(PlanCommandArgs),
    /// Check live whether nodes can be drained: the pods that would block or go down, and why.
    #[command(after_help = preflight::AFTER_HELP)]
    Preflight(preflight::PreflightArgs),
    /// Maintain every matching node: request, run a command as each becomes Ready, release.
    #[command(after_help = rollout::AFTER_HELP)]
    Rollout(rollout::RolloutArgs),
}

/// `plan` with the plugin's global flags: the operator namespace comes from
/// `--operator-namespace`, because `-n` names the namespace of requests everywhere else.
#[derive(Debug, Clone, Args)]
pub struct PlanCommandArgs {
    /// Read Nodes, NodeMaintenances and the MaintenanceOperatorConfig from this YAML file (`-`
    /// reads stdin) instead of the cluster, e.g. the output of
    /// `kubectl get nodes,nodemaintenances -A -o yaml`.
    #[arg(long, value_name = "FILE")]
    pub from_file: Option<PathBuf>,

    /// Output format.
    #[arg(short, long, value_enum, default_value_t = plan::OutputFormat::Table)]
    pub output: plan::OutputFormat,

    /// Plan as if it were this time (RFC 3339): which maintenance windows are open. Default: now.
    #[arg(long, value_name = "TIME")]
    pub at: Option<jiff::Timestamp>,
}

/// How a command ended when it did not fail with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// The command worked, and the answer is no (see the exit codes in `--help`).
    No,
    Interrupted,
}

impl Outcome {
    fn exit_code(self) -> ExitCode {
        match self {
            Outcome::Success => ExitCode::SUCCESS,
            Outcome::No => ExitCode::from(1),
            Outcome::Interrupted => ExitCode::from(130),
        }
    }
}

/// Runs one plugin command and turns its result into the documented exit code.
pub async fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Request(args) => request::run(&cli.global, args).await,
        Command::Status(args) => status::run(&cli.global, args).await,
        Command::Plan(args) => plan::run(plan::PlanArgs {
            from_file: args.from_file,
            output: args.output,
            namespace: cli.global.operator_namespace.clone(),
            at: args.at,
        })
        .await
        .map(|()| Outcome::Success),
        Command::Preflight(args) => preflight::run(&cli.global, args).await,
        Command::Rollout(args) => rollout::run(&cli.global, args).await,
    };
    match result {
        Ok(outcome) => outcome.exit_code(),
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// A client for the cluster, and the namespace for requests (`-n`, else the context's).
pub(crate) async fn connect(global: &GlobalArgs) -> anyhow::Result<(kube::Client, String)> {
    let config = kube::Config::infer().await.context(
        "cannot load a Kubernetes configuration: pass --kubeconfig FILE, set KUBECONFIG, \
         or run inside a pod",
    )?;
    let namespace = global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let url = config.cluster_url.to_string();
    let client = kube::Client::try_from(config)
        .with_context(|| format!("cannot build a client for the API server at {url}"))?;
    Ok((client, namespace))
}

/// Says what to do about a failed API call on `what` (e.g. "list NodeMaintenances in default").
pub(crate) fn api_error(err: kube::Error, what: &str) -> anyhow::Error {
    let hint = match api_status_code(&err) {
        Some(404) if what.contains("NodeMaintenance") => {
            " (is the NodeMaintenance CRD installed? `kubectl apply -f crds/crds.yaml` or install \
             the Helm chart)"
        }
        Some(403) => {
            " (forbidden: ask a cluster admin for the RBAC permission, or use another --kubeconfig)"
        }
        Some(401) => {
            " (unauthorized: your credentials were refused; refresh them or use another --kubeconfig)"
        }
        Some(_) => "",
        None => {
            " (cannot reach the API server: check that the cluster is up and that --kubeconfig or \
             KUBECONFIG points at it)"
        }
    };
    anyhow::Error::new(err).context(format!("cannot {what}{hint}"))
}

/// Compares names so that `node-2` sorts before `node-10`.
pub(crate) fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return std::cmp::Ordering::Equal,
            (None, Some(_)) => return std::cmp::Ordering::Less,
            (Some(_), None) => return std::cmp::Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let da = a.iter().take_while(|c| c.is_ascii_digit()).count();
                let db = b.iter().take_while(|c| c.is_ascii_digit()).count();
                let (na, nb) = (&a[..da], &b[..db]);
                let trim = |n: &[u8]| -> usize { n.iter().take_while(|&&c| c == b'0').count() };
                let (ta, tb) = (&na[trim(na)..], &nb[trim(nb)..]);
                let order = ta.len().cmp(&tb.len()).then_with(|| ta.cmp(tb));
                if order != std::cmp::Ordering::Equal {
                    return order;
                }
                a = &a[da..];
                b = &b[db..];
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                a = &a[1..];
                b = &b[1..];
            }
        }
    }
}

/// A duration as people read it: `850ms`, `12.3s`, `4m05s`, `1h02m`.
pub(crate) fn human_duration(d: std::time::Duration) -> String {
    let secs = d.as_secs();
    if secs < 1 {
        format!("{}ms", d.as_millis())
    } else if secs < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn natural_order_puts_numbers_in_numeric_order() {
        let mut names = vec!["node-10", "node-2", "node-1", "a", "node-02b", "node-2a"];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            names,
            ["a", "node-1", "node-2", "node-2a", "node-02b", "node-10"]
        );
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(human_duration(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(human_duration(Duration::from_secs(245)), "4m05s");
        assert_eq!(human_duration(Duration::from_secs(3720)), "1h02m");
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
