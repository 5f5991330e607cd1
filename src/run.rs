//! `maintenance-operator run`: wire clients, metrics and HTTP, then start the supervisor actor.

use std::sync::Arc;
use std::time::Duration;

use maintenance_actors::context::{Context, LogLevelSetter};
use maintenance_actors::evictor::{EvictionRate, Evictor};
use maintenance_actors::metrics::{ApiClient, Metrics};
use maintenance_actors::pdb_watch::PdbWatches;
use maintenance_actors::supervisor::Supervisor;
use maintenance_actors::watch_connections::WatchConnections;
use ractor::Actor;
use tokio::task::JoinHandle;

use crate::api_calls::{bounded_client, pod_watch_client, speaks_http2};
use crate::http::{self, Probes};
use crate::leader::LeaderElector;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Namespace the operator runs in; only the MaintenanceOperatorConfig named `default` there counts.
    #[arg(
        long,
        env = "OPERATOR_NAMESPACE",
        default_value = "maintenance-operator"
    )]
    pub namespace: String,
    /// This pod's name (from the downward API), so the operator never evicts itself.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    #[command(flatten)]
    pub endpoints: crate::http::EndpointArgs,
    /// Safety-net period of the scheduling round, in seconds (changes trigger it at once).
    #[arg(long, default_value_t = 10)]
    pub tick_seconds: u64,
    /// A Pending request for a node that does not exist is deleted this many seconds after its
    /// creation (the webhook refuses such requests; this covers those it did not see).
    #[arg(long, default_value_t = 300)]
    pub missing_node_grace_seconds: u64,
    /// Most API calls in flight at once, per client (the operator has two: one for evictions, one
    /// for everything else). Each call in flight holds an HTTP/1.1 connection, and the client keeps
    /// idle connections for 90 s, so without a bound a burst (500 nodes entering maintenance at
    /// once) opens a connection, TLS buffers included, per concurrent call. A watch holds its slot
    /// only until the API server answers, so watches never starve other calls.
    #[arg(long, env = "MAX_CONCURRENT_API_CALLS", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_api_calls: u32,
    /// Log format.
    #[arg(long, value_enum, default_value = "json")]
    pub log_format: LogFormat,
    /// Elect a leader through a Lease so that several replicas can run; only the leader acts.
    #[arg(long, env = "LEADER_ELECT")]
    pub leader_elect: bool,
    /// Name of the Lease (in --lease-namespace) used for leader election. During a migration from
    /// NVIDIA's operator, `a9620a8f.nvidia.com` (its controller-runtime LeaderElectionID) makes
    /// both compete for one Lease, so they never act at once.
    #[arg(long, default_value = "maintenance-operator")]
    pub lease_name: String,
    /// Namespace of the Lease; default: --namespace. NVIDIA's operator keeps its Lease in the
    /// namespace it runs in.
    #[arg(long)]
    pub lease_namespace: Option<String>,
    /// How long a leader's lease lasts without renewal, in seconds (a standby takes over after it).
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,
    #[command(flatten)]
    pub webhook: crate::webhook::WebhookArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum LogFormat {
    Json,
    Text,
}

/// The filter for a `logLevel` of the config (debug, info, error).
fn filter_for(level: &str) -> tracing_subscriber::EnvFilter {
    let directives = match level {
        "debug" => "debug,kube=info,hyper=info,tower=info,rustls=info",
        "error" => "error",
        _ => "info,kube=warn",
    };
    tracing_subscriber::EnvFilter::new(directives)
}

/// Installs JSON (or text) logging and returns a setter for the config's `logLevel`; `RUST_LOG`,
/// when set, wins over the config.
fn init_tracing(format: LogFormat) -> Option<LogLevelSetter> {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let from_env = tracing_subscriber::EnvFilter::try_from_default_env().ok();
    let pinned = from_env.is_some();
    let (filter, handle) =
        tracing_subscriber::reload::Layer::new(from_env.unwrap_or_else(|| filter_for("info")));
    let registry = tracing_subscriber::registry().with(filter);
    // A second init (tests) fails harmlessly: the first subscriber stays.
    let installed = match format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(std::io::stderr),
            )
            .try_init()
            .is_ok(),
        LogFormat::Text => registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init()
            .is_ok(),
    };
    (installed && !pinned).then(|| {
        Box::new(move |level: &str| {
            if handle.reload(filter_for(level)).is_ok() {
                tracing::info!(log_level = %level, "log level changed");
            }
        }) as LogLevelSetter
    })
}

