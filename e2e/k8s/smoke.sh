#!/usr/bin/env bash
# Self-test of the local control plane (cluster.sh): starts a cluster named 'smoke', checks that
# RBAC is enforced, that the StatefulSet controller creates Pods and PVCs, that the garbage
# collector removes them, that the ReplicaSet/Deployment controllers work through a helm
# install, then stops the cluster. Ends with 'N passed, N failed'.
#
#   smoke.sh [--keep]      --keep: leave the cluster running (cluster.sh stop --name smoke)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
NAME=smoke
KEEP=0
[[ ${1:-} == --keep ]] && KEEP=1
PASSED=0
FAILED=0

log() { printf 'smoke.sh: %s\n' "$*" >&2; }
pass() {
  PASSED=$((PASSED + 1))
  printf 'ok   %s\n' "$*"
}
fail() {
  FAILED=$((FAILED + 1))
  printf 'FAIL %s\n' "$*"
}
# check DESCRIPTION CMD...: run CMD, pass if it succeeds
check() {
  local what="$1"
  shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}
# eventually TIMEOUT DESCRIPTION CMD...: retry CMD every 0.5 s until it succeeds
eventually() {
  local timeout="$1" what="$2" deadline
  shift 2
  deadline=$((SECONDS + timeout))
  until "$@" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      fail "$what (not within ${timeout}s)"
      return 0
    fi
    sleep 0.5
  done
  pass "$what"
}

BIN="$("$HERE/cluster.sh" bin | tail -n 1)"
export PATH="$BIN:$PATH"
t0=$SECONDS
KUBECONFIG="$("$HERE/cluster.sh" start --name "$NAME" | tail -n 1)"
export KUBECONFIG
log "cluster up in $((SECONDS - t0))s"
TMP="$(mktemp -d)"
cleanup() {
  rm -rf "$TMP"
  if ((KEEP == 0)); then "$HERE/cluster.sh" stop --name "$NAME"; fi
}
trap cleanup EXIT

count() { # KIND NAMESPACE SELECTOR: number of objects
  kubectl -n "$2" get "$1" -l "$3" -o name 2>/dev/null | grep -c . || true
}
count_is() { [[ "$(count "$1" "$2" "$3")" == "$4" ]]; }
quiet() { "$@" >/dev/null; }
output_is() { # EXPECTED CMD...: CMD prints exactly EXPECTED
  local want="$1"
  shift
  [[ "$("$@" 2>/dev/null)" == "$want" ]]
}

check "kubectl get namespaces" quiet kubectl get namespaces
check "server version is $(basename "$(dirname "$BIN")")" \
  bash -c "kubectl get --raw /version | grep -q '\"gitVersion\": \"$(basename "$(dirname "$BIN")")\"'"
check "create namespace smoke" quiet kubectl create namespace smoke
eventually 60 "serviceaccount controller creates smoke/default" quiet kubectl -n smoke get serviceaccount default

# RBAC is really enforced: a service account without bindings may not read secrets...
check "RBAC denies an unbound service account" \
  output_is no kubectl auth can-i list secrets -n smoke --as=system:serviceaccount:smoke:default
kubectl -n smoke create role secret-reader --verb=get,list --resource=secrets >/dev/null
kubectl -n smoke create rolebinding secret-reader --role=secret-reader --serviceaccount=smoke:default >/dev/null
check "RBAC allows it after a RoleBinding" \
  output_is yes kubectl auth can-i list secrets -n smoke --as=system:serviceaccount:smoke:default

# StatefulSet -> Pods + PVCs (Parallel: with no kubelet, pods never become Ready, so
# OrderedReady would stop after web-0).
cat >"$TMP/sts.yaml" <<'EOF'
apiVersion: v1
kind: Service
metadata: {name: web, namespace: smoke}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web, namespace: smoke}
spec:
  serviceName: web
  replicas: 2
  podManagementPolicy: Parallel
  persistentVolumeClaimRetentionPolicy: {whenDeleted: Delete, whenScaled: Retain}
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - name: web
        image: registry.invalid/web:1
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data, labels: {app: web}}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 1Gi}}
EOF
check "apply a StatefulSet with a volumeClaimTemplate" quiet kubectl apply -f "$TMP/sts.yaml"
eventually 60 "statefulset controller creates 2 Pods" count_is pods smoke app=web 2
eventually 60 "statefulset controller creates 2 PVCs" count_is pvc smoke app=web 2
check "pod web-0 is owned by the StatefulSet" \
  output_is StatefulSet/web kubectl -n smoke get pod web-0 \
  -o 'jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}'
check "PVCs stay Pending (no provisioner)" \
  output_is Pending kubectl -n smoke get pvc data-web-0 -o 'jsonpath={.status.phase}'
check "delete the StatefulSet" quiet kubectl -n smoke delete statefulset web --wait=false
eventually 90 "garbage collector removes its Pods" count_is pods smoke app=web 0
eventually 90 "garbage collector removes its PVCs (whenDeleted: Delete)" count_is pvc smoke app=web 0

# helm: version, lint, template, and a real install (Deployment -> ReplicaSet -> Pod).
check "helm version ($(helm version --short))" quiet helm version
check "helm create a chart" quiet helm create "$TMP/chart"
check "helm lint" quiet helm lint "$TMP/chart"
check "helm template" bash -c "helm template smoke '$TMP/chart' | grep -q 'kind: Deployment'"
check "helm install" quiet helm install smoke "$TMP/chart" -n smoke --set serviceAccount.create=true
eventually 60 "deployment controller creates a ReplicaSet" count_is replicasets smoke app.kubernetes.io/instance=smoke 1
eventually 60 "replicaset controller creates a Pod" count_is pods smoke app.kubernetes.io/instance=smoke 1
check "helm uninstall" quiet helm uninstall smoke -n smoke
eventually 90 "garbage collector removes the release's Pods" count_is pods smoke app.kubernetes.io/instance=smoke 0
check "delete namespace smoke" quiet kubectl delete namespace smoke --wait=false
eventually 120 "namespace controller finalizes namespace smoke" \
  bash -c '! kubectl get namespace smoke >/dev/null 2>&1'

echo "k8s smoke: $PASSED passed, $FAILED failed"
((FAILED == 0))
