#!/usr/bin/env bash
# Build the control-plane binaries the tests, `make run` and the benchmarks use:
# kube-apiserver, kube-controller-manager, kube-scheduler, etcd (from hack/k8sbins)
# and kwok (from hack/kwokbin), straight from the Go module proxy.
#
# Why a script and not `go install`: k8s.io/kubernetes needs replace directives for its
# staging modules, which `go install pkg@version` refuses. The wrapper modules pin every
# version; their go.sum files are committed so the build is reproducible.
#
# The output lives outside the work tree (CI clones afresh on the same machine) in a
# directory keyed by everything that changes the bytes. It is built into `<dir>.tmp`,
# checked with --version, then renamed, all under a lock, so a crashed or concurrent
# build never leaves a half-written directory behind. Prints the directory on stdout.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod

k8s_version="$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2}; $1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$here/k8sbins/go.mod" | head -n1)"
etcd_version="$(awk '$1=="go.etcd.io/etcd/server/v3" && $2 ~ /^v/ {print $2}' "$here/k8sbins/go.mod")"
kwok_version="$(awk '$1=="sigs.k8s.io/kwok" && $2 ~ /^v/ {print $2}' "$here/kwokbin/go.mod")"
go_version="$(go env GOVERSION)"
sum="$(cat "$here/k8sbins/go.mod" "$here/k8sbins/go.sum" "$here/kwokbin/go.mod" "$here/kwokbin/go.sum" | sha256sum | cut -c1-12)"
key="k8s-${k8s_version}_etcd-${etcd_version}_kwok-${kwok_version}_${go_version}_$(go env GOOS)-$(go env GOARCH)_${sum}"
root="${KOORD_QUEUE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/koord-queue-py/bin}"
out="$root/$key"

mkdir -p "$root"
exec 9>"$root/.lock"
flock 9

if [[ -x "$out/kube-apiserver" && -x "$out/kwok" ]]; then
  echo "$out"
  exit 0
fi

log() { echo "build-binaries: $*" >&2; }
tmp="$out.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
start=$SECONDS

log "downloading modules (k8s $k8s_version, etcd $etcd_version, kwok $kwok_version)"
(cd "$here/k8sbins" && go mod download)
(cd "$here/kwokbin" && go mod download)

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=${k8s_version} -X k8s.io/client-go/pkg/version.gitVersion=${k8s_version}"
log "building kube-apiserver, kube-controller-manager, kube-scheduler (a cold build takes 15-30 minutes)"
(cd "$here/k8sbins" && GOFLAGS=-mod=readonly GOPROXY=off go build -trimpath -tags=selinux,notest \
  -ldflags="$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler)
log "building etcd"
(cd "$here/k8sbins" && GOFLAGS=-mod=readonly GOPROXY=off go build -trimpath -ldflags="-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
log "building kwok"
(cd "$here/kwokbin" && GOFLAGS=-mod=readonly GOPROXY=off go build -trimpath -ldflags="-s -w" -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok)

"$tmp/kube-apiserver" --version >&2
"$tmp/etcd" --version >&2
"$tmp/kwok" --version >&2 || true
rm -rf "$out"
mv "$tmp" "$out"
log "done in $((SECONDS - start))s: $out"
echo "$out"
