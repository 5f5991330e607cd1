//! Shell completion of `kubectl maintenance` against a real control plane: the completion
//! binary run as kubectl runs it (the words after `kubectl maintenance`, the last one being
//! completed), and kubectl itself (`kubectl __complete maintenance ...`, what the shell scripts
//! of `kubectl completion` call) finding `kubectl_complete-maintenance` on PATH.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use support::chart::run;
use support::*;

const MINUTE: Duration = Duration::from_secs(60);

fn completion(kubeconfig: &Path, words: &[&str]) -> Result<String> {
    run(
        Command::new(env!("CARGO_BIN_EXE_kubectl_complete-maintenance"))
            .env("KUBECONFIG", kubeconfig)
            .args(words),
    )
}

/// The values offered (the part of each line before the description).
fn values(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| !l.starts_with(':'))
        .map(|l| l.split('\t').next().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn completion_offers_commands_flags_nodes_and_requests_from_the_cluster() -> Result<()> {
    let testbed = Testbed::shared().await?;
    let client = testbed.client().await?;
    install(&client, None).await?;
    let ns = unique_name("complete");
    create_namespace(&client, &ns).await?;
    let prefix = unique_name("compnode");
    let nodes = create_nodes(&client, &prefix, 2, &[]).await?;
    let requestor = "completion-test.maintenance.nvidia.com";
    let request = format!("{requestor}-{}", nodes[0]);
    request_node(&client, &ns, &request, &nodes[0], requestor).await?;
    let kubeconfig = testbed.kubeconfig_path();

    let out = completion(kubeconfig, &[""])?;
    for command in ["request", "status", "plan", "preflight", "rollout"] {
        ensure!(values(&out).contains(&command), "no {command} in:\n{out}");
    }
    ensure!(out.ends_with(":4\n"), "no directive closes:\n{out}");
    let out = completion(kubeconfig, &["request", "--"])?;
    for flag in ["--requestor", "--drain", "--force", "--namespace"] {
        ensure!(values(&out).contains(&flag), "no {flag} in:\n{out}");
    }

    // Node names from the cluster; the node under maintenance names its request.
    let out = completion(kubeconfig, &["-n", &ns, "request", &prefix])?;
    ensure!(values(&out) == nodes, "nodes {nodes:?}, offered:\n{out}");
    let first = out
        .lines()
        .find(|l| l.starts_with(&format!("{}\t", nodes[0])))
        .context("no line for the first node")?;
    ensure!(first.contains(&request), "{first}");
    let out = completion(kubeconfig, &["preflight", &prefix])?;
    ensure!(values(&out) == nodes, "preflight offered:\n{out}");

    // Requestors with the names of their requests, in the namespace given by -n.
    let out = completion(kubeconfig, &["status", "-n", &ns, "--requestor", ""])?;
    ensure!(
        out.lines()
            .any(|l| l.starts_with(&format!("{requestor}\t")) && l.contains(&request)),
        "requestor {requestor} with request {request} not offered:\n{out}"
    );
    let out = completion(kubeconfig, &["--namespace", &ns[..4]])?;
    ensure!(
        values(&out).contains(&ns.as_str()),
        "namespaces offered:\n{out}"
    );

    // kubectl itself finds the completion executable on PATH.
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_kubectl_complete-maintenance"))
        .parent()
        .context("binary without a directory")?;
    let mut path = OsString::from(bin_dir);
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    let out = run(Command::new("kubectl")
        .env("PATH", &path)
        .env("KUBECONFIG", kubeconfig)
        .args(["__complete", "maintenance", "request", "-n", &ns, &prefix]))?;
    ensure!(
        nodes
            .iter()
            .all(|n| out.lines().any(|l| l.starts_with(n.as_str()))),
        "kubectl __complete did not offer {nodes:?}:\n{out}"
    );

    // The plugin binary answers the same when called by the completion name (a symbolic link).
    let dir = tempfile::tempdir()?;
    let link = dir.path().join("kubectl_complete-maintenance");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kubectl-maintenance"), &link)?;
    let out = run(Command::new(&link)
        .env("KUBECONFIG", kubeconfig)
        .args(["request", &prefix]))?;
    ensure!(values(&out) == nodes, "the symbolic link offered:\n{out}");

    delete_request(&client, &ns, &request).await?;
    let _ = wait_request_gone(&client, &ns, &request, MINUTE).await;
    Ok(())
}
