use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::int_or_percent::{INT_OR_PERCENT_MESSAGE, INT_OR_PERCENT_RULE};

/// Only the config object with this name, in the operator's namespace, is read.
pub const DEFAULT_CONFIG_NAME: &str = "default";

/// Default for `evictionsPerSecond`: a drain of 100 nodes x 30 pods finishes its eviction calls in
/// a minute while leaving the API server (default --max-requests-inflight 400) plenty of room.
pub const DEFAULT_EVICTIONS_PER_SECOND: u32 = 50;
/// Default for `maxNodeMaintenanceTimeSeconds`: NVIDIA's CRD default (not its sample's 1600).
pub const DEFAULT_MAX_NODE_MAINTENANCE_TIME_SECONDS: i32 = 3600;
/// Default for `evictionBurst`.
pub const DEFAULT_EVICTION_BURST: u32 = 100;

/// Cluster-wide settings of the operator.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "maintenance.nvidia.com",
    version = "v1alpha1",
    kind = "MaintenanceOperatorConfig",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    status = "MaintenanceOperatorConfigStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceOperatorConfigSpec {
    /// Most nodes in maintenance at once: an integer or a percentage of all nodes (rounded up). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 1))]
    #[x_kube(validation = Rule::new(INT_OR_PERCENT_RULE).message(INT_OR_PERCENT_MESSAGE))]
    pub max_parallel_operations: Option<IntOrString>,

    /// Most nodes unavailable at once (in maintenance, unschedulable or not Ready): an integer or a
    /// percentage of all nodes (rounded down). Unset means no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(INT_OR_PERCENT_RULE).message(INT_OR_PERCENT_MESSAGE))]
    pub max_unavailable: Option<IntOrString>,

    /// Operator log level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "info", "enum" = ["debug", "info", "error"]))]
    pub log_level: Option<String>,

    /// How long a request may stay Ready before it is deleted as forgotten (garbage collected), in
    /// seconds from `maintenance.nvidia.com/ready-time`; default 3600 as in NVIDIA's CRD. A request
    /// annotated `maintenance.nvidia.com/garbage-collector.ignore: "true"` is never collected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 3600), range(min = 0))]
    pub max_node_maintenance_time_seconds: Option<i32>,

    /// Our addition: eviction calls per second across all nodes (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub evictions_per_second: Option<i32>,

    /// Our addition: eviction calls allowed in a burst above the rate (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub eviction_burst: Option<i32>,

    /// Our addition: limits for parts of the cluster (a node pool, each zone), on top of the two
    /// cluster-wide limits. A request is admitted only when the cluster-wide limits and every
    /// budget that selects its node have room. Unset or empty: no budgets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]), length(max = 32))]
    pub budgets: Option<Vec<Budget>>,

    /// Our addition: new requests are admitted only while one of these windows is open (work in
    /// progress always finishes). Unset or empty: always open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub maintenance_windows: Option<Vec<MaintenanceWindow>>,

    /// Our addition: periods in which nothing new is admitted (change freezes), whatever the
    /// windows say. Unset or empty: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub blackouts: Option<Vec<Blackout>>,

    /// Our addition: how Pending requests are ordered for admission beyond the plain order.
    /// Unset: the plain order (oldest first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,

    /// Our addition: webhooks told of each request's lifecycle events, one CloudEvent (JSON,
    /// structured mode) per event and receiver. Unset or empty: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]), length(max = 16))]
    pub notifications: Option<Vec<crate::Notification>>,

    /// Our addition: OpenShift integration. Unset: `machineConfigPools: Auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openshift: Option<OpenShift>,
}

/// OpenShift integration (NVIDIA's operator turns it on by itself on OpenShift; here it can also
/// be set).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OpenShift {
    /// Pause the MachineConfigPool of a node before it is cordoned, and unpause it when the
    /// pool's last request ends, as NVIDIA's operator does. `Auto` (the default): on when the
    /// cluster is OpenShift (the Infrastructure `cluster` of `config.openshift.io/v1` exists) and
    /// not HyperShift; `Enabled`: always; `Disabled`: never (a pool already paused by a request is
    /// still unpaused at its release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_config_pools: Option<MachineConfigPools>,
}

/// Whether MachineConfigPools are paused.
// Plain comments on the variants: doc comments would make the schema a `oneOf`, not an `enum`.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub enum MachineConfigPools {
    // On when the cluster is OpenShift and not HyperShift.
    #[default]
    Auto,
    Enabled,
    Disabled,
}

