#!/usr/bin/env bash
# Scale-out, failover and rolling-update pauses, eddy under its operator against Kafka Streams (see
# docs/benchmarks.md, "Scaling and failover"): builds eddy and the reference app, starts a local
# broker named "scalebench" unless EDDY_TEST_BOOTSTRAP points at one, runs scaling-bench with the
# given arguments (it starts and stops its own local control plane, operator and pod runner) and
# stops the broker.
#
#   bench/scaling.sh [--keys N (1000000)] [--partitions P (12)] [--rate R (2000)] [--out DIR]
#                    [--cases eddy-scale-out,eddy-scale-out-no-warmup,eddy-failover,eddy-rollout,
#                             eddy-rollout-no-standby,ks-scale-out,ks-failover-kill,
#                             ks-failover-kill-session-6s,ks-failover-term,ks-rollout,
#                             ks-rollout-standby]
#                    [--ks-balance-wait-s S (300)] [--failover-wait-s S (180)]
#                    [--rollout-wait-s S (600)] [--help]
#
# --out defaults to ~/.cache/eddy/bench-results/scaling (results.json, results.md).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
./e2e/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/eddy/target}
cargo build --release -q --workspace --bins
jar=$(bench/kstreams/build.sh)
if [[ -z "${EDDY_TEST_BOOTSTRAP:-}" ]]; then
  EDDY_TEST_BOOTSTRAP=$("$root/e2e/kafka/kafka.sh" start --name scalebench)
  export EDDY_TEST_BOOTSTRAP
  trap '"$root/e2e/kafka/kafka.sh" stop --name scalebench >/dev/null 2>&1 || true' EXIT
fi
"$CARGO_TARGET_DIR/release/scaling-bench" --jar "$jar" "$@"
