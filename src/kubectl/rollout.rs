//! `kubectl maintenance rollout`: maintenance of every matching node, one command per node.
//!
//! For each node the rollout creates a request (all at once unless `--max-in-flight`: the
//! operator's limits set the pace), runs the command when the request is Ready, marks the node
//! done with an annotation, deletes the request, and counts the node when the request is gone
//! (the operator has uncordoned it). All of that state is on the cluster, so a rollout stopped in
//! any way picks up where it was when run again. The marks are removed when the rollout
//! completes, so that the same command later is a new rollout.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, conditions, wait::await_condition, watcher};
use kube::{Client, ResourceExt};
use maintenance_crds::{NODE_GROUP_LABEL, NODE_GROUP_SIZE_ANNOTATION, NodeMaintenance};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::board::{Board, Printer};
use super::names::{DONE_VALUE, ROLLOUT_LABEL, done_annotation, request_name, rollout_label_value};
use super::request::{Ensured, MaintenanceFlags, ensure_request};
use super::view::RequestView;
use super::{GlobalArgs, Outcome, api_error, connect, human_duration, is_not_found, natural_cmp};

pub const AFTER_HELP: &str = "\
How it goes, for every node the selector matches:
  1. a NodeMaintenance <prefix>-<node> is created (all at once, or --max-in-flight at a time);
     the operator admits them under its maxParallelOperations and maxUnavailable;
  2. when the request is Ready (cordoned, drained), CMD runs: `sh -c CMD sh <node>`, with
     NODE=<node> and NODE_MAINTENANCE=<namespace>/<request> in its environment; its output is
     shown prefixed with the node name;
  3. when CMD succeeds, the node is marked done (annotation
     maintenance.nvidia.com/rollout-<requestor>=done) and the request is deleted: the operator
     uncordons the node, and the rollout counts it when the request is gone.
  Without --exec, each node is released as soon as it is Ready.

With --group-by-label LABEL, the nodes with one value of LABEL (a rack, a switch) form a node
group: their requests are created together, labelled maintenance.nvidia.com/group=<value> with
the group's size, and the operator admits them all at once or not at all. Each node is then
run and released on its own. Nodes without the label are maintained one by one.

When CMD fails, the rollout stops: that node keeps its request (it stays cordoned), requests
not yet worked on are deleted, and the message says how to release or resume.

Ctrl-C leaves everything in place. Running the same command again resumes: nodes marked done
are skipped, existing requests are picked up, and CMD runs again on a node where it was cut
short (so CMD should be safe to run twice). The marks are removed once the rollout completes;
--restart forgets them earlier. To abandon a rollout instead:
  kubectl delete nodemaintenances -n <namespace> -l maintenance.nvidia.com/rollout=<requestor>

Examples:
  kubectl maintenance rollout --selector pool=gpu --requestor fw.example.com --drain --force \\
      --exec 'ssh \"$NODE\" sudo /opt/fw/flash && ssh \"$NODE\" sudo reboot'
  kubectl maintenance rollout -l type=kwok --requestor demo.example.com --drain --force \\
      --exec 'sleep 1' --max-in-flight 20
  kubectl maintenance rollout -l pool=gpu --requestor fw.example.com --drain --force \\
      --group-by-label topology.example.com/rack --exec 'sleep 1'";

/// Requests created at the same time, at most.
const CREATE_CONCURRENCY: usize = 16;
/// After this long without any progress, the rollout says where to look.
const STALL_HINT_AFTER: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Args)]
pub struct RolloutArgs {
    /// The nodes to maintain: a label selector (kubectl -l syntax), e.g. `pool=gpu`.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: String,

    /// Who asks (e.g. upgrade.example.com); it names the requests and the done-marks.
    #[arg(long, value_name = "ID", value_parser = super::request::parse_requestor_id)]
    pub requestor: String,

    /// Run this shell command on each node once it is Ready (`$NODE` and `$1` are the node's
    /// name); the node is released when it succeeds, and the rollout stops when it fails.
    #[arg(long, value_name = "CMD")]
    pub exec: Option<String>,

    /// At most this many nodes with a request at a time [default: all at once, the operator's
    /// limits set the pace].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight: Option<u32>,

    /// Forget the done-marks of an earlier, unfinished rollout of this requestor: every
    /// matching node is maintained again.
    #[arg(long)]
    pub restart: bool,

