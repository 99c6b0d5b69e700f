# Shell pieces shared by the lab scripts (sourced, not run).

# Stop the process in a pidfile (its process group where it has one): TERM, up to 15 s, then KILL.
stop_pidfile() {
  [ -f "$1" ] || return 0
  local pid
  pid="$(cat "$1")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}
