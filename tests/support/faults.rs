//! Fault injectors between the operator and a testbed's API server, and outages of the control
//! plane itself:
//!
//! - [`Toxiproxy`]: TCP-level faults (latency, bandwidth, resets, black holes) from toxiproxy,
//!   built by `testbed build`; the operator's kubeconfig points at a proxy port and TLS passes
//!   through untouched.
//! - [`FaultProxy`]: HTTP-level faults (500, 429 with Retry-After, watches cut) from
//!   `tests/testbed/faultproxy`, which terminates TLS with a certificate of the testbed's CA and
//!   forwards with the operator's own credentials, so the audit log still names the operator.
//! - [`stop_component`] / [`start_component`]: etcd or kube-apiserver down and up again.
//!
//! Both proxies are driven through their HTTP control APIs on loopback, and stop with the test
//! (dropped, or killed when this process exits).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::{Deserialize, Serialize};

use super::operator::{Helper, free_port, http_call};
use super::{Check, Testbed, testbed_script, wait_until};

/// A binary that `testbed build` puts in its bin directory. Missing: the test fails, loudly.
pub fn testbed_binary(name: &str) -> Result<PathBuf> {
    let out = Command::new(testbed_script())
        .arg("bin-dir")
        .output()
        .context("running `testbed bin-dir`")?;
    if !out.status.success() {
        bail!(
            "`testbed bin-dir` failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join(name);
    if !path.is_file() {
        bail!(
            "{} is missing: run `tests/testbed/testbed build` (it builds the fault injectors too)",
            path.display()
        );
    }
    Ok(path)
}

async fn call_ok(method: &str, url: &str, body: Option<&str>) -> Result<String> {
    let (code, text) = http_call(method, url, body).await?;
    if !(200..300).contains(&code) {
        bail!("{method} {url} answered {code}: {}", text.trim());
    }
    Ok(text)
}

/// Copies kubeconfig `source` to `dest` with every cluster's server at `https://127.0.0.1:port`;
/// credentials and CA stay as they are.
pub fn kubeconfig_via(source: &Path, dest: &Path, port: u16) -> Result<()> {
    let text =
        std::fs::read_to_string(source).with_context(|| format!("reading {}", source.display()))?;
    let mut config: serde_json::Value = serde_norway::from_str(&text)
        .with_context(|| format!("parsing kubeconfig {}", source.display()))?;
    let clusters = config
        .get_mut("clusters")
        .and_then(|c| c.as_array_mut())
        .with_context(|| format!("kubeconfig {} has no clusters", source.display()))?;
    for cluster in clusters {
        let Some(inner) = cluster.get_mut("cluster").and_then(|c| c.as_object_mut()) else {
            bail!(
                "a cluster of kubeconfig {} has no `cluster`",
                source.display()
            );
        };
        inner.insert(
            "server".into(),
            serde_json::Value::String(format!("https://127.0.0.1:{port}")),
        );
    }
    std::fs::write(dest, serde_norway::to_string(&config)?)
        .with_context(|| format!("writing {}", dest.display()))?;
    Ok(())
}

/// The port of the testbed's API server (from `DIR/ports`).
pub fn api_server_port(testbed: &Testbed) -> Result<u16> {
    let path = testbed.dir().join("ports");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("kube-apiserver="))
        .and_then(|p| p.trim().parse().ok())
        .with_context(|| format!("{} names no kube-apiserver port", path.display()))
}

// ---------------------------------------------------------------------------------------------
// toxiproxy

/// A toxiproxy server for one testbed.
pub struct Toxiproxy {
    helper: Helper,
    api: String,
}

/// Which way the bytes a toxic acts on flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// From the operator to the API server.
    Upstream,
    /// From the API server to the operator (answers, watch events).
    Downstream,
}

impl Stream {
    fn as_str(self) -> &'static str {
        match self {
            Stream::Upstream => "upstream",
            Stream::Downstream => "downstream",
        }
    }
}

/// The toxics the scenarios use (toxiproxy's names and attributes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToxicKind {
    /// Every chunk of data waits this long (plus or minus the jitter).
    Latency { latency_ms: u64, jitter_ms: u64 },
    /// At most this many KB per second.
    Bandwidth { rate_kb_per_s: u64 },
    /// A connection that carries data is reset (TCP RST) this long later; the data that
    /// triggered it never arrives. Meant to be put on and taken off again.
    ResetPeer { after_ms: u64 },
    /// Nothing gets through; the connection is closed after this long (0: held open until the
    /// toxic is removed), as a network partition.
    Timeout { after_ms: u64 },
}

