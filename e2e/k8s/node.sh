#!/usr/bin/env bash
# A real Kubernetes node on this machine, on top of a control plane started with
# `cluster.sh start --node --name NAME`: containerd (Debian's, with runc and the CNI plugins),
# a locally built pause image, a CNI bridge on the cluster's private node subnet, the kubelet,
# kube-proxy (nftables mode) and the cluster's DNS (CoreDNS on the node's bridge address,
# answering cluster.local names only). Root only. One such node per machine.
#
#   node.sh start [--name NAME]   start (or reuse) the node; prints the node name last
#   node.sh stop [--name NAME]    stop it and undo what it did to the host (idempotent)
#   node.sh status [--name NAME]  say what runs; exit 0 if the node is Ready
#   node.sh load [--name NAME] ARCHIVE...  import OCI or docker image archives (buildah push
#                                 IMAGE oci-archive:FILE:IMAGE) into the node's containerd
#   node.sh smoke [--name NAME] [--keep]  start a control plane and a node, run a hardened pod to
#                                 Ready, stop both, check the host is as it was
#
# Run state (containerd's root and state, the kubelet's root dir, pod logs, certificates,
# configs, logs) lives in ${EDDY_RUN:-$HOME/.cache/eddy/run}/node-<NAME>. What `stop`
# restores outside it is listed in README.md ("A real node").
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
RUN_ROOT="${EDDY_RUN:-$HOME/.cache/eddy/run}"
CACHE_ROOT="${EDDY_CACHE:-$HOME/.cache/eddy}"
START_TIMEOUT="${EDDY_K8S_START_TIMEOUT:-180}"
STOP_TIMEOUT="${EDDY_K8S_STOP_TIMEOUT:-15}"
PORT_MIN="${EDDY_K8S_PORT_MIN:-20000}"
PORT_MAX="${EDDY_K8S_PORT_MAX:-32000}"
CNI_BIN_DIR="${EDDY_CNI_BIN_DIR:-/usr/lib/cni}" # Debian's containernetworking-plugins
PAUSE_IMAGE="localhost/eddy/pause:1"
COMPONENTS=(containerd coredns kubelet kube-proxy) # start order; stopped in reverse
DNS_RBAC=eddy:node-coredns # its ClusterRole and ClusterRoleBinding
# Host state the kubelet, kube-proxy, containerd or the CNI plugins may change: recorded
# before `start`, restored by `stop`.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
  net.ipv6.conf.all.forwarding net.ipv4.conf.all.route_localnet
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait)
# Paths outside the run dir that the kubelet or containerd create even when told to use
# other dirs (or might): removed by `stop` if they did not exist before `start`.
HOST_PATHS=(/var/lib/kubelet /var/log/pods /var/log/containers /etc/kubernetes
  /usr/libexec/kubernetes /var/run/netns /run/netns /run/containerd /var/lib/containerd
  /opt/containerd /etc/cni /var/lib/cni /opt/cni)

log() { printf 'node.sh: %s\n' "$*" >&2; }
die() {
  printf 'node.sh: error: %s\n' "$*" >&2
  exit 1
}

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
}

# shellcheck source=../lib/lock.sh
. "$SCRIPT_DIR/../lib/lock.sh"
trap locks_release EXIT
# shellcheck source=../lib/ports.sh
. "$SCRIPT_DIR/../lib/ports.sh"

need_cmd() { # CMD APT_PACKAGE: install the package from apt if CMD is missing
  command -v "$1" >/dev/null 2>&1 && return 0
  if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    log "installing $2 (for $1) with apt-get"
    { apt-get install -y -q --no-install-recommends "$2" ||
      { apt-get update -q && apt-get install -y -q --no-install-recommends "$2"; }; } >&2 ||
      die "apt-get install $2 failed"
  fi
  command -v "$1" >/dev/null 2>&1 || die "$1 is needed; install the '$2' package"
}

