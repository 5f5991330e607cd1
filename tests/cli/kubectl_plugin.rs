//! The `kubectl-maintenance` plugin as a user runs it: the built binary against a live control
//! plane, asserting on what the cluster shows afterwards (and on the output a person reads).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use maintenance_crds::NodeMaintenance;
use support::invariants::*;
use support::operator::*;
use support::*;
use tokio::sync::{Mutex, OnceCell};

const WAIT: Duration = Duration::from_secs(90);
/// Longest a plugin command may take here; a rollout of four nodes takes seconds.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(180);
const PLUGIN: &str = env!("CARGO_BIN_EXE_kubectl-maintenance");

/// The operator acts on every request of the cluster, so the tests that need one take turns,
/// each with an operator of its own that stops when the test ends (even on failure).
static OPERATOR_TURN: Mutex<()> = Mutex::const_new(());

/// The testbed of this file, with the CRDs, the operator's namespace and a `default` config
/// whose limits never hold a test back (other tests' requests may take slots).
async fn cluster() -> Result<&'static Testbed> {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    let testbed = Testbed::shared().await?;
    INSTALLED
        .get_or_try_init(|| async {
            install(&testbed.client().await?, Some(limits(1000, None))).await
        })
        .await?;
    Ok(testbed)
}

/// Runs the plugin with `args` against `kubeconfig` (none: no cluster at all).
async fn plugin(kubeconfig: Option<&Path>, args: &[&str]) -> Result<Output> {
    let mut command = tokio::process::Command::new(PLUGIN);
    if let Some(kubeconfig) = kubeconfig {
        command.arg("--kubeconfig").arg(kubeconfig);
    }
    command
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("OPERATOR_NAMESPACE")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(COMMAND_TIMEOUT, command.output())
        .await
        .with_context(|| {
            format!("kubectl-maintenance {args:?} did not end in {COMMAND_TIMEOUT:?}")
        })?
        .with_context(|| format!("running kubectl-maintenance {args:?}"))
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn describe(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        output.status.code(),
        stdout(output),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A namespace and `count` fresh Ready nodes carrying `NODE_PREFIX_LABEL=<prefix>`.
async fn setup(
    testbed: &Testbed,
    name: &str,
    count: usize,
) -> Result<(Client, String, String, Vec<String>)> {
    let client = testbed.client().await?;
    let ns = unique_name(name);
    create_namespace(&client, &ns).await?;
    let prefix = unique_name(name);
    let nodes = create_nodes(&client, &prefix, count, &[]).await?;
    wait_nodes_ready(&client, &nodes, WAIT).await?;
    Ok((client, ns, prefix, nodes))
}

async fn requests_in(client: &Client, ns: &str) -> Result<Vec<NodeMaintenance>> {
    list_requests(client, ns).await
}

#[tokio::test]
async fn help_works_for_every_command_without_a_cluster() -> Result<()> {
    for command in [
        vec!["--help"],
        vec!["request", "--help"],
        vec!["status", "--help"],
        vec!["plan", "--help"],
        vec!["preflight", "--help"],
        vec!["rollout", "--help"],
    ] {
        let output = plugin(None, &command).await?;
        assert!(
            output.status.success(),
            "{command:?}: {}",
            describe(&output)
        );
        let text = stdout(&output);
        let usage = match command[0] {
            "--help" => "Usage: kubectl maintenance [OPTIONS] <COMMAND>".to_string(),
            sub => format!("Usage: kubectl maintenance {sub}"),
        };
        assert!(text.contains(&usage), "{command:?}: {text}");
        assert!(text.contains("--namespace"), "{command:?}: {text}");
        assert!(text.contains("--kubeconfig"), "{command:?}: {text}");
    }

    let missing = plugin(None, &["request", "node-1"]).await?;
    assert_eq!(missing.status.code(), Some(2), "{}", describe(&missing));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("--requestor"));

    let no_file = plugin(Some(Path::new("no-such-kubeconfig")), &["status"]).await?;
    assert_eq!(no_file.status.code(), Some(2), "{}", describe(&no_file));
    assert!(String::from_utf8_lossy(&no_file.stderr).contains("--kubeconfig no-such-kubeconfig"));
    Ok(())
}

#[tokio::test]
async fn request_creates_the_objects_idempotently_and_status_lists_them() -> Result<()> {
    let testbed = cluster().await?;
    let (client, ns, _, nodes) = setup(testbed, "kreq", 2).await?;
    let kubeconfig = Some(testbed.kubeconfig_path());
    let args = [
        "request",
        &nodes[0],
        &nodes[1],
        "--requestor",
        "Plugin-Test.example.com",
        "--force",
        "--timeout",
        "120",
        "--pod-selector",
        "app=web",
        "--wait-for-pods",
        "job-name",
        "--no-cordon",
        "--additional-requestor",
        "other.example.com",
        "-n",
        &ns,
    ];
    let created = plugin(kubeconfig, &args).await?;
    assert!(created.status.success(), "{}", describe(&created));
    assert_eq!(
        stdout(&created).matches(" created ").count(),
        2,
        "{}",
        describe(&created)
    );

    let mut requests = requests_in(&client, &ns).await?;
    requests.sort_by_key(|r| r.spec.node_name.clone());
    assert_eq!(requests.len(), 2);
    for (request, node) in requests.iter().zip(&nodes) {
        assert_eq!(
            request.name_any(),
            format!("plugin-test.example.com-{node}")
        );
        let spec = &request.spec;
        assert_eq!(spec.node_name, *node);
        assert_eq!(spec.requestor_id, "Plugin-Test.example.com");
        assert_eq!(spec.additional_requestors(), ["other.example.com"]);
        assert!(!spec.cordon());
        let drain = spec.drain_spec.clone().context("drainSpec set")?;
        assert!(drain.force());
        assert!(!drain.delete_empty_dir());
        assert_eq!(drain.timeout_seconds(), 120);
        assert_eq!(drain.pod_selector.as_deref(), Some("app=web"));
        let wait = spec
            .wait_for_pod_completion
            .clone()
            .context("waitForPodCompletion set")?;
        assert_eq!(wait.pod_selector.as_deref(), Some("job-name"));
    }

    let again = plugin(kubeconfig, &args).await?;
    assert!(again.status.success(), "{}", describe(&again));
    assert_eq!(
        stdout(&again).matches(" unchanged ").count(),
        2,
        "{}",
        describe(&again)
    );
    assert_eq!(requests_in(&client, &ns).await?.len(), 2);

    // Same names, another spec: refused, naming the object and what to do.
    let differs = plugin(
        kubeconfig,
        &[
            "request",
            &nodes[0],
            "--requestor",
            "Plugin-Test.example.com",
            "-n",
            &ns,
        ],
    )
    .await?;
    assert_eq!(differs.status.code(), Some(2), "{}", describe(&differs));
    let error = String::from_utf8_lossy(&differs.stderr);
    assert!(
        error.contains(&format!(
            "NodeMaintenance {ns}/plugin-test.example.com-{}",
            nodes[0]
        )) && error.contains("kubectl delete nodemaintenance"),
        "{error}"
    );

    let unknown = plugin(
        kubeconfig,
        &[
            "request",
            "no-such-node-xyz",
            "--requestor",
            "x.example.com",
            "-n",
            &ns,
        ],
    )
    .await?;
    assert_eq!(unknown.status.code(), Some(2), "{}", describe(&unknown));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no such node: no-such-node-xyz"));

    let status = plugin(kubeconfig, &["status", "-n", &ns]).await?;
    assert!(status.status.success(), "{}", describe(&status));
    let table = stdout(&status);
    // The table ends at the first empty line; a "Why Pending:" section may follow when an
    // operator of another test has seen the requests.
    let lines: Vec<&str> = table.lines().take_while(|l| !l.is_empty()).collect();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("WAITING FOR"),
        "{table}"
    );
    assert_eq!(lines.len(), 3, "{table}");
    for (line, node) in lines[1..].iter().zip(&nodes) {
        assert!(
            line.starts_with(&format!("plugin-test.example.com-{node} "))
                && line.contains("Plugin-Test.example.com"),
            "{table}"
        );
    }

    let all = plugin(
        kubeconfig,
        &["status", "-A", "--requestor", "Plugin-Test.example.com"],
    )
    .await?;
    assert!(all.status.success(), "{}", describe(&all));
    let all = stdout(&all);
    assert!(all.starts_with("NAMESPACE"), "{all}");
    assert!(
        all.lines().filter(|l| l.starts_with(&ns)).count() == 2,
        "{all}"
    );

    let empty = plugin(
        kubeconfig,
        &["status", "-n", "default", "--requestor", "nobody"],
    )
    .await?;
    assert!(
        stdout(&empty).contains("No NodeMaintenance requests"),
        "{}",
        describe(&empty)
    );
    Ok(())
}

