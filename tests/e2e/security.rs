//! The operator's doors on a live control plane (docs/security.md):
//!
//! - `/metrics` answers only callers the API server authenticates (TokenReview) and authorizes
//!   for `get` on the non-resource URL `/metrics` (SubjectAccessReview): 401 anonymous or with a
//!   bad token, 403 for a ServiceAccount without the right, 200 with it; verdicts are cached, so
//!   repeated scrapes cost no API calls; a rotated certificate is served without a restart.
//!   `--metrics-insecure` (the other tests') answers anyone.
//! - The webhook under bad clients: an oversized body is refused unread (413), a slowloris
//!   client (slow handshake, slow headers, slow body) is cut by timeouts, TLS 1.1 is refused, a
//!   client resetting HTTP/2 streams as fast as it opens them is disconnected, a flood of idle
//!   connections past `--max-connections` is refused at once; meanwhile the real API server's
//!   reviews are answered in time.
//!
//! Both start a control plane of their own: the webhook registration is cluster-wide.
//!
//!   PATH="$(tests/testbed/testbed bin-dir):$PATH" cargo test --test e2e security::

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use kube::Client;
use support::operator::*;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::webhook::{
    Ca, CertFiles, WEBHOOK_PATH, refusal, register, registration, try_create, unregister,
    wait_missing_node_refused,
};

const WAIT: Duration = Duration::from_secs(60);
/// The API server's default timeout for a webhook call, which the reviews must meet.
const API_SERVER_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// A sample of the operator's own `/metrics` text.
fn sample(text: &str, name: &str) -> f64 {
    metric_value(text, name).unwrap_or(0.0)
}

#[tokio::test]
async fn metrics_answer_only_callers_the_api_server_allows() -> Result<()> {
    let (testbed, client, _ns, _nodes) = own_cluster("metrics-auth", 1, None).await?;
    // A certificate from files (as the chart gives it), verified by the scrapes.
    let dir = tempfile::tempdir()?;
    let files = CertFiles::in_dir(dir.path());
    let ca = Ca::new("metrics test CA 1")?;
    files.write(&ca.serving()?)?;
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.pem())?;
    let (cert, key) = (
        files.cert.to_string_lossy().into_owned(),
        files.key.to_string_lossy().into_owned(),
    );
    let operator = Operator::start(
        &testbed,
        &[
            "--metrics-insecure=false",
            "--metrics-cert-file",
            &cert,
            "--metrics-key-file",
            &key,
        ],
    )
    .await?;
    let port = operator.metrics_port;
    let scrape = |token: Option<&str>| https_scrape(port, token, Some(&ca_file));

    // Plain HTTP is not served on the secure port.
    ensure!(
        http_get(&format!("http://127.0.0.1:{port}/metrics"))
            .await
            .map_or(true, |(code, _)| code != 200),
        "/metrics answered plain HTTP"
    );

    let (code, body) = scrape(None)?;
    ensure!(code == 401, "anonymous: {code} {body}");
    ensure!(body.contains("bearer token"), "anonymous: {body}");
    let (code, body) = scrape(Some("not-a-token"))?;
    ensure!(code == 401, "a bad token: {code} {body}");

    // A ServiceAccount without the right: authenticated, not authorized.
    let ns = OPERATOR_NAMESPACE;
    let nobody = "no-metrics";
    create_bound_service_account(&client, ns, nobody, "view").await?;
    let nobody_token = service_account_token(&client, ns, nobody).await?;
    let (code, body) = scrape(Some(&nobody_token))?;
    ensure!(code == 403, "a token without the right: {code} {body}");
    ensure!(
        body.contains("metrics-reader"),
        "403 says what to do: {body}"
    );

    // With the metrics-reader rule: the series.
    let reader = "metrics-reader";
    let role = metrics_reader_role(&client).await?;
    create_bound_service_account(&client, ns, reader, role).await?;
    let token = service_account_token(&client, ns, reader).await?;
    let (code, body) = scrape(Some(&token))?;
    ensure!(code == 200, "a token with the right: {code} {body}");
    ensure!(
        body.contains("maintenance_operator_leader 1"),
        "no series in the answer:\n{body}"
    );

    // Verdicts are remembered: five more scrapes, no more reviews.
    for _ in 0..5 {
        let (code, _) = scrape(Some(&token))?;
        ensure!(code == 200, "a repeated scrape: {code}");
    }
    let (_, body) = scrape(Some(&token))?;
    let count = |verdict: &str, source: &str| {
        sample(
            &body,
            &format!(
                "maintenance_operator_metrics_access_total{{source=\"{source}\",verdict=\"{verdict}\"}}"
            ),
        )
    };
    let (reviewed, cached) = (count("allowed", "review"), count("allowed", "cache"));
    ensure!(
        reviewed == 1.0 && cached >= 5.0,
        "allowed scrapes reviewed {reviewed} times and answered from the cache {cached} times; \
         want 1 review and the rest cached"
    );
    let forbidden = count("forbidden", "review");
    let anonymous = count("unauthenticated", "no_token");
    ensure!(
        forbidden == 1.0 && anonymous == 1.0,
        "forbidden {forbidden}, anonymous {anonymous}"
    );
    // A rotated certificate is served without a restart, as the webhook's.
    let second_ca = Ca::new("metrics test CA 2")?;
    files.write(&second_ca.serving()?)?;
    let second_ca_file = dir.path().join("ca-2.crt");
    std::fs::write(&second_ca_file, second_ca.pem())?;
    let verified_by_second_ca = || https_scrape(port, Some(&token), Some(&second_ca_file));
    wait_for(
        "the rotated /metrics certificate to be served",
        WAIT,
        || async {
            Ok(verified_by_second_ca()
                .ok()
                .filter(|(code, _)| *code == 200)
                .map(|_| ()))
        },
    )
    .await?;
    ensure!(
        scrape(Some(&token)).map_or(true, |(code, _)| code != 200),
        "the first CA still verifies /metrics after the rotation"
    );
    // Probes stay open on their own port.
    let (code, _) = http_get(&format!("http://127.0.0.1:{}/readyz", operator.health_port)).await?;
    ensure!(code == 200, "/readyz answered {code}");
    Ok(())
}

