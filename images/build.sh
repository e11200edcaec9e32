#!/usr/bin/env bash
# Builds the eddy-worker and eddy-operator container images from images/Containerfile, with
# the release binaries of the workspace build (the ones the test suite runs), stripped of
# debug info. See README.md, "Container images".
#
#   images/build.sh [--check] [--push] [--save DIR] [--registry REG] [--tag TAG] [--prebuilt]
#                   [--engine buildah|docker] [--base IMAGE] [--refresh-base]
#
#   --check         run `--version` (and `eddy-worker check`, `eddy-operator crd`) inside each
#                   image, and check its user, entrypoint and that it has no shell
#   --push          push both images (after --check, if given)
#   --save DIR      write both as docker-archive tarballs, DIR/eddy-{worker,operator}-TAG.tar
#                   (`docker load -i`, `kind load image-archive`, `ctr images import`)
#   --registry REG  name them REG/eddy-worker and REG/eddy-operator (default ghcr.io/eddy-dev,
#                   the names the chart and the operator use)
#   --tag TAG       default: the crate version, read from the binaries (`--version`)
#   --prebuilt      package the binaries in $CARGO_TARGET_DIR/release as they are, without
#                   running `cargo build --release --workspace --all-targets` first
#   --engine        buildah (default) or docker
#   --base IMAGE    the Debian base stage (default: with buildah, localhost/eddy-debian, made
#                   here with mmdebstrap from Debian's packages and kept for a week; with
#                   docker, debian:bookworm-slim from Docker Hub)
#   --refresh-base  make the mmdebstrap base again now (Debian's security updates)
#
# environment: CARGO_TARGET_DIR (default ~/.cache/eddy/target), EDDY_IMAGES (buildah's storage
# and run dirs, default ~/.cache/eddy/images), EDDY_IMAGE_REGISTRY, EDDY_DEBIAN_MIRROR
# (default http://deb.debian.org/debian), EDDY_DEBIAN_SECURITY_MIRROR,
# EDDY_BUILDAH_STORAGE_DRIVER (default vfs: works in a container, with no kernel overlay),
# EDDY_BASE_MAX_AGE_DAYS (default 7).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd "$HERE/.." && pwd -P)"
# The registry the chart (values.yaml image.repository) and the operator's default worker
# image (operator/src/resources.rs) name; a unit test checks the three agree.
default_registry=ghcr.io/eddy-dev
BINARIES=(eddy-worker eddy-operator)
SUITE=bookworm # the Debian release the machines and CI build the binaries on

log() { printf 'images: %s\n' "$*" >&2; }
die() {
  printf 'images: error: %s\n' "$*" >&2
  exit 1
}
usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

check=0 push=0 prebuilt=0 refresh_base=0
engine=buildah base="" tag="" save=""
registry=${EDDY_IMAGE_REGISTRY:-$default_registry}
while (($#)); do
  case $1 in
  --check) check=1 ;;
  --push) push=1 ;;
  --prebuilt) prebuilt=1 ;;
  --refresh-base) refresh_base=1 ;;
  --registry) registry=${2:?--registry needs a value}; shift ;;
  --tag) tag=${2:?--tag needs a value}; shift ;;
  --save) save=${2:?--save needs a directory}; shift ;;
  --engine) engine=${2:?--engine needs a value}; shift ;;
  --base) base=${2:?--base needs a value}; shift ;;
  -h | --help) usage ;;
  *) log "unknown argument: $1"; usage ;;
  esac
  shift
done
[[ $engine == buildah || $engine == docker ]] || die "--engine is buildah or docker, not '$engine'"
registry=${registry%/}

STORE=${EDDY_IMAGES:-$HOME/.cache/eddy/images}
TARGET=${CARGO_TARGET_DIR:-$HOME/.cache/eddy/target}
RELEASE=$TARGET/release
started=$SECONDS
phase_start=$SECONDS
phase() {
  log "$1 ($((SECONDS - phase_start)) s)"
  phase_start=$SECONDS
}

