//! Asks the alert gates (`admission.gates` of the config) their Prometheus queries, for the
//! supervisor's rounds. `maintenance_core::gates` decides what the answers mean; this only asks.
//!
//! A round never waits for Prometheus: each query runs in a task of its own (bounded by the
//! gate's `timeoutSeconds`), and the round uses the last answer of each gate. A slow Prometheus
//! would otherwise stall the supervisor, and with it every admission and Pending message, for
//! up to the timeout at every round. The price is one round on a gate not asked yet (just after
//! start or after the gate was added), which holds (fail closed) until the first answer, a
//! moment later; an answer that changes what a gate says brings a round at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use maintenance_core::gates::{self, GateObservation, GateProblem};
use maintenance_crds::Gate;

use crate::http_client::{Https, Trust, error_chain, https_client, read_secret, text_key};
use crate::metrics::Metrics;
use crate::task::AbortOnDrop;

/// The most of an answer read: a gate's query should return a few series, not a dump.
const MAX_ANSWER_BYTES: usize = 4 << 20;

/// Where a gate's query is sent and with what: the operator's client and namespace (for
/// `secretRef`), and the client for https without a gate's own CA.
#[derive(Clone)]
pub struct GateAsker {
    pub client: Option<kube::Client>,
    pub namespace: String,
    /// `None` when TLS could not be set up (every query then fails, saying so).
    http: Option<Https>,
}

impl GateAsker {
    pub fn new(client: Option<kube::Client>, namespace: String) -> GateAsker {
        let http = match https_client(Duration::from_secs(10), &Trust::default()) {
            Ok(http) => Some(http),
            Err(err) => {
                tracing::error!(%err, "cannot set up TLS for alert gates; every gate will hold");
                None
            }
        };
        GateAsker {
            client,
            namespace,
            http,
        }
    }

    /// Asks `gate` now, within its timeout: what it returned, or why it could not be asked.
    pub async fn ask(&self, gate: &Gate) -> GateObservation {
        let timeout = gate.timeout();
        let result = match tokio::time::timeout(timeout, self.query(gate)).await {
            Ok(result) => result,
            Err(_) => Err(GateProblem::TimedOut(timeout)),
        };
        GateObservation {
            gate: gate.name.clone(),
            url: gate.prometheus.url.clone(),
            at: jiff::Timestamp::now(),
            result,
        }
    }

    async fn query(&self, gate: &Gate) -> Result<Vec<gates::Series>, GateProblem> {
        let spec = &gate.prometheus;
        let mut token = None;
        let mut ca = None;
        if let Some(secret_ref) = &spec.secret_ref {
            let Some(client) = &self.client else {
                return Err(GateProblem::Secret(format!(
                    "secretRef {:?} needs the cluster, which is not at hand",
                    secret_ref.name
                )));
            };
            let keys = read_secret(client, &self.namespace, &secret_ref.name)
                .await
                .map_err(GateProblem::Secret)?;
            token = text_key(&keys, "token");
            ca = keys.get("ca.crt").cloned();
        }
        self.query_with(gate, token.as_deref(), ca.as_deref()).await
    }