#[tokio::test]
async fn the_webhook_outlasts_bad_clients_and_still_answers_the_api_server() -> Result<()> {
    let (testbed, client, ns, _nodes) = own_cluster("webhook-abuse", 1, None).await?;
    let dir = tempfile::tempdir()?;
    let files = CertFiles::in_dir(dir.path());
    let ca = Ca::new("webhook abuse test CA")?;
    files.write(&ca.serving()?)?;
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.pem())?;

    const MAX_CONNECTIONS: usize = 32;
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let (cert, key) = (
        files.cert.to_string_lossy().into_owned(),
        files.key.to_string_lossy().into_owned(),
    );
    let max = MAX_CONNECTIONS.to_string();
    let operator = Operator::start(
        &testbed,
        &[
            "--webhook-addr",
            &addr,
            "--webhook-cert-file",
            &cert,
            "--webhook-key-file",
            &key,
            "--max-connections",
            &max,
        ],
    )
    .await?;
    let config_name = unique_name("webhook-abuse");
    let url = format!("https://127.0.0.1:{port}{WEBHOOK_PATH}");
    register(&client, &registration(&config_name, &url, &ca.pem())).await?;
    let result = abuse(&client, &ns, &operator, port, &ca_file).await;
    if result.is_err() {
        eprintln!(
            "operator log:\n{}",
            std::fs::read_to_string(&operator.log).unwrap_or_default()
        );
    }
    unregister(&client, &config_name).await?;
    result
}

/// A review by the real API server (a dry-run CREATE for a missing node) answered by the
/// webhook's refusal within the API server's timeout: how long it took.
async fn reviewed_in_time(client: &Client, ns: &str, what: &str) -> Result<Duration> {
    let started = Instant::now();
    let spec = request_spec("no-such-node", "webhook.example.com");
    let (code, message) = refusal(
        try_create(client, ns, "probe", spec, true).await,
        "a request for a missing node",
    )?;
    let took = started.elapsed();
    ensure!(
        code == 403 && message.contains("does not exist"),
        "{what}: the API server answered {code} {message}, not the webhook's refusal"
    );
    ensure!(
        took < API_SERVER_WEBHOOK_TIMEOUT,
        "{what}: the review took {took:?}"
    );
    eprintln!("{what}: reviewed in {:.0} ms", took.as_secs_f64() * 1e3);
    Ok(took)
}

