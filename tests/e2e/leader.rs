//! Two operator processes against one control plane: only the leader acts (the API server's audit
//! log shows no write at all by the standby); when it is killed the other takes over within the
//! lease duration, finishes the work, and the limits hold throughout.
//! Clock skew: a Lease record dated an hour ahead is taken once it stayed unchanged for its lease
//! duration, and one renewed with dates an hour behind is never taken while renewals go on (the
//! standby judges only how long it has seen the record unchanged, as client-go does).
//! Plus the product's troubleshooting command, run verbatim with kubectl.

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context as _, Result, bail, ensure};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use maintenance_crds::Phase;
use support::audit::{AuditLog, WriteCall, describe_writes, seconds_between};
use support::invariants::*;
use support::operator::*;
use support::*;

const WAIT: Duration = Duration::from_secs(90);
const LEASE_SECONDS: u64 = 4;

/// NVIDIA's Lease: the LeaderElectionID of its controller-runtime manager.
const NVIDIA_LEASE: &str = "a9620a8f.nvidia.com";
/// A holder that is not one of our processes (controller-runtime names it `<hostname>_<uuid>`).
const FOREIGN_HOLDER: &str = "maintenance-operator-controller-manager-7d9f_0b6e2c1a";
/// The lease duration of the clock-skew tests, in the foreign record and in our flags.
const SKEW_LEASE_SECONDS: u64 = 3;

/// A Lease held by [`FOREIGN_HOLDER`], written the way client-go writes it, with `renewed` as
/// its renew and acquire time.
async fn create_foreign_lease(
    client: &Client,
    namespace: &str,
    name: &str,
    renewed: Timestamp,
    transitions: i32,
) -> Result<Lease> {
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(FOREIGN_HOLDER.into()),
            lease_duration_seconds: Some(SKEW_LEASE_SECONDS as i32),
            acquire_time: Some(MicroTime(renewed)),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    };
    Api::<Lease>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &lease)
        .await
        .with_context(|| format!("creating Lease {namespace}/{name}"))
}

/// A live foreign holder: renews the Lease every second, each time dated `skew` away from now
/// (its clock is off by that much), until stopped.
struct Renewer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<Renewals>>,
}

struct Renewals {
    count: u32,
    /// When the last renewal was sent (before its read): it cannot have been observed earlier.
    last_sent: Timestamp,
}

