//! A Prometheus server of the test's own (Debian's `prometheus` package) scraping fixed targets
//! every second, and its HTTP API. Debian's build has no Kubernetes service discovery, so a test
//! hands it the addresses to scrape.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::operator::{Helper, free_port, http_get};
use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

/// `name` on the PATH. Absent, the test fails: a test that skips itself when its tool is missing
/// reports a pass for a check that never ran.
pub fn required_tool(name: &str) -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "{name} is not on the PATH: install Debian's `prometheus` package, which provides \
             prometheus and promtool (apt-get install --no-install-recommends prometheus)"
        )
    })
}

/// How Prometheus scrapes the operator's secure `/metrics`, as the chart's ServiceMonitor has it:
/// HTTPS with a ServiceAccount token.
pub struct SecureScrape {
    /// The bearer token (written to a file Prometheus reads).
    pub token: String,
    /// The CA to verify the operator's certificate with, and the name to verify it for; `None`:
    /// a self-signed certificate, not verified.
    pub verify: Option<(String, String)>,
}

pub struct Prometheus {
    port: u16,
    /// `http`, or `https` when it serves TLS (`start_tls`).
    scheme: &'static str,
    process: Mutex<Helper>,
}

/// A certificate and its key (PEM) for Prometheus to serve HTTPS with.
pub struct ServingCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Prometheus {
    /// Starts Prometheus with its data, config and log in `dir`, scraping each of `targets`
    /// (`address:port`) every second as job `maintenance-operator`, and evaluating the rule files
    /// `rules` every second. Used by the release tests (the dashboard, the alerts) and the alert
    /// gates' e2e test.
    /// With `secure`, over HTTPS with a token; else plain HTTP.
    pub fn start(
        dir: &Path,
        targets: &[String],
        secure: Option<&SecureScrape>,
        rules: &[PathBuf],
    ) -> Result<Prometheus> {
        Self::spawn(dir, targets, secure, rules, None)
    }

    /// [`Prometheus::start`] serving its API over HTTPS with `serving` (its `--web.config.file`).
    pub fn start_tls(
        dir: &Path,
        targets: &[String],
        rules: &[PathBuf],
        serving: &ServingCert,
    ) -> Result<Prometheus> {
        Self::spawn(dir, targets, None, rules, Some(serving))
    }

    fn spawn(
        dir: &Path,
        targets: &[String],
        secure: Option<&SecureScrape>,
        rules: &[PathBuf],
        serving: Option<&ServingCert>,
    ) -> Result<Prometheus> {
        let binary = required_tool("prometheus");
        let port = free_port()?;
        let mut scrape = json!({
            "job_name": "maintenance-operator",
            "static_configs": [{ "targets": targets }],
        });
        if let Some(secure) = secure {
            let token_file = dir.join("scrape-token");
            std::fs::write(&token_file, &secure.token)?;
            scrape["scheme"] = json!("https");
            scrape["authorization"] = json!({ "credentials_file": token_file });
            scrape["tls_config"] = match &secure.verify {
                Some((ca, server_name)) => {
                    let ca_file = dir.join("scrape-ca.crt");
                    std::fs::write(&ca_file, ca)?;
                    json!({ "ca_file": ca_file, "server_name": server_name })
                }
                None => json!({ "insecure_skip_verify": true }),
            };
        }
        let config = json!({
            "global": { "scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s" },
            "rule_files": rules,
            "scrape_configs": [scrape],
        });
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, serde_norway::to_string(&config)?)?;
        let mut command = Command::new(binary);
        if let Some(serving) = serving {
            let (cert, key) = (dir.join("web-tls.crt"), dir.join("web-tls.key"));
            std::fs::write(&cert, &serving.cert_pem)?;
            std::fs::write(&key, &serving.key_pem)?;
            let web = json!({ "tls_server_config": { "cert_file": cert, "key_file": key } });
            let web_path = dir.join("web.yml");
            std::fs::write(&web_path, serde_norway::to_string(&web)?)?;
            command.arg(format!("--web.config.file={}", web_path.display()));
        }
        let process = Helper::spawn(
            "prometheus",
            command
                .arg(format!("--config.file={}", config_path.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}")),
            dir.join("prometheus.log"),
        )?;
        Ok(Prometheus {
            port,
            scheme: if serving.is_some() { "https" } else { "http" },
            process: Mutex::new(process),
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}://127.0.0.1:{}{path}", self.scheme, self.port)
    }

    /// Fails (with the end of its log) when Prometheus has exited.
    pub fn ensure_running(&self) -> Result<()> {
        self.process
            .lock()
            .map_err(|_| anyhow!("the prometheus process handle is poisoned"))?
            .ensure_running()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process
            .lock()
            .map(|p| p.log_tail(lines))
            .unwrap_or_default()
    }

    /// `GET /api/v1/<endpoint>`: the `data` of a successful answer.
    pub async fn api(&self, endpoint: &str) -> Result<Value> {
        let (status, body) = http_get(&self.url(&format!("/api/v1/{endpoint}"))).await?;
        let answer: Value = serde_json::from_str(&body)
            .with_context(|| format!("HTTP {status}, not JSON: {body:.300}"))?;
        if status != 200 || answer["status"] != "success" {
            bail!(
                "HTTP {status}: {} {}",
                answer["errorType"],
                answer["error"].as_str().unwrap_or(&body)
            );
        }
        Ok(answer["data"].clone())
    }

    /// An instant query: its samples as (labels, value).
    pub async fn query(&self, expr: &str) -> Result<Vec<(Value, f64)>> {
        let data = self
            .api(&format!("query?query={}", percent_encode(expr)))
            .await
            .with_context(|| format!("query {expr}"))?;
        let results = match data["resultType"].as_str() {
            Some("vector") => data["result"].as_array().cloned().unwrap_or_default(),
            Some("scalar") => vec![json!({ "metric": {}, "value": data["result"] })],
            other => bail!("query {expr}: unexpected result type {other:?}"),
        };
        Ok(results
            .into_iter()
            .map(|r| {
                let value = r["value"][1]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(f64::NAN);
                (r["metric"].clone(), value)
            })
            .collect())
    }

    /// The values of an instant query's samples, labels dropped.
    pub async fn values(&self, expr: &str) -> Result<Vec<f64>> {
        Ok(self
            .query(expr)
            .await?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
