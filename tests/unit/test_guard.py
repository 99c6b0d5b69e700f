"""The guard after promotion: Page's CUSUM with a false-alarm budget, and its spread estimate."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from datetime import timedelta

import pytest
from tests.unit.rollout_driver import Run, metrics, ready

from specgate import api, rollout
from specgate.cli import render_timeline
from specgate.gates import (
    MIN_GUARD_WINDOWS,
    AcceptanceWindow,
    acceptance_guard,
    guard_threshold,
    spread_with_horizon,
)
from specgate.observation import Window
from specgate_lab.sim.streams import draft_windows

GATE, DELTA = 0.55, 0.05


def guard(windows: list[AcceptanceWindow], window_seconds: float = 15.0) -> tuple[bool, float, float]:
    result = acceptance_guard(
        windows,
        GATE,
        indifference=DELTA,
        error_rate=0.05,
        false_alarms_per_month=0.1,
        window_seconds=window_seconds,
    )
    return result.tripped, result.statistic, result.threshold


def test_threshold_is_the_log_of_the_windows_between_false_alarms() -> None:
    # 0.1 per 30 days of 15-s windows: one false alarm per 1,728,000 windows; once a month at 60 s: 43,200.
    assert guard_threshold(0.1, 15) == pytest.approx(14.3625, abs=1e-4)
    assert guard_threshold(1.0, 60) == pytest.approx(10.6735, abs=1e-4)


def test_alpha_holding_above_the_gate_keeps_the_statistic_at_zero() -> None:
    windows = [AcceptanceWindow(100, 400, 400 * 0.62) for _ in range(40)]
    assert guard(windows) == (False, 0.0, pytest.approx(14.3625, abs=1e-4))


def test_too_few_windows_are_not_judged() -> None:
    windows = [AcceptanceWindow(100, 400, 0) for _ in range(MIN_GUARD_WINDOWS - 1)]
    tripped, statistic, _ = guard(windows)
    assert not tripped and statistic == 0.0


def test_a_sustained_drop_trips_and_a_short_dip_does_not() -> None:
    rng = random.Random(7)
    healthy = draft_windows(0.66, 100, rng, drafts_per_window=(80, 120))
    dip = draft_windows(0.45, 2, rng, drafts_per_window=(80, 120))
    after = draft_windows(0.66, 10, rng, drafts_per_window=(80, 120))
    assert not guard(healthy + dip + after)[0]
    dropped = draft_windows(0.45, 40, rng, drafts_per_window=(80, 120))
    first_trip = next(i for i in range(1, 41) if guard(healthy + dropped[:i])[0])
    assert 2 < first_trip <= 40


def test_spread_of_white_noise_is_its_variance_with_nearly_all_degrees_of_freedom() -> None:
    rng = random.Random(1)
    residuals = [rng.gauss(0, 1) for _ in range(400)]
    variance, dof = spread_with_horizon(residuals)
    assert variance == pytest.approx(1.0, rel=0.2)
    assert dof >= 200


def test_spread_of_a_slow_drift_follows_its_horizon() -> None:
    """AR(1) with rho 0.9 and unit innovations: long-run variance 1 / (1 - 0.9)^2 = 100, while the
    plain variance is 1 / (1 - 0.81) = 5.3; the estimate must see most of the former, on fewer
    degrees of freedom."""
    rng = random.Random(2)
    x, residuals = 0.0, []
    for _ in range(2000):
        x = 0.9 * x + rng.gauss(0, 1)
        residuals.append(x)
    variance, dof = spread_with_horizon(residuals)
    assert 60 < variance < 140
    assert dof < 400


@pytest.mark.parametrize("m", [0, 1, 2])
def test_spread_of_too_few_windows_is_zero(m: int) -> None:
    assert spread_with_horizon([1.0] * m) == (0.0, 1)


def test_nan_windows_do_not_break_the_guard() -> None:
    windows = [AcceptanceWindow(100, 400, 260) for _ in range(20)] + [AcceptanceWindow(math.nan, 1, 1)]
    assert not guard(windows)[0]


# --- through decide() ---


def test_status_shows_the_statistic_and_the_threshold_it_trips_at() -> None:
    run = Run()
    run.to_promoted()
    run.step(after=60, canary=ready(2), canary_metrics=metrics(0.8))
    assert run.status.guard is not None
    assert (run.status.guard.statistic, run.status.guard.windows, run.status.guard.alpha) == (0.0, 20, 0.8)
    assert run.status.guard.threshold == pytest.approx(14.3625, abs=1e-3)  # 15-s windows, 0.1 a month
    assert "guard    CUSUM 0.0 of 14.4 (trips there) over 20 windows" in render_timeline("x", run.status)


def test_the_window_still_filling_is_left_for_the_next_look() -> None:
    run = Run()
    run.to_promoted()
    now = (run.now + timedelta(seconds=60)).timestamp()
    ends = [now - 15 * (19 - i) for i in range(19)] + [now + 10]
    acceptance = tuple(AcceptanceWindow(50, 200, 160, end=end) for end in ends)
    run.step(after=60, canary=ready(2), canary_metrics=replace(metrics(0.8), acceptance=acceptance))
    assert run.status.guard is not None and run.status.guard.windows == 19


def test_a_window_still_filling_never_trips_the_guard() -> None:
    """The first seconds of the window still filling held 50 drafts, all rejected (a burst of hard
    prompts): judged now, that part-window alone would trip the guard. Left for the next look, the
    19 complete windows at alpha 0.8 keep the CUSUM at 0 and the canary promoted."""
    run = Run()
    run.to_promoted()
    now = (run.now + timedelta(seconds=60)).timestamp()
    complete = tuple(AcceptanceWindow(50, 200, 160, end=now - 15 * (19 - i)) for i in range(19))
    filling = AcceptanceWindow(50, 200, 0, end=now + 10)
    run.step(after=60, canary=ready(2), canary_metrics=replace(metrics(0.8), acceptance=(*complete, filling)))
    assert (run.phase, run.status.reason) == (api.Phase.PROMOTED, rollout.Reason.GUARDING)
    assert run.status.guard is not None
    assert (run.status.guard.statistic, run.status.guard.alpha) == (0.0, 0.8)


def test_the_guard_history_starts_on_the_grid_of_windows_from_the_promotion() -> None:
    run = Run()
    run.to_promoted()
    promoted = run.now
    assert run.status.phase_since == api.iso(promoted)
    # 45 min 7 s after promotion, a 30 min history: 907 s before it, 60 whole 15-s windows fit.
    now = promoted + timedelta(minutes=45, seconds=7)
    window = rollout.measurement_window(run.spec, run.status, now)
    assert window == Window(promoted + timedelta(seconds=900), now)
