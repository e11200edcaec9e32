#!/usr/bin/env bash
# Local Apache Kafka (KRaft, combined broker+controller nodes) for eddy's end-to-end tests.
#
#   kafka.sh start [--brokers N] [--name NAME] [--sasl] [--tls] [--host ADDR]
#                                                start (or reuse) a cluster; prints its bootstrap address last
#   kafka.sh info [--name NAME]                  print its listeners and test credentials (KEY=VALUE lines)
#   kafka.sh stop [--name NAME]                  stop it and remove its run dir (idempotent)
#   kafka.sh bootstrap [--name NAME]             print the bootstrap address, exit 1 if not running
#   kafka.sh node stop|kill|start|pause|resume --name NAME --node I
#                                                fault injection on one node (data and ports kept)
#   kafka.sh tool <alias|MainClass> [args...]    run a Kafka CLI tool on the same classpath
#   kafka.sh fetch                               only resolve the jars (prints the libs dir)
#
# Jars come from Maven Central via pom.xml (next to this script) and are cached in
# ${EDDY_CACHE:-$HOME/.cache/eddy}/kafka/<version>/libs. Run state lives in
# ${EDDY_RUN:-$HOME/.cache/eddy/run}/kafka-<NAME>. See README.md.
set -euo pipefail

KAFKA_VERSION="${EDDY_KAFKA_VERSION:-4.4.0}" # keep in sync with <kafka.version> in pom.xml
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
CACHE_ROOT="${EDDY_CACHE:-$HOME/.cache/eddy}"
RUN_ROOT="${EDDY_RUN:-$HOME/.cache/eddy/run}"
KAFKA_DIR="$CACHE_ROOT/kafka/$KAFKA_VERSION"
LIBS="$KAFKA_DIR/libs"
START_TIMEOUT="${EDDY_KAFKA_START_TIMEOUT:-120}" # seconds
STOP_TIMEOUT="${EDDY_KAFKA_STOP_TIMEOUT:-20}"    # seconds before SIGKILL
HEAP_OPTS="${EDDY_KAFKA_HEAP_OPTS:--Xms256m -Xmx1g}"
TOOL_OPTS="${EDDY_KAFKA_TOOL_OPTS:--Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1}"
# Ports are drawn at random from [PORT_MIN, PORT_MAX): below Linux's ephemeral range
# (32768-60999) and macOS's (49152-65535), so outgoing client sockets never take them.
PORT_MIN="${EDDY_KAFKA_PORT_MIN:-20000}"
PORT_MAX="${EDDY_KAFKA_PORT_MAX:-32000}"
MAX_BROKERS=9

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() {
  printf 'kafka.sh: error: %s\n' "$*" >&2
  exit 1
}

usage() {
  cat >&2 <<EOF
usage: kafka.sh start [--brokers N] [--name NAME] [--sasl] [--tls] [--host ADDR]
       kafka.sh info [--name NAME]
       kafka.sh stop [--name NAME]
       kafka.sh bootstrap [--name NAME]
       kafka.sh node stop|kill|start|pause|resume [--name NAME] --node I
       kafka.sh tool <alias|MainClass> [args...]
       kafka.sh fetch

Kafka $KAFKA_VERSION (EDDY_KAFKA_VERSION), KRaft combined-mode nodes on 127.0.0.1.
NAME defaults to 'default', N to 1 (max $MAX_BROKERS).
--sasl adds a SASL_PLAINTEXT listener (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; user 'eddy' with a
random password), --tls an SSL listener that requires a client certificate (a CA, broker and
client certificates made with openssl and keytool, cached in \$EDDY_CACHE/kafka/tls), both
also a SASL_SSL listener. PLAINTEXT stays the first listener and the printed address; 'info'
prints the others, the credentials and the PEM files. --host ADDR: the clients' listeners listen
on and advertise ADDR, an IPv4 address of this machine (e.g. a bridge that pods reach), instead
of 127.0.0.1; the controllers stay on 127.0.0.1 (not with --tls: its certificate names 127.0.0.1).

tool aliases:
$(tool_aliases | awk '{printf "  %-24s %s\n", $1, $2}')

environment: EDDY_CACHE (jar cache root, default ~/.cache/eddy), EDDY_RUN (run dirs,
default ~/.cache/eddy/run), EDDY_KAFKA_START_TIMEOUT (s, default 120),
EDDY_KAFKA_STOP_TIMEOUT (s, default 20), EDDY_KAFKA_HEAP_OPTS, EDDY_KAFKA_TOOL_OPTS.
EOF
}

# ---------------------------------------------------------------------------- tools

