//! `/metrics`, over HTTPS behind the API server's authentication and authorization, and the
//! probes `/healthz` and `/readyz` on a plain-HTTP port of their own, where a kubelet calls them.
//!
//! A scrape's bearer token is authenticated with a TokenReview, and the user it names is
//! authorized for `get` on the non-resource URL `/metrics` with a SubjectAccessReview, as
//! controller-runtime's `filters.WithAuthenticationAndAuthorization` does. The verdicts are
//! remembered for a short time (`maintenance_core::access`), so a scrape does not cost two API
//! calls.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use maintenance_actors::metrics::Metrics;
use maintenance_core::access::{self, Access, AccessCache, Reviewed};

use crate::serve::{Certificate, Limits, Server};

/// Probes and scrapes carry no body.
const MAX_BODY_BYTES: usize = 4 << 10;

#[derive(clap::Args, Debug, Clone)]
pub struct EndpointArgs {
    /// Address of /metrics: HTTPS, for callers whose bearer token the API server authenticates
    /// and authorizes for `get` on the non-resource URL /metrics (the chart's metrics-reader
    /// ClusterRole).
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8443")]
    pub metrics_addr: SocketAddr,
    /// Serve /metrics over plain HTTP to anyone, without authentication: for a local run only
    /// (`--metrics-insecure=false` says the default explicitly).
    #[arg(long, env = "METRICS_INSECURE", num_args = 0..=1, default_value_t = false,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub metrics_insecure: bool,
    /// PEM file of the /metrics serving certificate (with its chain), reloaded when it changes;
    /// without it, a self-signed certificate is made at start.
    #[arg(long, requires = "metrics_key_file")]
    pub metrics_cert_file: Option<PathBuf>,
    /// PEM file of the private key of --metrics-cert-file; reloaded with it.
    #[arg(long, requires = "metrics_cert_file")]
    pub metrics_key_file: Option<PathBuf>,
    /// Address of the probes /healthz and /readyz: plain HTTP, no authentication (they say
    /// nothing but "ok" or "not ready").
    #[arg(long, env = "HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    pub health_addr: SocketAddr,
    /// Most connections open at once on each server (webhook, metrics, probes); a connection
    /// past it is closed at once. Slow clients are cut by timeouts, so legitimate clients need
    /// few.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
}

/// What the probes read.
pub struct Probes {
    /// Ready once the caches are synced (or, on a standby, once it waits for the lease).
    pub ready: Box<dyn Fn() -> bool + Send + Sync>,
}

/// Serves the probes on `--health-addr` until it fails.
pub async fn serve_probes(
    args: &EndpointArgs,
    probes: Arc<Probes>,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(probes);
    tracing::info!(addr = %args.health_addr, "serving /healthz and /readyz");
    crate::serve::serve(
        args.health_addr,
        Server::Health,
        None,
        app,
        limits(args),
        refused(metrics, Server::Health),
    )
    .await
}

/// Serves `/metrics` on `--metrics-addr` until it fails: with authentication and authorization
/// over HTTPS, or, with `--metrics-insecure`, to anyone over plain HTTP.
pub async fn serve_metrics(
    args: &EndpointArgs,
    client: kube::Client,
    metrics: Arc<Metrics>,
    host: &str,
) -> anyhow::Result<()> {
    let refused = refused(&metrics, Server::Metrics);
    let guard = (!args.metrics_insecure).then(|| Guard {
        token_reviews: Api::all(client.clone()),
        access_reviews: Api::all(client),
        verdicts: Mutex::new(AccessCache::default()),
    });
    let certificate = match (&guard, &args.metrics_cert_file, &args.metrics_key_file) {
        (None, _, _) => None,
        (Some(_), Some(cert), Some(key)) => {
            Some(Certificate::from_files(cert.clone(), key.clone(), Server::Metrics).await?)
        }
        (Some(_), _, _) => Some(
            Certificate::self_signed(vec![
                "localhost".into(),
                "127.0.0.1".into(),
                host.to_string(),
            ])
            .await?,
        ),
    };
    if guard.is_some() {
        tracing::info!(addr = %args.metrics_addr, "serving /metrics over HTTPS to callers allowed by the API server");
    } else {
        tracing::warn!(addr = %args.metrics_addr, "serving /metrics over plain HTTP to anyone (--metrics-insecure): for a local run only");
    }
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(Arc::new(Scrapes { metrics, guard }));
    crate::serve::serve(
        args.metrics_addr,
        Server::Metrics,
        certificate,
        app,
        limits(args),
        refused,
    )
    .await
}

