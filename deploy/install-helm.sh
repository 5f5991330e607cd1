#!/usr/bin/env bash
# Installs helm (v3) from the Go module proxy into a per-version cache and prints its path.
# Idempotent: a second run finds the cached binary and only prints the path.
#
#   deploy/install-helm.sh            # prints e.g. ~/.cache/maintenance-operator/helm-v3.22.0/helm
#   HELM_VERSION=v3.21.4 deploy/install-helm.sh
#
# Needs Go: helm v3.22 declares go 1.26 (an older go fetches that toolchain by itself when
# GOTOOLCHAIN allows it).
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.22.0}
CACHE_ROOT=${XDG_CACHE_HOME:-$HOME/.cache}/maintenance-operator
DIR=$CACHE_ROOT/helm-$HELM_VERSION
HELM=$DIR/helm

log() { printf 'install-helm: %s\n' "$*" >&2; }

if [[ -x $HELM ]]; then
	echo "$HELM"
	exit 0
fi

command -v go >/dev/null || {
	log "error: go is needed to build helm $HELM_VERSION (https://go.dev/dl/), or put a helm binary at $HELM"
	exit 1
}
mkdir -p "$CACHE_ROOT"
# Two test binaries starting at once on a fresh machine must not both build.
exec 9>"$CACHE_ROOT/helm.lock"
flock 9
if [[ ! -x $HELM ]]; then
	staging=$(mktemp -d "$CACHE_ROOT/helm-build.XXXXXX")
	trap 'rm -rf "$staging"' EXIT
	log "building helm $HELM_VERSION into $DIR (once per machine; takes a few minutes)"
	# Run outside any module of the caller, with no vendor directory or go.work in the way.
	cd "$staging"
	export GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0 GOBIN="$staging"
	# Stamp what helm's Makefile stamps: its version, and the Kubernetes version of its client-go
	# (without it `helm template` assumes Kubernetes 1.20 and refuses charts needing newer ones).
	gomod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
	client_go=$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$gomod")
	[[ $client_go =~ ^v0\.([0-9]+)\. ]] || {
		log "error: cannot find the k8s.io/client-go version of helm $HELM_VERSION in $gomod"
		exit 1
	}
	k8s_minor=${BASH_REMATCH[1]}
	ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
	for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
		ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
	done
	go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
	mkdir -p "$DIR"
	mv "$staging/helm" "$HELM.tmp"
	mv "$HELM.tmp" "$HELM"
fi
echo "$HELM"
