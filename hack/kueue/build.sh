#!/usr/bin/env bash
# Build Kueue's manager (the baseline of bench/bench_kueue.py) and take its CRDs, from the Go
# module proxy, into the binary cache beside the control-plane binaries.
#
# Usage: hack/kueue/build.sh [VERSION]   (default: the version pinned below). Prints the output
# directory on stdout: `kueue` (the manager, `sigs.k8s.io/kueue/cmd/kueue`), `crds/` (the CRDs of
# the same module version, from config/components/crd/bases) and `controller_manager_config.yaml`
# (Kueue's default configuration, for reference).
#
# Why `go install pkg@version`: Kueue's go.mod has no replace directives, so the module builds as
# its own main module with exactly the dependency versions (and go.sum) Kueue released, with no
# wrapper module to keep in step. One package at a time (`-p 1`, override with
# KOORD_QUEUE_BUILD_PARALLELISM): the machine has two cores and is shared with tests.
#
# Like hack/build-binaries.sh: the directory is keyed by everything that changes the bytes (Kueue's
# version, the Go toolchain, the platform, this script), built into `<dir>.tmp`, checked (the
# binary must embed the module version asked for), then renamed, all under a lock of its own, so a
# crashed or concurrent build never leaves a half-written directory behind and never waits on an
# unrelated build's lock.
set -euo pipefail

version="${1:-v0.17.0}"
module="sigs.k8s.io/kueue"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=
log() { echo "kueue-build: $*" >&2; }

script_sum="$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)"
root="${KOORD_QUEUE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/koord-queue-py/bin}"
out="$root/kueue-${version}_$(go env GOVERSION)_$(go env GOOS)-$(go env GOARCH)_${script_sum}"
mkdir -p "$root"
exec 9>"$root/.kueue.lock"
flock 9
if [[ -x "$out/kueue" && -d "$out/crds" ]]; then
  echo "$out"
  exit 0
fi
tmp="$out.tmp"
rm -rf "$tmp"
mkdir -p "$tmp/crds"
start=$SECONDS
log "downloading $module@$version"
src="$(go mod download -json "$module@$version" | awk -F'"' '$2 == "Dir" {print $4}')"
[[ -d "$src/cmd/kueue" ]] || { log "no cmd/kueue in $src"; exit 1; }
log "building $module/cmd/kueue@$version (one package at a time; a cold build takes 10-20 minutes on 2 cores)"
GOBIN="$tmp" go install -p "${KOORD_QUEUE_BUILD_PARALLELISM:-1}" -trimpath \
  -ldflags="-s -w -X $module/pkg/version.GitVersion=$version" "$module/cmd/kueue@$version"
go version -m "$tmp/kueue" | grep -q "mod[[:space:]]*$module[[:space:]]*$version" \
  || { log "built binary does not embed $module $version"; exit 1; }
cp "$src"/config/components/crd/bases/*.yaml "$tmp/crds/"
cp "$src/config/components/manager/controller_manager_config.yaml" "$tmp/"
chmod -R u+w "$tmp"
rm -rf "$out"
mv "$tmp" "$out"
log "done in $((SECONDS - start))s: $out"
echo "$out"
