//! Prometheus metrics of the engine. Every name starts with `maintenance_operator_`; the Grafana
//! dashboard and alert rules in `grafana/` are tested against [`Metrics::metric_names`].

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use maintenance_core::notifications::DropReason;
use maintenance_core::validation::{Operation, Outcome};

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    Opts, Registry,
};

/// Why a metric could not be registered (only on a programming error: duplicate names).
pub type MetricsError = prometheus::Error;

const PREFIX: &str = "maintenance_operator";

/// Buckets for phases and drains: from a second to a few hours.
const LONG_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0,
];
/// Buckets for one scheduler round: microseconds to a second.
const FAST_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

pub struct Metrics {
    pub registry: Registry,
    pub request: RequestMetrics,
    pub scheduler: SchedulerMetrics,
    pub drain: DrainMetrics,
    pub process: ProcessMetrics,
    pub notifications: NotificationMetrics,
    pub gates: GateMetrics,
    /// The pods each PDB blocks, summed over request actors: a label set goes when its count is 0.
    blocked_by_pdb: Mutex<HashMap<(String, String), i64>>,
    /// The (budget, group) label sets exported at the last round, so that removed ones go.
    budget_series: Mutex<HashSet<(String, String)>>,
}

/// One budget group's figures at a scheduling round.
pub struct BudgetSample<'a> {
    pub budget: &'a str,
    /// The group's label value; "" for a budget without `groupByLabel`.
    pub group: &'a str,
    pub available_slots: Option<u32>,
    pub can_become_unavailable: Option<u32>,
}

/// The operator's API clients, each with its own bound on calls in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiClient {
    /// Evictions and the deletions of a drain (no retries inside the client: a 429 is an answer).
    Evictions,
    /// The request actors' pod watches, over HTTP/2 (`watch_connections`).
    PodWatches,
    /// Everything else: watches, lists, status, cordons, leases.
    Main,
}

impl ApiClient {
    pub const ALL: [ApiClient; 3] = [ApiClient::Evictions, ApiClient::PodWatches, ApiClient::Main];

    pub fn as_str(self) -> &'static str {
        match self {
            ApiClient::Evictions => "evictions",
            ApiClient::PodWatches => "pod_watches",
            ApiClient::Main => "main",
        }
    }
}

/// A gauge vector labelled by phase.
pub type IntGaugeVecByPhase = prometheus::IntGaugeVec;

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(format!("{PREFIX}_{name}"), help)
}

fn hist(name: &str, help: &str, buckets: &[f64]) -> HistogramOpts {
    HistogramOpts::new(format!("{PREFIX}_{name}"), help).buckets(buckets.to_vec())
}

/// The request lifecycle's metrics: phases, transitions, admissions, adoptions, collection.
pub struct RequestMetrics {
    /// Requests by phase (the reason of their Ready condition).
    pub requests: IntGaugeVecByPhase,
    /// Time a request spent in a phase, observed when it leaves the phase.
    pub phase_duration_seconds: HistogramVec,
    /// Phase transitions made by the operator.
    pub phase_transitions_total: IntCounterVec,
    pub requests_admitted_total: IntCounter,
    /// Requests another operator left in progress that this one adopted.
    pub requests_adopted_total: IntCounter,
    /// Admitted requests whose drain PodDisruptionBudgets blocked that gave their slot back.
    pub requests_yielded_total: IntCounter,
    /// Requests deleted by garbage collection, by cause (ready_too_long, node_not_found).
    pub requests_garbage_collected_total: IntCounterVec,
}