    /// Maintain the nodes with one value of this node label together (a rack, a switch): their
    /// requests are created at once as a node group (label maintenance.nvidia.com/group, with
    /// the group's size), which the operator admits whole or not at all.
    #[arg(long, value_name = "LABEL")]
    pub group_by_label: Option<String>,

    #[command(flatten)]
    pub flags: MaintenanceFlags,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// No request yet (waiting for room under --max-in-flight).
    Queued,
    /// The request is being created (or an old one of the same name is still going away).
    Creating,
    /// The request exists; the operator works on it.
    Requested,
    /// The command runs.
    Running,
    /// Marked done; the request is deleted and the operator uncordons.
    Releasing,
    /// The request is gone after the node was marked done.
    Done,
    /// The command failed, or something about this node went wrong; the request stays.
    Failed(String),
    /// Stopping after a failure elsewhere: the request is being deleted.
    Cancelling,
    Cancelled,
}

struct Track {
    node: String,
    request: String,
    /// The node's value of --group-by-label: its node group.
    group: Option<String>,
    state: State,
    /// The request was seen on the cluster (so its disappearance means a deletion).
    seen: bool,
    view: Option<RequestView>,
    since: Instant,
    ready_after: Option<Duration>,
    exec_started: Option<Instant>,
}

enum TaskResult {
    Created(usize, Result<Ensured, String>),
    Executed(usize, Result<(), String>),
    Released(usize, Result<bool, String>),
    Cancelled(usize, Result<(), String>),
}

struct Rollout {
    args: RolloutArgs,
    namespace: String,
    nodes_api: Api<Node>,
    requests_api: Api<NodeMaintenance>,
    marker: String,
    label: String,
    tracks: Vec<Track>,
    by_request: HashMap<String, usize>,
    tasks: JoinSet<TaskResult>,
    create_slots: Arc<Semaphore>,
    board: Board,
    started: Instant,
    last_progress: Instant,
    stall_hinted: bool,
    stopping: bool,
    /// The first failure: (node index, message).
    failure: Option<(usize, String)>,
    done_before: usize,
}

/// `sh -c CMD sh NODE`, its output printed line by line with the node name in front.
async fn run_command(
    cmd: String,
    node: String,
    request_key: String,
    printer: Printer,
) -> Result<(), String> {
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .arg("sh")
        .arg(&node)
        .env("NODE", &node)
        .env("NODE_MAINTENANCE", &request_key)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|err| format!("cannot start `sh -c {cmd}`: {err}"))?;
    let stdout = forward(child.stdout.take(), &node, &printer);
    let stderr = forward(child.stderr.take(), &node, &printer);
    let (_, _, status) = tokio::join!(stdout, stderr, child.wait());
    let status = status.map_err(|err| format!("cannot wait for `{cmd}`: {err}"))?;
    if status.success() {
        return Ok(());
    }
    Err(match status.code() {
        Some(code) => format!("exit status {code}"),
        None => "killed by a signal".to_string(),
    })
}

/// Prints each line of a command's output stream with the node's name in front.
async fn forward<R: tokio::io::AsyncRead + Unpin>(
    stream: Option<R>,
    node: &str,
    printer: &Printer,
) {
    let Some(stream) = stream else { return };
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        printer.line(&format!("{node}| {line}"));
    }
}

/// Marks the node done, then deletes the request; `Ok(true)` when the request was already gone.
async fn release(
    nodes_api: Api<Node>,
    requests_api: Api<NodeMaintenance>,
    node: String,
    request: String,
    marker: String,
) -> Result<bool, String> {
    let patch = serde_json::json!({"metadata": {"annotations": {marker.clone(): DONE_VALUE}}});
    nodes_api
        .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|err| format!("cannot mark node {node} done (annotation {marker}): {err}"))?;
    match requests_api
        .delete(&request, &DeleteParams::default())
        .await
    {
        Ok(_) => Ok(false),
        Err(err) if is_not_found(&err) => Ok(true),
        Err(err) => Err(format!("cannot delete NodeMaintenance {request}: {err}")),
    }
}

