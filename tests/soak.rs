//! `make soak`: the operator under a steady random load for a long time on a real control plane.
//! Random requests on random nodes (some drained, under PodDisruptionBudgets), released at random
//! once Ready, and config edits (the limits changed within their valid ranges). Every 10 s it
//! samples the operator's RSS (`/proc/PID/status` VmRSS), the open watches (the API server's
//! `apiserver_longrunning_requests{verb="WATCH"}`, all of them and those on pods, which the
//! operator opens per node in maintenance) and the operator's error counters
//! (`maintenance_operator_errors_total`, `maintenance_operator_actor_restarts_total`).
//!
//! It fails when, over the second half of the run, RSS grows faster than
//! [`MAX_RSS_MIB_PER_10_MIN`] or the open watches faster than [`MAX_WATCHES_PER_10_MIN`] (least-
//! squares slopes; only judged when the second half spans at least [`MIN_JUDGED_SPAN`], as a
//! slope over a few samples is noise), when an error counter grows at all (no fault is injected),
//! or when a request is not finished and gone, or a node still cordoned, once the load stops.
//!
//! A plain `cargo test` runs a 1-minute smoke variant on 30 nodes. `MO_SOAK_MINUTES` and
//! `MO_SOAK_NODES` set the size (`make soak`: 30 minutes on 200 nodes); `MO_SOAK_SEED` replays a
//! run's random choices. The samples go to `samples.csv` and the slopes to `summary.md` in
//! `$MO_SOAK_REPORT_DIR/<UTC date>-soak-<minutes>m/` (`make soak` sets `bench`), else under the
//! build's temporary directory.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Client, ResourceExt};
use maintenance_crds::{MaintenanceOperatorConfigSpec, Phase};
use support::operator::*;
use support::*;

/// RSS growth allowed over the second half, in MiB per 10 minutes. The operator sits near 30 MiB
/// at 200 nodes; allocator noise on such a process is within about 1 MiB, and a leak of one
/// 1 KiB object per request handled (about 2 requests/s here) would show as about 1.2 MiB per
/// 10 min. 2 MiB/10 min keeps noise out and catches any leak that would matter over a day
/// (close to 300 MiB).
const MAX_RSS_MIB_PER_10_MIN: f64 = 2.0;
/// Open watches are a count that only moves when a watch is opened or closed: a leak of one watch
/// per minute (e.g. a pod watch per drain never closed) is 10 per 10 min; reconnects move the
/// count by one or two for a moment.
const MAX_WATCHES_PER_10_MIN: f64 = 2.0;
/// Slopes over a shorter second half are reported, not judged.
const MIN_JUDGED_SPAN: Duration = Duration::from_secs(5 * 60);
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
const POOL_SIZE: usize = 10;
const WAIT: Duration = Duration::from_secs(180);

struct Settings {
    minutes: f64,
    nodes: usize,
    seed: u64,
}

impl Settings {
    fn from_env() -> Result<Settings> {
        let minutes = env_number("MO_SOAK_MINUTES")?.unwrap_or(1.0);
        let nodes = env_number("MO_SOAK_NODES")?.unwrap_or(30);
        let seed = env_number("MO_SOAK_SEED")?.unwrap_or(Timestamp::now().as_nanosecond() as u64);
        ensure!(minutes > 0.0, "MO_SOAK_MINUTES must be positive");
        ensure!(nodes >= 4, "MO_SOAK_NODES must be at least 4");
        Ok(Settings {
            minutes,
            nodes,
            seed,
        })
    }
}

/// One sample of the operator and the API server.
struct Sample {
    seconds: f64,
    rss_mib: f64,
    watches: f64,
    pod_watches: f64,
    errors: f64,
    actor_restarts: f64,
    live_requests: usize,
    released: usize,
}

impl Sample {
    const CSV_HEADER: &str = "seconds,rss_mib,watches,pod_watches,errors_total,actor_restarts_total,live_requests,released";

