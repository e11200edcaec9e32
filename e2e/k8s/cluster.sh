#!/usr/bin/env bash
# A real, node-less Kubernetes control plane (etcd + kube-apiserver + kube-controller-manager)
# as local processes on 127.0.0.1, for eddy's end-to-end tests of the operator and its chart.
#
#   cluster.sh start [--name NAME] [--node]  start (or reuse) it; prints the kubeconfig path last
#                                        --node: ready for a real node (node.sh): a bridge with
#                                        the node's address, the API server on it, kube-scheduler
#   cluster.sh stop [--name NAME]        stop it and remove its run dir (idempotent)
#   cluster.sh kubeconfig [--name NAME]  print the kubeconfig path, exit 1 if not running
#   cluster.sh status [--name NAME]      say what runs; exit 0 if the cluster is up and ready
#   cluster.sh bin                       print the dir holding kubectl, helm, etcd, ... (builds if needed)
#
# Binaries are built from Go modules (build/) and cached in
# ${EDDY_CACHE:-$HOME/.cache/eddy}/k8s/<version>/bin. Run state (certs, etcd data, logs,
# kubeconfig, env) lives in ${EDDY_RUN:-$HOME/.cache/eddy/run}/k8s-<NAME>. See README.md.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
RUN_ROOT="${EDDY_RUN:-$HOME/.cache/eddy/run}"
START_TIMEOUT="${EDDY_K8S_START_TIMEOUT:-180}" # seconds, after the binaries are built
STOP_TIMEOUT="${EDDY_K8S_STOP_TIMEOUT:-15}"    # seconds before SIGKILL
# '*' is every controller that is on by default (statefulset, replicaset, deployment, job,
# garbage-collector, namespace, serviceaccount, disruption, persistentvolume-binder,
# node-lifecycle, ...). EDDY_K8S_CONTROLLERS='*,-node-lifecycle-controller' turns one off.
CONTROLLERS="${EDDY_K8S_CONTROLLERS:-*}"
SERVICE_CIDR="10.96.0.0/16"
SERVICE_IP="10.96.0.1" # first address of SERVICE_CIDR: the 'kubernetes' Service
# Ports are drawn from the same range and under the same lock as e2e/kafka/kafka.sh: below
# Linux's and macOS's ephemeral ranges, so outgoing client sockets never take them.
PORT_MIN="${EDDY_K8S_PORT_MIN:-20000}"
PORT_MAX="${EDDY_K8S_PORT_MAX:-32000}"
COMPONENTS=(etcd kube-apiserver kube-controller-manager) # start order; stopped in reverse
# --node: the real node's network (node.sh). One per machine: a bridge of our own on a private
# subnet, its first address the node's (and the API server's) address. Nothing routes it out.
NODE_SUBNET="${EDDY_K8S_NODE_SUBNET:-10.233.0.0/24}"
NODE_BRIDGE="${EDDY_K8S_NODE_BRIDGE:-eddybr0}"
NODE_MODE=0

log() { printf 'cluster.sh: %s\n' "$*" >&2; }
die() {
  printf 'cluster.sh: error: %s\n' "$*" >&2
  exit 1
}

usage() {
  cat >&2 <<EOF
usage: cluster.sh start [--name NAME] [--node]
       cluster.sh stop [--name NAME]
       cluster.sh kubeconfig [--name NAME]
       cluster.sh status [--name NAME]
       cluster.sh bin

A local Kubernetes control plane (etcd, kube-apiserver with RBAC, kube-controller-manager;
no nodes, no kubelet) on 127.0.0.1. NAME defaults to 'default'. With --node (root only): also
a bridge $NODE_BRIDGE with the first address of $NODE_SUBNET, on which the API server listens
(instead of 127.0.0.1), Node authorization, and kube-scheduler, for e2e/k8s/node.sh.

environment: EDDY_CACHE (binary cache root, default ~/.cache/eddy), EDDY_RUN (run dirs,
default ~/.cache/eddy/run), EDDY_K8S_START_TIMEOUT (s, default 180), EDDY_K8S_STOP_TIMEOUT
(s, default 15), EDDY_K8S_CONTROLLERS (default '*'), EDDY_K8S_BUILD_JOBS (go build -p),
EDDY_K8S_NODE_SUBNET (default 10.233.0.0/24), EDDY_K8S_NODE_BRIDGE (default eddybr0).
EOF
}

