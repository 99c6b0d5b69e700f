"""The speedup benchmark's pure parts (bench/speedup.py): its vectorized looks are the gate's."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from speedup import (
    FAIL,
    LOOKS,
    NONE,
    PASS,
    check_against_the_operator,
    trial_windows,
    verdicts_per_look,
    window_counts,
)


@pytest.mark.parametrize(("requests", "speedup", "mix"), [(3, 0.97, 0.3), (20, 1.0, 0.0), (200, 1.05, 0.3)])
def test_the_vectorized_looks_are_the_gates_verdicts(requests: int, speedup: float, mix: float) -> None:
    """Every 7th look of a trial recomputed by gates.speedup_gate and decide_speedup_at_deadline:
    check_against_the_operator stops the bench (SystemExit) on any difference."""
    rows = trial_windows(requests, speedup, mix, np.random.default_rng(requests))
    per_look, deadline = verdicts_per_look(rows)
    assert set(per_look) <= {PASS, NONE, FAIL}
    checker = random.Random(1)
    checker.sample = lambda population, k: list(population)[::7]  # type: ignore[method-assign]
    check_against_the_operator(rows, per_look, deadline, checker)


def test_the_traffic_carries_the_cells_requests_a_window_on_average() -> None:
    """Bursts and lulls divided out: 20 requests a window over 200 trials of 240 windows average 20
    within 3 % (a trial's windows are correlated by its bursts)."""
    rng = np.random.default_rng(5)
    mean = np.mean([window_counts(20, rng).mean() for _ in range(200)])
    assert mean == pytest.approx(20, rel=0.03)
    assert len(window_counts(20, rng)) == LOOKS