tool_aliases() {
  cat <<'EOF'
topics              org.apache.kafka.tools.TopicCommand
console-producer    org.apache.kafka.tools.ConsoleProducer
console-consumer    org.apache.kafka.tools.consumer.ConsoleConsumer
console-share-consumer org.apache.kafka.tools.consumer.ConsoleShareConsumer
consumer-groups     org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
share-groups        org.apache.kafka.tools.consumer.group.ShareGroupCommand
streams-groups      org.apache.kafka.tools.streams.StreamsGroupCommand
groups              org.apache.kafka.tools.GroupsCommand
get-offsets         org.apache.kafka.tools.GetOffsetShell
configs             org.apache.kafka.tools.ConfigCommand
transactions        org.apache.kafka.tools.TransactionsCommand
delete-records      org.apache.kafka.tools.DeleteRecordsCommand
log-dirs            org.apache.kafka.tools.LogDirsCommand
dump-log            org.apache.kafka.tools.DumpLogSegments
broker-api-versions org.apache.kafka.tools.BrokerApiVersionsCommand
metadata-quorum     org.apache.kafka.tools.MetadataQuorumCommand
features            org.apache.kafka.tools.FeatureCommand
cluster             org.apache.kafka.tools.ClusterTool
acls                org.apache.kafka.tools.AclCommand
leader-election     org.apache.kafka.tools.LeaderElectionCommand
reassign-partitions org.apache.kafka.tools.reassign.ReassignPartitionsCommand
producer-perf-test  org.apache.kafka.tools.ProducerPerformance
consumer-perf-test  org.apache.kafka.tools.ConsumerPerformance
storage             kafka.tools.StorageTool
EOF
}

tool_class() {
  local want="${1#kafka-}" alias cls
  want="${want%.sh}"
  while read -r alias cls; do
    if [[ $alias == "$want" ]]; then
      printf '%s\n' "$cls"
      return 0
    fi
  done < <(tool_aliases)
  if [[ $1 == *.* ]]; then # a fully qualified main class
    printf '%s\n' "$1"
    return 0
  fi
  die "unknown tool '$1' (use a main class name or one of: $(tool_aliases | awk '{print $1}' | paste -sd, -))"
}

