#!/usr/bin/env bash
# Builds the Kafka Streams reference app (a runnable fat jar) and prints the jar's path on stdout.
#
#   bench/kstreams/build.sh            build if pom.xml or src/ changed since the last build
#   bench/kstreams/build.sh --force    always rebuild
#
# Everything is written outside the work tree, under ${EDDY_CACHE:-$HOME/.cache/eddy}/kstreams/:
#   refapp.jar      the jar (replaced atomically)      refapp.stamp  hash of the inputs it was built from
#   build/          Maven's build directory            mvn.log       output of the last Maven run
# Maven runs quiet (-q), in batch mode, single-threaded. Needs Java 17+ and Maven on PATH.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
OUT="${EDDY_CACHE:-$HOME/.cache/eddy}/kstreams"
JAR="$OUT/refapp.jar"
STAMP="$OUT/refapp.stamp"
FORCE=0

die() {
  printf 'build.sh: error: %s\n' "$*" >&2
  exit 1
}

case "${1:-}" in
"") ;;
--force) FORCE=1 ;;
-h | --help) sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
*) die "unexpected argument '$1' (usage: build.sh [--force])" ;;
esac

hash_cmd() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum; else shasum -a 256; fi
}

# Hash of every build input: the pom and all files under src/ (names and contents).
inputs_hash() {
  (
    cd "$SCRIPT_DIR"
    find pom.xml src -type f -print | LC_ALL=C sort | while IFS= read -r f; do
      printf '%s\n' "$f"
      hash_cmd <"$f"
    done
  ) | hash_cmd | awk '{print $1}'
}

up_to_date() {
  [[ $FORCE == 0 && -f $JAR && -f $STAMP && "$(cat "$STAMP")" == "$HASH" ]]
}

HASH="$(inputs_hash)"
if up_to_date; then
  printf '%s\n' "$JAR"
  exit 0
fi

command -v java >/dev/null 2>&1 || die "java not found on PATH (Java 17+ needed)"
command -v mvn >/dev/null 2>&1 || die "mvn not found on PATH (e.g. 'apt-get install maven')"
mkdir -p "$OUT"

# One build at a time per cache dir; a waiting build re-checks the stamp.
if command -v flock >/dev/null 2>&1; then
  exec 9>>"$OUT/build.lock"
  flock -w 900 9 || die "timed out waiting for $OUT/build.lock"
  if up_to_date; then
    printf '%s\n' "$JAR"
    exit 0
  fi
fi

printf 'build.sh: building %s (Maven log: %s)...\n' "$JAR" "$OUT/mvn.log" >&2
rm -f "$STAMP"
if ! (cd "$SCRIPT_DIR" && mvn -B -q -T 1 -Deddy.build.dir="$OUT/build" clean package) \
  >"$OUT/mvn.log" 2>&1 </dev/null 9>&-; then
  tail -n 40 "$OUT/mvn.log" >&2 || true
  die "Maven build failed; full log: $OUT/mvn.log"
fi
[[ -f $OUT/build/refapp.jar ]] || die "Maven finished but $OUT/build/refapp.jar is missing (see $OUT/mvn.log)"
cp "$OUT/build/refapp.jar" "$JAR.tmp.$$"
mv -f "$JAR.tmp.$$" "$JAR"
printf '%s\n' "$HASH" >"$STAMP"
printf '%s\n' "$JAR"
