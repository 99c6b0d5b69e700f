"""The end-to-end benchmark's pure parts (bench/end_to_end.py): the stopping rule combines the gates
as rollout._analyzing does, and the guard's screen leaves out only looks the operator's gate
cannot fail."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import latency
from end_to_end import (
    ANALYSIS_LOOKS,
    BOUNDS,
    FAIL,
    GUARD_WINDOWS,
    LOOKS,
    NONE,
    PASS,
    WINDOW_SECONDS,
    GuardCell,
    LatencyLooks,
    can_fail,
    candidates,
    guard_look,
    stop,
    window_counts,
)
from specgate.gates import Verdict


def looks_of(*verdicts: int) -> LatencyLooks:
    """Latency verdicts that end: reading past them fails the test (the rule read a look it must not)."""

    def read() -> Iterator[int]:
        yield from verdicts
        raise AssertionError("a latency look read after the rollout stopped")

    return LatencyLooks(read())


def arrays(at: dict[int, int], default: int = NONE) -> np.ndarray:
    values = np.full(LOOKS, default, dtype=np.int64)
    for m, v in at.items():
        values[m - 1] = v
    return values


def test_an_alpha_fail_rolls_back_without_reading_that_looks_latency() -> None:
    outcome = stop(arrays({3: FAIL}), arrays({}), looks_of(NONE, NONE))
    assert (outcome.verdict, outcome.seconds) == (FAIL, 3 * WINDOW_SECONDS)


def test_a_latency_fail_rolls_back_while_alpha_passes() -> None:
    outcome = stop(arrays({}, default=PASS), arrays({}), looks_of(PASS, FAIL))
    assert (outcome.verdict, outcome.seconds) == (FAIL, 2 * WINDOW_SECONDS)


def test_both_passing_promote_only_from_the_analysis_window_on() -> None:
    outcome = stop(arrays({}, default=PASS), arrays({}), looks_of(*[PASS] * ANALYSIS_LOOKS))
    assert (outcome.verdict, outcome.seconds) == (PASS, ANALYSIS_LOOKS * WINDOW_SECONDS)


def test_a_pass_needs_every_gate_at_the_same_look() -> None:
    alpha = arrays({m: PASS for m in range(1, ANALYSIS_LOOKS + 1)})  # alpha undecided afterwards
    latencies = [NONE] * ANALYSIS_LOOKS + [PASS] * (LOOKS - ANALYSIS_LOOKS)
    outcome = stop(alpha, arrays({}, default=PASS), looks_of(*latencies))
    assert (outcome.verdict, outcome.seconds) == (PASS, LOOKS * WINDOW_SECONDS)  # the deadline's side


@pytest.mark.parametrize(("side", "last_latency", "verdict"), [(FAIL, PASS, FAIL), (PASS, NONE, NONE)])
def test_at_the_deadline_alpha_goes_by_its_side_and_a_missing_latency_verdict_is_inconclusive(
    side: int, last_latency: int, verdict: int
) -> None:
    outcome = stop(arrays({}), arrays({LOOKS: side}), looks_of(*[NONE] * (LOOKS - 1), last_latency))
    assert outcome.verdict == verdict


def test_the_guard_window_carried_across_chunks_is_the_last_guard_window_of_windows() -> None:
    rng = np.random.default_rng(1)
    per_window = rng.poisson(2.0, size=(GUARD_WINDOWS * 3, 4))
    first, carried = window_counts(per_window[: GUARD_WINDOWS * 2], None)
    second, _ = window_counts(per_window[GUARD_WINDOWS * 2 :], carried)
    together = np.concatenate([first, second])
    for m in (0, GUARD_WINDOWS - 1, GUARD_WINDOWS, GUARD_WINDOWS * 2 + 5, GUARD_WINDOWS * 3 - 1):
        expected = per_window[max(0, m + 1 - GUARD_WINDOWS) : m + 1].sum(axis=0).cumsum()
        assert together[m].tolist() == expected.tolist()


def stored(requests_windows: float, rng: np.random.Generator) -> latency.Histogram:
    track = latency.baseline_track("gpu", 0.15)
    counts = rng.poisson(requests_windows * track.probabilities(BOUNDS))
    return latency.histogram(BOUNDS, np.cumsum(counts).astype(np.float64))


def slow_windows(cell: GuardCell, ratio: float, windows: int, rng: np.random.Generator) -> np.ndarray:
    base = latency.baseline_track(cell.scale, cell.sigma)
    healthy = rng.poisson(cell.requests * base.probabilities(BOUNDS), size=(GUARD_WINDOWS, len(BOUNDS) + 1))
    slow = latency.Scenario("slow", ratio).canary(base)
    after = rng.poisson(cell.requests * slow.probabilities(BOUNDS), size=(windows, len(BOUNDS) + 1))
    cumulative, _ = window_counts(after, healthy)
    return cumulative


def test_every_look_the_operators_gate_fails_is_a_candidate_of_the_screen() -> None:
    """A canary whose P99 turns 1.5x: the operator's gate, read at every look, fails only at looks
    the screen keeps, and fails at some (the screen is checked against a real trip)."""
    rng = np.random.default_rng(58)
    cell = GuardCell("gpu", 0.15, 200)
    base = stored(200 * 20, rng)
    assert can_fail(base)
    cumulative = slow_windows(cell, 1.5, 40, rng)
    failed = {m for m in range(len(cumulative)) if guard_look(base, cumulative[m]) == Verdict.FAIL}
    assert failed
    assert failed <= set(candidates(cumulative, base).tolist())


def test_a_stored_baseline_too_small_to_bound_its_p99_never_fails_in_the_operators_gate() -> None:
    """400 samples (20 requests a window over analysisWindow) cannot bound a P99 from above at
    LOOK_Z: even a canary three times slower is not failed (the premise of can_fail)."""
    rng = np.random.default_rng(3)
    base = stored(20 * 20, rng)
    assert not can_fail(base)
    cumulative = slow_windows(GuardCell("gpu", 0.15, 20), 3.0, GUARD_WINDOWS, rng)
    assert guard_look(base, cumulative[-1]) != Verdict.FAIL
