//! The control plane: a testbed started by `tests/testbed/testbed up`, on its own or shared by
//! the tests of a binary, and the paths of the repository the tests read.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tokio::process::Command;
use tokio::sync::OnceCell;

/// A control plane started by `tests/testbed/testbed up`.
pub struct Testbed {
    dir: PathBuf,
    kubeconfig: PathBuf,
    /// Started by this process: stopped (and its directory removed) on drop.
    owned: bool,
    /// Started for one test (`Testbed::start`), not shared by the tests of the binary.
    exclusive: bool,
}

/// The repository's root directory.
pub fn repo_root() -> &'static Path {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        // This crate lives two levels down: tests/support.
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .nth(2)
            .map(Path::to_path_buf)
            .unwrap_or_default()
    })
}

/// A binary of this package's build. Cargo builds the package's binaries before its integration
/// tests and puts them in the directory above the tests' own (`target/<profile>/deps/`).
pub fn built_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."));
    profile_dir.join(name)
}

/// The `testbed` script.
pub fn testbed_script() -> PathBuf {
    repo_root().join("tests/testbed/testbed")
}

/// The CRD manifests the operator installs.
pub fn crds_path() -> PathBuf {
    repo_root().join("crds/crds.yaml")
}

fn keep_dirs() -> bool {
    std::env::var_os("MO_TESTBED_KEEP").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Runs `testbed <args>`; fails with its output unless it succeeds. Returns its output.
pub async fn run_testbed(args: &[&str]) -> Result<String> {
    let script = testbed_script();
    let out = Command::new(&script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!(
            "`testbed {}` failed ({}):\n{stdout}{stderr}",
            args.join(" "),
            out.status
        );
    }
    if !stderr.trim().is_empty() {
        eprint!("{stderr}");
    }
    Ok(stdout)
}

/// Runs `command` to completion; fails with its output unless it succeeds. Returns its output.
pub async fn run_async(command: &mut Command) -> Result<String> {
    let out = command.stdin(Stdio::null()).output().await;
    stdout_of(command, out)
}

/// The standard output of a command that ran (`command` names it in errors), if it succeeded;
/// otherwise an error with its output.
pub fn stdout_of(
    command: &impl std::fmt::Debug,
    out: std::io::Result<std::process::Output>,
) -> Result<String> {
    let out = out.with_context(|| format!("starting {command:?}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{command:?} failed ({}):\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// The name of the real node of `testbed up --real-node`.
pub const REAL_NODE: &str = "real-0";

/// Tests that start a real node take turns: a machine runs one at a time.
pub async fn real_node_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

impl Testbed {
    /// Starts a control plane of its own in a new temporary directory. It stops when this value
    /// is dropped, or when this process exits in any way (the script watches our pid).
    /// `MO_TESTBED_KEEP=1` keeps the directory (logs, kubeconfig) for a post-mortem.
    pub async fn start() -> Result<Testbed> {
        Testbed::start_with(&[]).await
    }

    /// Starts a control plane of its own with one real kubelet node, `real-0` ([`REAL_NODE`]):
    /// containerd, runc and a CNI bridge on this machine (`testbed up --real-node`; root only, one
    /// per machine, so callers take [`real_node_turn`]). Stopping it puts the host back as it was,
    /// and fails if it cannot.
    pub async fn start_with_real_node() -> Result<Testbed> {
        Testbed::start_with(&["--real-node"]).await
    }

    async fn start_with(options: &[&str]) -> Result<Testbed> {
        run_testbed(&["build"]).await?;
        let dir = tempfile::Builder::new()
            .prefix("mo-testbed-")
            .tempdir()
            .context("creating the testbed directory")?
            .keep();
        let dir_arg = dir.to_string_lossy().into_owned();
        let pid = std::process::id().to_string();
        let mut args = vec!["up", "--dir", &dir_arg, "--watch-pid", &pid];
        if !keep_dirs() {
            args.push("--rm-dir-on-exit");
        }
        args.extend_from_slice(options);
        let out = match run_testbed(&args).await {
            Ok(out) => out,
            Err(e) => {
                if !keep_dirs() {
                    let _ = std::fs::remove_dir_all(&dir);
                }
                return Err(e);
            }
        };
        eprint!("{out}");
        Ok(Testbed {
            kubeconfig: dir.join("kubeconfig"),
            dir,
            owned: true,
            exclusive: true,
        })
    }

    /// The testbed of this test binary, started on first use and shared by its tests (each test
    /// isolates itself with its own namespace and nodes). With `MO_TESTBED_DIR` naming the
    /// directory of a running testbed (`testbed up --dir ...`), that one is used instead.
    pub async fn shared() -> Result<&'static Testbed> {
        static SHARED: OnceCell<Testbed> = OnceCell::const_new();
        SHARED
            .get_or_try_init(|| async {
                if let Some(dir) = std::env::var_os("MO_TESTBED_DIR").filter(|d| !d.is_empty()) {
                    let dir = PathBuf::from(dir);
                    let dir_arg = dir.to_string_lossy().into_owned();
                    match run_testbed(&["status", "--dir", &dir_arg]).await {
                        Ok(_) => {
                            return Ok(Testbed {
                                kubeconfig: dir.join("kubeconfig"),
                                dir,
                                owned: false,
                                exclusive: false,
                            });
                        }
                        Err(e) => eprintln!(
                            "MO_TESTBED_DIR={dir_arg} holds no running testbed ({e:#}); starting one"
                        ),
                    }
                }
                let mut testbed = Testbed::start().await?;
                testbed.exclusive = false;
                Ok(testbed)
            })
            .await
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Started for one test (`Testbed::start`), not shared with the other tests of the binary.
    pub fn is_exclusive(&self) -> bool {
        self.exclusive
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Client configuration read from this testbed's kubeconfig (never from the environment).
    pub async fn config(&self) -> Result<Config> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("reading {}", self.kubeconfig.display()))?;
        Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    /// A client for this testbed. Make one per test: a client lives on the runtime it was made on.
    pub async fn client(&self) -> Result<Client> {
        Ok(Client::try_from(self.config().await?)?)
    }

    /// A client that does not retry 429/503/504 by itself, so a test sees the API server's answer
    /// (for instance an eviction refused by a PodDisruptionBudget).
    pub async fn client_without_retry(&self) -> Result<Client> {
        let mut config = self.config().await?;
        config.default_retry = false;
        Ok(Client::try_from(config)?)
    }
}

impl Testbed {
    /// Stops a testbed this process started and fails if `down` does: with a real node, when the
    /// host still shows something of the node afterwards.
    pub async fn stop(mut self) -> Result<()> {
        if !self.owned {
            return Ok(());
        }
        self.owned = false;
        let dir = self.dir.to_string_lossy().into_owned();
        let result = run_testbed(&["down", "--dir", &dir, "--quiet"]).await;
        if !keep_dirs() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        result.map(drop)
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let status = std::process::Command::new(testbed_script())
            .arg("down")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--quiet")
            .stdin(Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!(
                "testbed down --dir {} failed: {status:?}",
                self.dir.display()
            );
        }
        if keep_dirs() {
            eprintln!("kept testbed directory {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
