#!/usr/bin/env bash
# Stop everything cluster-up started: the bridge (and its engines), Prometheus, the control plane.
set -euo pipefail
CACHE="${SPECGATE_CACHE:-$HOME/.cache/specgate}"
STATE="$CACHE/cluster"
export KWOK_WORKDIR="$STATE/kwok"

stop() { # pidfile
  [ -f "$1" ] || return 0
  local pid
  pid="$(cat "$1")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

stop "$STATE/bridge.pid"
stop "$STATE/prometheus.pid"
rm -f "$STATE"/targets/*.json "$STATE"/targets/*/*.json
if [ -x "$CACHE/bin/kwokctl" ]; then
  "$CACHE/bin/kwokctl" delete cluster --name specgate >/dev/null 2>&1 || true
fi
echo "[cluster-down] stopped" >&2