/// Default for `admission.maxPassOverSeconds`: ten minutes, long enough for a PDB to recover from
/// a rolling restart, short enough that a blocked node is not forgotten.
pub const DEFAULT_MAX_PASS_OVER_SECONDS: i32 = 600;

/// Admission preferences; each is off unless set, but `taintWaitingNodes`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Admission {
    /// Prefer nodes whose drain can make progress now: every pod the drain would evict is
    /// guarded by no PodDisruptionBudget or only by budgets that allow a disruption. Requests
    /// whose drain would wait on a budget are passed over for such nodes (their Pending message
    /// names the budget) until they have waited `maxPassOverSeconds`. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer_drainable: Option<bool>,

    /// With `preferDrainable`: a request older than this many seconds (from its creation) is no
    /// longer passed over and takes its plain place in the order. Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = 600), range(min = 0))]
    pub max_pass_over_seconds: Option<i32>,

    /// Admit a node only if the pods its drain would evict fit on the remaining schedulable
    /// nodes: their CPU and memory requests against allocatable minus what is requested there,
    /// respecting nodeSelectors and NoSchedule/NoExecute taints, with nodes in maintenance,
    /// unavailable or admitted in the same round counted as gone. A request that does not fit
    /// waits, and its Pending message says what is missing and by how much. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_capacity: Option<bool>,

    /// Taint each node whose request waits for admission with a drain to do
    /// (`maintenance.nvidia.com/drain-pending`, effect PreferNoSchedule), so the pods evicted from
    /// the nodes in maintenance now are placed elsewhere rather than on a node whose own drain
    /// would evict them again. The taint is removed when the request is admitted or deleted, and
    /// from every node when this is turned off. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taint_waiting_nodes: Option<bool>,

    /// Keep cluster-autoscaler and Karpenter off a node in maintenance: the cordon writes
    /// `cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"` and
    /// `karpenter.sh/do-not-disrupt: "true"` in the same patch, and the uncordon removes them,
    /// so an autoscaler neither removes the node mid-drain nor drains it itself. An annotation the
    /// node carried before is left alone, like a cordon that was there. Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protect_from_autoscalers: Option<bool>,

    /// An admitted request whose drain has evicted nothing for this many seconds because
    /// PodDisruptionBudgets refuse gives its slot back: its node is uncordoned (if we cordoned
    /// it), it returns to Pending behind the requests that were waiting, and it is admitted
    /// again after a back-off that doubles with each yield (from this period, capped at an hour
    /// or this period if longer). A request with `drainSpec.forceDeleteAfterSeconds` never
    /// yields. Unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub yield_blocked_drain_after_seconds: Option<i32>,

    /// Alert gates: while the Prometheus query of any gate returns a non-empty result (an alert
    /// firing), or cannot be answered, nothing new is admitted; work already admitted goes on.
    /// Unset or empty: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]), length(max = 16))]
    pub gates: Option<Vec<crate::Gate>>,
}

impl Admission {
    pub fn prefer_drainable(&self) -> bool {
        self.prefer_drainable.unwrap_or(false)
    }
    pub fn check_capacity(&self) -> bool {
        self.check_capacity.unwrap_or(false)
    }
    pub fn taint_waiting_nodes(&self) -> bool {
        self.taint_waiting_nodes.unwrap_or(true)
    }
    pub fn protect_from_autoscalers(&self) -> bool {
        self.protect_from_autoscalers.unwrap_or(true)
    }
    /// How long a drain blocked by PodDisruptionBudgets keeps its slot; `None`: for good.
    pub fn yield_blocked_drain_after(&self) -> Option<std::time::Duration> {
        self.yield_blocked_drain_after_seconds
            .filter(|s| *s > 0)
            .map(|s| std::time::Duration::from_secs(u64::from(s.unsigned_abs())))
    }
    pub fn gates(&self) -> &[crate::Gate] {
        self.gates.as_deref().unwrap_or_default()
    }
    /// How long a request whose drain would wait may be passed over.
    pub fn max_pass_over_seconds(&self) -> i64 {
        i64::from(
            self.max_pass_over_seconds
                .unwrap_or(DEFAULT_MAX_PASS_OVER_SECONDS)
                .max(0),
        )
    }
}

/// Limits for the nodes a selector picks, as a whole or per value of a label (per zone, per pool).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(GROUP_LIMITS_RULE).message(GROUP_LIMITS_MESSAGE))]
pub struct Budget {
    /// Names the budget in Pending messages, `plan` and metrics; unique among the budgets.
    #[schemars(length(min = 1, max = 63), regex(pattern = BUDGET_NAME_PATTERN))]
    pub name: String,