/// Creates the request; an old one of the same name that is going away is waited for first.
async fn create(
    requests_api: Api<NodeMaintenance>,
    nm: NodeMaintenance,
    slots: Arc<Semaphore>,
) -> Result<Ensured, String> {
    let name = nm.name_any();
    let _slot = slots
        .acquire_owned()
        .await
        .map_err(|err| format!("cannot create NodeMaintenance {name}: {err}"))?;
    loop {
        let (outcome, existing) = ensure_request(&requests_api, &nm)
            .await
            .map_err(|err| format!("cannot create NodeMaintenance {name}: {err}"))?;
        if outcome != Ensured::Deleting {
            return Ok(outcome);
        }
        let uid = existing.metadata.uid.clone().unwrap_or_default();
        await_condition(requests_api.clone(), &name, conditions::is_deleted(&uid))
            .await
            .map_err(|err| {
                format!("waiting for the old NodeMaintenance {name} to go away: {err}")
            })?;
    }
}

impl Rollout {
    fn request_key(&self, index: usize) -> String {
        format!("{}/{}", self.namespace, self.tracks[index].request)
    }

    fn in_flight(&self) -> usize {
        self.tracks
            .iter()
            .filter(|t| {
                matches!(
                    t.state,
                    State::Creating | State::Requested | State::Running | State::Releasing
                )
            })
            .count()
    }

    fn count(&self, state: &State) -> usize {
        self.tracks.iter().filter(|t| &t.state == state).count()
    }

    fn set_state(&mut self, index: usize, state: State) {
        let track = &mut self.tracks[index];
        track.state = state;
        self.last_progress = Instant::now();
        self.stall_hinted = false;
    }

    /// Creates requests while there is room, in node order; a node group's all at once, so that
    /// the operator sees the group whole.
    fn fill(&mut self) {
        if self.stopping {
            return;
        }
        let limit = self.args.max_in_flight.map_or(usize::MAX, |n| n as usize);
        let mut room = limit.saturating_sub(self.in_flight());
        for index in 0..self.tracks.len() {
            if self.tracks[index].state != State::Queued {
                continue;
            }
            let batch = match self.tracks[index].group.clone() {
                None => vec![index],
                Some(group) => self.queued_in_group(&group),
            };
            if batch.len() > room {
                break;
            }
            room -= batch.len();
            for &member in &batch {
                self.set_state(member, State::Creating);
            }
            // The requests of the group that exist or are being created: what the operator
            // waits for before it admits the group.
            let size = self.tracks[index].group.as_ref().map(|group| {
                self.tracks
                    .iter()
                    .filter(|t| {
                        t.group.as_ref() == Some(group)
                            && matches!(
                                t.state,
                                State::Creating | State::Requested | State::Running
                            )
                    })
                    .count()
            });
            for member in batch {
                self.spawn_create(member, size);
            }
        }
    }

    /// The queued nodes of node group `group`, in order.
    fn queued_in_group(&self, group: &str) -> Vec<usize> {
        (0..self.tracks.len())
            .filter(|&i| {
                self.tracks[i].state == State::Queued
                    && self.tracks[i].group.as_deref() == Some(group)
            })
            .collect()
    }

    /// Creates the request of track `index`, in its node group of `group_size` if it has one.
    fn spawn_create(&mut self, index: usize, group_size: Option<usize>) {
        let track = &self.tracks[index];
        let mut nm = NodeMaintenance::new(
            &track.request,
            self.args.flags.spec(&track.node, &self.args.requestor, &[]),
        );
        let mut labels = BTreeMap::from([(ROLLOUT_LABEL.to_string(), self.label.clone())]);
        if let (Some(group), Some(size)) = (&track.group, group_size) {
            labels.insert(NODE_GROUP_LABEL.to_string(), group.clone());
            nm.metadata.annotations = Some(BTreeMap::from([(
                NODE_GROUP_SIZE_ANNOTATION.to_string(),
                size.to_string(),
            )]));
        }
        nm.metadata.labels = Some(labels);
        let api = self.requests_api.clone();
        let slots = self.create_slots.clone();
        self.tasks
            .spawn(async move { TaskResult::Created(index, create(api, nm, slots).await) });
    }

    /// The largest node group still to request, and its size.
    fn largest_group(&self) -> Option<(String, usize)> {
        let mut sizes: BTreeMap<&str, usize> = BTreeMap::new();
        for track in self.tracks.iter().filter(|t| t.state == State::Queued) {
            if let Some(group) = &track.group {
                *sizes.entry(group).or_default() += 1;
            }
        }
        sizes
            .into_iter()
            .max_by_key(|(_, size)| *size)
            .map(|(group, size)| (group.to_string(), size))
    }

