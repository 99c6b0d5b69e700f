"""The guard after promotion: Page's CUSUM with a false-alarm budget, and its spread estimate."""

from __future__ import annotations

import math
import random
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from tests.unit.rollout_driver import Run, make_spec, metrics, ready

from specgate import api, rollout
from specgate.cli import render_timeline
from specgate.gates import (
    GUARD_MARGIN,
    MAX_ERROR_ALLOWANCE,
    MAX_SPREAD_ERROR,
    MIN_GUARD_BLOCKS,
    MIN_GUARD_REFERENCE_BLOCKS,
    SPREAD_ERROR_SCALE,
    AcceptanceWindow,
    GuardResult,
    MixDrift,
    acceptance_guard,
    drift_spread,
    guard_spread,
    guard_threshold,
    prewhitened_long_run_variance,
    spread_error,
    threshold_for_spread_error,
)
from specgate.observation import Window
from specgate_lab.sim.streams import draft_windows

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import guard as bench_guard
from traffic import windows

GATE, DELTA = 0.55, 0.05
STEADY = MixDrift(0.0, 180.0, "measured over 4.0 h", design_effect=1.0)


def guard(
    windows: list[AcceptanceWindow], block_seconds: float = 60.0, drift: MixDrift = STEADY
) -> tuple[bool, float, float]:
    result = acceptance_guard(
        windows,
        GATE,
        indifference=DELTA,
        false_alarms_per_month=0.1,
        block_seconds=block_seconds,
        drift=drift,
    )
    return result.tripped, result.statistic, result.threshold


def test_threshold_is_the_log_of_the_blocks_between_false_alarms_with_the_margin() -> None:
    # 0.1 per 30 days of 60-s blocks: one false alarm per 432,000 blocks; 1 of 15-s ones: 172,800.
    assert guard_threshold(0.1, 60) == pytest.approx(12.9762 + GUARD_MARGIN, abs=1e-4)
    assert guard_threshold(1.0, 15) == pytest.approx(12.0599 + GUARD_MARGIN, abs=1e-4)


def test_the_spread_errors_allowance_stops_at_the_flat_six_nats_of_before() -> None:
    # 60-s blocks, 0.1 a month: h0 = 12.9762 + 0.5. At r = 0.1, c = sqrt(1 + 2 * 0.01 * 13.4762)
    # = 1.12673 and h = 2 * 13.4762 * e^0.12673 / 2.12673 = 14.3854, under the cap; at r = 0.3 the
    # allowance (22.14 - 13.48) is cut to MAX_ERROR_ALLOWANCE: 12.9762 + 6.
    assert guard_threshold(0.1, 60, 0.1) == pytest.approx(14.3854, abs=1e-3)
    assert guard_threshold(0.1, 60, 0.3) == pytest.approx(12.9762 + 6.0, abs=1e-4)
    assert GUARD_MARGIN + MAX_ERROR_ALLOWANCE == 6.0


def test_alpha_holding_above_the_gate_keeps_the_statistic_at_zero() -> None:
    windows = [AcceptanceWindow(100, 400, 400 * 0.62) for _ in range(40)]
    # 26 older blocks: the spread's error is past its cap
    assert guard(windows) == (False, 0.0, pytest.approx(guard_threshold(0.1, 60, MAX_SPREAD_ERROR)))


def test_too_few_blocks_are_not_judged() -> None:
    windows = [AcceptanceWindow(100, 400, 0) for _ in range(MIN_GUARD_BLOCKS - 1)]
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


def test_white_noise_has_its_variance_as_long_run_variance() -> None:
    rng = random.Random(1)
    residuals = [rng.gauss(0, 1) for _ in range(400)]
    assert prewhitened_long_run_variance(residuals) == pytest.approx(1.0, rel=0.2)