/// The pod watches' connections: HTTP/2, a connection per
/// [`maintenance_actors::watch_connections::WATCHES_PER_CONNECTION`] watches, if the API server
/// speaks it; else the main client's, a connection per watch.
async fn pod_watches(
    config: &kube::Config,
    max_in_flight: usize,
    metrics: &Arc<Metrics>,
    main: &kube::Client,
) -> anyhow::Result<WatchConnections> {
    let Some(first) = pod_watch_client(config, max_in_flight, metrics)? else {
        tracing::info!("pod watches over the main client (a proxy or plain HTTP: no HTTP/2)");
        return Ok(WatchConnections::shared(main.clone()));
    };
    if let Err(why) = speaks_http2(&first, HTTP2_CHECK_TIMEOUT).await {
        tracing::warn!(%why, "the API server did not answer over HTTP/2; pod watches go over HTTP/1.1, a connection each (about 40 KiB of memory per node in maintenance)");
        return Ok(WatchConnections::shared(main.clone()));
    }
    // The checked client is not kept: its connection closes once idle, and every connection of
    // the watches is made alike, when they need it.
    drop(first);
    let config = config.clone();
    let metrics = metrics.clone();
    let main = main.clone();
    Ok(WatchConnections::new(move || {
        match pod_watch_client(&config, max_in_flight, &metrics) {
            Ok(Some(client)) => client,
            Ok(None) => main.clone(),
            Err(err) => {
                tracing::warn!(%err, "could not build another HTTP/2 client for pod watches; this one goes over the main client");
                main.clone()
            }
        }
    }))
}

/// How long the API server has to answer the pod watches' client at start.
const HTTP2_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let set_log_level = init_tracing(args.log_format);
    let config = kube::Config::infer().await.map_err(|err| {
        anyhow::anyhow!("cannot find a Kubernetes config (in-cluster or KUBECONFIG): {err}")
    })?;
    let metrics = Arc::new(Metrics::new()?);
    let mut ctx = context(&args, &config, &metrics).await?;
    ctx.set_log_level = set_log_level;
    let ctx = Arc::new(ctx);
    let mut server = spawn_servers(&args, &ctx, &metrics).await?;

    let elector = leader_elector(&args, &ctx);
    if let Some(elector) = &elector {
        tracing::info!(identity = %elector.identity(), lease = %elector.describe(), "waiting to become leader");
        tokio::select! {
            _ = elector.acquire() => {}
            _ = shutdown_signal() => return Ok(()),
            result = &mut server => { result??; return Ok(()); }
        }
    }
    ctx.set_leading(true);
    metrics.process.leader.set(1.0);
    // Renewed from now on, not once the supervisor's long start is over.
    let mut renewal = spawn_renewal(elector.clone());

    tracing::info!(namespace = %args.namespace, "starting supervisor");
    let started = tokio::select! {
        started = Actor::spawn(Some("supervisor".to_string()), Supervisor, ctx.clone()) => started,
        ended = &mut renewal => {
            anyhow::bail!("lost leadership while the supervisor started: {}", lost(ended))
        }
    };
    let (supervisor, mut handle) =
        started.map_err(|err| anyhow::anyhow!("supervisor failed to start: {err}"))?;

    tokio::select! {
        _ = shutdown_signal() => {
            tracing::info!("shutting down");
            supervisor.stop(Some("shutdown".into()));
            let _ = handle.await;
            // Events still queued go out before the process ends (within the pod's grace period).
            if !ctx.events.flush(Duration::from_secs(5)).await {
                tracing::warn!("some Events were not sent before shutdown");
            }
            // No renewal after the release, or it would take the lease back.
            renewal.abort();
            if let Some(elector) = &elector {
                elector.release().await;
            }
        }
        ended = &mut renewal => {
            // Stop at once: another replica may lead soon, and two leaders could exceed the limits.
            anyhow::bail!("lost leadership: {}", lost(ended));
        }
        result = &mut handle => {
            result.map_err(|err| anyhow::anyhow!("supervisor crashed: {err}"))?;
            anyhow::bail!("the supervisor stopped unexpectedly; see the log above");
        }
        result = &mut server => {
            result??;
        }
    }
    Ok(())
}