    fn start_release(&mut self, index: usize) {
        self.set_state(index, State::Releasing);
        let track = &self.tracks[index];
        let (nodes, requests) = (self.nodes_api.clone(), self.requests_api.clone());
        let (node, request, marker) = (
            track.node.clone(),
            track.request.clone(),
            self.marker.clone(),
        );
        self.tasks.spawn(async move {
            TaskResult::Released(index, release(nodes, requests, node, request, marker).await)
        });
    }

    fn start_cancel(&mut self, index: usize) {
        self.set_state(index, State::Cancelling);
        let api = self.requests_api.clone();
        let request = self.tracks[index].request.clone();
        self.tasks.spawn(async move {
            let result = match api.delete(&request, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(err) if is_not_found(&err) => Ok(()),
                Err(err) => Err(format!("cannot delete NodeMaintenance {request}: {err}")),
            };
            TaskResult::Cancelled(index, result)
        });
    }

    /// The request of `index` is Ready: run the command, or release at once without one.
    fn on_ready(&mut self, index: usize) {
        let elapsed = self.tracks[index].since.elapsed();
        self.tracks[index].ready_after = Some(elapsed);
        let Some(cmd) = self.args.exec.clone() else {
            self.start_release(index);
            return;
        };
        self.set_state(index, State::Running);
        self.tracks[index].exec_started = Some(Instant::now());
        let node = self.tracks[index].node.clone();
        let key = self.request_key(index);
        let printer = self.board.printer();
        self.tasks.spawn(async move {
            TaskResult::Executed(index, run_command(cmd, node, key, printer).await)
        });
    }

    /// Stops the rollout: no new work, requests not yet worked on are deleted.
    fn fail(&mut self, index: usize, message: String) {
        let node = self.tracks[index].node.clone();
        self.board
            .node_finished(&node, Some(&format!("✗ {node}: {message}")));
        self.set_state(index, State::Failed(message.clone()));
        if self.failure.is_none() {
            self.failure = Some((index, message));
        }
        if self.stopping {
            return;
        }
        self.stopping = true;
        for other in 0..self.tracks.len() {
            if self.tracks[other].state == State::Requested {
                self.board
                    .node_finished(&self.tracks[other].node.clone(), None);
                self.start_cancel(other);
            }
        }
    }

    /// What the watch says about the request of `index` (`None`: it is gone).
    fn on_request(&mut self, index: usize, nm: Option<&NodeMaintenance>) {
        if let Some(nm) = nm {
            self.tracks[index].seen = true;
            self.tracks[index].view = Some(RequestView::of(nm));
        }
        let state = self.tracks[index].state.clone();
        let ready = self.tracks[index]
            .view
            .as_ref()
            .is_some_and(|v| v.is_ready());
        match (state, nm.is_some()) {
            (State::Requested, true) if ready && !self.stopping => self.on_ready(index),
            (State::Requested, false) if self.tracks[index].seen => {
                let key = self.request_key(index);
                self.fail(
                    index,
                    format!(
                        "its NodeMaintenance {key} was deleted outside the rollout; run the \
                         same command again to request this node anew"
                    ),
                );
            }
            (State::Releasing, false) => self.finish_node(index),
            (State::Cancelling, false) => self.set_state(index, State::Cancelled),
            _ => {}
        }
        if nm.is_none() {
            // A request of the same name made later is another object.
            self.tracks[index].view = None;
            self.tracks[index].seen = false;
        }
        self.draw(index);
    }

    fn finish_node(&mut self, index: usize) {
        if self.tracks[index].state == State::Done {
            return;
        }
        self.set_state(index, State::Done);
        let track = &self.tracks[index];
        let mut details = Vec::new();
        if let Some(ready) = track.ready_after {
            details.push(format!("Ready after {}", human_duration(ready)));
        }
        if let Some(exec) = track.exec_started {
            details.push(format!("command {}", human_duration(exec.elapsed())));
        }
        let line = format!(
            "✓ {} done in {}{}",
            track.node,
            human_duration(track.since.elapsed()),
            if details.is_empty() {
                String::new()
            } else {
                format!(" ({})", details.join(", "))
            }
        );
        let node = track.node.clone();
        self.board.node_finished(&node, Some(&line));
        self.fill();
    }

