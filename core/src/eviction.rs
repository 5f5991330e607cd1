//! What the API server said to one eviction call, in the vocabulary every decision uses.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// Accepted: the pod is terminating now.
    Evicted,
    /// The pod no longer exists, or was replaced by one with another UID.
    Gone,
    /// A PodDisruptionBudget (or the API server's own rate limit) refuses for now (429).
    Refused {
        pdb: Option<String>,
        message: String,
    },
    /// Several PodDisruptionBudgets select the pod (500): the API server cannot decide.
    MultiplePdbs { message: String },
    /// Anything else: network trouble, forbidden, server error.
    Error { code: Option<u16>, message: String },
}

impl EvictionOutcome {
    /// The `result` and `code` labels of the eviction metric.
    pub fn metric_labels(&self) -> (&'static str, String) {
        match self {
            EvictionOutcome::Evicted => ("evicted", "201".into()),
            EvictionOutcome::Gone => ("gone", "404".into()),
            EvictionOutcome::Refused { .. } => ("refused", "429".into()),
            EvictionOutcome::MultiplePdbs { .. } => ("multiple_pdbs", "500".into()),
            EvictionOutcome::Error { code, .. } => (
                "error",
                code.map_or_else(|| "none".to_string(), |c| c.to_string()),
            ),
        }
    }
}

/// What the API server said to the DELETE of a pod whose eviction a PodDisruptionBudget kept
/// refusing past `drainSpec.forceDeleteAfterSeconds`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// Accepted: the pod is terminating now, with its own grace period.
    Deleted,
    /// The pod no longer exists, or was replaced by one with another UID: nothing was bypassed.
    Gone,
    /// Anything else: forbidden (the operator's RBAC lacks `delete` on pods), network trouble.
    Error { code: Option<u16>, message: String },
}
