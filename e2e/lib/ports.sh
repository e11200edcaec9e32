# shellcheck shell=bash
# Sourced by e2e/kafka/kafka.sh and e2e/k8s/cluster.sh (not run): the local ports their
# processes listen on. The caller defines die(), RUN_ROOT and the range [PORT_MIN, PORT_MAX).

port_listening() { # a TCP connect to 127.0.0.1:PORT succeeds
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Prints COUNT distinct free ports. The caller holds the ports lock ($RUN_ROOT/.ports.lock),
# so two concurrent starts never pick the same ones: ports named in any run dir's 'ports' file
# (brokers' and control planes') count as taken even before they are bound.
pick_ports() {
  local count="$1" used=" " reserved=" " picked=" " out=() p tries=0 addr rest f
  if [[ -r /proc/net/tcp ]]; then # every local TCP port in use, in any state
    while read -r _ addr rest; do
      [[ $addr == *:* ]] || continue
      used+="$((16#${addr##*:})) "
    done < <(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null || true)
  fi
  for f in "$RUN_ROOT"/*/ports; do
    [[ -f $f ]] && reserved+="$(tr '\n' ' ' <"$f") "
  done
  while ((${#out[@]} < count)); do
    tries=$((tries + 1))
    ((tries <= 5000)) || die "could not find $count free TCP ports in $PORT_MIN-$((PORT_MAX - 1))"
    p=$((PORT_MIN + (RANDOM * 32768 + RANDOM) % (PORT_MAX - PORT_MIN)))
    [[ $used == *" $p "* || $reserved == *" $p "* || $picked == *" $p "* ]] && continue
    port_listening "$p" && continue
    out+=("$p")
    picked+="$p "
  done
  echo "${out[*]}"
}
