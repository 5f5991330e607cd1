//! `kubectl maintenance status`: the table of requests, or live progress with `--watch`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use clap::Args;
use futures::StreamExt;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use maintenance_crds::{NodeMaintenance, Phase};

use super::board::Board;
use super::view::{RequestView, render_table};
use super::{GlobalArgs, Outcome, api_error, connect, human_duration, natural_cmp};

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Follow the requests live: a progress bar per node in progress and one overall (plain
    /// lines when stdout is not a terminal). Ends when every request is Ready, or on Ctrl-C.
    #[arg(short, long)]
    pub watch: bool,

    /// Requests of every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,

    /// Only the requests of this requestor.
    #[arg(long, value_name = "ID")]
    pub requestor: Option<String>,
}

fn sorted_views<'a>(
    requests: impl Iterator<Item = &'a NodeMaintenance>,
    requestor: Option<&str>,
) -> Vec<RequestView> {
    let mut views: Vec<RequestView> = requests
        .filter(|nm| requestor.is_none_or(|r| nm.spec.requestor_id == r))
        .map(RequestView::of)
        .collect();
    views.sort_by(|a, b| {
        a.namespace
            .cmp(&b.namespace)
            .then_with(|| natural_cmp(&a.node, &b.node))
            .then_with(|| a.name.cmp(&b.name))
    });
    views
}

pub async fn run(global: &GlobalArgs, args: StatusArgs) -> anyhow::Result<Outcome> {
    let (client, namespace) = connect(global).await?;
    let (api, scope): (Api<NodeMaintenance>, String) = if args.all_namespaces {
        (Api::all(client), "any namespace".to_string())
    } else {
        (
            Api::namespaced(client, &namespace),
            format!("namespace {namespace}"),
        )
    };
    let listed = api
        .list(&ListParams::default())
        .await
        .map_err(|err| api_error(err, &format!("list NodeMaintenances in {scope}")))?;
    let views = sorted_views(listed.items.iter(), args.requestor.as_deref());
    if views.is_empty() {
        println!("No NodeMaintenance requests in {scope}.");
        return Ok(Outcome::Success);
    }
    if !args.watch {
        print!("{}", render_table(&views, args.all_namespaces));
        return Ok(Outcome::Success);
    }
    let nodes: Vec<String> = views.iter().map(|v| v.node.clone()).collect();
    watch(api, &scope, args.requestor.as_deref(), &nodes).await
}

/// Follows the requests until all are Ready (or none is left), or Ctrl-C.
async fn watch(
    api: Api<NodeMaintenance>,
    scope: &str,
    requestor: Option<&str>,
    nodes: &[String],
) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let mut board = Board::new(0, nodes.iter().map(String::as_str));
    let mut requests: BTreeMap<String, NodeMaintenance> = BTreeMap::new();
    let mut init: Option<BTreeMap<String, NodeMaintenance>> = None;
    let mut synced = false;
    // Requests whose Ready line was printed.
    let mut reported_ready: BTreeSet<String> = BTreeSet::new();
    let mut last_error = String::new();
    // Requests that had a bar (or line) at the last event.
    let mut shown: BTreeSet<String> = BTreeSet::new();
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = &mut ctrl_c => {
                board.finish();
                println!("Stopped watching after {}.", human_duration(started.elapsed()));
                return Ok(Outcome::Success);
            }
        };
        match event {
            None => anyhow::bail!("the watch of NodeMaintenances in {scope} ended; run it again"),
            Some(Err(err)) => {
                let text = err.to_string();
                if text != last_error {
                    board.line(&format!(
                        "warning: watch of NodeMaintenances in {scope}: {text} (retrying)"
                    ));
                    last_error = text;
                }
                continue;
            }
            Some(Ok(event)) => match event {
                watcher::Event::Init => init = Some(BTreeMap::new()),
                watcher::Event::InitApply(nm) => {
                    if let Some(buffer) = init.as_mut() {
                        buffer.insert(nm.key(), nm);
                    }
                }
                watcher::Event::InitDone => {
                    if let Some(buffer) = init.take() {
                        requests = buffer;
                    }
                    synced = true;
                }
                watcher::Event::Apply(nm) => {
                    requests.insert(nm.key(), nm);
                }
                watcher::Event::Delete(nm) => {
                    requests.remove(&nm.key());
                }
            },
        }
        if !synced {
            continue;
        }
        let views = sorted_views(requests.values(), requestor);
        let keys: BTreeSet<String> = views
            .iter()
            .map(|v| format!("{}/{}", v.namespace, v.name))
            .collect();
        // Requests gone since the last event lose their bar.
        for key in shown.difference(&keys) {
            board.node_finished(key, None);
        }
        reported_ready.retain(|key| keys.contains(key));
        let (mut ready, mut pending, mut active) = (0u64, 0u64, 0u64);
        for view in &views {
            let key = format!("{}/{}", view.namespace, view.name);
            if view.is_ready() {
                ready += 1;
                if !reported_ready.contains(&key) {
                    let line = format!(
                        "✓ {} Ready ({}, after {})",
                        view.node,
                        key,
                        human_duration(started.elapsed())
                    );
                    board.node_finished(&key, Some(&line));
                    reported_ready.insert(key);
                }
                continue;
            }
            reported_ready.remove(&key);
            if view.phase == Phase::Pending && !view.deleting {
                pending += 1;
                board.node_finished(&key, None);
            } else {
                active += 1;
                board.node(&key, &view.node, view.percent(), view.summary());
            }
        }
        shown = keys;
        let total = views.len() as u64;
        board.overall(
            ready,
            total,
            format!("Ready · {active} in progress · {pending} Pending"),
        );
        if ready == total {
            board.finish();
            if total == 0 {
                println!("No NodeMaintenance requests left in {scope}.");
            } else {
                println!(
                    "All {total} requests Ready after {}.",
                    human_duration(started.elapsed())
                );
            }
            return Ok(Outcome::Success);
        }
    }
}
