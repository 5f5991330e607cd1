//! `kubectl-maintenance`: the kubectl plugin of the maintenance operator.
//!
//! Install it anywhere on `PATH` (e.g. `cargo install --path . --bin kubectl-maintenance`, or copy
//! `target/release/kubectl-maintenance`) and kubectl finds it: `kubectl maintenance ...`.
//!
//! ```text
//! # Ask for maintenance of two nodes (idempotent), and follow it
//! kubectl maintenance request node-1 node-2 --requestor fw.example.com --drain --force
//! kubectl maintenance status                # NAME NODE REQUESTOR PHASE READY FAILED DRAIN WAITING FOR
//! kubectl maintenance status --watch        # live bars per node and overall, until all are Ready
//! kubectl delete nodemaintenance fw.example.com-node-1   # done: the operator uncordons
//!
//! # Before anyone starts: what would block a drain, or cause downtime, and why
//! kubectl maintenance preflight --selector pool=gpu --force
//!
//! # Why is my request still Pending? (the operator's scheduler, dry run)
//! kubectl maintenance plan
//!
//! # Every node of a pool: request, run a command as each becomes Ready, release; resumable
//! kubectl maintenance rollout --selector pool=gpu --requestor fw.example.com --drain --force \
//!     --exec 'ssh "$NODE" sudo /opt/fw/flash && ssh "$NODE" sudo reboot'
//! ```
//!
//! Global flags: `-n/--namespace` (where requests are created and listed; default the kubeconfig
//! context's namespace, else `default`), `--kubeconfig`, `--operator-namespace`. Every command
//! has `--help`. Exit codes: 0 success; 1 the answer is no (`preflight` found a blocker,
//! `rollout` stopped because the command failed on a node); 2 errors; 130 interrupted.
//!
//! A rollout keeps its state on the cluster: the requests, and the Node annotation
//! `maintenance.nvidia.com/rollout-<requestor>=done` on each finished node (removed when the
//! rollout completes). Run the same command again to resume after Ctrl-C or a failure.
//!
//! Shell completion: kubectl runs `kubectl_complete-maintenance` from `PATH` on
//! `kubectl maintenance <TAB>`. That is a binary of its own, or a symbolic link of that name to
//! this one: called by that name, this binary answers the completion request instead.

#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use maintenance_operator::kubectl::{self, Cli, complete};

fn main() -> ExitCode {
    let mut args = std::env::args_os();
    let called_as = args.next().unwrap_or_default();
    if Path::new(&called_as)
        .file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with("kubectl_complete-"))
    {
        let out = complete::complete(args.collect());
        return match std::io::stdout().write_all(out.as_bytes()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(2),
        };
    }
    let cli = Cli::parse();
    if let Some(path) = &cli.global.kubeconfig {
        if !path.is_file() {
            eprintln!(
                "error: --kubeconfig {}: no such file; pass the path of a kubeconfig",
                path.display()
            );
            return ExitCode::from(2);
        }
        // SAFETY: no other thread exists yet (the runtime is built below), so nothing can read
        // the environment concurrently. Every command, `plan` included, loads its configuration
        // through KUBECONFIG.
        unsafe { std::env::set_var("KUBECONFIG", path) };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(kubectl::run(cli))
}