# ---------------------------------------------------------------------------- locking
# lock FD FILE / unlock FD / lock_remove FILE / locks_release
# shellcheck source=../lib/lock.sh
. "$SCRIPT_DIR/../lib/lock.sh"
trap locks_release EXIT

# ---------------------------------------------------------------------------- tools

need_cmd() { # CMD APT_PACKAGE: install the package from apt if CMD is missing
  command -v "$1" >/dev/null 2>&1 && return 0
  if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    log "installing $2 (for $1) with apt-get"
    { apt-get install -y -q "$2" || { apt-get update -q && apt-get install -y -q "$2"; }; } >&2 ||
      die "apt-get install $2 failed"
  fi
  command -v "$1" >/dev/null 2>&1 || die "$1 is needed; install the '$2' package"
}

BIN_DIR=""
ensure_bin() {
  [[ -n $BIN_DIR ]] && return 0
  BIN_DIR="$("$SCRIPT_DIR/build/build.sh" | tail -n 1)" || die "building the Kubernetes binaries failed"
  [[ -x $BIN_DIR/kube-apiserver ]] || die "no kube-apiserver in '$BIN_DIR'"
  if ((NODE_MODE)); then
    NODE_BIN_DIR="$("$SCRIPT_DIR/build/build.sh" node | tail -n 1)" || die "building kubelet, kube-scheduler, kube-proxy failed"
    [[ -x $NODE_BIN_DIR/kube-scheduler ]] || die "no kube-scheduler in '$NODE_BIN_DIR'"
  fi
}

# ---------------------------------------------------------------------------- node network

# The node's address: the first one of NODE_SUBNET (a /24 or larger, IPv4).
node_ip() {
  if ! [[ $NODE_SUBNET =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)\.0/([0-9]+)$ ]] || ((BASH_REMATCH[4] > 24)); then
    die "EDDY_K8S_NODE_SUBNET must be an IPv4 /24 (or larger) ending in .0, got '$NODE_SUBNET'"
  fi
  echo "${BASH_REMATCH[1]}.${BASH_REMATCH[2]}.${BASH_REMATCH[3]}.1"
}

# The bridge is made before the API server, which binds its address; `stop` deletes it. Its
# name and address are kept in the run dir so that only our own bridge is ever deleted.
bridge_up() {
  local ip
  ip="$(node_ip)"
  [[ $(id -u) == 0 ]] || die "--node needs root (a bridge, then containerd and the kubelet)"
  need_cmd ip iproute2
  if ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
    die "a link named $NODE_BRIDGE exists already (another real node on this machine? e2e/k8s/node.sh status; EDDY_K8S_NODE_BRIDGE names another)"
  fi
  if ip -4 -o addr show | grep -q " inet $ip/"; then
    die "$ip is already an address of this machine (EDDY_K8S_NODE_SUBNET picks another subnet)"
  fi
  printf 'NODE_BRIDGE=%s\nNODE_IP=%s\nNODE_SUBNET=%s\n' "$NODE_BRIDGE" "$ip" "$NODE_SUBNET" >"$RUN_DIR/bridge"
  ip link add "$NODE_BRIDGE" type bridge || die "could not create the bridge $NODE_BRIDGE"
  # No IPv6 on it (no link-local address, no router solicitations), interface-scoped only.
  sysctl -q -w "net.ipv6.conf.$NODE_BRIDGE.disable_ipv6=1" 2>/dev/null || true
  ip addr add "$ip/${NODE_SUBNET#*/}" dev "$NODE_BRIDGE" || die "could not add $ip to $NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up || die "could not bring $NODE_BRIDGE up"
}

