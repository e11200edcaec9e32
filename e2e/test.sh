#!/usr/bin/env bash
# Runs every test of eddy: formatting, lints, unit tests and the end-to-end tests on a real
# Kafka broker it starts (and stops) itself. Builds go to a target dir outside the clone
# (~/.cache/eddy/target) so reruns and other clones reuse them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
./e2e/setup.sh

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/eddy/target}
export CARGO_TERM_COLOR=never
# Each phase says when it starts (time since the start): the first run compiles for 25-40
# minutes, and cargo lists what it compiles meanwhile.
step() { printf '\n==> [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "building (release: the tests run the same binaries the benchmark measures; a fresh machine compiles RocksDB and librdkafka first, 25-40 minutes)"
cargo build --release --workspace --all-targets

step "cargo clippy"
cargo clippy --release --workspace --all-targets -- -D warnings

step "container images: buildah builds eddy-worker and eddy-operator from these release binaries, runs --version inside"
./images/build.sh --prebuilt --check

step "helm lint and template (helm and the control plane built from Go modules, cached)"
k8s_bin=$("$root/e2e/k8s/cluster.sh" bin | tail -n 1)
"$k8s_bin/helm" lint charts/eddy-operator
"$k8s_bin/helm" template t charts/eddy-operator --namespace eddy-system >/dev/null
# Every toggle on (e2e/tests/chart.rs sends this through the API server's dry-run).
all_on=(--set monitoring.serviceMonitor.enabled=true --set monitoring.podMonitor.enabled=true
  --set monitoring.dashboard.enabled=true --set rbac.aggregateToDefaultRoles=true
  --set 'watchNamespaces={team-a,team-b}')
"$k8s_bin/helm" lint charts/eddy-operator "${all_on[@]}"
"$k8s_bin/helm" template t charts/eddy-operator --namespace eddy-system "${all_on[@]}" >/dev/null
if "$k8s_bin/helm" template t charts/eddy-operator --set replicaCount=-1 >/dev/null 2>&1; then
  echo "values.schema.json must reject replicaCount=-1" >&2; exit 1
fi
# An upgrade reusing an older release's values (queries.networkPolicy off) still renders.
"$k8s_bin/helm" template t charts/eddy-operator --set queries.networkPolicy.enabled=false \
  --set 'queries.networkPolicy.from[0].podSelector.matchLabels.a=b' >/dev/null

step "alert rules: promtool check rules and test rules, on files/alerts.yaml and the chart's PrometheusRule (promtool, and the Prometheus server e2e/tests/alerts.rs runs, built from their Go module, cached)"
./e2e/prometheus/check-alerts.sh "$k8s_bin/helm"

step "starting a local Kafka broker"
bootstrap=$("$root/e2e/kafka/kafka.sh" start --name test)
trap '"$root/e2e/kafka/kafka.sh" stop --name test >/dev/null 2>&1 || true' EXIT
export EDDY_TEST_BOOTSTRAP=$bootstrap
echo "kafka at $bootstrap" >&2

# Among the test binaries, e2e/tests/node.rs is the real-node tier: as root it starts its own
# control plane with a real node (kubelet, containerd, CNI, kube-proxy: e2e/k8s/node.sh), a
# broker on the node's bridge, loads the images and installs the chart; it stops all of it
# and restores the host when it ends.
step "cargo test (unit, end-to-end, and the real-node tier e2e/tests/node.rs)"
log=$(mktemp)
status=0
cargo test --release --workspace --no-fail-fast -- --test-threads="${EDDY_TEST_THREADS:-2}" 2>&1 | tee "$log" || status=$?
# One closing line for the whole run (cargo ends on a doc-test binary that runs nothing).
awk '/^test result:/ {p += $4; f += $6; s += $8} END {printf "\ntests: %d passed, %d failed, %d skipped\n", p, f, s}' "$log"
rm -f "$log"
exit "$status"
