//! The bound on API calls in flight (`--max-concurrent-api-calls`), and what it shows: calls in
//! flight and the time calls waited for a free slot, per client.
//!
//! Each HTTP/1.1 call in flight holds a connection (with its TLS state and read buffer), and
//! hyper keeps idle connections for 90 s: without a bound, a burst of calls (hundreds of nodes
//! entering maintenance at once) opens a connection per call. With it, the other calls wait in
//! the client's queue, and `api_calls_throttled_seconds_total` says how long.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use maintenance_actors::metrics::{ApiClient, Metrics};
use prometheus::{Counter, IntGauge};
use tower::{Layer, Service};

/// kube's client with at most `max_in_flight` calls in flight; the others wait in its queue.
/// A watch holds its slot only until the API server answers (the response head), not while it
/// streams.
pub fn bounded_client(
    config: kube::Config,
    max_in_flight: usize,
    metrics: &Metrics,
    client: ApiClient,
) -> anyhow::Result<kube::Client> {
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&tower::limit::ConcurrencyLimitLayer::new(max_in_flight))
        .with_layer(&ObserveLayer::new(metrics, client))
        .build())
}

/// A client for the request actors' pod watches whose requests share one HTTP/2 connection
/// (`maintenance_actors::watch_connections`), with its own bound like [`bounded_client`]. `None`
/// when the API server is reached through a proxy or over plain HTTP: its pod watches then go over
/// the main client, a connection each, as HTTP/1.1 must.
///
/// HTTP/2 only, not negotiated: with a choice, hyper's pool cannot know that a connection being
/// set up will carry several requests, and the watches of nodes entering maintenance together
/// would each open their own. [`speaks_http2`] checks the API server once before it is used.
pub fn pod_watch_client(
    config: &kube::Config,
    max_in_flight: usize,
    metrics: &Metrics,
) -> anyhow::Result<Option<kube::Client>> {
    use kube::client::ConfigExt;
    if config.proxy_url.is_some() || config.cluster_url.scheme_str() != Some("https") {
        return Ok(None);
    }
    let mut tcp = hyper_util::client::legacy::connect::HttpConnector::new();
    tcp.enforce_http(false);
    let mut tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_only();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|err| anyhow::anyhow!("tls-server-name {name:?} of the kubeconfig: {err}"))?;
        tls = tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let mut connector =
        hyper_timeout::TimeoutConnector::new(tls.enable_http2().wrap_connector(tcp));
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            // A connection that died silently would stall every watch on it: a PING when no frame
            // came for 30 s, the connection dropped (and the watches restarted) if no answer in
            // 15 s, as client-go's HTTP/2 health check does.
            .timer(hyper_util::rt::TokioTimer::new())
            .http2_keep_alive_interval(HTTP2_PING_INTERVAL)
            .http2_keep_alive_timeout(HTTP2_PING_TIMEOUT)
            // What the API server may send ahead of what the watches have read, held in memory
            // until they do: hyper's defaults (2 MiB a stream, 5 MiB a connection) are sized for
            // downloads; a node's pods come in a few hundred KiB at most.
            .http2_initial_stream_window_size(HTTP2_STREAM_WINDOW)
            .http2_initial_connection_window_size(HTTP2_CONNECTION_WINDOW)
            .build(connector);
    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = tower::ServiceBuilder::new()
        .layer(ObserveLayer::new(metrics, ApiClient::PodWatches))
        .layer(tower::limit::ConcurrencyLimitLayer::new(max_in_flight))
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(Some(kube::Client::new(
        service,
        config.default_namespace.clone(),
    )))
}

const HTTP2_PING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);
const HTTP2_PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);
/// HTTP/2's own default window for a stream.
const HTTP2_STREAM_WINDOW: u32 = 65_535;
const HTTP2_CONNECTION_WINDOW: u32 = 1024 * 1024;

/// Whether the API server answers `client` (built by [`pod_watch_client`]) over HTTP/2, within
/// `timeout`; the error says why not.
pub async fn speaks_http2(
    client: &kube::Client,
    timeout: std::time::Duration,
) -> Result<(), String> {
    match tokio::time::timeout(timeout, client.apiserver_version()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
    }
}

/// Wraps the bound: counts the calls it lets through and times the waits for a slot.
#[derive(Clone)]
struct ObserveLayer {
    in_flight: IntGauge,
    throttled_seconds: Counter,
}