need_tools() {
  [[ $(id -u) == 0 ]] || die "a real node needs root (containerd, runc, the kubelet)"
  need_cmd containerd containerd
  need_cmd runc runc
  need_cmd nft nftables
  need_cmd gcc gcc
  need_cmd openssl openssl
  need_cmd ip iproute2
  if [[ ! -x $CNI_BIN_DIR/bridge ]]; then
    PATH="$CNI_BIN_DIR:$PATH" need_cmd bridge containernetworking-plugins
    [[ -x $CNI_BIN_DIR/bridge ]] || die "no CNI bridge plugin in $CNI_BIN_DIR (EDDY_CNI_BIN_DIR)"
  fi
  [[ -f /usr/lib/x86_64-linux-gnu/libc.a || -n $(find /usr/lib -name libc.a -print -quit 2>/dev/null) ]] ||
    need_cmd_pkg libc6-dev
}
need_cmd_pkg() { # PACKAGE: install it with apt-get
  log "installing $1 with apt-get"
  { apt-get install -y -q --no-install-recommends "$1" ||
    { apt-get update -q && apt-get install -y -q --no-install-recommends "$1"; }; } >&2 ||
    die "apt-get install $1 failed"
}

# ---------------------------------------------------------------------------- processes

# proc_alive PID DIR / comp_pid NAME / comp_alive NAME / spawn NAME ARGS...
# shellcheck source=../lib/procs.sh
. "$SCRIPT_DIR/../lib/procs.sh"

stop_comp() { # NAME: TERM, KILL after STOP_TIMEOUT
  local name="$1" pid i
  pid="$(comp_pid "$name")"
  proc_alive "$pid" "$RUN_DIR" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < STOP_TIMEOUT * 5; i++)); do
    proc_alive "$pid" "$RUN_DIR" || return 0
    sleep 0.2
  done
  log "$name still running after ${STOP_TIMEOUT}s, sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    proc_alive "$pid" "$RUN_DIR" || return 0
    sleep 0.2
  done
  die "could not kill $name (pid $pid)"
}

log_tail() {
  printf -- '--- last lines of %s ---\n' "$RUN_DIR/logs/$1.log" >&2
  tail -n 25 "$RUN_DIR/logs/$1.log" >&2 2>/dev/null || true
}

wait_for() { # WHAT COMPONENT CMD...: until CMD succeeds; fail fast if COMPONENT died
  local what="$1" comp="$2" start=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    kill -0 "$(comp_pid "$comp")" 2>/dev/null || {
      log_tail "$comp"
      die "$comp exited during start-up (logs in $RUN_DIR/logs)"
    }
    ((SECONDS - start < START_TIMEOUT)) || {
      log_tail "$comp"
      die "$what: not within ${START_TIMEOUT}s (logs in $RUN_DIR/logs)"
    }
    sleep 0.2
  done
}

# ---------------------------------------------------------------------------- cluster

load_cluster() { # reads the control plane's env (cluster.sh start --node --name NAME)
  CLUSTER_DIR="$RUN_ROOT/k8s-$NAME"
  local env="$CLUSTER_DIR/env" k v
  [[ -f $env ]] || die "no control plane '$NAME' (start it with: e2e/k8s/cluster.sh start --node --name $NAME)"
  while IFS='=' read -r k v; do
    case $k in
    KUBECONFIG) KUBECONFIG_ADMIN="$v" ;;
    EDDY_K8S_BIN_DIR) BIN_DIR="$v" ;;
    EDDY_K8S_SERVER) SERVER="$v" ;;
    EDDY_K8S_NODE_BIN_DIR) NODE_BIN_DIR="$v" ;;
    EDDY_K8S_NODE_IP) NODE_IP="$v" ;;
    EDDY_K8S_NODE_SUBNET) NODE_SUBNET="$v" ;;
    EDDY_K8S_NODE_BRIDGE) NODE_BRIDGE="$v" ;;
    EDDY_K8S_SERVICE_CIDR) SERVICE_CIDR="$v" ;;
    esac
  done <"$env"
  [[ -n ${NODE_IP:-} && -n ${NODE_BIN_DIR:-} ]] ||
    die "control plane '$NAME' was started without --node (cluster.sh stop --name $NAME; cluster.sh start --node --name $NAME)"
}

kubectl_admin() { "$BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" --request-timeout=10s "$@"; }

# ---------------------------------------------------------------------------- host state

