//! deny.toml, which `make lint` checks the dependency graph against (scripts/supply-chain): a
//! crate from anywhere but crates.io fails it. The SBOM and the dependency list of the image's
//! binary are checked in `image`.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use anyhow::{Result, ensure};
use support::chart::*;

use crate::image::require_cargo_tool;

/// `cargo deny check sources` with the repository's deny.toml on a scratch crate whose one
/// dependency, `dep`, is `dependency` (a TOML value).
fn check_sources(dir: &Path, dependency: &str) -> Result<Output> {
    let probe = dir.join("probe");
    std::fs::create_dir_all(probe.join("src"))?;
    std::fs::write(probe.join("src/lib.rs"), "")?;
    std::fs::write(
        probe.join("Cargo.toml"),
        format!(
            "[package]\nname = \"probe\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\
             license = \"Apache-2.0\"\npublish = false\n\n[workspace]\n\n\
             [dependencies]\ndep = {dependency}\n"
        ),
    )?;
    let _ = std::fs::remove_file(probe.join("Cargo.lock"));
    Ok(Command::new("cargo")
        .args(["deny", "--manifest-path"])
        .arg(probe.join("Cargo.toml"))
        .arg("--config")
        .arg(repo().join("deny.toml"))
        .args(["check", "sources"])
        // The git dependency is cloned into this CARGO_HOME, not the user's.
        .env("CARGO_HOME", dir.join("cargo-home"))
        .stdin(Stdio::null())
        .output()?)
}

/// The same crate passes as a path dependency and fails from a git repository (a local one: no
/// network needed), for its source alone.
#[test]
fn deny_toml_refuses_a_crate_from_a_git_repository() -> Result<()> {
    require_cargo_tool("cargo-deny")?;
    let dir = tempfile::tempdir()?;
    let dep = dir.path().join("dep");
    std::fs::create_dir_all(dep.join("src"))?;
    std::fs::write(dep.join("src/lib.rs"), "")?;
    std::fs::write(
        dep.join("Cargo.toml"),
        "[package]\nname = \"dep\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\
         license = \"Apache-2.0\"\n\n[workspace]\n",
    )?;
    let git = |args: &[&str]| run(Command::new("git").current_dir(&dep).args(args));
    git(&["init", "--quiet", "--initial-branch", "main"])?;
    git(&["add", "."])?;
    git(&[
        "-c",
        "user.name=probe",
        "-c",
        "user.email=probe@example.com",
        "commit",
        "--quiet",
        "-m",
        "dep",
    ])?;
    let path = check_sources(dir.path(), &format!("{{ path = {:?} }}", dep.display()))?;
    ensure!(
        path.status.success(),
        "a path dependency fails cargo deny's sources check:\n{}",
        String::from_utf8_lossy(&path.stderr)
    );
    let url = format!("file://{}", dep.display());
    let git = check_sources(
        dir.path(),
        &format!("{{ git = {url:?}, branch = \"main\" }}"),
    )?;
    let stderr = String::from_utf8_lossy(&git.stderr);
    ensure!(
        !git.status.success(),
        "deny.toml lets a git dependency through:\n{stderr}"
    );
    ensure!(
        stderr.contains("source-not-allowed") && stderr.contains(&url),
        "cargo deny failed, but not on the git source:\n{stderr}"
    );
    Ok(())
}
