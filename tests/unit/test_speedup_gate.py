"""The speedup gate (gates/speedup.py): expected figures and verdicts derived by hand in each test."""

from __future__ import annotations

import math

import pytest

from specgate.gates import PerTokenWindow, Verdict, decide_speedup_at_deadline, speedup_gate


def window(
    baseline_ms: float, canary_ms: float, requests: float = 10.0, end: float | None = None
) -> PerTokenWindow:
    """A window whose tracks' means are these (ms per output token), `requests` on each track."""
    return PerTokenWindow(baseline_ms / 1000 * requests, requests, canary_ms / 1000 * requests, requests, end)


def test_the_estimate_is_the_ratio_of_exact_means_weighted_by_requests() -> None:
    """Window 1: one request a track (weight 1 / (1 + 1) = 0.5), baseline 30 ms, canary 10 ms;
    window 2: 100 a track (weight 50), 20 and 20 ms; window 3: 100 and 100, 20 and 25 ms (weight
    50). S = (0.5 x 30 + 50 x 20 + 50 x 20) / (0.5 x 10 + 50 x 20 + 50 x 25) = 2015 / 2255 = 0.8936:
    the one-request window's 3x barely counts."""
    windows = [window(30, 10, 1), window(20, 20, 100), window(20, 25, 100)]
    result = speedup_gate(windows, 1.0)
    assert result.estimate == pytest.approx(2015 / 2255)
    assert result.samples == 201


def test_a_canary_20_percent_faster_in_every_window_passes() -> None:
    """Twelve windows, the mix swinging the baseline's pace from 15 to 40 ms and the canary's with
    it (1 / 1.2 of it, +-1 %): the paired ratio cancels the swing, S = 1.2 within the 1 %."""
    paces = [15, 20, 30, 40, 35, 25, 18, 22, 33, 38, 27, 16]
    windows = [window(p, p / 1.2 * (1.01 if i % 2 else 0.99)) for i, p in enumerate(paces)]
    result = speedup_gate(windows, 1.0)
    assert result.verdict == Verdict.PASS
    assert result.estimate == pytest.approx(1.2, rel=0.011)
    assert result.lower is not None and result.lower > 1.03
    assert "per-request mean of request_time_per_output_token" in result.message


def test_a_canary_10_percent_slower_in_every_window_fails() -> None:
    paces = [15, 20, 30, 40, 35, 25, 18, 22, 33, 38, 27, 16]
    windows = [window(p, p * 1.1 * (1.01 if i % 2 else 0.99)) for i, p in enumerate(paces)]
    result = speedup_gate(windows, 1.0)
    assert result.verdict == Verdict.FAIL
    assert result.estimate == pytest.approx(1 / 1.1, rel=0.011)


def test_a_margin_demanded_of_a_canary_5_percent_faster_fails_it() -> None:
    """minSpeedup 1.10: the same steady 1.05x canary is 0.05 below the gate, beyond its 0.03 zone."""
    windows = [window(20, 20 / 1.05 * (1.005 if i % 2 else 0.995)) for i in range(12)]
    assert speedup_gate(windows, 1.0).verdict == Verdict.PASS
    assert speedup_gate(windows, 1.10).verdict == Verdict.FAIL


def test_four_noisy_windows_do_not_decide_and_the_statistic_is_the_hand_computed_one() -> None:
    """Four windows, two requests a track (weight 1), the canary at 10 ms, the baseline at 12, 10,
    12, 10 ms: S = 44 / 40 = 1.1, residuals +-0.001 s. Their Newey-West variance (lags 3, Bartlett
    weights 3/4, 1/2, 1/4; autocovariances 1e-6, -0.75e-6, 0.5e-6, -0.25e-6) is 0.25e-6, below
    gamma_0, so gamma_0 x 4/3 = 1.333e-6; its chi-square bound (3 degrees of freedom, exceeded with
    probability 0.05 / 4; Wilson-Hilferty quantile 3 (1 - 2/27 - 2.2414 sqrt(2/27))^3 = 0.09457)
    is 4.230e-5; var(S) = 4 x 4.230e-5 / 0.040^2 = 0.1057; log LR = 2 x 0.03 x 0.1 / 0.1057 = 0.0567,
    far inside the bounds."""
    windows = [window(b, 10, 2) for b in (12, 10, 12, 10)]
    result = speedup_gate(windows, 1.0)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.estimate == pytest.approx(1.1)
    assert result.statistic == pytest.approx(0.0567, rel=1e-3)


def test_windows_without_requests_on_both_tracks_do_not_count() -> None:
    """A window with no canary request (a lull) has no pair; nor has one whose sum is NaN. Two pairs
    are fewer than the three windows any spread needs."""
    empty = PerTokenWindow(0.2, 10, 0.0, 0.0)
    broken = PerTokenWindow(math.nan, 10, 0.2, 10)
    result = speedup_gate([window(20, 10), empty, broken, window(20, 10)], 1.0)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    assert result.estimate is None
    assert "2 windows with requests on both tracks, need 3" in result.message


def test_identical_windows_decide_on_the_spread_floor_not_a_division_by_zero() -> None:
    """A simulator reporting the same pace every window has no spread: the floor (a window's ratio
    known to 0.1 % at best) lets a canary 1.5x faster pass and one at exactly the gate stay undecided."""
    assert speedup_gate([window(30, 20)] * 5, 1.0).verdict == Verdict.PASS
    same = speedup_gate([window(20, 20)] * 5, 1.0)
    assert same.verdict == Verdict.INSUFFICIENT_DATA and same.statistic == 0


def test_at_the_deadline_the_side_decides_only_when_precise_enough() -> None:
    """The hand-computed test above, 4 windows at S = 1.1: its plug-in sd of S is sqrt(4 x 1.333e-6)
    / 0.040 = 0.0577, the one-sided t bound at 95 % with 3 degrees of freedom 2.353 x 0.0577 = 0.136,
    beyond 0.1 + 0.03: still undecided. Five windows, baseline 11.5, 10.5, 11.5, 10.5, 11 ms against
    10 (S = 55 / 50 = 1.1, residuals +-0.5e-3 s and 0): gamma_0 = 2e-7, Newey-West 0.5e-7 below it,
    so 2e-7 x 5/4 = 2.5e-7; sd sqrt(5 x 2.5e-7) / 0.050 = 0.0224, bound 2.132 x 0.0224 = 0.048
    <= 0.13: decided Pass by the estimate's side, where the SPRT (its spread at the chi-square bound
    of four degrees of freedom) had not decided."""
    few = [window(b, 10, 2) for b in (12, 10, 12, 10)]
    undecided = decide_speedup_at_deadline(speedup_gate(few, 1.0), few, 1.0)
    assert undecided.verdict == Verdict.INSUFFICIENT_DATA and "still undecided" in undecided.message
    five = [window(b, 10, 2) for b in (11.5, 10.5, 11.5, 10.5, 11.0)]
    result = speedup_gate(five, 1.0)
    assert result.verdict == Verdict.INSUFFICIENT_DATA
    decided = decide_speedup_at_deadline(result, five, 1.0)
    assert decided.verdict == Verdict.PASS
    assert "estimate's side" in decided.message and "+/-0.048 at 95%" in decided.message


def test_a_decided_result_is_left_as_it_is_at_the_deadline() -> None:
    windows = [window(20, 10)] * 5
    result = speedup_gate(windows, 1.0)
    assert decide_speedup_at_deadline(result, windows, 1.0) == result
