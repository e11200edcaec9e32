# shellcheck shell=bash
# Sourced by e2e/k8s/cluster.sh and e2e/k8s/node.sh (not run): their components as detached
# processes with pid files in the run dir. The caller defines RUN_DIR (with a logs/ dir).

# Is PID alive and the component started for run dir DIR? (guards against recycled pids)
proc_alive() {
  local pid="$1" dir="$2" args
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  if [[ -r /proc/$pid/cmdline ]]; then
    args="$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" || return 1
  else
    args="$(ps -o args= -p "$pid" 2>/dev/null)" || return 1
  fi
  [[ $args == *"$dir/"* ]]
}

comp_pid() { cat "$RUN_DIR/$1.pid" 2>/dev/null || true; }
comp_alive() { proc_alive "$(comp_pid "$1")" "$RUN_DIR"; }

# spawn NAME ARGS...: start a component detached from our session, logging to logs/NAME.log.
spawn() {
  local name="$1" pid
  shift
  # 8>&- 9>&-: the lock files' descriptors must not outlive this script in the daemons.
  if command -v setsid >/dev/null 2>&1; then
    setsid "$@" </dev/null >>"$RUN_DIR/logs/$name.log" 2>&1 8>&- 9>&- &
  else
    nohup "$@" </dev/null >>"$RUN_DIR/logs/$name.log" 2>&1 8>&- 9>&- &
  fi
  pid=$!
  echo "$pid" >"$RUN_DIR/$name.pid"
  # Until the forked shell has exec'd the binary, its command line is still ours and
  # comp_alive would call it dead: wait for the exec (or for its death).
  local i
  for ((i = 0; i < 100; i++)); do
    proc_alive "$pid" "$RUN_DIR" && return 0
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.05
  done
}