async fn abuse(
    client: &Client,
    ns: &str,
    operator: &Operator,
    port: u16,
    ca_file: &std::path::Path,
) -> Result<()> {
    wait_missing_node_refused(client, ns, "the webhook to answer").await?;
    reviewed_in_time(client, ns, "before any bad client").await?;

    // An oversized body is refused before it is read; one under the limit is read and refused
    // as no AdmissionReview.
    let big = garbage_file(4 << 20)?;
    let (code, body) = curl_post(port, ca_file, big.path())?;
    // The 413 comes before the body is read: curl, still sending, may see the connection
    // closed under it (broken pipe, reset) and report only the 100 Continue it got first.
    let cut = ["Broken pipe", "Connection reset"]
        .iter()
        .any(|said| body.contains(said));
    ensure!(code == 413 || cut, "a 4 MiB body: {code} {body}");
    let under = garbage_file(2 << 20)?;
    let (code, body) = curl_post(port, ca_file, under.path())?;
    ensure!(code == 400, "a 2 MiB body of garbage: {code} {body}");

    // Slowloris: connections that never finish the TLS handshake, requests whose headers or
    // body trickle in. Each is cut by a timeout while the API server's reviews go on.
    let mut silent = Vec::new();
    for _ in 0..8 {
        silent.push(tokio::net::TcpStream::connect(("127.0.0.1", port)).await?);
    }
    let mut trickles = Vec::new();
    for body in [false, true] {
        for _ in 0..4 {
            trickles.push(Trickle::start(port, ca_file, body).await?);
        }
    }
    let started = Instant::now();
    reviewed_in_time(client, ns, "with slow clients connected").await?;
    for stream in &mut silent {
        closed_within(stream, Duration::from_secs(15))
            .await
            .context("a connection that never sent a TLS handshake")?;
    }
    for trickle in &mut trickles {
        trickle.closed_within(Duration::from_secs(20)).await?;
    }
    eprintln!(
        "slow clients: all {} cut within {:.1} s",
        silent.len() + trickles.len(),
        started.elapsed().as_secs_f64()
    );

    // Only TLS 1.2 and later: a client that offers TLS 1.1 alone (OpenSSL's security level
    // lowered so that it does) is refused in the handshake; the same client with TLS 1.2 is not.
    let tls = |version: &str| {
        std::process::Command::new("openssl")
            .args([
                "s_client",
                "-connect",
                &format!("127.0.0.1:{port}"),
                version,
            ])
            .args(["-cipher", "DEFAULT:@SECLEVEL=0", "-CAfile"])
            .arg(ca_file)
            .stdin(Stdio::null())
            .output()
            .context("running openssl s_client (Debian: openssl)")
    };
    let old = tls("-tls1_1")?;
    let said =
        String::from_utf8_lossy(&old.stderr).into_owned() + &String::from_utf8_lossy(&old.stdout);
    ensure!(
        // rustls answers a ClientHello without TLS 1.2 or 1.3 with a handshake_failure alert.
        !old.status.success() && said.contains("alert") && said.contains("Cipher is (NONE)"),
        "a TLS 1.1 handshake was not refused:\n{said}"
    );
    let current = tls("-tls1_2")?;
    ensure!(
        current.status.success() && String::from_utf8_lossy(&current.stdout).contains("TLSv1.2"),
        "a TLS 1.2 handshake failed: {}",
        String::from_utf8_lossy(&current.stderr)
    );

    // HTTP/2 rapid reset (CVE-2023-44487): a client that resets every stream as soon as it
    // opens it has its connection closed (hyper's bound on streams reset before they are
    // answered, 20, set explicitly in src/serve.rs), and the API server's reviews go on.
    let (resets, closed) = rapid_reset(port, ca_file.to_path_buf()).await?;
    ensure!(
        closed,
        "the server took {resets} streams reset at once without closing the connection"
    );
    eprintln!("rapid reset: the connection was closed after {resets} reset streams");
    reviewed_in_time(client, ns, "after a rapid-reset client").await?;

    // A flood of idle connections past --max-connections: those past the limit are closed at
    // once; the API server's own connection (kept alive) goes on being answered, and the idle
    // ones are cut by the handshake timeout.
    let refused_before = sample(
        &operator.metrics().await?,
        r#"maintenance_operator_connections_refused_total{server="webhook"}"#,
    );
    let mut flood = Vec::new();
    for _ in 0..200 {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(stream) => flood.push(stream),
            Err(err) => bail!("connecting the flood: {err}"),
        }
    }
    reviewed_in_time(client, ns, "during a flood of 200 idle connections").await?;
    let refused = wait_for("the limit to refuse the flood", WAIT, || async {
        let refused = sample(
            &operator.metrics().await?,
            r#"maintenance_operator_connections_refused_total{server="webhook"}"#,
        ) - refused_before;
        Ok((refused >= 100.0).then_some(refused))
    })
    .await?;
    eprintln!("flood: {refused} of 200 connections refused at once");
    drop(flood);
    reviewed_in_time(client, ns, "after the flood").await?;
    Ok(())
}

/// Streams the rapid-reset client opens and resets at most.
const RAPID_RESETS: usize = 10_000;