impl ToxicKind {
    fn type_and_attributes(self) -> (&'static str, serde_json::Value) {
        use serde_json::json;
        match self {
            ToxicKind::Latency {
                latency_ms,
                jitter_ms,
            } => (
                "latency",
                json!({"latency": latency_ms, "jitter": jitter_ms}),
            ),
            ToxicKind::Bandwidth { rate_kb_per_s } => ("bandwidth", json!({"rate": rate_kb_per_s})),
            ToxicKind::ResetPeer { after_ms } => ("reset_peer", json!({"timeout": after_ms})),
            ToxicKind::Timeout { after_ms } => ("timeout", json!({"timeout": after_ms})),
        }
    }
}

/// One toxic on a proxy, on every connection (toxicity 1).
#[derive(Clone, Debug)]
pub struct Toxic {
    pub name: String,
    pub kind: ToxicKind,
    pub stream: Stream,
}

impl Toxic {
    pub fn new(name: &str, kind: ToxicKind, stream: Stream) -> Toxic {
        Toxic {
            name: name.to_string(),
            kind,
            stream,
        }
    }
}

impl Toxiproxy {
    /// Starts `toxiproxy-server` on a free loopback port (log in the testbed's `logs/`) and waits
    /// until its API answers.
    pub async fn start(testbed: &Testbed) -> Result<Toxiproxy> {
        let binary = testbed_binary("toxiproxy-server")?;
        let mut last_error = None;
        // The port is free when picked; another process may take it before the server binds.
        for _ in 0..3 {
            let port = free_port()?;
            let log = testbed
                .dir()
                .join("logs")
                .join(format!("toxiproxy-{port}.log"));
            let mut helper = Helper::spawn(
                "toxiproxy-server",
                Command::new(&binary).args(["-host", "127.0.0.1", "-port", &port.to_string()]),
                log,
            )?;
            let api = format!("http://127.0.0.1:{port}");
            let ready = wait_until("toxiproxy's API", Duration::from_secs(20), || {
                let running = helper.ensure_running();
                let url = format!("{api}/version");
                async move {
                    running?;
                    Ok(match http_call("GET", &url, None).await {
                        Ok((200, _)) => Check::Done(()),
                        other => Check::Pending(format!("{other:?}")),
                    })
                }
            })
            .await;
            match ready {
                Ok(()) => return Ok(Toxiproxy { helper, api }),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("toxiproxy did not start")))
    }

    /// A proxy named `name` from a free loopback port to the testbed's API server.
    pub async fn proxy_to_api_server(
        &mut self,
        testbed: &Testbed,
        name: &str,
    ) -> Result<ToxicProxy> {
        self.helper.ensure_running()?;
        let upstream = format!("127.0.0.1:{}", api_server_port(testbed)?);
        let body = serde_json::json!({
            "name": name,
            "listen": "127.0.0.1:0",
            "upstream": upstream,
            "enabled": true,
        });
        let text = call_ok(
            "POST",
            &format!("{}/proxies", self.api),
            Some(&body.to_string()),
        )
        .await
        .with_context(|| format!("creating toxiproxy proxy {name} to {upstream}"))?;
        let created: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("toxiproxy's answer for proxy {name} is no JSON: {text}"))?;
        let port = created
            .get("listen")
            .and_then(|l| l.as_str())
            .and_then(|l| l.rsplit_once(':'))
            .and_then(|(_, p)| p.parse().ok())
            .with_context(|| format!("toxiproxy's answer for proxy {name} has no port: {text}"))?;
        Ok(ToxicProxy {
            api: self.api.clone(),
            name: name.to_string(),
            port,
        })
    }
}

/// One toxiproxy proxy in front of the API server.
pub struct ToxicProxy {
    api: String,
    name: String,
    pub port: u16,
}

impl ToxicProxy {
    /// Writes to `dest` a copy of kubeconfig `source` that reaches the API server through this
    /// proxy (the API server's certificate names 127.0.0.1, so TLS verifies as before).
    pub fn write_kubeconfig(&self, source: &Path, dest: &Path) -> Result<()> {
        kubeconfig_via(source, dest, self.port)
    }

