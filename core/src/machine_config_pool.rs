//! OpenShift MachineConfigPool pausing, as NVIDIA's operator does it
//! (`internal/openshift/mcp.go` and `internal/openshift/utils.go` in
//! github.com/Mellanox/maintenance-operator): before a node of a pool is cordoned, the pool is
//! paused, so that the Machine Config Operator does not reboot nodes for a configuration change
//! while nodes of the pool are in maintenance; it is unpaused when the pool's last request ends.
//!
//! The same marks as NVIDIA's, so that either operator sees the other's state after a switch:
//! the pool of a node is the owner MachineConfigPool of the MachineConfig named by the node's
//! `machineconfiguration.openshift.io/desiredConfig` annotation; the request is labelled
//! `maintenance.nvidia.com/paused-mcp-name: <pool>`; a pool we paused carries
//! `maintenance.nvidia.com/mcp-paused: "true"`, written with `spec.paused: true` in one merge
//! patch. A pool paused without that annotation was paused by someone else and is never unpaused
//! by us.
//!
//! The decisions are here, over what the request actor observed; the actor reads the node, the
//! MachineConfig, the pool and the requests that hold it, and writes the patches.

use std::fmt;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use maintenance_crds::{FINALIZER, MachineConfigPools, NodeMaintenance};
use serde_json::{Value, json};

/// The node annotation naming the MachineConfig the node should run.
pub const DESIRED_CONFIG_ANNOTATION: &str = "machineconfiguration.openshift.io/desiredConfig";
/// The pool annotation saying that a maintenance operator paused it (NVIDIA's `McpPausedAnnotKey`).
pub const PAUSED_ANNOTATION: &str = "maintenance.nvidia.com/mcp-paused";
pub const PAUSED_VALUE: &str = "true";
/// The request label naming the pool it paused, or waits to pause (NVIDIA's `McpNameLabelKey`).
pub const POOL_LABEL: &str = "maintenance.nvidia.com/paused-mcp-name";
/// How soon a request whose pool is busy looks again (NVIDIA's `pauseMCPRequeueTime`,
/// internal/controller/nodemaintenance_controller.go).
pub const BUSY_RECHECK: Duration = Duration::from_secs(10);
/// How long an automatic detection of OpenShift is trusted before it is made again (one GET of
/// the Infrastructure `cluster`, only when a request needs the answer).
pub const DETECTION_TTL: Duration = Duration::from_secs(300);
/// The name of the Infrastructure object that tells an OpenShift cluster.
pub const INFRASTRUCTURE_NAME: &str = "cluster";

/// What the actor saw of the pool of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolView {
    pub name: String,
    /// `metadata.resourceVersion`: the pause and the unpause are guarded by it.
    pub resource_version: Option<String>,
    /// `spec.paused`.
    pub paused: bool,
    /// The pool carries [`PAUSED_ANNOTATION`]: a maintenance operator paused it.
    pub paused_by_us: bool,
    /// `spec.configuration.name`, the rendered config the pool should run.
    pub target: Option<String>,
    /// `status.configuration.name`, the rendered config it runs.
    pub current: Option<String>,
}

impl PoolView {
    /// Reads what the decisions need from a MachineConfigPool object (as JSON: there are no typed
    /// OpenShift objects in our clients). Missing fields read as unset.
    pub fn of(name: &str, pool: &Value) -> PoolView {
        let text = |pointer: &str| {
            pool.pointer(pointer)
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        PoolView {
            name: name.to_string(),
            resource_version: text("/metadata/resourceVersion"),
            paused: pool
                .pointer("/spec/paused")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            paused_by_us: pool
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(PAUSED_ANNOTATION))
                .is_some(),
            target: text("/spec/configuration/name"),
            current: text("/status/configuration/name"),
        }
    }

    /// In the middle of a configuration change (NVIDIA: `spec.configuration.name !=
    /// status.configuration.name`).
    pub fn configuring(&self) -> bool {
        self.target != self.current
    }
}

/// Why a pool cannot be paused by us now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusyCause {
    /// `spec.paused` is true without our annotation: someone else paused it.
    PausedByOthers,
    /// The pool is moving its nodes from one rendered config to another.
    Configuring {
        current: Option<String>,
        target: Option<String>,
    },
}