    /// The node's bar (or line), and the overall bar.
    fn draw(&mut self, index: usize) {
        let track = &self.tracks[index];
        let node = track.node.clone();
        match &track.state {
            State::Requested => match &track.view {
                Some(view) if view.phase != maintenance_crds::Phase::Pending || view.deleting => {
                    let (percent, summary) = (view.percent(), view.summary());
                    self.board.node(&node, &node, percent, summary);
                }
                _ => {}
            },
            State::Running => {
                let cmd = self.args.exec.clone().unwrap_or_default();
                self.board
                    .node(&node, &node, 100, format!("Ready: running `{cmd}`"));
            }
            State::Releasing => {
                self.board.node(
                    &node,
                    &node,
                    100,
                    "releasing: the operator uncordons".to_string(),
                );
            }
            _ => {}
        }
        self.draw_overall();
    }

    fn draw_overall(&mut self) {
        let total = self.tracks.len() as u64;
        let done = self.count(&State::Done) as u64;
        let waiting = |t: &Track| {
            matches!(t.state, State::Queued | State::Creating)
                || (t.state == State::Requested
                    && t.view
                        .as_ref()
                        .is_none_or(|v| v.phase == maintenance_crds::Phase::Pending && !v.deleting))
        };
        let pending = self.tracks.iter().filter(|t| waiting(t)).count();
        let running = self.count(&State::Running);
        let active = self
            .tracks
            .iter()
            .filter(|t| {
                matches!(
                    t.state,
                    State::Requested | State::Running | State::Releasing
                ) && !waiting(t)
            })
            .count();
        let mut message = format!("done · {active} in progress · {pending} waiting");
        if self.args.exec.is_some() {
            message.push_str(&format!(" · {running} running"));
        }
        if self.stopping {
            message.push_str(" · stopping");
        }
        self.board.overall(done, total, message);
    }

    fn on_task(&mut self, result: TaskResult) {
        match result {
            TaskResult::Created(index, Ok(outcome)) => {
                if let Ensured::Differs(field) = outcome {
                    let key = self.request_key(index);
                    self.board.line(&format!(
                        "note: NodeMaintenance {key} already existed with another {field}; \
                         the rollout uses it as it is"
                    ));
                }
                self.tracks[index].since = Instant::now();
                self.set_state(index, State::Requested);
                if self.stopping {
                    self.start_cancel(index);
                } else if let Some(view) = &self.tracks[index].view
                    && view.is_ready()
                {
                    self.on_ready(index);
                }
            }
            TaskResult::Created(index, Err(message)) => {
                self.set_state(index, State::Queued);
                self.fail(index, message);
            }
            TaskResult::Executed(index, Ok(())) => self.start_release(index),
            TaskResult::Executed(index, Err(status)) => {
                let cmd = self.args.exec.clone().unwrap_or_default();
                self.fail(index, format!("`{cmd}` failed ({status})"));
            }
            TaskResult::Released(index, Ok(true)) => self.finish_node(index),
            // The request goes away once the operator has uncordoned: the watch says when.
            TaskResult::Released(_, Ok(false)) => {}
            TaskResult::Released(index, Err(message)) => self.fail(index, message),
            TaskResult::Cancelled(index, Ok(())) => {
                if self.tracks[index].state == State::Cancelling {
                    self.set_state(index, State::Cancelled);
                }
            }
            TaskResult::Cancelled(index, Err(message)) => {
                self.board.line(&format!("warning: {message}"));
                self.set_state(index, State::Cancelled);
            }
        }
        self.draw_overall();
    }

    fn busy(&self) -> bool {
        self.tracks.iter().any(|t| {
            matches!(
                t.state,
                State::Creating | State::Running | State::Releasing | State::Cancelling
            )
        })
    }

    fn finished(&self) -> bool {
        self.tracks.iter().all(|t| t.state == State::Done) || (self.stopping && !self.busy())
    }
}

