//! `/metrics`, `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use maintenance_actors::metrics::Metrics;

/// What the probes read.
pub struct Probes {
    pub metrics: Arc<Metrics>,
    /// Ready once the caches are synced (or, on a standby, once it waits for the lease).
    pub ready: Box<dyn Fn() -> bool + Send + Sync>,
}

pub async fn serve(addr: SocketAddr, probes: Arc<Probes>) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(probes);
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|err| {
        anyhow::anyhow!(
            "cannot listen on {addr} for /metrics: {err}; choose another --metrics-addr"
        )
    })?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    axum::serve(listener, app).await?;
    Ok(())
}

async fn metrics(State(probes): State<Arc<Probes>>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        probes.metrics.render(),
    )
}

async fn readyz(State(probes): State<Arc<Probes>>) -> impl IntoResponse {
    if (probes.ready)() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet")
    }
}