    /// The query with the token and CA of the gate's Secret, read already.
    async fn query_with(
        &self,
        gate: &Gate,
        token: Option<&str>,
        ca: Option<&[u8]>,
    ) -> Result<Vec<gates::Series>, GateProblem> {
        let spec = &gate.prometheus;
        let skip_verify = spec.insecure_skip_tls_verify.unwrap_or(false);
        // The shared client, unless the gate trusts otherwise; a gate's own is built per query
        // (a few a minute at most), so that a rotated ca.crt applies at once.
        let own;
        let http = if ca.is_some() || skip_verify {
            own = https_client(
                gate.timeout(),
                &Trust {
                    extra_ca_pem: ca,
                    skip_verify,
                },
            )
            .map_err(|err| match ca {
                Some(_) => GateProblem::Secret(format!(
                    "Secret {}/{}: {err}",
                    self.namespace,
                    spec.secret_ref.as_ref().map_or("", |r| r.name.as_str())
                )),
                None => GateProblem::Setup(err),
            })?;
            &own
        } else {
            self.http.as_ref().ok_or_else(|| {
                GateProblem::Setup("TLS could not be set up (see the log at start)".into())
            })?
        };
        let uri: http::Uri = query_url(&spec.url, &spec.query)
            .parse()
            .map_err(|_| GateProblem::Setup("the URL does not parse; fix prometheus.url".into()))?;
        let mut request = http::Request::get(uri)
            .header(http::header::ACCEPT, "application/json")
            .header(
                http::header::USER_AGENT,
                concat!("maintenance-operator/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(token) = token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        // Neither the URL nor the token is quoted: either may be a secret.
        let request = request.body(Full::new(Bytes::new())).map_err(|_| {
            GateProblem::Setup("the URL or token is not valid in an HTTP request; fix it".into())
        })?;
        let response = http.request(request).await.map_err(|err| {
            let chain = error_chain(&err);
            // rustls' handshake errors: "invalid peer certificate: UnknownIssuer",
            // "received fatal alert: HandshakeFailure", ...
            if ["certificate", "TLS", "Handshake", "handshake"]
                .iter()
                .any(|word| chain.contains(word))
            {
                GateProblem::Tls(chain)
            } else {
                GateProblem::Unreachable(chain)
            }
        })?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|err| GateProblem::Unreachable(format!("reading the answer: {err}")))?
            .to_bytes();
        gates::parse_answer(status, &body)
    }
}

/// `<url>/api/v1/query?query=<query>`, the query percent-encoded.
fn query_url(base: &str, query: &str) -> String {
    let mut url = base.trim_end_matches('/').to_string();
    url.push_str("/api/v1/query?query=");
    for byte in query.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            url.push(char::from(byte));
        } else {
            url.push_str(&format!("%{byte:02X}"));
        }
    }
    url
}

/// The gates of the config as the supervisor last read them, their last answers, and the
/// queries under way.
pub struct GateChecker {
    asker: GateAsker,
    metrics: Arc<Metrics>,
    known: Arc<Mutex<Known>>,
    /// The query under way per gate, with the settings it asks with.
    asking: HashMap<String, (Gate, AbortOnDrop)>,
}

/// What the supervisor and the query tasks share.
#[derive(Default)]
struct Known {
    /// The gates of the config: an answer for anything else (a gate removed or changed while it
    /// was asked) is dropped, so that it neither comes back nor brings its metric series back.
    wanted: Vec<Gate>,
    /// Each gate's last observation.
    answers: HashMap<String, GateObservation>,
}

impl GateChecker {
    pub fn new(asker: GateAsker, metrics: Arc<Metrics>) -> GateChecker {
        GateChecker {
            asker,
            metrics,
            known: Arc::new(Mutex::new(Known::default())),
            asking: HashMap::new(),
        }
    }

    /// The last observation of each gate of `wanted` (a gate whose settings changed since counts
    /// as not asked), after starting a query for each whose answer is older than
    /// [`gates::REFRESH_AFTER`] and that is not being asked. `changed` is called when an answer
    /// changes what its gate says (it brings a round). Gates no longer wanted are forgotten,
    /// with their metric series, and their queries under way stopped.
    pub fn observe(
        &mut self,
        wanted: &[Gate],
        now: jiff::Timestamp,
        changed: impl Fn() + Clone + Send + 'static,
    ) -> Vec<GateObservation> {
        let Ok(mut known) = self.known.lock() else {
            return Vec::new();
        };
        if known.wanted != wanted {
            for gone in known
                .wanted
                .iter()
                .filter(|g| !wanted.iter().any(|w| w.name == g.name))
            {
                self.metrics.gates.forget(&gone.name);
            }
            known
                .answers
                .retain(|name, _| wanted.iter().any(|g| &g.name == name));
            // A changed gate's answer was to other settings: not asked yet.
            for gate in wanted {
                if !known.wanted.contains(gate) {
                    known.answers.remove(&gate.name);
                }
            }
            known.wanted = wanted.to_vec();
        }
        self.asking
            .retain(|_, (asked, task)| !task.0.is_finished() && wanted.contains(asked));
        let mut observations = Vec::with_capacity(wanted.len());
        for gate in wanted {
            let previous = known.answers.get(&gate.name);
            if gates::is_due(previous, now) && !self.asking.contains_key(&gate.name) {
                let task = tokio::spawn(ask_and_record(
                    self.asker.clone(),
                    gate.clone(),
                    self.known.clone(),
                    self.metrics.clone(),
                    changed.clone(),
                ));
                self.asking
                    .insert(gate.name.clone(), (gate.clone(), AbortOnDrop(task)));
            }
            if let Some(observation) = previous {
                observations.push(observation.clone());
            }
        }
        observations
    }
}