bridge_down() { # delete the bridge this run dir made (its veths go with their network namespaces)
  local f="$RUN_DIR/bridge" br
  [[ -f $f ]] || return 0
  br="$(sed -n 's/^NODE_BRIDGE=//p' "$f")"
  if [[ -n $br ]] && ip link show "$br" >/dev/null 2>&1; then
    ip link delete "$br" || die "could not delete the bridge $br"
  fi
  rm -f "$f"
}

# ---------------------------------------------------------------------------- processes

# proc_alive PID DIR / comp_pid NAME / comp_alive NAME / spawn NAME ARGS...
# shellcheck source=../lib/procs.sh
. "$SCRIPT_DIR/../lib/procs.sh"

live_pids() {
  local c pid
  for c in "${COMPONENTS[@]}"; do
    pid="$(comp_pid "$c")"
    if proc_alive "$pid" "$RUN_DIR"; then echo "$pid"; fi
  done
}

kill_all() {
  local c pid waited=0
  [[ -n "$(live_pids)" ]] || return 0
  # Everything but etcd first (scheduler, controller-manager, apiserver), etcd once they are
  # gone: an apiserver with the lease endpoint reconciler (--node) removes its endpoint from
  # etcd on the way out, and etcd does not exit while the apiserver's watches are open, so
  # stopping both at once waited for the SIGKILL.
  for ((i = ${#COMPONENTS[@]} - 1; i >= 1; i--)); do
    c="${COMPONENTS[$i]}"
    pid="$(comp_pid "$c")"
    if proc_alive "$pid" "$RUN_DIR"; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  while [[ "$(live_pids)" != "$(live_etcd)" ]] && ((waited < STOP_TIMEOUT * 5)); do
    sleep 0.2
    waited=$((waited + 1))
  done
  pid="$(comp_pid etcd)"
  if proc_alive "$pid" "$RUN_DIR"; then kill -TERM "$pid" 2>/dev/null || true; fi
  while [[ -n "$(live_pids)" ]] && ((waited < STOP_TIMEOUT * 5)); do
    sleep 0.2
    waited=$((waited + 1))
  done
  [[ -n "$(live_pids)" ]] || return 0
  log "still running after ${STOP_TIMEOUT}s, sending SIGKILL"
  # shellcheck disable=SC2046
  kill -KILL $(live_pids) 2>/dev/null || true
  for _ in $(seq 1 50); do
    [[ -n "$(live_pids)" ]] || return 0
    sleep 0.2
  done
  die "could not kill: $(live_pids | paste -sd' ' -)"
}

live_etcd() {
  local pid
  pid="$(comp_pid etcd)"
  if proc_alive "$pid" "$RUN_DIR"; then echo "$pid"; fi
}

log_tail() { # NAME
  printf -- '--- last lines of %s ---\n' "$RUN_DIR/logs/$1.log" >&2
  tail -n 25 "$RUN_DIR/logs/$1.log" >&2 2>/dev/null || true
}

# ---------------------------------------------------------------------------- ports

# port_listening PORT / pick_ports COUNT
# shellcheck source=../lib/ports.sh
. "$SCRIPT_DIR/../lib/ports.sh"

host_listening() { # HOST PORT
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

wait_port() { # NAME PORT [HOST]: until something listens on HOST:PORT; fail fast if NAME died
  local name="$1" port="$2" host="${3:-127.0.0.1}" waited=0
  until host_listening "$host" "$port"; do
    # Only the pid here: right after the launch the process may not have exec'd yet, so its
    # command line is still this script's (comp_alive's check guards stale pid files).
    kill -0 "$(comp_pid "$name")" 2>/dev/null || {
      log_tail "$name"
      die "$name exited during start-up"
    }
    ((waited < START_TIMEOUT * 5)) || {
      log_tail "$name"
      die "$name did not listen on $host:$port within ${START_TIMEOUT}s"
    }
    sleep 0.2
    waited=$((waited + 1))
  done
}

# ---------------------------------------------------------------------------- certificates

# TLS keys are ECDSA P-256 (PKCS#8): generating six RSA keys took seconds on a loaded machine.
genkey() {
  (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null) ||
    die "openssl could not generate $1"
}

# sign NAME SUBJECT EXTENSIONS: a key and a cert signed by the run's CA (or \$CA), in pki/.
sign() {
  local name="$1" subj="$2" ext="$3" pki="$RUN_DIR/pki" ca="${CA:-ca}"
  genkey "$pki/$name.key"
  openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  printf '%s\n' "$ext" >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/$ca.crt" -CAkey "$pki/$ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null ||
    die "openssl could not sign the $name certificate"
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}

gen_pki() {
  local pki="$RUN_DIR/pki"
  mkdir -p "$pki"
  chmod 700 "$pki"
  genkey "$pki/ca.key"
  openssl req -x509 -new -key "$pki/ca.key" -sha256 -days 3650 -subj "/CN=eddy-e2e-k8s-ca-$NAME" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$pki/ca.crt" 2>/dev/null || die "openssl could not create the CA"
  sign apiserver "/CN=kube-apiserver" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$SERVICE_IP${NODE_IP:+,IP:$NODE_IP},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  local client="basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  sign admin "/O=system:masters/CN=eddy-admin" "$client"
  # front-proxy (request-header) CA and the apiserver's proxy client cert, as kubeadm sets them
  # up: aggregated API servers and the controller manager's delegated authentication read them
  # from kube-system/extension-apiserver-authentication (and log errors forever without them).
  genkey "$pki/front-proxy-ca.key"
  openssl req -x509 -new -key "$pki/front-proxy-ca.key" -sha256 -days 3650 -subj "/CN=eddy-e2e-front-proxy-ca-$NAME" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$pki/front-proxy-ca.crt" 2>/dev/null || die "openssl could not create the front-proxy CA"
  CA=front-proxy-ca sign front-proxy-client "/CN=front-proxy-client" "$client"
  sign controller-manager "/CN=system:kube-controller-manager" "$client"
  if ((NODE_MODE)); then
    sign scheduler "/CN=system:kube-scheduler" "$client"
    # The API server's client cert towards the kubelets (logs, exec, port-forward); the
    # kubelets authorize it by webhook, and system:masters may do anything.
    sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
  fi
  # service-account token signing key pair: RSA, so tokens are RS256 like on most clusters
  (umask 077 && openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null) || die "openssl could not generate sa.key"
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null || die "openssl could not write sa.pub"
}

b64() { base64 <"$1" | tr -d '\n'; }

write_kubeconfig() { # FILE USER(cert name) SERVER
  local file="$1" user="$2" server="$3" pki="$RUN_DIR/pki" ctx="eddy-$NAME"
  cat >"$file.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $ctx
  cluster:
    server: $server
    certificate-authority-data: $(b64 "$pki/ca.crt")
users:
- name: $ctx-$user
  user:
    client-certificate-data: $(b64 "$pki/$user.crt")
    client-key-data: $(b64 "$pki/$user.key")
contexts:
- name: $ctx
  context:
    cluster: $ctx
    user: $ctx-$user
current-context: $ctx
EOF
  chmod 600 "$file.tmp"
  mv "$file.tmp" "$file"
}

# ---------------------------------------------------------------------------- start / stop

kubectl_admin() { "$BIN_DIR/kubectl" --kubeconfig "$RUN_DIR/kubeconfig" --request-timeout=5s "$@"; }

cluster_ready() { # all processes alive, /readyz ok, default ServiceAccount there
  local c
  for c in "${COMPONENTS[@]}"; do comp_alive "$c" || return 1; done
  [[ -f $RUN_DIR/kubeconfig ]] || return 1
  [[ "$(kubectl_admin get --raw=/readyz 2>/dev/null)" == ok ]] || return 1
  kubectl_admin -n default get serviceaccount default >/dev/null 2>&1
}

wait_ready() { # [UNTIL]: readyz, then the default namespace and ServiceAccount (or only UNTIL)
  local until="${1:-serviceaccount}" start=$SECONDS step=readyz c
  while :; do
    for c in "${COMPONENTS[@]}"; do
      [[ -f $RUN_DIR/$c.pid ]] || continue # not started yet
      comp_alive "$c" || {
        log_tail "$c"
        die "$c exited during start-up (logs in $RUN_DIR/logs)"
      }
    done
    case $step in
    readyz)
      if [[ "$(kubectl_admin get --raw=/readyz 2>/dev/null)" == ok ]]; then
        [[ $until == readyz ]] && return 0
        step=namespace
      fi
      ;;
    namespace) kubectl_admin get namespace default >/dev/null 2>&1 && step=serviceaccount ;;
    serviceaccount) kubectl_admin -n default get serviceaccount default >/dev/null 2>&1 && return 0 ;;
    esac
    if ((SECONDS - start > START_TIMEOUT)); then
      log_tail kube-apiserver
      log_tail kube-controller-manager
      die "cluster not ready within ${START_TIMEOUT}s (stuck at: $step; logs in $RUN_DIR/logs)"
    fi
    sleep 0.3
  done
}

start_components() {
  local etcd_port peer_port api_port kcm_port sched_port pki="$RUN_DIR/pki" api_ip=127.0.0.1
  read -r etcd_port peer_port api_port kcm_port sched_port <<<"$(cat "$RUN_DIR/ports")"
  # With a real node the API server listens on the node's address only: the kubelet, the
  # pods (through the 'kubernetes' Service, whose Endpoints the lease reconciler keeps at that
  # address) and the clients on this machine all reach it there.
  local api_flags=(--endpoint-reconciler-type=none --authorization-mode=RBAC)
  if ((NODE_MODE)); then
    api_ip="$NODE_IP"
    # shellcheck disable=SC2054 # Node,RBAC is one flag value
    api_flags=(
      --endpoint-reconciler-type=lease
      --authorization-mode=Node,RBAC
      --enable-admission-plugins=NodeRestriction
      --kubelet-preferred-address-types=InternalIP
      --kubelet-certificate-authority="$pki/ca.crt"
      --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt"
      --kubelet-client-key="$pki/apiserver-kubelet-client.key"
    )
  fi

  spawn etcd "$BIN_DIR/etcd" \
    --name=eddy \
    --data-dir="$RUN_DIR/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" \
    --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
    --initial-cluster="eddy=http://127.0.0.1:$peer_port" \
    --initial-cluster-state=new \
    --unsafe-no-fsync=true \
    --log-level=warn
  wait_port etcd "$etcd_port"

  # --endpoint-reconciler-type=none: Endpoints may not hold loopback addresses, so the default
  #   reconciler would fail forever to publish 127.0.0.1 for the 'kubernetes' Service.
  # --allow-privileged: no container ever runs; don't reject pod specs a real cluster accepts.
  spawn kube-apiserver "$BIN_DIR/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --bind-address="$api_ip" \
    --advertise-address="$api_ip" \
    --secure-port="$api_port" \
    --tls-cert-file="$pki/apiserver.crt" \
    --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    "${api_flags[@]}" \
    --requestheader-client-ca-file="$pki/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$pki/front-proxy-client.crt" \
    --proxy-client-key-file="$pki/front-proxy-client.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" \
    --service-account-signing-key-file="$pki/sa.key" \
    --allow-privileged=true \
    --profiling=false \
    --v=1
  wait_port kube-apiserver "$api_port" "$api_ip"
  # The controller manager exits if its RBAC bindings are not bootstrapped yet (a kubelet would
  # restart it; nothing does here), so start it only once /readyz is ok.
  wait_ready readyz

  spawn kube-controller-manager "$BIN_DIR/kube-controller-manager" \
    --kubeconfig="$RUN_DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$RUN_DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$RUN_DIR/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 \
    --secure-port="$kcm_port" \
    --leader-elect=false \
    --controllers="$CONTROLLERS" \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$pki/sa.key" \
    --root-ca-file="$pki/ca.crt" \
    --cluster-signing-cert-file="$pki/ca.crt" \
    --cluster-signing-key-file="$pki/ca.key" \
    --cluster-name="eddy-$NAME" \
    --flex-volume-plugin-dir="$RUN_DIR/flexvolume" \
    --kube-api-qps=200 \
    --kube-api-burst=400 \
    --profiling=false \
    --v=1
  wait_port kube-controller-manager "$kcm_port"

  if ((NODE_MODE)); then
    spawn kube-scheduler "$NODE_BIN_DIR/kube-scheduler" \
      --kubeconfig="$RUN_DIR/scheduler.kubeconfig" \
      --authentication-kubeconfig="$RUN_DIR/scheduler.kubeconfig" \
      --authorization-kubeconfig="$RUN_DIR/scheduler.kubeconfig" \
      --bind-address=127.0.0.1 \
      --secure-port="$sched_port" \
      --leader-elect=false \
      --kube-api-qps=100 \
      --kube-api-burst=200 \
      --profiling=false \
      --v=1
    wait_port kube-scheduler "$sched_port"
  fi
}

# The components of this run: kube-scheduler too if the run dir has a bridge (made by
# --node), or with --node when the run dir is yet to be made (set_components new).
set_components() {
  COMPONENTS=(etcd kube-apiserver kube-controller-manager)
  if [[ -f $RUN_DIR/bridge ]] || { [[ ${1:-} == new ]] && ((NODE_MODE)); }; then
    COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)
  fi
}

