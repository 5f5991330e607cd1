//! What the operator's three servers (the webhook, `/metrics`, the probes) share: certificates
//! read from files and reloaded when they change (or generated at start), and a server that a
//! bad client cannot hold: bounded connections, handshake, header and request timeouts, HTTP/2
//! limits against rapid reset. TLS is rustls, which speaks only TLS 1.2 and 1.3.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum_server::accept::Accept;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How often certificate files are checked for a new certificate.
const RELOAD_PERIOD: Duration = Duration::from_secs(5);
/// A TLS handshake takes milliseconds; a client that has not finished in this time is holding
/// the connection.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time from the accepted connection (after TLS) to a complete first request's headers.
const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for each request's headers on an HTTP/1.1 connection.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Time for a whole request, body read and answer included: the API server gives a webhook 10 s
/// by default, and a scrape has its own timeout of the same order.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 streams per connection: the API server sends one review at a time per stream.
const MAX_CONCURRENT_STREAMS: u32 = 100;
/// Streams a client may reset before the server answers them (the "rapid reset" attack,
/// CVE-2023-44487, resets streams as fast as it opens them); past it the connection is closed.
const MAX_PENDING_RESET_STREAMS: usize = 20;

/// The servers, for messages, flags and the `server` label of the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    Webhook,
    Metrics,
    Health,
}

impl Server {
    pub fn as_str(self) -> &'static str {
        match self {
            Server::Webhook => "webhook",
            Server::Metrics => "metrics",
            Server::Health => "health",
        }
    }

    fn address_flag(self) -> &'static str {
        match self {
            Server::Webhook => "--webhook-addr",
            Server::Metrics => "--metrics-addr",
            Server::Health => "--health-addr",
        }
    }
}

/// How much one server accepts at once.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once; a connection past it is closed at once.
    pub max_connections: usize,
    /// Largest request body; a larger one is answered 413 without being read.
    pub max_body_bytes: usize,
}

/// A serving certificate: from files (reloaded when they change) or generated at start.
pub struct Certificate {
    tls: RustlsConfig,
    reload: Option<(CertFiles, Pem)>,
}

impl Certificate {
    /// Reads the certificate and key; a pair that cannot be used now is an error (at start-up it
    /// is a mistake in the deployment, not a rotation in progress: the kubelet mounts a Secret
    /// before the container starts). `server` names the flags in the messages.
    pub async fn from_files(cert: PathBuf, key: PathBuf, server: Server) -> anyhow::Result<Self> {
        let files = CertFiles { cert, key, server };
        let loaded = files.read().await?;
        let tls = RustlsConfig::from_pem(loaded.cert.clone(), loaded.key.clone())
            .await
            .map_err(|err| files.unusable(&err))?;
        Ok(Certificate {
            tls,
            reload: Some((files, loaded)),
        })
    }

    /// A self-signed certificate for `names` (DNS names or IP addresses), made at start: the
    /// connection is encrypted, and a client that cannot verify it must be told to skip
    /// verification (a Prometheus `insecure_skip_verify`), as controller-runtime's own
    /// self-signed metrics certificate requires.
    pub async fn self_signed(names: Vec<String>) -> anyhow::Result<Self> {
        let rcgen::CertifiedKey { cert, signing_key } = rcgen::generate_simple_self_signed(names)
            .map_err(|err| {
            anyhow::anyhow!("cannot generate a self-signed certificate: {err}")
        })?;
        let tls = RustlsConfig::from_pem(
            cert.pem().into_bytes(),
            signing_key.serialize_pem().into_bytes(),
        )
        .await
        .map_err(|err| anyhow::anyhow!("cannot use the self-signed certificate: {err}"))?;
        Ok(Certificate { tls, reload: None })
    }
}