#[tokio::test]
async fn preflight_names_what_blocks_and_passes_a_healthy_node() -> Result<()> {
    let testbed = cluster().await?;
    let (client, ns, prefix, nodes) = setup(testbed, "kpre", 2).await?;
    let (risky, healthy) = (&nodes[0], &nodes[1]);
    let kubeconfig = Some(testbed.kubeconfig_path());

    // On the risky node: one replica behind minAvailable 1, a bare pod, an emptyDir pod.
    create_app_deployment(&client, &ns, "db", 1, &PodSpecOptions::on_node(risky)).await?;
    create_app_pdb(&client, &ns, "db", 1).await?;
    create_bare_pod(&client, &ns, "loner", risky, &BarePodOptions::default()).await?;
    let scratch = PodSpecOptions {
        empty_dir: true,
        ..PodSpecOptions::on_node(risky)
    };
    create_app_deployment(&client, &ns, "scratch", 2, &scratch).await?;
    // On the healthy node: two replicas paced by maxUnavailable 1; a DaemonSet on both.
    create_app_deployment(&client, &ns, "web", 2, &PodSpecOptions::on_node(healthy)).await?;
    create_pdb_max_unavailable(&client, &ns, "web", &[("app", "web")], IntOrString::Int(1)).await?;
    create_daemonset(
        &client,
        &ns,
        "agent",
        &[("app", "agent")],
        &PodSpecOptions::on_nodes_with_prefix(&prefix),
    )
    .await?;
    for (selector, count) in [
        ("app=db", 1),
        ("app=scratch", 2),
        ("app=web", 2),
        ("app=agent", 2),
    ] {
        wait_pods_ready(&client, &ns, selector, count, WAIT).await?;
    }
    wait_pdb_disruptions_allowed(&client, &ns, "db", 0, WAIT).await?;
    wait_pdb_disruptions_allowed(&client, &ns, "web", 1, WAIT).await?;

    let blocked = plugin(kubeconfig, &["preflight", risky]).await?;
    assert_eq!(blocked.status.code(), Some(1), "{}", describe(&blocked));
    let text = stdout(&blocked);
    assert!(text.starts_with(&format!("{risky}: BLOCKED")), "{text}");
    let finding = |check: &str, pod_prefix: &str| {
        text.lines()
            .any(|line| line.contains(check) && line.contains(&format!("{ns}/{pod_prefix}")))
    };
    assert!(finding("PDBNeverAllows", "db-"), "{text}");
    assert!(
        text.contains(&format!("PodDisruptionBudget {ns}/db: minAvailable 1")),
        "{text}"
    );
    assert!(finding("SingleReplica", "db-"), "{text}");
    assert!(finding("NeedsForce", "loner"), "{text}");
    assert!(finding("NeedsDeleteEmptyDir", "scratch-"), "{text}");
    assert!(
        !text.contains("agent"),
        "DaemonSet pods are not drained: {text}"
    );

    // The web and db pods are pinned to their node (nodeSelector on the hostname): the capacity
    // check would warn that they may run nowhere else; what is checked here is the rest.
    let ok = plugin(kubeconfig, &["preflight", healthy, "--skip-capacity"]).await?;
    assert_eq!(ok.status.code(), Some(0), "{}", describe(&ok));
    assert!(
        stdout(&ok).starts_with(&format!("{healthy}: ok (2 pods to evict")),
        "{}",
        describe(&ok)
    );

    // With the flags a drain would use, the bare and emptyDir pods only warn; the PDB still blocks.
    let json = plugin(
        kubeconfig,
        &[
            "preflight",
            "--selector",
            &format!("{NODE_PREFIX_LABEL}={prefix}"),
            "--force",
            "--delete-emptydir",
            "--skip-capacity",
            "-o",
            "json",
        ],
    )
    .await?;
    assert_eq!(json.status.code(), Some(1), "{}", describe(&json));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout)?;
    assert_eq!(report["blocked"], 1, "{report:#}");
    let by_node: BTreeMap<String, &serde_json::Value> = report["nodes"]
        .as_array()
        .context("nodes is a list")?
        .iter()
        .map(|n| (n["node"].as_str().unwrap_or_default().to_string(), n))
        .collect();
    assert_eq!(by_node[healthy.as_str()]["verdict"], "ok");
    let risky_report = by_node[risky.as_str()];
    assert_eq!(risky_report["verdict"], "blocked");
    let checks: Vec<(String, String)> = risky_report["findings"]
        .as_array()
        .context("findings is a list")?
        .iter()
        .map(|f| {
            (
                f["check"].as_str().unwrap_or_default().to_string(),
                f["severity"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    for expected in [
        ("PDBNeverAllows", "block"),
        ("NoController", "warn"),
        ("EmptyDirDataLoss", "warn"),
    ] {
        assert!(
            checks.contains(&(expected.0.to_string(), expected.1.to_string())),
            "{expected:?} in {checks:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn preflight_checks_that_the_evicted_pods_fit_elsewhere() -> Result<()> {
    let testbed = cluster().await?;
    let client = testbed.client().await?;
    let ns = unique_name("kcap");
    create_namespace(&client, &ns).await?;
    let prefix = unique_name("kcap");
    // Three small nodes; two pods of 3 CPU that may only run on them land on two of them.
    let nodes = create_nodes_with(&client, &prefix, 3, &NodeOptions::sized("4", "8Gi")).await?;
    wait_nodes_ready(&client, &nodes, WAIT).await?;
    let big = PodSpecOptions::on_nodes_with_prefix(&prefix).requesting("3", "1Gi");
    create_app_deployment(&client, &ns, "big", 2, &big).await?;
    wait_pods_ready(&client, &ns, "app=big", 2, WAIT).await?;
    let mut occupied: Vec<String> = Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels("app=big"))
        .await?
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect();
    occupied.sort();
    occupied.dedup();
    assert_eq!(occupied.len(), 2, "one pod per node: {occupied:?}");
    let kubeconfig = Some(testbed.kubeconfig_path());

    // One node: its pod fits on the empty node.
    let one = plugin(kubeconfig, &["preflight", &occupied[0], "--check-capacity"]).await?;
    assert_eq!(one.status.code(), Some(0), "{}", describe(&one));
    assert!(
        stdout(&one).contains("Capacity: the 1 pod to evict fit on the "),
        "{}",
        describe(&one)
    );

    // Both at once: 6 CPU for the 4 of the empty node. A warning by default...
    let both = [occupied[0].as_str(), occupied[1].as_str()];
    let json = plugin(kubeconfig, &["preflight", both[0], both[1], "-o", "json"]).await?;
    assert_eq!(json.status.code(), Some(0), "{}", describe(&json));
    let report: serde_json::Value = serde_json::from_slice(&json.stdout)?;
    assert_eq!(report["capacity"]["fits"], false, "{report:#}");
    assert_eq!(report["capacity"]["podsToPlace"], 2, "{report:#}");
    let findings: Vec<&serde_json::Value> = report["nodes"]
        .as_array()
        .context("nodes is a list")?
        .iter()
        .flat_map(|n| n["findings"].as_array().into_iter().flatten())
        .filter(|f| f["check"] == "InsufficientCapacity")
        .collect();
    assert_eq!(findings.len(), 1, "{report:#}");
    assert_eq!(findings[0]["severity"], "warn", "{report:#}");
    assert!(
        findings[0]["pod"]
            .as_str()
            .is_some_and(|p| p.starts_with(&format!("{ns}/big-"))),
        "{report:#}"
    );
    // ... and a blocker with --check-capacity.
    let blocked = plugin(
        kubeconfig,
        &["preflight", both[0], both[1], "--check-capacity"],
    )
    .await?;
    assert_eq!(blocked.status.code(), Some(1), "{}", describe(&blocked));
    let text = stdout(&blocked);
    assert!(
        text.lines().any(|l| l.contains("BLOCK")
            && l.contains("InsufficientCapacity")
            && l.contains("pods of the 2 checked nodes together")),
        "{text}"
    );
    assert!(
        text.contains("Capacity: 1 of the 2 pods to evict do not fit"),
        "{text}"
    );

    // --skip-capacity: no check, no finding.
    let skipped = plugin(
        kubeconfig,
        &["preflight", both[0], both[1], "--skip-capacity"],
    )
    .await?;
    assert_eq!(skipped.status.code(), Some(0), "{}", describe(&skipped));
    assert!(
        !stdout(&skipped).contains("Capacity"),
        "{}",
        describe(&skipped)
    );
    Ok(())
}

#[tokio::test]
async fn status_says_why_a_request_is_pending() -> Result<()> {
    // No operator may run meanwhile: it would admit the request and rewrite its condition.
    let _turn = OPERATOR_TURN.lock().await;
    let testbed = cluster().await?;
    let (client, ns, _, nodes) = setup(testbed, "kwhy", 2).await?;
    let kubeconfig = Some(testbed.kubeconfig_path());
    let created = plugin(
        kubeconfig,
        &[
            "request",
            &nodes[0],
            &nodes[1],
            "--requestor",
            "why.example.com",
            "-n",
            &ns,
        ],
    )
    .await?;
    assert!(created.status.success(), "{}", describe(&created));
    // What the operator writes on a request that waits for a slot.
    let message = "no free slot: maxParallelOperations=1, 1 node in maintenance";
    Api::<NodeMaintenance>::namespaced(client.clone(), &ns)
        .patch_status(
            &format!("why.example.com-{}", nodes[0]),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"conditions": [{
                "type": "Ready",
                "status": "False",
                "reason": "Pending",
                "message": message,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }]}})),
        )
        .await?;
    let status = plugin(kubeconfig, &["status", "-n", &ns]).await?;
    assert!(status.status.success(), "{}", describe(&status));
    let text = stdout(&status);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{text}");
    assert_eq!(lines[3], "", "{text}");
    assert_eq!(lines[4], "Why Pending:", "{text}");
    assert!(
        lines[5].starts_with(&format!("  {} ", nodes[0])) && lines[5].ends_with(message),
        "{text}"
    );
    // The request the operator has not seen yet has no reason to show.
    assert_eq!(lines.len(), 6, "{text}");

    // --watch in a pipe prints the same reason as a line (and runs until Ctrl-C: stopped here).
    let mut watch = tokio::process::Command::new(PLUGIN)
        .arg("--kubeconfig")
        .arg(testbed.kubeconfig_path())
        .args(["status", "--watch", "-n", &ns])
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let out = watch.stdout.take().context("stdout is piped")?;
    let wanted = format!("{} Pending: {message}", nodes[0]);
    let mut seen = Vec::new();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        use tokio::io::AsyncBufReadExt;
        let mut reader = tokio::io::BufReader::new(out).lines();
        while let Some(line) = reader.next_line().await? {
            if line == wanted {
                return Ok::<bool, anyhow::Error>(true);
            }
            seen.push(line);
        }
        Ok(false)
    })
    .await;
    watch.kill().await?;
    assert!(
        matches!(found, Ok(Ok(true))),
        "{wanted:?} not printed: {seen:#?}"
    );
    Ok(())
}

