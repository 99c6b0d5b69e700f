#!/usr/bin/env bash
# `make test`: every test, in lines that run side by side, timed. The lab (cluster, Prometheus,
# engines, gateway) is up already (the Makefile's prerequisites).
# First, beside one another:
#   cluster-wide  one at a time: the tests marked cluster_wide (a cluster-wide operator, an older
#                 CRD, the PodMonitor CRD, CPU pinning, fifty rollouts' hundred engines), which must
#                 not run beside other cluster tests (a cluster-wide operator takes every object);
#   unit          tests/unit on both cores (pytest-xdist), then in the same line
#   engines       the integration tests that start real vLLM engines (no operator, no cluster
#                 object: nothing the cluster-wide line can take), one after another: they share
#                 the integration engines.
# Then, side by side (each test in namespaces of its own):
#   vllm-rollouts the cluster rollouts on real vLLM engines, a module on each of two workers: their
#                 time is mostly warm-ups, windows and scrapes, not the engines' CPU;
#   lab           every other integration and cluster module on two workers, a module whole on one
#                 (its module-scoped rollouts start once): simulated rollouts mostly wait on windows;
#   gateway       the tests that share the lab's Traefik, one after another, then the lab modules
#                 marked beside_gateway: this line ends ~15 minutes before the lab's otherwise.
# Last, alone:
#   after-lines   the modules marked after_lines, on two workers: four rollouts through Traefik and
#                 a ten-minute analysis that, beside the three lines, took a two-core lab's API
#                 server into 504s and real engines past their readiness (ci7: 14 failures).
# Each line prints its own report; the last lines are every failure's summary line, the lines' times
# and one count over all.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=.venv/bin/pytest
reports="$(mktemp -d)"
trap 'rm -rf "$reports"' EXIT
status=0
times=()

run_line() {  # run_line NAME PYTEST-ARGS...: pytest, its report and exit status in files
  local name=$1 begun=$SECONDS
  shift
  "$PYTEST" -q -ra -p no:cacheprovider --junitxml="$reports/$name.xml" "$@" >"$reports/$name.log" 2>&1
  echo "$? $((SECONDS - begun))" >"$reports/$name.rc"
}

start_line() {  # start_line NAME PYTEST-ARGS...: run_line in the background
  run_line "$@" &
}

finish_line() {  # finish_line NAME: its report, its time, and its failure
  local name=$1 rc seconds
  read -r rc seconds <"$reports/$name.rc"
  echo "=== $name: pytest exit $rc after ${seconds}s ==="
  cat "$reports/$name.log"
  times+=("$name=${seconds}s")
  [ "$rc" -eq 0 ] || status=1
}

started=$SECONDS
start_line cluster-wide --durations=10 -m cluster_wide tests/cluster
(
  run_line unit -n 2 --durations=10 tests/unit
  run_line engines --durations=0 -m "engine and not cluster_wide" tests/integration
) &
wait
finish_line unit
finish_line engines
finish_line cluster-wide

start_line vllm-rollouts -n 2 --dist loadfile --durations=0 -m "engine and not cluster_wide" tests/cluster
start_line lab -n 2 --dist loadfile --durations=25 \
  -m "not engine and not gateway and not beside_gateway and not cluster_wide and not after_lines" \
  tests/integration tests/cluster
start_line gateway --durations=10 \
  -m "(gateway or beside_gateway) and not engine and not cluster_wide and not after_lines" tests/cluster
wait
finish_line vllm-rollouts
finish_line lab
finish_line gateway

run_line after-lines -n 2 --dist loadfile --durations=10 -m "after_lines and not engine and not cluster_wide" tests/cluster
finish_line after-lines

# Every line's failures once more, a line each with its first message, where a log's tail is read
# (CI shows the last of the output only).
echo "=== failures, all lines ==="
grep -h -E '^(FAILED|ERROR) ' "$reports"/*.log | cut -c1-400 || echo "none"
echo "test-times: ${times[*]} total=$((SECONDS - started))s"
.venv/bin/python - "$reports" <<'PY'
"""The lines' counts from their JUnit reports, as one closing line."""
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
for report in sorted(Path(sys.argv[1]).glob("*.xml")):
    for suite in ET.parse(report).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
failed = totals["failures"] + totals["errors"]
passed = totals["tests"] - failed - totals["skipped"]
print(f"total: {passed} passed, {failed} failed, {totals['skipped']} skipped")
PY
exit "$status"
