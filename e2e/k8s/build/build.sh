#!/usr/bin/env bash
#   build.sh [control-plane]   etcd, kube-apiserver, kube-controller-manager, kubectl and helm
#                              into ${EDDY_CACHE:-$HOME/.cache/eddy}/k8s/<k8s-version>/bin
#   build.sh node              kubelet, kube-scheduler, kube-proxy and a CoreDNS of the
#                              plugins coredns/main.go names (the real node, node.sh)
#                              into ${EDDY_CACHE:-$HOME/.cache/eddy}/k8s/<k8s-version>/node-bin
# Builds them from the Go modules pinned in kube/ and helm/ (next to this script) and prints
# that directory as its last line of stdout (progress goes to stderr).
#
# A stamp file in each bin dir records a hash of the pinned go.mod/go.sum files and the build
# flags; when it matches and all binaries are there, nothing is built (no `go` run at all).
# The node binaries have their own dir and stamp: users of the control plane alone never
# build them (the kubelet alone takes ≈ 9 min cold on 2 busy cores).
#
# environment: EDDY_CACHE, EDDY_K8S_BUILD_JOBS (go build -p, default: number of CPUs),
# EDDY_K8S_BUILD_NICE (nice level of the compiler, default 10), EDDY_K8S_FORCE_BUILD=1.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
CACHE_ROOT="${EDDY_CACHE:-$HOME/.cache/eddy}"
BUILD_REV=1 # bump when the way the binaries are built changes
TARGET="${1:-control-plane}"
case $TARGET in
control-plane) BINARIES=(etcd kube-apiserver kube-controller-manager kubectl helm) BIN_NAME=bin ;;
node) BINARIES=(kubelet kube-scheduler kube-proxy coredns) BIN_NAME=node-bin ;;
*)
  printf 'usage: build.sh [control-plane|node]\n' >&2
  exit 2
  ;;
esac

log() { printf 'k8s build: %s\n' "$*" >&2; }
die() {
  printf 'k8s build: error: %s\n' "$*" >&2
  exit 1
}

# Versions come from the pinned go.mod files, the single source of truth.
mod_version() { # DIR MODULE
  sed -n "s#^[[:space:]]*\(require \)\{0,1\}$2 \(v[^ ]*\).*#\2#p" "$HERE/$1/go.mod" | head -n 1
}
K8S_VERSION="$(mod_version kube k8s.io/kubernetes)"
ETCD_VERSION="$(mod_version kube go.etcd.io/etcd/server/v3)"
HELM_VERSION="$(mod_version helm helm.sh/helm/v3)"
[[ $K8S_VERSION =~ ^v1\.([0-9]+)\.[0-9]+$ ]] || die "cannot read the k8s.io/kubernetes version from $HERE/kube/go.mod"
K8S_MINOR="${BASH_REMATCH[1]}"
[[ -n $ETCD_VERSION && -n $HELM_VERSION ]] || die "cannot read the etcd/helm versions from $HERE/{kube,helm}/go.mod"

K8S_DIR="$CACHE_ROOT/k8s/$K8S_VERSION"
BIN_DIR="$K8S_DIR/$BIN_NAME"
STAMP="$BIN_DIR/.stamp"

# Linker flags: strip symbols, and stamp the versions that upstream's release builds stamp
# (without them kube-apiserver reports v0.0.0-master, which breaks helm's kubeVersion checks).
kube_ldflags() {
  local f="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$K8S_MINOR"
    f+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$f"
}
helm_ldflags() {
  local f="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  local cg_minor
  cg_minor="$(mod_version helm k8s.io/client-go | sed -n 's/^v0\.\([0-9]*\)\..*/\1/p')"
  if [[ -n $cg_minor ]]; then # helm's default .Capabilities.KubeVersion for `helm template`
    f+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$cg_minor"
    f+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$cg_minor"
  fi
  echo "$f"
}

stamp_content() {
  {
    if [[ $TARGET == node ]]; then
      echo "rev $BUILD_REV node k8s $K8S_VERSION"
      kube_ldflags
      cat "$HERE/kube/go.mod" "$HERE/kube/go.sum" "$HERE/coredns/go.mod" "$HERE/coredns/go.sum" "$HERE/coredns/main.go"
      return
    fi
    echo "rev $BUILD_REV k8s $K8S_VERSION etcd $ETCD_VERSION helm $HELM_VERSION"
    kube_ldflags
    helm_ldflags
    cat "$HERE/kube/go.mod" "$HERE/kube/go.sum" "$HERE/helm/go.mod" "$HERE/helm/go.sum"
  } | sha256sum | cut -d' ' -f1
}

