"""The step-stall gate counted in engine steps (issue 58): vLLM's inter_token_latency_seconds has one
sample per running request per engine step, all of a step alike, so its sample size is the step
count (vllm:iteration_tokens_total's count), not its samples.

The hand-built cases use bounds 10/20/40/80 ms and +Inf, cumulative counts, and the conventions of
test_latency_gate.py. The simulated histories draw step times
from a decode mode and a prefill-chunk mode and record each step once per running request.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import numpy.typing as npt
import pytest

from specgate.gates import Histogram, Verdict, per_step, step_stall_gate

INF = math.inf
BOUNDS = (0.01, 0.02, 0.04, 0.08, INF)
# 400 samples of 8 running requests: 50 steps, identical on both tracks.
SAMPLES = Histogram(BOUNDS, (0.0, 360.0, 392.0, 400.0, 400.0))


def test_the_counts_are_scaled_to_the_steps_keeping_the_shape() -> None:
    # 400 samples over 50 steps: every count times 50 / 400 = 1/8
    assert per_step(SAMPLES, 50.0).counts == (0.0, 45.0, 49.0, 50.0, 50.0)


def test_counts_stay_without_a_step_count_or_with_more_steps_than_samples() -> None:
    """Fewer samples than steps: each sample is a step's of its own (under one request running)."""
    assert per_step(SAMPLES, None) == SAMPLES
    assert per_step(SAMPLES, 1000.0) == SAMPLES
    assert per_step(SAMPLES, 0.0) == SAMPLES


def test_the_bracket_is_that_of_the_steps() -> None:
    """50 steps of 8 running requests: counted in steps, 50 samples, far below the 2.3^2 * 99 =
    523.7 that let a rank bound a P99 from above, on buckets (40-80 ms) wider than the 50 %
    tolerance (ln 2 > ln 1.5): undecided, saying so in steps."""
    result = step_stall_gate(SAMPLES, SAMPLES, 50.0, 50.0, max_regression=0.5, min_count=50)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.samples == 50
    assert "over 50 samples counted in engine steps" in result.message
    assert result.message.endswith("no rank of 50 samples bounds a P99 from above, need 524")


def test_min_latency_samples_counts_steps() -> None:
    result = step_stall_gate(SAMPLES, SAMPLES, 50.0, 80.0, max_regression=0.5, min_count=100)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.message == (
        "50 P99 ITL (step stall) samples counted in engine steps on the smaller track, need 100"
    )


def test_without_a_step_count_the_samples_count_and_the_message_says_so() -> None:
    result = step_stall_gate(SAMPLES, SAMPLES, 50.0, None, max_regression=0.5, min_count=100)
    assert result.samples == 400
    assert "no rank of 400 samples bounds a P99 from above, need 524" in result.message
    assert result.message.endswith(
        "; no engine step count for the canary (vllm:iteration_tokens_total): samples counted as independent"
    )


# --- simulated histories ---

RUNNING = 8  # requests running: each step's time is recorded 8 times
FINE = (*(0.005 * 1.05**i for i in range(123)), INF)  # 5 % apart, 5 ms to about 2 s
DEFAULT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
DEFAULT_BUCKETS = (*DEFAULT, 40.0, 80.0, INF)  # vLLM 0.32's inter_token_latency buckets
DECODE = (0.030, 0.15)  # median seconds, log-sd
PREFILL = (0.090, 0.20)
PREFILL_SHARE = 0.03  # steps that carry a prefill chunk: a flat stretch of the distribution below its P99
STEPS_PER_LOOK = 900  # about 30 s of 32 ms steps
LOOKS = 20  # every 30 s for 10 minutes
HISTORIES = 200


def step_shares(bounds: tuple[float, ...], slower: float) -> npt.NDArray[np.float64]:
    """The share of steps in each bucket, every step `slower` times as long as the baseline's."""
    normal = NormalDist()

    def below(x: float) -> float:
        if math.isinf(x):
            return 1.0
        modes = ((1 - PREFILL_SHARE, DECODE), (PREFILL_SHARE, PREFILL))
        return sum(w * normal.cdf(math.log(x / (slower * m)) / sd) for w, (m, sd) in modes)

    return np.diff([0.0, *(below(b) for b in bounds)])


def history(rng: np.random.Generator, shares: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Cumulative ITL bucket counts at each look: the steps drawn, each recorded RUNNING times."""
    steps = rng.multinomial(STEPS_PER_LOOK, shares, size=LOOKS)
    return np.cumsum(np.cumsum(steps, axis=0), axis=1) * float(RUNNING)


def verdicts(slower: float, bounds: tuple[float, ...], seed: int) -> list[Verdict]:
    """Each history's verdict: Fail at the first look that fails, else the last look's."""
    rng = np.random.default_rng(seed)
    base_shares, canary_shares = step_shares(bounds, 1.0), step_shares(bounds, slower)
    steps = [STEPS_PER_LOOK * (k + 1.0) for k in range(LOOKS)]
    out = []
    for _ in range(HISTORIES):
        base, canary = history(rng, base_shares), history(rng, canary_shares)
        verdict = Verdict.INSUFFICIENT_DATA
        for k, n in enumerate(steps):
            verdict = step_stall_gate(
                Histogram(bounds, tuple(base[k])), Histogram(bounds, tuple(canary[k])), n, n,
                max_regression=0.5, min_count=100,
            ).verdict  # fmt: skip
            if verdict == Verdict.FAIL:
                break
        out.append(verdict)
    return out


@pytest.mark.parametrize("bounds", [FINE, DEFAULT_BUCKETS], ids=["5% buckets", "vLLM default buckets"])
@pytest.mark.parametrize("slower", [1.0, 1.2])
def test_steps_within_the_tolerance_are_not_failed_beyond_the_error_rate(
    slower: float, bounds: tuple[float, ...]
) -> None:
    """Identical steps, and steps uniformly 1.2x longer (under the 1.5x tolerance), at 8 running:
    counted per sample, with the heavier-tail check the stall gate had, 37 and 101 of these 200
    histories failed on 5 % buckets (22 and 96 on the default ones); the issue's bound is 2 %."""
    failed = verdicts(slower, bounds, seed=58).count(Verdict.FAIL)
    assert failed <= 0.02 * HISTORIES


@pytest.mark.parametrize("bounds", [FINE, DEFAULT_BUCKETS], ids=["5% buckets", "vLLM default buckets"])
def test_a_stall_twice_as_long_still_fails(bounds: tuple[float, ...]) -> None:
    found = verdicts(2.0, bounds, seed=59)
    assert found.count(Verdict.FAIL) >= 0.95 * HISTORIES
    assert Verdict.PASS not in found
