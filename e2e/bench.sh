#!/usr/bin/env bash
# The engine benchmark (see docs/benchmarks.md): starts a local broker named "bench" unless
# EDDY_TEST_BOOTSTRAP points at one, runs eddy-bench with the given sizes, prints the table.
# --large-restore runs only the large-state restore (eddy vs raw read vs Kafka Streams).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
./e2e/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/eddy/target}
cargo build --release -q -p eddy-worker -p eddy-e2e --bins
if [[ -z "${EDDY_TEST_BOOTSTRAP:-}" ]]; then
  EDDY_TEST_BOOTSTRAP=$("$root/e2e/kafka/kafka.sh" start --name bench)
  export EDDY_TEST_BOOTSTRAP
  trap '"$root/e2e/kafka/kafka.sh" stop --name bench >/dev/null 2>&1 || true' EXIT
fi
"$CARGO_TARGET_DIR/release/eddy-bench" "$@"