    /// The nodes this budget covers (matchLabels and matchExpressions, as in a Deployment's
    /// selector). Unset or empty: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,

    /// A node label (e.g. `topology.kubernetes.io/zone`): the limits below then apply to each
    /// group of covered nodes sharing a value of this label, separately. Covered nodes without the
    /// label form one group of their own. Unset: the limits apply to all covered nodes together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 317), regex(pattern = LABEL_KEY_PATTERN))]
    pub group_by_label: Option<String>,

    /// Most covered nodes in maintenance at once (per group with `groupByLabel`): an integer or a
    /// percentage of the covered nodes (rounded up). Unset: no limit from this budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(INT_OR_PERCENT_RULE).message(INT_OR_PERCENT_MESSAGE))]
    // "100%" at most: a bound keeps the CEL rule's estimated cost within the API server's budget.
    #[schemars(extend("maxLength" = 4))]
    pub max_parallel_operations: Option<IntOrString>,

    /// Most covered nodes unavailable at once (in maintenance, unschedulable or not Ready; per
    /// group with `groupByLabel`): an integer or a percentage of the covered nodes (rounded down).
    /// Unset: no limit from this budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(INT_OR_PERCENT_RULE).message(INT_OR_PERCENT_MESSAGE))]
    #[schemars(extend("maxLength" = 4))]
    pub max_unavailable: Option<IntOrString>,

    /// With `groupByLabel`: most groups with a node in maintenance at once (1 = one zone at a
    /// time). Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_groups_in_maintenance: Option<i32>,

    /// With `groupByLabel`: most groups with an unavailable node (in maintenance, unschedulable
    /// or not Ready) at once (1 = at most one zone unavailable at a time). Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_unavailable_groups: Option<i32>,

    /// New requests on covered nodes are admitted only while one of these windows is open (and
    /// the cluster-wide windows, if any, too). Unset or empty: always open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub maintenance_windows: Option<Vec<MaintenanceWindow>>,
}

/// A window for new admissions: a recurring one (`schedule` and `duration`), optionally bounded by
/// `notBefore` and `notAfter`, or an absolute one (`notBefore` and `notAfter` alone).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(WINDOW_SHAPE_RULE).message(WINDOW_SHAPE_MESSAGE))]
#[x_kube(validation = Rule::new(WINDOW_BOUNDS_RULE).message(WINDOW_BOUNDS_MESSAGE))]
pub struct MaintenanceWindow {
    /// When the window opens: a 5-field crontab expression (minute hour day-of-month month
    /// day-of-week, e.g. `0 1 * * 1-5` for 01:00 on weekdays) or `@daily`, `@weekly`, ...
    /// Unset: an absolute window, open from `notBefore` to `notAfter`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), regex(pattern = CRON_PATTERN))]
    pub schedule: Option<String>,

    /// How long the window stays open after each opening: hours, minutes and seconds such as
    /// `2h`, `90m` or `1h30m` (elapsed time, so a DST change does not stretch it). Set with
    /// `schedule`, and only with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION_PATTERN))]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message("must be longer than zero, like \"2h\", \"90m\" or \"1h30m\""))]
    pub duration: Option<String>,

    /// The IANA time zone `schedule` is read in (e.g. `Europe/Berlin`). Default `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = TIME_ZONE_PATTERN), extend("default" = "UTC"))]
    pub time_zone: Option<String>,

    /// The window is closed before this time (RFC 3339, e.g. `2026-12-12T02:00:00Z`): a
    /// recurring window starts to apply then, an absolute one opens then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Time>,

    /// The window is closed from this time on, for good (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<Time>,
}

impl MaintenanceWindow {
    pub fn time_zone(&self) -> &str {
        self.time_zone.as_deref().unwrap_or("UTC")
    }

    /// A recurring window: opens at each time `schedule` fires, for `duration`.
    pub fn recurring(schedule: &str, duration: &str) -> MaintenanceWindow {
        MaintenanceWindow {
            schedule: Some(schedule.to_string()),
            duration: Some(duration.to_string()),
            ..MaintenanceWindow::default()
        }
    }
}

/// A period in which nothing is admitted (a change freeze, a holiday, an event), whatever the
/// windows and limits say. Work already admitted goes on.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.end > self.start").message("end must be after start"))]
pub struct Blackout {
    /// From this time (RFC 3339, e.g. `2026-11-27T00:00:00Z`)...
    pub start: Time,
    /// ...until this time, excluded.
    pub end: Time,
    /// Why, for people: shown in every Pending message it holds back and in `plan`.
    #[schemars(length(min = 1, max = 256))]
    pub reason: String,
}