impl Renewer {
    fn start(client: Client, namespace: &str, name: &str, skew: SignedDuration) -> Renewer {
        let stop = Arc::new(AtomicBool::new(false));
        let api: Api<Lease> = Api::namespaced(client, namespace);
        let (name, flag) = (format!("{namespace}/{name}"), stop.clone());
        let task = tokio::spawn(async move {
            let short = name.rsplit('/').next().unwrap_or_default().to_string();
            let mut renewals = Renewals {
                count: 0,
                last_sent: Timestamp::now(),
            };
            while !flag.load(Ordering::SeqCst) {
                let sent = Timestamp::now();
                let mut lease = api.get(&short).await?;
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if spec.holder_identity.as_deref() != Some(FOREIGN_HOLDER) {
                    bail!(
                        "Lease {name} was taken by {:?} while its holder renewed it",
                        spec.holder_identity
                    );
                }
                spec.renew_time = Some(MicroTime(sent.checked_add(skew)?));
                // Optimistic concurrency: a write by anyone else since our read fails this one.
                api.replace(&short, &PostParams::default(), &lease)
                    .await
                    .with_context(|| format!("renewing Lease {name}"))?;
                renewals.count += 1;
                renewals.last_sent = sent;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok(renewals)
        });
        Renewer { stop, task }
    }

    /// Stops renewing; returns once no renewal is in flight any more.
    async fn stop(self) -> Result<Renewals> {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.context("the renewer task panicked")?
    }
}

/// Whether `writes` hold a successful write of `resource` (its plural, e.g. `leases`).
fn wrote(writes: &[&WriteCall], resource: &str) -> bool {
    writes
        .iter()
        .any(|w| w.resource == resource && (200..300).contains(&w.code))
}

/// `who` wrote its Lease and requests, as the audit log shows: the testbed's policy logs the
/// operator's writes.
fn ensure_logged(writes: &[&WriteCall], who: &str) -> Result<()> {
    ensure!(
        wrote(writes, "leases") && wrote(writes, "nodemaintenances"),
        "the audit log holds no Lease and NodeMaintenance writes of {who}: is \
         tests/testbed/audit-policy.yaml logging the operator's writes? Its writes: {}",
        describe_writes(writes)
    );
    Ok(())
}

/// None of `writes` came before `t`; `what` says what one would mean.
fn ensure_none_before(writes: &[&WriteCall], t: Timestamp, what: &str) -> Result<()> {
    let early: Vec<&WriteCall> = writes.iter().copied().filter(|w| w.received < t).collect();
    ensure!(early.is_empty(), "{what}: {}", describe_writes(&early));
    Ok(())
}

#[tokio::test]
async fn standby_takes_over_when_the_leader_dies_and_limits_hold() -> Result<()> {
    let (testbed, client, ns, nodes) = own_cluster("leader", 6, Some(limits(2, None))).await?;
    let lease = LEASE_SECONDS.to_string();
    // Each replica runs as a ServiceAccount of its own, so the audit log names who wrote what.
    let mut first =
        Operator::start_as(&testbed, "replica-a", &replica_args("replica-a", &lease)).await?;
    wait_holder(&client, "replica-a", WAIT).await?;
    let second =
        Operator::start_as(&testbed, "replica-b", &replica_args("replica-b", &lease)).await?;
    assert_eq!(second.metric("maintenance_operator_leader").await?, 0.0);
    assert_eq!(first.metric("maintenance_operator_leader").await?, 1.0);

    // Both replicas write as themselves; the monitor's audit check takes one identity, and no pod
    // is drained here, so it runs without one.
    let monitor = InvariantMonitor::start(&testbed, Scope::new(&ns, &nodes)).await?;
    for (i, node) in nodes.iter().enumerate() {
        request_node(&client, &ns, &format!("m{i}"), node, "le.example.com").await?;
    }
    // The leader admits two and brings them to Ready.
    wait_for("two requests Ready", WAIT, || async {
        let ready = list_requests(&client, &ns)
            .await?
            .iter()
            .filter(|r| r.phase() == Phase::Ready)
            .count();
        Ok((ready == 2).then_some(()))
    })
    .await?;

    // Kill the leader; the standby takes over within the lease duration (plus its retry period).
    // The API server's clock and ours are the same machine's: every write the audit log dates
    // before this instant happened before the failover.
    let failover = jiff::Timestamp::now();
    first.kill();
    let killed = Instant::now();
    wait_holder(&client, "replica-b", WAIT).await?;
    let takeover = killed.elapsed();
    ensure!(
        takeover <= Duration::from_secs(LEASE_SECONDS * 2 + 2),
        "takeover took {takeover:?} with a {LEASE_SECONDS}s lease"
    );
    wait_for("replica-b to report leadership", WAIT, || async {
        Ok((second.metric("maintenance_operator_leader").await? == 1.0).then_some(()))
    })
    .await?;
    println!(
        "takeover after the leader was killed: {:.1}s",
        takeover.as_secs_f64()
    );

    // The new leader finishes everything, releasing each request when Ready.
    release_all_when_ready(&client, &ns, WAIT).await?;

    // Who wrote what, as the API server saw it.
    let audit = AuditLog::read(&testbed)?;
    let (leader, standby) = (
        service_account_user("replica-a"),
        service_account_user("replica-b"),
    );
    let leader_writes = audit.writes_by(&leader);
    let standby_writes = audit.writes_by(&standby);
    // The positive control: the log does hold the operator's writes, so an empty list for the
    // standby means it wrote nothing, not that nothing was logged.
    ensure_logged(&leader_writes, &format!("the first leader ({leader})"))?;
    let what = format!("the standby ({standby}) wrote while the other replica led");
    ensure_none_before(&standby_writes, failover, &what)?;
    ensure!(
        wrote(&standby_writes, "leases") && wrote(&standby_writes, "nodemaintenances"),
        "the new leader ({standby}) took the Lease and finished the requests, yet the audit log \
         shows none of its Lease and NodeMaintenance writes: {}",
        describe_writes(&standby_writes)
    );
    let max = monitor.finish().await?.peak_in_maintenance;
    ensure!(
        max <= 2,
        "{max} nodes in maintenance at once with maxParallelOperations=2"
    );
    for node in &nodes {
        ensure!(
            !node_unschedulable(&client, node).await?,
            "{node} left cordoned"
        );
    }
    Ok(())
}

/// The successful writes of Lease `namespace/name` in `writes`.
fn lease_writes<'a>(writes: &[&'a WriteCall], namespace: &str, name: &str) -> Vec<&'a WriteCall> {
    writes
        .iter()
        .copied()
        .filter(|w| {
            w.resource == "leases"
                && w.namespace == namespace
                && w.name == name
                && (200..300).contains(&w.code)
        })
        .collect()
}

