#!/usr/bin/env bash
# The quickstart: starts a local Kafka broker, creates topics, produces sample page views,
# runs examples/page-views.yaml with eddy-worker and prints the views per user.
# `--keep` leaves the broker running afterwards (stop it with e2e/kafka/kafka.sh stop --name demo).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
keep=${1:-}
./e2e/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/eddy/target}
K="$root/e2e/kafka/kafka.sh"
# Each phase says when it starts (time since the start).
step() { printf '==> [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }

step "building eddy-worker (release; a fresh machine compiles RocksDB and librdkafka first, 25-40 minutes, listing each crate)"
cargo build --release -p eddy-worker
worker="$CARGO_TARGET_DIR/release/eddy-worker"

step "starting a local Kafka broker"
bs=$("$K" start --name demo)
work=$(mktemp -d)
cleanup() {
  [[ -n "${wpid:-}" ]] && kill "$wpid" 2>/dev/null && wait "$wpid" 2>/dev/null || true
  [[ "$keep" == --keep ]] || "$K" stop --name demo >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
echo "    bootstrap: $bs" >&2

for t in page-views views-per-user; do
  "$K" tool topics --bootstrap-server "$bs" --create --if-not-exists --topic "$t" --partitions 3 >/dev/null
done

step "producing 1000 page views"
users=(alice bob carol dave erin)
for i in $(seq 0 999); do
  u=${users[$((i % 5))]}
  status=200; (( i % 4 == 3 )) && status=404
  printf 'view-%d\t{"user":"%s","page":"/p/%d","status":%d}\n' "$i" "$u" $((i % 17)) "$status"
done | "$K" tool console-producer --bootstrap-server "$bs" --topic page-views \
  --reader-property parse.key=true --reader-property 'key.separator=	' >/dev/null

step "running eddy-worker on examples/page-views.yaml"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$worker" run -f examples/page-views.yaml --bootstrap-servers "$bs" \
  --state-dir "$work/state" --http-addr "127.0.0.1:$port" 2>"$work/worker.log" &
wpid=$!
for _ in $(seq 1 600); do
  curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  kill -0 "$wpid" 2>/dev/null || { cat "$work/worker.log" >&2; exit 1; }
  sleep 0.2
done
# Wait until the 750 successful views went through both sub-topologies (task 1_* counts
# them); SIGTERM then commits the last counts.
for _ in $(seq 1 600); do
  n=$(curl -fs "http://127.0.0.1:$port/metrics" | awk '/^eddy_records_processed_total\{task="1_/ {s+=$2} END {print s+0}')
  [[ "$n" -ge 750 ]] && break
  sleep 0.2
done
kill -TERM "$wpid"; wait "$wpid"; wpid=

step "views per user (status 200 only), from topic views-per-user:"
"$K" tool console-consumer --bootstrap-server "$bs" --topic views-per-user --from-beginning \
  --isolation-level read_committed --timeout-ms 5000 \
  --formatter-property print.key=true \
  --formatter-property value.deserializer=org.apache.kafka.common.serialization.LongDeserializer 2>/dev/null \
  | awk -F'\t' '{last[$1]=$2} END {for (u in last) printf "  %-6s %s\n", u, last[u]}' | sort
