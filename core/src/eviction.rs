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
    /// True when the call certainly used none of the budget's disruptions, so the gate gives
    /// back what it claimed ([`TokenBook::release`]): the pod was gone, the call failed, or a
    /// 429 came from something other than a budget (the API server's own rate limits, a proxy).
    /// Otherwise the budget, unchanged, would hold its other pods until its next change, which
    /// may never come. A budget's own refusal gives nothing back: it has no room, and its next
    /// change resets the tokens anyway. An accepted eviction changes the budget.
    pub fn used_no_disruption(&self) -> bool {
        match self {
            EvictionOutcome::Gone | EvictionOutcome::Error { .. } => true,
            EvictionOutcome::Refused { pdb, .. } => pdb.is_none(),
            EvictionOutcome::Evicted | EvictionOutcome::MultiplePdbs { .. } => false,
        }
    }

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

/// The evictor's two queues. A retry is the eviction of a pod that was refused (or held) before
/// and waited out its back-off: its budget may have room now. Behind one queue it would wait for
/// every first attempt queued meanwhile (10,000 when 500 nodes of 20 pods drain at once), while
/// the room it waited for is taken by others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    FirstAttempt,
    Retry,
}

impl Lane {
    /// The lane an eviction waits in.
    pub fn of(is_retry: bool) -> Lane {
        if is_retry {
            Lane::Retry
        } else {
            Lane::FirstAttempt
        }
    }

    /// The lanes in the order the dispatcher looks at them after it took from `last`: they take
    /// turns while both hold evictions, so a retry waits for at most as many first attempts as
    /// there are retries ahead of it; a lane alone flows at full speed. First attempts first at
    /// the start.
    pub fn next_order(last: Option<Lane>) -> [Lane; 2] {
        match last {
            Some(Lane::FirstAttempt) => [Lane::Retry, Lane::FirstAttempt],
            Some(Lane::Retry) | None => [Lane::FirstAttempt, Lane::Retry],
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
    tokens: std::collections::HashMap<PdbKey, Claims>,
}

/// The claims on one budget since it was last seen to change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Claims {
    /// The resourceVersion the claims count against.
    version: String,
    /// When each call in flight claimed its disruption.
    at: Vec<jiff::Timestamp>,
}

/// A claim that the budget has not answered by changing within this long no longer counts: a
/// safety net for an outcome nobody foresaw (a call that used no disruption but was not seen to
/// give it back), which would otherwise hold the budget's other pods until its next change,
/// perhaps for good. An accepted eviction changes the budget within the call; a claim waits at
/// most for the global rate limit before its call.
pub const CLAIM_TTL: std::time::Duration = std::time::Duration::from_secs(30);

impl TokenBook {
    /// Whether an eviction of a pod that `covering` budgets select may be called now; claims the
    /// budget's disruption when it may.
    pub fn admit(&mut self, covering: &[PdbAllowance], now: jiff::Timestamp) -> GateVerdict {
        let [pdb] = covering else {
            // None: nothing limits the pod. Several: the API server answers 500 whatever they
            // allow, and the drain reports that; holding the pod would hide it.
            return GateVerdict::Call;
        };
        let claims = self
            .tokens
            .entry(pdb.key.clone())
            .or_insert_with(|| Claims {
                version: pdb.resource_version.clone(),
                at: Vec::new(),
            });
        if claims.version != pdb.resource_version {
            claims.version = pdb.resource_version.clone();
            claims.at.clear();
        }
        let ttl = jiff::SignedDuration::try_from(CLAIM_TTL).unwrap_or(jiff::SignedDuration::MAX);
        // A clock that went back keeps the claim (it counts as just made).
        claims.at.retain(|at| now.duration_since(*at) < ttl);
        let allowed = usize::try_from(pdb.disruptions_allowed.max(0)).unwrap_or(0);
        if claims.at.len() < allowed {
            claims.at.push(now);
            GateVerdict::Call
        } else {
            GateVerdict::Hold {
                pdb: pdb.key.1.clone(),
                disruptions_allowed: pdb.disruptions_allowed,
            }
        }
    }

