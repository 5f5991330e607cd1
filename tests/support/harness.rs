//! What test binaries share besides the cluster: settings from the environment, turns for the
//! largest scenarios, and the `main` of the binaries without libtest (bench_report, soak).

use std::path::PathBuf;

use anyhow::{Result, anyhow};

/// A number from environment variable `name`; `None` when unset or blank.
pub fn env_number<T: std::str::FromStr>(name: &str) -> Result<Option<T>> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Ok(Some(
            v.trim()
                .parse()
                .map_err(|_| anyhow!("{name}={v:?} is not a number"))?,
        )),
        _ => Ok(None),
    }
}

/// A size from environment variable `name`, `default` when unset.
pub fn env_usize(name: &str, default: usize) -> Result<usize> {
    Ok(env_number(name)?.unwrap_or(default))
}

/// Where a report goes: `$variable` (relative to the repository), else `default()` (never the work
/// tree unless asked).
pub fn report_base(variable: &str, default: impl FnOnce() -> PathBuf) -> PathBuf {
    match std::env::var_os(variable).filter(|d| !d.is_empty()) {
        // An absolute path replaces the root.
        Some(dir) => crate::repo_root().join(dir),
        None => default(),
    }
}

/// Scenarios with a control plane of their own and tens of nodes, which time the operator, take
/// turns: two at once on a small machine would time the machine rather than the operator. One
/// lock per process, since the files of a test binary share it.
pub async fn large_scenario_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

/// Runs `run` as the one test `name` of a `harness = false` test binary. `cargo test` passes the
/// libtest options and filters on to every test binary: `--list` is answered, and the test runs
/// only when no filter (or `--skip`) excludes it. Prints libtest's closing line.
pub fn run_as_test<F>(name: &str, run: impl FnOnce() -> F) -> std::process::ExitCode
where
    F: std::future::Future<Output = Result<()>>,
{
    use std::process::ExitCode;
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("{name}: test");
        return ExitCode::SUCCESS;
    }
    let mut filters = Vec::new();
    let mut skipped = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--skip" => skipped |= rest.next().is_some_and(|p| name.contains(p.as_str())),
            a if a.starts_with('-') => {}
            a => filters.push(a),
        }
    }
    if skipped || (!filters.is_empty() && !filters.iter().any(|f| name.contains(f))) {
        println!("{name}: 0 passed, 0 failed, 1 filtered out");
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => {
            println!("{name}: 1 passed, 0 failed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{name} failed: {e:#}");
            println!("{name}: 0 passed, 1 failed");
            ExitCode::FAILURE
        }
    }
}