fn limits(args: &EndpointArgs) -> Limits {
    Limits {
        max_connections: args.max_connections as usize,
        max_body_bytes: MAX_BODY_BYTES,
    }
}

fn refused(metrics: &Metrics, server: Server) -> prometheus::IntCounter {
    metrics
        .process
        .connections_refused_total
        .with_label_values(&[server.as_str()])
}

struct Scrapes {
    metrics: Arc<Metrics>,
    /// `None` with `--metrics-insecure`.
    guard: Option<Guard>,
}

/// Asks the API server who a caller is and whether it may read `/metrics`.
struct Guard {
    token_reviews: Api<TokenReview>,
    access_reviews: Api<SubjectAccessReview>,
    /// By SHA-256 of the token.
    verdicts: Mutex<AccessCache<[u8; 32]>>,
}

/// Where a verdict came from, for the `source` label.
#[derive(Clone, Copy)]
enum Source {
    /// No bearer token at all: nothing to ask.
    NoToken,
    Cache,
    Review,
}

impl Source {
    fn as_str(self) -> &'static str {
        match self {
            Source::NoToken => "no_token",
            Source::Cache => "cache",
            Source::Review => "review",
        }
    }
}

impl Guard {
    async fn check(&self, headers: &HeaderMap) -> Result<(Access, Source), String> {
        let Some(token) = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(access::bearer_token)
        else {
            return Ok((Access::Unauthenticated, Source::NoToken));
        };
        let key = digest(token);
        let remembered = self
            .verdicts
            .lock()
            .map_err(|_| "the verdict cache is poisoned".to_string())?
            .lookup(&key, Instant::now());
        if let Some(access) = remembered {
            return Ok((access, Source::Cache));
        }
        let access = access::verdict(self.review(token).await?);
        self.verdicts
            .lock()
            .map_err(|_| "the verdict cache is poisoned".to_string())?
            .record(key, access, Instant::now());
        Ok((access, Source::Review))
    }

    async fn review(&self, token: &str) -> Result<Reviewed, String> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let answered = self
            .token_reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|err| {
                format!(
                    "cannot authenticate the caller: the TokenReview failed: {err}; check the \
                     operator's ClusterRole allows create on tokenreviews"
                )
            })?;
        let status = answered.status.unwrap_or_default();
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
            return Ok(Reviewed::NotAuthenticated);
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(access::METRICS_PATH.into()),
                    verb: Some(access::METRICS_VERB.into()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answered = self
            .access_reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|err| {
                format!(
                    "cannot authorize the caller: the SubjectAccessReview failed: {err}; check \
                     the operator's ClusterRole allows create on subjectaccessreviews"
                )
            })?;
        Ok(Reviewed::Authenticated {
            allowed: answered.status.is_some_and(|status| status.allowed),
        })
    }
}

fn digest(token: &str) -> [u8; 32] {
    let mut key = [0; 32];
    key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
    key
}

async fn scrape(State(scrapes): State<Arc<Scrapes>>, headers: HeaderMap) -> Response {
    if let Some(guard) = &scrapes.guard {
        let (access, source) = match guard.check(&headers).await {
            Ok(checked) => checked,
            Err(problem) => {
                tracing::warn!(error = %problem, "cannot check a caller of /metrics");
                return (StatusCode::SERVICE_UNAVAILABLE, format!("{problem}\n")).into_response();
            }
        };
        scrapes
            .metrics
            .process
            .metrics_access_total
            .with_label_values(&[access.as_str(), source.as_str()])
            .inc();
        if access != Access::Allowed {
            let status = StatusCode::from_u16(access.status()).unwrap_or(StatusCode::UNAUTHORIZED);
            return (status, format!("{}\n", access.message())).into_response();
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        scrapes.metrics.render(),
    )
        .into_response()
}

async fn readyz(State(probes): State<Arc<Probes>>) -> impl IntoResponse {
    if (probes.ready)() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet")
    }
}