async fn ask_and_record(
    asker: GateAsker,
    gate: Gate,
    known: Arc<Mutex<Known>>,
    metrics: Arc<Metrics>,
    changed: impl Fn(),
) {
    let observation = asker.ask(&gate).await;
    let is_new = {
        let Ok(mut known) = known.lock() else {
            return;
        };
        if !known.wanted.contains(&gate) {
            return;
        }
        match &observation.result {
            Ok(series) if series.is_empty() => {
                tracing::debug!(gate = %gate.name, "alert gate open");
            }
            Ok(series) => {
                tracing::debug!(gate = %gate.name, series = series.len(), "alert gate holds");
            }
            Err(problem) => {
                tracing::warn!(gate = %gate.name, url = %gate.prometheus.url, %problem, "alert gate cannot be asked; it holds admissions");
                metrics.gates.failed(&gate.name);
            }
        }
        metrics.gates.set_open(&gate.name, observation.is_open());
        let is_new = known
            .answers
            .get(&gate.name)
            .is_none_or(|before| before.result != observation.result);
        known.answers.insert(gate.name.clone(), observation);
        is_new
    };
    if is_new {
        changed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use maintenance_crds::PrometheusGate;
    use std::io::{Read, Write};

    fn gate(url: &str) -> Gate {
        Gate {
            name: "node-alerts".into(),
            prometheus: PrometheusGate {
                url: url.into(),
                query: "ALERTS{alertstate=\"firing\"}".into(),
                ..PrometheusGate::default()
            },
            timeout_seconds: Some(2),
        }
    }

    /// A one-shot HTTP server: answers `body` to the first request and hands back what it got.
    fn answer_once(body: &'static str) -> (String, std::thread::JoinHandle<String>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        let served = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("a connection");
            let mut got = vec![0; 4096];
            let n = stream.read(&mut got).expect("a request");
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            stream.write_all(answer.as_bytes()).expect("an answer");
            String::from_utf8_lossy(&got[..n]).into_owned()
        });
        (url, served)
    }

    #[tokio::test]
    async fn the_token_is_sent_as_a_bearer_and_the_series_read() {
        let (url, served) = answer_once(
            r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"alertname":"X"},"value":[1,"1"]}]}}"#,
        );
        let asker = GateAsker::new(None, "ops".into());
        let series = asker
            .query_with(&gate(&url), Some("s3cret"), None)
            .await
            .expect("an answer");
        assert_eq!(series.len(), 1);
        let request = served.join().expect("served");
        assert!(
            request.starts_with("GET /api/v1/query?query=ALERTS%7Balertstate%3D%22firing%22%7D "),
            "{request}"
        );
        assert!(
            request
                .to_ascii_lowercase()
                .contains("authorization: bearer s3cret\r\n"),
            "{request}"
        );
    }

    /// The checker asks in the background, brings a round when an answer is new, and forgets
    /// a removed gate with its series.
    #[tokio::test]
    async fn the_checker_records_answers_and_forgets_removed_gates() {
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let mut checker = GateChecker::new(GateAsker::new(None, "ops".into()), metrics.clone());
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let gates = [gate(&format!(
            "http://{}",
            closed.local_addr().expect("an address")
        ))];
        drop(closed);
        let rounds = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let round = {
            let rounds = rounds.clone();
            move || {
                rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        };
        let now = jiff::Timestamp::now();
        assert!(
            checker.observe(&gates, now, round.clone()).is_empty(),
            "not asked yet"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let observed = loop {
            let observed = checker.observe(&gates, now, round.clone());
            if !observed.is_empty() || std::time::Instant::now() > deadline {
                break observed;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            matches!(&observed[..], [o] if matches!(o.result, Err(GateProblem::Unreachable(_)))),
            "{observed:?}"
        );
        assert_eq!(
            rounds.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "one new answer, one round"
        );
        assert!(
            metrics
                .render()
                .contains("maintenance_operator_gate_open{gate=\"node-alerts\"} 0")
        );
        // Asked again only once the answer is REFRESH_AFTER old.
        assert!(
            checker.asking.is_empty() || checker.asking.values().all(|(_, t)| t.0.is_finished())
        );
        checker.observe(&gates, now, round.clone());
        assert!(
            checker.asking.is_empty(),
            "a fresh answer is not asked again"
        );
        let later = jiff::Timestamp::now() + gates::REFRESH_AFTER + Duration::from_millis(100);
        checker.observe(&gates, later, round.clone());
        assert_eq!(checker.asking.len(), 1, "an old answer is asked again");
        assert!(checker.observe(&[], now, round).is_empty());
        assert!(
            checker.asking.is_empty(),
            "a removed gate's query is stopped"
        );
        assert!(
            !metrics.render().contains("node-alerts"),
            "and its series gone"
        );
    }

    #[tokio::test]
    async fn a_gate_that_cannot_be_asked_says_why() {
        let asker = GateAsker::new(None, "ops".into());
        // A port nothing listens on: bound, then closed.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let url = format!("http://{}", closed.local_addr().expect("an address"));
        drop(closed);
        let observation = asker.ask(&gate(&url)).await;
        assert!(
            matches!(&observation.result, Err(GateProblem::Unreachable(e)) if e.contains("onnection refused")),
            "{observation:?}"
        );
        // A Prometheus that takes the connection and never answers: timed out, after
        // timeoutSeconds.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
        let mut slow = gate(&format!(
            "http://{}",
            silent.local_addr().expect("an address")
        ));
        slow.timeout_seconds = Some(1);
        let started = std::time::Instant::now();
        let observation = asker.ask(&slow).await;
        assert_eq!(
            observation.result,
            Err(GateProblem::TimedOut(Duration::from_secs(1)))
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        drop(silent);
        // A bad ca.crt is the Secret's problem, named.
        let bad_ca = asker
            .query_with(
                &gate("https://prometheus.example"),
                None,
                Some(b"not a cert"),
            )
            .await;
        assert!(
            matches!(&bad_ca, Err(GateProblem::Secret(e)) if e.contains("ca.crt holds no PEM certificate")),
            "{bad_ca:?}"
        );
        // A secretRef without the cluster at hand (as in a unit test) is refused, not skipped.
        let mut with_secret = gate(&url);
        with_secret.prometheus.secret_ref = Some(maintenance_crds::SecretRef {
            name: "prometheus-token".into(),
        });
        assert!(matches!(
            asker.ask(&with_secret).await.result,
            Err(GateProblem::Secret(_))
        ));
        // insecureSkipTLSVerify builds a client of its own.
        assert!(
            https_client(
                Duration::from_secs(1),
                &Trust {
                    extra_ca_pem: None,
                    skip_verify: true
                }
            )
            .is_ok()
        );
    }

    #[test]
    fn the_query_is_percent_encoded_after_the_base_url() {
        assert_eq!(
            query_url("http://prometheus:9090/", "ALERTS{alertname=\"X\"} > 0"),
            "http://prometheus:9090/api/v1/query?query=ALERTS%7Balertname%3D%22X%22%7D%20%3E%200"
        );
        assert_eq!(
            query_url("https://thanos.example/prom", "up"),
            "https://thanos.example/prom/api/v1/query?query=up"
        );
    }
}
