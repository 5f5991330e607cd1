//! The operator image (`make image`, deploy/build-image.sh) and the release files.
//!
//! The image is taken from target/image/ (CI builds it once with `make image` before the tests)
//! or built here when absent. It is unpacked with skopeo and umoci, its layout checked (a static
//! binary, uid 65532, the OCI labels, the CA bundle, nothing else), and the operator runs from the
//! unpacked root file system, chrooted as the image's user with the image's entrypoint, against
//! the testbed with nothing but a token of the chart's ServiceAccount, mounted where Kubernetes
//! mounts it: a whole maintenance goes through. The binary carries its dependency list (cargo
//! auditable), and the SBOM beside the archive is made from it. A missing tool fails the test
//! with how to install it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::config::Kubeconfig;
use maintenance_crds::Phase;
use serde_json::Value;
use support::chart::*;
use support::operator::*;
use support::*;

const MINUTE: Duration = Duration::from_secs(60);
const UID: u64 = 65532;

fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false)
}

/// Fails with how to install `tool` unless it is on PATH.
fn require(tool: &str, package: &str) -> Result<()> {
    ensure!(
        on_path(tool),
        "{tool} is not installed: apt-get install --no-install-recommends {package} (.ci/run \
         installs it)"
    );
    Ok(())
}

/// Fails unless `tool`, one of the Rust tools scripts/install-test-deps installs from crates.io,
/// is on PATH.
pub(crate) fn require_cargo_tool(tool: &str) -> Result<()> {
    ensure!(
        on_path(tool),
        "{tool} is not installed: scripts/install-test-deps installs it"
    );
    Ok(())
}

/// The OCI archive of `make image`, built once if absent.
pub(crate) fn image_archive() -> Result<PathBuf> {
    static ARCHIVE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let archive = ARCHIVE.get_or_init(|| {
        let path = repo().join(format!(
            "target/image/maintenance-operator-{}.oci.tar",
            version()
        ));
        if path.is_file() {
            return Ok(path);
        }
        eprintln!("{} is absent: building it (make image)", path.display());
        run(&mut Command::new(repo().join("deploy/build-image.sh")))
            .map(|out| repo().join(out.trim()))
            .map_err(|e| format!("{e:#}"))
    });
    archive
        .clone()
        .map_err(|e| anyhow!("building the image: {e}"))
}

/// The image unpacked by umoci: `dir/bundle/rootfs` and the runtime config `dir/bundle/config.json`.
struct Unpacked {
    _dir: tempfile::TempDir,
    bundle: PathBuf,
    config: Value,
    /// The image configuration (labels, user, entrypoint) as skopeo reads it.
    image_config: Value,
}

impl Unpacked {
    fn rootfs(&self) -> PathBuf {
        self.bundle.join("rootfs")
    }
}

fn unpack() -> Result<Unpacked> {
    require("skopeo", "skopeo")?;
    require("umoci", "umoci")?;
    let archive = image_archive()?;
    let dir = tempfile::tempdir()?;
    let layout = dir.path().join("layout");
    let source = format!("oci-archive:{}", archive.display());
    run(Command::new("skopeo")
        .args(["copy", "--quiet", &source])
        .arg(format!("oci:{}:image", layout.display())))?;
    let bundle = dir.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:image", layout.display()))
        .arg(&bundle))?;
    let config: Value = serde_json::from_str(&read(&bundle.join("config.json"))?)?;
    let image_config: Value = serde_json::from_str(&run(
        Command::new("skopeo").args(["inspect", "--config", &source])
    )?)?;
    Ok(Unpacked {
        _dir: dir,
        bundle,
        config,
        image_config,
    })
}

