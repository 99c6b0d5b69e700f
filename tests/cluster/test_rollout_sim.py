"""End-to-end rollouts on the local cluster with simulated engines: the gates, the guard, outages."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import pytest
from kubernetes import client
from tests.cluster.conftest import CACHE
from tests.cluster.rollouts import run_rollout, sim_rollout
from tests.conftest import ROOT

from specgate import api

pytestmark = pytest.mark.cluster


def canary_replicas(api_client: client.ApiClient, namespace: str, name: str) -> int:
    dep = client.AppsV1Api(api_client).read_namespaced_deployment(f"{name}-canary", namespace)
    return int(dep.spec.replicas)


def reasons(api_client: client.ApiClient, namespace: str) -> list[str]:
    return [e.reason for e in client.CoreV1Api(api_client).list_namespaced_event(namespace).items]


def test_good_candidate_is_promoted_while_another_writer_changes_the_object(lab: dict[str, Any]) -> None:
    """A GitOps tool or `kubectl annotate` writes the object throughout, so its resourceVersion keeps
    moving under the operator: status is written by merge patch and children by server-side apply,
    neither conditional on a resourceVersion, so no write may fail with 409 Conflict."""
    objects = client.CustomObjectsApi(lab["api_client"])
    writes: list[int] = []

    def annotate(obj: dict[str, Any]) -> None:
        writes.append(len(writes))
        touched = {"metadata": {"annotations": {"example.com/touched": str(len(writes))}}}
        objects.patch_namespaced_custom_object(
            api.GROUP, api.VERSION, lab["namespace"], api.PLURAL, obj["metadata"]["name"], touched
        )

    run = run_rollout(body=sim_rollout("good", {"SPECGATE_SIM_ALPHA": "0.8"}), during=annotate, **lab)
    status = run.status
    assert status["phase"] == "Promoted", status.get("message")
    assert len(writes) > 20
    assert "Conflict" not in run.operator_log, run.operator_log[-2000:]
    assert run.phases[:2] == ["Baseline", "Canary"] and "Analyzing" in run.phases
    assert status["canary"]["alpha"] == pytest.approx(0.8, abs=0.06)
    # After promotion the guard's own (younger, wider) interval stands in status: it need not clear
    # the gate on its own; the promotion itself was GatesPassed (checked below).
    assert status["canary"]["alphaLower"] <= status["canary"]["alpha"] <= status["canary"]["alphaUpper"]
    assert status["baseline"]["p99ItlMs"] > 0 and status["canary"]["p99ItlMs"] > 0
    assert len(status["canary"]["acceptancePerPosition"]) == 3
    apps = client.AppsV1Api(lab["api_client"])
    assert apps.read_namespaced_deployment("good-baseline", lab["namespace"]).spec.replicas == 0
    assert "GatesPassed" in reasons(lab["api_client"], lab["namespace"])


def test_low_alpha_rolls_back_below_the_gate(lab: dict[str, Any]) -> None:
    run = run_rollout(body=sim_rollout("lowalpha", {"SPECGATE_SIM_ALPHA": "0.3"}), **lab)
    status = run.status
    assert (status["phase"], status["reason"]) == ("RolledBack", "AcceptanceBelowGate"), status.get("message")
    assert status["canary"]["alpha"] == pytest.approx(0.3, abs=0.06)
    assert canary_replicas(lab["api_client"], lab["namespace"], "lowalpha") == 0


def test_worse_p99_itl_rolls_back_with_latency_regression(lab: dict[str, Any]) -> None:
    # A heavy draft: every step pays 3 x 40 ms of drafting, so streaming users see longer stalls.
    env = {"SPECGATE_SIM_ALPHA": "0.85", "SPECGATE_SIM_DRAFT_PASS_MS": "40"}
    run = run_rollout(body=sim_rollout("slow", env), **lab)
    status = run.status
    assert (status["phase"], status["reason"]) == ("RolledBack", "LatencyRegression"), status.get("message")
    assert "P99 ITL (step stall) canary" in status["message"]
    assert canary_replicas(lab["api_client"], lab["namespace"], "slow") == 0


def test_guard_rolls_back_when_alpha_drifts_after_promotion_keeping_every_replica(
    lab: dict[str, Any],
) -> None:
    """replicas 4, maxSurge 1: after promotion the baseline is at 0, so the rollback must grow it
    while the canary serves; run_rollout's CapacityMonitor fails the test below 4 Ready pods."""
    script = "0s:alpha=0.85;130s:alpha=0.15"  # each engine drifts 130 s after it started
    body = sim_rollout("drift", {"SPECGATE_SIM_SCRIPT": script})
    body["spec"]["replicas"] = 4
    run = run_rollout(
        body=body,
        until=lambda obj: obj.get("status", {}).get("phase") in ("RolledBack", "Failed"),
        timeout=540,
        **lab,
    )
    status = run.status
    assert "Promoted" in run.phases, run.phases
    assert (status["phase"], status["reason"]) == ("RolledBack", "GuardTripped"), status.get("message")
    assert "alpha dropped below the gate" in status["message"]
    assert canary_replicas(lab["api_client"], lab["namespace"], "drift") == 0
    baseline = client.AppsV1Api(lab["api_client"]).read_namespaced_deployment(
        "drift-baseline", lab["namespace"]
    )
    assert baseline.spec.replicas == 4


def test_prometheus_outage_never_promotes(lab: dict[str, Any]) -> None:
    pid_file = CACHE / "cluster" / "prometheus.pid"
    stopped: list[bool] = []

    def stop_prometheus_once_analyzing(obj: dict[str, Any]) -> None:
        if obj.get("status", {}).get("phase") == "Analyzing" and not stopped:
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
            stopped.append(True)

    try:
        run = run_rollout(
            body=sim_rollout("outage", {"SPECGATE_SIM_ALPHA": "0.9"}),
            during=stop_prometheus_once_analyzing,
            **lab,
        )
    finally:
        subprocess.run([str(ROOT / "hack" / "cluster-up.sh")], check=True, capture_output=True)
    status = run.status
    assert stopped, "the rollout never reached Analyzing"
    assert "Promoting" not in run.phases and "Promoted" not in run.phases
    assert (status["phase"], status["reason"]) == ("RolledBack", "MetricsUnavailable"), status.get("message")
    assert "MetricsUnavailable" in reasons(lab["api_client"], lab["namespace"])
