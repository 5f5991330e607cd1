//! What the API server said to one eviction call, in the vocabulary every decision uses.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionOutcome {
    /// Accepted: the pod is terminating now.
    Evicted,
    /// The pod no longer exists, or was replaced by one with another UID.
    Gone,
    /// A PodDisruptionBudget (or the API server's own rate limit) refuses for now (429), or
    /// the per-budget gate held the eviction back without a call (`held`).
    Refused {
        pdb: Option<String>,
        message: String,
        held: bool,
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

/// Identifies a PodDisruptionBudget: (namespace, name).
pub type PdbKey = (String, String);

/// What the eviction gate reads of one PodDisruptionBudget that selects a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdbAllowance {
    pub key: PdbKey,
    /// Changes with every write of the PDB (status included): the tokens are reset then.
    pub resource_version: String,
    /// `status.disruptionsAllowed` (0 when it has no status yet).
    pub disruptions_allowed: i32,
}

/// The gate's answer for one eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GateVerdict {
    /// Make the call (no budget selects the pod, or its budget's disruption is now claimed, or
    /// several budgets select it, which only the API server can refuse).
    Call,
    /// Do not call: the budget's disruptions are all spoken for; the pod waits for it to change.
    Hold {
        pdb: String,
        disruptions_allowed: i32,
    },
}

impl GateVerdict {
    /// The outcome a held eviction records: a refusal by the budget, so the pod waits on the
    /// budget's next change exactly as after a 429, but without the call.
    pub fn hold_outcome(pdb: &str, disruptions_allowed: i32) -> EvictionOutcome {
        let why = if disruptions_allowed <= 0 {
            format!("PodDisruptionBudget {pdb} allows no disruption now")
        } else {
            format!(
                "PodDisruptionBudget {pdb} allows {disruptions_allowed} disruptions now and \
                 evictions in flight use them all"
            )
        };
        EvictionOutcome::Refused {
            pdb: Some(pdb.to_string()),
            message: format!("{why}; this pod is evicted when it allows one (no call was made)"),
            held: true,
        }
    }
}

/// Per-budget admission of eviction calls across all node actors: no more calls in flight for a
/// PodDisruptionBudget than its `disruptionsAllowed`, so the API server is not asked for
/// evictions it can only refuse (each refusal is a 429 that every other controller's requests
/// queue behind). The tokens of a budget are reset to its `disruptionsAllowed` whenever the budget
/// changes (a new resourceVersion: the API server decrements it with every accepted eviction, the
/// disruption controller recomputes it), and each call claims one. Pure: the caller keeps the
/// book behind a lock and passes the budgets it observed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenBook {
    /// Budget -> (the resourceVersion the tokens were counted at, tokens left).
    tokens: std::collections::HashMap<PdbKey, (String, i32)>,
}

impl TokenBook {
    /// Whether an eviction of a pod that `covering` budgets select may be called now; claims the
    /// budget's disruption when it may.
    pub fn admit(&mut self, covering: &[PdbAllowance]) -> GateVerdict {
        let [pdb] = covering else {
            // None: nothing limits the pod. Several: the API server answers 500 whatever they
            // allow, and the drain reports that; holding the pod would hide it.
            return GateVerdict::Call;
        };
        let entry = self
            .tokens
            .entry(pdb.key.clone())
            .or_insert_with(|| (pdb.resource_version.clone(), pdb.disruptions_allowed.max(0)));
        if entry.0 != pdb.resource_version {
            *entry = (pdb.resource_version.clone(), pdb.disruptions_allowed.max(0));
        }
        if entry.1 > 0 {
            entry.1 -= 1;
            GateVerdict::Call
        } else {
            GateVerdict::Hold {
                pdb: pdb.key.1.clone(),
                disruptions_allowed: pdb.disruptions_allowed,
            }
        }
    }

    /// Gives back the disruption an admitted call claimed from `pdb` when the call used none (the
    /// pod was gone, or the call failed before the API server decided): otherwise the budget's
    /// other pods would wait for a change of the budget that never comes. A refusal (429) gives
    /// nothing back: the budget has no room, and its next change resets the tokens anyway.
    pub fn release(&mut self, pdb: &PdbAllowance) {
        if let Some(entry) = self.tokens.get_mut(&pdb.key)
            && entry.0 == pdb.resource_version
        {
            entry.1 = (entry.1 + 1).min(pdb.disruptions_allowed.max(0));
        }
    }