if [[ $engine == buildah ]]; then
  # Debian's packages, installed on first use like the rest of the build's tools. Without
  # recommends: no OCI runtime or rootless helpers, which chroot isolation as root never uses.
  need=()
  for tool in buildah mmdebstrap; do command -v "$tool" >/dev/null || need+=("$tool"); done
  if ((${#need[@]})); then
    command -v apt-get >/dev/null || die "${need[*]} not found: install them, or use --engine docker"
    log "installing ${need[*]} (Debian packages)"
    if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; else SUDO=; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  B=(buildah --root "$STORE/storage" --runroot "$STORE/run"
    --storage-driver "${EDDY_BUILDAH_STORAGE_DRIVER:-vfs}")
fi

# ---------------------------------------------------------------------------- binaries
if ((!prebuilt)); then
  log "cargo build --release --workspace --all-targets (a no-op when the test suite just built)"
  (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET cargo build --release --workspace --all-targets)
fi
version=""
for b in "${BINARIES[@]}"; do
  [[ -x $RELEASE/$b ]] ||
    die "$RELEASE/$b not found: build it (cargo build --release --workspace --all-targets) or set CARGO_TARGET_DIR"
  v=$("$RELEASE/$b" --version) || die "$RELEASE/$b --version failed"
  v=${v##* }
  [[ -z $version || $v == "$version" ]] || die "eddy-worker is $version but eddy-operator is $v: rebuild both"
  version=$v
done
tag=${tag:-$version}
# Staged next to the Containerfile (the build context), stripped of debug info: 530 MB of line
# tables make a 33 MB binary. Stripped again only when the source (path, size, mtime) changed.
mkdir -p "$HERE/bin"
for b in "${BINARIES[@]}"; do
  source=$(stat -c '%n %s %Y' "$RELEASE/$b")
  if [[ ! -e $HERE/bin/$b || $(cat "$HERE/bin/.$b.source" 2>/dev/null) != "$source" ]]; then
    strip --strip-debug -o "$HERE/bin/$b.tmp" "$RELEASE/$b"
    mv "$HERE/bin/$b.tmp" "$HERE/bin/$b"
    printf '%s\n' "$source" >"$HERE/bin/.$b.source"
  fi
done
phase "binaries $version staged in images/bin"

# ---------------------------------------------------------------------------- base
# Debian $SUITE with the runtime packages the Containerfile names (its RUNTIME_PACKAGES), made
# with mmdebstrap because no container registry may be reachable. Named after a hash of the
# recipe; remade when the recipe changes or it is older than EDDY_BASE_MAX_AGE_DAYS.
if [[ $engine == buildah ]]; then
  mkdir -p "$STORE"
  # One build at a time per store: the tags are shared by every clone using it.
  exec 9>"$STORE/lock"
  flock 9
fi
packages=$(sed -n 's/^ARG RUNTIME_PACKAGES="\(.*\)"$/\1/p' "$HERE/Containerfile")
[[ -n $packages ]] || die "no ARG RUNTIME_PACKAGES=\"...\" line in $HERE/Containerfile"
if [[ $engine == buildah && -z $base ]]; then
  mirror=${EDDY_DEBIAN_MIRROR:-http://deb.debian.org/debian}
  security=${EDDY_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
  sources=("deb $mirror $SUITE main" "deb $mirror $SUITE-updates main" "deb $security $SUITE-security main")
  # Essential packages (dpkg, a shell, ldd: what the base stage runs) and the runtime ones,
  # without documentation, and without fsync (a throwaway tree). Images take only what
  # collect.sh copies out of it.
  mm_args=(--variant=essential --include="${packages// /,}" --dpkgopt=force-unsafe-io
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*')
  hash=$(printf '%s\n' "$SUITE" "${mm_args[@]}" "${sources[@]}" | sha256sum | cut -c1-12)
  base=localhost/eddy-debian:$SUITE-$hash
  stamp=$STORE/base-$hash.created
  if ((refresh_base)) || [[ ! -e $stamp ]] ||
    [[ -n $(find "$stamp" -mtime +"${EDDY_BASE_MAX_AGE_DAYS:-7}") ]] ||
    ! "${B[@]}" inspect --type image "$base" >/dev/null 2>&1; then
    command -v mmdebstrap >/dev/null || die "mmdebstrap not found: apt-get install mmdebstrap"
    log "making $base with mmdebstrap ($SUITE, essential + ${packages// /, })"
    tmp=$(mktemp -d "$STORE/base.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    # Quiet unless it fails; its log says which package or mirror was the problem.
    mmdebstrap "${mm_args[@]}" --mode=root --format=tar --skip=output/dev \
      --aptopt='Acquire::Retries "3"' \
      "$SUITE" "$tmp/rootfs.tar" "${sources[@]}" >"$tmp/log" 2>&1 ||
      { tail -n 30 "$tmp/log" >&2; die "mmdebstrap failed (mirror $mirror; EDDY_DEBIAN_MIRROR sets another)"; }
    ctr=$("${B[@]}" from scratch)
    "${B[@]}" add --quiet "$ctr" "$tmp/rootfs.tar" / >/dev/null
    "${B[@]}" config --cmd /bin/bash --label "eddy.base.recipe=$hash" "$ctr"
    "${B[@]}" commit --quiet --rm "$ctr" "$base" >/dev/null
    rm -rf "$tmp"
    trap - EXIT
    # Earlier recipes' bases are no longer used.
    for old in $("${B[@]}" images --noheading --format '{{.Name}}:{{.Tag}}'); do
      [[ $old != localhost/eddy-debian:* || $old == "$base" ]] || "${B[@]}" rmi "$old" >/dev/null
    done
    rm -f "$STORE"/base-*.created
    touch "$stamp"
    phase "base image made"
  fi
fi

# ---------------------------------------------------------------------------- build
image_name() { printf '%s/%s:%s' "$registry" "$1" "$tag"; }
build_args=(--build-arg "VERSION=$version")
[[ -n $base ]] && build_args+=(--build-arg "BASE_IMAGE=$base")
for b in "${BINARIES[@]}"; do
  if [[ $engine == buildah ]]; then
    # No layer cache (--layers): under vfs each cached step is a whole copy of the tree, some
    # 500 MB per new binary, and a build takes seconds anyway; only the base is kept.
    # Tried twice: buildah's chroot isolation re-executes itself from a sealed memfd copy,
    # and sealing it once failed with EBUSY on a fresh machine (the retry passed).
    bud=("${B[@]}" bud --quiet --isolation chroot --pull=false -f "$HERE/Containerfile"
      --target "$b" "${build_args[@]}" -t "$(image_name "$b")" "$HERE")
    "${bud[@]}" >/dev/null || { echo "images: building $b failed once; trying again" >&2; "${bud[@]}" >/dev/null; }
  else
    docker build --quiet -f "$HERE/Containerfile" --target "$b" "${build_args[@]}" \
      -t "$(image_name "$b")" "$HERE" >/dev/null
  fi
  phase "built $(image_name "$b")"
done
if [[ $engine == buildah ]]; then
  # The images these tags named before, now untagged.
  "${B[@]}" rmi --prune >/dev/null 2>&1 || true
fi

# ---------------------------------------------------------------------------- check
fail() { die "$(image_name "$1"): $2"; }
config() { # config BINARY FIELD: the image's User or Entrypoint
  if [[ $engine == buildah ]]; then
    "${B[@]}" inspect --type image --format "{{.OCIv1.Config.$2}}" "$(image_name "$1")"
  else
    docker image inspect --format "{{.Config.$2}}" "$(image_name "$1")"
  fi
}
run_in() { # run_in BINARY [--volume V] -- COMMAND...: in the image, as the image's user
  local b=$1 opts=()
  shift
  while [[ $1 != -- ]]; do opts+=("$1"); shift; done
  shift
  if [[ $engine == buildah ]]; then
    "${B[@]}" run --isolation chroot "${opts[@]}" "$ctr" -- "$@"
  else
    docker run --rm "${opts[@]}" --entrypoint "$1" "$(image_name "$b")" "${@:2}"
  fi
}
if ((check)); then
  for b in "${BINARIES[@]}"; do
    image=$(image_name "$b")
    if [[ $engine == buildah ]]; then
      ctr=$("${B[@]}" from --pull=false --quiet "$image")
      trap '"${B[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
    fi
    user=$(config "$b" User)
    entrypoint=$(config "$b" Entrypoint)
    [[ $user == 65532:65532 ]] || fail "$b" "runs as '$user', not 65532:65532 (the pods' runAsUser)"
    [[ $entrypoint == "[/usr/local/bin/$b]" ]] || fail "$b" "entrypoint is $entrypoint"
    if run_in "$b" -- /bin/sh -c true >/dev/null 2>&1; then
      fail "$b" "has a shell (/bin/sh)"
    fi
    got=$(run_in "$b" -- "/usr/local/bin/$b" --version) || fail "$b" "--version failed inside the image"
    [[ $got == "$b $version" ]] || fail "$b" "--version says '$got', expected '$b $version'"
    # Beyond --version: the worker parses and plans an app (jq expressions, topology), the
    # operator generates its CRD; neither needs a broker or a cluster.
    if [[ $b == eddy-worker ]]; then
      run_in "$b" --volume "$ROOT/examples:/examples:ro" -- /usr/local/bin/eddy-worker \
        check -f /examples/page-views.yaml >/dev/null ||
        fail "$b" "eddy-worker check -f examples/page-views.yaml failed inside the image"
    else
      run_in "$b" -- /usr/local/bin/eddy-operator crd | grep -q '^kind: CustomResourceDefinition$' ||
        fail "$b" "eddy-operator crd printed no CRD inside the image"
    fi
    if [[ $engine == buildah ]]; then
      "${B[@]}" rm "$ctr" >/dev/null
      trap - EXIT
      size=$("${B[@]}" images --noheading --format '{{.Size}}' "$image")
    else
      size=$(docker image inspect --format '{{.Size}}' "$image")
    fi
    log "ok: $image ($size): $got, user 65532:65532, no shell"
  done
  phase "checked"
fi

# ---------------------------------------------------------------------------- push
if ((push)); then
  for b in "${BINARIES[@]}"; do
    if [[ $engine == buildah ]]; then
      "${B[@]}" push --quiet "$(image_name "$b")" "docker://$(image_name "$b")"
    else
      docker push "$(image_name "$b")"
    fi
    log "pushed $(image_name "$b")"
  done
fi
if [[ -n $save ]]; then
  mkdir -p "$save"
  for b in "${BINARIES[@]}"; do
    file=$save/$b-$tag.tar
    rm -f "$file"
    if [[ $engine == buildah ]]; then
      "${B[@]}" push --quiet "$(image_name "$b")" "docker-archive:$file:$(image_name "$b")"
    else
      docker save -o "$file" "$(image_name "$b")"
    fi
    log "saved $(image_name "$b") to $file"
  done
fi
log "done in $((SECONDS - started)) s: $(image_name eddy-worker), $(image_name eddy-operator)"
