#!/usr/bin/env bash
# Build the control-plane binaries the tests, `make run` and the benchmarks use:
# kube-apiserver, kube-controller-manager, kube-scheduler, etcd (from hack/k8sbins)
# and kwok (from hack/kwokbin), straight from the Go module proxy.
#
# `build-binaries.sh helm` builds helm (from hack/helmbin, for the chart's tests) instead, into a
# directory of its own keyed by its own module files, so adding or bumping helm never invalidates
# the control-plane binaries (and they never rebuild helm). Same cache root, same lock.
#
# `build-binaries.sh operator NAME` builds a job operator the e2e tests run for real (from
# hack/operators/NAME: go.mod names the main package with a `tool` line, `crds` lists the CRD files
# to take from the module source) into `NAME-<version>_...` with the binary `NAME` and its CRDs in
# `crds/`. It compiles one package at a time on one thread (`-p 1`, GOMAXPROCS=1; override both with
# KOORD_QUEUE_BUILD_PARALLELISM): an operator is needed by one e2e module only, and its build must
# not starve tests running beside it.
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
log() { echo "build-binaries: $*" >&2; }

if [[ "${1:-}" == "helm" ]]; then
  helm_version="$(awk '$1=="helm.sh/helm/v3" && $2 ~ /^v/ {print $2}' "$here/helmbin/go.mod")"
  # helm's default Kubernetes version (`helm template`'s .Capabilities) is the client-go it is
  # built with, set by ldflags as helm's own Makefile does (v0.37 -> 1.37).
  client_go="$(awk '$1=="k8s.io/client-go" && $2 ~ /^v/ {print $2}' "$here/helmbin/go.mod")"
  k8s_minor="$(echo "$client_go" | cut -d. -f2)"
  helm_sum="$(cat "$here/helmbin/go.mod" "$here/helmbin/go.sum" | sha256sum | cut -c1-12)"
  root="${KOORD_QUEUE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/koord-queue-py/bin}"
  out="$root/helm-${helm_version}_k8s-1.${k8s_minor}_$(go env GOVERSION)_$(go env GOOS)-$(go env GOARCH)_${helm_sum}"
  mkdir -p "$root"
  exec 9>"$root/.lock"
  flock 9
  if [[ -x "$out/helm" ]]; then
    echo "$out"
    exit 0
  fi
  tmp="$out.tmp"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  start=$SECONDS
  log "downloading modules (helm $helm_version)"
  (cd "$here/helmbin" && go mod download)
  log "building helm (a cold build takes about 5 minutes)"
  (cd "$here/helmbin" && GOFLAGS=-mod=readonly GOPROXY=off go build -trimpath \
    -ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${helm_version} \
      -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${k8s_minor} \
      -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${k8s_minor}" \
    -o "$tmp/helm" helm.sh/helm/v3/cmd/helm)
  "$tmp/helm" version >&2
  rm -rf "$out"
  mv "$tmp" "$out"
  log "done in $((SECONDS - start))s: $out"
  echo "$out"
  exit 0
fi

if [[ "${1:-}" == "operator" ]]; then
  name="${2:?usage: build-binaries.sh operator NAME (a directory of hack/operators)}"
  dir="$here/operators/$name"
  [[ -f "$dir/go.mod" && -f "$dir/crds" ]] || { log "no operator $name in $here/operators"; exit 2; }
  tool="$(awk '$1=="tool" {print $2}' "$dir/go.mod")"
  # The module providing the tool: the longest required module path that is a prefix of it.
  read -r module version < <(awk -v t="$tool" '
    $1 == "require" && NF >= 3 { $1 = ""; $0 = substr($0, 2) }
    NF >= 2 && $2 ~ /^v/ && (t == $1 || index(t, $1 "/") == 1) && length($1) > best { best = length($1); found = $1 " " $2 }
    END { print found }' "$dir/go.mod")
  [[ -n "$tool" && -n "$version" ]] || { log "$dir/go.mod needs a tool line and its module's version"; exit 2; }
  op_sum="$(cat "$dir/go.mod" "$dir/go.sum" "$dir/crds" | sha256sum | cut -c1-12)"
  root="${KOORD_QUEUE_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/koord-queue-py/bin}"
  out="$root/${name}-${version}_$(go env GOVERSION)_$(go env GOOS)-$(go env GOARCH)_${op_sum}"
  mkdir -p "$root"
  exec 9>"$root/.lock"
  flock 9
  if [[ -x "$out/$name" && -d "$out/crds" ]]; then
    echo "$out"
    exit 0
  fi
  tmp="$out.tmp"
  rm -rf "$tmp"
  mkdir -p "$tmp/crds"
  start=$SECONDS
  log "downloading modules ($module $version)"
  (cd "$dir" && go mod download)
  log "building $name from $tool (one package at a time; a cold build takes 3-6 minutes)"
  parallel="${KOORD_QUEUE_BUILD_PARALLELISM:-1}"
  (cd "$dir" && GOMAXPROCS="$parallel" GOFLAGS=-mod=readonly GOPROXY=off go build -p "$parallel" \
    -trimpath -ldflags="-s -w" -o "$tmp/$name" "$tool")
  # The CRDs come from the same module version as the binary: an operator run against other CRDs
  # (the cut-down ones in tests/crds) would drop the fields it writes.
  while read -r crd_module crd_glob; do
    [[ -z "$crd_module" || "$crd_module" == \#* ]] && continue
    src="$(cd "$dir" && GOFLAGS=-mod=readonly GOPROXY=off go list -m -f '{{.Dir}}' "$crd_module")"
    for file in $src/$crd_glob; do
      [[ -f "$file" ]] || { log "no CRD file matches $crd_module $crd_glob"; exit 1; }
      cp "$file" "$tmp/crds/"
    done
  done < "$dir/crds"
  chmod -R u+w "$tmp/crds"
  ls "$tmp/crds" >&2
  rm -rf "$out"
  mv "$tmp" "$out"
  log "done in $((SECONDS - start))s: $out"
  echo "$out"
  exit 0
fi

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