cmd_start() {
  ensure_bin
  lock 9 "$RUN_ROOT/k8s-$NAME.lock"
  if [[ -d $RUN_DIR ]]; then
    set_components
    if cluster_ready; then
      local had_node=0
      [[ -f $RUN_DIR/bridge ]] && had_node=1
      ((had_node == NODE_MODE)) ||
        die "cluster '$NAME' runs $( ((had_node)) && echo with || echo without) --node; stop it first"
      log "already running ($RUN_DIR)"
      echo "$RUN_DIR/kubeconfig"
      return 0
    fi
    log "found a stale or broken cluster in $RUN_DIR, starting afresh"
    kill_all
    bridge_down
    rm -rf "$RUN_DIR"
  fi
  set_components new
  need_cmd openssl openssl
  local start=$SECONDS api_port api_host=127.0.0.1 nports=4
  mkdir -p "$RUN_DIR/logs"
  NODE_IP=""
  if ((NODE_MODE)); then
    NODE_IP="$(node_ip)"
    api_host="$NODE_IP"
    nports=5
    bridge_up
  fi
  gen_pki

  # Hold the ports lock until every port is bound, so a concurrent start (ours or kafka.sh's)
  # cannot pick the same ones.
  lock 8 "$RUN_ROOT/.ports.lock"
  pick_ports "$nports" >"$RUN_DIR/ports"
  read -r _ _ api_port _ <"$RUN_DIR/ports"
  write_kubeconfig "$RUN_DIR/kubeconfig" admin "https://$api_host:$api_port"
  write_kubeconfig "$RUN_DIR/controller-manager.kubeconfig" controller-manager "https://$api_host:$api_port"
  ((NODE_MODE)) && write_kubeconfig "$RUN_DIR/scheduler.kubeconfig" scheduler "https://$api_host:$api_port"
  log "starting ${COMPONENTS[*]} (ports $(tr ' ' ',' <"$RUN_DIR/ports"))"
  if ! (start_components); then
    kill_all
    exit 1
  fi
  unlock 8

  if ! (wait_ready); then
    kill_all
    exit 1
  fi
  {
    echo "KUBECONFIG=$RUN_DIR/kubeconfig"
    echo "EDDY_K8S_BIN_DIR=$BIN_DIR"
    echo "EDDY_K8S_SERVER=https://$api_host:$api_port"
    echo "EDDY_K8S_VERSION=$(basename "$(dirname "$BIN_DIR")")"
    echo "EDDY_K8S_RUN_DIR=$RUN_DIR"
    if ((NODE_MODE)); then
      echo "EDDY_K8S_NODE_BIN_DIR=$NODE_BIN_DIR"
      echo "EDDY_K8S_NODE_IP=$NODE_IP"
      echo "EDDY_K8S_NODE_SUBNET=$NODE_SUBNET"
      echo "EDDY_K8S_NODE_BRIDGE=$NODE_BRIDGE"
      echo "EDDY_K8S_SERVICE_CIDR=$SERVICE_CIDR"
    fi
  } >"$RUN_DIR/env"
  log "ready in $((SECONDS - start))s: $BIN_DIR/kubectl --kubeconfig $RUN_DIR/kubeconfig"
  echo "$RUN_DIR/kubeconfig"
}