/// Every update of the Lease carried the resourceVersion it read, so two candidates that read
/// the same record cannot both write over it (the API server answers one of them 409).
fn ensure_conditional(writes: &[&WriteCall], who: &str) -> Result<()> {
    let blind: Vec<String> = writes
        .iter()
        .filter(|w| w.resource == "leases" && w.verb == "update" && w.based_on.is_none())
        .map(|w| w.describe())
        .collect();
    ensure!(
        blind.is_empty(),
        "{who} updated the Lease without a resourceVersion (a race could let two replicas take \
         it): {blind:?}"
    );
    Ok(())
}

/// A dead holder whose clock ran an hour ahead left NVIDIA's Lease dated an hour in the future.
/// Comparing renewTime with our clock would wait an hour; judged by what we observe, the lease
/// is taken once its record stayed unchanged for its lease duration, and not before. Two
/// candidates start together: exactly one takes it.
#[tokio::test]
async fn a_record_dated_an_hour_ahead_is_taken_after_one_observed_lease_duration() -> Result<()> {
    let (testbed, client) = own_testbed(None).await?;
    // NVIDIA's Lease in NVIDIA's namespace, as during a migration.
    let lease_ns = unique_name("nvidia");
    create_namespace(&client, &lease_ns).await?;
    let an_hour_ahead = Timestamp::now().checked_add(SignedDuration::from_hours(1))?;
    create_foreign_lease(&client, &lease_ns, NVIDIA_LEASE, an_hour_ahead, 4).await?;

    let lease_seconds = SKEW_LEASE_SECONDS.to_string();
    let args = |name: &'static str| {
        vec![
            "--leader-elect",
            "--lease-duration-seconds",
            lease_seconds.as_str(),
            "--lease-name",
            NVIDIA_LEASE,
            "--lease-namespace",
            lease_ns.as_str(),
            "--pod-name",
            name,
        ]
    };
    let (args_a, args_b) = (args("skew-a"), args("skew-b"));
    let started = Instant::now();
    let started_at = Timestamp::now();
    let (a, b) = tokio::try_join!(
        Operator::start_as(&testbed, "skew-a", &args_a),
        Operator::start_as(&testbed, "skew-b", &args_b),
    )?;

    // Must not happen before the record stayed unchanged for its duration: neither process can
    // have seen it before it started.
    let duration = Duration::from_secs(SKEW_LEASE_SECONDS);
    while started.elapsed() < duration {
        let holder = lease_holder(&client, &lease_ns, NVIDIA_LEASE).await?;
        ensure!(
            holder.as_deref() == Some(FOREIGN_HOLDER),
            "the lease went to {holder:?} {:.2}s after the candidates started, before its \
             record stayed unchanged for its {SKEW_LEASE_SECONDS}s lease duration",
            started.elapsed().as_secs_f64()
        );
        tokio::time::sleep(POLL_INTERVAL / 2).await;
    }
    let holder = wait_for("a candidate to take the stale lease", WAIT, || async {
        Ok(lease_holder(&client, &lease_ns, NVIDIA_LEASE)
            .await?
            .filter(|h| h != FOREIGN_HOLDER))
    })
    .await?;
    let took = started.elapsed();
    println!(
        "a record dated an hour ahead was taken {:.1}s after the candidates started \
         ({SKEW_LEASE_SECONDS}s lease)",
        took.as_secs_f64()
    );
    // Start-up, one lease duration, and a retry period or two; never the hour.
    ensure!(
        took <= duration + Duration::from_secs(15),
        "the stale lease was taken only after {took:?}"
    );
    let (leader, standby, standby_name) = match holder.as_str() {
        "skew-a" => (&a, &b, "skew-b"),
        "skew-b" => (&b, &a, "skew-a"),
        other => bail!("the lease went to {other:?}, none of the candidates"),
    };

    // The shape client-go writes: a new term, counted, dated by the taker's clock.
    let spec = Api::<Lease>::namespaced(client.clone(), &lease_ns)
        .get(NVIDIA_LEASE)
        .await?
        .spec
        .context("the Lease has no spec")?;
    ensure!(
        spec.lease_transitions == Some(5),
        "a takeover counts one transition (4 before): {spec:?}"
    );
    ensure!(
        spec.lease_duration_seconds == Some(SKEW_LEASE_SECONDS as i32),
        "{spec:?}"
    );
    let now = Timestamp::now();
    for (field, time) in [
        ("acquireTime", &spec.acquire_time),
        ("renewTime", &spec.renew_time),
    ] {
        let time = time
            .as_ref()
            .with_context(|| format!("no {field}: {spec:?}"))?
            .0;
        ensure!(
            time >= started_at && time <= now,
            "{field} {time} is not the taker's now (between {started_at} and {now})"
        );
    }

    wait_for("the new leader to report leadership", WAIT, || async {
        Ok((leader.metric("maintenance_operator_leader").await? == 1.0).then_some(()))
    })
    .await?;
    ensure!(standby.metric("maintenance_operator_leader").await? == 0.0);

    // As the API server saw it: the first takeover came a lease duration after the start, the
    // other candidate never wrote the Lease, and every write was conditional.
    let audit = AuditLog::read(&testbed)?;
    let leader_user = service_account_user(&holder);
    let standby_user = service_account_user(standby_name);
    let leader_writes = audit.writes_by(&leader_user);
    let standby_writes = audit.writes_by(&standby_user);
    let takeover = lease_writes(&leader_writes, &lease_ns, NVIDIA_LEASE)
        .first()
        .copied()
        .with_context(|| {
            format!(
                "the audit log shows no Lease write by the leader ({leader_user}): {}",
                describe_writes(&leader_writes)
            )
        })?;
    let after = seconds_between(started_at, takeover.received);
    ensure!(
        after >= SKEW_LEASE_SECONDS as f64,
        "the API server received the takeover {after:.2}s after the candidates started, before \
         the record stayed unchanged for {SKEW_LEASE_SECONDS}s: {}",
        takeover.describe()
    );
    let standby_lease_writes = lease_writes(&standby_writes, &lease_ns, NVIDIA_LEASE);
    ensure!(
        standby_lease_writes.is_empty(),
        "both candidates wrote the Lease: {}",
        describe_writes(&standby_lease_writes)
    );
    ensure_conditional(&leader_writes, &leader_user)?;
    ensure_conditional(&standby_writes, &standby_user)?;
    Ok(())
}