/// The Scheduled step's verdict on the pool of its node, before the cordon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PauseVerdict {
    /// Paused by us already (by another request of the pool, or by this one before a restart):
    /// go on to the cordon.
    GoOn,
    /// Pause it (guarded by the version read), then go on.
    Pause,
    /// Wait, without cordoning; look again in [`BUSY_RECHECK`].
    Busy(BusyCause),
}

/// NVIDIA's `PauseMCP`: already paused by us, go on; paused by someone else, or configuring:
/// busy. NVIDIA reads the pool again after its pause and undoes the pause if a configuration
/// change began meanwhile; our pause is guarded by the resourceVersion read, so a change between
/// the read and the write makes it conflict, and the next step decides again from the new pool.
/// (A change that begins after the pause waits for the unpause: that is what pausing is for.)
pub fn pause_verdict(pool: &PoolView) -> PauseVerdict {
    if pool.paused_by_us {
        return PauseVerdict::GoOn;
    }
    if pool.paused {
        return PauseVerdict::Busy(BusyCause::PausedByOthers);
    }
    if pool.configuring() {
        return PauseVerdict::Busy(BusyCause::Configuring {
            current: pool.current.clone(),
            target: pool.target.clone(),
        });
    }
    PauseVerdict::Pause
}

/// Why a request waits for its pool, for its status and Event.
pub fn busy_message(pool: &str, cause: &BusyCause) -> String {
    let why = match cause {
        BusyCause::PausedByOthers => format!(
            "MachineConfigPool {pool} is paused by someone else (spec.paused without \
             {PAUSED_ANNOTATION}); the cordon waits until it is unpaused"
        ),
        BusyCause::Configuring { current, target } => format!(
            "MachineConfigPool {pool} is in the middle of a configuration change (from {} to {}); \
             the cordon waits until it is done",
            current.as_deref().unwrap_or("none"),
            target.as_deref().unwrap_or("none"),
        ),
    };
    format!("{why}; checked again every {}s", BUSY_RECHECK.as_secs())
}

/// Why the pool of a node could not be found (NVIDIA's `getMCPName` errors); the request waits
/// as for a busy pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unresolved {
    /// The node has no [`DESIRED_CONFIG_ANNOTATION`].
    NoDesiredConfig,
    /// The MachineConfig it names does not exist.
    NoMachineConfig(String),
    /// The MachineConfig has no MachineConfigPool among its owners.
    NoOwner(String),
    /// The pool named by the owner does not exist.
    NoPool(String),
}

impl Unresolved {
    pub fn message(&self, node: &str) -> String {
        let why = match self {
            Unresolved::NoDesiredConfig => {
                format!("node {node} has no {DESIRED_CONFIG_ANNOTATION} annotation")
            }
            Unresolved::NoMachineConfig(mc) => {
                format!("MachineConfig {mc} (the desiredConfig of node {node}) does not exist")
            }
            Unresolved::NoOwner(mc) => format!(
                "MachineConfig {mc} (the desiredConfig of node {node}) has no MachineConfigPool \
                 owner"
            ),
            Unresolved::NoPool(pool) => {
                format!("MachineConfigPool {pool} (of node {node}) does not exist")
            }
        };
        format!(
            "cannot pause the MachineConfigPool of node {node}: {why}; the cordon waits, checked \
             again every {}s",
            BUSY_RECHECK.as_secs()
        )
    }
}

/// The pool that owns a MachineConfig: the name of its first MachineConfigPool owner.
pub fn owner_pool(machine_config: &Value) -> Option<String> {
    machine_config
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|o| o.get("kind").and_then(Value::as_str) == Some("MachineConfigPool"))
        .and_then(|o| o.get("name").and_then(Value::as_str))
        .map(str::to_string)
}

/// What the Scheduled step observed of its node's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolObservation {
    Unresolved(Unresolved),
    Seen(PoolView),
}