async fn node_is_cordoned(client: &Client, node: &str) -> Result<bool> {
    node_unschedulable(client, node).await
}

async fn annotations_of(client: &Client, node: &str) -> Result<BTreeMap<String, String>> {
    let node: Node = Api::<Node>::all(client.clone()).get(node).await?;
    Ok(node.annotations().clone())
}

/// A 4-node pool with pods on it (so that drains have work), labelled `pool=<prefix>`.
async fn pool(testbed: &Testbed, name: &str) -> Result<(Client, String, String, Vec<String>)> {
    let (client, ns, prefix, nodes) = setup(testbed, name, 4).await?;
    for node in &nodes {
        Api::<Node>::all(client.clone())
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": {"pool": prefix}}})),
            )
            .await?;
    }
    create_app_deployment(
        &client,
        &ns,
        "web",
        4,
        &PodSpecOptions::on_nodes_with_prefix(&prefix),
    )
    .await?;
    wait_pods_ready(&client, &ns, "app=web", 4, WAIT).await?;
    Ok((client, ns, prefix, nodes))
}

#[tokio::test]
async fn rollout_runs_the_command_on_every_node_and_releases_them() -> Result<()> {
    let _turn = OPERATOR_TURN.lock().await;
    let testbed = cluster().await?;
    let _operator = Operator::start(testbed, &[]).await?;
    let (client, ns, prefix, nodes) = pool(testbed, "kroll").await?;
    let monitor = InvariantMonitor::start(testbed, Scope::new(&ns, &nodes)).await?;
    let dir = tempfile::tempdir()?;
    let done_file = dir.path().join("done");
    let exec = format!("echo \"$NODE\" >> '{}'", done_file.display());

    let output = plugin(
        Some(testbed.kubeconfig_path()),
        &[
            "rollout",
            "--selector",
            &format!("pool={prefix}"),
            "--requestor",
            "roll.example.com",
            "--drain",
            "--force",
            "--exec",
            &exec,
            "-n",
            &ns,
        ],
    )
    .await?;
    assert!(output.status.success(), "{}", describe(&output));
    let text = stdout(&output);
    assert!(
        text.contains("Rollout complete: 4 of 4 nodes done"),
        "{text}"
    );
    assert!(
        !text.contains('\u{1b}'),
        "no terminal escape codes in a pipe: {text}"
    );

    let mut processed: Vec<String> = std::fs::read_to_string(&done_file)?
        .lines()
        .map(str::to_string)
        .collect();
    processed.sort();
    let mut expected = nodes.clone();
    expected.sort();
    assert_eq!(processed, expected, "the command ran once per node");

    assert!(
        requests_in(&client, &ns).await?.is_empty(),
        "every request released"
    );
    for node in &nodes {
        assert!(!node_is_cordoned(&client, node).await?, "{node} uncordoned");
        let annotations = annotations_of(&client, node).await?;
        assert!(
            !annotations
                .keys()
                .any(|k| k.starts_with("maintenance.nvidia.com/rollout-")),
            "done-marks removed once complete: {node} {annotations:?}"
        );
    }
    monitor.held().await
}