def test_an_ar1_drift_under_noise_keeps_most_of_its_long_run_variance() -> None:
    """A drifting mix: AR(1) with rho 0.7 and unit innovations (long-run variance 1 / 0.3^2 = 11.1)
    plus white noise of variance 2: 13.1 in all, against a plain variance of 3.96, which a guard
    blind to the drift would take. Prewhitened by the lag-1 correlation (0.35 here, the noise hides
    the drift's 0.7) the estimate sees two thirds of it; the rest is bench/guard.py's margin."""
    rng = random.Random(2)
    x, residuals = 0.0, []
    for _ in range(20_000):
        x = 0.7 * x + rng.gauss(0, 1)
        residuals.append(x + rng.gauss(0, math.sqrt(2)))
    mean = sum(residuals) / len(residuals)
    estimate = prewhitened_long_run_variance([r - mean for r in residuals])
    assert 0.6 * 13.1 < estimate < 1.1 * 13.1
    assert estimate > 2 * 3.96


@pytest.mark.parametrize("spread_error", [0.1, 0.2, 0.3])
def test_the_threshold_keeps_lordens_rate_averaged_over_the_spreads_log_normal_error(
    spread_error: float,
) -> None:
    """An estimate low by e^-e scales the CUSUM by e^e: a threshold h then trips like e^-(h e^-e).
    Averaged over e ~ N(0, r^2) (80-node Gauss-Hermite quadrature here), the raised threshold's rate
    is at most the bare one's e^-h0, and Laplace's method leaves it within half a nat of it."""
    h0 = guard_threshold(0.1, 60)
    h = threshold_for_spread_error(h0, spread_error)
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    rate = float((weights / weights.sum() * np.exp(-h * np.exp(-spread_error * nodes))).sum())
    assert -h0 - 0.5 < math.log(rate) <= -h0
    assert threshold_for_spread_error(h0, 0.0) == pytest.approx(h0)


def test_the_threshold_is_where_the_exponent_is_lowest_at_the_saddle() -> None:
    """Laplace's method: the lowest of h e^-e + e^2 / (2 r^2) over e (a grid here) is h0."""
    h0, r = 13.5, 0.25
    h = threshold_for_spread_error(h0, r)
    e = np.linspace(-1.0, 2.0, 300_001)
    assert float((h * np.exp(-e) + e**2 / (2 * r**2)).min()) == pytest.approx(h0, rel=1e-6)


