//! `maintenance-operator run`: wire clients, metrics and HTTP, then start the supervisor actor.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use maintenance_actors::context::Context;
use maintenance_actors::evictor::{EvictionRate, Evictor};
use maintenance_actors::metrics::Metrics;
use maintenance_actors::supervisor::Supervisor;
use ractor::Actor;

use crate::http::{self, Probes};

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Namespace the operator runs in; only the MaintenanceOperatorConfig named `default` there counts.
    #[arg(long, env = "OPERATOR_NAMESPACE", default_value = "maintenance-operator")]
    pub namespace: String,
    /// This pod's name (from the downward API), so the operator never evicts itself.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Safety-net period of the scheduling round, in seconds (changes trigger it at once).
    #[arg(long, default_value_t = 10)]
    pub tick_seconds: u64,
    /// Log format.
    #[arg(long, value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum LogFormat {
    Json,
    Text,
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    init_tracing(args.log_format);
    let config = kube::Config::infer().await.map_err(|err| {
        anyhow::anyhow!("cannot find a Kubernetes config (in-cluster or KUBECONFIG): {err}")
    })?;
    let client = kube::Client::try_from(config.clone())?;
    let mut eviction_config = config;
    // A PDB's 429 must reach us at once, not be retried away inside the client.
    eviction_config.default_retry = false;
    let eviction_client = kube::Client::try_from(eviction_config)?;

    let metrics = Arc::new(Metrics::new()?);
    metrics.leader.set(1.0);
    let evictor = Evictor::new(
        eviction_client,
        EvictionRate {
            per_second: maintenance_crds::DEFAULT_EVICTIONS_PER_SECOND,
            burst: maintenance_crds::DEFAULT_EVICTION_BURST,
        },
        metrics.clone(),
    );
    let ctx = Arc::new(Context::new(
        client,
        evictor,
        metrics.clone(),
        args.namespace.clone(),
        args.pod_name.clone(),
        Duration::from_secs(args.tick_seconds.max(1)),
    ));

    let probe_ctx = ctx.clone();
    let probes = Arc::new(Probes {
        metrics: metrics.clone(),
        ready: Box::new(move || probe_ctx.is_synced()),
    });
    let server = tokio::spawn(http::serve(args.metrics_addr, probes));

    tracing::info!(namespace = %args.namespace, "starting supervisor");
    let (supervisor, mut handle) = Actor::spawn(Some("supervisor".to_string()), Supervisor, ctx)
        .await
        .map_err(|err| anyhow::anyhow!("supervisor failed to start: {err}"))?;

    tokio::select! {
        _ = shutdown_signal() => {
            tracing::info!("shutting down");
            supervisor.stop(Some("shutdown".into()));
            let _ = handle.await;
        }
        result = &mut handle => {
            result.map_err(|err| anyhow::anyhow!("supervisor crashed: {err}"))?;
            anyhow::bail!("the supervisor stopped unexpectedly; see the log above");
        }
        result = server => {
            result??;
        }
    }
    Ok(())
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