    pub async fn add(&self, toxic: &Toxic) -> Result<()> {
        let (kind, attributes) = toxic.kind.type_and_attributes();
        let body = serde_json::json!({
            "name": toxic.name,
            "type": kind,
            "stream": toxic.stream.as_str(),
            "toxicity": 1.0,
            "attributes": attributes,
        });
        call_ok(
            "POST",
            &format!("{}/proxies/{}/toxics", self.api, self.name),
            Some(&body.to_string()),
        )
        .await
        .with_context(|| format!("adding toxic {toxic:?} to proxy {}", self.name))?;
        Ok(())
    }

    pub async fn remove(&self, toxic: &str) -> Result<()> {
        call_ok(
            "DELETE",
            &format!("{}/proxies/{}/toxics/{toxic}", self.api, self.name),
            None,
        )
        .await
        .with_context(|| format!("removing toxic {toxic} from proxy {}", self.name))?;
        Ok(())
    }

    /// The names of the toxics in force.
    pub async fn toxics(&self) -> Result<Vec<String>> {
        let text = call_ok(
            "GET",
            &format!("{}/proxies/{}/toxics", self.api, self.name),
            None,
        )
        .await?;
        let toxics: Vec<serde_json::Value> = serde_json::from_str(&text)
            .with_context(|| format!("toxiproxy's list of toxics is no JSON array: {text}"))?;
        Ok(toxics
            .iter()
            .filter_map(|t| t.get("name").and_then(|n| n.as_str()).map(str::to_string))
            .collect())
    }

    pub async fn remove_all(&self) -> Result<()> {
        for toxic in self.toxics().await? {
            self.remove(&toxic).await?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// faultproxy

/// HTTP-level faults of [`FaultProxy`] (its control API's JSON).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpFaults {
    /// Fraction of non-watch requests answered with one of `codes`.
    pub error_rate: f64,
    /// 500 and/or 429, picked at random.
    pub codes: Vec<u16>,
    /// Retry-After of a 429.
    pub retry_after_seconds: u32,
    /// Fraction of the 500s given after the API server did the work (the answer is lost).
    pub lost_answer_share: f64,
    /// Errors (and `request_delay_ms`) only for requests of this method (empty: any) ...
    pub only_method: String,
    /// ... whose path matches this regular expression (empty: any): one kind of write fails,
    /// the rest go through.
    pub only_path_matching: String,
    /// Hold every non-watch request that `only_method` and `only_path_matching` select this
    /// long before forwarding it (0: at once): one kind of write is slow.
    pub request_delay_ms: u64,
    /// Cut every open watch this often (0: never).
    pub cut_watches_every_ms: u64,
    /// Every event of a watch opened from then on reaches the client this much later (0: at
    /// once): the client's cache lags behind the API server.
    pub watch_delay_ms: u64,
    /// Hold every paged LIST (the watchers' first lists) this long before forwarding it.
    pub list_delay_ms: u64,
}

/// What the proxy saw and did since it started.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultStats {
    pub requests: u64,
    pub watches: u64,
    pub open_watches: u64,
    /// Injected answers by status code.
    pub injected: BTreeMap<String, u64>,
    pub lost_answers: u64,
    pub watches_cut: u64,
    pub delayed_lists: u64,
}

impl FaultStats {
    pub fn injected(&self, code: u16) -> u64 {
        self.injected
            .get(&code.to_string())
            .copied()
            .unwrap_or_default()
    }
}

/// `tests/testbed/faultproxy` in front of the testbed's API server.
pub struct FaultProxy {
    helper: Helper,
    control: String,
    pub port: u16,
}

impl FaultProxy {
    /// Starts the proxy with the credentials and server of `upstream_kubeconfig` (give it the
    /// operator's own, so the API server sees the operator), serving a certificate of the
    /// testbed's CA.
    pub async fn start(testbed: &Testbed, upstream_kubeconfig: &Path) -> Result<FaultProxy> {
        let binary = testbed_binary("faultproxy")?;
        let pki = testbed.dir().join("pki");
        let tag = super::unique_name("faultproxy");
        let addr_file = testbed.dir().join(format!("{tag}.addr"));
        let mut helper = Helper::spawn(
            "faultproxy",
            Command::new(&binary)
                .arg("--kubeconfig")
                .arg(upstream_kubeconfig)
                .arg("--ca-cert")
                .arg(pki.join("ca.crt"))
                .arg("--ca-key")
                .arg(pki.join("ca.key"))
                .arg("--addr-file")
                .arg(&addr_file),
            testbed.dir().join("logs").join(format!("{tag}.log")),
        )?;
        let (port, control) = wait_until("faultproxy to listen", Duration::from_secs(20), || {
            let running = helper.ensure_running();
            let addr_file = addr_file.clone();
            async move {
                running?;
                let Ok(text) = std::fs::read_to_string(&addr_file) else {
                    return Ok(Check::Pending(format!("no {} yet", addr_file.display())));
                };
                let port_of = |key: &str| {
                    text.lines()
                        .find_map(|l| l.strip_prefix(key))
                        .and_then(|p| p.trim().parse::<u16>().ok())
                };
                Ok(match (port_of("proxy="), port_of("control=")) {
                    (Some(p), Some(c)) => Check::Done((p, c)),
                    _ => Check::Pending(format!("{} holds {text:?}", addr_file.display())),
                })
            }
        })
        .await?;
        Ok(FaultProxy {
            helper,
            control: format!("http://127.0.0.1:{control}"),
            port,
        })
    }

