"""The break-even acceptance gate (issue 60; gates.minAcceptanceRatePolicy BreakEven): the cost
model's break-even alpha at the service's concurrency plus a margin, decided once as the analysis
begins, judged by the real decide()."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from tests.unit.rollout_driver import Run, metrics, ready

from specgate import api, gates, planning, schedule
from specgate.api import Phase

H100_TABLE = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "h100-step-costs.jsonl"


def h100_step_ms(batch: int, k: int) -> float:
    """One step on the H100 table (bench/gpu/README.md): the target's pass over k + 1 new tokens a
    request, plus, with drafts, the EAGLE-3 head's k passes (the first over every verified token)."""
    rows = [json.loads(line) for line in H100_TABLE.read_text().splitlines()[1:] if line.strip()]
    ms = {(r["model"], r["B"], r["q"]): r["ms"] for r in rows if r.get("L") == 1024}
    step = ms[("target", batch, k + 1)]
    if k == 0:
        return step
    head = {b * q: v for (model, b, q), v in ms.items() if model == "eagle3_head"}
    return step + head[batch * (k + 1)] + (k - 1) * head[batch]


def h100_spec(policy: str, k: int = 3) -> api.SpeculativeDeploymentSpec:
    return api.parse_spec(
        {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "image": "vllm",
            "replicas": 2,
            "nodeSelector": {schedule.GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"},
            "speculative": {"method": "eagle3", "draftModel": "d", "numSpeculativeTokens": k},
            "rollout": {
                "warmup": "30s",
                "analysisWindow": "60s",
                "maxAnalysisDuration": "10m",
                "progressDeadline": "5m",
                "gates": {"minDrafts": 100, "minLatencySamples": 50, "minAcceptanceRatePolicy": policy},
            },
        }
    )


def analyse(
    spec: api.SpeculativeDeploymentSpec, alpha: float, load: float, windows: int = 40, loads: bool = True
) -> Run:
    """decide() through Baseline, Canary and one look in Analyzing at `load` requests a second per pod
    (the driver's metrics run 2 x load requests per pod), the canary at `alpha`; `loads=False`: no
    track's load measured."""

    def measured(alpha: float | None = None) -> Any:
        figures = metrics(alpha, load=load, windows=windows)
        return figures if loads else replace(figures, load=None)

    run = Run(spec)
    run.step(baseline=ready(2))
    run.step(baseline=ready(2))
    run.step(after=95, baseline=ready(2), baseline_metrics=measured())
    run.expect(Phase.CANARY)
    run.step(baseline=ready(1), canary=ready(1))
    run.expect(Phase.ANALYZING)
    run.now += timedelta(seconds=30)  # the canary's warm-up
    run.step(
        after=70,
        baseline=ready(1),
        canary=ready(1),
        baseline_metrics=measured(),
        canary_metrics=measured(alpha),
    )
    return run


def test_a_canary_below_055_that_pays_at_low_concurrency_is_promoted_with_break_even() -> None:
    """Alpha 0.40 at one running request per pod on an H100 (8B, EAGLE-3, K = 3): the H100 table
    says it pays (its step costs, not the cost model's); the fixed gate rolls it back, BreakEven
    promotes it, with the gate it used in status."""
    plain, speculative = h100_step_ms(1, 0), h100_step_ms(1, 3)
    assert (1 + 3 * 0.40) * plain / speculative > 1.5  # the table: 2.2 tokens for a 1.20x step (1.84x)

    fixed = analyse(h100_spec("Fixed"), 0.40, load=0.5)
    assert (fixed.status.phase, fixed.status.reason) == (Phase.ROLLING_BACK, "AcceptanceBelowGate")
    assert fixed.status.acceptance_gate is None

    break_even = analyse(h100_spec("BreakEven"), 0.40, load=0.5)
    assert break_even.status.phase == Phase.PROMOTING, break_even.status.message
    gate = break_even.status.acceptance_gate
    assert gate is not None and gate.min_acceptance_rate < 0.40 - 0.05
    assert "at 1 running per pod (the baseline's, measured)" in gate.source, gate.source
    assert f"gate {gate.min_acceptance_rate:g} +/- 0.05" in (break_even.status.message or "")

    break_even.step(baseline=ready(1), canary=ready(2))
    assert break_even.status.phase == Phase.PROMOTED, break_even.status.message
    steady = metrics(0.40, windows=120)  # the guard judges the same gate: 0.40 stays promoted
    for _ in range(6):
        break_even.step(
            after=600, canary=ready(2), canary_metrics=steady, guard_acceptance=steady.acceptance,
            guard_block_seconds=15.0,
        )  # fmt: skip
        assert break_even.status.phase == Phase.PROMOTED, break_even.status.message


def test_the_gate_rises_with_the_services_concurrency_and_is_kept_for_the_rollout() -> None:
    """At 64 running per pod a step costs more over a plain one, so the gate is higher; once decided
    it stays, whatever later windows' load (every look and the guard judge against one gate)."""
    low = analyse(h100_spec("BreakEven"), 0.8, load=0.5)
    high = analyse(h100_spec("BreakEven"), 0.8, load=32)  # the driver's metrics: 2 x 32 = 64 running per pod
    assert low.status.acceptance_gate is not None and high.status.acceptance_gate is not None
    assert high.status.acceptance_gate.min_acceptance_rate > low.status.acceptance_gate.min_acceptance_rate
    assert "at 64 running per pod" in high.status.acceptance_gate.source

    kept = analyse(
        h100_spec("BreakEven"), 0.56, load=0.5
    )  # far above the gate: promoting; then a look at another load
    first = kept.status.acceptance_gate
    kept.step(
        after=15, baseline=ready(1), canary=ready(1), baseline_metrics=metrics(load=32),
        canary_metrics=metrics(0.56, load=32),
    )  # fmt: skip
    assert kept.status.acceptance_gate == first


def test_a_draft_that_cannot_pay_gets_the_highest_gate_and_the_margin_is_added() -> None:
    costly = planning.CostModel.from_overhead(2.0)  # a draft pass costs two plain steps
    assert planning.break_even_alpha_for(costly, 3, 1) is None
    gate = gates.break_even_gate(costly, 3, 1.0, 0.05, 0.05, "a test's costs", "measured")
    assert gate.min_acceptance_rate == pytest.approx(0.9)
    assert gate.source.startswith("even alpha 1 does not break even")

    cost = planning.CostModel()
    alpha = planning.break_even_alpha_for(cost, 3, 4)
    assert alpha is not None
    gate = gates.break_even_gate(cost, 3, 4.0, 0.08, 0.05, "physics", "measured")
    assert gate.min_acceptance_rate == pytest.approx(alpha + 0.08, abs=1e-4)
    cheap = gates.break_even_gate(planning.CostModel.from_overhead(0.0), 3, 1.0, 0.0, 0.05, "free", "m")
    assert cheap.min_acceptance_rate == pytest.approx(0.1)  # held where the sequential test has room
    assert "held within [0.10, 0.90]" in cheap.source


def test_without_a_measured_concurrency_the_gate_is_min_acceptance_rate_and_says_so() -> None:
    unmeasured = analyse(h100_spec("BreakEven"), 0.40, load=0.5, loads=False)
    assert (unmeasured.status.phase, unmeasured.status.reason) == (Phase.ROLLING_BACK, "AcceptanceBelowGate")
    gate = unmeasured.status.acceptance_gate
    assert gate is not None and gate.min_acceptance_rate == 0.55
    assert gate.source.startswith("no running requests per pod measured"), gate.source
