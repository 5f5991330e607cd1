#!/usr/bin/env bash
# Builds the operator image without Docker (`make image`): a static musl binary and the CA
# certificates in an image FROM scratch, run as uid/gid 65532, written as an OCI archive to
# target/image/maintenance-operator-<version>.oci.tar. deploy/Containerfile says what is in it; its
# layout is the runtime stage of deploy/Dockerfile (for builds with Docker).
#
# The binary is built with cargo auditable: it carries its dependency list (every crate it is built
# from, with its version and source) in a .dep-v0 section, which `cargo audit bin`, trivy and syft read.
# auditable2cdx turns that list into the SBOM beside the archive,
# target/image/maintenance-operator-<version>.cdx.json (CycloneDX JSON), so the SBOM describes
# exactly what the binary was built from; the image's label io.github.maintenance-operator.sbom.digest holds its sha256.
#
# Needs buildah (Debian: buildah), musl-gcc (Debian: musl-tools), the Rust target
# (rustup target add x86_64-unknown-linux-musl), cargo-auditable and auditable2cdx
# (scripts/install-test-deps installs them). Prints the archive's path.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "build-image: $*" >&2; exit 1; }
command -v buildah >/dev/null || fail "buildah is missing: apt-get install --no-install-recommends buildah"
command -v musl-gcc >/dev/null || fail "musl-gcc is missing: apt-get install --no-install-recommends musl-tools"
target=x86_64-unknown-linux-musl
rustup target list --installed 2>/dev/null | grep -qx "$target" ||
	fail "the Rust target $target is missing: rustup target add $target"
for tool in cargo-auditable auditable2cdx; do
	command -v "$tool" >/dev/null || fail "$tool is missing: scripts/install-test-deps installs it"
done
ca=/etc/ssl/certs/ca-certificates.crt
[[ -f $ca ]] || fail "$ca is missing: apt-get install ca-certificates"

# One source for each fact: the version from Cargo.toml (the chart's appVersion equals it), the
# image name from the chart's values, the source URL from Cargo.toml.
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
source_url=$(sed -n 's/^repository = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
license=$(sed -n 's/^license = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
repository=$(awk '/^image:/ { in_image = 1; next } /^[^ #]/ { in_image = 0 }
	in_image && $1 == "repository:" { print $2; exit }' deploy/chart/maintenance-operator/values.yaml)
[[ -n $version && -n $source_url && -n $license && -n $repository ]] ||
	fail "cannot read the version, repository or license from Cargo.toml, or image.repository from the chart"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
image="$repository:$version"

cargo auditable build --release --locked --target "$target" --bin maintenance-operator >&2
binary="target/$target/release/maintenance-operator"

out=target/image
context="$out/context"
rm -rf "$context"
mkdir -p "$context"
cp "$binary" "$context/maintenance-operator"
sbom="$out/maintenance-operator-$version.cdx.json"
auditable2cdx "$binary" >"$sbom"
sbom_digest=sha256:$(sha256sum "$sbom" | cut -d' ' -f1)
cp "$ca" "$context/ca-certificates.crt"

archive="$out/maintenance-operator-$version.oci.tar"
storage=(--storage-driver vfs)
# --timestamp 0: the same inputs give the same image digest.
buildah "${storage[@]}" bud --isolation chroot --format oci --timestamp 0 --quiet \
	--build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
	--build-arg "SOURCE=$source_url" --build-arg "LICENSE=$license" \
	--build-arg "SBOM_DIGEST=$sbom_digest" \
	-f deploy/Containerfile -t "$image" "$context" >&2
rm -f "$archive"
buildah "${storage[@]}" push --quiet "$image" "oci-archive:$archive:$image" >&2
buildah "${storage[@]}" rmi "$image" >/dev/null
echo "$archive"