impl RequestMetrics {
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.requests.clone()),
            Box::new(self.phase_duration_seconds.clone()),
            Box::new(self.phase_transitions_total.clone()),
            Box::new(self.requests_admitted_total.clone()),
            Box::new(self.requests_adopted_total.clone()),
            Box::new(self.requests_yielded_total.clone()),
            Box::new(self.requests_garbage_collected_total.clone()),
        ]
    }

    fn new() -> Result<Self, MetricsError> {
        Ok(RequestMetrics {
            requests: prometheus::IntGaugeVec::new(
                opts("requests", "NodeMaintenance requests by phase"),
                &["phase"],
            )?,
            phase_duration_seconds: HistogramVec::new(
                hist(
                    "phase_duration_seconds",
                    "Time a request spent in a phase",
                    LONG_BUCKETS,
                ),
                &["phase"],
            )?,
            phase_transitions_total: IntCounterVec::new(
                opts(
                    "phase_transitions_total",
                    "Phase transitions made by the operator",
                ),
                &["from", "to"],
            )?,
            requests_admitted_total: IntCounter::with_opts(opts(
                "requests_admitted_total",
                "Requests moved from Pending to Scheduled",
            ))?,
            requests_adopted_total: IntCounter::with_opts(opts(
                "requests_adopted_total",
                "Requests left in progress by another operator (NVIDIA's) and adopted",
            ))?,
            requests_yielded_total: IntCounter::with_opts(opts(
                "requests_yielded_total",
                "Admitted requests whose drain PodDisruptionBudgets blocked that gave their slot back (back to Pending)",
            ))?,
            requests_garbage_collected_total: IntCounterVec::new(
                opts(
                    "requests_garbage_collected_total",
                    "Requests deleted by garbage collection, by cause",
                ),
                &["cause"],
            )?,
        })
    }
}

/// The scheduling round's metrics: its runs, and the room under the limits at the last one.
pub struct SchedulerMetrics {
    pub scheduler_runs_total: IntCounter,
    pub scheduler_run_duration_seconds: Histogram,
    pub available_slots: IntGauge,
    /// -1 when maxUnavailable is unset (no limit).
    pub can_become_unavailable: IntGauge,
    /// Per budget and group (see [`Metrics::set_budgets`]); -1 when the budget sets no limit.
    pub budget_available_slots: prometheus::IntGaugeVec,
    pub budget_can_become_unavailable: prometheus::IntGaugeVec,
    /// Pending requests by what holds them back at the last round (every cause exported).
    pub requests_waiting: prometheus::IntGaugeVec,
    /// 1 while the config has a value the scheduler cannot use (nothing is admitted).
    pub config_invalid: IntGauge,
    /// Node groups whose Pending requests wait, at the last round.
    pub node_groups_waiting: IntGauge,
    /// Node groups admitted, each whole in one round.
    pub node_groups_admitted_total: IntCounter,
    /// Nodes carrying the autoscaler annotations we added, at the last round.
    pub nodes_protected_from_autoscalers: IntGauge,
}

impl SchedulerMetrics {
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.scheduler_runs_total.clone()),
            Box::new(self.scheduler_run_duration_seconds.clone()),
            Box::new(self.available_slots.clone()),
            Box::new(self.can_become_unavailable.clone()),
            Box::new(self.budget_available_slots.clone()),
            Box::new(self.budget_can_become_unavailable.clone()),
            Box::new(self.requests_waiting.clone()),
            Box::new(self.config_invalid.clone()),
            Box::new(self.node_groups_waiting.clone()),
            Box::new(self.node_groups_admitted_total.clone()),
            Box::new(self.nodes_protected_from_autoscalers.clone()),
        ]
    }

    fn new() -> Result<Self, MetricsError> {
        Ok(SchedulerMetrics {
            scheduler_runs_total: IntCounter::with_opts(opts(
                "scheduler_runs_total",
                "Scheduling rounds run",
            ))?,
            scheduler_run_duration_seconds: Histogram::with_opts(hist(
                "scheduler_run_duration_seconds",
                "Duration of one scheduling round (snapshot, decision and admission writes)",
                FAST_BUCKETS,
            ))?,
            available_slots: IntGauge::with_opts(opts(
                "available_slots",
                "maxParallelOperations minus nodes in maintenance, at the last round",
            ))?,
            can_become_unavailable: IntGauge::with_opts(opts(
                "can_become_unavailable",
                "maxUnavailable minus unavailable nodes at the last round; -1 when unlimited",
            ))?,
            budget_available_slots: prometheus::IntGaugeVec::new(
                opts(
                    "budget_available_slots",
                    "A budget's maxParallelOperations minus its nodes in maintenance, per group, at the last round; -1 when the budget sets no limit",
                ),
                &["budget", "group"],
            )?,
            budget_can_become_unavailable: prometheus::IntGaugeVec::new(
                opts(
                    "budget_can_become_unavailable",
                    "A budget's maxUnavailable minus its unavailable nodes, per group, at the last round; -1 when the budget sets no limit",
                ),
                &["budget", "group"],
            )?,
            requests_waiting: prometheus::IntGaugeVec::new(
                opts(
                    "requests_waiting",
                    "Pending requests by what holds them back (the cause in `plan -o json`), at the last round",
                ),
                &["cause"],
            )?,
            config_invalid: IntGauge::with_opts(opts(
                "config_invalid",
                "1 while the MaintenanceOperatorConfig has a value the operator cannot use and nothing is admitted, at the last round",
            ))?,
            node_groups_waiting: IntGauge::with_opts(opts(
                "node_groups_waiting",
                "Node groups (label maintenance.nvidia.com/group) whose Pending requests wait, at the last round",
            ))?,
            node_groups_admitted_total: IntCounter::with_opts(opts(
                "node_groups_admitted_total",
                "Node groups admitted, all their Pending requests together in one round",
            ))?,
            nodes_protected_from_autoscalers: IntGauge::with_opts(opts(
                "nodes_protected_from_autoscalers",
                "Nodes carrying the cluster-autoscaler and Karpenter annotations we added, cordoned or not (admission.protectFromAutoscalers), at the last round",
            ))?,
        })
    }
}