/// Opens and at once resets HTTP/2 streams on one connection (TLS, ALPN h2), [`RAPID_RESETS`]
/// times or until the server closes the connection: how many were reset, and whether it closed.
async fn rapid_reset(port: u16, ca_file: std::path::PathBuf) -> Result<(usize, bool)> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(&ca_file)?)?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1")?.to_owned(), tcp)
        .await?;
    let (client, connection) = h2::client::handshake(tls).await?;
    let connection = tokio::spawn(connection);
    let uri = format!("https://127.0.0.1:{port}{WEBHOOK_PATH}");
    let mut sent = 0;
    let mut closed = false;
    while sent < RAPID_RESETS {
        let Ok(mut ready) = client.clone().ready().await else {
            closed = true;
            break;
        };
        let request = http::Request::post(uri.as_str()).body(())?;
        match ready.send_request(request, false) {
            Ok((_, mut stream)) => {
                // Let the connection task write the HEADERS frame before the reset, so that
                // the server sees each stream opened, then reset.
                tokio::task::yield_now().await;
                stream.send_reset(h2::Reason::CANCEL);
                tokio::task::yield_now().await;
            }
            Err(_) => {
                closed = true;
                break;
            }
        }
        sent += 1;
    }
    connection.abort();
    Ok((sent, closed))
}

/// A temporary file of `size` bytes of JSON-looking garbage.
fn garbage_file(size: usize) -> Result<tempfile::NamedTempFile> {
    let file = tempfile::NamedTempFile::new()?;
    let mut body = String::with_capacity(size);
    body.push('{');
    while body.len() < size - 1 {
        body.push_str("\"x\":1,");
    }
    std::fs::write(file.path(), body)?;
    Ok(file)
}

/// POSTs the file to the webhook path over TLS (verified against the test's CA): status, body.
fn curl_post(
    port: u16,
    ca_file: &std::path::Path,
    body: &std::path::Path,
) -> Result<(u16, String)> {
    let out = std::process::Command::new("curl")
        // HTTP/1.1: over HTTP/2 the server's early 413 comes with a reset of the stream curl is
        // still sending on, which curl reports as a framing error instead of the status.
        .args([
            "-sS",
            "--http1.1",
            "--max-time",
            "20",
            "-w",
            "\n%{http_code}",
            "--cacert",
        ])
        .arg(ca_file)
        .args(["-H", "Content-Type: application/json", "--data-binary"])
        .arg(format!("@{}", body.display()))
        .arg(format!("https://127.0.0.1:{port}{WEBHOOK_PATH}"))
        .stdin(Stdio::null())
        .output()
        .context("running curl (Debian: curl)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, code) = text.rsplit_once('\n').context("curl printed no status")?;
    let code = code.trim().parse().with_context(|| {
        format!(
            "curl printed no status: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    Ok((code, format!("{body}{stderr}")))
}

/// Waits until the server closes `stream` (a read returns end of file or an error).
async fn closed_within(stream: &mut tokio::net::TcpStream, limit: Duration) -> Result<()> {
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(()),
            Ok(Ok(_)) => continue,
            Err(_) => bail!("still open after {limit:?}"),
        }
    }
}

/// A TLS client (openssl s_client) that sends a request a few bytes a second: its headers, or
/// complete headers and then its body.
struct Trickle {
    child: tokio::process::Child,
    feeder: tokio::task::JoinHandle<()>,
}

impl Trickle {
    async fn start(port: u16, ca_file: &std::path::Path, slow_body: bool) -> Result<Trickle> {
        let mut child = tokio::process::Command::new("openssl")
            .args(["s_client", "-quiet", "-connect"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-CAfile")
            .arg(ca_file)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("running openssl s_client (Debian: openssl)")?;
        let mut stdin = child.stdin.take().context("no stdin")?;
        let feeder = tokio::spawn(async move {
            let head = format!(
                "POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: \
                 application/json\r\n"
            );
            if stdin.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            if slow_body
                && stdin
                    .write_all(b"Content-Length: 1000\r\n\r\n{")
                    .await
                    .is_err()
            {
                return;
            }
            // A byte a second, for longer than any timeout of the server.
            for _ in 0..60 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let byte: &[u8] = if slow_body { b" " } else { b"X" };
                if stdin.write_all(byte).await.is_err() || stdin.flush().await.is_err() {
                    return;
                }
            }
        });
        Ok(Trickle { child, feeder })
    }

    /// Waits until the server has closed the connection (s_client exits when it does).
    async fn closed_within(&mut self, limit: Duration) -> Result<()> {
        let exited = tokio::time::timeout(limit, self.child.wait()).await;
        self.feeder.abort();
        match exited {
            Ok(_) => Ok(()),
            Err(_) => bail!("a slow TLS client was still connected after {limit:?}"),
        }
    }
}
