#!/usr/bin/env bash
# Packs the kubectl plugin of one platform into the archive that the krew manifest and the
# GitHub release point at, and prints its path:
#
#   deploy/package-plugin.sh VERSION OS ARCH BIN_DIR DIST
#   # -> DIST/kubectl-maintenance-VERSION-OS-ARCH.tar.gz
#
# BIN_DIR holds kubectl-maintenance and kubectl_complete-maintenance built for OS/ARCH. The
# archive is reproducible (sorted, no timestamps or owners).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "package-plugin: $*" >&2; exit 1; }
(($# == 5)) || fail "usage: deploy/package-plugin.sh VERSION OS ARCH BIN_DIR DIST"
version=$1 os=$2 arch=$3 bin=$4 dist=$5
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
for name in kubectl-maintenance kubectl_complete-maintenance; do
	[[ -x $bin/$name ]] || fail "$bin/$name is missing: build it for $os/$arch first"
	install -m 0755 "$bin/$name" "$staging/$name"
done
install -m 0644 README.md "$staging/README.md"
[[ ! -f LICENSE ]] || install -m 0644 LICENSE "$staging/LICENSE"
mkdir -p "$dist"
archive="$(cd "$dist" && pwd)/kubectl-maintenance-$version-$os-$arch.tar.gz"
tar -C "$staging" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - . |
	gzip -n -9 >"$archive"
echo "$archive"
