#!/usr/bin/env bash
# Renders the krew manifest (deploy/krew/maintenance.yaml, a template) to stdout, with the
# sha256 of each plugin archive found in DIST (named by deploy/package-plugin.sh):
#
#   deploy/krew/render.sh VERSION BASE_URL DIST [--all]
#
# VERSION is the release tag (v0.1.0), BASE_URL where the archives are downloaded from (the
# GitHub release's download URL). A platform without its archive is left out, with a note on
# stderr; --all makes that an error (the release workflow passes it).
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "krew/render: $*" >&2; exit 1; }
(($# >= 3)) || fail "usage: deploy/krew/render.sh VERSION BASE_URL DIST [--all]"
version=$1 base=${2%/} dist=$3 all=${4:-}
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+ ]] || fail "VERSION must be a tag such as v0.1.0, not '$version'"
homepage=$(sed -n 's/^repository = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
[[ -n $homepage ]] || fail "Cargo.toml names no repository"

platforms=""
for platform in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64; do
	os=${platform%/*} arch=${platform#*/}
	file="kubectl-maintenance-$version-$os-$arch.tar.gz"
	if [[ ! -f $dist/$file ]]; then
		[[ $all == --all ]] && fail "$dist/$file is missing"
		echo "krew/render: no $dist/$file: $platform left out of the manifest" >&2
		continue
	fi
	sha=$(sha256sum "$dist/$file" | cut -d' ' -f1)
	platforms+="  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $base/$file
    sha256: $sha
    bin: kubectl-maintenance
    files:
    - from: \"*\"
      to: .
"
done
[[ -n $platforms ]] || fail "no plugin archive in $dist (deploy/package-plugin.sh makes them)"

template=$(<deploy/krew/maintenance.yaml)
# Drop the template's own comment: the rendered manifest starts at apiVersion.
template=${template#*$'\n'apiVersion:}
template="apiVersion:$template"
template=${template//'${VERSION}'/$version}
template=${template//'${HOMEPAGE}'/$homepage}
template=${template//'${PLATFORMS}'/${platforms%$'\n'}}
printf '%s\n' "$template"