/// The pool this request labelled as paused (or waiting to pause), if any.
pub fn labelled_pool(request: &NodeMaintenance) -> Option<&str> {
    request
        .metadata
        .labels
        .as_ref()?
        .get(POOL_LABEL)
        .map(String::as_str)
        .filter(|name| !name.is_empty())
}

/// Another request as the release sees it, from a list by [`POOL_LABEL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub key: String,
    pub uid: Option<String>,
    /// It still carries our finalizer: not yet released.
    pub unreleased: bool,
}

impl Holder {
    /// From a request's metadata (the release lists only that).
    pub fn of(meta: &ObjectMeta) -> Holder {
        Holder {
            key: format!(
                "{}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            ),
            uid: meta.uid.clone(),
            unreleased: meta.finalizers.iter().flatten().any(|f| f == FINALIZER),
        }
    }
}

/// The release's verdict on a pool the request labelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseVerdict {
    /// The last holder is gone: unpause (guarded by the version read) and remove our annotation.
    Unpause,
    /// Other requests of the pool still hold it (their keys).
    HeldBy(Vec<String>),
    /// The pool does not carry our annotation (someone else paused it, or nobody did): leave it.
    NotOurs,
    /// The pool no longer exists.
    Gone,
}

/// NVIDIA's `UnpauseMCP`: only a pool that carries our annotation, and only when no other
/// request holds it. NVIDIA counts the requests labelled with any pool on a node its
/// `spec.nodeSelector` selects; we count those labelled with this pool and not yet released (our
/// finalizer still on them), which is the same set while nodes stay in their pools, keeps a pool
/// paused by a node that moved to another pool mid-maintenance, and does not count a released
/// request that another finalizer keeps.
pub fn release_verdict(
    pool: Option<&PoolView>,
    me: Option<&str>,
    holders: &[Holder],
) -> ReleaseVerdict {
    let Some(pool) = pool else {
        return ReleaseVerdict::Gone;
    };
    if !pool.paused_by_us {
        return ReleaseVerdict::NotOurs;
    }
    let others: Vec<String> = holders
        .iter()
        .filter(|h| h.unreleased && h.uid.as_deref() != me)
        .map(|h| h.key.clone())
        .collect();
    if others.is_empty() {
        ReleaseVerdict::Unpause
    } else {
        ReleaseVerdict::HeldBy(others)
    }
}

/// The merge patch that pauses (with our annotation) or unpauses (removing it) a pool, guarded by
/// the version read (NVIDIA's `changeMachineConfigPoolPause` writes the same fields, unguarded).
pub fn pause_patch(pool: &PoolView, pause: bool) -> Value {
    let annotation = if pause {
        Value::String(PAUSED_VALUE.to_string())
    } else {
        Value::Null
    };
    json!({
        "metadata": {
            "resourceVersion": pool.resource_version,
            "annotations": { PAUSED_ANNOTATION: annotation },
        },
        "spec": { "paused": pause },
    })
}

/// What the automatic detection found (NVIDIA's `NewOpenshiftUtils`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detection {
    /// No Infrastructure `cluster` (or no such resource type).
    NotOpenShift,
    /// OpenShift with its control plane on its nodes.
    OpenShift,
    /// HyperShift (`status.controlPlaneTopology: External`): no MachineConfigPools to pause.
    HyperShift,
}

impl Detection {
    /// From the Infrastructure `cluster`, `None` when it does not exist.
    pub fn of(infrastructure: Option<&Value>) -> Detection {
        match infrastructure {
            None => Detection::NotOpenShift,
            Some(infra) => {
                if infra
                    .pointer("/status/controlPlaneTopology")
                    .and_then(Value::as_str)
                    == Some("External")
                {
                    Detection::HyperShift
                } else {
                    Detection::OpenShift
                }
            }
        }
    }
}

impl fmt::Display for Detection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Detection::NotOpenShift => "not OpenShift",
            Detection::OpenShift => "OpenShift",
            Detection::HyperShift => "HyperShift",
        })
    }
}

/// Whether pools are paused, from the setting and, for `Auto`, a detection made at `detected_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolsOn {
    Yes,
    No,
    /// `Auto`, with no detection or one older than [`DETECTION_TTL`]: detect first.
    Detect,
}