    /// Writes to `dest` a copy of kubeconfig `source` that reaches the API server through this
    /// proxy (its certificate is of the testbed's CA, for 127.0.0.1).
    pub fn write_kubeconfig(&self, source: &Path, dest: &Path) -> Result<()> {
        kubeconfig_via(source, dest, self.port)
    }

    pub async fn set(&mut self, faults: &HttpFaults) -> Result<()> {
        self.helper.ensure_running()?;
        let body = serde_json::to_string(faults)?;
        let text = call_ok("PUT", &format!("{}/faults", self.control), Some(&body))
            .await
            .context("setting the faultproxy's faults")?;
        let now: HttpFaults = serde_json::from_str(&text)
            .with_context(|| format!("faultproxy answered {text:?} to PUT /faults"))?;
        if &now != faults {
            bail!("faultproxy took faults {now:?}, not {faults:?}");
        }
        Ok(())
    }

    pub async fn clear(&mut self) -> Result<()> {
        self.set(&HttpFaults::default()).await
    }

    /// Cuts every open watch now; returns how many.
    pub async fn cut_watches(&mut self) -> Result<u64> {
        self.helper.ensure_running()?;
        let text = call_ok("POST", &format!("{}/cut-watches", self.control), None).await?;
        let answer: BTreeMap<String, u64> = serde_json::from_str(&text)
            .with_context(|| format!("faultproxy answered {text:?} to POST /cut-watches"))?;
        Ok(answer.get("cut").copied().unwrap_or_default())
    }

    pub async fn stats(&mut self) -> Result<FaultStats> {
        self.helper.ensure_running()?;
        let text = call_ok("GET", &format!("{}/stats", self.control), None).await?;
        serde_json::from_str(&text)
            .with_context(|| format!("faultproxy answered {text:?} to GET /stats"))
    }
}

// ---------------------------------------------------------------------------------------------
// Control-plane outages

/// The components `testbed stop-component` / `start-component` handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Etcd,
    KubeApiServer,
}

impl Component {
    pub fn name(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::KubeApiServer => "kube-apiserver",
        }
    }
}

/// Stops `component` of the testbed: TERM, then KILL after `grace`.
pub async fn stop_component(
    testbed: &Testbed,
    component: Component,
    grace: Duration,
) -> Result<()> {
    let dir = testbed.dir().to_string_lossy().into_owned();
    let grace = grace.as_secs().to_string();
    crate::run_testbed(&[
        "stop-component",
        "--dir",
        &dir,
        "--grace",
        &grace,
        component.name(),
    ])
    .await?;
    Ok(())
}

/// Starts `component` again with its arguments, ports and data; returns once it is healthy.
pub async fn start_component(testbed: &Testbed, component: Component) -> Result<()> {
    let dir = testbed.dir().to_string_lossy().into_owned();
    crate::run_testbed(&["start-component", "--dir", &dir, component.name()]).await?;
    Ok(())
}