/// A budget name: a DNS label, so that it reads well in messages and metric labels.
const BUDGET_NAME_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63 characters.
const LABEL_KEY_PATTERN: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
/// Five space-separated crontab fields, or one of the `@` shorthands; the scheduler parses it.
const CRON_PATTERN: &str =
    "^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[^ ]+( +[^ ]+){4})$";
/// Hours, minutes, seconds: `2h`, `90m`, `1h30m`, `45s`.
const DURATION_PATTERN: &str = "^([0-9]+h)?([0-9]+m)?([0-9]+s)?$";
/// An IANA time zone name such as `Europe/Berlin`, `America/Argentina/Buenos_Aires` or `UTC`.
const TIME_ZONE_PATTERN: &str = "^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$";
/// A recurring window has both a schedule and a duration; an absolute one has neither, but both
/// bounds.
const WINDOW_SHAPE_RULE: &str = "has(self.schedule) == has(self.duration) && (has(self.schedule) || (has(self.notBefore) && has(self.notAfter)))";
const WINDOW_SHAPE_MESSAGE: &str = "set schedule and duration (a recurring window), or notBefore and notAfter without them (an absolute window)";
const WINDOW_BOUNDS_RULE: &str =
    "!has(self.notBefore) || !has(self.notAfter) || self.notAfter > self.notBefore";
const WINDOW_BOUNDS_MESSAGE: &str = "notAfter must be after notBefore";
/// Group-count limits only make sense with groups.
const GROUP_LIMITS_RULE: &str = "has(self.groupByLabel) || (!has(self.maxGroupsInMaintenance) && !has(self.maxUnavailableGroups))";
const GROUP_LIMITS_MESSAGE: &str =
    "maxGroupsInMaintenance and maxUnavailableGroups count groups: set groupByLabel too";

impl MaintenanceOperatorConfigSpec {
    pub fn max_parallel_operations(&self) -> IntOrString {
        self.max_parallel_operations
            .clone()
            .unwrap_or(IntOrString::Int(1))
    }
    /// How long a request may stay Ready before garbage collection.
    pub fn max_node_maintenance_time(&self) -> std::time::Duration {
        let seconds = self
            .max_node_maintenance_time_seconds
            .unwrap_or(DEFAULT_MAX_NODE_MAINTENANCE_TIME_SECONDS);
        std::time::Duration::from_secs(u64::from(seconds.max(0).unsigned_abs()))
    }
    pub fn taint_waiting_nodes(&self) -> bool {
        self.admission().taint_waiting_nodes()
    }
    pub fn protect_from_autoscalers(&self) -> bool {
        self.admission().protect_from_autoscalers()
    }
    pub fn yield_blocked_drain_after(&self) -> Option<std::time::Duration> {
        self.admission().yield_blocked_drain_after()
    }
    /// `admission.gates`.
    pub fn gates(&self) -> &[crate::Gate] {
        self.admission
            .as_ref()
            .map(Admission::gates)
            .unwrap_or_default()
    }
    pub fn evictions_per_second(&self) -> u32 {
        self.evictions_per_second
            .map_or(DEFAULT_EVICTIONS_PER_SECOND, |v| v.max(1).unsigned_abs())
    }
    pub fn eviction_burst(&self) -> u32 {
        self.eviction_burst
            .map_or(DEFAULT_EVICTION_BURST, |v| v.max(1).unsigned_abs())
    }
    pub fn budgets(&self) -> &[Budget] {
        self.budgets.as_deref().unwrap_or_default()
    }
    pub fn admission(&self) -> Admission {
        self.admission.clone().unwrap_or_default()
    }
    pub fn maintenance_windows(&self) -> &[MaintenanceWindow] {
        self.maintenance_windows.as_deref().unwrap_or_default()
    }
    pub fn blackouts(&self) -> &[Blackout] {
        self.blackouts.as_deref().unwrap_or_default()
    }
    pub fn notifications(&self) -> &[crate::Notification] {
        self.notifications.as_deref().unwrap_or_default()
    }
    /// `openshift.machineConfigPools`, `Auto` when unset.
    pub fn machine_config_pools(&self) -> MachineConfigPools {
        self.openshift
            .as_ref()
            .and_then(|o| o.machine_config_pools)
            .unwrap_or_default()
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceOperatorConfigStatus {}