/// The drains' metrics: eviction calls, what PodDisruptionBudgets hold back, progress.
pub struct DrainMetrics {
    /// Eviction calls by result (evicted, gone, refused, error) and HTTP code.
    pub eviction_requests_total: IntCounterVec,
    pub eviction_retries_total: IntCounter,
    /// Evictions not called because their PodDisruptionBudget's disruptions were spoken for.
    pub evictions_held_total: IntCounter,
    /// Evictions waiting in the evictor's queue for a call slot and the rate limit.
    pub evictions_queued: IntGauge,
    /// Pods currently refused eviction by a PodDisruptionBudget, by namespace and PDB.
    pub pods_blocked_by_pdb: GaugeVec,
    /// Pods deleted past `drainSpec.forceDeleteAfterSeconds`, by the namespace and PDB bypassed
    /// (one series per budget ever bypassed: bounded by the PDBs, never per pod or node).
    pub pods_force_deleted_total: IntCounterVec,
    pub drain_duration_seconds: Histogram,
    /// Seconds since a node under maintenance last made progress.
    pub seconds_since_progress: GaugeVec,
}

impl DrainMetrics {
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.eviction_requests_total.clone()),
            Box::new(self.eviction_retries_total.clone()),
            Box::new(self.evictions_held_total.clone()),
            Box::new(self.evictions_queued.clone()),
            Box::new(self.pods_blocked_by_pdb.clone()),
            Box::new(self.pods_force_deleted_total.clone()),
            Box::new(self.drain_duration_seconds.clone()),
            Box::new(self.seconds_since_progress.clone()),
        ]
    }

    fn new() -> Result<Self, MetricsError> {
        Ok(DrainMetrics {
            eviction_requests_total: IntCounterVec::new(
                opts(
                    "eviction_requests_total",
                    "Eviction API calls by result and HTTP code",
                ),
                &["result", "code"],
            )?,
            eviction_retries_total: IntCounter::with_opts(opts(
                "eviction_retries_total",
                "Eviction calls that were a retry of a refused or failed one",
            ))?,
            evictions_held_total: IntCounter::with_opts(opts(
                "evictions_held_total",
                "Evictions not called because the pod's PodDisruptionBudget had no disruption left to give (each would have been a refused call)",
            ))?,
            evictions_queued: IntGauge::with_opts(opts(
                "evictions_queued",
                "Evictions waiting for their turn: first attempts and retries take turns, each first come first served, as the eviction rate limit and the bound on calls in flight allow",
            ))?,
            pods_blocked_by_pdb: GaugeVec::new(
                opts(
                    "pods_blocked_by_pdb",
                    "Pods whose last eviction a PodDisruptionBudget refused",
                ),
                &["namespace", "pdb"],
            )?,
            pods_force_deleted_total: IntCounterVec::new(
                opts(
                    "pods_force_deleted_total",
                    "Pods deleted past drainSpec.forceDeleteAfterSeconds, bypassing the PodDisruptionBudget that refused their eviction",
                ),
                &["namespace", "pdb"],
            )?,
            drain_duration_seconds: Histogram::with_opts(hist(
                "drain_duration_seconds",
                "Time from the start of a drain until no pod is left to evict",
                LONG_BUCKETS,
            ))?,
            seconds_since_progress: GaugeVec::new(
                opts(
                    "seconds_since_progress",
                    "Seconds since a node under maintenance last made progress",
                ),
                &["node"],
            )?,
        })
    }
}

