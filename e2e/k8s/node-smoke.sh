#!/usr/bin/env bash
# Self-test of the real node (node.sh): records the host's state, starts a control plane with
# `cluster.sh start --node` and a node, runs a hardened pod (uid 65532, fsGroup, seccomp
# RuntimeDefault, read-only root, all capabilities dropped) of the local pause image to Ready
# and checks from the host that all of it is in force, runs the eddy-worker image built by
# images/build.sh (if its store has one) the same way, then stops node and control plane
# and checks that the host is as it was. Ends with 'N passed, N failed'. Root only.
#
#   node-smoke.sh [--name NAME] [--keep]   (node.sh smoke [--name NAME] runs it)
#   --keep: leave node and control plane running (node.sh stop; cluster.sh stop)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
ROOT="$(cd "$HERE/../.." && pwd -P)"
RUN_ROOT="${EDDY_RUN:-$HOME/.cache/eddy/run}"
NAME=node
KEEP=0
while (($#)); do
  case $1 in
  --name) NAME=${2:?--name needs a value}; shift ;;
  --keep) KEEP=1 ;;
  *) printf 'usage: node-smoke.sh [--name NAME] [--keep]\n' >&2; exit 2 ;;
  esac
  shift
done
PASSED=0
FAILED=0

log() { printf 'node-smoke: %s\n' "$*" >&2; }
pass() {
  PASSED=$((PASSED + 1))
  printf 'ok   %s\n' "$*"
}
fail() {
  FAILED=$((FAILED + 1))
  printf 'FAIL %s\n' "$*"
}
check() { # DESCRIPTION CMD...
  local what="$1"
  shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# What a node may change on the host, as text: compared before start and after stop.
host_state() {
  local k p ipt
  echo "links: $(ip -o link show | awk -F': ' '{ print $2 }' | cut -d@ -f1 | sort | paste -sd' ' -)"
  echo "addresses: $(ip -o addr show | awk '{ print $2, $4 }' | grep -v ' fe80:' | sort | paste -sd',' -)"
  echo "routes: $(ip route show | sort | paste -sd',' -)"
  echo "mounts: $(awk '{ print $5 }' /proc/self/mountinfo | grep -E "netns|kubelet|containerd|$RUN_ROOT/(node|k8s)-$NAME" | sort | paste -sd' ' -)"
  echo "nft tables: $(nft list tables 2>/dev/null | sort | paste -sd',' -)"
  for ipt in iptables ip6tables; do
    echo "$ipt: $("$ipt-save" 2>/dev/null | grep -E '^(\*|:|-A)' | sed 's/ \[[0-9:]*\]$//' | paste -sd' ' -)"
  done
  echo "kubepods cgroups: $(ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods 2>/dev/null | paste -sd' ' -)"
  for k in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys \
    kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv6.conf.all.forwarding net.ipv4.conf.all.route_localnet \
    net.bridge.bridge-nf-call-iptables net.netfilter.nf_conntrack_max; do
    echo "sysctl $k = $(sysctl -n "$k" 2>/dev/null || echo absent)"
  done
  for p in /var/lib/kubelet /var/log/pods /var/log/containers /etc/kubernetes /usr/libexec/kubernetes \
    /var/run/netns /run/netns /run/containerd /var/lib/containerd /opt/containerd /etc/cni /var/lib/cni /opt/cni; do
    [[ -e $p ]] && echo "path $p"
  done
  # by name, and any process started with one of this test's run dirs in its command line;
  # not zombies (this VM's init reaps the exited daemons it inherits a moment later)
  echo "processes: $({ for p in containerd containerd-shim kubelet kube-proxy kube-scheduler pause; do pgrep -x "$p" || true; done
    pgrep -f "$RUN_ROOT/(node|k8s)-$NAME/" || true; } | sort -u | xargs -r ps -o stat=,comm= -p |
    awk '$1 !~ /^Z/ { print $2 }' | sort | paste -sd' ' -)"
  echo "run dirs: $(ls -d "$RUN_ROOT/node-$NAME" "$RUN_ROOT/k8s-$NAME" 2>/dev/null | paste -sd' ' -)"
}

[[ $(id -u) == 0 ]] || { log "a real node needs root"; exit 1; }
if [[ -d $RUN_ROOT/node-$NAME || -d $RUN_ROOT/k8s-$NAME ]]; then
  log "node or control plane '$NAME' exists already; stopping them for a clean baseline"
  "$HERE/node.sh" stop --name "$NAME"
  "$HERE/cluster.sh" stop --name "$NAME"
fi
TMP="$(mktemp -d)"
host_state >"$TMP/before"