/// `1 node`, `3 nodes`.
fn plural(count: usize, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

/// Removes the done-marks of this requestor from the nodes that carry one.
async fn clear_marks(nodes_api: &Api<Node>, nodes: &[Node], marker: &str) -> Result<(), String> {
    let patch = serde_json::json!({"metadata": {"annotations": {marker: null}}});
    let marked: Vec<String> = nodes
        .iter()
        .filter(|n| n.annotations().contains_key(marker))
        .map(ResourceExt::name_any)
        .collect();
    let results: Vec<Result<(), String>> = futures::stream::iter(marked)
        .map(|node| {
            let api = nodes_api.clone();
            let patch = patch.clone();
            async move {
                match api
                    .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(err) if is_not_found(&err) => Ok(()),
                    Err(err) => Err(format!("node {node}: {err}")),
                }
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await;
    let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

async fn matching_nodes(client: &Client, selector: &str) -> anyhow::Result<Vec<Node>> {
    let api: Api<Node> = Api::all(client.clone());
    let mut nodes = api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|err| api_error(err, &format!("list the nodes of --selector {selector:?}")))?
        .items;
    if nodes.is_empty() {
        bail!(
            "no node matches --selector {selector:?}: `kubectl get nodes -l '{selector}'` shows \
             what it selects"
        );
    }
    nodes.sort_by(|a, b| natural_cmp(&a.name_any(), &b.name_any()));
    Ok(nodes)
}

pub async fn run(global: &GlobalArgs, args: RolloutArgs) -> anyhow::Result<Outcome> {
    validate(&args)?;
    let started = Instant::now();
    let (client, namespace) = connect(global).await?;
    let nodes_api: Api<Node> = Api::all(client.clone());
    let requests_api: Api<NodeMaintenance> = Api::namespaced(client.clone(), &namespace);
    let marker = done_annotation(&args.requestor);
    let prefix = args.flags.prefix(&args.requestor);
    let label = rollout_label_value(&args.requestor);
    let nodes = nodes_to_maintain(&client, &nodes_api, &args, &marker).await?;
    let existing = existing_requests(&requests_api, &namespace).await?;

    let now = Instant::now();
    let names: Vec<String> = nodes.iter().map(ResourceExt::name_any).collect();
    let mut rollout = Rollout {
        namespace,
        nodes_api,
        requests_api,
        marker,
        label,
        tracks: Vec::new(),
        by_request: HashMap::new(),
        tasks: JoinSet::new(),
        create_slots: Arc::new(Semaphore::new(CREATE_CONCURRENCY)),
        board: Board::new(nodes.len() as u64, names.iter().map(String::as_str)),
        started,
        last_progress: now,
        stall_hinted: false,
        stopping: false,
        failure: None,
        done_before: 0,
        args,
    };
    let picked_up = rollout.add_tracks(&nodes, &existing, &prefix, now);
    if let (Some(max), Some((group, size))) = (rollout.args.max_in_flight, rollout.largest_group())
        && size > max as usize
    {
        bail!(
            "node group {group:?} has {size} nodes to maintain, more than --max-in-flight {max}: \
             a group's requests are created together; raise --max-in-flight or drop --group-by-label"
        );
    }
    rollout.announce(picked_up);
    rollout.start();

    let outcome = drive(&mut rollout).await?;
    rollout.board.finish();
    report(&mut rollout, outcome).await
}

/// What a rollout cannot start without.
fn validate(args: &RolloutArgs) -> anyhow::Result<()> {
    args.flags.validate()?;
    if args.requestor.trim().is_empty() {
        bail!("--requestor must not be empty: name who asks, e.g. --requestor upgrade.example.com");
    }
    if args.selector.trim().is_empty() {
        bail!("--selector must not be empty: name the nodes, e.g. --selector pool=gpu");
    }
    Ok(())
}

/// The nodes of --selector; with --restart, their done-marks are removed first.
async fn nodes_to_maintain(
    client: &Client,
    nodes_api: &Api<Node>,
    args: &RolloutArgs,
    marker: &str,
) -> anyhow::Result<Vec<Node>> {
    let nodes = matching_nodes(client, &args.selector).await?;
    if !args.restart {
        return Ok(nodes);
    }
    clear_marks(nodes_api, &nodes, marker)
        .await
        .map_err(|err| {
            anyhow::anyhow!("cannot remove the done-marks ({marker}) for --restart: {err}")
        })?;
    matching_nodes(client, &args.selector).await
}

/// The NodeMaintenances of the namespace, by name: those of an earlier run are picked up.
async fn existing_requests(
    requests_api: &Api<NodeMaintenance>,
    namespace: &str,
) -> anyhow::Result<HashMap<String, NodeMaintenance>> {
    Ok(requests_api
        .list(&ListParams::default())
        .await
        .map_err(|err| api_error(err, &format!("list NodeMaintenances in {namespace}")))?
        .items
        .into_iter()
        .map(|nm| (nm.name_any(), nm))
        .collect())
}

impl Rollout {
    /// A track per node, where an earlier run left it: done (marked, request gone), releasing
    /// (marked, request still there), requested (its request picked up) or queued. Counts the
    /// nodes done before; returns how many requests were picked up.
    fn add_tracks(
        &mut self,
        nodes: &[Node],
        existing: &HashMap<String, NodeMaintenance>,
        prefix: &str,
        now: Instant,
    ) -> usize {
        let (mut done_before, mut picked_up) = (0, 0);
        for node in nodes {
            let name = node.name_any();
            let request = request_name(prefix, &name);
            let marked =
                node.annotations().get(&self.marker).map(String::as_str) == Some(DONE_VALUE);
            let existing = existing.get(&request);
            let state = match (marked, existing) {
                (true, None) => {
                    done_before += 1;
                    State::Done
                }
                // Marked, but the request was not deleted yet: finish the release below.
                (true, Some(_)) => State::Releasing,
                (false, Some(nm)) if !nm.is_deleting() => {
                    picked_up += 1;
                    State::Requested
                }
                _ => State::Queued,
            };
            let group = self
                .args
                .group_by_label
                .as_ref()
                .and_then(|label| node.labels().get(label))
                .cloned();
            self.by_request.insert(request.clone(), self.tracks.len());
            self.tracks.push(Track {
                node: name,
                request,
                group,
                seen: existing.is_some(),
                view: existing.map(RequestView::of),
                state,
                since: now,
                ready_after: None,
                exec_started: None,
            });
        }
        self.done_before = done_before;
        picked_up
    }

    /// The first line: how many nodes, how many done, picked up and to request, and the pace.
    fn announce(&mut self, picked_up: usize) {
        let to_request = self.count(&State::Queued);
        let pace = match self.args.max_in_flight {
            Some(n) => format!("at most {n} at a time, within the operator's limits"),
            None => "the operator's limits set the pace".to_string(),
        };
        let groups = match &self.args.group_by_label {
            Some(label) => {
                let groups: BTreeSet<&str> = self
                    .tracks
                    .iter()
                    .filter_map(|t| t.group.as_deref())
                    .collect();
                format!(
                    " in {} by label {label}, each admitted together;",
                    plural(groups.len(), "node group", "node groups")
                )
            }
            None => String::new(),
        };
        self.board.line(&format!(
            "Rollout of {} nodes (selector {}) for {} in namespace {}: {} already done, {} picked \
             up, {to_request} to request;{groups} {pace}.",
            self.tracks.len(),
            self.args.selector,
            self.args.requestor,
            self.namespace,
            self.done_before,
            plural(picked_up, "request", "requests"),
        ));
    }

    /// Finishes the releases an earlier run left, and creates the first requests.
    fn start(&mut self) {
        for index in 0..self.tracks.len() {
            if self.tracks[index].state == State::Releasing {
                self.start_release(index);
            }
        }
        self.fill();
        self.draw_overall();
    }
}

/// The event loop: watch events, finished tasks, Ctrl-C and the stall hint.
async fn drive(rollout: &mut Rollout) -> anyhow::Result<Outcome> {
    let mut events = watcher(rollout.requests_api.clone(), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut init: Option<HashMap<String, NodeMaintenance>> = None;
    let mut last_error = String::new();
    let mut stall_check = tokio::time::interval(Duration::from_secs(5));
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    while !rollout.finished() {
        tokio::select! {
            event = events.next() => match event {
                None => bail!("the watch of NodeMaintenances ended; run the same command again to resume"),
                Some(Err(err)) => {
                    let text = err.to_string();
                    if text != last_error {
                        rollout.board.line(&format!("warning: watch of NodeMaintenances: {text} (retrying)"));
                        last_error = text;
                    }
                }
                Some(Ok(event)) => match event {
                    watcher::Event::Init => init = Some(HashMap::new()),
                    watcher::Event::InitApply(nm) => {
                        if let Some(buffer) = init.as_mut() {
                            buffer.insert(nm.name_any(), nm);
                        }
                    }
                    watcher::Event::InitDone => {
                        let listed = init.take().unwrap_or_default();
                        for index in 0..rollout.tracks.len() {
                            let nm = listed.get(&rollout.tracks[index].request);
                            rollout.on_request(index, nm);
                        }
                    }
                    watcher::Event::Apply(nm) => {
                        if let Some(&index) = rollout.by_request.get(&nm.name_any()) {
                            rollout.on_request(index, Some(&nm));
                        }
                    }
                    watcher::Event::Delete(nm) => {
                        if let Some(&index) = rollout.by_request.get(&nm.name_any()) {
                            rollout.on_request(index, None);
                        }
                    }
                },
            },
            Some(joined) = rollout.tasks.join_next() => match joined {
                Ok(result) => rollout.on_task(result),
                Err(err) => bail!("a rollout task failed: {err}; run the same command again to resume"),
            },
            _ = stall_check.tick() => {
                if !rollout.stall_hinted && rollout.last_progress.elapsed() >= STALL_HINT_AFTER {
                    rollout.stall_hinted = true;
                    rollout.board.line(&format!(
                        "note: no progress for {}: is the operator running? \
                         `kubectl maintenance plan` says why requests wait for admission, \
                         `kubectl maintenance status -n {}` what each request waits for",
                        human_duration(rollout.last_progress.elapsed()),
                        rollout.namespace
                    ));
                }
            }
            _ = &mut ctrl_c => return Ok(Outcome::Interrupted),
        }
    }
    Ok(if rollout.failure.is_some() {
        Outcome::No
    } else {
        Outcome::Success
    })
}

/// The summary, and the marks cleared after a complete rollout.
async fn report(rollout: &mut Rollout, outcome: Outcome) -> anyhow::Result<Outcome> {
    let total = rollout.tracks.len();
    let done = rollout.count(&State::Done);
    let wall = human_duration(rollout.started.elapsed());
    let ns = rollout.namespace.clone();
    let label = format!("{ROLLOUT_LABEL}={}", rollout.label);
    match outcome {
        Outcome::Success => {
            let by_this_run = done - rollout.done_before;
            println!(
                "Rollout complete: {done} of {total} nodes done in {wall} ({by_this_run} by this \
                 run, {} earlier).",
                rollout.done_before
            );
            let cleared = match rollout
                .nodes_api
                .list(&ListParams::default().labels(&rollout.args.selector))
                .await
            {
                Ok(fresh) => clear_marks(&rollout.nodes_api, &fresh.items, &rollout.marker).await,
                Err(err) => Err(err.to_string()),
            };
            if let Err(err) = cleared {
                println!(
                    "warning: could not remove the done-marks ({}): {err}; remove them with \
                     `kubectl annotate nodes -l '{}' {}-`, or the next rollout of this requestor \
                     skips those nodes",
                    rollout.marker, rollout.args.selector, rollout.marker
                );
            }
        }
        Outcome::Interrupted => {
            let in_progress = rollout.in_flight();
            println!(
                "Interrupted after {wall}: {done} of {total} nodes done, {} with a request.",
                plural(in_progress, "node", "nodes")
            );
            println!(
                "Nothing was undone: the requests stay and the operator goes on with them (their \
                 nodes stay cordoned).\n  Resume: run the same command again (nodes marked done \
                 are skipped; where the command was cut short it runs again).\n  Abandon: \
                 kubectl delete nodemaintenances -n {ns} -l {label}"
            );
        }
        Outcome::No => {
            let cancelled = rollout.count(&State::Cancelled);
            println!("Rollout stopped after {wall}: {done} of {total} nodes done.");
            let failed: Vec<(String, String, String)> = rollout
                .tracks
                .iter()
                .filter_map(|t| match &t.state {
                    State::Failed(message) => {
                        Some((t.node.clone(), t.request.clone(), message.clone()))
                    }
                    _ => None,
                })
                .collect();
            for (node, request, message) in &failed {
                println!("  node {node}: {message}");
                let exists = rollout
                    .requests_api
                    .get_opt(request)
                    .await
                    .ok()
                    .flatten()
                    .is_some();
                if exists {
                    println!(
                        "    it keeps NodeMaintenance {ns}/{request}, so it stays cordoned. Once \
                         fixed, either resume (the command runs on {node} again) or release it \
                         without running it again:\n      kubectl delete nodemaintenance -n {ns} \
                         {request}\n    (to also skip it when resuming: kubectl annotate node \
                         {node} {}={DONE_VALUE})",
                        rollout.marker
                    );
                }
            }
            if cancelled > 0 {
                println!(
                    "  the requests of {} not yet worked on were deleted: they \
                     return to service.",
                    plural(cancelled, "node", "nodes")
                );
            }
            println!(
                "  resume: run the same command again. abandon: kubectl delete nodemaintenances \
                 -n {ns} -l {label}"
            );
        }
    }
    Ok(outcome)
}