/// `--group-by-label`: the nodes of a rack are requested together as a node group, each request
/// labelled with the group and carrying its size (read back by the command while it is Ready).
#[tokio::test]
async fn rollout_by_rack_requests_each_rack_as_a_node_group() -> Result<()> {
    const RACK: &str = "topology.example.com/rack";
    let _turn = OPERATOR_TURN.lock().await;
    let testbed = cluster().await?;
    let _operator = Operator::start(testbed, &[]).await?;
    let (client, ns, prefix, nodes) = pool(testbed, "krack").await?;
    for (i, node) in nodes.iter().enumerate() {
        let rack = if i < 2 { "r1" } else { "r2" };
        set_node_label(&client, node, RACK, Some(rack)).await?;
    }
    let monitor = InvariantMonitor::start(testbed, Scope::new(&ns, &nodes)).await?;
    let dir = tempfile::tempdir()?;
    let seen = dir.path().join("seen");
    let exec = format!(
        "kubectl --kubeconfig '{}' -n {ns} get nodemaintenance \"${{NODE_MAINTENANCE#*/}}\" \
         -o jsonpath='{{.spec.nodeName}} {{.metadata.labels.maintenance\\.nvidia\\.com/group}} \
         {{.metadata.annotations.maintenance\\.nvidia\\.com/group-size}}{{\"\\n\"}}' >> '{}'",
        testbed.kubeconfig_path().display(),
        seen.display()
    );
    let output = plugin(
        Some(testbed.kubeconfig_path()),
        &[
            "rollout",
            "--selector",
            &format!("pool={prefix}"),
            "--requestor",
            "racks.example.com",
            "--group-by-label",
            RACK,
            "--drain",
            "--force",
            "--exec",
            &exec,
            "-n",
            &ns,
        ],
    )
    .await?;
    assert!(output.status.success(), "{}", describe(&output));
    let text = stdout(&output);
    assert!(
        text.contains(
            "in 2 node groups by label topology.example.com/rack, each admitted together"
        ),
        "{text}"
    );
    assert!(
        text.contains("Rollout complete: 4 of 4 nodes done"),
        "{text}"
    );
    let mut lines: Vec<String> = std::fs::read_to_string(&seen)?
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    lines.sort();
    let mut expected: Vec<String> = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| format!("{node} {} 2", if i < 2 { "r1" } else { "r2" }))
        .collect();
    expected.sort();
    assert_eq!(
        lines, expected,
        "each request in its rack's node group of 2"
    );
    monitor.held().await
}