/// The process's metrics: request actors, failed and bounded API calls, leadership, the webhook.
pub struct ProcessMetrics {
    pub node_actors: IntGauge,
    pub actor_restarts_total: IntCounter,
    /// Failed API calls by the step that made them.
    pub errors_total: IntCounterVec,
    /// 1 while this process is the leader (or runs without election).
    pub leader: Gauge,
    /// Admission reviews answered by the webhook, by operation and verdict (allowed, denied, error).
    pub admission_reviews_total: IntCounterVec,
    /// API calls sent and not yet answered, per client (at most
    /// `--max-concurrent-api-calls` each).
    pub api_calls_in_flight: prometheus::IntGaugeVec,
    /// Time a client's next call waited because `--max-concurrent-api-calls` calls were already
    /// in flight: its rate is the share of the time the bound held calls back.
    pub api_calls_throttled_seconds_total: prometheus::CounterVec,
    /// Requests to the secure `/metrics`, by verdict and by where the verdict came from (the
    /// cache, or a TokenReview and SubjectAccessReview of the API server).
    pub metrics_access_total: IntCounterVec,
    /// Connections closed at once because a server (webhook, metrics, health) had its
    /// `--max-connections` open already.
    pub connections_refused_total: IntCounterVec,
}

impl ProcessMetrics {
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.node_actors.clone()),
            Box::new(self.actor_restarts_total.clone()),
            Box::new(self.errors_total.clone()),
            Box::new(self.leader.clone()),
            Box::new(self.admission_reviews_total.clone()),
            Box::new(self.api_calls_in_flight.clone()),
            Box::new(self.api_calls_throttled_seconds_total.clone()),
            Box::new(self.metrics_access_total.clone()),
            Box::new(self.connections_refused_total.clone()),
        ]
    }

    fn new() -> Result<Self, MetricsError> {
        Ok(ProcessMetrics {
            node_actors: IntGauge::with_opts(opts(
                "node_actors",
                "Request actors running (one per request in progress)",
            ))?,
            actor_restarts_total: IntCounter::with_opts(opts(
                "actor_restarts_total",
                "Request actors restarted after a failure",
            ))?,
            errors_total: IntCounterVec::new(
                opts("errors_total", "Failed API calls by step"),
                &["step"],
            )?,
            leader: Gauge::with_opts(opts(
                "leader",
                "1 while this process leads (admits and evicts)",
            ))?,
            admission_reviews_total: IntCounterVec::new(
                opts(
                    "admission_reviews_total",
                    "NodeMaintenance admission reviews answered, by operation and verdict",
                ),
                &["operation", "verdict"],
            )?,
            api_calls_in_flight: prometheus::IntGaugeVec::new(
                opts(
                    "api_calls_in_flight",
                    "API calls sent and not yet answered, by client",
                ),
                &["client"],
            )?,
            api_calls_throttled_seconds_total: prometheus::CounterVec::new(
                opts(
                    "api_calls_throttled_seconds_total",
                    "Seconds a client's next API call waited because --max-concurrent-api-calls \
                     calls were in flight",
                ),
                &["client"],
            )?,
            metrics_access_total: IntCounterVec::new(
                opts(
                    "metrics_access_total",
                    "Requests to the secure /metrics by verdict (allowed, unauthenticated, \
                     forbidden) and source (no_token, cache, review)",
                ),
                &["verdict", "source"],
            )?,
            connections_refused_total: IntCounterVec::new(
                opts(
                    "connections_refused_total",
                    "Connections closed at once because the server had its most connections \
                     open, by server (webhook, metrics, health)",
                ),
                &["server"],
            )?,
        })
    }
}