/// Every file (not directory) under `root`, as absolute paths inside it.
fn files(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                stack.push(entry.path());
            } else {
                let rel = entry
                    .path()
                    .strip_prefix(root)?
                    .to_string_lossy()
                    .into_owned();
                out.push(format!("/{rel}"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Whether an ELF64 little-endian file asks for a program interpreter (PT_INTERP): a
/// dynamically linked binary does, a static one does not.
fn has_interpreter(elf: &[u8]) -> Result<bool> {
    ensure!(
        elf.len() > 64 && &elf[..4] == b"\x7fELF" && elf[4] == 2 && elf[5] == 1,
        "not an ELF64 little-endian file"
    );
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[32..40].try_into()?) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        let kind = elf
            .get(at..at + 4)
            .context("program header past the end of the file")?;
        if u32::from_le_bytes(kind.try_into()?) == 3 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The section names of an ELF64 little-endian file, from its section header table and the
/// string table that names them.
fn section_names(elf: &[u8]) -> Result<Vec<String>> {
    let field = |at: usize, len: usize| -> Result<usize> {
        let bytes = elf
            .get(at..at + len)
            .context("ELF header past the end of the file")?;
        Ok(bytes
            .iter()
            .rev()
            .fold(0usize, |value, &byte| value << 8 | usize::from(byte)))
    };
    let (shoff, shentsize, shnum) = (field(0x28, 8)?, field(0x3a, 2)?, field(0x3c, 2)?);
    let header = |index: usize| shoff + index * shentsize;
    let names = field(header(field(0x3e, 2)?) + 0x18, 8)?;
    (0..shnum)
        .map(|index| {
            let start = names + field(header(index), 4)?;
            let rest = elf
                .get(start..)
                .context("section name past the end of the file")?;
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
        })
        .collect()
}

/// The versions of each package in Cargo.lock, by name.
fn locked_versions() -> Result<BTreeMap<String, Vec<String>>> {
    let lock = read(&repo().join("Cargo.lock"))?;
    let mut versions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for package in lock.split("[[package]]").skip(1) {
        let value = |key: &str| {
            package.lines().find_map(|line| {
                line.strip_prefix(&format!("{key} = \""))
                    .and_then(|rest| rest.strip_suffix('"'))
            })
        };
        let (name, version) = value("name")
            .zip(value("version"))
            .context("a package of Cargo.lock without name or version")?;
        versions
            .entry(name.to_string())
            .or_default()
            .push(version.to_string());
    }
    Ok(versions)
}

/// The image the chart deploys by default (from the checked-in rendering of the chart, which
/// tests/release/helm_chart.rs keeps equal to `helm template`).
fn chart_image() -> Result<String> {
    let docs = parse_docs(&read(&manifests_path())?)?;
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .context("no Deployment in the manifests")?;
    deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .map(str::to_string)
        .context("the Deployment's container has no image")
}

#[test]
fn image_layout_is_static_non_root_and_labelled() -> Result<()> {
    require("file", "file")?;
    let image = unpack()?;

    // Nothing but the binary and the CA bundle.
    let rootfs = image.rootfs();
    let have = files(&rootfs)?;
    ensure!(
        have == [
            "/etc/ssl/certs/ca-certificates.crt",
            "/usr/local/bin/maintenance-operator"
        ],
        "the image holds {have:?}"
    );
    let ca = read(&rootfs.join("etc/ssl/certs/ca-certificates.crt"))?;
    ensure!(
        ca.matches("BEGIN CERTIFICATE").count() > 50,
        "the CA bundle holds too few certificates"
    );

    let binary = rootfs.join("usr/local/bin/maintenance-operator");
    let elf = std::fs::read(&binary)?;
    ensure!(
        !has_interpreter(&elf)?,
        "the binary has a PT_INTERP: it is dynamically linked"
    );
    let described = run(Command::new("file").arg("-b").arg(&binary))?;
    ensure!(
        described.contains("statically linked") || described.contains("static-pie linked"),
        "file says: {described}"
    );
    ensure!(described.contains("x86-64"), "file says: {described}");

    // The runtime config: the image's user and entrypoint.
    let process = &image.config["process"];
    ensure!(
        process["user"]["uid"] == UID && process["user"]["gid"] == UID,
        "the image runs as {}",
        process["user"]
    );
    ensure!(
        process["args"] == serde_json::json!(["/usr/local/bin/maintenance-operator", "run"]),
        "entrypoint and command {}",
        process["args"]
    );

    let config = &image.image_config["config"];
    let labels = &config["Labels"];
    let label = |key: &str| {
        labels[format!("org.opencontainers.image.{key}")]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    ensure!(label("title") == "maintenance-operator", "labels {labels}");
    ensure!(label("version") == version(), "labels {labels}");
    ensure!(label("licenses") == "Apache-2.0", "labels {labels}");
    ensure!(
        label("source").starts_with("https://github.com/"),
        "labels {labels}"
    );
    let revision = label("revision");
    ensure!(
        revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit()),
        "the revision label is {revision:?}, want the commit the image was built from"
    );
    ensure!(config["User"] == "65532:65532", "User {}", config["User"]);
    // /metrics (HTTPS) and the probes.
    ensure!(
        config["ExposedPorts"] == serde_json::json!({ "8443/tcp": {}, "8081/tcp": {} }),
        "ports {}",
        config["ExposedPorts"]
    );

    // The archive's name is the chart's default image.
    let index = run(Command::new("tar")
        .arg("-xOf")
        .arg(image_archive()?)
        .arg("index.json"))?;
    let index: Value = serde_json::from_str(&index)?;
    let name = index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .unwrap_or_default();
    ensure!(
        name == chart_image()?,
        "make image names the image {name:?}, the chart deploys {:?}",
        chart_image()?
    );
    Ok(())
}

/// `make image` built the binary with cargo auditable: it carries its dependency list (the
/// .dep-v0 section). Beside the archive, the SBOM made from that list by auditable2cdx: CycloneDX
/// JSON naming the operator and the crates it was built from at Cargo.lock's versions (and none
/// of the tests' crates, such as proptest), equal to what auditable2cdx reads from
/// the image's binary, and whose sha256 the image's label io.github.maintenance-operator.sbom.digest
/// holds.
#[test]
fn image_binary_carries_its_dependency_list_and_the_sbom_beside_it() -> Result<()> {
    require_cargo_tool("auditable2cdx")?;
    let archive = image_archive()?;
    let sbom_path = archive.with_file_name(format!("maintenance-operator-{}.cdx.json", version()));
    let sbom_text = read(&sbom_path).context("make image writes the SBOM beside the archive")?;
    let sbom: Value = serde_json::from_str(&sbom_text)
        .with_context(|| format!("{} is no JSON", sbom_path.display()))?;
    ensure!(
        sbom["bomFormat"] == "CycloneDX",
        "bomFormat {}",
        sbom["bomFormat"]
    );
    ensure!(
        sbom["specVersion"].is_string(),
        "specVersion {}",
        sbom["specVersion"]
    );
    let operator = &sbom["metadata"]["component"];
    ensure!(
        operator["name"] == "maintenance-operator" && operator["version"] == version(),
        "the SBOM describes {operator}, want maintenance-operator {}",
        version()
    );
    let mut components: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for component in sbom["components"]
        .as_array()
        .context("the SBOM lists no components")?
    {
        let (Some(name), Some(version)) =
            (component["name"].as_str(), component["version"].as_str())
        else {
            anyhow::bail!("a component without name or version: {component}");
        };
        components
            .entry(name.to_string())
            .or_default()
            .push(version.to_string());
    }
    let locked = locked_versions()?;
    for name in [
        "kube",
        "kube-client",
        "k8s-openapi",
        "tokio",
        "rustls",
        "ring",
        "maintenance-core",
    ] {
        ensure!(
            components
                .get(name)
                .is_some_and(|v| Some(v) == locked.get(name)),
            "the SBOM lists {name} at {:?}, Cargo.lock at {:?}",
            components.get(name),
            locked.get(name)
        );
    }
    for (name, versions) in &components {
        ensure!(
            versions
                .iter()
                .all(|v| locked.get(name).is_some_and(|l| l.contains(v))),
            "the SBOM lists {name} {versions:?}, which Cargo.lock does not"
        );
    }
    ensure!(
        !components.contains_key("proptest"),
        "the SBOM lists proptest, which only the tests use: it is not the binary's"
    );

    let image = unpack()?;
    let binary = image.rootfs().join("usr/local/bin/maintenance-operator");
    let sections = section_names(&std::fs::read(&binary)?)?;
    ensure!(
        sections.iter().any(|s| s == ".dep-v0"),
        "the image's binary has no .dep-v0 section: it was not built with cargo auditable \
         (sections {sections:?})"
    );
    let from_binary = run(Command::new("auditable2cdx").arg(&binary))?;
    ensure!(
        from_binary == sbom_text,
        "{} is not the SBOM of the image's binary",
        sbom_path.display()
    );

    let sha256 = run(Command::new("sha256sum").arg(&sbom_path))?;
    let digest = format!(
        "sha256:{}",
        sha256.split_whitespace().next().unwrap_or_default()
    );
    let label =
        &image.image_config["config"]["Labels"]["io.github.maintenance-operator.sbom.digest"];
    ensure!(
        label.as_str() == Some(digest.as_str()),
        "the image's SBOM label is {label}, the SBOM's digest {digest}"
    );
    Ok(())
}

/// The Dockerfile's runtime stage, with its builder sources, equals deploy/Containerfile: Docker
/// users get the image `make image` builds.
#[test]
fn dockerfile_and_containerfile_give_the_same_layout() -> Result<()> {
    let runtime = |text: &str| -> Vec<String> {
        let lines: Vec<&str> = text.lines().collect();
        let from = lines
            .iter()
            .rposition(|l| l.starts_with("FROM "))
            .unwrap_or(0);
        lines[from..]
            .iter()
            .map(|l| l.replace("COPY --from=builder /out/", "COPY "))
            .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
            .collect()
    };
    let docker = runtime(&read(&repo().join("deploy/Dockerfile"))?);
    let buildah = runtime(&read(&repo().join("deploy/Containerfile"))?);
    ensure!(
        docker == buildah,
        "deploy/Dockerfile's runtime stage:\n{}\n\ndeploy/Containerfile:\n{}",
        docker.join("\n"),
        buildah.join("\n")
    );
    ensure!(docker[0] == "FROM scratch", "{}", docker[0]);
    Ok(())
}

/// `make lint-release` leaves the plugin archive it packed and the manifest rendered from it in
/// target/krew/: the manifest's sha256, bin and files hold for the archive.
#[test]
fn krew_manifest_matches_the_plugin_archive() -> Result<()> {
    let dir = repo().join("target/krew");
    let tag = format!("v{}", version());
    if !dir.join("maintenance.yaml").is_file() {
        run(&mut Command::new(repo().join("deploy/lint-release.sh")))?;
    }
    let manifest: Value = serde_norway::from_str(&read(&dir.join("maintenance.yaml"))?)?;
    ensure!(manifest["metadata"]["name"] == "maintenance");
    ensure!(manifest["spec"]["version"] == tag.as_str());
    let platforms = manifest["spec"]["platforms"]
        .as_array()
        .context("no platforms")?;
    let linux = platforms
        .iter()
        .find(|p| p["selector"]["matchLabels"]["os"] == "linux")
        .context("no linux platform")?;
    let file = format!("kubectl-maintenance-{tag}-linux-amd64.tar.gz");
    ensure!(
        linux["uri"]
            .as_str()
            .is_some_and(|u| u.ends_with(&format!("/releases/download/{tag}/{file}"))),
        "uri {}",
        linux["uri"]
    );
    let sha = run(Command::new("sha256sum").arg(dir.join(&file)))?;
    ensure!(
        linux["sha256"].as_str() == sha.split_whitespace().next(),
        "the manifest's sha256 {} is not the archive's {sha}",
        linux["sha256"]
    );
    let listing = run(Command::new("tar").arg("-tzf").arg(dir.join(&file)))?;
    for name in ["kubectl-maintenance", "kubectl_complete-maintenance"] {
        ensure!(
            listing.lines().any(|l| l.trim_start_matches("./") == name),
            "{name} is not in {file}: {listing}"
        );
    }
    ensure!(linux["bin"] == "kubectl-maintenance");
    Ok(())
}

/// The image's entrypoint, chrooted into the unpacked root file system as the image's user, with
/// the in-cluster configuration a pod gets: KUBERNETES_SERVICE_HOST/PORT and the ServiceAccount
/// token and CA under /var/run/secrets/kubernetes.io/serviceaccount.
fn in_cluster_launcher(image: &Unpacked, testbed: &Testbed, token: &str) -> Result<Vec<OsString>> {
    let rootfs = image.rootfs();
    let secrets = rootfs.join("var/run/secrets/kubernetes.io/serviceaccount");
    std::fs::create_dir_all(&secrets)?;
    std::fs::write(secrets.join("token"), token)?;
    std::fs::copy(testbed.dir().join("pki/ca.crt"), secrets.join("ca.crt"))
        .context("copying the testbed's CA")?;
    std::fs::write(secrets.join("namespace"), OPERATOR_NAMESPACE)?;

    let admin = Kubeconfig::read_from(testbed.kubeconfig_path())?;
    let server = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.server.clone())
        .context("the testbed kubeconfig names no server")?;
    let (host, port) = server
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .rsplit_once(':')
        .with_context(|| format!("server {server} without a port"))?;

    let process = &image.config["process"];
    let user = format!(
        "--userspec={}:{}",
        process["user"]["uid"], process["user"]["gid"]
    );
    let mut launcher: Vec<OsString> = vec!["env".into(), "-i".into()];
    for var in process["env"].as_array().into_iter().flatten() {
        launcher.extend(var.as_str().map(OsString::from));
    }
    launcher.push(format!("KUBERNETES_SERVICE_HOST={host}").into());
    launcher.push(format!("KUBERNETES_SERVICE_PORT={port}").into());
    launcher.push("RUST_LOG=info,kube=warn".into());
    launcher.extend(["chroot".into(), user.into(), rootfs.into_os_string()]);
    for arg in process["args"].as_array().context("no args")? {
        launcher.push(arg.as_str().context("an arg that is no string")?.into());
    }
    Ok(launcher)
}

#[tokio::test]
async fn operator_from_the_image_runs_a_maintenance_with_the_chart_rbac() -> Result<()> {
    require("chroot", "coreutils")?;
    ensure!(
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n")),
        "running the image's root file system needs chroot, which needs root: run the tests as \
         root (as CI does)"
    );
    let image = unpack()?;
    let chart = ChartOnTestbed::install().await?;
    let (testbed, client, dir) = (chart.testbed, &chart.client, &chart.dir);
    // A token of the chart's ServiceAccount, as the kubelet would mount it.
    let kubeconfig = chart.service_account_kubeconfig().await?;
    let written: Value = serde_norway::from_str(&read(&kubeconfig)?)?;
    let token = written["users"][0]["user"]["token"]
        .as_str()
        .context("no token in the ServiceAccount kubeconfig")?
        .to_string();
    let launcher = in_cluster_launcher(&image, testbed, &token)?;
    // KUBECONFIG points nowhere inside the chroot: the operator must use the in-cluster config.
    let operator = Operator::start_launched(
        launcher,
        Path::new("/nonexistent/kubeconfig"),
        dir.path(),
        &["--leader-elect", "--lease-name", "maintenance-operator"],
    )
    .await?;

    let result = maintenance(client).await;
    if result.is_err() {
        eprintln!(
            "operator log:\n{}",
            std::fs::read_to_string(&operator.log).unwrap_or_default()
        );
    }
    result
}

async fn maintenance(client: &kube::Client) -> Result<()> {
    let (ns, node) = two_nodes_with_a_web_deployment(client, "image").await?;

    let mut spec = request_spec(&node, "image-test.maintenance.nvidia.com");
    spec.drain_spec = drain_spec(true, 0);
    create_request(client, &ns, "from-image", spec).await?;
    wait_phase(client, &ns, "from-image", Phase::Ready, 2 * MINUTE).await?;
    ensure!(
        node_unschedulable(client, &node).await?,
        "{node} is not cordoned although its maintenance is Ready"
    );
    let left = Api::<Pod>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    ensure!(
        left.items.is_empty(),
        "{node} still runs {} pods although its maintenance is Ready",
        left.items.len()
    );

    release_request(client, &ns, "from-image", MINUTE).await?;
    wait_for(&format!("{node} to be uncordoned"), MINUTE, || async {
        Ok((!node_unschedulable(client, &node).await?).then_some(()))
    })
    .await?;
    Ok(())
}

#[test]
fn a_missing_tool_fails_with_how_to_install_it() {
    let err = require("no-such-tool-here", "no-such-package")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("apt-get install --no-install-recommends no-such-package"),
        "{err}"
    );
}
