#!/usr/bin/env bash
# eddy against Kafka Streams (see docs/benchmarks.md, "eddy vs Kafka Streams"): builds eddy and
# the reference app, starts a local broker named "bench" unless EDDY_TEST_BOOTSTRAP points at
# one, runs eddy-vs-kstreams with the given arguments and stops the broker.
#
#   bench/compare.sh [--records N] [--keys K] [--partitions P] [--out DIR] [--check-only] [--publish]
#                    [--cases count:at_least_once,sum:exactly_once,...|keyed|windowed|joins|all]
#                    [--engine both|kstreams] [--jvm-defaults]
#   bench/compare.sh --curve partitions|keys [--points LIST] [--records N] [--keys K | --partitions P]
#
# Kafka Streams' JVM runs with -Xmx512m (a 2 GiB container's default heap) and as many stream
# threads as eddy's processing threads; --jvm-defaults drops the JVM options for contrast.
# --out defaults to ~/.cache/eddy/bench-results (results.json, results.md, ratios.svg).
# --engine kstreams (join cases only) runs Kafka Streams alone against the model of its joins.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
./e2e/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/eddy/target}
cargo build --release -q --workspace --bins
jar=$(bench/kstreams/build.sh)
args=("$@")
if [[ " $* " != *" --out "* ]]; then
  args+=(--out "$HOME/.cache/eddy/bench-results")
fi
if [[ -z "${EDDY_TEST_BOOTSTRAP:-}" ]]; then
  EDDY_TEST_BOOTSTRAP=$("$root/e2e/kafka/kafka.sh" start --name bench)
  export EDDY_TEST_BOOTSTRAP
  trap '"$root/e2e/kafka/kafka.sh" stop --name bench >/dev/null 2>&1 || true' EXIT
fi
"$CARGO_TARGET_DIR/release/eddy-vs-kstreams" --jar "$jar" "${args[@]}"