/// A live holder whose clock runs an hour behind renews every second with dates an hour in the
/// past. Comparing renewTime with our clock would take its lease at once; judged by what we
/// observe, it is never taken while the renewals go on (and the operator does nothing at all),
/// and is taken a lease duration after they stop.
#[tokio::test]
async fn a_holder_renewing_an_hour_behind_keeps_its_lease_until_it_stops() -> Result<()> {
    let (testbed, client, ns, nodes) = own_cluster("lag", 1, Some(limits(1, None))).await?;
    // Our own Lease, in the operator's namespace (the default --lease-namespace).
    let an_hour = SignedDuration::from_hours(1);
    create_foreign_lease(
        &client,
        OPERATOR_NAMESPACE,
        OUR_LEASE,
        Timestamp::now().checked_sub(an_hour)?,
        0,
    )
    .await?;
    let renewer = Renewer::start(client.clone(), OPERATOR_NAMESPACE, OUR_LEASE, -an_hour);
    let identity = "lagging-standby";
    let monitor = monitor_as(&testbed, &ns, &nodes, identity).await?;
    request_node(&client, &ns, "waits", &nodes[0], "lag.example.com").await?;

    let lease_seconds = SKEW_LEASE_SECONDS.to_string();
    let operator = Operator::start_as(
        &testbed,
        identity,
        &[
            "--leader-elect",
            "--lease-duration-seconds",
            &lease_seconds,
            "--pod-name",
            identity,
        ],
    )
    .await?;

    // Several lease durations: the holder keeps its lease and nothing is admitted.
    let watched = Instant::now();
    let window = Duration::from_secs(4 * SKEW_LEASE_SECONDS);
    while watched.elapsed() < window {
        let holder = lease_holder(&client, OPERATOR_NAMESPACE, OUR_LEASE).await?;
        ensure!(
            holder.as_deref() == Some(FOREIGN_HOLDER),
            "the lease went to {holder:?} {:.1}s into its renewals",
            watched.elapsed().as_secs_f64()
        );
        let why = "a standby admitted a request while another replica led";
        ensure_phase(&client, &ns, "waits", Phase::Pending, why).await?;
        ensure!(operator.metric("maintenance_operator_leader").await? == 0.0);
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let stopped_at = Timestamp::now();
    let renewals = renewer.stop().await?;
    ensure!(
        renewals.count >= 2 * SKEW_LEASE_SECONDS as u32,
        "the holder renewed only {} times in {window:?}; the test proves nothing",
        renewals.count
    );

    // Renewals stopped: taken a lease duration after the last one.
    wait_holder(&client, identity, WAIT).await?;
    let took = seconds_between(renewals.last_sent, Timestamp::now());
    println!(
        "after {} renewals dated an hour behind, the lease was taken {took:.1}s after the last \
         one ({SKEW_LEASE_SECONDS}s lease)",
        renewals.count
    );
    ensure!(
        took <= (SKEW_LEASE_SECONDS + 10) as f64,
        "the abandoned lease was taken only {took:.1}s after the last renewal"
    );
    // The positive control: leading, the same process does admit and finish the request.
    wait_phase(&client, &ns, "waits", Phase::Ready, WAIT).await?;

    let audit = AuditLog::read(&testbed)?;
    let user = service_account_user(identity);
    let writes = audit.writes_by(&user);
    ensure_logged(
        &writes,
        &format!("the operator ({user}), which took the lease and admitted"),
    )?;
    ensure_none_before(
        &writes,
        stopped_at,
        "the standby wrote while the holder renewed",
    )?;
    let takeover = lease_writes(&writes, OPERATOR_NAMESPACE, OUR_LEASE)
        .first()
        .copied()
        .context("no Lease write")?;
    let after = seconds_between(renewals.last_sent, takeover.received);
    ensure!(
        after >= SKEW_LEASE_SECONDS as f64,
        "the API server received the takeover {after:.2}s after the last renewal was sent, \
         before the record stayed unchanged for {SKEW_LEASE_SECONDS}s: {}",
        takeover.describe()
    );
    ensure_conditional(&writes, &user)?;
    monitor.held().await
}

/// `kubectl ... patch ... '{"spec": {"maxUnavailable": 0}}'` exactly as the product documents
/// it: new nodes stop becoming unavailable, requests on already-unavailable nodes go on.
#[tokio::test]
async fn troubleshooting_patch_max_unavailable_zero_works_verbatim() -> Result<()> {
    let (testbed, client, ns, nodes) = own_cluster("ts", 6, Some(limits(10, None))).await?;
    cordon_node(&client, &nodes[0]).await?;
    let monitor = InvariantMonitor::start(&testbed, Scope::new(&ns, &nodes)).await?;
    let op = Operator::start(&testbed, &[]).await?;

    let status = Command::new("kubectl")
        .args([
            "-n",
            "maintenance-operator",
            "patch",
            "maintenanceoperatorconfigs.maintenance.nvidia.com",
            "default",
            "--type",
            "merge",
            "--patch",
            r#"{"spec": {"maxUnavailable": 0}}"#,
        ])
        .env("KUBECONFIG", testbed.kubeconfig_path())
        .status()
        .context("running kubectl")?;
    ensure!(status.success(), "kubectl patch failed: {status}");
    wait_scheduler_rounds(&op, 2).await?;

    request_node(&client, &ns, "on-cordoned", &nodes[0], "ts.example.com").await?;
    request_node(&client, &ns, "on-healthy", &nodes[1], "ts.example.com").await?;
    wait_phase(&client, &ns, "on-cordoned", Phase::Ready, WAIT).await?;
    wait_scheduler_rounds(&op, 3).await?;
    let healthy = get_request(&client, &ns, "on-healthy")
        .await?
        .context("request on-healthy")?;
    assert_eq!(healthy.phase(), Phase::Pending);
    assert!(!node_unschedulable(&client, &nodes[1]).await?);
    monitor.held().await
}
