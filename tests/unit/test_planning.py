"""Planning formulas against hand-computed values and the shape the seeds describe."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specgate import planning
from specgate.cli import main


def test_conditional_rate_round_trips() -> None:
    c = planning.conditional_for_alpha(0.6, 4)
    assert planning.expected_accepted([c] * 4) / 4 == pytest.approx(0.6, abs=1e-9)
    assert planning.conditional_for_alpha(1.0, 3) == pytest.approx(1.0)


def test_cost_model_by_hand() -> None:
    """knee 1 makes the roofline a plain sum: weights_ms * (1 + T / ridge) + kv_ms * max(B, floor) * L."""
    target = planning.Pass(weights_ms=10, ridge_tokens=100, kv_ms=0.5, min_attention_batch=4, knee=1)
    draft = planning.Pass(weights_ms=1, ridge_tokens=100, kv_ms=0.0, knee=1)
    cost = planning.CostModel(
        target=target, draft=draft, context=1000, verify_ms=0.3, spec_engine_ms=2, draft_pass_ms=0.5
    )
    assert cost.step(1, 0) == pytest.approx(10 * 1.01 + 0.5 * 4)
    # verify 16 tokens of 4 requests; engine 0.3 + 2 + 3 x 0.5; draft: one pass over 16, two over 4
    assert cost.step(4, 3) == pytest.approx(10 * 1.16 + 0.5 * 4 + 0.3 + 2 + 1.5 + 1.16 + 2 * 1.04)


def test_speculation_pays_at_low_concurrency_and_not_at_high() -> None:
    """On short contexts a large batch is compute bound and verifying drafts costs what it saves;
    on long ones reading each request's KV dominates and does not grow with K."""
    short = planning.CostModel(context=128)
    assert (
        planning.step_speedup(short, 1, [0.7] * 3) > 1.5 > 1 > planning.step_speedup(short, 1024, [0.7] * 3)
    )
    assert planning.step_speedup(planning.CostModel(context=4096), 1024, [0.7] * 3) > 1


def test_break_even_alpha() -> None:
    even = planning.break_even_alpha(3, overhead=0.05, concurrency=1)
    assert even is not None and 0 < even < 0.2
    assert planning.expected_speedup(even, 3, 0.05) == pytest.approx(1.0, abs=1e-6)
    # a draft pass costing 10 plain steps: 8 drafts cost 81 steps' time for at most 9 tokens
    assert planning.break_even_alpha(8, overhead=10, concurrency=1) is None


def test_recommend_k_stops_where_acceptance_falls_off() -> None:
    # positions 0-1 nearly always accepted, later ones almost never: K=2 is best at batch 1
    advice = planning.recommend_k([95, 90, 5, 1], drafts=100, concurrency=1)
    assert advice is not None and advice.k == 2
    assert [k for k, _ in advice.table] == [1, 2, 3, 4]
    assert "K=2" in advice.message
    assert planning.recommend_k([], 0) is None


@given(st.floats(0, 1), st.integers(1, 16), st.floats(0, 0.5))
def test_speedup_grows_with_alpha(alpha: float, k: int, overhead: float) -> None:
    assert planning.expected_speedup(min(alpha + 0.1, 1), k, overhead) >= planning.expected_speedup(
        alpha, k, overhead
    )


def test_plan_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--alpha", "0.6", "--k", "4", "--concurrency", "8"]) == 0
    out = capsys.readouterr().out
    assert "expected speedup" in out and "break-even alpha" in out and "best K" in out


@pytest.mark.parametrize("batch", [1, 8, 32])
def test_a_measured_step_ratio_gives_back_the_engines_costs(batch: int) -> None:
    """An engine whose draft pass costs 9 ms (15x the default): one run at K=4 measures its step
    ratio, and the fitted model prices every other K as that engine does."""
    engine = planning.CostModel(spec_engine_ms=0.0, draft_pass_ms=9.0)
    ratio = engine.step(batch, 4) / engine.step(batch, 0)
    fitted = planning.CostModel.measured([planning.MeasuredStep(4, ratio, batch)])
    for k in range(1, 9):
        assert fitted.step(batch, k) / fitted.step(batch, 0) == pytest.approx(
            engine.step(batch, k) / engine.step(batch, 0)
        )