    /// Gives back the disruption an admitted call claimed from `pdb` when the call used none
    /// (see [`EvictionOutcome::used_no_disruption`]): otherwise the budget's other pods would
    /// wait for a change of the budget that never comes. Nothing for a version already replaced
    /// (its claims are gone with it).
    pub fn release(&mut self, pdb: &PdbAllowance) {
        if let Some(claims) = self.tokens.get_mut(&pdb.key)
            && claims.version == pdb.resource_version
            && !claims.at.is_empty()
        {
            claims.at.remove(0);
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

    /// Both lanes busy: they take turns; one lane alone is taken every time it is looked at
    /// first or second.
    #[test]
    fn the_lanes_take_turns() {
        let table = [
            (None, [Lane::FirstAttempt, Lane::Retry]),
            (Some(Lane::FirstAttempt), [Lane::Retry, Lane::FirstAttempt]),
            (Some(Lane::Retry), [Lane::FirstAttempt, Lane::Retry]),
        ];
        for (last, order) in table {
            assert_eq!(Lane::next_order(last), order, "{last:?}");
        }
        // A retry queued behind 10,000 first attempts is the second taken, not the 10,001st.
        let (mut firsts, mut retries) = (10_000, 1);
        let mut last = None;
        let mut taken = 0;
        while retries > 0 {
            let lane = Lane::next_order(last)
                .into_iter()
                .find(|lane| match lane {
                    Lane::FirstAttempt => firsts > 0,
                    Lane::Retry => retries > 0,
                })
                .expect("work waits");
            match lane {
                Lane::FirstAttempt => firsts -= 1,
                Lane::Retry => retries -= 1,
            }
            taken += 1;
            last = Some(lane);
        }
        assert_eq!(taken, 2);
        assert_eq!(Lane::of(true), Lane::Retry);
        assert_eq!(Lane::of(false), Lane::FirstAttempt);
    }
    use crate::fixtures::at;

    fn pdb(name: &str, version: &str, allowed: i32) -> PdbAllowance {
        PdbAllowance {
            key: ("app".to_string(), name.to_string()),
            resource_version: version.to_string(),
            disruptions_allowed: allowed,
        }
    }

    fn calls_at(book: &mut TokenBook, covering: &[PdbAllowance], n: usize, now: i64) -> usize {
        (0..n)
            .filter(|_| book.admit(covering, at(now)) == GateVerdict::Call)
            .count()
    }

    fn calls(book: &mut TokenBook, covering: &[PdbAllowance], n: usize) -> usize {
        calls_at(book, covering, n, 0)
    }

    #[test]
    fn no_more_calls_than_the_budget_allows_until_it_changes() {
        let mut book = TokenBook::default();
        let web = pdb("web", "1", 2);
        assert_eq!(calls(&mut book, std::slice::from_ref(&web), 5), 2);
        assert_eq!(
            book.admit(std::slice::from_ref(&web), at(0)),
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
        assert_ne!(
            book.admit(std::slice::from_ref(&web), at(0)),
            GateVerdict::Call
        );
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

    /// A 429 that no budget gave (the API server's own rate limit, a proxy) used no disruption:
    /// the claim goes back, or the budget, unchanged, would hold its other pods for good. Found
    /// by the fault-injection test that answers 5% of calls with 429.
    #[test]
    fn which_outcomes_give_the_claim_back() {
        let refused = |pdb: Option<&str>| EvictionOutcome::Refused {
            pdb: pdb.map(str::to_string),
            message: "Too many requests".into(),
            held: false,
        };
        assert!(refused(None).used_no_disruption());
        assert!(!refused(Some("web")).used_no_disruption());
        assert!(EvictionOutcome::Gone.used_no_disruption());
        assert!(
            EvictionOutcome::Error {
                code: Some(500),
                message: "boom".into()
            }
            .used_no_disruption()
        );
        assert!(!EvictionOutcome::Evicted.used_no_disruption());
    }

    /// A claim the budget never answered stops counting after [`CLAIM_TTL`]: an unforeseen
    /// outcome delays the budget's other pods, it never strands them.
    #[test]
    fn a_claim_never_answered_expires() {
        let mut book = TokenBook::default();
        let web = pdb("web", "1", 1);
        assert_eq!(calls_at(&mut book, std::slice::from_ref(&web), 2, 0), 1);
        assert_eq!(calls_at(&mut book, std::slice::from_ref(&web), 1, 29), 0);
        assert_eq!(calls_at(&mut book, std::slice::from_ref(&web), 2, 30), 1);
    }
}
