#!/usr/bin/env bash
# Builds promtool and the Prometheus server (`prometheus`, for e2e/tests/alerts.rs) from the
# Go module pinned in go.mod (next to this script) into
#   ${EDDY_CACHE:-$HOME/.cache/eddy}/prometheus/<version>/bin-<hash of go.mod, go.sum, flags>
# and prints that directory as its last line of stdout (progress goes to stderr).
#
# A stamp file in the bin dir records that hash; when it matches and both binaries are
# there, nothing is built (no `go` run at all). Same scheme as e2e/k8s/build/build.sh. The
# hash in the directory's name lets clones with different go.mod files share the cache
# without rebuilding each other's binaries. The server is built without its web UI (the
# `builtinassets` tag needs npm): its HTTP API, which the tests use, is all there.
#
# environment: EDDY_CACHE, EDDY_PROMETHEUS_BUILD_JOBS (go build -p, default: number of CPUs),
# EDDY_PROMETHEUS_BUILD_NICE (nice level of the compiler, default 10),
# EDDY_PROMETHEUS_FORCE_BUILD=1.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
CACHE_ROOT="${EDDY_CACHE:-$HOME/.cache/eddy}"
BUILD_REV=2 # bump when the way the binaries are built changes
BINARIES=(prometheus promtool)

log() { printf 'prometheus build: %s\n' "$*" >&2; }
die() {
  printf 'prometheus build: error: %s\n' "$*" >&2
  exit 1
}

# The version comes from the pinned go.mod, the single source of truth: module tag v0.316.0
# is Prometheus 3.16.0.
MOD_VERSION="$(sed -n 's#^[[:space:]]*\(require \)\{0,1\}github.com/prometheus/prometheus \(v[^ ]*\).*#\2#p' "$HERE/go.mod" | head -n 1)"
[[ $MOD_VERSION =~ ^v0\.([0-9]+)([0-9][0-9])\.([0-9]+)$ ]] ||
  die "cannot read the github.com/prometheus/prometheus version from $HERE/go.mod"
VERSION="$((BASH_REMATCH[1])).$((10#${BASH_REMATCH[2]})).${BASH_REMATCH[3]}"

DIR="$CACHE_ROOT/prometheus/$MOD_VERSION"

ldflags() {
  local p=github.com/prometheus/common/version
  echo "-s -w -X $p.Version=$VERSION -X $p.Branch=HEAD -X $p.Revision=$MOD_VERSION -X $p.BuildUser=eddy -X $p.BuildDate=19700101-00:00:00"
}

stamp_content() {
  {
    echo "rev $BUILD_REV prometheus $MOD_VERSION"
    ldflags
    cat "$HERE/go.mod" "$HERE/go.sum"
  } | sha256sum | cut -d' ' -f1
}

STAMP_HASH="$(stamp_content)"
BIN_DIR="$DIR/bin-${STAMP_HASH:0:12}"
STAMP="$BIN_DIR/.stamp"

is_built() {
  local b
  [[ -f $STAMP && "$(head -n 1 "$STAMP")" == "$STAMP_HASH" ]] || return 1
  for b in "${BINARIES[@]}"; do [[ -x $BIN_DIR/$b ]] || return 1; done
}

build() {
  command -v go >/dev/null 2>&1 ||
    die "go is not on PATH; Go >= $(sed -n 's/^go //p' "$HERE/go.mod") is needed to build Prometheus and promtool"
  local jobs="${EDDY_PROMETHEUS_BUILD_JOBS:-$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)}"
  local niceness="${EDDY_PROMETHEUS_BUILD_NICE:-10}"
  local tmp start
  mkdir -p "$DIR"
  tmp="$(mktemp -d "$DIR/bin.tmp.XXXXXX")"
  chmod 755 "$tmp"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  start=$SECONDS
  log "building prometheus and promtool $VERSION ($MOD_VERSION) with $(go version | cut -d' ' -f3) (-p $jobs); several minutes on 2 cores with a cold Go build cache"
  # Static binaries; modules only from the pinned go.sum.
  export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" GOWORK=off
  local b
  for b in "${BINARIES[@]}"; do
    nice -n "$niceness" go build -C "$HERE" -p "$jobs" -trimpath -ldflags "$(ldflags)" \
      -o "$tmp/$b" "github.com/prometheus/prometheus/cmd/$b" ||
      die "building $b failed (see above)"
  done
  {
    echo "$STAMP_HASH"
    echo "prometheus=$MOD_VERSION ($VERSION) go=$(go env GOVERSION) built=$(date -u +%FT%TZ) seconds=$((SECONDS - start))"
  } >"$tmp/.stamp"
  rm -rf "$BIN_DIR"
  mv "$tmp" "$BIN_DIR"
  trap - EXIT
  log "built in $((SECONDS - start)) s into $BIN_DIR"
}

main() {
  if [[ ${EDDY_PROMETHEUS_FORCE_BUILD:-0} != 1 ]] && is_built; then
    echo "$BIN_DIR"
    return
  fi
  mkdir -p "$CACHE_ROOT/prometheus"
  # One build at a time per version.
  exec 8>"$CACHE_ROOT/prometheus/$MOD_VERSION.lock"
  if command -v flock >/dev/null 2>&1; then
    flock -w 3600 8 || die "timed out waiting for another build of $MOD_VERSION"
  fi
  if [[ ${EDDY_PROMETHEUS_FORCE_BUILD:-0} == 1 ]] || ! is_built; then
    build
  fi
  echo "$BIN_DIR"
}

main "$@"