cmd_stop() {
  lock 9 "$RUN_ROOT/k8s-$NAME.lock"
  [[ -d $RUN_DIR ]] || return 0
  if [[ -f $RUN_DIR/bridge && -d $RUN_ROOT/node-$NAME ]]; then
    log "a real node still runs on cluster '$NAME'; stopping it first"
    "$SCRIPT_DIR/node.sh" stop --name "$NAME" || die "node.sh stop --name $NAME failed"
  fi
  set_components
  kill_all
  bridge_down
  rm -rf "$RUN_DIR"
  lock_remove "$RUN_ROOT/k8s-$NAME.lock"
  log "stopped $NAME"
}

cmd_kubeconfig() {
  [[ -f $RUN_DIR/kubeconfig ]] || die "cluster '$NAME' is not running"
  set_components
  local c
  for c in "${COMPONENTS[@]}"; do comp_alive "$c" || die "cluster '$NAME': $c is not running"; done
  echo "$RUN_DIR/kubeconfig"
}

cmd_status() {
  local c rc=0
  [[ -d $RUN_DIR ]] || {
    echo "cluster '$NAME': not running"
    return 1
  }
  set_components
  for c in "${COMPONENTS[@]}"; do
    if comp_alive "$c"; then echo "$c: running (pid $(comp_pid "$c"))"; else
      echo "$c: not running"
      rc=1
    fi
  done
  if ((rc == 0)); then
    ensure_bin
    if cluster_ready; then echo "cluster '$NAME': ready, KUBECONFIG=$RUN_DIR/kubeconfig"; else
      echo "cluster '$NAME': not ready"
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
  NAME=default
  while [[ $# -gt 0 ]]; do
    case $1 in
    --name)
      [[ $# -ge 2 ]] || die "--name needs a value"
      NAME="$2"
      shift 2
      ;;
    --name=*)
      NAME="${1#--name=}"
      shift
      ;;
    --node)
      NODE_MODE=1
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) die "unknown argument '$1' (see cluster.sh --help)" ;;
    esac
  done
  [[ $NAME =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || die "invalid --name '$NAME' (letters, digits, . _ -)"
  RUN_DIR="$RUN_ROOT/k8s-$NAME"
  case $cmd in
  start) cmd_start ;;
  stop) cmd_stop ;;
  kubeconfig) cmd_kubeconfig ;;
  status) cmd_status ;;
  bin)
    ensure_bin
    echo "$BIN_DIR"
    ;;
  -h | --help | help) usage ;;
  *)
    usage
    exit 2
    ;;
  esac
}

main "$@"
