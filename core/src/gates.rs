//! Alert gates (`admission.gates`): while the Prometheus query of a gate returns anything (an
//! alert firing), nothing new is admitted; work already admitted goes on. A gate that cannot be
//! asked (Prometheus unreachable, an error answer, a timeout, a Secret missing) holds too: fail
//! closed, as an alert nobody can see may well be firing.
//!
//! The shell queries each gate and records a [`GateObservation`]; this decides what they mean.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use jiff::Timestamp;
use maintenance_crds::Gate;

/// Series shown in a message; the rest are counted.
pub const SHOWN_SERIES: usize = 3;
/// How old a gate's last answer may be before the shell asks again (at the next round, or at the
/// poll while requests are Pending): a Prometheus is asked at most this often per gate. Shorter
/// than [`POLL_WHILE_PENDING`], so that each poll asks again.
pub const REFRESH_AFTER: Duration = Duration::from_secs(3);
/// While requests are Pending and gates are set, a round runs this often, so that a gate that
/// stops firing admits soon.
pub const POLL_WHILE_PENDING: Duration = Duration::from_secs(5);

/// One series of a query's answer: its metric name (if any) and labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
}

impl fmt::Display for Series {
    /// PromQL's notation: `ALERTS{alertname="KubeNodeNotReady",node="n1"}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(name) = self.labels.get("__name__") {
            f.write_str(name)?;
        }
        f.write_str("{")?;
        let mut first = true;
        for (key, value) in self.labels.iter().filter(|(k, _)| *k != "__name__") {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{key}={value:?}")?;
        }
        f.write_str("}")
    }
}

/// Why a gate could not be asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateProblem {
    /// No connection, or it broke (the error chain).
    Unreachable(String),
    /// The TLS handshake failed: most often a certificate that no trusted CA signed.
    Tls(String),
    /// No answer within the gate's `timeoutSeconds`.
    TimedOut(Duration),
    /// An HTTP status other than 200, with the start of the body (Prometheus says what is wrong).
    Status { status: u16, body: String },
    /// A 200 that is not a Prometheus query answer, or an answer of status "error".
    BadAnswer(String),
    /// The query answered a scalar or a string: a gate needs an instant vector.
    NotAVector(String),
    /// Its `secretRef` could not be used (missing, unreadable, a bad `ca.crt`).
    Secret(String),
    /// The URL or TLS settings cannot make a request.
    Setup(String),
}

impl fmt::Display for GateProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateProblem::Unreachable(err) => write!(f, "unreachable: {err}"),
            GateProblem::Tls(err) => write!(
                f,
                "TLS failed: {err}: put the CA that signed Prometheus' certificate in the key ca.crt of the gate's secretRef"
            ),
            GateProblem::TimedOut(after) => {
                write!(
                    f,
                    "no answer within {} s (timeoutSeconds)",
                    after.as_secs_f64()
                )
            }
            GateProblem::Status { status, body } => {
                write!(f, "answered HTTP {status}")?;
                if !body.is_empty() {
                    write!(f, ": {body}")?;
                }
                Ok(())
            }
            GateProblem::BadAnswer(what) => {
                write!(f, "answered something else than a query result: {what}")
            }
            GateProblem::NotAVector(kind) => write!(
                f,
                "the query returns a {kind}, not an instant vector: write a query that returns series, like ALERTS{{alertstate=\"firing\"}}"
            ),
            GateProblem::Secret(what) => f.write_str(what),
            GateProblem::Setup(what) => f.write_str(what),
        }
    }
}

/// What the shell learnt of one gate, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateObservation {
    /// The gate's name.
    pub gate: String,
    /// The URL asked (named in a failure, so that a person can try it).
    pub url: String,
    pub at: Timestamp,
    /// The series the query returned (empty: the gate is open), or why there is no answer.
    pub result: Result<Vec<Series>, GateProblem>,
}

impl GateObservation {
    /// Open: the query answered and returned nothing.
    pub fn is_open(&self) -> bool {
        matches!(&self.result, Ok(series) if series.is_empty())
    }
}