stopped=0
stop_all() {
  "$HERE/node.sh" stop --name "$NAME" || fail "node.sh stop"
  "$HERE/cluster.sh" stop --name "$NAME" || fail "cluster.sh stop"
  stopped=1
}
cleanup() {
  if ((KEEP == 0 && stopped == 0)); then stop_all; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

t=$(now)
KUBECONFIG="$("$HERE/cluster.sh" start --node --name "$NAME" | tail -n 1)"
export KUBECONFIG
log "control plane up in $(since "$t") s"
# shellcheck disable=SC1090
. <(sed 's/^/export /' "$RUN_ROOT/k8s-$NAME/env")
export PATH="$EDDY_K8S_BIN_DIR:$PATH"
t=$(now)
NODE="$("$HERE/node.sh" start --name "$NAME" | tail -n 1)"
log "node $NODE Ready in $(since "$t") s"
SOCK="$RUN_ROOT/node-$NAME/containerd/containerd.sock"

check "node $NODE is Ready with InternalIP $EDDY_K8S_NODE_IP" test \
  "$(kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.addresses[?(@.type=="InternalIP")].address}')" \
  == "True $EDDY_K8S_NODE_IP"
check "the kubernetes Service's endpoint is the API server on the node's address" test \
  "$(kubectl get endpointslices -n default -l kubernetes.io/service-name=kubernetes -o jsonpath='{.items[0].endpoints[0].addresses[0]}')" \
  == "$EDDY_K8S_NODE_IP"

# hardened_pod NAME IMAGE [ARGS...]: the securityContext the chart gives the worker, with an
# fsGroup-owned emptyDir at /data (and, with ARGS, a one-shot container).
hardened_pod() {
  local name="$1" image="$2" args=""
  shift 2
  if (($#)); then
    args="    args: [$(printf '"%s",' "$@" | sed 's/,$//')]"
  fi
  cat <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $name
spec:
  automountServiceAccountToken: false
  restartPolicy: $( (($#)) && echo Never || echo Always)
  securityContext:
    runAsUser: 65532
    runAsGroup: 65532
    runAsNonRoot: true
    fsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
  - name: main
    image: $image
    imagePullPolicy: Never
$args
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: [ALL]
    volumeMounts:
    - name: data
      mountPath: /data
    - name: app
      mountPath: /app
      readOnly: true
  volumes:
  - name: data
    emptyDir: {}
  - name: app
    configMap:
      name: app
      optional: true
EOF
}

t=$(now)
hardened_pod hardened localhost/eddy/pause:1 | kubectl apply -f - >/dev/null
if kubectl wait --for=condition=Ready pod/hardened --timeout=60s >/dev/null; then
  pass "hardened pause pod Ready in $(since "$t") s (from kubectl apply)"
else
  fail "hardened pause pod not Ready within 60 s"
  kubectl describe pod hardened | tail -n 20 >&2 || true
fi

# The container's process as the host sees it: its status, mounts and network namespace.
cid="$(kubectl get pod hardened -o jsonpath='{.status.containerStatuses[0].containerID}')"
cid="${cid#containerd://}"
pid="$(ctr --address "$SOCK" -n k8s.io tasks ls 2>/dev/null | awk -v id="$cid" '$1 == id { print $2 }')"
if [[ $pid =~ ^[0-9]+$ ]]; then
  status="$(cat "/proc/$pid/status")"
  field() { awk -v f="$1:" '$1 == f { $1 = ""; sub(/^ /, ""); print }' <<<"$status"; }
  check "runs as uid 65532, gid 65532 (status: Uid $(field Uid | cut -f1), Gid $(field Gid | cut -f1))" \
    test "$(field Uid | tr -s '\t ' ' ')/$(field Gid | tr -s '\t ' ' ')" == "65532 65532 65532 65532/65532 65532 65532 65532"
  check "supplementary group: the fsGroup 65532" test "$(field Groups | tr -d ' ')" == 65532
  check "no capabilities (effective, permitted, bounding)" test \
    "$(field CapEff) $(field CapPrm) $(field CapBnd)" == "0000000000000000 0000000000000000 0000000000000000"
  check "seccomp filter in force (Seccomp: 2), no_new_privs" test "$(field Seccomp) $(field NoNewPrivs)" == "2 1"
  check "read-only root filesystem" test "$(awk '$5 == "/" { print $6 }' "/proc/$pid/mountinfo" | cut -d, -f1)" == ro
  check "the emptyDir /data is group 65532 with setgid (fsGroup)" test "$(stat -c '%g %a' "/proc/$pid/root/data")" == "65532 2777"
  ip_pod="$(kubectl get pod hardened -o jsonpath='{.status.podIP}')"
  check "pod address $ip_pod is in the node subnet $EDDY_K8S_NODE_SUBNET" test "${ip_pod%.*}" == "${EDDY_K8S_NODE_IP%.*}"
  check "no default route in the pod" test -z "$(nsenter -t "$pid" -n ip route show default)"
  check "the pod's resolv.conf names no server of the machine's" \
    bash -c "! grep -qF -f <(awk '/^nameserver/ { print \$2 }' /etc/resolv.conf) '/proc/$pid/root/etc/resolv.conf'"
  check "its only nameserver is the cluster DNS (CoreDNS on $EDDY_K8S_NODE_IP)" \
    test "$(awk '/^nameserver/ { print $2 }' "/proc/$pid/root/etc/resolv.conf")" == "$EDDY_K8S_NODE_IP"
  check "the pod reaches the API server through the kubernetes Service (kube-proxy nftables)" \
    test "$(nsenter -t "$pid" -n curl -sk --max-time 5 https://10.96.0.1/readyz)" == ok
else
  fail "no task for container $cid in the node's containerd"
fi
check "kubectl logs reaches the kubelet (API server -> node InternalIP, verified serving cert)" \
  kubectl logs hardened

# The eddy-worker image of images/build.sh, if its store has one: exported to an OCI archive,
# imported into the node's containerd, run hardened on an example app (`eddy-worker check`).
STORE="${EDDY_IMAGES:-$HOME/.cache/eddy/images}"
B=(buildah --root "$STORE/storage" --runroot "$STORE/run" --storage-driver "${EDDY_BUILDAH_STORAGE_DRIVER:-vfs}")
worker="$(command -v buildah >/dev/null && [[ -d $STORE/storage ]] &&
  "${B[@]}" images --noheading --format '{{.Name}}:{{.Tag}}' 2>/dev/null | grep '/eddy-worker:' | head -n 1 || true)"
if [[ -n $worker ]]; then
  t=$(now)
  if (
    exec 9>"$STORE/lock"
    flock -w 300 9
    "${B[@]}" push --quiet "$worker" "oci-archive:$TMP/worker.tar:$worker"
  ) && ctr --address "$SOCK" -n k8s.io images import --snapshotter overlayfs "$TMP/worker.tar" >/dev/null; then
    pass "$worker exported and imported into the node's containerd in $(since "$t") s"
  else
    fail "exporting/importing $worker"
  fi
  rm -f "$TMP/worker.tar"
  kubectl create configmap app --from-file=app.yaml="$ROOT/examples/page-views.yaml" >/dev/null
  t=$(now)
  hardened_pod worker-check "$worker" check -f /app/app.yaml | kubectl apply -f - >/dev/null
  if kubectl wait --for=jsonpath='{.status.phase}'=Succeeded pod/worker-check --timeout=60s >/dev/null; then
    pass "hardened $worker ran 'eddy-worker check' to Succeeded in $(since "$t") s"
    check "its output (kubectl logs) is the plan of the app" \
      test "$(kubectl logs worker-check | head -n 1)" == "application page-views"
  else
    fail "hardened $worker did not succeed: $(kubectl get pod worker-check -o jsonpath='{.status.phase} {.status.containerStatuses[0].state}')"
    kubectl logs worker-check >&2 || true
  fi
else
  log "no eddy-worker image in $STORE (images/build.sh makes one); skipping that pod"
fi

# Every listening socket of the node's and the control plane's processes is on 127.0.0.1 or
# the node's address.
pids="$(cat "$RUN_ROOT/node-$NAME"/*.pid "$RUN_ROOT/k8s-$NAME"/*.pid | paste -sd'|' -)"
listeners="$(ss -H -ltunp | grep -E "pid=($pids)," | awk '{ print $5 }' | sort -u)"
check "every listener on 127.0.0.1 or $EDDY_K8S_NODE_IP ($(wc -l <<<"$listeners") sockets)" \
  test -z "$(grep -vE "^(127\.0\.0\.1|${EDDY_K8S_NODE_IP//./\\.}):[0-9]+$" <<<"$listeners")"

if ((KEEP)); then
  log "--keep: node and control plane left running (node.sh stop --name $NAME; cluster.sh stop --name $NAME); host not compared"
else
  t=$(now)
  stop_all
  log "node and control plane stopped in $(since "$t") s"
  host_state >"$TMP/after"
  if diff -u "$TMP/before" "$TMP/after" >"$TMP/diff"; then
    pass "the host is as before (links, addresses, routes, mounts, nftables, iptables, cgroups, sysctls, paths, processes)"
  else
    fail "the host changed:"
    sed -n '3,$p' "$TMP/diff"
  fi
fi

echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