#[tokio::test]
async fn a_failing_command_stops_the_rollout_and_a_rerun_resumes_it() -> Result<()> {
    let _turn = OPERATOR_TURN.lock().await;
    let testbed = cluster().await?;
    let _operator = Operator::start(testbed, &[]).await?;
    let (client, ns, prefix, nodes) = pool(testbed, "kfail").await?;
    let monitor = InvariantMonitor::start(testbed, Scope::new(&ns, &nodes)).await?;
    let failing = &nodes[2];
    let selector = format!("pool={prefix}");
    let exec = format!("test \"$NODE\" != {failing}");
    let kubeconfig = Some(testbed.kubeconfig_path());

    let output = plugin(
        kubeconfig,
        &[
            "rollout",
            "--selector",
            &selector,
            "--requestor",
            "fail.example.com",
            "--drain",
            "--force",
            "--exec",
            &exec,
            "-n",
            &ns,
        ],
    )
    .await?;
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let text = stdout(&output);
    let request = format!("fail.example.com-{failing}");
    assert!(
        text.contains(&format!("node {failing}: `{exec}` failed (exit status 1)"))
            && text.contains(&format!("kubectl delete nodemaintenance -n {ns} {request}")),
        "{text}"
    );
    assert!(
        get_request(&client, &ns, &request).await?.is_some(),
        "its request stays"
    );
    assert!(
        node_is_cordoned(&client, failing).await?,
        "{failing} stays cordoned"
    );
    // No other request is left behind; other nodes are done or back in service.
    let left: Vec<String> = requests_in(&client, &ns)
        .await?
        .iter()
        .filter(|r| !r.is_deleting())
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(left, vec![request], "{text}");

    // Fixed: the same rollout resumes, runs the command on the failed node again, and finishes.
    let resumed = plugin(
        kubeconfig,
        &[
            "rollout",
            "--selector",
            &selector,
            "--requestor",
            "fail.example.com",
            "--drain",
            "--force",
            "--exec",
            "true",
            "-n",
            &ns,
        ],
    )
    .await?;
    assert!(resumed.status.success(), "{}", describe(&resumed));
    let text = stdout(&resumed);
    assert!(text.contains("1 request picked up"), "{text}");
    assert!(
        text.contains("Rollout complete: 4 of 4 nodes done"),
        "{text}"
    );
    wait_for("the pool to be back in service", WAIT, || async {
        for node in &nodes {
            if node_is_cordoned(&client, node).await? {
                return Ok(None);
            }
        }
        Ok(requests_in(&client, &ns).await?.is_empty().then_some(()))
    })
    .await?;
    if text.contains('\u{1b}') {
        bail!("terminal escape codes in a pipe: {text}");
    }
    monitor.held().await
}