is_built() {
  local b
  [[ -f $STAMP && "$(head -n 1 "$STAMP")" == "$(stamp_content)" ]] || return 1
  for b in "${BINARIES[@]}"; do [[ -x $BIN_DIR/$b ]] || return 1; done
}

build() {
  command -v go >/dev/null 2>&1 ||
    die "go is not on PATH; Go >= $(sed -n 's/^go //p' "$HERE/kube/go.mod") is needed to build the Kubernetes binaries"
  local jobs="${EDDY_K8S_BUILD_JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}"
  local niceness="${EDDY_K8S_BUILD_NICE:-10}"
  local tmp start
  mkdir -p "$K8S_DIR"
  tmp="$(mktemp -d "$K8S_DIR/$BIN_NAME.tmp.XXXXXX")"
  chmod 755 "$tmp"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  start=$SECONDS
  [[ $TARGET == node ]] ||
    log "building Kubernetes $K8S_VERSION, etcd $ETCD_VERSION, helm $HELM_VERSION with $(go version | cut -d' ' -f3) (-p $jobs); ≈ 10 min on 2 cores with a cold Go build cache"
  # Static binaries as upstream builds them; modules only from the pinned go.sum; the Go
  # toolchain named by the go directive may be fetched from the module proxy if ours is older.
  export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off
  local gobuild=(nice -n "$niceness" go build) cmd
  if [[ $TARGET == node ]]; then
    log "building kubelet, kube-scheduler, kube-proxy $K8S_VERSION and CoreDNS with $(go version | cut -d' ' -f3) (-p $jobs); the kubelet ≈ 9 min, CoreDNS ≈ 1 min on 2 busy cores with a cold Go build cache"
    for cmd in kubelet kube-scheduler kube-proxy; do
      log "$cmd..."
      "${gobuild[@]}" -C "$HERE/kube" -p "$jobs" -trimpath -ldflags "$(kube_ldflags)" -o "$tmp/$cmd" "k8s.io/kubernetes/cmd/$cmd" ||
        die "building $cmd failed (see above)"
      log "$cmd built ($((SECONDS - start)) s so far)"
    done
    log "coredns..."
    "${gobuild[@]}" -C "$HERE/coredns" -p "$jobs" -trimpath -ldflags "-s -w" -o "$tmp/coredns" . ||
      die "building coredns failed (see above)"
    log "coredns built ($((SECONDS - start)) s so far)"
  else
    log "etcd..."
    "${gobuild[@]}" -C "$HERE/kube" -p "$jobs" -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3 ||
      die "building etcd failed (see above)"
    for cmd in kube-apiserver kube-controller-manager kubectl; do
      log "$cmd..."
      "${gobuild[@]}" -C "$HERE/kube" -p "$jobs" -trimpath -ldflags "$(kube_ldflags)" -o "$tmp/$cmd" "k8s.io/kubernetes/cmd/$cmd" ||
        die "building $cmd failed (see above)"
    done
    log "helm..."
    "${gobuild[@]}" -C "$HERE/helm" -p "$jobs" -trimpath -ldflags "$(helm_ldflags)" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm ||
      die "building helm failed (see above)"
  fi
  {
    stamp_content
    echo "target=$TARGET k8s=$K8S_VERSION etcd=$ETCD_VERSION helm=$HELM_VERSION go=$(go env GOVERSION) built=$(date -u +%FT%TZ) seconds=$((SECONDS - start))"
  } >"$tmp/.stamp"
  rm -rf "$BIN_DIR"
  mv "$tmp" "$BIN_DIR"
  trap - EXIT
  log "built in $((SECONDS - start)) s into $BIN_DIR"
}

main() {
  if [[ ${EDDY_K8S_FORCE_BUILD:-0} != 1 ]] && is_built; then
    echo "$BIN_DIR"
    return
  fi
  mkdir -p "$CACHE_ROOT/k8s"
  # One build at a time per version (two concurrent `cluster.sh start` share it).
  local lockfile="$CACHE_ROOT/k8s/$K8S_VERSION.lock"
  [[ $TARGET == node ]] && lockfile="$CACHE_ROOT/k8s/$K8S_VERSION-node.lock"
  exec 8>"$lockfile"
  if command -v flock >/dev/null 2>&1; then
    flock -w 3600 8 || die "timed out waiting for another build of $K8S_VERSION"
  fi
  if [[ ${EDDY_K8S_FORCE_BUILD:-0} == 1 ]] || ! is_built; then
    build
  fi
  echo "$BIN_DIR"
}

main "$@"
