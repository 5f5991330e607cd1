//! `kubectl_complete-maintenance`: shell completion of the `kubectl maintenance` plugin.
//!
//! kubectl (>= 1.26) runs it on `kubectl maintenance <TAB>` when it is on `PATH` next to
//! `kubectl-maintenance`, with the words typed so far; it prints the candidates in cobra's format.
//! It completes commands and flags, and node names, requestor IDs and namespaces from the
//! cluster (`--kubeconfig`, else KUBECONFIG, else ~/.kube/config). A symbolic link of this name to
//! `kubectl-maintenance` does the same (that is how a krew install adds it).

#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::process::ExitCode;

use maintenance_operator::kubectl::complete;

fn main() -> ExitCode {
    let out = complete::complete(std::env::args_os().skip(1).collect());
    match std::io::stdout().write_all(out.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(2),
    }
}