impl Metrics {
    /// A scheduling decision's gauges: free slots, room for unavailable nodes, each budget's
    /// groups, and the waiting requests by cause.
    pub fn record_decision(&self, decision: &maintenance_core::scheduler::Decision) {
        self.scheduler
            .available_slots
            .set(i64::from(decision.available_slots));
        self.scheduler
            .can_become_unavailable
            .set(decision.can_become_unavailable.map_or(-1, i64::from));
        let samples: Vec<BudgetSample<'_>> = decision
            .budgets
            .iter()
            .flat_map(|budget| {
                budget.groups.iter().map(|group| BudgetSample {
                    budget: &budget.name,
                    group: group.group.as_deref().unwrap_or_default(),
                    available_slots: group.available_slots,
                    can_become_unavailable: group.can_become_unavailable,
                })
            })
            .collect();
        self.set_budgets(&samples);
        self.set_waiting(decision.waiting.iter().map(|w| w.cause));
        let waiting = decision.node_groups.iter().filter(|g| !g.admitted).count();
        self.scheduler
            .node_groups_waiting
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }

    /// The requests gauge: how many requests the cache shows in each phase (0 for the others).
    pub fn count_phases(&self, phases: impl IntoIterator<Item = maintenance_crds::Phase>) {
        let mut counts: HashMap<maintenance_crds::Phase, i64> = maintenance_crds::Phase::ALL
            .iter()
            .map(|p| (*p, 0))
            .collect();
        for phase in phases {
            *counts.entry(phase).or_default() += 1;
        }
        for (phase, count) in counts {
            self.request
                .requests
                .with_label_values(&[phase.as_str()])
                .set(count);
        }
    }
    /// Every metric, registered, with the label sets known in advance exported at 0.
    pub fn new() -> Result<Metrics, MetricsError> {
        let m = Metrics {
            registry: Registry::new(),
            request: RequestMetrics::new()?,
            scheduler: SchedulerMetrics::new()?,
            drain: DrainMetrics::new()?,
            process: ProcessMetrics::new()?,
            notifications: NotificationMetrics::new()?,
            gates: GateMetrics::new()?,
            blocked_by_pdb: Mutex::new(HashMap::new()),
            budget_series: Mutex::new(HashSet::new()),
        };
        m.register_all()?;
        m.export_known_series();
        Ok(m)
    }