def test_two_draft_lengths_tell_a_steps_fixed_extra_from_a_draft_passes() -> None:
    """An engine whose speculative step has a large fixed extra (12 ms) and a small one per draft pass
    (1.5 ms), as the CPU lab's: one run at K=4 reads all of it as per pass and prices K=1 at less
    than half its cost; runs at K=1 (batch 1) and K=4 (batch 8) give the engine back at every K
    and batch."""
    engine = planning.CostModel(spec_engine_ms=12.0, draft_pass_ms=1.5)

    def measured(k: int, batch: int) -> planning.MeasuredStep:
        return planning.MeasuredStep(k, engine.step(batch, k) / engine.step(batch, 0), batch)

    one_run = planning.CostModel.measured([measured(4, 8)])
    assert one_run.step(8, 1) - one_run.step(8, 0) < 0.5 * (engine.step(8, 1) - engine.step(8, 0))
    fitted = planning.CostModel.measured([measured(1, 1), measured(4, 8)])
    assert (fitted.spec_engine_ms, fitted.draft_pass_ms) == pytest.approx((12.0, 1.5))
    for batch, k in itertools.product((1, 8, 32), range(1, 9)):
        assert fitted.step(batch, k) == pytest.approx(engine.step(batch, k))


def test_extras_that_fall_with_k_are_not_fitted_below_zero() -> None:
    """Noise can make a longer draft's step look cheaper than a shorter one's: neither part of the
    fit goes below zero, and the one that explains the points better is kept."""
    base = planning.CostModel(spec_engine_ms=0.0)
    plain = base.step(1, 0)
    steps = [
        planning.MeasuredStep(1, (base.step(1, 1) + 10.0) / plain, 1),
        planning.MeasuredStep(3, (base.step(1, 3) + 9.0) / plain, 1),
    ]
    fitted = planning.CostModel.measured(steps)
    assert fitted.draft_pass_ms == 0.0 and fitted.spec_engine_ms == pytest.approx(9.5)


def test_an_expensive_step_turns_the_advice_to_the_shortest_draft() -> None:
    """Acceptance 0.8, 0.64, 0.51, 0.41: on the default GPU costs K=4 pays; where a K=4 step measured
    6x a plain one (a CPU: every verified token costs a forward pass) no K pays and the least loss
    is K=1."""
    counts, drafts = [80, 64, 51, 41], 100
    assert planning.recommend_k(counts, drafts, concurrency=4).k == 4  # type: ignore[union-attr]
    expensive = planning.CostModel.measured([planning.MeasuredStep(4, 6.0, 4)])
    advice = planning.recommend_k(counts, drafts, expensive, concurrency=4)
    assert advice is not None and advice.k == 1 and advice.expected_speedup < 1


def test_plan_cli_prints_the_table_per_concurrency_and_the_schedule(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--alpha", "0.6", "--k", "3", "--decay", "0.9", "--max-batch", "64"]
    assert main([*args, "--accelerator", "L40S", "--draft", "ngram"]) == 0
    out = capsys.readouterr().out
    assert "on L40S" in out and "ngram drafts" in out
    rows = [line.split() for line in out.splitlines() if line.strip().split(" ")[0].isdigit()]
    assert [int(r[0]) for r in rows] == [1, 2, 4, 8, 16, 32, 64]
    schedule = json.loads(out.strip().splitlines()[-1])
    assert schedule[0][0] == 1 and schedule[-1][1] == 64
    assert all(end >= start and k >= 0 for start, end, k in schedule)


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_one_draft_length_reads_all_the_extra_as_per_pass_whatever_the_rounding(k: int) -> None:
    """A K=3 step 31.4 ms over the physics: 31.4 / 3 x 3 is not 31.4 in floating point, and the
    comparison of the two one-part fits used to read it all as a fixed extra (E = 31.4, D = 0),
    pricing K=1 as dear as K=3. One K is all per pass: 31.4 / k ms a draft pass."""
    base = planning.CostModel(spec_engine_ms=0.0)
    plain = base.step(8, 0)
    fitted = planning.CostModel.measured([planning.MeasuredStep(k, (base.step(8, k) + 31.4) / plain, 8)])
    assert fitted.spec_engine_ms == 0.0
    assert fitted.draft_pass_ms == pytest.approx(31.4 / k)
