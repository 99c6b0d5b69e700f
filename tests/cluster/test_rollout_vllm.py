"""End-to-end rollouts on the local cluster served by real vLLM CPU engines (tiny models)."""

from __future__ import annotations

from typing import Any

import pytest
from tests.cluster.rollouts import fast_rollout, run_rollout
from tests.conftest import load_sample

pytestmark = [pytest.mark.cluster, pytest.mark.engine]

SELF_DRAFT = {"method": "draft_model", "draftModel": "specgate/tiny-llama", "numSpeculativeTokens": 4}


def vllm_rollout(name: str, speculative: dict[str, object], **gates: object) -> dict[str, object]:
    """The tiny CPU sample with the given speculation; its gates (relaxed stall guard, see the
    sample) unless overridden."""
    body = load_sample("tiny-cpu.yaml")
    body["metadata"] = {"name": name}
    spec = body["spec"]
    spec["speculative"] = speculative
    sample_gates = spec["rollout"]["gates"]
    # CPU engines start in minutes, not seconds.
    spec["rollout"] = {**spec["rollout"], **fast_rollout(progressDeadline="8m", maxAnalysisDuration="6m")}
    spec["rollout"]["gates"] = {**sample_gates, "minDrafts": 100, **gates}
    return body


def test_self_draft_is_promoted_with_alpha_one(lab: dict[str, Any]) -> None:
    status = run_rollout(body=vllm_rollout("selfdraft", SELF_DRAFT), timeout=900, concurrency=2, **lab).status
    assert status["phase"] == "Promoted", status.get("message")
    assert status["canary"]["alpha"] == 1.0
    assert status["canary"]["meanAcceptanceLength"] == pytest.approx(5.0)
    assert status["canary"]["acceptancePerPosition"] == [1.0, 1.0, 1.0, 1.0]


def test_stall_guard_rolls_back_a_perfect_draft_that_slows_streaming(lab: dict[str, Any]) -> None:
    """Alpha 1.0 is not enough: on CPU every speculative step stalls the stream far longer than a
    plain step, and the default 10 % P99 ITL tolerance must catch it from the real histograms."""
    body = vllm_rollout("stall", SELF_DRAFT, maxP99ItlRegression=0.10)
    status = run_rollout(body=body, timeout=900, concurrency=2, **lab).status
    assert (status["phase"], status["reason"]) == ("RolledBack", "LatencyRegression"), status.get("message")
    assert status["canary"]["p99ItlMs"] > 1.1 * status["baseline"]["p99ItlMs"]
