#!/usr/bin/env bash
# Interactive queries under load (see docs/benchmarks.md, "Interactive queries"): builds eddy,
# starts a local broker of its own ("querybench-<pid>", so that two runs never share one)
# unless EDDY_TEST_BOOTSTRAP points at one, runs query-bench with the given arguments (it
# starts and stops its own local control plane, operator and pod runner) and stops the broker.
#
#   bench/queries.sh [--rate GETS_PER_S (5000)] [--seconds S (20)] [--keys N (10000)]
#                    [--input-rate R (2000)] [--backlog N (10000000)] [--json FILE] [--help]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
./e2e/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/eddy/target}
cargo build --release -q --workspace --bins
if [[ -z "${EDDY_TEST_BOOTSTRAP:-}" ]]; then
  broker=querybench-$$
  trap '"$root/e2e/kafka/kafka.sh" stop --name "$broker" >/dev/null 2>&1 || true' EXIT
  EDDY_TEST_BOOTSTRAP=$("$root/e2e/kafka/kafka.sh" start --name "$broker")
  export EDDY_TEST_BOOTSTRAP
fi
"$CARGO_TARGET_DIR/release/query-bench" "$@"
