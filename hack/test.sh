#!/usr/bin/env bash
# `make test`: every test, in three tiers, timed. The lab (cluster, Prometheus, engines, gateway) is
# up already (the Makefile's prerequisites).
#   unit          tests/unit on both cores (pytest-xdist);
#   cluster-wide  beside it, one at a time: the tests marked cluster_wide (a cluster-wide operator,
#                 an older CRD, the PodMonitor CRD, CPU pinning), which must not run beside others;
#   lab           tests/integration and tests/cluster side by side: the tests that start real vLLM
#                 engines on one worker, one after another and first (tests/conftest.py groups
#                 them), every other module on the other workers (they mostly wait on windows).
# Each tier prints its own report; the last lines are the tiers' times and the total count.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTEST=.venv/bin/pytest
LAB_WORKERS="${SPECGATE_TEST_WORKERS:-3}"
reports="$(mktemp -d)"
trap 'rm -rf "$reports"' EXIT
status=0
times=()

note() {  # note NAME RC SECONDS: a tier's time, and its failure
  times+=("$1=$3s")
  if [ "$2" -ne 0 ]; then
    echo "tier $1 failed (pytest exit $2)"
    status=1
  fi
}

timed() {  # timed NAME COMMAND...
  local name=$1 begun=$SECONDS rc=0
  shift
  "$@" || rc=$?
  note "$name" "$rc" $((SECONDS - begun))
}

pytest_tier() {  # pytest_tier NAME ARGS...: pytest with the tier's JUnit report
  local name=$1
  shift
  "$PYTEST" -q -ra -p no:cacheprovider --junitxml="$reports/$name.xml" "$@"
}

started=$SECONDS
(
  begun=$SECONDS
  pytest_tier cluster-wide --durations=10 -m cluster_wide tests/cluster >"$reports/cluster-wide.log" 2>&1
  echo "$? $((SECONDS - begun))" >"$reports/cluster-wide.rc"
) &
wide=$!
timed unit pytest_tier unit -n 2 --durations=10 tests/unit
wait "$wide"
read -r wide_rc wide_seconds <"$reports/cluster-wide.rc"
echo "=== tier cluster-wide (ran beside the unit tier) ==="
cat "$reports/cluster-wide.log"
note cluster-wide "$wide_rc" "$wide_seconds"
timed lab pytest_tier lab -n "$LAB_WORKERS" --dist loadgroup --no-loadscope-reorder --durations=25 -m "not cluster_wide" \
  tests/integration tests/cluster

echo "test-times: ${times[*]} total=$((SECONDS - started))s"
.venv/bin/python - "$reports" <<'EOF'
"""The tiers' counts from their JUnit reports, as one closing line."""
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
EOF
exit "$status"
