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
}

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
    pub fn evictions_per_second(&self) -> u32 {
        self.evictions_per_second
            .map_or(DEFAULT_EVICTIONS_PER_SECOND, |v| v.max(1).unsigned_abs())
    }
    pub fn eviction_burst(&self) -> u32 {
        self.eviction_burst
            .map_or(DEFAULT_EVICTION_BURST, |v| v.max(1).unsigned_abs())
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceOperatorConfigStatus {}
