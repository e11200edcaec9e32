# shellcheck shell=bash
# Sourced by e2e/kafka/kafka.sh and e2e/k8s/cluster.sh (not run): file locks shared by them, so
# that concurrent starts and stops of one broker or control plane, and of the port picking,
# take turns. The caller defines die(); locks_release belongs in the caller's EXIT trap.
#
#   lock FD FILE     take the lock (flock(1) on FD where available, else a mkdir lock)
#   unlock FD        release it
#   lock_remove FILE remove a held lock's file (a stopped run's), so they do not pile up

MKDIR_LOCKS=()

lock() {
  local fd="$1" file="$2"
  mkdir -p "$(dirname "$file")"
  if command -v flock >/dev/null 2>&1; then
    while :; do
      eval "exec $fd>>\"\$file\""
      flock -w 900 "$fd" || die "timed out waiting for lock $file"
      # Held, unless its holder removed the file meanwhile (lock_remove): then a newcomer may
      # hold the new file's lock, so start over on that one. (Without /proc, not checked.)
      [[ ! -e /proc/$BASHPID/fd/$fd || /proc/$BASHPID/fd/$fd -ef $file ]] && return 0
      eval "exec $fd>&-"
    done
  fi
  local dir="$file.d" waited=0 holder
  until mkdir "$dir" 2>/dev/null; do
    holder="$(cat "$dir/pid" 2>/dev/null || true)"
    if [[ -n $holder ]] && ! kill -0 "$holder" 2>/dev/null; then
      rm -rf "$dir" # stale: its holder is gone
      continue
    fi
    sleep 0.2
    waited=$((waited + 1))
    ((waited < 4500)) || die "timed out waiting for lock $dir (remove it if its holder is gone)"
  done
  echo "$$" >"$dir/pid"
  MKDIR_LOCKS+=("$fd:$dir")
}

unlock() {
  local fd="$1" i
  if command -v flock >/dev/null 2>&1; then
    eval "exec $fd>&-"
    return 0
  fi
  for i in "${!MKDIR_LOCKS[@]}"; do
    if [[ ${MKDIR_LOCKS[$i]%%:*} == "$fd" ]]; then
      rm -rf "${MKDIR_LOCKS[$i]#*:}"
      unset "MKDIR_LOCKS[$i]"
    fi
  done
}

lock_remove() {
  rm -f "$1"
}

locks_release() {
  local l
  for l in "${MKDIR_LOCKS[@]+"${MKDIR_LOCKS[@]}"}"; do rm -rf "${l#*:}"; done
}