    /// Forgets budgets that no longer exist (`exists` false), so the book stays as small as the
    /// set of budgets.
    pub fn retain(&mut self, exists: impl Fn(&PdbKey) -> bool) {
        self.tokens.retain(|key, _| exists(key));
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdb(name: &str, version: &str, allowed: i32) -> PdbAllowance {
        PdbAllowance {
            key: ("app".to_string(), name.to_string()),
            resource_version: version.to_string(),
            disruptions_allowed: allowed,
        }
    }

    fn calls(book: &mut TokenBook, covering: &[PdbAllowance], n: usize) -> usize {
        (0..n)
            .filter(|_| book.admit(covering) == GateVerdict::Call)
            .count()
    }

    #[test]
    fn no_more_calls_than_the_budget_allows_until_it_changes() {
        let mut book = TokenBook::default();
        let web = pdb("web", "1", 2);
        assert_eq!(calls(&mut book, std::slice::from_ref(&web), 5), 2);
        assert_eq!(
            book.admit(std::slice::from_ref(&web)),
            GateVerdict::Hold {
                pdb: "web".to_string(),
                disruptions_allowed: 2
            }
        );
        // The API server accepted one eviction: a new version with one disruption left.
        let web = pdb("web", "2", 1);
        assert_eq!(calls(&mut book, std::slice::from_ref(&web), 5), 1);
        // A budget that allows none (or has no status yet) admits nothing.
        assert_eq!(calls(&mut book, &[pdb("db", "7", 0)], 3), 0);
        assert_eq!(calls(&mut book, &[pdb("odd", "1", -1)], 3), 0);
    }

    #[test]
    fn a_call_that_used_no_disruption_gives_it_back() {
        let mut book = TokenBook::default();
        let web = pdb("web", "1", 1);
        assert_eq!(calls(&mut book, std::slice::from_ref(&web), 1), 1);
        assert_ne!(book.admit(std::slice::from_ref(&web)), GateVerdict::Call);
        // The pod was gone: the disruption is still there for the next pod.
        book.release(&web);
        assert_eq!(calls(&mut book, std::slice::from_ref(&web), 2), 1);
        // Never more than the budget allows, and nothing for a version already replaced.
        book.release(&web);
        book.release(&web);
        assert_eq!(calls(&mut book, std::slice::from_ref(&web), 3), 1);
        book.release(&pdb("web", "0", 1));
        assert_eq!(calls(&mut book, std::slice::from_ref(&web), 1), 0);
    }

    #[test]
    fn pods_without_a_budget_or_with_several_are_always_called() {
        let mut book = TokenBook::default();
        assert_eq!(calls(&mut book, &[], 3), 3);
        let both = [pdb("a", "1", 0), pdb("b", "1", 0)];
        assert_eq!(calls(&mut book, &both, 3), 3);
        assert!(book.is_empty(), "nothing claimed, nothing kept");
    }

    #[test]
    fn budgets_are_independent_and_forgotten_when_gone() {
        let mut book = TokenBook::default();
        assert_eq!(calls(&mut book, &[pdb("web", "1", 1)], 2), 1);
        assert_eq!(calls(&mut book, &[pdb("db", "1", 1)], 2), 1);
        book.retain(|key| key.1 == "db");
        assert_eq!(book.len(), 1);
        // Seen again (recreated): counted afresh.
        assert_eq!(calls(&mut book, &[pdb("web", "1", 1)], 2), 1);
    }

    #[test]
    fn a_hold_records_as_a_refusal_by_the_budget() {
        let EvictionOutcome::Refused { pdb, message, held } = GateVerdict::hold_outcome("web", 0)
        else {
            panic!("a hold is a refusal");
        };
        assert_eq!(pdb.as_deref(), Some("web"));
        assert!(held);
        assert!(message.contains("no call was made"), "{message}");
    }
}
