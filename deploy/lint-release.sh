#!/usr/bin/env bash
# `make lint-release`: checks the release files with the tools their ecosystems use.
#  - the krew manifest: packs the plugin for linux/amd64 (built here), renders
#    deploy/krew/maintenance.yaml with that archive's sha256 into target/krew/maintenance.yaml
#    and runs krew's validate-krew-manifest (v0.4.3) on it;
#  - the GitHub workflows: actionlint (v1.7.12).
# The Go tools are built once per machine from the Go module proxy into ~/.cache.
set -euo pipefail
cd "$(dirname "$0")/.."

tools=${XDG_CACHE_HOME:-$HOME/.cache}/maintenance-operator/release-tools
install_tool() { # NAME MODULE@VERSION
	local name=$1 module=$2 dir="$tools/${2##*@}"
	if [[ ! -x $dir/$name ]]; then
		command -v go >/dev/null || { echo "lint-release: go is needed to build $name" >&2; exit 1; }
		echo "lint-release: building $module into $dir (once per machine)" >&2
		(cd /tmp && GOBIN="$dir" GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0 go install "$module" >&2)
	fi
	echo "$dir/$name"
}
validate=$(install_tool validate-krew-manifest sigs.k8s.io/krew/cmd/validate-krew-manifest@v0.4.3)
actionlint=$(install_tool actionlint github.com/rhysd/actionlint/cmd/actionlint@v1.7.12)
# --install-tools: only the tools (CI builds them while the image builds).
[[ ${1:-} != --install-tools ]] || exit 0

"$actionlint" .github/workflows/*.yml
echo "lint-release: actionlint: the workflows are valid" >&2

target=x86_64-unknown-linux-musl
# cargo auditable, as the release builds the plugin (and as `make image` builds the operator, whose
# workspace crates this build then reuses).
command -v cargo-auditable >/dev/null ||
	{ echo "lint-release: cargo-auditable is missing: scripts/install-test-deps installs it" >&2; exit 1; }
cargo auditable build --release --locked --target "$target" --bin kubectl-maintenance --bin kubectl_complete-maintenance >&2
version=v$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
repository=$(sed -n 's/^repository = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
dist=target/krew
rm -rf "$dist"
deploy/package-plugin.sh "$version" linux amd64 "target/$target/release" "$dist" >/dev/null
deploy/krew/render.sh "$version" "$repository/releases/download/$version" "$dist" >"$dist/maintenance.yaml"
# -skip-install: the install would download the release from GitHub, which does not exist yet
# for this commit; tests/release/image.rs checks the archive against the rendered manifest instead.
"$validate" -manifest "$dist/maintenance.yaml" -skip-install
echo "lint-release: validate-krew-manifest: $dist/maintenance.yaml is valid" >&2