/// Why a gate holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateVerdict {
    /// Its query returned these series.
    Firing(Vec<Series>),
    /// It could not be asked.
    Failed { url: String, problem: GateProblem },
    /// Not asked yet (the operator has just started, or the gate was just added).
    NotObserved,
}

/// The gate that holds every admission this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateHold {
    pub gate: String,
    pub verdict: GateVerdict,
    /// Other gates that hold too, by name.
    pub also: Vec<String>,
}

impl GateHold {
    /// For a request's Pending message and `plan`.
    pub fn describe(&self) -> String {
        let mut text = format!("alert gate {:?} holds every admission: ", self.gate);
        match &self.verdict {
            GateVerdict::Firing(series) => {
                let shown: Vec<String> = series
                    .iter()
                    .take(SHOWN_SERIES)
                    .map(ToString::to_string)
                    .collect();
                text.push_str(&format!(
                    "its query returned {} series: {}",
                    series.len(),
                    shown.join(", ")
                ));
                if series.len() > SHOWN_SERIES {
                    text.push_str(&format!(" and {} more", series.len() - SHOWN_SERIES));
                }
            }
            GateVerdict::Failed { url, problem } => {
                text.push_str(&format!(
                    "Prometheus at {url} could not be asked ({problem}); a gate that cannot be \
                     asked holds (fail closed), and it is asked again at the next round"
                ));
            }
            GateVerdict::NotObserved => {
                text.push_str("not asked yet; it is asked before the next round");
            }
        }
        if !self.also.is_empty() {
            text.push_str(&format!(
                " (also holding: {})",
                self.also
                    .iter()
                    .map(|name| format!("{name:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        text
    }
}

/// What one gate says, given its last observation (matched by name).
fn verdict(gate: &Gate, observations: &[GateObservation]) -> Option<GateVerdict> {
    let Some(observation) = observations.iter().find(|o| o.gate == gate.name) else {
        return Some(GateVerdict::NotObserved);
    };
    match &observation.result {
        Ok(series) if series.is_empty() => None,
        Ok(series) => Some(GateVerdict::Firing(series.clone())),
        Err(problem) => Some(GateVerdict::Failed {
            url: observation.url.clone(),
            problem: problem.clone(),
        }),
    }
}

/// The hold of the config's gates, in their order, over what was observed; `None`: every gate
/// is open. The first holding gate is named with its verdict, the others by name.
pub fn hold(gates: &[Gate], observations: &[GateObservation]) -> Option<GateHold> {
    let mut holding = gates
        .iter()
        .filter_map(|gate| verdict(gate, observations).map(|v| (gate.name.clone(), v)));
    let (gate, verdict) = holding.next()?;
    Some(GateHold {
        gate,
        verdict,
        also: holding.map(|(name, _)| name).collect(),
    })
}

/// Whether a gate's last observation is too old to use for a round at `now` (or missing).
pub fn is_due(last: Option<&GateObservation>, now: Timestamp) -> bool {
    last.is_none_or(|o| now.duration_since(o.at).unsigned_abs().ge(&REFRESH_AFTER))
}

/// The most of an error body quoted in a message.
const BODY_QUOTED: usize = 200;

/// Reads the answer of `GET /api/v1/query`: the series of an instant vector (or range vector), or
/// what is wrong with it.
pub fn parse_answer(status: u16, body: &[u8]) -> Result<Vec<Series>, GateProblem> {
    #[derive(serde::Deserialize)]
    struct Answer {
        status: String,
        #[serde(default)]
        data: Option<Data>,
        #[serde(default)]
        error: Option<String>,
        #[serde(default, rename = "errorType")]
        error_type: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Data {
        #[serde(rename = "resultType")]
        result_type: String,
        result: serde_json::Value,
    }
    #[derive(serde::Deserialize)]
    struct Sample {
        #[serde(default)]
        metric: BTreeMap<String, String>,
    }
    let answer: Result<Answer, _> = serde_json::from_slice(body);
    let answer = match (status, answer) {
        (_, Ok(answer)) if answer.status == "error" => {
            return Err(GateProblem::Status {
                status,
                body: format!(
                    "{}: {}",
                    answer.error_type.unwrap_or_default(),
                    answer.error.unwrap_or_default()
                ),
            });
        }
        (200, Ok(answer)) => answer,
        (200, Err(err)) => return Err(GateProblem::BadAnswer(err.to_string())),
        (status, _) => {
            let text = String::from_utf8_lossy(body);
            let mut body: String = text.trim().chars().take(BODY_QUOTED).collect();
            if text.trim().chars().count() > BODY_QUOTED {
                body.push_str("...");
            }
            return Err(GateProblem::Status { status, body });
        }
    };
    let Some(data) = answer.data else {
        return Err(GateProblem::BadAnswer(format!(
            "status {:?} without data",
            answer.status
        )));
    };
    match data.result_type.as_str() {
        "vector" | "matrix" => {
            let samples: Vec<Sample> = serde_json::from_value(data.result)
                .map_err(|err| GateProblem::BadAnswer(err.to_string()))?;
            Ok(samples
                .into_iter()
                .map(|s| Series { labels: s.metric })
                .collect())
        }
        other => Err(GateProblem::NotAVector(other.to_string())),
    }
}

/// A problem of the config's gates that the schema cannot see, naming the field.
pub fn config_problems(gates: &[Gate]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (index, gate) in gates.iter().enumerate() {
        let field = format!("admission.gates[{index}]");
        if gate.name.trim().is_empty() {
            problems.push(format!(
                "{field}.name is empty: name the gate, like \"node-alerts\""
            ));
        } else if !names.insert(gate.name.as_str()) {
            problems.push(format!(
                "{field}.name {:?} is used by two gates: give each a name of its own",
                gate.name
            ));
        }
        let url = gate.prometheus.url.as_str();
        let host = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default());
        if host.is_none_or(str::is_empty) {
            problems.push(format!(
                "{field}.prometheus.url {url:?} is not an http:// or https:// URL with a host, \
                 like \"http://prometheus.monitoring:9090\""
            ));
        }
        if gate.prometheus.query.trim().is_empty() {
            problems.push(format!(
                "{field}.prometheus.query is empty: write a PromQL query, like \
                 ALERTS{{alertstate=\"firing\"}}"
            ));
        }
    }
    if gates.len() > maintenance_crds::MAX_GATES {
        problems.push(format!(
            "admission.gates has {} gates, at most {} are allowed",
            gates.len(),
            maintenance_crds::MAX_GATES
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use maintenance_crds::PrometheusGate;

    fn gate(name: &str) -> Gate {
        Gate {
            name: name.into(),
            prometheus: PrometheusGate {
                url: "http://prometheus:9090".into(),
                query: "ALERTS{alertstate=\"firing\"}".into(),
                ..PrometheusGate::default()
            },
            timeout_seconds: None,
        }
    }

    fn series(alert: &str, node: &str) -> Series {
        Series {
            labels: [("__name__", "ALERTS"), ("alertname", alert), ("node", node)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn observed(name: &str, result: Result<Vec<Series>, GateProblem>) -> GateObservation {
        GateObservation {
            gate: name.into(),
            url: "http://prometheus:9090".into(),
            at: Timestamp::UNIX_EPOCH,
            result,
        }
    }

    #[test]
    fn the_first_holding_gate_is_named_and_the_others_counted() {
        let gates = [gate("a"), gate("b"), gate("c")];
        let firing = |n| {
            Ok((0..n)
                .map(|i| series("KubeNodeNotReady", &format!("n{i}")))
                .collect())
        };
        let unreachable = Err(GateProblem::Unreachable("connection refused".into()));
        // (observations, holding gate, its verdict's message part, also)
        type Expected<'a> = Option<(&'a str, &'a str, Vec<&'a str>)>;
        let table: Vec<(Vec<GateObservation>, Expected)> = vec![
            (
                vec![
                    observed("a", Ok(vec![])),
                    observed("b", Ok(vec![])),
                    observed("c", Ok(vec![])),
                ],
                None,
            ),
            (
                vec![
                    observed("a", Ok(vec![])),
                    observed("b", firing(2)),
                    observed("c", Ok(vec![])),
                ],
                Some((
                    "b",
                    "its query returned 2 series: ALERTS{alertname=\"KubeNodeNotReady\",node=\"n0\"}, ALERTS{alertname=\"KubeNodeNotReady\",node=\"n1\"}",
                    vec![],
                )),
            ),
            (
                vec![
                    observed("a", Ok(vec![])),
                    observed("b", firing(5)),
                    observed("c", unreachable.clone()),
                ],
                Some(("b", "node=\"n2\"} and 2 more", vec!["c"])),
            ),
            (
                vec![
                    observed("a", unreachable),
                    observed("b", Ok(vec![])),
                    observed("c", Ok(vec![])),
                ],
                Some((
                    "a",
                    "Prometheus at http://prometheus:9090 could not be asked (unreachable: connection refused); a gate that cannot be asked holds (fail closed)",
                    vec![],
                )),
            ),
            (
                vec![observed("a", Ok(vec![])), observed("b", Ok(vec![]))],
                Some(("c", "not asked yet", vec![])),
            ),
        ];
        for (observations, expected) in table {
            let got = hold(&gates, &observations);
            match expected {
                None => assert_eq!(got, None, "{observations:?}"),
                Some((name, message, also)) => {
                    let got = got.expect("a gate holds");
                    assert_eq!(got.gate, name);
                    assert_eq!(got.also, also);
                    let text = got.describe();
                    assert!(
                        text.starts_with(&format!("alert gate {name:?} holds every admission: ")),
                        "{text}"
                    );
                    assert!(text.contains(message), "{message} in {text}");
                }
            }
        }
        assert_eq!(hold(&[], &[]), None, "no gates, no hold");
    }

    /// The scheduler: a holding gate holds every new admission (after a blackout, before the
    /// windows and limits); a request already admitted keeps its node.
    #[test]
    fn a_round_admits_nothing_while_a_gate_holds() {
        use crate::scheduler::{Limits, NodeState, RequestState, Snapshot, WaitCause, schedule};
        use maintenance_crds::{MaintenanceOperatorConfigSpec, Phase};

        let snapshot = Snapshot {
            nodes: (0..3)
                .map(|i| NodeState::for_test(&format!("n{i}"), false, &[]))
                .collect(),
            requests: vec![
                RequestState::for_test("running", "n0", Phase::Cordon, 0),
                RequestState::for_test("first", "n1", Phase::Pending, 1),
                RequestState::for_test("second", "n2", Phase::Pending, 2),
            ],
        };
        let spec: MaintenanceOperatorConfigSpec = serde_json::from_value(serde_json::json!({
            "maxParallelOperations": 3,
            "admission": {"gates": [
                {"name": "node-alerts", "prometheus": {"url": "http://prometheus:9090",
                                                      "query": "ALERTS"}}]},
        }))
        .expect("a config spec");
        let gates = spec.gates();
        let now = Timestamp::UNIX_EPOCH;
        let firing = Ok(vec![series("KubeNodeNotReady", "n7")]);
        // (what the shell observed, the cause each Pending request waits for, in its reason)
        let table: Vec<(Option<Vec<GateObservation>>, Option<&str>)> = vec![
            (None, Some("not asked yet")),
            (
                Some(vec![observed("node-alerts", firing)]),
                Some("returned 1 series"),
            ),
            (
                Some(vec![observed(
                    "node-alerts",
                    Err(GateProblem::TimedOut(Duration::from_secs(10))),
                )]),
                Some("no answer within 10 s"),
            ),
            (Some(vec![observed("node-alerts", Ok(vec![]))]), None),
        ];
        for (observations, held) in table {
            let mut limits = Limits::from_config(Some(&spec));
            if let Some(observations) = &observations {
                limits.gate_hold = hold(gates, observations);
            }
            let decision = schedule(&snapshot, &limits, now).expect("a round");
            match held {
                Some(text) => {
                    assert!(decision.scheduled.is_empty(), "{observations:?}");
                    assert_eq!(decision.waiting.len(), 2);
                    for waiting in &decision.waiting {
                        assert_eq!(waiting.cause, WaitCause::Gate);
                        assert!(waiting.reason.contains("alert gate \"node-alerts\""));
                        assert!(
                            waiting.reason.contains(text),
                            "{text} in {}",
                            waiting.reason
                        );
                    }
                }
                None => assert_eq!(decision.scheduled.len(), 2, "{observations:?}"),
            }
        }
        assert_eq!(WaitCause::Gate.as_str(), "gate");
        assert!(WaitCause::ALL.contains(&WaitCause::Gate));
    }

    #[test]
    fn answers_are_read_as_series_or_as_the_problem() {
        let vector = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"ALERTS","alertname":"X","alertstate":"firing"},"value":[1,"1"]}]}}"#;
        let series = parse_answer(200, vector).expect("a vector");
        assert_eq!(series.len(), 1);
        assert_eq!(
            series[0].to_string(),
            "ALERTS{alertname=\"X\",alertstate=\"firing\"}"
        );
        let empty = br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(parse_answer(200, empty), Ok(vec![]));
        let no_name = br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"3"]}]}}"#;
        assert_eq!(
            parse_answer(200, no_name).expect("a vector")[0].to_string(),
            "{}"
        );

        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}"#;
        assert_eq!(
            parse_answer(200, scalar),
            Err(GateProblem::NotAVector("scalar".into()))
        );
        let bad_query =
            br#"{"status":"error","errorType":"bad_data","error":"parse error at char 5"}"#;
        let Err(GateProblem::Status { status: 400, body }) = parse_answer(400, bad_query) else {
            panic!("an error answer");
        };
        assert_eq!(body, "bad_data: parse error at char 5");
        assert!(matches!(
            parse_answer(200, b"<html>login</html>"),
            Err(GateProblem::BadAnswer(_))
        ));
        let long = "x".repeat(500);
        let Err(GateProblem::Status { status: 502, body }) = parse_answer(502, long.as_bytes())
        else {
            panic!("a status");
        };
        assert_eq!(body.len(), BODY_QUOTED + 3, "quoted in part");
    }

    #[test]
    fn a_gate_is_asked_again_once_its_answer_is_a_few_seconds_old() {
        let at = |s: i64| Timestamp::from_second(s).expect("a time");
        let mut last = observed("a", Ok(vec![]));
        last.at = at(100);
        assert!(is_due(None, at(100)));
        assert!(!is_due(Some(&last), at(102)));
        assert!(is_due(Some(&last), at(103)));
        assert!(REFRESH_AFTER < POLL_WHILE_PENDING, "each poll asks again");
        assert!(last.is_open());
        assert!(!observed("a", Err(GateProblem::TimedOut(Duration::from_secs(10)))).is_open());
    }

    #[test]
    fn config_problems_name_the_field_and_the_fix() {
        let mut bad_url = gate("b");
        bad_url.prometheus.url = "prometheus:9090".into();
        let mut no_query = gate("c");
        no_query.prometheus.query = " ".into();
        let problems = config_problems(&[gate("a"), gate("a"), bad_url, no_query, gate("")]);
        let text = problems.join("\n");
        for expected in [
            "admission.gates[1].name \"a\" is used by two gates",
            "admission.gates[2].prometheus.url \"prometheus:9090\" is not an http:// or https://",
            "admission.gates[3].prometheus.query is empty",
            "admission.gates[4].name is empty",
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
        assert_eq!(problems.len(), 4, "{text}");
        assert!(config_problems(&[gate("a"), gate("b")]).is_empty());
        let many: Vec<Gate> = (0..17).map(|i| gate(&format!("g{i}"))).collect();
        assert_eq!(
            config_problems(&many),
            vec!["admission.gates has 17 gates, at most 16 are allowed".to_string()]
        );
    }
}