# Runs a Kafka CLI tool (no exec); stdin is the caller's.
run_tool() {
  local cls="$1"
  shift
  # shellcheck disable=SC2086 # TOOL_OPTS is a list of JVM flags
  java $TOOL_OPTS -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$SCRIPT_DIR/log4j2-tools.properties" \
    -cp "$LIBS/*" "$cls" "$@"
}

# ---------------------------------------------------------------------------- prerequisites

require_java() {
  command -v java >/dev/null 2>&1 ||
    die "java not found on PATH: install Java 17 (e.g. 'apt-get install openjdk-17-jre-headless')"
  local out version major
  out="$(java -version 2>&1 || true)"
  if [[ $out =~ version\ \"([^\"]+)\" ]]; then
    version="${BASH_REMATCH[1]}"
  else
    die "could not read the Java version from 'java -version': $out"
  fi
  major="${version%%.*}"
  if [[ $major == 1 ]]; then # 1.8.0_x style
    major="${version#1.}"
    major="${major%%.*}"
  fi
  major="${major%%[!0-9]*}"
  if [[ -z $major ]] || ((major < 17)); then
    die "java $version found on PATH but Kafka $KAFKA_VERSION needs Java 17 or newer: install Java 17"
  fi
}

# ---------------------------------------------------------------------------- locking
# lock FD FILE / unlock FD / lock_remove FILE / locks_release
# shellcheck source=../lib/lock.sh
. "$SCRIPT_DIR/../lib/lock.sh"

# ---------------------------------------------------------------------------- jars

libs_stamp_value() {
  printf 'kafka=%s pom=%s\n' "$KAFKA_VERSION" "$(cksum <"$SCRIPT_DIR/pom.xml" | awk '{print $1 "-" $2}')"
}

libs_complete() {
  local stamp="$KAFKA_DIR/libs.stamp"
  [[ -d $LIBS && -f $stamp && "$(cat "$stamp")" == "$(libs_stamp_value)" ]]
}

# Resolves the runtime classpath with Maven once; later runs only check the stamp.
ensure_libs() {
  libs_complete && return 0
  lock 7 "$CACHE_ROOT/kafka/$KAFKA_VERSION.lock"
  if libs_complete; then # another kafka.sh did it while we waited
    unlock 7
    return 0
  fi
  command -v mvn >/dev/null 2>&1 ||
    die "mvn not found on PATH: install Maven (e.g. 'apt-get install maven'); it fetches the Kafka $KAFKA_VERSION jars from Maven Central"
  log "resolving Kafka $KAFKA_VERSION jars from Maven Central into $LIBS (first run only)..."
  local build="$KAFKA_DIR/build" tmp="$KAFKA_DIR/libs.tmp.$$" stamp="$KAFKA_DIR/libs.stamp"
  rm -rf "$build" "$tmp" "$stamp"
  mkdir -p "$build"
  cp "$SCRIPT_DIR/pom.xml" "$build/pom.xml"
  if ! (cd "$build" && mvn -q -B -Dkafka.version="$KAFKA_VERSION" -DincludeScope=runtime \
    -DoutputDirectory="$tmp" dependency:copy-dependencies) >"$build/mvn.log" 2>&1 </dev/null 7>&-; then
    tail -n 30 "$build/mvn.log" >&2 || true
    rm -rf "$tmp"
    die "Maven could not resolve Kafka $KAFKA_VERSION (org.apache.kafka:kafka_2.13:$KAFKA_VERSION); full log: $build/mvn.log"
  fi
  [[ -f $tmp/kafka_2.13-$KAFKA_VERSION.jar && -f $tmp/kafka-tools-$KAFKA_VERSION.jar ]] ||
    die "Maven finished but $tmp lacks kafka_2.13-$KAFKA_VERSION.jar / kafka-tools-$KAFKA_VERSION.jar (see $build/mvn.log)"
  rm -rf "$LIBS"
  mv "$tmp" "$LIBS"
  libs_stamp_value >"$stamp"
  log "cached $(find "$LIBS" -name '*.jar' | wc -l | tr -d ' ') jars in $LIBS"
  unlock 7
}

# ---------------------------------------------------------------------------- cluster state

NAME=default
BROKERS=1
RUN_DIR=
SASL=0
TLS=0
# Address of the clients' listeners (--host): what brokers listen on and advertise.
HOST=127.0.0.1

parse_opts() { # parse_opts ALLOW_BROKERS args...
  local allow_brokers="$1"
  shift
  while (($#)); do
    case "$1" in
    --name) [[ $# -ge 2 ]] || die "--name needs a value"; NAME="$2"; shift 2 ;;
    --name=*) NAME="${1#--name=}"; shift ;;
    --brokers | -n)
      [[ $allow_brokers == 1 ]] || die "$1 only applies to 'start'"
      [[ $# -ge 2 ]] || die "$1 needs a value"; BROKERS="$2"; shift 2 ;;
    --brokers=*)
      [[ $allow_brokers == 1 ]] || die "--brokers only applies to 'start'"
      BROKERS="${1#--brokers=}"; shift ;;
    --sasl | --tls)
      [[ $allow_brokers == 1 ]] || die "$1 only applies to 'start'"
      if [[ $1 == --sasl ]]; then SASL=1; else TLS=1; fi
      shift ;;
    --host)
      [[ $allow_brokers == 1 ]] || die "$1 only applies to 'start'"
      [[ $# -ge 2 ]] || die "$1 needs a value"; HOST="$2"; shift 2 ;;
    --host=*)
      [[ $allow_brokers == 1 ]] || die "--host only applies to 'start'"
      HOST="${1#--host=}"; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unexpected argument '$1' (see 'kafka.sh help')" ;;
    esac
  done
  [[ $NAME =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "invalid --name '$NAME' (letters, digits, . _ -)"
  if ! [[ $BROKERS =~ ^[0-9]+$ ]] || ((BROKERS < 1 || BROKERS > MAX_BROKERS)); then
    die "--brokers must be 1..$MAX_BROKERS, got '$BROKERS'"
  fi
  RUN_DIR="$RUN_ROOT/kafka-$NAME"
  if [[ $HOST != 127.0.0.1 ]]; then
    [[ $HOST =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "--host takes an IPv4 address, not '$HOST' (no names: nothing resolves through DNS)"
    ((TLS == 0)) || die "--tls is for 127.0.0.1 only (the test certificate names 127.0.0.1 and localhost)"
  fi
}

security_line() { # what the listeners are, as the run dir's 'security' file says (as before --host, on 127.0.0.1)
  if [[ $HOST == 127.0.0.1 ]]; then echo "sasl=$SASL tls=$TLS"; else echo "sasl=$SASL tls=$TLS host=$HOST"; fi
}

host_is_local() { # HOST is an address of one of this machine's interfaces
  [[ $HOST == 127.0.0.1 ]] && return 0
  ip -o -4 addr show 2>/dev/null | awk '{ print $4 }' | cut -d/ -f1 | grep -qxF "$HOST"
}

# Is PID alive and the Kafka node whose node dir is DIR? (guards against recycled pids)
node_alive() {
  local pid="$1" dir="$2" args
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  if [[ -r /proc/$pid/cmdline ]]; then
    args="$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" || return 1
  else
    args="$(ps -o args= -p "$pid" 2>/dev/null)" || return 1
  fi
  [[ $args == *"-Deddy.kafka.node=$dir "* ]]
}

# Pids of this cluster's live nodes, one per line.
live_pids() {
  local d pid
  for d in "$RUN_DIR"/node-*; do
    [[ -f $d/pid ]] || continue
    pid="$(cat "$d/pid" 2>/dev/null || true)"
    if node_alive "$pid" "$d"; then echo "$pid"; fi
  done
}

cluster_running() {
  [[ -f $RUN_DIR/bootstrap && -f $RUN_DIR/nodes ]] || return 1
  local n i pid
  n="$(cat "$RUN_DIR/nodes")"
  [[ $n =~ ^[0-9]+$ ]] || return 1
  for ((i = 1; i <= n; i++)); do
    pid="$(cat "$RUN_DIR/node-$i/pid" 2>/dev/null || true)"
    node_alive "$pid" "$RUN_DIR/node-$i" || return 1
  done
}

# SIGTERM all nodes, wait up to STOP_TIMEOUT, then SIGKILL the rest.
stop_nodes() {
  local pids pid waited=0 left
  pids="$(live_pids)"
  [[ -n $pids ]] || return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  while :; do
    left="$(live_pids)"
    [[ -n $left ]] || return 0
    if ((waited >= STOP_TIMEOUT * 5)); then
      log "nodes still up after ${STOP_TIMEOUT}s, sending SIGKILL to: $(paste -sd' ' - <<<"$left")"
      # shellcheck disable=SC2086
      kill -KILL $left 2>/dev/null || true
      break
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
  for ((waited = 0; waited < 50; waited++)); do
    [[ -n "$(live_pids)" ]] || return 0
    sleep 0.2
  done
  die "could not kill Kafka nodes: $(live_pids | paste -sd' ' -)"
}

# ---------------------------------------------------------------------------- ports

# port_listening PORT / pick_ports COUNT
# shellcheck source=../lib/ports.sh
. "$SCRIPT_DIR/../lib/ports.sh"

# ---------------------------------------------------------------------------- start

gen_cluster_id() { # 16 random bytes, URL-safe base64 without padding, like Uuid.randomUuid()
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    [[ ${#id} == 22 && $id != -* && $id != AAAAAAAAAAAAAAAAAAAAA[AQ] ]] && break
  done
  echo "$id"
}

# ---------------------------------------------------------------------------- secured listeners

SASL_USER=eddy
SASL_PASSWORD=
SASL_MECHANISMS=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
TLS_DIR="$CACHE_ROOT/kafka/tls"
# Password of the broker's PKCS#12 key and trust stores (test fixtures, not secrets).
STORE_PASSWORD=eddy-test-store

secure_listeners() { # the extra listeners --sasl / --tls ask for, one per line
  if ((SASL)); then echo SASL_PLAINTEXT; fi
  if ((TLS)); then echo SSL; fi
  if ((SASL && TLS)); then echo SASL_SSL; fi
}

# A CA, a broker certificate for 127.0.0.1/localhost in a PKCS#12 key store, a PKCS#12 trust
# store holding the CA, and a client certificate and key in PEM: made once, valid 10 years.
ensure_tls() {
  [[ -f $TLS_DIR/done ]] && return 0
  lock 6 "$CACHE_ROOT/kafka/tls.lock"
  if [[ -f $TLS_DIR/done ]]; then
    unlock 6
    return 0
  fi
  command -v openssl >/dev/null 2>&1 || die "openssl not found on PATH: --tls needs it (apt-get install openssl)"
  command -v keytool >/dev/null 2>&1 || die "keytool not found on PATH: --tls needs it (it comes with Java 17)"
  log "making test certificates in $TLS_DIR (first --tls start only)..."
  local tmp="$TLS_DIR.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  if ! (
    set -e
    cd "$tmp"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=eddy test CA" \
      -keyout ca.key -out ca.crt
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >broker.ext
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    for who in broker client; do
      openssl req -newkey rsa:2048 -nodes -subj "/CN=eddy-$who" -keyout "$who.key" -out "$who.csr"
      openssl x509 -req -in "$who.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile "$who.ext" -out "$who.crt"
    done
    openssl pkcs12 -export -in broker.crt -inkey broker.key -certfile ca.crt -name broker \
      -out broker.p12 -passout "pass:$STORE_PASSWORD"
    keytool -importcert -noprompt -alias ca -file ca.crt -storetype PKCS12 \
      -keystore truststore.p12 -storepass "$STORE_PASSWORD"
    rm -f ./*.csr ./*.ext ./*.srl
  ) >"$tmp.log" 2>&1 </dev/null 6>&-; then
    cat "$tmp.log" >&2
    rm -rf "$tmp" "$tmp.log"
    die "making test certificates failed (log above)"
  fi
  rm -f "$tmp.log"
  rm -rf "$TLS_DIR"
  mv "$tmp" "$TLS_DIR"
  date >"$TLS_DIR/done"
  unlock 6
}

# server.properties lines for the secured listeners (none without --sasl / --tls).
secure_config() {
  local l
  ((SASL || TLS)) || return 0
  echo
  echo "# Secured listeners (--sasl / --tls); inter-broker and controller traffic stays PLAINTEXT."
  if ((SASL)); then
    echo "sasl.enabled.mechanisms=$SASL_MECHANISMS"
    for l in $(secure_listeners); do
      [[ $l == SASL_* ]] || continue
      l="$(tr 'A-Z' 'a-z' <<<"$l")"
      echo "listener.name.$l.sasl.enabled.mechanisms=$SASL_MECHANISMS"
      echo "listener.name.$l.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$SASL_USER=\"$SASL_PASSWORD\";"
      echo "listener.name.$l.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
      echo "listener.name.$l.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;"
    done
  fi
  if ((TLS)); then
    echo "ssl.keystore.type=PKCS12"
    echo "ssl.keystore.location=$TLS_DIR/broker.p12"
    echo "ssl.keystore.password=$STORE_PASSWORD"
    echo "ssl.truststore.type=PKCS12"
    echo "ssl.truststore.location=$TLS_DIR/truststore.p12"
    echo "ssl.truststore.password=$STORE_PASSWORD"
    echo "# SSL authenticates clients by certificate; SASL_SSL by SASL (a certificate is optional)."
    echo "listener.name.ssl.ssl.client.auth=required"
    if ((SASL)); then echo "listener.name.sasl_ssl.ssl.client.auth=requested"; fi
  fi
}

write_node_config() { # write_node_config ID BROKER_PORT CONTROLLER_PORT VOTERS [SECURE_PORT...]
  local id="$1" bport="$2" cport="$3" voters="$4" dir="$RUN_DIR/node-$1"
  shift 4
  local rf=$((BROKERS < 3 ? BROKERS : 3)) min_isr=$((BROKERS >= 3 ? 2 : 1))
  local listeners="PLAINTEXT://$HOST:$bport,CONTROLLER://127.0.0.1:$cport"
  local advertised="PLAINTEXT://$HOST:$bport" map="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT" l
  for l in $(secure_listeners); do
    listeners+=",$l://$HOST:$1"
    advertised+=",$l://$HOST:$1"
    map+=",$l:$l"
    shift
  done
  mkdir -p "$dir/data" "$dir/logs"
  cat >"$dir/server.properties" <<EOF
# Generated by e2e/kafka/kafka.sh for cluster '$NAME' (Kafka $KAFKA_VERSION, $BROKERS node(s)).
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
listeners=$listeners
advertised.listeners=$advertised
listener.security.protocol.map=$map
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs=$dir/data

# Tests create their topics explicitly.
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=$rf

# Internal topics: sized for $BROKERS node(s); fewer partitions = faster first group/txn use.
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$min_isr
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=$rf
share.coordinator.state.topic.min.isr=$min_isr

# No 3s wait before the first consumer group rebalance.
group.initial.rebalance.delay.ms=0

# Compaction tests: the cleaner runs and re-checks dirty logs every second.
log.cleaner.enable=true
log.cleaner.backoff.ms=1000
# 32 MiB instead of 128 MiB of heap for the cleaner's key map: plenty for test-sized topics.
log.cleaner.dedupe.buffer.size=33554432

# Laptop-sized thread pools.
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
$(secure_config)
EOF
}

print_node_logs() { # tail every node's logs to stderr
  local d
  for d in "$RUN_DIR"/node-*; do
    [[ -d $d ]] || continue
    if [[ -s $d/stdout.log ]]; then
      echo "----- $d/stdout.log (tail)" >&2
      tail -n 15 "$d/stdout.log" >&2 || true
    fi
    if [[ -s $d/logs/server.log ]]; then
      echo "----- $d/logs/server.log (ERROR/FATAL lines, then tail)" >&2
      grep -E ' (ERROR|FATAL) ' "$d/logs/server.log" | tail -n 10 >&2 || true
      tail -n 15 "$d/logs/server.log" >&2 || true
    fi
  done
}

START_IN_PROGRESS=0

# SIGKILL the nodes this start launched. Plain pids (no cmdline check): they are our own
# children from seconds ago, possibly not yet exec'd into java.
kill_started_nodes() {
  local f pid
  for f in "$RUN_DIR"/node-*/pid; do
    [[ -f $f ]] || continue
    pid="$(cat "$f" 2>/dev/null || true)"
    if [[ $pid =~ ^[0-9]+$ ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
}

on_exit() {
  if [[ $START_IN_PROGRESS == 1 && -n $RUN_DIR ]]; then
    kill_started_nodes
    log "start failed; logs kept in $RUN_DIR ('kafka.sh stop --name $NAME' removes it)"
  fi
  locks_release
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bootstrap_of() { # bootstrap_of BROKER_PORT...
  local p list=''
  for p in "$@"; do list+="${list:+,}$HOST:$p"; done
  echo "$list"
}

# Launch node I of RUN_DIR in the background and record its pid. setsid (where present)
# detaches it from the caller's session and signals.
launch_node() {
  local i="$1" d="$RUN_DIR/node-$1" detach=()
  command -v setsid >/dev/null 2>&1 && detach=(setsid)
  # shellcheck disable=SC2086 # HEAP_OPTS is a list of JVM flags
  (cd "$d" && exec ${detach[@]+"${detach[@]}"} java -Deddy.kafka.node="$d" \
    $HEAP_OPTS -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
    -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$RUN_DIR/log4j2.properties" -Dkafka.logs.dir="$d/logs" \
    -cp "$LIBS/*" kafka.Kafka "$d/server.properties") \
    </dev/null >>"$d/stdout.log" 2>&1 7>&- 8>&- 9>&- &
  echo "$!" >"$d/pid"
}

# The cluster's listeners and test credentials, as `kafka.sh info` prints them (mode 600).
write_info() { # write_info BROKER_PORT... SECURE_PORTS_OF_NODE...   (BROKERS of each)
  local bp=("${@:1:BROKERS}") xp=("${@:BROKERS+1}") i k=0 l list ports
  (
    umask 077
    echo "bootstrap=$(bootstrap_of "${bp[@]}")"
    for l in $(secure_listeners); do
      list=''
      for ((i = 0; i < BROKERS; i++)); do
        read -r -a ports <<<"${xp[$i]}"
        list+="${list:+,}$HOST:${ports[$k]}"
      done
      echo "$(tr 'A-Z' 'a-z' <<<"$l")=$list"
      k=$((k + 1))
    done
    if ((SASL)); then
      echo "sasl_mechanisms=$SASL_MECHANISMS"
      echo "sasl_username=$SASL_USER"
      echo "sasl_password=$SASL_PASSWORD"
    fi
    if ((TLS)); then
      echo "ca_file=$TLS_DIR/ca.crt"
      echo "client_cert_file=$TLS_DIR/client.crt"
      echo "client_key_file=$TLS_DIR/client.key"
    fi
  ) >"$RUN_DIR/info"
  security_line >"$RUN_DIR/security"
}

# One attempt: ports, configs, format, launch, wait. Returns 2 if a port was taken meanwhile.
start_attempt() {
  local deadline="$1" i port_list ports=() bports=() cports=() voters='' cluster_id pid d fails
  local secure=() per_node xports=() scram=()
  rm -rf "$RUN_DIR"
  mkdir -p "$RUN_DIR"
  read -r -a secure <<<"$(secure_listeners | paste -sd' ' -)"
  per_node=$((2 + ${#secure[@]}))

  lock 8 "$RUN_ROOT/.ports.lock"
  port_list="$(pick_ports $((per_node * BROKERS)))"
  echo "$port_list" | tr ' ' '\n' >"$RUN_DIR/ports"
  unlock 8
  read -r -a ports <<<"$port_list"
  for ((i = 1; i <= BROKERS; i++)); do
    bports+=("${ports[$((per_node * (i - 1)))]}")
    cports+=("${ports[$((per_node * (i - 1) + 1))]}")
    voters+="${voters:+,}$i@127.0.0.1:${ports[$((per_node * (i - 1) + 1))]}"
    xports+=("${ports[*]:$((per_node * (i - 1) + 2)):${#secure[@]}}")
  done
  if ((SASL)); then
    SASL_PASSWORD="$(head -c 64 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 24)"
    scram=(--add-scram "SCRAM-SHA-256=[name=$SASL_USER,password=$SASL_PASSWORD]"
      --add-scram "SCRAM-SHA-512=[name=$SASL_USER,password=$SASL_PASSWORD]")
  fi
  if ((TLS)); then ensure_tls; fi

  cluster_id="$(gen_cluster_id)"
  echo "$cluster_id" >"$RUN_DIR/cluster-id"
  echo "$KAFKA_VERSION" >"$RUN_DIR/version"
  cp "$SCRIPT_DIR/log4j2-server.properties" "$RUN_DIR/log4j2.properties"
  for ((i = 1; i <= BROKERS; i++)); do
    # shellcheck disable=SC2086 # the node's secure ports, one word each
    write_node_config "$i" "${bports[$((i - 1))]}" "${cports[$((i - 1))]}" "$voters" ${xports[$((i - 1))]}
  done
  write_info "${bports[@]}" "${xports[@]}"

  # Format every node's storage (static quorum from controller.quorum.voters), in parallel.
  local fmt_pids=()
  for ((i = 1; i <= BROKERS; i++)); do
    d="$RUN_DIR/node-$i"
    run_tool kafka.tools.StorageTool format --cluster-id "$cluster_id" --config "$d/server.properties" \
      ${scram[@]+"${scram[@]}"} </dev/null >"$d/format.log" 2>&1 7>&- 8>&- 9>&- &
    fmt_pids+=("$!")
  done
  for ((i = 1; i <= BROKERS; i++)); do
    if ! wait "${fmt_pids[$((i - 1))]}"; then
      cat "$RUN_DIR/node-$i/format.log" >&2 || true
      die "formatting storage of node $i failed (log: $RUN_DIR/node-$i/format.log)"
    fi
  done

  echo "$BROKERS" >"$RUN_DIR/nodes"
  for ((i = 1; i <= BROKERS; i++)); do
    launch_node "$i"
  done

  # Wait until every node logged "Kafka Server started" (in KRaft that is after the broker
  # registered with the quorum and was unfenced).
  local started
  while :; do
    started=0
    fails=
    for ((i = 1; i <= BROKERS; i++)); do
      d="$RUN_DIR/node-$i"
      # Plain kill -0 here: the pid is our own fresh child, which may not have exec'd java yet.
      if ! kill -0 "$(cat "$d/pid")" 2>/dev/null; then
        fails+=" $i"
      elif grep -q 'Kafka Server started' "$d/logs/server.log" 2>/dev/null; then
        started=$((started + 1))
      fi
    done
    if [[ -n $fails ]]; then
      if grep -qs 'Address already in use' "$RUN_DIR"/node-*/logs/server.log "$RUN_DIR"/node-*/stdout.log; then
        kill_started_nodes
        return 2
      fi
      print_node_logs
      die "Kafka node(s)$fails exited during startup (logs in $RUN_DIR)"
    fi
    ((started == BROKERS)) && break
    if ((SECONDS >= deadline)); then
      print_node_logs
      die "cluster '$NAME' not up after ${START_TIMEOUT}s ($started/$BROKERS nodes started; logs in $RUN_DIR)"
    fi
    sleep 0.25
  done

  # Client-side check: a real metadata round trip sees all N brokers.
  local bootstrap out seen
  bootstrap="$(bootstrap_of "${bports[@]}")"
  while :; do
    out="$(run_tool org.apache.kafka.tools.BrokerApiVersionsCommand --bootstrap-server "$bootstrap" \
      </dev/null 2>"$RUN_DIR/ready-check.log" 7>&- 8>&- 9>&-)" || true
    seen="$(printf '%s\n' "$out" | grep -c ' (id: [0-9]* rack: ' || true)"
    ((seen == BROKERS)) && break
    if ((SECONDS >= deadline)); then
      printf '%s\n' "$out" >&2
      cat "$RUN_DIR/ready-check.log" >&2 || true
      die "brokers of '$NAME' started but a client sees $seen/$BROKERS of them after ${START_TIMEOUT}s"
    fi
    sleep 0.5
  done

  for ((i = 1; i <= BROKERS; i++)); do # pid files must name the java processes (stop relies on it)
    node_alive "$(cat "$RUN_DIR/node-$i/pid")" "$RUN_DIR/node-$i" ||
      die "internal error: $RUN_DIR/node-$i/pid does not name node $i's java process"
  done
  echo "$bootstrap" >"$RUN_DIR/bootstrap.tmp"
  mv "$RUN_DIR/bootstrap.tmp" "$RUN_DIR/bootstrap"
}

cmd_start() {
  parse_opts 1 "$@"
  require_java
  host_is_local || die "--host $HOST is no address of this machine's interfaces (ip -4 addr)"
  mkdir -p "$RUN_ROOT"
  lock 9 "$RUN_ROOT/kafka-$NAME.lock"

  if cluster_running; then
    local have
    have="$(cat "$RUN_DIR/nodes")"
    [[ $have == "$BROKERS" ]] ||
      log "warning: cluster '$NAME' is already running with $have node(s), not $BROKERS; 'kafka.sh stop --name $NAME' first to change that"
    [[ "$(cat "$RUN_DIR/security" 2>/dev/null || echo 'sasl=0 tls=0')" == "$(security_line)" ]] ||
      log "warning: cluster '$NAME' is already running with other listeners ($(cat "$RUN_DIR/security" 2>/dev/null || echo 'sasl=0 tls=0')); 'kafka.sh stop --name $NAME' first to change that"
    cat "$RUN_DIR/bootstrap"
    return 0
  fi
  if [[ -e $RUN_DIR ]]; then
    log "cleaning up stale run dir $RUN_DIR"
    stop_nodes
    rm -rf "$RUN_DIR"
  fi

  ensure_libs
  local t0=$SECONDS attempt rc
  START_IN_PROGRESS=1
  for attempt in 1 2 3; do
    rc=0
    start_attempt $((t0 + START_TIMEOUT)) || rc=$?
    [[ $rc == 0 ]] && break
    [[ $rc == 2 && $attempt -lt 3 ]] || die "could not start cluster '$NAME' (ports kept being taken)"
    log "a port was taken by someone else meanwhile; retrying with new ports"
  done
  START_IN_PROGRESS=0
  log "cluster '$NAME' up: $BROKERS node(s), Kafka $KAFKA_VERSION, $((SECONDS - t0))s, run dir $RUN_DIR"
  cat "$RUN_DIR/bootstrap"
}

cmd_stop() {
  parse_opts 0 "$@"
  mkdir -p "$RUN_ROOT"
  lock 9 "$RUN_ROOT/kafka-$NAME.lock"
  if [[ ! -e $RUN_DIR ]]; then
    log "cluster '$NAME' is not running"
    return 0
  fi
  stop_nodes
  rm -rf "$RUN_DIR"
  lock_remove "$RUN_ROOT/kafka-$NAME.lock"
  log "cluster '$NAME' stopped"
}

# kafka.sh node stop|kill|start|pause|resume --name NAME --node I: fault injection on one node of
# a running cluster, keeping its data and ports (a broker restart, a crash, or a frozen broker).
cmd_node() {
  local action="${1:-}" node= args=()
  [[ $# -ge 1 ]] && shift
  while (($#)); do
    case "$1" in
    --node) [[ $# -ge 2 ]] || die "--node needs a value"; node="$2"; shift 2 ;;
    --node=*) node="${1#--node=}"; shift ;;
    *) args+=("$1"); shift ;;
    esac
  done
  parse_opts 0 ${args[@]+"${args[@]}"}
  [[ -f $RUN_DIR/nodes ]] || die "no cluster named '$NAME' (start it first)"
  [[ $node =~ ^[0-9]+$ ]] && ((node >= 1 && node <= $(cat "$RUN_DIR/nodes"))) ||
    die "--node must be 1..$(cat "$RUN_DIR/nodes"), got '$node'"
  local d="$RUN_DIR/node-$node" pid
  pid="$(cat "$d/pid" 2>/dev/null || true)"
  case "$action" in
  stop)
    node_alive "$pid" "$d" || { log "node $node of '$NAME' is not running"; return 0; }
    kill -TERM "$pid"
    local waited
    for ((waited = 0; waited < STOP_TIMEOUT * 5; waited++)); do
      node_alive "$pid" "$d" || { log "node $node of '$NAME' stopped"; return 0; }
      sleep 0.2
    done
    kill -KILL "$pid" 2>/dev/null || true
    log "node $node of '$NAME' killed after ${STOP_TIMEOUT}s"
    ;;
  kill)
    # A crash: no controlled shutdown, the page cache keeps what was written.
    node_alive "$pid" "$d" || { log "node $node of '$NAME' is not running"; return 0; }
    kill -KILL "$pid"
    local waited
    for ((waited = 0; waited < STOP_TIMEOUT * 5; waited++)); do
      node_alive "$pid" "$d" || { log "node $node of '$NAME' killed"; return 0; }
      sleep 0.2
    done
    die "node $node of '$NAME' still running after SIGKILL"
    ;;
  start)
    require_java
    node_alive "$pid" "$d" && { log "node $node of '$NAME' is already running"; return 0; }
    local before
    before="$(grep -c 'Kafka Server started' "$d/logs/server.log" 2>/dev/null || true)"
    launch_node "$node"
    local deadline=$((SECONDS + START_TIMEOUT))
    until (($(grep -c 'Kafka Server started' "$d/logs/server.log" 2>/dev/null || true) > ${before:-0})); do
      kill -0 "$(cat "$d/pid")" 2>/dev/null || { print_node_logs; die "node $node of '$NAME' exited while starting"; }
      ((SECONDS < deadline)) || die "node $node of '$NAME' not started after ${START_TIMEOUT}s"
      sleep 0.25
    done
    log "node $node of '$NAME' started again"
    ;;
  pause | resume)
    node_alive "$pid" "$d" || die "node $node of '$NAME' is not running"
    if [[ $action == pause ]]; then kill -STOP "$pid"; else kill -CONT "$pid"; fi
    log "node $node of '$NAME': $action"
    ;;
  *) die "usage: kafka.sh node stop|kill|start|pause|resume --name NAME --node I" ;;
  esac
}

cmd_bootstrap() {
  parse_opts 0 "$@"
  if cluster_running; then
    cat "$RUN_DIR/bootstrap"
  else
    log "no running Kafka cluster named '$NAME' (start it with 'kafka.sh start --name $NAME')"
    exit 1
  fi
}

cmd_info() {
  parse_opts 0 "$@"
  if cluster_running && [[ -f $RUN_DIR/info ]]; then
    cat "$RUN_DIR/info"
  else
    log "no running Kafka cluster named '$NAME' (start it with 'kafka.sh start --name $NAME')"
    exit 1
  fi
}

cmd_tool() {
  [[ $# -ge 1 ]] || die "usage: kafka.sh tool <alias|MainClass> [args...]"
  local cls
  cls="$(tool_class "$1")"
  shift
  require_java
  ensure_libs
  # shellcheck disable=SC2086
  exec java $TOOL_OPTS -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$SCRIPT_DIR/log4j2-tools.properties" \
    -cp "$LIBS/*" "$cls" "$@"
}

main() {
  local cmd="${1:-help}"
  [[ $# -gt 0 ]] && shift
  case "$cmd" in
  start) cmd_start "$@" ;;
  stop) cmd_stop "$@" ;;
  bootstrap) cmd_bootstrap "$@" ;;
  node) cmd_node "$@" ;;
  info) cmd_info "$@" ;;
  tool) cmd_tool "$@" ;;
  fetch)
    require_java
    ensure_libs
    echo "$LIBS"
    ;;
  help | -h | --help) usage ;;
  *)
    usage
    exit 2
    ;;
  esac
}

main "$@"