# Record what `stop` must restore: sysctls, which host paths, cgroups and nftables tables
# exist, before anything runs. Kept from the first start of this run dir.
record_host() {
  local f="$RUN_DIR/host-before" k p c
  [[ -f $f ]] && return 0
  {
    for k in "${SYSCTLS[@]}"; do
      [[ -e /proc/sys/${k//.//} ]] && echo "sysctl $k $(sysctl -n "$k" 2>/dev/null | tr -s '\t ' ' ')"
    done
    for p in "${HOST_PATHS[@]}"; do [[ -e $p ]] && echo "path $p"; done
    for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/kubepods.slice; do
      [[ -d $c ]] && echo "cgroup $c"
    done
    nft list tables 2>/dev/null | sed 's/^table /nft /'
    for k in iptables ip6tables; do
      command -v "$k-save" >/dev/null && "$k-save" 2>/dev/null | grep -q '^:KUBE-' && echo "$k has-kube-chains"
    done
  } >"$f.tmp"
  mv "$f.tmp" "$f"
}

# The mount points under DIR, deepest first.
mounts_under() {
  awk -v d="$1/" '{ m = $5; gsub(/\\040/, " ", m); if (index(m "/", d) == 1) print m }' /proc/self/mountinfo |
    awk '{ print length($0) " " $0 }' | sort -rn | cut -d' ' -f2-
}

unmount_under() { # DIR
  local m i
  for ((i = 0; i < 5; i++)); do
    [[ -n "$(mounts_under "$1")" ]] || return 0
    while read -r m; do
      [[ -n $m ]] || continue
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done < <(mounts_under "$1")
  done
  [[ -z "$(mounts_under "$1")" ]] || log "warning: still mounted under $1: $(mounts_under "$1" | paste -sd' ' -)"
}

# Processes of the pods: in the kubepods cgroups (pids controller), and the containerd shims
# of this run dir (their command line names its containerd socket).
pod_pids() {
  local f
  # (Not the cgroups' if kubepods existed before start: then they are not only ours.)
  grep -q '^cgroup ' "$RUN_DIR/host-before" 2>/dev/null ||
    while read -r f; do
      cat "$f" 2>/dev/null || true
    done < <(find /sys/fs/cgroup/pids/kubepods /sys/fs/cgroup/kubepods -name cgroup.procs 2>/dev/null || true)
  pgrep -f "containerd-shim.*-address $RUN_DIR/containerd/" 2>/dev/null || true
}

kill_pods() {
  local pids i
  for ((i = 0; i < 20; i++)); do
    pids="$(pod_pids | sort -u | paste -sd' ' -)"
    [[ -n $pids ]] || return 0
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    sleep 0.25
  done
  log "warning: pod processes left: $(pod_pids | sort -u | paste -sd' ' -)"
}

remove_cgroups() { # the kubepods cgroups that did not exist before start, deepest first
  local c
  for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [[ -d $c ]] || continue
    grep -qx "cgroup $c" "$RUN_DIR/host-before" 2>/dev/null && continue
    find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [[ ! -d $c ]] || log "warning: could not remove cgroup $c"
  done
}

remove_kube_chains() { # iptables/ip6tables chains KUBE-* (the kubelet's), if there were none before
  local t ipt rule chain
  for ipt in iptables ip6tables; do
    command -v "$ipt-save" >/dev/null || continue
    grep -qx "$ipt has-kube-chains" "$RUN_DIR/host-before" 2>/dev/null && continue
    "$ipt-save" 2>/dev/null | grep -q '^:KUBE-' || continue
    for t in filter nat mangle raw security; do
      # rules jumping to KUBE-* chains from any chain, then the chains themselves
      while read -r rule; do
        # shellcheck disable=SC2086
        eval "$ipt -w -t $t -D ${rule#-A }" 2>/dev/null || true
      done < <("$ipt-save" -t "$t" 2>/dev/null | grep -E '^-A [^K].* -j KUBE-|^-A [^ ]+ .*-j KUBE-' | grep -v '^-A KUBE-' || true)
      for chain in $("$ipt-save" -t "$t" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do
        "$ipt" -w -t "$t" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$ipt-save" -t "$t" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p'); do
        "$ipt" -w -t "$t" -X "$chain" 2>/dev/null || true
      done
    done
  done
}

remove_nft_tables() { # the tables kube-proxy made (nftables mode): 'ip kube-proxy', 'ip6 kube-proxy'
  local fam
  command -v nft >/dev/null || return 0
  for fam in ip ip6; do
    grep -qx "nft $fam kube-proxy" "$RUN_DIR/host-before" 2>/dev/null && continue
    nft list table "$fam" kube-proxy >/dev/null 2>&1 && { nft delete table "$fam" kube-proxy || log "warning: could not delete nft table $fam kube-proxy"; }
  done
  return 0
}

# The iptables-nft tables (ip/ip6 filter, nat, mangle) the kubelet's chains brought into being:
# once those chains are gone, deleted if they did not exist before and hold no rule.
remove_empty_xtables() {
  local fam t
  command -v nft >/dev/null || return 0
  for fam in ip ip6; do
    for t in filter nat mangle raw security; do
      grep -qx "nft $fam $t" "$RUN_DIR/host-before" 2>/dev/null && continue
      nft list table "$fam" "$t" >/dev/null 2>&1 || continue
      if ! nft list table "$fam" "$t" 2>/dev/null | grep -qvE '^[[:space:]]*(table .*|chain .*|type .*|\}|#.*|)$'; then
        nft delete table "$fam" "$t" 2>/dev/null || log "warning: could not delete the empty nft table $fam $t"
      fi
    done
  done
}

remove_veths() { # links still enslaved to the node's bridge (the pods' veths)
  local l
  [[ -n ${NODE_BRIDGE:-} ]] || return 0
  ip link show "$NODE_BRIDGE" >/dev/null 2>&1 || return 0
  for l in $(ip -o link show master "$NODE_BRIDGE" 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
    ip link delete "$l" 2>/dev/null || true
  done
}

restore_sysctls() {
  local kind k v cur
  while read -r kind k v; do
    [[ $kind == sysctl ]] || continue
    cur="$(sysctl -n "$k" 2>/dev/null | tr -s '\t ' ' ')" || continue
    if [[ $cur != "$v" ]]; then
      sysctl -q -w "$k=$v" >/dev/null 2>&1 || log "warning: could not restore $k=$v (is $cur)"
      log "restored $k = $v (was $cur)"
    fi
  done <"$RUN_DIR/host-before"
}

remove_host_paths() { # paths outside the run dir that did not exist before start
  local p
  for p in "${HOST_PATHS[@]}"; do
    [[ -e $p || -L $p ]] || continue
    grep -qx "path $p" "$RUN_DIR/host-before" 2>/dev/null && continue
    unmount_under "$p"
    rm -rf "$p" 2>/dev/null || log "warning: could not remove $p"
    log "removed $p (made by the node)"
  done
}

# ---------------------------------------------------------------------------- certificates

sign() { # NAME SUBJECT EXTENSIONS: key + cert signed by the cluster CA, in RUN_DIR/pki
  local name="$1" subj="$2" ext="$3" pki="$RUN_DIR/pki" ca="$CLUSTER_DIR/pki"
  (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$pki/$name.key" 2>/dev/null) ||
    die "openssl could not generate $name.key"
  openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  printf '%s\n' "$ext" >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$ca/ca.crt" -CAkey "$ca/ca.key" -CAcreateserial \
    -CAserial "$pki/ca.srl" -days 3650 -sha256 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null ||
    die "openssl could not sign the $name certificate"
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}

gen_pki() {
  local pki="$RUN_DIR/pki" client
  mkdir -p "$pki"
  chmod 700 "$pki"
  cp "$CLUSTER_DIR/pki/ca.crt" "$pki/ca.crt"
  client="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  # The kubelet's client cert, as the Node authorizer and NodeRestriction expect it.
  sign kubelet-client "/O=system:nodes/CN=system:node:$NODE" "$client"
  # Its serving cert, signed by the cluster CA so the API server verifies it (logs, exec):
  # only the node's address, no name (nothing resolves the node's name).
  sign kubelet "/CN=$NODE" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$NODE_IP"
  # kube-proxy: the bootstrap ClusterRoleBinding system:node-proxier names this user.
  sign kube-proxy "/CN=system:kube-proxy" "$client"
  # CoreDNS: a user of its own, allowed to read what names come from (coredns_rbac).
  sign coredns "/CN=$DNS_RBAC" "$client"
}

# What CoreDNS's kubernetes plugin reads: Services, their EndpointSlices, namespaces.
coredns_rbac() {
  kubectl_admin apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "$DNS_RBAC"}
rules:
- apiGroups: [""]
  resources: [services, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "$DNS_RBAC"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "$DNS_RBAC"}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: "$DNS_RBAC"}
EOF
}

# The cluster's names (Services, StatefulSet pods through their headless Service) on port 53
# of the node's address; any other name is refused (no `forward`): pods never reach the
# machine's resolver, and nothing else on the machine uses this one.
write_coredns_config() { # READY_PORT
  cat >"$RUN_DIR/Corefile" <<EOF
cluster.local:53 {
  bind $NODE_IP
  errors
  ready 127.0.0.1:$1
  kubernetes cluster.local {
    kubeconfig $RUN_DIR/coredns.kubeconfig
  }
}
EOF
}

b64() { base64 <"$1" | tr -d '\n'; }

write_kubeconfig() { # FILE CERT
  local file="$1" user="$2" pki="$RUN_DIR/pki"
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: eddy-$NAME
  cluster:
    server: $SERVER
    certificate-authority-data: $(b64 "$pki/ca.crt")
users:
- name: $user
  user:
    client-certificate-data: $(b64 "$pki/$user.crt")
    client-key-data: $(b64 "$pki/$user.key")
contexts:
- name: eddy-$NAME
  context:
    cluster: eddy-$NAME
    user: $user
current-context: eddy-$NAME
EOF
  chmod 600 "$file"
}

# ---------------------------------------------------------------------------- pause image

# A static pause binary (reaps zombies, exits on INT/TERM) in a one-layer OCI archive, made
# by hand (no registry is reachable, no builder needed) and cached by the hash of its recipe.
pause_archive() {
  local dir="$CACHE_ROOT/node" src hash out tmp
  src='#include <signal.h>
#include <unistd.h>
#include <sys/wait.h>
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
static void quit(int s) { (void)s; _exit(0); }
int main(void) {
  signal(SIGINT, quit); signal(SIGTERM, quit); signal(SIGCHLD, reap);
  for (;;) pause();
}'
  hash="$(printf '%s\n%s\n' "$src" "$PAUSE_IMAGE v1" | sha256sum | cut -c1-12)"
  out="$dir/pause-$hash.oci.tar"
  if [[ -f $out ]]; then
    echo "$out"
    return 0
  fi
  mkdir -p "$dir"
  tmp="$(mktemp -d "$dir/pause.XXXXXX")"
  mkdir -p "$tmp/rootfs" "$tmp/oci/blobs/sha256"
  printf '%s\n' "$src" >"$tmp/pause.c"
  gcc -static -Os -s -o "$tmp/rootfs/pause" "$tmp/pause.c" >&2 || die "gcc -static could not build the pause binary"
  tar --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -C "$tmp/rootfs" -cf "$tmp/layer.tar" pause
  local layer layer_size config config_size manifest manifest_size
  layer="$(sha256sum <"$tmp/layer.tar" | cut -d' ' -f1)"
  layer_size="$(stat -c %s "$tmp/layer.tar")"
  mv "$tmp/layer.tar" "$tmp/oci/blobs/sha256/$layer"
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$layer" >"$tmp/config.json"
  config="$(sha256sum <"$tmp/config.json" | cut -d' ' -f1)"
  config_size="$(stat -c %s "$tmp/config.json")"
  mv "$tmp/config.json" "$tmp/oci/blobs/sha256/$config"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$tmp/manifest.json"
  manifest="$(sha256sum <"$tmp/manifest.json" | cut -d' ' -f1)"
  manifest_size="$(stat -c %s "$tmp/manifest.json")"
  mv "$tmp/manifest.json" "$tmp/oci/blobs/sha256/$manifest"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest" "$manifest_size" "$PAUSE_IMAGE" "${PAUSE_IMAGE##*:}" >"$tmp/oci/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci/oci-layout"
  tar --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -C "$tmp/oci" -cf "$tmp/pause.tar" oci-layout index.json blobs
  mv "$tmp/pause.tar" "$out"
  rm -rf "$tmp"
  echo "$out"
}

ctr_() { ctr --address "$RUN_DIR/containerd/containerd.sock" -n k8s.io "$@"; }

# load_image ARCHIVE: an OCI or docker archive into the node's containerd (k8s.io namespace)
load_image() {
  ctr_ images import --snapshotter overlayfs "$1" >&2 || die "ctr images import $1 failed"
}

# ---------------------------------------------------------------------------- start

write_containerd_config() {
  local d="$RUN_DIR/containerd"
  mkdir -p "$d/root" "$d/state" "$d/runc" "$RUN_DIR/cni/net.d" "$RUN_DIR/cni/ipam"
  # Everything under the run dir: root, state, socket, runc's state, the pods' network
  # namespaces, the CNI config and IPAM data. No TCP listener but the streaming server on
  # 127.0.0.1. Plugins that would write elsewhere (/opt/containerd) are off.
  cat >"$d/config.toml" <<EOF
version = 2
root = "$d/root"
state = "$d/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # root in this kind of VM lacks CAP_SYS_RESOURCE: never lower a process's oom_score_adj
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$d/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$RUN_DIR/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$d/certs.d"
EOF
  mkdir -p "$d/certs.d"
  local base="${NODE_SUBNET%.*}"
  # The bridge exists (cluster.sh --node made it, with the node's address): no gateway
  # address to add, no IP forwarding, no masquerade. Pods get an address of the subnet and a
  # route to the Service range through the node's address, no default route.
  cat >"$RUN_DIR/cni/net.d/10-eddy.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "eddy",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$NODE_BRIDGE",
      "isGateway": false,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$RUN_DIR/cni/ipam",
        "ranges": [[{ "subnet": "$NODE_SUBNET", "rangeStart": "$base.10", "gateway": "$NODE_IP" }]],
        "routes": [{ "dst": "$SERVICE_CIDR", "gw": "$NODE_IP" }]
      }
    }
  ]
}
EOF
}

write_kubelet_config() {
  local kport="$1" hport="$2" k="$RUN_DIR/kubelet"
  mkdir -p "$k" "$RUN_DIR/pod-logs" "$RUN_DIR/volume-plugins"
  cat >"$RUN_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $kport
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $hport
enableServer: true
tlsCertFile: $RUN_DIR/pki/kubelet.crt
tlsPrivateKeyFile: $RUN_DIR/pki/kubelet.key
rotateCertificates: false
serverTLSBootstrap: false
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $RUN_DIR/pki/ca.crt
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$RUN_DIR/containerd/containerd.sock
imageServiceEndpoint: unix://$RUN_DIR/containerd/containerd.sock
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
# Pods get no resolv.conf of the machine's: nothing resolves names through its DNS.
resolvConf: ""
clusterDomain: cluster.local
clusterDNS: ["$NODE_IP"]
podLogsDir: $RUN_DIR/pod-logs
volumePluginDir: $RUN_DIR/volume-plugins
staticPodPath: ""
registerNode: true
maxPods: 50
serializeImagePulls: false
# A disk two-thirds full must not evict the tests' pods.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
kubeAPIQPS: 50
kubeAPIBurst: 100
EOF
}

write_proxy_config() {
  local hport="$1" mport="$2"
  cat >"$RUN_DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: $RUN_DIR/kube-proxy.kubeconfig
hostnameOverride: $NODE
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:$hport
metricsBindAddress: 127.0.0.1:$mport
clusterCIDR: $NODE_SUBNET
nodePortAddresses: ["$NODE_SUBNET"]
# Leave the machine's conntrack settings alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}

node_ready() {
  [[ "$(kubectl_admin get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

all_alive() {
  local c
  for c in "${COMPONENTS[@]}"; do comp_alive "$c" || return 1; done
}

cmd_start() {
  load_cluster
  need_tools
  lock 9 "$RUN_ROOT/.node.lock" # one node per machine
  if [[ -d $RUN_DIR ]]; then
    if all_alive && node_ready; then
      log "already running ($RUN_DIR)"
      echo "$NODE"
      return 0
    fi
    log "found a stale or broken node in $RUN_DIR, cleaning up first"
    do_stop
  fi
  local other
  for other in "$RUN_ROOT"/node-*/; do
    other="${other%/}"
    [[ -f $other/host-before ]] &&
      die "another real node runs on this machine: $other (node.sh stop --name ${other##*/node-}; one per machine)"
  done
  local start=$SECONDS kport khport phport pmport dport
  mkdir -p "$RUN_DIR/logs"
  record_host
  gen_pki
  write_kubeconfig "$RUN_DIR/kubelet.kubeconfig" kubelet-client
  write_kubeconfig "$RUN_DIR/kube-proxy.kubeconfig" kube-proxy
  write_kubeconfig "$RUN_DIR/coredns.kubeconfig" coredns
  coredns_rbac || die "could not grant CoreDNS its read access"
  local pause
  pause="$(pause_archive)"

  lock 8 "$RUN_ROOT/.ports.lock"
  pick_ports 5 >"$RUN_DIR/ports"
  read -r kport khport phport pmport dport <"$RUN_DIR/ports"
  write_containerd_config
  write_coredns_config "$dport"
  write_kubelet_config "$kport" "$khport"
  write_proxy_config "$phport" "$pmport"

  if ! (start_components "$pause" "$kport" "$khport" "$phport" "$dport"); then
    do_stop_keep_logs
    exit 1
  fi
  unlock 8
  cat >"$RUN_DIR/env" <<EOF
EDDY_NODE_NAME=$NODE
EDDY_NODE_IP=$NODE_IP
EDDY_NODE_RUN_DIR=$RUN_DIR
EDDY_NODE_CONTAINERD_SOCKET=$RUN_DIR/containerd/containerd.sock
EOF
  log "node $NODE ready in $((SECONDS - start))s ($NODE_IP; containerd $RUN_DIR/containerd/containerd.sock)"
  echo "$NODE"
}

start_components() {
  local pause="$1" kport="$2" khport="$3" phport="$4" dport="$5" t=$SECONDS
  spawn containerd containerd --config "$RUN_DIR/containerd/config.toml" --log-level warn
  wait_for "containerd's socket" containerd ctr --address "$RUN_DIR/containerd/containerd.sock" version
  load_image "$pause"
  log "containerd up, pause image imported ($((SECONDS - t))s)"

  spawn coredns "$NODE_BIN_DIR/coredns" -conf "$RUN_DIR/Corefile"
  wait_for "CoreDNS ready" coredns curl -fsS --noproxy '*' "http://127.0.0.1:$dport/ready"
  log "CoreDNS up on $NODE_IP:53 ($((SECONDS - t))s)"

  spawn kubelet "$NODE_BIN_DIR/kubelet" \
    --config="$RUN_DIR/kubelet.yaml" \
    --kubeconfig="$RUN_DIR/kubelet.kubeconfig" \
    --root-dir="$RUN_DIR/kubelet" \
    --cert-dir="$RUN_DIR/pki" \
    --hostname-override="$NODE" \
    --node-ip="$NODE_IP" \
    --v=1
  wait_for "the kubelet's healthz" kubelet curl -fsS --noproxy '*' "http://127.0.0.1:$khport/healthz"
  wait_for "node $NODE Ready" kubelet node_ready
  log "kubelet up, node $NODE Ready ($((SECONDS - t))s)"

  spawn kube-proxy "$NODE_BIN_DIR/kube-proxy" --config="$RUN_DIR/kube-proxy.yaml" --v=1
  wait_for "kube-proxy's healthz" kube-proxy curl -fsS --noproxy '*' "http://127.0.0.1:$phport/healthz"
  log "kube-proxy up ($((SECONDS - t))s)"
}

# ---------------------------------------------------------------------------- stop

do_stop_keep_logs() { # after a failed start: undo everything but keep the logs
  local keep
  keep="$(mktemp -d "$RUN_ROOT/node-$NAME-failed.XXXXXX")"
  cp -r "$RUN_DIR/logs" "$keep/" 2>/dev/null || true
  do_stop
  log "logs of the failed start: $keep/logs"
}

drain() { # delete this node's pods (graceful), then the Node object
  [[ -n ${KUBECONFIG_ADMIN:-} && -f ${KUBECONFIG_ADMIN:-/nonexistent} ]] || return 0
  comp_alive kubelet || return 0
  kubectl_admin get node "$NODE" >/dev/null 2>&1 || return 0
  kubectl_admin delete pods -A --field-selector "spec.nodeName=$NODE" --grace-period=5 --wait=false >/dev/null 2>&1 || true
  local i
  for ((i = 0; i < 60; i++)); do
    [[ -z "$(kubectl_admin get pods -A --field-selector "spec.nodeName=$NODE" -o name 2>/dev/null)" ]] && break
    sleep 0.5
  done
}

do_stop() {
  [[ -d $RUN_DIR ]] || return 0
  local t=$SECONDS
  drain
  log "pods drained ($((SECONDS - t))s)"
  stop_comp kube-proxy
  stop_comp kubelet
  stop_comp coredns
  kill_pods
  stop_comp containerd
  kill_pods
  log "processes stopped ($((SECONDS - t))s)"
  unmount_under "$RUN_DIR"
  [[ -f $RUN_DIR/host-before ]] && {
    remove_cgroups
    remove_nft_tables
    remove_kube_chains
    remove_empty_xtables
    remove_veths
    restore_sysctls
    remove_host_paths
  }
  if [[ -n ${KUBECONFIG_ADMIN:-} && -f ${KUBECONFIG_ADMIN:-/nonexistent} ]]; then
    kubectl_admin delete node "$NODE" --wait=false >/dev/null 2>&1 || true
    kubectl_admin delete clusterrolebinding,clusterrole "$DNS_RBAC" --ignore-not-found >/dev/null 2>&1 || true
  fi
  [[ -z "$(mounts_under "$RUN_DIR")" ]] || die "mounts left under $RUN_DIR; not removing it"
  rm -rf "$RUN_DIR"
}

cmd_stop() {
  lock 9 "$RUN_ROOT/.node.lock"
  [[ -d $RUN_DIR ]] || return 0
  if [[ -f $RUN_ROOT/k8s-$NAME/env ]]; then load_cluster 2>/dev/null || true; fi
  # The bridge's name for the veth clean-up, even without the control plane's env.
  [[ -n ${NODE_BRIDGE:-} ]] || NODE_BRIDGE="$(sed -n 's/.*"bridge": "\(.*\)",/\1/p' "$RUN_DIR/cni/net.d/10-eddy.conflist" 2>/dev/null || true)"
  local t=$SECONDS
  do_stop
  log "stopped node $NODE in $((SECONDS - t))s"
}

cmd_status() {
  local c rc=0
  [[ -d $RUN_DIR ]] || {
    echo "node '$NAME': not running"
    return 1
  }
  for c in "${COMPONENTS[@]}"; do
    if comp_alive "$c"; then echo "$c: running (pid $(comp_pid "$c"))"; else
      echo "$c: not running"
      rc=1
    fi
  done
  if ((rc == 0)); then
    load_cluster
    if node_ready; then echo "node $NODE: Ready ($NODE_IP)"; else
      echo "node $NODE: not Ready"
      rc=1
    fi
  fi
  return $rc
}

# ---------------------------------------------------------------------------- main

main() {
  [[ $# -ge 1 ]] || {
    usage
    exit 2
  }
  local cmd="$1"
  shift
  NAME=node
  local smoke_args=() files=()
  while [[ $# -gt 0 ]]; do
    case $1 in
    --keep)
      [[ $cmd == smoke ]] || die "--keep is for smoke only"
      smoke_args+=(--keep)
      shift
      ;;
    --name)
      [[ $# -ge 2 ]] || die "--name needs a value"
      NAME="$2"
      shift 2
      ;;
    --name=*)
      NAME="${1#--name=}"
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    -*) die "unknown argument '$1' (see node.sh --help)" ;;
    *)
      [[ $cmd == load ]] || die "unknown argument '$1' (see node.sh --help)"
      [[ -f $1 ]] || die "no such file: $1"
      files+=("$1")
      shift
      ;;
    esac
  done
  [[ $NAME =~ ^[a-z0-9]([a-z0-9-]*[a-z0-9])?$ ]] || die "invalid --name '$NAME' (lower-case letters, digits, -)"
  RUN_DIR="$RUN_ROOT/node-$NAME"
  NODE="eddy-$NAME"
  case $cmd in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  load)
    ((${#files[@]})) || die "load: name one or more image archives"
    comp_alive containerd || die "node '$NAME' is not running"
    local f
    for f in "${files[@]}"; do load_image "$f"; done
    ;;
  smoke) exec "$SCRIPT_DIR/node-smoke.sh" --name "$NAME" "${smoke_args[@]}" ;;
  -h | --help | help) usage ;;
  *)
    usage
    exit 2
    ;;
  esac
}

main "$@"