    /// Creates the series of every label set known in advance (at 0), before any sample.
    fn export_known_series(&self) {
        for phase in maintenance_crds::Phase::ALL {
            self.request
                .requests
                .with_label_values(&[phase.as_str()])
                .set(0);
        }
        for cause in maintenance_core::scheduler::WaitCause::ALL {
            self.scheduler
                .requests_waiting
                .with_label_values(&[cause.as_str()])
                .set(0);
        }
        for cause in maintenance_core::gc::Cause::METRIC_LABELS {
            self.request
                .requests_garbage_collected_total
                .with_label_values(&[cause]);
        }
        for client in ApiClient::ALL {
            self.process
                .api_calls_in_flight
                .with_label_values(&[client.as_str()]);
            self.process
                .api_calls_throttled_seconds_total
                .with_label_values(&[client.as_str()]);
        }
        for server in ["webhook", "metrics", "health"] {
            self.process
                .connections_refused_total
                .with_label_values(&[server]);
        }
        for (verdict, source) in [
            ("allowed", "review"),
            ("allowed", "cache"),
            ("forbidden", "review"),
            ("forbidden", "cache"),
            ("unauthenticated", "review"),
            ("unauthenticated", "cache"),
            ("unauthenticated", "no_token"),
        ] {
            self.process
                .metrics_access_total
                .with_label_values(&[verdict, source]);
        }
        // Exported at 0 from the start, so that rate() and alerts see the first review.
        for operation in [Operation::Create, Operation::Update] {
            for verdict in Outcome::ALL {
                self.process
                    .admission_reviews_total
                    .with_label_values(&[operation.as_str(), verdict.as_str()]);
            }
        }
    }

    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        let mut all = self.request.collectors();
        all.extend(self.scheduler.collectors());
        all.extend(self.drain.collectors());
        all.extend(self.process.collectors());
        all.extend(self.notifications.collectors());
        all.extend(self.gates.collectors());
        all
    }

    fn register_all(&self) -> Result<(), MetricsError> {
        for collector in self.collectors() {
            self.registry.register(collector)?;
        }
        Ok(())
    }

    /// The exposition text for `/metrics`.
    pub fn render(&self) -> String {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        // TextEncoder only fails on a writer error, and a Vec never fails.
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Adds `delta` pods blocked by the PDB `namespace/pdb`; the label set is removed when no
    /// actor reports a pod blocked by it any more, so ended drains leave no stale series.
    pub fn add_pods_blocked_by_pdb(&self, namespace: &str, pdb: &str, delta: i64) {
        let Ok(mut counts) = self.blocked_by_pdb.lock() else {
            return;
        };
        let key = (namespace.to_string(), pdb.to_string());
        let total = {
            let count = counts.entry(key.clone()).or_default();
            *count = (*count + delta).max(0);
            *count
        };
        if total == 0 {
            counts.remove(&key);
            let _ = self
                .drain
                .pods_blocked_by_pdb
                .remove_label_values(&[namespace, pdb]);
        } else {
            // Precision is no concern: counts of pods.
            #[allow(clippy::cast_precision_loss)]
            self.drain
                .pods_blocked_by_pdb
                .with_label_values(&[namespace, pdb])
                .set(total as f64);
        }
    }

    /// Sets the waiting-requests gauge from a round's waiting list.
    pub fn set_waiting(
        &self,
        causes: impl IntoIterator<Item = maintenance_core::scheduler::WaitCause>,
    ) {
        let mut counts: std::collections::HashMap<&'static str, i64> =
            std::collections::HashMap::new();
        for cause in causes {
            *counts.entry(cause.as_str()).or_default() += 1;
        }
        for cause in maintenance_core::scheduler::WaitCause::ALL {
            let label = cause.as_str();
            self.scheduler
                .requests_waiting
                .with_label_values(&[label])
                .set(counts.get(label).copied().unwrap_or(0));
        }
    }

    /// Sets the budget gauges of a round; the label sets of budgets or groups that are gone are
    /// removed, so an edited config leaves no stale series.
    pub fn set_budgets(&self, samples: &[BudgetSample<'_>]) {
        let Ok(mut exported) = self.budget_series.lock() else {
            return;
        };
        let unlimited = |value: Option<u32>| value.map_or(-1, i64::from);
        let mut now: HashSet<(String, String)> = HashSet::new();
        for sample in samples {
            let labels = [sample.budget, sample.group];
            self.scheduler
                .budget_available_slots
                .with_label_values(&labels)
                .set(unlimited(sample.available_slots));
            self.scheduler
                .budget_can_become_unavailable
                .with_label_values(&labels)
                .set(unlimited(sample.can_become_unavailable));
            now.insert((sample.budget.to_string(), sample.group.to_string()));
        }
        for (budget, group) in exported.difference(&now) {
            let labels = [budget.as_str(), group.as_str()];
            let _ = self
                .scheduler
                .budget_available_slots
                .remove_label_values(&labels);
            let _ = self
                .scheduler
                .budget_can_become_unavailable
                .remove_label_values(&labels);
        }
        *exported = now;
    }

    /// Every metric family name the operator exports (histograms as their base name), including
    /// labelled families that have no sample yet.
    pub fn metric_names(&self) -> Vec<String> {
        self.collectors()
            .iter()
            .flat_map(|c| {
                c.desc()
                    .into_iter()
                    .map(|d| d.fq_name.clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// The lifecycle notifications' metrics, per receiver of `spec.notifications`.
pub struct NotificationMetrics {
    pub sent_total: IntCounterVec,
    /// Attempts that failed (each retry counts).
    pub failed_total: IntCounterVec,
    /// Events given up, by receiver and [`DropReason`].
    pub dropped_total: IntCounterVec,
}

impl NotificationMetrics {
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.sent_total.clone()),
            Box::new(self.failed_total.clone()),
            Box::new(self.dropped_total.clone()),
        ]
    }

    fn new() -> Result<Self, MetricsError> {
        Ok(NotificationMetrics {
            sent_total: IntCounterVec::new(
                opts(
                    "notifications_sent_total",
                    "Lifecycle notifications delivered (a 2xx answer), by receiver",
                ),
                &["receiver"],
            )?,
            failed_total: IntCounterVec::new(
                opts(
                    "notifications_failed_total",
                    "Notification attempts that failed (no answer, or an answer other than 2xx), by receiver; each retry counts",
                ),
                &["receiver"],
            )?,
            dropped_total: IntCounterVec::new(
                opts(
                    "notifications_dropped_total",
                    "Lifecycle notifications given up, by receiver and reason (queueFull, retriesExhausted, rejected)",
                ),
                &["receiver", "reason"],
            )?,
        })
    }

    /// Exports a new receiver's series at 0, so that rate() and alerts see its first event.
    pub fn export_receiver(&self, receiver: &str) {
        self.sent_total.with_label_values(&[receiver]);
        self.failed_total.with_label_values(&[receiver]);
        for reason in DropReason::ALL {
            self.dropped_total
                .with_label_values(&[receiver, reason.as_str()]);
        }
    }

    /// Removes a receiver's series when it leaves the config, so that none goes stale.
    pub fn forget_receiver(&self, receiver: &str) {
        let _ = self.sent_total.remove_label_values(&[receiver]);
        let _ = self.failed_total.remove_label_values(&[receiver]);
        for reason in DropReason::ALL {
            let _ = self
                .dropped_total
                .remove_label_values(&[receiver, reason.as_str()]);
        }
    }

    pub fn sent(&self, receiver: &str) {
        self.sent_total.with_label_values(&[receiver]).inc();
    }

    pub fn failed(&self, receiver: &str) {
        self.failed_total.with_label_values(&[receiver]).inc();
    }

    pub fn dropped(&self, receiver: &str, reason: DropReason) {
        self.dropped_total
            .with_label_values(&[receiver, reason.as_str()])
            .inc();
    }
}

/// The alert gates' metrics, per gate of `admission.gates`.
pub struct GateMetrics {
    /// 1 while the gate's last answer was empty (open), 0 while it holds admissions.
    pub open: prometheus::IntGaugeVec,
    /// Queries that got no usable answer (unreachable, an error, a timeout, a Secret missing).
    pub queries_failed_total: IntCounterVec,
}

impl GateMetrics {
    fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.open.clone()),
            Box::new(self.queries_failed_total.clone()),
        ]
    }

    fn new() -> Result<Self, MetricsError> {
        Ok(GateMetrics {
            open: prometheus::IntGaugeVec::new(
                opts(
                    "gate_open",
                    "1 while an alert gate's query returns nothing (admissions may go on), 0 while it returns series or cannot be asked (admissions held), by gate",
                ),
                &["gate"],
            )?,
            queries_failed_total: IntCounterVec::new(
                opts(
                    "gate_queries_failed_total",
                    "Alert gate queries that got no usable answer (unreachable, an error answer, a timeout, a Secret missing), by gate",
                ),
                &["gate"],
            )?,
        })
    }

    /// The gate's last answer: open or holding. Exports its failure count at 0 too.
    pub fn set_open(&self, gate: &str, open: bool) {
        self.open.with_label_values(&[gate]).set(i64::from(open));
        self.queries_failed_total.with_label_values(&[gate]);
    }

    pub fn failed(&self, gate: &str) {
        self.queries_failed_total.with_label_values(&[gate]).inc();
    }

    /// Removes a gate's series when it leaves the config, so that none goes stale.
    pub fn forget(&self, gate: &str) {
        let _ = self.open.remove_label_values(&[gate]);
        let _ = self.queries_failed_total.remove_label_values(&[gate]);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_metric_is_registered_with_the_prefix() {
        let m = super::Metrics::new().expect("metrics register");
        m.process.errors_total.with_label_values(&["x"]).inc();
        m.drain
            .eviction_requests_total
            .with_label_values(&["evicted", "201"])
            .inc();
        m.drain
            .pods_blocked_by_pdb
            .with_label_values(&["ns", "p"])
            .set(1.0);
        m.drain
            .seconds_since_progress
            .with_label_values(&["n"])
            .set(1.0);
        m.request
            .phase_duration_seconds
            .with_label_values(&["Draining"])
            .observe(1.0);
        m.request
            .phase_transitions_total
            .with_label_values(&["Pending", "Scheduled"])
            .inc();
        let names = m.metric_names();
        assert_eq!(names.len(), 40, "{names:?}");
        m.add_pods_blocked_by_pdb("ns", "q", 2);
        m.add_pods_blocked_by_pdb("ns", "q", -1);
        assert!(m.render().contains("pdb=\"q\"} 1"));
        m.add_pods_blocked_by_pdb("ns", "q", -1);
        assert!(!m.render().contains("pdb=\"q\""), "{}", m.render());
        let names = m.metric_names();
        assert_eq!(names.len(), 40, "{names:?}");
        assert!(names.iter().all(|n| n.starts_with("maintenance_operator_")));
        assert!(
            m.render()
                .contains("maintenance_operator_requests{phase=\"Pending\"} 0")
        );
    }

    #[test]
    fn notification_series_follow_the_receivers() {
        let m = super::Metrics::new().expect("metrics register");
        m.notifications.export_receiver("ops");
        let text = m.render();
        assert!(
            text.contains("maintenance_operator_notifications_dropped_total{reason=\"queueFull\",receiver=\"ops\"} 0"),
            "{text}"
        );
        assert!(text.contains("maintenance_operator_notifications_sent_total{receiver=\"ops\"} 0"));
        m.notifications.forget_receiver("ops");
        assert!(!m.render().contains("receiver=\"ops\""));
    }

    #[test]
    fn gate_series_follow_the_gates() {
        let m = super::Metrics::new().expect("metrics register");
        m.gates.set_open("node-alerts", false);
        m.gates.failed("node-alerts");
        let text = m.render();
        assert!(
            text.contains("maintenance_operator_gate_open{gate=\"node-alerts\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("maintenance_operator_gate_queries_failed_total{gate=\"node-alerts\"} 1")
        );
        m.gates.set_open("node-alerts", true);
        assert!(
            m.render()
                .contains("maintenance_operator_gate_open{gate=\"node-alerts\"} 1")
        );
        m.gates.forget("node-alerts");
        assert!(!m.render().contains("node-alerts"));
    }

    #[test]
    fn budget_series_follow_the_config() {
        use super::BudgetSample;
        let m = super::Metrics::new().expect("metrics register");
        let sample = |budget, group, slots| BudgetSample {
            budget,
            group,
            available_slots: slots,
            can_become_unavailable: None,
        };
        m.set_budgets(&[sample("zones", "a", Some(1)), sample("zones", "b", Some(0))]);
        let text = m.render();
        assert!(
            text.contains(
                "maintenance_operator_budget_available_slots{budget=\"zones\",group=\"a\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "maintenance_operator_budget_can_become_unavailable{budget=\"zones\",group=\"b\"} -1"
            ),
            "{text}"
        );
        // Zone b is gone from the config: its series go too.
        m.set_budgets(&[sample("zones", "a", Some(0))]);
        let text = m.render();
        assert!(!text.contains("group=\"b\""), "{text}");
        assert!(text.contains("group=\"a\"} 0"), "{text}");
    }
}