/// Serves `app` on `addr` until it fails: over TLS with `certificate`, else plain HTTP. Every
/// connection past `limits.max_connections` is closed at once and counted in `refused`.
pub async fn serve(
    addr: SocketAddr,
    server: Server,
    certificate: Option<Certificate>,
    app: Router,
    limits: Limits,
    refused: IntCounter,
) -> anyhow::Result<()> {
    let app = app
        .layer(axum::extract::DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(axum::middleware::from_fn(within_request_timeout));
    let bounded = Bounded {
        permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
        refused,
    };
    let on_error = move |peer: Option<&SocketAddr>, err: &io::Error| {
        // A failed handshake (a client with another CA, a port scan), a timeout or a refused
        // connection ends that connection only.
        tracing::debug!(?peer, error = %err, server = server.as_str(), "connection ended");
    };
    let make_service = app.into_make_service();
    let served = match certificate {
        Some(Certificate { tls, reload }) => {
            let reload = reload
                .map(|(files, loaded)| tokio::spawn(keep_current(tls.clone(), files, loaded)));
            let acceptor = RustlsAcceptor::new(tls)
                .handshake_timeout(HANDSHAKE_TIMEOUT)
                .acceptor(bounded);
            let mut http = axum_server::bind(addr)
                .acceptor(acceptor)
                .first_request_timeout(FIRST_REQUEST_TIMEOUT)
                .accept_error_handler(on_error);
            harden(&mut http);
            let served = http.serve(make_service).await;
            if let Some(reload) = reload {
                reload.abort();
            }
            served
        }
        None => {
            let mut http = axum_server::bind(addr)
                .acceptor(bounded)
                .first_request_timeout(FIRST_REQUEST_TIMEOUT)
                .accept_error_handler(on_error);
            harden(&mut http);
            http.serve(make_service).await
        }
    };
    served.map_err(|err| {
        anyhow::anyhow!(
            "the {} server cannot serve on {addr}: {err}; choose another {}",
            server.as_str(),
            server.address_flag()
        )
    })
}

fn harden<A: axum_server::Address, Acc>(http: &mut axum_server::Server<A, Acc>) {
    let builder = http.http_builder();
    builder.http1().header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_pending_accept_reset_streams(MAX_PENDING_RESET_STREAMS)
        .max_local_error_reset_streams(MAX_PENDING_RESET_STREAMS);
}

/// A request that takes longer than [`REQUEST_TIMEOUT`] (a body sent a byte at a time) is
/// answered 408 and its connection freed.
async fn within_request_timeout(request: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => (
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request took more than {}s to arrive and be answered\n",
                REQUEST_TIMEOUT.as_secs()
            ),
        )
            .into_response(),
    }
}

/// Admits a connection while fewer than the limit are open; the connection holds its permit
/// until it closes.
#[derive(Clone)]
struct Bounded {
    permits: Arc<Semaphore>,
    refused: IntCounter,
}

impl<S> Accept<TcpStream, S> for Bounded {
    type Stream = Permitted;
    type Service = S;
    type Future = std::future::Ready<io::Result<(Permitted, S)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        std::future::ready(match self.permits.clone().try_acquire_owned() {
            Ok(permit) => Ok((
                Permitted {
                    stream,
                    _permit: permit,
                },
                service,
            )),
            Err(_) => {
                self.refused.inc();
                Err(io::Error::other(
                    "too many connections open; closed (raise --max-connections if legitimate \
                     clients are refused)",
                ))
            }
        })
    }
}

/// A connection and the permit it holds.
struct Permitted {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for Permitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Permitted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Where a certificate and its key are read from.
struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    server: Server,
}

/// What the files held when last loaded.
#[derive(PartialEq, Eq)]
struct Pem {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl CertFiles {
    async fn read(&self) -> anyhow::Result<Pem> {
        let server = self.server.as_str();
        let read = |path: &Path| {
            let path = path.to_path_buf();
            async move {
                tokio::fs::read(&path).await.map_err(|err| {
                    anyhow::anyhow!(
                        "cannot read {} for the {server} server: {err}; mount its certificate \
                         Secret there or fix --{server}-cert-file/--{server}-key-file",
                        path.display()
                    )
                })
            }
        };
        Ok(Pem {
            cert: read(&self.cert).await?,
            key: read(&self.key).await?,
        })
    }

    fn unusable(&self, err: &io::Error) -> anyhow::Error {
        anyhow::anyhow!(
            "{} and {} hold no usable certificate and matching private key for the {} server: \
             {err}; they must be PEM (a certificate chain, and one PKCS#8, PKCS#1 or SEC1 key)",
            self.cert.display(),
            self.key.display(),
            self.server.as_str()
        )
    }
}

/// Reloads the certificate whenever the files hold something new. The contents are compared,
/// not the modification times: the kubelet updates a mounted Secret by swapping a symlink, and
/// the new files' times say nothing reliable. A pair that does not load (say, the key written
/// but not yet the certificate) keeps the current certificate and is tried again.
async fn keep_current(tls: RustlsConfig, files: CertFiles, mut loaded: Pem) {
    let mut ticker = tokio::time::interval(RELOAD_PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Warn once per problem, not every period.
    let mut last_problem = String::new();
    loop {
        ticker.tick().await;
        let result = match files.read().await {
            Ok(pem) if pem == loaded => Ok(None),
            Ok(pem) => tls
                .reload_from_pem(pem.cert.clone(), pem.key.clone())
                .await
                .map(|()| Some(pem))
                .map_err(|err| files.unusable(&err)),
            Err(err) => Err(err),
        };
        match result {
            Ok(None) => {}
            Ok(Some(pem)) => {
                loaded = pem;
                last_problem.clear();
                tracing::info!(
                    cert = %files.cert.display(),
                    server = files.server.as_str(),
                    "reloaded the certificate"
                );
            }
            Err(err) => {
                let problem = format!("{err:#}");
                if problem != last_problem {
                    tracing::warn!(error = %problem, server = files.server.as_str(),
                        "keeping the current certificate");
                    last_problem = problem;
                }
            }
        }
    }
}