impl ObserveLayer {
    fn new(metrics: &Metrics, client: ApiClient) -> Self {
        ObserveLayer {
            in_flight: metrics
                .process
                .api_calls_in_flight
                .with_label_values(&[client.as_str()]),
            throttled_seconds: metrics
                .process
                .api_calls_throttled_seconds_total
                .with_label_values(&[client.as_str()]),
        }
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = CountedCalls<S>;

    fn layer(&self, inner: S) -> CountedCalls<S> {
        CountedCalls {
            inner,
            in_flight: self.in_flight.clone(),
            throttled_seconds: self.throttled_seconds.clone(),
            waiting_since: None,
        }
    }
}

struct CountedCalls<S> {
    inner: S,
    in_flight: IntGauge,
    throttled_seconds: Counter,
    /// Since when the next call waits for a slot (the bound said "not ready").
    waiting_since: Option<Instant>,
}

/// One call in flight, for as long as its future lives (answered, failed or dropped).
struct InFlightCall(IntGauge);

impl InFlightCall {
    fn start(gauge: &IntGauge) -> Self {
        gauge.inc();
        InFlightCall(gauge.clone())
    }
}

impl Drop for InFlightCall {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl<S, Request> Service<Request> for CountedCalls<S>
where
    S: Service<Request>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        let ready = self.inner.poll_ready(cx);
        match ready {
            Poll::Pending => {
                self.waiting_since.get_or_insert_with(Instant::now);
            }
            Poll::Ready(_) => {
                if let Some(since) = self.waiting_since.take() {
                    self.throttled_seconds.inc_by(since.elapsed().as_secs_f64());
                }
            }
        }
        ready
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let call = InFlightCall::start(&self.in_flight);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            drop(call);
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// Calls the server is answering at once, the most it ever answered at once, and the most
    /// calls in flight the operator's gauge showed while the server held one.
    struct Server {
        now: AtomicUsize,
        most: AtomicUsize,
        gauge_most: AtomicI64,
        gauge: IntGauge,
    }

    impl Server {
        fn new(metrics: &Metrics, client: ApiClient) -> Arc<Self> {
            Arc::new(Server {
                now: AtomicUsize::new(0),
                most: AtomicUsize::new(0),
                gauge_most: AtomicI64::new(0),
                gauge: metrics
                    .process
                    .api_calls_in_flight
                    .with_label_values(&[client.as_str()]),
            })
        }
    }

    const HOLD: Duration = Duration::from_millis(30);

    /// A plain-HTTP server on localhost that holds every call 30 ms (long enough for a burst to
    /// pile up) and records how many calls it holds at once.
    async fn slow_server(server: Arc<Server>) -> anyhow::Result<SocketAddr> {
        let app = axum::Router::new().fallback(move || {
            let server = server.clone();
            async move {
                let now = server.now.fetch_add(1, Ordering::SeqCst) + 1;
                server.most.fetch_max(now, Ordering::SeqCst);
                server.gauge_most.fetch_max(server.gauge.get(), Ordering::SeqCst);
                tokio::time::sleep(HOLD).await;
                server.now.fetch_sub(1, Ordering::SeqCst);
                r#"{"major":"1","minor":"37","gitVersion":"v1.37.2","gitCommit":"0","gitTreeState":"clean","buildDate":"2026-01-01T00:00:00Z","goVersion":"go1.25","compiler":"gc","platform":"linux/amd64"}"#
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(addr)
    }

    /// Sends a burst of 100 calls (100 nodes entering maintenance at once) through a client
    /// bounded to 8 calls in flight.
    async fn burst(metrics: &Metrics, server: &Arc<Server>) -> anyhow::Result<()> {
        let addr = slow_server(server.clone()).await?;
        let config = kube::Config::new(format!("http://{addr}").parse()?);
        let client = bounded_client(config, 8, metrics, ApiClient::Main)?;
        let calls = (0..100).map(|_| client.apiserver_version());
        for answer in futures::future::join_all(calls).await {
            answer?;
        }
        Ok(())
    }

    /// The burst reaches the API server at most 8 at a time, so the client never opens more
    /// connections than that; without the bound, all 100 are in flight together, each on its
    /// own connection.
    #[tokio::test]
    async fn a_burst_of_calls_never_has_more_in_flight_than_the_bound() -> anyhow::Result<()> {
        let metrics = Metrics::new()?;
        let server = Server::new(&metrics, ApiClient::Main);
        burst(&metrics, &server).await?;
        let most = server.most.load(Ordering::SeqCst);
        assert_eq!(
            most, 8,
            "the server held {most} calls at once; the bound is 8 (and a burst of 100 fills it)"
        );
        Ok(())
    }

    /// What the bound does is visible: the gauge shows the 8 calls in flight while the server
    /// holds them and none once answered, and the calls held back by the bound add up their
    /// wait (about 12 rounds of 30 ms after the first 8), on the client that made them only.
    #[tokio::test]
    async fn the_metrics_show_the_calls_in_flight_and_the_wait_for_a_slot() -> anyhow::Result<()> {
        let metrics = Metrics::new()?;
        let server = Server::new(&metrics, ApiClient::Main);
        burst(&metrics, &server).await?;
        let gauge_most = server.gauge_most.load(Ordering::SeqCst);
        assert_eq!(
            gauge_most, 8,
            "calls in flight shown while the server held 8"
        );
        let label = [ApiClient::Main.as_str()];
        assert_eq!(
            metrics
                .process
                .api_calls_in_flight
                .with_label_values(&label)
                .get(),
            0
        );
        let throttled = metrics
            .process
            .api_calls_throttled_seconds_total
            .with_label_values(&label)
            .get();
        let at_least = (HOLD * 10).as_secs_f64();
        assert!(
            throttled >= at_least,
            "the burst waited {throttled:.3} s for slots; at least {at_least} s expected"
        );
        let other = [ApiClient::Evictions.as_str()];
        assert_eq!(
            metrics
                .process
                .api_calls_throttled_seconds_total
                .with_label_values(&other)
                .get(),
            0.0
        );
        Ok(())
    }
}