/// The engine's context: the API clients (the main one, the evictions' one, the pod watches'),
/// the cluster-wide PDB watch and the evictor, each call bounded by --max-concurrent-api-calls.
async fn context(
    args: &RunArgs,
    config: &kube::Config,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Context> {
    let max_in_flight = usize::try_from(args.max_concurrent_api_calls)?;
    let client = bounded_client(config.clone(), max_in_flight, metrics, ApiClient::Main)?;
    let mut eviction_config = config.clone();
    // A PDB's 429 must reach us at once, not be retried away inside the client.
    eviction_config.default_retry = false;
    let eviction_client = bounded_client(
        eviction_config,
        max_in_flight,
        metrics,
        ApiClient::Evictions,
    )?;
    // One cluster-wide PDB watch for the evictor's per-budget gate and the request actors.
    let pdbs = PdbWatches::new(client.clone());
    let evictor = Evictor::new(
        eviction_client,
        EvictionRate {
            per_second: maintenance_crds::DEFAULT_EVICTIONS_PER_SECOND,
            burst: maintenance_crds::DEFAULT_EVICTION_BURST,
        },
        metrics.clone(),
        pdbs.store(),
        max_in_flight,
    );
    let mut ctx = Context::new(
        client,
        evictor,
        pdbs,
        metrics.clone(),
        args.namespace.clone(),
        args.pod_name.clone(),
        Duration::from_secs(args.tick_seconds.max(1)),
    );
    ctx.pod_watches = pod_watches(config, max_in_flight, metrics, &ctx.client).await?;
    ctx.missing_node_grace = Duration::from_secs(args.missing_node_grace_seconds);
    Ok(ctx)
}

/// Starts /metrics, the probes and the webhook. Every replica serves them, standbys too: the API
/// server calls any pod of the webhook's Service. Ends when any of them fails.
async fn spawn_servers(
    args: &RunArgs,
    ctx: &Arc<Context>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<JoinHandle<anyhow::Result<()>>> {
    let probe_ctx = ctx.clone();
    let standby = args.leader_elect;
    let probes = Arc::new(Probes {
        // A standby is ready: it is doing its job (waiting), and must not block a rollout.
        ready: Box::new(move || probe_ctx.is_synced() || (standby && !probe_ctx.is_leading())),
    });
    let webhook =
        crate::webhook::Webhook::from_args(&args.webhook, ctx.client.clone(), metrics.clone())
            .await?;
    let endpoints = args.endpoints.clone();
    let client = ctx.client.clone();
    let metrics = metrics.clone();
    let host = hostname();
    Ok(tokio::spawn(async move {
        let max_connections = endpoints.max_connections as usize;
        let webhook = async {
            match webhook {
                Some(webhook) => webhook.serve(max_connections).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            served = http::serve_probes(&endpoints, probes, &metrics) => served,
            served = http::serve_metrics(&endpoints, client, metrics.clone(), &host) => served,
            served = webhook => served,
        }
    }))
}

/// The elector of the Lease, with --leader-elect; without it this process leads at once.
fn leader_elector(args: &RunArgs, ctx: &Context) -> Option<Arc<LeaderElector>> {
    args.leader_elect.then(|| {
        let identity = args
            .pod_name
            .clone()
            .unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
        Arc::new(LeaderElector::new(
            ctx.client.clone(),
            args.lease_namespace.as_deref().unwrap_or(&args.namespace),
            &args.lease_name,
            identity,
            Duration::from_secs(args.lease_duration_seconds.max(2)),
        ))
    })
}

/// Renews the lease from now on, in a task of its own; it ends (with why) only when leadership
/// is lost, and never without an elector. The supervisor's start waits for full lists of
/// requests and nodes, which take longer than the renew deadline in a big cluster, and a renewal
/// that only began after them would find the deadline passed and give up at once (a crash loop
/// that never lets a standby in either).
fn spawn_renewal(elector: Option<Arc<LeaderElector>>) -> JoinHandle<String> {
    tokio::spawn(async move {
        match elector {
            Some(elector) => elector.hold().await,
            None => std::future::pending().await,
        }
    })
}

/// Why leadership was lost, from the renewal task's end.
fn lost(ended: Result<String, tokio::task::JoinError>) -> String {
    ended.unwrap_or_else(|err| format!("the lease renewal stopped: {err}"))
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "maintenance-operator".to_string())
}