    fn csv(&self) -> String {
        format!(
            "{:.1},{:.2},{},{},{},{},{},{}",
            self.seconds,
            self.rss_mib,
            self.watches,
            self.pod_watches,
            self.errors,
            self.actor_restarts,
            self.live_requests,
            self.released
        )
    }
}

fn rss_mib(pid: u32) -> Result<f64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no VmRSS line in {path}"))?;
    Ok(kib / 1024.0)
}

/// The sum of the samples of `name` whose labels contain every one of `labels` (`k="v"`).
fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            (rest.is_empty() || rest.starts_with('{')).then_some(())?;
            labels
                .iter()
                .all(|label| rest.contains(label))
                .then(|| value.parse::<f64>().ok())?
        })
        .fold(0.0, |sum, v| sum + v)
}

/// The API server's `/metrics`, read with kubectl (as an admin of the testbed).
async fn apiserver_metrics(testbed: &Testbed) -> Result<String> {
    let output = tokio::process::Command::new("kubectl")
        .args(["get", "--raw", "/metrics", "--kubeconfig"])
        .arg(testbed.kubeconfig_path())
        .output()
        .await
        .context("running kubectl (is the testbed's bin dir on PATH?)")?;
    ensure!(
        output.status.success(),
        "kubectl get --raw /metrics failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).context("the API server's /metrics is not UTF-8")
}

async fn sample(
    testbed: &Testbed,
    (client, ns): (&Client, &str),
    operator: &Operator,
    started: Instant,
    released: usize,
) -> Result<Sample> {
    let pid = operator.pid().context("the operator is not running")?;
    let server = apiserver_metrics(testbed).await?;
    let watches = metric_sum(
        &server,
        "apiserver_longrunning_requests",
        &[r#"verb="WATCH""#],
    );
    ensure!(
        watches > 0.0,
        "the API server reports no open WATCH in apiserver_longrunning_requests: the metric \
         this soak relies on is missing"
    );
    let ours = operator.metrics().await?;
    // The failed-call counter has a series per step and prints nothing before the first failure;
    // the restart counter always prints, and shows that these are the operator's metrics.
    ensure!(
        ours.contains("# TYPE maintenance_operator_actor_restarts_total counter"),
        "the operator's /metrics has no maintenance_operator_actor_restarts_total: the soak's \
         error checks rely on its metric names"
    );
    Ok(Sample {
        seconds: started.elapsed().as_secs_f64(),
        rss_mib: rss_mib(pid)?,
        watches,
        pod_watches: metric_sum(
            &server,
            "apiserver_longrunning_requests",
            &[r#"verb="WATCH""#, r#"resource="pods""#],
        ),
        errors: metric_sum(&ours, "maintenance_operator_errors_total", &[]),
        actor_restarts: metric_sum(&ours, "maintenance_operator_actor_restarts_total", &[]),
        live_requests: list_requests(client, ns).await?.len(),
        released,
    })
}

/// Least-squares slope of `y` against `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let cov: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let var: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if var == 0.0 { 0.0 } else { cov / var }
}

/// Per 10 minutes, over the second half of the samples.
fn second_half_slope(samples: &[Sample], value: impl Fn(&Sample) -> f64) -> f64 {
    let half = &samples[samples.len() / 2..];
    let points: Vec<(f64, f64)> = half.iter().map(|s| (s.seconds, value(s))).collect();
    slope(&points) * 600.0
}

fn random_limits(rng: &mut StdRng, nodes: usize) -> MaintenanceOperatorConfigSpec {
    let top = (nodes / 5).clamp(2, 20);
    let max_parallel = 1 + rng.random_range(0..top);
    let max_unavailable = if rng.random_bool(0.3) {
        // A percentage of the cluster, rounded by the operator.
        IntOrString::String(format!("{}%", 5 + rng.random_range(0..20)))
    } else {
        IntOrString::Int((1 + rng.random_range(0..top)) as i32)
    };
    MaintenanceOperatorConfigSpec {
        max_parallel_operations: Some(IntOrString::Int(max_parallel as i32)),
        max_unavailable: Some(max_unavailable),
        ..MaintenanceOperatorConfigSpec::default()
    }
}

fn report_dir(minutes: f64) -> PathBuf {
    let base = report_base("MO_SOAK_REPORT_DIR", || {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("soak")
    });
    let date = Timestamp::now().strftime("%Y-%m-%d").to_string();
    base.join(format!("{date}-soak-{minutes}m"))
}

async fn run() -> Result<()> {
    let settings = Settings::from_env()?;
    let mut rng = StdRng::seed_from_u64(settings.seed);
    println!(
        "soak: {} min on {} nodes, seed {} (MO_SOAK_SEED replays it)",
        settings.minutes, settings.nodes, settings.seed
    );
    let (testbed, client) = own_testbed(Some(random_limits(&mut rng, settings.nodes))).await?;

    // Pools of nodes, each with a Deployment of one pod per node under a budget.
    let ns = unique_name("soak");
    create_namespace(&client, &ns).await?;
    let pools = settings.nodes.div_ceil(POOL_SIZE);
    let mut nodes = Vec::new();
    let mut apps = Vec::new();
    for pool in 0..pools {
        let size = settings.nodes / pools + usize::from(pool < settings.nodes % pools);
        let prefix = unique_name(&format!("soak-p{pool}"));
        nodes.extend(create_nodes(&client, &prefix, size, &[]).await?);
        let app = format!("app-{pool}");
        let labels = [("app", app.as_str())];
        let pods = PodSpecOptions::on_nodes_with_prefix(&prefix);
        create_deployment(&client, &ns, &app, size as i32, &labels, &pods).await?;
        create_pdb_of_kind(&client, &ns, &app, &labels, pool, size as i32).await?;
        apps.push((app, size));
    }
    wait_nodes_ready(&client, &nodes, WAIT).await?;
    for (app, size) in &apps {
        wait_pods_ready(&client, &ns, &format!("app={app}"), *size, WAIT).await?;
    }
    let operator = Operator::start_as(&testbed, "soak-operator", &[]).await?;

    let dir = report_dir(settings.minutes);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let csv_path = dir.join("samples.csv");
    let mut csv = format!("{}\n", Sample::CSV_HEADER);

    let started = Instant::now();
    let length = Duration::from_secs_f64(settings.minutes * 60.0);
    let mut samples: Vec<Sample> = Vec::new();
    let mut next_sample = started;
    let (mut created, mut released, mut edits) = (0usize, 0usize, 0usize);
    while started.elapsed() < length {
        if Instant::now() >= next_sample {
            let s = sample(&testbed, (&client, &ns), &operator, started, released).await?;
            println!(
                "soak {:>6.0}s: RSS {:.1} MiB, watches {} (pods {}), errors {}, actor restarts \
                 {}, {} live requests, {} released",
                s.seconds,
                s.rss_mib,
                s.watches,
                s.pod_watches,
                s.errors,
                s.actor_restarts,
                s.live_requests,
                s.released
            );
            writeln!(csv, "{}", s.csv())?;
            std::fs::write(&csv_path, &csv)
                .with_context(|| format!("writing {}", csv_path.display()))?;
            samples.push(s);
            next_sample += SAMPLE_EVERY;
        }
        let live = list_requests(&client, &ns).await?;
        let busy: BTreeSet<&str> = live.iter().map(|r| r.spec.node_name.as_str()).collect();
        // New requests on idle nodes: about a tenth of the fleet in play at any time.
        if busy.len() < settings.nodes / 10 + 1 && rng.random_bool(0.7) {
            let node = &nodes[rng.random_range(0..nodes.len())];
            if !busy.contains(node.as_str()) {
                let mut spec =
                    request_spec(node, &format!("soak{}.example.com", rng.random_range(0..3)));
                if rng.random_bool(0.7) {
                    spec.drain_spec = drain_spec(true, 0);
                }
                create_request(&client, &ns, &format!("r{created}"), spec).await?;
                created += 1;
            }
        }
        // The requestors release Ready requests after a random while.
        for r in &live {
            if r.phase() == Phase::Ready && !r.is_deleting() && rng.random_bool(0.3) {
                delete_request(&client, &ns, &r.name_any()).await?;
                released += 1;
            }
        }
        if rng.random_bool(0.02) {
            set_config(&client, random_limits(&mut rng, settings.nodes)).await?;
            edits += 1;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "soak: load stopped after {:.0}s: {created} requests created, {released} released, \
         {edits} config edits",
        started.elapsed().as_secs_f64()
    );

    // Every request must finish once the limits allow it: open them wide and release.
    set_config(
        &client,
        limits(settings.nodes as i32, settings.nodes as i32),
    )
    .await?;
    release_all_when_ready(&client, &ns, WAIT).await?;
    let mut cordoned = Vec::new();
    for node in &nodes {
        if node_unschedulable(&client, node).await? {
            cordoned.push(node.clone());
        }
    }

    let rss = second_half_slope(&samples, |s| s.rss_mib);
    let watches = second_half_slope(&samples, |s| s.watches);
    let pod_watches = second_half_slope(&samples, |s| s.pod_watches);
    let span = samples
        .last()
        .zip(samples.get(samples.len() / 2))
        .map_or(0.0, |(last, mid)| last.seconds - mid.seconds);
    let judged = span >= MIN_JUDGED_SPAN.as_secs_f64();
    let first = samples.first().context("no sample was taken")?;
    let last = samples.last().context("no sample was taken")?;
    let mut summary = String::new();
    writeln!(
        summary,
        "# Soak, {} min on {} nodes (seed {})\n\n\
         {created} requests created, {released} released, {edits} config edits; {} samples.\n\n\
         Least-squares slopes over the second half ({span:.0} s{}):\n\n\
         | what | slope per 10 min | limit |\n| --- | --- | --- |\n\
         | RSS (MiB) | {rss:.3} | {MAX_RSS_MIB_PER_10_MIN} |\n\
         | open watches | {watches:.3} | {MAX_WATCHES_PER_10_MIN} |\n\
         | open pod watches | {pod_watches:.3} | {MAX_WATCHES_PER_10_MIN} |\n\n\
         RSS {:.1} -> {:.1} MiB; errors_total {} -> {}; actor_restarts_total {} -> {}.",
        settings.minutes,
        settings.nodes,
        settings.seed,
        samples.len(),
        if judged { "" } else { ", too short to judge" },
        first.rss_mib,
        last.rss_mib,
        first.errors,
        last.errors,
        first.actor_restarts,
        last.actor_restarts,
    )?;
    let summary_path = dir.join("summary.md");
    std::fs::write(&summary_path, &summary)
        .with_context(|| format!("writing {}", summary_path.display()))?;
    println!("{summary}\nsamples: {}", csv_path.display());

    let mut failures = Vec::new();
    if !cordoned.is_empty() {
        failures.push(format!("nodes left cordoned: {cordoned:?}"));
    }
    if judged {
        if rss > MAX_RSS_MIB_PER_10_MIN {
            failures.push(format!(
                "RSS grows {rss:.2} MiB per 10 min over the second half (limit \
                 {MAX_RSS_MIB_PER_10_MIN})"
            ));
        }
        for (what, value) in [("open watches", watches), ("open pod watches", pod_watches)] {
            if value > MAX_WATCHES_PER_10_MIN {
                failures.push(format!(
                    "{what} grow {value:.2} per 10 min over the second half (limit \
                     {MAX_WATCHES_PER_10_MIN})"
                ));
            }
        }
    }
    if last.errors > first.errors {
        failures.push(format!(
            "maintenance_operator_errors_total grew from {} to {} with no fault injected (see \
             the operator log {})",
            first.errors,
            last.errors,
            operator.log.display()
        ));
    }
    if last.actor_restarts > first.actor_restarts {
        failures.push(format!(
            "maintenance_operator_actor_restarts_total grew from {} to {}",
            first.actor_restarts, last.actor_restarts
        ));
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

fn main() -> ExitCode {
    support::run_as_test("soak", run)
}
