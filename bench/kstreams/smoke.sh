#!/usr/bin/env bash
# End-to-end check of the Kafka Streams reference app on a throwaway local broker:
# generate the input, run count and sum under at_least_once and exactly_once_v2 with --expect,
# check every output with Verify, then --restore-only each app id after deleting its state dir.
# Prints the JSON lines of every step on stdout (progress on stderr); exits non-zero on failure.
#
#   bench/kstreams/smoke.sh [--records N (50000)] [--keys K (1000)] [--keep]
#
# --keep leaves the broker (name kstreams-smoke, or $EDDY_KSTREAMS_BROKER) running.
# The at_least_once runs take ~30 s each: that is Kafka Streams' default commit.interval.ms.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
KAFKA="$HERE/../../e2e/kafka/kafka.sh"
NAME="${EDDY_KSTREAMS_BROKER:-kstreams-smoke}"
RECORDS=50000
KEYS=1000
KEEP=0
while (($#)); do
  case "$1" in
  --records) RECORDS="$2"; shift 2 ;;
  --keys) KEYS="$2"; shift 2 ;;
  --keep) KEEP=1; shift ;;
  -h | --help) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
  *) echo "smoke.sh: unexpected argument '$1'" >&2; exit 2 ;;
  esac
done

JAR="$("$HERE/build.sh")"
BS="$("$KAFKA" start --name "$NAME")"
STATE="$(mktemp -d "${TMPDIR:-/tmp}/eddy-kstreams-smoke.XXXXXX")"
cleanup() {
  rm -rf "$STATE"
  if [[ $KEEP == 0 ]]; then "$KAFKA" stop --name "$NAME" >&2 || true; fi
}
trap cleanup EXIT

RUN="$(date +%s)"
IN="smoke-in-$RUN"
LOGS="$STATE/logs"
mkdir -p "$LOGS"
step() { printf 'smoke.sh: %s\n' "$*" >&2; }

step "broker $BS, jar $JAR"
java -cp "$JAR" dev.eddy.bench.Generate --bootstrap "$BS" --topic "$IN" \
  --records "$RECORDS" --keys "$KEYS" --partitions 12 --seed 1 2>"$LOGS/generate.err"

for case in count sum; do
  for g in at_least_once exactly_once_v2; do
    id="smoke-$case-${g%%_*}-$RUN"
    step "$case $g: run (app id $id)"
    common=(--bootstrap "$BS" --app-id "$id" --case "$case" --guarantee "$g"
      --input "$IN" --output "$id-out" --state-dir "$STATE/state")
    java -jar "$JAR" "${common[@]}" --expect "$RECORDS" 2>"$LOGS/$id.err" ||
      { tail -n 30 "$LOGS/$id.err" >&2; exit 1; }
    step "$case $g: verify"
    java -cp "$JAR" dev.eddy.bench.Verify --bootstrap "$BS" --case "$case" \
      --input "$IN" --output "$id-out" 2>"$LOGS/$id-verify.err" ||
      { cat "$LOGS/$id-verify.err" >&2; exit 1; }
    step "$case $g: restore"
    rm -rf "${STATE:?}/state/$id"
    java -jar "$JAR" "${common[@]}" --restore-only 2>"$LOGS/$id-restore.err" ||
      { tail -n 30 "$LOGS/$id-restore.err" >&2; exit 1; }
  done
done
step "all good"