pub fn pools_on(
    setting: MachineConfigPools,
    detection: Option<(Detection, Timestamp)>,
    now: Timestamp,
) -> PoolsOn {
    match setting {
        MachineConfigPools::Enabled => PoolsOn::Yes,
        MachineConfigPools::Disabled => PoolsOn::No,
        MachineConfigPools::Auto => match detection {
            Some((found, at))
                if now.duration_since(at).as_secs() < DETECTION_TTL.as_secs() as i64 =>
            {
                if found == Detection::OpenShift {
                    PoolsOn::Yes
                } else {
                    PoolsOn::No
                }
            }
            _ => PoolsOn::Detect,
        },
    }
}

/// A pool `worker` at version 7 for the tests: paused or not, by us or not, running `current`
/// and told to run `target`.
#[cfg(test)]
pub(crate) fn test_pool(paused: bool, ours: bool, current: &str, target: &str) -> PoolView {
    PoolView {
        name: "worker".into(),
        resource_version: Some("7".into()),
        paused,
        paused_by_us: ours,
        target: Some(target.into()),
        current: Some(current.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::test_pool as pool;
    use super::*;

    /// The verdicts of NVIDIA's `PauseMCP` (internal/openshift/mcp.go), one row each.
    #[test]
    fn pause_verdicts_follow_nvidias_pause_mcp() {
        let rows = [
            (pool(false, false, "r1", "r1"), PauseVerdict::Pause),
            (pool(true, true, "r1", "r1"), PauseVerdict::GoOn),
            // Ours, even while configuring: another request of the pool paused it.
            (pool(true, true, "r1", "r2"), PauseVerdict::GoOn),
            (
                pool(true, false, "r1", "r1"),
                PauseVerdict::Busy(BusyCause::PausedByOthers),
            ),
            (
                pool(true, false, "r1", "r2"),
                PauseVerdict::Busy(BusyCause::PausedByOthers),
            ),
            (
                pool(false, false, "r1", "r2"),
                PauseVerdict::Busy(BusyCause::Configuring {
                    current: Some("r1".into()),
                    target: Some("r2".into()),
                }),
            ),
        ];
        for (view, verdict) in rows {
            assert_eq!(pause_verdict(&view), verdict, "{view:?}");
        }
    }

    #[test]
    fn busy_messages_name_the_pool_and_why() {
        let others = busy_message("worker", &BusyCause::PausedByOthers);
        assert!(
            others.contains("MachineConfigPool worker is paused by someone else"),
            "{others}"
        );
        let configuring = busy_message(
            "worker",
            &BusyCause::Configuring {
                current: Some("rendered-worker-1".into()),
                target: Some("rendered-worker-2".into()),
            },
        );
        assert!(
            configuring.contains("worker is in the middle of a configuration change (from rendered-worker-1 to rendered-worker-2)"),
            "{configuring}"
        );
        assert!(
            configuring.ends_with("checked again every 10s"),
            "{configuring}"
        );
    }

    fn holder(key: &str, uid: &str, unreleased: bool) -> Holder {
        Holder {
            key: key.into(),
            uid: Some(uid.into()),
            unreleased,
        }
    }

    /// NVIDIA's `UnpauseMCP` (internal/openshift/mcp.go): only our pause, and only by the last.
    #[test]
    fn release_verdicts_follow_nvidias_unpause_mcp() {
        let ours = pool(true, true, "r1", "r1");
        let me = Some("uid-1");
        let mine = holder("default/a", "uid-1", true);
        let other = holder("default/b", "uid-2", true);
        let released = holder("default/c", "uid-3", false);
        let rows: [(Option<&PoolView>, Vec<Holder>, ReleaseVerdict); 6] = [
            (Some(&ours), vec![mine.clone()], ReleaseVerdict::Unpause),
            (Some(&ours), vec![], ReleaseVerdict::Unpause),
            (
                Some(&ours),
                vec![mine.clone(), other.clone()],
                ReleaseVerdict::HeldBy(vec!["default/b".into()]),
            ),
            (
                Some(&ours),
                vec![mine.clone(), released],
                ReleaseVerdict::Unpause,
            ),
            // Paused by someone else: never unpaused by us, whoever holds it.
            (
                Some(&pool(true, false, "r1", "r1")),
                vec![mine.clone()],
                ReleaseVerdict::NotOurs,
            ),
            (None, vec![mine], ReleaseVerdict::Gone),
        ];
        for (view, holders, verdict) in rows {
            assert_eq!(
                release_verdict(view, me, &holders),
                verdict,
                "{view:?} {holders:?}"
            );
        }
    }

    #[test]
    fn a_pool_is_read_from_its_json() {
        let json = serde_json::json!({
            "metadata": {"resourceVersion": "42", "annotations": {PAUSED_ANNOTATION: "true"}},
            "spec": {"paused": true, "configuration": {"name": "rendered-worker-2"}},
            "status": {"configuration": {"name": "rendered-worker-1"}},
        });
        let view = PoolView::of("worker", &json);
        assert_eq!(
            view,
            PoolView {
                name: "worker".into(),
                resource_version: Some("42".into()),
                paused: true,
                paused_by_us: true,
                target: Some("rendered-worker-2".into()),
                current: Some("rendered-worker-1".into()),
            }
        );
        assert!(view.configuring());
        let bare = PoolView::of("worker", &serde_json::json!({}));
        assert!(!bare.paused && !bare.paused_by_us && !bare.configuring());
    }

    #[test]
    fn the_pool_of_a_machine_config_is_its_pool_owner() {
        let mc = serde_json::json!({"metadata": {"ownerReferences": [
            {"kind": "ControllerConfig", "name": "x"},
            {"kind": "MachineConfigPool", "name": "worker"},
        ]}});
        assert_eq!(owner_pool(&mc).as_deref(), Some("worker"));
        assert_eq!(owner_pool(&serde_json::json!({"metadata": {}})), None);
    }

    #[test]
    fn patches_pause_and_unpause_with_our_annotation_guarded() {
        let view = pool(false, false, "r1", "r1");
        assert_eq!(
            pause_patch(&view, true),
            serde_json::json!({
                "metadata": {"resourceVersion": "7", "annotations": {PAUSED_ANNOTATION: "true"}},
                "spec": {"paused": true},
            })
        );
        assert_eq!(
            pause_patch(&view, false),
            serde_json::json!({
                "metadata": {"resourceVersion": "7", "annotations": {PAUSED_ANNOTATION: null}},
                "spec": {"paused": false},
            })
        );
    }

    /// NVIDIA's `NewOpenshiftUtils` and `main.go`: on with an Infrastructure `cluster`, but not on
    /// HyperShift; a detection is trusted for a while, then made again.
    #[test]
    fn auto_detects_openshift_but_not_hypershift() {
        let t0 = Timestamp::UNIX_EPOCH;
        let later = |s: i64| t0 + jiff::SignedDuration::from_secs(s);
        let infra = serde_json::json!({"status": {"controlPlaneTopology": "HighlyAvailable"}});
        let hosted = serde_json::json!({"status": {"controlPlaneTopology": "External"}});
        assert_eq!(Detection::of(None), Detection::NotOpenShift);
        assert_eq!(Detection::of(Some(&infra)), Detection::OpenShift);
        assert_eq!(Detection::of(Some(&hosted)), Detection::HyperShift);
        use MachineConfigPools::*;
        let rows = [
            (Enabled, None, PoolsOn::Yes),
            (Disabled, Some((Detection::OpenShift, t0)), PoolsOn::No),
            (Auto, None, PoolsOn::Detect),
            (Auto, Some((Detection::OpenShift, t0)), PoolsOn::Yes),
            (Auto, Some((Detection::HyperShift, t0)), PoolsOn::No),
            (Auto, Some((Detection::NotOpenShift, t0)), PoolsOn::No),
        ];
        for (setting, detection, on) in rows {
            assert_eq!(
                pools_on(setting, detection, later(10)),
                on,
                "{setting:?} {detection:?}"
            );
        }
        assert_eq!(
            pools_on(Auto, Some((Detection::OpenShift, t0)), later(301)),
            PoolsOn::Detect
        );
    }
}