def test_the_spreads_error_grows_with_the_blocks_correlation_and_shrinks_with_their_number() -> None:
    """480 residuals alternating +1, -1 have a negative lag-1 correlation, taken as 0: the error is
    SPREAD_ERROR_SCALE * sqrt(1 / 480). In runs of four (+1 x4, -1 x4, ...) 360 of the 479 lagged
    products are +1 and 119 are -1, rho = 241 / 480, so tau = (1 + rho) / (1 - rho) three times as
    many blocks hold one independent one. Eight white residuals say too little: the error is capped."""
    white = [1.0 if i % 2 else -1.0 for i in range(480)]
    assert spread_error(white) == pytest.approx(SPREAD_ERROR_SCALE * math.sqrt(1 / 480))
    runs = [1.0 if (i // 4) % 2 else -1.0 for i in range(480)]
    rho = 241 / 480
    assert spread_error(runs) == pytest.approx(SPREAD_ERROR_SCALE * math.sqrt((1 + rho) / (1 - rho) / 480))
    assert spread_error(white[:8]) == MAX_SPREAD_ERROR


def test_a_drifting_history_trips_later_than_a_white_one_of_the_same_spread() -> None:
    """12 h of blocks whose alpha wanders as an AR(1) (rho 0.8) and 12 h of independent ones: the
    drifting history's spread is known less well, so its threshold is higher."""
    rng = random.Random(5)
    x, drifting, white = 0.0, [], []
    for _ in range(720):
        x = 0.8 * x + rng.gauss(0, 0.01)
        drifting.append(AcceptanceWindow(1000, 4000, 4000 * (0.62 + x)))
        white.append(AcceptanceWindow(1000, 4000, 4000 * (0.62 + rng.gauss(0, 0.017))))
    drifting_error, white_error = full_guard(drifting).spread_error, full_guard(white).spread_error
    assert drifting_error is not None and white_error is not None and drifting_error > white_error
    assert full_guard(drifting).threshold > full_guard(white).threshold + 1.0
    assert full_guard(white).threshold < guard_threshold(0.1, 60, 0.2)


@pytest.mark.parametrize("m", [0, 1, 2])
def test_too_few_residuals_have_no_long_run_variance(m: int) -> None:
    assert prewhitened_long_run_variance([1.0] * m) == 0.0


def test_a_young_history_takes_at_least_the_rollouts_drift_as_its_spread() -> None:
    """Under an hour of older blocks, identical blocks (no spread of their own) are scaled by the
    drift the rollout allowed for: the fallback's 0.09 over 180 s on 40,000 tokens a minute is
    2 * 0.0081 * 180 * 40000 / 60 = 1944 per token, plus the binomial p (1 - p)."""
    drift = MixDrift(0.09, 180.0, "spec mixDrift (fallback)")
    young = [AcceptanceWindow(10_000, 40_000, 24_000) for _ in range(MIN_GUARD_REFERENCE_BLOCKS - 1)]
    s2, source, _ = guard_spread(young, drift, 60.0)
    assert s2 == pytest.approx(drift_spread(drift, 40_000, 0.6, 60.0)) == pytest.approx(1944 + 0.24)
    assert source.startswith("the rollout's drift until an hour is measured")
    old = [*young, AcceptanceWindow(10_000, 40_000, 24_000)]
    s2, source, _ = guard_spread(old, drift, 60.0)
    assert s2 < 1 and source == "measured over 1.0 h"


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
    # 15-s blocks here, 0.1 a month: h0 = 14.3625 + 0.5 = 14.8625; 13 older blocks put the spread's
    # error at its cap 0.3, so c = sqrt(1 + 2 * 0.09 * 14.8625) = 1.917093 and
    # 2 * 14.8625 * e^0.917093 / 2.917093 = 25.4953, past the allowance's cap: 14.8625 + 5.5
    assert run.status.guard.threshold == pytest.approx(20.3625, abs=1e-3)
    shown = "guard    CUSUM 0.0 of 20.4 (trips there) over 20 blocks of 15s"
    assert shown in render_timeline("x", run.status)
    assert run.status.guard.spread_source is not None
    assert run.status.guard.spread_source.startswith("the rollout's drift until an hour is measured")


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


def test_the_guards_alpha_history_is_guard_history_back_on_a_grid_of_blocks_from_the_promotion() -> None:
    run = Run()
    run.to_promoted()
    promoted = run.now
    # 36 h 30 min 7 s after promotion, the default 36 h history of 60 s blocks: the first block ends
    # a block after the promotion, and 30 whole blocks (those ending up to 36 h 7 s ago) are left out.
    now = promoted + timedelta(hours=36, minutes=30, seconds=7)
    window = rollout.guard_history_window(run.spec, run.status, now, 60.0)
    assert window == Window(promoted + timedelta(minutes=31), now)
    young = promoted + timedelta(seconds=59)
    assert rollout.guard_history_window(run.spec, run.status, young, 60.0) is None


@pytest.mark.parametrize("mix", ["steady", "drift"])
def test_a_simulated_month_of_a_healthy_canary_stays_under_the_threshold(mix: str) -> None:
    """The calibration, pinned: a month of bench/traffic.py's requests (20 a 15 s window) at alpha
    gate + indifference, in 60 s blocks, looked at after every block with the default 36 h history,
    never reaches the threshold on either mix (a trip in such a month would be a false alarm, of
    which the budget allows one in ten months; bench/guard.py measures the rate over many). The
    looks are the operator's own (checked against acceptance_guard on sampled looks)."""
    rng, checker = np.random.default_rng(16), random.Random(16)
    cell = bench_guard.Cell(mix, 20)
    counts = windows(cell.traffic(GATE + DELTA), 30 * 1440 + bench_guard.HISTORY - 1, rng)
    accepted, tokens = counts[:, 2], counts[:, 1]
    bench_guard.check_against_the_operator(accepted, tokens, checker)
    statistic, thresholds = bench_guard.statistics_per_look(accepted, tokens)
    assert (statistic < thresholds).all()


def test_a_history_longer_than_a_range_query_answers_is_cut_to_its_newest_10000_blocks() -> None:
    run = Run(make_spec(guard={"history": "168h"}))
    run.to_promoted()
    promoted = run.now
    now = promoted + timedelta(days=8)
    window = rollout.guard_history_window(run.spec, run.status, now, 15.0)
    assert window is not None and window.end == now
    assert now - window.start <= timedelta(seconds=15 * 10_000)
    assert now - window.start > timedelta(seconds=15 * 9_999)


def promoted_at(promoted: datetime) -> api.SpeculativeDeploymentStatus:
    """A status Promoted since `promoted`: all the windows below read of it."""
    return api.SpeculativeDeploymentStatus(phase=api.Phase.PROMOTED, phase_since=api.iso(promoted))


PROMOTION = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_a_guard_window_shorter_than_a_minute_looks_back_a_minute() -> None:
    """guard.window 30s is read as 1m (its field says at least 1m is used): ten minutes after the
    promotion the latency window is the last minute, on the 15 s grid."""
    spec = make_spec(guard={"window": "30s"})
    now = PROMOTION + timedelta(minutes=10)
    assert rollout.measurement_window(spec, promoted_at(PROMOTION), now) == Window(
        PROMOTION + timedelta(minutes=9), now
    )


def test_a_guard_window_holds_at_least_one_acceptance_window_of_a_slow_scrape() -> None:
    """Scraped every 2 min, an acceptance window is 2 min: a 1m guard window would hold part of one
    (100 s here). 11 min 40 s after the promotion it starts at the 4th two-minute mark (8 min)."""
    spec = make_spec(guard={"window": "60s"}, metrics={"scrapeInterval": "120s"})
    now = PROMOTION + timedelta(minutes=11, seconds=40)
    assert rollout.measurement_window(spec, promoted_at(PROMOTION), now) == Window(
        PROMOTION + timedelta(minutes=8), now
    )


def test_just_after_the_promotion_the_guard_window_starts_at_the_promotion() -> None:
    """30 s after the promotion the window (30m) reaches back before it: it starts at the
    promotion, not a window later."""
    now = PROMOTION + timedelta(seconds=30)
    assert rollout.measurement_window(make_spec(), promoted_at(PROMOTION), now) == Window(PROMOTION, now)


def test_at_the_promotion_instant_the_guard_has_nothing_to_query() -> None:
    assert rollout.measurement_window(make_spec(), promoted_at(PROMOTION), PROMOTION) is None


def test_the_first_block_of_the_guards_history_is_read_the_moment_it_ends() -> None:
    """A block after the promotion, its first 60 s block has ended: the range query reads it (a
    window of that one block's end)."""
    now = PROMOTION + timedelta(seconds=60)
    assert rollout.guard_history_window(make_spec(), promoted_at(PROMOTION), now, 60.0) == Window(now, now)


def test_a_disabled_guard_reads_no_alpha_history() -> None:
    spec = make_spec(guard={"enabled": False})
    assert (
        rollout.guard_history_window(spec, promoted_at(PROMOTION), PROMOTION + timedelta(hours=1), 60.0)
        is None
    )


def test_status_shows_the_guards_figures_rounded_as_users_read_them() -> None:
    """20 blocks of 15 s after promotion, each 300 draft tokens with 154 accepted (alpha 0.51333,
    under the gate 0.55 but not for long). The spread is the rollout's fallback drift (0.09 over
    180 s): 0.51333 * 0.48667 = 0.24982 + 2 * 0.0081 * 180 * 300 / 15 = 58.32, so 58.56982 per
    token; each block adds 2 * 0.05 * (0.55 * 300 - 154) / 58.56982 to the CUSUM, 20 of them
    22 / 58.56982 = 0.37562; it trips at h0 = log(30 days / (0.1 * 15 s)) + 0.5 = 14.86248 raised
    for the spread's error (13 older blocks: at its cap 0.3): c = sqrt(1 + 2 * 0.09 * h0) = 1.917093,
    2 h0 e^(c - 1) / (1 + c) = 25.49526, cut to h0 + MAX_ERROR_ALLOWANCE = 20.36248. Status keeps
    3 decimals of the statistic, the threshold and the spread, 4 of alpha, and when it looked."""
    run = Run()
    run.to_promoted()
    below = replace(metrics(0.8), acceptance=tuple(AcceptanceWindow(75, 300, 154) for _ in range(20)))
    run.step(after=300, canary=ready(2), canary_metrics=below)
    assert (run.phase, run.status.reason) == (api.Phase.PROMOTED, rollout.Reason.GUARDING)
    shown = run.status.guard
    assert shown is not None
    assert (shown.statistic, shown.threshold, shown.alpha, shown.spread) == (0.376, 20.362, 0.5133, 58.57)
    assert (shown.windows, shown.window_seconds, shown.checked_at) == (20, 15.0, api.iso(run.now))


def test_a_block_ending_at_the_instant_of_the_look_is_judged() -> None:
    """Prometheus bins a block's end at its last scrape: one that ends exactly now is complete."""
    run = Run()
    run.to_promoted()
    now = (run.now + timedelta(seconds=60)).timestamp()
    acceptance = tuple(AcceptanceWindow(50, 200, 160, end=now - 15 * (19 - i)) for i in range(20))
    run.step(after=60, canary=ready(2), canary_metrics=replace(metrics(0.8), acceptance=acceptance))
    assert run.status.guard is not None and run.status.guard.windows == 20


def test_a_guard_without_canary_metrics_waits_out_the_budget_then_warns_that_it_is_blind() -> None:
    """Prometheus answers but has no series of the canary (no error): the guard notes since when,
    and once metricsUnavailableBudget (2m) has passed, to the second, it says it is blind (Degraded,
    a Warning Event) while the gated config keeps serving (guard.onMetricsUnavailable Warn)."""
    run = Run()
    run.to_promoted()
    run.step(canary=ready(2))
    since = run.now
    assert (run.phase, run.status.reason, run.status.message) == (
        api.Phase.PROMOTED,
        rollout.Reason.GUARDING,
        f"guard: metrics unavailable since {api.iso(since)}: no metrics for the canary",
    )
    run.step(after=119, canary=ready(2))
    assert run.status.reason == rollout.Reason.GUARDING
    d = run.step(after=1, canary=ready(2))
    blind = "guard is blind: metrics unavailable for 2m: no metrics for the canary; the gated config keeps serving"
    assert (run.phase, run.status.reason, run.status.message) == (
        api.Phase.PROMOTED,
        rollout.Reason.METRICS_UNAVAILABLE,
        blind,
    )
    assert d.events == (rollout.Event("Warning", rollout.Reason.METRICS_UNAVAILABLE, blind),)


def test_a_metrics_error_blinds_the_guard_even_with_old_canary_figures_at_hand() -> None:
    """A failed query (an error) with figures still passed along: the guard does not judge them,
    it notes the error."""
    run = Run()
    run.to_promoted()
    run.step(canary=ready(2), canary_metrics=metrics(0.8), metrics_error="connection refused")
    assert (run.status.reason, run.status.message, run.status.metrics_unavailable_since) == (
        rollout.Reason.GUARDING,
        f"guard: metrics unavailable since {api.iso(run.now)}: connection refused",
        api.iso(run.now),
    )


def full_guard(windows: list[AcceptanceWindow]) -> GuardResult:
    return acceptance_guard(
        windows, GATE, indifference=DELTA, false_alarms_per_month=0.1, block_seconds=60.0, drift=STEADY
    )


def test_a_history_too_short_to_judge_says_how_much_it_has_and_needs() -> None:
    """Seven blocks of 400 draft tokens at 0.62: not judged, not tripped, its alpha still shown, and
    the message says what the guard has and what it judges from (8 blocks)."""
    result = full_guard([AcceptanceWindow(100, 400, 248)] * (MIN_GUARD_BLOCKS - 1))
    assert (result.tripped, result.statistic, result.alpha, result.windows) == (False, 0.0, 0.62, 7)
    assert (
        result.message
        == "7 blocks, 2800 draft tokens: the guard judges from 8 blocks, with drafts in its older part"
    )


def test_eight_blocks_are_judged_and_the_message_names_the_budget_and_the_drop_it_catches() -> None:
    """Exactly MIN_GUARD_BLOCKS blocks are judged: alpha, the CUSUM and where it trips (h0 = log
    432,000 blocks + 0.5 = 13.476 at the capped error 0.3: c = sqrt(1 + 0.18 h0) = 1.8340,
    2 h0 e^0.8340 / 2.8340 = 22.1, cut to h0 + 5.5 = 19.0), the budget at gate + indifference (0.6), the drop it catches
    (to 0.5) and the spread's relative error."""
    result = full_guard([AcceptanceWindow(100, 400, 248)] * MIN_GUARD_BLOCKS)
    assert (result.tripped, result.statistic, result.windows) == (False, 0.0, 8)
    assert result.message.startswith(
        "alpha 0.620 over 8 blocks of 60s; CUSUM 0.0, trips at 19.0 (0.1 false alarms per month at alpha "
        "0.6, a drop to 0.5 is caught); spread measured over 0.1 h, relative error 30%"
    )


def test_quiet_older_blocks_leave_the_guard_without_a_spread_to_judge_by() -> None:
    """Eight quiet minutes (no drafts) then four busy ones: the spread comes from the older part of
    the history, which holds no draft tokens, so the guard does not judge yet."""
    quiet, busy = AcceptanceWindow(0, 0, 0), AcceptanceWindow(100, 400, 100)
    result = full_guard([quiet] * 8 + [busy] * 4)
    assert (result.tripped, result.statistic, result.alpha) == (False, 0.0, 0.25)
    assert (
        result.message
        == "12 blocks, 1600 draft tokens: the guard judges from 8 blocks, with drafts in its older part"
    )


def test_trips_are_counted_once_per_history() -> None:
    """A trip restarts the history: looks over the threshold within HISTORY looks of a counted trip
    are the same alarm; one HISTORY later is a new one."""
    statistic = np.zeros(3 * bench_guard.HISTORY)
    statistic[[5, 6, 5 + bench_guard.HISTORY - 1, 5 + bench_guard.HISTORY, 2 * bench_guard.HISTORY + 4]] = (
        20.0
    )
    assert bench_guard.count_trips(statistic, 19.0) == 2  # 5 and 5 + HISTORY; 2 * HISTORY + 4 is too soon
    assert bench_guard.count_trips(statistic, 21.0) == 0


def test_the_true_spread_is_the_variance_of_batch_residuals_per_token() -> None:
    """Two 4 h batches of 100 draft tokens with 70 and 50 accepted: alpha 0.6, residuals +10 and
    -10, so 200 squared tokens over 200 tokens: 1.0 per draft token."""
    months = bench_guard.Months(0, [], [], [np.array([70.0]), np.array([50.0])], [np.array([100.0])] * 2)
    assert months.true_spread() == pytest.approx(1.0)


def test_the_known_spread_threshold_meets_the_budget_where_lordens_bound_says_it_must() -> None:
    """Independent Gaussian blocks with the steady 20-request cell's tokens (38,700 a block) and
    long-run spread (230 per token), at alpha gate + indifference: the CUSUM's increments are then
    exact log likelihood ratios, for which Lorden's bound puts at least e^h blocks between false
    alarms, so h = log(432,000) = 12.98 meets 0.1 a month; at h 9 Siegmund's approximation gives
    about one a month, far over it. 20 months: the lowest threshold within budget lies between."""
    rng = np.random.default_rng(3)
    tokens, spread = 38_700.0, 230.0
    n = np.full(30 * 1440 + bench_guard.HISTORY - 1, tokens)
    months = bench_guard.Months(0, [], [], [], [])
    for _ in range(20):
        accepted = (GATE + DELTA) * n + rng.normal(0.0, math.sqrt(spread * tokens), len(n))
        months.ranges.append(bench_guard.ranges_per_look(accepted, n).astype(np.float32))
    threshold = bench_guard.known_spread_threshold(months, spread)
    assert 9.0 < threshold <= 13.0
